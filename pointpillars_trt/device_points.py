"""A frame given on the GPU (CuPy, PyTorch, JAX: anything with DLPack or the CUDA array interface) as the
pipeline takes it, and a multi-sweep frame's time lags checked where they lie, as a host frame's are."""

from __future__ import annotations

import cupy as cp
import numpy as np

from .errors import InputError
from .kernels.time_lags import lag_partials
from .point_layout import LAG_SAMPLE, judge_lag_summary, lag_sample_step, lag_summary
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


def check_device_time_lags(points: object, columns: int, name: str) -> cp.ndarray:
    """``point_layout.check_time_lags`` of a multi-sweep frame on the GPU (``columns``: the model's, 5), with its
    judgement, messages and warning: the minimum and maximum of its time lags and the sample of them that the
    look for capture times counts are worked out on the current stream of the frame's device by one kernel
    (``kernels.time_lags``) and brought back in one read of ~2 KB, which waits for the work queued on that
    stream before it (the frame's producer's, where it made the frame there; PyTorch and JAX, which hand it over
    by DLPack, order their pending work before that stream). A frame with rows of NaN is judged by its finite
    lags, as on the host, from a second summary (``lag_summary``: a few tens of CuPy launches). The 4th column is
    copied back only for a frame refused, for the message of swapped columns. Input checking before the
    pipeline, as the host check is. A device array that is no frame of ``columns`` float32 values a point is
    refused as the pipeline refuses it (``as_device_points``). Returns the frame as ``as_device_points`` gives
    it, for the pipeline to take without converting it again."""
    arr = as_device_points(points, cp.cuda.get_current_stream(), columns)
    with arr.device:
        stream = cp.cuda.get_current_stream()
        rows = int(arr.shape[0])
        summary = None
        if rows:
            lo, hi, nans, sample = lag_partials(arr, int(lag_sample_step(rows)), LAG_SAMPLE, stream)
            if not nans:  # the usual frame: every lag judged, and its plain sample
                summary = np.concatenate([np.array([lo, hi], np.float32), sample])
        if summary is None:  # no row, or rows of NaN: judged by the finite lags
            summary = lag_summary(arr[:, 4], cp).get(stream=stream)
        judge_lag_summary(summary, lambda: arr[:, 3].get(stream=stream), name)
    return arr
