"""A frame given on the GPU (CuPy, PyTorch, JAX: anything with DLPack or the CUDA array interface) as the
pipeline takes it, and a multi-sweep frame's time lags checked where they lie, as a host frame's are."""

from __future__ import annotations

import cupy as cp
import numpy as np

from .errors import InputError
from .point_layout import judge_lag_summary, lag_sample, lag_summary
from .points import as_array, wide_rows_problem


def as_device_points(points: object, stream: cp.cuda.Stream, columns: int) -> cp.ndarray:
    """A CuPy view of a device array (CuPy, PyTorch, JAX, anything with DLPack or the CUDA array interface),
    converted under ``stream`` (``points.as_array``)."""
    expected = f"an (N, {columns}) float32 device array"
    with stream:
        arr = as_array(points, "points", expected, cp)
    wide = wide_rows_problem(arr.shape[1], columns) if arr.ndim == 2 else None  # an image, as on the host
    if arr.ndim != 2 or arr.shape[1] < columns or arr.dtype != np.float32 or wide is not None:
        raise InputError(f"points: expected {expected}; got shape {arr.shape}, dtype {arr.dtype}"
                         + (f": {wide}" if wide is not None else ""))
    return arr[:, :columns]


def check_device_time_lags(points: object, columns: int, name: str) -> None:
    """``point_layout.check_time_lags`` of a multi-sweep frame on the GPU (``columns``: the model's, 5), with its
    judgement, messages and warning: the minimum and maximum of its time lags and the sample of them that the
    look for capture times counts are worked out by CuPy's own reductions on the current stream of the frame's
    device and brought back in one read of ~2 KB, which waits for the work queued on that stream before it (the
    frame's producer's, where it made the frame there; PyTorch and JAX, which hand it over by DLPack, order their
    pending work before that stream). Four launches and that read for the usual frame; one with rows of NaN is
    judged by its finite lags, as on the host, from a second summary of a few tens of launches
    (``lag_summary``). The 4th column is copied back only for a frame refused, for the message of swapped
    columns. Input checking before the pipeline, as the host check is. A device array that is no frame of
    ``columns`` float32 values a point is refused as the pipeline refuses it (``as_device_points``)."""
    arr = as_device_points(points, cp.cuda.get_current_stream(), columns)
    with arr.device:
        stream = cp.cuda.get_current_stream()
        lags = arr[:, 4]
        summary = None
        if lags.size:  # the usual frame, no NaN row: its extremes and plain sample, four launches and the read
            summary = cp.concatenate([lags.min()[None], lags.max()[None], lag_sample(lags)]).get(stream=stream)
        if summary is None or np.isnan(summary[0]) or np.isnan(summary[1]):  # rows of NaN: the finite lags'
            summary = lag_summary(lags, cp).get(stream=stream)
        judge_lag_summary(summary, lambda: arr[:, 3].get(stream=stream), name)
