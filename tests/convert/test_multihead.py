"""OpenPCDet's multi-head (nuScenes) layout: config from its YAML, checkpoint recognition and checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.config import config_from_dict, load_config
from pointpillars_trt.convert.checkpoint import load_checkpoint, weights_from_state_dict
from pointpillars_trt.convert.pth import read_pth
from pointpillars_trt.anchors import head_anchors
from pointpillars_trt.convert.multihead import MultiHeadWeights, expected_keys
from pointpillars_trt.convert.pcdet_config import config_from_pcdet_yaml
from pointpillars_trt.errors import CheckpointError, ConfigError, SettingNotice
from test_config import edited

CBGS = Path(__file__).resolve().parent.parent / "data" / "pcdet" / "tools" / "cfgs" / "nuscenes_models" / \
    "cbgs_pp_multihead.yaml"
NAME = "openpcdet_nuscenes_multihead"


def test_pcdet_yaml_gives_the_builtin_config() -> None:
    with pytest.warns(SettingNotice, match=r"SHUFFLE_ENABLED shuffles the points at test time; this package keeps "
                                         r"them in input order"):
        imported = config_from_pcdet_yaml(CBGS)  # no name: the built-in's, as `build --pcdet-config` reads it
    builtin = load_config(NAME)
    assert imported == builtin and imported.digest() == builtin.digest()
    assert builtin.point_columns == ("x", "y", "z", "intensity", "time") and builtin.features.channels == 11
    assert builtin.box_code_size == 10 and builtin.direction is None
    assert builtin.head_map == (128, 128) and head_anchors(builtin) == (2, 4, 4, 2, 4, 4)
    # each head scores its own classes: 2 anchors x 1 class, 4 x 2, ...; 20 anchors x 10 box values
    assert builtin.head_channels == {"cls": 2 + 8 + 8 + 2 + 8 + 8, "box": 200, "dir": 0}
    assert config_from_dict(builtin.to_dict()) == builtin


def test_pcdet_multihead_direction_classifier_is_refused(tmp_path: Path) -> None:
    text = CBGS.read_text().replace("        NUM_DIR_BINS: 2\n", "        NUM_DIR_BINS: 2\n        USE_DIRECTION_CLASSIFIER: True\n")
    (tmp_path / "nuscenes_models").mkdir()
    path = tmp_path / "nuscenes_models" / "with_dir.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(path, base_dir=CBGS.parent.parent.parent)
    assert str(info.value) == f"'{path}': MODEL.DENSE_HEAD.USE_DIRECTION_CLASSIFIER is True; supported: False"
    no_dir = text.replace("USE_DIRECTION_CLASSIFIER: True", "USE_DIRECTION_CLASSIFIER: False")
    path.write_text(no_dir)
    with pytest.warns(SettingNotice, match="SHUFFLE_ENABLED"):
        assert config_from_pcdet_yaml(path, base_dir=CBGS.parent.parent.parent, name=NAME) == load_config(NAME)


def multihead(changes: dict[str, Any]) -> dict[str, Any]:
    return edited(changes, NAME)


@pytest.mark.parametrize("changes, message", [
    ({"heads.groups[1]": ["construction_vehicle", "truck"]},
     "heads.groups: the heads' classes, in order, must be the classes; got 'construction_vehicle' at position 1, "
     "where the classes have 'truck'"),
    ({"heads.groups[5]": ["pedestrian"]}, "heads.groups: the heads' classes, in order, must be the classes; got 9 for "
                                         "10 classes"),
    ({"classes": ["car"], "heads.groups": [["car"], ["truck"]]},  # one class, in the singular
     "heads.groups: the heads' classes, in order, must be the classes; got 2 for 1 class"),
    ({"anchors.classes[8].class": "traffic_cone", "anchors.classes[9].class": "pedestrian"},
     "anchors.classes: a multi-head model lists one anchor per class in the classes' order; got 'traffic_cone' at "
     "position 8, where the classes have 'pedestrian'"),
    ({"postprocess.nms": "class_agnostic"},
     "postprocess.nms: multi_classes (per-class NMS inside each head) goes with heads, and heads with multi_classes"),
    ({"heads": None}, "postprocess.nms: multi_classes (per-class NMS inside each head) goes with heads, and heads "
                      "with multi_classes"),
    ({"network.upsample_strides[0]": 0.3},
     "network.upsample_strides[0]: expected an integer in 1..64 or 1/k for an integer k in 2..8 (e.g. 0.5), got 0.3"),
    ({"box_code.angle": "quaternion"}, "box_code.angle: expected one of residual, sincos, got 'quaternion'"),
    ({"heads.middle_bn_eps": 0}, "heads.middle_bn_eps: expected a finite number in (0, 1], got 0"),
    ({"box_coder": "zhulf0804"}, "box_coder: multi-head models decode boxes as OpenPCDet does (box_coder: openpcdet); "
                                 "got zhulf0804"),
])
def test_multihead_config_refusals(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(multihead(changes))
    assert str(info.value) == f"<dict>: {message}"


@pytest.mark.parametrize("changes, message", [
    ({"network.upsample_strides": [0.5, 1, 2], "anchors.stride": 4},
     "network.upsample_strides[0]: a stride below 1 (a strided conv) is supported in multi-head models only"),
    ({"direction": None}, "direction: single-head models need a direction classifier"),
    ({"box_code": {"angle": "sincos", "velocity": False}},
     "box_code: sin/cos headings and velocities are supported in multi-head models only"),
])
def test_single_head_models_keep_their_limits(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(edited(changes))
    assert str(info.value) == f"<dict>: {message}"


@pytest.fixture(scope="module")
def checkpoint(nuscenes: Path) -> Path:
    return nuscenes / "cbgs_pp_multihead_synthetic_dev.pth"


def test_checkpoint_is_recognised_by_its_keys(checkpoint: Path) -> None:
    ckpt = load_checkpoint(checkpoint)
    assert ckpt.layout == "openpcdet" and ckpt.config_name == NAME and isinstance(ckpt.weights, MultiHeadWeights)
    state = read_pth(checkpoint)["model_state"]
    counters = [k for k in state if k == "global_step" or k.endswith(("num_batches_tracked", "head_label_indices"))]
    assert sorted(expected_keys(ckpt.config)) == sorted(set(state) - set(counters))
    assert len(state) == 421 and len(counters) == 421 - len(expected_keys(ckpt.config))
    # OpenPCDet's Conv2d of the 0.5 upsample is (Cout, Cin, 2, 2); the others are ConvTranspose2d (Cin, Cout, k, k)
    assert [d.weight.shape for d in ckpt.weights.deblocks] == [(128, 64, 2, 2), (128, 128, 1, 1), (256, 128, 2, 2)]


def test_head_classes_must_match_the_config(checkpoint: Path) -> None:
    state = {k: np.asarray(v) for k, v in read_pth(checkpoint)["model_state"].items()}
    state["dense_head.rpn_heads.4.head_label_indices"] = np.array([8, 7], np.int64)
    with pytest.raises(CheckpointError, match=r"^ckpt: dense_head\.rpn_heads\.4\.head_label_indices is \[8, 7\]; "
                                              r"config openpcdet_nuscenes_multihead expects the classes \[7, 8\] "
                                              r"\(1-based\) in that head$"):
        weights_from_state_dict(state, "openpcdet", load_config(NAME), source="ckpt")


def test_kitti_config_refuses_the_multihead_checkpoint_naming_its_own(checkpoint: Path) -> None:
    """A config given that the checkpoint's keys do not fit, when they fit its layout's own config exactly: the
    error names that config and the fix, not 263 unexpected keys."""
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(checkpoint, "openpcdet_kitti_3class")
    assert str(refused.value) == (f"{checkpoint}: a checkpoint of config openpcdet_nuscenes_multihead (its keys and "
                                  "shapes are that config's), not of config openpcdet_kitti_3class; drop --config to "
                                  "read it with openpcdet_nuscenes_multihead (Python: config=None)")
    with pytest.raises(CheckpointError, match=r"checkpoint has the openpcdet layout, but config zhulf0804_kitti_3class "
                                              r"is for the zhulf0804 family; drop --config to read it with "
                                              r"openpcdet_nuscenes_multihead \(Python: config=None\)$"):
        load_checkpoint(checkpoint, "zhulf0804_kitti_3class")
