"""The per-frame step between reading a point file and detecting on it: the KITTI camera-FOV crop.

OpenPCDet evaluates its KITTI models on the points the camera sees (``FOV_POINTS_ONLY``), so KITTI
labels written from a full scan score about 10 AP lower on Car than the same model on the crop.
``infer`` therefore crops by default where its output is meant for KITTI evaluation (``--format
kitti``, ``--eval``), says so once, and lets ``--fov-only`` / ``--no-fov-only`` decide otherwise.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..camera_fov import crop_to_camera_fov
from ..kitti import KITTI_IMAGE_SHAPE, calib_for_frame, image_shape_for_frame, read_calibration

#: ``prepare(points, source) -> points``: what happens to a frame after it is read.
Prepare = Callable[[np.ndarray, str], np.ndarray]

FOV_NOTICE = ("note: KITTI output: only the points the camera sees are detected on (OpenPCDet's "
              "FOV_POINTS_ONLY, as its KITTI evaluation does); --no-fov-only keeps the full scans")


@dataclass(frozen=True)
class CameraFovCrop:
    """Keeps the points of a frame that project into its camera image, with the calibration paired
    to the frame by id (``calib_dir``, else the sibling ``calib/``) and the image size of
    ``image_shape``, else the frame's ``image_2`` PNG, else KITTI's usual 375 x 1242."""

    calib_dir: str | None = None
    image_shape: tuple[int, int] | None = None

    def __call__(self, points: np.ndarray, source: str) -> np.ndarray:
        calib = read_calibration(calib_for_frame(source, self.calib_dir))
        shape = self.image_shape or image_shape_for_frame(source) or KITTI_IMAGE_SHAPE
        return crop_to_camera_fov(points, calib, shape)


def fov_only_default(fmt: str, evaluating: bool, trained_fov_only: bool | None = None) -> bool:
    """The policy without a flag: crop when the output is for KITTI evaluation, unless the model's
    dataset config said its points were not cropped (``trained_fov_only`` False)."""
    return (fmt == "kitti" or evaluating) and trained_fov_only is not False


def frame_preparer(args: argparse.Namespace, fmt: str, note: Callable[[str], None],
                   trained_fov_only: bool | None = None) -> Prepare | None:
    """infer's per-frame step from its options and the model dir's recorded ``fov_points_only``
    (None: frames go to the detector as read); ``note`` receives the one-line notice when the crop
    is on by default."""
    fov_only = getattr(args, "fov_only", None)
    if fov_only is None:
        fov_only = fov_only_default(fmt, bool(getattr(args, "eval", None)), trained_fov_only)
        if fov_only:
            note(FOV_NOTICE)
    if not fov_only:
        return None
    return CameraFovCrop(args.calib, args.image_shape)
