"""``RuntimeOptions``: the one value that says how a detector runs, built by the CLI and passed by infer,
Triton and Ray alike; the detector's keyword arguments are a shorthand that builds the same value.

Oracles: detectors opened both ways on a real tiny model dir, and the CLI's real parser.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.apps.cli import build_parser
from pointpillars_trt.apps.runtime_args import runtime_options_from_args
from pointpillars_trt.config import Thresholds
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import BackendError, PointPillarsError
from pointpillars_trt.runtime_options import RuntimeOptions, parse_device


@pytest.mark.parametrize("text, parsed", [("auto", ("auto", None)), ("cpu", ("cpu", None)), ("cuda", ("cuda", None)),
                                          ("cuda:0", ("cuda", 0)), ("cuda:12", ("cuda", 12))])
def test_parse_device(text: str, parsed: tuple[str, int | None]) -> None:
    assert parse_device(text) == parsed


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cpu:0", "cuda:-1", "cuda:x", "auto:1", "", "cuda:١"])
def test_parse_device_refuses(text: str) -> None:
    with pytest.raises(PointPillarsError, match="expected auto, cpu, cuda or cuda:N"):
        parse_device(text)


@pytest.mark.parametrize("text, meant", [("0", "cuda:0"), ("1", "cuda:1"), ("gpu", "cuda"), ("GPU:1", "cuda:1"),
                                         ("CPU", "cpu"), ("Cuda:0", "cuda:0"), ("cuda:", None), ("cpu:0", None),
                                         ("gpu:x", None), ("tpu", None), ("", None)])
def test_another_tools_device_name_gets_the_one_meant(text: str, meant: str | None) -> None:
    """trtexec's --device=0 and PyTorch's device=0 name GPU 0, others say gpu or upper case: the refusal names the
    device string meant; a name of no device gets no guess."""
    with pytest.raises(PointPillarsError) as info:
        parse_device(text)
    expected = f"device {text!r}: expected auto, cpu, cuda or cuda:N" + (f"; did you mean {meant}?" if meant else "")
    assert str(info.value) == expected


@pytest.mark.parametrize("bad, needle", [({"device": "gpu"}, "device"), ({"backend": "tensorrt-llm"}, "backend"),
                                         ({"max_batch": 9}, "max_batch"), ({"max_batch": True}, "max_batch"),
                                         ({"threads": 0}, "threads"), ({"tf32": 1}, "tf32"),
                                         ({"stage_timings": "on"}, "stage_timings"),
                                         ({"precision": "int8"}, "precision"), ({"thresholds": 0.3}, "thresholds")])
def test_options_are_validated(bad: dict, needle: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(PointPillarsError, match=needle):
        RuntimeOptions(**bad)


def test_threads_beyond_this_machines_cores_are_taken_and_capped_where_the_detector_runs() -> None:
    """RuntimeOptions travel to Ray workers and Triton instances whose cores this machine's need not be: the
    range alone is checked here (beyond them it was refused), and ``capped_threads`` caps where they run."""
    from pointpillars_trt.runtime_options import capped_threads, max_threads

    cores = max_threads()
    s = "s" * (cores > 1)
    assert RuntimeOptions(threads=cores + 63).threads == cores + 63
    assert capped_threads(cores, "--threads N") == (cores, None)
    assert capped_threads(cores + 1, f"--threads {cores + 1}") == (
        cores, f"--threads {cores + 1} is more than the {cores} core{s} where the detector runs: {cores} thread{s}")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity to run this process on one core")
def test_threads_capped_at_one_core_are_said_in_the_singular() -> None:
    """A process allowed one core (taskset, a cpuset) said '... more than the 1 cores where the detector runs:
    1 threads'."""
    from pointpillars_trt.runtime_options import capped_threads

    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        said = capped_threads(2, "--threads 2")
    finally:
        os.sched_setaffinity(0, allowed)
    assert said == (1, "--threads 2 is more than the 1 core where the detector runs: 1 thread")


def test_cpu_threads_take_the_asked_else_omp_num_threads_capped_at_the_cores_unless_they_run_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The one rule of the detector, infer and the Ray driver: the count asked, else OMP_NUM_THREADS, at most the
    cores (a Ray driver leaves the cap to each worker); the setting named is that of the count given back."""
    from pointpillars_trt.runtime_options import cpu_threads, max_threads

    cores = max_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", str(cores + 1))
    s = "s" * (cores > 1)
    beyond = f"OMP_NUM_THREADS={cores + 1} is more than the {cores} core{s} where the detector runs: {cores} thread{s}"
    assert cpu_threads(None, "--threads ") == (cores, f"OMP_NUM_THREADS={cores}", beyond)
    assert cpu_threads(None, "--threads ", cap=False) == (cores + 1, f"OMP_NUM_THREADS={cores + 1}", None)
    assert cpu_threads(1, "threads=") == (1, "threads=1", None)
    assert cpu_threads(cores + 2, "--threads ", cap=False) == (cores + 2, f"--threads {cores + 2}", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2x")
    assert cpu_threads(None, "threads=", cap=False) == (
        None, None, "OMP_NUM_THREADS='2x' is no thread count (a positive whole number): left out, ONNX Runtime picks "
                    "its own")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_threads(None, "threads=") == (None, None, None)


@pytest.mark.parametrize("cores, pipelines, asked, each, note", [
    (8, 1, None, None, None),
    (8, 1, 16, 16, None),
    (8, 2, None, 4, "2 pipelines on the CPU share its 8 cores: 4 ONNX Runtime threads each"),
    (8, 3, None, 2, "3 pipelines on the CPU share its 8 cores: 2 ONNX Runtime threads each"),
    (2, 3, None, 1, "3 pipelines on the CPU share its 2 cores: 1 ONNX Runtime thread each; more pipelines than "
                    "cores only contend for them: --pipelines 2"),
    (8, 2, 4, 4, None),
    (8, 2, 5, 5, "--pipelines 2 with --threads 5: 10 ONNX Runtime threads contend for 8 cores; --threads 4 gives "
                 "each pipeline its share"),
    (2, 4, 1, 1, "--pipelines 4 with --threads 1: 4 ONNX Runtime threads contend for 2 cores; --pipelines 2 runs "
                 "them without contending"),
    (8, 9, 3, 3, "--pipelines 9 with --threads 3: 27 ONNX Runtime threads contend for 8 cores; --pipelines 2 runs "
                 "them without contending"),
    # a machine (or a container's share) of one core said "its 1 cores"
    (1, 2, None, 1, "2 pipelines on the CPU share its 1 core: 1 ONNX Runtime thread each; more pipelines than cores "
                    "only contend for them: --pipelines 1"),
    (1, 2, 1, 1, "--pipelines 2 with --threads 1: 2 ONNX Runtime threads contend for 1 core; --pipelines 1 runs them "
                 "without contending"),
])
def test_cpu_pipelines_split_the_cores_unless_threads_are_asked(monkeypatch, cores, pipelines, asked, each,  # type: ignore[no-untyped-def]
                                                                note) -> None:
    import pointpillars_trt.runtime_options as runtime_options

    monkeypatch.setattr(runtime_options, "max_threads", lambda: cores)
    assert runtime_options.pipeline_threads(pipelines, asked, f"--threads {asked}") == (each, note)


@pytest.mark.parametrize("bad, needle", [({"threads": np.float64(2.0)}, "threads"),
                                         ({"max_batch": np.bool_(True)}, "max_batch"),
                                         ({"max_batch": np.int64(0)}, "max_batch"),
                                         ({"score_threshold": np.float32(np.nan)}, "score_threshold"),
                                         ({"max_boxes": np.float32(5)}, "max_boxes")])
def test_numpy_numbers_are_refused_by_the_same_rules(bad: dict, needle: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(PointPillarsError, match=needle):
        RuntimeOptions.of(**bad)


def test_numpy_numbers_are_held_as_python_numbers_and_round_trip_through_json() -> None:
    """What a caller reads from an array or a config: the same options as the plain numbers give."""
    options = RuntimeOptions.of(device="cpu", threads=np.int64(1), max_batch=np.int32(2),
                                score_threshold=np.float32(0.25), nms_iou=np.float64(0.5), max_boxes=np.int64(5))
    assert options == RuntimeOptions.of(device="cpu", threads=1, max_batch=2, score_threshold=0.25, nms_iou=0.5,
                                        max_boxes=5)
    values = (options.threads, options.max_batch, *dataclasses.astuple(options.thresholds))
    assert [type(v) for v in values] == [int, int, float, float, int]
    assert RuntimeOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options


def test_flat_keywords_build_the_same_value_and_round_trip_through_json() -> None:
    options = RuntimeOptions.of(device="cpu", threads=2, score_threshold=0.3, max_boxes=7)
    assert options == RuntimeOptions(device="cpu", threads=2, thresholds=Thresholds(0.3, None, 7))
    assert RuntimeOptions.from_dict(options.to_dict()) == options
    with pytest.raises(PointPillarsError, match="unknown runtime option 'score_treshold'"):
        RuntimeOptions.of(score_treshold=0.3)


def test_the_detector_takes_the_options_or_the_keywords_alike(tmp_path: Path) -> None:
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=3)
    rng = np.random.default_rng(4)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    points = np.column_stack([rng.uniform(lo, hi, (800, 3)), rng.uniform(0, 1, 800)]).astype(np.float32)
    options = RuntimeOptions(device="cpu", thresholds=Thresholds(score_threshold=0.0, nms_iou=0.05, max_boxes=20))
    with PointPillars(model, options) as a, PointPillars(model, device="cpu", score_threshold=0.0, nms_iou=0.05,
                                                         max_boxes=20) as b:
        assert a.options == b.options == options
        first, second = a(points), b(points)
        assert len(first) == 20
        np.testing.assert_array_equal(first.boxes, second.boxes)
    with pytest.raises(PointPillarsError, match="not both"):
        PointPillars(model, options, device="cpu")
    with pytest.raises(BackendError, match="holds fp32 graphs"):
        PointPillars(model, RuntimeOptions(device="cpu", precision="fp16"))


def test_the_cli_builds_one_value_from_its_arguments(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    checkpoint = tmp_path / "m.pth"
    checkpoint.write_bytes(b"")
    args = build_parser().parse_args(["infer", "x.bin", "--model", str(model_dir), "--device", "cuda:1", "--backend",
                                      "cudnn", "--batch-size", "4", "--threads", "1", "--no-tf32", "--score-threshold",
                                      "0.25", "--nms-iou", "0.1", "--max-boxes", "50"])
    assert runtime_options_from_args(args) == RuntimeOptions(
        device="cuda:1", backend="cudnn", tf32=False, threads=1, max_batch=4, precision=None,
        thresholds=Thresholds(0.25, 0.1, 50))  # a model dir runs as built: --precision is for exports
    args.model = str(checkpoint)
    assert runtime_options_from_args(args).precision == "fp32"  # an export's default
    args.precision = "fp16"
    assert runtime_options_from_args(args).precision == "fp16"


def test_readmes_options_example_runs_as_written(tmp_path: Path) -> None:
    """README's ``RuntimeOptions`` example, its paths a real model dir: ``from pointpillars_trt import
    RuntimeOptions`` raised ImportError (it was only in ``pointpillars_trt.runtime_options``), and README never
    said where the constructor's ``ModelDir`` comes from."""
    import warnings

    from pointpillars_trt import PointPillars as Public, RuntimeOptions as PublicOptions, Thresholds as PublicThresholds
    from pointpillars_trt.errors import CpuFallbackWarning
    from pointpillars_trt.model_dir import load_model_dir
    from tiny import tiny_model_dir

    path = tiny_model_dir(tmp_path / "m").path
    options = PublicOptions(device="auto", cuda_graph=False, thresholds=PublicThresholds(score_threshold=0.5))
    assert PublicOptions is RuntimeOptions and Public is PointPillars
    for opened in (lambda: Public.from_model_dir(path, options=options), lambda: Public(load_model_dir(path), options)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CpuFallbackWarning)  # device auto on a machine without the GPU path
            detector = opened()
        with detector:
            assert detector.options == options and not detector.options.cuda_graph
            assert detector.cfg.postprocess.score_threshold == 0.5
