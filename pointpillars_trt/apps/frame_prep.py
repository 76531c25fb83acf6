"""The per-frame step between reading a point file and detecting on it: the KITTI camera-FOV crop.

OpenPCDet evaluates its KITTI models on the points the camera sees (``FOV_POINTS_ONLY``), so KITTI
labels written from a full scan score about 10 AP lower on Car than the same model on the crop.
``infer`` therefore crops by default where its output is meant for KITTI evaluation (``--format
kitti``, ``--eval``), says so once, and lets ``--fov-only`` / ``--no-fov-only`` decide otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..camera_fov import crop_to_camera_fov
from ..detections import MISPLACED_FROM
from ..errors import InputError, safe_repr
from ..kitti import (KITTI_IMAGE_WORDS, calib_for_frame, frame_camera, holds_point, image_path_for_frame,
                     named_as_given, principal_point, read_calibration)

#: ``prepare(points, source) -> points``: what happens to a frame after it is read.
Prepare = Callable[[np.ndarray, str], np.ndarray]


def fov_notice(fmt: str, cropped: bool, *, writes: bool, evaluating: bool) -> str:
    """The run's one note on the camera-view crop it applies by default for KITTI output or --eval
    (``cropped``), or leaves off because the model's dataset config said it was trained on full scans; it names
    what the run does with the detections (``writes`` them to --out, ``evaluating`` them), and no output where
    --eval alone runs (its KITTI lines are its own, not written)."""
    why = " and ".join([*(["KITTI output"] if fmt == "kitti" and writes else []), *(["--eval"] if evaluating else [])])
    done = " and ".join([*(["written"] if writes else []), *(["evaluated"] if evaluating else [])])
    if cropped:
        return (f"note: {why}: only the points the camera sees are detected on, for the detections {done} "
                "(OpenPCDet's FOV_POINTS_ONLY, as its KITTI evaluation does); --no-fov-only keeps the full scans")
    return (f"note: {why}: the full scans are detected on, not only the points the camera sees, for the detections "
            f"{done}: the model was trained on full scans (its dataset config's FOV_POINTS_ONLY: False); --fov-only "
            "crops them")


def assumed_image_note(source: str, uses: str) -> str:
    """The run's one note that a frame without a camera image got KITTI's usual image size for ``uses``
    (its crop, its 2D boxes): a camera of another size (KITTI has 1224 x 370 too) needs --image-shape. The image
    is named as the frame is (``image_path_for_frame``)."""
    return (f"note: {safe_repr(source)}: no camera image {safe_repr(image_path_for_frame(source))} to take "
            f"its size from, so {KITTI_IMAGE_WORDS} is assumed for {uses} (and for every "
            "frame without one); if the camera's image is another size, pass --image-shape H,W (e.g. 370,1224)")


@dataclass(frozen=True)
class CameraFovCrop:
    """Keeps the points of a frame that project into its camera image, with the calibration paired
    to the frame by id (``calib_dir``, else the sibling ``calib/``) and the image size of
    ``image_shape``, else the frame's ``image_2`` PNG, else KITTI's usual 375 x 1242 (the frame is then
    kept in ``assumed`` for ``image_assumed``: the run says so once).

    A calibration can be a true rotation and still wrong (a camera facing backwards): then the crop
    leaves nothing of a frame with points in the model's ``point_range``, and the frame is kept in
    ``emptied`` for ``emptied_warning`` to name its calib file (the reader threads crop; the warning
    is said in input order)."""

    calib_dir: str | None = None
    image_shape: tuple[int, int] | None = None
    point_range: tuple[float, ...] | None = None
    #: source -> (calib file, points in the model's range) of each frame the crop emptied, until asked
    emptied: dict[str, tuple[str, int]] = field(default_factory=dict, compare=False, repr=False)
    #: sources cropped with the assumed KITTI image size (no image_shape, no image_2 PNG), until asked
    assumed: set[str] = field(default_factory=set, compare=False, repr=False)

    def __call__(self, points: np.ndarray, source: str) -> np.ndarray:
        path = calib_for_frame(source, self.calib_dir)
        camera = frame_camera(source, path, self.image_shape)
        if camera.image_assumed:
            self.assumed.add(source)
        kept = crop_to_camera_fov(points, camera.calib, camera.image_shape)
        if not len(kept) and len(points) >= MISPLACED_FROM:
            in_range = _points_in_range(points, self.point_range)
            if in_range >= MISPLACED_FROM:
                self.emptied[source] = (str(path), in_range)
        return kept

    def notes_of(self, source: str) -> tuple[tuple[str, int] | None, bool] | None:
        """In a reader process: what the crop of ``source`` noted (``emptied``, ``assumed``), taken from here
        for the runner's process to ``keep_notes``; None when it noted nothing."""
        emptied = self.emptied.pop(source, None)
        assumed = source in self.assumed
        self.assumed.discard(source)
        return None if emptied is None and not assumed else (emptied, assumed)

    def keep_notes(self, source: str, notes: tuple[tuple[str, int] | None, bool]) -> None:
        """What a reader process's crop of ``source`` noted (``notes_of``), kept as this process's crop would."""
        emptied, assumed = notes
        if emptied is not None:
            self.emptied[source] = emptied
        if assumed:
            self.assumed.add(source)

    def image_assumed(self, source: str) -> bool:
        """Whether ``source`` was cropped to the assumed KITTI image size. Ask once for every frame: the
        answer is forgotten."""
        found = source in self.assumed
        self.assumed.discard(source)
        return found

    def emptied_warning(self, source: str) -> tuple[str, str] | None:
        """("fov", warning) when the crop left nothing of ``source``'s points, naming its calib file as the folder it
        was found in is given (``calib_dir``, else the frame's path: ``named_as_given``); None for any other frame.
        Ask once for every frame: the answer is forgotten."""
        found = self.emptied.pop(source, None)
        if found is None:
            return None
        path, in_range = found
        calib = named_as_given(path, source if self.calib_dir is None else self.calib_dir)
        cause = f"calib file {safe_repr(calib)} puts them all outside the camera image (a camera facing backwards or " \
                "sideways?); check it"
        if self.image_shape is not None:  # the size given is as likely a cause as the calibration
            height, width = self.image_shape
            cause = (f"calib file {safe_repr(calib)} and --image-shape {height},{width} put them all outside the camera "
                     "image (a camera facing backwards or sideways, or an image size too small?); check both")
        return "fov", (f"warning: {safe_repr(source)}: the camera-FOV crop left none of its {in_range} points in the "
                       f"model's range: {cause}, or pass --no-fov-only (warned once)")


def _points_in_range(points: np.ndarray, point_range: Sequence[float] | None) -> int:
    """Finite points inside ``point_range`` (x y z min, then max; None: every finite point)."""
    xyz = np.asarray(points)[:, :3]
    if point_range is None:
        return int(np.isfinite(xyz).all(axis=1).sum())
    return int(((xyz >= point_range[:3]) & (xyz < point_range[3:6])).all(axis=1).sum())


def emptied_warning(prepare: Prepare | None, source: str) -> tuple[str, str] | None:
    """``CameraFovCrop.emptied_warning`` of the run's per-frame step, if it is the crop."""
    return prepare.emptied_warning(source) if isinstance(prepare, CameraFovCrop) else None


def image_assumed(prepare: Prepare | None, source: str) -> bool:
    """``CameraFovCrop.image_assumed`` of the run's per-frame step, if it is the crop."""
    return prepare.image_assumed(source) if isinstance(prepare, CameraFovCrop) else False


def fov_only_default(fmt: str, evaluating: bool, trained_fov_only: bool | None = None) -> bool:
    """The policy without a flag: crop when the output is for KITTI evaluation, unless the model's
    dataset config said its points were not cropped (``trained_fov_only`` False)."""
    return (fmt == "kitti" or evaluating) and trained_fov_only is not False


def frame_preparer(args: argparse.Namespace, fmt: str, note: Callable[[str], None],
                   trained_fov_only: bool | None = None, point_range: Sequence[float] | None = None) -> Prepare | None:
    """infer's per-frame step from its options and the model dir's recorded ``fov_points_only``
    (None: frames go to the detector as read); ``note`` receives the one-line notice of the default for KITTI
    output or --eval (the crop, or none for a model trained on full scans); ``point_range``, the model's, decides which emptied frames are warned about."""
    fov_only = getattr(args, "fov_only", None)
    if fov_only is None:
        evaluating = bool(getattr(args, "eval", None))
        fov_only = fov_only_default(fmt, evaluating, trained_fov_only)
        if fmt == "kitti" or evaluating:
            note(fov_notice(fmt, fov_only, writes=getattr(args, "out", None) is not None, evaluating=evaluating))
    if not fov_only:
        return None
    return CameraFovCrop(args.calib, args.image_shape, None if point_range is None else tuple(point_range))


def check_image_shape(image_shape: tuple[int, int] | None, calib: str | os.PathLike[str] | None) -> None:
    """``--image-shape`` checked against a camera calibration (``calib``: a KITTI calib file, or a folder of them,
    whose first is read; None, or one that cannot be read: no check): its principal point (P2's cx, cy) lies in
    the camera's image, so an image that does not hold it is surely not that camera's, most likely WIDTH,HEIGHT
    given for HEIGHT,WIDTH (1242,375 crops and clips as if the image were 375 pixels wide): refused, with the
    value meant. Else ``say_if_portrait``."""
    if image_shape is None:
        return
    height, width = image_shape
    found = _calib_file(calib) if calib is not None else None
    if found is None:
        say_if_portrait(image_shape)
        return
    try:
        point = principal_point(read_calibration(found))
    except (InputError, OSError):  # the run names a calib file it cannot read where it reads it
        point = None
    if point is not None and not holds_point(image_shape, point):
        meant = (f"did you mean --image-shape {width},{height}?" if holds_point((width, height), point) else
                 "give the size of the camera images this calibration is of")
        raise InputError(f"--image-shape {height},{width} is HEIGHT,WIDTH: an image {width} wide and {height} high, "
                         f"which does not hold the camera's principal point in {safe_repr(os.fspath(found))} (P2: "
                         f"x {point[0]:.0f}, y {point[1]:.0f}): {meant}")
    say_if_portrait(image_shape)


def _calib_file(calib: str | os.PathLike[str]) -> str | None:
    """``calib`` itself, or the first calib file (.txt, by name) of a folder; None when there is none."""
    if not os.path.isdir(calib):
        return os.fspath(calib) if os.path.isfile(calib) else None
    try:
        names = sorted(name for name in os.listdir(calib) if name.endswith(".txt"))
    except OSError:
        return None
    return os.path.join(calib, names[0]) if names else None


def say_if_portrait(image_shape: tuple[int, int] | None) -> None:
    """One ``warning:`` line when ``--image-shape`` is taller than wide: a lidar's camera image is wide
    (KITTI's is 375,1242), so such a value is most likely WIDTH,HEIGHT given the wrong way round, which
    silently moves the camera crop and the 2D boxes' clipping."""
    if image_shape is not None and image_shape[0] > image_shape[1]:
        height, width = image_shape
        print(f"warning: --image-shape {height},{width} is HEIGHT,WIDTH: an image {width} wide and {height} high; "
              f"a camera image is usually wider than high (KITTI's: 375,1242): give {width},{height} if it is "
              f"{height} wide", file=sys.stderr, flush=True)
