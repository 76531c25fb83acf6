"""Whether the float32 values of a point file are really rows of x, y, z, intensity (and a time lag) as read.

A file read with the wrong layout gives points without an error: text read as float32, float64 values
split in two, random bytes, rows of 3, 5, 6 or 8 values read as 4. These checks look at a few thousand values
(from the start and the middle of a frame) and refuse such a read with what fits instead; a frame read
right costs a few integer operations on its values' bits and a look at a few hundred of its values
(~50 us); one of rows wider than 5 values, a comparison of its steps at every row length up to 16 (~0.1-0.5 ms).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any, Union

import numpy as np

from .errors import InputError, InputWarning, safe_repr
from .points import MULTI_SWEEP_FIX, columns_text

PathLike = Union[str, "os.PathLike[str]"]
#: Told, in one line naming the frame (``check_time_lags``' warning), of a multi-sweep frame whose 5th values look
#: like per-point capture times (``holds_capture_times``); None: said as an :class:`InputWarning`. A reader that
#: reports it in words of its own (infer) takes the read's finding rather than looking at the frame again.
CaptureTimesNote = Callable[[str], None]


_TEXT_CHARS = bytes([9, 10, 13, *range(32, 127)])  # printable ASCII, tab, newline, carriage return
TEXT_SNIFF = 4096  # bytes looked at: no float32 frame's first 4 KB are all printable ASCII


#: Files of another format by their first bytes, what each is, and what to do with it. Each magic read as a
#: float32 .bin's first x is a value no lidar gives (2e8 m, 1.5e-36, 1e10, 9e11, 1e-32), so a frame of
#: points is never taken for one.
_OTHER_FORMATS = (
    (b"\x93NUMPY", "a NumPy .npy file", "name it .npy (read as a .bin, its header would be points)"),
    (b"PK\x03\x04", "a zip archive (an .npz?)", "save the frame's points as float32 .bin or .npy"),
    (b"# .PCD", "a PCD file", "name it .pcd"),
    (b"VERSION", "a PCD file", "name it .pcd"),
    (b"ply\n", "a PLY file", "convert it to float32 .bin or .npy"),
    (b"ply\r\n", "a PLY file", "convert it to float32 .bin or .npy"),  # as Windows tools end its lines
)


def refuse_other_formats(path: PathLike, head: bytes | np.ndarray, what: str) -> None:
    """InputError when a ``.bin``'s first bytes (``head``: bytes, or its float32 values) are not raw float32
    values: a file of another format by its magic bytes (a .npy named .bin would run with its header read as
    points of absurd values), or text (a point list written as numbers), which read as float32 is refused for
    its size with the wrong advice, or read as points a few nanometres from the origin. The first 64 bytes
    settle it for nearly every frame."""
    first = _first_bytes(head, 8)
    for magic, kind, fix in _OTHER_FORMATS:
        if first.startswith(magic):
            raise InputError(f"{what} {safe_repr(path)} is {kind}, not raw float32 values: {fix}")
    if _is_text(_first_bytes(head, 64)) and _is_text(_first_bytes(head, TEXT_SNIFF)):
        raise InputError(f"{what} {safe_repr(path)} is text, not float32 values: a point list written as "
                         "numbers? load it with numpy.loadtxt and save the array as float32 .bin or .npy")


def _first_bytes(head: bytes | np.ndarray, count: int) -> bytes:
    """The first ``count`` bytes of ``head`` (bytes, or values whose bytes are looked at)."""
    return head[: count // head.itemsize].tobytes() if isinstance(head, np.ndarray) else bytes(head[:count])


def _is_text(data: bytes) -> bool:
    """Whether ``data`` is not empty and all printable ASCII: ``bytes.translate`` deleting the text bytes
    takes a fraction of a NumPy call's time."""
    return bool(data) and not data.translate(None, _TEXT_CHARS)


#: What a .bin of each row length is, for the messages of a file read with another one.
ROW_LAYOUTS = {3: "x, y, z without intensity", 4: "x, y, z, intensity, as KITTI writes them",
            5: "x, y, z, intensity, ring/time, as nuScenes writes them"}
#: The longest row a misread file is looked at for (wider ones are exports no lidar tool writes as raw .bin).
WIDEST_ROW_GUESS = 16


def row_layout(values: int) -> str:
    """What a .bin of ``values`` float32 values a point holds, for a message."""
    return ROW_LAYOUTS.get(values, f"x, y, z, intensity and {values - 4} more values")


#: A multi-sweep frame's time lags (s behind the key sweep): nuScenes' 10 sweeps span ~0.45 s; beyond these
#: bounds the 5th column holds something else (ring numbers, timestamps, lags of the wrong sign).
TIME_LAG_RANGE = (-0.01, 2.0)
_STRIDED_LAGS = 1 << 14  # more time lags than this are copied side by side before their minimum and maximum


def check_time_lags(values: np.ndarray, point_dim: int, name: str,
                    capture_times_note: CaptureTimesNote | None = None) -> None:
    """Refuse a multi-sweep model's frame (``name``: how the message names it) whose 5th values are no time
    lags: the PFN would take ring numbers or timestamps for lags without a word. Every point's is looked at
    (a minimum and a maximum of the column, ~0.4 ms for 300k points), since accumulated sweeps are
    concatenated and any part of a frame may be the one of another layout. 5th values within the lags' range
    that are per-point capture times (``holds_capture_times``) are told to ``capture_times_note``, else warned
    of (``InputWarning``, its text the same for a file or an array each time, so that Python's filter says it
    once). A frame on the GPU is judged alike (``judge_lag_summary``) from the same values worked out there
    (``device_points.check_device_time_lags``)."""
    rows = values[: values.size // point_dim * point_dim].reshape(-1, point_dim)
    lags = rows[:, 4]  # a strided view
    if lags.size > _STRIDED_LAGS:  # one strided pass, then two vectorised ones: ~2x faster than two strided
        lags = lags.copy()
    lo, hi = lags.min(initial=np.inf), lags.max(initial=-np.inf)
    if np.isnan(lo) or np.isnan(hi):  # rows of NaN (no return) are skipped
        lags = lags[np.isfinite(lags)]
        lo, hi = lags.min(initial=np.inf), lags.max(initial=-np.inf)
    _judge_time_lags(float(lo), float(hi), lags, lambda: rows[:, 3], name, capture_times_note)


def check_named_time_lags(points: np.ndarray, path: PathLike, what: str,
                          capture_times_note: CaptureTimesNote | None) -> None:
    """A multi-sweep model's frame from a file of named columns (.npy, .pcd) with its 5th values checked as time
    lags, as a .bin's are with its layout (``check_layout``)."""
    if points.shape[1] == 5:
        check_time_lags(points.reshape(-1), 5, f"{what} {safe_repr(path)}", capture_times_note)


def _judge_time_lags(lo: float, hi: float, lags: np.ndarray, fourth: Callable[[], np.ndarray], name: str,
                     capture_times_note: CaptureTimesNote | None) -> None:
    """``check_time_lags``' judgement from what it needs: ``lo`` and ``hi``, the minimum and maximum of the lags
    kept (all the 5th values; where one is NaN, the finite ones; lo > hi: none to judge), ``lags`` those lags or
    their ``lag_sample`` (all that ``holds_capture_times`` looks at), and ``fourth``, which gives the 4th column
    for the message of swapped columns: called only for a frame refused (one on the GPU copies it back then).
    The warning names the caller of ``check_time_lags`` or ``judge_lag_summary``."""
    low, high = TIME_LAG_RANGE
    if lo <= hi and not (low <= lo and hi <= high):  # lo > hi: no finite lag to judge
        if holds_time_lags(fourth()):
            raise InputError(
                f"{name}: its 4th values look like the time lags this model reads 5th, and its 5th (from {lo:.6g} "
                f"to {hi:.6g}) like intensities: the columns are x, y, z, time, intensity; the model reads x, y, z, "
                "intensity, time lag: swap the last two (points[:, [0, 1, 2, 4, 3]])"
            )
        raise InputError(
            f"{name}: its 5th values run from {lo:.6g} to {hi:.6g}, but this "
            f"model reads each point's time lag behind the key sweep there, in seconds ({low:g} to {high:g}; "
            "0 to ~0.5 for 10 nuScenes sweeps), not ring numbers or timestamps: build multi-sweep frames with "
            "PointPillars.accumulate, from single sweeps read as x, y, z, intensity (a nuScenes .pcd.bin sweep: "
            "read_points(path, point_dim=5, columns=4))"
        )
    if holds_capture_times(lags):
        text = (f"{name}: {CAPTURE_TIMES_FINDING} build multi-sweep frames with PointPillars.accumulate "
                "(sweeps.accumulate_sweeps), which gives each sweep's points its lag")
        if capture_times_note is None:
            warnings.warn(text, InputWarning, stacklevel=3)
        else:
            capture_times_note(text)


#: The most distinct values a column of time lags holds: one a sweep (nuScenes accumulates 10).
_MOST_SWEEPS = 32
#: Points, spread over a frame, whose 5th values ``holds_capture_times`` counts: it runs on every multi-sweep frame.
LAG_SAMPLE = 512
#: What ``holds_capture_times`` finds, as the warnings of the Python API and of the CLI say it.
CAPTURE_TIMES_FINDING = (f"its 5th values take more distinct values than a frame has sweeps (over {_MOST_SWEEPS} "
                         "among points spread over it), but this model reads there each sweep's time lag behind "
                         "the key sweep, one value for all of a sweep's points: per-point capture times within a "
                         "sweep (a lidar driver's time field)?")


def holds_capture_times(lags: np.ndarray) -> bool:
    """Whether a multi-sweep frame's 5th values (``lags``) take more than ``_MOST_SWEEPS`` distinct values among
    ``LAG_SAMPLE`` points spread over it: per-point capture times within a sweep (0 to 0.1 s, thousands of
    values), where accumulated sweeps give one lag a sweep. ~15 us: a sort of the sample, whose distinct values
    are where it steps."""
    ordered = np.sort(lag_sample(lags))
    finite = ordered[np.isfinite(ordered)]  # rows of NaN (no return) are skipped
    return bool(np.count_nonzero(finite[1:] != finite[:-1]) >= _MOST_SWEEPS)  # more than _MOST_SWEEPS values


def lag_sample(lags: np.ndarray) -> np.ndarray:
    """The at most ``LAG_SAMPLE`` of ``lags``, spread over the frame, that ``holds_capture_times`` counts: every
    ``lag_sample_step``-th (all of a sample, which is never longer)."""
    return lags[:: lag_sample_step(lags.size)]


def lag_sample_step(count: Any, xp: Any = np) -> Any:
    """Every how many of ``count`` lags ``lag_sample`` takes one (``count``: a 0-d array of ``xp`` on the GPU,
    where nothing waits for its value)."""
    return xp.maximum(1, -(-count // LAG_SAMPLE))


#: Values of a ``lag_summary``: the minimum and maximum of the lags kept, then their ``lag_sample``.
LAG_SUMMARY_SIZE = 2 + LAG_SAMPLE


def lag_summary(lags: Any, xp: Any) -> Any:
    """What ``check_time_lags`` judges a frame's 5th values (``lags``, a 1-D array of ``xp``: CuPy for a frame on
    the GPU, or NumPy) by, worked out with ``xp``'s own array functions and no value read back, so that a frame
    on the GPU is judged from one read of ~2 KB (``judge_lag_summary``): ``LAG_SUMMARY_SIZE`` float32 values,
    the minimum and maximum of the lags kept, then their ``lag_sample`` padded with NaN. The lags kept are
    ``check_time_lags``' (every one; where one is NaN, the finite ones), the sample taken from them in place by
    their ranks (a cumulative sum), since picking them out first would read their count back."""
    summary = xp.full(LAG_SUMMARY_SIZE + 1, np.nan, np.float32)  # a last slot for the lags left out of the sample
    if lags.size == 0:  # no lag to judge, as the host check finds
        summary[0], summary[1] = np.inf, -np.inf
        return summary[:-1]
    kept = xp.isfinite(lags) | ~xp.isnan(lags).any()
    summary[0] = xp.where(kept, lags, np.float32(np.inf)).min()
    summary[1] = xp.where(kept, lags, np.float32(-np.inf)).max()
    rank = xp.cumsum(kept, dtype=np.int32) - 1  # of each lag kept among them (MAX_FRAME_POINTS fits)
    step = lag_sample_step(rank[-1] + 1, xp)
    summary[2 + xp.where(kept & (rank % step == 0), rank // step, LAG_SAMPLE)] = lags
    return summary[:-1]


def judge_lag_summary(summary: np.ndarray, fourth: Callable[[], np.ndarray], name: str) -> None:
    """``check_time_lags`` of a frame from its ``lag_summary``, read back to the host: the same judgement, messages
    and warning (``fourth``: gives the frame's 4th column, called only for a frame refused)."""
    sample = summary[2:]
    _judge_time_lags(float(summary[0]), float(summary[1]), sample[~np.isnan(sample)], fourth, name, None)


def holds_time_lags(column: np.ndarray) -> bool:
    """Whether a column holds a multi-sweep frame's time lags (the 4th of a frame whose last two columns are
    swapped; the 5th of a sweep that was accumulated already): within TIME_LAG_RANGE, more than one of them,
    few distinct ones (a sweep's points share its lag; an intensity scaled to 0-1 takes hundreds of values,
    a single sweep's own time column one), not all whole numbers (a return number of 1 or 2). A column out of
    that range is told by its extremes alone; one within it is judged from its ``distinct_summary``
    (``distinct_summary_holds_lags``), as a column on the GPU is, which sorts it."""
    finite = column[np.isfinite(column)]
    if finite.size == 0 or finite.min() < TIME_LAG_RANGE[0] or finite.max() > TIME_LAG_RANGE[1]:
        return False
    return distinct_summary_holds_lags(distinct_summary(finite, np))


#: Values of a ``distinct_summary``: the least and the greatest finite value, how many distinct finite values there
#: are (counted up to one more than ``_MOST_SWEEPS``), then as many of them as that, in order.
DISTINCT_SUMMARY_SIZE = 3 + _MOST_SWEEPS + 1


def distinct_summary(column: Any, xp: Any) -> Any:
    """What ``holds_time_lags`` judges a float ``column`` (a 1-D array of ``xp``: CuPy for a column on the GPU,
    or NumPy) by, in its dtype, worked out with ``xp``'s own array functions and no value read back, so that a
    column on the GPU is judged from one read of ``DISTINCT_SUMMARY_SIZE`` values: its least and greatest finite
    values, the count of its distinct finite ones and the first of those, picked from the sorted column in place
    by their ranks (a cumulative sum), as ``lag_summary`` picks its sample."""
    slots = _MOST_SWEEPS + 1
    summary = xp.full(DISTINCT_SUMMARY_SIZE + 1, np.nan, column.dtype)  # a last slot for the values not kept
    if column.size == 0:
        summary[2] = 0
        return summary[:-1]
    ordered = xp.sort(xp.where(xp.isfinite(column), column, np.inf))  # the finite values first, whatever the sort
    finite = xp.isfinite(ordered)
    distinct = finite.copy()
    distinct[1:] &= ordered[1:] != ordered[:-1]  # the first of each run of equal values
    rank = xp.cumsum(distinct, dtype=np.int32) - 1  # of each distinct value among them (MAX_FRAME_POINTS fits)
    summary[0] = ordered[0]
    summary[1] = xp.where(finite, ordered, -np.inf).max()
    summary[2] = xp.minimum(rank[-1] + 1, slots)
    summary[3 + xp.where(distinct & (rank < slots), rank, slots)] = ordered
    return summary[:-1]


def distinct_summary_holds_lags(summary: np.ndarray) -> bool:
    """``holds_time_lags`` of a column from its ``distinct_summary``, read back to the host."""
    count = int(summary[2])
    lo, hi = summary[0], summary[1]
    if not count or lo < TIME_LAG_RANGE[0] or hi > TIME_LAG_RANGE[1] or lo == hi:
        return False
    distinct = summary[3 : 3 + count]
    return count <= _MOST_SWEEPS and not np.array_equal(distinct, np.round(distinct))


def check_layout(values: np.ndarray, point_dim: int, path: PathLike, what: str, columns: int = 4,
                 capture_times_note: CaptureTimesNote | None = None) -> None:
    """Refuse a file whose values read as ``point_dim`` float32 a point are text, float64 values, bytes
    that are no float32 numbers at all, or rows of another length (3 to WIDEST_ROW_GUESS); ``columns``: the
    values a point the model reads (5 for a multi-sweep model), for the advice. The quick looks
    (``_looks_odd``, ``misread_row_length``'s at the intensities) are integer operations on the values' bits,
    which raise no floating-point warning whatever the bytes: NumPy's warnings are turned off only where odd
    values are computed on. A multi-sweep model's 5th values are checked as time lags (``check_time_lags``,
    which tells ``capture_times_note`` of per-point capture times)."""
    refuse_other_formats(path, values[: TEXT_SNIFF // 4], what)
    if _looks_odd(values, point_dim):
        _refuse_float64_or_noise(values, point_dim, path, what)
    row = misread_row_length(values, point_dim)
    if row is not None and values.size % row:
        raise InputError(
            f"{what} {safe_repr(path)} looks like {row} float32 values a point ({row_layout(row)}) read as "
            f"{point_dim}, but it holds no whole rows of {row}: a file of {row} values a point cut short (a copy "
            "that failed? copy it again)"
        )
    if row == 3:
        raise InputError(
            f"{what} {safe_repr(path)} looks like 3 float32 values a point ({ROW_LAYOUTS[3]}) read as {point_dim}: "
            f"its 4th column holds negative and coordinate-like values, not intensities; the model reads x, y, "
            "z, intensity: write each point's intensity too"
        )
    if row is not None and row < columns:  # single sweeps given to a multi-sweep model
        raise InputError(
            f"{what} {safe_repr(path)} looks like {row} float32 values a point ({row_layout(row)}) read as "
            f"{point_dim}; this model reads {columns} a point ({columns_text(columns)}): {MULTI_SWEEP_FIX}"
        )
    if row is not None:
        raise InputError(
            f"{what} {safe_repr(path)} looks like {row} float32 values a point ({row_layout(row)}) read as "
            f"{point_dim}; pass --point-dim {row} (Python: point_dim={row})"
        )
    if columns == 5:  # a layout read right: are its 5th values time lags?
        with np.errstate(all="ignore"):  # NaN and huge values are what the check looks past
            check_time_lags(values, point_dim, f"{what} {safe_repr(path)}", capture_times_note)


def _refuse_float64_or_noise(values: np.ndarray, point_dim: int, path: PathLike, what: str) -> None:
    """Refuse a frame the quick look found odd (``_looks_odd``) when it is float64 rows or bytes that are no
    float32 numbers at all."""
    with np.errstate(all="ignore"):  # NaN and huge values are what these checks look for
        # float64 rows of the other length too: 5 values a point read as 4 would pass for no float64 rows of 4
        if any(looks_float64(values, n) for n in dict.fromkeys((point_dim, *_FLOAT64_ROW_LENGTHS))):
            raise InputError(
                f"{what} {safe_repr(path)} looks like float64 values (8 bytes each), not float32: read as "
                f"float32 each value splits in two; save frames as float32 "
                f"(points.astype(np.float32).tofile(path)) or as .npy"
            )
        refuse_noise(values, point_dim, path, what)


def refuse_noise(values: np.ndarray, point_dim: int, path: PathLike, what: str) -> None:
    """Refuse flat float32 ``values`` that are no point coordinates at all (:func:`looks_like_noise`)."""
    with np.errstate(all="ignore"):
        if looks_like_noise(values, point_dim):
            if not looks_like_noise(values.view(">f4"), point_dim):
                raise InputError(
                    f"{what} {safe_repr(path)} looks like big-endian float32 values (read as little-endian, they "
                    "are no coordinates): convert it, np.fromfile(path, '>f4').astype('<f4').tofile(path)"
                )
            raise InputError(
                f"{what} {safe_repr(path)} does not hold float32 point coordinates: over "
                f"{_NOISE_SHARE:.0%} of its values are beyond {_NOISE_HIGH:g} or nonzero below {_NOISE_LOW:g} "
                "in magnitude, as random bytes or another type's bytes read as float32 are; is it a point file?"
            )


_LAYOUT_SAMPLE = 1 << 15  # float32 values looked at from the start and from the middle of a file
_ROWS_ALIGN = 60  # whole rows of 3, 4 and 5 values


def _samples(values: np.ndarray, align: int, count: int = _LAYOUT_SAMPLE) -> list[np.ndarray]:
    """At most ``count`` values from the start and from the middle (at a multiple of ``align``)."""
    middle = (values.size // 2) // align * align
    return [values[:count], values[middle:middle + count]]


class ValueSample:
    """What ``misread_row_length`` looks at of ``size`` flat float32 values: the two samples of them it takes
    (``_samples``, from the start and from the middle) and rows of a length spread over all of them
    (``_spread_rows``). Of a host array, it is the array itself (``whole``); of one on the GPU, what
    ``gather_value_sample`` took of it there, read back in one copy (``gathered_value_sample``): both are judged by
    the same code. ``head``: the first values; ``middle``: the values from ``middle_start`` on; ``spread``: a row
    length's spread rows (None: too few rows to spread)."""

    def __init__(self, size: int, head: np.ndarray, middle: np.ndarray, middle_start: int,
                 spread: Callable[[int], np.ndarray | None]) -> None:
        self.size, self.head, self.middle, self.middle_start, self.spread = size, head, middle, middle_start, spread

    @classmethod
    def whole(cls, values: np.ndarray) -> ValueSample:
        """All of host ``values`` (nothing copied)."""
        return cls(values.size, values, values, 0, lambda row: _spread_rows(values, row))

    def samples(self, align: int, count: int = _LAYOUT_SAMPLE) -> list[np.ndarray]:
        """``_samples`` of the values: at most ``count`` from the start and from the middle (at a multiple of
        ``align``)."""
        middle = (self.size // 2) // align * align - self.middle_start
        return [self.head[:count], self.middle[middle:middle + count]]


def _spread_step(size: int, row: int) -> int | None:
    """Every how many of the rows of ``row`` values in ``size`` values ``_spread_rows`` takes one; None for too
    few rows to tell anything."""
    count = size // row
    return None if count < _SPREAD_ROWS else count // _SPREAD_ROWS


def _spread_rows(values: np.ndarray, row: int) -> np.ndarray | None:
    """About ``_SPREAD_ROWS`` rows of ``row`` values spread over all of flat ``values`` (None: too few rows)."""
    step = _spread_step(values.size, row)
    return None if step is None else values[: values.size // row * row].reshape(-1, row)[::step]


def _gather_layout(size: int, point_dim: int) -> tuple[int, int, int, dict[int, int | None]] | None:
    """What ``gather_value_sample`` takes of ``size`` values read as ``point_dim`` a point: the end of the first
    values, the start and end of the middle ones (room for ``_samples``' every alignment: ``_ROWS_ALIGN``,
    ``point_dim`` and narrower rows), and the spread rows' step (``_spread_step``) of each row length whose rows
    ``misread_row_length`` may spread (``_extras_differ``: multiples of a point of 4 or 5 up to
    ``WIDEST_ROW_GUESS``; ``_extras_are_points``: a wider point). None where that is about all the values."""
    head = min(size, _LAYOUT_SAMPLE)
    start, end = max(0, size // 2 - max(_ROWS_ALIGN, point_dim) + 1), min(size, size // 2 + _LAYOUT_SAMPLE)
    rows = (point_dim,) if point_dim > 5 else range(2 * point_dim, WIDEST_ROW_GUESS + 1, point_dim)
    spread = {row: _spread_step(size, row) for row in rows}
    taken = head + end - start + sum(len(range(0, size // row, step)) * row for row, step in spread.items() if step)
    return None if taken >= size else (head, start, end, spread)


def gather_value_sample(values: Any, point_dim: int, xp: Any) -> Any:
    """What ``misread_row_length`` looks at of flat float32 ``values`` read as ``point_dim`` a point (a C-contiguous
    array of ``xp``: CuPy for values on the GPU), gathered by ``xp``'s own slicing into one flat array, so that values
    on the GPU are judged from one read of at most ~400 KB, whatever their size (``gathered_value_sample``): the
    values themselves where that is about all of them."""
    layout = _gather_layout(values.size, point_dim)
    if layout is None:
        return values
    head, start, end, spread = layout
    parts = [values[:head], values[start:end]]
    for row, step in spread.items():
        if step:
            parts.append(values[: values.size // row * row].reshape(-1, row)[::step].ravel())
    return xp.concatenate(parts)


def gathered_value_sample(gathered: np.ndarray, size: int, point_dim: int) -> ValueSample:
    """The ``ValueSample`` of ``size`` values read as ``point_dim`` a point from what ``gather_value_sample`` took of
    them, read back to the host."""
    layout = _gather_layout(size, point_dim)
    if layout is None:
        return ValueSample.whole(gathered)
    head, start, end, spread = layout
    at = head + end - start
    rows: dict[int, np.ndarray | None] = {}
    for row, step in spread.items():
        count = len(range(0, size // row, step)) if step else 0
        rows[row] = gathered[at : at + count * row].reshape(count, row) if step else None
        at += count * row
    return ValueSample(size, gathered[:head], gathered[head : head + end - start], start, rows.__getitem__)


#: The bits of float32 +inf: a float32 of bits up to these is neither negative (nor -0.0) nor NaN.
_FLOAT32_INF_BITS = 0x7F800000


def nonnegative_max_bits(column: np.ndarray) -> int | None:
    """The bits of the largest value of a float32 ``column`` (a strided view, say) when none has its sign
    bit set and none is NaN, else None (also for other dtypes): such values order as their bits, and an
    integer maximum over a strided column takes half the time of a float one, which tests every value for
    NaN."""
    if column.dtype != np.float32:
        return None
    top = int(column.view(np.uint32).max(initial=0))
    return top if top <= _FLOAT32_INF_BITS else None


_QUICK_WORDS = 240  # whole rows of 3, 4, 5, 8 and 10 values: the first values every frame is looked at in


def _looks_odd(values: np.ndarray, point_dim: int) -> bool:
    """The quick look every frame gets (a few microseconds): whether its first values (or, where those are
    all 0, as many from the middle: an organised cloud's first points may be no return) hold fragments of
    numbers (nonzero below 1e-12 or above 1e6 in magnitude), non-finite values, negative intensities or
    mostly zero words before nonzero ones, which a real frame read right mostly has not. Only then do
    the float64 and noise checks look at the file (they skip non-finite values: organised clouds mark
    no-return points so). Magnitudes are judged by their bits, so no float operation meets a NaN here."""
    words = values[:_QUICK_WORDS]
    magnitude = _magnitude_bits(words)
    top = magnitude.max(initial=0)
    if top == 0:
        words = _samples(values, _QUICK_WORDS, _QUICK_WORDS)[1]
        magnitude = _magnitude_bits(words)
        top = magnitude.max(initial=0)
    if top >= _BEYOND_HIGH_BITS:  # non-finite, or beyond _NOISE_HIGH
        return True
    # nonzero below 1e-12: more magnitudes below _TINY_BITS than zeros (counts cost less than a reduction)
    if np.count_nonzero(magnitude < _TINY_BITS) > words.size - np.count_nonzero(magnitude):
        return True
    if float(words[3 : words.size // point_dim * point_dim : point_dim].min(initial=0.0)) < 0:  # all finite
        return True
    # float64 values of few mantissa bits (whole numbers) have zero low words; a float32 frame's seldom are
    low = magnitude[: words.size // 2 * 2 : 2]
    return bool(np.count_nonzero(low) < low.size) and _zero_low_words(magnitude != 0) >= _ZERO_LOW_SHARE


def _magnitude_bits(words: np.ndarray) -> np.ndarray:
    """The magnitudes of float32 ``words`` as their bits without the sign: integers in the magnitudes' order
    (NaN and inf above every finite one), compared without a float operation's cost or warnings."""
    return words.view(np.int32) & 0x7FFFFFFF


def _least_float32_bits(bound: float) -> int:
    """The bits of the least float32 not below ``bound`` (> 0): a magnitude's bits (``_magnitude_bits``) are
    below them exactly when it is below ``bound``."""
    nearest = np.float32(bound)
    return int(nearest.view(np.int32)) + (float(nearest) < bound)


def _zero_low_words(nonzero: np.ndarray) -> float:
    """Among float32 word pairs whose second word is not 0 (``nonzero``: which words are not), the share
    whose first word is: all of them for float64 values of few mantissa bits (whole numbers, say: the low
    words are 0), about half at most for a float32 frame (a planar scan's z = 0 before each intensity, but
    x before y seldom 0)."""
    pairs = nonzero[: nonzero.size // 2 * 2].reshape(-1, 2)
    high = pairs[:, 1]
    return float(np.count_nonzero(high > pairs[:, 0])) / max(int(np.count_nonzero(high)), 1)


def misread_row_length(values: np.ndarray, point_dim: int) -> int | None:
    """The row length (3 to WIDEST_ROW_GUESS values a point) that flat float32 ``values`` read as ``point_dim``
    values a point far more plausibly have, or None. Rows wider than 5 are looked at for rows of 3, 4 or 5
    only (``_narrower_rows``: ~0.1-0.5 ms, the steps at every row length up to 16); the rest of this is for
    rows of 4 or 5.

    Read with the wrong row length, the fields take turns in each column, so the "intensities" hold negative
    values (lidar intensity never is) or values past the 0-1 scale, and values the other length apart (one
    field of neighbouring points) differ less than values ``point_dim`` apart: by any margin when over 5 % of
    the "intensities" are negative, by ``_ROW_STEP_MARGIN`` when they only pass 0-1 (0-255 intensities read
    right are no evidence). Real KITTI scans read as 4 and nuScenes sweeps read as 5, ordered or shuffled,
    fail by a wide margin. The values need not form whole rows of the other length: a file of 4 values a
    point cut short may hold whole rows of 5 (the caller tells the two apart). 0-1 "intensities" may still be
    rows of twice ``point_dim`` whose second half is a ring, a time, flags or padding: their x and y differ
    from a point's in sign (``_extras_differ``, ~50 us). A frame of 0-255 intensities in scan order costs a
    look at its neighbouring points (~20 us); the rest, a comparison of every row length (about a millisecond).
    """
    return sampled_row_length(ValueSample.whole(values), point_dim)


def sampled_row_length(values: ValueSample, point_dim: int) -> int | None:
    """``misread_row_length`` of the values of ``values`` (all of a host array, or what was gathered of one on the
    GPU), from what it looks at of them."""
    if point_dim < 4 or values.size < _ROWS_ALIGN or values.size % point_dim:
        return None
    if point_dim > 5:
        return _narrower_rows(values, point_dim)
    samples = values.samples(_ROWS_ALIGN)
    columns = _fourth_values(samples, point_dim)
    tops = [nonnegative_max_bits(column) for column in columns]
    with np.errstate(all="ignore"):  # NaN and huge values are what the rest looks past
        if all(top is not None for top in tops):  # the usual case: no negative value, no NaN
            if all(top <= _UNIT_TOP_BITS for top in tops):  # type: ignore[operator]
                # 0-1 "intensities" may hide rows of twice point_dim whose second half is ring, time, flags
                return 2 * point_dim if _extras_differ(values, 2 * point_dim, point_dim) else None
            negative = unit = False
        else:
            intensity = np.concatenate(columns)
            intensity = intensity[np.isfinite(intensity)]
            if intensity.size == 0:
                return None
            negative = _often_negative(intensity)
            unit = intensity.max() <= 1.5
        if not negative and (unit or _rows_read_right(samples, point_dim)):
            return None  # 0-1 reflectance (beside NaN rows); 0-255 (any scale) of points that follow each other
        looked_at = [s[:_STEP_SAMPLE] for s in samples]
        steps = {n: _median_step(looked_at, n) for n in range(3, WIDEST_ROW_GUESS + 1)}
    least = min(steps[n] for n in steps if n != point_dim)
    # the shortest row about as good as the best: rows of 5 in shuffled order step as far at 10 and 15 values
    best = min(n for n in steps if n != point_dim and steps[n] <= least * 1.5)
    if negative:  # negative "intensities" are evidence enough of a misread
        return best if steps[best] < steps[point_dim] else None
    # values past the 0-1 scale alone are not: rows a multiple of point_dim long may be points in pairs (lasers
    # fired low / high in turn, dual returns), which step like that too; the extra values of wider rows differ
    if steps[best] * _ROW_STEP_MARGIN >= steps[point_dim] or (best % point_dim == 0
                                                              and not _extras_differ(values, best, point_dim)):
        return None
    return best


def _fourth_values(samples: list[np.ndarray], row: int) -> list[np.ndarray]:
    """Each sample's 4th values of its rows, read as rows of ``row`` values: the intensities of a layout read
    right (strided views)."""
    return [s[: s.size // row * row].reshape(-1, row)[:, 3] for s in samples]


def _often_negative(finite: np.ndarray) -> bool:
    """Whether over 5 % of ``finite`` "intensities" are negative, which no lidar intensity is (another field,
    x or y, read there is, about as often as not)."""
    return bool(np.count_nonzero(finite < 0) > 0.05 * finite.size)


def _narrower_rows(values: ValueSample, wide: int) -> int | None:
    """The known row length (3, 4 or 5 values a point) that flat ``values`` read as ``wide`` (over 5) values a
    point have, or None where nothing shows it. Two kinds of evidence, either enough:
    - in scan order, one field recurs at the file's own row length: values that far apart change far less
      (by ``_ROW_STEP_MARGIN``) than values any other distance up to 16 (and ``wide``) apart, bar its multiples;
    - where ``wide`` is a multiple of it (rows of 4 read as 8), where both distances are steps within one
      field, the values past a row's first point must also be further points (``_extras_are_points``), each
      as far from the one before as a row's first point is from the last of the row before
      (``_points_follow_on``), and no farther from it than values ``wide`` apart; then, read as rows of 4 or
      5, 4th values that are never negative (intensities) show it in any order.
    Wider files read right (a ring, a time, a range or flags after the intensity; a point's copy in another
    frame) show neither: their extra values are no x and y, or stand apart from their row's first point
    unlike the points of one stream, and they step least at their own length."""
    looked_at = [s[:_STEP_SAMPLE] for s in values.samples(_ROWS_ALIGN)]
    with np.errstate(all="ignore"):  # NaN and huge values are what the steps look past
        steps = {n: _median_step(looked_at, n) for n in {*range(3, min(wide, WIDEST_ROW_GUESS) + 1), wide}}
    for narrow in sorted((n for n in ROW_LAYOUTS if values.size % n == 0), key=steps.__getitem__):
        in_scan_order = steps[narrow] * _ROW_STEP_MARGIN < min(steps[n] for n in steps if n % narrow)
        if wide % narrow:
            if in_scan_order:
                return narrow
        elif steps[narrow] <= 1.5 * steps[wide] and _extras_are_points(values, wide, narrow) \
                and _points_follow_on(values, wide, narrow) \
                and (in_scan_order or (narrow >= 4 and _no_negative_intensities(values, narrow))):
            return narrow
    return None


def _no_negative_intensities(values: ValueSample, row: int) -> bool:
    """Whether, read as rows of ``row`` values, at most 5 % of the finite 4th values of the two samples are
    negative."""
    column = np.concatenate(_fourth_values(values.samples(row), row))
    finite = column[np.isfinite(column)]
    return finite.size > 0 and not _often_negative(finite)


def _points_follow_on(values: ValueSample, wide: int, narrow: int) -> bool:
    """Whether, in rows of ``wide`` values, each ``narrow``-value slot is as far from the slot before it (within
    a row) as a row's first slot is from the last slot of the row before, field by field (median steps of each
    column within a factor of 2 of each other; both 0 counts as alike): where one stream of points of
    ``narrow`` values cut into rows puts them, in any order. A point's copy in another frame beside it (x, y,
    z, then ego x, ego y, ego z), or a second return a little farther along the same ray, lies nearer its own
    point than the next row's point does in some field."""
    rows = [s[: s.size // wide * wide].reshape(-1, wide) for s in values.samples(wide, _FOLLOW_SAMPLE // wide * wide)]
    with np.errstate(all="ignore"):  # NaN and huge values are what the medians look past
        for column in range(narrow):
            within = _middle(np.concatenate([np.abs(r[:, narrow + column :: narrow] - r[:, column : wide - narrow : narrow])
                                             .ravel() for r in rows]))
            across = _middle(np.concatenate([np.abs(r[1:, column] - r[:-1, wide - narrow + column]) for r in rows]))
            if not (within == across == 0 or 0.5 * across <= within <= 2 * across):
                return False
    return True


def _slot_signs(values: ValueSample, row: int, point_dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """For ``values`` as rows of ``row`` (a multiple of ``point_dim``) spread over the whole frame, the first
    two columns of each ``point_dim``-value slot of a row: how many of each are finite and nonzero, and the
    share of those that are negative (arrays of shape (slots, 2)); None for too few rows to tell anything (a
    small frame of random points). x and y of points around a lidar, or in front of it, are negative in like
    shares, point after point; a missing return is written as zeros or NaN; a ring number, a time or a flag
    is never negative."""
    rows = values.spread(row)  # signs go with azimuth
    if rows is None:
        return None
    xy = rows[:, [column for start in range(0, row, point_dim) for column in (start, start + 1)]]
    counted = np.count_nonzero(np.isfinite(xy) & (xy != 0), axis=0).reshape(-1, 2)
    return counted, np.count_nonzero(xy < 0, axis=0).reshape(-1, 2) / np.maximum(counted, 1)


def _unlike_slots(counted: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Which slots after the first have x or y negative in a share unlike the first slot's (judged where
    enough of their values are nonzero)."""
    return ((np.abs(share[1:] - share[0]) > 0.25) & (counted[1:] >= _SPREAD_ROWS // 8)).any(axis=1)


def _extras_differ(values: ValueSample, row: int, point_dim: int) -> bool:
    """Whether the values after a row's first ``point_dim`` (``values`` as rows of ``row``, a multiple of it)
    are no further points: some later slot's first two columns are all zeros where the first slot's are not
    (padding), or negative in a share unlike x's and y's (``_slot_signs``)."""
    signs = _slot_signs(values, row, point_dim)
    if signs is None:
        return False
    counted, share = signs
    padding = (counted == 0).all(axis=1)
    return not padding[0] and bool((padding[1:] | _unlike_slots(counted, share)).any())


def _extras_are_points(values: ValueSample, row: int, point_dim: int) -> bool:
    """Whether every slot of ``point_dim`` values in rows of ``row`` (``_slot_signs``) is a point: its x and y
    nonzero in at least an eighth of the rows looked at, and negative in the first slot's shares."""
    signs = _slot_signs(values, row, point_dim)
    if signs is None:
        return False
    counted, share = signs
    return bool((counted >= _SPREAD_ROWS // 8).all() and not _unlike_slots(counted, share).any())


#: Rows, spread over a frame, whose slots' signs ``_slot_signs`` compares.
_SPREAD_ROWS = 512
#: The bits of float32 1.5, the top of a 0-1 reflectance column with room for calibration overshoot.
_UNIT_TOP_BITS = int(np.array(1.5, "<f4").view("<u4"))
#: How much closer values of another row length apart must be than values ``point_dim`` apart for it to be
#: the file's when only the intensities' scale hints at a misread: misread rows win by 10-1000 times.
_ROW_STEP_MARGIN = 4.0
#: Values of each sample whose steps at every row length are compared (a few milliseconds in all).
_STEP_SAMPLE = 4096
#: Values of each sample whose rows ``_points_follow_on`` compares (at least ~1,600 steps across rows of 20).
_FOLLOW_SAMPLE = 1 << 15
#: Values of each sample that the quick look at neighbouring points compares: it runs on every nuScenes frame.
_NEIGHBOUR_SAMPLE = 256


def _rows_read_right(samples: list[np.ndarray], point_dim: int) -> bool:
    """Whether one field of neighbouring points (values ``point_dim`` apart) changes far less than one value
    from the next (another field), as in a scan read right (50-300 times less in ring order, 5-10 in firing
    order); in misread rows the two change alike, and so do they in shuffled points, which the caller then
    looks at closer. Medians by partition of one small sample: it runs on every frame of 0-255 intensities
    (~20 us)."""
    head = np.concatenate([s[:_NEIGHBOUR_SAMPLE] for s in samples])
    same_field = _middle(np.abs(head[point_dim:] - head[:-point_dim]))
    return same_field * _ROW_STEP_MARGIN < _middle(np.abs(head[1:] - head[:-1]))


def _middle(values: np.ndarray) -> float:
    """The median of the finite ``values`` (upper middle; inf when none is finite)."""
    finite = values[np.isfinite(values)]
    return float(np.partition(finite, finite.size // 2)[finite.size // 2]) if finite.size else float("inf")


def _median_step(samples: list[np.ndarray], lag: int) -> float:
    """Median of the finite differences between values ``lag`` apart (inf where there is none)."""
    return _middle(np.concatenate([np.abs(s[lag:] - s[:-lag]) for s in samples]))


#: A frame is noise, not points, when over this share of its finite values lie beyond HIGH or below LOW
#: (and not 0) in magnitude: random bytes read as float32 give ~52 %, real frames none.
_NOISE_SHARE, _NOISE_HIGH, _NOISE_LOW = 0.1, 1e6, 1e-30
_NOISE_SAMPLE = 512  # values looked at from the start and from the middle: noise shows in a few
#: The quick look's bounds as magnitude bits (``_magnitude_bits``): from the first, magnitudes are beyond
#: _NOISE_HIGH (or not finite); below the second (and not 0), below 1e-12.
_BEYOND_HIGH_BITS = _least_float32_bits(math.nextafter(_NOISE_HIGH, math.inf))
_TINY_BITS = _least_float32_bits(1e-12)


def _fragments(magnitudes: np.ndarray, low: float, high: float) -> np.ndarray:
    """Which ``magnitudes`` no coordinate or intensity has: nonzero below ``low`` or above ``high``
    (NaN: neither)."""
    return (magnitudes > high) | ((magnitudes > 0) & (magnitudes < low))


def looks_like_noise(values: np.ndarray, point_dim: int = 4) -> bool:
    """True when flat float32 ``values`` are not coordinates: over ``_NOISE_SHARE`` of the finite ones
    are beyond ``_NOISE_HIGH`` (1,000 km) or nonzero below ``_NOISE_LOW`` in magnitude. Random bytes
    (exponents spread evenly) give about half such values; a lidar frame none (non-finite values, which
    organised clouds use for no return, are not counted). Looks at two samples of at most
    ``_NOISE_SAMPLE`` values."""
    counted = odd = 0
    for sample in _samples(values, point_dim, _NOISE_SAMPLE // point_dim * point_dim):
        # x, y, z and intensity only: a 5th column may be an absolute timestamp (1.7e9 s, or in us)
        size = np.abs(sample[: sample.size // point_dim * point_dim].reshape(-1, point_dim)[:, :4])
        finite = size[np.isfinite(size)]
        counted += finite.size
        odd += np.count_nonzero(_fragments(finite, _NOISE_LOW, _NOISE_HIGH))
    return bool(counted and odd > _NOISE_SHARE * counted)


#: Largest coordinate (metres) and intensity a frame read as float64 may hold to count as plausible.
_FLOAT64_MAX_COORD, _FLOAT64_MAX_INTENSITY = 1e5, 65535.0
_FLOAT64_GATE_ROWS = 64  # rows of the float64 reading looked at first: a float32 frame fails within them
_FLOAT64_MIN_ROWS = 16  # fewer float64 rows (32 points of 4) are too few to tell
_ZERO_LOW_SHARE = 0.9  # of the nonzero would-be high words following a zero: float64 of whole numbers


#: The float64 rows a file is tried as (x, y, z, intensity and nuScenes' 5th value), whatever it is read as.
_FLOAT64_ROW_LENGTHS = (4, 5)


def looks_float64(values: np.ndarray, point_dim: int) -> bool:
    """True when flat float32 ``values`` are really float64 rows of ``point_dim`` values (an array saved
    with ``tofile`` before ``astype(np.float32)``).

    Read as float32, each float64 splits in two words: the high one (sign, exponent, top of the
    mantissa) reads as a modest number, the low one (the mantissa's tail) as 0, +-1e-19, +-2, +-4e19 or
    noise. So the test: (1) the bytes read as float64 are a plausible frame (finite, no fragments of
    numbers, coordinates within 100 km, intensities in [0, 65535]); (2) read as float32 they are not
    (``_fragments_or_negative``: the would-be low words are fragments of numbers or zeros, or the
    intensities go negative). A float32 frame read as float64 takes its magnitudes from every other value
    (y and intensity for rows of 4): a y beyond ~8 m or a negative intensity fails (1), mostly in the
    first rows looked at; real scans fail (2) besides. Frames of fewer than ``_FLOAT64_MIN_ROWS`` float64
    rows are not judged. Looks at the first ``_FLOAT64_GATE_ROWS`` rows, and only when they pass (1), at
    two samples of at most ``_LAYOUT_SAMPLE`` values.
    """
    row = 2 * point_dim  # float32 words in one float64 row
    if values.size % row or values.size < _FLOAT64_MIN_ROWS * row:
        return False
    if not _plausible_as_float64(values[: _FLOAT64_GATE_ROWS * row], point_dim):  # the usual case: cheap
        return False
    samples = _samples(values, row, _LAYOUT_SAMPLE // row * row)
    return all(_plausible_as_float64(s, point_dim) for s in samples) and _fragments_or_negative(
        np.concatenate(samples), point_dim)


def _fragments_or_negative(words: np.ndarray, point_dim: int) -> bool:
    """Whether float32 ``words`` (whole float64 rows) read as float32 are no frame: over a third of the
    words that would be float64 low words are fragments (non-finite, or nonzero below 1e-12 or above
    1e12 in magnitude), nearly every nonzero would-be high word follows a zero (``_zero_low_words``), or
    over 5 % of the intensities are negative."""
    low = words[0::2]  # a float64's low word comes first (little-endian)
    with np.errstate(invalid="ignore"):
        fragments = np.count_nonzero(~np.isfinite(low) | _fragments(np.abs(low), 1e-12, 1e12))
    if fragments > low.size / 3 or _zero_low_words(words != 0) >= _ZERO_LOW_SHARE:
        return True
    intensity = words[: words.size // point_dim * point_dim].reshape(-1, point_dim)[:, 3]
    return bool(np.count_nonzero(intensity < 0) > 0.05 * intensity.size)


def _plausible_as_float64(words: np.ndarray, point_dim: int) -> bool:
    """Whether float32 ``words`` (whole float64 rows) read as float64 rows are a frame a lidar gives: values
    no fragments of numbers (``_NOISE_SHARE`` of them at most nonzero below ``_NOISE_LOW``, as the bytes of
    int16 rows read as float64 are), coordinates within ``_FLOAT64_MAX_COORD``, intensities in
    [0, ``_FLOAT64_MAX_INTENSITY``]."""
    rows = np.ascontiguousarray(words).view("<f8").reshape(-1, point_dim)
    finite = np.isfinite(rows).all(axis=1)
    if 2 * np.count_nonzero(finite) < len(rows):  # rows of NaN (no return) are skipped, not the majority
        return False
    rows = rows[finite]
    intensity = rows[:, 3]
    values = np.abs(rows[:, :4])  # int16 rows of 4 read as one float64 each are denormals (~1e-312): no values
    return bool(np.all(values[:, :3] <= _FLOAT64_MAX_COORD)
                and np.all((intensity >= 0) & (intensity <= _FLOAT64_MAX_INTENSITY))
                and np.count_nonzero(_fragments(values, _NOISE_LOW, math.inf)) <= _NOISE_SHARE * values.size)
