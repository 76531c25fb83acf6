"""The multi-head (nuScenes) CPU path against an independent PyTorch re-implementation of OpenPCDet's
inference (tests/_pcdet_multihead_torch.py): a hand-built head map, then both dev frames end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.config import load_config
from pointpillars_trt.reference.multihead import multihead_postprocess

CFG = load_config("openpcdet_nuscenes_multihead")
H = W = 128
FRAMES = ("nusc_dev_k000000_s05", "nusc_dev_k000002_s02")


@pytest.fixture(scope="module")
def pcdet() -> Any:
    """The PyTorch re-implementation of OpenPCDet (tests/_pcdet_multihead_torch.py); needs torch."""
    pytest.importorskip("torch")
    import _pcdet_multihead_torch

    return _pcdet_multihead_torch


def _logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


def test_hand_built_head_map_decodes_and_suppresses_per_class_in_each_head(pcdet: Any) -> None:
    import torch

    heads = np.zeros((H, W, 236), np.float32)
    heads[..., :36] = -20.0  # every score ~2e-9
    cls_at = [0, 2, 10, 18, 20, 28]  # head h's class channels: anchors x classes of the heads before it
    box_at = [36, 56, 96, 136, 156, 196]  # then every head's box channels: 10 per anchor
    # head 0 (car, anchors a = rotation): a strong car, a weaker one 1 cell over (IoU > 0.2: suppressed),
    # and one far away at rotation 1.57
    heads[64, 64, cls_at[0] + 0] = _logit(0.9)
    heads[64, 65, cls_at[0] + 0] = _logit(0.6)
    heads[10, 10, cls_at[0] + 1] = _logit(0.3)
    code = np.array([0.1, -0.2, 0.05, 0.1, -0.1, 0.2, -0.5, 0.8, 1.5, -2.0], np.float32)
    heads[64, 64, box_at[0]: box_at[0] + 10] = code
    heads[64, 65, box_at[0]: box_at[0] + 10] = code
    # head 1 (truck, construction_vehicle; anchors 0-1 truck, 2-3 construction_vehicle): one row scored for
    # both classes keeps one box per class (no NMS across classes); a truck below the threshold is dropped
    row = cls_at[1] + 2 * 2  # anchor 2 x 2 classes
    heads[30, 40, row + 0] = _logit(0.4)
    heads[30, 40, row + 1] = _logit(0.7)
    heads[31, 40, cls_at[1] + 0] = _logit(0.09)
    heads[30, 40, box_at[1] + 2 * 10: box_at[1] + 3 * 10] = code[::-1]

    raw = multihead_postprocess(heads, CFG)

    anchors = pcdet.anchors(W, H)
    def anchor_row(first_class: int, a: int, y: int, x: int) -> int:
        return first_class * 2 * H * W + (a * H + y) * W + x  # anchors class by class, each (rotation, y, x)

    rows = [anchor_row(0, 0, 64, 64), anchor_row(0, 1, 10, 10), anchor_row(1, 2, 30, 40), anchor_row(1, 2, 30, 40)]
    codes = torch.zeros(4, 10)
    codes[0] = torch.from_numpy(code)
    codes[2] = codes[3] = torch.from_numpy(code[::-1].copy())
    expected = pcdet.decode(codes, anchors[rows]).numpy()
    assert raw.labels.tolist() == [0, 0, 1, 2]  # car, car, truck, construction_vehicle
    np.testing.assert_allclose(raw.scores, np.float32([0.9, 0.3, 0.4, 0.7]), rtol=1e-6)
    np.testing.assert_allclose(raw.boxes, expected[:, :7], rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(raw.velocity, expected[:, 7:], rtol=1e-6, atol=1e-7)
    pair = pcdet.decode(torch.from_numpy(np.stack([code, code])),
                        anchors[[anchor_row(0, 0, 64, 64), anchor_row(0, 0, 64, 65)]]).numpy()[:, :7]
    assert pcdet.bev_iou(*pair) > 0.2  # why the second car is gone


def test_max_boxes_and_top_k_count_per_class() -> None:
    heads = np.zeros((H, W, 236), np.float32)
    heads[..., :36] = -20.0
    for x in range(0, 120, 8):  # 15 cars far apart, then 15 pedestrians (head 5, class 0)
        heads[5, x, 0] = _logit(0.5 + x / 1000)
        heads[100, x, 28] = _logit(0.5 + x / 1000)
    raw = multihead_postprocess(heads, CFG.with_thresholds(max_boxes=4))
    assert raw.labels.tolist() == [0] * 4 + [8] * 4
    assert np.all(np.diff(raw.scores[:4]) < 0) and np.all(np.diff(raw.scores[4:]) < 0)


def test_overflowed_class_logits_are_counted_in_every_head_and_give_no_box() -> None:
    """Class logits the network overflowed to (NaN, infinite, beyond float16's largest value) in the car head and
    the pedestrian head: each counted in ``overflowed_scores`` (placed here, so counted here); the boxes elsewhere
    stay as they were."""
    heads = np.zeros((H, W, 236), np.float32)
    heads[..., :36] = -20.0
    for x in range(0, 120, 8):
        heads[5, x, 0] = _logit(0.5 + x / 1000)
        heads[100, x, 28] = _logit(0.5 + x / 1000)
    clean = multihead_postprocess(heads, CFG)
    heads[60:64, 60:70, 0:2] = np.nan  # car: both anchors' scores in 40 cells
    heads[30, 30, 28] = np.nan  # one pedestrian anchor's score
    heads[31, 30, 28] = -np.inf
    heads[32, 30, 28] = -1e30
    heads[33, 30, 28] = -np.float32(np.finfo(np.float16).max)  # at the bound: a value, not an overflow
    got = multihead_postprocess(heads, CFG)
    assert (clean.overflowed_scores, got.overflowed_scores) == (0, 4 * 10 * 2 + 3)
    np.testing.assert_array_equal(got.boxes, clean.boxes)
    np.testing.assert_array_equal(got.scores, clean.scores)


@pytest.fixture(scope="module")
def model_dir(nuscenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pointpillars_trt.convert.export import build_model_dir

    out = tmp_path_factory.mktemp("nus") / "model"
    build_model_dir(nuscenes / "cbgs_pp_multihead_synthetic_dev.pth", out)
    return out


@pytest.fixture(scope="module")
def detector(model_dir: Path):  # type: ignore[no-untyped-def]
    from pointpillars_trt import PointPillars

    return PointPillars.from_model_dir(model_dir, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("frame", FRAMES)
def test_dev_frames_match_openpcdet_box_for_box(pcdet: Any, nuscenes: Path, detector, frame: str) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.convert.pth import read_pth
    from pointpillars_trt.pointcloud_io import read_points

    state = {k: np.asarray(v) for k, v in read_pth(nuscenes / "cbgs_pp_multihead_synthetic_dev.pth")["model_state"].items()}
    points = read_points(nuscenes / f"{frame}.bin", point_dim=5, columns=5)
    want = pcdet.detect(state, points)
    got = detector(points)
    assert len(got) == len(want["scores"]) >= 10  # every class scores >= 0.1 somewhere on both frames
    assert (got.labels + 1).tolist() == want["labels"].tolist()
    np.testing.assert_allclose(got.scores, want["scores"], atol=1e-4)
    np.testing.assert_allclose(got.boxes, want["boxes"][:, :7], atol=2e-3)  # metres (and radians)
    np.testing.assert_allclose(got.velocity, want["boxes"][:, 7:], atol=2e-3)
    record = json.loads(json.dumps(got.to_json_dict(frame)))
    assert record["labels"] == [CFG.classes[i - 1] for i in want["labels"].tolist()]
    np.testing.assert_allclose(record["velocity"], want["boxes"][:, 7:], atol=2e-3)
