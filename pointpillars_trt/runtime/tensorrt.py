"""TensorRT 10: build a plan from an ONNX graph, then run it by tensor name on the pipeline's stream.

Kept thin on purpose: validation, lifecycle and binding bookkeeping live in :class:`..Engine`, which
the ONNX Runtime engine shares. Only the TensorRT 10 name-based API is used (``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``); no binding indices.

A plan only runs on the TensorRT version and GPU architecture it was built with, and is only
meaningful for the model config it was exported from. :func:`build_plan` therefore writes a JSON
file beside the plan (``<plan>.json``) and :class:`TensorRTEngine` refuses a plan whose metadata
disagrees with what it runs on, asking for a rebuild instead of failing inside TensorRT.

Dynamic pillar count: the PFN input's first dimension is dynamic in the plan, with an optimization
profile of ``(min, opt, max)`` rows. The pipeline binds ``Pmax`` rows every frame, so build with
``opt == max == Pmax``: the kernels are tuned for the only shape that runs, and a bound shape that
never changes keeps ``execute_async_v3`` capturable in a CUDA graph.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Mapping

import numpy as np

from ..errors import BackendError, ModelDirError
from . import Backend, Engine, Shape, TensorSpec, tensorrt_available

try:
    import tensorrt as trt
except ImportError:  # an ONNX Runtime-only install: this module still imports, TensorRT calls raise
    trt = None  # type: ignore[assignment]

Precision = Literal["fp32", "fp16", "graph"]
METADATA_FORMAT = 1
REBUILD_HINT = "rebuild with `pointpillars-trt build --backend tensorrt`"


def plan_metadata_path(plan_path: str | Path) -> Path:
    """Where the metadata of a plan lives: ``rpn.plan`` -> ``rpn.plan.json``."""
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + ".json")


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


def check_plan_metadata(
    metadata: Mapping[str, Any],
    *,
    plan_sha256: str,
    tensorrt_version: str,
    compute_capability: str,
    expected_digest: str | None = None,
    plan_name: str = "plan",
) -> None:
    """Raise ModelDirError naming every way a plan does not fit this machine or config."""
    checks = [
        ("plan checksum", metadata.get("plan_sha256"), plan_sha256),
        ("TensorRT version", metadata.get("tensorrt_version"), tensorrt_version),
        ("GPU compute capability", metadata.get("compute_capability"), compute_capability),
    ]
    if expected_digest is not None:
        checks.append(("config digest", metadata.get("config_digest"), expected_digest))
    problems = [f"{what}: built for {built!r}, running {now!r}" for what, built, now in checks if built != now]
    if problems:
        raise ModelDirError(f"{plan_name} does not match this setup ({'; '.join(problems)}). Note: {REBUILD_HINT}")


class TensorRTEngine(Engine):
    """A TensorRT plan with one execution context, bound by tensor name to the pipeline's buffers."""

    backend: Backend = "tensorrt"

    def __init__(self, path: str | Path, *, device_id: int = 0, expected_digest: str | None = None) -> None:
        super().__init__(path, "cuda")
        self.device_id = device_id
        self.expected_digest = expected_digest
        self.metadata: dict[str, Any] = {}
        self._engine: trt.ICudaEngine | None = None
        self._context: trt.IExecutionContext | None = None
        self._shapes_checked = False

    def _load(self) -> list[TensorSpec]:
        require_tensorrt()
        meta_path = plan_metadata_path(self.path)
        if not self.path.is_file():
            raise ModelDirError(f"TensorRT plan not found: {self.path}. Note: {REBUILD_HINT}")
        if not meta_path.is_file():
            raise ModelDirError(f"Metadata of {self.path.name} not found: {meta_path}. Note: {REBUILD_HINT}")
        plan = self.path.read_bytes()
        try:
            metadata = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelDirError(f"Cannot read {meta_path}: {exc}. Note: {REBUILD_HINT}") from exc
        if not isinstance(metadata, dict):
            raise ModelDirError(f"{meta_path} is not a metadata object. Note: {REBUILD_HINT}")
        _use_device(self.device_id)
        check_plan_metadata(
            metadata,
            plan_sha256=hashlib.sha256(plan).hexdigest(),
            tensorrt_version=trt.__version__,
            compute_capability=gpu_identity(self.device_id)[1],
            expected_digest=self.expected_digest,
            plan_name=self.path.name,
        )
        engine = trt.Runtime(_logger()).deserialize_cuda_engine(plan)
        if engine is None:
            raise ModelDirError(f"TensorRT could not deserialize {self.path}. Note: {REBUILD_HINT}")
        context = engine.create_execution_context()
        if context is None:
            raise BackendError(f"TensorRT could not create an execution context for {self.path.name} (device memory?)")
        self.metadata, self._engine, self._context = metadata, engine, context
        self._shapes_checked = False
        return [_spec(engine, engine.get_tensor_name(i)) for i in range(engine.num_io_tensors)]

    def _unload(self) -> None:
        self._context = None  # the context must go before its engine
        self._engine = None

    def _bind(self, spec: TensorSpec, ptr: int, shape: Shape) -> None:
        assert self._engine is not None and self._context is not None  # set by _load
        if spec.is_input and -1 in spec.shape:
            lo, _, hi = (_shape(d) for d in self._engine.get_tensor_profile_shape(spec.name, 0))
            if not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
                raise BackendError(
                    f"Input tensor: {spec.name} | Received shape {shape} outside the optimization profile "
                    f"of {self.path.name}. Note: Expected {lo} <= shape <= {hi}; {REBUILD_HINT} and a larger profile"
                )
        if spec.is_input and not self._context.set_input_shape(spec.name, shape):
            raise BackendError(f"Input tensor: {spec.name} | TensorRT rejected shape {shape}")
        if not self._context.set_tensor_address(spec.name, ptr):
            raise BackendError(f"{spec.role} tensor: {spec.name} | TensorRT rejected address {ptr:#x}")
        self._shapes_checked = False

    def _run(self, stream_ptr: int) -> None:
        assert self._context is not None
        if not self._shapes_checked:
            self._check_output_shapes()
        if not self._context.execute_async_v3(stream_ptr):
            raise BackendError(f"TensorRT execute_async_v3 failed for {self.path.name}; the TensorRT log says why")

    def _check_output_shapes(self) -> None:
        """Once per change of bindings: every output buffer must have the shape TensorRT will write."""
        assert self._context is not None
        unresolved = self._context.infer_shapes()
        if unresolved:
            raise BackendError(f"{self.path.name}: TensorRT cannot infer shapes; unspecified: {unresolved}")
        for name in self._outputs:
            needed = _shape(self._context.get_tensor_shape(name))
            bound = self._bound[name][1]
            if needed != bound:
                raise BackendError(
                    f"Output tensor: {name} | Received buffer of shape {bound}. "
                    f"Note: Expected {needed} for the bound inputs"
                )
        self._shapes_checked = True


def gpu_identity(device_id: int = 0) -> tuple[str, str]:
    """(GPU name, compute capability "major.minor") of a device, as the plan metadata records them."""
    props = _cupy().cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return name, f"{props['major']}.{props['minor']}"


def _use_device(device_id: int) -> None:
    """Make ``device_id`` current: TensorRT builds and deserializes on the current device."""
    _cupy().cuda.Device(device_id).use()


def _cupy() -> Any:
    """CuPy owns the CUDA context of the whole pipeline; TensorRT shares it."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendError("CuPy is needed to run TensorRT engines. Note: pip install cupy-cuda12x (or cuda13x)") from exc
    return cupy


def require_tensorrt() -> None:
    """Raise unless the real TensorRT is importable (``tensorrt_available`` tells stubs from it)."""
    if not tensorrt_available():
        raise BackendError("TensorRT is not installed. Note: pip install 'pointpillars-trt[tensorrt]' (tensorrt>=10)")


@functools.lru_cache(maxsize=None)
def _logger() -> trt.Logger:
    """One TensorRT logger per process, as TensorRT recommends; warnings and errors go to stdout."""
    return trt.Logger(trt.Logger.WARNING)


def _spec(engine: trt.ICudaEngine, name: str) -> TensorSpec:
    is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
    dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
    return TensorSpec(name, _shape(engine.get_tensor_shape(name)), dtype, is_input)


def _shape(dims: trt.Dims) -> Shape:
    """A Dims as a tuple of ints (Dims indexes like a tuple but does not declare iteration)."""
    return tuple(int(dims[i]) for i in range(len(dims)))


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
    from ..kitti import write_bytes_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
