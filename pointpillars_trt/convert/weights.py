"""Family-independent PointPillars weights: what checkpoint import produces and ONNX export consumes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from ..config import ModelConfig
from ..errors import ConfigError


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


#: torch's BatchNorm buffer names in a state dict, in the order BatchNorm takes them.
BN_FIELDS = tuple(f.name for f in fields(BatchNorm))


class BatchNormFold(NamedTuple):
    """Where a checkpoint's BatchNorm folds: the key of the conv weight before it, the eps it folds with, and
    the axis of that weight that holds the output channels the BatchNorm scales (0 for Linear, Conv1d and
    Conv2d; 1 for ConvTranspose2d, whose weight torch stores as (Cin, Cout, k, k))."""

    weight: str
    eps: float
    out_axis: int


@dataclass(frozen=True)
class ConvBN:
    """A bias-free convolution followed by BatchNorm.

    ``weight`` is (Cout, Cin, k, k) for Conv2d and (Cin, Cout, k, k) for ConvTranspose2d, as torch stores it.
    """

    weight: np.ndarray
    bn: BatchNorm
    stride: int


@dataclass(frozen=True)
class ConvKeys:
    """Where one conv of a checkpoint layout lives: its weight's key and shape, and after it either a
    BatchNorm (``bn``: its key prefix) or, for an output conv, a bias (``bn`` None)."""

    weight: str
    shape: tuple[int, ...]
    bn: str | None
    channels: int  # output channels: the BatchNorm's or the bias's size
    stride: int = 1
    out_axis: int = 0  # of the weight, the output channels: 1 for a ConvTranspose2d (Cin, Cout, k, k)

    def keys(self) -> dict[str, tuple[int, ...]]:
        """Its state-dict keys with their shapes."""
        if self.bn is None:
            return {self.weight: self.shape, self.weight.removesuffix("weight") + "bias": (self.channels,)}
        return {self.weight: self.shape, **{f"{self.bn}.{f}": (self.channels,) for f in BN_FIELDS}}

    def conv_bn(self, get: Callable[[str], np.ndarray]) -> ConvBN:
        """The conv and its BatchNorm from the checked tensors (``get(key)`` -> float32 array)."""
        if self.bn is None:
            raise ValueError(f"{self.weight} is an output conv: it has a bias, no BatchNorm")
        return ConvBN(get(self.weight), BatchNorm(*(get(f"{self.bn}.{f}") for f in BN_FIELDS)), self.stride)


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


# ------------------------------------------------------------------ seeded random weights

# BN statistics and head scales of random weights are calibrated on a synthetic proxy canvas of
# _PROXY_CELLS^2 BEV cells, a share _PROXY_OCCUPANCY of them holding pillars in clumps (KITTI: 1.5 %
# of the cells on camera crops, 7 % on full scans). Without it the gain of a random 20-layer net
# wanders from seed to seed, and the number of anchors above a score threshold with it, by 100x;
# with it, by about 10x.
_PROXY_CELLS = 128
_PROXY_OCCUPANCY = 0.05
_PROXY_SMOOTHING = 8  # blur passes: clump size in cells
# Head outputs, in proxy standard deviations (gain) around an offset. Real frames have about 10x the
# proxy's spread, so the class logits (offset -6) pass a 0.1 score only at the strongest responses:
# tens to hundreds of anchors on a full KITTI scan, a few to tens on a camera crop.
_HEAD_GAIN = {"cls": 0.15, "box": 0.02, "dir": 0.3}
_HEAD_OFFSET = {"cls": -6.0, "box": 0.0, "dir": 0.0}


#: (mean, std) of the features that are no coordinate or offset: intensity over [0, 1), time lag over [0, 0.5) s.
_NON_SPATIAL_MOMENTS = {"intensity": (0.5, 1.0), "time": (0.25, 0.5)}


def _feature_moments(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Rough (mean, std) of each decorated feature: coordinates spread uniformly over the range,
    offsets over a pillar, intensity over [0, 1), a sweep's time lag over [0, 0.5) s."""
    r, size = cfg.voxel.point_range, cfg.voxel.pillar_size
    stats = []
    for name in cfg.features.order:
        if name in _NON_SPATIAL_MOMENTS:
            stats.append(_NON_SPATIAL_MOMENTS[name])
            continue
        axis = "xyz".index(name[-1])  # x, y, z, mean_dx ... center_dz
        absolute = name in ("x", "y", "z")
        stats.append(((r[axis] + r[axis + 3]) / 2, r[axis + 3] - r[axis]) if absolute else (0.0, size[axis]))
    mean, spread = np.array(stats).T
    return mean, spread / np.sqrt(12.0)


def _random_bn(rng: np.random.Generator, mean: np.ndarray, var: np.ndarray) -> BatchNorm:
    """BN with every parameter random (so folding is really tested) for inputs of the given moments.

    The running statistics scatter around the true moments; beta cancels most of the running-mean
    error, so the output is ~unit spread around a small offset and an empty canvas maps to small
    values (the head then responds to the points, not to the zero padding at the map borders).
    """
    c = mean.shape[0]
    gamma = rng.uniform(0.5, 1.5, c)
    running_mean = mean + rng.normal(0.0, 0.3, c) * np.sqrt(var)
    running_var = var * rng.uniform(0.5, 2.0, c)
    beta = gamma * (running_mean - mean) / np.sqrt(running_var) + rng.normal(0.0, 0.05, c)
    return BatchNorm(*(np.asarray(a, np.float32) for a in (gamma, beta, running_mean, running_var)))


def _calibrated_bn(rng: np.random.Generator, pre: np.ndarray, eps: float) -> tuple[BatchNorm, np.ndarray]:
    """A random BN for the proxy pre-activations ``pre`` (C, H, W), and ReLU(BN(pre))."""
    bn = _random_bn(rng, pre.mean((1, 2)), pre.var((1, 2)) + 1e-6)
    scale, shift = bn.scale_shift(eps)
    return bn, np.maximum(pre * scale[:, None, None] + shift[:, None, None], 0.0).astype(np.float32)


def _proxy_canvas(rng: np.random.Generator, channels: int) -> np.ndarray:
    """Pillar features on a synthetic BEV patch (C, S, S): occupied cells come in clumps and
    neighbouring pillars look alike, as in a lidar scan; the rest is empty (zero)."""
    field = rng.standard_normal((channels + 1, _PROXY_CELLS, _PROXY_CELLS)).astype(np.float32)
    for _ in range(_PROXY_SMOOTHING):  # separable [1 1 1] blur, wrapping at the edges
        for axis in (1, 2):
            field = field + np.roll(field, 1, axis) + np.roll(field, -1, axis)
    field /= field.std(axis=(1, 2), keepdims=True)
    occupied = field[-1] > np.quantile(field[-1], 1.0 - _PROXY_OCCUPANCY)
    return np.maximum(field[:-1], 0.0) * occupied


def _conv3x3(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    """(C, H, W) * (O, C, 3, 3), zero padding 1 -> (O, H', W')."""
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (1, 1), (1, 1))), (3, 3), axis=(1, 2))
    return np.tensordot(w, windows[:, ::stride, ::stride], axes=([1, 2, 3], [0, 3, 4]))


def _upsample(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Transposed conv with kernel = stride = k: (C, H, W) * (C, O, k, k) -> (O, kH, kW)."""
    y = np.tensordot(w, x, axes=([0], [0]))  # (O, k, k, H, W)
    o, k, _, h, wd = y.shape
    return y.transpose(0, 3, 1, 4, 2).reshape(o, h * k, wd * k)


def random_weights(cfg: ModelConfig, seed: int = 0) -> PointPillarsWeights:
    """Seeded, untrained weights with the config's shapes, for tests and ``pointpillars-trt demo``.

    He-scaled weights with BN statistics calibrated on a synthetic proxy canvas keep activations O(1)
    on lidar frames, and the class head leaves tens to a few hundred anchors above a 0.1 score, so the
    whole pipeline has work to do. The detections mean nothing. Single-head models only: a multi-head
    model's weights come from its checkpoint.
    """
    if cfg.heads is not None:
        raise ConfigError(f"config {cfg.name}: seeded random weights are made for single-head models only (e.g. "
                          "openpcdet_kitti_3class); for a multi-head model run its checkpoint (infer or bench --model CKPT)")
    rng = np.random.default_rng(seed)
    net, eps, channels = cfg.network, cfg.network.bn_eps, cfg.features.channels

    # The PFN sees raw coordinates (tens of metres) beside centimetre offsets: whiten by their spread.
    feat_mean, feat_std = _feature_moments(cfg)
    pfn_linear = rng.standard_normal((net.pfn_channels, channels)) / feat_std / np.sqrt(channels)
    pfn_bn = _random_bn(rng, pfn_linear @ feat_mean, ((pfn_linear * feat_std) ** 2).sum(1))

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    x = _proxy_canvas(rng, net.pfn_channels)
    blocks, block_outputs, cin = [], [], net.pfn_channels
    for n, stride, cout in zip(net.layer_nums, net.layer_strides, net.block_channels):
        block = []
        for j in range(n + 1):
            c, s = (cin, stride) if j == 0 else (cout, 1)
            w = he((cout, c, 3, 3), 9 * c)
            bn, x = _calibrated_bn(rng, _conv3x3(x, w, s), eps)
            block.append(ConvBN(w, bn, s))
        blocks.append(tuple(block))
        block_outputs.append(x)
        cin = cout
    deblocks, upsampled = [], []
    for x, cin, cout, k in zip(block_outputs, net.block_channels, net.upsample_channels, net.upsample_kernels):
        w = he((cin, cout, k, k), cin)  # each output pixel sums one tap of Cin channels
        bn, y = _calibrated_bn(rng, _upsample(x, w), eps)
        deblocks.append(ConvBN(w, bn, k))
        upsampled.append(y)
    features = np.concatenate(upsampled).reshape(net.head_in_channels, -1)

    def head(name: str) -> Conv1x1:
        w = rng.standard_normal((cfg.head_channels[name], net.head_in_channels))
        out = w @ features
        w *= _HEAD_GAIN[name] / out.std(1, keepdims=True)
        bias = _HEAD_OFFSET[name] - w @ features.mean(1)
        return Conv1x1(w[:, :, None, None].astype(np.float32), bias.astype(np.float32))

    return PointPillarsWeights(
        pfn_linear=pfn_linear.astype(np.float32),
        pfn_bn=pfn_bn,
        blocks=tuple(blocks),
        deblocks=tuple(deblocks),
        head_cls=head("cls"),
        head_box=head("box"),
        head_dir=head("dir"),
    )
