"""The backend registry (runtime/backends.py) is the one list of backends: the CLI's choices, the engine
options, the file each backend loads, open_engine's dispatch and the pipeline's pick all follow it.

Oracles: the parsers the CLI really builds, the files a real tiny model dir holds, real ONNX Runtime
sessions, and this machine's own availability answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path

import pytest

from pointpillars_trt.apps.cli import build_parser
from pointpillars_trt.errors import BackendError
from pointpillars_trt.runtime import BACKENDS, EngineRequest, engine_file, engine_options_for, open_engine
from pointpillars_trt.runtime.backends import AUTO, BACKEND_NAMES, gpu_backend_rows, pick_backend


def _choices(parser: argparse.ArgumentParser, command: str, option: str) -> tuple[str, ...]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if option in a.option_strings)
    return tuple(action.choices)


def test_every_backend_option_of_the_cli_lists_exactly_the_registry() -> None:
    parser = build_parser()
    assert set(_choices(parser, "infer", "--backend")) == {AUTO, *BACKENDS}
    assert set(_choices(parser, "demo", "--backend")) == {AUTO, *BACKENDS}
    assert set(_choices(parser, "build", "--backend")) == set(BACKENDS)


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_each_row_is_complete_and_consistent(name: str) -> None:
    row = BACKENDS[name]
    assert row.name == name and row.label.startswith(name)
    assert dataclasses.is_dataclass(row.options_type) and row.options_type.__dataclass_params__.frozen  # type: ignore[attr-defined]
    options = engine_options_for(name, EngineRequest(device_id=0, tf32=True, precision="fp16", config_digest="d" * 16))
    assert type(options) is row.options_type
    reason = row.unavailable_reason()
    assert reason is None or (isinstance(reason, str) and "\n" not in reason)
    assert row.artefact in ("onnx", "plan") and "cuda" in row.devices
    assert len({r.auto_priority for r in BACKENDS.values()}) == len(BACKENDS)


def test_engine_file_and_dispatch_follow_the_artefact(tmp_path: Path) -> None:
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=1)
    for name, row in BACKENDS.items():
        path = engine_file(model, "rpn", name)
        assert path == (model.plan_path("rpn") if row.artefact == "plan" else model.onnx_path("rpn"))
    with open_engine(model.pfn_path, device="cpu") as engine:  # no options: the suffix picks ONNX Runtime
        assert engine.backend == "onnxruntime"
    plan_rows = [row for row in BACKENDS.values() if row.artefact == "plan"]
    for row in plan_rows:  # a plans backend never opens an ONNX graph
        with pytest.raises(BackendError, match="cannot open this file"):
            open_engine(model.rpn_path, row.options_type(), device="cuda")
    gpu_only = [row for row in BACKENDS.values() if "cpu" not in row.devices and row.artefact == "onnx"]
    for row in gpu_only:
        with pytest.raises(BackendError, match="runs on cuda only"):
            open_engine(model.rpn_path, row.options_type(), device="cpu")


def test_pick_backend_names_what_cannot_run_here(tmp_path: Path) -> None:
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=1)
    with pytest.raises(BackendError, match="expected one of auto, " + ", ".join(BACKEND_NAMES)):
        pick_backend(model, "tensorrt-rtx-9000")
    for name, row in BACKENDS.items():
        reason = row.unavailable_reason()
        if reason is None:
            assert pick_backend(model, name) == name
        else:
            with pytest.raises(BackendError, match=f"backend {name}: "):
                pick_backend(model, name)
    runnable = sorted((r for r in BACKENDS.values() if r.suits(model) and r.unavailable_reason() is None),
                      key=lambda r: r.auto_priority)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fallback notice, said once per process
        picked = pick_backend(model, AUTO)
    if runnable:
        assert picked == runnable[0].name
    else:  # nothing runs here: the last resort, which fails at open with its own reason
        assert picked == max(BACKENDS.values(), key=lambda r: r.auto_priority).name


def test_auto_takes_the_cudnn_engine_before_onnxruntime_for_every_model_dir(tmp_path: Path) -> None:
    """The measured order (docs/BENCHMARK_H200.md): the cuDNN engine's fp16, TF32 and IEEE fp32 RPNs beat
    ONNX Runtime's, on the single-head models and on the multi-head one."""
    from types import SimpleNamespace

    from tiny import tiny_model_dir

    from pointpillars_trt.config import load_config

    cudnn, ort = BACKENDS["cudnn"], BACKENDS["onnxruntime"]
    assert cudnn.auto_priority < ort.auto_priority
    for precision in ("fp32", "fp16"):
        assert cudnn.suits(tiny_model_dir(tmp_path / precision, precision=precision))
    multi_head = load_config("openpcdet_nuscenes_multihead")
    for precision in ("fp32", "fp16"):
        assert cudnn.suits(SimpleNamespace(precision=precision, cfg=multi_head))  # type: ignore[arg-type]


def test_gpu_backend_rows_are_the_registry_by_priority_with_each_probe_answer(tmp_path: Path) -> None:
    """What bench times and what ``auto`` tries come from one walk of the registry: the rows by priority (given a
    model dir, those that suit it), each with its availability probe's answer, or failing that its GPU's."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", seed=1)  # ONNX graphs only: the plans backend does not suit it
    suiting = sorted((row for row in BACKENDS.values() if row.artefact == "onnx"), key=lambda r: r.auto_priority)
    assert list(gpu_backend_rows(0, model)) == [(row, row.unavailable_reason() or row.runs_on(0)) for row in suiting]
