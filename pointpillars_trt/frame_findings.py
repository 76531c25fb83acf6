"""What a detector says once of the frames it returns detections for, as an ``InputWarning`` at its caller's line:
a frame the network overflowed on, one whose points were probably misread, one that lost pillars past the model's
``max_pillars``. The local detector and the client of a server say them in the same words, from the detections
alone (their ``FrameStats``), as ``infer`` says them of its files."""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Collection, Sequence
from types import FrameType

import numpy as np

from .detections import (Detections, misread_finding, overflow_finding, overflowed_counts_texts,
                         pillars_dropped_finding)
from .errors import InputWarning, agree


def callers_level(internal: Collection[str]) -> int:
    """The ``stacklevel`` of a warning, given in a function of one of the files ``internal``, that names the first
    caller outside them (the user's line, whichever entry they called)."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename in internal:
        frame, level = frame.f_back, level + 1
    return level


class FrameFindings:
    """The findings a detector says once each, for ``point_range`` (the model's, which a misread frame's warning
    names); ``internal``: the files of the detector's own code, which the warnings' line passes over (this one's
    besides). Thread-safe: a kind is said by the first thread that finds it."""

    def __init__(self, point_range: Sequence[float] | None, internal: Collection[str]) -> None:
        self._point_range = point_range
        self._internal = frozenset((__file__, *internal))
        self._said: set[str] = set()  # "overflow", and the kinds of misread_finding and pillars_dropped_finding
        self._lock = threading.Lock()

    def _first(self, kind: str) -> bool:
        """Whether ``kind`` is said now: the first time it is found."""
        with self._lock:
            if kind in self._said:
                return False
            self._said.add(kind)
            return True

    def overflow(self, found: Detections) -> Detections:
        """Warn (once) when a frame's boxes or scores hold NaN or infinity, or its class scores or pillar features
        overflowed (``FrameStats.num_overflowed_scores``: the boxes there lost; ``num_overflowed_features``: the
        boxes there meaningless, on any frame, not the first only as the intensity check): the network overflowed,
        which values far outside its training range (coordinates, intensities, a corrupt value) cause. ``found``
        is returned as it is."""
        if "overflow" in self._said:
            return found
        finite = bool(np.isfinite(found.boxes).all() and np.isfinite(found.scores).all())
        stats = found.stats
        if finite and not (stats.num_overflowed_scores or stats.num_overflowed_features) or not self._first("overflow"):
            return found
        parts = []
        if not finite:
            bad = int(np.count_nonzero(~np.isfinite(found.boxes).all(axis=1) | ~np.isfinite(found.scores)))
            parts.append(agree(len(found), "the one box of a frame holds",
                               f"{bad} of a frame's {len(found)} boxes {agree(bad, 'holds', 'hold')}")
                         + " NaN or infinite values")
        parts += overflowed_counts_texts(stats, "its" if parts else "a frame's")
        dropped = "" if finite else "; infer leaves such boxes out and counts them"
        warnings.warn(f"{overflow_finding(parts, 'frame')}{dropped} (said once)", InputWarning,
                      stacklevel=callers_level(self._internal))
        return found

    def of_frame(self, found: Detections, name: str) -> Detections:
        """Warn (once for each kind) when a frame's stats say its points were probably misread
        (``misread_finding``: none of its many points made a pillar, or all of them one), that it lost pillars
        past the model's ``max_pillars`` (``pillars_dropped_finding``), as infer warns of its files; ``name``: the
        frame, as the warning names it. ``found`` is returned as it is."""
        for finding in (misread_finding(found.stats, self._point_range), pillars_dropped_finding(found.stats)):
            if finding is not None and finding[0] not in self._said and self._first(finding[0]):
                warnings.warn(f"{name}: {finding[1]} (said once)", InputWarning,
                              stacklevel=callers_level(self._internal))
        return found

    def of_result(self, found: Detections, name: str) -> Detections:
        """``overflow`` and ``of_frame`` of one frame's detections, which the warnings name ``name``."""
        return self.of_frame(self.overflow(found), name)

    def of_batch(self, found: list[Detections]) -> list[Detections]:
        """``of_frame`` of a batch's frames, each named by its place in the batch."""
        return [self.of_frame(one, f"frame {index} of the batch") for index, one in enumerate(found)]
