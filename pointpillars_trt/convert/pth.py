"""The safe reader of PyTorch ``.pth`` files: the object a ``torch.save`` file holds, without torch.

Why no torch: the runtime (TensorRT / ONNX Runtime) never needs it, and a multi-gigabyte dependency
only to read five million floats is a bad trade for a deployment package.

Why a restricted unpickler: a ``.pth`` file is a pickle, and a plain ``pickle.load`` (or ``torch.load``
without ``weights_only``) runs whatever code the file names. Here the file may name only tensors,
storage and element types and ``OrderedDict``; any other global is refused before it is looked up,
let alone called, and tensors are rebuilt by our own code from raw bytes.

Both torch formats are read: the zip archive (the default since torch 1.6; what zhulf0804 writes)
and the legacy stream of consecutive pickles (``_use_new_zipfile_serialization=False``; what
OpenPCDet writes).

Why limits everywhere: a checkpoint may come from anyone, and a few hundred bytes can otherwise ask
for gigabytes (expanded views, zip bombs, huge memo indices or byte counts) or block forever (a
FIFO). So only regular files up to ``MAX_CHECKPOINT_BYTES`` are read; each pickle's opcodes are
checked before it runs; zip records are refused on their declared size and never inflated past it;
every view must lie inside its storage; ``open_pth`` leaves tensors as references for the caller to
build (``checkpoint.py`` builds only those whose shapes match the config); ``read_pth`` builds at most
``MAX_INFLATION`` x the file size. Every failure is one ``CheckpointError`` line naming the file,
with untrusted values shown by ``pickled_repr`` (short, control characters escaped).
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..config import build_command, yaml_config_flag
from ..errors import CheckpointError, counted, escape_text, one_line, shell_word
from ..file_reads import no_wait_reader, path_argument
from ..model_dir import METADATA_FILE

# ---------------------------------------------------------------------------------------------
# Limits: what a file can legitimately hold (tiny hostile files must not exhaust memory)
# ---------------------------------------------------------------------------------------------

MAX_CHECKPOINT_BYTES = 2 * 1024**3  # larger files are refused with their size, before any read
MAX_PICKLE_BYTES = 64 * 1024**2     # one pickle (data.pkl, a legacy record): a state dict's is ~100 KB
MAX_PICKLE_OPCODES = 2_000_000      # ~40 per tensor record; bounds the objects a pickle can build
MAX_TUPLE_NESTING = 100             # hashing a deeper tuple recurses in C (a 1M-deep key crashes Python)
MAX_PICKLE_BUILDS = 256             # BUILD copies its state: many BUILDs of one big state are quadratic
#: Dict keys other than str and bytes (whose hashes are salted per process): numbers hash alike by design
#: (k * (2**61 - 1) all hash to 0), so a few hundred KB of them made one dict cost minutes inside the C
#: unpickler, deaf to signals. A checkpoint's are an optimizer's parameter indices: one per parameter.
MAX_PICKLE_PLAIN_KEYS = 4096
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
    if isinstance(value, TensorRef):
        return f"<tensor {value.storage.dtype} {_bounded_repr(value.size, depth, limit)}>"
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


def pickled_repr(value: Any, limit: int = 60) -> str:
    """A repr of an untrusted value from a checkpoint's pickle for one-line messages: at most ``limit``
    characters, control characters escaped, nested containers, tensors and huge ints abbreviated (never
    raises); ``errors.safe_repr`` is its counterpart for other untrusted values, which hold no tensors."""
    try:
        text = _bounded_repr(value, 3, limit)
    except Exception:  # e.g. RecursionError from a pathological object
        text = f"<{type(value).__name__}>"
    return escape_text(text, limit)


def key_text(key: Any) -> str:
    """A state-dict key as listed in messages, at most 100 characters: plain text for a string, else
    its short repr."""
    return escape_text(key, 100) if isinstance(key, str) else pickled_repr(key, 100)


# ---------------------------------------------------------------------------------------------
# Reading the two torch file formats
# ---------------------------------------------------------------------------------------------

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_BFLOAT16 = "bfloat16"  # the one element type read that NumPy has no type of
_STORAGE_DTYPES = {  # torch storage class -> its element type: NumPy's name of it, or _BFLOAT16
    "FloatStorage": "float32", "HalfStorage": "float16", "DoubleStorage": "float64", "BFloat16Storage": _BFLOAT16,
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool",
}
#: Element types torch (2.1 and later) pickles by name, beside an untyped storage of their bytes
#: (``_rebuild_tensor_v3``), having no storage class: those read, each NumPy's type of its name.
_NAMED_DTYPES = ("uint16", "uint32", "uint64")
#: ... and the families of those not read, by their names' starts: float8 and float4 have no NumPy type, bits* are
#: raw bits, complex32 is complex.
_UNREAD_NAMED_DTYPES = ("float8_", "float4_", "bits", "complex")
#: The tensor types read, as a refusal of another type lists them.
_READ_DTYPES = ", ".join([*_STORAGE_DTYPES.values(), *_NAMED_DTYPES])


def _stored_dtype(dtype: str) -> np.dtype[Any]:
    """The NumPy type of one element of a storage of ``dtype`` as the file holds it (byte order applied per file):
    a bfloat16 is a 16-bit word."""
    return np.dtype(np.uint16) if dtype == _BFLOAT16 else np.dtype(dtype)


def array_dtype(dtype: str) -> np.dtype[Any]:
    """The NumPy type of the arrays built from a storage of ``dtype``: float32 for bfloat16, which it holds exactly
    (a bfloat16 is the high half of a float32), so a model trained in bfloat16 loads with its very weights."""
    return np.dtype(np.float32) if dtype == _BFLOAT16 else np.dtype(dtype)


# Everything the unpickler hands to the pickle machine is an immutable NamedTuple, so a crafted
# BUILD opcode cannot alter this module's state.
class _StorageType(NamedTuple):
    dtype: str


class _TensorDtype(NamedTuple):
    dtype: str  # NumPy's name of an element type torch names (``torch.uint16``)


class StorageRef(NamedTuple):
    key: str
    dtype: str  # the element type, as in _STORAGE_DTYPES or _NAMED_DTYPES
    numel: int

    @property
    def nbytes(self) -> int:
        """The bytes the file holds."""
        return self.numel * _stored_dtype(self.dtype).itemsize


class TensorRef(NamedTuple):
    storage: StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """The bytes of the array built."""
        n = array_dtype(self.storage.dtype).itemsize
        for s in self.size:
            n *= s
        return n


class _Rebuild(NamedTuple):
    fn: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class _Malformed(ValueError):
    """A record that unpickled but does not describe a tensor; reported with the file name."""


class _NotAStateDict(_Malformed):
    """A whole pickle that is no damaged state dict but another kind of object; reported as what it is."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _INT64_LIMIT


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_grad_hooks_metadata: Any) -> TensorRef:
    record = f"(offset {pickled_repr(offset, 30)}, size {pickled_repr(size)}, stride {pickled_repr(stride)})"
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= MAX_DIMS):
        raise _Malformed(f"bad tensor record {record}")
    if any(isinstance(v, int) and v < 0 for v in stride):
        raise _Malformed(f"negative strides are not supported {record}")
    if not (isinstance(storage, StorageRef) and _is_count(offset) and all(_is_count(v) for v in size + stride)):
        raise _Malformed(f"bad tensor record {record}")
    if 0 not in size:  # the view's full extent: its last element must lie in the storage
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= storage.numel:
            raise _Malformed(f"a tensor of size {pickled_repr(size)} reads element {last} of storage "
                             f"{pickled_repr(storage.key)}, which has {storage.numel}")
    return TensorRef(storage, offset, size, stride)


def _rebuild_tensor_v3(storage: Any, offset: Any, size: Any, stride: Any, _requires_grad: Any, _hooks: Any,
                       dtype: Any, *_metadata: Any) -> TensorRef:
    """A tensor of an element type that has no storage class: its storage is untyped (bytes) and its type named
    apart; its offset, size and stride count elements of that type, so the storage must hold whole elements of it
    and is checked as a storage of them."""
    if not (isinstance(storage, StorageRef) and storage.dtype == "uint8" and isinstance(dtype, _TensorDtype)):
        raise _Malformed(f"bad tensor record (storage {pickled_repr(storage)}, element type {pickled_repr(dtype)})")
    itemsize = np.dtype(dtype.dtype).itemsize
    if storage.numel % itemsize:
        raise _Malformed(f"storage {pickled_repr(storage.key)} of {storage.numel} bytes holds no whole number of "
                         f"{dtype.dtype} ({itemsize} bytes each)")
    typed = storage._replace(dtype=dtype.dtype, numel=storage.numel // itemsize)
    return _rebuild_tensor(typed, offset, size, stride)


def _rebuild_parameter(data: Any, *_grad_hooks: Any) -> TensorRef:
    if not isinstance(data, TensorRef):
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
    ("torch._utils", "_rebuild_tensor_v3"): _Rebuild(_rebuild_tensor_v3),
    ("torch._utils", "_rebuild_parameter"): _Rebuild(_rebuild_parameter),
    **{("torch", name): _StorageType(code) for name, code in _STORAGE_DTYPES.items()},
    # The storage of the element types torch names (its bytes: torch reads it as uint8 where no type is named)
    ("torch.storage", "UntypedStorage"): _StorageType("uint8"),
    **{("torch", name): _TensorDtype(name) for name in _NAMED_DTYPES},
}

_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_TUPLES = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"})
#: Opcodes that push a str or bytes: hashes salted per process, so no file can make them collide.
_SALTED = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
                     "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})
_SALTED_ENTRY = -1  # a shadow-stack entry: a str or bytes (a tuple's depth is 1 or more, other objects 0)
#: Opcodes that hash what they pop into a dict or set, and where those keys lie among the popped entries
#: (SETITEM: dict, key, value; SETITEMS: key, value, ..., dict; DICT: key, value, ...; ADDITEMS: item, ..., set).
_HASHED = {"SETITEM": slice(1, 2), "SETITEMS": slice(0, -1, 2), "DICT": slice(0, None, 2),
           "ADDITEMS": slice(0, -1), "FROZENSET": slice(None)}


def _scan_pickle(stream: io.BytesIO) -> None:
    """Walk one pickle's opcodes before the C unpickler runs it, refusing what would make a small
    file cost a lot: memo indices beyond the opcodes seen (the C memo is an array sized by the
    largest index), byte counts beyond the data (``genops`` reads them from the stream and fails
    on a short read), tuples nested deeper than ``MAX_TUPLE_NESTING`` (tracked on a shadow stack,
    since tuples are immutable their depth is known when built), too many opcodes or BUILDs, and more than
    ``MAX_PICKLE_PLAIN_KEYS`` dict keys or set items that are no str or bytes (the shadow stack knows
    which are)."""
    start = stream.tell()
    stack: list[int] = []  # each stack entry's tuple nesting depth, or _SALTED_ENTRY
    marks: list[int] = []
    memo: dict[int, int] = {}
    builds = plain_keys = 0
    ops = pickletools.genops(stream)
    for count, (op, arg, pos) in enumerate(ops, 1):
        if count > MAX_PICKLE_OPCODES:
            raise _NotAStateDict(f"more than {MAX_PICKLE_OPCODES} pickle opcodes: a state dict of tensors takes a few "
                                 "thousand; this pickle holds its numbers as Python objects (lists, say), not tensors")
        name = op.name
        if name in _MEMO_PUTS or name == "MEMOIZE":
            index = len(memo) if name == "MEMOIZE" else arg
            if not (isinstance(index, int) and 0 <= index <= count):
                raise _Malformed(f"memo index {pickled_repr(index)} at byte {pos} is out of range "
                                 f"(the pickle has stored {len(memo)} objects so far)")
            if not stack:
                raise _Malformed(f"{name} at byte {pos} with an empty stack")
            memo[index] = stack[-1]
            continue
        if name in _MEMO_GETS:
            if arg not in memo:
                raise _Malformed(f"memo index {pickled_repr(arg)} at byte {pos} was never stored")
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
        keys = _HASHED.get(name)
        if keys is not None:
            plain_keys += sum(1 for key in popped[keys] if key != _SALTED_ENTRY)
            if plain_keys > MAX_PICKLE_PLAIN_KEYS:
                raise _Malformed(f"more than {MAX_PICKLE_PLAIN_KEYS} dict keys or set items that are not strings")
        if name in _TUPLES:
            depth = 1 + max((d for d in popped if d > 0), default=0)
            if depth > MAX_TUPLE_NESTING:
                raise _Malformed(f"tuples nested more than {MAX_TUPLE_NESTING} deep")
            stack.append(depth)
        elif name in _SALTED:
            stack.append(_SALTED_ENTRY)
        elif name == "DUP":
            stack += popped * 2
        else:
            stack += [0] * len(op.stack_after)
    stream.seek(start)


#: How torch pickles a quantized tensor: this global comes before its storage type (QInt8Storage, ...).
_QUANTIZED = ("torch._utils", "_rebuild_qtensor")


def _names_unread_tensors(module: str, name: str) -> bool:
    """Whether a global that is not allowed names a type of tensors this reader does not read (a storage class, an
    element type, the rebuild of quantized tensors) rather than anything plain pickle would run."""
    if (module, name) == _QUANTIZED:
        return True
    return module == "torch" and (name.endswith("Storage") or name.startswith(_UNREAD_NAMED_DTYPES))


def _unread_tensors(source: str, shown: str, name: str) -> CheckpointError:
    """The refusal of tensors of a type this reader does not read (complex, quantized, float8, ...: no hostile
    global), named by the global ``shown`` that names their type (``name`` without its module), with the save that
    gives a file it reads."""
    if name == _QUANTIZED[1] or name.startswith("Q"):
        fix = ("dequantize them to float32: torch.save({k: v.dequantize() if v.is_quantized else v "
               "for k, v in model.state_dict().items()}, 'model.pth')")
    elif name.lower().startswith("complex"):
        fix = ("a PointPillars has no complex weights: save its state dict alone, torch.save(model.state_dict(), "
               "'model.pth')")
    elif name.startswith(("bits", "float4_")):  # torch's .float() of these raises
        fix = ("torch converts packed bits to no number type: save the weights as float32 before packing them, "
               "torch.save(model.state_dict(), 'model.pth')")
    else:
        fix = ("save the weights as float32, e.g. torch.save({k: v.float() if v.is_floating_point() else v "
               "for k, v in model.state_dict().items()}, 'model.pth')")
    if name == _QUANTIZED[1]:
        what = f"quantized tensors ({shown})"
    else:
        what = f"tensors of {'storage' if name.endswith('Storage') else 'element'} type {shown}"
    return CheckpointError(f"{source}: holds {what}, which this reader does not read (it reads {_READ_DTYPES}): {fix}")


class _Unpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; records every storage the pickle refers to."""

    def __init__(self, file: io.BytesIO, source: str, max_storage_bytes: int) -> None:
        super().__init__(file)
        self.source = source
        self.max_storage_bytes = max_storage_bytes
        self.storages: dict[str, StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        shown = f"'{escape_text(str(module), 60)}.{escape_text(str(name), 60)}'"
        if found is None and _names_unread_tensors(str(module), str(name)):
            raise _unread_tensors(self.source, shown, str(name))
        if found is None:
            raise CheckpointError(
                f"{self.source}: refusing to load global {shown}: a checkpoint may name only tensors, torch storage "
                "and element types and OrderedDict (plain pickle would run this); for a model saved whole, save its "
                "state dict alone: torch.save(model.state_dict(), 'model.pth')"
            )
        return found

    def persistent_load(self, pid: Any) -> StorageRef:
        # zip: ('storage', type, key, location, numel); legacy adds a view record, None since torch 0.4.
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise _Malformed(f"unsupported persistent id {pickled_repr(pid, 80)}")
        _, storage_type, key, _location, numel, *view = pid
        if view and view[0] is not None:
            raise _Malformed("storage views (files from torch < 0.4) are not supported")
        if not (isinstance(storage_type, _StorageType) and isinstance(key, str) and _is_count(numel)):
            raise _Malformed(f"bad storage record {pickled_repr(pid, 80)}")
        ref = StorageRef(key, storage_type.dtype, numel)
        if ref.nbytes > self.max_storage_bytes:
            raise _Malformed(f"storage {pickled_repr(key)} declares {pickled_repr(numel)} x {ref.dtype} "
                             f"({pickled_repr(ref.nbytes)} bytes), "
                             f"more than this file can hold ({self.max_storage_bytes} bytes)")
        if self.storages.setdefault(key, ref) != ref:
            raise _Malformed(f"storage {pickled_repr(key)} is referenced with two types or sizes")
        return ref


@contextmanager
def _reading(source: str, problem: str) -> Iterator[None]:
    """Turn whatever a damaged file makes zipfile / pickle / NumPy raise into one CheckpointError line
    (RecursionError and MemoryError included)."""
    try:
        yield
    except CheckpointError:
        raise
    except _NotAStateDict as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    except _Malformed as exc:
        raise CheckpointError(f"{source}: {problem}: {exc}") from None
    except Exception as exc:  # corrupt input can surface as almost any exception type
        raise CheckpointError(f"{source}: {problem} ({one_line(exc, 200, typed=True)})") from None


@dataclass
class _Budget:
    """Bytes that may still be decompressed or materialised: ``MAX_INFLATION`` x file size + slack."""

    left: int
    total: int = field(init=False)

    def __post_init__(self) -> None:
        self.total = self.left

    def take(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            raise _Malformed(f"{what} needs {pickled_repr(nbytes)} bytes, more than a file of this size can "
                             f"legitimately hold (at most {self.total} bytes in all)")
        self.left -= nbytes


@dataclass
class _Parsed:
    """A checkpoint's object tree with tensors still as records; storages are read on demand."""

    obj: Any
    source: str
    byteorder: str
    budget: _Budget
    read_storage: Callable[[StorageRef], bytes | memoryview]
    _cache: dict[str, bytes | memoryview] = field(default_factory=dict)

    def storage(self, ref: StorageRef) -> bytes | memoryview:
        if ref.key not in self._cache:
            self._cache[ref.key] = self.read_storage(ref)
        return self._cache[ref.key]

    def tensor(self, ref: TensorRef, counted: bool = True) -> np.ndarray:
        """An owned, C-contiguous array; ``counted``: its bytes come out of the budget (not for
        tensors whose shape was checked against the config)."""
        with _reading(self.source, "cannot rebuild tensors"):
            if counted:
                self.budget.take(ref.nbytes, f"a tensor of size {pickled_repr(ref.size)}")
            return _tensor(ref, self.storage(ref.storage), self.byteorder)

    def materialize(self) -> Any:
        """Replace tensor records by owned, C-contiguous arrays; shared and cyclic containers stay so."""
        done: dict[int, Any] = {}

        def walk(x: Any) -> Any:
            if id(x) in done:
                return done[id(x)]
            if isinstance(x, TensorRef):
                out: Any = self.tensor(x)
            elif isinstance(x, StorageRef):
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


def _unpickle(stream: io.BytesIO, source: str, what: str, budget: _Budget) -> tuple[Any, dict[str, StorageRef]]:
    unpickler = _Unpickler(stream, source, budget.total)
    with _reading(source, f"{what} is truncated or corrupt"):
        _scan_pickle(stream)
        obj = unpickler.load()
    return obj, unpickler.storages


def _open_record(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
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
        raw = _open_record(archive, pickles[0], min(MAX_PICKLE_BYTES, budget.total))
        budget.take(len(raw), shown)
        obj, refs = _unpickle(io.BytesIO(raw), source, shown, budget)
    byteorder_raw = b"little"
    if prefix + "byteorder" in names:
        with _reading(source, f"cannot read {escape_text(prefix, 80)}byteorder"):
            byteorder_raw = _open_record(archive, prefix + "byteorder", _SMALL_RECORD_BYTES)
    byteorder = byteorder_raw.decode("ascii", "replace")
    if byteorder not in ("little", "big"):
        raise CheckpointError(f"{source}: unknown byteorder record {pickled_repr(byteorder, 20)}")
    # Check every storage record's declared size now (no decompression); read one when a tensor needs it.
    for ref in refs.values():
        name = f"{prefix}data/{ref.key}"
        with _reading(source, f"cannot read storage record {escape_text(name, 80)}"):
            info = archive.getinfo(name)
        if info.file_size != ref.nbytes:
            raise CheckpointError(f"{source}: storage record {escape_text(name, 80)} has {counted(info.file_size, 'byte')}, "
                                  f"expected {ref.nbytes} ({ref.numel} x {ref.dtype})")

    def read_storage(ref: StorageRef) -> bytes:
        name = f"{prefix}data/{ref.key}"
        with _reading(source, f"cannot read storage record {escape_text(name, 80)}"):
            budget.take(ref.nbytes, f"storage record {escape_text(name, 80)}")
            raw = _open_record(archive, name, ref.nbytes)
        if len(raw) != ref.nbytes:
            raise CheckpointError(f"{source}: storage record {escape_text(name, 80)} has {counted(len(raw), 'byte')}, "
                                  f"expected {ref.nbytes} ({ref.numel} x {ref.dtype})")
        return raw

    return _Parsed(obj, source, byteorder, budget, read_storage)


#: Files people export a PointPillars to, which a --model of theirs may name instead of its folder.
_MODEL_FILES = {".onnx": "an ONNX graph", ".plan": "a TensorRT plan", ".engine": "a TensorRT engine",
                ".trt": "a TensorRT engine"}


def _other_model_file(path: Path) -> str:
    """For a file named like an exported graph or engine, a model dir's record or a config: what to give instead (its
    model dir, or the .pth; the config beside it, with the flag that takes its kind of YAML)."""
    if path.name == METADATA_FILE:
        folder = os.path.dirname(_source(path)) or "."
        return (f"; it is named as a model dir's record: give the model dir that holds it ('{folder}'), the folder "
                "`pointpillars-trt build` writes")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        flag = yaml_config_flag(path)
        if flag == "--config":
            return (f"; it is one of this package's configs (family, voxel, ...), which goes beside the checkpoint "
                    f"as --config (its path, or a built-in config's name), not --pcdet-config: {build_command(None, None, config=str(path))} "
                    "(Python: config=PATH)")
        if flag == "--pcdet-config":
            return (f"; it is an OpenPCDet model config (MODEL, CLASS_NAMES, ...), which goes beside the checkpoint "
                    f"as --pcdet-config: {build_command(None, None, pcdet_config=path)} (Python: "
                    "convert.pcdet_config.config_from_pcdet_yaml)")
        return (f"; it is named as a YAML config, which goes beside the checkpoint: "
                f"{build_command(None, None, pcdet_config=path)} for an OpenPCDet model config (--config for one "
                "of this package's)")
    kind = _MODEL_FILES.get(suffix)
    if kind is None:
        return ""
    return (f"; it is named as {kind}: give the model dir that holds it (the folder `pointpillars-trt build` "
            "writes, with its model.json) or the .pth checkpoint it was exported from")


def _read_legacy_magic(stream: io.BytesIO, path: Path) -> None:
    """Read a legacy stream's first pickle, which must be its magic number: else the file (at ``path``) is no torch
    file."""
    source = _source(path)
    not_torch = f"{source}: not a torch checkpoint (neither a zip archive nor a legacy torch pickle stream)" + \
        _other_model_file(path)
    try:
        _scan_pickle(stream)
        magic = _Unpickler(stream, source, 0).load()
    except Exception:  # any failure here means the bytes are not a legacy stream at all
        raise CheckpointError(not_torch) from None
    if not (isinstance(magic, int) and magic == _LEGACY_MAGIC):
        raise CheckpointError(not_torch)


def _read_legacy(data: bytes, path: Path) -> _Parsed:
    source, stream = _source(path), io.BytesIO(data)
    budget = _Budget(MAX_INFLATION * len(data) + INFLATION_SLACK)
    _read_legacy_magic(stream, path)
    protocol, _ = _unpickle(stream, source, "legacy header", budget)
    if protocol != _LEGACY_PROTOCOL:
        raise CheckpointError(f"{source}: legacy protocol version {pickled_repr(protocol, 20)}, "
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
            raise CheckpointError(f"{source}: storage {pickled_repr(key)} is listed but no tensor uses it")
        count = int.from_bytes(data[pos:pos + 8], "little", signed=True)
        if pos + 8 > len(data) or count != ref.numel or pos + 8 + ref.nbytes > len(data):
            raise CheckpointError(f"{source}: storage {pickled_repr(key)} is truncated or corrupt: needs {ref.numel} "
                                  f"x {ref.dtype} at byte {pos}, file has {counted(len(data), 'byte')}")
        storages[key] = view[pos + 8:pos + 8 + ref.nbytes]
        pos += 8 + ref.nbytes

    def read_storage(ref: StorageRef) -> memoryview:
        if ref.key not in storages:
            raise _Malformed(f"storage {pickled_repr(ref.key)} has no data")
        return storages[ref.key]

    return _Parsed(obj, source, "little", budget, read_storage)


def _tensor(ref: TensorRef, raw: bytes | memoryview, byteorder: str) -> np.ndarray:
    dtype = _stored_dtype(ref.storage.dtype).newbyteorder("<" if byteorder == "little" else ">")
    built = array_dtype(ref.storage.dtype)
    if 0 in ref.size:
        return np.zeros(ref.size, dtype=built)
    base = np.frombuffer(raw, dtype=dtype)
    last = ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride))
    if last >= base.size:  # checked against the declared size already; this is the bytes actually read
        raise _Malformed(f"a tensor of size {pickled_repr(ref.size)} reads element {last} of storage "
                         f"{pickled_repr(ref.storage.key)}, which has {base.size}")
    strides = tuple(s * dtype.itemsize for s in ref.stride)
    view = np.lib.stride_tricks.as_strided(base[ref.offset:], shape=ref.size, strides=strides, writeable=False)
    if ref.storage.dtype == _BFLOAT16:
        return _bfloat16_to_float32(view)
    return np.array(view, dtype=built, order="C")


def _bfloat16_to_float32(words: np.ndarray) -> np.ndarray:
    """An owned, C-contiguous float32 array of bfloat16 ``words`` (any view, any byte order): each word is the high
    half of its float32, so the values are exact, NaN and infinity included."""
    out = np.empty(words.shape, dtype=np.float32)
    np.left_shift(words, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read_bytes(path: Path) -> bytes:
    """The file's bytes: a regular file (a FIFO or device would block or never end) of at most
    ``MAX_CHECKPOINT_BYTES``, checked before opening and again on the open descriptor."""
    source = _source(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            if os.path.isfile(os.path.join(path, METADATA_FILE)):
                raise CheckpointError(f"{source}: is a model dir (the folder `pointpillars-trt build` writes), not a "
                                      "checkpoint: run it with `pointpillars-trt infer PATH --model "
                                      f"{shell_word(os.fspath(path))}` (Python: PointPillars.from_model_dir), or give "
                                      "the .pth it was built from")
            raise CheckpointError(f"{source}: is a directory, expected a .pth file")
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{source}: is {_kind(info.st_mode)}, expected a regular .pth file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with no_wait_reader(fd) as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):  # replaced between stat and open
                raise CheckpointError(f"{source}: is {_kind(info.st_mode)}, expected a regular .pth file")
            if info.st_size > MAX_CHECKPOINT_BYTES:
                raise CheckpointError(f"{source}: file is {info.st_size} bytes, larger than the "
                                      f"{MAX_CHECKPOINT_BYTES}-byte limit for a checkpoint")
            _check_format(file.read(_HEAD_BYTES), path)
            file.seek(0)
            data = file.read(info.st_size)
            if file.read(1):
                raise CheckpointError(f"{source}: file grew while it was read")
    except FileNotFoundError:
        raise CheckpointError(f"{source}: checkpoint file not found") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc, 200, typed=True)
        raise CheckpointError(f"{source}: cannot read ({reason})") from None
    except MemoryError:
        raise CheckpointError(f"{source}: not enough memory to read {info.st_size} bytes") from None
    return data


#: Bytes of a file's start that tell its format: a legacy stream's first pickle (its magic number) takes 16 of them
#: in torch's pickle protocol, and under 40 in any.
_HEAD_BYTES = 4096


def _check_format(head: bytes, path: Path) -> None:
    """Refuse, from its first bytes (``head``), a file that is neither torch format, before the rest is read: a
    gigabyte of anything else would be read whole first."""
    if not head:
        raise CheckpointError(f"{_source(path)}: empty file, expected a torch checkpoint")
    if not _is_zip(head):
        _read_legacy_magic(io.BytesIO(head), path)


def _is_zip(data: bytes) -> bool:
    """Whether ``data`` starts as a zip archive (torch's format since 1.6) does."""
    return data[:2] == b"PK"


def _parse(data: bytes, path: Path) -> _Parsed:
    return _read_zip(data, _source(path)) if _is_zip(data) else _read_legacy(data, path)


def _source(path: Path) -> str:
    """``path`` as the messages of its read name it."""
    return escape_text(str(path))


def checkpoint_path(path: object) -> Path:
    """The path of a ``.pth`` an API was given, or CheckpointError saying what to pass (``path_argument``)."""
    return path_argument(path, "checkpoint", CheckpointError, "the .pth file's path (a str or pathlib.Path)")


def read_pth(path: str | os.PathLike[str]) -> Any:
    """The object a ``torch.save`` file holds, with every tensor as a NumPy array (no torch needed; a bfloat16 one
    as the float32 array of its values, NumPy having no bfloat16).

    Arrays built (expanded views included) and records decompressed are limited to ``MAX_INFLATION``
    times the file size plus ``INFLATION_SLACK``; ``load_checkpoint`` builds only the tensors it uses."""
    path = checkpoint_path(path)
    return _parse(_read_bytes(path), path).materialize()


@dataclass(frozen=True)
class PthFile:
    """A read ``.pth``: its object tree with tensors left as ``TensorRef`` records (``tensor`` builds
    one), the file's name as messages show it and the sha256 of its bytes."""

    source: str
    sha256: str
    parsed: _Parsed

    @property
    def obj(self) -> Any:
        return self.parsed.obj

    def tensor(self, ref: TensorRef) -> np.ndarray:
        """One tensor, outside the inflation budget: for tensors whose shape the caller has checked."""
        return self.parsed.tensor(ref, counted=False)


def open_pth(path: str | os.PathLike[str]) -> PthFile:
    """Read and parse a ``.pth`` without building its tensors."""
    path = checkpoint_path(path)
    data = _read_bytes(path)
    return PthFile(_source(path), hashlib.sha256(data).hexdigest(), _parse(data, path))
