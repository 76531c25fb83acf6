"""What ``serve`` says of a server whose stop did not end in exit code 0 (``stop_error``), told apart by what
``TritonServer.stop`` saw of the exit. Real processes stand where tritonserver runs, each doing at the stop's SIGTERM
what tritonserver may do: end itself with exit code 1 once its exit timeout has run out (requests still in flight),
exit with a code at once, or not exit at all; and one killed from elsewhere before the stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pointpillars_trt.apps.serve.cli import stop_error
from pointpillars_trt.apps.serve.server import TritonInstall, TritonServer

EXIT_TIMEOUT = 1  # its stop timeout: 3 s


def server_running(tmp_path: Path, on_sigterm: str) -> TritonServer:
    """A TritonServer whose process is a Python process that runs ``on_sigterm`` at a SIGTERM (its own session, as
    tritonserver's, whose group ``stop`` kills)."""
    server = TritonServer(tmp_path, install=TritonInstall(Path(sys.executable), tmp_path, None, ()),
                          exit_timeout=EXIT_TIMEOUT)
    code = (f"import signal, sys, time\ndef stop(*_):\n    {on_sigterm}\nsignal.signal(signal.SIGTERM, stop)\n"
            "print('set', flush=True)\nwhile True:\n    time.sleep(1)\n")
    server.process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert server.process.stdout is not None
    with server.process.stdout as said:  # closed once read: the process writes nothing after this line
        assert said.readline() == b"set\n"
    return server


def test_the_exit_timeout_given_is_tritonservers_and_the_stop_waits_two_seconds_past_it(tmp_path: Path) -> None:
    """The stop timeout was fixed (10 s, tritonserver's exit timeout 8 s): a server with long batches in flight could
    not be given longer. The exit timeout is given (default 8 s), tritonserver is told it, and the stop waits 2 s
    more for its exit."""
    install = TritonInstall(Path(sys.executable), tmp_path, None, ())
    for given, exit_timeout, stop_timeout in (({}, 8, 10), ({"exit_timeout": 300}, 300, 302)):
        server = TritonServer(tmp_path, install=install, **given)
        command = server.command(tmp_path)
        assert [arg for arg in command if arg.startswith("--exit-timeout")] == [f"--exit-timeout-secs={exit_timeout}"]
        assert (server.exit_timeout, server.stop_timeout) == (exit_timeout, stop_timeout)


@pytest.mark.parametrize(("on_sigterm", "code", "said"), [
    ("time.sleep(1.2); sys.exit(1)", 1, "ran past its exit timeout of 1 s after the stop and ended itself (exit code "
                                        "1): it waits that long for its HTTP clients to close their connections"),
    ("sys.exit(1)", 1, "did not stop cleanly (exit code 1)"),  # sooner than its exit timeout: some other failure
    ("time.sleep(1.2); sys.exit(3)", 3, "did not stop cleanly (exit code 3)"),
    ("pass", -signal.SIGKILL, "did not finish its requests within 3 s of the stop and was killed"),
], ids=["exit-timeout", "exit-1-at-once", "exit-3", "no-exit"])
def test_a_stop_is_worded_by_how_the_server_ended(tmp_path: Path, on_sigterm: str, code: int, said: str) -> None:
    """A tritonserver that ran past its exit timeout at the stop ends itself with exit code 1, which serve said as
    'did not stop cleanly (exit code 1)'; the exit-code words stay for an exit that came sooner or with another code."""
    server = server_running(tmp_path, on_sigterm)
    assert server.stop() == code
    assert stop_error(server, code).startswith(said), stop_error(server, code)


def test_a_server_killed_from_elsewhere_before_the_stop_is_not_said_killed_by_it(tmp_path: Path) -> None:
    """A SIGKILL's exit code was said as the stop's kill after its timeout ('did not finish its requests within
    10 s of the stop and was killed'), whoever sent it (the out-of-memory killer, kill -9) and however soon."""
    server = server_running(tmp_path, "sys.exit(0)")
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    while server.exit_code() is None:
        time.sleep(0.01)
    assert server.stop() == -signal.SIGKILL
    assert stop_error(server, -signal.SIGKILL) == f"did not stop cleanly (exit code {-signal.SIGKILL})"
