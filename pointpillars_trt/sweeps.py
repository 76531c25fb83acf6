"""Multi-sweep frames from separate sweeps: what nuScenes-style models read.

A multi-sweep model (``ModelConfig.point_columns`` ending in ``time``) takes the key sweep and
earlier sweeps moved into the key sweep's frame, each point carrying its time lag behind the key
sweep, as OpenPCDet's nuScenes loader builds them: the earlier sweeps lose their ego points
(|x| and |y| below a radius, in their own frame) before the move; the key sweep keeps all of its.
Arrays on the GPU (CuPy, or anything CuPy takes by DLPack) are accumulated on the GPU; host arrays that speak
DLPack too (a torch CPU tensor) on the host.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .config import finite_float, plain_number
from .errors import InputError, InputWarning, counted, safe_repr
from .kitti import rotation_problem
from .point_layout import (DISTINCT_SUMMARY_SIZE, TIME_LAG_RANGE, distinct_summary, distinct_summary_holds_lags,
                           gather_value_sample, gathered_value_sample, holds_time_lags, misread_row_length, row_layout,
                           sampled_row_length)
from .points import (as_array, columns_text, is_cuda_array, is_frame_path, refuse_masked, refuse_missing_values,
                     transposed_hint, wide_rows_problem)

EGO_RADIUS = 1.0  # metres: OpenPCDet's remove_ego_points centre radius for nuScenes sweeps
#: Metres a sweep's sensor may lie from the key sweep's: a car moves well under this in TIME_LAG_RANGE's 2 s,
#: so farther is the poses of another drive, or another unit.
MAX_SWEEP_DISTANCE = 1000.0
#: Seconds a timestamp's type must hold its value to: nuScenes sweeps are 50 ms apart.
LAG_RESOLUTION = 1e-3
#: Sweeps in a frame of OpenPCDet's nuScenes models (MAX_SWEEPS: the key sweep and 9 earlier), what they are trained on.
TRAINED_SWEEPS = 10
#: How a sweep's file becomes the points accumulate takes, for the message of a path given in their place.
READ_SWEEP = ("read each sweep's file first, e.g. read_points(path, point_dim=5, columns=4) for a nuScenes .pcd.bin "
              "(x, y, z, intensity of its 5 values a point)")


def accumulate_sweeps(sweeps: Iterable[Any], poses: Iterable[Any], timestamps: Iterable[float], *,
                      ego_radius: float | None = EGO_RADIUS) -> Any:
    """(N, 5) float32 x, y, z, intensity, time lag of the key sweep ``sweeps[0]`` and the earlier ones.

    ``sweeps[i]``: (Ni, 4 to ``MAX_POINT_DIM``) x, y, z, intensity in sweep i's sensor frame; ``poses[i]``: its (4, 4)
    sensor-to-world transform; ``timestamps[i]``: its time in seconds. Sweep i is moved by
    inv(poses[0]) @ poses[i] (in float64, then rounded to float32 once) and gets the time lag
    float32(timestamps[0] - timestamps[i]). ``ego_radius`` None keeps the ego points.

    Any iterables (lists, tuples, generators) but mappings, one item a sweep. Refused (InputError, naming the sweep or the
    argument): lags outside ``TIME_LAG_RANGE`` (timestamps in micro- or milliseconds, sweeps not key first),
    timestamps that are no numbers or repeat another (a sweep given twice), poses that are no rigid transforms (a scale, a shear, a reflection, a
    singular matrix) or put a sweep farther than ``MAX_SWEEP_DISTANCE`` from the key sweep, an ``ego_radius``
    that is no number of metres >= 0, and sweeps that are transposed (points as columns), images (rows wider than
    ``MAX_POINT_DIM``), read from their file with another row length, or accumulated already (5th values that are
    time lags). More than
    ``TRAINED_SWEEPS`` sweeps are warned of (``InputWarning``).
    """
    if is_frame_path(sweeps):
        raise InputError(f"accumulate: sweeps is a path, {safe_repr(sweeps)}; expected a list of sweeps' points, "
                         f"the key sweep first: {READ_SWEEP}")
    for name, given in (("sweeps", sweeps), ("poses", poses), ("timestamps", timestamps)):
        if isinstance(given, Mapping):  # a list of it would be its keys
            raise InputError(f"accumulate: {name} is a {type(given).__name__}; expected a list of one item a sweep, "
                             "the key sweep first (e.g. list(d.values()) in the sweeps' order)")
    try:
        sweeps, poses, timestamps = list(sweeps), list(poses), list(timestamps)
    except TypeError:
        raise InputError("accumulate: sweeps, poses and timestamps are iterables (lists) of one item a sweep") from None
    radius = plain_number(ego_radius)  # a NumPy number as the Python one it holds
    if radius is not None and not (isinstance(radius, (int, float)) and not isinstance(radius, bool)
                                   and np.isfinite(radius) and radius >= 0):
        raise InputError(f"accumulate: ego_radius {safe_repr(ego_radius)}: expected metres >= 0, or None")
    if not (len(sweeps) == len(poses) == len(timestamps)) or not sweeps:
        raise InputError(f"accumulate: {counted(len(sweeps), 'sweep')}, {counted(len(poses), 'pose')} and "
                         f"{counted(len(timestamps), 'timestamp')}; "
                         "expected one pose and one timestamp per sweep, at least one sweep")
    if len(sweeps) > TRAINED_SWEEPS:
        warnings.warn(f"accumulate: {len(sweeps)} sweeps, but nuScenes models are trained on frames of {TRAINED_SWEEPS} "
                      f"(OpenPCDet's MAX_SWEEPS: the key sweep and the {TRAINED_SWEEPS - 1} before it); more give time "
                      f"lags and point densities the model never saw: pass the first {TRAINED_SWEEPS}",
                      InputWarning, stacklevel=2)
    xp = _array_module(sweeps[0])
    key = _pose(poses[0], 0)
    times = _distinct_seconds(timestamps)
    to_key = np.linalg.inv(key)
    parts = []
    for i, (sweep, pose) in enumerate(zip(sweeps, poses)):
        pts = _sweep_points(sweep, i, xp)
        lag = times[0] - times[i]
        low, high = TIME_LAG_RANGE
        if not low <= lag <= high:
            raise InputError(f"accumulate: sweep {i} is {lag:.6g} s behind the key sweep, outside {low:g}..{high:g} s: "
                             "timestamps in micro- or milliseconds? (give seconds); the key sweep first, then the "
                             "earlier ones")
        if i and ego_radius is not None:
            far = (xp.abs(pts[:, 0]) >= ego_radius) | (xp.abs(pts[:, 1]) >= ego_radius)
            pts = pts[far]
        relative = to_key @ _pose(pose, i)
        with np.errstate(over="ignore"):  # a translation of 1e300 m: infinitely far, refused below
            distance = float(np.linalg.norm(relative[:3, 3]))
        if distance > MAX_SWEEP_DISTANCE:
            raise InputError(f"accumulate: pose {i} puts its sweep {distance:.4g} m from the key sweep, farther than "
                             f"a car moves in {high:g} s: the poses of another drive, or another unit?")
        move = xp.asarray(relative)
        out = xp.empty((pts.shape[0], 5), xp.float32)
        # a sweep's NaN and infinite points (no return) stay non-finite, as the detector counts them, without NumPy's
        # warnings (inf times a rotation's 0; a coordinate near float32's limit turned past it)
        with np.errstate(invalid="ignore", over="ignore"):
            out[:, :3] = pts[:, :3].astype(xp.float64) @ move[:3, :3].T + move[:3, 3]
        out[:, 3] = pts[:, 3]
        out[:, 4] = np.float32(lag)
        parts.append(out)
    return xp.concatenate(parts)


def _sweep_points(sweep: Any, i: int, xp: Any) -> Any:
    """Sweep ``i`` as an (N, 4 to MAX_POINT_DIM) float array of ``xp`` (NumPy or CuPy), else InputError naming what
    it is."""
    if is_frame_path(sweep):
        raise InputError(f"accumulate: sweep {i} is a path, {safe_repr(sweep)}; expected its points: {READ_SWEEP}")
    refuse_masked(sweep, f"accumulate: sweep {i}")
    pts = as_array(sweep, f"accumulate: sweep {i}", f"an (N, 4) array of {columns_text(4)}", xp)  # as a frame's
    hint = transposed_hint(tuple(pts.shape))  # (4, N), as OpenPCDet's get_sweep holds a sweep: N points of 4 values
    if pts.ndim == 1:
        hint = "; a flat array, as np.fromfile reads a .bin: reshape it, (-1, 5) for nuScenes .pcd.bin files"
    wide = wide_rows_problem(pts.shape[1], 4) if pts.ndim == 2 and not hint else None
    if wide is not None:  # a range image (beams x azimuths): its first values of each row would read as points
        hint = f"; {wide}"
    if xp is np and not hint:
        refuse_missing_values(pts, sweep, f"accumulate: sweep {i}", 4)
    if pts.dtype == object and not hint:  # a table of pandas' nullable Float32 columns, without missing values
        hint = "; sweep.astype(np.float32) if its values are metres"
    if hint or pts.ndim != 2 or pts.shape[1] < 4 or pts.dtype.kind != "f" or pts.dtype.itemsize < 4:
        raise InputError(f"accumulate: sweep {i} has shape {tuple(pts.shape)}, dtype {pts.dtype}; expected "
                         "(N, 4) or more float32 (or float64) columns of x, y, z, intensity (float16 has "
                         f"already lost the coordinates' precision, as the detector says of it){hint}")
    _check_sweep_columns(pts, i, xp)
    return pts


def _check_sweep_columns(pts: Any, i: int, xp: Any) -> None:
    """Refuse a sweep whose columns are not what they seem: rows of a file read with another length (a nuScenes
    .pcd.bin of 5 values a point reshaped to 4, every point's values shifted), or 5th values that are a multi-sweep
    frame's time lags (accumulated already: they would all become this sweep's lag). A sweep on the GPU is judged
    as a host one is, from what the checks look at of it (``_gathered_findings``)."""
    rows = pts.dtype == np.float32 and pts.flags.c_contiguous  # rows as a file is read into them
    lagged = pts.shape[1] >= 5
    if xp is np:
        row = misread_row_length(pts.reshape(-1), pts.shape[1]) if rows else None
        accumulated = lagged and holds_time_lags(pts[:, 4])
    else:
        row, accumulated = _gathered_findings(pts, rows, lagged, xp)
    if row is not None:
        raise InputError(f"accumulate: sweep {i} looks like {row} float32 values a point ({row_layout(row)}) "
                         f"read as {pts.shape[1]}: read its file with np.fromfile(path, np.float32)"
                         f".reshape(-1, {row})")
    if accumulated:
        raise InputError(f"accumulate: sweep {i}'s 5th values look like a multi-sweep frame's time lags (a frame "
                         "accumulated already?), which would all become this sweep's: give accumulate single "
                         "sweeps, or the frame to the detector as it is")


def _gathered_findings(pts: Any, rows: bool, lagged: bool, xp: Any) -> tuple[int | None, bool]:
    """``_check_sweep_columns``' findings of a sweep, an array of ``xp`` (CuPy on the GPU; NumPy gives the same
    findings): the row length its values look like (``misread_row_length``, when ``rows``: they are C-contiguous
    float32) and whether its 5th values look like time lags (``holds_time_lags``, when ``lagged``), each judged on
    the host from what it looks at, gathered by ``xp`` (``gather_value_sample``, ``distinct_summary``) and read
    back in one copy of at most ~400 KB, whatever the sweep's size, which waits for the work queued before it on
    the current stream of the sweep's device. A host sweep is judged whole, without the copies."""
    flat, point_dim = pts.reshape(-1), pts.shape[1]
    with contextlib.nullcontext() if xp is np else pts.device:
        looked_at = ([gather_value_sample(flat, point_dim, xp)] if rows else []) + \
            ([distinct_summary(pts[:, 4], xp)] if lagged else [])
        if not looked_at:
            return None, False
        read = xp.concatenate(looked_at)
        read = read if xp is np else read.get()  # the one read
    values = read.size - DISTINCT_SUMMARY_SIZE if lagged else read.size
    row = sampled_row_length(gathered_value_sample(read[:values], flat.size, point_dim), point_dim) if rows else None
    return row, lagged and distinct_summary_holds_lags(read[values:])


def _pose(pose: Any, i: int) -> np.ndarray:
    """A (4, 4) rigid transform on the host (poses are small; ``cupy.asnumpy`` them if on the GPU)."""
    try:
        m = np.asarray(pose.get() if hasattr(pose, "get") and not isinstance(pose, np.ndarray) else pose,
                       np.float64)
    except (TypeError, ValueError):
        raise InputError(f"accumulate: pose {i} is not a (4, 4) array of numbers") from None
    if m.shape != (4, 4) or not np.isfinite(m).all() or not np.allclose(m[3], (0, 0, 0, 1)):
        raise InputError(f"accumulate: pose {i} is not a finite (4, 4) transform with last row 0, 0, 0, 1")
    problem = rotation_problem(m[:3, :3])
    if problem is not None:
        raise InputError(f"accumulate: pose {i} is not a rigid transform: its 3x3 part is not a rotation ({problem})")
    return m


def _distinct_seconds(timestamps: list[Any]) -> list[float]:
    """The timestamps as float seconds (``_seconds``), refusing one that repeats an earlier one: two sweeps of one
    lidar are never taken at the same time, so it is a sweep given twice or a timestamp not filled in, and its
    points would be read as the other sweep's, at its lag."""
    times: list[float] = []
    first: dict[float, int] = {}  # a time -> the first sweep of it
    for i, stamp in enumerate(timestamps):
        seconds = _seconds(stamp, i)
        if seconds in first:
            raise InputError(f"accumulate: timestamps {first[seconds]} and {i} are both {seconds:.10g} s: a sweep given "
                             "twice, or a timestamp not filled in? Each sweep's own time (nuScenes sweeps are 50 ms "
                             "apart)")
        first[seconds] = i
        times.append(seconds)
    return times


def _seconds(stamp: object, i: int) -> float:
    """A timestamp as float seconds, else InputError naming it; one held in a float type too coarse for the lags
    (float32 seconds since 1970 step by 128 s: sweeps 50 ms apart would all get a lag of 0 or 128 s) is refused."""
    seconds = finite_float(stamp)
    if seconds is None:
        raise InputError(f"accumulate: timestamp {i} is {safe_repr(stamp)}, not a finite number of seconds")
    dtype = getattr(stamp, "dtype", None)  # a NumPy or CuPy scalar's
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        step = float(np.spacing(np.abs(np.asarray(seconds, dtype))))
        if step > LAG_RESOLUTION:
            raise InputError(f"accumulate: timestamp {i} is {dtype} {seconds:.10g}, and {dtype} values of that size "
                             f"are {step:g} s apart, too coarse for time lags of milliseconds: give float64 (or "
                             "Python float) timestamps")
    return seconds


def _array_module(arr: Any) -> Any:
    """NumPy, or CuPy for arrays on the GPU (as the detector tells them: a torch CPU tensor is host data)."""
    if not is_cuda_array(arr):
        return np
    import cupy as cp

    return cp
