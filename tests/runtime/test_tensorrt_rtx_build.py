"""TensorRT for RTX builds real plans on any machine (its builder needs no GPU): the RPN graph of every export
builds (the only plan a model dir gets), the plan metadata round-trips, wrong metadata is refused, and the builder touches no API
that TensorRT 11 removed. Running the plans needs an RTX GPU (test_runtime_tensorrt.py); on a GPU that
TensorRT for RTX does not run on, the refusal is one line (the `cuda` test at the end)."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from importlib import metadata as dist_metadata
from pathlib import Path

import numpy as np
import onnx
import pytest

from pointpillars_trt.errors import BackendError, LibraryNotice, ModelDirError
from pointpillars_trt.runtime import tensorrt as trt_runtime
from pointpillars_trt.runtime import tensorrt_build
from pointpillars_trt.runtime.availability import gpu_visible
from pointpillars_trt.runtime.tensorrt import REBUILD_HINT, check_plan_metadata, plan_metadata_path, read_plan
from pointpillars_trt.runtime.tensorrt_library import (RTX_COMPUTE_CAPABILITIES, RTX_DEFAULT_TARGETS, api_major,
                                                      import_failure_fix, installed_library,
                                                      library_unsupported_reason,
                                                      rtx_default_targets, unsupported_gpu_refusal)
from notices import first_build, published_config_notice
from tiny_graphs import cuda_skip_reason, pfn_graph

RTX_SKIP = (None if installed_library() == "tensorrt_rtx" else
            "the tensorrt backend does not use TensorRT for RTX here (pip install 'pointpillars-trt[tensorrt-rtx]' "
            "without TensorRT)")
needs_rtx = pytest.mark.skipif(RTX_SKIP is not None, reason=str(RTX_SKIP))
CHECKPOINTS = {"openpcdet": "pointpillar_openpcdet_synthetic.pth", "zhulf0804": "pointpillars_zhulf0804_synthetic.pth"}
DIGEST = "0123456789abcdef"


def _rtx_gpu_here() -> str | None:
    """The compute capability of a visible GPU that TensorRT for RTX runs on, else None (CI: no GPU)."""
    if cuda_skip_reason() is not None:
        return None
    capability = trt_runtime.gpu_identity(0)[1]
    return capability if capability in ("7.5", "8.6", "8.9", "12.0", "12.1") else None


#: What a build targets unless told: the RTX GPU here, else NVIDIA's portable set for TensorRT for RTX.
DEFAULT_TARGETS = [_rtx_gpu_here()] if _rtx_gpu_here() else ["8.6", "8.9", "12.0"]

#: NVIDIA's list of Python APIs that TensorRT 11 removed ("Migrating from TensorRT 10.x to 11.x").
REMOVED_IN_TENSORRT_11 = {
    "FP16", "INT8", "FP8", "BF16", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS",
    "DIRECT_IO", "int8_calibrator", "set_calibration_profile", "get_calibration_profile", "set_quantization_flag",
    "get_quantization_flag", "quantization_flags", "clear_quantization_flag", "platform_has_fast_fp16",
    "platform_has_fast_int8", "device_memory_size", "device_memory_size_for_profile",
}
ENGINE_MODULES = [Path(trt_runtime.__file__), Path(tensorrt_build.__file__)]


# -- which library runs on which GPU (no TensorRT needed) ----------------------------------------------


@pytest.mark.parametrize("capability", ["7.5", "8.6", "8.9", "12.0"])
def test_rtx_runs_on_rtx_gpus(capability):
    assert library_unsupported_reason("tensorrt_rtx", capability) is None


@pytest.mark.parametrize("capability", ["9.0", "8.0", "10.0", "7.0"])
def test_rtx_is_refused_on_other_gpus_and_tensorrt_is_not(capability):
    assert library_unsupported_reason("tensorrt_rtx", capability) == (
        f"TensorRT for RTX does not run on compute capability {capability} (it runs on 7.5, 8.6, 8.9, 12.0, 12.1)")
    assert library_unsupported_reason("tensorrt", capability) is None


def refusal_on(capability: str) -> str:
    """The one line that refuses TensorRT for RTX on a GPU of ``capability``, as its users read it."""
    return (f"TensorRT for RTX does not run on compute capability {capability} (it runs on 7.5, 8.6, 8.9, 12.0, 12.1). "
            "Note: use --backend cudnn or onnxruntime here (Python: backend='cudnn' or 'onnxruntime'), or install TensorRT "
            "(pip install 'pointpillars-trt[tensorrt]') "
            "and rebuild with `pointpillars-trt build --backend tensorrt`")


@pytest.mark.parametrize("library, capability, refused", [
    ("tensorrt_rtx", "9.0", True), ("tensorrt_rtx", "10.0", True), ("tensorrt_rtx", "8.9", False),
    ("tensorrt_rtx", "7.5", False), ("tensorrt", "9.0", False), ("tensorrt", "8.9", False),
])
def test_a_gpu_a_library_does_not_run_on_is_refused_with_the_fix(library, capability, refused):
    """What the engine says as it loads a plan and from_checkpoint before it builds one: the reason and the fix."""
    assert unsupported_gpu_refusal(library, capability) == (refusal_on(capability) if refused else None)


@pytest.mark.parametrize("library, error, fix", [
    ("tensorrt_rtx", "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
     "it needs the CUDA 12 runtime (libcudart.so.12): install it, or add the folder that holds libcudart.so.12 "
     "to LD_LIBRARY_PATH"),
    ("tensorrt", "ImportError: libnvinfer.so.10: cannot open shared object file: No such file or directory",
     "it needs libnvinfer.so.10: install it, or add the folder that holds libnvinfer.so.10 to LD_LIBRARY_PATH"),
    ("tensorrt_rtx", "AttributeError: module 'tensorrt_rtx_libs' has no attribute 'x'",
     "reinstall it: pip install --force-reinstall 'pointpillars-trt[tensorrt-rtx]'"),
    ("tensorrt", "RuntimeError", "reinstall it: pip install --force-reinstall 'pointpillars-trt[tensorrt]'"),
])
def test_an_import_failure_gets_the_fix_it_needs(library, error, fix):
    assert import_failure_fix(library, error) == fix


@pytest.mark.parametrize("visible, targets", [
    (None, ("8.6", "8.9", "12.0")),  # no GPU: the portable set
    ("9.0", ("8.6", "8.9", "12.0")),  # a GPU it does not run on: the same
    ("8.9", ("8.9",)),  # an RTX GPU: a plan for it, as TensorRT builds
    ("7.5", ("7.5",)),  # Turing, which the portable set leaves out
])
def test_rtx_builds_for_the_gpu_here_when_it_runs_there(visible, targets):
    assert rtx_default_targets(visible) == targets


@pytest.mark.parametrize("given, meant", [
    ("86", "8.6"), ("sm_86", "8.6"), ("SM120", "12.0"), ("121", "12.1"), ("75", "7.5"),
    ("90", None), ("8.6.1", None), ("abc", None), ("", None), ("8", None),
])
def test_a_capability_spelled_without_its_dot_is_pointed_to(given, meant):
    assert tensorrt_build.meant_capability(given, RTX_COMPUTE_CAPABILITIES) == meant


def test_api_generation_of_each_library():
    assert api_major("tensorrt", "10.13.0.35") == 10
    assert api_major("tensorrt", "11.4.0.7") == 11
    assert api_major("tensorrt_rtx", "1.7.1.116") == 11  # the TensorRT 11 API under another name


# -- the builder against the TensorRT 11 API of the installed RTX module ---------------------------------


@pytest.mark.tensorrt
@needs_rtx
def test_rtx_is_said_once_to_python_callers_as_a_warning():
    trt_runtime._say_rtx_once.cache_clear()
    with pytest.warns(LibraryNotice, match=r"^TensorRT is not installed; the tensorrt backend uses TensorRT for RTX "):
        trt_runtime.require_tensorrt()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trt_runtime.require_tensorrt()


@pytest.mark.tensorrt
@needs_rtx
def test_a_gpu_tensorrt_for_rtx_does_not_run_on_is_refused_without_its_notice():
    """from_checkpoint asks this of its GPU before it builds plans: the refusal is all that is said (the notice of
    TensorRT for RTX would name the GPUs it runs on a second time); a GPU it runs on gets the notice, once."""
    trt_runtime._say_rtx_once.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(BackendError) as info:
            trt_runtime.require_runnable("9.0")
    assert str(info.value) == refusal_on("9.0")
    with pytest.warns(LibraryNotice, match=r"^TensorRT is not installed; the tensorrt backend uses TensorRT for RTX "):
        trt_runtime.require_runnable("8.9")


@pytest.mark.tensorrt
@needs_rtx
def test_rtx_builds_for_the_gpus_it_both_has_a_target_for_and_runs_on():
    assert tensorrt_build.rtx_build_capabilities() == ("7.5", "8.6", "8.9", "12.0", "12.1")  # 1.7+: all it runs on
    assert "SM80" in trt_runtime.trt.ComputeCapability.__members__  # a target it never runs on: left out above


def _used_attributes(path: Path) -> tuple[set[str], set[str]]:
    """(dotted chains read off ``trt``, every other attribute name read) in one module, from its syntax tree;
    the fields of our own options (``self.options.x``) are not TensorRT's."""
    chains: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        parts, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id == "trt":
            chains.add(".".join(reversed(parts)))
        elif not (isinstance(node.value, ast.Attribute) and node.value.attr == "options"):
            names.add(node.attr)
    return chains, names


def _api_names(module: object) -> set[str]:
    names = set(dir(module))
    for value in vars(module).values():
        if isinstance(value, type):
            names |= set(dir(value))
    return names


@pytest.mark.tensorrt
@needs_rtx
def test_builder_and_runner_use_no_api_that_tensorrt_11_removed():
    import tensorrt_rtx_bindings as rtx

    rtx_api = _api_names(rtx)
    for path in ENGINE_MODULES:
        chains, names = _used_attributes(path)
        assert not (chains | names) & REMOVED_IN_TENSORRT_11, path.name
        for chain in chains - set(tensorrt_build.TENSORRT10_ONLY):  # every trt.X.Y resolves in the 11 API
            value: object = rtx
            for part in chain.split("."):
                assert hasattr(value, part), f"{path.name}: trt.{chain} is not in TensorRT for RTX {rtx.__version__}"
                value = getattr(value, part)
        # every name of the TensorRT 10 API the modules read exists in the 11 API too
        trt10 = _tensorrt10_names()
        if trt10 is not None:
            assert (names & trt10) - rtx_api == set(), path.name
    chains, _ = _used_attributes(Path(tensorrt_build.__file__))
    assert set(tensorrt_build.TENSORRT10_ONLY) <= chains  # the allowance names a use that exists


def _tensorrt10_names() -> set[str] | None:
    """Names the TensorRT 10 API defines, read from tensorrt-stubs (the type-check installs it) or None."""
    try:
        files = dist_metadata.files("tensorrt-stubs") or []
    except dist_metadata.PackageNotFoundError:
        return None
    text = "".join(Path(str(f.locate())).read_text() for f in files if f.suffix == ".pyi")
    return (set(re.findall(r"^\s*(?:def|class)\s+(\w+)", text, re.M))
            | set(re.findall(r"^\s+(\w+)\s*[:=]", text, re.M)))


@pytest.mark.tensorrt
@needs_rtx
def test_networks_are_strongly_typed_without_the_deprecated_flag():
    import tensorrt_rtx_bindings as rtx

    assert tensorrt_build.strongly_typed_flags("tensorrt_rtx", rtx.__version__) == 0
    # and the network the builder makes with no flag is strongly typed: the 11 API knows no other kind
    network = rtx.Builder(trt_runtime._logger()).create_network(tensorrt_build.strongly_typed_flags(
        "tensorrt_rtx", rtx.__version__))
    assert network.get_flag(rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert tensorrt_build.strongly_typed_flags("tensorrt", "11.4.0.7") == 0
    assert tensorrt_build.strongly_typed_flags("tensorrt", "10.13.0.35") == 1 << int(
        rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


# -- real builds ---------------------------------------------------------------------------------------


def _input_shape(onnx_path: Path) -> list[int]:
    tensor = onnx.load(str(onnx_path), load_external_data=False).graph.input[0]
    return [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.type.tensor_type.shape.dim]


@pytest.mark.tensorrt
@needs_rtx
@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
def test_the_rpn_graph_of_every_export_builds_with_its_profile(tmp_path, assets, family):
    """Both precisions of one checkpoint family: rpn.plan for batch 1..8 (tuned for 1), and no pfn.plan (the GPU
    pipeline runs the PFN as a CUDA kernel)."""
    import tensorrt_rtx_bindings as rtx

    from pointpillars_trt.convert.export import build_model_dir

    sizes = {}
    checkpoint = assets / "checkpoints" / CHECKPOINTS[family]
    for precision in ("fp32", "fp16"):
        lines: list[str] = []
        with first_build(), published_config_notice(checkpoint) if family == "openpcdet" else contextlib.nullcontext():
            model = build_model_dir(checkpoint, tmp_path / precision, backend="tensorrt", precision=precision,
                                    progress=lines.append)
        # one plan, no timing cache (TensorRT for RTX has none)
        assert sorted(p.name for p in model.path.iterdir()) == [
            "model.json", "pfn.onnx", "rpn.onnx", "rpn.plan", "rpn.plan.json"]
        plan_path = model.plan_path("rpn")
        plan, metadata = read_plan(plan_path)
        assert json.loads(plan_metadata_path(plan_path).read_text()) == metadata
        assert metadata["library"] == "tensorrt_rtx" and metadata["library_version"] == rtx.__version__
        assert metadata["compute_capabilities"] == DEFAULT_TARGETS
        assert metadata["precision"] == precision and metadata["config_digest"] == model.cfg.digest()
        assert metadata["plan_sha256"] == hashlib.sha256(plan).hexdigest()
        shape = _input_shape(model.rpn_path)
        assert shape.count(-1) == 1
        (name, profile), = metadata["profile"].items()
        assert profile == [[rows if d == -1 else d for d in shape] for rows in (1, 1, 8)], name
        # the metadata fits an RTX GPU and a plan of another library, version or GPU does not
        check_plan_metadata(metadata, plan_sha256=metadata["plan_sha256"], library="tensorrt_rtx",
                            library_version=rtx.__version__, compute_capability=DEFAULT_TARGETS[-1],
                            expected_digest=model.cfg.digest(), expected_precision=precision)
        with pytest.raises(ModelDirError, match=r"library: built for 'tensorrt_rtx', running 'tensorrt'.*"
                                                "GPU compute capability: built for "
                                                + re.escape(f"{DEFAULT_TARGETS!r}, running '9.0'")):
            check_plan_metadata(metadata, plan_sha256=metadata["plan_sha256"], library="tensorrt",
                                library_version=rtx.__version__, compute_capability="9.0")
        sizes[precision] = len(plan)
        assert len(lines) == 2, lines
        assert lines[0].startswith(f"building rpn.plan with TensorRT for RTX {rtx.__version__}: ")
        assert "canvas 1..8 (tuned for 1)" in lines[0]
        assert lines[1].startswith(f"  rpn.plan: {len(plan) / 1e6:.1f} MB in ")
    # strongly typed: the fp16 export gives fp16 weights, so a plan about half the size of the fp32 one
    assert sizes["fp16"] < 0.6 * sizes["fp32"]


@pytest.mark.tensorrt
@needs_rtx
def test_a_model_dir_with_an_older_builds_pfn_plan_still_loads(tmp_path, assets):
    """Builds before the PFN ran only as a CUDA kernel also wrote pfn.plan: such a model dir loads, counts as
    built (only rpn.plan is needed), is reused from the cache without a rebuild, and a rebuild replaces it."""
    from pointpillars_trt.convert.export import build_model_dir, model_dir_for_checkpoint
    from pointpillars_trt.model_dir import load_model_dir

    checkpoint = assets / "checkpoints" / CHECKPOINTS["zhulf0804"]
    with first_build():
        cached = model_dir_for_checkpoint(checkpoint, precision="fp16", cache_dir=tmp_path / "cache",
                                          tensorrt_plans=True)
    rpn_plan = cached.plan_path("rpn").read_bytes()
    stray = cached.plan_path("pfn")
    stray.write_bytes(b"a pfn.plan of an older build")
    plan_metadata_path(stray).write_text("{}")
    assert load_model_dir(cached.path, cached.cfg).has_plans()
    again = model_dir_for_checkpoint(checkpoint, precision="fp16", cache_dir=tmp_path / "cache", tensorrt_plans=True)
    assert again.path == cached.path and stray.is_file()  # reused as it is: no rebuild
    assert again.plan_path("rpn").read_bytes() == rpn_plan
    rebuilt = build_model_dir(checkpoint, cached.path, backend="tensorrt", precision="fp16")
    assert not rebuilt.plan_path("pfn").exists() and rebuilt.has_plans()


@pytest.mark.tensorrt
@needs_rtx
def test_a_rebuild_keeps_the_model_dirs_timing_cache(tmp_path, assets):
    """A build writes a new folder and renames it into place: the timing cache a TensorRT build left in the model dir
    was not in it, so every rebuild timed every tactic again. The rebuild starts from it (TensorRT for RTX, which
    times nothing, keeps it as it was)."""
    from pointpillars_trt.convert.export import TIMING_CACHE, build_model_dir

    checkpoint = assets / "checkpoints" / CHECKPOINTS["zhulf0804"]
    with first_build():
        model = build_model_dir(checkpoint, tmp_path / "m", backend="tensorrt", precision="fp16")
    assert not (model.path / TIMING_CACHE).exists()  # TensorRT for RTX writes none
    saved = b"the timing cache of an earlier TensorRT build"
    (model.path / TIMING_CACHE).write_bytes(saved)
    rebuilt = build_model_dir(checkpoint, tmp_path / "m", backend="tensorrt", precision="fp16")
    assert (rebuilt.path / TIMING_CACHE).read_bytes() == saved and rebuilt.has_plans()
    build_model_dir(checkpoint, tmp_path / "m")  # a model dir without plans has no use for it
    assert not (rebuilt.path / TIMING_CACHE).exists()


@pytest.mark.tensorrt
@needs_rtx
def test_a_cache_entry_whose_plan_is_damaged_is_rebuilt_saying_so(tmp_path, assets):
    """A cache entry's graphs were checked before use and its plan was not: a cut plan was used as it was, refused at
    every open with "rebuild with `pointpillars-trt build`", which a checkpoint's cache entry never gets. It is
    rebuilt with a CacheNotice, as a damaged graph is."""
    from pointpillars_trt.convert.export import model_dir_for_checkpoint
    from pointpillars_trt.errors import CacheNotice

    checkpoint = assets / "checkpoints" / CHECKPOINTS["zhulf0804"]
    kwargs = {"precision": "fp16", "cache_dir": tmp_path / "cache", "tensorrt_plans": True}
    with first_build():
        first = model_dir_for_checkpoint(checkpoint, **kwargs)
    plan_path = first.plan_path("rpn")
    good = plan_path.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheNotice)
        assert model_dir_for_checkpoint(checkpoint, **kwargs).path == first.path  # a sound entry says nothing
    plan_path.write_bytes(good[: len(good) // 2])
    with pytest.warns(CacheNotice) as said:
        again = model_dir_for_checkpoint(checkpoint, **kwargs)
    (message,) = [str(w.message) for w in said]
    assert message.startswith(f"rebuilding model cache entry '{first.path}', which cannot be used as it is (rpn.plan "
                              "does not match this setup (plan checksum: built for "), message
    recorded = read_plan(again.plan_path("rpn"))[1]["plan_sha256"]
    assert recorded == hashlib.sha256(again.plan_path("rpn").read_bytes()).hexdigest()  # whole again


@pytest.mark.tensorrt
@needs_rtx
def test_a_cache_entrys_plan_is_read_and_hashed_once_as_it_is_served_and_opened(tmp_path, assets, monkeypatch):
    """A cache entry's plan was read and hashed as the cache served it (``check_plan_file``) and again as the engine
    opened it (~25 ms for a 25 MB plan): the engine takes the bytes the check found whole, which the model dir hands
    over once (``take_checked_files``, ``plan_to_open``). A plan handed over before, or one changed since its check,
    is read and hashed as it is."""
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    checkpoint = assets / "checkpoints" / CHECKPOINTS["zhulf0804"]
    kwargs = {"precision": "fp16", "cache_dir": tmp_path / "cache", "tensorrt_plans": True}
    with first_build():
        plan_path = model_dir_for_checkpoint(checkpoint, **kwargs).plan_path("rpn")  # built
    whole = plan_path.read_bytes()
    reads: list[str] = []
    real = trt_runtime.read_regular_file
    monkeypatch.setattr(trt_runtime, "read_regular_file",
                        lambda path, **kw: (reads.append(Path(path).name), real(path, **kw))[1])
    model = model_dir_for_checkpoint(checkpoint, **kwargs)  # served from the cache: its plan checked
    plan, metadata, digest = trt_runtime.plan_to_open(plan_path, model.take_checked_files().get("rpn.plan"))
    assert reads.count("rpn.plan") == 1 and plan == whole
    assert digest == metadata["plan_sha256"] == hashlib.sha256(whole).hexdigest()
    reads.clear()
    assert model.take_checked_files() == {}  # taken once
    model = model_dir_for_checkpoint(checkpoint, **kwargs)
    plan_path.write_bytes(whole[: len(whole) // 2])  # cut after its check
    reads.clear()
    cut, _, digest = trt_runtime.plan_to_open(plan_path, model.take_checked_files().get("rpn.plan"))
    assert cut == whole[: len(whole) // 2] and digest == hashlib.sha256(cut).hexdigest() and reads.count("rpn.plan") == 1


@pytest.mark.tensorrt
@needs_rtx
def test_a_checkpoints_plans_are_built_for_the_gpu_the_detector_asked_for(tmp_path, assets, monkeypatch):
    """A checkpoint's cached plan is built on the GPU asked for (TensorRT builds for the GPU it builds on;
    from_checkpoint asks for the detector's): the device reaches the real builder, whose calls record it here."""
    import pointpillars_trt.runtime.tensorrt_build as tensorrt_build
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    asked: list[int] = []
    real = tensorrt_build.build_plan
    monkeypatch.setattr(tensorrt_build, "build_plan",
                        lambda *args, **kw: (asked.append(kw["device_id"]), real(*args, **kw))[1])
    with first_build():
        model = model_dir_for_checkpoint(assets / "checkpoints" / CHECKPOINTS["zhulf0804"], precision="fp16",
                                         cache_dir=tmp_path / "cache", tensorrt_plans=True, device_id=1)
    assert asked == [1] and model.has_plans()


@needs_rtx
def test_plans_of_another_library_version_get_a_cache_entry_of_their_own(monkeypatch):
    """After an upgrade of the library a checkpoint's plans are built again, not refused as stale every run."""
    import importlib

    from pointpillars_trt.convert.export import cache_key
    from pointpillars_trt.runtime.tensorrt_library import installed_module

    key = cache_key("a" * 64, DIGEST, "fp16", True)
    assert key != cache_key("a" * 64, DIGEST, "fp16", None) and key != cache_key("a" * 64, DIGEST, "fp16", False)
    monkeypatch.setattr(importlib.import_module(str(installed_module())), "__version__", "0.0.1")
    assert cache_key("a" * 64, DIGEST, "fp16", True) != key


@pytest.mark.tensorrt
@needs_rtx
def test_a_grid_finer_than_kittis_builds_its_plans(tmp_path, assets):
    """0.08 m pillars: four KITTI canvases. With the 1 GiB workspace of KITTI's plans the RPN plan was not built
    (OutOfMemory, "requested 1093066528 bytes"); the workspace grows with the canvas."""
    import dataclasses

    from pointpillars_trt.config import load_config
    from pointpillars_trt.convert.export import build_model_dir, plan_workspace_bytes

    kitti = load_config("openpcdet_kitti_3class")
    fine = dataclasses.replace(kitti, name="openpcdet_kitti_fine",  # a name of its own: not the built-in one's
                               voxel=dataclasses.replace(kitti.voxel, pillar_size=(0.08, 0.08, 4.0)))
    assert fine.voxel.grid[:2] == (2 * kitti.voxel.grid[0], 2 * kitti.voxel.grid[1])
    assert plan_workspace_bytes(fine) == 4 * plan_workspace_bytes(kitti) == 4 << 30
    with first_build():
        model = build_model_dir(assets / "checkpoints" / CHECKPOINTS["openpcdet"], tmp_path / "fine", config=fine,
                                backend="tensorrt", compute_capabilities=["8.6"])
    assert read_plan(model.path / "rpn.plan")[1]["config_digest"] == fine.digest()

@pytest.mark.tensorrt
@needs_rtx
def test_the_multi_head_nuscenes_graphs_build(tmp_path, nuscenes):
    """OpenPCDet's multi-head RPN (strided-conv neck branch, shared conv, 36 branch convs) builds as a strongly
    typed fp16 plan, with the batch profile of the KITTI graphs (and no pfn.plan)."""
    from pointpillars_trt.convert.export import build_model_dir

    checkpoint = nuscenes / "cbgs_pp_multihead_synthetic_dev.pth"
    with first_build(), published_config_notice(checkpoint):
        model = build_model_dir(checkpoint, tmp_path / "m", backend="tensorrt", precision="fp16")
    _, metadata = read_plan(model.plan_path("rpn"))
    assert metadata["precision"] == "fp16" and metadata["config_digest"] == model.cfg.digest()
    (_, profile), = metadata["profile"].items()
    assert [dims[0] for dims in profile] == [1, 1, 8]
    assert not model.plan_path("pfn").exists()


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory) -> tuple[Path, dict]:
    if RTX_SKIP is not None:
        pytest.skip(RTX_SKIP)
    folder = tmp_path_factory.mktemp("rtx")
    pfn_graph(folder / "pfn.onnx")
    with first_build():
        metadata = tensorrt_build.build_plan(folder / "pfn.onnx", folder / "pfn.plan",
                                             dynamic_rows={"pillars": (1, 64, 128)}, config_digest=DIGEST)
    return folder / "pfn.plan", metadata


@pytest.mark.tensorrt
@needs_rtx
@pytest.mark.parametrize("damage, running, message", [
    ({}, {"library": "tensorrt"}, "library: built for 'tensorrt_rtx', running 'tensorrt'"),
    ({}, {"library_version": "1.0.0.1"}, "library version: built for '"),
    ({}, {"compute_capability": "9.0"}, f"GPU compute capability: built for {DEFAULT_TARGETS!r}, running '9.0'"),
    ({"compute_capabilities": ["0.0"]}, {}, f"GPU compute capability: built for ['0.0'], running {DEFAULT_TARGETS[0]!r}"),
    ({"config_digest": "ffff"}, {}, "config digest: built for 'ffff', running '0123456789abcdef'"),
    ({"plan_sha256": "00" * 32}, {}, "plan checksum"),
])
def test_wrong_metadata_is_refused_with_the_rebuild_command(tiny_plan, damage, running, message):
    import tensorrt_rtx_bindings as rtx

    plan_path, built = tiny_plan
    plan, metadata = read_plan(plan_path)
    assert metadata == built
    here = {"plan_sha256": hashlib.sha256(plan).hexdigest(), "library": "tensorrt_rtx",
            "library_version": rtx.__version__, "compute_capability": DEFAULT_TARGETS[0]}
    check_plan_metadata(metadata, **here, expected_digest=DIGEST)
    with pytest.raises(ModelDirError) as info:
        check_plan_metadata({**metadata, **damage}, **{**here, **running}, expected_digest=DIGEST, plan_name="pfn.plan")
    assert message in str(info.value)
    assert str(info.value).startswith("pfn.plan does not match this setup") and str(info.value).endswith(REBUILD_HINT)


@pytest.mark.tensorrt
@needs_rtx
def test_rtx_plans_are_built_for_the_gpus_asked_for(tmp_path, tiny_plan):
    plan_path, _ = tiny_plan
    rows = {"pillars": (1, 64, 128)}
    pfn_graph(tmp_path / "pfn16.onnx", fp16=True)
    turing = tensorrt_build.build_plan(tmp_path / "pfn16.onnx", tmp_path / "t.plan", precision="fp16",
                                       dynamic_rows=rows, compute_capabilities=["7.5"])
    assert turing["compute_capabilities"] == ["7.5"] and (tmp_path / "t.plan").stat().st_size > 0
    # TensorRT for RTX has no fp32 matrix multiply on Turing: an fp32 export is refused before the build,
    # which would fail (the "fp16" label on the fp32 graph lets it reach TensorRT for RTX, which says why)
    with pytest.raises(BackendError, match=r"no fp32 matrix multiply on Turing \(7.5\). Note: export the model "
                                           r"with --precision fp16"):
        tensorrt_build.build_plan(plan_path.with_suffix(".onnx"), tmp_path / "t32.plan", dynamic_rows=rows,
                                  compute_capabilities=["7.5"])
    with pytest.raises(BackendError, match="TensorRT could not build"):
        tensorrt_build.build_plan(plan_path.with_suffix(".onnx"), tmp_path / "t32.plan", precision="fp16",
                                  dynamic_rows=rows, compute_capabilities=["7.5"])
    with pytest.raises(BackendError, match=r"^compute_capabilities 9.0: TensorRT for RTX \S+ builds for 7.5, 8.6, 8.9, "
                                           r"12.0, 12.1$"):
        tensorrt_build.build_plan(plan_path.with_suffix(".onnx"), tmp_path / "h.plan", dynamic_rows=rows,
                                  compute_capabilities=["9.0"])
    assert not (tmp_path / "t32.plan").exists() and not (tmp_path / "h.plan").exists()
    assert set(RTX_DEFAULT_TARGETS) <= set(RTX_COMPUTE_CAPABILITIES)
    # each GPU once (the metadata listed 8.6 twice), and a string is no list of GPUs (it read as "8", ".", "6")
    twice = tensorrt_build.build_plan(plan_path.with_suffix(".onnx"), tmp_path / "twice.plan", dynamic_rows=rows,
                                      compute_capabilities=["8.6", "12.0", "8.6"])
    assert twice["compute_capabilities"] == ["8.6", "12.0"]
    with pytest.raises(BackendError, match=re.escape("compute_capabilities '8.6': expected a list of compute "
                                                     "capabilities, e.g. ['8.6']")):
        tensorrt_build.build_plan(plan_path.with_suffix(".onnx"), tmp_path / "s.plan", dynamic_rows=rows,
                                  compute_capabilities="8.6")


@pytest.mark.tensorrt
@needs_rtx
def test_the_tensorrt_log_of_a_failed_build_is_on_stderr_above_its_error(tmp_path, tiny_plan, capfd) -> None:
    """A build TensorRT refuses says why in its log, and the error says "the TensorRT log above says why": the log went
    to stdout, so with the output redirected (``> out.txt``) it was not above the error line but in the file. Now
    both are on stderr, the log first."""
    plan_path, _ = tiny_plan
    capfd.readouterr()
    with pytest.raises(BackendError, match="the TensorRT log above says why"):
        tensorrt_build.build_plan(plan_path.with_suffix(".onnx"), tmp_path / "t32.plan", precision="fp16",
                                  dynamic_rows={"pillars": (1, 64, 128)}, compute_capabilities=["7.5"])
    out, err = capfd.readouterr()
    assert out == "", out
    (line,) = [line for line in err.splitlines() if line.startswith("[TRT] ")]
    assert line.startswith("[TRT] [E] ") and "FP32 GEMM is not supported" in line, err


@pytest.mark.tensorrt
@needs_rtx
def test_build_command_writes_rtx_plans_and_reports_them(tmp_path, assets, repo_root):
    out = tmp_path / "model"
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "build", "--checkpoint",
                           str(assets / "checkpoints" / CHECKPOINTS["zhulf0804"]), "--out", str(out),
                           "--backend", "tensorrt", "--precision", "fp16", "--compute-capability", "8.9",
                           "--compute-capability", "12.0", "--compute-capability", "8.9"],  # each GPU once
                          capture_output=True, text=True, timeout=300, cwd=repo_root)
    assert done.returncode == 0, done.stderr
    size = (out / "rpn.plan").stat().st_size / 1e6
    assert "building rpn.plan with TensorRT for RTX" in done.stdout and "pfn.plan" not in done.stdout
    assert re.search(rf"^  rpn\.plan: {size:.1f} MB in \d+\.\d\d s, for compute capability 8\.9, 12\.0$",
                     done.stdout, re.M), done.stdout
    assert not (out / "pfn.plan").exists()
    metadata = json.loads((out / "rpn.plan.json").read_text())
    assert metadata["compute_capabilities"] == ["8.9", "12.0"]
    # the plan names the graph it is of, as the model dir records it
    assert metadata["onnx_sha256"] == json.loads((out / "model.json").read_text())["graphs"]["rpn"]["sha256"]
    assert done.stderr.count("the tensorrt backend uses TensorRT for RTX") == 1  # said once


# -- on a machine without a GPU (where TensorRT for RTX builds): one line saying so, with the fix ---------------

NO_GPU_SKIP = "the NVIDIA driver shows a GPU here" if gpu_visible() else RTX_SKIP
needs_no_gpu = pytest.mark.skipif(NO_GPU_SKIP is not None, reason=str(NO_GPU_SKIP))
NO_GPU = "this machine shows no NVIDIA GPU (no /dev/nvidia0, "


@pytest.mark.tensorrt
@needs_no_gpu
def test_a_plan_opened_without_a_gpu_is_refused_saying_so(tiny_plan):
    """The engine said "CuPy is needed to run TensorRT engines. Note: pip install cupy-cuda12x": installing it
    changes nothing where no GPU is; the refusal names the missing GPU and the CPU path."""
    from pointpillars_trt.runtime import TrtOptions, open_engine

    plan_path, _ = tiny_plan
    with pytest.raises(BackendError) as info:
        open_engine(plan_path, TrtOptions(config_digest=DIGEST))
    assert str(info.value).startswith("pfn.plan: TensorRT plans run on an NVIDIA GPU, and this machine shows none (no "
                                      "/dev/nvidia0, ")
    assert str(info.value).endswith("ONNX graphs on the CPU (--device cpu or auto; Python: device='cpu' or 'auto')")
    assert "CuPy" not in str(info.value)


@pytest.mark.tensorrt
@needs_no_gpu
def test_the_tensorrt_backend_without_a_gpu_is_one_error_that_says_why(tmp_path, repo_root):
    """A model dir with a plan, ``--backend tensorrt`` and device auto where no GPU is: the error said only that the
    backend runs in the GPU pipeline (the CLI), or came after a warning of the fallback to the CPU (Python). Now one
    error names the missing GPU, once, with the fix."""
    from pointpillars_trt.convert.export import build_model_plans
    from pointpillars_trt.detector import PointPillars
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model", precision="fp16")
    with first_build():
        build_model_plans(model, "fp16")
    expected = ("backend 'tensorrt' runs only in the GPU pipeline, and device auto runs on the CPU here: " + NO_GPU)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BackendError, match="^" + re.escape(expected)) as info:
            PointPillars.from_model_dir(model.path, backend="tensorrt")
    assert "--backend auto or onnxruntime" in str(info.value)
    assert [str(w.message) for w in caught if "CPU" in str(w.message)] == []  # said in the error alone
    frame = tmp_path / "frame.bin"
    np.zeros((10, 4), np.float32).tofile(frame)
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frame), "--model", str(model.path),
                           "--backend", "tensorrt"], capture_output=True, text=True, timeout=300, cwd=repo_root)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines() == [f"error: {info.value}"], done.stderr


@pytest.mark.tensorrt
@needs_no_gpu
def test_a_checkpoint_on_the_tensorrt_backend_without_a_gpu_is_refused_before_anything_is_built(tmp_path, assets):
    """from_checkpoint asks whether its GPU runs the plans before it builds them; where there is no GPU the refusal
    stays the one that names the missing GPU and the CPU path, and nothing is exported."""
    from pointpillars_trt.detector import PointPillars

    cache = tmp_path / "cache"
    expected = "backend 'tensorrt' runs only in the GPU pipeline, and device auto runs on the CPU here: " + NO_GPU
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BackendError, match="^" + re.escape(expected)) as info:
            PointPillars.from_checkpoint(assets / "checkpoints" / CHECKPOINTS["zhulf0804"], backend="tensorrt",
                                         cache_dir=cache)
    assert "--backend auto or onnxruntime" in str(info.value)
    assert [str(w.message) for w in caught] == []
    assert not cache.exists() or not any(cache.iterdir())


# -- on a GPU that TensorRT for RTX does not run on (the H200): one clear line --------------------------


def _unsupported_gpu_skip_reason() -> str | None:
    if RTX_SKIP is not None:
        return RTX_SKIP
    reason = cuda_skip_reason()
    if reason is not None:
        return reason
    capability = trt_runtime.gpu_identity(0)[1]
    if library_unsupported_reason("tensorrt_rtx", capability) is None:
        return f"TensorRT for RTX runs on this GPU (compute capability {capability})"
    return None


@pytest.mark.cuda
@pytest.mark.tensorrt
@pytest.mark.skipif(_unsupported_gpu_skip_reason() is not None, reason=str(_unsupported_gpu_skip_reason()))
def test_rtx_plans_on_an_unsupported_gpu_are_refused_in_one_line(tmp_path, repo_root):
    from pointpillars_trt.convert.export import build_model_plans
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.runtime import TrtOptions, open_engine
    from tiny import tiny_model_dir

    capability = trt_runtime.gpu_identity(0)[1]
    model = tiny_model_dir(tmp_path / "model", precision="fp16")
    build_model_plans(model, "fp16")  # TensorRT for RTX builds here; it cannot run what it built
    expected = f"TensorRT for RTX does not run on compute capability {capability}"
    with pytest.raises(BackendError, match=re.escape(expected)) as info:
        open_engine(model.path / "rpn.plan", TrtOptions())
    assert "\n" not in str(info.value)
    # auto skips the plans with one notice (however many detectors open them) and runs another engine
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    rng = np.random.default_rng(0)
    points = np.column_stack([rng.uniform(lo, hi, (2000, 3)), rng.uniform(0, 1, 2000)]).astype(np.float32)
    frame = tmp_path / "frame.bin"
    points.tofile(frame)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector = PointPillars.from_model_dir(model.path, device="cuda")
        detector(points)
        PointPillars.from_model_dir(model.path, device="cuda")
    notices = [str(w.message) for w in caught if expected in str(w.message)]
    assert len(notices) == 1 and "does not run on compute capability" in notices[0] and "using cudnn" in notices[0]
    assert detector._impl.backend != "tensorrt"  # type: ignore[attr-defined]
    # the command line: exit code 2 and exactly one `error:` line, no traceback
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frame), "--model", str(model.path),
                           "--backend", "tensorrt", "--device", "cuda"], capture_output=True, text=True, timeout=300,
                          cwd=repo_root)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and expected in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.cuda
@pytest.mark.tensorrt
@pytest.mark.skipif(_unsupported_gpu_skip_reason() is not None, reason=str(_unsupported_gpu_skip_reason()))
def test_a_checkpoint_on_an_unsupported_gpu_is_refused_before_its_plans_are_built(tmp_path, assets, repo_root):
    """from_checkpoint(backend="tensorrt") exported the checkpoint and built its plans (minutes), and only then did the
    engine refuse to open them. The engine's refusal now comes first, once, and nothing is exported."""
    from pointpillars_trt.detector import PointPillars

    checkpoint = assets / "checkpoints" / CHECKPOINTS["zhulf0804"]
    expected = refusal_on(trt_runtime.gpu_identity(0)[1])
    cache = tmp_path / "cache"
    with pytest.raises(BackendError) as info:
        PointPillars.from_checkpoint(checkpoint, backend="tensorrt", device="cuda", precision="fp16", cache_dir=cache)
    assert str(info.value) == expected
    assert not cache.exists() or not any(cache.iterdir())
    frame = tmp_path / "frame.bin"
    np.zeros((10, 4), np.float32).tofile(frame)
    env = {**os.environ, "POINTPILLARS_TRT_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frame), "--model", str(checkpoint),
                           "--backend", "tensorrt", "--device", "cuda"], capture_output=True, text=True, timeout=300,
                          cwd=repo_root, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if "TensorRT for RTX" in line] == [f"error: {expected}"]
    assert not cache.exists() or not any(cache.iterdir())


SDK_BUILD = """
import sys
sys.modules["tensorrt_rtx_bindings"] = None  # only the SDK wheel's module is installed
from pathlib import Path
from pointpillars_trt.runtime.tensorrt_build import build_plan
from pointpillars_trt.runtime.tensorrt_library import installed_library
from tiny_graphs import pfn_graph
folder = Path(sys.argv[1])
pfn_graph(folder / "pfn.onnx")
metadata = build_plan(folder / "pfn.onnx", folder / "pfn.plan", dynamic_rows={"pillars": (1, 64, 128)})
print(installed_library(), metadata["library"], metadata["library_version"], "tensorrt_rtx" in sys.modules)
"""


@pytest.mark.tensorrt
@needs_rtx
def test_tensorrt_for_rtx_installed_as_the_sdk_wheel_builds_plans(tmp_path: Path, repo_root: Path) -> None:
    """The wheel in NVIDIA's TensorRT for RTX SDK installs its bindings as the module ``tensorrt_rtx`` (the
    ``tensorrt-rtx-cu13-bindings`` wheel as ``tensorrt_rtx_bindings``): where only that one was installed, the backend
    said "TensorRT is not installed". The library installed here, laid out as the SDK wheel lays it out (the same
    generated ``__init__.py`` beside the same extension module, in a package named ``tensorrt_rtx``), builds a plan."""
    import tensorrt_rtx_bindings as rtx

    installed = Path(rtx.__file__).parent
    sdk = tmp_path / "site" / "tensorrt_rtx"
    sdk.mkdir(parents=True)
    shutil.copy(installed / "__init__.py", sdk / "__init__.py")
    (extension,) = installed.glob("tensorrt_rtx*.so")
    (sdk / extension.name).symlink_to(extension)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(sdk.parent), str(repo_root), str(repo_root / "tests")])}
    done = subprocess.run([sys.executable, "-c", SDK_BUILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tensorrt_rtx", "tensorrt_rtx", rtx.__version__, "True"], done
    assert (tmp_path / "pfn.plan").stat().st_size > 0


def test_a_tensorrt_that_imports_leaves_tensorrt_for_rtx_unloaded(tmp_path: Path) -> None:
    """The backend takes TensorRT when it imports: TensorRT for RTX, installed beside it, is not imported (its
    bindings would load a second TensorRT and CUDA runtime into the process), nor said to have failed."""
    shims = tmp_path / "shims"
    (shims / "tensorrt").mkdir(parents=True)
    (shims / "tensorrt" / "__init__.py").write_text("class Builder:\n    pass\n__version__ = '10.99'\n")
    (shims / "tensorrt_rtx_bindings").mkdir()
    (shims / "tensorrt_rtx_bindings" / "__init__.py").write_text("raise ImportError('imported')\n")
    probe = ("import sys; from pointpillars_trt.runtime.tensorrt_library import import_failures, installed_library; "
             "print(installed_library(), import_failures(), 'tensorrt_rtx_bindings' in sys.modules)")
    repo = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{shims}:{repo}"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.split() == ["tensorrt", "{}", "False"], done
