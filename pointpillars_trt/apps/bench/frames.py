"""Frame sets for the benchmark: the demo's simulated scans, or folders of point files (.bin of KITTI's 4
values a point, or nuScenes' 5 for a model with a time column)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..demo_scene import simulate_scan
from ..frame_paths import expand_frame_paths, first_repeat
from ...errors import InputError, InputErrors, agree, counted, one_line, safe_repr
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


def list_frame_folders(folders: list[str]) -> list[list[str]]:
    """Each ``--frames`` folder's point files, as infer lists a folder (sorted, hidden ones left out:
    ``expand_frame_paths``); checked before the model loads: a file or nothing in a folder's place, a folder
    given twice or one without point files is one error line."""
    for folder in folders:
        if not os.path.isdir(folder):
            problem = "is a file; --frames names a folder of point files" if os.path.exists(folder) else "no such folder"
            raise InputError(f"--frames {safe_repr(folder)}: {problem}")
    refuse_repeated_folders(folders)
    return [expand_frame_paths([folder]) for folder in folders]


class FolderFrameSets(NamedTuple):
    """``folder_frame_sets``' sets by name, the report's line for each set that left files out (files that
    could not be read, each said in its own ``error:`` line), and the file each set's frames were read from."""

    sets: dict[str, list[np.ndarray]]
    left_out: list[str]
    sources: dict[str, list[str]]


def folder_frame_sets(folders: list[str], columns: int = 4, point_dim: int = 4, limit: int | None = None,
                      say: Callable[[str], object] = print,
                      listed: list[list[str]] | None = None) -> FolderFrameSets:
    """One set per folder, named after it (``set_names``) with the count of its frames timed, of its point files
    (``listed``: ``list_frame_folders`` of them, when the caller checked them already), a .bin of ``point_dim``
    values a point, of which the model reads ``columns``. At most the first ``limit`` of them are read (``say`` says
    so): a latency run times no more distinct frames than its iterations, and all of KITTI's 7,481 full scans would
    take ~14 GB. A file that cannot be read is one ``error:`` line (``say``) and its set is timed on the rest; a set
    of no file that can is one ``error:`` line and left out, and where that leaves no set, InputErrors of those
    lines ends the run."""
    sets: dict[str, list[np.ndarray]] = {}
    sources: dict[str, list[str]] = {}
    left_out: list[str] = []
    unread: list[str] = []  # a line for each set of no file that could be read
    for folder, files, name in zip(folders, listed or list_frame_folders(folders), set_names(folders)):
        used = files[:limit]
        first = agree(len(used), "first", f"first {len(used)}")  # --iterations 1: "the first of 3", not "1 of 3"
        read = f"its {len(used)}" if len(used) == len(files) else f"the {first} of its {len(files)}"
        if len(used) < len(files):
            say(f"note: --frames {safe_repr(folder)}: reading {read} point files, as many as --iterations {limit} times")
        frames, read_from, errors = _read_frames(used, columns, point_dim)
        if not frames:
            if len(used) > 1:
                which = f"none of {read} point files can be read, the first"
            elif len(files) == 1:
                which = "its one point file cannot be read"
            else:  # --iterations 1: the one file read of a folder of more
                which = f"the first of its {len(files)} point files, the one read, cannot be read"
            unread.append(f"--frames {safe_repr(folder)}: {which}: {errors[0]}")
            continue
        for error in errors:
            say(f"error: {error}")
        if len(used) == len(files):
            count = counted(len(frames), "frame")
        elif not errors:
            count = f"{first} of {len(files)} frames"
        else:
            count = f"{len(frames)} of the first {len(used)} of {len(files)} frames"
        sets[f"{name} ({count})"], sources[f"{name} ({count})"] = frames, read_from
        if errors:
            why = agree(len(errors), "it could not be read (named", "they could not be read (each named")
            left_out.append(f"--frames set {safe_repr(f'{name} ({count})')}: {len(errors)} of {read} point files left "
                            f"out: {why} in its error line)")
    if not sets:
        raise InputErrors(unread)
    for line in unread:
        say(f"error: {line}; its set is left out")
        left_out.append(f"{line}; its set is left out")
    return FolderFrameSets(sets, left_out, sources)


def _read_frames(files: list[str], columns: int, point_dim: int) -> tuple[list[np.ndarray], list[str], list[str]]:
    """The frames of ``files`` that can be read, the file of each, and the line of each file that cannot (its
    InputError's, which names it)."""
    frames: list[np.ndarray] = []
    read_from: list[str] = []
    errors: list[str] = []
    for file in files:
        try:
            frames.append(read_points(file, point_dim=point_dim, columns=columns))
            read_from.append(file)
        except InputError as exc:
            errors.append(one_line(exc))
    return frames, read_from, errors


def refuse_repeated_folders(folders: list[str]) -> None:
    """A folder given twice (``velodyne`` and ``./velodyne/``, or a symbolic link to it) would be timed twice as
    two sets: refused before anything is read."""
    repeated = first_repeat(folders, os.path.realpath)
    if repeated is not None:
        folder, also = repeated
        raise InputError(f"--frames {safe_repr(folder)} is given twice{also}: give each folder once")


def set_names(folders: list[str]) -> list[str]:
    """Each folder's name, with as many of its parent folders as tell it from the others given
    (``training/velodyne_reduced`` and ``testing/velodyne_reduced``): the report's rows are keyed by a set's
    name, and two folders of one name were one set, the first one's frames gone without a word. The
    folders are distinct (``refuse_repeated_folders``), so their absolute paths at the most tell them apart."""
    parts = [Path(os.path.abspath(folder)).parts for folder in folders]
    depth = [1] * len(folders)
    while True:
        names = [str(Path(*p[-d:])) for p, d in zip(parts, depth)]
        shared = {name for name in names if names.count(name) > 1}
        if not shared:
            return names
        depth = [d + 1 if name in shared else d for name, d in zip(names, depth)]


def page_locked_frame_sets(frame_sets: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    """The same frames in page-locked host memory (as a lidar driver's DMA buffers or an input from
    cudaMallocHost would be), each set named with "(page-locked)"; needs CuPy."""
    def pinned(points: np.ndarray) -> np.ndarray:
        copy = empty_pinned(points.shape, points.dtype)
        copy[:] = points
        return copy

    return {f"{name} (page-locked)": [pinned(p) for p in frames] for name, frames in frame_sets.items()}
