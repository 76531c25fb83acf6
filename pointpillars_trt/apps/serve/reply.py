"""What a ``pointpillars-trt serve`` model must declare and answer, checked on the client's side.

A client trusts nothing that comes over the wire: the model's config must be ours (class names that
can be written into label files, the points input of 4 or 5 values a point, the seven outputs with
their types, and ``velocity`` for a model that predicts it), else the run stops with one line before
any frame is sent; each reply must hold exactly those outputs with their dtypes and consistent
shapes, else that frame fails alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...config import MAX_CLASSES
from ...detections import Detections, FrameStats
from ...errors import BackendError, counted, safe_repr
from ...model_dir import MODEL_IDENTITY_KEYS
from ...strict_json import loads_json


STATS = ("num_points", "num_nonfinite", "num_pillars", "num_pillars_dropped")
#: Counts (``FrameStats`` fields, as STATS) a served model declares since a later version: a reply of a server
#: that does not declare one leaves it 0.
LATER_STATS = ("num_overflowed_scores", "num_overflowed_features")
OUTPUTS = ("boxes", "scores", "labels", *STATS)
VELOCITY = "velocity"  # (1, boxes, 2) FP32, the output of models that predict velocities
NUM_POINT_COLUMNS = (4, 5)  # values a point of the points input: x, y, z, intensity (+ time)
_OUTPUT_TYPES = {"boxes": "TYPE_FP32", "scores": "TYPE_FP32", VELOCITY: "TYPE_FP32",
                 **{name: "TYPE_INT32" for name in ("labels", *STATS, *LATER_STATS)}}
_OUTPUT_DTYPES = {name: np.float32 if kind == "TYPE_FP32" else np.int32 for name, kind in _OUTPUT_TYPES.items()}
#: A class name goes into JSON records and KITTI label lines (space-separated): no spaces, no control characters.
_CLASS_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass(frozen=True)
class ServedModel:
    """What a client needs of a served model's config."""

    class_names: tuple[str, ...]
    max_points: int | None  # the server's points cap, when its config says
    max_boxes: int | None   # the most boxes a request may ask for (its detector's cap), when its config says
    num_point_columns: int  # values a point it takes
    velocity: bool          # whether its replies carry velocities
    point_range: tuple[float, ...] | None = None  # the model's (x, y, z min, then max), when its config says
    fov_points_only: bool | None = None  # trained on the camera view's points only, when its config says
    identity: Mapping[str, object] | None = None  # its weights, config and precision, when its config says
    later_stats: tuple[str, ...] = ()  # those of LATER_STATS its config declares

    @property
    def stats(self) -> tuple[str, ...]:
        """The counts its replies carry (``FrameStats`` fields)."""
        return STATS + self.later_stats

    @property
    def outputs(self) -> tuple[str, ...]:
        return OUTPUTS + self.later_stats + ((VELOCITY,) if self.velocity else ())


def check_model_config(config: object, where: str) -> ServedModel:
    """What a model config (Triton's JSON form) says a client needs; a BackendError naming ``where``
    (server and model) when the config is not a pointpillars-trt model's."""

    def refuse(problem: str) -> BackendError:
        return BackendError(f"{where} is not a pointpillars-trt model: {problem}")

    if isinstance(config, Mapping) and isinstance(config.get("config"), Mapping):
        config = config["config"]  # gRPC's JSON wraps it
    if not isinstance(config, Mapping):
        raise refuse(f"its config is {type(config).__name__}, not an object")
    params = config.get("parameters")
    entry = params.get("class_names") if isinstance(params, Mapping) else None
    text = entry.get("string_value") if isinstance(entry, Mapping) else None
    if not isinstance(text, str):
        raise refuse("its config has no class_names parameter")
    names = tuple(text.split(","))
    bad = next((n for n in names if not _CLASS_NAME.fullmatch(n)), None)
    if bad is not None or len(names) > MAX_CLASSES or len(set(names)) != len(names):
        raise refuse(f"class_names {safe_repr(text, 80)} are not distinct names of letters, digits, '_', '.' or '-'")
    inputs = {i.get("name"): i for i in config.get("input") or [] if isinstance(i, Mapping)}
    points = inputs.get("points")
    dims = _dims(points) if points is not None else None
    if points is None or points.get("data_type") != "TYPE_FP32" or dims not in [[-1, c] for c in NUM_POINT_COLUMNS]:
        raise refuse("it has no FP32 input 'points' of dims [-1, 4] or [-1, 5]")
    outputs = {o.get("name"): o.get("data_type") for o in config.get("output") or [] if isinstance(o, Mapping)}
    velocity = VELOCITY in outputs
    optional = (VELOCITY, *LATER_STATS)  # the others are required
    wrong = [name for name, kind in _OUTPUT_TYPES.items()
             if outputs.get(name) != kind and (name not in optional or name in outputs)]
    if wrong:
        raise refuse(f"its outputs lack or mistype {', '.join(wrong)}")
    assert dims is not None
    return ServedModel(names, _int_parameter(params, "max_points"), _int_parameter(params, "max_boxes"), dims[1],
                       velocity, _point_range(params, refuse), _bool_parameter(params, "fov_points_only", refuse),
                       _identity(params, refuse), tuple(name for name in LATER_STATS if name in outputs))


def _identity(params: object, refuse: Callable[[str], BackendError]) -> Mapping[str, object] | None:
    """The ``model_identity`` parameter: a JSON object of the served model's weights, config and precision (None:
    absent, a server of an older version)."""
    text = _string_parameter(params, "model_identity")
    if text is None:
        return None
    try:
        identity = loads_json(text)
    except (ValueError, RecursionError):
        identity = None
    if not isinstance(identity, dict) or set(identity) != set(MODEL_IDENTITY_KEYS):
        *keys, last = MODEL_IDENTITY_KEYS
        raise refuse(f"model_identity {safe_repr(text, 80)} is not a JSON object of {', '.join(keys)} and {last}")
    return identity


def _string_parameter(params: object, key: str) -> str | None:
    """A parameter's text, or None where it is absent."""
    entry = params.get(key) if isinstance(params, Mapping) else None
    text = entry.get("string_value") if isinstance(entry, Mapping) else None
    return text if isinstance(text, str) else None


def _point_range(params: object, refuse: Callable[[str], BackendError]) -> tuple[float, ...] | None:
    """The ``point_range`` parameter: six finite numbers, each maximum above its minimum (None: absent)."""
    text = _string_parameter(params, "point_range")
    if text is None:
        return None
    try:
        values = tuple(float(word) for word in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 6 or not all(math.isfinite(v) for v in values) or \
            not all(low < high for low, high in zip(values[:3], values[3:])):
        raise refuse(f"point_range {safe_repr(text, 80)} is not six numbers (x, y, z minimum, then maximum)")
    return values


def _bool_parameter(params: object, key: str, refuse: Callable[[str], BackendError]) -> bool | None:
    """A true / false parameter (None: absent)."""
    text = _string_parameter(params, key)
    if text is None:
        return None
    if text not in ("true", "false"):
        raise refuse(f"{key} {safe_repr(text, 40)} is neither true nor false")
    return text == "true"


def _int_parameter(params: object, key: str) -> int | None:
    """A whole-number parameter of a model config, or None where it is absent or not a number."""
    text = _string_parameter(params, key)
    return int(text) if text is not None and text.isdigit() else None


def _dims(spec: Mapping[str, Any]) -> list[int] | None:
    try:
        return [int(d) for d in spec.get("dims") or []]  # gRPC's JSON gives dims as strings
    except (TypeError, ValueError):
        return None


def reply_detections(arrays: Mapping[str, object], names: list[str], served: ServedModel,
                     where: str, sent_points: int) -> Detections:
    """Detections of one reply: ``arrays`` the outputs as NumPy arrays (None when absent), ``names``
    the outputs the reply holds, to a request of ``sent_points`` points (a reply that counts others is another
    frame's). A BackendError naming ``where`` when anything is off."""

    def refuse(problem: str) -> BackendError:
        return BackendError(f"{where} answered {problem}")

    expected, class_names = served.outputs, served.class_names
    if sorted(names) != sorted(expected):
        missing, extra = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
        raise refuse(f"with outputs {safe_repr(names, 120)}" + (f"; missing {', '.join(missing)}" if missing else "")
                     + (f"; unexpected {safe_repr(extra, 60)}" if extra else ""))
    found: dict[str, np.ndarray] = {}
    for name in expected:
        array = arrays.get(name)
        if not isinstance(array, np.ndarray) or array.dtype != _OUTPUT_DTYPES[name]:
            kind = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
            raise refuse(f"{name} as {kind}, expected {np.dtype(_OUTPUT_DTYPES[name])}")
        found[name] = array
    count = found["scores"].shape[-1] if found["scores"].ndim == 2 else -1
    shapes = {"boxes": (1, count, 7), "scores": (1, count), "labels": (1, count), VELOCITY: (1, count, 2),
              **{s: (1, 1) for s in served.stats}}
    odd = next((n for n in expected if found[n].shape != shapes[n]), None)
    if count < 0 or odd is not None:
        raise refuse(f"with inconsistent shapes {', '.join(f'{n} {found[n].shape}' for n in expected)}")
    labels = found["labels"].reshape(-1)
    if labels.size and not (0 <= labels.min() and labels.max() < len(class_names)):
        raise refuse(f"labels outside 0..{len(class_names) - 1} (its {counted(len(class_names), 'class', 'classes')})")
    scores, sizes = found["scores"].reshape(-1), found["boxes"].reshape(-1, 7)[:, 3:6]
    with np.errstate(invalid="ignore"):  # non-finite values are the detections' to drop and count
        if np.any((scores < 0) | (scores > 1)):
            raise refuse("scores outside [0, 1]")
        if np.any(sizes < 0):  # a decoded size is an anchor's times exp(delta): never negative
            raise refuse("boxes of negative size")
    stats = {name: int(found[name][0, 0]) for name in served.stats}
    if min(stats.values()) < 0:
        raise refuse(f"negative counts {stats}")
    if stats["num_points"] != sent_points:
        raise refuse(f"num_points {stats['num_points']} to a frame of {counted(sent_points, 'point')} (another "
                     "frame's reply?)")
    velocity = found[VELOCITY].reshape(-1, 2) if served.velocity else None
    return Detections(found["boxes"].reshape(-1, 7), found["scores"].reshape(-1), labels.astype(np.int32),
                      class_names, FrameStats(**stats), velocity)


def reply_output_names(reply: Any) -> list[str]:
    """Names of the outputs a tritonclient gRPC or HTTP result holds."""
    response = reply.get_response()
    outputs = response.get("outputs") or [] if isinstance(response, Mapping) else response.outputs
    return [str(o.get("name") if isinstance(o, Mapping) else o.name) for o in outputs]
