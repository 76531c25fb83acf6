"""File I/O every part shares: bounded reads of regular files, the one atomic writer (temp file,
rename; fsync per file or one flush pass per run), strict JSON, and the escaped form in which file
names and values enter messages."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import hashlib
import io
import json
import math
import os
import re
import secrets
import shutil
import socket
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, Union

import numpy as np

from .errors import InputError, PointPillarsError, safe_repr

PathLike = Union[str, "os.PathLike[str]"]

# --------------------------------------------------------------------------- messages

def name_text(name: str) -> str:
    """A file name as text every strict UTF-8 reader takes (JSON, Arrow): the name itself when it is
    valid UTF-8, else its undecodable bytes (lone surrogates under Python's surrogateescape) as
    ``\\xNN`` escapes, so an output record never carries a string a reader refuses. Names stay told
    apart (``--skip-existing`` matches frames by this text): where escapes are written, and in a valid
    name that holds text like one (a backslash, x and two hex digits), each backslash is written twice, so
    a file named ``z\\xff.bin`` and one named z, byte 0xff, .bin get different texts."""
    try:
        name.encode("utf-8")
        if not _LIKE_AN_ESCAPE.search(name):
            return name
    except UnicodeEncodeError:
        pass
    doubled = name.replace("\\", "\\\\")
    try:  # a valid name comes through as it is, its backslashes doubled
        return doubled.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file system byte decodes to
        return doubled.encode("utf-8", "backslashreplace").decode("utf-8")


#: Text in a valid name that reads like the escape of an undecodable byte.
_LIKE_AN_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}")


# --------------------------------------------------------------------------- path arguments

def path_argument(value: object, what: str, error: type[PointPillarsError], expected: str) -> Path:
    """``value`` as a ``Path`` where an API takes one path: a str, bytes (decoded as ``os.fsdecode`` does) or
    path-like object, without a NUL character. Anything else (None, a number, a list of paths) is ``error``
    naming ``what`` and ``expected`` (what to pass), rather than the TypeError or ValueError that opening it
    would raise far from the call."""
    if isinstance(value, (str, bytes, os.PathLike)):
        try:
            text = os.fsdecode(value)
        except TypeError:  # a path-like whose __fspath__ gives neither str nor bytes
            text = None
        if text == "":  # Path("") is the current folder, which no caller means
            raise error(f"{what}: an empty path; pass {expected}")
        if text is not None and "\0" in text:
            raise error(f"{what} {safe_repr(text)}: a path cannot hold a NUL character; pass {expected}")
        if text is not None:
            return Path(text)
    raise error(f"{what}: expected {expected}, got {safe_repr(value)} ({type(value).__name__})")


# --------------------------------------------------------------------------- untrusted numbers

#: Most digits of an integer a file here may hold: a count, a size or a value (int64's largest has 19).
MAX_INT_DIGITS = 20
_OVERLONG_NUMBER = re.compile(rf"[0-9]{{{MAX_INT_DIGITS + 1},}}")


def overlong_number(text: str) -> int | None:
    """The digits of the first decimal number in ``text`` longer than ``MAX_INT_DIGITS`` (None: none is), to
    refuse before ``int()`` or ``ast.literal_eval`` reads it: no count or value is that long, and past 4,300
    digits Python's own error names a setting (``sys.set_int_max_str_digits``) that is not the fix."""
    found = _OVERLONG_NUMBER.search(text)
    return None if found is None else len(found.group())


# --------------------------------------------------------------------------- bounded reads

_KIND_NAMES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind_of(mode: int) -> str:
    for test, name in _KIND_NAMES:
        if test(mode):
            return name
    return "not a regular file"


def folder_resolved(path: str) -> str:
    """``path`` made absolute with its folder's symbolic links resolved, its file name as it is: the one key of a
    frame file (``a/x.bin``, ``/abs/a/x.bin`` and ``link-to-a/x.bin`` are one frame; two names linked to one stored
    file, as git-annex or DVC keep frames, are two)."""
    return folder_resolver()(path)


def folder_resolver() -> Callable[[str], str]:
    """``folder_resolved`` for one pass over many paths: each folder's links resolved once (a realpath is ~10 us,
    and a pass's frames or rows lie in a few folders). A new one a pass, so that links changed between passes
    count."""
    real: dict[str, str] = {}

    def resolved(path: str) -> str:
        folder, name = os.path.split(os.path.abspath(path))
        if folder not in real:
            real[folder] = os.path.realpath(folder)
        return os.path.join(real[folder], name)

    return resolved


def special_kind(path: PathLike) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a directory ("a FIFO (named pipe)",
    "a character device", ...); None otherwise (missing, a file, a folder). Symbolic links are followed."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind_of(mode)


def not_a_file(path: PathLike) -> str | None:
    """What is in ``path``'s place when a file written there could not replace it: "a directory", or another node
    that is no regular file ("a FIFO (named pipe)", ...); None: a regular file, nothing, or a link to nothing."""
    return "a directory" if os.path.isdir(path) else special_kind(path)


def not_a_folder(path: PathLike) -> str | None:
    """What is in ``path``'s place when it is no folder: "a file", another node ("a FIFO (named pipe)", ...), "a
    broken symbolic link" or "nothing"; None: a folder (or a link to one)."""
    if os.path.isdir(path):
        return None
    if os.path.isfile(path):
        return "a file"
    return special_kind(path) or ("a broken symbolic link" if os.path.islink(path) else "nothing")


def check_input_folder(path: PathLike, option: str, holds: str) -> None:
    """An InputError unless ``path``, given as ``option``, is a folder: it names what is in the folder's place and
    that ``option`` names the folder of ``holds`` (a file given there, ``--pred preds.txt``, is a common slip)."""
    kind = not_a_folder(path)
    if kind is not None:
        problem = "does not exist" if kind == "nothing" else f"is {kind}, not a folder"
        raise InputError(f"{option} {safe_repr(path)} {problem}: {option} names the folder of {holds}")


def _stat_error(what: str, path: PathLike, exc: OSError) -> InputError:
    """One line for a path that could not be stat'ed or opened; a symbolic link whose target is gone is named
    so (with its target), since ``ls`` shows the link and "does not exist" would contradict it."""
    shown = safe_repr(path)
    if isinstance(exc, FileNotFoundError):
        try:
            return InputError(f"{what} {shown} is a broken symbolic link (to {safe_repr(os.readlink(path))}, "
                              "which does not exist)")
        except OSError:  # no link: the path itself is missing
            return InputError(f"{what} {shown} does not exist")
    return InputError(f"{what} {shown} cannot be read: {exc.strerror or exc}")


def open_regular_file(path: PathLike, *, max_bytes: int, what: str = "file") -> tuple[IO[bytes], int]:
    """Open ``path`` for binary reading only if it is a regular file of at most ``max_bytes``.

    Returns the open file and its size. The path is stat'ed before it is opened, so a FIFO, a
    socket, a device such as /dev/zero or a directory is refused at once (nothing blocks, nothing
    is read), and an oversized file (e.g. a 20 GB sparse file) is refused by its size. The file is
    opened non-blocking and checked again with fstat, so a path swapped in between cannot slip
    through. Every failure is an :class:`InputError` naming the file (``what`` + escaped path).
    """
    fd, opened = open_regular_fd(path, max_bytes=max_bytes, what=what)
    try:
        return no_wait_reader(fd), opened.st_size
    except BaseException:
        os.close(fd)
        raise


def open_regular_fd(path: PathLike, *, max_bytes: int, what: str = "file") -> tuple[int, os.stat_result]:
    """:func:`open_regular_file` as a bare file descriptor (the caller closes it) and its fstat at the open (what
    :func:`read_size_error` compares with): the per-frame readers skip building a buffered file object they would
    bypass anyway."""
    name = os.fspath(path)
    try:
        st = os.stat(name)
    except OSError as exc:
        raise _stat_error(what, path, exc) from None
    _check_regular(st, path, max_bytes, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        raise _stat_error(what, path, exc) from None
    try:
        st = os.fstat(fd)
        _check_regular(st, path, max_bytes, what)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


#: Why a regular file opened non-blocking gave no bytes to a read: it would have waited for some.
GIVES_NO_DATA = "it gives no data without waiting (as /proc/kmsg does): not a regular file's contents"


class _NoWaitFileIO(io.FileIO):
    """A file opened non-blocking whose read that would wait raises ``BlockingIOError`` (``GIVES_NO_DATA``), where
    ``FileIO``'s returns None, which readers took for bytes and failed on with Python's own words ("object of type
    'NoneType' has no len()")."""

    def readinto(self, buffer: Any) -> int:
        got = super().readinto(buffer)
        if got is None:
            raise BlockingIOError(errno.EAGAIN, GIVES_NO_DATA)
        return got

    def readall(self) -> bytes:
        data = super().readall()
        if data is None:
            raise BlockingIOError(errno.EAGAIN, GIVES_NO_DATA)
        return data


def read_error(what: str, path: PathLike, exc: OSError) -> InputError:
    """The ``cannot be read:`` line of a read of ``what`` at ``path`` that failed with ``exc``, in the system's words;
    a raw descriptor's read that would wait (``os.readv``, ``os.pread``: EAGAIN, "Resource temporarily unavailable")
    in the no-wait reader's (``GIVES_NO_DATA``)."""
    reason = GIVES_NO_DATA if isinstance(exc, BlockingIOError) else exc.strerror or exc
    return InputError(f"{what} {safe_repr(path)} cannot be read: {reason}")


def no_wait_reader(fd: int) -> io.BufferedReader:
    """A buffered binary reader of ``fd``, a regular file opened non-blocking (so that a FIFO swapped in for it never
    blocks the open), that owns it: a file that says it is regular but would wait for data (/proc/kmsg, a FUSE file
    that answers EAGAIN) raises ``BlockingIOError`` saying so, which every reader's ``cannot be read:`` line
    carries."""
    return io.BufferedReader(_NoWaitFileIO(fd, "rb"))


def _check_regular(st: os.stat_result, path: PathLike, max_bytes: int, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {safe_repr(path)} is {_kind_of(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise InputError(f"{what} {safe_repr(path)} is {st.st_size} bytes, more than the limit of {max_bytes} bytes")


def read_regular_file(path: PathLike, *, max_bytes: int, what: str = "file") -> bytes:
    """All bytes of a regular file of at most ``max_bytes`` (see :func:`open_regular_file`).

    Never reads more than the file's size when opened (a file that grows while read is refused), so
    memory stays bounded. OSError while reading becomes an :class:`InputError` with the errno text.
    """
    fd, opened = open_regular_fd(path, max_bytes=max_bytes, what=what)
    expected = opened.st_size or max_bytes
    with no_wait_reader(fd) as f:
        try:
            data = read_bounded(f, expected + 1, opened.st_size)
        except OSError as exc:
            raise read_error(what, path, exc) from None
        if len(data) > expected:
            if opened.st_size:
                raise read_size_error(what, path, fd, opened, len(data))
            if changed_since(fd, opened):
                raise InputError(f"{what} {safe_repr(path)} grew past the limit of {max_bytes} bytes while being read "
                                 "(was it still being written?)")
            raise said_empty_error(f"{what} {safe_repr(path)}", f"more than the limit of {max_bytes} bytes")
    return data


def said_empty_error(where: str, holds: str) -> InputError:
    """The error of the file ``where`` ("point file 'x.npy'") whose size says 0 but which ``holds`` more: a /proc file,
    or one on some FUSE mounts, whose size does not count its bytes, where a reader needs one that does (to bound
    what it reads, or to check the data a header announces)."""
    return InputError(f"{where} says it is empty (size 0, as /proc files and files on some FUSE mounts say) but holds "
                      f"{holds}")


def changed_since(fd: int, opened: os.stat_result) -> bool:
    """Whether the open file ``fd`` changed (its size or times) since its fstat ``opened``."""
    try:
        now = os.fstat(fd)
    except OSError:
        return True
    return (now.st_size, now.st_mtime_ns, now.st_ctime_ns) != (opened.st_size, opened.st_mtime_ns, opened.st_ctime_ns)


def read_size_error(what: str, path: PathLike, fd: int, opened: os.stat_result, got: int) -> InputError:
    """The error for ``got`` bytes read from the open regular file ``fd`` whose fstat at the open (``opened``) said
    another size. Where the file changed since, it grew or shrank while being read; where it did not, its size never
    counted its bytes: a /sys file says 4096 whatever it holds, as files on some FUSE mounts say sizes of their own,
    and "shrank" would send the user looking for a writer there is none of."""
    shown, size = safe_repr(path), opened.st_size
    if changed_since(fd, opened):
        return InputError(f"{what} {shown} {'grew' if got > size else 'shrank'} while being read (was it still being "
                          "written?)")
    gives = "more" if got > size else f"{got}"
    return InputError(f"{what} {shown}: its size says {size} bytes but a read gives {gives}, and the file did not "
                      "change: a size that does not count its bytes (as a /proc or /sys file's does not, or a file's "
                      "on some FUSE mounts); copy it to a regular file to read it")


def read_file_or_pipe(path: PathLike, *, max_bytes: int, what: str = "file") -> bytes:
    """:func:`read_regular_file`'s bytes, where ``path`` may also be a FIFO or a character device (a list given as
    ``<(cmd)``, which bash names /dev/fd/63; /dev/stdin): read once, to its end, up to ``max_bytes`` a chunk at a
    time (``read_bounded``), as a regular file's read waits for its disk, a pipe's waits for its writer. Anything
    else (a directory, a socket, nothing there) is refused as :func:`read_regular_file` refuses it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _stat_error(what, path, exc) from None
    if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        return read_regular_file(path, max_bytes=max_bytes, what=what)
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOCTTY", 0)  # a terminal stays no process's
    try:
        with open(path, "rb", opener=lambda name, _: os.open(name, flags)) as f:
            data = read_bounded(f, max_bytes + 1)
    except OSError as exc:
        raise _stat_error(what, path, exc) from None
    if len(data) > max_bytes:
        raise InputError(f"{what} {safe_repr(path)} is {_kind_of(mode)} that gives more than the limit of "
                         f"{max_bytes} bytes")
    return data


#: Bytes read at a time past a file's first read (``read_bounded``).
_UNSIZED_CHUNK = 1 << 20


class Readable(Protocol):
    """What ``read_bounded`` reads: a Python binary file or a pyarrow stream, whose ``read(n)`` gives n bytes, or
    fewer at the end (a buffered file's read, a pyarrow stream's, reads on until it has n)."""

    def read(self, size: int, /) -> bytes: ...


def read_bounded(f: Readable, limit: int, size: int = 0) -> bytes:
    """At most ``limit`` bytes of ``f``, whose stat or listing said ``size`` (0: none known): never ``limit`` in one
    read, since a read of n bytes sets n bytes aside first (64 MiB for a file of a few hundred bytes), in a pyarrow
    stream as in a Python file. The first read asks the size and a byte (the byte shows a file that grew; on an object
    store each read is a request); what follows, or all of a file that says it is empty and may not be (procfs, some
    FUSE mounts), is read ``_UNSIZED_CHUNK`` at a time, so memory follows what the file holds."""
    chunks: list[bytes] = []
    left, ask = limit, size + 1 if size else _UNSIZED_CHUNK
    while left:
        want = min(ask, left)
        chunk = f.read(want)
        chunks.append(chunk)
        left -= len(chunk)
        if len(chunk) < want:  # fewer than asked: the end
            break
        ask = _UNSIZED_CHUNK
    return b"".join(chunks)


def read_file_head(path: PathLike, count: int, *, what: str = "file") -> bytes:
    """The first ``count`` bytes (fewer if the file is shorter) of a regular file of any size, read by its size
    (``read_bounded``); see :func:`open_regular_file` for what is refused."""
    f, size = open_regular_file(path, max_bytes=sys.maxsize, what=what)
    with f:
        try:
            return read_bounded(f, count, size)
        except OSError as exc:
            raise read_error(what, path, exc) from None


# --------------------------------------------------------------------------- atomic writes

def xdg_cache_home(environ: Mapping[str, str] = os.environ) -> Path | None:
    """$XDG_CACHE_HOME where it is an absolute path (the XDG base directory spec ignores a relative one), else None."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else None


def user_cache_dir() -> Path:
    """Where the package caches what it derives (exported model dirs, engine plan caches):
    $POINTPILLARS_TRT_CACHE, else $XDG_CACHE_HOME/pointpillars-trt (where it is an absolute path, as the XDG base
    directory spec wants; containers and CI jobs point it at a volume), else ~/.cache/pointpillars-trt. Never
    inside a model dir, so a model dir has one writer (``build``) and may sit on a read-only share."""
    variable = os.environ.get("POINTPILLARS_TRT_CACHE")
    if variable:
        return Path(variable)
    xdg = xdg_cache_home()
    if xdg is not None:
        return xdg / "pointpillars-trt"
    try:
        home = Path.home()
    except RuntimeError:  # HOME unset (`env -i`, a bare service) and a user id with no account in the password database
        raise PointPillarsError(f"the cache of pointpillars-trt has no folder: HOME is unset and user id "
                                f"{os.getuid()} has no home directory: set POINTPILLARS_TRT_CACHE (or HOME) to a "
                                "writable folder") from None
    return home / ".cache" / "pointpillars-trt"


#: Suffix of the temp files the atomic writer renames into place; a run that was killed leaves them
#: (hidden, named after the writer's pid) and :func:`remove_stale_temp_files` clears them.
TEMP_SUFFIX = ".pp-tmp"


def replace_folder(staging: Path, folder: Path) -> None:
    """Swap a finished folder in: the old one renamed aside, the new one renamed in, the old one removed.
    Two renames, so an interruption leaves the old folder or the new one whole, never a half-deleted one."""
    if not folder.exists():
        os.replace(staging, folder)
        return
    retired = folder.parent / f".{folder.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.replace(folder, retired)
    try:
        os.replace(staging, folder)
    except OSError:
        try:
            os.replace(retired, folder)  # put the old folder back
        except OSError:  # a concurrent writer's complete folder took the place meanwhile: keep that one
            shutil.rmtree(retired, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def write_bytes_atomic(path: PathLike, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part.

    A temp file in the same folder (so os.replace is a rename on one file system) is written and
    renamed over the target. ``durable`` fsyncs it first; a writer of many files passes False and
    makes them durable with one :func:`flush_to_disk` pass before it reports them written. It is
    created with mode 0o666 minus the umask, like a plain open() would, rather than mkstemp's 0o600.
    """
    target = Path(os.fspath(path))
    tmp = _temp_file_of(target, data, durable)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_new_file_atomic(path: PathLike, data: bytes, *, durable: bool = True) -> None:
    """:func:`write_bytes_atomic` of a file that must not exist yet: FileExistsError when ``path`` does (another
    writer took the name first; two runs writing part files into one folder each keep theirs). The temp
    file is hard-linked to its name, which fails where the name exists; where the file system has no hard
    links, the name is claimed by creating it empty first."""
    target = Path(os.fspath(path))
    tmp = _temp_file_of(target, data, durable)
    try:
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise
        except OSError:  # no hard links here (FAT, some network file systems)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            try:
                os.replace(tmp, target)
            except BaseException:
                target.unlink(missing_ok=True)  # the empty placeholder: no part at all rather than an empty one
                raise
    finally:
        tmp.unlink(missing_ok=True)


def _temp_file_of(target: Path, data: bytes, durable: bool) -> Path:
    """``data`` in a new temp file beside ``target`` (fsynced when ``durable``), for a rename or link onto it;
    created with mode 0o666 minus the umask."""
    tmp = target.with_name(f".{_temp_stem(target.name)}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:  # a write names no file, and the temp file's name is none the user gave: name the target
        if exc.filename not in (None, os.fspath(tmp)):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(target)) from None
    return tmp


#: Bytes of a target's name its temp file keeps: with the pid, token and suffix it stays within the
#: 255-byte name limit of common file systems, so any name that fits there can be written.
_TEMP_NAME_BYTES = 200


def _temp_stem(name: str) -> str:
    """``name``, or for a long one its first bytes and a hash (the temp file's name must fit too)."""
    raw = os.fsencode(name)
    if len(raw) <= _TEMP_NAME_BYTES:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:12]
    return os.fsdecode(raw[: _TEMP_NAME_BYTES - 13]).replace(".", "_") + "-" + digest


def remove_stale_temp_files(folder: PathLike) -> int:
    """Delete the atomic writer's temp files in ``folder`` left by processes that no longer run
    (a run killed mid-write); returns how many. Temp files of live writers are left alone."""
    def writer(name: str) -> str | None:
        if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
            return None
        parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 2)
        return parts[1] if len(parts) == 3 else None

    removed = 0
    for path in _left_by_dead_processes(folder, writer):
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


#: This host, as the names of ``owned_prefix`` carry it (a short hash of its name).
_HOST_TAG = hashlib.sha1(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def owned_prefix(prefix: str) -> str:
    """``{prefix}{pid}-{host}-``: how a process names a folder of its own that ``remove_stale_folders`` may sweep
    once it is gone. The host matters where the folder's file system is shared (an NFS home, a volume of several
    containers): another machine's build or server is alive whatever this one's process table says."""
    return f"{prefix}{os.getpid()}-{_HOST_TAG}-"


def remove_stale_folders(folder: PathLike, prefix: str) -> int:
    """Delete the folders in ``folder`` named by ``owned_prefix(prefix)`` on this host whose process no longer
    runs (a run killed before it could remove its own: a build's staging folder, a server's scratch folder);
    returns how many. Folders of live processes or of other hosts, and links, are left alone."""
    def owner(name: str) -> str | None:
        pid, host, rest = (name[len(prefix):].split("-", 2) + ["", ""])[:3]
        return pid if name.startswith(prefix) and host == _HOST_TAG and rest else None

    removed = 0
    for path in _left_by_dead_processes(folder, owner):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += not os.path.lexists(path)
    return removed


def _left_by_dead_processes(folder: PathLike, pid_of_name: Callable[[str], str | None]) -> Iterator[str]:
    """The paths of the entries in ``folder`` whose name gives a process id (``pid_of_name``; None: not one of
    those looked for) of a process that no longer runs."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = pid_of_name(name)
        if pid is not None and pid.isdigit() and not process_alive(int(pid)):
            yield os.path.join(folder, name)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one included): whose temp files may not be cleared."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def flush_to_disk(paths: Iterable[PathLike]) -> None:
    """Make files written without fsync durable: one ``syncfs`` per file system they are on (Linux),
    else one fsync per file, then an fsync of each folder (the renames). Raises OSError (e.g. ENOSPC
    or EIO from delayed allocation) when the kernel could not write them."""
    pending = PendingFlush()
    pending.add(paths)
    pending.flush()


class PendingFlush:
    """The files of a run written without fsync, for one :func:`flush_to_disk` pass at its end. Where
    ``syncfs`` covers them (Linux) only their folders are kept, so memory stays flat however many
    files a run writes."""

    def __init__(self) -> None:
        self._syncfs = _syncfs()
        self._files: list[str] = []  # only without syncfs: each file is fsynced
        self._folders: set[str] = set()
        self._last_parent: str | None = None

    def __bool__(self) -> bool:
        return bool(self._folders)

    def add(self, paths: Iterable[PathLike]) -> None:
        for path in paths:
            name = os.fspath(path)
            parent = os.path.dirname(name)
            if parent != self._last_parent:  # a run writes into one or two folders: abspath once each
                self._folders.add(os.path.abspath(parent or os.curdir))
                self._last_parent = parent
            if self._syncfs is None:
                self._files.append(name)

    def flush(self) -> None:
        """Make every added file durable (see :func:`flush_to_disk`)."""
        for name in self._files:
            fsync_path(name)
        synced_devices: set[int] = set()
        for folder in self._folders:
            fd = os.open(folder, os.O_RDONLY)
            try:
                device = os.fstat(fd).st_dev
                if self._syncfs is not None and device not in synced_devices:
                    if self._syncfs(fd) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, os.strerror(err), folder)
                    synced_devices.add(device)
                os.fsync(fd)
            finally:
                os.close(fd)


def fsync_path(path: PathLike) -> None:
    """fsync a file, or a folder (the renames and removals in it), by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Any:
    """libc's syncfs (Linux), or None where there is none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True) if name else None
        func = getattr(libc, "syncfs", None)
    except OSError:
        return None
    if func is not None:
        func.argtypes, func.restype = [ctypes.c_int], ctypes.c_int
    return func


def lies_in(path: PathLike, folder: PathLike) -> bool:
    """Whether ``path`` is ``folder`` or below it, links resolved (a folder that is not there holds nothing)."""
    inside = os.path.realpath(folder)
    if not os.path.isdir(inside):
        return False
    target = os.path.realpath(path)
    return target == inside or target.startswith(inside.rstrip(os.sep) + os.sep)


@contextlib.contextmanager
def folder_held(folder: PathLike, refusal: str, unheld: Callable[[str], None] | None = None) -> Iterator[None]:
    """``folder`` (made if missing) held by this process while the block runs: an exclusive ``flock`` on the
    folder itself (no file of its own in it), so a second process that asks for it while it is held gets an
    InputError of ``refusal``; the lock goes with the process. Where the file system has no such locks
    (some network ones), the block runs unheld, and ``unheld`` is told why."""
    os.makedirs(folder, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(refusal) from None
        except (ImportError, OSError) as exc:  # no flock here: nothing to hold it by
            if unheld is not None:
                unheld(exc.strerror or str(exc) if isinstance(exc, OSError) else "no file locks on this system")
        yield
    finally:
        os.close(fd)  # releases the lock


def check_writable_folder(path: PathLike, what: str = "folder") -> None:
    """Refuse, before any work, a folder that cannot take new files: a file in its place, a read-only
    folder, or (when it does not exist yet) a parent where it cannot be created. An empty temp folder
    is created and removed again in the folder (or its nearest existing parent): nothing is left."""
    shown = safe_repr(path)
    target = Path(os.fspath(path))
    probe_in = target
    while not probe_in.exists():
        if probe_in.parent == probe_in:
            break
        probe_in = probe_in.parent
    if probe_in == target and not target.is_dir():  # a device or FIFO named as such, as infer names it
        raise InputError(f"{what} {shown} is {special_kind(target) or 'an existing file'}, not a folder")
    if not probe_in.is_dir():
        raise InputError(f"{what} {shown}: {safe_repr(probe_in)} is a file, not a folder")
    where = "" if probe_in == target else f" (it would be created in {safe_repr(probe_in)})"
    _probe_writable(probe_in, f"{what} {shown}: cannot write there{where}")


def check_writable_file(path: PathLike, what: str = "file") -> None:
    """Refuse, before any work, a file target the atomic writer could not replace: an empty name, a
    folder in its place, or a parent folder that is missing, a file or read-only (the writer's temp
    file goes there, and a failure after the work would name that temp file). Nothing is left.

    A device, FIFO or socket in its place (``/dev/null``, ``/dev/stdout``) is refused too: the atomic
    rename would replace the node itself with a regular file (for root, ``/dev/null`` gone)."""
    shown = safe_repr(path)
    if not os.fspath(path).strip():
        raise InputError(f"{what} {shown}: an empty file name (an unset variable?); name the file to write")
    target = Path(os.fspath(path))
    if target.is_dir():
        raise InputError(f"{what} {shown} is an existing folder; {what} names a file")
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = stat.S_IFREG  # nothing there (yet): the parent's checks below say the rest
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} {shown} is {_kind_of(mode)}, which writing a file there would replace: "
                         f"name a regular file (or leave {what} out)")
    parent = target.parent
    if not parent.is_dir():
        problem = "is a file, not a folder" if parent.exists() else "does not exist"
        raise InputError(f"{what} {shown}: its folder {safe_repr(parent)} {problem}")
    _probe_writable(parent, f"{what} {shown}: cannot write in its folder {safe_repr(parent)}")


def _probe_writable(folder: Path, message: str) -> None:
    """InputError ``message: reason`` when ``folder`` cannot take a new entry (``unwritable_reason``)."""
    reason = unwritable_reason(folder)
    if reason is not None:
        raise InputError(f"{message}: {reason}")


def unwritable_reason(folder: Path) -> str | None:
    """Why ``folder`` cannot take a new entry (an empty temp folder made and removed in it), or None: a
    permission or a read-only mount shows only when something is written."""
    probe = folder / f".pp-write-probe.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def write_text_atomic(path: PathLike, text: str, *, durable: bool = True) -> None:
    """Atomic UTF-8 text write (see write_bytes_atomic)."""
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


# --------------------------------------------------------------------------- strict JSON

class NonFiniteJSONError(PointPillarsError, ValueError):
    """A NaN or infinity in a value about to be written as JSON (strict JSON has neither).

    Callers drop non-finite detections before writing (``kitti.finite_detections``), so this
    means a bug or an unchecked value; the message names where in the object it sits.
    """


class DuplicateKeyError(PointPillarsError, ValueError):
    """A JSON object that repeats a key: ``json`` keeps the last value silently, so a file edited or merged by
    hand would be read as something other than what it seems to say. The reader names the file."""


def read_text_lines(path: PathLike, *, max_bytes: int, what: str, pipes: bool = False) -> list[str]:
    """The lines of a UTF-8 text file (KITTI labels, predictions, id lists), read bounded (a FIFO, a device
    or a file over ``max_bytes`` is refused before anything blocks or fills memory; with ``pipes``, a FIFO or a
    character device is read, up to ``max_bytes``: ``read_file_or_pipe``): a byte-order mark that editors on
    Windows put first is dropped (kept, it made the first line's class "\\ufeffCar", which no evaluation counts),
    and bytes that are no UTF-8 are refused naming the file and where, not replaced."""
    read = read_file_or_pipe if pipes else read_regular_file
    data = read(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{what} {safe_repr(os.fspath(path))}, line {line}: bytes that are no UTF-8 text "
                         f"(byte {exc.start}); is it a text file?") from None


def loads_json(data: str | bytes) -> Any:
    """``json.loads`` of a file read from disk or given by a user, refusing a key repeated in one object with a
    :class:`DuplicateKeyError` (a ValueError, as json's own errors are) naming the key, and an integer of more
    than ``MAX_INT_DIGITS`` digits with a ValueError saying it is not a number a record holds."""
    return json.loads(data, object_pairs_hook=_unique_keys, parse_int=_json_int)


def _json_int(text: str) -> int:
    """A JSON integer's value, refused when overlong (``overlong_number``)."""
    digits = overlong_number(text)
    if digits is not None:
        raise ValueError(f"an integer of {digits} digits: not a number a record holds")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):
        repeated = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise DuplicateKeyError(f"key {safe_repr(repeated, 80)} appears twice in one object")
    return out


def _where(path: str, index: tuple[int, ...]) -> str:
    return path + "".join(f"[{i}]" for i in index)


def to_jsonable(obj: Any, *, _path: str = "$") -> Any:
    """``obj`` with NumPy scalars and arrays turned into plain Python values, checked for strict JSON.

    Dicts (str keys), lists, tuples, str, int, bool, None and finite floats pass; a NaN or
    infinity anywhere raises :class:`NonFiniteJSONError` naming its place (``$.boxes[3][6]``);
    any other type raises TypeError, as json.dumps would.
    """
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "fc":
            bad = np.argwhere(~np.isfinite(obj))
            if bad.size:
                index = tuple(int(i) for i in bad[0])
                raise NonFiniteJSONError(f"{float(obj[index].real)!r} at {_where(_path, index)} is not valid in strict JSON")
        if obj.dtype.kind in "biufU":
            return obj.tolist()
        return to_jsonable(obj.tolist(), _path=_path)
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item(), _path=_path)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise NonFiniteJSONError(f"{obj!r} at {_path} is not valid in strict JSON")
        return float(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(key, np.generic):
                key = key.item()
            if not isinstance(key, str):
                raise TypeError(f"key {key!r} at {_path} is not a string")
            out[key] = to_jsonable(value, _path=f"{_path}.{key}")
        return out
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, _path=f"{_path}[{i}]") for i, v in enumerate(obj)]
    raise TypeError(f"{type(obj).__name__} at {_path} is not JSON serializable")


def dumps_strict(obj: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text (no NaN/Infinity; NumPy values converted) of ``obj``; see :func:`to_jsonable`.

    With ``indent`` the text is byte for byte what ``json.dumps(to_jsonable(obj), indent=indent)``
    writes, built without the standard library's pure-Python indenting encoder (~20x faster on a
    frame record: lists of floats are formatted with ``float.__repr__`` in one pass).
    """
    if indent is None:
        return json.dumps(to_jsonable(obj), allow_nan=False)
    try:
        return _Indented(" " * indent).encode(obj, 0)
    except NonFiniteJSONError:
        to_jsonable(obj)  # names the place of the first non-finite value
        raise


_encode_str = json.encoder.encode_basestring_ascii  # what json.dumps uses with ensure_ascii


class _Indented:
    """The indented form of json.dumps for the value types :func:`to_jsonable` accepts."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def encode(self, value: Any, level: int) -> str:
        if isinstance(value, str):
            return _encode_str(value)
        if value is None:
            return "null"
        if value is True:
            return "true"
        if value is False:
            return "false"
        if isinstance(value, int) and not isinstance(value, np.generic):
            return int.__repr__(value)
        if isinstance(value, float):
            return _float_text(value)
        if isinstance(value, np.ndarray):
            return self.encode(value.tolist(), level)
        if isinstance(value, np.generic):
            return self.encode(value.item(), level)
        if isinstance(value, Mapping):
            return self._mapping(value, level)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, level)
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    def _mapping(self, value: Mapping[Any, Any], level: int) -> str:
        if not value:
            return "{}"
        items = []
        for key, item in value.items():
            if isinstance(key, np.generic):
                key = key.item()
            if not isinstance(key, str):
                raise TypeError(f"key {key!r} is not a string")
            items.append(f"{_encode_str(key)}: {self.encode(item, level + 1)}")
        return self._wrap("{", items, "}", level)

    def _sequence(self, value: list[Any] | tuple[Any, ...], level: int) -> str:
        if not value:
            return "[]"
        if all(type(v) is float for v in value):
            return self._wrap("[", _float_texts(list(value)), "]", level)
        if all(type(v) is list and v for v in value):
            flat = [x for row in value for x in row]
            if all(type(x) is float for x in flat):  # rows of floats (boxes): one formatting pass
                texts, start, rows = _float_texts(flat), 0, []
                for row in value:
                    rows.append(self._wrap("[", texts[start : start + len(row)], "]", level + 1))
                    start += len(row)
                return self._wrap("[", rows, "]", level)
        return self._wrap("[", [self.encode(v, level + 1) for v in value], "]", level)

    def _wrap(self, opening: str, items: Iterable[str], closing: str, level: int) -> str:
        inner = "\n" + self.unit * (level + 1)
        return opening + inner + ("," + inner).join(items) + "\n" + self.unit * level + closing


def _float_texts(values: list[float]) -> list[str]:
    if not all(map(math.isfinite, values)):
        raise NonFiniteJSONError("non-finite value")
    return list(map(float.__repr__, values))


def _float_text(value: float) -> str:
    if not math.isfinite(value):
        raise NonFiniteJSONError("non-finite value")
    return float.__repr__(value)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Atomic, durable (fsync'ed) strict-JSON write, indented, NumPy values converted to plain numbers.

    A NaN or infinity anywhere raises :class:`NonFiniteJSONError` (a PointPillarsError and a
    ValueError) naming the file and the place, and nothing is written.
    """
    try:
        text = dumps_strict(obj)
    except NonFiniteJSONError as exc:
        raise NonFiniteJSONError(f"cannot write {safe_repr(path)}: {exc}") from None
    write_text_atomic(path, text + "\n")
