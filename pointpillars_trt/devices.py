"""Where a detector runs: a device string (auto, cpu, cuda, cuda:N) resolved against this machine, once, for
the detector and for the apps that must know before it opens (infer's readers, serve's instance kind, bench)."""

from __future__ import annotations

from typing import NamedTuple

from .errors import BackendError
from .runtime import BACKENDS
from .runtime.availability import describe_probes, gpu_visible
from .runtime_options import parse_device
from .stop_signals import stop_signals_blocked


def cuda_available(device_id: int = 0) -> str | None:
    """None when the GPU pipeline can run here (on GPU ``device_id``), else the reason it cannot. The CUDA
    driver starts its threads at the first call that asks it anything (here, as a rule): the stop signals are
    held meanwhile, so that those threads never take a Ctrl-C or SIGTERM (``stop_signals``)."""
    with stop_signals_blocked():
        return _cuda_unavailable_reason(device_id)


def _cuda_unavailable_reason(device_id: int) -> str | None:
    try:
        import cupy
    except ImportError:  # where no GPU shows either, installing CuPy would not help
        if not gpu_visible():
            return f"this machine shows no NVIDIA GPU (no {describe_probes()})"
        return "CuPy is not installed (pip install 'pointpillars-trt[cuda13]' or [cuda12])"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            return "no CUDA device is visible"
        if device_id >= count:
            return f"GPU {device_id} does not exist ({count} visible)"
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        return f"CUDA is unusable ({exc})"
    reasons = {name: row.unavailable_reason() for name, row in BACKENDS.items()}
    if all(reasons.values()):
        return "no GPU engine backend: " + "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
    return None


def cpu_fallback_text(multi_head: bool) -> str:
    """What device auto says as it falls back to the CPU, with what a frame of the model opened costs there and on
    a GPU (measured: a single-head KITTI model about 1 s a frame on two cores, a multi-head nuScenes one 1.4-3.4 s;
    on a GPU 0.4-2.7 ms and 0.6-4.5 ms, fp16 to IEEE fp32), so that no model is promised another's speed."""
    cpu = "one to a few seconds a frame for a multi-head model" if multi_head else "about a second a frame"
    return f"device auto: running on the CPU ({cpu}; a few milliseconds at most on a GPU)"


class PickedDevice(NamedTuple):
    """Where the frames run: ``kind`` "cpu" or "cuda", the GPU index ``gpu`` (0 on the CPU), and
    ``fallback_reason``: why device auto runs them on the CPU (None when it did not fall back)."""

    kind: str
    gpu: int
    fallback_reason: str | None


def pick_device(device: str) -> PickedDevice:
    """The device string resolved here: auto takes the GPU when the GPU pipeline can run, else the CPU (with
    the reason); an explicit cuda or cuda:N that cannot run is a BackendError saying why."""
    kind, index = parse_device(device)
    device_id = index or 0
    if kind == "cpu":
        return PickedDevice("cpu", 0, None)
    reason = cuda_available(device_id)
    if reason is None:
        return PickedDevice("cuda", device_id, None)
    if kind == "cuda":
        if not gpu_visible():  # no driver: what the GPU path lacks besides is beside the point
            raise BackendError(f"device {device} requested, but this machine shows no NVIDIA GPU (no "
                               f"{describe_probes()}): run on the CPU here (--device cpu or auto; Python: "
                               "device='cpu' or 'auto')")
        raise BackendError(f"device {device} requested, but {reason}")
    return PickedDevice("cpu", 0, reason)


def check_backend_runs_on(kind: str, backend: str, fallback_reason: str | None = None) -> None:
    """Refuse a GPU-only engine backend for frames that run on the CPU (``kind`` "cpu"); ``fallback_reason``:
    why device auto runs them there (``PickedDevice``), which the refusal then says in its place of a warning."""
    on_cpu = ["auto", *(name for name, row in BACKENDS.items() if "cpu" in row.devices)]
    if kind == "cpu" and backend not in on_cpu:
        why = f", and device auto runs on the CPU here: {fallback_reason}" if fallback_reason else ""
        raise BackendError(f"backend {backend!r} runs only in the GPU pipeline{why}; the CPU path uses ONNX Runtime "
                           f"(pass --backend {' or '.join(on_cpu)}; Python: backend="
                           f"{' or '.join(map(repr, on_cpu))}; or run where CUDA is available)")
