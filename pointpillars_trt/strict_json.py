"""Strict JSON: no NaN or infinity written, no key repeated or overlong integer read, floats written
with the digits that read back as the same float32 or float64, atomically."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .errors import PointPillarsError, safe_repr
from .file_reads import PathLike, overlong_number
from .file_writes import write_text_atomic


class NonFiniteJSONError(PointPillarsError, ValueError):
    """A NaN or infinity in a value about to be written as JSON (strict JSON has neither).

    Callers drop non-finite detections before writing (``kitti.finite_detections``), so this
    means a bug or an unchecked value; the message names where in the object it sits.
    """


class DuplicateKeyError(PointPillarsError, ValueError):
    """A JSON object that repeats a key: ``json`` keeps the last value silently, so a file edited or merged by
    hand would be read as something other than what it seems to say. The reader names the file."""


def loads_json(data: str | bytes) -> Any:
    """``json.loads`` of a file read from disk or given by a user, refusing a key repeated in one object with a
    :class:`DuplicateKeyError` (a ValueError, as json's own errors are) naming the key, and an integer of more
    than ``MAX_INT_DIGITS`` digits with a ValueError saying it is not a number a record holds."""
    return json.loads(data, object_pairs_hook=_unique_keys, parse_int=_json_int)


def _json_int(text: str) -> int:
    """A JSON integer's value, refused when overlong (``overlong_number``)."""
    digits = overlong_number(text)
    if digits is not None:
        raise ValueError(f"an integer of {digits} digits: not a number a record holds")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):
        repeated = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise DuplicateKeyError(f"key {safe_repr(repeated, 80)} appears twice in one object")
    return out


def _where(path: str, index: tuple[int, ...]) -> str:
    return path + "".join(f"[{i}]" for i in index)


def to_jsonable(obj: Any, *, _path: str = "$") -> Any:
    """``obj`` with NumPy scalars and arrays turned into plain Python values, checked for strict JSON.

    Dicts (str keys), lists, tuples, str, int, bool, None and finite floats pass; a NaN or
    infinity anywhere raises :class:`NonFiniteJSONError` naming its place (``$.boxes[3][6]``);
    any other type raises TypeError, as json.dumps would.
    """
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "fc":
            bad = np.argwhere(~np.isfinite(obj))
            if bad.size:
                index = tuple(int(i) for i in bad[0])
                raise NonFiniteJSONError(f"{float(obj[index].real)!r} at {_where(_path, index)} is not valid in strict JSON")
        if obj.dtype.kind in "biufU":
            return obj.tolist()
        return to_jsonable(obj.tolist(), _path=_path)
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item(), _path=_path)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise NonFiniteJSONError(f"{obj!r} at {_path} is not valid in strict JSON")
        return float(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(key, np.generic):
                key = key.item()
            if not isinstance(key, str):
                raise TypeError(f"key {key!r} at {_path} is not a string")
            out[key] = to_jsonable(value, _path=f"{_path}.{key}")
        return out
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, _path=f"{_path}[{i}]") for i, v in enumerate(obj)]
    raise TypeError(f"{type(obj).__name__} at {_path} is not JSON serializable")


def dumps_strict(obj: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text (no NaN/Infinity; NumPy values converted) of ``obj``; see :func:`to_jsonable`.

    With ``indent`` the text is byte for byte what ``json.dumps(to_jsonable(obj), indent=indent)``
    writes, built without the standard library's pure-Python indenting encoder (~20x faster on a
    frame record: lists of floats are formatted with ``float.__repr__`` in one pass).
    """
    if indent is None:
        return json.dumps(to_jsonable(obj), allow_nan=False)
    try:
        return _Indented(" " * indent).encode(obj, 0)
    except NonFiniteJSONError:
        to_jsonable(obj)  # names the place of the first non-finite value
        raise


_encode_str = json.encoder.encode_basestring_ascii  # what json.dumps uses with ensure_ascii


class _Indented:
    """The indented form of json.dumps for the value types :func:`to_jsonable` accepts."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def encode(self, value: Any, level: int) -> str:
        if isinstance(value, str):
            return _encode_str(value)
        if value is None:
            return "null"
        if value is True:
            return "true"
        if value is False:
            return "false"
        if isinstance(value, int) and not isinstance(value, np.generic):
            return int.__repr__(value)
        if isinstance(value, float):
            return _float_text(value)
        if isinstance(value, np.ndarray):
            return self.encode(value.tolist(), level)
        if isinstance(value, np.generic):
            return self.encode(value.item(), level)
        if isinstance(value, Mapping):
            return self._mapping(value, level)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, level)
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    def _mapping(self, value: Mapping[Any, Any], level: int) -> str:
        if not value:
            return "{}"
        items = []
        for key, item in value.items():
            if isinstance(key, np.generic):
                key = key.item()
            if not isinstance(key, str):
                raise TypeError(f"key {key!r} is not a string")
            items.append(f"{_encode_str(key)}: {self.encode(item, level + 1)}")
        return self._wrap("{", items, "}", level)

    def _sequence(self, value: list[Any] | tuple[Any, ...], level: int) -> str:
        if not value:
            return "[]"
        if all(type(v) is float for v in value):
            return self._wrap("[", _float_texts(list(value)), "]", level)
        if all(type(v) is list and v for v in value):
            flat = [x for row in value for x in row]
            if all(type(x) is float for x in flat):  # rows of floats (boxes): one formatting pass
                texts, start, rows = _float_texts(flat), 0, []
                for row in value:
                    rows.append(self._wrap("[", texts[start : start + len(row)], "]", level + 1))
                    start += len(row)
                return self._wrap("[", rows, "]", level)
        return self._wrap("[", [self.encode(v, level + 1) for v in value], "]", level)

    def _wrap(self, opening: str, items: Iterable[str], closing: str, level: int) -> str:
        inner = "\n" + self.unit * (level + 1)
        return opening + inner + ("," + inner).join(items) + "\n" + self.unit * level + closing


def _float_texts(values: list[float]) -> list[str]:
    if not all(map(math.isfinite, values)):
        raise NonFiniteJSONError("non-finite value")
    return list(map(float.__repr__, values))


def _float_text(value: float) -> str:
    if not math.isfinite(value):
        raise NonFiniteJSONError("non-finite value")
    return float.__repr__(value)


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Atomic, durable (fsync'ed) strict-JSON write, indented, NumPy values converted to plain numbers.

    A NaN or infinity anywhere raises :class:`NonFiniteJSONError` (a PointPillarsError and a
    ValueError) naming the file and the place, and nothing is written.
    """
    try:
        text = dumps_strict(obj)
    except NonFiniteJSONError as exc:
        raise NonFiniteJSONError(f"cannot write {safe_repr(path)}: {exc}") from None
    write_text_atomic(path, text + "\n")
