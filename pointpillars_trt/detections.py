"""The result type every detector returns, CPU or GPU, whatever the checkpoint family."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InputError, counted, safe_repr
from .graph_io import OVERFLOWED_FEATURE


STAGES = ("voxelize", "pfn", "scatter", "rpn", "postprocess")  # keys of ``last_timings``, in frame order


@dataclass(frozen=True)
class FrameStats:
    """What happened to the input on its way to the network (counts, not timings)."""

    num_points: int            # rows given
    num_nonfinite: int = 0     # rows dropped for NaN / inf
    num_pillars: int = 0       # non-empty pillars fed to the network
    num_pillars_dropped: int = 0  # non-empty pillars past the configured maximum
    num_overflowed_scores: int = 0  # class scores (anchors x classes) of a NaN, infinite or absurd logit: overflow
    num_overflowed_features: int = 0  # pillar features (pillars x channels) beyond float16's range: overflow


#: Finite points a frame must have (in the model's point range) for "none of them where they should be"
#: to be worth a warning: none in the range (``misread_finding``), none left by infer's camera-FOV crop.
MISPLACED_FROM = 100


def faces_forward(point_range: Sequence[float] | None) -> bool:
    """Whether a model of ``point_range`` (x_min, y_min, z_min, x_max, y_max, z_max) tells the lidar frame's
    directions, for messages and pictures: a range that starts at x = 0 (KITTI's models see only the points ahead)
    has x forward and y left; one all around the sensor tells none (nuScenes' LIDAR_TOP frame has x right and y
    forward), and none is claimed."""
    return point_range is not None and point_range[0] >= 0


def misread_finding(stats: FrameStats, point_range: Sequence[float] | None) -> tuple[str, str] | None:
    """(kind, finding) for a frame whose stats say its file was probably misread: many points of which none
    made a pillar (all non-finite: not float32 points?; or, of ``MISPLACED_FROM`` finite ones or more, none in the
    model's ``point_range``: millimetres, axes swapped), or all of which made one (a file of zeros: a copy that
    failed?); None for any other frame.
    The finding follows the frame's name ("FRAME: all its 500 points ..."); the CLI and the detector say
    each kind once, from the stats every frame's detections carry (no second look at the points)."""
    if stats.num_points < MISPLACED_FROM or stats.num_pillars > 1 or stats.num_pillars_dropped:
        return None  # pillars dropped: more were made than the model keeps (max_pillars 1 keeps one), said apart
    if stats.num_pillars == 1:
        return "onepillar", (f"all its {stats.num_points} points fall in one pillar: a file of zeros (a copy that "
                             "failed?) or of one repeated point")
    finite = stats.num_points - stats.num_nonfinite
    if not finite:
        return "nonfinite", (f"all its {stats.num_points} points are non-finite (a NaN or infinite x, y, z, "
                             "intensity or, in multi-sweep frames, time lag): is it float32 values in that order?")
    if finite < MISPLACED_FROM:  # a few finite points among many non-finite ones: too few to tell where they belong
        return None
    where = "" if point_range is None else " " + " ".join(
        f"{axis} {lo:g}..{hi:g}" for axis, lo, hi in zip("xyz", point_range[:3], point_range[3:]))
    return "range", (f"none of its {finite} finite points lies in the model's point range{where}: are they metres "
                     f"in the lidar frame ({'x forward, y left, z up' if faces_forward(point_range) else 'z up'})?")


def pillars_dropped_finding(stats: FrameStats) -> tuple[str, str] | None:
    """("pillars", finding) for a frame whose pillars outnumbered the model's ``voxel.max_pillars`` (the finding
    follows the frame's name, as ``misread_finding``'s), or None: the pillars past it are left out, as OpenPCDet
    leaves them, and the boxes they would give with them."""
    if not stats.num_pillars_dropped:
        return None
    return "pillars", (f"{stats.num_pillars_dropped} of its pillars lie beyond the model's voxel.max_pillars "
                       f"({stats.num_pillars} kept) and were left out, as OpenPCDet leaves them out: a larger "
                       "max_pillars in the model's config keeps frames this dense whole")


def overflowed_counts_texts(stats: FrameStats, whose: str) -> list[str]:
    """What a frame's overflowed counts cost, the first naming the frame as ``whose`` ("its", "a frame's"), the rest
    as "its": class scores (``num_overflowed_scores``) give no box (a NaN or 0 score under any threshold) or an
    absurd one, so boxes vanish where an overflow of the box values alone would show in them; pillar features
    (``num_overflowed_features``) make the boxes there meaningless, though an engine's ReLUs may leave them
    finite."""
    texts = []
    if stats.num_overflowed_scores:
        texts.append(f"{stats.num_overflowed_scores} of {whose} class scores overflowed (a NaN, infinite or absurd "
                     "logit), so the boxes there are lost")
        whose = "its"
    if stats.num_overflowed_features:
        texts.append(f"{stats.num_overflowed_features} of {whose} pillar features overflowed (beyond float16's "
                     f"{OVERFLOWED_FEATURE:g}), so the boxes there are meaningless")
    return texts


def overflow_finding(parts: Sequence[str], given: str) -> str:
    """The warning of a frame the network overflowed on: ``parts`` what it did to the boxes and the class scores,
    then the cause and the fix; ``given``: what the points came in ("file", "frame")."""
    return (f"{'; '.join(parts)}: the network overflowed on values far outside what it was trained on (check the "
            f"point layout and the intensity scale, and the {given} for corrupt values)")


@dataclass(frozen=True, eq=False)
class Detections:
    """Boxes in OpenPCDet's lidar convention: (x, y, z_centre, dx=length, dy=width, dz=height, heading).

    ``labels`` are 0-based indices into ``class_names``; rows are in the order the family's own
    post-processing leaves them (OpenPCDet: descending score, or head by head and class by class for
    multi-head models; zhulf0804: grouped by class unless more than its 50-box cap were found).
    ``velocity`` (N, 2) is each box's (vx, vy) in m/s for models that predict it (nuScenes), else None.
    ``to_pcdet_dict`` and ``from_pcdet_dict`` convert to and from OpenPCDet's per-frame ``pred_dicts`` entry.
    """

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    stats: FrameStats = field(default_factory=lambda: FrameStats(0))
    velocity: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def __repr__(self) -> str:
        """A summary a notebook can show: the boxes a class, the frame's counts (the arrays: ``boxes``, ...), where
        the dataclass's own printed every box."""
        names = self.class_names
        counts = sorted(collections.Counter(self.labels.tolist()).items())  # a label beyond the names: its number
        classes = ", ".join(f"{names[label] if 0 <= label < len(names) else label} {n}" for label, n in counts)
        extra = ", with velocity" if self.velocity is not None else ""
        return (f"<Detections: {counted(len(self), 'box', 'boxes')}{': ' + classes if classes else ''}"
                f"{extra}; {self.stats}>")

    def __eq__(self, other: object) -> bool:
        """The same class names, stats and arrays (dtype, shape and values, NaN equal to NaN in its place), so that a
        result compares with another, or with its pickled copy, where comparing the arrays as a dataclass does raised
        NumPy's "truth value of an array is ambiguous". Unhashable: the arrays can change."""
        if not isinstance(other, Detections):
            return NotImplemented
        return (self.class_names == other.class_names and self.stats == other.stats
                and all(_same_array(a, b) for a, b in ((self.boxes, other.boxes), (self.scores, other.scores),
                                                        (self.labels, other.labels), (self.velocity, other.velocity))))

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its arrays as (dtype, shape, bytes): a frame's few boxes reach a writer process for ~4 us
        of the sender's interpreter lock so, against ~8 as arrays (an array's own reduce costs more than its
        data). Unpickled, the arrays are writable, as the original's."""
        velocity = None if self.velocity is None else _packed(self.velocity)
        return _rebuilt, (self.class_names, self.stats, _packed(self.boxes), _packed(self.scores),
                          _packed(self.labels), velocity)

    @property
    def names(self) -> list[str]:
        """Each box's class name (``class_names[label]``)."""
        return [self.class_names[i] for i in self.labels.tolist()]

    def to_json_dict(self, frame: str) -> dict[str, Any]:
        """The per-frame JSON record of ``pointpillars-trt infer`` (strict JSON: every value finite).

        Detections no output holds (``kitti.finite_detections``: a NaN or infinity in their box, score or velocity,
        a box the network overflowed to beyond 10 km or of no size) are left out and counted in
        ``num_nonfinite_boxes``; class scores of a NaN, infinite or absurd logit (the boxes there lost) are counted
        in ``num_overflowed_scores``, pillar features beyond float16's range in ``num_overflowed_features``; headings
        are wrapped into [-pi, pi) (``kitti.normalize_heading``).
        """
        from .kitti import finite_detections, normalize_heading

        boxes64, scores64, names = self.boxes.astype(np.float64).reshape(-1, 7), self.scores.astype(np.float64), self.names
        velocity = None if self.velocity is None else self.velocity.astype(np.float64).reshape(-1, 2)
        boxes, scores, names, velocity, dropped = finite_detections(boxes64, scores64, names, velocity)
        boxes = boxes.copy()
        boxes[:, 6] = normalize_heading(boxes[:, 6])
        boxes = np.round(boxes, 5)
        boxes[:, 6] = np.clip(boxes[:, 6], -np.pi, np.nextafter(np.pi, 0))  # rounding must not leave the range
        record: dict[str, Any] = {
            "frame": frame,
            "boxes_lidar": boxes.tolist(),
            "scores": np.round(scores, 6).tolist(),
            "labels": list(names),
            "num_points": self.stats.num_points,
            "num_pillars": self.stats.num_pillars,
            "num_pillars_dropped": self.stats.num_pillars_dropped,
            "num_nonfinite_points": self.stats.num_nonfinite,
            "num_nonfinite_boxes": dropped,
            "num_overflowed_scores": self.stats.num_overflowed_scores,
            "num_overflowed_features": self.stats.num_overflowed_features,
        }
        if velocity is not None:
            record["velocity"] = np.round(velocity, 5).tolist()
        return record

    def to_pcdet_dict(self) -> dict[str, np.ndarray]:
        """The frame as an entry of OpenPCDet's ``pred_dicts`` (what its detectors' post-processing returns), new
        arrays in its dtypes: ``pred_boxes`` (N, 7) float32, or (N, 9) with (vx, vy) appended for a model that
        predicts velocity; ``pred_scores`` (N,) float32; ``pred_labels`` (N,) int64, 1-based into ``class_names``
        (its ``CLASS_NAMES`` for an OpenPCDet model; pass ``class_names`` to its code for a zhulf0804 one, whose
        order differs). Rows and headings are the detector's, non-finite boxes included (``to_json_dict`` drops
        them). OpenPCDet's dataset code calls ``.cpu()`` on these: ``torch.from_numpy`` each value first."""
        boxes = self.boxes.astype(np.float32).reshape(-1, 7)
        if self.velocity is not None:
            boxes = np.concatenate([boxes, self.velocity.astype(np.float32).reshape(-1, 2)], axis=1)
        return {"pred_boxes": boxes, "pred_scores": self.scores.astype(np.float32),
                "pred_labels": self.labels.astype(np.int64) + 1}

    @classmethod
    def from_pcdet_dict(cls, pred_dict: Mapping[str, Any], class_names: Sequence[str],
                        stats: FrameStats = FrameStats(0)) -> Detections:
        """A ``pred_dicts`` entry of OpenPCDet (``to_pcdet_dict``'s form; NumPy arrays or CPU tensors) as the
        ``Detections`` a detector returns for it: boxes, scores and velocity (the 8th and 9th box columns) float32,
        labels int32 0-based into ``class_names``, the model's ``CLASS_NAMES``. Other keys are ignored; a missing
        key, an array of another shape or kind, or a label outside 1..len(class_names) is an ``InputError``."""
        if not isinstance(pred_dict, Mapping):  # e.g. the whole pred_dicts list
            raise InputError(f"pred_dict: a {type(pred_dict).__name__}, expected one frame's dict (an entry of pred_dicts)")
        if isinstance(class_names, str):  # tuple("Car") would be three classes of one letter
            raise InputError(f"class_names: the str {safe_repr(class_names)}, expected a sequence of names")
        names = tuple(class_names)
        found: dict[str, np.ndarray] = {}
        for key, kind, ndim in (("pred_boxes", "f", 2), ("pred_scores", "f", 1), ("pred_labels", "iu", 1)):
            if key not in pred_dict:
                raise InputError(f"pred_dict: no {key!r} (keys: {safe_repr(sorted(map(str, pred_dict)), 120)})")
            try:
                array = np.asarray(pred_dict[key])
            except (TypeError, ValueError, RuntimeError) as exc:  # a CUDA tensor: torch says to call .cpu()
                raise InputError(f"pred_dict[{key!r}]: not an array ({exc})") from None
            if array.dtype.kind not in kind or array.ndim != ndim:
                raise InputError(f"pred_dict[{key!r}]: {array.ndim}-D {array.dtype}, expected {ndim}-D "
                                 f"{'floats' if kind == 'f' else 'integers'}")
            found[key] = array
        boxes, scores, labels = found["pred_boxes"], found["pred_scores"], found["pred_labels"]
        if boxes.shape[1] not in (7, 9) or not boxes.shape[0] == scores.shape[0] == labels.shape[0]:
            raise InputError(f"pred_dict: pred_boxes {boxes.shape}, pred_scores {scores.shape}, pred_labels "
                             f"{labels.shape}; expected (N, 7) or (N, 9), (N,), (N,)")
        if labels.size and not (1 <= labels.min() and labels.max() <= len(names)):
            raise InputError(f"pred_dict['pred_labels']: outside 1..{len(names)} (1-based into {len(names)} "
                             f"class names, found {labels.min()}..{labels.max()})")
        velocity = boxes[:, 7:].astype(np.float32) if boxes.shape[1] == 9 else None
        return cls(boxes[:, :7].astype(np.float32), scores.astype(np.float32), (labels - 1).astype(np.int32), names,
                   stats, velocity)

    @classmethod
    def empty(cls, class_names: tuple[str, ...], stats: FrameStats, velocity: bool = False) -> Detections:
        """A frame's result of no box, in the dtypes a detector's results hold; ``velocity``: of a model that predicts
        velocities, whose every result holds them (none here), as its detector's empty results do."""
        return cls(np.zeros((0, 7), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), class_names, stats,
                   np.zeros((0, 2), np.float32) if velocity else None)


#: An array as pickled within a ``Detections``: (dtype, shape, bytes).
_PackedArray = tuple[str, tuple[int, ...], bytes]


def _packed(array: np.ndarray) -> _PackedArray:
    return array.dtype.str, array.shape, array.tobytes()


def _rebuilt(class_names: tuple[str, ...], stats: FrameStats, boxes: _PackedArray, scores: _PackedArray,
             labels: _PackedArray, velocity: _PackedArray | None) -> Detections:
    """The ``Detections`` that ``Detections.__reduce__`` took apart, its arrays on bytes of their own (writable)."""
    return Detections(_array(*boxes), _array(*scores), _array(*labels), class_names, stats,
                      None if velocity is None else _array(*velocity))


def _same_array(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _array(dtype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    return np.frombuffer(bytearray(data), dtype).reshape(shape)
