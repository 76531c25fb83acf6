"""BEV plot: corners in OpenPCDet convention, a PNG written atomically, a clear error without matplotlib."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.apps.demo_scene import simulate_scan
from pointpillars_trt.errors import PointPillarsError
from pointpillars_trt.apps.viz import PlotUnavailableError, bev_corners, plot_bev

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_bev_corners_against_rotated_offsets() -> None:
    rng = np.random.default_rng(0)
    boxes = np.column_stack([
        rng.uniform(0, 60, 10), rng.uniform(-30, 30, 10), rng.uniform(-2, 0, 10),
        rng.uniform(1, 5, 10), rng.uniform(0.5, 2, 10), rng.uniform(1, 2, 10), rng.uniform(-4, 8, 10),
    ])
    got = bev_corners(boxes)
    assert got.shape == (10, 4, 2)
    for box, quad in zip(boxes, got):
        x, y, _, dx, dy, _, h = box
        forward = np.array([math.cos(h), math.sin(h)])
        left = np.array([-math.sin(h), math.cos(h)])
        expected = [
            [x, y] + forward * dx / 2 + left * dy / 2,
            [x, y] + forward * dx / 2 - left * dy / 2,
            [x, y] - forward * dx / 2 - left * dy / 2,
            [x, y] - forward * dx / 2 + left * dy / 2,
        ]
        np.testing.assert_allclose(quad, expected, atol=1e-9)


def test_bev_corners_of_no_boxes() -> None:
    assert bev_corners(np.zeros((0, 7))).shape == (0, 4, 2)


def test_plot_bev_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    points, objects = simulate_scan(seed=0)
    boxes = np.stack([o.box for o in objects])
    names = [o.name for o in objects]
    out = tmp_path / "bev.png"
    out.write_bytes(b"old")
    plot_bev(points, boxes, names, np.linspace(0.9, 0.2, len(names)), out,
             point_range=(0, -39.68, -3, 69.12, 39.68, 1))
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["bev.png"]


def test_plot_bev_without_boxes_or_points(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "empty.png"
    plot_bev(np.zeros((0, 4), np.float32), np.zeros((0, 7)), [], None, out)
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("point_range", [(0, -39.68, -3, 69.12, 39.68, 1), None], ids=["cropped", "whole"])
def test_non_finite_points_are_left_out_and_the_height_colours_span_the_finite_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point_range: tuple[float, ...] | None, bad: float) -> None:
    """Before: NaN colour limits (the points lost their height colours) and, for inf, NumPy's RuntimeWarning."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    points, objects = simulate_scan(seed=0)
    points = points.copy()
    points[::7, 2] = bad
    points[1::7, 2] = -bad
    points[2::7, 0] = -np.inf
    kept = np.isfinite(points[:, :3]).all(axis=1)
    finite_points = points[kept]
    z = np.sort(finite_points[:, 2].astype(np.float64))
    if point_range is not None:
        x0, y0, _, x1, y1, _ = point_range
        xy = finite_points[:, :2]
        z = np.sort(finite_points[(xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1), 2]
                    .astype(np.float64))
    # NumPy's default percentile: linear between the two closest ranks
    lo_rank, hi_rank = 0.01 * (len(z) - 1), 0.995 * (len(z) - 1)
    expected = [z[int(r)] + (r - int(r)) * (z[min(int(r) + 1, len(z) - 1)] - z[int(r)]) for r in (lo_rank, hi_rank)]

    drawn: list[Figure] = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k))[1])
    boxes = np.stack([o.box for o in objects])
    names = [o.name for o in objects]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        plot_bev(points, boxes, names, None, tmp_path / "nan.png", point_range=point_range)
        plot_bev(finite_points, boxes, names, None, tmp_path / "finite.png", point_range=point_range)
    (scatter,) = drawn[0].axes[0].collections
    assert scatter.get_clim() == pytest.approx(expected, rel=1e-6)
    assert len(scatter.get_offsets()) == len(z)
    assert (tmp_path / "nan.png").read_bytes() == (tmp_path / "finite.png").read_bytes()


@pytest.mark.parametrize("point_range, labels", [
    ((0, -39.68, -3, 69.12, 39.68, 1), ("x (m, forward)", "y (m, left)")),   # KITTI: the points ahead
    ((-51.2, -51.2, -5, 51.2, 51.2, 3), ("x (m)", "y (m)")),                 # nuScenes: all around
    (None, ("x (m)", "y (m)")),
], ids=["kitti", "nuscenes", "no-range"])
def test_the_axes_claim_directions_only_for_a_range_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          point_range: tuple[float, ...] | None,
                                                          labels: tuple[str, str]) -> None:
    """Every picture's axes said x forward, y left: a nuScenes frame's LIDAR_TOP x points right and y forward, so
    its pictures named the wrong directions; a range around the sensor now claims none."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k))[1])
    points, objects = simulate_scan(seed=0)
    plot_bev(points, np.stack([o.box for o in objects]), [o.name for o in objects], None, tmp_path / "bev.png",
             point_range=point_range)
    (ax, *_) = drawn[0].axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == labels


def test_huge_float32_velocities_draw_without_a_warning(tmp_path: Path) -> None:
    """A multi-head model that overflowed can give finite float32 speeds near 3.4e38 m/s: their length overflowed
    in float32 and numpy printed a RuntimeWarning into infer's output; the arrow is still drawn."""
    pytest.importorskip("matplotlib")
    boxes = np.array([[10, 0, -1, 4, 1.6, 1.5, 0], [20, 5, -1, 4, 1.6, 1.5, 0]], dtype=np.float32)
    velocity = np.array([[3e38, 3e38], [1.0, 0.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_bev(np.zeros((1, 4), np.float32), boxes, ["car", "car"], np.array([0.5, 0.6]), tmp_path / "v.png",
                 point_range=(-51.2, -51.2, -5, 51.2, 51.2, 3), velocity=velocity)
    assert (tmp_path / "v.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_bev_mismatched_names(tmp_path: Path) -> None:
    """Counts of one are said in the singular: it said '1 names' and '1 scores'."""
    pytest.importorskip("matplotlib")
    with pytest.raises(PointPillarsError) as err:
        plot_bev(np.zeros((1, 4), np.float32), np.zeros((2, 7)), ["Car"], None, tmp_path / "x.png")
    assert str(err.value) == "plot_bev: received 2 boxes, 1 name and no scores, expected one name (and score) per box"
    with pytest.raises(PointPillarsError) as err:
        plot_bev(np.zeros((1, 4), np.float32), np.zeros((1, 7)), ["Car"], [0.5, 0.25], tmp_path / "x.png")
    assert str(err.value) == "plot_bev: received 1 box, 1 name and 2 scores, expected one name (and score) per box"


def test_plot_bev_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` fail
    with pytest.raises(PlotUnavailableError, match="install matplotlib to get the PNG"):
        plot_bev(np.zeros((1, 4), np.float32), np.zeros((0, 7)), [], None, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_an_unknown_mplbackend_is_one_error_naming_it(assets: Path, repo_root: Path, tmp_path: Path) -> None:
    """matplotlib's import refuses a backend name it does not know: infer --viz said matplotlib's words alone (no
    MPLBACKEND in them), and demo, whose picture is optional, stopped on it; now both name MPLBACKEND and the fix,
    and demo goes on without its picture."""
    pytest.importorskip("matplotlib")
    env = {**os.environ, "MPLBACKEND": "nonsense", "PYTHONPATH": str(repo_root)}
    infer = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", "--device", "cpu", "--viz", "--model",
                            str(assets / "checkpoints/pointpillar_openpcdet_synthetic.pth"), "--out",
                            str(tmp_path / "out"), str(assets / "kitti/training/velodyne_fov/000000.bin")],
                           capture_output=True, text=True, timeout=300, cwd=repo_root, env=env)
    assert infer.returncode == 2 and len(infer.stderr.splitlines()) == 1, infer
    assert infer.stderr.startswith("error: matplotlib cannot be imported with MPLBACKEND='nonsense': ") and \
        infer.stderr.rstrip().endswith("; unset MPLBACKEND or set it to Agg"), infer
    found = subprocess.run([sys.executable, "-c", "from pointpillars_trt.apps.viz import no_png_line; "
                            "print(no_png_line())"], capture_output=True, text=True, timeout=300, cwd=repo_root,
                           env=env)
    assert found.returncode == 0 and found.stdout.startswith("no PNG: matplotlib cannot be imported with "
                                                             "MPLBACKEND='nonsense'"), found


def test_place_labels_never_overlap() -> None:
    from pointpillars_trt.apps.viz import place_labels

    rng = np.random.default_rng(0)
    anchors = rng.uniform(0, 100, (200, 2))  # 200 labels in a 100 x 100 pixel square: most must go
    sizes = np.tile([30.0, 8.0], (200, 1))
    placed = place_labels(anchors, sizes, list(range(200)), max_labels=50)
    assert 0 < len(placed) <= 50
    rects = [(x, y, x + 30, y + 8) for _, x, y in placed]
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    assert placed[0][0] == 0  # best first
    assert len(place_labels(anchors, sizes, list(range(200)), max_labels=3)) == 3


def test_plot_bev_labels_top_boxes_with_colour_bar_and_legend(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(1)
    n = 80  # a crowd: labels would pile up if all were drawn
    boxes = np.column_stack([rng.uniform(10, 20, n), rng.uniform(-5, 5, n), np.full(n, -1.0), np.full(n, 3.9),
                             np.full(n, 1.6), np.full(n, 1.5), rng.uniform(-3, 3, n)])
    names = [("Car", "Pedestrian", "Cyclist", "Van")[i % 4] for i in range(n)]
    scores = rng.uniform(0.1, 1.0, n)
    out = tmp_path / "crowd.png"
    labelled = plot_bev(np.zeros((0, 4), np.float32), boxes, names, scores, out,
                        point_range=(0, -39.68, -3, 69.12, 39.68, 1), max_labels=20)
    assert 0 < labelled <= 20
    assert out.read_bytes().startswith(PNG_MAGIC)
    # non-finite boxes are skipped, not drawn as NaN polygons
    boxes[0, 3] = np.inf
    plot_bev(np.zeros((0, 4), np.float32), boxes, names, scores, tmp_path / "inf.png")
    assert (tmp_path / "inf.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("durable", [True, False])
def test_a_runs_pictures_wait_for_its_one_flush_pass_as_its_other_files(tmp_path: Path, durable: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_frame_outputs(durable=False)`` (a run that flushes its files in one pass) writes the BEV
    picture without an fsync of its own, as the JSON beside it; ``durable=True`` fsyncs both."""
    pytest.importorskip("matplotlib")
    import os

    from pointpillars_trt.apps.outputs import OutputPlan, write_frame_outputs
    from pointpillars_trt.detections import Detections

    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    classes = ("Car", "Pedestrian", "Cyclist")
    det = Detections(np.array([[10, 0, -1, 4, 2, 1.5, 0.3]], np.float32), np.array([0.8], np.float32),
                     np.array([0]), classes)
    plan = OutputPlan(json_dir=tmp_path / "json", png_dir=tmp_path / "png")
    for folder in (plan.json_dir, plan.png_dir):
        folder.mkdir()
    write_frame_outputs(det, "000001.bin", plan, simulate_scan(seed=0)[0], durable=durable)
    assert (tmp_path / "png" / "000001.png").stat().st_size > 0 and (tmp_path / "json" / "000001.json").exists()
    kinds = sorted(suffix for name in synced for suffix in (".json", ".png") if f"000001{suffix}" in name)
    assert len(synced) == len(kinds) and kinds == ([".json", ".png"] if durable else []), synced


def test_a_frame_whose_picture_cannot_be_written_leaves_none_of_its_files(tmp_path: Path) -> None:
    """--viz on a full or broken output: the frame's JSON was left on disk while the summary counted the
    frame failed and "nothing written", and a resumed run took the frame as done by its JSON."""
    pytest.importorskip("matplotlib")
    from pointpillars_trt.apps.outputs import OutputPlan, write_frame_outputs
    from pointpillars_trt.detections import Detections

    det = Detections(np.array([[10, 0, -1, 4, 2, 1.5, 0.3]], np.float32), np.array([0.8], np.float32),
                     np.array([0]), ("Car",))
    (tmp_path / "json").mkdir()
    (tmp_path / "png").write_text("a file where the pictures' folder should be\n")
    plan = OutputPlan(json_dir=tmp_path / "json", png_dir=tmp_path / "png")
    with pytest.raises(PointPillarsError, match="cannot write"):
        write_frame_outputs(det, "000001.bin", plan, simulate_scan(seed=0)[0], durable=False)
    assert list((tmp_path / "json").iterdir()) == []
    # an earlier run's JSON (a --skip-existing --viz run redoes the frame for its missing picture): kept as it was
    (tmp_path / "json" / "000001.json").write_text("{}\n")
    with pytest.raises(PointPillarsError, match="cannot write"):
        write_frame_outputs(det, "000001.bin", plan, simulate_scan(seed=0)[0], durable=False)
    assert [p.name for p in (tmp_path / "json").iterdir()] == ["000001.json"]
    assert (tmp_path / "json" / "000001.json").read_text() == "{}\n"
