"""``StagingBuffer``: a frame's read straight into its rows, from several threads.

Oracles: the file's own rows (``read_points``), and the rows counted by hand."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

from pointpillars_trt.pointcloud_io import read_points, read_points_into
from pointpillars_trt.staging import StagingBuffer


def _frame(path: Path, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    points = np.column_stack([rng.uniform(-40, 40, (n, 3)), rng.uniform(0, 1, (n, 1))]).astype(np.float32)
    points.tofile(path)
    return points


def test_frames_read_from_threads_land_in_their_own_rows(tmp_path: Path) -> None:
    """Eight files read at once into one buffer: each frame's rows are its file's, where its start says."""
    paths = [tmp_path / f"{i}.bin" for i in range(8)]
    frames = [_frame(path, 1000 + 37 * i, i) for i, path in enumerate(paths)]
    staging = StagingBuffer(sum(len(f) for f in frames))
    placed: list[tuple[np.ndarray, int | None]] = [(np.empty(0), None)] * 8

    def read(index: int) -> None:
        placed[index] = staging.read_frame(read_points_into, paths[index])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for frame, (points, start) in zip(frames, placed):
        assert start is not None and np.array_equal(staging.points[start : start + len(frame)], frame)
        assert np.shares_memory(points, staging.points) and np.array_equal(points, frame)
    assert sorted(start for _, start in placed) == sorted({start for _, start in placed})  # type: ignore[type-var]
    assert staging.used == sum(len(f) for f in frames)


def test_a_frame_without_room_is_an_array_of_its_own(tmp_path: Path) -> None:
    """A buffer of 1,024 rows and frames of 1,000 and 800 points: the second is read into an array of its own
    (start None), and takes no rows."""
    first, second = _frame(tmp_path / "a.bin", 1000, 1), _frame(tmp_path / "b.bin", 800, 2)
    staging = StagingBuffer(1000)  # 1,024 rows: a power of two
    assert staging.capacity == 1024 and StagingBuffer(1025).capacity == 2048 and StagingBuffer(1).capacity == 1
    a, a_start = staging.read_frame(read_points_into, tmp_path / "a.bin")
    b, b_start = staging.read_frame(read_points_into, tmp_path / "b.bin")
    assert a_start == 0 and np.array_equal(a, first)
    assert b_start is None and not np.shares_memory(b, staging.points) and np.array_equal(b, second)
    assert staging.used == 1000
    staging.reset()
    assert staging.used == 0


def test_a_wider_rows_frame_lands_its_first_four_values_in_the_rows(tmp_path: Path) -> None:
    """A ``.bin`` of 5 or 8 values a point read for a 4-column model (``--point-dim``): its x, y, z and
    intensity land in the staging rows (no array of its own), equal to the file's values parsed apart."""
    frame = _frame(tmp_path / "unused.bin", 700, 4)
    for dim in (5, 8):
        extra = np.arange(len(frame) * (dim - 4), dtype=np.float32).reshape(len(frame), dim - 4) % 7
        np.column_stack([frame, extra]).astype("<f4").tofile(tmp_path / f"wide{dim}.bin")
        staging = StagingBuffer(1000)
        points, start = staging.read_frame(functools.partial(read_points_into, point_dim=dim), tmp_path / f"wide{dim}.bin")
        parsed = np.frombuffer((tmp_path / f"wide{dim}.bin").read_bytes(), "<f4").reshape(-1, dim)[:, :4]
        assert start == 0 and np.shares_memory(points, staging.points)
        np.testing.assert_array_equal(staging.points[: len(frame)], parsed)
        np.testing.assert_array_equal(points, frame)


def test_a_cropped_read_goes_back_into_its_rows_and_time_lags_beside_them(tmp_path: Path) -> None:
    """A read that keeps fewer rows than it was given (a crop) lies at the start of its rows; a frame of 5
    columns (read into an array of its own) is copied in, its time lags into ``times``."""
    frame = _frame(tmp_path / "a.bin", 1000, 3)
    staging = StagingBuffer(2000)

    def cropped(item: object, allocate):  # type: ignore[no-untyped-def]
        points = read_points_into(item, allocate)  # type: ignore[arg-type]
        return points[points[:, 0] > 0].copy()

    points, start = staging.read_frame(cropped, tmp_path / "a.bin")
    kept = frame[frame[:, 0] > 0]
    assert start == 0 and np.array_equal(points, kept) and np.shares_memory(points, staging.points)

    lags = np.column_stack([frame, np.repeat(np.float32(0.05) * np.arange(10, dtype=np.float32), len(frame) // 10)])
    lags.tofile(tmp_path / "sweeps.bin")
    timed = StagingBuffer(2000, columns=5)
    points, start = timed.read_frame(lambda item, allocate: read_points(item, point_dim=5), tmp_path / "sweeps.bin")
    assert start == 0 and np.array_equal(points, lags)
    assert np.array_equal(timed.points[:1000], frame) and np.array_equal(timed.times[:1000], lags[:, 4])
