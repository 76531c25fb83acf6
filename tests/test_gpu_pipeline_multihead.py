"""The GPU pipeline on OpenPCDet's multi-head nuScenes model (5-column multi-sweep frames, 10 classes
in 6 heads, velocities) against the CPU path and against the PyTorch re-implementation of OpenPCDet
(tests/_pcdet_multihead_torch.py); elsewhere every test skips with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.detections import Detections
from pointpillars_trt.devices import cuda_available
from pointpillars_trt.pointcloud_io import read_points

pytestmark = pytest.mark.cuda

_REASON = cuda_available()
if _REASON:
    pytest.skip(f"GPU pipeline tests need CUDA: {_REASON}", allow_module_level=True)

from pointpillars_trt.cpu_detector import CpuDetector  # noqa: E402
from pointpillars_trt.gpu_pipeline import GpuPipeline  # noqa: E402
from pointpillars_trt.model_dir import ModelDir  # noqa: E402
from pointpillars_trt.runtime import cudnn_unavailable_reason  # noqa: E402

_CUDNN_REASON = cudnn_unavailable_reason()
if _CUDNN_REASON is not None:
    pytest.skip(f"the multi-head GPU tests run the cuDNN engine: {_CUDNN_REASON}", allow_module_level=True)

CHECKPOINT = "cbgs_pp_multihead_synthetic_dev.pth"
FRAMES = ("nusc_dev_k000000_s05.bin", "nusc_dev_k000002_s02.bin")


@pytest.fixture(scope="module")
def models(nuscenes: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelDir]:
    from pointpillars_trt.convert.export import build_model_dir

    folder = tmp_path_factory.mktemp("nus")
    return {p: build_model_dir(nuscenes / CHECKPOINT, folder / p, precision=p) for p in ("fp32", "fp16")}


@pytest.fixture(scope="module")
def frames(nuscenes: Path) -> list[np.ndarray]:
    return [read_points(nuscenes / f, point_dim=5, columns=5) for f in FRAMES]


@pytest.fixture(scope="module")
def oracle(models: dict[str, ModelDir]) -> Any:
    cpu = CpuDetector(models["fp32"])
    yield cpu
    cpu.close()


@pytest.fixture(scope="module")
def ieee(models: dict[str, ModelDir]) -> Any:
    pipe = GpuPipeline(models["fp32"], backend="cudnn", tf32=False)
    yield pipe
    pipe.close()


def assert_same(got: Detections, want: Detections, what: str) -> None:
    """Box for box: labels, scores within 1e-3, boxes and velocities within 1 cm."""
    assert len(got) == len(want) >= 10, f"{what}: GPU {len(got)} boxes, CPU {len(want)}"
    np.testing.assert_array_equal(got.labels, want.labels, err_msg=what)
    np.testing.assert_allclose(got.scores, want.scores, rtol=0, atol=1e-3, err_msg=what)
    np.testing.assert_allclose(got.boxes, want.boxes, rtol=0, atol=1e-2, err_msg=what)
    assert got.velocity is not None and want.velocity is not None
    np.testing.assert_allclose(got.velocity, want.velocity, rtol=0, atol=1e-2, err_msg=what)


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_ieee_fp32_equals_the_cpu_path_box_for_box(ieee: Any, oracle: Any, frames: list[np.ndarray],
                                                   index: int) -> None:
    got, want = ieee.detect(frames[index]), oracle.detect(frames[index])
    assert_same(got, want, FRAMES[index])
    assert got.stats == want.stats, FRAMES[index]


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_ieee_fp32_equals_openpcdet(ieee: Any, nuscenes: Path, frames: list[np.ndarray], index: int) -> None:
    """Against the PyTorch re-implementation of OpenPCDet's inference, on the checkpoint's own tensors."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent))
    import _pcdet_multihead_torch as pcdet

    from pointpillars_trt.convert.pth import read_pth

    state = {k: np.asarray(v) for k, v in read_pth(nuscenes / CHECKPOINT)["model_state"].items()}
    want = pcdet.detect(state, frames[index])
    got = ieee.detect(frames[index])
    assert (got.labels + 1).tolist() == want["labels"].tolist()
    np.testing.assert_allclose(got.scores, want["scores"], atol=1e-3)
    np.testing.assert_allclose(got.boxes, want["boxes"][:, :7], atol=1e-2)
    np.testing.assert_allclose(got.velocity, want["boxes"][:, 7:], atol=1e-2)


def _nearest_score_gap(ref: Detections, got: Detections, top: int = 10) -> float:
    """Largest score difference of ``ref``'s ``top`` best boxes to the nearest same-label box of ``got``,
    each found within 10 cm."""
    worst = 0.0
    for i in np.argsort(-ref.scores, kind="stable")[:top]:
        box, label = ref.boxes[i], ref.labels[i]
        dist = np.where(got.labels == label, np.linalg.norm(got.boxes[:, :2] - box[:2], axis=1), np.inf)
        assert dist.size and dist.min() < 0.1, (box, ref.scores[i])
        worst = max(worst, float(abs(got.scores[int(np.argmin(dist))] - ref.scores[i])))
    return worst


def test_onnxruntime_cuda_rpn_equals_the_cpu_path(models: dict[str, ModelDir], oracle: Any,
                                                   frames: list[np.ndarray]) -> None:
    """The same pipeline with the RPN in ONNX Runtime's CUDA execution provider (IEEE fp32)."""
    from pointpillars_trt.runtime import onnxruntime_cuda_unavailable_reason

    reason = onnxruntime_cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    pipe = GpuPipeline(models["fp32"], backend="onnxruntime", tf32=False)
    for name, points in zip(FRAMES, frames):
        assert_same(pipe.detect(points), oracle.detect(points), name)
    pipe.close()


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_tensor_core_precisions_find_the_best_boxes(models: dict[str, ModelDir], oracle: Any, frames: list[np.ndarray],
                                                    precision: str) -> None:
    """fp16 (float16 canvas and convs, float32 sums) and tf32 (float32 values, TF32 products), the neck and
    heads on tensor cores: the 10 best boxes of each frame by the IEEE fp32 CPU path are found within 10 cm
    with their labels and scores within 1e-2, as for the KITTI model."""
    pipe = GpuPipeline(models["fp16" if precision == "fp16" else "fp32"], backend="cudnn", tf32=True)
    worst = max(_nearest_score_gap(oracle.detect(points), pipe.detect(points)) for points in frames)
    kernels = pipe._rpn._neck  # type: ignore[union-attr]
    assert kernels.precision == precision and kernels.head_kernel == "head_conv_mma" and all(kernels.neck_on_mma)
    pipe.close()
    print(f"multi-head {precision}: worst best-box score difference {worst:.2e}")
    assert worst < 1e-2


def test_a_batch_and_device_arrays_give_each_frames_boxes(models: dict[str, ModelDir], frames: list[np.ndarray],
                                                          cp: Any) -> None:
    """Batch 2 (one copy of the points, one of the time lags) gives each frame its batch-of-one boxes:
    bit for bit where every conv runs batch 1's cuDNN engine, else within fp16 rounding; CuPy (N, 5)
    inputs give the host arrays' boxes bit for bit."""
    alone = GpuPipeline(models["fp16"], backend="cudnn")
    pipe = GpuPipeline(models["fp16"], backend="cudnn", max_batch=2)
    want = [alone.detect(points) for points in frames]
    got = pipe.detect_batch(frames)
    assert pipe.copies.h2d_copies == 2 and pipe.copies.d2h_copies == 1
    on_device = pipe.detect_batch([cp.asarray(points) for points in frames])
    plans = pipe._rpn._plans.get(2, {})  # type: ignore[union-attr]
    invariant = bool(plans) and all(plan.entry.get("same_as_batch") == 1 for plan in plans.values())
    for a, b, c in zip(want, got, on_device):
        for field in ("boxes", "scores", "labels", "velocity"):
            np.testing.assert_array_equal(getattr(c, field), getattr(b, field))
        if invariant:
            np.testing.assert_array_equal(b.boxes, a.boxes)
            np.testing.assert_array_equal(b.velocity, a.velocity)
        else:
            assert _nearest_score_gap(a, b) < 1e-2
    alone.close()
    pipe.close()


def test_auto_device_runs_the_model_on_the_gpu(models: dict[str, ModelDir]) -> None:
    from pointpillars_trt import PointPillars

    detector = PointPillars.from_model_dir(models["fp16"].path, device="auto")
    assert detector.device == "cuda"
    detector.close()


def test_infer_writes_velocities_through_the_streaming_runner(models: dict[str, ModelDir], nuscenes: Path,
                                                              ieee: Any, frames: list[np.ndarray],
                                                              tmp_path: Path) -> None:
    """``infer --point-dim 5`` on the GPU in IEEE fp32 (the streaming runner stages the time lags beside
    the points): each frame's JSON holds the pipeline's own boxes, class names and velocities."""
    inputs = tmp_path / "frames"
    inputs.mkdir()
    for name in FRAMES:
        (inputs / name).symlink_to(nuscenes / name)
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(inputs), "--model",
                    str(models["fp32"].path), "--point-dim", "5", "--device", "cuda",
                    "--no-tf32", "--batch-size", "8", "--out", str(out)], check=True, capture_output=True, text=True)
    classes = ieee.cfg.classes
    for name, points in zip(FRAMES, frames):
        record = json.loads((out / name.replace(".bin", ".json")).read_text())
        want = ieee.detect(points)
        assert record["labels"] == [classes[i] for i in want.labels.tolist()]
        np.testing.assert_allclose(record["velocity"], want.velocity, atol=1e-3)
        np.testing.assert_allclose(np.asarray(record["boxes_lidar"])[:, :2], want.boxes[:, :2], atol=1e-3)


def test_a_frame_on_the_gpu_has_its_time_lags_checked_as_a_host_frame_once_on_every_path(
        models: dict[str, ModelDir], frames: list[np.ndarray], cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector refuses a NumPy frame whose 5th values are timestamps or whose last two columns are swapped,
    and warns of per-point capture times there; a CuPy frame went to the pipeline unchecked. Now it is checked on
    the GPU with the same messages, alone and in a batch, once on every path (a call, detect_batch, submit_batch,
    infer_many), and a good frame gives the NumPy frame's boxes."""
    import warnings

    from test_pointcloud_io_layout import capture_times

    from pointpillars_trt import PointPillars, device_points
    from pointpillars_trt.errors import InputError, InputWarning

    frame = frames[0]
    stamped = frame.copy()
    stamped[:, 4] += np.float32(1.7e9)
    swapped = np.ascontiguousarray(frame[:, [0, 1, 2, 4, 3]])
    timed = frame.copy()
    timed[:, 4] = capture_times(frame)
    stamped_with_gaps = stamped.copy()  # rows of NaN (no return) among them: judged by the finite lags
    stamped_with_gaps[::7] = np.nan
    with PointPillars.from_model_dir(models["fp32"].path, device="cuda", backend="cudnn", tf32=False) as detector:
        for rows, seen in ((stamped, "its 5th values run from 1.7e+09"), (swapped, "swap the last two"),
                           (stamped_with_gaps, "its 5th values run from 1.7e+09")):
            errors = []
            for points in (rows, cp.asarray(rows)):
                with pytest.raises(InputError) as err:
                    detector(points)
                errors.append(str(err.value))
                with pytest.raises(InputError) as err:
                    detector.detect_batch([frame if isinstance(points, np.ndarray) else cp.asarray(frame), points])
                errors.append(str(err.value))
                errors.append(str([r.error for r in detector.infer_many([points])][0]))
            assert errors[0].startswith("points: ") and seen in errors[0], errors
            assert errors[1] == f"frame 1 of the batch: {errors[0]}" and errors[2] == errors[0], errors
            assert errors[3:] == errors[:3], errors
        said = []
        for points in (timed, cp.asarray(timed)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                detector(points)
            said.append([str(w.message) for w in caught
                         if issubclass(w.category, InputWarning) and "its 5th values take" in str(w.message)])
        assert len(said[0]) == 1 and said[1] == said[0], said

        with_gaps = frame.copy()
        with_gaps[::7] = np.nan
        got, want = detector(cp.asarray(with_gaps)), detector(with_gaps)  # accepted on both
        np.testing.assert_array_equal(got.boxes, want.boxes)
        want = detector(frame)
        checked: list[str] = []
        real = device_points.check_device_time_lags

        def counted(points: object, columns: int, name: str) -> Any:
            checked.append(name)
            return real(points, columns, name)

        monkeypatch.setattr(device_points, "check_device_time_lags", counted)
        on_device = cp.asarray(frame)
        for call in (lambda: [detector(on_device)], lambda: detector.detect_batch([on_device]),
                     lambda: detector.submit_batch([on_device])(),
                     lambda: [r.detections for r in detector.infer_many([on_device])]):
            checked.clear()
            got = call()[0]
            assert checked == ["points"]
            for field in ("boxes", "scores", "labels", "velocity"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
