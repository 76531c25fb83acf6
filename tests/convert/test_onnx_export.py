"""ONNX graphs against a float64 NumPy forward pass written here from the unfolded weights.

The oracle applies every BatchNorm as its own op with the original (gamma, beta, mean, var), so it
checks the folding as well as the graph wiring. Convolutions are sums over kernel offsets and the
transposed convolutions explicit scatter-adds, sharing no code with the exporter.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tiny import FAMILIES, random_canvas, random_pillars, tiny_config, tiny_weights

from pointpillars_trt.config import ModelConfig
from pointpillars_trt.errors import ConfigError
from pointpillars_trt.convert.onnx_export import OPSET, build_pfn_graph, build_rpn_graph
from pointpillars_trt.graph_io import (BATCH_DIM, HEAD_PARTS, NUM_PILLARS_DIM, PFN_INPUT, PFN_OUTPUT, RPN_INPUT, RPN_OUTPUT,
                                       pfn_io, rpn_io)
from pointpillars_trt.reference import split_heads
from pointpillars_trt.convert.weights import BatchNorm, PointPillarsWeights, random_weights

# ------------------------------------------------------------------ float64 oracle


def _bn(x: np.ndarray, bn: BatchNorm, eps: float, axis: int) -> np.ndarray:
    shape = [1] * x.ndim
    shape[axis] = -1
    p = {k: np.asarray(getattr(bn, k), np.float64).reshape(shape) for k in ("weight", "bias", "running_mean", "running_var")}
    return (x - p["running_mean"]) / np.sqrt(p["running_var"] + eps) * p["weight"] + p["bias"]


def _relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, 0.0)


def _conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """x (C, H, W), w (O, C, k, k): the sum over kernel offsets of shifted, strided inputs."""
    c, h, wd = x.shape
    k = w.shape[2]
    xp = np.zeros((c, h + 2 * pad, wd + 2 * pad))
    xp[:, pad:pad + h, pad:pad + wd] = x
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    out = np.zeros((w.shape[0], ho, wo))
    for dy in range(k):
        for dx in range(k):
            patch = xp[:, dy:dy + stride * ho:stride, dx:dx + stride * wo:stride]
            out += np.tensordot(w[:, :, dy, dx].astype(np.float64), patch, axes=(1, 0))
    return out


def _conv_transpose2d(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    """x (C, H, W), w (C, O, k, k), no padding: input pixel (i, j) adds w * x to output (i*s + a, j*s + b)."""
    _, h, wd = x.shape
    _, o, k, _ = w.shape
    out = np.zeros((o, (h - 1) * stride + k, (wd - 1) * stride + k))
    for a in range(k):
        for b in range(k):
            contribution = np.tensordot(w[:, :, a, b].astype(np.float64), x, axes=(0, 0))  # (O, H, W)
            out[:, a:a + stride * h:stride, b:b + stride * wd:stride] += contribution
    return out


def pfn_reference(weights: PointPillarsWeights, cfg: ModelConfig, pillars: np.ndarray) -> np.ndarray:
    x = pillars.astype(np.float64) @ weights.pfn_linear.astype(np.float64).T  # (P, M, Cf)
    x = _relu(_bn(x, weights.pfn_bn, cfg.network.bn_eps, axis=2))
    return x.max(axis=1) if x.shape[0] else np.zeros((0, x.shape[2]))


def rpn_reference(weights: PointPillarsWeights, cfg: ModelConfig, canvas: np.ndarray) -> dict[str, np.ndarray]:
    eps = cfg.network.bn_eps
    x = canvas[0].astype(np.float64)
    ups = []
    for block, deblock in zip(weights.blocks, weights.deblocks):
        for layer in block:
            x = _relu(_bn(_conv2d(x, layer.weight, layer.stride, 1), layer.bn, eps, axis=0))
        ups.append(_relu(_bn(_conv_transpose2d(x, deblock.weight, deblock.stride), deblock.bn, eps, axis=0)))
    features = np.concatenate(ups)
    heads = {"cls": weights.head_cls, "box": weights.head_box, "dir": weights.head_dir}
    return {
        name: (np.tensordot(h.weight[:, :, 0, 0].astype(np.float64), features, axes=(1, 0))
               + h.bias.astype(np.float64)[:, None, None])[None]
        for name, h in heads.items()
    }


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run_rpn(model: onnx.ModelProto, canvas: np.ndarray, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Run the NHWC graph on an NCHW canvas; the merged head map split back into NCHW maps by name."""
    half = model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    nhwc = canvas.transpose(0, 2, 3, 1).astype(np.float16 if half else np.float32)
    (heads,) = _session(model).run([RPN_OUTPUT], {RPN_INPUT: nhwc})
    assert heads.dtype == np.float32 and heads.shape[0] == canvas.shape[0]
    return dict(zip(HEAD_PARTS, split_heads(heads[0], cfg)))


TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2}

# ------------------------------------------------------------------ the oracle itself


def test_oracle_convolutions_agree_with_a_brute_force_sum():
    """The offset-loop conv and the scatter-add transposed conv, checked one output element at a time."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 7, 6))
    w = rng.standard_normal((4, 3, 3, 3))
    out = _conv2d(x, w, stride=2, pad=1)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    for o, i, j in [(0, 0, 0), (3, 3, 2), (1, 2, 1)]:
        assert out[o, i, j] == pytest.approx(np.sum(xp[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3] * w[o]))
    wt = rng.standard_normal((3, 2, 2, 2))
    up = _conv_transpose2d(x, wt, stride=2)
    assert up.shape == (2, 14, 12)
    for o, i, j in [(0, 0, 0), (1, 13, 11), (1, 6, 5)]:
        assert up[o, i, j] == pytest.approx(np.sum(x[:, i // 2, j // 2] * wt[:, o, i % 2, j % 2]))


# ------------------------------------------------------------------ random weights


@pytest.mark.parametrize("family", FAMILIES)
def test_random_weights_follow_the_config(family: str, openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig):
    for cfg in (tiny_config(family), openpcdet_cfg if family == "openpcdet" else zhulf_cfg):
        net = cfg.network
        w = random_weights(cfg, seed=3)
        assert w.pfn_linear.shape == (net.pfn_channels, cfg.features.channels)
        cin = net.pfn_channels
        for i, block in enumerate(w.blocks):
            assert len(block) == net.layer_nums[i] + 1
            assert [c.stride for c in block] == [net.layer_strides[i]] + [1] * net.layer_nums[i]
            assert block[0].weight.shape == (net.block_channels[i], cin, 3, 3)
            assert all(c.weight.shape == (net.block_channels[i],) * 2 + (3, 3) for c in block[1:])
            cin = net.block_channels[i]
        for i, de in enumerate(w.deblocks):
            k = net.upsample_strides[i]
            assert (de.weight.shape, de.stride) == ((net.block_channels[i], net.upsample_channels[i], k, k), k)
            assert de.bn.weight.shape == (net.upsample_channels[i],)
        for name, head in (("cls", w.head_cls), ("box", w.head_box), ("dir", w.head_dir)):
            assert head.weight.shape == (cfg.head_channels[name], net.head_in_channels, 1, 1)
            assert head.bias.shape == (cfg.head_channels[name],)
        arrays = [w.pfn_linear, w.head_cls.weight, w.head_cls.bias, *(w.blocks[0][0].bn.__dict__.values())]
        assert all(a.dtype == np.float32 for a in arrays)


def test_random_weights_are_seeded_and_batchnorm_is_not_trivial():
    cfg = tiny_config()
    a, b, c = random_weights(cfg, 0), random_weights(cfg, 0), random_weights(cfg, 1)
    assert np.array_equal(a.blocks[1][1].weight, b.blocks[1][1].weight)
    assert np.array_equal(a.head_cls.bias, b.head_cls.bias)
    assert not np.array_equal(a.blocks[1][1].weight, c.blocks[1][1].weight)
    for bn in [a.pfn_bn, a.deblocks[2].bn] + [layer.bn for block in a.blocks for layer in block]:
        assert np.all(np.abs(bn.weight - 1) > 0) and np.std(bn.weight) > 0.1
        assert np.std(bn.bias) > 0.01 and np.std(bn.running_mean) > 0
        assert np.all(bn.running_var > 0) and np.std(bn.running_var / np.mean(bn.running_var)) > 0.1


# ------------------------------------------------------------------ graph structure


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_graphs_pass_the_checker_and_strict_shape_inference(family: str, precision: str):
    cfg = tiny_config(family)
    w = tiny_weights(cfg)
    for model, io in ((build_pfn_graph(w, cfg, precision), pfn_io(cfg)),
                      (build_rpn_graph(w, cfg, precision), rpn_io(cfg, precision))):
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        assert [o.domain for o in model.opset_import] == [""] and model.opset_import[0].version == OPSET
        assert model.ir_version == 8  # what TensorRT 10 and ONNX Runtime >= 1.17 parse
        for values, specs in ((inferred.graph.input, io.inputs), (inferred.graph.output, io.outputs)):
            assert [v.name for v in values] == [s.name for s in specs]
            for v, spec in zip(values, specs):
                t = v.type.tensor_type
                want = onnx.TensorProto.FLOAT16 if spec.dtype == "float16" else onnx.TensorProto.FLOAT
                assert t.elem_type == want  # float32 IO, except the fp16 RPN's canvas
                dims = tuple(d.dim_param if d.HasField("dim_param") else d.dim_value for d in t.shape.dim)
                assert dims == spec.shape
        init_types = {i.data_type for i in model.graph.initializer}
        assert init_types == {onnx.TensorProto.FLOAT16 if precision == "fp16" else onnx.TensorProto.FLOAT}
        assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)


def test_io_specs_follow_the_config(openpcdet_cfg: ModelConfig):
    pfn, rpn = pfn_io(openpcdet_cfg), rpn_io(openpcdet_cfg)
    assert pfn.inputs[0].name == PFN_INPUT and pfn.inputs[0].shape == (NUM_PILLARS_DIM, 32, 10)
    assert pfn.outputs[0].name == PFN_OUTPUT and pfn.outputs[0].shape == (NUM_PILLARS_DIM, 64)
    assert (rpn.inputs[0].name, rpn.inputs[0].shape, rpn.inputs[0].dtype) == (RPN_INPUT, (BATCH_DIM, 496, 432, 64), "float32")
    assert rpn_io(openpcdet_cfg, "fp16").inputs[0].dtype == "float16"  # the fp16 RPN reads a float16 canvas
    assert {t.name: t.shape for t in rpn.outputs} == {"heads": (BATCH_DIM, 248, 216, 18 + 42 + 12)}


def test_weights_that_do_not_fit_the_config_are_refused(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig):
    w = random_weights(tiny_config("openpcdet"))
    with pytest.raises(ConfigError, match=r"pfn_linear is \(16, 10\), expected \(64, 10\)"):
        build_pfn_graph(w, openpcdet_cfg)
    with pytest.raises(ConfigError, match="weights do not match config tiny_zhulf0804: pfn_linear"):
        build_rpn_graph(w, tiny_config("zhulf0804"))
    with pytest.raises(ConfigError, match="precision 'int8'"):
        build_rpn_graph(w, tiny_config("openpcdet"), "int8")  # type: ignore[arg-type]


# ------------------------------------------------------------------ numerics


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_pfn_matches_the_float64_oracle(family: str, precision: str):
    cfg = tiny_config(family)
    w = tiny_weights(cfg, seed=1)
    session = _session(build_pfn_graph(w, cfg, precision))
    for p in (1, 37, 300):
        pillars = random_pillars(cfg, p, seed=p)
        (out,) = session.run([PFN_OUTPUT], {PFN_INPUT: pillars})
        assert out.dtype == np.float32 and out.shape == (p, cfg.network.pfn_channels)
        assert _rel_err(out, pfn_reference(w, cfg, pillars)) < TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pfn_with_zero_pillars_returns_an_empty_batch(precision: str):
    """ONNX Runtime accepts P = 0 (an empty frame); whether TensorRT does is the runtime's business."""
    cfg = tiny_config()
    (out,) = _session(build_pfn_graph(tiny_weights(cfg), cfg, precision)).run(
        [PFN_OUTPUT], {PFN_INPUT: np.zeros((0, 8, cfg.features.channels), np.float32)}
    )
    assert out.shape == (0, cfg.network.pfn_channels) and out.dtype == np.float32


def test_padded_slots_take_part_in_the_max():
    """A one-point pillar's feature is max(f(point), f(0)): the zero slots are not masked out."""
    cfg = tiny_config()
    w = tiny_weights(cfg)
    pillars = random_pillars(cfg, 50, seed=5)
    pillars[:, 1:] = 0.0
    (out,) = _session(build_pfn_graph(w, cfg)).run([PFN_OUTPUT], {PFN_INPUT: pillars})
    zero_slot = pfn_reference(w, cfg, np.zeros((1, 1, cfg.features.channels), np.float32))[0]
    assert np.all(out >= zero_slot.astype(np.float32) - 1e-6)
    assert np.any(np.isclose(out, zero_slot[None, :].astype(np.float32), rtol=1e-6, atol=1e-6))


def test_pfn_full_size_kitti(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig):
    for cfg in (openpcdet_cfg, zhulf_cfg):
        w = random_weights(cfg, seed=2)
        pillars = random_pillars(cfg, 500, seed=2)
        (out,) = _session(build_pfn_graph(w, cfg)).run([PFN_OUTPUT], {PFN_INPUT: pillars})
        assert _rel_err(out, pfn_reference(w, cfg, pillars)) < TOLERANCE["fp32"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_rpn_matches_the_float64_oracle(family: str, precision: str):
    cfg = tiny_config(family)
    w = tiny_weights(cfg, seed=4)
    canvas = random_canvas(cfg, occupancy=0.3, seed=4)
    ref = rpn_reference(w, cfg, canvas)
    out = _run_rpn(build_rpn_graph(w, cfg, precision), canvas, cfg)
    for name in HEAD_PARTS:
        assert out[name].dtype == np.float32
        assert _rel_err(out[name], ref[name]) < TOLERANCE[precision], name
        # The class logits carry a large constant bias; their spatial variation must match too.
        assert _rel_err(out[name] - out[name].mean((2, 3), keepdims=True),
                        ref[name] - ref[name].mean((2, 3), keepdims=True)) < TOLERANCE[precision], name


@pytest.mark.slow
def test_rpn_full_size_kitti_matches_the_float64_oracle(openpcdet_cfg: ModelConfig):
    """The real network at the real grid (496 x 432), once: the oracle takes ~10 s here."""
    cfg = openpcdet_cfg
    w = random_weights(cfg, seed=5)
    canvas = random_canvas(cfg, occupancy=0.05, seed=5)
    ref = rpn_reference(w, cfg, canvas)
    out = _run_rpn(build_rpn_graph(w, cfg), canvas, cfg)
    for name in HEAD_PARTS:
        assert out[name].shape == ref[name].shape == (1, cfg.head_channels[name], 248, 216)
        assert _rel_err(out[name], ref[name]) < TOLERANCE["fp32"], name


@pytest.mark.parametrize("family", FAMILIES)
def test_random_weights_give_o1_activations_and_some_detections_on_a_kitti_scan(family: str, assets, openpcdet_cfg, zhulf_cfg):
    """The demo's "untrained model" promise, on a real full scan: O(1) features, a modest number of anchors
    above a 0.1 score (120k-point scan; measured 762 / 113 for seed 0), box codes that keep boxes sane."""
    from pointpillars_trt.reference.voxel import scatter, voxelize

    cfg = openpcdet_cfg if family == "openpcdet" else zhulf_cfg
    w = random_weights(cfg, seed=0)
    points = np.fromfile(assets / "kitti/training/velodyne/000001.bin", np.float32).reshape(-1, 4)
    pillars = voxelize(points, cfg)
    (features,) = _session(build_pfn_graph(w, cfg)).run([PFN_OUTPUT], {PFN_INPUT: pillars.features})
    assert 0.2 < np.sqrt(np.mean(features**2)) < 5.0
    out = _run_rpn(build_rpn_graph(w, cfg), scatter(features, pillars.coords, cfg), cfg)
    scores = 1.0 / (1.0 + np.exp(-out["cls"].astype(np.float64)))
    per_anchor = scores.reshape(cfg.anchors.per_cell, cfg.num_classes, -1).max(axis=1)
    assert 10 <= np.count_nonzero(per_anchor > 0.1) <= 2000
    assert np.abs(out["box"]).max() < 3.0 and 0.01 < out["box"].std() < 0.5
