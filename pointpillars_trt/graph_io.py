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
RPN_INPUT = "canvas"
RPN_OUTPUTS = ("cls", "box", "dir")


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output; a ``str`` dimension is symbolic (sized per run, e.g. ``num_pillars``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def pfn_io(cfg: ModelConfig) -> GraphIO:
    m, c = cfg.voxel.max_points_per_pillar, cfg.features.channels
    return GraphIO(
        inputs=(TensorSpec(PFN_INPUT, (NUM_PILLARS_DIM, m, c)),),
        outputs=(TensorSpec(PFN_OUTPUT, (NUM_PILLARS_DIM, cfg.network.pfn_channels)),),
    )


def rpn_io(cfg: ModelConfig) -> GraphIO:
    """Batch is fixed at 1 (a symbolic batch would be a change here and in the canvas buffer)."""
    nx, ny, _ = cfg.voxel.grid
    hx, hy = cfg.head_map
    return GraphIO(
        inputs=(TensorSpec(RPN_INPUT, (1, cfg.network.pfn_channels, ny, nx)),),
        outputs=tuple(TensorSpec(name, (1, cfg.head_channels[name], hy, hx)) for name in RPN_OUTPUTS),
    )


def check_precision(precision: str) -> Precision:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not supported; expected one of {list(PRECISIONS)}")
    return precision  # type: ignore[return-value]
