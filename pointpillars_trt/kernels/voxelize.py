"""Voxelize stage: points on the device -> decorated pillars, deterministically (``cuda/voxelize.cu``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import FEATURE_NAMES, ModelConfig
from ..errors import ConfigError, InputError
from ..kernel_limits import GATHER_WARPS, STATIC_SHARED_BYTES
from ._launch import (batch_grid, check_device_array, check_frames, checked, compile_kernels, cupy_module, define_flags,
                      f32_define, grid_blocks, launch_kernel, multiprocessors, shared_blocks, slot_defines)

# Slots of a frame's device counters (int32), those it reports first (a post-process result's header carries
# the first few); the voxelizer zeroes "overflowed_features" for the PFN to count into (``pfn.cu``); the last
# three are the voxelizer's own bookkeeping.
VOXEL_STATS = (
    "pillars", "pillars_dropped", "nonfinite", "overflowed_features", "pillars_total", "in_range", "previous_pillars",
    "cursor", "large_pillars",
)
GPU_POINT_COLUMNS = 4  # voxelize.cu reads each point as one float4: x, y, z, intensity (time lags apart)
_SCAN_BLOCK = 512  # threads of the voxelizer's per-point kernels (its scans are per block)


@dataclass(frozen=True)
class VoxelParams:
    """Everything voxelize.cu is compiled with, float values already rounded to float32."""

    grid: tuple[int, int, int]
    max_pillars: int
    max_points_per_pillar: int
    has_time: bool  # the model reads a time column: voxelize.cu takes it beside the float4 rows
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
        has_time = "time" in cfg.point_columns
        m = cfg.voxel.max_points_per_pillar
        staged = VoxelizeStage.GATHER_WARPS * m * (16 + 4 * has_time)  # float4 (+ time) a slot
        if staged > STATIC_SHARED_BYTES:
            raise ConfigError(f"{cfg.name}: {m} points a pillar with time lags need {staged} bytes "
                              f"of the GPU voxelizer's {STATIC_SHARED_BYTES} bytes of shared memory")
        v = cfg.voxel
        f32 = lambda xs: tuple(float(np.float32(x)) for x in xs)  # noqa: E731
        return cls(
            grid=v.grid,
            max_pillars=v.max_pillars,
            max_points_per_pillar=v.max_points_per_pillar,
            has_time=has_time,
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
            floats[f"RANGE_MIN_{axis}"] = f32_define(self.range_min[i])
            floats[f"RANGE_MAX_{axis}"] = f32_define(self.range_max[i])
            floats[f"PILLAR_{axis}"] = f32_define(self.pillar_size[i])
            floats[f"CENTER_OFFSET_{axis}"] = f32_define(self.centre_offset[i])
        # 4 bits per channel, channel 0 lowest: one integer, since nvcc splits -D values at commas.
        codes = sum(FEATURE_NAMES.index(name) << (4 * i) for i, name in enumerate(self.features))
        return define_flags(
            NX=self.grid[0], NY=self.grid[1], NZ=self.grid[2], MAX_PILLARS=self.max_pillars,
            MAX_PTS=self.max_points_per_pillar, NUM_FEATURES=len(self.features), FEATURE_CODES=f"{codes:#x}ull",
            RANGE_STRICT=int(self.strict_range), GATHER_WARPS=VoxelizeStage.GATHER_WARPS, HAS_TIME=int(self.has_time),
            STAT_COUNT=len(VOXEL_STATS), **floats, **slot_defines("STAT", VOXEL_STATS),
            **slot_defines("FEATURE", FEATURE_NAMES),
        )


class VoxelizeStage:
    """Points on the device -> decorated pillars, deterministically (``reference.voxelize``), for a batch
    of up to ``frames`` frames in one set of launches (each frame blockIdx.z of every launch).

    ``max_points`` is the point capacity the scratch is sized for: the rows of the input all frames
    share (a runtime value: a new capacity reuses the compiled kernels). Outputs, owned here and
    rewritten by every ``launch``, frames first: ``features`` (frames, max_pillars, M, C) float32 with
    every row past a frame's pillar count zero; ``coords`` (frames, max_pillars, 4) int32 (0, iz, iy,
    ix); ``num_points`` (frames, max_pillars) int32; ``stats`` (frames, len(VOXEL_STATS)) the device
    counters named by ``VOXEL_STATS``, a frame's pillar count first (what the PFN and scatter read).
    """

    KERNELS = ("vox_classify", "vox_count", "vox_offsets", "vox_number", "vox_rank", "vox_rank_large", "vox_gather")
    LARGE_PILLAR_BLOCKS = 64  # blocks of vox_rank_large a frame (grid-stride over the frame's large pillars)
    GATHER_WARPS = GATHER_WARPS  # pillars per vox_gather block, one warp each (compiled in as -DGATHER_WARPS)
    _GATHER_BLOCKS_PER_SM = 8  # vox_gather's grid, striding over the live pillars (as scatter's and the PFN's)
    # The per-point kernels' grid, striding over a frame's points: 2 blocks of 512 an SM take a full
    # KITTI scan (~121k points) in one pass on an H200; a batch's frames share it.
    _POINT_BLOCKS_PER_SM = 2

    def __init__(self, cfg: ModelConfig, max_points: int, frames: int = 1) -> None:
        if max_points < 1:
            raise ConfigError(f"max_points: expected a positive point capacity, received {max_points}")
        if frames < 1:
            raise ConfigError(f"frames: expected at least one frame, received {frames}")
        cp = cupy_module()
        self.params = p = VoxelParams.from_config(cfg)
        self.max_points = int(max_points)
        self.frames = int(frames)
        self._k = compile_kernels("voxelize.cu", p.defines(), self.KERNELS)
        self._num_chunks = grid_blocks(self.max_points, _SCAN_BLOCK)  # vox_count's counter rows a frame
        self._point_blocks = min(self._num_chunks, multiprocessors() * self._POINT_BLOCKS_PER_SM)
        self.points_per_pass = self._point_blocks * _SCAN_BLOCK  # a larger frame alone takes the grid several passes
        self._gather_blocks = min(grid_blocks(p.max_pillars, self.GATHER_WARPS), multiprocessors() * self._GATHER_BLOCKS_PER_SM)
        m, c, pmax, cells, n = p.max_points_per_pillar, len(p.features), p.max_pillars, p.num_cells, self.frames
        i32 = np.int32
        with checked("voxelize: allocating buffers"):
            self.features = cp.zeros((n, pmax, m, c), np.float32)
            self.coords = cp.zeros((n, pmax, 4), i32)
            self.num_points = cp.zeros((n, pmax), i32)
            self.stats = cp.zeros((n, len(VOXEL_STATS)), i32)
            self._point_cell = cp.zeros(self.max_points, i32)  # by input row: the frames' rows never overlap
            self._bucket = cp.zeros(self.max_points, i32)
            self._cell_first = cp.full((n, cells), np.iinfo(i32).max, i32)  # vox_rank restores these
            self._cell_count = cp.zeros((n, cells), i32)
            self._cell_fill = cp.zeros((n, cells), i32)
            self._cell_bucket = cp.zeros((n, cells), i32)
            self._cell_pillar = cp.zeros((n, cells), i32)
            self._block_counts = cp.zeros((n, self._num_chunks * 3), i32)
            self._pillar_bucket = cp.zeros((n, pmax), i32)
            self._pillar_total = cp.zeros((n, pmax), i32)
            self._slot_point = cp.zeros((n, pmax * m), i32)
            self._large_pillars = cp.zeros((n, pmax), i32)
            self._no_times = cp.zeros(1, np.float32)  # never read: the kernels' times argument without HAS_TIME
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, points: Any, headers: Any, stream: Any, times: Any = None, frames: int = 1) -> None:
        """Enqueue the first ``frames`` frames: ``headers`` is a device int32 array of (point count, first
        row) pairs, one a frame, selecting each frame's rows of ``points``, an (rows, 4) float32 device
        buffer of x, y, z, intensity that the frames share; ``times`` (rows,) float32, the time lags of the
        same rows, for models with a time column (and only for them)."""
        check_device_array(points, "points", np.float32, (None, GPU_POINT_COLUMNS))
        if self.params.has_time != (times is not None):
            raise InputError("times: the model reads a time column; pass the (rows,) time lags" if times is None
                             else "times: this model has no time column")
        if times is not None:
            check_device_array(times, "times", np.float32, (points.shape[0],))
        times = times if times is not None else self._no_times
        check_device_array(headers, "headers", np.int32, (None,))
        check_frames(self.stats, "voxelize", frames)
        if headers.shape[0] < 2 * frames:
            raise InputError(f"headers: {frames} frames need {2 * frames} values, received {headers.shape[0]}")
        if points.data.ptr % 16:
            raise InputError("points: the device buffer must be 16-byte aligned (rows are read as float4)")
        k = self._k
        rows = np.int32(min(points.shape[0], self.max_points))
        per_point = batch_grid(shared_blocks(self._point_blocks, frames), frames)
        launch_kernel(k["vox_classify"], per_point, _SCAN_BLOCK,
                      (points, times, headers, rows, self._point_cell, self._cell_first, self._cell_count), stream)
        launch_kernel(k["vox_count"], per_point, _SCAN_BLOCK,
                      (headers, rows, self._point_cell, self._cell_first, self._cell_count, self._cell_bucket,
                       self.stats, self._block_counts), stream)
        launch_kernel(k["vox_offsets"], batch_grid(1, frames), 1024,
                      (headers, rows, np.int32(_SCAN_BLOCK), self._block_counts, self.stats), stream)
        launch_kernel(k["vox_number"], per_point, _SCAN_BLOCK,
                      (headers, rows, self._point_cell, self._cell_first, self._cell_count, self._cell_bucket,
                       self._block_counts, self._cell_fill, self._cell_pillar, self._bucket, self._pillar_bucket,
                       self._pillar_total, self.coords, self.num_points, self.stats, self._large_pillars), stream)
        launch_kernel(k["vox_rank"], per_point, _SCAN_BLOCK,
                      (headers, rows, self._point_cell, self._cell_pillar, self._bucket, self._pillar_bucket,
                       self._pillar_total, self._cell_first, self._cell_count, self._cell_fill, self._slot_point),
                      stream)
        launch_kernel(k["vox_rank_large"], batch_grid(self.LARGE_PILLAR_BLOCKS, frames), 1024,
                      (headers, rows, self.stats, self._large_pillars, self._bucket, self._pillar_bucket,
                       self._pillar_total, self._slot_point), stream)
        launch_kernel(k["vox_gather"], batch_grid(shared_blocks(self._gather_blocks, frames), frames),
                      self.GATHER_WARPS * 32,
                      (points, times, headers, rows, self._slot_point, self.stats, self.coords, self.num_points,
                       self.features),
                      stream)
