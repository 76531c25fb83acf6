"""OpenPCDet model configs (``tools/cfgs/<dataset>_models/*.yaml``) -> ``ModelConfig``.

A trained OpenPCDet PointPillars checkpoint comes with its YAML; reading it spares users from
re-typing every number (and getting one wrong) in this package's spelling, which
``configs/openpcdet_kitti_3class.yaml`` shows by hand for ``pointpillar.yaml``. Only what inference
depends on is read; training-only settings (augmentation, target assignment, losses, optimisation,
evaluation) are ignored. Whatever this package would not run the way OpenPCDet does (another VFE,
head, NMS, feature or box coder) is refused by its key path and value, and the result passes the
package's own validator.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NoReturn

from ..config import MAX_PFN_CHANNELS, ModelConfig, config_from_dict, is_package_config, pcdet_dataset_refusal
from ..config_yaml import read_yaml
from ..errors import ConfigError, SettingNotice, escape_text, safe_repr
from ..file_reads import not_a_folder, special_kind

BASE_KEY = "_BASE_CONFIG_"
_MAX_BASES = 8  # base files one config may pull in; each is read whole
_INPUT_COLUMNS = ("x", "y", "z", "intensity")  # the first point columns of every model
_TIME_COLUMN = "timestamp"  # OpenPCDet's name of a multi-sweep point's time lag: our "time"
BN_EPS = 1e-3  # PillarVFE's and BaseBEVBackbone's BatchNorm eps, fixed in OpenPCDet's code
HEAD_MIDDLE_BN_EPS = 1e-5  # AnchorHeadMulti's middle convs use nn.BatchNorm2d's default
# SingleHead's box convs, in its concatenation order: (cos, sin) heading residuals take 2 channels.
_REG_PARTS = {"residual": ["reg:2", "height:1", "size:3", "angle:1"], "sincos": ["reg:2", "height:1", "size:3", "angle:2"]}


def config_from_pcdet_yaml(
    path: str | Path, *, base_dir: str | Path | None = None, name: str | None = None
) -> ModelConfig:
    """Read an OpenPCDet PointPillar model config into a validated ``ModelConfig``.

    ``_BASE_CONFIG_`` paths (relative to OpenPCDet's ``tools/`` folder, where its scripts run) are
    resolved against ``base_dir`` when given, else against the nearest folder above the YAML in which
    they exist. ``name`` defaults to the built-in config's name when the YAML describes a built-in model
    (so both give one digest, and model dirs built either way are interchangeable), else to
    ``openpcdet_<file stem>``.
    """
    path = Path(path)
    doc = _merged(path, base_dir)
    cfg = _convert(doc, name or f"openpcdet_{path.stem}", doc.source)
    return cfg if name is not None else _builtin_twin(cfg) or cfg


def _builtin_twin(cfg: ModelConfig) -> ModelConfig | None:
    """The built-in config ``cfg`` equals in everything but its name, if any."""
    from ..config import builtin_config_names, load_config

    mine = {k: v for k, v in cfg.to_dict().items() if k != "name"}
    for builtin in map(load_config, builtin_config_names()):
        if {k: v for k, v in builtin.to_dict().items() if k != "name"} == mine:
            return builtin
    return None


def pcdet_dataset_facts(path: str | Path, *, base_dir: str | Path | None = None) -> dict[str, Any]:
    """What the model's dataset config says about the points it was trained on, for the model dir's
    ``model.json``: ``{"fov_points_only": bool}`` when ``DATA_CONFIG.FOV_POINTS_ONLY`` is set (True in
    OpenPCDet's KITTI configs: points outside the camera image are dropped), else ``{}``."""
    data = _Section(_merged(Path(path), base_dir)["DATA_CONFIG"], "DATA_CONFIG", safe_repr(path))
    if "FOV_POINTS_ONLY" not in data.value:
        return {}
    return {"fov_points_only": data.expect("FOV_POINTS_ONLY", True, False)}


def _merged(path: Path, base_dir: str | Path | None) -> _Section:
    """The YAML at ``path`` with its ``_BASE_CONFIG_`` files overlaid."""
    source = safe_repr(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {safe_repr(raw, 60)}")
    if is_package_config(raw):
        raise ConfigError(f"{source}: one of this package's configs (family, voxel, network, ...), not an OpenPCDet "
                          "model config: give it as --config, not --pcdet-config (Python: config=PATH, not "
                          "config_from_pcdet_yaml)")
    dataset = pcdet_dataset_refusal(raw, source)
    if dataset is not None:
        raise ConfigError(dataset)
    bases = _Bases(path, None if base_dir is None else _base_folder(Path(base_dir), source))
    return _Section(bases.overlay({}, raw), "", source)


def _base_folder(folder: Path, source: str) -> Path:
    """``base_dir`` (OpenPCDet's tools/ folder), refused unless it is a folder: "not found in FOLDER/cfgs/..." would
    blame the YAML's base path for the folder's typo."""
    kind = not_a_folder(folder)
    if kind is not None:
        what = "no such folder" if kind == "nothing" else f"{kind}, not a folder"
        raise ConfigError(f"{source}: --pcdet-base-dir {safe_repr(str(folder))}: {what}; give OpenPCDet's tools/ "
                          "folder, where the YAML's _BASE_CONFIG_ paths start (base_dir in Python)")
    return folder


class _Bases:
    """OpenPCDet's ``_BASE_CONFIG_``: at any level, the base file's mapping overlaid with the keys beside
    it (mappings merge key by key, any other value replaces); a base file's own ``_BASE_CONFIG_`` is
    not followed, as in OpenPCDet."""

    def __init__(self, source: Path, base_dir: Path | None) -> None:
        self.source, self.base_dir, self.loaded = source, base_dir, 0
        self.shown = safe_repr(source)  # the YAML as messages name it

    def overlay(self, base: dict[Any, Any], new: dict[Any, Any]) -> dict[Any, Any]:
        out = dict(base)
        if BASE_KEY in new:
            out.update(self._load(new[BASE_KEY]))
        for key, value in new.items():
            if key == BASE_KEY:
                continue
            below = out.get(key)
            out[key] = self.overlay(below if isinstance(below, dict) else {}, value) if isinstance(value, dict) else value
        return out

    def _load(self, rel: Any) -> dict[Any, Any]:
        if not isinstance(rel, str) or not rel:
            raise ConfigError(f"{self.shown}: {BASE_KEY} is {safe_repr(rel, 60)}; expected a file path")
        self.loaded += 1
        if self.loaded > _MAX_BASES:
            raise ConfigError(f"{self.shown}: more than {_MAX_BASES} {BASE_KEY} files")
        wanted = Path(rel)
        if wanted.is_absolute():
            candidates = [wanted]
        elif self.base_dir is not None:
            candidates = [self.base_dir / wanted]
        else:
            candidates = [folder / wanted for folder in self.source.resolve().parents]
        if "\0" in rel:  # an OS path cannot hold it: the look-up would fail with "embedded null byte", naming no file
            raise ConfigError(f"{self.shown}: {BASE_KEY} {safe_repr(rel, 60)} holds a NUL character, which no file "
                              "name has")
        try:
            found = next((c for c in candidates if c.is_file()), None)
        except OSError as exc:  # e.g. a name longer than the file system allows
            raise ConfigError(f"{self.shown}: {BASE_KEY} {safe_repr(rel, 60)}: {exc.strerror or exc}") from None
        odd = next(((c, special_kind(c)) for c in candidates if special_kind(c) is not None), None)
        if found is None and odd is not None:  # there, but no file: "not found" would contradict ls
            raise ConfigError(f"{self.shown}: {BASE_KEY} {safe_repr(rel, 60)}: {safe_repr(odd[0])} is {odd[1]}, "
                              "not a YAML file")
        if found is None:
            where = safe_repr(candidates[0]) if len(candidates) == 1 else f"any folder above {self.shown}"
            raise ConfigError(f"{self.shown}: {BASE_KEY} {safe_repr(rel, 60)} not found in {where}; "
                              "give OpenPCDet's tools/ folder (build --pcdet-base-dir; base_dir in Python)")
        if found.resolve() == self.source.resolve():  # its own keys again, in place of the base they need
            raise ConfigError(f"{self.shown}: {BASE_KEY} {safe_repr(rel, 60)} names this file itself; name the "
                              "base config it builds on (e.g. cfgs/dataset_configs/kitti_dataset.yaml)")
        loaded = read_yaml(found)
        if not isinstance(loaded, dict):  # its contents are not quoted: a base path may name any file
            raise ConfigError(f"{self.shown}: {BASE_KEY} {safe_repr(rel, 60)} ({safe_repr(found)}) holds no YAML mapping (a "
                              f"{type(loaded).__name__} at the top level): not an OpenPCDet config")
        return loaded


class _Section:
    """One mapping of the merged config; each read names its full key path in any refusal."""

    def __init__(self, value: Any, path: str, source: str) -> None:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {path or 'the config'} is {safe_repr(value, 60)}; expected a mapping")
        self.value, self.path, self.source = value, path, source

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def refuse(self, key: str, supported: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {self.key_path(key)} is {safe_repr(self.value.get(key), 60)}; "
                          f"supported: {supported}")

    def __getitem__(self, key: str) -> Any:
        if key not in self.value:
            raise ConfigError(f"{self.source}: {self.key_path(key)} is missing")
        return self.value[key]

    def section(self, key: str, read: tuple[str, ...], ignored: tuple[str, ...] = ()) -> _Section:
        """The mapping at ``key``; keys neither read nor known to be training-only are refused."""
        sub = _Section(self[key], self.key_path(key), self.source)
        sub.only(read + ignored)
        return sub

    def only(self, known: tuple[str, ...]) -> None:
        for key in self.value:
            if key not in known:
                raise ConfigError(f"{self.source}: {self.key_path(escape_text(str(key), 40))} is not supported "
                                  f"(known here: {', '.join(known)})")

    def expect(self, key: str, *supported: Any) -> Any:
        """The value, which must be one of ``supported`` (type included: 1 is not True)."""
        value = self[key]
        if not any(type(value) is type(s) and value == s for s in supported):
            self.refuse(key, " or ".join(repr(s) for s in supported))
        return value


def _convert(doc: _Section, name: str, source: str) -> ModelConfig:
    """Map the merged OpenPCDet config onto this package's fields (YAML spelling), then validate."""
    data = _Section(doc["DATA_CONFIG"], "DATA_CONFIG", source)
    model = doc.section("MODEL", ("NAME", "VFE", "MAP_TO_BEV", "BACKBONE_2D", "DENSE_HEAD", "POST_PROCESSING"))
    model.expect("NAME", "PointPillar")
    vfe = model.section("VFE", ("NAME", "WITH_DISTANCE", "USE_ABSLOTE_XYZ", "USE_NORM", "NUM_FILTERS"))
    vfe.expect("NAME", "PillarVFE")
    vfe.expect("WITH_DISTANCE", False)  # a distance channel is not among the decorations the kernels make
    vfe.expect("USE_NORM", True)  # the exported pillar net folds a BatchNorm
    filters = vfe["NUM_FILTERS"]
    if not isinstance(filters, list) or len(filters) != 1:
        vfe.refuse("NUM_FILTERS", "one PFN layer, e.g. [64]")
    if type(filters[0]) is not int or not 1 <= filters[0] <= MAX_PFN_CHANNELS:
        vfe.refuse("NUM_FILTERS", f"one PFN layer of 1 to {MAX_PFN_CHANNELS} channels, e.g. [64]")
    scatter = model.section("MAP_TO_BEV", ("NAME", "NUM_BEV_FEATURES"))
    scatter.expect("NAME", "PointPillarScatter")
    bev = scatter["NUM_BEV_FEATURES"]
    if type(bev) is not int:
        scatter.refuse("NUM_BEV_FEATURES", f"a whole number, the PFN layer's channels ({filters[0]})")
    if bev != filters[0]:  # the scatter lays the PFN layer's channels out as the BEV map's
        raise ConfigError(f"{source}: {scatter.key_path('NUM_BEV_FEATURES')} is {safe_repr(bev, 60)} and "
                          f"{vfe.key_path('NUM_FILTERS')} is {safe_repr(filters, 60)}: the two must be equal (the BEV "
                          "map's channels are the PFN layer's)")
    backbone = model.section("BACKBONE_2D", ("NAME", "LAYER_NUMS", "LAYER_STRIDES", "NUM_FILTERS",
                                             "UPSAMPLE_STRIDES", "NUM_UPSAMPLE_FILTERS"))
    backbone.expect("NAME", "BaseBEVBackbone")
    head = model.section("DENSE_HEAD", ("NAME", "CLASS_AGNOSTIC", "USE_DIRECTION_CLASSIFIER", "DIR_OFFSET",
                                        "DIR_LIMIT_OFFSET", "NUM_DIR_BINS", "ANCHOR_GENERATOR_CONFIG",
                                        "TARGET_ASSIGNER_CONFIG") + _MULTIHEAD_KEYS, ("LOSS_CONFIG",))
    multihead = head.expect("NAME", "AnchorHeadSingle", "AnchorHeadMulti") == "AnchorHeadMulti"
    head.expect("CLASS_AGNOSTIC", False)
    if multihead:  # the multi-head export and decoder have no direction classifier
        if "USE_DIRECTION_CLASSIFIER" in head.value:
            head.expect("USE_DIRECTION_CLASSIFIER", False)
    else:
        head.expect("USE_DIRECTION_CLASSIFIER", True)
    has_direction = not multihead
    box_code = _box_code(_Section(head["TARGET_ASSIGNER_CONFIG"], head.key_path("TARGET_ASSIGNER_CONFIG"), source))
    post = model.section("POST_PROCESSING", ("SCORE_THRESH", "OUTPUT_RAW_SCORE", "NMS_CONFIG"),
                         ("RECALL_THRESH_LIST", "EVAL_METRIC"))
    post.expect("OUTPUT_RAW_SCORE", False)  # raw logits instead of sigmoid scores
    nms = post.section("NMS_CONFIG", ("MULTI_CLASSES_NMS", "NMS_TYPE", "NMS_THRESH", "NMS_PRE_MAXSIZE",
                                      "NMS_POST_MAXSIZE"))
    # per class inside each head (multi-head models) or one NMS over all classes; OpenPCDet's per-class
    # top-k and cut differ from this package's per_class (zhulf0804's order)
    nms.expect("MULTI_CLASSES_NMS", multihead)
    nms.expect("NMS_TYPE", "nms_gpu")  # rotated BEV IoU
    voxels = _voxel_processor(data)
    config = {
        "name": name,
        "family": "openpcdet",
        "classes": doc["CLASS_NAMES"],
        "label_base": 1,  # configures nothing; the built-in configs' digests hash it (ModelConfig.legacy_label_base)
        "voxel": {
            "point_range": data["POINT_CLOUD_RANGE"],
            "pillar_size": voxels["VOXEL_SIZE"],
            "max_points_per_pillar": voxels["MAX_POINTS_PER_VOXEL"],
            "max_pillars": _test_value(voxels, "MAX_NUMBER_OF_VOXELS"),
            "range_filter": "inclusive_xy",  # mask_points_and_boxes_outside_range: lo <= x, y <= hi
        },
        "point_columns": _point_columns(data),
        "features": {"order": _feature_order(data, vfe.expect("USE_ABSLOTE_XYZ", True, False))},
        "network": {
            "pfn_channels": filters[0],
            "bn_eps": BN_EPS,
            "layer_nums": backbone["LAYER_NUMS"],
            "layer_strides": backbone["LAYER_STRIDES"],
            "block_channels": backbone["NUM_FILTERS"],
            "upsample_strides": backbone["UPSAMPLE_STRIDES"],
            "upsample_channels": backbone["NUM_UPSAMPLE_FILTERS"],
        },
        "anchors": _anchors(head),
        "box_coder": {"style": "openpcdet"},
        "box_code": box_code,
        "heads": _heads(head, box_code) if multihead else None,
        "direction": {
            "num_bins": head["NUM_DIR_BINS"],
            "offset": head["DIR_OFFSET"],
            "limit_offset": head["DIR_LIMIT_OFFSET"],
            "flip_bin": 1,  # OpenPCDet adds period * bin to the folded heading
        } if has_direction else None,
        "postprocess": {
            "nms": "multi_classes" if multihead else "class_agnostic",
            "score_threshold": post["SCORE_THRESH"],
            "score_inclusive": True,  # scores >= SCORE_THRESH
            "pre_nms_top_k": nms["NMS_PRE_MAXSIZE"],
            "nms_iou": nms["NMS_THRESH"],
            "max_boxes": nms["NMS_POST_MAXSIZE"],
            "output_range": None,
        },
    }
    return config_from_dict(config, f"{source} (read as this package's config)")


def _voxel_processor(data: _Section) -> _Section:
    """The test-time point processing: the range mask, no shuffling, then voxelization."""
    steps = data["DATA_PROCESSOR"]
    if not isinstance(steps, list):
        data.refuse("DATA_PROCESSOR", "a list of processing steps")
    names, voxels = [], None
    for i, step in enumerate(steps):
        entry = _Section(step, f"DATA_CONFIG.DATA_PROCESSOR[{i}]", data.source)
        kind = entry["NAME"]
        names.append(kind)
        if kind == "mask_points_and_boxes_outside_range":
            entry.only(("NAME", "REMOVE_OUTSIDE_BOXES"))
        elif kind == "shuffle_points":
            entry.only(("NAME", "SHUFFLE_ENABLED"))
            shuffle = _test_value(entry, "SHUFFLE_ENABLED")
            if shuffle is True:
                warnings.warn(f"{data.source}: {entry.key_path('SHUFFLE_ENABLED')} shuffles the points at test time; "
                              "this package keeps them in input order, as OpenPCDet does with the shuffle off (a shuffle "
                              "changes the pillar order and which points full pillars drop, from run to run)",
                              SettingNotice, stacklevel=4)
            elif shuffle is not False:
                entry.refuse("SHUFFLE_ENABLED", "True or False at test time")
        elif kind == "transform_points_to_voxels":
            entry.only(("NAME", "VOXEL_SIZE", "MAX_POINTS_PER_VOXEL", "MAX_NUMBER_OF_VOXELS"))
            voxels = entry
        else:
            entry.refuse("NAME", "mask_points_and_boxes_outside_range, shuffle_points, transform_points_to_voxels")
    if voxels is None or "mask_points_and_boxes_outside_range" not in names:
        data.refuse("DATA_PROCESSOR", "steps that include mask_points_and_boxes_outside_range and "
                                      "transform_points_to_voxels")
    return voxels


def _test_value(section: _Section, key: str) -> Any:
    """A per-split value (``{'train': ..., 'test': ...}``) at test time, or a plain value."""
    value = section[key]
    if isinstance(value, dict):
        return _Section(value, section.key_path(key), section.source)["test"]
    return value


def _used_features(data: _Section) -> list[str]:
    """The point features the network reads, in this package's names (``timestamp`` is ``time``)."""
    encoding = data.section("POINT_FEATURE_ENCODING", ("encoding_type", "used_feature_list", "src_feature_list"))
    encoding.expect("encoding_type", "absolute_coordinates_encoding")
    src = encoding["src_feature_list"]
    if not isinstance(src, list) or tuple(src[:4]) != _INPUT_COLUMNS or src[4:] not in ([], [_TIME_COLUMN]):
        encoding.refuse("src_feature_list", "points whose columns are x, y, z, intensity (and timestamp)")
    used = encoding["used_feature_list"]
    supported = (list(_INPUT_COLUMNS[:3]), list(_INPUT_COLUMNS), [*_INPUT_COLUMNS, _TIME_COLUMN])
    if used not in supported or not set(used) <= set(src):
        encoding.refuse("used_feature_list", " or ".join(map(str, supported)) + ", each in src_feature_list")
    return ["time" if name == _TIME_COLUMN else name for name in used]


def _point_columns(data: _Section) -> list[str]:
    """x, y, z, intensity, and the time lag when the network reads it."""
    return [*_INPUT_COLUMNS, *(["time"] if "time" in _used_features(data) else [])]


def _feature_order(data: _Section, absolute_xyz: bool) -> list[str]:
    """PillarVFE's decorated point: the used point features (x, y, z dropped without absolute xyz),
    then point - pillar mean and point - pillar centre, each (x, y, z)."""
    used = _used_features(data)
    point = used if absolute_xyz else used[3:]
    return [*point, "mean_dx", "mean_dy", "mean_dz", "center_dx", "center_dy", "center_dz"]


_MULTIHEAD_KEYS = ("USE_MULTIHEAD", "SEPARATE_MULTIHEAD", "SHARED_CONV_NUM_FILTER", "RPN_HEAD_CFGS",
                   "SEPARATE_REG_CONFIG")


def _box_code(assigner: _Section) -> dict[str, Any]:
    """ResidualCoder's options: code_size 7 (the default) or 9 (with velocity), headings as one
    residual or as (cos, sin) residuals."""
    assigner.expect("BOX_CODER", "ResidualCoder")
    if "BOX_CODER_CONFIG" not in assigner.value:
        return {"angle": "residual", "velocity": False}
    options = _Section(assigner["BOX_CODER_CONFIG"], assigner.key_path("BOX_CODER_CONFIG"), assigner.source)
    options.only(("code_size", "encode_angle_by_sincos"))
    size = options.expect("code_size", 7, 9) if "code_size" in options.value else 7
    sincos = options.expect("encode_angle_by_sincos", True, False) if "encode_angle_by_sincos" in options.value else False
    return {"angle": "sincos" if sincos else "residual", "velocity": size == 9}


def _heads(head: _Section, box_code: dict[str, Any]) -> dict[str, Any]:
    """AnchorHeadMulti with separate heads, a shared conv and one middle conv before each output conv."""
    head.expect("USE_MULTIHEAD", True)
    head.expect("SEPARATE_MULTIHEAD", True)
    groups = []
    cfgs = head["RPN_HEAD_CFGS"]
    if not isinstance(cfgs, list) or not cfgs:
        head.refuse("RPN_HEAD_CFGS", "a list of heads, e.g. [{'HEAD_CLS_NAME': ['car']}]")
    for i, raw in enumerate(cfgs):
        entry = _Section(raw, f"{head.key_path('RPN_HEAD_CFGS')}[{i}]", head.source)
        entry.only(("HEAD_CLS_NAME",))
        groups.append(entry["HEAD_CLS_NAME"])
    reg = head.section("SEPARATE_REG_CONFIG", ("NUM_MIDDLE_CONV", "NUM_MIDDLE_FILTER", "REG_LIST"))
    reg.expect("NUM_MIDDLE_CONV", 1)
    parts = _REG_PARTS[box_code["angle"]] + (["velo:2"] if box_code["velocity"] else [])
    reg.expect("REG_LIST", parts)
    return {"groups": groups, "shared_channels": head["SHARED_CONV_NUM_FILTER"],
            "middle_channels": reg["NUM_MIDDLE_FILTER"], "middle_bn_eps": HEAD_MIDDLE_BN_EPS}


def _anchors(head: _Section) -> dict[str, Any]:
    """One anchor size and bottom per class; rotations, alignment and stride shared by all classes,
    as this package's anchor layout has them."""
    generators = head["ANCHOR_GENERATOR_CONFIG"]
    if not isinstance(generators, list) or not generators:
        head.refuse("ANCHOR_GENERATOR_CONFIG", "a list of one entry per class")
    classes: list[dict[str, Any]] = []
    shared: dict[str, Any] = {}
    for i, raw in enumerate(generators):
        entry = _Section(raw, f"{head.key_path('ANCHOR_GENERATOR_CONFIG')}[{i}]", head.source)
        entry.only(("class_name", "anchor_sizes", "anchor_rotations", "anchor_bottom_heights", "align_center",
                    "feature_map_stride", "matched_threshold", "unmatched_threshold"))
        sizes, bottoms = entry["anchor_sizes"], entry["anchor_bottom_heights"]
        if not isinstance(sizes, list) or len(sizes) != 1:
            entry.refuse("anchor_sizes", "one size per class, e.g. [[3.9, 1.6, 1.56]]")
        if not isinstance(bottoms, list) or len(bottoms) != 1:
            entry.refuse("anchor_bottom_heights", "one height per class, e.g. [-1.78]")
        entry.expect("align_center", True, False)
        rotations, stride = entry["anchor_rotations"], entry["feature_map_stride"]
        # each entry's own value checked before the entries are compared: a bad first one is named, not the next
        if not isinstance(rotations, list) or not rotations or \
                not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rotations):
            entry.refuse("anchor_rotations", "a list of rotations in radians, e.g. [0, 1.57]")
        if type(stride) is not int or stride < 1:
            entry.refuse("feature_map_stride", "a positive integer, e.g. 2")
        classes.append({"class": entry["class_name"], "size": sizes[0], "bottom": bottoms[0]})
        for key in ("anchor_rotations", "align_center", "feature_map_stride"):
            shared.setdefault(key, entry[key])
            if entry[key] != shared[key]:
                entry.refuse(key, f"the value of the first class ({safe_repr(shared[key], 60)})")
    return {
        "classes": classes,
        "rotations": shared["anchor_rotations"],
        # False: x_i = lo + i * (hi - lo) / (W - 1); True: cell centres (rounded as zhulf0804's linspace)
        "alignment": "cell_centers" if shared["align_center"] else "range_corners",
        "stride": shared["feature_map_stride"],
    }
