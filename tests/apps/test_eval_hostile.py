"""``eval`` against hostile files: every one is a single ``error:`` line, at once, without warnings.

Each case runs the CLI in this process on a thread with a deadline, so a read that blocks (a FIFO)
fails the test instead of hanging it; warnings are errors while it runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from pointpillars_trt.apps.cli import main
from pointpillars_trt.apps.eval.io import load_predictions

from test_cli_first_contact import png_header

GT = "Car 0 0 0 100 150 180 210 1.5 1.6 3.9 -12 1.6 20 0.3\n"
PRED = "Car 0 0 0 100 150 180 210 1.5 1.6 3.9 -12 1.6 20 0.3 0.9\n"


def eval_cli(*args: object, deadline: float = 20.0) -> tuple[int, str, str]:
    """``pointpillars-trt eval ARGS`` with warnings as errors: (exit code, stderr, stdout); fails past the deadline."""
    result: list[tuple[int, str, str]] = []

    def target() -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("error")
            rc = main(["eval", *map(str, args)])
        result.append((rc, err.getvalue(), out.getvalue()))

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
@pytest.mark.parametrize("which, damage, problem", [
    (which, damage, problem) for which in ("label", "prediction", "ids")
    for damage, problem in ((fifo, "FIFO"), (dev_zero, "character device"), (sparse_huge, "more than the limit"))
    if (which, damage) != ("ids", fifo)])  # an --ids FIFO is read: test_ids_from_a_fifo_are_read_once_as_from_a_file
def test_unreadable_label_prediction_or_ids_file(folders: tuple[Path, Path], tmp_path: Path, which: str,
                                                 damage: Damage, problem: str) -> None:
    labels, pred = folders
    ids = tmp_path / "ids.txt"
    ids.write_text("000000\n")
    target = {"label": labels / "000000.txt", "prediction": pred / "000000.txt", "ids": ids}[which]
    damage(target)
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--ids", ids)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"{which if which != 'ids' else 'frame id'} file" in lines[0] and str(target) in lines[0]
    assert problem in lines[0]


def fifo_writer(path: Path, data: bytes) -> threading.Thread:
    """A FIFO made at ``path`` and a thread writing ``data`` into it (as bash's ``<(cmd)`` gives a pipe its command
    writes), which ends when its reader has read all or closed the FIFO."""
    os.mkfifo(path)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(path, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_ids_from_a_fifo_are_read_once_as_from_a_file(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """``--ids <(cmd)`` names a pipe (/dev/fd/63), which was refused as "not a regular file": read to its end, it
    evaluates the frames a file of the same lines does."""
    labels, pred = folders
    (labels / "000001.txt").write_text(GT)
    (pred / "000001.txt").write_text("")
    (tmp_path / "ids.txt").write_text("000000\n")
    writer = fifo_writer(tmp_path / "ids.fifo", b"000000\n")
    from_fifo = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.fifo")
    writer.join(5)
    from_file = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert from_fifo == from_file and from_file[:2] == (0, "") and from_file[2].startswith("1 frame, "), from_fifo
    assert not writer.is_alive()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_ids_from_a_fifo_past_the_limit_are_one_error_line_and_no_more_is_read(folders: tuple[Path, Path],
                                                                              tmp_path: Path) -> None:
    """A pipe gives no size to refuse it by: read a chunk at a time, it is refused a byte past the limit of an id
    file, and closed, which ends its writer."""
    from pointpillars_trt.apps.eval.io import MAX_TEXT_BYTES

    labels, pred = folders
    writer = fifo_writer(tmp_path / "ids.fifo", b"000000\n" * (MAX_TEXT_BYTES // 7 + 2**18))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.fifo")
    writer.join(5)
    assert (rc, err, out) == (2, f"error: frame id file '{tmp_path / 'ids.fifo'}' is a FIFO (named pipe) that gives "
                                 f"more than the limit of {MAX_TEXT_BYTES} bytes\n", "")
    assert not writer.is_alive()


def test_ids_that_are_a_folder_or_nothing_are_still_refused(folders: tuple[Path, Path], tmp_path: Path) -> None:
    labels, pred = folders
    assert eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path)[:2] == (
        2, f"error: frame id file '{tmp_path}' is a directory, not a regular file\n")
    assert eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "none.txt")[:2] == (
        2, f"error: frame id file '{tmp_path / 'none.txt'}' does not exist\n")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ids_given_by_bash_process_substitution_are_read(folders: tuple[Path, Path], repo_root: Path) -> None:
    """``pointpillars-trt eval --ids <(cmd)`` as a user types it: bash hands the command /dev/fd/63, a pipe."""
    labels, pred = folders
    done = subprocess.run(["bash", "-c", f'exec "$0" -m pointpillars_trt eval --pred "$1" --labels "$2" '
                           f'--ids <(printf "000000\\n")', sys.executable, str(pred), str(labels)],
                          capture_output=True, text=True, timeout=120, cwd=repo_root,
                          env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert (done.returncode, done.stderr) == (0, "") and done.stdout.startswith(f"1 frame, predictions {pred}\n")


@pytest.mark.parametrize("line", [
    "Car 0 0 0 100 150 180 210 1e300 1e300 1e300 1e300 1.6 1e300 0.3 0.9",
    "Car 0 0 0 -1e200 150 1e200 210 1.5 1.6 3.9 -12 1.6 20 0.3 0.9",
])
def test_huge_finite_values_are_refused_without_overflow_warnings(folders: tuple[Path, Path], line: str) -> None:
    labels, pred = folders
    (pred / "000000.txt").write_text(line + "\n")
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 2 and err.count("\n") == 1 and "000000.txt', line 1: a value beyond" in err, err


@pytest.mark.parametrize("which", ["pred", "labels"])
@pytest.mark.parametrize("line, problem", [
    ("Car 0 0 0 100 150 180 210 -1.5 1.6 3.9 -12 1.6 20 0.3",
     "a zero or negative height, width or length (h w l = -1.5 1.6 3.9)"),
    ("Car 0 0 0 100 150 180 210 1.5 1.6 -3.9 -12 1.6 20 0.3", "a zero or negative height, width or length"),
    ("Car 0 0 0 100 150 180 210 1.5 0 0 -12 1.6 20 0.3",
     "a zero or negative height, width or length (h w l = 1.5 0 0)"),
    ("Car 0 0 0 100 150 180 210 0.00 1.6 3.9 -12 1.6 20 0.3", "a zero or negative height, width or length"),
    ("Car 0 0 0 180 150 100 210 1.5 1.6 3.9 -12 1.6 20 0.3", "its 2D box runs backwards (left > right or top > bottom)"),
    ("Car 0 0 0 100 210 180 150 1.5 1.6 3.9 -12 1.6 20 0.3", "its 2D box runs backwards"),
])
def test_negative_sizes_and_backwards_2d_boxes_are_refused(folders: tuple[Path, Path], which: str, line: str,
                                                           problem: str) -> None:
    """Each was evaluated (exit 0) with an AP it changed: 3D AP with negative sizes, BEV and 3D AP with a
    prediction of zero length and width (a true positive on any ground truth around it), bbox AP with a 2D box
    whose corners are swapped. DontCare's -1 sizes are KITTI's own and stay."""
    labels, pred = folders
    target = (pred if which == "pred" else labels) / "000000.txt"
    target.write_text(line + (" 0.9" if which == "pred" else "") + "\n")
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 2 and err.count("\n") == 1 and f"{target}', line 1: {problem}" in err, err
    (labels / "000000.txt").write_text(GT + "DontCare -1 -1 -10 500 150 560 190 -1 -1 -1 -1000 -1000 -1000 -10\n")
    (pred / "000000.txt").write_text(PRED)
    assert eval_cli("--pred", pred, "--labels", labels)[0] == 0


def test_ids_that_are_paths_are_refused(folders: tuple[Path, Path], tmp_path: Path) -> None:
    labels, pred = folders
    (tmp_path / "ids.txt").write_text("000000\n../../etc/passwd\n")
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert rc == 2 and "'../../etc/passwd', not a file name" in err, err


def test_ids_that_are_file_names_are_refused_with_the_fix(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """Before: "label file '.../000000.txt.txt' does not exist", a name nobody wrote."""
    labels, pred = folders
    (tmp_path / "ids.txt").write_text("000000.txt\n")
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert (rc, err) == (2, f"error: frame id file '{tmp_path / 'ids.txt'}' lists '000000.txt', a file name: list "
                            "frame ids without the suffix ('000000'), as KITTI's ImageSets/*.txt do\n"), err


@pytest.mark.parametrize("line", ["000000 000001", "000000,000001", "000000\t000001", "# val split",
                                  "000000\x0c000001", "000000\x1e000001", "000000\x85000001", "000000\u2028000001"])
def test_a_line_of_several_ids_is_refused_naming_it(folders: tuple[Path, Path], tmp_path: Path, line: str) -> None:
    """Before: "label file '.../000000 000001.txt' does not exist", the line looked up as one id; two ids joined by a
    form feed, NEL or U+2028 were read as two lines (str.splitlines), which no editor shows."""
    labels, pred = folders
    (tmp_path / "ids.txt").write_text(f"{line}\n000000\n", encoding="utf-8")
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert (rc, err) == (2, f"error: frame id file '{tmp_path / 'ids.txt'}' lists {line!r}, not one frame id: list "
                            "one frame id a line, as KITTI's ImageSets/*.txt do\n"), err


def test_a_prediction_file_without_a_label_is_named_with_the_fix(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """One stray prediction file (or a broken link) in --pred failed the whole evaluation with "label file ...
    does not exist", naming no prediction file; with --ids of the labelled frames it evaluates. The others
    without a label are counted, one in the singular."""
    labels, pred = folders
    (pred / "000007.txt").write_text(PRED)
    (pred / "000008.txt").write_text(PRED)
    (pred / "000009.txt").symlink_to("gone.txt")
    fix = ("; without --ids eval evaluates every prediction file in --pred: pass --ids FILE listing the frames to "
           "evaluate (e.g. KITTI's ImageSets/val.txt), or remove the stray files from --pred\n")
    for others in ("2 more prediction files have", "1 more prediction file has"):
        rc, err, out = eval_cli("--pred", pred, "--labels", labels)
        assert (rc, err, out) == (2, f"error: prediction file '{pred / '000007.txt'}' has no label file: "
                                     f"'{labels / '000007.txt'}' does not exist (and {others} none)" + fix, ""), err
        (pred / "000008.txt").unlink(missing_ok=True)
    (pred / "000007.txt").unlink()
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, err) == (2, f"error: prediction file '{pred / '000009.txt'}' (a broken symbolic link) has no label "
                            f"file: '{labels / '000009.txt'}' does not exist" + fix), err
    (tmp_path / "ids.txt").write_text("000000\n")
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert (rc, err) == (0, "") and out.startswith("1 frame, predictions "), err


def test_prediction_or_label_files_named_without_the_zero_padding_are_named_with_the_fix(
        folders: tuple[Path, Path], tmp_path: Path) -> None:
    """Prediction files named 0.txt (or 0.json) beside labels named 000000.txt were refused as stray files to remove,
    or with --ids 000000 as missing: every file was there, misnamed, and neither message said so. Label files named
    0.txt were met alike. Now each names the file of the other spelling and which files to rename."""
    labels, pred = folders
    padding = "KITTI frame ids are zero-padded to 6 digits"
    (pred / "000000.txt").rename(pred / "0.txt")
    (tmp_path / "ids.txt").write_text("000000\n")
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, out, err) == (2, "", f"error: prediction file '{pred / '0.txt'}' has no label file: '{labels / '0.txt'}' "
                                     f"does not exist; '000000.txt' is there: {padding}; rename the prediction files "
                                     "to 6-digit ids (000000.txt, not 0.txt)\n"), err
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--ids", tmp_path / "ids.txt")
    assert (rc, out, err) == (2, "", f"error: prediction file '{pred / '000000.txt'}' does not exist; '0.txt' is there: "
                                     f"{padding}; rename the prediction files to 6-digit ids (000000.txt, not 0.txt)\n"), err
    labels_json, pred_json, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    (pred_json / "000000.json").rename(pred_json / "0.json")
    rc, err, out = eval_cli("--pred", pred_json, "--labels", labels_json, "--calib", calib, "--ids", tmp_path / "ids.txt")
    assert (rc, out, err) == (2, "", f"error: prediction file '{pred_json / '000000.json'}' does not exist; '0.json' is "
                                     f"there: {padding}; rename the prediction files to 6-digit ids (000000.json, not 0.json)\n"), err
    (pred / "0.txt").rename(pred / "000000.txt")
    (labels / "000000.txt").rename(labels / "0.txt")
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, out, err) == (2, "", f"error: prediction file '{pred / '000000.txt'}' has no label file: "
                                     f"'{labels / '000000.txt'}' does not exist; '0.txt' is there: {padding}; rename the "
                                     "label files to 6-digit ids (000000.txt, not 0.txt)\n"), err


def test_a_clean_run_still_passes(folders: tuple[Path, Path]) -> None:
    """The same harness on good files: exit 0 and nothing on stderr (so the refusals above are real)."""
    labels, pred = folders
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, err) == (0, "") and out.startswith("1 frame, predictions "), out


# --------------------------------------------------------------------------- --json target

def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("where, problem", [
    ("missing/ap.json", ": its folder '{root}/missing' does not exist"),
    ("pred", " is an existing folder; --json names a file"),
    ("a_file/ap.json", ": its folder '{root}/a_file' is a file, not a folder"),
    ("", ": an empty file name (an unset variable?); name the file to write"),
])
def test_a_json_target_that_cannot_be_written_is_refused_before_evaluating(folders: tuple[Path, Path],
                                                                           tmp_path: Path, where: str,
                                                                           problem: str) -> None:
    """Before: the whole evaluation ran, then the error named the writer's hidden temp file."""
    labels, pred = folders
    (tmp_path / "a_file").write_text("x")
    before = _files(tmp_path)
    target = str(tmp_path / where) if where else ""
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--json", target)
    assert rc == 2 and err == f"error: --json '{target}'{problem.format(root=tmp_path)}\n", err
    assert out == ""  # no table: nothing was evaluated
    assert _files(tmp_path) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_json_target_that_is_a_fifo_or_device_is_refused_not_replaced(folders: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    """Before: the atomic rename replaced the node with a regular file and said "wrote" (``--json /dev/null``
    run as root replaced /dev/null itself). A FIFO stands in for the device here."""
    labels, pred = folders
    fifo = tmp_path / "ap.json"
    os.mkfifo(fifo)
    before = _files(tmp_path)
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--json", fifo)
    assert rc == 2 and out == "", (err, out)
    assert err == f"error: --json '{fifo}' is a FIFO (named pipe), which writing a file there would replace: " \
                  "name a regular file (or leave --json out)\n", err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _files(tmp_path) == before


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs sysfs, where nobody (root neither) makes files")
def test_a_json_target_in_a_folder_that_takes_no_files_is_refused_before_evaluating(folders: tuple[Path, Path]) -> None:
    labels, pred = folders
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--json", "/sys/kernel/ap.json")
    assert rc == 2 and out == "", (err, out)
    assert err.startswith("error: --json '/sys/kernel/ap.json': cannot write in its folder '/sys/kernel': ")
    assert err.count("\n") == 1 and "pp-tmp" not in err and "probe" not in err, err


def test_json_report_is_written_and_said(folders: tuple[Path, Path], tmp_path: Path) -> None:
    labels, pred = folders
    target = tmp_path / "ap.json"
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--json", target)
    assert (rc, err) == (0, ""), err
    assert out.endswith(f"\nwrote {target}\n"), out
    report = json.loads(target.read_text())
    assert set(report) == {"Car", "Pedestrian", "Cyclist", "loose"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


# --------------------------------------------------------------------------- JSON predictions (infer --format json)

#: Rect camera = lidar with its axes turned (x_cam = -y, y_cam = -z, z_cam = x), a pinhole P2 and no
#: rectification, so the lidar box of the GT line can be written down by hand.
CALIB = ("P2: 700 0 600 0 0 700 180 0 0 0 1 0\n"
         "R0_rect: 1 0 0 0 1 0 0 0 1\n"
         "Tr_velo_to_cam: 0 -1 0 0 0 0 -1 0 1 0 0 0\n")
#: GT's car (bottom centre -12 1.6 20 in camera, h 1.5 w 1.6 l 3.9, rotation_y 0.3) as a lidar box:
#: x = z_cam, y = -x_cam, z = -y_cam + h / 2; dx = l, dy = w, dz = h; heading = -(rotation_y + pi/2).
GT_CAR_LIDAR = [20.0, 12.0, -0.85, 3.9, 1.6, 1.5, -0.3 - math.pi / 2]
#: A car 10 m behind the camera: no part of it is in the image.
BEHIND_LIDAR = [-10.0, 0.0, -0.85, 3.9, 1.6, 1.5, 0.0]
#: A car 10 m ahead and 9 m to the right: its corners project to u = 1080 ... ~1450, past the image's right edge.
RIGHT_EDGE_LIDAR = [10.0, -9.0, -0.85, 3.9, 1.6, 1.5, 0.0]


def assumed_image_note(root: Path, images: str | None = None, frames: int = 1) -> str:
    """eval's note for the JSON frames (one, or two) whose camera images in ``root``/image_2 are missing, naming that
    folder ``images`` (None: absolute)."""
    images = str(root.absolute() / "image_2") if images is None else images
    if frames == 2:
        return (f"note: 2 JSON prediction frames have no camera image in {images!r} to take "
                "their size from, so their 2D boxes were clipped to KITTI's usual 1242 x 375 image; if the camera's "
                "image is another size, pass --image-shape H,W (e.g. 370,1224) or put the frames' image_2 PNGs there\n")
    return (f"note: 1 JSON prediction frame has no camera image in {images!r} to take "
            "its size from, so its 2D boxes were clipped to KITTI's usual 1242 x 375 image; if the camera's "
            "image is another size, pass --image-shape H,W (e.g. 370,1224) or put the frame's image_2 PNG there\n")


def _json_predictions(tmp_path: Path, boxes: list[list[float]], scores: list[float]) -> tuple[Path, Path, Path]:
    """(label folder, prediction folder of one infer-style JSON record, calib folder) for frame 000000."""
    labels, pred, calib = tmp_path / "label_2", tmp_path / "pj", tmp_path / "calib"
    for folder in (labels, pred, calib):
        folder.mkdir(exist_ok=True)
    (labels / "000000.txt").write_text(GT)
    (calib / "000000.txt").write_text(CALIB)
    record = {"frame": "000000", "boxes_lidar": boxes, "scores": scores, "labels": ["Car"] * len(scores)}
    (pred / "000000.json").write_text(json.dumps(record))  # NaN and Infinity as Python's json writes them
    return labels, pred, calib


@pytest.mark.parametrize("boxes, scores, field, problem", [
    ([[math.nan, *GT_CAR_LIDAR[1:]]], [0.9], "boxes_lidar[0]", "a NaN or infinite value"),
    ([GT_CAR_LIDAR, [1e300, *GT_CAR_LIDAR[1:]]], [0.9, 0.8], "boxes_lidar[1]",
     "a value beyond +-100000 (no KITTI box, pixel, angle or score is that large)"),
    ([GT_CAR_LIDAR], [math.inf], "scores[0]", "a NaN or infinite value"),
    ([GT_CAR_LIDAR], [1e6], "scores[0]", "a value beyond +-100000 (no KITTI box, pixel, angle or score is that large)"),
    ([GT_CAR_LIDAR, [*GT_CAR_LIDAR[:3], -3.9, 1.6, 1.5, GT_CAR_LIDAR[6]]], [0.9, 0.8], "boxes_lidar[1]",
     "a zero or negative dx, dy or dz"),
    ([[*GT_CAR_LIDAR[:3], 0.0, 0.0, 1.5, GT_CAR_LIDAR[6]], GT_CAR_LIDAR], [0.9, 0.8], "boxes_lidar[0]",
     "a zero or negative dx, dy or dz"),
])
def test_non_finite_or_absurd_json_predictions_are_refused_like_label_lines(tmp_path: Path, boxes: list[list[float]],
                                                                           scores: list[float], field: str,
                                                                           problem: str) -> None:
    """Before: the box was dropped without a word and the frame evaluated as if it had none (exit 0)."""
    labels, pred, calib = _json_predictions(tmp_path, boxes, scores)
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib, "--json", tmp_path / "ap.json")
    assert rc == 2 and err == f"error: prediction file '{pred / '000000.json'}', {field}: {problem}\n", err
    assert out == "" and not (tmp_path / "ap.json").exists()


@pytest.mark.parametrize("source", [5, None, ["a.bin"]])
def test_a_json_record_whose_source_is_no_path_is_refused(tmp_path: Path, source: object) -> None:
    """A record whose 'source' is a number, null or a list (no record infer writes) was evaluated as an earlier
    version's record, which names no source (its split taken for the labels'): it is refused naming the field."""
    labels, pred, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    record = json.loads((pred / "000000.json").read_text())
    (pred / "000000.json").write_text(json.dumps({**record, "source": source}))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, out, err) == (2, "", f"error: prediction file '{pred / '000000.json'}' is not an infer JSON record: "
                                     f"\"'source' is {source!r}, not the path of a point file\"\n"), err


@pytest.mark.parametrize("frame", [5, None, ["000000"], {"id": "000000"}])
def test_a_json_record_whose_frame_is_no_name_is_refused(tmp_path: Path, frame: object) -> None:
    """A record whose 'frame' is a number, null, a list or an object (another tool's JSON) was evaluated as the
    file's frame: it is refused as the other malformed records are."""
    labels, pred, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    record = json.loads((pred / "000000.json").read_text())
    (pred / "000000.json").write_text(json.dumps({**record, "frame": frame}))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, out, err) == (2, "", f"error: prediction file '{pred / '000000.json'}' is not an infer JSON record: "
                                     f"\"'frame' is {frame!r}, not a frame's name\"\n"), err


def _ap_lines(table: str, metric: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith(metric)]


def test_json_boxes_outside_the_camera_image_are_left_out_and_counted(tmp_path: Path) -> None:
    """An out-of-view box changes no AP (it is left out, as infer --format kitti leaves it out) and is
    counted; the in-view box scores as the GT line itself does as a .txt prediction."""
    labels, pred, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    rc, err, alone = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, err) == (0, assumed_image_note(tmp_path)) and alone.startswith(f"1 frame, predictions {pred}\n"), alone
    _json_predictions(tmp_path, [GT_CAR_LIDAR, BEHIND_LIDAR], [0.9, 0.95])
    rc, err, both = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, err) == (0, assumed_image_note(tmp_path)), err
    first, table = both.split("\n", 1)
    assert first == (f"1 frame, predictions {pred} (1 box outside the camera image left out, "
                     "as infer --format kitti leaves them out)")
    assert table == alone.split("\n", 1)[1]
    txt = tmp_path / "pred_txt"
    txt.mkdir()
    (txt / "000000.txt").write_text(PRED)
    rc, err, as_txt = eval_cli("--pred", txt, "--labels", labels)
    assert (rc, err) == (0, "")
    for metric in ("bev  AP", "3d   AP"):  # the 2D box is the projection, not the label's: bbox and aos differ
        assert _ap_lines(table, metric) == _ap_lines(as_txt, metric), metric
    assert any(float(v) > 0 for line in _ap_lines(table, "3d   AP") for v in line.split(":")[1].split(","))


def test_json_predictions_clip_2d_boxes_to_the_camera_image_beside_calib_else_say_the_size_assumed(
        tmp_path: Path) -> None:
    """Before: every JSON frame's 2D boxes were clipped to 1242 x 375 without a word, whatever the camera's image
    (KITTI has 1224 x 370 too). Now the calib folder's sibling image_2/<id>.png gives the size, else a note says
    KITTI's usual one was assumed, for one frame in the singular."""
    labels, pred, calib = _json_predictions(tmp_path, [RIGHT_EDGE_LIDAR], [0.9])
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, err) == (0, assumed_image_note(tmp_path))
    assert load_predictions(pred, ["000000"], calib).bbox[0, 2] == 1241.0  # x2 clipped to x <= W - 1
    (tmp_path / "image_2").mkdir()
    (tmp_path / "image_2" / "000000.png").write_bytes(png_header(1224, 370))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, err) == (0, "")
    assert load_predictions(pred, ["000000"], calib).bbox[0, 2] == 1223.0
    (tmp_path / "image_2" / "000000.png").unlink()
    for folder, suffix in ((labels, ".txt"), (pred, ".json"), (calib, ".txt")):  # a second frame, as the first
        (folder / f"000001{suffix}").write_text((folder / f"000000{suffix}").read_text().replace("000000", "000001"))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, err) == (0, assumed_image_note(tmp_path, frames=2)), err


def test_json_predictions_beside_a_camera_image_that_does_not_hold_the_principal_point_are_refused(
        tmp_path: Path) -> None:
    """A camera image turned (375 wide, 1242 high) holds no principal point of the calibration (P2: x 600, y 180):
    its 2D boxes were clipped to it without a word. Now it is one error naming it and the calib file, and
    --image-shape, which stands before it, evaluates the frame."""
    labels, pred, calib = _json_predictions(tmp_path, [RIGHT_EDGE_LIDAR], [0.9])
    (tmp_path / "image_2").mkdir()
    (tmp_path / "image_2" / "000000.png").write_bytes(png_header(375, 1242))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, out, err) == (2, "", f"error: image file '{tmp_path / 'image_2' / '000000.png'}' is an image 375 wide "
                                     "and 1242 high, which does not hold the camera's principal point in "
                                     f"'{calib / '000000.txt'}' (P2: x 600, y 180): it is not this camera's image "
                                     "(another camera's, or a copy resized or turned); put the camera's own images "
                                     "there, or give their size with --image-shape H,W\n"), err
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--calib", calib, "--image-shape", "375,1242")
    assert (rc, err) == (0, ""), err


def test_json_predictions_name_the_camera_image_and_its_folder_as_calib_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --calib given relative had the image folder beside it (the note of the size assumed) and a camera image that
    is no PNG named absolute: each is named relative, as --calib is given."""
    _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    monkeypatch.chdir(tmp_path)
    rc, err, _ = eval_cli("--pred", "pj", "--labels", "label_2", "--calib", "calib/")
    assert (rc, err) == (0, assumed_image_note(tmp_path, "image_2")), err
    monkeypatch.chdir(tmp_path / "calib")
    rc, err, _ = eval_cli("--pred", "../pj", "--labels", "../label_2", "--calib", ".")
    assert (rc, err) == (0, assumed_image_note(tmp_path, "../image_2")), err
    (tmp_path / "image_2").mkdir()
    (tmp_path / "image_2" / "000000.png").write_bytes(b"GIF89a" + bytes(40))
    rc, err, _ = eval_cli("--pred", "../pj", "--labels", "../label_2", "--calib", ".")
    assert (rc, err) == (2, "error: image file '../image_2/000000.png' is not a PNG (no PNG signature and IHDR "
                            "chunk)\n"), err


def test_camera_options_with_only_txt_predictions_are_said_unused_and_change_nothing(folders: tuple[Path, Path],
                                                                                    tmp_path: Path) -> None:
    """Before: --calib and --image-shape were taken without a word with KITTI .txt predictions, whose own 2D
    boxes they never touch. Now one note says so (the table is the same); a JSON folder, by --pred or
    --compare, uses them, and then nothing is said."""
    labels, pred = folders
    rc, err, plain = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, err) == (0, "")
    _, pj, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib, "--image-shape", "370,1224")
    assert rc == 0 and out == plain
    assert err == (f"note: --calib and --image-shape not used: --pred {str(pred)!r} holds KITTI .txt predictions, "
                   "which carry their own 2D boxes; they serve JSON predictions only: drop them\n"), err
    twin = shutil.copytree(pred, tmp_path / "twin")
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--image-shape", "370,1224", "--compare", twin)
    assert rc == 0 and out.startswith(plain)
    assert err == (f"note: --image-shape not used: --pred {str(pred)!r} and --compare {str(twin)!r} hold KITTI .txt "
                   "predictions, which carry their own 2D boxes; it serves JSON predictions only: drop it\n"), err
    for json_folder in (["--pred", pj], ["--pred", pred, "--compare", pj]):
        rc, err, _ = eval_cli(*json_folder, "--labels", labels, "--calib", calib, "--image-shape", "375,1242")
        assert (rc, err) == (0, ""), (json_folder, err)


#: A 0.2 m box 40 m ahead and 36.2 m to the right: its corners (x_cam 36.1 ... 36.3, depth 39.9 ... 40.1) project to
#: u = 700 x_cam / depth + 600 = 1230.2 ... 1236.8 and v = 181.7 ... 208.1, inside a 1242 x 375 image and
#: wholly right of a 1224 x 370 one (x <= 1223): which size clips it decides whether it is out of view.
RIGHT_STRIP_LIDAR = [40.0, -36.2, -0.85, 0.2, 0.2, 1.5, 0.0]


def test_image_shape_clips_json_predictions_for_every_frame_before_the_png_and_says_nothing(tmp_path: Path) -> None:
    """Before: eval had no --image-shape, so a camera without image_2 PNGs at hand could only be evaluated at
    KITTI's usual 1242 x 375. Now --image-shape sizes every frame's image, ahead of the PNG as in infer,
    with no note; its value is read as infer reads it (H,W, the WxH form refused)."""
    labels, pred, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR, RIGHT_STRIP_LIDAR], [0.9, 0.8])
    (tmp_path / "image_2").mkdir()
    (tmp_path / "image_2" / "000000.png").write_bytes(png_header(1242, 375))
    left_out = f"1 frame, predictions {pred} (1 box outside the camera image left out, as infer --format kitti"
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert (rc, err) == (0, "") and out.startswith(f"1 frame, predictions {pred}\n"), out  # the PNG's 1242 x 375
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib, "--image-shape", "370,1224")
    assert (rc, err) == (0, "") and out.startswith(left_out), out  # the size given, not the PNG's
    (tmp_path / "image_2" / "000000.png").unlink()
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", calib, "--compare",
                            shutil.copytree(pred, tmp_path / "twin"), "--image-shape", "370,1224")
    assert (rc, err) == (0, "") and out.startswith(left_out), out  # no PNG: the size given, and no note
    assert out.count("(1 box outside the camera image left out") == 3, out  # the --compare folder's too
    stderr = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(stderr):
        main(["eval", "--pred", str(pred), "--labels", str(labels), "--image-shape", "1224x370"])
    assert stderr.getvalue() == ("error: pointpillars-trt eval: argument --image-shape: '1224x370': expected "
                                 "HEIGHT,WIDTH in pixels, e.g. 375,1242 for KITTI (not WIDTHxHEIGHT) (see "
                                 "pointpillars-trt eval --help)\n")


@pytest.mark.parametrize("part", ["detections-00000.jsonl", "detections-00000.parquet"])
def test_a_folder_of_row_parts_is_refused_with_how_to_evaluate_them(folders: tuple[Path, Path], tmp_path: Path,
                                                                    part: str) -> None:
    """eval --pred on an infer --format jsonl / parquet folder: its rows are not prediction files, and the
    refusal says how those runs are evaluated, instead of "no .txt or .json files" alone."""
    labels, _ = folders
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / part).write_text("{}\n")
    rc, err, _ = eval_cli("--pred", rows, "--labels", labels)
    assert rc == 2 and err.count("\n") == 1, err
    assert (f"has no .txt or .json files but 1 part file of rows ('{part}'), which eval does not read: "
            "evaluate them as that run's infer with --eval LABEL_DIR --skip-existing") in err, err


def test_json_naming_an_input_file_is_refused_before_anything_is_read(folders: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """``--json`` naming a label or prediction file, or the --ids list, replaced it with the AP table (exit 0), and
    a new file in the prediction folder was read as a prediction by the next evaluation; infer's eval.json beside
    the predictions, or a file elsewhere, is written."""
    labels, pred = folders
    ids = tmp_path / "ids.txt"
    ids.write_text("000000\n")
    before = {path: path.read_bytes() for path in (labels / "000000.txt", pred / "000000.txt", ids)}
    for target, option, folder in ((labels / "000000.txt", "--labels", labels), (pred / "000000.txt", "--pred", pred),
                                   (pred / "ap.json", "--pred", pred)):  # new there: read as a prediction next time
        rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--json", target)
        assert (rc, err) == (2, f"error: --json {str(target)!r} lies in {option} {str(folder)!r}, whose files this "
                                "evaluation reads: write it elsewhere\n"), err
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--ids", ids, "--json", ids)
    assert rc == 2 and "is the --ids file this evaluation reads" in err, err
    assert {path: path.read_bytes() for path in before} == before
    for target in (pred / "eval.json", pred / "eval.json", tmp_path / "ap.json"):
        rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--json", target)
        assert rc == 0 and f"wrote {target}" in out and json.loads(target.read_text()), err


# --------------------------------------------------------------------------- predictions that would score 0 unsaid
def _strict_r11(table: str, metric: str) -> str:
    """The first (Car, strict overlaps, R11) line of a metric, e.g. '3d   AP:9.0909, 9.0909, 9.0909'."""
    return _ap_lines(table, metric)[0]


def _with_2d_box(line: str, box: str) -> str:
    parts = line.split()
    return " ".join(parts[:4] + box.split() + parts[8:]) + "\n"


@pytest.mark.parametrize("box", ["0 0 0 0", "-1 -1 -1 -1", "100 150 180 170"])
def test_predictions_without_a_real_2d_box_are_warned_of_with_the_fix(folders: tuple[Path, Path], box: str) -> None:
    """A lidar-only model's KITTI lines often carry 0 0 0 0 or -1 -1 -1 -1 as their 2D box. KITTI's minimum 2D
    height (25 px at the lowest) then ignores every prediction, in 3D and BEV too: AP 0 everywhere, said by
    nothing. The one car, found by the same 3D box with its real 2D box, has 3D AP 100 / 11 at R11 (one true
    positive fills sample 0 of 11); with a 2D box under 25 px high it has 0, and one warning says why."""
    labels, pred = folders
    rc, err, real = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, err) == (0, "") and _strict_r11(real, "3d   AP") == "3d   AP:9.0909, 9.0909, 9.0909"
    (pred / "000000.txt").write_text(_with_2d_box(PRED, box))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 0 and err.count("\n") == 1, err
    shown = " ".join(f"{float(v):g}" for v in box.split())
    assert err == (f"warning: the one prediction line in {str(pred)!r} has a 2D box under 25 px high (frame "
                   f"'000000': {shown}), which KITTI's evaluation ignores at every difficulty, in BEV and 3D too, so "
                   "it scores no AP; boxes without a real 2D box need one projected into the camera image: "
                   "write them with pointpillars-trt infer --format kitti (through each frame's calib/ folder, or "
                   "--calib DIR), or give them as infer's --format json records to eval --pred with --calib DIR\n")
    for metric in ("bbox AP", "bev  AP", "3d   AP"):
        assert _strict_r11(out, metric) == f"{metric}:0.0000, 0.0000, 0.0000"


def test_low_2d_boxes_are_warned_of_only_when_they_are_most_lines(folders: tuple[Path, Path]) -> None:
    """Far objects have low 2D boxes; a model's far detections are no mistake. Half the lines that low (one of
    two) says nothing, two of three does; the count is of the lines, DontCare aside, whatever their class."""
    labels, pred = folders
    low = _with_2d_box(PRED, "500 150 560 170")  # 20 px high
    (pred / "000000.txt").write_text(PRED + low)
    assert eval_cli("--pred", pred, "--labels", labels)[:2] == (0, "")
    (pred / "000000.txt").write_text(PRED + low + low.replace("Car", "Pedestrian"))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 0 and err.startswith(f"warning: 2 of the 3 prediction lines in {str(pred)!r} have a 2D box under "
                                      "25 px high (e.g. frame '000000': 500 150 560 170)"), err
    (pred / "000000.txt").write_text(PRED + "DontCare -1 -1 -10 0 0 0 0 -1 -1 -1 -1000 -1000 -1000 -10 0.5\n" * 3)
    assert eval_cli("--pred", pred, "--labels", labels)[:2] == (0, "")


def test_json_predictions_are_not_warned_of_for_low_2d_boxes(tmp_path: Path) -> None:
    """Their 2D boxes are projected from the 3D ones: a low one is a far or small object, not a missing box."""
    far = [60.0, 0.0, -0.85, 3.9, 1.6, 1.5, 0.0]  # 1.5 m tall 58 to 62 m ahead: 700 * 1.5 / depth, ~17-18 px high
    labels, pred, calib = _json_predictions(tmp_path, [far], [0.9])
    (tmp_path / "image_2").mkdir()
    (tmp_path / "image_2" / "000000.png").write_bytes(png_header(1242, 375))
    bbox = load_predictions(pred, ["000000"], calib).bbox
    assert 15 < bbox[0, 3] - bbox[0, 1] < 20, bbox
    assert eval_cli("--pred", pred, "--labels", labels, "--calib", calib)[:2] == (0, "")


def _with_source(pred: Path, source: Path) -> None:
    """Give ``pred``'s record of frame 000000 the ``source`` infer writes in it: the point file it read."""
    record = json.loads((pred / "000000.json").read_text())
    (pred / "000000.json").write_text(json.dumps({**record, "source": str(source)}))


def test_json_predictions_of_the_other_kitti_split_than_the_labels_are_refused_naming_file_and_fix(
        tmp_path: Path) -> None:
    """KITTI's training and testing ids overlap: records of testing/velodyne/000000.bin scored against
    training/label_2/000000.txt, another scene (exit 0, an AP said by nothing). Now, as infer --eval refuses such
    frames, one error line names the record, both splits and the fix, and nothing is printed or written, for
    --compare's folder too, and for a --calib folder of the other split; a record of the labels' split, or one
    without a source (an earlier version's), scores."""
    kitti = tmp_path / "kitti"
    (kitti / "training").mkdir(parents=True)
    labels, pred, calib = _json_predictions(kitti / "training", [GT_CAR_LIDAR], [0.9])
    rc, err, plain = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)  # no source
    assert rc == 0, err
    _with_source(pred, kitti / "training" / "velodyne" / "000000.bin")
    assert eval_cli("--pred", pred, "--labels", labels, "--calib", calib) == (rc, err, plain)
    other = tmp_path / "other"
    shutil.copytree(pred, other)
    testing_frame = kitti / "testing" / "velodyne" / "000000.bin"
    _with_source(other, testing_frame)
    for folders, refused in ((("--pred", other), other), (("--pred", pred, "--compare", other), other)):
        rc, err, out = eval_cli(*folders, "--labels", labels, "--calib", calib, "--json", tmp_path / "ap.json")
        assert (rc, out) == (2, ""), out
        assert err == (f"error: prediction file {str(refused / '000000.json')!r}: --labels folder {str(labels)!r} "
                       f"belongs to 'training', frame {str(testing_frame)!r} to 'testing': KITTI training and testing "
                       "ids overlap, so one cannot stand in for the other; evaluate predictions of frames of the "
                       "labels' split, or give --labels of the frames' own split\n"), err
        assert not (tmp_path / "ap.json").exists()
    testing_calib = kitti / "testing" / "calib"  # the testing split's calib files place training frames' boxes
    shutil.copytree(calib, testing_calib)
    training_frame = kitti / "training" / "velodyne" / "000000.bin"
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", testing_calib)
    assert (rc, out) == (2, ""), out
    assert err == (f"error: prediction file {str(pred / '000000.json')!r}: --calib folder {str(testing_calib)!r} "
                   f"belongs to 'testing', frame {str(training_frame)!r} to 'training': KITTI training and testing "
                   "ids overlap, so one cannot stand in for the other; evaluate predictions of frames of the "
                   "calib files' split, or give --calib of the frames' own split\n"), err


@pytest.mark.parametrize("kind", ["1", "Vehicle", "0"])
def test_predictions_of_no_evaluated_class_are_refused_naming_their_types(folders: tuple[Path, Path],
                                                                         kind: str) -> None:
    """A model writing its class index (or another dataset's name) as the type: every line matched no class,
    every AP was 0, exit 0 and not a word. Now one error names the types and the fix; nothing is printed."""
    labels, pred = folders
    (pred / "000000.txt").write_text(PRED.replace("Car", kind, 1) * 2 + PRED.replace("Car", "2", 1))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    order = f"'{kind}' (2), '2' (1)"  # the most frequent first
    assert (rc, out) == (2, ""), out
    assert err == (f"error: no prediction line in {str(pred)!r} is of a class evaluated (Car, Pedestrian, Cyclist), "
                   f"so every AP would be 0: their types are {order}; name each line's type as KITTI does (Car, "
                   "Van, Truck, Pedestrian, Person_sitting, Cyclist, Tram, Misc or DontCare, in any letter case), "
                   "not by a class index or another dataset's name\n"), err


def test_predictions_of_kitti_classes_not_evaluated_are_refused_naming_the_classes_option(
        folders: tuple[Path, Path]) -> None:
    """Van predictions evaluated for Car, Pedestrian and Cyclist (Van is don't-care for Car, never a hit): the
    error says how to evaluate them, and that evaluation runs, saying that these labels hold no Van to find."""
    labels, pred = folders
    (pred / "000000.txt").write_text(PRED.replace("Car", "Van", 1) + PRED.replace("Car", "Tram", 1))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, err) == (2, f"error: no prediction line in {str(pred)!r} is of a class evaluated (Car, Pedestrian, "
                            "Cyclist), so every AP would be 0: their types are 'Tram' (1), 'Van' (1); evaluate them "
                            "with eval --classes Van\n"), err
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--classes", "Van")
    assert (rc, err) == (0, "note: the ground truth of the one frame has no object to count for Van (every "
                            "difficulty): AP there is 0 whatever the predictions (a difficulty counts an object by "
                            "its occlusion, truncation and 2D box height)\n"), err
    assert out.splitlines()[1] == "Van AP@0.70, 0.70, 0.70:", out
    (pred / "000000.txt").write_text(PRED.replace("Car", "Tram", 1))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 2 and err.endswith("their types are 'Tram' (1); eval evaluates Car, Pedestrian, Cyclist, Van, "
                                    "Person_sitting, Truck only\n"), err


def test_types_kitti_has_not_beside_evaluated_ones_are_warned_of_and_change_no_ap(folders: tuple[Path, Path]) -> None:
    """A model of KITTI's classes and others (say, a Vehicle class): one warning counts the lines of each
    unknown type; the AP is the one of the KITTI lines alone. Letter case is read as the reader reads it
    (car is Car), so it is no unknown type."""
    labels, pred = folders
    rc, err, alone = eval_cli("--pred", pred, "--labels", labels)
    assert (rc, err) == (0, "")
    vehicle = _with_2d_box(PRED, "400 150 480 210").replace("-12 1.6 20", "-2 1.6 20").replace("Car", "Vehicle", 1)
    (pred / "000000.txt").write_text(PRED.replace("Car", "car", 1) + vehicle * 3 + vehicle.replace("Vehicle", "9"))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 0 and out == alone, out
    assert err == (f"warning: 4 of the 5 prediction lines in {str(pred)!r} are of types KITTI has not, 'Vehicle' "
                   "(3), '9' (1): they match no ground truth and count for no class; name each line's type as KITTI "
                   "does (Car, Van, Truck, Pedestrian, Person_sitting, Cyclist, Tram, Misc or DontCare, in any "
                   "letter case)\n"), err


def test_a_compare_folder_is_checked_as_the_pred_folder_is(folders: tuple[Path, Path], tmp_path: Path) -> None:
    labels, pred = folders
    other = tmp_path / "other"
    other.mkdir()
    (other / "000000.txt").write_text(PRED + PRED.replace("Car", "Vehicle", 1))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--compare", other)
    assert rc == 0 and err == (f"warning: 1 of the 2 prediction lines in {str(other)!r} is of a type KITTI has not, "
                               "'Vehicle' (1): it matches no ground truth and counts for no class; name each line's "
                               "type as KITTI does (Car, Van, Truck, Pedestrian, Person_sitting, Cyclist, Tram, Misc or "
                               "DontCare, in any letter case)\n"), err
    (other / "000000.txt").write_text(PRED.replace("Car", "1", 1))
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--compare", other)
    assert (rc, out) == (2, "") and err.startswith(f"error: no prediction line in {str(other)!r}"), err


def test_a_compare_folder_that_is_the_pred_folder_is_refused(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """--compare naming the --pred folder (by its name, another spelling or a symbolic link to it) printed the same
    AP twice without a word; a copy of its files is still a second folder, compared."""
    labels, pred = folders
    (tmp_path / "link").symlink_to(pred)
    for same in (str(pred), f"{tmp_path}/./pred/", str(tmp_path / "link")):
        rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--compare", same)
        assert (rc, out) == (2, "") and err == (
            f"error: --compare {same!r} is the --pred folder {str(pred)!r}: a folder compared with itself shows "
            "the same AP twice; give a second prediction folder (another model's, say)\n"), err
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--compare", shutil.copytree(pred, tmp_path / "twin"))
    assert (rc, err) == (0, "") and str(tmp_path / "twin") in out, out


@pytest.mark.parametrize("option", ["--pred", "--labels", "--compare", "--calib"])
def test_a_file_or_nothing_given_as_a_folder_is_named_so_with_the_folder_the_option_takes(
        folders: tuple[Path, Path], tmp_path: Path, option: str) -> None:
    """Before: 'does not exist or is not a folder' for a file that plainly exists (--pred preds.txt), and a --calib
    file beside KITTI .txt predictions was passed over as unused."""
    labels, pred = folders
    holds = {"--pred": "prediction files (infer --out: KITTI .txt or JSON, one a frame)",
             "--labels": "label files (KITTI's label_2: <frame id>.txt)",
             "--compare": "prediction files (infer --out: KITTI .txt or JSON, one a frame)",
             "--calib": "calib files (KITTI's calib: <frame id>.txt)"}[option]
    given = {"--pred": pred, "--labels": labels}
    for path, problem in ((pred / "000000.txt", "is a file, not a folder"), (tmp_path / "missing", "does not exist")):
        args = {**given, option: path}
        rc, err, out = eval_cli(*(word for pair in args.items() for word in pair))
        assert (rc, out) == (2, ""), (err, out)
        assert err == f"error: {option} {str(path)!r} {problem}: {option} names the folder of {holds}\n"


def test_predictions_that_found_nothing_stay_valid(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """A model may find nothing: empty prediction files (or DontCare lines alone) are no error and no warning."""
    labels, pred = folders
    (labels / "000001.txt").write_text(GT)
    for text in ("", "", "DontCare -1 -1 -10 0 0 0 0 -1 -1 -1 -1000 -1000 -1000 -10 0.5\n"):
        (pred / "000000.txt").write_text(text)
        (pred / "000001.txt").write_text("")
        rc, err, out = eval_cli("--pred", pred, "--labels", labels)
        assert (rc, err) == (0, "") and _strict_r11(out, "3d   AP") == "3d   AP:0.0000, 0.0000, 0.0000", (err, out)


def test_json_predictions_of_no_kitti_type_are_refused_too(tmp_path: Path) -> None:
    labels, pred, calib = _json_predictions(tmp_path, [GT_CAR_LIDAR], [0.9])
    record = json.loads((pred / "000000.json").read_text())
    (pred / "000000.json").write_text(json.dumps({**record, "labels": ["Vehicle"]}))
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)
    assert rc == 2 and err.startswith(f"error: no prediction line in {str(pred)!r} is of a class evaluated (Car, "
                                      "Pedestrian, Cyclist), so every AP would be 0: their types are 'Vehicle' (1)")


def test_json_records_without_a_source_and_calib_of_the_labels_other_split_are_refused(tmp_path: Path) -> None:
    """A record of an earlier version names no point file; its boxes were placed through testing/calib/000000.txt,
    another scene's calibration, and scored against training/label_2 (exit 0, not a word). Now the labels' split
    stands for the record's frame: one error names the file, both folders and the fix, and nothing is printed."""
    kitti = tmp_path / "kitti"
    (kitti / "training").mkdir(parents=True)
    labels, pred, calib = _json_predictions(kitti / "training", [GT_CAR_LIDAR], [0.9])
    testing_calib = kitti / "testing" / "calib"
    shutil.copytree(calib, testing_calib)
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--calib", testing_calib)
    assert (rc, out) == (2, ""), out
    assert err == (f"error: prediction file {str(pred / '000000.json')!r}: --calib folder {str(testing_calib)!r} "
                   f"belongs to 'testing', frame {str(labels / '000000.txt')!r} to 'training': KITTI training and "
                   "testing ids overlap, so one cannot stand in for the other; give --calib of the labels' split\n"), err
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--calib", calib)  # the fix, followed
    assert rc == 0, err


def test_label_lines_of_types_kitti_has_not_are_warned_of(folders: tuple[Path, Path]) -> None:
    """Labels converted from another dataset keep its names ('Vehicle'): such an object is no class's ground truth,
    and a detection on it a false positive. The AP halved (one hit, one false positive: R11 from 1/11 to 0.5/11)
    without a word; now one warning counts the lines of each unknown type and says the fix, of one line in the
    singular. Letter case is no unknown type."""
    labels, pred = folders
    spot = "Car 0 0 0 400 150 480 210 1.5 1.6 3.9 -2 1.6 20 0.3"  # 10 m right of GT's car
    (labels / "000000.txt").write_text(GT.replace("Car", "car", 1) + f"{spot.replace('Car', 'Vehicle')}\n" * 2)
    (pred / "000000.txt").write_text(PRED + f"{spot} 0.95\n")
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--classes", "Car")
    assert rc == 0 and _strict_r11(out, "3d   AP") == "3d   AP:4.5455, 4.5455, 4.5455", out
    assert err == (f"warning: 2 of the 3 label lines in {str(labels)!r} are of types KITTI has not, 'Vehicle' (2): "
                   "they are no class's ground truth, and detections of them count as false positives; name each "
                   "line's type as KITTI does (Car, Van, Truck, Pedestrian, Person_sitting, Cyclist, Tram, Misc or "
                   "DontCare, in any letter case)\n"), err
    (labels / "000000.txt").write_text(GT + f"{spot.replace('Car', 'Vehicle')}\n")
    rc, err, _ = eval_cli("--pred", pred, "--labels", labels, "--classes", "Car")
    assert rc == 0 and err == (f"warning: 1 of the 2 label lines in {str(labels)!r} is of a type KITTI has not, "
                               "'Vehicle' (1): it is no class's ground truth, and detections of it count as false "
                               "positives; name each line's type as KITTI does (Car, Van, Truck, Pedestrian, "
                               "Person_sitting, Cyclist, Tram, Misc or DontCare, in any letter case)\n"), err


def test_classes_predicted_without_ground_truth_to_count_are_noted(folders: tuple[Path, Path]) -> None:
    """A Pedestrian predicted in frames whose labels hold none, and a Car occluded (occlusion 1: moderate and hard
    count it, easy ignores it): AP 0 there, whatever the predictions, printed as a model that missed everything.
    Now one note names each class and difficulty, of one frame in the singular; Cyclist, predicted nowhere, goes
    unsaid."""
    labels, pred = folders
    (labels / "000000.txt").write_text(GT.replace("Car 0 0", "Car 0 1", 1))
    (pred / "000000.txt").write_text(PRED + "Pedestrian 0 0 0 400 150 440 230 1.8 0.6 0.8 2 1.6 20 0 0.8\n")
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    # Car: easy counts nothing; moderate and hard one hit of one object, a single sample: 1/11
    assert rc == 0 and _strict_r11(out, "3d   AP") == "3d   AP:0.0000, 9.0909, 9.0909", out
    assert err == ("note: the ground truth of the one frame has no object to count for Car (easy); Pedestrian "
                   "(every difficulty): AP there is 0 whatever the predictions (a difficulty counts an object by its "
                   "occlusion, truncation and 2D box height)\n"), err
    (labels / "000001.txt").write_text((labels / "000000.txt").read_text())  # a second frame, as the first
    (pred / "000001.txt").write_text((pred / "000000.txt").read_text())
    rc, err, out = eval_cli("--pred", pred, "--labels", labels)
    assert rc == 0 and err == ("note: the ground truth of these 2 frames has no object to count for Car (easy); "
                               "Pedestrian (every difficulty): AP there is 0 whatever the predictions (a difficulty "
                               "counts an object by its occlusion, truncation and 2D box height)\n"), err


def test_a_frame_of_more_box_pairs_than_eval_compares_is_one_error(folders: tuple[Path, Path]) -> None:
    """1,001 label objects against 1,000 predicted boxes in one frame (files of ~100 KB): every pair's overlap
    was computed (100,000 lines a side would take hours); now one error names the frame, the counts and the
    bound, before any overlap is computed. 1,000 x 1,000 is evaluated."""
    from pointpillars_trt.apps.eval.kitti_eval import MAX_FRAME_PAIRS

    labels, pred = folders
    spread = "".join(GT.replace("-12 1.6 20", f"{-12 + 0.01 * i:.2f} 1.6 {20 + 5 * i}") for i in range(1000))
    (pred / "000000.txt").write_text("".join(PRED.replace("-12 1.6 20", f"{-12 + 0.01 * i:.2f} 1.6 {20 + 5 * i}")
                                             for i in range(1000)))
    (labels / "000000.txt").write_text(spread)
    assert MAX_FRAME_PAIRS == 1000 * 1000
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--classes", "Car")
    assert rc == 0 and "Car AP@" in out, err
    (labels / "000000.txt").write_text(spread + GT)
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--classes", "Car")
    assert (rc, out) == (2, "") and err == (
        "error: frame '000000': 1,001 label objects x 1,000 predicted boxes = 1,001,000 pairs to compare, more than "
        "eval compares in one frame (1,000,000; a KITTI frame holds tens of objects, a detector keeps hundreds of "
        "boxes): are these the label and prediction files you meant?\n"), err


def test_more_overlapping_box_pairs_than_eval_matches_in_bounded_memory_is_one_error(
        folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Boxes that all overlap one another, more pairs of them than the bound (lowered here to 8: 3 x 3 boxes on one
    spot make 9): one error, no table; at the bound, evaluated."""
    from pointpillars_trt.apps.eval import kitti_eval

    labels, pred = folders
    monkeypatch.setattr(kitti_eval, "MAX_OVERLAPPING_PAIRS", 9)
    (labels / "000000.txt").write_text(GT * 3)
    (pred / "000000.txt").write_text(PRED * 3)
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--classes", "Car")
    assert rc == 0 and "Car AP@" in out, err
    monkeypatch.setattr(kitti_eval, "MAX_OVERLAPPING_PAIRS", 8)
    rc, err, out = eval_cli("--pred", pred, "--labels", labels, "--classes", "Car")
    assert (rc, out) == (2, "") and err == (
        "error: the predicted boxes overlap label objects in more than 8 pairs, more than eval matches in bounded "
        "memory (an object overlaps a few boxes of its frame as a rule): are these the label and prediction files "
        "you meant?\n"), err
