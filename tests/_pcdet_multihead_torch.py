"""OpenPCDet's multi-head PointPillars (``cbgs_pp_multihead``) inference re-written for tests in PyTorch
(CPU), from OpenPCDet's behaviour: its own voxelizer, unfolded BatchNorms, torch convolutions, its own
anchors, ResidualCoder decode with (cos, sin) headings and velocity, and per-class NMS inside each head
with an exact polygon-clipping IoU. It shares no code with the package, so the CPU detector and the
ONNX graph are checked against an independent computation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

RANGE = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0)
VOXEL = (0.2, 0.2, 8.0)
GRID = (512, 512)
MAX_POINTS, MAX_VOXELS = 20, 30000
GROUPS = (("car",), ("truck", "construction_vehicle"), ("bus", "trailer"), ("barrier",), ("motorcycle", "bicycle"),
          ("pedestrian", "traffic_cone"))
ANCHORS = {  # class: (size, bottom)
    "car": ((4.63, 1.97, 1.74), -0.95), "truck": ((6.93, 2.51, 2.84), -0.6),
    "construction_vehicle": ((6.37, 2.85, 3.19), -0.225), "bus": ((10.5, 2.94, 3.47), -0.085),
    "trailer": ((12.29, 2.90, 3.87), 0.115), "barrier": ((0.50, 2.53, 0.98), -1.33),
    "motorcycle": ((2.11, 0.77, 1.47), -1.085), "bicycle": ((1.70, 0.60, 1.28), -1.18),
    "pedestrian": ((0.73, 0.67, 1.77), -0.935), "traffic_cone": ((0.41, 0.41, 1.07), -1.285),
}
ROTATIONS = (0.0, 1.57)
REG = (("reg", 2), ("height", 1), ("size", 3), ("angle", 2), ("velo", 2))
CODE = 10


def _t(state: dict[str, np.ndarray], key: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(state[key], np.float32))


def _bn(x: torch.Tensor, state: dict[str, np.ndarray], prefix: str, eps: float) -> torch.Tensor:
    return F.batch_norm(x, _t(state, f"{prefix}.running_mean"), _t(state, f"{prefix}.running_var"),
                        _t(state, f"{prefix}.weight"), _t(state, f"{prefix}.bias"), False, 0.0, eps)


def voxelize(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Range mask (x, y inclusive), then pillars in first-point order, up to MAX_POINTS points each."""
    pts = torch.from_numpy(points)
    keep = ((pts[:, 0] >= RANGE[0]) & (pts[:, 0] <= RANGE[3]) & (pts[:, 1] >= RANGE[1]) & (pts[:, 1] <= RANGE[4]))
    pts = pts[keep]
    lo = torch.tensor(RANGE[:3], dtype=torch.float32)
    size = torch.tensor(VOXEL, dtype=torch.float32)
    cell = torch.floor((pts[:, :3] - lo) / size).to(torch.int64)
    inside = ((cell[:, 0] >= 0) & (cell[:, 0] < GRID[0]) & (cell[:, 1] >= 0) & (cell[:, 1] < GRID[1])
              & (cell[:, 2] == 0))
    pts, cell = pts[inside].numpy(), cell[inside].numpy()
    slots: dict[tuple[int, int], list[int]] = {}
    for i, (cx, cy, _) in enumerate(cell.tolist()):
        members = slots.setdefault((cx, cy), [])
        if len(members) < MAX_POINTS:
            members.append(i)
    order = list(slots.items())[:MAX_VOXELS]
    voxels = np.zeros((len(order), MAX_POINTS, points.shape[1]), np.float32)
    counts = np.zeros(len(order), np.int64)
    coords = np.zeros((len(order), 2), np.int64)  # (x, y) cell
    for v, ((cx, cy), members) in enumerate(order):
        voxels[v, : len(members)] = pts[members]
        counts[v] = len(members)
        coords[v] = (cx, cy)
    return voxels, counts, coords


def pillar_features(state: dict[str, np.ndarray], voxels: np.ndarray, counts: np.ndarray,
                    coords: np.ndarray) -> torch.Tensor:
    """PillarVFE: points, point - mean, point - centre; masked; Linear + BN1d + ReLU; max over points."""
    v = torch.from_numpy(voxels)
    n = torch.from_numpy(counts).to(torch.float32).view(-1, 1, 1)
    mean = v[:, :, :3].sum(dim=1, keepdim=True) / n
    c = torch.from_numpy(coords).to(torch.float32)
    centre = torch.stack([v[:, :, 0] - (c[:, 0:1] * VOXEL[0] + (VOXEL[0] / 2 + RANGE[0])),
                          v[:, :, 1] - (c[:, 1:2] * VOXEL[1] + (VOXEL[1] / 2 + RANGE[1])),
                          v[:, :, 2] - (0 * VOXEL[2] + (VOXEL[2] / 2 + RANGE[2]))], dim=-1)
    feats = torch.cat([v, v[:, :, :3] - mean, centre], dim=-1)
    mask = (torch.arange(MAX_POINTS).view(1, -1) < torch.from_numpy(counts).view(-1, 1)).to(torch.float32)
    feats = feats * mask.unsqueeze(-1)
    x = feats @ _t(state, "vfe.pfn_layers.0.linear.weight").T
    x = _bn(x.permute(0, 2, 1), state, "vfe.pfn_layers.0.norm", 1e-3).permute(0, 2, 1)
    return F.relu(x).max(dim=1).values


def rpn(state: dict[str, np.ndarray], canvas: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(1, 64, ny, nx) canvas -> per head: class logits (A*H*W, n) and box codes (A*H*W, CODE)."""
    x, ups = canvas, []
    for i, layers in enumerate((3, 5, 5)):
        for j in range(layers + 1):
            m = 1 + 3 * j
            if j == 0:
                x = F.conv2d(F.pad(x, (1, 1, 1, 1)), _t(state, f"backbone_2d.blocks.{i}.{m}.weight"), stride=2)
            else:
                x = F.conv2d(x, _t(state, f"backbone_2d.blocks.{i}.{m}.weight"), padding=1)
            x = F.relu(_bn(x, state, f"backbone_2d.blocks.{i}.{m + 1}", 1e-3))
        w = _t(state, f"backbone_2d.deblocks.{i}.0.weight")
        if i == 0:  # UPSAMPLE_STRIDES 0.5: Conv2d(kernel 2, stride 2)
            u = F.conv2d(x, w, stride=2)
        else:
            u = F.conv_transpose2d(x, w, stride=w.shape[-1])
        ups.append(F.relu(_bn(u, state, f"backbone_2d.deblocks.{i}.1", 1e-3)))
    x = torch.cat(ups, dim=1)
    x = F.relu(_bn(F.conv2d(x, _t(state, "dense_head.shared_conv.0.weight"), padding=1), state,
                   "dense_head.shared_conv.1", 1e-3))

    def branch(prefix: str) -> torch.Tensor:
        y = F.relu(_bn(F.conv2d(x, _t(state, f"{prefix}.0.weight"), padding=1), state, f"{prefix}.1", 1e-5))
        return F.conv2d(y, _t(state, f"{prefix}.3.weight"), _t(state, f"{prefix}.3.bias"), padding=1)

    cls_out, box_out = [], []
    h_, w_ = x.shape[2:]
    for h, group in enumerate(GROUPS):
        a = len(group) * len(ROTATIONS)
        cls = branch(f"dense_head.rpn_heads.{h}.conv_cls")
        box = torch.cat([branch(f"dense_head.rpn_heads.{h}.conv_box.conv_{name}") for name, _ in REG], dim=1)
        cls_out.append(cls.view(a, len(group), h_, w_).permute(0, 2, 3, 1).reshape(-1, len(group)))
        box_out.append(box.view(a, CODE, h_, w_).permute(0, 2, 3, 1).reshape(-1, CODE))
    return cls_out, box_out


def anchors(hx: int, hy: int) -> torch.Tensor:
    """Every class's anchors, (rot, y, x) each, classes in order, 7 values padded to CODE with zeros."""
    xs = torch.arange(RANGE[0], RANGE[3] + 1e-5, step=(RANGE[3] - RANGE[0]) / (hx - 1), dtype=torch.float32)
    ys = torch.arange(RANGE[1], RANGE[4] + 1e-5, step=(RANGE[4] - RANGE[1]) / (hy - 1), dtype=torch.float32)
    out = []
    for name in [n for g in GROUPS for n in g]:
        size, bottom = ANCHORS[name]
        for rot in ROTATIONS:
            yy, xx = torch.meshgrid(ys, xs, indexing="ij")
            a = torch.zeros(hy, hx, CODE)
            a[..., 0], a[..., 1] = xx, yy
            a[..., 2] = torch.tensor(bottom, dtype=torch.float32) + torch.tensor(size[2], dtype=torch.float32) / 2
            a[..., 3:6] = torch.tensor(size, dtype=torch.float32)
            a[..., 6] = rot
            out.append(a.reshape(-1, CODE))
    return torch.cat(out)


def decode(codes: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """ResidualCoder with encode_angle_by_sincos: (N, 10) codes -> (N, 9) boxes (x..heading, vx, vy)."""
    diag = torch.sqrt(a[:, 3] ** 2 + a[:, 4] ** 2)
    heading = torch.atan2(codes[:, 7] + torch.sin(a[:, 6]), codes[:, 6] + torch.cos(a[:, 6]))
    return torch.stack([codes[:, 0] * diag + a[:, 0], codes[:, 1] * diag + a[:, 1], codes[:, 2] * a[:, 5] + a[:, 2],
                        torch.exp(codes[:, 3]) * a[:, 3], torch.exp(codes[:, 4]) * a[:, 4],
                        torch.exp(codes[:, 5]) * a[:, 5], heading, codes[:, 8] + a[:, 7], codes[:, 9] + a[:, 8]], 1)


def _corners(b: np.ndarray) -> list[tuple[float, float]]:
    c, s = np.cos(b[6]), np.sin(b[6])
    return [(b[0] + dx * c - dy * s, b[1] + dx * s + dy * c)
            for dx, dy in ((-b[3] / 2, -b[4] / 2), (b[3] / 2, -b[4] / 2), (b[3] / 2, b[4] / 2), (-b[3] / 2, b[4] / 2))]


def _clip(poly: list[tuple[float, float]], a: tuple[float, float], b: tuple[float, float]) -> list[tuple[float, float]]:
    """Sutherland-Hodgman: the part of ``poly`` left of the directed edge a -> b."""
    def side(p: tuple[float, float]) -> float:
        return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])

    out = []
    for i, p in enumerate(poly):
        q = poly[(i + 1) % len(poly)]
        sp, sq = side(p), side(q)
        if sp >= 0:
            out.append(p)
        if sp * sq < 0:
            t = sp / (sp - sq)
            out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return out


def _area(poly: list[tuple[float, float]]) -> float:
    return abs(sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(poly, poly[1:] + poly[:1]))) / 2 if len(poly) > 2 else 0.0


def bev_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Exact BEV IoU of two (x, y, z, dx, dy, dz, heading) boxes (float64 polygon clipping)."""
    pa, pb = _corners(a.astype(np.float64)), _corners(b.astype(np.float64))
    inter = pa
    for i in range(4):
        inter = _clip(inter, pb[i], pb[(i + 1) % 4])
        if not inter:
            return 0.0
    overlap = _area(inter)
    return overlap / max(a[3] * a[4] + b[3] * b[4] - overlap, 1e-8)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    for i in order.tolist():
        if all(bev_iou(boxes[i], boxes[j]) <= threshold for j in keep):
            keep.append(i)
    return keep


def detect(state: dict[str, np.ndarray], points: np.ndarray, *, score: float = 0.1, top_k: int = 1000,
           iou: float = 0.2, max_boxes: int = 83) -> dict[str, Any]:
    """boxes (N, 9), scores (N,), labels (N,) 1-based, in OpenPCDet's output order."""
    with torch.no_grad():
        voxels, counts, coords = voxelize(points)
        feats = pillar_features(state, voxels, counts, coords)
        canvas = torch.zeros(64, GRID[1] * GRID[0])
        canvas[:, torch.from_numpy(coords[:, 1] * GRID[0] + coords[:, 0])] = feats.T
        cls_out, box_out = rpn(state, canvas.view(1, 64, GRID[1], GRID[0]))
        all_anchors = anchors(GRID[0] // 4, GRID[1] // 4)
        boxes, scores, labels, start, label = [], [], [], 0, 1
        for logits, codes in zip(cls_out, box_out):
            decoded = decode(codes, all_anchors[start: start + codes.shape[0]]).numpy()
            probs = torch.sigmoid(logits).numpy()
            for k in range(probs.shape[1]):
                mask = np.flatnonzero(probs[:, k] >= score)
                s = probs[mask, k]
                top = np.argsort(-s, kind="stable")[:top_k]
                kept = mask[top][nms(decoded[mask[top], :7], s[top], iou)[:max_boxes]]
                boxes.append(decoded[kept])
                scores.append(probs[kept, k])
                labels.append(np.full(kept.size, label + k))
            start += codes.shape[0]
            label += probs.shape[1]
    return {"boxes": np.concatenate(boxes), "scores": np.concatenate(scores), "labels": np.concatenate(labels),
            "canvas": canvas.view(1, 64, GRID[1], GRID[0]).numpy(), "cls": cls_out, "box": box_out}
