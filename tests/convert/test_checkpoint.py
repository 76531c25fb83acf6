"""Checkpoint import: both torch formats without torch, both key layouts, and every way a file can be bad.

Oracles: the raw bytes of the files (zip records, the legacy stream's count-prefixed payloads), the
key table and totals in $PP_ASSETS/README.md, brute-force strided indexing, and torch itself
where it is installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pickle
import shlex
import struct
import subprocess
import sys
import warnings
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _torch_writer import (LEGACY_MAGIC, UNTYPED, Call, Storage, Tensor, named_tensor_of, pickle_torch, tensor_of,
                           torch_global, write_legacy, write_zip)

import pointpillars_trt
from pointpillars_trt.convert.checkpoint import detect_layout, expected_keys, load_checkpoint, weights_from_state_dict
from pointpillars_trt.convert.pth import read_pth
from pointpillars_trt.config import ModelConfig
from pointpillars_trt.errors import CheckpointError, shell_word
from pointpillars_trt.convert.weights import PointPillarsWeights

LAYOUTS = ("openpcdet", "zhulf0804")
FILES = {"openpcdet": "pointpillar_openpcdet_synthetic.pth", "zhulf0804": "pointpillars_zhulf0804_synthetic.pth"}
WRITERS = {"zip": write_zip, "legacy": write_legacy}


def ignored(key: str) -> bool:
    return key == "global_step" or key.endswith(".num_batches_tracked")


@pytest.fixture(scope="module")
def paths(assets: Path) -> dict[str, Path]:
    return {layout: assets / "checkpoints" / name for layout, name in FILES.items()}


@pytest.fixture(scope="module")
def raw(paths: dict[str, Path]) -> dict[str, Any]:
    return {layout: read_pth(p) for layout, p in paths.items()}


@pytest.fixture(scope="module")
def states(raw: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    return {"openpcdet": raw["openpcdet"]["model_state"], "zhulf0804": raw["zhulf0804"]}


@pytest.fixture(scope="module")
def loaded(paths: dict[str, Path]) -> dict[str, Any]:
    return {layout: load_checkpoint(p) for layout, p in paths.items()}


@pytest.fixture(scope="module")
def cfgs(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> dict[str, ModelConfig]:
    return {"openpcdet": openpcdet_cfg, "zhulf0804": zhulf_cfg}


def checkpoint_error(fn: Callable[[], Any], path: Path | str, *words: str) -> str:
    """The call fails with a one-line CheckpointError naming the file and the given words."""
    with pytest.raises(CheckpointError) as info:
        fn()
    msg = str(info.value)
    assert str(path) in msg and "\n" not in msg, msg
    assert info.value.__cause__ is None
    for word in words:
        assert word in msg, msg
    return msg


def weight_arrays(w: PointPillarsWeights) -> list[np.ndarray]:
    out = [w.pfn_linear, *vars(w.pfn_bn).values()]
    for conv in [c for block in w.blocks for c in block] + list(w.deblocks):
        out += [conv.weight, *vars(conv.bn).values()]
    for head in (w.head_cls, w.head_box, w.head_dir):
        out += [head.weight, head.bias]
    return out


# --- the two shared checkpoints ----------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_checkpoint_is_recognised(layout: str, loaded: dict[str, Any], paths: dict[str, Path]) -> None:
    ckpt = loaded[layout]
    assert ckpt.layout == layout
    assert ckpt.config_name == {"openpcdet": "openpcdet_kitti_3class", "zhulf0804": "zhulf0804_kitti_3class"}[layout]
    assert ckpt.config.name == ckpt.config_name
    assert ckpt.path == paths[layout]
    assert ckpt.sha256 == hashlib.sha256(paths[layout].read_bytes()).hexdigest()


def test_shared_checkpoint_contents_match_readme(raw: dict[str, Any], states: dict[str, Any]) -> None:
    top = raw["openpcdet"]
    assert list(top) == ["epoch", "it", "model_state", "optimizer_state", "version"]
    assert (top["epoch"], top["it"], top["optimizer_state"]) == (80, 74240, None)
    assert top["version"] == "pcdet+0.6.0+8caccce+py0000000"
    assert isinstance(raw["zhulf0804"], OrderedDict)
    for layout, entries, numbers in (("openpcdet", 127, 4840925), ("zhulf0804", 126, 4840860)):
        state = states[layout]
        assert len(state) == entries
        assert sum(v.size for v in state.values()) == numbers
        for key, value in state.items():
            assert value.dtype == (np.int64 if ignored(key) else np.float32), key
    assert states["openpcdet"]["global_step"].shape == (1,)
    assert states["zhulf0804"]["pillar_encoder.bn.num_batches_tracked"].shape == ()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_expected_keys_are_exactly_the_file_keys(layout: str, states: dict[str, Any],
                                                 cfgs: dict[str, ModelConfig]) -> None:
    in_file = {k: v.shape for k, v in states[layout].items() if not ignored(k)}
    assert expected_keys(layout, cfgs[layout]) == in_file


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weight_shapes_follow_the_config(layout: str, loaded: dict[str, Any], cfgs: dict[str, ModelConfig]) -> None:
    cfg, w = cfgs[layout], loaded[layout].weights
    net = cfg.network
    assert w.pfn_linear.shape == (net.pfn_channels, cfg.features.channels)
    assert w.pfn_linear.shape == {"openpcdet": (64, 10), "zhulf0804": (64, 9)}[layout]  # README
    assert all(v.shape == (net.pfn_channels,) for v in vars(w.pfn_bn).values())
    assert [len(block) for block in w.blocks] == [n + 1 for n in net.layer_nums]
    c_in = net.pfn_channels
    for i, block in enumerate(w.blocks):
        c_out = net.block_channels[i]
        for j, conv in enumerate(block):
            assert conv.weight.shape == (c_out, c_in if j == 0 else c_out, 3, 3)
            assert conv.stride == (net.layer_strides[i] if j == 0 else 1)
            assert all(v.shape == (c_out,) for v in vars(conv.bn).values())
        c_in = c_out
    for i, deblock in enumerate(w.deblocks):
        s = net.upsample_strides[i]
        assert deblock.weight.shape == (net.block_channels[i], net.upsample_channels[i], s, s)
        assert deblock.stride == s
    head_in = sum(net.upsample_channels)
    for head, role in ((w.head_cls, "cls"), (w.head_box, "box"), (w.head_dir, "dir")):
        assert head.weight.shape == (cfg.head_channels[role], head_in, 1, 1)
        assert head.bias.shape == (cfg.head_channels[role],)
    # README numbers, independent of the config
    assert w.blocks[1][0].weight.shape == (128, 64, 3, 3) and w.deblocks[2].weight.shape == (256, 128, 4, 4)
    assert (w.head_cls.weight.shape[0], w.head_box.weight.shape[0], w.head_dir.weight.shape[0]) == (18, 42, 12)
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in weight_arrays(w))


def test_weights_come_from_the_documented_keys(loaded: dict[str, Any], states: dict[str, Any]) -> None:
    # README: OpenPCDet blocks.i.(j+1) = zhulf0804 multi_blocks.i.j, conv at 3j (+1), its BN right after.
    o, so = loaded["openpcdet"].weights, states["openpcdet"]
    z, sz = loaded["zhulf0804"].weights, states["zhulf0804"]
    pairs = [
        (o.pfn_linear, so["vfe.pfn_layers.0.linear.weight"]),
        (o.pfn_bn.running_var, so["vfe.pfn_layers.0.norm.running_var"]),
        (o.blocks[0][0].weight, so["backbone_2d.blocks.0.1.weight"]),
        (o.blocks[0][0].bn.weight, so["backbone_2d.blocks.0.2.weight"]),
        (o.blocks[0][3].weight, so["backbone_2d.blocks.0.10.weight"]),
        (o.blocks[0][3].bn.running_mean, so["backbone_2d.blocks.0.11.running_mean"]),
        (o.blocks[2][5].weight, so["backbone_2d.blocks.2.16.weight"]),
        (o.blocks[2][5].bn.bias, so["backbone_2d.blocks.2.17.bias"]),
        (o.deblocks[1].weight, so["backbone_2d.deblocks.1.0.weight"]),
        (o.deblocks[1].bn.running_var, so["backbone_2d.deblocks.1.1.running_var"]),
        (o.head_cls.weight, so["dense_head.conv_cls.weight"]),
        (o.head_box.bias, so["dense_head.conv_box.bias"]),
        (o.head_dir.weight, so["dense_head.conv_dir_cls.weight"]),
        (z.pfn_linear, sz["pillar_encoder.conv.weight"][:, :, 0]),
        (z.pfn_bn.bias, sz["pillar_encoder.bn.bias"]),
        (z.blocks[0][0].weight, sz["backbone.multi_blocks.0.0.weight"]),
        (z.blocks[0][0].bn.running_mean, sz["backbone.multi_blocks.0.1.running_mean"]),
        (z.blocks[2][5].weight, sz["backbone.multi_blocks.2.15.weight"]),
        (z.blocks[2][5].bn.weight, sz["backbone.multi_blocks.2.16.weight"]),
        (z.deblocks[2].weight, sz["neck.decoder_blocks.2.0.weight"]),
        (z.deblocks[2].bn.bias, sz["neck.decoder_blocks.2.1.bias"]),
        (z.head_box.weight, sz["head.conv_reg.weight"]),
        (z.head_dir.bias, sz["head.conv_dir_cls.bias"]),
    ]
    for got, want in pairs:
        assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_weight_is_one_file_tensor(layout: str, loaded: dict[str, Any], states: dict[str, Any]) -> None:
    """A bijection: each non-counter tensor of the file appears once among the weights, unchanged."""
    got = Counter(a.tobytes() for a in weight_arrays(loaded[layout].weights))
    want = Counter(v.tobytes() for k, v in states[layout].items() if not ignored(k))
    assert got == want


def test_zip_tensors_equal_their_raw_records(raw: dict[str, Any], paths: dict[str, Path]) -> None:
    with zipfile.ZipFile(paths["zhulf0804"]) as archive:
        prefix = "pointpillars_zhulf0804_synthetic/data/"
        records = [archive.read(n) for n in archive.namelist() if n.startswith(prefix)]
    assert Counter(records) == Counter(v.astype(v.dtype.newbyteorder("<")).tobytes() for v in raw["zhulf0804"].values())


def test_legacy_tensors_equal_their_count_prefixed_payloads(states: dict[str, Any], paths: dict[str, Path]) -> None:
    data = paths["openpcdet"].read_bytes()
    for key, value in states["openpcdet"].items():
        if ignored(key):
            continue
        at = data.find(value.astype("<f4").tobytes())
        assert at >= 8, key
        assert int.from_bytes(data[at - 8:at], "little") == value.size, key


def test_torch_reads_the_same_values(paths: dict[str, Path], raw: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    for layout, path in paths.items():
        ours = raw[layout]
        theirs = torch.load(path, weights_only=True)
        if layout == "openpcdet":
            assert {k: v for k, v in ours.items() if k != "model_state"} == \
                   {k: v for k, v in theirs.items() if k != "model_state"}
            ours, theirs = ours["model_state"], theirs["model_state"]
        assert list(ours) == list(theirs)
        for key, tensor in theirs.items():
            assert ours[key].dtype == tensor.numpy().dtype and np.array_equal(ours[key], tensor.numpy()), key


def test_reader_does_not_import_torch(paths: dict[str, Path], repo_root: Path) -> None:
    code = ("import sys; from pointpillars_trt.convert.checkpoint import load_checkpoint; "
            f"[load_checkpoint(p) for p in {[str(p) for p in paths.values()]!r}]; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- the reader on small files (test writer, and torch where installed) --------------------------

ALL_DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def sample_tree() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    arrays = {d: (rng.normal(size=(2, 3, 4)) * 50).astype(d) for d in ALL_DTYPES}
    return {
        "arrays": arrays,
        "scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "nested": [np.arange(3, dtype=np.int32), (np.ones(2, dtype=np.float64), "text", None, 1.5, True)],
        "plain": {"epoch": 3, "name": "x"},
    }


def assert_same_tree(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want) and got.flags.c_contiguous and got.flags.writeable and got.flags.owndata
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        for key in want:
            assert_same_tree(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_tree(g, w)
    else:
        assert got == want


def bfloat16_value(word: int) -> float:
    """The value of a bfloat16 by its definition (sign, 8 exponent bits biased by 127, 7 fraction bits), not by the
    float32 it is the high half of."""
    sign, exponent, fraction = -1.0 if word >> 15 else 1.0, (word >> 7) & 0xFF, word & 0x7F
    if exponent == 0xFF:
        return sign * math.inf if fraction == 0 else math.nan
    if exponent == 0:
        return sign * math.ldexp(fraction, -126 - 7)  # subnormal
    return sign * math.ldexp(128 + fraction, exponent - 127 - 7)


#: bfloat16 words: zeros, 1, -3, 1/3 and pi rounded, the largest and smallest normal, a subnormal, infinities, NaN
BF16_WORDS = [0x0000, 0x8000, 0x3F80, 0xC040, 0x3EAB, 0x7F7F, 0x0080, 0x8001, 0x7F80, 0xFF80, 0x7FC0, 0x4049]


def as_bfloat16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``values`` cut to bfloat16 (rounded toward zero): its words, and the float32 values they hold."""
    bits = values.astype(np.float32).view(np.uint32)
    return (bits >> 16).astype(np.uint16), (bits & 0xFFFF0000).view(np.float32)


@pytest.mark.parametrize("fmt", WRITERS)
def test_round_trip_every_dtype(fmt: str, tmp_path: Path) -> None:
    tree = sample_tree()
    assert_same_tree(read_pth(WRITERS[fmt](tree, tmp_path / "t.pth")), tree)


@pytest.mark.parametrize("top", ["archive", "epoch_160", "my.model-v2"])
def test_zip_top_folder_name_is_free(top: str, tmp_path: Path) -> None:
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert_same_tree(read_pth(write_zip(tree, tmp_path / "t.pth", top=top)), tree)


def strided(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> np.ndarray:
    """Brute force: element idx of the tensor is storage[offset + sum(idx * stride)]."""
    out = np.empty(size, dtype=storage.dtype)
    for idx in np.ndindex(*size):
        out[idx] = storage[offset + sum(i * s for i, s in zip(idx, stride))]
    return out


VIEWS = [(3, (2, 3), (1, 4)), (10, (4, 5), (5, 1)), (2, (3, 4), (0, 1)), (29, (), ()), (0, (2, 2, 2), (12, 1, 6))]


@pytest.mark.parametrize("fmt", WRITERS)
def test_offsets_strides_and_shared_storage(fmt: str, tmp_path: Path) -> None:
    storage = Storage(np.arange(30, dtype=np.float32) * 1.5 - 7)
    tensors = [Tensor(storage, *view) for view in VIEWS]
    got = read_pth(WRITERS[fmt]({"views": tensors, "again": tensors[0]}, tmp_path / "t.pth"))
    for array, (offset, size, stride) in zip(got["views"], VIEWS):
        assert_same_tree(array, strided(storage.array, offset, size, stride))
    assert got["again"] is got["views"][0]


@pytest.mark.parametrize("fmt", WRITERS)
def test_bfloat16_tensors_are_read_as_the_float32_of_their_value(fmt: str, tmp_path: Path) -> None:
    """A bfloat16 (bf16 mixed precision, Lightning's precision='bf16') is read as the float32 of its exact value,
    through any view of its storage."""
    words = np.array(BF16_WORDS, dtype=np.uint16)
    values = np.array([bfloat16_value(int(w)) for w in words], dtype=np.float64)
    assert np.array_equal(values.astype(np.float32).astype(np.float64), values, equal_nan=True)  # exact in float32
    storage = Storage(words, torch_type="BFloat16Storage")
    views = [(0, (12,), (1,)), (1, (2, 3), (1, 4)), (3, (2, 2), (0, 2)), (7, (), ())]
    got = read_pth(WRITERS[fmt]({"t": [Tensor(storage, *view) for view in views], "f": np.float32([2.5])},
                                tmp_path / "bf16.pth"))
    for array, view in zip(got["t"], views):
        want = strided(values.astype(np.float32), *view)
        assert array.dtype == np.float32 and array.shape == want.shape and array.flags.c_contiguous
        assert array.flags.owndata and np.array_equal(array, want, equal_nan=True), (view, array, want)
    assert np.signbit(got["t"][0][1]) and not np.signbit(got["t"][0][0])  # -0.0 stays negative
    assert_same_tree(got["f"], np.float32([2.5]))


UNSIGNED = ("uint16", "uint32", "uint64")


def unsigned_values(dtype: str) -> np.ndarray:
    """12 values of an unsigned type, half of them beyond its signed twin's range (a signed read would differ)."""
    bits = np.iinfo(dtype).bits
    return np.array([0, 1, 2**(bits - 1), 2**bits - 1, 2**(bits - 1) - 1, 2**(bits - 1) + 1, 255, 256, 2**bits - 2,
                     3, 1000, 2**bits - 1000], dtype=dtype)


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("dtype", UNSIGNED)
def test_tensors_of_a_named_element_type_are_read_as_numpys(fmt: str, dtype: str, tmp_path: Path) -> None:
    """torch (2.3 and later) pickles a uint16/32/64 tensor by _rebuild_tensor_v3, of an untyped storage of its bytes
    with its type named apart: read as NumPy's unsigned type, through any view counted in its elements."""
    values = unsigned_values(dtype)
    storage = Storage(values, torch_type=UNTYPED)
    views = [(0, (12,), (1,)), (1, (2, 3), (1, 4)), (3, (2, 2), (0, 2)), (11, (), ())]
    got = read_pth(WRITERS[fmt]({"t": [Tensor(storage, *view, dtype=dtype) for view in views],
                                 "f": np.float32([2.5])}, tmp_path / f"{dtype}.pth"))
    for array, view in zip(got["t"], views):
        assert_same_tree(array, strided(values, *view))
    assert_same_tree(got["f"], np.float32([2.5]))


@pytest.mark.parametrize("fmt", WRITERS)
def test_one_untyped_storage_is_read_as_each_type_its_tensors_name(fmt: str, tmp_path: Path) -> None:
    """torch saves x and x.view(torch.uint32) of a uint16 x with one untyped storage: each tensor reads its bytes as
    its own type."""
    values = unsigned_values("uint16")
    storage = Storage(values, torch_type=UNTYPED)
    got = read_pth(WRITERS[fmt]({"x": Tensor(storage, 0, (12,), (1,), dtype="uint16"),
                                 "wide": Tensor(storage, 1, (2, 2), (2, 1), dtype="uint32")}, tmp_path / "two.pth"))
    assert_same_tree(got["x"], values)
    assert_same_tree(got["wide"], strided(values.astype("<u2").view("<u4").astype(np.uint32), 1, (2, 2), (2, 1)))


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_state_dict_loads_as_its_float32_values(fmt: str, layout: str, dtype: str,
                                                                 states: dict[str, Any], cfgs: dict[str, ModelConfig],
                                                                 tmp_path: Path) -> None:
    """A model saved in bfloat16 or float16 loads with float32 weights of the very values the file holds: each
    weight is one file tensor's values, and the config is the layout's own."""
    state, want = {}, {}
    for key, value in states[layout].items():
        if value.dtype != np.float32:
            state[key] = value
        elif dtype == "bfloat16":
            words, want[key] = as_bfloat16(value)
            state[key] = tensor_of(words, "BFloat16Storage")
        else:
            state[key] = value.astype(np.float16)
            want[key] = state[key].astype(np.float32)
    assert any(not np.array_equal(want[k], states[layout][k]) for k in want)  # the precision was lost
    ckpt = load_checkpoint(WRITERS[fmt](state if layout == "zhulf0804" else {"model_state": state}, tmp_path / "h.pth"))
    assert ckpt.layout == layout and ckpt.config_name == cfgs[layout].name
    arrays = weight_arrays(ckpt.weights)
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)
    assert Counter(a.tobytes() for a in arrays) == Counter(v.tobytes() for v in want.values())


@pytest.mark.parametrize("fmt", WRITERS)
def test_view_past_the_storage_end_is_refused(fmt: str, tmp_path: Path) -> None:
    path = WRITERS[fmt]({"w": Tensor(Storage(np.zeros(10, np.float32)), 5, (2, 3), (3, 1))}, tmp_path / "t.pth")
    checkpoint_error(lambda: read_pth(path), path, "reads element 10", "has 10")


@pytest.mark.parametrize("legacy", [False, True])
def test_torch_written_files(legacy: bool, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10) * 0.25
    tensors = {
        "transposed": base.t(), "sliced": base[2:5, 3:8], "narrowed": base.narrow(1, 4, 3),
        "expanded": torch.arange(4.0).reshape(4, 1).expand(4, 3), "strided": base[::2, ::3],
        "param": torch.nn.Parameter(torch.ones(2, 3)), "scalar": torch.tensor(5),
        **{d: (torch.arange(24).reshape(2, 3, 4) % 7 - 3).to(getattr(torch, d)) for d in ALL_DTYPES},
    }
    bf16 = torch.randn(6, 10, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    bf16_tensors = {"bf16": bf16, "bf16 transposed": bf16.t()[1::2], "bf16 param": torch.nn.Parameter(bf16[2:4])}
    path = tmp_path / "t.pth"
    torch.save({"tensors": tensors, "bf16": bf16_tensors, "step": 9}, path, _use_new_zipfile_serialization=not legacy)
    got = read_pth(path)
    assert got["step"] == 9
    for key, tensor in tensors.items():
        assert_same_tree(got["tensors"][key], tensor.detach().numpy().copy())
    for key, tensor in bf16_tensors.items():  # torch's own widening of bfloat16 to float32
        assert_same_tree(got["bf16"][key], tensor.detach().float().numpy().copy())


def test_torch_loads_what_the_test_writer_writes(tmp_path: Path) -> None:
    """Keeps the writer honest: files that prove the reader must be files torch accepts."""
    torch = pytest.importorskip("torch")
    storage = Storage(np.arange(30, dtype=np.float32))
    words = np.array(BF16_WORDS, dtype=np.uint16)
    for fmt, write in WRITERS.items():
        path = write({"t": sample_tree()["arrays"], "v": [Tensor(storage, *view) for view in VIEWS],
                      "bf16": tensor_of(words, "BFloat16Storage")}, tmp_path / f"{fmt}.pth")
        theirs = torch.load(path, weights_only=True)
        for d, array in sample_tree()["arrays"].items():
            assert np.array_equal(theirs["t"][d].numpy(), array)
        for tensor, view in zip(theirs["v"], VIEWS):
            assert np.array_equal(tensor.numpy(), strided(storage.array, *view))
        assert theirs["bf16"].dtype == torch.bfloat16
        assert np.array_equal(theirs["bf16"].view(torch.int16).numpy().view(np.uint16), words)


def test_torch_reads_the_test_writers_tensors_of_named_types(tmp_path: Path) -> None:
    """Keeps the writer honest for the types torch names (_rebuild_tensor_v3): torch loads its zip file with the types
    and bytes written, and its legacy stream ends as torch's own does, with a storage's size in bytes and then its
    bytes (torch.load refuses its own legacy files of these types: its UntypedStorage has no dtype)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "uint64"):
        pytest.skip("this torch has no uint16/32/64 tensors")
    named = {d: named_tensor_of(unsigned_values(d), d) for d in UNSIGNED}
    named["float8_e4m3fn"] = named_tensor_of(np.array([0x00, 0x38, 0xC0, 0x7E], np.uint8), "float8_e4m3fn")
    named["uint32 view"] = Tensor(Storage(unsigned_values("uint16"), torch_type=UNTYPED), 1, (2, 2), (2, 1), "uint32")
    theirs = torch.load(write_zip(named, tmp_path / "named.pth"), weights_only=True)
    for name, tensor in named.items():  # torch's element type, and each element's bytes
        got = theirs[name]
        assert got.dtype == getattr(torch, tensor.dtype)
        word = np.dtype(f"<u{got.element_size()}")
        raw = tensor.storage.array.astype(tensor.storage.array.dtype.newbyteorder("<")).tobytes()
        want = strided(np.frombuffer(raw, word), tensor.offset, tensor.size, tensor.stride)
        assert np.array_equal(got.contiguous().view(torch.uint8).numpy().view(word).reshape(want.shape), want)
    values = unsigned_values("uint16")
    torch.save({"w": torch.tensor(values.tolist(), dtype=torch.uint16)}, tmp_path / "torch.pth",
               _use_new_zipfile_serialization=False)
    ours = write_legacy({"w": named_tensor_of(values, "uint16")}, tmp_path / "ours.pth")
    tail = struct.pack("<q", values.nbytes) + values.astype("<u2").tobytes()
    assert (tmp_path / "torch.pth").read_bytes().endswith(tail) and ours.read_bytes().endswith(tail)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_torch_quantized_state_dict_is_refused_with_the_save_that_reads_it(legacy: bool, tmp_path: Path) -> None:
    """torch pickles a quantized tensor by its own rebuild function, named before its storage type: still a type of
    tensors not read, not a hostile global; the save the refusal names, done as said, gives a file that reads."""
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated in recent torch
        state = {"w": torch.quantize_per_tensor(torch.linspace(-1, 1, 12).reshape(4, 3), 0.05, 0, torch.qint8),
                 "b": torch.ones(3)}
    path = tmp_path / "q.pth"
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    msg = checkpoint_error(lambda: read_pth(path), path, "holds quantized tensors ('torch._utils._rebuild_qtensor'), "
                           "which this reader does not read", UNREAD_STORAGES["QInt8Storage"])
    assert "plain pickle" not in msg and "refusing" not in msg
    fix = UNREAD_STORAGES["QInt8Storage"].split(": ", 1)[1]  # the save as said, of this state to this folder's file
    exec(fix.replace("model.state_dict()", "state").replace("'model.pth'", repr(str(tmp_path / "fixed.pth"))),
         {"torch": torch, "state": state})
    got = read_pth(tmp_path / "fixed.pth")
    assert_same_tree(got, {"w": state["w"].dequantize().numpy(), "b": np.ones(3, np.float32)})


@pytest.mark.parametrize("legacy", [False, True])
def test_torch_written_unsigned_tensors(legacy: bool, tmp_path: Path) -> None:
    """uint16/32/64 tensors as torch pickles them (_rebuild_tensor_v3, an untyped storage): read as torch holds
    them, through views, a Parameter, and a uint8 view that shares one's storage (a typed record of it)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "uint64"):
        pytest.skip("this torch has no uint16/32/64 tensors")
    tensors: dict[str, Any] = {}
    for d in UNSIGNED:
        base = torch.tensor([int(v) for v in unsigned_values(d)], dtype=getattr(torch, d)).reshape(3, 4)
        tensors.update({d: base, f"{d} transposed": base.t()[1:, ::2], f"{d} strided": base[::2, 1::2],
                        f"{d} param": torch.nn.Parameter(base[1:3], requires_grad=False)})
    tensors["uint16 bytes"] = tensors["uint16"].view(torch.uint8)
    path = tmp_path / "u.pth"
    torch.save(tensors, path, _use_new_zipfile_serialization=not legacy)
    got = read_pth(path)
    assert list(got) == list(tensors)
    for key, tensor in tensors.items():
        assert_same_tree(got[key], tensor.detach().numpy().copy())


@pytest.mark.parametrize("legacy", [False, True])
def test_a_torch_float8_state_dict_is_refused_with_the_save_that_reads_it(legacy: bool, tmp_path: Path) -> None:
    """torch pickles a float8 tensor by _rebuild_tensor_v3 with its type named (torch.float8_e4m3fn): a type of
    tensors not read, not a hostile global; the save the refusal names, done as said, gives a file that reads."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e5m2"):
        pytest.skip("this torch has no float8 tensors")
    ramp = torch.linspace(-2, 2, 12).reshape(4, 3)
    state = {"w": ramp.to(torch.float8_e4m3fn), "v": ramp.to(torch.float8_e5m2), "b": torch.ones(3)}
    path = tmp_path / "f8.pth"
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    msg = checkpoint_error(lambda: read_pth(path), path, "holds tensors of element type 'torch.float8_e4m3fn', which "
                           f"this reader does not read (it reads {READ_TYPES}): {UNREAD_STORAGES['Float8Storage']}")
    assert "plain pickle" not in msg and "refusing" not in msg
    fix = UNREAD_STORAGES["Float8Storage"].split("e.g. ", 1)[1]  # the save as said
    exec(fix.replace("model.state_dict()", "state").replace("'model.pth'", repr(str(tmp_path / "fixed.pth"))),
         {"torch": torch, "state": state})
    got = read_pth(tmp_path / "fixed.pth")
    assert_same_tree(got, {k: v.float().numpy() for k, v in state.items()})


# --- bad files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_truncated_shared_checkpoint(layout: str, paths: dict[str, Path], tmp_path: Path) -> None:
    data = paths[layout].read_bytes()
    path = tmp_path / "half.pth"
    path.write_bytes(data[: len(data) // 2])
    checkpoint_error(lambda: load_checkpoint(path), path, "truncated")


def test_legacy_cut_inside_the_main_pickle(paths: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "cut.pth"
    path.write_bytes(paths["openpcdet"].read_bytes()[:10_000])
    checkpoint_error(lambda: load_checkpoint(path), path, "main pickle is truncated or corrupt")


def test_corrupt_zip_record(paths: dict[str, Path], states: dict[str, Any], tmp_path: Path) -> None:
    data = bytearray(paths["zhulf0804"].read_bytes())
    at = data.find(states["zhulf0804"]["head.conv_cls.weight"].tobytes())
    data[at + 100] ^= 0xFF
    path = tmp_path / "flipped.pth"
    path.write_bytes(bytes(data))
    checkpoint_error(lambda: load_checkpoint(path), path, "cannot read storage record", "CRC")


def test_corrupt_legacy_pickle(paths: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(paths["openpcdet"].read_bytes())
    data[400:460] = b"\xff" * 60  # inside the main pickle, which starts at byte 137
    path = tmp_path / "garbled.pth"
    path.write_bytes(bytes(data))
    checkpoint_error(lambda: load_checkpoint(path), path, "main pickle is truncated or corrupt")


def test_short_zip_storage_record(tmp_path: Path) -> None:
    data, _ = pickle_torch({"w": np.zeros(8, np.float32)})
    path = tmp_path / "short.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", data)
        archive.writestr("a/data/0", b"\0" * 20)
    checkpoint_error(lambda: read_pth(path), path, "a/data/0 has 20 bytes, expected 32")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", data)
        archive.writestr("a/data/0", b"\0")
    checkpoint_error(lambda: read_pth(path), path, "a/data/0 has 1 byte, expected 32")


def test_missing_zip_storage_record(tmp_path: Path) -> None:
    data, _ = pickle_torch({"w": np.zeros(8, np.float32)})
    path = tmp_path / "missing.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", data)
    checkpoint_error(lambda: read_pth(path), path, "cannot read storage record a/data/0")


def test_short_legacy_storage(tmp_path: Path) -> None:
    path = write_legacy({"w": np.zeros(8, np.float32)}, tmp_path / "t.pth")
    path.write_bytes(path.read_bytes()[:-1])
    checkpoint_error(lambda: read_pth(path), path, "storage '0' is truncated or corrupt")


def test_zip_without_data_pkl(tmp_path: Path) -> None:
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("folder/readme.txt", "hello")
    checkpoint_error(lambda: load_checkpoint(path), path, "found 0")


def test_wrong_legacy_protocol(tmp_path: Path) -> None:
    path = tmp_path / "old.pth"
    path.write_bytes(pickle.dumps(LEGACY_MAGIC, protocol=2) + pickle.dumps(999, protocol=2))
    checkpoint_error(lambda: read_pth(path), path, "protocol version 999")


@pytest.mark.parametrize("content", [
    np.random.default_rng(1).bytes(5000),
    pickle.dumps({"weights": [1.0, 2.0]}, protocol=2),
    b"\x80\x02",
    b"PK",
], ids=["random", "plain-pickle", "cut-pickle", "zip-signature-only"])
def test_not_a_checkpoint(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "x.pth"
    path.write_bytes(content)
    msg = checkpoint_error(lambda: load_checkpoint(path), path)
    assert "not a torch checkpoint" in msg or "corrupt zip" in msg


def test_empty_missing_and_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    checkpoint_error(lambda: load_checkpoint(empty), empty, "empty file")
    checkpoint_error(lambda: load_checkpoint(tmp_path / "nope.pth"), tmp_path / "nope.pth", "not found")
    checkpoint_error(lambda: load_checkpoint(tmp_path), tmp_path, "is a directory, expected a .pth file")


def test_a_model_dir_or_its_record_given_as_a_checkpoint_names_the_model_dir(tmp_path: Path) -> None:
    """A model dir (a folder with its model.json) given where a .pth goes is said to be one, with the command and
    the call that open it; its model.json given as the checkpoint names the folder that holds it."""
    model = tmp_path / "my model"
    model.mkdir()
    (model / "model.json").write_text("{}\n")
    msg = checkpoint_error(lambda: load_checkpoint(model), model)
    assert msg == (f"{model}: is a model dir (the folder `pointpillars-trt build` writes), not a checkpoint: run it "
                   f"with `pointpillars-trt infer PATH --model '{model}'` (Python: PointPillars.from_model_dir), or "
                   "give the .pth it was built from")
    msg = checkpoint_error(lambda: load_checkpoint(model / "model.json"), model / "model.json")
    assert msg.endswith(f"; it is named as a model dir's record: give the model dir that holds it ('{model}'), the "
                        "folder `pointpillars-trt build` writes"), msg



@pytest.mark.parametrize("name", ["cbgs_pp_multihead.yaml", "my model.yml"])
def test_an_openpcdet_yaml_given_as_a_checkpoint_names_the_build_that_reads_it(tmp_path: Path, name: str) -> None:
    """An OpenPCDet model YAML given as --model or --checkpoint (a model is its .pth and its .yaml) was "not a
    torch checkpoint" alone: now it is said to be an OpenPCDet model config, with the build that takes it."""
    path = tmp_path / name
    path.write_text("CLASS_NAMES: ['car']\nMODEL:\n    NAME: PointPillar\n")
    msg = checkpoint_error(lambda: load_checkpoint(path), path)
    assert msg.endswith("; it is an OpenPCDet model config (MODEL, CLASS_NAMES, ...), which goes beside the "
                        "checkpoint as --pcdet-config: `pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth "
                        f"--pcdet-config {shlex.quote(str(path))} --out MODEL_DIR` (Python: "
                        "convert.pcdet_config.config_from_pcdet_yaml)"), msg


def test_a_package_config_given_as_a_checkpoint_names_config_not_pcdet_config() -> None:
    """One of this package's own configs given as --model was pointed to `build --pcdet-config`, which refuses it
    as one of this package's: now it is said to be one, and --config is named."""
    path = Path(pointpillars_trt.__file__).parent / "configs" / "openpcdet_kitti_3class.yaml"
    msg = checkpoint_error(lambda: load_checkpoint(path), path)
    assert msg.endswith("; it is one of this package's configs (family, voxel, ...), which goes beside the "
                        "checkpoint as --config (its path, or a built-in config's name), not --pcdet-config: "
                        "`pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth --config "
                        f"{shlex.quote(str(path))} --out MODEL_DIR` (Python: config=PATH)"), msg


def test_a_yaml_of_neither_kind_given_as_a_checkpoint_names_both_flags(tmp_path: Path) -> None:
    """A YAML that is neither kind of config (or cannot be read as one) names both flags, each with its kind."""
    path = tmp_path / "notes.yaml"
    path.write_text("a: 1\n")
    msg = checkpoint_error(lambda: load_checkpoint(path), path)
    assert msg.endswith("; it is named as a YAML config, which goes beside the checkpoint: `pointpillars-trt build "
                        f"--checkpoint YOUR_CHECKPOINT.pth --pcdet-config {shlex.quote(str(path))} --out MODEL_DIR` "
                        "for an OpenPCDet model config (--config for one of this package's)"), msg


def test_a_yaml_of_an_odd_name_is_named_in_the_build_command_as_its_path_not_as_escaped_text(tmp_path: Path) -> None:
    """The build command of a YAML given as a checkpoint quotes the file's own path, which the shell then gives back
    (a control character as $'\\x1b'): the message's escaped text of the name, quoted again, named another file."""
    path = tmp_path / "odd\x1bname.yaml"
    path.write_text("a: 1\n")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert f"--pcdet-config {shell_word(str(path))} --out MODEL_DIR` for an OpenPCDet model config" in str(info.value)


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("module, name, payload", [
    ("os", "system", "touch {marker}"),
    ("posix", "system", "touch {marker}"),
    ("subprocess", "getoutput", "touch {marker}"),
    ("builtins", "eval", "open({marker!r}, 'w').close()"),
    ("builtins", "exec", "open({marker!r}, 'w').close()"),
    ("torch.storage", "_load_from_bytes", "{marker}"),
])
def test_forbidden_global_is_refused_not_run(fmt: str, module: str, name: str, payload: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = Call(torch_global(module, name), (payload.format(marker=str(marker)),))
    path = WRITERS[fmt]({"w": np.zeros(2, np.float32), "x": evil}, tmp_path / "evil.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, f"'{module}.{name}'", "refusing")
    assert not marker.exists()


def test_a_model_saved_whole_is_told_to_save_its_state_dict(tmp_path: Path) -> None:
    """torch.save(model) pickles the model's class: refused, with the save that gives a readable file."""
    model = Call(torch_global("pcdet.models.detectors.pointpillar", "PointPillar"), ())
    path = write_zip({"model": model}, tmp_path / "whole.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, "refusing to load global "
                     "'pcdet.models.detectors.pointpillar.PointPillar'", "torch.save(model.state_dict(), 'model.pth')")


#: The tensor types the reader reads, as its refusal of another type lists them.
READ_TYPES = "float32, float16, float64, bfloat16, int64, int32, int16, int8, uint8, bool, uint16, uint32, uint64"
#: Storage types not read, with the fix their refusal names (Float8Storage: a type torch may add, not one it writes).
UNREAD_STORAGES = {
    "ComplexFloatStorage": "a PointPillars has no complex weights: save its state dict alone, "
                           "torch.save(model.state_dict(), 'model.pth')",
    "QInt8Storage": "dequantize them to float32: torch.save({k: v.dequantize() if v.is_quantized else v "
                    "for k, v in model.state_dict().items()}, 'model.pth')",
    "Float8Storage": "save the weights as float32, e.g. torch.save({k: v.float() if v.is_floating_point() else v "
                     "for k, v in model.state_dict().items()}, 'model.pth')",
}


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("storage", UNREAD_STORAGES)
def test_tensors_of_a_storage_type_not_read_are_named_with_the_fix(fmt: str, storage: str, states: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    """A complex or quantized state dict is no hostile pickle: its storage type is named as a type of tensors this
    reader does not read, with the save that gives a file it reads."""
    state = {k: tensor_of(v.view(np.uint16)[..., 1::2], storage) if v.dtype == np.float32 else v
             for k, v in states["openpcdet"].items()}
    path = WRITERS[fmt]({"model_state": state}, tmp_path / "typed.pth")
    msg = checkpoint_error(lambda: load_checkpoint(path), path, f"holds tensors of storage type 'torch.{storage}', "
                           f"which this reader does not read (it reads {READ_TYPES}): " + UNREAD_STORAGES[storage])
    assert "plain pickle" not in msg and "refusing" not in msg


PACKED_BITS_FIX = ("torch converts packed bits to no number type: save the weights as float32 before packing them, "
                   "torch.save(model.state_dict(), 'model.pth')")
#: Element types torch pickles by name (_rebuild_tensor_v3) that are not read, with their size in bytes and the fix
#: their refusal names.
UNREAD_ELEMENT_TYPES = {
    "float8_e4m3fn": (1, UNREAD_STORAGES["Float8Storage"]), "float8_e5m2": (1, UNREAD_STORAGES["Float8Storage"]),
    "float8_e8m0fnu": (1, UNREAD_STORAGES["Float8Storage"]), "float4_e2m1fn_x2": (1, PACKED_BITS_FIX),
    "bits16": (2, PACKED_BITS_FIX), "complex32": (4, UNREAD_STORAGES["ComplexFloatStorage"]),
}


@pytest.mark.parametrize("fmt", WRITERS)
@pytest.mark.parametrize("dtype", UNREAD_ELEMENT_TYPES)
def test_tensors_of_a_named_element_type_not_read_are_named_with_the_fix(fmt: str, dtype: str,
                                                                         states: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    """A float8 (or float4, raw bits, complex32) state dict as torch pickles it, with an untyped storage and the type
    named, is no hostile pickle: the type is named as one this reader does not read, with the save that reads."""
    size, fix = UNREAD_ELEMENT_TYPES[dtype]
    state = {k: named_tensor_of(np.zeros(v.shape, f"u{size}"), dtype) if v.dtype == np.float32 else v
             for k, v in states["openpcdet"].items()}
    path = WRITERS[fmt]({"model_state": state}, tmp_path / "named.pth")
    msg = checkpoint_error(lambda: load_checkpoint(path), path, f"holds tensors of element type 'torch.{dtype}', "
                           f"which this reader does not read (it reads {READ_TYPES}): {fix}")
    assert "plain pickle" not in msg and "refusing" not in msg


def test_forbidden_global_from_real_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return subprocess.call, (["touch", str(marker)],)

    path = tmp_path / "evil.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", pickle.dumps({"x": Evil()}, protocol=2, fix_imports=False))
    checkpoint_error(lambda: read_pth(path), path, "'subprocess.call'")
    assert not marker.exists()


# --- key layouts and mismatches ------------------------------------------------------------------


def test_mismatch_lists_missing_unexpected_and_misshaped(states: dict[str, Any], zhulf_cfg: ModelConfig,
                                                         tmp_path: Path) -> None:
    state = dict(states["zhulf0804"])
    del state["neck.decoder_blocks.1.0.weight"]
    state["head.extra.weight"] = np.zeros(3, np.float32)
    state["backbone.multi_blocks.0.0.weight"] = np.zeros((64, 64, 1, 1), np.float32)
    state["head.conv_cls.bias"] = state["head.conv_cls.bias"].astype(np.int64)
    path = write_zip(state, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{path}: ") and "(1 missing, 1 unexpected, 2 with a wrong shape or dtype)" in lines[0]
    assert lines[1] == "  missing: neck.decoder_blocks.1.0.weight"
    assert lines[2] == "  unexpected: head.extra.weight"
    assert lines[3] == ("  wrong shape or dtype: backbone.multi_blocks.0.0.weight: got float32 (64, 64, 1, 1), "
                        "expected float (64, 64, 3, 3), head.conv_cls.bias: got int64 (18,), expected float (18,)")
    assert lines[4] == "  a checkpoint of another network than the config's: build it with --config <a config YAML of its network>"


def test_a_network_other_than_the_builtin_configs_is_told_to_build_with_its_yaml(states: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    """An OpenPCDet PointPillar of two backbone blocks (its head reads 256 channels): the keys that differ, then the
    option that reads it, last, where the command line's one line keeps it whole."""
    state = {k: v for k, v in states["openpcdet"].items() if not k.startswith(("backbone_2d.blocks.2",
                                                                                "backbone_2d.deblocks.2"))}
    for head in ("conv_cls", "conv_box", "conv_dir_cls"):
        state[f"dense_head.{head}.weight"] = state[f"dense_head.{head}.weight"][:, :256]
    path = write_zip({"model_state": state}, tmp_path / "two_blocks.pth")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    lines = str(info.value).splitlines()
    assert "(35 missing, 0 unexpected, 3 with a wrong shape or dtype)" in lines[0]
    assert lines[-1] == "  a checkpoint of another network than the config's: build it with --pcdet-config <your model yaml>"


def _bn(prefix: str, channels: int) -> dict[str, np.ndarray]:
    return {f"{prefix}.{name}": np.full(channels, value, np.float32)
            for name, value in (("weight", 1), ("bias", 0), ("running_mean", 0), ("running_var", 1))}


@pytest.mark.parametrize("model, prefix, named", [
    ("second", "backbone_3d.", "SECOND"),
    ("pv_rcnn", "backbone_3d.", "PV-RCNN"),
    ("centerpoint_pillar", "dense_head.heads_list.", "CenterPoint"),
    ("mmdet3d_pointpillars", "voxel_encoder.", "MMDetection3D"),
])
def test_a_checkpoint_of_another_model_is_named_for_what_it_is(model: str, prefix: str, named: str,
                                                               states: dict[str, Any], tmp_path: Path) -> None:
    """Keys of a module neither layout has (a 3D backbone, a CenterHead, MMDetection3D's pillar encoder): one line
    naming that module and the models that have it, in place of a hundred missing and unexpected keys."""
    pillars = {k: v for k, v in states["openpcdet"].items() if k.startswith(("vfe.", "backbone_2d."))}
    sparse = {"backbone_3d.conv_input.0.weight": np.ones((3, 3, 3, 4, 16), np.float32),
              **_bn("backbone_3d.conv_input.1", 16)}
    anchor_head = {"dense_head.conv_cls.weight": np.ones((18, 512, 1, 1), np.float32),
                   "dense_head.conv_cls.bias": np.zeros(18, np.float32)}
    checkpoints = {  # the modules of each model's state dict, as OpenPCDet's and MMDetection3D's models name them
        "second": {"model_state": {**sparse, "backbone_2d.blocks.0.1.weight": np.ones((128, 256, 3, 3), np.float32),
                                   **anchor_head}},
        "pv_rcnn": {"model_state": {**sparse, "pfe.SA_layers.0.mlps.0.0.weight": np.ones((16, 4, 1, 1), np.float32),
                                    **anchor_head, "point_head.cls_layers.0.weight": np.ones((256, 640), np.float32),
                                    "roi_head.shared_fc_layer.0.weight": np.ones((256, 27648, 1), np.float32)}},
        "centerpoint_pillar": {"model_state": {**pillars, "dense_head.shared_conv.0.weight": np.ones((64, 384, 3, 3),
                                                                                                   np.float32),
                                               "dense_head.heads_list.0.hm.1.weight": np.ones((1, 64, 3, 3), np.float32)}},
        "mmdet3d_pointpillars": {"meta": {"mmdet3d_version": "1.0.0"}, "state_dict": {
            "voxel_encoder.pfn_layers.0.linear.weight": states["openpcdet"]["vfe.pfn_layers.0.linear.weight"],
            "backbone.blocks.0.0.weight": states["openpcdet"]["backbone_2d.blocks.0.1.weight"],
            "neck.deblocks.0.0.weight": states["openpcdet"]["backbone_2d.deblocks.0.0.weight"],
            "bbox_head.conv_cls.weight": states["openpcdet"]["dense_head.conv_cls.weight"]}},
    }
    path = write_legacy(checkpoints[model], tmp_path / f"{model}.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, f"not a model this package builds: its {prefix}* keys are",
                     named, "it builds the PointPillars of OpenPCDet (PointPillar) and of zhulf0804/PointPillars")


def test_long_key_lists_are_truncated(states: dict[str, Any], zhulf_cfg: ModelConfig) -> None:
    state = {k: v for k, v in states["zhulf0804"].items() if k.startswith("head.")}
    missing = len(expected_keys("zhulf0804", zhulf_cfg)) - len(state)
    with pytest.raises(CheckpointError) as info:
        weights_from_state_dict(state, "zhulf0804", zhulf_cfg, source="mine")
    missing_line = str(info.value).splitlines()[1]
    assert missing_line.startswith("  missing: pillar_encoder.conv.weight, ")
    assert missing_line.endswith(f", ... and {missing - 10} more") and missing_line.count(", ") == 10


def test_step_counters_are_optional(states: dict[str, Any], zhulf_cfg: ModelConfig, loaded: dict[str, Any]) -> None:
    state = {k: v for k, v in states["zhulf0804"].items() if not ignored(k)}
    weights = weights_from_state_dict(state, "zhulf0804", zhulf_cfg)
    for got, want in zip(weight_arrays(weights), weight_arrays(loaded["zhulf0804"].weights)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("fmt", WRITERS)
def test_plain_openpcdet_state_dict_without_wrapper(fmt: str, states: dict[str, Any], loaded: dict[str, Any],
                                                    tmp_path: Path) -> None:
    path = WRITERS[fmt](states["openpcdet"], tmp_path / "plain.pth")
    ckpt = load_checkpoint(path)
    assert ckpt.layout == "openpcdet"
    for got, want in zip(weight_arrays(ckpt.weights), weight_arrays(loaded["openpcdet"].weights)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("wrapper", ["state_dict", "model", "model_state"])
def test_wrapped_state_dicts(wrapper: str, states: dict[str, Any]) -> None:
    state = states["zhulf0804"]
    layout, found = detect_layout({wrapper: state, "epoch": 3, "optimizer": {"lr": 0.1}})
    assert layout == "zhulf0804" and found is state


def test_two_state_dicts_are_refused_when_they_differ_and_said_when_equal(states: dict[str, Any],
                                                                          loaded: dict[str, Any], tmp_path: Path) -> None:
    """OpenPCDet's ``model_state`` beside a ``state_dict`` of the same layout: which one is the model is
    unknown when they differ in one value (refused, naming both keys); equal ones (stored twice, each in a
    storage of its own) are read, with a note naming the one taken. Oracle: the plain checkpoint's weights."""
    import warnings

    from pointpillars_trt.errors import CheckpointNotice

    state = states["openpcdet"]
    changed = dict(state, **{"dense_head.conv_cls.bias": state["dense_head.conv_cls.bias"] + 1})
    path = write_zip({"model_state": state, "state_dict": changed, "epoch": 3}, tmp_path / "two.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, "two different state dicts, under 'model_state' and "
                     "'state_dict'", "torch.save(ckpt['model_state'], 'model.pth'), or ckpt['state_dict']")
    path = write_zip({"model_state": state, "state_dict": dict(state)}, tmp_path / "twice.pth")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = load_checkpoint(path)
    assert [str(w.message) for w in caught if w.category is CheckpointNotice] == [
        f"{path}: holds the same state dict under 'model_state' and 'state_dict': read the one under 'model_state'"]
    for got, want in zip(weight_arrays(ckpt.weights), weight_arrays(loaded["openpcdet"].weights)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_checkpoint_of_zero_weights_is_refused_naming_an_unwritten_file(layout: str, states: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    """Every conv and linear weight zero (what a preallocated file holds): the model would run, every score 0.5,
    so it is refused. One non-zero weight, or zero biases and BatchNorms beside trained weights, is read."""
    state = states[layout]
    conv = [k for k, v in state.items() if k.endswith(".weight") and v.ndim >= 2]
    zeroed = {k: np.zeros_like(v) if k in conv else v for k, v in state.items()}
    path = write_zip(zeroed, tmp_path / "zeros.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, f"all {len(conv)} conv and linear weight tensors are zeros",
                     "preallocated or never written")
    zeroed[conv[-1]] = state[conv[-1]]
    assert load_checkpoint(write_zip(zeroed, tmp_path / "one.pth")).layout == layout
    others = {k: np.zeros_like(v) if v.ndim == 1 and v.dtype.kind == "f" else v for k, v in state.items()}
    assert load_checkpoint(write_zip(others, tmp_path / "bn.pth")).layout == layout


@pytest.mark.parametrize("layout, prefix, wrap, place", [
    ("openpcdet", "model.", lambda s: {"epoch": 3, "state_dict": s, "pytorch-lightning_version": "2.1.0"},
     "ckpt['state_dict']"),
    ("zhulf0804", "net.", lambda s: s, "ckpt"),
    ("zhulf0804", "detector.", lambda s: {"model": s, "epoch": 3}, "ckpt['model']"),
])
def test_a_state_dict_in_a_wrapper_modules_attribute_is_told_how_to_save_it(
        layout: str, prefix: str, wrap: Callable[[dict[str, Any]], Any], place: str, states: dict[str, Any],
        tmp_path: Path) -> None:
    """Every key under one more name (a Lightning module's self.model): the place and prefix are named with the save
    that reads it, instead of the top-level keys said to have no known prefix. The save, done, reads."""
    state = {prefix + k: v for k, v in states[layout].items()}
    path = write_zip(wrap(state), tmp_path / "wrapped.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, f"the state dict in {place} has every key prefixed "
                     f"'{prefix}'", f"torch.save({{k[{len(prefix)}:]: v for k, v in {place}.items()}}, 'model.pth')")
    saved = write_zip({k.removeprefix(prefix): v for k, v in state.items()}, tmp_path / "model.pth")
    assert load_checkpoint(saved).layout == layout


def test_unknown_layout_and_non_dict(tmp_path: Path) -> None:
    path = write_zip({"encoder.weight": np.zeros(3, np.float32)}, tmp_path / "other.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, "unknown checkpoint layout", "encoder.weight",
                     "pillar_encoder.", "backbone_2d.")
    path = write_legacy([np.zeros(3, np.float32)], tmp_path / "list.pth")
    checkpoint_error(lambda: load_checkpoint(path), path, "holds a list")


def test_another_networks_state_dict_in_a_wrapper_is_named_by_its_own_keys(tmp_path: Path) -> None:
    """OpenPCDet's wrapper around another network's weights (a ResNet's) was said to have "top-level keys
    [model_state, epoch]" of no known prefix, as if the wrapper had not been looked into."""
    other = {"conv1.weight": np.zeros((4, 3, 7, 7), np.float32), "fc.weight": np.zeros((10, 4), np.float32)}
    path = write_zip({"model_state": other, "epoch": 3}, tmp_path / "resnet.pth")
    msg = checkpoint_error(lambda: load_checkpoint(path), path, "unknown checkpoint layout: the keys in "
                           "ckpt['model_state'] [conv1.weight, fc.weight] have no known prefix", "backbone_2d.")
    assert "epoch" not in msg


def test_config_family_must_match_layout(paths: dict[str, Path], openpcdet_cfg: ModelConfig) -> None:
    checkpoint_error(lambda: load_checkpoint(paths["zhulf0804"], config=openpcdet_cfg), paths["zhulf0804"],
                     "zhulf0804 layout", "openpcdet family")
    assert load_checkpoint(paths["zhulf0804"], config="zhulf0804_kitti_3class").layout == "zhulf0804"


def small_config(cfg: ModelConfig) -> ModelConfig:
    net = dataclasses.replace(cfg.network, pfn_channels=8, layer_nums=(1, 2, 2), block_channels=(8, 16, 32),
                              upsample_channels=(4, 4, 4))
    return dataclasses.replace(cfg, name="small", network=net)


def test_expected_keys_are_built_from_the_config(openpcdet_cfg: ModelConfig, zhulf_cfg: ModelConfig) -> None:
    keys = expected_keys("openpcdet", small_config(openpcdet_cfg))
    # convs: pfn + (2 + 3 + 3) in blocks + 3 deblocks, 5 keys each; 3 heads with weight and bias
    assert len(keys) == 5 * (1 + 8 + 3) + 6
    assert keys["vfe.pfn_layers.0.linear.weight"] == (8, 10)
    assert keys["backbone_2d.blocks.0.4.weight"] == (8, 8, 3, 3) and "backbone_2d.blocks.0.7.weight" not in keys
    assert keys["backbone_2d.blocks.1.1.weight"] == (16, 8, 3, 3)
    assert keys["backbone_2d.blocks.1.7.weight"] == (16, 16, 3, 3) and "backbone_2d.blocks.1.10.weight" not in keys
    assert keys["backbone_2d.blocks.2.8.running_var"] == (32,)
    assert keys["backbone_2d.deblocks.2.0.weight"] == (32, 4, 4, 4)
    assert keys["dense_head.conv_box.weight"] == (42, 12, 1, 1)
    keys = expected_keys("zhulf0804", small_config(zhulf_cfg))
    assert keys["pillar_encoder.conv.weight"] == (8, 9, 1)
    assert keys["backbone.multi_blocks.1.6.weight"] == (16, 16, 3, 3) and "backbone.multi_blocks.1.9.weight" not in keys
    assert keys["head.conv_reg.bias"] == (42,)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_custom_config_end_to_end(layout: str, cfgs: dict[str, ModelConfig], tmp_path: Path) -> None:
    cfg = small_config(cfgs[layout])
    rng = np.random.default_rng(2)
    state = {k: rng.normal(size=shape).astype(np.float32) for k, shape in expected_keys(layout, cfg).items()}
    state.update({k: np.abs(v) for k, v in state.items() if k.endswith(".running_var")})  # variances are >= 0
    path = write_zip(state, tmp_path / "small.pth")
    w = load_checkpoint(path, config=cfg).weights
    block = {"openpcdet": "backbone_2d.blocks", "zhulf0804": "backbone.multi_blocks"}[layout]
    first = {"openpcdet": 1, "zhulf0804": 0}[layout]
    assert np.array_equal(w.blocks[1][2].weight, state[f"{block}.1.{first + 6}.weight"])
    assert np.array_equal(w.blocks[1][2].bn.running_var, state[f"{block}.1.{first + 7}.running_var"])
    assert [[c.stride for c in b] for b in w.blocks] == [[2, 1], [2, 1, 1], [2, 1, 1]]
    assert [d.stride for d in w.deblocks] == [1, 2, 4]
    assert w.pfn_linear.shape == (8, cfg.features.channels)
    # the built-in config expects other shapes: the error says which
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "wrong shape or dtype" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_keys_saved_through_dataparallel_are_read_without_module_prefix(layout: str, raw: dict[str, Any]) -> None:
    """A model saved as ``model.state_dict()`` of a DataParallel wrapper: every key ``module.``-prefixed.
    Oracle: the same checkpoint without the wrapper (its layout and its tensors, key for key)."""
    plain_layout, plain = detect_layout(raw[layout])
    wrapped = {f"module.{key}": value for key, value in plain.items()}
    for obj in (wrapped, {"model_state": wrapped}):
        got_layout, got = detect_layout(obj)
        assert got_layout == plain_layout == layout
        assert list(got) == list(plain) and all(got[k] is plain[k] for k in plain)
    half = dict(wrapped)
    half["extra.weight"] = next(iter(plain.values()))  # not every key wrapped: not stripped
    with pytest.raises(CheckpointError, match="unknown checkpoint layout"):
        detect_layout(half)
