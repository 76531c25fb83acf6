"""The simulated scan: deterministic, KITTI-sized, and every point on a surface of the scene."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pointpillars_trt.apps.demo_scene import GROUND_Z, SceneObject, simulate_scan
from pointpillars_trt.errors import InputError

NOISE_BOUND = 0.03  # 3 sigma of the default range noise, where the simulator clips it


@pytest.fixture(scope="module")
def scan() -> tuple[np.ndarray, list[SceneObject]]:
    return simulate_scan(seed=0)


def local_coords(points: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Points in the box frame (origin at the centre, x along the heading), in float64."""
    x, y, z, _, _, _, heading = (float(v) for v in box)
    c, s = math.cos(heading), math.sin(heading)
    d = points[:, :3].astype(np.float64) - [x, y, z]
    return np.column_stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1], d[:, 2]])


def inside(points: np.ndarray, box: np.ndarray, margin: float) -> np.ndarray:
    half = box[3:6].astype(np.float64) / 2 + margin
    return (np.abs(local_coords(points, box)) <= half).all(axis=1)


def test_deterministic_per_seed(scan: tuple[np.ndarray, list[SceneObject]]) -> None:
    points, objects = scan
    again, objects_again = simulate_scan(seed=0)
    np.testing.assert_array_equal(points, again)
    assert [o.name for o in objects] == [o.name for o in objects_again]
    for a, b in zip(objects, objects_again):
        np.testing.assert_array_equal(a.box, b.box)
    other, _ = simulate_scan(seed=1)
    assert other.shape != points.shape or not np.array_equal(other, points)


def test_shape_count_and_ranges(scan: tuple[np.ndarray, list[SceneObject]]) -> None:
    points, objects = scan
    assert points.dtype == np.float32 and points.ndim == 2 and points.shape[1] == 4
    assert 60_000 <= len(points) <= 130_000
    assert np.isfinite(points).all()
    assert points[:, 3].min() >= 0 and points[:, 3].max() <= 0.99
    assert np.linalg.norm(points[:, :3].astype(np.float64), axis=1).max() <= 80.0 + NOISE_BOUND + 1e-3
    assert [o.name for o in objects].count("Car") == 5
    assert {o.name for o in objects} == {"Car", "Pedestrian", "Cyclist"}


def test_objects_stand_on_the_ground_inside_kitti_range(scan: tuple[np.ndarray, list[SceneObject]]) -> None:
    _, objects = scan
    for obj in objects:
        box = obj.box.astype(np.float64)
        assert obj.box.shape == (7,)
        assert abs(box[2] - box[5] / 2 - GROUND_Z) < 1e-5
        reach = math.hypot(box[3], box[4]) / 2
        assert 0 <= box[0] - reach and box[0] + reach <= 69.12
        assert -39.68 <= box[1] - reach and box[1] + reach <= 39.68


def test_every_point_is_on_the_ground_or_an_object_surface(scan: tuple[np.ndarray, list[SceneObject]]) -> None:
    points, objects = scan
    sample = points[np.random.default_rng(0).choice(len(points), 5000, replace=False)]
    on_ground = np.abs(sample[:, 2] - GROUND_Z) <= NOISE_BOUND + 1e-4
    on_object = np.zeros(len(sample), dtype=bool)
    for obj in objects:
        local = np.abs(local_coords(sample, obj.box))
        half = obj.box[3:6].astype(np.float64) / 2
        within = (local <= half + NOISE_BOUND + 1e-4).all(axis=1)
        near_face = (np.abs(local - half) <= NOISE_BOUND + 1e-4).any(axis=1)
        on_object |= within & near_face
    assert (on_ground | on_object).all()
    assert on_object.any() and on_ground.mean() > 0.8


def test_objects_are_hit_and_only_on_their_surface(scan: tuple[np.ndarray, list[SceneObject]]) -> None:
    points, objects = scan
    for obj in objects:
        assert inside(points, obj.box, margin=0.05).sum() >= 5, obj.name
        # rays stop at the first face, so nothing lies deep inside a box
        assert not inside(points, obj.box, margin=-(NOISE_BOUND + 0.02)).any(), obj.name


def test_objects_cast_shadows(scan: tuple[np.ndarray, list[SceneObject]]) -> None:
    """Behind each car, along the bearing of its centre, the ground is hidden for a while."""
    points, objects = scan
    bearing = np.arctan2(points[:, 1], points[:, 0])
    dist = np.hypot(points[:, 0], points[:, 1])
    for obj in objects:
        if obj.name != "Car":
            continue
        x, y = float(obj.box[0]), float(obj.box[1])
        centre_dist, centre_bearing = math.hypot(x, y), math.atan2(y, x)
        behind = (np.abs(bearing - centre_bearing) < 0.002) & (dist > centre_dist + 3) & (dist < centre_dist + 6)
        assert not behind.any()


def test_too_many_objects_is_a_clear_error() -> None:
    with pytest.raises(InputError, match="no free place"):
        simulate_scan(seed=0, num_cars=40, num_beams=4)
