#!/usr/bin/env python3
"""Where one frame's host time goes on the GPU path: ``detect`` at batch 1 split into its parts.

For each frame given, with the pipeline's per-stage timings off and on, prints the medians (us) of:
e2e (``detector(points)``), the input checks, ``submit`` (the copy into pinned staging, the H2D call,
the graph launch), the wait for the GPU, ``collect`` (the timings' queries and the unpacking), and
alone: the copy into pinned staging, the pipeline's H2D copy with its synchronisation, and the graph
launch on the host. Not a test: numbers depend on the machine.

    python scripts/probe_host.py --model M.pth FRAME.bin [FRAME.bin ...] [--precision fp16] [--iterations 400]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pointpillars_trt.convert.export import build_model_dir
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.gpu_pipeline import FRAME, TIMED_FRAME
from pointpillars_trt.pointcloud_io import read_points
from pointpillars_trt.points import as_host_points

PARTS = ("e2e", "checks", "submit", "wait", "collect", "staging copy", "h2d+sync", "graph launch")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .pth checkpoint (built here) or a model dir")
    parser.add_argument("frames", nargs="+", help=".bin frames")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--iterations", type=int, default=400)
    args = parser.parse_args()
    model = Path(args.model)
    if not model.is_dir():
        model = build_model_dir(model, Path(tempfile.mkdtemp()) / "model", precision=args.precision).path
    detector = PointPillars.from_model_dir(model, device="cuda")
    pipeline = detector.gpu_pipeline
    print(f"| frame | stage timings | {' | '.join(PARTS)} |\n| --- | --- |{' ---: |' * len(PARTS)}")
    for frame in args.frames:
        points = read_points(frame)
        for _ in range(50):
            detector(points)
        for timed in (False, True):
            pipeline.stage_timings = timed
            found = {part: statistics.median(values) * 1e6 for part, values in measure(detector, points,
                                                                                           args.iterations).items()}
            print(f"| {Path(frame).name} ({len(points):,} points) | {'on' if timed else 'off'} | "
                  + " | ".join(f"{found[part]:.1f}" for part in PARTS) + " |", flush=True)
    return 0


def measure(detector: PointPillars, points: object, iterations: int) -> dict[str, list[float]]:
    pipeline = detector.gpu_pipeline
    clock = time.perf_counter
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    for _ in range(iterations):
        start = clock()
        detector(points)
        times["e2e"].append(clock() - start)
        start = clock()
        frame = as_host_points(points, columns=detector.cfg.num_point_columns)
        checked = clock()
        pipeline.submit([frame])
        submitted = clock()
        pipeline.stream.synchronize()
        done = clock()
        pipeline.collect()
        collected = clock()
        times["checks"].append(checked - start)
        times["submit"].append(submitted - checked)
        times["wait"].append(done - submitted)
        times["collect"].append(collected - done)
        staging = pipeline._staging
        start = clock()
        staging.reset()
        first = staging.allocate(len(frame))
        staging.put(first, frame)
        used = staging.write_header([(len(frame), first)])
        copied = clock()
        pipeline._copy_in(staging, used)  # the pipeline's own H2D copy
        pipeline.stream.synchronize()
        moved = clock()
        graph = pipeline._graphs[(TIMED_FRAME if pipeline.stage_timings else FRAME, 1)]
        graph.launch(pipeline.stream)
        launched = clock()
        pipeline.stream.synchronize()
        times["staging copy"].append(copied - start)
        times["h2d+sync"].append(moved - copied)
        times["graph launch"].append(launched - moved)
    return times


if __name__ == "__main__":
    raise SystemExit(main())
