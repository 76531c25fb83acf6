"""Which engine backends can run here, asked without importing more than each question needs."""

from __future__ import annotations


def tensorrt_available() -> bool:
    """True when the real TensorRT imports (``tensorrt-stubs`` alone also imports, with no Builder)."""
    try:
        import tensorrt
    except ImportError:
        return False
    return hasattr(tensorrt, "Builder")


def onnxruntime_cuda_available() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def cudnn_available() -> bool:
    """True when the cuDNN frontend engine can run here (frontend, cuDNN >= 9.5, CuPy, a GPU)."""
    from .cudnn import cudnn_unavailable_reason

    return cudnn_unavailable_reason() is None
