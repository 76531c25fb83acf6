"""NumPy post-processing of both checkpoint families: the CPU path and the oracle of postprocess.cu.

Anchors, box decoding, direction handling, rotated bird's-eye-view IoU / NMS and the whole detection
step, each as the family's own code does it (OpenPCDet
``anchor_generator.py``, ``ResidualCoder``, ``generate_predicted_boxes``, ``class_agnostic_nms``,
``iou3d_nms_kernel.cu``; zhulf0804 ``anchors.py``, ``get_predicted_bboxes_single``, ``test.py`` and
its mmdet3d-derived ``iou3d_kernel.cu``).

Numerics. Element-wise steps (sigmoid, decode, direction) run in float32 in the family's operation
order, so they match PyTorch up to the ulp-level differences of ``exp`` and of FMA contraction. The
polygon geometry of the IoU runs in float64 on the float32 boxes: it reproduces the kernels' logic
(margins, strict tests, angular sort, fan area) without float32 rounding, so it can differ from
a GPU run only for boxes that touch to within float32 noise. PyTorch leaves the order of tied scores
unspecified (``topk``, ``sort``); we break ties by the lower index (stable sorts) everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..anchors import NMS_CORNER_MARGIN, OVERFLOWED_LOGIT, anchors
from ..config import ModelConfig
from ..errors import ConfigError, InputError

IOU_STYLES = ("openpcdet", "zhulf0804")
_EPS = 1e-8  # the kernels' EPS: line-intersection fallback and IoU denominator floor
# Corner rotation sense of each family's IoU kernel: OpenPCDet rotates the corners counter-clockwise by
# the heading; the mmdet3d-style kernel of zhulf0804 rotates them clockwise by the yaw (i.e. by -yaw).
# (margin, sense in which a box's corners are rotated by its angle)
_STYLE_GEOMETRY = {"openpcdet": (NMS_CORNER_MARGIN["openpcdet"], 1.0), "zhulf0804": (NMS_CORNER_MARGIN["zhulf0804"], -1.0)}


@dataclass(frozen=True, eq=False)
class RawDetections:
    """Post-processing output for one frame, rows in the family's output order.

    ``boxes`` (N, 7) float32 in OpenPCDet's convention (x, y, z_centre, dx, dy, dz, heading) whatever
    the family; ``native_boxes`` the same boxes in the family's own convention (what its code
    returns); ``scores`` (N,) float32; ``labels`` (N,) int32, 0-based into ``cfg.classes``;
    ``velocity`` (N, 2) float32 (vx, vy) in m/s for models that predict it, else None; ``overflowed_scores`` the
    class scores (anchors x classes) whose logit the network overflowed to (``overflowed_logits``).
    """

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    native_boxes: np.ndarray
    velocity: np.ndarray | None = None
    overflowed_scores: int = 0

    def __len__(self) -> int:
        return int(self.scores.shape[0])


# --------------------------------------------------------------------------- decoding

def decode_boxes(box_codes: np.ndarray, anchor_boxes: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Regression codes (N, 7) + anchors (N, 7) -> family-native boxes (N, 7) float32 (no direction)."""
    t = np.asarray(box_codes, np.float32)
    a = np.asarray(anchor_boxes, np.float32)
    diag = np.sqrt(a[:, 3] * a[:, 3] + a[:, 4] * a[:, 4])
    out = np.empty(t.shape, np.float32)
    out[:, 0] = t[:, 0] * diag + a[:, 0]
    out[:, 1] = t[:, 1] * diag + a[:, 1]
    out[:, 3:6] = a[:, 3:6] * np.exp(t[:, 3:6])
    out[:, 6] = a[:, 6] + t[:, 6]
    if cfg.box_coder == "openpcdet":  # ResidualCoder: z is the centre on both sides
        out[:, 2] = t[:, 2] * a[:, 5] + a[:, 2]
    else:  # anchors2bboxes: via the centre, back to the bottom with the decoded height
        half = np.float32(2)
        out[:, 2] = (t[:, 2] * a[:, 5] + a[:, 2] + a[:, 5] / half) - out[:, 5] / half
    return out


def limit_period(val: np.ndarray, offset: float, period: float) -> np.ndarray:
    """val - floor(val / period + offset) * period, in float32 as both families compute it."""
    v = np.asarray(val, np.float32)
    p = np.float32(period)
    return v - np.floor(v / p + np.float32(offset)) * p


def apply_direction(angles: np.ndarray, dir_labels: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Fold the angle into one half turn, then add a half turn where the direction bin says so.

    OpenPCDet: limit_period(h - 0.78539, 0, pi) + 0.78539 + pi * label; zhulf0804:
    limit_period(yaw, 1, pi) + pi * (1 - label). ``cfg.direction`` carries offset, limit offset and
    the bin that flips.
    """
    d = cfg.require_direction("the direction fold")
    if d.num_bins != 2:
        raise ConfigError(f"direction.num_bins is {d.num_bins}; both families use 2 bins")
    period = np.float32(np.pi)
    offset = np.float32(d.offset)
    folded = limit_period(np.asarray(angles, np.float32) - offset, d.limit_offset, period)
    flips = (np.asarray(dir_labels) == d.flip_bin).astype(np.float32)
    return (folded + offset) + period * flips


# --------------------------------------------------------------------------- box conventions

def to_openpcdet_boxes(native: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Family-native boxes -> OpenPCDet's (x, y, z_centre, dx=length, dy=width, dz, heading), float32.

    zhulf0804 (x, y, z_bottom, w, l, h, yaw) maps to (x, y, z + h/2, l, w, h, -yaw - pi/2).
    """
    b = np.asarray(native, np.float32).reshape(-1, 7)
    if cfg.box_coder == "openpcdet":
        return b.copy()
    d = b.astype(np.float64)
    out = np.stack(
        [d[:, 0], d[:, 1], d[:, 2] + d[:, 5] / 2, d[:, 4], d[:, 3], d[:, 5], -d[:, 6] - np.pi / 2], axis=1
    )
    return out.astype(np.float32)


def nms_boxes(native: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """What the family hands its NMS kernel: OpenPCDet the 7-vector boxes, zhulf0804
    [x - w/2, y - l/2, x + w/2, y + l/2, yaw] computed in float32."""
    b = np.asarray(native, np.float32).reshape(-1, 7)
    if cfg.box_coder == "openpcdet":
        return b
    half = b[:, 3:5] / np.float32(2)
    return np.concatenate([b[:, 0:2] - half, b[:, 0:2] + half, b[:, 6:7]], axis=1)


# --------------------------------------------------------------------------- rotated BEV IoU

@dataclass(frozen=True, eq=False)
class _Rects:
    """Rectangles as the IoU kernels see them, float64: centre, half extents, rotation, corners.

    Corner k of rectangle n is (xs[k, n], ys[k, n]): (x1, y1), (x2, y1), (x2, y2), (x1, y2) rotated about
    the centre. Rectangles run along the last axis so that the work over many pairs is long vectors.
    """

    cx: np.ndarray
    cy: np.ndarray
    hx: np.ndarray
    hy: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    area: np.ndarray
    xs: np.ndarray  # (4, N)
    ys: np.ndarray  # (4, N)
    radius: np.ndarray
    margin: float

    def take(self, idx: np.ndarray) -> _Rects:
        return _Rects(
            self.cx[idx], self.cy[idx], self.hx[idx], self.hy[idx], self.cos[idx], self.sin[idx],
            self.area[idx], self.xs.take(idx, axis=1), self.ys.take(idx, axis=1), self.radius[idx], self.margin,
        )


def _rects(boxes: np.ndarray, style: str) -> _Rects:
    if style not in _STYLE_GEOMETRY:
        raise InputError(f"IoU style: received {style!r}, expected one of {IOU_STYLES}")
    margin, sense = _STYLE_GEOMETRY[style]
    b = np.asarray(boxes, np.float32).astype(np.float64)
    width = 7 if style == "openpcdet" else 5
    if b.ndim != 2 or b.shape[1] != width:
        raise InputError(f"{style} IoU boxes: received shape {b.shape}, expected (N, {width})")
    if style == "openpcdet":  # (x, y, z, dx, dy, dz, heading)
        cx, cy, hx, hy, angle = b[:, 0], b[:, 1], b[:, 3] / 2, b[:, 4] / 2, b[:, 6]
        area = b[:, 3] * b[:, 4]
    else:  # (x1, y1, x2, y2, yaw)
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        hx, hy, angle = (b[:, 2] - b[:, 0]) / 2, (b[:, 3] - b[:, 1]) / 2, b[:, 4]
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    cos, sin = np.cos(sense * angle), np.sin(sense * angle)
    lx = np.stack([-hx, hx, hx, -hx])
    ly = np.stack([-hy, -hy, hy, hy])
    xs, ys = cx + lx * cos - ly * sin, cy + lx * sin + ly * cos
    return _Rects(cx, cy, hx, hy, cos, sin, area, xs, ys, np.hypot(hx, hy), margin)


def _inside(px: np.ndarray, py: np.ndarray, r: _Rects) -> np.ndarray:
    """Kernel check_in_box2d: rotate into the box frame, strict test against half extent + margin.
    Points (4, M), r of length M -> (4, M) bool."""
    dx, dy = px - r.cx, py - r.cy
    lx = dx * r.cos + dy * r.sin
    ly = -dx * r.sin + dy * r.cos
    return (np.abs(lx) < r.hx + r.margin) & (np.abs(ly) < r.hy + r.margin)


_NEXT = np.array([1, 2, 3, 0])  # edge k of a rectangle runs from its corner k to corner _NEXT[k]


def _sides(px: np.ndarray, py: np.ndarray, r: _Rects) -> np.ndarray:
    """The kernel's cross(point k, corner i+1, corner i) for 4 points (px, py) (4, M) and every edge i
    of r: the side of the edge each point lies on, (4, 4, M) indexed [i, k]."""
    ex, ey = r.xs[_NEXT] - r.xs, r.ys[_NEXT] - r.ys
    return (px[None] - r.xs[:, None]) * ey[:, None] - ex[:, None] * (py[None] - r.ys[:, None])


def _edge_crossings(a: _Rects, b: _Rects) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Kernel ``intersection`` of edge i of a[n] with edge j of b[n] where they cross: n, the slot
    4 i + j, and the point's x and y, each (K,). Most pairs an NMS compares cross at no edge."""
    # The kernel's products for edge i = (p0, p1) of a and edge j = (q0, q1) of b: s1 = of_b[i, j],
    # s5 = of_b[i, j+1] and s2 = -s5; s3 = of_a[j, i] and s4 = -of_a[j, i+1] (the same products
    # subtracted the other way round; negating is exact). So s1 * s2 > 0 is of_b[i, j] * of_b[i, j+1] < 0.
    of_b, of_a = _sides(b.xs, b.ys, a), _sides(a.xs, a.ys, b)
    of_b_next = of_b[:, _NEXT]
    box_overlap = np.ones(of_b.shape, bool)  # the edges' axis-aligned boxes overlap
    for p, q in ((a.xs, b.xs), (a.ys, b.ys)):
        p_lo, p_hi = np.minimum(p, p[_NEXT])[:, None], np.maximum(p, p[_NEXT])[:, None]
        q_lo, q_hi = np.minimum(q, q[_NEXT])[None], np.maximum(q, q[_NEXT])[None]
        box_overlap &= (p_lo <= q_hi) & (q_lo <= p_hi)
    valid = box_overlap & (of_b * of_b_next < 0) & (of_a * of_a[:, _NEXT] < 0).transpose(1, 0, 2)
    m = valid.shape[2]
    at = np.flatnonzero(valid)  # (4 i + j) m + n
    i, j, n = at // (4 * m), at // m % 4, at % m
    p0, p1, q0, q1 = i * m + n, _NEXT[i] * m + n, j * m + n, _NEXT[j] * m + n  # into the flattened (4, M)
    ax, ay, bx, by = a.xs.reshape(-1), a.ys.reshape(-1), b.xs.reshape(-1), b.ys.reshape(-1)
    p0x, p0y, p1x, p1y = ax[p0], ay[p0], ax[p1], ay[p1]
    q0x, q0y, q1x, q1y = bx[q0], by[q0], bx[q1], by[q1]
    s1, s5 = of_b.reshape(-1)[at], of_b_next.reshape(-1)[at]
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = s5 - s1
        by_area = (s5 * q0x - s1 * q1x) / denom, (s5 * q0y - s1 * q1y) / denom
        a0, b0 = p0y - p1y, p1x - p0x
        c0 = p0x * p1y - p1x * p0y
        a1, b1 = q0y - q1y, q1x - q0x
        c1 = q0x * q1y - q1x * q0y
        det = a0 * b1 - a1 * b0
        by_lines = (b0 * c1 - b1 * c0) / det, (a1 * c0 - a0 * c1) / det
    use_area = np.abs(denom) > _EPS
    return n, 4 * i + j, np.where(use_area, by_area[0], by_lines[0]), np.where(use_area, by_area[1], by_lines[1])


def _corners_inside(a: _Rects, b: _Rects) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The corners of b[n] then of a[n], x and y (8, M), and whether each lies inside the other
    rectangle (kernel check_in_box2d), (8, M)."""
    inside = np.concatenate([_inside(b.xs, b.ys, a), _inside(a.xs, a.ys, b)])
    return np.concatenate([b.xs, a.xs]), np.concatenate([b.ys, a.ys]), inside


_CORNER_SLOTS = 16 + np.array([0, 2, 4, 6, 1, 3, 5, 7])  # the kernel's: b corner k, then a corner k, k = 0..3


@dataclass(frozen=True, eq=False)
class _Overlap:
    """What kernel box_overlap finds for pairs (a[n], b[n]) before it sorts: the edge crossings (pair
    n, slot 4 i + j, x, y, each (K,)) and both rectangles' corners with whether each lies inside the
    other (x, y, inside, each (8, M)). Worked out once for a pair, read by the area bound and, where
    the bound leaves the answer open, by the polygon."""

    n: np.ndarray
    slot: np.ndarray
    x: np.ndarray
    y: np.ndarray
    xs: np.ndarray
    ys: np.ndarray
    inside: np.ndarray

    @property
    def pairs(self) -> int:
        return int(self.inside.shape[1])

    def take(self, rows: np.ndarray) -> _Overlap:
        """The pairs ``rows`` (ascending), renumbered 0, 1, ..."""
        position = np.full(self.pairs, -1)
        position[rows] = np.arange(rows.shape[0])
        kept = position[self.n] >= 0
        return _Overlap(position[self.n][kept], self.slot[kept], self.x[kept], self.y[kept],
                        self.xs[:, rows], self.ys[:, rows], self.inside[:, rows])


def _overlap(a: _Rects, b: _Rects) -> _Overlap:
    return _Overlap(*_edge_crossings(a, b), *_corners_inside(a, b))


def _overlap_points(o: _Overlap) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's candidate vertices of the overlap polygon of each pair, and which of them it keeps:
    (M, 24, 2), zero where not kept, and (M, 24). Its order: the 16 edge crossings, then b corner k
    inside a and a corner k inside b, k = 0..3."""
    m = o.pairs
    ok = np.zeros((m, 24), bool)
    pts = np.zeros((m, 24, 2))
    ok[o.n, o.slot] = True
    pts[o.n, o.slot, 0], pts[o.n, o.slot, 1] = o.x, o.y
    ok[:, _CORNER_SLOTS] = o.inside.T
    pts[:, _CORNER_SLOTS, 0] = np.where(o.inside, o.xs, 0.0).T
    pts[:, _CORNER_SLOTS, 1] = np.where(o.inside, o.ys, 0.0).T
    return pts, ok


def _polygon_area(pts: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Kernel box_overlap's area: the kept vertices sorted by angle about their centroid, fan area (M,)."""
    count = ok.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):  # no point at all: the kernel's 0/0 centre
        centre = pts.sum(axis=1) / count[:, None]
    angle = np.arctan2(pts[..., 1] - centre[:, None, 1], pts[..., 0] - centre[:, None, 0])
    angle = np.where(ok, angle, np.inf)  # unused slots sort last
    order = np.argsort(angle, axis=1, kind="stable")  # the kernel's bubble sort is stable
    pts = np.take_along_axis(pts, order[..., None], axis=1)
    ok = np.take_along_axis(ok, order, axis=1)
    rel = pts - pts[:, :1, :]
    fan = rel[:, :-1, 0] * rel[:, 1:, 1] - rel[:, :-1, 1] * rel[:, 1:, 0]
    area = np.where(ok[:, 1:], fan, 0.0).sum(axis=1)
    return np.abs(area) / 2


def _area_bound(o: _Overlap) -> np.ndarray:
    """An upper bound of the kernel's overlap area of each pair that skips the polygon's sort, (M,).

    The fan's count - 1 cross products are each twice the area of a triangle with its corners in the
    kept vertices' bounding box, so at most width * height; the factor covers their rounding. A kept
    vertex that is not finite makes the bound infinite or NaN, which settles nothing; with fewer than
    two vertices the area is 0, or NaN, which never suppresses.
    """
    n, inside = o.n, o.inside
    count = np.bincount(n, minlength=o.pairs) + inside.sum(axis=0)
    extent = []
    for crossings, corners in ((o.x, o.xs), (o.y, o.ys)):
        hi = np.where(inside, corners, -np.inf).max(axis=0)
        lo = np.where(inside, corners, np.inf).min(axis=0)
        np.maximum.at(hi, n, crossings)
        np.minimum.at(lo, n, crossings)
        extent.append(hi - lo)
    return np.where(count > 1, (count - 1) * extent[0] * extent[1] * (0.5 + 1e-9), 0.0)


def _iou_of(overlap: np.ndarray, area_a: np.ndarray, area_b: np.ndarray) -> np.ndarray:
    """The kernel's IoU from the overlap area; it grows with the overlap, rounding included."""
    return overlap / np.maximum(area_a + area_b - overlap, _EPS)


def rotated_iou_bev(box: np.ndarray, boxes: np.ndarray, style: str) -> np.ndarray:
    """BEV IoU of one box against each of ``boxes``, as the family's NMS kernel computes it (float64).

    ``style`` "openpcdet": boxes (x, y, z, dx, dy, dz, heading), corners rotated counter-clockwise,
    1 cm corner margin. "zhulf0804": boxes [x1, y1, x2, y2, yaw] (see ``nms_boxes``), corners rotated
    by -yaw, 1e-5 m margin. The margin counts a corner lying just outside the other box as inside,
    so near-touching boxes get a slightly larger IoU than the exact polygon gives.
    """
    one = np.asarray(box).reshape(1, -1)
    rb = _rects(np.asarray(boxes).reshape(-1, one.shape[1]), style)
    ra = _rects(one, style).take(np.zeros(rb.cx.shape[0], np.int64))
    return _iou_of(_polygon_area(*_overlap_points(_overlap(ra, rb))), ra.area, rb.area)


_NMS_BLOCK = 64  # at most this many boxes, in score order, get their candidate pairs at once
_NMS_PAIRS = 4096  # pairs per vectorised IoU step: bounds the memory of a saturated frame


def nms_rotated(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, style: str,
                max_keep: int | None = None) -> np.ndarray:
    """Greedy rotated NMS as the families run it; returns kept indices into ``boxes`` (int64), at most
    ``max_keep`` of them (None: all): the first kept boxes do not depend on the later ones, so the pass
    stops there (a saturated frame keeps its first max_boxes long before its thousands of candidates end).

    Boxes are visited by descending score (ties: lower index first); a box is suppressed by an
    earlier kept box when their IoU is strictly greater than the threshold (compared in float32).

    A saturated frame (thousands of candidates, many of them huge or needle-thin boxes that reach
    all others) took seconds box by box, so the work is batched: a block of boxes gets its candidate
    pairs at once, and a pair skips the polygon's sort when a bound shows its IoU cannot pass. A block
    box suppressed by an earlier one of the block had its pairs worked out in vain, so a block is at
    most twice as long as the number of boxes the previous block kept. The kept boxes are exactly
    those of the box-by-box loop.
    """
    s = np.asarray(scores, np.float32).reshape(-1)
    rects = _rects(np.asarray(boxes), style)
    if rects.cx.shape[0] != s.shape[0]:
        raise InputError(f"nms: {rects.cx.shape[0]} boxes but {s.shape[0]} scores")
    order = np.argsort(-s, kind="stable")
    r = rects.take(order)
    threshold = float(np.float32(iou_threshold))
    # Boxes whose centres are farther apart than their circumradii (plus both margins) have no
    # crossing edges and no corner inside: the kernel returns 0 for them, so they are skipped.
    reach = r.radius + 2 * r.margin
    n = order.shape[0]
    removed = np.zeros(n, bool)
    keep: list[int] = []
    rows = np.arange(min(n, 1))  # the first block: the best box alone
    limit = n if max_keep is None else max_keep
    while rows.size and len(keep) < limit:
        later = rows[0] + 1 + np.flatnonzero(~removed[rows[0] + 1:])
        with np.errstate(invalid="ignore", over="ignore"):  # non-finite boxes: the kernel's NaNs, unannounced
            gap = np.hypot(r.cx[later][None, :] - r.cx[rows][:, None], r.cy[later][None, :] - r.cy[rows][:, None])
            near = (later[None, :] > rows[:, None]) & (gap <= reach[rows][:, None] + reach[later][None, :])
            row, col = np.nonzero(near)
            first, second = rows[row], later[col]
            hit = _suppresses(r, first, second, threshold)
        hit_first, hit_second = first[hit], second[hit]
        before = len(keep)
        for i in rows.tolist():  # the greedy pass over the block, every suppression it can need known
            if not removed[i] and len(keep) < limit:
                keep.append(i)
                removed[hit_second[hit_first == i]] = True
        block = min(2 * (len(keep) - before), _NMS_BLOCK)
        rows = rows[-1] + 1 + np.flatnonzero(~removed[rows[-1] + 1:])[:block]
    return order[np.asarray(keep, np.int64)]


def _suppresses(r: _Rects, first: np.ndarray, second: np.ndarray, threshold: float) -> np.ndarray:
    """IoU(r[first[k]], r[second[k]]) > threshold for each pair k, bit for bit as ``rotated_iou_bev``
    computes it; the polygon area only where ``_area_bound`` leaves the answer open."""
    out = np.zeros(first.shape[0], bool)
    for lo in range(0, first.shape[0], _NMS_PAIRS):
        a, b = r.take(first[lo:lo + _NMS_PAIRS]), r.take(second[lo:lo + _NMS_PAIRS])
        found = _overlap(a, b)
        open_ = np.flatnonzero(~(_iou_of(_area_bound(found), a.area, b.area) <= threshold))
        area = _polygon_area(*_overlap_points(found.take(open_)))
        out[lo + open_] = _iou_of(area, a.area[open_], b.area[open_]) > threshold
    return out


# --------------------------------------------------------------------------- the detection step

def head_maps_to_anchor_major(
    cls: np.ndarray, box: np.ndarray, dir: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NCHW head maps (1, A*C, H, W) -> per-anchor rows (H*W*A, K), (H*W*A, code), (H*W*A, bins).

    Channel C*a + c of anchor a = 2k + r lands in row (y*W + x)*A + a, column c.
    """
    nx, ny = cfg.head_map
    a = cfg.anchors.per_cell
    out = []
    for name, arr, width in (("cls", cls, cfg.num_classes), ("box", box, cfg.box_code_size),
                              ("dir", dir, cfg.require_direction("a single-head map").num_bins)):
        arr = np.asarray(arr)
        expected = (1, a * width, ny, nx)
        if arr.shape != expected:
            raise InputError(f"head map {name}: received shape {arr.shape}, expected {expected} (NCHW)")
        out.append(np.ascontiguousarray(arr[0].transpose(1, 2, 0), dtype=np.float32).reshape(-1, width))
    return out[0], out[1], out[2]


def split_heads(heads: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One frame's merged NHWC head map (hy, hx, cls|box|dir) -> the three (1, C, hy, hx) maps."""
    sizes = [cfg.head_channels[part] for part in ("cls", "box", "dir")]
    if heads.ndim != 3 or heads.shape[2] != sum(sizes):
        raise InputError(f"head map: expected (hy, hx, {sum(sizes)}), received shape {heads.shape}")
    cls, box, dir = np.split(heads, np.cumsum(sizes)[:2], axis=2)
    return tuple(np.ascontiguousarray(m.transpose(2, 0, 1)[None]) for m in (cls, box, dir))  # type: ignore[return-value]


def postprocess(cls: np.ndarray, box: np.ndarray, dir: np.ndarray, cfg: ModelConfig) -> RawDetections:
    """Head maps -> detections, as the family's own post-processing produces them.

    ``cfg.postprocess.nms`` picks the family's procedure: "class_agnostic" is OpenPCDet's
    (direction at decode, one NMS over all classes), "per_class" is zhulf0804's (top-k anchors
    first, one NMS per class, direction after NMS, then test.py's output range filter).
    """
    logits, codes, dir_logits = head_maps_to_anchor_major(cls, box, dir, cfg)
    probs = _sigmoid(logits)
    if cfg.postprocess.nms == "class_agnostic":
        native, scores, labels = _class_agnostic(probs, codes, dir_logits, cfg)
    else:
        native, scores, labels = _per_class(probs, codes, dir_logits, cfg)
    limits = cfg.postprocess.output_range
    if limits is not None and native.shape[0]:  # test.py: strict, on the native (x, y, z)
        lim = np.asarray(limits, np.float32)
        inside = np.all((native[:, :3] > lim[:3]) & (native[:, :3] < lim[3:]), axis=1)
        native, scores, labels = native[inside], scores[inside], labels[inside]
    return RawDetections(to_openpcdet_boxes(native, cfg), scores, labels.astype(np.int32), native,
                         overflowed_scores=overflowed_logits(logits))


def overflowed_logits(logits: np.ndarray) -> int:
    """How many class logits are NaN, infinite or beyond ``OVERFLOWED_LOGIT``: the network overflowed there."""
    with np.errstate(invalid="ignore"):
        return int(logits.size - np.count_nonzero(np.abs(logits) <= np.float32(OVERFLOWED_LOGIT)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    one = np.float32(1)
    with np.errstate(over="ignore"):
        return one / (one + np.exp(-x))


def _max_and_argmax(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row max and first argmax over a few columns; column-wise, as NumPy reduces a short axis slowly."""
    best = probs[:, 0].copy()
    for c in range(1, probs.shape[1]):
        np.maximum(best, probs[:, c], out=best)
    label = np.full(probs.shape[0], probs.shape[1] - 1, np.int64)
    for c in range(probs.shape[1] - 2, -1, -1):
        label[probs[:, c] == best] = c
    return best, label


def _passes(scores: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    thr = np.float32(cfg.postprocess.score_threshold)
    return scores >= thr if cfg.postprocess.score_inclusive else scores > thr


def _top_passing(scores: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Indices of the ``pre_nms_top_k`` largest of the scores that pass the threshold (a NaN passes none),
    descending, ties by lower index."""
    passing = np.flatnonzero(_passes(scores, cfg))
    return passing[_top_k(scores[passing], cfg.postprocess.pre_nms_top_k)]


def _top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, descending, ties by lower index (a stable full sort's head)."""
    n = values.shape[0]
    if k >= n:
        return np.argsort(-values, kind="stable")
    kth = values[np.argpartition(-values, k - 1)[:k]].min()
    above = np.flatnonzero(values > kth)
    tied = np.flatnonzero(values == kth)[: k - above.size]
    pick = np.concatenate([above, tied])
    return pick[np.argsort(-values[pick], kind="stable")]


def _decode_rows(rows: np.ndarray, codes: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return decode_boxes(codes[rows], anchors(cfg)[rows], cfg)


def _class_agnostic(
    probs: np.ndarray, codes: np.ndarray, dir_logits: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenPCDet: max/argmax over classes, threshold, top-k, decode + direction, one NMS, keep <= max."""
    pp = cfg.postprocess
    score, label = _max_and_argmax(probs)
    rows = _top_passing(score, cfg)
    boxes = _decode_rows(rows, codes, cfg)  # decoding is per element, so decoding only these is exact
    boxes[:, 6] = apply_direction(boxes[:, 6], dir_logits[rows].argmax(axis=1), cfg)
    keep = nms_rotated(nms_boxes(boxes, cfg), score[rows], pp.nms_iou, cfg.box_coder, max_keep=pp.max_boxes)
    return boxes[keep], score[rows][keep], label[rows][keep]


def _per_class(
    probs: np.ndarray, codes: np.ndarray, dir_logits: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """zhulf0804: top-k anchors by max class score, then per class: threshold, NMS, direction. The top-k are taken
    among the anchors whose max passes the threshold: the others give no box of any class (the same boxes), and an
    anchor with an overflowed class (a NaN max) takes no place, as on the GPU."""
    pp = cfg.postprocess
    rows = _top_passing(_max_and_argmax(probs)[0], cfg)
    top_probs, top_dirs = probs[rows], dir_logits[rows].argmax(axis=1)
    boxes = _decode_rows(rows, codes, cfg)
    bev = nms_boxes(boxes, cfg)
    parts_boxes, parts_scores, parts_labels = [], [], []
    for c in range(cfg.num_classes):
        members = np.flatnonzero(_passes(top_probs[:, c], cfg))
        if members.size == 0:
            continue
        kept = members[nms_rotated(bev[members], top_probs[members, c], pp.nms_iou, cfg.box_coder,
                                   max_keep=pp.max_boxes)]  # the output's top max_boxes take no more of a class
        kept_boxes = boxes[kept]
        kept_boxes[:, 6] = apply_direction(kept_boxes[:, 6], top_dirs[kept], cfg)
        parts_boxes.append(kept_boxes)
        parts_scores.append(top_probs[kept, c])
        parts_labels.append(np.full(kept.size, c, np.int32))
    if not parts_boxes:
        return np.zeros((0, 7), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)
    native = np.concatenate(parts_boxes)
    scores = np.concatenate(parts_scores)
    labels = np.concatenate(parts_labels)
    if scores.shape[0] > pp.max_boxes:  # only then does the family reorder by score
        pick = _top_k(scores, pp.max_boxes)
        native, scores, labels = native[pick], scores[pick], labels[pick]
    return native, scores, labels
