"""What infer says about the paths it was given and about what it wrote, and how the commands take a
stdout whose reader has gone (``... | head -1``).

Oracles: the paths' own state on disk (missing, empty), the files the run wrote (their lines, their
records), and a JSON run of the same frame for the boxes a KITTI run leaves out.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from out_folder import output_names
from pointpillars_trt.apps.cli import main
from pointpillars_trt.apps.outputs import output_complete

from test_cli import LOOSE, cli, one_car_labels, tiny_frames, tiny_model  # noqa: F401 (fixtures)

REPO_ROOT = Path(__file__).resolve().parents[2]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


# --------------------------------------------------------------------------- paths that give no frame

def test_globs_reach_any_depth_with_two_stars_and_folders_leave_hidden_files_out(tmp_path: Path) -> None:
    """``seq/**/*.bin`` takes the frames of every folder below ``seq`` (a shell with globstar does; it took one
    level only); a folder leaves its hidden files out, as a glob does (macOS's ._*.bin metadata files ran as
    frames), saying so once with the first one's name."""
    from pointpillars_trt.apps.frame_paths import expand_frame_paths

    seq = tmp_path / "seq"
    for name in ("top.bin", "a/y.bin", "a/b/x.bin", "a/b/.hidden.bin", "._top.bin"):
        (seq / name).parent.mkdir(parents=True, exist_ok=True)
        (seq / name).write_bytes(b"\0" * 16)
    assert expand_frame_paths([f"{seq}/**/*.bin"]) == [str(seq / "a/b/x.bin"), str(seq / "a/y.bin"), str(seq / "top.bin")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert expand_frame_paths([str(seq)]) == [str(seq / "top.bin")]
    assert err.getvalue() == (f"note: folder {str(seq)!r}: 1 hidden file left out ('._top.bin': macOS "
                              "metadata?); give one by name to run it\n")
    assert expand_frame_paths([str(seq / "._top.bin")]) == [str(seq / "._top.bin")]  # by name: run


def test_paths_that_give_no_frame_are_one_error_each_before_the_model_loads(tiny_model: Path, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing_bin, missing_folder, missing_plain = tmp_path / "gone.bin", f"{tmp_path}/seq/", tmp_path / "velodyne"
    nothing = f"{tmp_path}/*.xyz"
    run = cli("infer", missing_bin, missing_folder, missing_plain, empty, nothing, "--model", tiny_model,
              "--out", tmp_path / "out", "--device", "cpu", "--no-progress")
    assert run.rc == 2 and run.out == "", run
    assert run.err.splitlines() == [  # no "running on" line: the model was never loaded
        f"error: point file {str(missing_bin)!r} does not exist",
        f"error: {missing_folder!r}: no such file or folder",  # may have meant a folder: not called a point file
        f"error: {str(missing_plain)!r}: no such file or folder",
        f"error: folder {str(empty)!r} holds no point files (.bin, .npy, .pcd)",
        f"error: {nothing!r}: no such file, and no file matches it as a pattern",
    ], run.err
    assert not (tmp_path / "out").exists()


def test_a_fifo_given_by_name_and_a_folder_of_frame_folders_give_no_frame_before_the_model_loads(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """A FIFO named as a frame is a path error (it would block a reader), and a folder whose point files are
    in its subfolders (KITTI's training/ holding velodyne/) names them, since subfolders are not searched."""
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    training = tmp_path / "training"
    for sub in ("velodyne", "calib", "label_2"):
        (training / sub).mkdir(parents=True)
    (training / "velodyne" / "000001.bin").write_bytes(tiny_frames[1].read_bytes())
    (training / "calib" / "000001.txt").write_text("P2: 1 0 0 0 0 1 0 0 0 0 1 0\n")
    run = cli("infer", fifo, training, "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 2 and run.out == "", run
    assert run.err.splitlines() == [
        f"error: {str(fifo)!r} is a FIFO (named pipe), not a regular file: give point files",
        f"error: folder {str(training)!r} holds no point files (.bin, .npy, .pcd); subfolders are not searched: "
        f"{str(training / 'velodyne')!r} holds point files, give them as paths",
    ], run.err


def test_paths_that_give_no_frame_among_frames_are_counted_and_the_rest_run(tiny_model: Path,
                                                                            tiny_frames: list[Path], tmp_path: Path):
    empty, text = tmp_path / "empty", tmp_path / "text.bin"
    empty.mkdir()
    text.write_text("1 2 3 4\n")  # a frame that fails as itself
    out = tmp_path / "out"
    run = cli("infer", tiny_frames[1], tmp_path / "gone.bin", empty, text, tiny_frames[2], "--model", tiny_model,
              "--out", out, "--device", "cpu", "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    errors = error_lines(run.err)
    assert len(errors) == 3, run.err  # the missing file, the empty folder, the text file
    assert f"point file {str(tmp_path / 'gone.bin')!r} does not exist" in errors[0]
    assert str(empty) in errors[1] and str(text) in errors[2]
    assert run.out.startswith("2/3 frames, "), run.out
    assert "1 of 3 frames failed and 2 paths gave no frame (listed above)" in run.err, run.err
    assert output_names(out) == ["000001.json", "000002.json"]


@pytest.mark.parametrize("count, said", [(1, "1 of 1 frame failed and 1 path gave no frame"),
                                         (2, "2 of 2 frames failed and 2 paths gave no frame")])
def test_the_summary_counts_one_failed_frame_and_one_path_in_the_singular(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], count: int, said: str) -> None:
    """The summary's failures line said '1 of 1 frame(s) failed and 1 path(s) gave no frame' for any count."""
    from pointpillars_trt.apps.frame_report import FrameReport
    from pointpillars_trt.apps.outputs import OutputPlan

    paths = [f"gone{i}.bin" for i in range(count)]
    report = FrameReport(count, OutputPlan(), progress=False, where=False, input_errors=paths)
    for i in range(count):
        report.fail(f"{i:06d}.bin", "cannot be read")
    assert report.close() == ([], count)
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"{said} (listed above)", err


def test_a_glob_takes_the_point_files_it_matches_as_a_folder_does(tiny_model: Path, tiny_frames: list[Path],
                                                                  tmp_path: Path):
    """A quoted glob's matches that are no point files (a frame's label beside it) are left out, as a folder's
    files are: they ran as frames (the label's output name clashed with the frame's, stopping the run)."""
    seq = tmp_path / "seq"
    seq.mkdir()
    (seq / "000000.bin").write_bytes(tiny_frames[1].read_bytes())
    (seq / "000000.txt").write_text("Car 0.00 0 0 0 0 10 10 1.5 1.6 3.9 1 1.7 8 0\n")
    out = tmp_path / "out"
    run = cli("infer", f"{seq}/*", "--model", tiny_model, "--out", out, "--device", "cpu", "--no-progress")
    assert run.rc == 0 and "error" not in run.err and run.out.startswith("1/1 frames"), run
    assert output_names(out) == ["000000.json"]


def test_globs_that_match_no_point_file_give_no_frame_before_the_model_loads(tiny_model: Path, tmp_path: Path):
    """Each glob says how many files it matched, none a point file, and the run stops before the model loads as
    for any path that gives no frame (the model loaded, then each match failed as a frame); a file given by name
    is refused as before."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("README.md", "notes.md", "a.json", "b.json"):
        (mixed / name).write_text("{}")
    run = cli("infer", f"{mixed}/*.md", f"{mixed}/*.json", mixed / "README.md", "--model", tiny_model,
              "--device", "cpu", "--no-progress")
    assert run.rc == 2 and run.out == "", run
    assert run.err.splitlines() == [  # no "running on" line: the model was never loaded
        f"error: {f'{mixed}/*.md'!r} matched 2 files, none a point file (.bin, .npy, .pcd)",
        f"error: {f'{mixed}/*.json'!r} matched 2 files, none a point file (.bin, .npy, .pcd)",
        f"error: {str(mixed / 'README.md')!r} is not a point file: it has extension '.md'; supported: .bin, .npy, .pcd",
    ], run.err


def test_point_files_of_formats_not_read_that_folders_and_globs_leave_out_are_one_note(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """.npz and .ply files (refused by name with how to convert them) that a folder or a glob leaves out are counted
    in one note a run, with the first of each and that fix; labels, calib, images and outputs beside the frames are
    not (the run said nothing of them, as if the folder held its point files alone)."""
    fixes = ("save the frame's array from the archive as .npy (np.save('frame.npy', np.load(path)[name]))",
             "convert it to .pcd (e.g. pcl_ply2pcd in.ply out.pcd) or to a float32 .bin or .npy of x, y, z, intensity")
    seq, more = tmp_path / "seq", tmp_path / "more"
    seq.mkdir()
    more.mkdir()
    (seq / "000001.bin").write_bytes(tiny_frames[1].read_bytes())
    (seq / "000002.BIN").write_bytes(tiny_frames[2].read_bytes())
    for name in ("a.npz", "b.npz", "c.PLY", "000001.txt", "000001.png", "000001.json", ".hidden.ply"):
        (seq / name).write_bytes(b"x")
    (more / "000004.bin").write_bytes(tiny_frames[4].read_bytes())
    (more / "d.ply").write_bytes(b"x")
    run = cli("infer", seq, f"{more}/*", tiny_frames[3], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0 and run.out.splitlines()[-1].startswith("4/4 frames"), run
    assert [line for line in run.err.splitlines() if "not read" in line] == [
        f"note: 4 files of point formats that are not read left out of the folders and globs given: 2 .npz (e.g. "
        f"{str(seq / 'a.npz')!r}): {fixes[0]}; 2 .ply (e.g. {str(seq / 'c.PLY')!r}): {fixes[1]}"], run.err
    for path, fix in zip((seq / "a.npz", seq / "c.PLY"), fixes):  # the fix each file named alone gets
        alone = cli("infer", path, "--model", tiny_model, "--device", "cpu", "--no-progress")
        assert alone.rc == 2 and alone.err.rstrip().endswith(fix), alone
    only = cli("infer", f"{more}/*.ply", "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert only.rc == 2 and only.err.splitlines() == [
        f"note: 1 file of point formats that are not read left out of the folders and globs given: 1 .ply ("
        f"{str(more / 'd.ply')!r}): {fixes[1]}",
        f"error: {f'{more}/*.ply'!r} matched 1 file, none a point file (.bin, .npy, .pcd)"], only


@pytest.mark.parametrize("count, files, hidden, eg", [(1, "1 file", "1 hidden file", ""),
                                                     (2, "2 files", "2 hidden files", "e.g. ")])
def test_the_notes_of_files_left_out_and_a_glob_of_no_point_file_count_one_file_in_the_singular(
        tmp_path: Path, count: int, files: str, hidden: str, eg: str) -> None:
    """A folder's hidden point files, its files of formats not read and a glob's matches that are no point files
    were each counted as 'N file(s)'; the file a note names was 'e.g.' one where it was the only one."""
    from pointpillars_trt.apps.frame_paths import expand_frame_paths

    seq = tmp_path / "seq"
    seq.mkdir()
    (seq / "000000.bin").write_bytes(b"\0" * 16)
    for i in range(count):
        for name in (f"._{i}.bin", f"{i}.npz", f"{i}.md"):
            (seq / name).write_bytes(b"x")
    errors: list[str] = []
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert expand_frame_paths([str(seq), f"{seq}/*.md"], errors) == [str(seq / "000000.bin")]
    notes = err.getvalue().splitlines()
    assert len(notes) == 2 and notes[0] == (f"note: folder {str(seq)!r}: {hidden} left out ({eg}'._0.bin': macOS "
                                            "metadata?); give one by name to run it"), notes
    assert notes[1].startswith(f"note: {files} of point formats that are not read left out of the folders and globs "
                               f"given: {count} .npz ({eg}{str(seq / '0.npz')!r}): "), notes
    assert errors == [f"{f'{seq}/*.md'!r} matched {files}, none a point file (.bin, .npy, .pcd)"]


# --------------------------------------------------------------------------- the summary line

@pytest.fixture(scope="module")
def kitti_model(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kitti_model") / "model"
    run = cli("build", "--checkpoint", assets / "checkpoints/pointpillar_openpcdet_synthetic.pth", "--out", out)
    assert run.rc == 0, run
    return out


def test_kitti_summary_counts_the_label_lines_written(kitti_model: Path, assets: Path, tmp_path: Path):
    frame, calib = assets / "kitti/training/velodyne/000001.bin", assets / "kitti/training/calib"
    common = ("--model", kitti_model, "--device", "cpu", "--no-progress", "--no-fov-only")
    as_json = cli("infer", frame, *common, "--out", tmp_path / "json")
    assert as_json.rc == 0, as_json
    detected = len(json.loads((tmp_path / "json/000001.json").read_text())["scores"])
    as_kitti = cli("infer", frame, *common, "--format", "kitti", "--calib", calib, "--out", tmp_path / "kitti")
    assert as_kitti.rc == 0, as_kitti
    lines = len((tmp_path / "kitti/000001.txt").read_text().splitlines())
    assert 0 < lines < detected  # a full scan: boxes behind the camera too
    assert as_json.out.startswith(f"1/1 frames, {detected} boxes, written to "), as_json.out
    assert as_kitti.out.startswith(f"1/1 frames, {lines} boxes ({detected - lines} outside the camera image "
                                   "dropped), written to "), as_kitti.out


@pytest.mark.parametrize(("fmt", "where"), [("json", "nothing written"), ("jsonl", "no detections written")])
def test_a_run_where_no_frame_went_through_claims_nothing_written(tiny_model: Path, tmp_path: Path, fmt: str,
                                                                  where: str):
    frames = tmp_path / "frames"
    frames.mkdir()
    for name in ("a", "b"):
        (frames / f"{name}.bin").write_text("1 2 3 4\n")
    out = tmp_path / "out"
    run = cli("infer", frames, "--model", tiny_model, "--out", out, "--format", fmt, "--device", "cpu",
              "--no-progress")
    assert run.rc == 1 and len(error_lines(run.err)) == 2, run
    assert run.out == f"0/2 frames, 0 boxes, {where}\n", run.out
    if fmt == "json":
        assert output_names(out) == []


# --------------------------------------------------------------------------- stdout closed by its reader

def closed_after_first_line(*args: object) -> tuple[int, str, str]:
    """``pointpillars-trt ARGS`` in a process whose stdout is a pipe this side closes once it has read the
    first line (as ``| head -1`` does): (exit code, that line, stderr)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen([sys.executable, "-m", "pointpillars_trt", *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        return proc.wait(timeout=300), first, err


def test_infer_whose_stdout_closes_still_writes_every_file(tiny_model: Path, tiny_frames: list[Path],
                                                           tmp_path: Path):
    labels = one_car_labels(tmp_path, tiny_frames[1:4])
    out = tmp_path / "out"
    # the summary is the first line; the evaluation table printed after it, and eval.json written after that
    rc, first, err = closed_after_first_line("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", out,
                                             "--eval", labels, "--device", "cpu", "--no-progress", *LOOSE)
    assert first.startswith("3/3 frames, "), (first, err)
    assert rc == 1 and "error" not in err and "Traceback" not in err, err
    assert output_names(out) == ["000001.txt", "000002.txt", "000003.txt", "eval.json"]
    assert all(output_complete(p) for p in out.iterdir() if p.suffix == ".txt")
    assert "Car" in json.loads((out / "eval.json").read_text())


def test_infer_that_only_prints_stops_quietly_when_its_stdout_closes(tiny_model: Path, tiny_frames: list[Path],
                                                                    tmp_path: Path):
    # 300 frames: still running when this side closes the pipe after the first line (with 6, a busy machine let
    # the run print every line into the pipe and end before the close)
    folder = tmp_path / "frames"
    folder.mkdir()
    for index in range(300):
        (folder / f"{index:06d}.bin").write_bytes(tiny_frames[1].read_bytes())
    rc, first, err = closed_after_first_line("infer", folder, "--model", tiny_model, "--device", "cpu",
                                             "--no-progress", *LOOSE)
    assert first.startswith("'000000.bin': "), (first, err)
    assert rc == 1 and "error" not in err and "Traceback" not in err, err



@pytest.mark.parametrize("out", ["folder", "stdout only"])
def test_a_run_started_with_stdout_closed_ends_as_one_whose_reader_went(tiny_model: Path, tiny_frames: list[Path],
                                                                        tmp_path: Path, out: str):
    """``pointpillars-trt ... >&-`` (stdout closed, Python's sys.stdout None): the run writes its files and exits 1
    without a word, as a run whose reader went does; it ended in an AttributeError traceback at its first line,
    before its outputs were written."""
    outputs = ["--out", str(tmp_path / "out")] if out == "folder" else []
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "pointpillars_trt", "infer",
                          *map(str, tiny_frames[1:3]), "--model", str(tiny_model), "--device", "cpu", "--no-progress",
                          *outputs, *LOOSE], stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr and "error" not in run.stderr, run.stderr
    if out == "folder":
        assert output_names(tmp_path / "out") == ["000001.json", "000002.json"]


def test_a_run_started_with_stderr_closed_writes_its_outputs_and_exits_as_with_it_open(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    """``pointpillars-trt ... 2>&-`` (stderr closed, Python's sys.stderr None): the frames are written and the
    summary printed, exit 0; the progress bar's look at stderr had ended the run with exit code 1 and no outputs
    (its AttributeError's traceback going nowhere)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", sys.executable, "-m", "pointpillars_trt", "infer",
                          *map(str, tiny_frames[1:3]), "--model", str(tiny_model), "--device", "cpu", "--out", str(out),
                          *LOOSE], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("2/2 frames"), run.stdout
    assert output_names(out) == ["000001.json", "000002.json"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux): every write to it fails")
@pytest.mark.parametrize("buffered", [True, False])
def test_a_stdout_that_cannot_be_written_is_named_as_standard_output(tiny_model: Path, tiny_frames: list[Path],
                                                                    tmp_path: Path, buffered: bool):
    """``pointpillars-trt ... > log`` on a full disk (/dev/full here): the error names standard output, not the bare
    "No space left on device" that reads as the --out folder's, whose files were written."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"  # the first frame's line fails, not the flush at the end
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", *map(str, tiny_frames[1:3]),
                              "--model", str(tiny_model), "--device", "cpu", "--no-progress", "--out",
                              str(tmp_path / "out"), *LOOSE], stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert error_lines(run.stderr) == ["error: standard output cannot be written: No space left on device"], run.stderr
    if buffered:  # the lines wait in the buffer until the end: every frame's file is written first
        assert output_names(tmp_path / "out") == ["000001.json", "000002.json"]


def test_a_calib_or_label_file_that_is_a_fifo_is_named_by_its_kind(tiny_model: Path, tiny_frames: list[Path],
                                                                   tmp_path: Path):
    """A FIFO where a frame's calib or --eval label file belongs: said as a FIFO, not as a missing file
    (which `ls` would contradict), and never read (it would block)."""
    root = tmp_path / "training"
    (root / "velodyne").mkdir(parents=True)
    (root / "calib").mkdir()
    labels = tmp_path / "label_2"
    labels.mkdir()
    frame = root / "velodyne" / "000001.bin"
    frame.write_bytes(tiny_frames[1].read_bytes())
    os.mkfifo(root / "calib" / "000001.txt")
    os.mkfifo(labels / "000001.txt")
    run = cli("infer", frame, "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", "kitti",
              "--out", tmp_path / "kitti")
    assert run.rc == 1 and (f"calib file '{root / 'calib' / '000001.txt'}' is a FIFO (named pipe), not a regular "
                            "file") in run.err, run
    run = cli("infer", frame, "--model", tiny_model, "--device", "cpu", "--no-progress", "--eval", labels,
              "--calib", tmp_path, "--out", tmp_path / "eval")
    assert run.rc == 2 and run.err.strip() == (f"error: label file '{labels / '000001.txt'}' is a FIFO (named pipe), "
                                               "not a regular file"), run


def test_a_frame_given_again_through_a_symbolic_link_is_refused_before_the_model_loads(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """``frames/`` and ``link/`` (a symbolic link to it) give every frame twice: run twice, and written as two
    rows of one frame in a row format; refused, naming both spellings."""
    frames = tmp_path / "frames"
    frames.mkdir()
    (frames / "000001.bin").write_bytes(tiny_frames[1].read_bytes())
    (tmp_path / "link").symlink_to(frames)
    run = cli("infer", frames, tmp_path / "link", "--model", tiny_model, "--device", "cpu", "--out", tmp_path / "o",
              "--format", "jsonl")
    assert run.rc == 2 and run.out == "" and run.err == (
        f"error: frame '{tmp_path / 'link' / '000001.bin'}' is given twice (as '{frames / '000001.bin'}' too) (by two "
        "arguments, a folder and a file in it, or a symbolic link to it): give each frame once\n"), run


def test_two_frame_names_linked_to_one_stored_file_are_two_frames(tiny_model: Path, tiny_frames: list[Path],
                                                                  tmp_path: Path):
    """git-annex and DVC keep frames as links into a store, identical frames to one object: two names, two
    frames, two outputs (only a frame reached twice through its folder is one frame given twice)."""
    store = tmp_path / ".store"
    store.mkdir()
    (store / "blob").write_bytes(tiny_frames[1].read_bytes())
    frames = tmp_path / "frames"
    frames.mkdir()
    for name in ("000001.bin", "000002.bin"):
        (frames / name).symlink_to(store / "blob")
    run = cli("infer", frames, "--model", tiny_model, "--device", "cpu", "--no-progress", "--out", tmp_path / "o")
    assert run.rc == 0 and run.out.startswith("2/2 frames"), run
    assert output_names(tmp_path / "o") == ["000001.json", "000002.json"]


def test_frames_of_one_name_in_two_folders_are_told_apart_in_the_lines_of_a_run_without_out(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """Without --out, infer prints a line a frame named by its file name: two 000001.bin of two folders
    printed the same name twice; they are named by their paths then (and by the name alone otherwise)."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "000001.bin").write_bytes(tiny_frames[1].read_bytes())
    run = cli("infer", tmp_path / "a", tmp_path / "b", "--model", tiny_model, "--device", "cpu", "--no-progress")
    named = [line.split(": ")[0] for line in run.out.splitlines() if " boxes, " in line and " pillars" in line]
    assert run.rc == 0 and named == [repr(str(tmp_path / "a" / "000001.bin")), repr(str(tmp_path / "b" / "000001.bin"))], run
    run = cli("infer", tmp_path / "a", "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0 and run.out.startswith("'000001.bin': "), run


def test_paths_after_the_options_are_frames_too(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    """`infer a.bin --model M b.bin` runs both frames (argparse alone refused b.bin as an unknown argument);
    an unknown option is still one error line."""
    first, second = tiny_frames[1], tiny_frames[2]
    run = cli("infer", first, "--model", tiny_model, "--out", tmp_path / "o", "--device", "cpu", "--no-progress",
              *LOOSE, second)
    assert run.rc == 0 and run.out.startswith("2/2 frames"), run
    assert output_names(tmp_path / "o") == sorted([f"{first.stem}.json", f"{second.stem}.json"])
    run = cli("infer", first, "--model", tiny_model, "--out", tmp_path / "d", "--device", "cpu", "--no-progress",
              *LOOSE, "--", second)  # after --, a path whatever it looks like
    assert run.rc == 0 and run.out.startswith("2/2 frames"), run
    missing = tmp_path / "missing.bin"  # named as a point file: a frame the run says is missing
    run = cli("infer", first, "--model", tiny_model, "--device", "cpu", "--no-progress", *LOOSE, missing)
    assert run.rc == 1 and f"error: point file {str(missing)!r} does not exist" in run.err, run
    for stray, unknown in ((["--bogus"], "--bogus"), (["--fov-only", "yes"], "yes")):  # not a path: refused, no run
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main(["infer", str(first), "--model", str(tiny_model), str(second), *stray])
        assert exit_info.value.code == 2 and err.getvalue() == (
            f"error: pointpillars-trt infer: unrecognized arguments: {unknown} (see pointpillars-trt infer --help)\n")


def test_unknown_options_name_the_commands_help_and_what_takes_openpcdets_options_place() -> None:
    """An unknown option names the command's own --help, which lists its options; OpenPCDet's demo.py options
    (--ckpt, --cfg_file, --data_path, --ext) get what takes their place in that command, and an option written with
    underscores the option it is."""
    def refusal(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main(list(argv))
        assert exit_info.value.code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
        return err.getvalue()

    assert refusal("infer", "frames/", "--ckpt", "x.pth", "--cfg_file", "y.yaml", "--data_path", "d", "--ext", "bin",
                   "--batch_size", "4") == (
        "error: pointpillars-trt infer: unrecognized arguments: --ckpt x.pth --cfg_file y.yaml --data_path d --ext bin "
        "--batch_size 4; OpenPCDet's --ckpt is --model here (a .pth, or the model dir build writes); OpenPCDet's "
        "--cfg_file goes to build: `pointpillars-trt build --checkpoint CKPT --pcdet-config YAML --out MODEL_DIR`, then "
        "--model MODEL_DIR; OpenPCDet's --data_path is the PATH argument here (point files, folders of them or globs); "
        "--ext is not needed: every .bin, .npy and .pcd file of a folder is read; --batch_size is --batch-size (see "
        "pointpillars-trt infer --help)\n")
    assert refusal("build", "--checkpoint", "x.pth", "--out", "m", "--ckpt=x.pth", "--cfg_file", "y.yaml") == (
        "error: pointpillars-trt build: unrecognized arguments: --ckpt=x.pth --cfg_file y.yaml; OpenPCDet's --ckpt is "
        "--checkpoint here; OpenPCDet's --cfg_file is --pcdet-config here (see pointpillars-trt build --help)\n")
    assert refusal("eval", "--pred", "p", "--labels", "l", "--ckpt", "x.pth") == (
        "error: pointpillars-trt eval: unrecognized arguments: --ckpt x.pth (see pointpillars-trt eval --help)\n")


def test_an_abbreviated_option_is_refused_naming_the_options_it_begins() -> None:
    """``--thr 1`` ran as --threads 1 and ``--form json`` as --format json without a word (argparse's abbreviations):
    options are taken written whole, and the refusal names what the word begins."""
    def refusal(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main(list(argv))
        assert exit_info.value.code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
        return err.getvalue()

    assert refusal("infer", "a.bin", "--model", "m", "--thr", "1", "--form=json") == (
        "error: pointpillars-trt infer: unrecognized arguments: --thr 1 --form=json; options are written whole: --thr "
        "begins --threads, --form begins --format (see pointpillars-trt infer --help)\n")
    assert refusal("build", "--checkpoint", "x.pth", "--out", "m", "--pcdet") == (
        "error: pointpillars-trt build: unrecognized arguments: --pcdet; options are written whole: --pcdet begins "
        "--pcdet-base-dir and --pcdet-config (see pointpillars-trt build --help)\n")


def test_other_tools_options_and_the_other_commands_names_get_what_takes_their_place() -> None:
    """trtexec's --fp16, --gpu, --output / -o and the name another command of this package gives the model
    (build's --checkpoint, infer's --model) are named with what takes their place, also when argparse stops first at
    a required option they stood for; --gpu is no abbreviation of infer's --gpus-per-worker (refused without --ray)."""
    def refusal(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main(list(argv))
        assert exit_info.value.code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
        return err.getvalue()

    assert refusal("build", "--model", "x.pth", "--out", "m") == (
        "error: pointpillars-trt build: the following arguments are required: --checkpoint; --model is --checkpoint "
        "here (the .pth; --out is the model dir to write) (see pointpillars-trt build --help)\n")
    assert refusal("build", "--checkpoint", "x.pth", "--output", "m", "--fp16") == (
        "error: pointpillars-trt build: the following arguments are required: --out; --output is --out; trtexec's "
        "--fp16 is --precision fp16 here (see pointpillars-trt build --help)\n")
    assert refusal("serve", "--checkpoint", "x.pth", "--repository", "r") == (
        "error: pointpillars-trt serve: the following arguments are required: --model; --checkpoint is --model here (a "
        ".pth, or the model dir build writes) (see pointpillars-trt serve --help)\n")
    assert refusal("infer", "frames/", "--model", "m", "--gpu", "1", "-o", "preds") == (
        "error: pointpillars-trt infer: unrecognized arguments: --gpu 1 -o preds; --gpu N is --device cuda:N here; -o is "
        "--out (see pointpillars-trt infer --help)\n")
    assert refusal("bench", "--gpus=0", "--fp16") == (
        "error: pointpillars-trt bench: unrecognized arguments: --gpus=0 --fp16; --gpus N is --device cuda:N here; "
        "trtexec's --fp16 is --precisions fp16 here (see pointpillars-trt bench --help)\n")
    assert refusal("eval", "--pred", "p", "--labels", "l", "--output", "ap.json") == (
        "error: pointpillars-trt eval: unrecognized arguments: --output ap.json; --output is --json here (the AP as "
        "JSON) (see pointpillars-trt eval --help)\n")


def test_a_quoted_tilde_path_is_said_unexpanded_with_the_path_it_would_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``infer '~/x.bin' --model '~/m.pth'``: the shell expands ~ only outside quotes, so the paths were looked for
    as written, and said not to exist, with no word of why, though the files were there."""
    from pointpillars_trt.apps.cli import main

    home = tmp_path / "home"
    home.mkdir()
    (home / "x.bin").write_bytes(np.zeros((4, 4), np.float32).tobytes())
    (home / "labels").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    said = "; a leading ~ is expanded by the shell, and not inside quotes"
    rc = main(["infer", "~/x.bin", "~/y.bin", "--model", "~/m.pth", "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines() == [
        f"error: point file '~/x.bin' does not exist{said}: give the path as '{home / 'x.bin'}', which is there",
        f"error: point file '~/y.bin' does not exist{said} ('{home / 'y.bin'}' is not there either)"], err
    (tmp_path / "x.bin").write_bytes(np.zeros((4, 4), np.float32).tobytes())
    rc = main(["infer", "x.bin", "--model", "~/m.pth", "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"error: --model '~/m.pth': no such checkpoint file or model dir{said} "
                               f"('{home / 'm.pth'}' is not there either)\n"), err
    rc = main(["eval", "--pred", "~/preds", "--labels", "~/labels"])
    err = capsys.readouterr().err
    assert rc == 2 and f"'~/preds' does not exist{said} ('{home / 'preds'}' is not there either)" in err, err


def test_a_frame_of_one_box_and_one_pillar_is_counted_in_the_singular(tiny_model: Path, tmp_path: Path) -> None:
    """A run that writes nothing prints a line a frame and the summary: one box and one pillar were '1 boxes, 1
    pillars', and the summary's '1 boxes'. The run's own JSON of the same frame (--max-boxes 1) says it is one box."""
    frame = tmp_path / "one.bin"
    np.array([[2.0, 0.0, -1.0, 0.5]], np.float32).tofile(frame)
    common = (frame, "--model", tiny_model, "--device", "cpu", "--no-progress", "--score-threshold", "0",
              "--max-boxes", "1")
    written = cli("infer", *common, "--out", tmp_path / "out")
    assert written.rc == 0 and len(json.loads((tmp_path / "out/one.json").read_text())["scores"]) == 1, written
    assert written.out.startswith("1/1 frames, 1 box, written to "), written.out
    run = cli("infer", *common)
    assert run.rc == 0 and run.out.startswith("'one.bin': 1 box, 1 pillar ["), run.out
    assert run.out.splitlines()[-1].startswith("1/1 frames, 1 box ("), run.out
