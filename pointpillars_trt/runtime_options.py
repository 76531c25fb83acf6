"""How a detector runs, as one frozen value: what the CLI builds from its arguments and what ``infer``,
the Triton model and the Ray actors all hand to ``PointPillars``, so every path runs alike.

It holds nothing the model dir decides (the config, the graphs): only the device, the engine backend,
the arithmetic (TF32), CUDA graphs, CPU threads, the batch size and the post-process thresholds.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .config import Thresholds, int_within, plain_number
from .errors import PointPillarsError, counted, safe_repr
from .graph_io import MAX_BATCH, PRECISIONS
from .runtime.backends import BACKEND_CHOICES

DEVICES_EXPECTED = "auto, cpu, cuda or cuda:N"


def parse_device(text: str) -> tuple[str, int | None]:
    """(kind, GPU index or None) of a device string: auto, cpu, cuda or cuda:N (the one parser)."""
    parsed = _device(text)
    if parsed is None:
        raise PointPillarsError(f"device {text!r}: {devices_expected(text)}")
    return parsed


def devices_expected(text: str) -> str:
    """What a refusal of ``text`` as a device says: "expected auto, cpu, cuda or cuda:N", and "; did you mean
    cuda:0?" for another tool's way to name a device (trtexec's --device=0, PyTorch's device=0, gpu, GPU:1, CPU)."""
    lowered = str(text).strip().lower()
    if lowered.isdigit() and lowered.isascii():
        lowered = f"cuda:{lowered}"
    kind, sep, index = lowered.partition(":")
    meant = ("cuda" if kind == "gpu" else kind) + sep + index
    hint = f"; did you mean {meant}?" if meant != str(text) and _device(meant) is not None else ""
    return f"expected {DEVICES_EXPECTED}{hint}"


def _device(text: str) -> tuple[str, int | None] | None:
    """``parse_device``'s value, or None where ``text`` names no device."""
    kind, sep, index = str(text).partition(":")
    if kind in ("auto", "cpu", "cuda") and not sep:
        return kind, None
    if kind == "cuda" and index.isdigit() and index.isascii():
        return kind, int(index)
    return None


@dataclass(frozen=True)
class RuntimeOptions:
    """``device``: auto (the GPU when it can run here, else the CPU), cpu, cuda or cuda:N. ``backend``: the
    GPU engine (runtime/backends.py; auto picks). ``precision``: the graphs exported from a checkpoint
    (None: fp32; a model dir runs as built). ``tf32``: fp32 engines may use TensorFloat-32 (False: IEEE
    fp32, as the CPU path). ``cuda_graph``: replay a batch's stages and result copy from one captured CUDA graph
    (False: launch them one by one).
    ``threads``: ONNX Runtime's CPU thread pool (None: ``OMP_NUM_THREADS``, else one per core); more than the
    cores where the detector runs (a Ray worker's, say) runs as many as they are, said in a note there.
    ``max_batch``: frames the GPU pipeline runs at once (1..MAX_BATCH). ``thresholds``: the post-process
    values (None fields: the model's); their ``max_boxes`` is also the cap of per-call values.
    ``stage_timings``: GPU per-stage milliseconds in ``last_timings`` (CUDA events between the stages,
    which cost ~20 us of GPU time a batch; the CPU path always has its wall-clock ones)."""

    device: str = "auto"
    backend: str = "auto"
    precision: str | None = None
    tf32: bool = True
    cuda_graph: bool = True
    threads: int | None = None
    max_batch: int = 1
    thresholds: Thresholds = field(default_factory=Thresholds)
    stage_timings: bool = False

    def __post_init__(self) -> None:
        for name in ("threads", "max_batch"):  # NumPy integers (e.g. read from a config array) held as ints
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        parse_device(self.device)
        if self.backend not in BACKEND_CHOICES:
            raise PointPillarsError(f"backend {self.backend!r}: expected one of {', '.join(BACKEND_CHOICES)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise PointPillarsError(f"precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        for name in ("tf32", "cuda_graph", "stage_timings"):
            if not isinstance(getattr(self, name), bool):
                raise PointPillarsError(f"{name}: expected True or False, received {getattr(self, name)!r}")
        if self.threads is not None and int_within(self.threads, 1) is None:
            raise PointPillarsError(f"threads: expected an integer >= 1 or None, received {self.threads!r}")
        if int_within(self.max_batch, 1, MAX_BATCH) is None:
            raise PointPillarsError(f"max_batch: expected 1..{MAX_BATCH}, received {self.max_batch!r}")
        if not isinstance(self.thresholds, Thresholds):
            raise PointPillarsError(f"thresholds: expected Thresholds, received {type(self.thresholds).__name__}")

    @classmethod
    def of(cls, *, score_threshold: float | None = None, nms_iou: float | None = None, max_boxes: int | None = None,
           **settings: Any) -> RuntimeOptions:
        """From keyword arguments, the thresholds given flat (``score_threshold=0.3``) as the
        detector's convenience keywords take them; an unknown keyword is refused by name."""
        known = {f.name for f in fields(cls)} - {"thresholds"}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise PointPillarsError(f"unknown runtime option {unknown[0]!r}: expected one of "
                                    f"{', '.join(sorted(known | {'score_threshold', 'nms_iou', 'max_boxes'}))}")
        return cls(**settings, thresholds=Thresholds(score_threshold, nms_iou, max_boxes))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (for a Triton model config's parameters); ``from_dict`` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeOptions:
        values = dict(data)
        values["thresholds"] = Thresholds(**values.get("thresholds", {}))
        return cls(**values)


def capped_threads(count: int, what: str) -> tuple[int, str | None]:
    """``count`` CPU threads at most the cores of this process (``max_threads``), where the detector runs, and
    the note that says so when they are fewer (None: ``count`` as asked); ``what`` names the setting in it
    (``--threads 64``, ``OMP_NUM_THREADS=64``): the one check, wherever a thread count is taken."""
    cores = max_threads()
    if count <= cores:
        return count, None
    return cores, f"{what} is more than the {counted(cores, 'core')} where the detector runs: {counted(cores, 'thread')}"


def cpu_threads(threads: int | None, setting: str, cap: bool = True) -> tuple[int | None, str | None, str | None]:
    """The CPU threads a detector takes, the one rule of every path: ``threads`` asked (``setting`` names it before a
    count: ``threads=``, ``--threads ``), else ``OMP_NUM_THREADS`` (ONNX Runtime itself ignores the variable; one that
    is no thread count is left out), at most the cores where the detector runs (``capped_threads``; ``cap`` False
    where it runs elsewhere, as a Ray worker, which caps them to its own). (the count, None where neither gives one;
    the setting that names that count, as notes quote it; the note to say once where the variable was left out or
    the count capped, else None.)"""
    if threads is not None:
        count, source = threads, setting
    else:
        value = os.environ.get("OMP_NUM_THREADS", "").strip()
        if not value:
            return None, None, None
        if not (value.isascii() and value.isdigit() and int(value) >= 1):  # '²' is a digit int() refuses
            return None, None, (f"OMP_NUM_THREADS={safe_repr(value)} is no thread count (a positive whole number): "
                                "left out, ONNX Runtime picks its own")
        count, source = int(value), "OMP_NUM_THREADS="
    note = None
    if cap:
        count, note = capped_threads(count, f"{source}{count}")
    return count, f"{source}{count}", note


def pipeline_threads(pipelines: int, threads: int | None, what: str | None) -> tuple[int | None, str | None]:
    """The ONNX Runtime threads of each of ``pipelines`` CPU pipelines (``threads``: the count asked for each, at
    most the cores, by the setting ``what`` names (``--threads 2``, ``OMP_NUM_THREADS=2``); None: none asked) and
    the note that says how they share the cores where the detector runs (None: one pipeline, or no contention).
    Unasked, every session would take a thread per core and the pipelines would contend for them, so the cores
    are split."""
    if pipelines < 2:
        return threads, None
    cores = max_threads()
    share = cores // pipelines
    if threads is None:
        each = max(1, share)
        crowded = f"; more pipelines than cores only contend for them: --pipelines {cores}" if not share else ""
        return each, (f"{pipelines} pipelines on the CPU share its {counted(cores, 'core')}: "
                      f"{counted(each, 'ONNX Runtime thread')} each{crowded}")
    if threads * pipelines <= cores:
        return threads, None
    fix = (f"--threads {share} gives each pipeline its share" if share else
           f"--pipelines {max(1, cores // threads)} runs them without contending")
    return threads, (f"--pipelines {pipelines} with {what}: {threads * pipelines} ONNX Runtime threads contend for "
                     f"{counted(cores, 'core')}; {fix}")


def max_threads() -> int:
    """The most CPU threads ONNX Runtime may be given: the cores this process may run on (more only contend
    for them, and thousands take minutes and gigabytes just to start)."""
    if hasattr(os, "sched_getaffinity"):  # the CPUs taskset or a cpuset allows (a CPU quota is not seen)
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
