"""Box overlaps of the KITTI evaluation against hand-derived values and a grid-sampling estimate."""

from __future__ import annotations

import numpy as np
import pytest

from pointpillars_trt.apps.eval.geometry import (
    camera_bev_corners,
    bev_intersection_pairs,
    box2d_coverage_pairs,
    box2d_iou_pairs,
    camera_box_iou_pairs,
)
from pointpillars_trt.kitti import camera_box_corners


def _bev(x: float, z: float, l: float, w: float, ry: float) -> np.ndarray:
    return np.array([[x, z, l, w, ry]], dtype=np.float64)


def bev_iou_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The BEV IoU of (P, 5) BEV boxes, as camera_box_iou_pairs gives it for 3D boxes of those footprints."""
    def camera(boxes: np.ndarray) -> np.ndarray:  # (x, y, z, h, w, l, ry), 1 m tall, bottom at y = 0
        x, z, l, w, ry = boxes.T
        return np.stack([x, np.zeros_like(x), z, np.ones_like(x), w, l, ry], axis=1)

    return camera_box_iou_pairs(camera(a), camera(b))[0]


def test_identical_boxes_have_iou_one() -> None:
    box = _bev(3.0, 12.0, 4.2, 1.7, 0.83)
    assert bev_iou_pairs(box, box)[0] == pytest.approx(1.0, abs=1e-12)


def test_square_turned_a_quarter_is_the_same_square() -> None:
    assert bev_iou_pairs(_bev(1, 1, 2, 2, 0), _bev(1, 1, 2, 2, np.pi / 2))[0] == pytest.approx(1.0, abs=1e-12)


def test_half_overlapping_boxes_have_iou_one_third() -> None:
    # intersection 2 x 1 = 2, union 4 + 4 - 2 = 6
    assert bev_iou_pairs(_bev(0, 0, 2, 2, 0), _bev(1, 0, 2, 2, 0))[0] == pytest.approx(1 / 3, abs=1e-12)


def test_square_at_45_degrees_against_axis_aligned() -> None:
    # The turned square's corners stick out past each side of [-1, 1]^2 as triangles of area
    # (sqrt2 - 1)^2, so the intersection is 4 - 4 (sqrt2 - 1)^2 = 8 sqrt2 - 8 and IoU = 1 / sqrt2.
    inter = bev_intersection_pairs(_bev(0, 0, 2, 2, 0), _bev(0, 0, 2, 2, np.pi / 4))[0]
    assert inter == pytest.approx(8 * np.sqrt(2) - 8, abs=1e-12)
    assert bev_iou_pairs(_bev(0, 0, 2, 2, 0), _bev(0, 0, 2, 2, np.pi / 4))[0] == pytest.approx(1 / np.sqrt(2))


def test_touching_and_disjoint_boxes_do_not_overlap() -> None:
    assert bev_iou_pairs(_bev(0, 0, 2, 2, 0), _bev(2, 0, 2, 2, 0))[0] == 0.0
    assert bev_iou_pairs(_bev(0, 0, 2, 2, 0.3), _bev(9, 4, 2, 2, 1.1))[0] == 0.0


def test_corners_follow_kitti_rotation_y() -> None:
    # The package's 3D corners (used to write predictions) and the BEV corners agree, as point sets.
    rng = np.random.default_rng(3)
    for _ in range(5):
        x, z, l, w, ry = rng.uniform(-5, 5), rng.uniform(5, 40), rng.uniform(1, 5), rng.uniform(0.5, 2), rng.uniform(-3, 3)
        bottom = camera_box_corners(np.array([[x, 1.5, z]]), np.array([[l, 1.6, w]]), np.array([ry]))[0, :4][:, [0, 2]]
        ours = camera_bev_corners(_bev(x, z, l, w, ry))[0]
        assert np.allclose(np.sort(bottom, axis=0), np.sort(ours, axis=0))


def _grid_intersection(a: np.ndarray, b: np.ndarray, steps: int = 1200) -> float:
    """Area inside both boxes, counted on a dense grid with a point-in-box test in box coordinates."""
    reach = max(np.hypot(a[2], a[3]), np.hypot(b[2], b[3]))
    lo = np.minimum(a[:2], b[:2]) - reach
    hi = np.maximum(a[:2], b[:2]) + reach
    xs = np.linspace(lo[0], hi[0], steps, endpoint=False) + (hi[0] - lo[0]) / steps / 2
    zs = np.linspace(lo[1], hi[1], steps, endpoint=False) + (hi[1] - lo[1]) / steps / 2
    px, pz = np.meshgrid(xs, zs)

    def inside(box: np.ndarray) -> np.ndarray:
        dx, dz = px - box[0], pz - box[1]
        c, s = np.cos(box[4]), np.sin(box[4])
        # invert x' = c lx + s lz, z' = -s lx + c lz
        lx, lz = c * dx - s * dz, s * dx + c * dz
        return (np.abs(lx) <= box[2] / 2) & (np.abs(lz) <= box[3] / 2)

    cell = (hi[0] - lo[0]) * (hi[1] - lo[1]) / steps**2
    return float(np.count_nonzero(inside(a) & inside(b)) * cell)


def test_random_rotated_boxes_match_grid_sampling() -> None:
    rng = np.random.default_rng(11)
    n = 25
    a = np.column_stack([rng.uniform(-1, 1, n), rng.uniform(-1, 1, n), rng.uniform(1, 5, n),
                         rng.uniform(0.5, 2.5, n), rng.uniform(-np.pi, np.pi, n)])
    b = np.column_stack([rng.uniform(-1.5, 1.5, n), rng.uniform(-1.5, 1.5, n), rng.uniform(1, 5, n),
                         rng.uniform(0.5, 2.5, n), rng.uniform(-np.pi, np.pi, n)])
    exact = bev_intersection_pairs(a, b)
    assert np.count_nonzero(exact > 0.5) > 15  # most pairs really overlap
    for i in range(n):
        assert exact[i] == pytest.approx(_grid_intersection(a[i], b[i]), abs=0.02)


def test_3d_iou_multiplies_bev_intersection_by_height_overlap() -> None:
    # Same footprint 4 x 2; heights [y - h, y]: [-2, 0] and [-3, -1] share 1 of 2 -> IoU 1/3.
    a = np.array([[0.0, 0.0, 10.0, 2.0, 2.0, 4.0, 0.4]])
    b = np.array([[0.0, -1.0, 10.0, 2.0, 2.0, 4.0, 0.4]])
    bev, iou3d = camera_box_iou_pairs(a, b)
    assert bev[0] == pytest.approx(1.0, abs=1e-12)
    assert iou3d[0] == pytest.approx(1 / 3, abs=1e-12)
    stacked = b.copy()
    stacked[0, 1] = -2.0  # sits exactly on top of a: no shared volume
    assert camera_box_iou_pairs(a, stacked)[1][0] == 0.0


def test_2d_iou_and_coverage() -> None:
    a = np.array([[0.0, 0.0, 10.0, 10.0]])
    b = np.array([[5.0, 0.0, 15.0, 10.0]])
    assert box2d_iou_pairs(a, b)[0] == pytest.approx(50 / 150)
    assert box2d_coverage_pairs(a, b)[0] == pytest.approx(0.5)
    inner = np.array([[2.0, 2.0, 4.0, 4.0]])
    assert box2d_coverage_pairs(inner, a)[0] == pytest.approx(1.0)
    assert box2d_iou_pairs(a, np.array([[10.0, 0.0, 20.0, 10.0]]))[0] == 0.0


@pytest.mark.parametrize("l, w", [(0.0, 0.0), (0.0, 2.0), (2.0, 0.0)])
def test_a_box_of_no_area_overlaps_nothing(l: float, w: float) -> None:
    """A point or a segment inside a 2 x 2 square shares no area with it. Before, the point (l = w = 0) kept the
    square whole when clipping (its edges have no direction): intersection 4, union 4 + 0 - 4 = 0, IoU inf,
    which matched any ground truth as a true positive in BEV and 3D."""
    square = np.array([[0.0, 1.5, 10.0, 1.5, 2.0, 2.0, 0.3]])  # x y z h w l ry: 2 x 2 footprint, 1.5 m tall
    flat = np.array([[0.0, 1.5, 10.0, 1.5, w, l, 0.3]])
    with np.errstate(all="raise"):  # no division by zero, no invalid value on the way
        assert bev_intersection_pairs(square[:, [0, 2, 5, 4, 6]], flat[:, [0, 2, 5, 4, 6]])[0] == 0.0
        for first, second in ((square, flat), (flat, square), (flat, flat)):
            bev, iou3d = camera_box_iou_pairs(first, second)
            assert (bev[0], iou3d[0]) == (0.0, 0.0)


def test_a_small_box_inside_a_large_one_has_the_ratio_of_their_areas() -> None:
    """Continuity next to the degenerate case: a 1 cm x 1 cm box centred in a 2 m x 2 m one shares its own area,
    IoU 0.0001 / 4 (BEV) and, both 1.5 m tall on the same floor, 0.00015 / 6 (3D)."""
    square = np.array([[0.0, 1.5, 10.0, 1.5, 2.0, 2.0, 0.3]])
    tiny = np.array([[0.0, 1.5, 10.0, 1.5, 0.01, 0.01, 1.1]])
    bev, iou3d = camera_box_iou_pairs(tiny, square)
    assert bev[0] == pytest.approx(0.0001 / 4, rel=1e-9)
    assert iou3d[0] == pytest.approx(0.00015 / 6, rel=1e-9)


def test_a_box_of_no_height_has_no_3d_overlap_but_its_bev_one() -> None:
    square = np.array([[0.0, 1.5, 10.0, 1.5, 2.0, 2.0, 0.0]])
    flat = np.array([[0.0, 1.0, 10.0, 0.0, 2.0, 1.0, 0.0]])  # 1 x 2 footprint inside the square's, 0 m tall
    with np.errstate(all="raise"):
        bev, iou3d = camera_box_iou_pairs(square, flat)
    assert (bev[0], iou3d[0]) == (pytest.approx(2 / 4), 0.0)


def test_2d_boxes_of_no_area_overlap_nothing() -> None:
    image_box = np.array([[100.0, 100.0, 200.0, 200.0]])
    with np.errstate(all="raise"):
        for degenerate in ([150.0, 150.0, 150.0, 150.0], [120.0, 150.0, 180.0, 150.0], [0.0, 0.0, 0.0, 0.0]):
            box = np.array([degenerate])
            assert box2d_iou_pairs(image_box, box)[0] == 0.0 and box2d_iou_pairs(box, box)[0] == 0.0
