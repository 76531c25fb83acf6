"""CUDA driver calls CuPy does not expose, through ctypes on libcuda (which CuPy has loaded).

An event record during stream capture only orders work inside the graph; recorded with
``CU_EVENT_RECORD_EXTERNAL`` it becomes a node of the graph, so every replay records the event and
per-stage GPU times come from one graph launch with no host call between the stages. A 32-bit memset
sets a frame's header counts on the device without a host-to-device copy."""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

_RECORD_EXTERNAL = 0x1  # CU_EVENT_RECORD_EXTERNAL


@cache
def _driver() -> Any:
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuEventRecordWithFlags.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
    driver.cuMemsetD32Async.argtypes = (ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
    for call in (driver.cuEventRecordWithFlags, driver.cuMemsetD32Async):
        call.restype = ctypes.c_int
    return driver


def record_in_graph(event: Any, stream: Any) -> None:
    """Record CuPy ``event`` on CuPy ``stream``, which is capturing, as an event-record node."""
    status = _driver().cuEventRecordWithFlags(event.ptr, stream.ptr, _RECORD_EXTERNAL)
    if status != 0:
        raise RuntimeError(f"cuEventRecordWithFlags failed with CUDA driver error {status}")


def memset_d32_async(ptr: int, value: int, count: int, stream: Any) -> None:
    """Set ``count`` 32-bit words at device address ``ptr`` to ``value``, enqueued on CuPy ``stream``."""
    status = _driver().cuMemsetD32Async(ptr, value, count, stream.ptr)
    if status != 0:
        raise RuntimeError(f"cuMemsetD32Async failed with CUDA driver error {status}")
