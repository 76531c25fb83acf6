"""NumPy voxelization, point decoration and scatter: the CPU path and the oracle of the CUDA kernels.

Every number is computed the way both checkpoint families compute it:
grid indices, pillar centres and means in float32, pillars in first-point order, points in input order.
Only the order of the float32 sum behind the pillar mean is our choice (PyTorch does not specify its
reduction order): we add the slots one after another, so a kernel that sums sequentially matches us
bit for bit and one that sums in another order differs by a few ulp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig, VoxelConfig
from ..errors import InputError
from ..graph_io import OVERFLOWED_FEATURE
from ..points import columns_text


@dataclass(frozen=True, eq=False)
class Pillars:
    """Voxelizer output for one frame (P pillars, M = max points per pillar, C feature channels).

    ``features`` (P, M, C) float32 in ``cfg.features.order``, padded slots all zero;
    ``coords`` (P, 4) int32 as (batch=0, iz, iy, ix); ``num_points`` (P,) int32 (at most M).
    The counters say what was dropped where, so a caller can tell a sparse frame from a clipped one.
    """

    features: np.ndarray
    coords: np.ndarray
    num_points: np.ndarray
    num_input_points: int
    num_nonfinite: int        # rows with NaN/inf in any column, dropped first
    num_in_range: int         # finite points that pass the range filter and fall inside the grid
    num_pillars_total: int    # non-empty pillars before the max_pillars cut
    num_pillars_dropped: int  # pillars past max_pillars (the last ones in first-point order)

    @property
    def num_pillars(self) -> int:
        return int(self.coords.shape[0])


def voxelize(points: np.ndarray, cfg: ModelConfig) -> Pillars:
    """Group a (N, point columns) float32 frame into decorated pillars exactly as the config's family does."""
    _check_points(points, cfg)
    v = cfg.voxel
    finite = np.logical_and.reduce([np.isfinite(points[:, i]) for i in range(points.shape[1])])
    pts = points[finite]
    index, inside = _grid_index(pts, v)
    pts, index = pts[inside], index[inside]
    slots = _group(index, v)
    first = index[slots.first_point]
    coords = np.zeros((first.shape[0], 4), np.int32)
    coords[:, 1:] = first[:, ::-1]
    features = np.zeros((first.shape[0], v.max_points_per_pillar, cfg.features.channels), np.float32)
    decorated = _decorate(pts[slots.point], slots.pillar, slots.num_points, first, cfg)
    features[slots.pillar, slots.rank] = decorated
    return Pillars(
        features=features,
        coords=coords,
        num_points=slots.num_points,
        num_input_points=int(points.shape[0]),
        num_nonfinite=int(points.shape[0] - np.count_nonzero(finite)),
        num_in_range=int(pts.shape[0]),
        num_pillars_total=slots.total,
        num_pillars_dropped=slots.total - int(first.shape[0]),
    )


def scatter(pillar_features: np.ndarray, coords: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Place each pillar's feature vector on the BEV canvas (1, Cf, ny, nx); empty cells stay zero.

    ``coords`` are (batch, iz, iy, ix) rows as ``voxelize`` makes them, one pillar per cell.
    """
    if (not isinstance(pillar_features, np.ndarray) or pillar_features.ndim != 2
            or pillar_features.dtype != np.float32):
        raise InputError(
            f"pillar_features: expected a float32 array of shape (P, Cf), received {_describe(pillar_features)}"
        )
    p, channels = pillar_features.shape
    if (not isinstance(coords, np.ndarray) or coords.shape != (p, 4)
            or not np.issubdtype(coords.dtype, np.integer)):
        raise InputError(
            f"coords: expected an integer array of shape ({p}, 4), received {_describe(coords)}"
        )
    nx, ny, _ = cfg.voxel.grid
    iy, ix = coords[:, 2].astype(np.int64), coords[:, 3].astype(np.int64)
    if p and (iy.min() < 0 or iy.max() >= ny or ix.min() < 0 or ix.max() >= nx):
        raise InputError(f"coords: (iy, ix) must lie in [0, {ny}) x [0, {nx}), received values outside")
    canvas = np.zeros((channels, ny * nx), np.float32)
    canvas[:, iy * nx + ix] = pillar_features.T
    return canvas.reshape(1, channels, ny, nx)


def overflowed_features(pillar_features: np.ndarray) -> int:
    """How many pillar features (the PFN's outputs, pillars x channels) are NaN, infinite or beyond
    ``OVERFLOWED_FEATURE``: a point value far outside the network's training reached it there."""
    with np.errstate(invalid="ignore"):
        return int(pillar_features.size - np.count_nonzero(np.abs(pillar_features) <= np.float32(OVERFLOWED_FEATURE)))


def _describe(a: object) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__


def _check_points(points: np.ndarray, cfg: ModelConfig) -> None:
    columns = cfg.num_point_columns
    if (not isinstance(points, np.ndarray) or points.dtype != np.float32
            or points.ndim != 2 or points.shape[1] != columns):
        raise InputError(
            f"points: expected a float32 array of shape (N, {columns}) ({columns_text(columns)}), "
            f"received {_describe(points)}"
        )


def _grid_index(pts: np.ndarray, v: VoxelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3) int64 cell (ix, iy, iz) and the mask of points kept by the range filter and the grid.

    The index is floor((p - min) / size) on float32 operands, as spconv and mmcv compute it; float64
    would move points near pillar edges into the neighbouring pillar.
    """
    lo = np.asarray(v.point_range[:3], np.float32)
    hi = np.asarray(v.point_range[3:], np.float32)
    size = np.asarray(v.pillar_size, np.float32)
    keep = np.ones(pts.shape[0], bool)
    cells = []
    for axis in range(3):  # per column: reductions over short rows are slow in NumPy
        p = pts[:, axis]
        if v.range_filter == "strict_xyz":
            keep &= (p > lo[axis]) & (p < hi[axis])
        elif axis < 2:
            keep &= (p >= lo[axis]) & (p <= hi[axis])
        with np.errstate(over="ignore"):  # |p| near float32 max: inf, then outside the grid
            cell = np.floor((p - lo[axis]) / size[axis])
        keep &= (cell >= 0) & (cell < v.grid[axis])
        cells.append(cell)
    index = np.zeros((pts.shape[0], 3), np.int64)
    index[keep] = np.stack(cells, axis=1)[keep]  # cast only in-grid cells: unchecked z may be huge
    return index, keep


@dataclass(frozen=True, eq=False)
class _Slots:
    """Where each kept point goes: features[pillar, rank] = points[point]."""

    point: np.ndarray
    pillar: np.ndarray
    rank: np.ndarray
    first_point: np.ndarray  # (P,) index of each pillar's first point
    num_points: np.ndarray   # (P,) int32
    total: int               # pillars before the max_pillars cut


def _group(index: np.ndarray, v: VoxelConfig) -> _Slots:
    """Pillars numbered by first point, points ranked in input order, both limits applied.

    A stable sort by cell keeps input order inside each cell, so a cell's first sorted entry is its
    first point and rank = sorted position - segment start.
    """
    nx, ny, _ = v.grid
    key = (index[:, 2] * ny + index[:, 1]) * nx + index[:, 0]
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    is_start = np.ones(key.shape[0], bool)
    is_start[1:] = sorted_key[1:] != sorted_key[:-1]
    starts = np.flatnonzero(is_start)
    counts = np.diff(np.append(starts, key.shape[0]))
    segment = np.cumsum(is_start) - 1                    # segment of each sorted point
    by_first = np.argsort(order[starts], kind="stable")  # segments in first-point order
    pillar_of_segment = np.empty_like(by_first)
    pillar_of_segment[by_first] = np.arange(by_first.shape[0])
    pillar = pillar_of_segment[segment]
    rank = np.arange(key.shape[0]) - starts[segment]
    kept = by_first[: v.max_pillars]
    keep = (rank < v.max_points_per_pillar) & (pillar < v.max_pillars)
    return _Slots(
        point=order[keep],
        pillar=pillar[keep],
        rank=rank[keep],
        first_point=order[starts[kept]],
        num_points=np.minimum(counts[kept], v.max_points_per_pillar).astype(np.int32),
        total=int(starts.shape[0]),
    )


def _decorate(
    pts: np.ndarray, pillar: np.ndarray, num_points: np.ndarray, cell: np.ndarray, cfg: ModelConfig
) -> np.ndarray:
    """(n, point columns) kept points of ``pillar`` -> (n, C) features in ``cfg.features.order``, float32 as the families.

    mean = float32 sum of the pillar's kept points in slot order / float32 count (the families sum all
    M slots, but the padded ones are zeros and change no float32 sum); centre = float32(i) *
    float32(size) + float32(size / 2 + min), the offset rounded once from float64.
    """
    v = cfg.voxel
    xyz = pts[:, :3]
    sums = np.zeros((num_points.shape[0], 3), np.float32)
    np.add.at(sums, pillar, xyz)  # unbuffered, in index order: a sequential sum per pillar
    mean = sums / num_points.astype(np.float32)[:, None]
    size = np.asarray(v.pillar_size, np.float32)
    offset = np.asarray([s / 2 + lo for s, lo in zip(v.pillar_size, v.point_range[:3])], np.float32)
    centre = cell.astype(np.float32) * size + offset
    mean_d = xyz - mean[pillar]
    center_d = xyz - centre[pillar]
    columns = {name: pts[:, i] for i, name in enumerate(cfg.point_columns)}
    columns.update({
        "mean_dx": mean_d[:, 0], "mean_dy": mean_d[:, 1], "mean_dz": mean_d[:, 2],
        "center_dx": center_d[:, 0], "center_dy": center_d[:, 1], "center_dz": center_d[:, 2],
    })
    return np.stack([columns[name] for name in cfg.features.order], axis=-1)
