"""A file or folder named with a newline and an ESC is named escaped in every reader's and loader's error: the
message stays one line (the Python API's exception text too, not only the CLI's ``error:`` line) and no escape
sequence in a name reaches the terminal. The status lines of what a command wrote or found (``wrote ...``,
--skip-existing's) name such a folder escaped too, unquoted (an ordinary name prints as it is), and the messages
naming a served detector's or a Ray cluster's address name one given so escaped."""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from pointpillars_trt.apps.cli import build_parser, main
from pointpillars_trt.apps.distributed import _check_reachable
from pointpillars_trt.apps.eval.cli import run_eval
from pointpillars_trt.apps.resume import Resume, earlier_failures, say_resume
from pointpillars_trt.apps.serve.client import RemoteDetector
from pointpillars_trt.config import build_command, load_config
from pointpillars_trt.convert.checkpoint import load_checkpoint
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.convert.pcdet_config import config_from_pcdet_yaml
from pointpillars_trt.errors import PointPillarsError
from pointpillars_trt.kitti import read_calibration, read_label_file
from pointpillars_trt.model_dir import load_model_dir
from pointpillars_trt.pointcloud_io import read_points
from pointpillars_trt.runtime.backends import open_engine
from pointpillars_trt.runtime.options import OrtOptions
from tiny import tiny_config, tiny_model_dir, tiny_weights

ODD = "odd\n\x1b[31mname"  # a line break, then the ANSI sequence that turns a terminal's text red
SHOWN = "odd\\n\\x1b[31mname"  # the name as a message shows it


def shown(path: Path) -> str:
    """``path`` as a status line names it: its newline and ESC as escapes, unquoted, the rest as it is."""
    return str(path).replace("\n", "\\n").replace("\x1b", "\\x1b")


def _model_dir(tmp: Path) -> Path:
    return tiny_model_dir(tmp / ODD).path


def _yaml(tmp: Path, text: str) -> Path:
    path = tmp / f"{ODD}.yaml"
    path.write_text(text)
    return path


def _folder(tmp: Path, *files: tuple[str, str]) -> Path:
    folder = tmp / ODD
    folder.mkdir()
    for name, text in files:
        (folder / name).write_text(text)
    return folder


def _without_graph(tmp: Path) -> Path:
    folder = _model_dir(tmp)
    (folder / "rpn.onnx").unlink()
    return folder


def _eval_args(labels: Path) -> argparse.Namespace:
    return build_parser().parse_args(["eval", "--pred", str(labels), "--labels", str(labels)])


# each: what the user gives (made in a temporary folder) -> the call that refuses it
CASES: dict[str, Callable[[Path], object]] = {
    "model dir missing": lambda tmp: load_model_dir(tmp / ODD),
    "model dir without model.json": lambda tmp: load_model_dir(_folder(tmp)),
    "model dir of a broken model.json": lambda tmp: load_model_dir(_folder(tmp, ("model.json", "{"))),
    "model dir of another config": lambda tmp: load_model_dir(_model_dir(tmp), tiny_config("zhulf0804")),
    "model dir of a missing graph": lambda tmp: load_model_dir(_without_graph(tmp)),
    "build into a foreign folder": lambda tmp: export_model_dir(
        tiny_weights(tiny_config()), tiny_config(), _folder(tmp, ("notes.txt", "mine")), precision="fp32",
        source={"tiny": True}),
    "config YAML missing": lambda tmp: load_config(tmp / f"{ODD}.yaml"),
    "config YAML malformed": lambda tmp: load_config(_yaml(tmp, "name: [")),
    "config YAML invalid": lambda tmp: load_config(_yaml(tmp, "name: x\n")),
    "config YAML of OpenPCDet": lambda tmp: load_config(_yaml(tmp, "CLASS_NAMES: [Car]\nMODEL: {NAME: PointPillar}\n")),
    "OpenPCDet YAML of a missing base": lambda tmp: config_from_pcdet_yaml(
        _yaml(tmp, yaml.safe_dump({"_BASE_CONFIG_": "cfgs/none.yaml"}))),
    "OpenPCDet YAML of an unknown key": lambda tmp: config_from_pcdet_yaml(
        _yaml(tmp, yaml.safe_dump({"DATA_CONFIG": {}, "MODEL": {"NAME": "PointPillar", ODD: 1}}))),
    "point file": lambda tmp: read_points(_folder(tmp) / "frame.bin"),
    "label file": lambda tmp: read_label_file(_folder(tmp, ("000000.txt", "Car 0 0\n")) / "000000.txt",
                                              with_score=False),
    "calib file": lambda tmp: read_calibration(_folder(tmp, ("000000.txt", "P2: 1 2\n")) / "000000.txt"),
    "eval label folder missing": lambda tmp: run_eval(_eval_args(tmp / ODD)),
    "checkpoint missing": lambda tmp: load_checkpoint(tmp / f"{ODD}.pth"),
    "checkpoint that is a model dir": lambda tmp: load_checkpoint(_model_dir(tmp)),
    "ONNX graph missing": lambda tmp: open_engine(tmp / ODD / "rpn.onnx", OrtOptions(), device="cpu"),
    "served detector's address": lambda tmp: RemoteDetector(f"{ODD}:8001", timeout=5),
    "Ray cluster's address": lambda tmp: _check_reachable(f"{ODD}:6379"),
}
#: the cases whose call needs an optional library (the scale-out extra): skipped without it
NEEDS = {"served detector's address": "tritonclient.grpc"}


@pytest.mark.parametrize("case", CASES)
def test_an_odd_name_is_named_escaped_in_one_line(case: str, tmp_path: Path) -> None:
    if case in NEEDS:
        pytest.importorskip(NEEDS[case], reason=f"{NEEDS[case]} not installed (pip install -e '.[test-scaleout]')")
    with pytest.raises((PointPillarsError, OSError, ValueError)) as info:
        CASES[case](tmp_path)
    message = str(info.value)
    assert message.isprintable(), message  # no newline, ESC or other control character
    assert SHOWN in message, message  # the file is still named


def test_a_fix_command_names_an_odd_path_as_one_shell_word(tmp_path: Path) -> None:
    """A command a message tells to run stays one line and runs as shown: bash reads each word back as the path."""
    command = build_command(tmp_path / f"{ODD}.pth", tmp_path / ODD)
    assert command.isprintable(), command
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {command.strip('`')}"], capture_output=True,
                           check=True).stdout.split(b"\0")[:-1]
    assert [os.fsdecode(word) for word in words] == ["pointpillars-trt", "build", "--checkpoint",
                                                     str(tmp_path / f"{ODD}.pth"), "--out", str(tmp_path / ODD)]


def printed_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What was printed since the last call, stdout's lines then stderr's, each checked to be one terminal-safe
    line."""
    captured = capsys.readouterr()
    lines = captured.out.splitlines() + captured.err.splitlines()
    assert all(line.isprintable() for line in lines), lines
    return lines


def test_the_outputs_written_are_named_escaped(assets: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """build's, serve's and eval's ``wrote`` lines name what they wrote escaped, each still one line."""
    model = tmp_path / ODD / "model"
    assert main(["build", "--checkpoint", str(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"),
                 "--out", str(model)]) == 0
    assert printed_lines(capsys)[0] == f"wrote {shown(model)} (openpcdet_kitti_3class, fp32, onnxruntime)"
    repository = tmp_path / ODD / "repository"
    assert main(["serve", "--model", str(model), "--repository", str(repository), "--device", "cpu",
                 "--repository-only"]) == 0
    assert printed_lines(capsys) == [f"wrote {shown(repository / 'pointpillars')} (openpcdet_kitti_3class, fp32)"]
    labels, pred = tmp_path / "labels", tmp_path / "pred"
    for folder, score in ((labels, ""), (pred, " 0.9")):
        folder.mkdir()
        (folder / "000000.txt").write_text(f"Car 0 0 0 100 150 180 210 1.5 1.6 3.9 -12 1.6 20 0.3{score}\n")
    report = tmp_path / ODD / "ap.json"
    assert main(["eval", "--pred", str(pred), "--labels", str(labels), "--json", str(report)]) == 0
    assert printed_lines(capsys)[-1] == f"wrote {shown(report)}"


def test_resume_lines_name_an_odd_out_folder_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each line --skip-existing and --retry-failed print of what they found in --out names it escaped."""
    out = _folder(tmp_path)
    say_resume(Resume([], skipped=["a.bin"], failed_before=["a.bin"], unpictured=[out / "a.png"],
                      redone=[out / "b.json"]), "jsonl", out, retry=False)
    earlier_failures(["a.bin"], "jsonl", out, retry=True, skipped=0)
    lines = printed_lines(capsys)
    assert len(lines) == 5 and all(f" in {shown(out)}" in line for line in lines), lines


def test_status_lines_keep_a_non_ascii_name_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only what a terminal would not print is escaped: a folder named in letters beyond ASCII reads as the user
    named it."""
    out = tmp_path / "zoë_激光"
    earlier_failures(["a.bin"], "jsonl", out, retry=True, skipped=0)
    lines = printed_lines(capsys)
    assert lines and all(f" in {out}" in line for line in lines), lines
