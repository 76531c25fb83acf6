"""``infer`` through the streaming runner, end to end on the CPU with the tiny model: outputs that do
not depend on batch size or pipelines, JSON Lines / Parquet rows equal to the per-frame JSON, resume
after a kill with ``--skip-existing``, a full file system, and SIGTERM.

Oracle: ``infer --batch-size 1 --pipelines 1`` (per-frame JSON files), whose bytes the other runs must
reproduce; for rows, those same JSON records.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from out_folder import output_names, output_paths
from pointpillars_trt.apps.cli import main
from pointpillars_trt.kitti import write_velodyne_bin

REPO = Path(__file__).resolve().parents[2]
NO_PYARROW = "pyarrow is not installed (pip install '.[parquet]', or '.[test-scaleout]')"
#: the row formats; Parquet's tests read the parts back with pyarrow, which only the scale-out extra installs
ROW_FORMATS = ["jsonl", pytest.param("parquet", marks=pytest.mark.skipif(
    importlib.util.find_spec("pyarrow") is None, reason=NO_PYARROW))]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny import tiny_model_dir

    return Path(tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=11).path)


def make_frames(folder: Path, count: int, cfg_range: tuple[float, ...], seed: int = 0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lo, hi = np.array(cfg_range[:3]), np.array(cfg_range[3:])
    paths = []
    for index in range(count):
        n = int(rng.integers(0, 3000))
        paths.append(folder / f"{index:06d}.bin")
        write_velodyne_bin(np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32),
                           paths[-1])
    return paths


@pytest.fixture(scope="module")
def frames(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pointpillars_trt.model_dir import load_model_dir

    folder = tmp_path_factory.mktemp("frames")
    make_frames(folder, 40, load_model_dir(model_path).cfg.voxel.point_range)
    (folder / "zz_corrupt.bin").write_bytes(b"\0" * 12)
    return folder


def infer(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["infer", *args, "--device", "cpu", "--no-progress"])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def reference(model_path: Path, frames: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--batch-size", "1",
                       "--pipelines", "1")
    assert rc == 1 and err.count("error: ") == 1 and "zz_corrupt.bin" in err
    return out


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def part_rows(part: Path) -> list[dict[str, object]]:
    """The rows of one JSON Lines or Parquet part file, read as a user would."""
    if part.suffix == ".jsonl":
        return [json.loads(line) for line in part.read_text().splitlines()]
    import pyarrow.parquet as pq

    return pq.read_table(part).to_pylist()


def test_outputs_do_not_depend_on_batch_size_or_pipelines(model_path, frames, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    rc, stdout, _ = infer(str(frames), "--model", str(model_path), "--out", str(out), "--batch-size", "3",
                          "--pipelines", "3")
    assert rc == 1 and stdout.startswith("40/41 frames")
    assert files_of(out) == files_of(reference)


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_row_formats_hold_the_json_records_in_input_order(model_path, frames, reference, tmp_path, fmt) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / fmt
    rc, stdout, _ = infer(str(frames), "--model", str(model_path), "--out", str(out), "--format", fmt,
                          "--batch-size", "4")
    assert rc == 1 and stdout.startswith("40/41 frames") and f"written to {out}" in stdout
    parts = sorted(out.glob(f"detections-*.{fmt}"))
    assert [p.name for p in parts] == [f"detections-00000.{fmt}"]
    rows = part_rows(parts[0])
    assert [Path(r["source"]).name for r in rows] == sorted(p.name for p in frames.iterdir())
    for row in rows[:-1]:
        record = json.loads((reference / f"{row['frame']}.json").read_text())
        assert row["error"] is None and {key: row[key] for key in record} == record
    assert "not a multiple of 16" in rows[-1]["error"] and rows[-1]["scores"] == []


def test_kill_then_skip_existing_completes_without_duplicates_or_partial_files(model_path, frames, reference,  # type: ignore[no-untyped-def]
                                                                                tmp_path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    command = [sys.executable, "-m", "pointpillars_trt", "infer", str(frames), "--model", str(model_path), "--out",
               str(out), "--device", "cpu", "--no-progress", "--batch-size", "1", "--pipelines", "1"]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(out.glob("0*.json"))) < 5:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    written = [path for path in output_paths(out) if path.suffix == ".json"]
    assert 5 <= len(written) < 40
    for path in written:  # every file there is complete
        assert path.read_bytes() == (reference / path.name).read_bytes()
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--skip-existing")
    assert rc == 1 and f"skipping {len(written)} frames whose" in err
    assert files_of(out) == files_of(reference)  # all frames, once each; no temp file left


def test_sigterm_leaves_no_temp_files_or_folders(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    labels, calib = tmp_path / "labels", tmp_path / "calib"
    labels.mkdir()
    calib.mkdir()
    for path in frames.iterdir():  # --eval needs them; the KITTI lines of a JSON run go to a temp folder
        (labels / f"{path.stem}.txt").write_text("")
        (calib / f"{path.stem}.txt").write_text(
            "P2: 700 0 600 0 0 700 180 0 0 0 1 0\nR0_rect: 1 0 0 0 1 0 0 0 1\n"
            "Tr_velo_to_cam: 0 -1 0 0 0 0 -1 0 1 0 0 0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "pointpillars_trt", "infer", str(frames), "--model", str(model_path), "--out",
               str(out), "--device", "cpu", "--no-progress", "--format", "json", "--eval", str(labels),
               "--calib", str(calib), "--batch-size", "1", "--pipelines", "1"]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("*.json")):
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143 and "terminated" in err, err
    assert not [name for name in output_names(out) if name.startswith(".")]
    assert not list(tmp_path.glob("pp-infer-*"))


@contextlib.contextmanager
def small_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``mount`` for the test (skipped where it cannot be mounted)."""
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_file_system_is_written_to_again_once_it_has_space(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """After a write found the file system full, the frames after it fail at once ("not written"), and
    once space is freed (a long Ray job, a process that writes again) frames are written again."""
    from pointpillars_trt.apps.outputs import NOT_WRITTEN, OutputPlan, write_frame
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.errors import InputError

    with small_tmpfs(tmp_path / "small", "2m") as mount:
        detector = PointPillars.from_model_dir(model_path, device="cpu")
        lo, hi = np.split(np.asarray(detector.cfg.voxel.point_range, np.float32), 2)
        points = np.column_stack([np.random.default_rng(3).uniform(lo, hi, (3000, 3)), np.full(3000, 0.5)])
        det = detector(points.astype(np.float32))
        out = mount / "out"
        out.mkdir()
        filler = mount / "filler"
        filler.write_bytes(b"\0" * (2 * 1024 * 1024 - 16 * 1024))  # leaves a few KiB
        plan = OutputPlan(json_dir=out)
        errors = []
        for index in range(200):
            try:
                write_frame(f"{index:06d}.bin", det, None, plan=plan)
            except InputError as exc:
                errors.append(str(exc))
        assert errors and "No space left" in errors[0] and errors[-1] == NOT_WRITTEN
        filler.unlink()
        written, _ = write_frame("again.bin", det, None, plan=plan)
        assert written.files == [str(out / "again.json")] and json.loads((out / "again.json").read_text())


def test_a_full_file_system_is_one_error_and_only_complete_files_are_claimed(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with small_tmpfs(tmp_path / "small", "48k") as mount:
        rc, stdout, err = infer(str(frames), "--model", str(model_path), "--out", str(mount / "out"))
        files = [path for path in output_paths(mount / "out") if path.suffix == ".json"]
        done = int(stdout.split("/", 1)[0])
        assert rc == 1 and 0 < done < 40 and len(files) == done
        for path in files:
            json.loads(path.read_text())  # complete
        assert err.count("file system is full") == 1 and "rerun with --skip-existing" in err
        assert err.count("error: ") <= 3  # the first failed write, the summary line, the corrupt frame


def test_a_full_disk_error_that_replaced_a_file_of_an_earlier_run_is_said_after_the_first() -> None:
    """A full disk's frame errors after the first are counted into one summary line; one whose write had renamed a
    file of an earlier run into place before it failed (its error names that file) was counted there too: the file
    went unnamed and the summary's count of replaced files left it out. It gets its error line."""
    from pointpillars_trt.apps.infer import _SharedCause
    from pointpillars_trt.apps.outputs import is_full_disk_error

    full = f"cannot write '/o/000001.png': {os.strerror(errno.ENOSPC)}"
    disk = _SharedCause(is_full_disk_error)
    assert [disk.quiet(full, replaced) for replaced in (0, 0, 1, 0)] == [False, True, False, True]
    assert disk.after_first == 2


def test_a_full_file_system_under_row_outputs_says_the_rerun_that_redoes_its_frames(model_path, frames,  # type: ignore[no-untyped-def]
                                                                                   tmp_path) -> None:
    """Row formats keep a row for each frame a full disk failed (its error; here its --viz picture did not
    fit): the advice names --retry-failed as well, and following it once there is space gives every frame its
    one good row."""
    pytest.importorskip("matplotlib", reason="--viz needs matplotlib")
    import re

    with small_tmpfs(tmp_path / "small", "2m") as mount:
        out = mount / "out"
        (mount / "filler").write_bytes(b"\0" * (2 * 1024 * 1024 - 64 * 1024))  # room for rows, not pictures
        rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--format", "jsonl", "--viz")
        said = re.search(r"file system is full; \d+ more frames? not written \(free space, then rerun with "
                         r"([^)]*)\)", err)
        assert rc == 1 and said is not None, err
        (mount / "filler").unlink()
        assert subprocess.run(["mount", "-o", "remount,size=64m", str(mount)]).returncode == 0  # room for pictures
        rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--format", "jsonl",
                           "--viz", *said.group(1).split())
        rows = [json.loads(line) for part in sorted(out.glob("detections-*.jsonl"))
                for line in part.read_text().splitlines()]
    sources = sorted(row["source"] for row in rows)
    assert sources == sorted(str(p) for p in frames.glob("*.bin")), err  # one row a frame
    assert [row["source"] for row in rows if row["error"]] == [str(frames / "zz_corrupt.bin")], err

def test_stale_temp_files_of_a_dead_run_are_cleared_live_ones_kept(tmp_path: Path) -> None:
    from pointpillars_trt.file_writes import TEMP_SUFFIX, remove_stale_temp_files

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".000001.json.{dead.pid}.abcd{TEMP_SUFFIX}"
    live = tmp_path / f".000002.json.{os.getpid()}.abcd{TEMP_SUFFIX}"
    user = tmp_path / ".notes.tmp"
    for path in (stale, live, user):
        path.write_text("x")
    assert remove_stale_temp_files(tmp_path) == 1
    assert not stale.exists() and live.exists() and user.exists()
    assert tempfile.gettempdir()


def test_skip_existing_redoes_empty_cut_and_foreign_outputs(model_path, frames, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Outputs cut short or emptied outside the run (or by a crash before its flush), and JSON files that are
    whole JSON but not infer's record of their frame, are redone, said once; whole ones are skipped."""
    out = tmp_path / "out"
    out.mkdir()
    for path in reference.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    names = [name for name in output_names(out) if name.endswith(".json")]
    (out / names[0]).write_bytes(b"")
    (out / names[1]).write_bytes((reference / names[1]).read_bytes()[:40])
    (out / names[2]).write_text(json.dumps({"frame": names[2].removesuffix(".json"), "boxes_lidar": "garbage"}) + "\n")
    (out / names[3]).write_bytes((reference / names[4]).read_bytes())  # whole, but another frame's record
    record = json.loads((reference / names[5]).read_text())
    record["labels"].append("Car")  # a label of no box
    (out / names[5]).write_text(json.dumps(record, indent=2) + "\n")
    record = json.loads((reference / names[6]).read_text())
    record.update(boxes_lidar=[[1, 2, 0, 4, 2, 1.5, 0]], scores=["high"], labels=["Car"])  # eval cannot read it
    (out / names[6]).write_text(json.dumps(record, indent=2) + "\n")
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--skip-existing")
    assert rc == 1 and "redoing the frames of 6 empty, incomplete or foreign output files" in err, err
    assert f"skipping {len(names) - 6} frames whose" in err
    assert files_of(out) == files_of(reference)


def test_row_runs_resume_by_absolute_path_and_refuse_a_second_run_into_their_parts(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path, monkeypatch) -> None:
    out = tmp_path / "rows"
    monkeypatch.chdir(frames.parent)
    rc, _, _ = infer(frames.name, "--model", str(model_path), "--out", str(out), "--format", "jsonl")
    assert rc == 1 and len(list(out.glob("detections-*.jsonl"))) == 1
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--format", "jsonl")
    assert rc == 2 and err.count("\n") == 1 and "--skip-existing" in err
    assert "already holds 1 jsonl part file of an earlier run ('detections-00000.jsonl')" in err, err
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--format", "jsonl",
                       "--skip-existing")
    assert rc == 0 and "skipping 41 frames" in err, err
    bad = next(p.name for p in frames.iterdir() if p.stat().st_size % 16)  # the frame whose row is an error
    assert err.count("warning:") == 1 and "1 of them failed in an earlier run" in err and bad in err, err
    assert f"{bad}'): its row in {out} holds the error" in err and "pass --retry-failed to rerun it\n" in err, err
    assert len(list(out.glob("detections-*.jsonl"))) == 1
    # resumed from inside the frames' folder, by names relative to it: the same frames (their rows' path)
    monkeypatch.chdir(frames)
    names = sorted(p.name for p in frames.iterdir())
    rc, _, err = infer(*names, "--model", str(model_path), "--out", str(out), "--format", "jsonl", "--skip-existing")
    assert rc == 0 and "skipping 41 frames" in err, err
    rows = [json.loads(line) for line in next(out.glob("detections-*.jsonl")).read_text().splitlines()]
    assert sorted(row["path"] for row in rows) == sorted(str(frames / name) for name in names)
    assert {row["source"] for row in rows} == {f"{frames.name}/{name}" for name in names}  # as given


def test_a_frame_named_like_another_frames_escaped_byte_is_not_skipped_as_that_frame(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path) -> None:
    """A file named z, byte 0xff, .bin is written as z\\xff.bin in its rows; a second file named with that very
    text (a backslash, x, f, f) is another frame: --skip-existing runs it (it was taken for the first's)."""
    folder = tmp_path / "frames"
    folder.mkdir()
    first = sorted(frames.glob("0*.bin"))[0]
    (folder / os.fsdecode(b"z\xff.bin")).write_bytes(first.read_bytes())
    out = tmp_path / "rows"
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", "jsonl")
    assert rc == 0, err
    (folder / "z\\xff.bin").write_bytes(first.read_bytes())
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", "jsonl",
                       "--skip-existing")
    assert rc == 0 and "skipping 1 frame whose" in err, err
    rows = [json.loads(line) for part in sorted(out.glob("detections-*.jsonl")) for line in part.read_text().splitlines()]
    assert sorted(row["path"] for row in rows) == [str(folder / "z\\\\xff.bin"), str(folder / "z\\xff.bin")]


def test_a_json_resume_refuses_another_folders_records_and_skips_its_own_by_a_link(model_path, frames,  # type: ignore[no-untyped-def]
                                                                                   tmp_path) -> None:
    """JSON records name their frame's source: --skip-existing with a.bin of another folder is refused before
    anything runs, as without it (it replaced the other frame's record, which was lost), and the record stays;
    the same frame by a symbolic link to its folder is skipped as that frame (it was taken for another and run
    again); a record of an earlier version, without a source, is matched by its name."""
    first, second = sorted(frames.glob("0*.bin"))[:2]
    folders = [tmp_path / "A", tmp_path / "B"]
    for folder, frame in zip(folders, (first, second)):
        folder.mkdir()
        (folder / "a.bin").write_bytes(frame.read_bytes())
    out = tmp_path / "out"
    assert infer(str(folders[0] / "a.bin"), "--model", str(model_path), "--out", str(out))[0] == 0
    kept = (out / "a.json").read_bytes()
    assert json.loads(kept)["source"] == str(folders[0] / "a.bin")
    rc, stdout, err = infer(str(folders[1] / "a.bin"), "--model", str(model_path), "--out", str(out),
                            "--skip-existing")
    assert rc == 2 and stdout == "" and err == (
        f"error: --out {str(out)!r} holds the records of 1 frame of the same name from other point files ("
        f"'a.json' is the record of {str(folders[0] / 'a.bin')!r}, not of {str(folders[1] / 'a.bin')!r}), which "
        "this run would replace: give another --out (one a sequence), or remove those records from it first\n"), err
    assert (out / "a.json").read_bytes() == kept
    (tmp_path / "link").symlink_to(folders[0])
    rc, _, err = infer(str(tmp_path / "link" / "a.bin"), "--model", str(model_path), "--out", str(out),
                       "--skip-existing")
    assert rc == 0 and "skipping 1 frame whose" in err and "error" not in err, err
    assert (out / "a.json").read_bytes() == kept
    record = json.loads(kept)
    del record["source"]  # as an earlier version wrote it: matched by its name
    (out / "a.json").write_text(json.dumps(record, indent=2) + "\n")
    rc, _, err = infer(str(folders[1] / "a.bin"), "--model", str(model_path), "--out", str(out), "--skip-existing")
    assert rc == 0 and "skipping 1 frame whose" in err, err
    assert infer(str(folders[1] / "a.bin"), "--model", str(model_path), "--out", str(tmp_path / "b"),
                 "--skip-existing")[0] == 0  # the fix, as said


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_a_row_resume_through_a_symbolic_link_to_the_folder_skips_the_frames_already_written(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path, fmt) -> None:
    """Rows were matched by absolute path alone: the same frames reached through a link to their folder were run
    again, each adding a second row. Now they are skipped as JSON records are (a frame new to the run still runs,
    its row naming it as given), and --retry-failed through the link replaces a failed frame's row: one row a
    point file."""
    folder = tmp_path / "frames"
    folder.mkdir()
    good = sorted(frames.glob("0*.bin"))[:3]
    for path in good[:2]:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "zz.bin").write_bytes(b"\0" * 12)  # a frame that fails: 12 bytes, no whole point of 4 values
    out = tmp_path / fmt
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt)
    assert rc == 1, err
    link = tmp_path / "link"
    link.symlink_to(folder)
    (folder / good[2].name).write_bytes(good[2].read_bytes())  # new since the first run
    rc, _, err = infer(str(link), "--model", str(model_path), "--out", str(out), "--format", fmt, "--skip-existing")
    assert rc == 0 and "skipping 3 frames" in err and "1 of them failed in an earlier run" in err, err
    (folder / "zz.bin").write_bytes(good[0].read_bytes())
    rc, _, err = infer(str(link / "zz.bin"), "--model", str(model_path), "--out", str(out), "--format", fmt,
                       "--skip-existing", "--retry-failed")
    assert rc == 0 and "rerunning 1 frame that failed in an earlier run" in err, err
    rows = [row for part in sorted(out.glob(f"detections-*.{fmt}")) for row in part_rows(part)]
    assert sorted(os.path.realpath(str(row["path"])) for row in rows) == sorted(
        os.path.realpath(p) for p in folder.iterdir())
    assert all(row["error"] is None for row in rows), rows
    assert sorted(str(row["path"]) for row in rows if str(row["path"]).startswith(str(link))) == [
        str(link / good[2].name), str(link / "zz.bin")]


def test_a_json_run_refuses_to_replace_another_folders_records_of_the_same_names(model_path, frames,  # type: ignore[no-untyped-def]
                                                                                 tmp_path) -> None:
    """Two sequences both start at 000000.bin: a second run into the first's --out (without --skip-existing) is
    refused before anything runs, naming how many, an example and the fix, and the first's records stay; the same
    frames run again (also by a symbolic link to their folder) replace their own records without a word, and a
    --format kitti run, whose label files hold no source, runs."""
    first, second = sorted(frames.glob("0*.bin"))[:2]
    seq_a, seq_b = tmp_path / "seqA", tmp_path / "seqB"
    for folder, frame in ((seq_a, first), (seq_b, second)):
        folder.mkdir()
        for name in ("000000.bin", "000001.bin"):
            (folder / name).write_bytes(frame.read_bytes())
    out = tmp_path / "out"
    assert infer(str(seq_a), "--model", str(model_path), "--out", str(out))[0] == 0
    kept = files_of(out)
    rc, stdout, err = infer(str(seq_b), "--model", str(model_path), "--out", str(out))
    assert rc == 2 and stdout == "" and err.count("\n") == 1, err
    assert err == (f"error: --out {str(out)!r} holds the records of 2 frames of the same name from other point "
                   f"files (e.g. '000000.json' is the record of {str(seq_a / '000000.bin')!r}, not of "
                   f"{str(seq_b / '000000.bin')!r}), which this run would replace: give another --out (one a "
                   "sequence), or remove those records from it first\n")
    assert files_of(out) == kept
    rc, _, err = infer(str(seq_a), "--model", str(model_path), "--out", str(out))
    assert rc == 0 and "error" not in err and "note:" not in err, err
    (tmp_path / "link").symlink_to(seq_a)
    rc, _, err = infer(str(tmp_path / "link"), "--model", str(model_path), "--out", str(out))
    assert rc == 0 and "error" not in err, err
    assert infer(str(seq_b), "--model", str(model_path), "--out", str(tmp_path / "b"))[0] == 0  # the fix, as said
    # a record cut short (a run killed mid-write) still names its source at its head: still refused
    (out / "000001.json").unlink()
    record = kept["000000.json"]
    (out / "000000.json").write_bytes(record[:record.index(b'"source"') + len(str(seq_a / "000000.bin")) + 20])
    rc, _, err = infer(str(seq_b), "--model", str(model_path), "--out", str(out))
    assert rc == 2 and "holds the records of 1 frame of the same name from other point files" in err, err


def test_the_checks_of_a_json_run_read_each_existing_record_once(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whether an existing record is infer's, and of which point file, is judged from one read (two before: ~75
    us a record, 20,000 of them before a resumed run)."""
    from pointpillars_trt.apps.outputs import refuse_foreign_outputs

    folder, out = tmp_path / "seq", tmp_path / "out"
    folder.mkdir()
    frame = folder / "000000.bin"
    frame.write_bytes(sorted(frames.glob("0*.bin"))[0].read_bytes())
    assert infer(str(frame), "--model", str(model_path), "--out", str(out))[0] == 0
    opens: list[object] = []

    def audit(event: str, args: tuple[object, ...]) -> None:
        if event == "open" and str(args[0]).endswith("000000.json"):
            opens.append(args)

    sys.addaudithook(audit)  # for the rest of the process: it records only this name
    refuse_foreign_outputs(out, [str(frame)], [".json"], other_sources=True)
    assert len(opens) == 1, opens
    opens.clear()

def test_an_existing_output_is_read_by_its_size_not_by_the_record_limit(tmp_path: Path) -> None:
    """--skip-existing and the check for files infer did not write read each existing output: a read of 64 MiB + 1
    bytes set that much aside for a file of a few hundred bytes."""
    from test_pointcloud_io import traced_peak
    from pointpillars_trt.apps.outputs import foreign_output

    prediction = "Car 0.00 0 -1.58 587.0 173.3 614.1 200.1 1.65 1.67 3.64 -0.65 1.71 4.6 -1.59"
    record = {"frame": "000002", "boxes_lidar": [], "scores": [], "labels": []}
    for name, text, said in (("000000.txt", prediction + " 0.9\n", None),
                             ("000001.txt", prediction + "\n", "lines of 15 values (KITTI predictions have 16: a "
                                                               "label file's 15 and a score)"),
                             ("000002.json", json.dumps(record) + "\n", None),
                             ("000003.txt", "0.9\n", "lines of 1 value (KITTI predictions have 16: a label file's "
                                                     "15 and a score)")):
        (tmp_path / name).write_text(text)
        reason, peak = traced_peak(lambda: foreign_output(tmp_path / name))
        assert reason == said and peak < 2**20, (name, reason, peak)


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_retry_failed_reruns_fixed_frames_and_keeps_one_row_a_source(model_path, frames, reference, tmp_path,  # type: ignore[no-untyped-def]
                                                                      fmt) -> None:
    """Two frames fail in two runs (the second's part holds its failure row only); once their files are
    fixed, --skip-existing --retry-failed removes those rows (the first part keeps its other row as it
    was, the second part goes) and runs them with the frames never run: one row a source, the fixed
    frames' records those of the frames their bytes were copied from."""
    folder = tmp_path / "frames"
    folder.mkdir()
    good = sorted(frames.glob("0*.bin"))[:3]
    for path in good:
        (folder / path.name).write_bytes(path.read_bytes())
    broken = {folder / "zz_a.bin": good[1], folder / "zz_b.bin": good[2]}  # each fixed with that frame's bytes
    for path in broken:
        path.write_bytes(b"\0" * 12)
    out = tmp_path / fmt
    first, second = [str(folder / good[0].name), str(folder / "zz_a.bin")], [str(folder / "zz_b.bin")]
    assert infer(*first, "--model", str(model_path), "--out", str(out), "--format", fmt)[0] == 1
    assert infer(*second, "--model", str(model_path), "--out", str(out), "--format", fmt, "--skip-existing")[0] == 1
    first_part, second_part = sorted(out.glob(f"detections-*.{fmt}"))
    kept_row, first_failure = part_rows(first_part)
    assert kept_row["error"] is None and first_failure["error"] and part_rows(second_part)[0]["error"]
    first_bytes = first_part.read_bytes()
    for path, fixed in broken.items():
        path.write_bytes(fixed.read_bytes())

    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt,
                       "--skip-existing", "--retry-failed")
    assert rc == 0, err
    assert "skipping 1 frame whose" in err and "rerunning 2 frames that failed in an earlier run" in err, err
    assert "pass --retry-failed" not in err
    parts = sorted(out.glob(f"detections-*.{fmt}"))
    assert [p.name for p in parts] == [f"detections-00000.{fmt}", f"detections-00001.{fmt}"]
    rows = [row for part in parts for row in part_rows(part)]
    assert sorted(str(row["source"]) for row in rows) == sorted(str(p) for p in folder.iterdir())
    assert all(row["error"] is None for row in rows)
    assert part_rows(parts[0]) == [kept_row]
    if fmt == "jsonl":  # the row kept is the very line the first run wrote
        assert parts[0].read_bytes() == first_bytes.split(b"\n")[0] + b"\n"
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert pq.read_schema(parts[0]) == pq.read_schema(pa.BufferReader(first_bytes))
    by_source = {Path(str(row["source"])).name: row for row in rows}
    for path, fixed in broken.items():
        record = json.loads((reference / f"{fixed.stem}.json").read_text())
        record["frame"] = path.stem
        del record["source"]  # a row's source is the frame as given (its path column: as the record's source)
        assert {key: by_source[path.name][key] for key in record} == record
        assert record["num_pillars"]  # detected on its points, not a failure's row of zeros


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_viz_rows_resume_without_second_rows_for_missing_pictures_or_failures(model_path, frames, tmp_path,  # type: ignore[no-untyped-def]
                                                                              fmt) -> None:
    """--skip-existing --viz into a row run: a frame whose picture was removed, and a failed frame
    (failures draw none), keep their one row and are not run again; the missing picture is said once,
    with how to draw it, after the frames are said skipped and the failure among them (it was said
    first, before the line it is about)."""
    folder = tmp_path / "frames"
    folder.mkdir()
    for path in [*sorted(frames.glob("0*.bin"))[:2], frames / "zz_corrupt.bin"]:
        (folder / path.name).write_bytes(path.read_bytes())
    out = tmp_path / "rows"
    assert infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt, "--viz")[0] == 1
    (part,) = out.glob(f"detections-*.{fmt}")
    first_rows = part.read_bytes()
    pictures = sorted(out.glob("*.png"))
    assert len(pictures) == 2
    pictures[0].unlink()
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt, "--viz",
                       "--skip-existing")
    assert rc == 0 and err.count("warning:") == 2, err
    lines = err.splitlines()
    skipping = lines.index(f"skipping 3 frames whose outputs are already in {out}")
    assert lines[skipping + 1].startswith("warning: 1 of them failed in an earlier run"), err
    assert lines[skipping + 2] == (
        f"warning: 1 frame with a row in {out} has no whole --viz picture ('{pictures[0].name}'), and a "
        "frame with a row is not run again: to draw it, rerun that frame with --viz into another --out"), err
    assert list(out.glob(f"detections-*.{fmt}")) == [part] and part.read_bytes() == first_rows


def _frame_run_with_viz(model_path: Path, frames: Path,
                        tmp_path: Path) -> tuple[Path, Path, Path, os.stat_result, Path]:
    """A frame run with --viz into ``tmp_path / "out"``: (the frame, the out folder, its JSON record, the record's
    stat, its picture's path)."""
    pytest.importorskip("matplotlib", reason="--viz needs matplotlib")
    first = sorted(frames.glob("0*.bin"))[0]
    out = tmp_path / "out"
    assert infer(str(first), "--model", str(model_path), "--out", str(out), "--viz")[0] == 0
    record = out / f"{first.stem}.json"
    return first, out, record, record.stat(), out / f"{first.stem}.png"


def test_a_folder_where_a_picture_goes_fails_its_frame_before_any_of_its_files_is_written(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path) -> None:
    """--skip-existing --viz where a folder holds a frame's picture's place: the frame ran again and its JSON was
    replaced, while the summary said "nothing written"; now its one error line names the folder, its earlier JSON
    is left as it was, and the summary's "nothing written" is what is on disk."""
    first, out, record, before, picture = _frame_run_with_viz(model_path, frames, tmp_path)
    picture.unlink()
    picture.mkdir()
    rc, stdout, err = infer(str(first), "--model", str(model_path), "--out", str(out), "--viz", "--skip-existing")
    assert rc == 1 and err.splitlines()[1:] == [
        f"error: {str(first)!r}: cannot write {str(picture)!r}: {os.strerror(errno.EISDIR)}",
        "1 of 1 frame failed (listed above)"], err  # after the line of the device; no output file said redone
    assert stdout.startswith("0/1 frames, 0 boxes, nothing written\n"), stdout
    after = record.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not written again
    assert output_names(out) == sorted([record.name, picture.name]) and not os.listdir(picture)


def _link_to_a_folder(place: Path, folder: Path) -> str:
    """A symbolic link in an output's ``place`` to ``folder`` (made, one file in it), and the error line its frame's
    write says."""
    folder.mkdir()
    (folder / "kept.txt").write_text("kept\n")
    place.unlink(missing_ok=True)
    place.symlink_to(folder, target_is_directory=True)
    return (f"cannot write {str(place)!r}: a symbolic link to the folder {os.path.realpath(folder)!r} is in its place; "
            "move the link away (the folder stays as it is)")


def test_a_link_to_a_folder_where_a_picture_goes_fails_its_frame_as_a_folder_does(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path) -> None:
    """--skip-existing --viz where a symbolic link to a folder holds a frame's picture's place: --skip-existing took
    it for a folder (no output, the frame's write would name it), but the write took it for a file and replaced
    the link without a word (the frame's JSON too). Now both read it as the folder it leads to: the frame fails
    naming the link, its JSON and the link are left as they were."""
    first, out, record, before, picture = _frame_run_with_viz(model_path, frames, tmp_path)
    said = _link_to_a_folder(picture, tmp_path / "elsewhere")
    rc, stdout, err = infer(str(first), "--model", str(model_path), "--out", str(out), "--viz", "--skip-existing")
    assert rc == 1 and err.splitlines()[1:] == [f"error: {str(first)!r}: {said}", "1 of 1 frame failed (listed above)"]
    assert stdout.startswith("0/1 frames, 0 boxes, nothing written\n"), stdout
    after = record.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not written again
    assert picture.is_symlink() and os.listdir(picture) == ["kept.txt"]


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_a_link_to_a_folder_where_a_retried_frames_picture_goes_fails_it_again(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path, fmt) -> None:
    """--skip-existing --retry-failed --viz of a row run, a symbolic link to a folder where the retried frame's
    picture goes: the write replaced the link with the picture; now the frame fails again naming the link (its row
    is a failure's again, for the next --retry-failed once the link is moved), as for a folder there."""
    pytest.importorskip("matplotlib", reason="--viz needs matplotlib")
    folder = tmp_path / "frames"
    folder.mkdir()
    good = sorted(frames.glob("0*.bin"))[0]
    (folder / "zz.bin").write_bytes(b"\0" * 12)  # fails: 12 bytes, no whole point of 4 values
    out = tmp_path / "rows"
    assert infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt, "--viz")[0] == 1
    (folder / "zz.bin").write_bytes(good.read_bytes())  # fixed
    picture = out / "zz.png"
    said = _link_to_a_folder(picture, tmp_path / "elsewhere")
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt, "--viz",
                       "--skip-existing", "--retry-failed")
    assert rc == 1 and f"error: {str(folder / 'zz.bin')!r}: {said}" in err.splitlines(), err
    assert picture.is_symlink() and os.listdir(picture) == ["kept.txt"]
    picture.unlink()
    rc, stdout, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt, "--viz",
                            "--skip-existing", "--retry-failed")
    assert rc == 0 and stdout.startswith("1/1 frames"), (stdout, err)
    assert picture.is_file() and not picture.is_symlink()


def _rerun_with_other_points(model_path: Path, frames: Path, tmp_path: Path,
                             out: Path) -> tuple[Path, dict[str, bytes]]:
    """A frame run with --viz into ``out``, then given other points under its name (so that its next run's record
    differs): (the frame, the earlier run's files)."""
    frame = tmp_path / "frames" / "000000.bin"
    frame.parent.mkdir()
    first, second = sorted(frames.glob("0*.bin"))[:2]
    frame.write_bytes(first.read_bytes())
    assert infer(str(frame), "--model", str(model_path), "--out", str(out), "--viz")[0] == 0
    frame.write_bytes(second.read_bytes())
    return frame, {name: (out / name).read_bytes() for name in output_names(out)}


def test_a_frame_whose_picture_finds_the_disk_full_keeps_its_earlier_runs_files(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path) -> None:
    """--viz on a full disk: the frame's JSON was replaced with this run's before its picture failed to fit, while
    its error line and "nothing written" said nothing of it (and its earlier picture stayed beside a record of
    other points). Now every file of a frame is written to a temp file before any is renamed into place: the
    earlier run's files keep their bytes, and no temp file is left."""
    pytest.importorskip("matplotlib", reason="--viz needs matplotlib")
    with small_tmpfs(tmp_path / "small", "2m") as mount:
        out = mount / "out"
        frame, before = _rerun_with_other_points(model_path, frames, tmp_path, out)
        assert sorted(before) == ["000000.json", "000000.png"] and len(before["000000.json"]) < 16 * 1024 < len(
            before["000000.png"])  # the record fits in what is left below, the picture does not
        free = os.statvfs(mount)
        (mount / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 32 * 1024))
        rc, stdout, err = infer(str(frame), "--model", str(model_path), "--out", str(out), "--viz")
        assert rc == 1 and err.splitlines()[1:] == [
            f"error: {str(frame)!r}: cannot write {str(out / '000000.png')!r}: {os.strerror(errno.ENOSPC)}",
            "1 of 1 frame failed (listed above)"], err
        assert stdout.startswith("0/1 frames, 0 boxes, nothing written\n"), stdout
        assert {name: (out / name).read_bytes() for name in output_names(out)} == before


def test_a_picture_that_cannot_replace_its_earlier_one_names_the_record_it_replaced(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path) -> None:
    """A frame whose record was renamed into place before its picture's rename failed (the earlier picture held by
    a bind mount: busy) is one error line that names the record now of this run, and the fix; the earlier picture
    stays, and no temp file is left. The summary counts the record replaced: it said 'nothing written'."""
    pytest.importorskip("matplotlib", reason="--viz needs matplotlib")
    out = tmp_path / "out"
    frame, before = _rerun_with_other_points(model_path, frames, tmp_path, out)
    picture, record = out / "000000.png", out / "000000.json"
    held = tmp_path / "held.png"
    held.write_bytes(before[picture.name])
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(held), str(picture)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to bind-mount a file")
    try:
        rc, stdout, err = infer(str(frame), "--model", str(model_path), "--out", str(out), "--viz")
    finally:
        subprocess.run(["umount", str(picture)], check=False)
    assert rc == 1 and err.splitlines()[1:] == [
        f"error: {str(frame)!r}: cannot write {str(picture)!r}: {os.strerror(errno.EBUSY)} ({str(record)!r}: 1 file "
        "of an earlier run replaced with this run's before that; once this is fixed, rerun the frame without "
        "--skip-existing, which writes all its files anew)",
        "1 of 1 frame failed (listed above)"], err
    assert stdout.startswith("0/1 frames, 0 boxes, nothing written but 1 file of an earlier run replaced (named "
                             "above)\n"), stdout
    assert output_names(out) == [record.name, picture.name] and picture.read_bytes() == before[picture.name]
    assert record.read_bytes() != before[record.name] and json.loads(record.read_bytes())["source"] == str(frame)
    assert infer(str(frame), "--model", str(model_path), "--out", str(out), "--viz")[0] == 0  # the fix, as said
    assert picture.read_bytes() != before[picture.name]


def test_a_name_that_is_not_utf8_gives_records_strict_readers_take(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pq = pytest.importorskip("pyarrow.parquet", reason=NO_PYARROW)
    pa_json = pytest.importorskip("pyarrow.json", reason=NO_PYARROW)

    folder = tmp_path / "frames"
    folder.mkdir()
    first = sorted(frames.glob("0*.bin"))[0]
    odd = os.fsdecode(b"z\xff.bin")
    (folder / odd).write_bytes(first.read_bytes())
    (folder / first.name).write_bytes(first.read_bytes())
    for fmt in ("json", "jsonl", "parquet"):
        out = tmp_path / fmt
        rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", fmt)
        assert rc == 0, err
        if fmt == "json":
            record = json.loads((out / os.fsdecode(b"z\xff.json")).read_bytes().decode("utf-8", "strict"))
            frames_named = [record["frame"]]
        else:
            (part,) = out.glob(f"detections-*.{fmt}")
            table = pa_json.read_json(part) if fmt == "jsonl" else pq.read_table(part)
            frames_named = table.column("frame").to_pylist()
            assert any(source.endswith("z\\xff.bin") for source in table.column("source").to_pylist())
        assert "z\\xff" in frames_named


def started_infer(model_path: Path, folder: Path, out: Path, *options: str, **popen: Any) -> subprocess.Popen[str]:
    """``infer FOLDER --model M --out OUT --device cpu OPTIONS`` in a child process, returned once its progress
    bar says frames are running (stdout: ``popen``'s, else none; stderr: a pipe holding what follows)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    command = [sys.executable, "-m", "pointpillars_trt", "infer", str(folder), "--model", str(model_path), "--out",
               str(out), "--device", "cpu", *options]
    child = subprocess.Popen(command, env=env, stdout=popen.pop("stdout", subprocess.DEVNULL), stderr=subprocess.PIPE,
                             text=True, **popen)
    seen = ""
    while "frame" not in seen:
        seen += child.stderr.read(1) if child.stderr is not None else ""
        assert child.poll() is None or seen, "the run ended before it was running frames"
    return child


def test_interrupted_row_run_keeps_its_finished_rows(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C in a JSON Lines run: the rows of the frames finished so far are written (one part, flushed)
    and said; --skip-existing then runs only the others, and every frame has exactly one row."""
    from pointpillars_trt.model_dir import load_model_dir

    folder = tmp_path / "many"
    make_frames(folder, 2000, load_model_dir(model_path).cfg.voxel.point_range, seed=5)
    out = tmp_path / "rows"
    child = started_infer(model_path, folder, out, "--format", "jsonl", "--batch-size", "1", "--pipelines", "1")
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    (part,) = out.glob("detections-*.jsonl")
    kept = [json.loads(line)["source"] for line in part.read_text().splitlines()]
    noun = "frame" + "s" * (len(kept) > 1)
    assert 0 < len(kept) < 2000 and f"the rows of {len(kept)} finished {noun} are in" in err
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--format", "jsonl",
                       "--skip-existing")
    assert rc == 0 and f"skipping {len(kept)} {noun} whose" in err
    rows = [json.loads(line)["source"] for p in sorted(out.glob("detections-*.jsonl"))
            for line in p.read_text().splitlines()]
    assert sorted(rows) == sorted(str(p) for p in folder.iterdir())


def test_interrupted_json_run_says_how_many_frames_it_wrote_and_how_to_finish(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C in a run of a file a frame, once some outputs are there: the files of the frames finished so far
    are flushed and their count said with the resume (a row run says its rows), the writes under way when it
    came counted too, so the count is the files on disk; --skip-existing then runs only the others."""
    from pointpillars_trt.model_dir import load_model_dir

    folder = tmp_path / "many"
    make_frames(folder, 500, load_model_dir(model_path).cfg.voxel.point_range, seed=5)
    out = tmp_path / "files"
    child = started_infer(model_path, folder, out, "--batch-size", "1", "--pipelines", "1")
    deadline = time.monotonic() + 60
    while len(list(out.glob("0*.json"))) < 20 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    said = re.search(rf"stopped: the outputs of (\d+) finished frames are in {re.escape(repr(str(out)))}; "
                     r"rerun with --skip-existing to finish\n", err)
    written = [name for name in output_names(out) if name.endswith(".json")]
    assert said is not None and 20 <= int(said.group(1)) == len(written) < 500, err
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out), "--skip-existing")
    assert rc == 0 and f"skipping {len(written)} frames whose" in err
    assert sorted(output_names(out)) == sorted(f"{p.stem}.json" for p in folder.iterdir())


def test_ctrl_c_pressed_again_while_the_run_stops_does_not_cut_its_stop_short(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three Ctrl-C 20 ms apart: the first stops the run, the others are ignored while it stops (cut short, the
    stop of an ONNX Runtime session aborted the process about one run in three: "terminate called", 134)."""
    from pointpillars_trt.model_dir import load_model_dir

    folder = tmp_path / "many"
    make_frames(folder, 400, load_model_dir(model_path).cfg.voxel.point_range, seed=6)
    for attempt in range(3):
        child = started_infer(model_path, folder, tmp_path / "out", "--format", "jsonl")
        for _ in range(3):
            child.send_signal(signal.SIGINT)
            time.sleep(0.02)
        _, err = child.communicate(timeout=60)
        assert child.returncode == 130 and err.count("interrupted") == 1, (attempt, err[-2000:])
        assert "terminate called" not in err and "Traceback" not in err, err[-2000:]
        shutil.rmtree(tmp_path / "out")


def test_a_ctrl_c_its_starter_ignores_leaves_the_run_going(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A job started with SIGINT ignored (`cmd &` in a script) keeps it ignored: Ctrl-C at the terminal that
    started the script does not stop it."""
    from pointpillars_trt.model_dir import load_model_dir

    folder = tmp_path / "many"
    make_frames(folder, 200, load_model_dir(model_path).cfg.voxel.point_range, seed=7)
    child = started_infer(model_path, folder, tmp_path / "out", "--batch-size", "1", "--pipelines", "1",
                          stdout=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0 and out.startswith("200/200 frames") and "interrupted" not in err, err[-2000:]


def test_an_error_a_ctrl_c_caused_is_reported_as_that_ctrl_c() -> None:
    """A Ctrl-C cutting a library's import short surfaces as ImportError ("initialization failed") raised while
    handling it: the run says "interrupted" (130), not a traceback; an error of its own stays an error."""
    from pointpillars_trt.stop_signals import interrupt_behind

    with pytest.raises(ImportError) as caught:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("initialization failed")  # noqa: B904 - as the library raises it
    assert isinstance(interrupt_behind(caught.value), KeyboardInterrupt)
    assert interrupt_behind(ValueError("a frame's own error")) is None


def test_a_stop_signal_raises_once_and_is_ignored_while_the_run_stops() -> None:
    from pointpillars_trt.apps.cli import Terminated, _StopOnce

    for signum, raised in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)):
        stop = _StopOnce()
        with pytest.raises(raised) as caught:
            stop(signum, None)
        assert type(caught.value) is raised
        assert stop(signal.SIGINT, None) is None and stop(signal.SIGTERM, None) is None


@pytest.mark.parametrize("rows", [2, 3])
def test_a_stop_just_as_a_part_is_written_still_flushes_and_names_the_parts(tmp_path: Path, rows: int,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C when the last row filled a part (2 rows, parts of 2: none waits for a part), or with one row
    waiting (3): every part of the run is flushed to disk and the stop line counts all their rows."""
    from pointpillars_trt.apps.infer import keep_finished_rows
    from pointpillars_trt.apps.outputs import RowParts
    from pointpillars_trt.file_writes import PendingFlush

    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    parts = RowParts(tmp_path, "jsonl", ("Car",), rows_per_part=2)
    for i in range(rows):
        parts.add(json.dumps({"source": f"{i:06d}.bin"}))
    pending = PendingFlush()
    pending._syncfs = None  # each file fsynced, as where there is no syncfs: the spy sees them
    notes: list[str] = []
    keep_finished_rows(parts, pending, notes.append)
    files = sorted(str(p) for p in tmp_path.glob("detections-*.jsonl"))
    assert len(files) == (rows + 1) // 2 and sorted(set(synced) - {str(tmp_path)}) == files, synced
    before = " and the 1 part before it" if len(files) == 2 else ""  # parts of 2 rows: 1 or 2 parts
    assert notes == [f"stopped: the rows of {rows} finished frames are in '{files[-1]}'{before}; rerun with "
                     "--skip-existing to finish"]


@pytest.mark.parametrize("cause", ["folder replaced by a file", "full disk"])
def test_a_part_that_cannot_be_written_names_why_and_advises_free_space_only_for_a_full_disk(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cause: str) -> None:
    """A part whose write fails says the OS's reason, and takes its frames back from the written ones; "free
    space" is said only where the file system was full (it was said also of a folder replaced by a file)."""
    from pointpillars_trt.apps.frame_report import FrameReport
    from pointpillars_trt.apps.infer import _RowSink
    from pointpillars_trt.apps.outputs import FrameOutput, OutputPlan, RowParts

    with contextlib.ExitStack() as stack:
        if cause == "full disk":
            out = stack.enter_context(small_tmpfs(tmp_path / "small", "64k")) / "out"
            reason = os.strerror(errno.ENOSPC)
        else:
            out, reason = tmp_path / "out", os.strerror(errno.ENOTDIR)
        out.mkdir()
        report = FrameReport(2, OutputPlan(), progress=False, where=True, folder=out)
        sink = _RowSink(RowParts(out, "jsonl", ("Car",), rows_per_part=1), report)
        report.written("000000.bin", FrameOutput(boxes=1))
        sink.add(json.dumps({"source": "000000.bin"}), ("000000.bin", FrameOutput(boxes=1)))
        if cause == "full disk":
            with open(out.parent / "filler", "wb", buffering=0) as filler, \
                    contextlib.suppress(OSError):  # as much as fits: the tmpfs is full
                while True:
                    filler.write(b"\0" * 4096)
        else:
            shutil.rmtree(out)
            out.write_text("")  # a file where the folder was
        report.written("000001.bin", FrameOutput(boxes=2))
        sink.add(json.dumps({"source": "000001.bin"}), ("000001.bin", FrameOutput(boxes=2)))
        assert report.done == ["000000.bin"] and report.failed == 1 and report.boxes == 1
    err = capsys.readouterr().err
    part = out / "detections-00001.jsonl"
    advice = ("free space, then rerun with --skip-existing" if cause == "full disk"
              else "rerun with --skip-existing to run it again")
    assert err.splitlines() == [f"error: cannot write {str(part)!r}: {reason}; the rows of 1 frame are not written "
                                f"({advice})"], err


def test_a_part_of_failed_frames_rows_alone_that_cannot_be_written_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A part holding only failed frames' rows (their errors) that cannot be written is said as such: it said "the
    rows of 0 frames are not written"."""
    from pointpillars_trt.apps.frame_report import FrameReport
    from pointpillars_trt.apps.infer import _RowSink
    from pointpillars_trt.apps.outputs import OutputPlan, RowParts

    out = tmp_path / "out"
    out.mkdir()
    report = FrameReport(1, OutputPlan(), progress=False, where=True, folder=out)
    sink = _RowSink(RowParts(out, "jsonl", ("Car",), rows_per_part=1), report)
    shutil.rmtree(out)
    out.write_text("")  # a file where the folder was
    sink.add(json.dumps({"source": "000000.bin", "error": "a bad frame"}), None)
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: cannot write {str(out / 'detections-00000.jsonl')!r}: "
                                f"{os.strerror(errno.ENOTDIR)}; the rows of failed frames are not written (rerun "
                                "with --skip-existing to run them again)"], err


def test_an_empty_out_is_one_error_line_and_threads_beyond_the_cores_one_note(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--threads beyond this machine's cores runs as many as it has, said in a note as OMP_NUM_THREADS beyond
    them is (it was refused, where OMP_NUM_THREADS was capped)."""
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", "")
    assert rc == 2 and err.count("\n") == 1 and "--out '': an empty folder name" in err
    cores = len(os.sched_getaffinity(0))
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(tmp_path), "--threads", str(cores + 1))
    assert rc == 1 and err.count("error: ") == 1 and "zz_corrupt.bin" in err, err  # the folder's corrupt frame
    s = "s" * (cores > 1)
    assert err.count(f"note: --threads {cores + 1} is more than the {cores} core{s} where the detector runs: "
                     f"{cores} thread{s}\n") == 1


def test_cpu_pipelines_share_the_cores_said_in_one_note(model_path, frames, reference, tmp_path,  # type: ignore[no-untyped-def]
                                                          monkeypatch) -> None:
    """--pipelines 2 on the CPU: each ONNX Runtime session takes its share of the cores (each would take
    them all, and the two contend), said once; the outputs are one pipeline's."""
    from test_cli import opened_options

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    opened = opened_options(monkeypatch)

    def threads() -> list[int | None]:
        return [options.threads for options in opened]

    cores = len(os.sched_getaffinity(0))
    out = tmp_path / "out"
    rc, _, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--pipelines", "2")
    each = max(1, cores // 2)
    assert rc == 1 and threads() == [each, each], (opened, err)
    assert err.count(f"note: 2 pipelines on the CPU share its {cores} cores: {each} ONNX Runtime thread") == 1, err
    assert files_of(out) == files_of(reference)
    opened.clear()
    rc, _, err = infer(str(frames), "--model", str(model_path), "--pipelines", "2", "--threads", str(cores))
    assert rc == 1 and threads() == [cores, cores]
    assert err.count(f"note: --pipelines 2 with --threads {cores}: {2 * cores} ONNX Runtime threads contend for "
                     f"{cores} cores; --threads {each} gives each pipeline its share\n") == 1, err
    opened.clear()  # an OMP_NUM_THREADS that is no count: said once, and the cores split as when it is unset
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    rc, _, err = infer(str(frames), "--model", str(model_path), "--pipelines", "2")
    assert rc == 1 and threads() == [each, each]
    assert err.count("note: OMP_NUM_THREADS='abc' is no thread count") == 1, err
    assert err.count(f"note: 2 pipelines on the CPU share its {cores} cores") == 1, err


def test_frames_of_millimetres_warn_once_naming_the_point_range_then_are_counted(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.model_dir import load_model_dir

    cfg_range = load_model_dir(model_path).cfg.voxel.point_range
    folder = tmp_path / "mm"
    paths = make_frames(folder, 3, cfg_range, seed=9)
    for path in paths:
        points = np.fromfile(path, np.float32).reshape(-1, 4)
        points[:, :3] = points[:, :3] * 1000 + 1e5  # millimetres, away from the origin: nothing in range
        points.tofile(path)
    rc, _, err = infer(str(folder), "--model", str(model_path))
    sizes = [len(np.fromfile(p, np.float32)) // 4 for p in paths]
    expect = [p for p, n in zip(paths, sizes) if n >= 100]
    lines = 0 if not expect else 1 if len(expect) == 1 else 2  # the first frame's, then the count of them all
    assert rc == 0 and err.count("warning:") == lines, err
    if expect:
        assert f"{str(expect[0])!r}: none of its" in err and "lies in the model's point range x " in err
    if len(expect) > 1:
        assert f"warning: {len(expect)} frames had no point in the model's point range in all" in err, err


def test_frames_of_only_non_finite_points_warn_once_then_are_counted(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "nan"
    folder.mkdir()
    for index in range(2):
        np.full((500, 4), np.nan, np.float32).tofile(folder / f"{index:06d}.bin")
    with pytest.raises(SystemExit) as exit_:  # argparse's one error line
        infer(str(folder), "--model", str(model_path), "--intensity-scale", "1e39")
    assert exit_.value.code == 2
    rc, _, err = infer(str(folder), "--model", str(model_path))
    assert rc == 0 and err.count("warning:") == 2 and "all its 500 points are non-finite" in err, err
    assert ("warning: 2 frames had only non-finite points in all (the first named above; then "
            f"'{folder / '000001.bin'}')") in err, err


def test_frames_that_lose_some_points_to_nan_say_so_once(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A frame a third of whose points are NaN lost them without a word (only its record's count said so)."""
    folder = tmp_path / "holes"
    folder.mkdir()
    for source in sorted(frames.glob("0*.bin"))[:2]:
        points = np.fromfile(source, np.float32).reshape(-1, 4)
        points[::3, 0] = np.nan
        points.tofile(folder / source.name)
    first = sorted(folder.iterdir())[0]
    lost = len(np.fromfile(first, np.float32).reshape(-1, 4)[::3])
    total = len(np.fromfile(first, np.float32)) // 4
    rc, _, err = infer(str(folder), "--model", str(model_path))
    assert rc == 0 and err.count("note: ") == 1, err
    assert (f"note: {str(first)!r}: {lost} of its {total} points hold NaN or infinite values and were left out, as "
            "OpenPCDet's point-range mask leaves them") in err, err
    rc, _, err = infer(*map(str, sorted(frames.glob("0*.bin"))[:2]), "--model", str(model_path))
    assert rc == 0 and "note: " not in err, err  # whole frames: nothing to say


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_a_row_part_that_finds_the_disk_full_is_one_error_and_its_frames_are_not_claimed(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path, fmt) -> None:
    with small_tmpfs(tmp_path / "small", "8k") as mount:
        (mount / "filler").write_bytes(b"\0" * 4096)  # one page left: the settings record's (a full disk is refused)
        rc, stdout, err = infer(str(frames), "--model", str(model_path), "--out", str(mount / "out"), "--format", fmt,
                                "--score-threshold", "0.01")  # boxes in every frame: none of them claimed
        assert rc == 1 and stdout.startswith("0/41 frames, 0 boxes"), (stdout, err)
        assert err.count("the rows of 40 frames are not written") == 1 and "No space left" in err, err
        assert not list((mount / "out").glob("detections-*"))


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_a_disk_full_at_the_start_is_refused_before_the_model_opens(  # type: ignore[no-untyped-def]
        model_path, frames, tmp_path, fmt) -> None:
    """--out on a file system with no room left: one error line, before the model is opened or a frame run; it was
    a warning (the settings record), then every frame run and none written."""
    with small_tmpfs(tmp_path / "small", "8k") as mount:
        (mount / "filler").write_bytes(b"\0" * 8192)
        with pytest.raises(OSError) as full:
            (mount / "more").write_bytes(b"\0")
        assert full.value.errno == errno.ENOSPC
        out = mount / "out"
        rc, stdout, err = infer(str(frames), "--model", str(model_path), "--out", str(out), "--format", fmt)
        assert rc == 2 and stdout == "" and err == (
            f"error: --out {str(out)!r}: cannot write there (it would be created in {str(mount)!r}): No space left on "
            "device\n"), err


def test_a_path_that_gives_no_frames_is_its_own_error_and_the_others_run(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "x.bin"  # a folder named like a frame, holding no point files
    empty.mkdir()
    nothing = str(tmp_path / "*.pcd")
    rc, stdout, err = infer(str(empty), nothing, str(frames), "--model", str(model_path))
    assert rc == 1 and "\n40/41 frames" in stdout, (stdout, err)
    assert f"error: folder {str(empty)!r} holds no point files" in err
    assert f"error: {nothing!r}: no such file, and no file matches it as a pattern" in err
    rc, _, err = infer(str(empty), nothing, "--model", str(model_path))  # nothing at all to run: a user error
    assert rc == 2 and err.count("\n") == 2 and "holds no point files" in err and "matches it as a pattern" in err


INTERRUPT_ON_FIRST_FRAME = """
import sys
import threading
from pointpillars_trt.apps import frame_report
from pointpillars_trt.apps.cli import main
from pointpillars_trt.detector import PointPillars

def interrupted(*_args, **_kwargs):  # Ctrl-C arrives while the first frame is being reported
    raise KeyboardInterrupt

close = PointPillars.close

def observed_close(self):  # which pipeline threads still run when a detector closes
    running = [t.name for t in threading.enumerate() if t.name.startswith("pp-pipeline") and t.is_alive()]
    print(f"pipelines running at close: {running}", file=sys.stderr)
    close(self)

frame_report.FrameReport.written = interrupted
PointPillars.close = observed_close
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ctrl_c_stops_the_pipelines_before_their_detectors_close(assets: Path, tmp_path: Path) -> None:
    """Ctrl-C while the main thread reports a frame and the pipeline runs the next one (real checkpoint,
    full KITTI scans: ~0.5 s a frame on the CPU): the run's pipelines stop before the detectors close, so
    the exit is the clean 130, never ONNX Runtime's abort of a session still running when the process ends
    (no pipeline thread runs when the detectors close)."""
    scans = sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))
    folder = tmp_path / "scans"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:06d}.bin").write_bytes(scans[i % len(scans)].read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    for attempt in range(3):
        done = subprocess.run([sys.executable, "-c", INTERRUPT_ON_FIRST_FRAME, "infer", str(folder), "--model",
                               str(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"), "--device",
                               "cpu", "--out", str(tmp_path / f"out{attempt}"), "--pipelines", "2",
                               "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 130, done.stderr[-2000:]
        assert "interrupted" in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]
        assert "pipelines running at close: []" in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_empty_files_warn_once_and_still_get_their_output(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two 0-byte frames among good ones: one warning naming the first, the count of both after the run,
    exit 0, and each empty frame's output written with its 0 boxes (an empty frame is valid, but mostly a
    copy that failed)."""
    folder = tmp_path / "some_empty"
    folder.mkdir()
    good = sorted(frames.glob("*.bin"))[:2]
    for path in good:
        (folder / path.name).write_bytes(path.read_bytes())
    for name in ("a_empty.bin", "b_empty.bin"):
        (folder / name).write_bytes(b"")
    out = tmp_path / "out"
    rc, _, err = infer(str(folder), "--model", str(model_path), "--out", str(out))
    # (the tiny model's 256 pillars leave some of the good frames' out: that warning is not counted here)
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "max_pillars" not in line]
    assert rc == 0 and len(warnings) == 2, err
    assert warnings[0] == (f"warning: '{folder / 'a_empty.bin'}' holds no points (an empty file: a copy that "
                           "failed? copy it again); its output says 0 boxes (warned once)"), warnings
    assert warnings[1] == ("warning: 2 frames held no points in all (the first named above; then "
                           f"'{folder / 'b_empty.bin'}')"), warnings
    for name in ("a_empty", "b_empty"):
        assert json.loads((out / f"{name}.json").read_text())["num_points"] == 0


def test_frames_of_no_point_warn_whatever_their_format(model_path, frames, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A .npy of shape (0, 4), a .pcd whose header says POINTS 0 and a 0-byte .bin among good frames: the
    first is named once with the fix, all three are counted after the run (the 0-byte file once, not
    also on a line of its own), exit 0, and each one's output says 0 points."""
    folder = tmp_path / "no_points"
    folder.mkdir()
    for path in sorted(frames.glob("*.bin"))[:2]:
        (folder / path.name).write_bytes(path.read_bytes())
    np.save(folder / "a_rows.npy", np.zeros((0, 4), np.float32))
    (folder / "b_header.pcd").write_bytes(b"VERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\n"
                                          b"COUNT 1 1 1 1\nWIDTH 0\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 0\n"
                                          b"DATA binary\n")
    (folder / "c_bytes.bin").write_bytes(b"")
    out = tmp_path / "out"
    rc, stdout, err = infer(str(folder), "--model", str(model_path), "--out", str(out))
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "max_pillars" not in line]
    assert rc == 0 and stdout.startswith("5/5 frames"), (stdout, err)
    assert warnings == [f"warning: '{folder / 'a_rows.npy'}' holds no points (a file of 0 points: check what "
                        "wrote it); its output says 0 boxes (warned once)",
                        "warning: 3 frames held no points in all (the first named above; then "
                        f"'{folder / 'b_header.pcd'}', '{folder / 'c_bytes.bin'}')"], err
    for name in ("a_rows", "b_header", "c_bytes"):
        assert json.loads((out / f"{name}.json").read_text())["num_points"] == 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_among_the_frames_is_its_one_error_not_also_an_empty_file(model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A FIFO's size is 0, but it is not an empty point file: one ``error:`` line names it, no warning
    calls it empty, and the other frames run."""
    from pointpillars_trt.model_dir import load_model_dir

    folder = tmp_path / "frames"
    make_frames(folder, 2, load_model_dir(model_path).cfg.voxel.point_range, seed=4)
    os.mkfifo(folder / "pipe.bin")
    (folder / "empty.bin").write_bytes(b"")
    rc, stdout, err = infer(str(folder), "--model", str(model_path), "--out", str(tmp_path / "out"))
    assert rc == 1 and stdout.startswith("3/4 frames"), (stdout, err)
    assert err.count("error: ") == 1 and "pipe.bin" in err and "FIFO" in err, err
    assert err.count("holds no points") == 1 and "empty.bin" in err and "(and 1 more)" not in err, err


def test_parquet_without_pyarrow_is_refused_before_the_model_loads(frames, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without pyarrow, ``--format parquet`` is one error line before anything loads: here the model is
    not even a checkpoint, and the error is still pyarrow's."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError, as where it is absent
    not_a_model = tmp_path / "m.pth"
    not_a_model.write_bytes(b"not a checkpoint")
    rc, _, err = infer(str(frames), "--model", str(not_a_model), "--out", str(tmp_path / "o"), "--format", "parquet")
    assert rc == 2 and err.count("\n") == 1 and "--format parquet needs pyarrow" in err, err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_a_frame_named_twice_is_refused_in_a_row_format(model_path, frames, tmp_path, monkeypatch, fmt) -> None:  # type: ignore[no-untyped-def]
    """A row format keeps one row a source (sources compared as absolute paths, as --skip-existing compares
    them): the same point file named again (here with ./ and absolute) is refused before anything runs,
    as the per-frame formats refuse it."""
    first, second = sorted(frames.glob("*.bin"))[:2]
    monkeypatch.chdir(frames)
    for again in (f"./{first.name}", str(first)):
        out = tmp_path / "rows"
        rc, _, err = infer(first.name, second.name, again, "--model", str(model_path), "--out", str(out),
                           "--format", fmt)
        assert (rc, err) == (2, f"error: frame {again!r} is given twice (by two arguments, a folder and a "
                                "file in it, or a symbolic link to it): give each frame once\n"), err
        assert not out.exists()


def test_a_part_is_written_once_its_first_row_is_old_enough(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A slow run (the CPU, ~2 frames/s) would fill a part of 10,000 rows in hours, all of them lost to a kill:
    a part is also written when a row comes seconds_per_part after the part's first."""
    from pointpillars_trt.apps.outputs import RowParts

    parts = RowParts(tmp_path, "jsonl", ("Car",), rows_per_part=100, seconds_per_part=0.2)
    parts.add(json.dumps({"source": "000000.bin"}))
    parts.add(json.dumps({"source": "000001.bin"}))
    assert list(tmp_path.iterdir()) == []  # young rows wait
    time.sleep(0.25)
    parts.add(json.dumps({"source": "000002.bin"}))  # the part's first row is 0.25 s old: written with this one
    written = sorted(tmp_path.glob("detections-*.jsonl"))
    assert [p.name for p in written] == ["detections-00000.jsonl"]
    assert [json.loads(line)["source"] for line in written[0].read_text().splitlines()] == [
        "000000.bin", "000001.bin", "000002.bin"]
    parts.add(json.dumps({"source": "000003.bin"}))  # the next part starts its own clock
    assert len(list(tmp_path.glob("detections-*.jsonl"))) == 1 and parts.rows_written == 3
    parts.close()
    assert len(list(tmp_path.glob("detections-*.jsonl"))) == 2 and parts.rows_written == 4


@pytest.mark.parametrize("velocity", [False, True], ids=["kitti", "velocity"])
@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_rows_travel_as_their_json_line_and_parts_hold_the_records(tmp_path, fmt, velocity) -> None:  # type: ignore[no-untyped-def]
    """A row's text (what writers and Ray actors hand over) is the strict JSON of frame_row, and a part built
    from the texts holds the rows a user reads back: against the standard library's encoder over
    ``to_jsonable`` and Arrow's table from the row dicts. A model's velocities get their column (none in a
    failed frame's row: it was null there, its JSON line without the key)."""
    from pointpillars_trt.apps.outputs import RowParts, frame_row, row_schema, row_text
    from pointpillars_trt.detections import Detections, FrameStats
    from pointpillars_trt.strict_json import NonFiniteJSONError, to_jsonable

    classes = ("Car", "Pedestrian", "Cyclist")
    rng = np.random.default_rng(3)
    boxes = rng.normal(0, 20, (300, 7)).astype(np.float32)  # a frame of many boxes: rows longer than a few KB
    found = Detections(boxes, rng.random(300).astype(np.float32), rng.integers(0, 3, 300), classes,
                       FrameStats(np.int64(19_000)), rng.normal(0, 5, (300, 2)).astype(np.float32) if velocity else None)
    rows = [frame_row("/data/\u00e9t\u00e9/000000.bin", found, None, classes),
            frame_row("/data/000001.bin", None, "point file '000001.bin' is empty", classes, velocity=velocity)]
    texts = [row_text(row) for row in rows]
    assert texts == [json.dumps(to_jsonable(row), allow_nan=False) for row in rows]
    parts = RowParts(tmp_path, fmt, classes)
    for text in texts:
        parts.add(text)
    parts.close()
    (part,) = tmp_path.glob(f"detections-*.{fmt}")
    expected = [json.loads(text) for text in texts]
    assert ("velocity" in expected[0]) is velocity and ("velocity" in expected[1]) is velocity
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(part)
        assert table.equals(pa.Table.from_pylist(expected, schema=row_schema(classes, velocity=velocity)))
        assert ("velocity" in table.column_names) is velocity
    assert part_rows(part) == expected
    with pytest.raises(NonFiniteJSONError, match=r"\$\.scores\[0\]"):
        row_text({**rows[1], "scores": [float("nan")]})


def test_a_part_arrow_cannot_make_is_one_input_error_and_its_rows_are_dropped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pyarrow", reason=NO_PYARROW)
    from pointpillars_trt.apps.outputs import RowParts, frame_row, row_text
    from pointpillars_trt.errors import InputError

    parts = RowParts(tmp_path, "parquet", ("Car",))
    parts.add(row_text({**frame_row("/data/000000.bin", None, None, ("Car",)), "weather": "rain"}))
    with pytest.raises(InputError, match=r"detections-00000.parquet': the rows could not be made into a part: .*unexpected field"):
        parts.close()
    assert parts.rows == [] and parts.files == [] and not list(tmp_path.iterdir())


def test_two_runs_writing_parts_into_one_folder_at_once_keep_all_their_rows(tmp_path: Path) -> None:
    """Two runs started together in one --out both numbered their first part 00000: the second part written
    replaced the first, whose rows were lost while its run reported them written. Now the second takes the
    next free number."""
    from pointpillars_trt.apps.outputs import RowParts

    first, second = (RowParts(tmp_path, "jsonl", ("Car",), rows_per_part=2) for _ in range(2))
    for run, parts in (("a", first), ("b", second)):
        for i in range(3):
            parts.add(json.dumps({"source": f"{run}{i}.bin"}))
    first.close()
    second.close()
    rows = sorted(json.loads(line)["source"] for p in tmp_path.glob("detections-*.jsonl")
                  for line in p.read_text().splitlines())
    assert rows == ["a0.bin", "a1.bin", "a2.bin", "b0.bin", "b1.bin", "b2.bin"]
    assert len({*first.files, *second.files}) == 4 and first.rows_written == second.rows_written == 3
