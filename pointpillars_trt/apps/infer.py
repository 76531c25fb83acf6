"""``pointpillars-trt infer``: detect on point files and write one output per frame.

Frames are ``.bin`` (KITTI float32 rows), ``.npy`` or ``.pcd`` files, given as files, folders or
globs. They are read ahead of the detector in a reader thread, run ``--batch-size`` at a time, and
each frame's outputs (JSON record, KITTI label_2 lines, BEV picture) are written atomically. A bad
frame is reported on one ``error:`` line and the others go on; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, ModelDirError, PointPillarsError
from ..fileio import safe_repr
from ..graph_io import MAX_BATCH
from ..pointcloud_io import SUPPORTED_EXTENSIONS

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..detections import Detections
    from ..detector import PointPillars

EXIT_FRAME_FAILURES = 1
#: What a single frame may raise without ending the run (it becomes that frame's error line).
FRAME_ERRORS = (PointPillarsError, ValueError, RuntimeError, MemoryError, OSError, RecursionError)
BACKENDS = ("auto", "onnxruntime", "tensorrt", "cudnn")
EVAL_FILE = "eval.json"


# --------------------------------------------------------------------------- messages

def one_line(exc: BaseException | str, limit: int = 600) -> str:
    """An exception (or text) as one terminal-safe line: control characters escaped, line breaks
    folded, long text shortened in the middle; an empty message becomes the exception's type."""
    text = str(exc)
    if not text.strip() and isinstance(exc, BaseException):
        text = type(exc).__name__
    text = " ".join(text.split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > limit:
        text = text[: limit // 2 - 2] + " ... " + text[-(limit // 2 - 3):]
    return text


def print_error(text: str, file: Any = None) -> None:
    print(f"error: {text}", file=file or sys.stderr, flush=True)


# --------------------------------------------------------------------------- argument types

def device_arg(text: str) -> str:
    kind, sep, index = text.partition(":")
    if kind in ("auto", "cpu", "cuda") and (not sep or (kind == "cuda" and index.isdigit())):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: expected auto, cpu, cuda or cuda:N")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return value


def batch_size_arg(text: str) -> int:
    value = positive_int(text)
    if value > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1..{MAX_BATCH}")
    return value


def _float_arg(text: str, ok: Callable[[float], bool], expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def positive_float(text: str) -> float:
    return _float_arg(text, lambda v: bool(np.isfinite(v)) and v > 0, "a finite positive number")


def unit_float(text: str) -> float:
    return _float_arg(text, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


def image_shape_arg(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        height, width = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HEIGHT,WIDTH in pixels, e.g. 375,1242") from None
    if height < 1 or width < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: height and width must be positive")
    return height, width


# --------------------------------------------------------------------------- parser

def add_infer_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``infer`` on the main CLI's subparsers."""
    infer = sub.add_parser("infer", help="detect on lidar point files (.bin, .npy, .pcd); one output per frame",
                           description="Detect on lidar point files and write one output file per frame.")
    infer.add_argument("paths", nargs="+", metavar="PATH",
                       help=f"point files ({', '.join(SUPPORTED_EXTENSIONS)}), folders of them, or globs "
                            "(a path that exists is taken literally, even with [ or * in its name)")
    model = infer.add_argument_group("model")
    model.add_argument("--model", help="model dir (from build) or a .pth checkpoint (required unless --server)")
    model.add_argument("--config", help="config name or YAML path the model must have been built for "
                                        "(default: the model dir's own; a checkpoint's layout)")
    model.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                       help="graphs exported from a .pth --model (a model dir keeps its own)")
    run = infer.add_argument_group("runtime")
    run.add_argument("--device", type=device_arg, default="auto", help="auto, cpu, cuda or cuda:N")
    run.add_argument("--backend", choices=BACKENDS, default="auto",
                     help="GPU engine backend (the CPU path always uses ONNX Runtime)")
    run.add_argument("--batch-size", type=batch_size_arg, default=1,
                     help=f"frames run at once on the GPU (1..{MAX_BATCH}); outputs do not depend on it")
    run.add_argument("--threads", type=positive_int, default=None,
                     help="CPU path: ONNX Runtime threads (default: $OMP_NUM_THREADS, else one per core)")
    run.add_argument("--no-tf32", action="store_true", help="GPU fp32 engines in IEEE fp32 (as the CPU path)")
    run.add_argument("--score-threshold", type=unit_float, default=None,
                     help="keep boxes scoring at least this (default: the model's; no rebuild needed)")
    run.add_argument("--nms-iou", type=unit_float, default=None,
                     help="NMS overlap above which the lower-scored box goes (default: the model's)")
    run.add_argument("--max-boxes", type=positive_int, default=None,
                     help="at most this many boxes a frame (default: the model's)")
    points = infer.add_argument_group("points")
    points.add_argument("--point-dim", type=int, choices=(4, 5), default=4,
                        help=".bin values a point: 4 (KITTI x y z intensity) or 5 (nuScenes x y z intensity "
                             "time; multi-sweep models need them)")
    points.add_argument("--intensity-scale", type=positive_float, default=None,
                        help="multiply intensities by this, e.g. 0.00392156862745098 (1/255) for 0-255 "
                             "intensities given to a model trained on 0-1 (default: as read)")
    outputs = infer.add_argument_group("outputs")
    outputs.add_argument("--out", help="folder for one output file per frame (default: print a summary only)")
    outputs.add_argument("--format", choices=("json", "kitti"), default=None,
                         help="json: lidar boxes; kitti: label_2 lines in the camera frame "
                              "(default: json, or kitti with --eval)")
    outputs.add_argument("--calib", metavar="DIR",
                         help="KITTI calib folder of <frame id>.txt for --format kitti "
                              "(default: each frame's sibling calib/ folder)")
    outputs.add_argument("--image-shape", type=image_shape_arg, metavar="H,W", default=None,
                         help="camera image size for KITTI 2D boxes (default: each frame's image_2 PNG "
                              "when there is one, else 375,1242)")
    outputs.add_argument("--keep-out-of-view", action="store_true",
                         help="--format kitti: keep boxes outside the camera image (dropped and counted otherwise)")
    outputs.add_argument("--viz", action="store_true",
                         help="also write a bird's-eye-view picture <frame>.png per frame (needs --out, matplotlib)")
    outputs.add_argument("--eval", metavar="LABEL_DIR",
                         help="after the run, KITTI AP of the predictions against this label_2 folder: "
                              f"prints the table and writes {EVAL_FILE} in --out (default: no evaluation)")
    outputs.add_argument("--no-progress", action="store_true", help="no progress bar")
    infer.set_defaults(run=run_infer)
    return infer


# --------------------------------------------------------------------------- frames

def _is_point_file(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in SUPPORTED_EXTENSIONS


def expand_frame_paths(patterns: Sequence[str]) -> list[str]:
    """Point files from files, folders and globs, in the order given (folders and globs sorted).

    A path that exists is taken literally (so ``scan[1].bin`` works); a folder gives its point
    files; otherwise a pattern with glob characters is expanded. A plain name that does not
    exist is kept, so it is reported as that frame's error instead of vanishing.
    """
    frames: list[str] = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            found = sorted(os.path.join(pattern, n) for n in os.listdir(pattern)
                           if _is_point_file(n) and not os.path.isdir(os.path.join(pattern, n)))
            if not found:
                raise InputError(f"folder {safe_repr(pattern)} holds no point files "
                                 f"({', '.join(SUPPORTED_EXTENSIONS)})")
            frames.extend(found)
        elif os.path.lexists(pattern) or not glob.has_magic(pattern):
            frames.append(pattern)
        else:
            found = sorted(p for p in glob.glob(pattern) if not os.path.isdir(p))
            if not found:
                raise InputError(f"{safe_repr(pattern)}: no such file, and no file matches it as a pattern")
            frames.extend(found)
    return frames


def check_unique_names(frames: Sequence[str], suffixes: Sequence[str] = (".json",),
                       reserved: Sequence[str] = ()) -> None:
    """Outputs are named after the frame (``<stem><suffix>``), so two frames of one stem would
    overwrite each other: refuse them before anything runs."""
    by_name: dict[str, list[str]] = {}
    for frame in frames:
        by_name.setdefault(Path(frame).stem, []).append(frame)
    clashes = [paths for paths in by_name.values() if len(paths) > 1]
    if clashes:
        first = clashes[0]
        raise InputError(
            f"frames {safe_repr(first[0])} and {safe_repr(first[1])} would write the same output file "
            f"{safe_repr(Path(first[0]).stem + suffixes[0])} ({len(clashes)} such name(s)); "
            "run them into separate --out folders"
        )
    taken = [Path(f).stem + suffix for f in frames for suffix in suffixes if Path(f).stem + suffix in reserved]
    if taken:
        raise InputError(f"a frame's output {safe_repr(taken[0])} would overwrite the run's own output of that name")


_check_unique_names = check_unique_names  # the name apps/serve imports


@dataclass
class _Read:
    source: str
    points: np.ndarray | None
    error: str | None


class FrameReader:
    """Reads frames in a background thread, ``depth`` ahead of the consumer, in input order."""

    def __init__(self, frames: Sequence[str], read: Callable[[str], np.ndarray], depth: int) -> None:
        self._frames = iter(frames)
        self._read = read
        self._depth = max(1, depth)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pp-reader")
        self._pending: list[tuple[str, Future[np.ndarray]]] = []

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            source = next(self._frames, None)
            if source is None:
                return
            self._pending.append((source, self._pool.submit(self._read, source)))

    def __iter__(self) -> Iterator[_Read]:
        self._fill()
        while self._pending:
            source, future = self._pending.pop(0)
            self._fill()
            try:
                yield _Read(source, future.result(), None)
            except FRAME_ERRORS as exc:
                yield _Read(source, None, one_line(exc))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------------------- outputs

@dataclass(frozen=True)
class OutputPlan:
    """Where each kind of per-frame output goes (None: not written) and how KITTI lines are made."""

    json_dir: Path | None = None
    kitti_dir: Path | None = None
    png_dir: Path | None = None
    calib_dir: str | None = None
    image_shape: tuple[int, int] | None = None
    keep_out_of_view: bool = False
    point_range: tuple[float, ...] | None = None


@dataclass
class FrameOutput:
    boxes: int = 0
    nonfinite: int = 0
    out_of_view: int = 0
    files: list[Path] = field(default_factory=list)


def write_frame_outputs(det: Detections, source: str, plan: OutputPlan, points: np.ndarray | None = None) -> FrameOutput:
    """Write a frame's outputs per ``plan``: ``<stem>.json`` (the ``to_json_dict`` record),
    ``<stem>.txt`` (KITTI label_2 lines, with the frame's own calibration) and ``<stem>.png``.

    Everything is computed before the first file is written; each file is written atomically.
    """
    from ..fileio import write_json_atomic, write_text_atomic
    from ..kitti import calib_for_frame, detections_to_kitti_lines, finite_detections, image_shape_for_frame, \
        read_calibration

    stem = Path(source).stem
    result = FrameOutput()
    boxes, scores, names, result.nonfinite = finite_detections(det.boxes.reshape(-1, 7), det.scores, det.names)
    result.boxes = len(scores)
    writes: list[tuple[Path, Callable[[Path], None]]] = []
    if plan.json_dir is not None:
        record = det.to_json_dict(stem)
        writes.append((plan.json_dir / f"{stem}.json", lambda p: write_json_atomic(p, record)))
    if plan.kitti_dir is not None:
        calib = read_calibration(calib_for_frame(source, plan.calib_dir))
        shape = plan.image_shape or image_shape_for_frame(source)
        kitti = detections_to_kitti_lines(det.boxes, det.scores, det.names, calib, shape,
                                          keep_out_of_view=plan.keep_out_of_view)
        result.out_of_view = kitti.dropped_out_of_view
        text = "".join(line + "\n" for line in kitti.lines)
        writes.append((plan.kitti_dir / f"{stem}.txt", lambda p: write_text_atomic(p, text)))
    if plan.png_dir is not None and points is not None:
        from .viz import plot_bev

        velocity = None if det.velocity is None else \
            det.velocity[np.isfinite(det.boxes.reshape(-1, 7)).all(axis=1) & np.isfinite(det.scores)]

        def png(path: Path) -> None:
            plot_bev(points, boxes, names, scores, path, point_range=plan.point_range,
                     title=f"{Path(source).name}: {len(scores)} boxes", velocity=velocity)

        writes.append((plan.png_dir / f"{stem}.png", png))
    for path, write in writes:
        try:
            write(path)
        except OSError as exc:
            raise InputError(f"cannot write {safe_repr(os.fspath(path))}: {exc.strerror or one_line(exc)}") from None
        result.files.append(path)
    return result


# --------------------------------------------------------------------------- the model

def rebuild_command(model_dir: Path, config: str | None) -> str:
    """A ``pointpillars-trt build`` command that rebuilds ``model_dir`` from the checkpoint it records."""
    import json

    checkpoint = None
    try:
        with open(model_dir / "model.json", "rb") as f:
            meta = json.loads(f.read(1 << 22))
        recorded = meta.get("source", {}).get("checkpoint") if isinstance(meta, dict) else None
        if isinstance(recorded, str) and os.path.isfile(recorded):
            checkpoint = recorded
    except (OSError, ValueError, RecursionError, AttributeError, TypeError):
        pass
    words = ["pointpillars-trt", "build", "--checkpoint", checkpoint or "YOUR_CHECKPOINT.pth"]
    if config:
        words += ["--config", config]
    words += ["--out", os.fspath(model_dir)]
    command = " ".join(shlex.quote(w) if w != "YOUR_CHECKPOINT.pth" else w for w in words)
    if checkpoint is None:
        return f"`{command}` (the model dir records no checkpoint that is still there: name yours)"
    return f"`{command}`"


def open_model(args: argparse.Namespace, **options: Any) -> PointPillars:
    """The detector of ``--model`` (a model dir or a .pth) with the CLI's runtime options."""
    from ..config import load_config
    from ..detector import PointPillars
    from ..model_dir import load_model_dir

    if not args.model:
        raise InputError("infer needs --model: a model dir (from build) or a .pth checkpoint")
    path = Path(args.model)
    if not path.exists():
        raise InputError(f"--model {safe_repr(args.model)}: no such checkpoint file or model dir")
    common: dict[str, Any] = dict(device=args.device, backend=args.backend, tf32=not args.no_tf32,
                                  threads=args.threads, max_batch=args.batch_size,
                                  score_threshold=args.score_threshold, nms_iou=args.nms_iou,
                                  max_boxes=args.max_boxes, **options)
    if path.is_file():
        return PointPillars.from_checkpoint(path, config=args.config, precision=args.precision, **common)
    expected: ModelConfig | None = None
    if args.config:
        expected = load_config(args.config)
        built = load_model_dir(path).cfg
        if built.digest() != expected.digest():
            raise ModelDirError(
                f"model dir {safe_repr(args.model)} was built for config {safe_repr(built.name)}, not for "
                f"--config {safe_repr(args.config)} ({expected.name}): drop --config, or rebuild with "
                + rebuild_command(path, args.config)
            )
    try:
        return PointPillars.from_model_dir(path, config=expected, **common)
    except ModelDirError as exc:
        text = str(exc)
        if "rebuild" in text and "pointpillars-trt build" not in text:
            raise ModelDirError(f"{text}: {rebuild_command(path, args.config)}") from None
        raise


# --------------------------------------------------------------------------- the run

def _prepare_eval(args: argparse.Namespace, frames: Sequence[str]) -> Path | None:
    if not args.eval:
        return None
    labels = Path(args.eval)
    if not labels.is_dir():
        raise InputError(f"--eval {safe_repr(args.eval)}: label folder does not exist or is not a folder")
    missing = [f for f in frames if not (labels / f"{Path(f).stem}.txt").is_file()]
    if missing:
        raise InputError(f"--eval {safe_repr(args.eval)} has no label file for {len(missing)} frame(s), e.g. "
                         f"{safe_repr(Path(missing[0]).stem + '.txt')} for {safe_repr(missing[0])}")
    return labels


def _eval_classes(classes: Sequence[str]) -> tuple[str, ...]:
    from .eval.kitti_eval import DEFAULT_CLASSES, canonical_class

    names: list[str] = []
    for name in classes:
        try:
            names.append(canonical_class(name))
        except PointPillarsError:
            continue
    return tuple(dict.fromkeys(names)) or DEFAULT_CLASSES


def run_infer(args: argparse.Namespace) -> int:
    """``infer``: 0 when every frame went through, 1 when some failed (each listed), 2 on a user error."""
    try:
        from .serve import cli as serve_cli
    except ImportError:
        serve_cli = None  # type: ignore[assignment]
    scaleout = getattr(serve_cli, "scaleout_requested", None)
    if serve_cli is not None and scaleout is not None and scaleout(args):
        return int(serve_cli.run_scaleout_infer(args))
    return infer_with(args, lambda: open_model(args))


def check_outputs(args: argparse.Namespace, frames: Sequence[str]) -> tuple[str, Path | None, Path | None]:
    """infer's checks of its output options before anything runs: (format, --out, --eval labels)."""
    fmt = args.format or ("kitti" if args.eval else "json")
    out = Path(args.out) if args.out else None
    if args.viz and out is None:
        raise InputError("--viz needs --out DIR: the pictures are written there")
    if args.calib is not None and not os.path.isdir(args.calib):
        raise InputError(f"--calib {safe_repr(args.calib)}: calib folder does not exist or is not a folder")
    labels = _prepare_eval(args, frames)
    if out is not None:
        suffixes = [".json" if fmt == "json" else ".txt"] + ([".png"] if args.viz else [])
        check_unique_names(frames, suffixes, reserved=[EVAL_FILE] if labels is not None else [])
    elif labels is not None:
        check_unique_names(frames, [".txt"])
    if args.viz:
        from .viz import require_matplotlib

        require_matplotlib()
    return fmt, out, labels


def check_model_inputs(cfg: Any, fmt: str, point_dim: int, frames: Sequence[str]) -> None:
    """What the model needs of infer's options, checked once before any frame runs: .bin frames of at
    least its point columns (a single sweep given to a multi-sweep model is refused, not padded with
    time 0: that would lose accuracy silently), and no KITTI label files for models that predict
    velocities of full 360-degree frames (nuScenes-style: camera-frame labels cannot carry them)."""
    columns = cfg.num_point_columns
    if point_dim < columns and any(str(f).lower().endswith(".bin") for f in frames):
        raise InputError(f"--point-dim {point_dim}: model {cfg.name} reads {columns} values a point "
                         f"({', '.join(cfg.point_columns)}); pass --point-dim {columns}")
    if fmt == "kitti" and cfg.box_code.velocity:
        raise InputError(f"--format kitti: model {cfg.name} predicts box velocities on 360-degree multi-sweep "
                         "frames, which KITTI label files (camera-frame boxes) cannot carry; use --format json")


def output_plan(args: argparse.Namespace, fmt: str, out: Path | None, point_range: Sequence[float] | None,
                kitti_dir: Path | None = None) -> OutputPlan:
    """The OutputPlan of infer's options (``kitti_dir``: where KITTI lines go when --out takes JSON)."""
    return OutputPlan(
        json_dir=out if fmt == "json" else None,
        kitti_dir=out if fmt == "kitti" and out is not None else kitti_dir,
        png_dir=out if args.viz else None,
        calib_dir=args.calib,
        image_shape=args.image_shape,
        keep_out_of_view=args.keep_out_of_view,
        point_range=tuple(point_range) if point_range is not None else None,
    )


def infer_with(args: argparse.Namespace, open_detector: Callable[[], Any], batch: int | None = None) -> int:
    """infer's run with the detector ``open_detector()`` gives (anything with ``detect_batch``,
    ``close`` and ``cfg`` or ``class_names``), ``batch`` (default --batch-size) frames at a time."""
    frames = expand_frame_paths(args.paths)
    fmt, out, labels = check_outputs(args, frames)
    detector = open_detector()
    try:
        cfg = getattr(detector, "cfg", None)
        if cfg is not None:
            check_model_inputs(cfg, fmt, args.point_dim, frames)
        with tempfile.TemporaryDirectory(prefix="pp-infer-") as scratch:
            scratch_dir = Path(scratch) if labels is not None and (fmt != "kitti" or out is None) else None
            plan = output_plan(args, fmt, out, cfg.voxel.point_range if cfg is not None else None, scratch_dir)
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
            done, failures = _run_frames(detector, frames, plan, args, batch)
            if labels is not None:
                classes = cfg.classes if cfg is not None else detector.class_names
                _evaluate(labels, plan.kitti_dir, done, frames, failures, classes, out)  # type: ignore[arg-type]
    finally:
        detector.close()
    return EXIT_FRAME_FAILURES if failures else 0


class FrameReport:
    """infer's account of a run, whichever path ran the frames: a progress bar, one ``error:`` line a
    failed frame, one line a frame when nothing is written, and the summary at ``close``."""

    def __init__(self, total: int, plan: OutputPlan, *, progress: bool, where: bool) -> None:
        from tqdm import tqdm

        self.total, self.plan, self.where = total, plan, where
        self.done: list[str] = []
        self.failed = self.boxes = self.nonfinite = self.out_of_view = 0
        self.writes = plan.json_dir or plan.kitti_dir or plan.png_dir
        self.bar = tqdm(total=total, unit="frame", disable=not progress or total < 2, file=sys.stderr)
        self.start = time.perf_counter()

    def note(self, text: str) -> None:
        """A line on stderr that leaves the progress bar whole."""
        self.bar.write(text, file=sys.stderr)

    def fail(self, source: str, message: str) -> None:
        self.failed += 1
        self.bar.update(1)
        self.note(f"error: {safe_repr(source)}: {message}")

    def write(self, det: Detections, source: str, points: np.ndarray | None = None) -> FrameOutput | None:
        """Write the frame's outputs per the plan and count it; a failed write is the frame's error."""
        try:
            written = write_frame_outputs(det, source, self.plan, points)
        except FRAME_ERRORS as exc:
            self.fail(source, one_line(exc))
            return None
        self.written(source, written, det)
        return written

    def written(self, source: str, written: FrameOutput, det: Detections | None = None) -> None:
        """Count a frame whose outputs are written (here, or by a worker elsewhere)."""
        self.bar.update(1)
        self.done.append(source)
        self.boxes, self.nonfinite, self.out_of_view = (self.boxes + written.boxes, self.nonfinite + written.nonfinite,
                                                        self.out_of_view + written.out_of_view)
        if not self.writes and det is not None:
            names, scores = det.names, det.scores.tolist()
            top = ", ".join(f"{n} {s:.2f}" for n, s in zip(names[:3], scores[:3]))
            self.bar.write(f"{safe_repr(Path(source).name)}: {written.boxes} boxes, "
                           f"{det.stats.num_pillars} pillars" + (f" [{top}]" if top else ""))

    def close(self) -> tuple[list[str], int]:
        """Print the summary (and the failure count); (frames that went through, number that failed)."""
        self.bar.close()
        seconds = time.perf_counter() - self.start
        total = max(self.total, len(self.done) + self.failed)
        where = f", written to {self.writes}" if self.where else ""
        dropped = []
        if self.nonfinite:
            dropped.append(f"{self.nonfinite} non-finite")
        if self.out_of_view:
            dropped.append(f"{self.out_of_view} outside the camera image")
        print(f"{len(self.done)}/{total} frames, {self.boxes} boxes"
              + (f" ({', '.join(dropped)} dropped)" if dropped else "")
              + f"{where} ({total / max(seconds, 1e-9):.1f} frames/s)")
        if self.failed:
            print(f"{self.failed} of {total} frame(s) failed (listed above)", file=sys.stderr)
        return self.done, self.failed


def intensity_warning(source: str) -> str:
    return (f"warning: {safe_repr(source)}: intensities look like 0-255 values, but the model "
            "expects 0-1 reflectance (KITTI); pass --intensity-scale 0.00392156862745098 (1/255) "
            "if they are (warned once)")


def _run_frames(detector: Any, frames: Sequence[str], plan: OutputPlan, args: argparse.Namespace,
                batch: int | None = None) -> tuple[list[str], int]:
    """Read, detect and write every frame; (frames that went through, number that failed)."""
    from functools import partial

    from ..pointcloud_io import intensity_looks_8bit, read_points

    batch = batch or args.batch_size
    cfg = getattr(detector, "cfg", None)
    read = partial(read_points, point_dim=args.point_dim, intensity_scale=args.intensity_scale,
                   columns=cfg.num_point_columns if cfg is not None else 4)
    # multi-sweep (time-column) models such as nuScenes' are trained on 0-255 intensities
    check_intensity = args.intensity_scale is None and (
        cfg is None or ("intensity" in cfg.features.order and cfg.num_point_columns == 4))
    report = FrameReport(len(frames), plan, progress=not args.no_progress, where=bool(args.out))

    def flush(window: list[_Read]) -> None:
        ready = [item for item in window if item.points is not None]
        results = dict(zip((id(item) for item in ready), _detect(detector, ready)))
        for item in window:
            if item.points is None:
                report.fail(item.source, str(item.error))
                continue
            det, error = results[id(item)]
            if det is None:
                report.fail(item.source, str(error))
                continue
            report.write(det, item.source, item.points)

    warned = False
    reader = FrameReader(frames, read, depth=2 * batch)
    try:
        window: list[_Read] = []
        for item in reader:
            if check_intensity and not warned and item.points is not None and intensity_looks_8bit(item.points):
                warned = True
                report.note(intensity_warning(item.source))
            window.append(item)
            if sum(i.points is not None for i in window) == batch:
                flush(window)
                window = []
        flush(window)
    finally:
        reader.close()
        report.bar.close()
    return report.close()


def _detect(detector: PointPillars, items: Sequence[_Read]) -> list[tuple[Detections | None, str | None]]:
    """Detections of a window of frames in one batch; when the batch fails, each frame on its own."""
    if not items:
        return []
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite boxes are dropped and counted
            found = detector.detect_batch([item.points for item in items])
        return [(det, None) for det in found]
    except FRAME_ERRORS as exc:
        if len(items) == 1:
            return [(None, one_line(exc))]
        return [result for item in items for result in _detect(detector, [item])]


def _evaluate(labels: Path, pred_dir: Path, done: Sequence[str], frames: Sequence[str], failed: int,
              classes: Sequence[str], out: Path | None) -> None:
    from ..fileio import write_json_atomic
    from .eval.io import load_ground_truth, load_predictions
    from .eval.kitti_eval import evaluate
    from .eval.report import format_table

    if not done:
        raise InputError("--eval: no frame went through, so there is nothing to evaluate")
    ids = [Path(f).stem for f in done]
    result = evaluate(load_ground_truth(labels, ids), load_predictions(pred_dir, ids), _eval_classes(classes))
    skipped = f" ({failed} failed frame(s) left out)" if failed else ""
    print(f"KITTI evaluation of {len(ids)} frame(s) against {labels}{skipped}")
    print(format_table(result), end="")
    if out is not None:
        write_json_atomic(out / EVAL_FILE, result.to_json_dict())
        print(f"wrote {out / EVAL_FILE}")
