"""The cuDNN engine's tuning checks on the GPU (``cuda/tuning_checks.cu``): random inputs in the engine's
precision, and a batch's outputs compared with batch 1's frame by frame. One module of ours, compiled
once a machine, where CuPy's random numbers, casts, comparisons and reductions compiled eleven modules of
their own on a machine's first start (4.5-7 s of it on an H200)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._launch import check_device_array, compile_kernels, cupy_module, define_flags, grid_blocks, launch_kernel

THREADS = 256
MAX_BLOCKS = 1024  # a grid's blocks stride over the values beyond this


@dataclass(frozen=True)
class FrameComparison:
    """Per frame of a batch: values whose bits differ, the largest |got - want| and the largest
    |want| (NaN counted as infinity)."""

    unequal: np.ndarray
    worst: np.ndarray
    scale: np.ndarray

    @property
    def exact(self) -> bool:
        """Every value's bits equal (so 0.0 against -0.0 is not exact, and NaNs of the same bits are)."""
        return not self.unequal.any()

    def within(self, relative: float) -> bool:
        """Every frame's worst difference finite and within ``relative`` of its own magnitude (at least 1):
        a NaN or infinity on either side (counted as an infinite difference) never agrees."""
        return bool((np.isfinite(self.worst) & (self.worst <= relative * np.maximum(self.scale, 1.0))).all())


class TuningChecks:
    """The two kernels for one activation type (float16 or float32)."""

    KERNELS = ("check_fill_uniform", "check_compare_frames")

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float16, np.float32):
            raise ValueError(f"tuning checks run on float16 or float32 activations, not {self.dtype}")
        self._k = compile_kernels("tuning_checks.cu", define_flags(CHECK_HALF=int(self.dtype == np.float16)),
                                  self.KERNELS)

    def fill_uniform(self, out: Any, seed: int, stream: Any) -> None:
        """Fill ``out`` (C order, the checks' dtype) with uniform values in [0, 1), a function of ``seed``."""
        check_device_array(out, "random input", self.dtype, (None,) * out.ndim)
        n = int(out.size)
        launch_kernel(self._k["check_fill_uniform"], min(grid_blocks(n, THREADS), MAX_BLOCKS), THREADS,
                      (out, np.int64(n), np.uint64(seed)), stream)

    def compare_frames(self, got: Any, want: Any, stream: Any) -> FrameComparison:
        """Compare two batches of the same shape frame by frame (the first axis); waits for ``stream``."""
        cp = cupy_module()
        for name, arr in (("compared batch", got), ("reference batch", want)):
            check_device_array(arr, name, self.dtype, want.shape)
        batch = int(want.shape[0])
        per_frame = int(want.size) // max(batch, 1)
        with stream:
            out = cp.zeros((3, batch), np.uint32)
        blocks = min(grid_blocks(per_frame, THREADS), MAX_BLOCKS)
        launch_kernel(self._k["check_compare_frames"], (blocks, batch), THREADS,
                      (got, want, np.int64(per_frame), out[0], out[1], out[2]), stream)
        host = out.get(stream=stream)  # waits for the stream
        return FrameComparison(host[0].copy(), host[1].view(np.float32).copy(), host[2].view(np.float32).copy())
