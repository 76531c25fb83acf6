"""Bird's-eye-view PNG of a frame and its boxes: the quickest check that detections sit on objects.

matplotlib is optional (the ``plot`` extra). It is imported only when a plot is asked for, and
only its object-oriented Agg API is used, so the caller's pyplot backend and state are untouched.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from ..errors import PointPillarsError
from ..fileio import PathLike, write_bytes_atomic

_CLASS_COLOURS = {"Car": "tab:red", "Pedestrian": "tab:green", "Cyclist": "tab:orange"}
_OTHER_COLOUR = "tab:purple"


class PlotUnavailableError(PointPillarsError):
    """matplotlib is not installed; the caller can skip the PNG and say how to get it."""


def bev_corners(boxes: np.ndarray) -> np.ndarray:
    """(N, 4, 2) BEV corners of OpenPCDet boxes: front-left, front-right, rear-right, rear-left.

    dx lies along the heading (cos h, sin h), dy across it; "front" is the +dx end.
    """
    b = np.asarray(boxes, dtype=np.float64)
    if b.size == 0:
        b = b.reshape(0, 7)
    if b.ndim != 2 or b.shape[1] != 7:
        raise PointPillarsError(f"boxes: received shape {b.shape}, expected (N, 7)")
    local = np.array([[0.5, 0.5], [0.5, -0.5], [-0.5, -0.5], [-0.5, 0.5]])
    ext = local[None] * b[:, None, 3:5]
    c, s = np.cos(b[:, 6])[:, None], np.sin(b[:, 6])[:, None]
    x = c * ext[..., 0] - s * ext[..., 1] + b[:, None, 0]
    y = s * ext[..., 0] + c * ext[..., 1] + b[:, None, 1]
    return np.stack([x, y], axis=-1)


def plot_bev(
    points: np.ndarray,
    boxes: np.ndarray,
    names: Sequence[str],
    scores: np.ndarray | None,
    path: PathLike,
    point_range: Sequence[float] | None = None,
    title: str = "PointPillars detections (bird's-eye view)",
) -> None:
    """Write a BEV PNG: points coloured by height (cyan low, magenta high), one outline per box with a heading tick.

    ``point_range`` (x_min, y_min, z_min, x_max, y_max, z_max), e.g. the model's, crops the
    points and sets the axes; without it the axes cover all points and boxes. ``scores`` may be
    None (ground truth). Raises PlotUnavailableError if matplotlib is missing.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(
            "matplotlib is not installed: install matplotlib to get the PNG "
            "(pip install 'pointpillars-trt[plot]')"
        ) from None

    pts = np.asarray(points, dtype=np.float32).reshape(-1, 4)
    corners = bev_corners(boxes)
    if len(names) != len(corners) or (scores is not None and len(scores) != len(corners)):
        raise PointPillarsError(
            f"plot_bev: received {len(corners)} boxes, {len(names)} names and "
            f"{'no' if scores is None else len(scores)} scores, expected one name (and score) per box"
        )
    if point_range is not None:
        x0, y0, _, x1, y1, _ = point_range
        inside = (pts[:, 0] >= x0) & (pts[:, 0] <= x1) & (pts[:, 1] >= y0) & (pts[:, 1] <= y1)
        pts = pts[inside]
    else:
        xy = np.concatenate([pts[:, :2], corners.reshape(-1, 2), np.zeros((1, 2))])  # + sensor
        (x0, y0), (x1, y1) = xy.min(axis=0) - 1.0, xy.max(axis=0) + 1.0

    aspect = float(np.clip((y1 - y0) / (x1 - x0), 0.3, 3.0))
    fig = Figure(figsize=(10, 10 * aspect + 0.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_facecolor("black")
    if len(pts):
        z_lo, z_hi = np.percentile(pts[:, 2], [1.0, 99.5])
        ax.scatter(
            pts[:, 0], pts[:, 1], c=pts[:, 2], s=0.3, cmap="cool", vmin=z_lo, vmax=z_hi,
            linewidths=0, rasterized=True,
        )
    for i, (quad, name) in enumerate(zip(corners, names)):
        colour = _CLASS_COLOURS.get(name, _OTHER_COLOUR)
        ring = np.vstack([quad, quad[:1]])
        ax.plot(ring[:, 0], ring[:, 1], color=colour, linewidth=1.0)
        front = quad[:2].mean(axis=0)
        centre = quad.mean(axis=0)
        ax.plot([centre[0], front[0]], [centre[1], front[1]], color=colour, linewidth=1.0)
        label = name if scores is None else f"{name} {float(scores[i]):.2f}"
        ax.text(quad[:, 0].max(), quad[:, 1].max(), label, color=colour, fontsize=6, clip_on=True)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m, forward)")
    ax.set_ylabel("y (m, left)")
    ax.set_title(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    write_bytes_atomic(path, buffer.getvalue())
