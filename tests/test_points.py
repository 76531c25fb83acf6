"""as_host_points: what a lidar frame array may look like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import InputError
from pointpillars_trt.points import MAX_FRAME_POINTS, as_host_points, copy_leading_columns, is_frame_path
from array_likes import CudaInterfaceOnly, GradTensorLike


def test_accepts_n_by_4_and_wider_float() -> None:
    pts = np.arange(40, dtype=np.float64).reshape(10, 4) / 7
    got = as_host_points(pts)
    assert got.dtype == np.float32 and got.shape == (10, 4) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, pts.astype(np.float32))
    wide = np.column_stack([pts, np.ones(10)])
    np.testing.assert_array_equal(as_host_points(wide), pts.astype(np.float32))
    square = np.eye(4, dtype=np.float32)  # 4 points of 4 values: not mistaken for a transposed frame
    np.testing.assert_array_equal(as_host_points(square), square)
    assert as_host_points(np.zeros((0, 4), np.float32)).shape == (0, 4)


@pytest.mark.parametrize("names, columns, message", [
    (["i", "x", "y", "z"], 4, r"hold x in column 1, not 0: .*pass points\[\['x', 'y', 'z', 'i'\]\]$"),
    (["x", "y", "z", "ring", "intensity"], 4, r"hold intensity in column 4, not 3: .*\[\['x', 'y', 'z', 'intensity'\]\]$"),
    (["X", "Y", "Reflectance", "Z"], 4, r"hold z in column 3, not 2: .*\[\['X', 'Y', 'Z', 'Reflectance'\]\]$"),
    (["x", "y", "z", "timestamp", "intensity"], 5,
     r"hold intensity in column 4, not 3: .*\[\['x', 'y', 'z', 'intensity', 'timestamp'\]\]$"),
    (["y", "x", "z", "ring"], 4, r"hold x in column 1, not 0: .*put the columns of x, y, z, intensity first"),
    (["i", "x", "y", "z", "intensity"], 4,  # "i" an index here: the full name is the intensity
     r"hold x in column 1, not 0: .*\[\['x', 'y', 'z', 'intensity'\]\]$"),
])
def test_a_tables_named_columns_in_another_order_are_refused_naming_the_reorder(names: list[str], columns: int,
                                                                                 message: str) -> None:
    """A DataFrame is read by position (np.asarray drops the names): columns whose names put x, y, z, the
    intensity or the time lag elsewhere than the model reads them are refused, with the selection that fixes it."""
    pd = pytest.importorskip("pandas")
    values = np.arange(10 * len(names), dtype=np.float32).reshape(10, len(names))
    with pytest.raises(InputError, match=r"^points: a table whose columns \[.*\] " + message):
        as_host_points(pd.DataFrame(values, columns=names), columns=columns)


def test_an_arrow_tables_named_columns_in_another_order_are_refused_naming_its_select() -> None:
    """A pyarrow Table (or RecordBatch: what Parquet and Ray Data give) of columns intensity, x, y, z was detected on
    with the intensity as x: its ``.columns`` are its column arrays, whose names the check never saw. The fix named,
    run, gives the points in the model's order; a table in that order reads by position."""
    pa = pytest.importorskip("pyarrow")
    values = np.arange(40, dtype=np.float32).reshape(10, 4)  # x, y, z, intensity
    given = {"i": values[:, 3], "x": values[:, 0], "y": values[:, 1], "z": values[:, 2]}
    for table in (pa.table(given), pa.record_batch(list(given.values()), names=list(given))):
        with pytest.raises(InputError) as err:
            as_host_points(table)
        text = str(err.value)
        assert text.startswith("points: a table whose columns ['i', 'x', 'y', 'z'] hold x in column 1, not 0"), text
        selection = text.split("pass points.select(", 1)[1].removesuffix(")")
        assert selection == "['x', 'y', 'z', 'i']", text
        np.testing.assert_array_equal(as_host_points(table.select(["x", "y", "z", "i"])), values)


def test_a_table_in_the_models_order_or_of_unknown_names_is_read_by_position() -> None:
    pd = pytest.importorskip("pandas")
    values = np.arange(50, dtype=np.float32).reshape(10, 5)
    for names in (["x", "y", "z", "intensity", "ring"], ["X", "Y", "Z", "i", "t"], list("abcde"), [0, 1, 2, 3, 4]):
        np.testing.assert_array_equal(as_host_points(pd.DataFrame(values, columns=names)), values[:, :4])
    named = pd.DataFrame(values, columns=["x", "y", "z", "reflectance", "time_lag"])
    np.testing.assert_array_equal(as_host_points(named, columns=5), values)


def test_a_table_of_nullable_floats_with_missing_values_is_refused_with_a_fix_that_works() -> None:
    """A pandas table of nullable Float32 columns (as parquet files of points are read) holding pd.NA became an
    object array, refused with the fix points.astype(np.float32): for the array that fails on the NA (TypeError),
    and for the table it made them NaN, taken for points without a return. Its missing values are named now, with
    how to drop their rows from a table or an array, which gives the points that have all their values."""
    pd = pytest.importorskip("pandas")
    values = np.arange(50, dtype=np.float32).reshape(10, 5) / 8
    table = pd.DataFrame(values, columns=["x", "y", "z", "intensity", "ring"]).astype("Float32")
    table.iloc[3, 1] = table.iloc[6, 3] = table.iloc[8, 0] = pd.NA
    table.iloc[2, 4] = pd.NA  # a column the model does not read: its point is whole
    kept = values[[0, 1, 2, 4, 5, 7, 9], :4]
    array = table.to_numpy()  # object values: floats and pd.NA
    for points, fix in ((table, "points.iloc[:, :4].dropna().to_numpy(np.float32)"),
                        (array, "points[~pd.isna(points[:, :4]).any(axis=1), :4].astype(np.float32)")):
        with pytest.raises(InputError) as caught:
            as_host_points(points)
        assert str(caught.value) == (
            "points: 3 of its 10 points lack values (missing: pd.NA, as pandas' nullable Float32 columns hold them, "
            "or None), the first row 3 (counted from 0); a point without its values is no return: drop their rows "
            f"({fix})")
        followed = eval(fix, {"np": np, "pd": pd, "points": points})  # the fix as the message spells it
        np.testing.assert_array_equal(as_host_points(followed), kept)
    with pytest.raises(InputError, match=r"^points: 1 of its 2 points lacks values \(.*\), row 1 \(counted from 0\); a "
                                         r"point without its values is no return: drop its row \("):
        as_host_points(np.array([[1.0, 2.0, 3.0, 0.5], [1.0, None, 3.0, 0.5]], object))
    with pytest.raises(InputError, match=r"^points: 1 of its 1 point lacks values \(.*\), row 0 \(counted from 0\)"):
        as_host_points(np.array([[1.0, None, 3.0, 0.5]], object))


@pytest.mark.parametrize("layout", ["5 wide", "8 wide", "fortran", "every other column", "big-endian", "empty"])
def test_the_leading_columns_copy_equals_the_slice_whatever_the_rows_lie_like(layout: str) -> None:
    """``copy_leading_columns`` (a row's values copied as one block where they lie side by side) against
    NumPy's own copy of the slice, value by value, for rows it copies as blocks and rows it cannot."""
    rng = np.random.default_rng(7)
    values = rng.normal(0, 30, (257, 10)).astype(np.float32)
    rows = {"5 wide": values[:, :5].copy(), "8 wide": values[:, :8].copy(),
            "fortran": np.asfortranarray(values[:, :5]), "every other column": values[:, ::2],
            "big-endian": values[:, :5].astype(">f4"), "empty": values[:0, :5].copy()}[layout]
    for k in (4, 5):
        target = np.full((len(rows), k), np.nan, np.float32)
        copy_leading_columns(target, rows)
        expected = np.array([[float(v) for v in row[:k]] for row in rows], np.float32).reshape(-1, k)
        np.testing.assert_array_equal(target, expected)
        np.testing.assert_array_equal(as_host_points(rows, columns=k), expected)


@pytest.mark.parametrize("shape", [(4, 100), (4, 5), (5, 1000), (4, 3)])
def test_refuses_transposed_with_hint(shape: tuple[int, int]) -> None:
    with pytest.raises(InputError) as err:
        as_host_points(np.zeros(shape, np.float32), source="frame 3")
    text = str(err.value)
    assert text.startswith("frame 3:") and f"got shape {shape}" in text and "looks transposed" in text
    assert f"({shape[1]}, {shape[0]})" in text and "\n" not in text


@pytest.mark.parametrize("paths, said", [(["key.pcd.bin", "sweep1.pcd.bin"], r"\(2,\): 2 paths"),
                                         ((Path("key.pcd.bin"), b"sweep1.pcd.bin"), r"\(2,\): 2 paths"),
                                         (["key.pcd.bin"], r"\(1,\): 1 path")])
def test_a_list_of_paths_given_as_one_frame_names_infer_many_and_accumulate(paths: object, said: str) -> None:
    """A nuScenes sample's sweep files given as one frame (detector([key, sweep, ...])) were refused as "got shape
    (2,)": now named paths, with the calls that take them (infer_many a frame each, accumulate for one frame's
    sweeps); one path is counted in the singular."""
    with pytest.raises(InputError, match=r"^points: expected an \(N, 5\) array of x, y, z, intensity, time; got shape "
                                         + said + r", not points \(give them to infer_many, a frame each; the "
                                         r"sweeps of one frame: read each and join them with PointPillars.accumulate\)$"):
        as_host_points(paths, columns=5)


def test_refuses_other_shapes_and_dtypes() -> None:
    with pytest.raises(InputError, match=r"got shape \(10, 3\)$"):
        as_host_points(np.zeros((10, 3), np.float32))
    with pytest.raises(InputError, match=r"got shape \(40,\)"):
        as_host_points(np.zeros(40, np.float32))
    with pytest.raises(InputError, match=r"dtype int64 \(points.astype\(np.float32\) if its values are metres\)"):
        as_host_points(np.zeros((10, 4), np.int64))
    for path in ("000134.bin", Path("000134.bin")):  # a path where points belong: said so, with the reader
        with pytest.raises(InputError, match=r"got shape \(\): a path, not points \(read it with .*read_points"):
            as_host_points(path)
    # no array at all (a frame variable left None, a number, a generator): named by its value and type, not by the
    # shape () of the 0-d array NumPy makes of it alone
    for value, named in ((None, "None (NoneType)"), (5, "5 (int)"), ({"x": 1.0}, "{'x': 1.0} (dict)"),
                         ((p for p in ()), "<generator object")):
        with pytest.raises(InputError) as err:
            as_host_points(value)
        text = str(err.value)
        assert text.startswith("points: expected an (N, 4) array of x, y, z, intensity; got shape (): " + named), text
        assert text.endswith("not an array of points"), text
    with pytest.raises(InputError, match="cannot be read"):
        as_host_points([[1, 2, 3, 4], [1, 2]])
    points = np.arange(4000, dtype=np.float32).reshape(-1, 4)
    with pytest.raises(InputError, match=r"points: 16000 raw bytes, not points; view them as points with "
                                         r"np.frombuffer\(data, np.float32\).reshape\(-1, 4\)"):
        as_host_points(points.tobytes())
    small = np.array([[1.5, 2.5, 0.5, 0.25]] * 10, np.float32).tobytes()  # 160 bytes: no path's length bounds it
    with pytest.raises(InputError, match=r"points: 160 raw bytes, not points; view them as points with np.frombuffer"):
        as_host_points(small)
    with pytest.raises(InputError, match=r"points: 1 raw byte, not points; view them as points with np.frombuffer"):
        as_host_points(bytearray(1))
    np.testing.assert_array_equal(as_host_points(np.frombuffer(points.tobytes(), np.float32).reshape(-1, 4)), points)
    np.testing.assert_array_equal(as_host_points(memoryview(points)), points)  # a typed buffer of points is points


def test_a_masked_array_is_refused_not_read_without_its_mask() -> None:
    """np.asarray drops a mask: the masked points would have been detected on."""
    points = np.ma.masked_array(np.ones((10, 4), np.float32), mask=np.zeros((10, 4), bool))
    points.mask[3] = True
    with pytest.raises(InputError, match=r"a masked array, whose mask would be ignored; pass the points kept "
                                         r"\(np.ma.compress_rows\(points\)"):
        as_host_points(points)
    assert as_host_points(np.ma.compress_rows(points)).shape == (9, 4)


def test_float32_and_float64_only_as_the_npy_reader(tmp_path: Path) -> None:
    """float16 (steps of 1/32 m between 32 and 64 m) is refused with the fix, as read_npy refuses its
    .npy; so is long double; float32 and float64 of either byte order are read."""
    from pointpillars_trt.pointcloud_io import read_points

    pts = np.array([[60.01, -12.3, 1.2, 0.5], [33.3, 4.0, -1.5, 0.25]])
    half = pts.astype(np.float16)
    assert np.abs(half[:, 0] - pts[:, 0]).max() > 0.01  # what the message says is lost
    with pytest.raises(InputError, match=r"^points: expected float32 \(or float64\) points; got dtype float16, .*"
                                         r"~0.03 m at 60 m: .*pass points.astype\(np.float32\)"):
        as_host_points(half)
    np.save(tmp_path / "half.npy", half)
    with pytest.raises(InputError, match="half.npy' holds dtype <f2.*expected float32 or float64"):
        read_points(tmp_path / "half.npy")
    with pytest.raises(InputError, match=r"dtype float128 \(points.astype\(np.float32\)"):
        as_host_points(pts.astype(np.longdouble))
    for dtype in (">f4", "<f4", ">f8", "<f8"):
        got = as_host_points(pts.astype(dtype))
        assert got.dtype == np.float32 and got.dtype.isnative
        np.testing.assert_array_equal(got, pts.astype(np.float32))


def test_refuses_more_than_16m_points_without_copying() -> None:
    assert MAX_FRAME_POINTS == 16 * 2**20
    huge = np.broadcast_to(np.zeros((1, 4), np.float32), (MAX_FRAME_POINTS + 1, 4))  # no memory behind it
    with pytest.raises(InputError) as err:
        as_host_points(huge)
    assert f"{MAX_FRAME_POINTS + 1} points" in str(err.value) and str(MAX_FRAME_POINTS) in str(err.value)
    at_limit = np.broadcast_to(np.zeros((1, 4), np.float32), (MAX_FRAME_POINTS, 4))
    assert as_host_points(at_limit).shape == (MAX_FRAME_POINTS, 4)


def test_a_float64_frame_beyond_float32s_range_is_refused_without_a_numpy_warning() -> None:
    """1e300 in a float64 array became inf with NumPy's "overflow encountered in cast" on stderr (the file
    readers refuse it); now one InputError naming the point, as theirs; inf and NaN of its own stay."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=r"^points: point 2 holds -1e\+300, beyond float32's range"):
            as_host_points(np.array([[1.0, 2.0, 3.0, 0.5], [0.0, -1e300, 0.0, 0.0]]))
        kept = as_host_points(np.array([[1.5, np.inf, np.nan, 0.25]]))
    assert kept.dtype == np.float32 and kept[0, 0] == 1.5 and np.isinf(kept[0, 1]) and np.isnan(kept[0, 2])


def test_bytes_name_a_point_file_only_when_they_read_as_a_path(tmp_path: Path) -> None:
    """infer_many takes bytes as a path (os.fsencode's) when they read as one, else as a frame's raw values."""
    folder = os.fsencode(tmp_path)
    assert is_frame_path(b"/no/such/folder/000000.bin") and is_frame_path(b"frame.PCD")  # a point file's name
    assert is_frame_path(folder)  # something there (a folder: its reader says what to pass)
    assert not is_frame_path(b"/no/such/file")  # neither
    assert not is_frame_path(b"/data/000000.bin\0")  # a NUL byte: no path holds one
    assert not is_frame_path(np.ones((10, 4), np.float32).tobytes())  # a frame's raw values
    assert not is_frame_path(b"x" * 4097 + b".bin")  # longer than any path


def ros_cloud(n: int = 50) -> np.ndarray:
    """A structured array as ROS's PointCloud2 readers and pypcd give one: fields by name, a packed rgb between
    x, y, z and an 8-bit intensity."""
    rng = np.random.default_rng(11)
    cloud = np.zeros(n, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("rgb", "<f4"), ("Intensity", "u1")])
    for name, (low, high) in zip(("x", "y", "z", "Intensity"), ((0, 60), (-30, 30), (-2, 1), (0, 255))):
        cloud[name] = rng.uniform(low, high, n)
    return cloud


def test_a_structured_array_is_refused_with_the_conversion_that_reads_it() -> None:
    """A structured array (named fields) was refused as of "shape (50,)", which said nothing of why: now its
    fields are named, with the call that turns them into the model's columns, which reads as the same points."""
    from numpy.lib.recfunctions import structured_to_unstructured

    points = ros_cloud()
    with pytest.raises(InputError) as err:
        as_host_points(points)
    text = str(err.value)
    assert text.startswith("points: expected an (N, 4) array of x, y, z, intensity; got shape (50,): a structured "
                           "array, not columns; its fields ['x', 'y', 'z', 'rgb', 'Intensity'] hold them: pass ")
    fix = text.split(" hold them: pass ", 1)[1].split(" (structured_to_unstructured from", 1)[0]
    converted = eval(fix, {"np": np, "structured_to_unstructured": structured_to_unstructured, "points": points})
    expected = np.array([[row["x"], row["y"], row["z"], row["Intensity"]] for row in points], np.float32)
    np.testing.assert_array_equal(as_host_points(converted), expected)
    with pytest.raises(InputError, match=r"\['x', 'y', 'z', 'rgb', 'Intensity'\] lack time \(or timestamp or "
                                         r"time_lag\)$"):
        as_host_points(points, columns=5)


def test_single_sweeps_given_to_a_multi_sweep_model_are_refused_naming_accumulate() -> None:
    with pytest.raises(InputError, match=r"got 4 columns per point .*; single sweeps\? a multi-sweep model needs "
                                         r"accumulated frames, each point's 5th value its time lag behind the key "
                                         r"sweep: PointPillars.accumulate builds them"):
        as_host_points(np.zeros((10, 4), np.float32), columns=5)


def test_an_array_like_whose_conversion_raises_runtime_error_is_an_input_error_keeping_its_reason() -> None:
    with pytest.raises(InputError, match=r"^points: cannot be read as an \(N, 4\) array .*\(Can't call numpy\(\) on "
                                         r"Tensor that requires grad\. Use tensor\.detach\(\)\.numpy\(\) instead\.\)$"):
        as_host_points(GradTensorLike(), "points", 4)


_CUT_MAPPING = """
import mmap, os, sys
import numpy as np
from pointpillars_trt.errors import InputError
from pointpillars_trt.points import as_host_points

path = sys.argv[1]
np.arange(4000, dtype=np.float32).tofile(path)  # 1000 points
mapped = np.memmap(path, np.float32, "r").reshape(-1, 4)
after = np.memmap(path, np.float32, "r", offset=16 * 500).reshape(-1, 4)  # points 500..999
with open(path, "rb") as f:
    raw = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.float32).reshape(-1, 4)
os.truncate(path, 16 * 100)  # the file written over: 100 points left
print(as_host_points(mapped[:100]).sum(), as_host_points(raw[10:90:3]).sum())  # within the file: read
for name, frame in (("mapped", mapped), ("reversed", mapped[::-1]), ("after", after), ("raw", raw),
                    ("asarray", np.asarray(mapped)), ("point 100", mapped[100:101])):
    try:
        as_host_points(frame)
    except InputError as exc:
        print(name, exc)
"""


def test_a_frame_in_a_memory_mapped_file_cut_since_is_refused_not_read_past_its_end(tmp_path: Path) -> None:
    """Reading an np.memmap (or np.frombuffer of an mmap) past the end of its file, cut since it was mapped, killed
    the process with SIGBUS, and every result of the run with it; the rows still in the file are read."""
    done = subprocess.run([sys.executable, "-c", _CUT_MAPPING, str(tmp_path / "frame.bin")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
    within = np.arange(4000, dtype=np.float32).reshape(-1, 4)
    assert done.stdout.splitlines()[0] == f"{within[:100].sum()} {within[10:90:3].sum()}"
    cut = "lies in a memory-mapped file of 1600 bytes, which its bytes run past (to byte {}): the file was cut or " \
          "written over since it was mapped; map it again"
    assert done.stdout.splitlines()[1:] == [f"{name} points: {cut.format(end)}" for name, end in (
        ("mapped", 16000), ("reversed", 16000), ("after", 16000), ("raw", 16000), ("asarray", 16000),
        ("point 100", 1616))]


@pytest.mark.skipif(not os.path.exists("/dev/zero") or not os.path.exists("/proc/self/maps"), reason="Linux only")
def test_a_frame_mapped_from_a_device_is_read_not_taken_for_a_cut_file() -> None:
    """A device's mapping (/dev/zero here; a sensor driver's buffer) has size 0 by its stat, which said nothing of
    what it maps: the frame was refused as lying in a file cut since it was mapped."""
    mapped = np.memmap("/dev/zero", np.float32, "r", shape=(1000, 4))
    frame = as_host_points(mapped[10:500])
    assert frame.shape == (490, 4) and not frame.any()


def test_an_array_like_whose_interface_raises_key_error_is_an_input_error_naming_it() -> None:
    """A host array-like whose array interface lacks its keys (NumPy raises KeyError): the frame's InputError, as a
    ragged list's, not the KeyError (it escaped detect_batch)."""

    class Malformed:
        @property
        def __array_interface__(self) -> dict[str, object]:
            raise KeyError("typestr")

    with pytest.raises(InputError, match=r"^points: cannot be read as an \(N, 4\) array .*\(KeyError: 'typestr'\)$"):
        as_host_points(Malformed(), "points", 4)


def test_memory_running_out_while_converting_is_not_blamed_on_the_frame() -> None:
    """A conversion that runs out of memory (the host's, or CuPy's OutOfMemoryError, a MemoryError) raises it as it
    is: no InputError saying the frame cannot be read."""

    class Huge:
        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            raise MemoryError("Unable to allocate 16.0 TiB")

    with pytest.raises(MemoryError, match="16.0 TiB"):
        as_host_points(Huge(), "points", 4)


def test_a_gpu_array_is_refused_with_the_fix_of_whoever_needs_host_data() -> None:
    """The message of a GPU array told every caller to "open the detector on the GPU", a remote client (which sends
    host bytes to its server) too: each caller names itself and its own fix, the detector on the CPU by default."""
    from pointpillars_trt.apps.serve.client import REMOTE_DETECTOR

    copy = r"copy it to the host first \(CuPy: points.get\(\); Numba: points.copy_to_host\(\)\)"
    with pytest.raises(InputError, match=r"^points: a GPU array \(CUDA\), given to a detector on the CPU, which reads "
                       rf"host arrays: {copy}, or open the detector on the GPU \(device='cuda'\), which reads it where "
                       r"it lies$"):
        as_host_points(CudaInterfaceOnly((100, 4)))
    with pytest.raises(InputError, match=r"^frame: a GPU array \(CUDA\), given to a remote detector, which sends the "
                       rf"server the points' bytes from host memory: {copy}$"):
        as_host_points(CudaInterfaceOnly((100, 4)), "frame", 4, REMOTE_DETECTOR)
