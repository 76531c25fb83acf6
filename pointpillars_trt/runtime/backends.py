"""The one registry of engine backends: a new backend is one module plus one row here.

Each row names the backend's options type, its availability probe (None when it can run in the GPU
pipeline here, else one line saying why not), its opener (which imports the backend module only
then), the artefact it loads from a model dir (the ONNX graph or a TensorRT plan), its place in the
``auto`` choice, the label reports and option messages print (``name (what it is)``) and the title of
the ``running on`` line. ``open_engine``, the engine options, the CLI's
``--backend`` choices, the bench rows, the availability checks and the pipeline's backend choice all
read this table.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..config import ModelConfig
from ..errors import BackendError, escape_text
from ..model_dir import CheckedFile, ModelDir
from .availability import cudnn_unavailable_reason, onnxruntime_cuda_unavailable_reason, tensorrt_unavailable_reason
from .base import Device, Engine
from .options import CudnnOptions, OrtOptions, TrtOptions

Artefact = Literal["onnx", "plan"]
AUTO = "auto"


@dataclass(frozen=True)
class EngineRequest:
    """What the pipeline asks of every backend; each row turns it into its own typed options."""

    device_id: int
    tf32: bool
    precision: str  # the model dir's graph precision
    config_digest: str
    graph_sha256: str | None = None  # the model dir's record of the graph the engine is for


@dataclass(frozen=True)
class BackendRow:
    """One backend. ``suits(model)`` says whether ``auto`` should take it for this model dir when it is
    available; ``auto`` tries the rows by ``auto_priority`` (lowest first)."""

    name: str
    label: str
    title: str  # the engine's name in the "running on" line (PointPillars.engine_description)
    options_type: type
    artefact: Artefact
    suffixes: tuple[str, ...]  # engine files it opens when no options say which backend
    devices: tuple[Device, ...]
    unavailable_reason: Callable[[], str | None]
    open: Callable[[Path, Any, Device, int, ModelConfig | None, CheckedFile | None], Engine]
    options_for: Callable[[EngineRequest], Any]
    auto_priority: int
    suits: Callable[[ModelDir], bool]
    #: None when its engines can run on GPU ``device_id``, else why not (``auto`` then skips the row)
    runs_on: Callable[[int], str | None] = lambda device_id: None


def _open_onnxruntime(path: Path, options: OrtOptions, device: Device, stream_ptr: int,
                      config: ModelConfig | None, checked: CheckedFile | None) -> Engine:
    from .onnxruntime import OnnxRuntimeEngine

    return OnnxRuntimeEngine(path, device=device, stream_ptr=stream_ptr, options=options, checked=checked)


def _open_tensorrt(path: Path, options: TrtOptions, device: Device, stream_ptr: int,
                   config: ModelConfig | None, checked: CheckedFile | None) -> Engine:
    from .tensorrt import TensorRTEngine

    return TensorRTEngine(path, options, checked)


def _tensorrt_runs_on(device_id: int) -> str | None:
    from .tensorrt import unrunnable_reason

    return unrunnable_reason(device_id)


def _open_cudnn(path: Path, options: CudnnOptions, device: Device, stream_ptr: int,
                config: ModelConfig | None, checked: CheckedFile | None) -> Engine:
    if config is None:
        raise BackendError(f"{escape_text(path.name)}: the cuDNN engine builds the RPN from the model config. "
                           "Note: pass open_engine(..., config=model_dir.cfg)")
    from .cudnn import CudnnEngine

    return CudnnEngine(path, config, options, checked)


def _cudnn_options(r: EngineRequest) -> CudnnOptions:
    precision = "fp16" if r.precision == "fp16" else "tf32" if r.tf32 else "fp32"
    # batches up to MAX_BATCH (CudnnOptions' default): a pipeline that grows its batch keeps its engine
    return CudnnOptions(device_id=r.device_id, precision=precision, config_digest=r.config_digest,
                        graph_sha256=r.graph_sha256)


BACKENDS: dict[str, BackendRow] = {row.name: row for row in (
    BackendRow("onnxruntime", "onnxruntime (CUDA EP)", "ONNX Runtime (CUDA)", OrtOptions, "onnx", (".onnx",), ("cpu", "cuda"),
               onnxruntime_cuda_unavailable_reason, _open_onnxruntime,
               lambda r: OrtOptions(device_id=r.device_id, tf32=r.tf32, graph_sha256=r.graph_sha256),
               auto_priority=2, suits=lambda model: True),
    BackendRow("tensorrt", "tensorrt (plans)", "TensorRT", TrtOptions, "plan", (".plan", ".engine"), ("cuda",),
               tensorrt_unavailable_reason, _open_tensorrt,
               lambda r: TrtOptions(device_id=r.device_id, config_digest=r.config_digest, precision=r.precision,
                                    tf32=r.tf32, onnx_sha256=r.graph_sha256),
               auto_priority=0, suits=lambda model: model.has_plans(), runs_on=_tensorrt_runs_on),
    # fp32 graphs: the cuDNN engine's TF32 and IEEE fp32 RPNs measured faster than ONNX Runtime's, for
    # single-head models (0.53-0.58 / 2.92 ms against 0.77 / 3.21 on an H200) and multi-head ones (0.90 /
    # 4.98 ms against 2.35 / 6.85 on an H100).
    BackendRow("cudnn", "cudnn (frontend graphs + neck-head kernel)", "cuDNN engine", CudnnOptions, "onnx", (), ("cuda",),
               cudnn_unavailable_reason, _open_cudnn, _cudnn_options,
               auto_priority=1,
               suits=lambda model: True),
)}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
BACKEND_CHOICES: tuple[str, ...] = (AUTO, *BACKEND_NAMES)  # what --backend accepts where the pipeline picks


def backend_row(name: str) -> BackendRow:
    if name not in BACKENDS:
        raise BackendError(f"backend {name!r}: expected one of {', '.join(BACKEND_NAMES)}")
    return BACKENDS[name]


def _row_for_file(path: str | Path) -> BackendRow:
    suffix = Path(path).suffix.lower()
    for row in BACKENDS.values():
        if suffix in row.suffixes:
            return row
    known = sorted(s for row in BACKENDS.values() for s in row.suffixes)
    raise BackendError(f"Cannot tell the backend of {escape_text(Path(path).name)}. "
                       f"Note: Expected a suffix in {known} or an explicit backend")


def backend_of_options(options: object) -> BackendRow:
    for row in BACKENDS.values():
        if isinstance(options, row.options_type):
            return row
    names = ", ".join(row.options_type.__name__ for row in BACKENDS.values())
    raise BackendError(f"Unknown engine options {type(options).__name__}. Note: Expected one of {names}")


def open_engine(path: str | Path, options: object = None, *, device: Device = "cuda", stream_ptr: int = 0,
                config: ModelConfig | None = None, checked: CheckedFile | None = None) -> Engine:
    """Open (and activate) an engine; the backend module is imported here, not before.

    The type of ``options`` picks the backend (each row's options type); without options the file
    suffix does, with that backend's defaults. ``stream_ptr`` is the pipeline's CUDA stream: ONNX
    Runtime fixes its compute stream when the session is created. ``config``: the model config, for
    an engine built from it (cuDNN); no engine opens a model dir itself. ``checked``: the file's bytes as its model
    dir's check found them (``ModelDir.take_checked_files``: a graph against ``model.json``, a plan against its
    metadata), for the engine to take instead of reading the file again.
    """
    row = _row_for_file(path) if options is None else backend_of_options(options)
    if row.artefact != _row_for_file(path).artefact:
        raise BackendError(f"{escape_text(Path(path).name)}: {type(options).__name__} cannot open this file. "
                           "Note: TensorRT opens .plan/.engine files, the other backends ONNX graphs")
    on_device = [r.options_type.__name__ for r in BACKENDS.values() if device in r.devices]
    if on_device and device not in row.devices:  # an unknown device is the engine's to refuse
        raise BackendError(f"{row.name} runs on {' or '.join(row.devices)} only; received device={device!r}. "
                           f"Note: use {' or '.join(on_device)}")
    chosen = options if options is not None else row.options_type()
    return row.open(Path(path), chosen, device, stream_ptr, config, checked).activate()


def engine_file(model: ModelDir, graph: str, backend: str) -> Path:
    """The file ``backend`` loads for ``graph`` of a model dir (the GPU pipeline asks for "rpn" only: its
    PFN is a CUDA kernel; a model dir holds plans of the RPN only)."""
    return model.plan_path(graph) if backend_row(backend).artefact == "plan" else model.onnx_path(graph)


def engine_options_for(backend: str, request: EngineRequest) -> Any:
    """The options the GPU pipeline opens a backend's engines with: every request (GPU, TF32, and what a
    prebuilt plan must match) reaches the backend that serves it."""
    return backend_row(backend).options_for(request)


def pick_backend(model: ModelDir, requested: str, device_id: int = 0) -> str:
    """The backend the GPU pipeline runs: the one named (refused with the reason when it cannot run
    here), or for ``auto`` the first row by priority that suits the model dir and runs here, on GPU
    ``device_id`` too (TensorRT for RTX plans do not run on every GPU). A row that would have suited
    but cannot run is said once."""
    if requested != AUTO:
        if requested not in BACKENDS:
            raise BackendError(f"backend {requested!r}: expected one of {', '.join(BACKEND_CHOICES)}")
        row = BACKENDS[requested]
        reason = row.unavailable_reason()
        if reason is not None:
            raise BackendError(f"backend {row.name}: {reason}")
        return row.name
    skipped: list[str] = []
    for row, reason in gpu_backend_rows(device_id, model):
        if reason is None:
            if skipped:
                _notice_once(f"pointpillars-trt: {'; '.join(skipped)}; using {row.label}")
            return row.name
        skipped.append(f"the {row.name} engine is unavailable ({reason})")
    # nothing runs here: the last resort fails at open with its own reason
    return max(BACKENDS.values(), key=lambda r: r.auto_priority).name


def gpu_backend_rows(device_id: int, model: ModelDir | None = None) -> Iterator[tuple[BackendRow, str | None]]:
    """The rows in ``auto``'s order (those that suit ``model``, when one is given), each with why its engines
    cannot run on GPU ``device_id`` here (None: they can). Each row is probed as it is taken, so a caller that
    stops at the first that runs probes no further."""
    for row in sorted(BACKENDS.values(), key=lambda r: r.auto_priority):
        if model is None or row.suits(model):
            yield row, row.unavailable_reason() or row.runs_on(device_id)


_NOTICES: set[str] = set()


def _notice_once(message: str) -> None:
    if message not in _NOTICES:
        _NOTICES.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)
