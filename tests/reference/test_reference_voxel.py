"""The NumPy voxelizer and scatter against a per-point brute force written from the assets README.

The brute force walks the points one by one in Python floats. A float32 operation is emulated as the
float64 operation on float32 values rounded once to float32, which is exact for + - * / (float64 has
more than 2 * 24 + 2 bits of mantissa), so it checks the library's float32 numerics bit for bit without
sharing its NumPy code. Float64 versions of the features bound how far float32 is from the real numbers.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.config import ModelConfig
from pointpillars_trt.errors import InputError
from pointpillars_trt.reference import Pillars, overflowed_features, scatter, voxelize

_F32 = struct.Struct("<f")


def f32(x: float) -> float:
    """Round a Python float to the nearest float32 (inf past float32's range)."""
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


@dataclasses.dataclass
class Expected:
    features32: np.ndarray  # float32 arithmetic as the families do it
    features64: np.ndarray  # the same formulas in float64
    coords: np.ndarray
    num_points: np.ndarray
    num_nonfinite: int
    num_in_range: int
    num_pillars_total: int


Cells = dict[tuple[int, int, int], list[list[float]]]


def brute_cells(points: np.ndarray, cfg: ModelConfig) -> tuple[Cells, int]:
    """cell (ix, iy, iz) -> rows in input order (dict order = first-point order), and the non-finite count."""
    v = cfg.voxel
    lo = [f32(a) for a in v.point_range[:3]]
    hi = [f32(a) for a in v.point_range[3:]]
    size = [f32(s) for s in v.pillar_size]
    cells: Cells = {}
    nonfinite = 0
    for row in points.tolist():
        if not all(math.isfinite(c) for c in row):
            nonfinite += 1
            continue
        if v.range_filter == "strict_xyz":
            inside = all(lo[a] < row[a] < hi[a] for a in range(3))
        else:
            inside = all(lo[a] <= row[a] <= hi[a] for a in range(2))
        q = [f32(f32(row[a] - lo[a]) / size[a]) for a in range(3)]
        if inside and all(0 <= q[a] < v.grid[a] for a in range(3)):
            cells.setdefault((math.floor(q[0]), math.floor(q[1]), math.floor(q[2])), []).append(row)
    return cells, nonfinite


def family_features(row: list[float], mean: list[float], centre: list[float], family: str,
                    sub: Callable[[float, float], float]) -> list[float]:
    """The decorated point of each family, as listed in the assets README."""
    x, y, z, r = row
    md = [sub(row[a], mean[a]) for a in range(3)]
    cd = [sub(row[a], centre[a]) for a in range(3)]
    if family == "openpcdet":
        return [x, y, z, r, *md, *cd]
    if family == "zhulf0804":
        return [cd[0], cd[1], z, r, *md, cd[0], cd[1]]
    raise AssertionError(f"no brute force for family {family}")


def brute_voxelize(points: np.ndarray, cfg: ModelConfig) -> Expected:
    v = cfg.voxel
    m, c = v.max_points_per_pillar, cfg.features.channels
    cells, nonfinite = brute_cells(points, cfg)
    kept = list(cells.items())[: v.max_pillars]
    p = len(kept)
    out32, out64 = np.zeros((p, m, c), np.float32), np.zeros((p, m, c), np.float64)
    coords, num_points = np.zeros((p, 4), np.int32), np.zeros(p, np.int32)
    for i, (cell, rows) in enumerate(kept):
        rows = rows[:m]
        n = len(rows)
        coords[i] = (0, cell[2], cell[1], cell[0])
        num_points[i] = n
        mean32, mean64, centre32, centre64 = [], [], [], []
        for a in range(3):
            s = 0.0
            for row in rows:
                s = f32(s + row[a])
            mean32.append(f32(s / n))
            mean64.append(math.fsum(row[a] for row in rows) / n)
            size, lo = v.pillar_size[a], v.point_range[a]
            centre32.append(f32(f32(cell[a] * f32(size)) + f32(size / 2 + lo)))
            centre64.append(cell[a] * size + size / 2 + lo)
        for j, row in enumerate(rows):
            out32[i, j] = family_features(row, mean32, centre32, cfg.family, lambda a, b: f32(a - b))
            out64[i, j] = family_features(row, mean64, centre64, cfg.family, lambda a, b: a - b)
    return Expected(out32, out64, coords, num_points, nonfinite,
                    sum(len(r) for r in cells.values()), len(cells))


def check(points: np.ndarray, cfg: ModelConfig) -> tuple[Pillars, Expected]:
    got, want = voxelize(points, cfg), brute_voxelize(points, cfg)
    m, c = cfg.voxel.max_points_per_pillar, cfg.features.channels
    p = want.coords.shape[0]
    assert got.features.shape == (p, m, c) and got.features.dtype == np.float32
    assert got.coords.dtype == np.int32 and got.num_points.dtype == np.int32
    np.testing.assert_array_equal(got.coords, want.coords)
    np.testing.assert_array_equal(got.num_points, want.num_points)
    np.testing.assert_array_equal(got.features, want.features32)  # bit for bit, padded slots zero
    # float32 against the real numbers: |x| <= 80 m, a sequential sum of <= 32 such values, so the
    # mean is off by at most 31 * 2**-24 * 32 * 80 / n + 1 ulp; 1e-3 m bounds every channel.
    np.testing.assert_allclose(got.features, want.features64, rtol=0, atol=1e-3)
    assert got.num_input_points == points.shape[0]
    assert got.num_nonfinite == want.num_nonfinite
    assert got.num_in_range == want.num_in_range
    assert got.num_pillars_total == want.num_pillars_total
    assert got.num_pillars_dropped == want.num_pillars_total - p
    assert got.num_pillars == p
    return got, want


@pytest.fixture(params=["openpcdet_cfg", "zhulf_cfg"])
def cfg(request: pytest.FixtureRequest) -> ModelConfig:
    return request.getfixturevalue(request.param)


def small(cfg: ModelConfig, max_points: int, max_pillars: int) -> ModelConfig:
    voxel = dataclasses.replace(cfg.voxel, max_points_per_pillar=max_points, max_pillars=max_pillars)
    return dataclasses.replace(cfg, voxel=voxel)


def awkward_cloud(cfg: ModelConfig, seed: int) -> np.ndarray:
    """Points outside the range, on range and pillar edges, non-finite rows, duplicates, dense pillars."""
    rng = np.random.default_rng(seed)
    v = cfg.voxel
    lo, hi, size = np.array(v.point_range[:3]), np.array(v.point_range[3:]), np.array(v.pillar_size)
    spread = rng.uniform([*(lo - [3, 3, 1]), 0], [*(hi + [3, 3, 1]), 1], size=(300, 4))
    # three clumps of 40 points, each inside one pillar, near the grid's corner and middle
    clumps = []
    for cell in ([0, 0], [5, 7], [200, 300]):
        xy = lo[:2] + (np.array(cell) + rng.uniform(0.05, 0.95, size=(40, 2))) * size[:2]
        clumps.append(np.column_stack([xy, rng.uniform(-2.5, 0.5, 40), rng.uniform(0, 1, 40)]))
    # exact range edges and pillar edges (as float32 values), z on and off its edges
    ks = rng.integers(0, 50, size=(80, 2))
    edge_x = np.concatenate([[lo[0], hi[0]], lo[0] + ks[:, 0] * size[0]])
    edge_y = np.concatenate([[lo[1], hi[1]], lo[1] + ks[:, 1] * size[1]])
    edge_z = np.array([lo[2], hi[2], np.nextafter(np.float32(hi[2]), np.float32(0)), -1.0, 0.0])
    edges = np.column_stack([
        rng.choice(edge_x, 120), rng.choice(edge_y, 120), rng.choice(edge_z, 120), rng.uniform(0, 1, 120),
    ])
    cloud = np.concatenate([spread, *clumps, edges]).astype(np.float32)
    bad = cloud[rng.integers(0, len(cloud), 12)].copy()
    bad[np.arange(12), rng.integers(0, 4, 12)] = rng.choice([np.nan, np.inf, -np.inf], 12)
    huge = np.array([[1.0, 0.5, 3e38, 0.2], [-0.0, 0.5, 0.0, 0.2]], np.float32)  # huge z; x = -0
    dupes = cloud[rng.integers(0, len(cloud), 30)]
    cloud = np.concatenate([cloud, bad, huge, dupes])
    return cloud[rng.permutation(len(cloud))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_awkward_cloud_default_limits(cfg: ModelConfig, seed: int) -> None:
    got, want = check(awkward_cloud(cfg, seed), cfg)
    assert got.num_nonfinite == 12 and got.num_pillars > 50
    assert got.num_points.max() == 32  # the clumps fill their pillars


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_awkward_cloud_small_limits(cfg: ModelConfig, seed: int) -> None:
    cfg = small(cfg, max_points=5, max_pillars=40)
    got, want = check(awkward_cloud(cfg, seed), cfg)
    assert got.num_pillars == 40 and got.num_pillars_dropped > 0
    assert got.num_points.max() == 5


def test_float32_index_differs_from_float64(cfg: ModelConfig) -> None:
    """Points on pillar edges where float64 picks the other pillar: float32 must win."""
    v = cfg.voxel
    rows: list[list[float]] = []
    want_ix: list[int] = []
    want_iy: list[int] = []
    for k in range(1, v.grid[0]):
        for x in (f32(v.point_range[0] + k * v.pillar_size[0]), f32(k * f32(v.pillar_size[0]))):
            q32 = f32(f32(x - f32(v.point_range[0])) / f32(v.pillar_size[0]))
            q64 = (x - v.point_range[0]) / v.pillar_size[0]
            if math.floor(q32) != math.floor(q64) and len(rows) < 200:
                iy = len(rows)  # y in the middle of its own pillar row, so each point is its own pillar
                rows.append([x, v.point_range[1] + (iy + 0.5) * v.pillar_size[1], 0.0, 0.5])
                want_ix.append(math.floor(q32))
                want_iy.append(iy)
    assert len(rows) > 10, "no float32/float64 disagreement found on this grid"
    got = voxelize(np.array(rows, np.float32), cfg)
    by_iy = dict(zip(got.coords[:, 2].tolist(), got.coords[:, 3].tolist()))
    assert [by_iy.get(iy) for iy in want_iy] == want_ix
    check(np.array(rows, np.float32), cfg)


def test_z_just_below_top_is_out_in_float32(cfg: ModelConfig) -> None:
    """z = 1 - 2**-24: float64 says pillar 0, float32 rounds (z + 3) / 4 up to 1, outside the grid."""
    z = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    assert math.floor((z + 3.0) / 4.0) == 0
    got = voxelize(np.array([[10.0, 0.0, z, 0.5]], np.float32), cfg)
    assert got.num_pillars == 0 and got.num_in_range == 0


def test_empty_frame(cfg: ModelConfig) -> None:
    got, _ = check(np.zeros((0, 4), np.float32), cfg)
    m, c = cfg.voxel.max_points_per_pillar, cfg.features.channels
    assert got.features.shape == (0, m, c) and got.coords.shape == (0, 4) and got.num_points.shape == (0,)
    assert scatter(np.zeros((0, 64), np.float32), got.coords, cfg).shape == (1, 64, 496, 432)


def test_one_point(cfg: ModelConfig) -> None:
    got, _ = check(np.array([[12.34, -5.67, -1.2, 0.3]], np.float32), cfg)
    assert got.num_pillars == 1 and got.num_points.tolist() == [1]


def test_all_points_outside(cfg: ModelConfig) -> None:
    rng = np.random.default_rng(5)
    pts = np.column_stack([rng.uniform(-50, -1, 100), rng.uniform(-30, 30, 100),
                           rng.uniform(-2, 0, 100), rng.uniform(0, 1, 100)]).astype(np.float32)
    got, _ = check(pts, cfg)
    assert got.num_pillars == 0 and got.num_in_range == 0 and got.num_input_points == 100


def test_layout_does_not_matter(cfg: ModelConfig) -> None:
    pts = awkward_cloud(cfg, 3)
    ref = voxelize(pts, cfg)
    wide = np.zeros((len(pts), 7), np.float32)
    wide[:, 2:6] = pts
    for view in (np.asfortranarray(pts), wide[:, 2:6]):
        got = voxelize(view, cfg)
        np.testing.assert_array_equal(got.features, ref.features)
        np.testing.assert_array_equal(got.coords, ref.coords)


@pytest.mark.parametrize("bad", [
    np.zeros((5, 4), np.float64),
    np.zeros((5, 3), np.float32),
    np.zeros((4,), np.float32),
    [[0.0, 0.0, 0.0, 0.0]],
])
def test_rejects_bad_points(openpcdet_cfg: ModelConfig, bad: object) -> None:
    with pytest.raises(InputError, match=r"float32 array of shape \(N, 4\)"):
        voxelize(bad, openpcdet_cfg)  # type: ignore[arg-type]


def load_bin(assets: Path, rel: str) -> np.ndarray:
    return np.fromfile(assets / "kitti" / rel, dtype="<f4").reshape(-1, 4)


@pytest.mark.parametrize("rel", ["training/velodyne_reduced/000134.bin", "training/velodyne/000000.bin"])
def test_kitti_frames(assets: Path, cfg: ModelConfig, rel: str) -> None:
    got, _ = check(load_bin(assets, rel), cfg)
    assert got.num_nonfinite == 0 and got.num_pillars_dropped == 0 and got.num_pillars > 1000


def test_full_scan_counts_float32_not_float64(assets: Path, cfg: ModelConfig) -> None:
    """On full scan 000001 float32 and float64 indexing give different pillar counts; we give float32's."""
    pts = load_bin(assets, "training/velodyne/000001.bin")
    cells32, _ = brute_cells(pts, cfg)
    v = cfg.voxel
    p64 = pts.astype(np.float64)
    q64 = np.floor((p64[:, :3] - v.point_range[:3]) / v.pillar_size)
    ok = ((q64 >= 0) & (q64 < v.grid)).all(axis=1)
    lo, hi = np.array(v.point_range[:3], np.float32), np.array(v.point_range[3:], np.float32)
    if v.range_filter == "strict_xyz":
        ok &= ((pts[:, :3] > lo) & (pts[:, :3] < hi)).all(axis=1)
    else:
        ok &= ((pts[:, :2] >= lo[:2]) & (pts[:, :2] <= hi[:2])).all(axis=1)
    cells64 = set(map(tuple, q64[ok].astype(int).tolist()))
    got = voxelize(pts, cfg)
    assert got.num_pillars == len(cells32) != len(cells64)


def test_scatter_against_loop(cfg: ModelConfig) -> None:
    pillars = voxelize(awkward_cloud(cfg, 4), cfg)
    rng = np.random.default_rng(6)
    feats = rng.standard_normal((pillars.num_pillars, 64)).astype(np.float32)
    nx, ny, _ = cfg.voxel.grid
    want = np.zeros((1, 64, ny, nx), np.float64)
    for p, (_, _, iy, ix) in enumerate(pillars.coords.tolist()):
        for ch in range(64):
            want[0, ch, iy, ix] = feats[p, ch]
    got = scatter(feats, pillars.coords, cfg)
    assert got.dtype == np.float32 and got.shape == (1, 64, ny, nx)
    np.testing.assert_array_equal(got, want)


def test_scatter_rejects_bad_input(openpcdet_cfg: ModelConfig) -> None:
    coords = np.array([[0, 0, 3, 432]], np.int32)
    with pytest.raises(InputError, match="coords"):
        scatter(np.ones((1, 64), np.float32), coords, openpcdet_cfg)
    with pytest.raises(InputError, match="pillar_features"):
        scatter(np.ones((1, 64), np.float64), coords, openpcdet_cfg)
    with pytest.raises(InputError, match="coords"):
        scatter(np.ones((2, 64), np.float32), coords, openpcdet_cfg)


def test_overflowed_features_counts_values_past_float16s_largest_and_non_finite_ones() -> None:
    """Pillar features beyond 65504 (float16's largest value), infinite or NaN are counted, one for each value; the
    largest float16 itself, the ReLU's zeros and every usual value are not. Counted here one by one in Python."""
    values = [0.0, 1.5, 65504.0, 65504.0078125, 7e4, 3e38, math.inf, math.nan, 12.0, 65503.0]
    features = np.array(values * 3, np.float32).reshape(5, 6)
    want = sum(1 for v in features.ravel().tolist() if not (abs(v) <= 65504.0))
    assert want == 15 and overflowed_features(features) == want
    assert overflowed_features(np.zeros((0, 64), np.float32)) == 0
