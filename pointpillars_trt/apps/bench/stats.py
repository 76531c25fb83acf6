"""Latency summaries: the numbers a latency table shows, from a list of per-frame milliseconds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = ("min", "p50", "p90", "p99")


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(samples_ms, dtype=np.float64)
    if arr.size == 0:
        return {k: float("nan") for k in (*PERCENTILES, "mean")}
    return {
        "min": float(arr.min()),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
    }


def median_per_stage(timings: Sequence[dict[str, float]]) -> dict[str, float]:
    """Median over frames of each stage's time (stages present in every frame)."""
    if not timings:
        return {}
    keys = [k for k in timings[0] if all(k in t for t in timings)]
    return {k: float(np.median([t[k] for t in timings])) for k in keys}
