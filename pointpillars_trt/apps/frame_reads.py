"""A frame's read into a batch's staging buffer, as the streaming runner does it in a reader thread, and a
whole batch's reads as a reader process does them (``read_batch``: the staging buffer in shared memory,
see ``shared_staging``), each frame's outcome sent back as a few numbers and strings."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import one_line
from ..shared_staging import SharedStagingHandle, attach
from ..staging import ReadFrame, StagingBuffer


class FrameRead(NamedTuple):
    """A frame's read: its points (rows of the staging buffer from ``start``, or an array of their own when
    ``start`` is None), or the one line of error that failed it."""

    points: np.ndarray | None
    start: int | None
    error: str | None


def read_into(read: ReadFrame, item: object, staging: StagingBuffer) -> FrameRead:
    """``read`` ``item`` into ``staging``'s rows; ANY exception is the frame's error, never the run's."""
    try:
        points, start = staging.read_frame(read, item)
        return FrameRead(points, start, None)
    except BaseException as exc:  # noqa: BLE001 - any reader failure is this frame's error, never the run's
        return FrameRead(None, None, one_line(exc))


class ProcessRead(NamedTuple):
    """A frame's read in a reader process, as it travels back: where its rows lie in the shared staging
    buffer (``start``, ``rows``), or its points when they are not there (``own``), or its ``error``; and
    what the read noted of the frame (``notes``: the reader's ``notes_of``)."""

    start: int | None
    rows: int
    error: str | None
    notes: Any
    own: np.ndarray | None


_reader: tuple[bytes, Any] = (b"", None)  # this process's reader: its pickle, and the reader it made


def read_batch(handle: SharedStagingHandle, reader: bytes, items: Sequence[object]) -> list[ProcessRead]:
    """A reader process's task: a batch's ``items`` read in turn into the shared staging buffer ``handle``
    names (from its first row: the batch's buffer is this task's alone) by the pickled ``reader``."""
    global _reader
    if _reader[0] != reader:
        _reader = (reader, pickle.loads(reader))
    read = _reader[1]
    staging = attach(handle)
    staging.reset()
    notes_of = getattr(read, "notes_of", None)
    results = []
    for item in items:
        points, start, error = read_into(read, item, staging)
        notes = notes_of(item) if notes_of is not None else None
        results.append(ProcessRead(start, 0 if points is None else len(points), error, notes,
                                   points if start is None else None))
    return results
