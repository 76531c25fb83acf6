"""The pipelines of one Triton instance (apps/serve/pipelines.py), with real CPU detectors of the tiny model.

Oracle: one detector run on each frame alone. Each detector is wrapped only to stand in for the GPU's
time: the batch really runs (on the CPU path, inside ``submit_batch``), and the call that would wait for
the GPU sleeps 50 ms and notes how many batches were in flight at once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pointpillars_trt.apps.serve.pipelines import PipelineSet
from pointpillars_trt.config import Thresholds
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import BackendError


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=4)


class SlowFinish:
    """A real detector whose batches take 50 ms more to finish, counted while in flight."""

    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def __init__(self, detector: PointPillars) -> None:
        self.detector, self.cfg, self.closed, self.batches = detector, detector.cfg, False, 0

    def submit_batch(self, frames, *, thresholds=None):  # type: ignore[no-untyped-def]
        finish = self.detector.submit_batch(frames, thresholds=thresholds)
        with SlowFinish.lock:
            SlowFinish.in_flight += 1
            SlowFinish.most_in_flight = max(SlowFinish.most_in_flight, SlowFinish.in_flight)
        self.batches += 1

        def slow():  # type: ignore[no-untyped-def]
            time.sleep(0.05)
            with SlowFinish.lock:
                SlowFinish.in_flight -= 1
            return finish()

        return slow

    def detect_batch(self, frames, thresholds=None):  # type: ignore[no-untyped-def]
        return self.detector.detect_batch(frames, thresholds=thresholds)

    def close(self) -> None:
        self.closed = True
        self.detector.close()


def frames_of(model, sizes: list[int]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    return [np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32) for n in sizes]


def test_batches_are_answered_later_with_the_local_detections_several_in_flight(model) -> None:  # type: ignore[no-untyped-def]
    frames = frames_of(model, [300, 0, 2000, 50, 900, 7, 4000])
    thresholds = Thresholds(score_threshold=0.05)
    with PointPillars(model, device="cpu") as alone:
        expected = [alone(frame, thresholds=thresholds) for frame in frames]
    answers: dict[int, list[object]] = {}
    pipelines = PipelineSet(lambda: SlowFinish(PointPillars(model, device="cpu", threads=1)), 3)
    try:
        for start in range(0, len(frames), 2):
            pipelines.start(frames[start : start + 2], thresholds, lambda found, at=start: answers.__setitem__(at, found))
        assert len(answers) < 4, "start waited for the batches to finish"
    finally:
        pipelines.close()  # waits for the answers
    found = [result for at in sorted(answers) for result in answers[at]]
    assert sorted(answers) == [0, 2, 4, 6] and len(found) == len(expected)
    for got, want in zip(found, expected):
        assert not isinstance(got, BaseException)
        np.testing.assert_array_equal(got.boxes, want.boxes)  # type: ignore[union-attr]
        np.testing.assert_array_equal(got.scores, want.scores)  # type: ignore[union-attr]
        assert got.stats == want.stats  # type: ignore[union-attr]
    assert SlowFinish.most_in_flight >= 2, "no two batches were ever in flight at once"
    assert sum(detector.batches for detector in pipelines.detectors) == 4


def test_a_bad_frame_fails_alone_and_a_pipeline_that_cannot_open_closes_the_others(model) -> None:  # type: ignore[no-untyped-def]
    frames = frames_of(model, [100, 200, 300])
    frames[1] = np.zeros((5, 3), np.float32)  # not (N, 4)
    answers: list[list[object]] = []
    pipelines = PipelineSet(lambda: PointPillars(model, device="cpu"), 2)
    try:
        pipelines.start(frames, None, answers.append)
    finally:
        pipelines.close()
    assert [isinstance(result, BaseException) for result in answers[0]] == [False, True, False]
    assert "expected an (N, 4) array" in str(answers[0][1])
    opened: list[SlowFinish] = []

    def third_fails() -> SlowFinish:
        if len(opened) == 2:
            raise OSError("no such model dir")
        opened.append(SlowFinish(PointPillars(model, device="cpu")))
        return opened[-1]

    with pytest.raises(OSError, match="no such model dir"):
        PipelineSet(third_fails, 3)
    assert len(opened) == 2 and all(detector.closed for detector in opened)


class FailingFinish:
    """A real detector whose first batch fails where the GPU would (in the call that waits for it)."""

    def __init__(self, detector: PointPillars) -> None:
        self.detector, self.cfg, self.failed = detector, detector.cfg, False

    def submit_batch(self, frames, *, thresholds=None):  # type: ignore[no-untyped-def]
        finish = self.detector.submit_batch(frames, thresholds=thresholds)
        if self.failed:
            return finish
        self.failed = True

        def fail():  # type: ignore[no-untyped-def]
            finish()  # the wait, which frees the detector for its next batch as a failed one on the GPU does
            raise BackendError("GPU pipeline: CUDA error (test)")

        return fail

    def close(self) -> None:
        self.detector.close()


def test_a_failed_batch_and_a_failing_answer_leave_the_pipeline_usable(model, capsys) -> None:  # type: ignore[no-untyped-def]
    frames = frames_of(model, [100, 200])
    answers: list[list[object]] = []

    def answer_or_fail(found: list[object]) -> None:
        answers.append(found)
        if len(answers) == 2:
            raise RuntimeError("the stub refused the response")

    pipelines = PipelineSet(lambda: FailingFinish(PointPillars(model, device="cpu")), 1)
    try:
        for _ in range(3):  # one pipeline: each start waits for the previous batch to hand it back
            pipelines.start(frames, None, answer_or_fail)
    finally:
        pipelines.close()
    assert [type(result).__name__ for result in answers[0]] == ["BackendError", "BackendError"]
    assert all(not isinstance(result, BaseException) for found in answers[1:] for result in found)
    assert len(answers) == 3
    assert "a batch's answers failed (RuntimeError: the stub refused the response)" in capsys.readouterr().err
