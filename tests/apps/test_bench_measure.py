"""bench's measurements on the CPU: the warm-up runs for its frames and for its time, every call of it is
untimed, ``--warmup-time`` is checked while parsing, and a CPU run's report says what it measured (the
frames its averages are of, wall-clock stages, the chart left out without matplotlib)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import numpy as np
import pytest

from pointpillars_trt.apps.bench.measure import measure_batches, measure_latency, measure_throughput, run_for
from pointpillars_trt.apps.cli import main

from test_cli import Run, brute_force_pillar_count, cli, tiny_points


def test_run_for_runs_for_its_count_and_its_time() -> None:
    calls: list[int] = []
    assert run_for(calls.append, 5, 0.0) == 5 and calls == [0, 1, 2, 3, 4]
    calls.clear()
    start = time.perf_counter()
    made = run_for(lambda i: (calls.append(i), time.sleep(0.01)), 2, 0.15)
    spent = time.perf_counter() - start
    assert made == len(calls) and calls == list(range(made))
    assert spent >= 0.15 and 5 <= made <= 16, (made, spent)  # ~15 sleeps of 10 ms, not 2
    assert run_for(calls.append, 0, 0.0) == 0


def test_run_for_counts_its_time_from_the_end_of_the_first_call() -> None:
    """A first call longer than the warm-up (a cold start) does not count towards its seconds."""
    calls: list[int] = []

    def call(i: int) -> None:
        calls.append(i)
        time.sleep(0.2 if i == 0 else 0.01)

    start = time.perf_counter()
    made = run_for(call, 2, 0.1)
    spent = time.perf_counter() - start
    assert spent >= 0.3 and 5 <= made <= 13, (made, spent)  # the cold call, then ~10 calls of 10 ms (2 before)


class _SlowDetect:
    """``detect`` of a pipeline whose frame takes ``seconds``: it counts its calls."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0

    def __call__(self, frame: object) -> object:
        self.calls += 1
        time.sleep(self.seconds)
        return type("D", (), {"stats": type("S", (), {"num_pillars": 1})()})()


def test_latency_and_batches_report_the_warm_up_they_ran() -> None:
    frames = [np.zeros((3, 4), np.float32)]
    detect = _SlowDetect(0.005)
    run = measure_latency(detect, dict, frames, iterations=4, warmup=2, warmup_s=0.1)
    assert run["iterations"] == 4 and run["warmup"] >= 10 and detect.calls == run["warmup"] + 4
    assert run["e2e_ms"]["p50"] >= 5.0
    batches = _SlowDetect(0.005)
    sweep = measure_batches(batches, frames, batch=2, iterations=3, warmup=1, warmup_s=0.05)
    assert sweep["warmup"] >= 5 and batches.calls == sweep["warmup"] + 3


def test_throughput_warms_all_pipelines_up_together_before_timing() -> None:
    class Pipeline:
        def __init__(self) -> None:
            self.calls = 0

        def detect_batch(self, frames: list[np.ndarray]) -> None:
            self.calls += 1
            time.sleep(0.002)

        def close(self) -> None:
            pass

    made: list[Pipeline] = []

    def make() -> Pipeline:
        made.append(Pipeline())
        return made[-1]

    start = time.perf_counter()
    fps = measure_throughput(make, [np.zeros((3, 4), np.float32)], pipelines=2, frames_per_pipeline=10,
                             batch=1, warmup_s=0.2)
    assert time.perf_counter() - start >= 0.2
    # 2 graph-capturing calls, ~100 warm-up calls of 2 ms, 10 timed: the rate is of the 10 alone
    assert all(p.calls >= 10 + 2 + 30 for p in made), [p.calls for p in made]
    assert 2 / 0.002 / 4 < fps < 2 / 0.002 * 1.2, fps
    made.clear()
    start = time.perf_counter()
    fps = measure_throughput(make, [np.zeros((3, 4), np.float32)], pipelines=2, frames_per_pipeline=10,
                             batch=4, seconds=0.3)
    # 10 frames are 2 batches of 4 (~4 ms): the timed part still lasts 0.3 s, and counts all its batches
    assert time.perf_counter() - start >= 0.3 and all(p.calls >= 2 + 50 for p in made), [p.calls for p in made]
    assert 2 * 4 / 0.002 / 4 < fps < 2 * 4 / 0.002 * 1.2, fps


def test_warmup_time_is_checked_while_parsing(tmp_path: Path) -> None:
    for value in ("-1", "nan", "601"):
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            main(["bench", "--warmup-time", value, "--out", str(tmp_path / "b")])
        assert exit_info.value.code == 2 and "argument --warmup-time: " in err.getvalue(), err.getvalue()
    assert not (tmp_path / "b").exists()


def test_bench_lists_are_taken_each_value_once_and_counts_ascending() -> None:
    """``--batches 8,1`` ran the throughput test at batch 1 (the last given), where the help promises the largest, and
    a value or precision given twice was measured twice, a row of the report each time."""
    from pointpillars_trt.apps.cli import build_parser

    args = build_parser().parse_args(["bench", "--batches", "8,1,4,8", "--pipelines", "4,1,4",
                                      "--precisions", "fp16,fp32,fp16", "--sweep-precisions", "fp16,fp16"])
    assert (args.batches, args.pipelines, args.precisions, args.sweep_precisions) == (
        [1, 4, 8], [1, 4], ["fp16", "fp32"], ["fp16"])


def test_a_pipeline_that_fails_stops_the_throughput_test_with_its_error() -> None:
    """A pipeline raising in the warm-up or the timed part: the others stop waiting for it and its error
    reaches the caller (the barriers between the parts would otherwise wait for it forever)."""
    class Failing:
        def __init__(self, fail_at: int) -> None:
            self.calls, self.fail_at = 0, fail_at

        def detect_batch(self, frames: list[np.ndarray]) -> None:
            self.calls += 1
            time.sleep(0.001)
            if self.calls == self.fail_at:
                raise RuntimeError(f"pipeline failed at call {self.fail_at}")

        def close(self) -> None:
            pass

    for fail_at, warmup_s in ((4, 0.2), (40, 0.0)):  # in the warm-up; in the timed part
        made = iter([Failing(10**9), Failing(fail_at), Failing(10**9)])
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                measure_throughput(lambda: next(made), [np.zeros((3, 4), np.float32)], pipelines=3,
                                   frames_per_pipeline=100, warmup_s=warmup_s, seconds=0.2)
            except RuntimeError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive(), f"the throughput test hung after a failure at call {fail_at}"
        assert [str(e) for e in outcome] == [f"pipeline failed at call {fail_at}"]


#: Points of the three frames of the small CPU bench: different sizes, so an average over the wrong frames shows.
FRAME_POINTS = (40, 120, 300)


BenchSetup = tuple[Path, Path, list[np.ndarray]]


@pytest.fixture(scope="module")
def bench_setup(tmp_path_factory: pytest.TempPathFactory) -> BenchSetup:
    """(the tiny config's YAML, a folder of three .bin frames of FRAME_POINTS points, those frames)."""
    import yaml
    from tiny import tiny_config

    root = tmp_path_factory.mktemp("bench")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config().to_dict()))
    frames = [tiny_points(seed, n) for seed, n in enumerate(FRAME_POINTS)]
    (root / "frames").mkdir()
    for k, points in enumerate(frames):
        points.tofile(root / "frames" / f"{k:06d}.bin")
    return config, root / "frames", frames


def cpu_bench(setup: BenchSetup, out: Path, *flags: object) -> Run:
    config, folder, _ = setup
    run = cli("bench", "--device", "cpu", "--config", config, "--frames", folder, "--no-baselines", "--out", out,
              *flags)
    assert run.rc == 0, run
    return run


@pytest.mark.parametrize("iterations", [2, 7])
def test_avg_points_and_avg_pillars_are_of_the_same_frames(bench_setup: BenchSetup, tmp_path: Path,
                                                           iterations: int) -> None:
    """Fewer iterations than frames time the first frames only; more time some frames twice: both columns
    are then of each distinct frame timed, once (pillars counted here by brute force)."""
    from tiny import tiny_config

    cpu_bench(bench_setup, tmp_path, "--iterations", iterations)
    timed = bench_setup[2][:iterations]
    run = json.loads((tmp_path / "bench.json").read_text())["runs"][0]
    assert run["avg_points"] == pytest.approx(np.mean([len(points) for points in timed]))
    assert run["avg_pillars"] == pytest.approx(np.mean([brute_force_pillar_count(points, tiny_config())
                                                        for points in timed]))


def test_a_cpu_bench_says_its_stages_are_wall_clock_and_that_no_chart_is_drawn_without_matplotlib(
        bench_setup: BenchSetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` fail
    run = cpu_bench(bench_setup, tmp_path, "--iterations", 1)
    said = ("no PNG: matplotlib is not installed: install matplotlib to get the PNG "
            "(pip install 'pointpillars-trt[plot]')")
    assert said in run.out.splitlines(), run.out
    assert [line for line in run.out.splitlines() if line.startswith("wrote ")] == \
        [f"wrote {tmp_path / 'bench.md'}", f"wrote {tmp_path / 'bench.json'}"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["bench.json", "bench.md"]
    report = (tmp_path / "bench.md").read_text()
    assert f"- {said}" in report and said in json.loads((tmp_path / "bench.json").read_text())["notes"]
    heading = next(line for line in report.splitlines() if line.startswith("## Latency"))
    assert "stages: wall clock per stage" in heading and "CUDA events" not in heading, heading
    assert "stage timings off" not in heading, heading  # the CPU path times its stages in the timed pass


def test_a_bench_checks_for_matplotlib_once_and_draws_its_chart(bench_setup: BenchSetup, tmp_path: Path) -> None:
    """One check decides both the chart and the note (the chart writer checked a second time)."""
    pytest.importorskip("matplotlib")
    from pointpillars_trt.apps.viz import require_matplotlib

    checks = 0

    def count_checks(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal checks
        if event == "call" and frame.f_code is require_matplotlib.__code__:
            checks += 1

    sys.setprofile(count_checks)  # the calls of this thread, which runs the command
    try:
        run = cpu_bench(bench_setup, tmp_path, "--iterations", 1)
    finally:
        sys.setprofile(None)
    assert checks == 1
    assert f"wrote {tmp_path / 'bench_stages.png'}" in run.out.splitlines() and "no PNG" not in run.out, run.out


def test_a_folder_named_like_a_frame_is_no_frame_of_a_bench_set(tmp_path: Path) -> None:
    """``--frames DIR`` lists its .bin files as ``infer DIR`` does: a subfolder named ``x.bin`` is left out
    (it ended the bench as "a directory, not a regular file")."""
    from pointpillars_trt.apps.bench.frames import folder_frame_sets

    (tmp_path / "x.bin").mkdir()
    for k in range(2):
        tiny_points(k, 50).tofile(tmp_path / f"{k:06d}.bin")
    said: list[str] = []
    sets, left_out, _ = folder_frame_sets([str(tmp_path)], limit=2, say=said.append)
    assert [len(frames) for frames in sets.values()] == [2] and said == [] and left_out == []
    np.testing.assert_array_equal(sets[f"{tmp_path.name} (2 frames)"][1], tiny_points(1, 50))


def test_bench_out_in_the_model_dir_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    """bench wrote its report into a model dir, which build then refused to rebuild."""
    from pointpillars_trt.apps.cli import main
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model").path
    before = sorted(os.listdir(model))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["bench", "--model", str(model), "--out", str(model / "bench"), "--device", "cpu"])
    assert rc == 2 and err.getvalue() == (
        f"error: --out {str(model / 'bench')!r} lies in the model dir {str(model)!r}, whose one writer is build (a "
        "rebuild would refuse the files bench leaves there): give a folder outside it\n"), err.getvalue()
    assert sorted(os.listdir(model)) == before
