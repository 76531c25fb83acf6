"""Engine backends behind one interface and one registry (:mod:`.backends`); each backend module is
imported only when an engine is opened.

``import onnxruntime`` happens only in :mod:`.onnxruntime` and :mod:`.availability`'s probe (each after
:mod:`.ort_telemetry` has turned ONNX Runtime's telemetry off where its import would warn),
``import tensorrt`` (or TensorRT for RTX's ``tensorrt_rtx_bindings`` or ``tensorrt_rtx``) only in
:mod:`.tensorrt_library`'s probe, :mod:`.tensorrt` and :mod:`.tensorrt_build`, and ``import cudnn`` only in
:mod:`.cudnn`, so each backend works without the others installed.
"""

from __future__ import annotations


from .availability import cudnn_unavailable_reason, onnxruntime_cuda_unavailable_reason, tensorrt_available
from .backends import (
    BACKEND_CHOICES, BACKEND_NAMES, BACKENDS, EngineRequest, engine_file, engine_options_for,
    open_engine, pick_backend,
)
from .base import Backend, Device, Engine, Shape, TensorSpec
from .options import CudnnOptions, OrtOptions, TrtOptions

__all__ = [
    "BACKENDS", "BACKEND_CHOICES", "BACKEND_NAMES", "Backend", "CudnnOptions", "Device", "Engine",
    "EngineRequest", "OrtOptions", "Shape", "TensorSpec", "TrtOptions",
    "cudnn_unavailable_reason", "engine_file", "engine_options_for",
    "onnxruntime_cuda_unavailable_reason", "open_engine", "pick_backend", "tensorrt_available",
]
