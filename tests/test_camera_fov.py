"""The KITTI camera field-of-view crop against OpenPCDet's own counts and a hand-made camera.

Oracles: the point counts OpenPCDet's ``get_fov_flag`` keeps on the three full KITTI scans (recorded
in the assets' README with their image sizes), ``get_fov_flag`` written out here in OpenPCDet's
own homogeneous form, and a synthetic pinhole camera whose projections are exact in binary floats.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.camera_fov import camera_fov_mask, crop_to_camera_fov
from pointpillars_trt.errors import InputError
from pointpillars_trt.kitti import Calibration, read_calibration
from pointpillars_trt.pointcloud_io import read_points

# frame id -> (image height, width), points OpenPCDet's get_fov_flag keeps
OPENPCDET_FOV = {"000000": ((370, 1224), 20_259), "000001": ((375, 1242), 18_619), "000002": ((375, 1242), 20_192)}


def openpcdet_fov_flag(points: np.ndarray, calib: Calibration, image_shape: tuple[int, int]) -> np.ndarray:
    """``KittiDataset.get_fov_flag`` as OpenPCDet writes it: lidar -> rect with homogeneous matrices,
    image coordinates divided by the rect depth, depth = projected w minus P2's z translation."""
    hom = np.hstack([points[:, :3].astype(np.float64), np.ones((len(points), 1))])
    v2c = calib.Tr_velo_to_cam
    rect = hom @ v2c.T @ calib.R0_rect.T
    rect_hom = np.hstack([rect, np.ones((len(rect), 1))])
    img_hom = rect_hom @ calib.P2.T
    img = img_hom[:, :2] / rect_hom[:, 2:3]
    depth = img_hom[:, 2] - calib.P2.T[3, 2]
    flag_u = (img[:, 0] >= 0) & (img[:, 0] < image_shape[1])
    flag_v = (img[:, 1] >= 0) & (img[:, 1] < image_shape[0])
    return flag_u & flag_v & (depth >= 0)


@pytest.mark.parametrize("frame", sorted(OPENPCDET_FOV))
def test_full_scans_keep_what_openpcdet_keeps(assets: Path, frame: str) -> None:
    points = read_points(assets / f"kitti/training/velodyne/{frame}.bin")
    calib = read_calibration(assets / f"kitti/training/calib/{frame}.txt")
    shape, kept = OPENPCDET_FOV[frame]
    mask = camera_fov_mask(points, calib, shape)
    assert int(mask.sum()) == kept
    np.testing.assert_array_equal(mask, openpcdet_fov_flag(points, calib, shape))
    cropped = crop_to_camera_fov(points, calib, shape)
    assert cropped.flags.c_contiguous and cropped.dtype == np.float32
    np.testing.assert_array_equal(cropped, points[mask])  # input order kept


def pinhole() -> Calibration:
    """Lidar x forward, y left, z up -> camera x right, y down, z forward; f = 100 px, centre (50, 25)."""
    tr = np.array([[0.0, -1, 0, 0], [0, 0, -1, 0], [1, 0, 0, 0]])
    p2 = np.array([[100.0, 0, 50, 0], [0, 100, 25, 0], [0, 0, 1, 0]])
    return Calibration(P2=p2, R0_rect=np.eye(3), Tr_velo_to_cam=tr)


def test_image_edges_depth_and_nonfinite_points() -> None:
    shape = (50, 100)  # height, width
    points = np.array([
        [10, 0, 0, 1],       # image centre: kept
        [-10, 0, 0, 1],      # behind the camera: dropped
        [10, 5, 0, 1],       # u = 0 exactly: kept
        [10, -5, 0, 1],      # u = 100 = width: dropped
        [10, 0, 2.5, 1],     # v = 0 exactly: kept
        [10, 0, -2.5, 1],    # v = 50 = height: dropped
        [10, 5.01, 0, 1],    # u < 0: dropped
        [np.nan, 0, 0, 1],   # non-finite: dropped
        [0, 0, 0, 1],        # depth 0: u, v undefined: dropped
    ], dtype=np.float32)
    mask = camera_fov_mask(points, pinhole(), shape)
    assert mask.tolist() == [True, False, True, False, True, False, False, False, False]
    assert camera_fov_mask(np.zeros((0, 4), np.float32), pinhole(), shape).shape == (0,)


def test_infinite_points_are_dropped_without_numpy_warnings(assets: Path) -> None:
    """A real scan with infinite coordinates mixed in (a driver's no-return marker): those points are dropped and
    the others kept as OpenPCDet keeps them, without NumPy's "invalid value encountered in matmul" on stderr
    (an infinite coordinate times a calib matrix's 0), which every KITTI-format run of such frames printed."""
    points = read_points(assets / "kitti/training/velodyne/000001.bin")
    calib = read_calibration(assets / "kitti/training/calib/000001.txt")
    shape, _ = OPENPCDET_FOV["000001"]
    marked = points.copy()
    marked[::50, 0] = np.inf
    marked[1::50, 1] = -np.inf
    marked[2::50, 2] = np.nan
    finite = np.isfinite(marked).all(axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mask = camera_fov_mask(marked, calib, shape)
    assert not mask[~finite].any()
    np.testing.assert_array_equal(mask[finite], openpcdet_fov_flag(points[finite], calib, shape))


@pytest.mark.parametrize("shape", [(50, 10**400), (0, 100), (-50, 100), (50.5, 100), ("50", 100), (50, 100, 3)])
def test_an_image_shape_of_no_image_is_refused(shape: tuple) -> None:
    """Each was taken: a side past float's range raised OverflowError, 0 or a negative height kept no point, a
    fraction or text was compared as it was."""
    with pytest.raises(InputError, match="is not a \\(height, width\\) of positive integers"):
        camera_fov_mask(np.zeros((1, 4), np.float32), pinhole(), shape)
