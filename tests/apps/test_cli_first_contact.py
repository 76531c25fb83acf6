"""What a new user meets first: messages, defaults and round trips of the command line (CPU path).

Oracles: the files the commands write, the frames' own bytes, and the public API on the same frames.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from out_folder import output_names, output_paths
from pointpillars_trt.apps.cli import main

from test_cli import (  # noqa: F401 (fixtures)
    LOOSE, assert_one_line_error, cli, one_car_labels, tiny_frames, tiny_model, tiny_points,
)

NUSCENES_WHOLE_ROWS = "nuscenes/nusc_dev_k000000_s05.bin"


def test_eval_reads_the_folder_infer_eval_wrote(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    labels = one_car_labels(tmp_path, tiny_frames[1:4])
    out = tmp_path / "out"
    run = cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", out, "--eval", labels, "--device", "cpu",
              "--no-progress", *LOOSE)
    assert run.rc == 0 and (out / "eval.json").is_file(), run
    table = run.out[run.out.index("Car AP@"):run.out.index("wrote ")]
    again = cli("eval", "--pred", out, "--labels", labels)
    assert again.rc == 0, again
    assert table in again.out  # the same table as infer printed
    # JSON predictions beside the report: eval.json is no prediction either
    run = cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", tmp_path / "j", "--eval", labels,
              "--format", "json", "--device", "cpu", "--no-progress", *LOOSE)
    assert run.rc == 0, run
    calib = tiny_frames[1].parent.parent / "calib"
    again = cli("eval", "--pred", tmp_path / "j", "--labels", labels, "--calib", calib)
    assert again.rc == 0 and "Car AP@" in again.out, again


def test_infer_refuses_a_five_value_file_read_as_four(assets: Path, tiny_model: Path, tiny_frames: list[Path]):
    frame = assets / NUSCENES_WHOLE_ROWS
    run = cli("infer", frame, tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 1, run
    errors = [line for line in run.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(frame) in errors[0] and "--point-dim 5" in errors[0], run.err
    assert "1/2 frames" in run.out  # the other frame still went through
    assert cli("infer", frame, "--model", tiny_model, "--device", "cpu", "--point-dim", "5").rc == 0


def test_infer_refuses_a_frame_saved_as_float64(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    frame = tmp_path / "float64.bin"
    np.fromfile(tiny_frames[0], "<f4").astype("<f8").tofile(frame)
    run = cli("infer", frame, tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 1, run
    errors = [line for line in run.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(frame) in errors[0] and "float64" in errors[0], run.err
    assert "1/2 frames" in run.out


# --------------------------------------------------------------------------- which device ran

def test_infer_says_which_device_engine_and_precision_ran(tiny_model: Path, tiny_frames: list[Path]):
    run = cli("infer", *tiny_frames[1:3], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert run.err.splitlines().count("running on CPU, ONNX Runtime, fp32") == 1, run.err


def test_visible_but_unusable_gpu_is_explained(tiny_model: Path, tmp_path: Path):
    from pointpillars_trt.apps.device_notice import device_notice
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.devices import cuda_available
    from pointpillars_trt.errors import CpuFallbackWarning

    reason = cuda_available()
    with warnings.catch_warnings(record=True) as caught:  # device auto falling back to the CPU warns once
        warnings.simplefilter("always")
        detector = PointPillars.from_model_dir(tiny_model, device="auto")
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, CpuFallbackWarning)]
    assert fallbacks == ([] if reason is None else
                         [f"device auto: running on the CPU (about a second a frame; a few milliseconds at most on a "
                          f"GPU): {reason}"])
    with detector:
        assert detector.gpu_unused_reason == reason
        if reason is None:
            assert detector.engine_description.startswith("GPU cuda:0, ")
            assert len(device_notice(detector)) == 1
            return
        assert detector.device == "cpu" and detector.engine_description == "CPU, ONNX Runtime, fp32"
        driver_file = tmp_path / "nvidia0"
        assert device_notice(detector, probes=[driver_file]) == ["running on CPU, ONNX Runtime, fp32"]
        driver_file.write_text("")  # what the NVIDIA driver makes where it sees a GPU
        lines = device_notice(detector, probes=[driver_file])
        assert len(lines) == 2 and lines[1].startswith("note: a GPU is visible, but the GPU path is unusable: ")
        assert reason in lines[1] and "pointpillars-trt[cuda13]" in lines[1]
    with PointPillars.from_model_dir(tiny_model, device="cpu") as detector:  # asked for: nothing to explain
        assert detector.gpu_unused_reason is None
        assert device_notice(detector, probes=[driver_file]) == ["running on CPU, ONNX Runtime, fp32"]


def test_device_cuda_without_a_gpu_says_there_is_none(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """Asked for the GPU on a machine whose driver shows none: the error says so, not "install CuPy"."""
    from pointpillars_trt.runtime.availability import gpu_visible

    if gpu_visible():
        pytest.skip("this machine shows an NVIDIA GPU")
    for argv in (["infer", tiny_frames[0], "--model", tiny_model], ["bench", "--frames", tiny_frames[0].parent],
                 ["demo"]):  # before: bench and demo said it in words of their own, bench without the fix
        run = cli(*argv, "--device", "cuda", "--out", tmp_path / "o")
        assert_one_line_error(run, "device cuda requested, but this machine shows no NVIDIA GPU", "device cpu or auto",
                              "/dev/nvidia0", "/dev/dxg with /usr/lib/wsl/lib/libcuda.so.1")
        assert "CuPy" not in run.err
        assert not (tmp_path / "o").exists()


def test_a_gpu_under_wsl2_is_visible_and_another_vendors_is_not(tmp_path: Path):
    """WSL2 has no /dev/nvidia*: a GPU appears as /dev/dxg (any vendor's does) and NVIDIA's Windows driver
    maps its CUDA library into /usr/lib/wsl/lib. Such a machine's files are made under a test folder, and
    the package's own probes are looked for there."""
    from pointpillars_trt.apps.device_notice import CUDA_EXTRA, gpu_unused_note
    from pointpillars_trt.runtime.availability import GPU_PROBES, gpu_visible

    def here(file: object) -> Path:
        return tmp_path / str(file).lstrip("/")

    probes = [tuple(map(here, probe)) if isinstance(probe, tuple) else here(probe) for probe in GPU_PROBES]
    reason = "CuPy is not installed"
    for file in ("/dev/dxg", "/usr/lib/wsl/lib/libd3d12.so", "/usr/lib/wsl/lib/libdxcore.so"):  # any vendor's GPU
        here(file).parent.mkdir(parents=True, exist_ok=True)
        here(file).write_text("")
    assert not gpu_visible(probes) and gpu_unused_note(reason, probes) is None
    here("/usr/lib/wsl/lib/libcuda.so.1").write_text("")  # an NVIDIA GPU
    assert gpu_visible(probes)
    assert gpu_unused_note(reason, probes) == ("note: a GPU is visible, but the GPU path is unusable: CuPy is "
                                               f"not installed; for the GPU pipeline: {CUDA_EXTRA}")


def test_fp16_model_dir_on_the_cpu_is_said(tmp_path: Path, tiny_frames: list[Path]):
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "fp16", precision="fp16", seed=3).path
    run = cli("infer", tiny_frames[1], "--model", model, "--device", "cpu")
    assert run.rc == 0, run
    assert "running on CPU, ONNX Runtime, fp16" in run.err
    assert "fp16 graphs run no faster than fp32 on the CPU" in run.err and "--precision fp32" in run.err


def test_no_tf32_on_the_cpu_is_said_once_and_changes_nothing(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """--no-tf32 sets the GPU engines' arithmetic: a run on the CPU (asked for, or where auto lands without a usable
    GPU) says once that it changes nothing there, and writes the same bytes as a run without it, which says
    nothing of it."""
    from pointpillars_trt.devices import cuda_available

    note = ("note: --no-tf32 changes nothing on the CPU: TensorFloat-32 is a setting of the GPU engines, and the CPU "
            "path computes fp32 graphs in IEEE float32 already")
    runs = {}
    for device, options in (("cpu", ["--no-tf32"]), ("cpu", []), ("auto", ["--no-tf32"])):
        out = tmp_path / f"{device}{len(options)}"
        run = cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", out, "--device", device, "--no-progress",
                  *options)
        assert run.rc == 0, run
        on_cpu = device == "cpu" or cuda_available() is not None
        assert run.err.splitlines().count(note) == (1 if options and on_cpu else 0), run.err
        runs[device, len(options)] = {p.name: p.read_bytes() for p in output_paths(out)}
    assert runs["cpu", 1] == runs["cpu", 0] and len(runs["cpu", 0]) == 3


def test_an_omp_num_threads_that_is_no_count_is_said_to_need_a_positive_whole_number(
        tiny_model: Path, tiny_frames: list[Path], monkeypatch: pytest.MonkeyPatch):
    """Before: 'is no thread count (1..2)' on two cores, as if 3 were refused too, while a count past the cores is
    taken, capped at them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert run.err.splitlines().count("note: OMP_NUM_THREADS='4,2' is no thread count (a positive whole number): "
                                      "left out, ONNX Runtime picks its own") == 1, run.err
    monkeypatch.setenv("OMP_NUM_THREADS", str(cores + 1))
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert run.err.splitlines().count(f"note: OMP_NUM_THREADS={cores + 1} is more than the {cores} cores where the "
                                      f"detector runs: {cores} threads") == 1, run.err


# --------------------------------------------------------------------------- KITTI camera-FOV policy

FOV_NOTE = "only the points the camera sees are detected on"


def fov_crop_by_hand(frame: Path) -> np.ndarray:
    """The frame's points that project into a 375 x 1242 image, computed here with the homogeneous
    matrices of the frame's calib file (OpenPCDet's get_fov_flag)."""
    rows = {k.strip(): np.array(v.split(), float) for k, _, v in
            (line.partition(":") for line in (frame.parent.parent / "calib" / f"{frame.stem}.txt").read_text().splitlines())
            if v.strip()}
    points = np.fromfile(frame, "<f4").reshape(-1, 4)
    hom = np.hstack([points[:, :3].astype(np.float64), np.ones((len(points), 1))])
    rect = hom @ rows["Tr_velo_to_cam"].reshape(3, 4).T @ rows["R0_rect"].reshape(3, 3).T
    img = np.hstack([rect, np.ones((len(rect), 1))]) @ rows["P2"].reshape(3, 4).T
    u, v = img[:, 0] / rect[:, 2], img[:, 1] / rect[:, 2]
    return points[(rect[:, 2] >= 0) & (u >= 0) & (u < 1242) & (v >= 0) & (v < 375)]


def test_kitti_output_crops_to_the_camera_by_default(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    frame = tiny_frames[2]
    expected = fov_crop_by_hand(frame)
    assert 0 < len(expected) < len(np.fromfile(frame, "<f4")) // 4  # the crop matters on this frame
    # the same frame, cropped by hand, in a KITTI-like folder of its own
    cropped = tmp_path / "cropped" / "training" / "velodyne" / frame.name
    cropped.parent.mkdir(parents=True)
    expected.tofile(cropped)
    (cropped.parent.parent / "calib").mkdir()
    shutil.copy(frame.parent.parent / "calib" / f"{frame.stem}.txt", cropped.parent.parent / "calib")

    base = ("--model", tiny_model, "--device", "cpu", "--no-progress", *LOOSE)
    default = cli("infer", frame, "--format", "kitti", "--out", tmp_path / "a", *base)
    assert default.rc == 0 and default.err.count(FOV_NOTE) == 1, default
    by_hand = cli("infer", cropped, "--format", "kitti", "--out", tmp_path / "b", "--no-fov-only", *base)
    assert by_hand.rc == 0 and FOV_NOTE not in by_hand.err, by_hand
    name = f"{frame.stem}.txt"
    assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()

    def json_points(*flags: str) -> tuple[int, str]:
        out = tmp_path / ("j" + "".join(flags))
        run = cli("infer", frame, "--out", out, *flags, *base)
        assert run.rc == 0, run
        return json.loads((out / f"{frame.stem}.json").read_text())["num_points"], run.err

    count, err = json_points()
    assert count == 2000 and FOV_NOTE not in err  # JSON: full scans unless asked
    assert json_points("--fov-only")[0] == len(expected)
    full = cli("infer", frame, "--format", "kitti", "--out", tmp_path / "c", "--no-fov-only", *base)
    assert full.rc == 0 and FOV_NOTE not in full.err, full
    assert f"note: KITTI output: {FOV_NOTE}" in default.err


def test_the_default_crop_is_said_with_its_reason_kitti_output_or_eval() -> None:
    """The note names what the run does with the cropped frames' detections: --eval without --out (whose format is
    then kitti) was said to be "KITTI output", which it never writes."""
    import argparse

    from pointpillars_trt.apps.frame_prep import frame_preparer

    crop = "(OpenPCDet's FOV_POINTS_ONLY, as its KITTI evaluation does); --no-fov-only keeps the full scans"
    for fmt, out, evaluating, trained_fov_only, said in (
            ("kitti", "o", None, None, f"note: KITTI output: {FOV_NOTE}, for the detections written {crop}"),
            ("kitti", None, "labels", None, f"note: --eval: {FOV_NOTE}, for the detections evaluated {crop}"),
            ("kitti", "o", "labels", None,
             f"note: KITTI output and --eval: {FOV_NOTE}, for the detections written and evaluated {crop}"),
            ("json", "o", "labels", None, f"note: --eval: {FOV_NOTE}, for the detections written and evaluated {crop}"),
            ("json", None, "labels", False, "note: --eval: the full scans are detected on, not only the points the "
             "camera sees, for the detections evaluated: the model was trained on full scans (its dataset config's "
             "FOV_POINTS_ONLY: False); --fov-only crops them"),
            ("json", "o", None, None, None)):
        notes: list[str] = []
        args = argparse.Namespace(fov_only=None, eval=evaluating, out=out, calib=None, image_shape=None)
        frame_preparer(args, fmt, notes.append, trained_fov_only)
        assert notes == ([said] if said else []), notes


def test_eval_without_out_says_its_crop_of_the_evaluated_detections_not_kitti_output(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    labels = one_car_labels(tmp_path, tiny_frames[1:2])
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress", "--eval", labels)
    assert run.rc == 0, run
    assert f"note: --eval: {FOV_NOTE}, for the detections evaluated (" in run.err and "KITTI output" not in run.err, \
        run.err


def png_header(width: int, height: int) -> bytes:
    """The first 24 bytes of a PNG of that size: all of it the image size is read from."""
    return b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR" + width.to_bytes(4, "big") + height.to_bytes(4, "big")


def test_an_assumed_image_size_is_one_note_a_run_and_a_given_size_says_nothing(tiny_model: Path,
                                                                               tiny_frames: list[Path], tmp_path: Path):
    """Without --image-shape or an image_2 PNG, the crop and the KITTI 2D boxes assume a 1242 x 375 image:
    one note a run names what assumed it and how to give the size; a given size, or a PNG, is said nothing of."""
    root = tmp_path / "training"
    (root / "velodyne").mkdir(parents=True)
    shutil.copytree(tiny_frames[1].parent.parent / "calib", root / "calib")
    frames = [Path(shutil.copy(frame, root / "velodyne")) for frame in tiny_frames[1:4]]
    base = ("--model", tiny_model, "--device", "cpu", "--no-progress", *LOOSE)

    def notes(*flags: object) -> list[str]:
        run = cli("infer", *frames, *base, *flags)
        assert run.rc == 0, run
        return [line for line in run.err.splitlines() if "--image-shape" in line]

    start = (f"note: '{frames[0]}': no camera image '{root / 'image_2' / (frames[0].stem + '.png')}' to take its "
             "size from, so KITTI's usual 1242 x 375 image is assumed for ")
    end = " (and for every frame without one); if the camera's image is another size, pass --image-shape H,W (e.g. 370,1224)"
    assert notes("--format", "kitti", "--out", tmp_path / "k") == [
        start + "its camera-view crop and its KITTI 2D boxes" + end]
    assert notes("--fov-only") == [start + "its camera-view crop" + end]
    assert notes("--format", "kitti", "--no-fov-only", "--out", tmp_path / "n") == [start + "its KITTI 2D boxes" + end]
    assert notes() == []  # JSON of full scans: no camera image used
    assert notes("--format", "kitti", "--out", tmp_path / "g", "--image-shape", "375,1242") == []
    assert [p.read_bytes() for p in output_paths(tmp_path / "g")] == \
        [p.read_bytes() for p in output_paths(tmp_path / "k")]  # the size assumed is the one given
    (root / "image_2").mkdir()
    for frame in frames:
        (root / "image_2" / f"{frame.stem}.png").write_bytes(png_header(1224, 370))
    assert notes("--format", "kitti", "--out", tmp_path / "p") == []
    assert notes("--format", "kitti", "--out", tmp_path / "s", "--image-shape", "370,1224") == []
    assert [p.read_bytes() for p in output_paths(tmp_path / "p")] == \
        [p.read_bytes() for p in output_paths(tmp_path / "s")]  # the PNG's size is the one used


def test_the_assumed_image_note_names_the_image_relative_as_the_frame_is_given(tiny_model: Path,
                                                                               tiny_frames: list[Path],
                                                                               tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """A frame given by a relative path had its missing camera image named by an absolute one."""
    root = tmp_path / "kitti" / "training"
    (root / "velodyne").mkdir(parents=True)
    shutil.copytree(tiny_frames[1].parent.parent / "calib", root / "calib")
    shutil.copy(tiny_frames[1], root / "velodyne")
    monkeypatch.chdir(tmp_path / "kitti")
    run = cli("infer", f"training/velodyne/{tiny_frames[1].name}", "--model", tiny_model, "--device", "cpu",
              "--no-progress", "--fov-only", *LOOSE)
    assert run.rc == 0, run
    name, stem = tiny_frames[1].name, tiny_frames[1].stem
    assert f"note: 'training/velodyne/{name}': no camera image 'training/image_2/{stem}.png' to take its size from" \
        in run.err, run.err
    monkeypatch.chdir(root / "velodyne")
    run = cli("infer", tiny_frames[1].name, "--model", tiny_model, "--device", "cpu", "--no-progress", "--fov-only",
              *LOOSE)
    assert f"note: '{name}': no camera image '../image_2/{stem}.png' to take its size from" in run.err, run.err


def test_a_camera_image_that_does_not_hold_the_principal_point_fails_its_frame_naming_both_files(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """An image_2 PNG turned (370 wide, 1224 high) or a thumbnail (122 x 37) is no image of the camera whose
    principal point (P2: x 610, y 173) it does not hold. Before: its size was taken without a word, for the camera
    crop and the KITTI 2D boxes (a 1 x 1 placeholder left no point of a KITTI scan, warned of as a calib file facing
    backwards). Now its frame fails, naming the PNG and the calib file, and the other frames run; --image-shape,
    which stands before the PNG, runs it."""
    root = tmp_path / "training"
    (root / "velodyne").mkdir(parents=True)
    (root / "image_2").mkdir()
    shutil.copytree(tiny_frames[1].parent.parent / "calib", root / "calib")
    frames = [Path(shutil.copy(frame, root / "velodyne")) for frame in tiny_frames[1:4]]
    sizes = {frames[0]: (1224, 370), frames[1]: (370, 1224), frames[2]: (122, 37)}
    for frame, (width, height) in sizes.items():
        (root / "image_2" / f"{frame.stem}.png").write_bytes(png_header(width, height))
    for flags in (["--fov-only", "--format", "json"], ["--no-fov-only", "--format", "kitti"]):
        out = tmp_path / flags[0]
        run = cli("infer", *frames, "--model", tiny_model, "--device", "cpu", "--no-progress", "--out", out, *flags,
                  *LOOSE)
        assert "camera-FOV crop" not in run.err, run.err
        assert run.rc == 1 and [line for line in run.err.splitlines() if line.startswith("error:")] == [
            f"error: '{frame}': image file '{root / 'image_2' / (frame.stem + '.png')}' is an image {width} wide and "
            f"{height} high, which does not hold the camera's principal point in "
            f"'{root / 'calib' / (frame.stem + '.txt')}' (P2: x 610, y 173): it is not this camera's image (another "
            "camera's, or a copy resized or turned); put the camera's own images there, or give their size with "
            "--image-shape H,W" for frame, (width, height) in list(sizes.items())[1:]], run.err
        assert output_names(out) == [frames[0].stem + flags[2].replace("json", ".json").replace("kitti", ".txt")]
    run = cli("infer", *frames, "--model", tiny_model, "--device", "cpu", "--no-progress", "--out", tmp_path / "given",
              "--format", "kitti", "--image-shape", "370,1224", *LOOSE)
    assert run.rc == 0 and len(output_names(tmp_path / "given")) == 3, run


def test_frames_without_calib_are_refused_before_any_frame_runs(tiny_model: Path, tiny_frames: list[Path],
                                                                 tmp_path: Path):
    """--fov-only, --format kitti and --eval read each frame's KITTI calib file: frames none of whose folders
    has calib/ beside it are one error before any frame runs (every frame failed alike); where some folder
    has one, the frames of the others fail one by one and the rest run."""
    frame = tmp_path / "loose" / "000009.bin"
    frame.parent.mkdir()
    np.zeros((10, 4), np.float32).tofile(frame)
    for extra in (["--fov-only"], ["--format", "kitti", "--out", str(tmp_path / "k")]):
        run = cli("infer", frame, "--model", tiny_model, "--device", "cpu", *extra)
        assert_one_line_error(run, "no calibration folder", "000009", "--calib DIR")
    assert not (tmp_path / "k").exists()
    run = cli("infer", frame, tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--format", "kitti",
              "--out", tmp_path / "k", "--no-progress")
    assert run.rc == 1 and "no calibration folder for frame" in run.err and "1/2 frames" in run.out, run
    assert output_names(tmp_path / "k") == ["000001.txt"]
    # a --calib folder that holds none of the frames' files: one error, before any frame runs
    empty_calib = tmp_path / "calib"
    empty_calib.mkdir()
    (empty_calib / "000999.txt").write_text("P0: 1\n")
    run = cli("infer", frame, tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--format", "kitti",
              "--out", tmp_path / "c", "--calib", empty_calib)
    assert_one_line_error(run, f"--calib '{empty_calib}': no calib file for any of the 2 frames", "000009.txt")
    assert not (tmp_path / "c").exists()


def test_a_file_of_zeros_is_warned_about_as_a_failed_copy(tiny_model: Path, tmp_path: Path):
    """A .bin of zeros (a copy that failed to fill its blocks) has points, so no "holds no points" warning;
    all of them make one pillar at the origin, which no scan does."""
    frames = tmp_path / "zeros"
    frames.mkdir()
    for name in ("000001.bin", "000002.bin"):
        np.zeros((1000, 4), np.float32).tofile(frames / name)
    run = cli("infer", frames, "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert "warning: '" + str(frames / "000001.bin") + "': all its 1000 points fall in one pillar: a file of zeros" in run.err
    assert ("warning: 2 frames had all their points in one pillar in all (the first named above; then "
            f"'{frames / '000002.bin'}')") in run.err, run.err


def test_a_file_given_by_name_that_is_no_point_file_is_refused_before_the_model_loads(tiny_model: Path,
                                                                                      tiny_frames: list[Path],
                                                                                      tmp_path: Path):
    """As --help says: a path that gives no frame is an error, and when none gives one infer stops before the
    model loads (a .txt given by name used to be read as a frame, and fail, once the model was up)."""
    notes = tmp_path / "000001.txt"
    notes.write_text("not points\n")
    bare = tmp_path / "000002"
    bare.write_bytes(bytes(32))
    assert_one_line_error(cli("infer", notes, "--model", tmp_path / "absent.pth"),
                          f"{str(notes)!r} is not a point file: it has extension '.txt'; supported: .bin, .npy, .pcd")
    run = cli("infer", bare, tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 1 and f"{str(bare)!r} is not a point file: it has no extension" in run.err, run
    assert "1/1 frames" in run.out, run


def test_a_damaged_part_names_its_line_and_the_fix(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    out = tmp_path / "rows"
    assert cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--device", "cpu", "--format", "jsonl",
               "--out", out, "--no-progress").rc == 0
    part = out / "detections-00000.jsonl"
    part.write_text(part.read_text() + '{"source": "cut sh\n')
    run = cli("infer", *tiny_frames[1:5], "--model", tiny_model, "--device", "cpu", "--format", "jsonl", "--out", out,
              "--skip-existing")
    assert_one_line_error(run, f"cannot read {str(part)!r}: line 4:", "move that part away, and this run redoes its frames")


#: Rows no infer run writes, and what the refusal says of each: the first two also as Parquet tables.
FOREIGN_ROWS = [([{"x": 1}], "no 'source' string naming its point file"),
                ([{"source": "a.bin", "error": True}], "its 'error' is neither a string nor null"),
                ([[1, 2]], "not a JSON object"),
                ([{"source": "a.bin", "path": 5}], "its 'path' is neither a string nor null")]


@pytest.mark.parametrize("fmt, rows, problem", [("jsonl", *case) for case in FOREIGN_ROWS] +
                         [("parquet", *case) for case in FOREIGN_ROWS[:2]])
def test_a_part_of_rows_infer_did_not_write_names_the_row_and_the_problem(tiny_model: Path, tiny_frames: list[Path],
                                                                         tmp_path: Path, fmt: str, rows: list[object],
                                                                         problem: str):
    """A part edited by hand or of another tool's rows was refused in Python's words ("'list' object has no attribute
    'get'", "'source'"), or read with a row's 'path' of 5 as the frame '5' (its frame run again, a second row). Each
    is now one error line naming the part, the row and what is wrong with it; infer's own rows read as before."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    base = ("--model", tiny_model, "--device", "cpu", "--format", fmt, "--no-progress")
    part = tmp_path / "rows" / f"detections-00000.{fmt}"
    part.parent.mkdir()
    if fmt == "jsonl":
        part.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), part)
    run = cli("infer", tiny_frames[1], *base, "--out", part.parent, "--skip-existing")
    assert_one_line_error(run, f"cannot read {str(part)!r}: {'line' if fmt == 'jsonl' else 'row'} 1: not a row infer "
                               f"writes ({problem}) (move that part away")
    assert cli("infer", tiny_frames[1], *base, "--out", tmp_path / "good").rc == 0
    run = cli("infer", tiny_frames[1], *base, "--out", tmp_path / "good", "--skip-existing")
    assert run.rc == 0 and "skipping 1 frame whose outputs" in run.err, run
    assert run.out.startswith("0/0 frames to run (1 skipped: its outputs were there)"), run

# --------------------------------------------------------------------------- rough edges

@pytest.mark.parametrize("argv", [
    ["build", "--checkpoint", "x.pth", "--out", "m", "--precision", "fp64"],
    ["infer", "x.bin", "--batch-size", "9"],
    ["eval", "--pred", "p", "--labels", "l", "--bogus"],
    ["bench", "--iterations", "0"],
    ["bench", "--iterations", "1000000000"],  # a run that would never end
    ["demo", "--device", "gpu"],
    ["serve", "--model", "m", "--repository", "r", "--instances", "two"],
    [],
])
def test_option_value_errors_are_one_line(argv: list[str]):
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(err):
        main(argv)
    assert exit_info.value.code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pointpillars-trt") and "usage:" not in lines[0], lines
    assert "--help" in lines[0]


@pytest.mark.parametrize("command", ["infer", "demo", "build"])
def test_a_built_in_config_named_as_its_file_is_refused_with_its_name(command: str, tiny_model: Path,
                                                                       tiny_frames: list[Path], tmp_path: Path):
    """The built-in configs are YAML files of the package (pointpillars_trt/configs/NAME.yaml), so their file name is
    a natural first try. Before: 'openpcdet_kitti_3class.yaml: config file not found', which named no fix."""
    argv = {"infer": ["infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu"],
            "demo": ["demo", "--out", tmp_path / "demo", "--device", "cpu"],
            "build": ["build", "--checkpoint", tmp_path / "x.pth", "--out", tmp_path / "m"]}[command]
    run = cli(*argv, "--config", "openpcdet_kitti_3class.yaml")
    assert_one_line_error(run, "'openpcdet_kitti_3class.yaml': config file not found; the built-in config of that "
                               "name is given without .yaml: 'openpcdet_kitti_3class'")
    assert not (tmp_path / "demo").exists() and not (tmp_path / "m").exists()


def test_a_model_given_among_the_frames_is_named_with_the_option_it_goes_to(tiny_model: Path, tiny_frames: list[Path],
                                                                            tmp_path: Path):
    """OpenPCDet's demo.py takes --ckpt and --data_path; here the model is --model and the frames are PATHs. Before: a
    model dir among them was 'a folder that holds no point files', a checkpoint 'not a point file: it has extension
    .pth', and without --model neither was named."""
    checkpoint = tmp_path / "checkpoint_epoch_80.pth"
    checkpoint.write_bytes(b"PK")  # its name makes it a checkpoint here, before anything reads it
    run = cli("infer", tiny_model, "--model", tiny_model, "--device", "cpu")
    assert_one_line_error(run, f"{str(tiny_model)!r} is a model dir, not a folder of point files: give it as --model")
    run = cli("infer", checkpoint, "--model", tiny_model, "--device", "cpu")
    assert_one_line_error(run, f"{str(checkpoint)!r} is a checkpoint, not a point file: give it as --model")
    for model, kind in ((checkpoint, "a checkpoint"), (tiny_model, "a model dir")):
        run = cli("infer", tiny_frames[1], model, "--device", "cpu")
        assert_one_line_error(run, f"infer needs --model: a model dir (from build) or a .pth checkpoint; {str(model)!r} "
                                   f"among the PATHs is {kind}: give it as --model {str(model)!r}")


def test_eval_names_a_model_dir_given_as_predictions_and_a_folder_of_no_label_file(tiny_model: Path,
                                                                                 tiny_frames: list[Path],
                                                                                 tmp_path: Path):
    """Before: a model dir's model.json was read as the JSON record of a frame 'model', whose label file was then
    missing; a folder of no label file (the velodyne folder) named its first frame's label file missing."""
    labels = one_car_labels(tmp_path, tiny_frames[1:3])
    run = cli("eval", "--pred", tiny_model, "--labels", labels)
    assert_one_line_error(run, f"prediction folder {str(tiny_model)!r} is a model dir (the folder build writes), not "
                               "predictions")
    velodyne = tiny_frames[1].parent
    run = cli("eval", "--pred", labels, "--labels", velodyne)
    assert_one_line_error(run, f"--labels {str(velodyne)!r} holds no label files (<frame id>.txt): give KITTI's "
                               "label_2 folder")


def test_infer_eval_of_a_folder_of_no_label_file_says_so_as_eval_does(tiny_model: Path, tiny_frames: list[Path]):
    """Before: the velodyne folder given as --eval named the first frame's label file missing, where eval --labels
    of it said the folder holds no label files."""
    velodyne = tiny_frames[1].parent
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--eval", velodyne)
    assert_one_line_error(run, f"--eval {str(velodyne)!r} holds no label files (<frame id>.txt): give KITTI's "
                               "label_2 folder")


def test_infer_names_a_file_given_as_its_label_or_calib_folder(tiny_model: Path, tiny_frames: list[Path],
                                                               tmp_path: Path):
    """Before: '--eval X: label folder does not exist or is not a folder' of a file that plainly exists."""
    labels = one_car_labels(tmp_path, tiny_frames[1:2])
    label_file = next(labels.iterdir())
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--eval", label_file)
    assert_one_line_error(run, f"--eval {str(label_file)!r} is a file, not a folder: --eval names the folder of label "
                               "files (KITTI's label_2: <frame id>.txt)")
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--eval", labels,
              "--calib", label_file)
    assert_one_line_error(run, f"--calib {str(label_file)!r} is a file, not a folder: --calib names the folder of "
                               "calib files (KITTI's calib: <frame id>.txt)")


@pytest.mark.parametrize("name, fmt, written", [
    ("preds.jsonl", "jsonl", "part files of rows (detections-*.jsonl)"),
    ("preds.parquet", "parquet", "part files of rows (detections-*.parquet)"),
    ("preds.json", "json", "a .json file a frame"),
    ("label_2.TXT", "kitti", "a label file a frame (.txt)"),
])
def test_an_out_named_like_a_file_of_outputs_is_refused_naming_the_folder_and_format(
        name: str, fmt: str, written: str, tiny_model: Path, tiny_frames: list[Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch):
    """Before: --out preds.jsonl made a folder preds.jsonl holding a JSON file a frame (the default format), where a
    file of rows was meant. A folder of such a name that is there already is the user's: it is written into."""
    monkeypatch.chdir(tmp_path)
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--out", name)
    stem = name.rsplit(".", 1)[0]
    assert_one_line_error(run, f"--out {name!r} is a file name, but --out names the folder (created if missing) that the "
                               f"outputs go into; --format {fmt} writes {written} there: give a folder, e.g. --out "
                               f"{stem!r} --format {fmt}")
    assert not (tmp_path / name).exists()
    (tmp_path / "made.json").mkdir()
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--out", "made.json", "--no-progress")
    assert run.rc == 0 and output_names(tmp_path / "made.json") == [f"{tiny_frames[1].stem}.json"], run


def small_file_limit() -> None:
    """The child's files may grow to 1 KiB: a write past it fails (EFBIG, Python ignores SIGXFSZ), as on a full disk
    a write fails with no file name of its own."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


def test_a_write_that_fails_names_its_file(tiny_frames: list[Path], repo_root: Path, tmp_path: Path):
    """Before: 'error: File too large' (or 'No space left on device') alone, the evaluation printed and no file named."""
    labels = one_car_labels(tmp_path, tiny_frames[1:3])
    pred = tmp_path / "pred"
    pred.mkdir()
    for frame in tiny_frames[1:3]:
        (pred / f"{frame.stem}.txt").write_text(
            "Car 0.00 0 -1.58 587.0 173.3 614.1 200.1 1.65 1.67 3.64 -0.65 1.71 4.6 -1.59 0.9\n")
    ap = tmp_path / "ap.json"
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "eval", "--pred", str(pred), "--labels", str(labels),
                           "--json", str(ap)], capture_output=True, text=True, timeout=120, cwd=repo_root,
                          env={**os.environ, "PYTHONPATH": str(repo_root)}, preexec_fn=small_file_limit)
    assert "Car AP@" in done.stdout and not ap.exists(), done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert (done.returncode, errors) == (2, [f"error: {str(ap)!r}: {os.strerror(errno.EFBIG)}"]), done


def help_text(*argv: str) -> str:
    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        main([*argv, "--help"])
    return out.getvalue()


def test_help_says_what_each_command_does():
    top = help_text()
    assert "`" not in top and "serve" in top.split("options:")[0]
    for command in ("build", "infer", "eval", "bench", "serve", "demo"):
        paragraphs = help_text(command).split("\n\n")
        assert len(paragraphs) > 2 and not paragraphs[1].startswith(("options:", "positional")), command
        assert len(paragraphs[1]) > 30, (command, paragraphs[1])


#: A child that gets a real SIGINT just as the command line's parser imports the eval command (as Ctrl-C
#: pressed in the first second of a run lands), then runs ``main(["--help"])``.
CTRL_C_WHILE_THE_PARSER_IMPORTS = """
import os, signal, sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "pointpillars_trt.apps.eval.cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None
from pointpillars_trt.apps.cli import main
sys.meta_path.insert(0, CtrlC())
sys.exit(main(["--help"]))
"""


def test_ctrl_c_while_the_command_line_is_built_is_one_line(repo_root: Path):
    """Before: the parser was built outside main's handling, so Ctrl-C in a run's first second printed a traceback."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_THE_PARSER_IMPORTS], capture_output=True, text=True,
                          timeout=120, cwd=repo_root)
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", ""), done


def test_the_command_line_parser_imports_no_onnx(repo_root: Path):
    """Every command, ``--help`` included, built bench's parser, whose module imported the ONNX exporter: ~0.9 s of
    ``import onnx`` (ml_dtypes) on each start, before any work. Only the commands that export load it now."""
    code = "import sys; from pointpillars_trt.apps.cli import build_parser; build_parser(); print('onnx' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert (done.returncode, done.stdout) == (0, "False\n"), done


@pytest.mark.parametrize("argv", [
    ["demo", "--out", ""],
    ["bench", "--device", "cpu", "--out", ""],
    ["bench", "--device", "cpu", "--frames", ""],
    ["build", "--checkpoint", "", "--out", "m"],
    ["build", "--checkpoint", "x.pth", "--out", ""],
    ["eval", "--pred", "", "--labels", "labels"],
    ["eval", "--pred", "pred", "--labels", "", "--ids", ""],
    ["infer", "x.bin", "--model", ""],
    ["serve", "--model", "x.pth", "--repository", "", "--repository-only"],
])
def test_an_empty_path_is_refused_while_parsing_not_taken_as_the_current_folder(argv: list[str], tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch):
    """``--out "$OUT"`` with $OUT unset. Before: ``Path("")`` is '.', so demo, bench and serve wrote into the current
    folder (rc 0), build refused "model dir ." or read '.' as its checkpoint, eval read '.' as its predictions."""
    if argv[0] == "serve":
        pytest.importorskip("pointpillars_trt.apps.serve.cli")
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    assert exit_info.value.code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: pointpillars-trt {argv[0]}: argument --"), lines
    assert "'': an empty name (an unset variable?)" in lines[0], lines
    assert list(tmp_path.iterdir()) == []


#: The same with the script's entry (``pointpillars-trt`` and ``python -m pointpillars_trt``): the SIGINT lands
#: as NumPy starts to load, the first of the command line's imports.
CTRL_C_WHILE_THE_ENTRY_IMPORTS = """
import os, signal, sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlC())
from pointpillars_trt.apps.console import main
sys.exit(main())
"""


def test_ctrl_c_while_the_script_s_entry_imports_the_command_line_is_one_line(repo_root: Path):
    """Before: the script's entry was apps.cli:main, so Ctrl-C while the package and its commands imported
    (a quarter of a second) printed a traceback; the entry now imports nothing heavy before its handling."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_THE_ENTRY_IMPORTS], capture_output=True, text=True,
                          timeout=120, cwd=repo_root)
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", ""), done
    light = subprocess.run([sys.executable, "-c", "import sys, pointpillars_trt.apps.console; "
                            "print(sorted({'numpy', 'yaml', 'onnxruntime'} & set(sys.modules)))"],
                           capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert light.stdout == "[]\n", light


def test_missing_path_and_out_file_say_so(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    run = cli("infer", tmp_path / "nope/", "--model", tiny_model, "--device", "cpu")
    assert_one_line_error(run, "no such file or folder")  # before the model loads: nothing ran
    assert "extension" not in run.err and "point file" not in run.err, run
    a_file = tmp_path / "api.py"
    a_file.write_text("print('mine')\n")
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", tiny_model, "--out", a_file),
                          "--out", "is an existing file", "folder")
    assert a_file.read_text() == "print('mine')\n"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", tiny_model, "--out", fifo),
                          f"--out {str(fifo)!r} is a FIFO (named pipe); --out names a folder")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", loop),
                          f"--model {str(loop)!r}: a symbolic link that leads to no file (a loop, or its target")


def infer_in_a_child(frames: list[Path], model: Path, repo_root: Path,
                     stderr: int) -> subprocess.CompletedProcess[str]:
    """``pointpillars-trt infer FRAMES --device cpu`` as a process of its own, its stderr to ``stderr`` (a
    pipe, or a terminal's file descriptor)."""
    return subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", *map(str, frames), "--model", str(model),
                           "--device", "cpu"], stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=120,
                          cwd=repo_root)


def test_infer_draws_its_progress_bar_on_a_terminal_only(tiny_model: Path, tiny_frames: list[Path], repo_root: Path):
    """stderr to a pipe (as to a log file or CI's log): no bar, whose carriage-return redraws would pile up
    there, and the summary as ever; stderr a terminal: the bar."""
    import fcntl
    import pty
    import struct
    import termios

    done = infer_in_a_child(tiny_frames[1:4], tiny_model, repo_root, subprocess.PIPE)
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("3/3 frames, "), done
    assert done.stderr.startswith("running on CPU, ONNX Runtime, fp32\n"), done.stderr
    assert "\r" not in done.stderr and "%|" not in done.stderr and "frame/s]" not in done.stderr, done.stderr
    terminal, child_side = pty.openpty()
    fcntl.ioctl(child_side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm draws nothing in 0 columns
    with os.fdopen(terminal, "rb", buffering=0) as screen:
        try:
            done = infer_in_a_child(tiny_frames[1:4], tiny_model, repo_root, child_side)
        finally:
            os.close(child_side)
        shown = b""
        with contextlib.suppress(OSError):  # EIO: the terminal is read out and its other side closed
            while chunk := screen.read(4096):
                shown += chunk
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("3/3 frames, "), done
    assert b"100%|" in shown and b"| 3/3 [" in shown, shown


def test_bench_on_the_cpu_runs_fewer_frames_and_draws_no_bar_into_a_pipe(tiny_frames: list[Path], tmp_path: Path):
    import yaml
    from tiny import tiny_config

    frames = tmp_path / "frames"
    frames.mkdir()
    shutil.copy(tiny_frames[1], frames)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config().to_dict()))
    run = cli("bench", "--device", "cpu", "--config", config, "--frames", frames, "--no-baselines",
              "--page-locked", "--out", tmp_path / "b")
    assert run.rc == 0, run
    # a note as every command's (it said "bench:"); --precisions left at its default (fp32, tf32, fp16) is not said:
    # the running line and the table name the precision timed
    assert "note: --page-locked, --no-baselines apply to GPU runs; the CPU run times the latency of the model's " \
           "fp32 graphs only" in run.err and "bench:" not in run.err and "--precisions" not in run.err, run.err
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["iterations"] == 10
    assert "running on CPU, ONNX Runtime, fp32: 10 timed frames per frame set" in run.err
    assert "bench (CPU)" not in run.err and "\r" not in run.err, run.err  # the bar is for a terminal (infer's test)


def test_bench_reads_as_many_frames_as_it_times_and_names_a_file_or_missing_folder(tiny_frames: list[Path],
                                                                                    tmp_path: Path):
    """Before: every .bin of the folder was read into memory (KITTI's 7,481 full scans: ~14 GB) to time 10 or 200
    of them, and a file or a missing folder given to --frames was "no .bin files to benchmark on"."""
    import yaml
    from tiny import tiny_config

    frames = tmp_path / "frames"
    frames.mkdir()
    for frame in tiny_frames[1:4]:
        shutil.copy(frame, frames)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config().to_dict()))
    common = ("bench", "--device", "cpu", "--config", config, "--out", tmp_path / "b")
    run = cli(*common, "--frames", frames, "--iterations", "2")
    assert run.rc == 0, run
    assert f"note: --frames '{frames}': reading the first 2 of its 3 point files, as many as --iterations 2 times" \
        in run.err.splitlines(), run.err
    timed = json.loads((tmp_path / "b" / "bench.json").read_text())["runs"]
    assert [r["frames"] for r in timed] == ["frames (first 2 of 3 frames)"]
    first_two = [np.fromfile(f, np.float32).size // 4 for f in sorted(frames.iterdir())[:2]]
    assert timed[0]["avg_points"] == pytest.approx(np.mean(first_two))
    assert_one_line_error(cli(*common, "--frames", frames / tiny_frames[1].name),
                          "--frames", "is a file; --frames names a folder of point files")
    assert_one_line_error(cli(*common, "--frames", tmp_path / "nope"), "--frames", "no such folder")


@pytest.mark.cuda
def test_engine_description_on_the_gpu(tiny_frames: list[Path], tmp_path: Path):
    from tiny import tiny_model_dir

    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.devices import cuda_available
    from pointpillars_trt.runtime import cudnn_unavailable_reason, onnxruntime_cuda_unavailable_reason

    reason = cuda_available()
    if reason is not None:
        pytest.skip(f"GPU pipeline tests need CUDA: {reason}")
    fp16 = tiny_model_dir(tmp_path / "fp16", precision="fp16", seed=3).path
    fp32 = tiny_model_dir(tmp_path / "fp32", seed=3).path
    cases = []
    if cudnn_unavailable_reason() is None:
        cases += [(fp16, "cudnn", True, "GPU cuda:0, cuDNN engine, fp16"),
                  (fp32, "cudnn", False, "GPU cuda:0, cuDNN engine, IEEE fp32")]
    if onnxruntime_cuda_unavailable_reason() is None:
        cases += [(fp32, "onnxruntime", True, "GPU cuda:0, ONNX Runtime (CUDA), fp32 with TF32")]
    if not cases:
        pytest.skip("no GPU engine backend installed")
    for model, backend, tf32, text in cases:
        with PointPillars.from_model_dir(model, device="cuda", backend=backend, tf32=tf32) as detector:
            assert detector.engine_description == text and detector.gpu_unused_reason is None
    run = cli("infer", tiny_frames[1], "--model", cases[0][0], "--device", "cuda", "--backend", cases[0][1],
              "--no-progress")
    assert run.rc == 0 and f"running on {cases[0][3]}" in run.err.splitlines(), run


def test_keep_out_of_view_with_eval_is_taken_whatever_the_format(tiny_model: Path, tiny_frames: list[Path],
                                                                  tmp_path: Path):
    """--eval writes KITTI lines for the evaluation whatever --format is: --keep-out-of-view applies there."""
    labels = tmp_path / "label_2"
    labels.mkdir()
    (labels / f"{tiny_frames[1].stem}.txt").write_text(
        "Car 0.00 0 -1.58 587.0 173.3 614.1 200.1 1.65 1.67 3.64 -0.65 1.71 4.6 -1.59\n")
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--out", tmp_path / "out",
              "--format", "json", "--eval", labels, "--keep-out-of-view", "--no-progress", *LOOSE)
    assert run.rc == 0 and "Car AP@" in run.out, run


@pytest.mark.parametrize("extra, expected", [
    (["--skip-existing"], "--skip-existing needs --out DIR"),
    (["--format", "kitti"], "--format kitti needs --out DIR: its files (one a frame) are written there"),
    (["--format", "json"], "--format json needs --out DIR: its files (one a frame) are written there"),
    (["--format", "jsonl", "--eval", "LABELS"], "--format jsonl needs --out DIR: its part files are written there"),
    (["--keep-out-of-view", "--out", "OUT"], "--keep-out-of-view applies to --format kitti"),
    (["--keep-out-of-view", "--out", "OUT", "--format", "jsonl"], "--format jsonl keeps every box"),
    (["--retry-failed", "--out", "OUT", "--format", "jsonl"], "--retry-failed reruns the failed frames that "
                                                              "--skip-existing would skip: add --skip-existing"),
    (["--retry-failed", "--skip-existing", "--out", "OUT"], "--format json writes no file for a failed frame, so "
                                                            "--skip-existing reruns it: drop --retry-failed"),
])
def test_output_options_that_would_do_nothing_are_refused(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path,
                                                          extra: list[str], expected: str):
    out = tmp_path / "out"
    run = cli("infer", tiny_frames[0], "--model", tiny_model, "--device", "cpu",
              *[{"OUT": str(out), "LABELS": str(tmp_path)}.get(value, value) for value in extra])
    assert_one_line_error(run, expected)
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_eval_of_a_row_format_refuses_two_frames_of_one_id(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path,
                                                           fmt: str):
    """The evaluation makes a KITTI file a frame id whatever the format: before, two frames of one id in a row
    format were both evaluated from the one file the second wrote (one frame's lines scored twice)."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    twin = tmp_path / "seq2" / tiny_frames[1].name
    twin.parent.mkdir()
    twin.write_bytes(tiny_frames[1].read_bytes())
    labels = one_car_labels(tmp_path, tiny_frames[1:2])
    run = cli("infer", tiny_frames[1], twin, "--model", tiny_model, "--device", "cpu", "--out", tmp_path / "out",
              "--format", fmt, "--eval", labels, "--no-progress")
    assert_one_line_error(run, f"would write the same output file '{tiny_frames[1].stem}.txt'")
    assert not (tmp_path / "out").exists()


def test_eval_with_skip_existing_in_kitti_evaluates_the_skipped_frames_too(tiny_model: Path, tiny_frames: list[Path],
                                                                           tmp_path: Path):
    """With KITTI label files in --out, a resumed run evaluates every frame, the skipped ones read from their
    files, as one run of them all does (the record formats: test_infer_eval_resume.py)."""
    labels = one_car_labels(tmp_path, tiny_frames[1:4])
    out, whole = tmp_path / "out", tmp_path / "whole"

    def run(frames: list[Path], folder: Path, *extra: str):
        return cli("infer", *frames, "--model", tiny_model, "--device", "cpu", "--out", folder, "--eval", labels,
                   "--no-progress", *LOOSE, *extra)

    assert run(tiny_frames[1:3], out).rc == 0
    resumed = run(tiny_frames[1:4], out, "--skip-existing")
    assert resumed.rc == 0 and "skipping 2 frames" in resumed.err, resumed
    assert f"KITTI evaluation of 3 frames against {labels}" in resumed.out, resumed
    assert run(tiny_frames[1:4], whole).rc == 0
    assert json.loads((out / "eval.json").read_text()) == json.loads((whole / "eval.json").read_text())


def test_bench_refuses_bad_lists_while_parsing_and_labels_an_fp16_model_dir_on_the_cpu(tiny_frames: list[Path],
                                                                                      tmp_path: Path):
    from tiny import tiny_model_dir

    for option, value, said in (("--precisions", "fp64", "--precisions: 'fp64': expected names out of fp32, tf32, fp16"),
                                ("--pipelines", "x", "--pipelines/--streams: 'x' is not an integer"),
                                ("--streams", "0", "--pipelines/--streams: '0': expected an integer in 1..16"),
                                ("--batches", "1,0", "--batches: '0': expected an integer in 1..8"),
                                ("--soak", "-1", "--soak: '-1': expected an integer in 0..")):
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main(["bench", option, value, "--out", str(tmp_path / "b")])
        assert exit_info.value.code == 2 and f"argument {said}" in err.getvalue(), err.getvalue()
    assert_one_line_error(cli("bench", "--point-dim", "5", "--out", tmp_path / "b"), "--point-dim applies to --frames")
    assert not (tmp_path / "b").exists()
    frames = tmp_path / "frames"
    frames.mkdir()
    shutil.copy(tiny_frames[1], frames)
    model = tiny_model_dir(tmp_path / "fp16", precision="fp16", seed=3).path
    run = cli("bench", "--device", "cpu", "--model", model, "--frames", frames, "--iterations", "1",
              "--precisions", "fp16", "--out", tmp_path / "b")
    assert run.rc == 0, run
    assert "running on CPU, ONNX Runtime, fp16: 1 timed frame per frame set" in run.err, run.err  # it said "frames"
    assert "note: --precisions applies to GPU runs; the CPU run times the latency of the model's fp16 graphs only" \
        in run.err, run.err
    assert {r["precision"] for r in json.loads((tmp_path / "b" / "bench.json").read_text())["runs"]} == {"fp16"}


def test_bench_takes_infer_s_device_spellings(tiny_frames: list[Path], tmp_path: Path):
    """``--device cuda:N`` as infer takes it: parsed, then refused here as ``--device cuda`` is (no GPU); a
    malformed one gets infer's argparse error."""
    from pointpillars_trt.devices import cuda_available
    from pointpillars_trt.runtime.availability import gpu_visible

    if gpu_visible():
        pytest.skip("this machine shows an NVIDIA GPU")
    frames = tmp_path / "frames"
    frames.mkdir()
    shutil.copy(tiny_frames[1], frames)
    for device, index in (("cuda", 0), ("cuda:1", 1)):
        run = cli("bench", "--device", device, "--frames", frames, "--out", tmp_path / "b")
        assert_one_line_error(run, f"device {device} requested, but {cuda_available(index)}", "--device cpu or auto")
        assert run.out == "" and not (tmp_path / "b").exists()
    said = {}
    for command in ("infer", "bench"):
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main([command, *(["x.bin"] if command == "infer" else []), "--device", "cuda:x"])
        assert exit_info.value.code == 2, err.getvalue()
        said[command] = err.getvalue().replace(f"pointpillars-trt {command}", "pointpillars-trt COMMAND")
    assert said["bench"] == said["infer"], said
    assert "argument --device: 'cuda:x': expected auto, cpu, cuda or cuda:N" in said["bench"], said



@pytest.mark.cuda
def test_a_gpu_index_past_the_visible_ones_is_one_error_for_infer_and_bench(tiny_model: Path, tiny_frames: list[Path],
                                                                          tmp_path: Path):
    """On a GPU machine ``--device cuda:N`` with N past the visible GPUs names N and how many there are, before
    anything runs (bench: before a model dir is exported or a report written)."""
    from pointpillars_trt.devices import cuda_available

    if cuda_available() is not None:
        pytest.skip(f"needs CUDA: {cuda_available()}")
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    frames = tmp_path / "frames"
    frames.mkdir()
    shutil.copy(tiny_frames[1], frames)
    for command in ("infer", "bench"):
        args = ([tiny_frames[1], "--model", tiny_model] if command == "infer"
                else ["--frames", frames, "--out", tmp_path / "b"])
        run = cli(command, *args, "--device", f"cuda:{count}")
        assert run.rc != 0 and "Traceback" not in run.err, run
        lines = run.err.strip().splitlines()
        assert lines[-1].startswith("error: ") and f"GPU {count} does not exist ({count} visible)" in lines[-1], run.err
    assert not (tmp_path / "b").exists()

def test_bench_refuses_an_out_it_cannot_write_before_the_model_loads(tmp_path: Path):
    """The model and frames do not exist: only a check made before they are read can name --out (before: the
    whole benchmark ran, then ``error: 'outfile': File exists``)."""
    a_file = tmp_path / "report.md"
    a_file.write_text("mine\n")
    absent = ("--model", tmp_path / "no-model", "--frames", tmp_path / "no-frames", "--device", "cpu")
    run = cli("bench", *absent, "--out", a_file)
    assert (run.rc, run.out, run.err) == (2, "", f"error: --out '{a_file}' is an existing file, not a folder\n"), run
    run = cli("bench", *absent, "--out", a_file / "sub")
    assert (run.rc, run.out, run.err) == (2, "", f"error: --out '{a_file / 'sub'}': '{a_file}' is a file, "
                                                 "not a folder\n"), run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"] and a_file.read_text() == "mine\n"


def test_one_pillar_because_of_the_models_max_pillars_is_not_called_a_file_of_zeros() -> None:
    """A model of max_pillars 1 fills its one pillar and drops the rest: the frame is not "all its points in
    one pillar" (a file of zeros); the pillars-dropped warning says what happened."""
    from pointpillars_trt.apps.frame_report import frame_warning
    from pointpillars_trt.detections import Detections, FrameStats

    def found(stats: FrameStats) -> Detections:
        return Detections(np.zeros((0, 7), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), ("Car",),
                          stats)

    zeros = frame_warning("a.bin", found(FrameStats(20_000, 0, 1, 0)), None)
    assert zeros is not None and zeros[0] == "onepillar"
    assert frame_warning("a.bin", found(FrameStats(20_000, 0, 1, 3_000)), None) is None


def test_bench_checks_a_model_against_config_as_infer_does(tiny_frames: list[Path], tmp_path: Path):
    """``--config`` with ``--model`` is the config the model must have (it used to be ignored there): a model
    dir built for another config, or a checkpoint of another family, is refused before anything is timed."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3).path
    for command in ("bench", "infer"):
        extra = ["--out", tmp_path / "b"] if command == "bench" else [tiny_frames[1]]
        run = cli(command, "--device", "cpu", "--model", model, "--config", "openpcdet_kitti_3class", *extra)
        assert_one_line_error(run, f"model dir '{model}' was built for config 'tiny_openpcdet', not for --config "
                                   "'openpcdet_kitti_3class'", "drop --config")
    assert not (tmp_path / "b").exists()


def test_a_built_in_configs_yaml_copied_and_edited_is_said_at_build_and_told_apart_by_its_fields(
        assets: Path, tmp_path: Path) -> None:
    """A built-in config's YAML copied and edited keeps the built-in name: build says so, and a later --config of
    that name is refused naming the field that differs (it read "built for config X, not for --config X")."""
    import re

    builtin = Path(__file__).resolve().parents[2] / "pointpillars_trt" / "configs" / "openpcdet_kitti_3class.yaml"
    text = builtin.read_text()
    published = int(re.search(r"max_pillars: (\d+)", text).group(1))  # type: ignore[union-attr]
    edited = tmp_path / "mine.yaml"
    edited.write_text(text.replace(f"max_pillars: {published}", "max_pillars: 4000"))
    model = tmp_path / "model"
    run = cli("build", "--checkpoint", assets / "checkpoints/pointpillar_openpcdet_synthetic.pth", "--config", edited,
              "--out", model)
    assert run.rc == 0 and run.err.count("\n") == 1 and run.err.startswith(
        "note: the config given is named 'openpcdet_kitti_3class', as a built-in config is, with other values "
        f"(voxel.max_pillars 4000 here, {published} there): give it a name of its own"), run.err
    frame = assets / "kitti/training/velodyne_fov/000000.bin"
    run = cli("infer", frame, "--device", "cpu", "--model", model, "--config", "openpcdet_kitti_3class")
    assert_one_line_error(run, f"model dir '{model}' was built for another config of that name (voxel.max_pillars 4000 "
                               f"there, {published} now), not for --config 'openpcdet_kitti_3class'", "drop --config")


def test_build_into_a_folder_this_user_cannot_write_is_refused(assets: Path, tmp_path: Path) -> None:
    """Before: an empty read-only folder (chmod 555) was replaced by the build's own, writable one, without a word
    (the rename needs only its parent's permission); infer --out refused the same folder."""
    from test_infer_hostile import permission_bound_prefix

    prefix = permission_bound_prefix()
    if prefix is None:
        pytest.skip("root without setpriv: permissions do not bind")
    folder = tmp_path / "model"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "pointpillars_trt", "build", "--checkpoint",
                               str(assets / "checkpoints/pointpillar_openpcdet_synthetic.pth"), "--out", str(folder)],
                              capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 2 and done.stdout == "" and done.stderr == (
            f"error: model dir {str(folder)!r}: cannot write there (Permission denied); a build replaces the folder "
            "with the one it writes: make it writable, or give another folder\n"), done
        assert folder.stat().st_mode & 0o777 == 0o555 and not list(folder.iterdir())
    finally:
        folder.chmod(0o755)


def test_bench_refuses_a_checkpoint_of_another_family_than_config(assets: Path, tmp_path: Path):
    checkpoint = assets / "checkpoints/pointpillar_openpcdet_synthetic.pth"
    run = cli("bench", "--device", "cpu", "--model", checkpoint, "--config", "zhulf0804_kitti_3class",
              "--out", tmp_path / "b")
    assert_one_line_error(run, str(checkpoint), "checkpoint has the openpcdet layout, but config zhulf0804_kitti_3class "
                                                "is for the zhulf0804 family")
    assert not (tmp_path / "b" / "bench.json").exists()


def test_the_point_dim_a_wide_file_is_refused_with_is_one_infer_takes(assets: Path, tmp_path: Path):
    """A KITTI scan written 8 values a point (a ring number and three constants after x, y, z, intensity): read
    as 4 it is refused naming --point-dim 8, and with --point-dim 8 it gives the 4-value scan's own outputs."""
    scan_path = sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0]
    scan = np.fromfile(scan_path, "<f4").reshape(-1, 4)
    wide = np.zeros((len(scan), 8), "<f4")
    wide[:, :4] = scan
    wide[:, 4] = np.arange(len(scan)) % 64
    wide[:, 5:] = (0.0, 3.5, 7.0)
    frames = tmp_path / "wide"
    frames.mkdir()
    wide.tofile(frames / scan_path.name)
    model = assets / "checkpoints/pointpillar_openpcdet_synthetic.pth"
    refused = cli("infer", frames, "--model", model, "--device", "cpu", "--no-progress", "--out", tmp_path / "a")
    assert refused.rc == 1 and "pass --point-dim 8 (Python: point_dim=8)" in refused.err, refused
    read = cli("infer", frames, "--model", model, "--device", "cpu", "--no-progress", "--point-dim", "8",
               "--out", tmp_path / "b")
    plain = cli("infer", scan_path, "--model", model, "--device", "cpu", "--no-progress", "--out", tmp_path / "c")
    assert read.rc == 0 and plain.rc == 0, (read, plain)
    name = scan_path.with_suffix(".json").name
    ours, theirs = (json.loads((tmp_path / folder / name).read_text()) for folder in ("b", "c"))
    ours.pop("source"), theirs.pop("source")  # the wide file's and the scan's own paths
    assert ours == theirs and len(ours["scores"]) > 0


# --------------------------------------------------------------------------- a home that cannot be written

def unwritable_home_env(tmp_path: Path, repo_root: Path) -> dict[str, str]:
    """This environment with a home below a regular file, which no process (root neither) can make a folder in, as
    a container's read-only home; no cache or config folder given otherwise."""
    (tmp_path / "a-file").write_text("")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR", "ORT_DISABLE_TELEMETRY")}
    return {**env, "HOME": str(tmp_path / "a-file" / "home"), "PYTHONPATH": str(repo_root)}


def test_a_home_that_cannot_be_written_adds_no_line_of_onnx_runtime_or_matplotlib(tiny_model: Path, repo_root: Path,
                                                                               tmp_path: Path):
    """Before: ONNX Runtime's import printed a coloured 'Failed to persist telemetry device ID; using an in-memory
    identifier' line stamped with its source file, and matplotlib's import two lines on the temporary folder it
    made, into the output of every run with a read-only home."""
    pytest.importorskip("matplotlib")
    frame, out = tmp_path / "frame.bin", tmp_path / "out"
    tiny_points(1, n=200).tofile(frame)  # fewer pillars than the tiny model keeps: a frame of no warning
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frame), "--model",
                           str(tiny_model), "--device", "cpu", "--viz", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300, cwd=repo_root,
                          env=unwritable_home_env(tmp_path, repo_root))
    assert done.returncode == 0, done
    assert done.stderr == "running on CPU, ONNX Runtime, fp32\n", done.stderr
    assert sorted(output_names(out)) == ["frame.json", "frame.png"]


def test_onnx_runtime_telemetry_is_turned_off_only_where_its_import_would_warn(tmp_path: Path):
    """ONNX Runtime keeps its device ID below $XDG_CACHE_HOME (an absolute one), else ~/.cache; a variable the user
    set is theirs."""
    from pointpillars_trt.runtime.ort_telemetry import warns_here

    (tmp_path / "a-file").write_text("")
    unwritable, writable = str(tmp_path / "a-file" / "x"), str(tmp_path / "x")
    assert warns_here({"HOME": unwritable})
    assert not warns_here({"HOME": writable})
    assert not warns_here({"HOME": unwritable, "ORT_DISABLE_TELEMETRY": "0"})
    assert warns_here({"HOME": writable, "XDG_CACHE_HOME": unwritable})
    assert not warns_here({"HOME": unwritable, "XDG_CACHE_HOME": writable})
    assert warns_here({"HOME": unwritable, "XDG_CACHE_HOME": "relative/cache"})  # not absolute: ignored
