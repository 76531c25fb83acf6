"""The command line's PATH arguments made into frames, and the checks on them before anything runs.

Files, folders and globs become point files (``expand_frame_paths``); a path that gives no frame, a frame
given twice and two frames that would write one output file are refused up front. Local infer,
``infer --server`` and ``infer --ray`` read their frames here.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import InputError, InputErrors, agree, counted, example, safe_repr
from ..file_reads import folder_resolver, home_hint, special_kind
from ..model_dir import CHECKPOINT_SUFFIXES, METADATA_FILE
from ..pointcloud_io import POINT_FORMAT_CONVERSIONS, SUPPORTED_EXTENSIONS, unsupported_extension


#: What parts a pattern's path components: the separator, and the other one where the system has two (Windows).
_SEPARATORS = "[" + re.escape(os.sep + (os.altsep or "")) + "]"


def _is_point_file(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in SUPPORTED_EXTENSIONS


def expand_frame_paths(patterns: Sequence[str], errors: list[str] | None = None,
                       as_given: Callable[[str], bool] | None = None) -> list[str]:
    """Point files from files, folders and globs, in the order given (folders and globs sorted).

    A path that exists is taken literally (so ``scan[1].bin`` works); a folder gives its point
    files but hidden ones (said once a folder); otherwise a pattern with glob characters is expanded
    (``**``: folders at any depth) to the point files it matches, as a folder is listed. The files of a point
    format that is not read (``.npz``, ``.ply``) that folders and globs leave out are said in one note. A path
    that gives no frame (it does not exist or cannot be reached, a folder without point files or that cannot be
    listed, a pattern that matches no point file) is a problem of its own: all of them are one InputErrors (one
    message each, before any model loads), or, given
    ``errors`` and other patterns that do give frames, messages appended there (the caller reports
    them; the rest runs). Patterns ``as_given`` picks stay as they are, counted as giving frames
    (``infer --ray``'s URIs, which Ray Data lists).
    """
    frames: list[str] = []
    problems: list[str] = []
    left_out = _LeftOut()
    for pattern in patterns:
        found, others = ([pattern], 0) if as_given is not None and as_given(pattern) else _frames_of(pattern, left_out)
        if not found:
            problems.append(_no_frames(pattern, others))
        frames.extend(found)
    left_out.say()
    if problems and (errors is None or not frames):
        raise InputErrors(problems)
    if errors is not None:
        errors.extend(problems)
    return frames


class _LeftOut:
    """The files of point formats that are not read (``.npz``, ``.ply``: those a file given by name is refused
    with a conversion for) that folders and globs left out: a count and the first path of each format, so that a
    folder of 100k of them costs no more than one."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, str] = {}

    def add(self, path: str) -> None:
        """Count ``path`` when it is a file of a point format that is not read (said by :meth:`say`)."""
        ext = os.path.splitext(path)[1].lower()
        if ext in POINT_FORMAT_CONVERSIONS and not os.path.isdir(path):
            self.counts[ext] = self.counts.get(ext, 0) + 1
            self.first.setdefault(ext, path)

    def say(self) -> None:
        """One note of the files left out, by format, each with its first path and how to convert it."""
        if not self.counts:
            return
        kinds = "; ".join(f"{count} {ext} ({example(count, safe_repr(self.first[ext]))}): "
                          f"{POINT_FORMAT_CONVERSIONS[ext]}" for ext, count in sorted(self.counts.items()))
        print(f"note: {counted(sum(self.counts.values()), 'file')} of point formats that are not read left out of the "
              f"folders and globs given: {kinds}", file=sys.stderr, flush=True)


def _frames_of(pattern: str, left_out: _LeftOut) -> tuple[list[str], int]:
    """The frames one path gives: itself when it exists (and is no folder), a folder's point files,
    a pattern's matching point files; none when it does not exist. With them, how many files a pattern matched
    that are no point files (0 for a path that is no pattern). ``left_out`` counts the files of point formats
    that are not read of a folder or a pattern."""
    if os.path.isdir(pattern):
        try:
            names = os.listdir(pattern)
        except OSError:  # a folder that cannot be listed gives no frame: _no_frames says why
            return [], 0
        files = [n for n in names if _is_point_file(n) and not os.path.isdir(os.path.join(pattern, n))]
        hidden = sorted(n for n in files if n.startswith("."))
        if hidden:  # as a glob and ls leave them out: macOS's ._*.bin metadata files, editors' temporary copies
            print(f"note: folder {safe_repr(pattern)}: {counted(len(hidden), 'hidden file')} left out "
                  f"({example(len(hidden), safe_repr(hidden[0]))}: macOS metadata?); give one by name to run it",
                  file=sys.stderr, flush=True)
        for name in sorted(names):
            if not name.startswith("."):
                left_out.add(os.path.join(pattern, name))
        return sorted(os.path.join(pattern, n) for n in files if not n.startswith(".")), 0
    if missing_path(pattern):
        return [], 0
    if os.path.lexists(pattern):  # a .txt or a FIFO given by name: refused with the rest, before the model loads
        return ([pattern] if _is_point_file(pattern) and special_kind(pattern) is None else []), 0
    matched = sorted(p for p in _glob(pattern) if not os.path.isdir(p))
    frames = [p for p in matched if _is_point_file(p)]  # as a folder's: labels, calib, notes beside the frames left out
    for path in matched:
        left_out.add(path)
    return frames, len(matched) - len(frames)


def _glob(pattern: str) -> list[str]:
    """The paths ``pattern`` matches (a pattern's folders among them): ``**`` as a whole path component matches
    folders at any depth, as in a shell with globstar (without it, ** was one folder deep; last, it gives the files
    below), as ``glob.glob(pattern, recursive=True)`` does, but each folder is searched once, whatever symbolic links
    lead to it again. glob followed every link, so a tree with two links to a folder above them gave paths without
    end (2**40 before the kernel's limit of 40 links a path), and a run that never started."""
    parts = re.split(_SEPARATORS, pattern)
    if "**" not in parts:
        return glob.glob(pattern, recursive=True)
    star = parts.index("**")
    head, tail = os.sep.join(parts[:star]) or (os.sep if star else ""), parts[star + 1:]
    bases = [b for b in glob.glob(head) if os.path.isdir(b)] if glob.has_magic(head) else [head]
    found: list[str] = []
    seen: set[tuple[int, int]] = set()  # (device, inode) of the folders searched
    for base in bases:
        for top, folders, files in os.walk(base or os.curdir, followlinks=True):
            try:
                info = os.stat(top)
            except OSError:
                info = None
            if info is None or (info.st_dev, info.st_ino) in seen:
                folders.clear()
                continue
            seen.add((info.st_dev, info.st_ino))
            folders[:] = sorted(name for name in folders if not name.startswith("."))  # as glob's ** leaves them out
            relative = os.path.relpath(top, base or os.curdir)
            folder = base if relative == os.curdir else os.path.join(base, relative)
            if tail == [""]:  # **/ last: the folders
                found.append(os.path.join(folder, ""))
            elif tail:
                found += _glob(os.path.join(glob.escape(folder), *tail) if folder else os.path.join(*tail))
            else:  # ** last: every file below
                found += [os.path.join(folder, name) for name in files if not name.startswith(".")]
    return found


def missing_path(pattern: str) -> bool:
    """A path that does not exist and is no glob pattern: nothing can come of it."""
    return not os.path.lexists(pattern) and not glob.has_magic(pattern)


def model_kind(path: str) -> str | None:
    """"a model dir" or "a checkpoint" when ``path`` is one (a folder holding model.json, a file of a checkpoint's
    suffix): what is given as ``--model``, found among point files; else None."""
    if os.path.isdir(path):
        return "a model dir" if os.path.isfile(os.path.join(path, METADATA_FILE)) else None
    return "a checkpoint" if path.lower().endswith(CHECKPOINT_SUFFIXES) and os.path.isfile(path) else None


def _no_frames(pattern: str, others: int = 0) -> str:
    """Why a path gives no frame (``others``: the files a pattern matched, none a point file). A missing path
    is named a point file only when it has a point file's suffix (no trailing separator): ``seq/`` or
    ``velodyne`` may as well have been meant as a folder."""
    model = model_kind(pattern)
    if model is not None:
        frames = "a folder of point files" if model == "a model dir" else "a point file"
        return f"{safe_repr(pattern)} is {model}, not {frames}: give it as --model"
    if os.path.isdir(pattern):
        try:
            os.listdir(pattern)
        except OSError as exc:
            return f"folder {safe_repr(pattern)} cannot be listed: {exc.strerror or exc}"
        return (f"folder {safe_repr(pattern)} holds no point files ({', '.join(SUPPORTED_EXTENSIONS)})"
                + _subfolders_hint(pattern))
    unreachable = _unreachable(pattern)
    if unreachable is not None:
        return f"{safe_repr(pattern)} cannot be reached: {unreachable}"
    kind = special_kind(pattern)
    if kind is not None:
        return f"{safe_repr(pattern)} is {kind}, not a regular file: give point files"
    if os.path.lexists(pattern):
        return f"{safe_repr(pattern)} is not a point file: it has {unsupported_extension(os.path.splitext(pattern)[1])}"
    if glob.has_magic(pattern) and others:
        return (f"{safe_repr(pattern)} matched {counted(others, 'file')}, none a point file "
                f"({', '.join(SUPPORTED_EXTENSIONS)})")
    if glob.has_magic(pattern):
        return f"{safe_repr(pattern)}: no such file, and no file matches it as a pattern"
    uri = " (a URI is read by infer --ray alone)" if "://" in pattern else ""
    if _is_point_file(pattern):
        return f"point file {safe_repr(pattern)} does not exist{uri}{home_hint(pattern)}"
    return f"{safe_repr(pattern)}: no such file or folder{uri}{home_hint(pattern)}"


#: Subfolders of a folder without point files that are looked into for the hint that they hold some.
_SUBFOLDERS_LOOKED_AT = 64


def _subfolders_hint(folder: str) -> str:
    """'; subfolders are not searched: <a>, <b> hold point files' when some do (e.g. KITTI's ``training/``,
    whose frames are in ``velodyne/``), else ''. At most ``_SUBFOLDERS_LOOKED_AT`` are looked into."""
    holding: list[str] = []
    try:
        with os.scandir(folder) as entries:
            subfolders = sorted(e.path for e in entries if e.is_dir())[:_SUBFOLDERS_LOOKED_AT]
    except OSError:
        return ""
    for sub in subfolders:
        try:
            with os.scandir(sub) as entries:
                if any(_is_point_file(e.name) and e.is_file() for e in entries):
                    holding.append(sub)
        except OSError:
            continue
    if not holding:
        return ""
    shown = ", ".join(safe_repr(sub) for sub in holding[:3]) + (f" and {len(holding) - 3} more" if len(holding) > 3 else "")
    return (f"; subfolders are not searched: {shown} {agree(len(holding), 'holds', 'hold')} point files, give them "
            "as paths")


def _unreachable(path: str) -> str | None:
    """Why ``path`` cannot be looked at, when that is not its absence: ``os.path.lexists`` says False for any
    error, so a file below a folder without search permission read as "does not exist"."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM):
            return f"{why} (a folder on its path that this user cannot search?)"
        if exc.errno == errno.ELOOP:
            return f"{why} (a symbolic link on its path that leads back to itself?)"
        return why
    return None


def check_distinct_outputs(frames: Sequence[str], suffixes: Sequence[str], reserved: Sequence[str] = ()) -> None:
    """Each frame given once, and each of its output files (``<stem><suffix>``) its own: refused before
    anything runs (:func:`refuse_repeated_frames`, :func:`check_unique_names`)."""
    refuse_repeated_frames(frames)
    if suffixes:
        check_unique_names(frames, suffixes, reserved)


def refuse_repeated_frames(frames: Sequence[str]) -> None:
    """A frame named twice (compared with their folders resolved: ``a/x.bin``, ``/abs/a/x.bin`` and
    ``link-to-a/x.bin`` are one frame; two names linked to one stored file, as git-annex or DVC keep
    frames, are two) would be run and written twice (two rows of one source in a row format): refuse it
    before anything runs."""
    repeated = first_repeat(frames, folder_resolver())
    if repeated is not None:
        frame, also = repeated
        raise InputError(f"frame {safe_repr(frame)} is given twice{also} (by two arguments, a folder and a file "
                         "in it, or a symbolic link to it): give each frame once")


def first_repeat(paths: Sequence[str], key: Callable[[str], str]) -> tuple[str, str] | None:
    """The first of ``paths`` whose ``key`` an earlier one has (None: none), with the words that name that earlier
    one where it is spelt otherwise (`` (as 'a/x.bin' too)``; "" where the two are one path spelt alike)."""
    seen: dict[str, str] = {}
    for path in paths:
        name = key(path)
        other = seen.get(name)
        if other is not None:
            return path, "" if os.path.abspath(other) == os.path.abspath(path) else f" (as {safe_repr(other)} too)"
        seen[name] = path
    return None


def check_unique_names(frames: Sequence[str], suffixes: Sequence[str] = (".json",),
                       reserved: Sequence[str] = ()) -> None:
    """Outputs are named after the frame (``<stem><suffix>``), so two frames of one stem would
    overwrite each other: refuse them before anything runs (a frame named twice is refused before
    this, by :func:`refuse_repeated_frames`)."""
    by_name: dict[str, list[str]] = {}
    for frame in frames:
        by_name.setdefault(Path(frame).stem, []).append(frame)
    clashes = [paths for paths in by_name.values() if len(paths) > 1]
    if clashes:
        first = clashes[0]
        raise InputError(
            f"frames {safe_repr(first[0])} and {safe_repr(first[1])} would write the same output file "
            f"{safe_repr(Path(first[0]).stem + suffixes[0])} ({counted(len(clashes), 'such name')}); "
            "run them into separate --out folders"
        )
    taken = [Path(f).stem + suffix for f in frames for suffix in suffixes if Path(f).stem + suffix in reserved]
    if taken:
        raise InputError(f"a frame's output {safe_repr(taken[0])} would overwrite the run's own output of that name")
