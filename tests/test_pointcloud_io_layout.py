"""A 5-value (nuScenes-style) .bin read as 4 values a point is refused, naming ``--point-dim 5``; a
frame saved as float64 is refused, naming the float32 fix; x, y, z only and random bytes are refused.

Oracles: the files' own bytes (``np.fromfile`` reshaped by hand), real KITTI scans (which must
never trigger, in scan order or shuffled) and the nuScenes multi-sweep frames of the assets.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import InputError, InputWarning
from pointpillars_trt.point_layout import (LAG_SUMMARY_SIZE, check_time_lags, judge_lag_summary, lag_summary,
                                          looks_float64, looks_like_noise, misread_row_length)
from pointpillars_trt.pointcloud_io import read_bin_bytes_into, read_points, read_points_into

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
            assert misread_row_length(trimmed.ravel(), 4) is None, path
            assert misread_row_length(trimmed[rng.permutation(len(trimmed))].ravel(), 4) is None, path


def test_nuscenes_sweeps_read_as_four_are_refused(assets: Path) -> None:
    whole = assets / NUSCENES_FRAMES[0]  # 290,000 bytes: whole rows of 4 as well as of 5
    assert whole.stat().st_size % 80 == 0
    assert "looks like 5 float32 values a point" in refused(whole)
    ragged = assets / NUSCENES_FRAMES[1]  # 201,060 bytes: not rows of 4
    text = refused(ragged)
    assert "201060 bytes, not a multiple of 16" in text and "fits rows of 5 values" in text
    for name in NUSCENES_FRAMES:
        expected = np.fromfile(assets / name, "<f4").reshape(-1, 5)
        np.testing.assert_array_equal(read_points(assets / name, point_dim=5), expected)


def test_synthetic_five_value_rows_refused_in_any_order(tmp_path: Path) -> None:
    rows = sweep_rows(4000, seed=1)  # 4000 rows of 5 = 5000 rows of 4
    for order, data in (("scan", rows), ("shuffled", rows[np.random.default_rng(2).permutation(len(rows))])):
        path = tmp_path / f"{order}.bin"
        data.tofile(path)
        refused(path)
        np.testing.assert_array_equal(read_points(path, point_dim=5), data)


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
    assert "fits rows of 5 values" in refused(tmp_path / "three.bin")
    (tmp_path / "odd.bin").write_bytes(bytes(44))  # none of 3, 4, 5
    for point_dim in (4, 5):
        with pytest.raises(InputError) as err:
            read_points(tmp_path / "odd.bin", point_dim=point_dim)
        assert "fits no rows of 3, 4 or 5 float32 values" in str(err.value) and "--point-dim" not in str(err.value)
    (tmp_path / "byte.bin").write_bytes(bytes(1))  # a copy cut after its first byte: counted in the singular
    with pytest.raises(InputError, match=r"byte\.bin' is 1 byte, not a multiple of 16 \(4 float32 values a point\); it "
                                         r"fits no rows"):
        read_points(tmp_path / "byte.bin")
    (tmp_path / "four.bin").write_bytes(bytes(32))  # rows of 4 read as 5
    with pytest.raises(InputError, match=r"fits rows of 4 values \(x, y, z, intensity, as KITTI writes them: if so, "
                                         r"pass --point-dim 4; Python: point_dim=4\)"):
        read_points(tmp_path / "four.bin", point_dim=5, columns=4)  # a KITTI model: the API's spelling too
    with pytest.raises(InputError) as err:  # a multi-sweep model, which refuses --point-dim 4
        read_points(tmp_path / "four.bin", point_dim=5)
    text = str(err.value)
    assert "fits rows of 4 values" in text and "this model reads 5 a point" in text, text
    assert "PointPillars.accumulate" in text and "--point-dim" not in text, text
    (tmp_path / "xyz.bin").write_bytes(bytes(36))  # rows of 3 (and of neither 4 nor 5)
    for point_dim in (4, 5):
        with pytest.raises(InputError) as err:
            read_points(tmp_path / "xyz.bin", point_dim=point_dim)
        text = str(err.value)
        assert "fits rows of 3 values (x, y, z without intensity; the model needs intensities)" in text, text
        assert "--point-dim" not in text, text


def test_kitti_scans_read_as_five_values_are_refused(assets: Path, tmp_path: Path) -> None:
    """A KITTI scan (4 values a point) read with point_dim 5: refused naming --point-dim 4 when its size
    also fits rows of 5 (in scan order and shuffled), a size error naming it otherwise; nuScenes sweeps
    read as 5 pass (``test_nuscenes_sweeps_read_as_four_are_refused``)."""
    rng = np.random.default_rng(5)
    for path in sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin")):
        rows = np.fromfile(path, "<f4").reshape(-1, 4)
        rows = rows[: len(rows) // 5 * 5]  # whole rows of 5 too
        for order, data in (("scan", rows), ("shuffled", rows[rng.permutation(len(rows))])):
            target = tmp_path / f"{path.stem}_{order}.bin"
            data.tofile(target)
            assert misread_row_length(data.ravel(), 5) == 4, target
            with pytest.raises(InputError) as err:
                read_points(target, point_dim=5, columns=4)  # as a 4-column (KITTI) model reads it
            text = str(err.value)
            assert "looks like 4 float32 values a point" in text and "pass --point-dim 4" in text, text
            np.testing.assert_array_equal(read_points(target), data)
    for name in NUSCENES_FRAMES:
        assert misread_row_length(np.fromfile(assets / name, "<f4"), 5) is None, name


# --------------------------------------------------------------------------- float64 saved with tofile

def float64_refused(path: Path, **kwargs: object) -> None:
    with pytest.raises(InputError) as err:
        read_points(path, **kwargs)  # type: ignore[arg-type]
    text = str(err.value)
    assert "\n" not in text and str(path) in text and "looks like float64 values" in text, text
    assert "astype(np.float32)" in text, text


def test_frames_saved_as_float64_are_refused(assets: Path, tmp_path: Path) -> None:
    """Real KITTI scans and nuScenes sweeps cast to float64 and written with ``tofile`` (the bytes a user
    gets from ``np.fromfile(..., np.float64)``'s inverse): refused through both readers ``infer`` uses,
    in scan order and shuffled; read back as float64 by hand they are the original rows."""
    rng = np.random.default_rng(6)
    cases = [(path, 4) for path in sorted((assets / "kitti" / "training").rglob("velodyne*/*.bin"))]
    cases += [(assets / name, 5) for name in NUSCENES_FRAMES]
    for path, point_dim in cases:
        rows = np.fromfile(path, "<f4").reshape(-1, point_dim)
        for order, data in (("scan", rows), ("shuffled", rows[rng.permutation(len(rows))])):
            target = tmp_path / f"{path.stem}_{point_dim}_{order}.bin"
            data.astype("<f8").tofile(target)
            np.testing.assert_array_equal(np.fromfile(target, "<f8").reshape(-1, point_dim), data)
            assert looks_float64(np.fromfile(target, "<f4"), point_dim), target
            float64_refused(target, point_dim=point_dim)
            with pytest.raises(InputError, match="looks like float64 values"):  # object-store frames' reader
                read_bin_bytes_into(target.read_bytes(), lambda n: np.empty((n, 4), np.float32), point_dim=point_dim,
                                    columns=point_dim)
            if point_dim == 4:  # the pinned-staging reader
                with pytest.raises(InputError, match="looks like float64 values"):
                    read_points_into(target, lambda n: np.empty((n, 4), np.float32))


def test_computed_float64_frames_are_refused(tmp_path: Path) -> None:
    """float64 values that never were float32 (their low words are noise, not zeros): refused too."""
    rng = np.random.default_rng(8)
    for n, scale, intensity in ((2000, 60.0, rng.uniform(0, 1, 2000)), (50_000, 5.0, rng.integers(0, 256, 50_000))):
        rows = np.column_stack([rng.uniform(-scale, scale, (n, 3)), intensity]).astype("<f8")
        rows.tofile(tmp_path / "computed.bin")
        float64_refused(tmp_path / "computed.bin")


def test_float32_frames_never_look_like_float64(assets: Path) -> None:
    """Every real frame of the assets read with the row length its size allows, and random float32
    frames of small and large extents (where a y and an intensity read as one float64 stay small),
    with 0-1, 0-255 and centred intensities: never taken for float64."""
    for path in sorted(assets.rglob("*.bin")):
        values = np.fromfile(path, "<f4")
        for point_dim in (4, 5):
            if values.size % point_dim == 0:
                assert not looks_float64(values, point_dim), (path, point_dim)
    rng = np.random.default_rng(9)
    for trial in range(400):
        n = int(rng.integers(1, 4000)) * 2
        scale = float(rng.choice([0.01, 0.5, 2.0, 15.0, 80.0]))
        intensity = rng.choice([rng.uniform(0, 1, n), rng.integers(0, 256, n).astype(float), rng.normal(0, 1, n)])
        rows = np.column_stack([rng.uniform(-scale, scale, (n, 3)), intensity]).astype("<f4")
        assert not looks_float64(rows.ravel(), 4), trial


# --------------------------------------------------------------------------- x, y, z only; noise

def test_xyz_only_frames_are_refused_whichever_point_dim(assets: Path, tmp_path: Path) -> None:
    """Real KITTI scans written without their intensity column (3 values a point), trimmed so that the
    size also fits rows of 4 or of 5: refused as x, y, z only, never with a --point-dim to try."""
    rng = np.random.default_rng(10)
    for path in sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin")):
        xyz = np.fromfile(path, "<f4").reshape(-1, 4)[:, :3]
        for point_dim in (4, 5):
            rows = xyz[: len(xyz) // point_dim * point_dim]
            for order, data in (("scan", rows), ("shuffled", rows[rng.permutation(len(rows))])):
                target = tmp_path / f"{path.stem}_{point_dim}_{order}.bin"
                np.ascontiguousarray(data).tofile(target)
                with pytest.raises(InputError) as err:
                    read_points(target, point_dim=point_dim)
                text = str(err.value)
                assert "looks like 3 float32 values a point (x, y, z without intensity)" in text, text
                assert "--point-dim" not in text and "\n" not in text, text


@pytest.mark.parametrize(("size", "point_dim"), [(1000, 4), (1004, 4), (16 * 4001 + 4, 4), (16 * 1001, 5)])
def test_random_bytes_of_a_size_no_rows_fit_are_refused_as_noise_not_sent_to_another_row_length(
        tmp_path: Path, size: int, point_dim: int) -> None:
    # such a size fits another row length by chance (1,000 bytes: 50 rows of 5): that hint would mislead
    path = tmp_path / "random.bin"
    path.write_bytes(np.random.default_rng(size).bytes(size))
    for read in (lambda: read_points(path, point_dim=point_dim),
                 lambda: read_points_into(path, lambda n: None, point_dim=point_dim)):
        with pytest.raises(InputError, match="does not hold float32 point coordinates") as err:
            read()
        assert "--point-dim" not in str(err.value)


def test_a_5_value_frame_of_absolute_timestamps_read_as_4_is_sent_to_point_dim_5_not_called_noise(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows = np.column_stack([rng.uniform(-50, 50, (1001, 3)), rng.uniform(0, 1, 1001), 1.7e9 + rng.uniform(0, 0.1, 1001)])
    path = tmp_path / "stamped.bin"
    rows.astype("<f4").tofile(path)  # 20,020 bytes: no whole rows of 4
    for read in (lambda: read_points(path), lambda: read_points_into(path, lambda n: None)):
        with pytest.raises(InputError, match="pass --point-dim 5"):
            read()


def test_random_bytes_are_refused_and_real_frames_are_not_noise(assets: Path, tmp_path: Path) -> None:
    """Random bytes of any length that fits the rows are refused as no coordinates; every real frame of
    the assets, and an organised cloud whose no-return points are NaN (half of them), is not noise."""
    rng = np.random.default_rng(11)
    for size in (320_000, 16 * 1000, 20 * 4000):
        path = tmp_path / f"random{size}.bin"
        path.write_bytes(rng.bytes(size))
        point_dim = 4 if size % 16 == 0 else 5
        with pytest.raises(InputError, match="does not hold float32 point coordinates"):
            read_points(path, point_dim=point_dim)
    for path in sorted(assets.rglob("*.bin")):
        assert not looks_like_noise(np.fromfile(path, "<f4")), path
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    organised = scan.copy()
    organised[::2] = np.nan
    assert not looks_like_noise(organised.ravel())
    organised.tofile(tmp_path / "organised.bin")
    assert read_points(tmp_path / "organised.bin").shape == scan.shape


def test_float64_crops_and_whole_numbers_are_refused_as_float64(assets: Path, tmp_path: Path) -> None:
    """float64 frames without negative y (a crop ahead and to the left) and of whole-number values (whose
    low words are all zero): refused as float64, naming the fix, not as random bytes or read silently."""
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    left = scan[(scan[:, 1] > 0) & (scan[:, 0] > 0)]
    whole = np.column_stack([np.round(scan[:, :3] * 100), np.round(scan[:, 3] * 255)])  # centimetres, 0-255
    for name, rows in (("left", left), ("left_head", left[:500]), ("whole", whole)):
        target = tmp_path / f"{name}.bin"
        rows.astype("<f8").tofile(target)
        float64_refused(target)


def test_float64_rows_of_five_values_read_as_four_are_refused_as_float64(assets: Path, tmp_path: Path) -> None:
    """A nuScenes frame (5 values a point) saved as float64 and read as rows of 4: as float64 rows of 4 its
    y values land in the intensity column, so only the float64 rows of 5 give it away."""
    frame = np.fromfile(sorted((assets / "nuscenes").glob("*.bin"))[0], "<f4").reshape(-1, 5)
    kitti = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    for name, rows in (("nuscenes", frame[: len(frame) // 4 * 4]),
                       ("kitti_and_zeros", np.column_stack([kitti, np.zeros(len(kitti))])[: len(kitti) // 4 * 4])):
        target = tmp_path / f"{name}.bin"
        rows.astype("<f8").tofile(target)
        float64_refused(target)  # read as 4 values a point
        with pytest.raises(InputError, match="looks like float64 values"):
            read_points(target, point_dim=5)


def test_int16_rows_are_refused_as_no_float32_coordinates_never_as_float64(assets: Path, tmp_path: Path) -> None:
    """A scan saved as int16 (or uint16) centimetres, 8 bytes a point as a float64 is: each row read as one
    float64 is a denormal (~1e-312), no value of a frame, so the file is refused as not float32 coordinates,
    not sent to a float64 reading that gives none of its points."""
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    for name, rows in (("int16", np.round(scan * 100).astype("<i2")),
                       ("uint16", np.round(np.abs(scan) * 100).astype("<u2"))):
        target = tmp_path / f"{name}.bin"
        rows.tofile(target)
        as_float64 = np.fromfile(target, "<f8")  # what the float64 advice would read: values of no frame
        assert np.count_nonzero((as_float64 != 0) & (np.abs(as_float64) < 1e-300)) > 0.9 * as_float64.size
        for read in (lambda: read_points(target), lambda: read_points_into(target, lambda n: None)):
            with pytest.raises(InputError) as err:
                read()
            text = str(err.value)
            assert "does not hold float32 point coordinates" in text and "float64" not in text, text


def test_small_frames_timestamps_and_centred_intensities_are_read(tmp_path: Path) -> None:
    """What the new checks must leave alone: frames of 2-10 points with centred (negative) intensities,
    and 5-value rows whose 5th column is an absolute timestamp (seconds or microseconds since 1970), for a
    model that reads 4 values a point (one that reads time lags refuses them: the test below)."""
    rng = np.random.default_rng(12)
    for n in range(2, 11):
        rows = np.column_stack([rng.uniform(-40, 40, (n, 3)), rng.normal(0, 1, n)]).astype("<f4")
        rows.tofile(tmp_path / f"small{n}.bin")
        np.testing.assert_array_equal(read_points(tmp_path / f"small{n}.bin"), rows)
    n = 5000
    xyz = np.column_stack([rng.uniform(0, 60, n), rng.uniform(-30, 30, n), rng.uniform(-2, 1, n)])
    for stamp in (1.7e9, 1.7e15):
        rows = np.column_stack([xyz, rng.uniform(0, 1, n), stamp + rng.uniform(0, 0.1, n)]).astype("<f4")
        rows.tofile(tmp_path / "stamped.bin")
        np.testing.assert_array_equal(read_points(tmp_path / "stamped.bin", point_dim=5, columns=4), rows[:, :4])


def test_a_multi_sweep_model_refuses_fifth_values_that_are_no_time_lags(assets: Path, tmp_path: Path) -> None:
    """Ring numbers, absolute timestamps (s or us) and lags of the wrong sign in the 5th column: refused for a
    model that reads time lags there (.bin and .npy), naming the values seen and the fix; the real
    multi-sweep frames (lags 0 to 0.2 s) and a 4-value model's read of the same files pass."""
    frame = np.fromfile(sorted((assets / "nuscenes").glob("*.bin"))[0], "<f4").reshape(-1, 5)
    np.testing.assert_array_equal(read_points(sorted((assets / "nuscenes").glob("*.bin"))[0], point_dim=5), frame)
    rng = np.random.default_rng(5)
    for name, fifth, seen in (("ring", rng.integers(0, 32, len(frame)), "from 0 to 31"),
                              ("stamp", 1.7e9 + frame[:, 4], "from 1.7e+09"),
                              ("stamp_us", 1.7e15 + 1e6 * frame[:, 4], "from 1.7e+15"),
                              ("negative", -frame[:, 4] - 0.05, "to -0.05")):
        rows = frame.copy()
        rows[:, 4] = fifth
        rows.tofile(tmp_path / f"{name}.bin")
        np.save(tmp_path / f"{name}.npy", rows)
        for path in (tmp_path / f"{name}.bin", tmp_path / f"{name}.npy"):
            with pytest.raises(InputError) as err:
                read_points(path, point_dim=5)
            text = str(err.value)
            assert str(path) in text and seen in text and "time lag" in text, text
            assert "PointPillars.accumulate" in text, text
            np.testing.assert_array_equal(read_points(path, point_dim=5, columns=4), rows[:, :4])


def test_ring_numbers_in_the_tail_of_a_long_multi_sweep_frame_are_refused(tmp_path: Path) -> None:
    """A frame of 7 good sweeps whose last 20,000 points carry ring numbers in the 5th column (a sweep of
    another layout concatenated last): every point's value is judged, not samples from the start and the
    middle, which let it through to 8x the boxes."""
    rows = sweep_rows(7 * 100_000, seed=9)
    rows[-20_000:, 4] = np.arange(20_000) % 32
    rows.tofile(tmp_path / "tail.bin")
    with pytest.raises(InputError, match=r"its 5th values run from 0 to 31, .*time lag"):
        read_points(tmp_path / "tail.bin", point_dim=5)
    rows[-20_000:, 4] = 0.25
    rows.tofile(tmp_path / "good.bin")
    np.testing.assert_array_equal(read_points(tmp_path / "good.bin", point_dim=5), rows)


def test_a_multi_sweep_frame_whose_intensity_and_time_columns_are_swapped_is_told_so(assets: Path,
                                                                                     tmp_path: Path) -> None:
    """x, y, z, time, intensity (a writer's other order): refused as of ring numbers or timestamps, with
    accumulate for its fix, which does not help; now the message names the swap and the reorder, and the
    reorder reads the frame. Intensities scaled to 0-1 (hundreds of distinct values) beside ring numbers are no
    swap: the message stays."""
    frame = read_points(sorted((assets / "nuscenes").glob("*.bin"))[0], point_dim=5)
    swapped = np.ascontiguousarray(frame[:, [0, 1, 2, 4, 3]])
    swapped.tofile(tmp_path / "swapped.bin")
    with pytest.raises(InputError) as err:
        read_points(tmp_path / "swapped.bin", point_dim=5)
    text = str(err.value)
    assert "its 4th values look like the time lags this model reads 5th" in text, text
    assert "swap the last two (points[:, [0, 1, 2, 4, 3]])" in text and "accumulate" not in text, text
    points = swapped[:, [0, 1, 2, 4, 3]]  # the fix, as said, and the frame re-saved
    points.tofile(tmp_path / "fixed.bin")
    np.testing.assert_array_equal(read_points(tmp_path / "fixed.bin", point_dim=5), frame)
    rings = frame.copy()
    rings[:, 3] = np.random.default_rng(3).uniform(0, 1, len(frame))
    rings[:, 4] = np.arange(len(frame)) % 32
    rings.tofile(tmp_path / "rings.bin")
    with pytest.raises(InputError, match="not ring numbers or timestamps") as err:
        read_points(tmp_path / "rings.bin", point_dim=5)
    assert "swap" not in str(err.value)


def capture_times(frame: np.ndarray) -> np.ndarray:
    """Each point's capture time within one 0.1 s turn of a spinning lidar, by its azimuth: what some drivers write
    as a point's "time" (thousands of distinct values from 0 to 0.1 s)."""
    return ((np.arctan2(frame[:, 1], frame[:, 0]) + np.pi) / (2 * np.pi) * 0.1).astype(np.float32)


def time_lag_warnings(call) -> list[str]:  # type: ignore[no-untyped-def]
    """The InputWarnings ``call()`` gives, each said once where it comes from as Python's default filter says it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, InputWarning)]


def frame_files(frame: np.ndarray, folder: Path) -> list[Path]:
    """``frame`` written as a .bin, a .npy and a binary .pcd (fields x y z intensity time) in ``folder``."""
    paths = [folder / "times.bin", folder / "times.npy", folder / "times.pcd"]
    frame.tofile(paths[0])
    np.save(paths[1], frame)
    paths[2].write_bytes(b"VERSION 0.7\nFIELDS x y z intensity time\nSIZE 4 4 4 4 4\nTYPE F F F F F\n"
                         b"COUNT 1 1 1 1 1\nWIDTH %d\nHEIGHT 1\nPOINTS %d\nDATA binary\n" % (len(frame), len(frame))
                         + frame.tobytes())
    return paths


def test_per_point_capture_times_for_time_lags_are_warned_of_once_a_file_or_array(assets: Path,
                                                                                  tmp_path: Path) -> None:
    """A multi-sweep frame whose 5th values are each point's capture time within its sweep (0-0.1 s) lies in the
    time lags' range and was read without a word: the PFN took them for the lags of thousands of sweeps. Warned
    (InputWarning), naming the file and the fix, once a file however often it is read (.bin, .npy, .pcd: read_points
    and read_points_into), once for arrays (the detector's check, which names them "points"); read as they are."""
    frame = read_points(assets / NUSCENES_FRAMES[0], point_dim=5)
    frame[:, 4] = capture_times(frame)
    assert len(np.unique(frame[:, 4])) > 1000
    paths = frame_files(frame, tmp_path)

    def read_each_twice() -> None:
        for path in paths:
            for _ in range(2):
                np.testing.assert_array_equal(read_points(path, point_dim=5), frame)
                np.testing.assert_array_equal(read_points_into(path, lambda n: np.empty((n, 4), np.float32),
                                                               point_dim=5, columns=5), frame)

    said = time_lag_warnings(read_each_twice)
    assert [text.split(": ", 1)[0] for text in said] == [f"point file {str(path)!r}" for path in paths], said
    for text in said:
        assert text.split(": ", 1)[1] == (
            "its 5th values take more distinct values than a frame has sweeps (over 32 among points spread over "
            "it), but this model reads there each sweep's time lag behind the key sweep, one value for all of a "
            "sweep's points: per-point capture times within a sweep (a lidar driver's time field)? build multi-sweep "
            "frames with PointPillars.accumulate (sweeps.accumulate_sweeps), which gives each sweep's points its lag")
    other = frame.copy()
    other[:, 4] *= 0.5
    said = time_lag_warnings(lambda: [check_time_lags(f.reshape(-1), 5, "points") for f in (frame, other, frame)])
    assert len(said) == 1 and said[0].startswith("points: its 5th values take more distinct values"), said


def test_per_point_capture_times_go_to_the_reads_note_in_place_of_the_warning(assets: Path, tmp_path: Path) -> None:
    """``capture_times_note``: the warning's text, once a read, and no warning (a caller that says it in words of its
    own takes the read's finding), for a file of each format, read or read into rows, and for a .bin's bytes."""
    frame = read_points(assets / NUSCENES_FRAMES[0], point_dim=5)
    frame[:, 4] = capture_times(frame)
    paths = frame_files(frame, tmp_path)
    noted: list[str] = []

    def rows(n: int) -> np.ndarray:
        return np.empty((n, 4), np.float32)

    def read_each() -> None:
        for path in paths:
            read_points(path, point_dim=5, capture_times_note=noted.append)
            read_points_into(path, rows, point_dim=5, columns=5, capture_times_note=noted.append)
        read_bin_bytes_into(paths[0].read_bytes(), rows, point_dim=5, columns=5, source="times.bin",
                            capture_times_note=noted.append)

    assert time_lag_warnings(read_each) == []
    warned = [f"point file {str(path)!r}" for path in paths for _ in range(2)] + ["point file 'times.bin'"]
    assert [text.split(": ", 1)[0] for text in noted] == warned, noted
    assert {text.split(": ", 1)[1] for text in noted} == {
        "its 5th values take more distinct values than a frame has sweeps (over 32 among points spread over it), but "
        "this model reads there each sweep's time lag behind the key sweep, one value for all of a sweep's points: "
        "per-point capture times within a sweep (a lidar driver's time field)? build multi-sweep frames with "
        "PointPillars.accumulate (sweeps.accumulate_sweeps), which gives each sweep's points its lag"}


def test_real_multi_sweep_frames_are_not_warned_of(assets: Path, tmp_path: Path) -> None:
    """The assets' nuScenes frames (sweeps of one lag each; 14,500 and 10,053 points) and a frame of one sweep
    (lag 0) say nothing; nor does a frame of 32 sweeps, the most a frame's lags are taken to be."""
    def read_all() -> None:
        for name in NUSCENES_FRAMES:
            read_points(assets / name, point_dim=5)
        frame = read_points(assets / NUSCENES_FRAMES[0], point_dim=5)
        frame[:, 4] = 0
        check_time_lags(frame.reshape(-1), 5, "points")
        frame[:, 4] = np.float32(0.05) * (np.arange(len(frame)) % 32)
        check_time_lags(frame.reshape(-1), 5, "points")

    assert time_lag_warnings(read_all) == []


def expected_lag_summary(lags: np.ndarray) -> tuple[float, float, np.ndarray]:
    """What the host check judges ``lags`` by, worked out plainly: the lags it keeps (all; where one is NaN, the
    finite ones), their minimum and maximum (inf and -inf for none), and every ceil(n / 512)-th of them."""
    kept = lags[np.isfinite(lags)] if np.isnan(lags).any() else lags
    if kept.size == 0:
        return np.inf, -np.inf, kept
    return float(kept.min()), float(kept.max()), kept[:: max(1, math.ceil(kept.size / 512))]


def test_a_lag_summary_holds_the_lags_kept_their_extremes_and_sample(assets: Path) -> None:
    """``lag_summary`` (a GPU frame's, worked out here with NumPy): the minimum and maximum of the lags the host check
    keeps and the sample its look for capture times counts, NaN after it, for frames of every size about the
    sample's, with NaN rows, infinite lags beside NaN or not, none finite, none at all, and as a strided column."""
    frame = read_points(assets / NUSCENES_FRAMES[0], point_dim=5)
    rng = np.random.default_rng(8)
    columns = {"asset": np.ascontiguousarray(frame[:, 4]), "strided": frame[:, 4], "empty": np.empty(0, np.float32),
               "nan": np.full(700, np.nan, np.float32)}
    for n in (1, 2, 511, 512, 513, 1024, 1025, 1537, 300_000):
        columns[f"random {n}"] = rng.uniform(0, 0.45, n).astype(np.float32)
        holes = columns[f"random {n}"].copy()
        holes[rng.random(n) < 0.3] = np.nan  # rows of no return
        columns[f"nan rows {n}"] = holes
        infinite = columns[f"random {n}"].copy()
        infinite[rng.integers(0, n, 3)] = np.inf
        columns[f"inf {n}"] = infinite  # no NaN: every lag kept, inf among them
        both = holes.copy()
        both[rng.integers(0, n, 3)] = -np.inf
        columns[f"inf and nan {n}"] = both  # NaN: only finite lags kept
    for name, lags in columns.items():
        summary = lag_summary(lags, np)
        lo, hi, sample = expected_lag_summary(lags)
        assert summary.dtype == np.float32 and summary.shape == (LAG_SUMMARY_SIZE,), name
        assert (summary[0], summary[1]) == (lo, hi), name
        np.testing.assert_array_equal(summary[2 : 2 + sample.size], sample, err_msg=name)
        assert np.isnan(summary[2 + sample.size :]).all() and sample.size <= 512, name


def judged(call) -> tuple[str | None, list[str]]:  # type: ignore[no-untyped-def]
    """The InputError ``call()`` raised (None: none) and the InputWarnings it gave, each said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
            error = None
        except InputError as exc:
            error = str(exc)
    return error, [str(w.message) for w in caught if issubclass(w.category, InputWarning)]


def test_a_frame_judged_from_its_lag_summary_is_judged_as_the_host_check_judges_it(assets: Path) -> None:
    """A GPU frame's time lags are judged from their ``lag_summary`` read back (``judge_lag_summary``): the same
    refusals (ring numbers, timestamps, lags of the wrong sign, a tail of another layout, swapped columns, rings
    beside 0-1 intensities) and the same warning of capture times as the host check gives, NaN rows skipped
    alike; real, empty and all-NaN frames pass. The 4th column is asked for only for a frame refused."""
    frame = read_points(assets / NUSCENES_FRAMES[0], point_dim=5)
    rng = np.random.default_rng(6)

    def with_fifth(values: np.ndarray | float) -> np.ndarray:
        rows = frame.copy()
        rows[:, 4] = values
        return rows

    rings = with_fifth(np.arange(len(frame)) % 32)
    rings[:, 3] = rng.uniform(0, 1, len(frame))
    tail = frame.copy()
    tail[-1000:, 4] = np.arange(1000) % 32
    holes = frame.copy()
    holes[rng.random(len(frame)) < 0.2] = np.nan
    timed_holes = with_fifth(capture_times(frame))
    timed_holes[::7] = np.nan
    cases = {
        "ring": (with_fifth(rng.integers(0, 32, len(frame))), "its 5th values run from 0 to 31, but this model"),
        "stamp": (with_fifth(1.7e9 + frame[:, 4]), "its 5th values run from 1.7e+09 to 1.7e+09, but this model"),
        "negative": (with_fifth(-frame[:, 4] - 0.05), "its 5th values run from -0.25 to -0.05, but this model"),
        "tail": (tail, "its 5th values run from 0 to 31, but this model"),
        "swapped": (np.ascontiguousarray(frame[:, [0, 1, 2, 4, 3]]), "its 4th values look like the time lags"),
        "rings": (rings, "its 5th values run from 0 to 31, but this model"),
        "capture times": (with_fifth(capture_times(frame)), None),
        "capture times, NaN rows": (timed_holes, None),
        "real": (frame, None),
        "real, NaN rows": (holes, None),
        "empty": (frame[:0], None),
        "no lag": (with_fifth(np.nan), None),
    }
    for name, (rows, refusal) in cases.items():
        asked: list[str] = []

        def fourth() -> np.ndarray:
            asked.append(name)
            return rows[:, 3]

        on_host = judged(lambda: check_time_lags(rows.reshape(-1), 5, "points"))
        from_summary = judged(lambda: judge_lag_summary(lag_summary(rows[:, 4], np), fourth, "points"))
        assert from_summary == on_host, name
        error, said = from_summary
        assert asked == ([name] if refusal else []), name
        if refusal is None:
            assert error is None, (name, error)
        else:
            assert error is not None and error.startswith(f"points: {refusal}"), (name, error)
        timed = name.startswith("capture times")
        assert [text.split(": ", 1)[1].startswith("its 5th values take more distinct values") for text in said] == (
            [True] if timed else []), (name, said)


def test_single_sweeps_given_to_a_multi_sweep_model_name_accumulate(assets: Path, tmp_path: Path) -> None:
    """A KITTI scan (4 values a point) read for a model of 5 point columns: the error says the model needs
    multi-sweep frames, each point's 5th value its time lag (which a 5th value of another kind is not), not
    --point-dim 4 (which that model refuses)."""
    rows = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    rows[: len(rows) // 5 * 5].tofile(tmp_path / "single.bin")
    with pytest.raises(InputError) as err:
        read_points(tmp_path / "single.bin", point_dim=5)  # columns 5: a multi-sweep model's read
    text = str(err.value)
    assert "this model reads 5 a point" in text and "PointPillars.accumulate" in text and "--point-dim" not in text
    assert "needs accumulated frames, each point's 5th value its time lag behind the key sweep" in text, text
    with pytest.raises(InputError, match="pass --point-dim 4"):
        read_points(tmp_path / "single.bin", point_dim=5, columns=4)  # a KITTI model: the other layout fits


def test_float64_with_zero_or_nan_rows_is_refused_and_planar_float32_is_read(assets: Path, tmp_path: Path) -> None:
    """float64 frames that start with zero rows (an organised cloud's no-return points) or hold NaN rows
    are refused too; float32 frames with a zero column (a planar scan: z = 0, some x = 0) or of whole
    numbers (a test grid) are read as they are."""
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    zeros = scan.astype("<f8")
    zeros[:40] = 0
    nan_rows = scan.astype("<f8")
    nan_rows[::3] = np.nan
    for name, rows in (("zeros", zeros), ("nan_rows", nan_rows)):
        rows.tofile(tmp_path / f"{name}.bin")
        float64_refused(tmp_path / f"{name}.bin")
    rng = np.random.default_rng(13)
    n = 4000
    planar = np.column_stack([rng.uniform(-7, 7, (n, 2)), np.zeros(n), rng.uniform(0.05, 1, n)]).astype("<f4")
    planar[rng.random(n) < 0.02, 0] = 0
    grid = np.array([[x, y, 0, 1] for x in range(8) for y in range(-7, 8)] * 20, "<f4")
    for name, rows in (("planar", planar), ("grid", grid)):
        rows.tofile(tmp_path / f"{name}.bin")
        np.testing.assert_array_equal(read_points(tmp_path / f"{name}.bin"), rows)


def test_a_text_file_named_bin_is_refused_as_text_whatever_its_size_or_point_dim(assets: Path, tmp_path: Path) -> None:
    """A point list written as numbers (np.savetxt) in a .bin: refused as text, with the fix, both where its
    size fits no rows (before: "pass --point-dim 5", then "random bytes" with it) and where it does."""
    rows = np.fromfile(assets / "kitti/training/velodyne_reduced/000134.bin", "<f4").reshape(-1, 4)[:500]
    np.savetxt(tmp_path / "list.bin", rows)
    (tmp_path / "list16.bin").write_bytes((tmp_path / "list.bin").read_bytes()[: 16 * 3000])
    assert (tmp_path / "list.bin").stat().st_size % 16  # the size check would be first
    for name in ("list.bin", "list16.bin"):
        for point_dim in (4, 5):
            with pytest.raises(InputError, match=f"'{tmp_path / name}' is text, not float32 values.*numpy.loadtxt"):
                read_points(tmp_path / name, point_dim=point_dim, columns=4)
        with pytest.raises(InputError, match="is text, not float32 values"):
            read_points_into(tmp_path / name, lambda n: None)
        with pytest.raises(InputError, match="is text, not float32 values"):
            read_bin_bytes_into((tmp_path / name).read_bytes(), lambda n: None, source=name)



def test_files_of_other_formats_named_bin_are_refused_by_what_they_are(assets: Path, tmp_path: Path) -> None:
    """A .npy renamed .bin ran with its header read as 8 points of values up to 1e31 (junk boxes, a slow
    frame, and advice about --intensity-scale); an .npz, a PCD or a PLY file named .bin are named too,
    whatever their sizes (the .npy's fits rows of 16 bytes, so only its values could have told)."""
    rows = np.fromfile(assets / "kitti/training/velodyne_fov/000000.bin", "<f4").reshape(-1, 4)
    np.save(tmp_path / "a.npy", rows)
    (tmp_path / "npy.bin").write_bytes((tmp_path / "a.npy").read_bytes())
    assert (tmp_path / "npy.bin").stat().st_size % 16 == 0
    np.savez(tmp_path / "a.npz", points=rows)
    (tmp_path / "npz.bin").write_bytes((tmp_path / "a.npz").read_bytes())
    header = ("# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\n"
              "TYPE F F F F\nCOUNT 1 1 1 1\nWIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA binary\n")
    (tmp_path / "pcd.bin").write_bytes(header.format(n=len(rows)).encode() + rows.tobytes())
    (tmp_path / "pcd_bare.bin").write_bytes(header.format(n=len(rows)).split("\n", 1)[1].encode() + rows.tobytes())
    ply = f"ply\nformat binary_little_endian 1.0\nelement vertex {len(rows)}\nproperty float x\nend_header\n"
    (tmp_path / "ply.bin").write_bytes(ply.encode() + rows.tobytes())
    expected = {"npy.bin": "is a NumPy .npy file, not raw float32 values: name it .npy",
                "npz.bin": "is a zip archive \\(an .npz\\?\\)", "pcd.bin": "is a PCD file.*name it .pcd",
                "pcd_bare.bin": "is a PCD file.*name it .pcd", "ply.bin": "is a PLY file"}
    for name, text in expected.items():
        path = tmp_path / name
        for point_dim in (4, 5):
            with pytest.raises(InputError, match=f"'{path}' {text}"):
                read_points(path, point_dim=point_dim, columns=4)
        with pytest.raises(InputError, match=text):
            read_points_into(path, lambda n: None)
        with pytest.raises(InputError, match=text):
            read_bin_bytes_into(path.read_bytes(), lambda n: None, source=name)
    np.testing.assert_array_equal(read_points(tmp_path / "a.npy"), rows)  # named .npy, it reads

def test_a_kitti_scan_cut_short_is_named_so_whatever_point_dim_is_tried(assets: Path, tmp_path: Path) -> None:
    """A full scan cut at 200,020 bytes holds whole rows of 5 values, not of 4: the size error's advice was
    --point-dim 5 alone, and with it the frame ran on shifted columns without a word (500 boxes at score 1).
    Now the size error says the file may be cut short, and read as 5 it is named a 4-value file cut short."""
    cut = tmp_path / "000000.bin"
    cut.write_bytes((assets / "kitti/training/velodyne/000000.bin").read_bytes()[:200_020])
    with pytest.raises(InputError, match=r"not a multiple of 16 .*pass --point-dim 5.*unless the file was cut short"):
        read_points(cut, columns=4)
    with pytest.raises(InputError, match=r"looks like 4 float32 values a point .* read as 5, but it holds no whole "
                                         r"rows of 4: a file of 4 values a point cut short"):
        read_points(cut, point_dim=5, columns=4)


@pytest.mark.parametrize("wide,extras", [(6, "ring, flag"), (8, "ring, flags"), (8, "range, ring, time, 0"),
                                         (8, "zeros")])
def test_wider_rows_of_non_negative_extras_read_as_4_name_their_row_length(assets: Path, tmp_path: Path,
                                                                           wide: int, extras: str) -> None:
    """A real KITTI scan written with extra columns of non-negative values (a ring, a range, a time, flags,
    zero padding): read as 4 values a point, its "intensities" never go negative, and may pass the 0-1 scale
    or not; the error names the row length the file has, found from which values follow each other, or from
    the extra values' signs, unlike a point's x and y (it said "0-255 intensities" with a scale fix, the rows
    of 3 its size also fits, or nothing)."""
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    rows = np.zeros((len(scan), wide), "<f4")
    rows[:, :4] = scan
    index = np.arange(len(scan))
    if extras == "range, ring, time, 0":  # the 0 is read as every other point's intensity: within 0-1
        rows[:, 4:7] = np.column_stack([np.hypot(scan[:, 0], scan[:, 1]), index % 64, index * 1e-6])
    elif extras != "zeros":
        rows[:, 4] = index % 64  # a ring number
        rows[:, 5:] = np.linspace(0.0, 7.0, wide - 5)  # constants: a return number, a flag
    if len(rows) * wide % 4:
        rows = rows[:-1]
    path = tmp_path / f"wide{wide}.bin"
    rows.tofile(path)
    for read in (lambda: read_points(path), lambda: read_points_into(path, lambda n: None)):
        with pytest.raises(InputError) as err:
            read()
        text = str(err.value)
        assert f"pass --point-dim {wide} (Python: point_dim={wide})" in text or \
            f"pass --point-dim {wide}; Python: point_dim={wide}" in text, text
        assert f"intensity and {wide - 4} more values" in text and "rows of 3" not in text, text
    np.testing.assert_array_equal(read_points(path, point_dim=wide), rows[:, :4])


def test_frames_read_right_with_intensities_past_1_are_not_taken_for_wider_rows(assets: Path) -> None:
    """0-255 intensities (KITTI scans x 255; nuScenes sweeps), in scan order or shuffled: no row length is
    found for them, whichever row length up to 16 the look compares."""
    rng = np.random.default_rng(4)
    for path in sorted((assets / "kitti").rglob("*.bin")):
        rows = np.fromfile(path, "<f4").reshape(-1, 4).copy()
        rows[:, 3] *= 255
        for data in (rows, rows[rng.permutation(len(rows))]):
            assert misread_row_length(np.ascontiguousarray(data).ravel(), 4) is None, path
    for name in NUSCENES_FRAMES:
        rows = np.fromfile(assets / name, "<f4").reshape(-1, 5)
        for data in (rows, rows[rng.permutation(len(rows))]):
            assert misread_row_length(np.ascontiguousarray(data).ravel(), 5) is None, name


def spinning_scan(elevations_deg: list[float], seed: int, azimuths: int = 1800) -> np.ndarray:
    """A spinning lidar's points in firing order (each azimuth's lasers in the order they fire, e.g. a VLP-16's
    -15, +1, -13, +3, ... degrees), over a ground plane 1.73 m down and a wall 5-25 m out; 0-255 intensities."""
    rng = np.random.default_rng(seed)
    azimuth, elevation = (a.ravel() for a in np.meshgrid(np.linspace(0, 2 * np.pi, azimuths, endpoint=False),
                                                          np.deg2rad(elevations_deg), indexing="ij"))
    wall = 15 + 10 * np.sin(3 * azimuth) + rng.normal(0, 0.3, azimuth.size)
    reach = np.where(elevation < 0, np.minimum(1.73 / np.maximum(np.sin(-elevation), 1e-6), wall), wall)
    keep = (reach < 120) & (rng.random(azimuth.size) > 0.1)
    reach, azimuth, elevation = reach[keep], azimuth[keep], elevation[keep]
    return np.column_stack([reach * np.cos(elevation) * np.cos(azimuth), reach * np.cos(elevation) * np.sin(azimuth),
                            reach * np.sin(elevation), rng.gamma(2, 15, reach.size).clip(0, 255)]).astype("<f4")


def test_points_in_firing_order_or_dual_returns_are_not_taken_for_wider_rows(tmp_path: Path) -> None:
    """Points two rows apart can be closer than neighbours (lasers fired low and high in turn; a dual-return
    lidar's two returns of a ray, a missing one written as zeros): read as 4 values a point with 0-255
    intensities, they look like rows of 8 by their steps alone, but the 5th-6th values are a point's x and y,
    negative as often as the first point's: read, not refused."""
    vlp16 = [-15, 1, -13, 3, -11, 5, -9, 7, -7, 9, -5, 11, -3, 13, -1, 15]
    low = list(-30.67 + 1.3333 * np.arange(16))
    hdl32 = [angle for pair in zip(low, [a + 21.33 for a in low]) for angle in pair]
    for elevations in (vlp16, hdl32):
        for seed in range(2):
            scan = spinning_scan(elevations, seed)
            assert misread_row_length(scan.ravel(), 4) is None
            dual = np.repeat(scan, 2, axis=0)
            dual[1::2, :3] *= 1.02  # the second return, a little farther along the same ray
            dual[1::2][np.random.default_rng(seed).random(len(scan)) < 0.6] = 0  # most rays return once
            assert misread_row_length(dual.ravel(), 4) is None
            path = tmp_path / f"dual{seed}.bin"
            dual.tofile(path)
            np.testing.assert_array_equal(read_points(path), dual)


def with_extras(points: np.ndarray, extras: tuple[str, ...]) -> np.ndarray:
    """``points`` (x, y, z, intensity[, lag]) with columns after them that lidar tools write: a ring, a time,
    a range, flags, 0-255 reflectivity, ambient light, zero padding, the point in the ego frame (a lidar
    mounted 3 m ahead, 2 m left and 1 m up), a second return 2 % farther along the same ray."""
    index, rng = np.arange(len(points)), np.random.default_rng(len(extras))
    made = {"ring": index % 64, "time": index * 1e-6, "range": np.hypot(points[:, 0], points[:, 1]),
            "zeros": np.zeros(len(points)), "flag": np.full(len(points), 2.0),
            "reflectivity": rng.integers(0, 256, len(points)), "ambient": rng.integers(0, 4000, len(points)),
            "ego x": points[:, 0] + 3, "ego y": points[:, 1] + 2, "ego z": points[:, 2] - 1,
            "second x": points[:, 0] * 1.02, "second y": points[:, 1] * 1.02, "second z": points[:, 2] * 1.02,
            "second intensity": points[:, 3] * 0.5}
    return np.column_stack([points, *(made[name] for name in extras)]).astype("<f4")


@pytest.mark.parametrize("extras", [("ring",), ("ring", "flag"), ("range", "ring", "time", "zeros"),
                                    ("zeros",) * 4, ("time", "reflectivity", "ring", "ambient", "range"),
                                    ("zeros", "zeros"), ("time",) * 8, ("ego x", "ego y", "ego z", "time"),
                                    ("second x", "second y", "second z", "second intensity")])
def test_wider_files_read_with_their_own_row_length_are_read(assets: Path, tmp_path: Path,
                                                             extras: tuple[str, ...]) -> None:
    """Real KITTI scans and crops, a spinning lidar's scan in firing order and nuScenes sweeps, written with
    extra columns and read with their own row length, in scan order or shuffled: read, never taken for rows
    of 3, 4 or 5 read as wider ones (the point's copy in the ego frame and a second return were, shuffled:
    their extra values are x, y and z too)."""
    kitti = sorted((assets / "kitti" / "training").glob("velodyne*/*.bin"))[::4]
    frames = [np.fromfile(path, "<f4").reshape(-1, 4) for path in kitti]
    frames += [spinning_scan([-15, 1, -13, 3, -11, 5, -9, 7, -7, 9, -5, 11, -3, 13, -1, 15], 0)]
    frames += [np.fromfile(assets / name, "<f4").reshape(-1, 5) for name in NUSCENES_FRAMES]
    rng = np.random.default_rng(9)
    for number, points in enumerate(frames):
        rows = with_extras(points, extras)
        for data in (rows, rows[rng.permutation(len(rows))]):
            path = tmp_path / f"wide{number}.bin"
            data.tofile(path)
            np.testing.assert_array_equal(read_points(path, point_dim=rows.shape[1], columns=4), data[:, :4])


@pytest.mark.parametrize("wide", [6, 7, 8, 12, 16])
def test_four_value_scans_read_as_wider_rows_are_refused_naming_point_dim_4(assets: Path, tmp_path: Path,
                                                                              wide: int) -> None:
    """A KITTI scan or crop (4 values a point) read with a wider row length: each row holds parts of two or
    more points, and the model would take every other point's x, y, z, intensity (rows of 8) or fields mixed
    up, without a word (it looked at rows of 4 or 5 only). Refused for rows of 4, from the steps of scan order
    or, for multiples of 4, also shuffled, from the extra values being x, y, z and intensities."""
    rng = np.random.default_rng(wide)
    for name in sorted((assets / "kitti" / "training").glob("velodyne*/*.bin"))[::3]:
        scan = np.fromfile(name, "<f4").reshape(-1, 4)
        orders = (scan, scan[rng.permutation(len(scan))]) if wide % 4 == 0 else (scan,)
        for data in orders:
            flat = np.ascontiguousarray(data).ravel()
            path = tmp_path / "scan.bin"
            flat[: flat.size // np.lcm(4, wide) * np.lcm(4, wide)].tofile(path)
            for read in (lambda: read_points(path, point_dim=wide),
                         lambda: read_points_into(path, lambda n: None, point_dim=wide)):
                with pytest.raises(InputError, match=rf"looks like 4 float32 values a point \(x, y, z, intensity, "
                                                      rf"as KITTI writes them\) read as {wide}; pass --point-dim 4"):
                    read()


def test_five_and_three_value_frames_read_as_wider_rows_name_what_they_are(assets: Path, tmp_path: Path) -> None:
    """nuScenes sweeps (5 values a point) read as 8 or 10 name --point-dim 5; x, y, z rows read as 6 or 9 name
    the missing intensities; a multi-sweep model given single sweeps read as 8 names accumulate."""
    rng = np.random.default_rng(3)
    for name in NUSCENES_FRAMES:
        sweep = np.fromfile(assets / name, "<f4").reshape(-1, 5)
        for wide, orders in ((8, (sweep,)), (10, (sweep, sweep[rng.permutation(len(sweep))]))):
            for data in orders:
                flat = np.ascontiguousarray(data).ravel()
                path = tmp_path / "sweep.bin"
                flat[: flat.size // np.lcm(5, wide) * np.lcm(5, wide)].tofile(path)
                with pytest.raises(InputError, match=rf"looks like 5 float32 values a point .* read as {wide}; "
                                                      "pass --point-dim 5"):
                    read_points(path, point_dim=wide)
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4").reshape(-1, 4)
    for wide in (6, 9):
        path = tmp_path / "xyz.bin"
        xyz = scan[:, :3].ravel()
        xyz[: xyz.size // wide * wide].tofile(path)
        with pytest.raises(InputError, match=rf"looks like 3 float32 values a point .* read as {wide}: .*"
                                              "write each point's intensity too"):
            read_points(path, point_dim=wide)
    path = tmp_path / "single.bin"
    scan.ravel()[: scan.size // 8 * 8].tofile(path)
    with pytest.raises(InputError, match=r"read as 8; this model reads 5 a point .*PointPillars.accumulate"):
        read_points(path, point_dim=8, columns=5)


def test_a_scan_read_as_wider_rows_its_size_does_not_fit_is_pointed_to_its_row_length(assets: Path,
                                                                                         tmp_path: Path) -> None:
    """A KITTI scan read with rows of 6, 7 or 9, which its size does not fit: the size error names rows of 4
    (it said the size alone above 5 values a point)."""
    scan = np.fromfile(sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))[0], "<f4")
    for wide in (6, 7, 9):
        values = scan if scan.size % wide else scan[:-4]
        path = tmp_path / "scan.bin"
        values.tofile(path)
        with pytest.raises(InputError, match=rf"not a multiple of {4 * wide} \({wide} float32 values a point\); its "
                                              r"size fits rows of 4 values .* pass --point-dim 4"):
            read_points(path, point_dim=wide)
