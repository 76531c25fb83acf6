"""The CLI's runtime arguments as the one ``RuntimeOptions`` value that local ``infer``, the Triton model
and the Ray actors all pass to ``PointPillars``."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from ..config import Thresholds
from ..errors import InputError, SettingNotice, safe_repr
from ..model_dir import load_model_dir, recorded_precision
from ..runtime_options import RuntimeOptions, cpu_threads


def add_model_arguments(group: argparse._ActionsContainer) -> None:
    """``--config`` and ``--precision`` of a ``--model`` that is a model dir or a checkpoint, as infer and serve
    open it (``apps/serve/repository.resolve_model``): one definition for both."""
    group.add_argument("--config", help="config name or YAML path the model must have been built for "
                                        "(default: the model dir's own; a checkpoint's layout)")
    group.add_argument("--precision", choices=("fp32", "fp16"), default=None,
                       help="graphs exported from a .pth --model (default: fp32; a model dir runs in the precision "
                            "it was built in, and refuses another)")


def exports_checkpoint(model: str | None, precision: str | None) -> bool:
    """Whether ``--model`` is a checkpoint file, which ``--precision`` exports; a model dir runs as built, and a
    ``--precision`` other than the one it was built in is refused rather than ignored. Where its model.json records
    the precision given, that file alone is read (the open that follows reads and checks the graphs, once); else the
    model dir is opened here, so that a damaged one is said as damaged before any word of its precision."""
    exports = model is not None and Path(model).is_file()
    if model is not None and not exports and precision is not None and Path(model).is_dir() \
            and recorded_precision(Path(model)) != precision:
        built_in = load_model_dir(model).precision
        if precision != built_in:
            raise InputError(f"--precision {precision}: model dir {safe_repr(model)} was built in {built_in}; "
                             f"drop --precision, or build a model dir with --precision {precision}")
    return exports


def runtime_options_from_args(args: argparse.Namespace, threads: int | None = None) -> RuntimeOptions:
    """``--device --backend --no-tf32 --threads --batch-size --score-threshold --nms-iou --max-boxes``
    (and ``--precision`` when ``--model`` is a checkpoint to export: ``exports_checkpoint``); ``threads``: the CPU
    threads the run decided (a pipeline's share of the cores), else ``--threads``."""
    exports = exports_checkpoint(getattr(args, "model", None), args.precision)
    return RuntimeOptions(
        device=args.device, backend=args.backend, tf32=not args.no_tf32, threads=threads or threads_of_args(args),
        max_batch=getattr(args, "batch_size", None) or 1, precision=(args.precision or "fp32") if exports else None,
        thresholds=Thresholds(args.score_threshold, args.nms_iou, args.max_boxes),
    )


def threads_of_args(args: argparse.Namespace) -> int | None:
    """``--threads``, at most this machine's cores (more is said in a note, as ``OMP_NUM_THREADS`` beyond them
    is); with ``--ray`` as given: the workers cap it to theirs (``detect_dataset``), saying so once."""
    threads: int | None = args.threads
    if threads is None or getattr(args, "ray", False):
        return threads
    threads, _, note = cpu_threads(threads, "--threads ")
    if note is not None:
        warnings.warn(note, SettingNotice, stacklevel=3)
    return threads
