"""Scatter stage: pillar features -> the BEV pseudo-image the RPN reads (``cuda/scatter.cu``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import ConfigError
from ._launch import (batch_grid, check_device_array, check_frame_counts, check_frames, checked, compile_kernels,
                      cupy_module, define_flags, grid_blocks, launch_kernel, multiprocessors, shared_blocks)


@dataclass(frozen=True)
class ScatterParams:
    """Everything scatter.cu is compiled with."""

    nx: int
    ny: int
    channels: int
    max_pillars: int
    half: bool  # float16 canvas (the fp16 RPN's input), else float32
    channels_first: bool = False  # (C, ny, nx) per frame (NCHW), else (ny, nx, C)

    @classmethod
    def from_config(cls, cfg: ModelConfig, dtype: Any = np.float32, channels_first: bool = False) -> ScatterParams:
        nx, ny, _ = cfg.voxel.grid
        if np.dtype(dtype) not in (np.float16, np.float32):
            raise ConfigError(f"scatter: canvas dtype {np.dtype(dtype)} is not supported (float16 or float32)")
        return cls(nx=nx, ny=ny, channels=cfg.network.pfn_channels, max_pillars=cfg.voxel.max_pillars,
                   half=np.dtype(dtype) == np.float16, channels_first=channels_first)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float16 if self.half else np.float32)

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """One frame's canvas."""
        return (self.channels, self.ny, self.nx) if self.channels_first else (self.ny, self.nx, self.channels)

    def defines(self) -> tuple[str, ...]:
        return define_flags(NX=self.nx, NY=self.ny, CHANNELS=self.channels, MAX_PILLARS=self.max_pillars,
                            CANVAS_HALF=int(self.half), CANVAS_NCHW=int(self.channels_first))


class ScatterStage:
    """Pillar features (frames, max_pillars, C) -> each frame's BEV canvas (ny, nx, C), NHWC, or with
    ``channels_first`` (C, ny, nx) as ``reference.scatter`` makes it; float16 or float32; a batch of up
    to ``frames`` frames in one pair of launches.

    The canvas (frames first) belongs to the caller (the pipeline's batch canvas), and must be zero
    when the stage first writes it. Each launch first zeroes the cells the previous launch wrote in
    each frame's canvas (this stage remembers them), then writes each frame's live pillars at their coords.
    """

    KERNELS = ("scatter_clear", "scatter_write")
    _BLOCK = 256
    _BLOCKS_PER_SM = 8

    def __init__(self, cfg: ModelConfig, dtype: Any = np.float32, channels_first: bool = False, frames: int = 1) -> None:
        cp = cupy_module()
        self.params = p = ScatterParams.from_config(cfg, dtype, channels_first)
        self._k = compile_kernels("scatter.cu", p.defines(), self.KERNELS)
        self._grid = min(grid_blocks(p.max_pillars * p.channels, self._BLOCK), multiprocessors() * self._BLOCKS_PER_SM)
        with checked("scatter: allocating buffers"):
            self._written_cells = cp.zeros((frames, p.max_pillars), np.int32)
            self._written_count = cp.zeros(frames, np.int32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, pillar_features: Any, coords: Any, counts: Any, canvas: Any, stream: Any, frames: int = 1) -> None:
        """Enqueue the first ``frames`` frames: ``pillar_features`` (frames, max_pillars, C) float32,
        ``coords`` (frames, max_pillars, 4) int32 as the voxelizer writes them, ``counts`` its (frames, k)
        int32 ``stats`` (a frame's pillar count first), ``canvas`` (frames, *``frame_shape``)."""
        p = self.params
        check_device_array(pillar_features, "pillar_features", np.float32, (None, p.max_pillars, p.channels))
        check_device_array(coords, "coords", np.int32, (None, p.max_pillars, 4))
        check_frame_counts(counts, "counts", frames)
        check_device_array(canvas, "canvas", p.dtype, (None, *p.frame_shape))
        for arr, name in ((pillar_features, "pillar_features"), (coords, "coords"), (canvas, "canvas"),
                          (self._written_cells, "scatter")):
            check_frames(arr, name, frames)
        grid = batch_grid(shared_blocks(self._grid, frames), frames)
        launch_kernel(self._k["scatter_clear"], grid, self._BLOCK,
                      (self._written_cells, self._written_count, canvas), stream)
        launch_kernel(self._k["scatter_write"], grid, self._BLOCK,
                      (pillar_features, coords, counts, np.int32(counts.shape[1]), self._written_cells,
                       self._written_count, canvas), stream)
