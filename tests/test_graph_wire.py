"""graph_wire: what an ONNX file declares of its inputs and outputs, read from its wire format alone, is what onnx's
whole parse of the file reads, on every kind of graph the package and its tests build and on damaged and hostile
files; a file it cannot read, onnx cannot read either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from onnx import TensorProto, helper
from tiny import tiny_model_dir
from tiny_graphs import head_graph, pfn_graph

from pointpillars_trt.graph_wire import (ELEMENT_DTYPES, DeclaredTensor, DecodeError, GraphDeclaration,
                                         graph_declaration)

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
    model = export_checkpoint(load_checkpoint(assets / checkpoint), tmp_path / "m", precision=check_precision(precision))
    for graph in ("pfn", "rpn"):
        data = model.onnx_path(graph).read_bytes()
        assert wire_reads(data) == onnx_reads(data), graph


def test_a_graph_cut_at_any_byte_is_read_or_refused_as_onnx_reads_it(built_graphs: dict[str, bytes]):
    data = built_graphs["openpcdet fp32 pfn"]
    outcomes = [wire_reads(data[:cut]) for cut in range(len(data))]
    assert outcomes == [onnx_reads(data[:cut]) for cut in range(len(data))]
    assert outcomes.count(REFUSED) > len(data) // 2  # the cuts that end inside a record


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
