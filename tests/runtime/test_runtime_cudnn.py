"""cuDNN frontend RPN engine: options, plan-cache keys, weight re-layout and reading (CPU), and (marked
`cuda`) the engine on the tiny and KITTI-size models against a float64 NumPy RPN, batching, CUDA
graph capture and the plan cache."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pointpillars_trt.config import load_config
from pointpillars_trt.errors import BackendError
from pointpillars_trt.runtime.cudnn import (CudnnOptions, channels_first, conv_filter, cudnn_unavailable_reason,
                                            layout_strides, plan_cache_key, plan_cache_name, read_rpn_weights,
                                            rpn_conv_layers)
from rpn_numpy import conv3x3, engine_canvas, initializers, random_canvas_nhwc, rel_err, rpn_reference, run_engine
from tiny import tiny_model_dir

# -- CPU ------------------------------------------------------------------------------------------


def test_options_defaults_and_validation(tmp_path):
    opt = CudnnOptions(plan_cache_dir=str(tmp_path))
    assert (opt.precision, opt.autotune, opt.max_batch, opt.device_id) == ("fp16", True, 8, 0)
    assert opt.plan_cache_dir == tmp_path and opt.dtype == np.float16
    assert CudnnOptions(precision="tf32").dtype == np.float32
    for bad, match in [(dict(precision="fp8"), "precision"), (dict(precision="int8"), "precision"),
                       (dict(device_id=-1), "device_id"), (dict(device_id=True), "device_id"),
                       (dict(max_batch=0), "max_batch"), (dict(max_batch=2.0), "max_batch"),
                       (dict(autotune="yes"), "autotune"), (dict(config_digest=""), "config_digest"),
                       (dict(plan_cache_dir=3), "plan_cache_dir")]:
        with pytest.raises(BackendError, match=match):
            CudnnOptions(**bad)


def test_plan_cache_goes_to_the_user_cache_never_the_model_dir(tmp_path, monkeypatch):
    """The engine gets its config and writes nowhere in the model dir: the default plan cache is
    $POINTPILLARS_TRT_CACHE/cudnn (else ~/.cache/pointpillars-trt/cudnn); opened without a config it is refused."""
    from pointpillars_trt.runtime import open_engine
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_model_dir(tmp_path / "m", seed=2)
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    assert CudnnEngine(md.rpn_path, md.cfg).plan_cache_dir == tmp_path / "cache" / "cudnn"
    monkeypatch.delenv("POINTPILLARS_TRT_CACHE")
    assert CudnnEngine(md.rpn_path, md.cfg).plan_cache_dir == Path.home() / ".cache" / "pointpillars-trt" / "cudnn"
    assert CudnnEngine(md.rpn_path, md.cfg, CudnnOptions(plan_cache_dir=tmp_path / "p")).plan_cache_dir == tmp_path / "p"
    with pytest.raises(BackendError, match="rpn.onnx: the cuDNN engine builds the RPN from the model config"):
        open_engine(md.rpn_path, CudnnOptions(), device="cuda")


def test_unavailable_reason_names_what_is_missing():
    reason = cudnn_unavailable_reason()
    try:
        import cudnn  # noqa: F401
        import cupy  # noqa: F401
    except ImportError:
        assert reason is not None and ("not installed" in reason) and "pip install" in reason
    else:
        assert reason is None or isinstance(reason, str)


def test_plan_cache_key_changes_with_every_component():
    base = dict(cudnn_version=91900, frontend_version="1.16.0", gpu_name="NVIDIA H200", compute_capability="9.0",
                config_digest="abc123", precision="fp16", batch=1)
    key = plan_cache_key(**base)
    assert key == {"format": 8, "cudnn": 91900, "frontend": "1.16.0", "gpu": "NVIDIA H200", "compute_capability": "9.0",
                   "config_digest": "abc123", "precision": "fp16", "batch": 1}
    name = plan_cache_name(key)
    assert name.startswith("rpn_fp16_b1_") and name.endswith(".json") and name == plan_cache_name(dict(key))
    changed = dict(cudnn_version=91000, frontend_version="1.17.0", gpu_name="NVIDIA H100", compute_capability="8.9",
                   config_digest="abc124", precision="tf32", batch=2)
    names = {name}
    for field, value in changed.items():
        names.add(plan_cache_name(plan_cache_key(**{**base, field: value})))
    assert len(names) == 1 + len(changed)


def test_conv_layers_of_kitti():
    layers = rpn_conv_layers(load_config("openpcdet_kitti_3class"))
    assert len(layers) == 16
    assert [l.stride for l in layers if l.index == 0] == [2, 2, 2]
    assert layers[0].in_hw == (496, 432) and layers[-1].out_hw == (62, 54)
    assert len({l.shape_key for l in layers}) == 6


def test_conv_layers_refuse_branches_off_the_head_map():
    import dataclasses

    cfg = load_config("openpcdet_kitti_3class")
    bad = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, upsample_strides=(1, 2, 2)))
    with pytest.raises(BackendError, match="block2: output 62 x 54 upsampled by 2"):
        rpn_conv_layers(bad)


def test_only_ieee_fp32_single_head_engines_are_channel_major():
    kitti, nuscenes = load_config("openpcdet_kitti_3class"), load_config("openpcdet_nuscenes_multihead")
    assert [channels_first(kitti, p) for p in ("fp16", "tf32", "fp32")] == [False, False, True]
    assert not channels_first(nuscenes, "fp32")  # its neck and head kernels read NHWC


@pytest.mark.parametrize("nchw", [False, True])
def test_filter_layout_computes_the_same_conv(nchw):
    """The filter as the engine uploads it, indexed by the strides it declares to cuDNN (KRSC for NHWC
    convs, KCRS for NCHW ones), gives the OIHW (im2col) conv."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 9, 5))
    w = rng.standard_normal((4, 5, 3, 3))
    b = rng.standard_normal(4)
    filt = conv_filter(w, nchw)
    assert filt.shape == ((4, 5, 3, 3) if nchw else (4, 3, 3, 5)) and filt.flags.c_contiguous
    flat = filt.ravel()
    sk, sc, sr, ss = layout_strides(5, 3, 3, nchw)  # cuDNN's (K, C, R, S) dims: K items of (C, R, S)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    for stride in (1, 2):
        want = conv3x3(x, w, b, stride)
        got = np.zeros_like(want)
        for k in range(4):
            for r in range(3):
                for s in range(3):
                    for c in range(5):
                        tap = flat[k * sk + c * sc + r * sr + s * ss]
                        got[..., k] += tap * xp[:, r: r + stride * (want.shape[1] - 1) + 1: stride,
                                                s: s + stride * (want.shape[2] - 1) + 1: stride, c]
            got[..., k] += b[k]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_read_weights_from_model_dir_split_and_merged_heads(tmp_path, precision):
    md = tiny_model_dir(tmp_path / "m", precision=precision)
    raw = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(md.rpn_path)).graph.initializer}
    assert raw["block0.conv0.weight"].dtype == (np.float16 if precision == "fp16" else np.float32)
    body = {k: v for k, v in raw.items() if not k.startswith("head.")}
    if "head.weight" in raw:
        merged_w, merged_b = raw["head.weight"], raw["head.bias"]
    else:
        merged_w = np.concatenate([raw[f"head.{n}.weight"] for n in ("cls", "box", "dir")])
        merged_b = np.concatenate([raw[f"head.{n}.bias"] for n in ("cls", "box", "dir")])
    assert merged_w.shape == (72, 48, 1, 1)
    merged = {**body, "head.weight": merged_w, "head.bias": merged_b}
    split, lo = dict(body), 0
    for name, c in md.cfg.head_channels.items():  # cls 18 | box 42 | dir 12
        split[f"head.{name}.weight"], split[f"head.{name}.bias"] = merged_w[lo: lo + c], merged_b[lo: lo + c]
        lo += c
    w = read_rpn_weights(merged, md.cfg)
    assert len(w.convs) == len(rpn_conv_layers(md.cfg)) and w.head_weight.shape == (72, 48)
    np.testing.assert_array_equal(w.head_weight, merged_w[:, :, 0, 0].astype(np.float32))
    w2 = read_rpn_weights(split, md.cfg)
    np.testing.assert_array_equal(w2.head_weight, w.head_weight)
    np.testing.assert_array_equal(w2.head_bias, w.head_bias)
    del merged["deblock1.bias"]
    with pytest.raises(BackendError, match="deblock1.bias is missing"):
        read_rpn_weights(merged, md.cfg)
    merged["deblock1.bias"] = np.zeros(3, np.float32)
    with pytest.raises(BackendError, match=r"Initializer: deblock1.bias \| Received shape: \(3,\)"):
        read_rpn_weights(merged, md.cfg)


def test_activate_without_cudnn_names_the_reason(tmp_path):
    reason = cudnn_unavailable_reason()
    if reason is None:
        pytest.skip("cuDNN is usable here")
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_model_dir(tmp_path / "m")
    with pytest.raises(BackendError, match="cuDNN engine unavailable"):
        CudnnEngine(md.rpn_path, md.cfg).activate()


# -- GPU ------------------------------------------------------------------------------------------


def _gpu():
    reason = cudnn_unavailable_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    return cupy


TOL = {"fp16": 3e-3, "tf32": 5e-3, "fp32": 1e-5}  # of max|ref|; TF32 rounds inputs to 10 mantissa bits, like fp16


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cudnn_tiny")
    return {p: tiny_model_dir(root / p, precision=p) for p in ("fp16", "fp32")}


def quick(tmp_path: Path, **kw) -> CudnnOptions:
    """Tests of numbers, not of tuning: the heuristic's first plan (the plan-cache test tunes)."""
    return CudnnOptions(plan_cache_dir=tmp_path, autotune=False, **kw)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp16", "tf32", "fp32"])
def test_tiny_engine_matches_float64_rpn(tiny_dirs, tmp_path, precision):
    _gpu()
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_dirs["fp16" if precision == "fp16" else "fp32"]
    canvas = random_canvas_nhwc(md.cfg, 2, seed=1)
    if precision == "fp16":
        canvas = canvas.astype(np.float16).astype(np.float32)
    with CudnnEngine(md.rpn_path, md.cfg, quick(tmp_path, precision=precision)) as eng:
        assert eng.inputs["canvas"].shape == ((-1, 16, 24, 32) if precision == "fp32" else (-1, 24, 32, 16))
        assert eng.outputs["heads"].shape == (-1, 12, 16, 72) and eng.outputs["heads"].dtype == np.float32
        got = run_engine(eng, canvas)
    ref = rpn_reference(initializers(md.rpn_path), md.cfg, canvas)
    assert np.isfinite(got).all()
    err = rel_err(got, ref)
    print(f"tiny {precision}: max error {err:.2e} of max|ref| {np.abs(ref).max():.3g}")
    assert err <= TOL[precision]


OPEN_AND_DETECT = textwrap.dedent("""
    import sys
    import numpy as np
    if sys.argv[2] == "torch first":
        import torch
    from pointpillars_trt import PointPillars
    detector = PointPillars.from_model_dir(sys.argv[1], device="cuda", backend="cudnn", score_threshold=0.0)
    lo, hi = np.split(np.asarray(detector.cfg.voxel.point_range, np.float32), 2)
    rng = np.random.default_rng(5)
    points = np.column_stack([rng.uniform(lo, hi, (3000, 3)), rng.uniform(0, 1, (3000, 1))]).astype(np.float32)
    found = detector(points)
    np.savez(sys.argv[3], boxes=found.boxes, scores=found.scores)
    print(sorted(name for name in ("torch", "scipy") if name in sys.modules))
""")


@pytest.mark.cuda
def test_the_engine_opens_without_torch_or_scipy_and_detects_the_same_with_torch_imported_first(tiny_dirs, tmp_path):
    """The frontend's import pulls in PyTorch (and ``import cupyx`` SciPy) where installed: seconds at every
    process start. A process that opens the engine imports neither; one that imported torch itself keeps it,
    and the frontend works the same there (within rounding: torch may bring a cuDNN build of its own)."""
    _gpu()
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed here: the frontend has nothing to pull in")
    modules, found = {}, {}
    for mode in ("plain", "torch first"):
        out = tmp_path / f"{mode.replace(' ', '_')}.npz"
        done = subprocess.run([sys.executable, "-c", OPEN_AND_DETECT, str(tiny_dirs["fp16"].path), mode, str(out)],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "POINTPILLARS_TRT_CACHE": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr[-3000:]
        modules[mode] = done.stdout.splitlines()[-1]
        found[mode] = np.load(out)
    print(modules, {mode: len(f["scores"]) for mode, f in found.items()})
    assert modules["plain"] == "[]"
    assert "'torch'" in modules["torch first"]
    plain, first = found["plain"], found["torch first"]
    assert len(plain["scores"]) > 0 and plain["boxes"].shape == first["boxes"].shape
    np.testing.assert_allclose(first["boxes"], plain["boxes"], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(first["scores"], plain["scores"], rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
def test_batch_equals_single_frames_and_graph_replay(tiny_dirs, tmp_path):
    cp = _gpu()
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_dirs["fp16"]
    canvas = random_canvas_nhwc(md.cfg, 4, seed=2)
    with CudnnEngine(md.rpn_path, md.cfg, quick(tmp_path)) as eng:
        batched = run_engine(eng, canvas)
        singles = np.concatenate([run_engine(eng, canvas[i: i + 1]) for i in range(4)])
        same = np.array_equal(batched, singles)
        print(f"batch 4 vs 4 x batch 1: bitwise equal = {same}, max diff {np.abs(batched - singles).max():.2e}")
        assert rel_err(batched, singles) <= 1e-3  # cuDNN may pick other algorithms per batch
        # Capture run() in a CUDA graph and replay it on new input.
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:  # copies and fills in the runs' stream order (a non-blocking stream skips the null stream)
            d_in = cp.asarray(canvas.astype(np.float16))
            d_out = cp.zeros((4, 12, 16, 72), np.float32)
        eng.bind("canvas", d_in.data.ptr, d_in.shape)
        eng.bind("heads", d_out.data.ptr, d_out.shape)
        eng.run(stream.ptr)  # warm
        stream.synchronize()
        stream.begin_capture()
        eng.run(stream.ptr)
        graph = stream.end_capture()
        with stream:
            d_out.fill(np.nan)
            graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(d_out), batched)
        second = random_canvas_nhwc(md.cfg, 4, seed=3)
        with stream:
            d_in.set(second.astype(np.float16))
            graph.launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(d_out), run_engine(eng, second))


@pytest.mark.cuda
def test_switching_between_prepared_batch_sizes_never_synchronises_the_device(tiny_dirs, tmp_path, monkeypatch):
    # an eager pipeline re-binds at every change of batch size (a run's last, partial batch); a device-wide
    # synchronisation there would stall every other pipeline on the GPU
    cp = _gpu()
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_dirs["fp16"]
    frames = {b: random_canvas_nhwc(md.cfg, b, seed=b) for b in (1, 3)}
    with CudnnEngine(md.rpn_path, md.cfg, quick(tmp_path)) as eng:
        first = {b: run_engine(eng, canvas) for b, canvas in frames.items()}  # each size prepared once
        calls = []
        real = cp.cuda.runtime.deviceSynchronize
        monkeypatch.setattr(cp.cuda.runtime, "deviceSynchronize", lambda: (calls.append(1), real())[1])
        for b in (1, 3, 1, 3):
            np.testing.assert_array_equal(run_engine(eng, frames[b]), first[b])
        assert calls == []
        run_engine(eng, random_canvas_nhwc(md.cfg, 2, seed=2))  # a new size: its plans and memory
        assert calls


@pytest.mark.cuda
def test_a_batch_that_cannot_be_prepared_leaves_the_bindings_before_it_working(tiny_dirs, tmp_path, monkeypatch):
    """A larger batch whose preparation fails (out of device memory) left the engine holding one tensor's new batch
    while the binding cache held the other's old one: binding the old batch again skipped that tensor, and the run
    was refused as "canvas has batch 1, but heads has batch 2". Every tensor is bound anew after a failed bind."""
    cp = _gpu()
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_dirs["fp16"]
    canvas = random_canvas_nhwc(md.cfg, 2, seed=5)
    with CudnnEngine(md.rpn_path, md.cfg, quick(tmp_path)) as eng:
        alone = run_engine(eng, canvas[:1])
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            d_in = cp.asarray(engine_canvas(eng, canvas))
            d_out = cp.full((2, *eng.outputs["heads"].shape[1:]), np.nan, np.float32)
        stream.synchronize()

        def no_room(batch: int) -> None:
            raise cp.cuda.memory.OutOfMemoryError(1 << 30, 0, 0)

        monkeypatch.setattr(eng, "_plans_for", no_room)
        eng.bind("canvas", d_in.data.ptr, d_in.shape)
        with pytest.raises(BackendError, match="while preparing batch 2"):
            eng.bind("heads", d_out.data.ptr, d_out.shape)
        monkeypatch.undo()
        eng.bind("canvas", d_in.data.ptr, (1, *d_in.shape[1:]))
        eng.bind("heads", d_out.data.ptr, (1, *d_out.shape[1:]))
        eng.run(stream.ptr)
        stream.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(d_out[:1]), alone)


@pytest.mark.cuda
def test_errors_name_the_tensor(tiny_dirs, tmp_path):
    cp = _gpu()
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_dirs["fp16"]
    with CudnnEngine(md.rpn_path, md.cfg, quick(tmp_path, max_batch=2)) as eng:
        buf = cp.zeros((3, 24, 32, 16), np.float16)
        with pytest.raises(BackendError, match=r"Input tensor: canvas \| Received batch 3.*max_batch = 2"):
            eng.bind("canvas", buf.data.ptr, buf.shape)
        with pytest.raises(BackendError, match=r"Input tensor: canvas \| Received incompatible shape"):
            eng.bind("canvas", buf.data.ptr, (1, 24, 32, 8))
        out = cp.zeros((2, 12, 16, 72), np.float32)
        eng.bind("canvas", buf.data.ptr, (1, 24, 32, 16))
        eng.bind("heads", out.data.ptr, out.shape)
        with pytest.raises(BackendError, match="Received batch 1, but heads has batch 2"):
            eng.run(cp.cuda.Stream().ptr)
    with pytest.raises(BackendError, match="config digest"):
        CudnnEngine(md.rpn_path, md.cfg, CudnnOptions(config_digest="0" * 16)).activate()


@pytest.mark.cuda
def test_second_start_uses_the_plan_cache(tiny_dirs, tmp_path):
    _gpu()
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    md = tiny_dirs["fp16"]
    canvas = random_canvas_nhwc(md.cfg, 1, seed=4)
    opts = CudnnOptions(plan_cache_dir=tmp_path / "plans")
    t0 = time.perf_counter()
    with CudnnEngine(md.rpn_path, md.cfg, opts) as eng:
        first = run_engine(eng, canvas)
        assert eng.build_log[-1]["plans"].startswith("built")
        path = eng.plan_cache_dir / plan_cache_name(eng.plan_cache_key(1))
    t1 = time.perf_counter()
    assert path.is_file()
    with CudnnEngine(md.rpn_path, md.cfg, opts) as eng:
        second = run_engine(eng, canvas)
        assert eng.build_log[-1]["plans"] == "cache"
    t2 = time.perf_counter()
    print(f"tiny start + first run: {t1 - t0:.2f} s without cache, {t2 - t1:.2f} s with it")
    np.testing.assert_array_equal(first, second)
    path.write_text("{ not json")
    with CudnnEngine(md.rpn_path, md.cfg, opts) as eng:
        np.testing.assert_array_equal(run_engine(eng, canvas), first)
        assert eng.build_log[-1]["plans"].startswith("built")
    assert "key" in path.read_text()  # rewritten


@pytest.mark.cuda
def test_a_graph_swapped_between_two_gpu_opens_in_one_process_is_refused_naming_it(tmp_path, monkeypatch):
    """A second open of a model dir in one process reads no graph (the first checked the files), so the GPU pipeline
    reads its graphs itself: one swapped meanwhile is refused, not read into the cuDNN engine's RPN weights or the PFN
    kernel's as it lies."""
    _gpu()
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.errors import ModelDirError
    from pointpillars_trt.model_dir import load_model_dir

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))  # the engine's plan cache
    folder = tmp_path / "a"
    tiny_model_dir(folder, seed=0)
    other = tiny_model_dir(tmp_path / "b", seed=1)
    PointPillars(load_model_dir(folder), device="cuda", backend="cudnn").close()
    for graph in ("rpn", "pfn"):
        model = load_model_dir(folder)
        path = model.onnx_path(graph)
        original = path.read_bytes()
        path.write_bytes(other.onnx_path(graph).read_bytes())  # same inputs and outputs, other weights
        with pytest.raises(ModelDirError, match=f"{graph}.onnx': replaced since its model dir was opened"):
            PointPillars(model, device="cuda", backend="cudnn")
        path.write_bytes(original)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp16", "tf32", "fp32"])
def test_kitti_size_engine_matches_float64_rpn(tmp_path_factory, precision):
    _gpu()
    from pointpillars_trt.convert.export import export_model_dir
    from pointpillars_trt.convert.weights import random_weights
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    cfg = load_config("openpcdet_kitti_3class")
    root = tmp_path_factory.mktemp(f"kitti_{precision}")
    md = export_model_dir(random_weights(cfg, 0), cfg, root / "m", precision="fp16" if precision == "fp16" else "fp32",
                          source={"random_seed": 0})
    canvas = random_canvas_nhwc(cfg, 1, seed=5)
    if precision == "fp16":
        canvas = canvas.astype(np.float16).astype(np.float32)
    with CudnnEngine(md.rpn_path, cfg, quick(root / "plans", precision=precision)) as eng:
        got = run_engine(eng, canvas)
    ref = rpn_reference(initializers(md.rpn_path), cfg, canvas)
    err = rel_err(got, ref)
    print(f"KITTI {precision}: max error {err:.2e} of max|ref| {np.abs(ref).max():.3g}")
    assert err <= TOL[precision]


@pytest.mark.cuda
def test_tuning_gives_its_temporaries_back_to_the_device(tmp_path):
    """Tuning a batch at KITTI size (candidates timed, each checked against batch 1 on random frames)
    allocates hundreds of MiB of inputs and outputs; once the plans are chosen, none of it stays cached
    in CuPy's pool (a batch of 8 held 1.3 GiB more after a first start than after a cached one)."""
    cp = _gpu()
    from pointpillars_trt.convert.export import export_model_dir
    from pointpillars_trt.convert.weights import random_weights
    from pointpillars_trt.runtime.cudnn import CudnnEngine

    cfg = load_config("openpcdet_kitti_3class")
    md = export_model_dir(random_weights(cfg, 0), cfg, tmp_path / "m", precision="fp16", source={"random_seed": 0})
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    with CudnnEngine(md.rpn_path, cfg, CudnnOptions(plan_cache_dir=tmp_path / "plans", max_batch=2)) as eng:
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:  # held through the measurement: only what tuning let go is cached and unused
            canvas = cp.asarray(random_canvas_nhwc(cfg, 2, seed=6).astype(np.float16))
            heads = cp.zeros((2, *eng.outputs["heads"].shape[1:]), np.float32)
        eng.bind("canvas", canvas.data.ptr, canvas.shape)
        eng.bind("heads", heads.data.ptr, heads.shape)
        eng.run(stream.ptr)
        stream.synchronize()
        assert eng.build_log[-1]["plans"].startswith("built") and bool(cp.isfinite(heads).all())
        cached_free = pool.total_bytes() - pool.used_bytes()
    print(f"CuPy pool after tuning batch 2: {cached_free / 2**20:.1f} MiB cached and unused")
    assert cached_free < 64 * 2**20  # the first conv's random float32 input alone is 105 MiB at batch 2


def test_a_hostile_plan_cache_file_means_a_rebuild_not_a_hang_or_a_crash(tmp_path: Path) -> None:
    """A FIFO, /dev/zero, a sparse huge file, deep JSON and junk each read as 'no cache' (the plans are
    then rebuilt), at once; a good file for the same key gives its entries back."""
    import json
    import os

    from pointpillars_trt.runtime.cudnn import _read_cache

    key = {"precision": "fp16", "batch": 1}
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"key": key, "layers": {"conv0": {"plan_index": 0}}}))
    assert _read_cache(good, key) == {"conv0": {"plan_index": 0}}
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate(8 * 2**30)
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (tmp_path / "junk.json").write_bytes(b"\xff\xfe not json")
    start = time.monotonic()
    for name in ("fifo", "zero", "huge", "deep", "junk"):
        assert _read_cache(tmp_path / f"{name}.json", key) == {}, name
    assert time.monotonic() - start < 5
