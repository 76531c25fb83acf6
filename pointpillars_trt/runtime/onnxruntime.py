"""ONNX Runtime engine: the CPU oracle, and on the GPU a stand-in for TensorRT with the same interface.

CUDA mode runs the session on the pipeline's own stream (``user_compute_stream``) and binds the
pipeline's buffers with IO binding, so no tensor is copied and no memory is allocated per frame.
Two settings keep :meth:`run` free of host synchronisation:

* the run option ``disable_synchronize_execution_providers=1`` (ORT >= 1.14) drops the
  ``cudaStreamSynchronize`` that ``Run()`` otherwise ends with;
* ``user_compute_stream`` (Python API since 1.17) orders ORT's kernels after the pipeline's previous
  stage and before the next one, and lets a CUDA graph captured on that stream include them.

Dynamic first dimension: the CPU path runs the PFN graph on a frame's pillars (any row count); the
GPU pipeline runs the RPN graph only, binding a batch size once for each CUDA graph it captures, so
the run can be captured as part of the batch's graph.

Precision is a property of the ONNX file (an fp16 export has fp16 inside), not of this engine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import BackendError, ModelDirError, one_line, safe_repr
from ..model_dir import CheckedFile, graph_to_open
from .base import Backend, Device, Engine, Shape, TensorSpec
from .options import OrtOptions
from .ort_telemetry import quiet_telemetry

quiet_telemetry()  # before ONNX Runtime's import, which reads it
import onnxruntime as ort  # noqa: E402
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph, InvalidProtobuf, NoSuchFile  # noqa: E402

CUDA_PROVIDER = "CUDAExecutionProvider"
_NO_SYNC_RUN_OPTION = "disable_synchronize_execution_providers"
_ORT_TYPES: dict[str, np.dtype] = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in [
        ("float", np.float32), ("float16", np.float16), ("double", np.float64), ("bool", np.bool_),
        ("int8", np.int8), ("uint8", np.uint8), ("int32", np.int32), ("int64", np.int64),
    ]
}


class OnnxRuntimeEngine(Engine):
    """An ONNX graph in an ONNX Runtime session, on the CPU (``run_host``) or CUDA (``bind``/``run``).

    ``stream_ptr`` (CUDA) is the stream every :meth:`run` must use: ORT binds a session to one
    compute stream at creation. ``tf32`` allows TensorFloat-32 convolutions (faster, ~1e-3 relative
    error; the engine's default is IEEE fp32, the GPU pipeline asks for TF32 as TensorRT does) and the
    NHWC layout tensor cores prefer. ``checked``: the graph file's bytes, which the caller checked against the
    model dir's record (``ModelDir.take_checked_files``): the session is made from them, the file not read again.
    """

    backend: Backend = "onnxruntime"

    def __init__(
        self,
        path: str | Path,
        *,
        device: Device = "cpu",
        stream_ptr: int = 0,
        options: OrtOptions | None = None,
        checked: CheckedFile | None = None,
    ) -> None:
        options = options or OrtOptions()
        super().__init__(path, device)
        if device == "cuda" and not stream_ptr:
            raise BackendError(
                f"{self.file_name}: CUDA mode needs the pipeline's stream (stream_ptr), received {stream_ptr!r}. "
                "Note: ONNX Runtime treats 0 as 'no user stream' and would run on a stream of its own"
            )
        self.options = options
        self.device_id = options.device_id
        self.stream_ptr = int(stream_ptr)
        self.threads = options.threads
        self.tf32 = options.tf32
        self._checked = checked  # taken by the first session made
        self._session: ort.InferenceSession | None = None
        self._binding: ort.IOBinding | None = None
        self._run_options: ort.RunOptions | None = None

    def _load(self) -> list[TensorSpec]:
        if not self.path.is_file():
            raise ModelDirError(f"ONNX graph not found: {safe_repr(self.path)}")
        if self.device == "cuda" and CUDA_PROVIDER not in ort.get_available_providers():
            raise BackendError(
                f"{CUDA_PROVIDER} is not available in onnxruntime {ort.__version__} "
                f"(available: {ort.get_available_providers()}). Note: install onnxruntime-gpu for CUDA"
            )
        if self.device == "cuda":
            _preload_cuda_libraries()
        options = ort.SessionOptions()
        # fatal only: ORT warns about every provider it does not use, and logs each failed allocation in colour
        # across several lines; a failure reaches the caller as its exception, said in one line
        options.log_severity_level = 4
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_profiling = False
        if self.threads is not None:
            options.intra_op_num_threads = self.threads
        model = self._graph_to_open()
        try:
            session = ort.InferenceSession(model, sess_options=options, providers=self._providers())
        except (InvalidProtobuf, InvalidGraph, NoSuchFile) as exc:
            raise ModelDirError(f"Cannot load ONNX graph {safe_repr(self.path)}: {one_line(exc)}. "
                                "Note: re-export it") from exc
        except Exception as exc:  # ORT's pybind errors (Fail, EPFail, ...) share no base but Exception
            raise BackendError(f"ONNX Runtime could not create a session for {safe_repr(self.path)}: "
                               f"{one_line(exc)}") from exc
        if self.device == "cuda":
            if CUDA_PROVIDER not in session.get_providers():
                raise BackendError(f"ONNX Runtime fell back to {session.get_providers()} for {self.file_name}")
            self._binding = session.io_binding()
            self._run_options = ort.RunOptions()
            self._run_options.add_run_config_entry(_NO_SYNC_RUN_OPTION, "1")
        self._session = session
        return [_spec(arg, True) for arg in session.get_inputs()] + [_spec(arg, False) for arg in session.get_outputs()]

    def _graph_to_open(self) -> str | bytes:
        """What the session is made from: the bytes the caller checked (once: a session made again reads the file), else
        the file's, checked against ``graph_sha256`` where given (ORT would read what is there when the session is
        made), else the file's path (``graph_to_open``)."""
        checked, self._checked = self._checked, None
        found = graph_to_open(self.path, checked, self.options.graph_sha256)
        return found if found is not None else str(self.path)

    def _providers(self) -> list[Any]:
        if self.device == "cpu":
            return ["CPUExecutionProvider"]
        cuda_options = {
            "device_id": str(self.device_id),
            "user_compute_stream": str(self.stream_ptr),
            # TF32 convolutions move logits by ~1e-3 and can flip boxes near the score threshold
            "use_tf32": "1" if self.tf32 else "0",
            # Tensor-core convolutions want NHWC: measured on an H200, NHWC takes the RPN from 1.10 to
            # 0.93 ms (TF32) and 0.89 to 0.71 ms (fp16), but IEEE fp32 from 3.22 to 3.51 ms.
            "prefer_nhwc": "1" if self.tf32 else "0",
        }
        return [(CUDA_PROVIDER, cuda_options), "CPUExecutionProvider"]

    def _unload(self) -> None:
        self._session = self._binding = self._run_options = None

    def _bind(self, spec: TensorSpec, ptr: int, shape: Shape) -> None:
        assert self._binding is not None  # set by _load in CUDA mode
        bind = self._binding.bind_input if spec.is_input else self._binding.bind_output
        bind(spec.name, "cuda", self.device_id, spec.dtype.type, list(shape), ptr)

    def _run(self, stream_ptr: int) -> None:
        assert self._session is not None and self._binding is not None
        if stream_ptr != self.stream_ptr:
            raise BackendError(
                f"{self.file_name} | Received stream {stream_ptr:#x}. Note: the session was created on stream "
                f"{self.stream_ptr:#x}; ONNX Runtime cannot switch streams per run"
            )
        try:
            self._session.run_with_iobinding(self._binding, self._run_options)
        except Exception as exc:  # ORT's pybind errors share no base but Exception
            raise _run_failure(exc, self.path.name, self.device) from exc

    def _run_host(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._session is not None
        try:
            results = self._session.run(list(self._outputs), dict(feeds))
        except Exception as exc:  # ORT's pybind errors share no base but Exception
            raise _run_failure(exc, self.path.name, self.device) from exc
        return dict(zip(self._outputs, results))


def _run_failure(exc: Exception, graph: str, device: str) -> BackendError:
    """ORT's failed run in one line: running out of memory said so (its arena's message names a buffer's size),
    anything else with ORT's own text."""
    text = one_line(exc)
    asked = re.search(r"Failed to allocate memory for requested buffer of size (\d+)", text)
    if asked is not None or "bad_alloc" in text:
        size = f" ({int(asked[1]) / 2**20:.0f} MiB asked for one buffer)" if asked is not None else ""
        elsewhere = ", or run on the GPU" if device == "cpu" else ""
        return BackendError(f"ONNX Runtime ran out of memory running {graph}{size}: a model of a finer pillar grid "
                            f"or more pillars needs more; free memory{elsewhere}")
    return BackendError(f"ONNX Runtime run failed for {graph}: {safe_repr(text, 300)}")


def _preload_cuda_libraries() -> None:
    """Load cuDNN / cuBLAS from the nvidia-* wheels (as PyTorch installs them) before the CUDA session.

    onnxruntime-gpu finds them on the library path only; ``preload_dlls`` (ORT >= 1.21) also looks in
    site-packages. Missing libraries are not an error here: session creation reports them precisely.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # noqa: BLE001 - best effort; the session's own error is the informative one
            pass


def _spec(arg: Any, is_input: bool) -> TensorSpec:
    """A TensorSpec from ORT's NodeArg; symbolic or unknown dimensions become -1."""
    if arg.type not in _ORT_TYPES:
        raise BackendError(f"Tensor: {arg.name} | Received unsupported type {arg.type}. Note: Expected one of {sorted(_ORT_TYPES)}")
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSpec(arg.name, shape, _ORT_TYPES[arg.type], is_input)
