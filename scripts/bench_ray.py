#!/usr/bin/env python3
"""Throughput of ``pointpillars_trt.apps.distributed.detect_dataset`` over a folder with 1 vs N workers,
checking that every run writes byte-identical per-frame JSON files.

The folder's frames are repeated (``--repeat``) into a scratch folder so that a run lasts long enough
to measure. Prints one table row per worker count: frames, seconds, frames/s, speed-up, identical.
Not a test: numbers depend on the machine.

    python scripts/bench_ray.py --model M [--frames DIR] [--workers 1 2] [--gpus-per-worker 0|0.5|1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pointpillars_trt.apps.distributed import DEFAULT_GPUS_PER_WORKER, detect_dataset

ASSETS = Path(os.environ.get("PP_ASSETS", "assets"))  # the test assets folder (checkpoints/, kitti/), as the tests read it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ASSETS / "checkpoints/pointpillar_openpcdet_synthetic.pth"))
    parser.add_argument("--frames", default=str(ASSETS / "kitti/training/velodyne_fov"), help="folder of .bin frames")
    parser.add_argument("--repeat", type=int, default=3, help="copies of each frame")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--gpus-per-worker", type=float,
                        help=f"default: {DEFAULT_GPUS_PER_WORKER:g} with GPUs in the cluster, else 0")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--ray-address", help="default: a local cluster")
    args = parser.parse_args()
    if args.ray_address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local cluster on loopback only
    import ray

    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="pp-bench-ray-") as scratch:
            folder = Path(scratch) / "frames"
            folder.mkdir()
            for path in sorted(Path(args.frames).glob("*.bin")):
                for copy in range(args.repeat):
                    shutil.copy(path, folder / f"{path.stem}_{copy}.bin")
            print(f"{len(list(folder.iterdir()))} frames from {args.frames}, cluster {ray.cluster_resources()}")
            print(f"{'workers':>7} | {'frames':>6} | {'seconds':>7} | {'frames/s':>8} | {'speed-up':>8} | identical")
            print("-" * 62)
            reference: dict[str, bytes] | None = None
            base = 0.0
            for workers in args.workers:
                out = Path(scratch) / f"out_{workers}"
                summary = detect_dataset(str(folder), args.model, out, workers=workers,
                                         gpus_per_worker=args.gpus_per_worker, batch_size=args.batch_size,
                                         progress=False)
                files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
                reference = reference or files
                base = base or summary.frames_per_second
                print(f"{workers:>7} | {summary.frames:>6} | {summary.seconds:>7.2f} | {summary.frames_per_second:>8.2f} | "
                      f"{summary.frames_per_second / base:>8.2f} | {files == reference}"
                      + (f" ({len(summary.failures)} failed)" if summary.failures else ""))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
