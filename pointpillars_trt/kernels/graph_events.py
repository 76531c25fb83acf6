"""Event records inside a captured CUDA graph.

A plain event record during stream capture only orders work inside the graph; recorded with
``CU_EVENT_RECORD_EXTERNAL`` it becomes a node of the graph, so every replay records the event and
per-stage GPU times come from one graph launch with no host call between the stages."""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

_RECORD_EXTERNAL = 0x1  # CU_EVENT_RECORD_EXTERNAL


@cache
def _record_with_flags() -> Any:
    driver = ctypes.CDLL("libcuda.so.1")  # already loaded by CuPy wherever a graph is captured
    record = driver.cuEventRecordWithFlags
    record.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
    record.restype = ctypes.c_int
    return record


def record_in_graph(event: Any, stream: Any) -> None:
    """Record CuPy ``event`` on CuPy ``stream``, which is capturing, as an event-record node."""
    status = _record_with_flags()(event.ptr, stream.ptr, _RECORD_EXTERNAL)
    if status != 0:
        raise RuntimeError(f"cuEventRecordWithFlags failed with CUDA driver error {status}")
