"""TensorRT 10/11 and TensorRT for RTX: run a plan by tensor name on the pipeline's stream.

Kept thin on purpose: validation, lifecycle and binding bookkeeping live in :class:`..Engine`, which
the ONNX Runtime engine shares. Only the name-based API that TensorRT 10, 11 and TensorRT for RTX
share is used (``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``); no binding indices.
``trt`` is whichever library :func:`.tensorrt_library.installed_library` picked: TensorRT when it
imports, else TensorRT for RTX.

A plan only runs with the library and version that built it, on the GPU architectures it was built
for, and is only meaningful for the model config it was exported from. The builder therefore writes
a JSON file beside the plan (``<plan>.json``) and :class:`TensorRTEngine` refuses a plan whose
metadata disagrees with what it runs on, asking for a rebuild instead of failing inside TensorRT; a
library that cannot run on this GPU at all (TensorRT for RTX on a Hopper GPU) is refused before that, and by
``PointPillars.from_checkpoint`` before it builds a checkpoint's plans.

Dynamic batch: the RPN input's first dimension (frames) is dynamic in the plan, with an optimization
profile of 1 to 8 frames tuned for 1; the pipeline binds a batch size once for each CUDA graph it
captures, so ``execute_async_v3`` stays capturable.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import BackendError, InputError, LibraryNotice, ModelDirError, escape_text, one_line, safe_repr
from ..file_reads import read_regular_file
from ..model_dir import MAX_GRAPH_BYTES, MAX_METADATA_BYTES, CheckedFile, file_identity
from ..strict_json import loads_json
from .availability import describe_probes, gpu_visible
from .base import Backend, Engine, Shape, TensorSpec
from .options import TrtOptions
from .tensorrt_library import (LIBRARY_TITLES, REBUILD_HINT, RTX_COMPUTE_CAPABILITIES, Library, installed_library,
                               installed_module, library_state, library_unsupported_reason, unavailable_reason,
                               unsupported_gpu_refusal)

LIBRARY: Library | None = installed_library()
if LIBRARY == "tensorrt":
    import tensorrt as trt
elif LIBRARY == "tensorrt_rtx":  # the TensorRT 11 API under another module name (either of its two)
    trt = importlib.import_module(str(installed_module()))  # type: ignore[assignment]
else:  # an ONNX Runtime-only install: this module still imports, TensorRT calls raise
    trt = None  # type: ignore[assignment]

METADATA_FORMAT = 2  # 2: library, library_version and compute_capabilities (1 had tensorrt_version)


def plan_metadata_path(plan_path: str | Path) -> Path:
    """Where the metadata of a plan lives: ``rpn.plan`` -> ``rpn.plan.json``."""
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + ".json")


def check_plan_metadata(
    metadata: Mapping[str, Any],
    *,
    plan_sha256: str,
    library: Library,
    library_version: str,
    compute_capability: str | None,
    expected_digest: str | None = None,
    expected_precision: str | None = None,
    expected_tf32: bool | None = None,
    plan_name: str = "plan",
    expected_onnx_sha256: str | None = None,
) -> None:
    """Raise ModelDirError naming every way a plan does not fit this machine, config or request.

    Runs without TensorRT (it only reads the metadata), so the refusal logic is testable anywhere.
    ``compute_capability`` is this GPU's; the plan must list it among those it was built for (None: no GPU to
    check against)."""
    checks: list[tuple[str, object, object, str]] = [  # (what, recorded, wanted, how it came about)
        ("plan checksum", metadata.get("plan_sha256"), plan_sha256, "running"),
        ("library", metadata.get("library"), library, "running"),
        ("library version", metadata.get("library_version"), library_version, "running"),
    ]
    if expected_digest is not None:
        checks.append(("config digest", metadata.get("config_digest"), expected_digest, "running"))
    if expected_precision is not None:
        checks.append(("precision", metadata.get("precision"), expected_precision, "requested"))
    if expected_tf32 is not None and metadata.get("precision") != "fp16":  # TF32 is a setting of fp32 plans only
        checks.append(("tf32", metadata.get("tf32"), expected_tf32, "requested"))
    if expected_onnx_sha256 is not None:  # a plan copied in from another build would run other weights
        recorded = metadata.get("onnx_sha256") or "no record (a plan built before plans recorded their graph)"
        checks.append(("ONNX graph sha256", recorded, expected_onnx_sha256, "the model dir holds"))
    problems = [f"{what}: built for {built!r}, {how} {now!r}" for what, built, now, how in checks if built != now]
    built_for = metadata.get("compute_capabilities")
    if compute_capability is not None and not (isinstance(built_for, list) and compute_capability in built_for):
        problems.append(f"GPU compute capability: built for {built_for!r}, running {compute_capability!r}")
    if problems:
        raise ModelDirError(f"{plan_name} does not match this setup ({'; '.join(problems)}). Note: {REBUILD_HINT}")


def read_plan(plan_path: Path) -> tuple[bytes, dict[str, Any]]:
    """A plan's bytes and its metadata, or a ModelDirError with the rebuild command."""
    if not plan_path.is_file():
        raise ModelDirError(f"TensorRT plan not found: {safe_repr(plan_path)}. Note: {REBUILD_HINT}")
    _require_metadata_file(plan_path)
    try:  # read bounded: a plan swapped for a huge file is refused by its size, not read whole
        plan = read_regular_file(plan_path, max_bytes=MAX_GRAPH_BYTES, what="TensorRT plan")
    except InputError as exc:
        raise ModelDirError(f"{exc}. Note: {REBUILD_HINT}") from None
    return plan, read_plan_metadata(plan_path)


def read_plan_metadata(plan_path: Path) -> dict[str, Any]:
    """A plan's metadata (``plan_metadata_path``), or a ModelDirError with the rebuild command."""
    meta_path = _require_metadata_file(plan_path)
    try:  # read bounded, as the plan is
        metadata = loads_json(read_regular_file(meta_path, max_bytes=MAX_METADATA_BYTES, what="plan metadata")
                              .decode("utf-8"))
    except InputError as exc:
        raise ModelDirError(f"{exc}. Note: {REBUILD_HINT}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8 or JSON, a key twice, an overlong number, nested too deep
        raise ModelDirError(f"Cannot read {safe_repr(meta_path)}: {one_line(exc, 200)}. Note: {REBUILD_HINT}") from None
    if not isinstance(metadata, dict):
        raise ModelDirError(f"{safe_repr(meta_path)} is not a metadata object. Note: {REBUILD_HINT}")
    return metadata


def _require_metadata_file(plan_path: Path) -> Path:
    """The path of a plan's metadata, or a ModelDirError where there is none."""
    meta_path = plan_metadata_path(plan_path)
    if not meta_path.is_file():
        raise ModelDirError(f"Metadata of {escape_text(plan_path.name)} not found: {safe_repr(meta_path)}. "
                            f"Note: {REBUILD_HINT}")
    return meta_path


def check_plan_file(plan_path: Path, expected_onnx_sha256: str | None = None) -> CheckedFile | None:
    """Refuse (ModelDirError) a plan that is not whole (its bytes are not those its metadata records), not of this
    library and version, or (``expected_onnx_sha256``) not of that graph: what can be told of a plan without a GPU,
    as of a cache entry before it is used. Returns the bytes found whole, for the engine that opens the plan
    (``ModelDir.checked_files``), which then neither reads nor hashes them again (~25 ms for a 25 MB plan); None where
    the file could not be looked at before its read."""
    identity = file_identity(plan_path)  # before the read: a file replaced meanwhile is not taken for these bytes
    plan, metadata = read_plan(plan_path)
    digest = hashlib.sha256(plan).hexdigest()
    check_plan_metadata(metadata, plan_sha256=digest, library=library(), library_version=trt.__version__,
                        compute_capability=None, plan_name=plan_path.name, expected_onnx_sha256=expected_onnx_sha256)
    return CheckedFile(identity, plan, digest) if identity is not None else None


def plan_to_open(plan_path: Path, checked: CheckedFile | None = None) -> tuple[bytes, dict[str, Any], str]:
    """A plan's bytes, its metadata and the bytes' sha256, as an engine opens it: the bytes ``check_plan_file`` found
    whole (``checked``, handed over by ``ModelDir.take_checked_files`` while the file is still the one they were read
    from), else read (and hashed) here."""
    if checked is not None:
        return checked.data, read_plan_metadata(plan_path), checked.sha256
    plan, metadata = read_plan(plan_path)
    return plan, metadata, hashlib.sha256(plan).hexdigest()


class TensorRTEngine(Engine):
    """A TensorRT plan with one execution context, bound by tensor name to the pipeline's buffers; ``checked``: the
    plan's bytes as ``check_plan_file`` found them whole, taken by the first load in place of reading the file."""

    backend: Backend = "tensorrt"

    def __init__(self, path: str | Path, options: TrtOptions | None = None, checked: CheckedFile | None = None) -> None:
        super().__init__(path, "cuda")
        self._checked = checked
        self.options = options or TrtOptions()
        self.device_id = self.options.device_id
        self.metadata: dict[str, Any] = {}
        self._engine: trt.ICudaEngine | None = None
        self._context: trt.IExecutionContext | None = None
        self._shapes_checked = False

    def _load(self) -> list[TensorSpec]:
        require_tensorrt()
        require_gpu(self.file_name)
        checked, self._checked = self._checked, None
        plan, metadata, plan_sha256 = plan_to_open(self.path, checked)
        _use_device(self.device_id)
        capability = gpu_identity(self.device_id)[1]
        require_runnable(capability)
        check_plan_metadata(
            metadata,
            plan_sha256=plan_sha256,
            library=library(),
            library_version=trt.__version__,
            compute_capability=capability,
            expected_digest=self.options.config_digest,
            expected_precision=self.options.precision,
            expected_tf32=self.options.tf32,
            plan_name=self.file_name,
            expected_onnx_sha256=self.options.onnx_sha256,
        )
        engine = trt.Runtime(_logger()).deserialize_cuda_engine(plan)
        if engine is None:
            raise ModelDirError(f"TensorRT could not deserialize {safe_repr(self.path)}. Note: {REBUILD_HINT}")
        context = engine.create_execution_context()
        if context is None:
            raise BackendError(f"TensorRT could not create an execution context for {self.file_name} (device memory?)")
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
                    f"of {self.file_name}. Note: Expected {lo} <= shape <= {hi}; {REBUILD_HINT} and a larger profile"
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
            raise BackendError(f"TensorRT execute_async_v3 failed for {self.file_name}; the TensorRT log says why")

    def _check_output_shapes(self) -> None:
        """Once per change of bindings: every output buffer must have the shape TensorRT will write."""
        assert self._context is not None
        unresolved = self._context.infer_shapes()
        if unresolved:
            raise BackendError(f"{self.file_name}: TensorRT cannot infer shapes; unspecified: {unresolved}")
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


def require_gpu(plan_name: str) -> None:
    """Refuse, in one line, a plan where the NVIDIA driver shows no GPU: CuPy's absence (or its CUDA error, where it
    is installed) would say nothing of the one fix, the CPU path."""
    if not gpu_visible():
        raise BackendError(f"{escape_text(plan_name)}: TensorRT plans run on an NVIDIA GPU, and this machine shows none "
                           f"(no {describe_probes()}). Note: run the model dir's ONNX graphs on the CPU "
                           "(--device cpu or auto; Python: device='cpu' or 'auto')")


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
    """Raise unless a TensorRT library imports; say once when it is TensorRT for RTX."""
    library()


def library() -> Library:
    """The library this backend runs (raises when none is installed, or an installed one fails to import)."""
    if LIBRARY is None:
        raise BackendError(unavailable_reason())
    if LIBRARY == "tensorrt_rtx":
        _say_rtx_once()
    return LIBRARY


def unrunnable_reason(device_id: int = 0) -> str | None:
    """Why this backend's library cannot run plans on GPU ``device_id`` (``auto`` then skips it); None if it can."""
    return library_unsupported_reason(library(), gpu_identity(device_id)[1])


def require_runnable(compute_capability: str) -> None:
    """Refuse, in one line, a library that cannot run plans on a GPU of ``compute_capability`` (before TensorRT says it
    worse), or none installed. The refusal alone: the notice of TensorRT for RTX would name its GPUs a second time."""
    refusal = None if LIBRARY is None else unsupported_gpu_refusal(LIBRARY, compute_capability)
    if refusal is not None:
        raise BackendError(refusal)
    library()


def require_runnable_on(device_id: int) -> None:
    """``require_runnable`` for GPU ``device_id``: ``from_checkpoint`` asks it before it builds plans (minutes), which
    the engine would only refuse once they are built."""
    require_runnable(gpu_identity(device_id)[1])


@functools.lru_cache(maxsize=None)
def _say_rtx_once() -> None:
    warnings.warn(f"{library_state('tensorrt')}; the tensorrt backend uses {LIBRARY_TITLES['tensorrt_rtx']} "
                  f"{trt.__version__}, whose plans run on compute capability {'/'.join(RTX_COMPUTE_CAPABILITIES)} "
                  "only", LibraryNotice, stacklevel=4)


#: TensorRT's letter for each severity, as its own logger and trtexec print them.
_SEVERITY_LETTERS = "FEWIV"  # INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE


@functools.lru_cache(maxsize=None)
def _logger() -> trt.ILogger:
    """One TensorRT logger per process, as TensorRT recommends: its warnings and errors on stderr, above the
    ``error:`` line of a build they explain (TensorRT's own ``Logger`` prints them on stdout, which a run's output
    may be redirected to, away from that line), as trtexec users find its diagnostics."""

    class StderrLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            level = int(severity)
            if level <= int(trt.ILogger.Severity.WARNING):
                print(f"[TRT] [{_SEVERITY_LETTERS[level]}] {msg}", file=sys.stderr, flush=True)

    return StderrLogger()


def _spec(engine: trt.ICudaEngine, name: str) -> TensorSpec:
    is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
    dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
    return TensorSpec(name, _shape(engine.get_tensor_shape(name)), dtype, is_input)


def _shape(dims: trt.Dims) -> Shape:
    """A Dims as a tuple of ints (Dims indexes like a tuple but does not declare iteration)."""
    return tuple(int(dims[i]) for i in range(len(dims)))
