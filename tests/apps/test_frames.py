"""The streaming frame runner (apps/frames.py, and apps/frame_stream.py's one run fed group by group)
on the CPU path, with the tiny model.

Oracle: the same detector run on each frame alone (``detector(points)``), and the frames' files read
back by ``read_points``; the runner must give the same detections, in input order, whatever its
threads, pipelines and batch size, and fail a bad frame alone.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.apps.frame_stream import FrameStream
from pointpillars_trt.apps.frames import BATCH_BREAK, FrameRunner, reader_threads
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.kitti import write_velodyne_bin
from pointpillars_trt.pointcloud_io import read_points, read_points_into
from pointpillars_trt.staging import LARGE_SCAN_POINTS, likely_points_per_frame


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=5)


@pytest.fixture(scope="module")
def frames(model, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:  # type: ignore[no-untyped-def]
    """60 frames of mixed sizes (0 to 6,000 points), one of them far larger than the others."""
    folder = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(1)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    paths = []
    for index in range(60):
        n = 0 if index == 7 else 60_000 if index == 31 else int(rng.integers(1, 6000))
        points = np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32)
        paths.append(folder / f"{index:06d}.bin")
        write_velodyne_bin(points, paths[-1])
    return paths


def read(item: object, allocate):  # type: ignore[no-untyped-def]
    return read_points_into(item, allocate)  # type: ignore[arg-type]


def same(a, b) -> bool:  # type: ignore[no-untyped-def]
    return (np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
            and np.array_equal(a.labels, b.labels) and a.stats == b.stats)


def test_order_and_results_with_many_threads_pipelines_and_mixed_sizes(model, frames) -> None:  # type: ignore[no-untyped-def]
    alone = PointPillars(model, device="cpu")
    expected = [alone(read_points(p)) for p in frames]
    detectors = [PointPillars(model, device="cpu", threads=1) for _ in range(3)]
    seen: list[int] = []
    lock = threading.Lock()

    def write(source, detections, points):  # type: ignore[no-untyped-def]
        index = int(Path(source).stem)
        time.sleep(0.001 * (index % 3))  # writers finish out of order
        with lock:
            seen.append(index)
        return index

    with FrameRunner(detectors, batch_size=4, read=read, write=write, readers=5, writers=6) as runner:
        jobs = list(runner.run([str(p) for p in frames]))
    assert [job.index for job in jobs] == list(range(len(frames)))
    assert [job.source for job in jobs] == [str(p) for p in frames]
    assert sorted(seen) == list(range(len(frames)))
    for job, reference in zip(jobs, expected):
        assert job.error is None and job.written == job.index
        assert same(job.detections, reference), job.source


def test_likely_points_per_frame_is_the_largest_of_the_first_bin_files(tmp_path: Path) -> None:
    sizes = {"a.bin": 100 * 16, "b.bin": 60_000 * 16, "c.bin": 7 * 16, "d.npy": 10**7}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"\0" * size)
    paths = [str(tmp_path / name) for name in sizes]
    assert likely_points_per_frame(paths, point_dim=4) == 60_000
    assert likely_points_per_frame(paths, point_dim=5) == 60_000 * 16 // 20
    assert likely_points_per_frame(paths[:1] + [str(tmp_path / "gone.bin")], point_dim=4) == 100
    assert likely_points_per_frame([str(tmp_path / "d.npy"), "s3://bucket/x.bin", b"bytes"], point_dim=4) is None
    assert likely_points_per_frame(paths, point_dim=0) is None  # refused by the reads, not here
    assert likely_points_per_frame([str(tmp_path / "a\0.bin")], point_dim=4) is None  # a NUL in the name
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:  # sparse: the size is what counts
        f.truncate((LARGE_SCAN_POINTS + 1) * 16)
    assert likely_points_per_frame([str(huge)], point_dim=4) == LARGE_SCAN_POINTS


def test_points_per_frame_sizes_the_staging_so_large_frames_are_read_straight_in(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Frames larger than the default staging share: without the size, one frame of each batch does
    not fit and is read elsewhere (then copied in on the GPU); with it, every frame is read into
    its batch's staging rows. The detections are the same either way."""
    rng = np.random.default_rng(3)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    paths = []
    for index in range(4):
        points = np.column_stack([rng.uniform(lo, hi, (40_000, 3)), rng.uniform(0, 1, 40_000)]).astype(np.float32)
        paths.append(str(tmp_path / f"{index}.bin"))
        write_velodyne_bin(points, paths[-1])
    detector = PointPillars(model, device="cpu")
    runs = {}
    for hint in (None, likely_points_per_frame(paths, point_dim=4)):
        with FrameRunner([detector], batch_size=2, read=read, points_per_frame=hint) as runner:
            runs[hint] = list(runner.run(paths))
    without, with_hint = runs[None], runs[40_000]
    assert [sum(job.start is None for job in without[i : i + 2]) for i in (0, 2)] == [1, 1]  # one fits a batch
    assert all(job.start is not None for job in with_hint)
    for a, b in zip(without, with_hint):
        assert a.error is None and b.error is None and same(a.detections, b.detections)


def test_the_reader_threads_follow_the_frames_size(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Crops (and frames of unknown size) are read by 2 threads, full scans by 8, within the CPUs."""
    import pointpillars_trt.apps.frames as frames

    monkeypatch.setattr(frames.os, "cpu_count", lambda: 16)
    assert [reader_threads(n) for n in (None, 19_000, 121_000)] == [2, 2, 8]
    with FrameRunner([PointPillars(model, device="cpu")], batch_size=2, read=read, points_per_frame=121_000) as runner:
        assert runner._readers._max_workers == 8  # type: ignore[attr-defined]
    monkeypatch.setattr(frames.os, "cpu_count", lambda: 1)
    assert reader_threads(121_000) == 1


def test_a_corrupt_frame_among_500_good_ones_fails_alone(model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    paths = []
    for index in range(501):
        paths.append(tmp_path / f"{index:06d}.bin")
        if index == 250:
            paths[-1].write_bytes(b"\0" * 10)
            continue
        points = np.column_stack([rng.uniform(lo, hi, (50, 3)), rng.uniform(0, 1, 50)]).astype(np.float32)
        write_velodyne_bin(points, paths[-1])
    with FrameRunner([PointPillars(model, device="cpu", threads=1)], batch_size=8, read=read) as runner:
        jobs = list(runner.run([str(p) for p in paths]))
    failed = [job for job in jobs if job.error is not None]
    assert [job.index for job in failed] == [250] and "10 bytes, not a multiple of 16" in failed[0].error
    assert all(job.detections is not None for job in jobs if job.index != 250) and len(jobs) == 501


def test_any_exception_of_a_reader_or_writer_is_that_frames_error(model, frames) -> None:  # type: ignore[no-untyped-def]
    def buggy_read(item, allocate):  # type: ignore[no-untyped-def]
        if item.endswith("000003.bin"):
            raise TypeError("'bool' object cannot be interpreted as a shape")  # a reader bug, not an InputError
        return read(item, allocate)

    def buggy_write(source, detections, points):  # type: ignore[no-untyped-def]
        if source.endswith("000005.bin"):
            raise KeyError("boom")
        return None

    with FrameRunner([PointPillars(model, device="cpu")], batch_size=3, read=buggy_read, write=buggy_write) as runner:
        jobs = list(runner.run([str(p) for p in frames[:9]]))
    assert {job.index: job.error for job in jobs if job.error} == {
        3: "'bool' object cannot be interpreted as a shape", 5: "'boom'"}
    assert len(jobs) == 9


def test_reads_stay_a_bounded_window_ahead_of_a_slow_consumer(model, frames) -> None:  # type: ignore[no-untyped-def]
    started: list[int] = []

    def counting_read(item, allocate):  # type: ignore[no-untyped-def]
        started.append(1)
        return read(item, allocate)

    detectors = [PointPillars(model, device="cpu") for _ in range(2)]
    with FrameRunner(detectors, batch_size=2, read=counting_read) as runner:
        window = 2 * (2 * len(detectors) + 2)  # batches in flight x batch size
        for consumed, _ in enumerate(runner.run([str(p) for p in frames]), start=1):
            time.sleep(0.002)
            assert len(started) <= consumed + window


def test_frames_in_memory_and_an_iterator_of_items(model) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(4)
    arrays = [rng.uniform(0, 2, (n, 4)).astype(np.float32) for n in (5, 0, 300)]
    for points in arrays:
        points[:, 3] /= 2  # reflectance in 0-1, as the model's

    def from_memory(item, allocate):  # type: ignore[no-untyped-def]
        rows = allocate(len(item))
        if rows is None:
            return item
        rows[...] = item
        return rows

    with FrameRunner([PointPillars(model, device="cpu")], batch_size=2, read=from_memory) as runner:
        jobs = list(runner.run(iter(arrays)))
    alone = PointPillars(model, device="cpu")
    assert [job.source for job in jobs] == ["frame 0", "frame 1", "frame 2"]
    assert all(same(job.detections, alone(a)) for job, a in zip(jobs, arrays))


def test_writer_processes_write_what_writer_threads_write(model, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``writer_processes``: infer's write step runs in spawned processes and writes the same files."""
    import functools

    from pointpillars_trt.apps.frames import WorkerProcesses
    from pointpillars_trt.apps.outputs import OutputPlan, write_frame

    paths = [str(p) for p in frames[:12]]
    for processes in (0, 2):
        plan = OutputPlan(json_dir=tmp_path / str(processes))
        plan.json_dir.mkdir()
        write = functools.partial(write_frame, plan=plan)
        writers = WorkerProcesses(processes, write_frame) if processes else None
        if writers is not None:
            writers.wait()
        with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, read=read, write=write,
                         writer_processes=writers) as runner:
            jobs = list(runner.run(paths))
        assert [job.error for job in jobs] == [None] * 12
        assert [job.written[0].boxes for job in jobs] == [len(job.detections) for job in jobs]
    files = sorted(p.name for p in (tmp_path / "0").iterdir())
    assert len(files) == 12 and files == sorted(p.name for p in (tmp_path / "2").iterdir())
    assert all((tmp_path / "0" / n).read_bytes() == (tmp_path / "2" / n).read_bytes() for n in files)


def test_a_writer_process_that_dies_fails_only_the_frames_it_held(model, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A writer process killed mid-run (as the kernel's OOM killer would): the frames then in the writer
    processes fail with "not written", one notice says the run goes on in threads, and every later frame
    is written."""
    import functools
    import signal
    from concurrent.futures import BrokenExecutor

    from pointpillars_trt.apps.frames import WorkerProcesses
    from pointpillars_trt.apps.outputs import OutputPlan, write_frame

    write = functools.partial(write_frame, plan=OutputPlan(json_dir=tmp_path))
    writers = WorkerProcesses(1, write_frame)
    writers.wait()
    pid = writers.pool.submit(os.getpid).result()
    notices: list[str] = []
    sources = [f"{index:06d}.bin" for index in range(len(frames))]
    jobs = []
    with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, read=read, write=write,
                     writer_processes=writers, notice=notices.append) as runner:
        for job in runner.run([str(p) for p in frames], sources=sources):
            jobs.append(job)
            if len(jobs) == 1:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # until the pool knows (the run waits: its window is full)
                    try:
                        writers.pool.submit(os.getpid).result()
                    except BrokenExecutor:
                        break
                    time.sleep(0.01)
    writers.pool.shutdown()
    assert [job.source for job in jobs] == sources
    assert len(notices) == 1 and "a writer process died" in notices[0]
    lost = [job for job in jobs if job.error is not None]
    assert all(job.error.startswith("not written: a writer process died") for job in lost)
    assert len(lost) <= 4 * 4  # at most the batches in flight when it died
    assert jobs[0].error is None and all(job.error is None for job in jobs[20:])
    # what the runner reports written is there; beyond it, only what the dead process had finished or was
    # writing when killed (a later run skips the one and clears the other)
    on_disk = {p.name for p in tmp_path.iterdir()}
    written = {Path(job.source).stem + ".json" for job in jobs if job.error is None}
    held = {Path(job.source).stem + ".json" for job in lost}
    assert written <= on_disk
    assert all(name in held or name.endswith(".pp-tmp") for name in on_disk - written)


class _DiesOnArrival:
    """Unpickled in a new process, it ends that process (a writer process that cannot start)."""

    def __reduce__(self):  # type: ignore[no-untyped-def]

        return (os._exit, (3,))


def test_writer_processes_that_cannot_start_leave_the_writing_to_threads(model, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import functools

    from pointpillars_trt.apps.frames import WorkerProcesses
    from pointpillars_trt.apps.outputs import OutputPlan, write_frame

    writers = WorkerProcesses(2, _DiesOnArrival())  # type: ignore[arg-type]
    notices: list[str] = []
    write = functools.partial(write_frame, plan=OutputPlan(json_dir=tmp_path))
    paths = [str(p) for p in frames[:12]]
    with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, read=read, write=write,
                     writer_processes=writers, notice=notices.append) as runner:
        jobs = list(runner.run(paths))
    assert writers.failure is not None and not writers.wait()
    assert len(notices) == 1 and "the writer processes could not start" in notices[0], notices
    assert [job.error for job in jobs] == [None] * 12
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).stem + ".json" for p in paths)


class CountingDetector:
    """The tiny model's CPU detector, recording the size of every batch it is given."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.detector = PointPillars(model, device="cpu", threads=1)
        self.cfg = self.detector.cfg
        self.batches: list[int] = []

    def detect_batch(self, frames):  # type: ignore[no-untyped-def]
        self.batches.append(len(frames))
        return self.detector.detect_batch(frames)


def test_groups_fed_to_one_run_from_several_threads_each_get_their_own_frames_in_order(model, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``FrameStream``, as a Ray actor's two calls at a time feed it: a corrupt frame fails alone."""
    corrupt = tmp_path / "corrupt.bin"
    corrupt.write_bytes(b"\0" * 10)
    paths = [str(p) for p in frames[:41]]
    paths[13] = str(corrupt)
    alone = PointPillars(model, device="cpu")
    expected = {path: alone(read_points(path)) for i, path in enumerate(paths) if i != 13}
    groups = [paths[0:7], paths[7:20], paths[20:21], paths[21:41]]  # sizes 7, 13, 1, 20 with batch 4
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
            got[9] = list(stream.run(paths[:3], ["a", "b", "c"]))  # a later group, named by its caller
        finally:
            stream.close()
    for index, group in enumerate(groups):
        assert [job.source for job in got[index]] == group
        for job in got[index]:
            if job.source == paths[13]:
                assert job.error is not None and "16" in job.error and job.detections is None  # 16 bytes a point
            else:
                assert job.error is None
                reference = expected[job.source]
                assert np.array_equal(job.detections.boxes, reference.boxes)
                assert np.array_equal(job.detections.scores, reference.scores)
    assert [job.source for job in got[9]] == ["a", "b", "c"]
    assert all(job.error is None for job in got[9])


def test_a_group_smaller_than_the_batch_goes_at_once(model, frames) -> None:  # type: ignore[no-untyped-def]
    frames = [str(p) for p in frames[1:5]]
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
    frames = [str(p) for p in frames[1:6]]
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
            with pytest.raises(ValueError, match="^1 frame and 2 names: expected a name a frame$"):
                list(stream.run(["a"], ["a", "b"]))
            with pytest.raises(ValueError, match="BATCH_BREAK among the frames"):
                list(stream.run([BATCH_BREAK], ["a"]))
        finally:
            stream.close()



# -- reader processes (frames read in spawned processes into shared staging) ---------------------------


def _staging_files() -> set[str]:

    return {name for name in os.listdir("/dev/shm") if name.startswith(f"pp-staging-{os.getpid()}-")}


def _calib_folder(folder: Path) -> Path:
    """A KITTI calib file for frames 000000-000099: a camera looking along +x (the lidar's forward)."""
    folder.mkdir()
    text = ("P2: 700 0 600 0 0 700 180 0 0 0 1 0\nR0_rect: 1 0 0 0 1 0 0 0 1\n"
            "Tr_velo_to_cam: 0 -1 0 0 0 0 -1 0 1 0 0 0\n")
    for index in range(100):
        (folder / f"{index:06d}.txt").write_text(text)
    return folder


def test_infers_reader_takes_a_multi_sweep_frames_capture_times_from_its_read(nuscenes: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """infer's reader looked at a multi-sweep frame's 5th values for per-point capture times once more after its
    read had (~10-15 us a frame): it takes the read's finding. One look a frame, whether it is a .bin, .npy or
    .pcd file or a URI's bytes, and the same findings: capture times, none for a frame of one lag a sweep."""
    import sys

    from pointpillars_trt import point_layout
    from pointpillars_trt.apps.frames import CAPTURE_TIMES, FrameBytes, FrameReader
    from pointpillars_trt.config import load_config

    lags = read_points(nuscenes / "nusc_dev_k000002_s02.bin", point_dim=5)
    assert np.unique(lags[:, 4]).size <= 10  # the asset: one lag a sweep
    timed = lags.copy()
    timed[:, 4] = np.linspace(0.0, 0.1, len(timed), dtype=np.float32)  # a driver's time within the sweep
    lags.tofile(tmp_path / "lags.bin")
    timed.tofile(tmp_path / "timed.bin")
    np.save(tmp_path / "timed.npy", timed)
    (tmp_path / "timed.pcd").write_bytes(
        b"VERSION 0.7\nFIELDS x y z intensity time\nSIZE 4 4 4 4 4\nTYPE F F F F F\nCOUNT 1 1 1 1 1\n"
        b"WIDTH %d\nHEIGHT 1\nPOINTS %d\nDATA binary\n" % (len(timed), len(timed)) + timed.tobytes())
    looks: list[int] = []
    real = point_layout.holds_capture_times

    def counted(values: np.ndarray) -> bool:
        looks.append(len(values))
        return real(values)

    for name, module in list(sys.modules.items()):  # wherever the package binds it
        if name.startswith("pointpillars_trt") and getattr(module, "holds_capture_times", None) is real:
            monkeypatch.setattr(module, "holds_capture_times", counted)
    reader = FrameReader(load_config("openpcdet_nuscenes_multihead"), point_dim=5, intensity_scale=None)
    items: list[object] = [str(tmp_path / name) for name in ("lags.bin", "timed.bin", "timed.npy", "timed.pcd")]
    items.append(FrameBytes(str(tmp_path / "timed.bin"), (tmp_path / "timed.bin").read_bytes()))
    for item in items:
        looks.clear()
        points = reader(item, lambda n: np.empty((n, 4), np.float32))
        np.testing.assert_array_equal(points, lags if item == items[0] else timed)
        assert (len(looks), reader.finding_of(item)) == (1, None if item == items[0] else CAPTURE_TIMES), item


def test_a_multi_sweep_frames_time_lags_are_checked_once_on_every_path(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame infer read (its time lags checked by the read) had them checked again as the CPU detector took it
    (~0.4 ms for 300k points), and so had infer_many's frames, files and arrays alike: once on every path, an array
    given to the detector (which nothing checked before) included."""
    import sys

    from test_cli import cli
    from tiny import tiny_multi_sweep_config, tiny_weights

    from pointpillars_trt import point_layout
    from pointpillars_trt.convert.export import export_model_dir

    cfg = tiny_multi_sweep_config()
    model = export_model_dir(tiny_weights(cfg), cfg, tmp_path / "model", precision="fp32", source={"tiny": True})
    rng = np.random.default_rng(3)
    lo, hi = np.array(cfg.voxel.point_range[:3]), np.array(cfg.voxel.point_range[3:])
    points = np.column_stack([rng.uniform(lo, hi, (2000, 3)), rng.uniform(0, 20, 2000),
                              rng.choice([0.0, 0.05, 0.1], 2000)]).astype(np.float32)  # three sweeps' lags
    path = tmp_path / "frame.bin"
    points.tofile(path)
    checked: list[str] = []
    real = point_layout.check_time_lags

    def counted(values: np.ndarray, point_dim: int, name: str, *rest: object) -> None:
        checked.append(name)
        real(values, point_dim, name, *rest)  # type: ignore[arg-type]

    for name, module in list(sys.modules.items()):  # wherever the package binds it
        if name.startswith("pointpillars_trt") and getattr(module, "check_time_lags", None) is real:
            monkeypatch.setattr(module, "check_time_lags", counted)
    run = cli("infer", path, "--model", model.path, "--device", "cpu", "--point-dim", "5", "--no-progress")
    assert run.rc == 0 and "1/1 frames" in run.out, run
    assert checked == [f"point file {str(path)!r}"]
    with PointPillars(model, device="cpu") as detector:
        for call, said in [(lambda: detector(points), ["points"]),
                           (lambda: detector.detect_batch([points]), ["points"]),
                           (lambda: list(detector.infer_many([points])), ["points"]),
                           (lambda: list(detector.infer_many([path])), [f"point file {str(path)!r}"])]:
            checked.clear()
            call()
            assert checked == said


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_reader_processes_read_what_reader_threads_read(model, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``reader_processes``: each batch read in a spawned process into shared staging gives, in input order,
    the detections of each frame alone, the same errors, and the same findings (8-bit intensities, an
    empty frame), .pcd VIEWPOINT notes and crop notes (the assumed image size, a frame the crop empties) as
    reader threads; a frame too large for the staging is restaged; the staging's files are gone once the
    runner closes."""
    from pointpillars_trt.apps.frame_prep import CameraFovCrop
    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import FrameReader, WorkerProcesses

    folder = tmp_path / "velodyne"
    folder.mkdir()
    rng = np.random.default_rng(4)
    paths = []
    for index in range(14):
        n = 0 if index == 2 else 140_000 if index == 9 else int(rng.integers(200, 5000))
        x = rng.uniform(-30, -1, n) if index == 5 else rng.uniform(1, 40, n)  # frame 5: all behind the camera
        scale = 255 if index == 11 else 1
        points = np.column_stack([x, rng.uniform(-20, 20, n), rng.uniform(-2, 0.5, n),
                                  rng.uniform(0, scale, n)]).astype(np.float32)
        paths.append(folder / f"{index:06d}.bin")
        write_velodyne_bin(points, paths[-1])
    (folder / "000012.bin").write_bytes(b"1.5 2.5 3.5 0.5\n" * 64)  # text, not float32 rows
    posed = np.fromfile(paths[3], "<f4")  # frame 3's rows, in a .pcd of a sensor pose the read leaves unapplied
    paths.append(folder / "000014.pcd")
    paths[-1].write_bytes(b"VERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
                          + f"WIDTH {len(posed) // 4}\nHEIGHT 1\nVIEWPOINT 1 2 3 0 0 0 1\nPOINTS {len(posed) // 4}\n"
                            "DATA binary\n".encode() + posed.tobytes())
    calib = _calib_folder(tmp_path / "calib")
    items = [str(p) for p in paths]
    outcomes = []
    for processes in (0, 2):
        crop = CameraFovCrop(str(calib), None, (-40.0, -40.0, -3.0, 40.0, 40.0, 1.0))
        reader = FrameReader(model.cfg, point_dim=4, intensity_scale=None, prepare=crop)
        pool = WorkerProcesses(processes, read_batch) if processes else None
        notices: list[str] = []
        with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, read=reader, reader_processes=pool,
                         notice=notices.append, points_per_frame=5000) as runner:
            jobs = list(runner.run(items))
            staged_in_files = bool(_staging_files())
        assert not _staging_files()
        assert notices == [] and staged_in_files == bool(processes)
        outcomes.append([(job.source, job.error, job.detections, reader.finding_of(job.item),
                          crop.image_assumed(job.source), crop.emptied_warning(job.source),
                          reader.viewpoint_of(job.item)) for job in jobs])
    threads, in_processes = outcomes
    assert [o[0] for o in in_processes] == items
    alone = PointPillars(model, device="cpu")
    reference = CameraFovCrop(str(calib), None)
    for (source, error, found, finding, assumed, emptied, viewpoint), theirs in zip(in_processes, threads):
        assert (error, finding, assumed, emptied, viewpoint) == theirs[1:2] + theirs[3:], source
        if source.endswith("000012.bin"):
            assert error is not None and "text" in error
            continue
        points = read_points(source, viewpoint_note=lambda _: None)
        assert error is None and same(found, alone(reference(points, source))), source
    assert [o[3] for o in in_processes].count("8bit") == 1 and in_processes[11][3] == "8bit"
    assert [o[6] is not None for o in in_processes] == [False] * 14 + [True]
    assert in_processes[14][6].startswith(f"{items[14]!r}: its VIEWPOINT 1 2 3 0 0 0 1 ")
    assert same(in_processes[14][2], in_processes[3][2])  # its points as stored: frame 3's
    assert in_processes[2][3] == "empty" and in_processes[5][5] is not None
    assert all(o[4] for o in in_processes[:12])  # no image_2 beside the frames: KITTI's size assumed


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_a_reader_process_that_dies_costs_no_frame(model, frames) -> None:  # type: ignore[no-untyped-def]
    """A reader process killed mid-run: one warning, the batches it held read again in threads, and every
    frame detected as alone."""
    import signal

    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import FrameReader, WorkerProcesses

    pool = WorkerProcesses(1, read_batch)
    assert pool.wait()
    pid = pool.pool.submit(os.getpid).result()
    notices: list[str] = []
    jobs = []
    reader = FrameReader(model.cfg, point_dim=4, intensity_scale=None)
    with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, read=reader, reader_processes=pool,
                     notice=notices.append) as runner:
        for job in runner.run([str(p) for p in frames]):
            jobs.append(job)
            if len(jobs) == 1:
                os.kill(pid, signal.SIGKILL)
    assert len(notices) == 1 and notices[0].startswith("warning: a reader process failed"), notices
    alone = PointPillars(model, device="cpu")
    assert [job.index for job in jobs] == list(range(len(frames)))
    assert all(job.error is None and same(job.detections, alone(read_points(p))) for job, p in zip(jobs, frames))


class _SlowInChild:
    """A reader that takes 0.3 s a frame in a reader process (none in the runner's): tasks queue up there."""

    def __init__(self) -> None:

        self.runner = os.getpid()

    def __call__(self, item, allocate):  # type: ignore[no-untyped-def]

        if os.getpid() != self.runner:
            time.sleep(0.3)
        return read_points_into(item, allocate)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_the_other_reader_processes_stop_writing_when_one_dies(model, frames) -> None:  # type: ignore[no-untyped-def]
    """One of two reader processes killed while tasks queue in both: the pool fails every task at once,
    while the other may still be writing a batch into staging the runner reads again and reuses; the runner
    reaps it first. Every frame must still be each frame alone, and no reader process is left."""
    import signal

    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import WorkerProcesses

    pool = WorkerProcesses(2, read_batch)
    assert pool.wait()
    victim = sorted(pool.pids)[0]
    notices: list[str] = []
    timer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
    with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, read=_SlowInChild(), reader_processes=pool,
                     notice=notices.append) as runner:
        timer.start()
        jobs = list(runner.run([str(p) for p in frames]))
    assert len(notices) == 1 and notices[0].startswith("warning: a reader process failed"), notices
    assert not [p for p in __import__("multiprocessing").active_children() if p.pid in pool.pids]
    alone = PointPillars(model, device="cpu")
    assert [job.index for job in jobs] == list(range(len(frames)))
    assert all(job.error is None and same(job.detections, alone(read_points(p))) for job, p in zip(jobs, frames))


def test_workers_and_staging_go_when_the_runners_process_is_killed() -> None:
    """The runner's process killed (OOM killer, kill -9): its workers end themselves, and then the resource
    tracker removes the staging files, which would hold memory until a reboot (it waits for every process
    that holds its pipe)."""
    import subprocess
    import sys

    if not Path("/dev/shm").is_dir():
        pytest.skip("needs /dev/shm")
    code = ("import os, signal\n"
            "from pointpillars_trt.apps.frame_reads import read_batch\n"
            "from pointpillars_trt.apps.frames import WorkerProcesses\n"
            "from pointpillars_trt.shared_staging import SharedArrays\n"
            "from pointpillars_trt.staging import StagingBuffer\n"
            "pool = WorkerProcesses(2, read_batch)\n"
            "assert pool.wait()\n"
            "shared = SharedArrays(pin=False)\n"
            "handle = shared.handle(StagingBuffer(1000, shared, 5))\n"  # rows and time lags: two files
            "print(handle.rows, handle.times, *sorted(pool.pids), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    *names, first, second = done.stdout.split()
    pids = [first, second]
    assert len(names) == 2 and all(name.startswith("pp-staging-") for name in names), done

    def alive(pid: str) -> bool:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}/status").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (any(alive(pid) for pid in pids)
                                           or any(os.path.exists(f"/dev/shm/{name}") for name in names)):
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in names)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_a_stop_while_the_shared_staging_is_made_leaves_no_file(model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C (or SIGTERM, raised as a KeyboardInterrupt) while the runner makes its staging files: the files
    made so far are removed at once, not left to the resource tracker at exit (which warns of them)."""
    from pointpillars_trt.apps import frames as frames_module
    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import FrameReader, WorkerProcesses
    from pointpillars_trt.shared_staging import SharedArrays

    class StoppedOnTheThird(SharedArrays):
        made = 0

        def __call__(self, shape, dtype):  # type: ignore[no-untyped-def]
            StoppedOnTheThird.made += 1
            if StoppedOnTheThird.made == 3:
                raise KeyboardInterrupt
            return super().__call__(shape, dtype)

    monkeypatch.setattr(frames_module, "SharedArrays", StoppedOnTheThird)
    pool = WorkerProcesses(1, read_batch)
    try:
        with pytest.raises(KeyboardInterrupt):
            FrameRunner([PointPillars(model, device="cpu")], batch_size=4, reader_processes=pool,
                        read=FrameReader(model.cfg, point_dim=4, intensity_scale=None))
        assert StoppedOnTheThird.made == 3 and not _staging_files()
    finally:
        pool.pool.shutdown()


def test_a_reader_that_does_not_pickle_reads_in_threads(model, frames) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import WorkerProcesses

    notices: list[str] = []
    with FrameRunner([PointPillars(model, device="cpu")], batch_size=4, reader_processes=WorkerProcesses(1, read_batch),
                     read=lambda item, allocate: read_points_into(item, allocate), notice=notices.append) as runner:
        jobs = list(runner.run([str(p) for p in frames[:8]]))
    assert len(notices) == 1 and notices[0].startswith("note: reading frames in threads: the reader does not pickle")
    alone = PointPillars(model, device="cpu")
    assert all(same(job.detections, alone(read_points(p))) for job, p in zip(jobs, frames))



def test_a_ctrl_c_while_the_workers_import_neither_stops_them_nor_prints_a_traceback(capfd) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C reaches the whole process group, also while the worker processes are still importing (they
    start while the model opens): they start with it (and SIGTERM) blocked, so it neither ends them with a
    KeyboardInterrupt traceback each nor breaks the pool; once started they ignore it, and take SIGTERM."""
    import signal

    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import WorkerProcesses

    pool = WorkerProcesses(2, read_batch)
    try:
        for process in list(pool.pool._processes.values()):  # just spawned: still importing
            os.kill(process.pid, signal.SIGINT)
        assert pool.wait(), pool.failure
        assert pool.pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN
        assert not {signal.SIGINT, signal.SIGTERM} & pool.pool.submit(signal.pthread_sigmask, signal.SIG_BLOCK, set()).result()
        assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, set())  # this thread's back
    finally:
        pool.pool.shutdown()
    assert "Traceback" not in capfd.readouterr().err


def test_worker_processes_leave_ctrl_c_to_the_runner() -> None:
    """Ctrl-C reaches the whole process group; the workers ignore it (the runner's process shuts them down)
    rather than each printing a traceback. SIGTERM keeps its default: a pool that lost a process ends the
    others with it and waits for them."""
    import signal

    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import WorkerProcesses

    pool = WorkerProcesses(1, read_batch)
    try:
        assert pool.wait()
        assert pool.pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN
        assert pool.pool.submit(signal.getsignal, signal.SIGTERM).result() == signal.SIG_DFL
    finally:
        pool.pool.shutdown()
