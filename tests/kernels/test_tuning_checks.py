"""The cuDNN engine's tuning checks (marked `cuda`): the random fill against its definition, and the
frame-by-frame comparison against NumPy's count of unequal bits and largest differences."""

from __future__ import annotations

import numpy as np
import pytest

BITS = {np.float16: np.uint16, np.float32: np.uint32}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fill_uniform_is_in_the_unit_interval_and_a_function_of_the_seed(cp, dtype):
    from pointpillars_trt.kernels.tuning_checks import TuningChecks

    checks = TuningChecks(dtype)
    stream = cp.cuda.Stream(non_blocking=True)

    def filled(seed: int) -> np.ndarray:
        with stream:
            out = cp.full((3, 70_001), np.nan, dtype)
        checks.fill_uniform(out, seed, stream)
        return cp.asnumpy(out)

    a, again, b = filled(1), filled(1), filled(2)
    values = a.astype(np.float64)  # NumPy's float16 variance would sum in float16
    assert a.dtype == dtype and a.tobytes() == again.tobytes()
    assert ((a >= 0) & (a <= 1)).all() and (a < 1).mean() > 0.999  # float16 rounds values just below 1 up to 1
    assert abs(values.mean() - 0.5) < 0.01 and abs(values.std() - (1 / 12) ** 0.5) < 0.01
    assert (a != b).mean() > 0.99
    assert len(np.unique(a)) > (1_000 if dtype == np.float16 else 150_000)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_compare_frames_counts_bits_and_differences_frame_by_frame(cp, dtype):
    from pointpillars_trt.kernels.tuning_checks import TuningChecks

    rng = np.random.default_rng(0)
    want = rng.uniform(-3, 3, (4, 5, 7, 3)).astype(dtype)
    got = want.copy()
    got[1, 2, 3, 1] += dtype(0.5)       # frame 1: one value off by ~0.5
    got[2, 0, 0, 0] = -want[2, 0, 0, 0]  # frame 2: a sign flipped,
    got[2, 4, 6, 2] = np.nan            # and a NaN
    want[3, 1, 1, 1], got[3, 1, 1, 1] = 0.0, -0.0  # frame 3: zero against negative zero: equal values, other bits
    stream = cp.cuda.Stream(non_blocking=True)
    result = TuningChecks(dtype).compare_frames(cp.asarray(got), cp.asarray(want), stream)

    bits = BITS[dtype]
    unequal = (got.view(bits) != want.view(bits)).reshape(4, -1).sum(axis=1)
    diff = np.abs(got.astype(np.float64) - want).reshape(4, -1)
    worst = np.where(np.isnan(diff), np.inf, diff).max(axis=1)
    np.testing.assert_array_equal(result.unequal, unequal)
    assert list(unequal) == [0, 1, 2, 1]
    np.testing.assert_allclose(result.worst, worst, rtol=1e-6)
    np.testing.assert_allclose(result.scale, np.abs(want.astype(np.float64)).reshape(4, -1).max(axis=1), rtol=1e-6)
    assert not result.exact and not result.within(1e-2)
    same = TuningChecks(dtype).compare_frames(cp.asarray(want), cp.asarray(want), stream)
    assert same.exact and same.within(0.0) and not same.worst.any()


def test_refuses_other_activation_types():
    from pointpillars_trt.kernels.tuning_checks import TuningChecks

    with pytest.raises(ValueError, match="float16 or float32"):
        TuningChecks(np.float64)


def test_a_nan_or_infinity_never_agrees_within_rounding():
    """What the comparison kernel reports for a frame with a NaN or infinity on either side (an infinite
    difference, and for an infinite reference an infinite magnitude): never "close"."""
    from pointpillars_trt.kernels.tuning_checks import FrameComparison

    def compared(worst: float, scale: float) -> FrameComparison:
        return FrameComparison(np.array([0, 3], np.uint32), np.array([0.0, worst], np.float32),
                               np.array([1.0, scale], np.float32))

    assert compared(0.004, 2.0).within(1e-2) and not compared(0.03, 2.0).within(1e-2)
    assert not compared(np.inf, 2.0).within(1e-2)
    assert not compared(np.inf, np.inf).within(1e-2)
    assert not compared(np.inf, np.inf).exact
