"""``detect_dataset`` and ``infer --ray`` refuse what every frame would fail alike, before a Ray cluster starts:
the numbers handed to every worker, an empty frame list, KITTI outputs or the camera-FOV crop without calib
folders. (Ray installed; no cluster is started here, unless a test fails.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_distributed_ray import cli_ray_infer, tiny_model, write_frames  # noqa: F401 - fixture: the tiny model dir

from pointpillars_trt.errors import InputError, ModelDirError
from pointpillars_trt.runtime_options import RuntimeOptions


@pytest.mark.parametrize(("given", "said"), [
    ({"intensity_scale": float("nan")}, "intensity scale nan: expected a number in [1e-06, 1000]"),
    ({"intensity_scale": True}, "intensity scale True: expected a number"),
    ({"point_dim": 3}, "point_dim 3 is not an integer from 4 to 64"),
    ({"batch_size": 0}, "batch_size 0: expected an integer in 1..8 or None"),
    ({"pipelines": 0}, "pipelines 0: expected an integer in 1..16 or None"),
    ({"paths": []}, "paths_or_uri: no frames given"),
    ({"paths": None}, "paths_or_uri: expected a point file, folder, glob or URI, or a list of them (str or "
                      "pathlib.Path); got None (NoneType)"),
    ({"paths": 5}, "paths_or_uri: expected a point file, folder, glob or URI, or a list of them (str or "
                   "pathlib.Path); got 5 (int)"),
    ({"paths": {"a.bin": 1}}, "got {'a.bin': 1} (dict)"),
    ({"paths": ["a.bin", None]}, "paths_or_uri: item 1 is None (NoneType), not a path; expected a point file"),
    ({"paths": "/no/such/frames"}, "paths_or_uri: no path gives a frame: '/no/such/frames' does not exist"),
    ({"paths": ["/no/a.bin", "/no/b.bin"]}, "no path gives a frame: '/no/a.bin' does not exist (nor does the other)"),
])
def test_detect_datasets_arguments_are_refused_before_any_worker_starts(tiny_model: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                         given: dict, said: str) -> None:
    """Each had run: every frame failed alike in the workers (a NaN scale, 3 values a point), or a batch of 0
    ran, or an empty list started a cluster; None, a number or an item that is no path raised Python's bare
    TypeError, and a dict ran its keys as frames; paths none of which exists started a cluster to fail each."""
    ray = pytest.importorskip("ray", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    from pointpillars_trt.apps.distributed import detect_dataset

    frame = tmp_path / "a.bin"
    np.zeros((10, 4), np.float32).tofile(frame)
    paths = given.pop("paths", [str(frame)])
    was = ray.is_initialized()
    with pytest.raises(InputError, match=re.escape(said)):
        detect_dataset(paths, tiny_model, tmp_path / "out", workers=1, gpus_per_worker=0, progress=False, **given)
    assert ray.is_initialized() == was and not (tmp_path / "out").exists()


def test_ray_kitti_output_without_calib_folders_is_one_error_before_the_cluster_starts(tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                                       tmp_path: Path) -> None:
    """As local infer refuses it before the model loads (it started Ray and failed every frame alike)."""
    ray = pytest.importorskip("ray", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    write_frames(tmp_path / "loose", tiny_model, {"000001": 50, "000002": 50})
    was = ray.is_initialized()
    for options in (["--format", "kitti"], ["--fov-only"]):
        rc, out, err = cli_ray_infer(tmp_path / "loose", tiny_model, tmp_path / "out", *options)
        assert rc == 2 and err.count("error: ") == 1 and "no calibration folder for frame" in err, err
        assert "running on Ray" not in out + err and ray.is_initialized() == was


def test_a_gpu_only_backend_for_cpu_workers_is_local_infers_error_line_before_the_cluster_starts(  # type: ignore[no-untyped-def]
        tiny_model: Path, tmp_path: Path) -> None:
    """``--device cpu --backend cudnn``: local infer's one error line, before Ray starts (each worker refused it as
    it opened the model, which came back as Ray's traceback of some 270 lines, exit code 1)."""
    import contextlib
    import io

    from pointpillars_trt.apps.cli import main as cli_main

    ray = pytest.importorskip("ray", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    write_frames(tmp_path / "frames", tiny_model, {"000001": 50})
    local_err = io.StringIO()
    with contextlib.redirect_stderr(local_err):
        assert cli_main(["infer", str(tmp_path / "frames"), "--model", str(tiny_model), "--out", str(tmp_path / "local"),
                         "--device", "cpu", "--backend", "cudnn"]) == 2
    assert local_err.getvalue().startswith("error: backend 'cudnn' runs only in the GPU pipeline"), local_err.getvalue()
    was = ray.is_initialized()
    rc, out, err = cli_ray_infer(tmp_path / "frames", tiny_model, tmp_path / "out", "--backend", "cudnn")
    assert (rc, out, err) == (2, "", local_err.getvalue())
    assert ray.is_initialized() == was and not (tmp_path / "out").exists()


def test_files_of_formats_not_read_that_its_folders_leave_out_are_one_note_a_run(  # type: ignore[no-untyped-def]
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """detect_dataset expanded each folder, glob or path on its own: the note of the .npz and .ply files left out
    was said once a folder, where infer says it once a run. One note counts those of every folder and glob given
    (the frames are expanded before the model is opened: the missing one ends the run before a cluster starts)."""
    ray = pytest.importorskip("ray", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    from pointpillars_trt.apps.distributed import detect_dataset

    for folder, other in (("a", "x.npz"), ("b", "y.npz"), ("c", "z.ply")):
        write_frames(tmp_path / folder, tiny_model, {"000001": 50})
        (tmp_path / folder / other).write_bytes(b"x")
    was = ray.is_initialized()
    with pytest.raises(InputError, match="no such checkpoint file or model dir"):
        detect_dataset([str(tmp_path / "a"), str(tmp_path / "b"), f"{tmp_path / 'c'}/*"], tmp_path / "no_model",
                       tmp_path / "out", workers=1, gpus_per_worker=0, progress=False)
    notes = [line for line in capsys.readouterr().err.splitlines() if "not read" in line]
    assert notes == [
        "note: 3 files of point formats that are not read left out of the folders and globs given: 2 .npz (e.g. "
        f"{str(tmp_path / 'a' / 'x.npz')!r}): save the frame's array from the archive as .npy (np.save('frame.npy', "
        f"np.load(path)[name])); 1 .ply ({str(tmp_path / 'c' / 'z.ply')!r}): convert it to .pcd (e.g. "
        "pcl_ply2pcd in.ply out.pcd) or to a float32 .bin or .npy of x, y, z, intensity"], notes
    assert ray.is_initialized() == was


@pytest.mark.slow
def test_tensorrt_plans_the_model_dir_lacks_are_one_error_before_any_worker_starts(  # type: ignore[no-untyped-def]
        tiny_model: Path, tmp_path: Path) -> None:
    """Workers on GPUs told ``--backend tensorrt`` of a model dir without plans (as a checkpoint's export under --ray
    is): one error naming the fix, before any worker starts (each worker failed to open the model: Ray's
    traceback). The cluster's one GPU is one in name only: a worker that started would fail on it."""
    ray = pytest.importorskip("ray", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    from pointpillars_trt.apps.distributed import detect_dataset

    write_frames(tmp_path / "frames", tiny_model, {"000001": 50})
    assert not ray.is_initialized()
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(ModelDirError, match=r"^--backend tensorrt: the workers run the TensorRT plans of --model, "
                                                r"and .* holds none .*`pointpillars-trt build --checkpoint CKPT "
                                                r"--backend tensorrt --out DIR`"):
            detect_dataset([str(tmp_path / "frames")], tiny_model, tmp_path / "out", workers=1, progress=False,
                           runtime=RuntimeOptions(device="cuda", backend="tensorrt"))
    finally:
        ray.shutdown()
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ray_address_auto_without_a_cluster_is_one_error_in_this_tools_words(tmp_path: Path, assets: Path) -> None:
    """Ray's own message told to set its CLI's ``--address`` flag; with no cluster to join (a Ray temp folder of
    its own, so no other test's cluster is found), one error line naming --ray-address, exit 2."""
    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path / "ray")
    frame = assets / "kitti" / "training" / "velodyne_reduced" / "000134.bin"
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frame), "--model",
                           str(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"), "--out",
                           str(tmp_path / "out"), "--ray", "--ray-address", "auto", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: --ray-address auto: Ray found no running cluster on this machine to join: start one (ray start "
        "--head), give its address, or leave --ray-address out for a local one"), done.stderr


_RAY_IMPORTED_FIRST = """
import sys
import ray  # as a Ray user's script begins
from pointpillars_trt.apps.distributed import detect_dataset
summary = detect_dataset([sys.argv[1]], sys.argv[2], sys.argv[3], workers=1, gpus_per_worker=0, progress=False)
print(summary.frames, summary.failures)
"""


@pytest.mark.slow
def test_detect_dataset_starts_its_cluster_for_a_caller_that_imported_ray_first(tiny_model: Path,
                                                                                  tmp_path: Path) -> None:
    """A script that imports ray before calling ``detect_dataset`` (no address: a cluster started for the run):
    the frames run. Ray's GCS had refused the driver with an AuthenticationError traceback: the token mode set
    for the cluster's processes after Ray had read its settings on import."""
    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    write_frames(tmp_path / "frames", tiny_model, {"000001": 50, "000002": 60})
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    done = subprocess.run([sys.executable, "-c", _RAY_IMPORTED_FIRST, str(tmp_path / "frames"), str(tiny_model),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=env)
    assert (done.returncode, done.stdout) == (0, "2 []\n"), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["000001.json", "000002.json"]


def test_a_cpu_workers_calls_are_a_few_frames_so_their_rows_reach_the_driver_within_seconds() -> None:
    """A CPU frame takes seconds on a small machine, and the driver gets a call's rows only at its end (all a stop
    keeps): a CPU call is about 8 frames (a multiple of its batch x pipelines, which it fills), where a GPU call
    stays 32 batches (8 for URIs, whose bytes travel with the block)."""
    from pointpillars_trt.apps.distributed import frames_per_call

    assert [frames_per_call(n, False, False) for n in (1, 3, 8, 16)] == [8, 9, 8, 16]
    assert frames_per_call(1, False, True) == 8
    assert (frames_per_call(32, True, False), frames_per_call(32, True, True)) == (1024, 256)


def test_the_ray_address_help_names_ray_address_as_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    from pointpillars_trt.apps.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["infer", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: $RAY_ADDRESS's cluster where it is set, else a local one)" in text, text


def test_the_ray_help_names_a_workers_detectors_and_the_cpu_default_of_workers(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A worker opens --pipelines detectors (4 on the GPU by default), not one; a cluster without GPUs starts one
    worker per 2 of its CPUs (check_resources({"CPU": 8.0}, None, None) gives 4 in test_distributed_summary), which
    GPUs / --gpus-per-worker, a division by 0 there, does not say."""
    from pointpillars_trt.apps.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["infer", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one detector per worker" not in text, text
    assert "each worker a process of --pipelines detectors" in text, text
    assert "workers on the CPU: one per 2 of its CPUs" in text, text
    assert "0 (CPU: the default on a cluster without GPUs)" in text, text


@pytest.mark.parametrize(("workers_stopped", "local", "swept"), [(True, True, True), (False, False, False),
                                                                 (True, False, False)])
def test_a_stop_removes_cut_writes_only_once_a_local_clusters_workers_are_stopped(  # type: ignore[no-untyped-def]
        tmp_path: Path, workers_stopped: bool, local: bool, swept: bool) -> None:
    """A stop of a joined cluster's run: its workers may still write (their temp files in use), or run on
    another host, whose pids say nothing here: their temp files are left to a later run."""
    import subprocess
    import sys

    from pointpillars_trt.apps.distributed import _say_outputs_on_disk
    from pointpillars_trt.file_writes import TEMP_SUFFIX

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    temp = tmp_path / f".000001.json.{ended.pid}.abcd{TEMP_SUFFIX}"
    temp.write_text("{")
    said: list[str] = []
    _say_outputs_on_disk(tmp_path, ["000001.bin"], [".json"], {}, said.append, None, workers_stopped, local)
    assert temp.exists() != swept and len(said) == 1, said


def test_a_cpu_workers_pipelines_share_its_cpus_when_no_thread_count_is_asked() -> None:
    """Each pipeline of a CPU worker gets its share of the worker's share of the cluster (at least one thread)."""
    from pointpillars_trt.apps.distributed import worker_pipeline_threads

    assert [worker_pipeline_threads(16.0, 2, pipelines) for pipelines in (1, 2, 3, 16)] == [8, 4, 2, 1]
    assert worker_pipeline_threads(2.0, 4, 1) == 1


def test_a_stop_raised_inside_ray_datas_iteration_lets_go_of_it_before_the_cluster_is_shut_down() -> None:
    """A Ctrl-C or SIGTERM that lands inside Ray Data's iteration leaves its frames, and the iterator they hold, to
    the stop's traceback: its threads ran on past ``ray.shutdown()``, and a call into Ray from one of them, or an
    object reference freed later, ended ``infer --ray`` with exit code 1 and no stop line. Released first, the
    iterator is closed and its thread (Ray Data's name, as it stops once its iterator is closed) has ended."""
    import threading

    from pointpillars_trt.apps.distributed import RAY_DATA_ITERATION_THREAD, _release_ray_objects

    stopped = threading.Event()
    thread = threading.Thread(target=stopped.wait, args=(30,), name=RAY_DATA_ITERATION_THREAD, daemon=True)

    def iteration():  # type: ignore[no-untyped-def]
        thread.start()
        try:
            yield 1
        finally:
            stopped.set()

    def next_batch() -> None:  # the frame the stop lands in holds the iterator
        batches = iteration()
        next(batches)
        raise KeyboardInterrupt

    ended: BaseException | None = None
    try:
        next_batch()
    except KeyboardInterrupt as exc:
        ended = exc
    assert ended is not None and thread.is_alive() and not stopped.is_set()
    _release_ray_objects(ended)
    assert stopped.is_set() and not thread.is_alive()
