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
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from ..config import ModelConfig, load_config
from ..errors import CheckpointError
from .weights import BatchNorm, Conv1x1, ConvBN, PointPillarsWeights

Layout = Literal["openpcdet", "zhulf0804"]
LAYOUT_CONFIGS: dict[str, str] = {"openpcdet": "openpcdet_kitti_3class", "zhulf0804": "zhulf0804_kitti_3class"}

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


# Everything the unpickler hands to the pickle machine is an immutable NamedTuple (or the builtin
# OrderedDict type), so a crafted BUILD opcode cannot alter this module's state.
class _StorageType(NamedTuple):
    dtype: str


class _StorageRef(NamedTuple):
    key: str
    dtype: str
    numel: int


class _TensorRef(NamedTuple):
    storage: _StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Rebuild(NamedTuple):
    fn: Callable[..., _TensorRef]

    def __call__(self, *args: Any) -> _TensorRef:
        return self.fn(*args)


class _Malformed(ValueError):
    """A record that unpickled but does not describe a tensor; reported with the file name."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and value >= 0


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_grad_hooks_metadata: Any) -> _TensorRef:
    shape_ok = (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
                and all(_is_count(v) for v in size + stride))
    if not (isinstance(storage, _StorageRef) and _is_count(offset) and shape_ok):
        raise _Malformed(f"bad tensor record (offset {offset!r:.40}, size {size!r:.60}, stride {stride!r:.60})")
    return _TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_grad_hooks: Any) -> _TensorRef:
    if not isinstance(data, _TensorRef):
        raise _Malformed("a Parameter record that does not hold a tensor")
    return data


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _Rebuild(_rebuild_tensor),
    ("torch._utils", "_rebuild_parameter"): _Rebuild(_rebuild_parameter),
    **{("torch", name): _StorageType(code) for name, code in _STORAGE_DTYPES.items()},
}


class _Unpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; records every storage the pickle refers to."""

    def __init__(self, file: io.BytesIO, source: str) -> None:
        super().__init__(file)
        self.source = source
        self.storages: dict[str, _StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise CheckpointError(
                f"{self.source}: refusing to load global '{module}.{name}': a checkpoint may name only "
                "tensors, torch storage types and OrderedDict (plain pickle would run this)"
            )
        return found

    def persistent_load(self, pid: Any) -> _StorageRef:
        # zip: ('storage', type, key, location, numel); legacy adds a view record, None since torch 0.4.
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise _Malformed(f"unsupported persistent id {pid!r:.80}")
        _, storage_type, key, _location, numel, *view = pid
        if view and view[0] is not None:
            raise _Malformed("storage views (files from torch < 0.4) are not supported")
        if not (isinstance(storage_type, _StorageType) and isinstance(key, str) and _is_count(numel)):
            raise _Malformed(f"bad storage record {pid!r:.80}")
        ref = _StorageRef(key, storage_type.dtype, numel)
        if self.storages.setdefault(key, ref) != ref:
            raise _Malformed(f"storage {key!r} is referenced with two types or sizes")
        return ref


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


@contextmanager
def _reading(source: str, problem: str) -> Iterator[None]:
    """Turn whatever a damaged file makes zipfile / pickle / NumPy raise into one CheckpointError line."""
    try:
        yield
    except CheckpointError:
        raise
    except _Malformed as exc:
        raise CheckpointError(f"{source}: {problem}: {exc}") from None
    except Exception as exc:  # corrupt input can surface as almost any exception type
        raise CheckpointError(f"{source}: {problem} ({_one_line(exc)})") from None


def _unpickle(file: io.BytesIO, source: str, what: str) -> tuple[Any, dict[str, _StorageRef]]:
    unpickler = _Unpickler(file, source)
    with _reading(source, f"{what} is truncated or corrupt"):
        obj = unpickler.load()
    return obj, unpickler.storages


def _read_zip(data: bytes, source: str) -> Any:
    with _reading(source, "truncated or corrupt zip archive"):
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = set(archive.namelist())
    pickles = sorted(n for n in names if n.endswith("/data.pkl") and n.count("/") == 1)
    if len(pickles) != 1:
        raise CheckpointError(f"{source}: zip archive is not a torch checkpoint: expected one "
                              f"'<folder>/data.pkl', found {len(pickles)}")
    prefix = pickles[0][: -len("data.pkl")]
    with _reading(source, f"cannot read {pickles[0]}"):
        obj, refs = _unpickle(io.BytesIO(archive.read(pickles[0])), source, pickles[0])
        byteorder = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in names else "little"
    if byteorder not in ("little", "big"):
        raise CheckpointError(f"{source}: unknown byteorder record {byteorder!r:.20}")
    storages: dict[str, bytes] = {}
    for key, ref in refs.items():
        name = f"{prefix}data/{key}"
        with _reading(source, f"cannot read storage record {name}"):
            raw = archive.read(name)
        expected = ref.numel * np.dtype(ref.dtype).itemsize
        if len(raw) != expected:
            raise CheckpointError(f"{source}: storage record {name} has {len(raw)} bytes, "
                                  f"expected {expected} ({ref.numel} x {ref.dtype})")
        storages[key] = raw
    return _materialize(obj, storages, byteorder, source)


def _read_legacy(data: bytes, source: str) -> Any:
    stream = io.BytesIO(data)
    not_torch = f"{source}: not a torch checkpoint (neither a zip archive nor a legacy torch pickle stream)"
    try:
        magic = _Unpickler(stream, source).load()
    except Exception:  # any failure here means the bytes are not a legacy stream at all
        raise CheckpointError(not_torch) from None
    if not (isinstance(magic, int) and magic == _LEGACY_MAGIC):
        raise CheckpointError(not_torch)
    protocol, _ = _unpickle(stream, source, "legacy header")
    if protocol != _LEGACY_PROTOCOL:
        raise CheckpointError(f"{source}: legacy protocol version {protocol!r:.20}, expected {_LEGACY_PROTOCOL}")
    _unpickle(stream, source, "legacy sys-info record")
    obj, refs = _unpickle(stream, source, "main pickle")
    keys, _ = _unpickle(stream, source, "storage key list")
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise CheckpointError(f"{source}: storage key list is not a list of strings")
    # Storage payloads follow: per key an int64 element count, then the raw bytes, always little-endian.
    pos, view, storages = stream.tell(), memoryview(data), {}
    for key in keys:
        ref = refs.get(key)
        if ref is None:
            raise CheckpointError(f"{source}: storage {key!r} is listed but no tensor uses it")
        count = int.from_bytes(data[pos:pos + 8], "little", signed=True)
        nbytes = count * np.dtype(ref.dtype).itemsize
        if pos + 8 > len(data) or count != ref.numel or pos + 8 + nbytes > len(data):
            raise CheckpointError(f"{source}: storage {key!r} is truncated or corrupt: needs {ref.numel} "
                                  f"x {ref.dtype} at byte {pos}, file has {len(data)} bytes")
        storages[key] = view[pos + 8:pos + 8 + nbytes]
        pos += 8 + nbytes
    return _materialize(obj, storages, "little", source)


def _tensor(ref: _TensorRef, storages: Mapping[str, bytes | memoryview], byteorder: str) -> np.ndarray:
    raw = storages.get(ref.storage.key)
    if raw is None:
        raise _Malformed(f"storage {ref.storage.key!r} has no data")
    dtype = np.dtype(ref.storage.dtype).newbyteorder("<" if byteorder == "little" else ">")
    native = dtype.newbyteorder("=")
    if 0 in ref.size:
        return np.zeros(ref.size, dtype=native)
    base = np.frombuffer(raw, dtype=dtype)
    last = ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride))
    if last >= base.size:
        raise _Malformed(f"a tensor of size {ref.size} reads element {last} of storage "
                         f"{ref.storage.key!r}, which has {base.size}")
    strides = tuple(s * dtype.itemsize for s in ref.stride)
    view = np.lib.stride_tricks.as_strided(base[ref.offset:], shape=ref.size, strides=strides, writeable=False)
    return np.array(view, dtype=native, order="C")


def _materialize(obj: Any, storages: Mapping[str, bytes | memoryview], byteorder: str, source: str) -> Any:
    """Replace tensor records by owned, C-contiguous arrays; shared and cyclic containers stay so."""
    done: dict[int, Any] = {}

    def walk(x: Any) -> Any:
        if id(x) in done:
            return done[id(x)]
        if isinstance(x, _TensorRef):
            out: Any = _tensor(x, storages, byteorder)
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

    with _reading(source, "cannot rebuild tensors"):
        return walk(obj)


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, expected a .pth file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint file not found") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or _one_line(exc)})") from None
    if not data:
        raise CheckpointError(f"{path}: empty file, expected a torch checkpoint")
    return data


def _parse(data: bytes, source: str) -> Any:
    return _read_zip(data, source) if data[:2] == b"PK" else _read_legacy(data, source)


def read_pth(path: str | os.PathLike[str]) -> Any:
    """The object a ``torch.save`` file holds, with every tensor as a NumPy array (no torch needed)."""
    path = Path(path)
    return _parse(_read_bytes(path), str(path))


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
        for i, (c_in, s, c_out) in enumerate(zip(net.block_channels, net.upsample_strides, net.upsample_channels))
    )
    heads = tuple((prefix, (cfg.head_channels[role], net.head_in_channels, 1, 1))
                  for role, prefix in zip(("cls", "box", "dir"), names.heads))
    return _Plan(pfn, tuple(blocks), deblocks, heads)


def expected_keys(layout: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight key the layout stores for this config, with its shape (BN step counters excluded)."""
    return _plan(layout, cfg).keys()


def _ignored(key: Any) -> bool:
    return isinstance(key, str) and (key in _IGNORED_KEYS or key.endswith(_IGNORED_SUFFIXES))


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def _listing(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def _check_state_dict(state: Mapping[Any, Any], expected: dict[str, tuple[int, ...]],
                      what: str, source: str) -> None:
    missing = [k for k in expected if k not in state]
    unexpected = [str(k) for k in state if k not in expected and not _ignored(k)]
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


def weights_from_state_dict(state_dict: Mapping[str, Any], layout: str, cfg: ModelConfig, *,
                            source: str = "state dict") -> PointPillarsWeights:
    """Map a state dict of either layout onto ``PointPillarsWeights`` after checking every key and shape."""
    plan = _plan(layout, cfg)
    _check_state_dict(state_dict, plan.keys(), f"the {layout} layout of config {cfg.name}", source)

    def get(key: str) -> np.ndarray:
        return np.array(state_dict[key], dtype=np.float32, order="C")

    def conv_bn(conv: _ConvPlan) -> ConvBN:
        return ConvBN(get(conv.weight), BatchNorm(*(get(f"{conv.bn}.{f}") for f in _BN_FIELDS)), conv.stride)

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
        raise CheckpointError(f"{source}: the file holds a {type(obj).__name__}, expected a state dict "
                              "or a dict holding one")
    candidates = [obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), dict)] + [obj]
    for state in candidates:
        layout = _layout_of(state)
        if layout is not None:
            return layout, state  # type: ignore[return-value]
    markers = "; ".join(f"{name}: {', '.join(n.markers)}" for name, n in _LAYOUTS.items())
    raise CheckpointError(f"{source}: unknown checkpoint layout: top-level keys "
                          f"[{_listing([str(k) for k in obj])}] have no known prefix ({markers})")


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: Path
    layout: Layout
    config_name: str
    weights: PointPillarsWeights
    sha256: str
    config: ModelConfig


def load_checkpoint(path: str | os.PathLike[str], config: ModelConfig | str | None = None) -> LoadedCheckpoint:
    """Read a ``.pth`` of either family and check it against ``config`` (default: the layout's built-in one)."""
    path = Path(path)
    data = _read_bytes(path)
    layout, state = detect_layout(_parse(data, str(path)), str(path))
    if config is None:
        config = LAYOUT_CONFIGS[layout]
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    if cfg.family != layout:
        raise CheckpointError(f"{path}: checkpoint has the {layout} layout, but config {cfg.name} "
                              f"is for the {cfg.family} family")
    weights = weights_from_state_dict(state, layout, cfg, source=str(path))
    return LoadedCheckpoint(path, layout, cfg.name, weights, hashlib.sha256(data).hexdigest(), cfg)
