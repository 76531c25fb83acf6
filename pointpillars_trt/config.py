"""Model configs: the single source of every number the export, the engines and the kernels use.

A config is a YAML file under ``pointpillars_trt/configs`` (or any path). It is parsed once into
frozen dataclasses; derived sizes (grid, head map, anchor count) are properties, never stored twice.
Every config (a built-in, a user's YAML, a model dir's stored ``to_dict()``) passes one validator,
``config_from_dict``: strict types, no unknown or missing keys, and the bounds that both the NumPy
reference and the CUDA kernels need, so a config runs on every path or is refused up front with a
message naming the source and the key path. Config files are untrusted input: aliases, deep nesting,
repeated keys and oversized files are refused, and no message echoes more than a short escaped excerpt
of a value.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar, Union, get_args

import numpy as np

from .config_yaml import PLAIN_NAME, key_path, parse_yaml, read_yaml
from .errors import ConfigError, InputError, counted, safe_repr, shell_word
from .file_reads import path_argument
from .kernel_limits import GATHER_WARPS, PFN_BLOCK_THREADS, SORT_LIMIT, STATIC_SHARED_BYTES

#: What a lidar frame's columns may hold, in the order frames store them: KITTI-style frames carry the
#: first four, nuScenes-style multi-sweep frames add each point's time lag behind the key sweep (s).
POINT_COLUMN_NAMES = ("x", "y", "z", "intensity", "time")
# New names go at the end: the GPU voxelizer's FEATURE_CODES are indices into this tuple.
FEATURE_NAMES = (
    "x", "y", "z", "intensity",
    "mean_dx", "mean_dy", "mean_dz",
    "center_dx", "center_dy", "center_dz",
    "time",
)
BOX_SIZE = 7  # x, y, z, dx, dy, dz, heading: every output box, whatever the model's box code
RangeFilter = Literal["inclusive_xy", "strict_xyz"]
AnchorAlignment = Literal["range_corners", "cell_centers"]
BoxCoderStyle = Literal["openpcdet", "zhulf0804"]
NmsStyle = Literal["class_agnostic", "per_class", "multi_classes"]
AngleCode = Literal["residual", "sincos"]


@dataclass(frozen=True)
class VoxelConfig:
    point_range: tuple[float, float, float, float, float, float]
    pillar_size: tuple[float, float, float]
    max_points_per_pillar: int
    max_pillars: int
    range_filter: RangeFilter

    @property
    def grid(self) -> tuple[int, int, int]:
        """Grid (nx, ny, nz), as the references round it."""
        r, s = self.point_range, self.pillar_size
        return tuple(int(round((r[i + 3] - r[i]) / s[i])) for i in range(3))  # type: ignore[return-value]


@dataclass(frozen=True)
class FeatureConfig:
    order: tuple[str, ...]

    @property
    def channels(self) -> int:
        return len(self.order)


@dataclass(frozen=True)
class NetworkConfig:
    pfn_channels: int
    bn_eps: float
    layer_nums: tuple[int, ...]
    layer_strides: tuple[int, ...]
    block_channels: tuple[int, ...]
    upsample_strides: tuple[int | float, ...]  # 0.5: a strided conv that halves the map
    upsample_channels: tuple[int, ...]

    @property
    def head_in_channels(self) -> int:
        return sum(self.upsample_channels)

    @property
    def upsample_kernels(self) -> tuple[int, ...]:
        """Kernel size (= stride) of each upsampling conv: s for a transposed conv, 1/s for the strided
        conv of a stride s < 1."""
        return tuple(int(s) if s >= 1 else int(round(1 / s)) for s in self.upsample_strides)


@dataclass(frozen=True)
class AnchorClass:
    name: str
    size: tuple[float, float, float]
    bottom: float


@dataclass(frozen=True)
class AnchorConfig:
    classes: tuple[AnchorClass, ...]
    rotations: tuple[float, ...]
    alignment: AnchorAlignment
    stride: int

    @property
    def per_cell(self) -> int:
        return len(self.classes) * len(self.rotations)


@dataclass(frozen=True)
class DirectionConfig:
    num_bins: int
    offset: float
    limit_offset: float
    flip_bin: int


@dataclass(frozen=True)
class HeadsConfig:
    """OpenPCDet's AnchorHeadMulti: a shared 3x3 conv, then one head per class group, each with a
    3x3 conv + BN + ReLU before every output conv (class scores and each box-code part)."""

    groups: tuple[tuple[str, ...], ...]  # the classes of each head, in head order
    shared_channels: int
    middle_channels: int
    middle_bn_eps: float  # nn.BatchNorm2d's default in the heads, unlike the network's bn_eps


@dataclass(frozen=True)
class BoxCodeConfig:
    """What a box code holds beyond x y z dx dy dz: the heading as one residual or as (cos, sin)
    residuals (OpenPCDet's encode_angle_by_sincos), and a (vx, vy) velocity."""

    angle: AngleCode = "residual"
    velocity: bool = False


@dataclass(frozen=True)
class PostProcessConfig:
    nms: NmsStyle
    score_threshold: float
    score_inclusive: bool
    pre_nms_top_k: int
    nms_iou: float
    max_boxes: int
    output_range: tuple[float, float, float, float, float, float] | None


@dataclass(frozen=True)
class ModelConfig:
    name: str
    family: str
    classes: tuple[str, ...]
    voxel: VoxelConfig
    features: FeatureConfig
    network: NetworkConfig
    anchors: AnchorConfig
    box_coder: BoxCoderStyle
    direction: DirectionConfig | None  # None: no direction classifier (e.g. sin/cos headings)
    postprocess: PostProcessConfig
    # Added after the first model families: to_dict() leaves them out at these defaults, so the
    # digests of existing model dirs and plans do not change.
    point_columns: tuple[str, ...] = POINT_COLUMN_NAMES[:4]
    box_code: BoxCodeConfig = BoxCodeConfig()
    heads: HeadsConfig | None = None
    # What configs have said since the first of the family's own label numbering (``label_base``: 1 for OpenPCDet's
    # pred_labels, 0 for zhulf0804's). It configures nothing (results' labels are 0-based in every family, OpenPCDet's
    # 1-based ones come from ``Detections.to_pcdet_dict``), but digests have always hashed it: kept as given (0 when
    # absent) and stored by to_dict() as ``label_base``, so the digests of model dirs and plans stay as they were.
    legacy_label_base: int = 0

    @property
    def num_point_columns(self) -> int:
        """Float32 values a point of this model's frames holds (4: x y z intensity; 5: + time)."""
        return len(self.point_columns)

    @property
    def expects_unit_intensity(self) -> bool:
        """Whether frames should carry 0-1 reflectance (KITTI) rather than 0-255 values: single-sweep
        models with an intensity feature (multi-sweep ones, such as nuScenes', are trained on 0-255)."""
        return "intensity" in self.features.order and self.num_point_columns == 4

    @property
    def box_code_size(self) -> int:
        """Regression values a box code holds: x y z dx dy dz, the heading (1, or 2 as cos and sin),
        then the velocity (vx, vy) when the model predicts it."""
        return BOX_SIZE + (self.box_code.angle == "sincos") + 2 * self.box_code.velocity

    def require_direction(self, what: str) -> DirectionConfig:
        """The direction classifier that ``what`` (a single-head path) decodes; refused when there is none."""
        if self.direction is None:
            raise ConfigError(f"{self.name}: {what} needs a direction classifier; this model has none")
        return self.direction

    def require_heads(self) -> HeadsConfig:
        """The heads of a multi-head model; refused for a single-head one."""
        if self.heads is None:
            raise ConfigError(f"{self.name}: not a multi-head model")
        return self.heads

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def head_map(self) -> tuple[int, int]:
        """Head map (nx, ny): the BEV grid divided by the anchor stride."""
        nx, ny, _ = self.voxel.grid
        return nx // self.anchors.stride, ny // self.anchors.stride

    @property
    def num_anchors(self) -> int:
        nx, ny = self.head_map
        return nx * ny * self.anchors.per_cell

    @property
    def head_channels(self) -> dict[str, int]:
        """Channels of the three head maps (class, box, direction); a multi-head model stacks its heads'
        channels head by head within each part, and each head scores only its own classes."""
        a = self.anchors.per_cell
        bins = 0 if self.direction is None else self.direction.num_bins
        if self.heads is None:
            return {"cls": a * self.num_classes, "box": a * self.box_code_size, "dir": a * bins}
        r = len(self.anchors.rotations)
        return {"cls": sum(r * len(g) * len(g) for g in self.heads.groups), "box": a * self.box_code_size,
                "dir": a * bins}

    def to_dict(self) -> dict[str, Any]:
        """Every field, less the later-added ones that hold their default (see ``_ADDED_DEFAULTS``), with
        ``legacy_label_base`` spelt ``label_base`` as configs spell it."""
        out = asdict(self)
        out["label_base"] = out.pop("legacy_label_base")
        for key, default in _ADDED_DEFAULTS.items():
            if out[key] == default:
                del out[key]
        return out

    def digest(self) -> str:
        """A stable hash of the model's identity; model dirs and plans record it.

        It covers every number the graphs and kernels are built from, but not the post-process launch
        values (score threshold, NMS IoU, max boxes), which ``with_thresholds`` changes at run time.
        """
        text = json.dumps(self._identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def identity_differences(self, other: ModelConfig) -> list[tuple[str, Any, Any]]:
        """The fields of the identity (``digest``'s) in which ``other`` differs from this config, each as (dotted
        field, this config's value, other's): what tells apart two configs of one name (a built-in config's YAML
        copied and edited)."""
        mine, theirs = _leaves(self._identity()), _leaves(other._identity())
        return [(field, mine.get(field), theirs.get(field)) for field in sorted(mine.keys() | theirs.keys())
                if field != "name" and mine.get(field) != theirs.get(field)]

    def _identity(self) -> dict[str, Any]:
        identity = self.to_dict()
        for key in _RUNTIME_KEYS:
            del identity["postprocess"][key]
        return identity

    def with_thresholds(
        self, *, score_threshold: float | None = None, nms_iou: float | None = None, max_boxes: int | None = None
    ) -> ModelConfig:
        """A validated copy with new post-process launch values (None keeps one); the digest is unchanged."""
        changes = _checked_thresholds({"score_threshold": score_threshold, "nms_iou": nms_iou, "max_boxes": max_boxes})
        return replace(self, postprocess=replace(self.postprocess, **changes))


@dataclass(frozen=True)
class Thresholds:
    """Post-process values a caller may change per call or per request (None keeps the detector's).

    They are kernel inputs on the GPU, so a new value recompiles and rebuilds nothing; ``max_boxes``
    may not exceed the value the detector was opened with, which sizes its result buffers."""

    score_threshold: float | None = None
    nms_iou: float | None = None
    max_boxes: int | None = None

    def __post_init__(self) -> None:
        """Checked when made, and held as Python numbers (NumPy scalars converted), so that equal values
        compare, hash and serialize (JSON, Triton requests) alike."""
        for key, value in _checked_thresholds(asdict(self)).items():
            object.__setattr__(self, key, value)

    def filled_from(self, cfg: ModelConfig) -> Thresholds:
        """These values, each one left to the model (None) taken from ``cfg``: for what reopens a model dir by path
        and would read the values of the config that built it, not those of the config it was opened with
        (``ModelDir.with_launch_values``: Ray's workers)."""
        post = cfg.postprocess
        return Thresholds(*(getattr(post, key) if value is None else value for key, value in asdict(self).items()))

    def applied_to(self, cfg: ModelConfig) -> ModelConfig:
        """``cfg`` (a detector's config) with these values; ConfigError names a bad one, or a max boxes
        above ``cfg``'s, the cap its result buffers are sized for."""
        tuned = cfg.with_thresholds(score_threshold=self.score_threshold, nms_iou=self.nms_iou,
                                    max_boxes=self.max_boxes)
        cap = cfg.postprocess.max_boxes
        if tuned.postprocess.max_boxes > cap:
            raise ConfigError(f"max_boxes {tuned.postprocess.max_boxes}: the detector was opened with max_boxes "
                              f"{cap}, which sizes its result buffers; open it with a larger max_boxes")
        return tuned


def _is_pcdet_model_config(raw: object) -> bool:
    """Whether a parsed YAML is an OpenPCDet model config: its top-level MODEL, CLASS_NAMES, DATA_CONFIG keys."""
    return isinstance(raw, Mapping) and bool({"MODEL", "CLASS_NAMES", "DATA_CONFIG"} & set(raw))


#: What to give in place of an OpenPCDet dataset config, which holds no model.
PCDET_DATASET_FIX = ("give the model's YAML, which names this one as its _BASE_CONFIG_ (tools/cfgs/kitti_models/"
                     "pointpillar.yaml, tools/cfgs/nuscenes_models/cbgs_pp_multihead.yaml, ...)")


def pcdet_dataset_refusal(raw: object, source: str) -> str | None:
    """The refusal of a parsed YAML that is an OpenPCDet dataset config (``tools/cfgs/dataset_configs/*.yaml``:
    a top-level DATASET, no model), given where a model config goes; None for any other YAML."""
    if not isinstance(raw, Mapping) or "DATASET" not in raw or _is_pcdet_model_config(raw):
        return None
    return (f"{source}: an OpenPCDet dataset config (DATASET {safe_repr(raw['DATASET'], 40)}), not a model config: "
            f"{PCDET_DATASET_FIX}")


def is_package_config(raw: object) -> bool:
    """Whether a parsed YAML is a config of this package's (its top-level family and voxel keys, no OpenPCDet
    one), which ``build --pcdet-config`` would find missing every OpenPCDet key of."""
    return isinstance(raw, Mapping) and {"family", "voxel"} <= set(raw) and not _is_pcdet_model_config(raw)


def is_pcdet_model_config(name_or_path: str | Path) -> bool:
    """Whether a ``--config`` names an OpenPCDet model config (``tools/cfgs/kitti_models/pointpillar.yaml``), which
    ``build --pcdet-config`` reads, not this package's loader; False also where the file cannot be read as YAML
    (``load_config`` then says why)."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") or path.is_file()):
        return False
    try:
        return _is_pcdet_model_config(read_yaml(path))
    except (ConfigError, InputError, OSError):
        return False


def yaml_config_flag(path: Path) -> str | None:
    """The build option a YAML file goes to by its kind: ``--config`` for one of this package's configs
    (``is_package_config``), ``--pcdet-config`` for an OpenPCDet model config; None for any other YAML and a file
    that cannot be read as one."""
    try:
        raw = read_yaml(path)
    except (ConfigError, InputError, OSError):
        return None
    if is_package_config(raw):
        return "--config"
    return "--pcdet-config" if _is_pcdet_model_config(raw) else None


def build_command(checkpoint: str | os.PathLike[str] | None, out: str | os.PathLike[str] | None, *,
                  config: str | None = None, pcdet_config: str | os.PathLike[str] | None = None) -> str:
    """The ``pointpillars-trt build`` command, in backquotes, that makes a model dir at ``out`` of ``checkpoint``
    (placeholders where they are not known), with ``--config`` or ``--pcdet-config`` where given: the one spelling
    of every fix that is a build."""
    words = ["pointpillars-trt", "build", "--checkpoint",
             "YOUR_CHECKPOINT.pth" if checkpoint is None else os.fspath(checkpoint)]
    if config is not None:
        words += ["--config", config]
    if pcdet_config is not None:
        words += ["--pcdet-config", os.fspath(pcdet_config)]
    words += ["--out", "MODEL_DIR" if out is None else os.fspath(out)]
    return "`" + " ".join(map(shell_word, words)) + "`"


def _leaves(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The values of nested ``fields`` by dotted path (``voxel.max_pillars``); lists are values."""
    found: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            found.update(_leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def builtin_config_names() -> list[str]:
    folder = resources.files("pointpillars_trt") / "configs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_config(name_or_path: str | Path) -> ModelConfig:
    """Load a built-in config by name (``openpcdet_kitti_3class``) or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if len(path.parts) == 1 and path.stem in builtin_config_names() and not os.path.lexists(path):
            raise ConfigError(f"{safe_repr(str(path), 60)}: config file not found; the built-in config of that "
                              f"name is given without {path.suffix}: {path.stem!r}")
        raw, shown = read_yaml(path), safe_repr(path)
        _refuse_pcdet_config(raw, shown, f"{build_command(None, None, pcdet_config=path)} reads it, then "
                             "`pointpillars-trt infer PATH --model MODEL_DIR` runs the model dir it writes (Python: "
                             "convert.pcdet_config.config_from_pcdet_yaml)")
        return config_from_dict(raw, shown)
    name = str(name_or_path)
    if name not in builtin_config_names():
        raise ConfigError(
            f"unknown config {safe_repr(name, 60)}: expected a YAML path or one of {builtin_config_names()}"
        )
    data = (resources.files("pointpillars_trt") / "configs" / f"{name}.yaml").read_bytes()
    return config_from_dict(parse_yaml(data, name), name)


#: What an API's ``config=`` takes: a built-in config's name or a YAML path, a ``ModelConfig``, or a dict of its
#: fields (``ModelConfig.to_dict()``, or a config YAML as loaded); None: the checkpoint's or model dir's own.
ConfigArgument = Union[str, "os.PathLike[str]", ModelConfig, Mapping[str, Any], None]
_CONFIG_ARGUMENT = ("a built-in config name (one of {names}), a config YAML path, a ModelConfig, or a dict of "
                    "its fields (ModelConfig.to_dict())")


def config_argument(config: object) -> ModelConfig | None:
    """The ``ModelConfig`` an API's ``config=`` names (``ConfigArgument``; None stays None), or one
    ConfigError saying what to pass: a wrong type would otherwise fail as a TypeError or AttributeError deep in
    the loader, and an OpenPCDet config read into a dict is not this package's layout."""
    if config is None or isinstance(config, ModelConfig):
        return config
    if isinstance(config, (str, bytes, os.PathLike)):
        return load_config(path_argument(config, "config", ConfigError, "a config name or YAML path"))
    if isinstance(config, Mapping):
        _refuse_pcdet_config(config, "config", "pass its YAML file's path to "
                             "pointpillars_trt.convert.pcdet_config.config_from_pcdet_yaml(path) and give "
                             "config= the ModelConfig it returns")
        return config_from_dict(dict(config), "config dict")
    raise ConfigError(f"config: expected {_CONFIG_ARGUMENT.format(names=', '.join(builtin_config_names()))}; got "
                      f"{safe_repr(config, 60)} ({type(config).__name__})")


def _refuse_pcdet_config(raw: object, source: str, fix: str) -> None:
    """Refuse an OpenPCDet model config (``_is_pcdet_model_config``), which is no
    config of this package's layout, naming ``fix``: how to read it instead; and a dataset config, naming
    the model config to build with."""
    if _is_pcdet_model_config(raw):
        raise ConfigError(f"{source}: an OpenPCDet model config (MODEL, CLASS_NAMES, ...), not one of this "
                          f"package's: {fix}")
    dataset = pcdet_dataset_refusal(raw, source)
    if dataset is not None:
        raise ConfigError(f"{dataset} to `pointpillars-trt build --pcdet-config` (Python: "
                          "convert.pcdet_config.config_from_pcdet_yaml)")


# --------------------------------------------------------------------------- field rules

# Bounds of the CUDA kernels, enforced here so that the CPU path refuses what the GPU path cannot run;
# the launch shapes they follow from are the kernels' own (kernel_limits.py).
# vox_gather stages GATHER_WARPS x MAX_PTS float4 (16 B) in shared memory: 384 points.
MAX_POINTS_PER_PILLAR = STATIC_SHARED_BYTES // (GATHER_WARPS * 16)
MAX_PFN_CHANNELS = PFN_BLOCK_THREADS  # pfn_forward: a pillar's channels in one block, one channel a thread at worst
MAX_FEATURES = 16  # FEATURE_CODES packs 4 bits per channel into 64 bits
MAX_PILLARS = 2**20
# Cell ids are int32 in every kernel. 2**26 cells (8192 x 8192) is ~300x the KITTI grid (432 x 496);
# beside it, cells x the widest channel count (PFN, blocks, upsampling, head; counted at full grid
# resolution, which over-counts the strided maps) stays below 2**31, so every canvas, block and head
# tensor is indexable in int32 and within TensorRT's tensor volume.
MAX_GRID_CELLS = 2**26
INDEX_LIMIT = 2**31
# With per-class NMS's next_power_of_two(classes x pre_nms_top_k) <= SORT_LIMIT (kernels/postprocess.py's rule),
# 64 classes keep postprocess.cu's 16-bit slot (class x max(64, next_power_of_two(top_k)) + rank) below 2**16.
MAX_CLASSES = 64
_COORD = 1e4  # metres: any lidar range, and well inside float32's exact-enough range
# Features a family's pillar encoder really computes twice: zhulf0804's overwrites the raw x, y with the
# pillar-centre offsets it also appends. Any other repeat is a slip (x, x, z for x, y, z) that a checkpoint
# with the same channel count would run with, silently feeding one channel a feature it was not trained on.
_REPEATABLE_FEATURES: dict[str, tuple[str, ...]] = {"openpcdet": (), "zhulf0804": ("center_dx", "center_dy")}
_RUNTIME_KEYS = ("score_threshold", "nms_iou", "max_boxes")  # post-process launch values, not identity
# Fields added after the first families, as to_dict() spells their defaults: left out of to_dict() (and so of
# the digest and of stored configs) while they hold these values.
_ADDED_DEFAULTS: dict[str, Any] = {"point_columns": POINT_COLUMN_NAMES[:4], "box_code": asdict(BoxCodeConfig()),
                                   "heads": None}

T = TypeVar("T")
Rule = Callable[[Any, str], T]  # (untrusted value, key path) -> checked value


class _Invalid(Exception):
    """A config error naming the key path; ``config_from_dict`` adds the source."""


def _bad(path: str, expected: str, value: object) -> NoReturn:
    raise _Invalid(f"{path}: expected {expected}, got {safe_repr(value, 60)}")


def plain_number(value: object) -> object:
    """A NumPy integer or floating scalar (a value read from an array or a config) as the Python int or
    float it holds, so that number rules take it as the number it is; anything else (np.bool_ too) as is."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def int_within(value: object, low: int, high: int | None = None) -> int | None:
    """``value`` as the int it is (a NumPy integer: the int it holds) when it is one from ``low`` to ``high``
    (None: no bound), else None: the one check of a count, size or index given as an argument (a bool is
    no int here, nor is 4.0)."""
    number = plain_number(value)
    if not isinstance(number, int) or isinstance(number, bool) or number < low or (high is not None and number > high):
        return None
    return int(number)  # an IntEnum's value as the int it is


def finite_float(value: object) -> float | None:
    """``value`` as the float it is when it is a finite number (a Fraction, a 0-d array, a NumPy scalar
    too), else None: the one check of a real number given as an argument (a bool or a numeric string is
    no number here)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _int(lo: int, hi: int) -> Rule[int]:
    """Integers only (NumPy ones too): bools, floats (even 4.0) and strings are refused."""
    expected = f"the integer {lo}" if lo == hi else f"an integer in {lo}..{hi}"

    def rule(value: Any, path: str) -> int:
        number = plain_number(value)
        if type(number) is not int or not lo <= number <= hi:
            _bad(path, expected, value)
        return number

    return rule


def _float(lo: float, hi: float, *, open_lo: bool = False) -> Rule[float]:
    """Finite numbers (integers and NumPy scalars accepted) in [lo, hi], or (lo, hi] with ``open_lo``."""
    expected = f"a finite number in {'(' if open_lo else '['}{lo:g}, {hi:g}]"

    def rule(value: Any, path: str) -> float:
        number = plain_number(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            _bad(path, expected, value)
        try:
            x = float(number)
        except OverflowError:
            _bad(path, expected, value)
        if not (math.isfinite(x) and (lo < x if open_lo else lo <= x) and x <= hi):
            _bad(path, expected, value)
        return x

    return rule


def _bool(value: Any, path: str) -> bool:
    if type(value) is not bool:
        _bad(path, "true or false", value)
    return value


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value):
        _bad(path, "a name of 1-64 letters, digits or _.+-", value)
    return value


def _choice(options: tuple[str, ...]) -> Rule[Any]:
    """One of ``options`` (a Literal's values), typed Any so it fills the Literal field."""
    expected = "one of " + ", ".join(options)

    def rule(value: Any, path: str) -> Any:
        if not isinstance(value, str) or value not in options:
            _bad(path, expected, value)
        return value

    return rule


def _seq(item: Rule[T], lo: int, hi: int | None = None) -> Rule[tuple[T, ...]]:
    """A list (or tuple, as ``to_dict`` keeps them) of lo..hi items, each checked at ``path[i]``."""
    hi = lo if hi is None else hi
    expected = f"a list of {lo} items" if lo == hi else f"a list of {lo}..{hi} items"

    def rule(value: Any, path: str) -> tuple[T, ...]:
        if not isinstance(value, (list, tuple)) or not lo <= len(value) <= hi:
            _bad(path, expected, value)
        return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))

    return rule


def _optional(rule: Rule[T]) -> Rule[T | None]:
    return lambda value, path: None if value is None else rule(value, path)


def _fields(value: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A mapping with exactly the known keys: an unknown key (with the closest known one) or a missing
    key is refused by its path."""
    if not isinstance(value, dict):
        _bad(path or "the config", "a mapping", value)
    known = required + optional
    for key in value:
        if key not in known:
            close = difflib.get_close_matches(key, known, 1) if isinstance(key, str) and len(key) <= 64 else []
            hint = f"did you mean {close[0]}?" if close else "expected " + ", ".join(known)
            raise _Invalid(f"{key_path(path, key)}: unknown key ({hint})")
    for key in required:
        if key not in value:
            raise _Invalid(f"{key_path(path, key)}: missing key")
    return value


_COORDINATE = _float(-_COORD, _COORD)
_LENGTH = _float(1e-3, 2 * _COORD)  # metres; a millimetre floor keeps float32 sizes and ratios sane
_ANGLE = _float(-2 * math.pi, 2 * math.pi)
_UNIT = _float(0.0, 1.0)
_RANGE6 = _seq(_COORDINATE, 6)
_CHANNELS = _int(1, 4096)
_TOP_K = _int(1, SORT_LIMIT)
# The values ``with_thresholds`` may change; also the rules config_from_dict applies to them.
_THRESHOLD_RULES: dict[str, Rule[Any]] = {
    "score_threshold": _UNIT,  # sigmoid scores: a NaN or out-of-range threshold passes all or nothing
    "nms_iou": _UNIT,
    "max_boxes": _TOP_K,  # no path can keep more than SORT_LIMIT boxes
}


def _checked_thresholds(given: dict[str, Any]) -> dict[str, Any]:
    """The given threshold values (None: not given, left out) checked by their rules, as Python numbers."""
    try:
        return {key: _THRESHOLD_RULES[key](value, key) for key, value in given.items() if value is not None}
    except _Invalid as exc:
        raise ConfigError(f"thresholds: {exc}") from None


# --------------------------------------------------------------------------- the validator

def config_from_dict(raw: Any, source: str = "<dict>") -> ModelConfig:
    """Build and validate a config; every error names the source (as messages show it: a file's ``safe_repr``) and the
    key path.

    The one validator of every path (YAML, model dirs, tests): it accepts the YAML spelling and
    ``ModelConfig.to_dict()``'s, so ``config_from_dict(cfg.to_dict())`` round-trips.
    """
    try:
        cfg = _parse(raw)
        _check(cfg)
    except _Invalid as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    return cfg


def _parse(raw: Any) -> ModelConfig:
    """Types, keys and per-field bounds, section by section."""
    top = _fields(raw, "", ("name", "family", "classes", "voxel", "features", "network", "anchors",
                            "box_coder", "direction", "postprocess"), ("label_base", *_ADDED_DEFAULTS))
    classes = _seq(_name, 1, MAX_CLASSES)(top["classes"], "classes")
    v = _fields(top["voxel"], "voxel", ("point_range", "pillar_size", "max_points_per_pillar", "max_pillars",
                                        "range_filter"))
    n = _fields(top["network"], "network", ("pfn_channels", "bn_eps", "layer_nums", "layer_strides",
                                            "block_channels", "upsample_strides", "upsample_channels"))
    a = _fields(top["anchors"], "anchors", ("classes", "rotations", "alignment", "stride"))
    p = _fields(top["postprocess"], "postprocess", ("nms", "score_inclusive", "pre_nms_top_k") + _RUNTIME_KEYS,
                ("output_range",))
    coder, coder_path = top["box_coder"], "box_coder"
    if isinstance(coder, dict):  # the YAML spelling; to_dict() stores the style alone
        coder, coder_path = _fields(coder, coder_path, ("style",))["style"], "box_coder.style"
    return ModelConfig(
        name=_name(top["name"], "name"),
        point_columns=_point_columns(top.get("point_columns", _ADDED_DEFAULTS["point_columns"]), "point_columns"),
        family=_choice(("openpcdet", "zhulf0804"))(top["family"], "family"),
        classes=classes,
        voxel=VoxelConfig(
            point_range=_RANGE6(v["point_range"], "voxel.point_range"),  # type: ignore[arg-type]
            pillar_size=_seq(_LENGTH, 3)(v["pillar_size"], "voxel.pillar_size"),  # type: ignore[arg-type]
            max_points_per_pillar=_int(1, MAX_POINTS_PER_PILLAR)(v["max_points_per_pillar"],
                                                                 "voxel.max_points_per_pillar"),
            max_pillars=_int(1, MAX_PILLARS)(v["max_pillars"], "voxel.max_pillars"),
            range_filter=_choice(get_args(RangeFilter))(v["range_filter"], "voxel.range_filter"),
        ),
        features=FeatureConfig(order=_seq(_choice(FEATURE_NAMES), 1, MAX_FEATURES)(
            _fields(top["features"], "features", ("order",))["order"], "features.order")),
        network=NetworkConfig(
            pfn_channels=_int(1, MAX_PFN_CHANNELS)(n["pfn_channels"], "network.pfn_channels"),
            bn_eps=_float(0.0, 1.0, open_lo=True)(n["bn_eps"], "network.bn_eps"),
            layer_nums=_seq(_int(0, 64), 1, 8)(n["layer_nums"], "network.layer_nums"),
            layer_strides=_seq(_int(1, 8), 1, 8)(n["layer_strides"], "network.layer_strides"),
            block_channels=_seq(_CHANNELS, 1, 8)(n["block_channels"], "network.block_channels"),
            upsample_strides=_seq(_upsample_stride, 1, 8)(n["upsample_strides"], "network.upsample_strides"),
            upsample_channels=_seq(_CHANNELS, 1, 8)(n["upsample_channels"], "network.upsample_channels"),
        ),
        anchors=AnchorConfig(
            classes=_seq(_anchor_class, 1, MAX_CLASSES)(a["classes"], "anchors.classes"),
            rotations=_seq(_ANGLE, 1, 16)(a["rotations"], "anchors.rotations"),
            alignment=_choice(get_args(AnchorAlignment))(a["alignment"], "anchors.alignment"),
            stride=_int(1, 64)(a["stride"], "anchors.stride"),
        ),
        box_coder=_choice(get_args(BoxCoderStyle))(coder, coder_path),
        direction=_optional(_direction)(top["direction"], "direction"),
        box_code=_box_code(top.get("box_code", _ADDED_DEFAULTS["box_code"]), "box_code"),
        heads=_optional(_heads)(top.get("heads"), "heads"),
        legacy_label_base=_int(0, 1)(top.get("label_base", 0), "label_base"),
        postprocess=PostProcessConfig(
            nms=_choice(get_args(NmsStyle))(p["nms"], "postprocess.nms"),
            score_inclusive=_bool(p["score_inclusive"], "postprocess.score_inclusive"),
            pre_nms_top_k=_TOP_K(p["pre_nms_top_k"], "postprocess.pre_nms_top_k"),
            output_range=_optional(_RANGE6)(p.get("output_range"), "postprocess.output_range"),  # type: ignore[arg-type]
            **{key: rule(p[key], f"postprocess.{key}") for key, rule in _THRESHOLD_RULES.items()},
        ),
    )


def _direction(value: Any, path: str) -> DirectionConfig:
    d = _fields(value, path, ("num_bins", "offset", "limit_offset", "flip_bin"))
    num_bins = _int(2, 2)(d["num_bins"], f"{path}.num_bins")  # both families, both backends: 2 bins
    return DirectionConfig(
        num_bins=num_bins,
        offset=_ANGLE(d["offset"], f"{path}.offset"),
        limit_offset=_UNIT(d["limit_offset"], f"{path}.limit_offset"),
        flip_bin=_int(0, num_bins - 1)(d["flip_bin"], f"{path}.flip_bin"),
    )


def _box_code(value: Any, path: str) -> BoxCodeConfig:
    b = _fields(value, path, ("angle", "velocity"))
    return BoxCodeConfig(angle=_choice(get_args(AngleCode))(b["angle"], f"{path}.angle"),
                         velocity=_bool(b["velocity"], f"{path}.velocity"))


def _heads(value: Any, path: str) -> HeadsConfig:
    h = _fields(value, path, ("groups", "shared_channels", "middle_channels", "middle_bn_eps"))
    return HeadsConfig(
        groups=_seq(_seq(_name, 1, MAX_CLASSES), 1, MAX_CLASSES)(h["groups"], f"{path}.groups"),
        shared_channels=_CHANNELS(h["shared_channels"], f"{path}.shared_channels"),
        middle_channels=_CHANNELS(h["middle_channels"], f"{path}.middle_channels"),
        middle_bn_eps=_float(0.0, 1.0, open_lo=True)(h["middle_bn_eps"], f"{path}.middle_bn_eps"),
    )


def _upsample_stride(value: Any, path: str) -> int | float:
    """An integer upsampling factor 1..64 (a transposed conv), or 1/k for k in 2..8 (OpenPCDet's
    strided conv that downsamples by k): 0.5, 0.25, ..."""
    if type(value) is int and 1 <= value <= 64:
        return value
    if isinstance(value, float) and 0 < value < 1 and float(round(1 / value)) == 1 / value and 2 <= 1 / value <= 8:
        return value
    _bad(path, "an integer in 1..64 or 1/k for an integer k in 2..8 (e.g. 0.5)", value)


def _point_columns(value: Any, path: str) -> tuple[str, ...]:
    """x, y, z, intensity, then optional further columns, in ``POINT_COLUMN_NAMES`` order."""
    names = _seq(_choice(POINT_COLUMN_NAMES), 4, len(POINT_COLUMN_NAMES))(value, path)
    if names != POINT_COLUMN_NAMES[: len(names)]:
        _bad(path, "a prefix of " + ", ".join(POINT_COLUMN_NAMES) + " starting with x, y, z, intensity", value)
    return names


def _anchor_class(value: Any, path: str) -> AnchorClass:
    """``{class|name, size, bottom}``: YAML says ``class``, ``to_dict()`` says ``name``."""
    c = _fields(value, path, ("size", "bottom"), ("class", "name"))
    if ("class" in c) == ("name" in c):
        raise _Invalid(f"{path}: expected exactly one of the keys class, name")
    key = "class" if "class" in c else "name"
    return AnchorClass(_name(c[key], f"{path}.{key}"), _seq(_LENGTH, 3)(c["size"], f"{path}.size"),  # type: ignore[arg-type]
                       _COORDINATE(c["bottom"], f"{path}.bottom"))


def _check_heads(cfg: ModelConfig) -> None:
    """A multi-head model: its heads cover the classes once each, in the classes' order (anchors
    are laid out class by class and boxes head by head, so the two orders must agree), the
    per-class NMS inside each head goes with it, and its boxes decode as OpenPCDet's (the only
    coder of multi-head checkpoints; the GPU's multi-head post-process has no other)."""
    if (cfg.heads is None) != (cfg.postprocess.nms != "multi_classes"):
        raise _Invalid("postprocess.nms: multi_classes (per-class NMS inside each head) goes with heads, and "
                       "heads with multi_classes")
    if cfg.heads is None:
        fractional = [i for i, s in enumerate(cfg.network.upsample_strides) if s < 1]
        if fractional:
            raise _Invalid(f"network.upsample_strides[{fractional[0]}]: a stride below 1 (a strided conv) is supported "
                           "in multi-head models only")
        if cfg.direction is None:
            raise _Invalid("direction: single-head models need a direction classifier")
        if cfg.box_code != BoxCodeConfig():
            raise _Invalid("box_code: sin/cos headings and velocities are supported in multi-head models only")
        return
    if cfg.box_coder != "openpcdet":
        raise _Invalid(f"box_coder: multi-head models decode boxes as OpenPCDet does (box_coder: openpcdet); got "
                       f"{cfg.box_coder}")
    flat = [name for group in cfg.heads.groups for name in group]
    if flat != list(cfg.classes):
        raise _Invalid(f"heads.groups: the heads' classes, in order, must be the classes; got "
                       f"{_order_difference(flat, cfg.classes)}")
    names = [k.name for k in cfg.anchors.classes]
    if names != list(cfg.classes):
        raise _Invalid(f"anchors.classes: a multi-head model lists one anchor per class in the classes' order; got "
                       f"{_order_difference(names, cfg.classes)}")


def _order_difference(names: Sequence[str], classes: Sequence[str]) -> str:
    """Where ``names`` first differ from the classes, for a message: ten nuScenes classes cut short for a
    line hid a swap of the last two."""
    for i, (name, cls) in enumerate(zip(names, classes)):
        if name != cls:
            return f"{safe_repr(name, 40)} at position {i}, where the classes have {safe_repr(cls, 40)}"
    return f"{len(names)} for {counted(len(classes), 'class', 'classes')}"


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n`` <= 1): sort widths, buffer capacities."""
    return 1 << max(0, n - 1).bit_length()


def _check(cfg: ModelConfig) -> None:
    """Rules between fields: the grid, the network's shapes, the anchors and the kernels' capacities."""
    v, net = cfg.voxel, cfg.network
    for i, axis in enumerate("xyz"):
        lo, hi = v.point_range[i], v.point_range[i + 3]
        if not lo < hi:
            raise _Invalid(f"voxel.point_range: min {axis} {lo:g} is not below max {axis} {hi:g}")
        extent = (hi - lo) / v.pillar_size[i]
        if extent > MAX_GRID_CELLS or not math.isclose(extent, round(extent), abs_tol=1e-4):
            raise _Invalid(f"voxel.pillar_size: the range along {axis} is not a whole number of pillars ({extent:g})")
    nx, ny, nz = v.grid
    if nz != 1:
        raise _Invalid(f"voxel.pillar_size: pillars need exactly one voxel along z, got {nz}")
    cells = nx * ny
    widest = max(net.pfn_channels, *net.block_channels, *net.upsample_channels, net.head_in_channels,
                 *cfg.head_channels.values())
    if cells > MAX_GRID_CELLS or cells * widest >= INDEX_LIMIT:
        raise _Invalid(f"voxel.pillar_size: a {nx} x {ny} grid is too large: the kernels index at most "
                       f"{MAX_GRID_CELLS} cells and {INDEX_LIMIT} elements per tensor ({widest} channels)")
    m, c = v.max_points_per_pillar, cfg.features.channels
    if v.max_pillars * m * c >= INDEX_LIMIT:
        raise _Invalid(f"voxel.max_pillars: {v.max_pillars} pillars x {m} points x {c} features reach "
                       f"{INDEX_LIMIT} elements")
    lens = {len(net.layer_nums), len(net.layer_strides), len(net.block_channels),
            len(net.upsample_strides), len(net.upsample_channels)}
    if len(lens) != 1:
        raise _Invalid("network: layer_nums, layer_strides, block_channels, upsample_strides and "
                       "upsample_channels differ in length")
    stride = cfg.anchors.stride
    cumulative = 1
    for i, (down, up) in enumerate(zip(net.layer_strides, net.upsample_strides)):
        cumulative *= down
        if cumulative != stride * up or nx % cumulative or ny % cumulative:
            raise _Invalid(f"network.upsample_strides[{i}]: block {i} maps the {nx} x {ny} grid by 1/{cumulative} "
                           f"(a divisor of both sides) and up by {up}; the head map needs anchors.stride {stride}")
    if min(cfg.head_map) < 2:
        raise _Invalid(f"anchors.stride: the head map {cfg.head_map[0]} x {cfg.head_map[1]} needs 2 cells per side")
    order = cfg.features.order
    repeated = [name for name in sorted(set(order), key=order.index)
                if order.count(name) > 1 and name not in _REPEATABLE_FEATURES[cfg.family]]
    if repeated:
        raise _Invalid(f"features.order: {', '.join(repeated)} listed more than once in {safe_repr(list(order), 60)}; "
                       "each entry is one input channel of the pillar net: did you mean another feature?")
    raw = [name for name in order if name in POINT_COLUMN_NAMES]
    missing = [name for name in raw if name not in cfg.point_columns]
    if missing:
        raise _Invalid(f"features.order: {', '.join(missing)} is not a point column "
                       f"(point_columns: {', '.join(cfg.point_columns)})")
    _check_heads(cfg)
    if len(set(cfg.classes)) != len(cfg.classes):
        raise _Invalid(f"classes: names repeat in {safe_repr(list(cfg.classes), 60)}")
    names = [k.name for k in cfg.anchors.classes]
    if sorted(names) != sorted(cfg.classes):
        raise _Invalid(f"anchors.classes: names {safe_repr(names, 60)} do not match classes {safe_repr(list(cfg.classes), 60)}")
    pp = cfg.postprocess
    kept = cfg.num_classes * pp.pre_nms_top_k  # per class: what the final cut may sort
    if pp.nms == "per_class" and next_power_of_two(kept) > SORT_LIMIT:
        raise _Invalid(f"postprocess.pre_nms_top_k: per-class NMS sorts up to classes x pre_nms_top_k = "
                       f"{cfg.num_classes} x {pp.pre_nms_top_k} boxes (padded to a power of 2) in one "
                       f"block of {SORT_LIMIT} keys")
    if pp.output_range is not None and not all(pp.output_range[i] < pp.output_range[i + 3] for i in range(3)):
        raise _Invalid("postprocess.output_range: each min must be below its max")
