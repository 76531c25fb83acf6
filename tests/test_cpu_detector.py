"""The CPU detector shared by threads: a batch holds it from its first frame to its last, as the GPU pipeline is held.

Oracles: each batch's detections when it runs alone, and the order in which two threads' batches end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import overload

import numpy as np
import pytest

from pointpillars_trt.cpu_detector import CpuDetector
from pointpillars_trt.detections import STAGES, Detections
from tiny import tiny_model_dir


def open_detector(folder: Path) -> CpuDetector:
    """The tiny model's CPU detector, with a score threshold low enough that its random weights find boxes."""
    model = tiny_model_dir(folder)
    return CpuDetector(model, post_config=model.cfg.with_thresholds(score_threshold=0.01))


def frames_in_range(detector: CpuDetector, count: int, seed: int) -> list[np.ndarray]:
    """``count`` frames of points spread over the model's range (boxes found, pillars in every frame)."""
    lo, hi = np.split(np.asarray(detector.cfg.voxel.point_range, np.float32), 2)
    rng = np.random.default_rng(seed)
    return [np.column_stack([rng.uniform(lo, hi, (500, 3)), rng.uniform(0, 1, 500)]).astype(np.float32)
            for _ in range(count)]


def assert_same(found: list[Detections], alone: list[Detections]) -> None:
    assert len(found) == len(alone)
    for a, b in zip(found, alone):
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.labels, b.labels)
        assert a.stats == b.stats


class FramesWithAPause(Sequence[np.ndarray]):
    """A batch's frames that call ``between`` as the frame after the first is taken: the caller's code run between
    two frames of the batch, while the detector runs it."""

    def __init__(self, frames: list[np.ndarray], between: Callable[[], None]) -> None:
        self._frames, self._between = frames, between

    def __len__(self) -> int:
        return len(self._frames)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        return self._frames[index]

    def __iter__(self) -> Iterator[np.ndarray]:
        for index, frame in enumerate(self._frames):
            if index == 1:
                self._between()
            yield frame


def test_another_threads_batch_waits_for_the_whole_batch_not_its_frame(tmp_path: Path) -> None:
    """Thread B's ``detect_batch`` is called between two frames of thread A's: it runs after A's last frame (it ran
    in the gap, between A's frames, when the lock was taken a frame at a time), and each batch's detections are
    those it finds alone."""
    with closing(open_detector(tmp_path)) as detector:
        batch_a, batch_b = frames_in_range(detector, 3, seed=1), frames_in_range(detector, 2, seed=2)
        alone_a, alone_b = detector.detect_batch(batch_a), detector.detect_batch(batch_b)
        assert all(len(found) for found in alone_a + alone_b)  # boxes to compare
        ended: list[str] = []
        found_b: list[Detections] = []

        def run_b() -> None:
            found_b.extend(detector.detect_batch(batch_b))
            ended.append("B")

        thread_b = threading.Thread(target=run_b)

        def start_b() -> None:
            thread_b.start()
            thread_b.join(timeout=1.0)  # time enough for B's two tiny frames, if B could run now

        found_a = detector.detect_batch(FramesWithAPause(batch_a, start_b))
        ended.append("A")
        thread_b.join(timeout=60)
        assert not thread_b.is_alive()
        assert ended == ["A", "B"]
        assert_same(found_a, alone_a)
        assert_same(found_b, alone_b)


def test_two_threads_batches_at_once_find_what_each_finds_alone(tmp_path: Path) -> None:
    """Two threads calling ``detect_batch`` on one detector over and over: every result is that batch's alone, and
    ``last_timings`` afterwards is one frame's whole record."""
    with closing(open_detector(tmp_path)) as detector:
        batches = [frames_in_range(detector, 3, seed=seed) for seed in (3, 4)]
        alone = [detector.detect_batch(batch) for batch in batches]
        failures: list[BaseException] = []
        barrier = threading.Barrier(2)

        def run(which: int) -> None:
            try:
                barrier.wait(timeout=60)
                for _ in range(10):
                    assert_same(detector.detect_batch(batches[which]), alone[which])
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(which,)) for which in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures
        assert not any(thread.is_alive() for thread in threads)
        timings = detector.last_timings  # the last batch's last frame: every stage, and their sum
        assert set(timings) == {*STAGES, "total"}
        assert timings["total"] == pytest.approx(sum(timings[stage] for stage in STAGES), rel=1e-9)
