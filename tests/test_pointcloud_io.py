"""Point files: .bin (x4, x5), .npy, .pcd (ascii, binary) and what each refuses."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt import pointcloud_io
from pointpillars_trt.errors import InputError, InputWarning
from pointpillars_trt.intensities import intensity_mismatch
from pointpillars_trt.pointcloud_io import SUPPORTED_EXTENSIONS, read_bin, read_points, read_points_into
from pointpillars_trt.points import MAX_FRAME_POINTS


def sample(n: int = 7, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform([-50, -50, -3, 0], [50, 50, 2, 1], (n, 4)).astype(np.float32)


def one_line_error(call, *needles: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


# --------------------------------------------------------------------------- .bin

def traced_peak(call):  # type: ignore[no-untyped-def]
    """(what ``call()`` returns, the peak of Python-allocated memory during it in bytes; NumPy's buffers count)."""
    import tracemalloc

    tracemalloc.start()
    try:
        return call(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bin_kitti_rows(tmp_path: Path) -> None:
    pts = sample()
    pts[2, 0] = np.nan  # kept: the detector drops and counts them
    (tmp_path / "a.bin").write_bytes(pts.astype("<f4").tobytes())
    got = read_points(tmp_path / "a.bin")
    assert got.dtype == np.float32 and got.shape == (7, 4) and got.flags.c_contiguous and got.flags.writeable
    np.testing.assert_array_equal(got, pts)
    (tmp_path / "upper.BIN").write_bytes(pts.tobytes())
    np.testing.assert_array_equal(read_points(tmp_path / "upper.BIN"), pts)


def test_empty_bin_is_an_empty_frame_read_without_setting_aside_the_frame_limit(tmp_path: Path) -> None:
    """A 0-byte .bin is an empty frame. Its size says nothing of what it holds (procfs reports 0 for files that
    hold bytes), so it is read up to the frame limit; that read set the whole limit aside first (256 MiB at 4
    values a point, 4 GiB at --point-dim 64: a MemoryError under a memory limit), where a chunk does."""
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    points, peak = traced_peak(lambda: read_points(path))
    assert points.shape == (0, 4) and points.dtype == np.float32
    assert peak < 4 * 2**20, peak


def test_bin_point_dim_5_keeps_five_columns_unless_told(tmp_path: Path) -> None:
    rows = np.column_stack([sample(9), np.arange(9, dtype=np.float32) / 20])  # nuScenes: x y z i time lag
    (tmp_path / "n.bin").write_bytes(rows.astype("<f4").tobytes())
    np.testing.assert_array_equal(read_points(tmp_path / "n.bin", point_dim=5), rows)
    np.testing.assert_array_equal(read_points(tmp_path / "n.bin", point_dim=5, columns=4), rows[:, :4])
    one_line_error(lambda: read_points(tmp_path / "n.bin"), "180 bytes", "multiple of 16")
    (tmp_path / "odd.bin").write_bytes(bytes(48))  # 48 bytes: 3 rows of 4, not rows of 5
    one_line_error(lambda: read_points(tmp_path / "odd.bin", point_dim=5), "48 bytes", "multiple of 20")
    one_line_error(lambda: read_points(tmp_path / "n.bin", point_dim=3), "point_dim 3")


def test_bin_is_the_files_own_floats_on_a_real_frame(assets: Path) -> None:
    path = assets / "kitti/training/velodyne_reduced/000134.bin"
    np.testing.assert_array_equal(read_points(path), np.fromfile(path, "<f4").reshape(-1, 4))


# --------------------------------------------------------------------------- .npy

def test_npy_float32_and_float64(tmp_path: Path) -> None:
    pts = sample(11)
    np.save(tmp_path / "f32.npy", pts)
    np.testing.assert_array_equal(read_points(tmp_path / "f32.npy"), pts)
    wide = np.column_stack([pts.astype(np.float64), np.ones(11)])
    np.save(tmp_path / "f64.npy", wide)
    got = read_points(tmp_path / "f64.npy")
    assert got.dtype == np.float32 and got.shape == (11, 4)
    np.testing.assert_array_equal(got, pts)
    np.save(tmp_path / "fortran.npy", np.asfortranarray(wide))
    np.testing.assert_array_equal(read_points(tmp_path / "fortran.npy"), pts)
    np.save(tmp_path / "empty.npy", np.zeros((0, 4), np.float32))
    assert read_points(tmp_path / "empty.npy").shape == (0, 4)


def test_npy_wrong_dtype_shape_transposed(tmp_path: Path) -> None:
    np.save(tmp_path / "int.npy", np.zeros((5, 4), np.int32))
    one_line_error(lambda: read_points(tmp_path / "int.npy"), "int.npy", "dtype <i4", "(5, 4)")
    np.save(tmp_path / "half.npy", np.zeros((5, 4), np.float16))
    one_line_error(lambda: read_points(tmp_path / "half.npy"), "dtype <f2")
    np.save(tmp_path / "three.npy", np.zeros((5, 3), np.float32))
    one_line_error(lambda: read_points(tmp_path / "three.npy"), "shape (5, 3)")
    np.save(tmp_path / "cube.npy", np.zeros((2, 5, 4), np.float32))
    one_line_error(lambda: read_points(tmp_path / "cube.npy"), "shape (2, 5, 4)")
    np.save(tmp_path / "t.npy", sample(100).T)
    one_line_error(lambda: read_points(tmp_path / "t.npy"), "shape (4, 100)", "looks transposed")
    np.save(tmp_path / "rec.npy", np.zeros(3, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("i", "f4")]))
    one_line_error(lambda: read_points(tmp_path / "rec.npy"), "rec.npy", "dtype")


def test_npy_of_rows_wider_than_a_point_is_refused_as_no_point_list(tmp_path: Path) -> None:
    """A lidar's range image (64 beams x 2048 azimuths) saved as .npy read as 64 points of its first 4 pixels,
    with a warning of 0-255 intensities at the most; rows up to the widest point (64 values) still read."""
    image = np.random.default_rng(0).random((64, 2048)).astype(np.float32) * 50
    np.save(tmp_path / "range.npy", image)
    one_line_error(lambda: read_points(tmp_path / "range.npy"), "range.npy", "shape (64, 2048)",
                   "rows of 2048 values", "an image")
    widest = np.zeros((3, 64), np.float32)
    widest[:, :4] = sample(3)
    np.save(tmp_path / "widest.npy", widest)
    np.testing.assert_array_equal(read_points(tmp_path / "widest.npy"), sample(3))


def test_an_npz_named_npy_is_named_a_zip_archive_with_the_fix(tmp_path: Path) -> None:
    """np.savez's archive renamed .npy was refused as "no .npy magic number", naming neither what it is nor the fix."""
    np.savez(tmp_path / "frame.npz", points=sample(3))
    (tmp_path / "frame.npz").rename(tmp_path / "frame.npy")
    one_line_error(lambda: read_points(tmp_path / "frame.npy"), "frame.npy", "is a zip archive (an .npz of arrays, "
                   "named .npy), not a .npy file: save the frame's array from the archive as .npy (np.save(")


@pytest.mark.parametrize(("name", "kind"), [("frame.npy", ".npy"), ("frame.pcd", "PCD"), ("FRAME.NPY", ".npy")])
def test_a_0_byte_npy_or_pcd_is_said_to_be_empty(tmp_path: Path, name: str, kind: str) -> None:
    """A copy that failed leaves 0 bytes: said empty, as an empty .bin is, through both readers; it was refused as
    "no .npy magic number" or "the header has no DATA line", words of a file of another format."""
    path = tmp_path / name
    path.write_bytes(b"")
    for read in (read_points, lambda p: read_points_into(p, lambda n: np.empty((n, 4), np.float32))):
        text = one_line_error(lambda: read(path), f"point file '{path}' is empty (0 bytes), not a {kind} file: a "
                              "copy that failed? copy it again")
        assert "magic" not in text and "DATA" not in text, text


def test_npy_object_array_is_refused_without_unpickling(tmp_path: Path) -> None:
    np.save(tmp_path / "obj.npy", np.array([[1, 2, 3, "x"]], dtype=object), allow_pickle=True)
    one_line_error(lambda: read_points(tmp_path / "obj.npy"), "obj.npy", "dtype")


def test_npy_truncated_or_not_npy(tmp_path: Path) -> None:
    np.save(tmp_path / "cut.npy", sample(10))
    data = (tmp_path / "cut.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[:-8])
    one_line_error(lambda: read_points(tmp_path / "cut.npy"), "cut.npy", "152 data bytes", "says 160")
    (tmp_path / "junk.npy").write_bytes(b"hello world, not numpy")
    one_line_error(lambda: read_points(tmp_path / "junk.npy"), "junk.npy", "not a valid .npy")


# --------------------------------------------------------------------------- .pcd

def pcd_header(fields: str, size: str, type_: str, count: str, n: int, data: str, width: int | None = None,
               points: int | None = None, viewpoint: str | None = "0 0 0 1 0 0 0") -> bytes:
    """A .pcd header as PCL writes one (``viewpoint`` None: without the VIEWPOINT line, which PCL reads as the
    identity)."""
    return (
        "# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\n"
        f"FIELDS {fields}\nSIZE {size}\nTYPE {type_}\nCOUNT {count}\n"
        f"WIDTH {n if width is None else width}\nHEIGHT 1\n"
        + ("" if viewpoint is None else f"VIEWPOINT {viewpoint}\n")
        + f"POINTS {n if points is None else points}\nDATA {data}\n"
    ).encode()


def test_pcd_ascii(tmp_path: Path) -> None:
    pts = sample(6)
    pts[1, 2] = np.nan
    body = "".join(f"{p[0]:.9g} {p[1]:.9g} {p[2]:.9g} 7 {p[3]:.9g}\n" for p in pts)
    path = tmp_path / "a.pcd"
    path.write_bytes(pcd_header("x y z rgb intensity", "4 4 4 4 4", "F F F F F", "1 1 1 1 1", 6, "ascii") + body.encode())
    np.testing.assert_array_equal(read_points(path), pts)



def test_pcd_ascii_value_beyond_float32_is_refused_naming_its_row(tmp_path: Path) -> None:
    """1e39 in an ASCII file became inf in the float32 rows with NumPy's overflow warning (and its source
    line) on stderr; an unused field's large value, nan and inf (no return) are still read."""
    path = tmp_path / "big.pcd"
    header = pcd_header("x y z t intensity", "4 4 4 8 4", "F F F F F", "1 1 1 1 1", 3, "ascii")
    path.write_bytes(header + b"1 2 3 1e300 0.5\nnan nan inf 0 0\n-1e39 6 7 0 0.5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_line_error(lambda: read_points(path), "big.pcd", "point 3 holds -1e+39, beyond float32's range")
        path.write_bytes(header + b"1 2 3 1e300 0.5\nnan nan inf 0 0\n")
        path.write_bytes(path.read_bytes().replace(b"POINTS 3", b"POINTS 2").replace(b"WIDTH 3", b"WIDTH 2"))
        read = read_points(path)
    assert read[0].tolist() == [1, 2, 3, 0.5] and np.isnan(read[1, 0]) and np.isinf(read[1, 2])
    # binary fields of float64, and a float64 .npy, alike
    rec = np.zeros(3, dtype=[("x", "<f8"), ("y", "<f4"), ("z", "<f4"), ("intensity", "<f8")])
    rec["x"], rec["intensity"] = [1, np.inf, 2], [0.5, 0.5, 1e40]
    path.write_bytes(pcd_header("x y z intensity", "8 4 4 8", "F F F F", "1 1 1 1", 3, "binary") + rec.tobytes())
    npy = np.zeros((4, 4))
    npy[2, 1] = 3e38 * 10
    np.save(tmp_path / "big.npy", npy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_line_error(lambda: read_points(path), "big.pcd", "point 3 holds 1e+40, beyond float32's range")
        one_line_error(lambda: read_points(tmp_path / "big.npy"), "big.npy", "point 3 holds 3e+39, beyond float32's")

def test_pcd_ascii_number_too_large_even_for_float64_is_refused_as_one_beyond_float32(tmp_path: Path) -> None:
    """1e999 parses as infinity where 1e39 was refused: both are numbers beyond float32's range, in a field of
    either float size; the word inf (and nan) stays a value the points hold."""
    header = pcd_header("x y z intensity", "4 8 4 4", "F F F F", "1 1 1 1", 2, "ascii")
    path = tmp_path / "huge.pcd"
    for row in (b"1 2 3 0.5\n1e999 2 3 0.5\n", b"1 2 3 0.5\n1 -1E+999 3 0.5\n", b"1 2 3 0.5\n1e39 2 3 0.5\n"):
        path.write_bytes(header + row)
        one_line_error(lambda: read_points(path), "huge.pcd", "point 2 holds", "beyond float32's range")
    path.write_bytes(header + b"-inf 2 +Infinity 0.5\nnan 2 3 INF\n")
    got = read_points(path)
    assert got[0, 0] == -np.inf and got[0, 2] == np.inf and np.isnan(got[1, 0]) and got[1, 3] == np.inf


@pytest.mark.parametrize("value", ["-5", "300", "0.5", "nan", "inf"])
def test_pcd_ascii_value_its_declared_integer_type_cannot_hold_is_refused(tmp_path: Path, value: str) -> None:
    """A field of TYPE U SIZE 1 holds 0..255 whole numbers: a row with -5, 300 or 0.5 there (once read as
    that value) says the header does not describe the data. The same row with TYPE F is read."""
    body = f"1 2 3 7\n4 5 6 {value}\n".encode()
    path = tmp_path / "u.pcd"
    path.write_bytes(pcd_header("x y z intensity", "4 4 4 1", "F F F U", "1 1 1 1", 2, "ascii") + body)
    one_line_error(lambda: read_points(path), "u.pcd", f"row 2 of 2: field intensity is TYPE U SIZE 1 (uint8), "
                   f"which cannot hold '{value}'", "correct the field's TYPE and SIZE")
    path.write_bytes(pcd_header("x y z intensity", "4 4 4 1", "F F F I", "1 1 1 1", 2, "ascii") + body)
    if value == "-5":
        assert read_points(path)[1, 3] == -5
    path.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 2, "ascii") + body)
    assert read_points(path)[0].tolist() == [1, 2, 3, 7]
    path.write_bytes(pcd_header("x y z intensity", "4 4 4 1", "F F F U", "1 1 1 1", 2, "ascii") + b"1 2 3 0\n4 5 6 255\n")
    assert read_points(path)[:, 3].tolist() == [0, 255]


def test_pcd_binary_with_uint8_i_and_multi_count_field(tmp_path: Path) -> None:
    n = 5
    rec = np.zeros(n, dtype=[("x", "<f4"), ("normal", "<f4", (3,)), ("y", "<f8"), ("z", "<f4"), ("i", "u1")])
    pts = sample(n)
    rec["x"], rec["y"], rec["z"] = pts[:, 0], pts[:, 1], pts[:, 2]
    rec["i"] = np.array([0, 17, 128, 255, 3])
    rec["normal"] = 9.0
    path = tmp_path / "b.pcd"
    path.write_bytes(pcd_header("x normal y z i", "4 4 8 4 1", "F F F F U", "1 3 1 1 1", n, "binary") + rec.tobytes())
    got = read_points(path)
    expected = np.column_stack([pts[:, 0], rec["y"].astype(np.float32), pts[:, 2], [0, 17, 128, 255, 3]])
    np.testing.assert_array_equal(got, expected.astype(np.float32))
    assert looks_8bit(got)
    scaled = read_points(path, intensity_scale=1 / 255)
    np.testing.assert_allclose(scaled[:, 3], np.array([0, 17, 128, 255, 3]) / 255, rtol=1e-6)
    np.testing.assert_array_equal(scaled[:, :3], got[:, :3])


def test_pcd_reflectance_field_is_the_intensity(tmp_path: Path) -> None:
    """KITTI's word for the 4th value names the intensity field of some converters' .pcd files."""
    pts = sample(3)
    path = tmp_path / "r.pcd"
    path.write_bytes(pcd_header("x y z reflectance", "4 4 4 4", "F F F F", "1 1 1 1", 3, "binary") + pts.tobytes())
    np.testing.assert_array_equal(read_points(path), pts)


def test_pcd_real_frame_binary_and_ascii(assets: Path, tmp_path: Path) -> None:
    pts = read_points(assets / "kitti/training/velodyne_reduced/000134.bin")
    n = len(pts)
    binary = tmp_path / "f.pcd"
    binary.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", n, "binary") + pts.tobytes())
    np.testing.assert_array_equal(read_points(binary), pts)
    text = tmp_path / "t.pcd"
    text.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", n, "ascii")
                     + "".join(f"{a:.9g} {b:.9g} {c:.9g} {d:.9g}\n" for a, b, c, d in pts.tolist()).encode())
    np.testing.assert_array_equal(read_points(text), pts)


def test_pcd_errors(tmp_path: Path) -> None:
    pts = sample(4)
    head = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 4, "binary")
    cut = tmp_path / "cut.pcd"
    cut.write_bytes(head + pts.tobytes()[:-5])
    one_line_error(lambda: read_points(cut), "cut.pcd", "59 bytes of binary data", "needs 64", "truncated")
    cut.write_bytes(head + pts.tobytes()[:1])
    one_line_error(lambda: read_points(cut), "cut.pcd", ": 1 byte of binary data, but POINTS 4", "needs 64", "truncated")
    short_ascii = tmp_path / "short.pcd"
    short_ascii.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 4, "ascii")
                            + b"1 2 3 4\n5 6 7 8\n")
    one_line_error(lambda: read_points(short_ascii), "2 ASCII data rows", "POINTS is 4", "truncated")
    ragged = tmp_path / "ragged.pcd"
    ragged.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 2, "ascii") + b"1 2 3 4\n5 6 7\n")
    one_line_error(lambda: read_points(ragged), "ragged.pcd", "bad ASCII data on line 13 (row 2 of 2 after DATA)",
                   "'5 6 7' is not 4 numbers")
    no_i = tmp_path / "noi.pcd"
    no_i.write_bytes(pcd_header("x y z", "4 4 4", "F F F", "1 1 1", 1, "ascii") + b"1 2 3\n")
    one_line_error(lambda: read_points(no_i), "lack intensity (or i or reflectance)")
    bad_size = tmp_path / "size.pcd"
    bad_size.write_bytes(pcd_header("x y z intensity", "4 4 2 4", "F F F F", "1 1 1 1", 1, "ascii") + b"1 2 3 4\n")
    one_line_error(lambda: read_points(bad_size), "field 'z' has TYPE 'F' on line 5, SIZE '2' on line 4")
    counts = tmp_path / "counts.pcd"
    counts.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1", 1, "ascii") + b"1 2 3 4\n")
    one_line_error(lambda: read_points(counts), "4 FIELDS", "3 COUNT")
    points = tmp_path / "points.pcd"
    points.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 4, "binary", width=3)
                       + pts.tobytes())
    one_line_error(lambda: read_points(points), "POINTS 4 but WIDTH 3 x HEIGHT 1 = 3")
    multi = tmp_path / "multi.pcd"
    multi.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 2", 1, "ascii") + b"1 2 3 4 5\n")
    one_line_error(lambda: read_points(multi), "field intensity has COUNT 2 on line 6, expected 1")
    huge = tmp_path / "huge.pcd"
    huge.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", MAX_FRAME_POINTS + 1, "binary"))
    one_line_error(lambda: read_points(huge), f"POINTS {MAX_FRAME_POINTS + 1}", "limit")
    junk = tmp_path / "junk.pcd"
    junk.write_bytes(b"\x1b[2Jhello\n")
    text = one_line_error(lambda: read_points(junk), "not a PCD file")
    assert "\x1b" not in text


def multi_sweep_frame(n: int = 300) -> np.ndarray:
    """(n, 5) float32 x, y, z, intensity, time lag of 3 sweeps, as accumulate builds a frame: one lag a sweep."""
    lags = np.repeat(np.float32([0.0, 0.05, 0.1]), -(-n // 3))[:n]
    return np.column_stack([sample(n, seed=3), lags]).astype(np.float32)


@pytest.mark.parametrize("data", ["ascii", "binary", "binary_compressed"])
@pytest.mark.parametrize("time_field", ["time", "timestamp", "time_lag"])
def test_pcd_with_a_time_field_reads_for_a_multi_sweep_model_as_its_npy_and_bin_do(
        tmp_path: Path, data: str, time_field: str) -> None:
    """A .pcd of fields x y z intensity time given to a multi-sweep model (5 columns) was refused (".pcd frames are
    read as x, y, z, intensity ... use .bin or .npy"): its time field (or timestamp, or time_lag, as OpenPCDet names
    it) is the 5th column, read as the same frame's .npy and .bin are, by read_points and read_points_into; a model
    of 4 columns reads its x, y, z, intensity as before."""
    frame = multi_sweep_frame()
    fields = f"x y z intensity {time_field}"
    if data == "ascii":
        body = "".join(" ".join(f"{v:.9g}" for v in row) + "\n" for row in frame).encode()
    elif data == "binary":
        body = frame.tobytes()
    else:
        raw = np.ascontiguousarray(frame.T).tobytes()  # the fields as planes
        stream = lzf_literals(raw)
        body = struct.pack("<II", len(stream), len(raw)) + stream
    pcd = tmp_path / "frame.pcd"
    pcd.write_bytes(pcd_header(fields, "4 4 4 4 4", "F F F F F", "1 1 1 1 1", len(frame), data) + body)
    np.save(tmp_path / "frame.npy", frame)
    frame.tofile(tmp_path / "frame.bin")
    for path in (pcd, tmp_path / "frame.npy"):
        np.testing.assert_array_equal(read_points(path, columns=5), frame)
        np.testing.assert_array_equal(read_points_into(path, lambda n: np.empty((n, 4), np.float32), columns=5), frame)
    np.testing.assert_array_equal(read_points(tmp_path / "frame.bin", point_dim=5), frame)
    np.testing.assert_array_equal(read_points(pcd), frame[:, :4])


def test_pcd_time_field_meets_the_time_lag_checks_and_a_pcd_without_one_names_accumulate(tmp_path: Path) -> None:
    """A multi-sweep model's .pcd is checked as its .npy is: a time field of absolute timestamps (a driver's
    per-point time since 1970) is refused as no time lags, and a single sweep's .pcd (no time field) is refused
    naming the field it lacks and how multi-sweep frames are built."""
    frame = multi_sweep_frame()
    frame[:, 4] += np.float32(1.7e9)
    stamps = tmp_path / "stamps.pcd"
    stamps.write_bytes(pcd_header("x y z intensity time", "4 4 4 4 4", "F F F F F", "1 1 1 1 1", len(frame), "binary")
                       + frame.tobytes())
    one_line_error(lambda: read_points(stamps, columns=5), f"point file {str(stamps)!r}: its 5th values run from ",
                   "but this model reads each point's time lag behind the key sweep there")
    sweep = tmp_path / "sweep.pcd"
    sweep.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 7, "binary") + sample().tobytes())
    one_line_error(lambda: read_points(sweep, columns=5), f"point file {str(sweep)!r}: FIELDS 'x y z intensity' on "
                   "line 3 lack time (or timestamp or time_lag); single sweeps? a multi-sweep model needs accumulated "
                   "frames, each point's 5th value its time lag behind the key sweep: PointPillars.accumulate")


def test_pcd_viewpoint_is_not_applied_and_said_unless_it_is_the_identity(tmp_path: Path) -> None:
    """The points of a .pcd come as stored whatever its VIEWPOINT (PCL's loader applies none): the same rows with
    the identity, with none, with all zeros (a zero-filled line: a zero quaternion is no rotation, and its fix, to
    apply the pose, could not be followed), and with a sensor pose, in binary and ASCII. Only the pose is said: one
    InputWarning naming the file, the values as written and the fix, or one call of ``viewpoint_note`` with the
    same text (then no warning)."""
    pts = sample(5)
    pose = "1.5 -2 0.25 0.7071068 0 0 0.7071068"  # 90 degrees about z, moved: what a sensor mounted on a car has
    rows = {"binary": pts.tobytes(),
            "ascii": "".join(f"{a:.9g} {b:.9g} {c:.9g} {d:.9g}\n" for a, b, c, d in pts.tolist()).encode()}
    for data, body in rows.items():
        for name, viewpoint, said in (("identity", "0 0 0 1 0 0 0", False), ("none", None, False),
                                      ("negated", "0 0 0 -1 0 0 0", False), ("zeros", "0 0 0 0 0 0 0", False),
                                      ("pose", pose, True)):
            path = tmp_path / f"{name}_{data}.pcd"
            path.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 5, data,
                                        viewpoint=viewpoint) + body)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                np.testing.assert_array_equal(read_points(path), pts)
            notes: list[str] = []
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                np.testing.assert_array_equal(read_points(path, viewpoint_note=notes.append), pts)
            texts = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
            assert len(caught) == len(texts) == len(notes) == int(said), (name, data, texts, notes)
            if said:
                assert texts == notes
                assert texts[0].startswith(f"{str(path)!r}: its VIEWPOINT {pose} (the sensor's pose: tx ty tz qw qx qy "
                                           "qz) is not the identity; its points are read as stored"), texts[0]
                assert "transform them first" in texts[0] and "VIEWPOINT 0 0 0 1 0 0 0" in texts[0]


def test_pcd_malformed_viewpoint_is_refused_naming_the_file(tmp_path: Path) -> None:
    for index, viewpoint in enumerate(("0 0 0 1 0 0", "0 0 0 1 0 0 0 0", "0 0 0 1 0 0 x", "nan 0 0 1 0 0 0",
                                       "1e999 0 0 1 0 0 0", "0x1 0 0 1 0 0 0", "")):
        path = tmp_path / f"bad{index}.pcd"
        path.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 1, "ascii",
                                    viewpoint=viewpoint) + b"1 2 3 0.5\n")
        one_line_error(lambda: read_points(path), f"bad{index}.pcd",  # noqa: B023
                       f"header VIEWPOINT '{viewpoint}' on line 9 is not 7 numbers (tx ty tz qw qx qy qz")


# --------------------------------------------------------------------------- extensions, special files

def test_unknown_extension_lists_supported(tmp_path: Path) -> None:
    (tmp_path / "f.las").write_bytes(b"")
    one_line_error(lambda: read_points(tmp_path / "f.las"), "extension '.las'", ".bin, .npy, .pcd")
    (tmp_path / "noext").write_bytes(b"")
    one_line_error(lambda: read_points(tmp_path / "noext"), "no extension", ".bin, .npy, .pcd")
    assert SUPPORTED_EXTENSIONS == (".bin", ".npy", ".pcd")


def refused_within(seconds: float, call) -> InputError:  # type: ignore[no-untyped-def]
    """Run ``call`` in a daemon thread; it must raise InputError, and do so in time (never block)."""
    box: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader blocked"
    assert time.monotonic() - start < seconds
    assert box and isinstance(box[0], InputError), box
    return box[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize("ext", [".bin", ".npy", ".pcd"])
def test_fifo_refused_at_once(tmp_path: Path, ext: str) -> None:
    fifo = tmp_path / f"pipe{ext}"
    os.mkfifo(fifo)
    err = refused_within(5, lambda: read_points(fifo))
    assert "FIFO" in str(err) and "not a regular file" in str(err)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_dev_zero_refused(tmp_path: Path) -> None:
    link = tmp_path / "zero.bin"
    link.symlink_to("/dev/zero")
    err = refused_within(5, lambda: read_points(link))
    assert "character device" in str(err)
    err = refused_within(5, lambda: read_bin("/dev/zero"))
    assert "/dev/zero" in str(err)


@pytest.mark.skipif(not os.path.exists("/dev/zero") or not hasattr(os, "mkfifo"), reason="needs /dev/zero and FIFOs")
def test_a_device_or_fifo_without_a_point_files_extension_is_named_for_what_it_is(tmp_path: Path) -> None:
    """/dev/zero given as a frame was refused for its missing extension ("has no extension; supported: .bin, ..."),
    as if renaming it would read it: it is no regular file, whatever its name. A FIFO without a writer: at once."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in [("/dev/zero", "a character device"), ("/dev/urandom", "a character device"),
                       (str(fifo), "a FIFO (named pipe)")]:
        for read in (read_points, lambda p: read_points_into(p, lambda n: np.empty((n, 4), np.float32))):
            err = refused_within(5, lambda: read(path))
            assert str(err) == f"point file {path!r} is {kind}, not a regular file"


def test_sparse_20gb_frame_refused_by_size(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(20_000_000_000)
    start = time.monotonic()
    text = one_line_error(lambda: read_points(big), "20000000000 bytes", "1250000000 points", str(MAX_FRAME_POINTS))
    assert time.monotonic() - start < 1.0 and "big.bin" in text
    npy = tmp_path / "big.npy"
    with open(npy, "wb") as f:
        f.truncate(20_000_000_000)
    one_line_error(lambda: read_points(npy), "20000000000 bytes", "limit")


def test_frame_just_over_the_point_limit_refused(tmp_path: Path) -> None:
    path = tmp_path / "over.bin"
    with open(path, "wb") as f:
        f.truncate((MAX_FRAME_POINTS + 1) * 16)
    one_line_error(lambda: read_points(path), f"{MAX_FRAME_POINTS + 1} points")


@pytest.mark.parametrize("point_dim", [4, 5])
def test_bin_written_over_while_being_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      point_dim: int) -> None:
    """A writer that starts the file over between its size and its read (truncated, then a first block of points
    written) left whole rows: read_points gave those 100 points as the frame of 1000, without a word."""
    path = tmp_path / "logged.bin"
    sample(1000 * point_dim // 4).tofile(path)  # 1000 rows of point_dim values
    read = os.readv

    def writer_starts_over(fd: int, buffers: list) -> int:  # type: ignore[type-arg]
        os.truncate(path, 100 * 4 * point_dim)
        return read(fd, buffers)

    monkeypatch.setattr(os, "readv", writer_starts_over)
    one_line_error(lambda: read_points(path, point_dim=point_dim, columns=4), repr(str(path)),
                   "shrank while being read (was it still being written?)")


@pytest.mark.skipif(not hasattr(os, "set_blocking"), reason="no non-blocking pipes here")
@pytest.mark.parametrize("gives", ["no data", "no data, cut short", "its data, then none"])
@pytest.mark.parametrize("point_dim", [4, 5])
def test_a_bin_that_would_wait_for_data_is_said_to_give_none_without_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point_dim: int, gives: str) -> None:
    """A .bin that says it is regular but would wait for data (a FUSE file answering EAGAIN) was "cannot be read:
    Resource temporarily unavailable", the system's words, where a .npy or .pcd says what it is. None can be made
    here (/proc/kmsg would take what the system log waits for): the file's descriptor is a real non-blocking pipe
    whose writer stays, which answers a read as such a file does. Every .bin read meets it: read_points' and
    read_points_into's, of whole rows, of a size that fits none (its first bytes are looked at then) and of a file
    that gives the bytes of its size, then would wait for more (a byte past them shows one that grew)."""
    path = tmp_path / "frame.bin"
    path.write_bytes(bytes(40 * point_dim + (3 if gives == "no data, cut short" else 0)))
    writers: list[int] = []

    def open_waiting(name: object, **_: object) -> tuple[int, os.stat_result]:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        writers.append(write_end)
        if gives == "its data, then none":
            os.write(write_end, path.read_bytes())
        return read_end, os.stat(path)  # the reader closes its descriptor

    monkeypatch.setattr(pointcloud_io, "open_regular_fd", open_waiting)
    expected = (f"point file {str(path)!r} cannot be read: it gives no data without waiting (as /proc/kmsg does): "
                "not a regular file's contents")
    try:
        for read in (lambda: read_points(path, point_dim=point_dim),
                     lambda: read_points_into(path, lambda n: np.empty((n, 4), np.float32), point_dim=point_dim),
                     lambda: read_points_into(path, lambda n: np.empty((n, 4), np.float32), point_dim=point_dim,
                                              columns=point_dim)):
            assert one_line_error(read) == expected
    finally:
        for write_end in writers:
            os.close(write_end)
    assert len(writers) == 3


def placeholder_sized_file() -> Path | None:
    """A sysfs file whose size (4096, a page) is not what it holds (a few bytes), or None where none is here."""
    for name in ("/sys/class/net/lo/address", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state"):
        path = Path(name)
        try:
            if path.is_file() and len(path.read_bytes()) < path.stat().st_size:
                return path
        except OSError:
            continue
    return None


def test_a_file_whose_size_never_counted_its_bytes_is_not_said_to_have_shrunk(tmp_path: Path) -> None:
    """A sysfs file says 4096 bytes and holds a few (procfs says 0, as files on some FUSE mounts do): it was
    "shrank while being read (was it still being written?)", a writer there is none of."""
    target = placeholder_sized_file()
    if target is None:
        pytest.skip("no sysfs file whose size is a placeholder here")
    link = tmp_path / "frame.bin"
    link.symlink_to(target)
    held = len(target.read_bytes())
    expected = (f"point file {str(link)!r}: its size says {target.stat().st_size} bytes but a read gives {held}, and "
                "the file did not change")
    for read in (read_points, lambda p: read_points_into(p, lambda n: np.empty((n, 4), np.float32))):
        text = one_line_error(lambda: read(link), expected)
        assert "shrank" not in text


@pytest.mark.parametrize("change", ["truncated", "appended to"])
def test_a_bin_written_while_read_into_given_rows_is_refused_as_one_that_changed(tmp_path: Path, change: str) -> None:
    """read_points_into (infer_many's read) between the file's size and its read (when ``allocate`` gives the rows)
    of a file a writer cuts short or adds to: a file appended to gave the points of its size as the frame, without
    a word; one cut short was "changed size while being read"."""
    path = tmp_path / "logged.bin"
    sample(1000).tofile(path)

    def allocate_while_written(n: int) -> np.ndarray:
        if change == "truncated":
            os.truncate(path, 100 * 16)
        else:
            with open(path, "ab") as f:
                f.write(sample(10).tobytes())
        return np.empty((n, 4), np.float32)

    word = "shrank" if change == "truncated" else "grew"
    one_line_error(lambda: read_points_into(path, allocate_while_written),
                   f"point file {str(path)!r} {word} while being read (was it still being written?)")


def test_a_bin_that_says_it_is_empty_is_read_into_given_rows_by_what_it_holds(tmp_path: Path) -> None:
    """procfs says 0 bytes of files that hold some: read_points_into took that size for the frame's and gave an
    empty frame (infer wrote 0 boxes and warned "an empty file: a copy that failed?"); it reads what it holds, as
    read_points does, and refuses it as read_points does."""
    status = Path("/proc/self/status")
    if not status.is_file() or status.stat().st_size != 0:
        pytest.skip("no procfs file that reports a size of 0 here")
    link = tmp_path / "status.bin"
    link.symlink_to(status)
    one_line_error(lambda: read_points_into(link, lambda n: np.empty((n, 4), np.float32)), str(link), "is text")


#: A .npy header whose bytes hold no NUL (minor version 1, a header of 0x0101 bytes), to be a process's argument.
_NPY_HEAD = (b"\x93NUMPY\x01\x01" + (0x0101).to_bytes(2, "little")
             + b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), }".ljust(0x0100) + b"\n")
_PCD_HEAD = (b"# .PCD v0.7\nVERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\nWIDTH 1\n"
             b"HEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 1\nDATA ")


@pytest.mark.parametrize("name, head, holds", [
    ("frame.npy", _NPY_HEAD, "a .npy header"),
    ("frame.pcd", _PCD_HEAD + b"binary\n", "a .pcd header of DATA binary"),
    ("frame.pcd", _PCD_HEAD + b"binary_compressed\n", "a .pcd header of DATA binary_compressed"),
])
def test_a_npy_or_binary_pcd_that_says_it_is_empty_is_refused_saying_so(tmp_path: Path, name: str, head: bytes,
                                                                       holds: str) -> None:
    """A real procfs file that says it is empty and holds a valid header, a process's command line
    (``/proc/PID/cmdline``: its arguments, each ended by a NUL): the data was checked against the file's size less its
    header, and the error said it "has -267 data bytes" (.npy) or "-149 bytes of binary data ... (truncated)" (.pcd).
    It says what is so, and the fix."""
    assert b"\0" not in head
    cat = shutil.which("cat")
    if cat is None or not Path("/proc/self/cmdline").is_file():
        pytest.skip("no procfs here, or no cat to show a command line in it")
    child = subprocess.Popen([head], executable=cat, stdin=subprocess.PIPE)
    try:
        cmdline = Path(f"/proc/{child.pid}/cmdline")
        deadline = time.monotonic() + 10
        while cmdline.read_bytes() != head + b"\0":  # the command line of the process started, once it runs cat
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        if cmdline.stat().st_size != 0:
            pytest.skip("procfs gives a command line's size here")
        link = tmp_path / name
        link.symlink_to(cmdline)
        assert one_line_error(lambda: read_points(link), str(link)) == (
            f"point file {str(link)!r} says it is empty (size 0, as /proc files and files on some FUSE mounts say) but "
            f"holds {holds}: copy it to a regular file (cp) to read it")
    finally:
        child.communicate()


def test_missing_and_directory(tmp_path: Path) -> None:
    one_line_error(lambda: read_points(tmp_path / "none.pcd"), "does not exist")
    (tmp_path / "d.npy").mkdir()
    one_line_error(lambda: read_points(tmp_path / "d.npy"), "is a directory")


# --------------------------------------------------------------------------- intensity

def looks_8bit(points: np.ndarray) -> bool:
    """Whether a frame's intensities look 0-255 to a model trained on KITTI's 0-1 reflectance."""
    return intensity_mismatch(points, expects_unit=True) == "8bit"


def test_intensity_mismatch_finds_8bit_frames() -> None:
    pts = sample(100)
    assert not looks_8bit(pts)  # KITTI-like 0..1
    pts[:, 3] *= 255
    assert looks_8bit(pts)
    pts[0, 3] = np.nan
    assert looks_8bit(pts)  # NaN ignored
    pts[1, 3] = 300
    assert not looks_8bit(pts)  # not 0..255
    pts[1, 3] = -2
    assert not looks_8bit(pts)
    assert not looks_8bit(np.zeros((0, 4), np.float32))
    assert not looks_8bit(np.array([[0, 0, 0, 1.4]], np.float32))


def test_intensity_mismatch_names_the_scale_a_frame_disagrees_with() -> None:
    from pointpillars_trt.intensities import UNIT_INTENSITY_MIN_POINTS

    unit = sample(UNIT_INTENSITY_MIN_POINTS)
    unit[:, 3] = np.linspace(0.0, 1.0, len(unit))
    assert intensity_mismatch(unit, expects_unit=True) is None
    assert intensity_mismatch(unit, expects_unit=False) == "unit"  # 0-1 values for a model of 0-255
    assert intensity_mismatch(unit[:-1], expects_unit=False) is None  # too few points to tell
    eight = unit.copy()
    eight[:, 3] *= 255
    assert intensity_mismatch(eight, expects_unit=True) == "8bit"
    assert intensity_mismatch(eight, expects_unit=False) is None
    beyond = unit.copy()
    beyond[:, 3] *= 65535
    beyond[0, 3] = np.nan
    assert intensity_mismatch(beyond, expects_unit=True) == "beyond"
    assert intensity_mismatch(beyond, expects_unit=False) == "over255"  # 16-bit values for a model of 0-255
    assert intensity_mismatch(-beyond, expects_unit=False) == "over255"
    beyond[:, 3] = np.nan
    assert intensity_mismatch(beyond, expects_unit=True) is None and intensity_mismatch(beyond, False) is None
    centred = unit.copy()
    centred[:, 3] -= 0.5  # negative values are no 0-1 reflectance, nor any intensity
    assert intensity_mismatch(centred, expects_unit=False) == "negative"
    assert intensity_mismatch(centred, expects_unit=True) == "negative"
    zero = sample(UNIT_INTENSITY_MIN_POINTS + 1)
    zero[:, 3] = 0.0  # a file written without intensities, zeros in their place: either model
    assert intensity_mismatch(zero, expects_unit=True) == "zero" and intensity_mismatch(zero, False) == "zero"
    assert intensity_mismatch(zero[:-2], expects_unit=True) is None  # too few points to tell
    zero[7, 3] = 0.01  # one return of some reflectance: a dark scene, not a missing column
    assert intensity_mismatch(zero, expects_unit=True) is None
    zero[7, 3], zero[8] = -0.0, np.nan  # -0.0 is 0 too; a row of no return is passed over
    assert intensity_mismatch(zero, expects_unit=True) == "zero"


def test_intensities_of_another_column_are_found_by_their_negative_values(assets: Path) -> None:
    """A real frame with z read as the intensity (the ground's z is negative), its columns in the order i, x,
    y, z, or its intensities negated: 128 boxes at score 1.00 came of such a file without a word. A few
    stray negative values (under NEGATIVE_SHARE of the points) are no other column."""
    from pointpillars_trt.intensities import NEGATIVE_SHARE, find_intensity_mismatch

    frame = np.fromfile(assets / "kitti" / "training" / "velodyne_fov" / "000000.bin", "<f4").reshape(-1, 4)
    assert intensity_mismatch(frame, expects_unit=True) is None
    z_as_i = frame.copy()
    z_as_i[:, 3] = frame[:, 2]
    rolled = np.ascontiguousarray(np.roll(frame, 1, axis=1))  # i, x, y, z
    for points in (z_as_i, rolled, frame * np.float32([1, 1, 1, -1])):
        for unit in (True, False):
            found = find_intensity_mismatch(points, expects_unit=unit)
            assert found is not None and found.kind == "negative", found
            assert found.largest == -float(points[:, 3].min())
    stray = frame.copy()
    count = int(NEGATIVE_SHARE * len(frame)) - 1
    stray[:count, 3] = -0.01
    assert intensity_mismatch(stray, expects_unit=True) is None
    stray[: count + 2, 3] = -0.01
    assert intensity_mismatch(stray, expects_unit=True) == "negative"


def test_intensity_scale(tmp_path: Path) -> None:
    pts = sample(5)
    pts[:, 3] = [0, 10, 100, 200, 255]
    (tmp_path / "s.bin").write_bytes(pts.tobytes())
    got = read_points(tmp_path / "s.bin", intensity_scale=1 / 255)
    np.testing.assert_allclose(got[:, 3], [0, 10 / 255, 100 / 255, 200 / 255, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(got[:, :3], pts[:, :3])
    one_line_error(lambda: read_points(tmp_path / "s.bin", intensity_scale=float("nan")), "intensity scale")
    one_line_error(lambda: read_points(tmp_path / "s.bin", intensity_scale=0), "intensity scale")
    one_line_error(lambda: read_points(tmp_path / "s.bin", intensity_scale=1e-300), "intensity scale", "[1e-06, 1000]")
    one_line_error(lambda: read_points(tmp_path / "s.bin", intensity_scale=1e39), "intensity scale", "[1e-06, 1000]")


# --------------------------------------------------------------------------- hostile .npy headers

def write_npy_header(path: Path, header: str, data: bytes = b"") -> Path:
    """A version 1.0 .npy file with ``header`` written as it is (padded as NumPy pads it)."""
    text = header.encode("latin1")
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data)
    return path


@pytest.mark.parametrize("header, data_bytes, needle", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (True, 4), }", 16, "shape (True, 4)"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (4, True), }", 16, "shape (4, True)"),
    ("{'descr': '<f4', 'fortran_order': 'yes', 'shape': (2, 4), }", 32, "fortran_order 'yes'"),
    ("{'descr': 7, 'fortran_order': False, 'shape': (2, 4), }", 32, "not a valid .npy"),
    # a call, an expression or a name: ast's words named the parse node by its address ("<ast.Call object at 0x7f..")
    *((header, 32, "is not a valid .npy file: header is not a Python literal (a dict of descr, fortran_order and shape)")
      for header in ("__import__('os').system('true')", "{'descr': '<f4', 'fortran_order': False, 'shape': (2 * 1, 4)}",
                     "{'descr': '<f4', 'fortran_order': no, 'shape': (2, 4)}")),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * 5000 + ")" * 5000 + "}", 32, "not a valid .npy"),
])
def test_npy_hostile_header_is_one_error(tmp_path: Path, header: str, data_bytes: int, needle: str) -> None:
    """Bools are ints to isinstance: a (True, 4) header with its 16 data bytes once reached reshape and
    raised TypeError. The data sizes match what each header claims, so only the header check can refuse."""
    path = write_npy_header(tmp_path / "h.npy", header, b"\0" * data_bytes)
    one_line_error(lambda: read_points(path), "h.npy", needle)


LONG = "9" * 5000  # past Python's 4,300-digit limit on int(), whose error names a setting, not the fix


@pytest.mark.parametrize("key, needle", [
    ("WIDTH", "header WIDTH '999"), ("HEIGHT", "header HEIGHT '999"), ("POINTS", "header POINTS '999"),
    ("SIZE", "field 'x' has TYPE 'F' on line 3, SIZE '999"), ("COUNT", "field 'x' has COUNT '999"),
])
def test_pcd_header_number_of_thousands_of_digits_is_not_a_count(tmp_path: Path, key: str, needle: str) -> None:
    values = {"SIZE": "4 4 4 4", "COUNT": "1 1 1 1", "WIDTH": "1", "HEIGHT": "1", "POINTS": "1"}
    values[key] = f"{LONG} {values[key].split(' ', 1)[1]}" if " " in values[key] else LONG
    header = "VERSION 0.7\nFIELDS x y z intensity\nTYPE F F F F\n" + "".join(f"{k} {v}\n" for k, v in values.items())
    path = tmp_path / "d.pcd"
    path.write_bytes((header + "DATA binary\n").encode() + bytes(16))
    text = one_line_error(lambda: read_points(path), "d.pcd", needle)
    assert "set_int_max_str_digits" not in text


def test_npy_shape_of_thousands_of_digits_is_not_a_size(tmp_path: Path) -> None:
    path = write_npy_header(tmp_path / "h.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + LONG + ", 4), }")
    text = one_line_error(lambda: read_points(path), "h.npy", "not a valid .npy", "a number of 5000 digits: not a size")
    assert "set_int_max_str_digits" not in text


def test_pcd_huge_count_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.pcd"
    path.write_text("VERSION .7\nFIELDS x y z intensity w\nSIZE 4 4 4 4 4\nTYPE F F F F F\n"
                    "COUNT 1 1 1 1 99999999999999999999\nWIDTH 1\nHEIGHT 1\nPOINTS 1\nDATA binary\n" + "\0" * 16)
    one_line_error(lambda: read_points(path), "c.pcd", "field 'w' has COUNT")


def test_pcd_padding_fields_may_repeat_as_in_ouster_clouds(tmp_path: Path) -> None:
    """PCL names padding bytes ``_``; Ouster's ROS driver pads several fields, so its header repeats the
    name. Those are skipped; any other name given twice is still refused."""
    rows = 5
    layout = [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("pad0", "u1", (4,)), ("intensity", "<f4"), ("t", "<u4"),
              ("reflectivity", "<u2"), ("ring", "<u2"), ("ambient", "<u2"), ("pad1", "u1", (2,)),
              ("range", "<u4"), ("pad2", "u1", (12,))]
    table = np.zeros(rows, np.dtype(layout))
    rng = np.random.default_rng(4)
    for name in ("x", "y", "z", "intensity"):
        table[name] = rng.uniform(-50, 50, rows).astype(np.float32)
    table["pad0"], table["pad2"], table["ring"] = 255, 7, 3
    header = ("VERSION 0.7\nFIELDS x y z _ intensity t reflectivity ring ambient _ range _\n"
              "SIZE 4 4 4 1 4 4 2 2 2 1 4 1\nTYPE F F F U F U U U U U U U\nCOUNT 1 1 1 4 1 1 1 1 1 2 1 12\n"
              f"WIDTH {rows}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {rows}\nDATA binary\n")
    path = tmp_path / "ouster.pcd"
    path.write_bytes(header.encode() + table.tobytes())
    got = read_points(path)
    expected = np.column_stack([table[name] for name in ("x", "y", "z", "intensity")])
    np.testing.assert_array_equal(got, expected)
    path.write_bytes(header.replace("ambient", "ring").encode() + table.tobytes())
    one_line_error(lambda: read_points(path), "ouster.pcd", "repeats a name")

def test_any_reader_exception_is_that_files_input_error(tmp_path: Path) -> None:
    """os.stat raises ValueError (not OSError) on a NUL in a name, e.g. one read from a list file."""
    one_line_error(lambda: read_points(f"{tmp_path}/a\0b.bin"), "a\\x00b.bin", "cannot be read", "ValueError")
    # read_points_into (infer_many's read) let the ValueError through
    one_line_error(lambda: read_points_into(f"{tmp_path}/a\0b.bin", lambda n: np.empty((n, 4), np.float32)),
                   "a\\x00b.bin", "cannot be read", "ValueError")


@pytest.mark.parametrize(("tail", "rows"), [("zeros", 2), ("one long line", 2), ("one long line", 150_000)])
def test_ascii_pcd_data_without_line_breaks_is_refused_at_once(tmp_path: Path, tail: str, rows: int) -> None:
    """64 MiB of ASCII data with no line break after its rows (a sparse file of zeros, or '1 ' repeated): carried
    from block to block it cost time quadratic in the size (400 MB: 81 s, 4 GB of memory); refused as soon
    as a row runs past what its numbers can take, named by its line in the file and its row (blank lines were
    counted as rows), in the first block read or past it."""
    import time

    header = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 4_000_000, "ascii")
    body = b"1 2 3 0.5\n\n" * rows  # each row followed by a blank line
    path = tmp_path / f"{tail.replace(' ', '_')}.pcd"
    with open(path, "wb") as f:
        f.write(header + body)
        if tail == "zeros":
            f.truncate(64 * 2**20)
        else:
            f.write(b"1 " * (32 * 2**20))
    line = header.count(b"\n") + 2 * rows + 1
    start = time.perf_counter()
    text = one_line_error(lambda: read_points(path))
    assert time.perf_counter() - start < 2.0
    assert text.endswith(f": ASCII data on line {line} (row {rows + 1} of 4000000 after DATA) runs past 192 bytes "
                         "without a line break; a row of 4 numbers is shorter"), text


def test_ascii_pcd_is_parsed_in_blocks_with_memory_near_the_result(tmp_path: Path) -> None:
    """512 Ki rows (9 MiB of text): parsed whole, the text, its line list and a float64 table took
    ~10x the 8 MiB result; block by block the peak stays under 3x."""
    rows = 2**19
    path = tmp_path / "big.pcd"
    header = (f"VERSION .7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\nWIDTH {rows}\n"
              f"HEIGHT 1\nPOINTS {rows}\nDATA ascii\n")
    path.write_bytes(header.encode() + b"1.5 2.5 -0.5 0.25\n" * (rows - 1) + b"3 4 5 0.5\n")
    points, peak = traced_peak(lambda: read_points(path))
    assert points.shape == (rows, 4) and points.dtype == np.float32
    np.testing.assert_array_equal(points[0], [1.5, 2.5, -0.5, 0.25])
    np.testing.assert_array_equal(points[-1], [3, 4, 5, 0.5])
    assert peak < 3 * points.nbytes, peak / points.nbytes


def test_ascii_pcd_too_short_for_its_points_sets_aside_no_more_rows_than_it_holds(tmp_path: Path) -> None:
    """A 170-byte ASCII .pcd whose header said POINTS 16777216 had the reader set aside 256 MiB for them before it
    found one row: a number takes a character at least, and a space or a line break after it."""
    path = tmp_path / "short.pcd"
    header = (f"VERSION .7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
              f"WIDTH {MAX_FRAME_POINTS}\nHEIGHT 1\nPOINTS {MAX_FRAME_POINTS}\nDATA ascii\n")
    path.write_bytes(header.encode() + b"1 2 3 4\n")
    text, peak = traced_peak(lambda: one_line_error(lambda: read_points(path)))
    assert text == f"point file {str(path)!r}: 1 ASCII data rows, but POINTS is {MAX_FRAME_POINTS} (truncated)"
    assert peak < 4 * 2**20, peak  # the block read (1 MiB) and its text
    exact = tmp_path / "exact.pcd"  # as short as rows can be: one-character numbers, the last line break left out
    exact.write_bytes(header.replace(str(MAX_FRAME_POINTS), "3").encode() + b"1 2 3 4\n5 6 7 8\n9 1 2 3")
    np.testing.assert_array_equal(read_points(exact), [[1, 2, 3, 4], [5, 6, 7, 8], [9, 1, 2, 3]])


@pytest.mark.parametrize(("tail", "said"), [
    (b"hello", "text on line 15 after its POINTS 3 rows: 'hello'"),
    (b"\n  \n5 6 7 8", "text on line 17 after its POINTS 3 rows: '5 6 7 8'"),  # a row more, no break after it
    (b"5 6 7 8\n", "text on line 15 after its POINTS 3 rows: '5 6 7 8'"),  # and with one, as it was refused
    (b"x" * 300, "text on line 15 after its POINTS 3 rows: '" + "x" * 77 + "...'"),
    (b"\0" * 300, "text on line 15 after its POINTS 3 rows: '" + r"\x00" * 19 + "\\...'"),
], ids=["word", "row", "row-and-break", "long", "zeros"])
def test_ascii_pcd_text_after_its_points_rows_is_named_as_such(tmp_path: Path, tail: bytes, said: str) -> None:
    """Text after the last of a .pcd's POINTS rows, without a line break after it, was "more ASCII data rows than
    POINTS 3" (naming no line, as a row more with its line break was) or, past 192 bytes, a row 4 of 3 that "runs past
    192 bytes without a line break": it is named as what it is, by its line, and quoted. A bad row among the POINTS
    rows before it is named first, as the file has them."""
    header = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 3, "ascii")
    path = tmp_path / "tail.pcd"
    path.write_bytes(header + b"1 2 3 4\n5 6 7 8\n9 1 2 3\n" + tail)
    assert header.count(b"\n") == 11  # the rows on lines 12 to 14
    assert one_line_error(lambda: read_points(path)) == f"point file {str(path)!r}: {said}"
    path.write_bytes(header + b"1 2 3 4\n5 6 7\n9 1 2 3\n" + tail)
    assert one_line_error(lambda: read_points(path)) == (f"point file {str(path)!r}: bad ASCII data on line 13 (row 2 "
                                                         "of 3 after DATA): '5 6 7' is not 4 numbers")


def test_ascii_pcd_errors_name_the_row_in_the_whole_data_section(tmp_path: Path) -> None:
    """Rows are parsed in blocks of ~50 k; a bad row far past the first block is named by its line in the file and
    its place in the data (the first row after DATA is row 1), not in its block, whatever is wrong with it (a value,
    too few or too many values; the first row alone differing in count)."""
    from pointpillars_trt.pcd import _PCD_ASCII_BLOCK

    rows = 200_000
    lines = [f"{i % 97}.5 -{i % 13}.25 0.5 0.125" for i in range(rows)]
    assert len("\n".join(lines[:150_000])) > 2 * _PCD_ASCII_BLOCK  # the bad rows lie beyond the first blocks
    header = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", rows, "ascii")
    path = tmp_path / "deep.pcd"
    for row, bad in ((150_000, "1.5 abc 0.5 0.125"), (150_001, "1.5 2.5 0.5"), (rows, "1 2 3 4 5"), (1, "1 2 3"),
                     (2, "1_0 2 3 4")):
        body = lines.copy()
        body[row - 1] = bad
        path.write_bytes(header + ("\n".join(body) + "\n").encode())
        line = header.count(b"\n") + row
        one_line_error(lambda: read_points(path), "deep.pcd", f"bad ASCII data on line {line} (row {row} of {rows} "
                       f"after DATA): '{bad}' is not 4 numbers")


@pytest.mark.parametrize(("bad", "shown"), [
    (b"1 2 \xff\xfe 0.5", r"1 2 \xff\xfe 0.5"),  # bytes no text encoding reads
    (b"1 2 caf\xc3\xa9 0.5", r"1 2 caf\xc3\xa9 0.5"),  # a UTF-8 letter: its bytes, as the file holds them
    (b"1 2 \x1b[31mred\x1b[0m 0.5", r"1 2 \x1b[31mred\x1b[0m 0.5"),  # a terminal's colour codes
    (b"1 2 " + b"\xff" * 1000 + b" 0.5", "1 2 " + r"\xff" * 18 + "\\..."),  # bounded: 80 characters
], ids=["not-utf8", "utf8-letter", "escape-codes", "long"])
def test_ascii_pcd_bad_row_is_named_by_its_line_and_escaped_bytes(tmp_path: Path, bad: bytes, shown: str) -> None:
    """A bad ASCII row was quoted as decoded with U+FFFD for each byte past ASCII (a UTF-8 letter two of them), and
    named by its row among the rows that are not blank, which no editor shows: it is named by its line in the file
    (blank lines and the header counted) and quoted with each such byte as \\xNN, bounded in length."""
    header = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 3, "ascii")
    path = tmp_path / "bad.pcd"
    for breaks in (b"\n", b"\r\n"):
        path.write_bytes(header + breaks.join([b"1 2 3 0.5", b"", b"  ", bad, b"1 2 3 0.5", b""]))
        text = one_line_error(lambda: read_points(path), "bad.pcd")
        line = header.count(b"\n") + 4
        assert text == (f"point file {str(path)!r}: bad ASCII data on line {line} (row 2 of 3 after DATA): '{shown}' "
                        "is not 4 numbers")
        assert "\ufffd" not in text and len(text) < len(str(path)) + 200


LINE_BREAKS = {"LF": b"\n", "CRLF": b"\r\n", "CR": b"\r"}


@pytest.mark.parametrize("breaks", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
def test_ascii_pcd_reads_alike_whatever_its_lines_end_in(tmp_path: Path, breaks: bytes) -> None:
    """An ASCII .pcd whose lines end in CR alone (old Mac text) was refused: its header, read up to each LF, had no
    DATA line, and its data, cut into blocks at the last LF, ran "past 192 bytes without a line break". Over several
    1 MiB blocks, one ending between a CRLF's two bytes, a file of LF, CRLF or CR lines reads as NumPy wrote it, and
    a bad row past the first blocks is named by its line in the file, each line break one line as an editor shows."""
    from pointpillars_trt.pcd import _PCD_ASCII_BLOCK

    rows = 4 * _PCD_ASCII_BLOCK // 16  # 16 bytes a row, 17 with CRLF: four blocks and more
    points = np.random.default_rng(5).integers(0, 100, (rows, 4)) / 10  # written 'd.d': 3 characters each
    header = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", rows, "ascii").replace(b"\n", breaks)
    path = tmp_path / "breaks.pcd"
    with open(path, "wb") as f:
        f.write(header)
        np.savetxt(f, points, fmt="%.1f", newline=breaks.decode())
    data = path.read_bytes()[len(header):]
    if breaks == b"\r\n":  # 2**20 + 1 = 17 * 61681: the first block read ends after a row's CR, before its LF
        assert data[_PCD_ASCII_BLOCK - 1:_PCD_ASCII_BLOCK + 1] == b"\r\n"
    np.testing.assert_array_equal(read_points(path), points.astype(np.float32))
    bad = rows * 5 // 8  # in the third block
    lines = data.split(breaks)
    lines[bad - 1] = b"1.5 abc 0.5 0.1"
    path.write_bytes(header + breaks.join(lines))
    line = header.count(breaks) + bad
    text = one_line_error(lambda: read_points(path))
    assert text == (f"point file {str(path)!r}: bad ASCII data on line {line} (row {bad} of {rows} after DATA): "
                    "'1.5 abc 0.5 0.1' is not 4 numbers")


@pytest.mark.parametrize("breaks", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
@pytest.mark.parametrize("control", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f"])
def test_ascii_pcd_row_holding_another_control_character_is_one_bad_row(tmp_path: Path, breaks: bytes,
                                                                         control: str) -> None:
    """A vertical tab, a form feed or \\x1c to \\x1e broke an ASCII row in two (str.splitlines' line breaks, which no
    editor's line numbers count), and NumPy's parser took each of them and \\x1f for a space between numbers: rows
    break at LF, CRLF and CR alone, and numbers are separated by spaces and tabs, so a row holding another control
    character anywhere (between two rows' numbers, inside a number, after the last, alone) is one bad row, named by
    its line and quoted whole."""
    header = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 3, "ascii").replace(b"\n", breaks)
    path = tmp_path / "control.pcd"
    for bad in (f"4 5 6 0.5{control}7 8 9 0.5", f"4 5{control}6 0.5", f"4 5 6 0.5{control}", control):
        path.write_bytes(header + breaks.join([b"1 2 3 0.5", b" \t ", bad.encode(), b"1 2 3 0.5", b""]))
        shown = bad.replace(control, f"\\x{ord(control):02x}")
        assert one_line_error(lambda: read_points(path)) == (f"point file {str(path)!r}: bad ASCII data on line 14 "
                                                             f"(row 2 of 3 after DATA): '{shown}' is not 4 numbers")
    path.write_bytes(header + breaks.join([b"1 2 3 0.5", b" \t ", b"4\t5 6  0.5 ", b"1 2 3 0.5", b""]))
    np.testing.assert_array_equal(read_points(path), [[1, 2, 3, 0.5], [4, 5, 6, 0.5], [1, 2, 3, 0.5]])


PCD_HEADER_LINES = [b"# .PCD v0.7", b"VERSION 0.7", b"FIELDS x y z intensity", b"SIZE 4 4 4 4", b"TYPE F F F F",
                    b"COUNT 1 1 1 1", b"WIDTH 1", b"HEIGHT 1", b"VIEWPOINT 0 0 0 1 0 0 0", b"POINTS 1", b"DATA ascii"]


@pytest.mark.parametrize(("line", "bad", "said"), [
    (2, b"VERSI\xc3\x96N 0.7", r" is not a PCD file: unexpected header line 2: 'VERSI\xc3\x96N 0.7'"),
    (2, b"\x1b[2J\xff\xfe", r" is not a PCD file: unexpected header line 2: '\x1b[2J\xff\xfe'"),
    (7, b"WIDTH 1\xff", r": header WIDTH '1\xff' on line 7 is not a count"),
    (11, b"DATA asc\xc3\xafi", r": DATA 'asc\xc3\xafi' on line 11; expected ascii, binary or binary_compressed"),
    (5, b"TYPE F F F \xc6", r": field 'intensity' has TYPE '\xc6' on line 5, SIZE '4' on line 4; expected F 4/8, I or "
                            "U 1/2/4/8"),
    (6, b"COUNT 1 1 1 \xb9", r": field 'intensity' has COUNT '\xb9' on line 6, not a count from 1 to 4096"),
    (3, b"FIELDS x y z int\xc3\xa9nsit\xc3\xa9", r": FIELDS 'x y z int\xc3\xa9nsit\xc3\xa9' on line 3 lack intensity "
                                               "(or i or reflectance)"),
    (3, b"FIELDS x y \xff \xff", r": FIELDS 'x y \xff \xff' on line 3 repeats a name"),
    (9, b"VIEWPOINT 0 0 0 1 0 0 \xd9\xa0", r": header VIEWPOINT '0 0 0 1 0 0 \xd9\xa0' on line 9 is not 7 numbers (tx "
                                          "ty tz qw qx qy qz: the sensor's position and orientation)"),
    (8, b"WIDTH 1", ": header key WIDTH appears twice (lines 7 and 8)"),
], ids=["key-utf8", "key-escape-codes", "width", "data", "type", "count", "fields-lack", "fields-repeat", "viewpoint",
        "twice"])
def test_pcd_bad_header_line_is_named_by_its_line_and_escaped_bytes(tmp_path: Path, line: int, bad: bytes,
                                                                    said: str) -> None:
    """A header line holding a byte past ASCII was quoted with U+FFFD for each such byte (two for a UTF-8 letter),
    and an unknown one was not named by its line: each is quoted as the file holds it, each such byte as \\xNN,
    and named by its line in the file."""
    lines = PCD_HEADER_LINES.copy()
    lines[line - 1] = bad
    path = tmp_path / "head.pcd"
    path.write_bytes(b"\n".join(lines) + b"\n1 2 3 0.5\n")
    text = one_line_error(lambda: read_points(path))
    assert text == f"point file {str(path)!r}{said}"
    assert "\ufffd" not in text


@pytest.mark.parametrize("breaks", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
@pytest.mark.parametrize("control", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x00", "\x1b", "\x7f"])
def test_pcd_header_line_holding_a_control_character_is_a_bad_line(tmp_path: Path, breaks: bytes,
                                                                     control: str) -> None:
    """Header lines were split into key and values by Python's str.split, which takes a vertical tab, a form feed
    and \\x1c to \\x1f for spaces: 'WIDTH\\x0c2' read as WIDTH 2 and 'FIELDS x y\\x0bz intensity' as four
    fields. Spaces and tabs separate a header line's values, as they do an ASCII row's numbers: a line holding
    another control character is a bad header line, named by its line and quoted; a comment may hold one."""
    shown = f"\\x{ord(control):02x}"
    path = tmp_path / "control.pcd"
    for line, bad, said in [
        (7, f"WIDTH{control}1", f" is not a PCD file: unexpected header line 7: 'WIDTH{shown}1'"),
        (7, f"WIDTH 1{control}", f": bad header line 7: 'WIDTH 1{shown}' holds a control character; spaces and tabs "
                                 "separate a header line's values"),
        (3, f"FIELDS x y{control}z intensity", f": bad header line 3: 'FIELDS x y{shown}z intensity' holds a control "
                                               "character; spaces and tabs separate a header line's values"),
        (5, control, f" is not a PCD file: unexpected header line 5: '{shown}'"),
    ]:
        lines = PCD_HEADER_LINES.copy()
        lines[line - 1] = bad.encode()
        path.write_bytes(breaks.join(lines) + breaks + b"1 2 3 0.5" + breaks)
        assert one_line_error(lambda: read_points(path)) == f"point file {str(path)!r}{said}"
    lines = PCD_HEADER_LINES.copy()
    lines[0], lines[2], lines[6] = f"# made{control}by hand".encode(), b"FIELDS\tx y \t z  intensity\t", b" WIDTH\t1"
    path.write_bytes(breaks.join(lines) + breaks + b"1 2 3 0.5" + breaks)
    np.testing.assert_array_equal(read_points(path), [[1, 2, 3, 0.5]])


def test_pcd_fields_named_alike_but_for_their_letters_past_ascii_are_two_fields(tmp_path: Path) -> None:
    """Two field names that differ only in a UTF-8 letter were both read as the same name (each byte past ASCII
    one U+FFFD) and the file refused as repeating a name."""
    lines = PCD_HEADER_LINES.copy()
    lines[2:6] = [b"FIELDS x y z intensity h\xc3\xb6he h\xc3\xa4he", b"SIZE 4 4 4 4 4 4", b"TYPE F F F F F F",
                  b"COUNT 1 1 1 1 1 1"]
    path = tmp_path / "names.pcd"
    path.write_bytes(b"\n".join(lines) + b"\n1 2 3 0.5 7 8\n")
    np.testing.assert_array_equal(read_points(path), [[1, 2, 3, 0.5]])


@pytest.mark.parametrize("breaks", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
def test_pcd_header_lines_may_end_in_cr_alone(tmp_path: Path, breaks: bytes) -> None:
    """A .pcd header whose lines end in CR alone was read up to a LF it does not have: "the header has no DATA line".
    Its lines may end in LF, CRLF or CR alone; a bad one is named by its line whatever they end in, and binary data
    after them is the file's from its first byte, whatever its first bytes are (a LF after a DATA line ending in CR
    alone is the data's, not a CRLF's)."""
    table = np.array([[1, 2, 3, 0.5], [4, 5, 6, 0.25]], np.float32)
    table.view(np.uint8)[0, :5] = [0x0A, 0x0D, 0x0A, 0x3F, 0x0D]  # x's bytes LF CR LF '?', y's low byte CR
    lines = PCD_HEADER_LINES.copy()
    lines[6], lines[9], lines[10] = b"WIDTH 2", b"POINTS 2", b"DATA binary"
    path = tmp_path / "breaks.pcd"
    path.write_bytes(breaks.join(lines) + breaks + table.tobytes())
    np.testing.assert_array_equal(read_points(path), table)
    lines[6] = b"WIDTH 2\xff"
    path.write_bytes(breaks.join(lines) + breaks + table.tobytes())
    assert one_line_error(lambda: read_points(path)) == (f"point file {str(path)!r}: header WIDTH '2\\xff' on line 7 "
                                                         "is not a count")


@pytest.mark.parametrize("rows", LINE_BREAKS.values(), ids=[f"data-{name}" for name in LINE_BREAKS])
@pytest.mark.parametrize("data_line", LINE_BREAKS.values(), ids=[f"DATA-{name}" for name in LINE_BREAKS])
@pytest.mark.parametrize("header", LINE_BREAKS.values(), ids=[f"header-{name}" for name in LINE_BREAKS])
def test_ascii_pcd_lines_are_numbered_as_an_editor_does_whatever_mix_of_breaks_they_end_in(
        tmp_path: Path, header: bytes, data_line: bytes, rows: bytes) -> None:
    """In a file whose header lines end in CR alone, a DATA line ending in CRLF left its LF to the data (binary data
    may start with that byte), where it was counted as a line of its own: a bad row was named one line past its own.
    Each LF, CRLF or CR alone ends one line, in the header and the data, whatever mix of them a file holds."""
    lines = PCD_HEADER_LINES.copy()
    lines[6], lines[9] = b"WIDTH 3", b"POINTS 3"
    path = tmp_path / "mixed.pcd"
    path.write_bytes(header.join(lines[:-1]) + header + lines[-1] + data_line
                     + rows.join([b"1 2 3 0.5", b"", b"4 5 6", b"1 2 3 0.5", b""]))
    assert one_line_error(lambda: read_points(path)) == (f"point file {str(path)!r}: bad ASCII data on line 14 (row 2 "
                                                         "of 3 after DATA): '4 5 6' is not 4 numbers")


def test_the_intensity_and_layout_checks_agree_with_a_plain_computation_on_random_frames() -> None:
    """The checks' quick paths (no copies when every intensity is finite / none is negative) decide as
    the plain definitions do, on frames with NaN, infinities, negative and 0-255 intensities: 8-bit when
    the finite intensities lie in [0, 255] with one above 1.5; never 5 values a point while no
    "intensity" is negative."""
    from pointpillars_trt.point_layout import misread_row_length

    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(0, 3000)) // 5 * 5
        pts = rng.normal(0, 20, (n, 4)).astype(np.float32)
        pts[:, 3] = rng.choice([rng.uniform(0, 1, n), rng.uniform(0, 255, n), rng.normal(0, 50, n)]).astype(np.float32)
        for value in rng.choice([np.nan, np.inf, -np.inf, -1.0], size=int(rng.integers(0, 3))):
            if n:
                pts[int(rng.integers(0, n)), 3] = value
        finite = pts[:, 3][np.isfinite(pts[:, 3])]
        plain = bool(finite.size) and finite.min() >= 0 and 1.5 < finite.max() <= 255
        assert looks_8bit(pts) == plain, trial
        if not np.any(pts[:, 3] < 0):
            assert misread_row_length(pts.reshape(-1), 4) is None, trial


def test_8bit_mismatch_matches_its_definition_on_random_frames() -> None:
    """intensity_mismatch's one-pass shortcut (largest intensity <= 1.5) against the definition computed directly: the
    finite intensities all in [0, 255] and the largest above 1.5, with NaN and infinities among them."""
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(3000):
        points = rng.uniform(-2, 300, (int(rng.integers(1, 40)), 4)).astype(np.float32)
        points[:, 3] *= np.float32(rng.choice([1 / 300, 1, 0.005, -1]))
        if rng.random() < 0.3:
            points[int(rng.integers(0, len(points))), 3] = rng.choice([np.nan, np.inf, -np.inf])
        finite = points[:, 3][np.isfinite(points[:, 3])]
        expected = bool(finite.size) and bool(finite.min() >= 0) and bool(1.5 < finite.max() <= 255)
        assert looks_8bit(points) == expected, points[:, 3]
        seen.add(expected)
    assert seen == {True, False}


def test_npy_frames_of_five_columns_read_with_point_dim_4(tmp_path: Path) -> None:
    """``point_dim`` is a .bin file's row length; a .npy carries its own: a 5-column model's .npy frame reads whole
    whatever ``point_dim`` says (a run of .npy frames may keep --point-dim 4), while point_dim's own range is
    checked for every file."""
    from pointpillars_trt.pointcloud_io import read_points_into

    rows = np.random.default_rng(3).uniform(0, 1, (10, 5)).astype(np.float32)
    np.save(tmp_path / "f.npy", rows)
    got = read_points_into(tmp_path / "f.npy", lambda n: None, point_dim=4, columns=5)
    assert np.array_equal(got, rows)
    for bad in (3, 65, 4.0, "4", True):
        with pytest.raises(InputError, match="is not an integer from 4 to 64"):
            read_points_into(tmp_path / "f.npy", lambda n: None, point_dim=bad, columns=5)  # type: ignore[arg-type]



@pytest.mark.parametrize("columns", [3, 0, True, 65])
def test_read_points_refuses_columns_no_model_reads(tmp_path: Path, columns: object) -> None:
    """columns 3 gave an (N, 3) array, which every detector then refused with another message."""
    path = tmp_path / "a.bin"
    sample(4).tofile(path)
    one_line_error(lambda: read_points(path, columns=columns), f"columns {columns!r}: expected the model's values a point")

def test_pcd_of_a_point_too_wide_is_refused_at_its_header(tmp_path: Path) -> None:
    """A header of one point of ~16 M values (3,900 fields of COUNT 4096), then ASCII data without a line break:
    its row-length bound grew with the row, and the refusal came after ~50 s and 5.7 GB. Refused by the header."""
    fields = ["x", "y", "z", "intensity"] + [f"a{i}" for i in range(3900)]
    header = (f"VERSION 0.7\nFIELDS {' '.join(fields)}\nSIZE {' '.join(['4'] * len(fields))}\n"
              f"TYPE {' '.join(['F'] * len(fields))}\nCOUNT {' '.join(['1'] * 4 + ['4096'] * 3900)}\n"
              "WIDTH 1\nHEIGHT 1\nPOINTS 1\nDATA ascii\n")
    path = tmp_path / "wide.pcd"
    path.write_bytes(header.encode() + b"0 " * (1 << 20))
    one_line_error(lambda: read_points(path), "a point of 15974404 values (FIELDS times COUNT), more than the limit")


def test_npy_structured_array_is_refused_with_the_resave_that_reads_it(tmp_path: Path) -> None:
    """A structured .npy (as ROS's and pypcd's clouds save) was refused naming its dtype alone: now with the
    re-save of its named fields as columns, which, done as said, reads as the same points."""
    from numpy.lib.recfunctions import structured_to_unstructured

    n = 30
    cloud = np.zeros(n, dtype=[("intensity", "<f4"), ("x", "<f8"), ("y", "<f4"), ("z", "<f4"), ("ring", "<u2")])
    for name, values in zip(("x", "y", "z", "intensity", "ring"), sample(n).T.tolist() + [list(range(n))]):
        cloud[name] = values
    path = tmp_path / "cloud.npy"
    np.save(path, cloud)
    text = one_line_error(lambda: read_points(path), "cloud.npy' holds a structured array, shape (30,); expected "
                          "float32 or float64 (N, 4) columns; its fields ['intensity', 'x', 'y', 'z', 'ring'] hold "
                          "them: re-save them with np.save(path, ")
    fix = text.split(" re-save them with ", 1)[1].split(" (structured_to_unstructured from", 1)[0]
    eval(fix, {"np": np, "structured_to_unstructured": structured_to_unstructured, "path": path})
    expected = np.array([[row["x"], row["y"], row["z"], row["intensity"]] for row in cloud], np.float32)
    np.testing.assert_array_equal(read_points(path), expected)
    np.save(path, cloud[["x", "y", "z", "ring"]])
    one_line_error(lambda: read_points(path), "fields ['x', 'y', 'z', 'ring'] lack intensity (or i or reflectance)")


def test_npy_of_single_sweeps_given_to_a_multi_sweep_model_names_accumulate(tmp_path: Path) -> None:
    np.save(tmp_path / "sweep.npy", sample(10))
    one_line_error(lambda: read_points(tmp_path / "sweep.npy", columns=5), "holds shape (10, 4)",
                   "expected (N, 5) or more columns of x, y, z, intensity, time; single sweeps? ",
                   "a multi-sweep model needs accumulated frames, each point's 5th value its time lag behind the "
                   "key sweep: PointPillars.accumulate builds them")


def test_npz_and_ply_are_refused_with_how_to_convert_them(tmp_path: Path) -> None:
    """An .npz (NumPy's archive) or .ply was refused by its extension alone; now with the conversion, which, for
    the .npz done as said, reads as the same points."""
    points = sample(12)
    np.savez(tmp_path / "frame.npz", points=points)
    text = one_line_error(lambda: read_points(tmp_path / "frame.npz"), "extension '.npz'; supported: .bin, .npy, "
                          ".pcd; save the frame's array from the archive as .npy (np.save(")
    fix = text.split(" as .npy (", 1)[1][:-1].replace("[name]", "['points']")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        eval(fix, {"np": np, "path": tmp_path / "frame.npz"})
    finally:
        os.chdir(cwd)
    np.testing.assert_array_equal(read_points(tmp_path / "frame.npy"), points)
    (tmp_path / "frame.PLY").write_bytes(b"ply\nformat ascii 1.0\nend_header\n")
    one_line_error(lambda: read_points(tmp_path / "frame.PLY"), "extension '.ply'", "convert it to .pcd")


def las_fix(text: str) -> list[str]:
    """The statements of the laspy conversion a .las / .laz refusal names (after "laspy...: ")."""
    recipe = text.split("las = laspy.read(path)", 1)[1]
    return ["las = laspy.read(path)", *recipe[2:].removesuffix(")").split("; ")]


@pytest.mark.parametrize("name", ["frame.las", "FRAME.LAS", "frame.laz"])
def test_las_and_laz_are_refused_with_how_to_convert_them(tmp_path: Path, name: str) -> None:
    """ASPRS LAS (and its compressed LAZ), a lidar exchange format, was refused by its extension alone, where a .ply
    or .npz is told how to convert it; the conversion names laspy (for LAZ, with a backend that reads it)."""
    path = tmp_path / name
    path.write_bytes(b"LASF" + bytes(400))
    text = one_line_error(lambda: read_points(path), f"extension '{path.suffix.lower()}'; supported: .bin, .npy, .pcd; save "
                          "its x, y, z, intensity as a float32 .npy (laspy")
    assert las_fix(text) == ["las = laspy.read(path)", "np.save('frame.npy', np.column_stack([las.x, las.y, las.z, "
                                                       "las.intensity]).astype(np.float32))"], text
    assert ("laspy[lazrs]" in text) == (path.suffix.lower() == ".laz"), text


def test_the_las_conversion_said_gives_the_frame(tmp_path: Path) -> None:
    """The conversion a .las refusal names, run as said on a LAS file of a frame (with laspy installed), reads as
    the frame's points, at LAS's millimetre steps."""
    laspy = pytest.importorskip("laspy")
    points = sample(50)
    points[:, 3] = np.arange(50) * 1000  # LAS intensities: integers 0-65535
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales, header.offsets = np.array([0.001] * 3), np.zeros(3)
    las = laspy.LasData(header)
    las.x, las.y, las.z, las.intensity = points[:, 0], points[:, 1], points[:, 2], points[:, 3].astype(np.uint16)
    las.write(tmp_path / "frame.las")
    text = one_line_error(lambda: read_points(tmp_path / "frame.las"), "laspy")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        scope = {"np": np, "laspy": laspy, "path": tmp_path / "frame.las"}
        for statement in las_fix(text):
            exec(statement, scope)
    finally:
        os.chdir(cwd)
    got = read_points(tmp_path / "frame.npy")
    np.testing.assert_allclose(got[:, :3], points[:, :3], atol=0.0006)
    np.testing.assert_array_equal(got[:, 3], points[:, 3])


def test_bin_that_is_a_ply_file_with_windows_line_ends_is_named_so(tmp_path: Path) -> None:
    """A PLY header ending its lines in \\r\\n was refused as random bytes ("is it a point file?")."""
    path = tmp_path / "cloud.bin"
    path.write_bytes(b"ply\r\nformat binary_little_endian 1.0\r\nelement vertex 100\r\nend_header\r\n"
                     + sample(100).tobytes())
    one_line_error(lambda: read_points(path), "cloud.bin' is a PLY file, not raw float32 values")


def test_big_endian_bin_is_named_so_with_the_conversion_that_reads_it(assets: Path, tmp_path: Path) -> None:
    """A KITTI frame written big-endian was refused as random bytes ("is it a point file?"); now as big-endian
    float32, with the conversion, which, done as said, reads as the frame."""
    frame = np.fromfile(assets / "kitti/training/velodyne_fov/000000.bin", "<f4").reshape(-1, 4)
    path = tmp_path / "be.bin"
    frame.astype(">f4").tofile(path)
    text = one_line_error(lambda: read_points(path), "be.bin' looks like big-endian float32 values")
    eval(text.split("convert it, ", 1)[1], {"np": np, "path": path})
    np.testing.assert_array_equal(read_points(path), frame)
    (tmp_path / "noise.bin").write_bytes(np.random.default_rng(5).bytes(16 * 1000))  # random either way round
    one_line_error(lambda: read_points(tmp_path / "noise.bin"), "does not hold float32 point coordinates")


def lzf_literals(data: bytes) -> bytes:
    """``data`` as an LZF stream of literal runs only (a control byte n - 1, then n bytes, n <= 32): valid LZF that
    any decoder must give back as ``data``."""
    return b"".join(bytes([len(run) - 1]) + run for run in (data[i : i + 32] for i in range(0, len(data), 32)))


def lzf_zeros(count: int) -> bytes:
    """``count`` (>= 1) zero bytes as LZF: one literal zero, then references one byte back (each repeating the
    byte before it) of at most 264 bytes: 3 bytes (7 << 5, the length past 9, the offset 0) or, for 3-8 bytes,
    2 bytes ((length - 2) << 5, offset 0)."""
    stream, left = bytearray(b"\x00\x00"), count - 1
    while left:
        n = min(left, 264)
        if n < 3:  # a reference copies at least 3 bytes: the rest as literals
            stream += bytes([n - 1]) + bytes(n)
        elif n < 9:
            stream += bytes([(n - 2) << 5, 0])
        else:
            stream += bytes([7 << 5, n - 9, 0])
        left -= n
    return bytes(stream)


def test_pcd_binary_compressed_reads_pcls_lzf_planes(tmp_path: Path) -> None:
    """PCL's DATA binary_compressed: the fields as planes (all x, all y, ...), LZF-compressed, behind the
    compressed and the uncompressed size. Encoded here with literal runs and with back references (a plane of
    zeros, each reference overlapping what it writes), the read equals the points, in the model's column order
    (intensity first in the file here), and the same cloud as DATA binary."""
    from pointpillars_trt.pcd import read_pcd

    pts = sample(100)
    pts[:, 3] = 0.0  # a plane of zeros: references
    planes = [pts[:, 3].tobytes(), pts[:, 0].tobytes(), pts[:, 1].tobytes(), pts[:, 2].tobytes()]
    raw = b"".join(planes)
    stream = lzf_zeros(len(planes[0])) + lzf_literals(b"".join(planes[1:]))
    path = tmp_path / "comp.pcd"
    path.write_bytes(pcd_header("intensity x y z", "4 4 4 4", "F F F F", "1 1 1 1", 100, "binary_compressed")
                     + struct.pack("<II", len(stream), len(raw)) + stream)
    np.testing.assert_array_equal(read_pcd(path), pts)
    binary = tmp_path / "binary.pcd"
    binary.write_bytes(pcd_header("intensity x y z", "4 4 4 4", "F F F F", "1 1 1 1", 100, "binary")
                       + pts[:, [3, 0, 1, 2]].tobytes())
    np.testing.assert_array_equal(read_pcd(binary), read_pcd(path))


def test_pcd_binary_compressed_too_short_for_its_size_is_refused_before_inflating(tmp_path: Path) -> None:
    """LZF inflates a byte to at most 88 (a 3-byte reference copies 264 bytes): 10 bytes of stream that say they
    inflate to 64 MiB (4 Mi points) are corrupt, refused before the 64 MiB are set aside and zeroed (a 200-byte file
    made the reader take up to 1 GiB). The stream of all zeros that compresses best inflates."""
    from pointpillars_trt.pcd import read_pcd

    n = 4 * 2**20
    path = tmp_path / "short.pcd"
    path.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", n, "binary_compressed")
                     + struct.pack("<II", 10, 16 * n) + bytes(10))
    _, peak = traced_peak(lambda: one_line_error(lambda: read_points(path), "short.pcd", "binary_compressed data of "
                                                 f"10 bytes cannot inflate to {16 * n} bytes"))
    assert peak < 2**20, peak
    zeros = lzf_zeros(16 * 4096)
    assert 16 * 4096 > 80 * len(zeros)  # near the bound: read, not refused
    path.write_bytes(pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 4096, "binary_compressed")
                     + struct.pack("<II", len(zeros), 16 * 4096) + zeros)
    np.testing.assert_array_equal(read_pcd(path), np.zeros((4096, 4), np.float32))


def test_pcd_binary_compressed_that_is_corrupt_or_cut_is_one_error(tmp_path: Path) -> None:
    pts = sample(8)
    raw = b"".join(pts[:, k].tobytes() for k in range(4))
    stream = lzf_literals(raw)
    head = pcd_header("x y z intensity", "4 4 4 4", "F F F F", "1 1 1 1", 8, "binary_compressed")
    cases = {
        "cut.pcd": (head + struct.pack("<II", len(stream), len(raw)) + stream[:-7],
                    ["binary_compressed data of", "(truncated)"]),
        "sizes.pcd": (head + struct.pack("<I", 3), ["ends before its two sizes"]),
        "short.pcd": (head + struct.pack("<II", len(stream), len(raw) - 4) + stream,
                      [f"{len(raw) - 4} bytes uncompressed", f"POINTS 8 of 16 bytes a point need {len(raw)}"]),
        "backref.pcd": (head + struct.pack("<II", 3, len(raw)) + bytes([0x20, 0x05, 0x00]),  # a reference before the start
                        ["not a valid LZF stream of 128 bytes"]),
        "runs_out.pcd": (head + struct.pack("<II", len(stream) - 33, len(raw)) + stream[:-33],  # inflates to 96 bytes
                         ["not a valid LZF stream of 128 bytes"]),
        # bytes past the data, refused as DATA binary's are (they were read past without a word)
        "joined.pcd": (head + struct.pack("<II", len(stream), len(raw)) + stream + b"garbage",
                       [f"binary_compressed data of {len(stream)} bytes, but the file holds {len(stream) + 7} after "
                        "its header: a size that lies, or two files joined?"]),
    }
    for name, (data, parts) in cases.items():
        (tmp_path / name).write_bytes(data)
        one_line_error(lambda: read_points(tmp_path / name), name, *parts)  # noqa: B023


def test_lzf_references_that_overlap_repeat_their_bytes() -> None:
    """liblzf's format worked by hand: 'ab' as literals, then a reference 2 bytes back of length 5 (it overlaps
    what it writes: 'ababa'), then one 4 bytes back of length 3 ('bab')."""
    from pointpillars_trt.pcd import lzf_decompress

    stream = bytes([1]) + b"ab" + bytes([(5 - 2) << 5, 2 - 1]) + bytes([(3 - 2) << 5, 4 - 1])
    assert lzf_decompress(stream, 10, "x") == b"abababa" + b"bab"


@pytest.mark.parametrize("padding_planes", [False, True])
def test_pcd_binary_compressed_with_padding_fields_reads_either_layout(tmp_path: Path, padding_planes: bool) -> None:
    """A ``_`` padding field (4 bytes here) has a plane of its own in the compressed data or none, as writers
    differ: the uncompressed size tells them apart, and both read as the points."""
    from pointpillars_trt.pcd import read_pcd

    pts = sample(5)
    planes = [pts[:, 0].tobytes(), pts[:, 1].tobytes(), pts[:, 2].tobytes()] \
        + ([bytes(range(20))] if padding_planes else []) + [pts[:, 3].tobytes()]
    raw = b"".join(planes)
    stream = lzf_literals(raw)
    path = tmp_path / "padded.pcd"
    path.write_bytes(pcd_header("x y z _ intensity", "4 4 4 4 4", "F F F U F", "1 1 1 1 1", 5, "binary_compressed")
                     + struct.pack("<II", len(stream), len(raw)) + stream)
    np.testing.assert_array_equal(read_pcd(path), pts)


def test_pcd_binary_compressed_whose_points_inflate_past_the_binary_limit_is_refused_before_inflating(
        tmp_path: Path) -> None:
    """10,000,000 points of 256 bytes (a wide padding field) say 2.56 GB of data: refused by the binary data's limit
    before a buffer of that size is made for the inflated data (it was allocated, then the stream found short)."""
    n, row = 10_000_000, 256
    path = tmp_path / "wide.pcd"
    path.write_bytes(pcd_header("x y z intensity _", "4 4 4 4 4", "F F F F U", "1 1 1 1 60", n, "binary_compressed")
                     + struct.pack("<II", 3, n * row) + bytes([0, 0, 0]))
    one_line_error(lambda: read_points(path), "wide.pcd", f"POINTS {n} x {row} bytes a point is more than the limit of")
