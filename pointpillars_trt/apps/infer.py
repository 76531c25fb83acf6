"""``pointpillars-trt infer``: detect on point files and write each frame's outputs.

Frames are ``.bin`` (KITTI float32 rows), ``.npy`` or ``.pcd`` files, given as files, folders or
globs. They are read ahead of the detector (by reader threads, or reader processes on a long GPU run),
run ``--batch-size`` at a time. Each frame's outputs are files of its own (JSON record, KITTI label_2
lines, BEV picture), each written atomically, or (``jsonl``, ``parquet``) its row in a part file of many
frames' rows, each part written atomically once complete (``outputs``). A bad frame is reported on one
``error:`` line and the others go on; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import build_command, is_pcdet_model_config
from ..errors import (
    DetectorLost, InputError, ModelDirError, PointPillarsError, SettingNotice, agree, counted, example, one_line,
    printable_text, safe_repr,
)
from ..file_reads import check_input_folder, home_hint, special_kind
from ..file_writes import (TEMP_SUFFIX, PendingFlush, check_writable_folder, folder_held, owned_prefix,
                           remove_stale_folders, remove_stale_temp_files)
from ..graph_io import MAX_BATCH
from ..kernel_limits import SORT_LIMIT
from ..kitti import KITTI_IMAGE_SHAPE, calib_folder, calib_for_frame, refuse_other_split
from ..model_dir import ModelDir, config_change_fix, load_model_dir, rebuild_command
from ..pointcloud_io import MAX_INTENSITY_SCALE, MIN_INTENSITY_SCALE, SUPPORTED_EXTENSIONS
from ..points import MAX_POINT_DIM, MULTI_SWEEP_FIX, columns_text
from ..runtime_options import cpu_threads, pipeline_threads
from ..staging import SIZE_SAMPLE, likely_points_per_frame
from .frame_reads import read_batch
from .frames import FrameReader, FrameRunner, WorkerProcesses
from .outputs import FILE_FORMATS, FILE_SUFFIXES, OUTPUT_FORMATS, ROW_FORMATS, FrameOutput, OutputPlan, RowParts, \
    existing_parts, frame_row, is_full_disk_error, refuse_foreign_outputs, require_pyarrow, \
    row_text, write_frame
from .device_notice import print_device_notice
from .eval.io import CALIB_FILES, REPORT_FILE as EVAL_FILE, GroundTruth, check_label_folder, read_ground_truth
from .exit_codes import EXIT_FRAME_FAILURES
from .frame_paths import check_distinct_outputs, expand_frame_paths, model_kind
from .frame_prep import check_image_shape, frame_preparer
from .frame_report import FrameReport, FrameWarnings, frame_report, frame_warnings
from .ranges import device_arg, float_in, image_shape_arg, int_in, path_name, threads_arg
from .run_settings import SETTINGS_FILE, SettingsRecord, settings_record
from .run_size import DEFAULT_GPU_BATCH, DEFAULT_GPU_PIPELINES, RunSize, cut_note
from .runtime_args import add_model_arguments
from .resume import Resume, frames_to_run, say_resume, skipped_for_eval
from ..runtime.backends import BACKEND_CHOICES

if TYPE_CHECKING:
    from ..detector import PointPillars

#: Writer threads of a run (output encoding and file calls overlap the GPU; its reader threads follow
#: the frames' size: ``frames.reader_threads``).
WRITE_THREADS = min(8, os.cpu_count() or 1)
#: Writer processes of a long GPU run: encoding outputs and the file calls then leave this process's
#: GIL, which the pipelines' threads need (threads alone measured 2.5x slower than the GPU on JSON).
WRITE_PROCESSES = max(1, min(4, (os.cpu_count() or 1) // 4))
WRITE_PROCESSES_FROM = 256  # frames to run (not those skipped); shorter runs do not pay the processes' start
#: Reader processes of a long GPU run (as many runs): reads in threads waited for this process's GIL
#: (``shared_staging``); 4 processes read and checked 16,000 full scans a second on a 16-core H200 host.
READ_PROCESSES = max(1, min(4, (os.cpu_count() or 1) // 4))
#: More pipelines than this on one GPU only add memory (each holds its own buffers and engine).
MAX_PIPELINES = 16


# --------------------------------------------------------------------------- parser

def add_infer_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``infer`` on the main CLI's subparsers."""
    infer = sub.add_parser("infer", help="detect on lidar point files (.bin, .npy, .pcd); one output per frame",
                           description="Detect on lidar point files and write their detections: a file per frame, or with "
                                       "--format jsonl / parquet a few part files of one row per frame.")
    infer.add_argument("paths", nargs="+", metavar="PATH",
                       help=f"point files ({', '.join(SUPPORTED_EXTENSIONS)}), folders of them (their own "
                            "files, not their subfolders), or globs such as 'seq*/velodyne/*.bin' (a path that "
                            "exists is taken literally, even with [ or * in its name); a path that gives no frame "
                            "is an error, and when none gives one, infer stops before the model loads")
    model = infer.add_argument_group("model")
    model.add_argument("--model", type=path_name,
                       help="model dir (from build) or a .pth checkpoint (required unless --server)")
    add_model_arguments(model)
    run = infer.add_argument_group("runtime")
    run.add_argument("--device", type=device_arg, default="auto", help="auto, cpu, cuda or cuda:N")
    run.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                     help="GPU engine backend (the CPU path always uses ONNX Runtime)")
    run.add_argument("--batch-size", type=int_in(1, MAX_BATCH), default=None,
                     help=f"frames run at once on the GPU (1..{MAX_BATCH}; default: {DEFAULT_GPU_BATCH} on the GPU, "
                          "1 on the CPU; at most the frames to run); outputs do not depend on it")
    run.add_argument("--pipelines", type=int_in(1, MAX_PIPELINES), default=None,
                     help=f"pipelines run side by side, each its own thread (and on the GPU its own stream; on the "
                          f"CPU each a detector with its own ONNX Runtime session and its share of the cores) (default: {DEFAULT_GPU_PIPELINES} "
                          "on the GPU, 1 on the CPU; at most one a batch of the frames to run); outputs do not "
                          "depend on it")
    run.add_argument("--threads", type=threads_arg, default=None,
                     help="CPU path: ONNX Runtime threads (default: $OMP_NUM_THREADS, else one per core; with "
                          "--ray, else the cluster's CPUs shared among the workers); more than the cores (with --ray: "
                          "a worker's) runs as many as there are, said in a note")
    run.add_argument("--no-tf32", action="store_true", help="GPU fp32 engines in IEEE fp32 (as the CPU path)")
    run.add_argument("--score-threshold", type=float_in(0.0, 1.0), default=None,
                     help="keep boxes scoring at least this (zhulf0804 models: above it) (default: the model's; no rebuild needed)")
    run.add_argument("--nms-iou", type=float_in(0.0, 1.0), default=None,
                     help="NMS overlap above which the lower-scored box goes (default: the model's)")
    run.add_argument("--max-boxes", type=int_in(1, SORT_LIMIT), default=None,
                     help=f"at most this many boxes a frame (a multi-head model such as nuScenes': a class, as "
                          f"OpenPCDet's multi-class NMS keeps them), 1..{SORT_LIMIT} (default: the model's)")
    points = infer.add_argument_group("points")
    points.add_argument("--point-dim", type=int_in(4, MAX_POINT_DIM), default=None,
                        help=".bin values a point: 4 (KITTI x y z intensity), 5 (nuScenes x y z intensity "
                             "time; multi-sweep models need them), or more (rows with more values after those, "
                             f"which are left out), up to {MAX_POINT_DIM} (default: the model's, 4 for KITTI models)")
    points.add_argument("--intensity-scale", type=float_in(MIN_INTENSITY_SCALE, MAX_INTENSITY_SCALE), default=None,
                        help="multiply intensities by this, e.g. 0.00392156862745098 (1/255) for 0-255 "
                             "intensities given to a model trained on 0-1 (default: as read)")
    points.add_argument("--fov-only", action=argparse.BooleanOptionalAction, default=None,
                        help="detect only on the points inside the camera image (KITTI calib per frame, as "
                             "OpenPCDet's FOV_POINTS_ONLY) (default: on for --format kitti and --eval, else off)")
    outputs = infer.add_argument_group("outputs")
    outputs.add_argument("--out", help="folder for the outputs: a file per frame, or with --format jsonl / parquet part "
                                       "files of one row per frame (default: no files: a line a frame and a summary)")
    outputs.add_argument("--format", choices=OUTPUT_FORMATS, default=None,
                         help="json: a file of lidar boxes per frame; kitti: label_2 lines in the camera frame per "
                              "frame; jsonl / parquet: a few large files of one row per frame (detections-*.jsonl "
                              "/ .parquet) (default: json, or kitti with --eval)")
    outputs.add_argument("--skip-existing", action="store_true",
                         help="skip frames whose outputs are already in --out (resume an interrupted run); with "
                              "--format jsonl / parquet a frame with a row is skipped (a frame keeps one row), even "
                               "when its row holds an error or its --viz picture is missing; --eval evaluates the "
                               "skipped frames too, from their outputs in --out (a record's KITTI lines made again as "
                               "the run makes them); with --ray too, whose workers get only the frames left (local "
                               "paths: a URI cannot be listed here)")
    outputs.add_argument("--retry-failed", action="store_true",
                         help="with --skip-existing and --format jsonl / parquet: rerun the frames whose row holds an "
                               "error, their old rows first removed from the part files (a frame keeps one row)")
    outputs.add_argument("--calib", metavar="DIR", type=path_name,
                         help="KITTI calib folder of <frame id>.txt for --format kitti, --eval and --fov-only "
                              "(default: each frame's sibling calib/ folder)")
    outputs.add_argument("--image-shape", type=image_shape_arg, metavar="H,W", default=None,
                         help="camera image size in pixels: it decides which points the camera-view crop "
                              "(--fov-only) keeps and where KITTI 2D boxes are clipped (default: each frame's "
                              f"image_2 PNG when there is one, else {KITTI_IMAGE_SHAPE[0]},{KITTI_IMAGE_SHAPE[1]}, "
                              "said in one note)")
    outputs.add_argument("--keep-out-of-view", action="store_true",
                         help="--format kitti (or --eval): keep boxes outside the camera image (dropped and "
                              "counted otherwise)")
    outputs.add_argument("--viz", action="store_true",
                         help="also write a bird's-eye-view picture <frame>.png per frame (needs --out, matplotlib)")
    outputs.add_argument("--eval", metavar="LABEL_DIR", type=path_name,
                         help="after the run, KITTI AP of the predictions against this label_2 folder: "
                              f"prints the table and writes {EVAL_FILE} in --out (default: no evaluation); not with "
                              "--ray: evaluate the label files it writes with `pointpillars-trt eval`")
    outputs.add_argument("--no-progress", action="store_true",
                         help="no progress bar (there is one only where stderr is a terminal)")
    infer.set_defaults(run=run_infer)
    return infer


# --------------------------------------------------------------------------- the model

def check_model_path(args: argparse.Namespace) -> Path:
    """--model, given and there: checked before anything runs, also by a run that --skip-existing
    leaves with no frame to run (and so never opens the model)."""
    if not args.model:
        given = next((f"; {safe_repr(path)} among the PATHs is {kind}: give it as --model {safe_repr(path)}"
                      for path in args.paths if (kind := model_kind(path)) is not None), "")
        raise InputError(f"infer needs --model: a model dir (from build) or a .pth checkpoint{given}")
    path = existing_model_path(args.model)
    if args.config and is_pcdet_model_config(args.config):
        what = f"--config {safe_repr(args.config)}: an OpenPCDet model config (MODEL, CLASS_NAMES, ...), which infer does not read"
        if path.is_dir():
            raise InputError(f"{what}: drop it (model dir {safe_repr(args.model)} holds the config it was built for), "
                             f"or rebuild the model dir with it: {build_command(None, args.model, pcdet_config=args.config)}")
        raise InputError(f"{what}: build a model dir of the checkpoint with it, "
                         f"{build_command(args.model, None, pcdet_config=args.config)}, then run `pointpillars-trt infer PATH --model "
                         "MODEL_DIR` (no --config)")
    return path


def existing_model_path(model: str) -> Path:
    """``--model``'s path when something is there (its loader says whether it is a checkpoint file or a model dir);
    else one error line, infer's and bench's alike, that names both (a missing ``x.pth`` is no missing model dir)."""
    path = Path(model)
    if not path.exists():
        if path.is_symlink():  # lexists, not exists: a loop, or a link to nothing
            raise InputError(f"--model {safe_repr(model)}: a symbolic link that leads to no file (a loop, or its "
                             f"target {safe_repr(os.readlink(path))} is gone)")
        raise InputError(f"--model {safe_repr(model)}: no such checkpoint file or model dir{home_hint(model)}")
    return path


def load_model_dir_of_config(path: Path, config: str | None) -> ModelDir:
    """The model dir at ``path``, refused unless it was built for the config ``--config`` names (when given), whose
    launch values it then runs with."""
    from ..config import load_config

    if not config:
        return load_model_dir(path)
    expected = load_config(config)  # a --config that names no config is said first
    model = load_model_dir(path)
    built = model.cfg
    if built.digest() != expected.digest():
        named = safe_repr(config) + ("" if expected.name == config else f" ({expected.name})")
        fix = config_change_fix(path, built, expected, config)
        differing = [f"{field} {there} there, {now} now" for field, there, now in built.identity_differences(expected)]
        what = f"config {safe_repr(built.name)}" if built.name != expected.name else \
            f"another config of that name ({'; '.join(differing[:3])}{'; ...' if len(differing) > 3 else ''})"
        raise ModelDirError(f"model dir {safe_repr(str(path))} was built for {what}, not for --config {named}: "
                            f"drop --config, or {fix}")
    return model.with_launch_values(expected)


def open_model(args: argparse.Namespace, max_batch: int | None = None, threads: int | None = None) -> PointPillars:
    """The detector of ``--model`` (a model dir or a .pth) with the CLI's runtime options (and a GPU
    batch of ``max_batch`` frames, ONNX Runtime ``threads`` on the CPU, where the run decided them)."""
    from ..detector import PointPillars
    from .runtime_args import runtime_options_from_args

    path = check_model_path(args)
    with rebuild_named(path, args.config):
        options = runtime_options_from_args(args, threads)  # a model dir's check, with --precision
        if max_batch is not None:
            options = dataclasses.replace(options, max_batch=max_batch)
        if path.is_file():
            return PointPillars.from_checkpoint(path, config=args.config, options=options)
        checked = load_model_dir_of_config(path, args.config) if args.config else None  # its refusal as it is said
        return PointPillars(checked if checked is not None else load_model_dir(path), options)


@contextlib.contextmanager
def rebuild_named(model: Path, config: str | None) -> Iterator[None]:
    """A refusal of the model dir ``model`` that advises its rebuild names the ``build`` command that rebuilds it
    (for ``--config config``), wherever in the open it was found: the ``--precision`` check, the model dir's read,
    its engines' open."""
    try:
        yield
    except ModelDirError as exc:
        text = str(exc)
        if model.is_dir() and "rebuild" in text and "pointpillars-trt build" not in text:
            raise ModelDirError(f"{text}: {rebuild_command(model, config)}") from None
        raise


# --------------------------------------------------------------------------- the run

def _prepare_eval(args: argparse.Namespace, frames: Sequence[str]) -> GroundTruth | None:
    if not args.eval:
        return None
    labels = Path(args.eval)
    check_label_folder(labels, "--eval")
    first_of_folder: dict[Path, str] = {}  # a folder's first frame stands for the folder's split
    for frame in frames:
        first_of_folder.setdefault(Path(frame).parent, frame)
    for frame in first_of_folder.values():
        refuse_other_split(frame, labels, "--eval label")
    missing = [f for f in frames if not os.path.lexists(labels / f"{Path(f).stem}.txt")]  # a FIFO: read below, by kind
    if missing:
        label = f"{safe_repr(Path(missing[0]).stem + '.txt')} for {safe_repr(missing[0])}"
        raise InputError(f"--eval {safe_repr(args.eval)} has no label file for {counted(len(missing), 'frame')} "
                         f"({example(len(missing), label)}): give --eval the label_2 folder of these frames' split, "
                         "or leave the frames without labels out of the run")
    # every label read (~0.07 ms a file) before a long run, not after it: a folder of other files (calib/ given
    # for label_2/) fails here; the evaluation takes those of the frames that went through
    return read_ground_truth(labels, [Path(frame).stem for frame in frames])


def eval_classes(classes: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """What --eval makes of a model of ``classes``, checked once the model is open, before any frame runs: (the
    classes it scores, in KITTI's spelling and the model's order; the model's classes that are none of them, whose
    boxes are left out of the scores). InputError where none of the model's classes is one of them: every AP
    would be 0, found only after the whole run."""
    from .eval.kitti_eval import canonical_class

    scored: list[str] = []
    others: list[str] = []
    for name in classes:
        try:
            scored.append(canonical_class(name))
        except PointPillarsError:
            others.append(name)
    if not scored:
        raise InputError(f"{_eval_scores()}; this model's classes ({_class_list(classes)}) have none of them, so "
                         "every AP would be 0: drop --eval, or give a --model of KITTI's classes")
    return tuple(dict.fromkeys(scored)), others


def _eval_scores() -> str:
    """What --eval scores, as ``eval_classes``' error and note begin."""
    from .eval.kitti_eval import CLASS_OVERLAPS

    return f"--eval scores KITTI's classes ({', '.join(CLASS_OVERLAPS)})"


def _class_list(classes: Sequence[str]) -> str:
    """'bus', 'trailer', ... : class names as messages quote them."""
    return ", ".join(safe_repr(name) for name in classes)


def run_infer(args: argparse.Namespace) -> int:
    """``infer``: 0 when every frame went through, 1 when some failed (each listed), 2 on a user error."""
    device = resolved_device(args.device)
    size = RunSize.given(args.batch_size, args.pipelines, on_gpu=device == "cuda")

    def open_pipelines(points_per_frame: int | None, fitted: RunSize) -> list[PointPillars]:
        threads = None
        if device == "cpu" and fitted.pipelines > 1:
            # --threads, else OMP_NUM_THREADS, at most the cores (said, as is a variable that is no thread count)
            asked, what, note = cpu_threads(args.threads, "--threads ")
            if note is not None:
                warnings.warn(note, SettingNotice, stacklevel=2)
            threads, note = pipeline_threads(fitted.pipelines, asked, what)
            if note is not None:
                warnings.warn(note, SettingNotice, stacklevel=2)
        return [open_warm(args, fitted.batch, points_per_frame, threads) for _ in range(fitted.pipelines)]

    return infer_with(args, open_pipelines, size, gpu=device == "cuda", check_model=lambda: check_model_path(args))


def open_warm(args: argparse.Namespace, batch: int, points_per_frame: int | None,
              threads: int | None = None) -> PointPillars:
    """``open_model`` for a run of ``batch`` frames at a time, warmed up at that batch on the GPU with
    frames of ``points_per_frame`` points (its CUDA graphs captured and its buffers sized with the
    model's load, not on the run's first frames); ``threads``: each CPU pipeline's share of the cores
    (None: ``--threads``)."""
    detector = open_model(args, max_batch=batch, threads=threads)
    if detector.device == "cuda":
        detector.warm_up([batch], points_per_frame)
    return detector


def resolved_device(device: str) -> str:
    """"cuda" or "cpu": where ``--device`` runs (auto decided here)."""
    from ..devices import pick_device

    try:
        return pick_device(device).kind
    except PointPillarsError:
        return "cuda"  # an explicit cuda device that cannot run: opening the model says why


def output_format(args: argparse.Namespace) -> str:
    """--format, else kitti with --eval, else json."""
    return str(args.format or ("kitti" if args.eval else "json"))


#: The format whose outputs a file name of each suffix looks like: an --out so named was most likely meant as a file.
_OUTPUT_FILE_FORMATS = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet", ".txt": "kitti"}


def _refuse_an_output_file_name(out: str, fmt: str) -> None:
    """--out names a folder, which infer creates: ``preds.jsonl`` would become a folder of that name holding a JSON
    file a frame (the default format), where a file of rows was meant."""
    written = {"json": "a .json file a frame", "kitti": "a label file a frame (.txt)",
               "jsonl": "part files of rows (detections-*.jsonl)", "parquet": "part files of rows (detections-*.parquet)"}
    folder = os.path.splitext(out)[0] or "preds"
    raise InputError(f"--out {safe_repr(out)} is a file name, but --out names the folder (created if missing) that the "
                     f"outputs go into; --format {fmt} writes {written[fmt]} there: give a folder, e.g. --out "
                     f"{safe_repr(folder)} --format {fmt}")


def check_outputs(args: argparse.Namespace, frames: Sequence[str], *,
                  resumable: bool = True) -> tuple[str, Path | None, GroundTruth | None]:
    """infer's checks of its output options before anything runs: (format, --out, --eval's labels, read).
    ``resumable``: whether --skip-existing could run these frames (not frames given as a URI), so that
    a folder of earlier parts is met with that advice only where it works."""
    fmt = output_format(args)
    if args.out is not None and not args.out.strip():
        raise InputError("--out '': an empty folder name (an unset variable?); name the folder for the outputs")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        kind = special_kind(out) or "an existing file"
        raise InputError(f"--out {safe_repr(args.out)} is {kind}; --out names a folder for the outputs")
    if out is not None and not os.path.lexists(out) and out.suffix.lower() in _OUTPUT_FILE_FORMATS:
        _refuse_an_output_file_name(args.out, _OUTPUT_FILE_FORMATS[out.suffix.lower()])
    if args.viz and out is None:
        raise InputError("--viz needs --out DIR: the pictures are written there")
    if args.skip_existing and out is None:
        raise InputError("--skip-existing needs --out DIR: it skips the frames whose outputs are already there")
    if args.retry_failed and not args.skip_existing:
        raise InputError("--retry-failed reruns the failed frames that --skip-existing would skip: add --skip-existing")
    if args.retry_failed and fmt not in ROW_FORMATS:
        raise InputError(f"--retry-failed applies to --format jsonl / parquet, whose rows keep failed frames; "
                         f"--format {fmt} writes no file for a failed frame, so --skip-existing reruns it: drop "
                         "--retry-failed")
    if args.keep_out_of_view and fmt != "kitti" and not args.eval:  # --eval's KITTI lines keep them too
        raise InputError(f"--keep-out-of-view applies to --format kitti (label lines of the boxes in the camera "
                         f"image); --format {fmt} keeps every box: drop it")
    camera = camera_options_given(args)
    if camera and fmt != "kitti" and not args.eval and not args.fov_only:
        raise InputError(f"{' and '.join(camera)}: the camera's calibration and image serve --format kitti, --eval "
                         f"and --fov-only; this --format {fmt} run uses none of them: drop "
                         f"{agree(len(camera), 'it', 'them')}")
    if args.calib is not None:
        check_input_folder(args.calib, "--calib", CALIB_FILES)
    check_image_shape(args.image_shape, _first_calib_file(frames, args.calib) if args.image_shape else None)
    if out is None and args.format is not None and not (args.eval and fmt in FILE_FORMATS):
        files = "its part files are" if fmt in ROW_FORMATS else "its files (one a frame) are"
        raise InputError(f"--format {fmt} needs --out DIR: {files} written there (without --out infer writes no "
                         "files: a line a frame and a summary)")
    if fmt == "parquet":
        require_pyarrow()  # before the model loads
    earlier = existing_parts(out, fmt) if fmt in ROW_FORMATS and out is not None and not args.skip_existing else []
    if earlier:
        resume = "pass --skip-existing to run only the frames they lack, or " if resumable else ""
        raise InputError(f"--out {safe_repr(args.out)} already holds {counted(len(earlier), f'{fmt} part file')} of "
                         f"an earlier run ({example(len(earlier), safe_repr(earlier[0].name))}), whose rows this run "
                         f"would repeat: {resume}give another --out")
    labels = _prepare_eval(args, frames)
    if out is not None:
        check_writable_folder(out, "--out")  # once, before the model loads, not once a frame
        suffixes = ([FILE_SUFFIXES[fmt]] if fmt in FILE_SUFFIXES else []) + ([".png"] if args.viz else [])
        if labels is not None and ".txt" not in suffixes:  # the evaluation's KITTI lines: a file a frame id
            suffixes.append(".txt")
        check_distinct_outputs(frames, suffixes, reserved=[SETTINGS_FILE, *([EVAL_FILE] if labels is not None else [])])
        # JSON records of other point files too, with --skip-existing too: before the resume decides which frames run
        refuse_foreign_outputs(out, frames, suffixes, other_sources=fmt == "json")
    elif labels is not None:
        check_distinct_outputs(frames, [".txt"])
    if args.viz:
        from .viz import require_matplotlib

        require_matplotlib()
    return fmt, out, labels


def _first_calib_file(frames: Sequence[str], calib_dir: str | None) -> Path | None:
    """The first frame's calib file (``calib_for_frame``), or None: no frame, or none there (said where it is read)."""
    try:
        return calib_for_frame(frames[0], calib_dir) if frames else None
    except PointPillarsError:
        return None


def check_calib_folders(frames: Sequence[str], calib_dir: str | None) -> None:
    """Refuse, before any frame runs, frames none of whose folders has its sibling ``calib/``
    (``kitti.calib_folder``), or none of which has its file in the ``--calib`` folder given: every frame
    would fail alike. Where some have one, the frames of the others fail one by one, and the rest run."""
    if calib_dir is not None:
        missing: InputError | None = None
        for frame in frames:  # the first frame's file is there, as a rule: one stat
            try:
                calib_for_frame(frame, calib_dir)
                return
            except InputError as exc:
                missing = missing or exc
        if missing is not None:
            which = agree(len(frames), "the one frame", f"any of the {len(frames)} frames")
            raise InputError(f"--calib {safe_repr(calib_dir)}: no calib file for {which}: {missing}")
        return
    seen: set[str] = set()
    first: InputError | None = None
    for frame in frames:
        folder = os.path.dirname(os.path.abspath(frame))
        if folder in seen:
            continue
        seen.add(folder)
        try:
            calib_folder(frame)
            return
        except InputError as exc:
            first = first or exc
    if first is not None:
        raise first


def camera_options_given(args: argparse.Namespace) -> list[str]:
    """Which of --calib and --image-shape were given: they serve only the outputs placed in the camera
    image, so infer and eval say when a run has none."""
    return [name for name, value in (("--calib", args.calib), ("--image-shape", args.image_shape)) if value is not None]


def check_model_inputs(model: str, columns: int, velocity: bool, fmt: str, point_dim: int, frames: Sequence[str], *,
                       eval_default: bool = False) -> None:
    """What the ``model`` (its name in messages; a local model's config or a served model's) needs of infer's
    options, checked once before any frame runs: .bin frames of at least its point ``columns`` (a single sweep
    given to a multi-sweep model is refused, not padded with time 0: that would lose accuracy silently), and no
    KITTI label files for models that predict ``velocity`` of full 360-degree frames (nuScenes-style:
    camera-frame labels cannot carry them); ``eval_default``: kitti is --eval's default, not a --format given,
    which the refusal then says."""
    check_point_dim(columns, point_dim, frames, model)
    if fmt == "kitti" and velocity:
        given = "--eval writes --format kitti unless --format is given, and" if eval_default else "--format kitti:"
        raise InputError(f"{given} {model} predicts box velocities on 360-degree multi-sweep frames, which "
                         "KITTI label files (camera-frame boxes) cannot carry; use --format json (or jsonl, parquet)")


def refuse_unused_point_dim(point_dim: int | None, frames: Sequence[str]) -> None:
    """--point-dim given for a run without a ``.bin`` frame is refused: it sets the row length of ``.bin``
    files alone (``.npy`` and ``.pcd`` files carry their own), so it would change nothing, unlike what its
    user believes of the frames."""
    if point_dim is not None and frames and not _any_bin(frames):
        none = agree(len(frames), "the one frame is no .bin file", f"none of these {len(frames)} frames is one")
        raise InputError(f"--point-dim {point_dim}: it sets the values a point of .bin frames, and {none} (.npy "
                         "and .pcd files carry their own row length): drop it")


def check_point_dim(columns: int, point_dim: int, frames: Sequence[str], model: str) -> None:
    """.bin frames of fewer values a point than the model's point columns are refused up front. The one column a
    model reads past x, y, z, intensity is a multi-sweep frame's time lag, which no --point-dim adds to single
    sweeps: the refusal says what frames the model needs, and names --point-dim only where the files' sizes do
    not say single sweeps (with them it would only change the error to 'not a multiple of' rows)."""
    if point_dim >= columns or not _any_bin(frames):
        return
    single = _single_sweep_bin(frames, columns)
    found = (f"; {safe_repr(single[0])} is {single[1]} bytes, rows of 4 values (a single sweep, as KITTI writes "
             f"them), not {columns}" if single is not None else
             f"; .bin files of such frames are read with --point-dim {columns}, this model's default")
    raise InputError(f"--point-dim {point_dim}: {model} reads {columns} values a point ({columns_text(columns)}): "
                     f"{MULTI_SWEEP_FIX}{found}")


def _single_sweep_bin(frames: Sequence[str], columns: int) -> tuple[str, int] | None:
    """The first local .bin frame, among the run's first ``SIZE_SAMPLE``, whose size says single sweeps (it fits
    rows of 4 float32 values, not of ``columns``), with its size; None where the first size that fits one of the two
    fits ``columns``, or none does (sizes that fit both say nothing)."""
    for frame in frames[:SIZE_SAMPLE]:
        if not frame.lower().endswith(".bin") or "://" in frame:
            continue
        try:
            size = os.stat(frame).st_size
        except (OSError, ValueError):  # ValueError: a NUL in the name; the frame's own read says what is wrong
            continue
        fits_4, fits_columns = size % 16 == 0, size % (4 * columns) == 0
        if fits_4 != fits_columns:
            return (frame, size) if fits_4 else None
    return None


def _any_bin(frames: Sequence[str]) -> bool:
    """Whether any frame is a ``.bin`` file, the one format --point-dim applies to."""
    return any(str(f).lower().endswith(".bin") for f in frames)


def output_plan(args: argparse.Namespace, fmt: str, out: Path | None, kitti_dir: Path | None = None) -> OutputPlan:
    """The OutputPlan of infer's options (``kitti_dir``: where KITTI lines go when --out takes JSON). Its
    point range, which only draws the --viz pictures, is the model's: ``infer_with`` adds it once the model
    is open; which files a frame's outputs are does not depend on it."""
    return OutputPlan(
        json_dir=out if fmt == "json" else None,
        kitti_dir=out if fmt == "kitti" and out is not None else kitti_dir,
        png_dir=out if args.viz else None,
        calib_dir=args.calib,
        image_shape=args.image_shape,
        keep_out_of_view=args.keep_out_of_view,
        kitti_of_record=fmt != "kitti",  # KITTI lines for --eval alone: as a resumed run rebuilds them
    )


def infer_with(args: argparse.Namespace, open_detectors: Callable[[int | None, RunSize], list[Any]], size: RunSize,
               gpu: bool = False, check_model: Callable[[], object] | None = None) -> int:
    """infer's run with the detectors ``open_detectors(points_per_frame, size)`` gives (one per pipeline of
    ``size``: anything with ``detect_batch``, ``close`` and ``cfg`` or ``class_names``; the run's likely frame
    size, or None), ``size.batch`` frames at a time, ``size`` fitted to the frames to run (a --batch-size or
    --pipelines cut is said in a note); ``gpu``: they run on the GPU (a long run then writes
    its outputs in processes, started while they open). The detectors are opened only when a frame is
    to run, --eval needs the model's classes, or --out's settings record may name other settings than this
    run's: a --skip-existing run whose frames are all done, of its settings, says so and ends without
    loading a model, and without the checks only an open model can make (its config, point columns,
    device); ``check_model`` (raising InputError), run after the output options' checks,
    is what every run checks of the model without opening it (``--model`` names something)."""
    path_errors: list[str] = []
    frames = expand_frame_paths(args.paths, path_errors)
    refuse_unused_point_dim(args.point_dim, frames)
    fmt, out, labels = check_outputs(args, frames)
    if check_model is not None:
        check_model()
    with scratch_folder() as scratch, OutHold(out) as hold:
        plan = output_plan(args, fmt, out, scratch if labels is not None and (fmt != "kitti" or out is None) else None)
        # what is in --out decides, not the KITTI lines --eval makes for itself in the scratch folder
        resume = frames_to_run(frames, output_plan(args, fmt, out), fmt, out, args.skip_existing,
                               retry_failed=args.retry_failed)
        record = settings_record(args, fmt, out, frames)
        if resume.todo or labels is not None or out is None or (record is not None and record.may_differ_from_kept()):
            failures = _run_model(args, open_detectors, size, gpu, frames, fmt, out, labels, plan, resume,
                                  path_errors, record, hold)
        else:  # every frame's outputs are there, of this run's settings, and no evaluation wants the model
            failures = end_skipped_run(args, resume, plan, fmt, out, path_errors)
    return EXIT_FRAME_FAILURES if failures or path_errors else 0


def end_skipped_run(args: argparse.Namespace, resume: Resume, plan: OutputPlan, fmt: str, out: Path,
                    input_errors: Sequence[str]) -> int:
    """The end of a --skip-existing run that ``resume`` leaves no frame to run (local or ``--ray``): what
    was found said and a summary of no frame, without a model or workers; the number of frames failed (0)."""
    remove_stale_temp_files(out)  # of an earlier run that was killed mid-write
    say_resume(resume, fmt, out, retry=args.retry_failed)
    return frame_report(0, plan, args, fmt, out, input_errors, skipped=len(resume.skipped)).close()[1]


def _run_model(args: argparse.Namespace, open_detectors: Callable[[int | None, RunSize], list[Any]], size: RunSize,
               gpu: bool, frames: Sequence[str], fmt: str, out: Path | None, labels: GroundTruth | None,
               plan: OutputPlan, resume: Resume, path_errors: Sequence[str], record: SettingsRecord | None,
               hold: OutHold) -> int:
    """``infer_with``'s run of ``resume.todo`` (and --eval of the frames skipped and run) with the detectors
    it opens here, ``size`` fitted to those frames first, ``record`` (--out's settings) written before the first
    output, ``hold`` told of that first write; the number of frames that failed."""
    size = size.fitted(len(resume.todo))
    note = cut_note(args.batch_size, args.pipelines, size, len(resume.todo))
    if note is not None:
        warnings.warn(note, SettingNotice, stacklevel=2)
    points_per_frame = likely_points_per_frame(frames, args.point_dim or 4)  # at most 4: a bound from above
    long_run = gpu and len(resume.todo) >= WRITE_PROCESSES_FROM
    writers: WorkerProcesses | None = None
    readers: WorkerProcesses | None = None
    detectors: list[Any] = []
    try:  # a Ctrl-C held while the readers spawn comes as their start ends: the writers are shut down too
        writers = WorkerProcesses(WRITE_PROCESSES, write_frame) if long_run and out is not None else None
        readers = WorkerProcesses(READ_PROCESSES, read_batch) if long_run else None
        detectors = open_detectors(points_per_frame, size)
        cfg = getattr(detectors[0], "cfg", None)
        classes = tuple(cfg.classes if cfg is not None else detectors[0].class_names)
        scored, unscored = eval_classes(classes) if labels is not None else ((), [])
        # the model's point columns: its config's, or a served model's as its server says
        named, columns = (f"model {cfg.name}", cfg.num_point_columns) if cfg is not None else \
            ("the served model", detectors[0].num_point_columns)
        if args.point_dim is None:
            args.point_dim = columns
        check_model_inputs(named, columns, predicts_velocity(detectors[0]), fmt, args.point_dim, frames,
                           eval_default=args.format is None)
        if fmt == "kitti" or labels is not None or args.fov_only:  # after the model's own refusals
            check_calib_folders(resume.todo, args.calib)
        if out is not None:
            hold.before_first_write()
            remove_stale_temp_files(out)
        if record is not None and (resume.todo or resume.skipped):  # the model open, no output yet
            opened = getattr(detectors[0], "model", None)
            served = getattr(detectors[0], "served", None)  # a served model's, as its server states them
            record.settle(opened if isinstance(opened, ModelDir) else None, cfg, args.point_dim,
                          skip_existing=args.skip_existing, skipped=len(resume.skipped),
                          trained_fov_only=trained_fov_only(detectors[0]),
                          served=served.identity if served is not None else None)
        # the --viz pictures are drawn over the model's point range
        plan = dataclasses.replace(plan, point_range=model_point_range(detectors[0]))
        print_device_notice(detectors[0])  # once the run's set-up can no longer fail
        if unscored:
            print(f"note: {_eval_scores()}; this model's classes {_class_list(unscored)} are none of them: their "
                  "boxes are left out of the scores", file=sys.stderr)
        say_resume(resume, fmt, out, retry=args.retry_failed)
        done, failures = run_frames(detectors, resume.todo, plan, args, size.batch, fmt, out, classes, writers,
                                    points_per_frame, path_errors, readers, skipped=len(resume.skipped))
        if out is not None:
            remove_stale_temp_files(out)  # of a writer process that died mid-write
        if labels is not None:
            skipped = skipped_for_eval(resume, plan, fmt, out)
            _evaluate(labels, plan.kitti_dir, frames, {*skipped.frames, *done},  # type: ignore[arg-type]
                      failures + skipped.failed_before, skipped.unreadable, scored, out)
            failures += skipped.unreadable
    finally:
        for processes in (writers, readers):
            if processes is not None:
                processes.pool.shutdown(cancel_futures=True)
        for detector in detectors:
            detector.close()
    return failures


def trained_fov_only(detector: Any) -> bool | None:
    """Whether ``detector``'s model was trained on the points the camera sees only, which the default camera-view
    crop follows: as its model dir records it, or a served model's server says (None: not recorded)."""
    model = getattr(detector, "model", None)
    return model.fov_points_only if isinstance(model, ModelDir) else getattr(detector, "fov_points_only", None)


def model_point_range(detector: Any) -> tuple[float, ...] | None:
    """``detector``'s model's point range (x, y, z minimum, then maximum): its config's, or a served model's as its
    server says (None: not said)."""
    cfg = getattr(detector, "cfg", None)
    return tuple(cfg.voxel.point_range) if cfg is not None else getattr(detector, "point_range", None)


def predicts_velocity(detector: Any) -> bool:
    """Whether ``detector``'s model predicts velocities (a nuScenes model's): its config's box code says, or a served
    model's server."""
    cfg = getattr(detector, "cfg", None)
    return bool(cfg.box_code.velocity) if cfg is not None else bool(detector.served.velocity)


class OutHold:
    """``--out`` held by a run (``out_held``) to its end: from the start where it exists already, so that no other
    run changes what this one reads of it to decide its frames; else from the run's first write
    (``before_first_write``), when it must still hold nothing (another run that made and wrote it meanwhile is
    refused). Nothing without --out."""

    def __init__(self, out: Path | None) -> None:
        self._out = out
        self._stack = contextlib.ExitStack()
        self._held = False
        if out is not None and out.is_dir():
            self._hold(out)

    def _hold(self, out: Path) -> None:
        self._stack.enter_context(out_held(out))
        self._held = True

    def before_first_write(self) -> None:
        if self._out is not None and not self._held:
            self._hold(self._out)
            _refuse_outputs_of_another_run(self._out)

    def __enter__(self) -> OutHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _refuse_outputs_of_another_run(out: Path) -> None:
    """``--out`` did not exist when this run decided its frames, and now holds something: another run made it
    and wrote there meanwhile, so what this run would write (another part of the same rows, outputs of other
    settings) was decided without it."""
    entries = [name for name in os.listdir(out) if not name.endswith(TEMP_SUFFIX)]
    if entries:
        raise InputError(f"--out {safe_repr(str(out))} was made by another run while this one started (it holds "
                         f"{safe_repr(sorted(entries)[0])}): run this one again (with --skip-existing to keep those "
                         "outputs), or give another --out")


def out_held(out: Path) -> contextlib.AbstractContextManager[None]:
    """``--out`` (made if missing) held by this run until it ends: a second run into it meanwhile, whose
    outputs and settings record would interleave with this one's, is refused before it writes anything."""
    def unheld(why: str) -> None:
        print(f"note: --out {safe_repr(str(out))} cannot be locked ({why}): a second run into it meanwhile would not "
              "be refused", file=sys.stderr, flush=True)

    return folder_held(out, f"--out {safe_repr(str(out))} is being written by another infer run now (two runs "
                            "into one folder mix their outputs and settings): wait for it to end, or give another --out",
                       unheld)


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    """A temp folder that dies with the run; folders of earlier runs that were killed are cleared."""
    prefix = "pp-infer-"
    remove_stale_folders(tempfile.gettempdir(), prefix)
    with tempfile.TemporaryDirectory(prefix=owned_prefix(prefix)) as path:
        yield Path(path)


def run_frames(detectors: Sequence[Any], frames: Sequence[str], plan: OutputPlan, args: argparse.Namespace,
               batch: int, fmt: str, out: Path | None, classes: tuple[str, ...],
               writers: WorkerProcesses | None = None, points_per_frame: int | None = None,
               input_errors: Sequence[str] = (), readers: WorkerProcesses | None = None,
               skipped: int = 0) -> tuple[list[str], int]:
    """Read, detect and write every frame through the streaming runner (``apps/frames.py``), writing in
    ``writers`` and reading in ``readers`` when given (the runner closes them), staging sized for
    ``points_per_frame``; the outputs
    are flushed to disk before the summary, which counts ``input_errors`` (paths that gave no frame)
    too, and the ``skipped`` frames of a resumed run of none; (frames that went through, number that failed)."""
    if writers is not None:
        writers.wait()
    report = frame_report(len(frames), plan, args, fmt, out, input_errors, skipped=skipped, sources=frames)
    rows = _RowSink(RowParts(out, fmt, classes), report) if fmt in ROW_FORMATS and out is not None else None
    disk, lost = _SharedCause(is_full_disk_error), _SharedCause(lambda error: DetectorLost.MARK in error)
    prepare = frame_preparer(args, fmt, report.note,
                             trained_fov_only(detectors[0]), plan.point_range)
    read = FrameReader(getattr(detectors[0], "cfg", None), point_dim=args.point_dim,
                       intensity_scale=args.intensity_scale, prepare=prepare,
                       columns=getattr(detectors[0], "num_point_columns", None))

    to_flush = PendingFlush()  # the outputs, made durable before the summary
    warned = FrameWarnings(report.note)
    write = functools.partial(write_frame, plan=plan, row_classes=classes if rows is not None else None)
    velocity = predicts_velocity(detectors[0])  # a failed frame's row holds none, as an empty frame's
    runner = FrameRunner(detectors, batch_size=batch, read=read, write=write,
                         writers=WRITE_THREADS, writer_processes=writers, keep_points=plan.png_dir is not None,
                         notice=report.note, points_per_frame=points_per_frame, reader_processes=readers)
    jobs = runner.run(frames)  # a generator: no code of it runs before the loop
    try:
        try:
            for job in jobs:  # a frame's row is kept before its warnings are said: a stop right after keeps it
                if job.error is not None:
                    if rows is not None:
                        rows.add(row_text(frame_row(job.source, None, job.error, classes, velocity=velocity)))
                    warned.add(frame_warnings(job, read, plan.point_range), job.source)  # a failed frame's read too
                    if disk.quiet(job.error, job.replaced) or lost.quiet(job.error, job.replaced):
                        report.fail_quietly()
                    else:
                        report.fail(job.source, job.error, job.replaced)
                    continue
                written, row = job.written
                to_flush.add(written.files)
                report.written(job.source, written, job.detections)  # counted before its row: a part that cannot
                if rows is not None:  # be written takes the frames of its rows back from the written ones
                    rows.add(row, (job.source, written))
                warned.add(frame_warnings(job, read, plan.point_range), job.source)
            if rows is not None:
                rows.close()
                to_flush.add(rows.parts.files)
        finally:
            # the run's pipelines stop here, whatever ended the loop: before the caller closes their detectors
            # (the writes under way finish first)
            try:
                jobs.close()
            finally:
                try:
                    runner.close()
                finally:
                    report.bar.close()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the finished frames' outputs are kept, durable, for a resume
        if out is not None:
            count_written_when_stopped(runner, report, rows, to_flush)
        if rows is not None:
            keep_finished_rows(rows.parts, to_flush, report.note)
        elif out is not None:
            say_finished_files(len(report.done), out, to_flush, report.note)
        raise
    warned.close()
    rerun = "--skip-existing --retry-failed" if rows is not None else "--skip-existing"  # rows: their errors
    if disk.after_first:
        report.note(f"error: {safe_repr(str(out))}: the output file system is full; "
                    f"{counted(disk.after_first, 'more frame')} not written (free space, then rerun with {rerun})")
    if lost.after_first:
        them = agree(lost.after_first, "it", "them")
        report.note(f"error: {counted(lost.after_first, 'more frame')} not run: the server is down (said above); once "
                    "it answers again, " + (f"rerun with {rerun}" if out is not None else f"run {them} again"))
    if to_flush:
        try:
            to_flush.flush()
        except OSError as exc:
            raise InputError(f"the outputs in {safe_repr(str(out))} could not be flushed to disk: "
                             f"{exc.strerror or one_line(exc)}; none of this run's outputs can be trusted") from None
    return report.close()


def count_written_when_stopped(runner: FrameRunner, report: FrameReport, rows: _RowSink | None,
                               to_flush: PendingFlush) -> None:
    """On Ctrl-C or SIGTERM, once ``runner`` is closed: the frames whose writes finished after the stop (or just
    before it, the loop not yet told), counted with the others, their files flushed and their rows kept with
    them, so that what the stop says matches the outputs on disk."""
    counted = set(report.done)
    for job in runner.written_when_stopped():
        if job.source in counted:
            continue
        written, row = job.written
        to_flush.add(written.files)
        report.written(job.source, written)
        if rows is not None:
            rows.add(row, (job.source, written))


#: What an interrupted row run says of its finish.
RESUME_HINT = "rerun with --skip-existing to finish"


def keep_finished_rows(parts: RowParts, to_flush: PendingFlush, note: Callable[[str], None],
                       hint: str | None = RESUME_HINT) -> None:
    """On Ctrl-C or SIGTERM in a JSON Lines / Parquet run (local or ``--ray``): the rows of the frames finished so
    far that no part holds yet are written as a last part, the run's parts flushed with ``to_flush``'s files
    (also when the stop came just as a part was written: none waits then) and said on ``note`` (with ``hint``,
    how to finish), so that a --skip-existing rerun runs only the frames without a row."""
    waiting, finished = len(parts.rows), parts.rows_written + len(parts.rows)
    try:
        if waiting:
            parts.close()
        if not parts.files:
            return
        to_flush.add(parts.files)
        to_flush.flush()
    except (InputError, OSError) as exc:
        note(f"error: stopped, and the rows of {counted(finished, 'finished frame')} could not be kept: {one_line(exc)}")
        return
    where = safe_repr(str(parts.files[-1])) + (f" and the {counted(len(parts.files) - 1, 'part')} before it"
                                                if len(parts.files) > 1 else "")
    note(f"stopped: the rows of {counted(parts.rows_written, 'finished frame')} are in {where}"
         + (f"; {hint}" if hint else ""))


def say_finished_files(finished: int, out: Path, to_flush: PendingFlush, note: Callable[[str], None],
                       tail: str = f"; {RESUME_HINT}") -> None:
    """On Ctrl-C or SIGTERM in a run of a file a frame (JSON, KITTI; local or ``--ray``): the outputs of the
    ``finished`` frames made durable (``to_flush``: their files) and said, then ``tail`` (how to finish), as
    ``keep_finished_rows`` says a row run's."""
    if not finished:
        return
    try:
        to_flush.flush()
    except OSError as exc:
        note(f"error: stopped, and the outputs of {counted(finished, 'finished frame')} in {safe_repr(str(out))} could "
             f"not be flushed to disk: {exc.strerror or one_line(exc)}")
        return
    note(f"stopped: the outputs of {counted(finished, 'finished frame')} are in {safe_repr(str(out))}{tail}")


class _RowSink:
    """The run's JSON Lines / Parquet rows: a part that cannot be written (a full disk, a folder gone) is one
    error line naming why, its rows are dropped and its frames taken back from the written ones, so the summary
    never claims them (a --skip-existing rerun runs them again; freeing space first only where the disk was full)."""

    def __init__(self, parts: RowParts, report: FrameReport) -> None:
        self.parts, self.report = parts, report
        # frames that went through (source, what was counted) whose rows are in the part being filled
        self._waiting: list[tuple[str, FrameOutput]] = []

    def add(self, row: str, written: tuple[str, FrameOutput] | None = None) -> None:
        """A frame's row (its ``row_text``); ``written``: its source and counts when it went through (None: a failed frame's row)."""
        if written is not None:
            self._waiting.append(written)
        self._write(lambda: self.parts.add(row))

    def close(self) -> None:
        self._write(self.parts.close)

    def _write(self, write: Callable[[], None]) -> None:
        parts = len(self.parts.files)
        try:
            write()
        except InputError as exc:
            waiting = len(self._waiting)
            them = agree(waiting, "it", "them")
            rerun = ("free space, then rerun with --skip-existing" if is_full_disk_error(str(exc))
                     else f"rerun with --skip-existing to run {them} again")
            rows = f"the rows of {counted(waiting, 'frame')}" if waiting else "the rows of failed frames"
            self.report.note(f"error: {exc}; {rows} are not written ({rerun})")
            self.report.take_back(self._waiting)
            self._waiting = []
            return
        if len(self.parts.files) > parts:
            self._waiting = []


class _SharedCause:
    """Frame errors of one run-wide cause (``of_cause``: a full file system, a server that is down): the first
    frame's gets its error line; the frames after it are counted into one summary line instead of a line each,
    but for one whose write replaced files of an earlier run first, which names them (and the summary counts them)."""

    def __init__(self, of_cause: Callable[[str], bool]) -> None:
        self._of_cause = of_cause
        self.after_first = 0
        self._seen = False

    def quiet(self, error: str, replaced: int) -> bool:
        """Whether a frame's ``error`` goes unsaid: one of the cause's, after its first, whose write ``replaced``
        no file of an earlier run."""
        if not self._of_cause(error):
            return False
        if self._seen and not replaced:
            self.after_first += 1
            return True
        self._seen = True
        return False


def _evaluate(labels: GroundTruth, pred_dir: Path, frames: Sequence[str], evaluated: Collection[str], failed: int,
              unreadable: int, classes: tuple[str, ...], out: Path | None) -> None:
    """KITTI AP for ``classes`` (``eval_classes``' scored) of ``evaluated`` (KITTI lines in ``pred_dir``) in input
    order, whichever run wrote them; the header counts the ``failed`` frames and those whose earlier outputs were
    ``unreadable``, left out. The prediction lines are infer's own, typed with the model's class names, which
    ``eval_classes`` compared with KITTI's before the run: none is checked for its type here. The label lines' types
    and the classes with nothing to count are said as ``eval`` says them."""
    from ..strict_json import write_json_atomic
    from .eval.io import load_predictions
    from .eval.kitti_eval import check_label_types, evaluate, uncounted_note
    from .eval.report import format_table

    if not evaluated:
        raise InputError("--eval: no frame went through, so there is nothing to evaluate")
    ids = [Path(f).stem for f in frames if f in evaluated]
    predictions = load_predictions(pred_dir, ids)
    truth = labels.of(ids)
    result = evaluate(truth, predictions, classes)
    for note in (check_label_types(truth, labels.folder), uncounted_note(result, predictions)):  # as eval says them
        if note is not None:
            print(note, file=sys.stderr)
    left_out = [counted(failed, "failed frame")] * bool(failed) + \
        [f"{counted(unreadable, 'frame')} whose earlier outputs could not be read"] * bool(unreadable)
    skipped = f" ({' and '.join(left_out)} left out)" if left_out else ""
    print(f"KITTI evaluation of {counted(len(ids), 'frame')} against {printable_text(str(labels.folder))}{skipped}")
    print(format_table(result), end="")
    if out is not None:
        write_json_atomic(out / EVAL_FILE, result.to_json_dict())
        print(f"wrote {printable_text(str(out / EVAL_FILE))}")
