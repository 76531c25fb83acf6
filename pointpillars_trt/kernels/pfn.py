"""PFN stage: the fused pillar feature net kernel on the live pillars (``cuda/pfn.cu``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import ConfigError, InputError
from ..graph_io import OVERFLOWED_FEATURE
from ..kernel_limits import PFN_BLOCK_THREADS, STATIC_SHARED_BYTES
from ._launch import (batch_grid, check_device_array, check_frame_counts, check_frames, checked, compile_kernels,
                      cupy_module, define_flags, f32_define, grid_blocks, multiprocessors, shared_blocks)
from .voxelize import VOXEL_STATS

_OVERFLOWED_SLOT = VOXEL_STATS.index("overflowed_features")  # of a frame's counters, which the voxelizer zeroes


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

    @property
    def channels_per_thread(self) -> int:
        """Channels one thread computes (4 where they divide evenly): a loaded feature feeds that many
        multiply-adds."""
        return next(k for k in (4, 2, 1) if self.out_channels % k == 0)

    @property
    def block(self) -> tuple[int, int]:
        """(threads a pillar, pillars a block): up to PFN_BLOCK_THREADS threads, and as many staged
        pillars as static shared memory holds (a row: the pillar's floats, at most 7 more of padding)."""
        groups = self.out_channels // self.channels_per_thread
        row_bytes = 4 * (self.max_points_per_pillar * self.num_features + 7)
        return groups, max(1, min(PFN_BLOCK_THREADS // groups, STATIC_SHARED_BYTES // row_bytes))

    def defines(self) -> tuple[str, ...]:
        return define_flags(MAX_PILLARS=self.max_pillars, MAX_PTS=self.max_points_per_pillar,
                            NUM_FEATURES=self.num_features, OUT_CHANNELS=self.out_channels,
                            CHANNELS_PER_THREAD=self.channels_per_thread, PILLARS_PER_BLOCK=self.block[1],
                            OVERFLOWED_FEATURE=f32_define(OVERFLOWED_FEATURE),
                            COUNT_OVERFLOWED_FEATURES=_OVERFLOWED_SLOT)


class PfnStage:
    """Decorated pillars -> pillar features with the folded linear + ReLU + max of the PFN graph, for a
    batch of up to ``frames`` frames in one launch.

    The same function as ``pfn.onnx`` (its folded weight and bias are passed in), computed only for
    the live pillars: an engine with a fixed (max_pillars, M, C) input pays for every row. ``out``
    (frames, max_pillars, C) is owned here; rows past a frame's pillar count keep stale values, which
    scatter never reads. Features beyond ``OVERFLOWED_FEATURE`` are added to the frame's
    ``overflowed_features`` counter (``reference.overflowed_features``).
    """

    KERNELS = ("pfn_forward",)
    _BLOCKS_PER_SM = 8

    def __init__(self, cfg: ModelConfig, weight: np.ndarray, bias: np.ndarray, frames: int = 1) -> None:
        cp = cupy_module()
        self.params = p = PfnParams.from_config(cfg)
        if weight.shape != (p.out_channels, p.num_features) or bias.shape != (p.out_channels,):
            raise ConfigError(
                f"PFN weight {weight.shape} / bias {bias.shape} do not fit the config: expected "
                f"({p.out_channels}, {p.num_features}) / ({p.out_channels},)"
            )
        self._k = compile_kernels("pfn.cu", p.defines(), self.KERNELS)
        self._grid = min(grid_blocks(p.max_pillars, p.block[1]), multiprocessors() * self._BLOCKS_PER_SM)
        with checked("pfn: allocating buffers"):
            self._weight = cp.asarray(np.ascontiguousarray(weight, np.float32))
            self._bias = cp.asarray(np.ascontiguousarray(bias, np.float32))
            self.out = cp.zeros((frames, p.max_pillars, p.out_channels), np.float32)
            cp.cuda.runtime.deviceSynchronize()

    def launch(self, pillars: Any, counts: Any, stream: Any, frames: int = 1) -> None:
        """Enqueue the first ``frames`` frames: ``pillars`` (frames, max_pillars, M, C) float32 as the
        voxelizer writes them, ``counts`` its (frames, len(VOXEL_STATS)) int32 ``stats`` (a frame's pillar count
        first; its overflowed feature count, zeroed by the voxelizer, is added to)."""
        p = self.params
        check_device_array(pillars, "pillars", np.float32,
                           (None, p.max_pillars, p.max_points_per_pillar, p.num_features))
        check_frames(pillars, "pillars", frames)
        check_frame_counts(counts, "counts", frames)
        if counts.shape[1] <= _OVERFLOWED_SLOT:
            raise InputError(f"counts: expected the voxelizer's {len(VOXEL_STATS)} counters a frame, received shape "
                             f"{counts.shape}")
        check_frames(self.out, "pfn", frames)
        kernel = self._k["pfn_forward"]
        with checked(kernel.name):
            kernel(batch_grid(shared_blocks(self._grid, frames), frames), p.block,
                   (pillars, self._weight, self._bias, counts, np.int32(counts.shape[1]), self.out), stream=stream)
