"""The CUDA stages (kernels/cuda/*.cu through the kernel stage modules) against the NumPy reference.

Voxelization and scatter must match the reference bit for bit: both do the same float32 operations
in the same order, and the kernels' atomics only count, take minima or fill buckets whose order no
result depends on. Post-processing matches up to CUDA's expf against NumPy's exp (a few ulp in a
score): the synthetic head maps keep distinct scores at least 4e-5 apart, far above an ulp, so no
ordering hinges on that difference, while exact ties are copies of one logit, which both sides see
as equal and break by the lower index. Boxes are compared to 1e-4 m / rad.

Every GPU test is marked ``cuda`` and skips with its reason where CuPy or a device is missing;
the compile check needs only nvcc.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.kernels import _launch
from pointpillars_trt.kernels import postprocess as gpu_post
from pointpillars_trt.kernels import scatter as gpu_scatter
from pointpillars_trt.kernels import voxelize as gpu_vox
from pointpillars_trt.config import ModelConfig
from pointpillars_trt.errors import ConfigError

CAPACITY = 131_072  # points; the full KITTI scans have up to 126,891
FRAMES = ("training/velodyne_reduced/000134.bin", "training/velodyne/000000.bin",
          "training/velodyne_fov/000003.bin")


@pytest.fixture(params=["openpcdet_cfg", "zhulf_cfg"])
def cfg(request: pytest.FixtureRequest) -> ModelConfig:
    return request.getfixturevalue(request.param)


@pytest.fixture
def stream(cp: Any) -> Any:
    s = cp.cuda.Stream()  # blocking: ordered with the default stream the test's copies use
    with s:
        yield s
    s.synchronize()


def with_limits(cfg: ModelConfig, **voxel: Any) -> ModelConfig:
    return dataclasses.replace(cfg, voxel=dataclasses.replace(cfg.voxel, **voxel))


# --------------------------------------------------------------------------- voxelize


def awkward_cloud(cfg: ModelConfig, rng: np.random.Generator, n: int = 6000) -> np.ndarray:
    """Points around and on the range and pillar edges, non-finite rows, duplicates, dense pillars."""
    v = cfg.voxel
    lo, hi, size = np.array(v.point_range[:3]), np.array(v.point_range[3:]), np.array(v.pillar_size)
    spread = rng.uniform([*(lo - [2, 2, 0.5]), 0], [*(hi + [2, 2, 0.5]), 1], size=(n, 4))
    # two pillars with more than M points, interleaved with the rest
    for cell in ([3, 4], [400, 490]):
        idx = rng.choice(n, 3 * v.max_points_per_pillar, replace=False)
        spread[idx, :2] = lo[:2] + (np.array(cell) + rng.uniform(0.01, 0.99, (idx.size, 2))) * size[:2]
        spread[idx, 2] = rng.uniform(lo[2] + 0.1, hi[2] - 0.1, idx.size)
    pts = spread.astype(np.float32)
    edges = rng.choice(n, 400, replace=False)
    k = rng.integers(0, 60, size=(400, 2))
    pts[edges[:100], 0] = np.float32(lo[0]) + k[:100, 0] * np.float32(size[0])
    pts[edges[100:200], 1] = np.float32(lo[1]) + k[100:200, 1] * np.float32(size[1])
    pts[edges[200:250], 0] = np.float32(hi[0])
    pts[edges[250:300], 1] = np.float32(rng.choice([lo[1], hi[1]]))
    pts[edges[300:350], 2] = np.float32(rng.choice([lo[2], hi[2]]))
    pts[edges[350:360]] = pts[edges[360:370]]  # duplicates
    bad = rng.choice(n, 30, replace=False)
    pts[bad, rng.integers(0, 4, 30)] = rng.choice([np.nan, np.inf, -np.inf], 30)
    return pts


def kitti_frame(assets: Path, rel: str) -> np.ndarray:
    return np.fromfile(assets / "kitti" / rel, dtype=np.float32).reshape(-1, 4)


class VoxelRun:
    """One VoxelizeStage on a capacity-sized point buffer whose unused rows hold decoy points."""

    def __init__(self, cp: Any, cfg: ModelConfig, capacity: int = CAPACITY) -> None:
        self.cp, self.cfg = cp, cfg
        self.stage = gpu_vox.VoxelizeStage(cfg, capacity)
        v = cfg.voxel
        decoy = np.array([(v.point_range[0] + v.point_range[3]) / 2, 0.0, -1.0, 0.5], np.float32)
        self.points = cp.asarray(np.tile(decoy, (capacity, 1)))  # in range: reading past n would show
        self.frame = cp.zeros(2, np.int32)  # (point count, first row)

    def __call__(self, pts: np.ndarray, stream: Any, poison: bool = True, first_row: int = 0) -> dict[str, np.ndarray]:
        from pointpillars_trt.reference import voxelize

        cp, st = self.cp, self.stage
        self.points[first_row : first_row + pts.shape[0]] = cp.asarray(pts)
        self.frame[...] = cp.asarray(np.array([pts.shape[0], first_row], np.int32))
        if poison:  # the rows this frame reports must be rewritten completely
            p = voxelize(pts, self.cfg).num_pillars
            st.features[0, :p] = np.nan
            st.coords[0, :p] = -7
            st.num_points[0, :p] = -7
        st.launch(self.points, self.frame, stream)
        return fetch(st, stream)


def fetch(stage: Any, stream: Any, frame: int = 0) -> dict[str, np.ndarray]:
    """Frame ``frame``'s outputs of a voxelizer's batch."""
    stream.synchronize()
    return {"features": stage.features[frame].get(), "coords": stage.coords[frame].get(),
            "num_points": stage.num_points[frame].get(), "stats": stage.stats[frame].get()}


def assert_matches_reference(got: dict[str, np.ndarray], pts: np.ndarray, cfg: ModelConfig, what: str = "") -> None:
    from pointpillars_trt.reference import voxelize

    ref = voxelize(pts, cfg)
    p = ref.num_pillars
    stats = dict(zip(gpu_vox.VOXEL_STATS, got["stats"].tolist()))
    want = {"pillars": p, "pillars_total": ref.num_pillars_total, "pillars_dropped": ref.num_pillars_dropped,
            "nonfinite": ref.num_nonfinite, "in_range": ref.num_in_range}
    assert {n: stats[n] for n in want} == want, what
    np.testing.assert_array_equal(got["coords"][:p], ref.coords, err_msg=what)
    np.testing.assert_array_equal(got["num_points"][:p], ref.num_points, err_msg=what)
    np.testing.assert_array_equal(got["features"][:p], ref.features, err_msg=what)  # bit for bit, padding zero
    # rows past the pillar count: zero, whatever earlier frames left there
    rest = (got["features"][p:].any(), got["coords"][p:].any(), got["num_points"][p:].any())
    assert rest == (False, False, False), f"{what}: rows past the pillar count are not zero"


@pytest.mark.cuda
def test_voxelize_random_clouds(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    run = VoxelRun(cp, cfg, capacity=8192)
    rng = np.random.default_rng(7)
    for n in (6000, 2500, 8192):  # shrinking then full: stale rows must be cleared
        pts = awkward_cloud(cfg, rng, n)
        assert_matches_reference(run(pts, stream), pts, cfg, f"{n} points")


@pytest.mark.cuda
@pytest.mark.parametrize("frame", FRAMES)
def test_voxelize_kitti_frames(cp: Any, stream: Any, cfg: ModelConfig, assets: Path, frame: str) -> None:
    pts = kitti_frame(assets, frame)
    run = VoxelRun(cp, cfg)
    assert_matches_reference(run(pts, stream), pts, cfg, frame)


@pytest.mark.cuda
def test_voxelize_small_frames(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    run = VoxelRun(cp, cfg, capacity=4096)
    rng = np.random.default_rng(3)
    v = cfg.voxel
    inside = np.array([[10.0, 1.0, -1.0, 0.3]], np.float32)
    one_pillar = np.tile(inside, (3000, 1))
    one_pillar[:, :3] += rng.uniform(-0.02, 0.02, (3000, 3)).astype(np.float32)  # one pillar
    one_pillar[:, 3] = np.arange(3000, dtype=np.float32) / 3000  # tells the kept points apart
    frames = {
        "cloud": awkward_cloud(cfg, rng, 4000),
        "empty": np.zeros((0, 4), np.float32),
        "one point": inside,
        "all non-finite": np.full((50, 4), np.nan, np.float32),
        "out of range": np.array([[v.point_range[0] - 1, 0, -1, 0], [v.point_range[3] + 1, 0, -1, 0]], np.float32),
        "one dense pillar": one_pillar,
    }
    for name, pts in frames.items():
        got = run(pts, stream)
        assert_matches_reference(got, pts, cfg, name)
        if name == "one dense pillar":  # its first M points, in input order
            np.testing.assert_array_equal(got["features"][0, :, 3], one_pillar[: v.max_points_per_pillar, 3])


@pytest.mark.cuda
def test_voxelize_pillar_limit(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    small = with_limits(cfg, max_pillars=64, max_points_per_pillar=5)
    run = VoxelRun(cp, small, capacity=8192)
    pts = awkward_cloud(small, np.random.default_rng(11), 8000)
    got = run(pts, stream)
    assert_matches_reference(got, pts, small)
    stats = dict(zip(gpu_vox.VOXEL_STATS, got["stats"].tolist()))
    assert stats["pillars"] == 64 and stats["pillars_dropped"] == stats["pillars_total"] - 64 > 0


@pytest.mark.cuda
def test_voxelize_count_clamped_to_rows(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    stage = gpu_vox.VoxelizeStage(cfg, 4096)
    pts = awkward_cloud(cfg, np.random.default_rng(5), 1000)
    frame = cp.asarray(np.array([5000, 0], np.int32))  # more than the 1000 rows given
    stage.launch(cp.asarray(pts), frame, stream)
    assert_matches_reference(fetch(stage, stream), pts, cfg)


@pytest.mark.cuda
def test_voxelize_reads_its_frame_at_its_first_row(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """Frames of a batch share one input buffer: a frame's rows start where its header says."""
    run = VoxelRun(cp, cfg, capacity=8192)
    pts = awkward_cloud(cfg, np.random.default_rng(6), 3000)
    assert_matches_reference(run(pts, stream, first_row=4000), pts, cfg)  # decoys before and after it


@pytest.mark.cuda
def test_voxelize_a_pillar_of_100k_identical_points_is_fast_and_exact(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """vox_rank is bounded for a pillar holding very many points (the kept ones are its first MAX_PTS)."""
    rng = np.random.default_rng(9)
    v = cfg.voxel
    same = np.array([(v.point_range[0] + v.point_range[3]) / 2, 0.0, -1.0, 0.5], np.float32)
    pts = np.concatenate([np.tile(same, (100_000, 1)), awkward_cloud(cfg, rng, 2000)])
    pts = pts[rng.permutation(pts.shape[0])]
    run = VoxelRun(cp, cfg, capacity=131072)
    assert_matches_reference(run(pts, stream), pts, cfg)  # also loads the points and warms up
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    run.stage.launch(run.points, run.frame, stream)  # the same frame again: only the kernels are timed
    end.record(stream)
    end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end)
    assert_matches_reference(fetch(run.stage, stream), pts, cfg)
    print(f"voxelize, 100k points in one pillar + 2k others: {ms:.3f} ms")
    assert ms < 2.0, f"{ms:.1f} ms"


@pytest.mark.cuda
def test_voxelize_large_pillars_of_many_sizes_keep_their_first_points(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """Pillars at vox_rank's limit (128 points), just over it, and up to tens of thousands of points,
    shuffled into a cloud, so that their first points' indices spread over the digits of
    vox_rank_large's radix select."""
    rng = np.random.default_rng(17)
    v = cfg.voxel
    sizes = [128, 129, 300, 1000, 5000, 20000]
    centres = [(v.point_range[0] + 2.0 + 3.0 * k, 1.0 + k, -1.0) for k in range(len(sizes))]
    dense = [np.column_stack([np.tile(c, (n, 1)), rng.uniform(0, 1, (n, 1))]) for c, n in zip(centres, sizes)]
    pts = np.concatenate([*dense, awkward_cloud(cfg, rng, 8000)]).astype(np.float32)
    pts = pts[rng.permutation(pts.shape[0])]
    run = VoxelRun(cp, cfg, capacity=65536)
    got = run(pts, stream)
    assert_matches_reference(got, pts, cfg)
    assert (got["num_points"] == v.max_points_per_pillar).sum() >= len(sizes)


@pytest.mark.cuda
def test_voxelize_frames_larger_than_one_pass_of_the_grid(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """The per-point kernels' blocks stride over a frame's chunks of points: pillars are still numbered
    in first-point order across the passes, and a small frame after a large one reads none of its counters."""
    rng = np.random.default_rng(29)
    run = VoxelRun(cp, cfg, capacity=1 << 19)
    large = awkward_cloud(cfg, rng, 3 * run.stage.points_per_pass + 1000)
    assert_matches_reference(run(large, stream), large, cfg, "four passes")
    small = awkward_cloud(cfg, rng, 5000)
    assert_matches_reference(run(small, stream), small, cfg, "one pass after four")


@pytest.mark.cuda
def test_voxelize_deterministic(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    run = VoxelRun(cp, cfg, capacity=16384)
    rng = np.random.default_rng(21)
    a, b = awkward_cloud(cfg, rng, 16000), awkward_cloud(cfg, rng, 9000)
    first = run(a, stream, poison=False)
    run(b, stream, poison=False)  # a different frame in between: the per-cell scratch must be clean again
    second = run(a, stream, poison=False)
    reported = gpu_vox.VOXEL_STATS.index("previous_pillars")  # the later slots are bookkeeping
    first["stats"], second["stats"] = first["stats"][:reported], second["stats"][:reported]
    for name in ("features", "coords", "num_points", "stats"):
        assert first[name].tobytes() == second[name].tobytes(), name


@pytest.mark.cuda
def test_voxelize_a_batch_in_one_set_of_launches(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """Frames of a batch share one input buffer and one launch a kernel: each frame's pillars equal the
    reference's, whatever its neighbours (a dense pillar, an empty frame, a frame of several passes of
    its share of the grid, decoys between them); a smaller batch after it clears its frames' stale rows."""
    rng = np.random.default_rng(41)
    v = cfg.voxel
    dense = np.tile(np.array([(v.point_range[0] + v.point_range[3]) / 2, 0.0, -1.0, 0.5], np.float32), (600, 1))
    dense[:, 3] = np.arange(600, dtype=np.float32) / 600
    stage = gpu_vox.VoxelizeStage(cfg, 1 << 18, frames=4)
    decoy = np.array([(v.point_range[0] + v.point_range[3]) / 2, 1.0, -1.0, 0.25], np.float32)
    points = cp.asarray(np.tile(decoy, (1 << 18, 1)))
    batches = (
        [awkward_cloud(cfg, rng, 9000), np.zeros((0, 4), np.float32), np.concatenate([dense, awkward_cloud(cfg, rng, 3000)]),
         awkward_cloud(cfg, rng, stage.points_per_pass + 1000)],
        [awkward_cloud(cfg, rng, 2000), awkward_cloud(cfg, rng, 500)],
    )
    for frames in batches:
        header, row = [], 100  # the frames' rows start past a few decoys and leave gaps between them
        for pts in frames:
            points[row : row + pts.shape[0]] = cp.asarray(pts)
            header += [pts.shape[0], row]
            row += pts.shape[0] + 37
        stage.launch(points, cp.asarray(np.array(header, np.int32)), stream, frames=len(frames))
        for f, pts in enumerate(frames):
            assert_matches_reference(fetch(stage, stream, f), pts, cfg, f"frame {f} of {len(frames)}")


# --------------------------------------------------------------------------- scatter


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,channels_first", [(np.float32, False), (np.float16, False), (np.float32, True)])
def test_scatter_matches_reference(cp: Any, stream: Any, cfg: ModelConfig, dtype: Any, channels_first: bool) -> None:
    from pointpillars_trt.reference import scatter, voxelize

    stage = gpu_scatter.ScatterStage(cfg, dtype, channels_first)
    nx, ny, _ = cfg.voxel.grid
    canvas = cp.zeros((1, cfg.network.pfn_channels, ny, nx) if channels_first
                      else (1, ny, nx, cfg.network.pfn_channels), dtype)
    pmax, channels = cfg.voxel.max_pillars, cfg.network.pfn_channels
    rng = np.random.default_rng(2)
    count = cp.zeros((1, 1), np.int32)
    for n in (5000, 1200, 0, 3000):  # every frame must erase the previous one
        ref = voxelize(awkward_cloud(cfg, rng, n), cfg) if n else None
        p = 0 if ref is None else ref.num_pillars
        features = np.full((pmax, channels), np.nan, np.float32)  # rows past P must stay unread
        features[:p] = rng.standard_normal((p, channels)).astype(np.float32)
        coords = np.full((pmax, 4), -1, np.int32)
        if ref is not None:
            coords[:p] = ref.coords
        count[...] = p
        stage.launch(cp.asarray(features[None]), cp.asarray(coords[None]), count, canvas, stream)
        stream.synchronize()
        want = scatter(features[:p], coords[:p], cfg)[0].astype(dtype)  # (C, ny, nx)
        if not channels_first:
            want = want.transpose(1, 2, 0)
        np.testing.assert_array_equal(canvas[0].get(), want)


@pytest.mark.cuda
def test_scatter_a_batch_writes_each_frame_into_its_own_canvas(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    from pointpillars_trt.reference import scatter, voxelize

    stage = gpu_scatter.ScatterStage(cfg, np.float16, frames=3)
    nx, ny, _ = cfg.voxel.grid
    pmax, channels = cfg.voxel.max_pillars, cfg.network.pfn_channels
    canvas = cp.zeros((3, ny, nx, channels), np.float16)
    rng = np.random.default_rng(43)
    for sizes in ((4000, 0, 2500), (1000, 3000)):  # the second batch erases the first's cells
        features = np.full((len(sizes), pmax, channels), np.nan, np.float32)
        coords = np.full((len(sizes), pmax, 4), -1, np.int32)
        counts = np.zeros((len(sizes), 3), np.int32)
        refs = []
        for f, n in enumerate(sizes):
            ref = voxelize(awkward_cloud(cfg, rng, n), cfg) if n else None
            p = 0 if ref is None else ref.num_pillars
            features[f, :p] = rng.standard_normal((p, channels))
            if ref is not None:
                coords[f, :p] = ref.coords
            counts[f, 0] = p
            refs.append(p)
        stage.launch(cp.asarray(features), cp.asarray(coords), cp.asarray(counts), canvas, stream, frames=len(sizes))
        stream.synchronize()
        for f, p in enumerate(refs):
            want = scatter(features[f, :p], coords[f, :p], cfg)[0].astype(np.float16).transpose(1, 2, 0)
            np.testing.assert_array_equal(canvas[f].get(), want, err_msg=f"frame {f} of {len(sizes)}")


# --------------------------------------------------------------------------- post-process


Maps = tuple[np.ndarray, np.ndarray, np.ndarray]  # cls, box, dir: NCHW float32


def merged_nhwc(maps: Maps) -> np.ndarray:
    """The (hy, hx, cls|box|dir) head map the post-process reads, from the three NCHW maps."""
    return np.ascontiguousarray(np.concatenate([m[0].transpose(1, 2, 0) for m in maps], axis=2))


def head_maps(cfg: ModelConfig, rng: np.random.Generator, candidates: int, *, ties: int = 0,
              spacing: int = 1, second_class: float = 0.3) -> Maps:
    """NCHW head maps with ``candidates`` anchors above the score threshold.

    Distinct scores lie on a grid 0.88 / (2 * candidates + 2) apart; ``ties`` groups of four anchors
    share one logit exactly. A fraction ``second_class`` of the candidates also passes with a second
    class (its own grid, interleaved). ``spacing`` > 1 puts candidates only on every spacing-th cell
    in x and y, so that few of them overlap.
    """
    w, h = cfg.head_map
    a, k = cfg.anchors.per_cell, cfg.num_classes
    logits = rng.uniform(-8.0, -3.0, (h, w, a, k))  # sigmoid < 0.048: below every threshold
    cells = [(y, x) for y in range(0, h, spacing) for x in range(0, w, spacing)]
    flat = rng.choice(len(cells) * a, candidates, replace=False)
    grid = 0.1 + 0.88 * np.arange(1, 2 * candidates + 1) / (2 * candidates + 2)
    first, second = rng.permutation(grid[1::2]), rng.permutation(grid[0::2])
    for t in range(ties):  # four anchors with exactly the same best score
        first[4 * t + 1: 4 * t + 4] = first[4 * t]
    logit = lambda s: np.log(s / (1 - s))  # noqa: E731
    for i, f in enumerate(flat):
        y, x = cells[f // a]
        anchor = f % a
        c1 = rng.integers(k)
        logits[y, x, anchor, c1] = logit(first[i])
        if rng.random() < second_class and second[i] < first[i]:
            c2 = (c1 + 1 + rng.integers(k - 1)) % k
            logits[y, x, anchor, c2] = logit(second[i])
    cls = logits.astype(np.float32).reshape(h, w, a * k).transpose(2, 0, 1)[None]
    box = rng.normal(0.0, [0.3, 0.3, 0.6, 0.2, 0.2, 0.2, 0.8], (h, w, a, 7)).astype(np.float32)
    box = box.reshape(h, w, a * 7).transpose(2, 0, 1)[None]
    direction = rng.standard_normal((1, a * 2, h, w)).astype(np.float32)
    return np.ascontiguousarray(cls), np.ascontiguousarray(box), direction


def voxel_counts(frames: int) -> np.ndarray:
    """Stand-in voxelizer counts, (frames, len(VOXEL_STATS)): frame f's are 100 * (f + 1) + slot."""
    return (100 * np.arange(1, frames + 1)[:, None] + np.arange(len(gpu_vox.VOXEL_STATS))).astype(np.int32)


def run_post(cp: Any, stage: Any, maps: Maps, stream: Any) -> np.ndarray:
    stage.result[...] = np.nan  # every row the frame reports must be written by it
    stage.launch(cp.asarray(merged_nhwc(maps)[None]), cp.asarray(voxel_counts(1)), stream)
    stream.synchronize()
    return stage.result[0].get()


def assert_post_matches(result: np.ndarray, maps: Maps, cfg: ModelConfig, frame: int = 0) -> dict[str, int]:
    from pointpillars_trt.reference import head_maps_to_anchor_major, postprocess

    boxes, scores, labels, counts, velocity = gpu_post.PostprocessStage.unpack(result)
    assert velocity is None
    ref = postprocess(*maps, cfg)
    logits = head_maps_to_anchor_major(*maps, cfg)[0].astype(np.float64)
    with np.errstate(over="ignore"):  # logits of -1e30 and below: a score of 0
        best = (1 / (1 + np.exp(-logits))).max(axis=1)
    thr = cfg.postprocess.score_threshold
    candidates = int(np.count_nonzero(best >= thr if cfg.postprocess.score_inclusive else best > thr))
    assert counts["candidates"] == candidates
    assert counts["selected"] == min(candidates, cfg.postprocess.pre_nms_top_k)
    with np.errstate(invalid="ignore"):  # NaN, infinite or beyond float16's largest value: overflowed
        assert counts["overflowed_scores"] == int(np.count_nonzero(~(np.abs(logits) <= np.finfo(np.float16).max)))
    extra = gpu_post.RESULT_HEADER[len(gpu_post.POST_HEADER):]
    assert [counts[n] for n in extra] == voxel_counts(frame + 1)[frame, : len(extra)].tolist()
    assert counts["count"] == len(ref), f"GPU kept {counts['count']} boxes, the reference {len(ref)}"
    np.testing.assert_array_equal(labels, ref.labels)
    np.testing.assert_allclose(scores, ref.scores, rtol=2e-6, atol=0)
    np.testing.assert_allclose(boxes, ref.boxes, rtol=1e-5, atol=1e-4)
    return counts


POST_CASES = {  # name: (candidates, tie groups, spacing)
    "none": (0, 0, 1),
    "few": (90, 5, 1),
    "hundreds": (700, 20, 1),
    "spread": (2500, 10, 3),
    "over top-k": (6000, 40, 1),
}


@pytest.mark.cuda
@pytest.mark.parametrize("case", POST_CASES)
def test_postprocess_matches_reference(cp: Any, stream: Any, cfg: ModelConfig, case: str) -> None:
    stage = gpu_post.PostprocessStage(cfg)
    n, ties, spacing = POST_CASES[case]
    maps = head_maps(cfg, np.random.default_rng(list(POST_CASES).index(case)), n, ties=ties, spacing=spacing)
    counts = assert_post_matches(run_post(cp, stage, maps, stream), maps, cfg)
    if case == "none":
        assert counts["count"] == 0


@pytest.mark.cuda
def test_postprocess_counts_nan_class_scores_and_starts_the_next_frame_from_none(cp: Any, stream: Any,
                                                                               cfg: ModelConfig) -> None:
    """Class logits the network overflowed to (NaN, infinite, beyond float16's largest value): the header counts
    them (as many as were placed), the boxes are the reference's (an anchor with one NaN class among passing ones
    gives no box, as the maximum over its classes is NaN there and in PyTorch), and the next frame, without any,
    counts none (the count is zeroed after each frame)."""
    from pointpillars_trt.reference import head_maps_to_anchor_major, postprocess

    stage = gpu_post.PostprocessStage(cfg)
    n, ties, spacing = POST_CASES["few"]
    maps = head_maps(cfg, np.random.default_rng(5), n, ties=ties, spacing=spacing)
    cls = maps[0].copy()
    cls[0, :, 40:48, 20:36] = np.nan  # every class of every anchor in 8 x 16 cells
    logits = head_maps_to_anchor_major(*maps, cfg)[0]
    top = int(np.argmax(logits.max(axis=1)))  # the frame's best anchor: always a box of the clean frame
    k, a = cfg.num_classes, cfg.anchors.per_cell
    pixel, anchor = divmod(top, a)
    y, x = divmod(pixel, cls.shape[3])
    other = (int(np.argmax(logits[top])) + 1) % k
    cls[0, anchor * k + other, y, x] = np.nan  # one class of it, not its best
    cls[0, 0, 50:54, 40] = (-np.inf, -1e30, -65505.0, -np.finfo(np.float16).max)  # the last at the bound: a value
    spoiled = (cls, maps[1], maps[2])
    assert postprocess(*spoiled, cfg).scores[0] < postprocess(*maps, cfg).scores[0]  # its box is gone
    counts = assert_post_matches(run_post(cp, stage, spoiled, stream), spoiled, cfg)
    assert counts["overflowed_scores"] == cls.shape[1] * 8 * 16 + 4
    assert assert_post_matches(run_post(cp, stage, maps, stream), maps, cfg)["overflowed_scores"] == 0


@pytest.mark.cuda
def test_postprocess_a_batch_gives_each_frame_its_own_boxes(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """Frames of very different candidate counts in one set of launches; each frame's header carries its
    own voxelizer counts; a smaller batch after it is exact too."""
    stage = gpu_post.PostprocessStage(cfg, frames=4)
    rng = np.random.default_rng(47)
    for cases in (("over top-k", "none", "few", "spread"), ("hundreds", "few")):
        maps = []
        for case in cases:
            n, ties, spacing = POST_CASES[case]
            maps.append(head_maps(cfg, rng, n, ties=ties, spacing=spacing))
        stage.result[...] = np.nan
        heads = cp.asarray(np.stack([merged_nhwc(m) for m in maps]))
        stage.launch(heads, cp.asarray(voxel_counts(len(cases))), stream, frames=len(cases))
        stream.synchronize()
        for f, m in enumerate(maps):
            assert_post_matches(stage.result[f].get(), m, cfg, frame=f)


@pytest.mark.cuda
def test_postprocess_ties_at_the_top_k_cut(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    """Many anchors share the score at the cut: the lower anchor indices are taken."""
    stage = gpu_post.PostprocessStage(cfg)
    rng = np.random.default_rng(8)
    top_k = cfg.postprocess.pre_nms_top_k
    cls, box, direction = head_maps(cfg, rng, top_k + 200, spacing=2)
    flat = cls[0].transpose(1, 2, 0).reshape(-1, cfg.num_classes)  # logits, rows in anchor order
    best = flat.max(axis=1)
    order = np.argsort(-best, kind="stable")
    tied = order[top_k - 50: top_k + 50]  # 100 anchors straddling the cut get the same best logit
    value = best[order[top_k - 50]]
    for row in tied:
        c = np.argmax(flat[row])
        flat[row] = np.minimum(flat[row], value - 1)
        flat[row, c] = value
    cls = np.ascontiguousarray(flat.reshape(cls.shape[2], cls.shape[3], -1).transpose(2, 0, 1)[None])
    assert_post_matches(run_post(cp, stage, (cls, box, direction), stream), (cls, box, direction), cfg)


@pytest.mark.cuda
def test_postprocess_deterministic(cp: Any, stream: Any, cfg: ModelConfig) -> None:
    stage = gpu_post.PostprocessStage(cfg)
    rng = np.random.default_rng(4)
    a, b = head_maps(cfg, rng, 3000, ties=10), head_maps(cfg, rng, 500)
    first = run_post(cp, stage, a, stream)
    run_post(cp, stage, b, stream)
    second = run_post(cp, stage, a, stream)
    n = int(first[0, 0]) + 1
    assert first[:n].tobytes() == second[:n].tobytes()


@pytest.mark.cuda
def test_frame_captured_in_a_cuda_graph(cp: Any, cfg: ModelConfig) -> None:
    """Voxelize, scatter and post-process enqueue nothing that syncs or allocates: they capture into a
    CUDA graph, and replaying the graph on new input gives the reference's results (the counts
    that vary per frame are read from device memory, not baked into the graph)."""
    from pointpillars_trt.reference import scatter, voxelize

    capture = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(17)
    with capture:
        vox = gpu_vox.VoxelizeStage(cfg, 8192)
        sca = gpu_scatter.ScatterStage(cfg)
        post = gpu_post.PostprocessStage(cfg)
        points = cp.zeros((8192, 4), np.float32)
        frame_header = cp.zeros(2, np.int32)
        pmax, channels = cfg.voxel.max_pillars, cfg.network.pfn_channels
        pillar_features = cp.zeros((1, pmax, channels), np.float32)
        nx, ny, _ = cfg.voxel.grid
        canvas = cp.zeros((1, ny, nx, channels), np.float32)
        heads = cp.zeros((1, *merged_nhwc(head_maps(cfg, rng, 0)).shape), np.float32)

        def frame() -> None:
            vox.launch(points, frame_header, capture)
            sca.launch(pillar_features, vox.coords, vox.stats, canvas, capture)
            post.launch(heads, vox.stats, capture)

        frame()  # warm-up outside the capture
        capture.synchronize()
        # Thread-local mode refuses the unsafe calls (allocation, synchronisation) from this thread.
        capture.begin_capture(mode=cp.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            frame()
        finally:
            graph = capture.end_capture()
        for n in (7000, 3000):
            pts = awkward_cloud(cfg, rng, n)
            feats = rng.standard_normal((pmax, channels)).astype(np.float32)
            host_maps = head_maps(cfg, rng, 400, ties=3)
            points[:n] = cp.asarray(pts)
            frame_header[...] = cp.asarray(np.array([n, 0], np.int32))
            pillar_features[0] = cp.asarray(feats)
            heads[0] = cp.asarray(merged_nhwc(host_maps))
            graph.launch(capture)
            capture.synchronize()
            assert_matches_reference(fetch(vox, capture), pts, cfg)
            ref = voxelize(pts, cfg)
            p = ref.num_pillars
            np.testing.assert_array_equal(canvas[0].get(), scatter(feats[:p], ref.coords, cfg)[0].transpose(1, 2, 0))
            result = post.result[0].get()
            boxes, _, _, counts, _ = gpu_post.PostprocessStage.unpack(result)
            assert counts["pillars"] == p and counts["nonfinite"] == ref.num_nonfinite
            from pointpillars_trt.reference import postprocess

            assert counts["count"] == len(postprocess(*host_maps, cfg))
            np.testing.assert_allclose(boxes, postprocess(*host_maps, cfg).boxes, rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------- without a GPU


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_kernels_compile_with_nvcc(cfg: ModelConfig, tmp_path: Path) -> None:
    """Each stage's .cu compiles for sm_90 with exactly the options and defines the stage modules give
    NVRTC, without spilling registers (the multi-head post-process with the nuScenes config's)."""
    from pointpillars_trt.config import load_config
    from pointpillars_trt.kernels.multihead_post import MultiHeadPostParams
    from pointpillars_trt.kernels.pfn import PfnParams

    jobs = {
        "voxelize.cu": gpu_vox.VoxelParams.from_config(cfg).defines(),
        "scatter.cu": gpu_scatter.ScatterParams.from_config(cfg).defines(),
        "postprocess.cu": gpu_post.PostParams.from_config(cfg).defines(),
        "pfn.cu": PfnParams.from_config(cfg).defines(),
        "multihead_post.cu": MultiHeadPostParams.from_config(load_config("openpcdet_nuscenes_multihead")).defines(),
    }
    for name, defines in jobs.items():
        src = tmp_path / name
        src.write_text(_launch.kernel_source(name))
        cmd = ["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "out.cubin"), "-Xptxas", "-warn-spills",
               *_launch.COMPILE_OPTIONS, *defines, str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{name}:\n{done.stderr}"
        assert "warning" not in done.stderr.lower(), f"{name}:\n{done.stderr}"


def test_thresholds_are_kernel_inputs_so_new_values_compile_nothing(cfg: ModelConfig) -> None:
    """The compile cache is keyed by (file, defines): thresholds must leave the defines alone (and appear
    in no define or source macro), while the max-boxes cap, which sizes buffers, may change them."""
    key = gpu_post.PostParams.from_config(cfg).defines()
    for score, iou, boxes in ((0.0, 0.0, 1), (0.5, 0.5, cfg.postprocess.max_boxes), (1.0, 1.0, 7)):
        tuned = gpu_post.PostParams.from_config(cfg.with_thresholds(score_threshold=score, nms_iou=iou))
        assert tuned.defines() == key
        values = gpu_post.threshold_values(cfg.with_thresholds(score_threshold=score, nms_iou=iou, max_boxes=boxes))
        assert values.dtype == np.float32 and values.tolist() == [np.float32(score), np.float32(iou), boxes]
    assert not [d for d in key if d.startswith(("-DSCORE_THRESHOLD=", "-DNMS_IOU="))]
    assert not re.search(r"\b(SCORE_THRESHOLD|NMS_IOU)\b", _launch.kernel_source("postprocess.cu"))
    capped = gpu_post.PostParams.from_config(cfg.with_thresholds(max_boxes=cfg.postprocess.max_boxes + 1))
    assert capped.defines() != key


def test_post_params_refuse_what_the_kernels_cannot_do(openpcdet_cfg: ModelConfig) -> None:
    too_many = dataclasses.replace(
        openpcdet_cfg, postprocess=dataclasses.replace(openpcdet_cfg.postprocess, pre_nms_top_k=8192)
    )
    with pytest.raises(ConfigError, match="pre_nms_top_k"):
        gpu_post.PostParams.from_config(too_many)
