"""The kept cubins' files (``_launch.read_cubin`` / ``write_cubin``): what is read back is what was written, and
a file that is not one whole kept cubin reads as none (the driver would read a cut one past its end). Runs
without a GPU; the GPU test in ``test_neck_head.py`` loads such files on the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from pointpillars_trt.kernels._launch import read_cubin, write_cubin

CUBIN = bytes(range(256)) * 40  # any bytes: the files do not look inside


def test_a_kept_cubin_reads_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "kernels" / "k.cubin"  # its folder made on the way
    write_cubin(path, CUBIN)
    assert read_cubin(path) == CUBIN


@pytest.mark.parametrize("damage", ["cut", "flipped", "empty", "foreign", "missing"])
def test_a_damaged_or_missing_cubin_reads_as_none(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "k.cubin"
    write_cubin(path, CUBIN)
    kept = path.read_bytes()
    if damage == "cut":
        path.write_bytes(kept[: len(kept) // 2])
    elif damage == "flipped":
        path.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "foreign":
        path.write_bytes(CUBIN)  # a cubin without its digest (an older cache's file)
    else:
        path.unlink()
    assert read_cubin(path) is None


def test_a_cache_that_cannot_be_written_is_left_alone(tmp_path: Path) -> None:
    blocked = tmp_path / "kernels"
    blocked.write_text("a file where the cache's folder would be")
    write_cubin(blocked / "k.cubin", CUBIN)  # no exception: the next process compiles again
    assert read_cubin(blocked / "k.cubin") is None and blocked.read_text().startswith("a file")
