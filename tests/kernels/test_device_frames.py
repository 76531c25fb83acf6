"""The copy of a frame given on the GPU into the pipeline's input buffers (``kernels.device_frames``) against
NumPy's slices of the same values: rows, time lags and header pair, whatever the frame's strides."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pointpillars_trt.errors import InputError
from pointpillars_trt.kernels.device_frames import DeviceFrameCopy

CAPACITY = 1 << 19
SENTINEL = -7.5  # what the buffers hold where no frame is copied


def device_frame(cp: Any, values: np.ndarray, layout: str) -> Any:
    """``values`` (N, 7) on the GPU as a frame of 5 values a point in ``layout``."""
    if layout == "rows of 5":
        return cp.asarray(np.ascontiguousarray(values[:, :5]))
    if layout == "rows of 7, a view of 5":
        return cp.asarray(values)[:, :5]
    if layout == "column-major":
        return cp.asfortranarray(cp.asarray(values[:, :5]))
    assert layout == "rows reversed"
    return cp.asarray(np.ascontiguousarray(values[::-1, :5]))[::-1]


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [0, 1, 255, 257, 300_001])
@pytest.mark.parametrize("layout", ["rows of 5", "rows of 7, a view of 5", "column-major", "rows reversed"])
@pytest.mark.parametrize("with_times", [False, True], ids=["4 columns", "time lags"])
def test_a_frame_lands_in_its_rows_and_header_pair(cp: Any, rows: int, layout: str, with_times: bool) -> None:
    rng = np.random.default_rng(rows)
    values = rng.uniform(-80, 80, (rows, 7)).astype(np.float32)
    frame = device_frame(cp, values, layout)
    if not with_times:
        frame = frame[:, :4]
    buffer = cp.full((CAPACITY, 4), SENTINEL, np.float32)
    times = cp.full(CAPACITY, SENTINEL, np.float32) if with_times else None
    header = cp.full(8, -1, np.int32)
    start, index = 1000, 2
    stream = cp.cuda.get_current_stream()
    DeviceFrameCopy().launch(frame, buffer, times, header, index, start, stream)
    stream.synchronize()

    want = np.full((CAPACITY, 4), SENTINEL, np.float32)
    want[start : start + rows] = values[:, :4]
    np.testing.assert_array_equal(buffer.get(), want)
    if with_times:
        want_times = np.full(CAPACITY, SENTINEL, np.float32)
        want_times[start : start + rows] = values[:, 4]
        np.testing.assert_array_equal(times.get(), want_times)
    np.testing.assert_array_equal(header.get(), [-1, -1, -1, -1, rows, start, -1, -1])


@pytest.mark.cuda
def test_a_frame_past_the_buffers_or_of_too_few_columns_is_refused(cp: Any) -> None:
    buffer, times, header = cp.zeros((64, 4), np.float32), cp.zeros(64, np.float32), cp.zeros(4, np.int32)
    stream = cp.cuda.get_current_stream()
    copy = DeviceFrameCopy()
    with pytest.raises(InputError, match="outside the input buffers"):
        copy.launch(cp.zeros((60, 4), np.float32), buffer, None, header, 0, 8, stream)
    with pytest.raises(InputError, match="outside the input buffers"):
        copy.launch(cp.zeros((4, 4), np.float32), buffer, None, header, 2, 0, stream)
    with pytest.raises(InputError, match=r"expected \(N, >= 5\) float32"):
        copy.launch(cp.zeros((4, 4), np.float32), buffer, times, header, 0, 0, stream)
    with pytest.raises(InputError, match=r"expected \(N, >= 4\) float32 values, got shape \(\)"):
        copy.launch(cp.zeros((), np.float32), buffer, None, header, 0, 0, stream)
    with pytest.raises(InputError, match="expected the pipeline's"):
        copy.launch(cp.zeros((4, 4), np.float32), buffer.astype(np.float64), None, header, 0, 0, stream)
    with pytest.raises(InputError, match="expected the pipeline's"):  # rows of 4 values, but not 16 bytes apart
        copy.launch(cp.zeros((4, 4), np.float32), cp.zeros((64, 8), np.float32)[:, :4], None, header, 0, 0, stream)
    with pytest.raises(InputError, match="^frame 0 of 1 point at row 64: outside"):
        copy.launch(cp.zeros((1, 4), np.float32), buffer, None, header, 0, 64, stream)
