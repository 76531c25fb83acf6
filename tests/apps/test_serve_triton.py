"""``pointpillars-trt serve`` on a real ``tritonserver`` (loopback, free ports, CPU detector) and its client.

Oracles: the local detector called on the same frames (bit-exact boxes, scores, labels and stats), the
local ``infer`` command's JSON / KITTI files (byte-identical), Triton's own health, statistics and
Prometheus endpoints. The binary comes from $PP_TRITONSERVER or PATH (CI: the nvidia-pytriton wheel
unpacked by .ci/install_scaleout.sh); without it, or without tritonclient, these tests skip.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import numpy as np
import pytest

from array_likes import CudaInterfaceOnly
from out_folder import output_names
from pointpillars_trt.apps.run_settings import SETTINGS_FILE
from pointpillars_trt.apps.cli import main as cli_main
from pointpillars_trt.apps.serve.cli import add_serve_parser, run_scaleout_infer
from pointpillars_trt.apps.serve.repository import MODEL_NAME, write_repository
from pointpillars_trt.apps.serve.server import TritonServer, find_tritonserver
from pointpillars_trt.detections import Detections
from pointpillars_trt.detector import PointPillars
from pointpillars_trt.errors import BackendError, InputError, InputWarning
from pointpillars_trt.pointcloud_io import read_points

pytestmark = pytest.mark.slow  # a real tritonserver per module: end to end, tens of seconds

CHECKPOINT = "checkpoints/pointpillar_openpcdet_synthetic.pth"
MAX_POINTS = 5000
START_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def install():  # type: ignore[no-untyped-def]
    pytest.importorskip("tritonclient.grpc", reason="tritonclient not installed (pip install -e '.[test-scaleout]')")
    pytest.importorskip("tritonclient.http", reason="tritonclient not installed (pip install -e '.[test-scaleout]')")
    if not (os.environ.get("PP_TRITONSERVER") or shutil.which("tritonserver")):
        pytest.skip("tritonserver not found: set PP_TRITONSERVER (bash .ci/install_scaleout.sh prints it) or put it on PATH")
    return find_tritonserver()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tiny import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=3)


@contextlib.contextmanager
def served(install, model: str | Path, root: Path, **options: int) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]
    write_repository(model, root / "repo", device="cpu", **options)
    server = TritonServer(root / "repo", install=install, log=root / "server.log")
    with server.start(timeout=START_TIMEOUT):
        yield server


@pytest.fixture(scope="module")
def tiny_server(install, tiny, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]
    with served(install, tiny.path, tmp_path_factory.mktemp("tiny_server"), max_points=MAX_POINTS,
                max_batch=8, max_queue_delay_us=20000) as server:
        yield server


@pytest.fixture(scope="module")
def kitti_server(install, assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]
    with served(install, assets / CHECKPOINT, tmp_path_factory.mktemp("kitti_server")) as server:
        yield server


def random_frames(model, count: int, seed: int = 0) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Frames of many sizes (0 points, a few, more than the pillar cap) partly outside the range."""
    rng = np.random.default_rng(seed)
    lo, hi = np.array(model.cfg.voxel.point_range[:3]), np.array(model.cfg.voxel.point_range[3:])
    sizes = [0, 1, 7, 50, 300, 900, 2500, 4999][:count]
    return [np.column_stack([rng.uniform(lo - 1, hi + 1, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32)
            for n in sizes]


def assert_same(remote: Detections, local: Detections) -> None:
    assert remote.boxes.dtype == np.float32 and remote.boxes.shape == local.boxes.shape
    np.testing.assert_array_equal(remote.boxes, local.boxes)
    np.testing.assert_array_equal(remote.scores, local.scores)
    np.testing.assert_array_equal(remote.labels, local.labels)
    assert remote.class_names == local.class_names and remote.stats == local.stats


def raw_client(server: TritonServer, protocol: str):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpc
    import tritonclient.http as http

    module = grpc if protocol == "grpc" else http
    return module, module.InferenceServerClient(server.endpoints[protocol])


def raw_infer(server: TritonServer, protocol: str, array: np.ndarray, datatype: str = "FP32"):  # type: ignore[no-untyped-def]
    module, client = raw_client(server, protocol)
    request = module.InferInput("points", list(array.shape), datatype)
    request.set_data_from_numpy(array)
    try:
        return client.infer(MODEL_NAME, [request])
    finally:
        client.close()


def infer_args(paths: list[str], out: Path, server: str, protocol: str, *options: str) -> argparse.Namespace:
    """What the CLI parses for ``infer PATHS --out O --server S --protocol P OPTIONS``."""
    from pointpillars_trt.apps.cli import build_parser

    return build_parser().parse_args(["infer", *paths, "--out", str(out), "--no-progress", "--server", server,
                                      "--protocol", protocol, "--in-flight", "4", *options])


def report_lines(out: str, err: str, out_dir: Path) -> tuple[list[str], list[str]]:
    """infer's stdout and stderr lines, the run's frames/s left out, its --out folder named OUT, and
    without local infer's line on the device it runs on (the server's model runs elsewhere)."""
    import re

    def lines(text: str) -> list[str]:
        return [re.sub(r" \([0-9.]+ frames/s\)$", "", line).replace(str(out_dir), "OUT") for line in text.splitlines()
                if not line.startswith("running on ")]

    return lines(out), lines(err)


def run_captured(fn, *args):  # type: ignore[no-untyped-def]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = fn(*args)
    return rc, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- tiny model, always on

def test_infer_many_calls_over_http_share_the_detectors_threads_and_keep_files_flat(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    """Many infer_many calls of one RemoteDetector over HTTP: the process's open files stay flat (each call started
    threads of its own, and tritonclient kept three file descriptors for each until the process ended: ~12 a call
    here), and the results those of one call; a call stopped early returns."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = random_frames(tiny, 6)
    remote = RemoteDetector(tiny_server.endpoints["http"], protocol="http", concurrency=8)
    try:
        first = list(remote.infer_many(frames, concurrency=4))
        opened = len(os.listdir("/proc/self/fd"))
        for _ in range(10):
            again = list(remote.infer_many(frames, concurrency=4))
            assert [(r.source, r.error) for r in again] == [(r.source, r.error) for r in first]
            for result, before in zip(again, first):
                assert_same(result.detections, before.detections)
        assert len(os.listdir("/proc/self/fd")) - opened < 6
        stopped = remote.infer_many(frames * 4, concurrency=2)  # a caller that stops early: no request left behind
        next(stopped)
        stopped.close()
    finally:
        remote.close()


def settled_statistics(client: Any) -> dict[str, Any]:
    """The served model's statistics once its inference count has held for half a second (at most 10 s): the
    requests of an earlier test's stream closed early, which the server still answers, counted before them."""
    deadline = time.monotonic() + 10
    stats = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
        if again.get("inference_count") == stats.get("inference_count"):
            return again
        stats = again
    return stats


def test_concurrent_http_and_grpc_clients_get_the_local_detections_bit_exact(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = random_frames(tiny, 8)
    frames[4][:, 3] = 3e38  # corrupt intensities: overflowed features and scores, whose counts the replies carry too
    with PointPillars(tiny, device="cpu") as detector:
        expected = [detector(f) for f in frames]
    assert expected[4].stats.num_overflowed_scores > 0 and expected[4].stats.num_overflowed_features > 0
    _, client = raw_client(tiny_server, "grpc")
    before = settled_statistics(client)  # not while a request an earlier test gave up on is still answered
    results: dict[tuple[str, int], list] = {}  # type: ignore[type-arg]

    def one_client(protocol: str, index: int) -> None:
        remote = RemoteDetector(tiny_server.endpoints[protocol], protocol=protocol)
        try:
            results[protocol, index] = list(remote.infer_many(frames, concurrency=4))
        finally:
            remote.close()

    threads = [threading.Thread(target=one_client, args=(p, i)) for p in ("grpc", "http") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 4
    for found in results.values():
        assert [r.source for r in found] == [f"frame {i}" for i in range(len(frames))]
        for result, local in zip(found, expected):
            assert result.error is None and result.detections is not None
            assert_same(result.detections, local)
    deadline = time.monotonic() + 10  # the statistics are updated after the responses go out
    while True:
        after = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
        inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
        executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
        if inferences == 4 * len(frames) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    client.close()
    assert inferences == 4 * len(frames)
    assert executions < inferences, "the dynamic batcher never put two ragged frames in one batch"


def test_a_client_says_what_the_replies_count_once_as_the_local_detector_says_it(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    """A corrupt intensity (3e38) overflows the network on the server; its reply counts the overflowed class
    scores and pillar features, which a Python caller of RemoteDetector was never told of (the local detector
    warns). Now one InputWarning a client, in the local detector's words, at the caller's line, through a call,
    a batch or infer_many; a frame whose pillars outnumber max_pillars is said once too, naming the frame."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    usual = random_frames(tiny, 6)[5]
    corrupt = usual.copy()
    corrupt[::50, 3] = 3e38
    dense = random_frames(tiny, 8)[7]
    with PointPillars(tiny, device="cpu") as detector:
        detector(usual)  # its first frame's intensity check, which the server's detector makes
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            local = [detector(corrupt), detector(dense)]
    expected = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert local[0].stats.num_overflowed_features > 0 and local[1].stats.num_pillars_dropped > 0
    assert len(expected) == 2 and "pillar features overflowed" in expected[0] and "max_pillars" in expected[1]
    for entry in ("call", "detect_batch", "infer_many"):
        remote = RemoteDetector(tiny_server.endpoints["grpc"])
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if entry == "call":
                    found = [remote(usual), remote(corrupt), remote(corrupt), remote(dense), remote(dense)]
                elif entry == "detect_batch":
                    found = remote.detect_batch([usual, corrupt, dense, corrupt, dense])
                else:
                    found = [r.detections for r in remote.infer_many([usual, corrupt, dense, corrupt, dense])]
        finally:
            remote.close()
        said = [w for w in caught if issubclass(w.category, InputWarning)]
        name = {"call": "the frame", "detect_batch": "frame 2 of the batch", "infer_many": "'frame 2'"}[entry]
        assert [str(w.message) for w in said] == [expected[0], expected[1].replace("the frame", name, 1)], entry
        assert {w.filename for w in said} == {__file__}, entry
        assert found[1] is not None and found[1].stats == local[0].stats, entry


def test_pipelines_of_one_instance_answer_through_response_senders_with_the_local_detections(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--pipelines 3 --max-batch 2``: ``execute`` stages each batch of up to 2 frames on one of 3
    pipelines and returns; the requests are answered through their response senders, each reply equal
    to the local detector's."""
    frames = random_frames(tiny, 8)
    jobs = [index % len(frames) for index in range(24)]
    with PointPillars(tiny, device="cpu") as detector:
        expected = [detector(frame) for frame in frames]
    with served(install, tiny.path, tmp_path, max_points=MAX_POINTS, pipelines=3, max_batch=2,
                max_queue_delay_us=50000) as server:
        module, client = raw_client(server, "grpc")
        done: dict[int, tuple[object, object]] = {}
        finished = threading.Event()

        def callback(key: int, result: object, error: object) -> None:
            done[key] = (result, error)
            if len(done) == len(jobs):
                finished.set()

        for key, index in enumerate(jobs):  # all in flight together
            client.async_infer(MODEL_NAME, threshold_inputs(module, frames[index]), callback=functools.partial(callback, key))
        assert finished.wait(60), f"{len(done)} of {len(jobs)} replies"
        stats = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
        client.close()
    for key, index in enumerate(jobs):
        reply, error = done[key]
        assert error is None, error
        np.testing.assert_array_equal(reply.as_numpy("boxes")[0], expected[index].boxes)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(reply.as_numpy("scores")[0], expected[index].scores)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(reply.as_numpy("labels")[0], expected[index].labels)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(reply.as_numpy("num_pillars")[0], [expected[index].stats.num_pillars])  # type: ignore[attr-defined]
    # batches in flight at once on several pipelines are tested in test_serve_pipelines.py
    assert int(stats["inference_count"]) > int(stats["execution_count"]), "Triton never formed a batch of 2"


def threshold_inputs(module, frame: np.ndarray, **thresholds: float | int) -> list:  # type: ignore[no-untyped-def,type-arg]
    """The inputs of one request: the frame plus the optional threshold inputs given."""
    inputs = [module.InferInput("points", [1, *frame.shape], "FP32")]
    inputs[0].set_data_from_numpy(frame[None])
    for name, value in thresholds.items():
        datatype, dtype = ("INT32", np.int32) if name == "max_boxes" else ("FP32", np.float32)
        inputs.append(module.InferInput(name, [1, 1], datatype))
        inputs[-1].set_data_from_numpy(np.array([[value]], dtype))
    return inputs


# Every request carries all three inputs: Triton batches only requests with the same set of inputs.
THRESHOLD_SETTINGS = [{"score_threshold": s, "nms_iou": n, "max_boxes": m}
                      for s, n, m in ((0.1, 0.01, 500), (0.0, 0.01, 500), (0.0, 0.5, 500), (0.0, 0.01, 3))]
BAD_THRESHOLDS = {"max_boxes": 501, "nms_iou": float("nan")}


def test_per_request_thresholds_in_one_batch_each_get_their_own_detections(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    """Requests with different thresholds, sent at once so the dynamic batcher mixes them, each get what
    the local detector gives with those thresholds; a bad value fails only its own request; a request
    without them gets the model's."""
    from pointpillars_trt.config import Thresholds

    frames = random_frames(tiny, 8)[5:]
    jobs = [(f, s) for f in range(len(frames)) for s in range(len(THRESHOLD_SETTINGS))] * 2
    with PointPillars(tiny, device="cpu") as detector:
        expected = {(f, s): detector(frames[f], thresholds=Thresholds(**THRESHOLD_SETTINGS[s]))  # type: ignore[arg-type]
                    for f, s in set(jobs)}
    counts = [len(expected[0, s]) for s in range(len(THRESHOLD_SETTINGS))]
    assert len(set(counts)) == len(counts), f"the settings must change the result to test anything: {counts}"
    module, client = raw_client(tiny_server, "grpc")
    before = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
    done: dict[object, tuple[object, object]] = {}
    finished = threading.Event()
    total = len(jobs) + len(BAD_THRESHOLDS)

    def callback(key: object, result: object, error: object) -> None:
        done[key] = (result, error)
        if len(done) == total:
            finished.set()

    for index, (f, s) in enumerate(jobs):  # all in flight together, on one connection
        client.async_infer(MODEL_NAME, threshold_inputs(module, frames[f], **THRESHOLD_SETTINGS[s]),
                           callback=functools.partial(callback, index))
    for name, value in BAD_THRESHOLDS.items():
        client.async_infer(MODEL_NAME, threshold_inputs(module, frames[0], **{**THRESHOLD_SETTINGS[0], name: value}),
                           callback=functools.partial(callback, name))
    assert finished.wait(60), f"{len(done)} of {total} replies"
    for index, job in enumerate(jobs):
        reply, error = done[index]
        assert error is None, error
        local = expected[job]
        np.testing.assert_array_equal(reply.as_numpy("boxes")[0], local.boxes)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(reply.as_numpy("scores")[0], local.scores)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(reply.as_numpy("labels")[0], local.labels)  # type: ignore[attr-defined]
    assert ("max_boxes 501: this server returns at most 500 boxes a frame (its detector's cap, set when it was "
            "served); ask for at most 500") in str(done["max_boxes"][1])  # a raw client's fix, not "open it with ..."
    plain = client.infer(MODEL_NAME, threshold_inputs(module, frames[0]))
    np.testing.assert_array_equal(plain.as_numpy("scores")[0], expected[0, 0].scores)  # the model's: setting 0
    assert "nms_iou: expected a finite number in [0, 1], got nan" in str(done["nms_iou"][1])
    deadline = time.monotonic() + 10  # the statistics are updated after the responses go out
    while True:
        after = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
        inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
        executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
        if inferences >= len(jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    client.close()
    assert executions < inferences, "the dynamic batcher never put two requests in one batch"


def count_requests_in_flight(monkeypatch, seconds: float) -> list[int]:  # type: ignore[no-untyped-def]
    """Count ``RemoteDetector`` requests in flight at once (each held ``seconds`` longer, so that the others
    pile up behind it: ``_detect``, one request, whichever call sent it); the returned list's one item is the peak
    so far (set it to 0 to start again)."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    now, peak, lock = [0], [0], threading.Lock()
    send = RemoteDetector._detect

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        try:
            time.sleep(seconds)
            return send(self, *args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(RemoteDetector, "_detect", counted)
    return peak


def test_detect_batch_keeps_at_most_concurrency_requests_in_flight(tiny, tiny_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every frame of a call was in flight at once (its pool was sized by the frames): 40 frames at
    concurrency 2 timed out on a CPU server. A later call's larger concurrency is given as asked."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    peak = count_requests_in_flight(monkeypatch, seconds=0.02)
    remote = RemoteDetector(tiny_server.endpoints["grpc"])
    frames = random_frames(tiny, 12)
    try:
        for concurrency in (2, 1, 6):
            peak[0] = 0
            found = remote.detect_batch(frames, concurrency=concurrency)
            assert len(found) == len(frames) and min(2, concurrency) <= peak[0] <= concurrency, (concurrency, peak[0])
    finally:
        remote.close()

def test_a_refused_frame_costs_the_others_of_its_batch_no_second_request(tiny, tiny_server, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                           monkeypatch) -> None:
    """A batch of infer --server with one frame over the server's points cap: that frame fails alone and
    each other frame is sent once (the batch used to be sent again frame by frame, one at a time)."""
    from pointpillars_trt.apps.serve.cli import run_scaleout_infer
    from pointpillars_trt.apps.serve.client import RemoteDetector

    calls: list[int] = []
    send = RemoteDetector._detect  # one request, whichever call sent it

    def counted(self, points, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(points))
        return send(self, points, *args, **kwargs)

    monkeypatch.setattr(RemoteDetector, "_detect", counted)
    frames = random_frames(tiny, 8)
    frames.insert(3, np.zeros((MAX_POINTS + 1, 4), np.float32))
    paths = []
    for index, frame in enumerate(frames):
        paths.append(str(tmp_path / f"{index:06d}.bin"))
        frame.tofile(paths[-1])
    rc, out, err = run_captured(run_scaleout_infer, infer_args(paths, tmp_path / "out", tiny_server.endpoints["grpc"],
                                                               "grpc", "--in-flight", "16"))
    assert rc == 1 and out.startswith("8/9 frames") and f"{MAX_POINTS + 1} points, more than the cap" in err, (out, err)
    assert sorted(calls) == sorted(len(frame) for frame in frames), calls


def test_infer_in_flight_bounds_the_requests_of_the_whole_run(tiny, tiny_server, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               monkeypatch) -> None:
    """``infer --server --in-flight N`` keeps at most N requests in flight, and reaches N: the run's two
    pipelines used to send batches of N at the client's default of 8 each (at most 8 a batch, 16 in all)."""
    from pointpillars_trt.apps.serve.cli import run_scaleout_infer

    peak = count_requests_in_flight(monkeypatch, seconds=0.05)
    paths = []
    for index, frame in enumerate(frame for seed in range(4) for frame in random_frames(tiny, 8, seed)):
        paths.append(str(tmp_path / f"{index:06d}.bin"))
        frame.tofile(paths[-1])
    for in_flight, least in ((3, 2), (12, 9)):
        peak[0] = 0
        args = infer_args(paths, tmp_path / f"out{in_flight}", tiny_server.endpoints["grpc"], "grpc",
                          "--in-flight", str(in_flight))
        rc, _, err = run_captured(run_scaleout_infer, args)
        assert rc == 0, err
        assert least <= peak[0] <= in_flight, (in_flight, peak[0])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_empty_frame_comes_back_as_zero_by_seven(tiny_server, protocol: str) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.apps.serve.client import RemoteDetector

    reply = raw_infer(tiny_server, protocol, np.zeros((1, 0, 4), np.float32))
    assert reply.as_numpy("boxes").shape == (1, 0, 7) and reply.as_numpy("scores").shape == (1, 0)
    remote = RemoteDetector(tiny_server.endpoints[protocol], protocol=protocol)
    found = remote(np.zeros((0, 4), np.float32))
    assert remote.detect_batch([]) == [] and remote.detect_batch(np.zeros((0, 5, 4), np.float32)) == []
    assert len(remote.detect_batch(np.zeros((0, 4), np.float32) for _ in range(2))) == 2  # a generator of frames
    for wrong, said in ((None, "got None"), (np.zeros((5, 4), np.float32), "got one array of shape (5, 4)")):
        with pytest.raises(InputError, match=re.escape(f"frames: expected a list of frames ((N, 4) arrays), {said}")):
            remote.detect_batch(wrong)  # type: ignore[arg-type]
    remote.close()
    assert found.boxes.shape == (0, 7) and len(found) == 0 and found.stats.num_points == 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_requests_get_their_own_error_and_the_server_stays_up(tiny, tiny_server, protocol: str) -> None:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    from pointpillars_trt.apps.serve.client import RemoteDetector

    bad = {
        "FP64": (np.zeros((1, 5, 4), np.float64), "FP64", "FP64"),
        "3 columns": (np.zeros((1, 5, 3), np.float32), "FP32", "shape"),
        "2 frames in one request": (np.zeros((2, 5, 4), np.float32), "FP32", "one frame"),
        "over the cap": (np.zeros((1, MAX_POINTS + 1, 4), np.float32), "FP32", f"cap of {MAX_POINTS}"),
    }
    for name, (array, datatype, needle) in bad.items():
        with pytest.raises(InferenceServerException) as caught:
            raw_infer(tiny_server, protocol, array, datatype)
        assert needle in str(caught.value), (name, str(caught.value))
    remote = RemoteDetector(tiny_server.endpoints[protocol], protocol=protocol)
    with pytest.raises(InputError, match=f"big: {MAX_POINTS + 1} points, more than the cap of {MAX_POINTS} of server"):
        remote(np.zeros((MAX_POINTS + 1, 4), np.float32), "big")
    # a GPU array is the client's to copy to the host: it was told to open "the detector on the GPU", which it has not
    with pytest.raises(InputError, match=r"^gpu: a GPU array \(CUDA\), given to a remote detector, which sends the "
                       r"server the points' bytes from host memory: copy it to the host first \(CuPy: points.get\(\); "
                       r"Numba: points.copy_to_host\(\)\)$"):
        remote(CudaInterfaceOnly((100, 4)), "gpu")
    frame = random_frames(tiny, 5)[4]
    with PointPillars(tiny, device="cpu") as detector:
        assert_same(remote(frame), detector(frame))
    remote.close()
    with urllib.request.urlopen(f"http://{tiny_server.endpoints['http']}/v2/health/ready", timeout=5) as reply:
        assert reply.status == 200


def test_a_raw_request_of_batch_size_0_gets_its_error_at_once_and_the_server_still_stops_cleanly(  # type: ignore[no-untyped-def]
        install, tiny, tmp_path: Path) -> None:
    """A raw client's points of shape [0, 0, 4] (no frame) reach the backend without their batch dimension, and the
    Python backend, counting 0 frames, released the request unanswered: its client waited out its timeout, and
    the server's stop then waited out its exit timeout (exit code 1). A server of its own: on old code, that stop."""
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    timeout = 10.0  # bounds the test where the request is never answered
    with served(install, tiny.path, tmp_path, max_points=MAX_POINTS, max_batch=8, max_queue_delay_us=20000) as server:
        for module in (grpc, http):
            client = module.InferenceServerClient(
                server.endpoints["grpc" if module is grpc else "http"],
                **({} if module is grpc else {"network_timeout": timeout}))
            cases = {"[0, 0, 4]": ({"points": (0, 0, 4)}, "expected one frame of shape [1, N, 4] float32 per request, "
                                                          "got [0, 0, 4] float32"),
                     "points of batch 0 and score_threshold of batch 1": (
                         {"points": (0, 0, 4), "score_threshold": (1, 1)}, "batch size does not match other inputs")}
            for name, (shapes, said) in cases.items():
                inputs = []
                for input_name, shape in shapes.items():
                    inputs.append(module.InferInput(input_name, list(shape), "FP32"))
                    inputs[-1].set_data_from_numpy(np.zeros(shape, np.float32))
                started = time.monotonic()
                with pytest.raises(InferenceServerException) as caught:
                    client.infer(MODEL_NAME, inputs, **({"client_timeout": timeout} if module is grpc else {}))
                assert time.monotonic() - started < timeout / 2, (module.__name__, name)
                assert said in str(caught.value), (module.__name__, name, str(caught.value))
            client.close()
        reply = raw_infer(server, "grpc", random_frames(tiny, 5)[4][None])  # a frame still gets its detections
        assert reply.as_numpy("boxes").shape[0] == 1
        assert server.stop() == 0  # no request left in flight: not the exit timeout's exit code 1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_max_boxes_beyond_any_detectors_limit_is_told_the_servers_cap(tiny, tiny_server, protocol: str) -> None:  # type: ignore[no-untyped-def]
    """A raw client's max_boxes above 4,096 (every detector's limit) was told "expected an integer in 1..4096",
    and then, asking for 4,096, that this server returns at most 500: it is told the server's cap at once."""
    from tritonclient.utils import InferenceServerException

    module, client = raw_client(tiny_server, protocol)
    try:
        for asked in (5000, 2**31 - 1):
            with pytest.raises(InferenceServerException) as caught:
                client.infer(MODEL_NAME, threshold_inputs(module, random_frames(tiny, 2)[1], max_boxes=asked))
            assert (f"max_boxes {asked}: this server returns at most 500 boxes a frame (its detector's cap, set when "
                    "it was served); ask for at most 500") in str(caught.value), str(caught.value)
    finally:
        client.close()


def test_requests_the_model_answers_with_an_error_are_counted_in_its_failed_metric(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    """Triton's own nv_inference_request_failure counts a request the model answers with an error (through its
    response sender) as a success, so an alert on it never fires: the model counts those itself. Oracle: the
    requests this test sends, two refused (over each protocol) and one answered."""
    from tritonclient.utils import InferenceServerException

    before = metric_value(tiny_server, "pointpillars_requests_failed")
    frame = random_frames(tiny, 2)[1]
    for protocol, bad in (("grpc", {"nms_iou": float("nan")}), ("http", {"max_boxes": 501})):
        module, client = raw_client(tiny_server, protocol)
        try:
            with pytest.raises(InferenceServerException):
                client.infer(MODEL_NAME, threshold_inputs(module, frame, **bad))
            client.infer(MODEL_NAME, threshold_inputs(module, frame))
        finally:
            client.close()
    assert metric_value(tiny_server, "pointpillars_requests_failed") == before + 2


def test_health_and_prometheus_metrics_answer(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    raw_infer(tiny_server, "http", random_frames(tiny, 4)[3][None])
    for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL_NAME}/ready"):
        with urllib.request.urlopen(f"http://{tiny_server.endpoints['http']}{path}", timeout=5) as reply:
            assert reply.status == 200, path
    # Triton books a request's statistics once its response is sent, which may be just after the client
    # has it: the count is read again for a few seconds before the test fails.
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(tiny_server.endpoints["metrics"], timeout=5) as reply:
            text = reply.read().decode()
        counts = [line for line in text.splitlines() if line.startswith(f'nv_inference_count{{model="{MODEL_NAME}"')]
        if (counts and float(counts[0].split()[-1]) >= 1) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert counts and float(counts[0].split()[-1]) >= 1, text[:2000]


def test_a_client_of_a_dead_address_fails_in_one_line(install) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.apps.serve.server import free_port

    with pytest.raises(BackendError, match=r"server 127\.0\.0\.1:\d+ \(http\): cannot be reached"):
        RemoteDetector(f"127.0.0.1:{free_port()}", protocol="http", timeout=2)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_of_the_other_endpoint_is_told_which_protocol_it_may_be(tiny_server, protocol: str) -> None:  # type: ignore[no-untyped-def]
    """The default gRPC client given the HTTP port (or the other way round): the port answers, so the one line
    says that something listens there and names the fix, beside the client library's own reason."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    other = "http" if protocol == "grpc" else "grpc"
    address = tiny_server.endpoints[other]
    with pytest.raises(BackendError) as caught:
        RemoteDetector(address, protocol=protocol, timeout=5)
    message = str(caught.value)
    assert message.startswith(f"server {address} ({protocol}): ") and "\n" not in message, message
    assert message.endswith(f"; something listens there but does not answer {protocol}: if it is the server's {other} "
                            f"endpoint, pass --protocol {other} or give its {protocol} endpoint (serve prints both)"), message


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_of_the_metrics_endpoint_is_told_so_not_that_it_may_be_the_other_protocols(tiny_server,  # type: ignore[no-untyped-def]
                                                                                           protocol: str) -> None:
    """The metrics port given as the server's address: the hint named the other protocol's endpoint (pass
    --protocol http), which it is not; now it says the address is the metrics endpoint and asks for this one."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    address = tiny_server.endpoints["metrics"].removeprefix("http://").removesuffix("/metrics")
    with pytest.raises(BackendError) as caught:
        RemoteDetector(address, protocol=protocol, timeout=5)
    message = str(caught.value)
    assert message.startswith(f"server {address} ({protocol}): cannot be reached (") and "\n" not in message, message
    assert message.endswith(f"; that is a Triton server's metrics endpoint (it answers /metrics): give its {protocol} "
                            "endpoint (serve prints each)"), message


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_asking_for_a_model_the_server_does_not_serve_is_told_so_not_that_it_cannot_be_reached(  # type: ignore[no-untyped-def]
        tiny_server, protocol: str) -> None:
    """RemoteDetector(model='other') said the server 'cannot be reached', though it answered that it serves no such
    model. Oracle: Triton's own words for it, and the name serve gives its model."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    address = tiny_server.endpoints[protocol]
    with pytest.raises(BackendError) as caught:
        RemoteDetector(address, protocol=protocol, model="other", timeout=5)
    message = str(caught.value)
    assert message.startswith(f"server {address} ({protocol}): serves no model 'other' (") and "\n" not in message
    assert "Request for unknown model: 'other'" in message and "cannot be reached" not in message, message
    assert message.endswith("): give the name of a model it serves (pointpillars-trt serve serves 'pointpillars', "
                            "the default)"), message


def stop_server(pid: int) -> None:
    """SIGSTOP ``pid``, returning once the kernel shows every thread of it stopped (state T in /proc)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    tasks = Path(f"/proc/{pid}/task")
    while any(Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0] != "T" for task in tasks.iterdir()):
        assert time.monotonic() < deadline, "the server did not stop"
        time.sleep(0.01)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_client_of_a_frozen_server_is_told_so_within_its_timeout(install, tiny, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  protocol: str) -> None:
    """The server stopped (SIGSTOP) when a client connects: its connections are accepted and never answered. The
    client gives up after its timeout (gRPC's own connect timeout is 20 s) and says the server did not answer,
    not that the address may be the other protocol's endpoint (which fails at once). A server of its own, never
    connected to before: nothing of an earlier test's connections to it is in the way."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    with served(install, tiny.path, tmp_path) as server:
        assert server.process is not None
        address = server.endpoints[protocol]
        stop_server(server.process.pid)
        try:
            started = time.monotonic()
            with pytest.raises(BackendError) as caught:
                RemoteDetector(address, protocol=protocol, timeout=2, timeout_option="--request-timeout")
            took = time.monotonic() - started
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    message = str(caught.value)
    assert took < 8, (took, message)
    assert message.startswith(f"server {address} ({protocol}): did not answer within 2 s: is the server stopped or "
                              "hung") and message.endswith("needs a longer --request-timeout"), message
    assert "listens" not in message and "\n" not in message, message


def test_a_client_of_a_dead_address_says_nothing_of_another_endpoint(install) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.apps.serve.server import free_port

    with pytest.raises(BackendError) as caught:
        RemoteDetector(f"127.0.0.1:{free_port()}", protocol="grpc", timeout=2)
    assert "cannot be reached" in str(caught.value) and "listens" not in str(caught.value), caught.value


def test_an_address_that_accepts_and_never_answers_grpc_is_told_grpcs_own_timeout_not_the_clients() -> None:
    """A listener that accepts connections and never answers (a hung process, a stopped server): gRPC gives up on
    the connection after its own connect timeout (~20 s), before a longer client timeout; the message said "did not
    answer within 60 s" and that a slow server needs a longer timeout. Now it names gRPC's timeout and the
    seconds it took, and asks whether the server is hung."""
    import socket

    pytest.importorskip("tritonclient.grpc")
    from pointpillars_trt.apps.serve.client import RemoteDetector

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    thread.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        started = time.monotonic()
        with pytest.raises(BackendError) as caught:
            RemoteDetector(address, protocol="grpc", timeout=60, timeout_option="--request-timeout")
        took = time.monotonic() - started
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
    said = re.fullmatch(re.escape(f"server {address} (grpc): accepted the connection but sent no gRPC handshake "
                                  "within gRPC's own connect timeout (") + r"(\d+)" + re.escape(
        " s, shorter than the --request-timeout of 60 s): is the server stopped or hung (its log says), or the "
        "address another machine's?"), str(caught.value))
    assert said is not None and abs(int(said[1]) - took) <= 1 and took < 40, (took, str(caught.value))


def test_no_such_binary_is_one_line_error() -> None:
    with pytest.raises(BackendError, match="^--tritonserver '/no/such/tritonserver': not an executable file; "):
        find_tritonserver("/no/such/tritonserver")


def test_a_ready_timeout_under_a_second_is_said_as_given(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real server given 0.25 s to get ready (its Python backend alone takes longer) was 'not ready after 0 s':
    the value given is said as given."""
    write_repository(tiny.path, tmp_path / "repo", device="cpu")
    server = TritonServer(tmp_path / "repo", install=install, log=tmp_path / "server.log", model=MODEL_NAME)
    with pytest.raises(BackendError, match=r"not ready after 0\.25 s \(its HTTP endpoint http://127\.0\.0\.1:\d+/v2/"
                                           r"health/ready did not answer; a large model or a busy host may need a "
                                           r"longer --ready-timeout\)"):
        server.start(timeout=0.25)
    assert server.exit_code() is not None  # stopped again


class ServerWithoutMetrics(TritonServer):
    """A real tritonserver whose metrics endpoint never starts (``--allow-metrics=false``)."""

    def command(self, backend_dir: Path, served: Path | None = None) -> list[str]:
        return [*super().command(backend_dir, served), "--allow-metrics=false"]


def test_start_waits_for_the_metrics_endpoint_not_only_for_http_ready(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """tritonserver starts its metrics endpoint after HTTP says ready (tens of ms later on a busy host, where a scrape
    right after the start was refused): start returned at HTTP's ready. A server whose metrics endpoint never comes
    is still being waited for a second after HTTP said ready, until its stop. Oracle: HTTP's /v2/health/ready,
    polled beside the start."""
    from pointpillars_trt.apps.serve.server import StartCancelled

    write_repository(tiny.path, tmp_path / "repo", device="cpu")
    server = ServerWithoutMetrics(tmp_path / "repo", install=install, log=tmp_path / "server.log", model=MODEL_NAME)
    stop, outcome = threading.Event(), []

    def start() -> None:
        try:
            server.start(timeout=START_TIMEOUT, stop=stop)
            outcome.append("returned")
        except StartCancelled:
            outcome.append("stopped")

    starting = threading.Thread(target=start)
    starting.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not http_ready(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http_ready(server), "the server's HTTP endpoint never said ready"
        time.sleep(1.0)
        assert outcome == [], "start returned while the metrics endpoint did not answer"
    finally:
        stop.set()
        starting.join(timeout=30)
        server.stop()
    assert outcome == ["stopped"]


def http_ready(server: TritonServer) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.endpoints['http']}/v2/health/ready", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def test_repository_only_writes_a_ragged_dynamic_batching_repository(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--model", str(tiny.path), "--repository", str(tmp_path / "repo"),
                              "--instances", "2", "--max-batch", "4", "--max-queue-delay-us", "500",
                              "--device", "cpu", "--repository-only"])
    rc, out, _ = run_captured(args.run, args)
    assert rc == 0 and "wrote" in out
    model = tmp_path / "repo" / MODEL_NAME
    config = (model / "config.pbtxt").read_text()
    for needle in ('dims: [-1, 4], allow_ragged_batch: true', "BATCH_ELEMENT_COUNT", "max_batch_size: 4",
                   '"score_threshold", data_type: TYPE_FP32, dims: [1], optional: true',
                   '"max_boxes", data_type: TYPE_INT32, dims: [1], optional: true',
                   "max_queue_delay_microseconds: 500", "count: 2, kind: KIND_CPU", '"boxes", data_type: TYPE_FP32, dims: [-1, 7]',
                   '"labels", data_type: TYPE_INT32', '"num_points", data_type: TYPE_INT32, dims: [1]',
                   'string_value: "Car,Pedestrian,Cyclist"', 'key: "max_boxes", value: { string_value: "500" }'):
        assert needle in config, needle
    assert (model / "1" / "model.py").is_file()
    assert sorted(p.name for p in (model / "1" / "model").iterdir()) == sorted(p.name for p in Path(tiny.path).iterdir())
    with pytest.raises(InputError, match="--instances"):
        write_repository(tiny.path, tmp_path / "repo", instances=0, device="cpu")
    with pytest.raises(InputError, match="--pipelines"):
        write_repository(tiny.path, tmp_path / "repo", pipelines=9, device="cpu")
    write_repository(tiny.path, tmp_path / "repo", pipelines=3, max_batch=2, device="cpu")
    config = (model / "config.pbtxt").read_text()
    for needle in ("max_batch_size: 2", 'key: "pipelines", value: { string_value: "3" }'):
        assert needle in config, needle

    (model / "1" / "__pycache__").mkdir()  # the backend's, once served: still its own folder
    write_repository(tiny.path, tmp_path / "repo", device="cpu")
    user = tmp_path / "user" / MODEL_NAME / "src"  # a folder of that name that serve did not write
    user.mkdir(parents=True)
    (user / "important.py").write_text("precious")
    with pytest.raises(InputError, match=r"exists and is not a model folder that serve wrote \(it holds 'src'\)"):
        write_repository(tiny.path, tmp_path / "user", device="cpu")
    assert (user / "important.py").read_text() == "precious"
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / MODEL_NAME).symlink_to(model, target_is_directory=True)
    with pytest.raises(InputError, match="is not a folder"):
        write_repository(tiny.path, tmp_path / "linked", device="cpu")


#: ``serve`` run through its own parser in a child process (stdout piped, stderr dropped).
SERVE_SCRIPT = ("import argparse, sys\n"
                "from pointpillars_trt.apps.serve.cli import add_serve_parser\n"
                "p = argparse.ArgumentParser(); add_serve_parser(p.add_subparsers(dest='command'))\n"
                "a = p.parse_args(sys.argv[1:]); sys.exit(a.run(a))\n")


def serve_process(tiny, tmp_path: Path, *options: str, stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT, "serve", "--model", str(tiny.path), "--repository",
                             str(tmp_path / "repo"), "--device", "cpu", "--ready-timeout", str(START_TIMEOUT),
                             *options], stdout=subprocess.PIPE, stderr=stderr, text=True)


def test_a_repository_whose_instances_auto_put_on_the_cpu_says_so(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.devices import cuda_available

    reason = cuda_available()
    if reason is None:
        pytest.skip("the GPU path runs here: auto gives GPU instances")
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--model", str(tiny.path), "--repository", str(tmp_path / "repo"),
                              "--repository-only"])
    rc, _, err = run_captured(args.run, args)
    assert rc == 0 and err == f"note: device auto: the model's instances run on the CPU (KIND_CPU): {reason}; " \
                              "write the repository on the machine whose GPU tritonserver will use\n", err
    assert "kind: KIND_CPU" in (tmp_path / "repo" / MODEL_NAME / "config.pbtxt").read_text()


def endpoints_once_ready(proc: subprocess.Popen[str], wait: float = START_TIMEOUT + 10,
                         failed: Callable[[], str] = str) -> dict[str, str]:
    """The endpoints a ``serve`` process printed (its "NAME: ADDRESS" lines), once it printed "ready" within
    ``wait`` s (its lines up to it read); ``failed``: what else the assertion says when it did not."""
    lines: list[str] = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and proc.stdout is not None:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.startswith("ready"):
            break
    assert lines and lines[-1].startswith("ready"), (lines, failed())
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def test_serve_command_prints_endpoints_and_stops_on_sigterm(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = serve_process(tiny, tmp_path)
    try:
        http = endpoints_once_ready(proc)["http"]
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=5) as reply:
            assert reply.status == 200
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        assert rc == 0 and time.monotonic() - start < 12
        assert "stopped" in (proc.stdout.read() if proc.stdout else "")
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stop_held_by_an_idle_keep_alive_client_says_so_not_that_requests_were_dropped(install, tiny,  # type: ignore[no-untyped-def]
                                                                                         tmp_path: Path) -> None:
    """An HTTP client that keeps its connection open (keep-alive, idle) holds tritonserver's stop for its whole exit
    timeout, after which it ends itself with exit code 1: serve said the requests still queued or running had been
    dropped, where none was. Now the wait is said when the stop begins, and the error names the open connections."""
    import http.client

    proc = serve_process(tiny, tmp_path, "--exit-timeout-secs", "2", stderr=subprocess.PIPE)
    try:
        host, port = endpoints_once_ready(proc)["http"].rsplit(":", 1)
        client = http.client.HTTPConnection(host, int(port), timeout=10)
        client.request("GET", "/v2/health/ready")
        reply = client.getresponse()
        reply.read()
        assert reply.status == 200 and not reply.will_close  # answered, and the connection stays open
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and 2 <= took < 10, (proc.returncode, took, out, err)
    assert out.splitlines()[0] == ("stopping: tritonserver waits up to 2 s (--exit-timeout-secs) for its HTTP clients "
                                   "to close their connections and for the requests still queued or running"), out
    assert err.splitlines()[-1] == (
        "error: tritonserver ran past its exit timeout of 2 s after the stop and ended itself (exit code 1): it waits "
        "that long for its HTTP clients to close their connections (an idle keep-alive connection holds it too), then "
        "for the requests still queued or running and its model's unload, and drops what is left; close the clients "
        "before the server, or give them longer with --exit-timeout-secs"), err


def huge_json_request(endpoint: str) -> None:
    """An HTTP inference request whose JSON data declares 2**40 points (16 TiB) and holds 10: Triton allocates
    the declared size before it reads the data."""
    import http.client

    host, port = endpoint.rsplit(":", 1)
    body = json.dumps({"inputs": [{"name": "points", "shape": [1, 2**40, 4], "datatype": "FP32",
                                   "data": [0.0] * 40}]}).encode()
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", f"/v2/models/{MODEL_NAME}/infer", body=body)
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass  # the server went down under it
    finally:
        connection.close()


def test_http_on_loopback_only_and_a_request_that_aborts_triton_is_said_with_the_fix(install, tiny,  # type: ignore[no-untyped-def]
                                                                                     tmp_path: Path) -> None:
    """--http-host binds HTTP apart from --host (gRPC and metrics), and the warm-up probe goes there. An HTTP
    request whose JSON data declares a huge shape aborts Triton (std::bad_alloc, in the nvidia-pytriton build CI
    installs): serve exits 1 with one error line that names that request (HTTP is on loopback here: no advice
    to move it there; ``test_scaleout_options`` has the line of HTTP beyond it)."""
    with open(tmp_path / "serve.err", "w") as err:
        proc = serve_process(tiny, tmp_path, "--host", "127.0.0.1", "--http-host", "127.0.0.2", stderr=err)
    try:
        endpoints = endpoints_once_ready(proc)
        assert endpoints["http"].startswith("127.0.0.2:") and endpoints["grpc"].startswith("127.0.0.1:"), endpoints
        port = endpoints["http"].rsplit(":", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/v2/health/ready", timeout=5) as reply:
            assert reply.status == 200
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2)
        huge_json_request(endpoints["http"])
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    errors = [line for line in (tmp_path / "serve.err").read_text().splitlines() if line.startswith("error:")]
    assert errors == ["error: tritonserver exited with code -6 (SIGABRT: it crashed; its own log above says why; a "
                      "std::bad_alloc there is most likely an HTTP request whose JSON data declared a huge shape, "
                      "which Triton allocates before it reads the data); restart serve (a supervisor such as "
                      "systemd's Restart=on-failure does it for you)"], errors
    assert "std::bad_alloc" in (tmp_path / "serve.err").read_text()


def test_a_port_something_listens_on_is_refused_before_the_server_starts(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Another server on --http-port would answer the readiness check: refused, nothing started."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        server = TritonServer(tmp_path / "repo", install=install, http_port=taken)
        with pytest.raises(BackendError, match=rf"--http-port {taken}: something already listens on 127.0.0.1:{taken}"):
            server.start(timeout=START_TIMEOUT)
        assert server.process is None


def grpc_ready(server: TritonServer) -> bool:
    """Whether the server's gRPC endpoint says ready (tritonclient's own check)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.endpoints["grpc"])
    try:
        return bool(client.is_server_ready())
    finally:
        client.close()


def test_a_picked_port_taken_before_the_start_is_picked_again(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A port the server picked itself (no option given) that another process took before the start was refused as
    if given ('--grpc-port N: something already listens'): it is picked again, and the server answers there."""
    import socket

    write_repository(tiny.path, tmp_path / "repo", device="cpu")
    server = TritonServer(tmp_path / "repo", install=install, log=tmp_path / "server.log", model=MODEL_NAME)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        taken = server.grpc_port
        other.bind(("127.0.0.1", taken))
        other.listen()
        with server.start(timeout=START_TIMEOUT):
            assert server.grpc_port != taken
            assert http_ready(server) and grpc_ready(server)


def test_a_picked_port_taken_while_the_model_loads_is_picked_again(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """tritonserver binds its ports once its models are loaded, seconds after it starts: a picked port another
    process took meanwhile made it exit ('exited with code 1 before it was ready'). It is started again on a port
    picked again, once; the port is taken here as soon as the first tritonserver process exists."""
    import socket

    write_repository(tiny.path, tmp_path / "repo", device="cpu")
    server = TritonServer(tmp_path / "repo", install=install, log=tmp_path / "server.log", model=MODEL_NAME)
    taken = server.grpc_port
    started = threading.Event()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        def take_the_port() -> None:
            while server.process is None and not started.is_set():
                time.sleep(0.001)
            other.bind(("127.0.0.1", taken))
            other.listen()

        taking = threading.Thread(target=take_the_port)
        taking.start()
        try:
            with server.start(timeout=START_TIMEOUT):
                assert server.grpc_port != taken
                assert http_ready(server) and grpc_ready(server)
                moved = server.grpc_port
        finally:
            started.set()
            taking.join(timeout=10)
    log = (tmp_path / "server.log").read_text()  # both servers': the first one failed to bind, the second did not
    assert f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:{taken}' already in use" in log
    assert f"Started GRPCInferenceService at 127.0.0.1:{moved}" in log


def test_a_server_that_fails_to_start_leaves_no_temp_folder(install, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The binary gone between finding and starting it: Popen fails inside ``with`` (whose __exit__ then never
    runs), and the server's temp folder (its one-model repository) goes with the error."""
    import dataclasses
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    gone = dataclasses.replace(install, binary=tmp_path / "gone" / "tritonserver")
    with pytest.raises(FileNotFoundError), TritonServer(tmp_path / "repo", install=gone, model=MODEL_NAME):
        pass
    assert list(temp.iterdir()) == []


def test_a_temp_folder_of_a_dead_serve_is_swept_at_the_next_start(install, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A serve killed with SIGKILL leaves its folder: the next start removes it, and leaves a live one's."""
    import dataclasses
    import tempfile

    from pointpillars_trt.apps.serve.server import SCRATCH_PREFIX
    from pointpillars_trt.file_writes import owned_prefix

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    host = owned_prefix("").split("-")[1]  # this host's tag: a folder of another host's serve is never swept
    stale = temp / f"{SCRATCH_PREFIX}{ended.pid}-{host}-abcd1234"
    (stale / "models").mkdir(parents=True)
    (stale / "models" / MODEL_NAME).symlink_to(tmp_path, target_is_directory=True)
    live = temp / f"{SCRATCH_PREFIX}{os.getppid()}-{host}-abcd1234"
    elsewhere = temp / f"{SCRATCH_PREFIX}{ended.pid}-0000ffff-abcd1234"
    for kept in (live, elsewhere):
        kept.mkdir()
    gone = dataclasses.replace(install, binary=tmp_path / "gone" / "tritonserver")
    with pytest.raises(FileNotFoundError):
        TritonServer(tmp_path / "repo", install=gone, model=MODEL_NAME).start(timeout=START_TIMEOUT)
    assert sorted(temp.iterdir()) == sorted([live, elsewhere]) and tmp_path.is_dir()


def test_serve_refuses_a_busy_port_before_it_writes_the_repository(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        done = subprocess.run([sys.executable, "-c", SERVE_SCRIPT, "serve", "--model", str(tiny.path), "--repository",
                               str(tmp_path / "repo"), "--device", "cpu", "--http-port", str(taken)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and f"--http-port {taken}: something already listens" in done.stderr, done.stderr
    assert "wrote" not in done.stdout and not (tmp_path / "repo").exists()


@pytest.mark.parametrize(("signum", "after"), [(signal.SIGINT, 0.5), (signal.SIGTERM, 0.5), (signal.SIGINT, 0.0)])
def test_serve_stops_promptly_and_cleanly_on_a_signal_while_it_starts(install, tiny, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                       signum: int, after: float) -> None:
    """Ctrl-C or SIGTERM before the server is ready: it stops within its stop timeout, without saying ready,
    and as the user's stop it is (no error line: a tritonserver ended by the SIGTERM passed on before it set its
    own handler had been "did not stop cleanly (exit code -15)", exit 1), with the exit code of other commands
    stopped so (130, 143; it was 0, as of a server that had served)."""
    with open(tmp_path / "stderr", "w") as errors:  # tritonserver's log too: more than a pipe holds unread
        proc = serve_process(tiny, tmp_path, "--instances", "2", stderr=errors)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("wrote")
        time.sleep(after)  # tritonserver is starting, or loading its instances
        start = time.monotonic()
        proc.send_signal(signum)
        rest = proc.communicate(timeout=30)[0]
        err = (tmp_path / "stderr").read_text()
        assert time.monotonic() - start < 15 and "ready" not in rest.replace("before the server was ready", ""), rest
        assert proc.returncode == 128 + signum and "error:" not in err, (proc.returncode, err)
        assert rest.strip().endswith("stopped before the server was ready"), rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- real KITTI frames, synthetic checkpoint

def kitti_frames(assets: Path, count: int) -> list[str]:
    """Camera-FOV crops of KITTI scans (17-20 k points): real data, cheap enough on a CPU."""
    return sorted(str(p) for p in (assets / "kitti" / "training" / "velodyne_fov").glob("*.bin"))[:count]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_kitti_frames_over_the_server_equal_the_local_detector(assets: Path, kitti_server, protocol: str) -> None:  # type: ignore[no-untyped-def]
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = kitti_frames(assets, 3)
    detector = PointPillars.from_checkpoint(assets / CHECKPOINT, device="cpu")
    remote = RemoteDetector(kitti_server.endpoints[protocol], protocol=protocol)
    try:
        found = list(remote.infer_many(frames, concurrency=4))
        assert [r.source for r in found] == frames
        with pytest.raises(InputError, match=r"got one array of shape \(\d+, 4\): pass \[points\]"):
            remote.infer_many(read_points(frames[0]))  # refused at the call, as the local detector does
        for result, path in zip(found, frames):
            assert result.detections is not None and len(result.detections) > 0
            assert_same(result.detections, detector(read_points(path)))
    finally:
        remote.close()
        detector.close()


def sibling_calib_frames(assets: Path, root: Path, ids: list[str]) -> list[str]:
    """KITTI frames in ROOT/training/velodyne with their calib files in the sibling calib/ folder."""
    velodyne, calib = root / "training" / "velodyne", root / "training" / "calib"
    velodyne.mkdir(parents=True)
    calib.mkdir(parents=True)
    for frame_id in ids:
        shutil.copy(assets / "kitti/training/velodyne" / f"{frame_id}.bin", velodyne)
        shutil.copy(assets / "kitti/training/calib" / f"{frame_id}.txt", calib)
    return [str(velodyne / f"{frame_id}.bin") for frame_id in ids]


@pytest.mark.parametrize("output_format,calib", [("json", None), ("kitti", "given"), ("kitti", "sibling")])
def test_infer_over_the_server_writes_what_local_infer_writes(assets: Path, kitti_server, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              output_format: str, calib: str | None) -> None:
    frames = sibling_calib_frames(assets, tmp_path / "kitti", ["000000", "000001"])
    corrupt = tmp_path / "kitti" / "training" / "velodyne" / "corrupt.bin"
    corrupt.write_bytes(b"\0" * 10)
    options = ["--format", output_format]
    if calib == "given":
        options += ["--calib", str(assets / "kitti/training/calib")]
    local, remote = tmp_path / "local", tmp_path / "remote"
    rc, local_out, local_err = run_captured(cli_main, ["infer", *frames, str(corrupt), "--model",
                                                       str(assets / CHECKPOINT), "--out", str(local), "--device",
                                                       "cpu", "--no-progress", *options])
    assert rc == 1
    args = infer_args([*frames, str(corrupt)], remote, kitti_server.endpoints["grpc"], "grpc",
                      *options)
    rc, out, err = run_captured(run_scaleout_infer, args)
    assert rc == 1 and out.startswith("2/3 frames") and f"error: point file '{corrupt}' is " in err, (out, err)
    assert "1 of 3 frames failed" in err
    assert report_lines(out, err, remote) == report_lines(local_out, local_err, local)
    names = output_names(local)
    assert names == output_names(remote) and len(names) == 2
    for name in names:
        assert (remote / name).read_bytes() == (local / name).read_bytes(), name
    if output_format == "json":
        assert json.loads((remote / names[0]).read_text())["boxes_lidar"]
    else:
        assert (remote / names[0]).read_text().strip()


def test_infer_over_the_server_sends_its_thresholds_and_refuses_local_options(  # type: ignore[no-untyped-def]
        assets: Path, kitti_server, tmp_path: Path) -> None:
    """--score-threshold / --nms-iou / --max-boxes go with each request: the files equal local infer's with
    the same options (and differ from the defaults'); options only a local detector has are one error line."""
    frames = sibling_calib_frames(assets, tmp_path / "kitti", ["000000", "000001"])
    options = ["--score-threshold", "0.3", "--nms-iou", "0.2", "--max-boxes", "3"]
    local, remote, plain = tmp_path / "local", tmp_path / "remote", tmp_path / "plain"
    rc, _, err = run_captured(cli_main, ["infer", *frames, "--model", str(assets / CHECKPOINT), "--out", str(local),
                                         "--device", "cpu", "--no-progress", *options])
    assert rc == 0, err
    rc, _, err = run_captured(run_scaleout_infer, infer_args(frames, remote, kitti_server.endpoints["grpc"], "grpc",
                                                             *options))
    assert rc == 0, err
    rc, _, err = run_captured(run_scaleout_infer, infer_args(frames, plain, kitti_server.endpoints["grpc"], "grpc"))
    assert rc == 0, err
    names = output_names(local)
    assert names == output_names(remote) and len(names) == 2
    for name in names:
        assert (remote / name).read_bytes() == (local / name).read_bytes(), name
        assert len(json.loads((remote / name).read_text())["scores"]) <= 3
    assert any((plain / n).read_bytes() != (remote / n).read_bytes() for n in names), "the options must matter"
    from pointpillars_trt.apps.run_settings import SETTINGS_FILE

    settings = json.loads((remote / SETTINGS_FILE).read_text())["outputs"]["json"]["settings"]  # named by its server
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    served = model_dir_for_checkpoint(assets / CHECKPOINT)  # the model the server serves, read apart
    weights = {key: value for key, value in served.metadata["source"].items() if key != "checkpoint"}
    assert settings["--model"] == {"server": kitti_server.endpoints["grpc"], "weights": weights,
                                   "config": served.cfg.digest(), "config_name": served.cfg.name,
                                   "precision": served.precision} and settings["--max-boxes"] == 3
    more = [*frames, str(assets / "kitti/training/velodyne_fov/000003.bin")]  # a frame to run: checked
    with pytest.raises(InputError, match=r"other settings \(--score-threshold 0.3 there, not given \(the model's "
                                         r"default\) now; --nms-iou 0.2 there"):
        run_scaleout_infer(infer_args(more, remote, kitti_server.endpoints["grpc"], "grpc", "--skip-existing"))
    with pytest.raises(InputError, match=r"^--model, --backend, --device: the server's model and settings run"):
        run_scaleout_infer(infer_args(frames, tmp_path / "x", kitti_server.endpoints["grpc"], "grpc", "--model",
                                      str(assets / CHECKPOINT), "--device", "cuda:5", "--backend", "tensorrt"))


def test_a_resumed_run_of_a_server_now_serving_another_model_is_refused(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Outputs of one model, resumed against the same address serving another: the record named the server by its
    address alone, so the resume ran and the folder held both models' boxes. The server states its model's weights,
    config and precision, which the record keeps and a resume compares, also with every frame done."""
    from pointpillars_trt.apps.cli import main as cli_main
    from pointpillars_trt.apps.serve.server import free_ports
    from tiny import tiny_model_dir

    other = tiny_model_dir(tmp_path / "other", seed=4)  # the same config, other weights
    (tmp_path / "frames").mkdir()
    frames = []
    for index, points in enumerate(random_frames(tiny, 6)[3:]):
        frames.append(str(tmp_path / "frames" / f"{index:06d}.bin"))
        points.tofile(frames[-1])
    http, grpc, metrics = free_ports("127.0.0.1", 3)
    out = tmp_path / "out"

    def serve(model: Path, name: str) -> TritonServer:
        write_repository(model, tmp_path / name / "repo", device="cpu", max_points=MAX_POINTS)
        return TritonServer(tmp_path / name / "repo", install=install, http_port=http, grpc_port=grpc,
                            metrics_port=metrics, log=tmp_path / name / "server.log")

    def infer(*paths: str) -> tuple[int, str, str]:
        return run_captured(cli_main, ["infer", *paths, "--server", f"127.0.0.1:{grpc}", "--out", str(out),
                                       "--no-progress", "--skip-existing"])

    with serve(tiny.path, "first").start(timeout=START_TIMEOUT):
        rc, _, err = infer(*frames[:2])
        assert rc == 0, err
    first = {name: (out / name).read_bytes() for name in output_names(out)}
    with serve(other.path, "second").start(timeout=START_TIMEOUT):
        for paths in (frames, frames[:2]):  # a frame left to run; every frame done
            rc, _, err = infer(*paths)
            assert rc == 2 and err.splitlines()[-1].startswith(
                f"error: --skip-existing: the outputs in {str(out)!r} were made with other settings (--model server "
                f"'127.0.0.1:{grpc}' there, server '127.0.0.1:{grpc}' now: other weights): resuming would mix "
                "outputs of both in one folder"), err
    assert {name: (out / name).read_bytes() for name in output_names(out)} == first


def full_scan_model(assets: Path, folder: Path) -> Path:
    """A model dir of the synthetic checkpoint whose model.json records that it was trained on full scans
    (``FOV_POINTS_ONLY: False``, as ``build --pcdet-config`` records it from the dataset config)."""
    from pointpillars_trt.convert.export import copy_model_dir, model_dir_for_checkpoint
    from pointpillars_trt.model_dir import METADATA_FILE

    copy_model_dir(model_dir_for_checkpoint(assets / CHECKPOINT), folder)
    meta = json.loads((folder / METADATA_FILE).read_text())
    (folder / METADATA_FILE).write_text(json.dumps({**meta, "dataset": {"fov_points_only": False}}))
    return folder


def test_infer_over_the_server_crops_and_draws_as_local_infer_by_the_served_models_own_facts(  # type: ignore[no-untyped-def]
        assets: Path, install, tmp_path: Path) -> None:
    """A served model trained on full scans: --format kitti detects on them as local infer does (the client,
    which did not know, cropped them to the camera view), and --viz draws over the model's point range as local
    infer does (it drew over all the points: another picture)."""
    model = full_scan_model(assets, tmp_path / "model")
    frames = sibling_calib_frames(assets, tmp_path / "kitti", ["000000", "000001"])
    runs = {"kitti": ["--format", "kitti"], "viz": ["--viz"], "cropped": ["--format", "kitti", "--fov-only"]}
    with served(install, model, tmp_path / "served") as server:
        for name, options in runs.items():
            local, remote = tmp_path / f"local_{name}", tmp_path / f"remote_{name}"
            rc, local_out, local_err = run_captured(cli_main, ["infer", *frames, "--model", str(model), "--out",
                                                               str(local), "--device", "cpu", "--no-progress", *options])
            assert rc == 0, local_err
            rc, out, err = run_captured(run_scaleout_infer, infer_args(frames, remote, server.endpoints["grpc"],
                                                                       "grpc", *options))
            assert rc == 0, err
            assert report_lines(out, err, remote) == report_lines(local_out, local_err, local), name
            names = output_names(local)
            assert names == output_names(remote) and len(names) == 2 * (1 + (name == "viz")), names
            for file in names:
                assert (remote / file).read_bytes() == (local / file).read_bytes(), (name, file)
    kitti, cropped = tmp_path / "local_kitti", tmp_path / "local_cropped"  # the crop changes what is found
    assert any((kitti / n).read_bytes() != (cropped / n).read_bytes() for n in output_names(kitti))


def test_infer_over_the_server_without_a_calib_folder_is_one_error_before_any_frame_as_local_infer(  # type: ignore[no-untyped-def]
        assets: Path, kitti_server, tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    shutil.copy(assets / "kitti/training/velodyne/000000.bin", folder)
    local = run_captured(cli_main, ["infer", str(folder), "--model", str(assets / CHECKPOINT), "--out",
                                    str(tmp_path / "local"), "--device", "cpu", "--no-progress", "--format", "kitti"])
    remote = run_captured(cli_main, ["infer", str(folder), "--out", str(tmp_path / "remote"), "--no-progress",
                                     "--server", kitti_server.endpoints["grpc"], "--protocol", "grpc", "--format", "kitti"])
    assert local[0] == remote[0] == 2
    assert report_lines(*remote[1:], tmp_path / "remote") == report_lines(*local[1:], tmp_path / "local")
    assert remote[2].count("\n") == 1 and remote[2].startswith("error: no calibration folder for frame ")
    assert not any((tmp_path / name).exists() and any((tmp_path / name).iterdir()) for name in ("local", "remote"))


# --------------------------------------------------------------------------- nuScenes multi-head model

NUSCENES_CHECKPOINT = "cbgs_pp_multihead_synthetic_dev.pth"
NUSCENES_FRAMES = ("nusc_dev_k000000_s05.bin", "nusc_dev_k000002_s02.bin")


@pytest.fixture(scope="module")
def nuscenes_server(install, nuscenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]
    with served(install, nuscenes / NUSCENES_CHECKPOINT, tmp_path_factory.mktemp("nuscenes_server")) as server:
        yield server


def test_serve_warms_up_and_probes_a_multi_sweep_model_with_its_five_values_a_point(  # type: ignore[no-untyped-def]
        nuscenes_server) -> None:
    """``serve``'s warm-up request and health probes send a point of the served model's columns: a probe of 4
    values made every multi-sweep model fail its warm-up ("got 4 columns per point")."""
    from pointpillars_trt.apps.serve.health import warm_up

    probe = warm_up(nuscenes_server.endpoints["http"], timeout=30)
    try:
        assert probe.check() is None and probe.failures == 0
    finally:
        probe.close()


def test_a_served_multi_sweep_model_takes_five_values_a_point_and_answers_velocities(  # type: ignore[no-untyped-def]
        nuscenes: Path, nuscenes_server, tmp_path: Path) -> None:
    """The served nuScenes model declares [-1, 5] points and a velocity output; its client reads .bin
    frames with 5 values a point and gets the local detector's boxes and velocities bit for bit; a
    frame of 4 values a point is that request's error; `infer --server` (with --point-dim 5 or by default)
    writes the JSON files local infer writes; --point-dim 4 is refused."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = [str(nuscenes / name) for name in NUSCENES_FRAMES]
    remote = RemoteDetector(nuscenes_server.endpoints["grpc"])
    detector = PointPillars.from_checkpoint(nuscenes / NUSCENES_CHECKPOINT, device="cpu")
    try:
        assert remote.num_point_columns == 5 and remote.served.velocity
        for result, path in zip(remote.infer_many(frames, concurrency=2), frames):
            want = detector(read_points(path, point_dim=5, columns=5))
            assert result.detections is not None and len(result.detections) >= 10
            assert_same(result.detections, want)
            np.testing.assert_array_equal(result.detections.velocity, want.velocity)
        with pytest.raises(InputError, match=r"got 4 columns per point"):
            remote(np.zeros((10, 4), np.float32))
        response = raw_infer(nuscenes_server, "grpc", np.zeros((1, 10, 5), np.float32))
        assert response.as_numpy("velocity").shape == (1, 0, 2)
    finally:
        remote.close()
        detector.close()
    local = tmp_path / "local"
    rc, _, err = run_captured(cli_main, ["infer", *frames, "--model", str(nuscenes / NUSCENES_CHECKPOINT), "--out",
                                         str(local), "--device", "cpu", "--no-progress", "--point-dim", "5"])
    assert rc == 0, err
    args = infer_args(frames, tmp_path / "remote", nuscenes_server.endpoints["grpc"],
                      "grpc", "--point-dim", "5")
    rc, _, err = run_captured(run_scaleout_infer, args)
    assert rc == 0, err
    names = output_names(local)
    assert len(names) == 2 and names == output_names(tmp_path / "remote")
    for name in names:
        assert (tmp_path / "remote" / name).read_bytes() == (local / name).read_bytes(), name
    args = infer_args(frames, tmp_path / "default", nuscenes_server.endpoints["grpc"], "grpc")
    rc, _, err = run_captured(run_scaleout_infer, args)  # --point-dim from the served model's columns
    assert rc == 0, err
    for name in names:
        assert (tmp_path / "default" / name).read_bytes() == (local / name).read_bytes(), name
    args = infer_args(frames, tmp_path / "four", nuscenes_server.endpoints["grpc"], "grpc", "--point-dim", "4")
    with pytest.raises(InputError, match=r"--point-dim 4: the served model reads 5 values a point"):
        run_scaleout_infer(args)
    args = infer_args(frames, tmp_path / "kitti", nuscenes_server.endpoints["grpc"], "grpc", "--format", "kitti")
    with pytest.raises(InputError, match=r"--format kitti: the served model predicts box velocities"):
        run_scaleout_infer(args)  # as local infer refuses it: KITTI label files cannot carry them
    assert not (tmp_path / "kitti").exists() or not any((tmp_path / "kitti").iterdir())


@pytest.mark.slow
def test_a_server_gone_mid_run_is_said_as_down_not_as_a_refused_frame(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Requests to a server that stopped (crashed) after the client connected: "cannot be reached", and no
    answer to the liveness probe either: the server is down (DetectorLost), not "refused the frame" (an
    InputError, the frame's fault); the next frame fails at once with the same reason, without a request."""
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.errors import DetectorLost

    frame = random_frames(tiny, 5)[4]
    with served(install, tiny.path, tmp_path / "server") as server:
        remote = RemoteDetector(server.endpoints["grpc"], timeout=10)
        assert len(remote(frame).scores) >= 0
    endpoint = server.endpoints["grpc"]
    with pytest.raises(DetectorLost) as caught:
        remote(frame, "000001.bin")
    message = str(caught.value)
    assert message.startswith(f"000001.bin: server {endpoint} is down: cannot be reached (stopped or restarting?): ") \
        and "answered no liveness probe within 5 s" in message and "refused the frame" not in message, message
    with pytest.raises(DetectorLost) as again:
        remote(frame, "000002.bin")
    assert str(again.value) == message.replace("000001.bin", "000002.bin")
    remote.close()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_infer_against_a_server_that_hangs_ends_after_one_timeout_and_resumes(install, tiny, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                             fmt: str) -> None:
    """The server stops answering (SIGSTOP) mid-run: the requests in flight time out (--request-timeout 3), it
    answers no liveness probe, and the frames left fail at once: one error line says the server is down, one
    line counts the rest, exit 1, seconds after the timeout instead of one timeout a frame; the frames done
    before stay written, and the rerun that line names, once the server answers again, finishes the folder."""
    from test_infer_skip_all import rows_of

    folder = tmp_path / "frames"
    folder.mkdir()
    frames = random_frames(tiny, 10)
    count = 2000
    for index in range(count):
        frames[index % len(frames)].astype(np.float32).tofile(folder / f"{index:06d}.bin")
    out = tmp_path / "out"
    with served(install, tiny.path, tmp_path / "server") as server:
        assert server.process is not None
        command = [sys.executable, "-m", "pointpillars_trt", "infer", str(folder), "--out", str(out), "--format", fmt,
                   "--no-progress", "--in-flight", "4", "--request-timeout", "3", "--server", server.endpoints["grpc"]]
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (out.is_dir() and any(out.glob("[!.]*.json" if fmt == "json"
                                                                                     else SETTINGS_FILE))):
                time.sleep(0.02)  # the first frames written (rows: the settings record, before the first frame)
            time.sleep(0.0 if fmt == "json" else 0.3)
            os.kill(server.process.pid, signal.SIGSTOP)
            time.sleep(0.5)
            assert child.poll() is None, "the run ended before the server hung"
            stopped = time.monotonic()
            _, err = child.communicate(timeout=120)
            took = time.monotonic() - stopped
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 1 and took < 30, (child.returncode, took, err[-2000:])
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        down = [line for line in errors if f"server {server.endpoints['grpc']} is down: " in line]
        assert len(down) == 1 and "answered no liveness probe within 3 s" in down[0], errors
        assert len(errors) <= 7, errors  # the requests in flight that timed out before the probe, then one a cause
        counted = re.search(r"^error: (\d+) more frames? not run: the server is down \(said above\); once it "
                            r"answers again, rerun with (--skip-existing.*)$", errors[-1])
        assert counted and int(counted.group(1)) > count // 2, errors
        assert counted.group(2) == ("--skip-existing --retry-failed" if fmt == "jsonl" else "--skip-existing")
        resumed = subprocess.run([*command, *counted.group(2).split()], capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    if fmt == "json":
        assert len([name for name in output_names(out) if name.endswith(".json")]) == count
    else:
        rows = rows_of(out, fmt)
        assert len(rows) == count and {row["error"] for row in rows} == {None}
        assert len({row["path"] for row in rows}) == count


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ctrl_c_of_infer_against_a_hung_server_stops_promptly(install, tiny, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               protocol: str) -> None:
    """The server stops answering (SIGSTOP) with requests in flight: Ctrl-C ends infer --server within
    seconds (exit 130), not after each request's 60 s timeout."""
    folder = tmp_path / "frames"
    folder.mkdir()
    frames = random_frames(tiny, 20)
    for index in range(2000):
        frames[index % len(frames)].astype(np.float32).tofile(folder / f"{index:06d}.bin")
    out = tmp_path / "out"
    with served(install, tiny.path, tmp_path / "server") as server:
        assert server.process is not None
        child = subprocess.Popen([sys.executable, "-m", "pointpillars_trt", "infer", str(folder), "--server",
                                  server.endpoints[protocol], "--protocol", protocol, "--out", str(out),
                                  "--no-progress"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (out.is_dir() and any(out.glob("*.json"))):
                time.sleep(0.05)
            os.kill(server.process.pid, signal.SIGSTOP)  # answering frames, then hung with requests in flight
            time.sleep(1)
            assert child.poll() is None, "the run ended before the server hung"
            start = time.monotonic()
            child.send_signal(signal.SIGINT)
            _, err = child.communicate(timeout=60)
            assert child.returncode == 130 and time.monotonic() - start < 15, (child.returncode, err[-1000:])
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            if child.poll() is None:
                child.kill()
                child.wait()


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (Linux: its sockets looked up in /proc/net/tcp and
    tcp6, where gRPC's are, IPv4-mapped)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                sockets.add(target[len("socket:["):-1])
    rows = []
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}", encoding="ascii") as table:
            rows += [line.split() for line in table.read().splitlines()[1:]]
    return sum(1 for row in rows if int(row[2].split(":")[1], 16) == port and row[3] == "01" and row[9] in sockets)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cancel_ends_the_calls_waiting_on_a_hung_server_at_once_in_the_same_words_and_closes_their_connections(  # type: ignore[no-untyped-def]
        install, tiny, tmp_path: Path, protocol: str) -> None:
    """cancel() ends the requests in flight on a server that hangs (SIGSTOP) at once, not at their 60 s timeout,
    each saying the run was stopped in the same words over both protocols (over gRPC they said the server "failed
    the request: [StatusCode.CANCELLED] Channel closed!"), and closes their connections. Over HTTP the server
    cannot be told (tritonclient's HTTP client has no cancellation), but the client at least stops waiting
    (closing their connections from another thread did not wake them)."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = random_frames(tiny, 4)
    with served(install, tiny.path, tmp_path / "server") as server:
        assert server.process is not None
        port = server.http_port if protocol == "http" else server.grpc_port
        remote = RemoteDetector(server.endpoints[protocol], protocol=protocol, concurrency=4)
        found: list[object] = []
        waiting = threading.Thread(target=lambda: found.extend(remote.detect_each(frames)))
        try:
            remote.detect_batch(frames)  # the connections of the detector's threads are open
            os.kill(server.process.pid, signal.SIGSTOP)
            waiting.start()
            time.sleep(1)
            # a connection a thread over HTTP; gRPC's channels to one address share theirs
            assert waiting.is_alive() and connections_to(port) >= (len(frames) if protocol == "http" else 1)
            start = time.monotonic()
            remote.cancel()
            waiting.join(timeout=20)
            took = time.monotonic() - start
            assert not waiting.is_alive() and took < 5, took
            assert [str(error) for error in found] == [f"server {server.endpoints[protocol]}: the run was stopped"] * 4
            deadline = time.monotonic() + 5  # gRPC closes its sockets in a thread of its own
            while connections_to(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert connections_to(port) == 0
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            if waiting.ident is not None:  # started: it ends once the server answers, or at its timeout
                waiting.join(timeout=70)
            remote.close()


@pytest.mark.slow
def test_a_server_found_down_over_http_ends_the_calls_still_waiting_on_it_at_once(  # type: ignore[no-untyped-def]
        install, tiny, tmp_path: Path) -> None:
    """The server hangs (SIGSTOP): a request times out (8 s) and the server answers no liveness probe (5 s), so it
    is down; a request sent 3 s before that ends then, saying so, not at its own timeout 5 s later (closing its
    connection from another thread, all that was done, leaves an HTTP request waiting)."""
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.errors import DetectorLost

    frame = random_frames(tiny, 5)[4]
    ended: dict[str, tuple[float, str]] = {}

    def call(source: str) -> None:
        try:
            remote(frame, source)
        except DetectorLost as exc:
            ended[source] = (time.monotonic(), str(exc))

    with served(install, tiny.path, tmp_path / "server") as server:
        assert server.process is not None
        remote = RemoteDetector(server.endpoints["http"], protocol="http", timeout=8)
        first, second = (threading.Thread(target=call, args=(source,)) for source in ("a.bin", "b.bin"))
        try:
            stop_server(server.process.pid)
            first.start()
            time.sleep(10)  # the first request timed out; the probe waits for an answer until 13 s
            assert "a.bin" not in ended, "the server was found down before the second request: nothing tested"
            second.start()
            first.join(timeout=30)
            second.join(timeout=30)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            remote.close()
    assert set(ended) == {"a.bin", "b.bin"}, ended
    (first_end, down), (second_end, later) = ended["a.bin"], ended["b.bin"]
    assert down.startswith(f"a.bin: server {server.endpoints['http']} is down: did not answer within its timeout of "
                           "8 s") and "answered no liveness probe within 5 s" in down, down
    assert later == down.replace("a.bin: ", "b.bin: ", 1) and second_end - first_end < 1.5, (second_end - first_end)


@pytest.mark.slow
def test_an_infer_many_closed_early_cancels_its_grpc_requests_in_flight_on_the_server(  # type: ignore[no-untyped-def]
        install, tiny, tmp_path: Path) -> None:
    """A caller that stops reading infer_many's results (closes it) while a request of it waits in the server's
    queue (the first four frames fill a batch at once, the fifth waits out the 5 s queue delay for three more):
    over gRPC the close returns at once, not once that request is answered, and the server is told of it:
    Triton drops the request from its queue as cancelled (its failure count) instead of detecting it (its
    success count stays at the first four's). The detector serves on."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = random_frames(tiny, 5)
    with served(install, tiny.path, tmp_path / "server", max_batch=4, max_queue_delay_us=5_000_000) as server:
        remote = RemoteDetector(server.endpoints["grpc"], concurrency=4)
        _, client = raw_client(server, "grpc")
        try:
            results = remote.infer_many(frames)
            first = next(results)
            assert first.source == "frame 0" and first.error is None, first
            time.sleep(1)  # the fifth request, sent as the first four were answered, waits in the queue
            start = time.monotonic()
            results.close()
            took = time.monotonic() - start
            deadline = time.monotonic() + 15  # Triton looks at its queue once the delay is out
            while sum(success_and_fail(client)) < len(frames) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert took < 1.5 and success_and_fail(client) == (4, 1), (took, success_and_fail(client))
            assert [result.error for result in remote.infer_many(frames[:4])] == [None] * 4  # its connections serve on
        finally:
            client.close()
            remote.close()


def test_a_client_asking_for_more_boxes_than_the_server_returns_is_refused_before_any_frame(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    """The served config says its detector's max_boxes cap (500 for the tiny model): a client asking for more
    is one error at its start, naming the option and the cap, not the same error for every frame."""
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.config import Thresholds

    for protocol in ("grpc", "http"):
        endpoint = tiny_server.endpoints[protocol]
        with pytest.raises(InputError, match=f"--max-boxes 501: server {endpoint} returns at most 500 boxes a frame"):
            RemoteDetector(endpoint, protocol=protocol, thresholds=Thresholds(max_boxes=501))
        remote = RemoteDetector(endpoint, protocol=protocol, thresholds=Thresholds(max_boxes=500))
        try:
            assert remote.served.max_boxes == 500
            remote(random_frames(tiny, 4)[3])
        finally:
            remote.close()


def test_frames_that_raise_mid_way_keep_the_results_of_those_sent_before(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]
    """A generator of 5 frames that then raises: the 5 results (those in flight when it raised among them: 3 of
    them were lost) come first, in order, then its error, as ``PointPillars.infer_many`` has it."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frames = random_frames(tiny, 5)

    def five_then_fail() -> Iterator[np.ndarray]:
        yield from frames
        raise RuntimeError("the frame source broke")

    remote = RemoteDetector(tiny_server.endpoints["http"], protocol="http")
    got = []
    try:
        with pytest.raises(RuntimeError, match="the frame source broke"):
            for result in remote.infer_many(five_then_fail(), concurrency=2):
                got.append(result)
    finally:
        remote.close()
    assert [result.source for result in got] == [f"frame {i}" for i in range(5)]
    assert all(result.error is None and result.detections is not None for result in got)


def success_and_fail(client) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Triton's counts of the model's requests that ended in success and in failure (rejected by Triton), so far."""
    stats = client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]["inference_stats"]
    return int(stats.get("success", {}).get("count", 0)), int(stats.get("fail", {}).get("count", 0))


def metric_value(server: TritonServer, name: str) -> float:
    """A metric of the served model on Triton's Prometheus endpoint (0 while it is absent)."""
    with urllib.request.urlopen(server.endpoints["metrics"], timeout=5) as reply:
        text = reply.read().decode()
    found = re.search(rf'^{name}{{model="{MODEL_NAME}",version="1"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_requests_whose_client_gave_up_while_they_waited_are_answered_cancelled_not_detected(  # type: ignore[no-untyped-def]
        install, assets: Path, tmp_path: Path) -> None:
    """Requests that wait behind a busy instance (a batch of 8 KITTI frames on the CPU) and whose client gives
    up on them meanwhile (a gRPC cancel, as a passing deadline, ``infer --server --request-timeout``, does):
    those Triton had already put in a batch for the model were detected all the same (two runs with a
    0.05 s timeout kept a CPU server detecting for 40 s after they ended); the model answers them
    CANCELLED, counted in its metric. Oracle: Triton's own counts, where a request the model answers,
    CANCELLED or not, is a success (one Triton drops from its queue a failure), and a last request that
    queues behind them all."""
    frames = [read_points(path) for path in sorted((assets / "kitti/training/velodyne").glob("*.bin"))]
    busy: list[object] = []
    # a queue delay that lets the busy frames fill one batch, so that none of the others can join it
    with served(install, assets / CHECKPOINT, tmp_path, max_batch=8, max_queue_delay_us=100_000) as server:
        module, client = raw_client(server, "grpc")
        for index in range(8):
            client.async_infer(MODEL_NAME, threshold_inputs(module, frames[index % len(frames)]),
                               callback=lambda result, error: busy.append(error))
        time.sleep(0.1)
        waiting = [client.async_infer(MODEL_NAME, threshold_inputs(module, frames[index % len(frames)]),
                                      callback=lambda result, error: None) for index in range(8)]
        time.sleep(0.5)  # they are Triton's next batch for the instance by now
        assert not busy, "the busy batch ended before the others were given up: nothing tested"
        for call in waiting:
            call.cancel()
        client.infer(MODEL_NAME, threshold_inputs(module, frames[0]))  # queued behind all of them
        assert busy == [None] * 8, busy
        deadline = time.monotonic() + 10  # Triton counts a request once the model's execute has returned
        while True:
            success, fail = success_and_fail(client)
            cancelled = metric_value(server, "pointpillars_requests_cancelled")  # the model counts before Triton
            if success - cancelled >= 9 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        client.close()
    assert success - cancelled == 9, f"{success - cancelled - 9:g} of the requests given up were detected all the same"
    assert cancelled >= 1 and fail + cancelled <= 8, (success, fail, cancelled)  # the model saw some of them
