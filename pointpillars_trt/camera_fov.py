"""Which lidar points the left colour camera sees: OpenPCDet's KITTI field-of-view policy.

OpenPCDet trains and evaluates its KITTI models on the points that project into the camera
image (``FOV_POINTS_ONLY: True``, ``KittiDataset.get_fov_flag``); a model fed the full 360 degree
scan instead finds boxes behind and beside the car that KITTI's labels never cover, which costs
about 10 AP on Car. This keeps exactly the points ``get_fov_flag`` keeps.
"""

from __future__ import annotations

import numpy as np

from .kitti import Calibration, checked_image_shape


def camera_fov_mask(points: np.ndarray, calib: Calibration, image_shape: tuple[int, int]) -> np.ndarray:
    """(N,) bool: the points in front of the camera whose projection lies in the image.

    As OpenPCDet's ``get_fov_flag``: a lidar point goes to the rectified camera frame, through P2 to
    (u, v) divided by its rectified depth z, and is kept when 0 <= u < width, 0 <= v < height and
    z >= 0. ``image_shape`` is (height, width) in pixels (``checked_image_shape``). Non-finite points are never
    kept.
    """
    height, width = checked_image_shape(image_shape)
    xyz = np.asarray(points)[:, :3]
    finite = np.isfinite(xyz).all(axis=1)
    if not finite.all():  # an infinite coordinate times a matrix's 0 is NaN, with NumPy's warning on stderr
        mask = np.zeros(len(xyz), bool)
        mask[finite] = camera_fov_mask(xyz[finite], calib, image_shape)
        return mask
    rect = calib.lidar_to_rect(xyz)
    depth = rect[:, 2]
    projected = rect @ calib.P2[:, :3].T + calib.P2[:, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        u, v = projected[:, 0] / depth, projected[:, 1] / depth
        return (depth >= 0) & (u >= 0) & (u < width) & (v >= 0) & (v < height)


def crop_to_camera_fov(points: np.ndarray, calib: Calibration, image_shape: tuple[int, int]) -> np.ndarray:
    """The rows of ``points`` (N, 4) that :func:`camera_fov_mask` keeps, in their input order."""
    return np.ascontiguousarray(points[camera_fov_mask(points, calib, image_shape)])
