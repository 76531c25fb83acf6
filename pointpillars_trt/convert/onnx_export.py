"""PFN and RPN as ONNX graphs built with the onnx package, BatchNorm folded, ready for TensorRT or ONNX Runtime.

The network is split where the scatter kernel sits: the PFN graph maps pillars to pillar features, the RPN
graph maps the NHWC BEV canvas (in the RPN's compute precision) to one merged NHWC float32 head map
(``graph_io`` holds the contract).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..config import ModelConfig
from ..graph_io import (HEAD_PARTS, PFN_INPUT, PFN_OUTPUT, RPN_OUTPUT, GraphIO, GraphTensor, Precision,
                        check_precision, pfn_io, rpn_io)
from ..errors import CheckpointError, ConfigError
from .multihead import MultiHeadWeights, backbone_and_neck, build_multihead_rpn_graph
from .weights import PointPillarsWeights

ModelWeights = PointPillarsWeights | MultiHeadWeights  # a single-head or a multi-head (cfg.heads) model

OPSET = 17
IR_VERSION = 8  # the IR that opset 17 came with: older ONNX Runtime and TensorRT parsers refuse newer IRs
_ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
_FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504: the largest weight an fp16 graph can hold


def build_pfn_graph(weights: ModelWeights, cfg: ModelConfig, precision: Precision = "fp32", *,
                    source: str = "weights") -> onnx.ModelProto:
    """Linear (BN folded) -> ReLU -> max over the point slots; ``source`` (the checkpoint) names the weights in errors.

    No mask: the padded slots are zeros and take part in the max after BN and ReLU, as both families do.
    """
    _check_weights(weights, cfg)
    scale, shift = weights.pfn_bn.scale_shift(cfg.network.bn_eps)
    w = weights.pfn_linear.astype(np.float64) * scale[:, None]  # (64, C)
    g = _GraphBuilder(precision, source)
    x = g.input_cast(PFN_INPUT)
    y = g.node("MatMul", [x, g.const("pfn.weight", w.T)], "pfn.linear")
    y = g.node("Add", [y, g.const("pfn.bias", shift)], "pfn.bn")
    y = g.node("Relu", [y], "pfn.relu")
    g.output_node("ReduceMax", [y], "pfn.max", PFN_OUTPUT, axes=[1], keepdims=0)
    return g.model("pointpillars_pfn", pfn_io(cfg))


def build_rpn_graph(weights: ModelWeights, cfg: ModelConfig, precision: Precision = "fp32", *,
                    source: str = "weights") -> onnx.ModelProto:
    """NHWC canvas -> backbone blocks -> transposed-conv neck -> concat -> one merged 1x1 head -> NHWC
    heads (cls | box | dir), every BN folded into a conv bias.

    The transposes at both ends let engines that prefer NHWC (cuDNN, TensorRT, ONNX Runtime's NHWC
    kernels) run without layout changes between the pipeline's stages. A multi-head model's head is
    ``multihead.build_multihead_rpn_graph``'s. ``source`` (the checkpoint) names the weights in errors."""
    _check_weights(weights, cfg)
    if isinstance(weights, MultiHeadWeights):
        return build_multihead_rpn_graph(weights, cfg, _GraphBuilder(precision, source), rpn_io(cfg, precision))
    g = _GraphBuilder(precision, source)
    features = backbone_and_neck(g, weights.blocks, weights.deblocks, cfg)
    parts = [getattr(weights, f"head_{part}") for part in HEAD_PARTS]
    head_w = np.concatenate([p.weight for p in parts])
    head_b = np.concatenate([p.bias for p in parts])
    heads = g.node("Conv", [features, g.const("head.weight", head_w), g.const("head.bias", head_b)], "head",
                   kernel_shape=[1, 1])
    g.output_node("Transpose", [heads], "heads.nhwc", RPN_OUTPUT, perm=[0, 2, 3, 1])
    return g.model("pointpillars_rpn", rpn_io(cfg, precision))


class _GraphBuilder:
    """Collects nodes and initializers; in fp16 the weights are float16 and casts sit at the graph edges."""

    def __init__(self, precision: str, source: str) -> None:
        self.fp16 = check_precision(precision) == "fp16"
        self.source = source
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        """A weight as an initializer. In fp16 one beyond float16's range is refused: the cast would make it inf
        (and every score NaN) silently. Float32's range was checked when the checkpoint was read."""
        dtype = np.float16 if self.fp16 else np.float32
        if self.fp16 and (largest := float(np.abs(value).max(initial=0.0))) > _FLOAT16_MAX:
            raise CheckpointError(f"{self.source}: {name} holds values up to {largest:.4g}, beyond float16's "
                                  f"{_FLOAT16_MAX:g} (inf in an fp16 graph): build with --precision fp32")
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, output: str | None = None, **attrs: Any) -> str:
        """Append a node; its output tensor is named after the node unless ``output`` is given."""
        out = output or name
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def input_cast(self, name: str) -> str:
        return self.node("Cast", [name], f"{name}.fp16", to=TensorProto.FLOAT16) if self.fp16 else name

    def output_node(self, op: str, inputs: list[str], name: str, output: str, **attrs: Any) -> None:
        """A node that produces the graph output ``output``: directly in fp32, through a Cast in fp16."""
        if self.fp16:
            value = self.node(op, inputs, name, **attrs)
            self.node("Cast", [value], f"{output}.fp32", output=output, to=TensorProto.FLOAT)
        else:
            self.node(op, inputs, name, output=output, **attrs)

    def model(self, graph_name: str, io: GraphIO) -> onnx.ModelProto:
        def info(t: GraphTensor) -> onnx.ValueInfoProto:
            return helper.make_tensor_value_info(t.name, _ONNX_DTYPES[t.dtype], list(t.shape))

        graph = helper.make_graph(
            self.nodes, graph_name, [info(t) for t in io.inputs], [info(t) for t in io.outputs], self.initializers
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pointpillars-trt", ir_version=IR_VERSION
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def _check_weights(weights: ModelWeights, cfg: ModelConfig) -> None:
    """Catch a checkpoint/config mismatch here, with names, rather than as an opaque shape error in ONNX.

    Multi-head weights come only from ``multihead.weights_from_state_dict``, which checked every shape."""
    if isinstance(weights, MultiHeadWeights) or cfg.heads is not None:
        if not isinstance(weights, MultiHeadWeights) or cfg.heads is None:
            raise ConfigError(f"weights do not match config {cfg.name}: one is multi-head, the other is not")
        return
    net = cfg.network
    expected: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = [
        ("pfn_linear", weights.pfn_linear.shape, (net.pfn_channels, cfg.features.channels)),
        ("backbone blocks", (len(weights.blocks),), (len(net.layer_nums),)),
        ("neck deblocks", (len(weights.deblocks),), (len(net.upsample_strides),)),
    ]
    cin = net.pfn_channels
    for i, (block, cout) in enumerate(zip(weights.blocks, net.block_channels)):
        expected.append((f"block {i} conv count", (len(block),), (net.layer_nums[i] + 1,)))
        expected += [(f"block {i} conv {j}", conv.weight.shape, (cout, cout if j else cin, 3, 3)) for j, conv in enumerate(block)]
        expected.append((f"block {i} stride", (block[0].stride,), (net.layer_strides[i],)))
        cin = cout
    for i, (de, cin, cout, k) in enumerate(zip(weights.deblocks, net.block_channels, net.upsample_channels, net.upsample_kernels)):
        expected += [(f"deblock {i}", de.weight.shape, (cin, cout, k, k)), (f"deblock {i} stride", (de.stride,), (k,))]
    for name, head in (("cls", weights.head_cls), ("box", weights.head_box), ("dir", weights.head_dir)):
        expected.append((f"head {name}", head.weight.shape, (cfg.head_channels[name], net.head_in_channels, 1, 1)))
    bad = [f"{what} is {got}, expected {want}" for what, got, want in expected if tuple(got) != want]
    if bad:
        raise ConfigError(f"weights do not match config {cfg.name}: " + "; ".join(bad))
