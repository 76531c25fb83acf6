#!/usr/bin/env python3
"""Throughput and latency of ``pointpillars-trt serve``: N concurrent clients send frames from a folder
for T seconds, once per server setting (default: max batch 1, i.e. no batching, vs dynamic batching).

Prints one table row per setting: frames/s, p50 / p99 request latency (ms), and the mean batch the
server formed (Triton's inference_count / execution_count). Not a test: numbers depend on the machine.

    python scripts/bench_serve.py --model M [--frames DIR] [--clients 8] [--seconds 10] [--max-batch 1 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from pointpillars_trt.apps.serve.client import RemoteDetector
from pointpillars_trt.apps.serve.repository import MODEL_NAME, write_repository
from pointpillars_trt.apps.serve.server import TritonServer, find_tritonserver
from pointpillars_trt.kitti import read_velodyne_bin

ASSETS = Path(os.environ.get("PP_ASSETS", "assets"))  # the test assets folder (checkpoints/, kitti/), as the tests read it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ASSETS / "checkpoints/pointpillar_openpcdet_synthetic.pth"))
    parser.add_argument("--frames", default=str(ASSETS / "kitti/training/velodyne_fov"), help="folder of .bin frames")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--max-batch", type=int, nargs="+", default=[1, 8], help="one server run per value")
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tritonserver")
    args = parser.parse_args()
    frames = [read_velodyne_bin(p) for p in sorted(Path(args.frames).glob("*.bin"))]
    if not frames:
        parser.error(f"--frames {args.frames}: no .bin files")
    install = find_tritonserver(args.tritonserver)
    print(f"{len(frames)} frames (mean {np.mean([len(f) for f in frames]):.0f} points), {args.clients} "
          f"{args.protocol} clients, {args.seconds:g} s each, device {args.device}, {args.instances} instance(s)")
    print(f"{'max batch':>9} | {'frames/s':>8} | {'p50 ms':>7} | {'p99 ms':>7} | {'mean batch':>10} | errors")
    print("-" * 62)
    for max_batch in args.max_batch:
        with tempfile.TemporaryDirectory(prefix="pp-bench-serve-") as scratch:
            write_repository(args.model, Path(scratch) / "repo", instances=args.instances, max_batch=max_batch,
                             max_queue_delay_us=args.max_queue_delay_us, device=args.device)
            with TritonServer(Path(scratch) / "repo", install=install, log=Path(scratch) / "server.log") as server:
                row = run_clients(server, frames, args.clients, args.seconds, args.protocol)
        print(f"{max_batch:>9} | {row['fps']:>8.1f} | {row['p50']:>7.1f} | {row['p99']:>7.1f} | "
              f"{row['batch']:>10.2f} | {row['errors']}")
    return 0


def run_clients(server: TritonServer, frames: list[np.ndarray], clients: int, seconds: float,
                protocol: str) -> dict[str, float]:
    """Each client thread sends frames one after another (its next once the last came back)."""
    remote = RemoteDetector(server.endpoints[protocol], protocol=protocol)
    for frame in frames[:2]:
        remote(frame)  # warm-up: first-call costs out of the numbers
    stats_before = server_stats(server)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(offset: int) -> None:
        mine: list[float] = []
        index = offset
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            try:
                remote(frames[index % len(frames)])
                mine.append(time.perf_counter() - start)
            except Exception:  # noqa: BLE001 - counted, the run goes on
                with lock:
                    errors[0] += 1
            index += 1
        with lock:
            latencies.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    inferences, executions = (after - before for after, before in zip(server_stats(server), stats_before))
    remote.close()
    ms = np.array(latencies) * 1e3
    return {"fps": len(latencies) / elapsed, "p50": float(np.percentile(ms, 50)) if len(ms) else 0.0,
            "p99": float(np.percentile(ms, 99)) if len(ms) else 0.0,
            "batch": inferences / executions if executions else 0.0, "errors": errors[0]}


def server_stats(server: TritonServer) -> tuple[int, int]:
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(server.endpoints["grpc"])
    stats = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
    client.close()
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


if __name__ == "__main__":
    sys.exit(main())
