"""``eval`` against hostile files: every one is a single ``error:`` line, at once, without warnings.

Each case runs the CLI in this process on a thread with a deadline, so a read that blocks (a FIFO)
fails the test instead of hanging it; warnings are errors while it runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from pointpillars_trt.apps.cli import main

GT = "Car 0 0 0 100 150 180 210 1.5 1.6 3.9 -12 1.6 20 0.3\n"
PRED = "Car 0 0 0 100 150 180 210 1.5 1.6 3.9 -12 1.6 20 0.3 0.9\n"


def eval_cli(*args: object, deadline: float = 20.0) -> tuple[int, str]:
    """``pointpillars-trt eval ARGS`` with warnings as errors: (exit code, stderr); fails past the deadline."""
    result: list[tuple[int, str]] = []

    def target() -> None:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("error")
            rc = main(["eval", *map(str, args)])
        result.append((rc, err.getvalue()))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(deadline)
    assert result, f"eval did not return within {deadline} s"
    return result[0]


@pytest.fixture()
def folders(tmp_path: Path) -> tuple[Path, Path]:
    labels, pred = tmp_path / "label_2", tmp_path / "pred"
    labels.mkdir()
    pred.mkdir()
    (labels / "000000.txt").write_text(GT)
    (pred / "000000.txt").write_text(PRED)
    return labels, pred


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def sparse_huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(8 * 2**30)


Damage = Callable[[Path], None]


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("which", ["label", "prediction", "ids"])
@pytest.mark.parametrize("damage, problem", [(fifo, "FIFO"), (dev_zero, "character device"),
                                             (sparse_huge, "more than the limit")])
def test_unreadable_label_prediction_or_ids_file(folders: tuple[Path, Path], tmp_path: Path, which: str,
                                                 damage: Damage, problem: str) -> None:
    labels, pred = folders
    ids = tmp_path / "ids.txt"
    ids.write_text("000000\n")
    target = {"label": labels / "000000.txt", "prediction": pred / "000000.txt", "ids": ids}[which]
    damage(target)
    rc, err = eval_cli("--pred", pred, "--labels", labels, "--ids", ids)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"{which if which != 'ids' else 'frame id'} file" in lines[0] and str(target) in lines[0]
    assert problem in lines[0]


@pytest.mark.parametrize("line", [
    "Car 0 0 0 100 150 180 210 1e300 1e300 1e300 1e300 1.6 1e300 0.3 0.9",
    "Car 0 0 0 -1e200 150 1e200 210 1.5 1.6 3.9 -12 1.6 20 0.3 0.9",
])
def test_huge_finite_values_are_refused_without_overflow_warnings(folders: tuple[Path, Path], line: str) -> None:
    labels, pred = folders
    (pred / "000000.txt").write_text(line + "\n")
    rc, err = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 2 and err.count("\n") == 1 and "000000.txt, line 1: a value beyond" in err, err


def test_ids_that_are_paths_are_refused(folders: tuple[Path, Path], tmp_path: Path) -> None:
    labels, pred = folders
    (tmp_path / "ids.txt").write_text("000000\n../../etc/passwd\n")
    rc, err = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert rc == 2 and "'../../etc/passwd', not a file name" in err, err


def test_a_clean_run_still_passes(folders: tuple[Path, Path]) -> None:
    """The same harness on good files: exit 0 and nothing on stderr (so the refusals above are real)."""
    labels, pred = folders
    assert eval_cli("--pred", pred, "--labels", labels) == (0, "")
