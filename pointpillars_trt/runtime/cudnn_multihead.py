"""What the cuDNN engine runs for a multi-head RPN (OpenPCDet's ``AnchorHeadMulti``), read from the
BN-folded initializers of ``rpn.onnx`` (``convert/multihead.py`` names them):

* the backbone's 3x3 convs, then the shared conv and every head's middle convs, fused into ONE conv
  of (branches x middle) output channels: cuDNN graphs;
* the neck branches (strided conv or transposed conv, kernel == stride) and the heads' output convs:
  ``kernels/multihead_rpn.py``.

Branch g of the heads (a class conv, or one box-code part, of one head) reads middle channels
[g * middle, (g + 1) * middle) and writes its channels of the merged map: every head's class
channels first, then every head's box channels, the parts of a head concatenated (``box_parts``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..anchors import head_rows
from ..errors import BackendError
from ..graph_io import box_parts
from ..kernels.multihead_rpn import HeadBranch, NeckBranch

Getter = Callable[[str, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class MultiHeadRpnWeights:
    """The layers after the backbone, as float32 copies of the initializers."""

    neck: tuple[tuple[NeckBranch, np.ndarray, np.ndarray], ...]  # (branch, ONNX weight, bias)
    shared: tuple[np.ndarray, np.ndarray]  # (Cs, C_concat, 3, 3), (Cs,)
    middle: tuple[np.ndarray, np.ndarray]  # every branch's middle conv stacked: (G * Cm, Cs, 3, 3), (G * Cm,)
    heads: tuple[HeadBranch, ...]           # output convs in branch order


def head_branch_names(cfg: ModelConfig) -> list[tuple[int, str, int, int]]:
    """(head, branch name, first channel in the merged map, channels) of every output conv, in branch
    order: the heads' class convs, then each head's box-code parts (at the offsets ``head_rows`` gives)."""
    rows = head_rows(cfg)
    out = [(h, "cls", cls_at, a * n) for h, (cls_at, _, a, n) in enumerate(rows)]
    for h, (_, box_at, a, _) in enumerate(rows):
        for name, width in box_parts(cfg):
            out.append((h, name, box_at, a * width))
            box_at += a * width
    return out


def read_multihead_weights(get: Getter, cfg: ModelConfig) -> MultiHeadRpnWeights:
    """The neck, shared, middle and output conv weights of the multi-head export (``get(name, shape)``
    checks and returns one initializer)."""
    net, heads = cfg.network, cfg.heads
    if heads is None:
        raise BackendError(f"{cfg.name}: not a multi-head model")
    neck = []
    for i, (cin, s, k, cu) in enumerate(zip(net.block_channels, net.upsample_strides, net.upsample_kernels,
                                            net.upsample_channels)):
        down = s < 1
        shape = (cu, cin, k, k) if down else (cin, cu, k, k)
        neck.append((NeckBranch(cin, cu, k, down), get(f"deblock{i}.weight", shape), get(f"deblock{i}.bias", (cu,))))
    cs, cm = heads.shared_channels, heads.middle_channels
    shared = (get("shared.weight", (cs, net.head_in_channels, 3, 3)), get("shared.bias", (cs,)))
    mid_w, mid_b, outputs = [], [], []
    for h, name, at, n in head_branch_names(cfg):
        mid_w.append(get(f"head{h}.{name}.mid.weight", (cm, cs, 3, 3)))
        mid_b.append(get(f"head{h}.{name}.mid.bias", (cm,)))
        outputs.append(HeadBranch(at, get(f"head{h}.{name}.weight", (n, cm, 3, 3)), get(f"head{h}.{name}.bias", (n,))))
    return MultiHeadRpnWeights(tuple(neck), shared, (np.concatenate(mid_w), np.concatenate(mid_b)), tuple(outputs))


def initializer_getter(initializers: Mapping[str, np.ndarray]) -> Getter:
    """``get(name, shape)``: the named initializer as float32, refused when missing or misshapen."""

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in initializers:
            raise BackendError(f"rpn.onnx: initializer {name} is missing. Note: Expected the BN-folded RPN export")
        arr = np.asarray(initializers[name])
        if arr.shape != shape:
            raise BackendError(f"Initializer: {name} | Received shape: {arr.shape}. Note: Expected shape: {shape}")
        return arr.astype(np.float32)

    return get
