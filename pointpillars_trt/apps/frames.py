"""The streaming frame runner of the applications: local ``infer``, each Ray actor, ``infer --server``
(``PointPillars.infer_many`` reads and runs its groups with a loop of its own).

    items --> readers -----------------> K pipeline threads -----------> writers
              (threads, or processes a     (one GPU pipeline each: its    (a batch's outputs a task, any
               batch a task: point files    own stream, batch B, one H2D   order; threads, or processes
               read straight into the       + one D2H copy a batch)        that take the encoding and
               batch's pinned staging)                                     file calls off this GIL)
                                                     results, in input order --> the caller

Frames go in batches of B, in input order; K pipelines take the next ready batch as they free up,
so file I/O, the GPU and output writing overlap. A frame that cannot be read, detected or written
fails alone (its result carries one line of error) and every other frame goes on: ANY exception a
reader or writer raises becomes that frame's error. Memory stays flat however long the run: at most
``2 K + 2`` batches are between reading and reporting, and their staging buffers are reused.
"""

from __future__ import annotations

import errno
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import BrokenExecutor, CancelledError, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError  # not the builtin one on Python 3.10
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

from ..detector import detect_each, frame_source
from ..errors import InputError, one_line, safe_repr
from ..intensities import intensity_mismatch
from ..pointcloud_io import Allocate, read_bin_bytes_into, read_points_into
from ..shared_staging import SharedArrays, shared_memory_available
from ..staging import (HEADER_ROWS, INITIAL_POINTS_PER_FRAME, PageLockedOrOrdinary, ReadFrame, StagingBuffer,
                       rounded_capacity)
from ..stop_signals import stop_signals_blocked, unblock_stop_signals
from .frame_reads import ProcessRead, read_batch, read_into
from .outputs import OutputsReplacedError

#: Seconds a failed worker pool waits for the run to be found stopping before it warns (``_stopping``).
STOP_GRACE = 0.2
#: Points a frame above which a run's frames count as large (full scans, ~121k points; a camera-view
#: crop has ~19k) for ``reader_threads``.
LARGE_FRAME_POINTS = 65_536

#: An item that ends the batch being cut: the frames before it go as a smaller batch at once (a caller
#: that waits for a group of frames must not wait for the next group's to fill the batch). Not a frame:
#: it takes no name from ``sources`` and yields no job.
BATCH_BREAK = object()


@dataclass(frozen=True)
class FrameBytes:
    """A frame's file as bytes, as Ray Data reads it from a URI, with the name it was read from: the frame's
    messages name it as they name a local file."""

    source: str
    data: bytes
    error: str = ""  # why it could not be read (no data): the frame's error


#: ``FrameReader.finding_of``'s kind for a multi-sweep frame of per-point capture times (``holds_capture_times``, as
#: the read's ``capture_times_note`` tells it).
CAPTURE_TIMES = "capture_times"


class FrameReader:
    """How ``infer`` and each Ray worker read a frame for the runner: a point file (or a ``.bin``'s
    ``FrameBytes``, as Ray Data reads them from object storage) into the rows ``allocate`` gives, then
    ``prepare`` (e.g. the camera-FOV crop), then what the read says is probably wrong with every frame:
    no point at all (whatever its format), intensities on another scale than the model was trained
    on, or a multi-sweep frame's per-point capture times where the model reads its sweeps' time lags. ``finding_of(item)``, asked in input order, names the first frame of each kind for its one
    warning, whichever reader thread read it first, and counts them all for the run's summary line.
    ``viewpoint_of(item)`` gives what the read said of a ``.pcd`` VIEWPOINT it left unapplied. A multi-sweep frame's
    time lags are checked by its read (``read_points_into``, ``read_bin_bytes_into``), which the runner tells its
    detectors."""

    def __init__(self, cfg: Any, *, point_dim: int, intensity_scale: float | None,
                 prepare: Callable[[np.ndarray, str], np.ndarray] | None = None, columns: int | None = None) -> None:
        # the model's point columns: its config's, else (a served model, whose config is not here) ``columns``
        self.columns = cfg.num_point_columns if cfg is not None else columns or 4
        self.point_dim, self.intensity_scale, self.prepare = point_dim, intensity_scale, prepare
        # a served model (no config here) of 4 columns is a KITTI-style one: 0-1 reflectance
        self.expects_unit = cfg.expects_unit_intensity if cfg is not None else self.columns == 4
        # after --intensity-scale too: a scale the wrong way round (255 for 0-1 files) is as silent as none
        self.check_intensity = cfg is None or "intensity" in cfg.features.order
        self._findings: dict[int, str] = {}  # item id -> what its frame's read found (finding_of), until asked
        self._viewpoints: dict[int, str] = {}  # item id -> its .pcd VIEWPOINT left unapplied (viewpoint_of)

    def __call__(self, item: object, allocate: Allocate) -> np.ndarray:
        capture_times: list[str] = []  # the read's own finding (its warning's text), not looked for again here
        if isinstance(item, FrameBytes):
            if item.error:
                raise InputError(item.error)
            if os.path.splitext(item.source)[1].lower() != ".bin":  # read as one, it would be garbage or refused
                raise InputError(f"point file {safe_repr(item.source)}: a frame read from a URI is read as a .bin "
                                 "file (rows of float32 values), and this one is not: give other frames as local "
                                 "paths")
            points = read_bin_bytes_into(item.data, allocate, point_dim=self.point_dim,
                                         intensity_scale=self.intensity_scale, source=item.source, columns=self.columns,
                                         capture_times_note=capture_times.append)
        else:
            points = read_points_into(item, allocate, point_dim=self.point_dim,  # type: ignore[arg-type]
                                      intensity_scale=self.intensity_scale, columns=self.columns,
                                      viewpoint_note=functools.partial(self._viewpoints.__setitem__, id(item)),
                                      capture_times_note=capture_times.append)
        empty = len(points) == 0  # as read: a crop that leaves none of a frame's points is said by the crop
        if self.prepare is not None:  # a frame of a URI by the name Ray Data lists it by (file://: its path here)
            points = self.prepare(points, item.source if isinstance(item, FrameBytes) else str(item))
        if empty:
            self._findings[id(item)] = "empty"
        else:
            mismatch = intensity_mismatch(points, self.expects_unit) if self.check_intensity else None
            if mismatch is not None:
                self._findings[id(item)] = mismatch
            elif capture_times:
                self._findings[id(item)] = CAPTURE_TIMES
        return points

    def finding_of(self, item: object) -> str | None:
        """What ``item``'s read found probably wrong with its frame: ``"empty"`` (no point at all), how its
        intensities disagreed with the model's scale (``intensity_mismatch``), or ``CAPTURE_TIMES``; None for a frame that read
        well. Asked once per item in input order (the runner's jobs hold their items until then). Every
        frame is checked, whatever the frames before it were: a run's frames may go wrong in more than one
        way (each kind gets its warning), and the summary counts every frame of a kind."""
        return self._findings.pop(id(item), None)

    def viewpoint_of(self, item: object) -> str | None:
        """What the read of ``item`` said of its ``.pcd`` VIEWPOINT, which it left unapplied (``viewpoint_text``: the
        file and the pose), or None; asked once per item, as ``finding_of``."""
        return self._viewpoints.pop(id(item), None)

    def notes_of(self, item: object) -> tuple[str | None, str | None, Any] | None:
        """In a reader process, right after ``item``'s read: what the read noted of its frame (``finding_of``'s
        and ``viewpoint_of``'s answers, and the per-frame step's own notes), for the runner's process to
        ``keep_notes``."""
        finding, viewpoint = self.finding_of(item), self.viewpoint_of(item)
        step = getattr(self.prepare, "notes_of", None)
        step_notes = step(str(item)) if step is not None else None
        return None if finding is None and viewpoint is None and step_notes is None else (finding, viewpoint,
                                                                                           step_notes)

    def keep_notes(self, item: object, notes: tuple[str | None, str | None, Any]) -> None:
        """What a reader process's read noted of ``item``'s frame (``notes_of``), kept as this process's own read
        would have kept it."""
        finding, viewpoint, step_notes = notes
        if finding is not None:
            self._findings[id(item)] = finding
        if viewpoint is not None:
            self._viewpoints[id(item)] = viewpoint
        if step_notes is not None:
            self.prepare.keep_notes(str(item), step_notes)  # type: ignore[union-attr]

    def __getstate__(self) -> dict[str, Any]:
        """A reader as a reader process receives it: without the findings not yet asked for here."""
        return {**self.__dict__, "_findings": {}, "_viewpoints": {}}


def reader_threads(points_per_frame: int | None) -> int:
    """Reader threads for a run of frames of about ``points_per_frame`` points (None: not known). A read
    releases the interpreter lock but takes it back at each system call and check, against the pipelines'
    threads: on an H200 with 16 cores, camera-view crops ran 2,577-2,723 frames/s with 2 readers and
    2,003-2,084 with 8; full scans, whose reads take ~6x longer, 1,720-1,883 with 8 and 1,372-1,406 with 2."""
    large = points_per_frame is not None and points_per_frame > LARGE_FRAME_POINTS
    return min(8 if large else 2, os.cpu_count() or 1)


@dataclass
class FrameJob:
    """One frame on its way through the runner."""

    index: int
    source: str
    item: object
    # its (n, columns) points; of a frame with time lags that a reader process staged, the (n, 4) rows alone, the
    # lags in ``times`` (``whole_points`` joins them where a step needs the frame whole)
    points: np.ndarray | None = None
    times: np.ndarray | None = None
    start: int | None = None  # first row in the batch's staging buffer, when read into it
    error: str | None = None
    replaced: int = 0  # files of an earlier run that its failed write had replaced (named in its error)
    detections: Any = None
    written: Any = None  # what the write step returned
    _write: tuple[Future[list[tuple[bool, Any]]], int, Executor] | None = None  # batch's write task, place, writers


@dataclass
class _Batch:
    jobs: list[FrameJob]
    staging: StagingBuffer | None
    reads: list[Future[Any]] = field(default_factory=list)  # a task a frame, or one a batch in a reader process
    read_pool: Executor | None = None  # the reader-process pool that took the batch's one read task
    detected: threading.Event = field(default_factory=threading.Event)


class FrameRunner:
    """Runs frames through ``detectors`` (one per pipeline: ``PointPillars`` objects, or anything with
    ``detect_batch``) ``batch_size`` at a time.

    ``read(item, allocate)`` reads one frame; ``write(source, detections, points)`` (optional) writes a
    detected frame's outputs and returns what the caller wants in ``job.written``, one task a batch, in
    ``writers`` threads or in ``writer_processes`` (``write`` must then pickle: a module-level function
    or a partial of one); ``keep_points`` hands each frame's points to ``write`` (for writers that draw
    them). ``run`` yields every job in input order. Safe for one ``run`` at a time; ``close`` stops the
    threads and processes. When a writer process dies (e.g. killed for memory), the frames then in the
    writer processes fail with "not written", ``notice`` says so once, and the rest of the run writes in
    threads (as it does when they cannot start). ``points_per_frame`` sizes the staging buffers (e.g.
    ``likely_points_per_frame``; default ``INITIAL_POINTS_PER_FRAME``) and, unless ``readers`` is given,
    the reader threads (``reader_threads``).

    ``reader_processes`` (``read_batch`` warmed; ``read`` must then pickle) read the batches of local files
    instead of threads, each batch's frames straight into its staging buffer in shared memory
    (``shared_staging``): this process's interpreter lock then serves the launches, the writes' hand-offs
    and the reports only. Frames given as bytes are read in threads. Where shared memory cannot hold the
    staging (a container's small ``/dev/shm``), the run reads in threads and says so once; a reader
    process that dies costs no frame (its batch is read again here) and the rest of the run reads in
    threads, said once. A detector whose ``lost`` names why it can run no more frames (a served model's
    server that is down) ends the reads: every batch after fails with that reason unread.

    A run stopped early (Ctrl-C, SIGTERM) still finishes the writes under way; ``written_when_stopped`` then
    gives the jobs of its last batches whose outputs were written, so the caller's count of them matches
    the files on disk.
    """

    def __init__(self, detectors: Sequence[Any], *, batch_size: int, read: ReadFrame,
                 write: Callable[[str, Any, np.ndarray | None], Any] | None = None, readers: int | None = None,
                 writers: int = 4, writer_processes: WorkerProcesses | None = None,
                 keep_points: bool = False, notice: Callable[[str], None] | None = None,
                 points_per_frame: int | None = None, reader_processes: WorkerProcesses | None = None) -> None:
        if not detectors:
            raise ValueError("FrameRunner needs at least one detector")
        self.detectors = list(detectors)
        self.batch_size = batch_size
        self.read, self.write, self.keep_points = read, write, keep_points
        # a FrameReader's reads check a multi-sweep frame's time lags: the detectors do not check them again
        self._lags_checked = isinstance(read, FrameReader)
        on_gpu = all(getattr(d, "gpu_pipeline", None) is not None for d in self.detectors)
        self._alloc = PageLockedOrOrdinary() if on_gpu else None  # pinned staging: the H2D copies from it
        readers = reader_threads(points_per_frame) if readers is None else max(1, readers)
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="pp-read")
        self._writer_threads = max(1, writers)
        self._notice = notice or (lambda text: print(text, file=sys.stderr, flush=True))
        if writer_processes is not None and not writer_processes.wait():
            self._notice(f"warning: the writer processes could not start ({writer_processes.failure}); "
                         "writing in threads")
            writer_processes = None
        self._writer_processes = writer_processes
        self._writers: Executor = (
            writer_processes.pool if writer_processes is not None
            else ThreadPoolExecutor(max_workers=self._writer_threads, thread_name_prefix="pp-write"))
        self._writers_lock = threading.Lock()
        slots = 2 * len(self.detectors) + 2
        self._free: queue.Queue[StagingBuffer] = queue.Queue()
        capacity = batch_size * max(INITIAL_POINTS_PER_FRAME, points_per_frame or 0)
        cfg = getattr(self.detectors[0], "cfg", None)
        columns = cfg.num_point_columns if cfg is not None else 4  # 5: time lags staged beside the rows
        self._reader_pool: WorkerProcesses | None = None
        self._shared: SharedArrays | None = None
        self._reader_data = b""  # the pickled ``read`` every reader process task carries
        self._shared_memory_full = False  # said once: a larger staging buffer went to this process's memory
        if reader_processes is not None:
            why_not = self._read_in(reader_processes, SharedArrays(pin=on_gpu), slots, capacity, columns)
            if why_not is not None:
                self._notice(f"note: reading frames in threads: {why_not}")
                reader_processes.pool.shutdown(wait=False, cancel_futures=True)
        if self._shared is None:
            for _ in range(slots):
                self._free.put(StagingBuffer(capacity, self._alloc, columns))
            self._say_ordinary_staging()
        self._slots = slots
        self._readers_lock = threading.Lock()
        self._stop = threading.Event()  # the running run's: set when it is stopped
        # the running run's batches handed on in order that the caller has not finished with, oldest first;
        # once it ended, those it left (``written_when_stopped``)
        self._unfinished: deque[_Batch] = deque()

    def _read_in(self, processes: WorkerProcesses, shared: SharedArrays, slots: int, capacity: int,
                 columns: int) -> str | None:
        """Read in ``processes``, into ``slots`` staging buffers from ``shared``; why not, when they cannot."""
        if not shared_memory_available():
            return "no shared memory (/dev/shm) to stage them in"
        if not processes.wait():
            return f"the reader processes could not start ({processes.failure})"
        try:
            data = pickle.dumps(self.read)
        except Exception as exc:  # noqa: BLE001 - a reader that does not pickle reads in threads
            return f"the reader does not pickle ({one_line(exc)})"
        buffers: list[StagingBuffer] = []
        try:
            for _ in range(slots):
                buffers.append(StagingBuffer(capacity, shared, columns))
        except BaseException as exc:  # /dev/shm full, the pages not page-locked; or Ctrl-C / SIGTERM meanwhile
            shared.close()  # the files made so far go now, not at exit with the resource tracker's warning
            if not isinstance(exc, Exception):
                raise
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                mib = slots * (HEADER_ROWS + rounded_capacity(capacity)) * 4 * columns / 2**20  # + time lags
                return (f"{mib:,.0f} MiB of staging do not fit in /dev/shm (a container's is 64 MB unless "
                        "started with --shm-size)")
            return f"the staging could not be made in shared memory ({one_line(exc)})"
        for buffer in buffers:
            self._free.put(buffer)
        self._shared, self._reader_pool, self._reader_data = shared, processes, data
        return None

    # -- the run ------------------------------------------------------------------------------------

    def run(self, items: Iterable[object], sources: Iterable[str] | None = None) -> Generator[FrameJob, None, None]:
        """Every item's job, in input order, once it is detected and written (or failed). ``items`` are
        read in a thread of the runner's, as its window allows (an iterator may block for the next
        one); ``sources`` names them (default: ``frame_source``)."""
        ready: queue.Queue[_Batch | None] = queue.Queue()
        ordered: queue.Queue[_Batch | BaseException | None] = queue.Queue()
        window = threading.BoundedSemaphore(self._slots)
        stop = self._stop = threading.Event()
        unfinished = self._unfinished = deque()
        names = iter(sources) if sources is not None else None
        dispatcher = threading.Thread(target=self._dispatch, name="pp-dispatch", daemon=True,
                                      args=(items, names, ready, ordered, window, stop, unfinished))
        workers = [threading.Thread(target=self._pipeline_loop, name=f"pp-pipeline-{i}", daemon=True,
                                    args=(detector, ready, stop)) for i, detector in enumerate(self.detectors)]
        dispatcher.start()
        for worker in workers:
            worker.start()
        try:
            while True:
                batch = ordered.get()
                if batch is None:
                    break
                if isinstance(batch, BaseException):
                    raise batch
                batch.detected.wait()
                for job in batch.jobs:
                    if job._write is not None:
                        _settle_write(job)
                    yield job
                unfinished.popleft()  # the caller is done with each of its jobs: it asked for the next
                window.release()
        except BaseException:  # Ctrl-C, or the caller stopped: a served model's requests in flight are
            stop.set()  # abandoned (the pipelines take no batch after this), so the joins below do not
            for detector in self.detectors:  # wait for their timeouts
                getattr(detector, "cancel", lambda: None)()
            raise
        finally:
            stop.set()
            _drain(ordered, window)
            for _ in workers:
                ready.put(None)
            dispatcher.join(timeout=5)
            for worker in workers:
                worker.join(timeout=30)

    def written_when_stopped(self) -> list[FrameJob]:
        """After a run that stopped early, once ``close`` has let the writes under way finish (those not begun
        are cancelled): the jobs of the batches the caller had not finished with whose outputs were written, in
        input order; those it took already are among them (it counted them, or, stopped just then, may not have)."""
        written = []
        for batch in list(self._unfinished):  # list(): a C-level copy, whole even beside a dispatcher still running
            for job in batch.jobs:
                if job._write is not None:
                    _settle_write(job)
                if job.error is None and job.written is not None:
                    written.append(job)
        return written

    def close(self) -> None:
        self._readers.shutdown(wait=True, cancel_futures=True)
        if self._reader_pool is not None:
            self._reader_pool.pool.shutdown(wait=True, cancel_futures=True)
        self._writers.shutdown(wait=True, cancel_futures=True)
        if self._shared is not None:
            self._shared.close()

    def __enter__(self) -> FrameRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the threads --------------------------------------------------------------------------------

    def _dispatch(self, items: Iterable[object], names: Iterator[str] | None, ready: queue.Queue[_Batch | None],
                  ordered: queue.Queue[_Batch | BaseException | None], window: threading.BoundedSemaphore,
                  stop: threading.Event, unfinished: deque[_Batch]) -> None:
        """Cut the items into batches, start their reads, and hand them on in order."""
        try:
            jobs: list[FrameJob] = []
            index = 0
            for item in items:
                if item is BATCH_BREAK:
                    if jobs and not self._start_batch(jobs, ready, ordered, window, stop, unfinished):
                        return
                    jobs = []
                    continue
                source = next(names) if names is not None else frame_source(item, index)
                jobs.append(FrameJob(index, source, item))
                index += 1
                if len(jobs) == self.batch_size:
                    if not self._start_batch(jobs, ready, ordered, window, stop, unfinished):
                        return
                    jobs = []
            if jobs:
                self._start_batch(jobs, ready, ordered, window, stop, unfinished)
        except BaseException as exc:  # an iterator of items that fails ends the run with its error
            ordered.put(exc)
            return
        ordered.put(None)

    def _start_batch(self, jobs: list[FrameJob], ready: queue.Queue[_Batch | None],
                     ordered: queue.Queue[_Batch | BaseException | None], window: threading.BoundedSemaphore,
                     stop: threading.Event, unfinished: deque[_Batch]) -> bool:
        while not window.acquire(timeout=0.1):
            if stop.is_set():
                return False
        staging = self._free.get()
        staging.reset()
        batch = _Batch(jobs, staging)
        lost = next((why for why in (getattr(detector, "lost", None) for detector in self.detectors) if why), None)
        if lost is not None:  # a detector that can run no more frames (a server that is down): none is read
            for job in jobs:
                job.error = lost
            unfinished.append(batch)
            ordered.put(batch)
            ready.put(batch)
            return True
        with self._readers_lock:
            pool = self._reader_pool
        if pool is not None and self._shared is not None and self._shared.owns(staging) and all(
                isinstance(job.item, (str, os.PathLike)) for job in jobs):
            try:
                batch.reads = [pool.pool.submit(read_batch, self._shared.handle(staging), self._reader_data,
                                                [job.item for job in jobs])]
                batch.read_pool = pool.pool
            except (BrokenExecutor, RuntimeError) as exc:  # RuntimeError: shut down after another task failed
                self._read_in_threads(exc)
        if batch.read_pool is None:
            batch.reads = [self._readers.submit(self._read_job, job, staging) for job in jobs]
        unfinished.append(batch)
        ordered.put(batch)
        ready.put(batch)
        return True

    def _read_job(self, job: FrameJob, staging: StagingBuffer) -> None:
        job.points, job.start, job.error = read_into(self.read, job.item, staging)

    def _settle_reads(self, batch: _Batch) -> None:
        """Wait for the batch's reads. A reader process's outcomes become its jobs' points (rows of the shared
        staging), errors and notes; a task that failed as a whole (its process died) is read again here."""
        staging = batch.staging
        if batch.read_pool is None or staging is None:
            for read in batch.reads:
                read.result()
            return
        failure = _task_failure(batch.reads[0], batch.read_pool)
        if failure is not None:
            self._read_in_threads(failure)
            for job in batch.jobs:
                self._read_job(job, staging)
            return
        results: list[ProcessRead] = batch.reads[0].result()
        keep_notes = getattr(self.read, "keep_notes", None)
        for job, result in zip(batch.jobs, results):
            if result.notes is not None and keep_notes is not None:
                keep_notes(job.item, result.notes)
            job.error, job.start = result.error, result.start
            if result.error is None:
                if result.start is None:
                    job.points = result.own
                else:
                    job.points, job.times = _staged_rows(staging, result.start, result.rows)

    def _read_in_threads(self, exc: BaseException) -> None:
        """The rest of the run reads in threads (said once): a reader process died, or a task failed. Returns
        once no reader process is left to write into a staging buffer (every caller waits for the kill)."""
        with self._readers_lock:
            pool, self._reader_pool = self._reader_pool, None
            if pool is not None:
                pool.kill()
        if pool is not None and not self._stopping():
            self._notice(f"warning: a reader process failed ({one_line(exc)}); the run reads its frames in threads "
                         "from here")

    def _stopping(self) -> bool:
        """Whether the run is being stopped (Ctrl-C, SIGTERM), given a moment to say so: a SIGTERM to the
        process group ends the workers at once, and their pool's failure would otherwise be reported as
        one before the runner's own process has handled its signal."""
        return self._stop.wait(STOP_GRACE)

    def _pipeline_loop(self, detector: Any, ready: queue.Queue[_Batch | None], stop: threading.Event) -> None:
        while True:
            batch = ready.get()
            if batch is None:
                return
            try:
                self._settle_reads(batch)
                if stop.is_set():  # the run was stopped: the batches still queued are not detected
                    raise InputError("the run was stopped before this frame")
                self._detect(detector, batch)
            except BaseException as exc:  # noqa: BLE001 - a failed batch fails its frames, not the run
                for job in batch.jobs:
                    if job.error is None and job.detections is None:
                        job.error = one_line(exc)
            finally:
                if batch.staging is not None:
                    self._free.put(batch.staging)
                    batch.staging = None
                batch.detected.set()

    def _detect(self, detector: Any, batch: _Batch) -> None:
        jobs = [job for job in batch.jobs if job.points is not None]
        if jobs:
            pipeline = getattr(detector, "gpu_pipeline", None)
            found = self._run_gpu(pipeline, batch, jobs) if pipeline is not None else None
            if found is None:  # not on the GPU, or the batch failed there: frame by frame
                found = detect_each(detector, [whole_points(job) for job in jobs], lags_checked=self._lags_checked)
            for job, result in zip(jobs, found):
                if isinstance(result, BaseException):
                    job.error = one_line(result)
                else:
                    job.detections = result
        for job in jobs:
            if not self.keep_points or job.error is not None:
                job.points = job.times = None
            elif job.start is not None and job.points is not None:
                # the staging buffer is reused for the next batch (joined with the lags, the frame is a copy)
                job.points, job.times = (job.points.copy() if job.times is None else whole_points(job)), None
        write = self.write
        writing = [job for job in jobs if job.error is None] if write is not None else []
        if write is not None and writing:  # one task a batch: a hand-off costs the GIL more than a frame's write
            frames = [(job.source, job.detections, job.points) for job in writing]
            writers = self._writers
            try:
                task = writers.submit(_write_each, write, frames)
            except BrokenExecutor as exc:
                writers = self._threads_instead_of(writers, exc)
                task = writers.submit(_write_each, write, frames)
            for place, job in enumerate(writing):
                job._write = (task, place, writers)

    def _run_gpu(self, pipeline: Any, batch: _Batch, jobs: list[FrameJob]) -> list[Any] | None:
        """One pass of the pipeline over the batch from its staging buffer; None when it fails (or a larger
        buffer for a batch that did not fit cannot be had): the frames are then run one by one."""
        staging = batch.staging
        assert staging is not None
        try:
            if any(job.start is None for job in jobs):  # a frame that did not fit: restage the batch
                staging = batch.staging = self._restaged(staging, jobs)
            return list(pipeline.detect_staged(staging, [(len(job.points), job.start) for job in jobs]))  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - retried frame by frame, where each frame's own error shows
            return None

    def _threads_instead_of(self, broken: Executor, exc: BaseException) -> Executor:
        """Writer threads in place of a process pool that lost a process (said once)."""
        with self._writers_lock:
            replaced = self._writers is broken
            if replaced:
                self._writers = ThreadPoolExecutor(max_workers=self._writer_threads, thread_name_prefix="pp-write")
                if self._writer_processes is not None and broken is self._writer_processes.pool:
                    self._writer_processes.kill()
                else:
                    broken.shutdown(wait=False, cancel_futures=True)
            writers = self._writers
        if replaced and not self._stopping():
            self._notice(f"warning: a writer process died ({one_line(exc)}); the frames then in the writer "
                         "processes are not written, and the rest of the run writes in threads")
        return writers


    def _restaged(self, staging: StagingBuffer, jobs: list[FrameJob]) -> StagingBuffer:
        """``_restage_batch`` into shared memory when ``staging`` was (reader processes read later batches into it),
        else (or when shared memory has no room left) as ``staging`` was made; a shared one's files go."""
        if self._shared is None or not self._shared.owns(staging):
            bigger = _restage_batch(staging, jobs, self._alloc)
        else:
            try:
                bigger = _restage_batch(staging, jobs, self._shared)
            except OSError as exc:
                bigger = _restage_batch(staging, jobs, self._alloc)
                if not self._shared_memory_full:
                    self._shared_memory_full = True
                    self._notice(f"note: shared memory (/dev/shm) has no room for a larger staging buffer "
                                 f"({one_line(exc)}); it is made in this process, and the frames read into it are "
                                 "read in threads")
            self._shared.free(staging)
        self._say_ordinary_staging()
        return bigger

    def _say_ordinary_staging(self) -> None:
        """Say, once, that page-locked memory for the staging buffers ran out (``PageLockedOrOrdinary``)."""
        news = self._alloc.news() if self._alloc is not None else None
        if news is not None:
            self._notice(f"warning: {news}")


def _staged_rows(staging: StagingBuffer, start: int, count: int) -> tuple[np.ndarray, np.ndarray | None]:
    """A frame's rows in ``staging``, and its time lags where the buffer has them: views, not a frame joined
    (2.4 ms for 261,000 points, on the pipeline's thread, for a frame the GPU needs only the count of)."""
    times = None if staging.times is None else staging.times[start : start + count]
    return staging.points[start : start + count], times


def whole_points(job: FrameJob) -> np.ndarray:
    """``job``'s points as one (n, columns) array: its rows joined with its time lags where they lie apart."""
    assert job.points is not None
    return job.points if job.times is None else np.concatenate([job.points, job.times[:, None]], axis=1)


def _restage_batch(staging: StagingBuffer, jobs: list[FrameJob],
                   alloc: Callable[[tuple[int, ...], Any], np.ndarray] | None) -> StagingBuffer:
    """A staging buffer large enough for the whole batch, with every frame copied in (it replaces the
    old one in the pool, so later batches of this size read straight into it)."""
    total = sum(len(job.points) for job in jobs if job.points is not None)
    bigger = StagingBuffer(max(total + total // 2, staging.capacity), alloc, staging.columns)
    for job in jobs:
        assert job.points is not None
        count = len(job.points)
        start = bigger.allocate(count)
        assert start is not None
        bigger.put(start, whole_points(job))
        job.start = start
        job.points, job.times = _staged_rows(bigger, start, count)
    return bigger


def _write_each(write: Callable[[str, Any, np.ndarray | None], Any],
                frames: list[tuple[str, Any, np.ndarray | None]]) -> list[tuple[bool, Any]]:
    """A batch's writes, in a writer thread or process: (True, what ``write`` returned) or (False, (the
    frame's one line of error, the files of an earlier run it replaced)) each; ANY exception fails only its
    frame."""
    results: list[tuple[bool, Any]] = []
    for source, detections, points in frames:
        try:
            results.append((True, write(source, detections, points)))
        except BaseException as exc:  # noqa: BLE001 - a frame that cannot be written fails alone
            replaced = exc.replaced if isinstance(exc, OutputsReplacedError) else 0
            results.append((False, (one_line(exc), replaced)))
    return results


def _settle_write(job: FrameJob) -> None:
    """Wait for the frame's write (a Ctrl-C or SIGTERM while waiting ends the run, the write kept on the job for
    ``written_when_stopped``); a failed write, or a write task that failed as a whole (a writer process died),
    is this frame's error."""
    assert job._write is not None
    task, place, writers = job._write
    failure = _task_failure(task, writers)
    job._write = None
    if isinstance(failure, BrokenExecutor):
        job.error = f"not written: a writer process died ({one_line(failure)}); rerun with --skip-existing"
        return
    if failure is not None:
        job.error = one_line(failure)
        return
    written, value = task.result()[place]
    if written:
        job.written = value
    else:
        job.error, job.replaced = value


def _task_failure(task: Future[Any], pool: Executor) -> BaseException | None:
    """A worker pool's task's exception once it is done (its cancellation too); a task still pending in a
    pool that broke fails with the pool's error instead of waiting forever: a submit that raced the break
    is never completed (Python 3.10/3.11 mark a pool broken without the lock its submits take)."""
    while True:
        try:
            return task.exception(timeout=1.0)
        except CancelledError as exc:  # the pool was shut down with its pending tasks cancelled
            return exc
        except FutureTimeoutError:
            try:
                pool.submit(int)  # a no-op, refused once the pool is broken
            except BrokenExecutor as exc:
                if not task.done():
                    return exc
            except RuntimeError:  # shut down after the break: the task can no longer complete
                if not task.done():
                    return BrokenExecutor("the processes were shut down")


class WorkerProcesses:
    """Writer or reader processes for a runner, started ahead of it: spawning them and importing the
    package takes about a second, which belongs with the model's load, not with the first frames.
    ``warm`` (a module-level function: the write step, or ``read_batch``) is imported in each as it starts."""

    def __init__(self, count: int, warm: Callable[..., Any]) -> None:
        self.count = count
        self.pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_imported, initargs=(warm,))
        # a task each: all of them start. They start with Ctrl-C and SIGTERM blocked (a spawned process
        # inherits the mask), so one that comes while they import prints no traceback; here it waits for
        # the unblock, and the pool's threads, started meanwhile, never take one (the main thread does).
        # The resource tracker runs first: starting it unblocks both signals.
        resource_tracker.ensure_running()
        with stop_signals_blocked():
            self._first = [self.pool.submit(os.getpid) for _ in range(count)]
        self.failure: str | None = None  # why they could not start, once ``wait`` found out
        self.pids: set[int] = set()  # the processes' ids, once ``wait`` found them all started
        self._waited = False

    def wait(self, timeout: float = 120.0) -> bool:
        """Until every process has started: True, or False (the pool shut down, ``failure`` says why)
        when one could not start."""
        if not self._waited:
            self._waited = True
            try:
                started = {first.result(timeout) for first in self._first}
                deadline = time.monotonic() + timeout
                while len(started) < self.count and time.monotonic() < deadline:
                    time.sleep(0.01)
                    started.update(task.result(timeout)
                                   for task in [self.pool.submit(os.getpid) for _ in range(self.count)])
                if len(started) < self.count:
                    raise FutureTimeoutError(f"{len(started)} of {self.count} processes started in {timeout:g} s")
                self.pids = started
            except (BrokenExecutor, FutureTimeoutError, OSError) as exc:
                self.failure = one_line(exc)
                self.pool.shutdown(wait=False, cancel_futures=True)
        return self.failure is None

    def kill(self) -> None:
        """End the pool now: its processes killed and reaped first (no executor lock taken: a broken pool's
        manager thread holds one while it reaps them), then the pool shut down. When this returns no process
        of the pool is left to write (a reader into staging the runner reads again and reuses); one still
        in the kernel 10 s after its SIGKILL (an uninterruptible read) runs no more of its own code."""
        mine = [process for process in multiprocessing.active_children() if process.pid in self.pids]
        for process in mine:
            process.kill()
        for process in mine:
            process.join(10)
        self.pool.shutdown(wait=False, cancel_futures=True)


def _imported(warm: Callable[..., Any]) -> None:
    """Receiving ``warm`` imported what the tasks need. Ctrl-C reaches the whole process group: the runner's
    process handles it and shuts the pools down, so a worker ignores it (else each would print a traceback).
    SIGTERM keeps its default: a pool that lost a process ends the others with it, and waits for them under
    a lock of its own (on Python 3.12, a worker that ignored it deadlocked the run). A worker whose runner's
    process is gone (killed) ends itself: nothing else would, and the resource tracker removes the staging
    files only once no worker holds its pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    unblock_stop_signals()  # blocked since the start (``WorkerProcesses``)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), name="pp-parent-watch", daemon=True).start()


def _exit_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _drain(ordered: queue.Queue[Any], window: threading.BoundedSemaphore) -> None:
    """Release what a run stopped early still holds, so the dispatcher is never left waiting."""
    while True:
        try:
            item = ordered.get_nowait()
        except queue.Empty:
            return
        if isinstance(item, _Batch):
            try:
                window.release()
            except ValueError:
                return

