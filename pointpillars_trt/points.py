"""Turning what users pass as a lidar frame into the (N, 4) float32 array the stages expect."""

from __future__ import annotations

import numpy as np

from .errors import InputError


def as_host_points(points: object, source: str = "points") -> np.ndarray:
    """A C-contiguous (N, 4) float32 NumPy array; extra columns (e.g. ring, time) are ignored.

    Float64 input is converted (no information a float32 network could use is lost); anything that is
    not a 2-D float array with at least 4 columns is refused with a message naming ``source``.
    """
    try:
        arr = np.asarray(points)
    except (TypeError, ValueError) as exc:  # ragged lists; device arrays that refuse implicit host copies
        raise InputError(f"{source}: cannot be read as an (N, 4) array of x, y, z, intensity ({exc})") from None
    if arr.ndim != 2 or arr.shape[1] < 4:
        raise InputError(f"{source}: expected an (N, 4) array of x, y, z, intensity; got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"{source}: expected float32 points; got dtype {arr.dtype}")
    return np.ascontiguousarray(arr[:, :4], dtype=np.float32)
