"""Which engine backends can run here, asked without importing more than each question needs."""

from __future__ import annotations


def tensorrt_available() -> bool:
    """True when a TensorRT library imports: TensorRT 10/11, or else TensorRT for RTX."""
    from .tensorrt_library import installed_library

    return installed_library() is not None


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
