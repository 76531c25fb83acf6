"""KITTI I/O: .bin frames, calib, label_2 lines both ways."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import InputError
from pointpillars_trt.kitti import (
    Calibration,
    kitti_label_to_lidar_boxes,
    lidar_boxes_to_kitti_lines,
    read_calibration,
    read_velodyne_bin,
    write_velodyne_bin,
)

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
def test_read_velodyne_bin_real_frames(assets: Path, rel: str, size: int, count: int) -> None:
    path = assets / rel
    assert path.stat().st_size == size == count * 16
    pts = read_velodyne_bin(path)
    assert pts.shape == (count, 4) and pts.dtype == np.float32
    raw = np.frombuffer(path.read_bytes(), dtype="<f4").reshape(count, 4)
    np.testing.assert_array_equal(pts, raw)
    assert np.isfinite(pts).all()
    assert pts[:, 3].min() >= 0.0 and pts[:, 3].max() <= 0.99 + 1e-6


def test_read_velodyne_bin_size_not_multiple_of_16(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 17)
    with pytest.raises(InputError) as err:
        read_velodyne_bin(bad)
    msg = str(err.value)
    assert str(bad) in msg and "17 bytes" in msg and "multiple of 16" in msg and "\n" not in msg


def test_read_velodyne_bin_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_velodyne_bin(tmp_path / "nope.bin")


def test_read_velodyne_bin_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        read_velodyne_bin(tmp_path)


def test_read_velodyne_bin_empty_file_is_an_empty_frame(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    pts = read_velodyne_bin(empty)
    assert pts.shape == (0, 4) and pts.dtype == np.float32


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_read_velodyne_bin_unreadable(tmp_path: Path) -> None:
    locked = tmp_path / "locked.bin"
    locked.write_bytes(b"\0" * 16)
    locked.chmod(0)
    with pytest.raises(InputError, match="cannot be read"):
        read_velodyne_bin(locked)


def test_velodyne_bin_values_pass_through_unvalidated(tmp_path: Path) -> None:
    pts = np.array([[1, 2, 3, 0.5], [np.nan, 0, np.inf, -1]], dtype=np.float32)
    path = tmp_path / "x.bin"
    write_velodyne_bin(pts, path)
    np.testing.assert_array_equal(read_velodyne_bin(path), pts)
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


def test_calibration_transforms_are_inverse_and_project(assets: Path) -> None:
    calib = read_calibration(assets / CALIBS[0])
    hand = parse_calib_by_hand(assets / CALIBS[0])
    pts = np.random.default_rng(0).uniform([1, -20, -2], [60, 20, 1], (50, 3))
    rect = calib.lidar_to_rect(pts)
    m = velo_to_rect_by_hand(hand)
    for p, r in zip(pts, rect):
        np.testing.assert_allclose(r, (m @ np.append(p, 1))[:3], atol=1e-9)
    np.testing.assert_allclose(calib.rect_to_lidar(rect), pts, atol=1e-9)
    p2 = hand["P2"].reshape(3, 4)
    for r, uv in zip(rect, calib.rect_to_image(rect)):
        u, v, w = p2 @ np.append(r, 1)
        np.testing.assert_allclose(uv, [u / w, v / w], atol=1e-9)


def test_read_calibration_errors(tmp_path: Path, assets: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_calibration(tmp_path / "none.txt")
    good = (assets / CALIBS[0]).read_text().splitlines()
    no_r0 = tmp_path / "no_r0.txt"
    no_r0.write_text("\n".join(line for line in good if not line.startswith("R0_rect")))
    with pytest.raises(InputError, match=r"no_r0\.txt: key R0_rect is missing"):
        read_calibration(no_r0)
    short = tmp_path / "short.txt"
    short.write_text("\n".join(line.rsplit(" ", 1)[0] if line.startswith("P2") else line for line in good))
    with pytest.raises(InputError, match=r"short\.txt: key P2 has 11 values, expected 12"):
        read_calibration(short)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(line.replace("P2: 7", "P2: x") for line in good))
    with pytest.raises(InputError, match=r"text\.txt: key P2 has a non-numeric value"):
        read_calibration(text)


# --------------------------------------------------------------------------- label_2 lines

@pytest.fixture(scope="module")
def calib134(assets: Path) -> Calibration:
    return read_calibration(assets / "kitti/training/calib/000134.txt")


def test_lines_match_an_independent_computation(assets: Path, calib134: Calibration) -> None:
    hand = parse_calib_by_hand(assets / "kitti/training/calib/000134.txt")
    m, p2 = velo_to_rect_by_hand(hand), hand["P2"].reshape(3, 4)
    boxes = random_boxes(20, seed=1)
    boxes[:, 0] = np.abs(boxes[:, 0]) + 5  # in front of the camera, so the projection is sane
    scores = np.linspace(0.95, 0.1, 20)
    names = ["Car", "Pedestrian", "Cyclist", "Van"] * 5
    lines = lidar_boxes_to_kitti_lines(boxes, scores, names, calib134)
    assert len(lines) == 20
    for line, box, score, name in zip(lines, boxes, scores, names):
        f = line.split()
        assert f[:3] == [name, "-1", "-1"] and len(f) == 16
        assert all(len(v.split(".")[1]) == 4 for v in f[3:])
        v = [float(x) for x in f[3:]]
        alpha, bbox, (h, w, l), loc, ry, sc = v[0], v[1:5], v[5:8], v[8:11], v[11], v[12]
        x, y, z, dx, dy, dz, heading = box
        exp_loc = (m @ [x, y, z - dz / 2, 1])[:3]
        exp_ry = wrap(-heading - math.pi / 2)
        exp_alpha = wrap(-math.atan2(-y, x) + exp_ry)
        np.testing.assert_allclose(loc, exp_loc, atol=6e-5)
        np.testing.assert_allclose([h, w, l], [dz, dy, dx], atol=6e-5)
        assert abs(ry - exp_ry) < 6e-5 and abs(alpha - exp_alpha) < 6e-5 and abs(sc - score) < 6e-5
        assert -math.pi <= ry < math.pi and -math.pi <= alpha < math.pi
        corners = camera_corners_by_hand(exp_loc[0], exp_loc[1], exp_loc[2], dx, dz, dy, exp_ry)
        uvw = (p2 @ np.column_stack([corners, np.ones(8)]).T).T
        uv = uvw[:, :2] / uvw[:, 2:]
        np.testing.assert_allclose(bbox, [*uv.min(0), *uv.max(0)], atol=6e-5, rtol=1e-7)


def test_lines_clip_2d_box_to_image(calib134: Calibration) -> None:
    boxes = random_boxes(30, seed=2)
    boxes[:, 0] = np.abs(boxes[:, 0]) + 3
    names = ["Car"] * 30
    free = lidar_boxes_to_kitti_lines(boxes, np.ones(30), names, calib134)
    clipped = lidar_boxes_to_kitti_lines(boxes, np.ones(30), names, calib134, image_shape=(370, 1224))
    for a, b in zip(free, clipped):
        fa, fb = np.array(a.split()[4:8], float), np.array(b.split()[4:8], float)
        exp = np.clip(fa, 0, [1223, 369, 1223, 369])
        np.testing.assert_allclose(fb, exp, atol=1e-4)
        assert a.split()[8:] == b.split()[8:]
    assert any(a != b for a, b in zip(free, clipped))  # some boxes do leave the image


def test_lines_empty_and_mismatched(calib134: Calibration) -> None:
    assert lidar_boxes_to_kitti_lines(np.zeros((0, 7)), np.zeros(0), [], calib134) == []
    with pytest.raises(InputError, match="expected the same count"):
        lidar_boxes_to_kitti_lines(np.zeros((2, 7)), np.zeros(2), ["Car"], calib134)
    with pytest.raises(InputError, match=r"\(N, 7\)"):
        lidar_boxes_to_kitti_lines(np.zeros((2, 8)), np.zeros(2), ["Car"] * 2, calib134)


def test_round_trip_lidar_lines_lidar(calib134: Calibration) -> None:
    boxes = random_boxes(40, seed=3)
    scores = np.random.default_rng(4).uniform(0.1, 1, 40)
    names = ["Car", "Pedestrian"] * 20
    lines = lidar_boxes_to_kitti_lines(boxes, scores, names, calib134)
    back = kitti_label_to_lidar_boxes(lines, calib134)
    assert back.names == names
    assert back.boxes.shape == (40, 7) and back.boxes.dtype == np.float32
    np.testing.assert_allclose(back.boxes[:, :6], boxes[:, :6], atol=1e-2)
    dh = (back.boxes[:, 6] - boxes[:, 6] + math.pi) % (2 * math.pi) - math.pi
    assert np.abs(dh).max() < 1e-2
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


def test_label_round_trip_to_lines(assets: Path, calib134: Calibration) -> None:
    label = assets / "kitti/training/label_2/000134.txt"
    got = kitti_label_to_lidar_boxes(label, calib134)
    lines = lidar_boxes_to_kitti_lines(got.boxes, np.ones(len(got.names)), got.names, calib134)
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
