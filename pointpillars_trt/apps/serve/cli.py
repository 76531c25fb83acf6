"""CLI glue: ``pointpillars-trt serve`` and the scale-out options of ``infer`` (--server, --ray).

``apps/cli.py`` wires these in: ``add_serve_parser(sub)`` beside the other commands, and in the infer
command ``add_scaleout_arguments(infer)``, with infer's run going to ``run_scaleout_infer`` when
``scaleout_requested(args)``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from ...errors import InputError
from ...graph_io import MAX_BATCH
from ..infer import EXIT_FRAME_FAILURES
from .repository import DEFAULT_MAX_POINTS


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    serve = subparsers.add_parser("serve", help="serve the detector with Triton Inference Server (HTTP + gRPC)")
    serve.add_argument("--model", required=True, help="model dir (from build) or a .pth checkpoint")
    serve.add_argument("--repository", required=True, help="Triton model repository folder to write (and serve)")
    serve.add_argument("--instances", type=int, default=1, help="model instances per GPU (or on the CPU)")
    serve.add_argument("--max-batch", type=int, default=MAX_BATCH, help="largest dynamic batch (1: no batching)")
    serve.add_argument("--max-queue-delay-us", type=int, default=2000,
                       help="how long a request may wait for others to fill a batch")
    serve.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS, help="largest frame a request may carry")
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda (every GPU) or cuda:N")
    serve.add_argument("--host", default="127.0.0.1", help="address the endpoints bind to")
    serve.add_argument("--http-port", type=int, help="default: a free port")
    serve.add_argument("--grpc-port", type=int, help="default: a free port")
    serve.add_argument("--metrics-port", type=int, help="default: a free port")
    serve.add_argument("--tritonserver", help="the tritonserver binary (default: $PP_TRITONSERVER, PATH, nvidia-pytriton)")
    serve.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for the server to be ready")
    serve.add_argument("--repository-only", action="store_true", help="write the repository and exit")
    serve.set_defaults(run=run_serve)
    return serve


def run_serve(args: argparse.Namespace) -> int:
    """Write the repository, start tritonserver, print its endpoints, and on SIGINT/SIGTERM stop it
    (the signal is forwarded; the server is killed if it has not exited within its stop timeout)."""
    from ...runtime_options import RuntimeOptions
    from .repository import write_repository
    from .server import TritonServer, find_tritonserver

    target = write_repository(args.model, args.repository, instances=args.instances, max_batch=args.max_batch,
                              max_queue_delay_us=args.max_queue_delay_us, device=args.device,
                              max_points=args.max_points, runtime=RuntimeOptions(device=args.device))
    print(f"wrote {target}", flush=True)
    if args.repository_only:
        return 0
    server = TritonServer(args.repository, install=find_tritonserver(args.tritonserver), host=args.host,
                          http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start(timeout=args.ready_timeout)
        for name, endpoint in server.endpoints.items():
            print(f"{name}: {endpoint}", flush=True)
        print("ready (Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5):
            if server.process is not None and server.process.poll() is not None:
                print(f"error: tritonserver exited with code {server.process.returncode}", file=sys.stderr)
                return EXIT_FRAME_FAILURES
    finally:
        code = server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"stopped (tritonserver exit code {code})", flush=True)
    return 0


def add_scaleout_arguments(parser: argparse.ArgumentParser) -> None:
    """infer's options for running elsewhere: a Triton server, or a Ray cluster."""
    group = parser.add_argument_group("scale-out (a served model or a Ray cluster)")
    group.add_argument("--server", metavar="HOST:PORT", help="send frames to a `pointpillars-trt serve` server")
    group.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="with --server")
    group.add_argument("--in-flight", type=int, default=8, help="with --server: concurrent requests")
    group.add_argument("--ray", action="store_true", help="run on a Ray cluster (Ray Data, one detector per worker)")
    group.add_argument("--ray-address", help="with --ray: auto or HOST:PORT of a cluster (default: a local one)")
    group.add_argument("--workers", type=int, help="with --ray: detector actors (default: GPUs / --gpus-per-worker)")
    group.add_argument("--gpus-per-worker", type=float, help="with --ray: 1, 0.5 (two per GPU) or 0 (CPU)")


def scaleout_requested(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "server", None) or getattr(args, "ray", False))


def run_scaleout_infer(args: argparse.Namespace) -> int:
    """``infer --server`` / ``infer --ray``: local infer's checks, output files, error lines and summary
    (``apps/infer.py`` makes them all; only where the detector runs differs)."""
    if args.server and args.ray:
        raise InputError("--server and --ray exclude each other: pick one")
    if args.ray:
        return _run_ray(args)
    from ..infer import infer_with
    from .client import RemoteDetector

    return infer_with(args, lambda: [RemoteDetector(args.server, protocol=args.protocol) for _ in range(2)],
                      batch=args.in_flight)


def _run_ray(args: argparse.Namespace) -> int:
    from ..distributed import detect_dataset
    from ..frame_prep import frame_preparer
    from .repository import resolve_model
    from ..infer import FrameReport, check_outputs, expand_frame_paths
    from ..runtime_args import runtime_options_from_args

    if not args.out or not args.model:
        raise InputError("--ray needs --model and --out DIR: the workers load the model and write one output "
                         "file per frame there")
    if args.eval:
        raise InputError("--eval does not run with --ray: evaluate the written label files with `pointpillars-trt eval`")
    frames = expand_frame_paths(args.paths)
    fmt, _, _ = check_outputs(args, frames)
    prepare = frame_preparer(args, fmt, lambda text: print(text, file=sys.stderr, flush=True),
                             resolve_model(args.model).fov_points_only)
    gpus = 0.0 if args.device == "cpu" and args.gpus_per_worker is None else args.gpus_per_worker
    summary = detect_dataset(frames, args.model, args.out, workers=args.workers, gpus_per_worker=gpus,
                             batch_size=args.batch_size, pipelines=args.pipelines, output_format=fmt, calib=args.calib,
                             image_shape=args.image_shape, keep_out_of_view=args.keep_out_of_view, viz=args.viz,
                             point_dim=args.point_dim, intensity_scale=args.intensity_scale,
                             ray_address=args.ray_address, prepare=prepare, runtime=runtime_options_from_args(args),
                             report=lambda plan: FrameReport(len(frames), plan, progress=not args.no_progress,
                                                             where=True))
    print(f"{summary.frames_per_second:.1f} frames/s with {summary.workers} worker(s)", file=sys.stderr)
    return EXIT_FRAME_FAILURES if summary.failures else 0
