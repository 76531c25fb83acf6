"""Neck-head stage: the packed weight layout against the plain ONNX-layout computation (NumPy, CPU),
and (marked `cuda`) the kernel in float16, TF32 and float32 against a float64 NumPy twin."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from pointpillars_trt.errors import BackendError
from pointpillars_trt.kernels.neck_head import (NeckBranch, NeckHeadParams, NeckHeadWeights, head_blocks, pack_neck_head,
                                                round_to_tf32)
from tiny import tiny_config

KITTI_LIKE = ((64, 128, 1), (128, 128, 2), (256, 128, 4))  # (Cin, CU, stride): KITTI's neck on a small map
TINY = ((8, 16, 1), (16, 16, 2), (32, 16, 4))


def make_case(branches, hy: int, hx: int, nh: int, batch: int, seed: int = 0, half: bool = False, tf32: bool = False):
    """Params, ONNX-layout weights and NHWC features; float16- (``half``) or TF32- (``tf32``) representable values."""
    rng = np.random.default_rng(seed)
    params = NeckHeadParams(tuple(NeckBranch(*b) for b in branches), hy, hx, nh, half, tf32=tf32)
    rnd = ((lambda a: a.astype(np.float16).astype(np.float32)) if half else
           (lambda a: tf32_rounded(a.astype(np.float32))) if tf32 else (lambda a: a.astype(np.float32)))
    dw = tuple(rnd(rng.standard_normal((cin, cu, k, k)) * np.sqrt(2.0 / cin)) for cin, cu, k in branches)
    db = tuple(rnd(0.1 * rng.standard_normal(cu)) for _, cu, _ in branches)
    cat = sum(cu for _, cu, _ in branches)
    hw = rnd(rng.standard_normal((nh, cat)) * np.sqrt(1.0 / cat))
    hb = rnd(0.1 * rng.standard_normal(nh))
    feats = [rnd(np.maximum(rng.standard_normal(params.feature_shape(i, batch)), 0.0)) for i in range(len(branches))]
    return params, NeckHeadWeights(dw, db, hw, hb), feats


def tf32_rounded(a: np.ndarray) -> np.ndarray:
    """float32 values to TF32 (10 mantissa bits), to nearest, ties away from zero, through frexp: the
    independent twin of ``round_to_tf32``'s bit arithmetic (normal values)."""
    m, e = np.frexp(a.astype(np.float64))  # a = m * 2**e, 0.5 <= |m| < 1
    q = np.sign(m) * np.floor(np.abs(m) * 2.0**11 + 0.5)
    return np.ldexp(q, e - 11).astype(np.float32)


def reference(weights: NeckHeadWeights, feats, round_u_half: bool = False, round_u_tf32: bool = False) -> np.ndarray:
    """float64: ConvTranspose(kernel == stride) + bias + ReLU per branch, concat, 1x1 heads. NHWC."""
    ups = []
    for x, w, b in zip(feats, weights.deconv_weights, weights.deconv_biases):
        bsz, h, wd, _ = x.shape
        k, cout = w.shape[2], w.shape[1]
        t = np.einsum("nhwc,cokl->nhkwlo", x.astype(np.float64), w.astype(np.float64), optimize=True)
        u = np.maximum(t.reshape(bsz, h * k, wd * k, cout) + b, 0.0)
        if round_u_half:
            u = u.astype(np.float16).astype(np.float64)
        elif round_u_tf32:
            u = tf32_rounded(u).astype(np.float64)
        ups.append(u)
    cat = np.concatenate(ups, axis=-1)
    return cat @ weights.head_weight.astype(np.float64).T + weights.head_bias


def packed_forward(params: NeckHeadParams, wbuf: np.ndarray, bbuf: np.ndarray, feats) -> np.ndarray:
    """The kernel's arithmetic in NumPy, reading the packed buffers at the offsets it is compiled with."""
    lay = params.layout()
    w, bias = wbuf.astype(np.float64), bbuf.astype(np.float64)
    bsz = feats[0].shape[0]
    out = np.zeros((bsz, params.head_y, params.head_x, params.padded_heads))
    for i, br in enumerate(params.branches):
        k, kp, cu = br.stride, br.padded_in, br.padded_up
        slices = w[lay[f"B{i}_W"]: lay[f"B{i}_W"] + k * k * cu * kp]
        head = w[lay[f"B{i}_HEAD"]: lay[f"B{i}_HEAD"] + params.padded_heads * cu]
        if params.mma_layout:  # N x K: [a][b][co][ci] and [h][c]
            slices, head = slices.reshape(k, k, cu, kp), head.reshape(params.padded_heads, cu)
        else:  # K x N
            slices, head = slices.reshape(k, k, kp, cu).transpose(0, 1, 3, 2), head.reshape(cu, params.padded_heads).T
        b = bias[lay[f"B{i}_BIAS"]: lay[f"B{i}_BIAS"] + cu]
        x = np.zeros(feats[i].shape[:3] + (kp,))
        x[..., : br.in_channels] = feats[i]
        for y in range(params.head_y):
            for xx in range(params.head_x):
                u = np.maximum(x[:, y // k, xx // k, :] @ slices[y % k, xx % k].T + b, 0.0)
                out[:, y, xx, :] += u @ head.T
    out += bias[lay["HEAD_BIAS"]: lay["HEAD_BIAS"] + params.padded_heads]
    assert not out[..., params.head_channels:].any(), "padded head channels must stay zero"
    return out[..., : params.head_channels]


# -- CPU ------------------------------------------------------------------------------------------


MODES = {"f16": (True, False), "tf32": (False, True), "f32": (False, False)}  # (half, tf32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("branches", [TINY, ((24, 40, 1), (48, 8, 3))])
def test_packed_layout_matches_onnx_layout(branches, mode):
    half, tf32 = MODES[mode]
    hy, hx = (12, 16) if len(branches) == 3 else (6, 9)
    params, weights, feats = make_case(branches, hy, hx, nh=13, batch=2, half=half, tf32=tf32)
    wbuf, bbuf = pack_neck_head(params, weights)
    assert wbuf.dtype == (np.float16 if half else np.float32) and bbuf.dtype == np.float32
    np.testing.assert_allclose(packed_forward(params, wbuf, bbuf, feats), reference(weights, feats), rtol=1e-5, atol=1e-5)


def test_tf32_packing_rounds_the_weights_as_the_independent_twin():
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(20_000) * 10.0 ** rng.uniform(-6, 6, 20_000)).astype(np.float32)
    ties = np.float32(1.0) + np.float32(2.0**-11) * np.arange(1, 9, 2, dtype=np.float32)  # exactly half-way cases
    values = np.concatenate([values, ties, -ties, np.zeros(1, np.float32)])
    rounded = round_to_tf32(values)
    np.testing.assert_array_equal(rounded, tf32_rounded(values))
    assert not (rounded.view(np.uint32) & 0x1FFF).any()
    assert round_to_tf32(np.array([np.inf, -np.inf], np.float32)).tolist() == [np.inf, -np.inf]
    params, weights, feats = make_case(TINY, 12, 16, nh=13, batch=1, seed=5)  # weights not TF32-representable
    params = NeckHeadParams(params.branches, 12, 16, 13, False, tf32=True)
    wbuf, bbuf = pack_neck_head(params, weights)
    assert not (wbuf.view(np.uint32) & 0x1FFF).any(), "packed TF32 weights keep 10 mantissa bits"
    np.testing.assert_allclose(packed_forward(params, wbuf, bbuf, feats), reference(weights, feats), rtol=2e-3, atol=2e-3)


def test_packed_layout_is_aligned_for_mma():
    params, weights, _ = make_case(KITTI_LIKE, 8, 12, nh=72, batch=1, half=True)
    lay = params.layout()
    assert all(lay[f"B{i}_{part}"] % 16 == 0 for i in range(3) for part in ("W", "HEAD"))
    assert params.padded_heads == 72 and params.cell == 4
    wbuf, _ = pack_neck_head(params, weights)
    assert wbuf.dtype == np.float16 and wbuf.size == lay["weight_size"]


def test_head_blocks_split_the_merged_head():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((72, 384, 1, 1))
    blocks = head_blocks(w, [128, 128, 128])
    assert [b.shape for b in blocks] == [(128, 72)] * 3
    u = rng.standard_normal((5, 384))
    np.testing.assert_allclose(sum(u[:, 128 * i: 128 * (i + 1)] @ b for i, b in enumerate(blocks)), u @ w[:, :, 0, 0].T)
    with pytest.raises(BackendError, match="Expected 300"):
        head_blocks(w, [100, 100, 100])


def test_params_from_config_and_refusals():
    p = NeckHeadParams.from_config(tiny_config(), half=True)
    assert (p.head_y, p.head_x, p.head_channels) == (12, 16, 72)
    assert [(b.in_channels, b.up_channels, b.stride) for b in p.branches] == list(TINY)
    with pytest.raises(BackendError, match="does not divide the head map"):
        NeckHeadParams((NeckBranch(8, 16, 3),), 8, 8, 4, True)
    with pytest.raises(BackendError, match="multiple of 8"):
        NeckHeadParams((NeckBranch(12, 16, 1),), 8, 8, 4, True)
    with pytest.raises(BackendError, match="1 to 3"):
        NeckHeadParams((NeckBranch(8, 16, 1),) * 4, 8, 8, 4, True)
    with pytest.raises(BackendError, match="stages"):
        NeckHeadParams((NeckBranch(8, 16, 1),), 8, 8, 4, True, stages=1)
    with pytest.raises(BackendError, match="not both"):
        NeckHeadParams((NeckBranch(8, 16, 1),), 8, 8, 4, True, tf32=True)
    assert NeckHeadParams.from_config(tiny_config(), half=False, tf32=True).kernel_name == "neck_head_tf32"
    assert NeckHeadParams.from_config(tiny_config(), half=True, tf32=True).kernel_name == "neck_head_f16"
    nchw = NeckHeadParams.from_config(tiny_config(), half=False, channels_first=True)
    assert nchw.feature_shape(1, 2) == (2, 16, 6, 8) and "-DNH_IN_NCHW=1" in nchw.defines()
    kitti = NeckHeadParams(tuple(NeckBranch(*b) for b in KITTI_LIKE), 248, 216, 72, False, channels_first=True)
    kitti.check_batch(64)
    with pytest.raises(BackendError, match="neck feature 0: .* 32-bit offsets"):  # 64 x 248 x 216 x 700 > 2**31
        kitti.check_batch(700)
    for half, tf32 in ((True, False), (False, True)):
        with pytest.raises(BackendError, match="float32 kernel only"):
            NeckHeadParams(p.branches, 12, 16, 72, half, tf32=tf32, channels_first=True)


def test_a_neck_wider_than_the_tf32_kernel_runs_the_float32_one_and_says_so():
    import dataclasses

    from pointpillars_trt.kernels.neck_head import TF32_MAX_UP

    cfg = tiny_config()
    wide = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, upsample_channels=(16, TF32_MAX_UP + 32, 16)))
    with pytest.warns(RuntimeWarning, match="runs the neck and heads in float32 FMA"):
        params = NeckHeadParams.from_config(wide, half=False, tf32=True)
    assert params.kernel_name == "neck_head_f32"
    with pytest.raises(BackendError, match=f"takes up to {TF32_MAX_UP}"):
        NeckHeadParams(params.branches, params.head_y, params.head_x, params.head_channels, False, tf32=True)
    assert NeckHeadParams.from_config(cfg, half=False, tf32=True).kernel_name == "neck_head_tf32"  # 16 wide: no notice


def test_float16_launch_shape():
    p = NeckHeadParams(tuple(NeckBranch(*b) for b in KITTI_LIKE), 248, 216, 72, True, warps=8, stages=3)
    assert (p.rows_per_block, p.threads) == (128, 256)
    # stages x (A: 128 x 72 + W: max(128 x 72, 72 x 136)) halves + 3 x 128 int32 pixel indices
    assert p.shared_bytes == 3 * 2 * (128 * 72 + 72 * 136) + 3 * 128 * 4
    assert "-DNH_SMEM=115584" in p.defines() and "-DNH_WARPS=8" in p.defines()
    assert NeckHeadParams(p.branches, 248, 216, 72, False).shared_bytes == 0


def test_hopper_takes_the_wgmma_kernel_where_it_fits():
    from dataclasses import replace

    kitti = NeckHeadParams(tuple(NeckBranch(*b) for b in KITTI_LIKE), 248, 216, 72, True)
    fast = kitti.for_gpu("90")
    assert (fast.wgmma, fast.kernel_name, fast.threads, fast.stages, fast.min_blocks) == (True, "neck_head_wgmma", 384, 2, 1)
    # resident: 1 + 2 + 4 chunks of 128 x 64 halves and 3 head blocks of 72 x 128 halves; then 3 warpgroups x
    # 2 stages of 64 x 64 halves; 1 KiB of alignment
    assert fast.shared_bytes == 7 * 16384 + 3 * 72 * 128 * 2 + 3 * 2 * 8192 + 1024 == 220_160
    assert f"-DNH_SMEM={fast.shared_bytes}" in fast.defines()
    assert replace(fast, warps=4, stages=2).shared_bytes == 7 * 16384 + 3 * 72 * 128 * 2 + 2 * 8192 + 1024
    many_heads = replace(fast, branches=(NeckBranch(16, 128, 1), NeckBranch(32, 128, 2)), head_channels=100)
    assert many_heads.shared_bytes == 2 * 16384 + 2 * 2 * 72 * 128 * 2 + 2 * 3 * 8192 + 1024  # 104 heads: 2 tiles of 72
    assert kitti.for_gpu("89") == kitti and kitti.for_gpu("100") == kitti  # Ada, Blackwell: no sm_90a
    assert NeckHeadParams.from_config(tiny_config(), half=True).for_gpu("90").wgmma is False  # 16 channels a branch
    assert replace(kitti, half=False).for_gpu("90").wgmma is False
    with pytest.raises(BackendError, match="wgmma needs float16"):
        replace(kitti, wgmma=True, warps=6)
    # a neck whose resident weights would not fit beside the stages (512 input channels: 8 more chunks)
    wide = NeckHeadParams((*kitti.branches[:2], NeckBranch(512, 128, 4)), 248, 216, 72, True)
    assert wide.for_gpu("90") == wide and wide.kernel_name == "neck_head_f16"
    with pytest.raises(BackendError, match="bytes of shared memory"):
        replace(fast, warps=8, stages=4)  # 2 x 4 stages: 236,544 bytes
    with pytest.raises(BackendError, match="blocks a position"):
        replace(fast, blocks_per_position=-1)


# -- GPU ------------------------------------------------------------------------------------------


ODD = ((24, 40, 1), (48, 8, 3))  # two branches, CU < CU_MAX, input channels not a multiple of 64; odd NH below


@pytest.mark.cuda
@pytest.mark.parametrize("mode", [*MODES, "f32_nchw"])
@pytest.mark.parametrize("case", ["tiny", "kitti_like", "odd", "many_heads", "multi_pass"])
@pytest.mark.parametrize("shape", [(8, 2, 2), (6, 3, 2), (4, 2, 1)], ids=["w8s2", "w6s3", "w4s2"])  # float16 warps, stages, blocks
def test_kernel_matches_float64_reference(cp, mode, case, shape):
    from dataclasses import replace

    from pointpillars_trt.kernels.neck_head import NeckHeadStage

    half, tf32 = MODES.get(mode, (False, False))
    if not half and shape != (8, 2, 2):
        pytest.skip("the float32 and TF32 kernels have one shape")
    if case == "multi_pass" and (half or tf32):
        pytest.skip("more than 128 upsampled channels: several passes of the float32 kernel")
    branches, hy, hx, batch, nh = {
        "tiny": (TINY, 12, 16, 3, 72), "kitti_like": (KITTI_LIKE, 40, 56, 2, 72), "odd": (ODD, 18, 27, 3, 13),
        "many_heads": (TINY, 12, 16, 2, 141),  # float32: two 64-channel head quads, then singles
        "multi_pass": (((64, 256, 1), (128, 160, 2), (256, 136, 4)), 16, 24, 2, 72),  # float32: 2 passes, partial
    }[case]
    params, weights, feats = make_case(branches, hy, hx, nh=nh, batch=batch, half=half, tf32=tf32)
    nchw = mode == "f32_nchw"  # the IEEE fp32 backbone's channel-major features
    params = replace(params, warps=shape[0], stages=shape[1], min_blocks=shape[2], channels_first=nchw)
    stage = NeckHeadStage(params, weights)
    dtype = np.float16 if half else np.float32
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # inputs and NaN fill in the launch's stream order
        d_feats = [cp.asarray(np.ascontiguousarray(f.transpose(0, 3, 1, 2) if nchw else f).astype(dtype)) for f in feats]
        out = cp.full(params.output_shape(batch), np.nan, np.float32)
    stage.launch(d_feats, out, stream)
    stream.synchronize()
    got = cp.asnumpy(out)
    assert np.isfinite(got).all(), "every output pixel is written"
    ref = reference(weights, feats, round_u_half=half, round_u_tf32=tf32)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    # TF32: operands exact, u rounded as the reference rounds it (a float32 sum on either side of a
    # rounding boundary may differ by one TF32 step)
    assert err <= (2e-3 if half else 5e-4 if tf32 else 1e-5), f"max error {err:.2e} of max|ref|"


@pytest.mark.cuda
def test_kernel_checks_its_arrays(cp):
    from pointpillars_trt.errors import InputError
    from pointpillars_trt.kernels.neck_head import NeckHeadStage

    params, weights, feats = make_case(TINY, 12, 16, nh=72, batch=1, half=True)
    stage = NeckHeadStage(params, weights)
    out = cp.zeros(params.output_shape(1), np.float32)
    with pytest.raises(InputError, match="neck feature 0"):
        stage.launch([cp.asarray(f) for f in feats], out, cp.cuda.Stream())  # float32, expected float16


WGMMA_CASES = {
    "kitti_like": (KITTI_LIKE, 40, 56, 2, 72),
    "odd": (((24, 128, 1), (48, 128, 3)), 18, 27, 3, 13),  # input channels short of a chunk; 16 padded heads
    "one_branch": (((64, 128, 2),), 16, 24, 3, 72),
    "wide_heads": (((16, 128, 1), (32, 128, 2)), 12, 16, 2, 100),  # two head tiles, the second partly padding
}


@pytest.mark.cuda
@pytest.mark.parametrize("case", WGMMA_CASES)
# warps, stages, blocks an SM, persistent blocks a cell position (0: the SMs'; 1 and 2: several tiles a warpgroup)
@pytest.mark.parametrize("shape", [(8, 3, 1, 0), (4, 2, 2, 1), (8, 2, 1, 2), (12, 2, 1, 1)],
                         ids=["w8s3", "w4s2p1", "w8s2p2", "w12s2p1"])
def test_wgmma_kernel_matches_float64_reference_and_is_batch_invariant(cp, case, shape):
    from dataclasses import replace

    from pointpillars_trt.kernels.neck_head import NeckHeadStage

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma kernel runs on compute capability 9.0 (H100, H200)")
    branches, hy, hx, batch, nh = WGMMA_CASES[case]
    params, weights, feats = make_case(branches, hy, hx, nh=nh, batch=batch, half=True, seed=5)
    params = replace(params, wgmma=True, warps=shape[0], stages=shape[1], min_blocks=shape[2],
                     blocks_per_position=shape[3])
    stage = NeckHeadStage(params, weights)
    got = run_half(cp, stage, params, feats)
    assert np.isfinite(got).all(), "every output pixel is written"
    ref = reference(weights, feats, round_u_half=True)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= 2e-3, f"max error {err:.2e} of max|ref|"
    last = run_half(cp, stage, params, [f[-1:] for f in feats])
    assert last.tobytes() == got[-1:].tobytes(), "a frame's heads do not depend on its batch"


def run_half(cp, stage, params: NeckHeadParams, frames) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``stage`` on float16 copies of ``frames`` (NHWC features), on a stream of its own; the heads."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # inputs and NaN fill in the launch's stream order
        out = cp.full(params.output_shape(frames[0].shape[0]), np.nan, np.float32)
        d_frames = [cp.asarray(f.astype(np.float16)) for f in frames]
    stage.launch(d_frames, out, stream)
    stream.synchronize()
    return cp.asnumpy(out)


@pytest.mark.cuda
def test_the_wgmma_cubin_is_kept_loaded_without_nvrtc_and_compiled_again_when_damaged(cp, tmp_path, monkeypatch):
    """The sm_90a module's cubin lands in the user cache; a later process (here: the module cache cleared)
    loads it without NVRTC, whose compile puts its own SIGINT / SIGTERM handlers in Python's place, and
    gets the same heads; a damaged file is compiled again and replaced. After a compile Python's handlers
    are as Python set them (NVRTC put them back with SA_RESTART)."""
    from dataclasses import replace

    from cupy_backends.cuda.libs import nvrtc

    import signal_actions
    from pointpillars_trt.kernels import _launch
    from pointpillars_trt.kernels.neck_head import NeckHeadStage

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma kernel runs on compute capability 9.0 (H100, H200)")
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path))
    branches, hy, hx, batch, nh = WGMMA_CASES["kitti_like"]
    params, weights, feats = make_case(branches, hy, hx, nh=nh, batch=batch, half=True, seed=6)
    params = replace(params, wgmma=True, warps=8, stages=3, min_blocks=1, blocks_per_position=0)
    _launch._arch_module.cache_clear()
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a Python handler for both, as in the CLI
    try:
        python_own = [signal_actions.action(signum) for signum in (signal.SIGINT, signal.SIGTERM)]
        compiled = run_half(cp, NeckHeadStage(params, weights), params, feats)
        assert [signal_actions.action(signum) for signum in (signal.SIGINT, signal.SIGTERM)] == python_own
    finally:
        signal.signal(signal.SIGTERM, previous)
    (kept,) = (tmp_path / "kernels").glob("neck_head_wgmma-sm_90a-*.cubin")
    cubin = kept.read_bytes()  # digest and cubin

    compile_program = nvrtc.compileProgram
    monkeypatch.setattr(nvrtc, "compileProgram", lambda *_: pytest.fail("NVRTC ran although the cubin was kept"))
    _launch._arch_module.cache_clear()
    loaded = run_half(cp, NeckHeadStage(params, weights), params, feats)
    assert loaded.tobytes() == compiled.tobytes()

    monkeypatch.setattr(nvrtc, "compileProgram", compile_program)
    cut = cubin[: len(cubin) // 2]  # its digest tells it, before the driver reads it
    for damage in (lambda: kept.write_bytes(cut), lambda: _launch.write_cubin(kept, b"not a cubin")):  # then: the driver
        damage()
        _launch._arch_module.cache_clear()
        again = run_half(cp, NeckHeadStage(params, weights), params, feats)
        assert again.tobytes() == compiled.tobytes() and kept.read_bytes() == cubin
