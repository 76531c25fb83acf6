"""What a run writes for each frame, the same whichever path ran it (local ``infer``, a Ray actor,
``infer --server``): one file per frame (JSON record, KITTI ``label_2`` lines, BEV picture), or, for
fleets, a few large files of one row per frame (JSON Lines, Parquet).

Files are written atomically (temp file + rename) without one fsync each; :func:`flush_to_disk` makes
a run's files durable in one pass before the summary reports them written. A run killed at any
moment leaves only complete files (and temp files the next run clears), so ``--skip-existing``
resumes it without redoing frames.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import InputError, counted, example, one_line, safe_repr
from ..file_reads import folder_resolved, folder_resolver, name_text, open_regular_file, read_file_head, special_kind
from ..file_writes import fsync_path, temp_file_of, write_bytes_atomic, write_new_file_atomic
from ..strict_json import dumps_strict, loads_json
from .uri_frames import is_uri

if TYPE_CHECKING:
    from ..detections import Detections

#: Per-frame file formats, and the formats of a few large files of one row per frame.
FILE_FORMATS = ("json", "kitti")
ROW_FORMATS = ("jsonl", "parquet")
OUTPUT_FORMATS = FILE_FORMATS + ROW_FORMATS
#: The suffix of a frame's file in each per-frame format.
FILE_SUFFIXES = {"json": ".json", "kitti": ".txt"}
#: Rows of one JSON Lines / Parquet part file, and the longest a part is filled before it is written (a
#: slow run, say on the CPU, writes its rows a minute at a time): a kill loses at most the part being filled.
ROWS_PER_PART = 10_000
SECONDS_PER_PART = 60.0
PART_PREFIX = "detections-"


@dataclass(frozen=True)
class OutputPlan:
    """Where each kind of per-frame output goes (None: not written) and how KITTI lines are made."""

    json_dir: Path | None = None
    kitti_dir: Path | None = None
    png_dir: Path | None = None
    calib_dir: str | None = None
    image_shape: tuple[int, int] | None = None
    keep_out_of_view: bool = False
    point_range: tuple[float, ...] | None = None
    #: The KITTI lines are made from the frame's record (its rounded boxes and scores), not its detections: they
    #: serve --eval of a run whose outputs are records (JSON, rows), whose resumed run can rebuild a skipped frame's
    #: lines from its record alone (``write_label_of_record``), and must then evaluate as one uninterrupted run.
    kitti_of_record: bool = False
    #: The frames are local paths (a row's ``path``: made absolute); False: frames of a URI, each named as Ray Data
    #: lists it (its ``path``: that name).
    local_frames: bool = True

    @property
    def folder(self) -> Path | None:
        """The first folder per-frame files go to (None: the plan writes none)."""
        return self.json_dir or self.kitti_dir or self.png_dir

    def files_of(self, source: str) -> list[Path]:
        """The files a frame's outputs go to (what ``--skip-existing`` looks for)."""
        stem = Path(source).stem
        return [folder / f"{stem}{suffix}" for folder, suffix in self._folders()]

    @property
    def suffixes(self) -> list[str]:
        """The suffixes of a frame's output files (each named ``<frame stem><suffix>``)."""
        return [suffix for _, suffix in self._folders()]

    def _folders(self) -> list[tuple[Path, str]]:
        pairs = ((self.json_dir, ".json"), (self.kitti_dir, ".txt"), (self.png_dir, ".png"))
        return [(folder, suffix) for folder, suffix in pairs if folder is not None]


@dataclass
class FrameOutput:
    """What writing a frame's outputs did: boxes written, non-finite and out-of-view boxes dropped,
    the files (not yet flushed to disk; names, which cross from a writer process cheaper than Paths),
    and whether its KITTI 2D boxes were clipped to an assumed image size (no image_shape, no image_2 PNG)."""

    boxes: int = 0
    nonfinite: int = 0
    out_of_view: int = 0
    files: list[str] = field(default_factory=list)
    image_assumed: bool = False


def write_frame_outputs(det: Detections, source: str, plan: OutputPlan, points: np.ndarray | None = None, *,
                        durable: bool = True) -> FrameOutput:
    """Write a frame's outputs per ``plan``: ``<stem>.json`` (the ``to_json_dict`` record),
    ``<stem>.txt`` (KITTI label_2 lines, with the frame's own calibration; of the record's boxes with
    ``plan.kitti_of_record``) and ``<stem>.png``.

    The frame's files are written as one: each is made (the picture drawn) and written to a temp file beside
    it before any is renamed into place (``durable=False``: without fsync, for a caller that flushes the run's
    files in one pass), so a write that fails (a full disk) leaves an earlier run's files of the frame as they
    were; a folder in an output's place, or a symbolic link to one (``folder_in_place``), fails the frame before
    any is made. Where a rename fails after another
    (rare: a file made busy meanwhile), the files this call created are removed and its error
    (``OutputsReplacedError``) names and counts those of an earlier run it replaced, which hold this run's content
    (the run's summary says the count): a frame's outputs are all there or none of this run's new ones, and nothing
    replaced goes unsaid.
    """
    from ..kitti import finite_detections

    stem = Path(source).stem
    result = FrameOutput()
    boxes, scores, names, velocity, result.nonfinite = finite_detections(det.boxes.reshape(-1, 7), det.scores,
                                                                         det.names, det.velocity)
    result.boxes = len(scores)
    outputs: list[tuple[Path, Callable[[], bytes]]] = []  # each file, and how its bytes are made
    of_record = plan.kitti_dir is not None and plan.kitti_of_record
    record = det.to_json_dict(name_text(stem)) if plan.json_dir is not None or of_record else None
    if plan.json_dir is not None:
        assert record is not None
        # the frame's source beside its name: --skip-existing tells apart frames of one name in two folders
        data = (dumps_strict({"frame": record["frame"], "source": source_path(source), **record}) + "\n").encode("utf-8")
        outputs.append((plan.json_dir / f"{stem}.json", lambda: data))
    if plan.kitti_dir is not None:
        text, result.out_of_view, result.image_assumed = _label_file(
            record_boxes(record) if of_record else RecordBoxes(boxes, scores, names), source, plan)
        outputs.append((plan.kitti_dir / f"{stem}.txt", lambda: text))
    if plan.png_dir is not None and points is not None:
        from .viz import bev_png

        picture = points  # not None, for the closure: drawn after the folder check below
        outputs.append((plan.png_dir / f"{stem}.png", lambda: bev_png(
            picture, boxes, names, scores, plan.point_range, bev_title(source, len(scores)), velocity=velocity)[0]))
    found = [_mode_at(path) for path, _ in outputs]  # what is in each output's place, before any is written
    for (path, _), mode in zip(outputs, found):
        folder = _folder_at(path, mode)
        if folder is not None:
            raise InputError(f"cannot write {safe_repr(os.fspath(path))}: {folder}")
    staged: list[Path] = []  # the outputs' temp files, all written before the first is renamed into place
    renamed: list[Path] = []
    try:
        for path, make in outputs:
            made = make()
            checked_write(path, lambda p: staged.append(temp_file_of(p, made, durable)))
        for (path, _), temp in zip(outputs, staged):
            checked_write(path, functools.partial(os.replace, temp))
            renamed.append(path)
    except BaseException as exc:  # a frame is written whole or not at all: the summary counts it failed, and a resumed
        for temp in staged[len(renamed):]:  # run redoes it (its new JSON alone would count as done)
            with contextlib.suppress(OSError):
                os.unlink(temp)
        for path, mode in zip(renamed, found):
            if mode is None:  # made by this call where there was none
                with contextlib.suppress(OSError):
                    os.unlink(path)
        replaced = [path for path, mode in zip(renamed, found) if mode is not None]
        if replaced and isinstance(exc, InputError):
            them = ", ".join(safe_repr(os.fspath(path)) for path in replaced)
            raise OutputsReplacedError(
                f"{exc} ({them}: {counted(len(replaced), 'file')} of an earlier run replaced with this run's before "
                "that; once this is fixed, rerun the frame without --skip-existing, which writes all its files anew)",
                len(replaced)) from None
        raise
    result.files = [os.fspath(path) for path in renamed]
    return result


class OutputsReplacedError(InputError):
    """A frame's write that failed after it had renamed ``replaced`` files of an earlier run into place (named in the
    message), which now hold this run's content: the run's summary counts them."""

    def __init__(self, message: str, replaced: int) -> None:
        super().__init__(message)
        self.replaced = replaced


def folder_in_place(path: Path) -> str | None:
    """Why a folder in an output's place keeps it from being written: a folder, or a symbolic link to one (read as
    what it leads to, as --out's other checks read a link), is no output a run may replace. None: nothing there, a
    file, or a link to a file or to nothing. The one rule of the writer (the frame fails naming it) and of
    ``--skip-existing`` (such an output is neither done nor redone: its frame runs, and its write fails)."""
    return _folder_at(path, _mode_at(path))


def _folder_at(path: Path, mode: int | None) -> str | None:
    """``folder_in_place`` of ``path``, whose own ``st_mode`` (``_mode_at``) is ``mode``."""
    if mode is not None and stat.S_ISDIR(mode):
        return os.strerror(errno.EISDIR)
    if mode is not None and stat.S_ISLNK(mode) and os.path.isdir(path):
        return (f"a symbolic link to the folder {safe_repr(os.path.realpath(path))} is in its place; move the link "
                "away (the folder stays as it is)")
    return None


def _mode_at(path: Path) -> int | None:
    """The ``st_mode`` of what is at ``path`` itself (a symbolic link, not what it points to), or None: nothing."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return None


def bev_title(source: str, boxes: int) -> str:
    """The title of a frame's picture: its file's name and the boxes drawn ('000000.bin: 1 box')."""
    return f"{Path(source).name}: {counted(boxes, 'box', 'boxes')}"


def _label_file(found: RecordBoxes, source: str, plan: OutputPlan) -> tuple[bytes, int, bool]:
    """A frame's KITTI label file per ``plan`` (its own calibration and camera image size): (bytes, boxes
    outside the camera image left out, whether the image size was assumed)."""
    from ..kitti import calib_for_frame, detections_to_kitti_lines, frame_camera

    camera = frame_camera(source, calib_for_frame(source, plan.calib_dir), plan.image_shape)
    kitti = detections_to_kitti_lines(*found, camera.calib, camera.image_shape, keep_out_of_view=plan.keep_out_of_view)
    return "".join(line + "\n" for line in kitti.lines).encode("utf-8"), kitti.dropped_out_of_view, camera.image_assumed


def write_label_of_record(record: object, source: str, plan: OutputPlan) -> None:
    """A skipped frame's KITTI label file in ``plan.kitti_dir``, rebuilt from the record an earlier run wrote of it
    (its JSON file or row) as ``write_frame_outputs`` makes a frame's with ``kitti_of_record``, so that a resumed
    run's --eval evaluates what one uninterrupted run would. ValueError: ``record`` is no record (``record_boxes``);
    InputError: the frame's calibration or camera image, or the write."""
    assert plan.kitti_dir is not None
    text = _label_file(record_boxes(record), source, plan)[0]
    checked_write(plan.kitti_dir / f"{Path(source).stem}.txt", lambda p: write_bytes_atomic(p, text, durable=False))


def read_record(path: Path) -> object:
    """The JSON value of a per-frame JSON file (``record_boxes`` says whether it is a record), read bounded;
    InputError (the file) or ValueError (its JSON) naming nothing: the caller names the file."""
    from ..file_reads import read_regular_file

    try:
        return loads_json(read_regular_file(path, max_bytes=_RECORD_MAX_BYTES, what="JSON output"))
    except RecursionError:
        raise ValueError("nested beyond the JSON parser") from None


def checked_write(path: Path, write: Callable[[Path], None]) -> None:
    """``write(path)``; a failure is one InputError naming the file (FileExistsError stays itself: a name
    another writer took, for a caller that takes the next)."""
    try:
        write(path)
    except FileExistsError:
        raise
    except OSError as exc:
        raise InputError(f"cannot write {safe_repr(os.fspath(path))}: {exc.strerror or one_line(exc)}") from None


#: The start of the error of a frame not written because an earlier write found the file system full.
NOT_WRITTEN = "not written: the output file system is full"
_FULL_DISK = ("No space left", "Disk quota exceeded")
#: Free bytes a file system found full must have again before frames are written to it again.
SPACE_TO_WRITE_AGAIN = 1 << 20
_full_folder: Path | None = None  # in each writer process (or this one): where a write last found no space


def write_frame(source: str, det: Detections, points: np.ndarray | None, *, plan: OutputPlan,
                row_classes: tuple[str, ...] | None = None) -> tuple[FrameOutput, str | None]:
    """The streaming runner's write step (in a writer thread or process): the frame's files without
    fsync, and its row's text (``row_text``) when ``row_classes`` is given. After a write that found the file system full,
    the frames after it fail at once with ``NOT_WRITTEN``, until that file system has space again."""
    global _full_folder
    if _full_folder is not None:
        if _full_folder == plan.folder and _free_bytes(_full_folder) < SPACE_TO_WRITE_AGAIN:
            raise InputError(NOT_WRITTEN)
        _full_folder = None  # space again, or another run's folder (an earlier run in this process)
    try:
        written = write_frame_outputs(det, source, plan, points, durable=False)
    except InputError as exc:
        if any(text in str(exc) for text in _FULL_DISK):
            _full_folder = plan.folder
        raise
    return written, (row_text(frame_row(source, det, None, row_classes, local=plan.local_frames))
                     if row_classes is not None else None)


def _free_bytes(folder: Path) -> int:
    try:
        found = os.statvfs(folder)
    except OSError:
        return 0
    return found.f_bavail * found.f_frsize


def is_full_disk_error(error: str) -> bool:
    return error.startswith(NOT_WRITTEN) or any(text in error for text in _FULL_DISK)


# --------------------------------------------------------------------------- one row a frame

def frame_row(source: str, det: Detections | None, error: str | None, class_names: tuple[str, ...],
              local: bool = True, velocity: bool = False) -> dict[str, Any]:
    """A frame's row of the JSON Lines / Parquet outputs: ``source`` (as given), ``path`` (``source_path``:
    what ``--skip-existing`` matches, by ``source_key``, wherever the resumed run starts from; ``local`` False: a frame of a URI,
    its name as Ray Data lists it), ``error`` (None when it went
    through), then every field of the per-frame JSON record (``Detections.to_json_dict``); a failed
    frame has empty lists and zero counts (and no velocities, of a model that predicts them: ``velocity``), so every
    row of a run has the same columns."""
    from ..detections import Detections as _Detections
    from ..detections import FrameStats

    found = det if det is not None else _Detections.empty(class_names, FrameStats(0), velocity)
    record = found.to_json_dict(name_text(Path(source).stem))
    return {"source": name_text(source), "path": source_path(source) if local else name_text(source),
            "error": None if error is None else name_text(error), **record}


def source_path(source: str) -> str:
    """A frame's source as one name whatever the working directory: a local path made absolute (``dir/a.bin``
    and ``/abs/dir/a.bin`` are one frame), a URI as it is."""
    text = name_text(source)
    return text if is_uri(text) else os.path.abspath(text)


def source_key(path: str, resolve: Callable[[str], str] = folder_resolved) -> str:
    """The one key a ``source_path`` is matched by, in JSON records and rows alike: its folder's symbolic links
    resolved (``file_reads.folder_resolved``, as ``refuse_repeated_frames`` takes frames: ``link-to-a/x.bin`` is
    ``a/x.bin``), so a resume through a link to the folder skips the frames already written; a URI as it is."""
    return path if is_uri(path) else resolve(path)


def frame_key(frame: str, resolve: Callable[[str], str] = folder_resolved) -> str:
    """A frame, as given, as ``source_key`` names it (``resolve``: a pass's ``folder_resolver``): what
    ``--skip-existing`` looks its row up by."""
    return source_key(source_path(frame), resolve)


def row_key(row: dict[str, Any], resolve: Callable[[str], str] = folder_resolved) -> str:
    """A row's frame as ``source_key`` names it: of its ``path`` column, or (a part written before rows had one)
    of its source resolved against this working directory (``resolve``: a pass's ``folder_resolver``)."""
    path = row.get("path")
    return source_key(str(path) if path else source_path(str(row["source"])), resolve)


#: The columns a row's frame is known by (``frame_row``), read alone where a part's rows are looked up.
_KEY_COLUMNS = ["source", "path", "error"]


def row_text(row: dict[str, Any]) -> str:
    """A row as its line of the JSON Lines parts (``frame_row``'s plain values: the C encoder alone, no
    walk of ``to_jsonable``): the form rows travel in from the writers, threads, processes or Ray actors,
    so that the process that keeps the parts only joins lines (a Parquet part is parsed from them by
    Arrow). A non-finite value is refused by ``dumps_strict``, naming its place."""
    try:
        return json.dumps(row, allow_nan=False, default=_plain_value)
    except ValueError:
        return dumps_strict(row, indent=None)


def _plain_value(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class RowParts:
    """JSON Lines or Parquet rows in input order (each as its ``row_text``), in part files of
    ``ROWS_PER_PART`` rows (``detections-00000.jsonl``, ...), each written atomically when full, when a row
    is added ``seconds_per_part`` after the part's first, or at ``close``. A resumed run numbers its parts
    after those already there."""

    def __init__(self, folder: Path, output_format: str, class_names: tuple[str, ...],
                 rows_per_part: int = ROWS_PER_PART, seconds_per_part: float = SECONDS_PER_PART) -> None:
        if output_format not in ROW_FORMATS:
            raise InputError(f"format {output_format!r}: expected one of {', '.join(ROW_FORMATS)}")
        if output_format == "parquet":
            require_pyarrow()
        self.folder, self.format, self.class_names = folder, output_format, class_names
        self.rows_per_part, self.seconds_per_part = rows_per_part, seconds_per_part
        self.rows: list[str] = []
        self._first_row_at = 0.0  # monotonic time of the part's first row
        self.files: list[Path] = []
        self.rows_written = 0  # the rows of this run's parts
        self._next = 1 + max((_part_number(p) for p in existing_parts(folder, output_format)), default=-1)

    def add(self, row: str) -> None:
        now = time.monotonic()
        if not self.rows:
            self._first_row_at = now
        self.rows.append(row)
        if len(self.rows) >= self.rows_per_part or now - self._first_row_at >= self.seconds_per_part:
            self._write_part()

    def close(self) -> None:
        if self.rows:
            self._write_part()

    def _write_part(self) -> None:
        """Write the rows as the next part; when that fails the rows are dropped (their frames are the
        caller's to report) and the error raised (an InputError)."""
        rows, count, self.rows = self.rows, len(self.rows), []
        try:
            data = self._encode(rows)
        except ValueError as exc:  # Arrow's parse errors are ValueErrors
            raise InputError(f"{safe_repr(str(self._path()))}: the rows could not be made into a part: "
                             f"{one_line(exc)}") from None
        while True:  # never over another run's part: a run writing into this folder at the same time keeps its rows
            path = self._path()
            try:
                checked_write(path, lambda p: write_new_file_atomic(p, data, durable=False))
                break
            except FileExistsError:
                self._next += 1
        self.files.append(path)
        self.rows_written += count
        self._next += 1

    def _path(self) -> Path:
        return self.folder / f"{PART_PREFIX}{self._next:05d}.{self.format}"

    def _encode(self, rows: list[str]) -> bytes:
        lines = ("\n".join(rows) + "\n").encode("utf-8")
        if self.format == "jsonl":
            return lines
        import pyarrow.json as pa_json
        import pyarrow.parquet as pq

        # a block holds whole rows: at least the longest one (a frame of thousands of boxes; rows are ASCII)
        block = max(1 << 20, 2 * max(len(row) for row in rows))
        # velocities where the model gives them (in every row of such a model's run, a failed frame's empty)
        schema = row_schema(self.class_names, velocity=any(_VELOCITY_KEY in row for row in rows))
        table = pa_json.read_json(io.BytesIO(lines), read_options=pa_json.ReadOptions(block_size=block),
                                  parse_options=pa_json.ParseOptions(explicit_schema=schema,
                                                                     unexpected_field_behavior="error"))
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        return buffer.getvalue()


#: How each per-frame output file ends when whole (KITTI label files may be empty: no detections).
_COMPLETE_ENDINGS = {".json": b"}\n", ".txt": b"\n", ".png": b"IEND\xaeB`\x82"}
#: The lists of a JSON frame record (``Detections.to_json_dict``), one entry a box, and its counts.
_RECORD_LISTS = ("boxes_lidar", "scores", "labels")
_RECORD_COUNTS = ("num_points", "num_pillars", "num_pillars_dropped", "num_nonfinite_points", "num_nonfinite_boxes")
#: No limit on an output's size where it is opened only to be checked (read in part, or row by row).
_ANY_SIZE = 1 << 62
#: Bytes beyond any frame record (a few hundred thousand at most, for thousands of boxes): a larger file is not one.
_RECORD_MAX_BYTES = 1 << 26


def output_complete(path: Path) -> bool:
    """Whether a per-frame output file is whole: it ends as this package ends that kind of file (a
    KITTI label file may be empty), and a JSON file is also infer's record of that frame (any other
    JSON ending in ``}`` would be skipped forever: ``whole_record``). Reads the last bytes of the others only."""
    if path.suffix == ".json":
        return whole_record(path) is not None
    ending = _COMPLETE_ENDINGS.get(path.suffix)
    try:
        f, size = open_regular_file(path, max_bytes=_ANY_SIZE, what="output")  # a FIFO there: never complete
        with f:
            if ending is None or (size == 0 and path.suffix == ".txt"):
                return True
            if size < len(ending):
                return False
            f.seek(size - len(ending))
            return f.read(len(ending)) == ending
    except (OSError, InputError):
        return False


def whole_record(path: Path) -> dict[str, Any] | None:
    """infer's record of frame ``path.stem`` in a per-frame JSON file that is whole (it ends as infer ends
    them), or None: read once, for ``output_complete`` and for the ``source`` a resume compares."""
    try:
        f, size = open_regular_file(path, max_bytes=_ANY_SIZE, what="output")  # a FIFO there: never complete
        with f:
            if size > _RECORD_MAX_BYTES:
                return None
            data = f.read()
    except (OSError, InputError):
        return None
    return _frame_record(data, path.stem) if data.endswith(_COMPLETE_ENDINGS[".json"]) else None


def _frame_record(data: bytes, stem: str) -> dict[str, Any] | None:
    """``data`` as the JSON record infer writes for frame ``stem`` (that frame's name, its lists of one entry a
    box, 7 values a box and 2 a velocity, its integer counts), or None when it is not one."""
    try:
        record = loads_json(data)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, a key twice, nested beyond the parser
        return None
    if not isinstance(record, dict) or record.get("frame") != name_text(stem):
        return None
    try:
        boxes = record_boxes(record).boxes  # what eval and a resumed run read back must read back
        velocity = _numbers(record["velocity"], "velocity") if "velocity" in record else None
    except ValueError:
        return None
    if velocity is not None and velocity.shape != (len(boxes), 2) and not (velocity.size == len(boxes) == 0):
        return None
    return record if all(type(record.get(key)) is int for key in _RECORD_COUNTS) else None


def foreign_output(path: Path) -> str | None:
    """Why an existing file in an output's place is not one infer writes (so a run must not overwrite it),
    or None when it is one, or may be one damaged (a JSON record cut short: bytes that do not parse but begin as
    infer's records begin, ``begins_as_record``; an object with a record's ``frame`` and ``boxes_lidar``; a last
    line without its newline): ground-truth label lines (15 values, no score), a calib file, another tool's JSON (a
    record whose ``frame`` is no frame's name, or whose ``source`` is no point file's path, too) or bytes that are
    no JSON and no record's start; a FIFO or a device (reading it could block; a folder there fails that frame's
    write alone); a picture that names other software than this package's plotting (a camera image: ``--out``
    given as ``image_2``)."""
    return _existing_output(path)[0]


def _existing_output(path: Path) -> tuple[str | None, str | None]:
    """(``foreign_output``'s answer, the point file a JSON record there names, or None: none, or an earlier
    version's record), from one read of the file."""
    kind = special_kind(path)
    if kind is not None:
        return f"it is {kind}, not a regular file", None
    try:
        data = read_file_head(path, _PNG_HEAD_BYTES if path.suffix == ".png" else _RECORD_MAX_BYTES + 1, what="output")
    except (OSError, InputError):
        return None, None
    if path.suffix == ".png":
        return _foreign_picture(data), None
    if path.suffix == ".json":
        return _json_output(data, path.stem)
    if path.suffix == ".txt":
        from ..kitti import LABEL_FIELDS

        for line in data.split(b"\n")[:-1]:  # whole lines only: the last may be cut short
            values = len(line.split())
            if values and values != LABEL_FIELDS + 1:  # a prediction line: a label line's fields and the score
                return (f"lines of {counted(values, 'value')} (KITTI predictions have {LABEL_FIELDS + 1}: a label "
                        f"file's {LABEL_FIELDS} and a score)"), None
    return None, None


def _json_output(data: bytes, stem: str) -> tuple[str | None, str | None]:
    """``_existing_output`` of the bytes of a .json file in the place of frame ``stem``'s record. A record cut
    short (a run killed mid-write) is infer's to rewrite, judged by how it begins alone (``begins_as_record``), as a
    cut may fall anywhere after that: what its head shows past its start (a frame or source that is no string) is not
    checked; the source its head names whole still counts."""
    try:
        record = loads_json(data)
    except (ValueError, RecursionError):
        if not begins_as_record(data):
            return "neither JSON nor a record infer writes cut short", None
        found = _SOURCE_AT_HEAD.match(data)
        try:
            frame, source = (loads_json(found[1]), loads_json(found[2])) if found is not None else (None, None)
        except ValueError:
            frame, source = None, None
        return None, source if frame == name_text(stem) and isinstance(source, str) else None
    if not (isinstance(record, dict) and "frame" in record and "boxes_lidar" in record):
        return "JSON that is not a record infer writes", None
    problem = record_field_problem(record)
    if problem is not None:
        return f"its {problem}", None
    return None, record.get("source") if record["frame"] == name_text(stem) else None


#: Bytes of a PNG looked at for its "Software" text, which Matplotlib writes before the image data.
_PNG_HEAD_BYTES = 4096
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The "Software" texts of this package's pictures (infer's, demo's, bench's chart): its own, and Matplotlib's
#: default, which earlier versions wrote.
_OUR_SOFTWARE = (b"tEXtSoftware\x00pointpillars-trt", b"tEXtSoftware\x00Matplotlib")


def _foreign_picture(head: bytes) -> str | None:
    """Why a PNG's first bytes show it is no picture of this package's (None when they do, or when it is cut short
    or damaged: then it is redrawn)."""
    if not head.startswith(_PNG_SIGNATURE) or (b"IDAT" not in head and len(head) < _PNG_HEAD_BYTES):
        return None  # empty, cut short before its data, or no PNG at all: not a picture anybody keeps
    if any(marker in head for marker in _OUR_SOFTWARE):
        return None
    return "a picture that pointpillars-trt did not draw (a camera image?)"


def refuse_foreign_outputs(out: Path, frames: Iterable[str], suffixes: Collection[str],
                           other_sources: bool = False) -> None:
    """Refuse, before anything runs, a run whose outputs would overwrite files in ``out`` that infer did
    not write (:func:`foreign_output`): ``--out`` given as the label or calib folder replaced the ground truth
    with predictions. With ``other_sources``, also a run whose JSON records would replace those of other point
    files of the same names (KITTI raw and tracking sequences all start at 000000.bin; with --skip-existing too,
    which would run those frames, their records not being theirs): those results would be gone without a word. A
    rerun of the same frames (by a symbolic link to their folder too: ``names_frame``) replaces their records, or
    with --skip-existing skips them. ``out`` is listed once; only the names a frame would write are read, once."""
    try:
        present = set(os.listdir(out))
    except OSError:  # not there yet (or unreadable: the write probe says so)
        return
    if not present:
        return
    others: list[tuple[str, str]] = []  # (frame, the source its record names)
    for frame in frames:
        stem = os.path.splitext(os.path.basename(frame))[0]
        for suffix in suffixes:
            if stem + suffix not in present:
                continue
            reason, source = _existing_output(out / (stem + suffix))
            if reason is not None:
                raise InputError(f"--out {safe_repr(str(out))} holds {safe_repr(stem + suffix)}, which infer did not "
                                 f"write ({reason}), and this run would overwrite it: give another --out, or move "
                                 "such files away")
            if other_sources and source is not None and not names_frame(source, frame):
                others.append((frame, source))
    if others:
        frame, source = others[0]
        record = f"{safe_repr(Path(frame).stem + '.json')} is the record of {safe_repr(source)}, not of " \
                 f"{safe_repr(frame)}"
        raise InputError(f"--out {safe_repr(str(out))} holds the records of {counted(len(others), 'frame')} of the "
                         f"same name from other point files ({example(len(others), record)}), which this run would "
                         "replace: give another --out (one a sequence), or remove those records from it first")


def names_frame(source: str, frame: str) -> bool:
    """Whether ``source``, the point file a JSON record names, is ``frame``: compared as absolute paths
    (``source_path``), then, where those differ, by ``source_key`` (``link-to-a/x.bin`` is ``a/x.bin``)."""
    own = source_path(frame)
    return source == own or source_key(source) == source_key(own)


#: How every per-frame JSON record begins, whitespace aside (``Detections.to_json_dict`` puts its frame first).
_RECORD_START = b'{"frame":'


def begins_as_record(data: bytes) -> bool:
    """Whether ``data``, which does not parse as JSON, may be infer's record cut short by a crash: it begins as
    infer's records begin (``_RECORD_START``, whitespace aside, or a part of it), or holds nothing but NUL bytes
    (what some file systems leave of a file whose data never reached the disk). Another tool's file, or JSON
    damaged by hand (``[[[``), begins otherwise: refused as a file infer did not write, not overwritten."""
    if not data.strip(b"\0"):
        return True
    head = b"".join(data[:64].split())
    return head[:len(_RECORD_START)] == _RECORD_START[:len(head)]


#: The head of a per-frame JSON record (``write_frame_outputs`` writes its frame and source first), and those two
#: JSON strings in it: what a record cut short still says of its frame.
_SOURCE_AT_HEAD = re.compile(rb'\{\s*"frame":\s*("(?:[^"\\]|\\.)*"),\s*"source":\s*("(?:[^"\\]|\\.)*")')


class RecordBoxes(NamedTuple):
    """A frame's boxes: (N, 7) lidar boxes, (N,) scores (float64 when read back from a record) and N class names."""

    boxes: np.ndarray
    scores: np.ndarray
    names: list[str]


def record_field_problem(record: Mapping[str, Any]) -> str | None:
    """Why a per-frame record's 'frame' or 'source' is not infer's ("'frame' is 3, not a frame's name"), None when
    each is a string or not there: infer names its frame (a number or a list is another tool's), and a source is a
    point file's path, none in an earlier version's record (one not a string is damaged or another tool's, whose
    frame is unknown). One text for infer's check of a record in --out and eval's of a prediction file."""
    if "frame" in record and not isinstance(record["frame"], str):
        return f"'frame' is {safe_repr(record['frame'], 40)}, not a frame's name"
    if "source" in record and not isinstance(record["source"], str):
        return f"'source' is {safe_repr(record['source'], 40)}, not the path of a point file"
    return None


def record_boxes(record: object) -> RecordBoxes:
    """The boxes of infer's per-frame record (``Detections.to_json_dict``: a JSON file's, or a row of the part
    files: ``frame_row``), the one way back from what a run wrote to boxes. ValueError says why ``record`` is
    not such a record (a list missing or of another length, a box not of 7 numbers, a label not a name)."""
    if not isinstance(record, Mapping):
        raise ValueError("not a JSON object")
    missing = [key for key in _RECORD_LISTS if key not in record]
    if missing:
        raise ValueError(f"no {missing[0]!r}")
    boxes, scores = (_numbers(record[key], key) for key in _RECORD_LISTS[:2])
    names = record["labels"]
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        raise ValueError("'labels' is not a list of class names")
    if boxes.size == 0:
        boxes = boxes.reshape(0, 7)
    if boxes.ndim != 2 or boxes.shape[1] != 7:
        raise ValueError("'boxes_lidar' is not a list of boxes of 7 values each")
    if scores.ndim != 1 or not len(boxes) == len(scores) == len(names):
        raise ValueError(f"{counted(len(boxes), 'box', 'boxes')}, {counted(scores.size, 'score')} and "
                         f"{counted(len(names), 'label')}: expected one each a box")
    return RecordBoxes(boxes, scores, names)


def _numbers(values: Any, key: str) -> np.ndarray:
    """A record's list (of lists) of numbers as float64 (a string, bool or null in it is no number)."""
    try:
        array = np.asarray(values)
    except ValueError:  # ragged
        raise ValueError(f"{key!r} is not a list of numbers of one shape") from None
    if not isinstance(values, list) or (array.size and array.dtype.kind not in "iuf") or _holds_bool(values):
        raise ValueError(f"{key!r} is not a list of numbers")
    return array.astype(np.float64)


def _holds_bool(values: list[Any]) -> bool:
    """Whether a true or false is among ``values`` (or in a list in them): NumPy reads it as 1 or 0 beside
    numbers."""
    return any(isinstance(value, bool) or (isinstance(value, list) and _holds_bool(value)) for value in values)


def existing_parts(folder: Path, output_format: str) -> list[Path]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(folder / n for n in names
                  if n.startswith(PART_PREFIX) and n.endswith(f".{output_format}") and _part_number(Path(n)) >= 0)


def sources_in_parts(folder: Path, output_format: str) -> dict[str, bool]:
    """The frames the part files already in ``folder`` hold a row of (``row_key``), each with whether
    its row is a failure's (for ``--skip-existing``: a source never gets a second row, so a failed frame
    is not rerun, and is said to be, unless ``--retry-failed`` removes its row first:
    :func:`drop_failure_rows`); a damaged part is an error naming it, and so are parts that hold two rows of a
    frame (a part copied, or parts merged by hand), whose frames would each be counted twice."""
    done: dict[str, bool] = {}
    first_part: dict[str, Path] = {}  # a frame -> the part of its first row
    repeated: dict[str, tuple[str, Path, Path]] = {}  # a frame -> (its source, the parts of its first and next row)
    resolve = folder_resolver()
    for path in existing_parts(folder, output_format):
        try:
            for row in _part_rows(path, output_format, _KEY_COLUMNS):
                key = row_key(row, resolve)
                if key in done:
                    repeated.setdefault(key, (str(row.get("source", key)), first_part[key], path))
                first_part.setdefault(key, path)
                done[key] = row.get("error") is not None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"--skip-existing: cannot read {safe_repr(os.fspath(path))}: {one_line(exc)} (move that "
                             "part away, and this run redoes its frames)") from None
    if repeated:
        raise _repeated_rows_error(list(repeated.values()))
    return done


def _repeated_rows_error(repeated: list[tuple[str, Path, Path]]) -> InputError:
    """The refusal of part files that hold two rows of each of ``repeated``'s frames (source, first part, next
    part): a run writes one row a frame, so one of them was copied or merged in by hand."""
    source, first, again = repeated[0]
    where = (f"{safe_repr(os.fspath(first))} holds two rows" if first == again else
             f"{safe_repr(os.fspath(first))} and {safe_repr(os.fspath(again))} both hold a row")
    parts = {part for _, *pair in repeated for part in pair}
    more = f", in {len(parts)} part files in all" if len(parts) > 2 else ""
    return InputError(f"--skip-existing: {where} of {counted(len(repeated), 'frame')} "
                      f"({example(len(repeated), safe_repr(source))}{more}), "
                      "where a run writes one row a frame (a part copied, or parts merged by hand?): move the part that "
                      "repeats another away (or remove its repeated rows), and this run skips the frames of the rows "
                      "kept")


def records_in_parts(folder: Path, output_format: str,
                     sources: Collection[str]) -> Iterable[tuple[str, dict[str, Any], Path]]:
    """(source, row, part file) of each row in ``folder``'s part files of one of ``sources`` (``frame_key``s,
    as ``--skip-existing`` compares them) that is no failure's, part by part (a source's last row
    comes last, as in ``sources_in_parts``): the records a resumed --eval rebuilds the skipped frames' KITTI
    lines from. A part that cannot be read is an error naming it."""
    resolve = folder_resolver()
    for path in existing_parts(folder, output_format):
        try:
            rows = _part_rows(path, output_format)
            found = [(source, row) for row in rows if row.get("error") is None
                     and (source := row_key(row, resolve)) in sources]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"--eval: cannot read {safe_repr(os.fspath(path))}: {one_line(exc)}") from None
        for source, row in found:
            yield source, row, path


def _part_rows(path: Path, output_format: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a part file (of Parquet, ``columns`` only when given; a JSON Lines row is read whole); ValueError
    where one is not a row infer writes (``_check_row``), naming it by its line (its row of a Parquet part)."""
    kind = special_kind(path)
    if kind is not None:  # reading a FIFO would wait for a writer
        raise ValueError(f"it is {kind}, not a regular file")
    if output_format == "jsonl":
        rows = []
        opened, _ = open_regular_file(path, max_bytes=_ANY_SIZE, what="part file")
        with io.TextIOWrapper(opened, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = loads_json(line)
                    except ValueError as exc:  # json's own message counts within the line: name the line
                        raise ValueError(f"line {number}: {exc}") from None
                    _check_row(row, f"line {number}")
                    rows.append(row)
        return rows
    import pyarrow.parquet as pq

    if columns is not None:  # those a part has (one written before rows had ``path`` lacks it)
        names = set(pq.read_schema(path).names)
        columns = [name for name in columns if name in names]
    rows = list(pq.read_table(path, columns=columns).to_pylist())
    for number, row in enumerate(rows, 1):
        _check_row(row, f"row {number}")
    return rows


def _check_row(row: object, where: str) -> None:
    """A ValueError naming ``where`` (its line, or row) unless ``row`` is one infer writes as far as a resume reads it
    (``frame_row``): an object whose ``source`` is a string, and ``path`` and ``error`` strings or null; a part of
    others (another tool's, or edited by hand) would be matched to no frame, or fail past its read."""
    if not isinstance(row, dict):
        problem = "not a JSON object"
    elif not isinstance(row.get("source"), str):
        problem = "no 'source' string naming its point file"
    else:
        wrong = next((key for key in ("path", "error") if not isinstance(row.get(key), (str, type(None)))), None)
        if wrong is None:
            return
        problem = f"its {wrong!r} is neither a string nor null"
    raise ValueError(f"{where}: not a row infer writes ({problem})")


def drop_failure_rows(folder: Path, output_format: str, sources: Collection[str]) -> None:
    """For ``--retry-failed``: rewrite each part file in ``folder`` that holds the failure row of one of
    ``sources`` (``frame_key``s, as ``--skip-existing`` compares them) without those rows, so
    that those frames can run again and a source still has one row at most. Each part is replaced
    atomically and durably before any frame runs (a JSON Lines part keeps its other lines byte for byte,
    a Parquet part its schema); a part left with no row is removed.

    A crash after the rewrite, before the frames' new rows are written, leaves those frames with no
    row at all, which a later ``--skip-existing`` run reruns anyway: no row is lost for good, none doubled.
    """
    changed = False
    for path in existing_parts(folder, output_format):
        try:
            kept = _part_without(path, output_format, sources)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"--retry-failed: cannot read {safe_repr(os.fspath(path))}: {one_line(exc)}") from None
        if kept is not None:
            checked_write(path, functools.partial(write_bytes_atomic, data=kept) if kept else Path.unlink)
            changed = True
    if changed:
        checked_write(folder, fsync_path)  # the renames and removals, before any new row is written


def _part_without(path: Path, output_format: str, sources: Collection[str]) -> bytes | None:
    """The part's bytes without the failure rows of ``sources`` (b"": no row left), or None when it
    holds none of them."""
    if output_format == "jsonl":
        with open(path, "rb") as f:
            lines = list(f)  # split at b"\n" only, each line's bytes kept as they are
        kept = [line for line in lines if not (line.strip() and _is_failure_of(loads_json(line), sources))]
        if len(kept) == len(lines):
            return None
        return b"".join(kept) if any(line.strip() for line in kept) else b""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    keys = [name for name in _KEY_COLUMNS if name in table.column_names]
    keep = [not _is_failure_of(row, sources) for row in table.select(keys).to_pylist()]
    if all(keep):
        return None
    if not any(keep):
        return b""
    buffer = io.BytesIO()
    pq.write_table(table.filter(pa.array(keep, pa.bool_())), buffer)
    return buffer.getvalue()


def _is_failure_of(row: dict[str, Any], sources: Collection[str]) -> bool:
    """Whether ``row`` is the failure row of one of ``sources`` (``frame_key``s)."""
    return row.get("error") is not None and row_key(row) in sources


def _part_number(path: Path) -> int:
    digits = path.name[len(PART_PREFIX):].split(".", 1)[0]
    return int(digits) if digits.isdigit() else -1


def require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.json  # noqa: F401  (parts are parsed from their JSON lines)
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise InputError("--format parquet needs pyarrow: pip install pyarrow (the parquet extra), or use --format jsonl") from None


#: How a row's text (``row_text``: json.dumps' separators) holds the velocities of a model that predicts them;
#: a string value cannot hold it (its quotes are escaped).
_VELOCITY_KEY = '"velocity": ['
#: Arrow types of the list fields of the per-frame JSON record; its scalar fields are typed by value.
_LIST_COLUMNS = {"boxes_lidar": "list<list<double>>", "scores": "list<double>", "labels": "list<string>",
                 "velocity": "list<list<double>>"}


def row_schema(class_names: tuple[str, ...], velocity: bool = False) -> Any:
    """The Arrow schema of :func:`frame_row`: one column per field of the record (probed on an empty
    result, so a new field of ``Detections.to_json_dict`` becomes a new column); ``velocity``: of a model
    that predicts velocities (its records hold them)."""
    import pyarrow as pa

    from ..errors import BackendError

    lists = {"list<list<double>>": pa.list_(pa.list_(pa.float64())), "list<double>": pa.list_(pa.float64()),
             "list<string>": pa.list_(pa.string())}
    scalars = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    from ..detections import Detections, FrameStats

    probe = Detections.empty(class_names, FrameStats(0), velocity)
    fields = [("source", pa.string()), ("path", pa.string()), ("error", pa.string())]
    for key, value in frame_row("", probe, None, class_names).items():
        if key in ("source", "path", "error"):
            continue
        if key in _LIST_COLUMNS:
            fields.append((key, lists[_LIST_COLUMNS[key]]))
        elif type(value) in scalars:
            fields.append((key, scalars[type(value)]))
        else:
            raise BackendError(f"row output: no column type for record field {key!r}")
    return pa.schema(fields)
