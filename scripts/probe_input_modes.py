#!/usr/bin/env python3
"""A frame's e2e (``GpuPipeline.detect``, fp16, batch 1) by how its points reach the pipeline.

For each folder of frames: pageable arrays taken in turn (as ``bench`` does), one pageable frame over and
over (its rows hot in the host's caches), page-locked arrays in turn (read in place), and pageable arrays
in turn copied straight from the caller's array whatever their size (``DIRECT_COPY_BYTES`` 0: the driver
stages them) instead of through the pipeline's pinned staging below 1 MiB. Prints, per mode and round,
the e2e p50 and p99 and the p50 of the input's host part (``_stage_host``: staging copy or direct copy
call, header, H2D call). Needs a CUDA GPU, CuPy and the cuDNN engine. Not a test: numbers depend on the
machine.

    python scripts/probe_input_modes.py --model M.pth FOLDER [FOLDER ...] [--iterations 1500] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import pointpillars_trt.gpu_pipeline as gpu_pipeline
from pointpillars_trt.apps.bench.frames import folder_frame_sets, page_locked_frame_sets
from pointpillars_trt.convert.checkpoint import load_checkpoint
from pointpillars_trt.convert.export import export_model_dir

WARMUP = 300


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .pth checkpoint")
    parser.add_argument("folders", nargs="+", help="folders of .bin frames")
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    checkpoint = load_checkpoint(args.model)
    model = export_model_dir(checkpoint.weights, checkpoint.config, Path(tempfile.mkdtemp()) / "model",
                             precision="fp16", source={"probe": args.model})
    pipeline = gpu_pipeline.GpuPipeline(model)
    input_times: list[float] = []
    stage_host = pipeline._stage_host

    def timed_stage_host(*a: Any, **k: Any) -> list[int]:
        start = time.perf_counter()
        counts = stage_host(*a, **k)
        input_times.append(time.perf_counter() - start)
        return counts

    pipeline._stage_host = timed_stage_host  # type: ignore[method-assign]

    def run(frames: Sequence[np.ndarray]) -> tuple[float, float, float]:
        for i in range(WARMUP):
            pipeline.detect(frames[i % len(frames)])
        input_times.clear()
        e2e = []
        for i in range(args.iterations):
            start = time.perf_counter()
            pipeline.detect(frames[i % len(frames)])
            e2e.append(time.perf_counter() - start)
        return (statistics.median(e2e) * 1e6, float(np.percentile(e2e, 99)) * 1e6,
                statistics.median(input_times) * 1e6)

    direct_default = gpu_pipeline.DIRECT_COPY_BYTES
    for folder in args.folders:
        sets = folder_frame_sets([folder]).sets
        name, frames = next(iter(sets.items()))
        locked = next(iter(page_locked_frame_sets(sets).values()))
        modes: list[tuple[str, Sequence[np.ndarray], int]] = [
            ("pageable, in turn", frames, direct_default), ("pageable, one frame", frames[:1], direct_default),
            ("page-locked, in turn", locked, direct_default), ("pageable, in turn, all copied directly", frames, 0)]
        print(f"\n## {name}\n\n| mode | round | e2e p50 us | e2e p99 us | input's host part p50 us |\n"
              "| --- | ---: | ---: | ---: | ---: |", flush=True)
        for round_ in range(1, args.rounds + 1):
            for label, mode_frames, direct_bytes in modes:
                gpu_pipeline.DIRECT_COPY_BYTES = direct_bytes
                try:
                    p50, p99, host = run(mode_frames)
                finally:
                    gpu_pipeline.DIRECT_COPY_BYTES = direct_default
                print(f"| {label} | {round_} | {p50:.1f} | {p99:.1f} | {host:.1f} |", flush=True)
    pipeline.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
