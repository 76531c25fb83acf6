"""KITTI AP on hand-built label folders whose AP follows by hand from the evaluation's rules.

Two rules shape every expected value here:
- precision is sampled at one score threshold per true positive while a recall step is at
  least 1/40, so the curve fills sample k (of 0..40) with the k-th threshold; with N ground
  truths and N true positives all 41 samples fill only when N >= 41;
- sample k holds the best precision at any sample >= k; R11 averages samples 0, 4, .., 40
  and R40 samples 1..40.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.apps.eval.cli import add_eval_parser, run_eval
from pointpillars_trt.apps.eval.io import load_ground_truth, load_predictions
from pointpillars_trt.apps.eval.kitti_eval import EvalResult, evaluate
from pointpillars_trt.errors import InputError
from pointpillars_trt.kitti import Calibration, camera_box_corners, kitti_label_to_lidar_boxes, project_boxes_to_image

DIMS = {"Car": (1.5, 1.6, 3.9), "Van": (2.2, 1.9, 5.0), "Truck": (3.0, 2.5, 8.0),
        "Pedestrian": (1.8, 0.6, 0.8), "Person_sitting": (1.2, 0.6, 0.8), "Cyclist": (1.7, 0.6, 1.8)}


def obj(name: str, slot: int = 0, *, occ: int = 0, trunc: float = 0.0, height: float = 60.0,
        score: float | None = None, dims: Sequence[float] | None = None, ry: float = 0.3) -> str:
    """One label line; ``slot`` spreads objects of a frame apart in the image and on the ground.

    Slot 5 is a spot no other slot's 2D or 3D box comes near, for false positives.
    """
    h, w, l = dims or DIMS[name]
    x1 = 100.0 + 200.0 * slot
    x1, y1, x2, y2 = x1, 150.0, x1 + 80.0, 150.0 + height
    x, z = -12.0 + 8.0 * slot, 20.0 + 10.0 * (slot == 5)
    line = f"{name} {trunc} {occ} {ry - 0.1:.3f} {x1} {y1} {x2} {y2} {h} {w} {l} {x} 1.6 {z} {ry}"
    return line if score is None else f"{line} {score}"


def write_frames(folder: Path, frames: Sequence[Sequence[str]]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"{i:06d}" for i in range(len(frames))]
    for frame, lines in zip(ids, frames):
        (folder / f"{frame}.txt").write_text("".join(line + "\n" for line in lines))
    return ids


def run(tmp_path: Path, gt: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
        classes: tuple[str, ...] = ("Car",)) -> EvalResult:
    ids = write_frames(tmp_path / "label_2", gt)
    write_frames(tmp_path / "pred", pred)
    return evaluate(load_ground_truth(tmp_path / "label_2", ids), load_predictions(tmp_path / "pred", ids), classes)


def ap(result: EvalResult, name: str, metric: str, recall: str = "R40", loose: bool = False) -> np.ndarray:
    return result.classes[name].ap[metric][int(loose), ("R11", "R40").index(recall)]


# --------------------------------------------------------------------------- perfect and partial


def test_perfect_predictions_give_100_everywhere(tmp_path: Path) -> None:
    gt = [[obj("Car", 0), obj("Pedestrian", 1), obj("Cyclist", 2)] for _ in range(45)]
    pred = [[obj("Car", 0, score=0.9), obj("Pedestrian", 1, score=0.8), obj("Cyclist", 2, score=0.7)]
            for _ in range(45)]
    result = run(tmp_path, gt, pred, ("Car", "Pedestrian", "Cyclist"))
    for cls in result.classes.values():
        assert set(cls.ap) == {"bbox", "bev", "3d", "aos"}
        for values in cls.ap.values():
            np.testing.assert_allclose(values, 100.0)


def test_forty_perfect_matches_leave_the_last_sample_empty(tmp_path: Path) -> None:
    # 40 thresholds fill samples 0..39; sample 40 stays 0: R40 = 39/40, R11 = 10/11.
    result = run(tmp_path, [[obj("Car")]] * 40, [[obj("Car", score=0.9)]] * 40)
    np.testing.assert_allclose(ap(result, "Car", "3d"), 97.5)
    np.testing.assert_allclose(ap(result, "Car", "3d", "R11"), 1000 / 11)


def test_half_recall_with_one_false_positive(tmp_path: Path) -> None:
    # 40 cars in 10 frames; the first two of each frame are found with scores 0.99 .. 0.80 and a
    # false positive scores 0.895. Threshold k is the k-th true positive (k = 0..19):
    # precision 1 for k <= 9, (k+1)/(k+2) after the false positive, best-after = 20/21 for 10..19.
    gt, pred = [], []
    for f in range(10):
        gt.append([obj("Car", s) for s in range(4)])
        pred.append([obj("Car", s, score=round(0.99 - 0.01 * (2 * f + s), 2)) for s in range(2)])
    pred[0].append(obj("Car", 5, score=0.895))
    result = run(tmp_path, gt, pred)
    r40 = (9 + 10 * 20 / 21) / 40 * 100
    r11 = (3 + 2 * 20 / 21) / 11 * 100
    for metric in ("bbox", "bev", "3d", "aos"):
        np.testing.assert_allclose(ap(result, "Car", metric), r40, atol=1e-9)
        np.testing.assert_allclose(ap(result, "Car", metric, "R11"), r11, atol=1e-9)


def test_few_ground_truths_fill_few_samples(tmp_path: Path) -> None:
    # 4 cars, hits at 0.9 and 0.8, a miss-placed box at 0.85: thresholds [0.9, 0.8] give
    # precision [1, 2/3] at samples 0 and 1 -> R11 = 1/11, R40 = (2/3)/40.
    gt = [[obj("Car", s) for s in range(4)]]
    pred = [[obj("Car", 0, score=0.9), obj("Car", 1, score=0.8), obj("Car", 5, score=0.85)]]
    result = run(tmp_path, gt, pred)
    np.testing.assert_allclose(ap(result, "Car", "3d", "R11"), 100 / 11)
    np.testing.assert_allclose(ap(result, "Car", "3d"), 2 / 3 / 40 * 100)


# --------------------------------------------------------------------------- special regions and classes


def _41_cars_and_extra(extra_gt: list[str], extra_pred: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """41 frames with one car found at scores 0.50 .. 0.90, plus extra objects in frame 0."""
    gt = [[obj("Car", 0)] for _ in range(41)]
    pred = [[obj("Car", 0, score=round(0.5 + 0.01 * i, 2))] for i in range(41)]
    gt[0] += extra_gt
    pred[0] += extra_pred
    return gt, pred


def test_dontcare_absorbs_a_false_positive_in_2d_only(tmp_path: Path) -> None:
    # A 0.95 car sits inside a DontCare region and far from every car on the ground.
    # bbox: forgiven -> 100. BEV/3D: above every threshold -> precision (k+1)/(k+2), best-after 41/42.
    dontcare = "DontCare -1 -1 -10 1090 140 1200 220 -1 -1 -1 -1000 -1000 -1000 -10"
    fp = obj("Car", 5, score=0.95)  # 2D box 1100..1180 x 150..210
    gt, pred = _41_cars_and_extra([dontcare], [fp])
    result = run(tmp_path, gt, pred)
    for recall in ("R11", "R40"):
        np.testing.assert_allclose(ap(result, "Car", "bbox", recall), 100.0)
        np.testing.assert_allclose(ap(result, "Car", "aos", recall), 100.0)
        np.testing.assert_allclose(ap(result, "Car", "bev", recall), 41 / 42 * 100)
        np.testing.assert_allclose(ap(result, "Car", "3d", recall), 41 / 42 * 100)
    # Without the DontCare row the same box is a 2D false positive too.
    gt[0] = gt[0][:1]
    np.testing.assert_allclose(ap(run(tmp_path / "b", gt, pred), "Car", "bbox"), 41 / 42 * 100)


@pytest.mark.parametrize("cls, similar, unrelated", [("Car", "Van", "Truck"), ("Pedestrian", "Person_sitting", "Cyclist")])
def test_similar_class_is_dont_care(tmp_path: Path, cls: str, similar: str, unrelated: str) -> None:
    # A top-scoring detection of `cls` on a `similar` object is neither a hit nor a false positive.
    gt = [[obj(cls, 0)] for _ in range(41)]
    pred = [[obj(cls, 0, score=round(0.5 + 0.01 * i, 2))] for i in range(41)]
    gt[0].append(obj(similar, 2))
    pred[0].append(obj(cls, 2, score=0.95, dims=DIMS[similar]))
    np.testing.assert_allclose(ap(run(tmp_path / "a", gt, pred, (cls,)), cls, "3d", loose=True), 100.0)
    gt[0][1] = obj(unrelated, 2)
    np.testing.assert_allclose(ap(run(tmp_path / "b", gt, pred, (cls,)), cls, "3d", loose=True), 41 / 42 * 100)


def test_occluded_ground_truth_is_ignored_for_easy_only(tmp_path: Path) -> None:
    # 41 easy cars found; one more car, occluded = 1, is missed: easy keeps 100, moderate loses it.
    gt, pred = _41_cars_and_extra([obj("Car", 2, occ=1)], [])
    result = run(tmp_path, gt, pred)
    easy, moderate, hard = ap(result, "Car", "3d")
    assert easy == pytest.approx(100.0)
    assert moderate < 100.0 and hard == pytest.approx(moderate)
    # Found instead (top score), it is a hit for moderate and no false positive for easy.
    gt, pred = _41_cars_and_extra([obj("Car", 2, occ=1)], [obj("Car", 2, score=0.95)])
    np.testing.assert_allclose(ap(run(tmp_path / "b", gt, pred), "Car", "3d"), 100.0)


def test_height_limits(tmp_path: Path) -> None:
    # GT exactly 40 px tall is too small for easy (<= 40), so its miss costs nothing there.
    gt, pred = _41_cars_and_extra([obj("Car", 2, height=40.0)], [])
    easy, moderate, _ = ap(run(tmp_path / "a", gt, pred), "Car", "bbox")
    assert easy == pytest.approx(100.0) and moderate < 100.0
    # A 39 px false positive is ignored for easy (< 40) but counts for moderate (min 25).
    gt, pred = _41_cars_and_extra([], [obj("Car", 2, height=39.0, score=0.95)])
    easy, moderate, _ = ap(run(tmp_path / "b", gt, pred), "Car", "bbox")
    assert easy == pytest.approx(100.0)
    assert moderate == pytest.approx(41 / 42 * 100)


def test_a_prediction_of_no_length_and_width_matches_nothing(tmp_path: Path) -> None:
    """The reader refuses such a line; the evaluation itself scores it as no match, whatever built the table.
    One car and one prediction on it, the only true positive filling sample 0 of 41: R11 AP 100 / 11 where it
    matches. Its copy of no footprint has BEV and 3D AP 0 (before: 100 / 11, an infinite IoU), while its 2D box,
    the label's own, still matches."""
    dims = (1.5, 2.0, 4.0)  # at ry 0 a footprint whose area is exact in floats: a union of 0, not of ~1e-16
    ids = write_frames(tmp_path / "label_2", [[obj("Car", 0, dims=dims, ry=0.0)]])
    write_frames(tmp_path / "pred", [[obj("Car", 0, score=0.9, dims=dims, ry=0.0)]])
    gt, pred = load_ground_truth(tmp_path / "label_2", ids), load_predictions(tmp_path / "pred", ids)
    one_hit = 100.0 / 11
    np.testing.assert_allclose(ap(evaluate(gt, pred, ("Car",)), "Car", "3d", "R11"), one_hit)  # the same box
    flat = dataclasses.replace(pred, dimensions=pred.dimensions * np.array([1.0, 0.0, 0.0]))  # h w l -> h 0 0
    result = evaluate(gt, flat, ("Car",))
    for metric in ("bev", "3d"):
        for loose in (False, True):
            np.testing.assert_array_equal(ap(result, "Car", metric, "R11", loose), 0.0)
    np.testing.assert_allclose(ap(result, "Car", "bbox", "R11"), one_hit)


# --------------------------------------------------------------------------- files, CLI, report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cli_prints_openpcdet_table_writes_strict_json_and_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gt, pred = _41_cars_and_extra([], [])
    write_frames(tmp_path / "label_2", gt)
    write_frames(tmp_path / "pred", pred)
    write_frames(tmp_path / "other", [[] for _ in gt])
    out = tmp_path / "ap.json"
    args = _parser().parse_args(["eval", "--pred", str(tmp_path / "pred"), "--labels", str(tmp_path / "label_2"),
                                 "--json", str(out), "--compare", str(tmp_path / "other"), "--classes", "car,Pedestrian,Cyclist"])
    assert args.run(args) == 0
    text = capsys.readouterr().out
    assert "Car AP@0.70, 0.70, 0.70:\nbbox AP:100.0000, 100.0000, 100.0000\nbev  AP:100.0000" in text
    assert "Car AP_R40@0.70, 0.50, 0.50:" in text and "aos  AP:100.00, 100.00, 100.00" in text
    assert "100.00 -> 0.00 (-100.00)" in text
    rows = [line for line in text.splitlines() if line.startswith(("Car R", "Pedestrian R", "Cyclist R"))]
    assert len({line.index(")") for line in rows}) == 1  # the first cell ends in one column on every row
    data = json.loads(out.read_text())
    assert set(data) == {"Car", "Pedestrian", "Cyclist", "loose"}
    assert data["Car"]["3d"]["R40"] == [100.0, 100.0, 100.0]
    assert data["loose"]["Cyclist"]["bev"]["R11"] == [0.0, 0.0, 0.0]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_compare_folder_missing_a_frame_fails_before_any_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gt, pred = _41_cars_and_extra([], [])
    write_frames(tmp_path / "label_2", gt)
    write_frames(tmp_path / "pred", pred)
    write_frames(tmp_path / "other", pred[:-1])  # the last frame's file is missing
    args = _parser().parse_args(["eval", "--pred", str(tmp_path / "pred"), "--labels", str(tmp_path / "label_2"),
                                 "--compare", str(tmp_path / "other")])
    with pytest.raises(InputError, match="other"):
        args.run(args)
    assert "AP" not in capsys.readouterr().out  # no table printed before the error


def test_ids_file_selects_frames_and_missing_files_are_named(tmp_path: Path) -> None:
    gt, pred = _41_cars_and_extra([], [])
    write_frames(tmp_path / "label_2", gt)
    write_frames(tmp_path / "pred", pred[:40])
    (tmp_path / "ids.txt").write_text("000000\n000040\n")
    args = _parser().parse_args(["eval", "--pred", str(tmp_path / "pred"), "--labels", str(tmp_path / "label_2"),
                                 "--ids", str(tmp_path / "ids.txt")])
    with pytest.raises(InputError, match=r"prediction file .*000040\.txt' does not exist"):
        run_eval(args)


@pytest.mark.parametrize("line, problem", [
    ("Car 0 0 0 1 2 3 4 1 1 1 0 0 0 0", "15 fields, expected 16: a prediction line ends with its score; a line "
                                        r"of 15 fields is ground truth, given as predictions \(--pred\)\?"),
    ("Car 0 0 0 1 2 3 4 1 1 1 0 0 0", "14 fields, expected 16: type, truncated, occluded, alpha, the 2D box "
                                      r"\(4\), dimensions \(3\), location \(3\), rotation_y, score"),
    ("Car 0 0 0 1 2 3 4 1 1 1 0 0 0 0 high", "non-numeric"),
    ("Car 0 0 0 1 2 3 4 1 1 1 0 0 nan 0 0.5", "NaN or infinite"),
])
def test_bad_prediction_lines_are_input_errors(tmp_path: Path, line: str, problem: str) -> None:
    ids = write_frames(tmp_path / "pred", [[line]])
    with pytest.raises(InputError, match=rf"000000\.txt', line 1: .*{problem}"):
        load_predictions(tmp_path / "pred", ids)


def test_a_prediction_line_given_as_ground_truth_names_the_swap(tmp_path: Path) -> None:
    """--labels pointed at a prediction folder said only "16 fields, expected 15" and what a label line holds."""
    ids = write_frames(tmp_path / "label_2", [["Car 0 0 0 1 2 3 4 1 1 1 0 0 0 0 0.5"]])
    with pytest.raises(InputError, match=r"000000\.txt', line 1: 16 fields, expected 15: ground truth has no score; a "
                                         r"line of 16 fields ends with a prediction's, given as labels \(--labels\)\?"):
        load_ground_truth(tmp_path / "label_2", ids)


def test_a_prediction_file_of_an_upper_case_suffix_is_refused_not_passed_over(tmp_path: Path) -> None:
    from pointpillars_trt.apps.eval.io import list_prediction_ids

    line = "Car 0 0 0 1 2 3 4 1 1 1 0 0 0 0 0.5"
    write_frames(tmp_path / "pred", [[line], [line]])
    assert list_prediction_ids(tmp_path / "pred") == ["000000", "000001"]
    (tmp_path / "pred" / "000001.txt").rename(tmp_path / "pred" / "000001.TXT")
    with pytest.raises(InputError, match=r"holds '000001.TXT', which eval would pass over: name prediction files "
                                         r"\.txt or \.json in lower case"):
        list_prediction_ids(tmp_path / "pred")


def test_json_predictions_go_through_the_calibration(tmp_path: Path) -> None:
    # Ground truth whose 2D boxes are the projections of its 3D boxes, predictions as infer's
    # JSON (lidar boxes from those labels): every metric is 100.
    calib = Calibration(
        P2=np.array([[700.0, 0, 600, 40], [0, 700, 180, 0.2], [0, 0, 1, 0.003]]),
        R0_rect=np.eye(3),
        Tr_velo_to_cam=np.array([[0.0, -1, 0, 0], [0, 0, -1, -0.08], [1, 0, 0, -0.27]]),
    )
    calib_text = "\n".join(f"{k}: " + " ".join(str(v) for v in getattr(calib, k).ravel())
                           for k in ("P2", "R0_rect", "Tr_velo_to_cam"))
    rng = np.random.default_rng(5)
    (tmp_path / "calib").mkdir()
    (tmp_path / "pred").mkdir()
    frames = []
    for f in range(45):
        lines = []
        for slot, x in enumerate((-4.0, 4.0)):
            loc, lhw, ry = np.array([[x, 1.6, 15.0 + f % 5]]), np.array([[3.9, 1.5, 1.6]]), np.array([rng.uniform(-3, 3)])
            box = project_boxes_to_image(camera_box_corners(loc, lhw, ry), calib, (375, 1242))[0][0]
            lines.append(f"Car 0 0 0 {box[0]} {box[1]} {box[2]} {box[3]} 1.5 1.6 3.9 {x} 1.6 {loc[0, 2]} {ry[0]}")
        frames.append(lines)
    ids = write_frames(tmp_path / "label_2", frames)
    for frame, lines in zip(ids, frames):
        (tmp_path / "calib" / f"{frame}.txt").write_text(calib_text + "\n")
        boxes = kitti_label_to_lidar_boxes(lines, calib)
        record = {"frame": frame, "boxes_lidar": boxes.boxes.tolist(), "scores": [0.9] * len(lines), "labels": boxes.names}
        (tmp_path / "pred" / f"{frame}.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match="--calib"):
        load_predictions(tmp_path / "pred", ids)
    pred = load_predictions(tmp_path / "pred", ids, tmp_path / "calib")
    result = evaluate(load_ground_truth(tmp_path / "label_2", ids), pred, ("Car",))
    for metric in ("bbox", "bev", "3d"):
        np.testing.assert_allclose(result.classes["Car"].ap[metric], 100.0)
    # a record saved under another frame's name: refused, naming both (its boxes would meet the wrong labels)
    (tmp_path / "pred" / f"{ids[1]}.json").write_text((tmp_path / "pred" / f"{ids[0]}.json").read_text())
    with pytest.raises(InputError, match=f"{ids[1]}.json' is the record of frame '{ids[0]}', not of '{ids[1]}'"):
        load_predictions(tmp_path / "pred", ids, tmp_path / "calib")


# --------------------------------------------------------------------------- real labels, scale


def test_real_kitti_labels_evaluate_to_100_against_themselves(tmp_path: Path, assets: Path) -> None:
    labels = assets / "kitti" / "training" / "label_2"
    files = sorted(labels.glob("*.txt"))
    if not files:
        pytest.skip(f"no label files in {labels}")
    # Repeat the few frames so every class present has more than 41 objects (see module docstring).
    copies = 50
    (tmp_path / "gt").mkdir()
    (tmp_path / "pred").mkdir()
    present: dict[str, set[int]] = {}
    for k in range(copies):
        for src in files:
            frame = f"{k:03d}{src.stem}"
            shutil.copy(src, tmp_path / "gt" / f"{frame}.txt")
            lines = [line for line in src.read_text().splitlines() if line.split()]
            (tmp_path / "pred" / f"{frame}.txt").write_text("".join(f"{line} 1\n" for line in lines))
            for line in lines:
                p = line.split()
                height, occ, trunc = float(p[7]) - float(p[5]), float(p[2]), float(p[1])
                for d, (min_h, max_occ, max_trunc) in enumerate(((40, 0, 0.15), (25, 1, 0.3), (25, 2, 0.5))):
                    if height > min_h and occ <= max_occ and trunc <= max_trunc:
                        present.setdefault(p[0], set()).add(d)
    ids = sorted(p.stem for p in (tmp_path / "gt").iterdir())
    classes = ("Car", "Pedestrian", "Cyclist")
    result = evaluate(load_ground_truth(tmp_path / "gt", ids), load_predictions(tmp_path / "pred", ids), classes)
    assert any(name in present for name in classes)
    for name in classes:
        expected = [100.0 if d in present.get(name, set()) else 0.0 for d in range(3)]
        for values in result.classes[name].ap.values():
            np.testing.assert_allclose(values, np.broadcast_to(expected, values.shape))


def _synthetic_scene(rng: np.random.Generator, n_gt: int, n_dt: int) -> tuple[list[str], list[str]]:
    """Random KITTI-like objects and noisy detections of them plus clutter."""
    names = ["Car", "Car", "Pedestrian", "Cyclist", "Van", "DontCare"]
    gt = []
    for _ in range(n_gt):
        name = names[rng.integers(len(names))]
        h, w, l = DIMS.get(name, (1.0, 1.0, 1.0))
        x, z, ry = rng.uniform(-10, 10), rng.uniform(5, 40), rng.uniform(-np.pi, np.pi)
        u, v, bh = 600 + 700 * x / z, 180 + 700 / z, 700 * h / z
        gt.append([name, rng.choice([0.0, 0.2, 0.4]), float(rng.integers(0, 3)), ry, u - bh, v - bh, u + bh, v, h, w, l, x, 1.6, z, ry])
    dt = []
    for i in range(n_dt):
        clutter = not gt or gt[i % n_gt][0] == "DontCare"  # a detection of no object (DontCare's sizes are -1)
        base = ["Car", 0, 0, 0, 0, 0, 50, 50, 1.5, 1.6, 3.9, 0, 1.6, 20, 0] if clutter else list(gt[i % n_gt])
        name = str(base[0])
        noisy = np.array(base[3:], dtype=float) + rng.normal(0, 0.3, 12) * rng.uniform(0, 1)
        noisy[5:8] = np.abs(noisy[5:8])  # sizes stay sizes
        noisy[1:5] = [min(noisy[1], noisy[3]), min(noisy[2], noisy[4]), max(noisy[1], noisy[3]), max(noisy[2], noisy[4])]
        dt.append([name, -1, -1, *noisy, rng.random()])
    return [_format_row(r) for r in gt], [_format_row(r) for r in dt]


def _format_row(row: list[Any]) -> str:
    return f"{row[0]} " + " ".join(f"{float(v):.3f}" for v in row[1:])


def test_smoke_200_random_frames_through_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    scenes = [_synthetic_scene(rng, 10, 50) for _ in range(200)]
    ids = write_frames(tmp_path / "gt", [g for g, _ in scenes])
    write_frames(tmp_path / "pred", [d for _, d in scenes])
    start = time.perf_counter()
    result = evaluate(load_ground_truth(tmp_path / "gt", ids), load_predictions(tmp_path / "pred", ids))
    elapsed = time.perf_counter() - start
    values = np.concatenate([a.ravel() for c in result.classes.values() for a in c.ap.values()])
    assert np.all((values >= 0) & (values <= 100))
    assert values.max() > 0
    json.dumps(result.to_json_dict(), allow_nan=False)
    print(f"200 frames x (10 GT, 50 detections): {elapsed:.2f} s")


def test_pairs_taken_in_slices_give_the_evaluation_of_pairs_taken_at_once(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame's GT x detection pairs are taken a bounded number at a time (4,000 x 4,000 boxes took 4.1 GB at
    once): slices of 7 pairs, which cut frames and rows of pairs anywhere, give every AP of one slice of all, on
    random frames of Cars, Pedestrians and DontCare boxes (uneven counts, one frame with no GT)."""
    import pointpillars_trt.apps.eval.kitti_eval as kitti_eval

    rng = np.random.default_rng(5)

    def lines(count: int, scored: bool) -> list[str]:
        out = []
        for _ in range(count):
            name = rng.choice(["Car", "Pedestrian", "DontCare"]) if not scored else rng.choice(["Car", "Pedestrian"])
            x1, y1 = rng.uniform(0, 1100), rng.uniform(100, 300)
            x, z, ry = rng.uniform(-10, 10), rng.uniform(5, 40), rng.uniform(-3, 3)
            line = (f"{name} 0.00 0 0.0 {x1:.2f} {y1:.2f} {x1 + rng.uniform(20, 120):.2f} {y1 + rng.uniform(20, 80):.2f} "
                    f"1.5 1.6 3.9 {x:.2f} 1.6 {z:.2f} {ry:.2f}")
            out.append(line + (f" {rng.uniform(0, 1):.3f}" if scored else ""))
        return out

    counts = [(12, 9), (0, 5), (30, 41), (7, 0), (3, 17)]
    truth = [lines(g, False) for g, _ in counts]
    found = [[f"{line} {rng.uniform(0.5, 1):.3f}" for line in frame[: len(frame) // 2] if not line.startswith("DontCare")]
             + lines(d, True) for frame, (_, d) in zip(truth, counts)]  # half the objects found, and others
    ids = write_frames(tmp_path / "label_2", truth)
    write_frames(tmp_path / "pred", found)
    gt, pred = load_ground_truth(tmp_path / "label_2", ids), load_predictions(tmp_path / "pred", ids)
    at_once = evaluate(gt, pred, ("Car", "Pedestrian")).to_json_dict()
    monkeypatch.setattr(kitti_eval, "_PAIR_CHUNK", 7)
    assert evaluate(gt, pred, ("Car", "Pedestrian")).to_json_dict() == at_once
    assert any(value > 0 for metrics in at_once["loose"]["Car"].values() for aps in metrics.values() for value in aps)


def test_readmes_infer_eval_example_prints_what_the_command_prints(assets: Path, tmp_path: Path) -> None:
    """README's ``infer ... --format kitti --out preds --eval kitti/training/label_2`` example, run as written in a
    folder holding the assets' ``kitti/`` (README names it /data) on the CPU, stdout and stderr as a terminal shows
    them: README showed the summary and the evaluation alone, without the notes between them. Lines match but for
    the rate; README's ``...`` stands for the lines it leaves out."""
    import os
    import re
    import subprocess
    import sys

    from pointpillars_trt.devices import cuda_available

    if cuda_available() is None:
        pytest.skip("README's example output is of a CPU run")
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ (pointpillars-trt infer kitti/training/velodyne .*?)\n(.*?)```", readme, re.S)
    assert block is not None
    (tmp_path / "kitti").symlink_to(assets / "kitti")
    shutil.copy(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth", tmp_path)
    args = block.group(1).split()[1:]
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600,
                          env={**os.environ, "POINTPILLARS_TRT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout

    def rate_left_out(text: str) -> list[str]:
        return re.sub(r"\(\d+(\.\d+)? frames/s\)", "(N frames/s)", text).splitlines()

    printed = rate_left_out(done.stdout.replace(str(tmp_path), "/data"))
    shown = rate_left_out(block.group(2))
    cut = shown.index("...")
    assert printed[:cut] == shown[:cut] and printed[len(printed) - len(shown) + cut + 1:] == shown[cut + 1:], \
        "\n".join(printed)
