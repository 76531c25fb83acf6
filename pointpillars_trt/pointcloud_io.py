"""Lidar frame files -> (N, 4) float32 x, y, z, intensity: KITTI-style ``.bin``, ``.npy`` and ``.pcd``.

Every reader refuses, before reading data, anything that is not a regular file (a FIFO,
/dev/zero, a directory) and any frame of more than ``MAX_FRAME_POINTS`` points, so memory stays
bounded and nothing blocks. Values are not checked: NaN/inf rows are kept (the detector drops
and counts them). Errors are one-line :class:`InputError` messages naming the file.
"""

from __future__ import annotations

import ast
import math
import os
import struct
from collections.abc import Callable
from typing import IO, NamedTuple, Union

import numpy as np

from .errors import InputError
from .fileio import open_regular_fd, open_regular_file, read_regular_file, safe_repr
from .points import MAX_FRAME_POINTS, columns_text, transposed_hint

PathLike = Union[str, "os.PathLike[str]"]

#: Extensions :func:`read_points` understands (lower case).
SUPPORTED_EXTENSIONS = (".bin", ".npy", ".pcd")

_NPY_MAX_HEADER = 1 << 16
_PCD_MAX_HEADER = 1 << 16
_NPY_MAX_BYTES = _NPY_MAX_HEADER + MAX_FRAME_POINTS * 8 * 8  # 16 Mi points of 8 float64 columns: 1 GiB
_PCD_MAX_BINARY = MAX_FRAME_POINTS * 64  # 1 GiB of binary point data
_PCD_MAX_ASCII = 2**31  # 2 GiB of ASCII point data
_PCD_MAX_COUNT = 4096  # values in one field of a point (PCL's largest stock field, a histogram, has 352)
_PCD_ASCII_BYTES_PER_VALUE = 32  # bound on an ASCII PCD's data: POINTS * values * this
_PCD_ASCII_BLOCK = 2**20  # bytes of ASCII data parsed at a time (~20-60 k rows)


# --------------------------------------------------------------------------- entry point

def unsupported_extension(ext: str) -> str:
    """What a file of extension ``ext`` (none: "") is not, with the extensions point files have."""
    kind = f"extension {safe_repr(ext, 24)}" if ext else "no extension"
    return f"{kind}; supported: {', '.join(SUPPORTED_EXTENSIONS)}"


def read_points(
    path: PathLike, *, point_dim: int = 4, intensity_scale: float | None = None, columns: int | None = None
) -> np.ndarray:
    """Read a lidar frame file as a C-contiguous (N, columns) float32 array of x, y, z, intensity
    (and, for ``columns`` 5, each point's time lag: ``ModelConfig.point_columns``). ``columns``
    defaults to 5 for ``point_dim`` 5 (a multi-sweep model's x, y, z, intensity, time), else 4.

    The format follows the extension (case-insensitive):

    * ``.bin``: little-endian float32 rows of ``point_dim`` values (4 for KITTI, 5 for
      nuScenes-style x, y, z, intensity, time); the first ``columns`` are kept. A size that is
      not a multiple of ``4 * point_dim`` bytes is an error naming the size, and a file of 5 values
      a point read as 4, or of 4 read as 5, or of 3 (no intensity) as either (see
      :func:`misread_row_length`), is refused naming what fits; so is a file of float64 values
      (:func:`looks_float64`) or of bytes that are no float32 coordinates (:func:`looks_like_noise`).
      0 bytes = empty frame.
    * ``.npy``: a 2-D float32/float64 array (N, >=columns), first ``columns`` kept; other dtypes, other
      shapes and a (4, N) array ("looks transposed") are refused. Never unpickles.
    * ``.pcd``: ASCII or binary ``DATA`` with fields x, y, z and intensity (or i, or reflectance);
      binary_compressed is refused; 4 columns only.

    ``intensity_scale`` (e.g. 1/255 for 8-bit intensities, see :func:`intensity_looks_8bit`)
    multiplies the 4th column after reading.

    Only :class:`InputError` leaves this function: any other exception a reader raises (a bug, or a
    file shaped in a way no check foresaw) becomes one naming the file, so no reader can end a run.
    """
    if columns is None:
        columns = 5 if point_dim == 5 else 4
    try:
        return _read_points(path, point_dim=point_dim, intensity_scale=intensity_scale, columns=columns)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the reader boundary: whatever a file does, it fails alone
        raise InputError(
            f"point file {safe_repr(path)} cannot be read ({type(exc).__name__}: {_one_line(exc)})"
        ) from None


def _read_points(path: PathLike, *, point_dim: int, intensity_scale: float | None, columns: int) -> np.ndarray:
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext == ".bin":
        points = read_bin(path, point_dim=point_dim, columns=columns)
    elif ext == ".npy":
        points = read_npy(path, columns=columns)
    elif ext == ".pcd":
        if columns != 4:
            raise InputError(f"point file {safe_repr(path)}: .pcd frames are read as x, y, z, intensity; "
                             f"this model reads {columns} values a point ({columns_text(columns)}): use .bin or .npy")
        points = read_pcd(path)
    elif not os.path.lexists(path):
        raise InputError(f"point file {safe_repr(path)}: no such file or folder")
    else:
        raise InputError(f"point file {safe_repr(path)} has {unsupported_extension(ext)}")
    if intensity_scale is not None:
        points[:, 3] *= np.float32(_checked_scale(intensity_scale))
    return points


#: Largest intensity scale taken (0-255 -> 0-1 is 1/255, the reverse 255): more would push intensities
#: past float32's range.
MAX_INTENSITY_SCALE = 1000.0


def _checked_scale(intensity_scale: float) -> float:
    scale = float(intensity_scale)
    if not np.isfinite(scale) or not 0 < scale <= MAX_INTENSITY_SCALE:
        raise InputError(f"intensity scale {safe_repr(intensity_scale)}: expected a number in (0, {MAX_INTENSITY_SCALE:g}]")
    return scale


#: Gives the (n, 4) float32 rows a frame of n points is read into, or None where there is no room.
Allocate = Callable[[int], Union[np.ndarray, None]]


def read_points_into(
    path: PathLike, allocate: Allocate, *, point_dim: int = 4, intensity_scale: float | None = None,
    columns: int = 4,
) -> np.ndarray:
    """:func:`read_points`, with the points landing in the rows ``allocate(n)`` gives (e.g. pinned
    host memory the GPU copies from): a KITTI ``.bin`` of 4 values a point is read straight into
    them, every other file parsed and then copied in once. Returns those rows, or (when
    ``allocate`` has no room) an array of its own. The rows hold 4 columns: a model of other point
    columns (``columns``) gets an array of its own."""
    if columns != 4:
        return read_points(path, point_dim=point_dim, intensity_scale=intensity_scale, columns=columns)
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext != ".bin" or point_dim != 4:
        points = read_points(path, point_dim=point_dim, intensity_scale=intensity_scale, columns=4)
        rows = allocate(len(points))
        if rows is None:
            return points
        rows[...] = points
        return rows
    fd, size = open_regular_fd(path, max_bytes=2**62, what="point file")
    try:
        if size % 16:
            _refuse_text(path, os.pread(fd, _TEXT_SNIFF, 0) if hasattr(os, "pread") else b"", "point file")
        _check_bin_size(path, size, 4, "point file")
        count = size // 16
        rows = allocate(count)
        target = rows if rows is not None else np.empty((count, 4), np.float32)
        try:
            got = _read_fully(fd, memoryview(target).cast("B")) if count else 0  # type: ignore[arg-type]
        except OSError as exc:
            raise InputError(f"point file {safe_repr(path)} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if got != size:
        raise InputError(f"point file {safe_repr(path)} changed size while being read")
    _check_layout(target.reshape(-1), 4, path, "point file")
    if intensity_scale is not None:
        target[:, 3] *= np.float32(_checked_scale(intensity_scale))
    return target


def _read_fully(fd: int, target: memoryview) -> int:
    """Read into ``target`` until it is full or the file ends (a read may return less than asked)."""
    if not hasattr(os, "readv"):  # not POSIX: through a file object that leaves the descriptor open
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.readinto(target)
    got = 0
    while got < len(target):
        n = os.readv(fd, [target[got:]])
        if n == 0:
            break
        got += n
    return got


def read_bin_bytes_into(data: bytes, allocate: Allocate, *, point_dim: int = 4,
                        intensity_scale: float | None = None, source: str = "point file",
                        columns: int = 4) -> np.ndarray:
    """A ``.bin`` frame already in memory (e.g. read from object storage) into the rows ``allocate``
    gives, checked as :func:`read_bin` checks a file; a model of other point ``columns`` (e.g. 5, with
    the time lag) gets an array of its own, as from :func:`read_points_into`."""
    _check_point_dim(point_dim, columns)
    points = _bin_points(data, point_dim, columns, source, "point file")
    rows = allocate(len(points)) if columns == 4 else None
    target = rows if rows is not None else np.empty((len(points), columns), np.float32)
    target[...] = points
    if intensity_scale is not None:
        target[:, 3] *= np.float32(_checked_scale(intensity_scale))
    return target


_TEXT_CHARS = bytes([9, 10, 13, *range(32, 127)])  # printable ASCII, tab, newline, carriage return
_TEXT_SNIFF = 4096  # bytes looked at: no float32 frame's first 4 KB are all printable ASCII


def _refuse_text(path: PathLike, head: bytes | np.ndarray, what: str) -> None:
    """InputError when a ``.bin``'s first bytes (``head``: bytes, or its float32 values) are all printable
    ASCII: a text file (a point list written as numbers), which read as float32 is refused for its size with
    the wrong advice, or read as points a few nanometres from the origin. The first 64 bytes settle it for
    nearly every frame."""
    if _is_text(_first_bytes(head, 64)) and _is_text(_first_bytes(head, _TEXT_SNIFF)):
        raise InputError(f"{what} {safe_repr(path)} is text, not float32 values: a point list written as "
                         "numbers? load it with numpy.loadtxt and save the array as float32 .bin or .npy")


def _first_bytes(head: bytes | np.ndarray, count: int) -> bytes:
    """The first ``count`` bytes of ``head`` (bytes, or values whose bytes are looked at)."""
    return head[: count // head.itemsize].tobytes() if isinstance(head, np.ndarray) else bytes(head[:count])


def _is_text(data: bytes) -> bool:
    """Whether ``data`` is not empty and all printable ASCII: ``bytes.translate`` deleting the text bytes
    takes a fraction of a NumPy call's time."""
    return bool(data) and not data.translate(None, _TEXT_CHARS)


def _check_bin_size(path: PathLike, size: int, point_dim: int, what: str, columns: int = 4) -> None:
    """Whole rows of ``point_dim`` float32 values, at most MAX_FRAME_POINTS of them (``columns``: the
    values a point the model reads, for the advice)."""
    row = 4 * point_dim
    if size % row:
        raise InputError(f"{what} {safe_repr(path)} is {size} bytes, not a multiple of {row} "
                         f"({point_dim} float32 values a point){_other_dim_hint(size, point_dim, columns)}")
    if size > MAX_FRAME_POINTS * row:
        raise InputError(f"{what} {safe_repr(path)} is {size} bytes ({size // row} points), "
                         f"more than the limit of {MAX_FRAME_POINTS} points a frame")


#: What a .bin of each row length is, for the messages of a file read with another one.
_LAYOUTS = {3: "x, y, z without intensity", 4: "x, y, z, intensity, as KITTI writes them",
            5: "x, y, z, intensity, ring/time, as nuScenes writes them"}


#: A multi-sweep frame's time lags (s behind the key sweep): nuScenes' 10 sweeps span ~0.45 s; beyond these
#: bounds the 5th column holds something else (ring numbers, timestamps, lags of the wrong sign).
TIME_LAG_RANGE = (-0.01, 2.0)


def _check_time_lags(values: np.ndarray, point_dim: int, path: PathLike, what: str) -> None:
    """Refuse a multi-sweep model's frame whose 5th values (looked at from the start and the middle) are
    no time lags: the PFN would take ring numbers or timestamps for lags without a word."""
    lows, highs = [], []
    for sample in _samples(values, point_dim):
        lags = sample[: sample.size // point_dim * point_dim].reshape(-1, point_dim)[:, 4]  # a strided view
        lo, hi = lags.min(initial=np.inf), lags.max(initial=-np.inf)
        if np.isnan(lo) or np.isnan(hi):  # rows of NaN (no return) are skipped
            lags = lags[np.isfinite(lags)]
            lo, hi = lags.min(initial=np.inf), lags.max(initial=-np.inf)
        lows.append(lo)
        highs.append(hi)
    lo, hi = min(lows), max(highs)
    low, high = TIME_LAG_RANGE
    if lo <= hi and not (low <= lo and hi <= high):  # lo > hi: no finite lag to judge
        raise InputError(
            f"{what} {safe_repr(path)}: its 5th values run from {lo:.6g} to {hi:.6g}, but this "
            f"model reads each point's time lag behind the key sweep there, in seconds ({low:g} to {high:g}; "
            "0 to ~0.5 for 10 nuScenes sweeps), not ring numbers or timestamps: build multi-sweep frames with "
            "PointPillars.accumulate"
        )


def _check_layout(values: np.ndarray, point_dim: int, path: PathLike, what: str, columns: int = 4) -> None:
    """Refuse a file whose values read as ``point_dim`` float32 a point are text, float64 values, bytes
    that are no float32 numbers at all, or rows of another length (3, 4 or 5); ``columns``: the values a
    point the model reads (5 for a multi-sweep model), for the advice. A frame read right gets integer
    operations on its values' bits (``_looks_odd``, ``misread_row_length``), which raise no floating-point
    warning whatever the bytes: NumPy's warnings are turned off only where odd values are computed on."""
    _refuse_text(path, values[: _TEXT_SNIFF // 4], what)
    if _looks_odd(values, point_dim):
        _refuse_float64_or_noise(values, point_dim, path, what)
    row = misread_row_length(values, point_dim)
    if row is not None and values.size % row:
        raise InputError(
            f"{what} {safe_repr(path)} looks like {row} float32 values a point ({_LAYOUTS[row]}) read as "
            f"{point_dim}, but it holds no whole rows of {row}: a file of {row} values a point cut short (a copy "
            "that failed? copy it again)"
        )
    if row == 3:
        raise InputError(
            f"{what} {safe_repr(path)} looks like 3 float32 values a point ({_LAYOUTS[3]}) read as {point_dim}: "
            f"its 4th column holds negative and coordinate-like values, not intensities; the model reads x, y, "
            "z, intensity: write each point's intensity too"
        )
    if row is not None and row < columns:  # single sweeps given to a multi-sweep model
        raise InputError(
            f"{what} {safe_repr(path)} looks like {row} float32 values a point ({_LAYOUTS[row]}) read as "
            f"{point_dim}; this model reads {columns} a point ({columns_text(columns)}): give it multi-sweep "
            "frames (PointPillars.accumulate builds them from sweeps and their poses)"
        )
    if row is not None:
        raise InputError(
            f"{what} {safe_repr(path)} looks like {row} float32 values a point ({_LAYOUTS[row]}) read as "
            f"{point_dim}: its 4th column holds negative and coordinate-like values, not intensities; "
            f"pass --point-dim {row} (Python: point_dim={row})"
        )
    if columns == 5:  # a layout read right: are its 5th values time lags?
        with np.errstate(all="ignore"):  # NaN and huge values are what the check looks past
            _check_time_lags(values, point_dim, path, what)


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
        if looks_like_noise(values, point_dim):
            raise InputError(
                f"{what} {safe_repr(path)} does not hold float32 point coordinates: over "
                f"{_NOISE_SHARE:.0%} of its values are beyond {_NOISE_HIGH:g} or nonzero below {_NOISE_LOW:g} "
                "in magnitude, as random bytes or another type's bytes read as float32 are; is it a point file?"
            )


def intensity_looks_8bit(points: np.ndarray) -> bool:
    """True when the 4th column looks like 0-255 intensities rather than KITTI's 0-1 reflectance: the finite
    intensities all lie in [0, 255] and the largest is above 1.5. A model trained on KITTI then sees values
    ~100x too large; scale by 1/255 (``intensity_scale``)."""
    return intensity_mismatch(points, expects_unit=True) == "8bit"


#: Finite points a frame needs before "all its intensities lie in 0-1" says anything of its scale.
UNIT_INTENSITY_MIN_POINTS = 1000


class IntensityMismatch(NamedTuple):
    """What :func:`find_intensity_mismatch` found: the ``kind`` of disagreement and the largest finite intensity
    magnitude it was judged on, which a "beyond" warning names (so the column is not searched again)."""

    kind: str
    largest: float


def intensity_mismatch(points: np.ndarray, expects_unit: bool) -> str | None:
    """How a frame's intensities disagree with the scale its model was trained on, or None: ``"8bit"``
    (finite values in [0, 255] reaching past 1.5, for a 0-1 model), ``"beyond"`` (values past 255 for a 0-1
    model: another point layout or scale), ``"unit"`` (at least UNIT_INTENSITY_MIN_POINTS finite values, all
    within [0, 1], for a 0-255 model). One pass over the column (its maximum) for a frame on its model's scale."""
    found = find_intensity_mismatch(points, expects_unit)
    return None if found is None else found.kind


def find_intensity_mismatch(points: np.ndarray, expects_unit: bool) -> IntensityMismatch | None:
    """:func:`intensity_mismatch` with the largest finite intensity magnitude it saw, for a warning to name."""
    arr = np.asarray(points)
    if arr.ndim != 2 or arr.shape[1] < 4 or arr.shape[0] == 0:
        return None
    inten = arr[:, 3]
    top = _nonnegative_max_bits(inten)
    # no copy; a NaN anywhere makes the float maximum NaN, which passes neither test below
    hi = float(inten.max()) if top is None else _FLOAT32.unpack(top.to_bytes(4, "little"))[0]
    if (hi <= 1.5) if expects_unit else (hi > 1.0):
        return None
    lo = float(inten.min())
    if not (np.isfinite(lo) and np.isfinite(hi)):  # rows of NaN (no return) are skipped
        inten = inten[np.isfinite(inten)]
        if inten.size == 0:
            return None
        lo, hi = float(inten.min()), float(inten.max())
    if expects_unit:
        kind = "beyond" if hi > 255.0 or lo < -255.0 else "8bit" if lo >= 0.0 and hi > 1.5 else None
    else:
        kind = "unit" if inten.size >= UNIT_INTENSITY_MIN_POINTS and lo >= 0.0 and hi <= 1.0 else None
    return None if kind is None else IntensityMismatch(kind, max(hi, -lo))  # the largest |intensity|


#: The bits of float32 +inf: a float32 of bits up to these is neither negative (nor -0.0) nor NaN.
_FLOAT32_INF_BITS = 0x7F800000
_FLOAT32 = struct.Struct("<f")  # a float32 from its bits (as 4 little-endian bytes): no NumPy scalar to make


def _nonnegative_max_bits(column: np.ndarray) -> int | None:
    """The bits of the largest value of a float32 ``column`` (a strided view, say) when none has its sign
    bit set and none is NaN, else None (also for other dtypes): such values order as their bits, and an
    integer maximum over a strided column takes half the time of a float one, which tests every value for
    NaN."""
    if column.dtype != np.float32:
        return None
    top = int(column.view(np.uint32).max(initial=0))
    return top if top <= _FLOAT32_INF_BITS else None


# --------------------------------------------------------------------------- .bin

def read_bin(path: PathLike, *, point_dim: int = 4, what: str = "point file", columns: int = 4) -> np.ndarray:
    """A raw little-endian float32 file of ``point_dim`` values a point -> (N, columns) float32."""
    _check_point_dim(point_dim, columns)
    data = _read_frame_bytes(path, 4 * int(point_dim), what)
    return _bin_points(data, point_dim, columns, path, what).astype(np.float32, order="C")  # writable, native order


def _check_point_dim(point_dim: object, columns: int) -> None:
    """``point_dim``: an integer >= 4 that holds the model's ``columns`` values a point."""
    if isinstance(point_dim, bool) or not isinstance(point_dim, (int, np.integer)) or point_dim < 4:
        raise InputError(f"point_dim {safe_repr(point_dim)} is not an integer >= 4 (x, y, z, intensity, ...)")
    if point_dim < columns:
        raise InputError(f"point_dim {int(point_dim)}: the model reads {columns} values a point "
                         f"({columns_text(columns)}); read its frames with point_dim {columns} (--point-dim {columns})")


def _bin_points(data: bytes, point_dim: int, columns: int, source: PathLike, what: str) -> np.ndarray:
    """The first ``columns`` of a ``.bin`` frame's ``point_dim`` little-endian float32 values a point (a
    view of ``data``), checked: whole rows, at most MAX_FRAME_POINTS, and the layout (``_check_layout``)."""
    if len(data) % (4 * int(point_dim)):
        _refuse_text(source, data[:_TEXT_SNIFF], what)
    _check_bin_size(source, len(data), int(point_dim), what, columns)
    values = np.frombuffer(data, dtype="<f4")
    _check_layout(values, int(point_dim), source, what, columns)
    return values.reshape(-1, int(point_dim))[:, :columns]


_LAYOUT_SAMPLE = 1 << 15  # float32 values looked at from the start and from the middle of a file
_ROWS_ALIGN = 60  # whole rows of 3, 4 and 5 values


def _samples(values: np.ndarray, align: int, count: int = _LAYOUT_SAMPLE) -> list[np.ndarray]:
    """At most ``count`` values from the start and from the middle (at a multiple of ``align``)."""
    middle = (values.size // 2) // align * align
    return [values[:count], values[middle:middle + count]]


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
    """The row length (3, 4 or 5 values a point) that flat float32 ``values`` read as ``point_dim`` (4
    or 5) values a point far more plausibly have, or None.

    Read with the wrong row length, every field takes its turn in the intensity column, so (1) over 5 %
    of the "intensities" are negative (lidar intensity never is), and (2) values the other length apart
    (the same field of neighbouring points) differ less than values ``point_dim`` apart. Real KITTI scans
    read as 4 and nuScenes sweeps read as 5, ordered or shuffled, fail both by a wide margin. The values
    need not form whole rows of the other length: a file of 4 values a point cut short may hold whole rows
    of 5 (the caller tells the two apart). Looks at two samples of at most ``_LAYOUT_SAMPLE`` values, so
    it costs microseconds.
    """
    if point_dim not in (4, 5) or values.size < _ROWS_ALIGN or values.size % point_dim:
        return None
    others = [n for n in _LAYOUTS if n != point_dim]
    samples = _samples(values, _ROWS_ALIGN)
    columns = [s[: s.size // point_dim * point_dim].reshape(-1, point_dim)[:, 3] for s in samples]
    if all(_nonnegative_max_bits(column) is not None for column in columns):  # the usual case: no copies, no NaN met
        return None
    with np.errstate(all="ignore"):  # NaN and huge values are what the rest looks past
        intensity = np.concatenate(columns)
        intensity = intensity[np.isfinite(intensity)]
        if intensity.size == 0 or np.count_nonzero(intensity < 0) <= 0.05 * intensity.size:
            return None
        steps = {n: _median_step(samples, n) for n in (point_dim, *others)}
    best = min(others, key=lambda n: steps[n])
    return best if steps[best] < steps[point_dim] else None


def _median_step(samples: list[np.ndarray], lag: int) -> float:
    """Median of the finite differences between values ``lag`` apart (inf where there is none)."""
    steps = np.concatenate([np.abs(s[lag:] - s[:-lag]) for s in samples])
    steps = steps[np.isfinite(steps)]
    return float(np.median(steps)) if steps.size else float("inf")


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
    noise. So the test: (1) the bytes read as float64 are a plausible frame (finite, coordinates within
    100 km, intensities in [0, 65535]); (2) read as float32 they are not (``_fragments_or_negative``:
    the would-be low words are fragments of numbers or zeros, or the intensities go negative). A float32
    frame read as float64 takes its magnitudes from every other value (y and intensity for rows of 4): a
    y beyond ~8 m or a negative intensity fails (1), mostly in the first rows looked at; real scans fail
    (2) besides. Frames of fewer than ``_FLOAT64_MIN_ROWS`` float64 rows are not judged. Looks at the
    first ``_FLOAT64_GATE_ROWS`` rows, and only when they pass (1), at two samples of at most
    ``_LAYOUT_SAMPLE`` values.
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
    """Whether float32 ``words`` (whole float64 rows) read as float64 rows are a frame a lidar gives."""
    rows = np.ascontiguousarray(words).view("<f8").reshape(-1, point_dim)
    finite = np.isfinite(rows).all(axis=1)
    if 2 * np.count_nonzero(finite) < len(rows):  # rows of NaN (no return) are skipped, not the majority
        return False
    rows = rows[finite]
    intensity = rows[:, 3]
    return bool(np.all(np.abs(rows[:, :3]) <= _FLOAT64_MAX_COORD)
                and np.all((intensity >= 0) & (intensity <= _FLOAT64_MAX_INTENSITY)))


def _other_dim_hint(size: int, point_dim: int, columns: int) -> str:
    """The size error's pointer to the row lengths (3, 4 or 5 values a point) the size fits, if any;
    rows shorter than the model's ``columns`` get what such a model needs instead of --point-dim."""
    if point_dim not in (4, 5):
        return ""
    fits = sorted((n for n in _LAYOUTS if n != point_dim and size % (4 * n) == 0), key=lambda n: n == 3)
    if not fits:
        return "; it fits no rows of 3, 4 or 5 float32 values: is it a point file, or one cut short?"

    def advice(n: int) -> str:
        if n == 3:
            return "; the model needs intensities)"
        if n < columns:
            return (f"; this model reads {columns} a point ({columns_text(columns)}): give it multi-sweep frames, "
                    "which PointPillars.accumulate builds from sweeps and their poses)")
        return f": if so, pass --point-dim {n}; Python: point_dim={n})"  # the readers serve the API too

    return (f"; its size fits {' or '.join(f'rows of {n} values ({_LAYOUTS[n]}{advice(n)}' for n in fits)}, "
            "unless the file was cut short (a copy that failed?)")


def _read_frame_bytes(path: PathLike, row_bytes: int, what: str) -> bytes:
    """All bytes of a regular file of at most MAX_FRAME_POINTS rows, refused by its size (in
    points) before anything is read."""
    limit = MAX_FRAME_POINTS * row_bytes
    f, size = open_regular_file(path, max_bytes=2**62, what=what)
    f.close()
    if size > limit:
        raise InputError(
            f"{what} {safe_repr(path)} is {size} bytes ({size // row_bytes} points), "
            f"more than the limit of {MAX_FRAME_POINTS} points a frame"
        )
    return read_regular_file(path, max_bytes=limit, what=what)


# --------------------------------------------------------------------------- .npy

def read_npy(path: PathLike, *, what: str = "point file", columns: int = 4) -> np.ndarray:
    """A NumPy .npy array (N, >=columns) float32/float64 -> (N, columns) float32; read without unpickling,
    the header checked before any data is read."""
    shown = safe_repr(path)
    f, size = open_regular_file(path, max_bytes=_NPY_MAX_BYTES, what=what)
    with f:
        try:
            shape, fortran, dtype = _npy_header(f)
            header_end = f.tell()
        except OSError as exc:
            raise InputError(f"{what} {shown} cannot be read: {exc.strerror or exc}") from None
        except Exception as exc:  # noqa: BLE001 - literal_eval/descr_to_dtype raise many kinds (RecursionError too)
            raise InputError(f"{what} {shown} is not a valid .npy file: {_one_line(exc)}") from None
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
            raise InputError(f"{what} {shown} holds dtype {_dtype_text(dtype)}, shape {shape}; expected float32 or float64 (N, 4)")
        hint = transposed_hint(shape)
        if len(shape) != 2 or shape[1] < columns or hint:
            raise InputError(
                f"{what} {shown} holds shape {shape}, dtype {_dtype_text(dtype)}; "
                f"expected (N, {columns}) or more columns of {columns_text(columns)}{hint}"
            )
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise InputError(f"{what} {shown} holds dtype {_dtype_text(dtype)}, shape {shape}; expected float32 or float64")
        if shape[0] > MAX_FRAME_POINTS:
            raise InputError(f"{what} {shown} holds {shape[0]} points, more than the limit of {MAX_FRAME_POINTS} points a frame")
        expected = shape[0] * shape[1] * dtype.itemsize
        if size - header_end != expected:
            raise InputError(
                f"{what} {shown} has {size - header_end} data bytes, its header (shape {shape}, "
                f"dtype {_dtype_text(dtype)}) says {expected}"
            )
        try:
            data = f.read(expected)
        except OSError as exc:
            raise InputError(f"{what} {shown} cannot be read: {exc.strerror or exc}") from None
    if len(data) != expected:
        raise InputError(f"{what} {shown} was truncated while being read")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    points = arr[:, :columns].astype(np.float32, order="C")  # a writable copy, native byte order
    if columns == 5:
        _check_time_lags(points.reshape(-1), columns, path, what)
    return points


def _npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of an .npy stream positioned at its start; a literal header
    parse (ast.literal_eval), never a pickle."""
    magic = f.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY":
        raise ValueError("no .npy magic number")
    major = magic[6]
    if major == 1:
        length = int.from_bytes(f.read(2), "little")
    elif major in (2, 3):
        length = int.from_bytes(f.read(4), "little")
    else:
        raise ValueError(f"unknown .npy format version {major}.{magic[7]}")
    if length > _NPY_MAX_HEADER:
        raise ValueError(f"header of {length} bytes")
    raw = f.read(length)
    if len(raw) != length:
        raise EOFError("file ends inside the header")
    header = ast.literal_eval(raw.decode("utf-8" if major == 3 else "latin1"))
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError("header is not a dict of descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(_is_size(n) for n in shape):
        raise ValueError(f"shape {safe_repr(shape, 60)} is not a tuple of sizes")
    if not isinstance(fortran, bool):
        raise ValueError(f"fortran_order {safe_repr(fortran, 40)} is not True or False")
    dtype = np.lib.format.descr_to_dtype(header["descr"])
    return shape, fortran, dtype


def _is_size(value: object) -> bool:
    """A non-negative int that is not a bool (``True`` is an int to ``isinstance``)."""
    return type(value) is int and value >= 0


def _dtype_text(dtype: np.dtype) -> str:
    return safe_repr(dtype.str if dtype.fields is None else str(dtype.descr), limit=60).strip("'")


def _one_line(exc: BaseException) -> str:
    return safe_repr(str(exc), limit=100)


# --------------------------------------------------------------------------- .pcd

_PCD_TYPES = {("F", 4): "f4", ("F", 8): "f8", ("I", 1): "i1", ("I", 2): "i2", ("I", 4): "i4", ("I", 8): "i8",
              ("U", 1): "u1", ("U", 2): "u2", ("U", 4): "u4", ("U", 8): "u8"}
_PCD_KEYS = ("VERSION", "FIELDS", "SIZE", "TYPE", "COUNT", "WIDTH", "HEIGHT", "VIEWPOINT", "POINTS", "DATA")
#: PCL's name for padding bytes, which a header may repeat (Ouster's and pcl_ros' clouds pad several fields).
_PCD_PADDING = "_"


def read_pcd(path: PathLike, *, what: str = "point file") -> np.ndarray:
    """A PCL .pcd file (DATA ascii or binary) with fields x, y, z and intensity (or i, or reflectance) -> (N, 4)
    float32 in that column order. SIZE/TYPE/COUNT are checked against each other, POINTS against
    WIDTH * HEIGHT and the data size; DATA binary_compressed is refused."""
    shown = safe_repr(path)
    f, size = open_regular_file(
        path, max_bytes=_PCD_MAX_HEADER + max(_PCD_MAX_BINARY, _PCD_MAX_ASCII), what=what
    )
    with f:
        try:
            header, header_end = _pcd_header(f, shown, what)
            dtype, points, data_kind = _pcd_layout(header, shown, what)
            columns = _pcd_columns(dtype, shown, what)
            if data_kind == "binary":
                expected = points * dtype.itemsize
                if expected > _PCD_MAX_BINARY:
                    raise InputError(f"{what} {shown}: POINTS {points} x {dtype.itemsize} bytes a point is more "
                                     f"than the limit of {_PCD_MAX_BINARY} bytes")
                if size - header_end != expected:
                    raise InputError(
                        f"{what} {shown}: {size - header_end} bytes of binary data, but POINTS {points} x "
                        f"{dtype.itemsize} bytes a point needs {expected}"
                        + (" (truncated)" if size - header_end < expected else "")
                    )
                data = f.read(expected)
                if len(data) != expected:
                    raise InputError(f"{what} {shown} was truncated while being read")
                table = np.frombuffer(data, dtype=dtype)
                out = np.empty((points, 4), dtype=np.float32)
                for col, name in enumerate(columns):
                    out[:, col] = table[name]
                return out
            per_row = sum(int(np.prod(dtype[n].shape)) for n in dtype.names or ())
            limit = min(points * per_row * _PCD_ASCII_BYTES_PER_VALUE + 4096, _PCD_MAX_ASCII)
            if size - header_end > limit:
                raise InputError(f"{what} {shown}: {size - header_end} bytes of ASCII data, more than "
                                 f"{limit} for POINTS {points} of {per_row} values")
            return _pcd_ascii(f, dtype, points, columns, shown, what)
        except OSError as exc:
            raise InputError(f"{what} {shown} cannot be read: {exc.strerror or exc}") from None


def _pcd_header(f: IO[bytes], shown: str, what: str) -> tuple[dict[str, list[str]], int]:
    header: dict[str, list[str]] = {}
    consumed = 0
    while True:
        line = f.readline(_PCD_MAX_HEADER)
        consumed += len(line)
        if not line:
            raise InputError(f"{what} {shown} is not a PCD file: the header has no DATA line")
        if consumed > _PCD_MAX_HEADER:
            raise InputError(f"{what} {shown} is not a PCD file: no DATA line in the first {_PCD_MAX_HEADER} bytes")
        text = line.decode("ascii", errors="replace").strip()
        if not text or text.startswith("#"):
            continue
        key, *values = text.split()
        if key not in _PCD_KEYS:
            raise InputError(f"{what} {shown} is not a PCD file: unexpected header line {safe_repr(text, 60)}")
        if key in header:
            raise InputError(f"{what} {shown}: header key {key} appears twice")
        header[key] = values
        if key == "DATA":
            return header, consumed


def _pcd_int(header: dict[str, list[str]], key: str, shown: str, what: str) -> int:
    values = header.get(key)
    if values is None:
        raise InputError(f"{what} {shown}: header key {key} is missing")
    if len(values) != 1 or not values[0].isdigit():
        raise InputError(f"{what} {shown}: header {key} {safe_repr(' '.join(values), 40)} is not a count")
    return int(values[0])


def _pcd_layout(header: dict[str, list[str]], shown: str, what: str) -> tuple[np.dtype, int, str]:
    data_kind = header["DATA"][0].lower() if header["DATA"] else ""
    if data_kind == "binary_compressed":
        raise InputError(
            f"{what} {shown}: DATA binary_compressed is not supported; re-save it as binary or ascii "
            "(e.g. pcl_convert_pcd_ascii_binary in.pcd out.pcd 1)"
        )
    if data_kind not in ("ascii", "binary"):
        raise InputError(f"{what} {shown}: DATA {safe_repr(' '.join(header['DATA']), 40)}; expected ascii or binary")
    for key in ("FIELDS", "SIZE", "TYPE"):
        if key not in header:
            raise InputError(f"{what} {shown}: header key {key} is missing")
    fields, sizes, types = header["FIELDS"], header["SIZE"], header["TYPE"]
    counts = header.get("COUNT", ["1"] * len(fields))
    if not (len(fields) == len(sizes) == len(types) == len(counts)) or not fields:
        raise InputError(
            f"{what} {shown}: header has {len(fields)} FIELDS, {len(sizes)} SIZE, {len(types)} TYPE "
            f"and {len(counts)} COUNT values; expected the same number"
        )
    named = [field for field in fields if field != _PCD_PADDING]
    if len(set(named)) != len(named):
        raise InputError(f"{what} {shown}: FIELDS {safe_repr(' '.join(fields), 80)} repeats a name")
    fields = [f"{field} {i}" if field == _PCD_PADDING else field for i, field in enumerate(fields)]  # unique
    parts: list[tuple[str, str, tuple[int, ...]]] = []
    for field, size, kind, count in zip(fields, sizes, types, counts):
        code = _PCD_TYPES.get((kind.upper(), int(size) if size.isdigit() else -1))
        if code is None:
            raise InputError(f"{what} {shown}: field {safe_repr(field, 40)} has TYPE {safe_repr(kind, 10)} "
                             f"SIZE {safe_repr(size, 10)}; expected F 4/8, I or U 1/2/4/8")
        if not count.isdigit() or not 1 <= int(count) <= _PCD_MAX_COUNT:
            raise InputError(f"{what} {shown}: field {safe_repr(field, 40)} has COUNT {safe_repr(count, 10)}")
        parts.append((field, "<" + code, (int(count),) if int(count) > 1 else ()))
    dtype = np.dtype([(name, code, shape) if shape else (name, code) for name, code, shape in parts])
    width, height = _pcd_int(header, "WIDTH", shown, what), _pcd_int(header, "HEIGHT", shown, what)
    points = _pcd_int(header, "POINTS", shown, what) if "POINTS" in header else width * height
    if points != width * height:
        raise InputError(f"{what} {shown}: POINTS {points} but WIDTH {width} x HEIGHT {height} = {width * height}")
    if points > MAX_FRAME_POINTS:
        raise InputError(f"{what} {shown}: POINTS {points}, more than the limit of {MAX_FRAME_POINTS} points a frame")
    return dtype, points, data_kind


#: The names a .pcd's intensity field goes by, the first found taken: PCL's, its short form, and KITTI's own
#: word for the value (what KITTI-to-PCD converters write).
_PCD_INTENSITY_FIELDS = ("intensity", "i", "reflectance")


def _pcd_columns(dtype: np.dtype, shown: str, what: str) -> list[str]:
    """Names of the x, y, z and intensity fields, in that order (each must have COUNT 1)."""
    names = list(dtype.names or ())
    inten = next((n for n in _PCD_INTENSITY_FIELDS if n in names), None)
    missing = [n for n in ("x", "y", "z") if n not in names] + ([] if inten else [
        f"intensity (or {' or '.join(_PCD_INTENSITY_FIELDS[1:])})"])
    if missing:
        raise InputError(
            f"{what} {shown}: FIELDS {safe_repr(' '.join(names), 80)} lack {', '.join(missing)}"
        )
    chosen = ["x", "y", "z", str(inten)]
    for name in chosen:
        if dtype[name].shape:
            raise InputError(f"{what} {shown}: field {name} has COUNT {dtype[name].shape[0]}, expected 1")
    return chosen


def _pcd_ascii(f: IO[bytes], dtype: np.dtype, points: int, columns: list[str], shown: str,
               what: str) -> np.ndarray:
    """The ASCII data rows after the header, parsed block by block into the (N, 4) float32 result, so
    memory stays near the result's size (a whole-file parse of a 2 GiB file would take ~6 GiB)."""
    names = list(dtype.names or ())
    starts = np.cumsum([0] + [int(np.prod(dtype[n].shape)) for n in names])
    per_row = int(starts[-1])
    wanted = [int(starts[names.index(c)]) for c in columns]
    out = np.empty((points, 4), dtype=np.float32)
    rows, rest = 0, b""
    while True:
        block = f.read(_PCD_ASCII_BLOCK)
        data = rest + block
        cut = len(data) if not block else data.rfind(b"\n") + 1
        rest = data[cut:]
        lines = [line for line in data[:cut].decode("ascii", errors="replace").splitlines() if line.strip()]
        if lines:
            if rows + len(lines) > points:
                raise InputError(f"{what} {shown}: more ASCII data rows than POINTS {points}")
            table = _ascii_table(lines, per_row)
            if table is None:
                bad = _first_bad_line(lines, per_row)
                raise InputError(f"{what} {shown}: bad ASCII data at row {rows + bad + 1} of {points} (the first "
                                 f"after DATA is row 1): {safe_repr(lines[bad], 80)} is not {per_row} numbers")
            out[rows:rows + len(lines)] = table[:, wanted]
            rows += len(lines)
        if not block:
            break
    if rows != points:
        raise InputError(f"{what} {shown}: {rows} ASCII data rows, but POINTS is {points} (truncated)")
    return out


def _ascii_table(lines: list[str], per_row: int) -> np.ndarray | None:
    """ASCII data lines as a (rows, per_row) float64 table, or None where one is not ``per_row`` numbers."""
    try:
        table = np.loadtxt(lines, dtype=np.float64, ndmin=2, comments=None)
    except ValueError:
        return None
    return table if table.shape[1] == per_row else None


def _first_bad_line(lines: list[str], per_row: int) -> int:
    """Index of the first of ``lines`` (a block that ``_ascii_table`` refused) that is not ``per_row``
    numbers, found by bisecting with the same parser: np.loadtxt's own row numbers count from the block
    start, and from 0 or 1 depending on the error."""
    good, bad = 0, len(lines)  # lines[:good] parse; lines[:bad] do not
    while bad - good > 1:
        middle = (good + bad) // 2
        if _ascii_table(lines[:middle], per_row) is None:
            bad = middle
        else:
            good = middle
    return bad - 1
