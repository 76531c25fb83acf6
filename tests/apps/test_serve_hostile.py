"""``infer --server`` against servers that answer wrongly or late: a real ``tritonserver`` on loopback serving
deliberately broken or slow Python-backend models (tests/data/serve/hostile_model.py), next to the real one.

A foreign model (no class names) stops the run with one line before any frame; a reply with a missing
output, a wrong shape, a label past the class list or a negative count is that frame's error; a stream closed
while a slow server holds its requests gives them up at once.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from test_serve_triton import START_TIMEOUT, install  # noqa: F401 - the fixture finding tritonserver

from out_folder import output_names
from pointpillars_trt.apps.cli import main
from pointpillars_trt.apps.serve.repository import MODEL_NAME, model_config_text
from pointpillars_trt.apps.serve.server import TritonServer
from pointpillars_trt.detector import FrameResult
from pointpillars_trt.errors import BackendError

if TYPE_CHECKING:
    from pointpillars_trt.apps.serve.client import RemoteDetector

pytestmark = pytest.mark.slow  # real tritonservers with deliberately broken models: CI runs them with -m slow

HOSTILE = Path(__file__).resolve().parent.parent / "data" / "serve" / "hostile_model.py"
MODES = ("missing_labels", "boxes_of_five", "label_out_of_range", "negative_count", "scores_as_int",
         "score_above_one", "negative_size")


def hostile_model(repo: Path, name: str, mode: str, *, class_names: bool = True) -> None:
    """REPO/NAME: the hostile model under pointpillars-trt's own config (or one without class names)."""
    from tiny import tiny_config

    from pointpillars_trt.model_dir import ModelDir

    text = model_config_text(ModelDir(repo, tiny_config(), {"precision": "fp32"}), instances=1, max_batch=4,
                             max_queue_delay_us=0, device="cpu", max_points=1000)
    lines = [line for line in text.splitlines() if class_names or "class_names" not in line]
    lines = [f'name: "{name}"' if line.startswith("name:") else line for line in lines]
    lines.append(f'parameters {{ key: "mode", value: {{ string_value: "{mode}" }} }}')
    (repo / name / "1").mkdir(parents=True)
    shutil.copyfile(HOSTILE, repo / name / "1" / "model.py")
    (repo / name / "config.pbtxt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def hostile_server(install, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]  # noqa: F811
    root = tmp_path_factory.mktemp("hostile")
    repo = root / "repo"
    hostile_model(repo, MODEL_NAME, "missing_labels")
    hostile_model(repo, "foreign", "none", class_names=False)
    for mode in MODES[1:]:
        hostile_model(repo, mode, mode)
    server = TritonServer(repo, install=install, log=root / "server.log")
    with server.start(timeout=START_TIMEOUT):
        yield server


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_foreign_model_is_one_line_for_the_run(hostile_server: TritonServer, protocol: str) -> None:
    from pointpillars_trt.apps.serve.client import RemoteDetector

    with pytest.raises(BackendError, match=r"model 'foreign' is not a pointpillars-trt model: .*no class_names"):
        RemoteDetector(hostile_server.endpoints[protocol], protocol=protocol, model="foreign")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("mode, problem", [
    ("boxes_of_five", r"inconsistent shapes boxes \(1, 1, 5\)"),
    ("label_out_of_range", r"labels outside 0..2"),
    ("negative_count", r"negative counts"),
    ("scores_as_int", r"scores as int32, expected float32|refused the frame"),  # whichever side notices first
    ("score_above_one", r"scores outside \[0, 1\]"),
    ("negative_size", r"boxes of negative size"),
])
def test_a_bad_reply_is_that_frames_error(hostile_server: TritonServer, protocol: str, mode: str, problem: str) -> None:
    from pointpillars_trt.apps.serve.client import RemoteDetector

    remote = RemoteDetector(hostile_server.endpoints[protocol], protocol=protocol, model=mode)
    try:
        frames = [np.zeros((3, 4), np.float32), np.ones((2, 4), np.float32)]
        results = list(remote.infer_many(frames, concurrency=2))
    finally:
        remote.close()
    assert [r.source for r in results] == ["frame 0", "frame 1"]
    for result in results:
        assert result.detections is None and isinstance(result.error, BackendError)
        assert "\n" not in str(result.error)
        assert re.search(problem, str(result.error)), str(result.error)


def test_infer_cli_reports_a_missing_output_per_frame_and_goes_on(hostile_server: TritonServer, tmp_path: Path) -> None:
    """The served 'pointpillars' model leaves out its labels output: each frame gets one error line, the
    run ends with exit code 1, no traceback and no output file."""
    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(3):
        np.zeros((5, 4), np.float32).tofile(frames / f"{i:06d}.bin")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["infer", str(frames), "--out", str(tmp_path / "out"), "--no-progress",
                   "--server", hostile_server.endpoints["grpc"], "--in-flight", "2"])
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    assert rc == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    assert len(errors) == 3 and all("missing labels" in line for line in errors), errors
    assert output_names(tmp_path / "out") == []


@pytest.fixture(scope="module")
def foreign_server(install, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]  # noqa: F811
    """A server whose 'pointpillars' model is not ours (its config has no class names)."""
    root = tmp_path_factory.mktemp("foreign")
    hostile_model(root / "repo", MODEL_NAME, "none", class_names=False)
    server = TritonServer(root / "repo", install=install, log=root / "server.log")
    with server.start(timeout=START_TIMEOUT):
        yield server


def test_infer_cli_against_a_foreign_model_is_one_line(foreign_server: TritonServer, tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    np.zeros((5, 4), np.float32).tofile(frames / "000000.bin")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["infer", str(frames), "--out", str(tmp_path / "out"), "--no-progress",
                   "--server", foreign_server.endpoints["http"], "--protocol", "http"])
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "is not a pointpillars-trt model" in lines[0], err.getvalue()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_infer_against_a_server_without_our_model_names_the_server_to_give(install, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A Triton server that serves no 'pointpillars' model: infer --server names no model, so the fix is the address of
    a server that pointpillars-trt serve started (it said to "give the name of a model it serves", which no option
    of infer does)."""
    hostile_model(tmp_path / "repo", "other", "none", class_names=False)
    np.zeros((5, 4), np.float32).tofile(tmp_path / "000000.bin")
    server = TritonServer(tmp_path / "repo", install=install, log=tmp_path / "server.log")
    with server.start(timeout=START_TIMEOUT):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["infer", str(tmp_path / "000000.bin"), "--out", str(tmp_path / "out"), "--no-progress",
                       "--server", server.endpoints["grpc"]])
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(
        f"error: server {server.endpoints['grpc']} (grpc): serves no model 'pointpillars' ("), err.getvalue()
    assert lines[0].endswith("): give the address of a server that pointpillars-trt serve started (the model it "
                             "serves is 'pointpillars')"), lines[0]


#: Seconds the sleeping model holds a stream's request that the stream gives up on: far more than giving up takes
HELD = 20.0


@pytest.fixture(scope="module")
def sleeping_server(install, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]  # noqa: F811
    """A server whose 'pointpillars' model answers a frame of one point as many seconds late as its x says; its stop
    does not wait out the requests it still holds."""
    root = tmp_path_factory.mktemp("sleeping")
    hostile_model(root / "repo", MODEL_NAME, "sleeps")
    server = TritonServer(root / "repo", install=install, log=root / "server.log", exit_timeout=1)
    with server.start(timeout=START_TIMEOUT):
        yield server


def late(seconds: float) -> np.ndarray:
    """A frame the sleeping model answers ``seconds`` late."""
    return np.array([[seconds, 0, 0, 0]], np.float32)


def read_in_thread(remote: RemoteDetector, frames: list[np.ndarray], concurrency: int,
                   ) -> tuple[threading.Thread, list[FrameResult]]:
    """``remote.infer_many(frames)`` read to its end in a thread of its own, its results in the list (a daemon: one
    that hangs fails its test's join, not the run)."""
    results: list[FrameResult] = []
    thread = threading.Thread(target=lambda: results.extend(remote.infer_many(frames, concurrency=concurrency)),
                              daemon=True)
    thread.start()
    return thread, results


def answered(results: list[FrameResult], count: int) -> bool:
    """Whether ``results`` are those of ``count`` frames given as arrays, each answered."""
    return [(result.source, result.error) for result in results] == [(f"frame {i}", None) for i in range(count)]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_stream_closed_early_gives_up_on_its_own_requests_at_once(sleeping_server: TritonServer,
                                                                     protocol: str) -> None:
    """An infer_many closed after its first result while the server holds its second request for 20 s returns at
    once (over HTTP it waited that request out), while another infer_many of the same detector, running meanwhile
    on the detector's threads, gets every result; after, the detector answers a call and a stream on all its
    threads at once (the one that gave up its request too), and its threads and open files are as many as before."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    remote = RemoteDetector(sleeping_server.endpoints[protocol], protocol=protocol, timeout=60, concurrency=4)
    try:
        warm = list(remote.infer_many([late(0.3)] * 4, concurrency=4))  # the 4 threads, each with its connection
        assert answered(warm, 4), warm
        threads, files = threading.active_count(), len(os.listdir("/proc/self/fd"))
        other, others = read_in_thread(remote, [late(0.5)] * 8, concurrency=2)
        stream = remote.infer_many([late(0), late(HELD)], concurrency=2)
        assert next(stream).error is None
        started = time.monotonic()
        stream.close()
        took = time.monotonic() - started
        still_running = other.is_alive()
        other.join(30)
        assert took < 2.0, f"the close took {took:.1f} s"
        assert still_running, "the other stream had ended before the close"
        assert answered(others, 8), others
        assert remote(late(0)).stats.num_points == 1
        after, again = read_in_thread(remote, [late(0.3)] * 4, concurrency=4)
        after.join(30)
        assert not after.is_alive() and answered(again, 4), again
        assert threading.active_count() == threads
        assert len(os.listdir("/proc/self/fd")) <= files
    finally:
        remote.close()
