"""What bench reads and writes, on the CPU: its frame folders (named apart, listed as infer lists them, a file that
cannot be read left out and said), the ONNX Runtime threads it runs and records, --model as infer checks it, and
its reports in --out (a user's own files and a folder in their place refused before the run, a write that fails
named)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from test_cli import Run, assert_one_line_error, cli, tiny_points


@pytest.fixture(scope="module")
def tiny_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import yaml
    from tiny import tiny_config

    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config().to_dict()))
    return path


def frame_folder(folder: Path, *points: int) -> Path:
    """``folder`` made, with a .bin frame of each number of ``points``."""
    folder.mkdir(parents=True)
    for k, n in enumerate(points):
        tiny_points(k, n).tofile(folder / f"{k:06d}.bin")
    return folder


def bench(config: Path, out: Path, *flags: object) -> Run:
    return cli("bench", "--device", "cpu", "--config", config, "--iterations", 1, "--out", out, *flags)


def report(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "bench.json").read_text())


def test_two_frame_folders_of_one_name_are_two_sets(tiny_yaml: Path, tmp_path: Path) -> None:
    """KITTI's training/velodyne and testing/velodyne: both were keyed ``velodyne (1 frame)``, and the first
    one's row was gone from the report without a word."""
    training = frame_folder(tmp_path / "training" / "velodyne", 40)
    testing = frame_folder(tmp_path / "testing" / "velodyne", 300)
    run = bench(tiny_yaml, tmp_path / "b", "--frames", training, "--frames", testing)
    assert run.rc == 0, run
    rows = {r["frames"]: r["avg_points"] for r in report(tmp_path / "b")["runs"]}
    assert rows == {"training/velodyne (1 frame)": 40, "testing/velodyne (1 frame)": 300}
    markdown = (tmp_path / "b" / "bench.md").read_text()
    assert "| training/velodyne (1 frame) |" in markdown and "| testing/velodyne (1 frame) |" in markdown


def test_set_names_take_as_many_parent_folders_as_tell_them_apart() -> None:
    from pointpillars_trt.apps.bench.frames import set_names

    assert set_names(["/d/x/a/v", "/d/y/a/v", "/d/z/b/v", "/d/w"]) == ["x/a/v", "y/a/v", "b/v", "w"]
    assert set_names(["/v", "/d/v"]) == ["/v", "d/v"]


def test_one_frame_folder_given_twice_is_refused(tiny_yaml: Path, tmp_path: Path) -> None:
    folder = frame_folder(tmp_path / "velodyne", 40)
    (tmp_path / "link").symlink_to(folder)
    run = bench(tiny_yaml, tmp_path / "b", "--frames", folder, "--frames", f"{folder}/")
    assert_one_line_error(run, f"--frames '{folder}/' is given twice: give each folder once")
    run = bench(tiny_yaml, tmp_path / "b", "--frames", folder, "--frames", tmp_path / "link")
    assert_one_line_error(run, f"--frames '{tmp_path / 'link'}' is given twice (as '{folder}' too)")
    assert not (tmp_path / "b").exists()
    junk = tmp_path / "junk.pth"  # no checkpoint: the frames' refusal comes before the model is read
    junk.write_bytes(b"\0" * 4096)
    run = cli("bench", "--device", "cpu", "--model", junk, "--iterations", 1, "--out", tmp_path / "b", "--frames",
              folder, "--frames", f"{folder}/")
    assert_one_line_error(run, f"--frames '{folder}/' is given twice: give each folder once")


def test_a_frame_folder_is_listed_as_infer_lists_it(tiny_yaml: Path, tmp_path: Path) -> None:
    """A macOS ``._000000.bin`` (resource-fork metadata) ended the bench with "does not hold float32"; infer
    leaves hidden files out, saying so once."""
    folder = frame_folder(tmp_path / "velodyne", 120)
    (folder / "._000000.bin").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
    run = bench(tiny_yaml, tmp_path / "b", "--frames", folder)
    assert run.rc == 0, run
    assert f"note: folder '{folder}': 1 hidden file left out ('._000000.bin': macOS metadata?); give one " \
           "by name to run it" in run.err.splitlines(), run.err
    assert [(r["frames"], r["avg_points"]) for r in report(tmp_path / "b")["runs"]] == [("velodyne (1 frame)", 120)]


@pytest.mark.parametrize("setting, threads, said", [
    ({"OMP_NUM_THREADS": "1"}, 1, None),
    ({"--threads": "1"}, 1, None),
    ({"--threads": "100000"}, "cores", "note: --threads 100000 is more than the {cores} cores where the detector "
                                       "runs: {cores} threads"),
    ({}, None, None),
], ids=["omp", "option", "beyond-the-cores", "default"])
def test_a_cpu_bench_runs_and_records_the_threads_infer_would(tiny_yaml: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, setting: dict[str, str],
                                                              threads: object, said: str | None) -> None:
    """ONNX Runtime took every core whatever OMP_NUM_THREADS said (infer and the API honour it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if "OMP_NUM_THREADS" in setting:
        monkeypatch.setenv("OMP_NUM_THREADS", setting["OMP_NUM_THREADS"])
    flags = ["--threads", setting["--threads"]] if "--threads" in setting else []
    run = bench(tiny_yaml, tmp_path / "b", "--frames", frame_folder(tmp_path / "f", 50), *flags)
    assert run.rc == 0, run
    expected = cores if threads == "cores" else threads
    assert report(tmp_path / "b")["threads"] == expected
    line = f"ONNX Runtime threads: {expected or 'its default, one per core'}  "
    assert line in (tmp_path / "b" / "bench.md").read_text().splitlines()
    notes = [line for line in run.err.splitlines() if "threads" in line]
    assert notes == ([said.format(cores=cores)] if said else []), run.err


def test_a_frame_set_whose_frames_made_no_pillar_is_warned_of_in_the_run_and_its_report(tiny_yaml: Path,
                                                                                         tmp_path: Path) -> None:
    """A folder of empty or all-NaN files (copies that failed) was timed as the set's latency without a word,
    where infer warns of each kind; a set of frames that made pillars still says nothing."""
    frames = frame_folder(tmp_path / "f", 50)
    (frames / "000001.bin").write_bytes(b"")
    np.full((200, 4), np.nan, np.float32).tofile(frames / "000002.bin")
    far = tiny_points(3, 200)
    far[:, 0] += 1000.0  # 1 km ahead of a model that sees 5 m
    far.tofile(frames / "000003.bin")
    run = bench(tiny_yaml, tmp_path / "b", "--frames", frames, "--iterations", 4)
    assert run.rc == 0, run
    line = ("--frames set 'f (4 frames)': 3 of the 4 frames timed made no pillar (their points are none, non-finite or "
            "outside the model's point range): their times are of frames with nothing to detect on; the first: "
            f"{str(frames / '000001.bin')!r}")
    assert [w for w in run.err.splitlines() if w.startswith("warning:")] == [f"warning: {line}"], run.err
    assert line in report(tmp_path / "b")["notes"]
    assert f"- {line}" in (tmp_path / "b" / "bench.md").read_text().splitlines()
    run = bench(tiny_yaml, tmp_path / "c", "--frames", frame_folder(tmp_path / "g", 50, 60))
    assert run.rc == 0, run
    assert "warning:" not in run.err and "no pillar" not in (tmp_path / "c" / "bench.md").read_text()


def read_error(path: Path) -> str:
    """The one line ``read_points`` refuses ``path`` with."""
    from pointpillars_trt.errors import InputError
    from pointpillars_trt.pointcloud_io import read_points

    with pytest.raises(InputError) as refused:
        read_points(path)
    return str(refused.value)


def test_an_unreadable_frame_file_is_one_error_line_and_its_set_is_timed_on_the_rest(tiny_yaml: Path,
                                                                                      tmp_path: Path) -> None:
    """One bad file among a folder's ended the whole bench with its error; now each is an error line naming it,
    its set is timed on the others and named with their count, the report counts what was left out (exit 1, as
    infer's frames that fail), and a set of no readable file is one error line and left out."""
    frames = frame_folder(tmp_path / "f", 40, 60, 80)
    (frames / "000003.bin").write_text("1.0 2.0 3.0 0.5\n" * 4)  # a text point list
    (frames / "000004.npy").write_bytes(b"\0" * 64)                # no .npy
    broken = frame_folder(tmp_path / "g", 40)
    (broken / "000000.bin").write_bytes(b"\1" * 6)  # no whole point (an empty file is a frame of none)
    (broken / "000002.npy").write_bytes(b"x")
    run = bench(tiny_yaml, tmp_path / "b", "--frames", frames, "--frames", broken, "--iterations", 5)
    assert run.rc == 1, run
    errors = [line for line in run.err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {read_error(frames / '000003.bin')}", f"error: {read_error(frames / '000004.npy')}",
                      f"error: --frames '{broken}': none of its 2 point files can be read, the first: "
                      f"{read_error(broken / '000000.bin')}; its set is left out"], run.err
    assert f"'{frames / '000003.bin'}'" in errors[0] and f"'{frames / '000004.npy'}'" in errors[1]  # each named
    result = report(tmp_path / "b")
    assert [(r["frames"], r["avg_points"]) for r in result["runs"]] == [("f (3 frames)", 60)]
    left_out = ["--frames set 'f (3 frames)': 2 of its 5 point files left out: they could not be read (each named in "
                "its error line)", errors[2].removeprefix("error: ")]
    assert result["notes"][:2] == left_out
    markdown = (tmp_path / "b" / "bench.md").read_text()
    assert "| f (3 frames) |" in markdown and all(f"- {line}" in markdown.splitlines() for line in left_out)
    assert all(f"- {line}" in run.out.splitlines() for line in left_out)  # the report as printed


def test_a_bench_of_no_readable_frame_file_is_one_error_line_and_no_report(tiny_yaml: Path, tmp_path: Path) -> None:
    broken = tmp_path / "g"
    broken.mkdir()
    (broken / "000000.bin").write_bytes(b"\1" * 6)
    run = bench(tiny_yaml, tmp_path / "b", "--frames", broken)
    assert_one_line_error(run, f"--frames '{broken}': its one point file cannot be read: "
                               f"{read_error(broken / '000000.bin')}")
    assert not (tmp_path / "b" / "bench.json").exists()


def test_a_set_cut_to_the_iterations_is_named_with_the_frames_it_times(tmp_path: Path) -> None:
    """Of a folder's first --iterations files, those read are timed and counted in the set's name; a file past
    them is not read."""
    from pointpillars_trt.apps.bench.frames import folder_frame_sets

    folder = frame_folder(tmp_path / "v", 40, 50, 60, 70)
    (folder / "000001.bin").write_bytes(b"\1" * 6)
    (folder / "000003.bin").write_bytes(b"\1" * 6)  # past the limit: no error of its own
    said: list[str] = []
    sets, left_out, sources = folder_frame_sets([str(folder)], limit=3, say=said.append)
    assert said == [f"note: --frames '{folder}': reading the first 3 of its 4 point files, as many as --iterations "
                    "3 times", f"error: {read_error(folder / '000001.bin')}"]
    assert [(name, [len(f) for f in frames]) for name, frames in sets.items()] == \
        [("v (2 of the first 3 of 4 frames)", [40, 60])]
    assert sources == {"v (2 of the first 3 of 4 frames)": [str(folder / "000000.bin"), str(folder / "000002.bin")]}
    assert left_out == ["--frames set 'v (2 of the first 3 of 4 frames)': 1 of the first 3 of its 4 point files "
                        "left out: it could not be read (named in its error line)"]


def test_a_set_of_one_file_read_that_cannot_be_is_named_as_such(tmp_path: Path) -> None:
    """--iterations 1 reads a folder's first file alone: one that could not be read was "none of the first 1 of its
    3 point files", and one file left out of a set "they could not be read (each named ...)"."""
    from pointpillars_trt.apps.bench.frames import folder_frame_sets

    bad = frame_folder(tmp_path / "bad", 40, 50, 60)
    (bad / "000000.bin").write_bytes(b"\1" * 6)
    good = frame_folder(tmp_path / "good", 40)
    said: list[str] = []
    sets, left_out, _ = folder_frame_sets([str(bad), str(good)], limit=1, say=said.append)
    assert list(sets) == ["good (1 frame)"]
    assert left_out == [f"--frames '{bad}': the first of its 3 point files, the one read, cannot be read: "
                        f"{read_error(bad / '000000.bin')}; its set is left out"]
    mixed = frame_folder(tmp_path / "mixed", 40, 50)
    (mixed / "000001.bin").write_bytes(b"\1" * 6)
    assert folder_frame_sets([str(mixed)], say=said.append).left_out == [
        "--frames set 'mixed (1 frame)': 1 of its 2 point files left out: it could not be read (named in its error "
        "line)"]


def test_a_set_of_one_frame_is_named_in_the_singular(tiny_yaml: Path, tmp_path: Path) -> None:
    """A set of one frame was named "(1 frames)", one frame that made no pillar "1 of the 1 frames timed made no pillar
    (their points ...)", and --iterations 1 of a folder of more read "its first 1 of 3 point files" into a set named
    "(first 1 of 3 frames)"."""
    from pointpillars_trt.apps.bench.frames import folder_frame_sets

    alone = frame_folder(tmp_path / "alone", 40)
    (alone / "000000.bin").write_bytes(b"")
    pair = frame_folder(tmp_path / "pair", 40, 50)
    (pair / "000001.bin").write_bytes(b"")
    run = bench(tiny_yaml, tmp_path / "b", "--frames", alone, "--frames", pair, "--iterations", 2)
    assert run.rc == 0, run
    said = " made no pillar (its points are none, non-finite or outside the model's point range): its times are of a " \
           "frame with nothing to detect on; the frame: "
    assert [line for line in run.err.splitlines() if line.startswith("warning:")] == [
        "warning: --frames set 'alone (1 frame)': its one frame timed" + said + repr(str(alone / "000000.bin")),
        "warning: --frames set 'pair (2 frames)': 1 of the 2 frames timed" + said + repr(str(pair / "000001.bin"))
    ], run.err
    assert [r["frames"] for r in report(tmp_path / "b")["runs"]] == ["alone (1 frame)", "pair (2 frames)"]
    said_lines: list[str] = []
    sets, left_out, _ = folder_frame_sets([str(pair)], limit=1, say=said_lines.append)
    assert said_lines == [f"note: --frames '{pair}': reading the first of its 2 point files, as many as --iterations 1 "
                          "times"]
    assert list(sets) == ["pair (first of 2 frames)"] and not left_out


def test_an_fp16_model_dir_benched_on_the_cpu_says_fp16_gains_nothing_there_once(tmp_path: Path) -> None:
    """infer and the Python API say that fp16 graphs gain no speed on the CPU; bench timed them there without a
    word: the same note, once, and none for fp32 graphs."""
    from tiny import tiny_model_dir

    frames = frame_folder(tmp_path / "f", 50)
    note = ("note: fp16 graphs run no faster than fp32 on the CPU (slower, and rounded to fp16); for CPU runs use fp32 "
            "graphs (a checkpoint without --precision fp16, or a model dir built with --precision fp32)")
    for precision in ("fp16", "fp32"):
        model = tiny_model_dir(tmp_path / precision, precision=precision).path
        run = cli("bench", "--device", "cpu", "--model", model, "--frames", frames, "--iterations", 1, "--out",
                  tmp_path / f"b{precision}")
        assert run.rc == 0, run
        assert f"running on CPU, ONNX Runtime, {precision}" in run.err, run.err
        assert run.err.splitlines().count(note) == (precision == "fp16"), run.err


def test_a_checkpoint_benched_without_its_yaml_says_the_published_config_it_takes(assets: Path, tmp_path: Path) -> None:
    """bench of an OpenPCDet checkpoint without --pcdet-config timed the built-in config of OpenPCDet's published
    YAML without the note build and infer give: one note line, none with --config given."""
    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    frames = frame_folder(tmp_path / "f", 50)
    run = cli("bench", "--device", "cpu", "--model", checkpoint, "--frames", frames, "--iterations", 1, "--out",
              tmp_path / "b")
    assert run.rc == 0, run
    notes = [line for line in run.err.splitlines() if "published" in line]
    assert notes == [f"note: '{checkpoint}': built with config openpcdet_kitti_3class, OpenPCDet's published "
                     "tools/cfgs/kitti_models/pointpillar.yaml (a checkpoint holds no config): for a model trained "
                     "with a YAML of its own (another range, anchors, classes or thresholds), build with --pcdet-config "
                     "ITS_MODEL.yaml (Python: config=convert.pcdet_config.config_from_pcdet_yaml(path))"], run.err
    run = cli("bench", "--device", "cpu", "--model", checkpoint, "--config", "openpcdet_kitti_3class", "--frames",
              frames, "--iterations", 1, "--out", tmp_path / "c")
    assert run.rc == 0 and "published" not in run.err, run


@pytest.mark.parametrize("spec, said", [
    ("nosuch.pth", "--model 'nosuch.pth': no such checkpoint file or model dir"),
    ("loop", "--model 'loop': a symbolic link that leads to no file (a loop, or its target 'loop' is gone)"),
])
def test_a_missing_model_is_said_as_infer_says_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str,
                                                  said: str) -> None:
    """It was "model dir nosuch.pth: not found (build one with ...)", for a checkpoint path too."""
    monkeypatch.chdir(tmp_path)
    Path("loop").symlink_to("loop")
    tiny_points(0, 50).tofile("x.bin")
    for command in (["bench", "--device", "cpu", "--out", "b"], ["infer", "x.bin"]):
        run = cli(*command, "--model", spec)
        assert (run.rc, run.err) == (2, f"error: {said}\n"), run
    assert not Path("b").exists()


def foreign_picture() -> bytes:
    """A PNG whose "Software" text names a camera driver."""
    pytest.importorskip("matplotlib")
    import io

    from matplotlib.figure import Figure

    buffer = io.BytesIO()
    Figure(figsize=(1, 1)).savefig(buffer, format="png", metadata={"Software": "a camera driver"})
    return buffer.getvalue()


@pytest.mark.parametrize("name, make, why", [
    ("bench.md", lambda p: p.write_text("# my notes on the runs\n"),
     "it does not start with '# pointpillars-trt bench'"),
    ("bench.json", lambda p: p.write_text('{"fps": 1000}\n'), "JSON without the keys of bench's report"),
    ("bench.json", lambda p: p.write_text("fps 1000\n"), "not JSON"),
    ("bench_stages.png", lambda p: p.write_bytes(foreign_picture()),
     "a picture that pointpillars-trt did not draw (a camera image?)"),
    ("bench_stages.png", lambda p: p.mkdir(), "it is a directory, not a regular file"),
    ("bench.md", os.mkfifo, "it is a FIFO (named pipe), not a regular file"),
], ids=["markdown", "json", "not-json", "picture", "folder", "fifo"])
def test_what_bench_did_not_write_in_its_reports_places_is_refused_before_the_run(
        tiny_yaml: Path, tmp_path: Path, name: str, make: object, why: str) -> None:
    """A user's own bench.md was replaced without a word; a folder named bench_stages.png failed the write
    after the whole run (``Is a directory``, leaving ``bench_stages.png.tmp``)."""
    if name == "bench_stages.png":
        pytest.importorskip("matplotlib")  # without it no chart is written, and nothing is in its way
    out = tmp_path / "b"
    out.mkdir()
    make(out / name)  # type: ignore[operator]
    before = sorted(os.listdir(out))
    run = bench(tiny_yaml, out, "--frames", frame_folder(tmp_path / "f", 50))
    assert (run.rc, run.out, run.err) == (2, "", f"error: --out '{out}' holds '{name}', which bench did not write "
                                                 f"({why}): give another --out, or move it away\n"), run
    assert sorted(os.listdir(out)) == before  # no model exported there, nothing written


def test_bench_replaces_its_own_reports(tiny_yaml: Path, tmp_path: Path) -> None:
    frames = frame_folder(tmp_path / "f", 50)
    for _ in range(2):
        run = bench(tiny_yaml, tmp_path / "b", "--frames", frames)
        assert run.rc == 0, run
    assert f"wrote {tmp_path / 'b' / 'bench.md'}" in run.out.splitlines()


def test_a_report_that_cannot_be_written_is_named_after_those_written(tiny_yaml: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk when the chart was written: ``error: No space left on device`` named no file, and bench.md and
    bench.json, on disk, were never said written."""
    pytest.importorskip("matplotlib")
    real_replace = os.replace

    def full_disk(src: object, dst: object, **kwargs: object) -> None:
        if os.path.basename(os.fspath(dst)) == "bench_stages.png":  # type: ignore[arg-type]
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", full_disk)
    out = tmp_path / "b"
    run = bench(tiny_yaml, out, "--frames", frame_folder(tmp_path / "f", 50))
    assert run.rc == 2 and run.err.splitlines()[-1] == \
        f"error: cannot write '{out / 'bench_stages.png'}': {os.strerror(errno.ENOSPC)}", run
    assert [line for line in run.out.splitlines() if line.startswith("wrote ")] == \
        [f"wrote {out / 'bench.md'}", f"wrote {out / 'bench.json'}"]
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["bench.json", "bench.md"]  # no temp file left
    assert report(out)["runs"] and np.isfinite(report(out)["runs"][0]["e2e_ms"]["p50"])
