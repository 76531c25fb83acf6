"""``infer`` opens only the pipelines its frames to run keep busy, each at a batch no larger than those frames: a
``--batch-size`` or ``--pipelines`` given that is cut says so in one note, a default shrinks unsaid, and the outputs
are those of ``--batch-size 1 --pipelines 1``.

Oracle: the sizes by hand (N frames, batch b, p pipelines: batch min(b, N), pipelines min(p, ceil(N / batch))); the
detectors counted as ``open_warm`` really opens them (CPU path, real ONNX Runtime, the assets' OpenPCDet checkpoint
and KITTI frames); the outputs of a ``--batch-size 1 --pipelines 1`` run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pointpillars_trt.apps.run_size import RunSize, cut_note
from pointpillars_trt.runtime_options import RuntimeOptions

from test_cli import CHECKPOINTS, Run, cli, opened_options

FRAMES = ["000000", "000001", "000002", "000003"]
WHY = "(more would only cost start time and memory)"


@pytest.mark.parametrize("batch, pipelines, frames, fitted", [
    (8, 4, 1, (1, 1)),     # the GPU's defaults, one frame: one engine at batch 1, not four at batch 8
    (8, 4, 12, (8, 2)),
    (8, 4, 40, (8, 4)),
    (1, 16, 4, (1, 4)),
    (3, 16, 4, (3, 2)),
    (3, 2, 7, (3, 2)),
    (8, 4, 0, (1, 1)),     # none to run (--eval of skipped frames): the model opens once, at batch 1
])
def test_a_run_size_fits_the_frames_to_run(batch: int, pipelines: int, frames: int,
                                           fitted: tuple[int, int]) -> None:
    assert RunSize(batch, pipelines).fitted(frames) == RunSize(*fitted)


def test_only_a_size_given_is_said_when_cut() -> None:
    assert cut_note(None, None, RunSize(1, 1), 1) is None  # the defaults (8, 4) cut for one frame: no promise broken
    assert cut_note(8, 4, RunSize(8, 4), 40) is None
    assert cut_note(None, 4, RunSize(1, 1), 1) == f"--pipelines 4 cut to 1: the 1 frame to run makes 1 batch of 1 {WHY}"
    assert cut_note(8, None, RunSize(3, 2), 5) == \
        f"--batch-size 8 cut to 3: the 5 frames to run make 2 batches of at most 3 {WHY}"


@pytest.fixture(scope="module")
def model(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model")
    assert cli("build", "--checkpoint", assets / "checkpoints" / CHECKPOINTS["openpcdet"], "--out", out).rc == 0
    return out


@pytest.fixture()
def opened(monkeypatch: pytest.MonkeyPatch) -> list[RuntimeOptions]:
    """The options of each detector a run opens, as the real ``open_warm`` opens it."""
    return opened_options(monkeypatch)


def batches(opened: list[RuntimeOptions]) -> list[int]:
    return [options.max_batch for options in opened]


def infer(model: Path, frames: list[Path], out: Path, *options: object) -> Run:
    return cli("infer", *frames, "--model", model, "--device", "cpu", "--out", out, "--no-progress", *options)


def cut_notes(run: Run) -> list[str]:
    return [line for line in run.err.splitlines() if line.startswith("note: ") and " cut to " in line]


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_cpu_run_opens_only_the_pipelines_its_frames_keep_busy(model: Path, assets: Path, tmp_path: Path,
                                                                 opened: list[RuntimeOptions]) -> None:
    frames = [assets / "kitti/training/velodyne_fov" / f"{stem}.bin" for stem in FRAMES]
    reference = infer(model, frames, tmp_path / "reference", "--batch-size", "1", "--pipelines", "1")
    assert reference.rc == 0 and batches(opened) == [1] and not cut_notes(reference), reference
    for options, sizes, note in [
        (["--pipelines", "16"], [1] * 4, f"--pipelines 16 cut to 4: the 4 frames to run make 4 batches of 1 {WHY}"),
        (["--batch-size", "8", "--pipelines", "16"], [4],
         f"--batch-size 8 cut to 4 and --pipelines 16 cut to 1: the 4 frames to run make 1 batch of 4 {WHY}"),
        (["--batch-size", "3", "--pipelines", "16"], [3, 3],
         f"--pipelines 16 cut to 2: the 4 frames to run make 2 batches of at most 3 {WHY}"),
    ]:
        opened.clear()
        out = tmp_path / "-".join(options)
        run = infer(model, frames, out, *options)
        assert run.rc == 0 and batches(opened) == sizes, (options, opened, run)
        assert cut_notes(run) == [f"note: {note}"], run.err
        assert files_of(out) == files_of(tmp_path / "reference")


def test_eval_of_skipped_frames_alone_opens_one_pipeline_at_batch_1(model: Path, assets: Path, tmp_path: Path,
                                                                    opened: list[RuntimeOptions]) -> None:
    """--eval with every frame's outputs there: the model opens for its classes, once, and evaluates as before."""
    frames = [assets / "kitti/training/velodyne_fov/000000.bin"]
    labels, out = assets / "kitti/training/label_2", tmp_path / "out"
    first = infer(model, frames, out, "--format", "kitti", "--eval", labels)
    assert first.rc == 0 and (out / "eval.json").is_file(), first
    evaluated = (out / "eval.json").read_bytes()
    (out / "eval.json").unlink()
    opened.clear()
    resumed = infer(model, frames, out, "--format", "kitti", "--eval", labels, "--skip-existing", "--batch-size", "8",
                    "--pipelines", "4")
    assert resumed.rc == 0 and batches(opened) == [1], (opened, resumed)
    assert cut_notes(resumed) == ["note: --batch-size 8 cut to 1 and --pipelines 4 cut to 1: no frame is left to run"]
    assert (out / "eval.json").read_bytes() == evaluated
