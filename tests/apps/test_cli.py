"""``pointpillars-trt build | infer | demo`` end to end on the CPU path, with both shared checkpoints.

Oracles: the public API on the same frames (``PointPillars.from_checkpoint``), the NumPy reference
stages run here on raw ONNX Runtime sessions (for the family-native boxes, converted to OpenPCDet's
convention in float64 in this file), brute-force pillar counts, the byte size of the .bin files, and
the KITTI label reader for ``--format kitti``. CLI runs are in-process (``cli.main``) except two
subprocess runs that prove the console script exists and that no traceback reaches stderr.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort
import pytest
from _torch_writer import write_zip

from pointpillars_trt.apps.cli import main
from pointpillars_trt.config import ModelConfig, load_config
from pointpillars_trt.detections import Detections
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.kitti import kitti_label_to_lidar_boxes, read_calibration, read_velodyne_bin
from pointpillars_trt.model_dir import load_model_dir
from pointpillars_trt.reference import postprocess, scatter, split_heads, voxelize

CHECKPOINTS = {"openpcdet": "pointpillar_openpcdet_synthetic.pth", "zhulf0804": "pointpillars_zhulf0804_synthetic.pth"}
CONFIGS = {"openpcdet": "openpcdet_kitti_3class", "zhulf0804": "zhulf0804_kitti_3class"}
CAMERA_FRAME = "kitti/training/velodyne_reduced/000134.bin"
TEST_FRAME = "kitti/testing/velodyne_reduced/000002.bin"
FULL_SCAN = "kitti/training/velodyne/000000.bin"
JSON_KEYS = {"frame", "boxes_lidar", "scores", "labels", "num_points", "num_pillars"}
# for what does not depend on the family: run with the OpenPCDet model only
ONE_FAMILY = pytest.mark.parametrize("family", ["openpcdet"], indirect=True)


class Run(NamedTuple):
    rc: int
    out: str
    err: str


def cli(*args: object) -> Run:
    """``pointpillars-trt ARGS`` in this process, with its stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return Run(rc, out.getvalue(), err.getvalue())


def assert_one_line_error(run: Run, *needles: str) -> None:
    assert run.rc == 2, run
    assert "Traceback" not in run.err
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def tensorrt_builds_here() -> bool:
    try:
        import tensorrt
    except ImportError:
        return False
    return hasattr(tensorrt, "Builder")  # tensorrt-stubs alone imports as an empty namespace package


# --------------------------------------------------------------------------- independent oracles

def brute_force_pillar_count(points: np.ndarray, cfg: ModelConfig) -> int:
    """Distinct in-range pillars of the finite points, by the family's filter (assets/README.md)."""
    pts = points[np.isfinite(points).all(axis=1)]
    lo = np.asarray(cfg.voxel.point_range[:3], np.float32)
    hi = np.asarray(cfg.voxel.point_range[3:], np.float32)
    if cfg.family == "zhulf0804":
        keep = ((pts[:, :3] > lo) & (pts[:, :3] < hi)).all(axis=1)
    else:
        keep = ((pts[:, :2] >= lo[:2]) & (pts[:, :2] <= hi[:2])).all(axis=1)
    cells = np.floor((pts[keep, :3] - lo) / np.asarray(cfg.voxel.pillar_size, np.float32)).astype(np.int64)
    inside = ((cells >= 0) & (cells < np.array(cfg.voxel.grid))).all(axis=1)
    return min(len({tuple(c) for c in cells[inside].tolist()}), cfg.voxel.max_pillars)


def native_reference(points: np.ndarray, model_path: Path, cfg: ModelConfig) -> np.ndarray:
    """The family's own boxes: reference stages around plain ONNX Runtime sessions (no CpuDetector)."""
    pfn = ort.InferenceSession(str(model_path / "pfn.onnx"), providers=["CPUExecutionProvider"])
    rpn = ort.InferenceSession(str(model_path / "rpn.onnx"), providers=["CPUExecutionProvider"])
    pillars = voxelize(points, cfg)
    feats = pfn.run(["pillar_features"], {"pillars": pillars.features})[0]
    canvas = scatter(feats, pillars.coords, cfg).transpose(0, 2, 3, 1)  # NHWC, as the graph reads it
    (heads,) = rpn.run(["heads"], {"canvas": canvas})
    return postprocess(*split_heads(heads[0], cfg), cfg).native_boxes


def native_to_openpcdet(native: np.ndarray, family: str) -> np.ndarray:
    """zhulf0804 (x, y, z_bottom, w, l, h, yaw) -> (x, y, z + h/2, l, w, h, -yaw - pi/2); OpenPCDet as is."""
    b = native.astype(np.float64)
    if family == "openpcdet":
        return b
    x, y, z, w, l, h, yaw = b.T
    return np.stack([x, y, z + h / 2, l, w, h, -yaw - math.pi / 2], axis=1)


def angle_gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs((np.asarray(a, np.float64) - b + math.pi) % (2 * math.pi) - math.pi)


def assert_json_matches(record: dict, det: Detections, frame: str) -> None:
    """The JSON record is ``det`` up to the writer's rounding (boxes 5, scores 6 decimals)."""
    assert JSON_KEYS <= record.keys()
    assert record["frame"] == frame
    assert record["labels"] == det.names
    np.testing.assert_allclose(record["scores"], det.scores, rtol=0, atol=1e-6)
    boxes = np.asarray(record["boxes_lidar"], np.float64).reshape(-1, 7)
    np.testing.assert_allclose(boxes, det.boxes, rtol=0, atol=1e-5)
    assert record["num_points"] == det.stats.num_points
    assert record["num_pillars"] == det.stats.num_pillars


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def checkpoint(assets: Path, family: str) -> Path:
    return assets / "checkpoints" / CHECKPOINTS[family]


@pytest.fixture(scope="module")
def model_dir(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, family: str) -> Path:
    """``build`` with defaults (config from the checkpoint's layout, fp32), once per family."""
    out = tmp_path_factory.mktemp(f"model_{family}")
    run = cli("build", "--checkpoint", checkpoint, "--out", out)
    assert run.rc == 0, run
    return out


@pytest.fixture(scope="module")
def api_detections(checkpoint: Path, assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Detections]:
    """What the public API returns on the three frames, the oracle of the infer outputs."""
    cache = tmp_path_factory.mktemp("api_cache")
    with PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=cache) as detector:
        return {rel: detector(read_velodyne_bin(assets / rel)) for rel in (CAMERA_FRAME, TEST_FRAME, FULL_SCAN)}


@pytest.fixture(scope="module")
def infer_json(model_dir: Path, assets: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """One ``infer`` over a file, a folder and a glob."""
    out = tmp_path_factory.mktemp("json")
    glob_pattern = str(assets / FULL_SCAN).replace("000000.bin", "00000[0].b?n")
    run = cli("infer", assets / CAMERA_FRAME, (assets / TEST_FRAME).parent, glob_pattern,
              "--model", model_dir, "--out", out, "--device", "cpu", "--no-progress")
    return run, out


# --------------------------------------------------------------------------- build

def test_build_writes_model_dir(model_dir: Path, family: str):
    assert {"pfn.onnx", "rpn.onnx", "model.json"} <= {p.name for p in model_dir.iterdir()}
    cfg = load_config(CONFIGS[family])
    model = load_model_dir(model_dir, cfg)
    assert model.precision == "fp32" and model.metadata["source"]["layout"] == family


@pytest.mark.parametrize("config_as", ["name", "path"])
def test_build_config_and_fp16(checkpoint: Path, family: str, config_as: str, repo_root: Path, tmp_path: Path):
    name = CONFIGS[family]
    config = name if config_as == "name" else repo_root / "pointpillars_trt" / "configs" / f"{name}.yaml"
    run = cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--config", config, "--precision", "fp16")
    assert run.rc == 0, run
    for file in ("pfn.onnx", "rpn.onnx", "model.json"):
        assert file in run.out
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["precision"] == "fp16" and meta["config_digest"] == load_config(name).digest()


def test_build_tensorrt_without_tensorrt(checkpoint: Path, tmp_path: Path):
    if tensorrt_builds_here():
        pytest.skip("TensorRT is installed here; tests marked tensorrt cover the plan build")
    assert_one_line_error(cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--backend", "tensorrt"),
                          "TensorRT")
    assert not (tmp_path / "m").exists()  # refused before any work


def test_build_checkpoint_of_other_family(checkpoint: Path, family: str, tmp_path: Path):
    other = CONFIGS["zhulf0804" if family == "openpcdet" else "openpcdet"]
    assert_one_line_error(cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--config", other),
                          str(checkpoint), other)


# --------------------------------------------------------------------------- infer: JSON

def test_infer_json_equals_api(infer_json: tuple[Run, Path], api_detections: dict[str, Detections], assets: Path):
    run, out = infer_json
    assert run.rc == 0 and "Traceback" not in run.err, run
    assert "3/3 frames" in run.out
    assert sorted(os.listdir(out)) == ["000000.json", "000002.json", "000134.json"]  # no temp files left
    for rel, det in api_detections.items():
        stem = Path(rel).stem
        record = json.loads((out / f"{stem}.json").read_text())
        assert_json_matches(record, det, stem)
        assert record["num_points"] == (assets / rel).stat().st_size // 16
        assert record["num_nonfinite_points"] == 0


def test_infer_json_counts_pillars(infer_json: tuple[Run, Path], assets: Path, family: str):
    cfg = load_config(CONFIGS[family])
    for rel in (CAMERA_FRAME, FULL_SCAN):
        record = json.loads((infer_json[1] / f"{Path(rel).stem}.json").read_text())
        assert record["num_pillars"] == brute_force_pillar_count(read_velodyne_bin(assets / rel), cfg)


def test_infer_json_is_openpcdet_convention_of_native_boxes(infer_json: tuple[Run, Path], model_dir: Path,
                                                             assets: Path, family: str):
    cfg = load_config(CONFIGS[family])
    for rel in (CAMERA_FRAME, FULL_SCAN):
        native = native_reference(read_velodyne_bin(assets / rel), model_dir, cfg)
        boxes = np.asarray(json.loads((infer_json[1] / f"{Path(rel).stem}.json").read_text())["boxes_lidar"])
        assert boxes.shape == native.shape and len(boxes) > 0
        expected = native_to_openpcdet(native, family)
        np.testing.assert_allclose(boxes[:, :6], expected[:, :6], rtol=0, atol=2e-5)
        assert angle_gap(boxes[:, 6], expected[:, 6]).max() < 2e-5


# --------------------------------------------------------------------------- infer: KITTI label_2

def test_infer_kitti_round_trips_to_json(checkpoint: Path, infer_json: tuple[Run, Path], assets: Path,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calib = tmp_path / "calib"
    calib.mkdir()
    shutil.copy(assets / "kitti/training/calib/000134.txt", calib)  # none for testing 000002
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    run = cli("infer", assets / CAMERA_FRAME, assets / TEST_FRAME, "--model", checkpoint, "--format", "kitti",
              "--calib", calib, "--out", tmp_path / "out", "--device", "cpu", "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    failures = [line for line in run.err.splitlines() if line.startswith("FAILED")]
    assert len(failures) == 1 and str(assets / TEST_FRAME) in failures[0] and "000002.txt" in failures[0]
    assert sorted(os.listdir(tmp_path / "out")) == ["000134.txt"]

    parsed = kitti_label_to_lidar_boxes(tmp_path / "out" / "000134.txt", read_calibration(calib / "000134.txt"))
    record = json.loads((infer_json[1] / "000134.json").read_text())
    boxes = np.asarray(record["boxes_lidar"])
    assert parsed.names == record["labels"] and len(boxes) > 0
    np.testing.assert_allclose(parsed.scores, record["scores"], rtol=0, atol=6e-5)
    np.testing.assert_allclose(parsed.boxes[:, :6], boxes[:, :6], rtol=0, atol=3e-4)  # 4-decimal camera coords
    assert angle_gap(parsed.boxes[:, 6], boxes[:, 6]).max() < 2e-4


# --------------------------------------------------------------------------- infer: bad input

@pytest.fixture(scope="module")
def bad_frames(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("frames")
    good = read_velodyne_bin(assets / CAMERA_FRAME)
    (folder / "odd.bin").write_bytes(good.tobytes()[:100])
    (folder / "empty.bin").write_bytes(b"")
    nonfinite = np.array([[np.nan, 1, 0, 0], [5, np.inf, 0, 0], [5, 1, -np.inf, 0], [5, 1, 0, np.nan]], np.float32)
    with_bad = np.concatenate([nonfinite[:2], good[:7000], nonfinite[2:3], good[7000:], nonfinite[3:]])
    with_bad.tofile(folder / "nonfinite.bin")
    behind = good.copy()
    behind[:, 0] = -np.abs(behind[:, 0]) - 0.01
    behind.tofile(folder / "outside.bin")
    return {"odd": folder / "odd.bin", "missing": folder / "missing.bin", "empty": folder / "empty.bin",
            "nonfinite": folder / "nonfinite.bin", "outside": folder / "outside.bin"}


def test_infer_bad_frames_in_a_batch(model_dir: Path, bad_frames: dict[str, Path],
                                     api_detections: dict[str, Detections], tmp_path: Path):
    run = cli("infer", *bad_frames.values(), "--model", model_dir, "--out", tmp_path, "--device", "cpu",
              "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    assert "3/5 frames" in run.out
    failures = sorted(line for line in run.err.splitlines() if line.startswith("FAILED"))
    assert len(failures) == 2
    assert str(bad_frames["missing"]) in failures[0] and "does not exist" in failures[0]
    assert str(bad_frames["odd"]) in failures[1] and "not a multiple of 16" in failures[1]
    assert sorted(os.listdir(tmp_path)) == ["empty.json", "nonfinite.json", "outside.json"]

    def record(name: str) -> dict:
        return json.loads((tmp_path / f"{name}.json").read_text())

    empty, outside, nonfinite = record("empty"), record("outside"), record("nonfinite")
    assert (empty["num_points"], empty["num_pillars"], empty["boxes_lidar"], empty["labels"]) == (0, 0, [], [])
    assert (outside["num_pillars"], outside["boxes_lidar"], outside["scores"]) == (0, [], [])
    # dropping the non-finite rows leaves exactly the clean frame, so its detections must come out
    clean = api_detections[CAMERA_FRAME]
    assert nonfinite["num_nonfinite_points"] == 4
    assert nonfinite["num_points"] == clean.stats.num_points + 4
    assert nonfinite["num_pillars"] == clean.stats.num_pillars
    assert nonfinite["labels"] == clean.names
    np.testing.assert_allclose(nonfinite["boxes_lidar"], clean.boxes, rtol=0, atol=1e-5)


@pytest.mark.parametrize("damage", ["unknown_layout", "truncated"])
def test_infer_bad_checkpoint(checkpoint: Path, assets: Path, tmp_path: Path, damage: str,
                              monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.pth"
    if damage == "unknown_layout":
        write_zip({"encoder.weight": np.zeros((64, 9), np.float32), "decoder.bias": np.zeros(3, np.float32)}, bad)
        needle = "unknown checkpoint layout"
    else:
        data = checkpoint.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
        needle = "truncated or corrupt"
    assert_one_line_error(cli("infer", assets / CAMERA_FRAME, "--model", bad, "--device", "cpu"), str(bad), needle)
    assert_one_line_error(cli("build", "--checkpoint", bad, "--out", tmp_path / "m"), str(bad), needle)


def test_infer_model_dir_of_other_config(model_dir: Path, family: str, assets: Path):
    other = CONFIGS["zhulf0804" if family == "openpcdet" else "openpcdet"]
    run = cli("infer", assets / CAMERA_FRAME, "--model", model_dir, "--config", other, "--device", "cpu")
    assert_one_line_error(run, str(model_dir), other, "rebuild")


@ONE_FAMILY
def test_infer_output_errors(model_dir: Path, family: str, assets: Path, tmp_path: Path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    assert_one_line_error(cli("infer", assets / CAMERA_FRAME, "--model", model_dir, "--out", a_file / "out",
                              "--device", "cpu"), str(a_file))
    # a folder in the way of one frame's output: that frame fails, the other is still written
    out = tmp_path / "out"
    (out / "000134.json").mkdir(parents=True)
    run = cli("infer", assets / CAMERA_FRAME, assets / TEST_FRAME, "--model", model_dir, "--out", out,
              "--device", "cpu", "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    failures = [line for line in run.err.splitlines() if line.startswith("FAILED")]
    assert len(failures) == 1 and str(assets / CAMERA_FRAME) in failures[0]
    assert "cannot write" in failures[0] and str(out / "000134.json") in failures[0]
    assert sorted(os.listdir(out)) == ["000002.json", "000134.json"] and (out / "000002.json").is_file()


@ONE_FAMILY
def test_infer_refuses_clashing_output_names(model_dir: Path, family: str, assets: Path, tmp_path: Path):
    run = cli("infer", assets / TEST_FRAME, assets / "kitti/training/velodyne/000002.bin", "--model", model_dir,
              "--out", tmp_path / "out")
    assert_one_line_error(run, "same output file")
    assert not (tmp_path / "out").exists()


@ONE_FAMILY
def test_infer_kitti_needs_calib_folder(model_dir: Path, family: str, assets: Path, tmp_path: Path):
    for extra in ([], ["--calib", tmp_path / "nowhere"]):
        run = cli("infer", assets / CAMERA_FRAME, "--model", model_dir, "--format", "kitti", *extra)
        assert_one_line_error(run, "--calib")


# --------------------------------------------------------------------------- demo and the console script

def test_demo(tmp_path: Path):
    run = cli("demo", "--out", tmp_path, "--device", "cpu")
    assert run.rc == 0, run
    assert "SIMULATED" in run.out and "UNTRAINED" in run.out
    record = json.loads((tmp_path / "detections.json").read_text())
    assert JSON_KEYS <= record.keys() and f"boxes: {len(record['scores'])}" in run.out
    assert record["num_points"] == (tmp_path / "simulated_frame.bin").stat().st_size // 16
    if importlib.util.find_spec("matplotlib") is None:
        return
    assert (tmp_path / "bev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_script_help():
    exe = shutil.which("pointpillars-trt")
    if exe is None:
        pytest.skip("the pointpillars-trt console script is not on PATH (package not pip-installed)")
    done = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for command in ("build", "infer", "demo"):
        assert command in done.stdout


@ONE_FAMILY
def test_subprocess_bad_input_has_no_traceback(model_dir: Path, bad_frames: dict[str, Path],
                                               repo_root: Path, tmp_path: Path):
    checkpoint = tmp_path / "broken.pth"
    with zipfile.ZipFile(checkpoint, "w") as archive:
        archive.writestr("broken/data.pkl", b"not a pickle")
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(bad_frames["odd"]),
                           "--model", str(checkpoint), "--device", "cpu"],
                          capture_output=True, text=True, timeout=120, cwd=repo_root,
                          env={**os.environ, "POINTPILLARS_TRT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(checkpoint) in lines[0], done.stderr
