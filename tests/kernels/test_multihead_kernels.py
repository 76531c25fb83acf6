"""The multi-head kernels: the neck branches and head output convs of ``multihead_rpn.cu`` and the
post-process of ``multihead_post.cu``.

The weight re-layouts are checked on the CPU against plain convolutions written out tap by tap; the
kernels on the GPU against the same convolutions and against ``reference.multihead``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pointpillars_trt.config import load_config
from pointpillars_trt.errors import BackendError
from pointpillars_trt.kernels.multihead_rpn import (HeadBranch, NeckBranch, pack_head_branches,
                                                    pack_head_weights_for_mma, pack_neck_weight,
                                                    pack_neck_weight_for_mma, tensor_core_values)
from pointpillars_trt.reference.multihead import multihead_postprocess

CFG = load_config("openpcdet_nuscenes_multihead")


def strided_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """Conv2d(kernel = stride = k, no padding) + bias + ReLU, NHWC, by its definition."""
    n, h, width, _ = x.shape
    out = np.zeros((n, h // k, width // k, w.shape[0]), np.float64)
    for ky in range(k):
        for kx in range(k):
            out += x[:, ky::k, kx::k, :].astype(np.float64) @ w[:, :, ky, kx].T.astype(np.float64)
    return np.maximum(out + b, 0)


def transposed_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """ConvTranspose2d(kernel = stride = k) + bias + ReLU, NHWC, by its definition."""
    n, h, width, _ = x.shape
    out = np.zeros((n, h * k, width * k, w.shape[1]), np.float64)
    for ky in range(k):
        for kx in range(k):
            out[:, ky::k, kx::k, :] = x.astype(np.float64) @ w[:, :, ky, kx].astype(np.float64)
    return np.maximum(out + b, 0)


def conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Conv2d(3x3, padding 1) + bias, NHWC, by its definition."""
    n, h, width, _ = x.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((n, h, width, w.shape[0]), np.float64)
    for ky in range(3):
        for kx in range(3):
            out += padded[:, ky : ky + h, kx : kx + width, :] @ w[:, :, ky, kx].T.astype(np.float64)
    return out + b


def packed_neck(x: np.ndarray, packed: np.ndarray, b: np.ndarray, branch: NeckBranch) -> np.ndarray:
    """What neck_branch computes from the packed rows: output pixel (y, x) sums row (tap * cin + ci)."""
    n, h, width, cin = x.shape
    k = branch.k
    if branch.down:
        patches = x.reshape(n, h // k, k, width // k, k, cin).transpose(0, 1, 3, 2, 4, 5).reshape(n, h // k, width // k, -1)
        return np.maximum(patches.astype(np.float64) @ packed + b, 0)
    out = np.zeros((n, h * k, width * k, packed.shape[1]), np.float64)
    for tap in range(k * k):
        ky, kx = divmod(tap, k)
        out[:, ky::k, kx::k, :] = x.astype(np.float64) @ packed[tap * cin : (tap + 1) * cin]
    return np.maximum(out + b, 0)


@pytest.mark.parametrize("down,k", [(True, 2), (False, 1), (False, 2)])
def test_neck_rows_compute_the_convolution(down: bool, k: int) -> None:
    rng = np.random.default_rng(k + 10 * down)
    cin, cout = 8, 6
    w = rng.normal(size=(cout, cin, k, k) if down else (cin, cout, k, k)).astype(np.float32)
    b = rng.normal(size=cout).astype(np.float32)
    x = rng.normal(size=(2, 4, 6, cin)).astype(np.float32)
    branch = NeckBranch(cin, cout, k, down)
    packed = pack_neck_weight(w, down)
    assert packed.shape == (branch.reduce if down else k * k * cin, cout)
    want = strided_conv(x, w, b, k) if down else transposed_conv(x, w, b, k)
    np.testing.assert_allclose(packed_neck(x, packed, b, branch), want, atol=1e-9)


def tensor_core_weights(w: np.ndarray, precision: str) -> np.ndarray:
    """``w`` made values the tensor-core kernels take as they are: float16 values, or TF32 ones (the float32
    value with its low 13 mantissa bits cleared, the rounding done independently of the packing's)."""
    if precision == "fp16":
        return w.astype(np.float16).astype(np.float32)
    return (np.ascontiguousarray(w, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def test_tensor_core_values_are_float16_exactly_or_rounded_to_tf32() -> None:
    """fp16 takes float16 values only (the kernels must compute with the engine's weights); tf32 rounds to
    nearest, ties away from zero, to TF32's 10 mantissa bits (1 + 2^-11 is a tie: it goes up)."""
    w = np.array([1.0, 1 + 2.0**-11, -(1 + 2.0**-11), 1 + 2.0**-12, 3.0 * 2.0**-11], np.float32)
    tf32 = tensor_core_values(w, "tf32", "test")
    assert tf32.dtype == np.float32
    assert tf32.tolist() == [1.0, 1 + 2.0**-10, -(1 + 2.0**-10), 1.0, 3.0 * 2.0**-11]
    assert tensor_core_values(w[:1], "fp16", "test").dtype == np.float16
    with pytest.raises(BackendError, match="not float16 values"):
        tensor_core_values(w, "fp16", "test")
    with pytest.raises(BackendError, match="no tensor-core kernels for precision fp32"):
        tensor_core_values(w, "fp32", "test")


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("down,k", [(True, 2), (False, 1), (False, 2)])
def test_neck_weights_for_the_tensor_cores_compute_the_convolution(down: bool, k: int, precision: str) -> None:
    """neck_branch_mma's (taps, cout, reduce) block: output channel c of tap (a strided conv's one, a
    transposed conv's ky * k + kx) sums its reduce values times row c, as the convolution's definition does."""
    rng = np.random.default_rng(20 + k + 10 * down)
    cin, cout = 8, 6
    shape = (cout, cin, k, k) if down else (cin, cout, k, k)
    w = tensor_core_weights(rng.normal(size=shape), precision)
    b = rng.normal(size=cout).astype(np.float32)
    x = rng.normal(size=(2, 4, 6, cin)).astype(np.float32)
    branch = NeckBranch(cin, cout, k, down)
    packed = pack_neck_weight_for_mma(w, branch, precision).astype(np.float64)
    assert packed.shape == ((1, cout, k * k * cin) if down else (k * k, cout, cin))
    if down:
        n, h, width, _ = x.shape
        patches = x.reshape(n, h // k, k, width // k, k, cin).transpose(0, 1, 3, 2, 4, 5).reshape(n, h // k, width // k, -1)
        got = np.maximum(patches @ packed[0].T + b, 0)
        np.testing.assert_allclose(got, strided_conv(x, w, b, k), atol=1e-9)
    else:
        got = np.zeros((2, 4 * k, 6 * k, cout))
        for tap in range(k * k):
            ky, kx = divmod(tap, k)
            got[:, ky::k, kx::k, :] = x @ packed[tap].T
        np.testing.assert_allclose(np.maximum(got + b, 0), transposed_conv(x, w, b, k), atol=1e-9)


def _head_branches(rng: np.random.Generator, mid: int, counts: list[int]) -> tuple[list[HeadBranch], int]:
    branches, at = [], 0
    for n in counts:
        branches.append(HeadBranch(at, rng.normal(size=(n, mid, 3, 3)).astype(np.float32),
                                   rng.normal(size=n).astype(np.float32)))
        at += n
    return branches, at


def test_head_blocks_compute_each_branchs_convolution() -> None:
    rng = np.random.default_rng(3)
    mid = 4
    branches, total = _head_branches(rng, mid, [2, 5, 3])
    weights, biases, table = pack_head_branches(branches, mid)
    assert weights.shape == (3, 5, 9, mid) and table.tolist() == [[0, 2], [2, 5], [7, 3]]
    assert not weights[0, 2:].any() and not biases[2, 3:].any()  # zero past each branch's outputs
    x = rng.normal(size=(1, 5, 7, 3 * mid)).astype(np.float32)
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    for g, branch in enumerate(branches):
        want = conv3x3(x[..., g * mid : (g + 1) * mid], branch.weight, branch.bias)
        got = np.zeros_like(want)
        for tap in range(9):
            ky, kx = divmod(tap, 3)
            window = padded[:, ky : ky + 5, kx : kx + 7, g * mid : (g + 1) * mid]
            got += window @ weights[g, : table[g, 1], tap, :].T.astype(np.float64)
        np.testing.assert_allclose(got + biases[g, : table[g, 1]], want, atol=1e-9)


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_head_weights_for_the_tensor_cores_are_each_taps_outputs_by_channels(precision: str) -> None:
    """head_conv_mma's (G, 9, HEAD_N, MID) block: weight (g, tap, o, ci) is branch g's output o's weight for
    channel ci at tap (ky * 3 + kx), HEAD_N the outputs rounded up to 8, zero past a branch's outputs."""
    rng = np.random.default_rng(5)
    mid = 16
    branches, _ = _head_branches(rng, mid, [2, 10, 3])
    branches = [HeadBranch(b.out_at, tensor_core_weights(b.weight, precision), b.bias) for b in branches]
    weights, _, _ = pack_head_branches(branches, mid)
    packed = pack_head_weights_for_mma(weights, precision)
    assert packed.dtype == (np.float16 if precision == "fp16" else np.float32) and packed.shape == (3, 9, 16, mid)
    for g, branch in enumerate(branches):
        n = branch.weight.shape[0]
        for tap in range(9):
            ky, kx = divmod(tap, 3)
            np.testing.assert_array_equal(packed[g, tap, :n].astype(np.float32), branch.weight[:, :, ky, kx])
        assert not packed[g, :, n:].any()


def test_an_unknown_precision_is_refused() -> None:
    from pointpillars_trt.kernels.multihead_rpn import MultiHeadRpnKernels

    with pytest.raises(BackendError, match="precision 'bf16'; expected one of"):
        MultiHeadRpnKernels([], [], 64, 0, "bf16")


# --------------------------------------------------------------------------- on the GPU


def activations(values: np.ndarray, precision: str) -> np.ndarray:
    """Inputs in the precision's activation type: float16, or float32 (TF32 values for tf32, so that the FMA
    and tensor-core kernels see the same numbers)."""
    if precision == "fp16":
        return values.astype(np.float16)
    return tensor_core_weights(values, precision) if precision == "tf32" else values.astype(np.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_rpn_kernels_against_the_convolutions(cp: Any, precision: str) -> None:
    """Small channel counts, where some neck branches fit the tensor-core kernels and some do not (their stage:
    64 bytes, as cin 24 is not whole 128-byte stages; fp16 cin 16 and 24 are not whole 64-byte ones, tf32 cin
    24); IEEE fp32 runs none on tensor cores."""
    from pointpillars_trt.kernels.multihead_rpn import MultiHeadRpnKernels

    rng = np.random.default_rng(["fp32", "fp16", "tf32"].index(precision))
    specs = [NeckBranch(16, 8, 2, True), NeckBranch(24, 8, 1, False), NeckBranch(32, 8, 2, False)]
    inputs = [(1, 16, 20), (1, 8, 10), (1, 4, 5)]  # each lands on the 8 x 10 head map
    neck = []
    for spec in specs:
        shape = (spec.out_channels, spec.in_channels, spec.k, spec.k) if spec.down else (spec.in_channels, spec.out_channels, spec.k, spec.k)
        neck.append((spec, activations(rng.normal(size=shape) / 4, precision).astype(np.float32),
                     activations(rng.normal(size=spec.out_channels), precision).astype(np.float32)))
    mid = 16  # a multiple of the channels head_conv stages at a time
    branches, total = _head_branches(rng, mid, [2, 6, 3, 4, 10])  # head_conv sums 4, 8 or all 10 outputs
    branches = [HeadBranch(b.out_at, activations(b.weight / 4, precision).astype(np.float32),
                           activations(b.bias, precision).astype(np.float32)) for b in branches]
    kernels = MultiHeadRpnKernels(neck, branches, mid, total, precision)
    assert kernels.neck_on_mma == {"fp32": [False] * 3, "tf32": [True, False, True], "fp16": [False, False, True]}[precision]
    assert kernels.head_kernel == ("head_conv" if precision == "fp32" else "head_conv_mma")
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    concat = cp.zeros((2, 8, 10, 24), kernels.io_dtype)
    want_concat = np.zeros((2, 8, 10, 24), np.float64)
    offset = 0
    for i, ((spec, w, b), (_, h, width)) in enumerate(zip(neck, inputs)):
        x = activations(rng.normal(size=(2, h, width, spec.in_channels)), precision)
        kernels.launch_neck(i, cp.asarray(x), concat, offset, stream)
        want = strided_conv(x, w, b, spec.k) if spec.down else transposed_conv(x, w, b, spec.k)
        want_concat[..., offset : offset + spec.out_channels] = want
        offset += spec.out_channels
    middle = activations(rng.normal(size=(2, 8, 10, len(branches) * mid)), precision)
    heads = cp.full((2, 8, 10, total), np.nan, np.float32)
    kernels.launch_heads(cp.asarray(middle), heads, stream)
    stream.synchronize()
    tol = 2e-3 if precision == "fp16" else 1e-4  # float16 outputs; float32 sums of the same values
    np.testing.assert_allclose(cp.asnumpy(concat).astype(np.float64), want_concat, rtol=tol, atol=tol)
    want_heads = np.concatenate([conv3x3(middle[..., g * mid : (g + 1) * mid], b.weight, b.bias)
                                 for g, b in enumerate(branches)], axis=-1)
    np.testing.assert_allclose(cp.asnumpy(heads), want_heads, rtol=tol, atol=tol)


def _head_map(rng: np.random.Generator, crowded: bool) -> np.ndarray:
    """A random merged head map of the nuScenes model: mostly background, a few hundred confident
    anchors; ``crowded`` puts 3,000 passing anchors (and tied scores) in the car head."""
    nx, ny = CFG.head_map
    channels = sum(CFG.head_channels.values())
    heads = rng.normal(0, 0.3, (ny, nx, channels)).astype(np.float32)
    cls = CFG.head_channels["cls"]
    heads[..., :cls] -= 4.0
    hot = rng.random((ny, nx, cls)) < 0.0005
    heads[..., :cls][hot] = rng.normal(1.0, 1.5, int(hot.sum()))
    if crowded:
        cells = rng.choice(ny * nx, 1500, replace=False)
        car = heads[..., :2].reshape(-1, 2)
        car[cells] = np.round(rng.normal(1.0, 1.0, (1500, 2)), 1)  # rounded: many equal scores
    return heads


@pytest.mark.cuda
@pytest.mark.parametrize("crowded", [False, True])
def test_post_process_equals_the_reference(cp: Any, crowded: bool) -> None:
    from pointpillars_trt.kernels.multihead_post import MultiHeadPostprocessStage

    rng = np.random.default_rng(7 + crowded)
    stage = MultiHeadPostprocessStage(CFG)
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    stats = cp.asarray(np.arange(1, 9, dtype=np.int32)[None])
    for frame in range(2):  # the second frame checks that the first left no state behind
        heads = _head_map(rng, crowded)
        stage.launch(cp.asarray(heads[None]), stats, stream)
        stream.synchronize()
        boxes, scores, labels, counts, velocity = MultiHeadPostprocessStage.unpack(cp.asnumpy(stage.result[0]))
        want = multihead_postprocess(heads, CFG)
        assert counts["count"] == len(want.scores) > 50, frame
        np.testing.assert_array_equal(labels, want.labels)
        np.testing.assert_allclose(scores, want.scores, rtol=0, atol=1e-6)
        np.testing.assert_allclose(boxes, want.boxes, rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(velocity, want.velocity, rtol=0, atol=1e-6)
        assert counts["pillars"] == 1  # the voxelizer's counts follow the stage's own in the header
        if crowded:
            assert counts["selected"] < counts["candidates"]  # the car head's top-k cut 3,000 candidates


@pytest.mark.cuda
def test_post_process_counts_nan_class_scores_of_every_head_and_starts_the_next_frame_from_none(cp: Any) -> None:
    """Class logits overflowed (NaN, infinite, beyond float16's largest value) in two heads of the second of two
    frames in a batch: that frame's header
    counts them (as many as were placed), the first frame's none, the boxes are the reference's; a batch after it
    without any counts none (the counts are zeroed after each frame)."""
    from pointpillars_trt.kernels.multihead_post import MultiHeadPostprocessStage

    rng = np.random.default_rng(53)
    stage = MultiHeadPostprocessStage(CFG, frames=2)
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    stats = cp.asarray(np.ones((2, 8), np.int32))
    clean = [_head_map(rng, False) for _ in range(2)]
    spoiled = clean[1].copy()
    spoiled[20:24, 30:40, 0:2] = np.nan  # the car head: both anchors' scores in 40 cells
    spoiled[50, 60, 28] = np.nan  # one pedestrian anchor's score
    spoiled[51:55, 60, 28] = (-np.inf, -1e30, -65505.0, -np.finfo(np.float16).max)  # the last at the bound: a value
    for heads, nans in ((np.stack([clean[0], spoiled]), [0, 4 * 10 * 2 + 4]), (np.stack(clean), [0, 0])):
        stage.launch(cp.asarray(heads), stats, stream, frames=2)
        stream.synchronize()
        for f in range(2):
            boxes, scores, labels, counts, _ = MultiHeadPostprocessStage.unpack(cp.asnumpy(stage.result[f]))
            want = multihead_postprocess(heads[f], CFG)
            assert counts["overflowed_scores"] == nans[f] == want.overflowed_scores
            assert counts["count"] == len(want.scores) > 0
            np.testing.assert_array_equal(labels, want.labels)
            np.testing.assert_allclose(scores, want.scores, rtol=0, atol=1e-6)
            np.testing.assert_allclose(boxes, want.boxes, rtol=1e-5, atol=2e-5)


@pytest.mark.cuda
def test_post_process_of_a_batch_equals_the_reference_frame_by_frame(cp: Any) -> None:
    """Three frames in one set of launches (crowded, quiet, crowded), each its own boxes and its own
    voxelizer counts in its header; a smaller batch after it leaves no state behind."""
    from pointpillars_trt.kernels.multihead_post import MultiHeadPostprocessStage

    rng = np.random.default_rng(31)
    stage = MultiHeadPostprocessStage(CFG, frames=3)
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    stats = cp.asarray((np.arange(1, 9, dtype=np.int32) + 10 * np.arange(3, dtype=np.int32)[:, None]))
    for frames in (3, 2):
        heads = np.stack([_head_map(rng, crowded) for crowded in (True, False, True)[:frames]])
        stage.result.fill(np.nan)
        stage.launch(cp.asarray(heads), stats, stream, frames=frames)
        stream.synchronize()
        for f in range(frames):
            boxes, scores, labels, counts, velocity = MultiHeadPostprocessStage.unpack(cp.asnumpy(stage.result[f]))
            want = multihead_postprocess(heads[f], CFG)
            assert counts["count"] == len(want.scores) > 0, (frames, f)
            np.testing.assert_array_equal(labels, want.labels)
            np.testing.assert_allclose(scores, want.scores, rtol=0, atol=1e-6)
            np.testing.assert_allclose(boxes, want.boxes, rtol=1e-5, atol=2e-5)
            np.testing.assert_allclose(velocity, want.velocity, rtol=0, atol=1e-6)
            assert counts["pillars"] == 1 + 10 * f


def tf32_nearest(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits) to nearest, ties away from zero, by the value's
    quantum at its exponent: how the TF32 kernels read their float32 inputs."""
    v = np.asarray(values, np.float64)
    _, exponent = np.frexp(v)  # |v| = m 2^e, 0.5 <= m < 1: the quantum of 11 significant bits is 2^(e - 11)
    quantum = np.ldexp(1.0, exponent - 11)
    return np.sign(v) * np.floor(np.abs(v) / quantum + 0.5) * quantum


def test_tf32_nearest_rounds_ties_away_from_zero() -> None:
    one = 1 + 2.0**-11  # halfway between 1 and 1 + 2^-10
    got = tf32_nearest(np.array([one, -one, 1 + 2.0**-12, 0.0, 3.0, 1 - 2.0**-13], np.float32))
    assert got.tolist() == [1 + 2.0**-10, -(1 + 2.0**-10), 1.0, 0.0, 3.0, 1.0]


def _tensor_core_inputs(values: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (the kernel's input, the values it computes with): float16 both, or float32 and its TF32 rounding."""
    if precision == "fp16":
        x = values.astype(np.float16)
        return x, x.astype(np.float64)
    x = values.astype(np.float32)
    return x, tf32_nearest(x)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_head_convs_on_tensor_cores_over_many_tiles_equal_the_convolutions(cp: Any, precision: str) -> None:
    """The output convs on tensor cores (head_conv_mma) at the model's 64 middle channels, on two frames of a
    19 x 37 map (tiles cut at both edges), for branches of 2 to 12 outputs (one and two n8 tiles): each
    branch's 3x3 conv of its channels, worked out in float64 from the values the kernel computes with (the
    same float16 values; float32 inputs rounded to TF32, which the kernel must do itself)."""
    from pointpillars_trt.kernels.multihead_rpn import MultiHeadRpnKernels

    rng = np.random.default_rng(11)
    mid = 64
    branches, total = _head_branches(rng, mid, [2, 8, 12, 4, 6, 9])
    branches = [HeadBranch(b.out_at, tensor_core_weights(b.weight / 8, precision),
                           activations(b.bias, precision).astype(np.float32)) for b in branches]
    neck = [(NeckBranch(16, 8, 1, False), tensor_core_weights(rng.normal(size=(16, 8, 1, 1)), precision),
             np.zeros(8, np.float32))]
    kernels = MultiHeadRpnKernels(neck, branches, mid, total, precision)
    assert kernels.head_kernel == "head_conv_mma"
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    middle, used = _tensor_core_inputs(rng.normal(size=(2, 19, 37, len(branches) * mid)), precision)
    heads = cp.full((2, 19, 37, total), np.nan, np.float32)
    kernels.launch_heads(cp.asarray(middle), heads, stream)
    stream.synchronize()
    want = np.concatenate([conv3x3(used[..., g * mid : (g + 1) * mid], b.weight, b.bias)
                           for g, b in enumerate(branches)], axis=-1)
    got = cp.asnumpy(heads)
    assert np.isfinite(got).all()  # every output written
    if precision == "fp16":
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
        assert np.array_equal(got, got.astype(np.float16).astype(np.float32))  # rounded to float16 as the graph's convs
    else:  # float32 sums of 576 products: truncated inputs would be ~1e-3 off
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_neck_branches_on_tensor_cores_equal_the_convolutions(cp: Any, precision: str) -> None:
    """The neck branches on tensor cores (neck_branch_mma) at the model's channel counts: a strided conv 64 ->
    136 (three blocks of output channels, the third partial), a transposed conv of k = 1 and one of k = 2,
    into their slices of a 10 x 18 concat over two frames, against each convolution's definition in float64
    from the values the kernel computes with (as for the head convs above)."""
    from pointpillars_trt.kernels.multihead_rpn import MultiHeadRpnKernels

    rng = np.random.default_rng(13)
    specs = [NeckBranch(64, 136, 2, True), NeckBranch(128, 128, 1, False), NeckBranch(256, 128, 2, False)]
    inputs = [(20, 36), (10, 18), (5, 9)]
    neck = []
    for spec in specs:
        shape = (spec.out_channels, spec.in_channels, spec.k, spec.k) if spec.down else (spec.in_channels, spec.out_channels, spec.k, spec.k)
        neck.append((spec, tensor_core_weights(rng.normal(size=shape) / 8, precision),
                     activations(rng.normal(size=spec.out_channels), precision).astype(np.float32)))
    branches, total = _head_branches(rng, 64, [2])
    branches = [HeadBranch(0, tensor_core_weights(branches[0].weight, precision), branches[0].bias)]
    kernels = MultiHeadRpnKernels(neck, branches, 64, total, precision)
    assert kernels.neck_on_mma == [True, True, True]
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    channels = sum(spec.out_channels for spec in specs)
    concat = cp.full((2, 10, 18, channels), np.nan, kernels.io_dtype)
    want = np.zeros((2, 10, 18, channels))
    offset = 0
    for i, ((spec, w, b), (h, width)) in enumerate(zip(neck, inputs)):
        x, used = _tensor_core_inputs(rng.normal(size=(2, h, width, spec.in_channels)), precision)
        kernels.launch_neck(i, cp.asarray(x), concat, offset, stream)
        want[..., offset : offset + spec.out_channels] = (strided_conv(used, w, b, spec.k) if spec.down
                                                          else transposed_conv(used, w, b, spec.k))
        offset += spec.out_channels
    stream.synchronize()
    got = cp.asnumpy(concat).astype(np.float64)
    assert np.isfinite(got).all()  # every output written
    tol = 2e-3 if precision == "fp16" else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_a_head_branch_too_wide_for_the_tensor_core_tile_runs_on_the_fma_kernel(cp: Any, precision: str) -> None:
    """A branch of 40 outputs at 64 middle channels: the tensor-core tile and its weights would not fit the
    shared memory, so the heads run on head_conv in every precision, and the module (which then holds no
    tensor-core kernel) compiles and computes the convolutions."""
    from pointpillars_trt.kernels.multihead_rpn import MultiHeadRpnKernels

    rng = np.random.default_rng(17)
    mid = 64
    branches, total = _head_branches(rng, mid, [2, 40])
    branches = [HeadBranch(b.out_at, tensor_core_weights(b.weight / 8, "fp16"), b.bias) for b in branches]
    neck = [(NeckBranch(64, 8, 1, False), tensor_core_weights(rng.normal(size=(64, 8, 1, 1)), "fp16"),
             np.zeros(8, np.float32))]
    kernels = MultiHeadRpnKernels(neck, branches, mid, total, precision)
    assert kernels.head_kernel == "head_conv"
    middle = activations(rng.normal(size=(1, 9, 11, len(branches) * mid)), precision)
    heads = cp.full((1, 9, 11, total), np.nan, np.float32)
    stream = cp.cuda.Stream()  # blocking: ordered after the inputs made on the default stream
    kernels.launch_heads(cp.asarray(middle), heads, stream)
    stream.synchronize()
    want = np.concatenate([conv3x3(middle[..., g * mid : (g + 1) * mid], b.weight, b.bias)
                           for g, b in enumerate(branches)], axis=-1)
    tol = 2e-3 if precision == "fp16" else 1e-4
    np.testing.assert_allclose(cp.asnumpy(heads), want, rtol=tol, atol=tol)
