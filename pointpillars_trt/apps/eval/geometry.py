"""Exact box overlaps for KITTI evaluation, vectorised over pairs of boxes.

Rotated bird's-eye-view boxes are intersected by Sutherland-Hodgman clipping in float64, run on
every pair at once with fixed-width vertex arrays, so the cost is a few NumPy calls however many
pairs there are. Functions named ``*_pairs`` take two arrays of the same length and compare row i
with row i; callers build the pairs they need (one frame's GT x detections, say).

Box layouts (KITTI rect camera frame, x right, y down, z forward):
- 2D image box: (x1, y1, x2, y2) in pixels.
- BEV box: (x, z, l, w, ry): centre on the ground plane, length along the box's local x.
- 3D box: (x, y, z, h, w, l, ry): bottom centre at y, top at y - h.
"""

from __future__ import annotations

import numpy as np

_MAX_VERTICES = 8  # a convex quadrilateral cut by four half-planes has at most 8 corners


def box2d_intersection_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Area shared by image boxes a[i] and b[i]; touching or disjoint boxes give 0."""
    iw = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    ih = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    return np.where((iw > 0) & (ih > 0), iw * ih, 0.0)


def _ratio(inter: np.ndarray, union: np.ndarray) -> np.ndarray:
    """Intersection over union, 0 where nothing is shared or the union is empty (a box of no area), never
    beyond 1: a degenerate box is no match for anything, not an infinite one."""
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=(inter > 0) & (union > 0))
    return np.clip(iou, 0.0, 1.0)


def _box2d_area(a: np.ndarray) -> np.ndarray:
    return (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])


def box2d_iou_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of image boxes a[i], b[i] (continuous pixel extents, no +1 as in the KITTI devkit)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    inter = box2d_intersection_pairs(a, b)
    union = _box2d_area(a) + _box2d_area(b) - inter
    return _ratio(inter, union)


def box2d_coverage_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Fraction of image box a[i] inside b[i]: how much of a detection a DontCare region covers."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    inter = box2d_intersection_pairs(a, b)
    return np.divide(inter, _box2d_area(a), out=np.zeros_like(inter), where=inter > 0)


def camera_bev_corners(boxes: np.ndarray) -> np.ndarray:
    """(..., 5) camera-frame BEV boxes (x, z, l, w, ry) -> (..., 4, 2) corners, counter-clockwise in the (x, z) plane.

    The rotation is KITTI's rotation_y about the downward y axis, which in (x, z) reads
    x' = cos(ry) x + sin(ry) z, z' = -sin(ry) x + cos(ry) z (a proper rotation, so the
    local counter-clockwise order survives).
    """
    b = np.asarray(boxes, np.float64)
    half_l, half_w = b[..., 2:3] / 2, b[..., 3:4] / 2
    local_x = np.concatenate([-half_l, half_l, half_l, -half_l], axis=-1)
    local_z = np.concatenate([-half_w, -half_w, half_w, half_w], axis=-1)
    c, s = np.cos(b[..., 4:5]), np.sin(b[..., 4:5])
    x = c * local_x + s * local_z + b[..., 0:1]
    z = -s * local_x + c * local_z + b[..., 1:2]
    return np.stack([x, z], axis=-1)


def _clip(poly: np.ndarray, count: np.ndarray, e0: np.ndarray, e1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the part of each convex polygon left of its directed line e0 -> e1.

    poly (P, K, 2) holds count[p] valid vertices first; returns the same layout, width 8.
    Each vertex emits itself when inside and the crossing point when its edge leaves or enters,
    then the valid outputs are packed to the front with a stable sort.
    """
    k = poly.shape[1]
    slot = np.arange(k)
    valid = slot[None, :] < count[:, None]
    nxt = np.where(slot[None, :] + 1 < count[:, None], slot[None, :] + 1, 0)
    nxt_pts = np.take_along_axis(poly, nxt[..., None], axis=1)
    edge = (e1 - e0)[:, None, :]
    rel = poly - e0[:, None, :]
    side = edge[..., 0] * rel[..., 1] - edge[..., 1] * rel[..., 0]
    side_nxt = np.take_along_axis(side, nxt, axis=1)
    inside, inside_nxt = side >= 0, side_nxt >= 0
    crosses = valid & (inside != inside_nxt)
    denom = np.where(crosses, side - side_nxt, 1.0)
    t = (side / denom)[..., None]
    crossing = poly + t * (nxt_pts - poly)
    out = np.stack([poly, crossing], axis=2).reshape(len(poly), 2 * k, 2)
    keep = np.stack([valid & inside, crosses], axis=2).reshape(len(poly), 2 * k)
    order = np.argsort(~keep, axis=1, kind="stable")[:, :_MAX_VERTICES]
    packed = np.take_along_axis(out, order[..., None], axis=1)
    return packed, np.minimum(keep.sum(axis=1), _MAX_VERTICES)


def _polygon_area(poly: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Shoelace area of the first count[p] vertices of each polygon (0 for fewer than 3)."""
    k = poly.shape[1]
    slot = np.arange(k)
    nxt = np.where(slot[None, :] + 1 < count[:, None], slot[None, :] + 1, 0)
    nxt_pts = np.take_along_axis(poly, nxt[..., None], axis=1)
    cross = poly[..., 0] * nxt_pts[..., 1] - poly[..., 1] * nxt_pts[..., 0]
    cross = np.where(slot[None, :] < count[:, None], cross, 0.0)
    return np.where(count >= 3, np.abs(cross.sum(axis=1)) / 2, 0.0)


def bev_intersection_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact area shared by rotated BEV boxes a[i] and b[i] ((P, 5) each); 0 where either has no area.

    A box of zero length and width is a point, whose four clipping lines have no direction: clipping by
    them would keep the other box whole, so such pairs (and any with a length or width <= 0) share nothing.
    """
    a, b = np.asarray(a, np.float64).reshape(-1, 5), np.asarray(b, np.float64).reshape(-1, 5)
    area = np.zeros(len(a))
    # Boxes whose circumscribed circles do not meet cannot overlap; skip them up front.
    reach = (np.hypot(a[:, 2], a[:, 3]) + np.hypot(b[:, 2], b[:, 3])) / 2
    sized = (a[:, 2:4] > 0).all(axis=1) & (b[:, 2:4] > 0).all(axis=1)
    near = np.flatnonzero(sized & (np.hypot(a[:, 0] - b[:, 0], a[:, 1] - b[:, 1]) < reach))
    if near.size == 0:
        return area
    poly = camera_bev_corners(a[near])
    clip = camera_bev_corners(b[near])
    count = np.full(len(near), 4)
    for i in range(4):
        poly, count = _clip(poly, count, clip[:, i], clip[:, (i + 1) % 4])
    area[near] = _polygon_area(poly, count)
    return area


def camera_box_iou_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(BEV IoU, 3D IoU) of 3D camera boxes a[i], b[i], sharing one BEV intersection.

    The 3D intersection is the BEV intersection times the shared height span, each box
    spanning [y - h, y] (y points down, y is the bottom).
    """
    a, b = np.asarray(a, np.float64).reshape(-1, 7), np.asarray(b, np.float64).reshape(-1, 7)
    bev_cols = [0, 2, 5, 4, 6]  # x, z, l, w, ry
    inter_bev = bev_intersection_pairs(a[:, bev_cols], b[:, bev_cols])
    union_bev = a[:, 4] * a[:, 5] + b[:, 4] * b[:, 5] - inter_bev
    bev = _ratio(inter_bev, union_bev)
    span = np.minimum(a[:, 1], b[:, 1]) - np.maximum(a[:, 1] - a[:, 3], b[:, 1] - b[:, 3])
    inter = inter_bev * np.maximum(span, 0.0)
    union = a[:, 3] * a[:, 4] * a[:, 5] + b[:, 3] * b[:, 4] * b[:, 5] - inter
    return bev, _ratio(inter, union)
