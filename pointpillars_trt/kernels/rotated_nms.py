"""The host side of ``cuda/rotated_nms.cuh``: what its rectangles and IoU bit matrix take in device
memory, and the grid of the kernels that build the matrix."""

from __future__ import annotations

from ..config import next_power_of_two
from ._launch import grid_blocks, multiprocessors

RECT_FLOATS = 16  # a stored rectangle (rotated_nms.cuh: Rect): centre, half extents, cos, sin, area, radius, corners
MASK_THREADS = 256  # a block of the bit-matrix kernels: 4 words of 64 pair tests


def rect_shape(slots: int) -> tuple[int, int]:
    return slots, RECT_FLOATS


def nms_sort_cap(top_k: int) -> int:
    """Member slots of an NMS group of at most ``top_k`` candidates (SORT_CAP): a power of two, which the in-block
    bitonic sort needs, and at least one 64-bit word of the bit matrix."""
    return max(64, next_power_of_two(top_k))


def mask_words(slots: int, sort_cap: int) -> int:
    """64-bit words of the bit matrix: a row of column blocks for every member slot."""
    return slots * (sort_cap // 64)


def mask_grid(groups: int, sort_cap: int) -> tuple[int, int]:
    """(blocks a group, groups): enough blocks to fill the GPU, never more than a full group's words
    need. Fixed per model, so a CUDA graph holds it; the blocks stride over the words a frame has."""
    words = sort_cap * (sort_cap // 64)
    return max(1, min(grid_blocks(words, MASK_THREADS // 64), 8 * multiprocessors() // groups)), groups


def nms_defines() -> dict[str, int]:
    return {"NMS_RECT_FLOATS": RECT_FLOATS, "NMS_MASK_THREADS": MASK_THREADS}

