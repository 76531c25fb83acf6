"""Reading files that users and other programs hand us, within bounds: regular files only unless a FIFO
is asked for (a FIFO or a device would block a read for ever), a size limit checked before the read, a
file changed under the read named; path arguments checked where an API takes one; file names as text
every strict UTF-8 reader takes; numbers of more digits than any count."""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol, Union

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


def file_kind(mode: int) -> str:
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
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else file_kind(mode)


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
        problem = f"does not exist{home_hint(path)}" if kind == "nothing" else f"is {kind}, not a folder"
        raise InputError(f"{option} {safe_repr(path)} {problem}: {option} names the folder of {holds}")


def home_hint(path: PathLike) -> str:
    """"; ..." naming where a path that begins with ``~`` would lead: only a shell expands ``~``, and not inside
    quotes (``--model '~/m.pth'``), so the path was looked for as written, in a folder named ``~``; else ""."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text.startswith("~"):
        return ""
    expanded = os.path.expanduser(text)
    if expanded == text:  # ~user of no such user
        return ""
    said = "; a leading ~ is expanded by the shell, and not inside quotes"
    if os.path.lexists(expanded):
        return f"{said}: give the path as {safe_repr(expanded)}, which is there"
    return f"{said} ({safe_repr(expanded)} is not there either)"


def broken_link(path: PathLike) -> str | None:
    """"a broken symbolic link (to TARGET, which does not exist)" where ``path`` (found missing) is a link, named
    with its target, since ``ls`` shows the link and "does not exist" would contradict it; None where it is no link."""
    try:
        return f"a broken symbolic link (to {safe_repr(os.readlink(path))}, which does not exist)"
    except OSError:  # no link: the path itself is missing
        return None


def _stat_error(what: str, path: PathLike, exc: OSError) -> InputError:
    """One line for a path that could not be stat'ed or opened; a symbolic link whose target is gone is named
    so (``broken_link``)."""
    shown = safe_repr(path)
    if isinstance(exc, FileNotFoundError):
        link = broken_link(path)
        return InputError(f"{what} {shown} is {link}" if link is not None else
                          f"{what} {shown} does not exist{home_hint(path)}")
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
        raise InputError(f"{what} {safe_repr(path)} is {file_kind(st.st_mode)}, not a regular file")
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


def empty_file_error(where: str, kind: str) -> InputError:
    """The error of the file ``where`` ("point file 'x.npy'") that holds no byte, where a ``kind`` file's header
    belongs: said empty, as an empty .bin is (its header's missing magic number or DATA line reads as another
    format's file)."""
    return InputError(f"{where} is empty (0 bytes), not a {kind} file: a copy that failed? copy it again")


#: The fix for a file of binary points whose size says 0 (``said_empty_error``).
READ_A_COPY = "copy it to a regular file (cp) to read it"


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
        raise InputError(f"{what} {safe_repr(path)} is {file_kind(mode)} that gives more than the limit of "
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


def text_lines(text: str) -> list[str]:
    """``text`` cut into its lines as a text editor numbers them: at each LF, CRLF and CR alone (old Mac text), and
    nowhere else (str.splitlines cuts at a vertical tab, a form feed, \\x1c to \\x1e, \\x85, U+2028 and U+2029 too,
    which no editor's line numbers count); as with str.splitlines, a break that ends the text starts no line."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if not lines[-1] else lines


def read_text_lines(path: PathLike, *, max_bytes: int, what: str, pipes: bool = False) -> list[str]:
    """The lines of a UTF-8 text file (KITTI labels, predictions, id lists; ``text_lines``, so the n-th is the
    file's line n), read bounded (a FIFO, a device or a file over ``max_bytes`` is refused before anything blocks
    or fills memory; with ``pipes``, a FIFO or a character device is read, up to ``max_bytes``:
    ``read_file_or_pipe``): a byte-order mark that editors on Windows put first is dropped (kept, it made the first
    line's class "\\ufeffCar", which no evaluation counts), and bytes that are no UTF-8 are refused naming the file
    and the line, not replaced."""
    read = read_file_or_pipe if pipes else read_regular_file
    data = read(path, max_bytes=max_bytes, what=what)
    try:
        return text_lines(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        raise InputError(f"{what} {safe_repr(os.fspath(path))}, line {line}: bytes that are no UTF-8 text "
                         f"(byte {exc.start}); is it a text file?") from None
