#!/usr/bin/env python3
"""cuDNN's FP8 (E4M3) convs on the KITTI RPN's conv shapes, timed against the fp16 graphs the engine runs.

For each distinct backbone conv shape at each batch, NHWC, 3 x 3, padding 1, four graphs:

* ``fp16``: the engine's graph (conv -> bias -> ReLU, half in and out, float compute);
* ``fp8>fp16``: E4M3 input and filter, conv -> descale (x) -> bias -> ReLU, half out;
* ``fp8>fp8``: the same, then a scale and an E4M3 output (what the next conv would read);
* ``fp8 bare``: E4M3 in, conv -> three scalar scales -> E4M3 out (cuDNN's own FP8 fprop sample's shape).

Each graph: the heuristics' first ``--candidates`` plans built and timed behind a held stream (the
engine's tuning measure), the fastest kept. Its error: the fp8>fp16 output against the fp16 graph run
on the same (E4M3-representable) values, relative to max|ref|. Prints a table per batch. Needs a Hopper
(or newer) GPU, CuPy and nvidia-cudnn-frontend; not a test: the numbers depend on the machine.

    python scripts/probe_cudnn_fp8.py [--batches 1,8] [--candidates 6]
"""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from pointpillars_trt.config import load_config
from pointpillars_trt.kernels.hold import gpu_ms
from pointpillars_trt.runtime.cudnn import MAX_WORKSPACE, ConvLayer, cudnn_unavailable_reason, rpn_conv_layers


def e4m3_table() -> np.ndarray:
    """The float value of every E4M3 (fn) byte; NaN for the two NaN codes."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest E4M3 bytes of ``x`` (clamped to +-448)."""
    table = e4m3_table()
    positive = np.arange(0x7F)  # 0 .. 448, increasing
    mags = table[positive]
    a = np.clip(np.abs(x), 0, 448.0)
    hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo = hi - 1
    pick = np.where(a - mags[lo] <= mags[hi] - a, lo, hi)
    return (pick | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def nhwc(n: int, c: int, h: int, w: int) -> list[int]:
    return [c * h * w, 1, c * w, c]


def build(cudnn: Any, handle: Any, layer: ConvLayer, batch: int, kind: str) -> tuple[Any, dict[str, Any]]:
    c = cudnn
    half, f32, fp8 = c.data_type.HALF, c.data_type.FLOAT, c.data_type.FP8_E4M3
    g = c.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    (h, w), (p, q) = layer.in_hw, layer.out_hw
    cin, cout = layer.in_channels, layer.out_channels
    io = half if kind == "fp16" else fp8
    t = {"X": g.tensor(name="X", dim=[batch, cin, h, w], stride=nhwc(batch, cin, h, w), data_type=io),
         "W": g.tensor(name="W", dim=[cout, cin, 3, 3], stride=nhwc(cout, cin, 3, 3), data_type=io)}
    y = g.conv_fprop(image=t["X"], weight=t["W"], padding=[1, 1], stride=[layer.stride] * 2, dilation=[1, 1],
                     compute_data_type=f32)

    def mul(a: Any, b: Any) -> Any:
        return g.mul(a=a, b=b) if hasattr(g, "mul") else g.scale(input=a, scale=b)

    def scalar(name: str) -> Any:
        t[name] = g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
        return t[name]

    if kind == "fp8 bare":
        y = mul(mul(mul(y, scalar("SX")), scalar("SW")), scalar("SY"))
        out = fp8
    else:
        if kind != "fp16":
            y = mul(y, scalar("SX"))
        t["B"] = g.tensor(name="B", dim=[1, cout, 1, 1], stride=[cout, 1, cout, cout], data_type=half)
        y = g.relu(input=g.bias(input=y, bias=t["B"]))
        out = half
        if kind == "fp8>fp8":
            y = mul(y, scalar("SY"))
            out = fp8
    y.set_output(True).set_data_type(out).set_dim([batch, cout, p, q]).set_stride(nhwc(batch, cout, p, q))
    t["Y"] = y
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
    return g, t


def fastest(cudnn: Any, handle: Any, g: Any, pack: dict[int, int], candidates: int, stream: Any) -> tuple[float, str]:
    import cupy as cp

    best = (float("inf"), "-")
    built = 0
    for i in range(int(g.get_execution_plan_count())):
        if built >= candidates:
            break
        try:
            g.build_plan_at_index(i)
        except Exception:
            continue
        size = int(g.get_workspace_size_plan_at_index(i))
        if size > MAX_WORKSPACE:
            continue
        built += 1
        ws = cp.empty(max(size, 1), np.uint8)
        cudnn.set_stream(handle=handle, stream=stream.ptr)

        def execute(index: int = i) -> None:
            g._execute_plan_at_index(pack, int(ws.data.ptr), index, handle)

        try:
            execute()
            stream.synchronize()
        except Exception:
            continue
        ms = gpu_ms(execute, stream, iterations=20, rounds=3, hold_ms=1.0)
        if ms < best[0]:
            best = (ms, str(g.get_plan_name_at_index(i)))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--candidates", type=int, default=6)
    args = ap.parse_args()
    reason = cudnn_unavailable_reason()
    if reason:
        print(f"error: cannot run: {reason}")
        return 2
    import cupy as cp
    import cudnn

    handle = cudnn.create_handle()
    stream = cp.cuda.Stream(non_blocking=True)
    layers = {layer.shape_key: layer for layer in rpn_conv_layers(load_config("openpcdet_kitti_3class"))}
    counts: dict[str, int] = {}
    for layer in rpn_conv_layers(load_config("openpcdet_kitti_3class")):
        counts[layer.shape_key] = counts.get(layer.shape_key, 0) + 1
    table = e4m3_table()
    rng = np.random.default_rng(0)
    kinds = ["fp16", "fp8>fp16", "fp8>fp8", "fp8 bare"]
    print(f"# cuDNN {cudnn.backend_version()} frontend {cudnn.__version__}, {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for batch in [int(b) for b in args.batches.split(",")]:
        rows = []
        for key, layer in layers.items():
            (h, w), (p, q) = layer.in_hw, layer.out_hw
            cin, cout = layer.in_channels, layer.out_channels
            x8 = to_e4m3(np.abs(rng.standard_normal((batch, h, w, cin))) * (rng.random((batch, h, w, 1)) < 0.5))
            w8 = to_e4m3(rng.standard_normal((cout, 3, 3, cin)) * 4.0)
            sx = 1.0 / np.sqrt(9 * cin) / 4.0
            dev = {"X8": cp.asarray(x8), "W8": cp.asarray(w8),
                   "X16": cp.asarray(table[x8].astype(np.float16)), "W16": cp.asarray((table[w8] * sx).astype(np.float16)),
                   "B": cp.asarray(rng.standard_normal(cout).astype(np.float16) * 0.1),
                   "SX": cp.asarray(np.array([sx], np.float32)), "SW": cp.asarray(np.array([1.0], np.float32)),
                   "SY": cp.asarray(np.array([8.0], np.float32)),
                   "Y16": cp.zeros((batch, p, q, cout), np.float16), "Y16b": cp.zeros((batch, p, q, cout), np.float16),
                   "Y8": cp.zeros((batch, p, q, cout), np.uint8)}
            row = [f"{key} x{counts[key]}"]
            for kind in kinds:
                try:
                    g, t = build(cudnn, handle, layer, batch, kind)
                except Exception as exc:
                    row.append("unsupported")
                    print(f"  {key} b{batch} {kind}: {str(exc).splitlines()[0][:160]}", flush=True)
                    continue
                ptr = {"X": dev["X16" if kind == "fp16" else "X8"], "W": dev["W16" if kind == "fp16" else "W8"],
                       "B": dev["B"], "SX": dev["SX"], "SW": dev["SW"], "SY": dev["SY"],
                       "Y": dev["Y16" if kind == "fp16" else "Y16b" if kind == "fp8>fp16" else "Y8"]}
                pack = {int(tensor.get_uid()): int(ptr[name].data.ptr) for name, tensor in t.items()}
                ms, name = fastest(cudnn, handle, g, pack, args.candidates, stream)
                row.append(f"{ms:.4f}" if ms < float("inf") else "no plan")
                print(f"  {key} b{batch} {kind}: {ms:.4f} ms {name}", flush=True)
            ref = dev["Y16"].astype(np.float32)
            err = float(cp.abs(dev["Y16b"].astype(np.float32) - ref).max() / max(float(cp.abs(ref).max()), 1e-6))
            row.append(f"{err:.1e}")
            rows.append(row)
        print(f"\n## batch {batch}, GPU ms a conv (fastest of the first {args.candidates} heuristic plans)")
        print("| shape (convs) | " + " | ".join(kinds) + " | fp8>fp16 err |")
        print("| --- |" + " ---: |" * (len(kinds) + 1))
        for row in rows:
            print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
