"""A flood of oversized requests, each refused, leaves the server's memory where it was.

Real ``tritonserver`` on loopback with the tiny model capped at 5,000 points; 3 rounds of 6 concurrent
gRPC requests of 2 Mi points (32 MiB each) are sent. Oracle: the server process's anonymous resident
memory (/proc/PID/status RssAnon) before and after. The backend stub's shared-memory pool, which grows
to the largest batch it was handed, is reported by the README's limits, not measured here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_serve_triton import START_TIMEOUT, install, raw_infer, served, tiny  # noqa: F401 - fixtures

from pointpillars_trt.apps.serve.server import TritonServer

CAP = 5000
FLOOD_POINTS = 2 * 2**20


def rss_anon_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no RssAnon for {pid}")


@pytest.fixture()
def capped_server(install, tiny, tmp_path: Path) -> Iterator[TritonServer]:  # type: ignore[no-untyped-def]  # noqa: F811
    with served(install, tiny.path, tmp_path, max_points=CAP, max_batch=8, max_queue_delay_us=0) as server:
        yield server


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc")
def test_a_flood_of_refused_requests_leaves_the_servers_memory_flat(capped_server: TritonServer) -> None:
    from tritonclient.utils import InferenceServerException

    assert capped_server.process is not None
    pid = capped_server.process.pid
    raw_infer(capped_server, "grpc", np.zeros((1, 10, 4), np.float32))  # one real request: a settled baseline
    before = rss_anon_mib(pid)
    big = np.zeros((1, FLOOD_POINTS, 4), np.float32)
    refused: list[str] = []

    def one() -> None:
        try:
            raw_infer(capped_server, "grpc", big)
        except InferenceServerException as exc:
            refused.append(str(exc))

    for _ in range(3):
        threads = [threading.Thread(target=one) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert len(refused) == 18 and all(f"cap of {CAP}" in text for text in refused), refused[:2]
    grown = rss_anon_mib(pid) - before
    assert grown < 48, f"the server kept {grown:.0f} MiB after 18 refused 32 MiB requests"
