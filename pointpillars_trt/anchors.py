"""Anchors, NMS geometry and the post-process's other constants: shared by the NumPy reference and the GPU
post-process, so the two paths cannot drift apart."""

from __future__ import annotations

import functools

import numpy as np

from .config import ModelConfig

# Corner-inside margin (metres) of each family's NMS kernel: OpenPCDet iou3d_nms (1 cm), mmdet3d-style
# iou3d of zhulf0804 (1e-5 m).
NMS_CORNER_MARGIN = {"openpcdet": 1e-2, "zhulf0804": 1e-5}
#: A class logit beyond this magnitude (float16's largest value, far past any trained network's logits), infinite
#: or NaN is the network's overflow (a corrupt value far outside its training range upstream): such scores are
#: counted (``FrameStats.num_overflowed_scores``), since the boxes there are lost (NaN or a score of 0) or absurd.
OVERFLOWED_LOGIT = 65504.0


def anchors(cfg: ModelConfig) -> np.ndarray:
    """All anchors, (H*W*per_cell, 7) float32, row ((y*W + x)*K + k)*R + r; read-only and cached.

    Family-native: OpenPCDet (x, y, z_centre, dx, dy, dz, rot), zhulf0804 (x, y, z_bottom, w, l, h,
    rot); the sizes are ``cfg.anchors.classes[k].size`` as the family stores them.
    """
    return _anchors_cached(cfg)


@functools.lru_cache(maxsize=4)
def _anchors_cached(cfg: ModelConfig) -> np.ndarray:
    nx, ny = cfg.head_map
    lo, hi = cfg.voxel.point_range[:2], cfg.voxel.point_range[3:5]
    axis = _corner_axis if cfg.anchors.alignment == "range_corners" else _center_axis
    xs, ys = axis(lo[0], hi[0], nx), axis(lo[1], hi[1], ny)
    classes = cfg.anchors.classes
    sizes = np.array([c.size for c in classes], np.float32)
    z = np.array([c.bottom for c in classes], np.float32)
    if cfg.box_coder == "openpcdet":  # OpenPCDet shifts the anchor bottoms to box centres, in float32
        z = z + sizes[:, 2] / np.float32(2)
    rots = np.array(cfg.anchors.rotations, np.float32)
    grid = np.empty((ny, nx, len(classes), len(rots), 7), np.float32)
    grid[..., 0] = xs[None, :, None, None]
    grid[..., 1] = ys[:, None, None, None]
    grid[..., 2] = z[:, None]
    grid[..., 3:6] = sizes[:, None, :]
    grid[..., 6] = rots
    flat = grid.reshape(-1, 7)
    flat.flags.writeable = False
    return flat


def _corner_axis(lo: float, hi: float, n: int) -> np.ndarray:
    """OpenPCDet (align_center False): torch.arange in double, stored as float32; ends on the range."""
    step = (hi - lo) / (n - 1)
    return (lo + step * np.arange(n)).astype(np.float32)


def _center_axis(lo: float, hi: float, n: int) -> np.ndarray:
    """zhulf0804: float32 torch.linspace(lo, hi, n + 1) (filled from both ends), plus half a step.

    Each linspace value is rounded once, as CUDA's fused multiply-add does.
    """
    lo32, hi32 = np.float32(lo), np.float32(hi)
    step = (hi32 - lo32) / np.float32(n)
    i = np.arange(n + 1)
    from_lo = np.float64(lo32) + np.float64(step) * i
    from_hi = np.float64(hi32) - np.float64(step) * (n - i)
    edges = np.where(i < (n + 1) // 2, from_lo, from_hi).astype(np.float32)
    shift = (edges[1] - edges[0]) / np.float32(2)
    return edges[:n] + shift


def head_anchors(cfg: ModelConfig) -> tuple[int, ...]:
    """Anchors per BEV cell of each head of a multi-head model: its classes x the rotations."""
    return tuple(len(group) * len(cfg.anchors.rotations) for group in cfg.require_heads().groups)


def head_rows(cfg: ModelConfig) -> list[tuple[int, int, int, int]]:
    """(class-channel offset, box-channel offset, anchors per cell, classes) of each head in the merged
    NHWC map: every head's class channels first, then every head's box channels."""
    heads = cfg.require_heads()
    rotations, code = len(cfg.anchors.rotations), cfg.box_code_size
    out, cls_at, box_at = [], 0, cfg.head_channels["cls"]
    for group in heads.groups:
        a = rotations * len(group)
        out.append((cls_at, box_at, a, len(group)))
        cls_at += a * len(group)
        box_at += a * code
    return out


def multihead_anchors(cfg: ModelConfig) -> np.ndarray:
    """All anchors (K * R * H * W, 7) in multi-head row order: class, rotation, y, x."""
    nx, ny = cfg.head_map
    k, r = len(cfg.anchors.classes), len(cfg.anchors.rotations)
    return np.ascontiguousarray(anchors(cfg).reshape(ny, nx, k, r, 7).transpose(2, 3, 0, 1, 4).reshape(-1, 7))
