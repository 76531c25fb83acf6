"""Hostile frames among good ones: each fails alone with one ``error:`` line, the others are written.

Oracle: the same good frames run through ``PointPillars.infer_many`` alone (the JSON files the run
writes for them must hold the same boxes).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from out_folder import output_names
from pointpillars_trt.apps.cli import main
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import InputError, safe_repr



def bool_shape_npy(path: Path) -> Path:
    """A 150-byte .npy whose header says shape (True, 4): ``isinstance(True, int)`` holds."""
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (True, 4), }"
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 16)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", seed=3).path


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a.bin, b.npy (the hostile header), c.bin, d.bin: the bad frame sits between good ones."""
    folder = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(0)
    for name in ("a", "c", "d"):
        xyz = rng.uniform((0.2, -1.8, -2.5), (5.0, 1.8, 0.5), (500, 3))
        np.column_stack([xyz, rng.uniform(0, 1, 500)]).astype(np.float32).tofile(folder / f"{name}.bin")
    bool_shape_npy(folder / "b.npy")
    return folder


def test_infer_many_keeps_going_after_a_bool_shape_npy(tiny_model: Path, frames: Path) -> None:
    paths = [str(frames / n) for n in ("a.bin", "b.npy", "c.bin", "d.bin")]
    with PointPillars.from_model_dir(tiny_model, device="cpu") as detector:
        results = list(detector.infer_many(paths, batch_size=2))
        alone = list(detector.infer_many([paths[0], paths[2], paths[3]]))
    assert [r.source for r in results] == paths
    assert isinstance(results[1].error, InputError) and "shape (True, 4)" in str(results[1].error)
    for got, want in zip([results[0], results[2], results[3]], alone):
        assert got.error is None and want.detections is not None and got.detections is not None
        np.testing.assert_array_equal(got.detections.boxes, want.detections.boxes)


def test_infer_cli_reports_the_bool_shape_npy_and_writes_the_rest(tiny_model: Path, frames: Path,
                                                                  tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["infer", str(frames), "--model", str(tiny_model), "--out", str(tmp_path), "--device", "cpu",
                   "--no-progress"])
    assert rc == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "b.npy" in errors[0] and "shape (True, 4)" in errors[0], errors
    assert output_names(tmp_path) == ["a.json", "c.json", "d.json"]
    with PointPillars.from_model_dir(tiny_model, device="cpu") as detector:
        want = detector(np.fromfile(frames / "d.bin", np.float32).reshape(-1, 4))
    got = json.loads((tmp_path / "d.json").read_text())
    np.testing.assert_allclose(np.asarray(got["boxes_lidar"]).reshape(-1, 7), want.boxes, rtol=0, atol=1e-6)


def run_infer(*args: object) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True,
                    reason="root writes into read-only folders; needs an unprivileged user")
def test_read_only_out_is_one_error_before_the_model_loads(frames: Path, tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        rc, err = run_infer("infer", frames, "--model", tmp_path / "no-model", "--out", out, "--device", "cpu")
    finally:
        out.chmod(0o755)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--out" in lines[0] and "cannot write there" in lines[0], err


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs sysfs, where nobody (root neither) makes folders")
def test_out_where_no_folder_can_be_made_is_one_error_before_the_model_loads(frames: Path, tmp_path: Path) -> None:
    rc, err = run_infer("infer", frames, "--model", tmp_path / "no-model", "--out", "/sys/kernel/pp-out",
                        "--device", "cpu")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "cannot write there (it would be created in '/sys/kernel')" in lines[0], err


def test_out_below_a_file_is_one_error_before_the_model_loads(frames: Path, tmp_path: Path) -> None:
    """The model path does not exist: only a check made before the model loads can name --out."""
    (tmp_path / "afile").write_text("x")
    rc, err = run_infer("infer", frames, "--model", tmp_path / "no-model", "--out", tmp_path / "afile" / "sub",
                        "--device", "cpu")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--out" in lines[0] and "is a file, not a folder" in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]



@pytest.mark.parametrize("given", ["broken", "broken/sub", "loop", "loop/sub/deeper"])
def test_out_through_a_link_to_nothing_is_named_so_before_the_model_loads(frames: Path, tmp_path: Path,
                                                                          given: str) -> None:
    """An --out that is (or lies below) a broken symbolic link or a link loop, which `ls` shows: it passed the
    check, and creating it later failed as "error: 'broken': File exists", naming no option and no link."""
    (tmp_path / "broken").symlink_to(tmp_path / "gone")
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    out = tmp_path / given
    rc, err = run_infer("infer", frames, "--model", tmp_path / "no-model", "--out", out, "--device", "cpu")
    link = tmp_path / given.split("/")[0]
    below = "" if link == out else f": {str(link)!r}"
    kind = (f"a broken symbolic link (to {str(tmp_path / 'gone')!r}, which does not exist)" if link.name == "broken"
            else "a symbolic link in a loop (it leads back to itself)")
    assert (rc, err) == (2, f"error: --out {str(out)!r}{below} is {kind}, where no folder can be made\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "loop", "loop2"]

@pytest.mark.slow
def test_infer_ray_reports_the_bool_shape_npy_and_writes_the_rest(tiny_model: Path, frames: Path,
                                                                  tmp_path: Path) -> None:
    """On a real local Ray cluster: the reader's error becomes that frame's line, the dataset goes on."""
    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install 'ray[data]')")
    import ray
    from test_distributed_ray import ray_infer

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rc, out, err = ray_infer(frames, tiny_model, tmp_path / "ray")
    finally:
        if started:
            ray.shutdown()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 1 and out.startswith("3/4 frames"), (out, err)
    assert len(errors) == 1 and "b.npy" in errors[0] and "shape (True, 4)" in errors[0], errors
    assert output_names(tmp_path / "ray") == ["a.json", "c.json", "d.json"]


def permission_bound_prefix() -> list[str] | None:
    """A command prefix under which file permissions bind: none for a plain user; for root, ``setpriv`` dropping
    the capabilities that override them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH); None where neither is possible."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None or subprocess.run([setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--", "true"],
                                         capture_output=True).returncode != 0:
        return None
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_a_folder_this_user_cannot_open_gives_no_frame_and_the_rest_run(tiny_model: Path, frames: Path,
                                                                        tmp_path: Path, repo_root: Path) -> None:
    """Before: a folder that cannot be listed stopped the whole run (one ``error: 'locked': Permission denied``, no
    frame run), and a file below it was said not to exist. Each is now a path that gives no frame, said apart."""
    prefix = permission_bound_prefix()
    if prefix is None:
        pytest.skip("root without setpriv: permissions do not bind")
    good = tmp_path / "good"
    good.mkdir()
    shutil.copy(frames / "a.bin", good / "a.bin")
    locked = tmp_path / "locked"
    locked.mkdir()
    shutil.copy(frames / "c.bin", locked / "c.bin")
    out = tmp_path / "out"
    locked.chmod(0)
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "pointpillars_trt", "infer", str(good), str(locked),
                               str(locked / "c.bin"), "--model", str(tiny_model), "--out", str(out), "--device", "cpu"],
                              capture_output=True, text=True, timeout=120, cwd=repo_root)
    finally:
        locked.chmod(0o755)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: folder '{locked}' cannot be listed: Permission denied",
                      f"error: '{locked / 'c.bin'}' cannot be reached: Permission denied (a folder on its path that "
                      "this user cannot search?)"], done.stderr
    assert output_names(out) == ["a.json"]
    assert done.stdout.startswith("1/1 frames") and "2 paths gave no frame" in done.stderr, done


def test_a_path_through_a_symbolic_link_loop_or_too_long_a_name_is_not_blamed_on_permissions(
        tiny_model: Path, frames: Path, tmp_path: Path) -> None:
    """Before: each said "(a folder on its path that this user cannot search?)", a hint for permissions."""
    folder = tmp_path / "frames"
    folder.mkdir()
    shutil.copy(frames / "a.bin", folder / "a.bin")
    (tmp_path / "loop").symlink_to("loop")
    looped, long = tmp_path / "loop" / "b.bin", folder / ("x" * 300 + ".bin")
    out = tmp_path / "out"
    rc, err = run_infer("infer", folder, looped, long, "--model", tiny_model, "--out", out, "--device", "cpu",
                        "--no-progress")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 1 and errors == [
        f"error: '{looped}' cannot be reached: Too many levels of symbolic links (a symbolic link on its path that "
        "leads back to itself?)", f"error: {safe_repr(str(long))} cannot be reached: File name too long"], err
    assert output_names(out) == ["a.json"]


def test_a_broken_symbolic_link_is_named_so(tiny_model: Path, frames: Path, tmp_path: Path) -> None:
    """Before: "point file '.../b.bin' does not exist", of a name ``ls`` lists."""
    folder = tmp_path / "frames"
    folder.mkdir()
    shutil.copy(frames / "a.bin", folder / "a.bin")
    (folder / "b.bin").symlink_to("gone.bin")
    out = tmp_path / "out"
    rc, err = run_infer("infer", folder, "--model", tiny_model, "--out", out, "--device", "cpu", "--no-progress")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 1 and errors == [f"error: point file '{folder / 'b.bin'}' is a broken symbolic link (to 'gone.bin', "
                                  "which does not exist)"], err
    assert output_names(out) == ["a.json"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name, options", [
    ("a.json", ()), ("a.json", ("--skip-existing",)), ("a.txt", ("--format", "kitti", "--no-fov-only")),
    ("a.png", ("--viz", "--skip-existing")), ("detections-00000.jsonl", ("--format", "jsonl", "--skip-existing")),
])
def test_a_fifo_in_an_outputs_place_is_one_error_not_a_hang(tiny_model: Path, frames: Path, tmp_path: Path,
                                                           name: str, options: tuple[str, ...]) -> None:
    """A FIFO where a frame's output (or a part file) would be: checking it opened it and waited for a writer
    forever; now it is refused before any frame runs, and the FIFO stays. In a process of its own, bounded in time."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / name)
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frames / "a.bin"), "--model",
                           str(tiny_model), "--out", str(out), "--device", "cpu", "--no-progress", *options],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: ") and "is a FIFO (named pipe), not a regular file" in done.stderr
    assert os.listdir(out) == [name]


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="needs FIFOs and /dev/zero")
def test_fifos_and_devices_named_like_frames_in_a_folder_or_a_glob_fail_alone_at_once(tiny_model: Path, frames: Path,
                                                                                      tmp_path: Path) -> None:
    """A FIFO no process writes, /dev/zero and /dev/urandom, named like frames and found by listing a folder or
    matching a glob: each is its frame's one error naming what it is, read never (no wait for a writer, no endless
    bytes), and the frame beside them runs. In a process of its own, bounded in time."""
    folder = tmp_path / "frames"
    folder.mkdir()
    shutil.copy(frames / "a.bin", folder / "a.bin")
    os.mkfifo(folder / "b.bin")
    (folder / "c.npy").symlink_to("/dev/zero")
    (folder / "d.pcd").symlink_to("/dev/urandom")
    for given in (str(folder), str(folder / "*")):
        out = tmp_path / f"out{len(given)}"
        done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", given, "--model", str(tiny_model),
                               "--out", str(out), "--device", "cpu", "--no-progress"],
                              capture_output=True, text=True, timeout=120)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert done.returncode == 1 and errors == [
            f"error: point file '{folder / 'b.bin'}' is a FIFO (named pipe), not a regular file",
            f"error: point file '{folder / 'c.npy'}' is a character device, not a regular file",
            f"error: point file '{folder / 'd.pcd'}' is a character device, not a regular file"], done.stderr
        assert output_names(out) == ["a.json"]


def test_point_dim_for_a_run_without_a_bin_frame_is_refused_and_kept_where_one_is(frames: Path,
                                                                                   tmp_path: Path) -> None:
    """--point-dim sets the row length of .bin files alone: given for .npy / .pcd frames only, it would change
    nothing the user expects it to, so it is one error before the model loads (a missing one here); beside a
    .bin frame it stands (the run then fails on the model, not on the option)."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.fromfile(frames / "a.bin", np.float32).reshape(-1, 4))
    rc, err = run_infer("infer", folder, "--model", tmp_path / "no-model", "--point-dim", "5", "--device", "cpu")
    assert rc == 2 and err == ("error: --point-dim 5: it sets the values a point of .bin frames, and the one frame "
                               "is no .bin file (.npy and .pcd files carry their own row length): drop it\n"), err
    np.save(folder / "b.npy", np.fromfile(frames / "a.bin", np.float32).reshape(-1, 4))
    rc, err = run_infer("infer", folder, "--model", tmp_path / "no-model", "--point-dim", "5", "--device", "cpu")
    assert rc == 2 and err == ("error: --point-dim 5: it sets the values a point of .bin frames, and none of these "
                               "2 frames is one (.npy and .pcd files carry their own row length): drop it\n"), err
    (folder / "b.npy").unlink()
    rc, err = run_infer("infer", folder, frames / "a.bin", "--model", tmp_path / "no-model", "--point-dim", "5",
                        "--device", "cpu")
    assert rc == 2 and "--point-dim" not in err and "no-model" in err, err


def test_an_intensity_warning_names_what_sets_the_layout_of_its_kind_of_file(tiny_model: Path, frames: Path,
                                                                             tmp_path: Path) -> None:
    """Negative intensities (columns out of order?) in a .npy or .pcd frame: the warning's layout check names the
    array's columns or the file's FIELDS, not --point-dim, which a run of such frames refuses."""
    points = np.fromfile(frames / "a.bin", np.float32).reshape(-1, 4).copy()
    points[:, 3] = -0.5
    folder = tmp_path / "frames"
    folder.mkdir()
    np.save(folder / "n.npy", points)
    header = ("VERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
              f"WIDTH {len(points)}\nHEIGHT 1\nPOINTS {len(points)}\nDATA binary\n")
    (folder / "p.pcd").write_bytes(header.encode() + points.tobytes())
    for name, setting in (("n.npy", "the array's columns"), ("p.pcd", "the file's FIELDS")):
        rc, err = run_infer("infer", folder / name, "--model", tiny_model, "--out", tmp_path / name, "--device",
                            "cpu", "--no-progress")
        assert rc == 0 and f"check the point layout ({setting}): x, y, z, intensity" in err, err
        assert "--point-dim" not in err, err


def test_a_model_dir_whose_model_json_is_a_fifo_is_one_error_not_a_hang(tiny_model: Path, frames: Path,
                                                                       tmp_path: Path) -> None:
    """model.json a FIFO: refused as one, but the rebuild command of the refusal opened it for the checkpoint it
    records and waited for a writer forever. In a process of its own, bounded in time."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "model.json").unlink()
    os.mkfifo(model / "model.json")
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frames / "a.bin"), "--model",
                           str(model), "--device", "cpu", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: '{model / 'model.json'}': is a FIFO (named pipe), not a regular file; "
                                  "rebuild the model dir: `pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth"), \
        done.stderr


@pytest.mark.parametrize("precision", [None, "fp16", "fp32"])
def test_a_model_dir_of_another_format_gets_its_rebuild_command_whatever_precision_is_given(
        tiny_model: Path, frames: Path, tmp_path: Path, precision: str | None) -> None:
    """A model.json of another format version is refused with the build command that rebuilds the model dir; with
    ``--precision`` other than the one built in, the model dir's check ran before that command was added, and the
    refusal said only 'rebuild the model dir'."""
    from tiny import set_unknown_format_version

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    refused = set_unknown_format_version(model)
    given = ["--precision", precision] if precision else []
    rc, err = run_infer("infer", frames / "a.bin", "--model", model, "--device", "cpu", "--no-progress", *given)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(refused), err
    assert "rebuild the model dir: `pointpillars-trt build --checkpoint " in err, err


def test_a_glob_over_folders_linked_in_loops_gives_each_frame_once_and_ends(tmp_path: Path) -> None:
    """``seq/**/*.bin`` over a tree with two symbolic links to a folder above them: glob followed every link, giving
    paths without end (seq/l1/l2/l1/..., 2**40 of them before the kernel's limit of 40 links), so infer never
    started. Each folder is searched once: the tree's frames, each once. A child process, since the old expansion
    does not end."""
    seq = tmp_path / "seq"
    (seq / "a" / "b").mkdir(parents=True)
    for name in ("top.bin", "a/x.bin", "a/b/y.bin"):
        (seq / name).write_bytes(bytes(16))
    os.symlink("..", seq / "a" / "up")
    os.symlink("../..", seq / "a" / "b" / "upup")
    code = ("import sys\nfrom pointpillars_trt.apps.frame_paths import expand_frame_paths\n"
            f"print(*expand_frame_paths([{str(seq / '**' / '*.bin')!r}]), sep='\\n')\n")
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("expanding the glob did not end within 30 s")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [str(seq / "a/b/y.bin"), str(seq / "a/x.bin"), str(seq / "top.bin")]
