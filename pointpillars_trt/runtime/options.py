"""Typed options of each engine backend: what a caller asks of an engine, checked where it is opened.

One frozen dataclass per backend (no grab-bag of keyword arguments that one backend silently
ignores): an option a backend does not have cannot be passed to it, and every option that changes a
built artefact (a TensorRT plan, a cuDNN plan cache entry) is part of the key or the metadata check.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BackendError


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime: ``cuda_graph`` lets ORT capture its own CUDA graph on the first run (bindings are
    then frozen); ``threads`` sizes the CPU thread pool (None: ORT's default, one per core);
    ``tf32`` allows TensorFloat-32 convolutions on the CUDA provider (False: IEEE fp32)."""

    device_id: int = 0
    cuda_graph: bool = False
    threads: int | None = None
    tf32: bool = False

    def __post_init__(self) -> None:
        _check_device_id(self.device_id)
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise BackendError(f"OrtOptions.threads: expected a positive int or None, received {self.threads!r}")


@dataclass(frozen=True)
class TrtOptions:
    """TensorRT: what the plan must have been built for. ``precision`` and ``tf32`` are compared with the
    plan's metadata (None: not checked); ``config_digest`` with the model config it was exported from."""

    device_id: int = 0
    config_digest: str | None = None
    precision: str | None = None
    tf32: bool | None = None

    def __post_init__(self) -> None:
        _check_device_id(self.device_id)


def _check_device_id(device_id: object) -> None:
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise BackendError(f"device_id: expected a CUDA device index >= 0, received {device_id!r}")
