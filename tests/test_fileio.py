"""The atomic writers: readers see the old file or the new one, never a part."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt import fileio
from pointpillars_trt.fileio import write_json_atomic, write_text_atomic


def test_atomic_text_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old content that is longer than the new one\n")
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_json_numpy_values(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    obj = {"count": np.int32(3), "ms": np.float32(1.5), "box": np.arange(3.0), "name": "x"}
    write_json_atomic(target, obj)
    assert json.loads(target.read_text()) == {"count": 3, "ms": 1.5, "box": [0.0, 1.0, 2.0], "name": "x"}
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text())["count"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_atomic_failure_keeps_old_file_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("old\n")

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_text_atomic(target, "new\n")
    monkeypatch.undo()
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_atomic_write_respects_umask(tmp_path: Path) -> None:
    if os.name != "posix":
        pytest.skip("POSIX permission bits")
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "p.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "p.txt").stat().st_mode & 0o777 == 0o644
