"""Where the GPU time of a frame goes: RPN engine variants, and every kernel of one pipeline frame.

    python3 scripts/profile_gpu.py [--frames DIR] [--model CKPT]

Prints two tables: (1) the RPN alone in ONNX Runtime's CUDA provider under each option that moves
its speed (precision, TF32, NHWC layout, ORT's own CUDA graph), timed with CUDA events over IO-bound
runs; (2) the kernels of one pipeline frame by GPU time, from the PyTorch profiler (CUPTI).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import cupy as cp
import numpy as np
import onnxruntime as ort

from pointpillars_trt.apps.bench.frames import folder_frame_sets, simulated_frame_sets
from pointpillars_trt.convert.checkpoint import load_checkpoint
from pointpillars_trt.config import load_config
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.graph_io import RPN_INPUT, RPN_OUTPUT
from pointpillars_trt.convert.weights import random_weights


def time_rpn(path: Path, options: dict[str, str], canvas: cp.ndarray, heads: cp.ndarray, runs: int = 50) -> float:
    stream = cp.cuda.Stream(non_blocking=True)
    provider = {"device_id": "0", "user_compute_stream": str(stream.ptr), **options}
    sess = ort.InferenceSession(str(path), providers=[("CUDAExecutionProvider", provider)])
    binding = sess.io_binding()
    binding.bind_input(RPN_INPUT, "cuda", 0, canvas.dtype, list(canvas.shape), canvas.data.ptr)
    binding.bind_output(RPN_OUTPUT, "cuda", 0, np.float32, list(heads.shape), heads.data.ptr)
    run_options = ort.RunOptions()
    run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    for _ in range(10):
        sess.run_with_iobinding(binding, run_options)
    stream.synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(runs):
        sess.run_with_iobinding(binding, run_options)
    stop.record(stream)
    stop.synchronize()
    del binding, sess  # the session synchronises its stream when destroyed: free it while the stream lives
    return cp.cuda.get_elapsed_time(start, stop) / runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames")
    parser.add_argument("--model")
    args = parser.parse_args()
    ort.set_default_logger_severity(3)
    if args.model:
        ckpt = load_checkpoint(args.model)
        cfg, weights = ckpt.config, ckpt.weights
    else:
        cfg = load_config("openpcdet_kitti_3class")
        weights = random_weights(cfg)
    tmp = Path(tempfile.mkdtemp())
    dirs = {p: export_model_dir(weights, cfg, tmp / p, precision=p, source={}) for p in ("fp32", "fp16")}
    frames = next(iter((folder_frame_sets([args.frames]).sets if args.frames else simulated_frame_sets()).values()))

    from pointpillars_trt.gpu_pipeline import GpuPipeline

    pipe = GpuPipeline(dirs["fp32"])
    pipe.detect(frames[0])
    canvas = pipe._canvas[:1]  # in the layout the pipeline's engine reads; the ONNX graphs take NHWC
    rpn = pipe._rpn
    assert rpn is not None  # opened with the pipeline
    if rpn.channels_first_input:
        canvas = cp.ascontiguousarray(canvas.transpose(0, 2, 3, 1))
    canvases = {"fp32": canvas, "fp16": canvas.astype(np.float16)}
    heads = cp.empty_like(pipe._heads[:1])
    print("| RPN variant | ms |\n| --- | --- |")
    for precision in ("fp32", "fp16"):
        for tf32 in ("0", "1") if precision == "fp32" else ("1",):
            for nhwc in ("0", "1"):
                for graph in ("0", "1"):
                    opts = {"use_tf32": tf32, "prefer_nhwc": nhwc, "enable_cuda_graph": graph}
                    try:
                        ms = f"{time_rpn(dirs[precision].rpn_path, opts, canvases[precision], heads):.3f}"
                    except Exception as exc:  # an option this ORT build refuses
                        ms = f"failed: {str(exc)[:80]}"
                    print(f"| {precision} tf32={tf32} nhwc={nhwc} ort_graph={graph} | {ms} |")

    import torch
    from torch.profiler import ProfilerActivity, profile

    for frame in frames[:3]:
        pipe.detect(frame)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pipe.detect(frames[1])
        torch.cuda.synchronize()
    print("\nstage times (CUDA events): " + "  ".join(f"{k} {v:.3f}" for k, v in pipe.last_timings.items()))
    totals: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            totals.setdefault(e.name[:90], []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    rows = sorted(((sum(v) / 1e3, len(v), k) for k, v in totals.items()), reverse=True)
    print("\n| kernel | calls | ms |\n| --- | --- | --- |")
    for total_ms, calls, name in rows[:25]:
        print(f"| {name} | {calls} | {total_ms:.4f} |")
    print(f"| all kernels | {sum(r[1] for r in rows)} | {sum(r[0] for r in rows):.4f} |")


if __name__ == "__main__":
    main()
