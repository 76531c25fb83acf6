"""A minimal torch-free writer of torch's two ``.pth`` formats, for tests of the reader.

It lets tests make tiny, unusual (strided, shared, every dtype) and deliberately broken checkpoints
without torch. Where torch is installed, tests check that torch itself loads what this writes.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_STORAGE_NAMES = {
    "float32": "FloatStorage", "float16": "HalfStorage", "float64": "DoubleStorage",
    "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage", "int8": "CharStorage",
    "uint8": "ByteStorage", "bool": "BoolStorage",
}


def torch_global(module: str, name: str) -> type:
    """A stand-in that pickles as the global ``module.name`` (which need not be importable here)."""
    return type(name, (), {"pickle_global": (module, name)})


REBUILD_TENSOR = torch_global("torch._utils", "_rebuild_tensor_v2")
REBUILD_TENSOR_V3 = torch_global("torch._utils", "_rebuild_tensor_v3")
UNTYPED = "UntypedStorage"


@dataclass(eq=False)
class Storage:
    """One torch storage: a flat array whose bytes are written as one storage record, of the torch storage type
    ``torch_type`` (default: the one of the array's dtype; 'BFloat16Storage' for 16-bit words of bfloat16s; UNTYPED
    for the bytes of tensors whose element type is named, see ``Tensor.dtype``)."""

    array: np.ndarray
    key: str = ""
    torch_type: str = ""

    @property
    def numel(self) -> int:
        """The size torch records: elements, or bytes for an untyped storage."""
        return self.array.nbytes if self.torch_type == UNTYPED else self.array.size


@dataclass(eq=False)
class Tensor:
    """A tensor as torch pickles it: a view (offset, size, stride in elements) of a storage. With ``dtype`` (torch's
    name of an element type: 'uint16', 'float8_e4m3fn', ...), as torch >= 2.1 pickles a type that has no storage
    class: by ``_rebuild_tensor_v3``, of an untyped storage, the type named after the view."""

    storage: Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str = ""

    def __reduce__(self) -> tuple[Any, ...]:
        args: tuple[Any, ...] = (self.storage, self.offset, self.size, self.stride, False, OrderedDict())
        if self.dtype:
            return REBUILD_TENSOR_V3, args + (torch_global("torch", self.dtype),)
        return REBUILD_TENSOR, args


@dataclass(eq=False)
class Call:
    """Pickles as ``func(*args)``: how tests plant arbitrary globals in a checkpoint."""

    func: type
    args: tuple[Any, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return self.func, self.args


def tensor_of(array: np.ndarray, torch_type: str = "") -> Tensor:
    """A contiguous tensor of ``array``'s values with its own storage of ``torch_type`` (see ``Storage``)."""
    arr = np.array(array, order="C")  # keeps 0-d arrays 0-d
    stride = tuple(s // arr.itemsize for s in arr.strides)
    return Tensor(Storage(arr.reshape(-1), torch_type=torch_type), 0, arr.shape, stride)


def named_tensor_of(array: np.ndarray, dtype: str) -> Tensor:
    """A contiguous tensor of element type ``dtype`` (torch's name) holding ``array``'s bytes (its values, for a
    NumPy type of that name), with its own untyped storage: as torch >= 2.1 pickles a uint16 or float8 tensor."""
    return dataclasses.replace(tensor_of(array, UNTYPED), dtype=dtype)


def _as_tensors(obj: Any) -> Any:
    """Contiguous ndarrays become tensors with their own storage; containers are copied."""
    if isinstance(obj, np.ndarray):
        return tensor_of(obj)
    if isinstance(obj, dict):
        out: dict[Any, Any] = OrderedDict() if isinstance(obj, OrderedDict) else {}
        out.update((k, _as_tensors(v)) for k, v in obj.items())
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_as_tensors(v) for v in obj)
    return obj


_PurePickler: Any = pickle._Pickler  # type: ignore[attr-defined]  # its save_global can be overridden


class _Pickler(_PurePickler):
    def __init__(self, file: io.BytesIO, legacy: bool) -> None:
        super().__init__(file, protocol=2)
        self.legacy = legacy
        self.storages: list[Storage] = []

    def save_global(self, obj: Any, name: str | None = None) -> None:
        target = getattr(obj, "pickle_global", None)
        if target is None:
            super().save_global(obj, name)
            return
        self.write(pickle.GLOBAL + f"{target[0]}\n{target[1]}\n".encode())
        self.memoize(obj)

    def persistent_id(self, obj: Any) -> tuple[Any, ...] | None:
        if not isinstance(obj, Storage):
            return None
        if all(s is not obj for s in self.storages):
            obj.key = obj.key or str(len(self.storages))
            self.storages.append(obj)
        if obj.torch_type == UNTYPED:
            storage_type = torch_global("torch.storage", UNTYPED)
        else:
            storage_type = torch_global("torch", obj.torch_type or _STORAGE_NAMES[obj.array.dtype.name])
        pid = ("storage", storage_type, obj.key, "cpu", obj.numel)
        return pid + (None,) if self.legacy else pid


def pickle_torch(obj: Any, legacy: bool = False) -> tuple[bytes, list[Storage]]:
    """Protocol-2 pickle of ``obj`` with storages as persistent ids, as torch writes it."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, legacy)
    pickler.dump(_as_tensors(obj))
    return buffer.getvalue(), pickler.storages


def _le_bytes(array: np.ndarray) -> bytes:
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def write_zip(obj: Any, path: Path, top: str = "archive") -> Path:
    """torch >= 1.6 zip format: ``<top>/data.pkl``, ``<top>/data/<key>``, ``byteorder``, ``version``."""
    data, storages = pickle_torch(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{top}/data.pkl", data)
        archive.writestr(f"{top}/byteorder", "little")
        for storage in storages:
            archive.writestr(f"{top}/data/{storage.key}", _le_bytes(storage.array))
        archive.writestr(f"{top}/version", "3\n")
    return path


def write_legacy(obj: Any, path: Path) -> Path:
    """torch's legacy stream: magic, protocol, sys-info, main pickle, key list, then the storages."""
    out = io.BytesIO()
    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    for header in (LEGACY_MAGIC, 1001, sys_info):
        pickle.dump(header, out, protocol=2)
    data, storages = pickle_torch(obj, legacy=True)
    out.write(data)
    pickle.dump([s.key for s in storages], out, protocol=2)
    for storage in storages:
        out.write(np.int64(storage.numel).astype("<i8").tobytes())
        out.write(_le_bytes(storage.array))
    path.write_bytes(out.getvalue())
    return path


@dataclass
class RawEntry:
    """One zip record written verbatim: ``payload`` as stored (raw deflate data for ZIP_DEFLATED), with
    a declared uncompressed size and CRC that may lie (defaults: the truth for a stored record)."""

    name: str
    payload: bytes
    method: int = zipfile.ZIP_STORED
    file_size: int | None = None
    crc: int | None = None


def write_raw_zip(entries: list[RawEntry], path: Path) -> Path:
    """A zip archive built byte by byte, so tests can plant records zipfile would not write."""
    out, central = bytearray(), bytearray()
    for entry in entries:
        name = entry.name.encode()
        size = len(entry.payload) if entry.file_size is None else entry.file_size
        crc = zlib.crc32(entry.payload) if entry.crc is None else entry.crc
        fields = (entry.method, 0, 0x21, crc, len(entry.payload), size, len(name))
        central += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, *fields, 0, 0, 0, 0, 0, len(out)) + name
        out += struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, *fields, 0) + name + entry.payload
    eocd = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + eocd))
    return path


def deflated_zeros(mib: int) -> bytes:
    """Raw deflate data that inflates to ``mib`` MiB of zero bytes (about 1 KB per MiB): a zip bomb.
    After a full flush the compressor's output for the same input repeats, so one block is copied."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(1 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return block * mib + compressor.flush(zlib.Z_FINISH)


def zeros_crc(mib: int) -> int:
    """CRC-32 of ``mib`` MiB of zero bytes."""
    crc, block = 0, bytes(1 << 20)
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    return crc
