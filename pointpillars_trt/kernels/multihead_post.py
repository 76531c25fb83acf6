"""Multi-head post-process stage: OpenPCDet's ``AnchorHeadMulti`` decoding and per-class NMS on the GPU
(``cuda/multihead_post.cu``), the device twin of ``reference.multihead.multihead_postprocess``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..anchors import NMS_CORNER_MARGIN, OVERFLOWED_LOGIT, head_rows, multihead_anchors
from ..config import BOX_SIZE, ModelConfig
from ..errors import ConfigError
from ..kernel_limits import SORT_LIMIT
from .postprocess import POST_HEADER, POST_STATS, THRESHOLD_SLOTS, PostprocessStage, Unpacked, threshold_values
from .rotated_nms import MASK_THREADS, mask_grid, mask_words, nms_defines, nms_sort_cap, rect_shape
from ._launch import (batch_grid, check_device_array, check_frame_counts, check_frames, checked, compile_kernels,
                      cupy_module, define_flags, f32_define, grid_blocks, launch_kernel, shared_blocks, slot_defines)

#: Columns of the segment table (int32, one row per class): where its head's values sit in the merged
#: map, its head's anchors per cell and classes, its place in the head, the head's first anchor row.
SEGMENT_COLUMNS = ("cls_at", "box_at", "anchors", "classes", "class", "first_anchor")
_SCORE_BLOCK = 256


@dataclass(frozen=True)
class MultiHeadPostParams:
    """Everything multihead_post.cu is compiled with (the thresholds are run-time kernel inputs)."""

    head_map: tuple[int, int]  # (W, H)
    head_channels: int
    segments: tuple[tuple[int, ...], ...]  # SEGMENT_COLUMNS per class, in class order
    code_size: int
    sincos: bool
    velocity: bool
    score_inclusive: bool
    top_k: int
    max_boxes: int
    nms_margin: float

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> MultiHeadPostParams:
        pp = cfg.postprocess
        nx, ny = cfg.head_map
        segments, first = [], 0
        for cls_at, box_at, a, n in head_rows(cfg):
            segments += [(cls_at, box_at, a, n, k, first) for k in range(n)]
            first += a * nx * ny
        params = cls(cfg.head_map, sum(cfg.head_channels.values()), tuple(segments), cfg.box_code_size,
                     cfg.box_code.angle == "sincos", cfg.box_code.velocity, pp.score_inclusive, pp.pre_nms_top_k,
                     pp.max_boxes, float(np.float32(NMS_CORNER_MARGIN[cfg.box_coder])))
        if not 1 <= params.top_k <= SORT_LIMIT:
            raise ConfigError(f"{cfg.name}: postprocess.pre_nms_top_k is {params.top_k}; supported: 1..{SORT_LIMIT} "
                              "(GPU post-processing)")
        return params

    @property
    def sort_cap(self) -> int:
        return nms_sort_cap(self.top_k)

    @property
    def max_rows(self) -> int:
        """Rows (anchors) of the largest head."""
        return max(seg[2] for seg in self.segments) * self.head_map[0] * self.head_map[1]

    @property
    def row_floats(self) -> int:
        """x, y, z, dx, dy, dz, heading, score, label, then vx, vy for a model that predicts velocity."""
        return BOX_SIZE + 2 + 2 * self.velocity

    @property
    def max_rows_out(self) -> int:
        """Result rows: the header, then at most max_boxes per class."""
        return 1 + self.max_boxes * len(self.segments)

    def defines(self) -> tuple[str, ...]:
        return define_flags(
            HEAD_W=self.head_map[0], HEAD_H=self.head_map[1], HEAD_CHANNELS=self.head_channels,
            NUM_SEGMENTS=len(self.segments), MAX_ROWS=self.max_rows, CODE_SIZE=self.code_size,
            SINCOS=int(self.sincos), VELOCITY=int(self.velocity), SCORE_INCLUSIVE=int(self.score_inclusive),
            TOP_K=self.top_k, SORT_CAP=self.sort_cap, MAX_BOXES=self.max_boxes,
            NMS_MARGIN=f32_define(self.nms_margin), STYLE_OPENPCDET=1, **nms_defines(),
            OVERFLOWED_LOGIT=f32_define(OVERFLOWED_LOGIT),
            ROW_FLOATS=self.row_floats, SCORE_BLOCK=_SCORE_BLOCK, HEADER_EXTRA=len(POST_HEADER),
            SEG_INTS=len(SEGMENT_COLUMNS), **slot_defines("SEG", SEGMENT_COLUMNS), **slot_defines("STAT", POST_STATS),
            STAT_COUNT=len(POST_STATS), **slot_defines("HEADER", POST_HEADER),
            **slot_defines("THRESHOLD", THRESHOLD_SLOTS),
        )


class MultiHeadPostprocessStage:
    """Each frame's merged NHWC head map (hy, hx, channels) -> detections with velocities in one small
    device buffer ``result`` (frames, ``max_rows_out``, ``row_floats``): a frame's row 0 the counts of
    the header (as for :class:`~pointpillars_trt.kernels.postprocess.PostprocessStage`), rows 1..count
    the boxes in OpenPCDet's order; a batch of up to ``frames`` frames in one set of launches.
    ``thresholds``: the run-time score threshold, NMS IoU and max boxes (a class)."""

    KERNELS = ("mh_score", "mh_select", "mh_nms_mask", "mh_reduce")

    def __init__(self, cfg: ModelConfig, result: Any = None, thresholds: Any = None, frames: int = 1) -> None:
        cp = cupy_module()
        self.params = p = MultiHeadPostParams.from_config(cfg)
        self._k = compile_kernels("multihead_post.cu", p.defines(), self.KERNELS)
        self._mask_grid = mask_grid(len(p.segments), p.sort_cap)  # device attributes: read once, not per launch
        w, h = p.head_map
        self._heads_shape = (h, w, p.head_channels)
        s, slots, n = len(p.segments), len(p.segments) * p.sort_cap, frames
        if result is not None:
            check_device_array(result, "result", np.float32, (frames, p.max_rows_out, p.row_floats))
        if thresholds is not None:
            check_device_array(thresholds, "thresholds", np.float32, (len(THRESHOLD_SLOTS),))
        with checked("multi-head postprocess: allocating buffers"):
            self.result = result if result is not None else cp.zeros((n, p.max_rows_out, p.row_floats), np.float32)
            self.thresholds = thresholds if thresholds is not None else cp.asarray(threshold_values(cfg))
            self.stats = cp.zeros((n, s, len(POST_STATS)), np.int32)  # mh_reduce zeroes the counts it sums again
            self._segments = cp.asarray(np.asarray(p.segments, np.int32))
            self._anchors = cp.asarray(multihead_anchors(cfg).astype(np.float32))
            self._key = cp.zeros((n, s * p.max_rows), np.uint32)
            self._candidates = cp.zeros((n, slots), np.uint64)
            self._group_count = cp.zeros((n, s), np.int32)
            self._group_box = cp.zeros((n, slots, BOX_SIZE), np.float32)
            self._group_velocity = cp.zeros((n, slots, 2), np.float32)
            self._group_rect = cp.zeros((n, *rect_shape(slots)), np.float32)
            self._group_score = cp.zeros((n, slots), np.float32)
            self._mask = cp.zeros((n, mask_words(slots, p.sort_cap)), np.uint64)
            self._kept = cp.zeros((n, slots), np.int32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, heads: Any, voxel_stats: Any, stream: Any, frames: int = 1) -> None:
        """Enqueue the first ``frames`` frames: their merged NHWC float32 head maps (frames, hy, hx,
        channels) -> ``result``; ``voxel_stats`` (the voxelizer's (frames, k) counts) go into each
        frame's header after this stage's own."""
        check_device_array(heads, "head map", np.float32, (None, *self._heads_shape))
        check_frames(heads, "head map", frames)
        check_frame_counts(voxel_stats, "voxel_stats", frames)
        check_frames(self.result, "multi-head postprocess", frames)
        p, k = self.params, self._k
        s = len(p.segments)
        num_extra = np.int32(min(voxel_stats.shape[1], p.row_floats - len(POST_HEADER)))
        launch_kernel(k["mh_score"], batch_grid((grid_blocks(p.max_rows, _SCORE_BLOCK), s), frames), _SCORE_BLOCK,
                      (heads, self._segments, self.thresholds, self._key, self._candidates, self.stats), stream)
        launch_kernel(k["mh_select"], batch_grid(s, frames), 1024,
                      (heads, self._anchors, self._segments, self._key, self._candidates, self.stats, self._group_count,
                       self._group_box, self._group_velocity, self._group_rect, self._group_score), stream)
        mask_blocks, segments = self._mask_grid
        launch_kernel(k["mh_nms_mask"], batch_grid((shared_blocks(mask_blocks, frames), segments), frames),
                      MASK_THREADS, (self._group_count, self._group_rect, self.thresholds, self._mask), stream)
        launch_kernel(k["mh_reduce"], batch_grid(1, frames), 256,
                      (self._group_count, self._mask, self._group_box, self._group_velocity, self._group_score,
                       self.stats, voxel_stats, np.int32(voxel_stats.shape[1]), num_extra, self.thresholds,
                       self._kept, self.result), stream)

    @staticmethod
    def result_shape(cfg: ModelConfig) -> tuple[int, int]:
        """(rows, values a row) of ``result``: the header row, then at most ``max_boxes`` boxes a class."""
        params = MultiHeadPostParams.from_config(cfg)
        return params.max_rows_out, params.row_floats

    @staticmethod
    def unpack(result: np.ndarray) -> Unpacked:
        """A host copy of ``result`` -> boxes (n, 7), scores (n,), labels (n,) int32, the header's
        counts by name and the velocities (n, 2) (None for a model without them); copies, never views."""
        boxes, scores, labels, counts, _ = PostprocessStage.unpack(result)  # the same first nine columns
        out = np.asarray(result, np.float32)
        velocity = out[1 : 1 + counts["count"], BOX_SIZE + 2 : BOX_SIZE + 4].copy() if out.shape[1] > BOX_SIZE + 2 else None
        return boxes, scores, labels, counts, velocity
