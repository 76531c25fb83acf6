"""What ``detect_dataset`` reports of a run (its rates with and without the actors' start) and the workers it asks for."""

from __future__ import annotations


def test_the_ray_rate_from_the_actors_first_call_leaves_their_start_out() -> None:
    from pointpillars_trt.apps.distributed import DatasetSummary

    summary = DatasetSummary(frames=1000, boxes=0, seconds=10.0, workers=1, out="o", working_seconds=4.0)
    assert summary.frames_per_second == 100.0
    assert summary.working_frames_per_second == 250.0
    untimed = DatasetSummary(frames=200, boxes=0, seconds=6.5, workers=1, out="o")
    assert untimed.working_frames_per_second == untimed.frames_per_second == 200 / 6.5


def test_workers_default_to_two_a_gpu_and_to_half_the_cpus_without_one() -> None:
    from pointpillars_trt.apps.distributed import check_resources
    import pytest

    from pointpillars_trt.errors import InputError

    assert check_resources({"GPU": 2.0, "CPU": 32.0}, None, None) == (4, 0.5)
    assert check_resources({"GPU": 2.0, "CPU": 32.0}, None, 1.0) == (2, 1.0)
    assert check_resources({"GPU": 1.0, "CPU": 16.0}, 1, None) == (1, 0.5)
    assert check_resources({"CPU": 8.0}, None, None) == (4, 0.0)
    assert check_resources({"GPU": 2.0, "CPU": 3.0}, None, None) == (3, 0.5)  # an actor's CPU each
    with pytest.raises(InputError, match="3 workers x 0.5 GPU need 1.5 GPUs; the Ray cluster has 1"):
        check_resources({"GPU": 1.0, "CPU": 8.0}, 3, None)
    with pytest.raises(InputError, match="4 GPU workers need 4 CPUs; the Ray cluster has 2"):
        check_resources({"GPU": 4.0, "CPU": 2.0}, 4, 1.0)
    with pytest.raises(InputError, match="1 GPU worker needs 1 CPU; the Ray cluster has 0"):
        check_resources({"GPU": 1.0, "CPU": 0.0}, 1, 1.0)


def test_a_worker_asking_for_more_gpus_than_the_cluster_has_names_the_option_and_the_fix() -> None:
    import pytest

    from pointpillars_trt.apps.distributed import check_resources
    from pointpillars_trt.errors import InputError

    with pytest.raises(InputError, match=r"--gpus-per-worker 1: the Ray cluster has 0 GPUs; give --gpus-per-worker 0 "
                                         r"for the CPU path"):
        check_resources({"CPU": 8.0}, None, 1.0)
    with pytest.raises(InputError, match=r"--gpus-per-worker 2: the Ray cluster has 1 GPU; give at most 1"):
        check_resources({"GPU": 1.0, "CPU": 8.0}, 1, 2.0)
    with pytest.raises(InputError, match=r"^workers 0: expected >= 1 \(the cluster has 1 GPU\)$"):
        check_resources({"GPU": 1.0, "CPU": 8.0}, 0, None)
    assert check_resources({"GPU": 1.0, "CPU": 8.0}, None, 1.0) == (1, 1.0)


def test_the_device_decides_gpu_or_cpu_workers_and_an_explicit_cuda_device_is_never_run_on_the_cpu() -> None:
    import pytest

    from pointpillars_trt.apps.distributed import check_resources
    from pointpillars_trt.errors import InputError

    assert check_resources({"GPU": 2.0, "CPU": 32.0}, None, None, "cpu") == (16, 0.0)
    assert check_resources({"GPU": 2.0, "CPU": 32.0}, None, None, "cuda") == (4, 0.5)
    with pytest.raises(InputError, match="--device cuda: the Ray cluster has no GPUs; pass --device cpu"):
        check_resources({"CPU": 8.0}, None, None, "cuda")
    with pytest.raises(InputError, match="--device cuda with --gpus-per-worker 0: drop one of them"):
        check_resources({"GPU": 1.0, "CPU": 8.0}, None, 0.0, "cuda")
    with pytest.raises(InputError, match="--device cpu with --gpus-per-worker 1: drop one of them"):
        check_resources({"GPU": 1.0, "CPU": 8.0}, None, 1.0, "cpu")
    with pytest.raises(InputError, match="--device cuda:1: Ray gives each worker its own GPUs; pass --device cuda"):
        check_resources({"GPU": 2.0, "CPU": 8.0}, None, None, "cuda:1")


def test_each_actor_is_fitted_to_all_the_frames_which_one_call_holds_whenever_the_fit_cuts() -> None:
    """An actor's size is local infer's for the run's frames (the GPU's defaults for one frame: one pipeline at batch
    1); and whenever that fit cuts anything, one actor call holds every frame (so one actor may run them all: a
    worker's share would be too small a fit). Oracle: the sizes by hand, and every call size by its definition."""
    from pointpillars_trt.apps.distributed import actor_size, frames_per_call
    from pointpillars_trt.apps.run_size import RunSize

    assert actor_size(None, None, True, 1) == RunSize(1, 1)
    assert actor_size(None, None, True, 12) == RunSize(8, 2)
    assert actor_size(None, None, True, 40) == RunSize(8, 4)
    assert actor_size(None, 16, False, 4) == RunSize(1, 4)
    assert actor_size(3, None, False, 2) == RunSize(2, 1)
    for batch in range(1, 13):
        for pipelines in range(1, 7):
            for frames in range(1, 100):
                size = actor_size(batch, pipelines, True, frames)
                if size != RunSize(batch, pipelines):
                    for on_gpu in (True, False):
                        for uris in (True, False):
                            assert frames_per_call(size.batch * size.pipelines, on_gpu, uris) >= frames


def test_a_run_starts_no_more_workers_than_its_calls_and_a_workers_given_that_is_cut_is_said() -> None:
    """A Ray run of N frames in calls of C starts at most ceil(N / C) workers (at least one); only a ``--workers``
    given that is cut is said, in local infer's note, after any cut of the batch or the pipelines. Oracle: the counts
    and the notes by hand."""
    from pointpillars_trt.apps.run_size import RunSize, WorkerCalls, cut_note

    assert WorkerCalls(2, 8).fitted(1) == WorkerCalls(1, 8)  # one frame: one worker, not two
    assert WorkerCalls(2, 8).fitted(16) == WorkerCalls(2, 8)
    assert WorkerCalls(4, 8).fitted(17) == WorkerCalls(3, 8)
    assert WorkerCalls(2, 8).fitted(100) == WorkerCalls(2, 8)
    assert WorkerCalls(2, 8).fitted(0) == WorkerCalls(1, 8)  # none to run: one
    why = "(more would only cost start time and memory)"
    assert cut_note(None, None, RunSize(1, 1), 3, given_workers=None, calls=WorkerCalls(1, 8)) is None  # a default
    assert cut_note(None, None, RunSize(1, 1), 16, given_workers=2, calls=WorkerCalls(2, 8)) is None
    assert cut_note(None, None, RunSize(1, 1), 3, given_workers=2, calls=WorkerCalls(1, 8)) == \
        f"--workers 2 cut to 1: the 3 frames to run make 1 worker call of 3 {why}"
    assert cut_note(None, None, RunSize(2, 1), 17, given_workers=4, calls=WorkerCalls(3, 8)) == \
        f"--workers 4 cut to 3: the 17 frames to run make 3 worker calls of at most 8 {why}"
    assert cut_note(None, 4, RunSize(1, 3), 3, given_workers=2, calls=WorkerCalls(1, 9)) == \
        f"--pipelines 4 cut to 3 and --workers 2 cut to 1: the 3 frames to run make 3 batches of 1 and 1 worker " \
        f"call of 3 {why}"
    assert cut_note(8, None, RunSize(1, 1), 1, ("batch_size=", "pipelines=", "workers="), 2, WorkerCalls(1, 8)) == \
        f"batch_size=8 cut to 1 and workers=2 cut to 1: the 1 frame to run makes 1 batch of 1 and 1 worker call of 1 " \
        f"{why}"
    assert cut_note(None, None, RunSize(1, 1), 0, given_workers=2, calls=WorkerCalls(1, 8)) == \
        "--workers 2 cut to 1: no frame is left to run"
