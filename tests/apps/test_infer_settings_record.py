"""The settings record ``infer --out`` keeps in its folder: a ``--skip-existing`` run of other settings (another
model, other thresholds, another crop) is refused rather than mix outputs of both; defaults given explicitly are
the same settings; a plain run that leaves outputs of other settings beside its own says so and marks the folder
mixed; a model moved elsewhere, or a checkpoint and the model dir built from it, is one model. The tiny model
(a model dir) on the CPU path, and the synthetic checkpoint where a checkpoint is the point."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path

from out_folder import output_names
from pointpillars_trt.apps.run_settings import SETTINGS_FILE
from pointpillars_trt.model_dir import load_model_dir

from test_cli import LOOSE, Run, cli, one_car_labels, tiny_frames, tiny_model  # noqa: F401 (fixtures)


def infer(frames: list[Path], model: Path, out: Path, *extra: object) -> Run:
    return cli("infer", *frames, "--model", model, "--out", out, "--device", "cpu", "--no-progress", *LOOSE, *extra)


def files_of(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def record_of(out: Path, fmt: str = "json") -> dict[str, object]:
    """The record's entry of ``fmt`` outputs: their settings, and whether they are mixed."""
    return json.loads((out / SETTINGS_FILE).read_text())["outputs"][fmt]


def test_a_resumed_run_of_other_thresholds_another_model_or_crop_is_refused_and_changes_nothing(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert infer(tiny_frames[:3], tiny_model, out).rc == 0
    before = files_of(out)
    settings = record_of(out)["settings"]
    meta = json.loads((tiny_model / "model.json").read_text())  # what the record names the model by, read apart
    assert settings["--model"] == {"path": str(tiny_model), "weights": meta["source"], "config": meta["config_digest"],
                                   "config_name": meta["config"]["name"], "precision": meta["precision"]}
    assert settings["--score-threshold"] == 0.005 and settings["--max-boxes"] == 25 and settings["--fov-only"] is False
    assert settings["--point-dim"] == 4 and settings["--intensity-scale"] == 1.0

    run = infer(tiny_frames, tiny_model, out, "--skip-existing", "--score-threshold", "0.2")  # the last one wins
    assert run.rc == 2 and run.err.splitlines()[-1] == (
        f"error: --skip-existing: the outputs in {str(out)!r} were made with other settings (--score-threshold 0.005 "
        "there, 0.2 now): resuming would mix outputs of both in one folder; run with the settings of those outputs "
        "(pass --score-threshold 0.005), or give another --out"), run
    other = tmp_path / "other"  # the same config, other weights
    from tiny import tiny_model_dir

    tiny_model_dir(other, seed=4)
    run = infer(tiny_frames, other, out, "--skip-existing")
    assert run.rc == 2 and f"(--model {str(tiny_model)!r} there, {str(other)!r} now: other weights)" in run.err, run
    run = infer(tiny_frames, tiny_model, out, "--skip-existing", "--fov-only")  # options named as typed, with the fix
    assert run.rc == 2 and "(--no-fov-only there, --fov-only now): " in run.err and \
        "run with the settings of those outputs (pass --no-fov-only), or give another --out" in run.err, run
    run = infer(tiny_frames, tiny_model, out, "--skip-existing", "--fov-only", "--intensity-scale", "2",
                "--image-shape", "370,1224", "--max-boxes", "3")
    assert run.rc == 2 and run.err.splitlines()[-1].endswith(
        "(--max-boxes 25 there, 3 now; --intensity-scale 1.0 there, 2.0 now; --no-fov-only there, --fov-only now; "
        "and 1 more): resuming would mix outputs of both in one folder; run with the settings of those outputs (pass "
        "--max-boxes 25 --intensity-scale 1.0 --no-fov-only, drop --image-shape), or give another --out"), run
    assert files_of(out) == before


def refused_fix(run: Run) -> list[str]:
    """The options a refused resume's error line says to pass, as a shell splits them."""
    last = run.err.splitlines()[-1]
    assert run.rc == 2 and last.startswith("error: --skip-existing: ") and "(pass " in last, run
    return shlex.split(last[last.rindex("(pass ") + len("(pass "):last.rindex("), or give another --out")])


def test_the_fix_of_a_resume_refused_for_another_model_names_that_model_and_resumes(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    """The options that run the kept outputs' settings again name their model with the rest: the fix named the
    other options alone, and a run that followed it was refused again."""
    out, whole, other = tmp_path / "out", tmp_path / "whole", tmp_path / "other"
    from tiny import tiny_model_dir

    tiny_model_dir(other, seed=4)  # the same config, other weights
    assert infer(tiny_frames[:2], tiny_model, out, "--max-boxes", "2").rc == 0
    run = infer(tiny_frames[:3], other, out, "--skip-existing")
    assert f"(--model {str(tiny_model)!r} there, {str(other)!r} now: other weights; --max-boxes 2 there, 25 now)" in \
        run.err, run
    assert refused_fix(run) == ["--model", str(tiny_model), "--max-boxes", "2"]
    run = infer(tiny_frames[:3], other, out, "--skip-existing", *refused_fix(run))  # added as told: the last wins
    assert run.rc == 0 and "skipping 2 frames" in run.err and run.out.startswith("1/1 frames"), run
    assert infer(tiny_frames[:3], tiny_model, whole, "--max-boxes", "2").rc == 0
    assert {name: (out / name).read_bytes() for name in output_names(out)} == \
        {name: (whole / name).read_bytes() for name in output_names(whole)}


def test_the_fix_of_a_resume_refused_for_another_precision_of_a_checkpoint_is_that_precision(
        assets: Path, tmp_path: Path) -> None:
    """A checkpoint exported in fp16, resumed with the default fp32: the fix is --precision (there was none)."""
    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    frames = sorted((assets / "kitti" / "training" / "velodyne_fov").glob("*.bin"))[:2]
    out = tmp_path / "out"
    common = ("--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress")
    assert cli("infer", frames[0], *common, "--precision", "fp16").rc == 0
    run = cli("infer", *frames, *common, "--skip-existing")
    assert "precision fp16 there, fp32 now" in run.err and refused_fix(run) == ["--precision", "fp16"], run
    run = cli("infer", *frames, *common, "--skip-existing", *refused_fix(run))
    assert run.rc == 0 and "skipping 1 frame whose" in run.err, run


def test_defaults_given_explicitly_are_the_same_settings(tiny_model: Path, tiny_frames: list[Path],
                                                         tmp_path: Path) -> None:
    """KITTI lines of the tiny model: its point columns, scale 1, the frames' sibling calib/ and the camera-view
    crop KITTI output takes by default, given by hand, resume the folder made without them."""
    out, whole = tmp_path / "out", tmp_path / "whole"
    calib = tiny_frames[0].parent.parent / "calib"
    assert infer(tiny_frames[1:3], tiny_model, out, "--format", "kitti").rc == 0
    run = infer(tiny_frames[1:4], tiny_model, out, "--format", "kitti", "--skip-existing", "--point-dim", "4",
                "--intensity-scale", "1", "--calib", calib, "--fov-only")
    assert run.rc == 0 and "skipping 2 frames" in run.err and run.out.startswith("1/1 frames"), run
    assert infer(tiny_frames[1:4], tiny_model, whole, "--format", "kitti").rc == 0
    assert files_of(out) == files_of(whole)


def test_the_same_model_moved_resumes_and_the_record_follows_it(tiny_model: Path, tiny_frames: list[Path],
                                                                tmp_path: Path) -> None:
    out, whole = tmp_path / "out", tmp_path / "whole"
    assert infer(tiny_frames[:3], tiny_model, out).rc == 0
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model, moved)
    run = infer(tiny_frames, moved, out, "--skip-existing")
    assert run.rc == 0 and "skipping 3 frames" in run.err and run.out.startswith("4/4 frames"), run
    assert record_of(out)["settings"]["--model"]["path"] == str(moved)
    assert infer(tiny_frames, moved, whole).rc == 0
    assert {name: (out / name).read_bytes() for name in output_names(out)} == \
        {name: (whole / name).read_bytes() for name in output_names(whole)}


def test_a_plain_run_beside_outputs_of_other_settings_says_so_and_marks_the_folder_mixed(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert infer(tiny_frames[:6], tiny_model, out).rc == 0
    run = infer(tiny_frames[:1], tiny_model, out, "--max-boxes", "2")
    assert run.rc == 0, run
    assert [line for line in run.err.splitlines() if "other settings" in line] == [
        f"warning: {str(out)!r} holds outputs of other frames made with other settings (--max-boxes 25 there, 2 now); "
        "this run rewrites only its own frames' outputs: give another --out to keep the two apart (a --skip-existing "
        "run into this folder will be refused)"]
    assert record_of(out)["mixed"] is True and record_of(out)["settings"]["--max-boxes"] == 2
    # neither settings made all the outputs kept (a resume with a frame to run: one with none writes nothing)
    for max_boxes, said in (("2", "were made with more than one set of settings"),
                            ("25", "were made with other settings (--max-boxes 2 there, 25 now)")):
        run = infer(tiny_frames, tiny_model, out, "--max-boxes", max_boxes, "--skip-existing")
        assert run.rc == 2 and said in run.err, run
    again = infer(tiny_frames[:6], tiny_model, out, "--max-boxes", "2")  # every frame again: one set of settings
    assert again.rc == 0 and "other settings" not in again.err and "mixed" not in record_of(out), again
    assert infer(tiny_frames, tiny_model, out, "--max-boxes", "2", "--skip-existing").rc == 0


def test_outputs_without_a_record_or_with_one_unreadable_are_resumed_with_a_note(
        tiny_model: Path, tiny_frames: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert infer(tiny_frames[:2], tiny_model, out).rc == 0
    (out / SETTINGS_FILE).unlink()  # outputs of a version that kept no record
    run = infer(tiny_frames[:3], tiny_model, out, "--skip-existing")
    assert run.rc == 0 and run.err.splitlines()[0] == (
        f"note: the record of the settings that made the outputs in {str(out)!r} ({SETTINGS_FILE}) is missing (an "
        "older version wrote the outputs, or it was removed): the 2 frames skipped are taken as made with this "
        "run's"), run
    assert (out / SETTINGS_FILE).is_file()  # the run's own frames went in with its settings
    record = json.loads((out / SETTINGS_FILE).read_text())
    (out / SETTINGS_FILE).write_text(json.dumps({**record, "format_version": 99}))
    run = infer(tiny_frames[:4], tiny_model, out, "--skip-existing")
    assert run.rc == 0 and "cannot be read (format_version 99, not 1: not a record of this version" in run.err, run
    (out / SETTINGS_FILE).unlink()
    (out / SETTINGS_FILE).mkdir()  # neither readable nor replaceable: said, and the frames still run
    run = infer(tiny_frames[:5], tiny_model, out, "--skip-existing")
    assert run.rc == 0 and run.out.startswith("1/1 frames"), run
    assert "cannot be read (" in run.err and f"warning: cannot record this run's settings in " \
        f"{str(out / SETTINGS_FILE)!r}" in run.err, run
    assert len(output_names(out)) == 5


def test_a_checkpoint_and_the_model_dir_built_from_it_are_one_model(assets: Path, tmp_path: Path) -> None:
    """A checkpoint is named by the sha256 of its bytes (checked here with hashlib), its config and precision:
    the model dir `build` makes of it resumes the folder the checkpoint wrote."""
    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    frames = sorted((assets / "kitti" / "training" / "velodyne_fov").glob("*.bin"))[:2]
    out = tmp_path / "out"
    run = cli("infer", frames[0], "--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress")
    assert run.rc == 0, run
    model = record_of(out)["settings"]["--model"]
    assert model["weights"] == {"sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(), "layout": "openpcdet"}
    assert (model["config_name"], model["precision"]) == ("openpcdet_kitti_3class", "fp32")
    assert cli("build", "--checkpoint", checkpoint, "--out", tmp_path / "built").rc == 0
    assert load_model_dir(tmp_path / "built").cfg.digest() == model["config"]
    run = cli("infer", *frames, "--model", tmp_path / "built", "--out", out, "--device", "cpu", "--no-progress",
              "--skip-existing")
    assert run.rc == 0 and "skipping 1 frame whose" in run.err and run.out.startswith("1/1 frames"), run


def test_eval_of_the_folder_takes_its_outputs_not_the_record(tiny_model: Path, tiny_frames: list[Path],
                                                             tmp_path: Path) -> None:
    """``eval --pred`` of a JSON folder infer wrote: the record, a hidden .json, is no prediction."""
    out = tmp_path / "out"
    assert infer(tiny_frames[:2], tiny_model, out).rc == 0
    assert (out / SETTINGS_FILE).is_file()
    labels = one_car_labels(tmp_path, tiny_frames[:2])
    run = cli("eval", "--pred", out, "--labels", labels, "--calib", tiny_frames[0].parent.parent / "calib")
    assert run.rc == 0 and run.out.startswith("2 frames, predictions "), run
    # the record says the predictions came without the camera-view crop: said, since the benchmark's are crops
    assert run.err.splitlines()[-1] == (
        f"note: the predictions in {str(out)!r} were made without infer's camera-view crop (--fov-only false in its "
        "settings record): KITTI's benchmark, and OpenPCDet's evaluation, detect on the camera-view points only; "
        "unless the frames were camera-view crops already or the model was trained on full scans, run infer with "
        "--fov-only (the default of --format kitti and --eval) for comparable APs"), run
    cropped = tmp_path / "cropped"
    assert infer(tiny_frames[:2], tiny_model, cropped, "--fov-only").rc == 0
    run = cli("eval", "--pred", cropped, "--labels", labels, "--calib", tiny_frames[0].parent.parent / "calib")
    assert run.rc == 0 and "full scans" not in run.err, run


def test_json_and_kitti_outputs_of_one_folder_keep_their_own_settings(tiny_model: Path, tiny_frames: list[Path],
                                                                      tmp_path: Path) -> None:
    """JSON files (as read) and KITTI lines (camera-view crop by default) of the same frames in one folder: each
    format's resume is checked against the settings of its own outputs, not the last run's."""
    out = tmp_path / "out"
    assert infer(tiny_frames[1:3], tiny_model, out).rc == 0
    assert infer(tiny_frames[1:3], tiny_model, out, "--format", "kitti").rc == 0
    assert record_of(out)["settings"]["--fov-only"] is False and record_of(out, "kitti")["settings"]["--fov-only"]
    for extra in ([], ["--format", "kitti"]):
        run = infer(tiny_frames[1:4], tiny_model, out, "--skip-existing", *extra)
        assert run.rc == 0 and "skipping 2 frames" in run.err and "other settings" not in run.err, run
    run = infer(tiny_frames[1:5], tiny_model, out, "--skip-existing", "--fov-only")  # JSON of another crop: refused
    assert run.rc == 2 and "(--no-fov-only there, --fov-only now)" in run.err and "(pass --no-fov-only)" in run.err, run


def test_rows_of_other_frames_made_with_other_settings_mark_the_folder_mixed(tiny_model: Path,
                                                                            tiny_frames: list[Path],
                                                                            tmp_path: Path) -> None:
    """Row parts keep every earlier row: new frames of other settings beside them (a resume with nothing to skip)
    are said and mark the folder mixed, which the next resume refuses."""
    out = tmp_path / "out"
    assert infer(tiny_frames[1:3], tiny_model, out, "--format", "jsonl").rc == 0
    run = infer(tiny_frames[3:5], tiny_model, out, "--format", "jsonl", "--skip-existing", "--max-boxes", "2")
    assert run.rc == 0 and "holds outputs of other frames made with other settings (--max-boxes 25 there, 2 now)" \
        in run.err, run
    assert record_of(out, "jsonl")["mixed"] is True
    run = infer(tiny_frames[1:6], tiny_model, out, "--format", "jsonl", "--skip-existing", "--max-boxes", "2")
    assert run.rc == 2 and "were made with more than one set of settings" in run.err, run


def test_a_resume_with_nothing_left_to_run_is_checked_too(tiny_model: Path, tiny_frames: list[Path],
                                                          tmp_path: Path) -> None:
    """Every frame's outputs kept: a run of the same settings ends without opening the model (no "running on"
    line); one whose options given or model files differ opens it and is refused as a run with frames left is,
    --eval's too (which would score the kept outputs as this run's); a model dir rebuilt in place with other
    weights is another model."""
    out, model = tmp_path / "out", tmp_path / "model"
    shutil.copytree(tiny_model, model)
    assert infer(tiny_frames[:3], model, out).rc == 0
    before = files_of(out)
    run = infer(tiny_frames[:3], model, out, "--skip-existing", "--max-boxes", "25", "--point-dim", "4")
    assert run.rc == 0 and "running on" not in run.err and run.out.startswith("0/0 frames to run (3 skipped"), run
    elsewhere = tmp_path / "elsewhere"  # the same model at another path: opened to tell, the same (the record follows)
    shutil.copytree(model, elsewhere)
    run = infer(tiny_frames[:3], elsewhere, out, "--skip-existing")
    assert run.rc == 0 and "running on" in run.err and run.out.startswith("0/0 frames to run (3 skipped"), run
    before = files_of(out)
    run = infer(tiny_frames[:3], model, out, "--skip-existing", "--score-threshold", "0.2")
    assert run.rc == 2 and run.err.splitlines()[-1].startswith(
        f"error: --skip-existing: the outputs in {str(out)!r} were made with other settings (--score-threshold "
        "0.005 there, 0.2 now)"), run
    labels = one_car_labels(tmp_path, tiny_frames[:3])
    run = infer(tiny_frames[:3], model, out, "--skip-existing", "--format", "json", "--eval", labels, "--no-fov-only",
                "--score-threshold", "0.2")
    assert run.rc == 2 and "(--score-threshold 0.005 there, 0.2 now)" in run.err and "AP" not in run.out, run
    kitti = tmp_path / "kitti"  # KITTI lines of full scans: a resume that crops by default is refused
    assert infer(tiny_frames[:2], model, kitti, "--format", "kitti", "--no-fov-only").rc == 0
    run = infer(tiny_frames[:2], model, kitti, "--format", "kitti", "--skip-existing")
    assert run.rc == 2 and "(--no-fov-only there, --fov-only (the default) now)" in run.err and \
        "(pass --no-fov-only)" in run.err, run
    assert infer(tiny_frames[:2], model, kitti, "--format", "kitti", "--skip-existing", "--no-fov-only").rc == 0  # so
    from tiny import tiny_model_dir

    shutil.rmtree(model)
    tiny_model_dir(model, seed=4)
    run = infer(tiny_frames[:3], model, out, "--skip-existing")
    assert run.rc == 2 and f"(--model {str(elsewhere)!r} there, {str(model)!r} now: other weights)" in run.err, run
    assert files_of(out) == before


def test_a_checkpoint_rewritten_in_place_is_another_model_when_nothing_is_left_to_run(assets: Path,
                                                                                       tmp_path: Path) -> None:
    """The same path with other bytes: its sha256 (read without opening the model) differs from the record's."""
    checkpoint = tmp_path / "model.pth"
    shutil.copyfile(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth", checkpoint)
    frame = sorted((assets / "kitti" / "training" / "velodyne_fov").glob("*.bin"))[0]
    out = tmp_path / "out"
    assert cli("infer", frame, "--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress").rc == 0
    again = cli("infer", frame, "--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress",
                "--skip-existing")
    assert again.rc == 0 and "running on" not in again.err, again
    shutil.copyfile(assets / "checkpoints" / "pointpillars_zhulf0804_synthetic.pth", checkpoint)
    run = cli("infer", frame, "--model", checkpoint, "--out", out, "--device", "cpu", "--no-progress", "--skip-existing")
    assert run.rc == 2 and "other weights" in run.err and "error: --skip-existing" in run.err, run


def test_a_hidden_frames_output_counts_and_no_frame_may_write_over_the_record(tiny_model: Path,
                                                                              tiny_frames: list[Path],
                                                                              tmp_path: Path) -> None:
    """A frame named ``.a.bin`` writes ``.a.json``, an output like any other: kept beside a run of other settings
    it marks the folder mixed (hidden names were passed over, and a resume kept it as this run's). A frame whose
    output would be the record's own name is refused before anything runs (it overwrote the record)."""
    frames, out = tmp_path / "frames", tmp_path / "out"
    frames.mkdir()
    shutil.copyfile(tiny_frames[1], frames / ".a.bin")
    shutil.copyfile(tiny_frames[2], frames / "b.bin")
    assert infer([frames / ".a.bin", frames / "b.bin"], tiny_model, out, "--score-threshold", "0.5").rc == 0
    run = infer([frames / "b.bin"], tiny_model, out)
    assert run.rc == 0 and "holds outputs of other frames made with other settings" in run.err, run
    assert record_of(out)["mixed"] is True
    shutil.copyfile(tiny_frames[3], frames / SETTINGS_FILE.replace(".json", ".bin"))
    before = files_of(out)
    run = infer([frames / "b.bin", frames / SETTINGS_FILE.replace(".json", ".bin")], tiny_model, out)
    assert run.rc == 2 and run.err == (f"error: a frame's output {SETTINGS_FILE!r} would overwrite the run's own "
                                       "output of that name\n"), run
    assert files_of(out) == before


def test_a_run_into_an_out_folder_another_run_is_writing_is_refused(tiny_model: Path, tiny_frames: list[Path],
                                                                    tmp_path: Path) -> None:
    """Two runs into one --out at once left outputs of one run's settings under the other's record (and, for
    rows, two rows a frame): while one holds it (here, this process, as a run does), another is refused before
    it writes anything, and runs once it is let go."""
    from pointpillars_trt.apps.infer import out_held

    out = tmp_path / "out"
    assert infer(tiny_frames[:2], tiny_model, out).rc == 0
    before = files_of(out)
    with out_held(out):
        run = infer(tiny_frames[:3], tiny_model, out, "--score-threshold", "0.5")
    assert run.rc == 2 and run.err.splitlines()[-1] == (
        f"error: --out {str(out)!r} is being written by another infer run now (two runs into one folder mix their "
        "outputs and settings): wait for it to end, or give another --out"), run
    assert files_of(out) == before
    assert infer(tiny_frames[:3], tiny_model, out, "--skip-existing").rc == 0


def test_an_out_folder_another_run_made_while_this_one_started_is_refused(tiny_model: Path, tiny_frames: list[Path],
                                                                          tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """--out missing when the run decides its frames, then made and written by another run while this one opens
    its model (here: a row part written from within the real open): what this run decided went by that run's
    outputs unseen (its rows would be a frame's second), so it is refused before it writes; run again, it resumes."""
    import pointpillars_trt.apps.infer as infer_module

    out = tmp_path / "out"
    real_open = infer_module.open_warm

    def open_while_another_run_writes(*args, **kwargs):  # type: ignore[no-untyped-def]
        out.mkdir(exist_ok=True)
        (out / "detections-00000.jsonl").write_text("")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(infer_module, "open_warm", open_while_another_run_writes)
    run = infer(tiny_frames[:2], tiny_model, out, "--format", "jsonl", "--skip-existing")
    assert run.rc == 2 and run.err.splitlines()[-1] == (
        f"error: --out {str(out)!r} was made by another run while this one started (it holds "
        "'detections-00000.jsonl'): run this one again (with --skip-existing to keep those outputs), or give "
        "another --out"), run
    assert sorted(os.listdir(out)) == ["detections-00000.jsonl"]
