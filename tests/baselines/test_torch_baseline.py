"""The PyTorch eager baseline, on the CPU, against NumPy float64 brute-force oracles and the reference stages."""

from __future__ import annotations

import importlib
import math
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.config import ModelConfig
from pointpillars_trt.errors import ConfigError, InputError
from pointpillars_trt.convert.weights import BatchNorm, Conv1x1, ConvBN, PointPillarsWeights

torch = pytest.importorskip("torch", reason="torch is an optional dependency of the baseline")
pytest.importorskip("torchvision", reason="torchvision is an optional dependency of the baseline")
from pointpillars_trt.baselines.torch_eager import HeadMaps, TorchPointPillars  # noqa: E402

FAMILIES = ("openpcdet", "zhulf0804")


def _tiny(cfg: ModelConfig) -> ModelConfig:
    """16 x 16 pillars, 8 points per pillar, 48 pillars at most, narrow channels, one conv per block."""
    try:
        from tiny import tiny_config  # the shared tiny-model registry, when present
        return tiny_config(cfg.family)  # type: ignore[no-any-return]
    except ImportError:
        pass
    voxel = replace(cfg.voxel, point_range=(0.0, -2.56, -3.0, 5.12, 2.56, 1.0), pillar_size=(0.32, 0.32, 4.0),
                    max_points_per_pillar=8, max_pillars=48)
    network = replace(cfg.network, pfn_channels=8, layer_nums=(1, 1, 1), block_channels=(8, 12, 16),
                      upsample_channels=(8, 8, 8))
    return replace(cfg, voxel=voxel, network=network)


@pytest.fixture(params=FAMILIES)
def tiny_cfg(request: pytest.FixtureRequest, openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> ModelConfig:
    return _tiny(openpcdet_cfg if request.param == "openpcdet" else zhulf_cfg)


def _random_bn(rng: np.random.Generator, c: int) -> BatchNorm:
    return BatchNorm(
        weight=rng.uniform(0.5, 1.5, c).astype(np.float32), bias=rng.normal(0, 0.1, c).astype(np.float32),
        running_mean=rng.normal(0, 0.1, c).astype(np.float32),
        running_var=rng.uniform(0.5, 1.5, c).astype(np.float32),
    )


def _random_weights(cfg: ModelConfig, seed: int = 0) -> PointPillarsWeights:
    rng = np.random.default_rng(seed)
    net = cfg.network

    def conv(cout: int, cin: int, k: int, scale: float = 1.0) -> np.ndarray:
        return (rng.normal(0, scale * math.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k))).astype(np.float32)

    blocks, cin = [], net.pfn_channels
    for n, stride, cout in zip(net.layer_nums, net.layer_strides, net.block_channels):
        layers = [ConvBN(conv(cout, cin, 3), _random_bn(rng, cout), stride)]
        layers += [ConvBN(conv(cout, cout, 3), _random_bn(rng, cout), 1) for _ in range(n)]
        blocks.append(tuple(layers))
        cin = cout
    deblocks = tuple(
        ConvBN(conv(cout, cin_, s).transpose(1, 0, 2, 3).copy(), _random_bn(rng, cout), s)
        for cin_, s, cout in zip(net.block_channels, net.upsample_strides, net.upsample_channels)
    )
    # class biases near logit(0.1), so the score threshold splits the anchors
    bias_mean = {"cls": -2.5, "box": 0.0, "dir": 0.0}
    heads = {
        name: Conv1x1(conv(c, net.head_in_channels, 1, scale=0.3),
                      rng.normal(bias_mean[name], 0.3, c).astype(np.float32))
        for name, c in cfg.head_channels.items()
    }
    return PointPillarsWeights(
        pfn_linear=rng.normal(0, 0.5, (net.pfn_channels, cfg.features.channels)).astype(np.float32),
        pfn_bn=_random_bn(rng, net.pfn_channels), blocks=tuple(blocks), deblocks=deblocks,
        head_cls=heads["cls"], head_box=heads["box"], head_dir=heads["dir"],
    )


def _frame(cfg: ModelConfig, seed: int = 1) -> np.ndarray:
    """Random points around the range, a crowded pillar, points on range and pillar edges, NaN/inf rows."""
    rng = np.random.default_rng(seed)
    lo, hi = np.array(cfg.voxel.point_range[:3]), np.array(cfg.voxel.point_range[3:])
    xyz = rng.uniform(lo - [0.3, 0.3, 0.5], hi + [0.3, 0.3, 0.5], (600, 3))
    crowd = np.array([1.0, 0.5, -1.0]) + rng.uniform(0, 0.1, (30, 3))  # one pillar, past M points
    size = np.array(cfg.voxel.pillar_size)
    edges = np.stack([lo, hi, [lo[0], hi[1], 0.0], [hi[0], lo[1], 0.0], lo + 3 * size * [1, 1, 0],
                      [lo[0] + 5 * size[0], 0.0, hi[2]]])
    pts = np.concatenate([edges, xyz[:20], crowd, xyz[20:]])
    pts = np.concatenate([pts, rng.uniform(0, 1, (pts.shape[0], 1))], axis=1).astype(np.float32)
    pts[[5, 400]] = [np.nan, 1.0, 0.0, 0.5], [1.0, np.inf, 0.0, 0.5]
    return pts


def _reference_voxel() -> types.ModuleType:
    try:
        return importlib.import_module("pointpillars_trt.reference.voxel")
    except ImportError as exc:
        pytest.skip(f"pointpillars_trt.reference.voxel not importable yet: {exc}")


def _assert_pillars_match(model: TorchPointPillars, points: np.ndarray, cfg: ModelConfig) -> None:
    ref = _reference_voxel().voxelize(points, cfg)
    got = model.voxelize(torch.from_numpy(points))
    np.testing.assert_array_equal(got.coords.numpy(), ref.coords)
    np.testing.assert_array_equal(got.num_points.numpy(), ref.num_points)
    assert got.num_dropped == ref.num_pillars_dropped
    # only the order of the float32 sum behind the pillar mean may differ: a few ulp
    np.testing.assert_allclose(got.features.numpy(), ref.features, rtol=0, atol=2e-5)


def test_voxelize_matches_reference_tiny(tiny_cfg: ModelConfig) -> None:
    cfg = replace(tiny_cfg, voxel=replace(tiny_cfg.voxel, max_pillars=min(tiny_cfg.voxel.max_pillars, 48)))
    model = TorchPointPillars(_random_weights(cfg), cfg, device="cpu")
    points = _frame(cfg)
    _assert_pillars_match(model, points, cfg)
    assert model.voxelize(torch.from_numpy(points)).num_dropped > 0  # the frame exercises max_pillars


@pytest.mark.parametrize("family", FAMILIES)
def test_voxelize_matches_reference_kitti(family: str, assets: Path, openpcdet_cfg: ModelConfig,
                                          zhulf_cfg: ModelConfig) -> None:
    cfg = openpcdet_cfg if family == "openpcdet" else zhulf_cfg
    points = np.fromfile(assets / "kitti/training/velodyne_reduced/000134.bin", np.float32).reshape(-1, 4)
    model = TorchPointPillars(_random_weights(cfg), cfg, device="cpu")
    _assert_pillars_match(model, points, cfg)


def _conv2d(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    """Zero-padded (k // 2) cross-correlation of x (C, H, W) with w (O, C, k, k), brute force per tap."""
    k = w.shape[2]
    pad = k // 2
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    ho, wo = (x.shape[1] + 2 * pad - k) // stride + 1, (x.shape[2] + 2 * pad - k) // stride + 1
    out = np.zeros((w.shape[0], ho, wo))
    for i in range(k):
        for j in range(k):
            patch = xp[:, i: i + stride * (ho - 1) + 1: stride, j: j + stride * (wo - 1) + 1: stride]
            out += np.einsum("oc,chw->ohw", w[:, :, i, j], patch)
    return out


def _deconv(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    """Transposed conv with kernel = stride: each input cell paints its own stride x stride output patch."""
    out = np.zeros((w.shape[1], x.shape[1] * stride, x.shape[2] * stride))
    for i in range(stride):
        for j in range(stride):
            out[:, i::stride, j::stride] = np.einsum("co,chw->ohw", w[:, :, i, j], x)
    return out


def _bn_relu(x: np.ndarray, bn: BatchNorm, eps: float, axis: int) -> np.ndarray:
    scale, shift = bn.scale_shift(eps)
    shape = [1] * x.ndim
    shape[axis] = -1
    return np.maximum(x * scale.reshape(shape) + shift.reshape(shape), 0.0)


def _numpy_network(w: PointPillarsWeights, cfg: ModelConfig, features: np.ndarray, coords: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """The whole network in float64 from decorated pillars: PFN, scatter, blocks, neck, heads."""
    eps = cfg.network.bn_eps
    x = _bn_relu(features.astype(np.float64) @ w.pfn_linear.astype(np.float64).T, w.pfn_bn, eps, axis=2)
    nx, ny, _ = cfg.voxel.grid
    canvas = np.zeros((x.shape[2], ny, nx))
    canvas[:, coords[:, 2], coords[:, 3]] = x.max(axis=1).T
    ups, x = [], canvas
    for block, deblock in zip(w.blocks, w.deblocks):
        for layer in block:
            x = _bn_relu(_conv2d(x, layer.weight.astype(np.float64), layer.stride), layer.bn, eps, axis=0)
        ups.append(_bn_relu(_deconv(x, deblock.weight.astype(np.float64), deblock.stride), deblock.bn, eps, 0))
    x = np.concatenate(ups)
    heads = {"cls": w.head_cls, "box": w.head_box, "dir": w.head_dir}
    return {name: np.einsum("oc,chw->ohw", h.weight[:, :, 0, 0].astype(np.float64), x) + h.bias[:, None, None]
            for name, h in heads.items()}


def test_head_maps_match_numpy_float64(tiny_cfg: ModelConfig) -> None:
    weights = _random_weights(tiny_cfg)
    points = _frame(tiny_cfg)
    model = TorchPointPillars(weights, tiny_cfg, device="cpu")
    got = model.head_maps(torch.from_numpy(points))
    ref = model.voxelize(torch.from_numpy(points))  # the voxelizer is tested against the reference above
    want = _numpy_network(weights, tiny_cfg, ref.features.numpy(), ref.coords.numpy())
    hx, hy = tiny_cfg.head_map
    for name, g in zip(("cls", "box", "dir"), got):
        assert g.shape == (1, tiny_cfg.head_channels[name], hy, hx)
        scale = np.abs(want[name]).max()
        np.testing.assert_allclose(g[0].numpy(), want[name], rtol=0, atol=1e-5 * scale, err_msg=name)


def test_half_mode_stays_close(tiny_cfg: ModelConfig) -> None:
    weights = _random_weights(tiny_cfg)
    canvas = torch.from_numpy(np.random.default_rng(3).uniform(0, 1, (1, tiny_cfg.network.pfn_channels,
                                                                       *tiny_cfg.voxel.grid[1::-1])))
    full = TorchPointPillars(weights, tiny_cfg, device="cpu").rpn_only(canvas.float())
    half = TorchPointPillars(weights, tiny_cfg, device="cpu", half=True).rpn_only(canvas.float())
    for f, h in zip(full, half):
        assert h.dtype == torch.float16
        np.testing.assert_allclose(h.float().numpy(), f.numpy(), rtol=0, atol=1e-2 * float(f.abs().max()))
    boxes, scores, labels = TorchPointPillars(weights, tiny_cfg, device="cpu", half=True)(_frame(tiny_cfg))
    assert boxes.dtype == np.float32 and boxes.shape == (len(scores), 7) and labels.dtype == np.int32


@pytest.mark.parametrize("checkpoint", ["pointpillar_openpcdet_synthetic.pth", "pointpillars_zhulf0804_synthetic.pth"])
def test_checkpoint_head_maps_match_onnxruntime(checkpoint: str, assets: Path) -> None:
    """Full-size network from a real checkpoint layout vs reference stages + the exported graphs on ORT CPU."""
    try:
        ort = importlib.import_module("onnxruntime")
        from pointpillars_trt.convert.checkpoint import load_checkpoint
        from pointpillars_trt.convert.onnx_export import build_pfn_graph, build_rpn_graph
    except ImportError as exc:
        pytest.skip(f"checkpoint reader or ONNX exporter not importable: {exc}")
    ref = _reference_voxel()
    loaded = load_checkpoint(assets / "checkpoints" / checkpoint)
    cfg, weights = loaded.config, loaded.weights
    points = np.fromfile(assets / "kitti/training/velodyne_reduced/000134.bin", np.float32).reshape(-1, 4)
    model = TorchPointPillars(weights, cfg, device="cpu")
    got = model.head_maps(torch.from_numpy(points))

    pillars = ref.voxelize(points, cfg)
    pfn = ort.InferenceSession(build_pfn_graph(weights, cfg).SerializeToString(), providers=["CPUExecutionProvider"])
    rpn = ort.InferenceSession(build_rpn_graph(weights, cfg).SerializeToString(), providers=["CPUExecutionProvider"])
    canvas = ref.scatter(pfn.run(None, {"pillars": pillars.features})[0], pillars.coords, cfg)
    want = rpn.run(None, {"canvas": canvas})
    for name, g, w in zip(("cls", "box", "dir"), got, want):  # float32 through 16 layers, BN folded or not
        np.testing.assert_allclose(g.numpy(), w, rtol=0, atol=5e-5 * float(np.abs(w).max()), err_msg=name)
    boxes, scores, labels = model(points)
    assert boxes.shape == (len(scores), 7) and len(scores) > 0


def _numpy_anchors(cfg: ModelConfig) -> np.ndarray:
    """Anchors by brute force from the family conventions of $PP_ASSETS/README.md."""
    w, h = cfg.head_map
    r, a = cfg.voxel.point_range, cfg.anchors
    rows = []
    for y in range(h):
        for x in range(w):
            for c in a.classes:
                for rot in a.rotations:
                    if a.alignment == "range_corners":
                        cx, cy = r[0] + x * (r[3] - r[0]) / (w - 1), r[1] + y * (r[4] - r[1]) / (h - 1)
                    else:
                        cx, cy = r[0] + (x + 0.5) * (r[3] - r[0]) / w, r[1] + (y + 0.5) * (r[4] - r[1]) / h
                    z = c.bottom + c.size[2] / 2 if cfg.box_coder == "openpcdet" else c.bottom
                    rows.append([cx, cy, z, *c.size, rot])
    return np.array(rows)


def _numpy_decode(cfg: ModelConfig, box: np.ndarray, dirl: np.ndarray) -> np.ndarray:
    """Per-anchor decode + direction in float64, then the conversion to OpenPCDet's convention."""
    anchors = _numpy_anchors(cfg)
    out = np.zeros((anchors.shape[0], 7))
    d = cfg.direction
    for i, (xa, ya, za, s0, s1, s2, ra) in enumerate(anchors):
        t = box[i]
        diag = math.hypot(s0, s1)
        size = [s0 * math.exp(t[3]), s1 * math.exp(t[4]), s2 * math.exp(t[5])]
        x, y = t[0] * diag + xa, t[1] * diag + ya
        heading = ra + t[6]
        period = 2 * math.pi / d.num_bins
        v = heading - d.offset
        heading = v - math.floor(v / period + d.limit_offset) * period + d.offset
        heading += period * (int(np.argmax(dirl[i])) == d.flip_bin)
        if cfg.box_coder == "openpcdet":
            out[i] = [x, y, t[2] * s2 + za, *size, heading]
        else:  # native bottom z and (w, l, h, yaw) -> centre z and (l, w, h, -yaw - pi/2)
            bottom = t[2] * s2 + za + s2 / 2 - size[2] / 2
            out[i] = [x, y, bottom + size[2] / 2, size[1], size[0], size[2], -heading - math.pi / 2]
    return out


def _head_as_rows(cfg: ModelConfig, maps: HeadMaps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cls, box, dirl = (m[0].double().numpy().transpose(1, 2, 0) for m in maps)
    return cls.reshape(-1, cfg.num_classes), box.reshape(-1, 7), dirl.reshape(-1, cfg.direction.num_bins)


def test_anchors_and_decode_match_brute_force(tiny_cfg: ModelConfig) -> None:
    from pointpillars_trt.baselines.torch_eager import _to_openpcdet

    model = TorchPointPillars(_random_weights(tiny_cfg), tiny_cfg, device="cpu")
    np.testing.assert_allclose(model.anchors.numpy(), _numpy_anchors(tiny_cfg), rtol=0, atol=1e-5)
    maps = model.head_maps(torch.from_numpy(_frame(tiny_cfg)))
    _, box, dirl = _head_as_rows(tiny_cfg, maps)
    got = _to_openpcdet(model.decode(maps[1], maps[2]), tiny_cfg.box_coder).numpy()
    np.testing.assert_allclose(got, _numpy_decode(tiny_cfg, box, dirl), rtol=1e-5, atol=1e-5)


def test_anchors_decode_direction_match_reference_post(tiny_cfg: ModelConfig) -> None:
    try:
        post = importlib.import_module("pointpillars_trt.reference.post")
        ref_anchors, ref_decode, ref_direction = post.anchors, post.decode_boxes, post.apply_direction
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"pointpillars_trt.reference.post (anchors, decode_boxes, apply_direction) not available: {exc}")
    from pointpillars_trt.baselines.torch_eager import _apply_direction, decode_boxes

    model = TorchPointPillars(_random_weights(tiny_cfg), tiny_cfg, device="cpu")
    np.testing.assert_allclose(model.anchors.numpy(), ref_anchors(tiny_cfg), rtol=0, atol=1e-5)
    rng = np.random.default_rng(4)
    deltas = rng.normal(0, 0.5, (model.anchors.shape[0], 7)).astype(np.float32)
    got = decode_boxes(torch.from_numpy(deltas), model.anchors, tiny_cfg.box_coder).numpy()
    np.testing.assert_allclose(got, ref_decode(deltas, model.anchors.numpy(), tiny_cfg), rtol=1e-5, atol=1e-5)
    angles = rng.uniform(-7, 7, 500).astype(np.float32)
    dir_logits = rng.normal(0, 1, (500, 2)).astype(np.float32)
    got_angles = _apply_direction(torch.from_numpy(angles), torch.from_numpy(dir_logits), tiny_cfg).numpy()
    want_angles = ref_direction(angles, dir_logits.argmax(axis=1), tiny_cfg)
    np.testing.assert_allclose(got_angles, want_angles, rtol=0, atol=1e-5)


def _numpy_postprocess(cfg: ModelConfig, maps: HeadMaps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Score filter, top-k, greedy axis-aligned BEV NMS (per class or not), max_boxes, output range."""
    p = cfg.postprocess
    logits, box, dirl = _head_as_rows(cfg, maps)
    scores = 1 / (1 + np.exp(-logits))
    boxes = _numpy_decode(cfg, box, dirl)
    top = np.argsort(-scores.max(axis=1), kind="stable")[: p.pre_nms_top_k]
    cand = []
    for i in top:
        classes = range(cfg.num_classes) if p.nms == "per_class" else [int(np.argmax(scores[i]))]
        for c in classes:
            s = scores[i, c]
            if s >= p.score_threshold if p.score_inclusive else s > p.score_threshold:
                cand.append((s, i, c))
    cand.sort(key=lambda t: -t[0])

    def bev(i: int) -> tuple[float, float, float, float]:
        x, y, dx, dy, h = boxes[i, 0], boxes[i, 1], boxes[i, 3], boxes[i, 4], boxes[i, 6]
        wrapped = h - math.floor(h / math.pi + 0.5) * math.pi
        if abs(wrapped) >= math.pi / 4:
            dx, dy = dy, dx
        return x - dx / 2, y - dy / 2, x + dx / 2, y + dy / 2

    def iou(a: int, b: int) -> float:
        ax1, ay1, ax2, ay2 = bev(a)
        bx1, by1, bx2, by2 = bev(b)
        inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
        return inter / ((ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter)

    kept: list[tuple[float, int, int]] = []
    for s, i, c in cand:
        if all(iou(i, j) <= p.nms_iou for _, j, cj in kept if p.nms == "class_agnostic" or cj == c):
            kept.append((s, i, c))
    kept = kept[: p.max_boxes]
    if p.output_range is not None:
        lo, hi = np.array(p.output_range[:3]), np.array(p.output_range[3:])
        native_z = boxes[:, 2] - (boxes[:, 5] / 2 if cfg.box_coder == "zhulf0804" else 0)
        native = np.stack([boxes[:, 0], boxes[:, 1], native_z], axis=1)
        kept = [k for k in kept if ((native[k[1]] > lo) & (native[k[1]] < hi)).all()]
    idx = [k[1] for k in kept]
    return boxes[idx], np.array([k[0] for k in kept]), np.array([k[2] for k in kept])


@pytest.mark.parametrize("frame, max_boxes", [("random", None), ("random", 7), ("empty", None)])
def test_postprocess_matches_brute_force(tiny_cfg: ModelConfig, frame: str, max_boxes: int | None) -> None:
    """An empty frame still has boxes: the head biases and BN shifts score an all-zero canvas."""
    cfg = tiny_cfg
    if max_boxes is not None:
        cfg = replace(cfg, postprocess=replace(cfg.postprocess, max_boxes=max_boxes))
    model = TorchPointPillars(_random_weights(cfg), cfg, device="cpu")
    points = _frame(cfg) if frame == "random" else np.zeros((0, 4), np.float32)
    maps = model.head_maps(torch.from_numpy(points))
    boxes, scores, labels = model(points)
    want_boxes, want_scores, want_labels = _numpy_postprocess(cfg, maps)
    assert len(want_scores) > 1, "the frame should produce several detections"
    assert boxes.dtype == np.float32 and scores.dtype == np.float32 and labels.dtype == np.int32
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    np.testing.assert_allclose(boxes, want_boxes, rtol=1e-5, atol=1e-5)


def test_weights_of_the_other_family_are_refused(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    weights = _random_weights(_tiny(openpcdet_cfg))  # 10 point features; zhulf0804 decorates 9
    with pytest.raises(ConfigError, match="point features"):
        TorchPointPillars(weights, _tiny(zhulf_cfg), device="cpu")


def test_a_gpu_array_is_refused_naming_the_baseline_and_its_fix(openpcdet_cfg: ModelConfig) -> None:
    """A GPU array given to the baseline was refused as given to "a detector on the CPU", with the fix "open the
    detector on the GPU": the baseline takes host points on any device, so copying them to the host is the fix."""
    from array_likes import CudaInterfaceOnly

    cfg = _tiny(openpcdet_cfg)
    model = TorchPointPillars(_random_weights(cfg), cfg, device="cpu")
    with pytest.raises(InputError) as caught:
        model(CudaInterfaceOnly((100, 4)))
    assert str(caught.value) == (
        "points: a GPU array (CUDA), given to the PyTorch baseline, which takes host points and copies them to its "
        "device itself (timed host to host): copy it to the host first (CuPy: points.get(); Numba: "
        "points.copy_to_host())")
