"""The line every command prints before it runs frames: which device, engine and precision.

A run that lands on the CPU on a machine with an NVIDIA GPU (no CUDA extra installed, say) is more than
a thousand times slower than the user expects, so it is never silent: the notice says why the GPU path is unusable
and how to fix it. An fp16 model dir on the CPU is said too: its graphs gain no speed there (1.1-1.4x the
time of fp32 graphs measured), only fp16 rounding; and so is ``--no-tf32`` there, which changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ..runtime.availability import GPU_PROBES, GpuProbe, gpu_visible

CUDA_EXTRA = 'pip install "pointpillars-trt[cuda13]" (or [cuda12] for CUDA 12 drivers)'
#: Said when fp16 graphs run on the CPU (a local run's detector, bench's CPU run, or Ray's CPU workers).
CPU_FP16_NOTE = ("note: fp16 graphs run no faster than fp32 on the CPU (slower, and rounded to fp16); for CPU runs use "
                 "fp32 graphs (a checkpoint without --precision fp16, or a model dir built with --precision fp32)")
#: Said when a run given ``--no-tf32`` (``RuntimeOptions.tf32`` False) runs on the CPU, where it changes nothing.
CPU_TF32_NOTE = ("note: --no-tf32 changes nothing on the CPU: TensorFloat-32 is a setting of the GPU engines, and the "
                 "CPU path computes fp32 graphs in IEEE float32 already")


def device_notice(detector: Any, *, probes: Sequence[GpuProbe] = GPU_PROBES) -> list[str]:
    """The lines to print before a run: ``running on <device, engine, precision>``, then a note when
    a visible GPU goes unused, fp16 graphs run on the CPU, or the CPU runs a detector told not to use TF32.
    Empty for a detector that does not say what runs it (a Triton client)."""
    description = getattr(detector, "engine_description", None)
    if description is None:
        return []
    lines = [f"running on {description}"]
    note = gpu_unused_note(getattr(detector, "gpu_unused_reason", None), probes)
    if note is not None:
        lines.append(note)
    note = cpu_fp16_note(getattr(detector, "device", None), detector.model.precision)
    if note is not None:
        lines.append(note)
    note = cpu_tf32_note(getattr(detector, "device", None), getattr(detector, "options", None))
    if note is not None:
        lines.append(note)
    return lines


def cpu_fp16_note(device: str | None, precision: str) -> str | None:
    """``CPU_FP16_NOTE`` for graphs of ``precision`` that run on ``device`` "cpu", where fp16 gains no speed (else
    None): a local run's detector, bench's CPU run, or Ray's CPU workers."""
    return CPU_FP16_NOTE if device == "cpu" and precision == "fp16" else None


def cpu_tf32_note(device: str | None, options: Any) -> str | None:
    """``CPU_TF32_NOTE`` for a run on ``device`` whose ``options`` (``RuntimeOptions``; None: not known) turn
    TF32 off and that runs on the CPU, where it changes nothing (else None): a local run's detector, or Ray's
    CPU workers."""
    if device == "cpu" and options is not None and not options.tf32:
        return CPU_TF32_NOTE
    return None


def gpu_unused_note(reason: str | None, probes: Sequence[GpuProbe] = GPU_PROBES) -> str | None:
    """The note for a run that went to the CPU for ``reason`` while a GPU is visible (else None)."""
    if reason is None or not gpu_visible(probes):
        return None
    fix = "" if "pip install" in reason else f"; for the GPU pipeline: {CUDA_EXTRA}"
    return f"note: a GPU is visible, but the GPU path is unusable: {reason}{fix}"


def print_device_notice(detector: Any, file: Any = None) -> None:
    """``device_notice`` on stderr."""
    for line in device_notice(detector):
        print(line, file=file or sys.stderr, flush=True)
