"""Whether several pipelines together are bound by the GPU or by the host, and which kernels fill the GPU.

    python3 scripts/profile_throughput.py --model CKPT --frames DIR [--pipelines 4] [--batch 8] [--calls 40]

Runs ``--pipelines`` fp16 pipelines, one host thread each, ``--calls`` batches of ``--batch`` frames each
(as ``bench``'s throughput rows do), once untimed by CUPTI and once under the PyTorch profiler (CUPTI).
Prints the frames/s of both, the share of the profiled span in which any kernel or copy ran (near
100 %: the GPU is what bounds the rate; lower: the host threads leave it idle), and the kernels' GPU
time a frame by kind. Kernels that overlap are each counted in full, so the kinds add up to more than
the span when pipelines share the GPU; against one pipeline's the same numbers show what sharing costs.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import cupy as cp
import numpy as np

from pointpillars_trt.apps.bench.frames import folder_frame_sets
from pointpillars_trt.apps.bench.measure import throughput_batches
from pointpillars_trt.convert.checkpoint import load_checkpoint
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.gpu_pipeline import GpuPipeline
from pointpillars_trt.model_dir import ModelDir

#: Kernel kinds by name prefix (a single-head model's); the rest are the RPN's cuDNN convolutions, and for
#: a multi-head model also its head kernels.
KINDS = {"vox_": "voxelize", "pfn": "pfn", "scatter": "scatter", "neck_head": "neck and heads", "pp_": "post-process",
         "Memcpy": "copies", "Memset": "memsets"}


def kind_of(name: str) -> str:
    return next((kind for prefix, kind in KINDS.items() if name.startswith(prefix)), "cuDNN convolutions")


def run_all(pipes: Sequence[GpuPipeline], groups: Sequence[list[np.ndarray]], calls: int) -> float:
    """Seconds for every pipeline to run ``calls`` batches, each on its own thread."""
    def work(pipe: GpuPipeline, index: int) -> None:
        for i in range(calls):
            pipe.detect_batch(groups[(index + i) % len(groups)])

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(pipe, k)) for k, pipe in enumerate(pipes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cp.cuda.Device().synchronize()
    return time.perf_counter() - start


def busy_share(intervals: Sequence[tuple[float, float]]) -> float:
    """The share of the span from the first start to the last end covered by at least one interval."""
    ordered = sorted(intervals)
    covered, start, end = 0.0, *ordered[0]
    for s, e in ordered[1:]:
        if s > end:
            covered, start, end = covered + end - start, s, e
        else:
            end = max(end, e)
    covered += end - start
    return covered / (max(e for _, e in ordered) - ordered[0][0])


def throughput_options(calls: int) -> argparse.ArgumentParser:
    """The options of the scripts that run pipelines side by side (``calls``: batches a pipeline a run)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--frames", required=True)
    parser.add_argument("--pipelines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--calls", type=int, default=calls)
    return parser


def fp16_model_and_batches(args: argparse.Namespace) -> tuple[ModelDir, list[list[np.ndarray]]]:
    """The checkpoint exported for the fp16 pipeline, and the frames in ``bench``'s throughput batches."""
    ckpt = load_checkpoint(args.model)
    model = export_model_dir(ckpt.weights, ckpt.config, Path(tempfile.mkdtemp()) / "fp16", precision="fp16", source={})
    frames = next(iter(folder_frame_sets([args.frames]).sets.values()))
    return model, throughput_batches(frames, args.batch)


def main() -> None:
    args = throughput_options(calls=40).parse_args()
    model, groups = fp16_model_and_batches(args)
    b = args.batch
    pipes = [GpuPipeline(model, max_batch=b) for _ in range(args.pipelines)]
    run_all(pipes, groups, 5)  # graphs captured
    made = args.pipelines * b * args.calls
    print(f"{args.pipelines} pipelines x batch {b}: {made / run_all(pipes, groups, args.calls):.0f} frames/s")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        seconds = run_all(pipes, groups, args.calls)
    print(f"under the profiler: {made / seconds:.0f} frames/s")
    events = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type.name == "CUDA"]
    span_us = max(e for _, e, _ in events) - min(s for s, _, _ in events)
    print(f"GPU busy {100 * busy_share([(s, e) for s, e, _ in events]):.1f} % of {span_us / 1e3:.1f} ms "
          f"({span_us / made:.1f} us a frame)")
    totals: dict[str, float] = {}
    for s, e, name in events:
        totals[kind_of(name)] = totals.get(kind_of(name), 0.0) + e - s
    print("\n| kernels | GPU us a frame |\n| --- | ---: |")
    for kind, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {us / made:.1f} |")


if __name__ == "__main__":
    main()
