"""Frame sets for the benchmark: the demo's simulated scans, or folders of .bin files (KITTI's 4 values
a point, or nuScenes' 5 for a model with a time column)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..demo_scene import simulate_scan
from ...errors import InputError, safe_repr
from ...pointcloud_io import read_points
from ...staging import empty_pinned

CAMERA_HALF_FOV_DEG = 40.5   # KITTI's left colour camera sees about 81 degrees horizontally
SIMULATED_SEEDS = (0, 1, 2, 3)


def camera_view(points: np.ndarray) -> np.ndarray:
    """The points in front of the car within the camera's horizontal field of view (a KITTI-like crop)."""
    x, y = points[:, 0], points[:, 1]
    return points[(x > 0) & (np.abs(y) < x * math.tan(math.radians(CAMERA_HALF_FOV_DEG)))]


def simulated_frame_sets(columns: int = 4) -> dict[str, list[np.ndarray]]:
    """Simulated scans and their camera-view crops; ``columns`` 5 adds a time-lag column of zeros (one
    sweep) and leaves out the crops (multi-sweep models see all around)."""
    scans = [simulate_scan(seed=s)[0] for s in SIMULATED_SEEDS]
    if columns == 5:
        return {"full scan (simulated, one sweep)": [np.hstack([p, np.zeros((len(p), 1), np.float32)]) for p in scans]}
    return {"camera view (simulated)": [camera_view(p) for p in scans], "full scan (simulated)": scans}


def folder_frame_sets(folders: list[str], columns: int = 4, point_dim: int = 4, limit: int | None = None,
                      say: Callable[[str], object] = print) -> dict[str, list[np.ndarray]]:
    """One set per folder, named after it; its .bin files, sorted, of ``point_dim`` values a point, of which the
    model reads ``columns``. At most the first ``limit`` of them are read (``say`` says so): a latency run
    times no more distinct frames than its iterations, and all of KITTI's 7,481 full scans would take ~14 GB."""
    sets: dict[str, list[np.ndarray]] = {}
    for folder in folders:
        path = Path(folder)
        if not path.is_dir():
            problem = "is a file; --frames names a folder of .bin files" if path.exists() else "no such folder"
            raise InputError(f"--frames {safe_repr(folder)}: {problem}")
        files = sorted(p for p in path.glob("*.bin") if not p.is_dir())  # as infer lists a folder
        if not files:
            raise InputError(f"--frames {safe_repr(folder)}: no .bin files to benchmark on")
        used = files[:limit]
        if len(used) < len(files):
            say(f"note: --frames {safe_repr(folder)}: reading its first {len(used)} of {len(files)} .bin files, as "
                f"many as --iterations {limit} times")
        count = f"{len(files)} frames" if len(used) == len(files) else f"first {len(used)} of {len(files)} frames"
        sets[f"{path.name} ({count})"] = [read_points(f, point_dim=point_dim, columns=columns) for f in used]
    return sets


def page_locked_frame_sets(frame_sets: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """The same frames in page-locked host memory (as a lidar driver's DMA buffers or an input from
    cudaMallocHost would be), each set named with "(page-locked)"; needs CuPy."""
    def pinned(points: np.ndarray) -> np.ndarray:
        copy = empty_pinned(points.shape, points.dtype)
        copy[:] = points
        return copy

    return {f"{name} (page-locked)": [pinned(p) for p in frames] for name, frames in frame_sets.items()}
