"""Hold a stream busy for a while (``cuda/hold.cu``), so that launches queued behind it are timed as
GPU work: timing a few microseconds of work a launch otherwise measures the host's launch rate."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._launch import compile_kernels, cupy_module, launch_kernel


def hold_stream(stream: Any, milliseconds: float) -> None:
    """Enqueue a single-thread spin of about ``milliseconds`` (at the SM clock) on ``stream``."""
    cp = cupy_module()
    kernel = compile_kernels("hold.cu", (), ("hold_stream",))["hold_stream"]
    khz = int(cp.cuda.Device().attributes.get("ClockRate", 2_000_000))  # kHz; a guess where CUDA no longer reports it
    launch_kernel(kernel, 1, 1, (np.int64(milliseconds * khz),), stream)
