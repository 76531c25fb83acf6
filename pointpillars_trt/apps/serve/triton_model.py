"""Triton Python-backend model for PointPillars, copied into a repository as ``pointpillars/1/model.py``.

Each instance builds its detectors (the ``pipelines`` parameter: one GPU pipeline each, of batch
``max_batch_size``) in ``initialize`` (model dir, device and runtime options from the config's
parameters; a KIND_GPU instance runs on the GPU Triton gave it) and warms them up there at every batch
size up to that batch, so no request pays for kernel compilation, plan loading or graph capture.
Triton's dynamic batcher hands ``execute`` the requests of a ragged batch one by one; their frames go,
per set of thresholds (the optional per-request inputs ``score_threshold``, ``nms_iou``, ``max_boxes``;
absent: the model's), to an idle pipeline (``PipelineSet``): ``execute`` returns once they are staged,
and each request is answered through its response sender when the GPU is done, so the next batch's
host work overlaps this one's GPU work. A send is a round trip to the server, so a batch's requests
are answered side by side on a few threads, not one after the other (the k-th would wait k round
trips). The frame at fault alone fails when a batch cannot run.
Tensors cross by DLPack in both directions: under NumPy 2 the backend's NumPy path silently corrupts data.
A request that cannot be a frame gets its own error response; the others in the batch still get their
detections. A request whose client gave up on it while it waited (cancelled, or past its gRPC deadline) is
answered CANCELLED without being detected, and counted in the ``pointpillars_requests_cancelled`` metric; a
request answered with an error, or whose answer the backend refused, in ``pointpillars_requests_failed`` (Triton
counts both as successes).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

# The backend stub's interpreter does not see PYTHONPATH: the environment of the process that wrote
# the repository (this package, CuPy, the cuDNN frontend) is recorded beside this file.
_PATHS = Path(__file__).with_name("python_path.txt")
if _PATHS.is_file():
    sys.path.extend(p for p in _PATHS.read_text(encoding="utf-8").splitlines() if p and p not in sys.path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from pointpillars_trt.config import Thresholds  # noqa: E402
from pointpillars_trt.apps.serve.pipelines import PipelineSet  # noqa: E402
from pointpillars_trt.apps.serve.reply import LATER_STATS, STATS  # noqa: E402
from pointpillars_trt.detector import PointPillars  # noqa: E402
from pointpillars_trt.runtime_options import RuntimeOptions  # noqa: E402
from pointpillars_trt.detections import Detections  # noqa: E402
from pointpillars_trt.errors import InputError, PointPillarsError, counted  # noqa: E402
from pointpillars_trt.graph_io import MAX_BATCH  # noqa: E402

THRESHOLD_INPUTS = {"score_threshold": float, "nms_iou": float, "max_boxes": int}  # optional, one value each
#: Threads an instance answers requests on (each builds a response and sends it; a send gives up the
#: interpreter lock while it waits for the server).
SEND_THREADS = 8
#: Seconds an ``execute`` call must have taken for the next batch's requests to be asked whether their clients
#: gave up on them (a round trip to the server each): a batch Triton formed while the instance was busy waited
#: about as long as that call, and clients give up after timeouts of their own, far longer than a GPU batch's
#: few milliseconds (a CPU batch takes seconds).
CANCEL_CHECK_WAIT = 0.05
#: The Prometheus counter (on Triton's metrics endpoint) of the requests answered CANCELLED without detection.
CANCELLED_METRIC = "pointpillars_requests_cancelled"
#: The Prometheus counter of the requests answered with an error by the model (a frame or a threshold it refuses,
#: a batch that failed) or whose answer the backend refused: Triton's own ``nv_inference_request_failure`` counts
#: them as successes.
FAILED_METRIC = "pointpillars_requests_failed"


class TritonPythonModel:
    """The Python backend's entry point (the name is Triton's contract)."""

    def initialize(self, args: dict[str, str]) -> None:
        sys.unraisablehook = _quiet_dlpack_rename
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        model_dir = Path(args["model_repository"]) / args["model_version"] / params["model_dir"]
        device = params["device"]
        if args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
        self.max_points = int(params["max_points"])
        runtime = RuntimeOptions.from_dict(json.loads(params["runtime_options"]))
        pipelines = max(1, int(params.get("pipelines", "1")))
        self.batch = min(max(1, int(config.get("max_batch_size", 1))), MAX_BATCH)
        options = replace(runtime, device=device, max_batch=self.batch)

        def open_warm() -> PointPillars:
            detector = PointPillars.from_model_dir(model_dir, options=options)
            try:
                detector.warm_up()
            except BaseException:
                detector.close()
                raise
            return detector

        self.pipelines = PipelineSet(open_warm, pipelines)
        self.cfg = self.pipelines.detectors[0].cfg
        # (sender, detections or error) to answer; None stops a send thread. All started here: a thread
        # that cannot start fails the instance's load, never a request's answer
        self._replies: queue.SimpleQueue[tuple[Any, Detections | BaseException] | None] = queue.SimpleQueue()
        self._send_threads = [threading.Thread(target=self._send_loop, name=f"pp-send-{i}", daemon=True)
                              for i in range(SEND_THREADS)]
        for thread in self._send_threads:
            thread.start()
        self.columns = self.cfg.num_point_columns
        labels = {"model": args["model_name"], "version": args["model_version"]}
        counters = _counters({
            CANCELLED_METRIC: "requests answered CANCELLED without being detected: their client gave up on them "
                              "while they waited",
            FAILED_METRIC: "requests the model answered with an error (a frame or a threshold it refused, a batch "
                           "that failed) or whose answer the backend refused"}, labels)
        self._cancelled_count, self._failed_count = counters[CANCELLED_METRIC], counters[FAILED_METRIC]
        self._can_tell_cancelled = True  # until the stub fails to say (an older backend)
        self._last_execute = 0.0  # seconds the last ``execute`` took

    def execute(self, requests: list[Any]) -> None:
        """Stage the batch's frames and return; each request is answered through its response sender."""
        started, waited = time.perf_counter(), self._last_execute >= CANCEL_CHECK_WAIT  # else no round trips
        try:
            self._stage(requests, waited)
        finally:
            self._last_execute = time.perf_counter() - started
        return None

    def _stage(self, requests: list[Any], waited: bool) -> None:
        """``execute``'s work; ``waited``: the requests may have waited long enough for clients to give up."""
        groups: dict[Thresholds, tuple[list[Any], list[np.ndarray]]] = {}  # requests by their thresholds
        given_up: list[Any] = []
        for request in requests:
            sender = request.get_response_sender()
            if waited and self._cancelled(request):
                given_up.append(sender)
                continue
            try:
                frame, thresholds = self._frame(request), self._thresholds(request)
            except PointPillarsError as exc:
                _reply(sender, exc, self._count_failed)
                continue
            senders, frames = groups.setdefault(thresholds, ([], []))
            senders.append(sender)
            frames.append(frame)
        self._answer_cancelled(given_up)
        for thresholds, (senders, frames) in groups.items():
            for start in range(0, len(frames), self.batch):
                chunk = senders[start : start + self.batch]
                try:
                    self.pipelines.start(frames[start : start + self.batch], thresholds, partial(self._answer, chunk))
                except Exception as exc:  # noqa: BLE001 - whatever stopped the batch, its requests hear it
                    self._answer(chunk, [exc] * len(chunk))

    def _answer_cancelled(self, senders: list[Any]) -> None:
        """Requests whose client gave up on them (cancelled them, or their gRPC deadline passed) while they
        waited for this busy instance are answered CANCELLED, not detected, and counted: Triton drops such
        requests from its queue, but not from the batches it has already formed for the instance.
        ``execute`` asks each request only after a call that took ``CANCEL_CHECK_WAIT`` or longer: the question
        is a round trip to the server (14 us on an idle 2-core machine, 60-100 us with its cores saturated),
        as much as a twentieth of a GPU frame's serving time, for requests that on a GPU waited a batch's few
        milliseconds."""
        if senders:
            self._answer(senders, [Cancelled()] * len(senders))
            if self._cancelled_count is not None:
                self._cancelled_count.add(len(senders))

    def _cancelled(self, request: Any) -> bool:
        """Whether Triton has marked the request cancelled; where the stub cannot say, said once, every
        request is detected."""
        if not self._can_tell_cancelled:
            return False
        try:
            return bool(request.is_cancelled())
        except Exception as exc:  # noqa: BLE001 - the stub's own error types; before Triton 23.10, no is_cancelled
            self._can_tell_cancelled = False
            print(f"warning: pointpillars: cannot tell whether a request was cancelled ({type(exc).__name__}: {exc});"
                  " requests their clients gave up on are detected all the same", file=sys.stderr, flush=True)
            return False

    def finalize(self) -> None:
        try:
            self.pipelines.close()  # the batches in flight hand their answers to the send threads,
        finally:
            for _ in self._send_threads:  # which send them all before the instance goes
                self._replies.put(None)
            for thread in self._send_threads:
                thread.join()

    def _answer(self, senders: list[Any], found: list[Detections | BaseException]) -> None:
        """Each request of a finished batch gets its detections or its frame's error, from a send
        thread: every request gets its one final response (a request left without one would keep its
        client waiting for ever)."""
        for sender, result in zip(senders, found):
            self._replies.put((sender, result))

    def _send_loop(self) -> None:
        while (reply := self._replies.get()) is not None:
            _reply(*reply, self._count_failed)

    def _count_failed(self) -> None:
        """One more request answered with an error, counted before it is sent (a client that reads the metric
        after its error finds it counted)."""
        if self._failed_count is not None:
            self._failed_count.add(1)

    def _frame(self, request: Any) -> np.ndarray:
        """The request's (N, C) float32 points (C: the model's point columns), checked here too (the
        server checks dtype and rank)."""
        tensor = pb_utils.get_input_tensor_by_name(request, "points")
        if tensor is None:
            raise InputError("request has no input 'points'")
        points = np.from_dlpack(tensor)
        sent = _sent_shape(points.shape)
        if points.dtype != np.float32 or sent[0] != 1 or sent[2] != self.columns:
            raise InputError(f"points: expected one frame of shape [1, N, {self.columns}] float32 per request, "
                             f"got {sent} {points.dtype}")
        if sent[1] > self.max_points:
            raise InputError(f"points: {sent[1]} points, more than this server's cap of {self.max_points}")
        return points[0, 0]

    def _thresholds(self, request: Any) -> Thresholds:
        """The request's optional thresholds, checked against the detector (whose max_boxes is the cap)."""
        values: dict[str, float | int] = {}
        for name, kind in THRESHOLD_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                continue
            array = np.from_dlpack(tensor)
            if array.size != 1:
                raise InputError(f"{name}: expected one value per request, got shape {list(array.shape)}")
            values[name] = kind(array.reshape(-1)[0])
        cap, asked = self.cfg.postprocess.max_boxes, values.get("max_boxes")
        if asked is not None and asked > cap:  # the client's to lower: said before any limit of every detector's
            raise InputError(f"max_boxes {asked}: this server returns at most {counted(cap, 'box', 'boxes')} a frame "
                             f"(its detector's cap, set when it was served); ask for at most {cap}")
        thresholds = Thresholds(**values)  # type: ignore[arg-type]
        if values:
            thresholds.applied_to(self.cfg)  # a bad value fails this request alone
        return thresholds


def _sent_shape(shape: tuple[int, ...]) -> list[int]:
    """The shape [B, N, C] a client sent as ``points``, from the one ``execute`` sees: the config's reshape to
    [1, -1, C] makes a request of B frames [B, 1, N, C], and one of batch size 0, which Triton hands over without
    its batch dimension, [1, N, C]."""
    return [shape[0], *shape[2:]] if len(shape) == 4 else [0, *shape[1:]]


class _Counter:
    """A counter of this model on Triton's metrics endpoint (its family is kept: on the server, a metric
    lives only as long as its family)."""

    def __init__(self, name: str, description: str, labels: dict[str, str]) -> None:
        self.name = name
        self.family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels=labels)

    def add(self, count: int) -> None:
        """Never raises: a count that cannot be sent must not fail the batch that is being staged."""
        try:
            self.metric.increment(count)
        except Exception as exc:  # noqa: BLE001 - the stub raises its own error types
            print(f"warning: pointpillars: {self.name} missed {count} ({exc})", file=sys.stderr, flush=True)


def _counters(described: dict[str, str], labels: dict[str, str]) -> dict[str, _Counter | None]:
    """Counts of requests that Triton's own statistics count as successes (the model answers them through
    response senders), by name (``described``: each name's description); None for those the backend cannot
    make, said in one warning naming them all (a backend without metric support refuses every one)."""
    made: dict[str, _Counter | None] = {}
    first: Exception | None = None
    for name, description in described.items():
        try:
            made[name] = _Counter(name, description, labels)
        except Exception as exc:  # noqa: BLE001 - the stub raises its own error types
            made[name], first = None, first or exc
    if first is not None:
        missed = ", ".join(name for name, counter in made.items() if counter is None)
        print(f"warning: pointpillars: no metric {missed} ({first}); Triton's own statistics count those requests "
              "as successes", file=sys.stderr, flush=True)
    return made


class Cancelled(Exception):
    """A request whose client gave up on it (cancelled it, or its deadline passed) before it was detected."""

    def __init__(self) -> None:
        super().__init__("request cancelled (its client gave up on it, or its deadline passed) before its frame "
                         "was detected")


def _reply(sender: Any, result: Detections | BaseException, count_failed: Callable[[], None]) -> None:
    """The request's detections, or its frame's error, as its one final response (never raises: a send
    thread goes on with the next request). ``count_failed`` is called once for a request that is not answered
    with its detections or CANCELLED: before its error is sent (a client that reads the metric after its error
    finds it counted), or once its detections could not be sent. A failed send is final: the stub closes a
    response sender before it sends, and refuses any send after that, so no error can take the place of the
    detections (their client gets Triton's own error, or none)."""
    counted = isinstance(result, Cancelled)  # where it was found, in the cancelled metric
    try:
        try:
            response = _error(result) if isinstance(result, BaseException) else _response(result)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be built is that request's error
            result, response = exc, _error(exc)
        if isinstance(result, BaseException) and not counted:
            count_failed()
            counted = True
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    except Exception as exc:  # noqa: BLE001 - the stub's own error types; nobody reads a send thread's exceptions
        if not counted:
            count_failed()
        print(f"warning: pointpillars: a request could not be answered ({type(exc).__name__}: {exc})",
              file=sys.stderr, flush=True)


def _response(found: Detections) -> Any:
    stats = found.stats
    arrays = {
        "boxes": found.boxes.reshape(1, -1, 7),  # an empty result is (1, 0, 7): the client sees (0, 7)
        "scores": found.scores.reshape(1, -1),
        "labels": found.labels.reshape(1, -1),
        **{name: [[getattr(stats, name)]] for name in (*STATS, *LATER_STATS)},  # FrameStats' fields
    }
    if found.velocity is not None:  # a model that predicts velocities (its config declares the output)
        arrays["velocity"] = found.velocity.reshape(1, -1, 2)
    dtypes = {"boxes": np.float32, "scores": np.float32, "velocity": np.float32}
    tensors = [pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(array, dtypes.get(name, np.int32)))
               for name, array in arrays.items()]
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _error(exc: BaseException) -> Any:
    code = pb_utils.TritonError.CANCELLED if isinstance(exc, Cancelled) else pb_utils.TritonError.INVALID_ARG
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc), code))


def _quiet_dlpack_rename(unraisable: Any) -> None:
    """The stub renames a consumed DLPack capsule 'used_dlpack' (not the standard 'used_dltensor'), so
    NumPy's capsule destructor reports a harmless ValueError for every output tensor; drop just that."""
    if isinstance(unraisable.exc_value, ValueError) and "PyCapsule_GetPointer" in str(unraisable.exc_value):
        return
    sys.__unraisablehook__(unraisable)
