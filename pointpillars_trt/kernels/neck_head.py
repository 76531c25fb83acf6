"""Neck + heads stage: transposed convs (kernel == stride) + bias + ReLU and the 1x1 heads in one kernel.

``cuda/neck_head.cu`` computes ``heads = sum_i relu(deconv_i(x_i)) W_i + b`` per head-map pixel without
writing the channel concat: ``W_i`` is branch i's block of rows of the merged (NH, sum CU) head weight.
float16 runs on tensor cores (mma.sync, float32 accumulation; on Hopper the transposed convs on warpgroup
MMA, ``cuda/neck_head_wgmma.cu``), the tf32 precision on tensor cores as TF32, IEEE float32 on plain FMA
(register-tiled). The weights are packed
once into one device buffer whose offsets the kernel is compiled with (:class:`NeckHeadParams`);
:func:`pack_neck_head` is the NumPy re-layout, tested against the plain ONNX-layout computation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import BackendError
from ..kernel_limits import STATIC_SHARED_BYTES
from ._launch import (check_device_array, checked, compile_arch_kernels, compile_kernels, cupy_module, define_flags,
                      grid_blocks, launch_kernel, multiprocessors)

MAX_BRANCHES = 3  # the kernel's pointer arguments; PointPillars necks have three
MAX_FEATURE_ELEMENTS = 2**31 - 1  # a feature map's offsets in the kernel are 32-bit (its pixel table)
_K_ALIGN = 16     # input channels: the wmma k step
_CU_ALIGN = 32    # upsampled channels: whole m16n8k16 head k steps, 64-byte weight rows
_OFFSET_ALIGN = 16  # elements: 32-byte aligned weight blocks
_CHUNK = 64         # float16 kernels: input channels per pipeline step (kChunk in cuda/neck_head_common.cuh)
WGMMA_UP = 128      # upsampled channels every branch must have for the wgmma kernel (its m64n128 tiles)
WGMMA_CAPABILITY = "90"  # the GPUs that run it (sm_90a: H100, H200, GH200)
WGMMA_HEAD_N = 72  # head channels a head wgmma of that kernel computes (its heads in tiles of 72)
WGMMA_MAX_SHARED = 232_448  # bytes of shared memory a block may have on compute capability 9.0 (227 KiB)
#: Upsampled channels a branch may have for the TF32 kernel (its shared weight slice and its accumulators
#: are sized for them); a wider neck runs the float32 kernel instead, and says so.
TF32_MAX_UP = 128


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class NeckBranch:
    """One neck branch: ``in_channels`` -> ConvTranspose(kernel = stride = ``stride``) -> ``up_channels``."""

    in_channels: int
    up_channels: int
    stride: int

    @property
    def padded_in(self) -> int:
        return _round_up(self.in_channels, _K_ALIGN)

    @property
    def padded_up(self) -> int:
        return _round_up(self.up_channels, _CU_ALIGN)


@dataclass(frozen=True)
class NeckHeadParams:
    """Everything neck_head.cu is compiled with; also the packed weight layout (offsets in elements)."""

    branches: tuple[NeckBranch, ...]
    head_y: int
    head_x: int
    head_channels: int
    half: bool
    warps: int = 6       # float16 kernel: warps per block, 16 rows (cells) each
    stages: int = 2      # float16 kernel: cp.async pipeline depth (shared-memory stages)
    min_blocks: int = 2  # float16 kernel: __launch_bounds__ blocks per SM (caps the registers)
    tf32: bool = False   # float32 inputs on tensor cores as TF32 (the tf32 precision) instead of plain FMA
    channels_first: bool = False  # float32 kernel: features (B, C, h, w), as the IEEE fp32 cuDNN backbone writes them
    wgmma: bool = False  # float16 kernel with the transposed convs on Hopper's warpgroup MMA (warps: 4 a warpgroup)
    blocks_per_position: int = 0  # wgmma kernel: persistent blocks a cell position; 0: the GPU's SMs / CELL**2

    def __post_init__(self) -> None:
        if not 1 <= len(self.branches) <= MAX_BRANCHES:
            raise BackendError(f"neck-head kernel: {len(self.branches)} neck branches; it supports 1 to {MAX_BRANCHES}")
        for i, br in enumerate(self.branches):
            if br.stride < 1 or self.head_y % br.stride or self.head_x % br.stride:
                raise BackendError(
                    f"neck branch {i}: upsample stride {br.stride} does not divide the head map "
                    f"{self.head_y} x {self.head_x}. Note: Expected integer strides that divide it"
                )
            if br.in_channels % 8:
                raise BackendError(
                    f"neck branch {i}: {br.in_channels} input channels. Note: Expected a multiple of 8 "
                    "(16-byte vector loads)"
                )

        if self.half and self.tf32:
            raise BackendError("neck-head kernel: float16 or TF32, not both")
        if self.channels_first and self.mma_layout:
            raise BackendError("neck-head kernel: channel-major (NCHW) features are read by the float32 kernel only")
        if self.tf32 and self.widest_up > TF32_MAX_UP:
            raise BackendError(f"neck-head kernel: {self.widest_up} upsampled channels; the TF32 kernel takes up to "
                               f"{TF32_MAX_UP}")
        if self.wgmma and not self.wgmma_fits:
            raise BackendError(f"neck-head kernel: wgmma needs float16, {WGMMA_UP} upsampled channels a branch, "
                               f"whole warpgroups and its weights in {WGMMA_MAX_SHARED} bytes of shared memory; got "
                               f"half={self.half}, {[b.padded_up for b in self.branches]} channels, {self.warps} "
                               f"warps, {self.wgmma_shared_bytes} bytes")
        if self.blocks_per_position < 0:
            raise BackendError(f"neck-head kernel: {self.blocks_per_position} blocks a position. Note: Expected >= 0")
        if not (1 <= self.warps <= 16 and 2 <= self.stages <= 8 and 1 <= self.min_blocks <= 8):
            raise BackendError(
                f"neck-head kernel: {self.warps} warps, {self.stages} stages, {self.min_blocks} blocks per SM. "
                "Note: Expected 1-16 warps, 2-8 stages, 1-8 blocks"
            )

    @classmethod
    def from_config(cls, cfg: ModelConfig, half: bool, tf32: bool = False, channels_first: bool = False) -> NeckHeadParams:
        """The kernel for ``cfg``'s neck; ``channels_first``: its features are NCHW (float32 only)."""
        net = cfg.network
        hx, hy = cfg.head_map
        branches = tuple(
            NeckBranch(cin, cu, k) for cin, cu, k in zip(net.block_channels, net.upsample_channels, net.upsample_kernels)
        )
        params = cls(branches, hy, hx, sum(cfg.head_channels.values()), half, channels_first=channels_first)
        if not tf32 or half:
            return params
        if params.widest_up > TF32_MAX_UP:
            warnings.warn(f"neck-head kernel: {params.widest_up} upsampled channels are more than the TF32 kernel's "
                          f"{TF32_MAX_UP}; the tf32 precision runs the neck and heads in float32 FMA (slower)",
                          RuntimeWarning, stacklevel=2)
            return params
        return replace(params, tf32=True)

    def for_gpu(self, compute_capability: str) -> NeckHeadParams:
        """The fastest kernel of these params on a GPU of ``compute_capability`` (CuPy's "90" form): the
        wgmma one where it runs and its weights fit in shared memory, in the launch shape that was fastest
        at batches 1 and 8 (3 warpgroups of 2 stages; KITTI on an H200: 0.040 ms a frame, 0.251 a batch of
        8), else these params."""
        fast = replace(self, warps=12, stages=2, min_blocks=1)
        if compute_capability != WGMMA_CAPABILITY or not fast.wgmma_fits:
            return self
        return replace(fast, wgmma=True)

    @property
    def wgmma_fits(self) -> bool:
        return (self.half and self.warps % 4 == 0 and all(b.padded_up == WGMMA_UP for b in self.branches)
                and self.wgmma_shared_bytes <= WGMMA_MAX_SHARED)

    @property
    def wgmma_shared_bytes(self) -> int:
        """The wgmma kernel's NH_SMEM: every 128 x 64-channel deconv slice of a cell position and its head
        blocks (resident; head channels in tiles of 72), each warpgroup's stages of 64 rows x 64 channels,
        1024 bytes of alignment."""
        slices = sum(-(-b.padded_in // _CHUNK) for b in self.branches) * WGMMA_UP * _CHUNK * 2
        heads = len(self.branches) * -(-self.padded_heads // WGMMA_HEAD_N) * WGMMA_HEAD_N * WGMMA_UP * 2
        return slices + (self.warps // 4) * self.stages * 64 * _CHUNK * 2 + heads + 1024

    @property
    def cell(self) -> int:
        """Side of the head-map cell whose pixels share no weight slice: lcm of the strides."""
        return math.lcm(*(b.stride for b in self.branches))

    @property
    def padded_heads(self) -> int:
        return _round_up(self.head_channels, 8)

    @property
    def widest_up(self) -> int:
        """Padded upsampled channels of the widest branch (the kernels' CU_MAX)."""
        return max(br.padded_up for br in self.branches)

    @property
    def kernel_name(self) -> str:
        if self.wgmma:
            return "neck_head_wgmma"
        return "neck_head_f16" if self.half else "neck_head_tf32" if self.tf32 else "neck_head_f32"

    @property
    def mma_layout(self) -> bool:
        """Whether the weights are packed N x K for the tensor-core kernels (float16, TF32)."""
        return self.half or self.tf32

    @property
    def rows_per_block(self) -> int:
        return 16 * self.warps if self.half else 64

    @property
    def threads(self) -> int:
        return 32 * self.warps if self.half else 128 if self.tf32 else 256

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of the float16 kernel (its NH_SMEM; 0 for the others, static)."""
        if not self.half:
            return 0
        if self.wgmma:
            return self.wgmma_shared_bytes
        cu_max = self.widest_up
        a_elems = self.rows_per_block * (_CHUNK + 8)
        w_elems = max(cu_max * (_CHUNK + 8), self.padded_heads * (cu_max + 8))
        return 2 * self.stages * (a_elems + w_elems) + 4 * 3 * self.rows_per_block  # + the rows' pixel indices

    def layout(self) -> dict[str, int]:
        """Offsets (elements) of every block of the packed weight and bias buffers, and their sizes."""
        out: dict[str, int] = {}
        w = 0
        for i, br in enumerate(self.branches):
            out[f"B{i}_W"] = w
            w += _round_up(br.stride * br.stride * br.padded_in * br.padded_up, _OFFSET_ALIGN)
        for i, br in enumerate(self.branches):
            out[f"B{i}_HEAD"] = w
            w += br.padded_up * self.padded_heads
        b = 0
        for i, br in enumerate(self.branches):
            out[f"B{i}_BIAS"] = b
            b += br.padded_up
        out["HEAD_BIAS"] = b
        out["weight_size"] = w
        out["bias_size"] = b + self.padded_heads
        return out

    def defines(self) -> tuple[str, ...]:
        lay = self.layout()
        values: dict[str, int | str] = dict(
            USE_MMA=int(self.half), USE_TF32=int(self.tf32), NH_TF32_MAX_UP=TF32_MAX_UP,
            NH_BLOCK_THREADS=self.threads, NH_BLOCK_ROWS=self.rows_per_block,
            NB=len(self.branches), HY=self.head_y, HX=self.head_x, CELL=self.cell,
            NH=self.head_channels, NHP=self.padded_heads, HEAD_BIAS=lay["HEAD_BIAS"],
            CU_MAX=self.widest_up, NH_IN_NCHW=int(self.channels_first),
        )
        if self.half:
            values.update(NH_WARPS=self.warps, NH_STAGES=self.stages, NH_MIN_BLOCKS=self.min_blocks,
                          NH_SMEM=self.shared_bytes)
        for i, br in enumerate(self.branches):
            values.update({
                f"B{i}_CIN": br.in_channels, f"B{i}_KP": br.padded_in, f"B{i}_CU": br.padded_up,
                f"B{i}_STRIDE": br.stride, f"B{i}_W": lay[f"B{i}_W"], f"B{i}_BIAS": lay[f"B{i}_BIAS"],
                f"B{i}_HEAD": lay[f"B{i}_HEAD"],
            })
        return define_flags(**values)

    def feature_shape(self, i: int, batch: int) -> tuple[int, int, int, int]:
        br = self.branches[i]
        h, w = self.head_y // br.stride, self.head_x // br.stride
        return (batch, br.in_channels, h, w) if self.channels_first else (batch, h, w, br.in_channels)

    def check_batch(self, batch: int) -> None:
        """Refuse a batch whose feature maps the kernel's 32-bit offsets cannot reach."""
        for i in range(len(self.branches)):
            elements = math.prod(self.feature_shape(i, batch))
            if elements > MAX_FEATURE_ELEMENTS:
                raise BackendError(f"neck feature {i}: {elements} elements at batch {batch}; the neck-head kernel's "
                                   f"32-bit offsets reach {MAX_FEATURE_ELEMENTS}. Note: Expected a smaller batch")

    def output_shape(self, batch: int) -> tuple[int, int, int, int]:
        return (batch, self.head_y, self.head_x, self.head_channels)


@dataclass(frozen=True)
class NeckHeadWeights:
    """The ONNX layouts: ConvTranspose weights (Cin, CU, k, k) + biases, merged head (NH, sum CU) + bias."""

    deconv_weights: tuple[np.ndarray, ...]
    deconv_biases: tuple[np.ndarray, ...]
    head_weight: np.ndarray
    head_bias: np.ndarray


def head_blocks(head_weight: np.ndarray, up_channels: Sequence[int]) -> list[np.ndarray]:
    """Split the merged head weight (NH, sum CU[, 1, 1]) into the per-branch blocks W_i (CU_i, NH)."""
    w = head_weight.reshape(head_weight.shape[0], -1)
    if w.shape[1] != sum(up_channels):
        raise BackendError(
            f"head weight: {w.shape[1]} input channels. Note: Expected {sum(up_channels)} (the neck's concat)"
        )
    edges = np.cumsum([0, *up_channels])
    return [np.ascontiguousarray(w[:, lo:hi].T) for lo, hi in zip(edges[:-1], edges[1:])]


def pack_neck_head(params: NeckHeadParams, weights: NeckHeadWeights) -> tuple[np.ndarray, np.ndarray]:
    """The packed weight buffer (float16, or float32: rounded to TF32 for the TF32 kernel; see the .cu
    header) and the float32 bias buffer."""
    lay = params.layout()
    wbuf = np.zeros(lay["weight_size"], np.float32)
    bbuf = np.zeros(lay["bias_size"], np.float32)
    blocks = head_blocks(weights.head_weight, [b.up_channels for b in params.branches])
    for i, br in enumerate(params.branches):
        wd = weights.deconv_weights[i]
        want = (br.in_channels, br.up_channels, br.stride, br.stride)
        if wd.shape != want:
            raise BackendError(f"deblock{i}.weight | Received shape {wd.shape}. Note: Expected {want}")
        k, kp, cu = br.stride, br.padded_in, br.padded_up
        slices = np.zeros((k, k, cu, kp), np.float32)
        slices[:, :, : br.up_channels, : br.in_channels] = wd.transpose(2, 3, 1, 0)  # [a][b][co][ci]
        head = np.zeros((params.padded_heads, cu), np.float32)  # W_i transposed: [h][c]
        head[: params.head_channels, : br.up_channels] = blocks[i].T
        if not params.mma_layout:  # the float32 kernel reads K x N: consecutive threads, consecutive output channels
            slices, head = slices.transpose(0, 1, 3, 2), head.T
        wbuf[lay[f"B{i}_W"]: lay[f"B{i}_W"] + slices.size] = slices.ravel()
        wbuf[lay[f"B{i}_HEAD"]: lay[f"B{i}_HEAD"] + head.size] = head.ravel()
        bbuf[lay[f"B{i}_BIAS"]: lay[f"B{i}_BIAS"] + br.up_channels] = weights.deconv_biases[i]
    bbuf[lay["HEAD_BIAS"]: lay["HEAD_BIAS"] + params.head_channels] = weights.head_bias
    if params.half:
        return wbuf.astype(np.float16), bbuf
    return (round_to_tf32(wbuf) if params.tf32 else wbuf), bbuf


def round_to_tf32(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10 mantissa bits, to nearest with ties away from zero (the
    kernel's cvt.rna for its inputs): what the tensor cores would otherwise truncate."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    finite = np.isfinite(values)
    rounded = np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits)
    return rounded.astype(np.uint32).view(np.float32)


class NeckHeadStage:
    """Branch features (NHWC, float16 or float32; or NCHW float32) -> heads (B, HY, HX, NH) float32 NHWC,
    one launch.

    The packed weights are uploaded once here; :meth:`launch` only enqueues the kernel.
    """

    def __init__(self, params: NeckHeadParams, weights: NeckHeadWeights) -> None:
        cp = cupy_module()
        self.params = params
        self.kernel_name = params.kernel_name
        if params.wgmma:
            self._kernel: Any = compile_arch_kernels("neck_head_wgmma.cu", params.defines(), (self.kernel_name,),
                                                     "sm_90a")[self.kernel_name]
        else:
            self._kernel = compile_kernels("neck_head.cu", params.defines(), (self.kernel_name,))[self.kernel_name]
        wbuf, bbuf = pack_neck_head(params, weights)
        with checked("neck_head: uploading weights"):
            self.weights = cp.asarray(wbuf)
            self.biases = cp.asarray(bbuf)
            cp.cuda.runtime.deviceSynchronize()  # uploaded before any other stream reads them
        self.dtype = np.dtype(np.float16 if params.half else np.float32)
        if params.shared_bytes > STATIC_SHARED_BYTES:  # more dynamic shared memory than the default: opt in
            with checked(f"{self.kernel_name}: {params.shared_bytes} bytes of shared memory"):
                self._kernel.max_dynamic_shared_size_bytes = params.shared_bytes
        positions = params.cell * params.cell
        self.blocks_per_position = params.blocks_per_position or max(1, multiprocessors() // positions)

    def grid(self, batch: int) -> tuple[int, int]:
        p = self.params
        if p.wgmma:  # persistent: each block walks its position's tiles
            return self.blocks_per_position, p.cell * p.cell
        cells = batch * (-(-p.head_y // p.cell)) * (-(-p.head_x // p.cell))
        return grid_blocks(cells, p.rows_per_block), p.cell * p.cell

    def check(self, features: Sequence[Any], out: Any) -> int:
        """Check the device arrays (names, dtypes, shapes, C order); returns the batch."""
        p = self.params
        if len(features) != len(p.branches):
            raise BackendError(f"neck_head: {len(features)} feature maps. Note: Expected {len(p.branches)}")
        batch = int(out.shape[0]) if getattr(out, "ndim", 0) == 4 else -1
        check_device_array(out, "heads", np.float32, p.output_shape(max(batch, 0)))
        for i, f in enumerate(features):
            check_device_array(f, f"neck feature {i}", self.dtype, p.feature_shape(i, batch))
        p.check_batch(batch)
        return batch

    def launch(self, features: Sequence[Any], out: Any, stream: Any, *, checked_batch: int | None = None) -> None:
        """Enqueue on ``stream``. ``checked_batch``: the batch of arrays :meth:`check` already passed (hot path)."""
        batch = self.check(features, out) if checked_batch is None else checked_batch
        xs = list(features) + [features[0]] * (MAX_BRANCHES - len(features))
        p = self.params
        args = (*xs, self.weights, self.biases, out, np.int32(batch))
        launch_kernel(self._kernel, self.grid(batch), p.threads, args, stream, p.shared_bytes)
