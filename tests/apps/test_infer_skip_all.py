"""``infer --skip-existing`` into a folder that already holds every frame's outputs: which frames to run
is read from ``--out`` alone, so such a run (a cron job run again, a finished batch resumed) says the
frames skipped and ends without loading the model.

Oracle of "no model was opened": after a real first run (the CPU path, a model dir built from the
synthetic OpenPCDet checkpoint, real KITTI frames), the bytes of its RPN graph are replaced by others, so
opening it can only fail (``damaged or replaced``, exit 2); its ``model.json``, which names the model in
--out's settings record, stays as it was. A run that still has a frame to run, or a failed frame to retry,
must open it: it fails that way, and runs the frame once the graph is back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
from pathlib import Path

import pytest

from pointpillars_trt.apps.cli import main

NO_PYARROW = "pyarrow is not installed (pip install '.[parquet]', or '.[test-scaleout]')"
PARQUET = pytest.param("parquet", marks=pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                                                           reason=NO_PYARROW))
NO_MODEL = "damaged or replaced"
def nothing_run(skipped: int) -> str:
    """The summary of a run with no frame to run: every format's says nothing was written, and how many were skipped."""
    their = "its outputs were" if skipped == 1 else "their outputs were"
    return f"0/0 frames to run ({skipped} skipped: {their} there), 0 boxes, nothing written\n"


def infer(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["infer", *map(str, args), "--device", "cpu", "--no-progress"])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def model_dir(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model dir of the synthetic OpenPCDet checkpoint, built once for the module."""
    path = tmp_path_factory.mktemp("built") / "model"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["build", "--checkpoint", str(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"),
                     "--out", str(path)]) == 0
    return path


class Job:
    """Real KITTI frames (camera-view crops) and a copy of the model dir whose RPN graph ``spoiled`` replaces."""

    def __init__(self, assets: Path, folder: Path, count: int, model_dir: Path) -> None:
        self.assets, self.frames, self.model = assets, folder / "frames", folder / "model"
        self.frames.mkdir()
        self.scans = sorted((assets / "kitti" / "training" / "velodyne_fov").glob("*.bin"))
        for scan in self.scans[:count]:
            shutil.copyfile(scan, self.frames / scan.name)
        shutil.copytree(model_dir, self.model)

    def add_frame(self) -> Path:
        scan = self.scans[len(list(self.frames.iterdir()))]
        shutil.copyfile(scan, self.frames / scan.name)
        return self.frames / scan.name

    def run(self, out: Path, fmt: str, *extra: object, also: Path | None = None) -> tuple[int, str, str]:
        """infer of the frames (and the path ``also``) into ``out``."""
        calib = ["--calib", self.assets / "kitti" / "training" / "calib"] if fmt == "kitti" else []
        paths = [self.frames] if also is None else [self.frames, also]
        return infer(*paths, "--model", self.model, "--out", out, "--format", fmt, *calib, *extra)

    @contextlib.contextmanager
    def spoiled(self):  # type: ignore[no-untyped-def]
        """The RPN graph's bytes replaced by text (opening --model fails) for the block."""
        graph = self.model / "rpn.onnx"
        kept = graph.read_bytes()
        graph.write_text("not a graph")
        try:
            yield
        finally:
            graph.write_bytes(kept)


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def rows_of(out: Path, fmt: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for part in sorted(out.glob(f"detections-*.{fmt}")):
        if fmt == "jsonl":
            rows += [json.loads(line) for line in part.read_text().splitlines()]
        else:
            import pyarrow.parquet as pq

            rows += pq.read_table(part).to_pylist()
    return rows


@pytest.mark.parametrize("fmt", ["json", "kitti", "jsonl", PARQUET])
def test_skip_existing_with_every_frame_done_ends_without_opening_the_model(
        assets: Path, model_dir: Path, tmp_path: Path, fmt: str) -> None:
    job = Job(assets, tmp_path, 2, model_dir)
    out = tmp_path / "out"
    rc, stdout, err = job.run(out, fmt)
    assert rc == 0 and stdout.startswith("2/2 frames") and "running on CPU" in err, (stdout, err)
    first = files_of(out)
    with job.spoiled():
        rc, stdout, err = job.run(tmp_path / "control", fmt)  # a run with frames to run opens it, and cannot
        assert rc == 2 and NO_MODEL in err, err
        rc, stdout, err = job.run(out, fmt, "--skip-existing")
        assert rc == 0, err
        assert err == f"skipping 2 frames whose outputs are already in {out}\n"  # no device notice: no model
        assert stdout == nothing_run(2)
        missing = tmp_path / "missing.bin"  # a path that gives no frame is still said, and exits 1
        rc, stdout, err = job.run(out, fmt, "--skip-existing", also=missing)
        assert rc == 1 and err.splitlines() == [f"skipping 2 frames whose outputs are already in {out}",
                                                f"error: point file {str(missing)!r} does not exist",
                                                "1 path gave no frame (listed above)"], err
    assert files_of(out) == first
    absent = tmp_path / "absent"  # a --model that names nothing is refused even with nothing to run
    rc, _, err = infer(job.frames, "--model", absent, "--out", out, "--format", fmt, "--skip-existing")
    assert rc == 2 and err == f"error: --model {str(absent)!r}: no such checkpoint file or model dir\n", err
    assert files_of(out) == first


@pytest.mark.parametrize("fmt", ["json", "kitti"])
def test_skip_existing_with_every_frame_done_and_thresholds_given_before_opens_the_model_to_compare_them(
        assets: Path, model_dir: Path, tmp_path: Path, fmt: str) -> None:
    """Outputs made with a threshold given, resumed with it left to the model: only the model knows its own, so the
    run opens it (and, when it differs, refuses); it had skipped every frame as if the settings were the same."""
    job = Job(assets, tmp_path, 2, model_dir)
    out = tmp_path / "out"
    assert job.run(out, fmt, "--score-threshold", "0.5")[0] == 0
    first = files_of(out)
    with job.spoiled():
        rc, _, err = job.run(out, fmt, "--skip-existing")
        assert rc == 2 and NO_MODEL in err, err
    rc, stdout, err = job.run(out, fmt, "--skip-existing")
    assert rc == 2 and stdout == "" and "(--score-threshold 0.5 there, 0.1 (the model's) now)" in err, err
    rc, stdout, err = job.run(out, fmt, "--skip-existing", "--score-threshold", "0.5")
    assert rc == 0 and stdout == nothing_run(2), (stdout, err)
    assert files_of(out) == first


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_skip_existing_with_one_frame_left_opens_the_model_and_runs_it(
        assets: Path, model_dir: Path, tmp_path: Path, fmt: str) -> None:
    job = Job(assets, tmp_path, 2, model_dir)
    out, whole = tmp_path / "out", tmp_path / "whole"
    assert job.run(out, fmt)[0] == 0
    first = files_of(out)
    new = job.add_frame()
    with job.spoiled():  # a frame to run: the model is opened, and cannot be
        rc, _, err = job.run(out, fmt, "--skip-existing")
        assert rc == 2 and NO_MODEL in err and "skipping" not in err and files_of(out) == first, err
    rc, stdout, err = job.run(out, fmt, "--skip-existing")
    assert rc == 0 and stdout.startswith("1/1 frames"), (stdout, err)
    lines = err.splitlines()
    assert lines[0] == "running on CPU, ONNX Runtime, fp32" and "skipping 2 frames" in lines[1], err
    assert job.run(whole, fmt)[0] == 0  # the three frames in one run
    if fmt == "json":
        assert files_of(out) == files_of(whole)
    else:
        rows = rows_of(out, fmt)
        assert [Path(str(row["source"])).name for row in rows[2:]] == [new.name]
        assert rows == rows_of(whole, fmt)


@pytest.mark.parametrize("fmt", ["jsonl", PARQUET])
def test_skip_existing_with_a_failed_row_warns_and_retry_failed_opens_the_model_to_rerun_it(
        assets: Path, model_dir: Path, tmp_path: Path, fmt: str) -> None:
    """Every frame has a row, one of them a failure's: --skip-existing skips them all without the model
    (the earlier failure said after the skipping line, exit 0); --retry-failed has that frame to run, so it
    opens the model (and, when it cannot, leaves the failure's row where it is)."""
    job = Job(assets, tmp_path, 2, model_dir)
    broken = job.frames / "zz_broken.bin"
    broken.write_bytes(b"\0" * 12)  # not a whole number of float32 x, y, z, intensity points
    out = tmp_path / "out"
    assert job.run(out, fmt)[0] == 1
    first = files_of(out)
    with job.spoiled():
        rc, stdout, err = job.run(out, fmt, "--skip-existing")
        assert rc == 0 and stdout == nothing_run(3), (stdout, err)
        lines = err.splitlines()
        assert lines[0] == f"skipping 3 frames whose outputs are already in {out}", err
        assert lines[1].startswith("warning: 1 of them failed in an earlier run") and len(lines) == 2, err
        rc, _, err = job.run(out, fmt, "--skip-existing", "--retry-failed")
        assert rc == 2 and NO_MODEL in err and files_of(out) == first, err
    shutil.copyfile(job.scans[5], broken)  # fixed
    rc, stdout, err = job.run(out, fmt, "--skip-existing", "--retry-failed")
    assert rc == 0 and stdout.startswith("1/1 frames"), (stdout, err)
    assert "running on CPU" in err and "skipping 2 frames" in err and "rerunning 1 frame that" in err, err
    rows = rows_of(out, fmt)
    assert sorted(Path(str(row["source"])).name for row in rows) == sorted(p.name for p in job.frames.iterdir())
    assert all(row["error"] is None for row in rows) and rows[-1]["num_pillars"]


def test_skip_existing_eval_with_every_frame_done_still_opens_the_model_for_its_classes(
        assets: Path, model_dir: Path, tmp_path: Path) -> None:
    """--eval evaluates the model's classes, which only the opened model says: a run with every frame
    skipped still opens it, and evaluates every frame from the label files in --out."""
    job = Job(assets, tmp_path, 2, model_dir)
    labels = assets / "kitti" / "training" / "label_2"
    out = tmp_path / "out"
    rc, first, _ = job.run(out, "kitti", "--eval", labels)
    assert rc == 0 and "KITTI evaluation of 2 frames" in first
    with job.spoiled():
        rc, _, err = job.run(out, "kitti", "--eval", labels, "--skip-existing")
        assert rc == 2 and NO_MODEL in err, err
    rc, stdout, err = job.run(out, "kitti", "--eval", labels, "--skip-existing")
    assert rc == 0 and "skipping 2 frames" in err and "running on CPU" in err, err
    assert stdout.split("\n", 1)[1] == first.split("\n", 1)[1]  # the same evaluation, after the summary line


def test_an_earlier_failure_among_the_skipped_frames_is_said_in_the_singular_for_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--skip-existing over rows of one earlier failure said 'their rows in ... hold the error ...; pass
    --retry-failed to rerun them', and '1 of them' after 'skipping 1 frame': each word now agrees with its count."""
    from pointpillars_trt.apps.resume import Resume, say_resume

    out = tmp_path / "out"
    tail = "the error, and a frame with a row is not run again; pass --retry-failed to rerun"
    for skipped, failed, said in (
            (["a.bin"], ["a.bin"], f"it failed in an earlier run ('a.bin'): its row in {out} holds {tail} it"),
            (["a.bin", "b.bin"], ["b.bin"], f"1 of them failed in an earlier run ('b.bin'): its row in {out} holds "
                                            f"{tail} it"),
            (["a.bin", "b.bin", "c.bin"], ["b.bin", "c.bin"],
             f"2 of them failed in an earlier run (e.g. 'b.bin'): their rows in {out} hold {tail} them")):
        say_resume(Resume([], skipped=skipped, failed_before=failed), "jsonl", out, retry=False)
        assert capsys.readouterr().err.splitlines() == [
            f"skipping {len(skipped)} frame{'s' * (len(skipped) > 1)} whose outputs are already in {out}",
            f"warning: {said}"]
