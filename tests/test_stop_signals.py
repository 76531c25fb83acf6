"""``stop_signals``: a Ctrl-C or SIGTERM that comes while they are held reaches Python's handler once they are
released, and Python's handlers come back as Python set them. Oracle: the kernel's own record of the handler
(``sigaction``) and the exception the signal raises."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import signal_actions
from pointpillars_trt.stop_signals import stop_signals_blocked

pytestmark = pytest.mark.skipif(not signal_actions.available() or not hasattr(signal, "pthread_sigmask"),
                                reason="Linux signal masks and sigaction layout")


def test_a_ctrl_c_while_held_is_raised_once_they_are_released() -> None:
    """Sent to this thread (a signal sent to the process goes to a thread that does not block it, if any)."""
    reached = False
    with pytest.raises(KeyboardInterrupt):
        with stop_signals_blocked():
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            for _ in range(1000):  # bytecodes enough for a pending handler to have run
                pass
            reached = True
    assert reached
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_python_handlers_come_back_as_python_set_them() -> None:
    """A library (NVRTC) that swaps its handlers in and back with signal() leaves SA_RESTART on Python's:
    a wait would then not be interrupted by Ctrl-C. Held with ``keep_python_handlers``, the flags are
    Python's again after."""
    assert threading.current_thread() is threading.main_thread()
    python_own = {signum: signal_actions.action(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a Python handler, as the CLI sets one
    try:
        python_own[signal.SIGTERM] = signal_actions.action(signal.SIGTERM)
        with stop_signals_blocked(keep_python_handlers=True):
            for signum in python_own:
                signal_actions.set_flags(signum, python_own[signum][1] | signal_actions.SA_RESTART)
        assert {signum: signal_actions.action(signum) for signum in python_own} == python_own
        with stop_signals_blocked():  # without it, the flags stay as the library left them
            signal_actions.set_flags(signal.SIGINT, python_own[signal.SIGINT][1] | signal_actions.SA_RESTART)
        assert signal_actions.action(signal.SIGINT)[1] & signal_actions.SA_RESTART
        signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))
    finally:
        signal.signal(signal.SIGTERM, previous)



#: Run in a process of its own: another thread interrupts the main thread every 0.5 ms for 2 s while the main
#: thread enters and leaves the block; the interrupt raises only while armed (around the block, once an
#: arming), so that it cannot land in the loop's own code. Prints how often the block was entered and how
#: often the mask was left blocked after it.
_STORM = """
import _thread, signal, threading, time
from pointpillars_trt.stop_signals import stop_signals_blocked
STOP = {signal.SIGINT, signal.SIGTERM}
state = {"armed": False, "stop": False}
def on_interrupt(signum, frame):
    if state["armed"]:
        state["armed"] = False
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_interrupt)
def interrupt():
    while not state["stop"]:
        _thread.interrupt_main()
        time.sleep(0.0005)
threading.Thread(target=interrupt, daemon=True).start()
entered = raised = left_blocked = 0
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    try:
        try:
            state["armed"] = True
            with stop_signals_blocked(keep_python_handlers=True):
                entered += 1
        finally:
            state["armed"] = False
    except KeyboardInterrupt:
        raised += 1
    left_blocked += bool(STOP & signal.pthread_sigmask(signal.SIG_BLOCK, ()))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
state["stop"] = True
print(entered, raised, left_blocked)
"""

def test_the_signals_are_never_left_blocked_when_a_ctrl_c_lands_inside_the_block_calls() -> None:
    """Ctrl-C pending at any point may make the mask calls themselves raise: the thread's mask is still put
    back every time (a process of its own, as the interrupts would otherwise reach the test runner)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _STORM], capture_output=True, text=True, timeout=60)
    entered, raised, left_blocked = map(int, done.stdout.split())
    assert entered > 100 and raised > 10 and left_blocked == 0, (done.stdout, done.stderr[-2000:])


_CLI_THREADS = r"""
import os, sys
sys.argv = ["pointpillars-trt", "--version"]
from pointpillars_trt.apps import console
try:
    console.main()  # prints the version, and exits
except SystemExit:
    pass
import numpy
blocked = {}
for task in os.listdir("/proc/self/task"):
    status = open(f"/proc/self/task/{task}/status").read()
    blocked[int(task)] = int(next(l for l in status.splitlines() if l.startswith("SigBlk")).split()[1], 16)
stop = (1 << (2 - 1)) | (1 << (15 - 1))  # SIGINT, SIGTERM
print(sum(1 for t in blocked if t != os.getpid()), all(m & stop == stop for t, m in blocked.items() if t != os.getpid()),
      blocked[os.getpid()] & stop)
"""


def test_the_command_lines_numpy_threads_never_take_a_stop_signal() -> None:
    """The command line imports NumPy (whose BLAS starts its threads then) with Ctrl-C and SIGTERM held:
    those threads keep them blocked, so a signal to the process reaches the main thread or waits for it
    (while NVRTC compiles, another thread would run NVRTC's handler and the signal be lost)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "3"}
    done = subprocess.run([sys.executable, "-c", _CLI_THREADS], capture_output=True, text=True, timeout=60, env=env)
    others, all_blocked, main_blocked = done.stdout.splitlines()[-1].split()
    assert int(others) >= 1 and all_blocked == "True" and main_blocked == "0", (done.stdout, done.stderr[-2000:])


_DETECTOR_THREADS = r"""
import os, sys
from pointpillars_trt import PointPillars
from pointpillars_trt.convert.export import model_dir_for_checkpoint


def masks():
    found = {}
    for task in os.listdir("/proc/self/task"):
        status = open(f"/proc/self/task/{task}/status").read()
        found[int(task)] = int(next(l for l in status.splitlines() if l.startswith("SigBlk")).split()[1], 16)
    return found


model = model_dir_for_checkpoint(sys.argv[1], config=None, precision="fp16", cache_dir=sys.argv[2])
before = set(masks())
detector = PointPillars(model, device="cuda")
after = masks()
stop = (1 << (2 - 1)) | (1 << (15 - 1))  # SIGINT, SIGTERM
started = [mask for task, mask in after.items() if task not in before]
print(len(started), all(mask & stop == stop for mask in started), after[os.getpid()] & stop)
"""


@pytest.mark.cuda
def test_the_threads_a_gpu_detector_starts_never_take_a_stop_signal(gpu_engine, assets, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The threads that open with a GPU detector (the CUDA driver's, the engine libraries') start with Ctrl-C and
    SIGTERM blocked, so a signal to the process never runs NVRTC's handlers in one of them; the opening thread
    has them unblocked again after."""
    import subprocess
    import sys

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    done = subprocess.run([sys.executable, "-c", _DETECTOR_THREADS, str(checkpoint), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    started, all_blocked, main_blocked = done.stdout.splitlines()[-1].split()
    assert int(started) >= 1 and all_blocked == "True" and main_blocked == "0", (done.stdout, done.stderr[-2000:])


def test_a_handler_that_lands_while_the_main_thread_holds_the_events_lock_still_sets_it() -> None:
    """A handler runs on the main thread between any two of its steps, here while it holds the event's lock as
    ``Event.wait`` does; ``Event.set`` there would wait for that lock for ever, so the run is a child process of
    its own, given a timeout. Oracle: the event is set once the lock is let go."""
    script = textwrap.dedent("""
        import signal, threading
        from pointpillars_trt.stop_signals import set_from_signal_handler
        stop = threading.Event()
        signal.signal(signal.SIGUSR1, lambda signum, frame: set_from_signal_handler(stop))
        with stop._cond:  # where Event.wait holds it
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            for _ in range(1000):  # bytecodes enough for the pending handler to have run
                pass
            held_through = not stop.is_set()
        print(held_through, stop.wait(10))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], (done.stdout, done.stderr[-2000:])
