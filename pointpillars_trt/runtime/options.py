"""Typed options of each engine backend: what a caller asks of an engine, checked where it is opened.

One frozen dataclass per backend (no grab-bag of keyword arguments that one backend silently
ignores): an option a backend does not have cannot be passed to it, and every option that changes a
built artefact (a TensorRT plan, a cuDNN plan cache entry) is part of the key or the metadata check,
but ``CudnnOptions.autotune`` (see there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from ..config import int_within
from ..errors import BackendError
from ..graph_io import MAX_BATCH


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime: ``threads`` sizes the CPU thread pool (None: ORT's default, one per core);
    ``tf32`` allows TensorFloat-32 convolutions on the CUDA provider (False: IEEE fp32); ``graph_sha256``
    (the model dir's record) is checked against the very bytes the session is made from (by the engine, or by the
    model dir's check that hands it them: ``open_engine``'s ``checked``), so a graph replaced after the model dir
    was opened (a build into the same folder) is refused, not run."""

    device_id: int = 0
    threads: int | None = None
    tf32: bool = False
    graph_sha256: str | None = None

    def __post_init__(self) -> None:
        _set_device_id(self, "OrtOptions")
        if self.threads is not None:
            threads = int_within(self.threads, 1)
            if threads is None:
                raise BackendError(f"OrtOptions.threads: expected a positive int or None, received {self.threads!r}")
            object.__setattr__(self, "threads", threads)


@dataclass(frozen=True)
class TrtOptions:
    """TensorRT: what the plan must have been built for. ``precision`` and ``tf32`` (fp32 plans only) are
    compared with the plan's metadata (None: not checked); ``config_digest`` with the model config it was exported from;
    ``onnx_sha256`` with the graph it was built from (the model dir's, so that a plan of other weights is
    refused)."""

    device_id: int = 0
    config_digest: str | None = None
    precision: str | None = None
    tf32: bool | None = None
    onnx_sha256: str | None = None

    def __post_init__(self) -> None:
        _set_device_id(self, "TrtOptions")


CudnnPrecision = Literal["fp16", "tf32", "fp32"]
CUDNN_PRECISIONS: tuple[str, ...] = get_args(CudnnPrecision)


@dataclass(frozen=True)
class CudnnOptions:
    """cuDNN frontend engine options.

    ``precision``: "fp16" (float16 tensors, float32 accumulation), "tf32" (float32 tensors,
    TensorFloat-32 convs) or "fp32" (IEEE float32: engines using tensor cores are deselected).
    ``config_digest``: when given, must equal the digest of the model config (a stale model dir
    is refused). ``plan_cache_dir``: None for ``cudnn/`` in the user cache (``file_writes.user_cache_dir``).
    ``autotune``: time the first heuristic candidates of each conv once and cache the fastest (False:
    the heuristic's first buildable plan, which is cached too and not part of the cache key: give such
    runs a ``plan_cache_dir`` of their own, as the tests do). ``max_batch``: the largest batch ``bind``
    accepts. ``graph_sha256`` (the model dir's record) is checked against the graph bytes the engine reads its weights
    from, as ``OrtOptions.graph_sha256`` is (not part of the plan cache key: the weights are not in the plans).
    """

    device_id: int = 0
    precision: str = "fp16"
    config_digest: str | None = None
    plan_cache_dir: Path | None = None
    autotune: bool = True
    max_batch: int = MAX_BATCH
    graph_sha256: str | None = None

    def __post_init__(self) -> None:
        _set_device_id(self, "CudnnOptions")
        if self.precision not in CUDNN_PRECISIONS:
            raise BackendError(f"CudnnOptions.precision: received {self.precision!r}. Note: Expected one of {CUDNN_PRECISIONS}")
        if self.config_digest is not None and (not isinstance(self.config_digest, str) or not self.config_digest):
            raise BackendError(
                f"CudnnOptions.config_digest: expected a non-empty str or None, received {self.config_digest!r}"
            )
        if self.plan_cache_dir is not None:
            if not isinstance(self.plan_cache_dir, (str, Path)):
                raise BackendError(
                    f"CudnnOptions.plan_cache_dir: expected a path or None, received {type(self.plan_cache_dir).__name__}"
                )
            object.__setattr__(self, "plan_cache_dir", Path(self.plan_cache_dir))
        if not isinstance(self.autotune, bool):
            raise BackendError(f"CudnnOptions.autotune: expected a bool, received {self.autotune!r}")
        max_batch = int_within(self.max_batch, 1)
        if max_batch is None:
            raise BackendError(f"CudnnOptions.max_batch: expected an int >= 1, received {self.max_batch!r}")
        object.__setattr__(self, "max_batch", max_batch)

    @property
    def dtype(self) -> np.dtype:
        """dtype of the canvas and of the backbone activations."""
        return np.dtype(np.float16 if self.precision == "fp16" else np.float32)


def _set_device_id(options: OrtOptions | TrtOptions | CudnnOptions, owner: str) -> None:
    """``options.device_id`` checked and held as a plain int (a NumPy integer's value)."""
    device_id = int_within(options.device_id, 0)
    if device_id is None:
        raise BackendError(f"{owner}.device_id: expected a CUDA device index >= 0, received {options.device_id!r}")
    object.__setattr__(options, "device_id", device_id)
