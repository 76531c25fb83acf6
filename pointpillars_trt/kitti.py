"""KITTI files in and out: velodyne .bin frames written (``pointcloud_io`` reads them), calibration and label_2 lines.

Detections leave the package as KITTI ``label_2`` lines because that is what OpenPCDet's
``generate_prediction_dicts`` writes and what every KITTI evaluation tool reads. The lines are
ready for evaluation: non-finite or absurd detections and boxes outside the camera image are dropped (and
counted), 2D boxes are clipped to the image, angles lie in [-pi, pi). Everything the CLI writes
goes through the atomic writers of ``file_writes``, so an interrupted run never leaves a torn file.

Which calibration (and image size) belongs to a frame: :func:`calib_for_frame` and
:func:`image_shape_for_frame` pair by frame id and refuse a KITTI ``testing`` frame with a
``training`` calibration (their ids overlap).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar, Union, overload

import numpy as np

from .config import int_within, plain_number
from .errors import InputError, counted, safe_repr
from .file_reads import read_file_head, read_regular_file, read_text_lines, special_kind, text_lines
from .file_writes import write_bytes_atomic

PathLike = Union[str, "os.PathLike[str]"]

_CALIB_SHAPES = {"P2": (3, 4), "R0_rect": (3, 3), "Tr_velo_to_cam": (3, 4)}
LABEL_FIELDS = 15  # type, truncated, occluded, alpha, bbox (4), h w l, x y z, rotation_y
_CALIB_MAX_BYTES = 1 << 16
#: How far R R^T may be from I, and det R from +1, in a calib's rotations: KITTI's own are within 1e-6
#: (8 decimals a value); a matrix beyond this is not a rotation (a reflection, a scale, another matrix).
ROTATION_TOLERANCE = 1e-2
#: Metres the lidar may sit from the reference camera (Tr_velo_to_cam's translation): on a car they are
#: well under 2 m apart (KITTI: 0.34 m), so more than this is another unit (millimetres) or another matrix.
MAX_LIDAR_CAMERA_OFFSET = 10.0
#: Largest magnitude of a calib matrix's value: P2's pixels (KITTI: focal lengths ~700, offsets under 400) and the
#: transforms' metres stay far below; beyond, the matrices' products overflow (NumPy's warnings on stderr).
MAX_CALIB_VALUE = 1e6
_LABEL_MAX_BYTES = 1 << 24
#: (height, width) of KITTI object images (most are 375 x 1242; a few sequences 370 x 1224,
#: 374 x 1238 or 376 x 1241). Used when a frame's image_2 PNG is not at hand.
KITTI_IMAGE_SHAPE = (375, 1242)
#: ``KITTI_IMAGE_SHAPE`` as the messages saying it was assumed name it, width first as image sizes are written.
KITTI_IMAGE_WORDS = f"KITTI's usual {KITTI_IMAGE_SHAPE[1]} x {KITTI_IMAGE_SHAPE[0]} image"
#: Largest image width or height taken, in pixels: the most a PNG holds (its IHDR's four-byte sizes). A side
#: past float's range could not be compared with a projected point (OverflowError).
MAX_IMAGE_SIDE = 2**31 - 1
#: A point is in front of the camera when its depth (third coordinate of P2 @ [x y z 1]) exceeds
#: this many metres; box edges crossing that plane are cut there before projecting.
NEAR_DEPTH = 0.01
_SPLITS = ("training", "testing")


# --------------------------------------------------------------------------- velodyne frames

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


def read_calibration(path: PathLike) -> Calibration:
    """Parse a KITTI object calib .txt (``key: v1 v2 ...`` rows); other keys are ignored.

    P2, R0_rect and Tr_velo_to_cam must be all finite and within ``MAX_CALIB_VALUE``, and R0_rect, the 3x3
    rotation part of Tr_velo_to_cam and the 3x3 left part of P2 invertible; R0_rect and that rotation part must be
    rotations (``ROTATION_TOLERANCE``), Tr_velo_to_cam's translation within ``MAX_LIDAR_CAMERA_OFFSET``
    and P2's focal lengths positive, since any other matrix moves every point and box to where no
    camera sees it, silently. Otherwise an InputError names the file and the matrix. A dataset's calib
    files repeat a few calibrations (one a recording day in KITTI), so a text seen before is not parsed
    and checked again: its matrices are shared, read-only.
    """
    data = read_regular_file(path, max_bytes=_CALIB_MAX_BYTES, what="calibration file")
    parsed = _calibration_of(data)
    if isinstance(parsed, str):
        raise InputError(f"calibration file {safe_repr(path)}: {parsed}")
    return parsed


@functools.lru_cache(maxsize=64)
def _calibration_of(data: bytes) -> Calibration | str:
    """``read_calibration``'s parse and checks of a calib file's bytes: the calibration, or what is wrong
    with it (a message without the file name, which the caller puts in front)."""
    if not data.strip():
        return "the file is empty (a copy that failed?); it should hold KITTI's P2, R0_rect and Tr_velo_to_cam"
    head = data[:4096]
    if b"\0" in head or sum(byte > 127 for byte in head) > len(head) // 10:  # UTF-16 text, or binary data
        return ("not a text file (NUL or non-ASCII bytes: binary data, or text in UTF-16); a KITTI calib file is "
                "ASCII lines such as 'P2: ...', 'R0_rect: ...', 'Tr_velo_to_cam: ...'")
    text = data.decode("ascii", errors="replace")
    rows: dict[str, str] = {}
    for line in text_lines(text):
        key, sep, rest = line.partition(":")
        if sep:
            if key.strip() in _CALIB_SHAPES and key.strip() in rows:  # which one is this camera's is unknown
                return f"key {key.strip()} is given twice (two files joined?); give the frame's own KITTI calib file"
            rows[key.strip()] = rest
    if not rows:  # a label file (--calib given the label folder) or other text: "key P2 is missing" named no cause
        fields = len(text_lines(text.strip())[0].split())
        labelled = fields in (LABEL_FIELDS, LABEL_FIELDS + 1)
        label = f" (a first line of {fields} fields, as a label: a label file?)" if labelled else ""
        return (f"no 'key: values' line{label}; a KITTI calib file holds lines such as 'P2: ...', 'R0_rect: ...', "
                "'Tr_velo_to_cam: ...': give the frame's own KITTI calib file")
    matrices: dict[str, np.ndarray] = {}
    for key, shape in _CALIB_SHAPES.items():
        if key not in rows:
            return f"key {key} is missing"
        try:
            values = np.array([float(v) for v in rows[key].split()], dtype=np.float64)
        except ValueError:
            return f"key {key} has a non-numeric value"
        if values.size != shape[0] * shape[1]:
            return (f"key {key} has {counted(values.size, 'value')}, expected {shape[0] * shape[1]} "
                    f"({shape[0]}x{shape[1]})")
        if not np.isfinite(values).all():
            return f"key {key} has a NaN or infinite value"
        if np.abs(values).max() > MAX_CALIB_VALUE:
            return (f"key {key} has the value {values[np.abs(values).argmax()]:.4g}, beyond +-{MAX_CALIB_VALUE:g}, "
                    "which no camera's projection (pixels) or lidar-camera transform (metres) holds: give the "
                    "frame's own KITTI calib file")
        matrices[key] = values.reshape(shape)
        matrices[key].setflags(write=False)  # shared by every frame whose calib file has these bytes
    for key, part in (("R0_rect", "R0_rect"), ("Tr_velo_to_cam", "the rotation part (3x3) of Tr_velo_to_cam"),
                      ("P2", "the left 3x3 part of P2")):
        sv = np.linalg.svd(matrices[key][:, :3], compute_uv=False)
        if not sv[0] > 0 or sv[-1] <= 1e-9 * sv[0]:
            return f"{part} is singular (singular values {sv[0]:.3g} .. {sv[-1]:.3g})"
    for key, part in (("R0_rect", "R0_rect"), ("Tr_velo_to_cam", "the rotation part (3x3) of Tr_velo_to_cam")):
        problem = rotation_problem(matrices[key][:, :3])
        if problem is not None:
            return (f"{part} is not a rotation ({problem}): it would put every point where the camera is not; "
                    "give the frame's own KITTI calib file")
    offset = float(np.linalg.norm(matrices["Tr_velo_to_cam"][:, 3]))
    if offset > MAX_LIDAR_CAMERA_OFFSET:
        return (f"the translation of Tr_velo_to_cam is {offset:.4g} m long, where a car's lidar sits well under "
                f"{MAX_LIDAR_CAMERA_OFFSET:g} m from its camera: give it in metres (millimetres?) as KITTI does")
    focal = matrices["P2"][0, 0], matrices["P2"][1, 1]
    if min(focal) <= 0:
        return (f"P2's focal lengths are {focal[0]:.4g} and {focal[1]:.4g} pixels, expected positive: give the "
                "frame's own KITTI calib file (P2 of the left colour camera)")
    return Calibration(**matrices)


def rotation_problem(m: np.ndarray) -> str | None:
    """What keeps a 3x3 matrix from being a rotation within ``ROTATION_TOLERANCE`` (a reflection, a
    scale, another matrix), or None for a rotation."""
    det = float(np.linalg.det(m))
    error = float(np.abs(m @ m.T - np.eye(3)).max())
    if error <= ROTATION_TOLERANCE and abs(det - 1) <= ROTATION_TOLERANCE:
        return None
    scale = abs(det) ** (1 / 3)
    if scale <= 1e-9:
        return f"singular: determinant {det:.3g}"
    if np.abs(m @ m.T / scale**2 - np.eye(3)).max() > ROTATION_TOLERANCE:
        return f"R R^T differs from the identity by up to {error:.3g}, determinant {det:.4g}"
    if det < 0:
        return f"a reflection: determinant {det:.4g}, an axis flipped"
    return f"a rotation scaled by {scale:.4g} (millimetres?)"


# --------------------------------------------------------------------------- pairing frames with calib/image

def _split_of(path: Path) -> str | None:
    """'training' or 'testing': the nearest folder of that name at or above ``path``."""
    for part in (path, *path.parents):
        if part.name in _SPLITS:
            return part.name
    return None


def named_as_given(path: PathLike, given: PathLike) -> str:
    """``path`` (a file of a frame: its image, its calib file) as ``given`` is named, the path it was found by (the
    frame's, or the calib folder given): relative to this folder where that path is relative, so a message does not
    name one relative and the other absolute."""
    return os.fspath(path) if os.path.isabs(given) else os.path.relpath(path)


def _frame_folder(frame_path: PathLike, given: PathLike | None, sibling: str, what: str) -> tuple[Path, Path, Path]:
    """(frame, folder, default sibling) for a frame; refuses ``given`` from the other KITTI split."""
    frame = Path(os.path.abspath(os.fspath(frame_path)))
    default = frame.parent.parent / sibling
    if given is None:
        return frame, default, default
    refuse_other_split(frame_path, given, what)
    return frame, Path(os.path.abspath(os.fspath(given))), default


def refuse_other_split(frame_path: PathLike, folder: PathLike, what: str) -> None:
    """InputError when ``folder`` (calib, labels) is under KITTI's other split than the frame: ids repeat
    across training and testing, so a file of the same id there is another scene's."""
    frame_split = _split_of(Path(os.path.abspath(os.fspath(frame_path))).parent)
    folder_split = _split_of(Path(os.path.abspath(os.fspath(folder))))
    if frame_split and folder_split and frame_split != folder_split:
        raise InputError(
            f"{what} folder {safe_repr(folder)} belongs to {folder_split!r}, frame {safe_repr(frame_path)} "
            f"to {frame_split!r}: KITTI training and testing ids overlap, so one cannot stand in for the other"
        )


def calib_folder(frame_path: PathLike, calib_dir: PathLike | None = None) -> Path:
    """The folder :func:`calib_for_frame` looks in for the frame's file (``calib_dir``, else the frame's
    sibling ``calib/``); an InputError when it is not there, so that a run can check once a frame folder
    before it starts rather than fail every frame."""
    _, folder, default = _frame_folder(frame_path, calib_dir, "calib", "calib")
    if not folder.is_dir():
        if calib_dir is None:
            shown = named_as_given(default, frame_path)
            raise InputError(
                f"no calibration folder for frame {safe_repr(frame_path)}: {safe_repr(shown)} does not exist "
                "(pass the calib folder: --calib DIR; in Python detect_dataset(..., calib=DIR) or "
                "calib_for_frame(frame, calib_dir=DIR))"
            )
        raise InputError(f"calib folder {safe_repr(calib_dir)} does not exist or is not a folder")
    return folder


def calib_for_frame(frame_path: PathLike, calib_dir: PathLike | None = None) -> Path:
    """The calibration file of a frame: ``<calib folder>/<frame id>.txt``, the id being the stem.

    Without ``calib_dir`` the folder is the frame's sibling ``calib/`` (``.../training/velodyne/
    000134.bin`` -> ``.../training/calib/000134.txt``). A given ``calib_dir`` may be any folder
    holding that id, except one under KITTI's other split: a frame under ``testing/`` with a
    folder under ``training/`` (or the reverse) is refused, since ids repeat across the splits.
    A missing folder or id is an InputError naming the id and the folder (a link to nothing, a link loop or a
    folder in the file's place is no missing id: :func:`read_calibration` names it). Nothing is parsed;
    pass the result to :func:`read_calibration`. The file is named as the path it is found by is given
    (``calib_dir``, else the frame's: ``named_as_given``), so that every message of it names it so.
    """
    folder = calib_folder(frame_path, calib_dir)
    stem = Path(os.path.abspath(os.fspath(frame_path))).stem
    path = Path(named_as_given(folder / f"{stem}.txt", frame_path if calib_dir is None else calib_dir))
    kind = special_kind(path)
    if kind is not None:
        raise InputError(f"calib file {safe_repr(path)} is {kind}, not a regular file")
    if not os.path.lexists(path):
        shown = calib_dir if calib_dir is not None else named_as_given(folder, frame_path)
        raise InputError(f"calib folder {safe_repr(shown)} has no file for frame id {safe_repr(stem)} (expected "
                         f"{safe_repr(path.name)})")
    return path


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png_size(path: PathLike) -> tuple[int, int]:
    """(height, width) from a PNG's IHDR chunk (the first 24 bytes); no image library needed."""
    head = read_file_head(path, 24, what="image file")
    if len(head) < 24 or head[:8] != _PNG_SIGNATURE or head[12:16] != b"IHDR":
        raise InputError(f"image file {safe_repr(path)} is not a PNG (no PNG signature and IHDR chunk)")
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if not (0 < width <= MAX_IMAGE_SIDE and 0 < height <= MAX_IMAGE_SIDE):  # a damaged header: its size would crop
        raise InputError(f"image file {safe_repr(path)} says it is {width} x {height} pixels, which no PNG is "
                         f"(1 to {MAX_IMAGE_SIDE} a side): a damaged header")
    return height, width


def image_path_for_frame(frame_path: PathLike, image_dir: PathLike | None = None) -> Path:
    """Where the frame's camera image is looked for: ``<image folder>/<frame id>.png`` (see
    :func:`image_shape_for_frame`), named as the path it is found by is given (``image_dir``, else the frame's:
    ``named_as_given``), so that every message of it names it so."""
    frame, folder, _ = _frame_folder(frame_path, image_dir, "image_2", "image")
    return Path(named_as_given(folder / f"{frame.stem}.png", frame_path if image_dir is None else image_dir))


def image_shape_for_frame(frame_path: PathLike, image_dir: PathLike | None = None) -> tuple[int, int] | None:
    """(height, width) of the frame's camera image ``<image folder>/<frame id>.png``, or None
    when there is none (then :func:`frame_camera` assumes ``KITTI_IMAGE_SHAPE``).

    The folder is ``image_dir``, else the frame's sibling ``image_2/``; like
    :func:`calib_for_frame`, a folder under the other KITTI split is refused. Only the PNG header
    is read. A file that is there but not a PNG is an InputError, and so is a link to nothing (images on a
    drive not mounted) or in a loop: its frame's size is not KITTI's usual one because its link is broken.
    """
    png = image_path_for_frame(frame_path, image_dir)
    if not os.path.lexists(png):
        return None
    return read_png_size(png)


class FrameCamera(NamedTuple):
    """A frame's camera (``frame_camera``): its calibration, the (height, width) of its image, and whether that
    size was assumed (no ``image_shape`` given, no image_2 PNG: ``KITTI_IMAGE_SHAPE``)."""

    calib: Calibration
    image_shape: tuple[int, int]
    image_assumed: bool


def frame_camera(frame_path: PathLike, calib_file: PathLike,
                 image_shape: tuple[int, int] | None = None) -> FrameCamera:
    """The calibration in ``calib_file`` and the size of the frame's camera image: ``image_shape`` when given,
    else its ``image_2`` PNG's (:func:`image_shape_for_frame`), else ``KITTI_IMAGE_SHAPE`` (then assumed).
    The size decides which points a camera-FOV crop keeps and where 2D boxes are clipped, so a caller
    says when it was assumed: another camera's image (1224 x 370) gives other points and other boxes.

    A PNG that does not hold the calibration's principal point is not that camera's image (another camera's, a
    copy resized or turned): its size would move the crop and the 2D boxes without a word, so it is an InputError
    naming both files (``--image-shape``'s own check is ``frame_prep.check_image_shape``)."""
    calib = read_calibration(calib_file)
    if image_shape is not None:
        return FrameCamera(calib, image_shape, False)
    found = image_shape_for_frame(frame_path)
    if found is None:
        return FrameCamera(calib, KITTI_IMAGE_SHAPE, True)
    point = principal_point(calib)
    if point is not None and not holds_point(found, point):
        height, width = found
        raise InputError(f"image file {safe_repr(image_path_for_frame(frame_path))} is an image {width} wide and "
                         f"{height} high, which does not hold the camera's principal point in {safe_repr(calib_file)} "
                         f"(P2: x {point[0]:.0f}, y {point[1]:.0f}): it is not this camera's image (another camera's, "
                         "or a copy resized or turned); put the camera's own images there, or give their size with "
                         "--image-shape H,W")
    return FrameCamera(calib, found, False)


def principal_point(calib: Calibration) -> tuple[float, float] | None:
    """P2's principal point (x, y) in pixels, which every image of that camera holds; None where P2's depth row
    gives none (its scale not positive)."""
    p2 = calib.P2
    if not p2[2, 2] > 0:
        return None
    return float(p2[0, 2] / p2[2, 2]), float(p2[1, 2] / p2[2, 2])


def holds_point(image_shape: tuple[int, int], point: tuple[float, float]) -> bool:
    """Whether an image of ``image_shape`` (height, width) holds the pixel ``point`` (x, y)."""
    height, width = image_shape
    return 0 <= point[0] < width and 0 <= point[1] < height


# --------------------------------------------------------------------------- boxes <-> label_2

@overload
def normalize_heading(h: float) -> float: ...
@overload
def normalize_heading(h: np.ndarray) -> np.ndarray: ...
def normalize_heading(h: float | np.ndarray) -> float | np.ndarray:
    """Angles (radians) wrapped into [-pi, pi), the one range every output of the package uses
    (JSON headings, KITTI rotation_y and alpha).

    Computed in float64; an array keeps its float dtype (other dtypes become float64). In float32,
    whose nearest values to pi lie outside the range, the ends are the float32 values just inside.
    Non-finite values stay non-finite.
    """
    if isinstance(h, (str, bytes)):
        raise InputError(f"heading {safe_repr(h)}: expected radians (a number or an array of them)")
    a = np.asarray(h, dtype=np.float64)
    out = np.mod(a + np.pi, 2 * np.pi) - np.pi
    out = np.where(out >= np.pi, out - 2 * np.pi, out)  # mod can round up to exactly 2*pi
    if isinstance(h, np.ndarray) and h.dtype.kind == "f" and h.dtype != np.float64:
        dt = h.dtype.type
        hi = np.nextafter(dt(np.pi), dt(0)) if float(dt(np.pi)) >= np.pi else dt(np.pi)
        lo = np.nextafter(dt(-np.pi), dt(0)) if float(dt(-np.pi)) < -np.pi else dt(-np.pi)
        return np.clip(out.astype(h.dtype), lo, hi)
    if isinstance(h, np.ndarray) or out.ndim:  # a list or tuple of angles too
        return out
    return float(out)


def _wrap_angle(a: np.ndarray) -> np.ndarray:
    """``normalize_heading`` in float64 whatever ``a`` is: KITTI lines of float32 boxes keep their angles exact."""
    return normalize_heading(np.asarray(a, dtype=np.float64))


_L = TypeVar("_L", list, np.ndarray, tuple)

#: Metres beyond which a box's centre or size is no object's (a lidar sees a few hundred metres): a network
#: that overflowed on input far outside its training (0-255 intensities) gives such boxes, whose KITTI lines
#: ``parse_label_lines`` (eval) refuses (``MAX_LABEL_VALUE``, however a calibration turns them).
MAX_BOX_METRES = 1e4
#: Metres below which a box's size is none: at the 4 decimals of a label line it reads back as 0.
MIN_BOX_METRES = 1e-3


def written_detections(boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """(N,) bool: which of (N, 7) ``boxes`` and (N,) ``scores`` an output holds: finite, the centre and size within
    ``MAX_BOX_METRES`` and each size at least ``MIN_BOX_METRES`` (the others are the network's overflow)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    with np.errstate(invalid="ignore"):
        sane = (np.abs(b[:, :6]) <= MAX_BOX_METRES).all(axis=1) & (b[:, 3:6] >= MIN_BOX_METRES).all(axis=1)
    return sane & np.isfinite(b[:, 6]) & np.isfinite(np.asarray(scores, dtype=np.float64).reshape(-1))


def finite_detections(
    boxes: np.ndarray, scores: np.ndarray, labels: _L, velocity: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, _L, np.ndarray | None, int]:
    """Drop the detections no output holds (:func:`written_detections`: a NaN or infinity, a box beyond
    ``MAX_BOX_METRES`` or of no size; with ``velocity``, a NaN or infinity in it too): (boxes, scores, labels,
    velocity, dropped).

    ``boxes`` (N, 7), ``scores`` (N,), ``labels`` any sequence of N (names or ids; a list stays a
    list, an array an array), ``velocity`` (N, 2) or None (a multi-head model's, kept with its boxes by the
    same mask, so that the JSON record, the picture and the run's box count hold the same boxes). Use before
    writing any output (JSON is strict and refuses NaN; eval refuses absurd values); report ``dropped`` rather
    than hiding it.
    """
    b = np.asarray(boxes)
    sc = np.asarray(scores).reshape(-1)
    if b.ndim != 2 or not (len(b) == len(sc) == len(labels)) or (velocity is not None and len(velocity) != len(sc)):
        counts = [counted(len(sc), "score"), counted(len(labels), "label")]
        counts += [] if velocity is None else [counted(len(velocity), "velocity", "velocities")]
        raise InputError(f"detections: received boxes of shape {b.shape}, {', '.join(counts[:-1])} and {counts[-1]}, "
                         f"expected (N, 7), {'N' if velocity is None else 'N, N'} and N")
    keep = written_detections(b, sc)
    if velocity is not None:
        finite = np.isfinite(np.asarray(velocity, dtype=np.float64))
        keep &= finite.all(axis=tuple(range(1, finite.ndim)))  # a row's values, however many
    dropped = int(len(keep) - keep.sum())
    if dropped == 0:
        return b, sc, labels, velocity, 0
    if isinstance(labels, np.ndarray):
        kept_labels = labels[keep]
    else:
        kept_labels = type(labels)(v for v, k in zip(labels, keep.tolist()) if k)
    return b[keep], sc[keep], kept_labels, None if velocity is None else velocity[keep], dropped


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


class KittiLines(NamedTuple):
    """KITTI label_2 lines of a frame's detections and what did not make it into them."""

    lines: list[str]
    dropped_out_of_view: int  # boxes behind the camera or wholly outside the image
    dropped_nonfinite: int  # boxes or scores with a NaN or infinity, or absurd boxes (``written_detections``)
    kept: np.ndarray  # (len(lines),) int64 index of each line's detection in the input


_EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4],
                   [0, 4], [1, 5], [2, 6], [3, 7]])


def project_boxes_to_image(
    corners: np.ndarray, calib: Calibration, image_shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(N, 4) x1 y1 x2 y2 image boxes of (N, 8, 3) rect-frame corners, and (N,) whether each is in view.

    The box bounds the projections (through P2) of the corners in front of the camera (depth >
    ``NEAR_DEPTH``) and of the points where box edges cross that depth, so a box reaching behind
    the camera extends to the image border as it should, rather than flipping. It is then clipped
    to x in [0, W-1], y in [0, H-1] (as OpenPCDet's ``boxes3d_kitti_camera_to_imageboxes``). In
    view = some part in front of the camera and the clipped box has a positive area; boxes not in
    view get the clipped box where there is one, else zeros.
    """
    height, width = image_shape
    c = np.asarray(corners, dtype=np.float64).reshape(-1, 8, 3)
    depth = c @ calib.P2[2, :3] + calib.P2[2, 3]  # (N, 8)
    a, b = c[:, _EDGES[:, 0]], c[:, _EDGES[:, 1]]  # (N, 12, 3)
    da, db = depth[:, _EDGES[:, 0]], depth[:, _EDGES[:, 1]]
    crossing = (da > NEAR_DEPTH) != (db > NEAR_DEPTH)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(crossing, (NEAR_DEPTH - da) / (db - da), 0.0)
    cut = a + t[..., None] * (b - a)
    pts = np.concatenate([c, cut], axis=1)  # (N, 20, 3)
    valid = np.concatenate([depth > NEAR_DEPTH, crossing], axis=1)
    uvw = pts @ calib.P2[:, :3].T + calib.P2[:, 3]
    w = np.where(valid, uvw[..., 2], 1.0)
    uv = uvw[..., :2] / w[..., None]
    lo = np.where(valid[..., None], uv, np.inf).min(axis=1)
    hi = np.where(valid[..., None], uv, -np.inf).max(axis=1)
    any_front = valid.any(axis=1)
    box = np.concatenate([lo, hi], axis=1)
    box[~any_front] = 0.0
    box[:, [0, 2]] = np.clip(box[:, [0, 2]], 0, width - 1)
    box[:, [1, 3]] = np.clip(box[:, [1, 3]], 0, height - 1)
    in_view = any_front & (box[:, 2] > box[:, 0]) & (box[:, 3] > box[:, 1])
    return box, in_view


def _angle_text(a: float) -> str:
    """4 decimals, kept inside [-pi, pi] after rounding (3.14159 prints as 3.1415, not 3.1416)."""
    return f"{min(max(round(a, 4), -3.1415), 3.1415):.4f}"


def detections_to_kitti_lines(
    boxes: np.ndarray,
    scores: np.ndarray,
    names: Sequence[str],
    calib: Calibration,
    image_shape: tuple[int, int] | None = None,
    *,
    keep_out_of_view: bool = False,
) -> KittiLines:
    """Detections (OpenPCDet lidar boxes) -> evaluation-ready KITTI label_2 lines and drop counts.

    Each line: ``type -1 -1 alpha x1 y1 x2 y2 h w l x y z rotation_y score`` with 4 decimals, as
    OpenPCDet's ``generate_prediction_dicts`` writes. Location is the box's bottom centre in rect
    camera coordinates, rotation_y = -heading - pi/2, and alpha, KITTI's observation angle, is
    rotation_y - atan2(x, z) of that location (the camera-frame form of OpenPCDet's
    ``-atan2(-y_lidar, x_lidar) + rotation_y``); both wrapped to [-pi, pi) (see
    :func:`normalize_heading`).

    The 2D box is :func:`project_boxes_to_image` of the 8 corners, clipped to ``image_shape`` =
    (height, width) (default ``KITTI_IMAGE_SHAPE``; see :func:`image_shape_for_frame`).
    Detections no output holds (:func:`written_detections`: a non-finite box or score, a box beyond
    ``MAX_BOX_METRES`` or of no size) are always dropped; those whose centre is not in
    front of the camera or whose clipped 2D box has no area are dropped unless
    ``keep_out_of_view`` (they keep a clipped, possibly empty 2D box). Both are counted.
    """
    if isinstance(names, str):  # "Car" would be three classes of one letter
        raise InputError(f"names: the str {safe_repr(names)}, expected a name a box (Detections.names)")
    unnamed = next((name for name in names if not isinstance(name, str)), None)
    if unnamed is not None:  # a label index ("0") is a class no evaluator knows: its boxes would score nothing
        raise InputError(f"names: {safe_repr(str(unnamed))} ({type(unnamed).__name__}) is no class name: pass "
                         "Detections.names, not its labels")
    try:
        b = np.asarray(boxes, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"boxes: a {type(boxes).__name__}, expected an (N, 7) array (Detections.boxes)") from None
    if b.size == 0:
        b = b.reshape(0, 7)
    if b.ndim != 2 or b.shape[1] != 7:
        raise InputError(f"boxes: received shape {b.shape}, expected (N, 7) x y z dx dy dz heading")
    sc = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not (len(b) == len(sc) == len(names)):
        raise InputError(
            f"detections: received {counted(len(b), 'box', 'boxes')}, {counted(len(sc), 'score')} and "
            f"{counted(len(names), 'name')}, "
            "expected the same count"
        )
    height, width = checked_image_shape(KITTI_IMAGE_SHAPE if image_shape is None else image_shape)
    if not isinstance(calib, Calibration):
        raise InputError(f"calib: expected a Calibration (read_calibration), received {type(calib).__name__}")
    spaced = next((name for name in names if not str(name) or len(str(name).split()) != 1), None)
    if spaced is not None:  # a label line's type is one word
        raise InputError(f"names: {safe_repr(spaced)} is no KITTI class name (one word, as Car or Person_sitting)")
    index = np.flatnonzero(written_detections(b, sc))
    dropped_nonfinite = len(b) - len(index)
    b, sc = b[index], sc[index]
    bottom = b[:, :3].copy()
    bottom[:, 2] -= b[:, 5] / 2
    loc = calib.lidar_to_rect(bottom)
    lhw = b[:, [3, 5, 4]]
    ry = _wrap_angle(-b[:, 6] - np.pi / 2)
    alpha = _wrap_angle(ry - np.arctan2(loc[:, 0], loc[:, 2]))
    box2d, in_view = project_boxes_to_image(camera_box_corners(loc, lhw, ry), calib, (height, width))
    centre = loc.copy()
    centre[:, 1] -= lhw[:, 1] / 2
    centre_depth = centre @ calib.P2[2, :3] + calib.P2[2, 3]
    in_view &= centre_depth > NEAR_DEPTH
    keep = np.ones(len(b), dtype=bool) if keep_out_of_view else in_view
    fields = np.concatenate([box2d, lhw[:, [1, 2, 0]], loc], axis=1)
    lines = [
        f"{names[i]} -1 -1 {_angle_text(a)} " + " ".join(f"{v:.4f}" for v in row)
        + f" {_angle_text(r)} {s:.4f}"
        for i, a, row, r, s in zip(index[keep].tolist(), alpha[keep].tolist(), fields[keep], ry[keep].tolist(),
                                   sc[keep].tolist())
    ]
    return KittiLines(lines, int((~keep).sum()), dropped_nonfinite, index[keep].astype(np.int64))


def checked_image_shape(image_shape: object) -> tuple[int, int]:
    """``image_shape`` as the (height, width) ints it holds (NumPy integers, whole floats, a 2-element array
    such as ``np.array(image.shape[:2])`` too), each 1 to ``MAX_IMAGE_SIDE``; anything else is an InputError."""
    shape = tuple(image_shape.tolist()) if isinstance(image_shape, np.ndarray) else image_shape
    sides = [int_within(_whole(side), 1, MAX_IMAGE_SIDE) for side in shape] \
        if isinstance(shape, (tuple, list)) and len(shape) == 2 else []
    if len(sides) != 2 or sides[0] is None or sides[1] is None:
        raise InputError(f"image shape {safe_repr(image_shape)} is not a (height, width) of positive integers "
                         f"(pixels, at most {MAX_IMAGE_SIDE} a side)")
    return sides[0], sides[1]


def _whole(value: object) -> object:
    """A float that holds a whole number (375.0) as that int; anything else as it is."""
    number = plain_number(value)
    return int(number) if isinstance(number, float) and number.is_integer() else number


#: Largest magnitude of any label value (metres, pixels, radians, score). KITTI's own extremes are
#: DontCare's -1000 and image coordinates of a few thousand; far beyond, areas and volumes overflow.
MAX_LABEL_VALUE = 1e5


def parse_label_lines(lines: Sequence[str], source: str, *, with_score: bool | None) -> tuple[list[str], np.ndarray]:
    """KITTI label_2 lines -> (types, (N, 15) float64 values after the type; column 14 is the score).

    ``with_score``: True for predictions, whose 16th field (the score) is required, because a missing score
    would silently rank every detection alike; False for ground truth (15 fields, score 0); None for either
    (a missing score is NaN). A line of another field count, a non-numeric value, a NaN or infinite value,
    a value beyond MAX_LABEL_VALUE, a 2D box that runs backwards or a 3D size of 0 or less (DontCare's -1
    aside) is refused naming ``source`` and the line: any of them would change an AP or a box without a word.
    """
    counts = {True: (LABEL_FIELDS + 1,), False: (LABEL_FIELDS,), None: (LABEL_FIELDS, LABEL_FIELDS + 1)}[with_score]
    expected = " or ".join(str(count) for count in counts)
    names: list[str] = []
    numbers: list[int] = []
    scored: list[bool] = []
    rows: list[list[float]] = []
    for number, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) not in counts:
            raise InputError(f"{source}, line {number}: {counted(len(parts), 'field')}, expected {expected}"
                             + _field_count_hint(parts, with_score))
        try:
            values = [float(v) for v in parts[1:]]
        except ValueError:
            raise InputError(f"{source}, line {number}: a non-numeric value") from None
        names.append(parts[0])
        numbers.append(number)
        scored.append(len(parts) > LABEL_FIELDS)
        rows.append(values if scored[-1] else values + [0.0 if with_score is False else math.nan])
    table = np.array(rows, dtype=np.float64).reshape(-1, LABEL_FIELDS)
    given = table.copy()
    given[~np.array(scored, bool), 14] = 0.0  # a left-out score (NaN in the table) is no bad value
    bad = first_bad_row(given) or _first_misshapen_box(names, table)
    if bad is not None:
        raise InputError(f"{source}, line {numbers[bad[0]]}: {bad[1]}")
    return names, table


def _field_count_hint(parts: Sequence[str], with_score: bool | None) -> str:
    """What a label line of the wrong field count most likely is: a calib file's line, or ground truth (no score)
    given as predictions; else the fields a label line holds."""
    if parts[0].endswith(":"):
        return f" (a line {parts[0]} ... is a calib file's: this is no KITTI label_2 file)"
    if with_score and len(parts) == LABEL_FIELDS:
        return (": a prediction line ends with its score; a line of 15 fields is ground truth, given as predictions "
                "(--pred)?")
    if with_score is False and len(parts) == LABEL_FIELDS + 1:
        return (": ground truth has no score; a line of 16 fields ends with a prediction's, given as labels "
                "(--labels)?")
    return (": type, truncated, occluded, alpha, the 2D box (4), dimensions (3), location (3), rotation_y"
            + (", score" if with_score is not False else ""))


def _first_misshapen_box(names: Sequence[str], table: np.ndarray) -> tuple[int, str] | None:
    """(row, problem) of the first line whose truncation lies outside 0..1 or whose occlusion is no KITTI level
    (they pick an object's difficulty: truncation 5 moved a Car out of "easy" without a word; -1, as DontCare
    and predictions write them, aside), whose 2D box runs backwards (x1 > x2 or y1 > y2) or whose 3D box has a
    zero or negative height, width or length (DontCare's -1 sizes aside), or None."""
    truncated, occluded = table[:, 0], table[:, 1]
    found: list[tuple[int, str]] = []
    odd_truncation = np.flatnonzero((truncated != -1) & ((truncated < 0) | (truncated > 1)))
    if odd_truncation.size:
        row = int(odd_truncation[0])
        found.append((row, f"truncated {truncated[row]:g} lies outside 0..1 (-1: not given)"))
    odd_occlusion = np.flatnonzero(~np.isin(occluded, (-1, 0, 1, 2, 3)))
    if odd_occlusion.size:
        row = int(odd_occlusion[0])
        found.append((row, f"occluded {occluded[row]:g} is no KITTI occlusion level 0, 1, 2 or 3 (-1: not given)"))
    backwards = np.flatnonzero((table[:, 3] > table[:, 5]) | (table[:, 4] > table[:, 6]))
    if backwards.size:
        found.append((int(backwards[0]), "its 2D box runs backwards (left > right or top > bottom)"))
    sized = np.array([name != "DontCare" for name in names], bool)
    unsized = np.flatnonzero(sized & (table[:, 7:10] <= 0).any(axis=1))
    if unsized.size:  # a zero length and width matched any box around it: no object has no size
        row = int(unsized[0])
        h, w, l = table[row, 7:10]
        typed = (f"; a don't-care region is typed DontCare, as KITTI and OpenPCDet's evaluation spell it (not "
                 f"{safe_repr(names[row])})" if names[row].lower() == "dontcare" else "")
        found.append((row, f"a zero or negative height, width or length (h w l = {h:g} {w:g} {l:g}){typed}"))
    return min(found) if found else None


def first_bad_row(table: np.ndarray) -> tuple[int, str] | None:
    """(row, problem) of the first row of a (N, K) table with a NaN, an infinity or a value beyond
    MAX_LABEL_VALUE, or None: label lines and JSON predictions are refused alike, never silently dropped."""
    bad = np.flatnonzero(~np.isfinite(table).all(axis=1))
    if bad.size:
        return int(bad[0]), "a NaN or infinite value"
    huge = np.flatnonzero((np.abs(table) > MAX_LABEL_VALUE).any(axis=1))
    if huge.size:
        return int(huge[0]), f"a value beyond +-{MAX_LABEL_VALUE:g} (no KITTI box, pixel, angle or score is that large)"
    return None


def read_label_file(path: PathLike, *, with_score: bool | None,
                    what: str = "label file") -> tuple[list[str], np.ndarray]:
    """A KITTI label_2 file (ground truth or predictions), read bounded (``read_frame_file``) and checked by
    :func:`parse_label_lines`: (types, (N, 15) values)."""
    lines = read_frame_file(path, what, _LABEL_MAX_BYTES)
    return parse_label_lines(lines, f"{what} {safe_repr(os.fspath(path))}", with_score=with_score)


def read_frame_file(path: PathLike, what: str, max_bytes: int) -> list[str]:
    """The text lines of a frame's file (``file_reads.read_text_lines``); a missing one whose frame id is there
    spelt the other way (``respelt_id``) is named with it: ids listed without KITTI's zero padding
    (``eval --ids``), or ``what``s named without it."""
    try:
        return read_text_lines(path, max_bytes=max_bytes, what=what)
    except InputError as exc:
        there = respelt_id(Path(path))
        if there is None:
            raise
        fix = (f"{ZERO_PADDED_IDS} (give {there.stem}, not {Path(path).stem})" if len(there.stem) == 6 else
               padding_fix(f"{what}s", Path(path).name, there.name))
        raise InputError(f"{exc}; {safe_repr(there.name)} is there: {fix}") from None


#: What a frame id spelt without KITTI's padding (``respelt_id``) is told.
ZERO_PADDED_IDS = "KITTI frame ids are zero-padded to 6 digits"


def padding_fix(files: str, padded: str, unpadded: str) -> str:
    """What to do about ``files`` named without KITTI's zero padding (``unpadded``, where ``padded`` is the name)."""
    return f"{ZERO_PADDED_IDS}; rename the {files} to 6-digit ids ({padded}, not {unpadded})"


def respelt_id(path: Path) -> Path | None:
    """The KITTI file of ``path``'s frame id spelt the other way, zero-padded to 6 digits or not (``0.txt`` and
    ``000000.txt``), when ``path`` is missing and that file is there (ids listed, or files named, without the
    padding); else None."""
    stem = path.stem
    if not (stem.isascii() and stem.isdigit() and len(stem) <= 6) or os.path.lexists(path):
        return None
    other = f"{int(stem):06d}" if len(stem) < 6 else str(int(stem))
    if other == stem:  # six digits, the first no zero: no other spelling
        return None
    there = path.with_name(other + path.suffix)
    return there if there.is_file() else None


class LabelBoxes(NamedTuple):
    """Objects of a KITTI label file in the lidar frame (OpenPCDet box convention)."""

    names: list[str]
    boxes: np.ndarray  # (N, 7) float32 x, y, z_centre, dx=l, dy=w, dz=h, heading
    scores: np.ndarray  # (N,) float32; NaN where the line has no score (ground truth)


def kitti_label_to_lidar_boxes(
    source: PathLike | Sequence[str], calib: Calibration
) -> LabelBoxes:
    """KITTI label_2 lines (a file path or the lines, checked by :func:`parse_label_lines`) -> lidar
    boxes; DontCare rows are skipped.

    dx = l, dy = w, dz = h, z = bottom + h/2, heading = -(rotation_y + pi/2) wrapped to
    [-pi, pi), after taking the bottom centre from rect to lidar with the inverse of
    R0_rect @ Tr_velo_to_cam.
    """
    if isinstance(source, (str, os.PathLike)):
        all_names, table = read_label_file(source, with_score=None)
    else:
        all_names, table = parse_label_lines(list(source), "label lines", with_score=None)
    objects = np.array([kind != "DontCare" for kind in all_names], bool)
    names = [kind for kind, keep in zip(all_names, objects) if keep]
    table = table[objects]
    h, w, l = table[:, 7], table[:, 8], table[:, 9]
    xyz = calib.rect_to_lidar(table[:, 10:13])
    xyz[:, 2] += h / 2
    heading = -(table[:, 13] + np.pi / 2)
    boxes = np.column_stack([xyz, l, w, h, heading]).astype(np.float32)
    boxes[:, 6] = normalize_heading(boxes[:, 6].copy())
    return LabelBoxes(names, boxes, table[:, 14].astype(np.float32))
