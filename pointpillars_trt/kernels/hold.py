"""Hold a stream busy for a while (``cuda/hold.cu``), so that launches queued behind it are timed as
GPU work: timing a few microseconds of work a launch otherwise measures the host's launch rate."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ._launch import compile_kernels, cupy_module, launch_kernel


_GUESSED_CLOCK_KHZ = 2_000_000  # where the device reports no SM clock rate


@functools.cache
def _clock_khz(device_id: int) -> int:
    rate = int(cupy_module().cuda.Device(device_id).attributes.get("ClockRate", 0))
    return rate if rate > 0 else _GUESSED_CLOCK_KHZ


def hold_stream(stream: Any, milliseconds: float) -> None:
    """Enqueue a single-thread spin of about ``milliseconds`` (at the SM clock) on ``stream``."""
    cp = cupy_module()
    kernel = compile_kernels("hold.cu", (), ("hold_stream",))["hold_stream"]
    cycles = np.int64(milliseconds * _clock_khz(cp.cuda.Device().id))
    launch_kernel(kernel, 1, 1, (cycles,), stream)


def gpu_ms(run: Callable[[], object], stream: Any, *, iterations: int, rounds: int = 3, hold_ms: float = 1.0) -> float:
    """GPU ms of one ``run()`` (which enqueues on ``stream``): the best of ``rounds`` rounds of
    ``iterations``, each queued behind ``hold_ms`` of held stream."""
    cp = cupy_module()
    best = float("inf")
    for _ in range(rounds):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        hold_stream(stream, hold_ms)
        start.record(stream)
        for _ in range(iterations):
            run()
        stop.record(stream)
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / iterations)
    return best
