"""Model configs: the single source of every number the export, the engines and the kernels use.

A config is a YAML file under ``pointpillars_trt/configs`` (or any path). It is parsed once into
frozen dataclasses; derived sizes (grid, head map, anchor count) are properties, never stored twice.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import ConfigError

FEATURE_NAMES = (
    "x", "y", "z", "intensity",
    "mean_dx", "mean_dy", "mean_dz",
    "center_dx", "center_dy", "center_dz",
)
RangeFilter = Literal["inclusive_xy", "strict_xyz"]
AnchorAlignment = Literal["range_corners", "cell_centers"]
BoxCoderStyle = Literal["openpcdet", "zhulf0804"]
NmsStyle = Literal["class_agnostic", "per_class"]


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
    upsample_strides: tuple[int, ...]
    upsample_channels: tuple[int, ...]

    @property
    def head_in_channels(self) -> int:
        return sum(self.upsample_channels)


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
    label_base: int
    voxel: VoxelConfig
    features: FeatureConfig
    network: NetworkConfig
    anchors: AnchorConfig
    box_coder: BoxCoderStyle
    direction: DirectionConfig
    postprocess: PostProcessConfig

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
        """Channels of the three head maps (class, box, direction)."""
        a = self.anchors.per_cell
        return {"cls": a * self.num_classes, "box": a * 7, "dir": a * self.direction.num_bins}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        """A stable hash of every number in the config; model dirs and plans record it."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def builtin_config_names() -> list[str]:
    folder = resources.files("pointpillars_trt") / "configs"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_config(name_or_path: str | Path) -> ModelConfig:
    """Load a built-in config by name (``openpcdet_kitti_3class``) or a YAML file by path."""
    text, source = _read_config_text(name_or_path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({exc})") from None
    return config_from_dict(raw, source)


def _read_config_text(name_or_path: str | Path) -> tuple[str, str]:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            return path.read_text(), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the config ({exc})") from None
    name = str(name_or_path)
    if name not in builtin_config_names():
        raise ConfigError(
            f"unknown config {name!r}: expected a YAML path or one of {builtin_config_names()}"
        )
    return (resources.files("pointpillars_trt") / "configs" / f"{name}.yaml").read_text(), name


def config_from_dict(raw: Any, source: str = "<dict>") -> ModelConfig:
    """Build and validate a config; every error names the source and the offending key.

    Accepts the YAML spelling and ``ModelConfig.to_dict()``'s, so a model dir can store and rebuild a config.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        cfg = _build(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: missing or malformed key {exc}") from None
    _validate(cfg, source)
    return cfg


def _floats(values: Any, n: int | None = None) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if n is not None and len(out) != n:
        raise ValueError(f"expected {n} numbers, got {len(out)}")
    return out


def _build(raw: dict[str, Any]) -> ModelConfig:
    v, f, n, a, d, p = (raw[k] for k in ("voxel", "features", "network", "anchors", "direction", "postprocess"))
    ints = lambda xs: tuple(int(x) for x in xs)  # noqa: E731
    return ModelConfig(
        name=str(raw["name"]),
        family=str(raw["family"]),
        classes=tuple(str(c) for c in raw["classes"]),
        label_base=int(raw.get("label_base", 0)),
        voxel=VoxelConfig(
            point_range=_floats(v["point_range"], 6),  # type: ignore[arg-type]
            pillar_size=_floats(v["pillar_size"], 3),  # type: ignore[arg-type]
            max_points_per_pillar=int(v["max_points_per_pillar"]),
            max_pillars=int(v["max_pillars"]),
            range_filter=v["range_filter"],
        ),
        features=FeatureConfig(order=tuple(str(x) for x in f["order"])),
        network=NetworkConfig(
            pfn_channels=int(n["pfn_channels"]),
            bn_eps=float(n["bn_eps"]),
            layer_nums=ints(n["layer_nums"]),
            layer_strides=ints(n["layer_strides"]),
            block_channels=ints(n["block_channels"]),
            upsample_strides=ints(n["upsample_strides"]),
            upsample_channels=ints(n["upsample_channels"]),
        ),
        anchors=AnchorConfig(
            classes=tuple(
                AnchorClass(str(c["name" if "name" in c else "class"]), _floats(c["size"], 3), float(c["bottom"]))  # type: ignore[arg-type]
                for c in a["classes"]
            ),
            rotations=_floats(a["rotations"]),
            alignment=a["alignment"],
            stride=int(a["stride"]),
        ),
        box_coder=raw["box_coder"]["style"] if isinstance(raw["box_coder"], dict) else raw["box_coder"],
        direction=DirectionConfig(
            num_bins=int(d["num_bins"]),
            offset=float(d["offset"]),
            limit_offset=float(d["limit_offset"]),
            flip_bin=int(d["flip_bin"]),
        ),
        postprocess=PostProcessConfig(
            nms=p["nms"],
            score_threshold=float(p["score_threshold"]),
            score_inclusive=bool(p["score_inclusive"]),
            pre_nms_top_k=int(p["pre_nms_top_k"]),
            nms_iou=float(p["nms_iou"]),
            max_boxes=int(p["max_boxes"]),
            output_range=None if p.get("output_range") is None else _floats(p["output_range"], 6),  # type: ignore[arg-type]
        ),
    )


def _validate(cfg: ModelConfig, source: str) -> None:
    def fail(msg: str) -> None:
        raise ConfigError(f"{source}: {msg}")

    v = cfg.voxel
    if min(v.pillar_size) <= 0:
        fail(f"voxel.pillar_size must be positive, got {list(v.pillar_size)}")
    if cfg.anchors.stride < 1:
        fail(f"anchors.stride must be at least 1, got {cfg.anchors.stride}")
    if v.range_filter not in ("inclusive_xy", "strict_xyz"):
        fail(f"voxel.range_filter is {v.range_filter!r}; expected inclusive_xy or strict_xyz")
    for i, axis in enumerate("xyz"):
        extent = (v.point_range[i + 3] - v.point_range[i]) / v.pillar_size[i]
        if v.pillar_size[i] <= 0 or extent < 1 or not math.isclose(extent, round(extent), abs_tol=1e-4):
            fail(f"voxel range along {axis} is not a whole number of pillars ({extent:g})")
    if v.grid[2] != 1:
        fail(f"pillars need exactly one voxel along z, got {v.grid[2]}")
    if v.max_points_per_pillar < 1 or v.max_pillars < 1:
        fail("voxel.max_points_per_pillar and voxel.max_pillars must be positive")
    unknown = [x for x in cfg.features.order if x not in FEATURE_NAMES]
    if unknown:
        fail(f"features.order has unknown names {unknown}; known: {list(FEATURE_NAMES)}")
    net = cfg.network
    lens = {len(net.layer_nums), len(net.layer_strides), len(net.block_channels),
            len(net.upsample_strides), len(net.upsample_channels)}
    if len(lens) != 1:
        fail("network lists (layer_nums, strides, channels, upsample_*) differ in length")
    names = [c.name for c in cfg.anchors.classes]
    if sorted(names) != sorted(cfg.classes):
        fail(f"anchors.classes {names} do not match classes {list(cfg.classes)}")
    if cfg.anchors.alignment not in ("range_corners", "cell_centers"):
        fail(f"anchors.alignment is {cfg.anchors.alignment!r}")
    if cfg.box_coder not in ("openpcdet", "zhulf0804"):
        fail(f"box_coder.style is {cfg.box_coder!r}; expected openpcdet or zhulf0804")
    if cfg.postprocess.nms not in ("class_agnostic", "per_class"):
        fail(f"postprocess.nms is {cfg.postprocess.nms!r}; expected class_agnostic or per_class")
    nx, ny, _ = v.grid
    if nx % cfg.anchors.stride or ny % cfg.anchors.stride:
        fail(f"grid {nx}x{ny} is not divisible by the anchor stride {cfg.anchors.stride}")
