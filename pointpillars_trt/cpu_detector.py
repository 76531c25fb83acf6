"""The CPU detector: NumPy reference stages around ONNX Runtime CPU sessions.

It is the product's fallback on machines without CUDA and the oracle the GPU pipeline is tested
against, so it runs the GPU pipeline's stages in the same order with the same weights: here the PFN
and the RPN are ``pfn.onnx`` and ``rpn.onnx`` in ONNX Runtime, where the GPU path runs the fused
``pfn.cu`` kernel (its weights read from ``pfn.onnx``) and an RPN engine (TensorRT, ONNX Runtime or cuDNN).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from .config import ModelConfig
from .errors import BackendError
from .detections import Detections, FrameStats
from .model_dir import ModelDir
from .graph_io import PFN_INPUT, PFN_OUTPUT, RPN_INPUT, RPN_OUTPUT, canvas_dtype
from .reference import overflowed_features, postprocess, scatter, split_heads, voxelize
from .reference.multihead import multihead_postprocess
from .runtime import OrtOptions, open_engine


class CpuDetector:
    """Runs one frame at a time on the host; ``last_timings`` holds wall milliseconds per stage (the last frame's). Of
    frames of no pillar in range, only the first runs the RPN (``_heads_of_nothing``)."""

    def __init__(self, model: ModelDir, *, threads: int | None = None, post_config: ModelConfig | None = None) -> None:
        self.cfg: ModelConfig = model.cfg
        self.post_cfg = post_config or model.cfg  # the model's, or a copy with other runtime thresholds
        files = model.take_checked_files()  # read and hashed as the model dir opened: not again
        self._pfn = open_engine(model.pfn_path, OrtOptions(threads=threads, graph_sha256=model.graph_sha256("pfn")),
                                device="cpu", checked=files.get(model.pfn_path.name))
        self._rpn = open_engine(model.rpn_path, OrtOptions(threads=threads, graph_sha256=model.graph_sha256("rpn")),
                                device="cpu", checked=files.get(model.rpn_path.name))
        self._canvas_dtype = np.dtype(canvas_dtype(model.precision))
        self._empty_heads: np.ndarray | None = None  # the RPN's output for a frame of no pillar: _heads_of_nothing
        self.last_timings: dict[str, float] = {}
        self._lock = threading.Lock()  # one batch at a time, as the GPU pipeline: threads share a detector
        self._closed = False

    def detect(self, points: np.ndarray, post_config: ModelConfig | None = None) -> Detections:
        """One frame; ``post_config``: this call's thresholds (default: ``post_cfg``)."""
        return self.detect_batch([points], post_config)[0]

    def _detect(self, points: np.ndarray, post_config: ModelConfig | None) -> Detections:
        cfg, clock = self.cfg, _StageClock()
        pillars = voxelize(points, cfg)
        clock.lap("voxelize")
        overflowed = 0
        if pillars.features.shape[0]:
            feats = self._pfn.run_host({PFN_INPUT: pillars.features})[PFN_OUTPUT]
            overflowed = overflowed_features(feats)
            clock.lap("pfn")
            canvas = scatter(feats, pillars.coords, cfg)[0].transpose(1, 2, 0)[None].astype(self._canvas_dtype)  # NHWC
            clock.lap("scatter")
            heads = self._rpn.run_host({RPN_INPUT: canvas})[RPN_OUTPUT]
        else:  # no pillar in range: no feature to compute or place
            clock.lap("pfn")
            clock.lap("scatter")
            heads = self._heads_of_nothing()
        clock.lap("rpn")
        if cfg.heads is None:
            raw = postprocess(*split_heads(heads[0], cfg), post_config or self.post_cfg)
        else:
            raw = multihead_postprocess(heads[0], post_config or self.post_cfg)
        clock.lap("postprocess")
        self.last_timings = clock.timings()
        stats = FrameStats(
            num_points=int(points.shape[0]),
            num_nonfinite=pillars.num_nonfinite,
            num_pillars=int(pillars.features.shape[0]),
            num_pillars_dropped=pillars.num_pillars_dropped,
            num_overflowed_scores=raw.overflowed_scores,
            num_overflowed_features=overflowed,
        )
        return Detections(raw.boxes, raw.scores, raw.labels, cfg.classes, stats, raw.velocity)

    def _heads_of_nothing(self) -> np.ndarray:
        """The RPN's output for a frame of no pillar in range, whose canvas is all zeros (as the padded GPU run also
        gives): the model's alone. The RPN runs on it once, on the first such frame (about a second for a KITTI model),
        under the batch's lock; later ones reuse it (read-only), and only the post-process, which takes each call's
        thresholds, runs again."""
        if self._empty_heads is None:
            nx, ny, _ = self.cfg.voxel.grid
            canvas = np.zeros((1, ny, nx, self.cfg.network.pfn_channels), self._canvas_dtype)  # NHWC
            heads = self._rpn.run_host({RPN_INPUT: canvas})[RPN_OUTPUT]
            heads.setflags(write=False)
            self._empty_heads = heads
        return self._empty_heads

    def detect_batch(self, frames: Sequence[np.ndarray], post_config: ModelConfig | None = None) -> list[Detections]:
        """Frame by frame (the CPU has no batch dimension worth exploiting), all under the detector's lock as on the
        GPU: another thread's batch runs before or after this one, never between its frames, and ``last_timings``
        are its last frame's until the next batch. Non-finite boxes of far-off logits are dropped and counted
        downstream, without NumPy's overflow warnings."""
        with self._lock, np.errstate(over="ignore", invalid="ignore"):
            if self._closed:  # by another thread, after the caller's own check
                raise BackendError("this detector was closed before the batch ran")
            return [self._detect(points, post_config) for points in frames]

    def close(self) -> None:
        with self._lock:  # after the batch in progress: a session closed mid-run aborts the process
            self._closed = True
            self._pfn.close()
            self._rpn.close()


class _StageClock:
    """Wall-clock laps in milliseconds (host code runs synchronously, so wall time is stage time)."""

    def __init__(self) -> None:
        self._start = self._last = time.perf_counter()
        self._laps: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self._laps[stage] = (now - self._last) * 1e3
        self._last = now

    def timings(self) -> dict[str, float]:
        return {**self._laps, "total": (self._last - self._start) * 1e3}
