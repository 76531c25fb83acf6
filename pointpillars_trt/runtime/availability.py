"""Which engine backends can run here, asked without importing more than each question needs.

Each ``*_unavailable_reason`` is a backend's probe in the registry (``backends.py``): None when the
backend can run in the GPU pipeline here, else one line naming what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

#: A file that exists where the NVIDIA driver sees a GPU, or files that all must.
GpuProbe = str | os.PathLike[str] | tuple[str | os.PathLike[str], ...]

#: What the NVIDIA driver shows where it sees a GPU, whatever Python packages are installed. Linux:
#: its device node or its /proc file. WSL2 has neither: a GPU of any vendor appears there as
#: /dev/dxg, so it counts only with the CUDA driver library that NVIDIA's Windows driver maps in.
GPU_PROBES: tuple[GpuProbe, ...] = ("/dev/nvidia0", "/proc/driver/nvidia/version",
                                    ("/dev/dxg", "/usr/lib/wsl/lib/libcuda.so.1"))


def gpu_visible(probes: Sequence[GpuProbe] = GPU_PROBES) -> bool:
    """True when the NVIDIA driver shows a GPU here (every file of one of ``probes`` exists)."""
    return any(all(os.path.exists(f) for f in _probe_files(p)) for p in probes)


def describe_probes() -> str:
    """GPU_PROBES as a message names what was looked for: "A, B or C with D"."""
    *rest, last = [" with ".join(os.fspath(f) for f in _probe_files(p)) for p in GPU_PROBES]
    return f"{', '.join(rest)} or {last}" if rest else last


def _probe_files(probe: GpuProbe) -> tuple[str | os.PathLike[str], ...]:
    return (probe,) if isinstance(probe, (str, os.PathLike)) else probe


def tensorrt_available() -> bool:
    """True when a TensorRT library imports: TensorRT 10/11, or else TensorRT for RTX."""
    from .tensorrt_library import installed_library

    return installed_library() is not None


def tensorrt_unavailable_reason() -> str | None:
    from .tensorrt_library import unavailable_reason

    return None if tensorrt_available() else unavailable_reason()


def onnxruntime_cuda_unavailable_reason() -> str | None:
    from .ort_telemetry import quiet_telemetry

    quiet_telemetry()
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed (pip install onnxruntime-gpu)"
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


def cudnn_unavailable_reason() -> str | None:
    from .cudnn import cudnn_unavailable_reason as reason

    return reason()
