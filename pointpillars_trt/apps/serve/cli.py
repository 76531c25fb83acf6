"""CLI glue: ``pointpillars-trt serve`` and the scale-out options of ``infer`` (--server, --ray).

``apps/cli.py`` wires these in: ``add_serve_parser(sub)`` beside the other commands, and in the infer
command ``add_scaleout_arguments(infer)``, with infer's run going to ``run_scaleout_infer`` when
``scaleout_requested(args)``.
"""

from __future__ import annotations

import argparse
import ipaddress
import queue
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from types import FrameType
from typing import TYPE_CHECKING

from ...errors import InputError, agree, counted, printable_text, safe_repr, shell_word
from ...graph_io import MAX_BATCH
from ...points import MAX_FRAME_POINTS
from ...stop_signals import set_from_signal_handler
from ..exit_codes import EXIT_FRAME_FAILURES, EXIT_INTERRUPTED, EXIT_TERMINATED
from ..frame_report import FrameReport
from ..ranges import device_arg, float_in, host_port, int_in, path_name, port
from ..runtime_args import add_model_arguments, exports_checkpoint
from .client import LIVE_PROBE_SECONDS, MAX_IN_FLIGHT
from .health import MIN_PROBE_WAIT, PROBE_INTERVALS
from .repository import (DEFAULT_GPU_INSTANCES, DEFAULT_SERVED_MAX_POINTS, MAX_INSTANCES,
                         MAX_PIPELINES_PER_INSTANCE, MAX_QUEUE_DELAY_US, MODEL_NAME)
from .server import DEFAULT_EXIT_TIMEOUT, EXIT_GRACE

if TYPE_CHECKING:
    from .health import ModelProbe
    from .server import TritonInstall, TritonServer

#: Most Ray detector actors one run asks for.
MAX_WORKERS = 4096


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    serve = subparsers.add_parser("serve", help="serve the detector with Triton Inference Server (HTTP + gRPC)")
    serve.add_argument("--model", required=True, type=path_name,
                       help="model dir (from build) or a .pth checkpoint (required)")
    add_model_arguments(serve)
    serve.add_argument("--repository", required=True, type=path_name,
                       help="Triton model repository folder to write and serve (required)")
    serve.add_argument("--instances", type=int_in(1, MAX_INSTANCES),
                       help=f"model instances per GPU (default: {DEFAULT_GPU_INSTANCES}) or on the CPU (default: 1), "
                            f"1..{MAX_INSTANCES}")
    serve.add_argument("--pipelines", type=int_in(1, MAX_PIPELINES_PER_INSTANCE), default=1,
                       help=f"GPU pipelines in each instance, 1..{MAX_PIPELINES_PER_INSTANCE}: one runs a batch "
                            "while Triton hands the instance the next (instances are processes, which time-slice "
                            "the GPU)")
    serve.add_argument("--max-batch", type=int_in(1, MAX_BATCH), default=8,
                       help=f"largest batch Triton forms for an instance, 1 (no batching)..{MAX_BATCH}")
    serve.add_argument("--max-queue-delay-us", type=int_in(0, MAX_QUEUE_DELAY_US), default=2000,
                       help=f"how long a request may wait for others to fill a batch, 0..{MAX_QUEUE_DELAY_US}")
    serve.add_argument("--max-points", type=int_in(1, MAX_FRAME_POINTS), default=DEFAULT_SERVED_MAX_POINTS,
                       help=f"largest frame a request may carry, 1..{MAX_FRAME_POINTS}")
    serve.add_argument("--device", type=device_arg, default="auto", help="auto, cpu, cuda (every GPU) or cuda:N")
    serve.add_argument("--host", default="127.0.0.1", help="address the endpoints bind to")
    serve.add_argument("--http-host",
                       help="address the HTTP endpoint binds to (default: --host). Triton allocates an HTTP "
                            "request's JSON data by the shape it declares, and a huge one aborts the server: where "
                            "untrusted clients reach --host, keep HTTP on 127.0.0.1 (serve's own health probe "
                            "uses it) and let them use gRPC")
    serve.add_argument("--http-port", type=port, help="1..65535 (default: a free port)")
    serve.add_argument("--grpc-port", type=port, help="1..65535 (default: a free port)")
    serve.add_argument("--metrics-port", type=port, help="1..65535 (default: a free port)")
    serve.add_argument("--tritonserver", type=path_name,
                       help="the tritonserver binary (default: $PP_TRITONSERVER, PATH, nvidia-pytriton)")
    serve.add_argument("--ready-timeout", type=float_in(0, 86400, low_open=True), default=120.0,
                       help="seconds to wait for the server to be ready (and answer its warm-up request)")
    serve.add_argument("--health-interval", type=float_in(0.1, 3600), default=10.0,
                       help="seconds between the one-point requests that check the model still answers, each "
                            f"waiting {PROBE_INTERVALS} intervals (at least {MIN_PROBE_WAIT:g} s) for its answer; "
                            "when two in a row fail, serve stops the server and exits with code 1")
    serve.add_argument("--exit-timeout-secs", metavar="SECONDS", type=int_in(1, 86400), default=DEFAULT_EXIT_TIMEOUT,
                       help="tritonserver's own option, passed on: whole seconds a stop (Ctrl-C, SIGTERM) waits for "
                            "its HTTP clients to close their connections and for the requests queued or running "
                            "before tritonserver drops them and exits with code 1, "
                            f"1..86400 (default: %(default)s); serve kills it {EXIT_GRACE} s after that")
    serve.add_argument("--repository-only", action="store_true", help="write the repository and exit")
    serve.set_defaults(run=run_serve)
    return serve


def run_serve(args: argparse.Namespace) -> int:
    """Write the repository (said with the config and precision of the graphs served, as infer's "running on" line
    says its precision), start tritonserver, send one warm-up request through it, print its endpoints and "ready",
    then watch the model (a one-point request every --health-interval s).

    On SIGINT/SIGTERM the server is stopped (the signal is forwarded; killed if it has not exited within
    its stop timeout): exit 0 when it stopped cleanly, else 1 with one ``error:`` line; a signal before "ready"
    exits as other commands stopped by one do (130 for Ctrl-C, 143 for SIGTERM). A model that
    stops answering (a dead Python-backend stub leaves Triton "ready" while every request fails) stops
    the server and exits 1: a supervisor (systemd, Kubernetes) then restarts the whole server, which
    recovers from anything a reload in place would, and a crash loop stays visible.
    """
    from ..infer import existing_model_path, rebuild_named
    from .repository import refuse_repository_in_model, repository_held
    from .server import check_bind_host, find_tritonserver, refuse_busy_ports

    ports = [p for p in (args.http_port, args.grpc_port, args.metrics_port) if p is not None]
    if len(set(ports)) != len(ports):
        raise InputError(f"--http-port, --grpc-port and --metrics-port must differ; got {ports}")
    install = None
    if not args.repository_only:  # before anything is written
        for option, name in (("--host", "host"), ("--http-host", "http_host")):
            given = getattr(args, name)
            address = given if given is None else check_bind_host(given, option)
            if address != given:
                print(f"note: {option} {printable_text(given)}: serving on {address} (tritonserver takes numeric "
                      "addresses)", file=sys.stderr, flush=True)
                setattr(args, name, address)
        install = find_tritonserver(args.tritonserver)
        # a busy port given is refused before the repository is made or written (free ones are picked at the start)
        refuse_busy_ports(args.host, args.http_host or args.host, args.http_port, args.grpc_port, args.metrics_port)
    model = existing_model_path(args.model)  # a --model that is not there: before the repository folder is made
    with rebuild_named(model, args.config):
        exports_checkpoint(args.model, args.precision)  # a model dir's other --precision: refused as infer refuses it
    refuse_repository_in_model(args.model, args.repository)
    with repository_held(args.repository):  # no second serve rewrites the model under this one
        return _write_and_serve(args, install)


def _write_and_serve(args: argparse.Namespace, install: TritonInstall | None) -> int:
    """run_serve's work while it holds the repository (``install`` None: --repository-only)."""
    from .health import warm_up
    from ...runtime_options import RuntimeOptions
    from .repository import resolve_model, write_repository
    from .server import StartCancelled, TritonServer

    # opened as infer opens it (a checkpoint exported with --config in --precision); one that cannot be opened is
    # the one error, before the note below
    model = resolve_model(args.model, args.config, args.precision)
    if args.device == "auto":
        from ...devices import cuda_available

        reason = cuda_available()
        if reason is not None:  # the repository's instances are decided here: a CPU one is said
            print(f"note: device auto: the model's instances run on the CPU (KIND_CPU): {reason}; write the "
                  "repository on the machine whose GPU tritonserver will use", file=sys.stderr, flush=True)
    target = write_repository(model, args.repository, instances=args.instances, pipelines=args.pipelines,
                              max_batch=args.max_batch,
                              max_queue_delay_us=args.max_queue_delay_us, device=args.device,
                              max_points=args.max_points, runtime=RuntimeOptions(device=args.device))
    wrote = f"wrote {printable_text(str(target))} ({model.cfg.name}, {model.precision})"  # which graphs are served
    if install is None:
        print(wrote, flush=True)
        return 0
    server = TritonServer(args.repository, install=install, host=args.host, http_host=args.http_host,
                          http_port=args.http_port,
                          grpc_port=args.grpc_port, metrics_port=args.metrics_port, exit_timeout=args.exit_timeout_secs,
                          end_with_parent=True, model=MODEL_NAME)  # the repository's other model folders are not served
    stop = threading.Event()
    signals: list[int] = []  # the stop's

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)
        set_from_signal_handler(stop)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    ready = False
    try:
        # a signal from here on is a stop (a caller may wait for this line)
        print(wrote, flush=True)
        server.start(timeout=args.ready_timeout, stop=stop)
        probe = warm_up(server.endpoints["http"], args.ready_timeout)
        probe.watch_every(args.health_interval)
        probes = _ProbeThread(probe, stop)
        try:
            if not stop.is_set():  # a signal during the warm-up: stop without saying ready
                for name, endpoint in server.endpoints.items():
                    print(f"{name}: {endpoint}", flush=True)
                print("ready (Ctrl-C to stop)", flush=True)
                ready = True
                status = _watch(server, probes, stop, args.health_interval)
        finally:
            probes.close()
    except StartCancelled:
        pass  # stopped below, as after a signal once ready
    finally:
        if ready and not status:  # a stop the user asked for: the wait that may follow is said first
            print(f"stopping: tritonserver waits up to {server.exit_timeout} s (--exit-timeout-secs) for its HTTP "
                  "clients to close their connections and for the requests still queued or running", flush=True)
        code = server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if status:
        return status
    if not ready and code in (0, -signal.SIGTERM):  # SIGTERM before tritonserver set its handler: a stop all the same
        print("stopped before the server was ready", flush=True)
        return EXIT_TERMINATED if signals[:1] == [signal.SIGTERM] else EXIT_INTERRUPTED
    if code != 0:
        print(f"error: tritonserver {stop_error(server, code)}", file=sys.stderr, flush=True)
        return EXIT_FRAME_FAILURES
    print(f"stopped (tritonserver exit code {code})", flush=True)
    return 0


def stop_error(server: TritonServer, code: int | None) -> str:
    """What serve says of a server whose stop ended in exit code ``code`` (not 0), as ``server.stop`` saw it end:
    killed by the stop once its stop timeout ran out; ended by itself with exit code 1 once its exit timeout had
    (tritonserver's own exit when its HTTP clients' open connections, requests or its model's unload outlast it: no
    sooner after the SIGTERM); or an exit of any other code, or sooner, by its code."""
    if server.killed_at_stop and code == -signal.SIGKILL:
        return (f"did not finish its requests within {server.stop_timeout:g} s of the stop and was killed: the "
                "requests still queued or running were dropped (their clients got UNAVAILABLE)")
    if code == 1 and server.stop_seconds is not None and server.stop_seconds >= server.exit_timeout:
        return (f"ran past its exit timeout of {server.exit_timeout} s after the stop and ended itself (exit code 1): "
                "it waits that long for its HTTP clients to close their connections (an idle keep-alive connection "
                "holds it too), then for the requests still queued or running and its model's unload, and drops "
                "what is left; close the clients before the server, or give them longer with --exit-timeout-secs")
    return f"did not stop cleanly (exit code {code})"


def _watch(server: TritonServer, probes: _ProbeThread, stop: threading.Event, interval: float) -> int:
    """Wait for ``stop``; 1 (after one ``error:`` line) when the server exits or its model stops answering."""
    next_probe = time.monotonic() + interval
    while not stop.wait(min(0.5, interval)):
        code = server.exit_code() if server.process is not None else None
        if code is not None:
            print(f"error: {server_exit_text(code, server.http_host)}", file=sys.stderr, flush=True)
            return EXIT_FRAME_FAILURES
        if time.monotonic() < next_probe:
            continue
        error = probes.check()
        if error is not None and not stop.is_set():
            print(f"error: model {MODEL_NAME} stopped answering ({error}); its worker died or hangs: stopping "
                  "the server", file=sys.stderr, flush=True)
            return EXIT_FRAME_FAILURES
        next_probe = time.monotonic() + interval
    return 0


def server_exit_text(code: int, http_host: str) -> str:
    """What serve says of a tritonserver that exited with ``code`` (a signal's as -N) while it served, HTTP on
    ``http_host``. An abort is most often Triton's ``std::bad_alloc`` on an HTTP request whose JSON data
    declares a huge shape (it allocates the declared size before it reads the data); where HTTP listens
    beyond this machine, the fix is said too."""
    crashed = "it crashed; its own log above says why"
    if code >= 0 or -code not in signal.valid_signals():
        why = ""
    elif code == -signal.SIGKILL:
        why = " (SIGKILL: killed by the kernel's out-of-memory killer, or kill -9)"
    elif code == -signal.SIGABRT:
        fix = "" if ipaddress.ip_address(http_host).is_loopback else \
            f": HTTP listens on {http_host}, where untrusted clients may reach it; serve it on loopback only, " \
            "--http-host 127.0.0.1, and let them use gRPC"
        why = (f" (SIGABRT: {crashed}; a std::bad_alloc there is most likely an HTTP request whose JSON data "
               f"declared a huge shape, which Triton allocates before it reads the data{fix})")
    else:
        why = f" ({signal.Signals(-code).name}: {crashed})"
    return (f"tritonserver exited with code {code}{why}; restart serve (a supervisor such as systemd's "
            "Restart=on-failure does it for you)")


class _ProbeThread:
    """Runs ``probe.check()`` on one thread of its own for as long as serve watches the server, each check
    waited for only until ``stop``: a hung model keeps a probe waiting up to its timeout (and its statistics call
    as long again), and a Ctrl-C or SIGTERM meanwhile must stop serve at once, not minutes later (a supervisor's
    stop timeout would kill it first). One thread for all checks: the client keeps a connection a thread (over
    HTTP, with an event loop of its own that outlives the thread), so a new thread a check left three file
    descriptors open a check, until serve ran out of them and aborted. Those connections live in the thread's
    event loop, so the thread closes them too (``close``)."""

    def __init__(self, probe: ModelProbe, stop: threading.Event) -> None:
        self._probe, self._stop = probe, stop
        self._asked: queue.SimpleQueue[Future[str | None] | None] = queue.SimpleQueue()  # None: close
        threading.Thread(target=self._run, name="health-probe", daemon=True).start()

    def _run(self) -> None:
        while True:
            found = self._asked.get()
            if found is None:
                self._probe.close()
                return
            verdict = None
            try:
                verdict = self._probe.check()
            except Exception:  # noqa: BLE001 - its client closed under it by a stop: the stop is what is said
                if not self._stop.is_set():
                    traceback.print_exc()  # a bug of the probe's, said as a thread's uncaught error is; serve goes on
            found.set_result(verdict)

    def check(self) -> str | None:
        """The probe's verdict (None: the model answers, or a stop came first)."""
        found: Future[str | None] = Future()
        self._asked.put(found)
        while not found.done() and not self._stop.wait(0.2):
            pass
        return None if self._stop.is_set() or not found.done() else found.result()

    def close(self) -> None:
        """The probe's connections closed on the thread, once the check it runs now (a hung server keeps it up to
        its timeout) is over; not waited for: a stop reaches the server at once, and the process ends soon after."""
        self._asked.put(None)


#: The scale-out options' defaults (add_scaleout_arguments), against which a given option is told apart.
_SCALEOUT_DEFAULTS: dict[str, object] = {"protocol": "grpc", "in_flight": 8, "request_timeout": 60.0,
                                         "ray_address": None, "workers": None, "gpus_per_worker": None}


def add_scaleout_arguments(parser: argparse.ArgumentParser) -> None:
    """infer's options for running elsewhere: a Triton server, or a Ray cluster."""
    group = parser.add_argument_group("scale-out (a served model or a Ray cluster)")
    group.add_argument("--server", metavar="HOST:PORT", type=host_port,
                       help="send frames to a `pointpillars-trt serve` server")
    group.add_argument("--protocol", choices=("grpc", "http"), default=_SCALEOUT_DEFAULTS["protocol"],
                       help="with --server")
    group.add_argument("--in-flight", type=int_in(1, MAX_IN_FLIGHT), default=_SCALEOUT_DEFAULTS["in_flight"],
                       help=f"with --server: the most requests in flight at once, 1..{MAX_IN_FLIGHT} "
                            "(default: %(default)s)")
    group.add_argument("--request-timeout", metavar="SECONDS", type=float_in(0, 86400, low_open=True),
                       default=_SCALEOUT_DEFAULTS["request_timeout"],
                       help="with --server: seconds a request may take (default: %(default)g); a server that then "
                            f"answers no liveness probe within {LIVE_PROBE_SECONDS:g} s (or the timeout, if shorter) "
                            "is taken for down, and the frames left fail at once, counted in one line")
    group.add_argument("--ray", action="store_true",
                       help="run on a Ray cluster (Ray Data; each worker a process of --pipelines detectors); a "
                            "PATH may then be a URI Ray Data reads (s3://bucket/drive42/, file:///data/frames/), "
                            "which it lists once the cluster is up: its point files are the frames, as in a local "
                            "folder (subfolders left out), checked before the run as local frames are"),
    group.add_argument("--ray-address", help="with --ray: auto or HOST:PORT of a cluster (default: $RAY_ADDRESS's "
                                             "cluster where it is set, else a local one)")
    group.add_argument("--workers", type=int_in(1, MAX_WORKERS),
                       help=f"with --ray: detector actors, 1..{MAX_WORKERS} (default: the cluster's GPUs / "
                            "--gpus-per-worker, at most one a CPU of it; workers on the CPU: one per 2 of its CPUs; "
                            "either way no more than the calls the frames to run make)")
    group.add_argument("--gpus-per-worker", type=float_in(0, 64),
                       help="with --ray: 0.5 (two per GPU: the default on a cluster with GPUs), 1, or 0 (CPU: the "
                            "default on a cluster without GPUs); 0..64")


def scaleout_requested(args: argparse.Namespace) -> bool:
    """Whether infer runs elsewhere (``--server`` or ``--ray``); refuses the options of the one not taken."""
    server, ray = bool(getattr(args, "server", None)), bool(getattr(args, "ray", False))
    for needed, taken, options in (("--server", server, ("protocol", "in_flight", "request_timeout")),
                                   ("--ray", ray, ("ray_address", "workers", "gpus_per_worker"))):
        given = [name for name in options if getattr(args, name, None) != _SCALEOUT_DEFAULTS[name]]
        if given and not taken:
            raise InputError(f"{', '.join('--' + name.replace('_', '-') for name in given)}: only used with "
                             f"{needed}; add {needed} or drop {agree(len(given), 'it', 'them')}")
    return server or ray


def run_scaleout_infer(args: argparse.Namespace) -> int:
    """``infer --server`` / ``infer --ray``: local infer's checks, output files, error lines and summary
    (``apps/infer.py`` makes them all; only where the detector runs differs)."""
    if args.server and args.ray:
        raise InputError("--server and --ray exclude each other: pick one")
    if args.ray:
        return _run_ray(args)
    from ...config import Thresholds
    from ..infer import infer_with
    from ..run_size import RunSize
    from .client import RemoteDetector

    _refuse_local_options(args)
    thresholds = Thresholds(args.score_threshold, args.nms_iou, args.max_boxes)

    def open_detectors(_points: int | None, fitted: RunSize) -> list[RemoteDetector]:
        # pipelines of one detector: a batch's requests go out while the one before it is written, and
        # the detector's --in-flight slots bound the requests of all
        detector = RemoteDetector(args.server, protocol=args.protocol, thresholds=thresholds,
                                  concurrency=args.in_flight, timeout=args.request_timeout,
                                  timeout_option="--request-timeout")
        return [detector] * fitted.pipelines

    return infer_with(args, open_detectors, RunSize(batch=args.in_flight, pipelines=2))


#: infer's options that choose how a local detector runs: the served model decides all of them, so
#: ``--server`` refuses any that differs from its default (the thresholds go with each request).
_LOCAL_OPTIONS = ("model", "config", "precision", "backend", "device", "threads", "no_tf32", "batch_size",
                  "pipelines")


def _refuse_local_options(args: argparse.Namespace) -> None:
    from ..infer import add_infer_parser

    infer = add_infer_parser(argparse.ArgumentParser().add_subparsers())  # its defaults, as infer declares them
    given = [name for name in _LOCAL_OPTIONS if getattr(args, name) != infer.get_default(name)]
    if given:
        options = ", ".join("--" + name.replace("_", "-") for name in given)
        raise InputError(f"{options}: the server's model and settings run the frames with --server (serve decides "
                         "them); drop them, or run without --server")


def _run_ray(args: argparse.Namespace) -> int:
    """``infer --ray``, resumed as local infer is: which frames to run is read from --out here, on the driver
    (``frames_to_run``), and only those go to the workers; a run with none left says so and ends without
    importing Ray or reading the model. URIs go to ``detect_dataset`` as given: Ray Data lists them once the
    cluster is up, and what infer checks of the frames before they run (output names that clash, a frame given
    twice) is checked here of the local frames, and there of them all."""
    from ..distributed import cluster_messages_on_stderr, detect_dataset, require_ray
    from ..uri_frames import calib_probes, check_one_file_system, is_uri
    from ..frame_prep import frame_preparer
    from .repository import resolve_model
    from ..frame_paths import expand_frame_paths
    from ..frame_report import frame_report
    from ..infer import check_calib_folders, check_model_inputs, check_model_path, check_outputs, end_skipped_run, \
        OutHold, output_plan, refuse_unused_point_dim
    from ..resume import frames_to_run, say_resume
    from ..run_settings import settings_record
    from ..outputs import OutputPlan
    from ..runtime_args import runtime_options_from_args

    missing = [option for option, given in (("--model", args.model), ("--out DIR", args.out)) if not given]
    eval_refused = f"--eval does not run with --ray: {_ray_eval_fix(args)}" if args.eval else None
    if missing:  # with --eval's refusal in the same line, so that a run fixed by the first is not refused again
        raise InputError(f"--ray needs {' and '.join(missing)}: the workers load the model, and the outputs (a file "
                         "a frame, or the part files of --format jsonl / parquet) are written there"
                         + (f"; and {eval_refused}" if eval_refused else ""))
    if eval_refused:
        raise InputError(eval_refused)
    _refuse_uri_resume(args)
    path_errors: list[str] = []
    frames = expand_frame_paths(args.paths, path_errors, as_given=is_uri)
    refuse_unused_point_dim(args.point_dim, frames)
    check_one_file_system(frames)
    local = [frame for frame in frames if not is_uri(frame)]
    fmt, out, _ = check_outputs(args, local, resumable=len(local) == len(frames))
    assert out is not None  # --out is required above
    files = output_plan(args, fmt, out)  # which files a frame's outputs are: what --skip-existing looks for
    with OutHold(out) as hold:
        resume = frames_to_run(frames, files, fmt, out, args.skip_existing, retry_failed=args.retry_failed)
        if resume.todo:
            require_ray(args.ray_address)  # before the model is read or exported
        check_model_path(args)
        record = settings_record(args, fmt, out, frames)
        assert record is not None  # --out is required above
        model = resolve_model(args.model, args.config, args.precision) \
            if resume.todo or record.may_differ_from_kept() else None

        def settle() -> None:
            """--out's settings record against this run's, as applied by ``model``."""
            assert model is not None
            record.settle(model, model.cfg.with_thresholds(score_threshold=args.score_threshold, nms_iou=args.nms_iou,
                                                           max_boxes=args.max_boxes),
                          args.point_dim or model.cfg.num_point_columns, skip_existing=args.skip_existing,
                          skipped=len(resume.skipped))

        if not resume.todo:  # every frame's outputs are there: no cluster (nor a model, where they are of these settings)
            if model is not None:
                settle()
            failed = end_skipped_run(args, resume, files, fmt, out, path_errors)
            return EXIT_FRAME_FAILURES if failed or path_errors else 0
        assert model is not None
        local_todo = [frame for frame in resume.todo if not is_uri(frame)]
        # before the cluster starts, as local infer checks them before any frame runs
        check_model_inputs(f"model {model.cfg.name}", model.cfg.num_point_columns, model.cfg.box_code.velocity, fmt,
                           args.point_dim or model.cfg.num_point_columns, local_todo)
        prepare = frame_preparer(args, fmt, lambda text: print(text, file=sys.stderr, flush=True), model.fov_points_only,
                                 model.cfg.voxel.point_range)
        if fmt == "kitti" or prepare is not None:  # each frame's calib: of a file:// URI, the folder it names here
            check_calib_folders(local_todo + calib_probes(resume.todo, args.calib), args.calib)
        summary_out = sys.stdout  # the summary's alone: the cluster's messages go to stderr while the frames run

        def report(plan: OutputPlan, frames: int) -> FrameReport:
            """Called once the cluster is checked and the URIs are listed: --out held, what --skip-existing found
            said (--retry-failed's rows removed), then the account of the ``frames`` left; --out's settings recorded."""
            hold.before_first_write()
            settle()
            say_resume(resume, fmt, out, retry=args.retry_failed)
            return frame_report(frames, plan, args, fmt, out, path_errors, stdout=summary_out)

        with cluster_messages_on_stderr():
            summary = detect_dataset(resume.todo, model, out, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                                     batch_size=args.batch_size, pipelines=args.pipelines, output_format=fmt,
                                     calib=args.calib, image_shape=args.image_shape,
                                     keep_out_of_view=args.keep_out_of_view, viz=args.viz, point_dim=args.point_dim,
                                     intensity_scale=args.intensity_scale, ray_address=args.ray_address, prepare=prepare,
                                     runtime=runtime_options_from_args(args), report=report)
        print(f"{summary.frames_per_second:.1f} frames/s with {counted(summary.workers, 'worker')} "
              f"({summary.working_frames_per_second:.1f} frames/s from the workers' first call on: their start left out)",
              file=sys.stderr)
        return EXIT_FRAME_FAILURES if summary.failures or path_errors else 0


def _ray_eval_fix(args: argparse.Namespace) -> str:
    """How to evaluate what an ``infer --ray --eval`` run would write, for its ``--format``: eval reads label files
    (``--format kitti``, which infer writes by default only with ``--eval``), and JSON files with ``--calib``; part
    files of rows only local ``infer --eval --skip-existing`` reads back. Without ``--eval`` the camera-view crop is
    off for JSON outputs, so the fix turns it on where it was not given."""
    out = shell_word(args.out) if args.out else "DIR"
    labels = shell_word(args.eval)
    crop = " and add --fov-only (which --eval turns on)" if args.fov_only is None else ""
    if args.format in (None, "kitti"):
        also = " and add --format kitti (--eval's default; without it, json)" if args.format is None else ""
        return (f"drop --eval{also}, then evaluate the label files written with `pointpillars-trt eval --pred {out} "
                f"--labels {labels}`")
    if args.format == "json":
        calib = shell_word(args.calib) if args.calib else "CALIB_DIR"
        shape = f" --image-shape {args.image_shape[0]},{args.image_shape[1]}" if args.image_shape else ""
        return (f"drop --eval{crop}, then evaluate the JSON files written with `pointpillars-trt eval --pred {out} "
                f"--labels {labels} --calib {calib}{shape}`" + ("" if args.calib else " (the frames' calib folder)"))
    return (f"drop --eval{crop}, then evaluate the rows written by running the same command without --ray (and the "
            f"options only it takes), with --eval {labels} --skip-existing (nothing runs again)")


def _refuse_uri_resume(args: argparse.Namespace) -> None:
    """--skip-existing compares the frames given with --out before any runs: a URI's frames (Ray Data lists
    them only as it reads them) cannot be listed here."""
    from ..uri_frames import is_uri

    uris = [path for path in args.paths if is_uri(path)]
    if args.skip_existing and uris:
        raise InputError(f"--skip-existing: {safe_repr(uris[0])} is a URI, whose frames cannot be listed here to find "
                         "those already in --out; give them as a local path every Ray node sees (a copy, or the "
                         "bucket mounted)")
