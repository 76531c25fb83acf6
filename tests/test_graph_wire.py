"""graph_wire: what an ONNX file declares of its inputs and outputs, and its weights, read from its wire format alone,
are what onnx's whole parse of the file reads, on every kind of graph the package and its tests build and on damaged
and hostile files; a file it cannot read, onnx cannot read either (a weight of a type it does not read aside)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from onnx import TensorProto, helper, numpy_helper
from tiny import tiny_model_dir
from tiny_graphs import head_graph, pfn_graph

from pointpillars_trt.errors import ModelDirError
from pointpillars_trt.graph_wire import (ELEMENT_DTYPES, DeclaredTensor, DecodeError, GraphDeclaration, TensorError,
                                         graph_declaration, graph_weights)
from pointpillars_trt.model_dir import graph_initializers

REFUSED = "refused"


def onnx_reads(data: bytes) -> GraphDeclaration | str:
    """What a whole parse (onnx's) reads of the inputs, outputs and initializer names of ``data``."""
    try:
        graph = onnx.load_model_from_string(data).graph
    except ProtobufDecodeError:
        return REFUSED

    def declared(value: onnx.ValueInfoProto) -> DeclaredTensor:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)
        return DeclaredTensor(value.name, tensor.elem_type, dims)

    return GraphDeclaration(tuple(map(declared, graph.input)), tuple(map(declared, graph.output)),
                            frozenset(t.name for t in graph.initializer))


def wire_reads(data: bytes) -> GraphDeclaration | str:
    try:
        return graph_declaration(data)
    except DecodeError:
        return REFUSED


Weights = dict[str | bytes, tuple[str, tuple[int, ...], bytes]]
#: The element types graph_wire reads weights of: the others are refused by name, though onnx reads them.
READ_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64}
READ_DTYPES = {np.dtype(helper.tensor_dtype_to_np_dtype(t)) for t in READ_TYPES}


def weights(arrays: Mapping[Any, np.ndarray]) -> Weights:
    """Each array as its native dtype, shape and bytes: equal only where every bit is."""
    return {name: (a.dtype.newbyteorder("=").str, a.shape, a.tobytes()) for name, a in arrays.items()}


def onnx_weights(data: bytes) -> Weights | str:
    """The initializers as onnx reads them (numpy_helper.to_array, the package's reader before graph_wire)."""
    try:
        return weights({t.name: numpy_helper.to_array(t) for t in onnx.load_model_from_string(data).graph.initializer})
    except (ProtobufDecodeError, ValueError, TypeError, KeyError, onnx.checker.ValidationError):
        return REFUSED  # the wire; values to_array makes no array of; external data whose file is not there


NOT_READ = "a data type not read"


def wire_weights(data: bytes) -> Weights | str:
    try:
        found = graph_weights(data)
    except DecodeError:
        return REFUSED
    except TensorError as exc:
        return NOT_READ if exc.reason.startswith("is of data type") else REFUSED
    assert all(a.dtype.isnative and not a.flags.writeable for a in found.values())  # no caller changes the file's
    return weights(found)


@pytest.fixture(scope="module")
def built_graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The graphs of the tiny model dirs (both layouts, both precisions) and the tests' hand-built graphs."""
    folder = tmp_path_factory.mktemp("graphs")
    found: dict[str, bytes] = {}
    for family in ("openpcdet", "zhulf0804"):
        for precision in ("fp32", "fp16"):
            model = tiny_model_dir(folder / f"{family}_{precision}", family, precision)
            found.update({f"{family} {precision} {g}": model.onnx_path(g).read_bytes() for g in ("pfn", "rpn")})
    for name, make in (("pfn", lambda p: pfn_graph(p)), ("pfn fp16", lambda p: pfn_graph(p, fp16=True)),
                       ("head", lambda p: head_graph(p))):
        path = folder / f"{name.replace(' ', '_')}.onnx"
        make(path)
        found[f"hand-built {name}"] = path.read_bytes()
    return found


def test_every_graph_the_tests_build_is_read_as_onnx_reads_it(built_graphs: dict[str, bytes]):
    for name, data in built_graphs.items():
        found = wire_reads(data)
        assert found == onnx_reads(data), name
        assert isinstance(found, GraphDeclaration) and found.inputs and found.outputs, name
        read = wire_weights(data)
        assert read == onnx_weights(data), name
        assert isinstance(read, dict) and read, name


@pytest.mark.parametrize("checkpoint, precision", [("checkpoints/pointpillar_openpcdet_synthetic.pth", "fp32"),
                                                   ("checkpoints/pointpillars_zhulf0804_synthetic.pth", "fp16"),
                                                   ("nuscenes/cbgs_pp_multihead_synthetic_dev.pth", "fp32"),
                                                   ("nuscenes/cbgs_pp_multihead_synthetic_dev.pth", "fp16")])
def test_the_graphs_of_the_real_checkpoints_are_read_as_onnx_reads_them(tmp_path: Path, assets: Path,
                                                                         checkpoint: str, precision: str):
    from pointpillars_trt.convert.checkpoint import load_checkpoint
    from pointpillars_trt.convert.export import export_checkpoint
    from pointpillars_trt.graph_io import check_precision

    if not (assets / checkpoint).is_file():
        pytest.skip(f"{checkpoint} is not among the assets")
    model = export_checkpoint(load_checkpoint(assets / checkpoint), tmp_path / "m",
                              precision=check_precision(precision))
    for graph in ("pfn", "rpn"):
        data = model.onnx_path(graph).read_bytes()
        assert wire_reads(data) == onnx_reads(data), graph
        found = wire_weights(data)
        assert found == onnx_weights(data), graph  # every weight, bit for bit
        assert isinstance(found, dict) and {dtype for dtype, _, _ in found.values()} == {
            "<f2" if precision == "fp16" else "<f4"}, graph


def test_a_graph_cut_at_any_byte_is_read_or_refused_as_onnx_reads_it(built_graphs: dict[str, bytes]):
    data = built_graphs["openpcdet fp32 pfn"]
    outcomes = [wire_reads(data[:cut]) for cut in range(len(data))]
    assert outcomes == [onnx_reads(data[:cut]) for cut in range(len(data))]
    assert outcomes.count(REFUSED) > len(data) // 2  # the cuts that end inside a record
    assert [wire_weights(data[:cut]) for cut in range(len(data))] == [onnx_weights(data[:cut]) for cut in
                                                                      range(len(data))]


def test_a_graph_of_many_weights_cut_anywhere_has_them_read_or_refused_as_onnx_reads_them(
        built_graphs: dict[str, bytes]):
    data = built_graphs["zhulf0804 fp16 rpn"]
    cuts = [*range(0, len(data), len(data) // 1500), *range(len(data) - 64, len(data) + 1)]
    outcomes = [wire_weights(data[:cut]) for cut in cuts]
    assert outcomes == [onnx_weights(data[:cut]) for cut in cuts]
    assert outcomes[-1] != REFUSED and outcomes.count(REFUSED) > len(cuts) * 0.9


def test_a_graph_with_a_byte_changed_anywhere_that_onnx_reads_is_read_the_same(built_graphs: dict[str, bytes]):
    """What a whole parse reads, this reads alike; what this refuses, a whole parse refuses. A byte changed inside a
    record that only a whole parse decodes (a node's, a weight's) can be refused by it alone."""
    data = built_graphs["openpcdet fp32 pfn"]
    read = refused = 0
    for at in range(len(data)):
        for value in {0x00, 0x7F, 0x80, 0xFF, data[at] ^ 0x01, data[at] ^ 0x08}:
            changed = data[:at] + bytes([value]) + data[at + 1:]
            expected, found = onnx_reads(changed), wire_reads(changed)
            if expected != REFUSED:
                assert found == expected, (at, value)
                read += 1
            elif found == REFUSED:
                refused += 1
    assert read > 10 * refused > 0


def test_weights_with_a_byte_changed_anywhere_are_read_as_onnx_reads_them_or_refused_by_both(
        built_graphs: dict[str, bytes]):
    """What onnx reads of the weights, this reads alike, but for a data type it does not read (a flipped data_type
    byte makes float32 uint32), refused by name; what this refuses for another reason, onnx refuses."""
    data = built_graphs["openpcdet fp32 pfn"]
    outcomes: dict[str, int] = {}
    for at in range(len(data)):
        for value in {0x00, 0x7F, 0x80, 0xFF, data[at] ^ 0x01, data[at] ^ 0x08}:
            changed = data[:at] + bytes([value]) + data[at + 1:]
            expected, found = onnx_weights(changed), wire_weights(changed)
            if found == NOT_READ:  # onnx reads another type, or refuses (UNDEFINED, a type of no NumPy dtype)
                assert isinstance(expected, str) or any(np.dtype(dtype) not in READ_DTYPES
                                                        for dtype, _, _ in expected.values()), (at, value)
            elif found == REFUSED:
                assert expected == REFUSED, (at, value)
            elif expected != REFUSED:  # onnx refuses damage in a record only it decodes (a node's)
                assert found == expected, (at, value)
            kind = found if isinstance(found, str) else "read" if found == expected else "read, refused by onnx"
            outcomes[kind] = outcomes.get(kind, 0) + 1
    assert set(outcomes) == {"read", NOT_READ, REFUSED, "read, refused by onnx"}


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def scalar(number: int, value: int) -> bytes:
    """A varint field."""
    return varint(number << 3) + varint(value & (1 << 64) - 1)


def groups(number: int, depth: int) -> bytes:
    """``depth`` empty groups nested in one another: a wire type no ONNX field has, stepped over as unknown."""
    return varint(number << 3 | 3) * depth + varint(number << 3 | 4) * depth


def tensor_type(elem_type: int, *dims: bytes) -> bytes:
    """A TypeProto of a tensor: elem_type, and a shape of the Dimension records ``dims``."""
    return field(1, scalar(1, elem_type) + field(2, b"".join(field(1, d) for d in dims)))


def value(name: bytes, *type_parts: bytes) -> bytes:
    """A ValueInfoProto: its name and its type records."""
    return field(1, name) + b"".join(field(2, part) for part in type_parts)


def model(*graph_fields: bytes, before: bytes = b"", after: bytes = b"") -> bytes:
    """A ModelProto of one graph record holding ``graph_fields``, with other top-level bytes around it."""
    return before + scalar(1, 8) + field(7, b"".join(graph_fields)) + after


X = value(b"x", tensor_type(1, scalar(2, 0) + field(2, b"n"), scalar(1, 3)))  # x float32 [n, 3]
Y = value(b"y", tensor_type(10, scalar(1, 3)))  # y float16 [3]
HOSTILE = {
    "empty file": b"",
    "a graph of no output": model(field(11, X)),
    "a graph of no input": model(field(12, Y)),
    "no graph": scalar(1, 8) + field(8, scalar(2, 17)),
    "the graph as a varint": scalar(7, 5) + model(field(11, X)),
    "an input as a varint, a fixed32, a fixed64 and a group": model(
        scalar(11, 1), varint(11 << 3 | 5) + b"abcd", varint(11 << 3 | 1) + b"abcdefgh",
        varint(11 << 3 | 3) + field(1, b"z") + varint(11 << 3 | 4), field(11, X), field(12, Y)),
    "an element type and a size length-delimited": model(field(11, value(b"x", field(1, field(1, b"\x01") + field(
        2, field(1, field(1, b"\x05")))))), field(12, Y)),
    "the graph given twice": model(field(11, X)) + field(7, field(12, Y) + field(11, Y)),
    "a name given twice": model(field(11, X + field(1, b"renamed")), field(12, Y)),
    "a type given in two records": model(field(11, value(b"x", tensor_type(1, scalar(1, 2)),
                                                         field(1, field(2, field(1, scalar(1, 4)))))), field(12, Y)),
    "a type that becomes a sequence": model(field(11, value(b"x", tensor_type(1, scalar(1, 2)), field(4, b""))),
                                            field(12, Y)),
    "a sequence that becomes a tensor again": model(field(11, value(b"x", tensor_type(1, scalar(1, 2)) + field(
        4, b"") + tensor_type(10, scalar(1, 5)))), field(12, Y)),
    "a sequence given as a varint": model(field(11, value(b"x", tensor_type(1, scalar(1, 2)) + scalar(4, 1))),
                                          field(12, Y)),
    "a negative element type and size": model(field(11, value(b"x", tensor_type(-1, scalar(1, -7)))), field(12, Y)),
    "an element type past 32 bits": model(field(11, value(b"x", tensor_type((1 << 40) + 6))), field(12, Y)),
    "a varint of 10 bytes, its last 0x7f": model(field(11, value(b"x", field(1, b"\x08" + b"\xff" * 9 + b"\x7f"))),
                                                 field(12, Y)),
    "a varint of 11 bytes": model(field(11, value(b"x", field(1, b"\x08" + b"\xff" * 10 + b"\x01"))), field(12, Y)),
    "dims of a value, a name, both, neither and an empty name": model(field(11, value(b"x", tensor_type(
        1, scalar(1, 4), field(2, b"n"), scalar(1, 4) + field(2, b"n"), field(2, b"n") + scalar(1, 0), b"",
        field(2, b"")))), field(12, Y)),
    "an initializer listed as an input": model(field(5, scalar(1, 3) + field(8, b"w") + field(9, b"\0" * 12)),
                                               field(11, value(b"w", tensor_type(1, scalar(1, 3)))), field(11, X),
                                               field(12, Y)),
    "an initializer of no name": model(field(5, scalar(2, 1)), field(11, X), field(12, Y)),
    "names of no UTF-8": model(*(field(11, value(name, tensor_type(1))) for name in (
        b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"caf\xc3", "caf\u00e9 \U0001F600".encode())),
        field(12, value(b"y", tensor_type(1, field(2, b"\xe2\x82")))), field(5, field(8, b"\xff"))),
    "field number 0": b"\x00\x00" + model(field(11, X)),
    "an end of group that none opened": varint(50 << 3 | 4) + model(field(11, X)),
    "a group left open": model(field(11, X), after=varint(50 << 3 | 3)),
    "a group ended by another": model(field(11, X), after=varint(50 << 3 | 3) + varint(51 << 3 | 4)),
    "wire type 6": model(field(11, X), after=b"\x0e"),
    "wire type 7": model(field(11, X), after=b"\x0f"),
    "100 groups deep at the top": model(field(11, X), field(12, Y), before=groups(50, 100)),
    "101 groups deep at the top": model(field(11, X), field(12, Y), before=groups(50, 101)),
    "99 groups deep in the graph": model(groups(50, 99), field(11, X), field(12, Y)),
    "100 groups deep in the graph": model(groups(50, 100), field(11, X), field(12, Y)),
    "groups in a value's type": model(field(11, value(b"x", groups(3, 20) + tensor_type(1, groups(9, 3)))),
                                      field(12, Y)),
    "a tag of 5 bytes": b"\xba\x80\x80\x80\x00" + field(7, field(11, X))[1:],
    "a tag of 6 bytes": b"\xba\x80\x80\x80\x80\x00" + field(7, field(11, X))[1:],
    "a tag past 32 bits": varint(1 << 32) + b"\x00" + model(field(11, X)),
    "the largest field number": varint(((1 << 29) - 1) << 3) + b"\x00" + model(field(11, X)),
    "a length of 10 bytes": b"\x3a" + bytes([len(field(11, X)) | 0x80]) + b"\x80" * 8 + b"\x00" + field(11, X),
    "a length past the file's end": b"\x3a" + varint(1 << 31) + field(11, X),
    "a length past its message's end": model(field(11, X)[:-1] + b"\x0a\x05ab"),
    "a fixed32 cut short": model(field(11, X), after=b"\x0d\x01\x02"),
    "a varint cut short": model(field(11, X), after=b"\x08\xff"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_file_is_read_or_refused_as_onnx_reads_it(name: str):
    assert wire_reads(HOSTILE[name]) == onnx_reads(HOSTILE[name])


@pytest.mark.parametrize("elem_type", [-1, 0, *TensorProto.DataType.values(), 99, 2**31 - 1])
def test_element_types_are_named_as_onnx_names_their_dtypes(elem_type: int):
    try:
        expected = str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except KeyError:
        expected = None
    assert ELEMENT_DTYPES.get(elem_type) == expected


def packed(number: int, values: list[int]) -> bytes:
    """A packed repeated varint field (int32_data, int64_data, dims)."""
    return field(number, b"".join(varint(v & (1 << 64) - 1) for v in values))


def fixed(number: int, data: bytes, size: int) -> bytes:
    """A repeated fixed-size field unpacked: one field (wire type 5 or 1) an element."""
    tag = varint(number << 3 | (5 if size == 4 else 1))
    return b"".join(tag + data[at:at + size] for at in range(0, len(data), size))


def initializer(*tensor_fields: bytes) -> bytes:
    """A model whose graph holds one initializer of ``tensor_fields`` (a TensorProto's records)."""
    return model(field(5, b"".join(tensor_fields)))


def made(tensor: onnx.TensorProto) -> bytes:
    return initializer(tensor.SerializeToString())


RNG = np.random.default_rng(7)
F32 = np.array([0.0, -0.0, 1.5, -3.25e-3, np.inf, -np.inf, 1e-45, 3.4e38, *RNG.standard_normal(40)], np.float32)
F16_BITS = np.arange(0, 1 << 16, 7, dtype=np.uint16)  # every 7th bit pattern: NaNs, infinities, subnormals
I32 = np.array([0, 1, -1, 2**31 - 1, -2**31, *RNG.integers(-2**31, 2**31, 40)], np.int32)
I64 = np.array([0, 1, -1, 2**63 - 1, -2**63, *RNG.integers(-2**63, 2**63 - 1, 40, dtype=np.int64)], np.int64)
F64 = np.array([0.0, -0.0, np.inf, 5e-324, 1.7e308, *RNG.standard_normal(40)], np.float64)
READ_ALIKE = {
    "float32 in raw_data": made(numpy_helper.from_array(F32.reshape(6, 8), "w")),
    "float16 in raw_data": made(numpy_helper.from_array(F16_BITS.view(np.float16).reshape(1, -1, 1), "w")),
    "float64, int32, int64 in raw_data": model(*(field(5, numpy_helper.from_array(a, n).SerializeToString())
                                                 for n, a in (("d", F64), ("i", I32.reshape(5, 9)), ("l", I64)))),
    "a scalar and an empty tensor": model(field(5, numpy_helper.from_array(np.float32(2.5), "s").SerializeToString()),
                                          field(5, numpy_helper.from_array(np.zeros((3, 0), np.float16), "e")
                                                .SerializeToString())),
    "float32 in float_data, packed": made(helper.make_tensor("w", TensorProto.FLOAT, [6, 8], F32)),
    "float16 in int32_data, packed": made(helper.make_tensor("w", TensorProto.FLOAT16, [len(F16_BITS)],
                                                             F16_BITS.view(np.float16))),
    "float64 in double_data, packed": made(helper.make_tensor("w", TensorProto.DOUBLE, [len(F64)], F64)),
    "int32 in int32_data, packed": made(helper.make_tensor("w", TensorProto.INT32, [len(I32)], I32)),
    "int64 in int64_data, packed": made(helper.make_tensor("w", TensorProto.INT64, [len(I64)], I64)),
    "float32 in float_data, unpacked and packed": initializer(
        field(8, b"w"), scalar(2, 1), scalar(1, 4), scalar(1, 12), fixed(4, F32[:20].tobytes(), 4),
        field(4, F32[20:].tobytes())),
    "float64 in double_data, unpacked": initializer(scalar(2, 11), packed(1, [len(F64)]), fixed(10, F64.tobytes(), 8)),
    "int64 in int64_data, unpacked and packed": initializer(
        scalar(2, 7), scalar(1, 5), scalar(1, len(I64) // 5), *(scalar(7, int(v)) for v in I64[:9]),
        packed(7, [int(v) for v in I64[9:]])),
    "float16 and int32 past their bits in int32_data": model(
        field(5, field(8, b"h") + scalar(2, 10) + scalar(1, 3) + packed(5, [0x3C00 | 1 << 16, -1, 2**40 + 0x7BFF])),
        field(5, field(8, b"i") + scalar(2, 6) + scalar(1, 2) + scalar(5, 2**40 - 5) + scalar(5, -7))),
    "a typed field of another wire type, stepped over": initializer(
        scalar(2, 1), scalar(1, 2), scalar(4, 9), field(4, F32[:2].tobytes()), fixed(7, b"\0" * 8, 8)),
    "the values of another type's field, left out": initializer(
        scalar(2, 1), scalar(1, 2), field(4, F32[:2].tobytes()), packed(7, [1, 2, 3]), field(10, b"\0" * 8)),
    "raw_data beside float_data": initializer(scalar(2, 1), scalar(1, 2), field(4, F32[:2].tobytes()),
                                              field(9, F32[2:4].tobytes())),
    "raw_data, empty, beside float_data": initializer(scalar(2, 1), scalar(1, 0), field(4, F32[:2].tobytes()),
                                                      field(9, b"")),
    "raw_data, a data type and a name given twice": initializer(
        field(8, b"a"), scalar(2, 10), field(9, b"\0" * 3), scalar(1, 2), field(9, F32[:2].tobytes()), scalar(2, 1),
        field(8, b"w")),
    "a data location of no DataLocation value after EXTERNAL, then DEFAULT": initializer(
        scalar(2, 1), scalar(14, 1), scalar(14, 7), scalar(14, 0), field(9, F32[:1].tobytes())),
    "a data location of no DataLocation value": initializer(scalar(2, 1), scalar(14, 7), field(9, F32[:1].tobytes())),
    "external data listed, its location the default": initializer(
        scalar(2, 1), field(13, field(1, b"location") + field(2, b"w.bin")), field(9, F32[:1].tobytes())),
    "two initializers of one name": model(field(5, numpy_helper.from_array(F32[:3], "w").SerializeToString()),
                                          field(5, numpy_helper.from_array(I64[:2], "w").SerializeToString())),
    "an initializer of no name and one of no UTF-8": model(
        field(5, scalar(2, 1) + field(9, F32[:1].tobytes())), field(5, field(8, b"\xff") + scalar(2, 7) + field(
            9, I64[:1].tobytes()))),
    "an empty tensor whose other dims span as many bytes as NumPy counts": initializer(
        field(8, b"w"), scalar(2, 1), packed(1, [0, 2**61 - 1]), field(9, b"")),
    "groups in an initializer": initializer(groups(20, 5), scalar(2, 1), field(9, F32[:1].tobytes()), groups(4, 2)),
}


@pytest.mark.parametrize("name", READ_ALIKE)
def test_weights_of_every_layout_onnx_allows_are_read_as_onnx_reads_them(name: str):
    found = wire_weights(READ_ALIKE[name])
    assert isinstance(found, dict) and found
    assert found == onnx_weights(READ_ALIKE[name])


HUGE = initializer(field(8, b"w"), scalar(2, 1), packed(1, [2**40, 2**40, 2**40]), field(9, b"\0" * 64))
REFUSED_ALIKE = {
    "raw_data a byte short": initializer(scalar(2, 1), scalar(1, 3), field(9, b"\0" * 11)),
    "raw_data a byte long": initializer(scalar(2, 10), scalar(1, 3), field(9, b"\0" * 7)),
    "raw_data for dims of 2**120 values": HUGE,
    "dims whose product wraps to the bytes' count in 64 bits": initializer(
        scalar(2, 1), packed(1, [2**62, 4]), field(9, b"")),
    "an empty tensor of 2**120 values but for its 0": initializer(
        field(8, b"w"), scalar(2, 1), packed(1, [0, 2**40, 2**40, 2**40]), field(9, b"")),
    "an empty tensor whose other dims' product wraps to 0 in 64 bits": initializer(
        scalar(2, 1), packed(1, [0, 2**62, 2**62])),
    "an empty tensor whose other dims span a byte more than NumPy counts": initializer(
        scalar(2, 1), packed(1, [2**61, 0]), field(9, b"")),
    "a negative dim": initializer(scalar(2, 1), packed(1, [-2, -2]), field(9, b"\0" * 16)),
    "a typed field of too few values": initializer(scalar(2, 7), scalar(1, 3), packed(7, [1, 2])),
    "a typed field of too many values": initializer(scalar(2, 1), scalar(1, 3), field(4, b"\0" * 16)),
    "no values at all": initializer(scalar(2, 1), scalar(1, 3)),
    "the values in another type's field": initializer(scalar(2, 10), scalar(1, 2), field(4, F32[:2].tobytes())),
    "a packed float field of 5 bytes": initializer(scalar(2, 1), field(4, b"\0" * 5)),
    "a packed varint cut short": initializer(scalar(2, 7), scalar(1, 2), field(7, b"\x01\x80")),
    "a packed varint of 11 bytes": initializer(scalar(2, 7), field(7, b"\xff" * 10 + b"\x01")),
    "packed dims cut short": initializer(scalar(2, 1), field(1, b"\x83"), field(9, b"\0" * 12)),
    "an undefined data type": initializer(scalar(2, 0), scalar(1, 1), field(9, b"\0")),
    "a data type no ONNX version has": initializer(scalar(2, 99), scalar(1, 1), field(9, b"\0")),
    "a segment": initializer(scalar(2, 1), field(3, scalar(1, 0) + scalar(2, 1)), field(9, b"\0" * 4)),
    "data kept in another file": initializer(field(8, b"w"), scalar(2, 1), scalar(1, 1), field(13, field(
        1, b"location") + field(2, b"no_such_file.bin")), scalar(14, 1)),
}


@pytest.mark.parametrize("name", REFUSED_ALIKE)
def test_weights_onnx_cannot_read_are_refused(name: str):
    assert onnx_weights(REFUSED_ALIKE[name]) == REFUSED
    assert wire_weights(REFUSED_ALIKE[name]) in (REFUSED, NOT_READ)


@pytest.mark.parametrize("elem_type", sorted(set(TensorProto.DataType.values()) - READ_TYPES - {0}))
def test_weights_of_a_type_not_read_are_refused_by_name_though_onnx_reads_them(elem_type: int):
    """bool, the narrow floats and integers, uint32 and the rest: no graph of the package holds them."""
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    if elem_type == TensorProto.STRING:
        tensor = numpy_helper.from_array(np.array(["a", "b"], object), "w")
    else:
        tensor = numpy_helper.from_array(np.zeros(2, dtype), "w")
    assert isinstance(onnx_weights(made(tensor)), dict)
    with pytest.raises(TensorError, match=rf"^initializer 'w' is of data type {elem_type} \(.*\), which is not read "
                                          r"here \(only float32, float16, float64, int32, int64 are\)$"):
        graph_weights(made(tensor))


def test_dims_of_a_huge_size_are_refused_before_anything_is_allocated():
    import time
    import tracemalloc

    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(TensorError, match=r"has dims \[1099511627776, 1099511627776, 1099511627776\] of "
                                              r"float32, 5316911983139663491615228241121378304 bytes, but its "
                                              "raw_data holds 64"):
            graph_weights(HUGE)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20 and time.perf_counter() - start < 1
    finally:
        tracemalloc.stop()
    many = initializer(scalar(2, 7), packed(1, [1] * 33), field(9, b"\0" * 8))
    with pytest.raises(TensorError, match="has 33 dims, more than an array's 32"):
        graph_weights(many)


REFUSED_BY_NAME = {
    "raw_data for dims of 2**120 values": r"initializer 'w' has dims \[1099511627776, .*\d+ bytes, but its raw_data "
                                          "holds 64: not a graph this package writes; rebuild the model dir$",
    "an empty tensor of 2**120 values but for its 0": (
        r"initializer 'w' has dims \[0, 1099511627776, 1099511627776, 1099511627776\] of float32, whose dims other "
        rf"than 0 span {4 * 2**120} bytes, more than NumPy's arrays count \({2**63 - 1}\): not a graph this package"),
    "a data type no ONNX version has": r"initializer '' is of data type 99 \(unknown\), which is not read here \(only "
                                       r"float32, .* are\): not a graph this package writes",
    "data kept in another file": r"initializer 'w' keeps its values in another file \(data_location EXTERNAL\), which "
                                 "is not read here: not a graph",
    "a typed field of too few values": r"initializer '' has dims \[3\], 3 values, but its typed field holds 2:",
    "a packed varint cut short": r"not a readable ONNX graph \(DecodeError\)$",
    "a name of control characters": r"initializer '\\x1b\[2J' is of data type 3 \(int8\), which is not read",
}
REFUSED_ALIKE_OR_BY_TYPE = {**REFUSED_ALIKE, "a name of control characters": initializer(field(8, b"\x1b[2J"),
                                                                                         scalar(2, 3))}


@pytest.mark.parametrize("name", REFUSED_BY_NAME)
def test_a_model_dir_graph_whose_weights_cannot_be_read_is_refused_naming_the_file_and_the_weight(
        tmp_path: Path, name: str):
    data, message = REFUSED_ALIKE_OR_BY_TYPE[name], REFUSED_BY_NAME[name]
    path = tmp_path / "rpn.onnx"
    path.write_bytes(data)
    for given in (data, None):  # the bytes a model dir's check handed over, or the file's
        with pytest.raises(ModelDirError, match=rf"^'{tmp_path}/rpn.onnx': {message}"):
            graph_initializers(path, given)


def test_weights_saved_with_external_data_are_refused_not_read_from_the_other_file(tmp_path: Path):
    """onnx writes a graph's weights into another file where asked (save_as_external_data): the package's exports
    never do, and the other file would be unchecked by the model dir's sha256."""
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40])],
                              [numpy_helper.from_array(F32[8:], "w")])
    onnx.save_model(helper.make_model(graph), tmp_path / "rpn.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="rpn.weights", size_threshold=0)
    assert [t.name for t in onnx.load(tmp_path / "rpn.onnx").graph.initializer] == ["w"]  # its weight in the other
    with pytest.raises(ModelDirError, match=r"rpn.onnx': initializer 'w' keeps its values in another file \("
                                            "data_location EXTERNAL"):
        graph_initializers(tmp_path / "rpn.onnx")
