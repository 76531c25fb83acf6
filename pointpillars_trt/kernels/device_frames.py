"""A frame given on the GPU copied into the pipeline's input buffers (``cuda/device_frames.cu``): its rows
whatever their strides, its time lags where the model takes them, and its header pair, in one launch. CuPy's
strided copies and fills took a launch each, with its host overhead (a multi-sweep frame: four)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from ._launch import compile_kernels, grid_blocks, launch_kernel, multiprocessors

_BLOCK = 256
_BLOCKS_AN_SM = 4


class DeviceFrameCopy:
    """Copies of frames given on the GPU into a pipeline's input buffers: ``rows`` (capacity, 4) float32,
    ``times`` (capacity,) float32 or None (no time column), ``header`` the int32 (count, first row) pairs of
    a batch's frames (the pipeline's, passed at each launch: it reallocates them as frames grow)."""

    def __init__(self) -> None:
        self._kernel = compile_kernels("device_frames.cu", (), ("stage_device_frame",))["stage_device_frame"]
        self._max_blocks = multiprocessors() * _BLOCKS_AN_SM

    def launch(self, frame: Any, rows: Any, times: Any, header: Any, index: int, start: int, stream: Any) -> None:
        """Enqueue on ``stream`` the copy of ``frame`` (a CuPy (N, >= 4) float32 array, >= 5 columns where
        there are ``times``; any strides) to rows ``start..start + N`` and the header pair of the batch's
        frame ``index``."""
        count = int(frame.shape[0])
        columns = 4 if times is None else 5
        if frame.ndim != 2 or frame.shape[1] < columns or frame.dtype != np.float32:
            raise InputError(f"frame: expected (N, >= {columns}) float32, got {frame.shape} {frame.dtype}")
        if not (0 <= start and start + count <= rows.shape[0] and 0 <= index < header.shape[0] // 2):
            raise InputError(f"frame {index} of {count} points at row {start}: outside the input buffers")
        row_stride, column_stride = (s // frame.itemsize for s in frame.strides)
        blocks = min(grid_blocks(count, _BLOCK), self._max_blocks)
        launch_kernel(self._kernel, blocks, _BLOCK,
                      (frame, np.int64(row_stride), np.int64(column_stride), np.int64(count), rows,
                       rows if times is None else times, np.int32(times is not None), header, np.int32(index),
                       np.int64(start)), stream)
