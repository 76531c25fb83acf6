"""Checkpoints made to hurt (issue 9, items 1-4 and 6 as far as checkpoints go).

Every file here is crafted by the test itself and small on disk. Loads that could exhaust memory or
block run in a child process under ``RLIMIT_AS`` = 1 GiB and a 20 s timeout; the child reports a
``CheckpointError`` as one line and its peak RSS, and must print nothing on stderr (no traceback).
A MemoryError turned into a CheckpointError does not count as handled: the messages checked name
the real problem, found before any large allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import threading
import warnings
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _torch_writer import (LEGACY_MAGIC, REBUILD_TENSOR_V3, UNTYPED, Call, RawEntry, Storage, Tensor, deflated_zeros,
                           pickle_torch, torch_global, write_legacy, write_raw_zip, write_zip, zeros_crc)

from pointpillars_trt.apps.cli import main
from pointpillars_trt.convert import multihead, pth
from pointpillars_trt.convert.checkpoint import expected_keys, load_checkpoint, weights_from_state_dict
from pointpillars_trt.convert.pth import MAX_TUPLE_NESTING, read_pth, pickled_repr
from pointpillars_trt.config import ModelConfig, load_config
from pointpillars_trt.errors import CheckpointError

WRITERS = {"zip": write_zip, "legacy": write_legacy}
MEMORY_LIMIT = 1 << 30
MAX_RSS_KB = 400 * 1024  # a child that loads a small file stays far below this (about 70 MB)
HUGE = (1 << 16, 1 << 16)  # 16 GiB of float32 as a stride-0 view of one element

# The child: rlimit first, then the import and one call; one line per result on stdout.
CHILD = r"""
import dataclasses, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from pointpillars_trt.convert.checkpoint import load_checkpoint
from pointpillars_trt.convert.pth import read_pth
from pointpillars_trt.config import load_config
from pointpillars_trt.errors import CheckpointError
how, path = sys.argv[2], sys.argv[3]
try:
    if how == "read":
        read_pth(path)
    elif how == "load":
        load_checkpoint(path)
    else:
        cfg = load_config(how)
        net = dataclasses.replace(cfg.network, pfn_channels=8, layer_nums=(1, 2, 2), block_channels=(8, 16, 32),
                                  upsample_channels=(4, 4, 4))
        load_checkpoint(path, config=dataclasses.replace(cfg, name="small", network=net))
except CheckpointError as exc:
    print("CheckpointError: " + str(exc).replace("\n", "\\n"))
    code = 3
else:
    print("loaded")
    code = 0
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the (possibly large) parent across fork+exec
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]
print("maxrss_kb=%d" % int(peak))
sys.exit(code)
"""


@dataclasses.dataclass
class ChildResult:
    loaded: bool
    message: str  # the CheckpointError's text, newlines shown as \n
    maxrss_kb: int


def run_child(how: str, path: Path, repo_root: Path) -> ChildResult:
    """Load ``path`` in a fresh interpreter under the memory limit: ``how`` is read / load / a config
    name (loaded as the small variant of that config)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(MEMORY_LIMIT), how, str(path)], cwd=repo_root,
                             env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path.name} took more than 20 s")
    lines = out.stdout.splitlines()
    assert out.stderr == "", f"the child wrote to stderr (traceback?):\n{out.stderr[-3000:]}"
    assert out.returncode in (0, 3) and len(lines) == 2 and lines[1].startswith("maxrss_kb="), out
    result = ChildResult(out.returncode == 0, lines[0].removeprefix("CheckpointError: "), int(lines[1][10:]))
    assert result.maxrss_kb < MAX_RSS_KB, f"peak RSS {result.maxrss_kb} kB: {result.message}"
    return result


def refused(how: str, path: Path, repo_root: Path, *words: str) -> str:
    """The child fails with a one-line CheckpointError naming the file and the words, not MemoryError."""
    result = run_child(how, path, repo_root)
    assert not result.loaded, f"{path.name} loaded"
    assert str(path) in result.message and "MemoryError" not in result.message, result.message
    for word in words:
        assert word in result.message, result.message
    return result.message


def checkpoint_error(fn: Any, *words: str) -> str:
    """In-process: a one-line CheckpointError with the words, no raw control characters, no cause."""
    with pytest.raises(CheckpointError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg and "\x1b" not in msg and info.value.__cause__ is None, repr(msg)
    for word in words:
        assert word in msg, msg
    return msg


def small_config(cfg: ModelConfig) -> ModelConfig:  # the same as CHILD's
    net = dataclasses.replace(cfg.network, pfn_channels=8, layer_nums=(1, 2, 2), block_channels=(8, 16, 32),
                              upsample_channels=(4, 4, 4))
    return dataclasses.replace(cfg, name="small", network=net)


def small_state(layout: str, cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of the small config, with BatchNorm variances >= 0 as training leaves them."""
    rng = np.random.default_rng(seed)
    shapes = expected_keys(layout, small_config(cfg))
    state = {k: rng.normal(size=shape).astype(np.float32) for k, shape in shapes.items()}
    return {k: np.abs(v) if k.endswith(".running_var") else v for k, v in state.items()}


def huge_view(storage: Storage) -> Tensor:
    return Tensor(storage, 0, HUGE, (0, 0))


def legacy_stream(main_pickle: bytes, keys: list[str] | None = None) -> bytes:
    """A legacy file around a hand-made main pickle (magic, protocol, sys info, main, key list)."""
    headers = b"".join(pickle.dumps(h, protocol=2) for h in (LEGACY_MAGIC, 1001, {"little_endian": True}))
    return headers + main_pickle + pickle.dumps(keys or [], protocol=2)


def write_pickle(data: bytes, fmt: str, path: Path) -> Path:
    """``data`` as the (only) pickle of a checkpoint: zip data.pkl or the legacy main pickle."""
    if fmt == "zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", data)
            archive.writestr("archive/byteorder", "little")
    else:
        path.write_bytes(legacy_stream(data))
    return path


def binunicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


# --- 1. memory: a small file cannot make the reader allocate much -----------------------------------


@pytest.mark.parametrize("fmt", WRITERS)
def test_expanded_views_the_layout_does_not_use_cost_nothing(fmt: str, openpcdet_cfg: ModelConfig,
                                                             tmp_path: Path, repo_root: Path) -> None:
    """40 stride-0 views of one element (16 GiB each) in the optimizer state: never built."""
    one = Storage(np.ones(1, np.float32))
    obj = {"model_state": small_state("openpcdet", openpcdet_cfg),
           "optimizer_state": {f"exp_avg_{i}": huge_view(one) for i in range(40)}, "epoch": 3}
    path = WRITERS[fmt](obj, tmp_path / "expanded.pth")
    assert path.stat().st_size < 200_000
    assert run_child("openpcdet_kitti_3class", path, repo_root).loaded


def test_expanded_views_in_ignored_keys_cost_nothing(zhulf_cfg: ModelConfig, tmp_path: Path,
                                                     repo_root: Path) -> None:
    one = Storage(np.zeros(1, np.int64))
    state: dict[str, Any] = dict(small_state("zhulf0804", zhulf_cfg))
    state.update({f"extra.{i}.num_batches_tracked": huge_view(one) for i in range(3)})
    path = write_zip(state, tmp_path / "expanded.pth")
    assert run_child("zhulf0804_kitti_3class", path, repo_root).loaded


@pytest.mark.parametrize("fmt", WRITERS)
def test_expanded_view_in_a_used_key_of_the_wrong_shape_is_not_built(fmt: str, zhulf_cfg: ModelConfig,
                                                                     tmp_path: Path, repo_root: Path) -> None:
    state: dict[str, Any] = dict(small_state("zhulf0804", zhulf_cfg))
    state["head.conv_cls.weight"] = huge_view(Storage(np.ones(1, np.float32)))
    path = WRITERS[fmt](state, tmp_path / "expanded.pth")
    refused("zhulf0804_kitti_3class", path, repo_root, "wrong shape", "head.conv_cls.weight: got float32 (65536, 65536)")


@pytest.mark.parametrize("fmt", WRITERS)
def test_read_pth_refuses_expanded_views_beyond_what_the_file_can_hold(fmt: str, tmp_path: Path,
                                                                       repo_root: Path) -> None:
    """The 761-byte file of the issue: three stride-0 views of a one-element storage."""
    one = Storage(np.ones(1, np.float32))
    path = WRITERS[fmt]({f"w{i}": Tensor(one, 0, (1 << 15, 1 << 15), (0, 0)) for i in range(3)},
                        tmp_path / "expanded.pth")
    assert path.stat().st_size < 2000
    refused("read", path, repo_root, "more than a file of this size can legitimately hold")


@pytest.mark.parametrize("fmt", WRITERS)
def test_small_expanded_views_still_read(fmt: str, tmp_path: Path) -> None:
    storage = Storage(np.arange(4, dtype=np.float32))
    got = read_pth(WRITERS[fmt]({"e": Tensor(storage, 1, (100, 2), (0, 1))}, tmp_path / "t.pth"))
    assert got["e"].shape == (100, 2) and np.array_equal(got["e"], np.tile([1.0, 2.0], (100, 1)))


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("view, words", [
    ((0, (3, 2), (1, 4)), ("reads element 6 of storage", "which has 6")),
    ((5, (2,), (-1,)), ("negative strides",)),
    ((0, (2,) * 65, (1,) * 65), ("bad tensor record",)),
])
def test_every_view_is_checked_even_unused(fmt: str, view: tuple[Any, ...], words: tuple[str, ...],
                                           openpcdet_cfg: ModelConfig, tmp_path: Path) -> None:
    obj = {"model_state": small_state("openpcdet", openpcdet_cfg),
           "optimizer_state": {"m": Tensor(Storage(np.zeros(6, np.float32)), *view)}}
    path = WRITERS[fmt](obj, tmp_path / "view.pth")
    checkpoint_error(lambda: load_checkpoint(path, config=small_config(openpcdet_cfg)), str(path), *words)


def untyped(nbytes: int) -> Storage:
    return Storage(np.zeros(nbytes, np.uint8), torch_type=UNTYPED)


def rebuild_v3(storage: Storage, dtype: Any) -> Call:
    """A one-element tensor record as torch >= 2.1 pickles one of a named type, with ``dtype`` in the type's place."""
    return Call(REBUILD_TENSOR_V3, (storage, 0, (1,), (1,), False, OrderedDict(), dtype))


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("record, words", [
    (Tensor(untyped(12), 1, (3,), (1,), "uint32"), ("reads element 3 of storage", "which has 3")),
    (Tensor(untyped(12), 0, (2, 2), (5, 1), "uint16"), ("reads element 6 of storage", "which has 6")),
    (Tensor(untyped(6), 0, (1,), (1,), "uint32"), ("storage '0' of 6 bytes holds no whole number of uint32 "
                                                   "(4 bytes each)",)),
    (Tensor(untyped(12), 5, (2,), (-1,), "uint16"), ("negative strides",)),
    (Tensor(untyped(16), 0, (10**5000,), (1,), "uint64"), ("bad tensor record",)),
    (Tensor(Storage(np.zeros(3, np.float32)), 0, (3,), (1,), "uint16"), ("bad tensor record",)),
    (rebuild_v3(untyped(2), "uint16"), ("bad tensor record",)),
    (rebuild_v3(untyped(4), torch_global("torch", "FloatStorage")), ("bad tensor record",)),
    (rebuild_v3(untyped(4), torch_global("torch", "load")), ("refusing to load global 'torch.load'",)),
], ids=["past-end", "past-end-2d", "partial-element", "negative-stride", "huge-size", "typed-storage",
        "type-as-text", "type-a-storage", "type-a-function"])
def test_tensor_records_of_a_named_type_are_checked_like_any(fmt: str, record: Any, words: tuple[str, ...],
                                                             tmp_path: Path) -> None:
    """A tensor of a type torch names (_rebuild_tensor_v3: uint16, ...) is checked as any other: its view counted in
    elements of that type must lie inside its untyped storage, which holds whole elements; the type is one torch
    names, and nothing else can stand in its place."""
    path = WRITERS[fmt]({"w": record, "b": np.ones(2, np.float32)}, tmp_path / "v3.pth")
    msg = checkpoint_error(lambda: read_pth(path), str(path), *words)
    assert "_rebuild_tensor_v3" not in msg


@pytest.mark.parametrize("fmt", WRITERS)
def test_read_pth_refuses_expanded_views_of_a_named_type(fmt: str, tmp_path: Path, repo_root: Path) -> None:
    """Stride-0 views of one uint64 (8 GiB each): refused on the file's size like any expanded view."""
    one = Storage(np.ones(1, np.uint64), torch_type=UNTYPED)
    path = WRITERS[fmt]({f"w{i}": Tensor(one, 0, (1 << 15, 1 << 15), (0, 0), "uint64") for i in range(3)},
                        tmp_path / "expanded.pth")
    assert path.stat().st_size < 2000
    refused("read", path, repo_root, "more than a file of this size can legitimately hold")


def torch_zip(byteorder: RawEntry | None = None, storage: RawEntry | None = None) -> list[RawEntry]:
    """A zip checkpoint {"w": one float32} with the given records in place of the honest ones."""
    data, _ = pickle_torch({"w": np.ones(1, np.float32)})
    return [RawEntry("archive/data.pkl", data), byteorder or RawEntry("archive/byteorder", b"little"),
            storage or RawEntry("archive/data/0", np.ones(1, "<f4").tobytes())]


BOMB_MIB = 512  # inflates 512 MiB from about 530 KB


def test_zip_bomb_in_the_byteorder_record(tmp_path: Path, repo_root: Path) -> None:
    bomb = RawEntry("archive/byteorder", deflated_zeros(BOMB_MIB), zipfile.ZIP_DEFLATED, BOMB_MIB << 20, 0)
    path = write_raw_zip(torch_zip(byteorder=bomb), tmp_path / "bomb.pth")
    assert path.stat().st_size < 600_000
    refused("read", path, repo_root, "archive/byteorder declares 536870912 bytes")


def test_zip_bomb_in_the_byteorder_record_with_a_lying_size(tmp_path: Path, repo_root: Path) -> None:
    bomb = RawEntry("archive/byteorder", deflated_zeros(BOMB_MIB), zipfile.ZIP_DEFLATED, 6, 0)
    refused("read", write_raw_zip(torch_zip(byteorder=bomb), tmp_path / "bomb.pth"), repo_root, "byteorder")


def test_zip_bomb_in_a_one_element_storage(tmp_path: Path, repo_root: Path) -> None:
    bomb = RawEntry("archive/data/0", deflated_zeros(BOMB_MIB), zipfile.ZIP_DEFLATED, BOMB_MIB << 20,
                    zeros_crc(BOMB_MIB))
    path = write_raw_zip(torch_zip(storage=bomb), tmp_path / "bomb.pth")
    refused("read", path, repo_root, "archive/data/0 has 536870912 bytes, expected 4")


def test_zip_bomb_in_a_storage_that_claims_its_true_size_is_read_no_further(tmp_path: Path,
                                                                           repo_root: Path) -> None:
    """The record says 4 bytes (and the CRC of 4 zero bytes): 4 bytes is all that is inflated."""
    bomb = RawEntry("archive/data/0", deflated_zeros(BOMB_MIB), zipfile.ZIP_DEFLATED, 4, zlib.crc32(bytes(4)))
    path = write_raw_zip(torch_zip(storage=bomb), tmp_path / "bomb.pth")
    assert run_child("read", path, repo_root).loaded
    got = read_pth(path)
    assert list(got) == ["w"] and np.array_equal(got["w"], np.zeros(1, np.float32))


def test_zip_records_with_other_compression_are_refused(tmp_path: Path) -> None:
    storage = RawEntry("archive/data/0", b"BZh9" + bytes(20), zipfile.ZIP_BZIP2, 4)
    path = write_raw_zip(torch_zip(storage=storage), tmp_path / "bz.pth")
    checkpoint_error(lambda: read_pth(path), str(path), "compression method 12")


MEMO_BOMB = b"\x80\x02}r" + struct.pack("<I", 200_000_000) + b"."  # LONG_BINPUT 2e8: a 1.6 GB memo


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("data, words", [
    (MEMO_BOMB, ("memo index 200000000", "out of range")),
    (b"\x80\x02}q\x05.", ("memo index 5", "out of range")),  # BINPUT past the puts so far
    (b"\x80\x02]h\x07.", ("memo index 7", "never stored")),  # BINGET
    (b"\x80\x02]j" + struct.pack("<I", 10**9) + b".", ("memo index 1000000000", "never stored")),  # LONG_BINGET
    (b"\x80\x03B" + struct.pack("<I", 0xFFFFFFF0) + b"x.", ("4294967280 bytes",)),  # BINBYTES: 4 GB buffer
    (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"x.", ("1099511627776 bytes",)),  # BINBYTES8
    (b"\x80\x02X" + struct.pack("<I", 0xFFFFFFF0) + b"x.", ("4294967280 bytes",)),  # BINUNICODE
], ids=["long-binput-2e8", "binput", "binget", "long-binget", "binbytes", "binbytes8", "binunicode"])
def test_memo_indices_and_byte_counts_beyond_the_file(fmt: str, data: bytes, words: tuple[str, ...],
                                                      tmp_path: Path, repo_root: Path) -> None:
    path = write_pickle(data, fmt, tmp_path / "memo.pth")
    assert path.stat().st_size < 1000
    refused("read", path, repo_root, *words)


def test_pickle_opcode_and_build_limits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_zip({f"k{i}": i for i in range(50)}, tmp_path / "many.pth")
    monkeypatch.setattr(pth, "MAX_PICKLE_OPCODES", 60)
    checkpoint_error(lambda: read_pth(path), "more than 60 pickle opcodes: a state dict of tensors takes a few "
                     "thousand; this pickle holds its numbers as Python objects (lists, say), not tensors")
    monkeypatch.undo()
    # BUILD repeated on one OrderedDict with one memoised state: each copies the state
    body = b"\x80\x02ccollections\nOrderedDict\n)R}q\x00(K\x01K\x02u" + b"h\x00b" * 300 + b"."
    path = write_pickle(body, "zip", tmp_path / "builds.pth")
    checkpoint_error(lambda: read_pth(path), "more than 256 BUILD opcodes")


def test_ordered_dict_with_arguments_is_refused(tmp_path: Path) -> None:
    """OrderedDict(big memoised dict) repeated would copy it each time: torch only calls OrderedDict()."""
    body = b"\x80\x02ccollections\nOrderedDict\n}q\x00(K\x01K\x02u\x85R."
    path = write_pickle(body, "zip", tmp_path / "od.pth")
    checkpoint_error(lambda: read_pth(path), "OrderedDict(...) with arguments")


# --- 2. one line, never a traceback, never raw control characters ----------------------------------


@pytest.mark.parametrize("fmt", WRITERS)
def test_5000_digit_int_key(fmt: str, tmp_path: Path, zhulf_cfg: ModelConfig) -> None:
    path = WRITERS[fmt]({10**5000: 1, "other": 2}, tmp_path / "int.pth")
    checkpoint_error(lambda: load_checkpoint(path), str(path), "unknown checkpoint layout", "<16610-bit int>, other")
    state: dict[Any, Any] = dict(small_state("zhulf0804", zhulf_cfg))
    state[10**5000] = 1
    path = WRITERS[fmt](state, tmp_path / "int2.pth")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "  unexpected: <16610-bit int>" in str(info.value).splitlines()


def deep_tuple_key(depth: int) -> bytes:
    return b"\x80\x02}K\x01" + b"\x85" * depth + b"K\x01s."  # {((...(1,)...),): 1}


@pytest.mark.parametrize("fmt", WRITERS)
def test_100k_deep_tuple_key(fmt: str, tmp_path: Path) -> None:
    path = write_pickle(deep_tuple_key(100_000), fmt, tmp_path / "deep.pth")
    checkpoint_error(lambda: load_checkpoint(path), str(path), f"tuples nested more than {MAX_TUPLE_NESTING} deep")
    path = write_pickle(deep_tuple_key(MAX_TUPLE_NESTING - 1), fmt, tmp_path / "ok.pth")
    checkpoint_error(lambda: load_checkpoint(path), str(path), "unknown checkpoint layout", "((((")


def colliding_keys(count: int, opcode: bytes) -> bytes:
    """A pickle of ``count`` ints k * (2**61 - 1), which all hash to 0, as one dict's keys (SETITEMS or
    protocol 0's DICT) or one set's items (ADDITEMS): inserting them is quadratic in ``count``."""
    def long1(value: int) -> bytes:
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw

    keys = b"".join(long1(k * (2**61 - 1)) + (b"N" if opcode != b"\x90" else b"") for k in range(1, count + 1))
    if opcode == b"\x90":  # ADDITEMS
        return b"\x80\x04\x8f(" + keys + b"\x90."
    if opcode == b"d":  # DICT
        return b"\x80\x02(" + keys + b"d."
    return b"\x80\x02}(" + keys + b"u."


@pytest.mark.parametrize("opcode", [b"u", b"d", b"\x90"], ids=["SETITEMS", "DICT", "ADDITEMS"])
def test_dict_keys_that_all_hash_alike_are_refused_before_they_are_hashed(opcode: bytes, tmp_path: Path) -> None:
    """40,000 int keys that all hash to 0 (a 500 KB file) took 30 s to unpickle, 1M took hours, deaf to
    SIGTERM; more than MAX_PICKLE_PLAIN_KEYS keys that are no strings are refused by the opcode scan,
    fewer load (an optimizer's parameter indices)."""
    import time

    path = write_pickle(colliding_keys(40_000, opcode), "zip", tmp_path / "collide.pth")
    start = time.perf_counter()
    checkpoint_error(lambda: read_pth(path), str(path), f"more than {pth.MAX_PICKLE_PLAIN_KEYS} dict keys or set "
                     "items that are not strings")
    assert time.perf_counter() - start < 2.0
    path = write_pickle(colliding_keys(200, opcode), "zip", tmp_path / "few.pth")
    found = read_pth(path)
    assert len(found) == 200 and {hash(k) for k in found} == {0}


def test_million_deep_tuple_key_does_not_crash_python(tmp_path: Path, repo_root: Path) -> None:
    """Hashing a 1M-deep tuple overflows the C stack (segfault) before any RecursionError."""
    path = write_pickle(deep_tuple_key(1_000_000), "zip", tmp_path / "deeper.pth")
    refused("load", path, repo_root, "nested more than")


@pytest.mark.parametrize("fmt", WRITERS)
def test_100k_deep_list_value(fmt: str, tmp_path: Path) -> None:
    body = b"\x80\x02}X\x01\x00\x00\x00x" + b"]" * 100_000 + b"a" * 99_999 + b"s."
    path = write_pickle(body, fmt, tmp_path / "deep.pth")
    checkpoint_error(lambda: read_pth(path), str(path), "RecursionError")
    checkpoint_error(lambda: load_checkpoint(path), str(path), "unknown checkpoint layout")


def fake_storage(numel: int) -> Storage:
    """A storage whose persistent id declares ``numel`` elements (its bytes are written by hand)."""
    return Storage(SimpleNamespace(size=numel, dtype=np.dtype("float32")))  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", WRITERS)
def test_5000_digit_numel(fmt: str, tmp_path: Path) -> None:
    storage = fake_storage(10**5000)
    data, _ = pickle_torch({"w": Tensor(storage, 0, (1,), (1,))}, legacy=fmt == "legacy")
    path = tmp_path / "numel.pth"
    if fmt == "zip":
        write_raw_zip([RawEntry("archive/data.pkl", data), RawEntry("archive/data/0", bytes(4))], path)
    else:
        path.write_bytes(legacy_stream(data, ["0"]) + struct.pack("<q", 1) + bytes(4))
    checkpoint_error(lambda: read_pth(path), str(path), "bad storage record", "<16610-bit int>")


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("offset, size, stride", [
    (0, (10**5000,), (1,)), (10**5000, (1,), (1,)), (0, (1,), (10**5000,)), (0, (2**63,), (0,)),
], ids=["size", "offset", "stride", "size-2**63"])
def test_5000_digit_sizes(fmt: str, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                          tmp_path: Path) -> None:
    path = WRITERS[fmt]({"w": Tensor(Storage(np.zeros(4, np.float32)), offset, size, stride)}, tmp_path / "size.pth")
    msg = checkpoint_error(lambda: read_pth(path), str(path), "bad tensor record")
    assert "ValueError" not in msg and len(msg) < len(str(path)) + 300


def test_control_characters_in_a_global_name(tmp_path: Path) -> None:
    evil = torch_global("os\x1b[2J", "system\x1b]0;pwned\x07")
    path = write_zip({"w": evil}, tmp_path / "esc.pth")
    msg = checkpoint_error(lambda: read_pth(path), "refusing", "'os\\x1b[2J.system\\x1b]0;pwned\\x07'")
    assert "\x07" not in msg
    # STACK_GLOBAL (protocol 4) names may hold newlines too
    body = b"\x80\x04" + binunicode("os\nfake line") + binunicode("sys\x1b[31m" + "m" * 500) + b"\x93."
    path = write_pickle(body, "zip", tmp_path / "nl.pth")
    msg = checkpoint_error(lambda: read_pth(path), "refusing", "'os\\nfake line.sys\\x1b[31mmmm")
    assert len(msg) < len(str(path)) + 400  # the names cut to 60 characters each, then the fix


@pytest.mark.parametrize("fmt", WRITERS)
def test_control_characters_in_keys(fmt: str, tmp_path: Path, zhulf_cfg: ModelConfig) -> None:
    path = WRITERS[fmt]({"\x1b[2Jgone\nfake: line": 1, "k" * 5000: 2}, tmp_path / "keys.pth")
    msg = checkpoint_error(lambda: load_checkpoint(path), "unknown checkpoint layout", "\\x1b[2Jgone\\nfake: line")
    assert len(msg) < 1000
    state: dict[str, Any] = dict(small_state("zhulf0804", zhulf_cfg))
    state["head.\x1b[31mred\r"] = np.zeros(1, np.float32)
    path = WRITERS[fmt](state, tmp_path / "keys2.pth")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "\x1b" not in str(info.value) and "\r" not in str(info.value)
    assert "  unexpected: head.\\x1b[31mred\\r" in str(info.value).splitlines()


def test_control_characters_in_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "evil\x1b[31m\nname.pth"
    path.write_bytes(b"not a checkpoint")
    checkpoint_error(lambda: load_checkpoint(path), "evil\\x1b[31m\\nname.pth", "not a torch checkpoint")


def test_pickled_repr() -> None:
    assert pickled_repr(10**5000) == "<16610-bit int>"
    assert pickled_repr("a\x1b[2J\n") == "'a\\x1b[2J\\n'"
    assert pickled_repr((1, 2)) == "(1, 2)" and pickled_repr((1,)) == "(1,)"
    assert len(pickled_repr("x" * 10_000)) == 60 and pickled_repr("x" * 10_000).endswith("...")
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    assert pickled_repr(deep) == "[[[[...]]]]"
    assert pickled_repr(list(range(100))) == "[0, 1, 2, 3, 4, 5, 6, 7, ...]"


# --- 3. only regular files, and not too large ---------------------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path: Path, repo_root: Path) -> None:
    fifo = tmp_path / "pipe.pth"
    os.mkfifo(fifo)
    refused("load", fifo, repo_root, "is a FIFO (named pipe)")
    refused("read", fifo, repo_root, "is a FIFO (named pipe)")


def test_fifo_refused_in_process_quickly(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.pth"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_checkpoint(fifo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock the reader so that the test process can end
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(10)
        pytest.fail("loading a FIFO blocked")
    assert isinstance(outcome[0], CheckpointError) and "is a FIFO (named pipe)" in str(outcome[0]), outcome


def test_character_device_is_refused() -> None:
    checkpoint_error(lambda: load_checkpoint("/dev/null"), "/dev/null: is a character device")


def test_file_larger_than_the_cap_is_refused_with_its_size(tmp_path: Path, repo_root: Path) -> None:
    path = tmp_path / "huge.pth"
    with open(path, "wb") as f:  # sparse: no disk space used
        f.truncate(pth.MAX_CHECKPOINT_BYTES + 1)
    refused("load", path, repo_root, f"file is {pth.MAX_CHECKPOINT_BYTES + 1} bytes",
            f"{pth.MAX_CHECKPOINT_BYTES}-byte limit")


def test_a_gigabyte_that_is_no_checkpoint_is_refused_from_its_first_bytes(tmp_path: Path, repo_root: Path) -> None:
    """1 GiB of zeros (neither torch format) was read whole before its format was looked at (1.1 GB peak RSS: past
    the child's limit); its first bytes say what it is not."""
    path = tmp_path / "zeros.pth"
    with open(path, "wb") as f:  # sparse: no disk space used
        f.truncate(1 << 30)
    refused("load", path, repo_root, "not a torch checkpoint (neither a zip archive nor a legacy torch pickle stream)")


def test_size_cap_is_a_module_constant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_zip({"w": np.zeros(100, np.float32)}, tmp_path / "t.pth")
    monkeypatch.setattr(pth, "MAX_CHECKPOINT_BYTES", 100)
    checkpoint_error(lambda: read_pth(path), str(path), "larger than the 100-byte limit")


# --- 4. non-finite weights, and BatchNorms that fold into NaN / inf -----------------------------------


@pytest.mark.parametrize("fmt", WRITERS)
def test_non_finite_weights_are_refused_with_their_keys(fmt: str, zhulf_cfg: ModelConfig, tmp_path: Path) -> None:
    state = small_state("zhulf0804", zhulf_cfg)
    state["head.conv_cls.weight"][0, 0, 0, 0] = np.nan
    state["backbone.multi_blocks.1.1.running_var"][:3] = np.inf
    path = WRITERS[fmt](state, tmp_path / "nan.pth")
    checkpoint_error(lambda: load_checkpoint(path, config=small_config(zhulf_cfg)), str(path),
                     "non-finite weights (NaN or inf) in 2 tensors",
                     "backbone.multi_blocks.1.1.running_var (3 of 16 values)", "head.conv_cls.weight (1 of")
    checkpoint_error(lambda: weights_from_state_dict(state, "zhulf0804", small_config(zhulf_cfg), source="mine"),
                     "mine: non-finite")


@pytest.mark.parametrize("fmt", WRITERS)
def test_float64_weights_beyond_float32_are_refused_with_their_keys(fmt: str, zhulf_cfg: ModelConfig,
                                                                   tmp_path: Path) -> None:
    """1e300 is finite in a float64 tensor but inf once cast to float32: refused at load time, with no raw
    numpy "overflow encountered in cast" warning; the head and the PFN are not covered by the BatchNorm check."""
    state: dict[str, np.ndarray] = small_state("zhulf0804", zhulf_cfg)
    for key in ("head.conv_reg.bias", "pillar_encoder.conv.weight"):
        state[key] = state[key].astype(np.float64)
    state["head.conv_reg.bias"][2] = -1e300
    state["pillar_encoder.conv.weight"][0, 0, 0] = 1e39
    path = WRITERS[fmt](state, tmp_path / "big.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        msg = checkpoint_error(lambda: load_checkpoint(path, config=small_config(zhulf_cfg)))
    assert msg == (f"{path}: weights beyond float32's range (+-3.4e+38) in 2 tensors: pillar_encoder.conv.weight "
                   "(values up to 1e+39), head.conv_reg.bias (values up to 1e+300)"), msg
    state["head.conv_cls.weight"][0, 0, 0, 0] = np.nan  # both kinds in one error
    checkpoint_error(lambda: weights_from_state_dict(state, "zhulf0804", small_config(zhulf_cfg), source="mine"),
                     "mine: non-finite weights (NaN or inf) in 1 tensor: head.conv_cls.weight (1 of",
                     "; weights beyond float32's range (+-3.4e+38) in 2 tensors: ")


def test_float64_weights_within_float32_load(zhulf_cfg: ModelConfig, tmp_path: Path) -> None:
    state = {k: v.astype(np.float64) for k, v in small_state("zhulf0804", zhulf_cfg).items()}
    state["head.conv_reg.bias"][0] = 3e38
    weights = load_checkpoint(write_zip(state, tmp_path / "f64.pth"), config=small_config(zhulf_cfg)).weights
    assert weights.head_box.bias[0] == np.float32(3e38)


@pytest.mark.parametrize("fmt", WRITERS)
def test_negative_batchnorm_variance_is_refused_with_its_key(fmt: str, zhulf_cfg: ModelConfig, tmp_path: Path) -> None:
    """sqrt(running_var + eps) of a negative variance is NaN: the model would build and find nothing, silently."""
    state = small_state("zhulf0804", zhulf_cfg)
    state["backbone.multi_blocks.1.1.running_var"][[0, 5]] = -0.25  # -0.25 + eps 0.001 < 0
    path = WRITERS[fmt](state, tmp_path / "negvar.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "invalid value encountered in sqrt" must not leak
        msg = checkpoint_error(lambda: load_checkpoint(path, config=small_config(zhulf_cfg)))
    assert msg == (f"{path}: backbone.multi_blocks.1.1.running_var has 2 negative values (of 16): "
                   "a BatchNorm variance cannot be negative; is the checkpoint damaged?")


def test_negative_variance_below_eps_is_refused_too(openpcdet_cfg: ModelConfig) -> None:
    """-1e-4 + eps 1e-3 folds without a NaN, but no BatchNorm ever measured a negative variance."""
    state = small_state("openpcdet", openpcdet_cfg)
    state["vfe.pfn_layers.0.norm.running_var"][3] = -1e-4
    checkpoint_error(lambda: weights_from_state_dict(state, "openpcdet", small_config(openpcdet_cfg), source="mine"),
                     "mine: vfe.pfn_layers.0.norm.running_var has 1 negative value (of 8): ")


def test_negative_variance_in_a_multihead_middle_batchnorm(tmp_path: Path) -> None:
    """The multi-head layout is checked the same way, its heads' BatchNorms included."""
    cfg = load_config("openpcdet_nuscenes_multihead")
    rng = np.random.default_rng(0)
    state: dict[str, np.ndarray] = {k: rng.uniform(0.5, 1.5, shape).astype(np.float32)
                                    for k, shape in multihead.expected_keys(cfg).items()}
    state.update({k: np.asarray(ids, np.int64) for k, ids in multihead.label_keys(cfg).items()})
    key = f"{multihead.HEAD_KEY}2.conv_box.conv_reg.1.running_var"
    assert key in state
    state[key][7] = -1.0
    checkpoint_error(lambda: weights_from_state_dict(state, "openpcdet", cfg, source="nus.pth"),
                     f"nus.pth: {key} has 1 negative value (of {state[key].size}): a BatchNorm variance cannot be")


def test_batchnorm_that_folds_beyond_float32_is_refused(zhulf_cfg: ModelConfig) -> None:
    """gamma / sqrt(var + eps) with gamma near float32's max and var 0 is finite in the file, inf once folded."""
    state = small_state("zhulf0804", zhulf_cfg)
    state["neck.decoder_blocks.2.1.weight"][1] = 3e38
    state["neck.decoder_blocks.2.1.running_var"][1] = 0.0
    # a ConvTranspose2d stores (Cin, Cout, k, k): output channel 1 is column 1
    expected = 3e38 / math.sqrt(0.0 + 1e-3) * float(np.abs(state["neck.decoder_blocks.2.0.weight"][:, 1]).max())
    msg = checkpoint_error(lambda: weights_from_state_dict(state, "zhulf0804", small_config(zhulf_cfg), source="big"))
    assert msg.startswith("big: neck.decoder_blocks.2.1 folded into neck.decoder_blocks.2.0.weight "
                          "(weight / sqrt(running_var + 0.001)) gives values up to "), msg
    assert msg.endswith(f"{expected:.3g}, beyond float32; is the checkpoint damaged?"), msg


def fold_fits_float32(state: dict[str, np.ndarray], conv: str, bn: str, out_axis: int, eps: float) -> bool:
    """The oracle: the folded weight (weight x scale along its output channels), in float64, within float32."""
    scale = state[f"{bn}.weight"].astype(np.float64) / np.sqrt(state[f"{bn}.running_var"].astype(np.float64) + eps)
    shape = [1] * state[conv].ndim
    shape[out_axis] = -1
    return bool(np.all(np.abs(state[conv].astype(np.float64) * scale.reshape(shape)) <= np.finfo(np.float32).max))


@pytest.mark.parametrize("conv, bn, out_axis", [
    ("backbone.multi_blocks.1.0.weight", "backbone.multi_blocks.1.1", 0),  # Conv2d (Cout, Cin, k, k)
    ("neck.decoder_blocks.2.0.weight", "neck.decoder_blocks.2.1", 1),     # ConvTranspose2d (Cin, Cout, k, k)
])
def test_batchnorm_fold_is_checked_channel_by_channel(zhulf_cfg: ModelConfig, conv: str, bn: str,
                                                      out_axis: int) -> None:
    """A large scale on output channel 0 and a large weight on channel 1 fold within float32 (the product of
    the two maxima, 1e40, is no value of the folded weight): accepted. The large weight in channel 0's
    slice (along the conv's output axis) folds beyond float32: refused."""
    state = small_state("zhulf0804", zhulf_cfg)
    state[f"{bn}.weight"][0], state[f"{bn}.running_var"][0] = 1e36, 1.0  # scale 1e36 on output channel 0
    state[f"{bn}.running_mean"][0] = 0.0
    elsewhere = (1, 0) if out_axis == 0 else (0, 1)  # output channel 1 (input 0 / 1): the other axis' index 0
    state[conv][elsewhere] = 1e4
    assert fold_fits_float32(state, conv, bn, out_axis, 1e-3)
    weights_from_state_dict(state, "zhulf0804", small_config(zhulf_cfg), source="fine")
    state[conv][elsewhere[::-1]] = 1e4  # now in output channel 0 too
    assert not fold_fits_float32(state, conv, bn, out_axis, 1e-3)
    expected = 1e36 / math.sqrt(1.0 + 1e-3) * 1e4
    checkpoint_error(lambda: weights_from_state_dict(state, "zhulf0804", small_config(zhulf_cfg), source="big"),
                     f"big: {bn} folded into {conv} (weight / sqrt(running_var + 0.001)) gives values up to "
                     f"{expected:.3g}, beyond float32; is the checkpoint damaged?")


def test_multihead_neck_folds_are_checked_along_their_output_axis() -> None:
    """The nuScenes neck: deblock 0 a strided Conv2d (Cout 128, Cin 64), deblock 1 a ConvTranspose2d of 128 in
    and 128 out: either read along the other axis would refuse these weights, whose folds fit float32."""
    cfg = load_config("openpcdet_nuscenes_multihead")
    rng = np.random.default_rng(0)
    state: dict[str, np.ndarray] = {k: rng.uniform(0.5, 1.5, shape).astype(np.float32)
                                    for k, shape in multihead.expected_keys(cfg).items()}
    state.update({k: np.asarray(ids, np.int64) for k, ids in multihead.label_keys(cfg).items()})
    for i, out_axis in ((0, 0), (1, 1)):
        conv, bn = f"backbone_2d.deblocks.{i}.0.weight", f"backbone_2d.deblocks.{i}.1"
        state[f"{bn}.weight"][0], state[f"{bn}.running_mean"][0] = 1e36, 0.0
        state[conv][(1, 0) if out_axis == 0 else (0, 1)] = 1e4
        assert fold_fits_float32(state, conv, bn, out_axis, cfg.network.bn_eps)
    weights_from_state_dict(state, "openpcdet", cfg, source="nus.pth")


def test_build_refuses_a_negative_variance_in_one_line_and_writes_nothing(zhulf_cfg: ModelConfig,
                                                                           tmp_path: Path) -> None:
    """``pointpillars-trt build`` of a full-size checkpoint (the built-in config) with one negative variance."""
    rng = np.random.default_rng(1)
    state = {k: rng.normal(size=shape).astype(np.float32) for k, shape in expected_keys("zhulf0804", zhulf_cfg).items()}
    state = {k: np.abs(v) if k.endswith(".running_var") else v for k, v in state.items()}
    state["pillar_encoder.bn.running_var"][10] = -2.0
    path = write_zip(state, tmp_path / "bad.pth")
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("error", RuntimeWarning)
        rc = main(["build", "--checkpoint", str(path), "--out", str(tmp_path / "model")])
    assert rc == 2 and out.getvalue() == "", (rc, out.getvalue())
    assert err.getvalue() == (f"error: {path}: pillar_encoder.bn.running_var has 1 negative value (of 64): "
                              "a BatchNorm variance cannot be negative; is the checkpoint damaged?\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pth"]


def test_non_finite_values_in_unused_tensors_are_fine(openpcdet_cfg: ModelConfig, tmp_path: Path) -> None:
    obj = {"model_state": small_state("openpcdet", openpcdet_cfg),
           "optimizer_state": {"exp_avg": np.full(3, np.nan, np.float32)}}
    path = write_legacy(obj, tmp_path / "ok.pth")
    assert load_checkpoint(path, config=small_config(openpcdet_cfg)).layout == "openpcdet"


# --- the real checkpoints stay within the limits ------------------------------------------------------


def test_shared_checkpoints_load_under_the_memory_limit(assets: Path, repo_root: Path) -> None:
    for name in ("pointpillar_openpcdet_synthetic.pth", "pointpillars_zhulf0804_synthetic.pth"):
        assert run_child("load", assets / "checkpoints" / name, repo_root).loaded


@pytest.mark.parametrize("out, said", [(None, "got None (NoneType)"), (3, "got 3 (int)"),
                                       ("", "an empty path")])
def test_build_model_dir_refuses_an_out_that_is_no_path(assets: Path, tmp_path: Path, out: object, said: str) -> None:
    """``build_model_dir(ckpt, None)`` was a bare TypeError from deep in the export; now one ModelDirError naming
    ``out`` and what to pass, before the checkpoint is read."""
    from pointpillars_trt.convert.export import build_model_dir
    from pointpillars_trt.errors import ModelDirError

    with pytest.raises(ModelDirError, match=re.escape(said)):
        build_model_dir(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth", out)  # type: ignore[arg-type]
