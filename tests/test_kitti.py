"""KITTI I/O: .bin frames, calib, label_2 lines both ways."""

from __future__ import annotations

import math
import os
import re
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import InputError
from pointpillars_trt.kitti import (
    Calibration,
    calib_for_frame,
    detections_to_kitti_lines,
    finite_detections,
    image_path_for_frame,
    image_shape_for_frame,
    kitti_label_to_lidar_boxes,
    normalize_heading,
    parse_label_lines,
    read_calibration,
    read_label_file,
    read_png_size,
    write_velodyne_bin,
)
from pointpillars_trt.pointcloud_io import read_bin

# (path, bytes, points) as listed in the assets README.
FRAMES = [
    ("kitti/training/velodyne_reduced/000134.bin", 305_552, 19_097),
    ("kitti/testing/velodyne_reduced/000002.bin", 283_104, 17_694),
    ("kitti/training/velodyne/000000.bin", 1_846_144, 115_384),
    ("kitti/training/velodyne/000001.bin", 1_924_288, 120_268),
    ("kitti/training/velodyne/000002.bin", 2_030_256, 126_891),
]
CALIBS = [
    "kitti/training/calib/000134.txt",
    "kitti/training/calib/000000.txt",
    "kitti/training/calib/000001.txt",
    "kitti/testing/calib/000002.txt",
]


# --------------------------------------------------------------------------- helpers (oracles)

def parse_calib_by_hand(path: Path) -> dict[str, np.ndarray]:
    out = {}
    for line in path.read_text().splitlines():
        if ":" in line:
            key, values = line.split(":", 1)
            out[key] = np.array(values.split(), dtype=np.float64)
    return out


def velo_to_rect_by_hand(calib: dict[str, np.ndarray]) -> np.ndarray:
    r0 = np.eye(4)
    r0[:3, :3] = calib["R0_rect"].reshape(3, 3)
    tr = np.vstack([calib["Tr_velo_to_cam"].reshape(3, 4), [0, 0, 0, 1]])
    return r0 @ tr


def camera_corners_by_hand(x: float, y: float, z: float, l: float, h: float, w: float, ry: float) -> np.ndarray:
    """The KITTI devkit's corners: rotate (+-l/2, 0 or -h, +-w/2) about camera y, then shift."""
    rot = np.array([[math.cos(ry), 0, math.sin(ry)], [0, 1, 0], [-math.sin(ry), 0, math.cos(ry)]])
    out = []
    for sx in (-0.5, 0.5):
        for top in (0, 1):
            for sz in (-0.5, 0.5):
                out.append(rot @ np.array([sx * l, -top * h, sz * w]) + [x, y, z])
    return np.array(out)


def lidar_corners_by_hand(box: np.ndarray) -> np.ndarray:
    x, y, z, dx, dy, dz, heading = (float(v) for v in box)
    c, s = math.cos(heading), math.sin(heading)
    out = []
    for sx in (-0.5, 0.5):
        for sy in (-0.5, 0.5):
            for sz in (-0.5, 0.5):
                lx, ly = sx * dx, sy * dy
                out.append([x + c * lx - s * ly, y + s * lx + c * ly, z + sz * dz])
    return np.array(out)


def same_point_sets(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    """Every point of a has a partner in b within tol, one to one."""
    dist = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1)
    return bool((dist.min(axis=1) <= tol).all() and len(set(dist.argmin(axis=1))) == len(a))


def wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


def random_boxes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.column_stack([
        rng.uniform(2, 69, n), rng.uniform(-39, 39, n), rng.uniform(-2, 0.5, n),
        rng.uniform(0.5, 5, n), rng.uniform(0.4, 2, n), rng.uniform(1, 2, n),
        rng.uniform(0.785, 0.785 + 2 * math.pi, n),
    ])


# --------------------------------------------------------------------------- velodyne .bin

@pytest.mark.parametrize("rel, size, count", FRAMES)
def test_read_bin_of_real_kitti_frames(assets: Path, rel: str, size: int, count: int) -> None:
    path = assets / rel
    assert path.stat().st_size == size == count * 16
    pts = read_bin(path)
    assert pts.shape == (count, 4) and pts.dtype == np.float32
    raw = np.frombuffer(path.read_bytes(), dtype="<f4").reshape(count, 4)
    np.testing.assert_array_equal(pts, raw)
    assert np.isfinite(pts).all()
    assert pts[:, 3].min() >= 0.0 and pts[:, 3].max() <= 0.99 + 1e-6


def test_read_bin_of_kitti_frames_size_not_multiple_of_16(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 17)
    with pytest.raises(InputError) as err:
        read_bin(bad)
    msg = str(err.value)
    assert str(bad) in msg and "17 bytes" in msg and "multiple of 16" in msg and "\n" not in msg


def test_read_bin_of_kitti_frames_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_bin(tmp_path / "nope.bin")


def test_read_bin_of_kitti_frames_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        read_bin(tmp_path)


def test_read_bin_of_kitti_frames_empty_file_is_an_empty_frame(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    pts = read_bin(empty)
    assert pts.shape == (0, 4) and pts.dtype == np.float32


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_read_bin_of_kitti_frames_unreadable(tmp_path: Path) -> None:
    locked = tmp_path / "locked.bin"
    locked.write_bytes(b"\0" * 16)
    locked.chmod(0)
    with pytest.raises(InputError, match="cannot be read"):
        read_bin(locked)


def test_velodyne_bin_values_pass_through_unvalidated(tmp_path: Path) -> None:
    pts = np.array([[1, 2, 3, 0.5], [np.nan, 0, np.inf, -1]], dtype=np.float32)
    path = tmp_path / "x.bin"
    write_velodyne_bin(pts, path)
    np.testing.assert_array_equal(read_bin(path), pts)
    assert read_bin(path).flags.writeable  # a copy the caller owns, not a view of the bytes
    assert path.read_bytes() == pts.astype("<f4").tobytes()


def test_write_velodyne_bin_rejects_wrong_shape(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"\(N, 4\)"):
        write_velodyne_bin(np.zeros((3, 3)), tmp_path / "x.bin")


# --------------------------------------------------------------------------- calibration

@pytest.mark.parametrize("rel", CALIBS)
def test_read_calibration_matches_hand_parse(assets: Path, rel: str) -> None:
    calib = read_calibration(assets / rel)
    hand = parse_calib_by_hand(assets / rel)
    np.testing.assert_array_equal(calib.P2, hand["P2"].reshape(3, 4))
    np.testing.assert_array_equal(calib.R0_rect, hand["R0_rect"].reshape(3, 3))
    np.testing.assert_array_equal(calib.Tr_velo_to_cam, hand["Tr_velo_to_cam"].reshape(3, 4))
    np.testing.assert_allclose(calib.velo_to_rect, velo_to_rect_by_hand(hand), rtol=0, atol=1e-12)


#: The line breaks of text files (old Mac text ends its lines in CR alone), and what str.splitlines broke lines at
#: besides them, which no editor's line numbers count: a vertical tab, a form feed, \x1c to \x1e, NEL, U+2028/9.
LINE_BREAKS = {"LF": "\n", "CRLF": "\r\n", "CR": "\r"}
NOT_LINE_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("breaks", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
@pytest.mark.parametrize("control", NOT_LINE_BREAKS[:5], ids=[f"U+{ord(c):04X}" for c in NOT_LINE_BREAKS[:5]])
def test_a_calib_files_lines_break_at_lf_crlf_and_cr_alone(assets: Path, tmp_path: Path, breaks: str,
                                                           control: str) -> None:
    """A calib file (ASCII) reads alike whatever its lines end in; a control character inside a line broke it in two
    (str.splitlines), so a P2 line holding R0_rect's after a form feed read as two keys' lines: it is one line, P2's,
    whose values are not numbers."""
    good = (assets / CALIBS[0]).read_text().splitlines()
    path = tmp_path / "calib.txt"
    path.write_bytes(breaks.join(good).encode() + breaks.encode())
    np.testing.assert_array_equal(read_calibration(path).velo_to_rect, read_calibration(assets / CALIBS[0]).velo_to_rect)
    p2 = next(i for i, line in enumerate(good) if line.startswith("P2"))
    r0 = next(i for i, line in enumerate(good) if line.startswith("R0_rect"))
    joined = [line for i, line in enumerate(good) if i != r0]
    joined[p2] = good[p2] + control + good[r0]
    path.write_bytes(breaks.join(joined).encode() + breaks.encode())
    with pytest.raises(InputError, match=r"calib\.txt': key P2 has a non-numeric value$"):
        read_calibration(path)


def test_calibration_transforms_are_inverse(assets: Path) -> None:
    calib = read_calibration(assets / CALIBS[0])
    hand = parse_calib_by_hand(assets / CALIBS[0])
    pts = np.random.default_rng(0).uniform([1, -20, -2], [60, 20, 1], (50, 3))
    rect = calib.lidar_to_rect(pts)
    m = velo_to_rect_by_hand(hand)
    for p, r in zip(pts, rect):
        np.testing.assert_allclose(r, (m @ np.append(p, 1))[:3], atol=1e-9)
    np.testing.assert_allclose(calib.rect_to_lidar(rect), pts, atol=1e-9)


def test_read_calibration_errors(tmp_path: Path, assets: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_calibration(tmp_path / "none.txt")
    good = (assets / CALIBS[0]).read_text().splitlines()
    no_r0 = tmp_path / "no_r0.txt"
    no_r0.write_text("\n".join(line for line in good if not line.startswith("R0_rect")))
    with pytest.raises(InputError, match=r"no_r0\.txt': key R0_rect is missing"):
        read_calibration(no_r0)
    for name, text in (("empty.txt", ""), ("blank.txt", "\n \n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(InputError, match=rf"{name}': the file is empty \(a copy that failed\?\); it should hold "
                                             "KITTI's P2, R0_rect and Tr_velo_to_cam"):
            read_calibration(tmp_path / name)
    short = tmp_path / "short.txt"
    short.write_text("\n".join(line.rsplit(" ", 1)[0] if line.startswith("P2") else line for line in good))
    with pytest.raises(InputError, match=r"short\.txt': key P2 has 11 values, expected 12"):
        read_calibration(short)
    short.write_text("\n".join("P2: 7" if line.startswith("P2") else line for line in good))
    with pytest.raises(InputError, match=r"short\.txt': key P2 has 1 value, expected 12"):
        read_calibration(short)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(line.replace("P2: 7", "P2: x") for line in good))
    with pytest.raises(InputError, match=r"text\.txt': key P2 has a non-numeric value"):
        read_calibration(text)
    again = tmp_path / "again.txt"  # the same bad bytes under another name: that name is the one said
    again.write_bytes(text.read_bytes())
    with pytest.raises(InputError, match=r"again\.txt': key P2 has a non-numeric value"):
        read_calibration(again)
    joined = tmp_path / "joined.txt"  # two calib files in one: whose P2 is this camera's is unknown
    joined.write_text("\n".join(good + [line.replace("P2: 7", "P2: 8") for line in good if line.startswith("P2")]))
    with pytest.raises(InputError, match=r"joined\.txt': key P2 is given twice \(two files joined\?\)"):
        read_calibration(joined)
    for name, data in (("utf16.txt", "\n".join(good).encode("utf-16")), ("random.txt", bytes(range(256)) * 8)):
        (tmp_path / name).write_bytes(data)  # not "key P2 is missing": what the file is
        with pytest.raises(InputError, match=rf"{name}': not a text file \(NUL or non-ASCII bytes: binary data, or "
                                             r"text in UTF-16\); a KITTI calib file is ASCII lines"):
            read_calibration(tmp_path / name)


def test_a_label_or_other_text_given_as_a_calib_file_is_said_to_have_no_calib_line(tmp_path: Path) -> None:
    """infer --calib given the label_2 folder failed every frame with "key P2 is missing", naming no cause."""
    label = tmp_path / "000000.txt"
    label.write_text("Pedestrian 0.00 0 -0.20 712.40 143.00 810.73 307.92 1.89 0.48 1.20 1.84 1.47 8.41 0.01\n")
    with pytest.raises(InputError) as err:
        read_calibration(label)
    assert str(err.value) == (f"calibration file {str(label)!r}: no 'key: values' line (a first line of 15 fields, "
                              "as a label: a label file?); a KITTI calib file holds lines such as 'P2: ...', "
                              "'R0_rect: ...', 'Tr_velo_to_cam: ...': give the frame's own KITTI calib file")
    notes = tmp_path / "notes.txt"
    notes.write_text("calibrated on the 3rd\n")
    with pytest.raises(InputError, match=r"notes\.txt': no 'key: values' line; a KITTI calib file holds"):
        read_calibration(notes)


def test_calibrations_with_the_same_bytes_share_read_only_matrices(assets: Path, tmp_path: Path) -> None:
    """A dataset's calib files repeat a few calibrations: the second file with known bytes gives the first's
    matrices (not parsed again), which no caller can change for the others; other bytes give their own."""
    first = read_calibration(assets / CALIBS[0])
    copy = tmp_path / "copy.txt"
    copy.write_bytes((assets / CALIBS[0]).read_bytes())
    second = read_calibration(copy)
    assert second.P2 is first.P2 and second.Tr_velo_to_cam is first.Tr_velo_to_cam
    for matrix in (first.P2, first.R0_rect, first.Tr_velo_to_cam):
        with pytest.raises(ValueError, match="read-only"):
            matrix[0, 0] = 0.0
    moved = tmp_path / "moved.txt"
    moved.write_text((assets / CALIBS[0]).read_text().replace("P2: 7", "P2: 8", 1))
    other = read_calibration(moved)
    assert other.P2[0, 0] == first.P2[0, 0] + 100 and np.array_equal(other.R0_rect, first.R0_rect)


# --------------------------------------------------------------------------- label_2 lines

@pytest.fixture(scope="module")
def calib134(assets: Path) -> Calibration:
    return read_calibration(assets / "kitti/training/calib/000134.txt")



def test_kitti_lines_take_an_image_shape_as_an_array_or_whole_floats(calib134: Calibration) -> None:
    boxes, scores, names = np.array([[10, 0, -1, 4, 1.8, 1.5, 0.3]]), [0.9], ["Car"]
    expected = detections_to_kitti_lines(boxes, scores, names, calib134, (375, 1242)).lines
    assert expected
    for shape in (np.array([375, 1242]), (375.0, 1242.0), [np.int64(375), np.int32(1242)]):
        assert detections_to_kitti_lines(boxes, scores, names, calib134, shape).lines == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "said"), [
    ({"image_shape": (375, 1242, 3)}, "image shape (375, 1242, 3) is not a (height, width) of positive integers"),
    ({"image_shape": (float("nan"), 1242)}, "image shape (nan, 1242) is not a (height, width)"),
    ({"image_shape": (True, True)}, "image shape (True, True) is not a (height, width)"),
    ({"image_shape": (375, 10**400)}, "is not a (height, width) of positive integers (pixels, at most 2147483647"),
    ({"image_shape": (375, 2**31)}, "image shape (375, 2147483648) is not a (height, width)"),
    ({"calib": None}, "calib: expected a Calibration (read_calibration), received NoneType"),
    ({"names": ["Big Car"]}, "names: 'Big Car' is no KITTI class name (one word"),
    ({"scores": [0.9, 0.8]}, "detections: received 1 box, 2 scores and 1 name, expected the same count"),
    ({"names": ["Car", "Car"]}, "detections: received 1 box, 1 score and 2 names, expected the same count"),
    ({"names": np.array([0])}, "names: '0' (int64) is no class name: pass Detections.names, not its labels"),
    ({"names": "Car"}, "names: the str 'Car', expected a name a box (Detections.names)"),
    ({"boxes": object()}, "boxes: a object, expected an (N, 7) array (Detections.boxes)"),
])
def test_kitti_lines_refuse_arguments_that_make_no_label_lines(calib134: Calibration, given: dict, said: str) -> None:
    """Each was a bare ValueError or AttributeError, every box dropped for a 1 x 1 image, or a line of 17 fields
    that eval then refused."""
    arguments = {"boxes": np.array([[10, 0, -1, 4, 1.8, 1.5, 0.3]]), "scores": [0.9], "names": ["Car"],
                 "calib": calib134, **given}
    with pytest.raises(InputError, match=re.escape(said)):
        detections_to_kitti_lines(**arguments)

def test_lines_match_an_independent_computation(assets: Path, calib134: Calibration) -> None:
    # Changed with issue 11: alpha is rotation_y - atan2(x, z) of the camera-frame location (was
    # the lidar centre's angle), 2D boxes are clipped to the default 375 x 1242 image, and boxes
    # wholly outside it are dropped unless keep_out_of_view=True.
    hand = parse_calib_by_hand(assets / "kitti/training/calib/000134.txt")
    m, p2 = velo_to_rect_by_hand(hand), hand["P2"].reshape(3, 4)
    boxes = random_boxes(20, seed=1)
    boxes[:, 0] = np.abs(boxes[:, 0]) + 5  # in front of the camera, so the projection is sane
    scores = np.linspace(0.95, 0.1, 20)
    names = ["Car", "Pedestrian", "Cyclist", "Van"] * 5
    result = detections_to_kitti_lines(boxes, scores, names, calib134, keep_out_of_view=True)
    assert len(result.lines) == 20 and result.dropped_out_of_view == 0 and result.dropped_nonfinite == 0
    in_view = []
    for line, box, score, name in zip(result.lines, boxes, scores, names):
        f = line.split()
        assert f[:3] == [name, "-1", "-1"] and len(f) == 16
        assert all(len(v.split(".")[1]) == 4 for v in f[3:])
        v = [float(x) for x in f[3:]]
        alpha, bbox, (h, w, l), loc, ry, sc = v[0], v[1:5], v[5:8], v[8:11], v[11], v[12]
        x, y, z, dx, dy, dz, heading = box
        exp_loc = (m @ [x, y, z - dz / 2, 1])[:3]
        exp_ry = wrap(-heading - math.pi / 2)
        exp_alpha = wrap(exp_ry - math.atan2(exp_loc[0], exp_loc[2]))
        np.testing.assert_allclose(loc, exp_loc, atol=6e-5)
        np.testing.assert_allclose([h, w, l], [dz, dy, dx], atol=6e-5)
        assert abs(wrap(ry - exp_ry)) < 1e-4 and abs(wrap(alpha - exp_alpha)) < 1e-4 and abs(sc - score) < 6e-5
        assert -math.pi <= ry < math.pi and -math.pi <= alpha < math.pi
        corners = camera_corners_by_hand(exp_loc[0], exp_loc[1], exp_loc[2], dx, dz, dy, exp_ry)
        uvw = (p2 @ np.column_stack([corners, np.ones(8)]).T).T
        assert (uvw[:, 2] > 0).all()
        uv = uvw[:, :2] / uvw[:, 2:]
        exp_box = np.clip([*uv.min(0), *uv.max(0)], 0, [1241, 374, 1241, 374])
        np.testing.assert_allclose(bbox, exp_box, atol=6e-5, rtol=1e-7)
        in_view.append(exp_box[2] > exp_box[0] and exp_box[3] > exp_box[1])
    default = detections_to_kitti_lines(boxes, scores, names, calib134)
    assert 0 < sum(in_view) < 20  # some boxes of the random set lie wholly beside the image
    assert default.lines == [line for line, keep in zip(result.lines, in_view) if keep]
    assert default.dropped_out_of_view == 20 - sum(in_view) and default.kept.tolist() == np.flatnonzero(in_view).tolist()


def test_lines_clip_2d_box_to_given_image_shape(assets: Path, calib134: Calibration) -> None:
    hand = parse_calib_by_hand(assets / "kitti/training/calib/000134.txt")
    m, p2 = velo_to_rect_by_hand(hand), hand["P2"].reshape(3, 4)
    boxes = random_boxes(30, seed=2)
    boxes[:, 0] = np.abs(boxes[:, 0]) + 3
    names = ["Car"] * 30
    clipped = detections_to_kitti_lines(boxes, np.ones(30), names, calib134, image_shape=(370, 1224),
                                        keep_out_of_view=True)
    changed = 0
    assert len(clipped.lines) == 30
    for line, box in zip(clipped.lines, boxes):
        f = line.split()
        x, y, z = (m @ [box[0], box[1], box[2] - box[5] / 2, 1])[:3]
        corners = camera_corners_by_hand(x, y, z, box[3], box[5], box[4], -box[6] - math.pi / 2)
        uvw = (p2 @ np.column_stack([corners, np.ones(8)]).T).T
        assert (uvw[:, 2] > 0).all()
        uv = uvw[:, :2] / uvw[:, 2:]
        free = np.array([*uv.min(0), *uv.max(0)])
        exp = np.clip(free, 0, [1223, 369, 1223, 369])
        np.testing.assert_allclose(np.array(f[4:8], float), exp, atol=6e-5, rtol=1e-7)
        changed += bool(np.abs(exp - free).max() > 1)
    assert changed > 0  # some boxes do leave the image


def test_lines_empty_and_mismatched(calib134: Calibration) -> None:
    assert detections_to_kitti_lines(np.zeros((0, 7)), np.zeros(0), [], calib134).lines == []
    with pytest.raises(InputError, match="expected the same count"):
        detections_to_kitti_lines(np.zeros((2, 7)), np.zeros(2), ["Car"], calib134).lines
    with pytest.raises(InputError, match=r"\(N, 7\)"):
        detections_to_kitti_lines(np.zeros((2, 8)), np.zeros(2), ["Car"] * 2, calib134).lines


def test_round_trip_lidar_lines_lidar(calib134: Calibration) -> None:
    boxes = random_boxes(40, seed=3)
    scores = np.random.default_rng(4).uniform(0.1, 1, 40)
    names = ["Car", "Pedestrian"] * 20
    lines = detections_to_kitti_lines(boxes, scores, names, calib134, keep_out_of_view=True).lines
    back = kitti_label_to_lidar_boxes(lines, calib134)
    assert back.names == names
    assert back.boxes.shape == (40, 7) and back.boxes.dtype == np.float32
    np.testing.assert_allclose(back.boxes[:, :6], boxes[:, :6], atol=1e-2)
    dh = (back.boxes[:, 6] - boxes[:, 6] + math.pi) % (2 * math.pi) - math.pi
    assert np.abs(dh).max() < 1e-2
    assert ((back.boxes[:, 6] >= -math.pi) & (back.boxes[:, 6] < math.pi)).all()  # headings normalised
    np.testing.assert_allclose(back.scores, scores, atol=1e-4)


def test_label_000134_to_lidar_matches_camera_corners(assets: Path, calib134: Calibration) -> None:
    label = assets / "kitti/training/label_2/000134.txt"
    rows = [line.split() for line in label.read_text().splitlines() if line.strip()]
    objects = [r for r in rows if r[0] != "DontCare"]
    got = kitti_label_to_lidar_boxes(label, calib134)
    assert got.names == [r[0] for r in objects]
    assert np.isnan(got.scores).all()

    # dx = l, heading = -(ry + pi/2), z + h/2 assume the lidar axes map onto the camera axes
    # exactly (lidar x -> z, y -> -x, z -> -y). The real calibration is off that by a small
    # rotation, which moves a corner by at most its angle times the corner's distance from the
    # bottom centre (which maps exactly). That bound is the tolerance.
    m = velo_to_rect_by_hand(parse_calib_by_hand(assets / "kitti/training/calib/000134.txt"))
    u, _, vt = np.linalg.svd(m[:3, :3])
    ideal = np.array([[0, -1, 0], [0, 0, -1], [1, 0, 0]], dtype=np.float64)
    tilt = math.acos(np.clip((np.trace(u @ vt @ ideal.T) - 1) / 2, -1, 1))
    assert 1e-3 < tilt < 0.02
    for row, box in zip(objects, got.boxes):
        h, w, l, x, y, z, ry = (float(v) for v in row[8:15])
        cam = camera_corners_by_hand(x, y, z, l, h, w, ry)
        lidar = lidar_corners_by_hand(box)
        back = (m @ np.column_stack([lidar, np.ones(8)]).T).T[:, :3]
        reach = math.sqrt((l / 2) ** 2 + (w / 2) ** 2 + h**2)
        assert same_point_sets(back, cam, tol=tilt * reach + 1e-4), row[0]
        # the box centre maps onto the label's bottom centre lifted by h/2 along the camera's up
        centre = (m @ np.append(box[:3].astype(np.float64), 1))[:3]
        np.testing.assert_allclose(centre, [x, y - h / 2, z], atol=tilt * h / 2 + 1e-4)


@pytest.mark.parametrize("breaks", LINE_BREAKS.values(), ids=LINE_BREAKS.keys())
@pytest.mark.parametrize("control", NOT_LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in NOT_LINE_BREAKS])
def test_a_label_files_lines_break_at_lf_crlf_and_cr_alone_and_are_named_by_an_editors_numbers(
        tmp_path: Path, breaks: str, control: str) -> None:
    """str.splitlines broke a label line at a form feed, NEL, U+2028 and the like: two objects joined by one read
    as two lines without a word, and every line after one was named a line past its own. Lines break at LF, CRLF
    and CR alone: such a character inside a line leaves it one line."""
    good = "Car 0.00 0 -1.57 10.0 10.0 50.0 50.0 1.5 1.6 3.9 0.0 1.0 10.0 -1.57"
    path = tmp_path / "000000.txt"
    path.write_bytes(breaks.join([good, good + control, "", "Car 0 0", ""]).encode())
    with pytest.raises(InputError, match=r"000000\.txt', line 4: 3 fields, expected 15"):
        read_label_file(path, with_score=False)
    path.write_bytes(breaks.join([good, good + control + good, ""]).encode())
    with pytest.raises(InputError, match=r"000000\.txt', line 2: 30 fields, expected 15"):
        read_label_file(path, with_score=False)
    path.write_bytes(breaks.join([good, "Car", ""]).encode())
    with pytest.raises(InputError, match=r"000000\.txt', line 2: 1 field, expected 15"):
        read_label_file(path, with_score=False)
    path.write_bytes(breaks.join([good, f" {good} {control}", good]).encode())
    names, table = read_label_file(path, with_score=False)
    assert names == ["Car"] * 3 and table.shape == (3, 15)


def test_label_round_trip_to_lines(assets: Path, calib134: Calibration) -> None:
    label = assets / "kitti/training/label_2/000134.txt"
    got = kitti_label_to_lidar_boxes(label, calib134)
    lines = detections_to_kitti_lines(got.boxes, np.ones(len(got.names)), got.names, calib134).lines
    objects = [line.split() for line in label.read_text().splitlines() if not line.startswith("DontCare")]
    for orig, new in zip(objects, lines):
        a, b = np.array(orig[8:15], float), np.array(new.split()[8:15], float)
        np.testing.assert_allclose(b[:6], a[:6], atol=1e-3)
        assert abs(wrap(b[6] - a[6])) < 1e-3


def test_label_parse_errors(tmp_path: Path, calib134: Calibration) -> None:
    with pytest.raises(InputError, match="does not exist"):
        kitti_label_to_lidar_boxes(tmp_path / "none.txt", calib134)
    with pytest.raises(InputError, match="line 2: 3 fields"):
        kitti_label_to_lidar_boxes(["Car 0 0 0 1 1 1 1 1.5 1.6 3.9 1 1 10 0", "Car 0 0"], calib134)
    with pytest.raises(InputError, match="line 1: a non-numeric value"):
        kitti_label_to_lidar_boxes(["Car 0 0 0 1 1 1 1 1.5 x 3.9 1 1 10 0"], calib134)
    empty = kitti_label_to_lidar_boxes([], calib134)
    assert empty.names == [] and empty.boxes.shape == (0, 7) and empty.scores.shape == (0,)
    good = "Car 0 0 0 1 1 2 2 1.5 1.6 3.9 1 1 10 0"
    # the checks eval makes of label lines: any field, not only the 3D box's
    for line, problem in ((good.replace(" 0 0 0 1", " 0 0 nan 1"), "a NaN or infinite value"),
                          (good.replace("10 0", "1e6 0"), "a value beyond"),
                          (good.replace("1 1 2 2", "3 1 2 2"), "its 2D box runs backwards"),
                          (good.replace("1.6 3.9", "-1.6 3.9"), "a zero or negative height, width or length"),
                          (good.replace("1.6 3.9", "0 0"), r"a zero or negative height, width or length \(h w l = 1.5 0 0\)"),
                          (good + " nan", "a NaN or infinite value"), (good + " inf", "a NaN or infinite value")):
        with pytest.raises(InputError, match=f"line 2: {problem}"):
            kitti_label_to_lidar_boxes([good, line], calib134)
    with pytest.raises(InputError, match="expected 15 or 16"):
        kitti_label_to_lidar_boxes(["DontCare -1 -1 -10 1 1 2 2 -1 -1 -1 -1000 -1000 -1000"], calib134)
    # a don't-care region spelt in another case has no sizes either: its refusal names the spelling
    with pytest.raises(InputError, match=r"line 1: a zero or negative height, width or length \(h w l = -1 -1 -1\); a "
                                         r"don't-care region is typed DontCare, as KITTI and OpenPCDet's evaluation "
                                         r"spell it \(not 'dontcare'\)"):
        kitti_label_to_lidar_boxes(["dontcare -1 -1 -10 1 1 2 2 -1 -1 -1 -1000 -1000 -1000 -10"], calib134)
    mixed = kitti_label_to_lidar_boxes([good, good + " 0.75", "DontCare -1 -1 -10 1 1 2 2 -1 -1 -1 -1000 -1000 -1000 -10"],
                                       calib134)
    assert mixed.names == ["Car", "Car"] and np.isnan(mixed.scores[0]) and mixed.scores[1] == np.float32(0.75)


# --------------------------------------------------------------------------- evaluation-ready lines (issue 11)

# A simple rig: rect camera = lidar axes turned (x_cam = -y, y_cam = -z, z_cam = x), pinhole
# f = 100 px, principal point (50, 40), image 80 x 100 (H x W).
SIMPLE_P2 = np.array([[100.0, 0, 50, 0], [0, 100, 40, 0], [0, 0, 1, 0]])
SIMPLE_TR = np.array([[0.0, -1, 0, 0], [0, 0, -1, 0], [1, 0, 0, 0]])
SIMPLE_SHAPE = (80, 100)


def simple_calib() -> Calibration:
    return Calibration(P2=SIMPLE_P2.copy(), R0_rect=np.eye(3), Tr_velo_to_cam=SIMPLE_TR.copy())


def cube(x: float, y: float, heading: float = 0.0, size: float = 2.0) -> list[float]:
    return [x, y, 0.0, size, size, size, heading]


def fields(line: str) -> list[float]:
    return [float(v) for v in line.split()[3:]]


def test_box_in_front_projects_to_hand_computed_2d_box() -> None:
    # lidar cube centre (10, 0, 0), side 2: camera X, Y in {-1, 1}, Z in {9, 11}. u = 100 X / Z + 50.
    out = detections_to_kitti_lines(np.array([cube(10, 0)]), np.array([0.9]), ["Car"], simple_calib(), SIMPLE_SHAPE)
    assert out.dropped_out_of_view == 0 and out.dropped_nonfinite == 0 and out.kept.tolist() == [0]
    v = fields(out.lines[0])
    np.testing.assert_allclose(v[1:5], [50 - 100 / 9, 40 - 100 / 9, 50 + 100 / 9, 40 + 100 / 9], atol=6e-5)
    np.testing.assert_allclose(v[5:11], [2, 2, 2, 0, 1, 10], atol=1e-9)  # h w l, bottom centre (0, 1, 10)
    assert v[11] == pytest.approx(-math.pi / 2, abs=6e-5) and v[0] == pytest.approx(-math.pi / 2, abs=6e-5)
    assert v[12] == 0.9


def test_box_straddling_image_edge_is_clipped() -> None:
    # centre (10, -4, 0): X in {3, 5}, Z in {9, 11}: u from 100*3/11+50 to 100*5/9+50 = 105.6 -> 99.
    out = detections_to_kitti_lines(np.array([cube(10, -4)]), np.array([0.5]), ["Car"], simple_calib(), SIMPLE_SHAPE)
    v = fields(out.lines[0])
    np.testing.assert_allclose(v[1:5], [300 / 11 + 50, 40 - 100 / 9, 99, 40 + 100 / 9], atol=6e-5)


def test_box_behind_camera_and_box_beside_image_are_dropped_and_counted() -> None:
    boxes = np.array([cube(10, 0), cube(-10, 0), cube(5, -20)])  # in view, behind, beside (u > 366)
    out = detections_to_kitti_lines(boxes, np.ones(3), ["Car", "Van", "Truck"], simple_calib(), SIMPLE_SHAPE)
    assert [line.split()[0] for line in out.lines] == ["Car"]
    assert out.dropped_out_of_view == 2 and out.kept.tolist() == [0]
    kept = detections_to_kitti_lines(boxes, np.ones(3), ["Car", "Van", "Truck"], simple_calib(), SIMPLE_SHAPE,
                                     keep_out_of_view=True)
    assert len(kept.lines) == 3 and kept.dropped_out_of_view == 0
    assert fields(kept.lines[1])[1:5] == [0, 0, 0, 0]  # wholly behind: no image box
    assert fields(kept.lines[2])[1:5] == [99, pytest.approx(40 - 100 / 4, abs=6e-5), 99,
                                          pytest.approx(40 + 100 / 4, abs=6e-5)]


def test_box_reaching_behind_camera_extends_to_image_border() -> None:
    # centre (0.5, 0, 0), length 4 along lidar x: corners at Z = -1.5 and 2.5. The front corners
    # alone would give u in [10, 90]; the edges cut at the near plane reach both image borders.
    box = np.array([[0.5, 0, 0, 4, 2, 2, 0]])
    out = detections_to_kitti_lines(box, np.ones(1), ["Car"], simple_calib(), SIMPLE_SHAPE)
    assert fields(out.lines[0])[1:5] == [0, 0, 99, 79]
    # its centre moved behind the camera (x = -0.5): out of view although corners are in front
    behind = box.copy()
    behind[0, 0] = -0.5
    assert detections_to_kitti_lines(behind, np.ones(1), ["Car"], simple_calib(), SIMPLE_SHAPE).lines == []


@pytest.mark.parametrize(
    "x, y, heading, ry, alpha",
    [
        (10, -4, 0.0, -math.pi / 2, -math.pi / 2 - math.atan2(4, 10)),  # camera X = 4, Z = 10
        (10, 2, -math.pi / 2, 0.0, math.atan2(2, 10)),  # X = -2: alpha = 0 - atan2(-2, 10)
        (10, 2, 2.5, -2.5 - math.pi / 2 + 2 * math.pi, -2.5 - math.pi / 2 + 2 * math.pi + math.atan2(2, 10)),
        (10, 2, math.pi / 2, -math.pi, -math.pi + math.atan2(2, 10)),  # ry = -pi exactly: kept at -pi
    ],
)
def test_alpha_is_kitti_observation_angle(x: float, y: float, heading: float, ry: float, alpha: float) -> None:
    out = detections_to_kitti_lines(np.array([cube(x, y, heading)]), np.ones(1), ["Car"], simple_calib(),
                                    SIMPLE_SHAPE, keep_out_of_view=True)
    v = fields(out.lines[0])
    assert -math.pi <= v[0] <= math.pi and -math.pi <= v[11] <= math.pi
    assert v[11] == pytest.approx(ry, abs=1e-4) and v[0] == pytest.approx(alpha, abs=1e-4)


def test_alpha_matches_real_labels(assets: Path) -> None:
    # KITTI's own alpha (2 decimals) against ours from the label's lidar box and the frame's calib
    for frame in ("000000", "000001", "000002", "000134"):
        calib = read_calibration(assets / f"kitti/training/calib/{frame}.txt")
        label = assets / f"kitti/training/label_2/{frame}.txt"
        rows = [r.split() for r in label.read_text().splitlines() if r.strip() and not r.startswith("DontCare")]
        got = kitti_label_to_lidar_boxes(label, calib)
        out = detections_to_kitti_lines(got.boxes, np.ones(len(rows)), got.names, calib, image_shape=(375, 1242))
        assert out.dropped_out_of_view == 0 and len(out.lines) == len(rows)
        for row, line in zip(rows, out.lines):
            v = fields(line)
            assert abs(wrap(v[0] - float(row[3]))) < 0.02, (frame, row[0])
            # the projected 3D box holds the annotated 2D box (which is tight around the visible
            # object) up to a few pixels of annotation slack, and is not much larger
            a, b = np.array(row[4:8], float), np.array(v[1:5])
            assert (b[:2] <= a[:2] + 3).all() and (b[2:] >= a[2:] - 3).all(), (frame, row[0])
            inter = np.prod(np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None))
            union = np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter
            assert inter / union > 0.45, (frame, row[0])


def test_nonfinite_detections_are_dropped_and_counted() -> None:
    boxes = np.array([cube(10, 0), cube(10, 1), cube(10, 0), cube(10, -1)], dtype=np.float32)
    boxes[1, 3] = np.nan
    boxes[3, 6] = np.inf
    scores = np.array([0.9, 0.8, np.nan, 0.6])
    out = detections_to_kitti_lines(boxes, scores, ["A", "B", "C", "D"], simple_calib(), SIMPLE_SHAPE)
    assert [line.split()[0] for line in out.lines] == ["A"]
    assert out.dropped_nonfinite == 3 and out.dropped_out_of_view == 0 and out.kept.tolist() == [0]

    b, s, labels, _, dropped = finite_detections(boxes, scores, ["A", "B", "C", "D"])
    assert dropped == 3 and labels == ["A"] and s.tolist() == [pytest.approx(0.9)]
    np.testing.assert_array_equal(b, boxes[:1])
    b, s, ids, _, dropped = finite_detections(boxes, scores, np.array([1, 2, 3, 1]))
    assert dropped == 3 and isinstance(ids, np.ndarray) and ids.tolist() == [1]
    b, s, labels, _, dropped = finite_detections(boxes[:1], scores[:1], ["A"])
    assert dropped == 0 and labels == ["A"]
    with pytest.raises(InputError, match=r"boxes of shape \(4, 7\), 4 scores and 1 label, expected"):
        finite_detections(boxes, scores, ["A"])
    velocity = np.arange(8.0).reshape(4, 2)  # a multi-head model's: kept with its boxes
    *_, kept, dropped = finite_detections(boxes, scores, list("ABCD"), velocity)
    assert dropped == 3 and kept is not None and kept.tolist() == [[0.0, 1.0]]
    *_, kept, dropped = finite_detections(boxes[:0], scores[:0], [], velocity[:0])  # a frame of no box
    assert dropped == 0 and kept is not None and kept.shape == (0, 2)
    with pytest.raises(InputError, match="3 velocities, expected"):
        finite_detections(boxes, scores, list("ABCD"), velocity[:3])
    with pytest.raises(InputError, match=r"boxes of shape \(1, 7\), 1 score, 1 label and 2 velocities, expected \(N, 7\), N, N and N$"):
        finite_detections(boxes[:1], scores[:1], ["A"], velocity[:2])


def test_absurd_detections_are_dropped_and_counted_so_that_eval_reads_the_lines() -> None:
    """Boxes a network overflowed to without reaching infinity (0-255 intensities through a model trained on
    0-1): a centre or a size beyond 10 km, or a size that prints as 0.0000, are no object's, and the label
    reader refuses such lines; they are dropped and counted with the non-finite ones (they were written)."""
    boxes = np.array([cube(10, 0), cube(10, 1), cube(10, 0), cube(10, -1), cube(10, 0)], dtype=np.float64)
    boxes[1, 3] = 141486.98  # a length of 141 km
    boxes[2, 0] = 2e4  # a centre 20 km ahead
    boxes[3, 5] = 0.00004  # a height that prints as 0.0000
    boxes[4, 4] = -2.0  # a negative width
    scores = np.full(5, 0.5)
    out = detections_to_kitti_lines(boxes, scores, list("ABCDE"), simple_calib(), SIMPLE_SHAPE,
                                    keep_out_of_view=True)
    assert [line.split()[0] for line in out.lines] == ["A"] and out.dropped_nonfinite == 4
    parse_label_lines(out.lines, "lines", with_score=True)  # what eval reads back
    b, s, labels, _, dropped = finite_detections(boxes, scores, list("ABCDE"))
    assert dropped == 4 and labels == ["A"]
    np.testing.assert_array_equal(b, boxes[:1])


def test_lines_refuse_a_bad_image_shape() -> None:
    with pytest.raises(InputError, match="image shape"):
        detections_to_kitti_lines(np.array([cube(10, 0)]), np.ones(1), ["Car"], simple_calib(), (0, 100))


# --------------------------------------------------------------------------- heading normalisation


@pytest.mark.parametrize(("change", "said"), [
    (("12.65", "nan"), "a NaN or infinite value"), (("3.69", "inf"), "a NaN or infinite value"),
    (("1.50 1.78", "-1.50 1.78"), "a zero or negative height, width or length (h w l = -1.5 1.78 3.69)"),
    (("1.78 3.69", "0.00 0.00"), "a zero or negative height, width or length (h w l = 1.5 0 0)"),
    (("1.50 1.78", "0 1.78"), "a zero or negative height, width or length (h w l = 0 1.78 3.69)"),
])
def test_label_lines_with_non_finite_values_or_negative_sizes_are_refused(calib134: Calibration,
                                                                          change: tuple[str, str], said: str) -> None:
    """They became NaN or inside-out boxes without a word (eval refuses the same lines)."""
    good = "Car 0.00 0 -1.33 333.28 177.65 489.60 277.55 1.50 1.78 3.69 -3.29 1.46 12.65 -1.57"
    assert len(kitti_label_to_lidar_boxes([good], calib134).boxes) == 1
    with pytest.raises(InputError, match=rf"^label lines, line 1: {re.escape(said)}$"):
        kitti_label_to_lidar_boxes([good.replace(*change)], calib134)


def test_normalize_heading_takes_lists_and_refuses_text() -> None:
    np.testing.assert_allclose(normalize_heading([1.0, 7.0]), [1.0, 7.0 - 2 * np.pi])
    with pytest.raises(InputError, match="heading '1': expected radians"):
        normalize_heading("1")  # type: ignore[call-overload]

def test_normalize_heading_range_and_values() -> None:
    pi = math.pi
    cases = {0.0: 0.0, pi: -pi, -pi: -pi, 3 * pi: -pi, 2 * pi + 0.5: 0.5, -7.0: -7.0 + 2 * pi, 1.0: 1.0,
             -pi - 1e-15: pi - 1e-15}
    for value, expected in cases.items():
        got = normalize_heading(value)
        assert isinstance(got, float) and -pi <= got < pi
        assert got == pytest.approx(expected, abs=1e-9), value
    rng = np.random.default_rng(0)
    many = np.concatenate([rng.uniform(-50, 50, 10_000), np.arange(-8, 9) * pi, np.nextafter(np.arange(-8, 9) * pi, 0)])
    out = normalize_heading(many)
    assert out.dtype == np.float64 and ((out >= -pi) & (out < pi)).all()
    np.testing.assert_allclose(np.cos(out), np.cos(many), atol=1e-9)
    np.testing.assert_allclose(np.sin(out), np.sin(many), atol=1e-9)
    f32 = normalize_heading(many.astype(np.float32))
    assert f32.dtype == np.float32 and ((f32.astype(np.float64) >= -pi) & (f32.astype(np.float64) < pi)).all()
    assert np.isnan(normalize_heading(np.array([np.nan]))).all()


# --------------------------------------------------------------------------- calibration checks

def write_calib(path: Path, p2: np.ndarray, r0: np.ndarray, tr: np.ndarray) -> Path:
    rows = {"P0": np.zeros(12), "P1": np.zeros(12), "P2": p2, "P3": p2, "R0_rect": r0,
            "Tr_velo_to_cam": tr, "Tr_imu_to_velo": tr}
    path.write_text("".join(f"{k}: " + " ".join(f"{v:.12e}" for v in np.ravel(m)) + "\n" for k, m in rows.items()))
    return path


def test_simple_calib_file_round_trips(tmp_path: Path) -> None:
    calib = read_calibration(write_calib(tmp_path / "c.txt", SIMPLE_P2, np.eye(3), SIMPLE_TR))
    np.testing.assert_array_equal(calib.P2, SIMPLE_P2)
    np.testing.assert_array_equal(calib.Tr_velo_to_cam, SIMPLE_TR)


@pytest.mark.parametrize(
    "key, change, message",
    [
        ("R0_rect", lambda m: m * [[1], [1], [0]], "R0_rect is singular"),
        ("R0_rect", lambda m: m * np.nan, "R0_rect has a NaN or infinite value"),
        ("Tr_velo_to_cam", lambda m: np.column_stack([m[:, :1], m[:, :1], m[:, 2:]]), "Tr_velo_to_cam is singular"),
        ("Tr_velo_to_cam", lambda m: np.where(m == 1, np.inf, m), "Tr_velo_to_cam has a NaN or infinite value"),
        ("P2", lambda m: np.where(m == 100, np.nan, m), "P2 has a NaN or infinite value"),
        ("P2", lambda m: m * [[1], [1], [0]], "P2 is singular"),
    ],
)
def test_read_calibration_refuses_singular_or_nonfinite(tmp_path: Path, key: str, change, message: str) -> None:
    mats = {"P2": SIMPLE_P2.copy(), "R0_rect": np.eye(3), "Tr_velo_to_cam": SIMPLE_TR.copy()}
    mats[key] = change(mats[key])
    path = write_calib(tmp_path / "bad_calib.txt", mats["P2"], mats["R0_rect"], mats["Tr_velo_to_cam"])
    with pytest.raises(InputError) as err:
        read_calibration(path)
    text = str(err.value)
    assert message in text and "bad_calib.txt" in text and "\n" not in text


def damaged_calib(assets: Path, path: Path, key: str, change) -> Path:
    """A real KITTI calib file with ``key``'s matrix replaced by ``change(matrix)``, the rest as it was."""
    hand = parse_calib_by_hand(assets / CALIBS[0])
    mats = {k: hand[k].reshape(shape) for k, shape in (("P2", (3, 4)), ("R0_rect", (3, 3)), ("Tr_velo_to_cam", (3, 4)))}
    mats[key] = change(mats[key])
    return write_calib(path, mats["P2"], mats["R0_rect"], mats["Tr_velo_to_cam"])


def flip_x(m: np.ndarray) -> np.ndarray:
    """The camera's x axis flipped: a reflection (det -1), as a calib with a sign lost."""
    return np.diag([-1.0, 1, 1]) @ m


def turn_around(m: np.ndarray) -> np.ndarray:
    """The camera turned 180 degrees about its vertical axis: a true rotation, looking backwards."""
    return np.diag([-1.0, 1, -1]) @ m


@pytest.mark.parametrize(
    "key, change, message",
    [
        ("Tr_velo_to_cam", flip_x, "the rotation part (3x3) of Tr_velo_to_cam is not a rotation (a reflection: "
                                   "determinant -1,"),
        ("R0_rect", flip_x, "R0_rect is not a rotation (a reflection: determinant -1,"),
        ("Tr_velo_to_cam", lambda m: m * 1000, "Tr_velo_to_cam is not a rotation (a rotation scaled by 1000 "
                                               "(millimetres?))"),
        ("Tr_velo_to_cam", lambda m: m * [[1, 1, 0.5, 1]], "Tr_velo_to_cam is not a rotation (R R^T differs from the "
                                                           "identity by up to 0.75"),
        ("Tr_velo_to_cam", lambda m: np.column_stack([m[:, :3], m[:, 3] * 1000]),
         "the translation of Tr_velo_to_cam is 338.6 m long"),
        ("P2", lambda m: m * [[-1], [1], [1]], "P2's focal lengths are -707 and 707 pixels, expected positive"),
    ],
)
def test_read_calibration_refuses_what_is_no_camera_calibration(tmp_path: Path, assets: Path, key: str, change,
                                                                message: str) -> None:
    path = damaged_calib(assets, tmp_path / "bad_calib.txt", key, change)
    with pytest.raises(InputError) as err:
        read_calibration(path)
    text = str(err.value)
    assert message in text and "bad_calib.txt" in text and "\n" not in text


@pytest.mark.parametrize(("key", "value"), [("P2", 1e308), ("P2", -2e6), ("Tr_velo_to_cam", 1e200)])
def test_read_calibration_refuses_a_value_no_calibration_holds_without_numpy_warnings(
        tmp_path: Path, assets: Path, key: str, value: float) -> None:
    """A real calib whose translation column holds a value far beyond any camera's pixels or a car's metres: P2's
    was read, and the camera-FOV crop then printed NumPy's "overflow encountered in divide" and warned of a camera
    facing backwards; Tr_velo_to_cam's was refused as "inf m long" after NumPy's overflow warning in its norm."""
    def huge_translation(m: np.ndarray) -> np.ndarray:
        return np.column_stack([m[:, :3], np.full(3, value)])

    path = damaged_calib(assets, tmp_path / "bad_calib.txt", key, huge_translation)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy's overflow warning would end the read as an exception
        with pytest.raises(InputError) as err:
            read_calibration(path)
    text = str(err.value)
    assert f"key {key} has the value {value:.4g}, beyond +-1e+06" in text and "bad_calib.txt" in text, text
    assert "inf" not in text and "\n" not in text, text


def test_read_calibration_rotation_checks_pass_kitti_and_a_backwards_camera(tmp_path: Path, assets: Path) -> None:
    """Every real KITTI calib of the assets is a rotation far inside the tolerance (their 7-digit values are
    orthogonal to ~1e-7); a camera turned backwards is still a valid calibration (infer warns on its empty crop)."""
    from pointpillars_trt.kitti import ROTATION_TOLERANCE

    for path in sorted(assets.glob("kitti/*/calib/*.txt")):
        calib = read_calibration(path)
        for m in (calib.R0_rect, calib.Tr_velo_to_cam[:, :3]):
            assert np.abs(m @ m.T - np.eye(3)).max() < ROTATION_TOLERANCE / 1000
    turned = read_calibration(damaged_calib(assets, tmp_path / "turned.txt", "Tr_velo_to_cam", turn_around))
    np.testing.assert_array_equal(turned.Tr_velo_to_cam[2], -parse_calib_by_hand(assets / CALIBS[0])
                                  ["Tr_velo_to_cam"].reshape(3, 4)[2])


# --------------------------------------------------------------------------- pairing frames with calib / image

@pytest.fixture()
def kitti_tree(tmp_path: Path) -> Path:
    for split, ids in (("training", ["000134", "000002"]), ("testing", ["000002"])):
        (tmp_path / split / "velodyne").mkdir(parents=True)
        (tmp_path / split / "calib").mkdir()
        for i in ids:
            (tmp_path / split / "velodyne" / f"{i}.bin").write_bytes(b"")
            write_calib(tmp_path / split / "calib" / f"{i}.txt", SIMPLE_P2, np.eye(3), SIMPLE_TR)
    return tmp_path


def test_calib_for_frame_sibling_folder(kitti_tree: Path) -> None:
    frame = kitti_tree / "training" / "velodyne" / "000134.bin"
    assert calib_for_frame(frame) == kitti_tree / "training" / "calib" / "000134.txt"
    assert calib_for_frame(str(frame), kitti_tree / "training" / "calib") == kitti_tree / "training" / "calib" / "000134.txt"
    test_frame = kitti_tree / "testing" / "velodyne" / "000002.bin"
    assert calib_for_frame(test_frame) == kitti_tree / "testing" / "calib" / "000002.txt"


def test_calib_for_frame_refuses_the_other_split(kitti_tree: Path) -> None:
    test_frame = kitti_tree / "testing" / "velodyne" / "000002.bin"
    with pytest.raises(InputError) as err:
        calib_for_frame(test_frame, kitti_tree / "training" / "calib")  # 000002.txt is there, but training's
    text = str(err.value)
    assert "belongs to 'training'" in text and "to 'testing'" in text and "000002.bin" in text
    with pytest.raises(InputError, match="belongs to 'testing'"):
        calib_for_frame(kitti_tree / "training" / "velodyne" / "000002.bin", kitti_tree / "testing" / "calib")


def test_a_calib_file_whose_link_is_broken_or_a_folder_is_named_so_not_said_missing(kitti_tree: Path) -> None:
    """A calib file linked to a drive not mounted, in a link loop, or a folder in its place was said to be no file
    of the frame's id, where ls shows it there."""
    calib = kitti_tree / "training" / "calib"
    frames = kitti_tree / "training" / "velodyne"
    (calib / "000007.txt").symlink_to(kitti_tree / "not-mounted" / "000007.txt")
    (calib / "000008.txt").symlink_to("loop.txt")
    (calib / "loop.txt").symlink_to("000008.txt")
    (calib / "000009.txt").mkdir()
    for stem, said in (("000007", r"000007\.txt' is a broken symbolic link"),
                       ("000008", r"000008\.txt' cannot be read: Too many levels of symbolic links"),
                       ("000009", r"000009\.txt' is a directory, not a regular file")):
        with pytest.raises(InputError, match=said):
            read_calibration(calib_for_frame(frames / f"{stem}.bin"))
    with pytest.raises(InputError, match="has no file for frame id '000010'"):
        calib_for_frame(frames / "000010.bin")


def test_calib_for_frame_other_folder_matched_by_id(kitti_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    mine = tmp_path_factory.mktemp("my_calibs")
    write_calib(mine / "000134.txt", SIMPLE_P2, np.eye(3), SIMPLE_TR)
    frame = kitti_tree / "training" / "velodyne" / "000134.bin"
    assert calib_for_frame(frame, mine) == mine / "000134.txt"
    with pytest.raises(InputError) as err:
        calib_for_frame(kitti_tree / "training" / "velodyne" / "000002.bin", mine)
    assert "'000002'" in str(err.value) and "my_calibs" in str(err.value)


def test_calib_for_frame_missing_id_or_folder(kitti_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(InputError) as err:
        calib_for_frame(kitti_tree / "training" / "velodyne" / "000135.bin")
    assert "'000135'" in str(err.value) and "calib" in str(err.value)
    loose = tmp_path_factory.mktemp("loose")
    (loose / "frames").mkdir()
    with pytest.raises(InputError, match="no calibration folder"):
        calib_for_frame(loose / "frames" / "x.bin")
    with pytest.raises(InputError, match="does not exist or is not a folder"):
        calib_for_frame(loose / "frames" / "x.bin", loose / "nope")


def test_calib_for_frame_names_its_paths_as_given(kitti_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames and calib folders given relative (``infer --calib calib/ velodyne/000001.bin``) had the calib file and
    folder their messages name made absolute: each is named relative, as the path it was found by was given, and so
    is the file returned (what read_calibration's messages name); given absolute, absolute."""
    training = kitti_tree / "training"
    os.mkfifo(training / "calib" / "000009.txt")  # a FIFO in the calib file's place
    (training / "calib" / "000008.txt").mkdir()  # a folder
    (training / "calib" / "000134.txt").write_text("P2: 1 2 3\n")
    (kitti_tree / "loose").mkdir()
    velodyne = training / "velodyne"
    for cwd, call, said in [
        (training, lambda: calib_for_frame("velodyne/000135.bin"), "calib folder 'calib' has no file for frame id"),
        (velodyne, lambda: calib_for_frame("000135.bin"), "calib folder '../calib' has no file for frame id"),
        (training, lambda: calib_for_frame("velodyne/000009.bin"), "calib file 'calib/000009.txt' is a FIFO"),
        (training, lambda: calib_for_frame("velodyne/000009.bin", "./calib/"), "file 'calib/000009.txt' is a FIFO"),
        (training, lambda: read_calibration(calib_for_frame("velodyne/000008.bin")), "'calib/000008.txt' is a dir"),
        (training, lambda: calib_for_frame("../loose/x.bin"),
         "no calibration folder for frame '../loose/x.bin': '../calib' does not exist (pass the calib folder: "
         "--calib DIR; in Python detect_dataset(..., calib=DIR) or calib_for_frame(frame, calib_dir=DIR))"),
        (training, lambda: read_calibration(calib_for_frame("velodyne/000134.bin")), "file 'calib/000134.txt': "),
        (velodyne, lambda: read_calibration(calib_for_frame("000134.bin", "../calib")), "file '../calib/000134.txt': "),
        (training, lambda: calib_for_frame(velodyne / "000135.bin"), f"calib folder '{training / 'calib'}' has no"),
        (training, lambda: calib_for_frame("velodyne/000009.bin", training / "calib"),
         f"calib file '{training / 'calib' / '000009.txt'}' is a FIFO"),
    ]:
        monkeypatch.chdir(cwd)
        with pytest.raises(InputError) as err:
            call()
        assert said in str(err.value), (said, str(err.value))
    monkeypatch.chdir(training)
    assert calib_for_frame("velodyne/000002.bin") == Path("calib/000002.txt")
    assert calib_for_frame("velodyne/000002.bin", "calib/") == Path("calib/000002.txt")


def test_calib_for_frame_escapes_names(tmp_path: Path) -> None:
    (tmp_path / "calib").mkdir()
    with pytest.raises(InputError) as err:
        calib_for_frame(tmp_path / "v" / "\x1b[31mred\n.bin")
    assert "\x1b" not in str(err.value) and "\n" not in str(err.value) and "\\x1b[31mred\\n" in str(err.value)


def real_png(path: Path, height: int, width: int) -> Path:
    """A complete grey PNG (signature, IHDR, IDAT, IEND) written by hand."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\0" + bytes(width) for _ in range(height))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return path


def test_image_shape_for_frame(kitti_tree: Path) -> None:
    frame = kitti_tree / "training" / "velodyne" / "000134.bin"
    assert image_shape_for_frame(frame) is None  # no image_2 folder
    (kitti_tree / "training" / "image_2").mkdir()
    real_png(kitti_tree / "training" / "image_2" / "000134.png", 370, 1224)
    assert image_shape_for_frame(frame) == (370, 1224)
    assert image_shape_for_frame(frame, kitti_tree / "training" / "image_2") == (370, 1224)
    assert image_shape_for_frame(kitti_tree / "training" / "velodyne" / "000002.bin") is None
    (kitti_tree / "training" / "image_2" / "000002.png").write_bytes(b"GIF89a" + bytes(40))
    with pytest.raises(InputError, match=r"000002\.png' is not a PNG"):
        image_shape_for_frame(kitti_tree / "training" / "velodyne" / "000002.bin")
    with pytest.raises(InputError, match="belongs to 'training'"):
        image_shape_for_frame(kitti_tree / "testing" / "velodyne" / "000002.bin", kitti_tree / "training" / "image_2")


def test_image_shape_for_frame_names_the_image_as_given(kitti_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames and image folders given relative had the camera image that read_png_size's messages name made
    absolute: it is named relative, as the path it was found by was given, and so is the path returned; given
    absolute, absolute."""
    training = kitti_tree / "training"
    images, velodyne = training / "image_2", training / "velodyne"
    images.mkdir()
    (images / "000002.png").write_bytes(b"GIF89a" + bytes(40))  # not a PNG
    (images / "000134.png").symlink_to(kitti_tree / "not-mounted" / "000134.png")
    (images / "000009.png").write_bytes(real_png(kitti_tree / "x.png", 2, 3).read_bytes()[:20])  # cut in its header
    not_png = "is not a PNG (no PNG signature and IHDR chunk)"
    for cwd, call, said in [
        (training, lambda: image_shape_for_frame("velodyne/000002.bin"), f"image file 'image_2/000002.png' {not_png}"),
        (velodyne, lambda: image_shape_for_frame("000002.bin"), f"image file '../image_2/000002.png' {not_png}"),
        (velodyne, lambda: image_shape_for_frame("000002.bin", "../image_2/"),
         f"image file '../image_2/000002.png' {not_png}"),
        (training, lambda: image_shape_for_frame("velodyne/000134.bin"),
         "image file 'image_2/000134.png' is a broken symbolic link"),
        (training, lambda: image_shape_for_frame("velodyne/000009.bin"), f"image file 'image_2/000009.png' {not_png}"),
        (training, lambda: image_shape_for_frame(velodyne / "000002.bin"),
         f"image file '{images / '000002.png'}' {not_png}"),
        (training, lambda: image_shape_for_frame("velodyne/000002.bin", images),
         f"image file '{images / '000002.png'}' {not_png}"),
    ]:
        monkeypatch.chdir(cwd)
        with pytest.raises(InputError) as err:
            call()
        assert str(err.value).startswith(said), (said, str(err.value))
    monkeypatch.chdir(velodyne)
    assert image_path_for_frame("000135.bin") == Path("../image_2/000135.png")  # missing: None, named so in notes
    assert image_shape_for_frame("000135.bin") is None
    assert image_path_for_frame("000135.bin", "../../camera/") == Path("../../camera/000135.png")


def test_a_camera_image_whose_link_is_broken_is_refused_not_taken_for_none(kitti_tree: Path) -> None:
    """A frame's image_2 PNG linked to a drive not mounted, or in a link loop, was taken for no image: KITTI's
    usual size was assumed for its crop and 2D boxes, said only as a note that the frame had no camera image."""
    images = kitti_tree / "training" / "image_2"
    images.mkdir()
    (images / "000134.png").symlink_to(kitti_tree / "not-mounted" / "000134.png")
    with pytest.raises(InputError, match=r"000134\.png' is a broken symbolic link"):
        image_shape_for_frame(kitti_tree / "training" / "velodyne" / "000134.bin")
    (images / "000002.png").symlink_to("loop.png")
    (images / "loop.png").symlink_to("000002.png")
    with pytest.raises(InputError, match=r"000002\.png' cannot be read: Too many levels of symbolic links"):
        image_shape_for_frame(kitti_tree / "training" / "velodyne" / "000002.bin")
    assert image_shape_for_frame(kitti_tree / "training" / "velodyne" / "000003.bin") is None  # none: as before


@pytest.mark.parametrize("height, width", [(0xFFFFFFFF, 0xFFFFFFFF), (375, 2**31), (0, 1242)])
def test_a_png_header_of_a_size_no_png_has_is_refused(tmp_path: Path, height: int, width: int) -> None:
    """PNG sizes run from 1 to 2**31 - 1 a side: a header of other sizes (all 0xFF bytes, as damage leaves them) was
    taken as the camera image's size, so every box went unclipped and every point in front of the camera was kept."""
    png = real_png(tmp_path / "000134.png", 2, 3)
    data = bytearray(png.read_bytes())
    data[16:24] = struct.pack(">II", width, height)
    png.write_bytes(bytes(data))
    with pytest.raises(InputError) as err:
        read_png_size(png)
    assert str(err.value) == (f"image file {str(png)!r} says it is {width} x {height} pixels, which no PNG is (1 to "
                              f"{2**31 - 1} a side): a damaged header")
    assert read_png_size(real_png(tmp_path / "000000.png", 2, 3)) == (2, 3)


def test_a_label_files_byte_order_mark_is_dropped_and_bytes_that_are_no_utf8_are_refused(tmp_path: Path) -> None:
    """A BOM (Windows editors) made the first object's class '\\ufeffCar', which no evaluation counts; non-UTF-8
    bytes were replaced without a word."""
    line = "Car 0.00 0 -1.57 10.0 10.0 50.0 50.0 1.5 1.6 3.9 0.0 1.0 10.0 -1.57"
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text(line + "\n" + line + "\n")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    want = kitti_label_to_lidar_boxes(plain, simple_calib())
    got = kitti_label_to_lidar_boxes(marked, simple_calib())
    assert got.names == want.names == ["Car", "Car"]
    np.testing.assert_array_equal(got.boxes, want.boxes)
    broken = tmp_path / "broken.txt"
    broken.write_bytes(line.encode() + b"\n" + b"Car\xff" + line[3:].encode() + b"\n")
    with pytest.raises(InputError, match=r"broken\.txt'?, line 2: bytes that are no UTF-8 text \(byte \d+\)"):
        kitti_label_to_lidar_boxes(broken, simple_calib())


@pytest.mark.parametrize(("fields_after_type", "problem"), [
    ("5 0", r"truncated 5 lies outside 0\.\.1 \(-1: not given\)"),
    ("0.5 9", r"occluded 9 is no KITTI occlusion level 0, 1, 2 or 3 \(-1: not given\)"),
    ("0 0.5", "occluded 0.5 is no KITTI occlusion level"),
])
def test_truncation_and_occlusion_outside_kittis_levels_are_refused(fields_after_type: str, problem: str) -> None:
    """They decide an object's difficulty: truncation 5 or occlusion 9 moved a Car out of 'easy' without a word."""
    good = ["Car 0.12 1 -1.57 10 10 50 50 1.5 1.6 3.9 0 1 10 -1.57", "DontCare -1 -1 -10 1 1 5 5 -1 -1 -1 -1000 -1000 -1000 -10"]
    assert parse_label_lines(good, "labels", with_score=False)[0] == ["Car", "DontCare"]
    with pytest.raises(InputError, match=rf"labels, line 2: {problem}"):
        parse_label_lines([good[0], f"Car {fields_after_type} -1.57 10 10 50 50 1.5 1.6 3.9 0 1 10 -1.57"], "labels",
                          with_score=False)


def test_a_missing_label_file_of_an_unpadded_id_names_the_zero_padded_one(tmp_path: Path) -> None:
    """``eval --ids`` listing 0 looked up 0.txt, said missing without a word on the 000000.txt beside it; an id
    missing either way, or one padded already, is said missing as before."""
    from pointpillars_trt.kitti import read_label_file

    (tmp_path / "000000.txt").write_text("")
    with pytest.raises(InputError) as info:
        read_label_file(tmp_path / "0.txt", with_score=False)
    assert str(info.value) == (f"label file {str(tmp_path / '0.txt')!r} does not exist; '000000.txt' is there: KITTI "
                               "frame ids are zero-padded to 6 digits (give 000000, not 0)")
    for missing in ("7.txt", "000007.txt"):
        with pytest.raises(InputError) as info:
            read_label_file(tmp_path / missing, with_score=False)
        assert str(info.value) == f"label file {str(tmp_path / missing)!r} does not exist"
