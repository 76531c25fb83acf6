"""The pipelines of one Triton instance, kept busy while Triton and the backend move tensors.

Triton calls a model instance's ``execute`` one batch at a time, and around each call it copies the
requests in and the responses out; a model that waits for its GPU inside ``execute`` leaves the GPU
idle through all of that. So ``execute`` only stages a batch on an idle pipeline (the frames are
copied before it returns) and a completion thread waits for the GPU, frees the pipeline and hands the
results to the batch's ``answer``, while Triton already hands ``execute`` the next batch for another
pipeline.
With every pipeline busy, ``execute`` waits for one: the batches in flight stay bounded.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...config import Thresholds
from ...detections import Detections
from ...detector import FRAME_ERRORS, detect_each

#: What a batch's answer gets: per frame, its detections or the error that frame alone raised.
Answer = Callable[[list[Detections | BaseException]], None]


class PipelineSet:
    """``count`` detectors from ``open_detector()``, each running one batch at a time. A detector that
    fails to open closes the ones opened before it."""

    def __init__(self, open_detector: Callable[[], Any], count: int) -> None:
        self.detectors: list[Any] = []
        try:
            for _ in range(count):
                self.detectors.append(open_detector())
        except BaseException:
            self.close()
            raise
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for detector in self.detectors:
            self._idle.put(detector)
        self._completions = ThreadPoolExecutor(count, thread_name_prefix="pp-pipeline")

    def start(self, frames: Sequence[Any], thresholds: Thresholds | None, answer: Answer) -> None:
        """Stage ``frames`` (at most a detector's batch) on the next idle pipeline, waiting for one;
        ``answer`` gets the results from a completion thread. Frames are not read after this returns.
        A batch with a bad frame runs here frame by frame, so that only the frame at fault fails."""
        detector = self._idle.get()
        try:
            try:
                finish = detector.submit_batch(frames, thresholds=thresholds)
            except FRAME_ERRORS:
                found = detect_each(detector, frames, thresholds)

                def finish() -> list[Detections | BaseException]:
                    return found
        except BaseException:
            self._idle.put(detector)
            raise
        try:
            self._completions.submit(self._complete, detector, finish, len(frames), answer)
        except BaseException:  # no completion thread to hand it to (e.g. none could start): finish it here
            self._complete(detector, finish, len(frames), answer)

    def _complete(self, detector: Any, finish: Callable[[], list[Any]], count: int, answer: Answer) -> None:
        try:
            found: list[Detections | BaseException] = list(finish())
        except Exception as exc:  # noqa: BLE001 - the GPU failed the whole batch: each request hears it
            found = [exc] * count
        finally:
            self._idle.put(detector)
        try:
            answer(found)
        except Exception as exc:  # noqa: BLE001 - nobody reads a completion thread's exceptions: say it
            print(f"warning: pointpillars: a batch's answers failed ({type(exc).__name__}: {exc})",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        """Wait for the batches in flight to finish and be handed to their ``answer``, then close the detectors."""
        completions = getattr(self, "_completions", None)
        if completions is not None:
            completions.shutdown(wait=True)
        for detector in self.detectors:
            detector.close()
