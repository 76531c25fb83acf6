"""What an ONNX file declares of its graph's inputs and outputs, and its weights, read from its protobuf wire format
alone.

A model dir's check compares each graph's inputs and outputs with its record (``model_dir._check_graph_io``), and
the GPU pipeline's PFN kernel and cuDNN engine take the graphs' weights (``model_dir.graph_initializers``). A whole
parse (``onnx.load_model_from_string``) decoded every node of a 24 MB graph, and imported onnx, which neither needs
for anything else: ~60 ms at every process start. Here only the records read are decoded (ModelProto.graph;
GraphProto.input, .output and .initializer; ValueInfoProto.name and .type.tensor_type; of an initializer its name,
dims, data type, data location and the field holding its values), and every other field is stepped over by its
length, as protobuf reads a message: the occurrences of a message field are one message, merged; a scalar keeps its
last value; a field of another wire type than its own is an unknown field, stepped over; and bytes that protobuf
cannot read are a ``DecodeError``. The records stepped over are not decoded, so damage inside them (a node's
attributes) is left to the engine that reads them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

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
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_SEGMENT, _TENSOR_NAME, _TENSOR_RAW, _TENSOR_LOCATION = 1, 2, 3, 8, 9, 14
_LOCATIONS = (0, 1)  # DataLocation's DEFAULT and EXTERNAL: a closed enum, whose other values are unknown fields
_EXTERNAL = 1
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
#: The most dimensions an initializer may have: NumPy 1's limit (2's is 64); no weight comes near it.
_MAX_RANK = 32
#: The most bytes NumPy lets the dims of an array count, its 0 dims left out: the range of its index (intp).
_MAX_BYTES = int(np.iinfo(np.intp).max)


class _Storage(NamedTuple):
    """How an element type's values lie: in ``raw_data`` as ``dtype`` (little-endian, as ONNX defines it), else in
    the typed field ``number`` (onnx.helper.tensor_dtype_to_field's), whose unpacked elements have wire type
    ``wire`` (a varint's low bits, as many as the dtype has, are the value: float16 is its uint16 bits in int32_data).
    """

    dtype: np.dtype
    number: int
    wire: int


#: The element types whose initializers are read; each other one is refused by name.
_STORAGE = {
    1: _Storage(np.dtype("<f4"), 4, _FIXED32),  # float32: float_data
    10: _Storage(np.dtype("<f2"), 5, _VARINT),  # float16: int32_data
    11: _Storage(np.dtype("<f8"), 10, _FIXED64),  # float64: double_data
    6: _Storage(np.dtype("<i4"), 5, _VARINT),  # int32: int32_data
    7: _Storage(np.dtype("<i8"), 7, _VARINT),  # int64: int64_data
}


class DecodeError(ValueError):
    """Bytes that are no protobuf message: protobuf's own parser refuses them too."""


class TensorError(ValueError):
    """An initializer protobuf reads whose values are not read here (``reason`` says why: a data type not read, data
    kept in another file, a size its bytes do not hold); ``name`` is the initializer's."""

    def __init__(self, name: str | bytes, reason: str) -> None:
        super().__init__(f"initializer {name!r} {reason}")
        self.name, self.reason = name, reason


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
    for field in _graph_fields(data):
        if field.number == _GRAPH_INPUT:
            inputs.append(_value_info(data, field, 2))
        elif field.number == _GRAPH_OUTPUT:
            outputs.append(_value_info(data, field, 2))
        elif field.number == _GRAPH_INITIALIZER:
            initializers.add(_last_string(data, field, _TENSOR_NAME, 2))
    return GraphDeclaration(tuple(inputs), tuple(outputs), frozenset(initializers))


def graph_weights(data: bytes) -> dict[str | bytes, np.ndarray]:
    """The initializers of the ONNX model ``data`` by name, each as the array ``onnx.numpy_helper.to_array`` makes of
    it (a name given twice: the last one's), read-only and in native byte order: a view of ``data`` where its values
    lie in raw_data (no copy of a 24 MB graph's weights, which the engines copy into their own layouts anyway; a
    caller that keeps one keeps ``data`` alive).
    A ``DecodeError`` where protobuf could not read the records walked; a ``TensorError`` for an initializer of a
    type not read here (those of ``_STORAGE`` are), of external data, or whose dims its values do not fill."""
    return dict(_initializer(data, field) for field in _graph_fields(data) if field.number == _GRAPH_INITIALIZER)


def _graph_fields(data: bytes) -> Iterator[_Field]:
    """The length-delimited fields of the model's graph (a graph given twice is one, its lists joined)."""
    for graph in _fields(data, 0, len(data), 0):
        if graph.number == _MODEL_GRAPH and graph.wire == _LENGTH:
            yield from (field for field in _fields(data, graph.value, graph.end, 1) if field.wire == _LENGTH)


def _initializer(data: bytes, record: _Field) -> tuple[str | bytes, np.ndarray]:
    """An initializer's name and values (a TensorProto); the values of its typed fields in wire order, packed or
    not, as protobuf joins a repeated field's occurrences."""
    name: str | bytes = ""
    elem_type = location = 0
    dims: list[np.ndarray] = []
    raw: _Field | None = None
    segmented = False
    rest: list[_Field] = []  # the typed fields among them: which one holds the values depends on the data type
    for field in _fields(data, record.value, record.end, 2):
        if field.number == _TENSOR_NAME and field.wire == _LENGTH:
            name = _string(data, field)
        elif field.number == _TENSOR_DIMS and field.wire in (_LENGTH, _VARINT):
            dims.append(_varints(data, field).view(np.int64))
        elif field.number == _TENSOR_DATA_TYPE and field.wire == _VARINT:
            elem_type = _signed(field.value & 0xFFFF_FFFF, 32)
        elif field.number == _TENSOR_SEGMENT and field.wire == _LENGTH:
            segmented = True
        elif field.number == _TENSOR_RAW and field.wire == _LENGTH:
            raw = field
        elif field.number == _TENSOR_LOCATION and field.wire == _VARINT and field.value & 0xFFFF_FFFF in _LOCATIONS:
            location = field.value & 0xFFFF_FFFF
        else:
            rest.append(field)
    shape = np.concatenate([np.zeros(0, np.int64), *dims])
    storage = _STORAGE.get(elem_type)
    if storage is None:
        kind = ELEMENT_DTYPES.get(elem_type, "undefined" if elem_type == 0 else "unknown")
        read = ", ".join(str(s.dtype.newbyteorder("=")) for s in _STORAGE.values())
        raise TensorError(name, f"is of data type {elem_type} ({kind}), which is not read here (only {read} are)")
    if segmented:
        raise TensorError(name, "is a segment of a larger tensor, which is not read here")
    if location == _EXTERNAL:
        raise TensorError(name, "keeps its values in another file (data_location EXTERNAL), which is not read here")
    if len(shape) > _MAX_RANK:
        raise TensorError(name, f"has {len(shape)} dims, more than an array's {_MAX_RANK}")
    if (shape < 0).any():
        raise TensorError(name, f"has a negative size in its dims {shape.tolist()}")
    count = 1
    for size in shape.tolist():
        count *= size
    if raw is not None:
        held, needed = raw.end - raw.value, count * storage.dtype.itemsize
        if held != needed:
            raise TensorError(name, f"has dims {shape.tolist()} of {storage.dtype.newbyteorder('=')}, {needed} bytes, "
                                    f"but its raw_data holds {held}")
        values = np.frombuffer(data, storage.dtype, count, raw.value)
    else:
        values = _typed_values(data, [field for field in rest if field.number == storage.number], storage)
        if len(values) != count:
            raise TensorError(name, f"has dims {shape.tolist()}, {count} values, but its typed field holds "
                                    f"{len(values)}")
    # An empty tensor (a 0 in its dims) holds its 0 values whatever its other dims are, but NumPy makes no array of
    # other dims whose bytes its index cannot count: refused here as they are, not as NumPy's bare ValueError.
    spread = storage.dtype.itemsize * math.prod(size for size in shape.tolist() if size)
    if spread > _MAX_BYTES:
        raise TensorError(name, f"has dims {shape.tolist()} of {storage.dtype.newbyteorder('=')}, whose dims other "
                                f"than 0 span {spread} bytes, more than NumPy's arrays count ({_MAX_BYTES})")
    # a view of raw_data as it lies in data (a copy on a big-endian host only), read-only as data's bytes are
    array = values.astype(storage.dtype.newbyteorder("="), copy=False).reshape(shape.tolist())
    array.flags.writeable = False
    return name, array


def _typed_values(data: bytes, fields: list[_Field], storage: _Storage) -> np.ndarray:
    """The values of a typed field's occurrences (``fields``) as ``storage.dtype``."""
    size = storage.dtype.itemsize
    parts: list[np.ndarray] = []
    for field in fields:
        if field.wire not in (_LENGTH, storage.wire):
            continue  # an unknown field
        if storage.wire == _VARINT:
            low = _varints(data, field) & np.uint64((1 << 8 * size) - 1)
            parts.append(low.astype(f"<u{size}").view(storage.dtype))
            continue
        start = field.value if field.wire == _LENGTH else field.end - size  # packed, or the one element
        if (field.end - start) % size:
            raise DecodeError("a packed field's length is no multiple of its elements' size")
        parts.append(np.frombuffer(data, storage.dtype, (field.end - start) // size, start))
    return np.concatenate([np.zeros(0, storage.dtype), *parts])


def _varints(data: bytes, field: _Field) -> np.ndarray:
    """The values (the low 64 bits of each, as uint64) of a varint field: a packed one's payload, or the one."""
    if field.wire == _VARINT:
        return np.array([field.value], np.uint64)
    payload = np.frombuffer(data, np.uint8, field.end - field.value, field.value)
    ends = np.flatnonzero(payload < 0x80)  # each varint's last byte
    if len(payload) and (not len(ends) or ends[-1] != len(payload) - 1):
        raise DecodeError("a packed varint runs past its field's end")
    starts = np.concatenate(([0], ends[:-1] + 1))[:len(ends)]
    lengths = ends + 1 - starts
    if lengths.max(initial=0) > 10:
        raise DecodeError("a packed varint is too long")
    values = np.zeros(len(ends), np.uint64)
    for byte in range(int(lengths.max(initial=0))):
        more = lengths > byte
        values[more] |= (payload[starts[more] + byte] & 0x7F).astype(np.uint64) << np.uint64(7 * byte)
    return values


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
