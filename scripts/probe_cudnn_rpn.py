#!/usr/bin/env python3
"""Benchmark the cuDNN RPN engine on the KITTI config: GPU time per batch and precision, error vs float64.

Random (seeded) weights exported to temporary model dirs; one CUDA graph of ``engine.run`` replayed
and timed with events on the same stream (best of 3 rounds, each behind a held stream). Also times
the neck-head kernel alone and the engine's first start (tuning) against a second start (plan cache). Prints a table; needs a CUDA GPU, CuPy
and nvidia-cudnn-frontend.

    python scripts/probe_cudnn_rpn.py [--precisions fp16,tf32,fp32] [--batches 1,2,4,8] [--no-autotune]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(_TESTS)]  # the tests' float64 RPN twin (rpn_numpy.py)

from pointpillars_trt.convert.export import export_model_dir  # noqa: E402
from pointpillars_trt.convert.weights import random_weights  # noqa: E402
from pointpillars_trt.config import load_config  # noqa: E402
from pointpillars_trt.kernels.hold import gpu_ms  # noqa: E402
from pointpillars_trt.runtime.cudnn import CudnnEngine, CudnnOptions, cudnn_unavailable_reason  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="openpcdet_kitti_3class")
    ap.add_argument("--precisions", default="fp16,tf32,fp32")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-autotune", action="store_true")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 NumPy reference (slow on CPU)")
    args = ap.parse_args()
    reason = cudnn_unavailable_reason()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    import cupy as cp
    import cudnn

    from rpn_numpy import engine_canvas, initializers, random_canvas_nhwc, rpn_reference

    cfg = load_config(args.config)
    batches = [int(b) for b in args.batches.split(",")]
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"# {props['name'].decode()} | cuDNN {cudnn.backend_version()} | frontend {cudnn.__version__} | "
          f"config {cfg.name} | autotune {not args.no_autotune}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs: dict[str, object] = {}
        for precision in args.precisions.split(","):
            store = "fp16" if precision == "fp16" else "fp32"
            if store not in dirs:
                dirs[store] = export_model_dir(random_weights(cfg, 0), cfg, Path(tmp) / store, precision=store,
                                               source={"random_seed": 0})
            md = dirs[store]
            opts = CudnnOptions(precision=precision, autotune=not args.no_autotune, max_batch=max(batches),
                                plan_cache_dir=Path(tmp) / f"plans_{precision}")
            canvas = random_canvas_nhwc(cfg, max(batches), seed=5)
            canvas = canvas.astype(opts.dtype).astype(np.float32)
            ref = None if args.no_reference else rpn_reference(initializers(md.rpn_path), cfg, canvas[:1])
            for attempt in ("first", "second"):
                t0 = time.perf_counter()
                eng = CudnnEngine(md.rpn_path, cfg, opts).activate()
                d_in = cp.asarray(engine_canvas(eng, canvas))  # IEEE fp32: channel-major
                out_shape = eng.outputs["heads"].shape[1:]
                d_out = cp.zeros((max(batches),) + out_shape, np.float32)
                eng.bind("canvas", d_in[:1].data.ptr, (1,) + d_in.shape[1:])
                eng.bind("heads", d_out[:1].data.ptr, (1,) + out_shape)
                cp.cuda.runtime.deviceSynchronize()
                start_s = time.perf_counter() - t0
                print(f"{precision} batch 1 {attempt} start (activate + bind, plans {eng.build_log[-1]['plans']}): "
                      f"{start_s:.2f} s")
                if attempt == "first":
                    eng.close()
            stream = cp.cuda.Stream(non_blocking=True)
            for b in batches:
                t0 = time.perf_counter()
                eng.bind("canvas", d_in[:b].data.ptr, (b,) + d_in.shape[1:])
                eng.bind("heads", d_out[:b].data.ptr, (b,) + out_shape)
                bind_s = time.perf_counter() - t0
                eng.run(stream.ptr)
                stream.synchronize()
                stream.begin_capture()
                eng.run(stream.ptr)
                graph = stream.end_capture()
                ms = gpu_ms(lambda: graph.launch(stream), stream, iterations=args.iters)
                neck_head = eng._steps[-1]  # the engine's last step: the neck-and-heads kernel
                neck_ms = gpu_ms(lambda: neck_head(stream), stream, iterations=args.iters)
                err = float("nan")
                if ref is not None:
                    eng.run(stream.ptr)
                    stream.synchronize()
                    got = cp.asnumpy(d_out[:1])
                    err = float(np.abs(got - ref).max() / np.abs(ref).max())
                rows.append((precision, b, ms, ms / b, neck_ms, err, bind_s))
            eng.close()
    print(f"{'precision':9} {'batch':>5} {'rpn_ms':>8} {'ms/frame':>8} {'neckhead_ms':>11} {'max_err/max|ref|':>16} "
          f"{'bind_s':>7}")
    for precision, b, ms, per, neck, err, bind_s in rows:
        print(f"{precision:9} {b:5d} {ms:8.4f} {per:8.4f} {neck:11.4f} {err:16.2e} {bind_s:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
