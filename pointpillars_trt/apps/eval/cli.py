"""``pointpillars-trt eval``: KITTI AP of a folder of predictions against label_2 ground truth."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ...errors import InputError, agree, counted, escape_text, printable_text, safe_repr
from ...file_reads import check_input_folder
from ...file_writes import check_writable_file, write_text_atomic
from ...kitti import KITTI_IMAGE_SHAPE, KITTI_IMAGE_WORDS, named_as_given
from ..infer import camera_options_given
from ..frame_prep import check_image_shape
from ..ranges import image_shape_arg, path_name
from .io import CALIB_FILES, PREDICTION_FILES, REPORT_FILE, Annotations, check_label_folder, list_prediction_ids, \
    load_ground_truth, load_predictions, prediction_format, read_frame_ids, refuse_unlabelled_predictions
from .kitti_eval import (DEFAULT_CLASSES, canonical_class, check_label_types, check_prediction_heights,
                         check_prediction_types, evaluate, uncounted_note)
from .report import format_comparison, format_table


def add_eval_parser(sub: Any) -> None:
    """Register ``eval`` on the main CLI's subparsers."""
    p = sub.add_parser(
        "eval", help="KITTI 3D object AP (bbox, BEV, 3D, AOS; R11 and R40) of predictions against label_2 files",
        description="KITTI 3D object benchmark of a prediction folder (infer --format kitti, or --format json "
                    "with --calib) against label_2 files: AP for Car, Pedestrian and Cyclist at easy, moderate "
                    "and hard, for bbox, BEV, 3D and AOS, at 11 and 40 recall points, printed as OpenPCDet's "
                    "test.py prints it."
    )
    p.add_argument("--pred", required=True, metavar="DIR", type=path_name,
                   help="predictions (required): KITTI .txt files with a score (infer --format kitti) "
                        "or infer --format json files (these need --calib)")
    p.add_argument("--labels", required=True, metavar="DIR", type=path_name,
                   help="KITTI label_2 folder of <id>.txt ground truth (required)")
    p.add_argument("--calib", metavar="DIR", type=path_name,
                   help="KITTI calib folder, to place the lidar boxes of JSON predictions in the camera frame "
                        "(default: none; needed for JSON predictions only)")
    p.add_argument("--image-shape", type=image_shape_arg, metavar="H,W", default=None,
                   help="camera image size in pixels, for every frame: where the 2D boxes of JSON predictions "
                        "are clipped (default: the calib folder's sibling image_2/<id>.png when there is one, "
                        f"else {KITTI_IMAGE_SHAPE[0]},{KITTI_IMAGE_SHAPE[1]}, said in one note; JSON predictions only)")
    p.add_argument("--format", choices=("kitti", "json"),
                   help="the predictions read from a folder that holds both kinds (infer's --format kitti .txt "
                        "files and its JSON files of the same frames): kitti or json, for --pred and --compare alike "
                        "(default: each folder's one kind)")
    p.add_argument("--ids", metavar="FILE", type=path_name,
                   help="frame ids to evaluate, one per line, e.g. ImageSets/val.txt or a pipe, <(cmd) "
                        "(default: every prediction file in --pred)")
    p.add_argument("--json", metavar="OUT",
                   help="also write the --pred AP as JSON {class: {metric: {R11, R40}}, loose: {...}} "
                        "(default: no JSON)")
    p.add_argument("--compare", metavar="OTHER_PRED_DIR", type=path_name,
                   help="a second prediction folder (not --pred itself), evaluated on the same frames and shown side by "
                        "side (default: no comparison)")
    p.add_argument("--classes", default=",".join(DEFAULT_CLASSES),
                   help="comma-separated classes out of Car, Pedestrian, Cyclist, Van, Person_sitting, Truck "
                        "(default: %(default)s)")
    p.set_defaults(run=run_eval)


def _classes(text: str) -> tuple[str, ...]:
    names = [canonical_class(part) for part in text.split(",") if part.strip()]
    if not names:
        raise InputError("--classes names no class")
    return tuple(dict.fromkeys(names))


def _described(folder: Path | str, predictions: Annotations) -> str:
    """A prediction folder as the report names it, with the JSON boxes outside the camera image that were
    left out (as ``infer --format kitti`` leaves them out), so the count evaluated is no surprise."""
    if not predictions.out_of_view:
        return escape_text(str(folder))  # a line of the report: one line whatever the folder's name
    return (f"{escape_text(str(folder))} ({counted(predictions.out_of_view, 'box', 'boxes')} outside the camera image "
            "left out, as infer --format kitti leaves them out)")


def _assumed_image_note(calib: Path | None, frames: int) -> str | None:
    """The note that JSON predictions' 2D boxes were clipped to KITTI's usual image size for ``frames`` frames
    without --image-shape or a camera image beside the calib folder (another camera's image, e.g. KITTI's
    1224 x 370, clips them elsewhere). The image folder is named as --calib is given (``named_as_given``)."""
    if not frames or calib is None:
        return None
    images = safe_repr(named_as_given(calib.absolute().parent / "image_2", calib))
    have, their, pngs = agree(frames, ("has", "its", "frame's image_2 PNG"), ("have", "their", "frames' image_2 PNGs"))
    return (f"note: {counted(frames, 'JSON prediction frame')} {have} no camera image in {images} to take "
            f"{their} size from, so {their} 2D boxes were clipped to {KITTI_IMAGE_WORDS}; if the "
            f"camera's image is another size, pass --image-shape H,W (e.g. 370,1224) or put the {pngs} there")


def _full_scan_note(folder: Path, kind: str) -> str | None:
    """The note that infer made a folder's predictions without its camera-view crop (its settings record says
    so), as on full scans: KITTI's benchmark counts objects in the camera's view, and OpenPCDet's KITTI models
    see only those points, so such predictions score lower than the same model on camera-view crops. None
    without such a record of its ``kind`` of predictions."""
    from ..run_settings import recorded_fov_only

    if recorded_fov_only(folder, kind) is not False:
        return None
    return (f"note: the predictions in {safe_repr(str(folder))} were made without infer's camera-view crop "
            "(--fov-only false in its settings record): KITTI's benchmark, and OpenPCDet's evaluation, detect on "
            "the camera-view points only; unless the frames were camera-view crops already or the model was "
            "trained on full scans, run infer with --fov-only (the default of --format kitti and --eval) for "
            "comparable APs")


def _unused_camera_note(args: argparse.Namespace, kinds: Collection[str]) -> str | None:
    """The note that --calib / --image-shape went unused: they place and clip JSON predictions' boxes in
    the camera image, and KITTI .txt predictions carry their own 2D boxes (results are the same without
    them). None when they were not given, or a JSON folder used them (``kinds``: the folders' formats)."""
    given = camera_options_given(args)
    folders = [("--pred", args.pred)] + ([("--compare", args.compare)] if args.compare else [])
    if not given or "json" in kinds:
        return None
    where = " and ".join(f"{option} {safe_repr(folder)}" for option, folder in folders)
    they, it = agree(len(given), ("it serves", "it"), ("they serve", "them"))
    return (f"note: {' and '.join(given)} not used: {where} {agree(len(folders), 'holds', 'hold')} KITTI .txt "
            f"predictions, which carry their own 2D boxes; {they} JSON predictions only: drop {it}")


def _prediction_warnings(folder: Path, kind: str, predictions: Annotations,
                         classes: tuple[str, ...]) -> tuple[str | None, ...]:
    """The ``warning:`` lines of a prediction folder (of ``kind`` predictions) that reads but would score 0 without
    a word: types KITTI has not, and (KITTI .txt predictions, whose 2D boxes are their own) 2D boxes too low for
    every difficulty; an InputError when no line is of an evaluated class."""
    types = check_prediction_types(predictions, folder, classes)
    heights = check_prediction_heights(predictions, folder) if kind == "kitti" else None
    return types, heights


def _refuse_json_over_an_input(args: argparse.Namespace) -> None:
    """--json naming a file the evaluation reads (a label, prediction or calib file, the --ids list) would
    replace it with the AP table, and a new file in one of its folders would be read as one by the next
    evaluation: refused before anything is read (infer's ``eval.json`` beside its predictions may be written)."""
    target = os.path.realpath(args.json)
    if args.ids and target == os.path.realpath(args.ids):
        raise InputError(f"--json {safe_repr(args.json)} is the --ids file this evaluation reads: write it elsewhere")
    for option, folder in (("--pred", args.pred), ("--labels", args.labels), ("--compare", args.compare),
                           ("--calib", args.calib)):
        if folder and os.path.dirname(target) == os.path.realpath(folder) and \
                os.path.basename(target) != REPORT_FILE:  # infer's own report beside its predictions: no input
            raise InputError(f"--json {safe_repr(args.json)} lies in {option} {safe_repr(folder)}, whose files this "
                             "evaluation reads: write it elsewhere")


def _same_folder(first: Path, second: Path) -> bool:
    """Whether two folders are one (by any spelling or link); one gone since its check is another's read error."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def run_eval(args: argparse.Namespace) -> int:
    """Evaluate, print the table (and the comparison), write --json and say so; 0 on success."""
    classes = _classes(args.classes)
    pred = Path(args.pred)
    calib = Path(args.calib) if args.calib else None
    labels = Path(args.labels)
    check_input_folder(pred, "--pred", PREDICTION_FILES)
    check_label_folder(labels, "--labels")
    for option, folder, holds in (("--compare", args.compare, PREDICTION_FILES), ("--calib", args.calib, CALIB_FILES)):
        if folder is not None:
            check_input_folder(folder, option, holds)
    if args.compare is not None and _same_folder(pred, args.compare):  # --format reads both alike: one table twice
        raise InputError(f"--compare {safe_repr(args.compare)} is the --pred folder {safe_repr(args.pred)}: a folder "
                         "compared with itself shows the same AP twice; give a second prediction folder (another "
                         "model's, say)")
    if args.json is not None:
        _refuse_json_over_an_input(args)
        check_writable_file(args.json, "--json")  # before the evaluation, not after it
    check_image_shape(args.image_shape, calib)
    # each prediction folder's format, found once (a listing of it) and handed to what reads the folder
    kinds = {folder: prediction_format(Path(folder), args.format) for folder in (args.pred, args.compare) if folder}
    ids = read_frame_ids(Path(args.ids)) if args.ids else list_prediction_ids(pred, kinds[args.pred])
    if not ids:
        raise InputError(f"prediction folder {safe_repr(str(pred))} has no prediction files")
    if not args.ids:
        refuse_unlabelled_predictions(pred, kinds[args.pred], labels, ids)
    gt = load_ground_truth(labels, ids)
    predictions = load_predictions(pred, ids, calib, args.image_shape, labels, kinds[args.pred])
    # both folders read before anything is printed: a missing file in the second is one error, not a
    # table followed by one
    others = load_predictions(Path(args.compare), ids, calib, args.image_shape, labels,
                              kinds[args.compare]) if args.compare else None
    # an error when no line could score: before any line
    said = _prediction_warnings(pred, kinds[args.pred], predictions, classes)
    if others is not None:
        said += _prediction_warnings(Path(args.compare), kinds[args.compare], others, classes)
    result = evaluate(gt, predictions, classes)
    # both folders hold the same frames: JSON ones assumed the size for the same frames
    evaluated = (predictions,) if others is None else (predictions, others)
    assumed = max(one.image_assumed for one in evaluated)
    notes = (check_label_types(gt, labels), *said, uncounted_note(result, *evaluated),
             _assumed_image_note(calib, assumed), _unused_camera_note(args, kinds.values()),
             *(_full_scan_note(Path(folder), kind) for folder, kind in kinds.items()))
    for note in notes:
        if note is not None:
            print(note, file=sys.stderr)
    print(f"{counted(len(ids), 'frame')}, predictions {_described(pred, predictions)}")
    print(format_table(result), end="")
    if others is not None:
        other = evaluate(gt, others, classes)
        print()
        print(format_comparison(result, other, _described(pred, predictions), _described(args.compare, others)), end="")
    if args.json is not None:
        text = json.dumps(result.to_json_dict(), indent=2, allow_nan=False)
        write_text_atomic(args.json, text + "\n")
        print(f"wrote {printable_text(str(args.json))}")
    return 0
