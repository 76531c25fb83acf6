#!/usr/bin/env python3
"""infer's streaming runner with a stand-in GPU: the host's share of each output format, on any machine.

The real runner runs (``infer_with``: path expansion, reader processes and their checks, the dispatcher,
writer processes, reports, part files, the flush), with detectors whose ``gpu_pipeline`` books each batch on
a timeline shared by all pipelines at ``--rate`` frames/s and sleeps until the batch's end (the interpreter
lock released, as a CUDA synchronisation releases it), returning fixed detections of ``--boxes`` boxes.
What the table shows is what the host paths leave of that rate. ``--count`` frames are hard links to the
point files given, in a temporary folder; outputs go to a temporary folder too (under /dev/shm where there
is one). Not a test: numbers depend on the machine and its load.

    python scripts/model_runner.py FRAMES_DIR [--count 20000] [--rate 6000] [--formats json jsonl parquet none]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench_paths import linked_frames  # this folder's: the scripts run from here
from pointpillars_trt.apps import frames as runner_module
from pointpillars_trt.apps.cli import build_parser
from pointpillars_trt.apps.infer import infer_with
from pointpillars_trt.apps.run_size import RunSize
from pointpillars_trt.config import ModelConfig, load_config
from pointpillars_trt.detections import Detections, FrameStats


class Timeline:
    """The stand-in GPU: batches run one after another at ``rate`` frames/s, whichever pipeline sent them."""

    def __init__(self, rate: float) -> None:
        self.rate, self.free_at, self.lock = rate, 0.0, threading.Lock()

    def book(self, frames: int) -> float:
        with self.lock:
            self.free_at = max(time.perf_counter(), self.free_at) + frames / self.rate
            return self.free_at


class StandInPipeline:
    """``detect_staged`` as the runner calls it on a ``GpuPipeline``."""

    def __init__(self, timeline: Timeline, found: list[Detections]) -> None:
        self.timeline, self.found = timeline, found

    def detect_staged(self, staging: object, frames: list[tuple[int, int]], post_config: object = None) -> list[Detections]:
        time.sleep(max(0.0, self.timeline.book(len(frames)) - time.perf_counter()))
        return [self.found[i % len(self.found)] for i in range(len(frames))]


class StandInDetector:
    def __init__(self, cfg: ModelConfig, pipeline: StandInPipeline) -> None:
        self.cfg, self.gpu_pipeline, self.model = cfg, pipeline, None

    def close(self) -> None:
        pass


@contextlib.contextmanager
def host_staging() -> Iterator[None]:
    """Pageable staging in place of pinned memory, which needs CUDA (shared staging left unpinned)."""
    pinned, shared = runner_module.empty_pinned, runner_module.SharedArrays
    runner_module.empty_pinned = lambda shape, dtype: np.empty(shape, dtype)  # type: ignore[assignment]
    runner_module.SharedArrays = lambda pin: shared(pin=False)  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        runner_module.empty_pinned, runner_module.SharedArrays = pinned, shared  # type: ignore[misc]


def run(folder: Path, fmt: str, cfg: ModelConfig, args: argparse.Namespace, found: list[Detections]) -> float:
    """Seconds of one ``infer`` over ``folder`` (model load excluded: the stand-ins open at once)."""
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    out = scratch / "out"
    options = ["infer", str(folder), "--model", str(folder), "--no-progress"]
    if fmt != "none":
        options += ["--out", str(out), "--format", fmt]
    infer_args = build_parser().parse_args(options)
    infer_args.point_dim = cfg.num_point_columns
    timeline = Timeline(args.rate)
    start = time.perf_counter()
    try:
        with host_staging(), contextlib.redirect_stdout(io.StringIO()):
            infer_with(infer_args, lambda points, size: [StandInDetector(cfg, StandInPipeline(timeline, found))
                                                         for _ in range(size.pipelines)],
                       RunSize(batch=args.batch, pipelines=args.pipelines), gpu=True)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frames", type=Path, help="a folder of .bin point files (e.g. KITTI velodyne_fov)")
    parser.add_argument("--count", type=int, default=20_000, help="frames a run (hard links to the files)")
    parser.add_argument("--rate", type=float, default=6_000.0, help="the stand-in GPU's frames/s")
    parser.add_argument("--boxes", type=int, default=16, help="boxes a frame")
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--formats", nargs="+", default=["json", "jsonl", "parquet", "none"],
                        choices=["json", "kitti", "jsonl", "parquet", "none"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cfg = load_config("openpcdet_kitti_3class")
    rng = np.random.default_rng(0)
    found = [Detections(rng.normal(0, 20, (args.boxes, 7)).astype(np.float32), rng.random(args.boxes).astype(np.float32),
                        rng.integers(0, len(cfg.classes), args.boxes), cfg.classes,
                        FrameStats(num_points=19_000, num_pillars=5_700))
             for _ in range(50)]
    with tempfile.TemporaryDirectory() as scratch:
        frames = linked_frames(args.frames, Path(scratch) / "frames", args.count)
        print(f"{args.count} frames a run, stand-in GPU at {args.rate:,.0f} frames/s, {args.pipelines} pipelines x "
              f"batch {args.batch}, {os.cpu_count()} CPU cores\n")
        print("| --format | " + " | ".join(f"round {i + 1} frames/s" for i in range(args.rounds)) + " |")
        print("| --- |" + " ---: |" * args.rounds)
        for fmt in args.formats:
            rates = [args.count / run(frames, fmt, cfg, args, found) for _ in range(args.rounds)]
            print(f"| {fmt} | " + " | ".join(f"{rate:,.0f}" for rate in rates) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
