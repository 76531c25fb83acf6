#!/usr/bin/env python3
"""Throughput and latency of ``pointpillars-trt serve``: N concurrent clients send frames from a folder
for T seconds, once per server setting (default: max batch 1, i.e. no batching, vs dynamic batching).

The clients are spread over ``--client-processes`` processes (each its own gRPC channel and GIL), so
that the load generator is not what limits the numbers. Prints one table row per setting: frames/s,
p50 / p99 request latency (ms), the mean batch the server formed (Triton's inference_count /
execution_count), where a request's time went on the server (Triton's queue and compute_infer: the
model's ``execute``, per request, which answers later: staging the batch and waiting for an idle
pipeline; compute_input and compute_output: moving tensors to and from the backend) and the CPU
cores the server's processes (tritonserver and its backend stubs) and the clients kept busy. Not a
test: numbers depend on the machine.

``--ceiling`` adds, per instance count and max batch, a row for the same repository with ``model.py`` replaced by a
model that does no detection: it copies each request's frame once (as the real model copies it into
pinned staging) and answers at once with its outputs holding 12 zero boxes. That row is what Triton's
gRPC frontend and Python backend carry on this machine with these clients, whatever the model does.

    python scripts/bench_serve.py --model M [--frames DIR] [--clients 32] [--client-processes 8] [--seconds 10]
        [--max-batch 1 8] [--instances 1 2 4] [--pipelines 1 4] [--ceiling]

``--max-batch`` is the largest batch Triton forms for an instance; with P pipelines an instance runs
one batch on the GPU while Triton hands it the next.

``--perf-analyzer PATH`` makes Triton's own load generator (``perf_analyzer``, C++, from the
``tritonclient`` 2.51 wheel's ``bin/``) the clients instead of the Python ones: ``--clients`` requests in
flight (``--concurrency-range``), the frames as its ``--input-data``; its throughput and p50 / p99 are
the row's. (Its shared-memory modes refuse the model's optional inputs, so frames go in the messages.)
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
from pointpillars_trt.pointcloud_io import read_points

ASSETS = Path(os.environ.get("PP_ASSETS", "assets"))  # the test assets folder (checkpoints/, kitti/), as the tests read it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ASSETS / "checkpoints/pointpillar_openpcdet_synthetic.pth"))
    parser.add_argument("--frames", default=str(ASSETS / "kitti/training/velodyne_fov"), help="folder of .bin frames")
    parser.add_argument("--clients", type=int, default=32, help="concurrent requests in all")
    parser.add_argument("--client-processes", type=int, default=8, help="processes the clients are spread over")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--max-batch", type=int, nargs="+", default=[1, 8], help="one server run per value")
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--instances", type=int, nargs="+", default=[1], help="one server run per value")
    parser.add_argument("--pipelines", type=int, nargs="*", default=[1],
                        help="per instance; one server run per value (none: only the --ceiling rows)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tritonserver")
    parser.add_argument("--ceiling", action="store_true",
                        help="also a row per instance count and max batch for a model that answers at once (no detection)")
    parser.add_argument("--perf-analyzer", help="perf_analyzer binary: Triton's C++ load generator as the clients")
    args = parser.parse_args()
    frames = [read_points(p) for p in sorted(Path(args.frames).glob("*.bin"))]
    if not frames:
        parser.error(f"--frames {args.frames}: no .bin files")
    install = find_tritonserver(args.tritonserver)
    clients = (f"perf_analyzer, {args.clients} {args.protocol} requests in flight" if args.perf_analyzer else
               f"{args.clients} {args.protocol} clients in {args.client_processes} processes")
    print(f"{len(frames)} frames (mean {np.mean([len(f) for f in frames]):.0f} points), {clients}, "
          f"{args.seconds:g} s each, device {args.device}")
    print(f"{'instances':>9} | {'pipelines':>9} | {'max batch':>9} | {'frames/s':>8} | {'p50 ms':>7} | {'p99 ms':>7} | "
          f"{'mean batch':>10} | errors | {'queue ms':>8} | {'input ms':>8} | {'execute ms':>10} | {'output ms':>9} | "
          f"server cores | client cores")
    print("-" * 162)
    settings: list[tuple[int, int | str, int]] = [
        (i, p, b) for i in args.instances for p in args.pipelines for b in args.max_batch]
    if args.ceiling:
        settings += [(i, "ceiling", b) for i in args.instances for b in args.max_batch]
    if not settings:
        parser.error("nothing to run: give --pipelines a value, or --ceiling")
    for instances, pipelines, max_batch in settings:
        with tempfile.TemporaryDirectory(prefix="pp-bench-serve-") as scratch:
            repository = Path(scratch) / "repo"
            write_repository(args.model, repository, instances=instances,
                             pipelines=pipelines if isinstance(pipelines, int) else 1,
                             max_batch=max_batch, max_queue_delay_us=args.max_queue_delay_us, device=args.device)
            if pipelines == "ceiling":
                (repository / MODEL_NAME / "1" / "model.py").write_text(CEILING_MODEL, encoding="utf-8")
            with TritonServer(repository, install=install, log=Path(scratch) / "server.log") as server:
                if args.perf_analyzer:
                    row = run_perf_analyzer(server, args.perf_analyzer, frames, args.clients, args.seconds,
                                            args.protocol, Path(scratch))
                else:
                    row = run_clients(server, args.frames, args.clients, args.client_processes, args.seconds,
                                      args.protocol)
        print(f"{instances:>9} | {pipelines:>9} | {max_batch:>9} | {row['fps']:>8.1f} | {row['p50']:>7.1f} | "
              f"{row['p99']:>7.1f} | {row['batch']:>10.2f} | {row['errors']} | {row['queue']:>8.2f} | "
              f"{row['input']:>8.2f} | {row['execute']:>10.2f} | {row['output']:>9.2f} | {row['server_cores']:>12.1f} | "
              f"{row['client_cores']:>12.1f}", flush=True)
    return 0


#: The ``--ceiling`` model: the real model's inputs and outputs, no detection (see the module docstring).
#: Tensors cross by DLPack as in the real model, whose hook also silences the stub's capsule renaming.
CEILING_MODEL = '''\
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

DTYPES = {"TYPE_FP32": np.float32, "TYPE_INT32": np.int32}


def _quiet_dlpack_rename(unraisable):
    if isinstance(unraisable.exc_value, ValueError) and "PyCapsule_GetPointer" in str(unraisable.exc_value):
        return
    sys.__unraisablehook__(unraisable)


class TritonPythonModel:
    def initialize(self, args):
        sys.unraisablehook = _quiet_dlpack_rename
        config = json.loads(args["model_config"])
        self.outputs = [(o["name"], DTYPES[o["data_type"]], [1] + [12 if d == -1 else d for d in o["dims"]])
                        for o in config["output"]]
        self.staging = np.empty(1 << 24, np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            points = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "points"))[0]
            self.staging[: points.size] = points.reshape(-1)
            tensors = [pb_utils.Tensor.from_dlpack(name, np.zeros(shape, dtype)) for name, dtype, shape in self.outputs]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''


def run_clients(server: TritonServer, frames_dir: str, clients: int, processes: int, seconds: float,
                protocol: str) -> dict[str, float]:
    """``clients`` closed-loop clients (each sends its next frame once the last came back) spread over
    ``processes`` processes; frames/s over the window all of them were sending, latencies of every request."""
    import multiprocessing

    endpoint = server.endpoints[protocol]
    warm = RemoteDetector(endpoint, protocol=protocol)
    for path in sorted(Path(frames_dir).glob("*.bin"))[:2]:
        warm(read_points(path))  # first-call costs out of the numbers
    warm.close()
    stats_before = server_stats(server)
    assert server.process is not None
    pid = server.process.pid
    window: dict[str, float] = {}

    def sample_server_cpu() -> None:  # at the window's edges, as the clients' own CPU time is taken
        time.sleep(max(0.0, start_at - time.time()))
        window["start"] = tree_cpu_seconds(pid)
        time.sleep(max(0.0, start_at + seconds - time.time()))
        window["end"] = tree_cpu_seconds(pid)

    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 5.0  # every process connected and ready before the window opens
    sampler = threading.Thread(target=sample_server_cpu)
    sampler.start()
    with context.Pool(len(shares)) as pool:
        results = pool.starmap(client_process, [(endpoint, protocol, frames_dir, n, i, start_at, seconds)
                                                for i, n in enumerate(shares) if n])
    sampler.join()
    server_cpu = window["end"] - window["start"]
    latencies = [x for mine, _, _ in results for x in mine]
    errors = sum(e for _, e, _ in results)
    ms = np.array(latencies) * 1e3
    return {"fps": len(latencies) / seconds, "p50": float(np.percentile(ms, 50)) if len(ms) else 0.0,
            "p99": float(np.percentile(ms, 99)) if len(ms) else 0.0, "errors": errors,
            **server_split(server, stats_before),
            "server_cores": server_cpu / seconds, "client_cores": sum(c for _, _, c in results) / seconds}


def client_process(endpoint: str, protocol: str, frames_dir: str, threads: int, offset: int, start_at: float,
                   seconds: float) -> tuple[list[float], int, float]:
    """One process of ``threads`` client threads; (latencies of requests completed inside the window, errors,
    CPU seconds the process spent in the window)."""
    frames = [read_points(p) for p in sorted(Path(frames_dir).glob("*.bin"))]
    remote = RemoteDetector(endpoint, protocol=protocol)
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = start_at + seconds

    def client(index: int) -> None:
        mine: list[float] = []
        while time.time() < stop_at:
            start = time.time()
            try:
                remote(frames[index % len(frames)])
                if start >= start_at and time.time() <= stop_at:
                    mine.append(time.time() - start)
            except Exception:  # noqa: BLE001 - counted, the run goes on
                with lock:
                    errors[0] += 1
            index += 1
        with lock:
            latencies.extend(mine)

    time.sleep(max(0.0, start_at - 1.0 - time.time()))
    workers = [threading.Thread(target=client, args=(offset * 97 + i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu_start = time.process_time()
    for worker in workers:
        worker.join()
    cpu = time.process_time() - cpu_start
    remote.close()
    return latencies, errors[0], cpu


def run_perf_analyzer(server: TritonServer, binary: str, frames: list[np.ndarray], clients: int, seconds: float,
                      protocol: str, scratch: Path) -> dict[str, float]:
    """perf_analyzer at concurrency ``clients``, three windows of ``seconds`` (any spread accepted: a run
    never fails for want of stability); its frames/s and p50 / p99 over them, the server's own split of
    that time, and cores (perf_analyzer's process as the clients')."""
    import base64
    import json
    import subprocess

    data = scratch / "frames.json"
    data.write_text(json.dumps({"data": [
        {"points": {"content": {"b64": base64.b64encode(np.ascontiguousarray(f, np.float32).tobytes()).decode()},
                    "shape": list(f.shape)}} for f in frames]}))
    csv = scratch / "perf.csv"
    command = [binary, "-m", MODEL_NAME, "-u", server.endpoints[protocol], "-i", protocol,
               "--concurrency-range", str(clients), "--input-data", str(data),
               "--measurement-interval", str(int(seconds * 1000)), "--stability-percentage", "999",
               "--max-trials", "3", "-f", str(csv)]
    stats_before = server_stats(server)
    assert server.process is not None
    server_cpu = tree_cpu_seconds(server.process.pid)
    started, before = time.time(), os.times()
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 8 + 120)
    elapsed = time.time() - started
    server_cpu = tree_cpu_seconds(server.process.pid) - server_cpu
    if done.returncode != 0 or not csv.is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise SystemExit(f"error: perf_analyzer failed (exit {done.returncode}): {' | '.join(tail)}")
    header, row = [line.split(",") for line in csv.read_text().splitlines()[:2]]
    found = dict(zip(header, row))
    after = os.times()  # children's times: perf_analyzer's, the one child waited for meanwhile
    client_cpu = after.children_user + after.children_system - before.children_user - before.children_system
    return {"fps": float(found["Inferences/Second"]), "p50": float(found["p50 latency"]) / 1e3,
            "p99": float(found["p99 latency"]) / 1e3, "errors": 0, **server_split(server, stats_before),
            "server_cores": server_cpu / elapsed, "client_cores": client_cpu / elapsed}


def server_split(server: TritonServer, before: dict[str, int]) -> dict[str, float]:
    """Since ``before`` (``server_stats``): the mean batch Triton formed and a request's mean ms queued,
    moving in, in ``execute`` and moving out."""
    stats = {name: after - before[name] for name, after in server_stats(server).items()}
    requests = max(stats["inferences"], 1)
    return {"batch": stats["inferences"] / stats["executions"] if stats["executions"] else 0.0,
            "queue": stats["queue_ns"] / requests / 1e6, "input": stats["compute_input_ns"] / requests / 1e6,
            "execute": stats["compute_infer_ns"] / requests / 1e6, "output": stats["compute_output_ns"] / requests / 1e6}


def server_stats(server: TritonServer) -> dict[str, int]:
    """Triton's running totals for the model: requests, executions, and the nanoseconds requests spent
    queued, moved in, in the model's ``execute`` and moved out (each request of a batch counts the batch's
    whole time)."""
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(server.endpoints["grpc"])
    stats = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
    client.close()
    timings = stats.get("inference_stats", {})
    return {"inferences": int(stats.get("inference_count", 0)), "executions": int(stats.get("execution_count", 0)),
            "queue_ns": int(timings.get("queue", {}).get("ns", 0)),
            **{f"{part}_ns": int(timings.get(part, {}).get("ns", 0))
               for part in ("compute_input", "compute_infer", "compute_output")}}


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live descendants so far, from /proc."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu.get(current, 0.0)
        todo.extend(children.get(current, []))
    return total


if __name__ == "__main__":
    sys.exit(main())
