#!/usr/bin/env python3
"""A conv that computes only where a frame's pillars reach (``sparse_conv.cu`` beside this script), per
shape of KITTI's first block: its error against a float64 NumPy conv, its live flags against NumPy
dilations, and its GPU time with no live cell, a given share of live canvas cells, and every cell live.
Needs CuPy and a GPU with mma.sync m16n8k16 (compute capability >= 8.0). Not a test: a probe of whether
the fp16 engine should run its first block this way (on one H200 it should not: see docs/PERF_NOTES.md).

    python scripts/probe_sparse_conv.py [--occupancy 0.02] [--batches 1,8] [--tile-rows 2]
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

import numpy as np

from pointpillars_trt.kernels._launch import COMPILE_OPTIONS
from pointpillars_trt.kernels.hold import gpu_ms

_HERE = Path(__file__).resolve().parent
CHANNELS = 64
TILE_COLS = 8  # a warp's output cells: TILE_ROWS x 8 (--tile-rows)
_FILTER_BYTES = CHANNELS * (9 * CHANNELS + 8) * 2
#: A block's warps by (tile rows, stride), one block an SM: as many windows as fit beside the filter in
#: shared memory, and (4 rows: two MMA tiles' sums, ~150 registers a thread) in the register file.
_WARPS = {(2, 1): 16, (2, 2): 8, (4, 1): 12, (4, 2): 6}


def window_bytes(stride: int, rows: int) -> int:
    return ((rows - 1) * stride + 3) * ((TILE_COLS - 1) * stride + 3) * (CHANNELS * 2 + 16)


def warps(stride: int, rows: int) -> int:
    return _WARPS[(rows, stride)]


def shared_bytes(stride: int, rows: int) -> int:
    return _FILTER_BYTES + warps(stride, rows) * window_bytes(stride, rows)


def out_hw(in_hw: tuple[int, int], stride: int) -> tuple[int, int]:
    return tuple((d - 1) // stride + 1 for d in in_hw)  # type: ignore[return-value]


def compile_kernel(cp, in_hw: tuple[int, int], stride: int, from_canvas: bool, rows: int):  # type: ignore[no-untyped-def]
    header = (resources.files("pointpillars_trt") / "kernels" / "cuda" / "mma_sync.cuh").read_text()
    source = (_HERE / "sparse_conv.cu").read_text().replace('#include "mma_sync.cuh"', header)
    (oh, ow) = out_hw(in_hw, stride)
    defines = dict(CHANNELS=CHANNELS, STRIDE=stride, IN_H=in_hw[0], IN_W=in_hw[1], OUT_H=oh, OUT_W=ow,
                   FROM_CANVAS=int(from_canvas), WARPS=warps(stride, rows), TILE_ROWS=rows)
    kernel = cp.RawModule(code=source, options=COMPILE_OPTIONS + tuple(f"-D{k}={v}" for k, v in defines.items())
                          ).get_function("sparse_conv")
    kernel.max_dynamic_shared_size_bytes = shared_bytes(stride, rows)
    return kernel


def background(w: np.ndarray, b: np.ndarray, before: np.ndarray | None) -> np.ndarray:
    """The output at a cell whose whole window holds ``before`` (None: the empty canvas)."""
    total = b.astype(np.float64)
    if before is not None:
        total = total + w.astype(np.float64).sum(axis=(1, 2)) @ before.astype(np.float64)
    return np.maximum(total, 0.0).astype(np.float16)


def dense(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """float64 conv (KRSC filter, padding 1) + bias + ReLU, float16 out."""
    bsz, h, wd, c = x.shape
    p, q = out_hw((h, wd), stride)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((bsz, p, q, w.shape[0])) + b.astype(np.float64)
    for r in range(3):
        for s in range(3):
            tap = xp[:, r: r + stride * (p - 1) + 1: stride, s: s + stride * (q - 1) + 1: stride]
            out += tap @ w[:, r, s, :].astype(np.float64).T
    return np.maximum(out, 0.0).astype(np.float16)


def dilated(live: np.ndarray, stride: int, border: bool) -> np.ndarray:
    bsz, h, w = live.shape
    p, q = out_hw((h, w), stride)
    padded = np.pad(live, ((0, 0), (1, 1), (1, 1)), constant_values=border)
    out = np.zeros((bsz, p, q), bool)
    for r in range(3):
        for s in range(3):
            out |= padded[:, r: r + stride * (p - 1) + 1: stride, s: s + stride * (q - 1) + 1: stride]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--occupancy", type=float, default=0.02, help="share of canvas cells with a pillar (camera view: ~0.02)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tile-rows", type=int, choices=(2, 4), default=2, help="a warp's rows of 8 output cells")
    args = ap.parse_args()
    import cupy as cp

    rng = np.random.default_rng(0)
    convs = [((rng.standard_normal((CHANNELS, 3, 3, CHANNELS)) * np.sqrt(2 / 576)).astype(np.float16),
              (0.1 * rng.standard_normal(CHANNELS)).astype(np.float16)) for _ in range(2)]
    shapes = [((496, 432), 2, True), ((248, 216), 1, False)]  # KITTI: the canvas's conv, then block 1's
    rows = args.tile_rows
    kernels = [compile_kernel(cp, *shape, rows) for shape in shapes]
    bgs = [background(*convs[0], None)]
    bgs.append(background(*convs[1], bgs[0]))
    stream = cp.cuda.Stream(non_blocking=True)
    print("| conv | batch | live cells | max error / max ref | flags | GPU us |\n| --- | --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        for fill in ("none", f"{args.occupancy:g}", "all"):
            canvas = np.zeros((batch, 496, 432, CHANNELS), np.float16)
            occupied = (rng.random((batch, 496, 432)) < (0 if fill == "none" else 1 if fill == "all" else args.occupancy))
            canvas[occupied] = np.abs(rng.standard_normal((int(occupied.sum()), CHANNELS)))
            with stream:  # (a non-blocking stream does not wait for the null stream's copies)
                x = cp.asarray(canvas)
                ys = [cp.empty((batch, *out_hw(hw, s), CHANNELS), np.float16) for hw, s, _ in shapes]
                lives = [cp.empty((batch, *out_hw(hw, s)), np.uint8) for hw, s, _ in shapes]
                convs_d = [(cp.asarray(w.view(np.uint16)), cp.asarray(b.astype(np.float32)),
                            cp.asarray(bg.view(np.uint16))) for (w, b), bg in zip(convs, bgs)]
            inputs = [(x, lives[0]), (ys[0], lives[0])]
            runs = []
            for k, ((hw, s, _), kernel) in enumerate(zip(shapes, kernels)):
                tiles = batch * -(-out_hw(hw, s)[0] // rows) * -(-out_hw(hw, s)[1] // TILE_COLS)
                grid = min(cp.cuda.Device().attributes["MultiProcessorCount"], -(-tiles // warps(s, rows)))
                args_k = (*inputs[k], *convs_d[k], np.int32(batch), ys[k], lives[k])
                runs.append(lambda kernel=kernel, grid=grid, a=args_k, s=s: kernel(
                    (grid,), (warps(s, rows) * 32,), a, shared_mem=shared_bytes(s, rows), stream=stream))
            for run in runs:
                run()
            stream.synchronize()
            got0, got1 = cp.asnumpy(ys[0]), cp.asnumpy(ys[1])
            checked = batch == 1  # (the float64 NumPy convs of a batch of 8 take minutes)
            want0 = dense(canvas, *convs[0], 2) if checked else None
            want1 = dense(got0, *convs[1], 1) if checked else None
            live0 = dilated(np.any(canvas != 0, axis=-1), 2, border=False)
            flags = [np.array_equal(cp.asnumpy(lives[0]), live0),
                     np.array_equal(cp.asnumpy(lives[1]), dilated(live0, 1, border=True))]
            for k, (got, want, live) in enumerate(((got0, want0, live0), (got1, want1, None))):
                err = (f"{np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30):.1e}"
                       if want is not None else "-")
                share = float(live0.mean()) if live is not None else float(cp.asnumpy(lives[1]).mean())
                us = gpu_ms(runs[k], stream, iterations=20) * 1000
                print(f"| {shapes[k][0][0]}x{shapes[k][0][1]} s{shapes[k][1]} | {batch} | {share:.3f} | {err} "
                      f"| {'right' if flags[k] else 'WRONG'} | {us:.1f} |")


if __name__ == "__main__":
    main()
