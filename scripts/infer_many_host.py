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

import model_runner  # this folder's, as bench_paths: the scripts run from here
import pointpillars_trt.detector as detector_module
from bench_paths import linked_frames
from pointpillars_trt import PointPillars
from pointpillars_trt.detections import Detections, FrameStats
from pointpillars_trt.staging import INITIAL_POINTS_PER_FRAME, StagingBuffer


class StandInPipeline(model_runner.StandInPipeline):
    """The calls ``infer_many`` makes on a ``GpuPipeline``: ``detect_staged`` at the timeline's rate, and
    ``detect_batch`` from host arrays after copying each frame into the pipeline's own staging."""

    def __init__(self, timeline: model_runner.Timeline, found: list[Detections], max_batch: int) -> None:
        super().__init__(timeline, found)
        self.max_batch = max_batch
        self.staging = StagingBuffer(max_batch * INITIAL_POINTS_PER_FRAME)

    def fit_batch(self, frames: int) -> int:
        return self.max_batch  # as a GpuPipeline grown to it

    def detect_batch(self, frames: list[np.ndarray], post_config: object = None) -> list[Detections]:
        total = sum(len(points) for points in frames)
        if total > self.staging.capacity:  # grown as the pipeline grows its own
            self.staging = StagingBuffer(total)
        self.staging.reset()
        placed = []
        for points in frames:
            start = self.staging.allocate(len(points))
            assert start is not None
            self.staging.put(start, points)
            placed.append((len(points), start))
        return self.detect_staged(self.staging, placed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint (.pth) or model dir")
    parser.add_argument("--frames", type=Path, action="append", required=True, help="a folder of .bin files")
    parser.add_argument("--count", type=int, default=4_000, help="frames a run (hard links to the files)")
    parser.add_argument("--rate", type=float, default=4_200.0, help="the stand-in GPU's frames/s")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    opened = PointPillars.from_model_dir if args.model.is_dir() else PointPillars.from_checkpoint
    detector = opened(args.model, device="cpu")
    cpu_path = detector._impl
    empty = [Detections(np.zeros((0, 7), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), ("Car",),
                        FrameStats(num_points=0, num_pillars=0))]
    stand_in = StandInPipeline(model_runner.Timeline(args.rate), empty, args.batch)
    detector._impl, detector.device = stand_in, "cuda"  # its gpu_pipeline: the stand-in
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
    detector._impl, detector.device = cpu_path, "cpu"
    detector.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
