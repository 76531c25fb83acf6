"""What an ONNX file declares of its graph's inputs and outputs, read from its protobuf wire format alone.

A model dir's check compares each graph's inputs and outputs with its record (``model_dir._check_graph_io``). A
whole parse (``onnx.load_model_from_string``) decoded every node and weight of a 24 MB graph, and imported onnx,
which the CPU detector needs for nothing else: ~60 ms at every process start. Here only the records the check
reads are decoded (ModelProto.graph; GraphProto.input, .output and the names of .initializer; ValueInfoProto.name
and .type.tensor_type), and every other field is stepped over by its length, as protobuf reads a message: the
occurrences of a message field are one message, merged; a scalar keeps its last value; a field of another wire type
than its own is an unknown field, stepped over; and bytes that protobuf cannot read are a ``DecodeError``. The
records stepped over are not decoded, so damage inside them (a node's attributes, a weight's data) is left to the
engine that reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

#: ONNX's element types (TensorProto.DataType) by the NumPy dtype onnx reads each as (ml_dtypes' for the narrow
#: floats and integers); a type not listed is named by its number.
ELEMENT_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "object", 9: "bool",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128", 16: "bfloat16",
    17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2", 27: "float6_e2m3fn", 28: "float6_e3m2fn",
}

# Field numbers (onnx.proto) of the records read; each message's other fields are stepped over.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 5, 11, 12
_TENSOR_NAME = 8  # TensorProto.name: an initializer's
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TYPE_OTHER = frozenset({4, 5, 7, 8, 9})  # sequence, map, opaque, sparse tensor, optional: the oneof's other types
_TENSOR_ELEM_TYPE, _TENSOR_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2

_VARINT, _FIXED64, _LENGTH, _GROUP_START, _GROUP_END, _FIXED32 = range(6)
#: Messages and groups nested deeper than this are refused, as protobuf's parser refuses them.
_MAX_DEPTH = 100
_UINT64 = (1 << 64) - 1


class DecodeError(ValueError):
    """Bytes that are no protobuf message: protobuf's own parser refuses them too."""


class DeclaredTensor(NamedTuple):
    """A graph input or output as its ValueInfoProto declares it: ``elem_type`` 0 where it declares no tensor type;
    each dimension its dim_value, else its dim_param ('' where it has neither). A name or dim_param that is no UTF-8
    is its bytes, as protobuf's Python API gives it."""

    name: str | bytes
    elem_type: int
    dims: tuple[int | str | bytes, ...]


class GraphDeclaration(NamedTuple):
    """A graph's inputs (initializers included, where the file lists them), its outputs and its initializers' names."""

    inputs: tuple[DeclaredTensor, ...]
    outputs: tuple[DeclaredTensor, ...]
    initializers: frozenset[str | bytes]


class _Field(NamedTuple):
    number: int
    wire: int
    value: int  # a varint's value; where a length-delimited field's payload starts
    end: int  # where the field ends (a length-delimited one's payload)


def graph_declaration(data: bytes) -> GraphDeclaration:
    """The inputs, outputs and initializer names that the ONNX model ``data`` declares, as a whole parse of it reads
    them; a ``DecodeError`` where protobuf could not read the records walked."""
    inputs: list[DeclaredTensor] = []
    outputs: list[DeclaredTensor] = []
    initializers: set[str | bytes] = set()
    for graph in _fields(data, 0, len(data), 0):
        if graph.number != _MODEL_GRAPH or graph.wire != _LENGTH:
            continue
        for field in _fields(data, graph.value, graph.end, 1):  # a graph given twice is one, its lists joined
            if field.wire != _LENGTH:
                continue
            if field.number == _GRAPH_INPUT:
                inputs.append(_value_info(data, field, 2))
            elif field.number == _GRAPH_OUTPUT:
                outputs.append(_value_info(data, field, 2))
            elif field.number == _GRAPH_INITIALIZER:
                initializers.add(_last_string(data, field, _TENSOR_NAME, 2))
    return GraphDeclaration(tuple(inputs), tuple(outputs), frozenset(initializers))


def _value_info(data: bytes, record: _Field, level: int) -> DeclaredTensor:
    name: str | bytes = ""
    tensor: list[_Field] = []  # the occurrences of type.tensor_type since the type last became another one
    for field in _fields(data, record.value, record.end, level):
        if field.wire != _LENGTH:
            continue
        if field.number == _VALUE_NAME:
            name = _string(data, field)
        elif field.number == _VALUE_TYPE:
            for kind in _fields(data, field.value, field.end, level + 1):
                if kind.wire == _LENGTH and kind.number == _TYPE_TENSOR:
                    tensor.append(kind)
                elif kind.wire == _LENGTH and kind.number in _TYPE_OTHER:
                    tensor.clear()  # the oneof set to another type: the tensor type is cleared
    elem_type, dims = 0, []
    for part in tensor:
        for field in _fields(data, part.value, part.end, level + 2):
            if field.number == _TENSOR_ELEM_TYPE and field.wire == _VARINT:
                elem_type = _signed(field.value & 0xFFFF_FFFF, 32)  # an int32
            elif field.number == _TENSOR_SHAPE and field.wire == _LENGTH:
                dims += [_dimension(data, dim, level + 4) for dim in _fields(data, field.value, field.end, level + 3)
                         if dim.number == _SHAPE_DIM and dim.wire == _LENGTH]
    return DeclaredTensor(name, elem_type, tuple(dims))


def _dimension(data: bytes, record: _Field, level: int) -> int | str | bytes:
    found: int | str | bytes = ""
    for field in _fields(data, record.value, record.end, level):
        if field.number == _DIM_VALUE and field.wire == _VARINT:
            found = _signed(field.value, 64)  # an int64
        elif field.number == _DIM_PARAM and field.wire == _LENGTH:
            found = _string(data, field)
    return found


def _last_string(data: bytes, record: _Field, number: int, level: int) -> str | bytes:
    """The string field ``number`` of the message ``record`` holds ('' where it has none)."""
    found: str | bytes = ""
    for field in _fields(data, record.value, record.end, level):
        if field.number == number and field.wire == _LENGTH:
            found = _string(data, field)
    return found


def _string(data: bytes, field: _Field) -> str | bytes:
    raw = data[field.value:field.end]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) else value


def _fields(data: bytes, pos: int, end: int, level: int) -> Iterator[_Field]:
    """The fields of the message ``data[pos:end]``, nested ``level`` messages deep, in their order; a group (a wire
    type no ONNX field has) is stepped over whole, the groups in it included."""
    while pos < end:
        number, wire, pos = _tag(data, pos, end)
        if wire == _LENGTH:
            start, pos = _payload(data, pos, end)
            yield _Field(number, wire, start, pos)
        elif wire == _VARINT:
            value, pos = _varint(data, pos, end)
            yield _Field(number, wire, value, pos)
        else:
            pos = _skip_group(data, pos, end, number, level) if wire == _GROUP_START else _skip(data, pos, end, wire)
            yield _Field(number, wire, 0, pos)


def _skip_group(data: bytes, pos: int, end: int, number: int, level: int) -> int:
    """Where the group ``number`` whose fields start at ``pos`` ends, past its end tag."""
    open_groups = [number]
    while open_groups:
        if level + len(open_groups) > _MAX_DEPTH:
            raise DecodeError("groups nested too deep")
        number, wire, pos = _tag(data, pos, end)
        if wire == _GROUP_START:
            open_groups.append(number)
        elif wire == _GROUP_END:
            if number != open_groups.pop():
                raise DecodeError(f"group {number} ends in another")
        else:
            pos = _skip(data, pos, end, wire)
    return pos


def _skip(data: bytes, pos: int, end: int, wire: int) -> int:
    """Where the value of wire type ``wire`` that starts at ``pos`` ends (no group's)."""
    if wire == _VARINT:
        return _varint(data, pos, end)[1]
    if wire == _LENGTH:
        return _payload(data, pos, end)[1]
    if wire not in (_FIXED32, _FIXED64):  # the end of a group not open, or a wire type protobuf has none of
        raise DecodeError(f"wire type {wire} where no field can have it")
    stop = pos + (4 if wire == _FIXED32 else 8)
    if stop > end:
        raise DecodeError("a fixed-size field runs past its message's end")
    return stop


def _payload(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Where the payload of the length-delimited field whose length is at ``pos`` starts and ends."""
    size, start = _varint(data, pos, end)
    if size > end - start:
        raise DecodeError("a field runs past its message's end")
    return start, start + size


def _tag(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, where the field's value starts) of the tag at ``pos``."""
    tag, pos = _varint(data, pos, end, most=5)
    if tag >> 32 or not tag >> 3:
        raise DecodeError(f"tag {tag} names no field")
    return tag >> 3, tag & 7, pos


def _varint(data: bytes, pos: int, end: int, most: int = 10) -> tuple[int, int]:
    """The varint at ``pos`` (the low 64 bits of one of at most ``most`` bytes) and where it ends."""
    value = shift = 0
    for index in range(pos, min(pos + most, end)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _UINT64, index + 1
        shift += 7
    raise DecodeError("a varint runs past its message's end or is too long")
