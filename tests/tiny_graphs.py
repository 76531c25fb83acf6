"""Tiny ONNX graphs with the I/O names of the real PFN and head, and float64 NumPy twins of them.

Built directly with onnx.helper so the runtime tests depend on no exporter. Also: why the CUDA
tests of this machine would be skipped (None when they can run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def pfn_graph(path: Path, *, m: int = 8, c: int = 6, k: int = 16, fp16: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """"pillars" (P, m, c) -> relu(x @ W + b) -> max over the m points -> "pillar_features" (P, k).

    P is the symbolic dimension "num_pillars". With ``fp16`` the arithmetic runs in float16 between
    two Casts while the I/O stays float32, as in an fp16 export. Returns the weights as stored.
    """
    rng = np.random.default_rng(seed)
    wtype = np.float16 if fp16 else np.float32
    weights = {"W": rng.standard_normal((c, k)).astype(wtype), "b": (0.1 * rng.standard_normal(k)).astype(wtype)}
    nodes = []
    x = "pillars"
    if fp16:
        nodes.append(helper.make_node("Cast", ["pillars"], ["x16"], to=TensorProto.FLOAT16))
        x = "x16"
    nodes += [
        helper.make_node("MatMul", [x, "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["xwb"]),
        helper.make_node("Relu", ["xwb"], ["act"]),
        helper.make_node("ReduceMax", ["act"], ["pooled" if fp16 else "pillar_features"], axes=[1], keepdims=0),
    ]
    if fp16:
        nodes.append(helper.make_node("Cast", ["pooled"], ["pillar_features"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        "tiny_pfn",
        [helper.make_tensor_value_info("pillars", TensorProto.FLOAT, ["num_pillars", m, c])],
        [helper.make_tensor_value_info("pillar_features", TensorProto.FLOAT, ["num_pillars", k])],
        [numpy_helper.from_array(v, n) for n, v in weights.items()],
    )
    _save(graph, path)
    return weights


def pfn_reference(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    w, b = (weights[n].astype(np.float64) for n in ("W", "b"))
    return np.maximum(x.astype(np.float64) @ w + b, 0.0).max(axis=1)


def head_graph(path: Path, *, cin: int = 4, mid: int = 8, h: int = 6, w: int = 10, seed: int = 1) -> dict[str, np.ndarray]:
    """"canvas" (1, cin, h, w) -> relu(conv3x3, pad 1) -> two 1x1 convs -> "cls" (1, 3, h, w), "box" (1, 5, h, w)."""
    rng = np.random.default_rng(seed)
    weights = {
        "Wc": (0.3 * rng.standard_normal((mid, cin, 3, 3))).astype(np.float32),
        "bc": (0.1 * rng.standard_normal(mid)).astype(np.float32),
        "Wcls": rng.standard_normal((3, mid, 1, 1)).astype(np.float32),
        "bcls": rng.standard_normal(3).astype(np.float32),
        "Wbox": rng.standard_normal((5, mid, 1, 1)).astype(np.float32),
        "bbox": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["canvas", "Wc", "bc"], ["feat"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["feat"], ["act"]),
        helper.make_node("Conv", ["act", "Wcls", "bcls"], ["cls"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["act", "Wbox", "bbox"], ["box"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_head",
        [helper.make_tensor_value_info("canvas", TensorProto.FLOAT, [1, cin, h, w])],
        [
            helper.make_tensor_value_info("cls", TensorProto.FLOAT, [1, 3, h, w]),
            helper.make_tensor_value_info("box", TensorProto.FLOAT, [1, 5, h, w]),
        ],
        [numpy_helper.from_array(v, n) for n, v in weights.items()],
    )
    _save(graph, path)
    return weights


def head_reference(canvas: np.ndarray, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Brute-force float64 convolution: one shifted slice per kernel tap."""
    x = np.pad(canvas[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    _, h, w = canvas[0].shape
    wc = weights["Wc"].astype(np.float64)
    feat = np.zeros((wc.shape[0], h, w))
    for dy in range(3):
        for dx in range(3):
            feat += np.einsum("oc,chw->ohw", wc[:, :, dy, dx], x[:, dy : dy + h, dx : dx + w])
    act = np.maximum(feat + weights["bc"][:, None, None], 0.0)
    out = {}
    for name in ("cls", "box"):
        kernel = weights["W" + name][:, :, 0, 0].astype(np.float64)
        out[name] = (np.einsum("oc,chw->ohw", kernel, act) + weights["b" + name][:, None, None])[None]
    return out


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime and TensorRT 10 parser we support
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def cuda_skip_reason() -> str | None:
    """Why CuPy-based GPU tests cannot run here, or None when a CUDA device is usable."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver; any failure means no device
        return f"no usable CUDA device ({exc})"
    return None if count > 0 else "no CUDA device"
