"""The ports a ``tritonserver`` is started on: its HTTP, gRPC and metrics endpoints each get their own (two
picked one after another could come back the same, and the server then refused to start). Oracle: the
ports themselves, and a socket bound to each."""

from __future__ import annotations

import socket
from pathlib import Path

from pointpillars_trt.apps.serve.server import TritonInstall, TritonServer, free_ports


def test_ports_picked_together_are_distinct_and_free_and_none_of_those_to_avoid() -> None:
    for _ in range(300):
        avoid = free_ports("127.0.0.1", 1)
        ports = free_ports("127.0.0.1", 3, avoid=avoid)
        assert len(set(ports)) == 3 and not set(ports) & set(avoid)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # closed again: free to bind


def test_a_server_gets_three_distinct_ports_beside_the_one_given(tmp_path: Path) -> None:
    install = TritonInstall(binary=tmp_path / "tritonserver", backends=tmp_path, stub=None, libs=())
    for _ in range(100):
        given = free_ports("127.0.0.1", 1)[0]
        server = TritonServer(tmp_path, install=install, grpc_port=given)
        assert server.grpc_port == given
        assert len({server.http_port, server.grpc_port, server.metrics_port}) == 3


def test_a_failed_start_names_the_repositorys_other_model_folders(tmp_path: Path) -> None:
    """tritonserver loads every folder of its repository and exits when one fails: serve's error names the
    folders that are not its model (not its own, nor hidden entries such as its lock and staging)."""
    from pointpillars_trt.apps.serve.server import other_models_note

    (tmp_path / "pointpillars").mkdir()
    (tmp_path / ".pointpillars.1a2b.tmp").mkdir()
    (tmp_path / ".pointpillars-serve.lock").write_text("1\n")
    assert other_models_note(tmp_path) == ""
    for name in ("keepme", "b", "c", "d"):
        (tmp_path / name).mkdir()
    assert other_models_note(tmp_path) == (
        "; the repository also holds 'b', 'c', 'd' and 1 more, which tritonserver loads as models too, and a folder "
        "that fails to load stops it: move them away, or give serve a --repository of its own")
