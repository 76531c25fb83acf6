"""TensorRT plan builder (TensorRT 10, 11, TensorRT for RTX): ONNX graph -> plan + metadata the runner checks.

Kept apart from the runner (``tensorrt.py``) so the build scripts and ``from_checkpoint`` call the
same builder, and the runtime path never imports builder code.

Builds are strongly typed on every library: each tensor keeps the type the ONNX graph gives it (the
fp16 export is fp16 in the graph itself), which is the only mode TensorRT 11 and TensorRT for RTX
have. No API that TensorRT 11 removed is called (``BuilderFlag.FP16``/``INT8``, precision
constraints, ``platform_has_fast_fp16``); the one TensorRT 10-only call, the ``STRONGLY_TYPED``
network flag, runs on TensorRT 10 alone (11 ignores it and deprecates it). TF32 is the ``TF32``
builder flag on all three.

TensorRT builds on, and for, the current GPU. TensorRT for RTX builds ahead of time without a GPU,
for a list of compute capabilities that the metadata records.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import BackendError, ModelDirError, safe_repr
from ..file_writes import write_bytes_atomic
from ..graph_io import Precision
from .base import Shape
from .tensorrt import (METADATA_FORMAT, _logger, _shape, _use_device, gpu_identity, library,
                       plan_metadata_path, trt)
from .tensorrt_library import LIBRARY_TITLES, RTX_COMPUTE_CAPABILITIES, Library, api_major, rtx_default_targets

#: The API this module touches on TensorRT 10 only (TensorRT 11 deprecates it): the API check allows it.
TENSORRT10_ONLY = ("NetworkDefinitionCreationFlag.STRONGLY_TYPED",)


def build_plan(
    onnx_path: str | Path,
    plan_path: str | Path,
    *,
    precision: Precision = "fp32",
    dynamic_rows: Mapping[str, tuple[int, int, int]] | None = None,
    config_digest: str | None = None,
    timing_cache_path: str | Path | None = None,
    workspace_bytes: int = 1 << 30,
    device_id: int = 0,
    tf32: bool = False,
    compute_capabilities: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Build ``onnx_path`` into ``plan_path`` (written atomically) plus its metadata; returns the metadata.

    The plan keeps the graph's own types (strongly typed); ``precision`` names the export it came from
    (``"fp32"`` or ``"fp16"``) and is recorded so the runner can refuse a plan of another export.
    ``tf32`` allows TensorFloat-32 in fp32 layers (False: IEEE fp32, as the CPU oracle).
    ``dynamic_rows`` maps each input with dynamic dimensions to the ``(min, opt, max)`` used for all of
    them, e.g. ``{"pillars": (1, Pmax, Pmax)}``. ``config_digest`` (``ModelConfig.digest()``) is recorded
    so a stale plan is caught at load time. ``compute_capabilities``: TensorRT for RTX only, the GPUs the
    plan is for (default: GPU ``device_id`` when the library runs on it, else its portable set); TensorRT
    builds for the GPU ``device_id``.
    """
    started = time.perf_counter()
    lib = library()
    onnx_path, plan_path = Path(onnx_path), Path(plan_path)
    if not onnx_path.is_file():
        raise ModelDirError(f"ONNX graph not found: {safe_repr(onnx_path)}")
    if precision not in ("fp32", "fp16"):
        raise BackendError(f"Unknown precision {precision!r}. Note: Expected 'fp32' or 'fp16'")
    gpu_name: str | None = None
    targets = check_targets(compute_capabilities, precision, device_id=device_id)
    if targets is None:  # TensorRT builds on, and for, the GPU device_id
        _use_device(device_id)
        gpu_name, capability = gpu_identity(device_id)
        targets = (capability,)

    builder = trt.Builder(_logger())
    network = builder.create_network(strongly_typed_flags(lib, trt.__version__))
    parser = trt.OnnxParser(network, _logger())
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n".join(f"  {parser.get_error(i)}" for i in range(parser.num_errors))
        raise BackendError(f"TensorRT could not parse {safe_repr(onnx_path)}:\n{errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if not tf32:  # TensorRT allows TF32 unless told otherwise; IEEE fp32 matches the CPU oracle
        config.clear_flag(trt.BuilderFlag.TF32)
    profile_shapes = _profile_shapes(network, dynamic_rows or {})
    if profile_shapes:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile_shapes.items():
            profile.set_shape(name, trt.Dims(list(lo)), trt.Dims(list(opt)), trt.Dims(list(hi)))
        config.add_optimization_profile(profile)
    cache_path = Path(timing_cache_path) if timing_cache_path else None
    if lib == "tensorrt":
        _attach_timing_cache(config, cache_path)
    else:  # TensorRT for RTX times nothing at build time (its timing-cache calls are no-ops)
        cache_path = None
        _set_compute_capabilities(config, targets)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError(f"TensorRT could not build {safe_repr(onnx_path)}; the TensorRT log above says why")
    plan_bytes = bytes(memoryview(plan))
    if cache_path is not None:
        _write_atomic(cache_path, bytes(memoryview(config.get_timing_cache().serialize())))

    metadata: dict[str, Any] = {
        "format": METADATA_FORMAT,
        "onnx": onnx_path.name,
        "onnx_sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest(),  # the graph the plan is of
        "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
        "library": lib,
        "library_version": trt.__version__,
        "compute_capabilities": list(targets),
        "gpu_name": gpu_name,
        "config_digest": config_digest,
        "precision": precision,
        "tf32": tf32,
        "profile": {name: [list(s) for s in shapes] for name, shapes in profile_shapes.items()},
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    # A crash between the two writes leaves a plan without metadata, which the engine rejects.
    plan_metadata_path(plan_path).unlink(missing_ok=True)
    _write_atomic(plan_path, plan_bytes)
    _write_atomic(plan_metadata_path(plan_path), json.dumps(metadata, indent=2).encode())
    return metadata


def describe_build(plan_path: Path, dynamic_rows: Mapping[str, tuple[int, int, int]]) -> str:
    """The progress line before a build: which plan, which library, which rows."""
    rows = ", ".join(f"{name} {lo}..{hi} (tuned for {opt})" for name, (lo, opt, hi) in dynamic_rows.items())
    return f"building {plan_path.name} with {LIBRARY_TITLES[library()]} {trt.__version__}: {rows}"


def describe_plan(plan_path: Path, metadata: Mapping[str, Any]) -> str:
    """The line after a build: size, build time and the GPUs the plan runs on."""
    size_mb = plan_path.stat().st_size / 1e6
    return (f"  {plan_path.name}: {size_mb:.1f} MB in {metadata['build_seconds']:.2f} s, for compute capability "
            f"{', '.join(metadata['compute_capabilities'])}")


def strongly_typed_flags(lib: Library, version: str) -> int:
    """Network creation flags of a strongly typed network: TensorRT 10 asks for it, 11 always is."""
    if api_major(lib, version) >= 11:
        return 0
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def check_targets(compute_capabilities: Sequence[str] | None, precision: str, *, device_id: int = 0,
                  option: str = "compute_capabilities") -> tuple[str, ...] | None:
    """The compute capabilities a TensorRT for RTX plan is for (``compute_capabilities``, each once; default: see
    ``rtx_default_targets``), or None for TensorRT, which builds for GPU ``device_id``. Cheap, so callers run it
    before any export work; ``option`` is what a refusal calls the list (the CLI: ``--compute-capability``)."""
    if isinstance(compute_capabilities, str):  # a sequence of its characters: "8.6" would read as "8", ".", "6"
        raise BackendError(f"{option} {compute_capabilities!r}: expected a list of compute capabilities, "
                           f"e.g. [{compute_capabilities!r}]")
    if library() == "tensorrt":
        if compute_capabilities is not None:
            raise BackendError(f"{option}: TensorRT builds for the GPU it runs on. "
                               "Note: drop it, or build with TensorRT for RTX")
        return None
    targets = (rtx_default_targets(_visible_capability(device_id)) if compute_capabilities is None
               else tuple(dict.fromkeys(compute_capabilities)))
    buildable = rtx_build_capabilities()
    builds_for = f"{LIBRARY_TITLES['tensorrt_rtx']} {trt.__version__} builds for {', '.join(buildable)}"
    if not targets:
        raise BackendError(f"{option}: none given; {builds_for}")
    unknown = [cc for cc in targets if cc not in buildable]
    if unknown:
        meant = meant_capability(unknown[0], buildable)
        hint = f" (major.minor: did you mean {meant}?)" if meant is not None else ""
        raise BackendError(f"{option} {unknown[0]}: {builds_for}{hint}" if compute_capabilities is not None else
                           f"the default target {unknown[0]}: {builds_for}; pass {option} with one of these")
    if "7.5" in targets and precision == "fp32":
        turing = f"{option} 7.5" if compute_capabilities is not None else "this GPU (compute capability 7.5)"
        raise BackendError(f"{turing}: TensorRT for RTX has no fp32 matrix multiply on Turing (7.5). "
                           "Note: export the model with --precision fp16 for it")
    return targets


def meant_capability(given: str, capabilities: Sequence[str]) -> str | None:
    """The one of ``capabilities`` whose digits ``given`` spells without the dot ("86", "sm_86": 8.6), else
    None: nvcc's and the SM enum's spelling, which the "builds for" list alone does not point out."""
    digits = "".join(ch for ch in given if ch.isdecimal())
    return next((cc for cc in capabilities if digits and cc.replace(".", "") == digits), None)


def rtx_build_capabilities() -> tuple[str, ...]:
    """The compute capabilities this TensorRT for RTX both builds plans for (its ``ComputeCapability`` members: an
    older release lacks the newest GPUs) and runs them on (it builds for some, e.g. 8.0, that it never runs on)."""
    rtx: Any = trt  # no such enum in TensorRT, nor in its type stubs
    members = [name[2:] for name in rtx.ComputeCapability.__members__ if name.startswith("SM")]
    return tuple(cc for cc in RTX_COMPUTE_CAPABILITIES if cc.replace(".", "") in members)


def _visible_capability(device_id: int) -> str | None:
    """The compute capability of GPU ``device_id``, or None where there is none (TensorRT for RTX builds
    without one): no CuPy, no driver or no such device all mean "build without a GPU"."""
    try:
        return gpu_identity(device_id)[1]
    except Exception:  # CuPy's CUDARuntimeError (no driver, no device) or our BackendError (no CuPy)
        return None


def _set_compute_capabilities(config: Any, targets: Sequence[str]) -> None:
    """TensorRT for RTX only (no such API in TensorRT, nor in its type stubs): build for exactly these GPUs."""
    rtx: Any = trt
    config.num_compute_capabilities = len(targets)
    for index, capability in enumerate(targets):
        value = getattr(rtx.ComputeCapability, "SM" + capability.replace(".", ""))
        if not config.set_compute_capability(value, index):
            raise BackendError(f"TensorRT for RTX {trt.__version__} cannot build for compute capability {capability}")


def _profile_shapes(
    network: trt.INetworkDefinition, dynamic_rows: Mapping[str, tuple[int, int, int]]
) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shapes of each dynamic network input: every -1 dimension takes the given rows."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    dynamic = {t.name: _shape(t.shape) for t in inputs if -1 in _shape(t.shape)}
    if set(dynamic_rows) != set(dynamic):
        raise BackendError(
            f"Optimization profile | Received rows for {sorted(dynamic_rows)}. "
            f"Note: Expected exactly the dynamic inputs {sorted(dynamic)} (shapes {dynamic})"
        )
    shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
    for name, shape in dynamic.items():
        lo, opt, hi = dynamic_rows[name]
        if not 0 < lo <= opt <= hi:
            raise BackendError(f"Optimization profile | Input {name}: Received rows {(lo, opt, hi)}. Note: Expected 0 < min <= opt <= max")
        lo_s, opt_s, hi_s = (tuple(rows if d == -1 else d for d in shape) for rows in (lo, opt, hi))
        shapes[name] = (lo_s, opt_s, hi_s)
    return shapes


def _attach_timing_cache(config: trt.IBuilderConfig, cache_path: Path | None) -> None:
    """Start from the saved timing cache when there is a usable one, else from an empty cache."""
    saved = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
    cache = config.create_timing_cache(saved)
    if not config.set_timing_cache(cache, False):  # saved by another TensorRT or GPU: start afresh
        config.set_timing_cache(config.create_timing_cache(b""), False)


def _write_atomic(path: Path, data: bytes) -> None:
    """The package's atomic writer (temp file, fsync, rename): a reader never sees half a plan."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
