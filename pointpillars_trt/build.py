"""Checkpoint -> model dir (ONNX graphs + metadata, and TensorRT plans on request).

The CLI's ``build`` and ``PointPillars.from_checkpoint`` share these builders, so a model dir is the
same whichever way it was made.
"""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import load_checkpoint
from .errors import PointPillarsError
from .model_dir import GRAPHS, ModelDir, export_model_dir
from .onnx_export import PFN_INPUT, check_precision

BACKENDS = ("onnxruntime", "tensorrt")


def build_model_dir(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
                    config: str | None = None, backend: str = "onnxruntime", precision: str = "fp32",
                    tf32: bool = True) -> ModelDir:
    if backend not in BACKENDS:
        raise PointPillarsError(f"backend {backend!r}: expected one of {BACKENDS}")
    check_precision(precision)
    if backend == "tensorrt":  # fail before any work when the plans cannot be built here
        from .runtime.tensorrt import require_tensorrt

        require_tensorrt()
    ckpt = load_checkpoint(checkpoint, config)
    cfg = ckpt.config
    source = {"checkpoint": str(Path(checkpoint).resolve()), "sha256": ckpt.sha256, "layout": ckpt.layout}
    model = export_model_dir(ckpt.weights, cfg, out, precision=precision, source=source)
    if backend == "tensorrt":
        build_model_plans(model, precision=precision, tf32=tf32)
    return model


def build_model_plans(model: ModelDir, precision: str = "fp32", *, tf32: bool = True) -> None:
    """Build a TensorRT plan beside each ONNX graph of ``model``, sharing one timing cache in the dir.

    ``tf32`` keeps TensorRT's default of TensorFloat-32 convolutions in fp32 (``--no-tf32``: IEEE fp32).

    The PFN is built for exactly ``max_pillars`` rows (the pipeline always binds that many), and each
    plan records the config digest so a plan of another config is refused at load time.
    """
    from .runtime.tensorrt import build_plan

    checked = check_precision(precision)
    p_max = model.cfg.voxel.max_pillars
    dynamic = {"pfn": {PFN_INPUT: (1, p_max, p_max)}, "rpn": None}
    for graph in GRAPHS:
        build_plan(model.onnx_path(graph), model.plan_path(graph), precision=checked,
                   dynamic_rows=dynamic[graph], config_digest=model.cfg.digest(),
                   timing_cache_path=model.path / "timing.cache", tf32=tf32)
