"""KITTI files in and out: velodyne .bin frames, calibration, label_2 lines, and atomic writers.

Detections leave the package as KITTI ``label_2`` lines because that is what OpenPCDet's
``generate_prediction_dicts`` writes and what every KITTI evaluation tool reads. Everything the
CLI writes goes through the atomic writers here, so an interrupted run never leaves a torn file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Union

import numpy as np

from .errors import InputError
from .fileio import write_bytes_atomic

PathLike = Union[str, "os.PathLike[str]"]

_POINT_BYTES = 16  # x, y, z, reflectance as little-endian float32
_CALIB_SHAPES = {"P2": (3, 4), "R0_rect": (3, 3), "Tr_velo_to_cam": (3, 4)}
_LABEL_FIELDS = 15  # type, truncated, occluded, alpha, bbox (4), h w l, x y z, rotation_y


# --------------------------------------------------------------------------- velodyne frames

def read_velodyne_bin(path: PathLike) -> np.ndarray:
    """Read a KITTI velodyne frame as (N, 4) float32.

    Values are not checked here: non-finite points are the voxelizer's job (it drops and counts
    them). A 0-byte file is a valid empty frame, not an error.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise InputError(f"velodyne file {name} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"velodyne file {name} is a directory, not a .bin file") from None
    except OSError as e:
        if os.path.isdir(name):
            raise InputError(f"velodyne file {name} is a directory, not a .bin file") from None
        raise InputError(f"velodyne file {name} cannot be read: {e.strerror or e}") from None
    if len(data) % _POINT_BYTES:
        raise InputError(
            f"velodyne file {name} is {len(data)} bytes, not a multiple of {_POINT_BYTES} "
            "(x, y, z, reflectance float32)"
        )
    return np.frombuffer(data, dtype="<f4").astype(np.float32).reshape(-1, 4)


def write_velodyne_bin(points: np.ndarray, path: PathLike) -> None:
    """Write (N, 4) points as a KITTI .bin (little-endian float32), atomically."""
    arr = np.asarray(points)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise InputError(
            f"points: received shape {arr.shape}, expected (N, 4) x, y, z, intensity"
        )
    write_bytes_atomic(path, np.ascontiguousarray(arr, dtype="<f4").tobytes())


# --------------------------------------------------------------------------- calibration

@dataclass(frozen=True, eq=False)
class Calibration:
    """The three matrices of a KITTI object calib file that lidar <-> camera <-> image needs.

    All float64. "rect" is the rectified reference camera frame of KITTI labels
    (x right, y down, z forward).
    """

    P2: np.ndarray  # (3, 4) projection of the left colour camera
    R0_rect: np.ndarray  # (3, 3) rectifying rotation
    Tr_velo_to_cam: np.ndarray  # (3, 4) lidar -> reference camera

    @property
    def velo_to_rect(self) -> np.ndarray:
        """(4, 4) homogeneous lidar -> rect transform, R0_rect @ Tr_velo_to_cam."""
        r0 = np.eye(4)
        r0[:3, :3] = self.R0_rect
        tr = np.eye(4)
        tr[:3, :] = self.Tr_velo_to_cam
        return r0 @ tr

    def lidar_to_rect(self, xyz: np.ndarray) -> np.ndarray:
        """(N, 3) lidar points -> (N, 3) rect camera points."""
        m = self.velo_to_rect
        return np.asarray(xyz, dtype=np.float64) @ m[:3, :3].T + m[:3, 3]

    def rect_to_lidar(self, xyz: np.ndarray) -> np.ndarray:
        """(N, 3) rect camera points -> (N, 3) lidar points (exact inverse, not a transpose)."""
        m = np.linalg.inv(self.velo_to_rect)
        return np.asarray(xyz, dtype=np.float64) @ m[:3, :3].T + m[:3, 3]

    def rect_to_image(self, xyz: np.ndarray) -> np.ndarray:
        """(N, 3) rect camera points -> (N, 2) pixel coordinates (u, v) through P2."""
        pts = np.asarray(xyz, dtype=np.float64)
        uvw = pts @ self.P2[:, :3].T + self.P2[:, 3]
        return uvw[:, :2] / uvw[:, 2:3]


def read_calibration(path: PathLike) -> Calibration:
    """Parse a KITTI object calib .txt (``key: v1 v2 ...`` rows); other keys are ignored."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise InputError(f"calibration file {name} does not exist") from None
    except OSError as e:
        raise InputError(f"calibration file {name} cannot be read: {e.strerror or e}") from None
    rows: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep:
            rows[key.strip()] = rest
    matrices: dict[str, np.ndarray] = {}
    for key, shape in _CALIB_SHAPES.items():
        if key not in rows:
            raise InputError(f"calibration file {name}: key {key} is missing")
        try:
            values = np.array([float(v) for v in rows[key].split()], dtype=np.float64)
        except ValueError:
            raise InputError(f"calibration file {name}: key {key} has a non-numeric value") from None
        if values.size != shape[0] * shape[1]:
            raise InputError(
                f"calibration file {name}: key {key} has {values.size} values, "
                f"expected {shape[0] * shape[1]} ({shape[0]}x{shape[1]})"
            )
        matrices[key] = values.reshape(shape)
    return Calibration(**matrices)


# --------------------------------------------------------------------------- boxes <-> label_2

def _wrap_angle(a: np.ndarray) -> np.ndarray:
    """Wrap to [-pi, pi), the range the KITTI devkit specifies for alpha and rotation_y."""
    return (a + np.pi) % (2 * np.pi) - np.pi


def camera_box_corners(location: np.ndarray, lhw: np.ndarray, ry: np.ndarray) -> np.ndarray:
    """(N, 8, 3) corners in rect camera frame of KITTI boxes (bottom-centre location, l h w, ry).

    rotation_y turns about the camera y axis (pointing down); length lies along local x,
    width along local z, and the box extends from the bottom (y = 0) up to y = -h.
    """
    loc = np.asarray(location, dtype=np.float64).reshape(-1, 3)
    l, h, w = (np.asarray(lhw, dtype=np.float64).reshape(-1, 3)[:, i : i + 1] for i in range(3))
    sx = np.array([1, 1, -1, -1, 1, 1, -1, -1], dtype=np.float64) / 2
    sz = np.array([1, -1, -1, 1, 1, -1, -1, 1], dtype=np.float64) / 2
    top = np.array([0, 0, 0, 0, 1, 1, 1, 1], dtype=np.float64)
    lx, ly, lz = l * sx, -h * top, w * sz
    c, s = np.cos(ry).reshape(-1, 1), np.sin(ry).reshape(-1, 1)
    corners = np.stack([c * lx + s * lz, ly, -s * lx + c * lz], axis=-1)
    return corners + loc[:, None, :]


def lidar_boxes_to_kitti_lines(
    boxes: np.ndarray,
    scores: np.ndarray,
    names: Sequence[str],
    calib: Calibration,
    image_shape: tuple[int, int] | None = None,
) -> list[str]:
    """Detections (OpenPCDet convention) -> KITTI label_2 lines, as OpenPCDet writes predictions.

    Each line: ``type -1 -1 alpha x1 y1 x2 y2 h w l x y z rotation_y score`` with 4 decimals.
    The camera box is the bottom centre in rect coordinates, ry = -heading - pi/2, and
    alpha = ry - atan2(-y, x) of the lidar centre. Both angles are wrapped to [-pi, pi)
    (OpenPCDet leaves them unwrapped; KITTI's evaluation only uses their cosine).
    The 2D box bounds the 8 projected corners, clipped to ``image_shape`` = (height, width)
    when given.
    """
    b = np.asarray(boxes, dtype=np.float64)
    if b.size == 0:
        b = b.reshape(0, 7)
    if b.ndim != 2 or b.shape[1] != 7:
        raise InputError(f"boxes: received shape {b.shape}, expected (N, 7) x y z dx dy dz heading")
    sc = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not (len(b) == len(sc) == len(names)):
        raise InputError(
            f"detections: received {len(b)} boxes, {len(sc)} scores and {len(names)} names, "
            "expected the same count"
        )
    if len(b) == 0:
        return []
    bottom = b[:, :3].copy()
    bottom[:, 2] -= b[:, 5] / 2
    loc = calib.lidar_to_rect(bottom)
    lhw = b[:, [3, 5, 4]]
    ry = _wrap_angle(-b[:, 6] - np.pi / 2)
    alpha = _wrap_angle(ry - np.arctan2(-b[:, 1], b[:, 0]))
    uv = calib.rect_to_image(camera_box_corners(loc, lhw, ry).reshape(-1, 3)).reshape(-1, 8, 2)
    box2d = np.concatenate([uv.min(axis=1), uv.max(axis=1)], axis=1)
    if image_shape is not None:
        height, width = image_shape
        box2d[:, [0, 2]] = np.clip(box2d[:, [0, 2]], 0, width - 1)
        box2d[:, [1, 3]] = np.clip(box2d[:, [1, 3]], 0, height - 1)
    fields = np.concatenate(
        [alpha[:, None], box2d, lhw[:, [1, 2, 0]], loc, ry[:, None], sc[:, None]], axis=1
    )
    return [
        f"{name} -1 -1 " + " ".join(f"{v:.4f}" for v in row) for name, row in zip(names, fields)
    ]


class LabelBoxes(NamedTuple):
    """Objects of a KITTI label file in the lidar frame (OpenPCDet box convention)."""

    names: list[str]
    boxes: np.ndarray  # (N, 7) float32 x, y, z_centre, dx=l, dy=w, dz=h, heading
    scores: np.ndarray  # (N,) float32; NaN where the line has no score (ground truth)


def kitti_label_to_lidar_boxes(
    source: PathLike | Sequence[str], calib: Calibration
) -> LabelBoxes:
    """KITTI label_2 lines (a file path or the lines) -> lidar boxes; DontCare rows are skipped.

    dx = l, dy = w, dz = h, z = bottom + h/2, heading = -(rotation_y + pi/2), after taking the
    bottom centre from rect to lidar with the inverse of R0_rect @ Tr_velo_to_cam.
    """
    if isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
        try:
            lines = Path(name).read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            raise InputError(f"label file {name} does not exist") from None
        except OSError as e:
            raise InputError(f"label file {name} cannot be read: {e.strerror or e}") from None
    else:
        name, lines = "label lines", list(source)
    names: list[str] = []
    rows: list[list[float]] = []
    for number, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts or parts[0] == "DontCare":
            continue
        if len(parts) not in (_LABEL_FIELDS, _LABEL_FIELDS + 1):
            raise InputError(
                f"{name}, line {number}: {len(parts)} fields, expected {_LABEL_FIELDS} "
                f"(or {_LABEL_FIELDS + 1} with a score)"
            )
        try:
            values = [float(v) for v in parts[8:]]
        except ValueError:
            raise InputError(f"{name}, line {number}: a non-numeric value") from None
        names.append(parts[0])
        rows.append(values + [float("nan")] * (_LABEL_FIELDS + 1 - len(parts)))
    table = np.array(rows, dtype=np.float64).reshape(-1, 8)
    h, w, l = table[:, 0], table[:, 1], table[:, 2]
    xyz = calib.rect_to_lidar(table[:, 3:6])
    xyz[:, 2] += h / 2
    heading = -(table[:, 6] + np.pi / 2)
    boxes = np.column_stack([xyz, l, w, h, heading]).astype(np.float32)
    return LabelBoxes(names, boxes, table[:, 7].astype(np.float32))
