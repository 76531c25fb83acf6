"""The packed input of a batch (staging.py), on the CPU: what the GPU pipeline copies to the device.

Oracle: the layout written out by hand (a header of (count, first row) int32 pairs, then the frames'
rows back to back) and NumPy's own concatenation of the frames.
"""

from __future__ import annotations

import numpy as np
import pytest

from pointpillars_trt.staging import HEADER_ROWS, StagingBuffer


def frames_of(sizes: list[int], columns: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(len(sizes))
    return [rng.standard_normal((n, columns)).astype(np.float32) for n in sizes]


@pytest.mark.parametrize("sizes, part_rows", [
    ([121_000], 32_768),            # a full scan: 4 parts
    ([0], 8),                       # an empty frame: the header alone
    ([5, 0, 17, 3], 8),             # parts cut across frames
    ([4, 8, 4], 8),                 # frames that end on a part's end
    ([28], 32),                     # header + frame exactly one part
    ([30, 2, 1], 4),                # the shortest part: the header alone
])
def test_put_in_parts_fills_the_packed_layout_and_yields_parts_that_tile_it(sizes: list[int], part_rows: int) -> None:
    frames = frames_of(sizes)
    staging = StagingBuffer(sum(sizes) + 1)
    staging.put(0, np.full((1, 4), 7, np.float32))  # a stale row from the previous batch is overwritten
    parts = list(staging.put_in_parts(frames, part_rows))
    used = HEADER_ROWS + sum(sizes)
    assert [first for first, _ in parts] == list(range(0, used, part_rows))
    assert [end for _, end in parts] == [min(first + part_rows, used) for first, _ in parts]
    firsts = np.cumsum([0, *sizes[:-1]])
    assert staging.header[: 2 * len(sizes)].tolist() == [v for n, f in zip(sizes, firsts) for v in (n, f)]
    assert np.array_equal(staging.rows[HEADER_ROWS:used], np.concatenate(frames) if frames else np.zeros((0, 4)))


def test_put_in_parts_yields_each_part_once_it_is_filled() -> None:
    frames = frames_of([10, 10])
    staging = StagingBuffer(20)
    expected = np.concatenate(frames)
    for first, end in staging.put_in_parts(frames, 6):
        got = staging.rows[max(first, HEADER_ROWS):end]
        assert np.array_equal(got, expected[max(first, HEADER_ROWS) - HEADER_ROWS : end - HEADER_ROWS]), (first, end)


def test_time_lags_of_five_column_frames_go_beside_the_rows() -> None:
    frames = frames_of([3, 9], columns=5)
    staging = StagingBuffer(12, columns=5)
    parts = list(staging.put_in_parts(frames, 4))
    assert parts[-1][1] == HEADER_ROWS + 12
    assert staging.times is not None
    assert np.array_equal(staging.times[:12], np.concatenate(frames)[:, 4])
    assert np.array_equal(staging.rows[HEADER_ROWS : HEADER_ROWS + 12], np.concatenate(frames)[:, :4])


def test_frames_that_do_not_fit_and_parts_shorter_than_the_header_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        list(StagingBuffer(10).put_in_parts(frames_of([6, 6]), 4))
    with pytest.raises(ValueError, match="header"):
        list(StagingBuffer(10).put_in_parts(frames_of([6]), HEADER_ROWS - 1))
