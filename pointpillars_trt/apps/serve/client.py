"""A client of the served detector: frames in, the same ``Detections`` as the local detector out.

Requests go over Triton's gRPC or HTTP protocol (tritonclient, imported here only); ``detect_batch``
and ``infer_many`` keep ``concurrency`` requests in flight so that the server's dynamic batcher has
batches to form, and give results in input order; a frame the server or the reader refuses is that frame's error.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from ...config import Thresholds, int_within
from ...detections import Detections
from ...detector import FrameResult, check_frames_to_stream, frame_source
from ...errors import (BackendError, DetectorLost, InputError, PointPillarsError, counted, one_line, printable_text,
                       safe_repr)
from ...frame_findings import FrameFindings
from ...pointcloud_io import read_points
from ...points import HostReader, as_host_points, check_frame_list, is_frame_path
from .reply import check_model_config, reply_detections, reply_output_names
from .repository import MODEL_NAME

PROTOCOLS = ("grpc", "http")
#: Most requests one client keeps in flight (each holds a frame and a thread).
MAX_IN_FLIGHT = 1024
#: Seconds the liveness probe after a request that failed on the server's side waits (at most the request
#: timeout): a server that answers it is busy, not down, and its next frames are sent.
LIVE_PROBE_SECONDS = 5.0
#: Who reads a frame from host memory: the request carries the points' bytes, whatever the server runs on.
REMOTE_DETECTOR = HostReader("a remote detector, which sends the server the points' bytes from host memory")


class RemoteDetector:
    """Detections from a ``pointpillars-trt serve`` server at ``server`` (HOST:PORT).

    Thread-safe: each thread gets its own connection. Construction checks that the model is ready
    and is a pointpillars-trt model (reply.check_model_config), so a wrong address or a foreign
    endpoint fails here in one line, not once per frame. Every reply is checked too
    (reply.reply_detections): a bad one is that frame's error. Frames over the server's points cap
    are refused here, before they are sent. ``concurrency``: the most requests in flight at once,
    counted over every ``detect_batch`` call of this detector, from any thread (``infer --in-flight``).
    A request that fails on the server's side (a timeout, a dropped connection) is followed by a liveness
    probe; a server that answers none, or fails ``concurrency + 2`` requests in a row, is down
    (``DetectorLost``): the requests in flight are abandoned and every later frame fails at once, so a hung
    server costs one timeout, not one a frame. A request that outlasts ``timeout`` says so, naming
    ``timeout_option`` (the caller's name for it, e.g. ``--request-timeout``): a slow server needs a longer one.
    Over gRPC a request given up on (by ``cancel``, by an ``infer_many`` closed early, or past its timeout) is
    cancelled on the server too, which then skips it if it still waits there. Over HTTP only the client gives up
    (its call ends, its connection is closed): tritonclient's HTTP client cannot cancel a request, and Triton's HTTP
    endpoint notices a closed connection only when it answers, so the server detects such frames all the same.
    """

    def __init__(self, server: str, *, protocol: str = "grpc", model: str = MODEL_NAME,
                 timeout: float = 60.0, thresholds: Thresholds | None = None, concurrency: int = 8,
                 timeout_option: str = "timeout") -> None:
        if protocol not in PROTOCOLS:
            raise InputError(f"--protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        _check_timeout(timeout)
        _check_concurrency(concurrency)
        self.concurrency = concurrency
        self._slots = threading.Semaphore(concurrency)  # detect_batch's requests in flight, all its calls'
        try:
            if protocol == "grpc":
                import tritonclient.grpc as module
            else:
                import tritonclient.http as module  # type: ignore[no-redef]
        except ImportError:
            raise BackendError("infer --server (Python: RemoteDetector) needs tritonclient: pip install "
                               "'pointpillars-trt[serve]'") from None
        self.server, self.protocol, self.model, self.timeout = server, protocol, model, timeout
        self._shown = printable_text(str(server))  # as messages name the server: one line whatever was given
        self.timeout_option = timeout_option
        # sent with every request (the server's optional inputs): the served model's own values otherwise
        given = dataclasses.asdict(thresholds) if thresholds is not None else {}
        self.thresholds = {name: value for name, value in given.items() if value is not None}
        from tritonclient.utils import InferenceServerException

        self._module: Any = module
        self._server_error = InferenceServerException
        self._local = threading.local()
        self._clients: list[Any] = []
        self._calls = _Calls()  # the requests in flight, for ``_abandon`` to give up on
        self._lock = threading.Lock()
        self._cancelled = False
        self._down: str | None = None  # why the server is taken for down (DetectorLost), once it is
        self._failed_in_row = 0  # requests failed on the server's side since the last one answered
        self._probing = threading.Lock()  # one liveness probe at a time: the requests failing with it wait for it
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        started = time.monotonic()
        try:
            ready = self._client().is_model_ready(model, **self._deadline(timeout))
            config = self._client().get_model_config(model, **({"as_json": True, **self._deadline(timeout)}
                                                                if protocol == "grpc" else {}))
        except Exception as exc:  # noqa: BLE001 - tritonclient raises its own and socket errors alike
            raise BackendError(self._unreachable(exc, time.monotonic() - started)) from None
        if not ready:
            raise BackendError(f"server {self._shown}: model {model!r} is not ready")
        self.served = check_model_config(config, f"server {self._shown}: model {model!r}")
        asked, cap = self.thresholds.get("max_boxes"), self.served.max_boxes
        if isinstance(asked, int) and cap is not None and asked > cap:
            self.close()
            raise InputError(f"--max-boxes {asked}: server {self._shown} returns at most {counted(cap, 'box', 'boxes')} "
                             f"a frame (its detector's cap, set when it was served); give at most {cap}")
        self.class_names, self.max_points = self.served.class_names, self.served.max_points
        self.num_point_columns = self.served.num_point_columns  # what infer reads a frame's points as
        # what infer draws its --viz pictures over and decides its default crop by, as of a local model dir
        self.point_range, self.fov_points_only = self.served.point_range, self.served.fov_points_only
        # a frame the network overflowed on, probably misread, or of pillars dropped: said once, as PointPillars says
        self._findings = FrameFindings(self.point_range, (__file__,))

    def with_timeout(self, timeout: float) -> RemoteDetector:
        """The same server and model with another request timeout, on connections of its own, without
        construction's round trips: a health probe's timeout may be shorter than they take on a busy host."""
        _check_timeout(timeout)
        other = copy.copy(self)
        other.timeout = timeout
        other._local, other._clients, other._lock = threading.local(), [], threading.Lock()
        other._calls = _Calls()
        other._cancelled, other._pool, other._pool_size = False, None, 0
        other._down, other._probing, other._failed_in_row = None, threading.Lock(), 0
        other._slots = threading.Semaphore(self.concurrency)
        return other

    def _client(self, prefix: str = "") -> Any:
        """This thread's connection; none once the detector is cancelled (a request would wait out its
        timeout on a server that hangs) or the server is down (``prefix``: the frame's, for that error). Their
        connections are closed then: over HTTP the next request on that of a request ``cancel`` stopped would
        wait for ever (geventhttpclient's closed pool keeps the stopped request's slot)."""
        client = getattr(self._local, "client", None)
        down = self._down
        if client is not None and (self._cancelled or down is not None):
            raise self._stopped(prefix) if down is None else DetectorLost(prefix + down)
        if client is None:
            kwargs = {"network_timeout": self.timeout, "connection_timeout": self.timeout} \
                if self.protocol == "http" else {}
            client = self._module.InferenceServerClient(self.server, **kwargs)
            with self._lock:
                cancelled, down = self._cancelled, self._down
                if not cancelled and down is None:
                    self._clients.append(client)
            if cancelled or down is not None:
                client.close()
                raise self._stopped(prefix) if down is None else DetectorLost(prefix + down)
            self._local.client = client
            self._local.wait = _HttpWait() if self.protocol == "http" else None
        return client

    def _stopped(self, prefix: str) -> BackendError:
        """The error of a request that ``cancel`` stopped, or that came after it."""
        return BackendError(f"{prefix}server {self._shown}: the run was stopped")

    def __call__(self, points: object, source: str | None = None) -> Detections:
        """The detections of one frame (``source``: its name in errors and warnings)."""
        return self._findings.of_result(self._detect(points, source, None),
                                        "the frame" if source is None else safe_repr(source))

    def _detect(self, points: object, source: str | None, stream: _Calls | None) -> Detections:
        """A frame's detections; ``stream``: the requests of the ``infer_many`` it belongs to, if any, which
        gives them up when it is closed early."""
        frame = as_host_points(points, source or "points", self.num_point_columns, REMOTE_DETECTOR)
        prefix = f"{source}: " if source else ""
        if self._down is not None:
            raise DetectorLost(prefix + self._down)
        if self.max_points is not None and frame.shape[0] > self.max_points:
            raise InputError(f"{prefix}{frame.shape[0]} points, more than the cap of {self.max_points} "
                             f"of server {self._shown} (serve --max-points)")
        request = self._module.InferInput("points", [1, *frame.shape], "FP32")
        request.set_data_from_numpy(frame[None])
        inputs = [request]
        for name, value in self.thresholds.items():
            wire, dtype = ("INT32", np.int32) if name == "max_boxes" else ("FP32", np.float32)
            inputs.append(self._module.InferInput(name, [1, 1], wire))
            inputs[-1].set_data_from_numpy(np.full((1, 1), value, dtype))
        outputs = [self._module.InferRequestedOutput(name) for name in self.served.outputs]
        try:
            client = self._client(prefix)
            reply = self._send(client, inputs, outputs, (self._calls,) if stream is None else (self._calls, stream))
        except _RequestStopped:  # given up on: by ``cancel``, by its infer_many closed early, or as the server is down
            raise (self._stopped(prefix) if self._down is None else DetectorLost(prefix + self._down)) from None
        except self._server_error as exc:
            status = str(exc.status())
            if status in ("StatusCode.INVALID_ARGUMENT", "400"):  # gRPC, HTTP: the frame's fault
                raise InputError(f"{prefix}server {self._shown} refused the frame: {one_line(exc)}") from None
            if status == "StatusCode.UNAVAILABLE":  # no server answers there (any more): not the frame's doing
                raise self._server_failure(prefix, f"cannot be reached (stopped or restarting?): {one_line(exc)}") \
                    from None
            if status == "StatusCode.DEADLINE_EXCEEDED":
                raise self._server_failure(prefix, self._timed_out()) from None
            raise self._server_failure(prefix, f"failed the request: {one_line(exc)}") from None
        except BackendError:  # no connection: the run was stopped, or the server is down
            raise
        except TimeoutError:  # HTTP's
            raise self._server_failure(prefix, self._timed_out()) from None
        except Exception as exc:  # noqa: BLE001 - a dropped connection, a timeout: this request's failure
            raise self._server_failure(prefix, f"did not answer the request ({one_line(exc)})") from None
        where = f"{prefix}server {self._shown}"
        try:
            names = reply_output_names(reply)
            arrays = {name: reply.as_numpy(name) for name in self.served.outputs}
        except Exception as exc:  # noqa: BLE001 - a malformed reply body fails in tritonclient's own ways
            raise BackendError(f"{where} answered a malformed reply ({one_line(exc)})") from None
        found = reply_detections(arrays, names, self.served, where, frame.shape[0])
        self._failed_in_row = 0
        return found

    def _send(self, client: Any, inputs: list[Any], outputs: list[Any], groups: tuple[_Calls, ...]) -> Any:
        """The reply to one request, or ``_RequestStopped`` once one of ``groups`` gives up on it. Over gRPC it is
        sent with ``async_infer``, whose call the groups cancel on the server too; over HTTP it is waited on in the
        thread's ``_HttpWait``, the one way to end it from another thread."""
        try:
            if self.protocol == "http":
                with self._local.wait.request(groups):
                    return client.infer(self.model, inputs, outputs=outputs)
            answer: Future[Any] = Future()
            call = client.async_infer(self.model, inputs, functools.partial(_settle, answer), outputs=outputs,
                                      client_timeout=self.timeout)
            for group in groups:
                group.add(call)
            try:
                return answer.result()
            finally:
                for group in groups:
                    group.discard(call)
        except Exception:  # failed once given up on (its call cancelled, its connection closed): not the server's doing
            if any(group.cancelled for group in groups):
                raise _RequestStopped("the request was given up on") from None
            raise

    @property
    def lost(self) -> str | None:
        """Why the server is taken for down (the ``DetectorLost`` every frame now gets), or None: a runner reads
        no more frames for it."""
        return self._down

    def _server_failure(self, prefix: str, what: str) -> BackendError:
        """The error of a request that failed on the server's side: ``what`` befell it, a BackendError of the
        frame while the server answers a liveness probe and has not failed ``concurrency + 2`` requests in a
        row (a model whose worker died fails every request of a live server); else the server is down
        (DetectorLost), and the requests still waiting on it are ended at once (``_abandon``)."""
        what = what.rstrip(".")
        with self._probing:
            self._failed_in_row += 1
            if self._down is None and not self._cancelled:
                failed = self._failed_in_row
                why = (f"{what}, and it answered no liveness probe within {self._probe_seconds():g} s"
                       if not self._answers_probe() else
                       f"it failed {failed} requests in a row, the last: {what}"
                       if failed >= self.concurrency + 2 else None)
                if why is not None:
                    with self._lock:
                        self._down = (f"server {self._shown}{DetectorLost.MARK}{why}; this client sends it no "
                                      "frame after this")
                    self._abandon()
        if self._down is not None:
            return DetectorLost(prefix + self._down)
        return BackendError(f"{prefix}server {self._shown} {what}")

    def _deadline(self, seconds: float) -> dict[str, float]:
        """A gRPC call's own timeout (HTTP's is the connection's, set when it is made)."""
        return {"client_timeout": seconds} if self.protocol == "grpc" else {}

    def _unreachable(self, exc: Exception, seconds: float) -> str:
        """Why construction's first requests failed, ``seconds`` after they were sent. A server that does not
        answer within the timeout (stopped, hung, overloaded) is said to be so, one that serves no model of that
        name so; gRPC's own connect timeout (~20 s), which ends a connection never answered before a longer
        timeout does, is said as such; a transport failure at once from something that listens is most likely the
        server's other endpoint (``_other_protocol_hint``)."""
        where = f"server {self._shown} ({self.protocol})"
        status = str(exc.status()) if isinstance(exc, self._server_error) else None
        if status == "StatusCode.UNAVAILABLE" and "timed out" in str(exc):  # gRPC's own connect timeout, not ours
            what = ("accepted the connection but sent no gRPC handshake" if "SETTINGS frame" in str(exc)
                    else "did not accept a connection")
            return (f"{where}: {what} within gRPC's own connect timeout ({seconds:.0f} s, shorter than the "
                    f"{self.timeout_option} of {self.timeout:g} s): is the server stopped or hung (its log says), or "
                    "the address another machine's?")
        if isinstance(exc, TimeoutError) or status == "StatusCode.DEADLINE_EXCEEDED":
            return (f"{where}: did not answer within {self.timeout:g} s: is the server stopped or hung (its log "
                    f"says), or the address another machine's? A server that is only slow needs a longer "
                    f"{self.timeout_option}")
        if status is not None and "unknown model" in str(exc):  # Triton's words, over either protocol
            if self.model == MODEL_NAME:  # infer --server names no model: the server is another's
                return (f"{where}: serves no model {self.model!r} ({one_line(exc)}): give the address of a server "
                        f"that pointpillars-trt serve started (the model it serves is {MODEL_NAME!r})")
            return (f"{where}: serves no model {self.model!r} ({one_line(exc)}): give the name of a model it serves "
                    f"(pointpillars-trt serve serves {MODEL_NAME!r}, the default)")
        answered = status is not None and status != "StatusCode.UNAVAILABLE"
        return f"{where}: cannot be reached ({one_line(exc)})" + ("" if answered else
                                                                  _other_protocol_hint(self.server, self.protocol))

    def _timed_out(self) -> str:
        """What befell a request that outlasted the timeout: a frame that takes the server longer (a CPU server,
        a long queue) fails so at every try, so the fix is said, not only the gRPC or socket error."""
        return (f"did not answer within its {self.timeout_option} of {self.timeout:g} s (a server that takes "
                f"longer a frame needs a longer {self.timeout_option})")

    def _probe_seconds(self) -> float:
        return min(LIVE_PROBE_SECONDS, self.timeout)

    def _answers_probe(self) -> bool:
        """Whether the server says it is live within ``_probe_seconds``, on a connection of the probe's own."""
        seconds = self._probe_seconds()
        try:
            client = self._module.InferenceServerClient(self.server, **({} if self.protocol == "grpc" else {
                "connection_timeout": seconds, "network_timeout": seconds}))
        except Exception:  # noqa: BLE001 - an address it cannot even connect to: no answer
            return False
        try:
            return bool(client.is_server_live(**self._deadline(seconds)))
        except Exception:  # noqa: BLE001 - refused, reset or timed out alike: no answer
            return False
        finally:
            client.close()

    def answered_count(self) -> int | None:
        """Requests the served model has answered successfully so far (Triton's statistics), or None
        when the server does not say."""
        try:
            stats = self._client().get_inference_statistics(self.model, **({"as_json": True}
                                                                          if self.protocol == "grpc" else {}))
            return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))  # absent: none yet
        except Exception:  # noqa: BLE001 - no statistics (a busy or dead server): the caller goes by its probe
            return None

    def detect_batch(self, frames: Sequence[object], *, concurrency: int | None = None) -> list[Detections]:
        """Detections of several frames, one request each, all in flight at once (up to
        ``concurrency``; default: the detector's, shared with its other calls) so that the server's
        dynamic batcher can batch them; the first error is raised once every request is back."""
        results = self.detect_each(frames, concurrency=concurrency)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]  # no exception among them

    def detect_each(self, frames: Sequence[object], *, concurrency: int | None = None,
                    ) -> list[Detections | BaseException]:
        """``detect_batch``, with each frame's own outcome: its ``Detections``, or the exception that failed
        it, so that a refused frame costs no other frame a second request (what ``infer`` runs its
        frames with, through ``detector.detect_each``). What the detections say is said once, as
        ``PointPillars.detect_batch`` says it (``FrameFindings``)."""
        if concurrency is not None:
            _check_concurrency(concurrency)
        in_flight = self._slots if concurrency is None else threading.Semaphore(concurrency)
        concurrency = concurrency or self.concurrency
        check_frame_list(frames, self.num_point_columns)
        frames = list(frames)  # a generator too; a stacked array's frames
        if not frames:
            return []
        pool = self._shared_pool(concurrency)

        def detect(frame: object) -> Detections:
            try:
                return self._detect(frame, None, None)
            finally:
                in_flight.release()

        futures = []
        for frame in frames:
            in_flight.acquire()
            futures.append(pool.submit(detect, frame))
        results = [future.exception() or future.result() for future in futures]
        for index, result in enumerate(results):  # said on the caller's thread, naming its line
            if isinstance(result, Detections):
                self._findings.of_result(result, f"frame {index} of the batch")
        return results

    def infer_many(self, frames: Iterable[object], *,
                   concurrency: int | None = None) -> Generator[FrameResult, None, None]:
        """Frames (arrays or .bin paths) with up to ``concurrency`` requests in flight (default: the
        detector's); input order. The arguments are checked here, as ``PointPillars.infer_many`` checks
        them, not at the first result. A generator: ``close()`` on it gives up on its requests (``_stream``)."""
        if concurrency is not None:
            _check_concurrency(concurrency)
        check_frames_to_stream(frames, self.num_point_columns)
        return self._stream(frames, concurrency or self.concurrency)

    def _stream(self, frames: Iterable[object], concurrency: int) -> Generator[FrameResult, None, None]:
        """The frames' results in input order; an error of ``frames`` itself (a generator that raises) comes
        after the results of the frames it gave before it, as ``PointPillars.infer_many`` has it. Closed early
        (``close()``, or a ``for`` loop left early with nothing else holding it), it drops the requests not yet sent and gives up on those in flight at once,
        its own only (another call of the detector carries on): over gRPC they are cancelled, on the server too;
        over HTTP their calls end and their connections close (the server answers them all the same, see the
        class). It returns once they have unwound."""
        window: deque[tuple[str, Future[Detections]]] = deque()
        failure: Exception | None = None
        pool, in_flight = self._shared_pool(concurrency), threading.Semaphore(concurrency)  # the pool may be larger
        calls = _Calls()

        def detect(item: object, source: str) -> Detections:
            try:
                return self._detect_item(item, source, calls)
            finally:
                in_flight.release()

        try:
            try:
                for index, item in enumerate(frames):
                    source = frame_source(item, index)
                    in_flight.acquire()
                    window.append((source, pool.submit(detect, item, source)))
                    if len(window) >= 2 * concurrency:  # a bounded read-ahead: memory stays flat
                        yield self._said(_result(*window.popleft()))
            except Exception as exc:  # of the frames (a Ctrl-C or a closed generator is no Exception: it stops)
                failure = exc
            while window:  # those sent are answered first
                yield self._said(_result(*window.popleft()))
        finally:  # a caller that stopped early: the requests not yet sent are dropped, those in flight given up on
            for _, future in window:
                future.cancel()
            calls.cancel()
            wait([future for _, future in window])
        if failure is not None:
            raise failure

    def _said(self, result: FrameResult) -> FrameResult:
        """``result``, what its detections say said once (``FrameFindings``) naming its source, as
        ``PointPillars.infer_many`` names it; on the caller's thread, at its line."""
        if result.detections is not None:
            self._findings.of_result(result.detections, safe_repr(result.source))
        return result

    def _shared_pool(self, concurrency: int) -> ThreadPoolExecutor:
        """The detector's threads that send requests, at least ``concurrency`` of them, shared by its calls: a
        connection is kept a thread (over HTTP with an event loop of tritonclient's that outlives the thread), so
        threads made a call would leave three file descriptors each behind."""
        with self._lock:
            if self._pool is None or self._pool_size < concurrency:  # a smaller one ends once its callers are done
                self._pool, self._pool_size = ThreadPoolExecutor(max_workers=concurrency,
                                                                 thread_name_prefix="pp-remote"), concurrency
            return self._pool

    def _detect_item(self, item: object, source: str, stream: _Calls) -> Detections:
        columns = self.num_point_columns
        points = read_points(os.fsdecode(item), point_dim=columns, columns=columns) if is_frame_path(item) else item
        return self._detect(points, source, stream)

    def cancel(self) -> None:
        """Abandon the requests in flight (a run stopped by Ctrl-C): calls that wait on a hung server fail at
        once instead of at their timeout, each saying the run was stopped, and the connections close. Over gRPC
        the server hears of it (it skips the requests still waiting there); over HTTP it does not (see the
        class). The detector is closed after."""
        with self._lock:
            self._cancelled = True  # no connection opens after this one: the requests not yet sent fail too
        self._abandon()

    def _abandon(self) -> None:
        """Ends every request in flight at once and closes the connections (once ``cancel`` or the server found
        down refuses new ones), each request failing with ``_RequestStopped`` (``_Calls.cancel``)."""
        with self._lock:
            clients = list(self._clients)
        self._calls.cancel()
        for client in clients:
            client.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        for client in clients:
            client.close()


class _RequestStopped(ConnectionAbortedError):
    """A request given up on (``_Calls``); raised by ``_HttpWait`` in the HTTP request it ends (a socket error, so
    that geventhttpclient closes the request's connection as it unwinds and its client stays usable)."""


class _Calls:
    """Requests given up on together: the detector's (by ``cancel``, or once the server is down) or an
    ``infer_many``'s (closed early). ``cancel`` ends each of their calls in flight at once: a gRPC call is
    cancelled, which tells the server (it skips those still waiting there), an HTTP one raised out of
    (``_HttpCall``). A call added after is cancelled as it is added, and a request of them that fails after is
    taken for given up on, not for the server's failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: set[Any] = set()  # tritonclient's gRPC CallContexts, _HttpCalls: each has ``cancel()``
        self.cancelled = False

    def add(self, call: Any) -> None:
        with self._lock:
            if not self.cancelled:
                self._calls.add(call)
                return
        call.cancel()

    def discard(self, call: Any) -> None:
        with self._lock:
            self._calls.discard(call)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            calls, self._calls = list(self._calls), set()
        for call in calls:
            call.cancel()


def _settle(answer: Future[Any], result: Any, error: BaseException | None) -> None:
    """tritonclient's gRPC callback: ``answer`` gets the reply or the error."""
    if error is None:
        answer.set_result(result)
    else:
        answer.set_exception(error)


class _HttpWait:
    """Lets another thread end an HTTP request this thread waits on, at once. tritonclient's HTTP client cannot
    cancel a request: its ``infer`` waits on a socket in the gevent loop of the thread that sent it, and the
    client closed from another thread leaves that wait to its timeout. A callback handed to that loop (the one
    way in from another thread) raises in the request instead; the server is not told (see RemoteDetector)."""

    def __init__(self) -> None:
        import gevent  # tritonclient's HTTP client runs on it

        self._loop, self._sender = gevent.get_hub().loop, gevent.getcurrent()
        self._current: _HttpCall | None = None  # the request this thread sends now

    @contextlib.contextmanager
    def request(self, groups: tuple[_Calls, ...]) -> Iterator[None]:
        """Around one request of this thread: each of ``groups`` may end it (``_HttpCall``); one given up on
        already fails before it is sent."""
        call = self._current = _HttpCall(self)
        try:
            for group in groups:
                group.add(call)
            if call.cancelled:
                raise _RequestStopped("the request was given up on")
            yield
        finally:
            self._current = None
            for group in groups:
                group.discard(call)

    def stop(self, call: _HttpCall) -> None:
        """From any thread: ``call`` raises ``_RequestStopped`` if this thread still waits on it."""
        self._loop.run_callback_threadsafe(self._raise, call)

    def _raise(self, call: _HttpCall) -> None:
        """Runs in this thread's loop, which runs while a request waits: a request that has ended, or another
        request of the thread's since (a stop comes in while the thread is idle runs at its next request), is left
        alone. A stop the request swallows (geventhttpclient tries a host's next address when a connect fails)
        is raised again at its next wait."""
        if self._current is call:
            self._sender.throw(_RequestStopped("the request was given up on"))
            if self._current is call:
                self._loop.run_callback(self._raise, call)


class _HttpCall:
    """One HTTP request of a thread, as ``_Calls`` ends it: ``cancel`` from any thread."""

    def __init__(self, wait: _HttpWait) -> None:
        self._wait = wait
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True  # before the stop: one that comes before the request is sent fails it at once
        self._wait.stop(self)


def _other_protocol_hint(server: str, protocol: str) -> str:
    """'; something listens there: ...' when ``server`` accepts a TCP connection that did not answer
    ``protocol`` (the caller asks only after a transport failure, not an error a server of ``protocol``
    returned): the server's metrics endpoint when it answers Triton's metrics, else most likely the server's
    other endpoint (serve prints both), e.g. its HTTP port given to the default gRPC client."""
    host, _, port = server.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
    except (OSError, ValueError):
        return ""
    if _answers_triton_metrics(host.strip("[]"), int(port)):
        return ("; that is a Triton server's metrics endpoint (it answers /metrics): give its "
                f"{protocol} endpoint (serve prints each)")
    other = "http" if protocol == "grpc" else "grpc"
    return (f"; something listens there but does not answer {protocol}: if it is the server's {other} endpoint, "
            f"pass --protocol {other} or give its {protocol} endpoint (serve prints both)")


def _answers_triton_metrics(host: str, port: int) -> bool:
    """Whether ``host:port`` answers ``GET /metrics`` with Triton's Prometheus metrics (their ``nv_`` names)."""
    import http.client

    connection = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        connection.request("GET", "/metrics")
        reply = connection.getresponse()
        return reply.status == 200 and b"nv_" in reply.read(1 << 20)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
        raise InputError(f"timeout {timeout!r}: expected seconds in (0, 86400]")


def _result(source: str, future: Future[Detections]) -> FrameResult:
    try:
        return FrameResult(source, future.result(), None)
    except PointPillarsError as exc:
        return FrameResult(source, None, exc)


def _check_concurrency(concurrency: object) -> None:
    if int_within(concurrency, 1, MAX_IN_FLIGHT) is None:
        raise InputError(f"concurrency {concurrency!r}: expected an integer in 1..{MAX_IN_FLIGHT}")
