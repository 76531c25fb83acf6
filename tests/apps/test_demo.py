"""``pointpillars-trt demo``: cold first frame and steady-state times; a refused --device cuda, and a
multi-head config (demo's and bench's random weights are single-head) and an --out that is a file, that
write nothing."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pointpillars_trt.apps.cli import main
from pointpillars_trt.devices import cuda_available


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_demo_cold_and_steady_times(tmp_path: Path) -> None:
    rc, out, err = cli("demo", "--out", tmp_path, "--device", "cpu", "--repeats", "2")
    assert rc == 0, err
    assert "SIMULATED" in out and "UNTRAINED" in out
    assert "first frame (cold" in out and "steady state (median of 2 more frames)" in out
    cold = out.split("first frame (cold", 1)[1].splitlines()[1]
    steady = out.split("steady state", 1)[1].splitlines()[1]
    for line in (cold, steady):
        for stage in ("voxelize", "pfn", "scatter", "rpn", "postprocess", "total", "call"):
            assert stage in line, line
    record = json.loads((tmp_path / "detections.json").read_text())
    assert f"boxes: {len(record['scores'])}" in out and "num_nonfinite_boxes" in record
    first = out.split("heading\n", 1)[1].splitlines()[0].split()
    assert first[0] == "0" and float(first[-1]) == round(record["boxes_lidar"][0][6], 3)  # the heading it wrote
    assert record["num_points"] == (tmp_path / "simulated_frame.bin").stat().st_size // 16
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "bev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, _, err = cli("demo", "--out", tmp_path, "--device", "cpu", "--repeats", "1")  # its own outputs: rewritten
    assert rc == 0, err


def test_the_boxes_and_the_wait_for_the_steady_state_are_said_before_the_frames_it_times(tmp_path: Path,
                                                                                      repo_root: Path) -> None:
    """A thousand frames to time (about a second each on the CPU): the first frame's boxes and what the run now
    waits for reach a pipe before them, and Ctrl-C then stops it. Before: nothing after 'running on' until every
    frame had run (~15 s at the default 10 on two cores)."""
    child = subprocess.Popen([sys.executable, "-m", "pointpillars_trt", "demo", "--out", str(tmp_path), "--device",
                              "cpu", "--repeats", "1000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root)})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True).start()  # type: ignore[union-attr]
    said: list[str] = []
    try:
        while not said or not said[-1].startswith("timing "):
            try:
                said.append(lines.get(timeout=120).rstrip("\n"))
            except queue.Empty:
                pytest.fail(f"nothing said in 120 s after {said[-2:]} while the frames run")
    finally:
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
    table = said.index("  #  label        score      x       y      z     dx    dy    dz  heading")
    assert said[table - 2].startswith("pillars: ") and said[table + 1].startswith("  0  ")
    assert said[-1] == "timing 1000 more frames for the steady-state times (about a second each on the CPU) ..."
    assert (child.returncode, err.splitlines()[-1]) == (130, "interrupted"), err


@pytest.mark.parametrize("name, content, why", [
    ("detections.json", b'{"mine": 1}\n', "JSON that is not a record infer writes"),
    ("bev.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 5000, "a picture that pointpillars-trt did not draw (a camera image?)"),
], ids=["json", "png"])
def test_demo_never_overwrites_results_it_did_not_write(tmp_path: Path, name: str, content: bytes, why: str) -> None:
    """A user's detections.json or picture in --out (they were replaced) is refused before anything is written;
    so is a folder named random_model that is no model dir (the simulated frame was written before that)."""
    (tmp_path / name).write_bytes(content)
    rc, _, err = cli("demo", "--out", tmp_path, "--device", "cpu")
    assert rc == 2 and err == (f"error: --out {str(tmp_path)!r} holds {name!r}, which the demo did not write ({why}), "
                               "and the demo would overwrite it: give another --out\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name] and (tmp_path / name).read_bytes() == content
    mine = tmp_path / "models"
    (mine / "random_model").mkdir(parents=True)
    (mine / "random_model" / "notes.txt").write_text("precious")
    rc, _, err = cli("demo", "--out", mine, "--device", "cpu")
    assert rc == 2 and "not a model dir" in err and sorted(p.name for p in mine.iterdir()) == ["random_model"], err


@pytest.mark.parametrize("name", ["simulated_frame.bin", "detections.json", "bev.png"])
@pytest.mark.parametrize("kind", ["a directory", "a FIFO (named pipe)"])
def test_a_folder_or_fifo_in_an_output_place_is_refused_before_anything_is_written(tmp_path: Path, name: str,
                                                                                   kind: str) -> None:
    """Before: the whole run, the model and the frame written, then the atomic rename's "Is a directory"
    naming the temp file (a FIFO's place was replaced by a regular file)."""
    out = tmp_path / "demo"
    out.mkdir()
    if kind == "a directory":
        (out / name).mkdir()
    else:
        os.mkfifo(out / name)
    rc, stdout, err = cli("demo", "--out", out, "--device", "cpu", "--repeats", "1")
    assert (rc, stdout) == (2, ""), (stdout, err)
    assert err == (f"error: --out {str(out)!r} holds {name!r}, which is {kind}, not a regular file, and the demo "
                   "writes that file: remove it or give another --out\n"), err
    assert [p.name for p in out.iterdir()] == [name]


@pytest.mark.parametrize("names, held", [(["000000.bin", "000001.bin"], "2 point files (e.g. '000000.bin')"),
                                         (["000000.bin"], "1 point file ('000000.bin')")], ids=["two", "one"])
def test_an_out_of_point_files_is_refused_before_the_simulated_frame_joins_them(tmp_path: Path, names: list[str],
                                                                                 held: str) -> None:
    """Before: demo --out velodyne/ wrote simulated_frame.bin among the KITTI frames (and its model dir beside them),
    and the next infer of that folder ran it as one more frame. Its own frame of an earlier run is no such file. The
    one point file there was named 'e.g.'."""
    velodyne = tmp_path / "velodyne"
    velodyne.mkdir()
    for name in (*names, ".hidden.bin"):
        (velodyne / name).write_bytes(b"\0" * 16)
    rc, stdout, err = cli("demo", "--out", velodyne, "--device", "cpu", "--repeats", "1")
    assert (rc, stdout) == (2, "") and err == (
        f"error: --out {str(velodyne)!r} holds {held}, and the demo's simulated frame written there would be one "
        "more frame of that folder to infer: give the demo a folder of its own (its default: demo_out)\n"), err
    assert sorted(p.name for p in velodyne.iterdir()) == [".hidden.bin", *names]
    from pointpillars_trt.apps.demo import refuse_a_folder_of_frames

    own = tmp_path / "demo_out"
    own.mkdir()
    (own / "simulated_frame.bin").write_bytes(b"\0" * 16)  # an earlier demo's frame, to be written again
    (own / "notes.txt").write_text("mine")
    (own / "scans.npy").mkdir()  # a folder, not a point file
    refuse_a_folder_of_frames(own)


def test_an_out_of_point_files_beside_a_link_loop_is_still_refused(tmp_path: Path) -> None:
    """A link loop among the files (l1.bin -> l2.bin -> l1.bin) ended the folder's listing as if it were not there,
    and the simulated frame joined the real ones."""
    velodyne = tmp_path / "velodyne"
    velodyne.mkdir()
    (velodyne / "000000.bin").write_bytes(b"\0" * 16)
    (velodyne / "l1.bin").symlink_to("l2.bin")
    (velodyne / "l2.bin").symlink_to("l1.bin")
    rc, stdout, err = cli("demo", "--out", velodyne, "--device", "cpu", "--repeats", "1")
    assert (rc, stdout) == (2, "") and err.startswith(
        f"error: --out {str(velodyne)!r} holds 3 point files (e.g. '000000.bin'), and the demo's simulated frame"), err
    assert sorted(p.name for p in velodyne.iterdir()) == ["000000.bin", "l1.bin", "l2.bin"]


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_demo_cuda_without_cuda_writes_nothing(tmp_path: Path, device: str) -> None:
    if cuda_available() is None:
        pytest.skip("CUDA is available here")
    out = tmp_path / "demo"
    rc, stdout, err = cli("demo", "--out", out, "--device", device)
    assert rc == 2 and stdout == "", (stdout, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and device in lines[0] and "--device cpu" in lines[0]
    assert not out.exists()


def test_demo_bad_device_is_an_argparse_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()):
        main(["demo", "--out", str(tmp_path / "d"), "--device", "gpu"])
    assert exit_info.value.code == 2 and not (tmp_path / "d").exists()



def test_a_gpu_only_backend_on_the_cpu_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    rc, stdout, err = cli("demo", "--out", out, "--device", "cpu", "--backend", "tensorrt")
    assert rc == 2 and stdout == "", (stdout, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("error: backend 'tensorrt' runs only in the GPU pipeline") and "--backend" in line, line
    assert not out.exists()


@pytest.mark.parametrize(("seed", "said"), [("-1", "expected an integer in 0..4294967295"),
                                            ("4294967296", "expected an integer in 0..4294967295"),
                                            ("1.5", "is not an integer")])
def test_a_seed_numpy_cannot_take_is_refused_naming_the_option(tmp_path: Path, seed: str, said: str) -> None:
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(err):
        main(["demo", "--out", str(tmp_path / "d"), "--seed", seed])
    (line,) = err.getvalue().strip().splitlines()
    assert exit_info.value.code == 2 and f"argument --seed: '{seed}'" in line and said in line, line
    assert not (tmp_path / "d").exists()

@pytest.mark.parametrize("repeats", ["0", "1001", "100000000000"])
def test_repeats_beyond_its_range_are_refused_naming_the_option(tmp_path: Path, repeats: str) -> None:
    """Before: any positive count ran, 1e11 about a second a frame on the CPU, with nothing shown."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(err):
        main(["demo", "--out", str(tmp_path / "d"), "--repeats", repeats])
    (line,) = err.getvalue().strip().splitlines()
    assert exit_info.value.code == 2 and f"argument --repeats: '{repeats}': expected an integer in 1..1000" in line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_a_multi_head_config_is_refused_before_anything_is_written(tmp_path: Path, command: str) -> None:
    out = tmp_path / command
    rc, stdout, err = cli(command, "--out", out, "--config", "openpcdet_nuscenes_multihead", "--device", "cpu")
    assert rc == 2 and stdout == "", (stdout, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("error: config openpcdet_nuscenes_multihead: seeded random weights are made for "
                           "single-head models only") and "--model CKPT" in line
    assert not out.exists()


def test_an_out_that_is_a_file_is_one_error_naming_out_and_the_file_is_kept(tmp_path: Path) -> None:
    """As infer and bench say it (before: ``error: '<file>': File exists`` from the mkdir)."""
    a_file = tmp_path / "five.bin"
    a_file.write_bytes(b"mine")
    rc, stdout, err = cli("demo", "--out", a_file, "--device", "cpu")
    assert (rc, stdout, err) == (2, "", f"error: --out '{a_file}' is an existing file, not a folder\n")
    rc, stdout, err = cli("demo", "--out", a_file / "sub", "--device", "cpu")
    assert (rc, stdout, err) == (2, "", f"error: --out '{a_file / 'sub'}': '{a_file}' is a file, not a folder\n")
    assert sorted(tmp_path.iterdir()) == [a_file] and a_file.read_bytes() == b"mine"


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_an_out_that_is_a_device_is_named_so_as_infer_names_it(tmp_path: Path) -> None:
    """``demo --out /dev/null`` said "an existing file" where infer says "a character device"."""
    rc, stdout, err = cli("demo", "--out", "/dev/null", "--device", "cpu")
    assert (rc, stdout, err) == (2, "", "error: --out '/dev/null' is a character device, not a folder\n")
    (tmp_path / "frame.bin").write_bytes(b"")
    rc, _, err = cli("infer", tmp_path / "frame.bin", "--model", tmp_path / "model", "--out", "/dev/null")
    assert rc == 2 and err.startswith("error: --out '/dev/null' is a character device; "), err


def test_without_matplotlib_a_folder_named_bev_png_is_left_alone(tmp_path: Path) -> None:
    """No matplotlib: the demo draws no bev.png, so a folder of that name in --out is none of its business (it
    was refused, saying the demo writes that file)."""
    import subprocess
    import sys

    shims = tmp_path / "shims"
    (shims / "matplotlib").mkdir(parents=True)
    (shims / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    out = tmp_path / "demo"
    (out / "bev.png").mkdir(parents=True)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shims), str(repo)])}
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "demo", "--out", str(out), "--device", "cpu",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "no PNG: " in done.stdout and (out / "bev.png").is_dir() and (out / "detections.json").is_file()
