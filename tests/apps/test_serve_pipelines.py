"""The pipelines of one Triton instance (apps/serve/pipelines.py), with real CPU detectors of the tiny model.

Oracle: one detector run on each frame alone. Each detector is wrapped only to record the batches it
was given (their sizes, and how many ran at the same time)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pointpillars_trt.apps.serve.pipelines import PipelinePool
from pointpillars_trt.config import Thresholds
from pointpillars_trt.detector import PointPillars


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=4)


class Recording:
    """A real detector that notes each batch it runs and how many recorded detectors run at once."""

    running = 0
    most_at_once = 0
    lock = threading.Lock()

    def __init__(self, detector: PointPillars) -> None:
        self.detector, self.batches = detector, []  # type: ignore[var-annotated]
        self.cfg, self.closed = detector.cfg, False

    def detect_batch(self, frames, thresholds=None):  # type: ignore[no-untyped-def]
        with Recording.lock:
            Recording.running += 1
            Recording.most_at_once = max(Recording.most_at_once, Recording.running)
        try:
            time.sleep(0.05)  # long enough for the other pipelines' batches to start meanwhile
            self.batches.append(len(frames))
            return self.detector.detect_batch(frames, thresholds=thresholds)
        finally:
            with Recording.lock:
                Recording.running -= 1

    def close(self) -> None:
        self.closed = True
        self.detector.close()


def frames_of(model, sizes: list[int]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    return [np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32) for n in sizes]


def test_a_large_batch_runs_as_pipeline_batches_at_once_in_order(model) -> None:  # type: ignore[no-untyped-def]
    frames = frames_of(model, [300, 0, 2000, 50, 900, 7, 4000])
    thresholds = Thresholds(score_threshold=0.05)
    with PointPillars(model, device="cpu") as alone:
        expected = [alone(frame, thresholds=thresholds) for frame in frames]
    pool = PipelinePool(lambda: Recording(PointPillars(model, device="cpu", threads=1)), 3, batch=2)
    try:
        found = pool.detect_each(frames, thresholds)
    finally:
        pool.close()
    assert [len(d) for d in found] == [len(d) for d in expected]  # type: ignore[arg-type]
    for got, want in zip(found, expected):
        assert not isinstance(got, BaseException)
        np.testing.assert_array_equal(got.boxes, want.boxes)
        np.testing.assert_array_equal(got.scores, want.scores)
        assert got.stats == want.stats
    batches = [size for detector in pool.detectors for size in detector.batches]
    assert sorted(batches) == [1, 2, 2, 2] and Recording.most_at_once >= 2
    assert sum(bool(detector.batches) for detector in pool.detectors) >= 2


def test_a_bad_frame_fails_alone_and_a_pipeline_that_cannot_open_closes_the_others(model) -> None:  # type: ignore[no-untyped-def]
    frames = frames_of(model, [100, 200, 300])
    frames[1] = np.zeros((5, 3), np.float32)  # not (N, 4)
    pool = PipelinePool(lambda: PointPillars(model, device="cpu"), 2, batch=2)
    try:
        found = pool.detect_each(frames)
    finally:
        pool.close()
    assert [isinstance(result, BaseException) for result in found] == [False, True, False]
    opened: list[Recording] = []

    def third_fails() -> Recording:
        if len(opened) == 2:
            raise OSError("no such model dir")
        opened.append(Recording(PointPillars(model, device="cpu")))
        return opened[-1]

    with pytest.raises(OSError, match="no such model dir"):
        PipelinePool(third_fails, 3, batch=2)
    assert len(opened) == 2 and all(detector.closed for detector in opened)
