#!/usr/bin/env python3
"""A hand-written wgmma conv (``conv3x3_wgmma.cu`` beside this script) against the cuDNN engine's plans,
per KITTI backbone conv shape: the kernel's error against a float64 NumPy conv, whether a frame's bytes
are the same in a batch as alone, and GPU times per tiling beside the fastest cuDNN candidate the
engine's autotuning timed for that shape (nan where it timed none). Needs an H100/H200 (sm_90a), CuPy
and nvidia-cudnn-frontend. Not a
test: a probe of whether the engine should run its own convs (on one H200 it should not: see
docs/PERF_NOTES.md).

    python scripts/probe_conv_wgmma.py [--batches 1,8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent / "tests")]  # the tests' float64 conv (rpn_numpy.py)

from pointpillars_trt.config import load_config  # noqa: E402
from pointpillars_trt.convert.export import export_model_dir  # noqa: E402
from pointpillars_trt.convert.weights import random_weights  # noqa: E402
from pointpillars_trt.kernels.hold import gpu_ms  # noqa: E402
from pointpillars_trt.runtime.cudnn import CudnnEngine, CudnnOptions, rpn_conv_layers  # noqa: E402

TILES = ((128, 128, 3), (128, 64, 4), (64, 128, 4), (64, 64, 4))  # pixels, output channels, cp.async stages
MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def compile_kernel(cp, defines: dict[str, int]):  # type: ignore[no-untyped-def]
    """NVRTC straight to an sm_90a cubin (CuPy's compile path does not name arch-specific targets)."""
    from cupy_backends.cuda.libs import nvrtc

    header = (resources.files("pointpillars_trt") / "kernels" / "cuda" / "wgmma.cuh").read_text()  # the package's
    source = (_HERE / "conv3x3_wgmma.cu").read_text().replace('#include "wgmma.cuh"', header)
    program = nvrtc.createProgram(source, "conv3x3_wgmma.cu", (), ())
    try:
        nvrtc.compileProgram(program, ["--gpu-architecture=sm_90a", "-std=c++17"]
                             + [f"-D{k}={v}" for k, v in defines.items()])
    except nvrtc.NVRTCError:
        sys.exit(nvrtc.getProgramLog(program))
    module = cp.cuda.function.Module()
    module.load(nvrtc.getCUBIN(program))
    return module, module.get_function("conv3x3_wgmma")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    import cupy as cp

    from rpn_numpy import conv3x3

    if cp.cuda.Device().compute_capability != "90":
        print("needs compute capability 9.0 (wgmma, sm_90a)")
        return 2
    cfg = load_config("openpcdet_kitti_3class")
    layers = rpn_conv_layers(cfg)
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer.shape_key] = counts.get(layer.shape_key, 0) + 1
    shapes = {layer.shape_key: layer for layer in layers}
    stream = cp.cuda.Stream(non_blocking=True)
    keep = []  # the modules outlive their functions' launches
    print("| shape (convs) | batch | cuDNN engine's plan ms | " + " | ".join(f"{r}x{c} s{s}" for r, c, s in TILES)
          + " | max error / max|ref| | batch == alone |")
    print("| --- | ---: | ---: |" + " ---: |" * len(TILES) + " ---: | --- |")
    totals: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        md = export_model_dir(random_weights(cfg, 0), cfg, Path(tmp) / "m", precision="fp16", source={"random_seed": 0})
        for batch in [int(b) for b in args.batches.split(",")]:
            eng = CudnnEngine(md.rpn_path, cfg, CudnnOptions(plan_cache_dir=Path(tmp) / "plans", max_batch=batch)).activate()
            nx, ny, _ = cfg.voxel.grid
            hx, hy = cfg.head_map
            canvas = cp.zeros((batch, ny, nx, cfg.network.pfn_channels), np.float16)
            heads = cp.zeros((batch, hy, hx, sum(cfg.head_channels.values())), np.float32)
            eng.bind("canvas", canvas.data.ptr, canvas.shape)
            eng.bind("heads", heads.data.ptr, heads.shape)
            total = totals.setdefault(batch, [0.0, 0.0])
            for key, layer in shapes.items():
                cudnn_ms = min(eng._plans[batch][key].entry.get("tuned_ms", {}).values(), default=float("nan"))
                (h, w), (oh, ow) = layer.in_hw, layer.out_hw
                cin, cout = layer.in_channels, layer.out_channels
                rng = np.random.default_rng(cin + cout)
                x = rng.random((batch, h, w, cin)).astype(np.float16)
                weight = (rng.standard_normal((cout, 3, 3, cin)) / np.sqrt(9 * cin)).astype(np.float16)
                bias = (0.1 * rng.standard_normal(cout)).astype(np.float16)
                ref = np.maximum(conv3x3(x[:1].astype(np.float64), weight.transpose(0, 3, 1, 2).astype(np.float64),
                                         bias.astype(np.float64), layer.stride), 0.0)
                d_x, d_w, d_b = cp.asarray(x), cp.asarray(weight), cp.asarray(bias)
                y = cp.zeros((batch, oh, ow, cout), np.float16)
                alone = cp.zeros((1, oh, ow, cout), np.float16)
                cells, errors, same, best = [], [], True, float("inf")
                for rows, cols, stages in TILES:
                    if cout % cols:
                        cells.append("-")
                        continue
                    module, fn = compile_kernel(cp, dict(CIN=cin, COUT=cout, CONV_STRIDE=layer.stride, H_IN=h, W_IN=w,
                                                         H_OUT=oh, W_OUT=ow, BM=rows, BN=cols, CONV_STAGES=stages))
                    keep.append(module)
                    smem = stages * (rows + cols) * 128 + 1024
                    cp.cuda.driver.funcSetAttribute(fn.ptr, MAX_DYNAMIC_SHARED, smem)

                    def run(out=y, xs=d_x, frames=batch, fn=fn, rows=rows, cols=cols, smem=smem):  # type: ignore[no-untyped-def]
                        fn((-(-frames * oh * ow // rows), cout // cols), (rows // 64 * 128,),
                           (xs, d_w, d_b, out, np.int32(frames)), shared_mem=smem, stream=stream)

                    y.fill(np.nan)  # a tiling that writes nothing cannot pass for a right one
                    alone.fill(np.nan)
                    run()
                    run(out=alone, xs=d_x[-1:], frames=1)
                    stream.synchronize()
                    errors.append(float(np.abs(cp.asnumpy(y[0]).astype(np.float64) - ref[0]).max() / np.abs(ref).max()))
                    same &= bool(cp.array_equal(alone[0], y[-1]))
                    ms = gpu_ms(run, stream, iterations=50)
                    best = min(best, ms)
                    cells.append(f"{ms:.4f}")
                total[0] += counts[key] * cudnn_ms
                total[1] += counts[key] * best
                print(f"| {key} ({counts[key]}) | {batch} | {cudnn_ms:.4f} | " + " | ".join(cells)
                      + f" | {max(errors):.1e} | {'yes' if same else 'NO'} |", flush=True)
            eng.close()
    for batch, (cudnn_total, own_total) in totals.items():
        print(f"batch {batch}, the {len(layers)} convs: cuDNN engine's plans {cudnn_total:.4f} ms, "
              f"fastest wgmma tiling per shape {own_total:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
