#!/usr/bin/env python3
"""The CPU path's stages on saturated frames: each frame as read and with its intensities scaled.

A frame of 0-255 intensities fed to a model trained on 0-1 reflectance lets thousands of anchors pass
the score threshold, and the NMS of the post-process meets up to its pre-NMS top-k candidates. For each
frame and intensity factor prints the boxes found and each stage's best wall time (ms) over the runs.
Not a test: numbers depend on the machine.

    python scripts/bench_cpu_post.py --model M.pth FRAME.bin [FRAME.bin ...] [--scales 1 255] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import warnings
from pathlib import Path

from pointpillars_trt.convert.export import build_model_dir
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import InputWarning
from pointpillars_trt.pointcloud_io import read_points

STAGES = ("voxelize", "pfn", "scatter", "rpn", "postprocess", "total")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .pth checkpoint (built here) or a model dir")
    parser.add_argument("frames", nargs="+", help=".bin frames")
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 255.0], help="intensity factors")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    model = Path(args.model)
    if not model.is_dir():
        model = build_model_dir(model, Path(tempfile.mkdtemp()) / "model").path
    warnings.simplefilter("ignore", InputWarning)  # the 0-255 intensities are the point here
    print(f"| frame | intensity x | boxes | {' | '.join(STAGES)} |\n| --- | ---: | ---: |{' ---: |' * len(STAGES)}")
    with PointPillars.from_model_dir(model, device="cpu") as detector:
        for frame in args.frames:
            for scale in args.scales:
                points = read_points(frame, intensity_scale=scale)
                best = dict.fromkeys(STAGES, math.inf)
                for _ in range(args.runs):
                    boxes = len(detector(points).scores)
                    best = {stage: min(best[stage], detector.last_timings[stage]) for stage in STAGES}
                print(f"| {Path(frame).name} | {scale:g} | {boxes} | " + " | ".join(f"{best[s]:.1f}" for s in STAGES)
                      + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
