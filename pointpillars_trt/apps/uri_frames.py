"""The frames of ``infer --ray``'s URIs (``s3://bucket/drive42/``, ``file:///data/frames``), listed through Ray
Data before anything runs and then taken as local ``infer`` takes a folder: its point files in name order,
subfolders and other files left out, and the run's frames checked as local frames are (a frame given twice,
two frames of one output file). Their bytes are read in Ray Data's tasks through the file system it listed them
on, a frame at a time: one that cannot be read is that frame's error, as a local file's read is."""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import InputError, one_line, safe_repr
from ..file_reads import read_bounded, special_kind
from ..pointcloud_io import SUPPORTED_EXTENSIONS, refuse_oversize
from ..points import MAX_FRAME_POINTS

#: The logger of Ray Data's listing, which warns of each path it cannot resolve and skips it.
_PATH_LOGGER = "ray.data.datasource.path_util"


def is_uri(path: str) -> bool:
    """Whether ``path`` names frames that Ray Data lists and reads itself (``s3://bucket/drive42/``,
    ``file:///data/frames``), not a local path: it holds ``://`` and names nothing here (a path that
    exists is taken literally, as ``infer`` takes it)."""
    return "://" in path and not os.path.lexists(path)


def _file_system(source: str) -> str:
    """The scheme of the file system Ray Data reads ``source`` through (a local path's: file)."""
    return source.split("://", 1)[0].lower() if is_uri(source) else "file"


def check_one_file_system(sources: Sequence[str]) -> None:
    """Frames given as URIs, with any local paths beside them, on one file system: Ray Data reads a run's
    files through the first one's (a local path read from S3 fails mid-run, a local:// URI beside a local
    path is refused by its listing)."""
    systems: dict[str, str] = {}
    for source in sources:
        systems.setdefault(_file_system(source), source)
    if len(systems) > 1:
        (first, one), (second, other) = list(systems.items())[:2]
        raise InputError(f"{safe_repr(one)} and {safe_repr(other)}: Ray Data reads the frames of a run through one "
                         f"file system, and these are on two ({first}://, {second}://): run them separately")


class UriFrames(NamedTuple):
    """The frames of a run's URIs: ``names`` as Ray Data reports them, ``reads`` the paths to read them by on
    ``filesystem`` and ``sizes`` their sizes as listed (in the same order), and ``refused``: (name, error) of each
    point file of a ``file://`` URI, or in a ``file://`` folder, that Ray Data's listing leaves out or takes for
    missing because it is no regular file (a FIFO, a device), and of each frame larger than a frame may be, which
    local ``infer`` reports as a failed frame."""

    names: list[str]
    reads: list[str]
    sizes: list[int]
    refused: list[tuple[str, str]]
    filesystem: Any  # Ray Data's own (pyarrow), with its retries of a store's transient errors


def calib_probes(frames: Sequence[str], calib: str | None) -> list[str]:
    """What stands for the URIs among ``frames`` where a run checks its frames' calib folders before the cluster
    starts (the camera-FOV crop and KITTI lines read a frame's calib file on the worker, by the name Ray Data
    lists it by): a ``file://`` URI's path here (a folder's as a frame in it). Without ``--calib``, a URI of
    another file system names no calib file on this machine: refused, before any frame runs."""
    probes = []
    for frame in frames:
        if not is_uri(frame):
            continue
        if _file_system(frame) != "file":
            if calib is None:
                raise InputError(f"{safe_repr(frame)}: the camera-FOV crop and KITTI lines need each frame's calib "
                                 "file, and a frame of a URI has its sibling calib/ on this machine only for file:// "
                                 "URIs: pass --calib DIR (each frame's <id>.txt, on every worker), or --no-fov-only "
                                 "with --format json")
            continue
        path = _uri_path(frame)
        probes.append(path if os.path.splitext(path)[1].lower() in SUPPORTED_EXTENSIONS else os.path.join(path, "x.bin"))
    return [] if calib is not None else probes


def list_uri_frames(ray: Any, sources: list[str], point_dim: int) -> UriFrames:
    """The frames of ``sources``, in the order given: a URI of a file is that frame, a URI of a folder the
    point files directly in it, sorted by name (Ray Data lists a folder's subfolders too, and every file in
    them); local paths beside the URIs stay as they are. A URI that Ray Data cannot list, or that holds no
    point file, is an InputError before any actor starts. A ``file://`` URI of a FIFO or a device (which Ray
    Data's listing takes for a missing file, ending the run) is a refused frame, and so are a ``file://`` point file
    whose name is no UTF-8 (which fails its listing: ``_listable_by_name``) and a frame whose listed size is beyond
    the frame limit for ``point_dim`` values a point (refused unread, as a local read refuses it)."""
    kinds = {source: _special_kind_here(source) for source in sources}
    special = [(source, _not_regular(source, kind)) for source, kind in kinds.items() if kind is not None]
    special += [(source, _undecodable(source)) for source in sources if kinds[source] is None and not _utf8(source)]
    sources = [source for source in sources if kinds[source] is None and _utf8(source)]
    if not sources:
        raise InputError(special[0][1])
    undecodable: dict[str, list[tuple[str, str]]] = {}  # a file:// folder's point files named in other bytes
    try:
        sizes, filesystem = _list(ray, sources)
    except _UndecodableName:  # listed again with such folders given file by file
        listable, undecodable = _listable_by_name(sources)
        sizes, filesystem = _list(ray, listable) if listable else ({}, None)  # none: each folder's error below
    point_files: dict[str, list[str]] = {}  # a folder's point files, sorted by name
    for name in sorted(sizes):
        if os.path.splitext(name)[1].lower() in SUPPORTED_EXTENSIONS:
            point_files.setdefault(posixpath.dirname(name), []).append(name)
    frames = UriFrames([], [], [], special, filesystem)
    for source in sources:
        if not is_uri(source):  # read by its path here (a read task's working folder may be another)
            _add_frame(frames, source, os.path.abspath(source), sizes, point_dim)
            continue
        found = _frames_under(source, set(sizes), point_files)
        refused = _special_point_files(source, set(found)) + undecodable.get(source, [])
        if not found:
            others = f"; {refused[0][1]}" if refused else ""
            raise InputError(f"{safe_repr(source)}: Ray Data lists no point file in it "
                             f"({', '.join(SUPPORTED_EXTENSIONS)}, subfolders left out, as infer lists a folder){others}")
        for name in found:
            _add_frame(frames, name, name, sizes, point_dim)
        frames.refused.extend(refused)
    return frames


def _add_frame(frames: UriFrames, name: str, read: str, sizes: dict[str, int], point_dim: int) -> None:
    """The frame ``name`` (read by ``read``) among ``frames``, or among those refused when its size as listed is
    beyond a frame's: refused unread, as a local read refuses it by its size."""
    try:
        refuse_oversize(name, sizes.get(read, 0), 4 * point_dim, "point file")
    except InputError as exc:
        frames.refused.append((name, str(exc)))
        return
    frames.names.append(name)
    frames.reads.append(read)
    frames.sizes.append(sizes.get(read, 0))


def read_uri_frames(batch: dict[str, np.ndarray], filesystem: Any, point_dim: int) -> dict[str, list[Any]]:
    """Ray Data's task for a batch of a run's URI frames {path: the name, read: the path on ``filesystem``, size: its
    size as listed}: each frame's bytes or why there are none, for its error; Ray Data's own read of them ended the run,
    with its traceback, at the first frame gone or unreadable since the listing."""
    read = [_read_frame(filesystem, str(name), str(path), int(size), MAX_FRAME_POINTS * 4 * point_dim)
            for name, path, size in zip(batch["path"], batch["read"], batch["size"])]
    return {"path": list(batch["path"]), "bytes": [data for data, _ in read], "error": [error for _, error in read]}


def _read_frame(filesystem: Any, name: str, path: str, size: int, max_bytes: int) -> tuple[bytes, str]:
    """(the bytes at ``path``, listed as ``size`` bytes, ""), or (b"", the error of the frame ``name``): none there,
    a read that failed, or more than ``max_bytes`` (a file grown since its listed size was checked, or listed as
    empty: never more is read). Read by its listed size, as a local file is by its stat: one request to an object
    store for a frame as listed, and memory that follows what the file holds, not the frame limit."""
    try:
        with filesystem.open_input_stream(path) as stream:
            data = read_bounded(stream, max_bytes + 1, size)
    except FileNotFoundError:
        return b"", f"point file {safe_repr(name)} does not exist"
    except OSError as exc:
        return b"", f"point file {safe_repr(name)} cannot be read: {one_line(exc.strerror or exc)}"
    if len(data) > max_bytes:
        limit = f"the limit of {MAX_FRAME_POINTS} points a frame"
        if not size:  # an object listed before it was written, or a file whose size counts none of its bytes (procfs)
            return b"", f"point file {safe_repr(name)}: its listing said 0 bytes, and it holds more than {limit}"
        return b"", f"point file {safe_repr(name)} grew past {limit} once listed"
    return data, ""


def _special_kind_here(source: str) -> str | None:
    """What a ``file://`` URI names here when that is neither a regular file nor a folder (a FIFO, a device)."""
    if not is_uri(source) or _file_system(source) != "file":
        return None
    return special_kind(_uri_path(source))


def _special_point_files(source: str, found: set[str]) -> list[tuple[str, str]]:
    """(path, error) of each entry with a point file's name in the local folder a ``file://`` URI names that
    is neither a folder nor among the files Ray Data ``found`` there: it lists regular files only, and would
    leave a FIFO or a device out without a word."""
    if _file_system(source) != "file":
        return []
    folder = _uri_path(source).rstrip("/") or "/"
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.path for e in entries if os.path.splitext(e.name)[1].lower() in SUPPORTED_EXTENSIONS)
    except OSError:  # a file, or a folder that cannot be listed: Ray Data's listing says what it found
        return []
    refused = []
    for path in names:
        kind = None if path in found else special_kind(path)
        if kind is not None:
            refused.append((path, _not_regular(path, kind)))
    return refused


def _listable_by_name(sources: list[str]) -> tuple[list[str], dict[str, list[tuple[str, str]]]]:
    """``sources`` as Ray Data can list them once its listing failed at a name that is no UTF-8 (it fails the whole
    run there, wherever under a folder the name is): each ``file://`` folder holding such a name, at any depth, as
    the ``file://`` URIs of its regular point files (its subfolders are left out all the same), and, by that folder,
    (path, error) of each of its point files whose name is no UTF-8."""
    listable: list[str] = []
    undecodable: dict[str, list[tuple[str, str]]] = {}
    for source in sources:
        path = _uri_path(source) if is_uri(source) and _file_system(source) == "file" else None
        if path is None or not os.path.isdir(path) or not _holds_undecodable_name(path):
            listable.append(source)
            continue
        with os.scandir(path) as entries:
            names = sorted(e.path for e in entries if os.path.splitext(e.name)[1].lower() in SUPPORTED_EXTENSIONS
                           and e.is_file())
        listable.extend(f"file://{name}" for name in names if _utf8(name))
        undecodable[source] = [(name, _undecodable(name)) for name in names if not _utf8(name)]
    return listable, undecodable


def _utf8(path: str) -> bool:
    """Whether ``path`` is UTF-8 (a name of other bytes holds surrogate escapes here)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _holds_undecodable_name(folder: str) -> bool:
    """Whether a name under ``folder``, at any depth (Ray Data's listing walks them all), is no UTF-8."""
    return any(not _utf8(name) for _, folders, files in os.walk(folder) for name in (*folders, *files))


def _undecodable(path: str) -> str:
    """The error of a point file (or a ``file://`` URI) whose name Ray Data cannot list, with what reads it."""
    return (f"point file {safe_repr(path)}: its name is not UTF-8, which Ray Data cannot list: rename it, or give "
            "it or its folder as a local path (not a file:// URI)")


def _uri_path(uri: str) -> str:
    """What follows a URI's scheme: for ``file://`` URIs, the path on this machine."""
    return uri.split("://", 1)[1]


def _not_regular(path: str, kind: str) -> str:
    """The error of a point file that is ``kind`` (a FIFO, a device), as a local read says it."""
    return f"point file {safe_repr(path)} is {kind}, not a regular file"


def _frames_under(source: str, listed: set[str], point_files: dict[str, list[str]]) -> list[str]:
    """The frames ``source`` gives of those ``listed`` (``point_files``: each listed folder's).
    Ray Data names a listed file by its path on the file system, without the scheme (``file:///d/a.bin``:
    ``/d/a.bin``; ``s3://bucket/d/a.bin``: ``bucket/d/a.bin``; ``hdfs://host:8020/d/a.bin``: ``/d/a.bin``)."""
    rest = _uri_path(source)
    paths = [rest] + ([rest[rest.index("/"):]] if "/" in rest and not rest.startswith("/") else [])
    for path in paths:
        root = path.rstrip("/") or "/"
        if root in listed:  # a file
            return [root]
        if root in point_files:
            return point_files[root]
    return []


def _list(ray: Any, sources: list[str]) -> tuple[dict[str, int], Any]:
    """The size of each file Ray Data lists of ``sources`` (URIs, with any local files beside them), by its name
    there, and the file system it lists them on: a URI it cannot list (no such file or folder, no file system for
    its scheme, a store that refuses) is one InputError, where Ray Data would skip it with a warning or stop the
    run mid-way with a traceback."""
    unresolved = _Unresolved()
    logger = logging.getLogger(_PATH_LOGGER)
    logger.addFilter(unresolved)
    try:
        dataset = ray.data.read_binary_files(sources, include_paths=True)
    except UnicodeError as exc:  # a name that is no UTF-8 under a file:// folder (list_uri_frames lists it again)
        raise _UndecodableName(_unreadable(sources, exc)) from None
    except (OSError, ValueError) as exc:
        if not unresolved.found:  # else (all of them unresolved: "no files found") the reason is said below
            raise InputError(_unreadable(sources, exc)) from None
    finally:
        logger.removeFilter(unresolved)
    if unresolved.found:
        path, reason = unresolved.found[0]
        raise InputError(f"{safe_repr(path)}: Ray Data cannot read it: {one_line(reason)}")
    try:  # where Ray Data keeps its listing's sizes and file system: no public accessor
        datasource = dataset._logical_plan.dag.datasource
        return {str(name): int(size or 0) for name, size in zip(datasource._paths(), datasource._file_sizes())}, \
            datasource._filesystem
    except AttributeError:  # a Ray version that keeps them elsewhere
        return listed_sizes(dataset, sources)


def listed_sizes(dataset: Any, sources: list[str]) -> tuple[dict[str, int], Any]:
    """``_list``'s sizes and file system through public calls only: the names Ray Data listed
    (``input_files``), stat'ed on pyarrow's file system of the first URI (one request a file on an object
    store, where Ray Data's listing had the sizes already)."""
    import pyarrow.fs

    names = [str(name) for name in dataset.input_files()]
    uri = next((source for source in sources if is_uri(source)), None)
    filesystem = pyarrow.fs.FileSystem.from_uri(uri)[0] if uri is not None else pyarrow.fs.LocalFileSystem()
    return {name: int(info.size or 0) for name, info in zip(names, filesystem.get_file_info(names))}, filesystem


class _UndecodableName(InputError):
    """Ray Data's listing met a name that is no UTF-8."""


class _Unresolved(logging.Filter):
    """The paths Ray Data's listing skips, with a warning only, for want of a file system that reads them
    (an unknown scheme, a missing extra): kept here, to be refused in one error line."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        said = re.fullmatch(r"Failed to resolve path '(.*?)': (.*), skipping", record.getMessage(), re.DOTALL)
        if said is None:
            return True
        cause = re.search(r"Initial error: (.*?)(?:\. URL encoding fallback|$)", said[2], re.DOTALL)
        self.found.append((said[1], cause[1] if cause else said[2]))
        return False


def _unreadable(sources: list[str], exc: OSError | ValueError) -> str:
    """Why Ray Data's listing refused ``sources``, in one line."""
    if isinstance(exc, FileNotFoundError) and exc.strerror is None:  # pyarrow's: the path alone
        reason = f"no such file or folder ({safe_repr(str(exc))})"
    else:
        reason = one_line(exc.strerror or exc) if isinstance(exc, OSError) else one_line(exc)
    named = f"{safe_repr(sources[0])}: Ray Data cannot read it" if len(sources) == 1 else \
        "Ray Data cannot read the frames given"
    return f"{named}: {reason}"
