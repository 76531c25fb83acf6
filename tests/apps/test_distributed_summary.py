"""What ``detect_dataset`` reports of a run: its rates with and without the actors' start."""

from __future__ import annotations


def test_the_ray_rate_from_the_first_block_on_leaves_the_start_and_that_block_out() -> None:
    from pointpillars_trt.apps.distributed import DatasetSummary

    summary = DatasetSummary(frames=1000, boxes=0, seconds=10.0, workers=1, out="o", first_result_seconds=6.0,
                             first_block_frames=200)
    assert summary.frames_per_second == 100.0
    assert summary.steady_frames_per_second == 800 / 4.0
    one_block = DatasetSummary(frames=200, boxes=0, seconds=6.5, workers=1, out="o", first_result_seconds=6.5,
                               first_block_frames=200)
    assert one_block.steady_frames_per_second == one_block.frames_per_second == 200 / 6.5
