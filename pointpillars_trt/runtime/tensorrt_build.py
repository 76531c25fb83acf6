"""TensorRT 10 plan builder: ONNX graph -> serialized plan + the metadata the runner checks.

Kept apart from the runner (``tensorrt.py``) so the build scripts and ``from_checkpoint`` call the
same builder, and the runtime path never imports builder code. Only the TensorRT 10 API is used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import BackendError, ModelDirError
from ..fileio import write_bytes_atomic
from .base import Shape
from .tensorrt import (METADATA_FORMAT, Precision, _logger, _shape, _use_device, gpu_identity, plan_metadata_path,
                       require_tensorrt, trt)


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
) -> dict[str, Any]:
    """Build ``onnx_path`` into ``plan_path`` (written atomically) plus its metadata; returns the metadata.

    ``precision``: ``"fp32"`` (true fp32 unless ``tf32``), ``"fp16"`` (FP16 kernels allowed
    in an fp32 graph) or ``"graph"`` (a strongly typed network: the types written in the ONNX file,
    e.g. an fp16 export, and nothing else). ``dynamic_rows`` maps each input with dynamic dimensions
    to the ``(min, opt, max)`` used for all of them, e.g. ``{"pillars": (1, Pmax, Pmax)}``.
    ``config_digest`` (``ModelConfig.digest()``) is recorded so a stale plan is caught at load time.
    """
    require_tensorrt()
    onnx_path, plan_path = Path(onnx_path), Path(plan_path)
    if not onnx_path.is_file():
        raise ModelDirError(f"ONNX graph not found: {onnx_path}")
    if precision not in ("fp32", "fp16", "graph"):
        raise BackendError(f"Unknown precision {precision!r}. Note: Expected 'fp32', 'fp16' or 'graph'")
    _use_device(device_id)

    builder = trt.Builder(_logger())
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if precision == "graph" else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, _logger())
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n".join(f"  {parser.get_error(i)}" for i in range(parser.num_errors))
        raise BackendError(f"TensorRT could not parse {onnx_path}:\n{errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    if not tf32:  # TensorRT allows TF32 unless told otherwise; IEEE fp32 matches the CPU oracle
        config.clear_flag(trt.BuilderFlag.TF32)
    profile_shapes = _profile_shapes(network, dynamic_rows or {})
    if profile_shapes:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile_shapes.items():
            profile.set_shape(name, trt.Dims(list(lo)), trt.Dims(list(opt)), trt.Dims(list(hi)))
        config.add_optimization_profile(profile)
    cache_path = Path(timing_cache_path) if timing_cache_path else None
    _attach_timing_cache(config, cache_path)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendError(f"TensorRT could not build {onnx_path}; the TensorRT log above says why")
    plan_bytes = bytes(memoryview(plan))
    if cache_path is not None:
        _write_atomic(cache_path, bytes(memoryview(config.get_timing_cache().serialize())))

    gpu_name, capability = gpu_identity(device_id)
    metadata: dict[str, Any] = {
        "format": METADATA_FORMAT,
        "onnx": onnx_path.name,
        "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
        "tensorrt_version": trt.__version__,
        "gpu_name": gpu_name,
        "compute_capability": capability,
        "config_digest": config_digest,
        "precision": precision,
        "tf32": tf32,
        "profile": {name: [list(s) for s in shapes] for name, shapes in profile_shapes.items()},
    }
    # A crash between the two writes leaves a plan without metadata, which the engine rejects.
    plan_metadata_path(plan_path).unlink(missing_ok=True)
    _write_atomic(plan_path, plan_bytes)
    _write_atomic(plan_metadata_path(plan_path), json.dumps(metadata, indent=2).encode())
    return metadata


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
