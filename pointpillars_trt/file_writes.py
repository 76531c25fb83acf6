"""The one atomic writer (a temp file beside the target, then a rename; fsync per file or one flush pass
per run), the stale temp files and folders of dead processes, folders held against a second writer, and
the user cache folder."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import hashlib
import os
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import InputError, PointPillarsError, safe_repr
from .file_reads import PathLike, broken_link, file_kind, special_kind


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
    tmp = temp_file_of(target, data, durable)
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
    tmp = temp_file_of(target, data, durable)
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


def temp_file_of(target: Path, data: bytes, durable: bool) -> Path:
    """``data`` in a new temp file beside ``target`` (fsynced when ``durable``), for a rename or link onto it (a
    writer of several files makes each one's before it renames any); created with mode 0o666 minus the umask."""
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
    folder, a full file system, or (when it does not exist yet) a parent where it cannot be created. A temp file
    of one byte is created and removed again in the folder (or its nearest existing parent): nothing is left."""
    shown = safe_repr(path)
    target = Path(os.fspath(path))
    probe_in = target
    while not probe_in.exists():
        link = _link_to_nothing(probe_in)
        if link is not None:  # no folder can be made in its place (os.makedirs: "File exists")
            where = "" if probe_in == target else f": {safe_repr(probe_in)}"
            raise InputError(f"{what} {shown}{where} is {link}, where no folder can be made")
        if probe_in.parent == probe_in:
            break
        probe_in = probe_in.parent
    if probe_in == target and not target.is_dir():  # a device or FIFO named as such, as infer names it
        raise InputError(f"{what} {shown} is {special_kind(target) or 'an existing file'}, not a folder")
    if not probe_in.is_dir():
        raise InputError(f"{what} {shown}: {safe_repr(probe_in)} is a file, not a folder")
    where = "" if probe_in == target else f" (it would be created in {safe_repr(probe_in)})"
    _probe_writable(probe_in, f"{what} {shown}: cannot write there{where}")


def _link_to_nothing(path: Path) -> str | None:
    """What ``path`` is when it is a symbolic link that leads to nothing: "a broken symbolic link (to ...)" or "a
    symbolic link in a loop"; None otherwise (nothing there, or anything that exists)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return broken_link(path)  # None: nothing there
    except OSError as exc:  # a loop below a link on its path ('loop/sub') is the link's: said where it is
        looped = exc.errno == errno.ELOOP and os.path.islink(path)
        return "a symbolic link in a loop (it leads back to itself)" if looped else None
    return None


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
        raise InputError(f"{what} {shown} is {file_kind(mode)}, which writing a file there would replace: "
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
    """Why ``folder`` cannot take a new file (a temp file of one byte made and removed in it), or None: a
    permission, a read-only mount or a full file system shows only when something is written."""
    probe = folder / f".pp-write-probe.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        os.write(fd, b"\0")
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def write_text_atomic(path: PathLike, text: str, *, durable: bool = True) -> None:
    """Atomic UTF-8 text write (see write_bytes_atomic)."""
    write_bytes_atomic(path, text.encode("utf-8"), durable=durable)
