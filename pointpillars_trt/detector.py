"""The public detector: one API over the CPU path and the GPU pipeline."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .config import ModelConfig, load_config
from .detections import Detections
from .errors import BackendError, InputError, PointPillarsError
from .fileio import safe_repr
from .pointcloud_io import read_points
from .model_dir import ModelDir, load_model_dir
from .points import as_host_points
from .sweeps import accumulate_sweeps

Device = str  # "auto", "cpu", "cuda" or "cuda:N"


class _Implementation(Protocol):
    last_timings: dict[str, float]

    def detect(self, points: Any) -> Detections: ...  # host (N, point columns) float32, or a device array on the GPU

    def detect_batch(self, frames: Sequence[Any]) -> list[Detections]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class FrameResult:
    """One frame of ``infer_many``: detections, or the error that frame alone raised."""

    source: str
    detections: Detections | None
    error: PointPillarsError | None


def cuda_available(device_id: int = 0) -> str | None:
    """None when the GPU pipeline can run here (on GPU ``device_id``), else the reason it cannot."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'pointpillars-trt[cuda13]' or [cuda12])"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            return "no CUDA device is visible"
        if device_id >= count:
            return f"GPU {device_id} does not exist ({count} visible)"
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        return f"CUDA is unusable ({exc})"
    from .runtime import onnxruntime_cuda_available, tensorrt_available
    from .runtime.cudnn import cudnn_unavailable_reason

    cudnn_reason = cudnn_unavailable_reason()
    if cudnn_reason and not (onnxruntime_cuda_available() or tensorrt_available()):
        return (f"no GPU engine backend: the cuDNN engine is unavailable ({cudnn_reason}), TensorRT is not "
                "installed, and onnxruntime has no CUDA provider (onnxruntime-gpu)")
    return None


class PointPillars:
    """A PointPillars detector loaded from a model dir or a checkpoint.

    ``device="auto"`` picks the GPU pipeline when CuPy and a CUDA device are present, else the CPU path;
    ``"cuda:N"`` picks GPU N. GPU only: ``cuda_graph`` replays each stage from a captured CUDA graph;
    ``tf32`` lets fp32 engines use TensorFloat-32 as TensorRT and PyTorch do by default (``False``:
    IEEE fp32, as the CPU path); it reaches every backend; ``max_batch`` sizes the batch the GPU
    pipeline runs at once (``detect_batch`` / ``infer_many(batch_size=...)``; 1..8). CPU only:
    ``threads`` sizes ONNX Runtime's thread pool (default: ``OMP_NUM_THREADS`` when set, else one per core).
    ``score_threshold``, ``nms_iou`` and ``max_boxes`` override the model's post-process values at run
    time (no rebuild: they are launch parameters, not part of the model).
    Safe to share between threads: frames are run one at a time per detector.
    """

    def __init__(self, model: ModelDir, *, device: Device = "auto", backend: str = "auto",
                 cuda_graph: bool = True, tf32: bool = True, threads: int | None = None, max_batch: int = 1,
                 score_threshold: float | None = None, nms_iou: float | None = None,
                 max_boxes: int | None = None) -> None:
        self.model = model
        self.cfg: ModelConfig = model.cfg.with_thresholds(score_threshold=score_threshold, nms_iou=nms_iou,
                                                          max_boxes=max_boxes)
        self.device, device_id = _resolve_device(device)
        if self.device == "cuda" and str(device) == "auto":
            from .gpu_pipeline import unsupported_reason

            reason = unsupported_reason(self.cfg)
            if reason is not None:  # an explicit cuda device gets GpuPipeline's error instead
                warnings.warn(f"device auto: {reason}; running on the CPU", RuntimeWarning, stacklevel=2)
                self.device = "cpu"
        if self.device == "cpu" and backend not in ("auto", "onnxruntime"):
            raise BackendError(f"backend {backend!r} runs only in the GPU pipeline; the CPU path uses ONNX Runtime "
                               "(pass backend auto or onnxruntime, or run where CUDA is available)")
        if self.device == "cuda":
            from .gpu_pipeline import GpuPipeline

            self._impl: _Implementation = GpuPipeline(model, backend=backend, cuda_graph=cuda_graph, tf32=tf32,
                                                      device_id=device_id, max_batch=max_batch, post_config=self.cfg)
        else:
            from .cpu_detector import CpuDetector

            self._impl = CpuDetector(model, threads=threads if threads is not None else _omp_threads(),
                                     post_config=self.cfg)

    #: Separate sweeps -> one multi-sweep frame for time-column models (``sweeps.accumulate_sweeps``).
    accumulate = staticmethod(accumulate_sweeps)

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike[str], *, config: str | ModelConfig | None = None,
                       device: Device = "auto", backend: str = "auto", cuda_graph: bool = True,
                       tf32: bool = True, threads: int | None = None, max_batch: int = 1,
                       **thresholds: Any) -> PointPillars:
        """Open a model dir built by ``pointpillars-trt build``; ``thresholds``: see the class."""
        expected = load_config(config) if isinstance(config, (str, os.PathLike)) else config
        return cls(load_model_dir(path, expected), device=device, backend=backend, cuda_graph=cuda_graph, tf32=tf32,
                   threads=threads, max_batch=max_batch, **thresholds)

    from_engines = from_model_dir

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], *, config: str | ModelConfig | None = None,
                        precision: str = "fp32", device: Device = "auto", backend: str = "auto",
                        cuda_graph: bool = True, tf32: bool = True, threads: int | None = None,
                        max_batch: int = 1, cache_dir: str | os.PathLike[str] | None = None,
                        **thresholds: Any) -> PointPillars:
        """Import a .pth and export its graphs once into a cache folder keyed by file hash, config,
        precision and (for TensorRT plans) TF32 mode."""
        from .convert.export import model_dir_for_checkpoint

        model = model_dir_for_checkpoint(path, config=config, precision=precision, cache_dir=cache_dir,
                                         tensorrt_plans=backend == "tensorrt", tf32=tf32)
        return cls(model, device=device, backend=backend, cuda_graph=cuda_graph, tf32=tf32, threads=threads,
                   max_batch=max_batch, **thresholds)

    @property
    def last_timings(self) -> dict[str, float]:
        """Milliseconds per stage of the last frame (GPU: CUDA events; CPU: wall clock)."""
        return self._impl.last_timings

    def __call__(self, points: object) -> Detections:
        return self._impl.detect(_device_or_host_points(points, self.device, self.cfg.num_point_columns))

    def detect_batch(self, frames: Sequence[object]) -> list[Detections]:
        """Detect on several frames at once (one engine run at batch B on the GPU); frames may differ in
        size. Returns one ``Detections`` per frame, in order; each equals what ``detector(frame)`` gives."""
        prepared = []
        for index, points in enumerate(frames):
            try:
                prepared.append(_device_or_host_points(points, self.device, self.cfg.num_point_columns))
            except PointPillarsError as exc:
                raise type(exc)(f"frame {index} of the batch: {exc}") from None
        return self._impl.detect_batch(prepared) if prepared else []

    def infer_many(self, frames: Iterable[object], *, batch_size: int = 1) -> Iterator[FrameResult]:
        """Detect on many frames (arrays or point-file paths), ``batch_size`` at a time; a bad frame
        yields its error and the rest go on. Results come in input order.

        The next frame is read from disk while the current batch runs (on the GPU the detect call
        releases the GIL while it waits for the device).
        """
        from concurrent.futures import ThreadPoolExecutor

        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise PointPillarsError(f"batch_size: expected a positive int, received {batch_size!r}")
        items = iter(enumerate(frames))
        window: list[FrameResult | tuple[str, object]] = []  # failed reads keep their place in the order
        with ThreadPoolExecutor(max_workers=1) as reader:
            pending = _submit_next(reader, items)
            while pending is not None:
                source, future = pending
                pending = _submit_next(reader, items)
                try:
                    window.append((source, _device_or_host_points(future.result(), self.device, self.cfg.num_point_columns)))
                except PointPillarsError as exc:
                    window.append(FrameResult(source, None, exc))
                ready = sum(not isinstance(entry, FrameResult) for entry in window)
                if ready == batch_size or pending is None:
                    yield from self._run_window(window)
                    window = []

    def _run_window(self, window: list[FrameResult | tuple[str, object]]) -> Iterator[FrameResult]:
        frames = [entry for entry in window if not isinstance(entry, FrameResult)]
        results = iter(self._run_batch(frames))  # type: ignore[arg-type]
        for entry in window:
            yield entry if isinstance(entry, FrameResult) else next(results)

    def _run_batch(self, batch: list[tuple[str, object]]) -> list[FrameResult]:
        if not batch:
            return []
        try:
            detections = self._impl.detect_batch([points for _, points in batch])
        except PointPillarsError as exc:  # the batch cannot tell whose fault: each frame on its own
            if len(batch) == 1:
                return [FrameResult(batch[0][0], None, exc)]
            return [result for item in batch for result in self._run_batch([item])]
        return [FrameResult(source, found, None) for (source, _), found in zip(batch, detections)]

    def close(self) -> None:
        self._impl.close()

    def __enter__(self) -> PointPillars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resolve_device(device: str) -> tuple[str, int]:
    """("cpu" | "cuda", GPU index) for a device string: auto, cpu, cuda or cuda:N."""
    kind, _, index = str(device).partition(":")
    if kind not in ("auto", "cpu", "cuda") or (index and (kind != "cuda" or not index.isdigit())):
        raise PointPillarsError(f"device {device!r}: expected auto, cpu, cuda or cuda:N")
    device_id = int(index) if index else 0
    if kind == "cpu":
        return "cpu", 0
    reason = cuda_available(device_id)
    if reason is None:
        return "cuda", device_id
    if kind == "cuda":
        raise BackendError(f"device {device} requested, but {reason}")
    return "cpu", 0


def _omp_threads() -> int | None:
    """OMP_NUM_THREADS as ONNX Runtime's CPU thread count (ORT itself ignores the variable)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def _device_or_host_points(points: object, device: str, columns: int) -> object:
    """CUDA arrays go to the GPU pipeline untouched; everything else becomes (N, columns) float32 on the host."""
    if device == "cuda" and _is_cuda_array(points):
        return points
    return as_host_points(points, columns=columns)


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
    """A point file (.bin, .npy, .pcd) read from disk; an array as it is. Any failure is that frame's
    InputError, so one bad file never ends a run."""
    if not isinstance(item, (str, os.PathLike)):
        return item
    try:
        return read_points(item)
    except PointPillarsError:
        raise
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        raise InputError(f"{safe_repr(os.fspath(item))}: cannot read ({type(exc).__name__}: {exc})") from None


def _submit_next(reader, items: Iterator[tuple[int, object]]):  # type: ignore[no-untyped-def]
    nxt = next(items, None)
    if nxt is None:
        return None
    index, item = nxt
    source = os.fspath(item) if isinstance(item, (str, os.PathLike)) else f"frame {index}"
    return source, reader.submit(_load_frame, item)

