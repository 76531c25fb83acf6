"""Ctrl-C (SIGINT) and SIGTERM held off while code runs that must not take them: processes being spawned
(a child starts with the spawning thread's signal mask) and NVRTC compiling (it puts its own handlers in
Python's place meanwhile; a signal that reached them was lost); a stop event set safely from a handler."""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def stop_signals_blocked(*, keep_python_handlers: bool = False) -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread meanwhile (where the platform has signal masks): one sent to
    it waits, and is delivered to Python's handler when they are unblocked. One sent to the process goes to
    another thread that does not block it, if there is one: the command line starts NumPy's threads with
    both blocked, so there it reaches the main thread. ``keep_python_handlers``: then, on the main
    thread, Python's handlers are set again first, as Python sets them (a library that swapped its own in
    and back may have left other flags, e.g. SA_RESTART, under which a wait is not interrupted).

    A Python handler that raises (a Ctrl-C already pending) may do so inside these calls: the mask is put
    back whatever happens, so the thread never keeps the signals blocked."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # reads the mask only
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        yield
    finally:
        try:
            if keep_python_handlers and threading.current_thread() is threading.main_thread():
                for signum in STOP_SIGNALS:
                    handler = signal.getsignal(signum)
                    if handler is not None:  # None: a handler not set from Python, left alone
                        signal.signal(signum, handler)
        finally:
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            except BaseException:  # a handler raised on the way in, before the mask was put back
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
                raise


def set_from_signal_handler(event: threading.Event) -> None:
    """``event.set()`` for a signal handler, on a thread of its own: the handler runs on the main thread between
    any two of its steps, perhaps while that thread holds the event's lock inside ``event.wait``, where ``set``
    would wait for that lock for ever; the thread gets it once the handler has returned. A bare thread
    (``_thread``): ``threading.Thread.start`` takes a lock of the threading module's that the main thread may
    hold as well (while it starts a thread)."""
    _thread.start_new_thread(event.set, ())


def unblock_stop_signals() -> None:
    """Undo a ``stop_signals_blocked`` this process started under (a spawned child inherits the mask)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (a KeyboardInterrupt) ``exc`` was raised while handling, else None: a stop that
    lands inside a library surfaces as that library's error (a module whose import it cut short fails with
    ImportError "initialization failed"), and is still the stop."""
    return next((cause for cause in handled_chain(exc.__context__) if isinstance(cause, KeyboardInterrupt)), None)


def handled_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then each exception the one before was raised while handling (its ``__context__``), each once (a
    chain may loop back on itself)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__context__
