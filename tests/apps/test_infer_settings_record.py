"""The settings record ``infer --out`` keeps in its folder: a ``--skip-existing`` run of other settings (another
model, other thresholds, another crop) is refused rather than mix outputs of both; a plain run into such a
folder says so; a model moved elsewhere is still itself. The tiny model (a model dir) on the CPU path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from out_folder import output_names
from pointpillars_trt.apps.run_settings import SETTINGS_FILE

from test_cli import LOOSE, Run, cli, one_car_labels, tiny_frames, tiny_model  # noqa: F401 (fixtures)


def infer(frames: list[Path], model: Path, out: Path, *extra: object) -> Run:
    return cli("infer", *frames, "--model", model, "--out", out, "--device", "cpu", "--no-progress", *LOOSE, *extra)


def files_of(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_resumed_run_of_other_thresholds_or_another_model_is_refused_and_changes_nothing(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert infer(tiny_frames[:3], tiny_model, out).rc == 0
    before = files_of(out)
    record = json.loads(before[SETTINGS_FILE])["settings"]
    assert record["--model"]["sha256"] == hashlib.sha256((tiny_model / "model.json").read_bytes()).hexdigest()
    assert record["--score-threshold"] == 0.005 and record["--max-boxes"] == 25 and record["--fov-only"] is None

    run = infer(tiny_frames, tiny_model, out, "--skip-existing", "--score-threshold", "0.2")  # the last one wins
    assert run.rc == 2 and run.err == (
        f"error: --skip-existing: the outputs in {str(out)!r} were made with other settings (--score-threshold 0.005 "
        "there, 0.2 now): resuming would mix outputs of both in one folder; run with the settings of those outputs, "
        "or give another --out\n"), run
    other = tmp_path / "other"  # the same config, other weights
    from tiny import tiny_model_dir

    tiny_model_dir(other, seed=4)
    run = infer(tiny_frames, other, out, "--skip-existing")
    assert run.rc == 2 and f"(--model {str(tiny_model)!r} there, {str(other)!r} now)" in run.err, run
    run = infer(tiny_frames, tiny_model, out, "--skip-existing", "--fov-only")
    assert run.rc == 2 and "(--fov-only not given there, True now)" in run.err, run
    assert files_of(out) == before


def test_the_same_model_moved_resumes_and_the_record_follows_it(tiny_model: Path, tiny_frames: list[Path],
                                                                tmp_path: Path) -> None:
    out, whole = tmp_path / "out", tmp_path / "whole"
    assert infer(tiny_frames[:3], tiny_model, out).rc == 0
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model, moved)
    run = infer(tiny_frames, moved, out, "--skip-existing")
    assert run.rc == 0 and "skipping 3 frame(s)" in run.err and run.out.startswith("4/4 frames"), run
    assert json.loads((out / SETTINGS_FILE).read_text())["settings"]["--model"]["path"] == str(moved)
    assert infer(tiny_frames, moved, whole).rc == 0
    assert {name: (out / name).read_bytes() for name in output_names(out)} == \
        {name: (whole / name).read_bytes() for name in output_names(whole)}


def test_a_plain_run_into_outputs_of_other_settings_says_so_and_records_its_own(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert infer(tiny_frames, tiny_model, out).rc == 0
    run = infer(tiny_frames[:1], tiny_model, out, "--max-boxes", "2")
    assert run.rc == 0, run
    assert [line for line in run.err.splitlines() if "other settings" in line] == [
        f"warning: {str(out)!r} holds outputs made with other settings (--max-boxes 25 there, 2 now); this run "
        "rewrites its own frames' outputs, and any other frames' stay as they were: give another --out to keep "
        "the two apart"]
    assert json.loads((out / SETTINGS_FILE).read_text())["settings"]["--max-boxes"] == 2
    again = infer(tiny_frames[:1], tiny_model, out, "--max-boxes", "2")  # the same settings: nothing to say
    assert again.rc == 0 and "other settings" not in again.err, again


def test_outputs_without_a_record_or_with_one_unreadable_are_resumed_with_a_note(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert infer(tiny_frames[:2], tiny_model, out).rc == 0
    (out / SETTINGS_FILE).unlink()  # outputs of a version that kept no record
    run = infer(tiny_frames[:3], tiny_model, out, "--skip-existing")
    assert run.rc == 0 and run.err.splitlines()[0] == (
        f"note: the record of the settings that made the outputs in {str(out)!r} ({SETTINGS_FILE}) is missing (an "
        "older version wrote them): the 2 frame(s) skipped are taken as made with this run's"), run
    assert (out / SETTINGS_FILE).is_file()  # the run's own frames went in with its settings
    (out / SETTINGS_FILE).unlink()
    (out / SETTINGS_FILE).mkdir()  # neither readable nor replaceable: said, and the frames still run
    run = infer(tiny_frames[:4], tiny_model, out, "--skip-existing")
    assert run.rc == 0 and run.out.startswith("1/1 frames"), run
    assert "cannot be read (" in run.err and f"warning: cannot record this run's settings in " \
        f"{str(out / SETTINGS_FILE)!r}" in run.err, run
    assert len(output_names(out)) == 4


def test_a_checkpoints_record_holds_the_sha256_of_its_bytes(assets: Path, tmp_path: Path) -> None:
    """A checkpoint is named by its bytes (taken from its export, not read again): independent of hashlib here."""
    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    frame = assets / "kitti" / "training" / "velodyne_fov" / "000001.bin"
    out = tmp_path / "out"
    run = cli("infer", frame, "--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    model = json.loads((out / SETTINGS_FILE).read_text())["settings"]["--model"]
    assert model == {"path": str(checkpoint), "sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
                     "config": None, "precision": "fp32"}
    run = cli("infer", frame, "--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress",
              "--skip-existing", "--precision", "fp16")
    assert run.rc == 2 and f"(--model another model there, {str(checkpoint)!r} now)" in run.err, run


def test_eval_of_the_folder_takes_its_outputs_not_the_record(tiny_model: Path, tiny_frames: list[Path],
                                                             tmp_path: Path) -> None:
    """``eval --pred`` of a JSON folder infer wrote: the record, a hidden .json, is no prediction."""
    out = tmp_path / "out"
    assert infer(tiny_frames[:2], tiny_model, out).rc == 0
    assert (out / SETTINGS_FILE).is_file()
    labels = one_car_labels(tmp_path, tiny_frames[:2])
    run = cli("eval", "--pred", out, "--labels", labels, "--calib", tiny_frames[0].parent.parent / "calib")
    assert run.rc == 0 and run.out.startswith("2 frames, predictions "), run
