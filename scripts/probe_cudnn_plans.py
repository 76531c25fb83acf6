#!/usr/bin/env python3
"""Every plan cuDNN offers for each fp16 conv shape of the KITTI RPN, timed alone, against the engine's pick.

For each distinct conv shape (a subprocess each: a plan that faults takes only its own shape down) at
each batch: the heuristics' candidates (A + fallback, ~40 a shape), then plans made from every engine id
and knob value the frontend lists (``create_execution_plan``, up to ``--per-engine`` combinations an
engine; ``--heuristics-only`` skips them), each built and timed as the engine's autotuning times its
candidates, within ``--budget`` seconds a shape. Prints per shape the fastest plans with their error
against the first plan timed, the heuristics' candidates in their order, and a table row of the
engine's pick against the fastest found. Random (seeded) weights; needs a CUDA GPU, CuPy and
nvidia-cudnn-frontend. Not a test: numbers depend on the machine.

With ``--graph conv`` the plans are those of the bare convolution (no bias, no ReLU): what cuDNN's
convolution kernels alone take, against the fused conv -> bias -> ReLU graph the engine runs. With
``--torch`` each shape is also timed as PyTorch runs it (``conv2d`` channels-last under
``cudnn.benchmark``, then its bias-and-ReLU), and the kernels of its pick are named.

    python scripts/probe_cudnn_plans.py [--batches 1,8] [--budget 45] [--heuristics-only] [--graph conv] [--torch]
"""
from __future__ import annotations

import argparse
import itertools
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pointpillars_trt.config import load_config
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.convert.weights import random_weights
from pointpillars_trt.kernels.hold import gpu_ms
from pointpillars_trt.runtime.cudnn import (MAX_WORKSPACE, TUNE_HOLD_MS, TUNE_ITERS, TUNE_ROUNDS, ConvLayer,
                                            CudnnEngine, CudnnOptions, cudnn_unavailable_reason, layout_strides,
                                            rpn_conv_layers)


def conv_graph(eng: CudnnEngine, layer: ConvLayer, batch: int) -> tuple[Any, dict[str, Any]]:
    """The engine's graph for ``layer`` without its bias and ReLU: the convolution alone."""
    c = eng._cudnn
    io = c.data_type.HALF
    g = c.pygraph(io_data_type=io, intermediate_data_type=c.data_type.FLOAT, compute_data_type=c.data_type.FLOAT,
                  handle=eng._handle)
    (h, w), (p, q) = layer.in_hw, layer.out_hw
    cin, cout = layer.in_channels, layer.out_channels
    x = g.tensor(name="X", dim=[batch, cin, h, w], stride=layout_strides(cin, h, w, False), data_type=io)
    wt = g.tensor(name="W", dim=[cout, cin, 3, 3], stride=layout_strides(cin, 3, 3, False), data_type=io)
    y = g.conv_fprop(image=x, weight=wt, padding=[1, 1], stride=[layer.stride] * 2, dilation=[1, 1],
                     compute_data_type=c.data_type.FLOAT)
    y.set_output(True).set_data_type(io).set_dim([batch, cout, p, q]).set_stride(layout_strides(cout, p, q, False))
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
    g.deselect_numeric_notes([c.numerical_note.REDUCED_PRECISION_REDUCTION])
    return g, {"X": x, "W": wt, "Y": y}


def torch_times(layer: ConvLayer, batch: int) -> str:
    """``layer`` as PyTorch runs it (channels-last fp16 under cudnn.benchmark): conv2d alone, conv2d with its
    bias and ReLU, and the kernels one conv -> bias -> ReLU launches."""
    import torch

    torch.backends.cudnn.benchmark = True
    (h, w), cin, cout = layer.in_hw, layer.in_channels, layer.out_channels
    x = torch.randn(batch, cin, h, w, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    wt = (torch.randn(cout, cin, 3, 3, device="cuda", dtype=torch.half) * 0.05).to(memory_format=torch.channels_last)
    b = torch.randn(cout, device="cuda", dtype=torch.half)

    def bare() -> object:
        return torch.nn.functional.conv2d(x, wt, None, layer.stride, 1)

    def fused() -> object:
        return torch.relu_(torch.nn.functional.conv2d(x, wt, b, layer.stride, 1))

    def ms(run: Any) -> float:
        for _ in range(20):
            run()
        best = float("inf")
        for _ in range(TUNE_ROUNDS):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(TUNE_ITERS):
                run()
            stop.record()
            stop.synchronize()
            best = min(best, start.elapsed_time(stop) / TUNE_ITERS)
        return best

    bare_ms, fused_ms = ms(bare), ms(fused)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fused()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return f"torch conv {bare_ms:.4f} ms, conv+bias+relu {fused_ms:.4f} ms; kernels: {'; '.join(kernels)[:400]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1")
    ap.add_argument("--budget", type=float, default=45.0, help="seconds of search per shape and batch")
    ap.add_argument("--per-engine", type=int, default=48)
    ap.add_argument("--shape", type=int, default=-1, help="only the n-th distinct shape (else one subprocess each)")
    ap.add_argument("--heuristics-only", action="store_true")
    ap.add_argument("--graph", choices=("fused", "conv"), default="fused",
                    help="fused: conv -> bias -> ReLU as the engine runs it; conv: the convolution alone")
    ap.add_argument("--torch", action="store_true", help="also time each shape as PyTorch runs it")
    ap.add_argument("--plan-cache", default=str(Path(tempfile.gettempdir()) / "pp-probe-cudnn-plans"),
                    help="the engine's plan cache, shared by the shapes' subprocesses")
    args = ap.parse_args()
    reason = cudnn_unavailable_reason()
    if reason:
        print(f"error: cannot run: {reason}")
        return 2
    if args.shape < 0:
        import subprocess
        shapes = len({layer.shape_key for layer in rpn_conv_layers(load_config("openpcdet_kitti_3class"))})
        for j in range(shapes):
            try:
                subprocess.run([sys.executable, __file__, "--batches", args.batches, "--budget", str(args.budget),
                                "--per-engine", str(args.per_engine), "--shape", str(j), "--plan-cache",
                                args.plan_cache, "--graph", args.graph] + (["--heuristics-only"] if args.heuristics_only else [])
                               + (["--torch"] if args.torch else []),
                               timeout=args.budget * 3 + 60)
            except subprocess.TimeoutExpired:
                print(f"\n## shape {j}: no answer within {args.budget * 3 + 60:.0f} s (a plan hung); next shape")
        return 0
    import cupy as cp
    import cudnn

    cfg = load_config("openpcdet_kitti_3class")
    tmp = Path(tempfile.mkdtemp())
    md = export_model_dir(random_weights(cfg, 0), cfg, tmp / "m", precision="fp16", source={"random_seed": 0})
    batches = [int(b) for b in args.batches.split(",")]
    eng = CudnnEngine(md.rpn_path, cfg, CudnnOptions(precision="fp16", max_batch=max(batches),
                                                     plan_cache_dir=Path(args.plan_cache))).activate()
    shape_in = eng.inputs["canvas"].shape[1:]
    shape_out = eng.outputs["heads"].shape[1:]
    rng = np.random.default_rng(0)
    canvas = cp.asarray((np.abs(rng.standard_normal((max(batches), *shape_in))) * (rng.random((max(batches), *shape_in[:2], 1)) < 0.2)).astype(np.float16))
    heads = cp.zeros((max(batches), *shape_out), np.float32)
    print(f"# cuDNN {cudnn.backend_version()} frontend {cudnn.__version__}", flush=True)
    summary = []
    for batch in batches:
        eng.bind("canvas", canvas[:batch].data.ptr, (batch, *shape_in))
        eng.bind("heads", heads[:batch].data.ptr, (batch, *shape_out))
        eng.run(cp.cuda.Stream.null.ptr)
        cp.cuda.runtime.deviceSynchronize()
        chosen = eng._plans[batch]
        done = set()
        for k, layer in enumerate(eng._layers):
            if layer.shape_key in done:
                continue
            done.add(layer.shape_key)
            if len(done) - 1 != args.shape:
                continue
            count_same = sum(1 for l in eng._layers if l.shape_key == layer.shape_key)
            t0 = time.perf_counter()
            g, tensors = eng._graph(layer, batch) if args.graph == "fused" else conv_graph(eng, layer, batch)
            n_heur = int(g.get_execution_plan_count())
            heur_engines = []
            for i in range(n_heur):
                m = re.match(r"eng(\d+)", str(g.get_plan_name_at_index(i)))
                if m and int(m.group(1)) not in heur_engines:
                    heur_engines.append(int(m.group(1)))
            n_eng = int(g.get_engine_count())
            order = heur_engines + [e for e in range(n_eng) if e not in heur_engines]
            made = 0
            for e in ([] if args.heuristics_only else order):
                try:
                    knobs = g.get_knobs_for_engine(e)
                except Exception:
                    continue
                axes = []
                for kn in knobs:
                    lo, hi, st = int(kn.min_value), int(kn.max_value), max(int(kn.stride), 1)
                    vals = list(range(lo, hi + 1, st))
                    if len(vals) > 16:
                        vals = vals[:: max(1, len(vals) // 16)]
                    axes.append((kn.type, vals))
                combos = list(itertools.product(*[[(t, v) for v in vals] for t, vals in axes])) if axes else [()]
                random.Random(e).shuffle(combos)
                for combo in combos[: args.per_engine]:
                    try:
                        g.create_execution_plan(e, dict(combo))
                        made += 1
                    except Exception as exc:
                        if made == 0 and combo is combos[0]:
                            print("  create failed:", str(exc)[:200], flush=True)
            total = int(g.get_execution_plan_count())
            uids = {name: int(t.get_uid()) for name, t in tensors.items()}
            x_ptr = eng._activation_ptr(k, batch, input_side=True)
            (oh, ow) = layer.out_hw
            y = cp.zeros((batch, oh, ow, layer.out_channels), np.float16)
            w, b = eng._conv_weights[k]
            pack = {uids["X"]: x_ptr, uids["W"]: int(w.data.ptr), uids["Y"]: int(y.data.ptr)}
            if "B" in uids:
                pack[uids["B"]] = int(b.data.ptr)
            ws = cp.empty(MAX_WORKSPACE, np.uint8)
            stream = cp.cuda.Stream(non_blocking=True)
            cudnn.set_stream(handle=eng._handle, stream=stream.ptr)
            results = []
            ref = None
            seen_names = set()
            errors: list[str] = []
            for i in range(total):
                if time.perf_counter() - t0 > args.budget:
                    break
                try:
                    name = str(g.get_plan_name_at_index(i))
                except Exception:
                    name = f"?{i}"
                if name in seen_names:
                    continue
                seen_names.add(name)
                tb = time.perf_counter()
                try:
                    g.build_plan_at_index(i)
                    tb = time.perf_counter() - tb
                    if int(g.get_workspace_size_plan_at_index(i)) > MAX_WORKSPACE:
                        continue
                    cudnn.set_stream(handle=eng._handle, stream=stream.ptr)

                    def execute(index: int = i) -> None:
                        g._execute_plan_at_index(pack, int(ws.data.ptr), index, eng._handle)

                    execute()
                    execute()
                    # the engine's own tuning measure: best of its rounds, queued behind a held stream
                    ms = gpu_ms(execute, stream, iterations=TUNE_ITERS, rounds=TUNE_ROUNDS, hold_ms=TUNE_HOLD_MS)
                    stream.synchronize()
                    out = y.astype(np.float32)
                    if ref is None:
                        ref = out.copy()
                    err = float(cp.abs(out - ref).max() / max(float(cp.abs(ref).max()), 1e-6))
                    results.append((ms, i, name, err, i < n_heur, tb))
                except Exception as exc:
                    errors.append(f"{i}: {str(exc)[:160]}")
                    continue
            results.sort()
            pick = chosen[layer.shape_key].entry.get("plan_name")
            pick_ms = next((r[0] for r in results if r[2] == pick), float("nan"))
            heur_best = min((r for r in results if r[4]), default=None)
            print(f"\n## batch {batch} {layer.shape_key} x{count_same}: engines {n_eng}, heuristic plans {n_heur}, "
                  f"made {made}, timed {len(results)} in {time.perf_counter() - t0:.1f} s; engine pick {pick} "
                  f"{pick_ms:.4f} ms; heuristic best {heur_best[0] if heur_best else float('nan'):.4f}", flush=True)
            for ms, i, name, err, heur, tb in results[:8]:
                print(f"  {ms:.4f} ms err {err:.1e} {'H' if heur else ' '} #{i} build {tb:.2f} s {name}", flush=True)
            print(f"  errors {len(errors)}: {errors[:3]}", flush=True)
            print("  heuristic order: " + " ".join(f"#{i}:{ms:.4f}" for ms, i, *_ in sorted(results, key=lambda r: r[1]) if i < n_heur), flush=True)
            if args.torch:
                print("  " + torch_times(layer, batch), flush=True)
            if results:
                summary.append((batch, layer.shape_key, count_same, pick_ms, results[0][0], results[0][2], results[0][3]))
        print("\n| batch | shape | convs | engine pick ms | best found ms | err | best plan |", flush=True)
        for b, key, n, p, best, name, err in summary:
            if b == batch:
                print(f"| {b} | {key} | {n} | {p:.4f} | {best:.4f} | {err:.1e} | {name} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
