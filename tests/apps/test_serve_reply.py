"""The client's checks of a served model's config and replies (``apps/serve/reply.py``), and the
reading of frames' bytes as the Ray workers get them, for models of 4 and 5 values a point."""

from __future__ import annotations

import numpy as np
import pytest

from pointpillars_trt.apps.serve.reply import LATER_STATS, check_model_config, reply_detections
from pointpillars_trt.errors import BackendError, InputError
from pointpillars_trt.pointcloud_io import read_bin_bytes_into


def config(columns: int = 4, velocity: bool = False) -> dict:  # type: ignore[type-arg]
    outputs = [{"name": "boxes", "data_type": "TYPE_FP32"}, {"name": "scores", "data_type": "TYPE_FP32"}]
    outputs += [{"name": n, "data_type": "TYPE_INT32"}
                for n in ("labels", "num_points", "num_nonfinite", "num_pillars", "num_pillars_dropped")]
    if velocity:
        outputs.append({"name": "velocity", "data_type": "TYPE_FP32"})
    return {"parameters": {"class_names": {"string_value": "car,truck"}, "max_points": {"string_value": "900"}},
            "input": [{"name": "points", "data_type": "TYPE_FP32", "dims": ["-1", str(columns)]}], "output": outputs}


SENT = 7  # points of the frame each reply answers


def reply(count: int, velocity: bool) -> dict[str, np.ndarray]:
    arrays = {"boxes": np.ones((1, count, 7), np.float32), "scores": np.full((1, count), 0.5, np.float32),
              "labels": np.ones((1, count), np.int32), "num_points": np.full((1, 1), SENT, np.int32),
              **{n: np.zeros((1, 1), np.int32) for n in ("num_nonfinite", "num_pillars", "num_pillars_dropped")}}
    if velocity:
        arrays["velocity"] = np.arange(2 * count, dtype=np.float32).reshape(1, count, 2)
    return arrays


def test_a_multi_sweep_model_with_velocities_is_read_from_its_config_and_replies() -> None:
    kitti, nuscenes = check_model_config(config(), "m"), check_model_config(config(5, True), "m")
    assert (kitti.num_point_columns, kitti.velocity, kitti.max_points) == (4, False, 900)
    assert (nuscenes.num_point_columns, nuscenes.velocity, nuscenes.class_names) == (5, True, ("car", "truck"))
    found = reply_detections(reply(3, True), list(reply(3, True)), nuscenes, "server", SENT)
    np.testing.assert_array_equal(found.velocity, np.arange(6, dtype=np.float32).reshape(3, 2))
    assert reply_detections(reply(2, False), list(reply(2, False)), kitti, "server", SENT).velocity is None
    with pytest.raises(BackendError, match=r"server answered with outputs .*; missing velocity"):
        reply_detections(reply(3, False), list(reply(3, False)), nuscenes, "server", SENT)
    bad = reply(3, True)
    bad["velocity"] = bad["velocity"][:, :2]
    with pytest.raises(BackendError, match=r"inconsistent shapes .*velocity \(1, 2, 2\)"):
        reply_detections(bad, list(bad), nuscenes, "server", SENT)


@pytest.mark.parametrize("name", LATER_STATS)
def test_a_later_count_is_read_where_the_served_model_declares_it(name: str) -> None:
    """A server of this version declares each of ``LATER_STATS`` (``num_overflowed_scores``, ...) and its replies carry
    it into ``FrameStats``; one of an earlier version declares no such output: still our model, its replies count 0;
    a mistyped one is not ours."""
    earlier = check_model_config(config(), "m")
    assert earlier.later_stats == () and name not in earlier.outputs
    found = reply_detections(reply(2, False), list(reply(2, False)), earlier, "server", SENT)
    assert getattr(found.stats, name) == 0
    declared = config()
    declared["output"].append({"name": name, "data_type": "TYPE_INT32"})
    served = check_model_config(declared, "m")
    assert served.later_stats == (name,)
    answer = {**reply(2, False), name: np.full((1, 1), 37, np.int32)}
    assert getattr(reply_detections(answer, list(answer), served, "server", SENT).stats, name) == 37
    with pytest.raises(BackendError, match=rf"server answered with outputs .*; missing {name}"):
        reply_detections(reply(2, False), list(reply(2, False)), served, "server", SENT)
    declared["output"][-1]["data_type"] = "TYPE_FP32"
    with pytest.raises(BackendError, match=r"is not a pointpillars-trt model: its outputs lack or mistype "
                                           rf"{name}"):
        check_model_config(declared, "server s: model 'm'")


@pytest.mark.parametrize("columns,velocity_type", [(6, None), (4, "TYPE_INT32")])
def test_other_point_widths_and_a_mistyped_velocity_are_not_our_model(columns: int, velocity_type: str | None) -> None:
    cfg = config(columns, velocity_type is not None)
    if velocity_type is not None:
        cfg["output"][-1]["data_type"] = velocity_type
    with pytest.raises(BackendError, match=r"is not a pointpillars-trt model: (it has no FP32 input 'points' of dims "
                                           r"\[-1, 4\] or \[-1, 5\]|its outputs lack or mistype velocity)"):
        check_model_config(cfg, "server s: model 'm'")


def test_frame_bytes_of_five_values_a_point_keep_the_time_lag() -> None:
    points = np.arange(30, dtype=np.float32).reshape(6, 5)
    points[:, 4] /= 100  # time lags of 0.04 to 0.29 s
    got = read_bin_bytes_into(points.tobytes(), lambda n: None, point_dim=5, columns=5)
    np.testing.assert_array_equal(got, points)
    rows = np.zeros((6, 4), np.float32)
    assert read_bin_bytes_into(points.tobytes(), lambda n: rows, point_dim=5) is rows  # a 4-column model
    np.testing.assert_array_equal(rows, points[:, :4])
    with pytest.raises(InputError, match=r"point_dim 4: the model reads 5 values a point \(x, y, z, intensity, time\); "
                                         r"files of 5 values a point are read with point_dim 5 \(--point-dim 5\); a multi-sweep "
                                         r"model needs accumulated frames, each point's 5th value its time lag .*PointPillars.accumulate"):
        read_bin_bytes_into(points.tobytes(), lambda n: None, point_dim=4, columns=5, source="frame.bin")


def test_a_reply_counting_other_points_than_were_sent_is_refused() -> None:
    """A reply whose num_points is not the frame's point count answers another frame (a proxy or server that
    mixed up replies): refused naming both counts (a frame of one point, as a health probe sends, in the
    singular), not taken as this frame's boxes."""
    kitti = check_model_config(config(), "m")
    assert reply_detections(reply(2, False), list(reply(2, False)), kitti, "server", SENT).stats.num_points == SENT
    with pytest.raises(BackendError, match=rf"server answered num_points {SENT} to a frame of {SENT + 1} points "
                                           r"\(another frame's reply\?\)"):
        reply_detections(reply(2, False), list(reply(2, False)), kitti, "server", SENT + 1)
    with pytest.raises(BackendError, match=rf"server answered num_points {SENT} to a frame of 1 point \(another"):
        reply_detections(reply(2, False), list(reply(2, False)), kitti, "server", 1)


@pytest.mark.parametrize("classes", ["car", "car,truck"])
def test_a_reply_of_labels_past_the_models_classes_is_refused_counting_them(classes: str) -> None:
    """A label past the served model's classes is refused naming them, one class in the singular (it said
    '1 classes')."""
    served = config()
    served["parameters"]["class_names"]["string_value"] = classes
    model = check_model_config(served, "m")
    arrays = reply(2, False)
    arrays["labels"][0, 1] = count = len(classes.split(","))
    counted = "1 class" if count == 1 else "2 classes"
    with pytest.raises(BackendError) as err:
        reply_detections(arrays, list(arrays), model, "server", SENT)
    assert str(err.value) == f"server answered labels outside 0..{count - 1} (its {counted})"


def served_parameters(dataset: dict[str, bool]) -> dict[str, dict[str, str]]:
    """The parameters of the repository config ``serve`` writes for the tiny model whose model.json records
    ``dataset``, in the JSON form Triton gives a client."""
    import re

    from tiny import tiny_config

    from pointpillars_trt.apps.serve.repository import model_config_text
    from pointpillars_trt.model_dir import ModelDir

    text = model_config_text(ModelDir(".", tiny_config(), {"dataset": dataset, "precision": "fp32"}), instances=1,
                             max_batch=8, max_queue_delay_us=0, device="cpu", max_points=10)
    return {key: {"string_value": value.replace('\\"', '"')} for key, value in  # the text format's quotes undone
            re.findall(r'parameters \{ key: "(\w+)", value: \{ string_value: "(.*)" \} \}', text)}


@pytest.mark.parametrize("dataset, trained", [({"fov_points_only": False}, False), ({"fov_points_only": True}, True),
                                              ({}, None)])
def test_a_served_models_point_range_and_training_crop_reach_the_client(dataset: dict[str, bool],
                                                                        trained: bool | None) -> None:
    """``infer --server`` draws its --viz pictures over the model's point range and crops by default as the model
    was trained, as local infer does by the model dir: serve's config says both (it said neither: the pictures
    spanned all the points, and a model trained on full scans got its KITTI frames cropped)."""
    from tiny import tiny_config

    served = check_model_config({**config(), "parameters": served_parameters(dataset)}, "m")
    assert served.point_range == tuple(tiny_config().voxel.point_range) and served.fov_points_only is trained


@pytest.mark.parametrize("key, value, said", [("point_range", "0,0,0,1,1", "point_range '0,0,0,1,1' is not six numbers"),
                                              ("point_range", "0,0,0,1,nan,1", "point_range '0,0,0,1,nan,1' is not six"),
                                              ("point_range", "5,0,0,1,1,1", "point_range '5,0,0,1,1,1' is not six"),
                                              ("fov_points_only", "yes", "fov_points_only 'yes' is neither true nor")])
def test_a_served_point_range_or_training_crop_that_is_none_is_not_our_model(key: str, value: str, said: str) -> None:
    cfg = config()
    cfg["parameters"][key] = {"string_value": value}
    with pytest.raises(BackendError, match=rf"^server s: model 'm' is not a pointpillars-trt model: {said}"):
        check_model_config(cfg, "server s: model 'm'")
    del cfg["parameters"][key]  # a server of an earlier version says neither: taken as unknown
    assert (check_model_config(cfg, "m").point_range, check_model_config(cfg, "m").fov_points_only) == (None, None)


def test_a_served_models_identity_reaches_the_client_and_one_that_is_none_is_not_our_model() -> None:
    """The identity serve's config states (what ``infer --server`` records with its outputs) is the model's weights,
    config digest and name, and precision, read back as written; a server stating another object is refused by name.
    Oracle: the tiny model's own config and the model.json the test gives it."""
    from tiny import tiny_config

    cfg = config()
    cfg["parameters"] = {**cfg["parameters"], **served_parameters({})}
    served = check_model_config(cfg, "m")
    assert served.identity == {"weights": None, "config": tiny_config().digest(), "config_name": tiny_config().name,
                               "precision": "fp32"}
    cfg["parameters"]["model_identity"] = {"string_value": '{"weights": null, "config": "x"}'}
    with pytest.raises(BackendError, match=r"^s: model 'm' is not a pointpillars-trt model: model_identity .* is not a "
                                           r"JSON object of weights, config, config_name and precision"):
        check_model_config(cfg, "s: model 'm'")
