"""Turning what users pass as a lidar frame into the (N, columns) float32 array the stages expect."""

from __future__ import annotations

import itertools
import mmap
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from .config import POINT_COLUMN_NAMES
from .errors import InputError, agree, counted, safe_repr

#: Largest frame (points) any reader or ``as_host_points`` accepts: 16 Mi points, 256 MiB as
#: float32 x4. A real spinning lidar gives ~100-300 k points a sweep.
MAX_FRAME_POINTS = 16 * 2**20
#: Most values a point holds, as any reader or ``as_host_points`` takes it (lidar formats store 4 to ~10): a wider
#: row is an image's (a lidar's range image of beams x azimuths), whose first values would read as a few points.
MAX_POINT_DIM = 64
#: Longest path given as bytes (Linux's PATH_MAX): longer bytes are a frame's raw data, not a file's name.
MAX_PATH_BYTES = 4096


class HostReader(NamedTuple):
    """Who reads a frame from host memory alone, and its way out for a GPU array other than copying it to the
    host (None: none), for ``as_host_points``' message of a GPU array: each caller's own fix."""

    who: str
    other_fix: str | None = None


#: The detector on the CPU: a detector opened on the GPU reads a GPU array where it lies.
CPU_DETECTOR = HostReader("a detector on the CPU, which reads host arrays",
                          "open the detector on the GPU (device='cuda'), which reads it where it lies")


#: Extensions of the point files the readers understand (lower case).
SUPPORTED_EXTENSIONS = (".bin", ".npy", ".pcd")


def is_frame_path(item: object) -> TypeGuard[str | bytes | os.PathLike[str] | os.PathLike[bytes]]:
    """Whether an item of a stream of frames (``infer_many``) names a point file rather than holding points: a
    str or path-like object, or bytes that read as a path (decoded as ``os.fsdecode`` decodes them): short, no NUL
    byte, and a point file's extension or something there. Other bytes are a frame's raw values, which
    ``as_host_points`` refuses with the ``np.frombuffer`` that views them as points."""
    if isinstance(item, (str, os.PathLike)):
        return True
    if not isinstance(item, bytes) or len(item) > MAX_PATH_BYTES or b"\0" in item:
        return False
    return os.fsdecode(item).lower().endswith(SUPPORTED_EXTENSIONS) or os.path.lexists(item)


#: The names each point column (``POINT_COLUMN_NAMES``, in its order) goes by in a .pcd field or a table's column,
#: the first found taken: the intensity's as PCL names it, its short form and KITTI's own word (what KITTI-to-PCD
#: converters write); the time lag's as this package names it and as OpenPCDet does (``timestamp``).
COLUMN_NAMES: dict[str, tuple[str, ...]] = dict(zip(POINT_COLUMN_NAMES, (
    ("x",), ("y",), ("z",), ("intensity", "i", "reflectance"), ("time", "timestamp", "time_lag")), strict=True))
_MAX_NAMED_COLUMNS = 1024  # a table's column names looked at: a point's values are far fewer


def check_named_columns(points: object, source: str, columns: int) -> None:
    """Refuse a table (a pandas or polars DataFrame: its ``.columns``; a pyarrow Table: its ``.column_names``) whose
    column names (``COLUMN_NAMES``, any case) put a point column the model reads elsewhere than at its place: its
    values are read by position, so ``df[['i', 'x', 'y', 'z']]`` would be detected on with the intensity as x. Names
    not recognised say nothing."""
    arrow = getattr(points, "column_names", None)  # a pyarrow Table's: its .columns are the column arrays
    raw = arrow if arrow is not None else getattr(points, "columns", None)
    if raw is None or isinstance(points, np.ndarray):
        return
    try:
        names = [name if isinstance(name, str) else None for name in itertools.islice(raw, _MAX_NAMED_COLUMNS)]
    except Exception:  # noqa: BLE001 - a foreign table whose columns misbehave: its values still tell
        return
    wanted = POINT_COLUMN_NAMES[:columns]
    lowered = [name.lower() if name is not None else None for name in names]
    found: dict[str, int] = {}  # a column -> where its first name found lies (``intensity`` before an index ``i``)
    for column in wanted:
        place = next((lowered.index(alias) for alias in COLUMN_NAMES[column] if alias in lowered), None)
        if place is not None:
            found[column] = place
    misplaced = next((c for c in wanted if found.get(c, wanted.index(c)) != wanted.index(c)), None)
    if misplaced is None:
        return
    fix = f"put the columns of {columns_text(columns)} first, in that order"
    if len(found) == columns:
        selection = [names[found[c]] for c in wanted]
        fix = f"pass points.select({selection!r})" if arrow is not None else f"pass points[{selection!r}]"
    raise InputError(f"{source}: a table whose columns {safe_repr(names, 120)} hold {misplaced} in column "
                     f"{found[misplaced]}, not {wanted.index(misplaced)}: its values are read by position "
                     f"({columns_text(columns)} first), not by name; {fix}")


#: What a multi-sweep model's user does with single sweeps (rows of x, y, z, intensity): the fix each reader names.
#: A 5th value alone is not it: the model reads it as each point's time lag, which only accumulation gives.
MULTI_SWEEP_FIX = ("a multi-sweep model needs accumulated frames, each point's 5th value its time lag behind the key "
                   "sweep: PointPillars.accumulate builds them from sweeps and their poses")


def named_columns(names: Iterable[str], columns: int) -> dict[str, str | None]:
    """The field of ``names`` (a structured array's, a .pcd's FIELDS) that each of the model's first ``columns`` point
    columns is read from, by ``COLUMN_NAMES`` in any case: the first of a column's names found (of names alike but
    for case, the first); None where none is there."""
    lowered = {name.lower(): name for name in reversed(list(names))}
    return {column: next((lowered[alias] for alias in COLUMN_NAMES[column] if alias in lowered), None)
            for column in POINT_COLUMN_NAMES[:columns]}


def lacking_text(chosen: Mapping[str, str | None]) -> str | None:
    """The columns ``named_columns`` found no field for, with the names each goes by ('intensity (or i or
    reflectance)'), for a message; None: none lacks."""
    missing = [f"{column} (or {' or '.join(COLUMN_NAMES[column][1:])})" if len(COLUMN_NAMES[column]) > 1 else column
               for column, name in chosen.items() if name is None]
    return ", ".join(missing) if missing else None


def structured_fix(dtype: np.dtype, columns: int, array: str, use: str) -> str:
    """How a structured array (named fields, as ROS's and pypcd's clouds are: no (N, columns) rows to read) of
    ``dtype`` becomes the model's ``columns``, its fields picked by name (``named_columns``) from the array Python
    spells ``array`` and used as ``use`` says ({}: the columns); or which of them its fields lack."""
    names = list(dtype.names or ())
    chosen = named_columns(names, columns)
    missing = lacking_text(chosen)
    if missing is not None:
        return f"its fields {safe_repr(names, 120)} lack {missing}"
    columns_of = f"structured_to_unstructured({array}[{list(chosen.values())!r}], np.float32)"
    return (f"its fields {safe_repr(names, 120)} hold them: {use.format(columns_of)} (structured_to_unstructured "
            "from numpy.lib.recfunctions)")


def transposed_hint(shape: tuple[int, ...]) -> str:
    """'; it looks transposed ...' when a 2-D shape reads as (4 or 5, N) points-as-columns, else ''."""
    if len(shape) == 2 and shape[0] in (4, 5) and shape[1] != shape[0] and (shape[1] > shape[0] or shape[0] == 4):
        return f"; it looks transposed (points as columns): pass the array's .T, shape ({shape[1]}, {shape[0]})"
    return ""


def columns_text(columns: int) -> str:
    """What ``columns`` point columns hold, for messages: 'x, y, z, intensity' (+ ', time')."""
    return ", ".join(POINT_COLUMN_NAMES[:columns])


def wide_rows_problem(width: int, columns: int) -> str | None:
    """Why rows of ``width`` values are no point list (wider than ``MAX_POINT_DIM``: an image), for a message to a
    user of a model of ``columns`` point columns; None when a point may be that wide."""
    if width <= MAX_POINT_DIM:
        return None
    return (f"rows of {width} values, where a point has {columns} to {MAX_POINT_DIM} ({columns_text(columns)} "
            "first); an image or another array, not a point list?")


def refuse_masked(points: object, source: str) -> None:
    """Refuse a NumPy masked array: ``np.asarray`` drops its mask, and the masked points would be detected on."""
    if isinstance(points, np.ma.MaskedArray):
        raise InputError(f"{source}: a masked array, whose mask would be ignored; pass the points kept "
                         "(np.ma.compress_rows(points), or points.data[~points.mask.any(axis=1)])")


def refuse_missing_values(arr: np.ndarray, points: object, source: str, columns: int) -> None:
    """Refuse ``arr``, the object array that ``points`` became, whose point columns hold missing values (``pd.NA``
    of a pandas table's nullable ``Float32`` columns, as parquet files of points are read, or None): the
    ``astype(np.float32)`` that an object array is told to take fails on them, and a point without its values is
    no return to detect on. Says how many and the first, with how to drop their rows from a table or an array."""
    if arr.dtype != object or arr.ndim != 2:
        return
    na = getattr(sys.modules.get("pandas"), "NA", None)  # where pandas is not imported, no value is its NA
    lacks = np.frompyfunc(lambda value: value is None or (na is not None and value is na), 1, 1)
    rows = np.asarray(lacks(arr[:, :columns]), bool).any(axis=1)
    count = int(np.count_nonzero(rows))
    if not count:
        return
    if hasattr(points, "dropna") and hasattr(points, "iloc"):  # a pandas table
        fix = f"points.iloc[:, :{columns}].dropna().to_numpy(np.float32)"
    else:
        fix = f"points[~pd.isna(points[:, :{columns}]).any(axis=1), :{columns}].astype(np.float32)"
    lack, first, their = agree(count, ("lacks", "row", "its row"), ("lack", "the first row", "their rows"))
    raise InputError(f"{source}: {count} of its {counted(len(arr), 'point')} {lack} values (missing: pd.NA, as "
                     f"pandas' nullable Float32 columns hold them, or None), {first} {int(np.argmax(rows))} (counted "
                     f"from 0); a point without its values is no return: drop {their} ({fix})")


_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def is_cuda_array(points: object) -> bool:
    """Whether ``points`` lie on the GPU (CUDA array interface, or DLPack on a CUDA device): a host array that
    speaks DLPack too, as a torch CPU tensor, is host data."""
    if hasattr(points, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(points, "__dlpack_device__", None)
    if dlpack_device is None or isinstance(points, np.ndarray):
        return False
    try:
        return int(dlpack_device()[0]) in _DLPACK_CUDA_DEVICES
    except Exception:  # noqa: BLE001 - a foreign object whose protocol misbehaves is treated as host data
        return False


def refuse_cut_mapping(points: np.ndarray, source: str) -> None:
    """Refuse an array that lies in a memory-mapped file (``np.memmap``, or ``np.frombuffer`` of an ``mmap``)
    that is now shorter than the array's bytes (cut or written over since it was mapped): reading them would
    kill the process with SIGBUS, every other frame's result with it. A file cut after this look still does."""
    root = points
    while isinstance(root.base, np.ndarray):
        root = root.base
    mapping = root.base.obj if isinstance(root.base, memoryview) else root.base  # np.frombuffer's base: a view
    if not isinstance(mapping, mmap.mmap) or mapping.closed or points.size == 0:
        return
    try:
        file_size = mapping.size()  # the file's size now (an anonymous mapping's: its length)
    except (OSError, ValueError):
        return
    # np.memmap maps its file from its offset rounded down to the allocation granularity; a mapping made another
    # way is taken to start at byte 0, which can only make the bytes needed fewer
    offset = getattr(root, "offset", 0)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY if isinstance(offset, int) else 0
    mapped_at = np.frombuffer(mapping, np.uint8).ctypes.data
    end = points.ctypes.data + points.itemsize + sum(
        (n - 1) * stride for n, stride in zip(points.shape, points.strides) if stride > 0)
    needed = start + end - mapped_at
    if needed > file_size and not _maps_a_device(mapped_at):
        raise InputError(f"{source}: lies in a memory-mapped file of {file_size} bytes, which its bytes run past "
                         f"(to byte {needed}): the file was cut or written over since it was mapped; map it again")


def _maps_a_device(address: int) -> bool:
    """Whether the mapping at ``address`` is of a device (/dev/zero, a sensor driver's buffer), whose size
    (0) says nothing of what it maps, by the process's own map (/proc/self/maps, Linux); False where that
    cannot tell, so that a cut regular file is still refused."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                if int(low, 16) <= address < int(high, 16):
                    path = fields[5].rstrip("\n") if len(fields) == 6 else ""
                    return path.startswith("/") and stat.S_ISCHR(os.stat(path).st_mode)
    except (OSError, ValueError, IndexError):
        pass
    return False


def as_array(points: object, source: str, expected: str, xp: Any = np) -> Any:
    """``xp.asarray(points)`` (NumPy; CuPy for frames and sweeps on the GPU), the one conversion of frames and
    sweeps; what it cannot convert is an InputError naming ``source`` and the ``expected`` array, with the
    reason: ragged lists, device arrays that refuse implicit host copies, a torch tensor that requires grad
    (its message naming .detach()), and whatever an array's malformed interface raises (a KeyError).

    A device array that speaks DLPack goes through ``from_dlpack``, called under the stream the caller made
    current: the producer (PyTorch, JAX) then orders its pending work on that array before the stream's next
    work, where the CUDA array interface of a tensor made on another stream promises nothing. An array in a
    memory-mapped file cut since is refused (``refuse_cut_mapping``)."""
    if isinstance(points, np.ndarray):
        refuse_cut_mapping(points, source)
    if xp is not np and isinstance(points, xp.ndarray):
        return points  # a CuPy array is taken as it is: no DLPack exchange with itself
    try:
        if xp is not np and hasattr(points, "__dlpack__") and is_cuda_array(points):
            return xp.from_dlpack(points)
        return xp.asarray(points)
    except MemoryError:  # the host or the GPU out of memory (CuPy's OutOfMemoryError): no fault of the frame's
        raise
    except Exception as exc:  # noqa: BLE001 - a foreign array's broken interface raises what NumPy or CuPy meets
        usual = isinstance(exc, (TypeError, ValueError, RuntimeError, BufferError))
        reason = str(exc) if usual else f"{type(exc).__name__}: {exc}"
        raise InputError(f"{source}: cannot be read as {expected} ({reason})") from None


def as_host_points(points: object, source: str = "points", columns: int = 4,
                   reader: HostReader = CPU_DETECTOR) -> np.ndarray:
    """A C-contiguous (N, columns) float32 NumPy array; further columns (e.g. ring) are ignored.

    ``columns`` is the model's point columns (``ModelConfig.num_point_columns``). Float64 input is
    converted (no information a float32 network could use is lost); anything that is not a 2-D float32
    or float64 array of ``columns`` to ``MAX_POINT_DIM`` columns is refused with a message naming ``source`` (float16,
    which has already lost the coordinates' precision, with what to do): a (4, N) or
    (5, N) array (N > its rows) with the hint that it looks transposed, and a frame of more than
    ``MAX_FRAME_POINTS`` points with its size, and one whose point columns hold missing values (``pd.NA``:
    ``refuse_missing_values``). A GPU array is refused naming ``reader``, who needs the host data, with its fix.
    """
    expected = f"an (N, {columns}) array of {columns_text(columns)}"
    refuse_masked(points, source)
    if isinstance(points, bytearray) or (isinstance(points, bytes) and not is_frame_path(points)):
        raise InputError(f"{source}: {counted(len(points), 'raw byte')}, not points; view them as points with "
                         f"np.frombuffer(data, np.float32).reshape(-1, {columns})")
    if is_cuda_array(points) and not hasattr(points, "__array__"):  # np.asarray would make it a 0-d object array
        other = f", or {reader.other_fix}" if reader.other_fix is not None else ""
        raise InputError(f"{source}: a GPU array (CUDA), given to {reader.who}: copy it to the host first (CuPy: "
                         f"points.get(); Numba: points.copy_to_host()){other}")
    arr: np.ndarray = as_array(points, source, expected)
    hint = transposed_hint(arr.shape)
    if arr.dtype.names is not None and not arr.dtype.hasobject:
        hint = f": a structured array, not columns; {structured_fix(arr.dtype, columns, 'points', 'pass {}')}"
    if arr.ndim == 0 and isinstance(points, (str, bytes, os.PathLike)):
        hint = (": a path, not points (read it with pointpillars_trt.pointcloud_io.read_points, or give paths to "
                "infer_many)")
    elif arr.ndim == 0:  # None, a number, an object NumPy makes a 0-d array of: named, not its shape alone
        hint = f": {safe_repr(points, 60)} ({type(points).__name__}), not an array of points"
    elif isinstance(points, (list, tuple)) and points and all(is_frame_path(item) for item in points):
        hint = (f": {counted(len(points), 'path')}, not points (give them to infer_many, a frame each; the sweeps of "
                "one frame: read each and join them with PointPillars.accumulate)")
    wide = wide_rows_problem(arr.shape[1], columns) if arr.ndim == 2 and not hint else None
    if wide is not None:  # a range image (beams x azimuths): its first values of each row would read as points
        hint = f": {wide}"
    if hint or arr.ndim != 2 or arr.shape[1] < 4:
        raise InputError(f"{source}: expected {expected}; got shape {arr.shape}{hint}")
    if arr.shape[1] < columns:
        raise InputError(f"{source}: the model reads {expected}, got {arr.shape[1]} columns per point "
                         f"(.bin frames of this model are read with {columns} values a point: point_dim {columns})"
                         + (f"; single sweeps? {MULTI_SWEEP_FIX}" if columns == 5 and arr.shape[1] == 4 else ""))
    refuse_missing_values(arr, points, source, columns)
    if arr.dtype.kind == "f" and arr.dtype.itemsize < 4:
        raise InputError(f"{source}: expected float32 (or float64) points; got dtype {arr.dtype}, which holds "
                         "coordinates only to ~0.03 m at 60 m: keep the points float32 from where they are read, "
                         "or pass points.astype(np.float32) to accept the loss")
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (4, 8):  # as read_npy: float32 or float64, either byte order
        raise InputError(f"{source}: expected float32 (or float64) points; got dtype {arr.dtype} "
                         "(points.astype(np.float32) if its values are metres)")
    if arr.shape[0] > MAX_FRAME_POINTS:
        raise InputError(f"{source}: {arr.shape[0]} points, more than the limit of {MAX_FRAME_POINTS} points a frame")
    check_named_columns(points, source, columns)
    if arr.dtype == np.float32 and arr[:, :columns].flags.c_contiguous:
        return arr[:, :columns]
    host = np.empty((arr.shape[0], columns), np.float32)
    if arr.dtype == np.float32:
        copy_leading_columns(host, arr)
    else:
        cast_to_float32(host, arr[:, :columns], source)
    return host


def copy_leading_columns(target: np.ndarray, rows: np.ndarray) -> None:
    """``target[...] = rows[:, :k]`` for (n, k) C-contiguous float32 ``target`` and (n, >= k) float32 ``rows``:
    when a row's first k values lie side by side (a frame's file read as it lies, 5 values a point), each
    row's are copied as one block of bytes, about 4x faster than NumPy's value-by-value copy of the slice."""
    leading = rows[:, : target.shape[1]]
    if leading.dtype == target.dtype and leading.strides[1:] == (target.itemsize,):
        block = f"V{target.strides[0]}"  # a row's k values as one element: NumPy then copies it whole
        np.copyto(target.view(block), leading.view(block))
    else:
        target[...] = leading


def cast_to_float32(rows: np.ndarray, values: np.ndarray, name: str, first_point: int = 0) -> None:
    """``rows[...] = values``, refusing a finite value beyond float32's range (a float64 frame's 1e39 became
    inf with NumPy's overflow warning on stderr); inf and nan of the frame's own (no return) are points'
    values. ``name``: the frame as messages name it; ``first_point``: the number of points before ``values``."""
    with np.errstate(over="ignore"):
        rows[...] = values
    if values.dtype.itemsize > 4 and np.isinf(rows).any():
        beyond = np.argwhere((np.isinf(rows) & np.isfinite(values)).reshape(len(rows), -1))
        if beyond.size:
            point, column = (int(i) for i in beyond[0])
            raise beyond_float32(name, first_point + point + 1, f"{float(values.reshape(len(values), -1)[point, column]):g}")


def beyond_float32(name: str, point: int, value: str) -> InputError:
    """The error of a frame ``name`` whose ``point`` (counted from 1) holds ``value`` (as read or written), a
    number beyond float32's range."""
    return InputError(f"{name}: point {point} holds {value}, beyond float32's range: not point coordinates in metres")


def check_frame_list(frames: object, columns: int) -> None:
    """Refuse what is not a list of frames, before it is iterated: None or a number (a bare TypeError
    otherwise), a path (its characters would be the frames), one frame given alone (its points would be) and a
    mapping (its keys would be)."""
    expected = f"a list of frames ((N, {columns}) arrays)"
    if isinstance(frames, (str, bytes, os.PathLike)):
        raise InputError(f"frames: expected {expected}, got the path {safe_repr(frames)}: read it with "
                         "pointpillars_trt.pointcloud_io.read_points, or pass paths to infer_many")
    shape = getattr(frames, "shape", None)
    if isinstance(shape, tuple) and len(shape) <= 2 and getattr(getattr(frames, "dtype", None), "kind", "") != "O":
        raise InputError(f"frames: expected {expected}, got one array of shape {shape}: pass [points], or call "
                         "detector(points) for a single frame")
    if isinstance(frames, Mapping):  # iterating it would give its keys
        raise InputError(f"frames: expected {expected}, got a {type(frames).__name__}, whose keys would be taken as "
                         "the frames: pass list(frames.values())")
    if not isinstance(frames, Iterable):
        raise InputError(f"frames: expected {expected}, got {safe_repr(frames)} ({type(frames).__name__}): pass "
                         "[points] for one frame")
