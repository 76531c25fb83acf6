"""Scatter stage: pillar features -> the BEV pseudo-image the RPN reads (``cuda/scatter.cu``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import ConfigError
from ._launch import (check_device_array, check_device_count, checked, compile_kernels, cupy_module, define_flags,
                      grid_blocks, launch_kernel, multiprocessors)


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
    """Pillar features (max_pillars, C) -> one frame's BEV canvas (ny, nx, C), NHWC, or with
    ``channels_first`` (C, ny, nx) as ``reference.scatter`` makes it; float16 or float32.

    The canvas belongs to the caller (a slot of the pipeline's batch canvas), and must be zero when the
    stage first writes it. Each launch first zeroes the cells the previous launch wrote (this stage
    remembers them), then writes the first ``num_pillars[0]`` pillars at their coords.
    """

    KERNELS = ("scatter_clear", "scatter_write")
    _BLOCK = 256
    _BLOCKS_PER_SM = 8

    def __init__(self, cfg: ModelConfig, dtype: Any = np.float32, channels_first: bool = False) -> None:
        cp = cupy_module()
        self.params = p = ScatterParams.from_config(cfg, dtype, channels_first)
        self._k = compile_kernels("scatter.cu", p.defines(), self.KERNELS)
        self._grid = min(grid_blocks(p.max_pillars * p.channels, self._BLOCK), multiprocessors() * self._BLOCKS_PER_SM)
        with checked("scatter: allocating buffers"):
            self._written_cells = cp.zeros(p.max_pillars, np.int32)
            self._written_count = cp.zeros(1, np.int32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, pillar_features: Any, coords: Any, num_pillars: Any, canvas: Any, stream: Any) -> None:
        """Enqueue: ``pillar_features`` (max_pillars, C) float32, ``coords`` (max_pillars, 4) int32 as
        the voxelizer writes them, ``num_pillars`` a device int32 count, ``canvas`` one frame's (``frame_shape``)."""
        p = self.params
        check_device_array(pillar_features, "pillar_features", np.float32, (p.max_pillars, p.channels))
        check_device_array(coords, "coords", np.int32, (p.max_pillars, 4))
        check_device_count(num_pillars, "num_pillars")
        check_device_array(canvas, "canvas", p.dtype, p.frame_shape)
        launch_kernel(self._k["scatter_clear"], self._grid, self._BLOCK,
                      (self._written_cells, self._written_count, canvas), stream)
        launch_kernel(self._k["scatter_write"], self._grid, self._BLOCK,
                      (pillar_features, coords, num_pillars, self._written_cells, self._written_count, canvas),
                      stream)
