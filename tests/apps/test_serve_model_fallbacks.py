"""The served model (apps/serve/triton_model.py) on a backend stub that falls short, on a real ``tritonserver``
(loopback, free ports, CPU detector): a stub without custom metrics.

The stub falls short as tests/data/serve/short_backend_model.py makes it, around the real model. Oracles: the
server's log (the stub's stderr) and Triton's own answers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_serve_triton import START_TIMEOUT, install, random_frames, raw_client, tiny  # noqa: F401 - fixtures

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
    return TritonServer(root / "repo", install=install, log=root / "server.log", stop_timeout=10)


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
