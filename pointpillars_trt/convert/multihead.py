"""OpenPCDet's multi-head PointPillars (``AnchorHeadMulti``, e.g. nuScenes ``cbgs_pp_multihead``):
its checkpoint keys and weights, and its RPN as one ONNX graph.

The backbone keys are those of the single-head OpenPCDet layout, except that an upsample stride
below 1 is a strided ``Conv2d`` (weight (Cout, Cin, k, k)) instead of a ``ConvTranspose2d``. The
head is a shared 3x3 conv + BN + ReLU, then per head a 3x3 conv + BN + ReLU before each output
3x3 conv: one for the head's class scores, one per box-code part (``reg:2, height:1, size:3,
angle:2, velo:2``). OpenPCDet concatenates the parts of a head and reads the result as (A, code):
channel ``a * code + j`` is value j of anchor a, which the graph keeps as is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..config import ModelConfig
from ..errors import CheckpointError
from ..anchors import head_anchors
from ..graph_io import RPN_INPUT, RPN_OUTPUT, GraphIO, box_parts
from .weights import BatchNorm, BatchNormFold, ConvBN, ConvKeys

HEAD_KEY = "dense_head.rpn_heads."  # keys only a multi-head OpenPCDet checkpoint has
LABEL_INDICES = "head_label_indices"  # int64 buffer of each head: its classes, 1-based


@dataclass(frozen=True)
class OutputConv:
    """A 3x3 output conv with bias: ``weight`` (Cout, Cin, 3, 3), ``bias`` (Cout,)."""

    weight: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class HeadWeights:
    """One head: its class branch and its box-code parts, each a middle ConvBN and an output conv."""

    cls: tuple[ConvBN, OutputConv]
    box: tuple[tuple[ConvBN, OutputConv], ...]  # in box_parts order


@dataclass(frozen=True)
class MultiHeadWeights:
    """All weights of a multi-head model; the first four fields mean what they mean in
    ``PointPillarsWeights`` (``deblocks[i].weight`` is (Cout, Cin, k, k) for a stride below 1)."""

    pfn_linear: np.ndarray
    pfn_bn: BatchNorm
    blocks: tuple[tuple[ConvBN, ...], ...]
    deblocks: tuple[ConvBN, ...]
    shared: ConvBN
    heads: tuple[HeadWeights, ...]


# --------------------------------------------------------------------------- checkpoint keys

def _plan(cfg: ModelConfig) -> list[ConvKeys]:
    """Every conv of the layout in network order: PFN, blocks, deblocks, shared conv, heads."""
    net, heads = cfg.network, cfg.require_heads()
    convs = [ConvKeys("vfe.pfn_layers.0.linear.weight", (net.pfn_channels, cfg.features.channels),
                   "vfe.pfn_layers.0.norm", net.pfn_channels)]
    c_in = net.pfn_channels
    for i, (extra, stride, c_out) in enumerate(zip(net.layer_nums, net.layer_strides, net.block_channels)):
        for j in range(extra + 1):  # (ZeroPad2d,) then (conv, BN, ReLU) triplets
            m = 1 + 3 * j
            convs.append(ConvKeys(f"backbone_2d.blocks.{i}.{m}.weight", (c_out, c_in if j == 0 else c_out, 3, 3),
                               f"backbone_2d.blocks.{i}.{m + 1}", c_out, stride if j == 0 else 1))
        c_in = c_out
    for i, (c_in, s, k, c_out) in enumerate(zip(net.block_channels, net.upsample_strides, net.upsample_kernels,
                                                net.upsample_channels)):
        shape = (c_out, c_in, k, k) if s < 1 else (c_in, c_out, k, k)  # Conv2d or ConvTranspose2d
        convs.append(ConvKeys(f"backbone_2d.deblocks.{i}.0.weight", shape, f"backbone_2d.deblocks.{i}.1", c_out, k,
                           out_axis=0 if s < 1 else 1))
    convs.append(ConvKeys("dense_head.shared_conv.0.weight", (heads.shared_channels, net.head_in_channels, 3, 3),
                       "dense_head.shared_conv.1", heads.shared_channels))
    mid = heads.middle_channels
    for h, (group, anchors) in enumerate(zip(heads.groups, head_anchors(cfg))):
        branches = [(f"{HEAD_KEY}{h}.conv_cls", anchors * len(group))]
        branches += [(f"{HEAD_KEY}{h}.conv_box.conv_{name}", anchors * width) for name, width in box_parts(cfg)]
        for prefix, out in branches:
            convs.append(ConvKeys(f"{prefix}.0.weight", (mid, heads.shared_channels, 3, 3), f"{prefix}.1", mid))
            convs.append(ConvKeys(f"{prefix}.3.weight", (out, mid, 3, 3), None, out))
    return convs


def expected_keys(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every float key of the layout for this config, with its shape (BN step counters excluded)."""
    out: dict[str, tuple[int, ...]] = {}
    for conv in _plan(cfg):
        out.update(conv.keys())
    return out


def batchnorm_folds(cfg: ModelConfig) -> dict[str, BatchNormFold]:
    """Each BatchNorm prefix -> where it folds (the conv, the eps the graph folds it with, the output axis)."""
    net, heads = cfg.network, cfg.require_heads()
    return {conv.bn: BatchNormFold(conv.weight, heads.middle_bn_eps if conv.bn.startswith(HEAD_KEY) else net.bn_eps,
                                   conv.out_axis)
            for conv in _plan(cfg) if conv.bn is not None}


def label_keys(cfg: ModelConfig) -> dict[str, list[int]]:
    """Each head's ``head_label_indices`` key and the 1-based class ids the config says it holds."""
    return {f"{HEAD_KEY}{h}.{LABEL_INDICES}": [cfg.classes.index(name) + 1 for name in group]
            for h, group in enumerate(cfg.require_heads().groups)}


def check_label_indices(state: Mapping[str, Any], cfg: ModelConfig, source: str) -> None:
    """A checkpoint whose heads hold other classes than the config's groups would label every box
    wrongly: refuse it, naming the head."""
    for key, expected in label_keys(cfg).items():
        got = state.get(key)
        values = None if not isinstance(got, np.ndarray) or got.dtype.kind not in "iu" else got.reshape(-1).tolist()
        if values != expected:
            shown = "missing" if got is None else str(values if values is not None else type(got).__name__)
            raise CheckpointError(f"{source}: {key} is {shown}; config {cfg.name} expects the classes "
                                  f"{expected} (1-based) in that head")


def weights_from_state_dict(get: Callable[[str], np.ndarray], cfg: ModelConfig) -> MultiHeadWeights:
    """Group the checked tensors (``get(key)`` -> float32 array) into ``MultiHeadWeights``."""
    plan = _plan(cfg)
    net = cfg.network
    n_blocks = sum(extra + 1 for extra in net.layer_nums)
    pfn, rest = plan[0], plan[1:]
    block_convs, rest = rest[:n_blocks], rest[n_blocks:]
    deblocks, rest = rest[: len(net.upsample_strides)], rest[len(net.upsample_strides):]
    shared, rest = rest[0], rest[1:]
    blocks, at = [], 0
    for extra in net.layer_nums:
        blocks.append(tuple(c.conv_bn(get) for c in block_convs[at: at + extra + 1]))
        at += extra + 1
    per_head = 2 * (1 + len(box_parts(cfg)))
    heads = []
    for h in range(len(cfg.require_heads().groups)):
        convs = rest[h * per_head: (h + 1) * per_head]
        pairs = [(convs[i].conv_bn(get), OutputConv(get(convs[i + 1].weight),
                                                get(convs[i + 1].weight.removesuffix("weight") + "bias")))
                 for i in range(0, per_head, 2)]
        heads.append(HeadWeights(cls=pairs[0], box=tuple(pairs[1:])))
    pfn_bn = pfn.conv_bn(get)
    return MultiHeadWeights(pfn_linear=pfn_bn.weight, pfn_bn=pfn_bn.bn, blocks=tuple(blocks),
                            deblocks=tuple(c.conv_bn(get) for c in deblocks), shared=shared.conv_bn(get), heads=tuple(heads))


# --------------------------------------------------------------------------- the RPN graph

def build_multihead_rpn_graph(weights: MultiHeadWeights, cfg: ModelConfig, g: Any, io: GraphIO) -> onnx.ModelProto:
    """NHWC canvas -> backbone -> neck (strided conv or transposed conv per branch) -> shared conv ->
    each head's class and box branches -> one NHWC map: every head's class channels, then every
    head's box channels (``ModelConfig.head_channels``), BN folded into the conv biases.

    ``g`` is the exporter's graph builder; ``io`` the RPN's tensor contract."""
    net, heads = cfg.network, cfg.require_heads()
    features = backbone_and_neck(g, weights.blocks, weights.deblocks, cfg)
    shared = _conv_bn_relu(g, features, weights.shared, net.bn_eps, "shared", pad=1, stride=1)
    cls_maps, box_maps = [], []
    for h, head in enumerate(weights.heads):
        branches = [("cls", head.cls)] + [(name, pair) for (name, _), pair in zip(box_parts(cfg), head.box)]
        outs = []
        for name, (middle, out) in branches:
            y = _conv_bn_relu(g, shared, middle, heads.middle_bn_eps, f"head{h}.{name}.mid", pad=1, stride=1)
            outs.append(g.node("Conv", [y, g.const(f"head{h}.{name}.weight", out.weight),
                                        g.const(f"head{h}.{name}.bias", out.bias)],
                               f"head{h}.{name}", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        cls_maps.append(outs[0])
        box_maps.append(g.node("Concat", outs[1:], f"head{h}.box", axis=1))
    merged = g.node("Concat", cls_maps + box_maps, "heads.concat", axis=1)
    g.output_node("Transpose", [merged], "heads.nhwc", RPN_OUTPUT, perm=[0, 2, 3, 1])
    return g.model("pointpillars_rpn", io)


def backbone_and_neck(g: Any, blocks: Sequence[Sequence[ConvBN]], deblocks: Sequence[ConvBN], cfg: ModelConfig) -> str:
    """NHWC canvas -> the backbone's blocks of 3x3 conv + BN + ReLU -> each block's neck branch (a transposed
    conv, or a strided conv where the upsample stride is below 1) + BN + ReLU -> their channel concat (NCHW):
    every PointPillars RPN's trunk, BN folded into the conv biases; ``g`` is the exporter's graph builder."""
    net = cfg.network
    x = g.node("Transpose", [RPN_INPUT], "canvas.nchw", perm=[0, 3, 1, 2])
    upsampled = []
    for i, (block, deblock, s) in enumerate(zip(blocks, deblocks, net.upsample_strides)):
        for j, layer in enumerate(block):
            x = _conv_bn_relu(g, x, layer, net.bn_eps, f"block{i}.conv{j}", pad=1, stride=layer.stride)
        k = deblock.stride
        scale, shift = deblock.bn.scale_shift(net.bn_eps)
        if s < 1:  # Conv2d (Cout, Cin, k, k), stride k: BN is on axis 0
            w = deblock.weight.astype(np.float64) * scale[:, None, None, None]
            op = "Conv"
        else:  # ConvTranspose2d (Cin, Cout, k, k): BN is on axis 1
            w = deblock.weight.astype(np.float64) * scale[None, :, None, None]
            op = "ConvTranspose"
        u = g.node(op, [x, g.const(f"deblock{i}.weight", w), g.const(f"deblock{i}.bias", shift)],
                   f"deblock{i}", kernel_shape=[k, k], strides=[k, k])
        upsampled.append(g.node("Relu", [u], f"deblock{i}.relu"))
    return str(g.node("Concat", upsampled, "neck.concat", axis=1))


def _conv_bn_relu(g: Any, x: str, layer: ConvBN, eps: float, name: str, *, pad: int, stride: int) -> str:
    scale, shift = layer.bn.scale_shift(eps)
    w = layer.weight.astype(np.float64) * scale[:, None, None, None]
    y = g.node("Conv", [x, g.const(f"{name}.weight", w), g.const(f"{name}.bias", shift)], name,
               kernel_shape=[3, 3], pads=[pad] * 4, strides=[stride] * 2)
    return g.node("Relu", [y], f"{name}.relu")
