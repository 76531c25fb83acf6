"""The read of ``infer --ray``'s URI frames in Ray Data's tasks, through a real pyarrow file system (``file://``):
by the listed size, memory bounded by what a file holds, a frame past the limit refused. (No Ray cluster.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_pointcloud_io import traced_peak

from pointpillars_trt.apps.uri_frames import _read_frame, read_uri_frames
from pointpillars_trt.points import MAX_FRAME_POINTS

pafs = pytest.importorskip("pyarrow.fs")


def _file_system(folder: Path):  # type: ignore[no-untyped-def]
    """pyarrow's file system of a ``file://`` URI of ``folder``, as Ray Data lists and reads such a URI."""
    filesystem, path = pafs.FileSystem.from_uri(f"file://{folder}")
    assert path == str(folder)
    return filesystem


def _read(folder: Path, frames: dict[str, int]) -> dict[str, list[object]]:
    """``read_uri_frames`` of ``frames`` {file name in ``folder``: its size as listed}, a batch as Ray Data gives it."""
    paths = [str(folder / name) for name in frames]
    batch = {"path": np.array(paths), "read": np.array(paths), "size": np.array(list(frames.values()))}
    return read_uri_frames(batch, _file_system(folder), 4)


def test_a_uri_frame_is_read_setting_aside_what_it_holds_not_the_frame_limit(tmp_path: Path) -> None:
    """An empty frame, a small one, and a small one listed as empty (as an object listed before it was written is)
    are read whole, each read setting aside about a chunk at most, where one read of the frame limit (256 MiB at 4
    values a point) set the whole limit aside for each."""
    small = np.arange(40, dtype="<f4").tobytes()
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "small.bin").write_bytes(small)
    (tmp_path / "unlisted.bin").write_bytes(small)
    for frames in ({"empty.bin": 0}, {"small.bin": len(small)}, {"unlisted.bin": 0}):
        got, peak = traced_peak(lambda: _read(tmp_path, frames))  # noqa: B023 - called at once
        assert got["error"] == [""] and peak < 2 * 2**20 < MAX_FRAME_POINTS * 16, (frames, peak)
        assert got["bytes"] == [b"" if "empty.bin" in frames else small]


def test_a_uri_frame_grown_since_listed_is_read_whole_up_to_the_limit_and_refused_past_it(tmp_path: Path) -> None:
    """The listed size is where the read starts, not where it stops: a frame grown since (within the limit) is
    read whole; one byte past the limit, the frame's error, as it was said before. One listed as empty says so: it
    was said to have grown past the limit since its listing, which the listing of a file whose size counts none of its
    bytes (a /proc file's) never showed it below."""
    filesystem = _file_system(tmp_path)
    limit = 3 * 2**20 + 16  # a few chunks
    (tmp_path / "at.bin").write_bytes(b"\x01" * limit)
    (tmp_path / "over.bin").write_bytes(b"\x02" * (limit + 1))
    assert _read_frame(filesystem, "at.bin", str(tmp_path / "at.bin"), 16, limit) == (b"\x01" * limit, "")
    for listed in (16, limit):
        assert _read_frame(filesystem, "over.bin", str(tmp_path / "over.bin"), listed, limit) == (
            b"", f"point file 'over.bin' grew past the limit of {MAX_FRAME_POINTS} points a frame once listed")
    said_empty = (b"", f"point file 'over.bin': its listing said 0 bytes, and it holds more than the limit of "
                       f"{MAX_FRAME_POINTS} points a frame")
    assert _read_frame(filesystem, "over.bin", str(tmp_path / "over.bin"), 0, limit) == said_empty
    status = Path("/proc/self/status")  # a file whose listing says 0 bytes, as listed through file://
    if status.is_file() and _file_system(status.parent).get_file_info(str(status)).size == 0:
        assert _read_frame(_file_system(status.parent), "over.bin", str(status), 0, 16) == said_empty
    assert _read_frame(filesystem, "gone.bin", str(tmp_path / "gone.bin"), 16, limit) == (
        b"", "point file 'gone.bin' does not exist")
