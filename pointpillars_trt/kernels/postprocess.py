"""Post-process stage: head maps -> decoded, score-filtered, NMS-selected boxes in one small result
buffer, so one device-to-host copy brings a frame back (``cuda/postprocess.cu``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..anchors import NMS_CORNER_MARGIN, OVERFLOWED_LOGIT, anchors
from ..config import BOX_SIZE, ModelConfig, next_power_of_two
from ..errors import ConfigError
from ..kernel_limits import SORT_LIMIT as _SORT_LIMIT  # keys of one in-block bitonic sort
from .voxelize import VOXEL_STATS
from .rotated_nms import MASK_THREADS, mask_grid, mask_words, nms_defines, nms_sort_cap, rect_shape
from ._launch import (batch_grid, check_device_array, check_frame_counts, check_frames, checked, compile_kernels,
                      cupy_module, define_flags, f32_define, grid_blocks, launch_kernel, shared_blocks, slot_defines)

POST_STATS = ("candidates", "selected", "overflowed_scores")  # a frame's counters (``anchors.OVERFLOWED_LOGIT``)
OUTPUT_ROW = 9  # x, y, z_centre, dx, dy, dz, heading, score, label
# Row 0 of the post-processing result: its own counts, then the first voxelizer counts, as float32
# (exact below 2**24), so that one device-to-host copy brings back everything a frame reports.
POST_HEADER = ("count", "candidates", "selected", "overflowed_scores")
RESULT_HEADER = POST_HEADER + VOXEL_STATS[: OUTPUT_ROW - len(POST_HEADER)]
#: What a post-process stage's ``unpack`` returns: boxes, scores, labels, the header's counts by name,
#: velocities (None for a model without them).
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int], np.ndarray | None]

_SCORE_BLOCK = 256  # threads of the per-anchor kernels
# Slots of the run-time thresholds buffer the kernels read on every launch (float32; max boxes is exact).
THRESHOLD_SLOTS = ("score", "nms_iou", "max_boxes")


@dataclass(frozen=True)
class PostParams:
    """Everything postprocess.cu is compiled with, float values already rounded to float32.

    The run-time thresholds are not here: they are kernel inputs (``threshold_values``), so changing
    them compiles nothing. ``max_boxes`` is the cap the result buffer is sized for."""

    head_map: tuple[int, int]  # (W, H)
    anchors_per_cell: int
    num_classes: int
    dir_bins: int
    box_code_size: int
    openpcdet_style: bool
    per_class: bool
    score_inclusive: bool
    top_k: int
    nms_margin: float
    max_boxes: int
    dir_offset: float
    dir_limit_offset: float
    dir_flip_bin: int
    output_range: tuple[float, ...] | None

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> PostParams:

        pp, d = cfg.postprocess, cfg.require_direction("the GPU post-process")
        f32 = lambda x: float(np.float32(x))  # noqa: E731
        params = cls(
            head_map=cfg.head_map,
            anchors_per_cell=cfg.anchors.per_cell,
            num_classes=cfg.num_classes,
            dir_bins=d.num_bins,
            box_code_size=cfg.box_code_size,
            openpcdet_style=cfg.box_coder == "openpcdet",
            per_class=pp.nms == "per_class",
            score_inclusive=pp.score_inclusive,
            top_k=pp.pre_nms_top_k,
            nms_margin=f32(NMS_CORNER_MARGIN[cfg.box_coder]),
            max_boxes=pp.max_boxes,
            dir_offset=f32(d.offset),
            dir_limit_offset=f32(d.limit_offset),
            dir_flip_bin=d.flip_bin,
            output_range=None if pp.output_range is None else tuple(f32(x) for x in pp.output_range),
        )
        params._validate(cfg.name)
        return params

    @property
    def groups(self) -> int:
        """NMS groups: one class-agnostic group, or one per class."""
        return self.num_classes if self.per_class else 1

    @property
    def sort_cap(self) -> int:
        return nms_sort_cap(self.top_k)

    @property
    def final_cap(self) -> int:
        return next_power_of_two(self.num_classes * self.top_k) if self.per_class else 1

    @property
    def num_anchors(self) -> int:
        return self.head_map[0] * self.head_map[1] * self.anchors_per_cell

    @property
    def head_channels(self) -> int:
        """Channels of the merged head map: cls | box | dir."""
        return self.anchors_per_cell * (self.num_classes + self.box_code_size + self.dir_bins)

    def _validate(self, source: str) -> None:
        def fail(msg: str) -> None:
            raise ConfigError(f"{source}: {msg} (GPU post-processing)")

        if self.box_code_size != BOX_SIZE:
            fail(f"box codes of {self.box_code_size} values; the GPU decoder reads {BOX_SIZE}")
        if self.dir_bins != 2 or self.dir_flip_bin not in (0, 1):
            fail(f"direction needs 2 bins and flip_bin 0 or 1, got {self.dir_bins} bins, flip_bin {self.dir_flip_bin}")
        if not 1 <= self.top_k <= _SORT_LIMIT:
            fail(f"postprocess.pre_nms_top_k is {self.top_k}; supported: 1..{_SORT_LIMIT}")
        if self.per_class and self.final_cap > _SORT_LIMIT:
            fail(f"per-class NMS supports classes * pre_nms_top_k <= {_SORT_LIMIT}, got {self.num_classes * self.top_k}")
        if self.max_boxes < 1:
            fail(f"postprocess.max_boxes is {self.max_boxes}; expected at least 1")

    def defines(self) -> tuple[str, ...]:
        floats: dict[str, int | str] = {}
        if self.output_range is not None:
            for i, axis in enumerate("XYZ"):
                floats[f"OUT_MIN_{axis}"] = f32_define(self.output_range[i])
                floats[f"OUT_MAX_{axis}"] = f32_define(self.output_range[i + 3])
        return define_flags(
            HEAD_W=self.head_map[0], HEAD_H=self.head_map[1], HEAD_CHANNELS=self.head_channels,
            ANCHORS_PER_CELL=self.anchors_per_cell,
            NUM_CLASSES=self.num_classes, DIR_BINS=self.dir_bins, STYLE_OPENPCDET=int(self.openpcdet_style),
            PER_CLASS=int(self.per_class), SCORE_INCLUSIVE=int(self.score_inclusive),
            TOP_K=self.top_k, SORT_CAP=self.sort_cap,
            FINAL_CAP=self.final_cap, NMS_MARGIN=f32_define(self.nms_margin),
            MAX_BOXES=self.max_boxes, DIR_OFFSET=f32_define(self.dir_offset),
            DIR_LIMIT_OFFSET=f32_define(self.dir_limit_offset), DIR_FLIP_BIN=self.dir_flip_bin,
            DIR_PERIOD=f32_define(np.pi), HAS_OUTPUT_RANGE=int(self.output_range is not None),
            OVERFLOWED_LOGIT=f32_define(OVERFLOWED_LOGIT),
            SCORE_BLOCK=_SCORE_BLOCK, HEADER_EXTRA=len(POST_HEADER), **nms_defines(),
            **floats, **slot_defines("STAT", POST_STATS), STAT_COUNT=len(POST_STATS), **slot_defines("HEADER", POST_HEADER),
            **slot_defines("THRESHOLD", THRESHOLD_SLOTS),
        )


def threshold_values(cfg: ModelConfig) -> np.ndarray:
    """The run-time thresholds of ``cfg`` (score threshold, NMS IoU, max boxes) as the float32 values the
    kernels read from their ``thresholds`` buffer (``THRESHOLD_SLOTS``)."""
    pp = cfg.postprocess
    return np.array([pp.score_threshold, pp.nms_iou, pp.max_boxes], np.float32)


class PostprocessStage:
    """Each frame's merged NHWC head map (hy, hx, cls|box|dir) -> detections (``reference.postprocess``)
    in one small device buffer a frame, a batch of up to ``frames`` frames in one set of launches.

    ``thresholds`` (3,) float32 on the device (owned here and filled from ``cfg``, or the caller's, shared
    by several stages) holds the run-time score threshold, NMS IoU and max boxes (``THRESHOLD_SLOTS``);
    the kernels read it on every launch, so writing new values there (on the launch stream) changes the
    next frame's thresholds without recompiling or recapturing anything. Max boxes is clamped to the
    ``cfg`` value, the cap ``result`` is sized for.

    ``result`` (frames, max_boxes + 1, 9) float32 (owned here, or the caller's batch buffer given as
    ``result``): a frame's row 0 holds the counts named by
    ``RESULT_HEADER`` (this stage's, then the voxelizer's), rows 1..count the boxes as [x, y,
    z_centre, dx, dy, dz, heading, score, label] in OpenPCDet's convention, in the family's output
    order. Copy it to the host once a batch and read each frame's with ``unpack``.
    """

    KERNELS = ("pp_score", "pp_compact", "pp_select", "pp_group", "pp_nms_mask", "pp_nms_reduce")

    def __init__(self, cfg: ModelConfig, result: Any = None, thresholds: Any = None, frames: int = 1) -> None:
        cp = cupy_module()
        self.params = p = PostParams.from_config(cfg)
        self._k = compile_kernels("postprocess.cu", p.defines(), self.KERNELS)
        self._mask_grid = mask_grid(p.groups, p.sort_cap)  # device attributes: read once, not per launch
        w, h = p.head_map
        self._heads_shape = (h, w, p.head_channels)
        a = p.anchors_per_cell
        self._offsets = (0, a * p.num_classes, a * (p.num_classes + 7))  # cls | box | dir channels
        na, slots, n = p.num_anchors, p.groups * p.sort_cap, frames
        if result is not None:
            check_device_array(result, "result", np.float32, (frames, *self.result_shape(cfg)))
        if thresholds is not None:
            check_device_array(thresholds, "thresholds", np.float32, (len(THRESHOLD_SLOTS),))
        with checked("postprocess: allocating buffers"):
            self.result = result if result is not None else cp.zeros((n, *self.result_shape(cfg)), np.float32)
            self.stats = cp.zeros((n, len(POST_STATS)), np.int32)
            self.thresholds = thresholds if thresholds is not None else cp.asarray(threshold_values(cfg))
            self._anchors = cp.asarray(np.ascontiguousarray(anchors(cfg), np.float32))
            self._key = cp.zeros((n, na), np.uint32)
            self._block_counts = cp.zeros((n, grid_blocks(na, _SCORE_BLOCK)), np.int32)
            self._cand_key = cp.zeros((n, na), np.uint32)
            self._cand_anchor = cp.zeros((n, na), np.int32)
            self._sel_anchor = cp.zeros((n, p.sort_cap), np.int32)
            self._sel_score = cp.zeros((n, p.sort_cap), np.float32)
            self._group_count = cp.zeros((n, p.groups), np.int32)
            self._group_box = cp.zeros((n, slots, BOX_SIZE), np.float32)
            self._group_rect = cp.zeros((n, *rect_shape(slots)), np.float32)
            self._group_score = cp.zeros((n, slots), np.float32)
            self._group_label = cp.zeros((n, slots), np.int32)
            self._group_dir = cp.zeros((n, slots), np.int32)
            self._mask = cp.zeros((n, mask_words(slots, p.sort_cap)), np.uint64)
            self._kept = cp.zeros((n, slots), np.int32)
            cp.cuda.runtime.deviceSynchronize()  # initial contents visible to any stream

    def launch(self, heads: Any, voxel_stats: Any, stream: Any, frames: int = 1) -> None:
        """Enqueue the first ``frames`` frames: their merged NHWC float32 head maps (frames, hy, hx,
        channels) -> ``result``. ``voxel_stats`` (the voxelizer's (frames, k) ``stats``, or any such int32
        array) go into each frame's header."""
        check_device_array(heads, "head map", np.float32, (None, *self._heads_shape))
        check_frames(heads, "head map", frames)
        check_frame_counts(voxel_stats, "voxel_stats", frames)
        check_frames(self.result, "postprocess", frames)
        flat = heads.ravel()
        cls, box, dir = (flat[offset:] for offset in self._offsets)  # views into frame 0's map
        p, k = self.params, self._k
        num_extra = np.int32(min(voxel_stats.shape[1], OUTPUT_ROW - len(POST_HEADER)))
        score_grid = batch_grid(grid_blocks(p.num_anchors, _SCORE_BLOCK), frames)
        launch_kernel(k["pp_score"], score_grid, _SCORE_BLOCK,
                      (cls, self.thresholds, self._key, self._block_counts, self.stats), stream)
        launch_kernel(k["pp_compact"], score_grid, _SCORE_BLOCK,
                (self._key, self._block_counts, self.thresholds, self.stats, self._cand_key, self._cand_anchor),
                stream)
        launch_kernel(k["pp_select"], batch_grid(1, frames), 1024,
                (self._cand_key, self._cand_anchor, self.stats, self._sel_anchor, self._sel_score), stream)
        group_grid, group_block = (p.groups, min(1024, p.sort_cap)) if p.per_class else (grid_blocks(p.sort_cap, 256), 256)
        launch_kernel(k["pp_group"], batch_grid(group_grid, frames), group_block,
                (cls, box, dir, self._anchors, self._sel_anchor, self._sel_score, self.stats, self.thresholds,
                 self._group_count,
                 self._group_box, self._group_rect, self._group_score, self._group_label, self._group_dir), stream)
        mask_blocks, groups = self._mask_grid
        launch_kernel(k["pp_nms_mask"], batch_grid((shared_blocks(mask_blocks, frames), groups), frames), MASK_THREADS,
                (self._group_count, self._group_rect, self.thresholds, self._mask), stream)
        launch_kernel(k["pp_nms_reduce"], batch_grid(1, frames), 256,
                (self._group_count, self._mask, self._group_box, self._group_score, self._group_label,
                 self._group_dir, self.stats, voxel_stats, np.int32(voxel_stats.shape[1]), num_extra,
                 self.thresholds, self._kept, self.result), stream)

    @staticmethod
    def result_shape(cfg: ModelConfig) -> tuple[int, int]:
        """(rows, values a row) of a frame's ``result``: the header row, then at most ``max_boxes`` boxes."""
        return cfg.postprocess.max_boxes + 1, OUTPUT_ROW

    @staticmethod
    def unpack(result: np.ndarray) -> Unpacked:
        """A host copy of ``result`` -> boxes (n, 7) float32, scores (n,) float32, labels (n,) int32
        (0-based into cfg.classes), the counts of ``RESULT_HEADER`` by name and velocities (None: this
        post-process has none; the multi-head one returns the same five)."""
        out = np.asarray(result, np.float32)
        counts = {name: int(v) for name, v in zip(RESULT_HEADER, out[0].tolist())}
        rows = out[1 : 1 + counts["count"]]
        # copies, never views: the caller's pinned result buffer is rewritten by the next frame
        return (rows[:, :BOX_SIZE].copy(), rows[:, BOX_SIZE].copy(), rows[:, BOX_SIZE + 1].astype(np.int32), counts,
                None)
