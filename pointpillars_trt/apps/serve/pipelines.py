"""Several detectors of one process used as one: what a Triton instance with ``--pipelines P`` runs.

Pipelines are threads of one process, so their batches share the GPU at once; model instances are
processes, which the GPU time-slices between (without MPS). A batch larger than one pipeline's goes out
as batches of at most ``batch`` frames on idle pipelines at once, results in the frames' order.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...config import Thresholds
from ...detections import Detections
from ...detector import detect_each
from ..frames import stop_stage_timings


class PipelinePool:
    """``count`` detectors from ``open_detector()``, each run by one thread at a time, ``batch`` frames
    a call, their per-stage timings off (nothing reads them). A detector that fails to open closes the
    ones opened before it."""

    def __init__(self, open_detector: Callable[[], Any], count: int, batch: int) -> None:
        self.batch = batch
        self.detectors: list[Any] = []
        try:
            for _ in range(count):
                self.detectors.append(open_detector())
        except BaseException:
            self.close()
            raise
        stop_stage_timings(self.detectors)
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for detector in self.detectors:
            self._idle.put(detector)
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="pp-pipeline") if count > 1 else None

    def detect_each(self, frames: Sequence[Any],
                    thresholds: Thresholds | None = None) -> list[Detections | BaseException]:
        """Each frame's detections or its error (``detector.detect_each``: only the frame at fault of a
        failed batch fails), batches of ``batch`` frames on as many pipelines at once."""
        chunks = [list(frames[start : start + self.batch]) for start in range(0, len(frames), self.batch)]
        if self._threads is None or len(chunks) <= 1:
            found = [self._on_idle(chunk, thresholds) for chunk in chunks]
        else:
            found = list(self._threads.map(self._on_idle, chunks, [thresholds] * len(chunks)))
        return [result for results in found for result in results]

    def _on_idle(self, frames: list[Any], thresholds: Thresholds | None) -> list[Detections | BaseException]:
        detector = self._idle.get()
        try:
            return detect_each(detector, frames, thresholds)
        finally:
            self._idle.put(detector)

    def close(self) -> None:
        threads = getattr(self, "_threads", None)
        if threads is not None:
            threads.shutdown(wait=True)
        for detector in self.detectors:
            detector.close()
