"""Which engine backends can run here, asked without importing more than each question needs.

Each ``*_unavailable_reason`` is a backend's probe in the registry (``backends.py``): None when the
backend can run in the GPU pipeline here, else one line naming what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

#: Files that exist where the NVIDIA driver sees a GPU, whatever Python packages are installed.
GPU_PROBES = ("/dev/nvidia0", "/proc/driver/nvidia/version")


def gpu_visible(probes: Sequence[str | os.PathLike[str]] = GPU_PROBES) -> bool:
    """True when the NVIDIA driver shows a GPU here (any of ``probes`` exists)."""
    return any(os.path.exists(p) for p in probes)


def tensorrt_available() -> bool:
    """True when a TensorRT library imports: TensorRT 10/11, or else TensorRT for RTX."""
    from .tensorrt_library import installed_library

    return installed_library() is not None


def tensorrt_unavailable_reason() -> str | None:
    return None if tensorrt_available() else "TensorRT is not importable (pip install tensorrt)"


def onnxruntime_cuda_available() -> bool:
    return onnxruntime_cuda_unavailable_reason() is None


def onnxruntime_cuda_unavailable_reason() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed (pip install onnxruntime-gpu)"
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


def cudnn_available() -> bool:
    """True when the cuDNN frontend engine can run here (frontend, cuDNN >= 9.5, CuPy, a GPU)."""
    return cudnn_unavailable_reason() is None


def cudnn_unavailable_reason() -> str | None:
    from .cudnn import cudnn_unavailable_reason as reason

    return reason()
