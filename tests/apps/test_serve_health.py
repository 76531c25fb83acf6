"""``pointpillars-trt serve`` knows when its server is broken: a warm-up request before "ready", a health
watch that notices a dead model worker, a non-zero exit after a crash, and no shared memory left behind.

Real ``tritonserver`` on loopback (CPU detector, the tiny model); the dead worker is the real Python-backend
stub process killed with SIGKILL, the crash the server itself killed with SIGKILL. Oracles: Triton's own
statistics endpoint (the warm-up request was served) and /dev/shm (the stub's regions are gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_serve_triton import START_TIMEOUT, endpoints_once_ready, install, random_frames, tiny, tiny_server  # noqa: F401 - fixtures: tritonserver, tiny model, a server of it

from pointpillars_trt.apps.serve.repository import MODEL_NAME
from pointpillars_trt.errors import BackendError


class Serve:
    """A ``serve`` process: the endpoints it printed before "ready", and the processes below it."""

    def __init__(self, model: Path, repo: Path, *options: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pointpillars_trt", "serve", "--model", str(model),
                                      "--repository", str(repo), "--device", "cpu", "--ready-timeout",
                                      str(START_TIMEOUT), *options],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # ``finish`` of a hung serve
        self.endpoints = endpoints_once_ready(self.proc, START_TIMEOUT + 30, lambda: self.finish()[1][-2000:])
        self.http = self.endpoints["http"]

    def server_pid(self) -> int:
        (pid,) = children(self.proc.pid)
        return pid

    def stub_pids(self) -> list[int]:
        return stub_pids(self.server_pid())

    def shm_regions(self) -> list[str]:
        return sorted(p.name for p in Path("/dev/shm").glob(f"pointpillars_trt_{self.proc.pid}_*"))

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """(exit code, stderr) once the process exits. One that outlives ``timeout`` fails the test with where each
        of its threads was (faulthandler's stacks, on SIGABRT), the processes below it killed."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            below = children(self.proc.pid)
            self.proc.send_signal(signal.SIGABRT)
            for pid in below:  # they hold serve's output pipes
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            try:
                _, err = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, err = self.proc.communicate()
            pytest.fail(f"serve did not exit within {timeout} s; its stderr's end:\n{err[-6000:]}")
        return self.proc.returncode, err


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def stub_pids(server: int) -> list[int]:
    """The Python-backend stubs a tritonserver started."""
    return [pid for pid in children(server)
            if "triton_python_backend_stub" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]


@pytest.fixture()
def serve(install, tiny, tmp_path: Path) -> Iterator[Serve]:  # type: ignore[no-untyped-def]  # noqa: F811
    started = Serve(tiny.path, tmp_path / "repo", "--health-interval", "1")
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.proc.send_signal(signal.SIGTERM)
            started.finish()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def inference_count(serve: Serve) -> int:
    with urllib.request.urlopen(f"http://{serve.http}/v2/models/{MODEL_NAME}/stats", timeout=5) as reply:
        return int(json.loads(reply.read())["model_stats"][0]["inference_count"])


@pytest.mark.slow
def test_ready_comes_after_a_served_warm_up_request_and_sigterm_exits_0(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # Health probes an hour apart: the only request before the check below is the warm-up. Triton counts a
    # Python-backend request once the reply has gone out, so the count may lag the reply by a moment.
    serve = Serve(tiny.path, tmp_path / "repo", "--health-interval", "3600")
    try:
        deadline = time.monotonic() + 10
        while inference_count(serve) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert inference_count(serve) == 1  # no client has sent anything yet
        assert serve.shm_regions(), "the stub's shared memory should carry this server's prefix"
    finally:
        serve.proc.send_signal(signal.SIGTERM)
        rc, err = serve.finish()
    assert rc == 0 and not error_lines(err), err[-2000:]
    assert serve.shm_regions() == []


@pytest.mark.slow
def test_exit_timeout_secs_is_passed_to_tritonserver(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """serve gave tritonserver a fixed exit timeout (8 s; killed 10 s after the stop): a server with long batches in
    flight could not be given longer. --exit-timeout-secs, tritonserver's own option, is passed on to it."""
    serve = Serve(tiny.path, tmp_path / "repo", "--exit-timeout-secs", "30", "--health-interval", "3600")
    try:
        command = Path(f"/proc/{serve.server_pid()}/cmdline").read_bytes().split(b"\0")
    finally:
        serve.proc.send_signal(signal.SIGTERM)
        rc, err = serve.finish()
    assert [arg for arg in command if arg.startswith(b"--exit-timeout")] == [b"--exit-timeout-secs=30"], command
    assert rc == 0 and not error_lines(err), err[-2000:]


@pytest.mark.slow
def test_another_model_folder_in_the_repository_is_neither_loaded_nor_loadable(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A repository that holds another model, one whose model.py fails to import (tritonserver loaded every folder
    of it, and that one stopped the server): serve's model alone is served, the other is not even tried, and
    Triton's load requests stay refused (one may carry a model's code); the repository keeps both folders."""
    repo = tmp_path / "repo"
    (repo / "othermodel" / "1").mkdir(parents=True)
    (repo / "othermodel" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\ninput [{name: "x" data_type: TYPE_FP32 dims: [1]}]\n'
        'output [{name: "y" data_type: TYPE_FP32 dims: [1]}]\n')
    (repo / "othermodel" / "1" / "model.py").write_text("import no_such_module_of_othermodel\n")
    serve = Serve(tiny.path, repo, "--health-interval", "3600")
    try:
        index = urllib.request.Request(f"http://{serve.http}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(index, timeout=5) as reply:
            assert [model["name"] for model in json.loads(reply.read())] == [MODEL_NAME]
        load = urllib.request.Request(f"http://{serve.http}/v2/repository/models/othermodel/load", data=b"{}",
                                      method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(load, timeout=5)
        assert refused.value.code >= 400
    finally:
        serve.proc.send_signal(signal.SIGTERM)
        rc, err = serve.finish()
    assert rc == 0 and not error_lines(err) and "no_such_module_of_othermodel" not in err, err[-2000:]
    assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(".")) == ["othermodel", MODEL_NAME]


@pytest.mark.slow
def test_serve_on_a_host_name_gets_ready_on_its_address(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    serve = Serve(tiny.path, tmp_path / "repo", "--host", "localhost", "--health-interval", "3600")
    try:
        assert serve.http.startswith("127.0.0.1:"), serve.endpoints
        with urllib.request.urlopen(f"http://{serve.http}/v2/health/ready", timeout=5) as reply:
            assert reply.status == 200
    finally:
        serve.proc.send_signal(signal.SIGTERM)
        rc, err = serve.finish()
    assert rc == 0 and "note: --host localhost: serving on 127.0.0.1" in err, err[-2000:]

@pytest.mark.slow
def test_serve_killed_with_sigkill_leaves_no_server_or_stub_running(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """kill -9 (or the OOM killer) gives serve no chance to stop its server: the server ends with it (a parent-
    death signal), and its stubs with the server, instead of running on as orphans holding the ports."""
    serve = Serve(tiny.path, tmp_path / "repo", "--health-interval", "3600")
    server, stubs = serve.server_pid(), serve.stub_pids()
    assert stubs
    serve.proc.kill()
    serve.proc.wait()
    deadline = time.monotonic() + 30
    while [pid for pid in [server, *stubs] if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in [server, *stubs] if running(pid)]

@pytest.mark.slow
def test_a_dead_model_worker_is_noticed_and_serve_exits_1(serve: Serve) -> None:
    (stub,) = serve.stub_pids()
    os.kill(stub, signal.SIGKILL)
    start = time.monotonic()
    rc, err = serve.finish()
    lines = error_lines(err)
    assert rc == 1 and len(lines) == 1 and f"model {MODEL_NAME} stopped answering" in lines[0], err[-2000:]
    assert "not healthy" in lines[0] or "refused" in lines[0]
    assert time.monotonic() - start < 40
    assert serve.shm_regions() == []


@pytest.mark.slow
def test_a_hung_server_is_noticed_within_a_few_probe_waits(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A tritonserver that stops answering (SIGSTOP) while serve watches it: each probe and its statistics request
    waited the warm-up's --ready-timeout (here 60 s; 2 minutes by default), four of them before serve gave up, ~8
    minutes by default. They now wait 3 health intervals, at least 5 s: serve stops it within half a minute."""
    serve = Serve(tiny.path, tmp_path / "repo", "--health-interval", "1", "--exit-timeout-secs", "1")
    os.kill(serve.server_pid(), signal.SIGSTOP)
    start = time.monotonic()
    rc, err = serve.finish(timeout=120)
    lines = error_lines(err)
    assert rc == 1 and lines and lines[0].startswith(f"error: model {MODEL_NAME} stopped answering ("), err[-2000:]
    assert "probe wait (3 x --health-interval) of 5 s" in lines[0], lines[0]
    assert time.monotonic() - start < 40


@pytest.mark.slow
def test_a_crashed_server_exits_1_and_leaves_no_shared_memory(serve: Serve) -> None:
    """A tritonserver killed: serve says so and exits 1, its backend stub (which may outlive the server,
    holding serve's output pipes) is killed with the server's process group, and no shared memory is left."""
    assert serve.shm_regions()
    stubs = serve.stub_pids()
    assert stubs
    os.kill(serve.server_pid(), signal.SIGKILL)
    rc, err = serve.finish()
    lines = error_lines(err)
    assert rc == 1 and len(lines) == 1 and lines[0] == (
        "error: tritonserver exited with code -9 (SIGKILL: killed by the kernel's out-of-memory killer, or kill -9); "
        "restart serve (a supervisor such as systemd's Restart=on-failure does it for you)"), err[-2000:]
    assert serve.shm_regions() == []
    deadline = time.monotonic() + 5  # SIGKILL takes a moment; a dead one waits as a zombie for its new parent
    while [pid for pid in stubs if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in stubs if running(pid)]



@pytest.mark.slow
def test_a_killed_server_is_not_reaped_until_its_process_group_is_killed(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The server's pid is its process group's id: reaped, it could be given to a new group leader, which
    the group kill would then hit. So a server that ended stays a zombie (its id its own) while serve watches
    it, and ``stop`` kills what is left of the group (the orphaned stub) before it reaps the server."""
    from test_serve_triton import served

    with served(install, tiny.path, tmp_path, max_points=1000) as server:
        assert server.process is not None
        leader = server.process.pid
        stubs = stub_pids(leader)
        assert stubs
        os.kill(leader, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while server.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.exit_code() == -signal.SIGKILL
        assert Path(f"/proc/{leader}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # not reaped
        assert os.getpgid(leader) == leader
        assert server.stop() == -signal.SIGKILL
        assert not Path(f"/proc/{leader}").exists()  # reaped by stop
    deadline = time.monotonic() + 5
    while [pid for pid in stubs if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in stubs if running(pid)]


@pytest.mark.slow
def test_a_server_reaped_elsewhere_is_an_ended_server_not_a_traceback(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Started by a process that ignores SIGCHLD (the kernel then reaps its children at once), a server that
    ends cannot be waited for without reaping: it reads as ended (code 0, as Popen says), and stop cleans up."""
    from test_serve_triton import served

    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        with served(install, tiny.path, tmp_path, max_points=1000) as server:
            assert server.process is not None
            stubs = stub_pids(server.process.pid)
            os.kill(server.process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while server.exit_code() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.exit_code() == 0
            assert server.stop() == 0 and server.shm_regions() == []
    finally:
        signal.signal(signal.SIGCHLD, previous)
    deadline = time.monotonic() + 10  # the orphaned stub ends once it finds its server gone
    while [pid for pid in stubs if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in stubs:
        if running(pid):
            os.kill(pid, signal.SIGKILL)

def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
def test_warm_up_refuses_a_server_whose_model_cannot_answer(install, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The model starts "ready" but every reply lacks an output: the warm-up says so in one line."""
    from test_serve_hostile import hostile_model

    from pointpillars_trt.apps.serve.health import warm_up
    from pointpillars_trt.apps.serve.server import TritonServer

    hostile_model(tmp_path / "repo", MODEL_NAME, "missing_labels")
    with TritonServer(tmp_path / "repo", install=install, log=tmp_path / "server.log") as server:
        with pytest.raises(BackendError, match="does not answer a warm-up request: .*missing labels"):
            warm_up(server.endpoints["http"], timeout=10)


def test_install_advice_never_installs_pytriton_into_this_environment(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    import importlib.util

    from pointpillars_trt.apps.serve.server import find_tritonserver

    if importlib.util.find_spec("pytriton") is not None:
        pytest.skip("nvidia-pytriton is installed here, so its binary is found")
    monkeypatch.delenv("PP_TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendError) as caught:
        find_tritonserver()
    text = str(caught.value)
    assert "pip install --no-deps --target DIR nvidia-pytriton" in text and "--tritonserver" in text
    assert "do not install nvidia-pytriton into this environment" in text
    assert "[serve]' nvidia-pytriton" not in text


def test_a_probe_that_times_out_while_other_requests_are_answered_is_not_a_failure(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A probe stuck behind real work (here: a timeout too short for any request) while the model answers
    others (Triton's success count grows between checks) is not counted against the model."""
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.apps.serve.health import ModelProbe

    frame = random_frames(tiny, 1)[0]
    probe = ModelProbe(tiny_server.endpoints["http"], timeout=1e-4, failures_allowed=0)
    remote = RemoteDetector(tiny_server.endpoints["grpc"])
    try:
        for _ in range(3):
            before = remote.answered_count()
            remote(frame)  # answered between two checks (more than the probe's own late answer)
            remote(frame)
            after = remote.answered_count()
            assert before is not None and after is not None and after >= before + 2, (before, after)
            assert probe.check() is None
    finally:
        probe.close()
        remote.close()


def test_a_probe_of_a_server_that_hung_for_a_while_asks_it_again_once_it_answers(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The server frozen (SIGSTOP) through a check: the probe times out and the server answers no liveness probe
    (the client takes it for down), a failure; thawed, the next check asks the server again and it answers
    (a client taken for down would fail every later check at once, and serve would call a live model dead)."""
    from pointpillars_trt.apps.serve.health import ModelProbe

    server = tiny_server.process
    assert server is not None
    probe = ModelProbe(tiny_server.endpoints["http"], timeout=1.0, failures_allowed=5)
    try:
        os.kill(server.pid, signal.SIGSTOP)
        try:
            assert probe.check() is None and probe.failures == 1
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert probe.check() is None and probe.failures == 0
    finally:
        probe.close()


@pytest.mark.slow
def test_a_client_of_a_live_server_whose_model_worker_died_takes_it_for_down_after_a_few_requests(  # type: ignore[no-untyped-def]  # noqa: F811
        install, tiny, tmp_path: Path) -> None:
    """The model's Python-backend stub killed (SIGKILL): the server stays live and fails every request; a client of
    2 requests in flight takes it for down after 4 failures in a row (not at the first: one failed request of a
    live server is that frame's), then fails each frame at once, naming the count and the last error."""
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.errors import DetectorLost
    from test_serve_triton import served

    frame = random_frames(tiny, 5)[4]
    with served(install, tiny.path, tmp_path / "server") as server:
        assert server.process is not None
        remote = RemoteDetector(server.endpoints["grpc"], timeout=30, concurrency=2)
        try:
            remote(frame)
            for pid in stub_pids(server.process.pid):
                os.kill(pid, signal.SIGKILL)
            said = []
            for _ in range(6):
                try:
                    remote(frame, "f.bin")
                    said.append("answered")
                except BackendError as exc:
                    said.append(type(exc).__name__ + ": " + str(exc))
            assert [line.split(":")[0] for line in said] == ["BackendError"] * 3 + ["DetectorLost"] * 3, said
            assert said[3].startswith(f"DetectorLost: f.bin: server {server.endpoints['grpc']} is down: it failed 4 "
                                      "requests in a row, the last: failed the request: ") and \
                said[3].endswith("; this client sends it no frame after this"), said[3]
            assert said[4] == said[5] == said[3] and remote.lost is not None and DetectorLost.MARK in remote.lost
        finally:
            remote.close()


def test_a_frame_refused_before_its_connection_opens_is_named(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A thread whose first request comes after the run was stopped (no connection opens then) or after the
    server was taken for down gets the error with its frame's name, as every other frame's error has."""
    import threading

    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.errors import BackendError, DetectorLost

    frame = random_frames(tiny, 5)[4]
    said: list[BaseException] = []

    def fresh_thread(detector: RemoteDetector, source: str) -> None:
        def call() -> None:
            try:
                detector._client(f"{source}: ")  # the connection of a thread that has none yet
            except BaseException as exc:  # noqa: BLE001 - what it raises is the test's subject
                said.append(exc)
        thread = threading.Thread(target=call)
        thread.start()
        thread.join(30)

    stopped = RemoteDetector(tiny_server.endpoints["grpc"], timeout=30)
    down = RemoteDetector(tiny_server.endpoints["grpc"], timeout=30)
    try:
        stopped(frame)
        stopped.cancel()
        fresh_thread(stopped, "a.bin")
        down._down = f"server {down.server}{DetectorLost.MARK}it answered no liveness probe"
        fresh_thread(down, "b.bin")
    finally:
        stopped.close()
        down.close()
    assert [type(exc) for exc in said] == [BackendError, DetectorLost], said
    assert str(said[0]) == f"a.bin: server {stopped.server}: the run was stopped"
    assert str(said[1]) == f"b.bin: server {down.server} is down: it answered no liveness probe"


def test_a_detector_with_another_timeout_answers_on_its_own_connections(tiny, tiny_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """``with_timeout`` (what a probe's short-timeout client is made with) answers like the detector it
    came from, and closing either leaves the other working."""
    from pointpillars_trt.apps.serve.client import RemoteDetector
    from pointpillars_trt.errors import InputError

    frame = random_frames(tiny, 5)[4]
    base = RemoteDetector(tiny_server.endpoints["http"], protocol="http", timeout=30)
    other = base.with_timeout(20)
    try:
        assert other.timeout == 20 and base.timeout == 30 and other.served == base.served
        first = base(frame)
        other.close()
        again = base(frame)  # the copy's close did not close this one's connection
        np.testing.assert_array_equal(first.boxes, again.boxes)
        other = base.with_timeout(20)
        base.close()
        np.testing.assert_array_equal(other(frame).boxes, first.boxes)
        with pytest.raises(InputError, match="timeout"):
            base.with_timeout(0)
    finally:
        base.close()
        other.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_request_that_outlasts_its_timeout_says_so_and_names_the_option(tiny, tiny_server, protocol: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """A request the server takes longer to answer than the timeout (here 0.1 ms, shorter than any frame
    takes) was 'failed the request: [StatusCode.DEADLINE_EXCEEDED] ...' (gRPC) or 'did not answer the request
    (timed out)' (HTTP), which named neither the cause nor the fix; a run's next frames fail the same way at any
    retry. Now both protocols say it outlasted the timeout, named as the caller names it, and that a server
    taking longer needs a longer one."""
    from pointpillars_trt.apps.serve.client import RemoteDetector

    frame = random_frames(tiny, 6)[5]
    endpoint = tiny_server.endpoints[protocol]
    base = RemoteDetector(endpoint, protocol=protocol, timeout=30, timeout_option="--request-timeout")
    short = base.with_timeout(0.0001)  # construction's own round trips would outlast it
    try:
        with pytest.raises(BackendError) as caught:
            short(frame, "f.bin")
        said = str(caught.value)  # the liveness probe after it has as short a timeout, and may take it for down
        assert said.startswith(f"f.bin: server {endpoint} ") and "did not answer within its --request-timeout of " \
            "0.0001 s (a server that takes longer a frame needs a longer --request-timeout)" in said, said
        assert base(frame).stats.num_points == len(frame)  # the server itself answers
    finally:
        short.close()
        base.close()


@pytest.mark.slow
def test_a_second_serve_cannot_rewrite_the_repository_of_a_running_one(serve: Serve, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The running serve holds its repository: another serve (or --repository-only) into it is one error
    naming the holder's pid, and the served config is left as it was; a file as --repository is refused too."""
    repo = tmp_path / "repo"
    config = (repo / MODEL_NAME / "config.pbtxt").read_bytes()
    second = subprocess.run([sys.executable, "-m", "pointpillars_trt", "serve", "--model", str(tiny.path),
                             "--repository", str(repo), "--device", "cpu", "--repository-only", "--max-batch", "2"],
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert f"is in use by a running serve (pid {serve.proc.pid})" in second.stderr, second.stderr
    assert (repo / MODEL_NAME / "config.pbtxt").read_bytes() == config
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    third = subprocess.run([sys.executable, "-m", "pointpillars_trt", "serve", "--model", str(tiny.path),
                            "--repository", str(a_file), "--device", "cpu", "--repository-only"],
                           capture_output=True, text=True, timeout=120)
    assert third.returncode == 2 and "is a file; give a folder" in third.stderr, third.stderr


@pytest.mark.slow
def test_a_stop_while_a_health_probe_waits_on_a_hung_server_is_acted_on_at_once(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The server frozen (SIGSTOP): the health probe waits out its timeout (here 60 s), and a SIGTERM meanwhile was
    acted on only once it had (a supervisor's stop timeout would have killed serve first). Now serve stops the
    server at once: it exits within the server's stop timeout (10 s), the frozen server killed."""
    serve = Serve(tiny.path, tmp_path / "repo", "--health-interval", "1")
    server = serve.server_pid()
    try:
        os.kill(server, signal.SIGSTOP)
        time.sleep(3)  # a probe is waiting on the frozen server
        start = time.monotonic()
        serve.proc.send_signal(signal.SIGTERM)
        rc, err = serve.finish(timeout=40)
        took = time.monotonic() - start
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGCONT)
    assert took < 20, (took, err[-2000:])
    assert "Traceback" not in err and "Exception in thread" not in err, err[-2000:]
    assert not Path(f"/proc/{server}").exists() or "zombie" in Path(f"/proc/{server}/status").read_text().lower()


@pytest.mark.slow
def test_health_probes_leave_serves_open_files_flat(install, tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Each probe ran on a new thread, whose HTTP connection (and its event loop) stayed open: three file
    descriptors a probe, until serve ran out of them and aborted (at the default 10 s, within about 90 minutes
    under a limit of 1,024). Oracles: /proc's count of serve's open files over some fifty probes, and Triton's own
    count of the requests its model answered (the probes did run)."""
    serve = Serve(tiny.path, tmp_path / "repo", "--health-interval", "0.1")
    try:
        def open_files() -> int:
            return len(os.listdir(f"/proc/{serve.proc.pid}/fd"))

        time.sleep(2)  # the probe's own connections are open
        before, answered = open_files(), inference_count(serve)
        deadline = time.monotonic() + 60
        while inference_count(serve) < answered + 50 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert inference_count(serve) >= answered + 50, "the probes did not run"
        assert open_files() <= before + 3, (before, open_files())
        serve.proc.send_signal(signal.SIGTERM)
        rc, err = serve.finish()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
            serve.finish()
    assert rc == 0 and "Traceback" not in err, err[-2000:]
