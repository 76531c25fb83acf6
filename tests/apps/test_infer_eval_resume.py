"""``infer --eval --skip-existing`` with the record formats (json, jsonl, parquet): a run interrupted (some of its
outputs gone) and resumed evaluates every frame, the skipped ones from the records the first run wrote, and so
prints and writes the evaluation one uninterrupted run of the same frames does.

Oracle: that uninterrupted run (same frames, same options, its own --out). The ground truth is a ``--format
kitti`` run's lines of the same frames with every other box moved 0.4 m sideways, so that the APs lie between 0
and 100 and a skipped frame evaluated without its boxes, or not at all, would change them. CPU path, tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from pointpillars_trt.apps.outputs import record_boxes

from test_cli import KITTI_CALIB, LOOSE, Run, cli, tiny_model, tiny_points  # noqa: F401 (fixtures)
from test_path_escaping import ODD, shown

NO_PYARROW = "pyarrow is not installed (pip install '.[test-scaleout]')"
PARQUET = pytest.param("parquet", marks=pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                                                           reason=NO_PYARROW))
STEMS = [f"00000{i}" for i in range(1, 6)]


@pytest.fixture(scope="module")
def scene(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A KITTI-like ``training`` folder: velodyne/ (five frames), calib/ and label_2/ (see the module's docstring)."""
    root = tmp_path_factory.mktemp("evalresume") / "training"
    for folder in ("velodyne", "calib", "label_2"):
        (root / folder).mkdir(parents=True)
    for i, stem in enumerate(STEMS, start=1):
        tiny_points(i).tofile(root / "velodyne" / f"{stem}.bin")
        (root / "calib" / f"{stem}.txt").write_text(KITTI_CALIB)
    kitti = root.parent / "kitti"
    assert cli("infer", root / "velodyne", "--model", tiny_model, "--device", "cpu", "--out", kitti, "--format",
               "kitti", "--no-progress", *LOOSE).rc == 0
    for stem in STEMS:
        lines = []
        for n, line in enumerate((kitti / f"{stem}.txt").read_text().splitlines()):
            kind, _, _, *values = line.split()
            values = values[:-1]  # no score: ground truth, truncated and occluded 0
            values[8] = f"{float(values[8]) + 0.4 * (n % 2):.4f}"  # camera x of every other box
            lines.append(" ".join([kind, "0", "0", *values]) + "\n")
        assert len(lines) > 2
        (root / "label_2" / f"{stem}.txt").write_text("".join(lines))
    return root


def frames_of(scene: Path) -> list[Path]:
    return sorted((scene / "velodyne").iterdir())


def run(model: Path, frames: list[Path], out: Path, fmt: str, labels: Path, *extra: object) -> Run:
    return cli("infer", *frames, "--model", model, "--device", "cpu", "--out", out, "--format", fmt, "--eval", labels,
               "--no-progress", *LOOSE, *extra)


def evaluation(done: Run, out: Path) -> tuple[str, dict[str, object]]:
    """What a run printed of its evaluation (from its header on, less the path of eval.json) and eval.json."""
    printed = done.out[done.out.index("KITTI evaluation of"):done.out.index(f"wrote {out / 'eval.json'}")]
    return printed, json.loads((out / "eval.json").read_text())


def remove_outputs(out: Path, fmt: str, stems: list[str]) -> None:
    """What an interrupted run leaves: the outputs of ``stems`` gone (JSON: the first file removed, the others
    cut short, as a crash before the flush leaves them; rows: theirs left out of the part files)."""
    if fmt == "json":
        (out / f"{stems[0]}.json").unlink()
        for stem in stems[1:]:
            data = (out / f"{stem}.json").read_bytes()
            (out / f"{stem}.json").write_bytes(data[:len(data) // 2])
        return
    for part in out.glob(f"detections-*.{fmt}"):
        if fmt == "jsonl":
            kept = [line for line in part.read_text().splitlines(keepends=True)
                    if Path(json.loads(line)["source"]).stem not in stems]
            part.write_text("".join(kept))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pq.read_table(part)
            keep = [Path(source).stem not in stems for source in table.column("source").to_pylist()]
            pq.write_table(table.filter(pa.array(keep)), part)


@pytest.mark.parametrize("fmt", ["json", "jsonl", PARQUET])
def test_a_resumed_run_evaluates_as_one_uninterrupted_run(tiny_model: Path, scene: Path, tmp_path: Path,
                                                          fmt: str) -> None:
    labels, frames = scene / "label_2", frames_of(scene)
    whole = run(tiny_model, frames, tmp_path / "whole", fmt, labels)
    assert whole.rc == 0, whole
    printed, report = evaluation(whole, tmp_path / "whole")
    assert printed.startswith(f"KITTI evaluation of 5 frames against {labels}\n"), printed
    aps = [float(v) for line in printed.splitlines() if line.startswith("3d   AP:") for v in line[8:].split(",")]
    assert any(0 < ap < 100 for ap in aps), printed  # boxes matched and missed: a lost frame would show

    out = tmp_path / "out"
    assert run(tiny_model, frames, out, fmt, labels).rc == 0
    remove_outputs(out, fmt, ["000002", "000004"])
    (out / "eval.json").unlink()
    resumed = run(tiny_model, frames, out, fmt, labels, "--skip-existing")
    assert resumed.rc == 0 and "skipping 3 frames" in resumed.err and "error" not in resumed.err, resumed
    assert "2/2 frames" in resumed.out, resumed
    assert evaluation(resumed, out) == (printed, report)


def test_an_earlier_failure_is_left_out_as_in_one_uninterrupted_run(tiny_model: Path, scene: Path,
                                                                    tmp_path: Path) -> None:
    """A frame whose row is an earlier run's failure is not run again, and is left out of the evaluation and
    counted as the uninterrupted run leaves out and counts its failed frame; --retry-failed runs it again."""
    folder = tmp_path / "training"
    shutil.copytree(scene, folder)
    (folder / "velodyne" / "000009.bin").write_bytes(b"\0" * 6)  # no whole point: the frame fails
    (folder / "calib" / "000009.txt").write_text(KITTI_CALIB)
    (folder / "label_2" / "000009.txt").write_text((folder / "label_2" / "000001.txt").read_text())
    labels, frames = folder / "label_2", frames_of(folder)
    whole = run(tiny_model, frames, tmp_path / "whole", "jsonl", labels)
    assert whole.rc == 1 and "000009.bin" in whole.err, whole
    printed, report = evaluation(whole, tmp_path / "whole")
    assert printed.startswith(f"KITTI evaluation of 5 frames against {labels} (1 failed frame left out)\n")

    out = tmp_path / "out"
    assert run(tiny_model, frames, out, "jsonl", labels).rc == 1
    remove_outputs(out, "jsonl", ["000003"])
    resumed = run(tiny_model, frames, out, "jsonl", labels, "--skip-existing")
    assert resumed.rc == 0 and "skipping 5 frames" in resumed.err, resumed
    assert "1 of them failed in an earlier run" in resumed.err, resumed
    assert evaluation(resumed, out) == (printed, report)
    retried = run(tiny_model, frames, out, "jsonl", labels, "--skip-existing", "--retry-failed")
    assert retried.rc == 1 and "rerunning 1 frame that" in retried.err, retried
    assert evaluation(retried, out) == (printed, report)



def test_an_odd_label_and_out_folder_are_named_escaped(tiny_model: Path, scene: Path, tmp_path: Path) -> None:
    """--eval's and --out's folders named with a newline and an ESC: the evaluation's header, its ``wrote`` line
    and --skip-existing's line name them escaped, each still one line, and no escape sequence reaches the terminal."""
    folder = tmp_path / ODD
    shutil.copytree(scene, folder)
    labels, out, frames = folder / "label_2", folder / "out", frames_of(folder)
    first = run(tiny_model, frames, out, "json", labels)
    again = run(tiny_model, frames, out, "json", labels, "--skip-existing")
    for done in (first, again):
        lines = done.out.splitlines() + done.err.splitlines()
        assert done.rc == 0 and all(line.isprintable() for line in lines), done
        assert f"KITTI evaluation of 5 frames against {shown(labels)}" in lines, done
        assert f"wrote {shown(out / 'eval.json')}" in lines, done
    assert f", written to {shown(out)} (" in first.out.splitlines()[0], first  # the summary
    assert f"skipping 5 frames whose outputs are already in {shown(out)}" in again.err.splitlines(), again


def test_a_skipped_frame_that_cannot_be_evaluated_is_one_error_line(tiny_model: Path, scene: Path,
                                                                    tmp_path: Path) -> None:
    """A skipped frame's record that is whole (so not run again) but cannot be placed in the camera frame (its
    calib file went) or is no record (a row edited by hand) is one error line naming the file, the frame is left
    out of the evaluation and counted in its header, and the exit code is 1; the other frames are evaluated."""
    calib, labels, frames = tmp_path / "calib", scene / "label_2", frames_of(scene)
    shutil.copytree(scene / "calib", calib)
    out = tmp_path / "json"
    assert run(tiny_model, frames, out, "json", labels, "--calib", calib).rc == 0
    (calib / "000002.txt").unlink()
    resumed = run(tiny_model, frames, out, "json", labels, "--calib", calib, "--skip-existing")
    errors = [line for line in resumed.err.splitlines() if line.startswith("error:")]
    assert resumed.rc == 1 and len(errors) == 1, resumed
    assert errors[0].startswith(f"error: '{out / '000002.json'}': cannot be evaluated: calib folder ")
    assert "'000002'" in errors[0] and "left out of the evaluation" in errors[0], errors
    assert (f"KITTI evaluation of 4 frames against {labels} (1 frame whose earlier outputs could not be read "
            "left out)\n") in resumed.out, resumed

    out = tmp_path / "jsonl"
    assert run(tiny_model, frames, out, "jsonl", labels).rc == 0
    part = out / "detections-00000.jsonl"
    rows = [json.loads(line) for line in part.read_text().splitlines()]
    assert rows[3]["scores"]
    rows[3]["boxes_lidar"] = [[1.0, 2.0, 3.0]] * len(rows[3]["scores"])
    part.write_text("".join(json.dumps(row) + "\n" for row in rows))
    resumed = run(tiny_model, frames, out, "jsonl", labels, "--skip-existing")
    errors = [line for line in resumed.err.splitlines() if line.startswith("error:")]
    assert resumed.rc == 1 and len(errors) == 1, resumed
    assert errors[0].startswith(f"error: '{part}' (the row of '{frames[3]}'): cannot be evaluated: 'boxes_lidar' is "
                                "not a list of boxes of 7 values each; the frame is left out of the evaluation"), errors
    assert "KITTI evaluation of 4 frames" in resumed.out and "could not be read left out" in resumed.out, resumed


@pytest.mark.parametrize("record, problem", [
    ([], "not a JSON object"),
    ({"boxes_lidar": [], "scores": []}, "no 'labels'"),
    ({"boxes_lidar": [[0.0] * 7, [0.0] * 6], "scores": [1, 1], "labels": ["Car"] * 2}, "of one shape"),
    ({"boxes_lidar": [[0.0] * 6], "scores": [1], "labels": ["Car"]}, "not a list of boxes of 7 values each"),
    ({"boxes_lidar": [["0"] * 7], "scores": [1], "labels": ["Car"]}, "'boxes_lidar' is not a list of numbers"),
    ({"boxes_lidar": [[0.0] * 7], "scores": [None], "labels": ["Car"]}, "'scores' is not a list of numbers"),
    ({"boxes_lidar": [[0.0] * 6 + [True]], "scores": [1], "labels": ["Car"]}, "'boxes_lidar' is not a list of numbers"),
    ({"boxes_lidar": [[0.0] * 7] * 2, "scores": [0.5, False], "labels": ["Car"] * 2}, "'scores' is not a list of numbers"),
    ({"boxes_lidar": [[0.0] * 7], "scores": [1, 2], "labels": ["Car"]}, "1 box, 2 scores and 1 label:"),
    ({"boxes_lidar": [[0.0] * 7], "scores": [1], "labels": [3]}, "'labels' is not a list of class names"),
])
def test_record_boxes_says_what_is_no_record(record: object, problem: str) -> None:
    with pytest.raises(ValueError) as raised:
        record_boxes(record)
    assert problem in str(raised.value)


def test_record_boxes_reads_back_what_a_record_holds() -> None:
    boxes = [[1.0, -2.0, 0.5, 3.9, 1.6, 1.5, 0.25], [4.0, 1.0, -0.5, 0.8, 0.6, 1.7, -3.0]]
    found = record_boxes({"frame": "x", "boxes_lidar": boxes, "scores": [0.5, 0.25], "labels": ["Car", "Pedestrian"]})
    assert found.boxes.tolist() == boxes and found.boxes.dtype == "float64"
    assert found.scores.tolist() == [0.5, 0.25] and found.names == ["Car", "Pedestrian"]
    empty = record_boxes({"boxes_lidar": [], "scores": [], "labels": []})
    assert empty.boxes.shape == (0, 7) and empty.scores.shape == (0,) and empty.names == []


def renamed_model(folder: Path, classes: tuple[str, str, str]) -> Path:
    """The tiny model (its weights too) with its three classes named ``classes``: a model of nuScenes' classes."""
    from pointpillars_trt.config import config_from_dict
    from pointpillars_trt.convert.export import export_model_dir
    from tiny import tiny_config, tiny_weights

    raw = tiny_config().to_dict()
    names = dict(zip(raw["classes"], classes))
    anchors = [{**anchor, "name": names[anchor["name"]]} for anchor in raw["anchors"]["classes"]]
    cfg = config_from_dict({**raw, "classes": classes, "anchors": {**raw["anchors"], "classes": anchors}}, "renamed")
    return export_model_dir(tiny_weights(cfg, 3), cfg, folder, precision="fp32", source={"random_seed": 3}).path


def test_a_model_of_other_classes_besides_kitti_s_is_evaluated_for_those_with_one_note(scene: Path,
                                                                                       tmp_path: Path) -> None:
    """A model of KITTI's Car and nuScenes' bus and trailer: one note before the run names the classes left out
    of the scores (it was a warning after the run telling infer's user to rename the lines infer wrote)."""
    model = renamed_model(tmp_path / "model", ("Car", "bus", "trailer"))
    done = run(model, frames_of(scene), tmp_path / "out", "kitti", scene / "label_2")
    assert done.rc == 0 and "types KITTI has not" not in done.err and "name each line" not in done.err, done
    assert [line for line in done.err.splitlines() if line.startswith("note: --eval")] == [
        "note: --eval scores KITTI's classes (Car, Pedestrian, Cyclist, Van, Person_sitting, Truck); this model's "
        "classes 'bus', 'trailer' are none of them: their boxes are left out of the scores"], done.err
    types = {line.split()[0] for path in (tmp_path / "out").glob("0*.txt") for line in path.read_text().splitlines()}
    assert {"bus", "trailer"} & types, types  # lines of the classes left out were written and evaluated without a word
    assert "Car AP@" in done.out and "Pedestrian AP@" not in done.out, done.out


def test_a_model_of_no_kitti_class_is_refused_before_any_frame_runs(scene: Path, tmp_path: Path) -> None:
    """A model of nuScenes' classes alone: one error before any frame runs (it came after every frame ran)."""
    model = renamed_model(tmp_path / "model", ("bus", "trailer", "barrier"))
    out = tmp_path / "out"
    done = run(model, frames_of(scene), out, "json", scene / "label_2")
    assert (done.rc, done.out) == (2, ""), done
    assert done.err == ("error: --eval scores KITTI's classes (Car, Pedestrian, Cyclist, Van, Person_sitting, Truck); "
                        "this model's classes ('bus', 'trailer', 'barrier') have none of them, so every AP would be 0: "
                        "drop --eval, or give a --model of KITTI's classes\n"), done.err
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())
    assert run(model, frames_of(scene), tmp_path / "fixed", "json", scene / "label_2").rc == 2
    fixed = cli("infer", *frames_of(scene), "--model", model, "--device", "cpu", "--out", tmp_path / "fixed",
                "--no-progress")
    assert fixed.rc == 0, fixed  # the fix, as said: without --eval


def test_infer_eval_says_what_eval_says_of_label_types_and_classes_with_nothing_to_count(tiny_model: Path,
                                                                                         scene: Path,
                                                                                         tmp_path: Path) -> None:
    """Labels whose lines of every class but Car are typed 'Vehicle': ``infer --eval`` says eval's warning of those
    types and its note on the classes predicted with no object to count (it printed AP 0 for them without a word),
    each once, word for word as ``eval`` of the same predictions says them."""
    labels = tmp_path / "label_2"
    labels.mkdir()
    renamed = 0
    for path in sorted((scene / "label_2").iterdir()):
        lines = [line if line.startswith("Car ") else "Vehicle " + line.split(" ", 1)[1]
                 for line in path.read_text().splitlines(keepends=True)]
        renamed += sum(line.startswith("Vehicle ") for line in lines)
        (labels / path.name).write_text("".join(lines))
    assert renamed, "the scene's labels hold only cars"
    done = run(tiny_model, frames_of(scene), tmp_path / "out", "kitti", labels)
    assert done.rc == 0, done
    said = [line for line in done.err.splitlines() if "types KITTI has not" in line or "no object to count" in line]
    assert len(said) == 2 and "'Vehicle' (" in said[0] and "AP there is 0 whatever the predictions" in said[1], done.err
    evaluated = cli("eval", "--pred", tmp_path / "out", "--labels", labels, "--calib", scene / "calib")
    assert evaluated.rc == 0 and all(line in evaluated.err.splitlines() for line in said), (evaluated, said)
