"""PyTorch ``.pth`` checkpoints -> family-independent NumPy weights, without torch.

Why no torch: the runtime (TensorRT / ONNX Runtime) never needs it, and a multi-gigabyte dependency
only to read five million floats is a bad trade for a deployment package.

Why a restricted unpickler: a ``.pth`` file is a pickle, and a plain ``pickle.load`` (or ``torch.load``
without ``weights_only``) runs whatever code the file names. Here the file may name only tensors,
storage types and ``OrderedDict``; any other global is refused before it is looked up, let alone
called, and tensors are rebuilt by our own code from raw bytes.

Both torch formats are read: the zip archive (the default since torch 1.6; what zhulf0804 writes)
and the legacy stream of consecutive pickles (``_use_new_zipfile_serialization=False``; what
OpenPCDet writes). ``../shared/assets/README.md`` describes both and the two key layouts.

Why limits everywhere: a checkpoint may come from anyone, and a few hundred bytes can otherwise ask
for gigabytes (expanded views, zip bombs, huge memo indices or byte counts) or block forever (a
FIFO). So only regular files up to ``MAX_CHECKPOINT_BYTES`` are read; each pickle's opcodes are
checked before it runs; zip records are refused on their declared size and never inflated past it;
every view must lie inside its storage; ``load_checkpoint`` builds only the tensors the layout uses,
once their shapes match the config, and refuses NaN / inf weights; ``read_pth`` builds at most
``MAX_INFLATION`` x the file size. Every failure is one ``CheckpointError`` line naming the file,
with untrusted values shown by ``short_repr`` (short, control characters escaped).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import pickletools
import stat
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from ..config import ModelConfig, load_config
from ..errors import CheckpointError, escape_text
from . import multihead
from .weights import BatchNorm, Conv1x1, ConvBN, PointPillarsWeights

Layout = Literal["openpcdet", "zhulf0804"]
LAYOUT_CONFIGS: dict[str, str] = {"openpcdet": "openpcdet_kitti_3class", "zhulf0804": "zhulf0804_kitti_3class"}
MULTIHEAD_CONFIG = "openpcdet_nuscenes_multihead"  # an OpenPCDet layout with multihead.HEAD_KEY keys

# ---------------------------------------------------------------------------------------------
# Limits: what a file can legitimately hold (issue 9: tiny hostile files must not exhaust memory)
# ---------------------------------------------------------------------------------------------

MAX_CHECKPOINT_BYTES = 2 * 1024**3  # larger files are refused with their size, before any read
MAX_PICKLE_BYTES = 64 * 1024**2     # one pickle (data.pkl, a legacy record): a state dict's is ~100 KB
MAX_PICKLE_OPCODES = 2_000_000      # ~40 per tensor record; bounds the objects a pickle can build
MAX_TUPLE_NESTING = 100             # hashing a deeper tuple recurses in C (a 1M-deep key crashes Python)
MAX_PICKLE_BUILDS = 256             # BUILD copies its state: many BUILDs of one big state are quadratic
MAX_INFLATION = 4                   # storage bytes read + arrays built may exceed the file size this much
INFLATION_SLACK = 16 * 1024**2      # ... plus this, so small files may hold small expanded views
MAX_DIMS = 64                       # NumPy's limit
_SMALL_RECORD_BYTES = 64            # byteorder record ("little" / "big")
_INT64_LIMIT = 2**63

# ---------------------------------------------------------------------------------------------
# Messages: untrusted values are shown short and escaped
# ---------------------------------------------------------------------------------------------


def _bounded_repr(value: Any, depth: int, limit: int) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):  # str() of an int over 4300 digits raises ValueError; huge ones are slow anyway
        return repr(value) if value.bit_length() <= 256 else f"<{value.bit_length()}-bit int>"
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[: limit + 1])  # repr escapes control characters
    if isinstance(value, _TensorRef):
        return f"<tensor {np.dtype(value.storage.dtype).name} {_bounded_repr(value.size, depth, limit)}>"
    if isinstance(value, (tuple, list, dict)):
        items = list(value.items())[:8] if isinstance(value, dict) else list(value[:8])
        if depth <= 0:
            inner = "..." if items else ""
        elif isinstance(value, dict):
            inner = ", ".join(f"{_bounded_repr(k, depth - 1, limit)}: {_bounded_repr(v, depth - 1, limit)}"
                              for k, v in items)
        else:
            inner = ", ".join(_bounded_repr(v, depth - 1, limit) for v in items)
        if len(value) > len(items):
            inner += ", ..."
        elif isinstance(value, tuple) and len(value) == 1:
            inner += ","
        brackets = "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        return brackets[0] + inner + brackets[1]
    if isinstance(value, np.ndarray):
        return f"<array {value.dtype} {value.shape}>"
    return f"<{escape_text(type(value).__name__, 40)}>"


def short_repr(value: Any, limit: int = 60) -> str:
    """A repr of an untrusted value for one-line messages: at most ``limit`` characters, control
    characters escaped, nested containers and huge ints abbreviated (never raises)."""
    try:
        text = _bounded_repr(value, 3, limit)
    except Exception:  # e.g. RecursionError from a pathological object
        text = f"<{type(value).__name__}>"
    return escape_text(text, limit)


def _key_text(key: Any, limit: int = 100) -> str:
    """A state-dict key as listed in messages: plain text for a string, else its short repr."""
    return escape_text(key, limit) if isinstance(key, str) else short_repr(key, limit)


# ---------------------------------------------------------------------------------------------
# Reading the two torch file formats
# ---------------------------------------------------------------------------------------------

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_STORAGE_DTYPES = {  # torch storage class -> NumPy type code (byte order applied per file)
    "FloatStorage": "f4", "HalfStorage": "f2", "DoubleStorage": "f8",
    "LongStorage": "i8", "IntStorage": "i4", "ShortStorage": "i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "b1",
}


# Everything the unpickler hands to the pickle machine is an immutable NamedTuple, so a crafted
# BUILD opcode cannot alter this module's state.
class _StorageType(NamedTuple):
    dtype: str


class _StorageRef(NamedTuple):
    key: str
    dtype: str
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


class _TensorRef(NamedTuple):
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = np.dtype(self.storage.dtype).itemsize
        for s in self.size:
            n *= s
        return n


class _Rebuild(NamedTuple):
    fn: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class _Malformed(ValueError):
    """A record that unpickled but does not describe a tensor; reported with the file name."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _INT64_LIMIT


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_grad_hooks_metadata: Any) -> _TensorRef:
    record = f"(offset {short_repr(offset, 30)}, size {short_repr(size)}, stride {short_repr(stride)})"
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= MAX_DIMS):
        raise _Malformed(f"bad tensor record {record}")
    if any(isinstance(v, int) and v < 0 for v in stride):
        raise _Malformed(f"negative strides are not supported {record}")
    if not (isinstance(storage, _StorageRef) and _is_count(offset) and all(_is_count(v) for v in size + stride)):
        raise _Malformed(f"bad tensor record {record}")
    if 0 not in size:  # the view's full extent: its last element must lie in the storage
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= storage.numel:
            raise _Malformed(f"a tensor of size {short_repr(size)} reads element {last} of storage "
                             f"{short_repr(storage.key)}, which has {storage.numel}")
    return _TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_grad_hooks: Any) -> _TensorRef:
    if not isinstance(data, _TensorRef):
        raise _Malformed("a Parameter record that does not hold a tensor")
    return data


def _new_ordered_dict(*args: Any) -> OrderedDict[Any, Any]:
    # torch pickles an OrderedDict as OrderedDict() followed by SETITEMS; a copy of a memoised
    # mapping per call would let a small pickle build quadratically many entries.
    if args:
        raise _Malformed("OrderedDict(...) with arguments is not supported")
    return OrderedDict()


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _Rebuild(_new_ordered_dict),
    ("torch._utils", "_rebuild_tensor_v2"): _Rebuild(_rebuild_tensor),
    ("torch._utils", "_rebuild_parameter"): _Rebuild(_rebuild_parameter),
    **{("torch", name): _StorageType(code) for name, code in _STORAGE_DTYPES.items()},
}

_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_TUPLES = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"})


def _scan_pickle(stream: io.BytesIO) -> None:
    """Walk one pickle's opcodes before the C unpickler runs it, refusing what would make a small
    file cost a lot: memo indices beyond the opcodes seen (the C memo is an array sized by the
    largest index), byte counts beyond the data (``genops`` reads them from the stream and fails
    on a short read), tuples nested deeper than ``MAX_TUPLE_NESTING`` (tracked on a shadow stack,
    since tuples are immutable their depth is known when built) and too many opcodes or BUILDs."""
    start = stream.tell()
    stack: list[int] = []  # the tuple nesting depth of each stack entry
    marks: list[int] = []
    memo: dict[int, int] = {}
    builds = 0
    ops = pickletools.genops(stream)
    for count, (op, arg, pos) in enumerate(ops, 1):
        if count > MAX_PICKLE_OPCODES:
            raise _Malformed(f"more than {MAX_PICKLE_OPCODES} pickle opcodes")
        name = op.name
        if name in _MEMO_PUTS or name == "MEMOIZE":
            index = len(memo) if name == "MEMOIZE" else arg
            if not (isinstance(index, int) and 0 <= index <= count):
                raise _Malformed(f"memo index {short_repr(index)} at byte {pos} is out of range "
                                 f"(the pickle has stored {len(memo)} objects so far)")
            if not stack:
                raise _Malformed(f"{name} at byte {pos} with an empty stack")
            memo[index] = stack[-1]
            continue
        if name in _MEMO_GETS:
            if arg not in memo:
                raise _Malformed(f"memo index {short_repr(arg)} at byte {pos} was never stored")
            stack.append(memo[arg])
            continue
        if name == "MARK":
            marks.append(len(stack))
            continue
        if name == "BUILD":
            builds += 1
            if builds > MAX_PICKLE_BUILDS:
                raise _Malformed(f"more than {MAX_PICKLE_BUILDS} BUILD opcodes")
        if name == "POP" and len(stack) == (marks[-1] if marks else 0) and marks:
            marks.pop()  # POP of a MARK (as protocol 0 writes for a recursive tuple)
            continue
        before, popped = op.stack_before, []
        if pickletools.markobject in before:
            if not marks:
                raise _Malformed(f"{name} at byte {pos} without a MARK")
            at = marks.pop()
            popped, below = stack[at:], before.index(pickletools.markobject)
            del stack[at:]
        else:
            below = len(before)
        if len(stack) - (marks[-1] if marks else 0) < below:  # the C unpickler cannot pop below a MARK
            raise _Malformed(f"{name} at byte {pos} pops an empty stack")
        if below:
            popped += stack[-below:]
            del stack[-below:]
        if name in _TUPLES:
            depth = 1 + max(popped, default=0)
            if depth > MAX_TUPLE_NESTING:
                raise _Malformed(f"tuples nested more than {MAX_TUPLE_NESTING} deep")
            stack.append(depth)
        elif name == "DUP":
            stack += popped * 2
        else:
            stack += [0] * len(op.stack_after)
    stream.seek(start)


class _Unpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; records every storage the pickle refers to."""

    def __init__(self, file: io.BytesIO, source: str, max_storage_bytes: int) -> None:
        super().__init__(file)
        self.source = source
        self.max_storage_bytes = max_storage_bytes
        self.storages: dict[str, _StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise CheckpointError(
                f"{self.source}: refusing to load global '{escape_text(str(module), 60)}.{escape_text(str(name), 60)}': "
                "a checkpoint may name only tensors, torch storage types and OrderedDict (plain pickle would run this)"
            )
        return found

    def persistent_load(self, pid: Any) -> _StorageRef:
        # zip: ('storage', type, key, location, numel); legacy adds a view record, None since torch 0.4.
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise _Malformed(f"unsupported persistent id {short_repr(pid, 80)}")
        _, storage_type, key, _location, numel, *view = pid
        if view and view[0] is not None:
            raise _Malformed("storage views (files from torch < 0.4) are not supported")
        if not (isinstance(storage_type, _StorageType) and isinstance(key, str) and _is_count(numel)):
            raise _Malformed(f"bad storage record {short_repr(pid, 80)}")
        ref = _StorageRef(key, storage_type.dtype, numel)
        if ref.nbytes > self.max_storage_bytes:
            raise _Malformed(f"storage {short_repr(key)} declares {short_repr(numel)} x {ref.dtype} "
                             f"({short_repr(ref.nbytes)} bytes), "
                             f"more than this file can hold ({self.max_storage_bytes} bytes)")
        if self.storages.setdefault(key, ref) != ref:
            raise _Malformed(f"storage {short_repr(key)} is referenced with two types or sizes")
        return ref


def _one_line(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # e.g. a KeyError holding a 5000-digit int
        text = ""
    text = escape_text(" ".join(text[:1000].split()), 200)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def _reading(source: str, problem: str) -> Iterator[None]:
    """Turn whatever a damaged file makes zipfile / pickle / NumPy raise into one CheckpointError line
    (RecursionError and MemoryError included)."""
    try:
        yield
    except CheckpointError:
        raise
    except _Malformed as exc:
        raise CheckpointError(f"{source}: {problem}: {exc}") from None
    except Exception as exc:  # corrupt input can surface as almost any exception type
        raise CheckpointError(f"{source}: {problem} ({_one_line(exc)})") from None


@dataclass
class _Budget:
    """Bytes that may still be decompressed or materialised: ``MAX_INFLATION`` x file size + slack."""

    left: int
    total: int = field(init=False)

    def __post_init__(self) -> None:
        self.total = self.left

    def take(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            raise _Malformed(f"{what} needs {short_repr(nbytes)} bytes, more than a file of this size can "
                             f"legitimately hold (at most {self.total} bytes in all)")
        self.left -= nbytes


@dataclass
class _Parsed:
    """A checkpoint's object tree with tensors still as records; storages are read on demand."""

    obj: Any
    source: str
    byteorder: str
    budget: _Budget
    read_storage: Callable[[_StorageRef], bytes | memoryview]
    _cache: dict[str, bytes | memoryview] = field(default_factory=dict)

    def storage(self, ref: _StorageRef) -> bytes | memoryview:
        if ref.key not in self._cache:
            self._cache[ref.key] = self.read_storage(ref)
        return self._cache[ref.key]

    def tensor(self, ref: _TensorRef, counted: bool = True) -> np.ndarray:
        """An owned, C-contiguous array; ``counted``: its bytes come out of the budget (not for
        tensors whose shape was checked against the config)."""
        with _reading(self.source, "cannot rebuild tensors"):
            if counted:
                self.budget.take(ref.nbytes, f"a tensor of size {short_repr(ref.size)}")
            return _tensor(ref, self.storage(ref.storage), self.byteorder)

    def materialize(self) -> Any:
        """Replace tensor records by owned, C-contiguous arrays; shared and cyclic containers stay so."""
        done: dict[int, Any] = {}

        def walk(x: Any) -> Any:
            if id(x) in done:
                return done[id(x)]
            if isinstance(x, _TensorRef):
                out: Any = self.tensor(x)
            elif isinstance(x, _StorageRef):
                raise _Malformed("a bare storage outside any tensor is not supported")
            elif isinstance(x, dict):
                out = done[id(x)] = OrderedDict() if isinstance(x, OrderedDict) else {}
                out.update((k, walk(v)) for k, v in x.items())
            elif isinstance(x, list):
                out = done[id(x)] = []
                out.extend(walk(v) for v in x)
            elif isinstance(x, tuple):
                out = tuple(walk(v) for v in x)
            else:
                return x
            done[id(x)] = out
            return out

        with _reading(self.source, "cannot rebuild tensors"):
            return walk(self.obj)


def _unpickle(stream: io.BytesIO, source: str, what: str, budget: _Budget) -> tuple[Any, dict[str, _StorageRef]]:
    unpickler = _Unpickler(stream, source, budget.total)
    with _reading(source, f"{what} is truncated or corrupt"):
        _scan_pickle(stream)
        obj = unpickler.load()
    return obj, unpickler.storages


def _open_record(archive: zipfile.ZipFile, name: str, limit: int, source: str) -> bytes:
    """A zip record's bytes, refusing it unread when it declares more than ``limit`` bytes and never
    decompressing more than that (a declared size can lie; a bomb stops at ``limit`` + 1)."""
    info = archive.getinfo(name)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _Malformed(f"record {escape_text(name, 80)} uses compression method {info.compress_type}; "
                         "torch writes stored (or deflated) records only")
    if info.file_size > limit:
        raise _Malformed(f"record {escape_text(name, 80)} declares {info.file_size} bytes, more than the {limit} "
                         "it may have")
    with archive.open(info) as record:
        raw = record.read(limit + 1)
    if len(raw) > limit:
        raise _Malformed(f"record {escape_text(name, 80)} holds more than {limit} bytes")
    return raw


def _read_zip(data: bytes, source: str) -> _Parsed:
    budget = _Budget(MAX_INFLATION * len(data) + INFLATION_SLACK)
    with _reading(source, "truncated or corrupt zip archive"):
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = set(archive.namelist())
    pickles = sorted(n for n in names if n.endswith("/data.pkl") and n.count("/") == 1)
    if len(pickles) != 1:
        raise CheckpointError(f"{source}: zip archive is not a torch checkpoint: expected one "
                              f"'<folder>/data.pkl', found {len(pickles)}")
    prefix = pickles[0][: -len("data.pkl")]
    shown = escape_text(pickles[0], 80)
    with _reading(source, f"cannot read {shown}"):
        raw = _open_record(archive, pickles[0], min(MAX_PICKLE_BYTES, budget.total), source)
        budget.take(len(raw), shown)
        obj, refs = _unpickle(io.BytesIO(raw), source, shown, budget)
    byteorder_raw = b"little"
    if prefix + "byteorder" in names:
        with _reading(source, f"cannot read {escape_text(prefix, 80)}byteorder"):
            byteorder_raw = _open_record(archive, prefix + "byteorder", _SMALL_RECORD_BYTES, source)
    byteorder = byteorder_raw.decode("ascii", "replace")
    if byteorder not in ("little", "big"):
        raise CheckpointError(f"{source}: unknown byteorder record {short_repr(byteorder, 20)}")
    # Check every storage record's declared size now (no decompression); read one when a tensor needs it.
    for ref in refs.values():
        name = f"{prefix}data/{ref.key}"
        with _reading(source, f"cannot read storage record {escape_text(name, 80)}"):
            info = archive.getinfo(name)
        if info.file_size != ref.nbytes:
            raise CheckpointError(f"{source}: storage record {escape_text(name, 80)} has {info.file_size} bytes, "
                                  f"expected {ref.nbytes} ({ref.numel} x {ref.dtype})")

    def read_storage(ref: _StorageRef) -> bytes:
        name = f"{prefix}data/{ref.key}"
        with _reading(source, f"cannot read storage record {escape_text(name, 80)}"):
            budget.take(ref.nbytes, f"storage record {escape_text(name, 80)}")
            raw = _open_record(archive, name, ref.nbytes, source)
        if len(raw) != ref.nbytes:
            raise CheckpointError(f"{source}: storage record {escape_text(name, 80)} has {len(raw)} bytes, "
                                  f"expected {ref.nbytes} ({ref.numel} x {ref.dtype})")
        return raw

    return _Parsed(obj, source, byteorder, budget, read_storage)


def _read_legacy(data: bytes, source: str) -> _Parsed:
    stream = io.BytesIO(data)
    budget = _Budget(MAX_INFLATION * len(data) + INFLATION_SLACK)
    not_torch = f"{source}: not a torch checkpoint (neither a zip archive nor a legacy torch pickle stream)"
    try:
        _scan_pickle(stream)
        magic = _Unpickler(stream, source, 0).load()
    except Exception:  # any failure here means the bytes are not a legacy stream at all
        raise CheckpointError(not_torch) from None
    if not (isinstance(magic, int) and magic == _LEGACY_MAGIC):
        raise CheckpointError(not_torch)
    protocol, _ = _unpickle(stream, source, "legacy header", budget)
    if protocol != _LEGACY_PROTOCOL:
        raise CheckpointError(f"{source}: legacy protocol version {short_repr(protocol, 20)}, "
                              f"expected {_LEGACY_PROTOCOL}")
    _unpickle(stream, source, "legacy sys-info record", budget)
    obj, refs = _unpickle(stream, source, "main pickle", budget)
    keys, _ = _unpickle(stream, source, "storage key list", budget)
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise CheckpointError(f"{source}: storage key list is not a list of strings")
    # Storage payloads follow: per key an int64 element count, then the raw bytes, always little-endian.
    # They are views of the file's bytes: nothing is copied until a tensor is built.
    pos, view, storages = stream.tell(), memoryview(data), {}
    for key in keys:
        ref = refs.get(key)
        if ref is None:
            raise CheckpointError(f"{source}: storage {short_repr(key)} is listed but no tensor uses it")
        count = int.from_bytes(data[pos:pos + 8], "little", signed=True)
        if pos + 8 > len(data) or count != ref.numel or pos + 8 + ref.nbytes > len(data):
            raise CheckpointError(f"{source}: storage {short_repr(key)} is truncated or corrupt: needs {ref.numel} "
                                  f"x {ref.dtype} at byte {pos}, file has {len(data)} bytes")
        storages[key] = view[pos + 8:pos + 8 + ref.nbytes]
        pos += 8 + ref.nbytes

    def read_storage(ref: _StorageRef) -> memoryview:
        if ref.key not in storages:
            raise _Malformed(f"storage {short_repr(ref.key)} has no data")
        return storages[ref.key]

    return _Parsed(obj, source, "little", budget, read_storage)


def _tensor(ref: _TensorRef, raw: bytes | memoryview, byteorder: str) -> np.ndarray:
    dtype = np.dtype(ref.storage.dtype).newbyteorder("<" if byteorder == "little" else ">")
    native = dtype.newbyteorder("=")
    if 0 in ref.size:
        return np.zeros(ref.size, dtype=native)
    base = np.frombuffer(raw, dtype=dtype)
    last = ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride))
    if last >= base.size:  # checked against the declared size already; this is the bytes actually read
        raise _Malformed(f"a tensor of size {short_repr(ref.size)} reads element {last} of storage "
                         f"{short_repr(ref.storage.key)}, which has {base.size}")
    strides = tuple(s * dtype.itemsize for s in ref.stride)
    view = np.lib.stride_tricks.as_strided(base[ref.offset:], shape=ref.size, strides=strides, writeable=False)
    return np.array(view, dtype=native, order="C")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read_bytes(path: Path, source: str) -> bytes:
    """The file's bytes: a regular file (a FIFO or device would block or never end) of at most
    ``MAX_CHECKPOINT_BYTES``, checked before opening and again on the open descriptor."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise CheckpointError(f"{source}: is a directory, expected a .pth file")
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{source}: is {_kind(info.st_mode)}, expected a regular .pth file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb", closefd=True) as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):  # replaced between stat and open
                raise CheckpointError(f"{source}: is {_kind(info.st_mode)}, expected a regular .pth file")
            if info.st_size > MAX_CHECKPOINT_BYTES:
                raise CheckpointError(f"{source}: file is {info.st_size} bytes, larger than the "
                                      f"{MAX_CHECKPOINT_BYTES}-byte limit for a checkpoint")
            data = file.read(info.st_size)
            if file.read(1):
                raise CheckpointError(f"{source}: file grew while it was read")
    except FileNotFoundError:
        raise CheckpointError(f"{source}: checkpoint file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _one_line(exc)
        raise CheckpointError(f"{source}: cannot read ({reason})") from None
    except MemoryError:
        raise CheckpointError(f"{source}: not enough memory to read {info.st_size} bytes") from None
    if not data:
        raise CheckpointError(f"{source}: empty file, expected a torch checkpoint")
    return data


def _parse(data: bytes, source: str) -> _Parsed:
    return _read_zip(data, source) if data[:2] == b"PK" else _read_legacy(data, source)


def _source(path: Path) -> str:
    return escape_text(str(path))


def read_pth(path: str | os.PathLike[str]) -> Any:
    """The object a ``torch.save`` file holds, with every tensor as a NumPy array (no torch needed).

    Arrays built (expanded views included) and records decompressed are limited to ``MAX_INFLATION``
    times the file size plus ``INFLATION_SLACK``; ``load_checkpoint`` builds only the tensors it uses."""
    path = Path(path)
    source = _source(path)
    return _parse(_read_bytes(path, source), source).materialize()


# ---------------------------------------------------------------------------------------------
# The two key layouts
# ---------------------------------------------------------------------------------------------

_BN_FIELDS = ("weight", "bias", "running_mean", "running_var")
_BACKBONE_KERNEL = 3  # both families use 3x3 convs in every backbone block
_IGNORED_SUFFIXES = (".num_batches_tracked",)
_IGNORED_KEYS = ("global_step",)
_WRAPPER_KEYS = ("model_state", "state_dict", "model")


@dataclass(frozen=True)
class _Names:
    markers: tuple[str, ...]        # key prefixes that identify the layout
    pfn: str                        # key of the PFN weight
    pfn_bn: str
    pfn_kernel: tuple[int, ...]     # trailing weight dims: Linear () or Conv1d (1,)
    block: str                      # module list of block i, formatted with i
    first_conv: int                 # module index of conv 0 in a block (OpenPCDet has a ZeroPad2d first)
    deblock: str
    heads: tuple[str, str, str]     # class, box, direction convs


_LAYOUTS: dict[str, _Names] = {
    "openpcdet": _Names(
        markers=("vfe.", "backbone_2d.", "dense_head."),
        pfn="vfe.pfn_layers.0.linear.weight", pfn_bn="vfe.pfn_layers.0.norm", pfn_kernel=(),
        block="backbone_2d.blocks.{i}", first_conv=1, deblock="backbone_2d.deblocks.{i}",
        heads=("dense_head.conv_cls", "dense_head.conv_box", "dense_head.conv_dir_cls"),
    ),
    "zhulf0804": _Names(
        markers=("pillar_encoder.", "backbone.", "neck.", "head."),
        pfn="pillar_encoder.conv.weight", pfn_bn="pillar_encoder.bn", pfn_kernel=(1,),
        block="backbone.multi_blocks.{i}", first_conv=0, deblock="neck.decoder_blocks.{i}",
        heads=("head.conv_cls", "head.conv_reg", "head.conv_dir_cls"),
    ),
}


@dataclass(frozen=True)
class _ConvPlan:
    weight: str
    shape: tuple[int, ...]
    bn: str
    bn_channels: int
    stride: int


@dataclass(frozen=True)
class _Plan:
    """Where every weight of a config lives in one layout, and its shape."""

    pfn: _ConvPlan
    blocks: tuple[tuple[_ConvPlan, ...], ...]
    deblocks: tuple[_ConvPlan, ...]
    heads: tuple[tuple[str, tuple[int, ...]], ...]   # (key prefix, weight shape): class, box, direction

    def keys(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for conv in (self.pfn, *(c for block in self.blocks for c in block), *self.deblocks):
            out[conv.weight] = conv.shape
            out.update({f"{conv.bn}.{f}": (conv.bn_channels,) for f in _BN_FIELDS})
        for prefix, shape in self.heads:
            out[f"{prefix}.weight"] = shape
            out[f"{prefix}.bias"] = shape[:1]
        return out


def _plan(layout: str, cfg: ModelConfig) -> _Plan:
    if layout not in _LAYOUTS:
        raise CheckpointError(f"unknown layout {layout!r}: expected one of {sorted(_LAYOUTS)}")
    names, net = _LAYOUTS[layout], cfg.network
    pfn = _ConvPlan(names.pfn, (net.pfn_channels, cfg.features.channels, *names.pfn_kernel),
                    names.pfn_bn, net.pfn_channels, 1)
    blocks, c_in, k = [], net.pfn_channels, _BACKBONE_KERNEL
    for i, (extra, stride, c_out) in enumerate(zip(net.layer_nums, net.layer_strides, net.block_channels)):
        prefix = names.block.format(i=i)
        index = [names.first_conv + 3 * j for j in range(extra + 1)]  # (conv, BN, ReLU) triplets
        blocks.append(tuple(
            _ConvPlan(f"{prefix}.{m}.weight", (c_out, c_in if j == 0 else c_out, k, k), f"{prefix}.{m + 1}",
                      c_out, stride if j == 0 else 1)
            for j, m in enumerate(index)
        ))
        c_in = c_out
    deblocks = tuple(
        _ConvPlan(f"{names.deblock.format(i=i)}.0.weight", (c_in, c_out, s, s), f"{names.deblock.format(i=i)}.1",
                  c_out, s)
        for i, (c_in, s, c_out) in enumerate(zip(net.block_channels, net.upsample_kernels, net.upsample_channels))
    )
    heads = tuple((prefix, (cfg.head_channels[role], net.head_in_channels, 1, 1))
                  for role, prefix in zip(("cls", "box", "dir"), names.heads))
    return _Plan(pfn, tuple(blocks), deblocks, heads)


def expected_keys(layout: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight key the layout stores for this config, with its shape (BN step counters excluded)."""
    if cfg.heads is not None and layout == "openpcdet":
        return multihead.expected_keys(cfg)
    return _plan(layout, cfg).keys()


def _ignored(key: Any) -> bool:
    return isinstance(key, str) and (key in _IGNORED_KEYS or key.endswith(_IGNORED_SUFFIXES))


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {tuple(value.shape)}"
    if isinstance(value, _TensorRef):  # a tensor not built because its shape or dtype is wrong
        return f"{np.dtype(value.storage.dtype).name} {short_repr(value.size)}"
    if isinstance(value, _StorageRef):
        return "bare storage"
    return escape_text(type(value).__name__, 40)


def _listing(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def _check_state_dict(state: Mapping[Any, Any], expected: dict[str, tuple[int, ...]],
                      what: str, source: str) -> None:
    missing = [k for k in expected if k not in state]
    unexpected = [_key_text(k) for k in state if k not in expected and not _ignored(k)]
    wrong = [
        f"{k}: got {_describe(state[k])}, expected float {expected[k]}"
        for k in expected
        if k in state and not (isinstance(state[k], np.ndarray) and state[k].dtype.kind == "f"
                               and state[k].shape == expected[k])
    ]
    if missing or unexpected or wrong:
        lines = [f"{source}: state dict does not match {what} ({len(missing)} missing, "
                 f"{len(unexpected)} unexpected, {len(wrong)} with a wrong shape or dtype)"]
        lines += [f"  {title}: {_listing(items)}" for title, items in
                  (("missing", missing), ("unexpected", unexpected), ("wrong shape or dtype", wrong)) if items]
        raise CheckpointError("\n".join(lines))


def _check_finite(state: Mapping[str, Any], keys: Mapping[str, Any], source: str) -> None:
    """NaN or inf in any weight makes every score NaN: the detector would return no boxes, silently."""
    bad = []
    for key in keys:
        count = int(np.size(state[key]) - np.count_nonzero(np.isfinite(state[key])))
        if count:
            bad.append(f"{key} ({count} of {np.size(state[key])} values)")
    if bad:
        raise CheckpointError(f"{source}: non-finite weights (NaN or inf) in {len(bad)} tensor"
                              f"{'s' if len(bad) > 1 else ''}: {_listing(bad, 5)}")


def weights_from_state_dict(state_dict: Mapping[str, Any], layout: str, cfg: ModelConfig, *,
                            source: str = "state dict") -> PointPillarsWeights | multihead.MultiHeadWeights:
    """Map a state dict of either layout onto ``PointPillarsWeights`` (``MultiHeadWeights`` for a
    multi-head config) after checking every key and shape."""
    def get(key: str) -> np.ndarray:
        return np.array(state_dict[key], dtype=np.float32, order="C")

    if cfg.heads is not None and layout == "openpcdet":
        keys = multihead.expected_keys(cfg)
        labels = multihead.label_keys(cfg)
        _check_state_dict({k: v for k, v in state_dict.items() if k not in labels}, keys,
                          f"the {layout} multi-head layout of config {cfg.name}", source)
        multihead.check_label_indices(state_dict, cfg, source)
        _check_finite(state_dict, keys, source)
        return multihead.weights_from_state_dict(get, cfg)
    plan = _plan(layout, cfg)
    _check_state_dict(state_dict, plan.keys(), f"the {layout} layout of config {cfg.name}", source)

    def conv_bn(conv: _ConvPlan) -> ConvBN:
        return ConvBN(get(conv.weight), BatchNorm(*(get(f"{conv.bn}.{f}") for f in _BN_FIELDS)), conv.stride)

    _check_finite(state_dict, plan.keys(), source)
    cls, box, direction = (Conv1x1(get(f"{prefix}.weight"), get(f"{prefix}.bias")) for prefix, _ in plan.heads)
    pfn = conv_bn(plan.pfn)
    return PointPillarsWeights(
        pfn_linear=pfn.weight.reshape(plan.pfn.shape[:2]),  # zhulf0804's Conv1d (64, C, 1) is a linear map
        pfn_bn=pfn.bn,
        blocks=tuple(tuple(conv_bn(c) for c in block) for block in plan.blocks),
        deblocks=tuple(conv_bn(c) for c in plan.deblocks),
        head_cls=cls,
        head_box=box,
        head_dir=direction,
    )


def _layout_of(state: Mapping[Any, Any]) -> str | None:
    hits = {name: sum(isinstance(k, str) and k.startswith(n.markers) for k in state) for name, n in _LAYOUTS.items()}
    best = max(hits, key=lambda name: hits[name])
    return best if hits[best] > 0 else None


def detect_layout(obj: Any, source: str = "checkpoint") -> tuple[Layout, dict[str, Any]]:
    """(layout, state dict) of a loaded checkpoint: a bare state dict or one wrapped in
    ``model_state`` (OpenPCDet), ``state_dict`` or ``model``."""
    if not isinstance(obj, dict):
        held = "tensor" if isinstance(obj, _TensorRef) else escape_text(type(obj).__name__, 40)
        raise CheckpointError(f"{source}: the file holds a {held}, expected a state dict "
                              "or a dict holding one")
    candidates = [obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), dict)] + [obj]
    for state in candidates:
        layout = _layout_of(state)
        if layout is not None:
            return layout, state  # type: ignore[return-value]
    markers = "; ".join(f"{name}: {', '.join(n.markers)}" for name, n in _LAYOUTS.items())
    raise CheckpointError(f"{source}: unknown checkpoint layout: top-level keys "
                          f"[{_listing([_key_text(k) for k in obj])}] have no known prefix ({markers})")


def _builtin_config(layout: str, state: Mapping[Any, Any]) -> str:
    """The built-in config of a layout, told apart by keys: multi-head OpenPCDet models have per-head keys."""
    if layout == "openpcdet" and any(isinstance(k, str) and k.startswith(multihead.HEAD_KEY) for k in state):
        return MULTIHEAD_CONFIG
    return LAYOUT_CONFIGS[layout]


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: Path
    layout: Layout
    config_name: str
    weights: PointPillarsWeights | multihead.MultiHeadWeights
    sha256: str
    config: ModelConfig


def load_checkpoint(path: str | os.PathLike[str], config: ModelConfig | str | None = None) -> LoadedCheckpoint:
    """Read a ``.pth`` of either family and check it against ``config`` (default: the layout's built-in one)."""
    path = Path(path)
    source = _source(path)
    data = _read_bytes(path, source)
    parsed = _parse(data, source)
    layout, state = detect_layout(parsed.obj, source)
    if config is None:
        config = _builtin_config(layout, state)
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    if cfg.family != layout:
        raise CheckpointError(f"{source}: checkpoint has the {layout} layout, but config {cfg.name} "
                              f"is for the {cfg.family} family")
    # Build only the tensors the layout uses, and only once their shape and dtype match the config:
    # the rest (optimizer state, step counters, wrong or expanded views) is never materialised.
    expected = expected_keys(layout, cfg)
    used = {k: parsed.tensor(v, counted=False)
            if isinstance(v, _TensorRef) and v.size == expected.get(k) and np.dtype(v.storage.dtype).kind == "f"
            else v for k, v in state.items() if isinstance(k, str) and k in expected}
    if cfg.heads is not None:  # the heads' small int64 class-id buffers, checked against the config
        used.update({k: parsed.tensor(v, counted=False) for k, v in state.items()
                     if k in multihead.label_keys(cfg) and isinstance(v, _TensorRef) and len(v.size) == 1
                     and v.size[0] <= cfg.num_classes})
    state = {**state, **used}
    weights = weights_from_state_dict(state, layout, cfg, source=source)
    return LoadedCheckpoint(path, layout, cfg.name, weights, hashlib.sha256(data).hexdigest(), cfg)
