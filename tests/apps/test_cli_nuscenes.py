"""``pointpillars-trt build | infer`` with OpenPCDet's nuScenes multi-head checkpoint on the CPU path.

Oracle: the public API on the same frame (itself checked box for box against an independent
re-implementation of OpenPCDet in tests/reference/test_reference_multihead.py)."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from out_folder import output_paths
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import InputWarning
from pointpillars_trt.pointcloud_io import read_points
from test_cli import assert_one_line_error, cli
from test_infer_streaming import part_rows

FRAME = "nusc_dev_k000002_s02.bin"


@pytest.fixture(scope="module")
def model(nuscenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nus") / "model"
    run = cli("build", "--checkpoint", nuscenes / "cbgs_pp_multihead_synthetic_dev.pth", "--out", out)
    assert run.rc == 0 and "openpcdet_nuscenes_multihead" in run.out, run
    return out


def test_build_without_the_checkpoints_yaml_says_the_published_one_it_takes_in_one_note(nuscenes: Path,
                                                                                       tmp_path: Path) -> None:
    """A build of an OpenPCDet checkpoint without --pcdet-config took the built-in config of OpenPCDet's published
    cbgs_pp_multihead.yaml without a word (a checkpoint holds no config): one note line names it and the option that
    gives the model's own YAML; with that option given, none."""
    checkpoint = nuscenes / "cbgs_pp_multihead_synthetic_dev.pth"
    run = cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "model")
    assert run.rc == 0 and "openpcdet_nuscenes_multihead" in run.out, run
    assert run.err.splitlines() == [
        f"note: '{checkpoint}': built with config openpcdet_nuscenes_multihead, OpenPCDet's published "
        "tools/cfgs/nuscenes_models/cbgs_pp_multihead.yaml (a checkpoint holds no config): for a model trained with a "
        "YAML of its own (another range, anchors, classes or thresholds), build with --pcdet-config ITS_MODEL.yaml "
        "(Python: config=convert.pcdet_config.config_from_pcdet_yaml(path))"], run.err
    run = cli("build", "--checkpoint", checkpoint, "--config", "openpcdet_nuscenes_multihead", "--out", tmp_path / "b")
    assert run.rc == 0 and run.err == "", run


def test_build_of_openpcdets_nuscenes_yaml_says_its_test_time_shuffle_in_one_note(nuscenes: Path, tmp_path: Path) -> None:
    """OpenPCDet's cbgs_pp_multihead.yaml shuffles the points at test time, which this package does not: one note
    line (every nuScenes build says it), not a Python warning with the line of code that read the YAML."""
    yaml = Path(__file__).resolve().parent.parent / "data/pcdet/tools/cfgs/nuscenes_models/cbgs_pp_multihead.yaml"
    run = cli("build", "--checkpoint", nuscenes / "cbgs_pp_multihead_synthetic_dev.pth", "--pcdet-config", yaml,
              "--out", tmp_path / "model")
    assert run.rc == 0 and "openpcdet_nuscenes_multihead" in run.out, run
    assert run.err.splitlines() == [
        f"note: '{yaml}': DATA_CONFIG.DATA_PROCESSOR[1].SHUFFLE_ENABLED shuffles the points at test time; this package "
        "keeps them in input order, as OpenPCDet does with the shuffle off (a shuffle changes the pillar order and "
        "which points full pillars drop, from run to run)"], run.err


@pytest.mark.slow
def test_infer_writes_velocity_and_nuscenes_labels(nuscenes: Path, model: Path, tmp_path: Path) -> None:
    run = cli("infer", nuscenes / FRAME, "--model", model, "--device", "cpu", "--point-dim", "5",
              "--out", tmp_path / "out", "--no-progress", "--viz")
    assert run.rc == 0, run
    assert (tmp_path / "out" / FRAME.replace(".bin", ".png")).stat().st_size > 10_000
    assert "intensities look like 0-255" not in run.err  # the nuScenes model is trained on 0-255 intensities
    assert "intensities all lie within 0-1" not in run.err
    unit = read_points(nuscenes / FRAME, point_dim=5, columns=5)
    unit[:, 3] /= 255  # reflectance, as a KITTI-style source gives it
    unit.tofile(tmp_path / "unit.bin")
    run = cli("infer", tmp_path / "unit.bin", "--model", model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert f"warning: '{tmp_path / 'unit.bin'}': intensities all lie within 0-1, but the model was trained on 0-255 " \
           "values (nuScenes): pass --intensity-scale 255 if they are 0-1 reflectance (warned once)\n" in run.err, run.err
    wide = read_points(nuscenes / FRAME, point_dim=5, columns=5)
    wide[:, 3] *= 257  # 16-bit intensities
    wide.tofile(tmp_path / "wide.bin")
    run = cli("infer", tmp_path / "wide.bin", "--model", model, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    assert f"warning: '{tmp_path / 'wide.bin'}': intensities reach beyond 255, but the model was trained on 0-255 " \
           "values (nuScenes): check the point layout" in run.err and "1/257 for 16-bit" in run.err, run.err
    with pytest.warns(InputWarning, match="intensities reach 6.*trained on 0-255"):
        PointPillars.from_model_dir(model, device="cpu")(wide)
    record = json.loads((tmp_path / "out" / FRAME.replace(".bin", ".json")).read_text())
    want = PointPillars.from_model_dir(model, device="cpu")(read_points(nuscenes / FRAME, point_dim=5, columns=5))
    assert record["labels"] == want.names and len(want) >= 10
    assert set(record["labels"]) <= set(want.class_names) and "car" in record["labels"]
    assert want.velocity is not None
    np.testing.assert_allclose(record["velocity"], want.velocity, atol=1e-5)
    np.testing.assert_allclose(record["boxes_lidar"], want.boxes, atol=1e-4)


def test_single_sweep_frames_and_kitti_labels_are_one_clear_error(nuscenes: Path, model: Path, tmp_path: Path) -> None:
    frame = nuscenes / FRAME
    assert_one_line_error(cli("infer", frame, "--model", model, "--device", "cpu", "--point-dim", "4"),
                          "--point-dim 4: model openpcdet_nuscenes_multihead reads 5 values a point "
                          "(x, y, z, intensity, time): a multi-sweep model needs accumulated frames, each point's 5th "
                          "value its time lag behind the key sweep: PointPillars.accumulate builds them from sweeps "
                          "and their poses; .bin files of such frames are read with --point-dim 5, this model's default")
    assert_one_line_error(cli("infer", frame, "--model", model, "--device", "cpu", "--point-dim", "5",
                              "--format", "kitti", "--out", tmp_path / "k"),
                          "--format kitti: model openpcdet_nuscenes_multihead predicts box velocities",
                          "use --format json (or jsonl, parquet)")
    assert not (tmp_path / "k").exists()
    if importlib.util.find_spec("ray") is not None:  # --ray: the same refusals, before the cluster starts
        import ray

        was = ray.is_initialized()
        for options, said in ((["--point-dim", "4"], "--point-dim 4: model openpcdet_nuscenes_multihead reads 5"),
                              (["--format", "kitti"], "--format kitti: model openpcdet_nuscenes_multihead predicts")):
            assert_one_line_error(cli("infer", frame, "--model", model, "--device", "cpu", "--ray", "--out",
                                      tmp_path / "r", *options), said)
        assert ray.is_initialized() == was and not (tmp_path / "r").exists()



def test_point_dim_4_of_single_sweep_files_names_accumulated_frames_not_point_dim_5(assets: Path, model: Path) -> None:
    """KITTI scans (4 values a point) with --point-dim 4 for a multi-sweep model were told "pass --point-dim 5",
    which then refuses each file as "not a multiple of 20": the error says the model needs accumulated frames with
    a time lag, and that the files' sizes are rows of 4, without naming --point-dim 5."""
    velodyne = assets / "kitti" / "training" / "velodyne"
    first = sorted(velodyne.glob("*.bin"))[0]
    size = first.stat().st_size
    assert size % 16 == 0 and size % 20, size  # the oracle: its size fits rows of 4 values, not of 5
    run = cli("infer", velodyne, "--model", model, "--device", "cpu", "--point-dim", "4")
    assert_one_line_error(run, "a multi-sweep model needs accumulated frames, each point's 5th value its time lag "
                               "behind the key sweep: PointPillars.accumulate builds them from sweeps and their poses; "
                               f"'{first}' is {size} bytes, rows of 4 values (a single sweep, as KITTI writes them), "
                               "not 5")
    assert "--point-dim 5" not in run.err, run.err


def test_eval_of_a_velocity_model_says_kitti_is_its_default_format(assets: Path, nuscenes: Path, model: Path,
                                                                   tmp_path: Path) -> None:
    """infer --eval without --format writes KITTI label files, which a nuScenes model cannot: the refusal
    named a "--format kitti" never typed; now it says --eval chose it and which formats to give."""
    labels = tmp_path / "label_2"
    labels.mkdir()
    (labels / FRAME.replace(".bin", ".txt")).write_bytes((assets / "kitti/training/label_2/000002.txt").read_bytes())
    assert_one_line_error(cli("infer", nuscenes / FRAME, "--model", model, "--device", "cpu", "--eval", labels,
                              "--out", tmp_path / "e"),
                          "error: --eval writes --format kitti unless --format is given, and model "
                          "openpcdet_nuscenes_multihead predicts box velocities",
                          "use --format json (or jsonl, parquet)")
    assert not (tmp_path / "e").exists()


def test_a_frame_out_of_range_claims_no_axis_directions_of_a_nuscenes_frame(nuscenes: Path, model: Path) -> None:
    """A frame none of whose points lies in the range was asked whether its points are in a lidar frame of "x
    forward, y left": nuScenes' LIDAR_TOP frame, which the model reads, has x right and y forward. Its symmetric
    range tells no direction, so only z up is asked of."""
    frame = read_points(nuscenes / FRAME, point_dim=5)
    frame[:, 0] += 200.0
    with PointPillars.from_model_dir(model, device="cpu") as detector, \
            pytest.warns(InputWarning) as caught:
        assert len(detector(frame)) == 0
    (said,) = [str(w.message) for w in caught]
    assert said.endswith("none of its 10053 finite points lies in the model's point range x -51.2..51.2 y -51.2..51.2 "
                         "z -5..3: are they metres in the lidar frame (z up)? (said once)"), said


def test_a_config_of_the_other_head_kind_asks_for_its_checkpoint_not_a_rebuild(assets: Path, nuscenes: Path,
                                                                              model: Path) -> None:
    """infer --config openpcdet_kitti_3class on the nuScenes model dir told to rebuild it from its checkpoint with
    that config, which build refuses (a multi-head checkpoint holds no single head): now a checkpoint of the
    config's head kind is asked for, both ways."""
    from pointpillars_trt.convert.checkpoint import load_checkpoint
    from pointpillars_trt.errors import CheckpointError

    with pytest.raises(CheckpointError, match="not of config openpcdet_kitti_3class"):
        load_checkpoint(nuscenes / "cbgs_pp_multihead_synthetic_dev.pth", "openpcdet_kitti_3class")  # the old advice
    run = cli("infer", nuscenes / FRAME, "--model", model, "--device", "cpu", "--config", "openpcdet_kitti_3class")
    assert_one_line_error(run, "was built for config 'openpcdet_nuscenes_multihead', not for --config "
                               "'openpcdet_kitti_3class': drop --config, or build a model dir from a checkpoint of "
                               "a single-head network: `pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth "
                               "--config openpcdet_kitti_3class --out NEW_MODEL_DIR` (the model dir's checkpoint "
                               "holds a multi-head one)")
    kitti = model.parent / "kitti"
    assert cli("build", "--checkpoint", assets / "checkpoints/pointpillar_openpcdet_synthetic.pth", "--out",
               kitti).rc == 0
    run = cli("infer", nuscenes / FRAME, "--model", kitti, "--device", "cpu", "--config", "openpcdet_nuscenes_multihead")
    assert_one_line_error(run, "build a model dir from a checkpoint of a multi-head network")


def test_arrays_whose_fifth_values_are_no_time_lags_are_refused_as_files_are(nuscenes: Path, model: Path) -> None:
    """A frame given as an array (lags in ms, or of the wrong sign) ran without a word; a file of them is
    refused when it is read."""
    from pointpillars_trt.errors import InputError

    frame = read_points(nuscenes / FRAME, point_dim=5)
    with PointPillars.from_model_dir(model, device="cpu") as detector:
        for scale in (1000.0, -1.0):
            wrong = frame.copy()
            wrong[:, 4] *= scale
            with pytest.raises(InputError, match=r"^points: its 5th values run from .* time lag .*PointPillars.accumulate"):
                detector(wrong)
            with pytest.raises(InputError, match=r"^frame 1 of the batch: points: its 5th values"):
                detector.detect_batch([frame[:10], wrong])
            (result,) = detector.infer_many([wrong])
            assert isinstance(result.error, InputError) and "its 5th values" in str(result.error)

@pytest.mark.slow
def test_infer_many_reads_files_with_the_models_point_columns(nuscenes: Path, model: Path) -> None:
    """``infer_many`` on paths of a multi-sweep model reads 5 values a point (its point columns), as the
    detector on ``read_points(point_dim=5)``, which now keeps the time column by default."""
    with PointPillars.from_model_dir(model, device="cpu") as detector:
        (result,) = detector.infer_many([nuscenes / FRAME])
        assert result.error is None and result.detections is not None
        want = detector(read_points(nuscenes / FRAME, point_dim=5))
    np.testing.assert_array_equal(result.detections.boxes, want.boxes)
    assert result.detections.names == want.names and len(want) >= 10


def test_point_dim_defaults_to_the_models_point_columns(nuscenes: Path, model: Path, tmp_path: Path) -> None:
    """Without --point-dim a multi-sweep model reads its 5 values a point: the same file as with --point-dim 5."""
    frame = nuscenes / FRAME
    for name, extra in (("default", []), ("five", ["--point-dim", "5"])):
        run = cli("infer", frame, "--model", model, "--device", "cpu", "--out", tmp_path / name, *extra)
        assert run.rc == 0, run
    (written,) = output_paths(tmp_path / "default")
    assert written.read_bytes() == (tmp_path / "five" / written.name).read_bytes()


def test_the_frame_line_shows_the_three_best_scores_of_a_multi_head_frame(nuscenes: Path, model: Path,
                                                                          tmp_path: Path) -> None:
    """Without --out each frame gets a line with its best three boxes; a multi-head model's boxes come
    head by head, so the first three are not the best."""
    run = cli("infer", nuscenes / FRAME, "--model", model, "--device", "cpu", "--no-progress", "--out", tmp_path)
    assert run.rc == 0, run
    record = json.loads((tmp_path / FRAME.replace(".bin", ".json")).read_text())
    best = sorted(zip(record["scores"], record["labels"]), key=lambda pair: -pair[0])[:3]
    assert record["scores"][:3] != [score for score, _ in best]  # head order: the test means something
    run = cli("infer", nuscenes / FRAME, "--model", model, "--device", "cpu", "--no-progress")
    assert run.rc == 0 and f"[{', '.join(f'{label} {score:.2f}' for score, label in best)}]" in run.out, run.out


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_reader_processes_hand_on_whole_multi_sweep_frames(nuscenes: Path, model: Path) -> None:
    """Frames with time lags that reader processes staged (rows and lags apart in shared staging) reach the
    detector and the writer whole: the CPU path's detections and the written points are the file's, as with
    reader threads."""
    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import FrameReader, FrameRunner, WorkerProcesses

    items = [str(nuscenes / FRAME), str(nuscenes / "nusc_dev_k000000_s05.bin")]
    with PointPillars.from_model_dir(model, device="cpu") as detector:
        want = [detector(read_points(item, point_dim=5)) for item in items]
        for processes in (0, 2):
            written: list[tuple[str, np.ndarray]] = []
            reader = FrameReader(detector.cfg, point_dim=5, intensity_scale=None)
            pool = WorkerProcesses(processes, read_batch) if processes else None
            with FrameRunner([detector], batch_size=2, read=reader, reader_processes=pool, keep_points=True,
                             write=lambda source, found, points: written.append((source, points))) as runner:
                jobs = list(runner.run(items))
            assert [job.error for job in jobs] == [None, None], processes
            for job, expected in zip(jobs, want):
                np.testing.assert_array_equal(job.detections.boxes, expected.boxes)
            assert sorted(source for source, _ in written) == sorted(items)
            for source, points in written:
                np.testing.assert_array_equal(points, read_points(source, point_dim=5))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_every_row_of_a_velocity_model_holds_velocities_a_failed_frames_too(nuscenes: Path, model: Path,
                                                                            tmp_path: Path, fmt: str) -> None:
    """A nuScenes model's rows: a frame with boxes, an empty one and one of no point in range hold velocities (the
    detector's empty results have (0, 2) of them, as OpenPCDet's (0, 9) boxes); a failed frame's row had none, a
    JSON Lines row without the key and a Parquet part of failed frames alone without the column, which the other
    parts have."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    frames = tmp_path / "frames"
    frames.mkdir()
    (frames / "a_boxes.bin").write_bytes((nuscenes / FRAME).read_bytes())
    (frames / "b_empty.bin").write_bytes(b"")
    far = read_points(nuscenes / FRAME, point_dim=5)
    far[:, 0] += 200.0
    far.tofile(frames / "c_far.bin")
    (frames / "d_broken.bin").write_bytes(b"\x01" * 7)  # not whole points: the frame fails
    with PointPillars.from_model_dir(model, device="cpu") as detector:
        for points in (np.zeros((0, 5), np.float32), far):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", InputWarning)  # the frame of no point in range is said so
                found = detector(points)
            assert len(found) == 0 and found.velocity is not None and found.velocity.shape == (0, 2)
            assert found.to_pcdet_dict()["pred_boxes"].shape == (0, 9)
    run = cli("infer", frames, "--model", model, "--device", "cpu", "--no-progress", "--format", fmt,
              "--out", tmp_path / "all")
    assert run.rc == 1 and run.out.startswith("3/4 frames"), run
    rows = [row for part in sorted((tmp_path / "all").glob(f"detections-*.{fmt}")) for row in part_rows(part)]
    assert [Path(str(row["source"])).name for row in rows] == ["a_boxes.bin", "b_empty.bin", "c_far.bin",
                                                                 "d_broken.bin"]
    assert [len(row["velocity"]) for row in rows] == [len(rows[0]["labels"]), 0, 0, 0]  # type: ignore[arg-type]
    assert len(rows[0]["labels"]) >= 10 and rows[3]["error"]  # type: ignore[arg-type]
    run = cli("infer", frames / "d_broken.bin", "--model", model, "--device", "cpu", "--no-progress", "--format", fmt,
              "--out", tmp_path / "failed")
    assert run.rc == 1, run
    (part,) = (tmp_path / "failed").glob(f"detections-*.{fmt}")
    (row,) = part_rows(part)
    assert row["error"] and row["velocity"] == [], row


def test_frames_of_per_point_capture_times_are_warned_once_and_counted(nuscenes: Path, model: Path,
                                                                      tmp_path: Path) -> None:
    """A multi-sweep frame whose 5th values are per-point capture times within a sweep (thousands of values in the
    time lags' range) ran without a word in infer, which ignores the API's InputWarnings for lines of its own: one
    warning names the first frame and PointPillars.accumulate, the count after the run the others; a frame of the
    accumulated sweeps' lags says nothing."""
    frame = read_points(nuscenes / FRAME, point_dim=5, columns=5)
    assert np.unique(frame[:, 4]).size <= 10  # the asset: one lag a sweep
    frame.tofile(tmp_path / "lags.bin")
    for name in ("a.bin", "b.bin"):
        timed = frame.copy()
        timed[:, 4] = np.linspace(0.0, 0.1, len(timed), dtype=np.float32)  # a driver's time within the sweep
        timed.tofile(tmp_path / name)
    run = cli("infer", tmp_path / "lags.bin", tmp_path / "a.bin", tmp_path / "b.bin", "--model", model,
              "--device", "cpu", "--no-progress", "--out", tmp_path / "out")
    assert run.rc == 0, run
    warned = [line for line in run.err.splitlines() if "capture times" in line]
    assert warned == [
        f"warning: '{tmp_path / 'a.bin'}': its 5th values take more distinct values than a frame has sweeps (over 32 "
        "among points spread over it), but this model reads there each sweep's time lag behind the key sweep, one "
        "value for all of a sweep's points: per-point capture times within a sweep (a lidar driver's time field)? "
        "build multi-sweep frames from their sweeps with PointPillars.accumulate in Python, which gives each sweep's "
        "points its lag (warned once)",
        "warning: 2 frames had per-point capture times where the model reads sweeps' time lags in all (the first named "
        f"above; then '{tmp_path / 'b.bin'}')"], run.err
