"""KITTI 3D object AP (2D bbox, BEV, 3D, AOS) with the rules OpenPCDet's KITTI evaluation applies.

The rules, as that evaluation has them:
- Difficulty (easy, moderate, hard) caps occlusion at 0/1/2 and truncation at 0.15/0.3/0.5 and
  needs a 2D height above 40/25/25 px; ground truth failing a cap is ignored (neither a hit
  nor a miss). A detection lower than the minimum height (strictly) is ignored, whatever its class.
- Van is don't-care for Car, Person_sitting for Pedestrian.
- Ground truth is matched in file order, each taking one free detection whose overlap is
  strictly above the threshold; a match with anything ignored counts neither way.
- For the 2D bbox metric, a false positive mostly inside a DontCare region is forgiven.
- Precision is sampled at up to 41 score thresholds picked from the true-positive scores so that
  recall steps by about 1/40; AP R11 averages every 4th sample, AP R40 the samples 1..40.

Matching is greedy and order dependent, so it cannot be one array expression. Here it runs
over all frames and all score thresholds at once, one step per ground-truth rank within a frame:
the i-th candidate GT of every frame picks at the same time, for every threshold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import InputError, agree, counted, example, safe_repr
from .geometry import box2d_coverage_pairs, box2d_iou_pairs, camera_box_iou_pairs
from .io import Annotations

METRICS = ("bbox", "bev", "3d")
OVERLAP_SETS = ("strict", "loose")
DIFFICULTIES = ("easy", "moderate", "hard")
# (strict, loose) minimum overlaps per metric (bbox, bev, 3d), as OpenPCDet's official evaluation.
CLASS_OVERLAPS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "Car": ((0.7, 0.7, 0.7), (0.7, 0.5, 0.5)),
    "Pedestrian": ((0.5, 0.5, 0.5), (0.5, 0.25, 0.25)),
    "Cyclist": ((0.5, 0.5, 0.5), (0.5, 0.25, 0.25)),
    "Van": ((0.7, 0.7, 0.7), (0.7, 0.5, 0.5)),
    "Person_sitting": ((0.5, 0.5, 0.5), (0.5, 0.25, 0.25)),
    "Truck": ((0.7, 0.7, 0.7), (0.5, 0.5, 0.5)),
}
DEFAULT_CLASSES = ("Car", "Pedestrian", "Cyclist")
#: Every object type a KITTI label_2 line may name (any letter case is read as the same type).
KITTI_TYPES = ("Car", "Van", "Truck", "Pedestrian", "Person_sitting", "Cyclist", "Tram", "Misc", "DontCare")
#: KITTI_TYPES as a line's type is compared (in lower case), and as the messages that name them list them.
_KITTI_TYPES_LOWER = [name.lower() for name in KITTI_TYPES]
_KITTI_TYPES_TEXT = f"{', '.join(KITTI_TYPES[:-1])} or {KITTI_TYPES[-1]}, in any letter case"
_DONT_CARE_FOR = {"car": "van", "pedestrian": "person_sitting"}
_MIN_HEIGHT = (40.0, 25.0, 25.0)
_MAX_OCCLUSION = (0.0, 1.0, 2.0)
_MAX_TRUNCATION = (0.15, 0.3, 0.5)
_SAMPLE_POINTS = 41
_NO_ALPHA = -10.0  # what a detector without orientation writes; AOS is then skipped
_FRAME_CHUNK = 256  # frames whose GT x detection pairs are built at once (bounds memory)
_PAIR_CHUNK = 1 << 18  # GT x detection pairs whose overlaps are computed at once: a frame of thousands of boxes
# on each side (4,000 x 4,000 took 4.1 GB at once) is taken in slices
#: Bounds on the work of one evaluation. A frame's GT x detection pairs: a KITTI frame holds tens of objects and a
#: detector keeps hundreds of boxes (OpenPCDet's NMS_POST_MAXSIZE: 500), and 1,000 x 1,000 pairs take ~0.4 s,
#: ~8 s where every box overlaps every other (a 2-core host); 100,000 lines on each side would take hours.
MAX_FRAME_PAIRS = 1_000_000
#: Same-frame pairs whose boxes overlap, over the whole evaluation: each is kept and matched in memory, once for
#: each of the matching's score thresholds.
MAX_OVERLAPPING_PAIRS = 5_000_000

COUNTS, IGNORED, OTHER = 0, 1, -1  # per-object role for one class and difficulty


@dataclass(frozen=True)
class ClassResult:
    """AP in percent of one class: ap[metric][set, recall, difficulty]; set 0 strict, 1 loose;
    recall 0 = R11, 1 = R40; difficulty easy, moderate, hard. ``counted``: the ground-truth objects each
    difficulty counts (easy, moderate, hard); where none, every AP there is 0 whatever the detections."""

    name: str
    overlaps: tuple[tuple[float, float, float], tuple[float, float, float]]
    ap: dict[str, np.ndarray]
    counted: tuple[int, int, int]


@dataclass(frozen=True)
class EvalResult:
    """AP of every evaluated class; ``aos`` is in ``ap`` only when the detections carry alpha."""

    classes: dict[str, ClassResult]
    num_frames: int

    def to_json_dict(self) -> dict[str, Any]:
        """{class: {metric: {"R11": [e, m, h], "R40": [...]}}, "loose": {same}}."""

        def one_set(index: int) -> dict[str, Any]:
            return {
                name: {
                    metric: {kind: [float(v) for v in ap[index, k]] for k, kind in enumerate(("R11", "R40"))}
                    for metric, ap in result.ap.items()
                }
                for name, result in self.classes.items()
            }

        out = one_set(0)
        out["loose"] = one_set(1)
        return out


# --------------------------------------------------------------------------- overlaps


def _frame_pairs(counts_a: np.ndarray, counts_b: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Row indices (ia, ib) of every same-frame pair of two concatenated tables, at most _PAIR_CHUNK pairs at a
    time (pairs are numbered frame by frame, a row of a's pairs after another), so that a frame of thousands
    of boxes on each side is taken a bounded number of pairs at a time."""
    start_a = np.cumsum(counts_a) - counts_a
    start_b = np.cumsum(counts_b) - counts_b
    per_frame = counts_a.astype(np.int64) * counts_b
    ends = np.cumsum(per_frame)
    total = int(ends[-1]) if len(ends) else 0
    for first in range(0, total, _PAIR_CHUNK):
        number = np.arange(first, min(first + _PAIR_CHUNK, total))
        frame = np.searchsorted(ends, number, side="right")
        local = number - (ends[frame] - per_frame[frame])
        yield start_a[frame] + local // counts_b[frame], start_b[frame] + local % counts_b[frame]


@dataclass(frozen=True)
class _Pairs:
    """Same-frame (GT row, detection row) pairs that overlap in some metric."""

    gt: np.ndarray
    dt: np.ndarray
    overlap: dict[str, np.ndarray]


def _chunks(counts: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(frame start, frame stop, row start, row stop) over groups of _FRAME_CHUNK frames."""
    ends = np.concatenate([[0], np.cumsum(counts)])
    return [
        (f, min(f + _FRAME_CHUNK, len(counts)), int(ends[f]), int(ends[min(f + _FRAME_CHUNK, len(counts))]))
        for f in range(0, len(counts), _FRAME_CHUNK)
    ]


def _overlap_pairs(gt: Annotations, dt: Annotations) -> _Pairs:
    """Overlaps of every same-frame GT x detection pair, kept where the 2D or BEV boxes meet. A frame of more than
    MAX_FRAME_PAIRS pairs, or more than MAX_OVERLAPPING_PAIRS kept in all, is refused: files of thousands of boxes
    a frame, which no detector or label set writes, would take hours and gigabytes."""
    pairs = gt.counts.astype(np.int64) * dt.counts
    if len(pairs) and pairs.max() > MAX_FRAME_PAIRS:
        frame = int(pairs.argmax())
        raise InputError(f"frame {safe_repr(gt.frame_ids[frame])}: {int(gt.counts[frame]):,} label objects x "
                         f"{int(dt.counts[frame]):,} predicted boxes = {int(pairs[frame]):,} pairs to compare, more "
                         f"than eval compares in one frame ({MAX_FRAME_PAIRS:,}; a KITTI frame holds tens of objects, "
                         "a detector keeps hundreds of boxes): are these the label and prediction files you meant?")
    kept = 0
    gts, dts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    bbox, bev, iou3d = [np.zeros(0)], [np.zeros(0)], [np.zeros(0)]
    gt_boxes, dt_boxes = gt.boxes3d, dt.boxes3d
    for (f0, f1, g0, _), (_, _, d0, _) in zip(_chunks(gt.counts), _chunks(dt.counts)):
        for ig, idt in _frame_pairs(gt.counts[f0:f1], dt.counts[f0:f1]):
            ig, idt = ig + g0, idt + d0
            o2d = box2d_iou_pairs(gt.bbox[ig], dt.bbox[idt])
            obev, o3d = camera_box_iou_pairs(gt_boxes[ig], dt_boxes[idt])
            keep = (o2d > 0) | (obev > 0)
            kept += int(keep.sum())
            if kept > MAX_OVERLAPPING_PAIRS:
                raise InputError(f"the predicted boxes overlap label objects in more than {MAX_OVERLAPPING_PAIRS:,} "
                                 "pairs, more than eval matches in bounded memory (an object overlaps a few boxes of "
                                 "its frame as a rule): are these the label and prediction files you meant?")
            gts.append(ig[keep])
            dts.append(idt[keep])
            bbox.append(o2d[keep])
            bev.append(obev[keep])
            iou3d.append(o3d[keep])
    return _Pairs(
        np.concatenate(gts),
        np.concatenate(dts),
        {"bbox": np.concatenate(bbox), "bev": np.concatenate(bev), "3d": np.concatenate(iou3d)},
    )


def _dontcare_coverage(gt: Annotations, dt: Annotations) -> np.ndarray:
    """(N_dt,) largest fraction of each detection's 2D box inside one DontCare box of its frame."""
    is_dc = gt.names == "DontCare"
    dc_counts = np.bincount(gt.frame_of_row[is_dc], minlength=len(gt.counts))
    dc_boxes = gt.bbox[is_dc]
    coverage = np.zeros(len(dt.score))
    for idc, idt in _frame_pairs(dc_counts, dt.counts):
        np.maximum.at(coverage, idt, box2d_coverage_pairs(dt.bbox[idt], dc_boxes[idc]))
    return coverage


# --------------------------------------------------------------------------- roles


def _roles(
    gt: Annotations, dt: Annotations, gt_names: np.ndarray, dt_names: np.ndarray, cls: str, difficulty: int
) -> tuple[np.ndarray, np.ndarray]:
    """COUNTS / IGNORED / OTHER for every GT row and every detection row (names in lower case)."""
    name = cls.lower()
    height = gt.bbox[:, 3] - gt.bbox[:, 1]
    too_hard = (
        (gt.occluded > _MAX_OCCLUSION[difficulty])
        | (gt.truncated > _MAX_TRUNCATION[difficulty])
        | (height <= _MIN_HEIGHT[difficulty])
    )
    same = gt_names == name
    similar = gt_names == _DONT_CARE_FOR.get(name, "")
    gt_role = np.where(same & ~too_hard, COUNTS, np.where(similar | same, IGNORED, OTHER))
    dt_height = np.abs(dt.bbox[:, 3] - dt.bbox[:, 1])
    dt_same = dt_names == name
    dt_role = np.where(dt_height < _MIN_HEIGHT[difficulty], IGNORED, np.where(dt_same, COUNTS, OTHER))
    return gt_role, dt_role


# --------------------------------------------------------------------------- matching


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices start[0]..start[0]+len[0]-1, start[1].., as one array."""
    offsets = starts - (np.cumsum(lengths) - lengths)
    return np.repeat(offsets, lengths) + np.arange(lengths.sum())


def _greedy_match(
    pair_gt: np.ndarray, pair_dt: np.ndarray, pair_score: np.ndarray, frame_of_gt: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Match GT in file order to their most preferred free detection, for every score threshold.

    Pairs must be sorted by GT row, then by preference. A detection is free at threshold t while
    no earlier GT took it and its score is >= t. Returns (gts, chosen, none): the distinct GT
    rows, the chosen pair index per (gt, threshold), and the value chosen holds for no match.
    """
    none = len(pair_gt)
    gts, seg_start, seg_len = np.unique(pair_gt, return_index=True, return_counts=True)
    dets, det_slot = np.unique(pair_dt, return_inverse=True)
    frames = frame_of_gt[gts]
    rank = np.arange(len(gts)) - np.searchsorted(frames, frames, side="left")
    by_rank = np.argsort(rank, kind="stable")
    rank_bounds = np.searchsorted(rank[by_rank], np.arange(rank.max(initial=-1) + 2))
    scored = pair_score[:, None] >= thresholds[None, :]
    taken = np.zeros((len(dets), len(thresholds)), dtype=bool)
    chosen = np.full((len(gts), len(thresholds)), none, dtype=np.int64)
    for r in range(len(rank_bounds) - 1):
        sel = by_rank[rank_bounds[r] : rank_bounds[r + 1]]  # one GT per frame, frames independent
        lengths = seg_len[sel]
        idx = _concat_ranges(seg_start[sel], lengths)
        free = scored[idx] & ~taken[det_slot[idx]]
        first = np.minimum.reduceat(np.where(free, idx[:, None], none), np.cumsum(lengths) - lengths, axis=0)
        chosen[sel] = first
        hit_gt, hit_t = np.nonzero(first < none)
        taken[det_slot[first[hit_gt, hit_t]], hit_t] = True
    return gts, chosen, none


def _score_thresholds(tp_scores: np.ndarray, num_gt: int) -> np.ndarray:
    """Scores at which recall passes 0, 1/40, 2/40, ... (the last score always closes the list).

    Walking down the sorted scores, score i is kept when recall (i+1)/n is nearer the next
    target than recall (i+2)/n would be; each kept score moves the target on by 1/40.
    """
    scores = np.sort(tp_scores)[::-1]
    n = len(scores)
    i = np.arange(n)
    left = (i + 1) / num_gt
    right = np.where(i < n - 1, (i + 2) / num_gt, left)
    kept: list[float] = []
    target, start = 0.0, 0
    while start < n:
        ok = ~((right[start:] - target) < (target - left[start:]))
        ok[-1] = True
        start += int(np.argmax(ok))
        kept.append(float(scores[start]))
        target += 1 / (_SAMPLE_POINTS - 1.0)
        start += 1
    return np.array(kept, dtype=np.float64)


@dataclass(frozen=True)
class _Inputs:
    """What one class and difficulty needs from the annotations, shared by all metrics."""

    gt_role: np.ndarray
    dt_role: np.ndarray
    frame_of_gt: np.ndarray
    score: np.ndarray
    gt_alpha: np.ndarray
    dt_alpha: np.ndarray
    dc_coverage: np.ndarray


def _curves(
    data: _Inputs, pairs: _Pairs, metric: str, min_overlap: float, with_aos: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(precision, orientation similarity) at 41 samples, each already made non-increasing."""
    precision, aos = np.zeros(_SAMPLE_POINTS), np.zeros(_SAMPLE_POINTS)
    num_gt = int(np.count_nonzero(data.gt_role == COUNTS))
    overlap = pairs.overlap[metric]
    cand = (data.gt_role[pairs.gt] != OTHER) & (data.dt_role[pairs.dt] != OTHER) & (overlap > min_overlap)
    cg, cd, co = pairs.gt[cand], pairs.dt[cand], overlap[cand]
    if num_gt == 0 or cg.size == 0:
        return precision, aos
    score, role = data.score[cd], data.dt_role[cd]

    # Pass 1: each GT takes its highest-scoring free detection; true-positive scores give thresholds.
    order = np.lexsort((cd, -score, cg))
    gts, chosen, none = _greedy_match(cg[order], cd[order], score[order], data.frame_of_gt, np.array([-np.inf]))
    pick = order[np.minimum(chosen[:, 0], none - 1)]
    hit = (chosen[:, 0] < none) & (data.gt_role[gts] == COUNTS) & (role[pick] == COUNTS)
    thresholds = _score_thresholds(score[pick[hit]], num_gt)
    if thresholds.size == 0:
        return precision, aos

    # Pass 2, per threshold: a counted detection with the largest overlap, else the first ignored one.
    order = np.lexsort((cd, np.where(role == COUNTS, -co, 0.0), role != COUNTS, cg))
    gts, chosen, none = _greedy_match(cg[order], cd[order], score[order], data.frame_of_gt, thresholds)
    pick = order[np.minimum(chosen, none - 1)]
    tp = (chosen < none) & (data.gt_role[gts] == COUNTS)[:, None] & (role[pick] == COUNTS)
    num_tp = tp.sum(axis=0)

    fp_pool = data.dt_role == COUNTS
    if metric == "bbox":
        fp_pool &= ~(data.dc_coverage > min_overlap)
    pool_scores = np.sort(data.score[fp_pool])
    above = len(pool_scores) - np.searchsorted(pool_scores, thresholds, side="left")
    matched = chosen < none
    in_pool = np.nonzero(matched)[1][fp_pool[cd[pick[matched]]]]
    num_fp = above - np.bincount(in_pool, minlength=len(thresholds))

    denom = (num_tp + num_fp).astype(np.float64)
    t = len(thresholds)
    precision[:t] = np.divide(num_tp, denom, out=np.zeros(t), where=denom > 0)
    precision[:t] = np.maximum.accumulate(precision[:t][::-1])[::-1]
    if with_aos:
        similarity = (1.0 + np.cos(data.gt_alpha[gts][:, None] - data.dt_alpha[cd[pick]])) / 2.0
        sim = np.where(tp, similarity, 0.0).sum(axis=0)
        aos[:t] = np.divide(sim, denom, out=np.zeros(t), where=denom > 0)
        aos[:t] = np.maximum.accumulate(aos[:t][::-1])[::-1]
    return precision, aos


def _average_precision(curve: np.ndarray) -> tuple[float, float]:
    """(AP R11, AP R40) in percent from a 41-sample precision curve."""
    return float(curve[0::4].sum() / 11 * 100), float(curve[1:].sum() / 40 * 100)


# --------------------------------------------------------------------------- entry point


def canonical_class(name: str) -> str:
    """A class name in any letter case -> its KITTI spelling; unknown names are an InputError."""
    for known in CLASS_OVERLAPS:
        if known.lower() == name.strip().lower():
            return known
    raise InputError(f"class {name!r} is not a KITTI class (known: {', '.join(CLASS_OVERLAPS)})")


def _type_counts(names: np.ndarray) -> str:
    """'Vehicle' (12), '1' (3), ... for the types ``names`` holds, most frequent first, at most five named."""
    kinds, counts = np.unique(names, return_counts=True)
    order = np.lexsort((kinds, -counts))
    shown = ", ".join(f"{safe_repr(str(kinds[i]), 40)} ({counts[i]})" for i in order[:5])
    return shown + (f" and {counted(len(kinds) - 5, 'more type')}" if len(kinds) > 5 else "")


def _some_of(some: int, lines: int, noun: str) -> str:
    """'2 of the 3 label lines' for a message, and 'the one label line' where ``lines`` is one."""
    return agree(lines, f"the one {noun}", f"{some} of the {counted(lines, noun)}")


def check_prediction_types(dt: Annotations, folder: object, classes: tuple[str, ...]) -> str | None:
    """The ``warning:`` line for prediction lines of a type KITTI has not (a class index such as ``1``, another
    dataset's ``Vehicle``): they match no ground truth and count for no class, so a model writing them scores
    0 without a word. None when every type is KITTI's or there is no line (a model may find nothing). Raises
    InputError when no line is of an evaluated class (``classes``): every AP would be 0 for the names alone."""
    lower = np.char.lower(dt.names.astype(str))
    objects = lower != "dontcare"
    if not objects.any():
        return None
    unknown = ~np.isin(lower, _KITTI_TYPES_LOWER)
    where = safe_repr(str(folder))
    if not np.isin(lower, [c.lower() for c in classes]).any():
        found = _type_counts(dt.names[objects])
        if unknown.any():
            fix = (f"name each line's type as KITTI does ({_KITTI_TYPES_TEXT}), not by a class index or another "
                   "dataset's name")
        else:
            evaluable = [c for c in CLASS_OVERLAPS if c.lower() in set(lower.tolist())]
            fix = (f"evaluate them with eval --classes {','.join(evaluable)}" if evaluable else
                   f"eval evaluates {', '.join(CLASS_OVERLAPS)} only")
        raise InputError(f"no prediction line in {where} is of a class evaluated ({', '.join(classes)}), so every "
                         f"AP would be 0: their types are {found}; {fix}")
    if not unknown.any():
        return None
    some = int(unknown.sum())
    are, types, they = agree(some, ("is", "a type", "it matches no ground truth and counts"),
                             ("are", "types", "they match no ground truth and count"))
    return (f"warning: {_some_of(some, int(objects.sum()), 'prediction line')} in {where} {are} of {types} KITTI has "
            f"not, {_type_counts(dt.names[unknown])}: {they} for no class; name each line's type as KITTI does "
            f"({_KITTI_TYPES_TEXT})")


def check_label_types(gt: Annotations, folder: object) -> str | None:
    """The ``warning:`` line for label lines of a type KITTI has not (another dataset's ``Vehicle``, a class
    index): such an object is no class's ground truth, neither a miss nor a match, and a detection on it counts
    as a false positive, so labels converted with other names score low without a word. None when every type
    is KITTI's."""
    lower = np.char.lower(gt.names.astype(str))
    unknown = ~np.isin(lower, _KITTI_TYPES_LOWER)
    if not unknown.any():
        return None
    some = int(unknown.sum())
    are, types, they, them = agree(some, ("is", "a type", "it is", "it"), ("are", "types", "they are", "them"))
    return (f"warning: {_some_of(some, len(lower), 'label line')} in {safe_repr(str(folder))} {are} of {types} KITTI "
            f"has not, {_type_counts(gt.names[unknown])}: {they} no class's ground truth, and detections of {them} "
            f"count as false positives; name each line's type as KITTI does ({_KITTI_TYPES_TEXT})")


def _uncounted_difficulties(counted: tuple[int, int, int]) -> str:
    """'every difficulty', or the names of the difficulties that counted no object ('easy, moderate')."""
    if not any(counted):
        return "every difficulty"
    return ", ".join(name for name, count in zip(DIFFICULTIES, counted) if not count)


def uncounted_note(result: EvalResult, *predictions: Annotations) -> str | None:
    """The ``note:`` line for the classes the predictions name that have no ground-truth object to count at
    some difficulty in the frames evaluated (a small subset, labels of other types): AP there is 0 whatever the
    detections, as OpenPCDet prints it, which reads as a model that missed everything. None when there is
    none such (a class predicted nowhere is no surprise at 0)."""
    predicted = {str(name) for dt in predictions for name in np.char.lower(dt.names.astype(str))}
    empty = [f"{name} ({_uncounted_difficulties(cls.counted)})" for name, cls in result.classes.items()
             if name.lower() in predicted and not all(cls.counted)]
    if not empty:
        return None
    frames = agree(result.num_frames, "the one frame", f"these {result.num_frames} frames")
    return (f"note: the ground truth of {frames} has no object to count for "
            f"{'; '.join(empty)}: AP there is 0 whatever the predictions (a difficulty counts an object by its "
            "occlusion, truncation and 2D box height)")


def check_prediction_heights(dt: Annotations, folder: object) -> str | None:
    """The ``warning:`` line for a folder of KITTI .txt predictions most of whose lines have a 2D box lower than
    the lowest minimum height (25 px), as lidar-only boxes written with ``0 0 0 0`` or ``-1 -1 -1 -1`` for their
    2D box have: KITTI's evaluation ignores such detections at every difficulty, in BEV and 3D as well as bbox,
    so they score 0 AP. None when at most half are that low."""
    objects = np.flatnonzero(np.char.lower(dt.names.astype(str)) != "dontcare")
    low = objects[np.abs(dt.bbox[objects, 3] - dt.bbox[objects, 1]) < min(_MIN_HEIGHT)]
    if 2 * len(low) <= len(objects):
        return None
    first = int(low[0])
    box = " ".join(f"{v:g}" for v in dt.bbox[first])
    line = f"frame {safe_repr(dt.frame_ids[dt.frame_of_row[first]], 40)}: {box}"
    # more than half of the lines are low, so one low line is the folder's only line: 'the one prediction line
    # ... has ... it scores', named without 'e.g.'
    have, they = agree(len(low), ("has", "it scores"), ("have", "they score"))
    return (f"warning: {_some_of(len(low), len(objects), 'prediction line')} in {safe_repr(str(folder))} {have} a 2D "
            f"box under {min(_MIN_HEIGHT):g} px high ({example(len(low), line)}), which KITTI's evaluation ignores "
            f"at every difficulty, in BEV and 3D too, so {they} no AP; "
            "boxes without a real 2D box need one projected into the camera image: write them with pointpillars-trt "
            "infer --format kitti (through each frame's calib/ folder, or --calib DIR), or give them as infer's "
            "--format json records to eval --pred with --calib DIR")


def evaluate(gt: Annotations, dt: Annotations, classes: tuple[str, ...] = DEFAULT_CLASSES) -> EvalResult:
    """KITTI AP of detections ``dt`` against ground truth ``gt`` (the same frames, same order)."""
    if gt.frame_ids != dt.frame_ids:
        raise InputError("ground truth and predictions cover different frames")
    names = [canonical_class(c) for c in classes]
    with_aos = len(dt.alpha) > 0 and dt.alpha[0] != _NO_ALPHA
    pairs = _overlap_pairs(gt, dt)
    dc_coverage = _dontcare_coverage(gt, dt)
    frame_of_gt = gt.frame_of_row
    gt_names, dt_names = np.char.lower(gt.names), np.char.lower(dt.names)
    results: dict[str, ClassResult] = {}
    for name in names:
        metrics = METRICS + (("aos",) if with_aos else ())
        ap = {m: np.zeros((len(OVERLAP_SETS), 2, 3)) for m in metrics}
        counted = []
        for difficulty in range(3):
            gt_role, dt_role = _roles(gt, dt, gt_names, dt_names, name, difficulty)
            counted.append(int(np.count_nonzero(gt_role == COUNTS)))
            data = _Inputs(gt_role, dt_role, frame_of_gt, dt.score, gt.alpha, dt.alpha, dc_coverage)
            for s, overlaps in enumerate(CLASS_OVERLAPS[name]):
                for metric, min_overlap in zip(METRICS, overlaps):
                    precision, aos = _curves(data, pairs, metric, min_overlap, with_aos and metric == "bbox")
                    ap[metric][s, :, difficulty] = _average_precision(precision)
                    if with_aos and metric == "bbox":
                        ap["aos"][s, :, difficulty] = _average_precision(aos)
        results[name] = ClassResult(name, CLASS_OVERLAPS[name], ap, (counted[0], counted[1], counted[2]))
    return EvalResult(results, len(gt.frame_ids))
