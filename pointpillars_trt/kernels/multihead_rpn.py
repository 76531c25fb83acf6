"""The neck branches and head output convs of a multi-head RPN (``cuda/multihead_rpn.cu``), for the
cuDNN engine, which runs the 3x3 convs around them.

The weights are re-laid out once here (NumPy, tested against plain convolutions): a neck branch as
(k * k * cin, cout) rows, the heads' output convs as one (branches, MAX_OUT, 9, MID) block; for the
tensor-core kernels (``neck_branch_mma``, ``head_conv_mma``: fp16, and tf32 as TF32) as blocks of each
tap's outputs by their reduce, float16 or TF32 values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BackendError
from ..kernel_limits import STATIC_SHARED_BYTES
from ._launch import check_device_array, checked, compile_kernels, cupy_module, define_flags, grid_blocks, launch_kernel, slot_defines
from .neck_head import round_to_tf32

BRANCH_COLUMNS = ("out_at", "count")  # the head_conv branch table: first channel in the head map, channels
_PIXELS = 16       # neck_branch: pixels a block
_NECK_THREADS = 128
_TILE_X = 8        # head_conv: tile width (its height is 4 TILE_X; TILE_X^2 threads)
_CI_CHUNK = 16     # head_conv: middle channels staged in shared memory at a time
_MMA_TILE = (16, 16)     # head_conv_mma: tile rows x columns (a warp takes two rows of 16 pixels)
_HEAD_CHUNK_BYTES = 64   # head_conv_mma: bytes of a pixel's middle channels staged at a time (at most MID's)
_NECK_MMA_TILE = (64, 64)   # neck_branch_mma: a block's GEMM rows (pixels) x output channels, 4 warps
_NECK_STAGE_BYTES = (128, 64)  # neck_branch_mma: bytes of a row's reduce staged at a time, the first that
                               # every branch's cin holds whole (the faster first)
PRECISIONS = ("fp16", "tf32", "fp32")
TENSOR_CORE_PRECISIONS = ("fp16", "tf32")  # IEEE fp32 keeps the FMA kernels


@dataclass(frozen=True)
class NeckBranch:
    """One neck branch: a conv with kernel == stride ``k``, ``down`` (strided conv) or up (transposed)."""

    in_channels: int
    out_channels: int
    k: int
    down: bool

    @property
    def reduce(self) -> int:
        """Products summed per output value: the k x k patch (down) or one input pixel (up)."""
        return self.k * self.k * self.in_channels if self.down else self.in_channels


def pack_neck_weight(weight: np.ndarray, down: bool) -> np.ndarray:
    """ONNX weight -> (k * k * cin, cout) float32 rows (tap * cin + ci), tap = ky * k + kx: a Conv's
    (cout, cin, k, k) for ``down``, a ConvTranspose's (cin, cout, k, k) otherwise."""
    w = np.asarray(weight, np.float32)
    per_tap = w.transpose(2, 3, 1, 0) if down else w.transpose(2, 3, 0, 1)  # (ky, kx, cin, cout)
    return np.ascontiguousarray(per_tap.reshape(-1, per_tap.shape[-1]))


def pack_neck_weight_for_mma(weight: np.ndarray, branch: NeckBranch, precision: str) -> np.ndarray:
    """ONNX weight -> neck_branch_mma's (taps, cout, reduce) block (``tensor_core_values``): a strided conv as
    one tap whose reduce runs over ``pack_neck_weight``'s rows (tap * cin + ci), a transposed conv as k * k
    taps of cin each."""
    rows = pack_neck_weight(weight, branch.down)
    taps = 1 if branch.down else branch.k * branch.k
    return tensor_core_values(rows.reshape(taps, -1, branch.out_channels).transpose(0, 2, 1), precision, "neck")


def tensor_core_values(weights: np.ndarray, precision: str, what: str) -> np.ndarray:
    """``weights`` as the tensor-core kernels read them. fp16: float16, refused where that would round one
    (the fp16 engine's weights are float16 values already, and the kernels must compute with exactly
    those). tf32: float32 rounded to TF32 as the kernels round their inputs (the tensor cores would
    truncate)."""
    if precision == "tf32":
        return np.ascontiguousarray(round_to_tf32(np.asarray(weights, np.float32)))
    if precision != "fp16":
        raise BackendError(f"multi-head RPN: no tensor-core kernels for precision {precision}")
    packed = np.ascontiguousarray(weights, np.float16)
    if not np.array_equal(packed.astype(np.float32), weights):
        raise BackendError(f"multi-head RPN: {what} weights that are not float16 values given to the float16 kernels")
    return packed


@dataclass(frozen=True)
class HeadBranch:
    """One output conv of a head: 3x3 from its MID middle channels to ``weight.shape[0]`` channels of
    the merged head map from ``out_at`` on."""

    out_at: int
    weight: np.ndarray  # (n, MID, 3, 3)
    bias: np.ndarray    # (n,)


def pack_head_branches(branches: Sequence[HeadBranch], mid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> weights (G, MAX_OUT, 9, MID), biases (G, MAX_OUT) float32, zero past each branch's outputs,
    and the (G, 2) int32 table of (out_at, count)."""
    max_out = max(b.weight.shape[0] for b in branches)
    weights = np.zeros((len(branches), max_out, 9, mid), np.float32)
    biases = np.zeros((len(branches), max_out), np.float32)
    for g, b in enumerate(branches):
        n = b.weight.shape[0]
        if b.weight.shape != (n, mid, 3, 3):
            raise BackendError(f"head branch {g}: weight {b.weight.shape}; expected ({n}, {mid}, 3, 3)")
        weights[g, :n] = np.asarray(b.weight, np.float32).reshape(n, mid, 9).transpose(0, 2, 1)
        biases[g, :n] = b.bias
    table = np.array([(b.out_at, b.weight.shape[0]) for b in branches], np.int32)
    return weights, biases, table


def pack_head_weights_for_mma(weights: np.ndarray, precision: str) -> np.ndarray:
    """``pack_head_branches``' (G, MAX_OUT, 9, MID) weights -> (G, 9, HEAD_N, MID) for head_conv_mma
    (``tensor_core_values``), HEAD_N = MAX_OUT rounded up to a multiple of 8 (an n8 tile), zero past each
    branch's outputs."""
    g, max_out, taps, mid = weights.shape
    padded = np.zeros((g, taps, -(-max_out // 8) * 8, mid), np.float32)
    padded[:, :, :max_out] = weights.transpose(0, 2, 1, 3)
    return tensor_core_values(padded, precision, "head")


class MultiHeadRpnKernels:
    """Compiled ``neck_branch`` and ``head_conv`` with their packed weights on the device, on tensor cores
    (``neck_branch_mma``, ``head_conv_mma``) for fp16 and tf32 wherever the shapes fit them.

    ``precision``: the cuDNN engine's (fp16: float16 activations; tf32 and IEEE fp32: float32). ``neck``
    are (branch, weight in the ONNX layout, bias) triples; ``heads`` the output convs in merged-map order,
    branch g reading middle channels [g * mid, (g + 1) * mid)."""

    def __init__(self, neck: Sequence[tuple[NeckBranch, np.ndarray, np.ndarray]], heads: Sequence[HeadBranch],
                 mid: int, head_channels: int, precision: str) -> None:
        if precision not in PRECISIONS:
            raise BackendError(f"multi-head RPN kernels: precision {precision!r}; expected one of {PRECISIONS}")
        cp = cupy_module()
        self.neck = [branch for branch, _, _ in neck]
        self.precision, self.mid, self.head_channels = precision, mid, head_channels
        half, mma = precision == "fp16", precision in TENSOR_CORE_PRECISIONS
        self.io_dtype = np.dtype(np.float16 if half else np.float32)
        size = self.io_dtype.itemsize
        max_k = max(b.reduce for b in self.neck)
        head_w, head_b, table = pack_head_branches(heads, mid)
        self.num_branches, self.max_out = head_w.shape[0], head_w.shape[1]
        head_shared = (_CI_CHUNK * (4 * _TILE_X + 2) * (_TILE_X + 2) + self.max_out * 9 * _CI_CHUNK) * 4
        if _PIXELS * max_k * 4 > STATIC_SHARED_BYTES or head_shared > STATIC_SHARED_BYTES or mid % _CI_CHUNK:
            raise BackendError(f"multi-head RPN kernels: {max_k} neck products, {self.max_out} outputs a head branch "
                               f"or {mid} middle channels (a multiple of {_CI_CHUNK}) do not fit the kernels")
        head_n = -(-self.max_out // 8) * 8
        tile_h, tile_w = _MMA_TILE
        head_chunk = math.gcd(mid, _HEAD_CHUNK_BYTES // size)  # whole mma steps: mid is a multiple of 16
        mma_shared = ((tile_h + 2) * (tile_w + 2) + 9 * head_n) * (head_chunk + 8) * size
        # the output convs on tensor cores where their tile and weights fit the shared memory
        self.head_kernel = "head_conv_mma" if mma and mma_shared <= STATIC_SHARED_BYTES else "head_conv"
        # the neck branches on tensor cores where their rows come in whole stages and every branch's channels
        # are even (their outputs are written in pairs, at even offsets of the concat)
        even = all(b.out_channels % 2 == 0 for b in self.neck)
        stage_bytes = next((n for n in _NECK_STAGE_BYTES if all(b.in_channels * size % n == 0 for b in self.neck)),
                           _NECK_STAGE_BYTES[-1])
        stage = stage_bytes // size
        neck_fits = 2 * sum(_NECK_MMA_TILE) * (stage + 8) * size <= STATIC_SHARED_BYTES  # two stages of rows and weights
        self.neck_on_mma = [mma and even and neck_fits and b.in_channels % stage == 0 for b in self.neck]
        defines = define_flags(IO_HALF=int(half), PIXELS=_PIXELS, NECK_MAX_K=max_k, MID=mid, MAX_OUT=self.max_out,
                               TILE_X=_TILE_X, CI_CHUNK=_CI_CHUNK, BRANCH_INTS=len(BRANCH_COLUMNS), HEAD_N=head_n,
                               HEAD_CHUNK=head_chunk, MMA_TILE_H=tile_h, MMA_TILE_W=tile_w,
                               HEAD_MMA=int(self.head_kernel == "head_conv_mma"), NECK_MMA=int(any(self.neck_on_mma)),
                               NECK_COLS=_NECK_MMA_TILE[1], NECK_STAGE_BYTES=stage_bytes,
                               **slot_defines("BRANCH", BRANCH_COLUMNS))
        kernels = ("neck_branch", self.head_kernel, *(("neck_branch_mma",) if any(self.neck_on_mma) else ()))
        self._k = compile_kernels("multihead_rpn.cu", defines, kernels)
        with checked("multi-head RPN: uploading weights"):
            self._neck_weights = [(cp.asarray(pack_neck_weight_for_mma(w, b, precision) if on_mma
                                              else pack_neck_weight(w, b.down)),
                                   cp.asarray(np.asarray(bias, np.float32)))
                                  for (b, w, bias), on_mma in zip(neck, self.neck_on_mma)]
            self._head_weight = cp.asarray(pack_head_weights_for_mma(head_w, precision)
                                           if self.head_kernel == "head_conv_mma" else head_w)
            self._head_bias = cp.asarray(head_b)
            self._table = cp.asarray(table)
            cp.cuda.runtime.deviceSynchronize()

    def launch_neck(self, i: int, x: Any, concat: Any, offset: int, stream: Any) -> None:
        """Branch ``i``: ``x`` (B, h, w, cin) -> channels [offset, offset + cout) of ``concat`` (B, H, W, C)."""
        b = self.neck[i]
        check_device_array(x, f"neck branch {i} input", self.io_dtype, (None, None, None, b.in_channels))
        check_device_array(concat, "neck concat", self.io_dtype, (x.shape[0], None, None, None))
        batch, in_h, in_w, _ = x.shape
        _, out_h, out_w, channels = concat.shape
        weight, bias = self._neck_weights[i]
        args = (x, weight, bias, concat, np.int32(batch), np.int32(in_h), np.int32(in_w), np.int32(b.in_channels),
                np.int32(out_h), np.int32(out_w), np.int32(b.out_channels), np.int32(b.k), np.int32(b.down),
                np.int32(channels), np.int32(offset))
        pixels, taps = (out_h * out_w, 1) if b.down else (in_h * in_w, b.k * b.k)
        if self.neck_on_mma[i]:
            pair = 2 * self.io_dtype.itemsize
            if x.data.ptr % 16 or concat.data.ptr % pair or offset % 2 or channels % 2:
                raise BackendError(f"neck branch {i}: its input must be 16-byte aligned, the concat {pair}-byte aligned "
                                   "with an even offset and channel count")
            rows, cols = _NECK_MMA_TILE
            launch_kernel(self._k["neck_branch_mma"],
                          (grid_blocks(batch * pixels, rows), taps, grid_blocks(b.out_channels, cols)), 128, args, stream)
        else:
            launch_kernel(self._k["neck_branch"], (grid_blocks(batch * pixels, _PIXELS), taps), _NECK_THREADS, args,
                          stream)

    def launch_heads(self, mid: Any, out: Any, stream: Any) -> None:
        """``mid`` (B, H, W, branches * MID) -> the merged head map ``out`` (B, H, W, head_channels) float32."""
        check_device_array(mid, "head middle maps", self.io_dtype, (None, None, None, self.num_branches * self.mid))
        batch, h, w, _ = mid.shape
        check_device_array(out, "head map", np.float32, (batch, h, w, self.head_channels))
        if self.head_kernel == "head_conv_mma":
            if mid.data.ptr % 16:
                raise BackendError("head middle maps: the device buffer must be 16-byte aligned (copied in 16-byte rows)")
            tile_h, tile_w = _MMA_TILE
            grid, threads = (grid_blocks(w, tile_w), grid_blocks(h, tile_h), batch * self.num_branches), 16 * tile_h
        else:
            grid, threads = (grid_blocks(w, _TILE_X), grid_blocks(h, 4 * _TILE_X), batch * self.num_branches), _TILE_X**2
        launch_kernel(self._k[self.head_kernel], grid, threads,
                      (mid, self._head_weight, self._head_bias, self._table, out, np.int32(self.num_branches),
                       np.int32(h), np.int32(w), np.int32(self.head_channels)), stream)
