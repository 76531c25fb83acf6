#!/usr/bin/env python3
"""The float16 neck-and-heads kernel over its launch shapes (warps a block, cp.async stages, blocks an
SM) at KITTI sizes and random weights: GPU ms a launch (best of 3 rounds of 50 behind a held stream) and
whether every shape gives the default's bytes. Needs CuPy and a GPU. Not a test.

    python scripts/probe_neck_head.py [--batches 1,8]
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    import cupy as cp

    rng = np.random.default_rng(0)
    weights = NeckHeadWeights(
        tuple((0.05 * rng.standard_normal((b.in_channels, b.up_channels, b.stride, b.stride))).astype(np.float32)
              for b in KITTI.branches),
        tuple((0.1 * rng.standard_normal(b.up_channels)).astype(np.float32) for b in KITTI.branches),
        (0.05 * rng.standard_normal((72, 384))).astype(np.float32), (0.1 * rng.standard_normal(72)).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    print("| batch | warps | stages | blocks an SM | ms | bytes as the default's |\n| ---: | ---: | ---: | ---: | ---: | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        feats = [cp.asarray(np.maximum(rng.standard_normal(KITTI.feature_shape(i, batch)), 0).astype(np.float16))
                 for i in range(len(KITTI.branches))]
        out = cp.zeros(KITTI.output_shape(batch), np.float32)
        NeckHeadStage(KITTI, weights).launch(feats, out, stream)
        stream.synchronize()
        default = out.copy()
        for warps, stages, blocks in itertools.product((4, 6, 8, 12, 16), (2, 3, 4), (1, 2)):
            stage = NeckHeadStage(replace(KITTI, warps=warps, stages=stages, min_blocks=blocks), weights)
            out.fill(np.nan)  # a shape that writes nothing cannot pass for the default
            stage.launch(feats, out, stream)
            stream.synchronize()
            same = bool(cp.array_equal(out, default))
            best = gpu_ms(lambda stage=stage: stage.launch(feats, out, stream), stream, iterations=50)
            print(f"| {batch} | {warps} | {stages} | {blocks} | {best:.4f} | {'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
