"""A float64 NumPy RPN (NHWC), straight from the ONNX initializers, and running a cuDNN engine on a
canvas: the references the engine and kernel tests compare against."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pointpillars_trt.config import ModelConfig


def initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(path)).graph.initializer}


def conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """im2col: x (B, H, W, C), w (K, C, 3, 3), padding 1."""
    bsz, h, wd, c = x.shape
    p, q = (h - 1) // stride + 1, (wd - 1) // stride + 1
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.empty((bsz, p, q, 3, 3, c))
    for r in range(3):
        for s in range(3):
            cols[:, :, :, r, s, :] = xp[:, r: r + stride * (p - 1) + 1: stride, s: s + stride * (q - 1) + 1: stride, :]
    return (cols.reshape(-1, 9 * c) @ w.transpose(2, 3, 1, 0).reshape(9 * c, -1) + b).reshape(bsz, p, q, -1)


def deconv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ConvTranspose with kernel == stride: a matmul per input pixel. w (Cin, Cout, k, k)."""
    bsz, h, wd, _ = x.shape
    k = w.shape[2]
    t = np.einsum("nhwc,cokl->nhkwlo", x, w, optimize=True)
    return t.reshape(bsz, h * k, wd * k, w.shape[1]) + b


def rpn_reference(weights: dict[str, np.ndarray], cfg: ModelConfig, canvas: np.ndarray) -> np.ndarray:
    net = cfg.network
    x, ups = canvas.astype(np.float64), []
    for i, (n, stride) in enumerate(zip(net.layer_nums, net.layer_strides)):
        for j in range(n + 1):
            x = np.maximum(conv3x3(x, weights[f"block{i}.conv{j}.weight"], weights[f"block{i}.conv{j}.bias"],
                                   stride if j == 0 else 1), 0.0)
        ups.append(np.maximum(deconv(x, weights[f"deblock{i}.weight"], weights[f"deblock{i}.bias"]), 0.0))
    cat = np.concatenate(ups, axis=-1)
    if "head.weight" in weights:  # the merged head (cls | box | dir)
        return cat @ weights["head.weight"][:, :, 0, 0].T + weights["head.bias"]
    return np.concatenate([cat @ weights[f"head.{n}.weight"][:, :, 0, 0].T + weights[f"head.{n}.bias"]
                           for n in ("cls", "box", "dir")], axis=-1)


def random_canvas_nhwc(cfg: ModelConfig, batch: int, seed: int, occupancy: float = 0.2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    nx, ny, _ = cfg.voxel.grid
    occupied = rng.random((batch, ny, nx, 1)) < occupancy
    return (np.abs(rng.standard_normal((batch, ny, nx, cfg.network.pfn_channels))) * occupied).astype(np.float32)


def engine_canvas(engine, canvas: np.ndarray) -> np.ndarray:
    """An NHWC canvas in the engine's input layout (IEEE fp32 engines take NCHW)."""
    if engine.channels_first_input:
        canvas = np.ascontiguousarray(canvas.transpose(0, 3, 1, 2))
    return canvas.astype(engine.inputs["canvas"].dtype)


def run_engine(engine, canvas: np.ndarray, stream=None) -> np.ndarray:
    import cupy as cp

    spec_out = engine.outputs["heads"]
    stream = stream or cp.cuda.Stream(non_blocking=True)
    with stream:  # input copy and NaN fill ordered before the run (a non-blocking stream skips the null stream)
        d_in = cp.asarray(engine_canvas(engine, canvas))
        d_out = cp.full((canvas.shape[0],) + spec_out.shape[1:], np.nan, np.float32)
    engine.bind("canvas", d_in.data.ptr, d_in.shape)
    engine.bind("heads", d_out.data.ptr, d_out.shape)
    engine.run(stream.ptr)
    stream.synchronize()
    return cp.asnumpy(d_out)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())
