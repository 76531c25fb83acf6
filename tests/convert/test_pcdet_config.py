"""OpenPCDet model configs -> ModelConfig: the real pointpillar.yaml, a custom one, and refusals by key path."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pointpillars_trt.anchors import anchors
from pointpillars_trt.convert.pcdet_config import config_from_pcdet_yaml
from pointpillars_trt.config import ModelConfig, load_config
from pointpillars_trt.errors import ConfigError
from pointpillars_trt.reference.voxel import voxelize

TOOLS = Path(__file__).resolve().parent.parent / "data" / "pcdet" / "tools"
POINTPILLAR = TOOLS / "cfgs" / "kitti_models" / "pointpillar.yaml"
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def test_real_pointpillar_yaml_is_the_builtin_config() -> None:
    builtin = load_config("openpcdet_kitti_3class")
    imported = config_from_pcdet_yaml(POINTPILLAR)
    assert imported == builtin and imported.digest() == builtin.digest()  # the built-in's name, so one digest
    named = config_from_pcdet_yaml(POINTPILLAR, name="openpcdet_pointpillar")  # a name given is kept
    assert named.name == "openpcdet_pointpillar" and dataclasses.replace(named, name=builtin.name) == builtin
    assert config_from_pcdet_yaml(POINTPILLAR, base_dir=TOOLS) == imported


def _pcdet_yaml(folder: Path, changes: dict[str, Any]) -> Path:
    """pointpillar.yaml with ``changes`` applied by key path, written where its base still resolves."""
    raw = yaml.safe_load(POINTPILLAR.read_text())
    for path, value in changes.items():
        *parents, last = [m.group(1) or int(m.group(2)) for m in _STEP.finditer(path)]
        node: Any = raw
        for step in parents:
            node = node[step]
        node[last] = value
    out = folder / "tools" / "cfgs" / "kitti_models" / "custom.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    base = folder / "tools" / "cfgs" / "dataset_configs" / "kitti_dataset.yaml"
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_bytes((TOOLS / "cfgs" / "dataset_configs" / "kitti_dataset.yaml").read_bytes())
    return out


def _anchor_entry(name: str, size: list[float], bottom: float) -> dict[str, Any]:
    return {"class_name": name, "anchor_sizes": [size], "anchor_rotations": [0, 1.57],
            "anchor_bottom_heights": [bottom], "align_center": True, "feature_map_stride": 2,
            "matched_threshold": 0.6, "unmatched_threshold": 0.45}


CUSTOM: dict[str, Any] = {
    "CLASS_NAMES": ["Vehicle", "Pedestrian"],
    "DATA_CONFIG.POINT_CLOUD_RANGE": [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0],
    "DATA_CONFIG.DATA_PROCESSOR[2].VOXEL_SIZE": [0.32, 0.32, 8.0],
    "DATA_CONFIG.DATA_PROCESSOR[2].MAX_POINTS_PER_VOXEL": 20,
    "DATA_CONFIG.DATA_PROCESSOR[2].MAX_NUMBER_OF_VOXELS": {"train": 32000, "test": 30000},
    "DATA_CONFIG.POINT_FEATURE_ENCODING": {"used_feature_list": ["x", "y", "z"]},  # merged into the base's
    "MODEL.VFE.USE_ABSLOTE_XYZ": False,
    "MODEL.VFE.NUM_FILTERS": [32],
    "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES": 32,
    "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG": [_anchor_entry("Vehicle", [4.7, 2.1, 1.7], -0.6),
                                                 _anchor_entry("Pedestrian", [0.9, 0.9, 1.8], -0.4)],
    "MODEL.DENSE_HEAD.DIR_OFFSET": 0.5,
    "MODEL.POST_PROCESSING.SCORE_THRESH": 0.3,
    "MODEL.POST_PROCESSING.NMS_CONFIG.NMS_THRESH": 0.2,
    "MODEL.POST_PROCESSING.NMS_CONFIG.NMS_PRE_MAXSIZE": 1000,
    "MODEL.POST_PROCESSING.NMS_CONFIG.NMS_POST_MAXSIZE": 83,
}


@pytest.fixture()
def custom(tmp_path: Path) -> ModelConfig:
    return config_from_pcdet_yaml(_pcdet_yaml(tmp_path, CUSTOM))


def test_custom_yaml_fields(custom: ModelConfig) -> None:
    assert custom.name == "openpcdet_custom" and custom.family == "openpcdet" and custom.legacy_label_base == 1
    assert custom.classes == ("Vehicle", "Pedestrian")
    v = custom.voxel
    assert v.point_range == (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0) and v.pillar_size == (0.32, 0.32, 8.0)
    assert v.grid == (320, 320, 1) and v.max_points_per_pillar == 20 and v.max_pillars == 30000
    assert v.range_filter == "inclusive_xy"
    assert custom.features.order == ("mean_dx", "mean_dy", "mean_dz", "center_dx", "center_dy", "center_dz")
    assert custom.network.pfn_channels == 32
    assert [(c.name, c.size, c.bottom) for c in custom.anchors.classes] == [
        ("Vehicle", (4.7, 2.1, 1.7), -0.6), ("Pedestrian", (0.9, 0.9, 1.8), -0.4)]
    assert custom.anchors.rotations == (0.0, 1.57) and custom.anchors.alignment == "cell_centers"
    assert custom.head_map == (160, 160) and custom.num_anchors == 160 * 160 * 4
    assert custom.direction.offset == 0.5 and custom.direction.flip_bin == 1
    pp = custom.postprocess
    assert (pp.nms, pp.score_threshold, pp.score_inclusive) == ("class_agnostic", 0.3, True)
    assert (pp.pre_nms_top_k, pp.nms_iou, pp.max_boxes, pp.output_range) == (1000, 0.2, 83, None)


def test_numpy_reference_follows_a_custom_config(custom: ModelConfig) -> None:
    table = anchors(custom)
    assert table.shape == (custom.num_anchors, 7)
    assert table[:, 0].min() > -51.2 and table[:, 0].max() < 51.2  # cell centres inside the range
    np.testing.assert_allclose(np.unique(table[:, 3:6], axis=0), [[0.9, 0.9, 1.8], [4.7, 2.1, 1.7]], rtol=1e-6)
    points = np.array([[-51.0, -51.0, 0.0, 0.5], [50.9, 50.9, 2.9, 0.1], [60.0, 0.0, 0.0, 0.2]], np.float32)
    pillars = voxelize(points, custom)
    assert pillars.num_pillars == 2  # x = 60 is outside the custom range
    assert pillars.features.shape[1:] == (20, 6)  # max points, decorations without absolute xyz
    assert sorted(map(tuple, pillars.coords[:2, 2:].tolist())) == [(0, 0), (319, 319)]


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"MODEL.NAME": "SECONDNet"}, "MODEL.NAME is 'SECONDNet'; supported: 'PointPillar'"),
    ({"MODEL.VFE.NAME": "DynamicPillarVFE"}, "MODEL.VFE.NAME is 'DynamicPillarVFE'; supported: 'PillarVFE'"),
    ({"MODEL.VFE.WITH_DISTANCE": True}, "MODEL.VFE.WITH_DISTANCE is True; supported: False"),
    ({"MODEL.VFE.USE_NORM": False}, "MODEL.VFE.USE_NORM is False; supported: True"),
    ({"MODEL.VFE.USE_ABSLOTE_XYZ": 1}, "MODEL.VFE.USE_ABSLOTE_XYZ is 1; supported: True or False"),
    ({"MODEL.VFE.NUM_FILTERS": [64, 64]}, "MODEL.VFE.NUM_FILTERS is [64, 64]; supported: one PFN layer"),
    # a filter count of no channels is named itself (it was blamed on NUM_BEV_FEATURES: "supported: 0"), as is
    # one beyond the kernels' (named as this package's network.pfn_channels)
    ({"MODEL.VFE.NUM_FILTERS": [0]}, "MODEL.VFE.NUM_FILTERS is [0]; supported: one PFN layer of 1 to 256 channels"),
    ({"MODEL.VFE.NUM_FILTERS": [-64], "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES": -64},
     "MODEL.VFE.NUM_FILTERS is [-64]; supported: one PFN layer of 1 to 256 channels"),
    ({"MODEL.VFE.NUM_FILTERS": [512], "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES": 512},
     "MODEL.VFE.NUM_FILTERS is [512]; supported: one PFN layer of 1 to 256 channels"),
    ({"MODEL.VFE.NUM_FILTERS": [64.0]}, "MODEL.VFE.NUM_FILTERS is [64.0]; supported: one PFN layer of 1 to 256"),
    ({"MODEL.VFE.EXTRA": 1}, "MODEL.VFE.EXTRA is not supported"),
    # the two channel counts that disagree are both named, whichever of them is wrong
    ({"MODEL.MAP_TO_BEV.NUM_BEV_FEATURES": 32}, "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES is 32 and MODEL.VFE.NUM_FILTERS "
                                                "is [64]: the two must be equal"),
    ({"MODEL.VFE.NUM_FILTERS": [32]}, "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES is 64 and MODEL.VFE.NUM_FILTERS is [32]: "
                                      "the two must be equal"),
    ({"MODEL.MAP_TO_BEV.NUM_BEV_FEATURES": "64"}, "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES is '64'; supported: a whole "
                                                  "number, the PFN layer's channels (64)"),
    ({"MODEL.MAP_TO_BEV.NUM_BEV_FEATURES": 64.0}, "MODEL.MAP_TO_BEV.NUM_BEV_FEATURES is 64.0; supported: a whole "
                                                  "number, the PFN layer's channels (64)"),
    ({"MODEL.BACKBONE_2D.NAME": "BaseBEVResBackbone"}, "MODEL.BACKBONE_2D.NAME is 'BaseBEVResBackbone'"),
    ({"MODEL.BACKBONE_3D": {"NAME": "VoxelBackBone8x"}}, "MODEL.BACKBONE_3D is not supported"),
    ({"MODEL.DENSE_HEAD.NAME": "AnchorHeadMulti"},  # a multi-head model has no direction classifier here
     "MODEL.DENSE_HEAD.USE_DIRECTION_CLASSIFIER is True; supported: False"),
    ({"MODEL.DENSE_HEAD.NAME": "AnchorHeadSingle2"}, "MODEL.DENSE_HEAD.NAME is 'AnchorHeadSingle2'; supported: "
                                                     "'AnchorHeadSingle' or 'AnchorHeadMulti'"),
    ({"MODEL.DENSE_HEAD.CLASS_AGNOSTIC": True}, "MODEL.DENSE_HEAD.CLASS_AGNOSTIC is True; supported: False"),
    ({"MODEL.DENSE_HEAD.USE_DIRECTION_CLASSIFIER": False}, "MODEL.DENSE_HEAD.USE_DIRECTION_CLASSIFIER is False"),
    ({"MODEL.DENSE_HEAD.TARGET_ASSIGNER_CONFIG.BOX_CODER": "PreviousResidualDecoder"},
     "MODEL.DENSE_HEAD.TARGET_ASSIGNER_CONFIG.BOX_CODER is 'PreviousResidualDecoder'; supported: 'ResidualCoder'"),
    ({"MODEL.DENSE_HEAD.TARGET_ASSIGNER_CONFIG.BOX_CODER_CONFIG": {"encode_angle_by_sincos": True}},
     "box_code: sin/cos headings and velocities are supported in multi-head models only"),
    ({"MODEL.DENSE_HEAD.TARGET_ASSIGNER_CONFIG.BOX_CODER_CONFIG": {"code_size": 8}},
     "MODEL.DENSE_HEAD.TARGET_ASSIGNER_CONFIG.BOX_CODER_CONFIG.code_size is 8; supported: 7 or 9"),
    ({"MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].anchor_sizes": [[3.9, 1.6, 1.56], [4.5, 1.8, 1.6]]},
     "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].anchor_sizes is [[3.9, 1.6, 1.56], [4.5, 1.8, 1.6]]; "
     "supported: one size per class"),
    ({"MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[1].anchor_rotations": [0]},
     "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[1].anchor_rotations is [0]; supported: the value of the first "
     "class ([0, 1.57])"),
    ({"MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[2].feature_map_stride": 4},
     "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[2].feature_map_stride is 4"),
    # a bad first entry is named itself, not the good entry after it
    ({"MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].anchor_rotations": []},
     "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].anchor_rotations is []; supported: a list of rotations in radians"),
    ({"MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].feature_map_stride": "2"},
     "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].feature_map_stride is '2'; supported: a positive integer"),
    ({"MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].align_center": "yes"},
     "MODEL.DENSE_HEAD.ANCHOR_GENERATOR_CONFIG[0].align_center is 'yes'; supported: True or False"),
    ({"MODEL.POST_PROCESSING.OUTPUT_RAW_SCORE": True}, "MODEL.POST_PROCESSING.OUTPUT_RAW_SCORE is True"),
    ({"MODEL.POST_PROCESSING.NMS_CONFIG.MULTI_CLASSES_NMS": True},
     "MODEL.POST_PROCESSING.NMS_CONFIG.MULTI_CLASSES_NMS is True; supported: False"),
    ({"MODEL.POST_PROCESSING.NMS_CONFIG.NMS_TYPE": "nms_normal_gpu"},
     "MODEL.POST_PROCESSING.NMS_CONFIG.NMS_TYPE is 'nms_normal_gpu'; supported: 'nms_gpu'"),
    ({"DATA_CONFIG.POINT_FEATURE_ENCODING": {"used_feature_list": ["x", "y", "z", "intensity", "timestamp"]}},
     "DATA_CONFIG.POINT_FEATURE_ENCODING.used_feature_list is ['x', 'y', 'z', 'intensity', 'timestamp']"),
    ({"DATA_CONFIG.DATA_PROCESSOR[1].SHUFFLE_ENABLED": {"train": True, "test": "yes"}},
     "DATA_CONFIG.DATA_PROCESSOR[1].SHUFFLE_ENABLED is {'test': 'yes', 'train': True}; supported: True or False at "
     "test time"),
    ({"DATA_CONFIG.DATA_PROCESSOR[0].NAME": "sample_points"},
     "DATA_CONFIG.DATA_PROCESSOR[0].NAME is 'sample_points'"),
    ({"DATA_CONFIG.DATA_PROCESSOR[2].MAX_NUMBER_OF_VOXELS": {"train": 16000}},
     "DATA_CONFIG.DATA_PROCESSOR[2].MAX_NUMBER_OF_VOXELS.test is missing"),
    # values this package's validator refuses, named by its key path
    ({"MODEL.POST_PROCESSING.NMS_CONFIG.NMS_POST_MAXSIZE": -5},
     "(read as this package's config): postprocess.max_boxes: expected an integer in 1..4096, got -5"),
    ({"MODEL.POST_PROCESSING.SCORE_THRESH": ".nan"}, "postprocess.score_threshold: expected a finite number"),
]


@pytest.mark.parametrize("changes, fragment", REFUSED, ids=[next(iter(c)) for c, _ in REFUSED])
def test_unsupported_refused_by_key_path(tmp_path: Path, changes: dict[str, Any], fragment: str) -> None:
    path = _pcdet_yaml(tmp_path, changes)
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(path)
    message = str(info.value)
    assert message.startswith(repr(str(path))) and fragment in message, message


def test_base_config_lookup(tmp_path: Path) -> None:
    alone = tmp_path / "pointpillar.yaml"
    alone.write_bytes(POINTPILLAR.read_bytes())
    with pytest.raises(ConfigError, match=r"_BASE_CONFIG_ 'cfgs/dataset_configs/kitti_dataset.yaml' not found in any "
                                          r"folder above .*; give OpenPCDet's tools/ folder \(build --pcdet-base-dir; base_dir in Python\)"):
        config_from_pcdet_yaml(alone)
    assert config_from_pcdet_yaml(alone, base_dir=TOOLS).digest() == config_from_pcdet_yaml(POINTPILLAR).digest()
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ConfigError, match="not found in .*elsewhere"):
        config_from_pcdet_yaml(alone, base_dir=tmp_path / "elsewhere")
    # a base folder that is none: its own error, not "not found in /nonexist/cfgs/..." (the YAML's base path blamed)
    for folder, what in ((tmp_path / "nonexist", "no such folder"), (alone, "a file, not a folder")):
        with pytest.raises(ConfigError) as info:
            config_from_pcdet_yaml(alone, base_dir=folder)
        assert str(info.value) == (f"'{alone}': --pcdet-base-dir {str(folder)!r}: {what}; give OpenPCDet's tools/ "
                                   "folder, where the YAML's _BASE_CONFIG_ paths start (base_dir in Python)")
    itself = tmp_path / "itself.yaml"  # not "DATA_CONFIG.POINT_FEATURE_ENCODING is missing": what is wrong
    itself.write_text(POINTPILLAR.read_text().replace("cfgs/dataset_configs/kitti_dataset.yaml", "itself.yaml"))
    with pytest.raises(ConfigError, match=r"_BASE_CONFIG_ 'itself.yaml' names this file itself; name the base config"):
        config_from_pcdet_yaml(itself, base_dir=tmp_path)



@pytest.mark.parametrize("name", ["openpcdet_kitti_3class", "openpcdet_nuscenes_multihead", "zhulf0804_kitti_3class"])
def test_a_config_of_this_package_is_told_to_go_as_config(repo_root: Path, name: str) -> None:
    """This package's own YAML given where an OpenPCDet one goes: what it is and the option that reads it, not
    "DATA_CONFIG is missing"."""
    own = repo_root / "pointpillars_trt" / "configs" / f"{name}.yaml"
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(own)
    assert str(info.value) == (f"'{own}': one of this package's configs (family, voxel, network, ...), not an OpenPCDet "
                               "model config: give it as --config, not --pcdet-config (Python: config=PATH, not "
                               "config_from_pcdet_yaml)")


@pytest.mark.parametrize("dataset", ["kitti_dataset", "nuscenes_dataset"])
def test_a_dataset_config_is_told_to_be_the_model_configs_base(dataset: str) -> None:
    """OpenPCDet's dataset YAML given where its model YAML goes (both are "the config" of a run): what it is and
    which YAML to give, not "DATA_CONFIG is missing"."""
    path = TOOLS / "cfgs" / "dataset_configs" / f"{dataset}.yaml"
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(path)
    kind = yaml.safe_load(path.read_text())["DATASET"]
    assert str(info.value).startswith(f"'{path}': an OpenPCDet dataset config (DATASET '{kind}'), not a model "
                                      "config: give the model's YAML, which names this one as its _BASE_CONFIG_"), info.value


@pytest.mark.parametrize("dataset", ["kitti_dataset", "nuscenes_dataset"])
def test_a_dataset_config_is_told_to_be_the_model_configs_base(dataset: str) -> None:
    """OpenPCDet's dataset YAML given where its model YAML goes (both are "the config" of a run): what it is and
    which YAML to give, not "DATA_CONFIG is missing" (--pcdet-config) or "DATASET: unknown key" (--config)."""
    path = TOOLS / "cfgs" / "dataset_configs" / f"{dataset}.yaml"
    said = (f"'{path}': an OpenPCDet dataset config (DATASET '{yaml.safe_load(path.read_text())['DATASET']}'), not a "
            "model config: give the model's YAML, which names this one as its _BASE_CONFIG_ (tools/cfgs/kitti_models/"
            "pointpillar.yaml, tools/cfgs/nuscenes_models/cbgs_pp_multihead.yaml, ...)")
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(path)
    assert str(info.value) == said
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{said} to `pointpillars-trt build --pcdet-config` (Python: " \
                              "convert.pcdet_config.config_from_pcdet_yaml)"


def test_a_base_config_that_is_no_mapping_is_refused_without_quoting_it(tmp_path: Path) -> None:
    """A base path may name any file (an absolute one, or ../../ out of tools/): its text was quoted in the
    error (the first line of /etc/passwd, for one)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    alone = tmp_path / "pointpillar.yaml"
    alone.write_text(POINTPILLAR.read_text().replace("cfgs/dataset_configs/kitti_dataset.yaml", str(secret)))
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(alone)
    message = str(info.value)
    assert "root:" not in message and "holds no YAML mapping (a str at the top level): not an OpenPCDet config" in message


def test_a_base_config_that_is_a_device_is_named_for_what_it_is(tmp_path: Path) -> None:
    alone = tmp_path / "pointpillar.yaml"
    alone.write_text(POINTPILLAR.read_text().replace("cfgs/dataset_configs/kitti_dataset.yaml", "/dev/zero"))
    with pytest.raises(ConfigError, match=r"_BASE_CONFIG_ '/dev/zero': '/dev/zero' is a character device, not a YAML file"):
        config_from_pcdet_yaml(alone)


@pytest.mark.parametrize("base, problem", [('"cfgs/a\\0b.yaml"', "holds a NUL character, which no file name has"),
                                           ("cfgs/" + "a" * 300 + ".yaml", ": File name too long")])
def test_a_base_config_path_no_file_can_have_is_refused_naming_the_yaml(tmp_path: Path, base: str, problem: str) -> None:
    """A base path of a NUL (YAML's "\\0") or of a name longer than the file system allows: the look-up's ValueError
    or OSError left config_from_pcdet_yaml as it was (build: 'error: embedded null byte', naming no file)."""
    (tmp_path / "cfgs").mkdir()  # the folder is there: the name itself is what the file system refuses
    alone = tmp_path / "pointpillar.yaml"
    alone.write_text(POINTPILLAR.read_text().replace("cfgs/dataset_configs/kitti_dataset.yaml", base))
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(alone)
    assert str(info.value).startswith(f"'{alone}': _BASE_CONFIG_ '") and str(info.value).endswith(problem), info.value


def test_pcdet_yaml_is_read_as_untrusted(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [1, 2]\nb: [*a, *a]\n")
    with pytest.raises(ConfigError, match="YAML aliases"):
        config_from_pcdet_yaml(bomb)


def test_pcdet_yaml_with_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    """PyYAML alone keeps the last value; OpenPCDet's own reader would too, so which one was trained on is unknown."""
    text, line = POINTPILLAR.read_text(), "            NMS_THRESH: 0.01\n"
    assert text.count(line) == 1
    twice = _pcdet_yaml(tmp_path, {})
    twice.write_text(text.replace(line, line + line.replace("0.01", "0.5")))
    first = text.splitlines().index(line.rstrip("\n")) + 1
    with pytest.raises(ConfigError) as info:
        config_from_pcdet_yaml(twice)
    assert str(info.value) == (f"'{twice}': not a valid config YAML at line {first + 1}, column 13: "
                               f"MODEL.POST_PROCESSING.NMS_CONFIG.NMS_THRESH: key given twice (first at line {first})")
    base = tmp_path / "tools" / "cfgs" / "dataset_configs" / "kitti_dataset.yaml"  # a base file is read the same way
    twice.write_text(text)
    base.write_text(base.read_text() + "DATASET: 'KittiDataset'\n")
    with pytest.raises(ConfigError, match=rf"^'{re.escape(str(base))}': .* column 1: DATASET: key given twice"):
        config_from_pcdet_yaml(twice)
