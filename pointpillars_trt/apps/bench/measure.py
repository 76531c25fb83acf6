"""Measurements: latency over rotated frames, multi-pipeline throughput, soak, device memory."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .stats import latency_summary, median_per_stage


def run_for(run: Callable[[int], Any], count: int, seconds: float) -> int:
    """``run(i)`` for i = 0, 1, ... until ``count`` calls and ``seconds`` have both passed; returns the
    calls. Warm-ups take time as well as a count: on a GPU that comes from idle, the clocks (its own
    and the host's) settle over a fraction of a second (trtexec warms up for 200 ms by default). The
    seconds count from the end of the first call: a pipeline's first call (the cuDNN engine's tuning,
    the graph's capture) can take longer than the whole warm-up, which then ended after ``count``
    calls of a machine still coming out of idle."""
    calls = 0
    started: float | None = None
    while calls < count or (seconds > 0 and (started is None or time.perf_counter() - started < seconds)):
        run(calls)
        calls += 1
        if started is None:
            started = time.perf_counter()
    return calls


def measure_latency(detect: Callable[[np.ndarray], Any], timings: Callable[[], dict[str, float]],
                    frames: Sequence[np.ndarray], iterations: int, warmup: int, warmup_s: float = 0.0,
                    done: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Host-to-host latency of ``detect`` with the frames rotated, after ``warmup`` untimed frames and
    ``warmup_s`` seconds; ``done(1)`` after each frame (a progress bar), outside the timed span. The average
    points and pillars are of the same frames: each distinct frame timed once (the whole set once
    ``iterations`` reaches its size), so fewer iterations than frames do not weigh the pillars of a few
    frames against the points of all; ``no_pillar_frames`` counts those of them that made no pillar, and
    ``first_no_pillar_frame`` is the index in ``frames`` of the first of them (None: none)."""
    def untimed(i: int) -> None:
        detect(frames[i % len(frames)])
        if done is not None:
            done(1)

    warmup = run_for(untimed, warmup, warmup_s)
    e2e: list[float] = []
    stages: list[dict[str, float]] = []
    pillars: dict[int, int] = {}  # index of each distinct frame timed -> its pillars
    for i in range(iterations):
        frame = frames[i % len(frames)]
        start = time.perf_counter()
        det = detect(frame)
        e2e.append((time.perf_counter() - start) * 1e3)
        stages.append(dict(timings()))
        pillars[i % len(frames)] = det.stats.num_pillars
        if done is not None:
            done(1)
    return {
        "e2e_ms": latency_summary(e2e),
        "stages_ms": median_per_stage(stages),
        "avg_points": float(np.mean([frames[k].shape[0] for k in pillars])) if pillars else 0.0,
        "avg_pillars": float(np.mean(list(pillars.values()))) if pillars else 0.0,
        "distinct_frames": len(pillars),
        "no_pillar_frames": sum(1 for count in pillars.values() if not count),
        "first_no_pillar_frame": min((k for k, count in pillars.items() if not count), default=None),
        "iterations": iterations,
        "warmup": warmup,
    }


def measure_batches(detect_batch: Callable[[list[np.ndarray]], Any], frames: Sequence[np.ndarray], batch: int,
                    iterations: int, warmup: int, warmup_s: float = 0.0) -> dict[str, Any]:
    """Host-to-host latency of one batch of ``batch`` frames (rotated), and the frames per second it gives."""
    def group(i: int) -> list[np.ndarray]:
        return [frames[(i * batch + k) % len(frames)] for k in range(batch)]

    warmup = run_for(lambda i: detect_batch(group(i)), warmup, warmup_s)
    times = []
    for i in range(iterations):
        chunk = group(i)
        start = time.perf_counter()
        detect_batch(chunk)
        times.append((time.perf_counter() - start) * 1e3)
    summary = latency_summary(times)
    return {"batch": batch, "batch_ms": summary, "frame_ms_p50": summary["p50"] / batch,
            "fps": 1e3 * batch / summary["p50"], "iterations": iterations, "warmup": warmup}


def throughput_batches(frames: Sequence[np.ndarray], batch: int) -> list[list[np.ndarray]]:
    """As many batches as frames, batch k holding the frames from k * ``batch`` on, cycling over the set:
    the calls of the throughput rows (pipelines start at different batches of it)."""
    return [[frames[(k * batch + j) % len(frames)] for j in range(batch)] for k in range(len(frames))]


def measure_throughput(make_pipeline: Callable[[], Any], frames: Sequence[np.ndarray], pipelines: int,
                       frames_per_pipeline: int, batch: int = 1, warmup_s: float = 0.0,
                       seconds: float = 0.0) -> float:
    """Frames per second of ``pipelines`` independent pipelines (own stream each, ``batch`` frames per
    call), one host thread each, after all of them ran together for ``warmup_s`` seconds untimed; each
    then runs ``frames_per_pipeline`` frames and for at least ``seconds`` (a run of a few dozen
    batches lasts ~0.1 s: too short to hold still)."""
    workers = [make_pipeline() for _ in range(pipelines)]
    groups = throughput_batches(frames, batch)
    for w in workers:  # graphs captured, sessions ready
        for g in groups[:2]:
            w.detect_batch(g)
    barrier = threading.Barrier(pipelines + 1)
    calls = max(1, frames_per_pipeline // batch)
    made = [0] * pipelines  # timed calls, per pipeline
    errors: list[BaseException] = []

    def work(worker: Any, index: int) -> None:
        def call(i: int) -> None:  # pipeline `index` starts at its own frame group
            worker.detect_batch(groups[(index + i) % len(groups)])

        try:
            barrier.wait()  # the warm-up, all pipelines at once
            run_for(call, 0, warmup_s)
            barrier.wait()  # then the timed calls, started together
            made[index] = run_for(call, calls, seconds)
        except threading.BrokenBarrierError:
            pass  # another pipeline failed: its error is the one raised
        except BaseException as exc:  # handed to the calling thread, raised there
            errors.append(exc)
            barrier.abort()  # no one waits for this pipeline any more

    threads = [threading.Thread(target=work, args=(w, k)) for k, w in enumerate(workers)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for w in workers:
        w.close()
    if errors:
        raise errors[0]
    return sum(made) * batch / elapsed


def device_memory_used_mib(release: bool = False) -> float:
    """Device memory in use on the current GPU (cudaMemGetInfo); ``release`` first returns CuPy's cached
    blocks. Taken so on both sides of one engine's pipeline, the difference is what the pipeline holds: with the
    blocks its start freed (tuning's, weights' staging) still cached, the same pipeline read 88 or 244 MiB."""
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
