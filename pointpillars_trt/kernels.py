"""The CUDA stages of the GPU pipeline: voxelize, PFN, scatter and post-process, launched through CuPy.

Each stage is one ``kernels/*.cu`` file and one small class. The class turns the model config into a
frozen parameter dataclass, compiles the file once per distinct parameter set (``-D`` defines; no
number is hard-coded in the CUDA sources), fetches its kernels by their declared names, allocates
every buffer it needs from the configured maxima, and then only enqueues kernels in ``launch``.
Counts (points, pillars, candidates, boxes) stay in device memory and kernels read them there, so a
frame needs no host synchronisation and can be captured in a CUDA graph.

CuPy is imported lazily: the package imports, and the CPU path runs, without it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from .config import FEATURE_NAMES, ModelConfig
from .errors import BackendError, ConfigError, InputError

COMPILE_OPTIONS = ("-std=c++17", "--fmad=false")  # no contraction: float32 steps round as NumPy's do
_HEADER = "common.cuh"

# Slots of the voxelizer's device counters (int32); the last two are its own bookkeeping.
VOXEL_STATS = (
    "pillars", "pillars_total", "pillars_dropped", "nonfinite", "in_range", "previous_pillars", "cursor",
)
POST_STATS = ("candidates", "selected")
OUTPUT_ROW = 9  # x, y, z_centre, dx, dy, dz, heading, score, label
# Row 0 of the post-processing result: its own counts, then the first voxelizer counts, as float32
# (exact below 2**24), so that one device-to-host copy brings back everything a frame reports.
_POST_HEADER = ("count", "candidates", "selected")
RESULT_HEADER = _POST_HEADER + VOXEL_STATS[: OUTPUT_ROW - len(_POST_HEADER)]

_SCAN_BLOCK = 512  # threads of the voxelizer's per-point kernels (its scans are per block)
_SCORE_BLOCK = 256  # threads of the per-anchor kernels
_NMS_COLUMN_SPLIT = 4  # threads per row of a 64x64 IoU tile (pp_nms_mask runs 64 * this per block)
_SORT_LIMIT = 4096  # keys of one in-block bitonic sort (32 KB of shared memory)


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise BackendError(
            "CuPy is not installed: the GPU stages need it (pip install 'pointpillars-trt[cuda13]' or [cuda12])"
        ) from exc
    return cupy


@contextmanager
def _checked(what: str) -> Iterator[None]:
    """Turn CuPy's CUDA and compiler exceptions into BackendError naming the stage and the CUDA error."""
    cp = _cupy()
    try:
        yield
    except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as exc:
        raise BackendError(f"{what}: CUDA error {exc}") from exc
    except cp.cuda.compiler.CompileException as exc:
        raise BackendError(f"{what}: kernel compilation failed:\n{exc}") from exc


def kernel_source(file: str) -> str:
    """The CUDA source of ``kernels/<file>`` with the shared header pasted in place of its #include.

    Pasting (rather than an include path) puts the whole text in CuPy's kernel-cache key.
    """
    folder = resources.files("pointpillars_trt") / "kernels"
    header = (folder / _HEADER).read_text()
    text = (folder / file).read_text()
    return text.replace(f'#include "{_HEADER}"', header)


@functools.lru_cache(maxsize=None)
def _module(file: str, defines: tuple[str, ...]) -> Any:
    return _cupy().RawModule(code=kernel_source(file), options=COMPILE_OPTIONS + defines)


def _kernels(file: str, defines: tuple[str, ...], names: tuple[str, ...]) -> dict[str, Any]:
    """Compile ``file`` once per define set and fetch every declared kernel up front."""
    with _checked(file):
        module = _module(file, defines)
        return {name: module.get_function(name) for name in names}


def _launch(kernel: Any, grid: int | tuple[int, ...], block: int, args: tuple[Any, ...], stream: Any) -> None:
    """Enqueue one kernel on ``stream``; a launch the driver refuses raises BackendError."""
    grid = grid if isinstance(grid, tuple) else (grid,)
    with _checked(kernel.name):
        kernel(grid, (block,), args, stream=stream)


def _f32(value: float) -> str:
    """A float32 literal for a -D option, exact (hexadecimal) and parenthesised."""
    return f"({float(np.float32(value)).hex()}f)"


def _defines(**values: int | str) -> tuple[str, ...]:
    return tuple(f"-D{name}={value}" for name, value in values.items())


def _slots(prefix: str, names: tuple[str, ...]) -> dict[str, int]:
    return {f"{prefix}_{name.upper()}": i for i, name in enumerate(names)}


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _blocks(n: int, block: int) -> int:
    return max(1, -(-n // block))


def _device_array(arr: Any, name: str, dtype: Any, shape: tuple[int | None, ...]) -> None:
    """Check a device buffer without touching its data: CuPy array, dtype, shape, C order."""
    cp = _cupy()
    if not isinstance(arr, cp.ndarray):
        raise InputError(f"{name}: expected a CuPy device array, received {type(arr).__name__}")
    ok_shape = arr.ndim == len(shape) and all(want is None or got == want for got, want in zip(arr.shape, shape))
    if arr.dtype != dtype or not ok_shape or not arr.flags.c_contiguous:
        want = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"
        raise InputError(
            f"{name}: received {arr.dtype} array of shape {arr.shape}"
            f"{'' if arr.flags.c_contiguous else ' (not C-contiguous)'}; expected C-contiguous "
            f"{np.dtype(dtype).name} of shape {want}"
        )


def _device_count(arr: Any, name: str) -> None:
    _device_array(arr, name, np.int32, (None,))
    if arr.shape[0] < 1:
        raise InputError(f"{name}: expected a device int32 count (at least one element), received an empty array")


# --------------------------------------------------------------------------- voxelize


@dataclass(frozen=True)
class VoxelParams:
    """Everything voxelize.cu is compiled with, float values already rounded to float32."""

    grid: tuple[int, int, int]
    max_pillars: int
    max_points_per_pillar: int
    features: tuple[str, ...]
    strict_range: bool
    range_min: tuple[float, ...]
    range_max: tuple[float, ...]
    pillar_size: tuple[float, ...]
    centre_offset: tuple[float, ...]

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> VoxelParams:
        if cfg.features.channels > 16:
            raise ConfigError(f"{cfg.name}: {cfg.features.channels} feature channels; the GPU voxelizer supports 16")
        v = cfg.voxel
        f32 = lambda xs: tuple(float(np.float32(x)) for x in xs)  # noqa: E731
        return cls(
            grid=v.grid,
            max_pillars=v.max_pillars,
            max_points_per_pillar=v.max_points_per_pillar,
            features=cfg.features.order,
            strict_range=v.range_filter == "strict_xyz",
            range_min=f32(v.point_range[:3]),
            range_max=f32(v.point_range[3:]),
            pillar_size=f32(v.pillar_size),
            # The families add float32(size / 2 + min), rounded once from double.
            centre_offset=f32(s / 2 + lo for s, lo in zip(v.pillar_size, v.point_range[:3])),
        )

    @property
    def num_cells(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def defines(self) -> tuple[str, ...]:
        floats: dict[str, int | str] = {}
        for i, axis in enumerate("XYZ"):
            floats[f"RANGE_MIN_{axis}"] = _f32(self.range_min[i])
            floats[f"RANGE_MAX_{axis}"] = _f32(self.range_max[i])
            floats[f"PILLAR_{axis}"] = _f32(self.pillar_size[i])
            floats[f"CENTER_OFFSET_{axis}"] = _f32(self.centre_offset[i])
        # 4 bits per channel, channel 0 lowest: one integer, since nvcc splits -D values at commas.
        codes = sum(FEATURE_NAMES.index(name) << (4 * i) for i, name in enumerate(self.features))
        return _defines(
            NX=self.grid[0], NY=self.grid[1], NZ=self.grid[2], MAX_PILLARS=self.max_pillars,
            MAX_PTS=self.max_points_per_pillar, NUM_FEATURES=len(self.features), FEATURE_CODES=f"{codes:#x}ull",
            RANGE_STRICT=int(self.strict_range), GATHER_WARPS=VoxelizeStage.GATHER_WARPS,
            **floats, **_slots("STAT", VOXEL_STATS), **_slots("FEATURE", FEATURE_NAMES),
        )


class VoxelizeStage:
    """Points on the device -> decorated pillars, deterministically (``reference.voxelize``).

    ``max_points`` is the point capacity the scratch is sized for (a runtime value: a new capacity
    reuses the compiled kernels). Outputs, owned here and rewritten by every ``launch``:
    ``features`` (max_pillars, M, C) float32 with every row past the pillar count zero; ``coords``
    (max_pillars, 4) int32 (0, iz, iy, ix); ``num_points`` (max_pillars,) int32; ``stats`` the
    device counters named by ``VOXEL_STATS``; ``num_pillars`` a one-element view of the pillar count.
    """

    KERNELS = ("vox_classify", "vox_count", "vox_offsets", "vox_number", "vox_rank", "vox_gather")
    GATHER_WARPS = 8  # pillars per vox_gather block, one warp each (compiled in as -DGATHER_WARPS)

    def __init__(self, cfg: ModelConfig, max_points: int) -> None:
        if max_points < 1:
            raise ConfigError(f"max_points: expected a positive point capacity, received {max_points}")
        cp = _cupy()
        self.params = p = VoxelParams.from_config(cfg)
        self.max_points = int(max_points)
        self._k = _kernels("voxelize.cu", p.defines(), self.KERNELS)
        self._num_blocks = _blocks(self.max_points, _SCAN_BLOCK)
        m, c, pmax, cells = p.max_points_per_pillar, len(p.features), p.max_pillars, p.num_cells
        i32 = np.int32
        with _checked("voxelize: allocating buffers"):
            self.features = cp.zeros((pmax, m, c), np.float32)
            self.coords = cp.zeros((pmax, 4), i32)
            self.num_points = cp.zeros(pmax, i32)
            self.stats = cp.zeros(len(VOXEL_STATS), i32)
            self._point_cell = cp.zeros(self.max_points, i32)
            self._bucket = cp.zeros(self.max_points, i32)
            self._cell_first = cp.full(cells, np.iinfo(i32).max, i32)  # vox_rank restores these
            self._cell_count = cp.zeros(cells, i32)
            self._cell_fill = cp.zeros(cells, i32)
            self._cell_bucket = cp.zeros(cells, i32)
            self._cell_pillar = cp.zeros(cells, i32)
            self._block_counts = cp.zeros(self._num_blocks * 3, i32)
            self._pillar_bucket = cp.zeros(pmax, i32)
            self._pillar_total = cp.zeros(pmax, i32)
            self._slot_point = cp.zeros(pmax * m, i32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    @property
    def num_pillars(self) -> Any:
        """One-element int32 device view of this frame's pillar count."""
        return self.stats[0:1]

    def launch(self, points: Any, num_points: Any, stream: Any) -> None:
        """Enqueue one frame: the first ``num_points[0]`` rows (a device int32, clamped to the rows of
        ``points`` and to ``max_points``) of ``points``, an (rows, 4) float32 device buffer."""
        _device_array(points, "points", np.float32, (None, 4))
        _device_count(num_points, "num_points")
        if points.data.ptr % 16:
            raise InputError("points: the device buffer must be 16-byte aligned (rows are read as float4)")
        k = self._k
        rows = np.int32(min(points.shape[0], self.max_points))
        blocks = self._num_blocks
        _launch(k["vox_classify"], blocks, _SCAN_BLOCK,
                (points, num_points, rows, self._point_cell, self._cell_first, self._cell_count), stream)
        _launch(k["vox_count"], blocks, _SCAN_BLOCK,
                (num_points, rows, self._point_cell, self._cell_first, self._cell_count, self._cell_bucket,
                 self.stats, self._block_counts), stream)
        _launch(k["vox_offsets"], 1, 1024, (self._block_counts, np.int32(blocks), self.stats), stream)
        _launch(k["vox_number"], blocks, _SCAN_BLOCK,
                (num_points, rows, self._point_cell, self._cell_first, self._cell_count, self._cell_bucket,
                 self._block_counts, self._cell_fill, self._cell_pillar, self._bucket, self._pillar_bucket,
                 self._pillar_total, self.coords, self.num_points), stream)
        _launch(k["vox_rank"], blocks, _SCAN_BLOCK,
                (num_points, rows, self._point_cell, self._cell_pillar, self._bucket, self._pillar_bucket,
                 self._pillar_total, self._cell_first, self._cell_count, self._cell_fill, self._slot_point),
                stream)
        _launch(k["vox_gather"], _blocks(self.params.max_pillars, self.GATHER_WARPS), self.GATHER_WARPS * 32,
                (points, self._slot_point, self.stats, self.coords, self.num_points, self.features), stream)


# --------------------------------------------------------------------------- scatter


@dataclass(frozen=True)
class ScatterParams:
    """Everything scatter.cu is compiled with."""

    nx: int
    ny: int
    channels: int
    max_pillars: int

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> ScatterParams:
        nx, ny, _ = cfg.voxel.grid
        return cls(nx=nx, ny=ny, channels=cfg.network.pfn_channels, max_pillars=cfg.voxel.max_pillars)

    def defines(self) -> tuple[str, ...]:
        return _defines(NX=self.nx, NY=self.ny, CHANNELS=self.channels, MAX_PILLARS=self.max_pillars)


class ScatterStage:
    """Pillar features (max_pillars, C) -> BEV canvas (1, C, ny, nx) float32 (``reference.scatter``).

    ``canvas`` is owned here. Each launch first zeroes the cells the previous launch wrote (this
    stage remembers them), then writes the first ``num_pillars[0]`` pillars at their coords.
    """

    KERNELS = ("scatter_clear", "scatter_write")
    _BLOCK = 256

    def __init__(self, cfg: ModelConfig) -> None:
        cp = _cupy()
        self.params = p = ScatterParams.from_config(cfg)
        self._k = _kernels("scatter.cu", p.defines(), self.KERNELS)
        with _checked("scatter: allocating buffers"):
            self.canvas = cp.zeros((1, p.channels, p.ny, p.nx), np.float32)
            self._written_cells = cp.zeros(p.max_pillars, np.int32)
            self._written_count = cp.zeros(1, np.int32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, pillar_features: Any, coords: Any, num_pillars: Any, stream: Any) -> None:
        """Enqueue: ``pillar_features`` (max_pillars, C) float32, ``coords`` (max_pillars, 4) int32 as
        the voxelizer writes them, ``num_pillars`` a device int32 count."""
        p = self.params
        _device_array(pillar_features, "pillar_features", np.float32, (p.max_pillars, p.channels))
        _device_array(coords, "coords", np.int32, (p.max_pillars, 4))
        _device_count(num_pillars, "num_pillars")
        grid = _blocks(p.max_pillars * p.channels, self._BLOCK)
        _launch(self._k["scatter_clear"], grid, self._BLOCK,
                (self._written_cells, self._written_count, self.canvas), stream)
        _launch(self._k["scatter_write"], grid, self._BLOCK,
                (pillar_features, coords, num_pillars, self._written_cells, self._written_count, self.canvas),
                stream)


# --------------------------------------------------------------------------- post-process


@dataclass(frozen=True)
class PostParams:
    """Everything postprocess.cu is compiled with, float values already rounded to float32."""

    head_map: tuple[int, int]  # (W, H)
    anchors_per_cell: int
    num_classes: int
    dir_bins: int
    openpcdet_style: bool
    per_class: bool
    score_inclusive: bool
    score_threshold: float
    top_k: int
    nms_iou: float
    nms_margin: float
    max_boxes: int
    dir_offset: float
    dir_limit_offset: float
    dir_flip_bin: int
    output_range: tuple[float, ...] | None

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> PostParams:
        from .reference.post import NMS_CORNER_MARGIN  # one table for the NumPy and CUDA geometry

        pp, d = cfg.postprocess, cfg.direction
        f32 = lambda x: float(np.float32(x))  # noqa: E731
        params = cls(
            head_map=cfg.head_map,
            anchors_per_cell=cfg.anchors.per_cell,
            num_classes=cfg.num_classes,
            dir_bins=d.num_bins,
            openpcdet_style=cfg.box_coder == "openpcdet",
            per_class=pp.nms == "per_class",
            score_inclusive=pp.score_inclusive,
            score_threshold=f32(pp.score_threshold),
            top_k=pp.pre_nms_top_k,
            nms_iou=f32(pp.nms_iou),
            nms_margin=f32(NMS_CORNER_MARGIN[cfg.box_coder]),
            max_boxes=pp.max_boxes,
            dir_offset=f32(d.offset),
            dir_limit_offset=f32(d.limit_offset),
            dir_flip_bin=d.flip_bin,
            output_range=None if pp.output_range is None else tuple(f32(x) for x in pp.output_range),
        )
        params._validate(cfg.name)
        return params

    @property
    def groups(self) -> int:
        """NMS groups: one class-agnostic group, or one per class."""
        return self.num_classes if self.per_class else 1

    @property
    def sort_cap(self) -> int:
        return max(64, _pow2(self.top_k))

    @property
    def final_cap(self) -> int:
        return _pow2(self.num_classes * self.top_k) if self.per_class else 1

    @property
    def num_anchors(self) -> int:
        return self.head_map[0] * self.head_map[1] * self.anchors_per_cell

    def _validate(self, source: str) -> None:
        def fail(msg: str) -> None:
            raise ConfigError(f"{source}: {msg} (GPU post-processing)")

        if self.dir_bins != 2 or self.dir_flip_bin not in (0, 1):
            fail(f"direction needs 2 bins and flip_bin 0 or 1, got {self.dir_bins} bins, flip_bin {self.dir_flip_bin}")
        if not 1 <= self.top_k <= _SORT_LIMIT:
            fail(f"postprocess.pre_nms_top_k is {self.top_k}; supported: 1..{_SORT_LIMIT}")
        if self.per_class and self.final_cap > _SORT_LIMIT:
            fail(f"per-class NMS supports classes * pre_nms_top_k <= {_SORT_LIMIT}, got {self.num_classes * self.top_k}")
        if self.max_boxes < 1:
            fail(f"postprocess.max_boxes is {self.max_boxes}; expected at least 1")

    def defines(self) -> tuple[str, ...]:
        floats: dict[str, int | str] = {}
        if self.output_range is not None:
            for i, axis in enumerate("XYZ"):
                floats[f"OUT_MIN_{axis}"] = _f32(self.output_range[i])
                floats[f"OUT_MAX_{axis}"] = _f32(self.output_range[i + 3])
        return _defines(
            HEAD_W=self.head_map[0], HEAD_H=self.head_map[1], ANCHORS_PER_CELL=self.anchors_per_cell,
            NUM_CLASSES=self.num_classes, DIR_BINS=self.dir_bins, STYLE_OPENPCDET=int(self.openpcdet_style),
            PER_CLASS=int(self.per_class), SCORE_INCLUSIVE=int(self.score_inclusive),
            SCORE_THRESHOLD=_f32(self.score_threshold), TOP_K=self.top_k, SORT_CAP=self.sort_cap,
            FINAL_CAP=self.final_cap, NMS_IOU=_f32(self.nms_iou), NMS_MARGIN=_f32(self.nms_margin),
            MAX_BOXES=self.max_boxes, DIR_OFFSET=_f32(self.dir_offset),
            DIR_LIMIT_OFFSET=_f32(self.dir_limit_offset), DIR_FLIP_BIN=self.dir_flip_bin,
            DIR_PERIOD=_f32(np.pi), HAS_OUTPUT_RANGE=int(self.output_range is not None),
            SCORE_BLOCK=_SCORE_BLOCK, NMS_COLUMN_SPLIT=_NMS_COLUMN_SPLIT, HEADER_EXTRA=len(_POST_HEADER),
            **floats, **_slots("STAT", POST_STATS), **_slots("HEADER", _POST_HEADER),
        )


class PostprocessStage:
    """Head maps (NCHW) -> detections (``reference.postprocess``) in one small device buffer.

    ``result`` (max_boxes + 1, 9) float32 is owned here: row 0 holds the counts named by
    ``RESULT_HEADER`` (this stage's, then the voxelizer's), rows 1..count the boxes as [x, y,
    z_centre, dx, dy, dz, heading, score, label] in OpenPCDet's convention, in the family's output
    order. Copy it to the host once per frame and read it with ``unpack``.
    """

    KERNELS = ("pp_score", "pp_offsets", "pp_compact", "pp_select", "pp_group", "pp_nms_mask", "pp_nms_reduce")

    def __init__(self, cfg: ModelConfig) -> None:
        from .reference.post import anchors  # the package's one anchor table (config-derived constants)

        cp = _cupy()
        self.params = p = PostParams.from_config(cfg)
        self._k = _kernels("postprocess.cu", p.defines(), self.KERNELS)
        w, h = p.head_map
        a = p.anchors_per_cell
        self._shapes = {"cls": (1, a * p.num_classes, h, w), "box": (1, a * 7, h, w), "dir": (1, a * p.dir_bins, h, w)}
        na, slots = p.num_anchors, p.groups * p.sort_cap
        with _checked("postprocess: allocating buffers"):
            self.result = cp.zeros((p.max_boxes + 1, OUTPUT_ROW), np.float32)
            self.stats = cp.zeros(len(POST_STATS), np.int32)
            self._anchors = cp.asarray(np.ascontiguousarray(anchors(cfg), np.float32))
            self._key = cp.zeros(na, np.uint32)
            self._block_counts = cp.zeros(_blocks(na, _SCORE_BLOCK), np.int32)
            self._cand_key = cp.zeros(na, np.uint32)
            self._cand_anchor = cp.zeros(na, np.int32)
            self._sel_anchor = cp.zeros(p.sort_cap, np.int32)
            self._sel_score = cp.zeros(p.sort_cap, np.float32)
            self._group_count = cp.zeros(p.groups, np.int32)
            self._group_box = cp.zeros((slots, 7), np.float32)
            self._group_rect = cp.zeros((slots, 6), np.float32)
            self._group_score = cp.zeros(slots, np.float32)
            self._group_label = cp.zeros(slots, np.int32)
            self._group_dir = cp.zeros(slots, np.int32)
            self._mask = cp.zeros(slots * (p.sort_cap // 64), np.uint64)
            self._kept = cp.zeros(slots, np.int32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, cls: Any, box: Any, dir: Any, voxel_stats: Any, stream: Any) -> None:
        """Enqueue: the three NCHW float32 head maps -> ``result``. ``voxel_stats`` (the voxelizer's
        ``stats``, or any device int32 array) is copied into the header of ``result``."""
        for name, arr in (("cls", cls), ("box", box), ("dir", dir)):
            _device_array(arr, f"head map {name}", np.float32, self._shapes[name])
        _device_count(voxel_stats, "voxel_stats")
        p, k = self.params, self._k
        num_extra = np.int32(min(voxel_stats.shape[0], OUTPUT_ROW - len(_POST_HEADER)))
        score_blocks = _blocks(p.num_anchors, _SCORE_BLOCK)
        tiles = p.sort_cap // 64
        _launch(k["pp_score"], score_blocks, _SCORE_BLOCK, (cls, self._key, self._block_counts), stream)
        _launch(k["pp_offsets"], 1, 1024, (self._block_counts, self.stats), stream)
        _launch(k["pp_compact"], score_blocks, _SCORE_BLOCK,
                (self._key, self._block_counts, self._cand_key, self._cand_anchor), stream)
        _launch(k["pp_select"], 1, 1024,
                (self._cand_key, self._cand_anchor, self.stats, self._sel_anchor, self._sel_score), stream)
        group_grid, group_block = (p.groups, min(1024, p.sort_cap)) if p.per_class else (_blocks(p.sort_cap, 256), 256)
        _launch(k["pp_group"], group_grid, group_block,
                (cls, box, dir, self._anchors, self._sel_anchor, self._sel_score, self.stats, self._group_count,
                 self._group_box, self._group_rect, self._group_score, self._group_label, self._group_dir), stream)
        _launch(k["pp_nms_mask"], (tiles, tiles, p.groups), 64 * _NMS_COLUMN_SPLIT,
                (self._group_count, self._group_rect, self._mask), stream)
        _launch(k["pp_nms_reduce"], 1, 256,
                (self._group_count, self._mask, self._group_box, self._group_score, self._group_label,
                 self._group_dir, self.stats, voxel_stats, num_extra, self._kept, self.result), stream)

    @staticmethod
    def unpack(result: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
        """A host copy of ``result`` -> boxes (n, 7) float32, scores (n,) float32, labels (n,) int32
        (0-based into cfg.classes) and the counts of ``RESULT_HEADER`` by name."""
        out = np.asarray(result, np.float32)
        counts = {name: int(v) for name, v in zip(RESULT_HEADER, out[0].tolist())}
        rows = out[1 : 1 + counts["count"]]
        # copies, never views: the caller's pinned result buffer is rewritten by the next frame
        return rows[:, :7].copy(), rows[:, 7].copy(), rows[:, 8].astype(np.int32), counts


# --------------------------------------------------------------------------- pillar feature net


@dataclass(frozen=True)
class PfnParams:
    """Everything pfn.cu is compiled with."""

    max_pillars: int
    max_points_per_pillar: int
    num_features: int
    out_channels: int

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> PfnParams:
        v = cfg.voxel
        return cls(v.max_pillars, v.max_points_per_pillar, cfg.features.channels, cfg.network.pfn_channels)

    def defines(self) -> tuple[str, ...]:
        return _defines(MAX_PILLARS=self.max_pillars, MAX_PTS=self.max_points_per_pillar,
                        NUM_FEATURES=self.num_features, OUT_CHANNELS=self.out_channels,
                        PILLARS_PER_BLOCK=PfnStage.PILLARS_PER_BLOCK)


class PfnStage:
    """Decorated pillars -> pillar features with the folded linear + ReLU + max of the PFN graph.

    The same function as ``pfn.onnx`` (its folded weight and bias are passed in), computed only for
    the live pillars: an engine with a fixed (max_pillars, M, C) input pays for every row. ``out`` is
    owned here; rows past the pillar count keep stale values, which scatter never reads.
    """

    KERNELS = ("pfn_forward",)
    PILLARS_PER_BLOCK = 4
    _BLOCKS_PER_SM = 8

    def __init__(self, cfg: ModelConfig, weight: np.ndarray, bias: np.ndarray) -> None:
        cp = _cupy()
        self.params = p = PfnParams.from_config(cfg)
        if weight.shape != (p.out_channels, p.num_features) or bias.shape != (p.out_channels,):
            raise ConfigError(
                f"PFN weight {weight.shape} / bias {bias.shape} do not fit the config: expected "
                f"({p.out_channels}, {p.num_features}) / ({p.out_channels},)"
            )
        self._k = _kernels("pfn.cu", p.defines(), self.KERNELS)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self._grid = min(_blocks(p.max_pillars, self.PILLARS_PER_BLOCK), sms * self._BLOCKS_PER_SM)
        with _checked("pfn: allocating buffers"):
            self._weight = cp.asarray(np.ascontiguousarray(weight, np.float32))
            self._bias = cp.asarray(np.ascontiguousarray(bias, np.float32))
            self.out = cp.zeros((p.max_pillars, p.out_channels), np.float32)
            cp.cuda.runtime.deviceSynchronize()

    def launch(self, pillars: Any, num_pillars: Any, stream: Any) -> None:
        p = self.params
        _device_array(pillars, "pillars", np.float32, (p.max_pillars, p.max_points_per_pillar, p.num_features))
        _device_count(num_pillars, "num_pillars")
        kernel = self._k["pfn_forward"]
        with _checked(kernel.name):
            kernel((self._grid,), (p.out_channels, self.PILLARS_PER_BLOCK),
                   (pillars, self._weight, self._bias, num_pillars, self.out), stream=stream)
