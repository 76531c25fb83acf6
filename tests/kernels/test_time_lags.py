"""The GPU summary of a multi-sweep frame's time lags (``kernels.time_lags``) against NumPy's minimum, maximum,
NaN count and strided sample of the same values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pointpillars_trt.kernels.time_lags import lag_partials

SAMPLE = 512


def expected(lags: np.ndarray, step: int) -> tuple[float, float, int, np.ndarray]:
    """What the kernel must give, worked out by NumPy: extremes of the lags that are no NaN, the NaN count,
    every ``step``-th lag, NaN past the end."""
    kept = lags[~np.isnan(lags)]
    lo = float(kept.min()) if kept.size else np.inf
    hi = float(kept.max()) if kept.size else -np.inf
    sample = np.full(SAMPLE, np.nan, np.float32)
    taken = lags[::step][:SAMPLE]
    sample[: taken.size] = taken
    return lo, hi, int(np.isnan(lags).sum()), sample


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 7, 511, 4096, 300_001])
@pytest.mark.parametrize("layout", ["rows of 5", "rows of 7, a view of 5", "column-major"])
def test_lag_partials_equal_numpy(cp: Any, rows: int, layout: str) -> None:
    rng = np.random.default_rng(rows)
    values = rng.uniform(-80, 80, (rows, 7)).astype(np.float32)
    values[:, 4] = rng.integers(0, 10, rows) * np.float32(0.05)
    if rows > 7:  # rows of NaN and infinities among them
        values[rng.choice(rows, rows // 7, replace=False), 4] = np.nan
        values[rng.choice(rows, 2, replace=False), 4] = [np.inf, -np.inf]
        values[0, 4] = -0.5  # the minimum on the first row, the maximum on the last: each block's edges
        values[-1, 4] = 3.25
    if layout == "rows of 5":
        device = cp.asarray(np.ascontiguousarray(values[:, :5]))
    elif layout == "rows of 7, a view of 5":
        device = cp.asarray(values)[:, :5]
    else:
        device = cp.asfortranarray(cp.asarray(values[:, :5]))
    step = max(1, -(-rows // SAMPLE))
    stream = cp.cuda.get_current_stream()
    lo, hi, nans, sample = lag_partials(device, step, SAMPLE, stream)
    want = expected(values[:, 4], step)
    assert (lo, hi, nans) == want[:3], ((lo, hi, nans), want[:3])
    np.testing.assert_array_equal(sample, want[3])
