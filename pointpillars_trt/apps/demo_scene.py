"""A SIMULATED 64-beam lidar scan, for demos and tests that must run without KITTI data.

The scene is made up: a flat ground plane and a few box-shaped cars, pedestrians and cyclists
standing on it in front of the sensor. Rays of an HDL-64E-like spinning lidar are cast against
them (exact ray/box intersection), so the frame has the geometry of a real scan (rings on the
ground, shadows behind objects, ~110k points) but nothing else: intensities are invented and a
trained detector should not be judged on it. Use real KITTI frames for that.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import InputError

SENSOR_HEIGHT = 1.73  # metres above the ground, as on the KITTI car
GROUND_Z = -SENSOR_HEIGHT
# Mean (dx = length, dy = width, dz = height) of KITTI objects, the sizes of the anchors.
CLASS_SIZES = {"Car": (3.9, 1.6, 1.56), "Pedestrian": (0.8, 0.6, 1.73), "Cyclist": (1.76, 0.6, 1.73)}
_REFLECTIVITY = {"Car": (0.35, 0.95), "Pedestrian": (0.15, 0.5), "Cyclist": (0.2, 0.6)}
_GROUND_REFLECTIVITY = 0.3
# Where objects go: inside the KITTI detection range, in front, with room for the whole box.
_X_RANGE = (0.0, 69.12)
_Y_RANGE = (-39.68, 39.68)
_DISTANCE = (8.0, 60.0)
_AZIMUTH_DEG = 60.0
_CANDIDATES = 512  # placement candidates drawn per object
# The scan: azimuth step, range, Gaussian range noise (sigma, metres), share of returns lost.
_AZIMUTH_STEP_DEG = 0.18
_MAX_RANGE = 80.0
_RANGE_NOISE = 0.01
_DROPOUT = 0.02


class SceneObject(NamedTuple):
    """One simulated object: class name and box (7,) x, y, z_centre, dx, dy, dz, heading."""

    name: str
    box: np.ndarray


def simulate_scan(seed: int = 0, num_beams: int = 64, num_cars: int = 5) -> tuple[np.ndarray, list[SceneObject]]:
    """SIMULATED 360-degree scan: (N, 4) float32 points and the objects it contains (``num_cars``
    cars, 3 pedestrians, 2 cyclists).

    Beams: half from +2 to -8.33 deg, half from -8.83 to -24.8 deg (the two laser blocks of an
    HDL-64E), one ray every 0.18 deg of azimuth, returns up to 80 m, 2% of them dropped. Range noise
    is Gaussian with sigma 1 cm, clipped at 3 sigma, so every point lies within 3 sigma of a surface.
    Objects are placed so none hides another, hence every object is hit. The same seed gives the same
    frame. ``num_beams`` and ``num_cars`` let a test ask for a small scan or a crowded one.
    """
    rng = np.random.default_rng(seed)
    counts = {"Car": num_cars, "Cyclist": 2, "Pedestrian": 3}
    objects = _place_objects(rng, counts)
    reflectivity = np.array(
        [_GROUND_REFLECTIVITY] + [rng.uniform(*_REFLECTIVITY[o.name]) for o in objects]
    )

    upper = num_beams // 2
    elevation = np.deg2rad(
        np.concatenate([np.linspace(2.0, -8.33, upper), np.linspace(-8.83, -24.8, num_beams - upper)])
    )
    azimuth = np.deg2rad(np.arange(-180.0, 180.0, _AZIMUTH_STEP_DEG))
    el, az = np.meshgrid(elevation, azimuth, indexing="ij")
    dirs = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)

    with np.errstate(divide="ignore"):
        dist = np.where(dirs[:, 2] < 0, GROUND_Z / dirs[:, 2], np.inf)
    surface = np.zeros(len(dirs), dtype=np.int64)  # 0 = ground, k + 1 = objects[k]
    for k, obj in enumerate(objects):
        t = _ray_box_distance(dirs, obj.box)
        closer = t < dist
        dist[closer] = t[closer]
        surface[closer] = k + 1

    keep = (dist <= _MAX_RANGE) & (rng.random(len(dirs)) >= _DROPOUT)
    dirs, dist, surface = dirs[keep], dist[keep], surface[keep]
    noisy = dist + np.clip(rng.normal(0.0, _RANGE_NOISE, len(dist)), -3 * _RANGE_NOISE, 3 * _RANGE_NOISE)
    falloff = 0.6 + 0.4 * np.exp(-dist / 30.0)
    intensity = reflectivity[surface] * falloff + rng.uniform(-0.05, 0.05, len(dist))
    points = np.column_stack([dirs * noisy[:, None], np.clip(intensity, 0.0, 0.99)])
    return points.astype(np.float32), objects


def _place_objects(rng: np.random.Generator, counts: dict[str, int]) -> list[SceneObject]:
    """Put objects on the ground in front of the sensor, no two overlapping in azimuth.

    Disjoint azimuth sectors (each object's bounding circle plus a margin) mean no object
    shadows another, so each one is seen. Candidates are drawn in a batch per object and the
    first that fits is taken.
    """
    objects: list[SceneObject] = []
    sectors: list[tuple[float, float]] = []
    for name, count in counts.items():
        for number in range(1, count + 1):
            size = np.array(CLASS_SIZES[name]) * rng.uniform(0.92, 1.08, 3)
            radius = float(np.hypot(size[0], size[1])) / 2
            distance = rng.uniform(*_DISTANCE, _CANDIDATES)
            bearing = np.deg2rad(rng.uniform(-_AZIMUTH_DEG, _AZIMUTH_DEG, _CANDIDATES))
            half = np.arcsin(np.minimum(1.0, radius / distance)) + np.deg2rad(0.5)
            x, y = distance * np.cos(bearing), distance * np.sin(bearing)
            fits = (
                (x - radius >= _X_RANGE[0]) & (x + radius <= _X_RANGE[1])
                & (y - radius >= _Y_RANGE[0]) & (y + radius <= _Y_RANGE[1])
            )
            for lo, hi in sectors:
                fits &= (bearing + half < lo) | (bearing - half > hi)
            if not fits.any():
                raise InputError(
                    f"demo scene: no free place for {name} #{number}; ask for fewer objects"
                )
            i = int(np.argmax(fits))
            sectors.append((bearing[i] - half[i], bearing[i] + half[i]))
            if name == "Pedestrian":
                heading = rng.uniform(-np.pi, np.pi)
            else:  # vehicles follow the road (along x), either way
                heading = rng.choice([0.0, np.pi]) + rng.normal(0.0, 0.15)
            box = np.array([x[i], y[i], GROUND_Z + size[2] / 2, *size, heading])
            objects.append(SceneObject(name, box.astype(np.float32)))
    return objects


def _ray_box_distance(dirs: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Distance along each ray from the origin to an oriented box (inf on a miss).

    Slab method in the box's frame: rotate the origin and the directions by -heading, then
    intersect the three pairs of axis-aligned planes.
    """
    centre = box[:3].astype(np.float64)
    half = box[3:6].astype(np.float64) / 2
    c, s = np.cos(box[6]), np.sin(box[6])
    to_local = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])
    origin = to_local @ -centre
    d = dirs @ to_local.T
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (-half - origin) / d
        t2 = (half - origin) / d
    t_near = np.minimum(t1, t2).max(axis=1)
    t_far = np.maximum(t1, t2).min(axis=1)
    return np.where((t_near <= t_far) & (t_near > 0), t_near, np.inf)
