"""Detection over a whole data set on a Ray cluster (Ray Data), with the outputs of local ``infer``.

Frames (local files, folders and globs, or any URI Ray Data reads, e.g. ``s3://``) are handed in large
batches to a pool of actors. Each actor runs the streaming frame runner of local ``infer``
(``apps/frames.py``: reader threads into pinned staging, K GPU pipelines of batch B, writer threads)
over its detectors, built once in its ``__init__`` (a detector cannot be pickled, and building it
once per worker is what makes the GPU worth it). An actor takes two calls at a time, and both feed
one run of its runner (``apps/frame_stream.py``): its pipelines go on from one block to the next
while Ray returns the last block and hands it the next one. Local files are read by the actor's reader threads;
URIs are read by Ray Data in parallel. Per-frame files (JSON, KITTI, BEV pictures) are written by the
actors with infer's own writer (the paths must be on a file system every node sees) and flushed to
disk once per actor call; JSON Lines / Parquet rows come back to the driver, which writes them in
input order as local ``infer`` does. A bad frame becomes an error record and the job goes on; a
worker that dies is restarted and its batch retried by Ray (Ray Data's actor pools default to
max_restarts=-1 and max_task_retries=-1).
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import int_within
from ..devices import check_backend_runs_on
from ..errors import (
    USER_ERRORS, BackendError, CpuFallbackWarning, InputError, ModelDirError, SettingNotice, agree, counted,
    printable_text, safe_repr,
)
from ..file_reads import special_kind
from ..file_writes import PendingFlush, flush_to_disk, remove_stale_temp_files
from ..graph_io import MAX_BATCH
from ..model_dir import ModelDir
from ..pointcloud_io import checked_intensity_scale, require_point_dim
from ..runtime.backends import BACKENDS
from ..staging import likely_points_per_frame
from ..stop_signals import handled_chain, interrupt_behind
from .device_notice import cpu_fp16_note, cpu_tf32_note
from .frame_reads import read_batch
from .frame_stream import FrameStream
from .frames import FrameBytes, FrameReader, FrameRunner, WorkerProcesses
from .frame_paths import check_distinct_outputs, expand_frame_paths, missing_path
from .frame_report import FrameReport, FrameWarnings, frame_warnings, progress_bar
from .infer import MAX_PIPELINES, READ_PROCESSES, RESUME_HINT, WRITE_PROCESSES, WRITE_THREADS, keep_finished_rows, \
    say_finished_files
from .outputs import OUTPUT_FORMATS, ROW_FORMATS, FrameOutput, OutputPlan, RowParts, frame_row, \
    refuse_foreign_outputs, row_text, write_frame
from .run_settings import SETTINGS_FILE
from .run_size import OPTION_NAMES, RunSize, WorkerCalls, cut_note
from .uri_frames import check_one_file_system, is_uri, list_uri_frames, read_uri_frames
from ..runtime_options import RuntimeOptions, cpu_threads

if TYPE_CHECKING:
    from .frame_prep import Prepare

#: CPUs an actor reserves on a CPU-only node: a whole CPU each starves Ray Data's read tasks of cores.
ACTOR_CPUS_WITHOUT_GPU = 0.5
#: CPUs a GPU actor reserves.
ACTOR_CPUS_WITH_GPU = 1
#: Frames per actor call, as a multiple of the runner's batch x pipelines: for local files, whose
#: blocks carry only their paths, 32 (on an H200, 20,000 crops ran 3,017 frames/s from the actor's first
#: call on with 32, 2,656 with 8: each call costs the actor a flush and Ray a round trip); for URIs,
#: whose blocks carry the frames' bytes (0.3-2 MB each), 8.
BATCHES_PER_CALL = 32
BATCHES_PER_CALL_WITH_BYTES = 8
#: Frames per call of a CPU actor (rounded up to a multiple of its batch x pipelines): a CPU frame takes
#: ~1.4 s on one of two cores (a camera crop), so a call of 32 ran ~45 s before its rows reached the driver,
#: and a stop lost them all; each call's own cost (a flush, a round trip) is milliseconds.
FRAMES_PER_CALL_ON_CPU = 8
#: GPUs an actor takes by default: two actors a GPU, each its own process (interpreter lock, readers,
#: pipelines): on an H200 with 16 cores, 20,000 crops ran 3,746 and 4,206 frames/s from the actors'
#: first call on with two actors, 2,502 and 2,952 with one (the engine alone does ~5,000).
DEFAULT_GPUS_PER_WORKER = 0.5
#: Calls an actor runs at once: while one call's block goes back to Ray and the next comes, the other
#: keeps the actor's runner fed.
CALLS_PER_ACTOR = 2


@dataclass(frozen=True)
class DatasetSummary:
    """What ``detect_dataset`` did: frame and box counts, failures (source, message), wall time."""

    frames: int
    boxes: int
    seconds: float
    workers: int
    out: str
    failures: list[tuple[str, str]] = field(default_factory=list)
    working_seconds: float = 0.0  # from the actors' first call to the end: their start (model load) left out

    @property
    def frames_per_second(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    @property
    def working_frames_per_second(self) -> float:
        """Frames/s from the actors' first call on, as local ``infer`` counts its rate after the model's
        load (the overall rate when no actor call was timed)."""
        return self.frames / self.working_seconds if self.working_seconds > 0 else self.frames_per_second


#: Seconds a cluster address given as HOST:PORT has to accept a connection (Ray itself retries for minutes).
CONNECT_TIMEOUT = 10.0


def _check_reachable(address: str | None) -> None:
    """A ``HOST:PORT`` Ray address must accept a TCP connection: one clear error instead of Ray's
    minutes of retries. With no address or "auto", Ray joins RAY_ADDRESS when it is set: that value is
    checked in their place. What is then "auto", a ``ray://`` address or no address is left to Ray."""
    import socket

    named, unset = "--ray-address ", "leave --ray-address out"
    if address in (None, "auto") and os.environ.get("RAY_ADDRESS"):
        address, named, unset = os.environ["RAY_ADDRESS"], "RAY_ADDRESS=", "unset RAY_ADDRESS"
    if address is None or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, number = address.rpartition(":")
    if not number.isdigit():
        raise InputError(f"{named}{address!r}: expected auto or HOST:PORT; give one, or {unset}")
    try:
        socket.create_connection((host.strip("[]"), int(number)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise BackendError(f"{named}{printable_text(address)}: no Ray cluster answers there ({exc.strerror or exc}); "
                           f"start one (ray start --head) or {unset} for a local one") from None


def require_ray(ray_address: str | None = None) -> Any:
    """The ``ray`` module, with Ray Data importable, or one error saying what to install. Without
    ``ray_address`` the cluster is started here and serves this process alone: Ray is told to keep it on
    loopback instead of the host's network address, and to use token authentication, its default for a new
    cluster, which named explicitly spares each run Ray's warning line that it is on. Ray reads both when
    first imported: where the caller imported it already, they are left to it (set now, the cluster's
    processes would ask this driver for a token it was never given, and refuse it)."""
    # RAY_ADDRESS: Ray joins that cluster
    if ray_address is None and not os.environ.get("RAY_ADDRESS") and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    try:
        import ray
        import ray.data  # noqa: F401 - Ray without its data extra (pandas, pyarrow) fails here, not mid-run
    except ImportError:
        raise BackendError("infer --ray (Python: detect_dataset) needs Ray Data: pip install "
                           "'pointpillars-trt[ray]'") from None
    return ray


#: What ``detect_dataset`` takes as its frames: one path (str, bytes or path-like) or URI, or an iterable of them.
FrameSources = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
_SOURCES_EXPECTED = "a point file, folder, glob or URI, or a list of them (str or pathlib.Path)"


def detect_dataset(paths_or_uri: FrameSources, model: str | os.PathLike[str] | ModelDir,
                   out: str | os.PathLike[str], *,
                   workers: int | None = None, gpus_per_worker: float | None = None, batch_size: int | None = None,
                   pipelines: int | None = None, output_format: str = "json", calib: str | None = None,
                   image_shape: tuple[int, int] | None = None, keep_out_of_view: bool = False, viz: bool = False,
                   point_dim: int | None = None, intensity_scale: float | None = None, ray_address: str | None = None,
                   progress: bool = True, report: Callable[[OutputPlan, int], FrameReport] | None = None,
                   prepare: Prepare | None = None, runtime: RuntimeOptions | None = None) -> DatasetSummary:
    """Detect on every frame of ``paths_or_uri`` (a point file, folder, glob or URI, or a list of them: str or
    ``pathlib.Path``) with ``workers`` actors of ``gpus_per_worker`` GPUs each
    (default: 0.5 where the cluster has GPUs, two actors a GPU, else 0 = the CPU path), each
    running ``pipelines`` pipelines of ``batch_size`` frames (GPU default: infer's), both fitted to the frames to run
    as local infer's are (``actor_size``), and no more actors started than the calls those frames make
    (``WorkerCalls``): one of the three given that is cut is said once, as a ``SettingNotice`` (with ``report``,
    infer's ``note:`` line on stderr). ``model``: a model dir
    or a .pth checkpoint (exported into the cache), or the ``ModelDir`` a caller has opened already (as
    ``infer --ray`` has: a checkpoint is not read twice).

    ``ray_address``: None starts a local cluster (unless Ray is already initialised), "auto" or
    HOST:PORT joins one. Outputs go to ``out`` as ``infer --out --format F`` writes them: per-frame
    JSON / KITTI files (KITTI lines with ``calib`` or each frame's sibling calib/ folder,
    ``image_shape``, ``keep_out_of_view``; ``viz`` adds the BEV pictures), or JSON Lines / Parquet
    part files of one row per frame. ``report`` (given the output plan and the number of frames) makes the
    ``infer`` account that each frame is reported to, in input order, and closed at the end; it is called
    once the cluster's resources are checked and any URIs listed, just before the frames run (``infer --ray
    --retry-failed`` rewrites the part files there, so a refused run leaves them as they were). ``prepare(points,
    source)`` runs on each frame after it is read (``infer``'s camera-FOV crop).
    ``runtime``: how each actor's detectors run (as local ``infer`` runs them); device, CPU threads and
    batch are set per actor from the resources it gets. Its ``threads``: a CPU actor's ONNX Runtime threads
    (None: this process's OMP_NUM_THREADS, as a local detector takes it, else the cluster's CPUs shared among the
    actors); more than an actor's cores run as many as it has, said once (as a note). ``point_dim``: values a point in ``.bin`` frames
    (default: the model's point columns).

    URIs (``is_uri``) are listed by Ray Data once the cluster is up, and taken as infer takes a local folder
    (``list_uri_frames``): one that it cannot list is an InputError before any actor starts, and the frames of
    a run must be on one file system (``check_one_file_system``). A frame given twice, or two frames whose
    outputs are one file, is an InputError before any frame runs, as in local ``infer``; so are local paths none
    of which exists (one missing among others fails as its frame's error in the summary).
    """
    _check_arguments(batch_size, pipelines, intensity_scale)
    ray = require_ray(ray_address)

    if output_format not in OUTPUT_FORMATS:
        raise InputError(f"output_format {output_format!r}: expected one of {', '.join(OUTPUT_FORMATS)}")
    sources = _sources(paths_or_uri)
    if not sources:
        raise InputError("paths_or_uri: no frames given (a list of point files, folders, globs or URIs)")
    if all(not is_uri(source) and missing_path(source) for source in sources):  # no path gives a frame, as infer says
        others = len(sources) - 1
        raise InputError(f"paths_or_uri: no path gives a frame: {safe_repr(sources[0])} does not exist"
                         + (agree(others, " (nor does the other)", f" (nor do the {others} others)") if others else ""))
    check_one_file_system(sources)
    from ..detector import refuse_other_precision  # the detector's modules load with a run, not with the CLI
    from .serve.repository import resolve_model

    found = model if isinstance(model, ModelDir) else resolve_model(model)
    target = Path(out)
    plan = OutputPlan(json_dir=target if output_format == "json" else None,
                      kitti_dir=target if output_format == "kitti" else None, png_dir=target if viz else None,
                      calib_dir=calib, image_shape=image_shape, keep_out_of_view=keep_out_of_view,
                      point_range=tuple(found.cfg.voxel.point_range))
    if point_dim is None:  # the model's own point columns
        point_dim = found.cfg.num_point_columns
    require_point_dim(point_dim, found.cfg.num_point_columns)  # here, not as every frame's error in the workers
    uris = any(is_uri(s) for s in sources)
    plan = replace(plan, local_frames=not uris)
    if not uris:  # else checked once Ray Data has listed them
        check_distinct_outputs(sources, plan.suffixes)
        refuse_foreign_outputs(target, sources, plan.suffixes)
    runtime = runtime or RuntimeOptions()
    runtime = replace(runtime, thresholds=runtime.thresholds.filled_from(found.cfg))  # the workers reopen it by path
    refuse_other_precision(found, runtime.precision)  # as each worker would refuse it, before the cluster starts
    if runtime.device == "cpu":  # before the cluster starts; else once its GPUs say where the workers run
        check_worker_backend(found, runtime.backend, "cpu")
    options = {"plan": plan, "point_dim": point_dim, "intensity_scale": intensity_scale, "prepare": prepare,
               "points_per_frame": likely_points_per_frame(sources, point_dim),
               "rows": output_format in ROW_FORMATS, "cwd": os.getcwd(), "runtime": runtime}
    started = not ray.is_initialized()
    # a cluster of this machine alone, started for the run: its workers' pids are this machine's, and shut down
    # with it (a joined cluster's workers may run elsewhere, or on after the stop)
    local = started and ray_address is None and not os.environ.get("RAY_ADDRESS")
    if started:
        _check_reachable(ray_address)
        _init_keeping_sigterm(ray, ray_address)
    stopped: list[Callable[[bool, bool], None]] = []  # on a stop, what is said once the workers are stopped
    ended: BaseException | None = None  # the stop or error the run ended with
    try:
        return _run(ray, sources, uris, found, target, output_format, options, workers=workers, gpus_per_worker=gpus_per_worker, batch_size=batch_size, pipelines=pipelines,
                    progress=progress, make_report=report, on_stop=stopped)
    except BaseException as exc:
        ended = exc
        raise
    finally:
        if started:
            _release_ray_objects(ended)
            ended = None
            ray.shutdown()  # the workers with it: what they wrote is then all there is
        for say in stopped:
            say(started, local)


#: The name Ray Data gives the threads that run a dataset's iteration (they fetch and format its blocks).
RAY_DATA_ITERATION_THREAD = "iter_threaded"


def _release_ray_objects(ended: BaseException | None) -> None:
    """Before ``ray.shutdown()``, Ray's objects in this process let go while Ray is up: afterwards a call into
    Ray (an object reference freed, a finalizer of Ray Data's) ends the process at once with exit code 1 and no
    stop line. The frames that ``ended``'s tracebacks hold (a stop raised inside Ray Data's iteration keeps its
    objects, its threads unstopped) are cleared, reference cycles collected, and the iteration's threads, told
    to stop by then, waited for (2 s at most)."""
    for error in handled_chain(ended):
        traceback.clear_frames(error.__traceback__)
    gc.collect()
    deadline = time.monotonic() + 2.0
    for thread in threading.enumerate():
        if thread.name == RAY_DATA_ITERATION_THREAD:
            thread.join(max(0.0, deadline - time.monotonic()))


def _init_keeping_sigterm(ray: Any, ray_address: str | None) -> None:
    """``ray.init``, then the caller's SIGTERM handler back: Ray's own dumps the driver's stacks and exits
    with 15, where the CLI stops the run as on Ctrl-C (outputs so far complete, exit code 143). A SIGTERM
    while the cluster starts (Ray's handler then exits the start) is handed to the caller's handler too,
    once the part started is shut down."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError:  # no cluster to join: Ray's message names its own CLI's flag
        address = ray_address if ray_address is not None else os.environ.get("RAY_ADDRESS", "")
        shown = printable_text(address)  # as the message names it: one line whatever was given
        named, unset = (f"--ray-address {shown}", "leave --ray-address out") if ray_address is not None else \
            (f"RAY_ADDRESS={shown}", "unset RAY_ADDRESS")
        where = "on this machine " if address == "auto" else ""
        raise BackendError(f"{named}: Ray found no running cluster {where}to join: start one (ray start --head), "
                           f"give its address, or {unset} for a local one") from None
    except SystemExit as exc:
        if not callable(previous) or exc.code != signal.SIGTERM:
            raise
        ray.shutdown()
        previous(signal.SIGTERM, None)  # the CLI's raises its stop
        raise  # a handler that returned: Ray's exit stands
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def cluster_messages_on_stderr() -> contextlib.AbstractContextManager[object]:
    """While it is open, what Ray's driver prints of its cluster ("(raylet) A worker died or was killed ...", a
    task retried) goes to stderr, as infer's other notes do: Ray prints those to stdout, where a script
    reading infer's summary line would find them first."""
    return contextlib.redirect_stdout(sys.stderr)


class _DropProgressBarNotice(logging.Filter):
    """Ray Data's notice that its progress bars are off: infer turns them off for its own bar."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Progress bars disabled" not in record.getMessage()


def _quiet_ray_data() -> None:
    """Ray Data's per-dataset INFO lines (execution start, plan, finish) stay in its log folder; its
    warnings and errors still reach stderr."""
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    progress = logging.getLogger("ray.data._internal.progress")  # where that notice is logged
    if not any(isinstance(f, _DropProgressBarNotice) for f in progress.filters):
        progress.addFilter(_DropProgressBarNotice())


def _check_arguments(batch_size: object, pipelines: object, intensity_scale: object) -> None:
    """The numbers ``detect_dataset`` hands every worker, checked before any starts (each would fail every
    frame alike, or run with a batch of 0)."""
    for name, value, high in (("batch_size", batch_size, MAX_BATCH), ("pipelines", pipelines, MAX_PIPELINES)):
        if value is not None and int_within(value, 1, high) is None:
            raise InputError(f"{name} {safe_repr(value)}: expected an integer in 1..{high} or None")
    if intensity_scale is not None:
        checked_intensity_scale(intensity_scale)


def _sources(paths_or_uri: FrameSources) -> list[str]:
    """Inputs in order: local folders and globs expand as in ``infer``; URIs go to Ray Data as they are,
    and so does a local path that does not exist (among local files it fails as that frame's error in the
    summary; beside URIs, Ray Data's listing refuses it), or that is a FIFO, a device or a socket (its read
    fails as that frame's error, as local infer's read of one in a folder: ``infer --ray`` hands the frames
    of its folders here one by one). A ``pathlib.Path`` is its path; what is no path (None, a number, a
    mapping, whose keys would be taken) is an InputError naming it, not Python's TypeError from deep inside."""
    if isinstance(paths_or_uri, (str, bytes, os.PathLike)):
        items: list[object] = [paths_or_uri]
    elif isinstance(paths_or_uri, Mapping) or not isinstance(paths_or_uri, Iterable):
        raise InputError(f"paths_or_uri: expected {_SOURCES_EXPECTED}; got {safe_repr(paths_or_uri)} "
                         f"({type(paths_or_uri).__name__})")
    else:
        items = list(paths_or_uri)
    paths: list[str] = []
    for index, given in enumerate(items):
        if not isinstance(given, (str, bytes, os.PathLike)):
            raise InputError(f"paths_or_uri: item {index} is {safe_repr(given)} ({type(given).__name__}), not a "
                             f"path; expected {_SOURCES_EXPECTED}")
        paths.append(os.fsdecode(given))
    # one expansion of them all: its note of the files left out for their format is said once a run, as in infer
    return expand_frame_paths(paths, as_given=lambda item: is_uri(item) or missing_path(item)
                              or special_kind(item) is not None)


def check_resources(resources: dict[str, float], workers: int | None, gpus_per_worker: float | None,
                    device: str = "auto") -> tuple[int, float]:
    """(workers, GPUs a worker) the cluster can run at once for ``device`` (auto, cpu or cuda); one clear
    error instead of the actor pool waiting forever for GPUs (or a GPU actor's CPU) the cluster does not
    have, or of an explicit cuda device run on the CPU."""
    gpus, cpus = float(resources.get("GPU", 0)), int(resources.get("CPU", 1))
    if device.startswith("cuda:"):
        raise InputError(f"--device {device}: Ray gives each worker its own GPUs; pass --device cuda")
    if device == "cpu" and gpus_per_worker:
        raise InputError(f"--device cpu with --gpus-per-worker {gpus_per_worker:g}: drop one of them")
    if device == "cuda" and gpus == 0:
        raise InputError("--device cuda: the Ray cluster has no GPUs; pass --device cpu (or auto) for the CPU path")
    if device == "cuda" and gpus_per_worker == 0:
        raise InputError("--device cuda with --gpus-per-worker 0: drop one of them")
    if gpus_per_worker is None:
        gpus_per_worker = DEFAULT_GPUS_PER_WORKER if gpus > 0 and device != "cpu" else 0.0
    if gpus_per_worker < 0:
        raise InputError(f"gpus_per_worker {gpus_per_worker}: expected 0 (CPU), a fraction or a whole number")
    if gpus_per_worker > gpus + 1e-9:
        raise InputError(f"--gpus-per-worker {gpus_per_worker:g}: the Ray cluster has {counted(gpus, 'GPU')}; give "
                         + ("--gpus-per-worker 0 for the CPU path" if gpus == 0 else f"at most {gpus:g}"))
    if workers is None:
        workers = min(int(gpus / gpus_per_worker), max(1, cpus // ACTOR_CPUS_WITH_GPU)) if gpus_per_worker \
            else max(1, cpus // 2)
    if workers < 1:
        raise InputError(f"workers {workers}: expected >= 1 (the cluster has {counted(gpus, 'GPU')})")
    need = agree(workers, "needs", "need")
    if gpus_per_worker > 0 and workers * gpus_per_worker > gpus + 1e-9:
        raise InputError(f"{counted(workers, 'worker')} x {gpus_per_worker:g} GPU {need} "
                         f"{counted(workers * gpus_per_worker, 'GPU')}; the Ray cluster has {gpus:g}: lower --workers "
                         "or --gpus-per-worker, or --gpus-per-worker 0 for the CPU path")
    if gpus_per_worker > 0 and workers * ACTOR_CPUS_WITH_GPU > cpus:
        raise InputError(f"{counted(workers, 'GPU worker')} {need} {counted(workers * ACTOR_CPUS_WITH_GPU, 'CPU')}; "
                         f"the Ray cluster has {cpus}: lower --workers")
    return workers, gpus_per_worker


def check_worker_backend(model: ModelDir, backend: str, kind: str) -> None:
    """What a worker on ``kind`` ("cpu" or "cuda") would refuse of ``backend`` as it opens ``model``, as local infer
    refuses it, refused before any worker starts (a worker's refusal came back as Ray's traceback, from every
    worker): a GPU-only engine for workers on the CPU, or TensorRT plans the model dir does not hold (the export
    of a checkpoint has none: plans are built on and for the GPU that runs them, which the driver need not have)."""
    check_backend_runs_on(kind, backend)
    row = BACKENDS.get(backend)
    if kind == "cuda" and row is not None and row.artefact == "plan" and not model.has_plans():
        raise ModelDirError(f"--backend {backend}: the workers run the TensorRT plans of --model, and "
                            f"{safe_repr(str(model.path))} holds none (a checkpoint is exported without them): build "
                            "a model dir with plans on a machine with the workers' kind of GPU, `pointpillars-trt "
                            "build --checkpoint CKPT --backend tensorrt --out DIR`, and pass --model DIR, or drop "
                            "--backend (auto runs its ONNX graphs)")


def _threads_asked(threads: int | None, cli: bool) -> tuple[int | None, str | None]:
    """The ONNX Runtime threads each CPU worker's pipelines are asked for, as a local detector takes them: ``threads``
    (infer's --threads, ``cli``, or the runtime options' field), else this process's OMP_NUM_THREADS; with how the
    workers' note names them. (None, None): neither, and the workers share the cluster's CPUs."""
    count, named, left_out = cpu_threads(threads, "--threads " if cli else "threads=", cap=False)
    if left_out is not None:
        warnings.warn(left_out, SettingNotice, stacklevel=4)
    return count, named


def worker_pipeline_threads(cluster_cpus: float, workers: int, pipelines: int) -> int:
    """The ONNX Runtime threads of each pipeline of a CPU worker none were asked for: the worker's share of the
    cluster's CPUs split among its pipelines, as local infer splits its cores (each taking the whole share, the
    pipelines contended for it)."""
    return max(1, int(cluster_cpus) // workers // pipelines)


def frames_per_call(batch_frames: int, on_gpu: bool, uris: bool) -> int:
    """Frames an actor call gets, for actors that run ``batch_frames`` frames at once (batch x pipelines)."""
    if not on_gpu:
        return batch_frames * max(1, -(-FRAMES_PER_CALL_ON_CPU // batch_frames))
    return batch_frames * (BATCHES_PER_CALL_WITH_BYTES if uris else BATCHES_PER_CALL)


def actor_size(batch_size: int | None, pipelines: int | None, on_gpu: bool, frames: int) -> RunSize:
    """Each actor's pipelines and batch for a run of ``frames`` frames (default: infer's), fitted as local infer fits
    its own: to all the frames, not to a worker's share (about ceil(frames / workers)). A size the fit cuts still
    covers the frames (its batches x pipelines are at least as many), and an actor call takes a multiple of that
    (``frames_per_call``), so such a run is one call, for which one actor alone starts (``WorkerCalls``); and Ray
    Data hands each call to whichever actor is free, so the first one up may take a run's every call (two at once,
    then the next). Fitted to a share, that actor would run every frame on the pipelines of a share."""
    return RunSize.given(batch_size, pipelines, on_gpu).fitted(frames)


def _run(ray: Any, sources: list[str], uris: bool, model: ModelDir, out: Path, output_format: str,
         options: dict[str, Any], *, workers: int | None, gpus_per_worker: float | None,
         batch_size: int | None, pipelines: int | None, progress: bool,
         make_report: Callable[[OutputPlan, int], FrameReport] | None,
         on_stop: list[Callable[[bool, bool], None]]) -> DatasetSummary:
    from ray.data import ActorPoolStrategy, DataContext

    _quiet_ray_data()

    device = options["runtime"].device
    resources = ray.cluster_resources()
    most, gpus_per_worker = check_resources(resources, workers, gpus_per_worker, device)
    on_gpu = gpus_per_worker > 0
    if on_gpu or device != "cpu":  # device cpu: checked before the cluster started
        check_worker_backend(model, options["runtime"].backend, "cuda" if on_gpu else "cpu")
    model_dir, classes = str(model.path.resolve()), model.cfg.classes
    fallback = device == "auto" and not resources.get("GPU")
    context = DataContext.get_current()
    context.execution_options.preserve_order = True  # rows in input order
    context.enable_progress_bars = False              # one bar below, in frames/s
    start = time.perf_counter()
    if uris:  # listed here: a URI Ray Data cannot read is refused before anything is said or runs
        listed = list_uri_frames(ray, sources, options["point_dim"])
        frames = listed.names + [name for name, _ in listed.refused]
        check_distinct_outputs(frames, options["plan"].suffixes, reserved=[SETTINGS_FILE])
        refuse_foreign_outputs(out, frames, options["plan"].suffixes)
        # read in Ray Data's tasks, each frame's failure its own error
        dataset = ray.data.from_items([{"path": name, "read": read, "size": size}
                                       for name, read, size in zip(listed.names, listed.reads, listed.sizes)])
        dataset = dataset.map_batches(read_uri_frames, batch_format="numpy",
                                      fn_kwargs={"filesystem": listed.filesystem, "point_dim": options["point_dim"]})
        refused = listed.refused
        to_run = len(listed.names)
    else:  # local files: each actor's reader threads read them into its pinned staging
        frames = sources
        to_run = len(sources)
        # as bytes: Arrow holds a name that is no UTF-8 in a binary column (in a string column, Ray Data warned and
        # pickled the column)
        dataset = ray.data.from_items([{"path": os.fsencode(s)} for s in sources])
        refused = []
    size = actor_size(batch_size, pipelines, on_gpu, to_run)
    batch, pipes = size.batch, size.pipelines
    per_call = frames_per_call(batch * pipes, on_gpu, uris)
    calls = WorkerCalls(most, per_call).fitted(to_run)  # a worker beyond the run's calls would start for nothing
    pool = calls.workers
    cli = make_report is not None
    cut = cut_note(batch_size, pipelines, size, to_run,
                   OPTION_NAMES if cli else ("batch_size=", "pipelines=", "workers="), workers, calls)
    where = (f"running on Ray: {counted(pool, 'worker')}, {gpus_per_worker:g} GPU each" if on_gpu else
             f"running on Ray: {counted(pool, 'worker')} on the CPU" + (" (the Ray cluster has no GPUs)" if fallback else ""))
    # capped by each actor to its own cores, which this machine's need not be
    asked, named = (None, None) if on_gpu else _threads_asked(options["runtime"].threads, cli)
    threads = None if on_gpu else asked or worker_pipeline_threads(resources.get("CPU", 1), pool, pipes)
    hint = RESUME_HINT if make_report is not None and not uris else None
    # the frames' outputs there before the run: a stop counts those the run wrote, not an earlier run's
    before = {} if options["rows"] else _outputs_in(out, frames, options["plan"].suffixes)
    report: FrameReport | None = None
    rows: RowParts | None = None
    failures = list(refused)  # point files of a file:// folder that Ray Data cannot read (a FIFO): failed first
    done, boxes = len(refused), 0
    first_call = float("inf")  # wall clock (the actors' and this process's) when an actor's first call began
    settings_said: set[str] = set()  # the kinds of SETTING_NOTES said to the Python API's caller
    try:  # from here on, a stop says what it kept
        if make_report is not None:  # where the frames run said first, as local infer says its device
            print(where, file=sys.stderr, flush=True)
            fp16_note = cpu_fp16_note("cuda" if on_gpu else "cpu", model.precision)  # as local infer says them
            if fp16_note is not None:
                print(fp16_note, file=sys.stderr, flush=True)
            tf32_note = cpu_tf32_note("cuda" if on_gpu else "cpu", options["runtime"])
            if tf32_note is not None:
                print(tf32_note, file=sys.stderr, flush=True)
            if cut is not None:
                print(f"note: {cut}", file=sys.stderr, flush=True)
            report = make_report(options["plan"], len(frames))
        else:
            if fallback:  # the Python API's CPU fallback, said as the detector says its own
                warnings.warn(f"device auto: {where}", CpuFallbackWarning, stacklevel=3)
            if cut is not None:  # as the workers' SETTING_NOTES are said to the Python API's caller
                warnings.warn(cut, SettingNotice, stacklevel=3)
        warned = FrameWarnings(report.note) if report is not None else None
        out.mkdir(parents=True, exist_ok=True)
        dataset = dataset.map_batches(
            _DetectActor, batch_size=per_call, batch_format="numpy",
            compute=ActorPoolStrategy(size=pool, max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
                                      enable_true_multi_threading=True),
            fn_constructor_kwargs={"model_dir": model_dir, "batch": batch, "pipelines": pipes, "local_files": not uris,
                                   **options,
                                   "threads_asked": named,
                                   "runtime": replace(options["runtime"], device="cuda" if on_gpu else "cpu",
                                                      max_batch=batch, threads=threads)},
            num_gpus=gpus_per_worker if on_gpu else None,
            num_cpus=ACTOR_CPUS_WITH_GPU if on_gpu else ACTOR_CPUS_WITHOUT_GPU)
        rows = RowParts(out, output_format, classes) if options["rows"] else None
        for source, error in refused:
            if rows is not None:
                rows.add(row_text(frame_row(source, None, error, classes, local=False,
                                            velocity=model.cfg.box_code.velocity)))
            if report is not None:
                report.fail(source, error)
        # on a stop, the records' iteration is closed first: Ray Data's executor then ends before ray.shutdown(), where
        # a thread of it that touched Ray afterwards ended the process (exit code 1, no stop line)
        with progress_bar(len(frames), progress and report is None, desc="ray") as bar, \
                contextlib.closing(_records(dataset)) as records:
            bar.update(len(refused))
            for record in records:
                done += 1
                first_call = min(first_call, record["call_started"])
                source, error = record["source"], record["error"]
                if rows is not None:  # kept before its warnings are said: a stop right after them keeps it
                    rows.add(record["row"])
                if not error:  # counted before its warnings are said, as its row is kept
                    boxes += record["num_boxes"]
                    if report is not None:
                        report.written(source, FrameOutput(record["num_boxes"], record["num_nonfinite_dropped"],
                                                           record["num_out_of_view"]))
                if warned is not None:
                    warned.add(record["warnings"], source)
                else:  # the Python API's caller: a notice, as the detector's own thread cap
                    for kind, text in record["warnings"]:
                        if kind in SETTING_NOTES and kind not in settings_said:
                            settings_said.add(kind)
                            warnings.warn(text.removeprefix("note: "), SettingNotice, stacklevel=3)
                if error:
                    failures.append((source, error))
                    if report is not None:
                        report.fail(source, error, record["replaced"])
                bar.update(1)
    except BaseException as exc:  # Ctrl-C or SIGTERM: the rows received are kept, as local infer keeps them
        if not isinstance(exc, KeyboardInterrupt) and interrupt_behind(exc) is None:
            raise  # an error of its own, not a stop that landed inside Ray's code
        note = report.note if report is not None else _say
        if options["rows"]:
            _keep_rows(rows, note, hint, per_call)
        else:  # the workers write the files: counted on disk once they are stopped
            on_stop.append(partial(_say_outputs_on_disk, out, frames, options["plan"].suffixes, before, note, hint))
        raise
    if rows is not None:
        rows.close()
        flush_to_disk(rows.files)
    remove_stale_temp_files(out)  # of a writer process that died mid-write
    if warned is not None:
        warned.close()
    if report is not None:
        report.close()
    seconds = time.perf_counter() - start
    # the actors' clocks against this one's: a skewed node cannot make the run look longer or negative
    working = min(max(time.time() - first_call, 0.0), seconds) if done else 0.0
    return DatasetSummary(done, boxes, seconds, pool, str(out), failures, working)


def _keep_rows(rows: RowParts | None, note: Callable[[str], None], hint: str | None, per_call: int) -> None:
    """On a stop of a JSON Lines / Parquet run: the rows received kept and said, as local infer keeps them;
    when none had come (a worker sends a call's rows at its end; ``rows`` None: the stop came first), that
    said, not nothing."""
    if rows is not None and (rows.rows or rows.files):
        keep_finished_rows(rows, PendingFlush(), note, hint)
        return
    note(f"stopped before any frame's row reached this driver (each worker sends its rows {counted(per_call, 'frame')} "
         "at a time): no row was kept" + (f"; {hint}" if hint else ""))


def _outputs_in(out: Path, frames: Sequence[str], suffixes: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each output file of ``frames`` (``<stem><suffix>``) now in ``out``: one listing, and a
    stat of those found."""
    wanted = {Path(frame).stem + suffix for frame in frames for suffix in suffixes}
    found: dict[str, tuple[int, int]] = {}
    try:
        with os.scandir(out) as entries:
            for entry in entries:
                if entry.name in wanted:
                    with contextlib.suppress(OSError):
                        info = entry.stat()
                        found[entry.name] = (info.st_ino, info.st_mtime_ns)
    except OSError:
        pass
    return found


def _say_outputs_on_disk(out: Path, frames: Sequence[str], suffixes: Sequence[str],
                         before: dict[str, tuple[int, int]], note: Callable[[str], None], hint: str | None,
                         workers_stopped: bool, local: bool) -> None:
    """On a stop of a JSON / KITTI run: the frames whose output files the run wrote (each there, and not as
    ``before`` found it: the atomic writer's rename gives a file a new inode) counted on disk, flushed to it and
    said. The driver hears of a frame only with its call's block, so its own account would miss those the
    workers wrote since. ``workers_stopped``: False where this run did not start the Ray session, whose
    workers may still write the frames they hold. ``local``: they ran on a cluster of this machine that the run
    started, and are stopped: the temp files of the writes the stop cut short are removed (a pid of a worker on
    another host says nothing here, and a worker still writing has its temp file in use: a later run into
    ``out`` removes them)."""
    if workers_stopped and local:
        remove_stale_temp_files(out)
    now = _outputs_in(out, frames, suffixes)
    written = [[Path(frame).stem + suffix for suffix in suffixes] for frame in frames]
    done = [names for names in written if all(name in now and now[name] != before.get(name) for name in names)]
    more = "" if workers_stopped else " so far (the Ray session's workers may still write the frames they hold)"
    tail = more + (f"; {hint}" if hint else "")
    if not done:
        note(f"stopped before any frame's outputs were written to {safe_repr(str(out))}{tail}")
        return
    to_flush = PendingFlush()
    to_flush.add(out / name for names in done for name in names)
    say_finished_files(len(done), out, to_flush, note, tail)


def _say(text: str) -> None:
    """A line on stderr, for a ``detect_dataset`` caller without an ``infer`` account."""
    print(text, file=sys.stderr, flush=True)


#: The kinds of the notes an actor adds to its first frame's warnings, each said once a run: it runs fewer CPU
#: threads than asked (its cores); its pipelines' threads asked contend for its cores.
THREADS_CAPPED = "threads"
THREADS_CONTEND = "pipeline threads"
SETTING_NOTES = (THREADS_CAPPED, THREADS_CONTEND)

#: The per-frame columns an actor returns to the driver (``replaced``: the files of an earlier run a failed frame's
#: write had replaced; ``call_started``: the wall clock when the actor's call began, for the rate without the
#: actors' start; ``refusal``: ``_DetectActor.refusal``).
_COLUMNS = ("source", "error", "replaced", "num_boxes", "num_nonfinite_dropped", "num_out_of_view", "warnings", "row",
            "call_started", "refusal")


def _records(dataset: Any) -> Generator[dict[str, Any], None, None]:
    """Each frame's record; closed, it shuts Ray Data's executor down at once (its iterator closed, not left to
    the garbage collector)."""
    batches = iter(dataset.iter_batches(batch_size=None, batch_format="numpy"))  # each block as it comes, not 256 rows
    try:
        for batch in batches:
            for values in zip(*(batch[key] for key in _COLUMNS)):
                record = dict(zip(_COLUMNS, values))
                if record["refusal"]:  # a worker refused the model: the run stops on its error
                    raise pickle.loads(base64.b64decode(str(record["refusal"])))
                error = record["error"]  # a column of None and str arrives with NaN for None
                yield {"source": str(record["source"]), "error": error if isinstance(error, str) and error else None,
                       "replaced": int(record["replaced"]), "num_boxes": int(record["num_boxes"]),
                       "num_nonfinite_dropped": int(record["num_nonfinite_dropped"]),
                       "num_out_of_view": int(record["num_out_of_view"]),
                       "warnings": [tuple(pair) for pair in json.loads(str(record["warnings"]))],
                       "row": str(record["row"]), "call_started": float(record["call_started"])}
    finally:
        close = getattr(batches, "close", None)  # Ray 2.60 iterates by a generator: another Ray, maybe not
        if close is not None:
            close()


class _DetectActor:
    """K detectors and one streaming frame runner per actor, whose one run its calls feed (two at a
    time); a batch of rows {path[, bytes]} in, one record per frame out (its outputs written as local
    infer writes them, or its row)."""

    def __init__(self, model_dir: str, runtime: RuntimeOptions, batch: int, pipelines: int,
                 plan: OutputPlan, point_dim: int, intensity_scale: float | None, rows: bool, cwd: str,
                 prepare: Prepare | None = None, points_per_frame: int | None = None, local_files: bool = True,
                 threads_asked: str | None = None) -> None:
        from ..detector import PointPillars
        from ..runtime_options import capped_threads, pipeline_threads

        #: the notes for the driver, with this actor's first frame: threads asked for beyond its cores (the
        #: default share of the cluster's CPUs, ``threads_asked`` None, is capped without one), and its
        #: pipelines' threads asked that contend for them
        self._capped: list[tuple[str, str]] = []
        if runtime.threads is not None and runtime.device == "cpu":
            count, note = capped_threads(runtime.threads, threads_asked or f"threads={runtime.threads}")
            if note is not None and threads_asked:
                self._capped = [(THREADS_CAPPED, f"note: {note}")]
            if threads_asked:  # each pipeline's count, as local infer's --threads: said where they contend
                _, crowded = pipeline_threads(pipelines, count, threads_asked)
                if crowded is not None:
                    self._capped.append((THREADS_CONTEND, f"note: {crowded}"))
            runtime = replace(runtime, threads=count)

        if os.path.isdir(cwd):  # the driver's relative paths (frames, --out, --calib) mean the same here
            os.chdir(cwd)
        else:
            plan = _absolute(plan)
        # writer and reader processes (started while the detectors open) take the writes and the reads of
        # local files off the pipelines' GIL
        on_gpu = runtime.device != "cpu"
        writers = WorkerProcesses(WRITE_PROCESSES, write_frame) if on_gpu else None
        readers = WorkerProcesses(READ_PROCESSES, read_batch) if on_gpu and local_files else None  # URIs: bytes
        #: why this actor refused the model as it opened it (its pickled exception, base64): every call answers
        #: with it, and the driver raises it, as local infer would have (raised here, it came back as Ray's
        #: traceback of a dead actor, from every worker)
        self.refusal = ""
        try:
            self.detectors = [PointPillars.from_model_dir(model_dir, options=runtime) for _ in range(pipelines)]
            for detector in self.detectors:
                detector.warm_up([batch] if detector.device == "cuda" else [1], points_per_frame)
        except BaseException as exc:
            for processes in (writers, readers):
                if processes is not None:
                    processes.pool.shutdown(wait=False, cancel_futures=True)
            if not isinstance(exc, USER_ERRORS):
                raise
            self.refusal = base64.b64encode(pickle.dumps(exc)).decode("ascii")
            return
        self.classes = self.detectors[0].cfg.classes
        self.velocity = self.detectors[0].cfg.box_code.velocity  # a failed frame's row holds none, as an empty frame's
        self.rows = rows  # the driver writes JSON Lines / Parquet rows: a failed frame's row is made here too
        self.local_frames = plan.local_frames
        self.read = FrameReader(self.detectors[0].cfg, point_dim=point_dim, intensity_scale=intensity_scale,
                                prepare=prepare)
        self.point_range = plan.point_range  # for the frames' warnings, said by the driver
        write = partial(write_frame, plan=plan, row_classes=self.classes if rows else None)
        self.runner = FrameRunner(self.detectors, batch_size=batch, read=self.read, write=write,
                                  writers=WRITE_THREADS, writer_processes=writers, keep_points=plan.png_dir is not None,
                                  points_per_frame=points_per_frame, reader_processes=readers)
        self.stream = FrameStream(self.runner)

    def _failed_row(self, job: Any) -> str:
        """A failed frame's row for a row-format run; nothing ("") when the run writes files, whose
        driver never reads rows (building one for every frame cost ~120 us of the actor's GIL)."""
        if not self.rows:
            return ""
        return row_text(frame_row(job.source, None, job.error, self.classes, local=self.local_frames,
                                  velocity=self.velocity))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        started = time.time()
        paths = [os.fsdecode(path) for path in batch["path"]]  # local files' as bytes
        if self.refusal:
            return {key: [self.refusal if key == "refusal" else "" for _ in paths] for key in _COLUMNS}
        items: list[object] = ([FrameBytes(path, bytes(data), str(error))
                                for path, data, error in zip(paths, batch["bytes"], batch["error"])]
                               if "bytes" in batch else list(paths))
        columns: dict[str, list[Any]] = {key: [] for key in _COLUMNS}
        files: list[str] = []
        for job in self.stream.run(items, paths):
            written, row = job.written if job.error is None else (FrameOutput(), None)
            if job.error is None:
                files.extend(written.files)
            found, self._capped = self._capped + frame_warnings(job, self.read, self.point_range), []
            record = {"source": job.source, "error": job.error, "replaced": job.replaced, "num_boxes": written.boxes,
                      "num_nonfinite_dropped": written.nonfinite, "num_out_of_view": written.out_of_view,
                      "warnings": json.dumps(found),
                      "row": row if row is not None else self._failed_row(job), "call_started": started,
                      "refusal": ""}
            for key in _COLUMNS:
                columns[key].append(record[key])
        if files:
            flush_to_disk(files)  # one flush pass per call, before the driver reports them written
        return columns

    def __del__(self) -> None:
        for part in ("stream", "runner"):  # the stream's run first; either is missing when __init__ failed
            found = getattr(self, part, None)
            if found is not None:
                found.close()


def _absolute(plan: OutputPlan) -> OutputPlan:
    """The plan with its folders absolute (for a worker whose file system lacks the driver's cwd)."""
    def absolute(path: Path | None) -> Path | None:
        return Path(os.path.abspath(path)) if path is not None else None

    return replace(plan, json_dir=absolute(plan.json_dir), kitti_dir=absolute(plan.kitti_dir),
                   png_dir=absolute(plan.png_dir))
