"""The engine interface every backend implements: named tensors, the lifecycle and the binding checks.

An engine has named input/output tensors (:class:`TensorSpec`) and the Polygraphy-like lifecycle
``activate()`` (load the session or plan) -> hot path -> ``close()`` (free it), also usable as a
context manager. It never owns buffers:

* GPU engines (``device="cuda"``): the pipeline binds device pointers once with :meth:`Engine.bind`
  (a call with the same address and shape is a no-op) and :meth:`Engine.run` only enqueues the work on
  the pipeline's CUDA stream, without any host synchronisation.
* CPU engines (``device="cpu"``): :meth:`Engine.run_host` maps NumPy feeds to NumPy outputs; the
  CPU detector and the test oracle use it.

``import onnxruntime`` happens only in :mod:`.onnxruntime` (and the availability probe,
:mod:`.availability`), ``import tensorrt`` (or TensorRT for RTX's module) only in the TensorRT modules and
``import cudnn`` only in :mod:`.cudnn`, so each of the three backends (ONNX Runtime, TensorRT, cuDNN) works
without the others installed.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Mapping, TypeVar

import numpy as np

from ..errors import BackendError, escape_text

Backend = str  # a name of the registry (runtime/backends.py BACKENDS)
Device = Literal["cpu", "cuda"]
Shape = tuple[int, ...]

EngineT = TypeVar("EngineT", bound="Engine")


@dataclass(frozen=True)
class TensorSpec:
    """An engine input or output. ``-1`` in ``shape`` marks a dynamic dimension (the pillar count)."""

    name: str
    shape: Shape
    dtype: np.dtype
    is_input: bool

    @property
    def role(self) -> str:
        return "Input" if self.is_input else "Output"

    def check_shape(self, shape: Shape) -> None:
        """Raise unless ``shape`` has this rank and matches every fixed dimension."""
        fits = len(shape) == len(self.shape) and all(
            got >= 0 and want in (-1, got) for got, want in zip(shape, self.shape)
        )
        if not fits:
            raise BackendError(
                f"{self.role} tensor: {self.name} | Received incompatible shape: {shape}. "
                f"Note: Expected a shape compatible with: {self.shape}"
            )

    def check_array(self, array: object) -> None:
        """Raise unless ``array`` is a NumPy array of this dtype and a compatible shape."""
        if not isinstance(array, np.ndarray):
            raise BackendError(
                f"{self.role} tensor: {self.name} | Received unexpected type: {type(array).__name__}. "
                "Note: Expected type: numpy.ndarray"
            )
        if array.dtype != self.dtype:
            raise BackendError(
                f"{self.role} tensor: {self.name} | Received unexpected dtype: {array.dtype}. "
                f"Note: Expected type: {self.dtype}"
            )
        self.check_shape(tuple(array.shape))


class Engine(abc.ABC):
    """Base of the TensorRT, ONNX Runtime and cuDNN engines: validation and the lifecycle live here once.

    Subclasses implement ``_load`` (returning the tensor specs), ``_unload``, and the backend halves
    of the hot path: ``_bind`` + ``_run`` for CUDA engines, ``_run_host`` for CPU engines.
    """

    backend: Backend
    #: An RPN engine whose canvas input is channel-major, (B, C, ny, nx), instead of (B, ny, nx, C).
    channels_first_input = False

    def __init__(self, path: str | Path, device: Device) -> None:
        if device not in ("cpu", "cuda"):
            raise BackendError(f"Unknown device {device!r}. Note: Expected 'cpu' or 'cuda'")
        self.path = Path(path)
        self.file_name = escape_text(self.path.name)  # as messages name the file: one line, whatever its name
        self.device: Device = device
        self._inputs: dict[str, TensorSpec] = {}
        self._outputs: dict[str, TensorSpec] = {}
        self._active = False
        self._bound: dict[str, tuple[int, Shape]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def activate(self: EngineT) -> EngineT:
        """Load the graph or plan (idempotent); returns ``self`` so ``open(...).activate()`` chains."""
        if not self._active:
            specs = self._load()
            self._inputs = {s.name: s for s in specs if s.is_input}
            self._outputs = {s.name: s for s in specs if not s.is_input}
            self._active = True
        return self

    def close(self) -> None:
        """Free the session / engine; bindings are forgotten. Safe to call twice."""
        if self._active:
            self._unload()
            self._active = False
            self._bound.clear()

    def __enter__(self: EngineT) -> EngineT:
        return self.activate()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return f"{type(self).__name__}({str(self.path)!r}, device={self.device!r}, {state})"

    # -- tensors ---------------------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, TensorSpec]:
        self._require_active()
        return dict(self._inputs)

    @property
    def outputs(self) -> dict[str, TensorSpec]:
        self._require_active()
        return dict(self._outputs)

    # -- hot path --------------------------------------------------------------------------------

    def bind(self, name: str, ptr: int, shape: Shape) -> None:
        """Bind tensor ``name`` to device memory at ``ptr`` with ``shape``; unchanged bindings cost nothing."""
        self._require("cuda", "bind")
        shape = tuple(int(d) for d in shape)
        if self._bound.get(name) == (ptr, shape):
            return
        spec = self._inputs.get(name) or self._outputs.get(name)
        if spec is None:
            raise BackendError(
                f"Tensor: {name} | Not an input or output of {self.file_name}. "
                f"Note: Expected one of: {sorted(self._inputs) + sorted(self._outputs)}"
            )
        spec.check_shape(shape)
        if not ptr:
            raise BackendError(f"{spec.role} tensor: {name} | Received a null device pointer")
        try:
            self._bind(spec, int(ptr), shape)
        except BaseException:  # the engine may hold part of it (one tensor's new shape): every tensor is bound anew
            self._bound.clear()
            raise
        self._bound[name] = (int(ptr), shape)

    def run(self, stream_ptr: int) -> None:
        """Enqueue one inference on the CUDA stream ``stream_ptr``; returns without waiting for it."""
        self._require("cuda", "run")
        if len(self._bound) != len(self._inputs) + len(self._outputs):
            unbound = sorted((set(self._inputs) | set(self._outputs)) - set(self._bound))
            raise BackendError(f"{self.file_name}: tensors {unbound} are not bound. Note: call bind() for each")
        self._run(int(stream_ptr))

    def run_host(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on NumPy arrays (CPU engines); checks names, dtypes and shapes first."""
        self._require("cpu", "run_host")
        for name in feeds:
            if name not in self._inputs:
                raise BackendError(
                    f"Input tensor: {name} | Not an input of {self.file_name}. "
                    f"Note: Expected inputs: {sorted(self._inputs)}"
                )
        for name, spec in self._inputs.items():
            if name not in feeds:
                raise BackendError(
                    f"Input tensor: {name} | Missing from the feeds. Note: Expected inputs: {sorted(self._inputs)}"
                )
            spec.check_array(feeds[name])
        return self._run_host(feeds)

    # -- backend hooks ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _load(self) -> list[TensorSpec]:
        """Create the session / deserialize the plan and describe its I/O tensors."""

    @abc.abstractmethod
    def _unload(self) -> None:
        """Drop every backend object."""

    def _bind(self, spec: TensorSpec, ptr: int, shape: Shape) -> None:
        raise BackendError(f"{type(self).__name__} cannot bind device memory")

    def _run(self, stream_ptr: int) -> None:
        raise BackendError(f"{type(self).__name__} cannot run on a CUDA stream")

    def _run_host(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise BackendError(f"{type(self).__name__} cannot run on host arrays")

    # -- helpers ---------------------------------------------------------------------------------

    def _require_active(self) -> None:
        if not self._active:
            raise BackendError(f"{self!r} is not active. Note: call activate() or use it in a `with` block")

    def _require(self, device: Device, method: str) -> None:
        self._require_active()
        if self.device != device:
            hint = "bind() and run()" if self.device == "cuda" else "run_host()"
            raise BackendError(
                f"{method}() needs an engine opened on {device!r}; {self.file_name} is open on "
                f"{self.device!r}. Note: use {hint}"
            )
