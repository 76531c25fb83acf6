"""A checkpoint trained with other classes or anchors gets one short line saying so and what to pass.

Oracle: the shared synthetic checkpoints with their heads redrawn for 4 classes x 2 rotations
(8 anchors: 32 class, 56 box and 16 direction channels), written by the test's own torch writer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _torch_writer import write_legacy, write_zip

from pointpillars_trt.apps.cli import main
from pointpillars_trt.convert.checkpoint import load_checkpoint
from pointpillars_trt.convert.pth import read_pth
from pointpillars_trt.errors import CheckpointError

HEADS = {"openpcdet": ("dense_head.conv_cls", "dense_head.conv_box", "dense_head.conv_dir_cls"),
         "zhulf0804": ("head.conv_cls", "head.conv_reg", "head.conv_dir_cls")}
FILES = {"openpcdet": "pointpillar_openpcdet_synthetic.pth", "zhulf0804": "pointpillars_zhulf0804_synthetic.pth"}


def four_class_checkpoint(assets: Path, layout: str, out: Path) -> Path:
    raw = read_pth(assets / "checkpoints" / FILES[layout])
    state = dict(raw["model_state"] if layout == "openpcdet" else raw)
    rng = np.random.default_rng(0)
    for prefix, channels in zip(HEADS[layout], (32, 56, 16)):
        state[f"{prefix}.weight"] = rng.normal(0, 0.01, (channels, 384, 1, 1)).astype(np.float32)
        state[f"{prefix}.bias"] = np.zeros(channels, np.float32)
    if layout == "openpcdet":
        return write_legacy({**raw, "model_state": state}, out)
    return write_zip(state, out)


@pytest.mark.parametrize("layout", sorted(FILES))
def test_other_head_channels_say_other_classes(assets: Path, tmp_path: Path, layout: str) -> None:
    path = four_class_checkpoint(assets, layout, tmp_path / "four.pth")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    text = str(info.value)
    assert "\n" not in text and len(text) < 400 and str(path) in text, text
    assert "looks like a model trained with other classes/anchors" in text
    assert f"{HEADS[layout][0]} has 32 output channels" in text and "18" in text
    assert ("--pcdet-config <your model yaml>" if layout == "openpcdet" else "--config <") in text


def test_build_of_a_four_class_checkpoint_is_one_short_line(assets: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = four_class_checkpoint(assets, "openpcdet", tmp_path / "four.pth")
    assert main(["build", "--checkpoint", str(path), "--out", str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--pcdet-config" in err[0] and "..." not in err[0], err
    assert not (tmp_path / "model").exists()
