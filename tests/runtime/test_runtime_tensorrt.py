"""TensorRT engine and builder. Tests marked `tensorrt` build plans from tiny ONNX graphs, run them
on CuPy buffers and compare with ONNX Runtime on the CPU: they need a TensorRT library that runs on this
GPU (TensorRT, or TensorRT for RTX on an RTX GPU); those that only build run wherever a plan builds, TensorRT for
RTX needing no GPU. The metadata checks also run without TensorRT; the other builds of TensorRT for RTX are in
test_tensorrt_rtx_build.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import BackendError, ModelDirError
from pointpillars_trt.runtime import OrtOptions, TrtOptions, open_engine
from pointpillars_trt.runtime.tensorrt import (
    REBUILD_HINT,
    check_plan_metadata,
    gpu_identity,
    plan_metadata_path,
    read_plan,
    trt,
)
from pointpillars_trt.runtime.tensorrt_build import build_plan
from pointpillars_trt.runtime.tensorrt_library import RTX_DEFAULT_TARGETS, installed_library, library_unsupported_reason
from notices import first_build
from tiny_graphs import cuda_skip_reason, head_graph, pfn_graph, pfn_reference

RNG = np.random.default_rng(11)
PROFILE = (1, 96, 128)
DIGEST = "0123456789abcdef"
GPU_TOL = {"rtol": 2e-3, "atol": 2e-3}  # TF32 is on by default in fp32 plans
FP16_TOL = {"rtol": 3e-2, "atol": 3e-2}


def tensorrt_skip_reason() -> str | None:
    library = installed_library()
    if library is None:
        return "TensorRT is not installed"
    reason = cuda_skip_reason()
    if reason is None:
        reason = library_unsupported_reason(library, gpu_identity(0)[1])
    return reason


TRT_SKIP = tensorrt_skip_reason()
needs_tensorrt = pytest.mark.skipif(TRT_SKIP is not None, reason=str(TRT_SKIP))
#: Building needs less: TensorRT for RTX builds plans without a GPU (for its portable set, unless it runs here).
BUILD_SKIP = None if installed_library() == "tensorrt_rtx" else TRT_SKIP
needs_builder = pytest.mark.skipif(BUILD_SKIP is not None, reason=str(BUILD_SKIP))


def pillars(p: int) -> np.ndarray:
    return RNG.standard_normal((p, 8, 6)).astype(np.float32)


# -- metadata (no TensorRT needed) ----------------------------------------------------------------

GOOD = {
    "plan_sha256": "aa" * 32,
    "library": "tensorrt",
    "library_version": "10.13.0.35",
    "compute_capabilities": ["9.0"],
    "config_digest": DIGEST,
}
RUNNING = {"plan_sha256": "aa" * 32, "library": "tensorrt", "library_version": "10.13.0.35", "compute_capability": "9.0"}


def check(metadata: dict, expected_digest: str | None = DIGEST, **running) -> None:
    check_plan_metadata(metadata, **{**RUNNING, **running}, expected_digest=expected_digest, plan_name="rpn.plan")


def test_matching_metadata_passes():
    check(GOOD)
    check({**GOOD, "config_digest": None}, expected_digest=None)  # no digest asked for, none checked
    rtx = {**GOOD, "library": "tensorrt_rtx", "library_version": "1.7.1.116", "compute_capabilities": ["8.6", "8.9"]}
    check(rtx, library="tensorrt_rtx", library_version="1.7.1.116", compute_capability="8.9")  # any listed GPU


@pytest.mark.parametrize(
    "key, value, what",
    [
        ("plan_sha256", "bb" * 32, "plan checksum"),
        ("library", "tensorrt_rtx", "library: built for 'tensorrt_rtx', running 'tensorrt'"),
        ("library_version", "10.0.1.6", "library version: built for '10.0.1.6', running '10.13.0.35'"),
        ("compute_capabilities", ["8.6", "8.9", "12.0"],
         "GPU compute capability: built for ['8.6', '8.9', '12.0'], running '9.0'"),
        ("config_digest", "ffffffffffffffff", "config digest: built for 'ffffffffffffffff', running '0123456789abcdef'"),
    ],
)
def test_each_mismatch_is_named_with_the_rebuild_command(key, value, what):
    with pytest.raises(ModelDirError) as info:
        check({**GOOD, key: value})
    message = str(info.value)
    assert message.startswith("rpn.plan does not match this setup")
    assert what in message
    assert message.endswith(f"Note: {REBUILD_HINT}")
    assert "rebuild with `pointpillars-trt build --backend tensorrt`" in message


@pytest.mark.parametrize("recorded, precision, tf32, what", [
    ({"precision": "fp16", "tf32": True}, "fp32", True, "precision: built for 'fp16', requested 'fp32'"),
    ({"precision": "fp32", "tf32": True}, "fp32", False, "tf32: built for True, requested False"),
    ({"precision": "fp32", "tf32": False}, "fp32", True, "tf32: built for False, requested True"),
])
def test_a_plan_built_for_another_precision_or_tf32_mode_is_refused(recorded, precision, tf32, what):
    metadata = {**GOOD, **recorded}
    check_plan_metadata(metadata, **RUNNING, expected_precision=recorded["precision"], expected_tf32=recorded["tf32"])
    with pytest.raises(ModelDirError) as info:
        check_plan_metadata(metadata, **RUNNING, expected_precision=precision, expected_tf32=tf32, plan_name="rpn.plan")
    assert what in str(info.value) and str(info.value).endswith(f"Note: {REBUILD_HINT}")


@pytest.mark.parametrize("recorded_tf32", [True, False])
@pytest.mark.parametrize("requested_tf32", [True, False])
def test_an_fp16_plan_is_never_refused_for_its_tf32_setting(recorded_tf32: bool, requested_tf32: bool) -> None:
    """TF32 is a setting of fp32 plans: an fp16 plan built with --no-tf32 was refused at every default load
    ("tf32: built for False, requested True"), and the rebuild the message advised built the same plan."""
    metadata = {**GOOD, "precision": "fp16", "tf32": recorded_tf32}
    check_plan_metadata(metadata, **RUNNING, expected_precision="fp16", expected_tf32=requested_tf32)


def test_a_plan_of_another_graph_than_the_model_dirs_is_refused() -> None:
    """Plans copied in from another build ran other weights than the model dir's ONNX graphs (and its CPU
    path): the plan records the SHA-256 of the graph it was built from, and the model dir's must match."""
    from pointpillars_trt.runtime.backends import EngineRequest, engine_options_for

    metadata = {**GOOD, "onnx_sha256": "aa" * 32}
    check_plan_metadata(metadata, **RUNNING, expected_onnx_sha256="aa" * 32)
    for recorded in (metadata, GOOD):  # another graph's plan, and a plan that records none
        with pytest.raises(ModelDirError, match=r"rpn\.plan does not match this setup \(ONNX graph sha256: built for "
                                                r".*, the model dir holds 'bbbb"):
            check_plan_metadata(recorded, **RUNNING, expected_onnx_sha256="bb" * 32, plan_name="rpn.plan")
    request = EngineRequest(device_id=0, tf32=True, precision="fp16", config_digest="c", graph_sha256="bb" * 32)
    assert engine_options_for("tensorrt", request).onnx_sha256 == "bb" * 32


def test_all_mismatches_are_reported_together():
    with pytest.raises(ModelDirError) as info:
        check({"plan_sha256": "bb" * 32, "tensorrt_version": "10.13.0.35", "compute_capability": "9.0"})  # format 1
    for what in ("plan checksum", "library: built for None", "library version", "GPU compute capability", "config digest"):
        assert what in str(info.value)


def test_metadata_lives_beside_the_plan():
    assert plan_metadata_path("model/rpn.plan") == Path("model/rpn.plan.json")


@pytest.mark.parametrize("metadata, problem", [
    (b"[" * 100_000, "maximum recursion depth exceeded"),
    (b'{"config_digest": ' + b"9" * 5000 + b"}", "an integer of 5000 digits"),
], ids=["nested", "digits"])
def test_plan_metadata_nested_too_deep_or_of_an_overlong_number_is_one_model_dir_error(tmp_path, metadata, problem):
    """A plan's metadata file of JSON nested beyond the parser or of a 5000-digit number: the RecursionError or
    ValueError left read_plan as it was (infer: 'error: an integer of 5000 digits: ...', naming no file)."""
    plan = tmp_path / "rpn.plan"
    plan.write_bytes(b"plan")
    plan_metadata_path(plan).write_bytes(metadata)
    with pytest.raises(ModelDirError) as info:
        read_plan(plan)
    assert str(info.value).startswith(f"Cannot read '{plan_metadata_path(plan)}': ") and problem in str(info.value)
    assert str(info.value).endswith(f". Note: {REBUILD_HINT}")


def test_a_plan_or_its_metadata_is_read_bounded(tmp_path, monkeypatch):
    """Both are read with a size limit, refused by their size before any byte is read (a 20 GB sparse file in a
    plan's place was read whole)."""
    from pointpillars_trt.runtime import tensorrt

    plan = tmp_path / "rpn.plan"
    with open(plan, "wb") as f:
        f.truncate(100)
    plan_metadata_path(plan).write_bytes(b"{}")
    monkeypatch.setattr(tensorrt, "MAX_GRAPH_BYTES", 99)
    with pytest.raises(ModelDirError, match=r"TensorRT plan .*rpn.plan' is 100 bytes, more than the limit of 99 bytes"):
        read_plan(plan)
    monkeypatch.setattr(tensorrt, "MAX_GRAPH_BYTES", 100)
    monkeypatch.setattr(tensorrt, "MAX_METADATA_BYTES", 1)
    with pytest.raises(ModelDirError, match=r"plan metadata .*rpn.plan.json' is 2 bytes, more than the limit of 1 bytes"):
        read_plan(plan)


def test_tensorrt_engines_need_cuda(tmp_path):
    with pytest.raises(BackendError, match="tensorrt runs on cuda only; received device=.cpu.. Note: use OrtOptions"):
        open_engine(tmp_path / "rpn.plan", device="cpu")
    with pytest.raises(BackendError, match="OrtOptions cannot open this file"):
        open_engine(tmp_path / "rpn.plan", OrtOptions())
    with pytest.raises(BackendError, match="TrtOptions cannot open this file"):
        open_engine(tmp_path / "rpn.onnx", TrtOptions())


WITHOUT_TENSORRT = """
import sys
for name in ("tensorrt", "tensorrt_rtx_bindings", "tensorrt_rtx"):  # as if neither library were installed
    sys.modules[name] = None
from pathlib import Path
from pointpillars_trt.errors import BackendError
from pointpillars_trt.runtime import tensorrt_available
from pointpillars_trt.runtime.tensorrt import TensorRTEngine
from pointpillars_trt.runtime.tensorrt_build import build_plan
assert not tensorrt_available()
for attempt in (lambda: build_plan(Path("pfn.onnx"), Path("pfn.plan")), lambda: TensorRTEngine("pfn.plan").activate()):
    try:
        attempt()
    except BackendError as exc:
        print(exc)
"""


def test_without_tensorrt_the_error_says_how_to_install(repo_root):
    """Whatever is installed here: a process where neither library imports says how to install either."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_TENSORRT], capture_output=True, text=True, cwd=repo_root,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("TensorRT is not installed. Note: pip install 'pointpillars-trt[tensorrt]'")
        assert "'pointpillars-trt[tensorrt-rtx]' (TensorRT for RTX: compute capability 7.5/8.6/8.9/12.0/12.1)" in line


# -- with TensorRT and a GPU ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pfn_plan(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], dict]:
    """One PFN-like plan for the module: building takes seconds."""
    folder = tmp_path_factory.mktemp("trt")
    weights = pfn_graph(folder / "pfn.onnx")
    with first_build():
        metadata = build_plan(
            folder / "pfn.onnx",
            folder / "pfn.plan",
            dynamic_rows={"pillars": PROFILE},
            config_digest=DIGEST,
            timing_cache_path=folder / "timing.cache",
        )
    return folder, weights, metadata


def run_on_gpu(cp, engine, feeds: dict[str, np.ndarray], output_shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Bind CuPy copies of ``feeds`` and NaN-filled outputs, run on a fresh stream, return the outputs."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        buffers = {name: cp.asarray(array) for name, array in feeds.items()}
        buffers.update({name: cp.full(shape, np.nan, np.float32) for name, shape in output_shapes.items()})
    for name, array in buffers.items():
        engine.bind(name, array.data.ptr, array.shape)
    engine.run(stream.ptr)
    stream.synchronize()
    return {name: cp.asnumpy(buffers[name]) for name in output_shapes}


@pytest.mark.tensorrt
@needs_tensorrt
def test_plan_matches_onnxruntime_cpu_for_several_pillar_counts(cp, pfn_plan):
    folder, weights, _ = pfn_plan
    with open_engine(folder / "pfn.onnx", device="cpu") as cpu, open_engine(folder / "pfn.plan", TrtOptions(config_digest=DIGEST)) as engine:
        assert engine.inputs["pillars"].shape == (-1, 8, 6)
        assert engine.outputs["pillar_features"].dtype == np.float32
        for p in (100, PROFILE[0], PROFILE[2]):  # rebinding to a new shape within the profile
            x = pillars(p)
            got = run_on_gpu(cp, engine, {"pillars": x}, {"pillar_features": (p, 16)})["pillar_features"]
            np.testing.assert_allclose(got, cpu.run_host({"pillars": x})["pillar_features"], **GPU_TOL)
            np.testing.assert_allclose(got, pfn_reference(x, weights), **GPU_TOL)


@pytest.mark.tensorrt
@needs_builder
def test_build_writes_metadata_and_timing_cache(pfn_plan):
    import hashlib

    folder, _, metadata = pfn_plan
    on_disk = json.loads(plan_metadata_path(folder / "pfn.plan").read_text())
    assert on_disk == metadata
    assert metadata["library"] == installed_library() and metadata["library_version"] == trt.__version__
    # built for the GPU here where the library runs on it (RTX too), else (RTX) for its portable set
    assert metadata["compute_capabilities"] == ([gpu_identity(0)[1]] if TRT_SKIP is None else list(RTX_DEFAULT_TARGETS))
    assert metadata["config_digest"] == DIGEST
    assert metadata["plan_sha256"] == hashlib.sha256((folder / "pfn.plan").read_bytes()).hexdigest()
    assert metadata["profile"] == {"pillars": [[1, 8, 6], [96, 8, 6], [128, 8, 6]]}
    assert (folder / "timing.cache").is_file() == (installed_library() == "tensorrt")  # RTX times nothing
    # a second build starts from the saved cache
    build_plan(folder / "pfn.onnx", folder / "again.plan", dynamic_rows={"pillars": PROFILE},
               timing_cache_path=folder / "timing.cache")
    assert (folder / "again.plan").stat().st_size > 0


@pytest.mark.tensorrt
@needs_tensorrt
def test_static_head_plan_matches_onnxruntime_cpu(cp, tmp_path):
    head_graph(tmp_path / "head.onnx")
    with first_build():
        build_plan(tmp_path / "head.onnx", tmp_path / "head.plan")
    canvas = RNG.standard_normal((1, 4, 6, 10)).astype(np.float32)
    with open_engine(tmp_path / "head.onnx", device="cpu") as cpu:
        expected = cpu.run_host({"canvas": canvas})
    with open_engine(tmp_path / "head.plan") as engine:
        got = run_on_gpu(cp, engine, {"canvas": canvas}, {n: a.shape for n, a in expected.items()})
    for name in ("cls", "box"):
        np.testing.assert_allclose(got[name], expected[name], **GPU_TOL)


@pytest.mark.tensorrt
@needs_tensorrt
def test_strongly_typed_plan_keeps_the_graph_precision(cp, tmp_path):
    weights = pfn_graph(tmp_path / "pfn16.onnx", fp16=True)
    with first_build():
        build_plan(tmp_path / "pfn16.onnx", tmp_path / "pfn16.plan", precision="fp16", dynamic_rows={"pillars": PROFILE})
    x = pillars(64)
    with open_engine(tmp_path / "pfn16.plan") as engine:
        got = run_on_gpu(cp, engine, {"pillars": x}, {"pillar_features": (64, 16)})["pillar_features"]
    np.testing.assert_allclose(got, pfn_reference(x.astype(np.float16), weights), **FP16_TOL)


@pytest.mark.tensorrt
@needs_tensorrt
def test_binding_checks_profile_and_output_shape(cp, pfn_plan):
    folder, _, _ = pfn_plan
    with open_engine(folder / "pfn.plan") as engine:
        for rows in (0, PROFILE[2] + 1):
            with pytest.raises(BackendError, match=r"outside the optimization profile .*Expected \(1, 8, 6\) <= shape <= \(128, 8, 6\)"):
                engine.bind("pillars", 0x1000, (rows, 8, 6))
        x = cp.zeros((100, 8, 6), cp.float32)
        y = cp.zeros((99, 16), cp.float32)
        engine.bind("pillars", x.data.ptr, x.shape)
        engine.bind("pillar_features", y.data.ptr, y.shape)
        with pytest.raises(BackendError, match=r"Output tensor: pillar_features \| Received buffer of shape \(99, 16\). Note: Expected \(100, 16\)"):
            engine.run(cp.cuda.Stream(non_blocking=True).ptr)


@pytest.mark.tensorrt
@needs_tensorrt
@pytest.mark.parametrize(
    "damage, message",
    [
        ("library_version", "library version: built for '0.0.0'"),
        ("compute_capabilities", "GPU compute capability: built for ['0.0']"),
        ("digest", "config digest: built for '0123456789abcdef', running 'another'"),
        ("plan", "plan checksum"),
        ("no_metadata", "Metadata of pfn.plan not found"),
    ],
)
def test_stale_plan_asks_for_a_rebuild(tmp_path, pfn_plan, damage, message):
    folder, _, metadata = pfn_plan
    plan, meta_path = tmp_path / "pfn.plan", plan_metadata_path(tmp_path / "pfn.plan")
    shutil.copy(folder / "pfn.plan", plan)
    shutil.copy(plan_metadata_path(folder / "pfn.plan"), meta_path)
    expected_digest = DIGEST
    if damage == "library_version":
        meta_path.write_text(json.dumps({**metadata, "library_version": "0.0.0"}))
    elif damage == "compute_capabilities":
        meta_path.write_text(json.dumps({**metadata, "compute_capabilities": ["0.0"]}))
    elif damage == "digest":
        expected_digest = "another"
    elif damage == "plan":
        data = bytearray(plan.read_bytes())
        data[len(data) // 2] ^= 0xFF
        plan.write_bytes(bytes(data))
    else:
        meta_path.unlink()
    with pytest.raises(ModelDirError, match=message) as info:
        open_engine(plan, TrtOptions(config_digest=expected_digest))
    assert REBUILD_HINT in str(info.value)


@pytest.mark.tensorrt
@needs_tensorrt
def test_a_plan_checked_as_the_cache_serves_it_is_read_once_as_its_engine_opens(pfn_plan, monkeypatch):
    """A model cache entry's plan is checked as the cache serves it (``check_plan_file``: read and hashed), then
    opened: the engine read and hashed it again. It takes the bytes the check found whole, handed to it; a second
    engine of the plan, handed none, reads it itself."""
    from pointpillars_trt.runtime import tensorrt

    folder, _, _ = pfn_plan
    reads: list[str] = []
    real = tensorrt.read_regular_file
    monkeypatch.setattr(tensorrt, "read_regular_file",
                        lambda path, **kw: (reads.append(Path(path).name), real(path, **kw))[1])
    checked = tensorrt.check_plan_file(folder / "pfn.plan")
    with open_engine(folder / "pfn.plan", TrtOptions(config_digest=DIGEST), checked=checked) as engine:
        assert engine.inputs["pillars"].shape == (-1, 8, 6) and reads.count("pfn.plan") == 1
    with open_engine(folder / "pfn.plan", TrtOptions(config_digest=DIGEST)):
        assert reads.count("pfn.plan") == 2


@pytest.mark.tensorrt
@needs_builder
def test_build_errors_are_explained(tmp_path, pfn_plan):
    folder, _, _ = pfn_plan
    with pytest.raises(BackendError, match=r"Expected exactly the dynamic inputs \['pillars'\]"):
        build_plan(folder / "pfn.onnx", tmp_path / "x.plan")
    with pytest.raises(BackendError, match=r"Expected 0 < min <= opt <= max"):
        build_plan(folder / "pfn.onnx", tmp_path / "x.plan", dynamic_rows={"pillars": (10, 5, 20)})
    (tmp_path / "bad.onnx").write_bytes(b"not an onnx graph" * 8)
    with pytest.raises(BackendError, match="TensorRT could not parse"):
        build_plan(tmp_path / "bad.onnx", tmp_path / "x.plan")
    with pytest.raises(ModelDirError, match="ONNX graph not found"):
        build_plan(tmp_path / "absent.onnx", tmp_path / "x.plan")
    assert not (tmp_path / "x.plan").exists()
