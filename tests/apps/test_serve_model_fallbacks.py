"""The served model (apps/serve/triton_model.py) on a backend stub that falls short, on a real ``tritonserver``
(loopback, free ports, CPU detector): a stub without custom metrics, a stub that refuses the model's answers.

The stub falls short as tests/data/serve/short_backend_model.py makes it, around the real model. Oracles: the
server's log (the stub's stderr), Triton's own answers and Prometheus endpoint.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from test_serve_triton import (START_TIMEOUT, install, metric_value, random_frames, raw_client,  # noqa: F401
                               tiny)

from pointpillars_trt.apps.serve.repository import MODEL_NAME, write_repository
from pointpillars_trt.apps.serve.server import TritonServer

pytestmark = pytest.mark.slow  # a real tritonserver per test: CI runs them with -m slow

SHORT = Path(__file__).resolve().parent.parent / "data" / "serve" / "short_backend_model.py"
COUNTERS = ("pointpillars_requests_cancelled", "pointpillars_requests_failed")


def short_server(install, tiny, root: Path, falls_short: str, **options: int) -> TritonServer:  # type: ignore[no-untyped-def]
    """A server of the tiny model whose stub falls short as ``falls_short`` says (short_backend_model.py)."""
    model = write_repository(tiny.path, root / "repo", device="cpu", **options)
    shutil.copyfile(SHORT, model / "1" / "model.py")
    with open(model / "config.pbtxt", "a", encoding="utf-8") as config:
        config.write(f'parameters {{ key: "falls_short", value: {{ string_value: "{falls_short}" }} }}\n')
    return TritonServer(root / "repo", install=install, log=root / "server.log")


def log_lines(server: TritonServer) -> list[str]:
    assert server.log is not None
    return server.log.read_text(errors="replace").splitlines()


def test_a_stub_without_metrics_is_said_once_naming_both_counters(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """On a stub without custom metrics the model makes neither counter: one warning names both (a fallback is
    said once), and the model answers requests all the same."""
    server = short_server(install, tiny, tmp_path, "metrics")
    with server.start(timeout=START_TIMEOUT):
        module, client = raw_client(server, "grpc")
        try:
            frame = random_frames(tiny, 5)[4]
            request = module.InferInput("points", [1, *frame.shape], "FP32")
            request.set_data_from_numpy(frame[None])
            reply = client.infer(MODEL_NAME, [request])
            assert int(reply.as_numpy("num_points")[0, 0]) == frame.shape[0]
        finally:
            client.close()
    warnings = [line for line in log_lines(server) if line.startswith("warning: pointpillars: no metric")]
    assert len(warnings) == 1 and all(name in warnings[0] for name in COUNTERS), warnings
    assert "MetricFamily" in warnings[0], warnings


def test_a_request_whose_answer_the_stub_refuses_is_counted_failed_once(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The stub refuses every answer of the model: each request is counted once in pointpillars_requests_failed,
    those whose detections could not be sent (Triton counted them as successes, the metric not at all) as the
    one whose error could not be (a frame over the points cap: counted before its send, not again after it),
    and each refusal is said once. Oracle: the requests this test sends, and the errors their clients get."""
    from tritonclient.utils import InferenceServerException

    server = short_server(install, tiny, tmp_path, "sends", max_points=100)
    with server.start(timeout=START_TIMEOUT):
        module, client = raw_client(server, "grpc")
        try:
            for count in (10, 20, 101):  # two frames detected, one over the cap
                request = module.InferInput("points", [1, count, 4], "FP32")
                request.set_data_from_numpy(np.zeros((1, count, 4), np.float32))
                with pytest.raises(InferenceServerException, match="answered before the model could"):
                    client.infer(MODEL_NAME, [request])
        finally:
            client.close()
        deadline = time.monotonic() + 10  # a refusal is said once it is counted, after the client's error
        while len(refusals := [line for line in log_lines(server) if "a request could not be answered" in line]) < 3 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        failed = metric_value(server, "pointpillars_requests_failed")
    assert failed == 3
    assert len(refusals) == 3 and all("cannot send more than one response" in line for line in refusals), refusals
