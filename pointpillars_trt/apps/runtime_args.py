"""The CLI's runtime arguments as the one ``RuntimeOptions`` value that local ``infer``, the Triton model
and the Ray actors all pass to ``PointPillars``."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from ..config import Thresholds
from ..errors import InputError, SettingNotice, safe_repr
from ..model_dir import load_model_dir
from ..runtime_options import RuntimeOptions, cpu_threads


def runtime_options_from_args(args: argparse.Namespace, threads: int | None = None) -> RuntimeOptions:
    """``--device --backend --no-tf32 --threads --batch-size --score-threshold --nms-iou --max-boxes``
    (and ``--precision`` when ``--model`` is a checkpoint to export; a model dir runs as built, and a
    ``--precision`` other than the one it was built in is refused rather than ignored); ``threads``: the CPU
    threads the run decided (a pipeline's share of the cores), else ``--threads``."""
    model = getattr(args, "model", None)
    exports = model is not None and Path(model).is_file()
    if model is not None and not exports and args.precision is not None and Path(model).is_dir():
        built_in = load_model_dir(model).precision
        if args.precision != built_in:
            raise InputError(f"--precision {args.precision}: model dir {safe_repr(model)} was built in {built_in}; "
                             f"drop --precision, or build a model dir with --precision {args.precision}")
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
