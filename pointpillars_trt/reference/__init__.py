"""NumPy reference of every GPU stage: the CPU path of the pipeline and the oracle of the kernels."""

from .voxel import Pillars, overflowed_features, scatter, voxelize
from .post import (
    RawDetections,
    anchors,
    decode_boxes,
    head_maps_to_anchor_major,
    nms_rotated,
    postprocess,
    rotated_iou_bev,
    split_heads,
    to_openpcdet_boxes,
)

__all__ = [
    "Pillars", "RawDetections", "anchors", "decode_boxes", "head_maps_to_anchor_major", "nms_rotated",
    "overflowed_features", "postprocess", "rotated_iou_bev", "scatter", "split_heads", "to_openpcdet_boxes",
    "voxelize",
]
