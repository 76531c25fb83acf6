"""Frame sets for the benchmark: the demo's simulated scans, or folders of KITTI .bin files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..demo_scene import simulate_scan
from ...errors import InputError
from ...kitti import read_velodyne_bin

CAMERA_HALF_FOV_DEG = 40.5   # KITTI's left colour camera sees about 81 degrees horizontally
SIMULATED_SEEDS = (0, 1, 2, 3)


def camera_view(points: np.ndarray, half_fov_deg: float = CAMERA_HALF_FOV_DEG) -> np.ndarray:
    """The points in front of the car within the camera's horizontal field of view (a KITTI-like crop)."""
    x, y = points[:, 0], points[:, 1]
    return points[(x > 0) & (np.abs(y) < x * math.tan(math.radians(half_fov_deg)))]


def simulated_frame_sets(seeds: tuple[int, ...] = SIMULATED_SEEDS) -> dict[str, list[np.ndarray]]:
    scans = [simulate_scan(seed=s)[0] for s in seeds]
    return {"camera view (simulated)": [camera_view(p) for p in scans], "full scan (simulated)": scans}


def folder_frame_sets(folders: list[str]) -> dict[str, list[np.ndarray]]:
    """One set per folder, named after it; every .bin in it, sorted."""
    sets: dict[str, list[np.ndarray]] = {}
    for folder in folders:
        files = sorted(Path(folder).glob("*.bin"))
        if not files:
            raise InputError(f"{folder}: no .bin files to benchmark on")
        sets[f"{Path(folder).name} ({len(files)} frames)"] = [read_velodyne_bin(f) for f in files]
    return sets
