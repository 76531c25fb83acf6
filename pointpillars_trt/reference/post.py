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

from ..anchors import NMS_CORNER_MARGIN, anchors
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
    ``velocity`` (N, 2) float32 (vx, vy) in m/s for models that predict it, else None.
    """

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    native_boxes: np.ndarray
    velocity: np.ndarray | None = None

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


def from_openpcdet_boxes(boxes: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Inverse of ``to_openpcdet_boxes``: OpenPCDet boxes -> the family's convention, float32."""
    b = np.asarray(boxes, np.float32).reshape(-1, 7)
    if cfg.box_coder == "openpcdet":
        return b.copy()
    d = b.astype(np.float64)
    out = np.stack(
        [d[:, 0], d[:, 1], d[:, 2] - d[:, 5] / 2, d[:, 4], d[:, 3], d[:, 5], -d[:, 6] - np.pi / 2], axis=1
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
    """Rectangles as the IoU kernels see them, float64: centre, half extents, rotation, corners."""

    cx: np.ndarray
    cy: np.ndarray
    hx: np.ndarray
    hy: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    area: np.ndarray
    corners: np.ndarray  # (N, 4, 2): (x1, y1), (x2, y1), (x2, y2), (x1, y2) rotated about the centre
    radius: np.ndarray
    margin: float

    def take(self, idx: np.ndarray | int) -> _Rects:
        pick = np.atleast_1d(np.asarray(idx))
        return _Rects(
            self.cx[pick], self.cy[pick], self.hx[pick], self.hy[pick], self.cos[pick], self.sin[pick],
            self.area[pick], self.corners[pick], self.radius[pick], self.margin,
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
    lx = np.stack([-hx, hx, hx, -hx], axis=1)
    ly = np.stack([-hy, -hy, hy, hy], axis=1)
    corners = np.stack(
        [cx[:, None] + lx * cos[:, None] - ly * sin[:, None], cy[:, None] + lx * sin[:, None] + ly * cos[:, None]],
        axis=2,
    )
    return _Rects(cx, cy, hx, hy, cos, sin, area, corners, np.hypot(hx, hy), margin)


def _inside(points: np.ndarray, r: _Rects) -> np.ndarray:
    """Kernel check_in_box2d: rotate into the box frame, strict test against half extent + margin.
    points (M, 4, 2), r of length M (or 1) -> (M, 4) bool."""
    dx = points[..., 0] - r.cx[:, None]
    dy = points[..., 1] - r.cy[:, None]
    lx = dx * r.cos[:, None] + dy * r.sin[:, None]
    ly = -dx * r.sin[:, None] + dy * r.cos[:, None]
    return (np.abs(lx) < r.hx[:, None] + r.margin) & (np.abs(ly) < r.hy[:, None] + r.margin)


def _cross(p1: np.ndarray, p2: np.ndarray, p0: np.ndarray) -> np.ndarray:
    return (p1[..., 0] - p0[..., 0]) * (p2[..., 1] - p0[..., 1]) - (p2[..., 0] - p0[..., 0]) * (p1[..., 1] - p0[..., 1])


def _edge_crossings(a: _Rects, b: _Rects) -> tuple[np.ndarray, np.ndarray]:
    """Kernel ``intersection`` for every (edge i of a, edge j of b), flattened i-major: (M, 16, 2), (M, 16)."""
    ca, cb = a.corners, b.corners
    p0, p1 = ca[:, :, None, :], np.roll(ca, -1, axis=1)[:, :, None, :]
    q0, q1 = cb[:, None, :, :], np.roll(cb, -1, axis=1)[:, None, :, :]
    box_overlap = (
        (np.minimum(p0[..., 0], p1[..., 0]) <= np.maximum(q0[..., 0], q1[..., 0]))
        & (np.minimum(q0[..., 0], q1[..., 0]) <= np.maximum(p0[..., 0], p1[..., 0]))
        & (np.minimum(p0[..., 1], p1[..., 1]) <= np.maximum(q0[..., 1], q1[..., 1]))
        & (np.minimum(q0[..., 1], q1[..., 1]) <= np.maximum(p0[..., 1], p1[..., 1]))
    )
    s1, s2 = _cross(q0, p1, p0), _cross(p1, q1, p0)
    s3, s4 = _cross(p0, q1, q0), _cross(q1, p1, q0)
    valid = box_overlap & (s1 * s2 > 0) & (s3 * s4 > 0)
    s5 = _cross(q1, p1, p0)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = (s5 - s1)[..., None]
        by_area = (s5[..., None] * q0 - s1[..., None] * q1) / denom
        a0, b0 = p0[..., 1] - p1[..., 1], p1[..., 0] - p0[..., 0]
        c0 = p0[..., 0] * p1[..., 1] - p1[..., 0] * p0[..., 1]
        a1, b1 = q0[..., 1] - q1[..., 1], q1[..., 0] - q0[..., 0]
        c1 = q0[..., 0] * q1[..., 1] - q1[..., 0] * q0[..., 1]
        det = a0 * b1 - a1 * b0
        by_lines = np.stack([(b0 * c1 - b1 * c0) / det, (a1 * c0 - a0 * c1) / det], axis=-1)
    points = np.where((np.abs(s5 - s1) > _EPS)[..., None], by_area, by_lines)
    m = points.shape[0]
    return points.reshape(m, 16, 2), valid.reshape(m, 16)


def _overlap_area(a: _Rects, b: _Rects) -> np.ndarray:
    """Kernel box_overlap, vectorised over pairs (a[i], b[i]) (a may have length 1)."""
    m = b.cx.shape[0]
    if a.cx.shape[0] != m:
        a = a.take(np.zeros(m, np.int64))
    cross_pts, cross_ok = _edge_crossings(a, b)
    # Corners in the kernel's order: b corner k inside a, then a corner k inside b, k = 0..3.
    corner_pts = np.stack([b.corners, a.corners], axis=2).reshape(m, 8, 2)
    corner_ok = np.stack([_inside(b.corners, a), _inside(a.corners, b)], axis=2).reshape(m, 8)
    ok = np.concatenate([cross_ok, corner_ok], axis=1)
    pts = np.where(ok[..., None], np.concatenate([cross_pts, corner_pts], axis=1), 0.0)
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


def _iou(a: _Rects, b: _Rects) -> np.ndarray:
    overlap = _overlap_area(a, b)
    return overlap / np.maximum(a.area + b.area - overlap, _EPS)


def rotated_iou_bev(box: np.ndarray, boxes: np.ndarray, style: str) -> np.ndarray:
    """BEV IoU of one box against each of ``boxes``, as the family's NMS kernel computes it (float64).

    ``style`` "openpcdet": boxes (x, y, z, dx, dy, dz, heading), corners rotated counter-clockwise,
    1 cm corner margin. "zhulf0804": boxes [x1, y1, x2, y2, yaw] (see ``nms_boxes``), corners rotated
    by -yaw, 1e-5 m margin. The margin counts a corner lying just outside the other box as inside,
    so near-touching boxes get a slightly larger IoU than the exact polygon gives.
    """
    one = np.asarray(box).reshape(1, -1)
    ra = _rects(one, style)
    rb = _rects(np.asarray(boxes).reshape(-1, one.shape[1]), style)
    if rb.cx.shape[0] == 0:
        return np.zeros(0, np.float64)
    return _iou(ra, rb)


def nms_rotated(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, style: str) -> np.ndarray:
    """Greedy rotated NMS as the families run it; returns kept indices into ``boxes`` (int64).

    Boxes are visited by descending score (ties: lower index first); a box is suppressed by an
    earlier kept box when their IoU is strictly greater than the threshold (compared in float32).
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
    removed = np.zeros(order.shape[0], bool)
    keep: list[int] = []
    for i in range(order.shape[0]):
        if removed[i]:
            continue
        keep.append(i)
        rest = i + 1 + np.flatnonzero(~removed[i + 1:])
        near = rest[np.hypot(r.cx[rest] - r.cx[i], r.cy[rest] - r.cy[i]) <= reach[i] + reach[rest]]
        if near.size:
            removed[near[_iou(r.take(i), r.take(near)) > threshold]] = True
    return order[np.asarray(keep, np.int64)]


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
    return RawDetections(to_openpcdet_boxes(native, cfg), scores, labels.astype(np.int32), native)


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
    candidates = np.flatnonzero(_passes(score, cfg))
    rows = candidates[_top_k(score[candidates], pp.pre_nms_top_k)]
    boxes = _decode_rows(rows, codes, cfg)  # decoding is per element, so decoding only these is exact
    boxes[:, 6] = apply_direction(boxes[:, 6], dir_logits[rows].argmax(axis=1), cfg)
    keep = nms_rotated(nms_boxes(boxes, cfg), score[rows], pp.nms_iou, cfg.box_coder)[: pp.max_boxes]
    return boxes[keep], score[rows][keep], label[rows][keep]


def _per_class(
    probs: np.ndarray, codes: np.ndarray, dir_logits: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """zhulf0804: top-k anchors by max class score, then per class: threshold, NMS, direction."""
    pp = cfg.postprocess
    rows = _top_k(_max_and_argmax(probs)[0], pp.pre_nms_top_k)
    top_probs, top_dirs = probs[rows], dir_logits[rows].argmax(axis=1)
    boxes = _decode_rows(rows, codes, cfg)
    bev = nms_boxes(boxes, cfg)
    parts_boxes, parts_scores, parts_labels = [], [], []
    for c in range(cfg.num_classes):
        members = np.flatnonzero(_passes(top_probs[:, c], cfg))
        if members.size == 0:
            continue
        kept = members[nms_rotated(bev[members], top_probs[members, c], pp.nms_iou, cfg.box_coder)]
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
