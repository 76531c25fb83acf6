"""NumPy post-processing of OpenPCDet's multi-head models (``AnchorHeadMulti`` + ``MULTI_CLASSES_NMS``):
the CPU path and the oracle of a GPU decoder.

What OpenPCDet does, step by step (``anchor_head_multi.py``, ``anchor_head_template.py``,
``ResidualCoder.decode_torch``, ``detector3d_template.post_processing``, ``multi_classes_nms``):

* Each head h scores its own classes. Its rows are anchor-major: row (a * H + y) * W + x, anchor
  a = class-in-head * rotations + r, and the anchors of all heads are the classes' anchors in class
  order (``permute(3, 4, 0, 1, 2, 5)`` of each class's (z, y, x, size, rot) grid).
* Box codes: (x, y, z, dx, dy, dz, cos, sin, vx, vy) residuals; heading = atan2(sin_t + sin r_a,
  cos_t + cos r_a); velocity = the code (the anchors' velocity is zero). No direction classifier.
* Per head, per class: sigmoid score >= threshold, top ``pre_nms_top_k`` by score, rotated BEV NMS
  (IoU > ``nms_iou`` suppresses), the first ``max_boxes`` kept. Results are concatenated head by
  head, class by class, each in descending score: OpenPCDet does not re-sort them.
"""

from __future__ import annotations

import numpy as np

from ..anchors import head_rows, multihead_anchors
from ..config import ModelConfig
from ..errors import InputError
from .post import RawDetections, _sigmoid, _top_passing, decode_boxes, nms_rotated, overflowed_logits


def decode_sincos(codes: np.ndarray, anchor_boxes: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Residual codes (N, code) + anchors (N, 7) -> boxes (N, 7) and the code's extra values (N, 2:
    the velocity, or 0), float32 in ResidualCoder's operation order: ``decode_boxes`` of the first 7 values,
    with the heading of a sin/cos code in place of the plain residual's."""
    t = np.asarray(codes, np.float32)
    a = np.asarray(anchor_boxes, np.float32)
    out = decode_boxes(t[:, :7], a, cfg)
    if cfg.box_code.angle == "sincos":
        out[:, 6] = np.arctan2(t[:, 7] + np.sin(a[:, 6]), t[:, 6] + np.cos(a[:, 6]))
        rest = t[:, 8:]
    else:
        rest = t[:, 7:]
    return out, rest + np.float32(0)  # the anchors' zero velocity, added as OpenPCDet does


def multihead_postprocess(heads: np.ndarray, cfg: ModelConfig) -> RawDetections:
    """One frame's merged NHWC head map (hy, hx, channels) -> detections with velocities."""
    nx, ny = cfg.head_map
    channels = sum(cfg.head_channels.values())
    if heads.shape != (ny, nx, channels):
        raise InputError(f"head map: expected ({ny}, {nx}, {channels}), received shape {heads.shape}")
    pp, code = cfg.postprocess, cfg.box_code_size
    all_anchors = multihead_anchors(cfg)
    boxes, velocity, scores, labels = [], [], [], []
    first_anchor, first_class, overflowed_scores = 0, 0, 0
    for cls_at, box_at, a, n in head_rows(cfg):
        rows = a * ny * nx
        logits = heads[:, :, cls_at: cls_at + a * n].reshape(ny, nx, a, n).transpose(2, 0, 1, 3).reshape(rows, n)
        codes = heads[:, :, box_at: box_at + a * code].reshape(ny, nx, a, code).transpose(2, 0, 1, 3).reshape(rows, code)
        logits = np.ascontiguousarray(logits, np.float32)
        probs = _sigmoid(logits)
        overflowed_scores += overflowed_logits(logits)
        head_anchors = all_anchors[first_anchor: first_anchor + rows]
        for k in range(n):
            score = probs[:, k]
            picked = _top_passing(score, cfg)
            if picked.size == 0:
                continue
            box, vel = decode_sincos(codes[picked], head_anchors[picked], cfg)
            keep = nms_rotated(box, score[picked], pp.nms_iou, "openpcdet", max_keep=pp.max_boxes)
            boxes.append(box[keep])
            velocity.append(vel[keep])
            scores.append(score[picked][keep])
            labels.append(np.full(keep.size, first_class + k, np.int32))
        first_anchor += rows
        first_class += n
    if not boxes:
        empty = np.zeros((0, 7), np.float32)
        return RawDetections(empty, np.zeros(0, np.float32), np.zeros(0, np.int32), empty,
                             np.zeros((0, 2), np.float32) if cfg.box_code.velocity else None, overflowed_scores)
    out = np.concatenate(boxes)
    return RawDetections(out, np.concatenate(scores), np.concatenate(labels), out.copy(),
                         np.concatenate(velocity) if cfg.box_code.velocity else None, overflowed_scores)
