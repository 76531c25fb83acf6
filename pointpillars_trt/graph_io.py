"""The engines' tensor contract: names, shapes and precisions shared by the ONNX export, the model dir,
every engine backend and the GPU pipeline. A leaf: it imports no ONNX and no GPU code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .config import ModelConfig
from .errors import ConfigError

Precision = Literal["fp32", "fp16"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16")

PFN_INPUT = "pillars"
PFN_OUTPUT = "pillar_features"
NUM_PILLARS_DIM = "num_pillars"
BATCH_DIM = "batch"
RPN_INPUT = "canvas"
RPN_OUTPUT = "heads"
HEAD_PARTS = ("cls", "box", "dir")  # the channel blocks of the merged head map, in this order
MAX_BATCH = 8  # the largest batch the pipeline and TensorRT profiles are sized for by default
#: A pillar feature (an output of the PFN, a value of the RPN's canvas) beyond this (float16's largest value: inf
#: in an fp16 canvas), infinite or NaN came of a point value far outside the network's training (a corrupt
#: intensity): such features are counted (``FrameStats.num_overflowed_features``) whatever the precision, since the
#: boxes there are meaningless and an engine's ReLUs may turn the overflow into finite values downstream.
OVERFLOWED_FEATURE = 65504.0


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output; a ``str`` dimension is symbolic (sized per run, e.g. ``num_pillars``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]


def pfn_io(cfg: ModelConfig) -> GraphIO:
    m, c = cfg.voxel.max_points_per_pillar, cfg.features.channels
    return GraphIO(
        inputs=(GraphTensor(PFN_INPUT, (NUM_PILLARS_DIM, m, c)),),
        outputs=(GraphTensor(PFN_OUTPUT, (NUM_PILLARS_DIM, cfg.network.pfn_channels)),),
    )


def rpn_io(cfg: ModelConfig, precision: str = "fp32") -> GraphIO:
    """NHWC end to end: the canvas in the RPN's compute precision (float16 for fp16, so the scatter
    kernel writes what the first conv reads) and one merged float32 head map, cls | box | dir, so the
    post-process reads one tensor. The batch dimension is dynamic."""
    nx, ny, _ = cfg.voxel.grid
    hx, hy = cfg.head_map
    return GraphIO(
        inputs=(GraphTensor(RPN_INPUT, (BATCH_DIM, ny, nx, cfg.network.pfn_channels), canvas_dtype(precision)),),
        outputs=(GraphTensor(RPN_OUTPUT, (BATCH_DIM, hy, hx, head_channels(cfg))),),
    )


def canvas_dtype(precision: str) -> str:
    return "float16" if check_precision(precision) == "fp16" else "float32"


def head_channels(cfg: ModelConfig) -> int:
    return sum(cfg.head_channels[part] for part in HEAD_PARTS)


def check_precision(precision: str) -> Precision:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not supported; expected one of {list(PRECISIONS)}")
    return precision  # type: ignore[return-value]


def box_parts(cfg: ModelConfig) -> tuple[tuple[str, int], ...]:
    """(name, values per anchor) of each box conv of a head, in OpenPCDet's concatenation order."""
    angle = 2 if cfg.box_code.angle == "sincos" else 1
    parts = (("reg", 2), ("height", 1), ("size", 3), ("angle", angle))
    return parts + ((("velo", 2),) if cfg.box_code.velocity else ())


