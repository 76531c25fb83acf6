"""The GPU pipeline: the data flow of a batch of frames, over buffers allocated once.

    points --H2D--> voxelize.cu -> PFN -> scatter.cu -> RPN engine -> postprocess.cu --D2H--> boxes

A batch of B frames (B = 1 is the latency case) is one host-to-device copy of a packed input (a header
with each frame's point count and first row, then the frames back to back; a large frame alone in
pageable memory, or one in page-locked memory that ``detect`` waits for, is copied from the caller's
array, its header set on the device), voxelize, PFN and scatter into each frame's slot of a (B, ny, nx,
C) NHWC canvas (channel-major for an RPN engine that reads that), ONE run of the RPN engine at batch B,
the post-process of the (B, hy, hx, cls|box|dir) head maps into a (B, rows, 9) result (11 values a row
with a multi-head model's velocities), and one device-to-host copy of that result (a time-lag model's lags are a second H2D copy, thresholds that
changed since the last batch a 12-byte third). Every stage runs a whole batch in each of its launches
(the frame is the grid's z index), so a batch costs as many launches as one frame. Everything between
the two copies is enqueued on the pipeline's stream with no host synchronisation: every count stays
in device memory. The five stages and the result copy are
captured once per batch size into ONE CUDA graph (``cuda_graph=True``) and replayed, so a batch costs
the input copy and one graph launch on the host. Per-stage GPU times (``stage_timings=True``) come from
a second graph of the same batch with event-record nodes between the stages: each such node held the
GPU 3-5 us on an H200, ~20 us a batch, so the untimed graph is the default. The only host wait is
where the boxes are read (``collect``).
"""

from __future__ import annotations

import itertools
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import cupy as cp
import numpy as np

from .config import ModelConfig, int_within, next_power_of_two
from .detections import STAGES, Detections, FrameStats
from .device_points import as_device_points
from .errors import BackendError, InputError
from .kernels.device_frames import DeviceFrameCopy
from .kernels.driver import memset_d32_async, record_in_graph
from .graph_io import MAX_BATCH, RPN_INPUT, RPN_OUTPUT, canvas_dtype, head_channels
from .model_dir import CheckedFile, ModelDir, pfn_weights
from .runtime import Engine, EngineRequest, engine_file, engine_options_for, open_engine, pick_backend
from .staging import HEADER_ROWS, LARGE_SCAN_POINTS, StagingBuffer, empty_pinned
from .kernels.pfn import PfnStage
from .kernels.multihead_post import MultiHeadPostprocessStage
from .kernels.postprocess import PostprocessStage, threshold_values
from .kernels.scatter import ScatterStage
from .kernels.voxelize import GPU_POINT_COLUMNS, VoxelizeStage

DIRECT_COPY_BYTES = 1 << 20    # a frame alone this large is copied from the caller's array, not through staging
FRAME, TIMED_FRAME = "frame", "frame, timed"  # the keys of a batch's one graph, without and with stage events
_MEMORY_TYPE_UNREGISTERED = 0  # cudaMemoryTypeUnregistered: pageable host memory
_MEMORY_TYPE_HOST = 1          # cudaMemoryTypeHost: page-locked (cudaHostAlloc) or registered host memory


class _InputBuffers(NamedTuple):
    """A pipeline's input buffers for ``capacity`` points (``GpuPipeline._input_buffers``)."""

    capacity: int
    staging: StagingBuffer
    device: cp.ndarray
    times: cp.ndarray | None


@dataclass
class CopyCounter:
    """Host<->device copies the pipeline issued for the last batch: 1 + 1 (a time-lag model's lags one more H2D,
    thresholds that changed one more)."""

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



def post_stage_type(cfg: ModelConfig) -> type[PostprocessStage] | type[MultiHeadPostprocessStage]:
    """The post-process of the model's head layout: one head (KITTI style) or several (multi-head)."""
    return PostprocessStage if cfg.heads is None else MultiHeadPostprocessStage


_CAPTURE_LOCK = threading.Lock()


class GpuPipeline:
    """PointPillars on its own CUDA stream, one frame or a batch of up to ``max_batch`` frames at a time.

    ``backend`` picks the RPN engine: ``tensorrt`` plans, ``cudnn`` (cuDNN frontend graphs + our
    neck-head kernel: the fastest path without TensorRT) or ``onnxruntime`` (CUDA execution provider,
    IO binding); ``auto`` prefers TensorRT when the model dir has plans and TensorRT imports, then cuDNN,
    then ONNX Runtime (saying so once when it falls back).
    ``tf32`` lets fp32 engines use TensorFloat-32, as TensorRT and PyTorch do by default (about 3x
    faster convolutions, ~1e-3 relative error in the head maps); ``tf32=False`` is IEEE fp32, the
    CPU oracle's arithmetic. The PFN runs as the fused ``pfn.cu`` kernel on the live pillars only (its
    weights read from ``pfn.onnx``). ``post_config`` is the config the post-process runs with (the
    model's, or a copy with other runtime thresholds); its ``max_boxes`` sizes the result buffers. A
    batch may run with other thresholds (``detect_batch(frames, post_config)``): they live in a small
    device buffer the post-process kernels read, written on the stream only when they change, so
    neither a recompilation nor a new CUDA graph follows.
    ``stage_timings`` (also an attribute, read at each ``submit``): each batch's per-stage GPU
    milliseconds in ``last_timings``, from CUDA events between the stages (they cost GPU time).

    ``detect`` / ``detect_batch`` / ``detect_staged`` are safe to call from several threads (one batch at a
    time per pipeline); ``submit`` / ``submit_staged`` / ``collect`` are the halves for a single caller that
    overlaps host work with the GPU (only ``submit`` takes the lock, for its enqueue).
    """

    _closed = True  # until __init__ completes there is nothing to free

    def __init__(self, model: ModelDir, *, backend: str = "auto", cuda_graph: bool = True,
                 max_points: int = LARGE_SCAN_POINTS, tf32: bool = True, device_id: int = 0, max_batch: int = 1,
                 post_config: ModelConfig | None = None, stage_timings: bool = False) -> None:
        checked = int_within(max_batch, 1, MAX_BATCH)
        if checked is None:
            raise BackendError(f"max_batch: expected 1..{MAX_BATCH}, received {max_batch!r}")
        max_batch = checked
        self.cfg: ModelConfig = model.cfg
        self.post_cfg = post_config or model.cfg
        self.model = model
        self.backend = pick_backend(model, backend, device_id)
        self.tf32 = tf32
        self.device_id = device_id
        self.max_batch = max_batch
        self.use_graphs = cuda_graph
        self._device = cp.cuda.Device(device_id)
        self._lock = threading.Lock()
        with self._device:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self._events = [cp.cuda.Event() for _ in range(len(STAGES) + 1)]
            # device frames: made on the caller's stream (the copies wait for it), copied (the caller waits)
            self._frames_made = cp.cuda.Event(disable_timing=True)
            self._frames_copied = cp.cuda.Event(disable_timing=True)
            self._device_frame_copy = DeviceFrameCopy()
            self._threshold_values = threshold_values(self.post_cfg)  # what the device buffer holds,
            self._threshold_cfg = self.post_cfg                       # and the config they came from
            self._thresholds = cp.asarray(self._threshold_values)
        self.copies = CopyCounter()
        self.last_timings: dict[str, float] = {}
        # CUDA events around every stage (event-record nodes inside the timed graph of a batch, records
        # between the stages otherwise), read into last_timings by collect: 6 elapsed-time queries a batch
        self.stage_timings = stage_timings
        self._timed = stage_timings  # whether the batch in flight records them (stage_timings at its submit)
        # (stage name, or FRAME / TIMED_FRAME for all five and the result copy; batch size) -> captured graph
        self._graphs: dict[tuple[str, int], object] = {}
        # why a batch could not be one graph: then every batch size runs a graph a stage from there on
        self._frame_graph_error: str | None = None
        self.graph_failures: dict[str, str] = {}  # stages that cannot be captured on their own (they run eagerly)
        self._rpn: Engine | None = None
        files = model.take_checked_files()  # read and hashed as the model dir opened: not again
        self._pfn_weights = pfn_weights(model, files.get(model.pfn_path.name))  # read once, for every batch size
        try:
            with self._device, self.stream:
                self._rpn = self._open_rpn(files)
                self._allocate(max_points, self.max_batch)  # the canvas in the layout the RPN engine reads
        except BaseException:
            self._close_rpn()  # before the stream goes: a session outliving its stream crashes
            raise
        self._batch = 0  # frames of the batch in flight (0: none)
        self._closed = False

    @property
    def execution_mode(self) -> str:
        """``cuda_graph`` when a batch replays one graph, ``eager``, or the fallback: a graph a stage,
        and which stages run eagerly."""
        if not self.use_graphs:
            return "eager"
        if self._frame_graph_error is None:
            return "cuda_graph"
        if self.graph_failures:
            return "cuda_graph per stage except " + ",".join(sorted(self.graph_failures)) + " (eager)"
        return "cuda_graph per stage"

    # -- set-up (outside the hot path) ------------------------------------------------------------

    def _allocate(self, max_points: int, batch: int) -> None:
        """The buffers and stages for batches of ``batch`` frames and ``max_points`` points, every one made before
        any is replaced: a failed allocation (a larger batch that does not fit) leaves the pipeline as it was, with
        the buffers its captured graphs read and write."""
        cfg = self.cfg
        hx, hy = cfg.head_map
        assert self._rpn is not None  # opened first: the canvas is in the layout its RPN reads
        canvas_type, channels_first = np.dtype(canvas_dtype(self.model.precision)), self._rpn.channels_first_input
        canvas = cp.zeros((batch, *self._rpn.inputs[RPN_INPUT].shape[1:]), canvas_type)
        heads = cp.zeros((batch, hy, hx, head_channels(cfg)), np.float32)
        rows, width = post_stage_type(self.post_cfg).result_shape(self.post_cfg)
        results = cp.zeros((batch, rows, width), np.float32)
        results_host = empty_pinned((batch, rows, width), np.float32)
        inputs = self._input_buffers(max_points)
        voxelize = VoxelizeStage(cfg, max_points, batch)
        pfn = PfnStage(cfg, *self._pfn_weights, frames=batch)
        scatter = ScatterStage(cfg, canvas_type, channels_first, frames=batch)
        post = post_stage_type(cfg)(self.post_cfg, results, self._thresholds, frames=batch)
        self.max_batch, self._canvas, self._heads, self._results, self._results_host = \
            batch, canvas, heads, results, results_host
        self._result_bytes = rows * width * 4  # a frame's share of the one D2H copy
        self._use_input(inputs)
        self._voxelize, self._pfn, self._scatter, self._post = voxelize, pfn, scatter, post

    def _input_buffers(self, capacity: int) -> _InputBuffers:
        """The packed input for ``capacity`` points (``staging.py``: header rows of (count, first row) int32 pairs,
        then the frames' points), so that one H2D copy brings a whole batch and the counts stay where the kernels
        read them; the pipeline's own pinned staging, which serves callers that hand it arrays; a multi-sweep
        model's time lags."""
        columns = self.cfg.num_point_columns
        staging = StagingBuffer(capacity, empty_pinned, columns)
        device_input = cp.zeros((HEADER_ROWS + capacity, 4), np.float32)
        times = cp.zeros(capacity, np.float32) if columns > GPU_POINT_COLUMNS else None
        return _InputBuffers(capacity, staging, device_input, times)

    def _use_input(self, inputs: _InputBuffers) -> None:
        """Take ``inputs`` as the pipeline's input buffers (nothing here allocates: it cannot fail half-way)."""
        self.max_points, self._staging, self._times = inputs.capacity, inputs.staging, inputs.times
        self._input_ptr = inputs.device.data.ptr
        self._header = inputs.device[:HEADER_ROWS].view(np.int32).reshape(-1)  # views: they keep the buffer alive
        self._points = inputs.device[HEADER_ROWS:]

    def _open_rpn(self, files: dict[str, CheckedFile]) -> Engine:
        """The RPN engine, on the pipeline's stream; ``files``: the model dir's files as its check read them, of which
        the engine takes its own (``rpn.onnx``, or ``rpn.plan``)."""
        request = EngineRequest(device_id=self.device_id, tf32=self.tf32, precision=self.model.precision,
                                config_digest=self.cfg.digest(), graph_sha256=self.model.graph_sha256("rpn"))
        options = engine_options_for(self.backend, request)
        path = engine_file(self.model, "rpn", self.backend)
        return open_engine(path, options, device="cuda", stream_ptr=self.stream.ptr, config=self.cfg,
                           checked=files.get(path.name))

    def _bind_rpn(self, batch: int) -> None:
        """Bind the first ``batch`` canvases and head maps (a no-op when the batch size is unchanged)."""
        assert self._rpn is not None  # opened in __init__
        for name, arr in ((RPN_INPUT, self._canvas), (RPN_OUTPUT, self._heads)):
            self._rpn.bind(name, arr.data.ptr, (batch, *arr.shape[1:]))

    def _grow(self, total_points: int) -> None:
        """A batch larger than every earlier one: reallocate the point buffers, recapture the graphs.

        The new voxelizer and buffers are all made before any is replaced, so a failed allocation leaves the old
        ones working."""
        self.stream.synchronize()
        capacity = next_power_of_two(total_points)
        with self._device, self.stream:
            voxelize = VoxelizeStage(self.cfg, capacity, self.max_batch)
            inputs = self._input_buffers(capacity)
        self._use_input(inputs)
        self._voxelize = voxelize
        self._graphs.clear()

    def _grow_batch(self, max_batch: int) -> None:
        """Reallocate the batch buffers and stages for a larger batch (outside the hot path); a failed allocation
        leaves the pipeline as it was (``_allocate``)."""
        self.stream.synchronize()
        with self._device, self.stream:
            self._allocate(self.max_points, max_batch)
        self._graphs.clear()

    # -- the hot path -----------------------------------------------------------------------------

    def detect(self, points: object, post_config: ModelConfig | None = None) -> Detections:
        return self.detect_batch([points], post_config)[0]

    def detect_batch(self, frames: Sequence[object], post_config: ModelConfig | None = None) -> list[Detections]:
        """Frames in groups of at most ``max_batch``, each group one pass of the pipeline; a longer list
        than ``max_batch`` first grows the pipeline to it (once, up to MAX_BATCH). ``post_config``: the
        thresholds of this call (default: the pipeline's ``post_cfg``)."""
        with self._lock:
            self._fit_batch(len(frames))
            results: list[Detections] = []
            for start in range(0, len(frames), self.max_batch):
                self._submit(frames[start : start + self.max_batch], post_config, caller_waits=True)
                results.extend(self.collect())
            return results

    def fit_batch(self, frames: int) -> int:
        """Grow the pipeline's batch to ``frames`` as a ``detect_batch`` of that many would (up to MAX_BATCH); the
        batch it now runs."""
        with self._lock:
            self._fit_batch(frames)
            return self.max_batch

    def _fit_batch(self, frames: int) -> None:
        if frames > self.max_batch and self.max_batch < MAX_BATCH:
            self._check_idle()  # growing replaces the result buffers a batch in flight is read from
            self._grow_batch(min(frames, MAX_BATCH))

    def detect_staged(self, staging: StagingBuffer, frames: Sequence[tuple[int, int]],
                      post_config: ModelConfig | None = None) -> list[Detections]:
        """``detect_batch`` of frames a caller already placed in a ``StagingBuffer`` of its own (e.g. read from
        files straight into pinned memory): ``frames`` are (point count, first row) pairs, at most
        ``max_batch`` of them. ``submit_staged`` and ``collect`` under the pipeline's lock, so other threads'
        ``detect`` calls on the pipeline wait for it."""
        with self._lock:
            self.submit_staged(staging, frames, post_config)
            return self.collect()

    def submit(self, frames: Sequence[object], post_config: ModelConfig | None = None) -> None:
        """Enqueue one batch: the input copy, the five stages and the result copy. Returns at once;
        ``collect`` must come before the next ``submit`` (the staging and result buffers are reused).
        More frames than ``max_batch`` grow the pipeline first, as ``detect_batch`` does (up to MAX_BATCH).
        Under the pipeline's lock, so a batch another thread runs is done first (the wait for this one,
        ``collect``, takes no lock). The frames may change once it returns: they have been copied (to the
        device or to staging)."""
        with self._lock:
            self._fit_batch(len(frames))
            self._submit(frames, post_config, caller_waits=False)

    def _submit(self, frames: Sequence[object], post_config: ModelConfig | None, *, caller_waits: bool) -> None:
        """``caller_waits``: the caller collects before it touches the frames again (``detect``), so a
        page-locked frame may be read by the DMA after this returns."""
        self._check_batch(len(frames))
        with self._device:
            self._enqueue(len(frames), lambda: self._stage_input(frames, caller_waits), post_config)

    def submit_staged(self, staging: StagingBuffer, frames: Sequence[tuple[int, int]],
                      post_config: ModelConfig | None = None) -> None:
        """``submit`` for frames a caller already placed in a ``StagingBuffer`` of its own (e.g. read
        from files straight into pinned memory): ``frames`` are (point count, first row) pairs. The
        buffer must stay untouched until ``collect`` returns."""
        self._check_batch(len(frames))

        def stage() -> list[int]:
            used = staging.write_header(list(frames))
            if used - HEADER_ROWS > self.max_points:
                self._grow(used - HEADER_ROWS)
            self._copy_in(staging, used)
            return [count for count, _ in frames]

        with self._device:
            self._enqueue(len(frames), stage, post_config)

    def _check_batch(self, batch: int) -> None:
        self._check_idle()
        if not 1 <= batch <= self.max_batch:
            raise BackendError(f"submit: expected 1..{self.max_batch} frames, received {batch}")

    def _check_idle(self) -> None:
        if self._batch:
            raise BackendError("submit() called twice without collect(): the previous batch is still in flight")

    def _enqueue(self, b: int, stage_input: Callable[[], list[int]], post_config: ModelConfig | None) -> None:
        self.copies.reset()
        self._set_thresholds(post_config or self.post_cfg)
        self._frame_points = stage_input()
        self._timed = self.stage_timings
        graph = self._frame_graph(b, self._timed) if self.use_graphs and self._frame_graph_error is None else None
        if graph is not None:
            graph.launch(self.stream)  # type: ignore[attr-defined]
        else:
            if self._timed:
                self._events[0].record(self.stream)
            for index, launch in enumerate(self._stage_launchers()):
                self._run_stage(index, b, launch)
            self._copy_out(b)
        self.copies.d2h(b * self._result_bytes)
        self._batch = b

    def _stage_launchers(self) -> tuple[Callable[[int], None], ...]:
        """The stages' launches in ``STAGES`` order."""
        return (self._launch_voxelize, self._launch_pfn, self._launch_scatter, self._launch_rpn,
                self._launch_postprocess)

    def _copy_out(self, batch: int) -> None:
        """The one D2H copy, as a plain async copy (CuPy's ``get`` refuses a capturing stream)."""
        result = self._results[:batch]
        cp.cuda.runtime.memcpyAsync(self._results_host[:batch].ctypes.data, result.data.ptr, result.nbytes,
                                    cp.cuda.runtime.memcpyDeviceToHost, self.stream.ptr)

    def collect(self) -> list[Detections]:
        """Wait for the submitted batch (the one host sync of a batch) and unpack each frame's boxes."""
        if not self._batch:
            raise BackendError("collect() without a submitted batch")
        b, self._batch = self._batch, 0
        try:
            self.stream.synchronize()
            timings: dict[str, float] = {}
            if self._timed:
                ev = self._events
                timings = {stage: cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) for i, stage in enumerate(STAGES)}
                timings["total"] = cp.cuda.get_elapsed_time(ev[0], ev[-1])
        except cp.cuda.runtime.CUDARuntimeError as exc:
            raise BackendError(f"GPU pipeline: CUDA error {exc} (the device is in an error state; "
                               "restart the process)") from None
        self.last_timings = timings
        return [self._unpack(self._results_host[i], self._frame_points[i]) for i in range(b)]

    def _set_thresholds(self, post_config: ModelConfig) -> None:
        """Write the batch's thresholds to the buffer the post-process kernels read, when they differ
        from what it holds (a 12-byte copy on the stream, ordered before this batch's post-process).
        The kernels clamp max boxes to ``post_cfg``'s, the cap (``Thresholds.applied_to`` refuses more).
        The same config as the last batch's (the usual case) costs one identity check."""
        if post_config is self._threshold_cfg:
            return
        values = threshold_values(post_config)
        if not np.array_equal(values, self._threshold_values):
            self._thresholds.set(values, stream=self.stream)  # pageable source: staged before the call returns
            self.copies.h2d(values.nbytes)
            self._threshold_values = values
        self._threshold_cfg = post_config

    def _launch_voxelize(self, batch: int) -> None:
        self._voxelize.launch(self._points, self._header, self.stream, self._times, batch)

    def _launch_pfn(self, batch: int) -> None:
        self._pfn.launch(self._voxelize.features, self._voxelize.stats, self.stream, batch)

    def _launch_scatter(self, batch: int) -> None:
        self._scatter.launch(self._pfn.out, self._voxelize.coords, self._voxelize.stats, self._canvas, self.stream,
                             batch)

    def _launch_rpn(self, batch: int) -> None:
        assert self._rpn is not None
        self._bind_rpn(batch)
        self._rpn.run(self.stream.ptr)

    def _launch_postprocess(self, batch: int) -> None:
        self._post.launch(self._heads, self._voxelize.stats, self.stream, batch)

    def _stage_input(self, frames: Sequence[object], caller_waits: bool) -> list[int]:
        """Pack the batch into the input buffer: one H2D copy for host frames (a large frame alone straight
        from the caller's array), a copy kernel a frame (its rows, time lags and header pair) for frames
        already on the GPU. Those copies run on the pipeline's stream behind the work the caller's current stream
        holds (a frame made there, or handed over by DLPack, which orders its producer's work before that
        stream), and the caller's stream waits for them: a frame changed or freed there after ``submit``
        returns is copied as it was. Two event records and waits, no host wait."""
        if all(isinstance(f, np.ndarray) for f in frames):
            return self._stage_host(frames, caller_waits)  # type: ignore[arg-type]
        caller = cp.cuda.get_current_stream()
        device = [as_device_points(f, caller, self.cfg.num_point_columns) for f in frames]
        for index, points in enumerate(device):
            if points.device.id != self.device_id:  # a kernel given another GPU's memory would fault this one
                where = f"frame {index} of the batch" if len(frames) > 1 else "points"
                raise InputError(f"{where}: on GPU {points.device.id}, and the detector runs on GPU {self.device_id}: "
                                 f"copy it there first (with cupy.cuda.Device({self.device_id}): cupy.asarray(points)) "
                                 "or open the detector on that GPU")
        self.stream.wait_event(caller.record(self._frames_made))
        counts = [int(f.shape[0]) for f in device]
        total = sum(counts)
        if total > self.max_points:
            self._grow(total)
        starts = [0, *itertools.accumulate(counts[:-1])]
        for i, (points, start) in enumerate(zip(device, starts)):
            self._device_frame_copy.launch(points, self._points, self._times, self._header, i, start, self.stream)
        caller.wait_event(self.stream.record(self._frames_copied))
        return counts

    def _stage_host(self, frames: Sequence[np.ndarray], caller_waits: bool) -> list[int]:
        """Host frames: packed into the pinned staging and copied in one H2D copy (a frame alone, large
        or page-locked, straight from the caller's array)."""
        counts = [f.shape[0] for f in frames]
        total = sum(counts)
        if total > self.max_points:
            self._grow(total)
        if len(frames) == 1 and self._copies_directly(frames[0], caller_waits):
            self._copy_frame_in(frames[0])
            return counts
        staging = self._staging
        staging.reset()
        placed = []
        for points, n in zip(frames, counts):
            start = staging.allocate(n)
            assert start is not None  # grown above to hold the batch
            staging.put(start, points)
            placed.append((n, start))
        self._copy_in(staging, staging.write_header(placed))
        return counts

    def _copies_directly(self, points: np.ndarray, caller_waits: bool) -> bool:
        """Whether a frame alone goes straight from the caller's array to the device: float32 rows of x,
        y, z, intensity in C order (no time column) that are either large and pageable or page-locked
        with the caller waiting for the result. The driver stages pageable memory through its own
        pinned buffers while the DMA runs, and the copy call returns once it holds the bytes: a frame
        of 121k points took 187 instead of 226 us this way on an H200 (a camera-view frame of 19k
        points: 40 us either way). Page-locked memory needs no host copy at all, but the DMA reads it
        after the call returns: only ``detect``, which waits for the result, may hand it over; after
        ``submit`` the caller may change it at once, so it goes through staging."""
        if not (self._times is None and points.dtype == np.float32 and points.ndim == 2
                and points.shape[1] == GPU_POINT_COLUMNS and points.flags.c_contiguous):
            return False
        if not caller_waits and points.nbytes < DIRECT_COPY_BYTES:
            return False  # staged whatever its memory: no need to ask CUDA (a call a frame)
        memory = _memory_type(points)
        if memory == _MEMORY_TYPE_UNREGISTERED:
            return points.nbytes >= DIRECT_COPY_BYTES
        return caller_waits and memory == _MEMORY_TYPE_HOST

    def _copy_frame_in(self, points: np.ndarray) -> None:
        """One frame's H2D copy from the caller's array (from pageable memory it returns once the driver
        holds the bytes); its header pair (count, first row 0) is set on the device."""
        header = self._header.data.ptr
        memset_d32_async(header, points.shape[0], 1, self.stream)
        memset_d32_async(header + 4, 0, 1, self.stream)
        cp.cuda.runtime.memcpyAsync(self._points.data.ptr, points.ctypes.data, points.nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)
        self.copies.h2d(points.nbytes)

    def _copy_in(self, staging: StagingBuffer, used: int) -> None:
        """The batch's H2D copy: header and point rows, one async copy from the (pinned) staging (and, for
        a time-column model, a second copy of the time lags)."""
        if (staging.times is None) != (self._times is None):
            raise InputError(f"staging buffer of {staging.columns} columns for a model of {self.cfg.num_point_columns}")
        nbytes = used * staging.rows.strides[0]
        cp.cuda.runtime.memcpyAsync(self._input_ptr, staging.address, nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    self.stream.ptr)
        self.copies.h2d(nbytes)
        if self._times is not None and staging.times is not None:
            points = used - HEADER_ROWS
            self._times[:points].set(staging.times[:points], stream=self.stream)
            self.copies.h2d(points * 4)

    def _frame_graph(self, batch: int, timed: bool) -> object | None:
        """The graph of a whole batch: the five stages (``timed``: an event-record node before the
        first and after each), the result copy; captured on first use. None, said once, when it cannot
        be captured: the stages are then captured one by one, and any that cannot be runs eagerly."""
        key = (TIMED_FRAME if timed else FRAME, batch)
        graph = self._graphs.get(key)
        if graph is not None:
            return graph

        def run(capturing: bool) -> None:
            events = capturing and timed
            if events:
                record_in_graph(self._events[0], self.stream)
            for index, launch in enumerate(self._stage_launchers()):
                launch(batch)
                if events:
                    record_in_graph(self._events[index + 1], self.stream)
            if capturing:
                self._copy_out(batch)

        graph, error = self._captured(run)
        if error is not None:
            self._frame_graph_error = error
            warnings.warn(f"GPU pipeline: a batch cannot be captured as one CUDA graph ({error}); "
                          "each stage replays a graph of its own", RuntimeWarning, stacklevel=4)
            return None
        self._graphs[key] = graph
        return graph

    def _run_stage(self, index: int, batch: int, launch: Callable[[int], None]) -> None:
        """Replay the stage's graph for this batch size (capturing it on first use), or launch it
        eagerly; then mark the stage's end. The path of eager pipelines and of pipelines whose
        batches cannot be one graph."""
        if self.use_graphs and STAGES[index] not in self.graph_failures:
            key = (STAGES[index], batch)
            graph = self._graphs.get(key)
            if graph is None:
                graph, error = self._captured(lambda capturing: launch(batch))
                if error is None:
                    self._graphs[key] = graph
                else:  # a backend that cannot be captured runs eagerly instead, and says so
                    self.graph_failures[STAGES[index]] = error
                    warnings.warn(f"GPU pipeline: stage {STAGES[index]} cannot be captured in a CUDA graph "
                                  f"({error}); it runs eagerly", RuntimeWarning, stacklevel=4)
            if graph is not None:
                graph.launch(self.stream)  # type: ignore[attr-defined]
            else:
                launch(batch)
        else:
            launch(batch)
        if self._timed:
            self._events[index + 1].record(self.stream)

    def _captured(self, run: Callable[[bool], None]) -> tuple[object | None, str | None]:
        """``run(False)`` once eagerly (engines allocate their workspaces there), then ``run(True)``
        captured: (the graph, None), or (None, why it failed). One pipeline of the process captures at
        a time: a warm-up of another (its allocations) could otherwise invalidate the capture."""
        with _CAPTURE_LOCK:
            run(False)
            self.stream.synchronize()
            try:
                self.stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    run(True)
                finally:
                    graph = self.stream.end_capture()
            except Exception as exc:
                self.stream.synchronize()
                return None, f"{type(exc).__name__}: {exc}"
        return graph, None

    def stage_outputs(self, index: int, batch: int = 1) -> tuple[cp.ndarray, ...]:
        """The device buffers stage ``index`` writes for a batch (for tools that inspect or copy them)."""
        if index == 0:
            vox = self._voxelize
            return vox.features[:batch], vox.coords[:batch], vox.stats[:batch]
        if index == 1:
            return (self._pfn.out[:batch],)
        if index == 2:
            return (self._canvas[:batch],)
        if index == 3:
            return (self._heads[:batch],)
        return ()

    def _unpack(self, result: np.ndarray, num_points: int) -> Detections:
        boxes, scores, labels, counters, velocity = post_stage_type(self.cfg).unpack(result)
        stats = FrameStats(num_points=num_points, num_nonfinite=counters["nonfinite"],
                           num_pillars=counters["pillars"], num_pillars_dropped=counters["pillars_dropped"],
                           num_overflowed_scores=counters["overflowed_scores"],
                           num_overflowed_features=counters["overflowed_features"])
        return Detections(boxes, scores, labels, self.cfg.classes, stats, velocity)

    def close(self) -> None:
        """Free the graphs and the RPN engine while the stream they run on still exists (ONNX Runtime's
        session synchronises its compute stream when destroyed), after the batch another thread runs. Safe to
        call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.stream.synchronize()
            self._graphs.clear()
            self._close_rpn()
            self.stream.synchronize()

    def _close_rpn(self) -> None:
        if self._rpn is not None:
            self._rpn.close()

    def __del__(self) -> None:
        # Garbage collection frees a cycle's members in no set order; a stream destroyed before its
        # ONNX Runtime session crashes the process, so release the engine first.
        if not self._closed:
            self.close()


def _memory_type(array: np.ndarray) -> int | None:
    """The CUDA memory type of ``array``'s data (pageable, page-locked host, ...); None when CUDA cannot tell."""
    try:
        attributes = cp.cuda.runtime.pointerGetAttributes(array.ctypes.data)
    except cp.cuda.runtime.CUDARuntimeError:
        return None
    return getattr(attributes, "type", None)
