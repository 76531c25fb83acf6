"""Bird's-eye-view PNG of a frame and its boxes: the quickest check that detections sit on objects.

matplotlib is optional (the ``plot`` extra). It is imported only when a plot is asked for, and
only its object-oriented Agg API is used, so the caller's pyplot backend and state are untouched.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator, Sequence

import numpy as np

from ..detections import faces_forward
from ..errors import PointPillarsError, counted, one_line, safe_repr
from ..file_reads import PathLike
from ..file_writes import write_bytes_atomic

_CLASS_COLOURS = {"Car": "tab:red", "Pedestrian": "tab:green", "Cyclist": "tab:orange",
                  # nuScenes (OpenPCDet's names)
                  "car": "tab:red", "truck": "tab:brown", "construction_vehicle": "gold", "bus": "tab:pink",
                  "trailer": "tab:olive", "barrier": "tab:gray", "motorcycle": "tab:cyan", "bicycle": "tab:orange",
                  "pedestrian": "tab:green", "traffic_cone": "tab:blue"}
_OTHER_COLOUR = "tab:purple"


class PlotUnavailableError(PointPillarsError):
    """matplotlib is not installed, or cannot be imported; the caller can skip the PNG and say how to get it."""

#: The PNG "Software" text of this package's pictures: what tells them from a camera image of the same name.
VIZ_SOFTWARE = "pointpillars-trt infer --viz"


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


def require_matplotlib() -> None:
    """Raise PlotUnavailableError now (before any work) when matplotlib cannot be imported: not installed, or
    refusing the backend that $MPLBACKEND names (its import checks it, though the pictures use Agg alone)."""
    try:
        with _temporary_folder_unsaid():
            from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
            from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise PlotUnavailableError(
            "matplotlib is not installed: install matplotlib to get the PNG "
            "(pip install 'pointpillars-trt[plot]')"
        ) from None
    except ValueError as exc:  # matplotlib's import validates $MPLBACKEND and raises for a name it does not know
        raise PlotUnavailableError(
            f"matplotlib cannot be imported with MPLBACKEND={safe_repr(os.environ.get('MPLBACKEND', ''))}: "
            f"{one_line(exc)}; unset MPLBACKEND or set it to Agg"
        ) from None


#: The starts of matplotlib's lines on a default config or cache folder it cannot make or write (~/.config/matplotlib
#: in a read-only home), from which it goes on with a temporary folder, costing a font cache made again each run.
_TEMPORARY_FOLDER_LINES = ("mkdir -p failed for path ", "%s is not a writable directory",
                           "Matplotlib created a temporary cache directory")


@contextlib.contextmanager
def _temporary_folder_unsaid() -> Iterator[None]:
    """matplotlib's import without its three lines on falling back to a temporary folder where its default one
    cannot be written: the pictures are the same, and a run's output is no place for advice on its cache. An
    MPLCONFIGDIR the user set that cannot be written is still said, in matplotlib's words."""
    if os.environ.get("MPLCONFIGDIR"):
        yield
        return
    logger = logging.getLogger("matplotlib")

    def said(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TEMPORARY_FOLDER_LINES)

    logger.addFilter(said)
    try:
        yield
    finally:
        logger.removeFilter(said)


def no_png_line() -> str | None:
    """The ``no PNG: ...`` line of a command whose PNG is optional (demo, bench) when matplotlib cannot be
    imported, saying how to get it; None when it can: the run goes on without the picture, said."""
    try:
        require_matplotlib()
    except PlotUnavailableError as exc:
        return f"no PNG: {exc}"
    return None


#: Boxes labelled at most (the best-scoring ones); the rest keep their outline, coloured by score.
MAX_LABELS = 25
_LABEL_OFFSETS = ((4, 4), (4, -12), (-4, 4), (-4, -12), (0, 12), (0, -20))  # pixels: try in this order


def place_labels(
    anchors: np.ndarray, sizes: np.ndarray, order: Sequence[int], max_labels: int = MAX_LABELS,
    bounds: tuple[float, float, float, float] | None = None,
) -> list[tuple[int, float, float]]:
    """Greedy placement of text labels that do not overlap (display pixels).

    ``anchors`` (N, 2) is each box's anchor point, ``sizes`` (N, 2) each label's width and height;
    labels are tried in ``order`` (best first), each at a few offsets around its anchor, and kept at
    the first offset where it overlaps no label placed before (and lies inside ``bounds`` x0, y0,
    x1, y1 when given); at most ``max_labels`` are kept. Returns (index, x, y) of the lower-left
    corner of each placed label.
    """
    placed: list[tuple[int, float, float]] = []
    rects: list[tuple[float, float, float, float]] = []
    for i in order:
        if len(placed) >= max_labels:
            break
        (ax, ay), (w, h) = anchors[i], sizes[i]
        if not (np.isfinite(ax) and np.isfinite(ay)):
            continue
        for dx, dy in _LABEL_OFFSETS:
            x = ax + dx if dx >= 0 else ax + dx - w
            y = ay + dy
            rect = (x, y, x + w, y + h)
            if bounds is not None and not (bounds[0] <= rect[0] and rect[2] <= bounds[2]
                                           and bounds[1] <= rect[1] and rect[3] <= bounds[3]):
                continue
            if all(rect[2] <= r[0] or r[2] <= rect[0] or rect[3] <= r[1] or r[3] <= rect[1] for r in rects):
                rects.append(rect)
                placed.append((int(i), float(x), float(y)))
                break
    return placed


def plot_bev(
    points: np.ndarray,
    boxes: np.ndarray,
    names: Sequence[str],
    scores: np.ndarray | None,
    path: PathLike,
    point_range: Sequence[float] | None = None,
    title: str = "PointPillars detections (bird's-eye view)",
    max_labels: int = MAX_LABELS,
    velocity: np.ndarray | None = None,
    durable: bool = True,
) -> int:
    """Write ``bev_png``'s picture to ``path`` atomically; ``durable=False`` leaves the file's fsync to a caller
    that flushes a run's files in one pass (``file_writes.write_bytes_atomic``). Returns the number of labels
    drawn."""
    data, labelled = bev_png(points, boxes, names, scores, point_range, title, max_labels, velocity)
    write_bytes_atomic(path, data, durable=durable)
    return labelled


def bev_png(
    points: np.ndarray,
    boxes: np.ndarray,
    names: Sequence[str],
    scores: np.ndarray | None,
    point_range: Sequence[float] | None = None,
    title: str = "PointPillars detections (bird's-eye view)",
    max_labels: int = MAX_LABELS,
    velocity: np.ndarray | None = None,
) -> tuple[bytes, int]:
    """A BEV PNG: points coloured by height (cyan low, magenta high), one outline per box in its
    class colour (legend) with a heading tick and, when there are scores, filled by score (colour bar).

    Points with a non-finite x, y or z are left out (the height colours span the finite ones).
    Only the ``max_labels`` best-scoring boxes get a text label, placed so that labels never
    overlap (a label with no free spot is left out). ``point_range`` (x_min, y_min, z_min, x_max,
    y_max, z_max), e.g. the model's, crops the points and sets the axes; without it the axes cover
    all points and boxes. ``scores`` may be None (ground truth). ``velocity`` (N, 2) m/s, for models
    that predict it, draws the motion over the next second of each box faster than 0.2 m/s as an arrow
    from its centre. Drawn in memory, so that a caller writing it with other files can write them all or none.
    Returns (the PNG's bytes, the number of labels drawn). Raises PlotUnavailableError if matplotlib is missing.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Polygon

    pts = np.asarray(points, dtype=np.float32)
    pts = pts[:, :4] if pts.ndim == 2 else pts.reshape(-1, 4)  # a time column, if any, is not drawn
    pts = pts[np.isfinite(pts[:, :3]).all(axis=1)]  # NaN/inf have no place, and made the height colours NaN
    corners = bev_corners(boxes)
    if velocity is not None:  # float64: a float32 speed near its largest value overflowed np.hypot (a stray warning)
        velocity = np.asarray(velocity, dtype=np.float64)
    if len(names) != len(corners) or (scores is not None and len(scores) != len(corners)):
        raise PointPillarsError(
            f"plot_bev: received {counted(len(corners), 'box', 'boxes')}, {counted(len(names), 'name')} and "
            f"{'no scores' if scores is None else counted(len(scores), 'score')}, expected one name (and score) per box"
        )
    finite = np.isfinite(corners).all(axis=(1, 2))
    if scores is not None:
        finite &= np.isfinite(np.asarray(scores, dtype=np.float64))
    if point_range is not None:
        x0, y0, _, x1, y1, _ = point_range
        inside = (pts[:, 0] >= x0) & (pts[:, 0] <= x1) & (pts[:, 1] >= y0) & (pts[:, 1] <= y1)
        pts = pts[inside]
    else:
        xy = np.concatenate([pts[:, :2], corners[finite].reshape(-1, 2), np.zeros((1, 2))])  # + sensor
        (x0, y0), (x1, y1) = xy.min(axis=0) - 1.0, xy.max(axis=0) + 1.0

    aspect = float(np.clip((y1 - y0) / (x1 - x0), 0.3, 3.0))
    fig = Figure(figsize=(11, 10 * aspect + 0.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_facecolor("black")
    if len(pts):
        z_lo, z_hi = np.percentile(pts[:, 2], [1.0, 99.5])
        ax.scatter(
            pts[:, 0], pts[:, 1], c=pts[:, 2], s=0.3, cmap="cool", vmin=z_lo, vmax=z_hi,
            linewidths=0, rasterized=True,
        )
    score_map = ScalarMappable(norm=Normalize(0.0, 1.0), cmap="YlOrRd") if scores is not None else None
    for i, (quad, name) in enumerate(zip(corners, names)):
        if not finite[i]:
            continue
        colour = _CLASS_COLOURS.get(name, _OTHER_COLOUR)
        if score_map is not None:
            fill = score_map.to_rgba(np.asarray([float(scores[i])]))[0]  # type: ignore[index]
            ax.add_patch(Polygon(quad, closed=True, facecolor=fill, alpha=0.55, edgecolor="none"))
        ring = np.vstack([quad, quad[:1]])
        ax.plot(ring[:, 0], ring[:, 1], color=colour, linewidth=1.0)
        front = quad[:2].mean(axis=0)
        centre = quad.mean(axis=0)
        ax.plot([centre[0], front[0]], [centre[1], front[1]], color=colour, linewidth=1.0)
        if velocity is not None and np.isfinite(velocity[i]).all() and np.hypot(*velocity[i]) > 0.2:
            ax.annotate("", xy=(centre[0] + velocity[i][0], centre[1] + velocity[i][1]), xytext=tuple(centre),
                        arrowprops={"arrowstyle": "->", "color": "white", "linewidth": 0.8})
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal")
    forward = faces_forward(point_range)  # a nuScenes frame's x points right: no direction claimed
    ax.set_xlabel("x (m, forward)" if forward else "x (m)")
    ax.set_ylabel("y (m, left)" if forward else "y (m)")
    ax.set_title(title)
    present = list(dict.fromkeys(n for n, ok in zip(names, finite) if ok))
    if present:
        counts = {n: sum(1 for m, ok in zip(names, finite) if ok and m == n) for n in present}
        handles = [Line2D([], [], color=_CLASS_COLOURS.get(n, _OTHER_COLOUR), label=f"{n} ({counts[n]})")
                   for n in present]
        # below the plot, not over it: in its upper right corner it hid boxes there
        legend = ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=min(len(handles), 6),
                           fontsize=8, facecolor="black", edgecolor="grey", title="class (box outline)",
                           title_fontsize=8)
        for text in legend.get_texts():
            text.set_color("white")
        legend.get_title().set_color("white")
    if score_map is not None:
        fig.colorbar(score_map, ax=ax, label="score (box fill)", fraction=0.04, pad=0.02)
    fig.tight_layout()

    labelled = _draw_labels(fig, ax, corners, names, scores, finite, max_labels)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": VIZ_SOFTWARE})  # whose it is (outputs.foreign_output)
    return buffer.getvalue(), labelled


def _draw_labels(fig, ax, corners: np.ndarray, names: Sequence[str], scores: np.ndarray | None,  # type: ignore[no-untyped-def]
                 finite: np.ndarray, max_labels: int) -> int:
    """Text labels of the best boxes, placed in display pixels after the layout is final."""
    fontsize = 6
    found = np.flatnonzero(finite)
    if not len(found) or max_labels <= 0:
        return 0
    if scores is not None:
        found = found[np.argsort(-np.asarray(scores, dtype=np.float64)[found], kind="stable")]
    index = [int(i) for i in found]
    texts = {i: names[i] if scores is None else f"{names[i]} {float(scores[i]):.2f}" for i in index}
    anchors = np.full((len(corners), 2), np.nan)
    sizes = np.zeros((len(corners), 2))
    px = fontsize * fig.dpi / 72.0  # one em in pixels
    for i in index:
        quad = corners[i]
        anchors[i] = ax.transData.transform((quad[:, 0].max(), quad[:, 1].max()))
        sizes[i] = (0.62 * px * len(texts[i]) + 2, 1.25 * px + 2)
    box = ax.get_window_extent()
    placed = place_labels(anchors, sizes, index, max_labels, (box.x0, box.y0, box.x1, box.y1))
    to_data = ax.transData.inverted()
    for i, x, y in placed:
        colour = _CLASS_COLOURS.get(names[i], _OTHER_COLOUR)
        dx, dy = to_data.transform((x + 1, y + 1))
        ax.text(dx, dy, texts[i], color=colour, fontsize=fontsize, clip_on=True, ha="left", va="bottom")
    return len(placed)
