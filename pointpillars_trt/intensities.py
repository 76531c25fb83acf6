"""Whether a frame's intensities are on the scale its model was trained on (KITTI's 0-1 reflectance,
nuScenes' 0-255 values): a frame on the other scale gives boxes without an error, all of them poor."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .point_layout import nonnegative_max_bits

_FLOAT32 = struct.Struct("<f")  # a float32 from its bits (as 4 little-endian bytes): no NumPy scalar to make


#: Finite points a frame needs before "all its intensities lie in 0-1" says anything of its scale.
UNIT_INTENSITY_MIN_POINTS = 1000
#: Share of a frame's finite intensities below zero from which they are judged another column (z, mostly
#: negative on the ground; a column order of i, x, y, z; negated values): no reflectance or intensity is negative.
NEGATIVE_SHARE = 0.01
#: Points of the first frame a detector judges the scale of (one warning a detector): a smaller one (a probe)
#: is passed over, not taken as the first.
INTENSITY_JUDGED_FROM = 100


class IntensityMismatch(NamedTuple):
    """What :func:`find_intensity_mismatch` found: the ``kind`` of disagreement and the largest finite intensity
    magnitude it was judged on, which a "beyond" warning names (so the column is not searched again)."""

    kind: str
    largest: float


def intensity_mismatch(points: np.ndarray, expects_unit: bool) -> str | None:
    """How a frame's intensities disagree with the scale its model was trained on, or None: ``"8bit"``
    (finite values in [0, 255] reaching past 1.5, for a 0-1 model), ``"beyond"`` (values past 255 for a 0-1
    model: another point layout or scale), ``"unit"`` (at least UNIT_INTENSITY_MIN_POINTS finite values, all
    within [0, 1], for a 0-255 model), ``"over255"`` (values past 255 for a 0-255 model: 16-bit intensities,
    a scale given twice, another point layout), ``"negative"`` (at least NEGATIVE_SHARE of the finite values
    below zero, within those bounds: another column read as the intensity), ``"zero"`` (at least
    UNIT_INTENSITY_MIN_POINTS values, every one 0: a file written without intensities, zeros in their place).
    One pass over the column (its maximum) for a frame on its model's scale without a negative value."""
    found = find_intensity_mismatch(points, expects_unit)
    return None if found is None else found.kind


def find_intensity_mismatch(points: np.ndarray, expects_unit: bool) -> IntensityMismatch | None:
    """:func:`intensity_mismatch` with the largest finite intensity magnitude it saw, for a warning to name."""
    arr = np.asarray(points)
    if arr.ndim != 2 or arr.shape[1] < 4 or arr.shape[0] == 0:
        return None
    inten = arr[:, 3]
    top = nonnegative_max_bits(inten)
    # no copy; a NaN anywhere makes the float maximum NaN, which passes neither test below
    hi = float(inten.max()) if top is None else _FLOAT32.unpack(top.to_bytes(4, "little"))[0]
    if top and ((hi <= 1.5) if expects_unit else (1.0 < hi <= 255.0)):
        return None  # no negative value (nor NaN) among them, not all 0: the bits' maximum told
    lo = float(inten.min())
    finite = inten.size
    if not (np.isfinite(lo) and np.isfinite(hi)):  # rows of NaN (no return) are skipped
        inten = inten[np.isfinite(inten)]
        if inten.size == 0:
            return None
        lo, hi, finite = float(inten.min()), float(inten.max()), inten.size
    if lo == hi == 0.0 and finite >= UNIT_INTENSITY_MIN_POINTS:  # zeros (+0.0 or -0.0), beside any NaN rows
        return IntensityMismatch("zero", 0.0)
    if expects_unit:
        kind = "beyond" if hi > 255.0 or lo < -255.0 else "8bit" if lo >= 0.0 and hi > 1.5 else None
    else:
        kind = ("over255" if hi > 255.0 or lo < -255.0 else
                "unit" if inten.size >= UNIT_INTENSITY_MIN_POINTS and lo >= 0.0 and hi <= 1.0 else None)
    if kind is None and lo < 0.0 and np.count_nonzero(inten < 0.0) >= NEGATIVE_SHARE * finite:
        return IntensityMismatch("negative", -lo)  # the lowest intensity's magnitude
    return None if kind is None else IntensityMismatch(kind, max(hi, -lo))  # the largest |intensity|


#: What each kind of mismatch says of a frame's intensities; {reach}: how far they reach.
_FINDINGS = {
    "8bit": "look like 0-255 values, but the model expects 0-1 reflectance (KITTI)",
    "beyond": "reach {reach}, but the model expects 0-1 reflectance (KITTI)",
    "unit": "all lie within 0-1, but the model was trained on 0-255 values (nuScenes)",
    "over255": "reach {reach}, but the model was trained on 0-255 values (nuScenes)",
    "negative": "are negative for many points, which no reflectance or intensity is (another column read as the "
                "intensity?)",
    "zero": "are all 0 (written without intensities, zeros in their place?), but the model was trained on them",
}


def mismatch_finding(kind: str, largest: float | None = None) -> str:
    """What a mismatch (``intensity_mismatch``'s ``kind``) says of a frame: "intensities look like ...";
    ``largest``: the largest intensity magnitude found (None: said as "beyond 255")."""
    return "intensities " + _FINDINGS[kind].format(reach="beyond 255" if largest is None else f"{largest:.6g}")


def mismatch_text(kind: str, scale_with: Callable[[str | None], str], layout: str, largest: float | None = None) -> str:
    """The one wording of a mismatch and its fix, wherever it is said: ``scale_with(factor)`` spells how the
    reader of the warning scales the intensities by ``factor`` (None: by one of their choosing) where they
    read it (a keyword of ``read_points``, a CLI option), ``layout`` what sets the point layout there."""
    if kind == "8bit":
        fix = f"{scale_with('1/255')} if they are"
    elif kind == "unit":
        fix = f"{scale_with('255')} if they are 0-1 reflectance"
    elif kind == "negative":
        fix = f"check the point layout ({layout}): x, y, z, intensity in that order; boxes from such frames mean little"
    elif kind == "zero":
        fix = "write each point's intensity (or check the point layout: x, y, z, intensity in that order); boxes " \
              "from such frames mean little"
    else:
        sixteen = " (1/257 for 16-bit 0-65535 values)" if kind == "over255" else ""
        fix = f"check the point layout ({layout}) and {scale_with(None)}{sixteen}; boxes from such frames mean little"
    return f"{mismatch_finding(kind, largest)}: {fix}"
