"""The two shapes a model assumes, read from its config: point columns and box code size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.config import config_from_dict, load_config
from pointpillars_trt.errors import ConfigError, InputError
from pointpillars_trt.pointcloud_io import read_points
from pointpillars_trt.points import as_host_points
from pointpillars_trt.reference import voxelize
from test_config import edited

# The digests both KITTI families had before the shapes became config fields (main 3f14a80): model
# dirs and plans built then must keep matching.
KITTI_DIGESTS = {"openpcdet_kitti_3class": "8489c6b29aa62db6", "zhulf0804_kitti_3class": "1db17f31ba726713"}
TIME_FEATURES = ["x", "y", "z", "intensity", "time", "mean_dx", "mean_dy", "mean_dz",
                 "center_dx", "center_dy", "center_dz"]


@pytest.mark.parametrize("name", sorted(KITTI_DIGESTS))
def test_kitti_families_keep_their_digests(name: str) -> None:
    cfg = load_config(name)
    assert cfg.digest() == KITTI_DIGESTS[name]
    assert cfg.num_point_columns == 4 and cfg.box_code_size == 7
    assert "point_columns" not in cfg.to_dict()
    assert config_from_dict(cfg.to_dict()) == cfg


def five_columns(**more: Any) -> dict[str, Any]:
    return edited({"point_columns": ["x", "y", "z", "intensity", "time"], "features.order": TIME_FEATURES, **more})


def test_a_time_column_is_a_new_identity() -> None:
    cfg = config_from_dict(five_columns())
    assert cfg.num_point_columns == 5 and cfg.features.channels == 11
    assert cfg.to_dict()["point_columns"] == ("x", "y", "z", "intensity", "time")
    assert config_from_dict(cfg.to_dict()) == cfg
    assert cfg.digest() != KITTI_DIGESTS["openpcdet_kitti_3class"]


@pytest.mark.parametrize("changes, message", [
    ({"features.order": TIME_FEATURES},
     "<dict>: features.order: time is not a point column (point_columns: x, y, z, intensity)"),
    ({"point_columns": ["x", "y", "intensity", "z"]},
     "<dict>: point_columns: expected a prefix of x, y, z, intensity, time starting with x, y, z, intensity, "
     "got ['x', 'y', 'intensity', 'z']"),
    ({"point_columns": ["x", "y", "z"]}, "<dict>: point_columns: expected a list of 4..5 items, got ['x', 'y', 'z']"),
    ({"point_columns": ["x", "y", "z", "intensity", "ring"]},
     "<dict>: point_columns[4]: expected one of x, y, z, intensity, time, got 'ring'"),
])
def test_point_columns_are_validated(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(edited(changes))
    assert str(info.value) == message


def test_host_points_keep_the_model_columns() -> None:
    frame = np.arange(12, dtype=np.float64).reshape(2, 6)
    assert as_host_points(frame, columns=5).tolist() == frame[:, :5].tolist()
    with pytest.raises(InputError, match=r"frame: the model reads an \(N, 5\) array of x, y, z, intensity, time, "
                                         r"got 4 columns per point"):
        as_host_points(frame[:, :4], "frame", columns=5)


def test_bin_frames_keep_the_model_columns(tmp_path: Path) -> None:
    rows = np.arange(10, dtype=np.float32).reshape(2, 5)
    rows[:, 4] /= 100  # time lags
    path = tmp_path / "f.bin"
    rows.tofile(path)
    assert read_points(path, point_dim=5, columns=5).tolist() == rows.tolist()
    assert read_points(path, point_dim=5).tolist() == rows.tolist()  # point_dim 5: the time column too
    assert read_points(path, point_dim=5, columns=4).tolist() == rows[:, :4].tolist()
    with pytest.raises(InputError, match=r"point_dim 4: the model reads 5 values a point \(x, y, z, intensity, time\); "
                                         r"files of 5 values a point are read with point_dim 5 \(--point-dim 5\); a multi-sweep "
                                         r"model needs accumulated frames, each point's 5th value its time lag .*PointPillars.accumulate"):
        read_points(path, point_dim=4, columns=5)


def test_voxelize_carries_the_time_column() -> None:
    cfg = config_from_dict(five_columns())
    # two points in pillar (ix 1, iy 248), one in (ix 0, iy 248); their time lags are 0.05, 0.1, 0.
    points = np.array([[0.2, 0.01, 0.0, 0.5, 0.05], [0.01, 0.02, 0.0, 0.6, 0.0], [0.25, 0.03, 0.0, 0.7, 0.1]],
                      np.float32)
    pillars = voxelize(points, cfg)
    assert pillars.coords[:, 3].tolist() == [1, 0]
    time = pillars.features[..., TIME_FEATURES.index("time")]
    assert time[0, :2].tolist() == [np.float32(0.05), np.float32(0.1)] and time[1, 0] == 0
    assert np.all(time[0, 2:] == 0) and np.all(time[1, 1:] == 0)
    with pytest.raises(InputError, match=r"shape \(N, 5\) \(x, y, z, intensity, time\)"):
        voxelize(points[:, :4].copy(), cfg)
