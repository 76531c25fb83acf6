"""Family-independent PointPillars weights: what checkpoint import produces and ONNX export consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchNorm:
    """Inference-mode BatchNorm parameters, each of shape (C,), float32."""

    weight: np.ndarray
    bias: np.ndarray
    running_mean: np.ndarray
    running_var: np.ndarray

    def scale_shift(self, eps: float) -> tuple[np.ndarray, np.ndarray]:
        """(scale, shift) with BN(x) = x * scale + shift, computed in float64."""
        scale = self.weight.astype(np.float64) / np.sqrt(self.running_var.astype(np.float64) + eps)
        shift = self.bias.astype(np.float64) - self.running_mean.astype(np.float64) * scale
        return scale, shift


@dataclass(frozen=True)
class ConvBN:
    """A bias-free convolution followed by BatchNorm.

    ``weight`` is (Cout, Cin, k, k) for Conv2d and (Cin, Cout, k, k) for ConvTranspose2d, as torch stores it.
    """

    weight: np.ndarray
    bn: BatchNorm
    stride: int


@dataclass(frozen=True)
class Conv1x1:
    weight: np.ndarray  # (Cout, Cin, 1, 1)
    bias: np.ndarray    # (Cout,)


@dataclass(frozen=True)
class PointPillarsWeights:
    """All weights of the network, in the head channel order of the checkpoint's family.

    ``pfn_linear`` is (64, C) with C the decorated-feature count in config ``features.order``;
    ``blocks[i][j]`` is conv j of backbone block i (j = 0 has the block's stride);
    ``deblocks[i]`` is the transposed conv (kernel = stride) of the neck.
    """

    pfn_linear: np.ndarray
    pfn_bn: BatchNorm
    blocks: tuple[tuple[ConvBN, ...], ...]
    deblocks: tuple[ConvBN, ...]
    head_cls: Conv1x1
    head_box: Conv1x1
    head_dir: Conv1x1
