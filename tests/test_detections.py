"""The JSON record of a frame's detections: velocities for models that predict them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from notices import published_config_notice

from pointpillars_trt.detections import Detections, FrameStats

BOXES = np.array([[1, 2, 0, 4, 2, 1.5, 0.1], [5, 6, 0, 4, 2, 1.5, 3.5], [9, 9, 0, 1, 1, 1, 0]], np.float32)


def test_velocity_rows_follow_their_boxes_and_a_non_finite_one_drops_its_box() -> None:
    velocity = np.array([[1.0, -2.0], [np.nan, 0.0], [0.25, 0.5]], np.float32)
    det = Detections(BOXES, np.float32([0.9, 0.8, 0.7]), np.int32([0, 1, 0]), ("car", "truck"), FrameStats(10),
                     velocity)
    record = json.loads(json.dumps(det.to_json_dict("f"), allow_nan=False))
    assert record["labels"] == ["car", "car"] and record["num_nonfinite_boxes"] == 1
    assert record["velocity"] == [[1.0, -2.0], [0.25, 0.5]]
    assert record["boxes_lidar"][1][:2] == [9.0, 9.0]


def test_a_frames_box_count_holds_the_boxes_its_json_file_holds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A box left out of the JSON record for its non-finite velocity is left out of the count the run reports as
    written (and of its picture) too, and counted with the overflowed ones."""
    from pointpillars_trt.apps.outputs import OutputPlan, write_frame_outputs

    velocity = np.array([[1.0, -2.0], [np.inf, 0.0], [0.25, 0.5]], np.float32)
    det = Detections(BOXES, np.float32([0.9, 0.8, 0.7]), np.int32([0, 1, 0]), ("car", "truck"), FrameStats(10),
                     velocity)
    plan = OutputPlan(json_dir=tmp_path)
    written = write_frame_outputs(det, "000001.bin", plan, None, durable=False)
    record = json.loads((tmp_path / "000001.json").read_text())
    assert written.boxes == len(record["boxes_lidar"]) == 2 and written.nonfinite == record["num_nonfinite_boxes"] == 1


def test_models_without_velocity_write_no_velocity_key() -> None:
    det = Detections(BOXES, np.float32([0.9, 0.8, 0.7]), np.int32([0, 1, 0]), ("car", "truck"), FrameStats(10))
    assert "velocity" not in det.to_json_dict("f")


def test_detections_reach_a_writer_process_whole() -> None:
    """What a writer process gets of a frame's ``Detections`` when it is pickled (its arrays as bytes:
    ``Detections.__reduce__``) is the same ``Detections``: every field equal, arrays of the same dtype and shape,
    writable, with or without velocities, with no box at all, from arrays in Fortran order."""
    import dataclasses
    import pickle

    from pointpillars_trt.detections import Detections, FrameStats

    rng = np.random.default_rng(3)
    names = [f.name for f in dataclasses.fields(Detections)]
    assert names == ["boxes", "scores", "labels", "class_names", "stats", "velocity"], "a new field: pack it too"
    for n, velocity in ((5, None), (0, None), (7, np.asfortranarray(rng.normal(size=(7, 2)))), (3, np.zeros((3, 2)))):
        boxes = np.asfortranarray(rng.normal(size=(n, 7)).astype(np.float32))
        found = Detections(boxes, rng.random(n).astype(np.float32), rng.integers(0, 3, n).astype(np.int64),
                           ("Car", "Pedestrian", "Cyclist"), FrameStats(99, 1, 7, 2), velocity)
        back = pickle.loads(pickle.dumps(found))
        for name in names:
            ours, theirs = getattr(back, name), getattr(found, name)
            if isinstance(theirs, np.ndarray):
                assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and ours.flags.writeable, name
                np.testing.assert_array_equal(ours, theirs)
            else:
                assert ours == theirs, name


def test_detections_compare_by_their_values() -> None:
    """Two results of the same boxes compare equal (a copy, a pickled copy, NaN in the same place), and unequal
    when a value, a dtype, a class name, a stat or a velocity differs, where comparing them raised ValueError."""
    import pickle

    def made(scores: list[float], *, labels: object = np.int32, names: tuple[str, ...] = ("car", "truck"),
             stats: FrameStats = FrameStats(10), velocity: np.ndarray | None = None) -> Detections:
        return Detections(BOXES.copy(), np.float32(scores), np.array([0, 1, 0], labels), names, stats, velocity)

    one = made([0.9, np.nan, 0.7])
    assert one == made([0.9, np.nan, 0.7]) and one == pickle.loads(pickle.dumps(one))
    assert one in [made([0.5, 0.5, 0.5]), made([0.9, np.nan, 0.7])]
    assert one != made([0.9, 0.8, 0.7])
    assert one != made([0.9, np.nan, 0.7], labels=np.int64)
    assert one != made([0.9, np.nan, 0.7], names=("car", "bus"))
    assert one != made([0.9, np.nan, 0.7], stats=FrameStats(11))
    assert one != made([0.9, np.nan, 0.7], velocity=np.zeros((3, 2), np.float32))
    assert one != "boxes"
    with pytest.raises(TypeError):
        hash(one)


def test_a_detections_repr_summarises_its_boxes_by_class_without_printing_them() -> None:
    boxes = np.arange(21, dtype=np.float32).reshape(3, 7) + 1234.5  # a box value the summary must not print
    found = Detections(boxes, np.ones(3, np.float32), np.array([2, 0, 2], np.int32), ("Car", "Pedestrian", "Cyclist"),
                       FrameStats(100, 1, 20, 0))
    assert repr(found) == ("<Detections: 3 boxes: Car 1, Cyclist 2; FrameStats(num_points=100, num_nonfinite=1, "
                           "num_pillars=20, num_pillars_dropped=0, num_overflowed_scores=0, "
                           "num_overflowed_features=0)>")
    assert repr(Detections.empty(("Car",), FrameStats(5))).startswith("<Detections: 0 boxes; FrameStats(num_points=5")
    odd = Detections(boxes[:1], np.ones(1, np.float32), np.array([7], np.int32), ("Car",), FrameStats(1))
    assert repr(odd).startswith("<Detections: 1 box: 7 1; ")


KITTI = ("Car", "Pedestrian", "Cyclist")


def test_the_pcdet_dict_holds_openpcdets_dtypes_and_1_based_labels() -> None:
    det = Detections(BOXES, np.float32([0.9, 0.8, 0.7]), np.int32([0, 2, 1]), KITTI, FrameStats(10))
    found = det.to_pcdet_dict()
    assert sorted(found) == ["pred_boxes", "pred_labels", "pred_scores"]
    assert found["pred_boxes"].dtype == np.float32 and found["pred_boxes"].shape == (3, 7)
    assert found["pred_scores"].dtype == np.float32 and found["pred_scores"].shape == (3,)
    assert found["pred_labels"].dtype == np.int64 and found["pred_labels"].tolist() == [1, 3, 2]
    np.testing.assert_array_equal(found["pred_boxes"], np.float32([[1, 2, 0, 4, 2, 1.5, 0.1], [5, 6, 0, 4, 2, 1.5, 3.5],
                                                                   [9, 9, 0, 1, 1, 1, 0]]))
    np.testing.assert_array_equal(found["pred_scores"], np.float32([0.9, 0.8, 0.7]))
    # the names OpenPCDet's generate_prediction_dicts gives them: class_names[pred_labels - 1]
    assert np.array(KITTI)[found["pred_labels"] - 1].tolist() == ["Car", "Cyclist", "Pedestrian"]
    found["pred_boxes"][:] = 0  # new arrays: the detections are left as they were
    found["pred_scores"][:] = 0
    assert det.boxes[0, 0] == 1 and det.scores[0] == np.float32(0.9)


def test_a_velocity_models_pcdet_boxes_carry_vx_vy_as_their_8th_and_9th_values() -> None:
    velocity = np.array([[1.0, -2.0], [np.nan, 0.0], [0.25, 0.5]], np.float32)
    det = Detections(BOXES, np.float32([0.9, 0.8, 0.7]), np.int32([9, 0, 4]), tuple(f"c{i}" for i in range(10)),
                     FrameStats(10), velocity)
    found = det.to_pcdet_dict()
    assert found["pred_boxes"].dtype == np.float32 and found["pred_boxes"].shape == (3, 9)
    np.testing.assert_array_equal(found["pred_boxes"], np.float32([[1, 2, 0, 4, 2, 1.5, 0.1, 1, -2],
                                                                   [5, 6, 0, 4, 2, 1.5, 3.5, np.nan, 0],  # kept
                                                                   [9, 9, 0, 1, 1, 1, 0, 0.25, 0.5]]))
    assert found["pred_labels"].tolist() == [10, 1, 5]


@pytest.mark.parametrize("velocity, columns", [(None, 7), (np.zeros((0, 2), np.float32), 9)])
def test_an_empty_frames_pcdet_dict_has_arrays_of_no_row(velocity: np.ndarray | None, columns: int) -> None:
    det = Detections(np.zeros((0, 7), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), KITTI,
                     FrameStats(5), velocity)
    found = det.to_pcdet_dict()
    assert {k: (v.dtype, v.shape) for k, v in found.items()} == {
        "pred_boxes": (np.float32, (0, columns)), "pred_scores": (np.float32, (0,)), "pred_labels": (np.int64, (0,))}
    assert Detections.empty(KITTI, FrameStats(5)).to_pcdet_dict()["pred_boxes"].shape == (0, 7)


@pytest.mark.parametrize("velocity", [None, np.array([[1.0, -2.0], [0.5, 0.0], [0.25, 0.5]], np.float32)])
@pytest.mark.parametrize("rows", [3, 0])
def test_a_pcdet_dict_reads_back_as_the_detections_it_was(velocity: np.ndarray | None, rows: int) -> None:
    det = Detections(BOXES[:rows], np.float32([0.9, 0.8, 0.7])[:rows], np.int32([0, 2, 1])[:rows], KITTI,
                     FrameStats(10, 1, 4), None if velocity is None else velocity[:rows])
    assert Detections.from_pcdet_dict(det.to_pcdet_dict(), list(KITTI), FrameStats(10, 1, 4)) == det


def test_an_openpcdet_result_reads_in_a_detectors_dtypes() -> None:
    """What OpenPCDet's tensors give through ``.cpu().numpy()``, or lists: float64 and any integer labels read as a
    detector's float32 and int32 0-based ones, extra keys left out."""
    given = {"pred_boxes": BOXES.astype(np.float64).tolist(), "pred_scores": [0.9, 0.8, 0.7],
             "pred_labels": np.uint8([3, 1, 1]), "pred_cls_scores": np.zeros((3, 3))}
    found = Detections.from_pcdet_dict(given, KITTI)
    assert found == Detections(BOXES, np.float32([0.9, 0.8, 0.7]), np.int32([2, 0, 0]), KITTI, FrameStats(0))
    assert found.names == ["Cyclist", "Car", "Car"]


@pytest.mark.parametrize("given, fragment", [
    ({"pred_boxes": BOXES, "pred_scores": np.ones(3, np.float32)}, "no 'pred_labels' (keys: ['pred_boxes', "),
    ({"pred_boxes": BOXES, "pred_scores": np.ones(3, np.float32), "pred_labels": np.int64([0, 1, 2])},
     "pred_labels']: outside 1..3 (1-based into 3 class names, found 0..2)"),  # 0-based labels given
    ({"pred_boxes": BOXES, "pred_scores": np.ones(3, np.float32), "pred_labels": np.int64([1, 2, 4])},
     "outside 1..3"),
    ({"pred_boxes": BOXES[:, :6], "pred_scores": np.ones(3, np.float32), "pred_labels": np.int64([1, 1, 1])},
     "pred_boxes (3, 6), pred_scores (3,), pred_labels (3,); expected (N, 7) or (N, 9), (N,), (N,)"),
    ({"pred_boxes": BOXES, "pred_scores": np.ones(2, np.float32), "pred_labels": np.int64([1, 1, 1])},
     "pred_scores (2,)"),
    ({"pred_boxes": BOXES, "pred_scores": np.ones(3, np.float32), "pred_labels": np.float32([1, 1, 1])},
     "pred_dict['pred_labels']: 1-D float32, expected 1-D integers"),
    ({"pred_boxes": BOXES.reshape(-1), "pred_scores": np.ones(3, np.float32), "pred_labels": np.int64([1, 1, 1])},
     "pred_dict['pred_boxes']: 1-D float32, expected 2-D floats"),
    ([{"pred_boxes": BOXES}], "pred_dict: a list, expected one frame's dict (an entry of pred_dicts)"),
])
def test_what_is_no_pcdet_dict_is_refused_saying_why(given: object, fragment: str) -> None:
    from pointpillars_trt.errors import InputError

    with pytest.raises(InputError) as info:
        Detections.from_pcdet_dict(given, KITTI)  # type: ignore[arg-type]
    assert fragment in str(info.value), str(info.value)


def test_class_names_given_as_one_str_are_refused() -> None:
    from pointpillars_trt.errors import InputError

    given = {"pred_boxes": BOXES, "pred_scores": np.ones(3, np.float32), "pred_labels": np.int64([1, 1, 1])}
    with pytest.raises(InputError, match="class_names: the str 'Car', expected a sequence of names"):
        Detections.from_pcdet_dict(given, "Car")


def test_a_nuscenes_models_result_as_openpcdet_gives_it(nuscenes, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real multi-head checkpoint on the CPU: its 10 classes' boxes come out as (N, 9) with their velocities, the
    labels naming through OpenPCDet's class_names[pred_labels - 1] what ``names`` says, and back to the same result."""
    from pointpillars_trt import PointPillars
    from pointpillars_trt.pointcloud_io import read_points

    points = read_points(nuscenes / "nusc_dev_k000002_s02.bin", point_dim=5, columns=5)
    checkpoint = nuscenes / "cbgs_pp_multihead_synthetic_dev.pth"
    with published_config_notice(checkpoint):
        detector = PointPillars.from_checkpoint(checkpoint, device="cpu", cache_dir=tmp_path)
    with detector:
        det = detector(points)
    found = det.to_pcdet_dict()
    assert len(det) >= 10 and det.velocity is not None
    assert found["pred_boxes"].shape == (len(det), 9) and found["pred_boxes"].dtype == np.float32
    np.testing.assert_array_equal(found["pred_boxes"][:, :7], det.boxes)
    np.testing.assert_array_equal(found["pred_boxes"][:, 7:], det.velocity)
    assert np.array(det.class_names)[found["pred_labels"] - 1].tolist() == det.names
    assert set(found["pred_labels"].tolist()) == set(range(1, 11))  # every class scores on this frame
    assert Detections.from_pcdet_dict(found, det.class_names, det.stats) == det


def test_an_empty_result_of_a_velocity_model_holds_no_velocities_as_openpcdet_gives_it() -> None:
    """``Detections.empty`` of a model that predicts velocities (a failed frame's row of a nuScenes model) had none:
    (0, 7) boxes as OpenPCDet's entry, and a JSON record without ``velocity``, where the model's other results have
    (0, 9) and the key."""
    names = ("car", "pedestrian")
    found = Detections.empty(names, FrameStats(0), velocity=True)
    assert found.velocity is not None and found.velocity.shape == (0, 2) and found.velocity.dtype == np.float32
    assert found.to_pcdet_dict()["pred_boxes"].shape == (0, 9)
    assert found.to_json_dict("x")["velocity"] == []
    plain = Detections.empty(names, FrameStats(0))
    assert plain.velocity is None and plain.to_pcdet_dict()["pred_boxes"].shape == (0, 7)
    assert "velocity" not in plain.to_json_dict("x")


@pytest.mark.parametrize("stats, finding", [
    (FrameStats(100, 0), "range"), (FrameStats(150, 50), "range"),  # 100 finite points: enough to tell
    (FrameStats(100, 1), None), (FrameStats(150, 51), None), (FrameStats(100, 99), None),  # 99 and 1: too few
    (FrameStats(100, 100), "nonfinite"),  # of the frame's total points, as its wording says
    (FrameStats(100, 99, num_pillars=1), "onepillar"), (FrameStats(99, 0), None),
])
def test_only_a_frame_of_enough_finite_points_none_in_range_is_said_misplaced(stats: FrameStats,
                                                                             finding: str | None) -> None:
    """The range finding asks MISPLACED_FROM (100) finite points, as its comment says: a frame of 100 points of
    which 1 to 99 were finite, none in the model's range, was warned about as misplaced points (the total counted);
    the non-finite and one-pillar findings still count every point."""
    from pointpillars_trt.detections import misread_finding

    found = misread_finding(stats, (0, -40, -3, 70.4, 40, 1))
    assert (found and found[0]) == finding
    if finding == "range":
        assert found is not None and found[1] == (
            f"none of its {stats.num_points - stats.num_nonfinite} finite points lies in the model's point range "
            "x 0..70.4 y -40..40 z -3..1: are they metres in the lidar frame (x forward, y left, z up)?")
