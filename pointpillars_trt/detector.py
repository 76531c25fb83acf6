"""The public detector: one API over the CPU path and the GPU pipeline."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

import numpy as np

from .config import ConfigArgument, ModelConfig, Thresholds, config_argument, int_within
from .detections import Detections
from .errors import (
    BackendError, ConfigError, CpuFallbackWarning, InputError, InputWarning, PointPillarsError, PrecisionWarning,
    SettingNotice, safe_repr,
)
from .graph_io import MAX_BATCH
from .intensities import INTENSITY_JUDGED_FROM, find_intensity_mismatch, mismatch_text
from .pointcloud_io import read_points_into, require_point_dim
from .runtime import BACKENDS
from .frame_findings import FrameFindings, callers_level
from .devices import PickedDevice, check_backend_runs_on, cpu_fallback_text, pick_device
from .runtime_options import RuntimeOptions, cpu_threads
from .model_dir import ModelDir, load_model_dir
from .point_layout import check_time_lags
from .points import MAX_FRAME_POINTS, as_host_points, check_frame_list, is_cuda_array, is_frame_path
from .staging import INITIAL_POINTS_PER_FRAME, PageLockedOrOrdinary, ReadFrame, StagingBuffer, likely_points_per_frame
from .stop_signals import stop_signals_blocked
from .sweeps import accumulate_sweeps


class _Implementation(Protocol):
    last_timings: dict[str, float]

    # points: host (N, point columns) float32, or a device array on the GPU; post_config: the call's thresholds
    def detect(self, points: Any, post_config: ModelConfig | None = None) -> Detections: ...

    def detect_batch(self, frames: Sequence[Any], post_config: ModelConfig | None = None) -> list[Detections]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class FrameResult:
    """One frame of ``infer_many``: detections, or the error that frame alone raised."""

    source: str
    detections: Detections | None
    error: PointPillarsError | None


class PointPillars:
    """A PointPillars detector loaded from a model dir or a checkpoint, run as ``options`` say
    (``RuntimeOptions``: device, backend, TF32, CUDA graphs, threads, batch size, thresholds).

    The keyword arguments (``device="cuda:1"``, ``score_threshold=0.3``, ...) are a shorthand that builds
    the options (``RuntimeOptions.of``); give one or the other. ``device="auto"`` picks the GPU pipeline
    when CuPy, a CUDA device and a GPU engine backend that can run here (TensorRT, cuDNN or ONNX Runtime's
    CUDA provider) are present, else the CPU path. The thresholds override the model's
    post-process values (no rebuild: they are kernel inputs, not part of the model);
    ``detector(points, thresholds=...)`` and ``detect_batch(frames, thresholds=...)`` change them for one
    call (``Thresholds``; max boxes up to the detector's), with no recompilation.
    Safe to share between threads: ``detector(points)``, ``detect_batch`` and ``infer_many`` run one batch at a time
    per detector; a ``submit_batch`` holds the detector until its ``finish`` (other batches meanwhile are refused).
    ``engine_description`` says what runs the frames; ``gpu_unused_reason`` why ``device="auto"``
    ran them on the CPU (None when it did not).
    """

    def __init__(self, model: ModelDir, options: RuntimeOptions | None = None, **settings: Any) -> None:
        self._start(model, _options(options, settings))

    def _start(self, model: ModelDir, opts: RuntimeOptions, picked: PickedDevice | None = None) -> None:
        """The constructor's work; ``picked``: ``pick_device``'s answer where the caller has asked it
        already (``from_checkpoint``, before it exports), so the GPU path is probed once per detector."""
        if not isinstance(model, ModelDir):
            raise PointPillarsError(f"PointPillars(model): expected a ModelDir, got {type(model).__name__}; open a "
                                    "checkpoint with PointPillars.from_checkpoint(path) or a model dir with "
                                    "PointPillars.from_model_dir(path)")
        self._closed = False
        self._in_flight = False  # a submit_batch whose finish has not been called
        self._abandoned: _SubmittedBatch | None = None  # that batch, its finish dropped uncalled (``_abandon``)
        self._submit_lock = threading.Lock()  # makes a submit_batch's check and claim of the detector one step
        self.model = model
        self.options = opts
        t = opts.thresholds  # the detector's own values: max boxes may exceed the model's (it sizes buffers)
        self.cfg: ModelConfig = model.cfg.with_thresholds(score_threshold=t.score_threshold, nms_iou=t.nms_iou,
                                                          max_boxes=t.max_boxes)
        refuse_other_precision(model, opts.precision)
        self.device, device_id, self.gpu_unused_reason = picked or pick_device(opts.device)
        backend = opts.backend
        check_backend_runs_on(self.device, backend, self.gpu_unused_reason)  # before the fallback's warning
        if self.device == "cpu" and self.gpu_unused_reason is not None:
            warnings.warn(f"{cpu_fallback_text(model.cfg.heads is not None)}: {self.gpu_unused_reason}",
                          CpuFallbackWarning, stacklevel=_callers_level())
        if self.device == "cpu" and model.precision == "fp16":
            warnings.warn("fp16 graphs run no faster than fp32 on the CPU (slower, and rounded to fp16): for CPU runs "
                          "use fp32 graphs (a checkpoint without precision='fp16', or a model dir built with "
                          "--precision fp32)", PrecisionWarning, stacklevel=_callers_level())
        # the first host frame's intensities are checked once (as infer does) against the model's scale
        self._check_intensity = "intensity" in model.cfg.features.order
        # a frame the network overflowed on, probably misread, or of pillars dropped: each kind said once
        self._findings = FrameFindings(model.cfg.voxel.point_range, (__file__,))
        self._viewpoint_said = False  # a .pcd VIEWPOINT left unapplied is said once
        self._viewpoint_lock = threading.Lock()  # infer_many's reader threads may find one at the same time
        if self.device == "cuda":
            from .gpu_pipeline import GpuPipeline

            # the threads that the CUDA driver and the engine libraries start while the pipeline opens take this
            # thread's signal mask: with the stop signals held here, none of them ever runs NVRTC's handlers in
            # Python's place (``stop_signals``); a Ctrl-C or SIGTERM sent to this thread meanwhile acts once it
            # is open (one the process gets may go to another of the caller's threads that does not block it)
            with stop_signals_blocked():
                self._impl: _Implementation = GpuPipeline(
                    model, backend=backend, cuda_graph=opts.cuda_graph, tf32=opts.tf32, device_id=device_id,
                    max_batch=opts.max_batch, post_config=self.cfg, stage_timings=opts.stage_timings)
        else:
            from .cpu_detector import CpuDetector

            self._impl = CpuDetector(model, threads=onnxruntime_threads(opts.threads), post_config=self.cfg)

    #: Separate sweeps -> one multi-sweep frame for time-column models (``sweeps.accumulate_sweeps``).
    accumulate = staticmethod(accumulate_sweeps)

    @classmethod
    def from_model_dir(cls, path: str | os.PathLike[str], *, config: ConfigArgument = None,
                       options: RuntimeOptions | None = None, **settings: Any) -> PointPillars:
        """Open a model dir built by ``pointpillars-trt build``; ``config``: the config it must have been
        built for (a name, YAML path, ``ModelConfig`` or dict); ``options`` / ``settings``: see the class."""
        return cls(load_model_dir(path, config_argument(config)), _options(options, settings))


    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], *, config: ConfigArgument = None,
                        cache_dir: str | os.PathLike[str] | None = None, options: RuntimeOptions | None = None,
                        **settings: Any) -> PointPillars:
        """Import a .pth and export its graphs once into a cache folder keyed by file hash, config,
        precision (``options.precision``, default fp32) and (for TensorRT plans) TF32 mode. ``config``: the
        checkpoint's config (a name, YAML path, ``ModelConfig`` or dict; default: its layout's built-in one)."""
        from .convert.export import cache_root, model_dir_for_checkpoint
        from .convert.pth import checkpoint_path

        # the arguments checked before a device is probed; the config goes on to the loader as given, since a
        # refusal of it names the fix by its kind (a name or path: --config; a dict: config=None)
        path = checkpoint_path(path)
        config_argument(config)
        cache_root(cache_dir)
        opts = _options(options, settings)
        picked = pick_device(opts.device)
        check_backend_runs_on(picked.kind, opts.backend, picked.fallback_reason)  # before any export
        row = BACKENDS.get(opts.backend)
        plans = row is not None and row.artefact == "plan"
        if plans and picked.kind == "cuda":  # a library that cannot run plans on this GPU: said before they are built
            from .runtime.tensorrt import require_runnable_on

            require_runnable_on(picked.gpu)
        model = model_dir_for_checkpoint(path, config=config, precision=opts.precision or "fp32", cache_dir=cache_dir,
                                         tensorrt_plans=plans, tf32=opts.tf32, device_id=picked.gpu)
        detector = cls.__new__(cls)
        detector._start(model, opts, picked)
        return detector

    @property
    def engine_description(self) -> str:
        """What runs this detector's frames, as the one line every app prints: device, engine, precision
        (so a run that fell back to the CPU never goes unnoticed)."""
        precision = self.model.precision
        impl: Any = self._impl
        if self.device == "cpu":
            return f"CPU, ONNX Runtime, {precision}"
        if precision == "fp32":
            precision = "fp32 with TF32" if impl.tf32 else "IEEE fp32"
        return f"GPU cuda:{impl.device_id}, {BACKENDS[impl.backend].title}, {precision}"

    @property
    def last_timings(self) -> dict[str, float]:
        """Milliseconds per stage of the last call's batch (its last frame on the CPU; GPU: CUDA events, only with
        the option ``stage_timings=True``; CPU: wall clock)."""
        return self._impl.last_timings

    @property
    def gpu_pipeline(self) -> Any:
        """The GPU pipeline (``detect_staged``, for runners that stage frames in memory of their own), or None
        on the CPU path."""
        return self._impl if self.device == "cuda" else None

    def __call__(self, points: object, *, thresholds: Thresholds | None = None) -> Detections:
        """The ``Detections`` of one frame: ``points`` (N, 4 or more) float32 or float64 x, y, z, intensity (a
        multi-sweep model's 5th: the time lag), as a NumPy array, a table read by position, a torch tensor, or on
        the GPU a CuPy / PyTorch CUDA array (no host round trip); ``thresholds``: this call's (``Thresholds``)."""
        self._check_ready()
        frame = _device_or_host_points(points, self.device, self.cfg.num_point_columns)
        self._check_first_intensities(frame)
        return self._findings.of_result(self._impl.detect(frame, self._post_config(thresholds)), "the frame")

    def _check_ready(self) -> None:
        """Refuse a call on a closed detector, or one made while a ``submit_batch`` awaits its ``finish``: on the
        GPU that batch's buffers are in use until then, and the CPU path refuses it alike."""
        if self._closed:
            raise BackendError("this detector is closed: open another (PointPillars.from_model_dir or from_checkpoint)")
        if self._in_flight and self._abandoned is not None:
            self._drain_abandoned()
        if self._in_flight:
            raise BackendError("a batch given to submit_batch is waiting for its finish(): call finish() before the "
                               "detector's next batch (its caller owns the detector until then; give another thread "
                               "a detector of its own)")

    def _check_first_intensities(self, frame: object) -> None:
        """Warn (once) when the first host frame of INTENSITY_JUDGED_FROM points or more disagrees with the scale
        the model was trained on (``find_intensity_mismatch``: 0-255 or values past 255 for a 0-1 model, 0-1 or
        values past 255 for a 0-255 one). A smaller frame (a server's one-point health probe) says nothing of the
        scale and leaves the check for the next."""
        if self._check_intensity and isinstance(frame, np.ndarray) and len(frame) >= INTENSITY_JUDGED_FROM:
            self._check_intensity = False
            found = find_intensity_mismatch(frame, self.model.cfg.expects_unit_intensity)
            if found is not None:
                text = mismatch_text(found.kind, _scale_with_keyword, "columns a point, their order, float32",
                                     found.largest)
                warnings.warn(f"the points' {text} (checked on the first frame)", InputWarning,
                              stacklevel=_callers_level())

    def _say_viewpoint(self, text: str) -> None:
        """A ``.pcd`` VIEWPOINT an ``infer_many`` read left unapplied (``read_points``' ``viewpoint_note``): warned once
        a detector, not once a file, since a run's files share their sensor's pose as a rule. Called on the reader
        threads: the file named is the first whose read found it, which need not be the first given."""
        with self._viewpoint_lock:
            if self._viewpoint_said:
                return
            self._viewpoint_said = True
        warnings.warn(f"{text} (said once)", InputWarning, stacklevel=2)

    def __repr__(self) -> str:
        """The config, what runs the frames and the model dir, as a notebook shows the detector."""
        if "_impl" not in self.__dict__:  # a constructor that failed part way
            return f"<{type(self).__name__}, not opened>"
        state = ", closed" if self._closed else ""
        return (f"<{type(self).__name__} {self.cfg.name} {self.cfg.classes}: {self.engine_description}; "
                f"model dir {os.fspath(self.model.path)!r}{state}>")

    def __setattr__(self, name: str, value: object) -> None:
        """Refuse ``detector.score_threshold = 0.5`` (or ``nms_iou``, ``max_boxes``): the attribute would be a new
        one that nothing reads, and the boxes would still come at the detector's own thresholds."""
        if name in THRESHOLD_NAMES:
            raise ConfigError(f"detector.{name} = {safe_repr(value)}: setting it would change nothing; a detector's "
                              f"thresholds are set when it is opened (from_checkpoint(..., {name}=...)) or for one "
                              f"call (detector(points, thresholds=Thresholds({name}=...)))")
        super().__setattr__(name, value)

    def __reduce__(self) -> Any:
        raise BackendError("a PointPillars detector holds ONNX Runtime sessions or GPU buffers and cannot be pickled "
                           "or copied: open one in each process (PointPillars.from_model_dir(path))")

    def detect_batch(self, frames: Sequence[object], *, thresholds: Thresholds | None = None) -> list[Detections]:
        """Detect on several frames at once (one engine run at batch B on the GPU); frames may differ in
        size. Returns one ``Detections`` per frame, in order; each equals what ``detector(frame)`` gives.
        ``thresholds`` apply to this call only."""
        return self._findings.of_batch(self._detect_batch(frames, thresholds))

    def _detect_batch(self, frames: Sequence[object], thresholds: Thresholds | None = None, *,
                      lags_checked: bool = False) -> list[Detections]:
        """``detect_batch`` less the warnings of a probably misread frame and of pillars past max_pillars, which
        ``infer_many`` says naming the frame's source rather than its place in a batch (and ``warm_up`` not of its
        own frames); ``lags_checked``: a multi-sweep model's frames whose time
        lags were checked as they were read, not checked again."""
        prepared = self._prepared(frames, lags_checked)
        found = self._impl.detect_batch(prepared, self._post_config(thresholds)) if prepared else []
        return [self._findings.overflow(d) for d in found]

    def submit_batch(self, frames: Sequence[object], *,
                     thresholds: Thresholds | None = None) -> Callable[[], list[Detections]]:
        """``detect_batch`` in two halves, for a server that overlaps one batch's GPU work with the host
        work of the next: this checks the frames (at most MAX_BATCH; more than the pipeline's batch grows it
        once, as ``detect_batch`` does), stages and enqueues them, and returns ``finish``, the call that waits
        for the GPU and gives the detections. On the CPU path the batch runs here. Host frames are copied
        before this returns (a server may release them); frames already on the GPU are copied on the pipeline's
        stream after the work queued on the caller's current stream, and that stream waits for the copy (work
        queued there after this call may change or free them; work on other streams must wait for ``finish``).
        ``finish`` must come before the detector's next batch (until then, another batch is refused on either
        path; one dropped uncalled leaves its batch to the next call, which drops its detections). ``finish``
        called again gives the same detections."""
        prepared = self._prepared(frames)
        post_config = self._post_config(thresholds)
        if len(prepared) > MAX_BATCH:
            raise InputError(f"submit_batch: at most {MAX_BATCH} frames a batch, received {len(prepared)}: submit "
                             f"them {MAX_BATCH} at a time (detect_batch and infer_many take any number)")
        with self._submit_lock:
            self._check_ready()  # again, with the check and the claim one step: two threads' batches never mix
            self._in_flight = True
        try:
            wait = self._submitted(prepared, post_config)
        except BaseException:
            self._in_flight = False
            raise
        return self._finish_once(wait)

    def _submitted(self, prepared: list[object], post_config: ModelConfig | None) -> Callable[[], list[Detections]]:
        """``submit_batch``'s work once the detector is claimed: the batch enqueued on the GPU (the CPU path runs
        it here), and the call that waits for its detections."""
        if self.device != "cuda" or not prepared:
            found = self._impl.detect_batch(prepared, post_config) if prepared else []
            said = self._findings.of_batch([self._findings.overflow(d) for d in found])
            return lambda: said
        pipeline = self.gpu_pipeline
        pipeline.submit(prepared, post_config)
        return lambda: self._findings.of_batch([self._findings.overflow(d) for d in pipeline.collect()])

    def _finish_once(self, wait: Callable[[], list[Detections]]) -> Callable[[], list[Detections]]:
        """``submit_batch``'s ``finish``: its first call waits for the batch and frees the detector for the next;
        a later one gives the same detections, never the pipeline's next batch (a batch whose wait failed
        raises again). A ``finish`` dropped uncalled (a server's request that failed between the two halves) leaves
        its batch to the detector's next call, which waits for it and drops its detections: it had held the detector
        for good, every later call refused naming a ``finish`` no one had."""
        batch = _SubmittedBatch(wait)

        def finish() -> list[Detections]:
            found = batch.wait_once(self._free_for_next)
            if found is None:
                raise BackendError("this batch's finish() failed: its detections are lost; submit its frames again")
            return found

        weakref.finalize(finish, self._abandon, batch)
        return finish

    def _abandon(self, batch: _SubmittedBatch) -> None:
        """Leave a batch whose ``finish`` was dropped uncalled to the next call (``_check_ready``), which waits for
        it: this runs wherever the garbage collector does, where waiting for the GPU has no place."""
        if not batch.waited:
            self._abandoned = batch

    def _drain_abandoned(self) -> None:
        """Wait for the batch of a ``finish`` dropped uncalled (``_abandon``) and drop its detections, or its error."""
        batch, self._abandoned = self._abandoned, None
        if batch is not None:
            with contextlib.suppress(Exception):  # no one asked for its detections, nor for its failure
                batch.wait_once(self._free_for_next)

    def _free_for_next(self) -> None:
        """The submitted batch is waited for: the detector takes the next."""
        self._in_flight = False

    def _prepared(self, frames: Sequence[object], lags_checked: bool = False) -> list[object]:
        """The frames as the implementation takes them (``lags_checked``: see ``_device_or_host_points``); a bad
        one fails naming its place in the batch."""
        self._check_ready()
        check_frame_list(frames, self.cfg.num_point_columns)
        prepared = []
        for index, points in enumerate(frames):
            try:
                prepared.append(_device_or_host_points(points, self.device, self.cfg.num_point_columns, lags_checked))
            except PointPillarsError as exc:
                raise type(exc)(f"frame {index} of the batch: {exc}") from None
        if prepared:
            self._check_first_intensities(prepared[0])
        return prepared

    def warm_up(self, batch_sizes: Sequence[int] | None = None, points_per_frame: int | None = None) -> None:
        """Run a synthetic frame of ``points_per_frame`` points (default 2,000) inside the model's range
        at each of ``batch_sizes`` (default: 1 to the detector's batch on the GPU, 1 on the CPU), so that
        no real frame pays for capturing CUDA graphs, for growing the point buffers (give the run's
        largest frame as read: a bound on frames cropped after reading) or for a session's first run."""
        self._check_ready()
        n = int_within(points_per_frame or 2_000, 1, MAX_FRAME_POINTS)  # 0 or None: the default (empty files)
        if n is None:
            raise PointPillarsError(f"points_per_frame: expected an int from 1 to {MAX_FRAME_POINTS}, received "
                                    f"{safe_repr(points_per_frame)}")
        given = [] if batch_sizes is None else [int_within(size, 1, MAX_BATCH)
                                                for size in _as_list(batch_sizes, "batch_sizes")]
        if None in given:
            raise PointPillarsError(f"batch_sizes: expected ints from 1 to {MAX_BATCH}, received "
                                    f"{safe_repr(batch_sizes)}")
        sizes = [size for size in given if size is not None]  # none given (None, or an empty list): the default
        if not sizes:
            sizes = list(range(1, (self.options.max_batch if self.device == "cuda" else 1) + 1))
        lo, hi = np.split(np.asarray(self.cfg.voxel.point_range, np.float32), 2)
        rng = np.random.default_rng(0)
        columns = [rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, (n, self.cfg.num_point_columns - 3))]
        frame = np.column_stack(columns).astype(np.float32)
        armed, self._check_intensity = self._check_intensity, False  # synthetic 0-1 values: the user's first frame
        try:                                                         # is the one checked
            for batch in sizes:  # nothing said of the frames' pillars: they are no caller's
                self._detect_batch([frame] * batch)
        finally:
            self._check_intensity = armed

    def _post_config(self, thresholds: Thresholds | None) -> ModelConfig | None:
        """The config one call's post-process runs with (None: the detector's own)."""
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise ConfigError(f"thresholds: expected Thresholds(score_threshold=..., nms_iou=..., max_boxes=...), "
                              f"got {type(thresholds).__name__}")
        return None if thresholds is None or thresholds == Thresholds() else thresholds.applied_to(self.cfg)

    def infer_many(self, frames: Iterable[object], *, batch_size: int = 1, point_dim: int | None = None,
                   thresholds: Thresholds | None = None) -> Generator[FrameResult, None, None]:
        """Detect on many frames (arrays or point-file paths), ``batch_size`` at a time; a bad frame
        yields its error and the rest go on. Results come in input order; a failed read is yielded
        as soon as the frames before it are, so any number of bad frames in a row costs no memory.
        ``point_dim``: values a point of ``.bin`` files (default: the model's point columns, 5 for
        multi-sweep models); ``thresholds`` apply to this call only.

        The frames go in groups of ``batch_size`` (at most 8; on the GPU at most the pipeline's batch, which
        grows to it), each group one batch less its failed reads. A group's point files are read on
        ``INFER_MANY_READERS`` threads straight into a staging buffer of its own (page-locked on the GPU,
        where the batch is copied to the device from it as it lies). Frames given as a sequence (a list of
        paths) are read up to ``INFER_MANY_READ_AHEAD`` groups ahead while a group runs; from any other
        iterable (a generator, a live source) no frame is taken beyond the group being filled, so a batch's
        results never wait for later frames, and what the iterable raises comes after the results of the
        frames it gave. The results are a generator: read in part, ``close()`` on it (as a ``for`` loop left early
        does once nothing else holds it) ends it at once, its reads not started dropped.
        """
        self._check_ready()
        check_frames_to_stream(frames, self.cfg.num_point_columns)
        batch = int_within(batch_size, 1)
        if batch is None:
            raise PointPillarsError(f"batch_size: expected a positive int, received {batch_size!r}")
        post_config = self._post_config(thresholds)  # checked here, not at the first result
        detect = functools.partial(self._detect_staged, thresholds=thresholds, post_config=post_config)
        columns = self.cfg.num_point_columns
        dim = columns if point_dim is None else point_dim
        require_point_dim(dim)  # here, not as every file's error (a .bin's rows against the model: at its read)
        read = functools.partial(read_points_into, point_dim=dim, columns=columns, viewpoint_note=self._say_viewpoint)
        ahead = INFER_MANY_READ_AHEAD if isinstance(frames, Sequence) else 0
        pipeline = self.gpu_pipeline
        batch = min(batch, MAX_BATCH)  # more frames a group would only hold more memory (a GPU pass takes 8)
        if pipeline is not None:  # a group is run from its staging in one pass: at most the pipeline's batch
            batch = min(batch, pipeline.fit_batch(batch))
        # from the first files' sizes; a list or tuple only: any other iterable's items are taken in turn
        likely = likely_points_per_frame(frames, dim) if isinstance(frames, (list, tuple)) else None
        pool = _StagingPool(batch * max(INITIAL_POINTS_PER_FRAME, likely or 0), columns,
                            PageLockedOrOrdinary() if pipeline is not None else None)
        return self._stream(iter(enumerate(frames)), batch, read, pool, ahead, detect)  # checked above, not at next()

    def _stream(self, items: Iterator[tuple[int, object]], batch_size: int, read: ReadFrame, pool: _StagingPool,
                ahead: int, detect: _DetectGroup) -> Generator[FrameResult, None, None]:
        """``infer_many``'s loop; ``ahead``: groups read ahead of the one that runs."""
        reader = ThreadPoolExecutor(max_workers=INFER_MANY_READERS, thread_name_prefix="pp-infer-many")
        groups: collections.deque[_Group] = collections.deque()
        ended, failed = False, None  # the items ended; what the caller's iterable raised
        try:
            while True:
                while not ended and len(groups) <= ahead:
                    group, ended, failed = _start_group(reader, items, batch_size, read, pool)
                    if group.items:
                        groups.append(group)
                if not groups:
                    break
                if self._closed:  # since the call: said once, not as each frame's error after its read
                    raise BackendError("this detector was closed before infer_many's results were all read: read "
                                       "them before close(), inside its with block")
                group = groups.popleft()
                yield from self._run_group(group, detect)
                pool.give(group)
        finally:  # the caller may stop early: reads not started are dropped, not waited for
            reader.shutdown(wait=True, cancel_futures=True)
        if failed is not None:  # after the results of the frames it gave before
            raise failed

    def _run_group(self, group: _Group, detect: _DetectGroup) -> Iterator[FrameResult]:
        """A group's frames as one batch (``detect``: ``_detect_staged`` with the call's thresholds), each failed
        read in its place."""
        columns = self.cfg.num_point_columns
        window: list[FrameResult | _GroupFrame] = []
        for source, item, future in group.items:
            try:
                if future is None:  # the caller's array
                    points, start = _device_or_host_points(item, self.device, columns), None
                else:  # a file's points, checked by its read
                    points, start = future.result()
                    group.rows_read += len(points)
                window.append(_GroupFrame(source, points, start))
            except PointPillarsError as exc:
                window.append(FrameResult(source, None, exc))
            except Exception as exc:  # noqa: BLE001 - an array whose protocols misbehave fails alone
                unread = InputError(f"{safe_repr(source)}: cannot be read as points ({type(exc).__name__}: {safe_repr(str(exc), 100)})")
                window.append(FrameResult(source, None, unread))
        frames = [entry for entry in window if isinstance(entry, _GroupFrame)]
        results = iter(detect(group.staging, frames))
        for entry in window:
            if isinstance(entry, FrameResult):
                yield entry
                continue
            found = next(results)
            if isinstance(found, BaseException):
                error = found if isinstance(found, PointPillarsError) else PointPillarsError(str(found))
                yield FrameResult(entry.source, None, error)
            else:
                yield FrameResult(entry.source, self._findings.of_frame(found, safe_repr(entry.source)), None)

    def _detect_staged(self, staging: StagingBuffer | None, frames: list[_GroupFrame], *, thresholds: Thresholds | None,
                       post_config: ModelConfig | None) -> list[Detections | BaseException]:
        """``each_alone`` of the frames; on the GPU, when all of them lie in ``staging``, one pass of the pipeline
        straight from it (no copy on this thread). When that pass fails, the frames go through ``each_alone``,
        where each frame's own error shows (also that the detector was closed meanwhile); their time lags are not
        checked again there (a file's read checked them, ``_run_group`` an array's). A probably misread frame is
        not said here: ``_run_group`` says it, naming its source."""
        pipeline = self.gpu_pipeline
        if (pipeline is not None and staging is not None and frames and not self._closed
                and all(frame.start is not None for frame in frames)):
            self._check_first_intensities(frames[0].points)
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # non-finite boxes are dropped and counted
                    placed = [(len(frame.points), frame.start) for frame in frames]
                    found = pipeline.detect_staged(staging, placed, post_config)
                    return [self._findings.overflow(one) for one in found]
            except FRAME_ERRORS:
                pass
        batch = functools.partial(self._detect_batch, thresholds=thresholds, lags_checked=True)
        return each_alone(batch, [frame.points for frame in frames])

    def close(self) -> None:
        """Free the engine sessions and GPU buffers (the ``with`` block's end calls it; again, it does nothing):
        a later call raises BackendError, as does an ``infer_many`` iterator read on."""
        self._closed = True
        self._impl.close()

    def __enter__(self) -> PointPillars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The thresholds a detector is opened with or given for one call (``Thresholds``' fields).
THRESHOLD_NAMES = frozenset(field.name for field in fields(Thresholds))

#: What one frame may raise without failing the frames batched with it (it becomes that frame's error).
FRAME_ERRORS = (PointPillarsError, ValueError, RuntimeError, MemoryError, OSError, RecursionError)


def detect_each(detector: Any, frames: Sequence[object], thresholds: Thresholds | None = None, *,
                lags_checked: bool = False) -> list[Detections | BaseException]:
    """``detector.detect_batch(frames)``; when the batch fails, each frame on its own, so that only the
    frame at fault fails: a ``Detections`` or the exception, per frame. ``detector``: anything with
    ``detect_batch`` (a ``PointPillars``, a remote detector), or with a ``detect_each`` of its own whose
    frames fail alone (a remote detector: one request a frame); ``thresholds``: this call's, if any.
    ``lags_checked``: the frames are as a point-file read gave them (``read_points_into``), which checked a
    multi-sweep frame's time lags: a ``PointPillars`` does not check them again."""
    if not frames:
        return []
    own = getattr(detector, "detect_each", None)
    if own is not None and thresholds is None:
        return list(own(list(frames)))
    if lags_checked and isinstance(detector, PointPillars):
        def batch(group: list[object]) -> list[Detections]:
            return detector._findings.of_batch(detector._detect_batch(group, thresholds, lags_checked=True))
        return each_alone(batch, frames)
    return each_alone(detector.detect_batch if thresholds is None
                      else functools.partial(detector.detect_batch, thresholds=thresholds), frames)


def each_alone(batch: Callable[[list[object]], Sequence[Detections]], frames: Sequence[object],
               ) -> list[Detections | BaseException]:
    """``batch(frames)``; when it fails, each frame on its own, so that only the frame at fault fails: a
    ``Detections`` or the exception, per frame."""
    if not frames:
        return []
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite boxes are dropped and counted
            return list(batch(list(frames)))
    except FRAME_ERRORS as exc:
        if len(frames) == 1:
            return [exc]
        return [result for frame in frames for result in each_alone(batch, [frame])]


#: Threads ``infer_many`` reads point files on, and how many groups (batches) they read ahead of the one that
#: runs. Chosen when the calling thread still copied each frame into the pipeline's staging (the reads now
#: land in the group's own): beside the detect calls, which need this process's interpreter lock back after
#: each CUDA call, more threads were not faster then (H200, batches of 8, camera-view crops / full scans a
#: second, 2 threads 2,083-2,961 / 892-1,311, 4 threads 1,535-2,345 / 1,101-1,422, 8 threads 1,131 / 722-795).
INFER_MANY_READERS = 2
INFER_MANY_READ_AHEAD = 2


def _scale_with_keyword(factor: str | None) -> str:
    """How a Python caller scales a frame's intensities by ``factor`` (``intensities.mismatch_text``)."""
    if factor is None:
        return "scale the 4th column (read_points(..., intensity_scale=...))"
    return f"scale the 4th column by {factor} (read_points(..., intensity_scale={factor}))"


def _options(options: RuntimeOptions | None, settings: dict[str, Any]) -> RuntimeOptions:
    """The options object, or the one the convenience keywords build; both at once is ambiguous."""
    if options is None:
        return RuntimeOptions.of(**settings)
    if settings:
        raise PointPillarsError(f"give RuntimeOptions or keyword settings, not both (received {', '.join(settings)})")
    if not isinstance(options, RuntimeOptions):
        raise PointPillarsError(f"options: expected RuntimeOptions, received {type(options).__name__}")
    return options


def _callers_level() -> int:
    """The ``stacklevel`` of a warning, given in a function of this module, that names the first caller outside
    it (the user's line, whether they called ``PointPillars(...)``, ``from_model_dir`` or ``from_checkpoint``)."""
    return callers_level((__file__,)) - 1  # counted from this function's frame: from its caller's, one fewer


def refuse_other_precision(model: ModelDir, precision: str | None) -> None:
    """Refuse a precision (the runtime options') other than the one ``model``'s graphs were built in: it is chosen
    when a checkpoint is exported, and a model dir runs as built."""
    if precision is not None and precision != model.precision:
        raise BackendError(f"precision {precision}: the model dir {safe_repr(model.path)} holds {model.precision} "
                           "graphs (precision applies when exporting a checkpoint; rebuild for another)")


def onnxruntime_threads(asked: int | None) -> int | None:
    """ONNX Runtime's CPU thread count: ``asked`` (the options' threads), else OMP_NUM_THREADS, at most this
    machine's cores (thousands of threads took minutes and gigabytes to start, and would not stop on SIGTERM;
    ``cpu_threads``); an OMP_NUM_THREADS that is no thread count is left out. Either is said once
    (``SettingNotice``)."""
    count, _, note = cpu_threads(asked, "threads=")
    if note is not None:
        warnings.warn(note, SettingNotice, stacklevel=_callers_level())
    return count


def _device_or_host_points(points: object, device: str, columns: int, lags_checked: bool = False) -> object:
    """CUDA arrays go to the GPU pipeline as they are (a multi-sweep model's as the CuPy view its check made);
    everything else becomes (N, columns) float32 on the host.
    A multi-sweep model's frame has its 5th values checked as time lags (as its files' are when they are read),
    on the host (~0.4 ms for 300k points) or where a CUDA array lies (``check_device_time_lags``: one read of
    ~2 KB), unless ``lags_checked`` (a frame a file's read gave, or one checked already)."""
    if device == "cuda" and is_cuda_array(points):
        if columns == 5 and not lags_checked:
            from .device_points import check_device_time_lags  # CuPy: only where a detector runs on the GPU

            return check_device_time_lags(points, columns, "points")
        return points
    host = as_host_points(points, columns=columns)
    if columns == 5 and not lags_checked:
        with np.errstate(all="ignore"):  # NaN and huge values are what the check looks past
            check_time_lags(host.reshape(-1), columns, "points")
    return host


def check_frames_to_stream(frames: object, columns: int) -> None:
    """What ``infer_many`` (local or remote) takes: an iterable of frames or paths. A single path, None, a
    number or one frame's array is refused when it is called (one frame's rows would each be a frame's error);
    a 1-D NumPy array of paths is a list of them."""
    if isinstance(frames, (str, bytes, os.PathLike)):
        raise InputError(f"infer_many: expected an iterable of frames, got the single path {safe_repr(frames)}: "
                         "pass [path]")
    if not (getattr(getattr(frames, "dtype", None), "kind", "") == "U" and getattr(frames, "ndim", 0) == 1):
        check_frame_list(frames, columns)


def _as_list(values: object, name: str) -> list[object]:
    """``values`` (an iterable, not a string) as a list, else PointPillarsError naming ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise PointPillarsError(f"{name}: expected a list, received {safe_repr(values)}")
    return list(values)


def frame_source(item: object, index: int) -> str:
    """How a frame is named in results and messages: its path, else ``frame <index>`` (an array, or a path-like
    object whose path cannot be had: its read then fails naming why)."""
    if is_frame_path(item):
        try:
            return os.fsdecode(item)
        except Exception:  # noqa: BLE001 - a path-like that misbehaves fails alone, when it is read
            pass
    return f"frame {index}"


@dataclass
class _GroupFrame:
    """A frame of an ``infer_many`` group that was read: its points, and their first row in the group's
    staging buffer (None: an array of their own)."""

    source: str
    points: Any  # host rows, or a CUDA array given as a frame
    start: int | None


#: ``_detect_staged`` with a call's thresholds bound: a group's staging and frames -> a result a frame.
_DetectGroup = Callable[[StagingBuffer | None, list[_GroupFrame]], list[Detections | BaseException]]


class _GroupItem(NamedTuple):
    """An item of an ``infer_many`` group: its name, the item, and its read into the group's staging (None for
    an array, which is not read)."""

    source: str
    item: object
    future: Future[tuple[np.ndarray, int | None]] | None


@dataclass
class _Group:
    """``batch_size`` items of ``infer_many`` and the staging buffer their point files are read into (taken at
    the first of them); once run, the rows of the frames read (what the next buffers must hold)."""

    staging: StagingBuffer | None
    items: list[_GroupItem]
    rows_read: int = 0


def _start_group(reader: Executor, items: Iterator[tuple[int, object]], size: int, read: ReadFrame,
                 pool: _StagingPool) -> tuple[_Group, bool, Exception | None]:
    """The next ``size`` items, their point files' reads into a buffer of ``pool`` started on ``reader``;
    whether the items ended, and what their iterable raised if it did (the frames before it still run)."""
    group = _Group(None, [])
    while len(group.items) < size:
        try:
            taken = next(items, None)
        except Exception as exc:  # noqa: BLE001 - the caller's own error, raised once its frames are done
            return group, True, exc
        if taken is None:
            return group, True, None
        index, item = taken
        future = None
        if is_frame_path(item):
            if group.staging is None:
                group.staging = pool.take()
            future = reader.submit(group.staging.read_frame, read, item)
        group.items.append(_GroupItem(frame_source(item, index), item, future))
    return group, False, None


class _SubmittedBatch:
    """A ``submit_batch``'s batch: the call that waits for its detections, made once (by its ``finish``, or by the
    detector's next call once that ``finish`` was dropped uncalled), and what it gave."""

    def __init__(self, wait: Callable[[], list[Detections]]) -> None:
        self._wait = wait
        self.waited = False
        self._found: list[Detections] | None = None
        self._lock = threading.Lock()

    def wait_once(self, waited: Callable[[], None]) -> list[Detections] | None:
        """The batch's detections: the first call waits for them (its error raised) and calls ``waited`` either way;
        a later one, waiting for the first, gives the same (None where that wait failed)."""
        with self._lock:
            if not self.waited:
                self.waited = True
                try:
                    self._found = self._wait()
                finally:
                    waited()
        return self._found


class _StagingPool:
    """``infer_many``'s staging buffers (``alloc``: page-locked on the GPU), one a group being read or run,
    reused group after group; once a group's frames did not fit, the pool's buffers are made to hold as many
    rows (a power of two, ``StagingBuffer``), and a smaller one given back is dropped. Where page-locked
    memory runs out, buffers of ordinary memory (the GPU copies from them too, more slowly), said once."""

    def __init__(self, capacity: int, columns: int, alloc: PageLockedOrOrdinary | None) -> None:
        self.capacity, self._columns, self._alloc = capacity, columns, alloc
        self._free: list[StagingBuffer] = []

    def take(self) -> StagingBuffer:
        if self._free:
            buffer = self._free.pop()
            buffer.reset()
            return buffer
        buffer = StagingBuffer(self.capacity, self._alloc, self._columns)
        news = self._alloc.news() if self._alloc is not None else None
        if news is not None:
            warnings.warn(f"infer_many: {news}", RuntimeWarning, stacklevel=_callers_level())
        return buffer

    def give(self, group: _Group) -> None:
        buffer = group.staging
        if buffer is None:
            return
        if group.rows_read > buffer.capacity:  # a frame did not fit: the next buffers hold a group like it
            self.capacity = max(self.capacity, group.rows_read)
        if buffer.capacity >= self.capacity:
            self._free.append(buffer)
