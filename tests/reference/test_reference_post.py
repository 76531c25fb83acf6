"""The NumPy post-processing against independent computations written from the assets README.

Rotated IoU is checked against Sutherland-Hodgman polygon clipping with shoelace areas in float64;
the kernels' corner margin against a convex hull that adds the corners the margin lets in. NMS is
checked against the textbook greedy loop, anchors and decoding against per-anchor / per-box float64
formulas, and the whole post-processing of both families against a slow implementation of the
README's step lists that shares no code with the library. On saturated frames (thousands of
candidates, absurd sizes) the IoU must equal, bit for bit, the kernels transcribed as the reference
first computed them, and the NMS the box-by-box loop over that transcription.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.config import ModelConfig
from pointpillars_trt.errors import InputError
from pointpillars_trt.reference import (
    anchors,
    decode_boxes,
    head_maps_to_anchor_major,
    nms_rotated,
    postprocess,
    rotated_iou_bev,
    to_openpcdet_boxes,
)
from pointpillars_trt.reference import post
from pointpillars_trt.reference.post import apply_direction, nms_boxes

Point = tuple[float, float]
MARGIN = {"openpcdet": 1e-2, "zhulf0804": 1e-5}  # README (OpenPCDet) / mmdet3d-style kernel (zhulf0804)


# --------------------------------------------------------------------------- independent geometry

def rect_corners(cx: float, cy: float, hx: float, hy: float, theta: float) -> list[Point]:
    """Counter-clockwise corners of a rectangle turned counter-clockwise by theta."""
    c, s = math.cos(theta), math.sin(theta)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in ((-hx, -hy), (hx, -hy), (hx, hy), (-hx, hy))]


def rect_of(box: np.ndarray, style: str) -> tuple[float, float, float, float, float]:
    """(cx, cy, hx, hy, ccw angle) of a kernel input box, from the README conventions."""
    b = [float(v) for v in np.asarray(box, np.float32)]
    if style == "openpcdet":  # (x, y, z, dx, dy, dz, heading): turned counter-clockwise by heading
        return b[0], b[1], b[3] / 2, b[4] / 2, b[6]
    # [x1, y1, x2, y2, yaw]: corners turned by -yaw
    return (b[0] + b[2]) / 2, (b[1] + b[3]) / 2, (b[2] - b[0]) / 2, (b[3] - b[1]) / 2, -b[4]


def shoelace(poly: list[Point]) -> float:
    return 0.5 * abs(sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(poly, poly[1:] + poly[:1])))


def clip(subject: list[Point], clipper: list[Point]) -> list[Point]:
    """Sutherland-Hodgman: the part of `subject` inside the convex counter-clockwise `clipper`."""
    out = subject
    for i in range(len(clipper)):
        a, b = clipper[i], clipper[(i + 1) % len(clipper)]

        def side(p: Point) -> float:
            return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])

        src, out = out, []
        for j in range(len(src)):
            p, q = src[j], src[(j + 1) % len(src)]
            sp, sq = side(p), side(q)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        if not out:
            break
    return out


def hull_area(points: list[Point]) -> float:
    """Area of the convex hull (Andrew's monotone chain)."""
    pts = sorted(set(points))
    if len(pts) < 3:
        return 0.0

    def turn(o: Point, a: Point, b: Point) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[Point] = []
    upper: list[Point] = []
    for p in pts:
        while len(lower) >= 2 and turn(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and turn(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return shoelace(lower[:-1] + upper[:-1])


def local(p: Point, r: tuple[float, float, float, float, float]) -> Point:
    c, s = math.cos(r[4]), math.sin(r[4])
    dx, dy = p[0] - r[0], p[1] - r[1]
    return dx * c + dy * s, -dx * s + dy * c


def in_band(a: tuple, b: tuple, margin: float) -> bool:
    """Does a corner of one rectangle lie where the margin matters (not inside, but within margin)?"""
    for r, other in ((a, b), (b, a)):
        for p in rect_corners(*other):
            lx, ly = local(p, r)
            expanded = abs(lx) < r[2] + margin and abs(ly) < r[3] + margin
            strictly = abs(lx) < r[2] - 1e-9 and abs(ly) < r[3] - 1e-9
            if expanded and not strictly:
                return True
    return False


def exact_iou(a: tuple, b: tuple) -> float:
    inter = clip(rect_corners(*a), rect_corners(*b))
    area = shoelace(inter) if len(inter) >= 3 else 0.0
    return area / max(4 * a[2] * a[3] + 4 * b[2] * b[3] - area, 1e-8)


def margin_iou(a: tuple, b: tuple, margin: float) -> float:
    """The kernels' IoU as the README defines it: the exact overlap polygon plus every corner the
    margin counts as inside the other box (hull of them)."""
    pts = clip(rect_corners(*a), rect_corners(*b))
    for r, other in ((a, b), (b, a)):
        for p in rect_corners(*other):
            lx, ly = local(p, r)
            if abs(lx) < r[2] + margin and abs(ly) < r[3] + margin:
                pts.append(p)
    area = hull_area(pts)
    return area / max(4 * a[2] * a[3] + 4 * b[2] * b[3] - area, 1e-8)


def make_box(style: str, cx: float, cy: float, length_x: float, length_y: float, angle: float) -> np.ndarray:
    """A kernel input box whose rectangle is (cx, cy, length_x by length_y) turned ccw by `angle`."""
    if style == "openpcdet":
        return np.array([cx, cy, 0.0, length_x, length_y, 1.0, angle], np.float32)
    return np.array([cx - length_x / 2, cy - length_y / 2, cx + length_x / 2, cy + length_y / 2, -angle], np.float32)


def random_box(rng: np.random.Generator, style: str, cx: float, cy: float, smallest: float, largest: float,
               turn: float) -> np.ndarray:
    return make_box(style, cx, cy, rng.uniform(smallest, largest), rng.uniform(smallest, largest),
                    rng.uniform(-turn, turn))


STYLES = ("openpcdet", "zhulf0804")


# --------------------------------------------------------------------------- rotated IoU

def random_pairs(rng: np.random.Generator, style: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    pairs = []
    for _ in range(300):  # general position, overlapping or not
        cx, cy = rng.uniform(-60, 60, 2)
        a = random_box(rng, style, cx, cy, 0.4, 5, 7)
        b = random_box(rng, style, cx + rng.normal(0, 1.5), cy + rng.normal(0, 1.5), 0.4, 5, 7)
        pairs.append(("random", a, b))
    for _ in range(30):
        a = random_box(rng, style, rng.uniform(-30, 30), rng.uniform(-30, 30), 0.5, 4, 4)
        pairs.append(("identical", a, a.copy()))
        r = rect_of(a, style)
        small = min(r[2], r[3]) / 3  # fits anywhere within a disc of radius min half-extent
        off = rng.uniform(-1, 1, 2) * small / 2
        b = make_box(style, r[0] + off[0], r[1] + off[1], small, small * 0.9, rng.uniform(-4, 4))
        pairs.append(("nested", a, b))
        far = random_box(rng, style, r[0] + 20, r[1] - 15, 0.5, 4, 4)
        pairs.append(("disjoint", a, far))
    base = make_box(style, 10.0, -5.0, 4.0, 1.7, 0.3)
    for k in range(72):  # the same box turned about its centre by many angles
        pairs.append(("rotated", base, make_box(style, 10.4, -4.8, 3.0, 1.2, 0.3 + k * math.pi / 36)))
    return pairs


@pytest.mark.parametrize("style", STYLES)
def test_iou_matches_polygon_clipping(style: str) -> None:
    checked: dict[str, int] = {}
    overlapping = 0
    for kind, a, b in random_pairs(np.random.default_rng(7), style):
        ra, rb = rect_of(a, style), rect_of(b, style)
        got = float(rotated_iou_bev(a, b[None], style)[0])
        if kind == "identical":
            assert got == pytest.approx(1.0, abs=1e-9)
        elif kind == "disjoint":
            assert got == 0.0
        elif kind == "nested":
            assert got == pytest.approx((rb[2] * rb[3]) / (ra[2] * ra[3]), rel=1e-9)
        if in_band(ra, rb, MARGIN[style]) and kind != "identical":
            continue  # the margin changes these on purpose: see test_iou_margin_*
        expected = exact_iou(ra, rb)
        assert got == pytest.approx(expected, abs=1e-9), (kind, a, b)
        checked[kind] = checked.get(kind, 0) + 1
        overlapping += kind == "random" and expected > 0
    assert checked.get("random", 0) > 200 and checked.get("rotated", 0) > 50 and overlapping > 50


@pytest.mark.parametrize("style", STYLES)
def test_iou_is_vectorised_over_many_boxes(style: str) -> None:
    rng = np.random.default_rng(3)
    pairs = random_pairs(rng, style)
    a = pairs[0][1]
    many = np.stack([p[2] for p in pairs])
    got = rotated_iou_bev(a, many, style)
    one_by_one = [float(rotated_iou_bev(a, b[None], style)[0]) for b in many]
    assert got.shape == (many.shape[0],)
    np.testing.assert_allclose(got, one_by_one, rtol=0, atol=1e-12)
    assert rotated_iou_bev(a, many[:0], style).shape == (0,)


@pytest.mark.parametrize("style", STYLES)
def test_iou_touching_boxes_is_zero(style: str) -> None:
    a = make_box(style, 0.0, 0.0, 2.0, 1.0, 0.0)
    for b in (make_box(style, 2.0, 0.0, 2.0, 1.0, 0.0),   # shared edge
              make_box(style, 2.0, 1.0, 2.0, 1.0, 0.0),   # shared corner
              make_box(style, 1.0, 1.0, 4.0, 1.0, 0.0)):  # shared edge, longer
        assert float(rotated_iou_bev(a, b[None], style)[0]) == 0.0


@pytest.mark.parametrize("style", STYLES)
def test_iou_margin_counts_corners_just_outside(style: str) -> None:
    """A box poking out of the other by half the margin: the kernel treats its outside corners as
    inside, so the overlap is the whole poking box, not its clipped part."""
    m = MARGIN[style]
    a = make_box(style, 0.0, 0.0, 2.0, 2.0, 0.0)
    b = make_box(style, 0.5 + m / 4, 0.0, 1.0 + m / 2, 1.0, 0.0)  # spans x in [0, 1 + m/2]
    ra, rb = rect_of(a, style), rect_of(b, style)
    got = float(rotated_iou_bev(a, b[None], style)[0])
    assert got == pytest.approx(margin_iou(ra, rb, m), abs=1e-9)
    assert got > exact_iou(ra, rb) + 1e-7
    # and the same geometry turned by an arbitrary angle about the origin
    t = 0.7
    a2 = make_box(style, 0.0, 0.0, 2.0, 2.0, t)
    cx, cy = 0.5 + m / 4, 0.0
    b2 = make_box(style, cx * math.cos(t) - cy * math.sin(t), cx * math.sin(t) + cy * math.cos(t), 1.0 + m / 2, 1.0, t)
    got2 = float(rotated_iou_bev(a2, b2[None], style)[0])
    assert got2 == pytest.approx(margin_iou(rect_of(a2, style), rect_of(b2, style), m), abs=1e-7)
    assert got2 > exact_iou(rect_of(a2, style), rect_of(b2, style)) + 1e-7


def test_iou_styles_turn_the_other_way() -> None:
    """Same five numbers, opposite rotation sense: OpenPCDet ccw by heading, zhulf0804 by -yaw."""
    a = np.array([0, 0, 0, 4, 1, 1, 0.5], np.float32)
    b = np.array([1.5, 0.8, 0, 4, 1, 1, 0.5], np.float32)  # along a's long axis turned ccw
    pcdet = float(rotated_iou_bev(a, b[None], "openpcdet")[0])
    za = np.array([-2, -0.5, 2, 0.5, 0.5], np.float32)
    zb = np.array([-0.5, 0.3, 3.5, 1.3, 0.5], np.float32)
    zhulf = float(rotated_iou_bev(za, zb[None], "zhulf0804")[0])
    assert pcdet == pytest.approx(exact_iou(rect_of(a, "openpcdet"), rect_of(b, "openpcdet")), abs=1e-9)
    assert zhulf == pytest.approx(exact_iou(rect_of(za, "zhulf0804"), rect_of(zb, "zhulf0804")), abs=1e-9)
    assert pcdet > 0.3 and zhulf < 0.3


def test_iou_rejects_bad_input() -> None:
    with pytest.raises(InputError):
        rotated_iou_bev(np.zeros(7, np.float32), np.zeros((2, 7), np.float32), "mmdet")
    with pytest.raises(InputError):
        rotated_iou_bev(np.zeros(5, np.float32), np.zeros((2, 5), np.float32), "openpcdet")


# --------------------------------------------------------------------------- NMS

def greedy_nms(boxes: np.ndarray, scores: np.ndarray, thr: float, iou: Callable[[int, int], float]) -> list[int]:
    """Textbook greedy NMS: by descending score (ties: lower index), keep a box unless a kept one
    overlaps it by more than thr."""
    keep: list[int] = []
    for i in sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i)):
        if all(iou(k, i) <= thr for k in keep):
            keep.append(i)
    return keep


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("seed", [0, 1])
def test_nms_matches_greedy_loop(style: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 160
    boxes = np.stack([random_box(rng, style, rng.uniform(0, 18), rng.uniform(0, 18), 0.5, 4.5, 4) for _ in range(n)])
    scores = np.round(rng.uniform(0.1, 1.0, n), 2).astype(np.float32)  # many ties on purpose
    rects = [rect_of(b, style) for b in boxes]
    ious = {}

    def iou(i: int, j: int) -> float:
        key = (min(i, j), max(i, j))
        if key not in ious:
            ious[key] = margin_iou(rects[key[0]], rects[key[1]], MARGIN[style])
        return ious[key]

    for thr in (0.01, 0.3):
        expected = greedy_nms(boxes, scores, thr, iou)
        assert all(abs(v - thr) > 1e-6 for v in ious.values())
        got = nms_rotated(boxes, scores, thr, style)
        assert got.dtype == np.int64
        assert got.tolist() == expected
        assert 5 < len(expected) < n - 5  # NMS did something, and kept something


def test_nms_empty_and_single() -> None:
    assert nms_rotated(np.zeros((0, 7), np.float32), np.zeros(0, np.float32), 0.01, "openpcdet").shape == (0,)
    one = make_box("zhulf0804", 1, 2, 1, 1, 0.2)[None]
    assert nms_rotated(one, np.array([0.5], np.float32), 0.01, "zhulf0804").tolist() == [0]


def test_nms_identical_boxes_keeps_the_first_of_a_tie() -> None:
    box = make_box("openpcdet", 5, 5, 4, 2, 1.0)
    boxes = np.stack([box, box, box])
    assert nms_rotated(boxes, np.array([0.5, 0.7, 0.7], np.float32), 0.01, "openpcdet").tolist() == [1]


# --------------------------------------------------------------------------- NMS of saturated frames

def saturated_candidates(rng: np.random.Generator, style: str, n: int) -> np.ndarray:
    """NMS input like a frame of 0-255 intensities fed to a 0-1 model makes: every anchor passes, on a
    grid (shared edge lines), a quarter of them plain car anchors, the rest with blown-up codes: boxes
    from micrometres to a hundred kilometres, needles among them, any heading; a tenth exact copies."""
    cx, cy = rng.integers(0, 48, n) * 0.32, rng.integers(-24, 24, n) * 0.32
    size = np.exp(rng.normal(0.0, 4.0, (n, 2)))
    size[: n // 4] = (3.9, 1.6)
    angle = np.where(rng.random(n) < 0.3, rng.choice([0.0, math.pi / 2], n), rng.uniform(-4.0, 4.0, n))
    boxes = np.stack([make_box(style, *row) for row in zip(cx, cy, size[:, 0], size[:, 1], angle)])
    copies = np.flatnonzero(rng.random(n) < 0.1)
    boxes[copies] = boxes[rng.integers(0, n, copies.size)]
    return boxes


def kernel_iou_row(box: np.ndarray, boxes: np.ndarray, style: str) -> np.ndarray:
    """IoU of one kernel input box against each of ``boxes``, transcribed straight from the kernels as
    the NumPy reference first did it: five cross products for each of the 16 edge pairs, the 24
    candidate vertices in the kernel's slots, the stable angular sort, the fan area. The library's
    faster form must give these values bit for bit."""
    b = np.vstack([box[None], boxes]).astype(np.float32).astype(np.float64)
    if style == "openpcdet":
        cx, cy, hx, hy, angle, sense = b[:, 0], b[:, 1], b[:, 3] / 2, b[:, 4] / 2, b[:, 6], 1.0
        area = b[:, 3] * b[:, 4]
    else:
        cx, cy, angle, sense = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 4], -1.0
        hx, hy, area = (b[:, 2] - b[:, 0]) / 2, (b[:, 3] - b[:, 1]) / 2, (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    cos, sin = np.cos(sense * angle), np.sin(sense * angle)
    lx, ly = np.stack([-hx, hx, hx, -hx], axis=1), np.stack([-hy, -hy, hy, hy], axis=1)
    corners = np.stack([cx[:, None] + lx * cos[:, None] - ly * sin[:, None],
                        cy[:, None] + lx * sin[:, None] + ly * cos[:, None]], axis=2)
    m = len(boxes)
    a, o = np.zeros(m, np.int64), np.arange(1, m + 1)  # the box, the others

    def inside(points: np.ndarray, r: np.ndarray) -> np.ndarray:
        dx, dy = points[..., 0] - cx[r, None], points[..., 1] - cy[r, None]
        lx, ly = dx * cos[r, None] + dy * sin[r, None], -dx * sin[r, None] + dy * cos[r, None]
        return (np.abs(lx) < hx[r, None] + MARGIN[style]) & (np.abs(ly) < hy[r, None] + MARGIN[style])

    def cross(p1: np.ndarray, p2: np.ndarray, p0: np.ndarray) -> np.ndarray:
        d1, d2 = p1 - p0, p2 - p0
        return d1[..., 0] * d2[..., 1] - d2[..., 0] * d1[..., 1]

    p0, p1 = corners[a][:, :, None, :], np.roll(corners[a], -1, axis=1)[:, :, None, :]
    q0, q1 = corners[o][:, None, :, :], np.roll(corners[o], -1, axis=1)[:, None, :, :]
    box_overlap = ((np.minimum(p0[..., 0], p1[..., 0]) <= np.maximum(q0[..., 0], q1[..., 0]))
                   & (np.minimum(q0[..., 0], q1[..., 0]) <= np.maximum(p0[..., 0], p1[..., 0]))
                   & (np.minimum(p0[..., 1], p1[..., 1]) <= np.maximum(q0[..., 1], q1[..., 1]))
                   & (np.minimum(q0[..., 1], q1[..., 1]) <= np.maximum(p0[..., 1], p1[..., 1])))
    s1, s2, s3, s4, s5 = cross(q0, p1, p0), cross(p1, q1, p0), cross(p0, q1, q0), cross(q1, p1, q0), cross(q1, p1, p0)
    valid = box_overlap & (s1 * s2 > 0) & (s3 * s4 > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        by_area = (s5[..., None] * q0 - s1[..., None] * q1) / (s5 - s1)[..., None]
        a0, b0, c0 = p0[..., 1] - p1[..., 1], p1[..., 0] - p0[..., 0], p0[..., 0] * p1[..., 1] - p1[..., 0] * p0[..., 1]
        a1, b1, c1 = q0[..., 1] - q1[..., 1], q1[..., 0] - q0[..., 0], q0[..., 0] * q1[..., 1] - q1[..., 0] * q0[..., 1]
        det = a0 * b1 - a1 * b0
        by_lines = np.stack([(b0 * c1 - b1 * c0) / det, (a1 * c0 - a0 * c1) / det], axis=-1)
    crossings = np.where((np.abs(s5 - s1) > 1e-8)[..., None], by_area, by_lines).reshape(m, 16, 2)
    corner_pts = np.stack([corners[o], corners[a]], axis=2).reshape(m, 8, 2)
    ok = np.concatenate([valid.reshape(m, 16),
                         np.stack([inside(corners[o], a), inside(corners[a], o)], axis=2).reshape(m, 8)], axis=1)
    pts = np.where(ok[..., None], np.concatenate([crossings, corner_pts], axis=1), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = pts.sum(axis=1) / ok.sum(axis=1)[:, None]
    angle_about = np.where(ok, np.arctan2(pts[..., 1] - centre[:, None, 1], pts[..., 0] - centre[:, None, 0]), np.inf)
    order = np.argsort(angle_about, axis=1, kind="stable")
    pts, ok = np.take_along_axis(pts, order[..., None], axis=1), np.take_along_axis(ok, order, axis=1)
    rel = pts - pts[:, :1, :]
    fan = rel[:, :-1, 0] * rel[:, 1:, 1] - rel[:, :-1, 1] * rel[:, 1:, 0]
    overlap = np.abs(np.where(ok[:, 1:], fan, 0.0).sum(axis=1)) / 2
    return overlap / np.maximum(area[a] + area[o] - overlap, 1e-8)


def box_by_box_nms(boxes: np.ndarray, scores: np.ndarray, thr: float, style: str) -> list[int]:
    """The greedy loop one kept box at a time, its ``kernel_iou_row`` against every later box not yet
    suppressed: the straightforward NMS that the batched, bounded one must equal."""
    threshold = float(np.float32(thr))
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    removed: set[int] = set()
    keep: list[int] = []
    for at, i in enumerate(order):
        if i in removed:
            continue
        keep.append(i)
        rest = [j for j in order[at + 1:] if j not in removed]
        if rest:
            iou = kernel_iou_row(boxes[i], boxes[rest], style)
            removed.update(j for j, v in zip(rest, iou.tolist()) if v > threshold)
    return keep


@pytest.mark.parametrize("style", STYLES)
def test_iou_is_the_kernel_transcription_bit_for_bit(style: str) -> None:
    rng = np.random.default_rng(13)
    boxes = saturated_candidates(rng, style, 300)
    for i in range(0, 300, 7):
        np.testing.assert_array_equal(rotated_iou_bev(boxes[i], boxes, style), kernel_iou_row(boxes[i], boxes, style))
    plain = random_pairs(rng, style)
    others = np.stack([p[2] for p in plain])
    for _, box, _ in plain[::25]:
        np.testing.assert_array_equal(rotated_iou_bev(box, others, style), kernel_iou_row(box, others, style))


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("thr", [0.01, 0.5])
@pytest.mark.parametrize("pairs_a_step", [None, 97])  # None: the module's; 97 splits blocks mid-row
def test_nms_on_saturated_candidates_matches_box_by_box(style: str, thr: float, pairs_a_step: int | None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if pairs_a_step is not None:
        monkeypatch.setattr(post, "_NMS_PAIRS", pairs_a_step)
    rng = np.random.default_rng(21)
    n = 400
    boxes = saturated_candidates(rng, style, n)
    for scores in (np.ones(n, np.float32),  # the sigmoid saturated: one big tie
                   np.round(rng.uniform(0.1, 1.0, n), 1).astype(np.float32)):
        expected = box_by_box_nms(boxes, scores, thr, style)
        assert nms_rotated(boxes, scores, thr, style).tolist() == expected
        assert 20 < len(expected) < n - 20



@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("max_keep", [1, 7, 40, 1000])
def test_nms_capped_at_max_keep_is_the_box_by_box_loops_first_kept(style: str, max_keep: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The families cut NMS's output at max_boxes; stopping the pass there keeps the same boxes, and a frame
    that keeps its first max_boxes early leaves most of its candidates' pairs unexamined."""
    n = 400
    boxes = saturated_candidates(np.random.default_rng(21), style, n)
    scores = np.round(np.random.default_rng(3).uniform(0.1, 1.0, n), 1).astype(np.float32)
    expected = box_by_box_nms(boxes, scores, 0.01, style)
    assert len(expected) > 40
    pairs = counted(monkeypatch, "_suppresses")
    assert nms_rotated(boxes, scores, 0.01, style, max_keep=max_keep).tolist() == expected[:max_keep]
    capped = pairs[0]
    nms_rotated(boxes, scores, 0.01, style)
    full = pairs[0] - capped
    if max_keep < len(expected):
        assert capped < full
    if max_keep <= len(expected) // 8:
        assert capped < full / 4, (capped, full)

def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Wrap ``post.<name>`` to add up the rows of its first array argument (pairs, for the NMS's
    steps); returns the running total."""
    total = [0]
    original = getattr(post, name)

    def counting(*args: Any) -> Any:
        total[0] += next(len(arg) for arg in args if isinstance(arg, np.ndarray))
        return original(*args)

    monkeypatch.setattr(post, name, counting)
    return total


def test_nms_sorts_few_polygons_of_a_saturated_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most pairs of a saturated frame are settled by the area bound, without the polygon's sort."""
    pairs, sorted_ = counted(monkeypatch, "_suppresses"), counted(monkeypatch, "_polygon_area")
    n = 1500
    boxes = saturated_candidates(np.random.default_rng(5), "openpcdet", n)
    nms_rotated(boxes, np.ones(n, np.float32), 0.01, "openpcdet")
    assert pairs[0] > 50_000 and sorted_[0] < pairs[0] / 10


def test_nms_of_one_crowd_compares_each_box_about_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Boxes suppressed by a block's first box had their pairs worked out in vain; blocks grow only
    while their boxes are kept, so a crowd that one box suppresses costs about one row, not a block's."""
    pairs = counted(monkeypatch, "_suppresses")
    n = 2000
    rng = np.random.default_rng(8)
    boxes = np.stack([make_box("openpcdet", x, y, 4.0, 2.0, turn) for x, y, turn in rng.normal(0.0, 0.05, (n, 3))])
    assert nms_rotated(boxes, rng.uniform(0.1, 1.0, n).astype(np.float32), 0.01, "openpcdet").size == 1
    assert pairs[0] < 2 * n


# --------------------------------------------------------------------------- anchors, decoding, direction

# README "Checkpoint facts", per class-anchor k in head order: (dx, dy, dz) or (w, l, h), anchor z.
README_ANCHORS = {
    "openpcdet": [((3.9, 1.6, 1.56), -1.0), ((0.8, 0.6, 1.73), 0.265), ((1.76, 0.6, 1.73), 0.265)],
    "zhulf0804": [((0.6, 0.8, 1.73), -0.6), ((0.6, 1.76, 1.73), -0.6), ((1.6, 3.9, 1.56), -1.78)],
}


def readme_anchor(family: str, y: int, x: int, k: int, r: int) -> list[float]:
    if family == "openpcdet":
        ax, ay = x * 69.12 / 215, -39.68 + y * 79.36 / 247
    else:
        ax, ay = 0.16 + 0.32 * x, -39.52 + 0.32 * y
    size, z = README_ANCHORS[family][k]
    return [ax, ay, z, *size, (0.0, 1.57)[r]]


@pytest.mark.parametrize("family", ["openpcdet", "zhulf0804"])
def test_anchors_match_readme_formulas(family: str, openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    cfg = openpcdet_cfg if family == "openpcdet" else zhulf_cfg
    got = anchors(cfg)
    assert got.shape == (248 * 216 * 6, 7) and got.dtype == np.float32
    assert not got.flags.writeable
    rng = np.random.default_rng(0)
    cells = [(0, 0), (0, 215), (247, 0), (247, 215)] + [tuple(c) for c in rng.integers(0, [248, 216], (400, 2))]
    for y, x in cells:
        for k in range(3):
            for r in range(2):
                row = ((y * 216 + x) * 3 + k) * 2 + r
                np.testing.assert_allclose(got[row], readme_anchor(family, y, x, k, r), rtol=0, atol=2e-5)


def decode64(code: Sequence[float], anchor: Sequence[float], family: str) -> list[float]:
    t = [float(v) for v in code]
    a = [float(v) for v in anchor]
    d = math.hypot(a[3], a[4])
    if family == "openpcdet":
        return [t[0] * d + a[0], t[1] * d + a[1], t[2] * a[5] + a[2],
                a[3] * math.exp(t[3]), a[4] * math.exp(t[4]), a[5] * math.exp(t[5]), a[6] + t[6]]
    h = a[5] * math.exp(t[5])
    return [t[0] * d + a[0], t[1] * d + a[1], t[2] * a[5] + a[2] + a[5] / 2 - h / 2,
            a[3] * math.exp(t[3]), a[4] * math.exp(t[4]), h, a[6] + t[6]]


@pytest.mark.parametrize("family", ["openpcdet", "zhulf0804"])
def test_decode_matches_per_box_formulas(family: str, openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    cfg = openpcdet_cfg if family == "openpcdet" else zhulf_cfg
    rng = np.random.default_rng(1)
    rows = rng.integers(0, cfg.num_anchors, 500)
    anc = anchors(cfg)[rows]
    codes = rng.normal(0, 0.6, (500, 7)).astype(np.float32)
    got = decode_boxes(codes, anc, cfg)
    assert got.dtype == np.float32
    for i in range(500):
        np.testing.assert_allclose(got[i], decode64(codes[i], anc[i], family), rtol=2e-6, atol=2e-5)


def test_direction_matches_formulas(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    rng = np.random.default_rng(2)
    angles = rng.uniform(-12, 12, 2000).astype(np.float32)
    bins = rng.integers(0, 2, 2000)
    pcdet = apply_direction(angles, bins, openpcdet_cfg)
    zhulf = apply_direction(angles, bins, zhulf_cfg)
    for h, b, p, z in zip(angles.tolist(), bins.tolist(), pcdet.tolist(), zhulf.tolist()):
        v = h - 0.78539
        if abs(v / math.pi - round(v / math.pi)) > 1e-5:  # not on a fold
            assert p == pytest.approx(v - math.floor(v / math.pi) * math.pi + 0.78539 + math.pi * b, abs=2e-5)
        if abs(h / math.pi - round(h / math.pi)) > 1e-5:
            assert z == pytest.approx(h - math.floor(h / math.pi + 1) * math.pi + math.pi * (1 - b), abs=2e-5)
    assert pcdet.min() >= 0.78539 - 1e-5 and pcdet.max() < 0.78539 + 2 * math.pi + 1e-5
    assert zhulf.min() >= -math.pi - 1e-5 and zhulf.max() < math.pi + 1e-5


def test_head_maps_to_anchor_major(openpcdet_cfg: ModelConfig) -> None:
    cfg = openpcdet_cfg
    rng = np.random.default_rng(4)
    cls = rng.normal(size=(1, 18, 248, 216)).astype(np.float32)
    box = rng.normal(size=(1, 42, 248, 216)).astype(np.float32)
    dirm = rng.normal(size=(1, 12, 248, 216)).astype(np.float32)
    c, b, d = head_maps_to_anchor_major(cls, box, dirm, cfg)
    assert c.shape == (321408, 3) and b.shape == (321408, 7) and d.shape == (321408, 2)
    for y, x, a in rng.integers(0, [248, 216, 6], (300, 3)).tolist():
        row = (y * 216 + x) * 6 + a
        assert c[row].tolist() == [float(cls[0, 3 * a + j, y, x]) for j in range(3)]
        assert b[row].tolist() == [float(box[0, 7 * a + j, y, x]) for j in range(7)]
        assert d[row].tolist() == [float(dirm[0, 2 * a + j, y, x]) for j in range(2)]
    with pytest.raises(InputError, match="head map box"):
        head_maps_to_anchor_major(cls, box[:, :41], dirm, cfg)


# --------------------------------------------------------------------------- box conventions

def test_conversion_to_openpcdet_boxes(zhulf_cfg: ModelConfig, openpcdet_cfg: ModelConfig) -> None:
    rng = np.random.default_rng(5)
    native = np.column_stack([rng.uniform(0, 70, 200), rng.uniform(-40, 40, 200), rng.uniform(-3, 0, 200),
                              rng.uniform(0.4, 2, 200), rng.uniform(0.5, 5, 200), rng.uniform(1, 2, 200),
                              rng.uniform(-math.pi, math.pi, 200)]).astype(np.float32)
    pcdet = to_openpcdet_boxes(native, zhulf_cfg)
    for n, p in zip(native.tolist(), pcdet.tolist()):
        x, y, z, w, l, h, yaw = n
        np.testing.assert_allclose(p, [x, y, z + h / 2, l, w, h, -yaw - math.pi / 2], rtol=0, atol=1e-5)
    assert np.array_equal(to_openpcdet_boxes(pcdet, openpcdet_cfg), pcdet)


def read_calib(path: Path) -> tuple[np.ndarray, np.ndarray]:
    rows = {}
    for line in path.read_text().splitlines():
        if ":" in line:
            key, vals = line.split(":", 1)
            rows[key.strip()] = np.array([float(v) for v in vals.split()])
    r0 = np.eye(4)
    r0[:3, :3] = rows["R0_rect"].reshape(3, 3)
    tr = np.eye(4)
    tr[:3, :4] = rows["Tr_velo_to_cam"].reshape(3, 4)
    return r0, tr


def corners_8(cx: float, cy: float, z0: float, z1: float, hx: float, hy: float, theta: float) -> np.ndarray:
    bev = rect_corners(cx, cy, hx, hy, theta)
    return np.array([(px, py, z) for z in (z0, z1) for px, py in bev])


def same_corner_sets(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    dist = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    return bool((dist.min(axis=1) < tol).all() and (dist.min(axis=0) < tol).all())


def test_kitti_label_box_has_the_same_corners_in_both_conventions(assets: Path, zhulf_cfg: ModelConfig) -> None:
    r0, tr = read_calib(assets / "kitti/training/calib/000134.txt")
    cam_to_lidar = np.linalg.inv(r0 @ tr)
    checked = 0
    for line in (assets / "kitti/training/label_2/000134.txt").read_text().splitlines():
        f = line.split()
        if f[0] == "DontCare":
            continue
        h, w, l = (float(v) for v in f[8:11])
        loc, ry = np.array([float(v) for v in f[11:14]]), float(f[14])
        # KITTI camera box: l along the camera x axis, w along z, bottom at loc, turned by ry about y.
        c, s = math.cos(ry), math.sin(ry)
        cam = []
        for dx, dz in ((l / 2, w / 2), (l / 2, -w / 2), (-l / 2, w / 2), (-l / 2, -w / 2)):
            for dy in (0.0, -h):  # camera y points down
                cam.append(loc + [dx * c + dz * s, dy, -dx * s + dz * c])
        from_camera = (np.c_[np.array(cam), np.ones(8)] @ cam_to_lidar.T)[:, :3]
        bottom = (cam_to_lidar @ np.r_[loc, 1.0])[:3]
        native = np.array([[*bottom, w, l, h, ry]], np.float32)  # README: zhulf0804 box from a label
        x, y, zb, nw, nl, nh, yaw = native[0].astype(np.float64)
        zhulf_corners = corners_8(x, y, zb, zb + nh, nw / 2, nl / 2, -yaw)  # corners = R(-yaw) [+-w/2, +-l/2]
        p = to_openpcdet_boxes(native, zhulf_cfg)[0].astype(np.float64)
        pcdet_corners = corners_8(p[0], p[1], p[2] - p[5] / 2, p[2] + p[5] / 2, p[3] / 2, p[4] / 2, p[6])
        assert same_corner_sets(zhulf_corners, pcdet_corners, 1e-4)
        # the calibration is not exactly axis-aligned, hence centimetres; a wrong convention is metres off
        assert same_corner_sets(zhulf_corners, from_camera, 0.08)
        checked += 1
    assert checked == 15


# --------------------------------------------------------------------------- whole post-processing

def head_maps(seed: int, singles: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random NCHW head maps where a controlled set of anchors passes 0.1: `singles` scattered
    anchors and four 2x2-cell clusters (all six anchors) that overlap, for NMS to act on."""
    rng = np.random.default_rng(seed)
    cls = rng.normal(-9.0, 1.2, (1, 18, 248, 216)).astype(np.float32)
    box = rng.normal(0.0, 0.2, (1, 42, 248, 216)).astype(np.float32)
    box[:, 6::7] = rng.normal(0.0, 0.8, (1, 6, 248, 216))
    dirm = rng.normal(0.0, 1.0, (1, 12, 248, 216)).astype(np.float32)
    for _ in range(singles):
        y, x, a, c = (int(v) for v in rng.integers(0, [248, 216, 6, 3]))
        cls[0, 3 * a + c, y, x] = rng.uniform(-2.0, 2.5)
    for _ in range(4):
        y0, x0, c = (int(v) for v in rng.integers(2, [246, 214, 5]))
        c %= 3
        for y in (y0, y0 + 1):
            for x in (x0, x0 + 1):
                for a in range(6):
                    cls[0, 3 * a + c, y, x] = rng.uniform(-1.5, 3.0)
    # two anchors the zhulf0804 output range must drop: x below 0, and a bottom above 0
    cls[0, 3 * 4 + 2, 100, 0] = 3.5
    box[0, 7 * 4 + 0, 100, 0] = -0.6
    cls[0, 3 * 0 + 0, 50, 100] = 3.4
    box[0, 7 * 0 + 2, 50, 100] = 1.5
    return cls, box, dirm


class HeadAnchors:
    """Per-anchor access to NCHW head maps by the README's channel rules, scores in float64."""

    def __init__(self, cls: np.ndarray, box: np.ndarray, dirm: np.ndarray, family: str) -> None:
        grids = np.meshgrid(np.arange(248), np.arange(216), np.arange(6), indexing="ij")
        self.y, self.x, self.a = (g.ravel() for g in grids)  # flat index (y*W + x)*6 + a, a = 2k + r
        logit = np.stack([cls[0, 3 * self.a + c, self.y, self.x] for c in range(3)], axis=1)
        self.prob = 1.0 / (1.0 + np.exp(-logit.astype(np.float64)))
        self.best = self.prob.max(axis=1)
        self.box, self.dirm, self.family = box, dirm, family

    def decoded(self, i: int) -> list[float]:
        y, x, a = int(self.y[i]), int(self.x[i]), int(self.a[i])
        codes = [float(v) for v in self.box[0, 7 * a: 7 * a + 7, y, x]]
        return decode64(codes, readme_anchor(self.family, y, x, a // 2, a % 2), self.family)

    def direction(self, i: int) -> int:
        d = self.dirm[0, 2 * self.a[i]: 2 * self.a[i] + 2, self.y[i], self.x[i]]
        return 0 if d[0] >= d[1] else 1


Slow = tuple[list[list[float]], list[float], list[int], dict[str, int]]


def slow_openpcdet(h: HeadAnchors) -> Slow:
    """README OpenPCDet steps 1-6, box by box; returns OpenPCDet boxes, scores, labels, counters."""
    passing = np.flatnonzero(h.best >= 0.1).tolist()
    cand = sorted(passing, key=lambda i: (-h.best[i], i))[:4096]
    boxes = []
    for i in cand:
        b = h.decoded(i)
        v = b[6] - 0.78539
        b[6] = v - math.floor(v / math.pi) * math.pi + 0.78539 + math.pi * h.direction(i)
        boxes.append(b)
    turned = [(b[0], b[1], b[3] / 2, b[4] / 2, b[6]) for b in boxes]
    kept = greedy_nms(np.array(boxes), np.array([h.best[i] for i in cand]), 0.01,
                      lambda p, q: margin_iou(turned[p], turned[q], MARGIN["openpcdet"]))[:500]
    labels = [int(np.argmax(h.prob[cand[j]])) for j in kept]
    info = {"passing": len(passing), "suppressed": len(cand) - len(kept)}
    return [boxes[j] for j in kept], [float(h.best[cand[j]]) for j in kept], labels, info


def slow_zhulf(h: HeadAnchors) -> Slow:
    """README zhulf0804 steps 1-6 plus the conversion to OpenPCDet boxes."""
    top = np.lexsort((np.arange(h.best.size), -h.best))[:100].tolist()
    decoded = [h.decoded(i) for i in top]
    out: list[tuple[list[float], float, int]] = []
    suppressed = 0
    for c in range(3):
        members = [j for j in range(len(top)) if h.prob[top[j], c] > 0.1]
        rects = {j: (decoded[j][0], decoded[j][1], decoded[j][3] / 2, decoded[j][4] / 2, -decoded[j][6])
                 for j in members}
        keep: list[int] = []
        for j in sorted(members, key=lambda j: (-h.prob[top[j], c], j)):
            if all(margin_iou(rects[k], rects[j], MARGIN["zhulf0804"]) <= 0.01 for k in keep):
                keep.append(j)
        suppressed += len(members) - len(keep)
        for j in keep:
            b = list(decoded[j])
            b[6] = b[6] - math.floor(b[6] / math.pi + 1) * math.pi + math.pi * (1 - h.direction(top[j]))
            out.append((b, float(h.prob[top[j], c]), c))
    before_cut = len(out)
    if len(out) > 50:
        out = [out[i] for i in sorted(range(len(out)), key=lambda i: (-out[i][1], i))[:50]]
    lo, hi = (0.0, -40.0, -3.0), (70.4, 40.0, 0.0)
    inside = [o for o in out if all(lo[d] < o[0][d] < hi[d] for d in range(3))]
    pcdet = []
    for o in inside:
        x, y, z, w, l, hgt, yaw = o[0]
        pcdet.append([x, y, z + hgt / 2, l, w, hgt, -yaw - math.pi / 2])
    info = {"passing": int((h.best > 0.1).sum()), "suppressed": suppressed, "before_cut": before_cut,
            "range_dropped": len(out) - len(inside)}
    return pcdet, [o[1] for o in inside], [o[2] for o in inside], info


@pytest.mark.parametrize("family", ["openpcdet", "zhulf0804"])
@pytest.mark.parametrize("seed,singles", [(11, 25), (12, 90)])
def test_postprocess_matches_slow_readme_loop(family: str, seed: int, singles: int,
                                              openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    cfg = openpcdet_cfg if family == "openpcdet" else zhulf_cfg
    cls, box, dirm = head_maps(seed, singles)
    got = postprocess(cls, box, dirm, cfg)
    slow = slow_openpcdet if family == "openpcdet" else slow_zhulf
    boxes, scores, labels, info = slow(HeadAnchors(cls, box, dirm, family))
    assert 10 <= info["passing"] <= 200 and info["suppressed"] > 0
    if family == "zhulf0804":
        assert info["range_dropped"] > 0
        if singles > 50:
            assert info["before_cut"] > 50  # the top-50 reorder is exercised
    assert len(got) == len(scores) > 5
    assert got.boxes.dtype == np.float32 and got.scores.dtype == np.float32 and got.labels.dtype == np.int32
    assert got.labels.tolist() == labels
    np.testing.assert_allclose(got.scores, scores, rtol=1e-5)
    np.testing.assert_allclose(got.boxes, np.array(boxes), rtol=0, atol=3e-4)
    np.testing.assert_allclose(to_openpcdet_boxes(got.native_boxes, cfg), got.boxes, rtol=0, atol=1e-6)


def test_postprocess_without_detections(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    cls = np.full((1, 18, 248, 216), -20.0, np.float32)
    box = np.zeros((1, 42, 248, 216), np.float32)
    dirm = np.zeros((1, 12, 248, 216), np.float32)
    for cfg in (openpcdet_cfg, zhulf_cfg):
        got = postprocess(cls, box, dirm, cfg)
        assert len(got) == 0 and got.boxes.shape == (0, 7) and got.native_boxes.shape == (0, 7)
        assert got.labels.dtype == np.int32


@pytest.mark.parametrize("family", ["openpcdet", "zhulf0804"])
def test_overflowed_class_logits_are_counted_and_give_no_box(family: str, openpcdet_cfg: ModelConfig,
                                                             zhulf_cfg: ModelConfig) -> None:
    """Class logits the network overflowed to (a corrupt intensity upstream): NaN, infinite, or beyond float16's
    largest value. Each is counted in ``overflowed_scores`` (placed here, so counted here), and the other anchors'
    boxes are the frame's without them: the NaN anchors give no box, and none of the others is lost."""
    cfg = openpcdet_cfg if family == "openpcdet" else zhulf_cfg
    cls, box, dirm = head_maps(11, 25)
    clean = postprocess(cls, box, dirm, cfg)
    assert clean.overflowed_scores == 0 and len(clean) > 5
    spoiled = cls.copy()
    spoiled[0, :, 200:210, 150:160] = np.nan  # a corner with no candidate of the clean frame: every class, anchor
    spoiled[0, 4, 10, 20] = np.nan  # one class of one anchor elsewhere
    spoiled[0, 5, 30, 40] = -np.inf
    spoiled[0, 6, 31, 40] = -1e30
    spoiled[0, 7, 32, 40] = -np.float32(np.finfo(np.float16).max)  # at the bound: a value, not an overflow
    got = postprocess(spoiled, box, dirm, cfg)
    assert got.overflowed_scores == 18 * 10 * 10 + 3
    assert np.isfinite(got.scores).all()
    np.testing.assert_array_equal(got.boxes, clean.boxes)
    np.testing.assert_array_equal(got.scores, clean.scores)
    # NaN in every cell but those of the clean frame's passing anchors: far fewer finite anchors than the top-k
    # takes (zhulf0804 ranks by the maximum first), and still the clean frame's boxes
    passing = (1 / (1 + np.exp(-cls.astype(np.float64)))).max(axis=1)[0] > 0.1  # (y, x): a class of an anchor passes
    mostly = cls.copy()
    mostly[0][:, ~passing] = np.nan
    got = postprocess(mostly, box, dirm, cfg)
    assert got.overflowed_scores == 18 * int(np.count_nonzero(~passing)) and 0 < np.count_nonzero(passing) < 100
    np.testing.assert_array_equal(got.boxes, clean.boxes)
    np.testing.assert_array_equal(got.scores, clean.scores)


def test_nms_input_of_zhulf_boxes(zhulf_cfg: ModelConfig) -> None:
    native = np.array([[10.0, 2.0, -1.0, 1.6, 3.9, 1.5, 0.3]], np.float32)
    np.testing.assert_allclose(nms_boxes(native, zhulf_cfg), [[9.2, 0.05, 10.8, 3.95, 0.3]], rtol=0, atol=1e-6)


def test_score_exactly_at_threshold(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    """OpenPCDet keeps score >= 0.1, zhulf0804 only score > 0.1 (README)."""
    one, target = np.float32(1), np.float32(0.1)
    logits, lo, hi = [], np.float32(math.log(0.1 / 0.9)), np.float32(math.log(0.1 / 0.9))
    for _ in range(64):
        logits += [lo, hi]
        lo, hi = np.nextafter(lo, np.float32(-10)), np.nextafter(hi, np.float32(10))
    exact = [v for v in logits if (one / (one + np.exp(-np.array([v], np.float32))))[0] == target]
    if not exact:
        pytest.skip("no float32 logit whose float32 sigmoid is exactly 0.1 on this NumPy")
    cls = np.full((1, 18, 248, 216), -20.0, np.float32)
    cls[0, 3 * 2 + 1, 10, 20] = exact[0]
    box = np.zeros((1, 42, 248, 216), np.float32)
    dirm = np.zeros((1, 12, 248, 216), np.float32)
    kept = postprocess(cls, box, dirm, openpcdet_cfg)
    assert len(kept) == 1 and kept.scores[0] == target and kept.labels.tolist() == [1]
    assert len(postprocess(cls, box, dirm, zhulf_cfg)) == 0
