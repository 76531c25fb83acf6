"""Engine backends behind one interface; each backend module is imported only when an engine is opened.

``import onnxruntime`` happens only in :mod:`.onnxruntime`, ``import tensorrt`` (or TensorRT for RTX's
``tensorrt_rtx_bindings``) only in :mod:`.tensorrt_library`'s probe, :mod:`.tensorrt` and
:mod:`.tensorrt_build`, and ``import cudnn`` only in :mod:`.cudnn`, so each backend works without the
others installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from ..errors import BackendError
from ..graph_io import MAX_BATCH
from .availability import cudnn_available, onnxruntime_cuda_available, tensorrt_available
from .base import Backend, Device, Engine, Shape, TensorSpec
from .options import CudnnOptions, OrtOptions, TrtOptions

EngineOptions = Union[OrtOptions, TrtOptions, CudnnOptions]

_SUFFIX_BACKENDS: dict[str, Backend] = {
    ".onnx": "onnxruntime",
    ".plan": "tensorrt",
    ".engine": "tensorrt",
}


def backend_for(path: str | Path) -> Backend:
    """The backend a file is for, from its suffix (.onnx -> ONNX Runtime, .plan/.engine -> TensorRT)."""
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIX_BACKENDS:
        raise BackendError(
            f"Cannot tell the backend of {Path(path).name}. "
            f"Note: Expected a suffix in {sorted(_SUFFIX_BACKENDS)} or an explicit backend"
        )
    return _SUFFIX_BACKENDS[suffix]


def open_engine(
    path: str | Path,
    options: EngineOptions | None = None,
    *,
    device: Device = "cuda",
    stream_ptr: int = 0,
) -> Engine:
    """Open (and activate) an engine; the backend module is imported here, not before.

    The type of ``options`` picks the backend (``OrtOptions`` -> ONNX Runtime, ``TrtOptions`` ->
    TensorRT, ``CudnnOptions`` -> the cuDNN frontend RPN, opened on a model dir's ``rpn.onnx``); without
    options the file suffix does, with each backend's defaults. ``stream_ptr`` is the pipeline's CUDA
    stream: ONNX Runtime fixes its compute stream when the session is created.
    """
    backend = backend_for(path) if options is None else _backend_of(options)
    if (backend == "tensorrt") != (backend_for(path) == "tensorrt"):
        raise BackendError(f"{Path(path).name}: {type(options).__name__} cannot open this file. "
                           "Note: TensorRT opens .plan/.engine files, the other backends ONNX graphs")
    if backend == "onnxruntime":
        from .onnxruntime import OnnxRuntimeEngine

        ort_options = options if isinstance(options, OrtOptions) else OrtOptions()
        engine: Engine = OnnxRuntimeEngine(path, device=device, stream_ptr=stream_ptr, options=ort_options)
    elif isinstance(options, CudnnOptions):
        if device != "cuda":
            raise BackendError(f"cuDNN runs on CUDA only; received device={device!r}. Note: use OrtOptions")
        from .cudnn import CudnnEngine

        engine = CudnnEngine(path, options=options)
    else:
        if device != "cuda":
            raise BackendError(f"TensorRT runs on CUDA only; received device={device!r}. Note: use OrtOptions")
        from .tensorrt import TensorRTEngine

        engine = TensorRTEngine(path, options if isinstance(options, TrtOptions) else TrtOptions())
    return engine.activate()


def engine_options_for(backend: str, *, device_id: int, tf32: bool, precision: str,
                       config_digest: str, max_batch: int = 1) -> EngineOptions:
    """The options the GPU pipeline opens a backend's engines with: every request (GPU, TF32, batch, and
    what a prebuilt plan must match) reaches the backend that serves it."""
    if backend == "cudnn":
        cudnn_precision = "fp16" if precision == "fp16" else "tf32" if tf32 else "fp32"
        return CudnnOptions(device_id=device_id, precision=cudnn_precision, config_digest=config_digest,
                            max_batch=max(max_batch, MAX_BATCH))
    if backend == "tensorrt":
        return TrtOptions(device_id=device_id, config_digest=config_digest, precision=precision, tf32=tf32)
    if backend == "onnxruntime":
        return OrtOptions(device_id=device_id, tf32=tf32)
    raise BackendError(f"Unknown backend {backend!r}. Note: Expected 'onnxruntime', 'tensorrt' or 'cudnn'")


def _backend_of(options: object) -> Backend:
    if isinstance(options, OrtOptions):
        return "onnxruntime"
    if isinstance(options, TrtOptions):
        return "tensorrt"
    if isinstance(options, CudnnOptions):
        return "cudnn"
    raise BackendError(f"Unknown engine options {type(options).__name__}. "
                       "Note: Expected OrtOptions, TrtOptions or CudnnOptions")


__all__ = [
    "Backend", "CudnnOptions", "Device", "Engine", "EngineOptions", "OrtOptions", "Shape", "TensorSpec", "TrtOptions",
    "backend_for", "cudnn_available", "engine_options_for",
    "onnxruntime_cuda_available", "open_engine", "tensorrt_available",
]
