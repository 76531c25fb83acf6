"""A multi-sweep frame's time lags summarised on the GPU (``cuda/time_lags.cu``) for the input check of a frame
given there: one launch and one small read instead of a CuPy reduction a value (each a launch and its host
overhead: ~0.38 ms for the check of a 300k-point frame)."""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np

from ..staging import empty_pinned
from ._launch import compile_kernels, launch_kernel

_BLOCK = 256
_MAX_BLOCKS = 64  # partials the host reduces: enough blocks to stream a frame's lags at a good rate
_ROWS_A_THREAD = 16


def lag_partials(points: Any, step: int, sample_size: int, stream: Any) -> tuple[float, float, int, np.ndarray]:
    """The minimum and maximum of the 5th values of ``points`` (a CuPy (N, >= 5) float32 array, any strides)
    that are no NaN (inf, -inf where there is none), their count of NaN, and every ``step``-th of them (NaN
    past the frame's end, ``sample_size`` values), worked out on ``stream`` and read back in one copy, which
    waits for the work queued there before it. The kernel's output and the page-locked memory it is read into
    are this thread's, made once a GPU and sample size: no allocation a frame."""
    import cupy as cp

    rows = int(points.shape[0])
    blocks = max(1, min(_MAX_BLOCKS, -(-rows // (_BLOCK * _ROWS_A_THREAD))))
    device_id = int(points.device.id)
    out, host = _buffers(device_id, sample_size)
    row_stride, column_stride = (s // points.itemsize for s in points.strides)
    args = (points, np.int64(row_stride), np.int64(column_stride), np.int64(rows), np.int64(step),
            np.int32(sample_size), out, out[3 * _MAX_BLOCKS:])
    launch_kernel(_kernel(device_id), blocks, _BLOCK, args, stream)
    cp.cuda.runtime.memcpyAsync(host.ctypes.data, out.data.ptr, host.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                stream.ptr)  # the blocks' partials, then (at 3 * _MAX_BLOCKS) the sample: ~3 KB
    stream.synchronize()
    partials = host[: 3 * blocks].reshape(blocks, 3)
    return (float(partials[:, 0].min()), float(partials[:, 1].max()), int(partials[:, 2].sum()),
            host[3 * _MAX_BLOCKS:].copy())


_THREAD_BUFFERS = threading.local()


def _buffers(device_id: int, sample_size: int) -> tuple[Any, np.ndarray]:
    """This thread's kernel output on GPU ``device_id`` (room for ``_MAX_BLOCKS`` blocks' partials and the sample)
    and the page-locked array it is read into: a thread's checks run one after another, each read back before it
    returns, so one pair serves them all; other threads checking frames at once have their own."""
    import cupy as cp

    made: dict[tuple[int, int], tuple[Any, np.ndarray]] = _THREAD_BUFFERS.__dict__.setdefault("made", {})
    key = (device_id, sample_size)
    if key not in made:
        with cp.cuda.Device(device_id):
            made[key] = (cp.empty(3 * _MAX_BLOCKS + sample_size, np.float32),
                         empty_pinned((3 * _MAX_BLOCKS + sample_size,), np.float32))
    return made[key]


@functools.lru_cache(maxsize=None)
def _kernel(device_id: int) -> Any:
    """The kernel, looked up once a GPU rather than at every frame's check (``compile_kernels`` masks the stop
    signals and fetches the function at each call)."""
    import cupy as cp

    with cp.cuda.Device(device_id):
        return compile_kernels("time_lags.cu", (), ("lag_partials",))["lag_partials"]
