"""Ground truth and predictions for a list of frames, as one flat table each.

Evaluation works on all frames at once, so objects of every frame are concatenated and
``counts`` says how many belong to each frame (in ``frame_ids`` order).

Predictions come as KITTI label_2 lines with a score (``infer --format kitti``), or as the
per-frame JSON of ``infer --format json``; the JSON boxes are lidar boxes, turned into label
lines with the frame's calibration exactly as ``--format kitti`` would write them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError, PointPillarsError, agree, counted, example, safe_repr
from ...file_reads import PathLike, check_input_folder, name_text, read_text_lines
from ...kitti import (detections_to_kitti_lines, first_bad_row, frame_camera, padding_fix,
                      parse_label_lines, read_frame_file, read_label_file, refuse_other_split, respelt_id)
from ...model_dir import METADATA_FILE
from ...strict_json import loads_json
from ..outputs import record_boxes, record_field_problem

#: The report ``infer --eval`` writes beside its predictions; never a prediction itself.
REPORT_FILE = "eval.json"
#: What each folder option holds, as its error names it where a file or nothing is in the folder's place.
PREDICTION_FILES = "prediction files (infer --out: KITTI .txt or JSON, one a frame)"
LABEL_FILES = "label files (KITTI's label_2: <frame id>.txt)"
CALIB_FILES = "calib files (KITTI's calib: <frame id>.txt)"
#: Largest label, prediction or frame-id file read (a KITTI label is ~1 KB, ImageSets/trainval.txt 52 KB).
MAX_TEXT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Annotations:
    """Objects of many frames, concatenated; row arrays are float64 unless noted."""

    frame_ids: tuple[str, ...]
    counts: np.ndarray  # (F,) int64 objects per frame
    names: np.ndarray  # (N,) str, as written (KITTI type)
    truncated: np.ndarray  # (N,)
    occluded: np.ndarray  # (N,)
    alpha: np.ndarray  # (N,)
    bbox: np.ndarray  # (N, 4) x1 y1 x2 y2
    dimensions: np.ndarray  # (N, 3) h w l
    location: np.ndarray  # (N, 3) bottom centre, rect camera frame
    rotation_y: np.ndarray  # (N,)
    score: np.ndarray  # (N,); 0 for ground truth
    out_of_view: int = 0  # JSON prediction boxes outside the camera image, left out as --format kitti leaves them
    image_assumed: int = 0  # JSON prediction frames without a camera image: 2D boxes clipped to KITTI's usual size

    @property
    def frame_of_row(self) -> np.ndarray:
        """(N,) index into frame_ids of each object."""
        return np.repeat(np.arange(len(self.counts)), self.counts)

    @property
    def boxes3d(self) -> np.ndarray:
        """(N, 7) x, y, z, h, w, l, ry, the layout geometry.box3d_iou_pairs takes."""
        return np.column_stack([self.location, self.dimensions, self.rotation_y])


def _json_prediction_lines(path: Path, calib_dir: Path | None, image_shape: tuple[int, int] | None,
                           labels_dir: Path | None) -> tuple[list[str], int, bool]:
    """One ``infer --format json`` record -> (KITTI label lines, boxes outside the camera image, whether the
    image size was assumed), through the frame's calib file and the size of its camera image (``image_shape``,
    else the calib folder's sibling ``image_2/<id>.png``, else KITTI's usual size: infer's order). Out-of-view
    boxes are left out as ``infer --format kitti`` leaves them out. A record whose ``source`` (the point file
    infer read) lies under KITTI's other split than ``labels_dir`` or ``calib_dir`` is refused as ``infer`` refuses
    such a frame: the same ids there are other scenes, which would score as wrong boxes without a word; a record
    without a source (an earlier version's) is taken to be of the labels' split, so ``calib_dir`` of the other one
    is refused."""
    if calib_dir is None:
        raise InputError(f"prediction file {safe_repr(path)} is JSON (lidar boxes); --calib DIR is needed to evaluate it")
    try:
        record = loads_json("\n".join(read_frame_file(path, "prediction file", MAX_TEXT_BYTES)))
        boxes, scores, labels = record_boxes(record)
        problem = record_field_problem(record)
        if problem is not None:
            raise ValueError(problem)
    except (ValueError, RecursionError) as e:
        raise InputError(f"prediction file {safe_repr(path)} is not an infer JSON record: "
                         f"{safe_repr(str(e), 100)}") from None
    frame = record.get("frame") if isinstance(record, dict) else None
    if isinstance(frame, str) and frame != name_text(path.stem):  # a record saved under another frame's name
        raise InputError(f"prediction file {safe_repr(path)} is the record of frame {safe_repr(frame, 60)}, not of "
                         f"{safe_repr(path.stem, 60)}: its boxes would be scored against another frame's labels")
    source = record.get("source") if isinstance(record, dict) else None  # none in an earlier version's record
    if isinstance(source, str):
        for option, folder, whose in (("--labels", labels_dir, "labels'"), ("--calib", calib_dir, "calib files'")):
            try:
                if folder is not None:
                    refuse_other_split(source, folder, option)
            except InputError as e:
                raise InputError(f"prediction file {safe_repr(path)}: {e}; evaluate predictions of frames of the "
                                 f"{whose} split, or give {option} of the frames' own split") from None
    elif labels_dir is not None:  # an earlier version's record names no point file: the labels' split is its frame's
        try:
            refuse_other_split(labels_dir / f"{path.stem}.txt", calib_dir, "--calib")
        except InputError as e:
            raise InputError(f"prediction file {safe_repr(path)}: {e}; give --calib of the labels' split") from None
    for field, values in (("boxes_lidar", boxes), ("scores", scores.reshape(-1, 1))):
        bad = first_bad_row(values)
        if bad is not None:
            raise InputError(f"prediction file {safe_repr(path)}, {field}[{bad[0]}]: {bad[1]}")
    unsized = np.flatnonzero((boxes.reshape(-1, 7)[:, 3:6] <= 0).any(axis=1))
    if unsized.size:
        raise InputError(f"prediction file {safe_repr(path)}, boxes_lidar[{unsized[0]}]: a zero or negative dx, dy "
                         "or dz")
    calib_file = calib_dir / f"{path.stem}.txt"
    camera = frame_camera(calib_file, calib_file, image_shape)
    try:
        kitti = detections_to_kitti_lines(boxes, scores, labels, camera.calib, camera.image_shape)
        return kitti.lines, kitti.dropped_out_of_view, camera.image_assumed
    except PointPillarsError as e:
        raise InputError(f"prediction file {safe_repr(path)}: {e}") from None


def _prediction_files(pred_dir: Path) -> list[Path]:
    """The .txt and .json files of a prediction folder, less the report ``infer --eval`` wrote there and
    hidden files (infer's settings record), so the folder ``infer --eval --out`` made evaluates as it is."""
    return [p for p in pred_dir.iterdir()
            if p.suffix in (".txt", ".json") and p.name != REPORT_FILE and not p.name.startswith(".")]


#: eval's --format: the suffix of each kind of prediction file.
PREDICTION_SUFFIXES = {"kitti": ".txt", "json": ".json"}


def prediction_format(pred_dir: Path, wanted: str | None = None) -> str:
    """'kitti' for a folder of .txt files, 'json' for .json files; ``wanted`` (eval's --format): the kind read from
    a folder holding both (infer writes its --format kitti and json outputs of the same frames into one folder),
    which is an error without it, as is an empty folder or one without files of ``wanted``."""
    if not pred_dir.is_dir():
        raise InputError(f"prediction folder {safe_repr(pred_dir)} does not exist or is not a folder")
    if (pred_dir / METADATA_FILE).is_file():  # else its model.json is read as a frame's JSON record, "model"
        raise InputError(f"prediction folder {safe_repr(pred_dir)} is a model dir (the folder build writes), not "
                         "predictions: evaluate the --out folder of an infer run with it")
    odd_case = sorted(p.name for p in pred_dir.iterdir()  # frame ids (KITTI's are digits), not a README.TXT
                      if p.suffix.lower() in (".txt", ".json") and p.suffix not in (".txt", ".json") and p.stem.isdigit())
    if odd_case:  # on a case-sensitive file system its frame id would find no file: it would be passed over
        raise InputError(f"prediction folder {safe_repr(pred_dir)} holds {safe_repr(odd_case[0])}"
                         + (f" and {len(odd_case) - 1} more" if len(odd_case) > 1 else "")
                         + ", which eval would pass over: name prediction files .txt or .json in lower case, as "
                         "infer writes them")
    kinds = {p.suffix for p in _prediction_files(pred_dir)}
    if wanted is not None and PREDICTION_SUFFIXES[wanted] in kinds:
        return wanted
    if wanted is not None and kinds:
        raise InputError(f"prediction folder {safe_repr(pred_dir)} has no {PREDICTION_SUFFIXES[wanted]} files "
                         f"(--format {wanted}); it holds {'.txt' if '.txt' in kinds else '.json'} files")
    if len(kinds) == 2:
        raise InputError(f"prediction folder {safe_repr(pred_dir)} has both .txt and .json files (infer's --format "
                         "kitti and json outputs share a folder): pass --format kitti to evaluate the .txt files or "
                         "--format json (with --calib) the .json ones")
    if not kinds:
        parts = sorted(p.name for p in pred_dir.glob("detections-*") if p.suffix in (".jsonl", ".parquet"))
        if parts:  # an infer --format jsonl / parquet folder: its rows are frames, not files
            raise InputError(f"prediction folder {safe_repr(pred_dir)} has no .txt or .json files but "
                             f"{counted(len(parts), 'part file')} of rows ({example(len(parts), safe_repr(parts[0]))})"
                             ", which eval does not read: evaluate them as that run's infer with --eval LABEL_DIR "
                             "--skip-existing and the same PATHS, --format and --out (nothing runs again), or write "
                             "--format kitti")
        raise InputError(f"prediction folder {safe_repr(pred_dir)} has no .txt or .json files")
    return "kitti" if kinds == {".txt"} else "json"


def list_prediction_ids(pred_dir: Path, kind: str | None = None) -> list[str]:
    """Frame ids of every prediction file in a folder, sorted; ``kind``: its ``prediction_format`` where the caller
    has it (else found here)."""
    suffix = PREDICTION_SUFFIXES[kind or prediction_format(pred_dir)]
    return sorted(p.stem for p in _prediction_files(pred_dir) if p.suffix == suffix)


#: Suffixes of the files a frame id names (labels, predictions, calib, images, point files): an id ending in
#: one is a file name listed by mistake.
FILE_NAME_SUFFIXES = (".txt", ".json", ".png", ".bin", ".npy", ".pcd")


def read_frame_ids(path: Path) -> list[str]:
    """An ImageSets-style list: one frame id per line, blank lines ignored (a line of several, separated by
    spaces or commas, is refused); a regular file, or a FIFO or a character device (``--ids <(grep ... val.txt)``,
    /dev/stdin), read once."""
    lines = read_text_lines(path, max_bytes=MAX_TEXT_BYTES, what="frame id file", pipes=True)
    ids = [line.strip() for line in lines if line.strip()]
    odd = next((i for i in ids if i in (".", "..") or any(c in i for c in "/\\\0")), None)
    if odd is not None:
        raise InputError(f"frame id file {safe_repr(path)} lists {safe_repr(odd, 60)}, not a file name "
                         "(ids are names like 000123, looked up in each folder)")
    several = next((i for i in ids if any(c.isspace() or c == "," for c in i)), None)
    if several is not None:  # else looked up as one id, '000000 000001.txt', and reported as a missing label file
        raise InputError(f"frame id file {safe_repr(path)} lists {safe_repr(several, 60)}, not one frame id: list one "
                         "frame id a line, as KITTI's ImageSets/*.txt do")
    named = next((i for i in ids if os.path.splitext(i)[1].lower() in FILE_NAME_SUFFIXES), None)
    if named is not None:  # else looked up as '000000.txt.txt' and reported as a missing label file
        stem = os.path.splitext(named)[0]
        raise InputError(f"frame id file {safe_repr(path)} lists {safe_repr(named, 60)}, a file name: list frame ids "
                         f"without the suffix ({safe_repr(stem, 60)}), as KITTI's ImageSets/*.txt do")
    if not ids:
        raise InputError(f"frame id file {safe_repr(path)} lists no frames")
    if len(set(ids)) != len(ids):
        raise InputError(f"frame id file {safe_repr(path)} lists a frame more than once")
    return ids


def check_label_folder(folder: PathLike, option: str) -> None:
    """An InputError unless ``folder``, given as ``option`` (eval's --labels, infer's --eval), is a folder holding
    label files: a folder of none (the velodyne folder given by mistake) would name its first frame's label file
    missing."""
    check_input_folder(folder, option, LABEL_FILES)
    if not any(name.endswith(".txt") for name in os.listdir(folder)):
        raise InputError(f"{option} {safe_repr(str(folder))} holds no label files (<frame id>.txt): give KITTI's "
                         "label_2 folder")


def _stack(frame_ids: Sequence[str], per_frame: list[tuple[list[str], np.ndarray]],
           out_of_view: int = 0, image_assumed: int = 0) -> Annotations:
    table = np.concatenate([rows for _, rows in per_frame]) if per_frame else np.zeros((0, 15))
    return Annotations(
        frame_ids=tuple(frame_ids),
        counts=np.array([len(names) for names, _ in per_frame], dtype=np.int64),
        names=np.array([n for names, _ in per_frame for n in names], dtype=str),
        truncated=table[:, 0],
        occluded=table[:, 1],
        alpha=table[:, 2],
        bbox=table[:, 3:7],
        dimensions=table[:, 7:10],
        location=table[:, 10:13],
        rotation_y=table[:, 13],
        score=table[:, 14],
        out_of_view=out_of_view,
        image_assumed=image_assumed,
    )


def refuse_unlabelled_predictions(pred_dir: Path, kind: str, label_dir: Path, frame_ids: Sequence[str]) -> None:
    """Refuse prediction files of ``pred_dir`` (of ``kind``) that have no label file in ``label_dir``, naming the
    first and the fix: without --ids eval evaluates every prediction file there (``frame_ids``), so one stray file (a
    frame of another split, a broken link) fails the whole evaluation, and the user must learn which file it is."""
    missing = [frame for frame in frame_ids if not os.path.lexists(label_dir / f"{frame}.txt")]
    if not missing:
        return
    first = pred_dir / f"{missing[0]}{PREDICTION_SUFFIXES[kind]}"
    broken = " (a broken symbolic link)" if first.is_symlink() and not first.exists() else ""
    others = len(missing) - 1
    more = f" (and {counted(others, 'more prediction file')} {agree(others, 'has', 'have')} none)" if others else ""
    label = label_dir / f"{missing[0]}.txt"
    there = respelt_id(label)
    if there is not None:  # the prediction files, or the label files, are named without KITTI's zero padding
        fix = f"{safe_repr(there.name)} is there: " + (
            padding_fix("prediction files", f"{there.stem}{first.suffix}", first.name) if len(there.stem) == 6 else
            padding_fix("label files", label.name, there.name))
    else:
        fix = ("without --ids eval evaluates every prediction file in --pred: pass --ids FILE listing the frames to "
               "evaluate (e.g. KITTI's ImageSets/val.txt), or remove the stray files from --pred")
    raise InputError(f"prediction file {safe_repr(os.fspath(first))}{broken} has no label file: "
                     f"{safe_repr(os.fspath(label))} does not exist{more}; {fix}")


def load_ground_truth(label_dir: Path, frame_ids: Sequence[str]) -> Annotations:
    """KITTI label_2 files ``<label_dir>/<id>.txt`` of the given frames (DontCare rows kept)."""
    return read_ground_truth(label_dir, frame_ids).of(frame_ids)


@dataclass(frozen=True)
class GroundTruth:
    """A label folder's files of a run's frames, each read once: ``infer --eval`` reads them all before the
    run (a folder of other files fails there, not after every frame) and evaluates those of the frames that
    went through (``of``)."""

    folder: Path
    per_frame: dict[str, tuple[list[str], np.ndarray]]  # frame id -> its parsed label lines

    def of(self, frame_ids: Sequence[str]) -> Annotations:
        return _stack(frame_ids, [self.per_frame[frame] for frame in frame_ids])


def read_ground_truth(label_dir: Path, frame_ids: Sequence[str]) -> GroundTruth:
    """The label files ``<label_dir>/<id>.txt`` of the given frames, parsed (``parse_label_lines``)."""
    per_frame = {}
    for frame in frame_ids:
        per_frame[frame] = read_label_file(label_dir / f"{frame}.txt", with_score=False)
    return GroundTruth(label_dir, per_frame)


def load_predictions(pred_dir: Path, frame_ids: Sequence[str], calib_dir: Path | None = None,
                     image_shape: tuple[int, int] | None = None, labels_dir: Path | None = None,
                     kind: str | None = None) -> Annotations:
    """Prediction files of the given frames; each frame needs a file, even an empty one. JSON ones are placed
    through ``calib_dir``, clipped to ``image_shape`` (height, width) when given, and refused when their source
    is of KITTI's other split than ``labels_dir`` or ``calib_dir`` (see :func:`_json_prediction_lines`; KITTI .txt predictions
    name no source). ``kind``: the folder's ``prediction_format`` where the caller has it (else found here)."""
    kind = kind or prediction_format(pred_dir)
    per_frame = []
    out_of_view = image_assumed = 0
    for frame in frame_ids:
        if kind == "kitti":
            per_frame.append(read_label_file(pred_dir / f"{frame}.txt", with_score=True, what="prediction file"))
            continue
        path = pred_dir / f"{frame}.json"
        lines, dropped, assumed = _json_prediction_lines(path, calib_dir, image_shape, labels_dir)
        out_of_view += dropped
        image_assumed += assumed
        per_frame.append(parse_label_lines(lines, f"prediction file {safe_repr(os.fspath(path))}", with_score=True))
    return _stack(frame_ids, per_frame, out_of_view, image_assumed)
