"""PCL ``.pcd`` frames -> (N, columns) float32 rows x, y, z, intensity[, time], their fields found by name.

DATA ascii, binary and binary_compressed (PCL's LZF); a header, sizes or data that do not agree are refused in
one line naming the file and the line or value. What a file says that the read leaves unapplied (its sensor
pose, its VIEWPOINT) is said (``ViewpointNote``). ``pointcloud_io.read_points``, the entry point for every
point file, reads a ``.pcd`` with ``read_pcd``.
"""

from __future__ import annotations

import itertools
import math
import re
import struct
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from .errors import InputError, InputWarning, counted, escape_text, safe_repr
from .file_reads import (READ_A_COPY, PathLike, empty_file_error, open_regular_file, overlong_number, read_error,
                         said_empty_error, text_lines)
from .point_layout import CaptureTimesNote, check_named_time_lags
from .points import (MAX_FRAME_POINTS, MULTI_SWEEP_FIX, beyond_float32, cast_to_float32, lacking_text,
                     named_columns)

#: Told, in one line naming the file (``viewpoint_text``), of a ``.pcd`` VIEWPOINT that is not the identity,
#: which the read leaves unapplied; None: said as an :class:`InputWarning`.
ViewpointNote = Callable[[str], None]

_PCD_MAX_HEADER = 1 << 16
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
    check_named_time_lags(points, path, what, capture_times_note)
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
        raise said_empty_error(f"{what} {shown}", f"a .pcd header of DATA {data_kind}: {READ_A_COPY}")
    if data_kind == "binary_compressed":
        return _pcd_compressed(f, size - header_end, dtype, points, columns, f"{what} {shown}")
    if data_kind == "binary":
        expected = _pcd_binary_bytes(points, dtype, f"{what} {shown}")
        if size - header_end != expected:
            raise InputError(
                f"{what} {shown}: {counted(size - header_end, 'byte')} of binary data, but POINTS {points} x "
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
        raise empty_file_error(f"{what} {shown}", "PCD")
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
