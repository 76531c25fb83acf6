"""The atomic writers (readers see the old file or the new one, never a part), strict JSON, and
bounded reads that refuse anything but a regular file."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt import file_reads, file_writes
from pointpillars_trt.errors import InputError, PointPillarsError
from pointpillars_trt.file_reads import name_text, read_file_head, read_file_or_pipe, read_regular_file, read_text_lines
from pointpillars_trt.file_writes import replace_folder, write_text_atomic
from pointpillars_trt.strict_json import (DuplicateKeyError, NonFiniteJSONError, dumps_strict, loads_json, to_jsonable,
                                          write_json_atomic)


def test_replace_folder_swaps_whole_folders_and_puts_the_old_one_back_on_failure(tmp_path: Path) -> None:
    target, new = tmp_path / "model", tmp_path / ".model.tmp"
    replace_folder(_folder(new, {"a": "1"}), target)  # nothing there yet
    assert _contents(target) == {"a": "1"} and sorted(os.listdir(tmp_path)) == ["model"]
    replace_folder(_folder(new, {"b": "2", "c": "3"}), target)
    assert _contents(target) == {"b": "2", "c": "3"} and sorted(os.listdir(tmp_path)) == ["model"]
    with pytest.raises(FileNotFoundError):  # the new folder is gone: the old one goes back in place
        replace_folder(tmp_path / ".missing", target)
    assert _contents(target) == {"b": "2", "c": "3"} and sorted(os.listdir(tmp_path)) == ["model"]


def _folder(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _contents(path: Path) -> dict[str, str]:
    return {child.name: child.read_text() for child in path.iterdir()}


def test_atomic_text_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old content that is longer than the new one\n")
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_json_numpy_values(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    obj = {"count": np.int32(3), "ms": np.float32(1.5), "box": np.arange(3.0), "name": "x"}
    write_json_atomic(target, obj)
    assert json.loads(target.read_text()) == {"count": 3, "ms": 1.5, "box": [0.0, 1.0, 2.0], "name": "x"}
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert json.loads(target.read_text())["count"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_atomic_failure_keeps_old_file_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("old\n")

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_writes.os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_text_atomic(target, "new\n")
    monkeypatch.undo()
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_atomic_write_respects_umask(tmp_path: Path) -> None:
    if os.name != "posix":
        pytest.skip("POSIX permission bits")
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "p.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "p.txt").stat().st_mode & 0o777 == 0o644


# --------------------------------------------------------------------------- strict JSON

def test_json_refuses_nan_and_infinity_anywhere(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    target.write_text('{"old": 1}\n')
    cases = [
        ({"boxes": np.array([[1.0, 2.0], [3.0, np.nan]])}, "$.boxes[1][1]", "nan"),
        ({"a": [1, {"b": float("inf")}]}, "$.a[1].b", "inf"),
        ({"s": np.float32(-np.inf)}, "$.s", "-inf"),
        ([np.float64("nan")], "$[0]", "nan"),
    ]
    for obj, where, value in cases:
        with pytest.raises(NonFiniteJSONError) as err:
            write_json_atomic(target, obj)
        text = str(err.value)
        assert where in text and value in text and "s.json" in text and "\n" not in text
        assert isinstance(err.value, ValueError) and isinstance(err.value, PointPillarsError)
    assert target.read_text() == '{"old": 1}\n'  # nothing written
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_json_output_is_strict_and_numpy_converted(tmp_path: Path) -> None:
    target = tmp_path / "ok.json"
    obj = {"ids": np.array([1, 2], np.int64), "b": np.bool_(True), "f": np.float32(0.25), "t": (1, "x"), "n": None}
    write_json_atomic(target, obj)
    text = target.read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "ids": [1, 2], "b": True, "f": 0.25, "t": [1, "x"], "n": None}
    assert to_jsonable({np.str_("k"): np.arange(2)}) == {"k": [0, 1]}
    assert dumps_strict([1.5], indent=None) == "[1.5]"
    with pytest.raises(TypeError):
        to_jsonable({1: 2})


# --------------------------------------------------------------------------- bounded reads of regular files

def test_read_regular_file_reads_and_caps(tmp_path: Path) -> None:
    path = tmp_path / "f.dat"
    path.write_bytes(b"x" * 100)
    assert read_regular_file(path, max_bytes=100, what="data file") == b"x" * 100
    with pytest.raises(InputError) as err:
        read_regular_file(path, max_bytes=99, what="data file")
    assert str(err.value) == f"data file {str(path)!r} is 100 bytes, more than the limit of 99 bytes"
    assert read_file_head(path, 3) == b"xxx"


def test_a_head_read_of_a_small_file_sets_aside_its_size_not_the_count(tmp_path: Path) -> None:
    """A read of n bytes sets n bytes aside first: the head of a 100-byte file read with a count of 64 MiB is read
    by the file's size (a file that says it is empty, a chunk at a time), as read_regular_file reads."""
    from test_pointcloud_io import traced_peak

    path = tmp_path / "f.dat"
    path.write_bytes(b"x" * 100)
    data, peak = traced_peak(lambda: read_file_head(path, 1 << 26))
    assert data == b"x" * 100 and peak < 2**20, peak


def test_read_regular_file_reads_what_a_file_that_says_it_is_empty_holds_up_to_the_limit() -> None:
    """procfs (and some FUSE mounts) report a size of 0 for files that hold bytes: read up to the limit, as the
    file's size would otherwise bound it; past the limit, refused, as what it is (it was "grew past the limit", of a
    file that did not change)."""
    status = Path("/proc/self/status")
    if not status.is_file() or status.stat().st_size != 0:
        pytest.skip("no procfs file that reports a size of 0 here")
    data = read_regular_file(status, max_bytes=1 << 20, what="status file")
    assert data.startswith(b"Name:") and b"\nPid:" in data
    with pytest.raises(InputError, match=r"^status file '/proc/self/status' says it is empty \(size 0, as /proc files "
                       r"and files on some FUSE mounts say\) but holds more than the limit of 10 bytes$"):
        read_regular_file(status, max_bytes=10, what="status file")


@pytest.mark.skipif(not hasattr(os, "set_blocking"), reason="no non-blocking pipes here")
def test_a_read_that_would_wait_raises_saying_so_where_it_gave_none() -> None:
    """Files are opened non-blocking, so a FIFO swapped in never blocks the open; a file that says it is regular but
    would wait for data (/proc/kmsg, a FUSE file that answers EAGAIN; none can be made here without stealing what a
    reader of it waits for) then gave None to a read, and the readers failed with Python's words: "object of type
    'NoneType' has no len()" (read_bounded, the .npy header). A real non-blocking pipe whose writer writes nothing
    reads as such a file does: the reader the openers give raises BlockingIOError saying why, which each reader's
    `cannot be read:` line carries; what a file gives without waiting is read as before."""
    from pointpillars_trt.pointcloud_io import _npy_header

    def pipe(data: bytes) -> tuple[int, int]:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.write(write_end, data)
        return read_end, write_end

    read_end, write_end = pipe(b"")
    try:
        with file_reads.no_wait_reader(read_end) as f:
            for read in (lambda: file_reads.read_bounded(f, 100), lambda: file_reads.read_bounded(f, 100, 10),
                         lambda: _npy_header(f), f.read):
                with pytest.raises(BlockingIOError) as info:
                    read()
                assert info.value.strerror == ("it gives no data without waiting (as /proc/kmsg does): not a regular "
                                               "file's contents")
    finally:
        os.close(write_end)
    read_end, write_end = pipe(b"abc")
    os.close(write_end)  # the end of the data: a read gives what there is, then nothing
    with file_reads.no_wait_reader(read_end) as f:
        assert file_reads.read_bounded(f, 100) == b"abc"


@pytest.mark.parametrize("breaks", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_text_lines_break_at_lf_crlf_and_cr_alone_and_are_numbered_as_an_editor_does(tmp_path: Path,
                                                                                      breaks: str) -> None:
    """str.splitlines broke a line at a vertical tab, a form feed, \\x1c to \\x1e, NEL, U+2028 and U+2029 too, which
    no editor's line numbers count, and bytes that are no UTF-8 were named on the line their LFs alone counted
    (line 1 of a file whose lines end in CR alone): lines break at LF, CRLF and CR alone, and are numbered so."""
    others = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    lines = ["000001", f"a{others}b", "", others, " last "]
    path = tmp_path / "lines.txt"
    path.write_bytes(breaks.join(lines).encode() + breaks.encode())
    assert read_text_lines(path, max_bytes=1000, what="id file") == lines
    path.write_bytes(breaks.join(lines).encode())
    assert read_text_lines(path, max_bytes=1000, what="id file") == lines
    path.write_bytes(b"a\rb\r\nc\n\nd\r\re")
    assert read_text_lines(path, max_bytes=1000, what="id file") == ["a", "b", "c", "", "d", "", "e"]
    head = (breaks.join(lines) + breaks + "Car").encode()
    path.write_bytes(head + b"\xff" + breaks.encode())
    with pytest.raises(InputError) as err:
        read_text_lines(path, max_bytes=1000, what="id file")
    assert str(err.value) == (f"id file {str(path)!r}, line 6: bytes that are no UTF-8 text (byte {len(head)}); is it "
                              "a text file?")


def test_read_regular_file_refuses_special_files_at_once(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory, not a regular file"):
        read_regular_file(tmp_path, max_bytes=10)
    with pytest.raises(InputError, match="does not exist"):
        read_regular_file(tmp_path / "none", max_bytes=10)
    if os.path.exists("/dev/zero"):
        start = time.monotonic()
        with pytest.raises(InputError, match="'/dev/zero' is a character device, not a regular file"):
            read_regular_file("/dev/zero", max_bytes=10)
        assert time.monotonic() - start < 1
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        start = time.monotonic()
        with pytest.raises(InputError, match="is a FIFO"):  # no writer: an open() would block forever
            read_regular_file(fifo, max_bytes=10)
        assert time.monotonic() - start < 1
    if hasattr(socket, "AF_UNIX"):
        sock_path = tmp_path / "s.sock"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(sock_path))
            with pytest.raises(InputError, match="is a socket"):
                read_regular_file(sock_path, max_bytes=10)


def test_read_file_or_pipe_reads_a_character_device_to_its_end_up_to_the_limit(tmp_path: Path) -> None:
    """A character device is read as a pipe is, a chunk at a time: /dev/null gives nothing, /dev/zero no end (refused
    a byte past the limit); a socket or a folder is refused as read_regular_file refuses it."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/null and /dev/zero here")
    assert read_file_or_pipe("/dev/null", max_bytes=10, what="id list") == b""
    with pytest.raises(InputError) as err:
        read_file_or_pipe("/dev/zero", max_bytes=3 * 2**20, what="id list")
    assert str(err.value) == \
        f"id list '/dev/zero' is a character device that gives more than the limit of {3 * 2**20} bytes"
    with pytest.raises(InputError, match="^id list .* is a directory, not a regular file$"):
        read_file_or_pipe(tmp_path, max_bytes=10, what="id list")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "s.sock"))
        with pytest.raises(InputError, match="is a socket, not a regular file"):
            read_file_or_pipe(tmp_path / "s.sock", max_bytes=10)


def test_read_regular_file_refuses_sparse_20gb_by_size(tmp_path: Path) -> None:
    big = tmp_path / "sparse.bin"
    with open(big, "wb") as f:
        f.truncate(20_000_000_000)
    start = time.monotonic()
    with pytest.raises(InputError, match="is 20000000000 bytes, more than the limit"):
        read_regular_file(big, max_bytes=1 << 20)
    assert time.monotonic() - start < 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_read_regular_file_errno_text(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.write_bytes(b"1")
    locked.chmod(0)
    with pytest.raises(InputError, match="cannot be read: Permission denied"):
        read_regular_file(locked, max_bytes=10)


def test_dumps_strict_is_byte_for_byte_the_standard_librarys_indented_json() -> None:
    """The fast indented encoder against json.dumps itself, on frame records and odd shapes."""
    import json

    from pointpillars_trt.detections import Detections, FrameStats
    from pointpillars_trt.strict_json import dumps_strict, to_jsonable

    rng = np.random.default_rng(0)
    values: list[object] = [
        {"a": [], "b": {}, "c": [[1.0, 2.0], []], "d": True, "e": None, "f": np.float32(1.5), "g": [1, 2.5, "x"],
         "h": [[1, 2]], "i": [[1.0], [2.0, 3.0]], "k\u00e9y": "v\u00e9\n\"", "n": -0.0, "o": 1e-7, "p": 1e22},
        [], {}, [[[1.0]]], 3, "s", np.arange(4.0),
    ]
    for n in (0, 1, 17):
        det = Detections(rng.normal(size=(n, 7)).astype(np.float32) * 30, rng.random(n).astype(np.float32),
                         rng.integers(0, 3, n).astype(np.int32), ("Car", "Pedestrian", "Cyclist"), FrameStats(99, 1, 7, 0))
        values.append(det.to_json_dict("000123"))
    for value in values:
        for indent in (2, 4):
            assert dumps_strict(value, indent=indent) == json.dumps(to_jsonable(value), indent=indent, allow_nan=False)
    with pytest.raises(NonFiniteJSONError, match=r"\$\.b\[0\]\[1\]"):
        dumps_strict({"a": 1.0, "b": [[1.0, float("nan")]]})


def test_pending_flush_keeps_only_folders_where_syncfs_covers_the_files(tmp_path: Path) -> None:
    """On Linux (syncfs) a run's flush list holds its folders, not one entry a file, so memory stays flat;
    the pass opens the folders (a folder that is gone is an error) and never the files."""
    pending = file_writes.PendingFlush()
    assert pending._syncfs is not None  # Linux
    (tmp_path / "a").mkdir()
    pending.add(tmp_path / "a" / f"{i}.json" for i in range(10_000))
    pending.add([tmp_path / "b.json"])
    assert pending._files == [] and pending._folders == {str(tmp_path / "a"), str(tmp_path)}
    pending.flush()  # none of the files exists: only the folders were opened
    os.rmdir(tmp_path / "a")
    with pytest.raises(FileNotFoundError):
        pending.flush()


def test_pending_flush_fsyncs_each_file_where_there_is_no_syncfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pending = file_writes.PendingFlush()
    pending._syncfs = None  # as on a system without syncfs
    write_text_atomic(tmp_path / "kept.txt", "x", durable=False)
    pending.add([tmp_path / "kept.txt", tmp_path / "never_written.txt"])
    with pytest.raises(FileNotFoundError):
        pending.flush()
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    pending = file_writes.PendingFlush()
    pending._syncfs = None
    pending.add([tmp_path / "kept.txt"])
    pending.flush()
    assert synced == [str(tmp_path / "kept.txt"), str(tmp_path)]  # the file, then its folder (the rename)


def test_a_name_at_the_file_systems_limit_is_written_atomically(tmp_path: Path) -> None:
    """A 255-byte name (the usual limit) is written; its temp file (name shortened with a hash) is
    gone afterwards, and a dead writer's such temp file is cleared as any other."""
    import os

    from pointpillars_trt.file_writes import remove_stale_temp_files, write_bytes_atomic

    name = "é" * 100 + "a" * 50 + ".json"  # 255 bytes in UTF-8
    assert len(os.fsencode(name)) == 255
    write_bytes_atomic(tmp_path / name, b"{}\n", durable=False)
    assert os.listdir(tmp_path) == [name] and (tmp_path / name).read_bytes() == b"{}\n"
    dead = 2**22 + 12345  # beyond pid_max on common systems: no such process
    stale = f".{'b' * 180}-0123456789ab.{dead}.deadbeef.pp-tmp"
    (tmp_path / stale).write_bytes(b"")
    assert remove_stale_temp_files(tmp_path) == 1 and os.listdir(tmp_path) == [name]


def test_loads_json_refuses_an_integer_too_long_to_be_a_number_a_record_holds() -> None:
    """A score of 5,001 digits: one ValueError saying so, not Python's int() limit naming a setting to raise."""
    assert loads_json('{"n": -12345678901234567890, "s": [1, 0.5]}') == {"n": -12345678901234567890, "s": [1, 0.5]}
    with pytest.raises(ValueError, match=r"^an integer of 5001 digits: not a number a record holds$"):
        loads_json('{"scores": [1' + "0" * 5000 + "]}")


def test_loads_json_refuses_a_repeated_key_at_any_depth() -> None:
    """json keeps the last of two values silently; the reader refuses, naming the first key that repeats."""
    assert loads_json(b'{"a": {"b": 1, "c": [{"b": 2}]}, "b": 3}') == {"a": {"b": 1, "c": [{"b": 2}]}, "b": 3}
    with pytest.raises(DuplicateKeyError, match="^key 'x' appears twice in one object$") as info:
        loads_json('{"a": [{"y": 1, "x": 1, "y\\u0000": 0, "x": 2}]}')
    assert isinstance(info.value, ValueError) and isinstance(info.value, PointPillarsError)


def test_write_new_file_atomic_never_replaces_a_file(tmp_path: Path) -> None:
    """A name another writer took first: FileExistsError, its bytes untouched and no temp file left; a free
    name gets the bytes whole."""
    from pointpillars_trt.file_writes import write_new_file_atomic

    taken = tmp_path / "part.jsonl"
    taken.write_bytes(b"theirs\n")
    with pytest.raises(FileExistsError):
        write_new_file_atomic(taken, b"mine\n", durable=False)
    write_new_file_atomic(tmp_path / "free.jsonl", b"mine\n")
    assert taken.read_bytes() == b"theirs\n" and (tmp_path / "free.jsonl").read_bytes() == b"mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["free.jsonl", "part.jsonl"]


def test_a_folder_held_refuses_a_second_holder_and_says_where_it_cannot_be_held(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two holds of one folder (two opens, as two processes make): the second is refused with the text given;
    after the first ends, it is held again. Where the file system has no locks (flock failing with ENOLCK, as
    on some network file systems), the block runs and the caller is told why, once."""
    import errno
    import fcntl

    folder = tmp_path / "out"
    with file_writes.folder_held(folder, "held elsewhere"):
        assert folder.is_dir()
        with pytest.raises(InputError, match="^held elsewhere$"), file_writes.folder_held(folder, "held elsewhere"):
            pass
    with file_writes.folder_held(folder, "held elsewhere"):
        pass

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    told: list[str] = []
    ran = []
    with file_writes.folder_held(folder, "held elsewhere", told.append):
        ran.append(True)
    assert ran == [True] and told == [os.strerror(errno.ENOLCK)]


def test_name_text_tells_every_file_name_apart_and_gives_strict_utf8() -> None:
    """Names as ``--skip-existing`` matches them: a file named with the text of an escape (``z\\xff.bin``) and
    one whose name holds the byte 0xff, with and without backslashes of their own, get distinct texts, each
    valid UTF-8, and a name of plain text is itself."""
    names = [os.fsdecode(raw) for raw in (b"z\xff.bin", b"z\\xff.bin", b"z\\\\xff.bin", b"a\\b\xff.bin",
                                          b"a\\\\b\\xff.bin", b"a\\b.bin", b"plain.bin", b"\xc3\xa9t\xc3\xa9.bin")]
    texts = [name_text(name) for name in names]
    assert len(set(texts)) == len(names), texts
    for text in texts:
        text.encode("utf-8", "strict")
    assert name_text("plain.bin") == "plain.bin" and name_text("a\\b.bin") == "a\\b.bin"
    assert name_text("été.bin") == "été.bin"
    assert name_text(os.fsdecode(b"z\xff.bin")) == "z\\xff.bin"


@pytest.mark.parametrize(("package", "xdg", "expected"), [
    ("/p/cache", "/x", "/p/cache"),  # the package's own variable first
    ("", "/x", "/x/pointpillars-trt"),  # then the XDG base directory spec's
    ("", "relative/x", "{home}/.cache/pointpillars-trt"),  # a relative XDG_CACHE_HOME is ignored, as the spec says
    ("", "", "{home}/.cache/pointpillars-trt"),
])
def test_user_cache_dir_takes_its_variable_then_xdg_cache_home_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                          package: str, xdg: str, expected: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", package)
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert file_writes.user_cache_dir() == Path(expected.format(home=tmp_path))
