"""``pointpillars-trt build | infer | demo`` end to end on the CPU path, with both shared checkpoints.

Oracles: the public API on the same frames (``PointPillars.from_checkpoint``), the NumPy reference
stages run here on raw ONNX Runtime sessions (for the family-native boxes, converted to OpenPCDet's
convention in float64 in this file), brute-force pillar counts, the byte size of the .bin files, and
the KITTI label reader for ``--format kitti``. CLI runs are in-process (``cli.main``) except two
subprocess runs that prove the console script exists and that no traceback reaches stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort
import pytest
from _torch_writer import tensor_of, write_zip

from disk_full import fill_up_at_rpn_graph
from notices import published_config_notice
from out_folder import output_names, output_paths
from tiny import overflowed_pillar_features
from pointpillars_trt.apps.cli import main
from pointpillars_trt.config import ModelConfig, load_config
from pointpillars_trt.convert.checkpoint import expected_keys
from pointpillars_trt.detections import Detections
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.kitti import kitti_label_to_lidar_boxes, read_calibration
from pointpillars_trt.model_dir import load_model_dir
from pointpillars_trt.pointcloud_io import read_points
from pointpillars_trt.reference import postprocess, scatter, split_heads, voxelize
from pointpillars_trt.runtime_options import RuntimeOptions

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


def opened_options(monkeypatch: pytest.MonkeyPatch) -> list[RuntimeOptions]:
    """The options (batch, threads) of each detector ``infer`` opens from here on, as the real ``open_warm`` opens
    it, in turn."""
    import pointpillars_trt.apps.infer as infer_app

    opened: list[RuntimeOptions] = []
    real_open_warm = infer_app.open_warm

    def recording_open_warm(*args, **kwargs):  # type: ignore[no-untyped-def]
        detector = real_open_warm(*args, **kwargs)
        opened.append(detector.options)
        return detector

    monkeypatch.setattr(infer_app, "open_warm", recording_open_warm)
    return opened


def assert_one_line_error(run: Run, *needles: str) -> None:
    assert run.rc == 2, run
    assert "Traceback" not in run.err
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def tensorrt_builds_here() -> bool:
    """TensorRT or TensorRT for RTX imports (tensorrt-stubs alone is not TensorRT)."""
    from pointpillars_trt.runtime.tensorrt_library import installed_library

    return installed_library() is not None


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
    np.testing.assert_allclose(boxes[:, :6], det.boxes[:, :6], rtol=0, atol=1e-5)
    assert angle_gap(boxes[:, 6], det.boxes[:, 6]).max(initial=0) < 1e-5
    assert np.all((boxes[:, 6] >= -math.pi) & (boxes[:, 6] < math.pi))  # normalised headings
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
def api_detections(checkpoint: Path, assets: Path, tmp_path_factory: pytest.TempPathFactory,
                   family: str) -> dict[str, Detections]:
    """What the public API returns on the three frames, the oracle of the infer outputs."""
    cache = tmp_path_factory.mktemp("api_cache")
    # the cache entry is built here: an OpenPCDet checkpoint's says the published config it is built with
    with published_config_notice(checkpoint) if family == "openpcdet" else contextlib.nullcontext():
        detector = PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=cache)
    with detector:
        return {rel: detector(read_points(assets / rel)) for rel in (CAMERA_FRAME, TEST_FRAME, FULL_SCAN)}


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


MISSING_LIBNVINFER = "libnvinfer.so.10: cannot open shared object file: No such file or directory"
MISSING_CUDART = "libcudart.so.13: cannot open shared object file: No such file or directory"


def failing_modules(folder: Path, errors: dict[str, str]) -> Path:
    """``folder`` holding a package per module name whose import raises ImportError(its error): a library
    that is installed (found) but does not load, as when the CUDA runtime it links is missing."""
    for module, error in errors.items():
        (folder / module).mkdir(parents=True)
        (folder / module / "__init__.py").write_text(f"raise ImportError({error!r})\n")
    return folder


def cli_with_path_first(folder: Path, repo_root: Path, *args: object) -> Run:
    """``pointpillars-trt ARGS`` in a process whose imports look in ``folder`` first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(repo_root)])}
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=repo_root, env=env)
    return Run(done.returncode, done.stdout, done.stderr)


@ONE_FAMILY
def test_build_tensorrt_says_the_import_error_of_installed_libraries(checkpoint: Path, repo_root: Path,
                                                                    tmp_path: Path):
    """Both libraries installed, neither loads: the error is each one's own, with the fix it needs, not
    "not installed" with a pip command that changes nothing."""
    shims = failing_modules(tmp_path / "shims", {"tensorrt": MISSING_LIBNVINFER,
                                                 "tensorrt_rtx_bindings": MISSING_CUDART})
    run = cli_with_path_first(shims, repo_root, "build", "--checkpoint", checkpoint, "--out", tmp_path / "m",
                              "--backend", "tensorrt")
    assert run.err.splitlines() == [
        f"error: TensorRT is installed but does not import (ImportError: {MISSING_LIBNVINFER}). Note: it needs "
        "libnvinfer.so.10: install it, or add the folder that holds libnvinfer.so.10 to LD_LIBRARY_PATH; "
        f"TensorRT for RTX is installed but does not import (ImportError: {MISSING_CUDART}). Note: it needs the "
        "CUDA 13 runtime (libcudart.so.13): install it, or add the folder that holds libcudart.so.13 to "
        "LD_LIBRARY_PATH"], run
    assert run.rc == 2 and not (tmp_path / "m").exists()


@ONE_FAMILY
def test_the_rtx_note_says_why_tensorrt_is_not_used(checkpoint: Path, repo_root: Path, tmp_path: Path):
    from pointpillars_trt.runtime.tensorrt_library import installed_library

    if installed_library() != "tensorrt_rtx":
        pytest.skip("TensorRT for RTX is not what the tensorrt backend uses here")
    shims = failing_modules(tmp_path / "shims", {"tensorrt": MISSING_LIBNVINFER})
    run = cli_with_path_first(shims, repo_root, "build", "--checkpoint", checkpoint, "--out", tmp_path / "m",
                              "--backend", "tensorrt", "--compute-capability", "9.0")
    note, error = run.err.splitlines()
    assert note.startswith(f"note: TensorRT is installed but does not import (ImportError: {MISSING_LIBNVINFER}); "
                           "the tensorrt backend uses TensorRT for RTX "), run
    assert error.startswith("error: --compute-capability 9.0: TensorRT for RTX"), run


@ONE_FAMILY
@pytest.mark.parametrize("capability, refusal", [
    ("9.0", "{version} builds for 7.5, 8.6, 8.9, 12.0, 12.1"),
    ("86", "{version} builds for 7.5, 8.6, 8.9, 12.0, 12.1 (major.minor: did you mean 8.6?)"),
    ("8.6.1", "{version} builds for 7.5, 8.6, 8.9, 12.0, 12.1"),
    ("7.5", "has no fp32 matrix multiply on Turing (7.5). Note: export the model with --precision fp16 for it"),
])
def test_build_rtx_says_its_library_in_a_note_and_refuses_gpus_up_front(checkpoint: Path, tmp_path: Path,
                                                                         capability: str, refusal: str):
    from pointpillars_trt.runtime import tensorrt as trt_runtime
    from pointpillars_trt.runtime.tensorrt_library import installed_library

    if installed_library() != "tensorrt_rtx":
        pytest.skip("the tensorrt backend does not use TensorRT for RTX here")
    version = trt_runtime.trt.__version__
    note = (f"note: TensorRT is not installed; the tensorrt backend uses TensorRT for RTX {version}, whose plans "
            "run on compute capability 7.5/8.6/8.9/12.0/12.1 only")
    error = f"error: --compute-capability {capability}: TensorRT for RTX {refusal.format(version=version)}"
    args = ("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--backend", "tensorrt",
            "--compute-capability", "8.6", "--compute-capability", capability)
    trt_runtime._say_rtx_once.cache_clear()  # said once per process: this run is the first
    first, second = cli(*args), cli(*args)
    assert first.rc == second.rc == 2 and first.out == second.out == "", (first, second)
    assert first.err.splitlines() == [note, error], first.err  # no RuntimeWarning with a source line
    assert second.err.splitlines() == [error], second.err
    assert list(tmp_path.iterdir()) == []  # refused before the ONNX export


@ONE_FAMILY
@pytest.mark.parametrize("backend", ["onnxruntime", "cudnn"])
@pytest.mark.parametrize("options, line", [
    (["--compute-capability", "8.6"],
     "error: --compute-capability applies to --backend tensorrt (plans); drop it or add --backend tensorrt"),
    (["--no-tf32"], "error: --no-tf32 applies to --backend tensorrt (plans); drop it or add --backend tensorrt"),
    (["--no-tf32", "--compute-capability", "9.0"], "error: --compute-capability and --no-tf32 apply to --backend "
                                                   "tensorrt (plans); drop them or add --backend tensorrt"),
])
def test_build_refuses_plan_options_without_plans(checkpoint: Path, tmp_path: Path, backend: str,
                                                  options: list[str], line: str):
    run = cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--backend", backend, *options)
    assert run.rc == 2 and run.out == "" and run.err.splitlines() == [line], run
    assert list(tmp_path.iterdir()) == []


@ONE_FAMILY
def test_build_refuses_no_tf32_for_fp16_plans(checkpoint: Path, tmp_path: Path):
    """fp16 plans have no TF32 to turn off: the option did nothing but record tf32 false."""
    run = cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--backend", "tensorrt", "--precision",
              "fp16", "--no-tf32")
    assert run.rc == 2 and run.out == "" and run.err.splitlines() == [
        "error: --no-tf32 applies to fp32 plans (TensorFloat-32 is a way of running fp32 convolutions); fp16 plans "
        "have no TF32 to turn off: drop it, or build --precision fp32"], run
    assert list(tmp_path.iterdir()) == []


@ONE_FAMILY
@pytest.mark.parametrize("variable", ["set", "unset", "xdg"])
def test_infer_checkpoint_with_an_unwritable_cache_names_the_cache(checkpoint: Path, assets: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, variable: str):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    if variable == "set":
        monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(a_file / "cache"))
        where = f"model cache POINTPILLARS_TRT_CACHE='{a_file / 'cache'}'"
    elif variable == "xdg":  # the default below $XDG_CACHE_HOME, as a container or CI job points it at a volume
        monkeypatch.delenv("POINTPILLARS_TRT_CACHE", raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))
        where = f"model cache '{a_file / 'pointpillars-trt'}' (under XDG_CACHE_HOME; POINTPILLARS_TRT_CACHE unset)"
    else:  # the default: below $HOME
        monkeypatch.delenv("POINTPILLARS_TRT_CACHE", raising=False)
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        monkeypatch.setenv("HOME", str(a_file))
        where = f"model cache '{a_file / '.cache' / 'pointpillars-trt'}' (the default; POINTPILLARS_TRT_CACHE unset)"
    run = cli("infer", assets / CAMERA_FRAME, "--model", checkpoint, "--device", "cpu")
    assert run.rc == 2 and run.out == "", run
    assert run.err.splitlines() == [f"error: {where} cannot be written (Not a directory): set POINTPILLARS_TRT_CACHE "
                                    "to a writable folder, or build a model dir with `pointpillars-trt build` and use "
                                    "that instead of the checkpoint"], run.err
    assert list(tmp_path.iterdir()) == [a_file] and a_file.read_text() == "x"


@ONE_FAMILY
def test_infer_checkpoint_without_a_home_says_how_to_place_the_cache(checkpoint: Path, assets: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """HOME unset (``env -i``, a bare service) and a user id the password database does not know: one line saying so
    and how to place the cache; it was a RuntimeError traceback ("Could not determine home directory")."""
    import pwd

    def unknown_user(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("POINTPILLARS_TRT_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", unknown_user)
    run = cli("infer", assets / CAMERA_FRAME, "--model", checkpoint, "--device", "cpu")
    assert run.rc == 2 and run.out == "", run
    assert run.err.splitlines() == [f"error: the cache of pointpillars-trt has no folder: HOME is unset and user id "
                                    f"{os.getuid()} has no home directory: set POINTPILLARS_TRT_CACHE (or HOME) to a "
                                    "writable folder"], run.err


@ONE_FAMILY
def test_infer_checkpoint_with_a_full_cache_names_the_cache(checkpoint: Path, assets: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    """The cache's file system fills up while the graphs are written: the line names the cache and how to move it,
    as for a cache that cannot be written at all; it named a hashed folder in it, with no fix. Nothing is left
    there."""
    fill_up_at_rpn_graph(monkeypatch)
    cache = tmp_path / "cache"
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(cache))
    run = cli("infer", assets / CAMERA_FRAME, "--model", checkpoint, "--device", "cpu")
    assert run.rc == 2 and run.out == "", run
    assert run.err.splitlines() == [f"error: model cache POINTPILLARS_TRT_CACHE='{cache}' cannot be written (No space "
                                    "left on device): set POINTPILLARS_TRT_CACHE to a writable folder, or build a "
                                    "model dir with `pointpillars-trt build` and use that instead of the checkpoint"]
    assert list(cache.iterdir()) == []


def test_build_checkpoint_of_other_family(checkpoint: Path, family: str, tmp_path: Path):
    other = CONFIGS["zhulf0804" if family == "openpcdet" else "openpcdet"]
    assert_one_line_error(cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--config", other),
                          str(checkpoint), other)


def test_build_fp16_refuses_a_weight_beyond_float16(zhulf_cfg: ModelConfig, tmp_path: Path):
    """A head weight of 1e5 is fine in float32 but inf in float16: one error naming the checkpoint, the layer, the
    largest magnitude and the fix, no numpy cast warning, nothing written; the fp32 build the error names works."""
    rng = np.random.default_rng(0)
    shapes = expected_keys("zhulf0804", zhulf_cfg)
    state = {k: rng.uniform(0.5, 1.5, shape).astype(np.float32) for k, shape in shapes.items()}
    state["head.conv_reg.weight"][3, 7, 0, 0] = -1e5
    path = write_zip(state, tmp_path / "big.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run = cli("build", "--checkpoint", path, "--out", tmp_path / "m", "--precision", "fp16")
    assert run.out == "", run
    assert_one_line_error(run, f"error: '{path}': head.weight holds values up to 1e+05, beyond float16's 65504 (inf in "
                               "an fp16 graph): build with --precision fp32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pth"]
    run = cli("build", "--checkpoint", path, "--out", tmp_path / "m", "--precision", "fp32")
    assert run.rc == 0 and "in place of" not in run.out, run
    again = cli("build", "--checkpoint", path, "--out", tmp_path / "m", "--precision", "fp32", "--config",
                "zhulf0804_kitti_3class")  # a build over a model dir says what it replaced
    assert again.rc == 0 and again.out.splitlines()[1] == (
        f"  (in place of the model dir built there before: zhulf0804_kitti_3class, fp32, from {str(path)!r})"), again


def test_build_reads_a_bfloat16_checkpoint_as_the_float32_values_it_holds(zhulf_cfg: ModelConfig, tmp_path: Path):
    """A model trained in bf16 mixed precision saves bfloat16 weights: build reads them as the float32 values they
    are, with no note, so its graphs are the very graphs built from a float32 file of those values (each bfloat16
    written here as the high half of its float32's bits)."""
    rng = np.random.default_rng(3)
    exact, bf16 = {}, {}
    for key, shape in expected_keys("zhulf0804", zhulf_cfg).items():
        bits = rng.uniform(0.5, 1.5, shape).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        exact[key] = bits.view(np.float32)
        bf16[key] = tensor_of((bits >> 16).astype(np.uint16), "BFloat16Storage")
    for name, state in (("bf16", bf16), ("f32", exact)):
        run = cli("build", "--checkpoint", write_zip(state, tmp_path / f"{name}.pth"), "--out", tmp_path / name)
        assert run.rc == 0 and run.err == "" and "note:" not in run.out, run
    for graph in ("pfn.onnx", "rpn.onnx"):
        assert (tmp_path / "bf16" / graph).read_bytes() == (tmp_path / "f32" / graph).read_bytes(), graph


def test_a_note_stays_a_note_where_warnings_are_errors(tiny_model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    """``python -W error`` or a CI's PYTHONWARNINGS=error: the command's own notes (an OMP_NUM_THREADS that is no
    thread count, left out) are its output, said as ``note:`` lines; the note was raised as a SettingNotice
    traceback instead, and nothing was written."""
    frame = tmp_path / "a.bin"
    frame.write_bytes(tiny_points(0).tobytes())
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = cli("infer", frame, "--model", tiny_model, "--device", "cpu", "--out", tmp_path / "out", "--no-progress")
    assert run.rc == 0 and run.out.startswith("1/1 frames, "), run
    assert run.err.count("note: OMP_NUM_THREADS='abc' is no thread count") == 1, run.err
    assert output_names(tmp_path / "out") == ["a.json"]


# --------------------------------------------------------------------------- infer: JSON

@pytest.mark.slow
def test_infer_json_equals_api(infer_json: tuple[Run, Path], api_detections: dict[str, Detections], assets: Path):
    run, out = infer_json
    assert run.rc == 0 and "Traceback" not in run.err, run
    assert "3/3 frames" in run.out
    assert output_names(out) == ["000000.json", "000002.json", "000134.json"]  # no temp files left
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
        assert record["num_pillars"] == brute_force_pillar_count(read_points(assets / rel), cfg)


@pytest.mark.slow
def test_infer_json_is_openpcdet_convention_of_native_boxes(infer_json: tuple[Run, Path], model_dir: Path,
                                                             assets: Path, family: str):
    cfg = load_config(CONFIGS[family])
    for rel in (CAMERA_FRAME, FULL_SCAN):
        native = native_reference(read_points(assets / rel), model_dir, cfg)
        boxes = np.asarray(json.loads((infer_json[1] / f"{Path(rel).stem}.json").read_text())["boxes_lidar"])
        assert boxes.shape == native.shape and len(boxes) > 0
        expected = native_to_openpcdet(native, family)
        np.testing.assert_allclose(boxes[:, :6], expected[:, :6], rtol=0, atol=2e-5)
        assert angle_gap(boxes[:, 6], expected[:, 6]).max() < 2e-5


# --------------------------------------------------------------------------- infer: KITTI label_2

def _kitti_tree(assets: Path, root: Path) -> dict[str, Path]:
    """A KITTI-like tree: training 000134 and testing 000002, each with its sibling calib/."""
    frames = {}
    for split, rel in (("training", CAMERA_FRAME), ("testing", TEST_FRAME)):
        stem = Path(rel).stem
        (root / split / "velodyne").mkdir(parents=True)
        (root / split / "calib").mkdir()
        shutil.copy(assets / rel, root / split / "velodyne")
        shutil.copy(assets / f"kitti/{split}/calib/{stem}.txt", root / split / "calib")
        frames[split] = root / split / "velodyne" / f"{stem}.bin"
    return frames


@pytest.mark.slow
def test_infer_kitti_round_trips_to_json(checkpoint: Path, infer_json: tuple[Run, Path], assets: Path,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    frames = _kitti_tree(assets, tmp_path / "kitti")
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    # default: each frame's sibling calib/ (training and testing alike)
    run = cli("infer", frames["training"], frames["testing"], "--model", checkpoint, "--format", "kitti",
              "--out", tmp_path / "out", "--device", "cpu", "--no-progress")
    assert run.rc == 0 and "Traceback" not in run.err, run
    assert output_names(tmp_path / "out") == ["000002.txt", "000134.txt"]

    calib = tmp_path / "kitti/training/calib"
    parsed = kitti_label_to_lidar_boxes(tmp_path / "out" / "000134.txt", read_calibration(calib / "000134.txt"))
    record = json.loads((infer_json[1] / "000134.json").read_text())
    boxes = np.asarray(record["boxes_lidar"])
    assert parsed.names == record["labels"] and len(boxes) > 0
    np.testing.assert_allclose(parsed.scores, record["scores"], rtol=0, atol=6e-5)
    np.testing.assert_allclose(parsed.boxes[:, :6], boxes[:, :6], rtol=0, atol=3e-4)  # 4-decimal camera coords
    assert angle_gap(parsed.boxes[:, 6], boxes[:, 6]).max() < 2e-4


@ONE_FAMILY
@pytest.mark.slow
def test_infer_kitti_wrong_split_calib_is_that_frames_error(model_dir: Path, family: str, assets: Path,
                                                             tmp_path: Path):
    frames = _kitti_tree(assets, tmp_path / "kitti")
    shutil.copy(assets / "kitti/training/calib/000002.txt", tmp_path / "kitti/training/calib")  # same id exists
    out = tmp_path / "out"
    run = cli("infer", frames["training"], frames["testing"], "--model", model_dir, "--format", "kitti",
              "--calib", tmp_path / "kitti/training/calib", "--out", out, "--device", "cpu", "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    errors = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(frames["testing"]) in errors[0], run.err
    assert "'training'" in errors[0] and "'testing'" in errors[0]  # refused, never silently reused
    assert output_names(out) == ["000134.txt"]
    assert "1 of 2 frames failed" in run.err


# --------------------------------------------------------------------------- infer: bad input

@pytest.fixture(scope="module")
def bad_frames(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("frames")
    good = read_points(assets / CAMERA_FRAME)
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


@pytest.mark.slow
def test_infer_bad_frames_in_a_batch(model_dir: Path, bad_frames: dict[str, Path],
                                     api_detections: dict[str, Detections], tmp_path: Path):
    run = cli("infer", *bad_frames.values(), "--model", model_dir, "--out", tmp_path, "--device", "cpu",
              "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    assert "3/4 frames" in run.out  # the missing path gives no frame: an error of its own, counted apart
    assert "1 of 4 frames failed and 1 path gave no frame" in run.err
    failures = sorted(line for line in run.err.splitlines() if line.startswith("error: "))
    assert len(failures) == 2
    assert str(bad_frames["missing"]) in failures[0] and "does not exist" in failures[0]
    assert str(bad_frames["odd"]) in failures[1] and "not a multiple of 16" in failures[1]
    assert output_names(tmp_path) == ["empty.json", "nonfinite.json", "outside.json"]

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
    boxes = np.asarray(nonfinite["boxes_lidar"])
    np.testing.assert_allclose(boxes[:, :6], clean.boxes[:, :6], rtol=0, atol=1e-5)
    assert angle_gap(boxes[:, 6], clean.boxes[:, 6]).max() < 1e-5


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
    # the model dir's checkpoint cannot be rebuilt for a config of the other layout: a checkpoint of it is asked for
    assert_one_line_error(run, str(model_dir), other, "drop --config", "YOUR_CHECKPOINT.pth", f"{family} layout")
    assert f"{other} ({other})" not in run.err


@ONE_FAMILY
def test_infer_refuses_a_precision_its_model_dir_was_not_built_in(model_dir: Path, family: str, assets: Path):
    """A model dir runs as built: ``--precision fp16`` on an fp32 dir is refused with the fix, not ignored."""
    run = cli("infer", assets / CAMERA_FRAME, "--model", model_dir, "--precision", "fp16", "--device", "cpu")
    assert_one_line_error(run, "--precision fp16", str(model_dir), "built in fp32", "build a model dir with --precision fp16")
    run = cli("infer", assets / CAMERA_FRAME, "--model", model_dir, "--precision", "fp32", "--device", "cpu")
    assert run.rc == 0, run


@ONE_FAMILY
@pytest.mark.slow
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
    failures = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert len(failures) == 1 and str(assets / CAMERA_FRAME) in failures[0]
    assert "cannot write" in failures[0] and str(out / "000134.json") in failures[0]
    assert output_names(out) == ["000002.json", "000134.json"] and (out / "000002.json").is_file()


@ONE_FAMILY
def test_infer_refuses_clashing_output_names(model_dir: Path, family: str, assets: Path, tmp_path: Path):
    run = cli("infer", assets / TEST_FRAME, assets / "kitti/training/velodyne/000002.bin", "--model", model_dir,
              "--out", tmp_path / "out")
    assert_one_line_error(run, "same output file")
    assert not (tmp_path / "out").exists()


@ONE_FAMILY
def test_infer_kitti_calib_folder(model_dir: Path, family: str, assets: Path, tmp_path: Path):
    # a --calib that is not a folder: refused up front, nothing written
    run = cli("infer", assets / CAMERA_FRAME, "--model", model_dir, "--format", "kitti", "--calib",
              tmp_path / "nowhere", "--out", tmp_path / "out")
    assert_one_line_error(run, "--calib", "nowhere")
    assert not (tmp_path / "out").exists()
    # no --calib and no sibling calib/: one error before any frame runs, nothing written
    frame = tmp_path / "loose" / "velodyne" / "000134.bin"
    frame.parent.mkdir(parents=True)
    shutil.copy(assets / CAMERA_FRAME, frame)
    run = cli("infer", frame, "--model", model_dir, "--format", "kitti", "--out", tmp_path / "out2",
              "--device", "cpu")
    assert_one_line_error(run, "no calibration folder", "000134.bin")
    assert not (tmp_path / "out2").exists()


# --------------------------------------------------------------------------- demo and the console script

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


# =========================================================================== tiny model (no shared assets)
#
# Everything below runs on the tiny model of tests/tiny.py and generated frames, so it needs no
# download. The tiny model's scores are low, so runs pass loose runtime thresholds (LOOSE) to get boxes.

LOOSE = ("--score-threshold", "0.005", "--nms-iou", "0.5", "--max-boxes", "25")


def one_car_labels(folder: Path, frames: list[Path]) -> Path:
    """``folder``/label_2 holding one KITTI Car line for each frame: ground truth for an --eval run."""
    labels = folder / "label_2"
    labels.mkdir()
    for frame in frames:
        (labels / f"{frame.stem}.txt").write_text(
            "Car 0.00 0 -1.58 587.0 173.3 614.1 200.1 1.65 1.67 3.64 -0.65 1.71 4.6 -1.59\n")
    return labels
KITTI_CALIB = """P0: 7.215377e+02 0.0 6.095593e+02 0.0 0.0 7.215377e+02 1.728540e+02 0.0 0.0 0.0 1.0 0.0
P2: 7.215377e+02 0.0 6.095593e+02 4.485728e+01 0.0 7.215377e+02 1.728540e+02 2.163791e-01 0.0 0.0 1.0 2.745884e-03
R0_rect: 9.999239e-01 9.837760e-03 -7.445048e-03 -9.869795e-03 9.999421e-01 -4.278459e-03 7.402527e-03 4.351614e-03 9.999631e-01
Tr_velo_to_cam: 7.533745e-03 -9.999714e-01 -6.166020e-04 -4.069766e-03 1.480249e-02 7.280733e-04 -9.998902e-01 -7.631618e-02 9.998621e-01 7.523790e-03 1.480755e-02 -2.717806e-01
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", seed=3).path


def tiny_points(seed: int, n: int = 2000) -> np.ndarray:
    """Points inside the tiny model's range (x 0..5.12, y -1.92..1.92), intensities 0..1."""
    rng = np.random.default_rng(seed)
    xyz = rng.uniform((0.2, -1.8, -2.5), (5.0, 1.8, 0.5), (n, 3))
    return np.column_stack([xyz, rng.uniform(0, 1, n)]).astype(np.float32)


@pytest.fixture(scope="module")
def tiny_frames(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Seven .bin frames (one with a '[' in its name) in a KITTI-like training/velodyne folder with calib/."""
    root = tmp_path_factory.mktemp("tinykitti") / "training"
    (root / "velodyne").mkdir(parents=True)
    (root / "calib").mkdir()
    frames = []
    for i in range(7):
        name = f"00000{i}" if i else "scan[0]"
        tiny_points(i).tofile(root / "velodyne" / f"{name}.bin")
        (root / "calib" / f"{name}.txt").write_text(KITTI_CALIB)
        frames.append(root / "velodyne" / f"{name}.bin")
    return frames


def outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in output_paths(folder)}


def test_infer_precision_of_a_model_dir_reads_each_graph_once(tiny_frames: list[Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    """--precision given with a model dir was checked by opening the model dir (reading, hashing and parsing both
    graphs), and the open that runs it read and hashed them again: the precision is read from model.json. One of
    another precision, or damaged, is said as before: the damage first."""
    from graph_reads import count_graph_reads_and_hashes
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model", seed=3).path  # a folder no open in this process has checked
    sizes = sorted((model / f"{graph}.onnx").stat().st_size for graph in ("pfn", "rpn"))
    opened, hashed = count_graph_reads_and_hashes(monkeypatch)
    run = cli("infer", tiny_frames[1], "--model", model, "--precision", "fp32", "--out", tmp_path / "out",
              "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert sorted(opened) == ["pfn.onnx", "rpn.onnx"] and sorted(n for n in hashed if n in sizes) == sizes
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", model, "--precision", "fp16", "--device", "cpu"),
                          "--precision fp16", "built in fp32")
    (model / "rpn.onnx").write_bytes(b"not a graph")
    for precision in ("fp32", "fp16"):
        assert_one_line_error(cli("infer", tiny_frames[1], "--model", model, "--precision", precision, "--device", "cpu"),
                              "rpn.onnx", "damaged or replaced")
    meta = json.loads((model / "model.json").read_text())
    del meta["precision"]
    (model / "model.json").write_text(json.dumps(meta))
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", model, "--precision", "fp32", "--device", "cpu"),
                          "model.json", "missing key 'precision'")


def test_tiny_literal_bracket_name_glob_and_folder(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    bracket = tiny_frames[0]
    assert bracket.name == "scan[0].bin"
    # the literal name works although [0] is a glob class (which would match 'scan0.bin' only)
    run = cli("infer", bracket, "--model", tiny_model, "--out", tmp_path / "a", "--device", "cpu", *LOOSE)
    assert run.rc == 0, run
    assert output_names(tmp_path / "a") == ["scan[0].json"]
    record = json.loads((tmp_path / "a" / "scan[0].json").read_text())
    assert record["frame"] == "scan[0]" and record["num_points"] == 2000 and len(record["scores"]) > 0
    # a glob still expands; a folder gives all its point files
    run = cli("infer", str(bracket.parent / "00000[12].bin"), "--model", tiny_model, "--out", tmp_path / "b",
              "--device", "cpu", "--no-progress")
    assert run.rc == 0 and output_names(tmp_path / "b") == ["000001.json", "000002.json"], run
    run = cli("infer", bracket.parent, "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0 and "7/7 frames" in run.out, run
    assert_one_line_error(cli("infer", str(bracket.parent / "nothing*.bin"), "--model", tiny_model),
                          "no file matches")


def test_tiny_npy_and_pcd_inputs_equal_bin(tiny_model: Path, tmp_path: Path):
    points = tiny_points(11)
    np.save(tmp_path / "f_npy.npy", points.astype(np.float64))
    points.tofile(tmp_path / "f_bin.bin")
    header = ("VERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
              f"WIDTH {len(points)}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {len(points)}\nDATA binary\n")
    (tmp_path / "f_pcd.pcd").write_bytes(header.encode() + points.astype("<f4").tobytes())
    out = tmp_path / "out"
    run = cli("infer", tmp_path / "f_bin.bin", tmp_path / "f_npy.npy", tmp_path / "f_pcd.pcd", "--model",
              tiny_model, "--out", out, "--device", "cpu", "--no-progress", *LOOSE)
    assert run.rc == 0, run
    records = {name: json.loads((out / f"{name}.json").read_text()) for name in ("f_bin", "f_npy", "f_pcd")}
    assert len(records["f_bin"]["scores"]) > 0
    for name in ("f_npy", "f_pcd"):
        for key in ("boxes_lidar", "scores", "labels", "num_points", "num_pillars"):
            assert records[name][key] == records["f_bin"][key], (name, key)


def test_a_pcd_viewpoint_is_warned_once_a_run_and_its_points_read_as_stored(tiny_model: Path, tmp_path: Path):
    """Two .pcd files of one sensor pose (a VIEWPOINT that is not the identity) in one run: one warning, naming the
    first of them and the pose, and each frame detected on its points as stored (the pose not applied): its boxes
    those of a .bin of the same rows. Files of the identity VIEWPOINT: no warning, the same boxes."""
    pose = "0.5 0 1.8 0.9659258 0 0 0.258819"  # 30 degrees about z, 1.8 m up: were it applied, other boxes
    frames: list[Path] = []
    for seed, name in ((12, "a"), (13, "b")):
        points = tiny_points(seed)
        points.tofile(tmp_path / f"{name}_bin.bin")
        for kind, viewpoint in (("pose", pose), ("identity", "0 0 0 1 0 0 0")):
            header = ("VERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
                      f"WIDTH {len(points)}\nHEIGHT 1\nVIEWPOINT {viewpoint}\nPOINTS {len(points)}\nDATA binary\n")
            (tmp_path / f"{name}_{kind}.pcd").write_bytes(header.encode() + points.astype("<f4").tobytes())
        frames.append(tmp_path / f"{name}_bin.bin")
    for kind in ("pose", "identity"):
        out = tmp_path / kind
        posed = [tmp_path / f"{name}_{kind}.pcd" for name in "ab"]
        run = cli("infer", *frames, *posed, "--model", tiny_model, "--out", out, "--device", "cpu", "--no-progress",
                  *LOOSE)
        assert run.rc == 0, run
        said = [line for line in run.err.splitlines() if "VIEWPOINT" in line]
        if kind == "identity":
            assert said == [], run.err
        else:
            assert len(said) == 1 and said[0].startswith(f"warning: {str(posed[0])!r}: its VIEWPOINT {pose} "), run.err
            assert "read as stored" in said[0] and "transform them first" in said[0], said[0]
        for name in "ab":
            from_pcd = json.loads((out / f"{name}_{kind}.json").read_text())
            from_bin = json.loads((out / f"{name}_bin.json").read_text())
            assert len(from_bin["scores"]) > 0
            for key in ("boxes_lidar", "scores", "labels", "num_points", "num_pillars"):
                assert from_pcd[key] == from_bin[key], (kind, name, key)


def test_tiny_transposed_npy_is_refused_with_hint(tiny_model: Path, tmp_path: Path):
    np.save(tmp_path / "transposed.npy", tiny_points(1).T.copy())
    tiny_points(2).tofile(tmp_path / "good.bin")
    run = cli("infer", tmp_path / "transposed.npy", tmp_path / "good.bin", "--model", tiny_model, "--out",
              tmp_path / "out", "--device", "cpu", "--no-progress")
    assert run.rc == 1 and "Traceback" not in run.err, run
    errors = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "transposed.npy" in errors[0] and "looks transposed" in errors[0]
    assert output_names(tmp_path / "out") == ["good.json"]


def test_tiny_point_dim_5(tiny_model: Path, tmp_path: Path):
    points = tiny_points(3, 2001)  # 32016 bytes as 4 values a point: not a multiple of 20
    five = np.column_stack([points, np.arange(len(points), dtype=np.float32)])
    five.tofile(tmp_path / "five.bin")
    points.tofile(tmp_path / "four.bin")
    run = cli("infer", tmp_path / "five.bin", tmp_path / "four.bin", "--point-dim", "5", "--model", tiny_model,
              "--out", tmp_path / "out", "--device", "cpu", "--no-progress")
    assert run.rc == 1 and "not a multiple of 20" in run.err, run  # four.bin read as 5 values a point
    run = cli("infer", tmp_path / "four.bin", "--model", tiny_model, "--out", tmp_path / "ref", "--device", "cpu")
    assert (tmp_path / "out" / "five.json").read_text() == (tmp_path / "ref" / "four.json").read_text() \
        .replace('"four"', '"five"').replace("four.bin", "five.bin")


def test_a_corrupt_intensity_that_overflows_class_scores_is_warned_of_and_counted(tiny_model: Path, tmp_path: Path):
    """One corrupt intensity (3e38) in the second of three frames: the tiny network overflows to NaN class logits
    around it, and the boxes there vanished with nothing said (the first frame's scale was fine; no box held a
    NaN). Now the frame is named in one warning with the fix, its record counts the NaN scores and the pillar
    features beyond float16's range (counted here from the PFN's weights), the count after the run names the
    others, and the usual frame's record counts none."""
    points = tiny_points(4, 500)
    points.tofile(tmp_path / "a.bin")
    for name in ("b", "c"):
        corrupt = points.copy()
        corrupt[7, 3] = 3e38
        corrupt.tofile(tmp_path / f"{name}.bin")
    run = cli("infer", tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin", "--model", tiny_model,
              "--device", "cpu", "--no-progress", "--out", tmp_path / "out")
    records = {name: json.loads((tmp_path / "out" / f"{name}.json").read_text()) for name in "abc"}
    over, features = records["b"]["num_overflowed_scores"], overflowed_pillar_features(tiny_model, corrupt)
    assert run.rc == 0 and records["a"]["num_overflowed_scores"] == 0 and over > 0
    assert records["c"]["num_overflowed_scores"] == over
    assert features > 0 and [records[name]["num_overflowed_features"] for name in "abc"] == [0, features, features]
    said = [line for line in run.err.splitlines() if "overflowed" in line]
    assert said == [
        f"warning: '{tmp_path / 'b.bin'}': {over} of its class scores overflowed (a NaN, infinite or absurd logit), "
        f"so the boxes there are lost; {features} of its pillar features overflowed (beyond float16's 65504), so the "
        "boxes there are meaningless: the network overflowed on values far outside what it was trained on (check "
        "the point layout and the intensity scale, and the file for corrupt values) (warned once)",
        "warning: 2 frames had boxes, class scores or pillar features the network overflowed on in all (the first "
        f"named above; then '{tmp_path / 'c.bin'}')"], run.err


@pytest.mark.slow
def test_tiny_intensity_warning_once(tiny_model: Path, tmp_path: Path):
    for name in ("a", "b"):
        points = tiny_points(4)
        points[:, 3] = np.round(points[:, 3] * 255)
        points.tofile(tmp_path / f"{name}.bin")
    run = cli("infer", tmp_path / "a.bin", tmp_path / "b.bin", "--model", tiny_model, "--device", "cpu",
              "--no-progress")
    # (the tiny model's 256 pillars leave some of these frames' out, and it overflows on 0-255 intensities to boxes
    # of kilometres: those warnings are not counted here)
    warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")
                and "max_pillars" not in line and "overflowed" not in line]
    assert run.rc == 0 and len(warnings) == 2, run  # the first frame's, then the count of them all
    assert str(tmp_path / "a.bin") in warnings[0] and "--intensity-scale" in warnings[0]
    assert warnings[1] == ("warning: 2 frames looked like 0-255 intensities in all (the first named above; then "
                           f"'{tmp_path / 'b.bin'}')"), run
    # scaled: no warning, and the same outputs as the 0-1 frame
    run = cli("infer", tmp_path / "a.bin", "--intensity-scale", str(1 / 255), "--model", tiny_model,
              "--device", "cpu")
    assert run.rc == 0 and "intensities" not in run.err, run
    # a scale the wrong way round is said too, as the scale's doing: 0-1 frames x 255, and 0-255 ones x 255
    unit = tiny_points(4)
    assert unit[:, 3].max() > 0.1
    unit.tofile(tmp_path / "unit.bin")
    for frame, kind in (("unit.bin", "look like 0-255 values"), ("a.bin", "reach beyond 255")):
        run = cli("infer", tmp_path / frame, "--intensity-scale", "255", "--model", tiny_model, "--device", "cpu",
                  "--no-progress")
        warnings = [line for line in run.err.splitlines() if line.startswith("warning: ") and "intensities" in line]
        assert run.rc == 0 and warnings == [
            f"warning: '{tmp_path / frame}': read with --intensity-scale 255, its intensities {kind}, but the model "
            "expects 0-1 reflectance (KITTI); the scale multiplies the file's values: check it (1/255 = "
            "0.00392156862745098 for files of 0-255 values, none for 0-1 files) (warned once)"], run.err


@pytest.mark.slow
def test_intensities_beyond_255_and_overflowing_boxes_are_said_with_the_fix(assets: Path, tmp_path: Path):
    """A KITTI crop with 16-bit intensities (x 65535) through the OpenPCDet-layout checkpoint: both the
    intensities and the boxes the network overflowed on are said, once each, with the file and the fix
    (the summary only counted the dropped boxes)."""
    points = np.fromfile(assets / "kitti/training/velodyne_reduced/000134.bin", "<f4").reshape(-1, 4).copy()
    points[:, 3] *= 65535
    points.tofile(tmp_path / "wide.bin")
    run = cli("infer", tmp_path / "wide.bin", "--model", assets / "checkpoints/pointpillar_openpcdet_synthetic.pth",
              "--device", "cpu", "--no-progress", "--out", tmp_path / "out")
    assert run.rc == 0, run
    record = json.loads((tmp_path / "out" / "wide.json").read_text())
    warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")]
    assert warnings[0] == (f"warning: '{tmp_path / 'wide.bin'}': intensities reach beyond 255, but the model expects "
                           "0-1 reflectance (KITTI): check the point layout (--point-dim, float32 values) and pass "
                           "--intensity-scale for another scale; boxes from such frames mean little (warned once)")
    dropped, overflowed = record["num_nonfinite_boxes"], record["num_overflowed_scores"]
    features = record["num_overflowed_features"]  # intensities up to 65535 x its PFN weights: beyond 65504
    assert dropped > 0 and overflowed > 0 and features > 0 and warnings[1] == (
        f"warning: '{tmp_path / 'wide.bin'}': {dropped} of its boxes held NaN, infinite or absurd values (beyond 10 km, or of no "
        f"size) and were left out; {overflowed} of its class scores overflowed (a NaN, infinite or absurd logit), so "
        f"the boxes there are lost; {features} of its pillar features overflowed (beyond float16's 65504), so the "
        "boxes there are meaningless: the network overflowed on values far outside what it was trained on (check the "
        "point layout and the intensity scale, and the file for corrupt values) (warned once)") and len(warnings) == 2, \
        run.err


@pytest.mark.slow
def test_eval_reads_the_label_files_of_a_frame_the_network_overflowed_on(assets: Path, tmp_path: Path):
    """0-255 intensities through the OpenPCDet-layout checkpoint give finite boxes of kilometres, or of no size;
    their label lines were written, and --eval then refused the run's own files after the run (exit code 2).
    Now they are left out and counted as the overflow they are, and every line written reads back."""
    training = tmp_path / "training"
    (training / "velodyne").mkdir(parents=True)
    points = np.fromfile(assets / "kitti/training/velodyne_fov/000000.bin", "<f4").reshape(-1, 4).copy()
    points[:, 3] *= 255
    points.tofile(training / "velodyne" / "000000.bin")
    shutil.copytree(assets / "kitti/training/calib", training / "calib")
    shutil.copytree(assets / "kitti/training/label_2", training / "label_2")
    run = cli("infer", training / "velodyne" / "000000.bin", "--model",
              assets / "checkpoints/pointpillar_openpcdet_synthetic.pth", "--device", "cpu", "--no-progress",
              "--eval", training / "label_2", "--out", tmp_path / "out")
    assert run.rc == 0 and (tmp_path / "out" / "eval.json").is_file(), run
    assert "boxes held NaN, infinite or absurd values" in run.err and "overflowed, " in run.out, run
    lines = (tmp_path / "out" / "000000.txt").read_text().splitlines()
    sizes = np.array([[float(v) for v in line.split()[8:11]] for line in lines])
    assert len(lines) and (sizes > 0).all() and (np.abs(sizes) <= 1e4).all()


def test_pillars_beyond_max_pillars_are_said(tiny_model: Path, tmp_path: Path):
    """A point in every cell of the tiny model's 32 x 24 grid: 768 pillars, of which its max_pillars (256)
    are kept; the other 512 are said once, with the fix."""
    ix, iy = np.meshgrid(np.arange(32), np.arange(24))
    x, y = (ix.ravel() + 0.5) * 0.16, -1.92 + (iy.ravel() + 0.5) * 0.16
    np.column_stack([x, y, np.zeros_like(x), np.full_like(x, 0.5)]).astype(np.float32).tofile(tmp_path / "dense.bin")
    run = cli("infer", tmp_path / "dense.bin", "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: '{tmp_path / 'dense.bin'}': 512 of its pillars lie beyond the model's "
                        "voxel.max_pillars (256 kept) and were left out, as OpenPCDet leaves them out: a larger "
                        "max_pillars in the model's config keeps frames this dense whole (warned once)"], run.err


def test_calibs_that_are_no_camera_calibration_are_refused_or_said(tiny_model: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    """Three frames in front of the lidar, one calib each: KITTI's (labels written), the camera turned around
    (a true rotation: the FOV crop empties the frame, which is said once with the calib file) and millimetres
    (refused on the frame's error line naming the calib file; the other frames still run)."""
    root = tmp_path / "training"
    (root / "velodyne").mkdir(parents=True)
    (root / "calib").mkdir()
    rng = np.random.default_rng(0)
    points = np.column_stack([rng.uniform(2, 5, 500), rng.uniform(-1, 1, 500), rng.uniform(-1, 0.5, 500),
                              rng.uniform(0, 1, 500)]).astype(np.float32)
    rows = {line.split(":")[0]: line for line in KITTI_CALIB.splitlines()}
    tr = np.array(rows["Tr_velo_to_cam"].split()[1:], dtype=np.float64).reshape(3, 4)
    for name, matrix in (("good", tr), ("turned", np.diag([-1.0, 1, -1]) @ tr), ("millimetres", tr * 1000)):
        points.tofile(root / "velodyne" / f"{name}.bin")
        calib = {**rows, "Tr_velo_to_cam": "Tr_velo_to_cam: " + " ".join(f"{v:.9e}" for v in matrix.ravel())}
        (root / "calib" / f"{name}.txt").write_text("\n".join(calib.values()) + "\n")
    run = cli("infer", root / "velodyne", "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", "kitti",
              "--out", tmp_path / "out", *LOOSE)
    assert run.rc == 1, run
    errors = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: '{root / 'velodyne' / 'millimetres.bin'}': calibration file "
                      f"'{root / 'calib' / 'millimetres.txt'}': the rotation part (3x3) of "
                      "Tr_velo_to_cam is not a rotation (a rotation scaled by 1000 (millimetres?)): it would put every "
                      "point where the camera is not; give the frame's own KITTI calib file"], run.err
    warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: '{root / 'velodyne' / 'turned.bin'}': the camera-FOV crop left none of its 500 "
                        f"points in the model's range: calib file '{root / 'calib' / 'turned.txt'}' puts them all "
                        "outside the camera image (a camera facing backwards or sideways?); check it, or pass "
                        "--no-fov-only (warned once)"], run.err
    assert output_names(tmp_path / "out") == ["good.txt", "turned.txt"]
    assert (tmp_path / "out" / "turned.txt").read_text() == ""
    # a camera image too small for the points, given with --image-shape (it holds the principal point, at its corner;
    # the points lie below it, near the ground): it is named beside the calib file
    low = points.copy()
    low[:, 2] = rng.uniform(-1.7, -1.4, len(low))
    low.tofile(root / "velodyne" / "low.bin")
    (root / "calib" / "low.txt").write_bytes((root / "calib" / "good.txt").read_bytes())
    run = cli("infer", root / "velodyne" / "low.bin", "--model", tiny_model, "--device", "cpu", "--no-progress",
              "--format", "kitti", "--out", tmp_path / "tiny_image", "--image-shape", "174,611", *LOOSE)
    warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")]
    assert run.rc == 0 and warnings == [
        f"warning: '{root / 'velodyne' / 'low.bin'}': the camera-FOV crop left none of its 500 points in the model's "
        f"range: calib file '{root / 'calib' / 'low.txt'}' and --image-shape 174,611 put them all outside the camera "
        "image (a camera facing backwards or sideways, or an image size too small?); check both, or pass "
        "--no-fov-only (warned once)"], run.err
    # a frame given relative to this folder has its calib file named relative too (it was named absolute)
    monkeypatch.chdir(tmp_path)
    run = cli("infer", "training/velodyne/turned.bin", "--model", tiny_model, "--device", "cpu", "--no-progress",
              "--format", "kitti", "--out", "relative", *LOOSE)
    warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")]
    assert run.rc == 0 and warnings == [
        "warning: 'training/velodyne/turned.bin': the camera-FOV crop left none of its 500 points in the model's "
        "range: calib file 'training/calib/turned.txt' puts them all outside the camera image (a camera facing "
        "backwards or sideways?); check it, or pass --no-fov-only (warned once)"], run.err
    # a calib file found in --calib is named as --calib is given, whatever the frame's path (it was named as the frame)
    for frame, calib, named in (("training/velodyne/turned.bin", root / "calib", root / "calib" / "turned.txt"),
                                (root / "velodyne" / "turned.bin", "training/calib", "training/calib/turned.txt")):
        run = cli("infer", frame, "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", "kitti",
                  "--calib", calib, "--out", "given", *LOOSE)
        warnings = [line for line in run.err.splitlines() if line.startswith("warning: ")]
        assert run.rc == 0 and warnings == [
            f"warning: '{frame}': the camera-FOV crop left none of its 500 points in the model's range: calib file "
            f"'{named}' puts them all outside the camera image (a camera facing backwards or sideways?); check it, or "
            "pass --no-fov-only (warned once)"], run.err


def test_an_intensity_warning_is_said_when_its_frame_then_fails(tiny_model: Path, tmp_path: Path):
    """A 0-255 frame's warning is said even though its output cannot be written (a folder stands where its
    JSON goes)."""
    points = tiny_points(4)
    points[:, 3] = np.round(points[:, 3] * 255)
    points.tofile(tmp_path / "a.bin")
    (tmp_path / "out" / "a.json").mkdir(parents=True)
    run = cli("infer", tmp_path / "a.bin", "--model", tiny_model, "--device", "cpu", "--no-progress",
              "--out", tmp_path / "out")
    assert run.rc == 1 and "error: " in run.err, run
    assert f"warning: '{tmp_path / 'a.bin'}': intensities look like 0-255 values" in run.err, run.err


def intensity_warnings(err: str, folder: Path) -> list[str]:
    """The ``warning:`` lines about intensities (the folder's name, which may say "intensity", left out)."""
    return [line for line in err.splitlines()
            if line.startswith("warning: ") and "intensities" in line.replace(str(folder), "")]

def test_each_kind_of_intensity_scale_is_said_after_another_kind_and_unreadable_frames(tiny_model: Path,
                                                                                       tmp_path: Path):
    """A frame whose values all lie 1000 up (intensities beyond 255), three unreadable files, then two 0-255
    frames: each kind gets its own warning naming its first frame with its fix, and the 0-255 frames are
    counted both (a first mismatch of one kind used to stop the check for the rest of the run)."""
    folder = tmp_path / "frames"
    folder.mkdir()
    np.save(folder / "a_far.npy", tiny_points(1) + 1000)
    (folder / "b_cut.bin").write_bytes(b"\0" * 10)
    (folder / "b_junk.npy").write_bytes(b"junk")
    (folder / "b_junk.pcd").write_bytes(b"junk")
    for name in ("c_i255.bin", "d_i255.bin"):
        points = tiny_points(2)
        points[:, 3] *= 255
        points.tofile(folder / name)
    run = cli("infer", folder, "--model", tiny_model, "--device", "cpu", "--no-progress")
    assert run.rc == 1 and run.err.count("error: ") == 3, run
    said = intensity_warnings(run.err, folder)
    assert len(said) == 3, run.err
    assert said[0].startswith(f"warning: '{folder / 'a_far.npy'}': intensities reach beyond 255"), said
    assert said[1].startswith(f"warning: '{folder / 'c_i255.bin'}': intensities look like 0-255 values"), said
    assert "--intensity-scale 0.00392156862745098" in said[1], said
    assert said[2] == ("warning: 2 frames looked like 0-255 intensities in all (the first named above; then "
                       f"'{folder / 'd_i255.bin'}')"), said


def test_frames_of_every_intensity_zero_are_warned_of_once_and_counted(tiny_model: Path, tmp_path: Path):
    """Two frames written without intensities (zeros in their place) among a frame that has them: one warning
    naming the first, with the fix, and the count of both after the run; every frame is written."""
    folder = tmp_path / "frames"
    folder.mkdir()
    for name in ("a_zero.bin", "b_zero.bin", "c_read.bin"):
        points = np.concatenate([tiny_points(4)] * 4)  # over the 1,000 points a frame needs to be judged
        if "zero" in name:
            points[:, 3] = 0.0
        points.tofile(folder / name)
    run = cli("infer", folder, "--model", tiny_model, "--out", tmp_path / "out", "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    said = [line for line in run.err.splitlines() if line.startswith("warning:") and "max_pillars" not in line]
    assert said == [f"warning: '{folder / 'a_zero.bin'}': intensities are all 0 (written without intensities, zeros in "
                    "their place?), but the model was trained on them: write each point's intensity (or check the "
                    "point layout: x, y, z, intensity in that order); boxes from such frames mean little (warned once)",
                    "warning: 2 frames had every intensity 0 in all (the first named above; then "
                    f"'{folder / 'b_zero.bin'}')"], run.err
    assert output_names(tmp_path / "out") == ["a_zero.json", "b_zero.json", "c_read.json"]


def test_the_count_of_0_255_frames_counts_every_frame_of_the_run(tiny_model: Path, tmp_path: Path):
    """Twelve 0-255 frames, one at a time: the line after the run counts all twelve, not only the frames
    read ahead before the first one's warning."""
    folder = tmp_path / "frames"
    folder.mkdir()
    points = tiny_points(3)
    points[:, 3] *= 255
    for index in range(12):
        points.tofile(folder / f"{index:02d}.bin")
    run = cli("infer", folder, "--model", tiny_model, "--device", "cpu", "--no-progress", "--batch-size", "1")
    assert run.rc == 0, run
    said = intensity_warnings(run.err, folder)
    assert len(said) == 2 and said[0].startswith(f"warning: '{folder / '00.bin'}': intensities look like 0-255"), said
    assert said[1] == ("warning: 12 frames looked like 0-255 intensities in all (the first named above; then "
                       f"'{folder / '01.bin'}', '{folder / '02.bin'}', '{folder / '03.bin'}' and 8 more)"), said


@pytest.mark.slow
def test_tiny_batch_size_3_equals_batch_1_byte_for_byte(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 10)
    frames = [*tiny_frames[:3], bad, *tiny_frames[3:]]
    for batch in ("1", "3"):
        run = cli("infer", *frames, "--model", tiny_model, "--out", tmp_path / batch, "--format", "kitti",
                  "--device", "cpu", "--batch-size", batch, "--no-progress", *LOOSE)
        assert run.rc == 1 and "6/7 frames" not in run.out and "7/8 frames" in run.out, run
    assert outputs(tmp_path / "1") == outputs(tmp_path / "3")
    for batch in ("1", "3"):
        run = cli("infer", *tiny_frames, "--model", tiny_model, "--out", tmp_path / f"j{batch}", "--device", "cpu",
                  "--batch-size", batch, "--no-progress", *LOOSE)
        assert run.rc == 0, run
    assert outputs(tmp_path / "j1") == outputs(tmp_path / "j3")
    assert len(outputs(tmp_path / "j1")) == 7


def test_tiny_thresholds_change_outputs_without_rebuild(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    before = outputs(tiny_model)
    counts = {}
    for label, extra in {"loose": LOOSE, "cap3": (*LOOSE[:4], "--max-boxes", "3"),
                         "strict": ("--score-threshold", "0.9")}.items():
        run = cli("infer", tiny_frames[1], "--model", tiny_model, "--out", tmp_path / label, "--device", "cpu", *extra)
        assert run.rc == 0, run
        counts[label] = json.loads((tmp_path / label / "000001.json").read_text())["scores"]
    assert len(counts["loose"]) > 3 and len(counts["cap3"]) == 3 and counts["strict"] == []
    assert counts["cap3"] == counts["loose"][:3]
    assert outputs(tiny_model) == before  # the model dir is untouched
    with pytest.raises(SystemExit):  # argparse's usual error for an out-of-range value
        with contextlib.redirect_stderr(io.StringIO()):
            main(["infer", str(tiny_frames[1]), "--model", str(tiny_model), "--nms-iou", "1.5"])


def test_tiny_kitti_sibling_calib_and_json_headings(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    run = cli("infer", *tiny_frames[1:3], "--model", tiny_model, "--format", "kitti", "--out", tmp_path / "k",
              "--device", "cpu", "--no-progress", *LOOSE)
    assert run.rc == 0, run
    lines = (tmp_path / "k" / "000001.txt").read_text().splitlines()
    assert lines and all(len(line.split()) == 16 for line in lines)
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--out", tmp_path / "j", "--device", "cpu", *LOOSE)
    record = json.loads((tmp_path / "j" / "000001.json").read_text())
    headings = np.asarray(record["boxes_lidar"])[:, 6]
    assert np.all((headings >= -math.pi) & (headings < math.pi)) and record["num_nonfinite_boxes"] == 0
    # the un-normalised headings of this model go past pi, so normalisation did something
    with PointPillars.from_model_dir(tiny_model, device="cpu", score_threshold=0.005, nms_iou=0.5,
                                     max_boxes=25) as detector:
        raw = detector(read_points(tiny_frames[1]))
    assert np.abs(raw.boxes[:, 6]).max() > math.pi
    assert angle_gap(headings, raw.boxes[:, 6]).max() < 1e-5


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A crafted model dir whose box head overflows: exp(200) box sizes are infinite in float32."""
    import dataclasses

    from tiny import tiny_config, tiny_weights
    from pointpillars_trt.convert.export import export_model_dir
    from pointpillars_trt.convert.weights import Conv1x1

    cfg = tiny_config()
    weights = tiny_weights(cfg, seed=3)
    bias = weights.head_box.bias.copy()
    bias[3::7] = 200.0  # dx of every anchor
    weights = dataclasses.replace(weights, head_box=Conv1x1(weights.head_box.weight, bias))
    folder = tmp_path_factory.mktemp("nan") / "model"
    export_model_dir(weights, cfg, folder, precision="fp32", source={"crafted": "overflowing box head"})
    return folder


def test_tiny_nonfinite_boxes_give_strict_json(nan_model: Path, tiny_frames: list[Path], tmp_path: Path):
    run = cli("infer", tiny_frames[1], "--model", nan_model, "--out", tmp_path / "j", "--device", "cpu",
              "--viz", *LOOSE)
    assert run.rc == 0 and "overflowed" in run.out, run
    text = (tmp_path / "j" / "000001.json").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in strict JSON"))
    assert record["num_nonfinite_boxes"] > 0
    assert np.isfinite(np.asarray(record["boxes_lidar"], dtype=np.float64)).all()
    assert len(record["boxes_lidar"]) == len(record["scores"]) == len(record["labels"])
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "j" / "000001.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tiny_viz_writes_pngs(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    pytest.importorskip("matplotlib")
    run = cli("infer", *tiny_frames[1:3], "--model", tiny_model, "--out", tmp_path, "--device", "cpu", "--viz",
              "--no-progress", *LOOSE)
    assert run.rc == 0, run
    assert output_names(tmp_path) == ["000001.json", "000001.png", "000002.json", "000002.png"]
    assert all((tmp_path / f"00000{i}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for i in (1, 2))
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", tiny_model, "--viz"), "--viz needs --out")


def test_tiny_eval_prints_table(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    labels = tmp_path / "label_2"
    labels.mkdir()
    for frame in tiny_frames[1:4]:
        (labels / f"{frame.stem}.txt").write_text(
            "Car 0.00 0 -1.58 587.0 173.3 614.1 200.1 1.65 1.67 3.64 -0.65 1.71 4.6 -1.59\n"
            "DontCare -1 -1 -10 503.8 169.7 590.6 190.1 -1 -1 -1 -1000 -1000 -1000 -10\n")
    out = tmp_path / "out"
    run = cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", out, "--eval", labels, "--device", "cpu",
              "--no-progress", *LOOSE)
    assert run.rc == 0, run
    assert "Car AP@0.70, 0.70, 0.70:" in run.out and "3d   AP:" in run.out
    assert output_names(out) == ["000001.txt", "000002.txt", "000003.txt", "eval.json"]  # kitti by default
    result = json.loads((out / "eval.json").read_text())
    assert "Car" in json.dumps(result)
    # --format json with --eval: JSON outputs, the KITTI predictions go to a temporary folder
    run = cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", tmp_path / "j", "--eval", labels,
              "--format", "json", "--device", "cpu", "--no-progress", *LOOSE)
    assert run.rc == 0 and "Car AP@" in run.out, run
    assert output_names(tmp_path / "j") == ["000001.json", "000002.json", "000003.json", "eval.json"]
    # a frame without a label file: refused before anything runs, naming it (the one there is: no 'e.g.') and the fix
    fix = "give --eval the label_2 folder of these frames' split, or leave the frames without labels out of the run"
    run = cli("infer", *tiny_frames[1:5], "--model", tiny_model, "--out", tmp_path / "x", "--eval", labels)
    assert_one_line_error(run, f"error: --eval '{labels}' has no label file for 1 frame ('000004.txt' for "
                               f"'{tiny_frames[4]}'): {fix}")
    run = cli("infer", *tiny_frames[1:6], "--model", tiny_model, "--out", tmp_path / "x", "--eval", labels)
    assert_one_line_error(run, f"error: --eval '{labels}' has no label file for 2 frames (e.g. '000004.txt' for "
                               f"'{tiny_frames[4]}'): {fix}")
    assert not (tmp_path / "x").exists()
    # the calib folder given for the labels (files of other lines): refused before anything runs, not after
    calib = tmp_path / "calib"
    calib.mkdir()
    for frame in tiny_frames[1:4]:
        (calib / f"{frame.stem}.txt").write_text("P0: 1 0 0 0 0 1 0 0 0 0 1 0\n")
    run = cli("infer", *tiny_frames[1:4], "--model", tiny_model, "--out", tmp_path / "c", "--eval", calib)
    assert_one_line_error(run, f"{calib / '000001.txt'}', line 1: 13 fields, expected 15 (a line P0: ... is a calib "
                               "file's: this is no KITTI label_2 file)")
    assert not (tmp_path / "c").exists() and run.out == ""
    # frames of KITTI's testing split against training labels (the same ids, other scenes): refused too
    testing = tmp_path / "testing" / "velodyne"
    testing.mkdir(parents=True)
    shutil.copy(tiny_frames[1], testing / tiny_frames[1].name)
    shutil.copytree(labels, tmp_path / "training" / "label_2")
    run = cli("infer", testing / tiny_frames[1].name, "--model", tiny_model, "--out", tmp_path / "t", "--eval",
              tmp_path / "training" / "label_2")
    assert_one_line_error(run, "belongs to 'training'", "to 'testing'", "ids overlap")
    assert not (tmp_path / "t").exists()


def test_options_that_a_run_would_ignore_are_refused_while_checking(tiny_model: Path, tiny_frames: list[Path],
                                                                     tmp_path: Path):
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", tiny_model, "--calib", tmp_path),
                          "--calib:", "--format kitti, --eval and --fov-only", "--format json", "drop it")
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", tiny_model, "--image-shape", "100,100",
                              "--calib", tmp_path, "--out", tmp_path / "o"), "--calib and --image-shape:", "drop them")
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["infer", str(tiny_frames[1]), "--model", str(tiny_model), "--max-boxes", "100000"])  # as it parses
    assert exit_info.value.code == 2 and "--max-boxes: '100000': expected an integer in 1..4096" in err.getvalue()


@pytest.mark.parametrize("option, value, said", [
    ("--batch-size", "0", "--batch-size: '0': expected an integer in 1..8"),
    ("--batch-size", "9", "--batch-size: '9': expected an integer in 1..8"),
    ("--pipelines", "17", "--pipelines: '17': expected an integer in 1..16"),
    ("--pipelines", "two", "--pipelines: 'two' is not an integer"),
    ("--score-threshold", "1.5", "--score-threshold: '1.5': expected a number in [0, 1]"),
    ("--nms-iou", "nan", "--nms-iou: 'nan': expected a number in [0, 1]"),
    ("--intensity-scale", "0", "--intensity-scale: '0': expected a number in [1e-06, 1000]"),
    ("--intensity-scale", "1e-300", "--intensity-scale: '1e-300': expected a number in [1e-06, 1000]"),
    # a width of 400 digits was taken, then compared with the calib's principal point as a float: OverflowError
    pytest.param("--image-shape", "375," + "9" * 400, "--image-shape: '375," + "9" * 400 + "': height and width must "
                 "be positive, at most 2147483647 pixels", id="--image-shape-400-digits"),
    ("--image-shape", f"375,{2**31}", f"--image-shape: '375,{2**31}': height and width must be positive, at most"),
])
def test_infer_refuses_values_out_of_range_while_parsing(tiny_model: Path, tiny_frames: list[Path], option: str,
                                                          value: str, said: str):
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["infer", str(tiny_frames[1]), "--model", str(tiny_model), option, value])
    assert exit_info.value.code == 2 and f"argument {said}" in err.getvalue(), err.getvalue()


@pytest.mark.parametrize("words, said", [
    (["infer", "-a.bin"], "the following arguments are required: PATH; '-a.bin' is a file"),
    (["infer", "b.bin", "-a.bin"], "unrecognized arguments: -a.bin; '-a.bin' is a file"),
    (["eval", "--pred", "-a.bin", "--labels", "b"], "argument --pred: expected one argument; '-a.bin' is a file"),
])
def test_a_file_named_with_a_leading_dash_is_named_with_the_word_that_reads_it(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, words: list[str], said: str) -> None:
    """argparse takes a word starting with '-' for an option: the file was reported as an unknown option, or as
    no PATH at all, without a word of how to name it."""
    monkeypatch.chdir(tmp_path)
    np.zeros((10, 4), np.float32).tofile("-a.bin")
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
        main([*words, "--model", str(tiny_model)] if words[0] == "infer" else words)
    assert exit_info.value.code == 2
    assert err.getvalue() == (f"error: pointpillars-trt {words[0]}: {said}, but a word starting with '-' is read as an "
                              f"option: name it ./-a.bin (see pointpillars-trt {words[0]} --help)\n")
    run = cli("infer", "--model", tiny_model, "--out", "out", "./-a.bin")  # as the message says
    assert run.rc == 0 and (tmp_path / "out" / "-a.json").is_file(), run
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:  # the file is only said when
        main(["infer", "--model", str(tiny_model), "--batch-size", "0", "--", "-a.bin"])  # before -- and no option
    assert "is a file" not in err.getvalue()


def test_viz_never_draws_over_a_camera_image_and_redraws_its_own_pictures(tiny_model: Path, tiny_frames: list[Path],
                                                                          tmp_path: Path):
    """--viz into a folder of camera images (KITTI's image_2) is refused before the model loads, the image as it
    was (it was replaced by the bird's-eye view, which later runs took for the camera's size); infer's own
    pictures, and those earlier versions drew (Matplotlib's default "Software" text), are drawn again."""
    pytest.importorskip("matplotlib", reason="--viz draws with matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    images = tmp_path / "image_2"
    images.mkdir()
    camera = images / f"{tiny_frames[1].stem}.png"
    fig = plt.figure(figsize=(2, 1))
    fig.savefig(camera, format="png", metadata={"Software": "a camera driver"})
    plt.close(fig)
    before = camera.read_bytes()
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--viz", "--out", images, "--device", "cpu")
    assert_one_line_error(run, f"'{camera.name}'", "infer did not write", "a picture that pointpillars-trt did not draw")
    assert camera.read_bytes() == before and sorted(p.name for p in images.iterdir()) == [camera.name]
    ours = tmp_path / "ours"
    assert cli("infer", tiny_frames[1], "--model", tiny_model, "--viz", "--out", ours, "--device", "cpu").rc == 0
    picture = ours / camera.name
    assert b"tEXtSoftware\x00pointpillars-trt infer --viz" in picture.read_bytes()[:4096]
    fig = plt.figure(figsize=(2, 1))
    fig.savefig(picture, format="png")  # Matplotlib's own "Software" text, as earlier versions' pictures have
    plt.close(fig)
    assert cli("infer", tiny_frames[1], "--model", tiny_model, "--viz", "--out", ours, "--device", "cpu").rc == 0
    assert b"pointpillars-trt infer --viz" in picture.read_bytes()[:4096]


def test_outputs_infer_did_not_write_are_never_overwritten(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    """--out given as the label or calib folder (or one holding another tool's JSON) is refused before the
    model loads, the files as they were; infer's own outputs, whole or cut short, are rewritten."""
    labels = tmp_path / "label_2"
    labels.mkdir()
    label = "Car 0.00 0 -1.58 587.01 173.33 614.12 200.12 1.65 1.67 3.64 -0.65 1.71 46.70 -1.59\n"
    (labels / "000002.txt").write_text(label * 2)
    run = cli("infer", tiny_frames[1], tiny_frames[2], "--model", tiny_model, "--format", "kitti", "--calib",
              tiny_frames[0].parent.parent / "calib", "--out", labels)
    assert_one_line_error(run, "--out", "'000002.txt'", "infer did not write", "lines of 15 values", "another --out")
    assert (labels / "000002.txt").read_text() == label * 2 and sorted(p.name for p in labels.iterdir()) == ["000002.txt"]
    calib = tiny_frames[0].parent.parent / "calib"
    before = (calib / "000001.txt").read_text()
    assert_one_line_error(cli("infer", tiny_frames[1], "--model", tiny_model, "--format", "kitti", "--calib", calib,
                              "--out", calib), "'000001.txt'", "infer did not write")
    assert (calib / "000001.txt").read_text() == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "000003.json").write_text('{"frame": "000003", "note": "another tool"}\n')
    assert_one_line_error(cli("infer", tiny_frames[3], "--model", tiny_model, "--out", other),
                          "'000003.json'", "JSON that is not a record infer writes")
    assert json.loads((other / "000003.json").read_text())["note"] == "another tool"
    ours = tmp_path / "ours"
    for fmt, name in (("json", "000004.json"), ("kitti", "000004.txt")):
        extra = ["--score-threshold", "0"] + (["--calib", calib] if fmt == "kitti" else [])
        assert cli("infer", tiny_frames[4], "--model", tiny_model, "--format", fmt, *extra, "--out", ours).rc == 0
        whole = (ours / name).read_bytes()
        assert whole.count(b"\n") >= 2 or len(whole) > 1000, whole  # boxes to cut through
        assert cli("infer", tiny_frames[4], "--model", tiny_model, "--format", fmt, *extra, "--out", ours).rc == 0
        (ours / name).write_bytes(whole[: len(whole) // 2])  # cut short, as by a crash
        assert cli("infer", tiny_frames[4], "--model", tiny_model, "--format", fmt, *extra, "--out", ours).rc == 0
        assert (ours / name).read_bytes() == whole

@pytest.mark.parametrize("skip", [(), ("--skip-existing",)], ids=["run", "resume"])
def test_a_json_file_is_redone_only_where_it_may_be_infers_record_cut_short(tiny_model: Path, tiny_frames: list[Path],
                                                                            tmp_path: Path, skip: tuple[str, ...]):
    """``[[[`` in a record's place was overwritten as an incomplete output while ``[]`` was refused as a file infer
    did not write: bytes that do not parse are redone only where they begin as infer's records do (a crash's cut,
    or nothing but NUL bytes), else refused naming the file, as other JSON is."""
    frame = tiny_frames[4]
    base = ("infer", frame, "--model", tiny_model, "--device", "cpu", "--no-progress", "--out")
    whole = tmp_path / "whole"
    assert cli(*base, whole).rc == 0
    record = (whole / "000004.json").read_bytes()
    for name, data in (("broken", b"[[[\n"), ("list", b"[]\n"), ("text", b"frame 000004: no boxes\n")):
        out = tmp_path / name
        out.mkdir()
        (out / "000004.json").write_bytes(data)
        assert_one_line_error(cli(*base, out, *skip), f"--out '{out}' holds '000004.json', which infer did not write")
        assert (out / "000004.json").read_bytes() == data
    for name, data in (("cut", record[:len(record) // 2]), ("head", record[:5]), ("zeros", b"\0" * 4096),
                       ("empty", b"")):
        out = tmp_path / name
        out.mkdir()
        (out / "000004.json").write_bytes(data)
        run = cli(*base, out, *skip)
        assert run.rc == 0 and "error" not in run.err, run
        assert (out / "000004.json").read_bytes() == record
        redoing = f"redoing the frames of 1 empty, incomplete or foreign output file in {out} ('000004.json')"
        assert (redoing in run.err.splitlines()) == bool(skip), run  # the one file there is, not 'e.g.'


#: Values that a record's string fields (``frame``, ``source``) never hold in a record infer writes: each named for
#: its subfolder, with how a message shows it.
_NO_STRING = (("number", 5, "5"), ("null", None, "None"), ("list", ["a.bin"], "['a.bin']"))


@pytest.mark.parametrize("skip", [(), ("--skip-existing",)], ids=["run", "resume"])
@pytest.mark.parametrize("key, values, problem", [
    ("source", _NO_STRING, "not the path of a point file"),
    ("frame", _NO_STRING + (("object", {"id": "000004"}, "{'id': '000004'}"),), "not a frame's name")],
    ids=["source", "frame"])
def test_a_record_whose_source_or_frame_is_no_string_is_refused_naming_its_file_and_field(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path, skip: tuple[str, ...], key: str,
        values: tuple[tuple[str, object, str], ...], problem: str):
    """A record whose ``source`` is a number (or null, or a list) was taken for an earlier version's record, which
    names no source: --skip-existing skipped its frame as done, and a run of another point file of its name replaced
    it unchecked. One whose ``frame`` is no string (another tool's JSON, which eval refuses) was overwritten as a
    record of another frame, with --skip-existing too. infer never writes either: the run is refused in one line
    naming the file and the field, the file as it was."""
    frame = tiny_frames[4]
    base = ("infer", frame, "--model", tiny_model, "--device", "cpu", "--no-progress", "--out")
    whole = tmp_path / "whole"
    assert cli(*base, whole).rc == 0
    record = json.loads((whole / "000004.json").read_text())
    for name, value, shown in values:
        out = tmp_path / name
        out.mkdir()
        data = (json.dumps({**record, key: value}, indent=2) + "\n").encode()
        (out / "000004.json").write_bytes(data)
        run = cli(*base, out, *skip)
        assert run.rc == 2 and run.err == (
            f"error: --out '{out}' holds '000004.json', which infer did not write (its {key!r} is {shown}, {problem}), "
            "and this run would overwrite it: give another --out, or move such files away\n"), run
        assert (out / "000004.json").read_bytes() == data


@pytest.mark.parametrize("fmt", ["jsonl", pytest.param("parquet", marks=pytest.mark.skipif(
    importlib.util.find_spec("pyarrow") is None, reason="pyarrow is not installed (pip install '.[test-scaleout]')"))])
def test_skip_existing_refuses_part_files_that_hold_a_frames_row_twice(tiny_model: Path, tiny_frames: list[Path],
                                                                        tmp_path: Path, fmt: str):
    """A part file copied beside itself (detections-00001 the bytes of detections-00000) gave each frame two rows,
    and --skip-existing said "skipping 2" without a word: it is refused naming both parts and the frames, the
    parts as they were; a line repeated within one part is named so."""
    out = tmp_path / "out"
    frames = tiny_frames[1:3]
    base = ("--model", tiny_model, "--device", "cpu", "--no-progress", "--format", fmt, "--out", out)
    assert cli("infer", *frames, *base).rc == 0
    first, copy = out / f"detections-00000.{fmt}", out / f"detections-00001.{fmt}"
    shutil.copyfile(first, copy)
    before = outputs(out)
    run = cli("infer", *frames, *base, "--skip-existing")
    assert_one_line_error(run, f"error: --skip-existing: '{first}' and '{copy}' both hold a row of 2 frames (e.g. "
                               f"'{frames[0]}'), where a run writes one row a frame (a part copied, or parts merged by "
                               "hand?): move the part that repeats another away")
    assert outputs(out) == before and not run.out
    if fmt == "jsonl":
        copy.unlink()
        line = first.read_text().splitlines(keepends=True)[1]
        first.write_text(first.read_text() + line)
        assert_one_line_error(cli("infer", *frames, *base, "--skip-existing"),
                              f"error: --skip-existing: '{first}' holds two rows of 1 frame ('{frames[1]}')")
    copy.unlink(missing_ok=True)
    first.write_bytes(before[first.name])
    resumed = cli("infer", *frames, *base, "--skip-existing")
    assert resumed.rc == 0 and "skipping 2 frames" in resumed.err, resumed


def test_tiny_duplicate_output_names_refused_up_front(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(tiny_frames[1], other / "000001.npy")  # bytes do not matter: refused before reading
    run = cli("infer", tiny_frames[1], other / "000001.npy", "--model", tiny_model, "--out", tmp_path / "out")
    assert_one_line_error(run, "same output file", "000001.json")
    run = cli("infer", tiny_frames[1], tiny_frames[1], "--model", tiny_model, "--out", tmp_path / "out")
    assert_one_line_error(run, f"frame '{tiny_frames[1]}' is given twice")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- main: one line per error kind

def test_main_error_kinds_are_one_line(tiny_model: Path, tiny_frames: list[Path], tmp_path: Path):
    frame = tiny_frames[1]
    # PointPillarsError
    assert_one_line_error(cli("infer", frame, "--model", tmp_path / "none"), "no such checkpoint file or model dir")
    # a model.json nested 100000 deep (RecursionError in json) or holding a 5000-digit integer (ValueError)
    deep = tmp_path / "deep"
    shutil.copytree(tiny_model, deep)
    (deep / "model.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line_error(cli("infer", frame, "--model", deep, "--device", "cpu"), "RecursionError")
    (deep / "model.json").write_text('{"format_version": ' + "7" * 5000 + "}")
    assert_one_line_error(cli("infer", frame, "--model", deep, "--device", "cpu"), "ValueError")
    # a repeated key, of which json would keep the last silently
    text = (tiny_model / "model.json").read_text()
    (deep / "model.json").write_text(text.replace('{\n', '{\n  "precision": "fp16",\n', 1))
    assert_one_line_error(cli("infer", frame, "--model", deep, "--device", "cpu", "--out", tmp_path / "dup"),
                          f"'{deep / 'model.json'}': unreadable or not valid JSON (key 'precision' appears twice in one "
                          "object)")
    assert not (tmp_path / "dup").exists()
    # OSError: --out below a regular file
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_one_line_error(cli("infer", frame, "--model", tiny_model, "--out", a_file / "out", "--device", "cpu"),
                          str(a_file))
    # an escape sequence in a file name reaches the terminal escaped
    evil = tmp_path / "ev\x1b[31mil.bin"
    evil.write_bytes(b"\0" * 10)  # exists, so taken literally; not a multiple of 16 bytes
    run = cli("infer", evil, "--model", tiny_model, "--device", "cpu")
    assert run.rc == 1 and "\x1b" not in run.err and "\\x1b" in run.err, run


def test_error_message_of_memory_error_and_others():
    from pointpillars_trt.apps.cli import error_message

    assert error_message(MemoryError()) == "out of memory; try a smaller input"  # eval: no --batch-size to offer
    assert error_message(MemoryError(), batched=True) == "out of memory; try a smaller input or --batch-size 1"
    assert "\n" not in error_message(ValueError("two\nlines\x1b[0m"))
    assert error_message(FileNotFoundError(2, "No such file or directory", "a\nb")) == \
        "'a\\nb': No such file or directory"


@pytest.mark.slow
def test_memory_error_is_one_line(tmp_path: Path, repo_root: Path):
    """A real MemoryError: eval parses a 16 MB label file under a tight address-space limit."""
    pytest.importorskip("resource")
    labels, pred = tmp_path / "labels", tmp_path / "pred"
    labels.mkdir()
    pred.mkdir()
    line = "Car 0.00 0 -1.58 587.0 173.3 614.1 200.1 1.65 1.67 3.64 -0.65 1.71 46.7 -1.59\n"
    (labels / "000000.txt").write_text(line * (15_000_000 // len(line)))
    (pred / "000000.txt").write_text(line.rstrip("\n") + " 0.9\n")
    code = ("import resource, sys\n"
            "from pointpillars_trt.apps.cli import main\n"
            "import pointpillars_trt.apps.eval.cli, pointpillars_trt.apps.bench.cli, numpy\n"
            "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
            "resource.setrlimit(resource.RLIMIT_AS, (used + 200 * 2**20, resource.RLIM_INFINITY))\n"
            "sys.exit(main(sys.argv[1:]))\n")
    if not Path("/proc/self/statm").exists():
        pytest.skip("needs /proc")
    done = subprocess.run([sys.executable, "-c", code, "eval", "--pred", str(pred), "--labels", str(labels)],
                          capture_output=True, text=True, timeout=120, cwd=repo_root,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    if done.returncode == 0:
        pytest.skip("the limit was not tight enough to run out of memory here")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory"), done.stderr


def test_version_and_module_help(repo_root: Path):
    from pointpillars_trt import __version__

    with pytest.raises(SystemExit) as exit_info:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            main(["--version"])
    assert exit_info.value.code == 0 and out.getvalue().strip() == f"pointpillars-trt {__version__}"
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "--help"], capture_output=True, text=True,
                          timeout=120, cwd=repo_root)
    assert done.returncode == 0, done.stderr
    for command in ("build", "infer", "demo", "eval", "bench"):
        assert command in done.stdout


def test_every_option_has_help_and_default():
    from pointpillars_trt.apps.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("build", "infer", "demo", "eval", "bench", "serve"):
        command = sub.choices[name]
        formatter = command._get_formatter()
        for action in command._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, (name, action.dest)
            said = formatter._get_help_string(action)  # type: ignore[attr-defined]
            if action.nargs == 0:  # a flag, off unless given: no "(default: False)"
                assert said == action.help, (name, action.dest, said)
                continue
            # each option says its default (a required one, also "required unless ...", that it is required): in
            # its own words, or the formatter's, never both
            required = action.required or "required" in action.help
            assert ("required" if required else "default") in said, (name, action.dest, said)
            assert "default" not in said or not required or said == action.help, (name, action.dest, said)
            assert "default" not in action.help or said == action.help, (name, action.dest, said)


@pytest.mark.slow
def test_rebuild_hint_names_a_working_command(checkpoint: Path, family: str, tmp_path: Path):
    if family != "openpcdet":
        pytest.skip("the OpenPCDet config file fits the OpenPCDet checkpoint")
    pcdet_yaml = Path(__file__).resolve().parent.parent / "data/pcdet/tools/cfgs/kitti_models/pointpillar.yaml"
    model = tmp_path / "m"
    run = cli("build", "--checkpoint", checkpoint, "--out", model, "--pcdet-config", pcdet_yaml)
    assert run.rc == 0 and "openpcdet_kitti_3class" in run.out, run  # OpenPCDet's own YAML: the built-in model
    with pytest.raises(SystemExit) as exit_info:  # argparse: --config not allowed with --pcdet-config
        cli("build", "--checkpoint", checkpoint, "--out", model, "--pcdet-config", pcdet_yaml,
            "--config", "openpcdet_kitti_3class")
    assert exit_info.value.code == 2
    frame = tmp_path / "f.bin"
    tiny_points(0).tofile(frame)
    assert cli("infer", frame, "--model", model, "--config", "openpcdet_kitti_3class", "--device", "cpu").rc == 0
    from importlib import resources

    custom = tmp_path / "my_pointpillar.yaml"  # another model: the dir must be rebuilt for it
    custom.write_text((resources.files("pointpillars_trt") / "configs" / "openpcdet_kitti_3class.yaml").read_text()
                      .replace("name: openpcdet_kitti_3class", "name: my_pointpillar")
                      .replace("max_pillars: 40000", "max_pillars: 30000"))
    run = cli("infer", frame, "--model", model, "--config", custom, "--device", "cpu")
    assert_one_line_error(run, "rebuild", "pointpillars-trt build")
    command = run.err.split("`")[1]
    import shlex

    words = shlex.split(command)
    assert words[:2] == ["pointpillars-trt", "build"]
    rebuilt = cli(*words[1:])
    assert rebuilt.rc == 0, rebuilt
    again = cli("infer", frame, "--model", model, "--config", custom, "--device", "cpu")
    assert again.rc == 0, again


@ONE_FAMILY
def test_an_openpcdet_model_config_given_to_config_names_a_command_that_reads_it(checkpoint: Path, assets: Path,
                                                                                 tmp_path: Path) -> None:
    """OpenPCDet's pointpillar.yaml given to infer's or build's --config names the build command that reads it (with
    the checkpoint given), which runs as written, and then infer of the model dir it wrote; a zhulf0804 checkpoint
    built with --pcdet-config is told to drop --pcdet-config, the option given (not --config)."""
    import shlex

    yaml = Path(__file__).resolve().parent.parent / "data/pcdet/tools/cfgs/kitti_models/pointpillar.yaml"
    frame = assets / CAMERA_FRAME
    run = cli("infer", frame, "--model", checkpoint, "--config", yaml, "--device", "cpu")
    assert_one_line_error(run, f"--config {str(yaml)!r}: an OpenPCDet model config", "which infer does not read",
                          "then run `pointpillars-trt infer PATH --model MODEL_DIR` (no --config)")
    words = shlex.split(run.err.split("`")[1])
    assert words == ["pointpillars-trt", "build", "--checkpoint", str(checkpoint), "--pcdet-config", str(yaml),
                     "--out", "MODEL_DIR"], run.err
    built = cli(*words[1:-1], tmp_path / "m")
    assert built.rc == 0, built
    assert cli("infer", frame, "--model", tmp_path / "m", "--device", "cpu").rc == 0
    run = cli("infer", frame, "--model", tmp_path / "m", "--config", yaml, "--device", "cpu")
    assert_one_line_error(run, "which infer does not read: drop it (model dir", "--out " + str(tmp_path / "m"))
    run = cli("build", "--checkpoint", checkpoint, "--config", yaml, "--out", tmp_path / "m2")
    assert_one_line_error(run, "not one of this package's: give it as --pcdet-config, `pointpillars-trt build "
                               f"--checkpoint {checkpoint} --pcdet-config {yaml} --out {tmp_path / 'm2'}`")
    other = assets / "checkpoints" / CHECKPOINTS["zhulf0804"]
    run = cli("build", "--checkpoint", other, "--pcdet-config", yaml, "--out", tmp_path / "m3")
    assert_one_line_error(run, "zhulf0804 layout", "drop --pcdet-config to read it with zhulf0804_kitti_3class")
    assert "--config" not in run.err.replace("--pcdet-config", "")


@ONE_FAMILY
def test_a_config_given_to_another_option_or_of_another_layout_names_the_option_given(checkpoint: Path, assets: Path,
                                                                                       repo_root: Path, tmp_path: Path):
    """build --pcdet-config of this package's own YAML names --config (not "DATA_CONFIG is missing"), as infer
    --model of it does (not --pcdet-config, which would refuse it); infer --config
    of the other layout's config on a checkpoint is told to drop --config, the option given (infer has no
    --pcdet-config)."""
    own = repo_root / "pointpillars_trt" / "configs" / "openpcdet_kitti_3class.yaml"
    run = cli("build", "--checkpoint", checkpoint, "--pcdet-config", own, "--out", tmp_path / "m")
    assert_one_line_error(run, f"'{own}': one of this package's configs", "give it as --config, not --pcdet-config")
    run = cli("infer", assets / CAMERA_FRAME, "--model", own, "--device", "cpu")
    assert_one_line_error(run, "it is one of this package's configs (family, voxel, ...), which goes beside the "
                               "checkpoint as --config", f"--checkpoint YOUR_CHECKPOINT.pth --config {own} --out")
    run = cli("infer", assets / CAMERA_FRAME, "--model", checkpoint, "--config", "zhulf0804_kitti_3class",
              "--device", "cpu")
    assert_one_line_error(run, "zhulf0804 family; drop --config to read it with openpcdet_kitti_3class")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_pcdet_config_away_from_openpcdets_tree_builds_with_its_tools_folder(checkpoint: Path, family: str,
                                                                              tmp_path: Path):
    """A YAML copied out of OpenPCDet's tree cannot find its _BASE_CONFIG_: the error names the option
    that says where OpenPCDet's tools/ folder is, and that option builds the model."""
    if family != "openpcdet":
        pytest.skip("the OpenPCDet config file fits the OpenPCDet checkpoint")
    tools = Path(__file__).resolve().parent.parent / "data/pcdet/tools"
    alone = tmp_path / "lone" / "pointpillar.yaml"
    alone.parent.mkdir()
    alone.write_bytes((tools / "cfgs/kitti_models/pointpillar.yaml").read_bytes())
    assert_one_line_error(cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--pcdet-config", alone),
                          "_BASE_CONFIG_", "--pcdet-base-dir")
    run = cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m", "--pcdet-config", alone,
              "--pcdet-base-dir", tools)
    assert run.rc == 0 and "openpcdet_kitti_3class" in run.out, run
    assert_one_line_error(cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "m2", "--pcdet-base-dir", tools),
                          "--pcdet-base-dir goes with --pcdet-config")


def test_an_image_shape_taller_than_wide_is_one_warning_in_infer_and_eval(tiny_model: Path, tiny_frames: list[Path],
                                                                         tmp_path: Path) -> None:
    """``--image-shape 1300,1250`` (taller than wide, yet holding the camera's principal point) moves the camera crop
    and the 2D boxes' clipping without an error: infer and eval say so once, before anything runs; a wide image
    says nothing."""
    wrong = ("warning: --image-shape 1300,1250 is HEIGHT,WIDTH: an image 1250 wide and 1300 high; a camera image is "
             "usually wider than high (KITTI's: 375,1242): give 1250,1300 if it is 1300 wide")
    for shape, said in (("1300,1250", [wrong]), ("370,1224", [])):
        run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress", "--format",
                  "kitti", "--out", tmp_path / shape, "--image-shape", shape, *LOOSE)
        assert run.rc == 0 and [line for line in run.err.splitlines() if line.startswith("warning: --image")] == said, run
        labels = tmp_path / f"labels{shape}"
        labels.mkdir()
        (labels / f"{tiny_frames[1].stem}.txt").write_text("")
        run = cli("eval", "--pred", tmp_path / shape, "--labels", labels, "--image-shape", shape)
        assert [line for line in run.err.splitlines() if line.startswith("warning: --image")] == said, run


def test_an_image_shape_given_width_first_is_refused_against_the_calib(tiny_model: Path, tiny_frames: list[Path],
                                                                       tmp_path: Path) -> None:
    """``--image-shape 1224,370`` (KITTI's size written width first) is an image 370 pixels wide, which does not
    hold the camera's principal point (P2's cx 610): infer (its first frame's calib file) and eval (its --calib
    folder) refuse it before anything runs, saying the value meant; an image that holds no principal point either
    way round is refused with what to give."""
    calib = tiny_frames[1].parent.parent / "calib"
    meant = (f"error: --image-shape 1224,370 is HEIGHT,WIDTH: an image 370 wide and 1224 high, which does not hold the "
             f"camera's principal point in {{}} (P2: x 610, y 173): did you mean --image-shape 370,1224?")
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", "kitti",
              "--out", tmp_path / "o", "--image-shape", "1224,370", *LOOSE)
    assert (run.rc, run.out, run.err) == (2, "", meant.format(repr(str(calib / "000001.txt"))) + "\n"), run
    assert not (tmp_path / "o").exists()
    run = cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", "kitti",
              "--out", tmp_path / "o", "--image-shape", "100,100", *LOOSE)
    assert run.rc == 2 and run.err.count("\n") == 1 and run.err.endswith(
        "(P2: x 610, y 173): give the size of the camera images this calibration is of\n"), run
    assert cli("infer", tiny_frames[1], "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", "kitti",
               "--out", tmp_path / "o", "--image-shape", "370,1224", *LOOSE).rc == 0
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / f"{tiny_frames[1].stem}.txt").write_text("")
    run = cli("eval", "--pred", tmp_path / "o", "--labels", labels, "--calib", calib, "--image-shape", "1224,370")
    first = min(path.name for path in calib.iterdir())
    assert (run.rc, run.out, run.err) == (2, "", meant.format(repr(str(calib / first))) + "\n"), run


def test_image_shape_is_height_comma_width_and_a_width_x_height_form_is_refused() -> None:
    """``--image-shape 1242x375`` is KITTI's size written width first: read as H,W it would clip every 2D
    box to a 375-pixel-wide image, so the ``x`` form is refused, saying which order is meant."""
    from pointpillars_trt.apps.ranges import image_shape_arg

    assert image_shape_arg("375,1242") == (375, 1242)
    for text in ("1242x375", "375X1242"):
        with pytest.raises(argparse.ArgumentTypeError, match="HEIGHT,WIDTH.*375,1242.*not WIDTHxHEIGHT"):
            image_shape_arg(text)
    for text in ("375", "a,b", "0,1242"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            image_shape_arg(text)
    assert image_shape_arg(f"375,{2**31 - 1}") == (375, 2**31 - 1)  # a PNG's largest side


def test_eval_of_a_folder_holding_infers_kitti_and_json_outputs_reads_the_kind_format_names(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    """infer writes its --format kitti and json outputs of the same frames into one --out; eval refused such a
    folder ("expected one kind") with no way to evaluate it: it now names --format, which reads the one kind as a
    folder of that kind alone is read; a --format whose files the folder lacks is refused."""
    frames, calib = tiny_frames[1:3], tiny_frames[1].parent.parent / "calib"
    labels = tmp_path / "labels"
    labels.mkdir()
    for frame in frames:
        (labels / f"{frame.stem}.txt").write_text("Car 0.00 0 -1.57 600 160 650 200 1.5 1.6 3.9 0.5 1.6 3.0 0.0\n")
    for out, kinds in (("both", ("kitti", "json")), ("kitti", ("kitti",)), ("json", ("json",))):
        for kind in kinds:
            run = cli("infer", *frames, "--model", tiny_model, "--device", "cpu", "--no-progress", "--format", kind,
                      "--out", tmp_path / out, "--no-fov-only", *LOOSE)
            assert run.rc == 0, run

    def table(folder: str, *options: object) -> str:
        run = cli("eval", "--pred", tmp_path / folder, "--labels", labels, *options)
        assert run.rc == 0, run
        return run.out.replace(str(tmp_path / folder), "PRED")

    run = cli("eval", "--pred", tmp_path / "both", "--labels", labels)
    assert (run.rc, run.out) == (2, ""), run
    assert run.err == (f"error: prediction folder {str(tmp_path / 'both')!r} has both .txt and .json files (infer's "
                       "--format kitti and json outputs share a folder): pass --format kitti to evaluate the .txt files "
                       "or --format json (with --calib) the .json ones\n")
    assert table("both", "--format", "kitti") == table("kitti")
    assert table("both", "--format", "json", "--calib", calib) == table("json", "--calib", calib)
    assert table("json", "--calib", calib) != table("kitti")  # JSON boxes outside the camera image are counted apart
    run = cli("eval", "--pred", tmp_path / "kitti", "--labels", labels, "--format", "json", "--calib", calib)
    assert (run.rc, run.err) == (2, f"error: prediction folder {str(tmp_path / 'kitti')!r} has no .json files "
                                    "(--format json); it holds .txt files\n"), run
