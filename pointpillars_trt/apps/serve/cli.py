"""CLI glue: ``pointpillars-trt serve`` and the scale-out options of ``infer`` (--server, --ray).

``apps/cli.py`` wires these in: ``add_serve_parser(sub)`` beside the other commands, and in the infer
command ``add_scaleout_arguments(infer)`` plus, first thing in ``_cmd_infer``,
``if scaleout_requested(args): return run_scaleout_infer(args)``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from ...errors import InputError
from .outputs import EXIT_FRAME_FAILURES, print_summary
from .repository import DEFAULT_MAX_POINTS


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    serve = subparsers.add_parser("serve", help="serve the detector with Triton Inference Server (HTTP + gRPC)")
    serve.add_argument("--model", required=True, help="model dir (from build) or a .pth checkpoint")
    serve.add_argument("--repository", required=True, help="Triton model repository folder to write (and serve)")
    serve.add_argument("--instances", type=int, default=1, help="model instances per GPU (or on the CPU)")
    serve.add_argument("--max-batch", type=int, default=8, help="largest dynamic batch (1: no batching)")
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
    from .repository import write_repository
    from .server import TritonServer, find_tritonserver

    target = write_repository(args.model, args.repository, instances=args.instances, max_batch=args.max_batch,
                              max_queue_delay_us=args.max_queue_delay_us, device=args.device,
                              max_points=args.max_points)
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
    """``infer --server`` / ``infer --ray``: the same outputs and summary as local infer."""
    if args.server and args.ray:
        raise InputError("--server and --ray exclude each other: pick one")
    out = Path(args.out) if args.out else None
    if args.format == "kitti" and not (args.calib and Path(args.calib).is_dir()):
        raise InputError(f"--format kitti needs --calib DIR, a folder of KITTI calib files named like the frames "
                         f"(got {args.calib!r})")
    if args.ray:
        return _run_ray(args, out)
    from ..cli import _check_unique_names, expand_frame_paths
    from .client import RemoteDetector
    from .outputs import write_and_report

    frames = expand_frame_paths(args.paths)
    if out:
        _check_unique_names(frames)
        out.mkdir(parents=True, exist_ok=True)
    remote = RemoteDetector(args.server, protocol=args.protocol)
    try:
        return write_and_report(remote.infer_many(frames, concurrency=args.in_flight), len(frames), out=out,
                                output_format=args.format, calib=args.calib, progress=not args.no_progress)
    finally:
        remote.close()


def _run_ray(args: argparse.Namespace, out: Path | None) -> int:
    from ...distributed import detect_dataset

    if out is None or not args.model:
        raise InputError("--ray needs --model and --out DIR: the workers load the model and write one output "
                         "file per frame there")
    gpus = 0.0 if args.device == "cpu" and args.gpus_per_worker is None else args.gpus_per_worker
    summary = detect_dataset(args.paths, args.model, out, workers=args.workers, gpus_per_worker=gpus,
                             batch_size=getattr(args, "batch_size", None), output_format=args.format, calib=args.calib,
                             ray_address=args.ray_address, progress=not args.no_progress)
    print_summary(summary.frames - len(summary.failures), summary.frames, summary.boxes, out, summary.failures)
    print(f"{summary.frames_per_second:.1f} frames/s with {summary.workers} worker(s)", file=sys.stderr)
    return EXIT_FRAME_FAILURES if summary.failures else 0
