"""The GPU pipeline: the data flow of one frame, over buffers allocated once.

    points --H2D--> voxelize.cu -> PFN -> scatter.cu -> RPN engine -> postprocess.cu --D2H--> boxes

Everything between the two copies is enqueued on one stream, with no host synchronisation: the pillar
count and every other count stay in device memory. Each stage is captured once into its own CUDA graph
(``cuda_graph=True``) and replayed per frame, with CUDA events between the stages, so per-stage GPU
times come for free. The only host wait is where the boxes are read (``collect``).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cupy as cp
import cupyx
import numpy as np

from ..config import ModelConfig
from ..detections import STAGES, Detections, FrameStats
from ..errors import BackendError, InputError
from ..graph_io import PFN_INPUT, PFN_OUTPUT, RPN_INPUT, RPN_OUTPUTS
from ..model_dir import ModelDir, pfn_weights
from ..runtime import Engine, engine_options_for, open_engine, tensorrt_available
from .pfn import PfnStage
from .postprocess import PostprocessStage
from .scatter import ScatterStage
from .voxelize import VoxelizeStage

DEFAULT_MAX_POINTS = 262_144   # a 128-beam scan fits; larger frames grow the buffers once
BACKENDS = ("auto", "onnxruntime", "tensorrt")


@dataclass
class CopyCounter:
    """Host<->device copies the pipeline issued for the last frame (the design promises 1 + 1)."""

    h2d_copies: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0

    def reset(self) -> None:
        self.h2d_copies = self.h2d_bytes = self.d2h_copies = self.d2h_bytes = 0

    def h2d(self, nbytes: int) -> None:
        self.h2d_copies += 1
        self.h2d_bytes += nbytes

    def d2h(self, nbytes: int) -> None:
        self.d2h_copies += 1
        self.d2h_bytes += nbytes


class GpuPipeline:
    """PointPillars on one CUDA stream. ``backend`` picks the engines: ``tensorrt`` plans or
    ``onnxruntime`` (CUDA execution provider, IO binding); ``auto`` prefers TensorRT when the model dir
    has plans and TensorRT imports.

    ``tf32`` lets fp32 engines use TensorFloat-32, as TensorRT and PyTorch do by default (about 3x
    faster convolutions, ~1e-3 relative error in the head maps); ``tf32=False`` is IEEE fp32, the
    CPU oracle's arithmetic. The PFN runs as the fused ``pfn.cu`` kernel on the live pillars only (its
    weights read from ``pfn.onnx``); ``pfn_engine=True`` runs ``pfn.onnx`` in the engine instead, on
    every one of the ``max_pillars`` rows.

    ``detect`` is safe to call from several threads (one frame at a time per pipeline); ``submit`` /
    ``collect`` are the lock-free halves for a single caller that overlaps host work with the GPU.
    """

    _closed = True  # until __init__ completes there is nothing to free

    def __init__(self, model: ModelDir, *, backend: str = "auto", cuda_graph: bool = True,
                 max_points: int = DEFAULT_MAX_POINTS, tf32: bool = True, pfn_engine: bool = False,
                 device_id: int = 0) -> None:
        self.cfg: ModelConfig = model.cfg
        self.model = model
        self.backend = _pick_backend(model, backend)
        self.tf32 = tf32
        self.pfn_engine = pfn_engine
        self.device_id = device_id
        self.use_graphs = cuda_graph
        self._device = cp.cuda.Device(device_id)
        self._lock = threading.Lock()
        with self._device:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self._events = [cp.cuda.Event() for _ in range(len(STAGES) + 1)]
        self.copies = CopyCounter()
        self.last_timings: dict[str, float] = {}
        self._graphs: list[object | None] = [None] * len(STAGES)
        self.graph_failures: dict[str, str] = {}
        self._pfn: Engine | None = None
        self._rpn: Engine | None = None
        try:
            with self._device, self.stream:
                self._allocate(max_points)
                self._pfn = self._open_engine(model.pfn_engine_path(self.backend)) if pfn_engine else None
                self._rpn = self._open_engine(model.rpn_engine_path(self.backend))
                self._bind_engines()
        except BaseException:
            self._close_engines()  # before the stream goes: a session outliving its stream crashes
            raise
        self._pending = False
        self._closed = False

    @property
    def execution_mode(self) -> str:
        """``cuda_graph`` when every stage replays a graph, ``eager`` or which stages fell back."""
        if not self.use_graphs:
            return "eager"
        if self.graph_failures:
            return "cuda_graph except " + ",".join(sorted(self.graph_failures)) + " (eager)"
        return "cuda_graph"

    # -- set-up (outside the hot path) ------------------------------------------------------------

    def _allocate(self, max_points: int) -> None:
        cfg, v = self.cfg, self.cfg.voxel
        self._allocate_input(max_points)
        self._voxelize = VoxelizeStage(cfg, max_points)
        if self.pfn_engine:
            self._pillar_features = cp.empty((v.max_pillars, cfg.network.pfn_channels), np.float32)
        else:
            self._pfn_kernel = PfnStage(cfg, *pfn_weights(self.model))
            self._pillar_features = self._pfn_kernel.out
        self._scatter = ScatterStage(cfg)
        nx, ny = cfg.head_map
        self._heads = tuple(cp.empty((1, c, ny, nx), np.float32) for c in cfg.head_channels.values())
        self._post = PostprocessStage(cfg)
        self._result_host = cupyx.empty_pinned(self._post.result.shape, self._post.result.dtype)

    def _open_engine(self, path: Path) -> Engine:
        options = engine_options_for(self.backend, device_id=self.device_id, tf32=self.tf32,
                                     precision=self.model.precision, config_digest=self.cfg.digest())
        return open_engine(path, options, device="cuda", stream_ptr=self.stream.ptr)

    def _bind_engines(self) -> None:
        def bind(engine: Engine, name: str, arr: cp.ndarray) -> None:
            engine.bind(name, arr.data.ptr, arr.shape)

        if self._pfn is not None:
            bind(self._pfn, PFN_INPUT, self._voxelize.features)
            bind(self._pfn, PFN_OUTPUT, self._pillar_features)
        assert self._rpn is not None  # opened before any binding
        bind(self._rpn, RPN_INPUT, self._scatter.canvas)
        for name, arr in zip(RPN_OUTPUTS, self._heads):
            bind(self._rpn, name, arr)

    def _allocate_input(self, capacity: int) -> None:
        """Row 0 of the input carries the point count (int32 bits), rows 1.. the points, so that one
        H2D copy brings the whole frame and the count stays where the kernels read it."""
        staging = cupyx.empty_pinned((capacity + 1, 4), np.float32)
        device_input = cp.zeros((capacity + 1, 4), np.float32)
        self._staging, self._input, self.max_points = staging, device_input, capacity
        self._staging_count = staging[0].view(np.int32)
        self._points = device_input[1:]
        self._num_points = device_input[0].view(np.int32)[:1]

    def _grow(self, num_points: int) -> None:
        """A frame larger than every earlier one: reallocate the point buffers, recapture the graphs.

        The new voxelizer is built first, so a failed allocation leaves the old buffers working."""
        self.stream.synchronize()
        capacity = 1 << (num_points - 1).bit_length()
        with self._device, self.stream:
            voxelize = VoxelizeStage(self.cfg, capacity)
            self._allocate_input(capacity)
            self._voxelize = voxelize
            self._bind_engines()
        self._graphs = [None] * len(STAGES)

    # -- the hot path -----------------------------------------------------------------------------

    def detect(self, points: object) -> Detections:
        with self._lock:
            self.submit(points)
            return self.collect()

    def detect_batch(self, frames: Sequence[object]) -> list[Detections]:
        with self._lock:
            results = []
            for points in frames:
                self.submit(points)
                results.append(self.collect())
            return results

    def submit(self, points: object) -> None:
        """Enqueue one frame: the input copy, the five stages and the result copy. Returns at once;
        ``collect`` must come before the next ``submit`` (the staging and result buffers are reused)."""
        if self._pending:
            raise BackendError("submit() called twice without collect(): the previous frame is still in flight")
        self.copies.reset()
        with self._device:
            n = self._stage_input(points)
            self._events[0].record(self.stream)
            self._run_stage(0, self._launch_voxelize)
            self._run_stage(1, self._launch_pfn)
            self._run_stage(2, self._launch_scatter)
            self._run_stage(3, self._launch_rpn)
            self._run_stage(4, self._launch_postprocess)
            self._post.result.get(stream=self.stream, out=self._result_host, blocking=False)  # the one D2H copy
        self.copies.d2h(self._post.result.nbytes)
        self._frame_points = n
        self._pending = True

    def collect(self) -> Detections:
        """Wait for the submitted frame (the one host sync of a frame) and unpack its boxes."""
        if not self._pending:
            raise BackendError("collect() without a submitted frame")
        self._pending = False
        try:
            self.stream.synchronize()
            ev = self._events
            timings = {stage: cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) for i, stage in enumerate(STAGES)}
            timings["total"] = cp.cuda.get_elapsed_time(ev[0], ev[-1])
        except cp.cuda.runtime.CUDARuntimeError as exc:
            raise BackendError(f"GPU pipeline: CUDA error {exc} (the device is in an error state; restart the process)") from None
        self.last_timings = timings
        return self._unpack(self._result_host, self._frame_points)

    def _launch_voxelize(self) -> None:
        self._voxelize.launch(self._points, self._num_points, self.stream)

    def _launch_pfn(self) -> None:
        if self._pfn is not None:
            self._pfn.run(self.stream.ptr)
        else:
            self._pfn_kernel.launch(self._voxelize.features, self._voxelize.num_pillars, self.stream)

    def _launch_scatter(self) -> None:
        self._scatter.launch(self._pillar_features, self._voxelize.coords, self._voxelize.num_pillars, self.stream)

    def _launch_rpn(self) -> None:
        assert self._rpn is not None
        self._rpn.run(self.stream.ptr)

    def _launch_postprocess(self) -> None:
        self._post.launch(self._heads[0], self._heads[1], self._heads[2], self._voxelize.stats, self.stream)

    def _stage_input(self, points: object) -> int:
        if isinstance(points, np.ndarray):
            n = int(points.shape[0])
            if n > self.max_points:
                self._grow(n)
            self._staging[1 : n + 1] = points
            self._staging_count[0] = n
            self._input[: n + 1].set(self._staging[: n + 1], stream=self.stream)  # the one H2D copy
            self.copies.h2d((n + 1) * 16)
            return n
        device_points = _as_device_points(points, self.stream)
        n = int(device_points.shape[0])
        if n > self.max_points:
            self._grow(n)
        with self.stream:
            self._points[:n] = device_points  # device to device, on our stream
            self._num_points.fill(n)
        return n

    def _run_stage(self, index: int, launch: Callable[[], None]) -> None:
        """Replay the stage's graph (capturing it on first use), or launch it eagerly; then mark its end."""
        if self.use_graphs and STAGES[index] not in self.graph_failures:
            graph = self._graphs[index] or self._capture(index, launch)
            if graph is not None:
                graph.launch(self.stream)  # type: ignore[attr-defined]
            else:
                launch()
        else:
            launch()
        self._events[index + 1].record(self.stream)

    def _capture(self, index: int, launch: Callable[[], None]) -> object | None:
        """Capture a stage after one eager warm-up run (engines allocate their workspaces there)."""
        launch()
        self.stream.synchronize()
        try:
            self.stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                launch()
            finally:
                graph = self.stream.end_capture()
        except Exception as exc:  # a backend that cannot be captured runs eagerly instead, and says so
            stage = STAGES[index]
            self.graph_failures[stage] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"GPU pipeline: stage {stage} cannot be captured in a CUDA graph "
                          f"({type(exc).__name__}); it runs eagerly", RuntimeWarning, stacklevel=4)
            self.stream.synchronize()
            return None
        self._graphs[index] = graph
        return graph

    def stage_outputs(self, index: int) -> tuple[cp.ndarray, ...]:
        """The device buffers stage ``index`` writes (for tools that inspect or copy them)."""
        return (
            (self._voxelize.features, self._voxelize.coords, self._voxelize.num_pillars),
            (self._pillar_features,),
            (self._scatter.canvas,),
            self._heads,
            (),
        )[index]

    def _unpack(self, result: np.ndarray, num_points: int) -> Detections:
        boxes, scores, labels, counters = self._post.unpack(result)
        stats = FrameStats(num_points=num_points, num_nonfinite=counters["nonfinite"],
                           num_pillars=counters["pillars"], num_pillars_dropped=counters["pillars_dropped"])
        return Detections(boxes, scores, labels, self.cfg.classes, stats)

    def close(self) -> None:
        """Free the graphs and engines while the stream they run on still exists (ONNX Runtime's
        session synchronises its compute stream when destroyed). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.stream.synchronize()
        self._graphs = [None] * len(STAGES)
        self._close_engines()
        self.stream.synchronize()

    def _close_engines(self) -> None:
        for engine in (self._pfn, self._rpn):
            if engine is not None:
                engine.close()

    def __del__(self) -> None:
        # Garbage collection frees a cycle's members in no set order; a stream destroyed before its
        # ONNX Runtime session crashes the process, so release the engines first.
        if not self._closed:
            self.close()


def _as_device_points(points: object, stream: cp.cuda.Stream) -> cp.ndarray:
    """A CuPy view of a device array (CuPy, PyTorch, anything with DLPack or the CUDA array interface)."""
    with stream:
        try:
            arr = cp.from_dlpack(points) if hasattr(points, "__dlpack__") else cp.asarray(points)
        except Exception as exc:
            raise InputError(f"points: cannot use {type(points).__name__} as a device array ({exc})") from None
    if arr.ndim != 2 or arr.shape[1] < 4 or arr.dtype != np.float32:
        raise InputError(f"points: expected an (N, 4) float32 device array; got shape {arr.shape}, dtype {arr.dtype}")
    return arr[:, :4]


def _pick_backend(model: ModelDir, backend: str) -> str:
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    return "tensorrt" if model.has_plans() and tensorrt_available() else "onnxruntime"
