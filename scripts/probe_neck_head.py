#!/usr/bin/env python3
"""The float16 neck-and-heads kernels (mma.sync; on compute capability 9.0 also wgmma) over their launch
shapes (warps a block, cp.async stages, and blocks an SM for mma.sync or persistent blocks a cell position
for wgmma, 0: SMs / 16) at KITTI sizes and random weights: GPU ms a launch (best of 3 rounds of 50 behind
a held stream) and the largest difference from the mma.sync kernel's default shape, of the largest head
value. Needs CuPy and a GPU. Not a test.

    python scripts/probe_neck_head.py [--batches 1,8] [--kernels f16,wgmma] [--f16-shapes default]
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

import numpy as np

from pointpillars_trt.kernels.hold import gpu_ms
from pointpillars_trt.kernels.neck_head import NeckBranch, NeckHeadParams, NeckHeadStage, NeckHeadWeights

KITTI = NeckHeadParams((NeckBranch(64, 128, 1), NeckBranch(128, 128, 2), NeckBranch(256, 128, 4)), 248, 216, 72, True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--kernels", default="f16,wgmma")
    ap.add_argument("--f16-shapes", choices=("default", "all"), default="all",
                    help="the mma.sync kernel's default shape only, or all 30")
    args = ap.parse_args()
    import cupy as cp

    rng = np.random.default_rng(0)
    weights = NeckHeadWeights(
        tuple((0.05 * rng.standard_normal((b.in_channels, b.up_channels, b.stride, b.stride))).astype(np.float32)
              for b in KITTI.branches),
        tuple((0.1 * rng.standard_normal(b.up_channels)).astype(np.float32) for b in KITTI.branches),
        (0.05 * rng.standard_normal((72, 384))).astype(np.float32), (0.1 * rng.standard_normal(72)).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    f16_default = ((KITTI.warps, KITTI.stages, KITTI.min_blocks),)
    shapes = {"f16": f16_default if args.f16_shapes == "default" else itertools.product((4, 6, 8, 12, 16), (2, 3, 4), (1, 2)),
              "wgmma": ((w, s, b) for w, s, b in itertools.product((4, 8, 12), (2, 3, 4), (0, 4, 6, 7))
                        if replace(KITTI, warps=w, stages=s, min_blocks=1).wgmma_fits)}
    kernels = [k for k in args.kernels.split(",") if k != "wgmma" or cp.cuda.Device().compute_capability == "90"]
    print("| batch | kernel | warps | stages | blocks an SM (f16) or a position (wgmma) | ms | max diff / max|default| |\n"
          "| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    runs = [(kernel, *shape) for kernel in kernels for shape in shapes[kernel]]
    for batch in (int(b) for b in args.batches.split(",")):
        feats = [cp.asarray(np.maximum(rng.standard_normal(KITTI.feature_shape(i, batch)), 0).astype(np.float16))
                 for i in range(len(KITTI.branches))]
        out = cp.zeros(KITTI.output_shape(batch), np.float32)
        NeckHeadStage(KITTI, weights).launch(feats, out, stream)
        stream.synchronize()
        default = out.copy()
        scale = float(cp.abs(default).max())
        for kernel, warps, stages, blocks in runs:
            wgmma = kernel == "wgmma"
            params = replace(KITTI, wgmma=wgmma, warps=warps, stages=stages, min_blocks=1 if wgmma else blocks,
                             blocks_per_position=blocks if wgmma else 0)
            stage = NeckHeadStage(params, weights)
            out.fill(np.nan)  # a shape that writes nothing cannot pass for the default
            stage.launch(feats, out, stream)
            stream.synchronize()
            diff = float(cp.nan_to_num(cp.abs(out - default), nan=np.inf).max()) / scale
            best = gpu_ms(lambda stage=stage: stage.launch(feats, out, stream), stream, iterations=50)
            print(f"| {batch} | {kernel} | {warps} | {stages} | {blocks} | {best:.4f} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
