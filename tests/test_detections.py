"""The JSON record of a frame's detections: velocities for models that predict them."""

from __future__ import annotations

import json

import numpy as np
import pytest

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
                           "num_pillars=20, num_pillars_dropped=0)>")
    assert repr(Detections.empty(("Car",), FrameStats(5))).startswith("<Detections: 0 boxes; FrameStats(num_points=5")
    odd = Detections(boxes[:1], np.ones(1, np.float32), np.array([7], np.int32), ("Car",), FrameStats(1))
    assert repr(odd).startswith("<Detections: 1 box: 7 1; ")
