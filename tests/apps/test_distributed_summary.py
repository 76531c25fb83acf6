"""What ``detect_dataset`` reports of a run: its rates with and without the actors' start."""

from __future__ import annotations


def test_the_ray_rate_from_the_actors_first_call_leaves_their_start_out() -> None:
    from pointpillars_trt.apps.distributed import DatasetSummary

    summary = DatasetSummary(frames=1000, boxes=0, seconds=10.0, workers=1, out="o", working_seconds=4.0)
    assert summary.frames_per_second == 100.0
    assert summary.working_frames_per_second == 250.0
    untimed = DatasetSummary(frames=200, boxes=0, seconds=6.5, workers=1, out="o")
    assert untimed.working_frames_per_second == untimed.frames_per_second == 200 / 6.5
