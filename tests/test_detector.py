"""The public API on the CPU path: ``PointPillars`` from a checkpoint (cached) or a model dir, input
conversion and refusal, ``infer_many`` error isolation, stage timings, and the JSON record.

Oracles: a float32 run of the same frame (for float64 input and ``infer_many``), the file's own bytes,
file modification times (for the cache), and the config's class names.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt import Detections, FrameStats
from pointpillars_trt.config import load_config
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import BackendError, InputError, InputWarning, ModelDirError
from pointpillars_trt.model_dir import ModelDir
from pointpillars_trt.pointcloud_io import read_points
from array_likes import CudaInterfaceOnly
from notices import published_config_notice
from tiny import overflowed_pillar_features

CHECKPOINT = "checkpoints/pointpillar_openpcdet_synthetic.pth"
FRAME = "kitti/training/velodyne_reduced/000134.bin"
STAGES = {"voxelize", "pfn", "scatter", "rpn", "postprocess", "total"}
MODEL_FILES = ("pfn.onnx", "rpn.onnx", "model.json")


def frame_in_range(model, points: int, intensity_top: float = 1.0, seed: int = 0,  # type: ignore[no-untyped-def]
                   x_share: float = 0.3) -> np.ndarray:
    """A frame of ``points`` points spread over ``model``'s point range, intensities uniform in 0..``intensity_top``;
    x over the range's first ``x_share`` only: the tiny model's 10 x 24 pillars there stay below its max_pillars
    (256), so that a frame loses no pillar (which is said) unless a test means it to (``x_share`` 1)."""
    lo, hi = np.split(np.asarray(model.cfg.voxel.point_range, np.float32), 2)
    hi[0] = lo[0] + x_share * (hi[0] - lo[0])
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(lo, hi, (points, 3)), rng.uniform(0, intensity_top, points)]).astype(np.float32)


def assert_same(a: Detections, b: Detections) -> None:
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.stats == b.stats


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def detector(assets: Path, cache: Path):  # type: ignore[no-untyped-def]
    with published_config_notice(assets / CHECKPOINT):  # the cache entry is built here
        det = PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", cache_dir=cache)
    with det:
        yield det


@pytest.fixture(scope="module")
def points(assets: Path) -> np.ndarray:
    return read_points(assets / FRAME)


@pytest.fixture(scope="module")
def expected(detector: PointPillars, points: np.ndarray) -> Detections:
    return detector(points)


def test_from_checkpoint_caches_the_model_dir(detector: PointPillars, assets: Path, cache: Path):
    folder = detector.model.path
    assert folder.parent == cache and detector.device == "cpu"
    mtimes = {name: (folder / name).stat().st_mtime_ns for name in MODEL_FILES}
    with PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", cache_dir=cache) as again:
        assert again.model.path == folder
        assert again.model.metadata == detector.model.metadata
    assert {name: (folder / name).stat().st_mtime_ns for name in MODEL_FILES} == mtimes  # not re-exported
    assert [p.name for p in cache.iterdir()] == [folder.name]


def test_an_openpcdet_checkpoint_without_its_yaml_says_the_published_config_it_is_built_with(assets: Path,
                                                                                             tmp_path: Path) -> None:
    """A checkpoint holds no config: an OpenPCDet one given without its model YAML was built, without a word, with
    the built-in config of OpenPCDet's published YAML, whose thresholds, range and anchors a model trained with a YAML
    of its own does not have. It is said once, as the cache entry is built (not at each open of it), at the caller's
    line; not where a config is given, nor of a zhulf0804 checkpoint (its code base has no config files)."""
    from pointpillars_trt.errors import SettingNotice

    checkpoint = assets / CHECKPOINT
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # the second opens the cached entry
            PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=tmp_path).close()
        PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=tmp_path / "named",
                                     config="openpcdet_kitti_3class").close()
        PointPillars.from_checkpoint(assets / "checkpoints/pointpillars_zhulf0804_synthetic.pth", device="cpu",
                                     cache_dir=tmp_path).close()
    said = [w for w in caught if issubclass(w.category, SettingNotice) and "published" in str(w.message)]
    assert [str(w.message) for w in said] == [
        f"{str(checkpoint)!r}: built with config openpcdet_kitti_3class, OpenPCDet's published "
        "tools/cfgs/kitti_models/pointpillar.yaml (a checkpoint holds no config): for a model trained with a YAML of "
        "its own (another range, anchors, classes or thresholds), build with --pcdet-config ITS_MODEL.yaml (Python: "
        "config=convert.pcdet_config.config_from_pcdet_yaml(path))"]
    assert said[0].filename == __file__


def test_from_model_dir(detector: PointPillars, points: np.ndarray, expected: Detections):
    with PointPillars.from_model_dir(detector.model.path, device="cpu") as det:
        assert det.cfg == detector.cfg
        assert_same(det(points), expected)
    with pytest.raises(ModelDirError, match="from a checkpoint of the zhulf0804 layout"):
        PointPillars.from_model_dir(detector.model.path, config="zhulf0804_kitti_3class", device="cpu")


def test_loaders_refuse_a_path_or_config_of_the_wrong_type_saying_what_to_pass(detector: PointPillars, assets: Path,
                                                                               cache: Path, tmp_path: Path) -> None:
    """None, a number, a list or a NUL for a path, a number or an OpenPCDet config dict for ``config``: each one
    error of the loader's own type naming what to pass (no TypeError / ValueError / AttributeError from deep in
    the loader). A config as a dict of its fields, and a bytes path or name, are taken as what they hold."""
    from pointpillars_trt.errors import CheckpointError, ConfigError

    checkpoint = assets / CHECKPOINT
    for bad in (None, 3, [str(checkpoint)], "a\0b.pth", ""):
        with pytest.raises(CheckpointError, match=r"^checkpoint.*(expected the \.pth file's path|NUL|empty path)"):
            PointPillars.from_checkpoint(bad, device="cpu", cache_dir=cache)  # type: ignore[arg-type]
    for bad in (None, 3, "a\0b"):
        with pytest.raises(ModelDirError, match=r"^model dir.*(expected the path of a folder|NUL)"):
            PointPillars.from_model_dir(bad, device="cpu")  # type: ignore[arg-type]
    for bad in (123, 1.5, [detector.cfg.name]):
        with pytest.raises(ConfigError, match=r"^config: expected a built-in config name .* a ModelConfig, or a dict"):
            PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=cache, config=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^config dict: a: unknown key"):
        PointPillars.from_model_dir(detector.model.path, device="cpu", config={"a": 1})
    with pytest.raises(ConfigError, match=r"an OpenPCDet model config .*config_from_pcdet_yaml\(path\)"):
        PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=cache,
                                     config={"CLASS_NAMES": ["Car"], "MODEL": {"NAME": "PointPillar"}})
    as_dict = detector.cfg.to_dict()
    with PointPillars.from_checkpoint(os.fsencode(checkpoint), device="cpu", cache_dir=cache, config=as_dict) as det:
        assert det.cfg == detector.cfg and det.model.path == detector.model.path
    with PointPillars.from_model_dir(os.fsencode(detector.model.path), device="cpu",
                                     config=os.fsencode(detector.cfg.name)) as det:
        assert det.cfg == detector.cfg


def test_a_cache_dir_that_is_no_folder_is_one_error_naming_it(assets: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A number (a TypeError from pathlib), an empty string (the default cache, silently) and a file (mkdir's
    "File exists") as ``cache_dir``: each one ModelDirError naming cache_dir and what it is."""
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "default"))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for bad, said in ((3, r"cache_dir: expected a folder's path \(a str or pathlib.Path\), or None for the default "
                          r"cache, got 3 \(int\)$"),
                      ("", r"cache_dir: an empty path; pass a folder's path"),
                      (a_file, rf"cache_dir '{re.escape(str(a_file))}' cannot be written \(a file, not a folder\): pass "
                               "a writable cache_dir")):
        with pytest.raises(ModelDirError, match=said):
            PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", cache_dir=bad)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_config_of_another_layout_is_told_to_go_as_the_caller_gave_it(assets: Path, cache: Path) -> None:
    """A config of the other layout: the fix names what the caller gave (no --pcdet-config, which only build
    has): a name, as infer's --config or Python's config= give it, is dropped; a dict is Python's alone."""
    from pointpillars_trt.errors import CheckpointError

    wrong = "checkpoint has the openpcdet layout, but config zhulf0804_kitti_3class is for the zhulf0804 family; "
    with pytest.raises(CheckpointError) as refused:
        PointPillars.from_checkpoint(assets / CHECKPOINT, config="zhulf0804_kitti_3class", device="cpu", cache_dir=cache)
    assert str(refused.value).endswith(wrong + "drop --config to read it with openpcdet_kitti_3class (Python: "
                                               "config=None)")
    with pytest.raises(CheckpointError) as refused:
        PointPillars.from_checkpoint(assets / CHECKPOINT, config=load_config("zhulf0804_kitti_3class").to_dict(),
                                     device="cpu", cache_dir=cache)
    assert str(refused.value).endswith(wrong + "pass config=None to read it with openpcdet_kitti_3class")


def test_result_fields(expected: Detections, points: np.ndarray, detector: PointPillars):
    n = len(expected)
    assert n > 0
    assert expected.boxes.shape == (n, 7) and expected.boxes.dtype == np.float32
    assert expected.scores.shape == (n,) and expected.scores.dtype == np.float32
    assert expected.labels.dtype == np.int32 and expected.class_names == detector.cfg.classes
    assert expected.stats.num_points == points.shape[0] and expected.stats.num_nonfinite == 0
    assert np.all(np.diff(expected.scores) <= 0)  # OpenPCDet: NMS order, descending score
    assert np.all(expected.scores >= np.float32(detector.cfg.postprocess.score_threshold))


def test_float64_input_is_converted(detector: PointPillars, points: np.ndarray, expected: Detections):
    assert_same(detector(points.astype(np.float64)), expected)


@pytest.mark.parametrize("bad", [np.zeros((10, 3), np.float32), np.zeros(40, np.float32),
                                 np.zeros((10, 4), np.int32), [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]],
                                 np.zeros((10, 4), np.float16)],
                         ids=["N3", "flat", "int", "ragged", "float16"])
def test_bad_arrays_are_refused(detector: PointPillars, bad: object):
    with pytest.raises(InputError, match="points"):
        detector(bad)


def test_tensorrt_backend_on_cpu_is_refused(detector: PointPillars, assets: Path, tmp_path: Path):
    with pytest.raises(BackendError, match="GPU pipeline"):
        PointPillars(detector.model, device="cpu", backend="tensorrt")
    with pytest.raises(BackendError, match="GPU pipeline"):  # from a checkpoint: before anything is exported
        PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", backend="tensorrt", cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_device_and_backend_refusals_name_the_python_arguments_too(detector: PointPillars) -> None:
    """A detector opened in Python on a device or backend that cannot run here was told the command line's fix
    alone (--device cpu or auto, --backend auto or onnxruntime): the refusal names the arguments of the call too."""
    from pointpillars_trt.runtime.availability import gpu_visible

    with pytest.raises(BackendError) as info:
        PointPillars(detector.model, device="cpu", backend="tensorrt")
    assert str(info.value) == ("backend 'tensorrt' runs only in the GPU pipeline; the CPU path uses ONNX Runtime (pass "
                               "--backend auto or onnxruntime; Python: backend='auto' or 'onnxruntime'; or run where "
                               "CUDA is available)")
    if gpu_visible():
        pytest.skip("this machine shows an NVIDIA GPU")
    with pytest.raises(BackendError, match=r"^device cuda:1 requested, but this machine shows no NVIDIA GPU .*: run "
                                           r"on the CPU here \(--device cpu or auto; Python: device='cpu' or "
                                           r"'auto'\)$"):
        PointPillars(detector.model, device="cuda:1")


@pytest.mark.slow
def test_infer_many_isolates_a_bad_frame(detector: PointPillars, points: np.ndarray, expected: Detections,
                                         assets: Path, tmp_path: Path):
    missing = tmp_path / "missing.bin"
    frames = [points, str(missing), assets / FRAME, points[:0]]
    results = list(detector.infer_many(frames))
    assert [r.source for r in results] == ["frame 0", str(missing), str(assets / FRAME), "frame 3"]
    good = [results[i] for i in (0, 2, 3)]
    assert all(r.error is None and r.detections is not None for r in good)
    assert results[1].detections is None and isinstance(results[1].error, InputError)
    assert str(missing) in str(results[1].error)
    assert_same(results[0].detections, expected)  # type: ignore[arg-type]
    assert_same(results[2].detections, expected)  # type: ignore[arg-type]
    assert results[3].detections.stats == FrameStats(0)  # type: ignore[union-attr]


def test_last_timings(detector: PointPillars, points: np.ndarray):
    detector(points)
    timings = detector.last_timings
    assert set(timings) == STAGES
    assert all(v >= 0 for v in timings.values())
    assert timings["total"] == pytest.approx(sum(v for k, v in timings.items() if k != "total"), rel=1e-9)


def test_a_frame_of_no_pillar_runs_the_rpn_once_a_detector_and_finds_what_a_full_run_finds(
        detector: PointPillars) -> None:
    """A frame of no pillar in range (no points, or all far outside the model's range) ran the whole RPN on an
    all-zero canvas, about a second here at every such frame: the RPN's output for it is the model's alone, so it
    runs on a detector's first such frame only. A later one's detections, at this call's thresholds, are those a
    new detector's full run finds."""
    from pointpillars_trt.config import Thresholds

    nothing = np.zeros((0, 4), np.float32)
    far = frame_in_range(detector.model, 500)
    far[:, 0] += 1000.0  # 1 km ahead of a model that sees 70 m
    loose = Thresholds(score_threshold=0.0)  # the untrained model's boxes of nothing score below the default
    tight = Thresholds(score_threshold=0.0, nms_iou=0.1, max_boxes=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)  # each kind of frame of no pillar is said once: not the test's
        with PointPillars.from_model_dir(detector.model.path, device="cpu") as fresh:
            far_alone = fresh(far, thresholds=tight)  # its first such frame: the full run
        with PointPillars.from_model_dir(detector.model.path, device="cpu") as cached:
            nothing_alone = cached(nothing, thresholds=loose)  # its first such frame: the full run
            full_rpn = cached.last_timings["rpn"]
            assert len(nothing_alone) > len(far_alone) > 0  # boxes to compare, as each call's thresholds keep them
            for frame, thresholds, alone in ((far, tight, far_alone), (nothing, loose, nothing_alone)):
                assert_same(cached(frame, thresholds=thresholds), alone)
                assert cached.last_timings["rpn"] < full_rpn / 100, (cached.last_timings, full_rpn)


def test_to_json_dict(expected: Detections, detector: PointPillars):
    record = expected.to_json_dict("000134")
    assert json.loads(json.dumps(record)) == record  # plain JSON types only
    assert record["frame"] == "000134"
    assert record["labels"] == [detector.cfg.classes[i] for i in expected.labels.tolist()]
    assert set(record["labels"]) <= {"Car", "Pedestrian", "Cyclist"}
    assert np.asarray(record["boxes_lidar"]).shape == (len(expected), 7)
    boxes = np.asarray(record["boxes_lidar"])
    np.testing.assert_allclose(boxes[:, :6], expected.boxes[:, :6], rtol=0, atol=1e-5)
    assert np.all((boxes[:, 6] >= -np.pi) & (boxes[:, 6] < np.pi))  # headings in one documented range
    turn = (boxes[:, 6] - expected.boxes[:, 6] + np.pi) % (2 * np.pi) - np.pi  # the same angle
    assert np.abs(turn).max() < 1e-5
    np.testing.assert_allclose(record["scores"], expected.scores, rtol=0, atol=1e-6)
    stats = expected.stats
    assert (record["num_points"], record["num_pillars"], record["num_pillars_dropped"],
            record["num_nonfinite_points"]) == (stats.num_points, stats.num_pillars, stats.num_pillars_dropped,
                                                stats.num_nonfinite)


def test_detect_batch_and_batched_infer_many_equal_one_by_one(tmp_path: Path) -> None:
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    rng = np.random.default_rng(5)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    frames = [np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32)
              for n in (0, 50, 900, 7)]
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 10)  # not a multiple of 16 bytes
    with PointPillars(model, device="cpu") as detector:
        singles = [detector(f) for f in frames]
        batched = detector.detect_batch(frames)
        streamed = list(detector.infer_many([frames[0], str(bad), *frames[1:]], batch_size=3))
    assert [r.source for r in streamed] == ["frame 0", str(bad), "frame 2", "frame 3", "frame 4"]
    assert streamed[1].error is not None and streamed[1].detections is None
    for one, many, result in zip(singles, batched, [streamed[0], *streamed[2:]]):
        assert result.detections is not None
        for other in (many, result.detections):
            np.testing.assert_array_equal(one.boxes, other.boxes)
            np.testing.assert_array_equal(one.scores, other.scores)


def test_what_is_not_a_list_of_frames_is_one_input_error_naming_it(tmp_path: Path) -> None:
    """``detect_batch`` / ``submit_batch`` take a list of frames: None or a number (once a bare TypeError
    from the loop), a path (its characters) or one frame alone (its points, each refused as a frame of
    shape (4,)) is refused up front with what to pass; a stack of equal frames (B, N, 4) is still a batch;
    a float16 frame is refused by its place in the batch, with the dtype's fix. A dict (its keys would be the
    frames) is refused naming its values, by infer_many too."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    rng = np.random.default_rng(6)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    frames = [np.column_stack([rng.uniform(lo, hi, (300, 3)), rng.uniform(0, 1, 300)]).astype(np.float32)
              for _ in range(2)]
    refused = [(None, r"got None \(NoneType\): pass \[points\]"), (5, r"got 5 \(int\)"),
               (frames[0], r"got one array of shape \(300, 4\): pass \[points\], or call detector\(points\)"),
               (frames[0][0], r"got one array of shape \(4,\)"),
               ("000134.bin", "got the path '000134.bin': read it with .*read_points, or pass paths to infer_many"),
               ({"a": frames[0]}, r"got a dict, whose keys would be taken as the frames: pass list\(frames.values\(\)\)")]
    with PointPillars(model, device="cpu") as detector:
        for given, message in refused:
            for call in (detector.detect_batch, detector.submit_batch):
                with pytest.raises(InputError, match=r"^frames: expected a list of frames \(\(N, 4\) arrays\), "
                                                     + message):
                    call(given)
        with pytest.raises(InputError, match=r"^frames: .*got a dict, whose keys .*: pass list\(frames.values\(\)\)"):
            detector.infer_many({"a": frames[0]})
        for one, other in zip(detector.detect_batch(np.stack(frames)), detector.detect_batch(frames)):
            assert_same(one, other)
        with pytest.raises(InputError, match=r"^frame 1 of the batch: .* dtype float16.*points.astype\(np.float32\)"):
            detector.detect_batch([frames[0], frames[1].astype(np.float16)])


def test_an_array_of_rows_wider_than_a_point_is_refused_as_a_npy_of_them_is(tmp_path: Path) -> None:
    """A lidar's range image (64 beams x 2048 azimuths) given to detect, detect_batch or infer_many was detected on as
    64 points of each row's first 4 pixels, where read_points refuses it saved as .npy; rows as wide as the widest
    point (64 values) are still points."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    image = np.random.default_rng(0).random((64, 2048)).astype(np.float32) * 50
    problem = (r"got shape \(64, 2048\): rows of 2048 values, where a point has 4 to 64 \(x, y, z, intensity first\); "
               r"an image or another array, not a point list\?$")
    widest = np.zeros((3, 64), np.float32)
    widest[:, :4] = [[1.0, 2.0, -1.0, 0.5], [10.0, -3.0, -1.0, 0.2], [20.0, 5.0, 0.0, 0.9]]
    with PointPillars(model, device="cpu") as detector:
        with pytest.raises(InputError, match=r"^points: expected an \(N, 4\) array .*; " + problem):
            detector(image)
        with pytest.raises(InputError, match=r"^frame 1 of the batch: .*; " + problem):
            detector.detect_batch([widest, image])
        streamed = list(detector.infer_many([widest, image]))
        assert streamed[0].error is None and streamed[1].detections is None
        assert re.search(problem, str(streamed[1].error)), streamed[1].error
        assert_same(detector(widest), detector(np.ascontiguousarray(widest[:, :4])))


def test_a_gpu_array_given_to_a_cpu_detector_is_named_so_with_the_fix(tmp_path: Path) -> None:
    """An array known by the CUDA array interface alone was refused as "expected an (N, 4) array ...; got shape ()",
    no word of where it lies."""
    from tiny import tiny_model_dir

    message = (r": a GPU array \(CUDA\), given to a detector on the CPU, which reads host arrays: copy it to the host "
               r"first \(CuPy: points.get\(\); Numba: points.copy_to_host\(\)\), or open the detector on the GPU "
               r"\(device='cuda'\), which reads it where it lies$")
    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        with pytest.raises(InputError, match="^points" + message):
            detector(CudaInterfaceOnly((100, 4)))
        with pytest.raises(InputError, match="^frame 0 of the batch: points" + message):
            detector.detect_batch([CudaInterfaceOnly((100, 4))])


@pytest.mark.slow
def test_runtime_thresholds_need_no_rebuild(tmp_path: Path) -> None:
    """score_threshold / nms_iou / max_boxes change the output, not the model dir (same digest, same files)."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    before = {p.name: p.read_bytes() for p in model.path.iterdir()}
    rng = np.random.default_rng(1)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    points = np.column_stack([rng.uniform(lo, hi, (3000, 3)), rng.uniform(0, 1, 3000)]).astype(np.float32)
    with PointPillars(model, device="cpu", score_threshold=0.0, nms_iou=1.0) as loose:
        everything = loose(points)
    with PointPillars(model, device="cpu", score_threshold=0.0, nms_iou=1.0, max_boxes=3) as capped:
        three = capped(points)
    assert len(everything) > 3 and len(three) == 3
    np.testing.assert_array_equal(three.scores, everything.scores[:3])  # the top three by score
    with PointPillars(model, device="cpu", score_threshold=float(everything.scores[5]), nms_iou=1.0) as strict:
        assert np.all(strict(points).scores >= everything.scores[5]) and len(strict(points)) <= 6
    assert {p.name: p.read_bytes() for p in model.path.iterdir()} == before
    with pytest.raises(Exception, match="nms_iou"):
        PointPillars(model, device="cpu", nms_iou=float("nan"))


def test_per_call_thresholds_equal_a_detector_opened_with_them(tmp_path: Path) -> None:
    """``detector(points, thresholds=...)`` / ``detect_batch(..., thresholds=...)`` / ``infer_many(...,
    thresholds=...)`` give what a detector opened with those values gives, for that call only; max boxes
    above the detector's is refused (by ``infer_many`` at the call)."""
    from tiny import tiny_model_dir

    from pointpillars_trt.config import Thresholds
    from pointpillars_trt.errors import ConfigError

    model = tiny_model_dir(tmp_path / "m", seed=3)
    rng = np.random.default_rng(2)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    frames = [np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32)
              for n in (1500, 400)]
    settings = [Thresholds(score_threshold=0.0), Thresholds(score_threshold=0.0, nms_iou=0.05),
                Thresholds(score_threshold=0.0, nms_iou=0.1, max_boxes=4)]
    with PointPillars(model, device="cpu") as detector:
        default = [detector(f) for f in frames]
        for index, frame in enumerate(frames):
            frame.tofile(tmp_path / f"{index}.bin")
        paths = [str(tmp_path / f"{index}.bin") for index in range(len(frames))]
        per_call = {t: (detector(frames[0], thresholds=t), detector.detect_batch(frames, thresholds=t),
                        [r.detections for r in detector.infer_many(paths, batch_size=2, thresholds=t)])
                    for t in settings}
        assert_same(detector(frames[0]), default[0])  # the call's values do not stick
        with pytest.raises(ConfigError, match="max_boxes 501: the detector was opened with max_boxes 500"):
            detector(frames[0], thresholds=Thresholds(max_boxes=501))
        with pytest.raises(ConfigError, match="score_threshold"):
            detector.detect_batch(frames, thresholds=Thresholds(score_threshold=-1.0))
        with pytest.raises(ConfigError, match="max_boxes 501"):
            detector.infer_many(paths, thresholds=Thresholds(max_boxes=501))
    lengths = set()
    for t, (single, batch, streamed) in per_call.items():
        with PointPillars(model, device="cpu", score_threshold=t.score_threshold, nms_iou=t.nms_iou,
                          max_boxes=t.max_boxes) as opened:
            assert_same(single, opened(frames[0]))
            for got, frame in zip(batch, frames):
                assert_same(got, opened(frame))
            for got, frame in zip(streamed, frames):
                assert_same(got, opened(frame))
        lengths.add(len(single))
    assert len(lengths | {len(default[0])}) == 4, "every setting must change the result to test anything"


def test_infer_many_turns_every_unreadable_frame_into_that_frames_error(tmp_path: Path) -> None:
    """A FIFO, a folder, a file of the wrong size, a transposed .npy and an unknown extension: each is its
    frame's one-line error, and the good frame still gets its detections."""
    import os

    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)
    os.mkfifo(tmp_path / "pipe.bin")
    (tmp_path / "odd.bin").write_bytes(b"\0" * 10)
    np.save(tmp_path / "wide.npy", np.zeros((4, 100), np.float32))
    (tmp_path / "frame.xyz").write_text("1 2 3 4\n")
    (tmp_path / "folder.bin").mkdir()
    bad = ["pipe.bin", "odd.bin", "wide.npy", "frame.xyz", "folder.bin"]
    with PointPillars(model, device="cpu") as detector:
        results = list(detector.infer_many([str(tmp_path / n) for n in [*bad, "good.bin"]], batch_size=2))
    for result in results[:-1]:
        assert result.detections is None and isinstance(result.error, InputError), result
        assert "\n" not in str(result.error)
    assert results[-1].error is None and results[-1].detections is not None


def test_infer_many_reads_bytes_paths_and_says_a_folder_is_one(tmp_path: Path) -> None:
    """A bytes path (as os.fsencode gives) is read as the file it names, with the same detections as its str
    path; a folder with no extension is said to be a folder, with how to list its files of the kind it holds
    (.pcd here), not that it has no extension."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    frames = tmp_path / "frames"
    frames.mkdir()
    good = frames / "good.bin"
    frame_in_range(model, 400, seed=2).tofile(good)
    clouds = tmp_path / "clouds"
    clouds.mkdir()
    (clouds / "a.pcd").write_bytes(b"")
    with PointPillars(model, device="cpu") as detector:
        as_str, as_bytes, folder = detector.infer_many([str(good), os.fsencode(good), str(clouds)])
    assert as_bytes.source == str(good) and as_bytes.error is None and as_str.detections is not None
    assert as_bytes.detections is not None
    assert_same(as_bytes.detections, as_str.detections)
    assert folder.detections is None and isinstance(folder.error, InputError)
    assert str(folder.error) == (f"point file {str(clouds)!r} is a folder, not a point file: pass its files, e.g. "
                                 f"sorted(Path({str(clouds)!r}).glob('*.pcd'))")


def test_infer_many_yields_failed_reads_at_once_however_many_in_a_row(tmp_path: Path) -> None:
    """Thousands of unreadable paths in a row: each error comes out as soon as the frames before it did
    (from a generator no path is taken beyond the batch being filled), so memory and time stay flat; then a
    good frame."""
    from tiny import tiny_model_dir

    consumed = 0
    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)

    def paths():  # type: ignore[no-untyped-def]
        nonlocal consumed
        for index in range(5000):
            consumed += 1
            yield str(tmp_path / f"missing{index}.bin")
        consumed += 1
        yield str(good)

    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        results = detector.infer_many(paths(), batch_size=4)
        first = next(results)
        assert first.error is not None and "missing0.bin" in first.source and consumed <= 4
        rest = list(results)
    assert len(rest) == 5000 and all(r.error is not None for r in rest[:-1])
    assert rest[-1].error is None and rest[-1].detections is not None


def test_infer_many_stopped_early_leaves_no_reader_thread(tmp_path: Path) -> None:
    """A caller that stops after the first result of a long list: the reader threads end with the iterator
    (not when it is collected), at once."""
    import threading
    import time

    from tiny import tiny_model_dir

    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)
    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        results = detector.infer_many([str(good)] * 1000, batch_size=2)
        assert next(results).error is None
        start = time.perf_counter()
        results.close()
        assert time.perf_counter() - start < 1.0
        assert not [t for t in threading.enumerate() if t.name.startswith("pp-infer-many")]


def test_infer_many_takes_from_a_generator_no_frame_beyond_the_batch(tmp_path: Path) -> None:
    """From a generator (a live source) a batch's results come before the next frame is taken (they never
    wait for a frame that has not come yet), and what the generator raises comes after the results of the
    frames it gave before."""
    from tiny import tiny_model_dir

    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)
    given = 0

    def frames():  # type: ignore[no-untyped-def]
        nonlocal given
        for _ in range(6):
            given += 1
            yield str(good)
        raise OSError("the sensor went away")

    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        for batch in (1, 4):
            given, seen = 0, []
            with pytest.raises(OSError, match="the sensor went away"):
                for result in detector.infer_many(frames(), batch_size=batch):
                    assert given == min(6, -(-(len(seen) + 1) // batch) * batch), batch  # this batch's frames only
                    seen.append(result)
            assert len(seen) == 6 and all(r.error is None for r in seen)


def test_infer_many_runs_a_generators_last_part_batch_that_ends_in_a_failed_read(tmp_path: Path) -> None:
    """A generator that ends after three good frames and a missing file, batches of 4: the part batch is
    still run when the generator ends, its failure in its place."""
    from tiny import tiny_model_dir

    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)

    def frames():  # type: ignore[no-untyped-def]
        yield from [str(good)] * 3
        yield str(tmp_path / "missing.bin")

    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        results = list(detector.infer_many(frames(), batch_size=4))
    assert [r.error is None for r in results] == [True, True, True, False]
    assert "missing.bin" in results[3].source and all(r.detections is not None for r in results[:3])


def test_infer_many_runs_each_group_of_batch_size_frames_as_one_batch(tmp_path: Path) -> None:
    """Batches of 3 over 8 paths with a missing file at place 4: the frames go in groups of 3 paths, each one
    batch of the engine less its failed reads (3, 2, 2), each frame's detections those of running it alone. A
    batch size of 10**9 over two paths is one batch of 2 (no staging made for the batch size); a NumPy array of
    paths runs as their list."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    paths = []
    for index in range(7):
        paths.append(str(tmp_path / f"{index}.bin"))
        frame_in_range(model, 500 * (index + 1), seed=index).tofile(paths[-1])
    paths.insert(4, str(tmp_path / "missing.bin"))
    with PointPillars(model, device="cpu", score_threshold=0.0) as detector:  # the random model's boxes, every one
        batches: list[int] = []
        impl = detector._impl
        run_batch = impl.detect_batch
        impl.detect_batch = lambda frames, post: (batches.append(len(frames)), run_batch(frames, post))[1]  # type: ignore[method-assign]
        results = list(detector.infer_many(paths, batch_size=3))
        huge = list(detector.infer_many(paths[:2], batch_size=10**9))  # its staging: sized by the frames read
        assert [r.error is None for r in detector.infer_many(np.array(paths[:2]))] == [True, True]  # paths' array
        impl.detect_batch = run_batch  # type: ignore[method-assign]
        alone = [detector.detect_batch([read_points(path)])[0] for path in paths if "missing" not in path]
    assert batches == [3, 2, 2, 2, 1, 1] and [r.source for r in results] == paths
    assert [r.detections.boxes.tobytes() for r in huge] == [r.detections.boxes.tobytes() for r in results[:2]]
    assert results[4].error is not None and "missing.bin" in str(results[4].error)
    found = [r.detections for r in results if r.error is None]
    assert all(len(d) for d in found) and [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]


def test_infer_many_grows_its_staging_for_frames_that_did_not_fit_not_for_failed_reads(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """From a generator, batches of 2 (fresh buffers of 65,536 rows): a group of 5,000 + 70,000 points did not
    fit, so the next buffers hold 131,072 rows; a file of 1 M rows of random bytes (refused when read) grows
    nothing. Each frame's detections are those of running it alone."""
    import pointpillars_trt.detector as detector_module
    from pointpillars_trt.staging import StagingBuffer
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    sizes = {"a": 5000, "big": 70_000, "b": 5000, "c": 5000, "d": 5000}
    for seed, (name, n) in enumerate(sizes.items()):
        frame_in_range(model, n, seed=seed).tofile(tmp_path / f"{name}.bin")
    (tmp_path / "noise.bin").write_bytes(np.random.default_rng(4).bytes(16 * 2**20))
    order = ["a", "big", "b", "noise", "c", "d"]
    made: list[int] = []

    class Recorded(StagingBuffer):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(self.capacity)

    monkeypatch.setattr(detector_module, "StagingBuffer", Recorded)
    with PointPillars(model, device="cpu", score_threshold=0.0) as detector:  # the random model's boxes, every one
        results = list(detector.infer_many((str(tmp_path / f"{name}.bin") for name in order), batch_size=2))
        alone = [detector(read_points(tmp_path / f"{name}.bin")) for name in order if name != "noise"]
    assert made == [65_536, 131_072]
    assert [r.error is None for r in results] == [name != "noise" for name in order]
    assert all(len(d) for d in alone)
    assert [r.detections.boxes.tobytes() for r in results if r.error is None] == [d.boxes.tobytes() for d in alone]


def test_infer_manys_staging_goes_to_ordinary_memory_once_page_locked_memory_runs_out() -> None:
    """A page-locked allocation that fails: said once, and that buffer and every later one are ordinary memory
    (the GPU copies from it too); the page-locked allocator is not asked again."""
    import warnings

    from pointpillars_trt.detector import _StagingPool
    from pointpillars_trt.staging import PageLockedOrOrdinary

    asked: list[tuple[int, ...]] = []

    def page_locked(shape: tuple[int, ...], dtype: type) -> np.ndarray:
        asked.append(shape)
        raise MemoryError("out of page-locked memory")

    pool = _StagingPool(1000, 4, PageLockedOrOrdinary(page_locked))
    with pytest.warns(RuntimeWarning, match="page-locked memory .* could not be had .*out of page-locked memory"):
        first = pool.take()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = pool.take()
    assert len(asked) == 1 and first.capacity == second.capacity == 1024 and first.rows is not second.rows


def test_infer_many_gives_a_misbehaving_path_like_its_own_error_and_checks_its_arguments_at_the_call(
        tmp_path: Path) -> None:
    """A path-like whose ``__fspath__`` raises fails alone (named by its place; the frames before and after it
    keep their results); one that gives bytes reads as its path; ``point_dim`` is refused at the call, not as
    every file's error; a huge batch size takes no more than 8 frames from a generator before the first
    result."""
    import os

    from tiny import tiny_model_dir

    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)

    class Broken(os.PathLike):  # type: ignore[type-arg]
        def __fspath__(self) -> str:
            raise RuntimeError("no path today")

    class AsBytes(os.PathLike):  # type: ignore[type-arg]
        def __fspath__(self) -> bytes:
            return os.fsencode(good)

    taken = 0

    def frames():  # type: ignore[no-untyped-def]
        nonlocal taken
        while True:
            taken += 1
            yield str(good)

    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        results = list(detector.infer_many([str(good), Broken(), AsBytes(), str(good)], batch_size=4))
        for bad in (0, 3, "4", True, 4.0, 10**9):
            with pytest.raises(InputError, match="point_dim .* is not an integer from 4 to 64"):
                detector.infer_many([str(good)], point_dim=bad)  # type: ignore[arg-type]
        assert next(detector.infer_many(frames(), batch_size=10**9)).error is None and taken == 8
    assert [r.error is None for r in results] == [True, False, True, True]
    assert results[1].source == "frame 1" and "(RuntimeError: 'no path today')" in str(results[1].error)
    assert results[2].source == str(good)


def test_warm_up_refuses_what_is_not_a_frame_size_or_a_batch_size(tmp_path: Path) -> None:
    """Sizes that would build a frame of billions of points, or batches of a million frames, or that are no
    numbers, are refused before any frame is made; 0 points means the default, as a run of empty files gives."""
    from tiny import tiny_model_dir
    from pointpillars_trt.errors import PointPillarsError

    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        for points in (10**9, -5, float("nan"), float("inf"), "100"):
            with pytest.raises(PointPillarsError, match="points_per_frame: expected an int from 1 to 16777216"):
                detector.warm_up(points_per_frame=points)  # type: ignore[arg-type]
        for sizes in ("2", [2.5], [None], 5, [10**6], [0], [-1]):
            with pytest.raises(PointPillarsError, match="batch_sizes: expected"):
                detector.warm_up(sizes, points_per_frame=100)  # type: ignore[arg-type]
        detector.warm_up([np.int64(2)], points_per_frame=0)


SECOND_FRAME = "kitti/testing/velodyne_reduced/000002.bin"
WAITING_FOR_FINISH = r"a batch given to submit_batch is waiting for its finish\(\): call finish\(\) before"


def test_submit_batch_holds_the_detector_until_finish_on_the_cpu_as_on_the_gpu(
        assets: Path, cache: Path, points: np.ndarray, expected: Detections) -> None:
    """A batch given to ``submit_batch``: until its ``finish`` every other batch is refused naming finish (the CPU
    path ran them, where the GPU pipeline refused them as "submit() called twice without collect()"); a bad frame
    fails alone and leaves the detector free; ``finish`` called again, even after the next batch's submit, gives
    its own batch (the GPU's collected the next batch's). Real KITTI frames, the synthetic checkpoint."""
    second = read_points(assets / SECOND_FRAME)
    with PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", cache_dir=cache) as detector:
        alone = detector(second)
        with pytest.raises(InputError, match="^frame 1 of the batch: "):
            detector.submit_batch([points, points[:, :2]])
        finish = detector.submit_batch([points])
        for other in (lambda: detector.submit_batch([second]), lambda: detector.detect_batch([second]),
                      lambda: detector(second), detector.warm_up, lambda: detector.infer_many([second])):
            with pytest.raises(BackendError, match=WAITING_FOR_FINISH):
                other()
        found = finish()
        assert_same(found[0], expected)
        assert finish() is found
        finish_second = detector.submit_batch([second])
        assert finish() is found
        assert_same(finish_second()[0], alone)


def test_a_submit_batch_whose_finish_is_dropped_uncalled_frees_the_detector_for_its_next_call(
        assets: Path, cache: Path, points: np.ndarray, expected: Detections) -> None:
    """A server request that fails between submit_batch and finish drops its ``finish``: every later call was
    refused for good, naming a finish no one had. The next call waits for that batch, drops its detections, and runs;
    a finish still held keeps the detector, as before."""
    second = read_points(assets / SECOND_FRAME)

    def failed_request() -> None:
        detector.submit_batch([second])
        raise RuntimeError("the client went away")

    with PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", cache_dir=cache) as detector:
        with pytest.raises(RuntimeError, match="went away"):
            failed_request()
        assert_same(detector(points), expected)
        held = detector.submit_batch([second])
        with pytest.raises(BackendError, match=WAITING_FOR_FINISH):
            detector(points)
        assert len(held()) == 1
        assert_same(detector.submit_batch([points])()[0], expected)


def test_submit_batch_from_two_threads_on_one_detector_refuses_one(assets: Path, cache: Path,
                                                                   points: np.ndarray) -> None:
    """Two threads submitting to one detector before either finishes: one batch runs, the other is refused naming
    finish (on the GPU both were staged into the same buffers); after the finish the detector runs as before."""
    import threading

    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def serve() -> None:
        try:
            finish = detector.submit_batch([points[:2000]])
        except BackendError as exc:
            barrier.wait()
            outcomes.append(exc)
            return
        barrier.wait()  # both have submitted before either finishes
        outcomes.append(finish())

    with PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu", cache_dir=cache) as detector:
        threads = [threading.Thread(target=serve) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        refused = [outcome for outcome in outcomes if isinstance(outcome, BackendError)]
        assert len(outcomes) == 2 and len(refused) == 1, outcomes
        assert re.search(WAITING_FOR_FINISH, str(refused[0]))
        assert len(detector.submit_batch([points[:2000]])()) == 1


def test_submit_batch_of_more_than_eight_frames_is_refused_on_the_cpu_as_on_the_gpu(detector: PointPillars,
                                                                                      points: np.ndarray) -> None:
    """A GPU pipeline runs at most 8 frames a pass, and ``submit_batch`` is one pass: 9 frames are refused naming
    the fix on the CPU path too (it ran them, so a server tried there failed on its first GPU); the detector stays
    free for the next batch."""
    with pytest.raises(InputError, match=r"^submit_batch: at most 8 frames a batch, received 9: submit them 8 at a "
                                         r"time \(detect_batch and infer_many take any number\)$"):
        detector.submit_batch([points[:100]] * 9)
    assert len(detector.submit_batch([points[:100]] * 8)()) == 8


def test_infer_many_raises_what_a_sequence_raises_after_the_frames_before_it(tmp_path: Path) -> None:
    """A sequence whose third item raises: the first two frames' results come first, then its error (nothing
    of the sequence is looked at before the first result is asked for)."""
    from collections.abc import Sequence

    from tiny import tiny_model_dir

    good = tmp_path / "good.bin"
    np.zeros((10, 4), np.float32).tofile(good)

    class Frames(Sequence):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            if isinstance(index, slice) or index >= 4:
                raise IndexError(index)
            if index == 2:
                raise OSError("the store went away")
            return str(good)

    with PointPillars(tiny_model_dir(tmp_path / "m", seed=3), device="cpu") as detector:
        results = detector.infer_many(Frames(), batch_size=1)
        seen = []
        with pytest.raises(OSError, match="the store went away"):
            for result in results:
                seen.append(result)
    assert len(seen) == 2 and all(r.error is None for r in seen)


def test_infer_many_refuses_a_single_path_and_threads_beyond_the_cores_run_on_the_cores(tmp_path: Path) -> None:
    import os

    from tiny import tiny_model_dir
    from pointpillars_trt.errors import PointPillarsError, SettingNotice

    model = tiny_model_dir(tmp_path / "m", seed=3)
    with PointPillars(model, device="cpu") as detector:
        with pytest.raises(InputError, match=r"got the single path 'a.bin': pass \[path\]"):
            detector.infer_many("a.bin")
        with pytest.raises(InputError, match=r"got one array of shape \(100, 4\): pass \[points\]"):
            detector.infer_many(np.zeros((100, 4), np.float32))  # its rows would each be a frame's error
        with pytest.raises(InputError, match="got None"):
            detector.infer_many(None)  # type: ignore[arg-type]
        assert list(detector.infer_many([], batch_size=np.int64(2))) == []  # e.g. read from a config array
        for bad in (np.float64(2.0), np.bool_(True), 0):
            with pytest.raises(PointPillarsError, match="batch_size: expected a positive int"):
                detector.infer_many([], batch_size=bad)
    cores = len(os.sched_getaffinity(0))
    with pytest.warns(SettingNotice, match=rf"^threads={cores + 1} is more than the {cores} cores where the detector "
                                           rf"runs: {cores} threads$") as said:
        PointPillars(model, device="cpu", threads=cores + 1).close()
    assert [w.filename for w in said] == [__file__]  # the caller's line


def test_first_contact_mistakes_are_one_clear_error_or_warning(tmp_path: Path) -> None:
    """A closed detector, pickling, a dict for thresholds, a path for the model, a checkpoint file as a
    model dir: each one PointPillarsError naming the fix. 0-255 intensities for a 0-1 model: one
    InputWarning (the first frame only), and no NumPy warning leaks from the CPU post-process."""
    import copy
    import pickle
    import warnings

    from tiny import tiny_model_dir
    from pointpillars_trt.errors import ConfigError, InputWarning, PointPillarsError

    model = tiny_model_dir(tmp_path / "m", seed=3)
    frame = frame_in_range(model, 500, intensity_top=255)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector = PointPillars(model, device="cpu")
        detector(frame)
        detector(frame)
        detector.detect_batch([frame])
    assert [str(w.message)[:60] for w in caught if issubclass(w.category, InputWarning)] == \
        ["the points' intensities look like 0-255 values, but the mode"]
    assert not [w for w in caught if not issubclass(w.category, InputWarning)], [str(w.message) for w in caught]
    for action in (pickle.dumps, copy.deepcopy):
        with pytest.raises(BackendError, match="cannot be pickled or copied: open one in each process"):
            action(detector)
    with pytest.raises(ConfigError, match=r"thresholds: expected Thresholds\(.*got dict"):
        detector(frame, thresholds={"score_threshold": 0.5})  # type: ignore[arg-type]
    detector.close()
    for call in (lambda: detector(frame), lambda: detector.detect_batch([frame]), lambda: detector.infer_many([frame])):
        with pytest.raises(BackendError, match="this detector is closed"):
            call()
    with pytest.raises(PointPillarsError, match=r"expected a ModelDir, got str; open a checkpoint with "
                                                r"PointPillars.from_checkpoint"):
        PointPillars("model.pth")  # type: ignore[arg-type]
    (tmp_path / "x.pth").write_bytes(b"")
    with pytest.raises(ModelDirError, match="is a file, not a model dir .*PointPillars.from_checkpoint"):
        PointPillars.from_model_dir(tmp_path / "x.pth")


def test_infer_many_read_after_close_is_one_error_not_each_frames(tmp_path: Path) -> None:
    """``infer_many``'s results read after ``close`` (a ``with`` block left before iterating them, or a close
    midway): one BackendError saying so, not a FrameResult error for each frame left (each file read first);
    the results yielded before the close stand, and no reader thread is left."""
    import threading

    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    paths = []
    for index in range(6):
        paths.append(str(tmp_path / f"{index}.bin"))
        frame_in_range(model, 200, seed=index).tofile(paths[-1])
    with PointPillars(model, device="cpu") as detector:
        unread = detector.infer_many(paths, batch_size=2)
    with pytest.raises(BackendError, match="closed before infer_many's results were all read: read them before "
                                           r"close\(\), inside its with block"):
        next(unread)
    detector = PointPillars(model, device="cpu")
    results = detector.infer_many(iter(paths), batch_size=2)
    first = [next(results), next(results)]
    detector.close()
    assert [r.source for r in first] == paths[:2] and all(r.error is None for r in first)
    with pytest.raises(BackendError, match="closed before infer_many's results were all read"):
        next(results)
    assert not [t for t in threading.enumerate() if t.name.startswith("pp-infer-many")]


def test_setting_a_threshold_as_an_attribute_is_refused_naming_the_ways_that_work(tmp_path: Path) -> None:
    """``detector.score_threshold = 0.5`` (or nms_iou, max_boxes) would make an attribute nothing reads and
    the boxes would come at the old thresholds: one ConfigError naming the keyword and ``Thresholds``; the
    detector's results are those of its own thresholds still. Other attributes are the caller's to set."""
    from tiny import tiny_model_dir

    from pointpillars_trt.errors import ConfigError

    model = tiny_model_dir(tmp_path / "m", seed=3)
    frame = frame_in_range(model, 500)
    with PointPillars(model, device="cpu") as detector:
        before = detector(frame)
        for name, value in (("score_threshold", 0.9), ("nms_iou", 0.5), ("max_boxes", 1)):
            with pytest.raises(ConfigError, match=rf"^detector.{name} = {value}: setting it would change nothing; .*"
                                                  rf"\(\.\.\., {name}=\.\.\.\).*Thresholds\({name}=\.\.\.\)"):
                setattr(detector, name, value)
        assert_same(detector(frame), before)
        detector.frame_id = 7  # type: ignore[attr-defined]
        assert detector.frame_id == 7  # type: ignore[attr-defined]


def _model_and_overflowing_frame(tmp_path: Path) -> tuple[ModelDir, np.ndarray]:
    """A tiny model dir and a frame of it whose intensities of 1e30 make the network overflow to non-finite boxes."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    frame = frame_in_range(model, 500)
    frame[::7, 3] = 1e30
    return model, frame


def test_absurd_intensities_and_the_boxes_they_give_are_said_once(tmp_path: Path) -> None:
    """Intensities of 1e30 for a 0-1 model: one warning naming the largest value up front; the network
    overflows on them (the boxes hold inf or NaN, counted here independently; class logits of 1e30 and more) and
    that is said once too, whether the frames come one at a time, as a batch or through submit_batch."""
    import warnings

    from pointpillars_trt.errors import InputWarning

    model, frame = _model_and_overflowing_frame(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            found = [detector(frame), *detector.detect_batch([frame, frame]), *detector.submit_batch([frame])()]
    bad = [int(np.count_nonzero(~np.isfinite(d.boxes).all(axis=1) | ~np.isfinite(d.scores))) for d in found]
    assert bad[0] > 0 and bad == [bad[0]] * 4, bad
    said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert len(said) == 2, said
    assert said[0].startswith("the points' intensities reach 1e+30, but the model expects 0-1 reflectance")
    over = found[0].stats.num_overflowed_scores  # logits of 1e30 and more: their class scores overflowed too
    features = found[0].stats.num_overflowed_features  # and the pillar features of those points before them
    assert features == overflowed_pillar_features(model, frame) > 0
    assert over > 0 and said[1].startswith(f"{bad[0]} of a frame's {len(found[0])} boxes hold NaN or infinite values; "
                                           f"{over} of its class scores overflowed (a NaN, infinite or absurd logit), "
                                           f"so the boxes there are lost; {features} of its pillar features overflowed")
    with warnings.catch_warnings(record=True) as caught:  # usual values: nothing to say
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            frame = frame_in_range(model, 500)
            assert all(np.isfinite(d.boxes).all() for d in [detector(frame), *detector.detect_batch([frame])])
    assert not [str(w.message) for w in caught if issubclass(w.category, InputWarning)]


def independent_pillars(cfg, points: np.ndarray) -> int:  # type: ignore[no-untyped-def]
    """The non-empty pillars of a frame of finite points, counted from the config's grid by NumPy alone."""
    lo, hi = np.split(np.asarray(cfg.voxel.point_range, np.float64), 2)
    xyz = points[:, :3].astype(np.float64)
    inside = np.all((xyz >= lo) & (xyz < hi), axis=1)
    cells = np.floor((xyz[inside, :2] - lo[:2]) / np.asarray(cfg.voxel.pillar_size[:2], np.float64)).astype(np.int64)
    return len(np.unique(cells, axis=0))


@pytest.mark.parametrize("entry", ["call", "detect_batch", "submit_batch", "infer_many"])
def test_pillars_past_max_pillars_are_said_once_a_detector_naming_the_frame(tmp_path: Path, entry: str) -> None:
    """A frame of more non-empty pillars than the model's max_pillars loses the rest, as OpenPCDet's voxelizer
    drops them: infer warned of it, a Python caller was told nothing (``FrameStats`` counted them). Now one
    InputWarning a detector, in infer's words, naming the frame and the caller's line; the counts are the
    pillars of the frame's grid cells, counted here independently."""
    from tiny import tiny_model_dir

    from pointpillars_trt.errors import InputWarning

    model = tiny_model_dir(tmp_path / "m", seed=3)
    dense = frame_in_range(model, 500, x_share=1.0)
    total = independent_pillars(model.cfg, dense)
    assert total > model.cfg.voxel.max_pillars
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            detector.warm_up(points_per_frame=5000)  # its synthetic frames lose pillars too: no caller's to say
            assert not [w for w in caught if issubclass(w.category, InputWarning)]
            found = detect_as(detector, entry, [frame_in_range(model, 500), dense, dense], tmp_path)
    said = [w for w in caught if issubclass(w.category, InputWarning)]
    kept = model.cfg.voxel.max_pillars
    assert found[0].stats.num_pillars_dropped == 0
    assert [(d.stats.num_pillars, d.stats.num_pillars_dropped) for d in found[1:]] == [(kept, total - kept)] * 2
    name = {"call": "the frame", "infer_many": f"'{tmp_path / 'frame1.bin'}'"}.get(entry, "frame 1 of the batch")
    assert [str(w.message) for w in said] == [
        f"{name}: {total - kept} of its pillars lie beyond the model's voxel.max_pillars ({kept} kept) and were left "
        "out, as OpenPCDet leaves them out: a larger max_pillars in the model's config keeps frames this dense whole "
        "(said once)"]
    assert said[0].filename == __file__


@pytest.mark.parametrize("entry", ["call", "detect_batch", "submit_batch", "infer_many"])
def test_a_corrupt_intensity_that_overflows_features_and_class_scores_is_said_once(tmp_path: Path, entry: str) -> None:
    """One point's intensity of 3e38 (a corrupt value) in a frame after the first: the network overflows to NaN
    class logits around it, whose scores pass no score threshold, so the boxes there vanished without a word (the
    first frame's intensity check had passed). Now ``FrameStats.num_overflowed_scores`` counts them, and
    ``num_overflowed_features`` the pillar features beyond float16's range where the value entered (counted here
    from the PFN's weights), and one InputWarning a detector says so with the fix, as for boxes the network
    overflowed on; a usual frame counts none."""
    from tiny import tiny_model_dir

    from pointpillars_trt.errors import InputWarning

    model = tiny_model_dir(tmp_path / "m", seed=3)
    usual = frame_in_range(model, 500)
    corrupt = usual.copy()
    corrupt[5, 3] = 3e38
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            found = detect_as(detector, entry, [usual, corrupt, corrupt], tmp_path)
    said = [w for w in caught if issubclass(w.category, InputWarning)]
    over, features = found[1].stats.num_overflowed_scores, overflowed_pillar_features(model, corrupt)
    assert found[0].stats.num_overflowed_scores == 0 and over > 0 and found[2].stats.num_overflowed_scores == over
    assert features > 0 and [d.stats.num_overflowed_features for d in found] == [0, features, features]
    assert np.isfinite(found[1].scores).all() and np.isfinite(found[1].boxes).all()
    assert [str(w.message) for w in said] == [
        f"{over} of a frame's class scores overflowed (a NaN, infinite or absurd logit), so the boxes there are "
        f"lost; {features} of its pillar features overflowed (beyond float16's 65504), so the boxes there are "
        "meaningless: the network overflowed on values far outside what it was trained on (check the point layout "
        "and the intensity scale, and the frame for corrupt values) (said once)"]
    assert said[0].filename == __file__
    record = found[1].to_json_dict("f")
    assert (record["num_overflowed_scores"], record["num_overflowed_features"]) == (over, features)


@pytest.mark.parametrize("max_boxes, said", [(1, "the one box of a frame holds"), (2, "2 of a frame's 2 boxes hold")])
def test_the_boxes_a_network_overflowed_to_are_counted_in_the_singular_for_one(tmp_path: Path, max_boxes: int,
                                                                               said: str) -> None:
    """A frame kept to one box (max_boxes 1) whose box overflowed was said as '1 of a frame's 1 boxes hold ...'."""
    from pointpillars_trt.config import Thresholds

    model, frame = _model_and_overflowing_frame(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            found = detector(frame, thresholds=Thresholds(max_boxes=max_boxes))
    bad = int(np.count_nonzero(~np.isfinite(found.boxes).all(axis=1) | ~np.isfinite(found.scores)))
    assert len(found) == bad == max_boxes, (len(found), bad)
    overflowed = [str(w.message) for w in caught if "NaN or infinite values" in str(w.message)]
    assert len(overflowed) == 1 and overflowed[0].startswith(f"{said} NaN or infinite values; "), overflowed


#: What infer says of a frame of 500 points none of which made a pillar, or all of them one, after the frame's name;
#: {z}: the tiny model's z range.
MISREAD = {
    "nonfinite": "all its 500 points are non-finite (a NaN or infinite x, y, z, intensity or, in multi-sweep frames, "
                 "time lag): is it float32 values in that order?",
    "range": "none of its 500 finite points lies in the model's point range x 0..5.12 y -1.92..1.92 z {z}: are they "
             "metres in the lidar frame (x forward, y left, z up)?",
    "onepillar": "all its 500 points fall in one pillar: a file of zeros (a copy that failed?) or of one repeated point",
}


def misread_frames(model) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """A frame of each kind of ``MISREAD``: its intensities NaN, its x shifted by 500 m, one point 500 times."""
    frame = frame_in_range(model, 500)
    nan, far = frame.copy(), frame.copy()
    nan[:, 3] = np.nan
    far[:, 0] += 500
    return {"nonfinite": nan, "range": far, "onepillar": np.repeat(frame[:1], 500, axis=0)}


def detect_as(detector: PointPillars, entry: str, frames: list[np.ndarray], folder: Path) -> list[Detections]:
    """``frames`` through the API's ``entry``: one call a frame, one batch, or ``infer_many`` of .bin files of them
    in ``folder`` (frame0.bin, ...)."""
    if entry == "call":
        return [detector(frame) for frame in frames]
    if entry == "detect_batch":
        return detector.detect_batch(frames)
    if entry == "submit_batch":
        return detector.submit_batch(frames)()
    for index, frame in enumerate(frames):
        frame.tofile(folder / f"frame{index}.bin")
    results = list(detector.infer_many([str(folder / f"frame{index}.bin") for index in range(len(frames))]))
    assert all(result.error is None for result in results), [result.error for result in results]
    return [result.detections for result in results]  # type: ignore[misc]


@pytest.mark.parametrize("entry", ["call", "detect_batch", "submit_batch", "infer_many"])
def test_frames_infer_warns_of_are_said_once_a_kind_and_still_detected(tmp_path: Path, entry: str) -> None:
    """Frames whose points are all non-finite, all out of the model's point range, or all in one pillar: infer
    warns of each kind, the API gave their empty detections without a word. Now one InputWarning a kind a
    detector, in infer's words, naming the frame (its place in a batch, or its file) and the caller's line; the
    detections are returned all the same; a usual frame says nothing."""
    import warnings

    from tiny import tiny_model_dir
    from pointpillars_trt.apps.frame_report import frame_warning

    model = tiny_model_dir(tmp_path / "m", seed=3)
    z = "{:g}..{:g}".format(*model.cfg.voxel.point_range[2::3])
    bad = misread_frames(model)
    frames = [frame_in_range(model, 500), *bad.values(), *bad.values()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            found = detect_as(detector, entry, frames, tmp_path)
    said = [w for w in caught if issubclass(w.category, InputWarning)]
    names = {"call": ["the frame"] * 3, "detect_batch": [f"frame {i} of the batch" for i in (1, 2, 3)],
             "infer_many": [f"'{tmp_path / f'frame{i}.bin'}'" for i in (1, 2, 3)]}
    names["submit_batch"] = names["detect_batch"]
    texts = [MISREAD[kind].format(z=z) for kind in bad]
    assert [str(w.message) for w in said] == [f"{name}: {text} (said once)" for name, text in zip(names[entry], texts)]
    assert [w.filename for w in said] == [__file__] * 3  # the caller's line
    assert len(found) == 7 and found[0].stats.num_pillars > 1
    assert found[1].stats == FrameStats(500, 500, 0, 0) and found[2].stats == FrameStats(500, 0, 0, 0)
    assert found[3].stats.num_pillars == 1
    for first, again in zip(found[1:4], found[4:]):
        assert_same(first, again)
    for kind, text, det in zip(bad, texts, found[1:4]):  # the words infer says of such a file
        assert frame_warning("a.bin", det, model.cfg.voxel.point_range) == (kind, f"warning: 'a.bin': {text} "
                                                                                  "(warned once)")
    with warnings.catch_warnings(record=True) as caught:  # once a detector: the next one says it again
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            detect_as(detector, entry, [bad["nonfinite"]], tmp_path)
            detect_as(detector, entry, [frame_in_range(model, 500, seed=1)], tmp_path)
    said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert len(said) == 1 and MISREAD["nonfinite"] in said[0], said


@pytest.mark.parametrize("entry", ["call", "detect_batch", "submit_batch", "infer_many"])
def test_the_intensity_and_overflow_warnings_name_the_callers_line_whatever_the_entry(tmp_path: Path,
                                                                                      entry: str) -> None:
    """The warnings of a first frame of absurd intensities and of the boxes the network overflowed to name the
    caller's line, as a misread frame's do, whether the frame came alone, in a batch, through submit_batch or
    infer_many: all but the first named a line of the detector's own module."""
    import warnings

    from pointpillars_trt.errors import InputWarning

    model, frame = _model_and_overflowing_frame(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            detect_as(detector, entry, [frame], tmp_path)
    said = [w for w in caught if issubclass(w.category, InputWarning)]
    assert [str(w.message).split(",")[0] for w in said][0] == "the points' intensities reach 1e+30"
    assert "boxes hold NaN or infinite values; " in str(said[1].message) and len(said) == 2
    assert [w.filename for w in said] == [__file__] * 2


def test_neither_a_warm_up_nor_a_one_point_probe_uses_up_the_intensity_check(tmp_path: Path) -> None:
    """A served model warms up on synthetic 0-1 intensities and is probed with one point: the first real frame of
    0-255 values is still said (both used to take the detector's one check, so no frame was ever judged)."""
    import warnings

    from tiny import tiny_model_dir
    from pointpillars_trt.errors import InputWarning

    model = tiny_model_dir(tmp_path / "m", seed=3)
    frame = frame_in_range(model, 500, intensity_top=255)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model, device="cpu") as detector:
            detector.warm_up()
            detector(np.zeros((1, 4), np.float32))
            assert not [w for w in caught if issubclass(w.category, InputWarning)]
            detector(frame)
    said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert len(said) == 1 and "look like 0-255 values, but the model expects 0-1" in said[0], said


def test_auto_on_a_machine_without_the_gpu_path_warns_once_per_call_site(tmp_path: Path) -> None:
    import warnings

    from tiny import tiny_model_dir
    from pointpillars_trt.errors import CpuFallbackWarning

    model = tiny_model_dir(tmp_path / "m", seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars(model) as detector:
            reason = detector.gpu_unused_reason
    if detector.device == "cuda":
        pytest.skip("the GPU path runs here: device auto does not fall back")
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, CpuFallbackWarning)]
    assert reason is not None and fallbacks == [f"device auto: running on the CPU (about a second a frame; a few "
                                                f"milliseconds at most on a GPU): {reason}"]


def test_from_checkpoint_asks_where_to_run_once(assets: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """device auto from a checkpoint: whether the GPU path can run is asked once (before the export, which a
    GPU-only backend on the CPU must not reach) and the detector runs where that answer says; a fallback to
    the CPU is warned of once, at the caller's line. The real probe runs, counted on the way."""
    import warnings

    import pointpillars_trt.devices as devices_module
    from pointpillars_trt.errors import CpuFallbackWarning

    probe = devices_module.cuda_available
    asked: list[int] = []

    def counted(device_id: int = 0) -> str | None:
        asked.append(device_id)
        return probe(device_id)

    monkeypatch.setattr(devices_module, "cuda_available", counted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars.from_checkpoint(assets / CHECKPOINT, device="auto", cache_dir=cache) as detector:
            reason = detector.gpu_unused_reason
    assert asked == [0]
    assert (detector.device == "cpu") == (reason is not None)
    fallbacks = [w for w in caught if issubclass(w.category, CpuFallbackWarning)]
    if reason is None:
        assert not fallbacks
        return
    assert [str(w.message) for w in fallbacks] == [f"device auto: running on the CPU (about a second a frame; a few "
                                                   f"milliseconds at most on a GPU): {reason}"]
    assert fallbacks[0].filename == __file__


def test_a_multi_head_models_cpu_fallback_gives_its_own_figures(nuscenes: Path, cache: Path) -> None:
    """Before: the nuScenes multi-head model, 1.4-3.4 s a frame on two cores and up to 4.5 ms on a GPU, was
    said to take "about a second a frame; under a millisecond on a GPU", the KITTI model's figures."""
    import warnings

    from pointpillars_trt.errors import CpuFallbackWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PointPillars.from_checkpoint(nuscenes / "cbgs_pp_multihead_synthetic_dev.pth", device="auto",
                                          cache_dir=cache) as detector:
            reason = detector.gpu_unused_reason
    if reason is None:
        pytest.skip("the GPU path runs here: device auto does not fall back")
    assert [str(w.message) for w in caught if issubclass(w.category, CpuFallbackWarning)] == [
        f"device auto: running on the CPU (one to a few seconds a frame for a multi-head model; a few milliseconds "
        f"at most on a GPU): {reason}"]


CLOSE_DURING_A_FRAME = """
import sys, threading, time
import numpy as np
from pointpillars_trt.detector import PointPillars

detector = PointPillars.from_checkpoint(sys.argv[1], device="cpu", cache_dir=sys.argv[3])
points = np.fromfile(sys.argv[2], np.float32).reshape(-1, 4)
done = {}

def frame():
    done["found"] = len(detector(points).boxes)
    done["at"] = time.monotonic()

thread = threading.Thread(target=frame)
thread.start()
while not detector._impl._lock.locked():  # the frame has started
    time.sleep(0.0005)
detector.close()
closed_at = time.monotonic()
thread.join()
print("frame ended before close returned:", done["at"] <= closed_at, "boxes:", done["found"])

detector = PointPillars.from_checkpoint(sys.argv[1], device="cpu", cache_dir=sys.argv[3])
said = {}

def batch():
    try:
        said["batch"] = f"{len(detector.detect_batch([points] * 4))} frames"
    except Exception as exc:
        said["batch"] = f"{type(exc).__name__}: {exc}"

thread = threading.Thread(target=batch)
thread.start()
while not detector._impl._lock.locked():
    time.sleep(0.0005)
detector.close()
thread.join()
print("batch:", said["batch"])
"""


def test_close_on_the_cpu_waits_for_the_frame_in_progress(assets: Path, cache: Path) -> None:
    """``close`` from another thread while a frame runs (a real ONNX Runtime session, a full KITTI scan):
    it returns once the frame is done, which ends normally (a session freed mid-run makes ONNX Runtime
    abort the process at exit), and once a batch in progress is done. In a subprocess, so that such an
    abort cannot take pytest with it."""
    import subprocess
    import sys

    scan = sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0]
    done = subprocess.run([sys.executable, "-c", CLOSE_DURING_A_FRAME, str(assets / CHECKPOINT), str(scan), str(cache)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "terminate called" not in done.stderr, done.stderr[-2000:]
    assert "frame ended before close returned: True boxes:" in done.stdout, (done.stdout, done.stderr[-2000:])
    # a batch holds the detector to its last frame: the close waits for all of it
    assert "batch: 4 frames" in done.stdout, done.stdout


def test_fp16_graphs_on_the_cpu_are_said_once_at_the_callers_line(tmp_path: Path) -> None:
    """The CLI notes that fp16 graphs gain nothing on the CPU; the Python API said nothing. An fp32 model: no word.
    It is a ``PrecisionWarning``, no ``InputWarning`` (which is of frames): it was one, and filtering the frames'
    warnings hid it."""
    import warnings

    from pointpillars_trt.errors import InputWarning, PrecisionWarning
    from tiny import tiny_model_dir

    fp16, fp32 = tiny_model_dir(tmp_path / "fp16", precision="fp16"), tiny_model_dir(tmp_path / "fp32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PointPillars(fp16, device="cpu").close()
        PointPillars.from_model_dir(fp16.path, device="cpu").close()
        PointPillars(fp32, device="cpu").close()
    assert not [w for w in caught if issubclass(w.category, InputWarning)]
    said = [w for w in caught if issubclass(w.category, PrecisionWarning)]
    assert [str(w.message) for w in said] == 2 * [
        "fp16 graphs run no faster than fp32 on the CPU (slower, and rounded to fp16): for CPU runs use fp32 graphs "
        "(a checkpoint without precision='fp16', or a model dir built with --precision fp32)"]
    assert [w.filename for w in said] == 2 * [__file__]


@pytest.mark.parametrize("value, threads, said", [
    ("", None, None), ("1", 1, None), (" 1 ", 1, None),
    ("99999", "cores", "OMP_NUM_THREADS=99999 is more than the {cores} core{s} where the detector runs: {cores} thread{s}"),
    ("abc", None, "OMP_NUM_THREADS='abc' is no thread count (a positive whole number): left out, ONNX Runtime picks "
                  "its own"),
    ("0", None, "OMP_NUM_THREADS='0' is no thread count"), ("-3", None, "OMP_NUM_THREADS='-3' is no thread count"),
    ("4,2", None, "OMP_NUM_THREADS='4,2' is no thread count"),
    ("\u00b2", None, "OMP_NUM_THREADS='\u00b2' is no thread count"),  # a digit to str.isdigit, none to int()
])
def test_omp_num_threads_is_capped_at_the_cores_and_junk_is_left_out_saying_so(
        monkeypatch: pytest.MonkeyPatch, value: str, threads: object, said: str | None) -> None:
    """OMP_NUM_THREADS sets ONNX Runtime's CPU threads: past the cores this process may run on (99999 started
    ~15,000 threads, 16 GB, and would not stop on SIGTERM) it is capped, and a value that is no count is left
    out; each said as a SettingNotice (the CLI's note: line), a plain count silently."""
    import warnings

    from pointpillars_trt import detector as detector_module
    from pointpillars_trt.errors import SettingNotice

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = detector_module.onnxruntime_threads(None)
    assert got == (cores if threads == "cores" else threads)
    notices = [str(w.message) for w in caught if issubclass(w.category, SettingNotice)]
    if said is None:
        assert notices == []
    else:
        assert len(notices) == 1 and notices[0].startswith(said.format(cores=cores, s="s" * (cores > 1))), notices


def test_infer_many_says_an_unapplied_pcd_viewpoint_once(detector: PointPillars, points: np.ndarray,
                                                         tmp_path: Path) -> None:
    """.pcd files whose VIEWPOINT is a pose (read as stored, as PCL reads them) get one warning a detector, naming
    the first one read (the reader threads take them in any order), not one a file; their points are the same as a
    .bin's of the same values."""
    rows = np.ascontiguousarray(points[:2000])
    header = ("# .PCD v0.7\nVERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
              f"WIDTH {len(rows)}\nHEIGHT 1\nVIEWPOINT 1 2 0 1 0 0 0\nPOINTS {len(rows)}\nDATA binary\n").encode()
    posed = [tmp_path / f"posed{i}.pcd" for i in range(3)]
    for path in posed:
        path.write_bytes(header + rows.tobytes())
    (tmp_path / "same.bin").write_bytes(rows.tobytes())
    with pytest.warns(InputWarning) as caught:
        results = list(detector.infer_many([str(p) for p in posed] + [str(tmp_path / "same.bin")]))
    said = [str(w.message) for w in caught if "VIEWPOINT" in str(w.message)]
    assert len(said) == 1 and sum(str(p) in said[0] for p in posed) == 1 and "said once" in said[0]
    assert all(r.error is None for r in results)
    for result in results[:3]:
        assert_same(result.detections, results[3].detections)  # type: ignore[arg-type]


def test_help_documents_every_public_method_and_a_detector_shows_what_it_runs(tmp_path: Path) -> None:
    """``help(PointPillars)`` says what each public method does (the call that detects said only "Call self as a
    function"), the class docstring names only methods the class has (it named a ``detect`` there is not), and a
    detector's repr names its config, classes, engine and model dir, and says when it is closed."""
    import pydoc

    from tiny import tiny_model_dir

    for cls in (PointPillars, Detections):
        public = [name for name, value in vars(cls).items()
                  if callable(value) or isinstance(value, (property, classmethod, staticmethod))
                  if not name.startswith("_") or name == "__call__"]
        assert [name for name in public if not pydoc.getdoc(getattr(cls, name))] == [], cls
    assert "Call self as a function" not in pydoc.render_doc(PointPillars)

    model = tiny_model_dir(tmp_path / "m", seed=3)
    detector = PointPillars(model, device="cpu")
    named = set(re.findall(r"``([a-z_]+)``", PointPillars.__doc__ or ""))  # finish: what submit_batch returns
    assert named - {"finish"} <= set(dir(detector)), named - set(dir(detector))
    shown = (f"<PointPillars tiny_openpcdet ('Car', 'Pedestrian', 'Cyclist'): CPU, ONNX Runtime, fp32; "
             f"model dir {str(tmp_path / 'm')!r}")
    assert repr(detector) == shown + ">"
    detector.close()
    assert repr(detector) == shown + ", closed>"
