"""One runner's run fed group by group (apps/frame_stream.py), as a Ray actor's calls feed it.

Oracle: the tiny model's CPU detector run on each frame alone. Every group must get its own frames'
jobs, in order, whatever other groups are fed at the same time; a group smaller than the batch must
not wait for the next group; a bad frame fails alone; a closed stream refuses new groups.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pointpillars_trt.apps.frame_stream import FrameStream
from pointpillars_trt.apps.frames import BATCH_BREAK, FrameRunner
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.kitti import write_velodyne_bin
from pointpillars_trt.pointcloud_io import read_points, read_points_into


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=7)


@pytest.fixture(scope="module")
def frames(model, tmp_path_factory: pytest.TempPathFactory) -> list[str]:  # type: ignore[no-untyped-def]
    """41 frames of 1 to 3,000 points; frame 13 is corrupt (not a whole number of points)."""
    folder = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(3)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    paths = []
    for index in range(41):
        path = folder / f"{index:06d}.bin"
        if index == 13:
            path.write_bytes(b"\0" * 10)
        else:
            n = int(rng.integers(1, 3000))
            write_velodyne_bin(np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32),
                               path)
        paths.append(str(path))
    return paths


def read(item: object, allocate):  # type: ignore[no-untyped-def]
    return read_points_into(item, allocate)  # type: ignore[arg-type]


class CountingDetector:
    """The tiny model's CPU detector, recording the size of every batch it is given."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.detector = PointPillars(model, device="cpu", threads=1)
        self.cfg = self.detector.cfg
        self.batches: list[int] = []

    def detect_batch(self, frames):  # type: ignore[no-untyped-def]
        self.batches.append(len(frames))
        return self.detector.detect_batch(frames)


def test_groups_fed_from_several_threads_each_get_their_own_frames_in_order(model, frames) -> None:  # type: ignore[no-untyped-def]
    alone = PointPillars(model, device="cpu")
    expected = {path: alone(read_points(path)) for i, path in enumerate(frames) if i != 13}
    groups = [frames[0:7], frames[7:20], frames[20:21], frames[21:41]]  # sizes 7, 13, 1, 20 with batch 4
    got: dict[int, list] = {}  # type: ignore[type-arg]
    with FrameRunner([CountingDetector(model) for _ in range(2)], batch_size=4, read=read, readers=3) as runner:
        stream = FrameStream(runner)
        try:
            def call(index: int) -> None:
                got[index] = list(stream.run(groups[index], groups[index]))

            threads = [threading.Thread(target=call, args=(i,)) for i in range(len(groups))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            got[9] = list(stream.run(frames[:3], ["a", "b", "c"]))  # a later group, named by its caller
        finally:
            stream.close()
    for index, group in enumerate(groups):
        assert [job.source for job in got[index]] == group
        for job in got[index]:
            if job.source == frames[13]:
                assert job.error is not None and "16" in job.error and job.detections is None  # 16 bytes a point
            else:
                assert job.error is None
                reference = expected[job.source]
                assert np.array_equal(job.detections.boxes, reference.boxes)
                assert np.array_equal(job.detections.scores, reference.scores)
    assert [job.source for job in got[9]] == ["a", "b", "c"]
    assert all(job.error is None for job in got[9])


def test_a_group_smaller_than_the_batch_goes_at_once(model, frames) -> None:  # type: ignore[no-untyped-def]
    detector = CountingDetector(model)
    with FrameRunner([detector], batch_size=8, read=read, readers=1) as runner:
        stream = FrameStream(runner)
        try:
            jobs = list(stream.run(frames[:3], frames[:3]))  # would wait for 5 more frames without the break
            assert [job.source for job in jobs] == frames[:3]
            assert detector.batches == [3]
        finally:
            stream.close()
        with pytest.raises(RuntimeError, match="closed"):
            list(stream.run(frames[:1], frames[:1]))


def test_a_batch_break_cuts_the_runners_batches(model, frames) -> None:  # type: ignore[no-untyped-def]
    detector = CountingDetector(model)
    items = [frames[0], BATCH_BREAK, frames[1], frames[2], frames[3], BATCH_BREAK, BATCH_BREAK, frames[4]]
    with FrameRunner([detector], batch_size=2, read=read, readers=1) as runner:
        jobs = list(runner.run(items))
    assert [job.index for job in jobs] == [0, 1, 2, 3, 4]
    assert [job.source for job in jobs] == frames[:5]
    assert detector.batches == [1, 2, 1, 1]


def test_an_empty_group_returns_at_once(model) -> None:  # type: ignore[no-untyped-def]
    with FrameRunner([CountingDetector(model)], batch_size=2, read=read, readers=1) as runner:
        stream = FrameStream(runner)
        try:
            assert list(stream.run([], [])) == []
        finally:
            stream.close()

