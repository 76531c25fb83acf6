"""The public detector: one API over the CPU path and the GPU pipeline."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from .checkpoint import load_checkpoint
from .config import ModelConfig, load_config
from .detections import Detections
from .errors import BackendError, PointPillarsError
from .kitti import read_velodyne_bin
from .model_dir import ModelDir, export_model_dir, load_model_dir
from .points import as_host_points

Device = Literal["auto", "cpu", "cuda"]


class _Implementation(Protocol):
    last_timings: dict[str, float]

    def detect(self, points: Any) -> Detections: ...  # host (N, 4) float32, or a device array on the GPU

    def close(self) -> None: ...


@dataclass(frozen=True)
class FrameResult:
    """One frame of ``infer_many``: detections, or the error that frame alone raised."""

    source: str
    detections: Detections | None
    error: PointPillarsError | None


def cuda_available() -> str | None:
    """None when the GPU pipeline can run here, else the reason it cannot."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'pointpillars-trt[cuda13]' or [cuda12])"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        return f"CUDA is unusable ({exc})"
    from .runtime import onnxruntime_cuda_available, tensorrt_available

    if not (onnxruntime_cuda_available() or tensorrt_available()):
        return ("no GPU engine backend: install TensorRT, or onnxruntime-gpu in place of onnxruntime "
                "(pip uninstall onnxruntime && pip install onnxruntime-gpu)")
    return None


class PointPillars:
    """A PointPillars detector loaded from a model dir or a checkpoint.

    ``device="auto"`` picks the GPU pipeline when CuPy and a CUDA device are present, else the CPU path.
    GPU only: ``cuda_graph`` replays each stage from a captured CUDA graph; ``tf32`` lets fp32 engines
    use TensorFloat-32 as TensorRT and PyTorch do by default (``False``: IEEE fp32, as the CPU path).
    """

    def __init__(self, model: ModelDir, *, device: Device = "auto", backend: str = "auto",
                 cuda_graph: bool = True, tf32: bool = True) -> None:
        self.model = model
        self.cfg: ModelConfig = model.cfg
        self.device = _resolve_device(device)
        if self.device == "cpu" and backend not in ("auto", "onnxruntime"):
            raise BackendError(f"backend {backend!r} runs only in the GPU pipeline; the CPU path uses ONNX Runtime "
                               "(pass backend auto or onnxruntime, or run where CUDA is available)")
        if self.device == "cuda":
            from .pipeline import GpuPipeline

            self._impl: _Implementation = GpuPipeline(model, backend=backend, cuda_graph=cuda_graph, tf32=tf32)
        else:
            from .cpu_detector import CpuDetector

            self._impl = CpuDetector(model)

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike[str], *, config: str | ModelConfig | None = None,
                       device: Device = "auto", backend: str = "auto", cuda_graph: bool = True,
                       tf32: bool = True) -> PointPillars:
        expected = load_config(config) if isinstance(config, (str, os.PathLike)) else config
        return cls(load_model_dir(path, expected), device=device, backend=backend, cuda_graph=cuda_graph, tf32=tf32)

    from_engines = from_model_dir

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], *, config: str | ModelConfig | None = None,
                        precision: str = "fp32", device: Device = "auto", backend: str = "auto",
                        cuda_graph: bool = True, tf32: bool = True,
                        cache_dir: str | os.PathLike[str] | None = None) -> PointPillars:
        """Import a .pth and export its graphs once into a cache folder keyed by file hash and config."""
        model = model_dir_for_checkpoint(path, config=config, precision=precision, cache_dir=cache_dir,
                                         tensorrt_plans=backend == "tensorrt")
        return cls(model, device=device, backend=backend, cuda_graph=cuda_graph, tf32=tf32)

    @property
    def last_timings(self) -> dict[str, float]:
        """Milliseconds per stage of the last frame (GPU: CUDA events; CPU: wall clock)."""
        return self._impl.last_timings

    def __call__(self, points: object) -> Detections:
        return self._impl.detect(_device_or_host_points(points, self.device))

    def infer_many(self, frames: Iterable[object]) -> Iterator[FrameResult]:
        """Detect on many frames (arrays or .bin paths); a bad frame yields its error, the rest go on.

        The next frame is read from disk while the current one runs (on the GPU the detect call
        releases the GIL while it waits for the device).
        """
        from concurrent.futures import ThreadPoolExecutor

        items = iter(enumerate(frames))
        with ThreadPoolExecutor(max_workers=1) as reader:
            pending = _submit_next(reader, items)
            while pending is not None:
                source, future = pending
                pending = _submit_next(reader, items)
                try:
                    detections = self(future.result())
                except PointPillarsError as exc:
                    yield FrameResult(source, None, exc)
                else:
                    yield FrameResult(source, detections, None)

    def close(self) -> None:
        self._impl.close()

    def __enter__(self) -> PointPillars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def model_dir_for_checkpoint(path: str | os.PathLike[str], *, config: str | ModelConfig | None = None,
                             precision: str = "fp32", cache_dir: str | os.PathLike[str] | None = None,
                             tensorrt_plans: bool = False) -> ModelDir:
    """The cached model dir of a checkpoint, exported on first use (with TensorRT plans when asked)."""
    model = _cached_model_dir(path, config=config, precision=precision, cache_dir=cache_dir)
    if tensorrt_plans and not model.has_plans():
        from .build import build_model_plans

        build_model_plans(model, precision=precision)
    return model


def _cached_model_dir(path: str | os.PathLike[str], *, config: str | ModelConfig | None, precision: str,
                      cache_dir: str | os.PathLike[str] | None) -> ModelDir:
    ckpt = load_checkpoint(path, config)
    cfg = ckpt.config
    root = Path(cache_dir or os.environ.get("POINTPILLARS_TRT_CACHE") or Path.home() / ".cache" / "pointpillars-trt")
    key = hashlib.sha256(f"{ckpt.sha256}:{cfg.digest()}:{precision}".encode()).hexdigest()[:20]
    folder = root / key
    try:
        return load_model_dir(folder, cfg)
    except PointPillarsError:
        pass  # not built yet, or stale: rebuild below
    source = {"checkpoint": str(Path(path).resolve()), "sha256": ckpt.sha256, "layout": ckpt.layout}
    return export_model_dir(ckpt.weights, cfg, folder, precision=precision, source=source)


def _resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise PointPillarsError(f"device {device!r}: expected auto, cpu or cuda")
    if device == "cpu":
        return "cpu"
    reason = cuda_available()
    if reason is None:
        return "cuda"
    if device == "cuda":
        raise BackendError(f"device cuda requested, but {reason}")
    return "cpu"


_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def _device_or_host_points(points: object, device: str) -> object:
    """CUDA arrays go to the GPU pipeline untouched; everything else becomes (N, 4) float32 on the host."""
    if device == "cuda" and _is_cuda_array(points):
        return points
    return as_host_points(points)


def _is_cuda_array(points: object) -> bool:
    if hasattr(points, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(points, "__dlpack_device__", None)
    if dlpack_device is None or isinstance(points, np.ndarray):
        return False
    try:
        return int(dlpack_device()[0]) in _DLPACK_CUDA_DEVICES
    except Exception:  # noqa: BLE001 - a foreign object whose protocol misbehaves is treated as host data
        return False


def _load_frame(item: object) -> object:
    if isinstance(item, (str, os.PathLike)):
        return read_velodyne_bin(item)
    return item


def _submit_next(reader, items: Iterator[tuple[int, object]]):  # type: ignore[no-untyped-def]
    nxt = next(items, None)
    if nxt is None:
        return None
    index, item = nxt
    source = os.fspath(item) if isinstance(item, (str, os.PathLike)) else f"frame {index}"
    return source, reader.submit(_load_frame, item)

