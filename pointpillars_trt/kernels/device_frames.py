"""A frame given on the GPU copied into the pipeline's input buffers (``cuda/device_frames.cu``): its rows
whatever their strides, its time lags where the model takes them, and its header pair, in one launch. CuPy's
strided copies and fills took a launch each, with its host overhead (a multi-sweep frame: four)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError, counted
from ._launch import compile_kernels, grid_blocks, launch_kernel, multiprocessors

_BLOCK = 256
_BLOCKS_AN_SM = 4
_INT32_MAX = 2**31 - 1  # the header pair is int32, as the voxelizer reads it


class DeviceFrameCopy:
    """Copies of frames given on the GPU into a pipeline's input buffers: ``rows`` (capacity, 4) float32 in C
    order (16-byte rows: the kernel stores a row at once), ``times`` (capacity,) float32 or None (no time column),
    ``header`` the int32 (count, first row) pairs of a batch's frames (the pipeline's, passed at each launch: it
    reallocates them as frames grow). Built with the pipeline, on its device: no frame pays the compile."""

    def __init__(self) -> None:
        self._kernel = compile_kernels("device_frames.cu", (), ("stage_device_frame",))["stage_device_frame"]
        self._max_blocks = multiprocessors() * _BLOCKS_AN_SM

    def launch(self, frame: Any, rows: Any, times: Any, header: Any, index: int, start: int, stream: Any) -> None:
        """Enqueue on ``stream`` the copy of ``frame`` (a CuPy (N, >= 4) float32 array, >= 5 columns where
        there are ``times``; any strides in whole values) to rows ``start..start + N`` and the header pair of
        the batch's frame ``index``."""
        columns = 4 if times is None else 5
        if frame.ndim != 2 or frame.shape[1] < columns or frame.dtype != np.float32 or any(
                s % frame.itemsize for s in frame.strides):
            raise InputError(f"frame: expected (N, >= {columns}) float32 values, got shape {frame.shape}, dtype "
                             f"{frame.dtype}, strides {frame.strides}")
        if not (rows.dtype == np.float32 and rows.ndim == 2 and rows.shape[1] == 4 and rows.flags.c_contiguous
                and rows.data.ptr % 16 == 0 and header.dtype == np.int32
                and (times is None or (times.dtype == np.float32 and times.shape == rows.shape[:1]))):
            raise InputError("rows, times, header: expected the pipeline's (capacity, 4) float32 rows in C order, "
                             "(capacity,) float32 times or None, int32 header pairs")
        count = int(frame.shape[0])
        if not (0 <= start and start + count <= min(rows.shape[0], _INT32_MAX)
                and 0 <= index < header.shape[0] // 2):
            raise InputError(f"frame {index} of {counted(count, 'point')} at row {start}: outside the input buffers")
        row_stride, column_stride = (s // frame.itemsize for s in frame.strides)
        blocks = min(grid_blocks(count, _BLOCK), self._max_blocks)
        launch_kernel(self._kernel, blocks, _BLOCK,
                      (frame, np.int64(row_stride), np.int64(column_stride), np.int64(count), rows,
                       rows if times is None else times, np.int32(times is not None), header, np.int32(index),
                       np.int64(start)), stream)
