"""``build --pcdet-config`` records the dataset config's FOV_POINTS_ONLY in the model dir, and infer's
camera-FOV default follows it.

Oracles: OpenPCDet's own kitti_dataset.yaml (FOV_POINTS_ONLY: True), the model.json the build
writes, and infer's outputs with the policy given explicitly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_pcdet_config import POINTPILLAR, _pcdet_yaml

from pointpillars_trt.apps.cli import main
from pointpillars_trt.convert.pcdet_config import pcdet_dataset_facts
from pointpillars_trt.errors import ConfigError, ModelDirError
from pointpillars_trt.model_dir import load_model_dir

CHECKPOINT = "checkpoints/pointpillar_openpcdet_synthetic.pth"
FOV_NOTE = "only the points the camera sees are detected on"


def test_dataset_facts_of_pcdet_configs(tmp_path: Path) -> None:
    assert pcdet_dataset_facts(POINTPILLAR) == {"fov_points_only": True}  # OpenPCDet's KITTI dataset config
    assert pcdet_dataset_facts(_pcdet_yaml(tmp_path / "off", {"DATA_CONFIG.FOV_POINTS_ONLY": False})) == {
        "fov_points_only": False}
    with pytest.raises(ConfigError, match=r"DATA_CONFIG\.FOV_POINTS_ONLY is 'yes'; supported: True or False"):
        pcdet_dataset_facts(_pcdet_yaml(tmp_path / "bad", {"DATA_CONFIG.FOV_POINTS_ONLY": "yes"}))


def run(*argv: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


@pytest.mark.slow
def test_model_trained_on_full_scans_is_not_cropped_by_default(assets: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    yaml_path = _pcdet_yaml(tmp_path / "cfg", {"DATA_CONFIG.FOV_POINTS_ONLY": False})
    model = tmp_path / "model"
    assert run("build", "--checkpoint", assets / CHECKPOINT, "--pcdet-config", yaml_path, "--out", model,
               capsys=capsys)[0] == 0
    assert json.loads((model / "model.json").read_text())["dataset"] == {"fov_points_only": False}
    assert load_model_dir(model).fov_points_only is False
    training = tmp_path / "kitti" / "training"
    (training / "velodyne").mkdir(parents=True)
    shutil.copy(assets / "kitti/training/velodyne/000001.bin", training / "velodyne")
    shutil.copytree(assets / "kitti/training/calib", training / "calib")
    frame = training / "velodyne" / "000001.bin"
    outputs = {}
    for name, flags in (("default", ()), ("full", ("--no-fov-only",)), ("crop", ("--fov-only",))):
        rc, err = run("infer", frame, "--model", model, "--device", "cpu", "--format", "kitti", "--out",
                      tmp_path / name, *flags, capsys=capsys)
        assert rc == 0 and FOV_NOTE not in err, err
        trained_full = "note: KITTI output: the full scans are detected on" in err
        assert trained_full is (name == "default"), err  # said when it is the default's doing
        outputs[name] = (tmp_path / name / "000001.txt").read_text()
    assert outputs["default"] == outputs["full"] != outputs["crop"]


def test_model_json_dataset_facts_are_checked(tmp_path: Path) -> None:
    from tiny import tiny_model_dir

    model = Path(tiny_model_dir(tmp_path / "m").path)
    assert load_model_dir(model).fov_points_only is None  # nothing recorded
    meta = json.loads((model / "model.json").read_text())
    for bad in ({"fov_points_only": "yes"}, {"shuffle": True}, ["fov_points_only"]):
        (model / "model.json").write_text(json.dumps({**meta, "dataset": bad}))
        with pytest.raises(ModelDirError, match="malformed"):
            load_model_dir(model)
