#!/usr/bin/env python3
"""``PointPillars.infer_many`` with a stand-in GPU: the host's share of the Python API's streaming path, on
any machine.

A detector opened on the CPU from ``--model`` gets a stand-in GPU pipeline (``model_runner.Timeline``:
batches at ``--rate`` frames/s, sleeping with the interpreter lock released as a CUDA synchronisation
does). ``infer_many`` then runs as on a GPU: groups read into their staging buffers (pageable here: pinned
memory needs CUDA) and run by ``detect_staged``; a group that cannot be (a frame without room) goes
through ``detect_batch``, which the stand-in runs after copying each frame into a staging buffer as
``GpuPipeline`` does. What the table shows is what the host leaves of the rate. Not a test: numbers
depend on the machine and its load.

    python scripts/infer_many_host.py --model M.pth --frames CAMERA_DIR --frames FULL_DIR [--count 4000]
        [--rate 4200] [--batch 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import pointpillars_trt.detector as detector_module
from bench_paths import linked_frames  # this folder's: the scripts run from here
from model_runner import Timeline
from pointpillars_trt import PointPillars
from pointpillars_trt.detections import Detections, FrameStats
from pointpillars_trt.staging import StagingBuffer


class StandInPipeline:
    """The calls ``infer_many`` makes on a ``GpuPipeline``, at the timeline's rate."""

    def __init__(self, timeline: Timeline, max_batch: int) -> None:
        self.timeline, self.max_batch = timeline, max_batch
        self.staging = StagingBuffer(max_batch * 131_072)
        self.empty = Detections(np.zeros((0, 7), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64),
                                ("Car",), FrameStats(num_points=0, num_pillars=0))

    def fit_batch(self, frames: int) -> int:
        return self.max_batch  # as a GpuPipeline grown to it

    def detect_staged(self, staging: object, frames: list[tuple[int, int]], post_config: object = None) -> list[Detections]:
        time.sleep(max(0.0, self.timeline.book(len(frames)) - time.perf_counter()))
        return [self.empty] * len(frames)

    def detect_batch(self, frames: list[np.ndarray], post_config: object = None) -> list[Detections]:
        """``GpuPipeline.detect_batch`` from host arrays: each frame copied into the pipeline's staging."""
        self.staging.reset()
        placed = []
        for points in frames:
            start = self.staging.allocate(len(points))
            if start is not None:
                self.staging.put(start, points)
            placed.append((len(points), start or 0))
        return self.detect_staged(self.staging, placed)

    def close(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint (.pth) or model dir")
    parser.add_argument("--frames", type=Path, action="append", required=True, help="a folder of .bin files")
    parser.add_argument("--count", type=int, default=4_000, help="frames a run (hard links to the files)")
    parser.add_argument("--rate", type=float, default=4_200.0, help="the stand-in GPU's frames/s")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    opened = PointPillars.from_model_dir if args.model.is_dir() else PointPillars.from_checkpoint
    detector = opened(args.model, device="cpu")
    timeline = Timeline(args.rate)
    detector._impl, detector.device = StandInPipeline(timeline, args.batch), "cuda"  # gpu_pipeline: the stand-in
    detector_module.empty_pinned = lambda shape, dtype: np.empty(shape, dtype)  # type: ignore[assignment]
    print(f"{args.count} frames a run, stand-in GPU at {args.rate:,.0f} frames/s, batch {args.batch}\n")
    print("| frames | " + " | ".join(f"round {i + 1} frames/s" for i in range(args.rounds)) + " |")
    print("| --- |" + " ---: |" * args.rounds)
    with tempfile.TemporaryDirectory() as scratch:
        for index, source in enumerate(args.frames):
            folder = linked_frames(source, Path(scratch) / str(index), args.count)
            paths = sorted(str(path) for path in folder.iterdir())
            rates = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                done = sum(1 for result in detector.infer_many(paths, batch_size=args.batch) if result.error is None)
                rates.append(done / (time.perf_counter() - start))
            print(f"| {source.name} | " + " | ".join(f"{rate:,.0f}" for rate in rates) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
