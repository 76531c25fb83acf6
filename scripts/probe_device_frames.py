#!/usr/bin/env python3
"""A frame given on the GPU against the same frame in host memory: ``detector(points)`` p50 and minimum (ms)
for each frame as a NumPy array and as a CuPy array, at batch 1, and whether both give the same boxes.

A device frame skips the host copy and the H2D copy; it pays for its copy kernel into the pipeline's buffers
and, for a multi-sweep model, for its time-lag check on the GPU (one kernel and a ~2 KB read that waits).
``--repeat K`` also times each frame's points repeated K times (a large frame). Not a test: numbers depend on
the machine.

    python scripts/probe_device_frames.py --model M.pth FRAME.bin [FRAME.bin ...] [--precision fp16]
        [--point-dim 5] [--iterations 400] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pointpillars_trt.detector import PointPillars
from pointpillars_trt.pointcloud_io import read_points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .pth checkpoint")
    parser.add_argument("frames", nargs="+", help=".bin frames")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--point-dim", type=int, default=4, help="float32 values a point in the files")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=0, help="also time each frame repeated this many times")
    args = parser.parse_args()

    import cupy as cp

    detector = PointPillars.from_checkpoint(args.model, precision=args.precision, device="cuda")
    print("| frame | points | NumPy p50 | NumPy min | CuPy p50 | CuPy min | same boxes |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for path in args.frames:
        points = read_points(path, point_dim=args.point_dim, columns=detector.cfg.num_point_columns)
        cases = [(Path(path).name, points)]
        if args.repeat > 1:
            cases.append((f"{Path(path).name} x{args.repeat}", np.concatenate([points] * args.repeat)))
        for name, host in cases:
            device = cp.asarray(host)
            cp.cuda.get_current_stream().synchronize()
            on_host, on_device = detector(host), detector(device)
            same = np.array_equal(on_host.boxes, on_device.boxes) and np.array_equal(on_host.scores, on_device.scores)
            host_p50, host_min = timed(lambda: detector(host), args.iterations)
            device_p50, device_min = timed(lambda: detector(device), args.iterations)
            print(f"| {name} | {len(host):,} | {host_p50:.3f} | {host_min:.3f} | {device_p50:.3f} | {device_min:.3f} "
                  f"| {'yes' if same else 'no'} |", flush=True)
    detector.close()
    return 0


def timed(call: Callable[[], object], iterations: int, warmup: int = 100) -> tuple[float, float]:
    """The median and the minimum (ms) of ``iterations`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


if __name__ == "__main__":
    raise SystemExit(main())
