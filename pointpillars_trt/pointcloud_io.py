"""Lidar frame files -> (N, columns) float32 rows x, y, z, intensity[, time]: KITTI-style ``.bin``,
``.npy`` and ``.pcd``.

Every reader refuses, before reading data, anything that is not a regular file (a FIFO,
/dev/zero, a directory) and any frame of more than ``MAX_FRAME_POINTS`` points, so memory stays
bounded and nothing blocks. Values are not checked: NaN/inf rows are kept (the detector drops
and counts them). Errors are one-line :class:`InputError` messages naming the file. What a file says that
the read leaves unapplied (a ``.pcd``'s sensor pose, its VIEWPOINT) is said (``ViewpointNote``).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import math
import os
import re
import struct
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Union

import numpy as np

from .config import POINT_COLUMN_NAMES, finite_float, int_within
from .errors import InputError, InputWarning, escape_text, one_line, safe_repr
from .file_reads import (open_regular_fd, open_regular_file, overlong_number, read_error, read_regular_file,
                         read_size_error, said_empty_error, special_kind, text_lines)
from .point_layout import (ROW_LAYOUTS, TEXT_SNIFF, CaptureTimesNote, check_layout, check_time_lags, looks_like_noise,
                           misread_row_length, refuse_noise, refuse_other_formats, row_layout)
from .points import (MAX_FRAME_POINTS, MAX_POINT_DIM, MULTI_SWEEP_FIX, SUPPORTED_EXTENSIONS, beyond_float32,
                     cast_to_float32, columns_text, copy_leading_columns, lacking_text, named_columns, structured_fix,
                     transposed_hint, wide_rows_problem)

PathLike = Union[str, "os.PathLike[str]"]
#: Told, in one line naming the file (``viewpoint_text``), of a ``.pcd`` VIEWPOINT that is not the identity,
#: which the read leaves unapplied; None: said as an :class:`InputWarning`.
ViewpointNote = Callable[[str], None]


_NPY_MAX_HEADER = 1 << 16
_PCD_MAX_HEADER = 1 << 16
_NPY_MAX_BYTES = _NPY_MAX_HEADER + MAX_FRAME_POINTS * 8 * 8  # 16 Mi points of 8 float64 columns: 1 GiB
_PCD_MAX_BINARY = MAX_FRAME_POINTS * 64  # 1 GiB of binary point data
_PCD_MAX_ASCII = 2**31  # 2 GiB of ASCII point data
_PCD_MAX_COUNT = 4096  # values in one field of a point (PCL's largest stock field, a histogram, has 352)
_PCD_MAX_ROW_VALUES = 8192  # values of a point's fields together: a wider row is no point cloud's (and an ASCII
# row's length bound, which grows with it, kept parsing a file of no line break for minutes in gigabytes)
_PCD_ASCII_BYTES_PER_VALUE = 32  # bound on an ASCII PCD's data: POINTS * values * this
_PCD_ASCII_BLOCK = 2**20  # bytes of ASCII data parsed at a time (~20-60 k rows)
_PCD_SPACES = " \t"  # what separates an ASCII row's numbers (as PCL splits them); a line of these alone is blank
#: Control characters that Python's whitespace and NumPy's parser take for a space between numbers (and
#: str.splitlines, but for \x1f, for a line break) and PCL does not: in an ASCII row each is a character of a value.
_PCD_NOT_SPACES = "\x0b\x0c\x1c\x1d\x1e\x1f"
#: A control character but the tab (spaces and tabs separate a header line's values, as PCL splits them): in a
#: header line, one holding it is a bad line (Python's str.split took \x0b, \x0c and \x1c to \x1f for spaces).
_PCD_HEADER_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


# --------------------------------------------------------------------------- entry point

_LAS_TO_NPY = ("save its x, y, z, intensity as a float32 .npy (laspy{}: las = laspy.read(path); np.save('frame.npy', "
               "np.column_stack([las.x, las.y, las.z, las.intensity]).astype(np.float32)))")

#: What to do with files of the point formats users have that are not read, by extension.
POINT_FORMAT_CONVERSIONS = {
    ".npz": "save the frame's array from the archive as .npy (np.save('frame.npy', np.load(path)[name]))",
    ".ply": "convert it to .pcd (e.g. pcl_ply2pcd in.ply out.pcd) or to a float32 .bin or .npy of x, y, z, intensity",
    ".las": _LAS_TO_NPY.format(""),
    ".laz": _LAS_TO_NPY.format(" with a LAZ backend, pip install 'laspy[lazrs]'"),
}


def unsupported_extension(ext: str) -> str:
    """What a file of extension ``ext`` (none: "") is not, with the extensions point files have, and for a
    point format that is not read, how to convert it."""
    kind = f"extension {safe_repr(ext, 24)}" if ext else "no extension"
    convert = POINT_FORMAT_CONVERSIONS.get(ext.lower())
    return f"{kind}; supported: {', '.join(SUPPORTED_EXTENSIONS)}" + (f"; {convert}" if convert else "")


def read_points(
    path: PathLike, *, point_dim: int = 4, intensity_scale: float | None = None, columns: int | None = None,
    viewpoint_note: ViewpointNote | None = None, capture_times_note: CaptureTimesNote | None = None,
) -> np.ndarray:
    """Read a lidar frame file as a C-contiguous (N, columns) float32 array of x, y, z, intensity
    (and, for ``columns`` 5, each point's time lag: ``ModelConfig.point_columns``). ``columns``
    defaults to 5 for ``point_dim`` 5 (a multi-sweep model's x, y, z, intensity, time), else 4.

    The format follows the extension (case-insensitive):

    * ``.bin``: little-endian float32 rows of ``point_dim`` values (4 for KITTI, 5 for
      nuScenes-style x, y, z, intensity, time); the first ``columns`` are kept. A size that is
      not a multiple of ``4 * point_dim`` bytes is an error naming the size, and a file of 5 values
      a point read as 4, or of 4 read as 5, or of 3 (no intensity) as either, is refused naming what
      fits; so is a file of float64 values or of bytes that are no float32 coordinates (``point_layout``).
      0 bytes = empty frame.
    * ``.npy``: a 2-D float32/float64 array (N, columns..MAX_POINT_DIM), first ``columns`` kept; other dtypes,
      other shapes, a (4, N) array ("looks transposed") and rows wider than a point (an image) are refused.
      Never unpickles.
    * ``.pcd``: ASCII, binary or binary_compressed (PCL's LZF) ``DATA`` with fields x, y, z and intensity (or
      i, or reflectance), and for ``columns`` 5 time (or timestamp, or time_lag), any case. The points come as stored, in the file's own frame: a
      ``VIEWPOINT`` (the sensor's pose) other than the identity is not applied, as PCL's loader does not
      apply it, and is told to ``viewpoint_note`` (None: an :class:`InputWarning`); a malformed one is refused.

    ``intensity_scale`` (e.g. 1/255 for 8-bit intensities, see ``intensities.intensity_mismatch``)
    multiplies the 4th column after reading.

    For ``columns`` 5 the 5th values are checked as time lags (``point_layout.check_time_lags``): values of
    another kind are refused, and per-point capture times within a sweep are told to ``capture_times_note``
    (None: an :class:`InputWarning`).

    Only :class:`InputError` leaves this function: any other exception a reader raises (a bug, or a
    file shaped in a way no check foresaw) becomes one naming the file, so no reader can end a run.
    """
    if columns is None:
        columns = 5 if point_dim == 5 else 4
    if int_within(columns, 4, MAX_POINT_DIM) is None:
        raise InputError(f"columns {safe_repr(columns)}: expected the model's values a point, 4 (x, y, z, intensity) "
                         f"to {MAX_POINT_DIM}")
    with _fails_alone(path):
        return _read_points(path, point_dim=point_dim, intensity_scale=intensity_scale, columns=columns,
                            viewpoint_note=viewpoint_note, capture_times_note=capture_times_note)


@contextlib.contextmanager
def _fails_alone(path: PathLike) -> Iterator[None]:
    """The reader boundary: any exception but an InputError (a bug, or a file shaped in a way no check foresaw)
    becomes one naming the file, so no reader can end a run."""
    try:
        yield
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a file does, it fails alone
        raise InputError(f"point file {safe_repr(path)} cannot be read ({one_line(exc, 100, typed=True)})") from None


def _read_points(path: PathLike, *, point_dim: int, intensity_scale: float | None, columns: int,
                 viewpoint_note: ViewpointNote | None, capture_times_note: CaptureTimesNote | None) -> np.ndarray:
    ext = os.path.splitext(os.fsdecode(path))[1].lower()
    if ext == ".bin":
        points = read_bin(path, point_dim=point_dim, columns=columns, capture_times_note=capture_times_note)
    elif ext == ".npy":
        points = read_npy(path, columns=columns, capture_times_note=capture_times_note)
    elif ext == ".pcd":
        if columns > len(POINT_COLUMN_NAMES):
            raise InputError(f"point file {safe_repr(path)}: .pcd frames are read by their fields' names, at most "
                             f"{columns_text(len(POINT_COLUMN_NAMES))}; this model reads {columns} values a point: "
                             "use .bin or .npy")
        points = read_pcd(path, columns=columns, viewpoint_note=viewpoint_note, capture_times_note=capture_times_note)
    elif not os.path.lexists(path):
        raise InputError(f"point file {safe_repr(path)}: no such file or folder")
    elif os.path.isdir(path):
        raise InputError(f"point file {safe_repr(path)} is a folder, not a point file: pass its files, e.g. "
                         f"sorted(Path({safe_repr(os.fsdecode(path))}).glob('*{_first_extension_in(path)}'))")
    elif (kind := special_kind(path)) is not None:  # /dev/zero, /dev/stdin: what it is, not its missing extension
        raise InputError(f"point file {safe_repr(path)} is {kind}, not a regular file")
    else:
        raise InputError(f"point file {safe_repr(path)} has {unsupported_extension(ext)}")
    if intensity_scale is not None:
        points[:, 3] *= np.float32(checked_intensity_scale(intensity_scale))
    return points


def _first_extension_in(folder: PathLike, limit: int = 1000) -> str:
    """The point-file extension of the first such file among ``folder``'s first ``limit`` entries (.bin when
    none is), for a message naming how to list them."""
    try:
        with os.scandir(folder) as entries:
            for entry in itertools.islice(entries, limit):
                ext = os.path.splitext(os.fsdecode(entry.name))[1].lower()
                if ext in SUPPORTED_EXTENSIONS:
                    return ext
    except OSError:
        pass
    return ".bin"


#: Largest intensity scale taken (0-255 -> 0-1 is 1/255, the reverse 255): more would push intensities
#: past float32's range.
MAX_INTENSITY_SCALE = 1000.0
#: The least: 1/65535 (16-bit intensities to 0-1) and a margin; below it every intensity is about 0 (1e-300 is
#: exactly 0 in float32), which no model reads as an intensity.
MIN_INTENSITY_SCALE = 1e-6


def checked_intensity_scale(intensity_scale: object) -> float:
    """``intensity_scale`` as the float it is (a Fraction, a 0-d array too; not a bool), when finite and in
    [MIN_INTENSITY_SCALE, MAX_INTENSITY_SCALE]."""
    scale = finite_float(intensity_scale)
    if scale is None or not MIN_INTENSITY_SCALE <= scale <= MAX_INTENSITY_SCALE:
        raise InputError(f"intensity scale {safe_repr(intensity_scale)}: expected a number in "
                         f"[{MIN_INTENSITY_SCALE:g}, {MAX_INTENSITY_SCALE:g}]")
    return scale


#: Gives the (n, 4) float32 rows a frame of n points is read into, or None where there is no room.
Allocate = Callable[[int], Union[np.ndarray, None]]


def read_points_into(
    path: PathLike, allocate: Allocate, *, point_dim: int = 4, intensity_scale: float | None = None,
    columns: int = 4, viewpoint_note: ViewpointNote | None = None, capture_times_note: CaptureTimesNote | None = None,
) -> np.ndarray:
    """:func:`read_points`, with the points landing in the rows ``allocate(n)`` gives (e.g. pinned
    host memory the GPU copies from): a KITTI ``.bin`` of 4 values a point is read straight into
    them, every other file parsed and then copied in once. Returns those rows, or (when
    ``allocate`` has no room) an array of its own. The rows hold 4 columns: a model of other point
    columns (``columns``) gets an array of its own. Only :class:`InputError` leaves it, as from :func:`read_points`."""
    require_point_dim(point_dim)  # of a .bin's rows against the model's columns: at its read
    if columns != 4:
        return read_points(path, point_dim=point_dim, intensity_scale=intensity_scale, columns=columns,
                           viewpoint_note=viewpoint_note, capture_times_note=capture_times_note)
    with _fails_alone(path):
        return _read_points_into(path, allocate, point_dim, intensity_scale, viewpoint_note)


def _read_points_into(path: PathLike, allocate: Allocate, point_dim: int, intensity_scale: float | None,
                      viewpoint_note: ViewpointNote | None) -> np.ndarray:
    ext = os.path.splitext(os.fsdecode(path))[1].lower()
    if ext == ".bin" and point_dim != 4:  # wider rows: their first 4 values copied in, once
        return _bin_into(_read_frame_bytes(path, 4 * point_dim, "point file"), allocate, point_dim, intensity_scale,
                         path, 4)
    if ext != ".bin":
        points = read_points(path, point_dim=point_dim, intensity_scale=intensity_scale, columns=4,
                             viewpoint_note=viewpoint_note)
        rows = allocate(len(points))
        if rows is None:
            return points
        rows[...] = points
        return rows
    fd, opened = open_regular_fd(path, max_bytes=2**62, what="point file")
    size = opened.st_size
    try:
        if not size:  # says it is empty, and may not be (procfs, some FUSE mounts): read as read_bin reads it
            return _bin_into(_read_frame_bytes(path, 16, "point file"), allocate, 4, intensity_scale, path, 4)
        _check_bin_size(path, size, 4, "point file",
                        head=lambda: _read_head(fd, path, "point file"))
        count = size // 16
        rows = allocate(count)
        target = rows if rows is not None else np.empty((count, 4), np.float32)
        got = _read_fully(fd, memoryview(target).cast("B"), path, "point file")  # type: ignore[arg-type]
        if got == size and _read_fully(fd, memoryview(bytearray(1)), path, "point file"):
            got += 1  # a byte past its size: it grew while being read, and the rows hold its start only
        if got != size:
            raise read_size_error("point file", path, fd, opened, got)
    finally:
        os.close(fd)
    check_layout(target.reshape(-1), 4, path, "point file")
    if intensity_scale is not None:
        target[:, 3] *= np.float32(checked_intensity_scale(intensity_scale))
    return target


def _read_fully(fd: int, target: memoryview, path: PathLike, what: str) -> int:
    """Read into ``target`` until it is full or the file ends (a read may return less than asked); an OSError
    becomes the InputError of ``what`` at ``path``."""
    try:
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
    except OSError as exc:
        raise read_error(what, path, exc) from None


def _read_head(fd: int, path: PathLike, what: str) -> bytes:
    """The first ``_MISFIT_HEAD_BYTES`` bytes (fewer if it is shorter) of the file ``fd`` opened and not read yet."""
    head = bytearray(_MISFIT_HEAD_BYTES)
    return bytes(head[: _read_fully(fd, memoryview(head), path, what)])


def read_bin_bytes_into(data: bytes, allocate: Allocate, *, point_dim: int = 4,
                        intensity_scale: float | None = None, source: str = "point file",
                        columns: int = 4, capture_times_note: CaptureTimesNote | None = None) -> np.ndarray:
    """A ``.bin`` frame already in memory (e.g. read from object storage) into the rows ``allocate``
    gives, checked as :func:`read_bin` checks a file; a model of other point ``columns`` (e.g. 5, with
    the time lag) gets an array of its own, as from :func:`read_points_into`."""
    require_point_dim(point_dim, columns)
    return _bin_into(data, allocate, point_dim, intensity_scale, source, columns, capture_times_note)


def _bin_into(data: bytes | np.ndarray, allocate: Allocate, point_dim: int, intensity_scale: float | None,
              source: PathLike, columns: int, capture_times_note: CaptureTimesNote | None = None) -> np.ndarray:
    """A ``.bin`` frame's bytes, checked (``_bin_points``), with their first ``columns`` values a point copied into
    the rows ``allocate`` gives (a model of 4 columns; else, or without room, an array of their own)."""
    points = _bin_points(data, point_dim, columns, source, "point file", capture_times_note)
    rows = allocate(len(points)) if columns == 4 else None
    target = rows if rows is not None else np.empty((len(points), columns), np.float32)
    copy_leading_columns(target, points)
    if intensity_scale is not None:
        target[:, 3] *= np.float32(checked_intensity_scale(intensity_scale))
    return target


def _check_bin_size(path: PathLike, size: int, point_dim: int, what: str, columns: int = 4, *,
                    head: Callable[[], bytes]) -> None:
    """Whole rows of ``point_dim`` float32 values, at most MAX_FRAME_POINTS of them (``columns``: the
    values a point the model reads, for the advice). A size that fits no rows: the file is refused for what
    its first bytes (``head()``) show (``_refuse_misfit_content``), else for its size, with the row length
    those bytes have when the size fits it, or else the row lengths the size fits."""
    row = 4 * point_dim
    if size % row:
        words = _refuse_misfit_content(path, head()[:_MISFIT_HEAD_BYTES], what)
        raise InputError(f"{what} {safe_repr(path)} is {size} bytes, not a multiple of {row} "
                         f"({point_dim} float32 values a point){_other_dim_hint(size, point_dim, columns, words)}")
    refuse_oversize(path, size, row, what)


def refuse_oversize(path: PathLike, size: int, row_bytes: int, what: str) -> None:
    """Refuse a frame of more than MAX_FRAME_POINTS rows of ``row_bytes``, by its size in points."""
    if size > MAX_FRAME_POINTS * row_bytes:
        raise InputError(f"{what} {safe_repr(path)} is {size} bytes ({size // row_bytes} points), "
                         f"more than the limit of {MAX_FRAME_POINTS} points a frame")


# --------------------------------------------------------------------------- .bin

def read_bin(path: PathLike, *, point_dim: int = 4, what: str = "point file", columns: int = 4,
             capture_times_note: CaptureTimesNote | None = None) -> np.ndarray:
    """A raw little-endian float32 file of ``point_dim`` values a point -> (N, columns) float32."""
    require_point_dim(point_dim, columns)
    points = _bin_points(_read_frame_bytes(path, 4 * int(point_dim), what), point_dim, columns, path, what,
                         capture_times_note)
    if points.flags.c_contiguous:  # the rows are the columns kept: a view of the file's own (writable) buffer
        return points
    kept = np.empty(points.shape, np.float32)
    copy_leading_columns(kept, points)
    return kept


def require_point_dim(point_dim: object, columns: int = 4) -> None:
    """``point_dim``: an integer from 4 to MAX_POINT_DIM that holds the model's ``columns`` values a point (the
    default, 4: any model's x, y, z and intensity; ``.npy`` and ``.pcd`` files carry their own row length)."""
    dim = int_within(point_dim, 4, MAX_POINT_DIM)
    if dim is None:
        raise InputError(f"point_dim {safe_repr(point_dim)} is not an integer from 4 to {MAX_POINT_DIM} (x, y, z, "
                         "intensity, ...: values a point of the .bin files)")
    if dim < columns:
        fix = (f"files of {columns} values a point are read with point_dim {columns} (--point-dim {columns}); "
               f"{MULTI_SWEEP_FIX}" if columns == 5 else f"read its frames with point_dim {columns} (--point-dim {columns})")
        raise InputError(f"point_dim {dim}: the model reads {columns} values a point ({columns_text(columns)}); {fix}")


def _bin_points(data: bytes | np.ndarray, point_dim: int, columns: int, source: PathLike, what: str,
                capture_times_note: CaptureTimesNote | None = None) -> np.ndarray:
    """The first ``columns`` of a ``.bin`` frame's ``point_dim`` little-endian float32 values a point (a
    view of ``data``), checked: whole rows, at most MAX_FRAME_POINTS, and the layout (``check_layout``)."""
    _check_bin_size(source, len(data), int(point_dim), what, columns, head=lambda: bytes(data[:_MISFIT_HEAD_BYTES]))
    values = np.frombuffer(data, dtype="<f4")
    check_layout(values, int(point_dim), source, what, columns, capture_times_note)
    return values.reshape(-1, int(point_dim))[:, :columns]


#: Bytes of a file of a size that fits no rows looked at for what it is (the noise check's samples are smaller).
_MISFIT_HEAD_BYTES = 1 << 17


def _refuse_misfit_content(path: PathLike, head: bytes, what: str) -> np.ndarray:
    """Before the size error of a file whose size fits no rows of its row length, refuse it for what its
    first bytes show: another format (text, .npy, PCD, PLY), or no float32 coordinates read as rows of any
    length (3, 4 or 5 values: a 5th may be a large timestamp). Random bytes fit some other row length by
    chance, and the size error would point there. Returns those bytes' float32 values."""
    refuse_other_formats(path, head[:TEXT_SNIFF], what)
    words = np.frombuffer(head, "<f4", count=len(head) // 4)
    with np.errstate(all="ignore"):
        if all(looks_like_noise(words, n) for n in ROW_LAYOUTS):
            refuse_noise(words, 4, path, what)
    return words


def _other_dim_hint(size: int, point_dim: int, columns: int, words: np.ndarray) -> str:
    """The size error's pointer to the row length the file's first values (``words``) have, when its size
    fits it, else to the row lengths (3, 4 or 5 values a point) the size fits, if any; rows shorter than the
    model's ``columns`` get what such a model needs instead of --point-dim. Rows wider than 5 get the pointer
    to the row length their first values have only (a wide file cut short fits rows of 4 as often as not)."""
    whole = math.lcm(point_dim, *ROW_LAYOUTS)  # whole rows of point_dim and of every layout that may be seen
    seen = misread_row_length(words[: words.size // whole * whole], point_dim)
    if point_dim > 5 and seen is None:
        return ""
    fits = [seen] if seen is not None and size % (4 * seen) == 0 else \
        sorted((n for n in ROW_LAYOUTS if n != point_dim and size % (4 * n) == 0), key=lambda n: n == 3)
    if not fits:
        return "; it fits no rows of 3, 4 or 5 float32 values: is it a point file, or one cut short?"

    def advice(n: int) -> str:
        if n == 3:
            return "; the model needs intensities)"
        if n < columns:
            return f"; this model reads {columns} a point ({columns_text(columns)}): {MULTI_SWEEP_FIX})"
        return f": if so, pass --point-dim {n}; Python: point_dim={n})"  # the readers serve the API too

    return (f"; its size fits {' or '.join(f'rows of {n} values ({row_layout(n)}{advice(n)}' for n in fits)}, "
            "unless the file was cut short (a copy that failed?)")


def _read_frame_bytes(path: PathLike, row_bytes: int, what: str) -> np.ndarray:
    """All bytes of a regular file of at most MAX_FRAME_POINTS rows, refused by its size (in points) before
    anything is read, as uint8 NumPy views writable: no copy makes them an array the caller may scale. The
    buffer is not zeroed first (a ``bytearray`` is: ~0.2 ms more for a 5 MB multi-sweep frame)."""
    fd, opened = open_regular_fd(path, max_bytes=2**62, what=what)
    size = opened.st_size
    try:
        refuse_oversize(path, size, row_bytes, what)
        if not size:  # says it is empty, and may not be (procfs, some FUSE mounts): read up to the limit
            return np.frombuffer(bytearray(read_regular_file(path, max_bytes=MAX_FRAME_POINTS * row_bytes, what=what)),
                                 np.uint8)
        data = np.empty(size + 1, np.uint8)  # a byte more than the size: a file that grew while read is refused
        got = _read_fully(fd, data.data, path, what)
        if got != size:  # one that shrank (written over meanwhile) would give the points it had left, a frame's look
            raise read_size_error(what, path, fd, opened, got)
    finally:
        os.close(fd)
    return data[:got]


# --------------------------------------------------------------------------- .npy

#: The fix for a file of binary points whose size says 0 (``said_empty_error``).
_READ_A_COPY = "copy it to a regular file (cp) to read it"


def read_npy(path: PathLike, *, columns: int = 4, capture_times_note: CaptureTimesNote | None = None) -> np.ndarray:
    """A NumPy .npy array (N, >=columns) float32/float64 -> (N, columns) float32; read without unpickling,
    the header checked before any data is read."""
    shown, what = safe_repr(path), "point file"
    f, size = open_regular_file(path, max_bytes=_NPY_MAX_BYTES, what=what)
    with f:
        try:
            shape, fortran, dtype = _npy_header(f)
            header_end = f.tell()
        except OSError as exc:
            raise read_error(what, path, exc) from None
        except _ZipArchive:
            raise InputError(f"{what} {shown} is a zip archive (an .npz of arrays, named .npy), not a .npy file: "
                             f"{POINT_FORMAT_CONVERSIONS['.npz']}") from None
        except _NoBytes:
            raise _empty_file_error(f"{what} {shown}", ".npy") from None
        except Exception as exc:  # noqa: BLE001 - literal_eval/descr_to_dtype raise many kinds (RecursionError too)
            raise InputError(f"{what} {shown} is not a valid .npy file: {one_line(exc, 100)}") from None
        if dtype.fields is not None and not dtype.hasobject:
            fix = structured_fix(dtype, columns, "np.load(path)", "re-save them with np.save(path, {})")
            raise InputError(f"{what} {shown} holds a structured array, shape {shape}; expected float32 or float64 "
                             f"(N, {columns}) columns; {fix}")
        if dtype.hasobject or dtype.subdtype is not None:
            raise InputError(f"{what} {shown} holds dtype {_dtype_text(dtype)}, shape {shape}; expected float32 or float64 (N, 4)")
        hint = transposed_hint(shape)
        if columns == 5 and len(shape) == 2 and shape[1] == 4:
            hint = f"; single sweeps? this model reads {columns_text(columns)}: {MULTI_SWEEP_FIX}"
        if len(shape) != 2 or shape[1] < columns or hint:
            raise InputError(
                f"{what} {shown} holds shape {shape}, dtype {_dtype_text(dtype)}; "
                f"expected (N, {columns}) or more columns of {columns_text(columns)}{hint}"
            )
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise InputError(f"{what} {shown} holds dtype {_dtype_text(dtype)}, shape {shape}; expected float32 or float64")
        wide = wide_rows_problem(shape[1], columns)
        if wide is not None:  # an image (a lidar's range image: beams x azimuths) would read as a few points
            raise InputError(f"{what} {shown} holds shape {shape}: {wide}")
        if shape[0] > MAX_FRAME_POINTS:
            raise InputError(f"{what} {shown} holds {shape[0]} points, more than the limit of {MAX_FRAME_POINTS} points a frame")
        expected = shape[0] * shape[1] * dtype.itemsize
        if not size:  # its data is checked by the file's size, which counts none of its bytes
            raise said_empty_error(f"{what} {shown}", f"a .npy header: {_READ_A_COPY}")
        if size - header_end != expected:
            raise InputError(
                f"{what} {shown} has {size - header_end} data bytes, its header (shape {shape}, "
                f"dtype {_dtype_text(dtype)}) says {expected}"
            )
        try:
            data = f.read(expected)
        except OSError as exc:
            raise read_error(what, path, exc) from None
    if len(data) != expected:
        raise InputError(f"{what} {shown} was truncated while being read")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    points = np.empty((shape[0], columns), np.float32)  # a writable copy, native byte order
    cast_to_float32(points, arr[:, :columns], f"{what} {shown}")
    _check_named_time_lags(points, path, what, capture_times_note)
    return points


def _check_named_time_lags(points: np.ndarray, path: PathLike, what: str,
                           capture_times_note: CaptureTimesNote | None) -> None:
    """A multi-sweep model's frame from a file of named columns (.npy, .pcd) with its 5th values checked as time
    lags, as a .bin's are with its layout (``check_layout``)."""
    if points.shape[1] == 5:
        check_time_lags(points.reshape(-1), 5, f"{what} {safe_repr(path)}", capture_times_note)


class _ZipArchive(ValueError):
    """A file of a zip archive's magic bytes where a .npy header belongs: np.savez's .npz, named .npy."""


class _NoBytes(ValueError):
    """A .npy file without a byte where its header belongs."""


def _empty_file_error(where: str, kind: str) -> InputError:
    """The error of the file ``where`` ("point file 'x.npy'") that holds no byte, where a ``kind`` file's header
    belongs: said empty, as an empty .bin is (its header's missing magic number or DATA line reads as another
    format's file)."""
    return InputError(f"{where} is empty (0 bytes), not a {kind} file: a copy that failed? copy it again")


def _npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of an .npy stream positioned at its start; a literal header
    parse (ast.literal_eval), never a pickle."""
    magic = f.read(8)
    if not magic:
        raise _NoBytes
    if magic.startswith(b"PK\x03\x04"):
        raise _ZipArchive
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
    text = raw.decode("utf-8" if major == 3 else "latin1")
    digits = overlong_number(text)
    if digits is not None:
        raise ValueError(f"its header holds a number of {digits} digits: not a size")
    try:
        header = ast.literal_eval(text)
    except ValueError:  # its own words name a parse node by its address: "<ast.Call object at 0x7f...>"
        raise ValueError("header is not a Python literal (a dict of descr, fortran_order and shape)") from None
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


# --------------------------------------------------------------------------- .pcd

_PCD_TYPES: dict[tuple[str, int | None], str] = {
    ("F", 4): "f4", ("F", 8): "f8", ("I", 1): "i1", ("I", 2): "i2", ("I", 4): "i4", ("I", 8): "i8",
    ("U", 1): "u1", ("U", 2): "u2", ("U", 4): "u4", ("U", 8): "u8",
}
_PCD_KEYS = ("VERSION", "FIELDS", "SIZE", "TYPE", "COUNT", "WIDTH", "HEIGHT", "VIEWPOINT", "POINTS", "DATA")
#: PCL's name for padding bytes, which a header may repeat (Ouster's and pcl_ros' clouds pad several fields).
_PCD_PADDING = "_"
#: A VIEWPOINT value: a decimal number as PCL writes one (no nan, inf, hex or ``1_0``).
_PCD_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
#: The VIEWPOINT of a cloud whose points need no moving (PCL's default): tx ty tz 0, quaternion qw qx qy qz 1 0 0 0
#: or its negation, the same rotation; or all zeros, as writers that zero-fill the line write it: a zero
#: quaternion is no rotation at all, so there is no pose to apply (or to advise applying).
_PCD_IDENTITY_VIEWPOINTS = ((0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0),
                            (0.0,) * 7)


def read_pcd(path: PathLike, *, columns: int = 4, viewpoint_note: ViewpointNote | None = None,
             capture_times_note: CaptureTimesNote | None = None) -> np.ndarray:
    """A PCL .pcd file (DATA ascii, binary or binary_compressed) with fields x, y, z and intensity (or i, or reflectance)
    -> (N, 4) float32 in that column order; for ``columns`` 5 (a multi-sweep model) its time field (or timestamp, or
    time_lag) too, checked as time lags, -> (N, 5). Fields are found by these names in any case. SIZE/TYPE/COUNT are checked against each other, POINTS against
    WIDTH * HEIGHT and the data size; DATA binary_compressed (PCL's LZF) is inflated. The points are read as stored, as
    PCL's loader reads them: a VIEWPOINT other than the identity is not applied, but told, once the points are
    read, to ``viewpoint_note`` (None: warned as an InputWarning), since a model that expects them in the
    sensor's pose would see them elsewhere."""
    shown, what = safe_repr(path), "point file"
    f, size = open_regular_file(
        path, max_bytes=_PCD_MAX_HEADER + max(_PCD_MAX_BINARY, _PCD_MAX_ASCII), what=what
    )
    with f:
        try:
            header = _pcd_header(f, shown, what)
            viewpoint = _pcd_viewpoint(header, shown, what)
            points = _pcd_points(f, size, header, columns, shown, what)
        except OSError as exc:
            raise read_error(what, path, exc) from None
    _check_named_time_lags(points, path, what, capture_times_note)
    if viewpoint is not None:
        text = viewpoint_text(path, viewpoint)
        if viewpoint_note is None:
            warnings.warn(text, InputWarning, stacklevel=2)
        else:
            viewpoint_note(text)
    return points


def viewpoint_text(path: PathLike, viewpoint: list[str]) -> str:
    """What a read says of a .pcd whose VIEWPOINT (its values as written) it left unapplied: the file, the pose,
    and how to have the points moved by it."""
    return (f"{safe_repr(path)}: its VIEWPOINT {' '.join(viewpoint)} (the sensor's pose: tx ty tz qw qx qy qz) is "
            "not the identity; its points are read as stored, in the file's own frame, without that pose applied "
            "(as PCL reads them): if the model should see them moved by it, transform them first (p' = R(q) p + t) "
            "and save them with VIEWPOINT 0 0 0 1 0 0 0")


def _pcd_viewpoint(header: _PcdHeader, shown: str, what: str) -> list[str] | None:
    """The header's VIEWPOINT values as written, where they are not the identity (None where they are, or the
    header has none); anything but 7 finite decimal numbers is refused."""
    values = header.values.get("VIEWPOINT")
    if values is None:
        return None
    if len(values) != 7 or not all(_PCD_NUMBER.fullmatch(v) and math.isfinite(float(v)) for v in values):
        raise InputError(f"{what} {shown}: header {header.said('VIEWPOINT', 80)} is not 7 numbers "
                         "(tx ty tz qw qx qy qz: the sensor's position and orientation)")
    return None if tuple(float(v) for v in values) in _PCD_IDENTITY_VIEWPOINTS else values


def _pcd_points(f: IO[bytes], size: int, header: _PcdHeader, width: int, shown: str, what: str) -> np.ndarray:
    """The (N, ``width``) float32 points of a .pcd file ``f`` of ``size`` bytes, read past its ``header``."""
    dtype, points, data_kind = _pcd_layout(header, shown, what)
    columns = _pcd_columns(dtype, width, header, shown, what)
    header_end = header.size
    if not size and data_kind != "ascii":  # binary data is checked by the file's size, which counts none of its bytes
        raise said_empty_error(f"{what} {shown}", f"a .pcd header of DATA {data_kind}: {_READ_A_COPY}")
    if data_kind == "binary_compressed":
        return _pcd_compressed(f, size - header_end, dtype, points, columns, f"{what} {shown}")
    if data_kind == "binary":
        expected = _pcd_binary_bytes(points, dtype, f"{what} {shown}")
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
        out = np.empty((points, len(columns)), dtype=np.float32)
        for col, name in enumerate(columns):
            cast_to_float32(out[:, col], table[name], f"{what} {shown}")
        return out
    if header.lf_left:  # the end of the DATA line's CRLF, not a line of ASCII data
        header_end += 1
        f.seek(header_end)
    per_row = sum(int(np.prod(dtype[n].shape)) for n in dtype.names or ())
    limit = min(points * per_row * _PCD_ASCII_BYTES_PER_VALUE + 4096, _PCD_MAX_ASCII)
    if size - header_end > limit:
        raise InputError(f"{what} {shown}: {size - header_end} bytes of ASCII data, more than "
                         f"{limit} for POINTS {points} of {per_row} values")
    return _pcd_ascii(f, dtype, points, columns, shown, what, size - header_end, header.line_count)


def _pcd_binary_bytes(points: int, dtype: np.dtype, where: str) -> int:
    """The bytes of ``points`` rows of ``dtype``, refused beyond ``_PCD_MAX_BINARY`` (binary data as it lies in the
    file, or as binary_compressed data inflates to)."""
    expected = points * dtype.itemsize
    if expected > _PCD_MAX_BINARY:
        raise InputError(f"{where}: POINTS {points} x {dtype.itemsize} bytes a point is more than the limit of "
                         f"{_PCD_MAX_BINARY} bytes")
    return expected


def _pcd_compressed(f: IO[bytes], available: int, dtype: np.dtype, points: int, columns: list[str],
                    where: str) -> np.ndarray:
    """The (N, len(columns)) float32 points of PCL's ``DATA binary_compressed``: two little-endian uint32 (the compressed and
    the uncompressed size), then the LZF-compressed fields one after another, each as one plane of all the points'
    values (x x x ... y y y ...). ``_`` padding fields have planes of their own or none (PCL's writer leaves them
    out, other writers keep them): the uncompressed size says which."""
    sizes = f.read(8)
    if len(sizes) != 8:
        raise InputError(f"{where}: DATA binary_compressed ends before its two sizes (truncated)")
    compressed, uncompressed = struct.unpack("<II", sizes)
    _pcd_binary_bytes(points, dtype, where)  # what inflating may allocate, bounded as a binary file's data
    planes = list(dtype.names or ())
    if uncompressed != points * dtype.itemsize:
        planes = [name for name in planes if not name.startswith(_PCD_PADDING + " ")]
    expected = points * sum(dtype[name].itemsize for name in planes)
    if uncompressed != expected:
        raise InputError(f"{where}: binary_compressed data of {uncompressed} bytes uncompressed, but POINTS {points} "
                         f"of {dtype.itemsize} bytes a point need {points * dtype.itemsize}")
    if compressed > available - 8 or compressed > _PCD_MAX_BINARY:
        raise InputError(f"{where}: binary_compressed data of {compressed} bytes, but the file holds "
                         f"{max(available - 8, 0)} after its header (truncated)")
    if compressed < available - 8:  # as DATA binary's bytes past its points are refused: no writer leaves any
        raise InputError(f"{where}: binary_compressed data of {compressed} bytes, but the file holds "
                         f"{available - 8} after its header: a size that lies, or two files joined?")
    data = f.read(compressed)
    if len(data) != compressed:
        raise InputError(f"{where} was truncated while being read")
    raw = lzf_decompress(data, uncompressed, where)
    out = np.empty((points, len(columns)), dtype=np.float32)
    offsets = dict(zip(planes, itertools.accumulate((points * dtype[n].itemsize for n in planes), initial=0)))
    for col, name in enumerate(columns):
        plane = np.frombuffer(raw, dtype=dtype[name], count=points, offset=offsets[name])
        cast_to_float32(out[:, col], plane, where)
    return out


#: Most bytes one byte of an LZF stream inflates to: its longest reference, 3 bytes, copies 264.
_LZF_MAX_RATIO = 88


def lzf_decompress(data: bytes, size: int, where: str) -> bytearray:
    """``data`` compressed by LZF (liblzf, as PCL compresses a .pcd), inflated to exactly ``size`` bytes. Runs of
    literal bytes and references back into the output are copied as slices (a loop step a run, not a byte); a
    stream that is malformed, or does not inflate to ``size`` bytes, is an InputError naming ``where``. A stream too
    short to inflate to ``size`` bytes is refused before they are set aside: a 200-byte file that said 1 GiB had the
    reader allocate and zero that GiB before the stream was found short."""
    if size > _LZF_MAX_RATIO * len(data):
        raise InputError(f"{where}: its binary_compressed data of {len(data)} bytes cannot inflate to {size} bytes (LZF "
                         f"inflates at most {_LZF_MAX_RATIO} times: 3 bytes to 264) (corrupt or truncated)")
    out = bytearray(size)
    src, end, pos = memoryview(data), len(data), 0
    i = 0
    while i < end:
        ctrl = src[i]
        i += 1
        if ctrl < 32:  # a run of ctrl + 1 literal bytes
            n = ctrl + 1
            if i + n > end or pos + n > size:
                break
            out[pos : pos + n] = src[i : i + n]
            i, pos = i + n, pos + n
            continue
        n = ctrl >> 5
        if n == 7:  # a long reference: its length goes on in the next byte
            if i >= end:
                break
            n += src[i]
            i += 1
        if i >= end:
            break
        back = ((ctrl & 0x1F) << 8) + src[i] + 1
        i, n = i + 1, n + 2
        ref = pos - back
        if ref < 0 or pos + n > size:
            break
        if back >= n:
            out[pos : pos + n] = out[ref : ref + n]
        else:  # the reference overlaps what it writes: its `back` bytes repeat
            out[pos : pos + n] = (bytes(out[ref:pos]) * (n // back + 1))[:n]
        pos += n
    else:
        if pos == size:
            return out  # as it is: NumPy reads it in place
    raise InputError(f"{where}: its binary_compressed data is not a valid LZF stream of {size} bytes (corrupt or "
                     "truncated)")


@dataclass(frozen=True)
class _PcdHeader:
    """A .pcd header as read: each key's values as written (a byte past ASCII held as a surrogate escape, so two
    names that differ only there stay two) and the line of the file it is on, and the bytes and lines the header
    takes, its DATA line included. ``lf_left``: the DATA line ends in CRLF in a file whose lines end in CR alone,
    and ``size`` leaves that LF to the data, as binary data's first byte may be one; ASCII data's first line starts
    after it, as an editor shows it."""

    values: dict[str, list[str]]
    lines: dict[str, int]
    size: int
    line_count: int
    lf_left: bool

    def said(self, key: str, limit: int = 40) -> str:
        """``key``'s line for a message: the key, its values quoted as written (``_as_written``) and its line."""
        return f"{key} {_as_written(' '.join(self.values[key]), limit)} on line {self.lines[key]}"


def _pcd_header(f: IO[bytes], shown: str, what: str) -> _PcdHeader:
    """The header, read line by line up to its DATA line, ``f`` left at the data after it. Its lines may end in LF,
    CRLF or CR alone (old Mac text), each a line as an editor shows it; they end as the file's first line does, so
    binary data after a DATA line that ends in CR alone may start with a LF byte. Spaces and tabs separate a line's
    key and values; a line but a comment that holds another control character is refused."""
    head = f.read(_PCD_MAX_HEADER + 1)  # a byte past the limit: a CRLF that ends there is seen whole
    if not head:
        raise _empty_file_error(f"{what} {shown}", "PCD")
    lines = head.splitlines(keepends=True)  # LF, CRLF and CR alone: bytes break lines at nothing else
    cr_alone = lines[0].endswith(b"\r")
    header: dict[str, list[str]] = {}
    where: dict[str, int] = {}
    consumed = 0
    for number, line in enumerate(lines, 1):
        consumed += len(line)
        if consumed > _PCD_MAX_HEADER:
            raise InputError(f"{what} {shown} is not a PCD file: no DATA line in the first {_PCD_MAX_HEADER} bytes")
        text = line.rstrip(b"\r\n").decode("ascii", errors="surrogateescape").strip(_PCD_SPACES)
        if not text or text.startswith("#"):
            continue
        key, *values = re.split(f"[{_PCD_SPACES}]+", text)
        if key not in _PCD_KEYS:
            raise InputError(f"{what} {shown} is not a PCD file: unexpected header line {number}: "
                             f"{_as_written(text, 60)}")
        if _PCD_HEADER_CONTROL.search(text):
            raise InputError(f"{what} {shown}: bad header line {number}: {_as_written(text, 60)} holds a control "
                             "character; spaces and tabs separate a header line's values")
        if key in header:
            raise InputError(f"{what} {shown}: header key {key} appears twice (lines {where[key]} and {number})")
        header[key], where[key] = values, number
        if key == "DATA":
            lf_left = cr_alone and line.endswith(b"\r\n")  # that LF may be binary data's first byte
            consumed -= lf_left
            f.seek(consumed)
            return _PcdHeader(header, where, consumed, number, lf_left)
    raise InputError(f"{what} {shown} is not a PCD file: the header has no DATA line")


def _pcd_int(header: _PcdHeader, key: str, shown: str, what: str) -> int:
    values = header.values.get(key)
    if values is None:
        raise InputError(f"{what} {shown}: header key {key} is missing")
    count = _pcd_count(values[0]) if len(values) == 1 else None
    if count is None:
        raise InputError(f"{what} {shown}: header {header.said(key)} is not a count")
    return count


def _pcd_count(text: str) -> int | None:
    """The count a header value holds (ASCII digits, no sign), or None for any other text and for a number too
    long to be a count (``overlong_number``)."""
    return int(text) if text.isascii() and text.isdigit() and overlong_number(text) is None else None


def _pcd_layout(header: _PcdHeader, shown: str, what: str) -> tuple[np.dtype, int, str]:
    data_kind = header.values["DATA"][0].lower() if header.values["DATA"] else ""
    if data_kind not in ("ascii", "binary", "binary_compressed"):
        raise InputError(f"{what} {shown}: {header.said('DATA')}; expected ascii, binary or binary_compressed")
    for key in ("FIELDS", "SIZE", "TYPE"):
        if key not in header.values:
            raise InputError(f"{what} {shown}: header key {key} is missing")
    fields, sizes, types = header.values["FIELDS"], header.values["SIZE"], header.values["TYPE"]
    counts = header.values.get("COUNT", ["1"] * len(fields))
    if not (len(fields) == len(sizes) == len(types) == len(counts)) or not fields:
        raise InputError(
            f"{what} {shown}: header has {len(fields)} FIELDS, {len(sizes)} SIZE, {len(types)} TYPE "
            f"and {len(counts)} COUNT values; expected the same number"
        )
    named = [field for field in fields if field != _PCD_PADDING]
    if len(set(named)) != len(named):
        raise InputError(f"{what} {shown}: {header.said('FIELDS', 80)} repeats a name")
    fields = [f"{field} {i}" if field == _PCD_PADDING else field for i, field in enumerate(fields)]  # unique
    parts: list[tuple[str, str, tuple[int, ...]]] = []
    for field, size, kind, count in zip(fields, sizes, types, counts):
        code = _PCD_TYPES.get((kind.upper(), _pcd_count(size)))
        if code is None:
            raise InputError(f"{what} {shown}: field {_as_written(field, 40)} has TYPE {_as_written(kind, 10)} on "
                             f"line {header.lines['TYPE']}, SIZE {_as_written(size, 10)} on line "
                             f"{header.lines['SIZE']}; expected F 4/8, I or U 1/2/4/8")
        repeats = _pcd_count(count)
        if repeats is None or not 1 <= repeats <= _PCD_MAX_COUNT:
            raise InputError(f"{what} {shown}: field {_as_written(field, 40)} has COUNT {_as_written(count, 10)} on "
                             f"line {header.lines['COUNT']}, not a count from 1 to {_PCD_MAX_COUNT}")
        parts.append((field, "<" + code, (repeats,) if repeats > 1 else ()))
    values = sum(shape[0] if shape else 1 for _, _, shape in parts)
    if values > _PCD_MAX_ROW_VALUES:
        raise InputError(f"{what} {shown}: a point of {values} values (FIELDS times COUNT), more than the limit of "
                         f"{_PCD_MAX_ROW_VALUES}: not a point cloud this reads")
    dtype = np.dtype([(name, code, shape) if shape else (name, code) for name, code, shape in parts])
    width, height = _pcd_int(header, "WIDTH", shown, what), _pcd_int(header, "HEIGHT", shown, what)
    points = _pcd_int(header, "POINTS", shown, what) if "POINTS" in header.values else width * height
    if points != width * height:
        raise InputError(f"{what} {shown}: POINTS {points} but WIDTH {width} x HEIGHT {height} = {width * height}")
    if points > MAX_FRAME_POINTS:
        raise InputError(f"{what} {shown}: POINTS {points}, more than the limit of {MAX_FRAME_POINTS} points a frame")
    return dtype, points, data_kind


def _pcd_columns(dtype: np.dtype, width: int, header: _PcdHeader, shown: str, what: str) -> list[str]:
    """Names of the fields of the model's first ``width`` point columns (x, y, z, intensity, time: ``named_columns``),
    in that order (each must have COUNT 1), of the ``dtype`` read from ``header``."""
    names = list(dtype.names or ())
    chosen = named_columns(names, width)
    missing = lacking_text(chosen)
    if missing is not None:
        sweep = width == 5 and [column for column, name in chosen.items() if name is None] == ["time"]
        raise InputError(f"{what} {shown}: {header.said('FIELDS', 80)} lack {missing}"
                         + (f"; single sweeps? {MULTI_SWEEP_FIX}" if sweep else ""))
    fields = [str(name) for name in chosen.values()]
    for name in fields:
        if dtype[name].shape:
            raise InputError(f"{what} {shown}: field {name} has COUNT {dtype[name].shape[0]} on line "
                             f"{header.lines['COUNT']}, expected 1")
    return fields


def _pcd_ascii(f: IO[bytes], dtype: np.dtype, points: int, columns: list[str], shown: str,
               what: str, data_bytes: int, header_lines: int) -> np.ndarray:
    """The ASCII data rows after the header (``data_bytes`` of them, by the file's size; the header takes the file's
    first ``header_lines`` lines), parsed block by block into the (N, len(columns)) float32 result, so memory stays
    near the result's size (a whole-file parse of a 2 GiB file would take ~6 GiB). The rows set aside are no more
    than the data can hold (a number takes a character and a space or line break after it, the last one's
    optional): a 170-byte file that said 16 Mi points had 256 MiB set aside for them. A row longer than its numbers
    can be is refused as soon as it is seen: carried from block to block, a file without line breaks would cost time
    quadratic in its size."""
    names = list(dtype.names or ())
    starts = np.cumsum([0] + [int(np.prod(dtype[n].shape)) for n in names])
    per_row = int(starts[-1])
    wanted = [int(starts[names.index(c)]) for c in columns]
    longest = per_row * _PCD_ASCII_BYTES_PER_VALUE + 64  # bytes of one row, as the size check counts them
    held = (data_bytes + 1) // (2 * per_row) if data_bytes >= 0 else points  # a size short of its header: unknown
    out = np.empty((min(points, held), len(columns)), dtype=np.float32)
    rows, lines_before, rest = 0, header_lines, b""  # lines_before: the file's lines before this block
    while True:
        block = f.read(_PCD_ASCII_BLOCK)
        data = rest + block
        end = len(data) - 1 if block.endswith(b"\r") else len(data)  # may be a CRLF's CR: kept for the next
        cut = len(data) if not block else max(data.rfind(b"\n", 0, end), data.rfind(b"\r", 0, end)) + 1
        rest = data[cut:]
        text = data[:cut].decode("ascii", errors="surrogateescape")  # a byte past ASCII parses as no number
        lines = _pcd_rows(text)
        past = lines[points - rows:]  # text after the POINTS rows: refused once the rows before it are read
        del lines[points - rows:]
        if lines:
            table = _ascii_table(lines, per_row)
            if table is None:
                bad = _first_bad_line(lines, per_row)
                raise InputError(f"{what} {shown}: bad ASCII data on line {lines_before + _line_of(text, bad)} (row "
                                 f"{rows + bad + 1} of {points} after DATA): "
                                 f"{_as_written(lines[bad].strip(_PCD_SPACES))} is not {per_row} numbers")
            misfit = _outside_declared_type(table, lines, dtype, columns, wanted)
            if misfit is not None:
                row, name, token = misfit
                field = dtype[name]
                if field.kind == "f":  # 1e999 as 1e39
                    raise beyond_float32(f"{what} {shown}", rows + row + 1, escape_text(token, 40))
                raise InputError(f"{what} {shown}: ASCII data row {rows + row + 1} of {points}: field {name} is TYPE "
                                 f"{field.kind.upper()} SIZE {field.itemsize} ({field.name}), which cannot hold "
                                 f"{safe_repr(token, 40)}: the header does not describe the data; correct the "
                                 f"field's TYPE and SIZE")
            if rows + len(lines) > len(out):  # more whole rows than its size held
                raise InputError(f"{what} {shown} grew while being read (was it still being written?)")
            cast_to_float32(out[rows:rows + len(lines)], table[:, wanted], f"{what} {shown}", first_point=rows)
            rows += len(lines)
        if past:
            raise _past_points(f"{what} {shown}", points, lines_before + _line_of(text, len(lines)), past[0])
        lines_before += data.count(b"\n", 0, cut) + data.count(b"\r", 0, cut) - data.count(b"\r\n", 0, cut)
        if len(rest) > longest:  # a row no line break ends (zeros, one long line): refused, not carried over and over
            if rows == points:
                raise _past_points(f"{what} {shown}", points, lines_before + 1,
                                   rest.decode("ascii", errors="surrogateescape"))
            raise InputError(f"{what} {shown}: ASCII data on line {lines_before + 1} (row {rows + 1} of {points} after "
                             f"DATA) runs past {longest} bytes without a line break; a row of {per_row} numbers is "
                             "shorter")
        if not block:
            break
    if rows != points:
        raise InputError(f"{what} {shown}: {rows} ASCII data rows, but POINTS is {points} (truncated)")
    return out


def _past_points(where: str, points: int, line: int, text: str) -> InputError:
    """The refusal of ``text`` on ``line`` of a .pcd, after the last of its ``points`` ASCII rows (POINTS)."""
    return InputError(f"{where}: text on line {line} after its POINTS {points} rows: "
                      f"{_as_written(text.strip(_PCD_SPACES))}")


def _outside_declared_type(table: np.ndarray, lines: list[str], dtype: np.dtype, columns: list[str],
                           wanted: list[int]) -> tuple[int, str, str] | None:
    """(row, field, text) of the first value of the fields read (``columns``, at ``wanted`` in ``table``) that its
    declared TYPE and SIZE cannot hold (None: none): in an integer field a fraction, a sign or a size beyond the
    type, or nan / inf; in a float field a number that became infinity when it was parsed (``1e999``: the word
    inf is a value a float holds; a finite one beyond float32, ``1e39``, is ``cast_to_float32``'s to refuse).
    The values were parsed as float64, so such a file was read as what its header says it is not."""
    found: list[tuple[int, str, str]] = []
    for name, column in zip(columns, wanted):
        field, values = dtype[name], table[:, column]
        with np.errstate(invalid="ignore"):
            if field.kind == "f":
                rows: Iterator[int] = (int(r) for r in np.flatnonzero(np.isinf(values))
                                       if not _infinity_text(lines[r].split()[column]))
            else:
                info = np.iinfo(field)
                rows = (int(r) for r in np.flatnonzero(~(np.isfinite(values) & (values == np.floor(values))
                                                         & (values >= info.min) & (values <= info.max))))
        row = next(rows, None)
        if row is not None:
            found.append((row, name, lines[row].split()[column]))
    return min(found, default=None)


def _infinity_text(token: str) -> bool:
    """Whether an ASCII value is infinity written as a word (inf, -Infinity), not a number too large to hold."""
    return token.lstrip("+-").lower() in ("inf", "infinity")


def _ascii_table(lines: list[str], per_row: int) -> np.ndarray | None:
    """ASCII data lines as a (rows, per_row) float64 table, or None where one is not ``per_row`` numbers separated
    by spaces and tabs (NumPy would split them at ``_PCD_NOT_SPACES`` too)."""
    joined = "".join(lines)
    if any(control in joined for control in _PCD_NOT_SPACES):
        return None
    try:
        table = np.loadtxt(lines, dtype=np.float64, ndmin=2, comments=None)
    except ValueError:
        return None
    return table if table.shape[1] == per_row else None


def _pcd_rows(text: str) -> list[str]:
    """The lines of ``text`` (``text_lines``) that are not blank. Text holding none of ``_PCD_NOT_SPACES``, as rows of
    numbers do, takes a path twice as fast: ASCII (each byte past it a surrogate escape) without them is cut by
    str.splitlines where an editor cuts it, and holds no whitespace but spaces and tabs once cut."""
    if any(control in text for control in _PCD_NOT_SPACES):
        return [line for line in text_lines(text) if line.strip(_PCD_SPACES)]
    return list(filter(str.strip, text.splitlines()))


def _line_of(text: str, row: int) -> int:
    """The line (the first is 1) of ``text`` on which its ``row``-th (from 0) line that is not blank lies."""
    return [number for number, line in enumerate(text_lines(text), 1) if line.strip(_PCD_SPACES)][row]


def _as_written(text: str, limit: int = 80) -> str:
    """Text of a .pcd (a data row, a header line or value) quoted for a message, bounded to ``limit`` characters and
    terminal-safe: each byte past ASCII (held as a surrogate escape) as ``\\xNN``, as the file holds it, whatever it
    decodes to elsewhere (U+FFFD, or a UTF-8 letter)."""
    return f"'{escape_text(text.encode('ascii', 'surrogateescape').decode('latin-1'), limit)}'"


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
