"""Is the served model answering? A warm-up request before ``serve`` says "ready", and the same tiny
request at intervals while it runs.

Triton keeps reporting "ready" after a Python-backend stub has died (every request then fails), and a
stub that crashes on its first request still starts "ready"; only a real request tells. One point at
the origin goes through the whole model (stub, detector, reply) and costs a fraction of a frame.
"""

from __future__ import annotations

import time

import numpy as np

from ...errors import BackendError, DetectorLost, PointPillarsError
from .client import RemoteDetector

#: Share of its timeout a failed probe must have waited to count as timed out (the client's clock and
#: the connection's differ by a little).
_WAITED_OUT = 0.9
#: Shortest wait of a probe and of the statistics requests (cheap: the server answers them from its counters).
MIN_PROBE_WAIT = 5.0
#: Health intervals a watching probe (and its statistics request) waits for an answer, at least MIN_PROBE_WAIT s:
#: with the warm-up's timeout (--ready-timeout, 2 minutes) a hung server took ~8 minutes to be noticed.
PROBE_INTERVALS = 3


class ModelProbe:
    """A client of the local server that sends the one-point frame and says what went wrong, if anything.

    ``failures_allowed`` consecutive failures are tolerated, the next one is reported; a dead stub fails
    every probe at once, so it is found within ``failures_allowed + 1`` intervals. A probe that fails
    while the model's count of answered requests (Triton's statistics) grew since the last check is not
    a failure: the probe waited behind a long queue of real work, and the model is busy, not dead.
    """

    def __init__(self, endpoint: str, *, timeout: float, failures_allowed: int = 1) -> None:
        # the statistics (and the setup's round trips) on a connection of their own: a probe's short
        # timeout must neither fail the setup nor lose the count
        self._stats = RemoteDetector(endpoint, protocol="http", timeout=max(timeout, MIN_PROBE_WAIT))
        self.timeout = timeout
        self._timeout_option = "--ready-timeout"  # the warm-up's; ``watch_every`` sets the watch's
        self.remote = self._probe_client()
        self.failures_allowed = failures_allowed
        self.failures = 0
        self._answered = self._stats.answered_count()
        # one point at the origin, of as many values as the served model reads (a multi-sweep model: 5)
        self._probe = np.zeros((1, self.remote.num_point_columns), np.float32)

    def check(self) -> str | None:
        """None while the model answers; the last error once too many probes in a row have failed."""
        start = time.monotonic()
        try:
            self.remote(self._probe, "health probe")
        except (PointPillarsError, OSError) as exc:
            if isinstance(exc, DetectorLost):  # down for this check; the next one asks the server again
                self.remote.close()
                self.remote = self._probe_client()
            # it waited out its timeout (rather than getting an error the server answered), and more than
            # this probe (which the server may still answer after our timeout) was answered meanwhile
            waited_out = time.monotonic() - start >= _WAITED_OUT * self.timeout
            answered, self._answered = self._answered, self._stats.answered_count()
            if waited_out and answered is not None and self._answered is not None and self._answered > answered + 1:
                self.failures = 0  # busy, not dead
                return None
            self.failures += 1
            return str(exc) if self.failures > self.failures_allowed else None
        self.failures = 0
        self._answered = self._stats.answered_count()
        return None

    def watch_every(self, interval: float) -> None:
        """Probe a running server every ``interval`` s from here on: each probe and its statistics request wait
        ``PROBE_INTERVALS`` intervals (at least ``MIN_PROBE_WAIT`` s, at most the warm-up's timeout), so that a hung
        server is noticed within about 4 probe waits and 2 intervals, where the warm-up waits for a slow start."""
        timeout = min(self.timeout, max(MIN_PROBE_WAIT, PROBE_INTERVALS * interval))
        self.close()
        self._stats, self.timeout = self._stats.with_timeout(timeout), timeout
        self._timeout_option = f"probe wait ({PROBE_INTERVALS} x --health-interval)"
        self.remote = self._probe_client()

    def _probe_client(self) -> RemoteDetector:
        """A client of the probes on connections of its own, of this probe's timeout (named as serve sets it)."""
        remote = self._stats.with_timeout(self.timeout)
        remote.timeout_option = self._timeout_option
        return remote

    def close(self) -> None:
        self.remote.close()
        self._stats.close()


def warm_up(endpoint: str, timeout: float) -> ModelProbe:
    """A probe whose first request has been answered: the server really serves (else a PointPillarsError
    saying why, e.g. a stub that crashed on its first request)."""
    probe = ModelProbe(endpoint, timeout=timeout, failures_allowed=0)
    error = probe.check()
    if error is not None:
        probe.close()
        raise BackendError(f"the server started but its model does not answer a warm-up request: {error}")
    probe.failures_allowed = 1
    return probe
