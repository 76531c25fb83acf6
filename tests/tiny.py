"""The tiny-model registry: small configs, weights and inputs that every backend's tests share.

A tiny model is a built-in config shrunk to a 32 x 24 grid (head map 16 x 12), 8 points per pillar
and narrow layers, with seeded random weights, so a whole forward pass takes milliseconds on a CPU
and a float64 brute-force oracle stays cheap. Everything else (feature order, anchors, box coder,
post-processing) is the family's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from pointpillars_trt.config import ModelConfig, config_from_dict, load_config
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.model_dir import METADATA_FILE, ModelDir
from pointpillars_trt.convert.weights import PointPillarsWeights, random_weights

FAMILIES = ("openpcdet", "zhulf0804")


def tiny_config(family: str = "openpcdet") -> ModelConfig:
    """The family's KITTI config on a 5.12 x 3.84 m range (32 x 24 pillars) with a narrow network."""
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    cfg = load_config(f"{family}_kitti_3class")
    z0, z1 = cfg.voxel.point_range[2], cfg.voxel.point_range[5]
    voxel = dataclasses.replace(
        cfg.voxel, point_range=(0.0, -1.92, z0, 5.12, 1.92, z1), max_points_per_pillar=8, max_pillars=256
    )
    network = dataclasses.replace(
        cfg.network,
        pfn_channels=16,
        layer_nums=(1, 1, 1),
        block_channels=(8, 16, 32),
        upsample_channels=(16, 16, 16),
    )
    tiny = dataclasses.replace(cfg, name=f"tiny_{family}", voxel=voxel, network=network)
    return config_from_dict(tiny.to_dict(), "tiny_config")  # validated like any config


def tiny_multi_sweep_config() -> ModelConfig:
    """The tiny openpcdet config reading a 5th point column, each point's time lag (a multi-sweep model's)."""
    spec = tiny_config().to_dict()
    spec["point_columns"] = ["x", "y", "z", "intensity", "time"]
    spec["features"]["order"] = ["x", "y", "z", "intensity", "time", "mean_dx", "mean_dy", "mean_dz",
                                 "center_dx", "center_dy", "center_dz"]
    return config_from_dict(spec, "tiny_multi_sweep_config")


def tiny_weights(cfg: ModelConfig, seed: int = 0) -> PointPillarsWeights:
    return random_weights(cfg, seed)


def tiny_model_dir(
    out_dir: str | os.PathLike[str], family: str = "openpcdet", precision: str = "fp32", seed: int = 0
) -> ModelDir:
    """A model dir of the tiny model, as ``pointpillars-trt build`` would write it."""
    cfg = tiny_config(family)
    return export_model_dir(
        tiny_weights(cfg, seed), cfg, Path(out_dir), precision=precision, source={"random_seed": seed, "tiny": True}
    )


def overflowed_pillar_features(model: ModelDir | str | os.PathLike[str], points: np.ndarray) -> int:
    """A frame's pillar features beyond float16's 65504 (``FrameStats.num_overflowed_features``), computed here in
    float64 as max over slots of ReLU(x W^T + b), from the weights of the model's ``pfn.onnx`` (no engine)."""
    from pointpillars_trt.model_dir import load_model_dir, pfn_weights
    from pointpillars_trt.reference import voxelize

    model = model if isinstance(model, ModelDir) else load_model_dir(model)
    weight, bias = pfn_weights(model)
    x = voxelize(points, model.cfg).features.astype(np.float64)
    return int(np.count_nonzero(np.maximum(x @ weight.T.astype(np.float64) + bias, 0).max(axis=1) > 65504))


def set_unknown_format_version(model: Path) -> str:
    """Rewrite the model dir ``model``'s model.json with a format version no release writes (999), and return the
    start of the one error line a command refuses it with."""
    meta_path = model / METADATA_FILE
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 999
    meta_path.write_text(json.dumps(meta))
    return f"error: '{meta_path}': format_version 999 is not known to pointpillars-trt "


def random_pillars(cfg: ModelConfig, num_pillars: int, seed: int = 0) -> np.ndarray:
    """PFN input (P, M, C) float32 following the contract: each pillar has 1..M points, padded slots are zero.

    Values are lidar-like in size: coordinates inside the range, offsets inside a pillar.
    """
    rng = np.random.default_rng(seed)
    m, c = cfg.voxel.max_points_per_pillar, cfg.features.channels
    lo, hi = np.array(cfg.voxel.point_range[:3]), np.array(cfg.voxel.point_range[3:])
    size = np.array(cfg.voxel.pillar_size)
    features = np.empty((num_pillars, m, c))
    for k, name in enumerate(cfg.features.order):
        if name == "intensity":
            features[..., k] = rng.uniform(0.0, 1.0, (num_pillars, m))
        elif name in ("x", "y", "z"):
            axis = "xyz".index(name)
            features[..., k] = rng.uniform(lo[axis], hi[axis], (num_pillars, m))
        else:
            axis = "xyz".index(name[-1])
            features[..., k] = rng.uniform(-0.5, 0.5, (num_pillars, m)) * size[axis]
    count = rng.integers(1, m + 1, num_pillars)
    features[np.arange(m)[None, :] >= count[:, None]] = 0.0
    return features.astype(np.float32)


def random_canvas(cfg: ModelConfig, occupancy: float = 0.2, seed: int = 0) -> np.ndarray:
    """RPN input (1, Cf, ny, nx) float32: non-negative pillar features in a share of the cells, zeros elsewhere."""
    rng = np.random.default_rng(seed)
    nx, ny, _ = cfg.voxel.grid
    occupied = rng.random((ny, nx)) < occupancy
    values = np.abs(rng.standard_normal((1, cfg.network.pfn_channels, ny, nx)))
    return (values * occupied).astype(np.float32)
