"""A 5-value (nuScenes-style) .bin read as 4 values a point is refused, naming ``--point-dim 5``.

Oracles: the files' own bytes (``np.fromfile`` reshaped by hand), real KITTI scans (which must
never trigger, in scan order or shuffled) and the nuScenes multi-sweep frames of the assets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import InputError
from pointpillars_trt.pointcloud_io import looks_like_five_values, read_points

NUSCENES_FRAMES = ("nuscenes/nusc_dev_k000000_s05.bin", "nuscenes/nusc_dev_k000002_s02.bin")


def sweep_rows(n: int, seed: int) -> np.ndarray:
    """n nuScenes-like rows: x, y around the car, z, intensity 0-255, time lag 0-0.45 s."""
    rng = np.random.default_rng(seed)
    angle, dist = rng.uniform(-np.pi, np.pi, n), rng.uniform(2, 60, n)
    return np.column_stack([dist * np.cos(angle), dist * np.sin(angle), rng.uniform(-2, 1, n),
                            rng.integers(0, 256, n), rng.integers(0, 10, n) * 0.05]).astype("<f4")


def refused(path: Path, **kwargs: object) -> str:
    with pytest.raises(InputError) as err:
        read_points(path, **kwargs)  # type: ignore[arg-type]
    text = str(err.value)
    assert "\n" not in text and "--point-dim 5" in text and str(path) in text, text
    return text


def test_real_kitti_scans_never_look_like_five_values(assets: Path) -> None:
    frames = sorted((assets / "kitti").rglob("*.bin"))
    assert len(frames) >= 15
    rng = np.random.default_rng(0)
    for path in frames:
        rows = np.fromfile(path, "<f4").reshape(-1, 4)
        np.testing.assert_array_equal(read_points(path), rows)
        for trimmed in (rows, rows[: len(rows) // 5 * 5]):  # also with a point count that fits rows of 5
            assert not looks_like_five_values(trimmed.ravel()), path
            assert not looks_like_five_values(trimmed[rng.permutation(len(trimmed))].ravel()), path


def test_nuscenes_sweeps_read_as_four_are_refused(assets: Path) -> None:
    whole = assets / NUSCENES_FRAMES[0]  # 290,000 bytes: whole rows of 4 as well as of 5
    assert whole.stat().st_size % 80 == 0
    assert "looks like 5 float32 values a point" in refused(whole)
    ragged = assets / NUSCENES_FRAMES[1]  # 201,060 bytes: not rows of 4
    text = refused(ragged)
    assert "201060 bytes, not a multiple of 16" in text and "fits 5 values a point" in text
    for name in NUSCENES_FRAMES:
        expected = np.fromfile(assets / name, "<f4").reshape(-1, 5)[:, :4]
        np.testing.assert_array_equal(read_points(assets / name, point_dim=5), expected)


def test_synthetic_five_value_rows_refused_in_any_order(tmp_path: Path) -> None:
    rows = sweep_rows(4000, seed=1)  # 4000 rows of 5 = 5000 rows of 4
    for order, data in (("scan", rows), ("shuffled", rows[np.random.default_rng(2).permutation(len(rows))])):
        path = tmp_path / f"{order}.bin"
        data.tofile(path)
        refused(path)
        np.testing.assert_array_equal(read_points(path, point_dim=5), data[:, :4])


def test_four_value_rows_that_fit_five_are_read(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 5000  # whole rows of 5 too
    xyz = rng.uniform([-60, -60, -3], [60, 60, 2], (n, 3))
    for name, intensity in (("unit", rng.uniform(0, 1, n)), ("byte", rng.integers(0, 256, n)),
                            ("centred", rng.normal(0, 1, n))):  # normalised intensities can be negative
        rows = np.column_stack([xyz, intensity]).astype("<f4")
        rows.tofile(tmp_path / f"{name}.bin")
        np.testing.assert_array_equal(read_points(tmp_path / f"{name}.bin"), rows)


def test_size_errors_name_the_other_point_dim(tmp_path: Path) -> None:
    sweep_rows(3, seed=4).tofile(tmp_path / "three.bin")  # 60 bytes: rows of 5, not of 4
    assert "fits 5 values a point" in refused(tmp_path / "three.bin")
    (tmp_path / "odd.bin").write_bytes(bytes(36))  # neither
    text = refused(tmp_path / "odd.bin")
    assert "fits" not in text
    (tmp_path / "four.bin").write_bytes(bytes(48))  # rows of 4 read as 5
    with pytest.raises(InputError, match="fits 4 values a point .KITTI.: pass --point-dim 4"):
        read_points(tmp_path / "four.bin", point_dim=5)
