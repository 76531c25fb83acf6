"""Measurements: latency over rotated frames, multi-pipeline throughput, soak, device memory."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .stats import latency_summary, median_per_stage


def measure_latency(detect: Callable[[np.ndarray], Any], timings: Callable[[], dict[str, float]],
                    frames: Sequence[np.ndarray], iterations: int, warmup: int,
                    done: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Host-to-host latency of ``detect`` with the frames rotated, after ``warmup`` untimed frames;
    ``done(1)`` after each frame (a progress bar), outside the timed span."""
    for i in range(warmup):
        detect(frames[i % len(frames)])
        if done is not None:
            done(1)
    e2e: list[float] = []
    stages: list[dict[str, float]] = []
    pillars: list[int] = []
    for i in range(iterations):
        frame = frames[i % len(frames)]
        start = time.perf_counter()
        det = detect(frame)
        e2e.append((time.perf_counter() - start) * 1e3)
        stages.append(dict(timings()))
        pillars.append(det.stats.num_pillars)
        if done is not None:
            done(1)
    return {
        "e2e_ms": latency_summary(e2e),
        "stages_ms": median_per_stage(stages),
        "avg_points": float(np.mean([f.shape[0] for f in frames])),
        "avg_pillars": float(np.mean(pillars)) if pillars else 0.0,
        "iterations": iterations,
        "warmup": warmup,
    }


def measure_batches(detect_batch: Callable[[list[np.ndarray]], Any], frames: Sequence[np.ndarray], batch: int,
                    iterations: int, warmup: int) -> dict[str, Any]:
    """Host-to-host latency of one batch of ``batch`` frames (rotated), and the frames per second it gives."""
    def group(i: int) -> list[np.ndarray]:
        return [frames[(i * batch + k) % len(frames)] for k in range(batch)]

    for i in range(warmup):
        detect_batch(group(i))
    times = []
    for i in range(iterations):
        chunk = group(i)
        start = time.perf_counter()
        detect_batch(chunk)
        times.append((time.perf_counter() - start) * 1e3)
    summary = latency_summary(times)
    return {"batch": batch, "batch_ms": summary, "frame_ms_p50": summary["p50"] / batch,
            "fps": 1e3 * batch / summary["p50"], "iterations": iterations, "warmup": warmup}


def measure_throughput(make_pipeline: Callable[[], Any], frames: Sequence[np.ndarray], pipelines: int,
                       frames_per_pipeline: int, batch: int = 1) -> float:
    """Frames per second of ``pipelines`` independent pipelines (own stream each, ``batch`` frames per
    call), one host thread each."""
    workers = [make_pipeline() for _ in range(pipelines)]
    groups = [[frames[(k * batch + j) % len(frames)] for j in range(batch)] for k in range(len(frames))]
    for w in workers:  # warm-up: graphs captured, sessions ready
        for g in groups[:2]:
            w.detect_batch(g)
    barrier = threading.Barrier(pipelines + 1)
    calls = max(1, frames_per_pipeline // batch)

    def work(worker: Any, offset: int) -> None:
        barrier.wait()
        for i in range(calls):
            worker.detect_batch(groups[(offset + i) % len(groups)])

    threads = [threading.Thread(target=work, args=(w, k)) for k, w in enumerate(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for w in workers:
        w.close()
    return pipelines * calls * batch / elapsed


def device_memory_used_mib(release: bool = False) -> float:
    """Device memory in use on the current GPU (cudaMemGetInfo); ``release`` first returns CuPy's cached
    blocks, so that the difference around one engine's pipeline is that engine's footprint."""
    import cupy as cp

    if release:
        cp.cuda.Device().synchronize()
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
    free, total = cp.cuda.runtime.memGetInfo()
    return (total - free) / 2**20


def host_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def soak(detect: Callable[[np.ndarray], Any], frames: Sequence[np.ndarray], count: int) -> dict[str, float]:
    """Run ``count`` frames; report memory at start and end and the drift of the median latency."""
    detect(frames[0])
    dev_start, rss_start = device_memory_used_mib(), host_rss_mib()
    samples = np.empty(count)
    for i in range(count):
        start = time.perf_counter()
        detect(frames[i % len(frames)])
        samples[i] = (time.perf_counter() - start) * 1e3
    tenth = max(1, count // 10)
    return {
        "frames": count,
        "device_mib_start": dev_start, "device_mib_end": device_memory_used_mib(),
        "host_rss_mib_start": rss_start, "host_rss_mib_end": host_rss_mib(),
        "p50_first": float(np.median(samples[:tenth])), "p50_last": float(np.median(samples[-tenth:])),
    }
