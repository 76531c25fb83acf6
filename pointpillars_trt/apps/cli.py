"""``pointpillars-trt build | infer | demo | bench``: thin commands over the package API.

User errors (``PointPillarsError``) end in one ``error:`` line and exit code 2, never a traceback; in a
batch, each failed frame is listed and the others still get their outputs (exit code 1).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError, PointPillarsError

EXIT_FRAME_FAILURES = 1
EXIT_USER_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except PointPillarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:  # the file system refused (e.g. --out below a regular file): the user's to fix
        print(f"error: {_os_error(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pointpillars-trt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="checkpoint -> ONNX graphs (+ TensorRT plans) in a model dir")
    build.add_argument("--checkpoint", required=True, help="OpenPCDet or zhulf0804 .pth file")
    build.add_argument("--out", required=True, help="model dir to write")
    build.add_argument("--config", help="config name or YAML path (default: from the checkpoint's layout)")
    build.add_argument("--backend", choices=("onnxruntime", "tensorrt"), default="onnxruntime")
    build.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    build.add_argument("--no-tf32", action="store_true", help="TensorRT fp32 plans without TensorFloat-32 (IEEE fp32)")
    build.set_defaults(run=_cmd_build)

    infer = sub.add_parser("infer", help="detect on KITTI velodyne .bin files")
    infer.add_argument("paths", nargs="+", metavar="PATH", help=".bin files, folders of them, or globs")
    infer.add_argument("--model", required=True, help="model dir (from build) or a .pth checkpoint")
    infer.add_argument("--out", help="folder for one output file per frame (default: print a summary only)")
    infer.add_argument("--format", choices=("json", "kitti"), default="json")
    infer.add_argument("--calib", help="folder of KITTI calib .txt files named like the frames (for --format kitti)")
    infer.add_argument("--config", help="config name or YAML path (default: the model's own)")
    infer.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    infer.add_argument("--backend", choices=("auto", "onnxruntime", "tensorrt"), default="auto")
    infer.add_argument("--precision", choices=("fp32", "fp16"), default="fp32",
                       help="graphs exported from a .pth --model (a model dir keeps its own)")
    infer.add_argument("--no-tf32", action="store_true", help="GPU fp32 engines in IEEE fp32 (as the CPU path)")
    infer.add_argument("--no-progress", action="store_true", help="no progress bar")
    infer.set_defaults(run=_cmd_infer)

    demo = sub.add_parser("demo", help="run the whole path on a simulated frame with a seeded, UNTRAINED model")
    demo.add_argument("--out", default="demo_out", help="folder for the frame, model, JSON and PNG")
    demo.add_argument("--config", default="openpcdet_kitti_3class")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    demo.set_defaults(run=_cmd_demo)

    from .bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def _cmd_build(args: argparse.Namespace) -> int:
    from ..build.export import build_model_dir

    model = build_model_dir(args.checkpoint, args.out, config=args.config, backend=args.backend,
                            precision=args.precision, tf32=not args.no_tf32)
    print(f"wrote {model.path} ({model.cfg.name}, {args.precision}, {args.backend})")
    for name in sorted(p.name for p in Path(model.path).iterdir()):
        print(f"  {name}")
    return 0


def _cmd_infer(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..fileio import write_json_atomic, write_text_atomic
    from ..kitti import lidar_boxes_to_kitti_lines, read_calibration

    frames = expand_frame_paths(args.paths)
    if args.format == "kitti" and not (args.calib and os.path.isdir(args.calib)):
        raise InputError(f"--format kitti needs --calib DIR, a folder of KITTI calib files named like the frames "
                         f"(got {args.calib!r})")
    out = Path(args.out) if args.out else None
    if out:
        _check_unique_names(frames)
        out.mkdir(parents=True, exist_ok=True)
    detector = _open_model(args.model, config=args.config, device=args.device, backend=args.backend,
                           precision=args.precision, tf32=not args.no_tf32)
    failures: list[tuple[str, str]] = []
    total_boxes = 0
    results = detector.infer_many(frames)
    bar = tqdm(results, total=len(frames), unit="frame", disable=args.no_progress or len(frames) < 2,
               file=sys.stderr)
    for result in bar:
        frame = Path(result.source)
        if result.error is not None or result.detections is None:
            failures.append((result.source, str(result.error)))
            continue
        det = result.detections
        try:
            if out and args.format == "json":
                target = out / f"{frame.stem}.json"
                write_json_atomic(target, det.to_json_dict(frame.stem))
            elif out:
                calib = read_calibration(Path(args.calib) / f"{frame.stem}.txt")
                lines = lidar_boxes_to_kitti_lines(det.boxes, det.scores, det.names, calib)
                target = out / f"{frame.stem}.txt"
                write_text_atomic(target, "".join(line + "\n" for line in lines))
        except PointPillarsError as exc:
            failures.append((result.source, str(exc)))
            continue
        except OSError as exc:  # the frame is fine; its output could not be written
            failures.append((result.source, f"cannot write {target}: {exc.strerror or exc}"))
            continue
        total_boxes += len(det)
        if not out:
            top = ", ".join(f"{n} {s:.2f}" for n, s in zip(det.names[:3], det.scores[:3].tolist()))
            bar.write(f"{frame.name}: {len(det)} boxes, {det.stats.num_pillars} pillars" + (f" [{top}]" if top else ""))
    detector.close()
    done = len(frames) - len(failures)
    print(f"{done}/{len(frames)} frames, {total_boxes} boxes" + (f", written to {out}" if out else ""))
    for source, message in failures:
        print(f"FAILED {source}: {message}", file=sys.stderr)
    return EXIT_FRAME_FAILURES if failures else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(Path(args.out), config=args.config, seed=args.seed, device=args.device)


def _check_unique_names(frames: Sequence[str]) -> None:
    """Outputs are named after the frame, so two frames of one name would overwrite each other."""
    by_name: dict[str, list[str]] = {}
    for frame in frames:
        by_name.setdefault(Path(frame).stem, []).append(frame)
    clashes = [paths for paths in by_name.values() if len(paths) > 1]
    if clashes:
        raise InputError(f"frames {' and '.join(clashes[0])} would write the same output file "
                         f"({len(clashes)} such name(s)); run them into separate --out folders")


def _os_error(exc: OSError) -> str:
    """``path: reason`` in one line, without the errno prefix of ``str(OSError)``."""
    if exc.filename is None or exc.strerror is None:
        return str(exc)
    return f"{exc.filename}: {exc.strerror}"


def expand_frame_paths(patterns: Sequence[str]) -> list[str]:
    """Files as given, folders as their sorted ``*.bin``, globs expanded; a name matching nothing is kept
    so that it is reported as a missing frame instead of vanishing."""
    frames: list[str] = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            found = sorted(glob.glob(os.path.join(pattern, "*.bin")))
            if not found:
                raise InputError(f"{pattern}: folder holds no .bin files")
            frames.extend(found)
        elif glob.has_magic(pattern):
            found = sorted(glob.glob(pattern))
            if not found:
                raise InputError(f"{pattern}: no file matches")
            frames.extend(found)
        else:
            frames.append(pattern)
    return frames


def _open_model(model: str, *, config: str | None, device: str, backend: str, precision: str,  # type: ignore[no-untyped-def]
                tf32: bool):
    from ..detector import PointPillars

    path = Path(model)
    if not path.exists():
        raise InputError(f"--model {model}: no such checkpoint file or model dir")
    if path.is_file():
        return PointPillars.from_checkpoint(path, config=config, precision=precision, device=device,  # type: ignore[arg-type]
                                            backend=backend, tf32=tf32)
    return PointPillars.from_model_dir(path, config=config, device=device, backend=backend, tf32=tf32)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
