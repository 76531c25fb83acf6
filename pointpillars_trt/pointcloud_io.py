"""Lidar frame files -> (N, columns) float32 rows x, y, z, intensity[, time]: KITTI-style ``.bin``,
``.npy`` and ``.pcd`` (read by ``pcd.read_pcd``), one entry point, ``read_points``, for all of them.

Every reader refuses, before reading data, anything that is not a regular file (a FIFO,
/dev/zero, a directory) and any frame of more than ``MAX_FRAME_POINTS`` points, so memory stays
bounded and nothing blocks. Values are not checked: NaN/inf rows are kept (the detector drops
and counts them). Errors are one-line :class:`InputError` messages naming the file. What a file says that
the read leaves unapplied (a ``.pcd``'s sensor pose, its VIEWPOINT) is said (``pcd.ViewpointNote``).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import math
import os
from collections.abc import Callable, Iterator
from typing import IO, Union

import numpy as np

from .config import POINT_COLUMN_NAMES, finite_float, int_within
from .errors import InputError, counted, one_line, safe_repr
from .file_reads import (READ_A_COPY, empty_file_error, open_regular_fd, open_regular_file, overlong_number,
                         read_error, read_regular_file, read_size_error, said_empty_error, special_kind)
from .pcd import ViewpointNote, read_pcd
from .point_layout import (ROW_LAYOUTS, TEXT_SNIFF, CaptureTimesNote, check_layout, check_named_time_lags,
                           looks_like_noise, misread_row_length, refuse_noise, refuse_other_formats, row_layout)
from .points import (MAX_FRAME_POINTS, MAX_POINT_DIM, MULTI_SWEEP_FIX, SUPPORTED_EXTENSIONS, cast_to_float32,
                     columns_text, copy_leading_columns, structured_fix, transposed_hint, wide_rows_problem)

PathLike = Union[str, "os.PathLike[str]"]


_NPY_MAX_HEADER = 1 << 16
_NPY_MAX_BYTES = _NPY_MAX_HEADER + MAX_FRAME_POINTS * 8 * 8  # 16 Mi points of 8 float64 columns: 1 GiB


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
        raise InputError(f"{what} {safe_repr(path)} is {counted(size, 'byte')}, not a multiple of {row} "
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
            raise empty_file_error(f"{what} {shown}", ".npy") from None
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
            raise said_empty_error(f"{what} {shown}", f"a .npy header: {READ_A_COPY}")
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
    check_named_time_lags(points, path, what, capture_times_note)
    return points


class _ZipArchive(ValueError):
    """A file of a zip archive's magic bytes where a .npy header belongs: np.savez's .npz, named .npy."""


class _NoBytes(ValueError):
    """A .npy file without a byte where its header belongs."""


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
