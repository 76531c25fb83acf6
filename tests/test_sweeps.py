"""Sweep accumulation: earlier sweeps moved into the key sweep's frame with their time lag."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt import PointPillars
from pointpillars_trt.errors import InputError, InputWarning
from pointpillars_trt.point_layout import check_time_lags
from pointpillars_trt.pointcloud_io import read_points
from pointpillars_trt.points import as_host_points
from pointpillars_trt.sweeps import accumulate_sweeps
from array_likes import GradTensorLike, HostDlpackLike
from tiny_graphs import cuda_skip_reason


def rigid(yaw: float, t: tuple[float, float, float]) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    m = np.eye(4)
    m[:2, :2] = [[c, -s], [s, c]]
    m[:3, 3] = t
    return m


def scene() -> tuple[list[np.ndarray], list[np.ndarray], list[float], np.ndarray]:
    """World points seen from 3 poses: each sweep holds them in its own sensor frame."""
    rng = np.random.default_rng(0)
    world = np.c_[rng.uniform(-40, 40, (200, 3)), rng.uniform(0, 255, 200)]
    poses = [rigid(0.3, (100.0, 50.0, 1.8)), rigid(0.25, (99.2, 49.7, 1.8)), rigid(0.2, (98.5, 49.4, 1.79))]
    sweeps = []
    for pose in poses:
        local = (np.linalg.inv(pose) @ np.c_[world[:, :3], np.ones(len(world))].T).T[:, :3]
        sweeps.append(np.c_[local, world[:, 3]].astype(np.float32))
    return sweeps, poses, [1000.0, 999.95, 999.9], world


def test_earlier_sweeps_land_where_the_key_sweep_sees_the_world() -> None:
    sweeps, poses, stamps, world = scene()
    frame = PointPillars.accumulate(sweeps, poses, stamps, ego_radius=None)
    assert frame.dtype == np.float32 and frame.shape == (600, 5)
    key_view = (np.linalg.inv(poses[0]) @ np.c_[world[:, :3], np.ones(len(world))].T).T[:, :3]
    for i in range(3):
        part = frame[200 * i: 200 * (i + 1)]
        np.testing.assert_allclose(part[:, :3], key_view, atol=2e-5)  # float32 round trips of ~100 m
        np.testing.assert_array_equal(part[:, 3], sweeps[i][:, 3])
        assert np.all(part[:, 4] == np.float32(stamps[0] - stamps[i]))
    assert frame[:200, 4].max() == 0 and np.array_equal(frame[:200, :4], sweeps[0])  # the key sweep as given


def test_non_finite_and_extreme_points_stay_so_without_numpy_warnings() -> None:
    """Sweeps with NaN and infinite points (a driver's no-return markers) and coordinates at float32's limit:
    the non-finite ones stay non-finite (the detector counts and drops them), the others land where the key
    sweep sees them; NumPy's "invalid value encountered in matmul" (inf times a rotation's 0) and "overflow
    encountered in cast" (3.4e38 m turned past float32's limit) were printed on stderr."""
    sweeps, poses, stamps, world = scene()
    marked = [sweep.copy() for sweep in sweeps]
    for sweep in marked:
        sweep[0, 0], sweep[1, 1], sweep[2, 2] = np.inf, -np.inf, np.nan
        sweep[3, :2] = 3.4e38
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = PointPillars.accumulate(marked, poses, stamps, ego_radius=None)
    key_view = (np.linalg.inv(poses[0]) @ np.c_[world[:, :3], np.ones(len(world))].T).T[:, :3]
    for i in range(3):
        part = frame[200 * i: 200 * (i + 1)]
        assert not np.isfinite(part[:3, :3]).all(axis=1).any()
        if i:  # turned by another yaw than the key sweep's: past float32's range
            assert not np.isfinite(part[3, :2]).all()
        np.testing.assert_allclose(part[4:, :3], key_view[4:], atol=2e-5)


def test_ego_points_of_earlier_sweeps_are_dropped() -> None:
    key = np.array([[0.5, 0.5, 0, 1], [5, 0, 0, 2]], np.float32)
    earlier = np.array([[0.5, -0.9, 0, 3], [0.5, 1.0, 0, 4], [-2, 0.1, 0, 5]], np.float32)
    frame = accumulate_sweeps([key, earlier], [np.eye(4), np.eye(4)], [1.0, 0.5])
    assert frame[:, 3].tolist() == [1, 2, 4, 5]  # the key sweep keeps its ego point; |x|, |y| < 1 goes
    assert frame[:, 4].tolist() == [0, 0, 0.5, 0.5]


@pytest.mark.parametrize("args, message", [
    (([], [], []), "0 sweeps, 0 poses and 0 timestamps"),
    (([np.zeros((2, 4), np.float32)], [np.eye(4), np.eye(4)], [0.0]), "1 sweep, 2 poses and 1 timestamp"),
    (([np.zeros((2, 3), np.float32)], [np.eye(4)], [0.0]), "sweep 0 has shape (2, 3)"),
    (([[[1, 2, 3, 4], [1, 2]]], [np.eye(4)], [0.0]), "sweep 0: cannot be read as an (N, 4) array of x, y, z, intensity"),
    (([np.zeros((2, 4), np.float16)], [np.eye(4)], [0.0]), "sweep 0 has shape (2, 4), dtype float16"),
    (([np.zeros((4, 50), np.float32)], [np.eye(4)], [0.0]),  # as OpenPCDet's get_sweep holds one: was 4 points
     "sweep 0 has shape (4, 50), dtype float32; expected (N, 4) or more float32 (or float64) columns of x, y, z, "
     "intensity (float16 has already lost the coordinates' precision, as the detector says of it); it looks transposed "
     "(points as columns): pass the array's .T, shape (50, 4)"),
    (([np.zeros((2, 4), np.float32), np.zeros((5, 30), np.float32)], [np.eye(4)] * 2, [1.0, 0.9]),
     "sweep 1 has shape (5, 30)"),
    (([np.zeros(20, np.float32)], [np.eye(4)], [0.0]),
     "; a flat array, as np.fromfile reads a .bin: reshape it, (-1, 5) for nuScenes .pcd.bin files"),
    (([np.zeros((2, 4), np.float32)], [np.eye(3)], [0.0]), "pose 0 is not a finite (4, 4) transform"),
    (([np.zeros((2, 4), np.float32)], [np.eye(4)], [float("nan")]), "timestamp 0 is nan, not a finite number"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4)] * 2, [1.0, "x"]), "timestamp 1 is 'x', not a finite number"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4)] * 2, [1.0, None]), "timestamp 1 is None, not a finite number"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4)] * 2, [1.6e15, 1.6e15 - 50000]),
     "sweep 1 is 50000 s behind the key sweep, outside -0.01..2 s: timestamps in micro- or milliseconds?"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4)] * 2, [0.0, 0.05]),
     "sweep 1 is -0.05 s behind the key sweep, outside -0.01..2 s"),
    (([np.zeros((2, 4), np.float32)] * 3, [np.eye(4)] * 3, [1.0, 0.95, 0.95]),  # accumulated as two sweeps at one lag
     "timestamps 1 and 2 are both 0.95 s: a sweep given twice, or a timestamp not filled in? Each sweep's own time"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4)] * 2, [1.7e9, np.float64(1.7e9)]),
     "timestamps 0 and 1 are both 1700000000 s"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4), np.diag([2.0, 2, 2, 1])], [1.0, 0.9]),
     "pose 1 is not a rigid transform: its 3x3 part is not a rotation (a rotation scaled by 2"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4), np.diag([-1.0, 1, 1, 1])], [1.0, 0.9]),
     "pose 1 is not a rigid transform: its 3x3 part is not a rotation (a reflection"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.diag([0.0, 0, 0, 1]), np.eye(4)], [1.0, 0.9]),
     "pose 0 is not a rigid transform"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4), np.array([[1, 0.5, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])],
      [1.0, 0.9]), "pose 1 is not a rigid transform: its 3x3 part is not a rotation (R R^T differs"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4), np.r_[np.c_[np.eye(3), [1e300, 0, 0]], [[0, 0, 0, 1]]]],
      [1.0, 0.9]), "pose 1 puts its sweep inf m from the key sweep"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4), np.r_[np.c_[np.eye(3), [3e4, 4e4, 0]], [[0, 0, 0, 1]]]],
      [1.0, 0.9]), "pose 1 puts its sweep 5e+04 m from the key sweep, farther than a car moves in 2 s"),
    (([np.zeros((2, 4), np.float32)] * 2, [np.eye(4)] * 2, [np.float32(1.7e9), np.float32(1.7e9 - 0.05)]),
     "timestamp 0 is float32 1700000000, and float32 values of that size are 128 s apart, too coarse for time lags "
     "of milliseconds: give float64 (or Python float) timestamps"),
    (([np.ma.masked_array(np.zeros((2, 4), np.float32), mask=[[0] * 4, [1] * 4])], [np.eye(4)], [0.0]),
     "sweep 0: a masked array, whose mask would be ignored"),
    (([np.zeros((2, 4), np.float32)], [np.eye(4)], [0.0], float("nan")), "ego_radius nan: expected metres >= 0, or None"),
    (([np.zeros((2, 4), np.float32)], [np.eye(4)], [0.0], -1), "ego_radius -1: expected metres >= 0"),
    (([np.zeros((2, 4), np.float32)], [np.eye(4)], [0.0], "1"), "ego_radius '1': expected metres >= 0"),
    (({"a": np.zeros((2, 4), np.float32)}, [np.eye(4)], [0.0]),  # list() of it would give its keys
     "sweeps is a dict; expected a list of one item a sweep, the key sweep first"),
    (([np.zeros((2, 4), np.float32)], [np.eye(4)], {0.0: "key"}), "timestamps is a dict; expected a list"),
])
def test_bad_input_is_one_clear_error(args: tuple, message: str) -> None:  # type: ignore[type-arg]
    sweeps, poses, stamps, *radius = args
    with pytest.raises(InputError, match=r"^accumulate: ") as info, warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of NumPy's on the way
        accumulate_sweeps(sweeps, poses, stamps, **({"ego_radius": radius[0]} if radius else {}))
    assert message in str(info.value)


def test_a_sweep_of_rows_wider_than_a_point_is_refused_as_a_frame_of_them_is() -> None:
    """A lidar's range image (64 beams x 2048 azimuths) given as a sweep was accumulated as 64 points of each row's
    first 4 pixels, where the detector refuses it as a frame; rows as wide as the widest point (64 values) are still
    points."""
    image = np.random.default_rng(0).random((64, 2048)).astype(np.float32) * 50
    key = np.array([[1.0, 2.0, -1.0, 0.5], [10.0, -3.0, -1.0, 0.2]], np.float32)
    with pytest.raises(InputError, match=r"^accumulate: sweep 1 has shape \(64, 2048\), dtype float32; expected .*; "
                       r"rows of 2048 values, where a point has 4 to 64 \(x, y, z, intensity first\); an image or "
                       r"another array, not a point list\?$"):
        accumulate_sweeps([key, image], [np.eye(4)] * 2, [1.0, 0.9])
    widest = np.zeros((2, 64), np.float32)
    widest[:, :4] = key
    frame = accumulate_sweeps([widest], [np.eye(4)], [1.0])
    np.testing.assert_array_equal(frame, np.c_[key, np.zeros(2, np.float32)])


def test_a_sweep_of_nullable_float_columns_is_refused_as_a_frame_of_them_is_with_a_fix_that_works() -> None:
    """A pandas table of nullable Float32 columns given as a sweep was refused as "dtype object" with no word of
    its missing values nor a fix, where the detector names them; one without missing values gets the astype fix,
    and the table the fixes make accumulates as the float32 array of the same values."""
    pd = pytest.importorskip("pandas")
    key = np.array([[1.0, 2.0, -1.0, 0.5], [10.0, -3.0, -1.0, 0.25], [4.0, 4.0, -1.5, 0.75]], np.float32)
    table = pd.DataFrame(key, columns=["x", "y", "z", "intensity"]).astype("Float32")
    table.iloc[1, 2] = pd.NA
    with pytest.raises(InputError, match=r"^accumulate: sweep 1: 1 of its 3 points lacks values \(missing: pd\.NA, .* "
                       r"row 1 \(counted from 0\); .*\(points\.iloc\[:, :4\]\.dropna\(\)\.to_numpy\(np\.float32\)\)$"):
        accumulate_sweeps([key, table], [np.eye(4)] * 2, [1.0, 0.9])
    whole = table.dropna()
    with pytest.raises(InputError, match=r"^accumulate: sweep 1 has shape \(2, 4\), dtype object; .*; "
                       r"sweep\.astype\(np\.float32\) if its values are metres$"):
        accumulate_sweeps([key, whole], [np.eye(4)] * 2, [1.0, 0.9])
    fixed = [table.iloc[:, :4].dropna().to_numpy(np.float32), whole.astype(np.float32)]
    for sweep in fixed:
        frame = accumulate_sweeps([key, sweep], [np.eye(4)] * 2, [1.0, 0.9])
        np.testing.assert_array_equal(frame[3:, :4], key[[0, 2]])


def test_a_sweep_whose_conversion_raises_runtime_error_is_the_input_error_a_frame_gets() -> None:
    """A sweep that a torch tensor requiring grad stands for (its conversion raises RuntimeError): the InputError,
    with its reason, that the same frame gets from the detector (it was the RuntimeError itself)."""
    reason = r"\(Can't call numpy\(\) on Tensor that requires grad\. Use tensor\.detach\(\)\.numpy\(\) instead\.\)$"
    with pytest.raises(InputError, match=r"^points: cannot be read as an \(N, 4\) array of x, y, z, intensity " + reason):
        as_host_points(GradTensorLike())
    with pytest.raises(InputError, match=r"^accumulate: sweep 1: cannot be read as an \(N, 4\) array of x, y, z, "
                                         r"intensity " + reason):
        accumulate_sweeps([np.zeros((2, 4), np.float32), GradTensorLike()], [np.eye(4)] * 2, [1.0, 0.9])


def test_host_sweeps_that_speak_dlpack_accumulate_on_the_host() -> None:
    """Sweeps on the host that speak DLPack too (a torch CPU tensor's protocol) are host data, as the detector
    takes such a frame: accumulated with NumPy (they were sent to CuPy, which is no dependency of the CPU path)."""
    key = np.array([[1, 2, 3, 0.5], [4, 5, 6, 0.25]], np.float32)
    earlier = np.array([[7, 8, 9, 0.125]], np.float32)
    args = ([np.eye(4)] * 2, [1.0, 0.9])
    frame = accumulate_sweeps([HostDlpackLike(key), HostDlpackLike(earlier)], *args)
    assert isinstance(frame, np.ndarray)
    np.testing.assert_array_equal(frame, accumulate_sweeps([key, earlier], *args))


def test_torch_sweeps_are_host_data_and_one_that_requires_grad_the_input_error_a_frame_gets() -> None:
    torch = pytest.importorskip("torch")
    key = np.array([[1, 2, 3, 0.5], [4, 5, 6, 0.25]], np.float32)
    frame = accumulate_sweeps([torch.from_numpy(key)], [np.eye(4)], [0.0])
    assert isinstance(frame, np.ndarray)
    np.testing.assert_array_equal(frame, accumulate_sweeps([key], [np.eye(4)], [0.0]))
    graded = torch.from_numpy(key).requires_grad_()
    with pytest.raises(InputError, match=r"^points: cannot be read as .*\(Can't call numpy\(\) on Tensor that requires "):
        as_host_points(graded)
    with pytest.raises(InputError, match=r"^accumulate: sweep 0: cannot be read as .*\(Can't call numpy\(\) on Tensor "
                                         "that requires "):
        accumulate_sweeps([graded], [np.eye(4)], [0.0])


def test_sweeps_poses_and_timestamps_may_be_any_iterables() -> None:
    key = np.array([[5, 0, 0, 1]], np.float32)
    frame = accumulate_sweeps((s for s in [key, key]), iter([np.eye(4)] * 2), (t for t in [1.0, 0.95]))
    assert frame.shape == (2, 5) and frame[:, 4].tolist() == [0, np.float32(0.05)]
    # float32 timestamps small enough to hold milliseconds (seconds since the drive's start) are taken
    small = accumulate_sweeps([key, key], [np.eye(4)] * 2, [np.float32(1000.0), np.float32(999.95)])
    assert abs(float(small[1, 4]) - 0.05) < 1e-4
    for radius in (np.float32(1.0), np.int64(1), 1):  # NumPy numbers are numbers
        assert accumulate_sweeps([key, key], [np.eye(4)] * 2, [1.0, 0.95], ego_radius=radius).shape == (2, 5)


def lidar_top(assets: Path, path: Path) -> np.ndarray:
    """A sweep as nuScenes writes its LIDAR_TOP .pcd.bin files (x, y, z, intensity 0-255, ring index), made from
    a real KITTI scan and written to ``path``; returned as read right, (N, 5)."""
    scan = np.fromfile(assets / "kitti/training/velodyne/000000.bin", np.float32).reshape(-1, 4)
    ring = np.clip(np.floor(np.degrees(np.arctan2(scan[:, 2], np.hypot(scan[:, 0], scan[:, 1]))) + 25), 0, 31)
    np.c_[scan[:, :3], np.round(scan[:, 3] * 255), ring].astype(np.float32).tofile(path)
    return np.fromfile(path, np.float32).reshape(-1, 5)


def test_a_sweep_read_with_another_row_length_is_refused_naming_the_read(assets: Path, tmp_path: Path) -> None:
    """A nuScenes .pcd.bin read as KITTI's rows of 4 (np.fromfile(...).reshape(-1, 4)) was accumulated without a
    word, every point's values shifted along; now the sweep is refused naming the read that fits. Read right, it
    is taken (its ring index left out)."""
    path = tmp_path / "n008__LIDAR_TOP__1533151603547590.pcd.bin"
    sweep = lidar_top(assets, path)
    stamps, poses = [1.5e9, 1.5e9 - 0.05], [np.eye(4), rigid(0.0, (0.5, 0.0, 0.0))]
    frame = accumulate_sweeps([sweep, sweep], poses, stamps)
    np.testing.assert_array_equal(frame[: len(sweep), :4], sweep[:, :4])
    misread = np.fromfile(path, np.float32).reshape(-1, 4)
    with pytest.raises(InputError, match=r"^accumulate: sweep 1 looks like 5 float32 values a point \(x, y, z, "
                                         r"intensity, ring/time, as nuScenes writes them\) read as 4: read its file "
                                         r"with np.fromfile\(path, np.float32\).reshape\(-1, 5\)$"):
        accumulate_sweeps([sweep, misread], poses, stamps)
    kitti = np.fromfile(assets / "kitti/training/velodyne/000000.bin", np.float32)
    with pytest.raises(InputError, match=r"^accumulate: sweep 0 looks like 4 float32 values a point .* read as 5"):
        accumulate_sweeps([kitti[: kitti.size // 20 * 20].reshape(-1, 5)], [np.eye(4)], [1.0])


def test_a_multi_sweep_frame_given_as_a_sweep_is_refused(assets: Path, nuscenes: Path, tmp_path: Path) -> None:
    """A frame accumulated already (5th values: its sweeps' time lags) given as a sweep had all its lags overwritten
    with that sweep's, 0 for the key sweep: now refused. A sweep's own 5th column (nuScenes' ring index, one time
    for all its points, a return number) is left out as before."""
    frame = np.fromfile(nuscenes / "nusc_dev_k000000_s05.bin", np.float32).reshape(-1, 5)
    assert len(np.unique(frame[:, 4])) == 5  # the asset's 5 sweeps
    with pytest.raises(InputError, match=r"^accumulate: sweep 0's 5th values look like a multi-sweep frame's time "
                                         r"lags \(a frame accumulated already\?\)"):
        accumulate_sweeps([frame], [np.eye(4)], [1.0])
    sweep = lidar_top(assets, tmp_path / "sweep.pcd.bin")
    timed = np.c_[sweep[:, :4], np.full(len(sweep), 0.05, np.float32)]
    returns = np.c_[sweep[:, :4], 1 + np.arange(len(sweep)) % 2].astype(np.float32)  # dual returns: 1, 2
    for given in (sweep, timed, returns):
        assert accumulate_sweeps([given], [np.eye(4)], [1.0])[:, 4].max() == 0


def test_a_raw_sweep_read_for_a_multi_sweep_model_names_the_read_that_accumulate_takes(assets: Path,
                                                                                     tmp_path: Path) -> None:
    """A nuScenes LIDAR_TOP .pcd.bin read with read_points(path, point_dim=5) (its ring index where the model reads
    time lags) was refused naming accumulate alone, whose sweeps that very read cannot give: now the message names
    the read that keeps x, y, z, intensity, and the sweeps so read accumulate."""
    key, earlier = tmp_path / "n008__LIDAR_TOP__1533151603547590.pcd.bin", tmp_path / "n008__LIDAR_TOP__1533151603497590.pcd.bin"
    rows = lidar_top(assets, key)
    lidar_top(assets, earlier)
    with pytest.raises(InputError) as err:
        read_points(key, point_dim=5)
    text = str(err.value)
    assert "PointPillars.accumulate" in text and "read_points(path, point_dim=5, columns=4)" in text, text
    sweeps = [read_points(path, point_dim=5, columns=4) for path in (key, earlier)]
    frame = PointPillars.accumulate(sweeps, [np.eye(4)] * 2, [1533151603.547590, 1533151603.497590])
    np.testing.assert_array_equal(frame[: len(rows), :4], rows[:, :4])
    assert frame[: len(rows), 4].max() == 0 and np.allclose(frame[len(rows):, 4], 0.05, atol=1e-6)


@pytest.mark.parametrize("given", ["sweeps/a.pcd.bin", b"sweeps/a.pcd.bin", Path("sweeps/a.pcd.bin")])
def test_paths_given_for_sweeps_are_refused_naming_the_read(given: object) -> None:
    """Sweep files' paths given to accumulate (as infer_many takes them) were refused as a sweep "of shape (), dtype
    <U16", and a folder's path as sweep 0 of one character: now each is named a path, with the read that gives its
    points."""
    key = np.zeros((2, 4), np.float32)
    with pytest.raises(InputError, match=r"^accumulate: sweep 1 is a path, .*a\.pcd\.bin'; expected its points: read "
                                         r"each sweep's file first, e\.g\. read_points\(path, point_dim=5, columns=4\)"):
        accumulate_sweeps([key, given], [np.eye(4)] * 2, [1.0, 0.95])
    with pytest.raises(InputError, match=r"^accumulate: sweeps is a path, .*; expected a list of sweeps' points"):
        accumulate_sweeps(given, [np.eye(4)], [1.0])  # type: ignore[arg-type]


def test_more_sweeps_than_nuscenes_models_are_trained_on_are_warned_of() -> None:
    """OpenPCDet's nuScenes models see 10 sweeps (MAX_SWEEPS): 20 were accumulated without a word, lags up to
    0.95 s the model never saw; now one InputWarning says so. 10 say nothing."""
    key = np.array([[5, 0, 0, 1]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert accumulate_sweeps([key] * 10, [np.eye(4)] * 10, [1.0 - 0.05 * i for i in range(10)]).shape == (10, 5)
    with pytest.warns(InputWarning, match=r"^accumulate: 20 sweeps, but nuScenes models are trained on frames of 10 "
                                          r"\(OpenPCDet's MAX_SWEEPS: the key sweep and the 9 before it\).*pass the "
                                          r"first 10$") as caught:
        frame = accumulate_sweeps([key] * 20, [np.eye(4)] * 20, [1.0 - 0.05 * i for i in range(20)])
    assert len(caught) == 1 and frame.shape == (20, 5)


def test_a_frame_accumulated_from_real_scans_reads_without_a_word_of_per_point_times(assets: Path,
                                                                                      tmp_path: Path) -> None:
    """accumulate's frame of 10 sweeps of real KITTI scans (one lag a sweep, as OpenPCDet gives them) passes the
    multi-sweep checks without the warning of per-point capture times, as an array (the detector's check) and read
    back from its .bin and .npy; its lags as per-point times (each sweep's spread over its 0.05 s) are warned of."""
    scans = [np.fromfile(path, "<f4").reshape(-1, 4)
             for path in sorted((assets / "kitti" / "training" / "velodyne").glob("*.bin"))]
    sweeps = [scans[i % len(scans)][i % 4 :: 4] for i in range(10)]
    poses = [rigid(0.01 * i, (-0.6 * i, 0.1 * i, 0.0)) for i in range(10)]
    frame = accumulate_sweeps(sweeps, poses, [100.0 - 0.05 * i for i in range(10)])
    assert len(np.unique(frame[:, 4])) == 10
    frame.tofile(tmp_path / "frame.bin")
    np.save(tmp_path / "frame.npy", frame)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_time_lags(frame.reshape(-1), 5, "points")
        for path in (tmp_path / "frame.bin", tmp_path / "frame.npy"):
            np.testing.assert_array_equal(read_points(path, point_dim=5), frame)
    spread = frame.copy()
    spread[:, 4] += np.random.default_rng(0).uniform(0, 0.05, len(frame)).astype(np.float32)
    with pytest.warns(InputWarning, match=r"^points: its 5th values take more distinct values than a frame has sweeps"):
        check_time_lags(spread.reshape(-1), 5, "points")


@pytest.mark.cuda
@pytest.mark.skipif(cuda_skip_reason() is not None, reason=str(cuda_skip_reason()))
def test_gpu_sweeps_accumulate_on_the_gpu_as_on_the_host() -> None:
    import cupy as cp

    sweeps, poses, stamps, _ = scene()
    host = accumulate_sweeps(sweeps, poses, stamps)
    device = accumulate_sweeps([cp.asarray(s) for s in sweeps], poses, stamps)
    assert isinstance(device, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(device), host, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(cuda_skip_reason() is not None, reason=str(cuda_skip_reason()))
def test_gpu_sweeps_that_speak_dlpack_only_accumulate_as_cupy_ones() -> None:
    """A device array with DLPack and no CUDA array interface (as JAX's) is taken on the GPU, as the detector
    takes such a frame."""
    import cupy as cp

    class DlpackOnly:
        def __init__(self, array: object) -> None:
            self._array = array

        def __dlpack__(self, **kwargs: object) -> object:
            return self._array.__dlpack__(**kwargs)  # type: ignore[attr-defined]

        def __dlpack_device__(self) -> object:
            return self._array.__dlpack_device__()  # type: ignore[attr-defined]

    sweeps, poses, stamps, _ = scene()
    host = accumulate_sweeps(sweeps, poses, stamps)
    device = accumulate_sweeps([DlpackOnly(cp.asarray(s)) for s in sweeps], poses, stamps)
    assert isinstance(device, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(device), host, atol=1e-5)


def sweeps_of_every_layout(assets: Path, nuscenes: Path, tmp_path: Path) -> dict[str, np.ndarray]:
    """Sweeps read right and read wrong, large (what the checks look at is gathered) and small (all of it is),
    each as accumulate takes it."""
    kitti = np.fromfile(assets / "kitti/training/velodyne/000000.bin", np.float32)
    nusc = lidar_top(assets, tmp_path / "sweep.pcd.bin")
    frame = np.fromfile(nuscenes / "nusc_dev_k000000_s05.bin", np.float32).reshape(-1, 5)
    holed = kitti.reshape(-1, 4).copy()
    holed[::7] = np.nan  # organised clouds' no-return rows
    return {"kitti": kitti.reshape(-1, 4), "nuscenes": nusc, "nuscenes as 4": nusc.reshape(-1, 4),
            "kitti as 5": kitti[: kitti.size // 20 * 20].reshape(-1, 5),
            "kitti as 8": kitti[: kitti.size // 8 * 8].reshape(-1, 8), "accumulated": frame,
            "nan rows": holed, "float64": nusc.astype(np.float64), "strided": nusc[:, :4], "small": scene()[0][0],
            "small accumulated": frame[::50]}


def test_what_the_checks_look_at_of_a_gpu_sweep_judges_it_as_the_whole_of_it_does(assets: Path, nuscenes: Path,
                                                                                   tmp_path: Path) -> None:
    """A sweep on the GPU is judged from what the row-length and time-lag checks look at of it, gathered there and
    read back in one copy: gathered by NumPy, the same code finds what the checks of the whole host sweep find, for
    sweeps read right and read wrong; for a large sweep it is a part of it, the samples and spread rows the
    row-length check takes of the whole."""
    from pointpillars_trt.point_layout import (ValueSample, gather_value_sample, gathered_value_sample,
                                               holds_time_lags, misread_row_length)
    from pointpillars_trt.sweeps import _gathered_findings

    found, parts = {}, []
    for name, sweep in sweeps_of_every_layout(assets, nuscenes, tmp_path).items():
        rows, lagged = sweep.dtype == np.float32 and sweep.flags.c_contiguous, sweep.shape[1] >= 5
        point_dim = sweep.shape[1]
        whole = (misread_row_length(sweep.reshape(-1), point_dim) if rows else None,
                 lagged and holds_time_lags(sweep[:, 4]))
        found[name] = _gathered_findings(sweep, rows, lagged, np)
        assert found[name] == whole, name
        if rows:
            flat = sweep.reshape(-1)
            gathered = gather_value_sample(flat, point_dim, np)
            sample, every = gathered_value_sample(gathered, flat.size, point_dim), ValueSample.whole(flat)
            for align, count in [(60, 1 << 15), (60, 4096), (3, 1 << 15), (4, 1 << 15), (5, 1 << 15),
                                 (point_dim, (1 << 15) // point_dim * point_dim)]:
                for part, whole_part in zip(sample.samples(align, count), every.samples(align, count)):
                    np.testing.assert_array_equal(part, whole_part)
            spread = [point_dim] if point_dim > 5 else range(2 * point_dim, 17, point_dim)
            for row in spread:
                np.testing.assert_array_equal(sample.spread(row), every.spread(row))
            parts += [name] if gathered.size < flat.size else []
    assert parts == ["kitti", "nuscenes", "nuscenes as 4", "kitti as 5", "kitti as 8", "nan rows"]
    assert found["nuscenes as 4"] == (5, False) and found["kitti as 5"] == (4, False)
    assert found["kitti as 8"] == (4, False) and found["accumulated"] == (None, True)
    assert found["kitti"] == found["nuscenes"] == found["strided"] == found["float64"] == (None, False)
    assert found["small accumulated"] == (None, True)


def test_the_time_lag_summary_finds_lags_as_their_unique_values_do() -> None:
    """holds_time_lags judges a column from its distinct_summary (a GPU column's, read back in one copy): on columns
    of lags, of intensities, of whole numbers, of one value, with NaN and infinities and of more values than a
    frame has sweeps, it finds what the column's own distinct finite values say."""
    from pointpillars_trt.point_layout import holds_time_lags

    def by_unique(column: np.ndarray) -> bool:
        finite = np.unique(column[np.isfinite(column)])
        return (finite.size > 1 and finite[0] >= -0.01 and finite[-1] <= 2.0 and finite.size <= 32
                and not np.array_equal(finite, np.round(finite)))

    rng = np.random.default_rng(3)
    lags = np.repeat(np.float32(0.05) * np.arange(10, dtype=np.float32), 40)
    columns = {"lags": lags, "intensities": rng.uniform(0, 1, 400).astype(np.float32),
               "returns": (1 + np.arange(400) % 2).astype(np.float32), "one": np.full(400, 0.05, np.float32),
               "32 lags": np.repeat(np.arange(32, dtype=np.float32) * 0.05, 3),
               "33 lags": np.repeat(np.arange(33, dtype=np.float32) * 0.05, 3),
               "nan and inf": np.r_[lags, [np.nan, np.inf, -np.inf]].astype(np.float32),
               "none finite": np.array([np.nan, np.inf], np.float32), "empty": np.zeros(0, np.float32),
               "float64": lags.astype(np.float64) + 1e-12}
    for name, column in columns.items():
        assert holds_time_lags(rng.permutation(column)) == by_unique(column), name
    assert [name for name, column in columns.items() if by_unique(column)] == ["lags", "32 lags", "nan and inf",
                                                                              "float64"]


def test_gpu_sweeps_read_wrong_or_accumulated_already_are_refused_as_host_ones_are(  # type: ignore[no-untyped-def]
        cp, assets: Path, nuscenes: Path, tmp_path: Path) -> None:
    """accumulate checked the columns of host sweeps only: a CuPy sweep read with another row length, or a frame
    accumulated already given as a sweep, was accumulated without a word. Each is refused as its host copy is, and
    the sweeps read right are taken."""
    for name, sweep in sweeps_of_every_layout(assets, nuscenes, tmp_path).items():
        try:
            accumulate_sweeps([sweep], [np.eye(4)], [1.0])
            said = None
        except InputError as exc:
            said = str(exc)
        try:
            accumulate_sweeps([cp.asarray(sweep)], [np.eye(4)], [1.0])
            assert said is None, name
        except InputError as exc:
            assert str(exc) == said, name
