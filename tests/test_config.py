"""The config validator: one rule per test case, the YAML defences, round trips and runtime thresholds."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt import config as config_module
from pointpillars_trt.config import (
    ModelConfig,
    Thresholds,
    builtin_config_names,
    config_from_dict,
    finite_float,
    int_within,
    load_config,
)
from pointpillars_trt.config_yaml import MAX_CONFIG_BYTES, parse_yaml, read_yaml
from pointpillars_trt.errors import ConfigError

DELETE = object()  # a change that removes the key
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def builtin_raw(name: str = "openpcdet_kitti_3class") -> dict[str, Any]:
    """A built-in config as its YAML spells it (anchor ``class``, ``box_coder.style``)."""
    return read_yaml(Path(str(resources.files("pointpillars_trt") / "configs" / f"{name}.yaml")))


def edited(changes: dict[str, Any], name: str = "openpcdet_kitti_3class") -> dict[str, Any]:
    """The built-in YAML with ``changes`` applied by key path (``anchors.classes[0].size[1]``)."""
    raw = builtin_raw(name)
    for path, value in changes.items():
        *parents, last = [m.group(1) or int(m.group(2)) for m in _STEP.finditer(path)]
        node: Any = raw
        for step in parents:
            node = node[step]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return raw


def refusal(raw: Any, source: str = "cfg.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, source)
    return str(info.value)


NAN, INF = math.nan, math.inf

# (changes by key path, expected message fragment): every rule of the validator.
REFUSED: list[tuple[dict[str, Any], str]] = [
    # strict types: no bool-as-int, float-as-int, str-as-bool, str-as-number
    ({"voxel.max_pillars": True}, "voxel.max_pillars: expected an integer in 1..1048576, got True"),
    ({"voxel.max_points_per_pillar": 32.0}, "voxel.max_points_per_pillar: expected an integer in 1..384, got 32.0"),
    ({"voxel.max_points_per_pillar": "32"}, "voxel.max_points_per_pillar: expected an integer in 1..384, got '32'"),
    ({"postprocess.score_inclusive": "false"}, "postprocess.score_inclusive: expected true or false, got 'false'"),
    ({"postprocess.score_inclusive": 1}, "postprocess.score_inclusive: expected true or false, got 1"),
    ({"postprocess.nms_iou": True}, "postprocess.nms_iou: expected a finite number in [0, 1], got True"),
    ({"postprocess.nms_iou": "0.5"}, "postprocess.nms_iou: expected a finite number"),
    ({"network.bn_eps": None}, "network.bn_eps: expected a finite number in (0, 1], got None"),
    ({"name": 7}, "name: expected a name of 1-64 letters, digits or _.+-, got 7"),
    ({"name": "a b\x1b[31m"}, r"name: expected a name of 1-64 letters, digits or _.+-, got 'a b\x1b[31m'"),
    ({"classes[0]": 5}, "classes[0]: expected a name"),
    ({"family": "mmdet3d"}, "family: expected one of openpcdet, zhulf0804, got 'mmdet3d'"),
    ({"box_coder.style": "centerpoint"}, "box_coder.style: expected one of openpcdet, zhulf0804"),
    ({"box_coder": "openpcdet2"}, "box_coder: expected one of openpcdet, zhulf0804"),
    ({"voxel.range_filter": "sideways"}, "voxel.range_filter: expected one of inclusive_xy, strict_xyz"),
    ({"anchors.alignment": "corners"}, "anchors.alignment: expected one of range_corners, cell_centers"),
    ({"postprocess.nms": "soft"}, "postprocess.nms: expected one of class_agnostic, per_class"),
    ({"features.order[2]": "r"}, "features.order[2]: expected one of x, y, z, intensity"),
    ({"features.order": ["x"] * 17}, "features.order: expected a list of 1..16 items"),
    ({"features.order[1]": "x"}, "features.order: x listed more than once in ['x', 'x', 'z', 'intensity', "),
    ({"features.order[0]": "center_dx", "features.order[1]": "center_dy"},  # only zhulf0804 repeats these
     "features.order: center_dx, center_dy listed more than once in ['center_dx', 'center_dy', 'z', "),
    ({"label_base": 2}, "label_base: expected an integer in 0..1, got 2"),
    ({"voxel": [1, 2]}, "voxel: expected a mapping, got [1, 2]"),
    # finite floats only
    ({"voxel.point_range[3]": INF}, "voxel.point_range[3]: expected a finite number in [-10000, 10000], got inf"),
    ({"voxel.point_range[0]": NAN}, "voxel.point_range[0]: expected a finite number in [-10000, 10000], got nan"),
    ({"voxel.point_range": [0, 1, 2]}, "voxel.point_range: expected a list of 6 items, got [0, 1, 2]"),
    ({"voxel.pillar_size[0]": 0}, "voxel.pillar_size[0]: expected a finite number in [0.001, 20000], got 0"),
    ({"voxel.pillar_size[1]": -0.16}, "voxel.pillar_size[1]: expected a finite number in [0.001, 20000]"),
    ({"anchors.classes[0].size[0]": NAN}, "anchors.classes[0].size[0]: expected a finite number"),
    ({"anchors.classes[1].bottom": INF}, "anchors.classes[1].bottom: expected a finite number"),
    ({"anchors.rotations[1]": NAN}, "anchors.rotations[1]: expected a finite number"),
    ({"direction.offset": 10 ** 400}, "direction.offset: expected a finite number"),
    ({"direction.limit_offset": 2.0}, "direction.limit_offset: expected a finite number in [0, 1], got 2.0"),
    # post-processing ranges
    ({"direction.flip_bin": 7}, "direction.flip_bin: expected an integer in 0..1, got 7"),
    ({"direction.flip_bin": -1}, "direction.flip_bin: expected an integer in 0..1, got -1"),
    ({"direction.num_bins": 3}, "direction.num_bins: expected the integer 2, got 3"),
    ({"postprocess.nms_iou": NAN}, "postprocess.nms_iou: expected a finite number in [0, 1], got nan"),
    ({"postprocess.nms_iou": 1.5}, "postprocess.nms_iou: expected a finite number in [0, 1], got 1.5"),
    ({"postprocess.score_threshold": NAN}, "postprocess.score_threshold: expected a finite number in [0, 1], got nan"),
    ({"postprocess.score_threshold": -0.1}, "postprocess.score_threshold: expected a finite number in [0, 1]"),
    ({"postprocess.score_threshold": 1.01}, "postprocess.score_threshold: expected a finite number in [0, 1]"),
    ({"postprocess.max_boxes": -5}, "postprocess.max_boxes: expected an integer in 1..4096, got -5"),
    ({"postprocess.max_boxes": 0}, "postprocess.max_boxes: expected an integer in 1..4096, got 0"),
    ({"postprocess.pre_nms_top_k": 0}, "postprocess.pre_nms_top_k: expected an integer in 1..4096, got 0"),
    ({"postprocess.pre_nms_top_k": 8192}, "postprocess.pre_nms_top_k: expected an integer in 1..4096, got 8192"),
    ({"postprocess.nms": "per_class"}, "postprocess.pre_nms_top_k: per-class NMS sorts up to classes x pre_nms_top_k = 3 x 4096"),
    ({"postprocess.output_range": [0, 0, 0, 1, 1, 0]}, "postprocess.output_range: each min must be below its max"),
    # network shapes
    ({"network.layer_strides": [0, 2, 2]}, "network.layer_strides[0]: expected an integer in 1..8, got 0"),
    ({"network.upsample_strides[1]": 0}, "network.upsample_strides[1]: expected an integer in 1..64 or 1/k for an integer k in 2..8 (e.g. 0.5), got 0"),
    ({"network.block_channels[1]": 0}, "network.block_channels[1]: expected an integer in 1..4096, got 0"),
    ({"network.upsample_channels[0]": -128}, "network.upsample_channels[0]: expected an integer in 1..4096"),
    ({"network.pfn_channels": 512}, "network.pfn_channels: expected an integer in 1..256, got 512"),
    ({"network.layer_nums": []}, "network.layer_nums: expected a list of 1..8 items, got []"),
    ({"network.layer_nums[0]": -1}, "network.layer_nums[0]: expected an integer in 0..64, got -1"),
    ({"network.layer_nums": [3, 5]}, "network: layer_nums, layer_strides, block_channels, upsample_strides and "
                                     "upsample_channels differ in length"),
    ({"network.bn_eps": 0}, "network.bn_eps: expected a finite number in (0, 1], got 0"),
    ({"anchors.stride": 0}, "anchors.stride: expected an integer in 1..64, got 0"),
    ({"anchors.stride": 4}, "network.upsample_strides[0]: block 0 maps the 432 x 496 grid by 1/2"),
    ({"network.layer_strides": [2, 2, 3]}, "network.upsample_strides[2]: block 2 maps the 432 x 496 grid by 1/12"),
    ({"voxel.point_range[3]": 0.16, "network.layer_strides": [1, 1, 1], "network.upsample_strides": [1, 1, 1],
      "anchors.stride": 1}, "anchors.stride: the head map 1 x 496 needs 2 cells per side"),
    # grid
    ({"voxel.point_range[3]": -1.0}, "voxel.point_range: min x 0 is not below max x -1"),
    ({"voxel.pillar_size[0]": 0.17}, "voxel.pillar_size: the range along x is not a whole number of pillars (406.588)"),
    ({"voxel.pillar_size[2]": 2.0}, "voxel.pillar_size: pillars need exactly one voxel along z, got 2"),
    ({"voxel.pillar_size": [0.01, 0.01, 4.0]}, "voxel.pillar_size: a 6912 x 7936 grid is too large"),
    ({"voxel.pillar_size": [0.001, 0.001, 4.0]}, "voxel.pillar_size: a 69120 x 79360 grid is too large"),
    # pillar capacities
    ({"voxel.max_points_per_pillar": 10 ** 8}, "voxel.max_points_per_pillar: expected an integer in 1..384"),
    ({"voxel.max_points_per_pillar": 0}, "voxel.max_points_per_pillar: expected an integer in 1..384, got 0"),
    ({"voxel.max_points_per_pillar": 385}, "voxel.max_points_per_pillar: expected an integer in 1..384, got 385"),
    ({"voxel.max_pillars": 0}, "voxel.max_pillars: expected an integer in 1..1048576, got 0"),
    ({"voxel.max_pillars": 2 ** 20 + 1}, "voxel.max_pillars: expected an integer in 1..1048576"),
    ({"voxel.max_pillars": 2 ** 20, "voxel.max_points_per_pillar": 256},
     "voxel.max_pillars: 1048576 pillars x 256 points x 10 features reach 2147483648 elements"),
    # classes
    ({"classes": []}, "classes: expected a list of 1..64 items, got []"),
    ({"classes": ["Car", "Car", "Cyclist"]}, "classes: names repeat in ['Car', 'Car', 'Cyclist']"),
    ({"anchors.classes[0].class": "Truck"}, "anchors.classes: names ['Truck', 'Pedestrian', 'Cyclist'] do not match"),
    ({"anchors.classes[0].name": "Car"}, "anchors.classes[0]: expected exactly one of the keys class, name"),
    # unknown and missing keys
    ({"postprocess.score_treshold": 0.2}, "postprocess.score_treshold: unknown key (did you mean score_threshold?)"),
    ({"anchors.classes[0].colour": "red"}, "anchors.classes[0].colour: unknown key (expected size, bottom, class, name)"),
    ({"extra\n\x00key": 1}, r"'extra\n\x00key': unknown key"),
    ({"postprocess.nms_iou": DELETE}, "postprocess.nms_iou: missing key"),
    ({"voxel": DELETE}, "voxel: missing key"),
    ({"anchors.classes[2].bottom": DELETE}, "anchors.classes[2].bottom: missing key"),
]


@pytest.mark.parametrize("changes, fragment", REFUSED, ids=[next(iter(c)) for c, _ in REFUSED])
def test_refused(changes: dict[str, Any], fragment: str) -> None:
    message = refusal(edited(changes), "my.yaml")
    assert message.startswith("my.yaml: ") and fragment in message, message
    assert len(message) < 400


ACCEPTED: list[dict[str, Any]] = [
    {"direction.flip_bin": 0},
    {"postprocess.max_boxes": 1, "postprocess.pre_nms_top_k": 1},
    {"postprocess.score_threshold": 0, "postprocess.nms_iou": 1},  # integers where numbers are wanted
    {"postprocess.score_threshold": 1.0, "postprocess.nms_iou": 0.0},
    {"postprocess.nms": "per_class", "postprocess.pre_nms_top_k": 1024},  # 3 x 1024 -> 4096 keys
    {"voxel.max_points_per_pillar": 256, "voxel.max_pillars": 2 ** 19},
    {"voxel.pillar_size": [0.04, 0.04, 4.0]},  # 1728 x 1984 cells, 384 channels
    {"network.layer_nums": [0, 0, 0]},
    {"label_base": DELETE, "postprocess.output_range": DELETE},  # optional keys
]


@pytest.mark.parametrize("changes", ACCEPTED, ids=[",".join(c) for c in ACCEPTED])
def test_accepted_at_the_bounds(changes: dict[str, Any]) -> None:
    config_from_dict(edited(changes), "my.yaml")


def test_per_class_bound_matches_the_gpu_post_params() -> None:
    """The config validator refuses exactly what kernels/postprocess.py's PostParams refuses."""
    from pointpillars_trt.kernels.postprocess import PostParams

    for top_k in (1, 100, 1024, 1025, 1365, 1366, 2048, 4096):
        raw = edited({"postprocess.pre_nms_top_k": top_k}, "zhulf0804_kitti_3class")
        try:
            cfg = config_from_dict(raw)
        except ConfigError:
            cfg = None
        unchecked = dataclasses.replace(
            load_config("zhulf0804_kitti_3class"),
            postprocess=dataclasses.replace(load_config("zhulf0804_kitti_3class").postprocess, pre_nms_top_k=top_k),
        )
        try:
            PostParams.from_config(unchecked)
            gpu_ok = True
        except ConfigError:
            gpu_ok = False
        assert (cfg is not None) == gpu_ok, top_k


def test_kernel_limits_match_the_gpu_modules() -> None:
    """The validator's bounds and the kernels' launch shapes are one set of numbers (kernel_limits.py)."""
    from pointpillars_trt import kernel_limits
    from pointpillars_trt.kernels import postprocess, voxelize
    from pointpillars_trt.kernels.pfn import PfnParams

    assert voxelize.VoxelizeStage.GATHER_WARPS == kernel_limits.GATHER_WARPS == 8
    assert config_module.MAX_PFN_CHANNELS == kernel_limits.PFN_BLOCK_THREADS == 256
    for channels in (1, 7, 30, 64, 255, 256):  # a pillar's threads in one block, the block within the limit
        params = PfnParams(40000, 32, 10, channels)
        threads, pillars = params.block
        assert threads * params.channels_per_thread == channels and channels % params.channels_per_thread == 0
        assert 1 <= threads * pillars <= kernel_limits.PFN_BLOCK_THREADS
        assert f"-DPILLARS_PER_BLOCK={pillars}" in params.defines()
    assert postprocess._SORT_LIMIT == config_module.SORT_LIMIT == kernel_limits.SORT_LIMIT == 4096
    assert f"-DGATHER_WARPS={kernel_limits.GATHER_WARPS}" in voxelize.VoxelParams.from_config(
        load_config("openpcdet_kitti_3class")).defines()
    cuda = resources.files("pointpillars_trt") / "kernels" / "cuda"
    assert "__shared__ float4 staged[kGatherWarps][MAX_PTS];" in (cuda / "voxelize.cu").read_text()
    assert config_module.MAX_POINTS_PER_PILLAR == 384  # 8 warps x 384 x 16 B = 48 KiB
    assert "0xffffull" in (cuda / "postprocess.cu").read_text()  # the 16-bit slot MAX_CLASSES keeps in range


@pytest.mark.parametrize("name", builtin_config_names())
def test_builtin_configs_load_and_round_trip(name: str) -> None:
    cfg = load_config(name)
    assert cfg.name == name
    assert config_from_dict(cfg.to_dict()) == cfg
    stored = json.loads(json.dumps(cfg.to_dict()))  # as model.json keeps it
    again = config_from_dict(stored, "model.json")
    assert again == cfg and again.digest() == cfg.digest()


def test_builtin_names() -> None:
    assert builtin_config_names() == ["openpcdet_kitti_3class", "openpcdet_nuscenes_multihead", "zhulf0804_kitti_3class"]


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_unknown_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    text = (resources.files("pointpillars_trt") / "configs" / "openpcdet_kitti_3class.yaml").read_text()
    path = _write(tmp_path / "typo.yaml", text.replace("score_threshold:", "score_treshold:"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"'{path}': postprocess.score_treshold: unknown key (did you mean score_threshold?)"



def test_an_openpcdet_model_config_names_the_command_that_reads_it(tmp_path: Path) -> None:
    """Given as a config, OpenPCDet's pointpillar.yaml was refused for its first key (CLASS_NAMES), no fix; then
    with an option of build alone: it names the build command, which every caller can run."""
    pcdet = Path(__file__).resolve().parent / "data" / "pcdet" / "tools" / "cfgs" / "kitti_models" / "pointpillar.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(pcdet)
    assert str(info.value) == (f"'{pcdet}': an OpenPCDet model config (MODEL, CLASS_NAMES, ...), not one of this "
                               "package's: `pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth --pcdet-config "
                               f"{pcdet} --out MODEL_DIR` reads it, then `pointpillars-trt infer PATH --model MODEL_DIR` "
                               "runs the model dir it writes (Python: convert.pcdet_config.config_from_pcdet_yaml)")

def test_missing_file_and_wrong_top_level(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml': config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"list.yaml': the config: expected a mapping, got \[1, 2\]"):
        load_config(_write(tmp_path / "list.yaml", "[1, 2]"))
    with pytest.raises(ConfigError, match="unknown config 'nope'"):
        load_config("nope")


@pytest.mark.parametrize("text, said", [("", "empty"), ("\n  \n", "empty"),
                                        ("# settings to come\n---\n", "empty but for comments")])
def test_an_empty_config_file_is_said_to_be_empty(tmp_path: Path, text: str, said: str) -> None:
    """An empty YAML (or one of comments alone) given as --config or --pcdet-config was refused as "expected a
    mapping, got None": the file is said to be empty; a document of null is still the wrong top level."""
    from pointpillars_trt.convert.pcdet_config import config_from_pcdet_yaml

    path = _write(tmp_path / "model.yaml", text)
    for read in (load_config, config_from_pcdet_yaml):
        with pytest.raises(ConfigError) as info:
            read(path)
        assert str(info.value) == f"'{path}': the config file is {said}: it holds no config"
    with pytest.raises(ConfigError, match=r"null.yaml': the config: expected a mapping, got None$"):
        load_config(_write(tmp_path / "null.yaml", "null\n"))


def test_billion_laughs_refused_fast(tmp_path: Path) -> None:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    path = _write(tmp_path / "laughs.yaml", "\n".join(lines))
    assert path.stat().st_size < 1000
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert time.perf_counter() - start < 2.0
    message = str(info.value)
    assert "YAML aliases (*name) are not allowed" in message and len(message) < 200


def test_deep_nesting_refused(tmp_path: Path) -> None:
    depth = 200_000
    path = _write(tmp_path / "deep.yaml", "name: " + "[" * depth + "]" * depth)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="nested more than 32 levels deep"):
        load_config(path)
    assert time.perf_counter() - start < 5.0
    nested: Any = []
    for _ in range(depth):  # a deep structure handed over as a dict (e.g. from JSON) is refused too
        nested = [nested]
    message = refusal(edited({"classes": nested}))
    assert "classes: expected a list of 1..64 items" in message or "classes[0]: expected a name" in message
    assert len(message) < 200


def test_oversized_and_malformed_files(tmp_path: Path) -> None:
    big = _write(tmp_path / "big.yaml", b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match=f"is {MAX_CONFIG_BYTES + 1} bytes, more than the limit of {MAX_CONFIG_BYTES} bytes"):
        load_config(big)
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(_write(tmp_path / "bin.yaml", b"name: \xff\xfe"))
    with pytest.raises(ConfigError, match="could not determine a constructor"):
        load_config(_write(tmp_path / "obj.yaml", "name: !!python/object:os.system x"))
    with pytest.raises(ConfigError, match="digits.yaml': not a valid config YAML at line 1, column 7: an integer of 6000 "
                                          "digits: no config value is that long"):
        load_config(_write(tmp_path / "digits.yaml", "name: " + "9" * 6000))
    with pytest.raises(ConfigError, match="line 2, column 16: an integer of 6000 digits"):  # YAML's _ separators
        load_config(_write(tmp_path / "separated.yaml", "voxel:\n  max_pillars: " + "9_9" * 3000))


def _builtin_text(name: str = "openpcdet_kitti_3class") -> str:
    return (resources.files("pointpillars_trt") / "configs" / f"{name}.yaml").read_text()


def _line_of(text: str, start: str, occurrence: int = 0) -> int:
    """1-based number of the ``occurrence``-th line of ``text`` that starts with ``start``."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith(start)][occurrence]


# (edit of the built-in YAML, key path, start of the lines giving the key, which of them gives it again):
# each edit gives one key a second time, which PyYAML alone would read as the second value
REPEATED_KEYS = [
    (lambda t: t + "voxel:\n  max_pillars: 1000\n", "voxel", "voxel:", 1),
    (lambda t: t.replace("  max_pillars: 40000", "  max_pillars: 40000\n  max_pillars: 16000"),
     "voxel.max_pillars", "  max_pillars:", 1),
    (lambda t: t.replace("{class: Pedestrian, size", "{class: Pedestrian, class: Van, size"),
     "anchors.classes[1].class", "    - {class: Pedestrian", 0),  # twice on one line
]


@pytest.mark.parametrize("edit, key_path, line_start, again", REPEATED_KEYS, ids=[k[1] for k in REPEATED_KEYS])
def test_repeated_key_refused_with_its_path_and_line(tmp_path: Path, edit: Any, key_path: str, line_start: str,
                                                     again: int) -> None:
    text = edit(_builtin_text())
    path = _write(tmp_path / "twice.yaml", text)
    first, second = _line_of(text, line_start), _line_of(text, line_start, again)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"'{path}': not a valid config YAML at line {second}, column "), message
    assert message.endswith(f": {key_path}: key given twice (first at line {first})"), message


def test_repeated_key_refused_even_with_the_same_value_or_spelled_otherwise(tmp_path: Path) -> None:
    same = _write(tmp_path / "same.yaml", "name: a\nname: a\n")
    with pytest.raises(ConfigError, match=r"same.yaml': .* line 2, column 1: name: key given twice \(first at line 1\)"):
        load_config(same)
    quoted = _write(tmp_path / "quoted.yaml", "voxel:\n  range_filter: a\n  'range_filter': b\n")
    with pytest.raises(ConfigError, match=r"line 3, column 3: voxel.range_filter: key given twice \(first at line 2\)"):
        load_config(quoted)
    spelled = _write(tmp_path / "spelled.yaml", "classes: {'1': a, \"1\": b}\n")  # one key, two spellings
    with pytest.raises(ConfigError, match=r"line 1, column 19: classes.1: key given twice \(first at line 1\)"):
        load_config(spelled)


def test_keys_that_are_no_names_are_refused_before_a_mapping_is_built(tmp_path: Path) -> None:
    """A number as a key (ints k * (2**61 - 1) all hash alike: 37k of them, a 1 MB YAML, took 107 s to load) or a
    bool (YAML 1.1's ``on:``): refused at the first one, naming its path and type."""
    import time

    numbers = _write(tmp_path / "numbers.yaml", "classes: {1: a, 0x1: b}\n")
    with pytest.raises(ConfigError, match=r"line 1, column 11: classes.1: a key of type int; a config's keys are names"):
        load_config(numbers)
    flags = _write(tmp_path / "flags.yaml", "voxel:\n  on: 1\n")
    with pytest.raises(ConfigError, match=r"line 2, column 3: voxel.True: a key of type bool"):
        load_config(flags)
    colliding = _write(tmp_path / "colliding.yaml", "x:\n" + "".join(f"  {k * (2**61 - 1)}: 0\n" for k in range(1, 30_001)))
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="a key of type int"):
        load_config(colliding)
    assert time.perf_counter() - start < 5.0


def test_the_same_key_in_different_mappings_is_fine() -> None:
    raw = read_yaml(Path(str(resources.files("pointpillars_trt") / "configs" / "openpcdet_kitti_3class.yaml")))
    assert [entry["class"] for entry in raw["anchors"]["classes"]] == ["Car", "Pedestrian", "Cyclist"]
    assert parse_yaml(b"a: {k: 1}\nb: {k: 2}\nc: [{k: 3}, {k: 4}]\n", "x.yaml") == {
        "a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 3}, {"k": 4}]}


def test_zhulf0804_repeats_only_its_centre_offsets() -> None:
    raw = builtin_raw("zhulf0804_kitti_3class")
    assert raw["features"]["order"].count("center_dx") == 2  # its encoder overwrites raw x, y with them
    message = refusal(edited({"features.order[2]": "intensity"}, "zhulf0804_kitti_3class"), "z.yaml")
    assert message.startswith("z.yaml: features.order: intensity listed more than once in ['center_dx', "), message


def test_messages_never_echo_a_long_value() -> None:
    message = refusal(edited({"name": "\x1b]0;pwned\x07" + "A" * 100_000}))
    assert len(message) < 200 and "\x1b" not in message and "\x07" not in message
    assert "\\x1b" in message and "..." in message


# --------------------------------------------------------------------------- runtime thresholds

def test_digest_ignores_the_runtime_thresholds() -> None:
    cfg = load_config("openpcdet_kitti_3class")
    tuned = cfg.with_thresholds(score_threshold=0.3, nms_iou=0.2, max_boxes=100)
    assert tuned.digest() == cfg.digest() and tuned != cfg
    assert tuned.postprocess == dataclasses.replace(cfg.postprocess, score_threshold=0.3, nms_iou=0.2, max_boxes=100)
    edited_thresholds = edited({"postprocess.score_threshold": 0.5, "postprocess.nms_iou": 0.5,
                                "postprocess.max_boxes": 7})
    assert config_from_dict(edited_thresholds).digest() == cfg.digest()


@pytest.mark.parametrize("changes", [
    {"voxel.pillar_size": [0.32, 0.32, 4.0]},
    {"postprocess.pre_nms_top_k": 1000},
    {"postprocess.score_inclusive": False},
    {"anchors.classes[0].size[0]": 4.0},
    {"name": "other"},
], ids=lambda c: next(iter(c)))
def test_digest_follows_everything_else(changes: dict[str, Any]) -> None:
    assert config_from_dict(edited(changes)).digest() != load_config("openpcdet_kitti_3class").digest()


# The digests of configs as this package computed them before label_base stopped configuring anything: what model dirs
# and plans recorded. A change here is a change of every existing model dir's digest (each refused: rebuild).
RECORDED_DIGESTS = [
    ("openpcdet_kitti_3class", {}, "8489c6b29aa62db6"),
    ("openpcdet_kitti_3class", {"label_base": DELETE}, "b10d71c964330991"),
    ("openpcdet_kitti_3class", {"label_base": 0}, "b10d71c964330991"),
    ("openpcdet_nuscenes_multihead", {}, "3a9d94ecb8670eb7"),
    ("zhulf0804_kitti_3class", {}, "1db17f31ba726713"),
    ("zhulf0804_kitti_3class", {"label_base": 1}, "a36d7e213f64a641"),
]


@pytest.mark.parametrize("name, changes, digest", RECORDED_DIGESTS)
def test_label_base_configures_nothing_but_keeps_the_digests_configs_had(name: str, changes: dict[str, Any],
                                                                          digest: str) -> None:
    """label_base is read and checked as before (0 when absent) and stored as given, so that a config holding it,
    and the model dir that recorded its digest, keep that digest; ModelConfig no longer offers it as a setting."""
    cfg = config_from_dict(edited(changes, name))
    assert cfg.digest() == digest
    given = changes.get("label_base", builtin_raw(name)["label_base"])
    assert cfg.to_dict()["label_base"] == (0 if given is DELETE else given)
    stored = config_from_dict(json.loads(json.dumps(cfg.to_dict())), "model.json")  # as model.json keeps it
    assert stored == cfg and stored.digest() == digest
    assert not hasattr(cfg, "label_base")


def test_with_thresholds_keeps_what_is_not_given() -> None:
    cfg = load_config("zhulf0804_kitti_3class")
    assert cfg.with_thresholds() == cfg
    tuned = cfg.with_thresholds(nms_iou=0.5)
    assert tuned.postprocess.nms_iou == 0.5
    assert tuned.postprocess.score_threshold == cfg.postprocess.score_threshold
    assert tuned.postprocess.max_boxes == cfg.postprocess.max_boxes
    assert isinstance(cfg.with_thresholds(score_threshold=1).postprocess.score_threshold, float)


@pytest.mark.parametrize("argument, value, fragment", [
    ("score_threshold", NAN, "thresholds: score_threshold: expected a finite number in [0, 1], got nan"),
    ("score_threshold", 1.5, "thresholds: score_threshold: expected a finite number in [0, 1], got 1.5"),
    ("score_threshold", "0.3", "thresholds: score_threshold: expected a finite number in [0, 1], got '0.3'"),
    ("nms_iou", -0.1, "thresholds: nms_iou: expected a finite number in [0, 1], got -0.1"),
    ("nms_iou", INF, "thresholds: nms_iou: expected a finite number in [0, 1], got inf"),
    ("max_boxes", 0, "thresholds: max_boxes: expected an integer in 1..4096, got 0"),
    ("max_boxes", True, "thresholds: max_boxes: expected an integer in 1..4096, got True"),
    ("max_boxes", 10.0, "thresholds: max_boxes: expected an integer in 1..4096, got 10.0"),
    ("score_threshold", np.float32(NAN), "thresholds: score_threshold: expected a finite number in [0, 1], got "
                                         "np.float32(nan)"),
    ("nms_iou", np.float64(1.5), "thresholds: nms_iou: expected a finite number in [0, 1], got np.float64(1.5)"),
    ("nms_iou", np.bool_(True), "thresholds: nms_iou: expected a finite number in [0, 1], got np.True_"),
    ("max_boxes", np.int64(0), "thresholds: max_boxes: expected an integer in 1..4096, got np.int64(0)"),
    ("max_boxes", np.float64(5.0), "thresholds: max_boxes: expected an integer in 1..4096, got np.float64(5.0)"),
    ("max_boxes", np.str_("5"), "thresholds: max_boxes: expected an integer in 1..4096, got np.str_('5')"),
])
@pytest.mark.parametrize("make", ["with_thresholds", "Thresholds"])
def test_with_thresholds_refuses(argument: str, value: Any, fragment: str, make: str) -> None:
    """The config's copy and a per-call ``Thresholds`` (refused when made) go by the same rules."""
    cfg: ModelConfig = load_config("openpcdet_kitti_3class")
    with pytest.raises(ConfigError) as info:
        cfg.with_thresholds(**{argument: value}) if make == "with_thresholds" else Thresholds(**{argument: value})
    assert str(info.value) == fragment


@pytest.mark.parametrize("argument, value, expected", [
    ("nms_iou", np.float32(0.5), 0.5), ("score_threshold", np.float32(0.25), 0.25), ("nms_iou", np.float64(0.1), 0.1),
    ("score_threshold", np.int64(1), 1.0), ("max_boxes", np.int64(5), 5), ("max_boxes", np.uint16(7), 7),
])
def test_numpy_scalars_are_the_python_numbers_they_hold(argument: str, value: Any, expected: float | int) -> None:
    """Values read from arrays or configs: taken as the Python number (0.5 and 0.25 are exact in float32), so a
    ``Thresholds`` equals, hashes and serializes as one made from that number."""
    cfg = load_config("openpcdet_kitti_3class")
    got = getattr(cfg.with_thresholds(**{argument: value}).postprocess, argument)
    assert got == expected and type(got) is type(expected)
    thresholds, plain = Thresholds(**{argument: value}), Thresholds(**{argument: expected})
    assert type(getattr(thresholds, argument)) is type(expected)
    assert thresholds == plain and hash(thresholds) == hash(plain)
    assert json.loads(json.dumps(dataclasses.asdict(thresholds)))[argument] == expected
    assert thresholds.applied_to(cfg) == cfg.with_thresholds(**{argument: expected})


def test_a_config_of_numpy_numbers_is_the_config_of_python_numbers() -> None:
    """e.g. a dict built from arrays: it loads as the plain one, and its digest (JSON) works."""
    changes = {"voxel.max_pillars": np.int64(16000), "voxel.pillar_size": [np.float32(0.16), 0.16, np.float64(4.0)],
               "postprocess.nms_iou": np.float32(0.5)}
    numpy_cfg = config_from_dict(edited(changes))
    plain = config_from_dict(edited({"voxel.max_pillars": 16000, "postprocess.nms_iou": 0.5,
                                     "voxel.pillar_size": [np.float32(0.16).item(), 0.16, 4.0]}))
    assert numpy_cfg == plain and numpy_cfg.digest() == plain.digest()


def test_require_heads_gives_a_multihead_models_heads_and_refuses_a_single_head_one():
    multi = load_config("openpcdet_nuscenes_multihead")
    assert multi.require_heads() is multi.heads and len(multi.require_heads().groups) > 1
    with pytest.raises(ConfigError, match="openpcdet_kitti_3class: not a multi-head model"):
        load_config("openpcdet_kitti_3class").require_heads()


@pytest.mark.parametrize(("value", "low", "high", "expected"), [
    (3, 1, 8, 3), (1, 1, 8, 1), (8, 1, 8, 8), (0, 1, 8, None), (9, 1, 8, None), (10**12, 1, None, 10**12),
    (np.int64(5), 1, 8, 5), (np.uint8(0), 0, None, 0), (-1, 0, None, None),
    (True, 0, 8, None), (np.bool_(True), 0, 8, None), (4.0, 1, 8, None), (np.float32(4), 1, 8, None),
    ("4", 1, 8, None), (None, 0, None, None), ([4], 1, 8, None),
])
def test_int_within_takes_ints_and_numpy_integers_in_range_only(value: object, low: int, high: int | None,
                                                                expected: int | None) -> None:
    got = int_within(value, low, high)
    assert got == expected and (got is None or type(got) is int)


@pytest.mark.parametrize(("value", "expected"), [
    (2, 2.0), (0.5, 0.5), (-3.25, -3.25), (np.float32(0.25), 0.25), (np.int64(7), 7.0), (np.array(1.5), 1.5),
    (__import__("fractions").Fraction(1, 4), 0.25), (float("nan"), None), (float("inf"), None), (-float("inf"), None),
    (10**400, None), (True, None), (np.bool_(False), None), ("1.5", None), (b"1", None), (None, None), ([1.0], None),
])
def test_finite_float_takes_finite_numbers_only(value: object, expected: float | None) -> None:
    got = finite_float(value)
    assert got == expected and (got is None or type(got) is float)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_config_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """``--config`` / ``--pcdet-config`` naming a FIFO: one ConfigError naming its kind, not a read that waits
    for a writer for ever (checked in a thread with a deadline)."""
    import threading

    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    found: list[BaseException] = []

    def read() -> None:
        try:
            load_config(fifo)
        except ConfigError as exc:
            found.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    assert found, "reading a FIFO config blocked"
    assert "FIFO" in str(found[0]) and str(fifo) in str(found[0]), found[0]
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.yaml")
    (tmp_path / "afile").write_text("x")  # a path that cannot be looked at is not called missing
    with pytest.raises(ConfigError, match=r"afile/x.yaml' cannot be read: Not a directory"):
        load_config(tmp_path / "afile" / "x.yaml")
