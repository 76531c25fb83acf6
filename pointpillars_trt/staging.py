"""The packed input of a batch: the host rows the GPU pipeline copies to the device in ONE copy.

Layout: ``HEADER_ROWS`` rows holding a (point count, first point row) int32 pair per frame, then the
frames' (x, y, z, intensity) float32 rows. Frames are placed by a bump allocator, so reader threads
can read files straight into the buffer (pinned memory on a GPU machine) while others do the same;
the header is written when the batch is submitted. A model with a time column (multi-sweep frames)
also has ``times``: each point row's time lag, beside the rows (the voxelizer reads float4 rows), a
second copy of the batch.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from .config import int_within, next_power_of_two
from .errors import one_line
from .graph_io import MAX_BATCH
from .pointcloud_io import Allocate
from .points import copy_leading_columns, is_frame_path

#: Header rows: (count, first row) int32 pairs of up to MAX_BATCH frames, four int32 a row.
HEADER_ROWS = -(-2 * MAX_BATCH // 4)
#: Point rows a batch's staging buffer starts with, per frame, unless the frames' sizes say more (it
#: grows to the largest batch seen).
INITIAL_POINTS_PER_FRAME = 32_768
#: Frames whose file sizes ``likely_points_per_frame`` looks at.
SIZE_SAMPLE = 16
#: A 128-beam scan's points: what the GPU pipeline's point buffers hold at first, and the most points a frame
#: that ``likely_points_per_frame`` reports; larger frames grow the buffers when they come.
LARGE_SCAN_POINTS = 262_144

#: Reads a frame (a path, or an array) into the rows ``allocate`` gives (see ``read_points_into``).
ReadFrame = Callable[[object, Allocate], np.ndarray]


def likely_points_per_frame(items: Sequence[object], point_dim: int) -> int | None:
    """The most points among the first ``.bin`` files of a run (from their sizes: no read), so that the
    staging buffers (and, for ``infer``, the GPU pipelines) are sized for the run's frames before it starts
    (a full KITTI scan is ~6x a camera crop: growing them on the first batches costs a recapture in each
    pipeline); None when none of the first items is a local ``.bin`` file."""
    if int_within(point_dim, 1) is None:
        return None  # the reads refuse it, each with its error
    sizes = []
    for item in itertools.islice(items, SIZE_SAMPLE):  # any sequence, sliceable or not
        try:
            name = os.fsdecode(item) if is_frame_path(item) else ""
        except Exception:  # noqa: BLE001 - a path-like that misbehaves: its own read says so
            continue
        if name.lower().endswith(".bin") and "://" not in name:
            try:
                sizes.append(os.stat(name).st_size // (4 * point_dim))
            except (OSError, ValueError):  # ValueError: a NUL in the name
                continue  # the frame's own read says what is wrong with it
    return min(max(sizes), LARGE_SCAN_POINTS) if sizes else None


def empty_pinned(shape: tuple[int, ...], dtype: type | np.dtype) -> np.ndarray:
    """An uninitialised array in page-locked host memory from CuPy's pinned pool: what ``cupyx.empty_pinned``
    does, without the trip through ``cupyx`` that imported SciPy at a model's first open (~0.5 s, CuPy 14)."""
    import cupy

    dtype = np.dtype(dtype)
    memory = cupy.cuda.alloc_pinned_memory(math.prod(shape) * dtype.itemsize)
    return np.ndarray(shape, dtype, buffer=memory)


class PageLockedOrOrdinary:
    """``StagingBuffer``'s allocator: page-locked memory (``page_locked``: CuPy's pinned pool) while it can be had,
    then ordinary memory, which the GPU copies from too, more slowly. Page-locked memory is a resource of its own,
    bounded by the machine's locked-memory limits: where it runs out, a run goes on, and its caller says so once
    (``news``)."""

    def __init__(self, page_locked: Callable[[tuple[int, ...], type], np.ndarray] | None = None) -> None:
        self._page_locked = page_locked
        self.failure: str | None = None  # why page-locked memory could not be had: ordinary memory since
        self._told = False
        self._lock = threading.Lock()

    def __call__(self, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        if self.failure is None:
            try:
                return (self._page_locked or empty_pinned)(shape, dtype)
            except Exception as exc:  # noqa: BLE001 - CuPy's CUDARuntimeError or OutOfMemoryError, a MemoryError
                with self._lock:
                    self.failure = self.failure or one_line(exc)
        return np.empty(shape, dtype)

    def news(self) -> str | None:
        """That page-locked memory could not be had, and why, at the first call since it could not (None otherwise):
        what a caller says once, after its own prefix."""
        with self._lock:
            if self.failure is None or self._told:
                return None
            self._told = True
        return (f"page-locked memory for the frames' staging could not be had ({self.failure}); staging them in "
                "ordinary memory from here on (slower copies to the GPU)")


def rounded_capacity(capacity: int) -> int:
    """The point rows a ``StagingBuffer`` asked for ``capacity`` rows holds: the next power of two."""
    return next_power_of_two(int(capacity))


class StagingBuffer:
    """``capacity`` point rows (rounded up to a power of two) after the header, from ``alloc(shape, dtype)``
    (e.g. :func:`empty_pinned`; default: ordinary host memory); ``columns`` 5 adds ``times``, the rows' time
    lags. The rounding keeps the sizes a long process asks for few: CuPy's pinned pool keeps a freed block
    for a request of its exact size, so buffers of ever new sizes (sized from each run's frames) would
    pile up page-locked memory, call after call."""

    def __init__(self, capacity: int, alloc: Callable[[tuple[int, int], type], np.ndarray] | None = None,
                 columns: int = 4) -> None:
        if columns not in (4, 5):
            raise ValueError(f"columns: 4 or 5 (with time lags), received {columns}")
        capacity = rounded_capacity(capacity)
        allocate = alloc or np.empty
        self._place(allocate((HEADER_ROWS + capacity, 4), np.float32),
                    allocate((capacity, 1), np.float32)[:, 0] if columns == 5 else None)

    @classmethod
    def over(cls, rows: np.ndarray, times: np.ndarray | None) -> StagingBuffer:
        """A buffer on arrays made elsewhere (e.g. another process's shared memory): ``rows`` of header and
        point rows, ``times`` (or None) of one value a point row."""
        buffer = cls.__new__(cls)
        buffer._place(rows, times)
        return buffer

    def _place(self, rows: np.ndarray, times: np.ndarray | None) -> None:
        self.rows = rows
        self.capacity = rows.shape[0] - HEADER_ROWS
        self.columns = 4 if times is None else 5
        self.address = self.rows.ctypes.data  # where the one H2D copy reads (looked up once: ~2 us a call)
        self.header = self.rows[:HEADER_ROWS].view(np.int32).reshape(-1)
        self.points = self.rows[HEADER_ROWS:]
        self.times = times
        self.used = 0
        self._lock = threading.Lock()

    def put(self, start: int, points: np.ndarray) -> None:
        """Copy a frame of ``columns`` values a point into rows ``start`` on (its time lags into ``times``)."""
        n = points.shape[0]
        copy_leading_columns(self.points[start : start + n], points)
        if self.times is not None:
            self.times[start : start + n] = points[:, 4]

    def read_frame(self, read: ReadFrame, item: object) -> tuple[np.ndarray, int | None]:
        """``read(item, allocate)`` into this buffer's rows (from several threads at once): the frame's points
        and their first row here, or None when they are not here (no room left: an array of their own).
        A frame the read gives as an array of its own (a model with time lags) is copied in."""
        rows: np.ndarray | None = None  # the rows the read was given
        start: int | None = None
        asked = False

        def allocate(count: int) -> np.ndarray | None:
            nonlocal rows, start, asked
            asked = True
            start = self.allocate(count)
            rows = None if start is None else self.points[start : start + count]
            return rows

        points = read(item, allocate)
        if rows is not None and points is not rows:  # the read kept fewer rows (e.g. a crop): back into its place
            if points.shape[0] <= rows.shape[0] and points.shape[1:] == rows.shape[1:]:
                rows[: len(points)] = points
                points = rows[: len(points)]
            else:
                start = None
        elif not asked and self.columns == points.shape[1]:  # read into an array of its own (time lags)
            start = self.allocate(len(points))
            if start is not None:
                self.put(start, points)
        return points, start

    def allocate(self, count: int) -> int | None:
        """The first of ``count`` free point rows (safe from several threads), or None when they do
        not fit."""
        with self._lock:
            if self.used + count > self.capacity:
                return None
            start, self.used = self.used, self.used + count
        return start

    def reset(self) -> None:
        self.used = 0

    def write_header(self, frames: list[tuple[int, int]]) -> int:
        """Write the (count, first row) pairs; returns the rows to copy (header + the last frame's end)."""
        if len(frames) > MAX_BATCH:
            raise ValueError(f"{len(frames)} frames: at most {MAX_BATCH} a batch")
        pairs = np.asarray(frames, np.int32).reshape(-1)
        self.header[: pairs.size] = pairs
        return HEADER_ROWS + max((start + count for count, start in frames), default=0)
