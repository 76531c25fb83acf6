"""``detect_dataset`` on a real local Ray cluster (2 CPUs): the outputs of local ``infer``, frame for frame.

Oracle: the ``infer`` command run in this process on the same folder (JSON files byte-identical; the
Parquet rows equal its JSON records; a checkpoint read as often as it reads it: once). The folder holds
one corrupt frame, which must become an error record while the other frames go on. Without Ray
installed, these tests skip.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from notices import published_config_notice
from out_folder import output_names
from pointpillars_trt.apps.cli import main as cli_main
from pointpillars_trt.apps.serve.cli import run_scaleout_infer
from pointpillars_trt.errors import CpuFallbackWarning, InputError
from pointpillars_trt.kitti import write_velodyne_bin
from pointpillars_trt.runtime_options import RuntimeOptions

pytestmark = pytest.mark.slow  # a real local Ray cluster per module: end to end, tens of seconds

CHECKPOINT = "checkpoints/pointpillar_openpcdet_synthetic.pth"
CORRUPT = "corrupt.bin"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The module's local cluster; the file where each of its worker processes writes a line for each detector it
    opens (``counting_detector_opens``)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the local cluster on loopback only
    ray = pytest.importorskip("ray", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    opens = tmp_path_factory.mktemp("opens") / "detectors"
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False,  # the CPU path, GPU or not
             runtime_env={"worker_process_setup_hook": counting_detector_opens(str(opens))})
    try:
        yield opens
    finally:
        ray.shutdown()


def ray_cpu_fallback() -> pytest.WarningsChecker:
    """Around a ``detect_dataset`` run with device auto on the module's cluster, which has no GPUs: the
    ``CpuFallbackWarning`` it says of its one worker, as a detector says its own fallback."""
    return pytest.warns(CpuFallbackWarning,
                        match=r"^device auto: running on Ray: 1 worker on the CPU \(the Ray cluster has no GPUs\)$")


def counting_detector_opens(path: str) -> Callable[[], None]:
    """A setup hook for the cluster's worker processes: each detector a worker opens, as the real
    ``PointPillars.from_model_dir`` opens it, adds a line ``PID BATCH THREADS MODEL_DIR`` to ``path`` (THREADS: its
    CPU threads, None where none were set). Nested, so that Ray sends it by value: the workers cannot import this
    module."""
    def count_detector_opens() -> None:
        from pointpillars_trt.detector import PointPillars

        real = PointPillars.from_model_dir.__func__  # type: ignore[attr-defined]

        def counted(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
            detector = real(cls, *args, **kwargs)
            with open(path, "a") as opened:
                opened.write(f"{os.getpid()} {detector.options.max_batch} {detector.options.threads} "
                             f"{detector.model.path}\n")
            return detector

        PointPillars.from_model_dir = classmethod(counted)  # type: ignore[method-assign, assignment]

    return count_detector_opens


def detectors_opened(opens: Path, model: Path) -> list[list[int]]:
    """The batch of each detector of ``model`` the workers opened (``ray_cluster``'s file), one list a worker: a model
    dir of its own tells a run's detectors from those a worker of an earlier run opened as that run ended."""
    by_worker: dict[str, list[int]] = {}
    for pid, batch, _ in detector_opens(opens, model):
        by_worker.setdefault(pid, []).append(batch)
    return sorted(by_worker.values())


def detector_opens(opens: Path, model: Path) -> list[tuple[str, int, str]]:
    """(worker pid, batch, CPU threads) of each detector of ``model`` the workers opened (``ray_cluster``'s file)."""
    found = []
    for line in opens.read_text().splitlines() if opens.exists() else []:
        pid, batch, threads, path = line.split(" ", 3)
        if Path(path).resolve() == model.resolve():
            found.append((pid, int(batch), threads))
    return found


def detect_actors() -> set[str]:
    """The IDs of the detector actors the module's cluster has created, running or ended: Ray's actor table holds an
    actor from its creation on, whether or not it got as far as opening its detectors (a run may end first)."""
    import ray

    table = ray._private.state.actors()  # read from the cluster's control store: no dashboard needed
    return {actor_id for actor_id, actor in table.items() if "_DetectActor" in actor["ActorClassName"]}


def local_infer(frames: Path, model: Path, out: Path, *options: str, code: int = 1) -> tuple[str, str]:
    """The reference: ``pointpillars-trt infer FOLDER --out OUT --device cpu`` (exit ``code``, 1: the corrupt
    frame); its (stdout, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = cli_main(["infer", str(frames), "--model", str(model), "--out", str(out), "--device", "cpu",
                       "--no-progress", *options])
    assert rc == code, stderr.getvalue()
    return stdout.getvalue(), stderr.getvalue()


def ray_infer(frames: Path | str | list[str], model: Path, out: Path, *options: str) -> tuple[int, str, str]:
    """``infer FOLDER --ray --batch-size 2`` (FOLDER: one path or URI, or a list of them; the workers the cluster's
    default, one on its 2 CPUs: more, given, would be cut to a run's calls and said) as the CLI parses it: (exit code,
    stdout, stderr)."""
    from pointpillars_trt.apps.cli import build_parser

    paths = [str(frame) for frame in frames] if isinstance(frames, list) else [str(frames)]
    args = build_parser().parse_args(["infer", *paths, "--model", str(model), "--out", str(out), "--device",
                                      "cpu", "--no-progress", "--ray", "--batch-size", "2",
                                      *options])
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = run_scaleout_infer(args)
    return rc, *_cluster_lines_to_stderr(stdout.getvalue(), stderr.getvalue())


def _cluster_lines_to_stderr(out: str, err: str) -> tuple[str, str]:
    """(stdout, stderr) with the lines Ray's driver printed of the module's shared cluster ("(raylet) A worker
    died ...", as Ray Data ends a run's actors) moved to stderr: that cluster outlives the run, so its messages
    can come after infer's own redirect of them has closed (infer's own cluster is shut down before)."""
    lines = out.splitlines(keepends=True)
    ray_lines = [line for line in lines if "(raylet)" in line]
    return "".join(line for line in lines if "(raylet)" not in line), err + "".join(ray_lines)


def cli_ray_infer(frames: Path | str | list[str], model: Path, out: Path, *options: str) -> tuple[int, str, str]:
    """``ray_infer`` through the command line's entry, which turns an InputError into its one ``error:`` line."""
    paths = [str(frame) for frame in frames] if isinstance(frames, list) else [str(frames)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = cli_main(["infer", *paths, "--model", str(model), "--out", str(out), "--device", "cpu", "--no-progress",
                       "--ray", "--workers", "1", *options])
    return rc, *_cluster_lines_to_stderr(stdout.getvalue(), stderr.getvalue())


def report_lines(out: str, err: str, out_dir: Path) -> list[str]:
    """infer's stdout and stderr lines, without the run's rates, with its --out folder named OUT, and
    without local infer's line on the device it runs on (Ray's workers run elsewhere) or the lines Ray prints
    of its cluster ("(raylet) A worker died ...": a task it retried elsewhere)."""
    return [re.sub(r" \([0-9.]+ frames/s\)$", "", line).replace(str(out_dir), "OUT")
            for line in (out + err).splitlines()
            if "frames/s with" not in line and not line.startswith("running on ") and "(raylet)" not in line]


#: The opens seen of each watched file (absolute path), while ``opens_of`` blocks run.
_WATCHED: dict[str, list[tuple[object, ...]]] = {}


def _record_open(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], (str, os.PathLike)):
        opens = _WATCHED.get(os.path.abspath(os.fspath(args[0])))
        if opens is not None:
            opens.append(args)


@functools.cache
def _watch_opens() -> None:
    sys.addaudithook(_record_open)  # for the life of the process: installed once, recording only while watched


@contextlib.contextmanager
def opens_of(path: Path) -> Iterator[list[tuple[object, ...]]]:
    """Each open of ``path`` in this process while the block runs (Python's "open" audit event, raised
    by open() and os.open whoever calls them)."""
    _watch_opens()
    key = os.path.abspath(path)
    opens: list[tuple[object, ...]] = []
    _WATCHED[key] = opens
    try:
        yield opens
    finally:
        del _WATCHED[key]


def with_corrupt_frame(folder: Path) -> Path:
    (folder / CORRUPT).write_bytes(b"\0" * 10)  # not a multiple of 16 bytes
    return folder


@pytest.fixture(scope="module")
def kitti_folder(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kitti_frames")
    for path in sorted((assets / "kitti/training/velodyne_fov").glob("*.bin"))[:4]:
        shutil.copy(path, folder / path.name)
    return with_corrupt_frame(folder)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny import tiny_model_dir

    return Path(tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", seed=3).path)


def write_frames(folder: Path, model: Path, counts: dict[str, int], seed: int = 0) -> None:
    """Frames NAME.bin of COUNT points spread over the model's point range."""
    from pointpillars_trt.model_dir import load_model_dir

    point_range = load_model_dir(model).cfg.voxel.point_range
    rng = np.random.default_rng(seed)
    lo, hi = np.array(point_range[:3]), np.array(point_range[3:])
    folder.mkdir(exist_ok=True)
    for name, n in counts.items():
        write_velodyne_bin(np.column_stack([rng.uniform(lo, hi, (n, 3)), rng.uniform(0, 1, n)]).astype(np.float32),
                           folder / f"{name}.bin")


def assert_same_json_files(ours: Path, reference: Path) -> list[str]:
    """Both folders hold the same outputs, byte for byte (infer's settings record aside: ``detect_dataset`` of
    the Python API keeps none); their names."""
    names = output_names(reference)
    assert output_names(ours) == names
    for name in names:
        assert (ours / name).read_bytes() == (reference / name).read_bytes(), name
    return names


def test_infer_ray_with_the_tiny_model_equals_local_infer_and_reports_the_corrupt_frame(ray_cluster,  # type: ignore[no-untyped-def]
                                                                                       tiny_model: Path,
                                                                                       tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": n for index, n in enumerate((0, 40, 900, 3000, 77))})
    write_velodyne_bin(np.full((200, 4), np.nan, np.float32), folder / "000005.bin")  # a frame warning, said
    with_corrupt_frame(folder)
    local = local_infer(folder, tiny_model, tmp_path / "local")
    rc, out, err = ray_infer(folder, tiny_model, tmp_path / "ray")
    assert rc == 1 and out.startswith("6/7 frames, 0 boxes, written to"), out
    assert f"warning: '{folder / '000005.bin'}': all its 200 points are non-finite" in err, err  # as local infer's
    assert "running on Ray: 1 worker on the CPU\n" in err, err  # --device cpu: where the frames run, said
    assert f"error: point file '{folder / CORRUPT}' is 10 bytes, not a multiple of 16" in err, err  # named once
    rates = re.search(r"([0-9.]+) frames/s with 1 worker \(([0-9.]+) frames/s from the workers' first call on",
                      err)
    assert rates is not None, err
    assert float(rates[2]) > float(rates[1])  # the second leaves the actors' start (the model's load) out
    assert report_lines(out, err, tmp_path / "ray") == report_lines(*local, tmp_path / "local")
    assert len(assert_same_json_files(tmp_path / "ray", tmp_path / "local")) == 6
    assert "--no-tf32" not in err, err
    rc, out, err = ray_infer(folder, tiny_model, tmp_path / "rows", "--format", "jsonl", "--no-tf32")
    assert rc == 1 and out.startswith(f"6/7 frames, 0 boxes, written to {tmp_path / 'rows'}"), out  # the part files' folder
    assert err.count("note: --no-tf32 changes nothing on the CPU") == 1, err  # the workers' CPU: said once, as locally


#: The mtime (ns) the first run's outputs are set back to: a file the resumed run rewrites gets another.
LONG_AGO = 1_000_000_000 * 10**9


def state_of(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_ray_run_resumed_with_skip_existing_runs_only_the_frames_whose_outputs_are_missing(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """Of a finished Ray run's JSON files one is deleted and one cut short (as a kill outside the run leaves
    them); ``--ray --skip-existing`` reruns those two frames alone (the other files keep their bytes and
    their mtime, set long ago), says what it found and counts what ran as local infer's resume of the same
    folder does, and leaves the files a full local infer writes. A rerun then finds every frame done: exit
    0, said, without importing Ray (blocked in its interpreter) or reading --model (a file of no model)."""
    import subprocess

    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": n for index, n in enumerate((900, 3000, 40, 1500, 77))})
    local_infer(folder, tiny_model, tmp_path / "local", code=0)
    out = tmp_path / "ray"
    rc, _, err = ray_infer(folder, tiny_model, out)
    assert rc == 0, err
    (out / "000001.json").unlink()
    cut = out / "000003.json"
    cut.write_bytes(cut.read_bytes()[:20])
    for path in out.iterdir():
        os.utime(path, ns=(LONG_AGO, LONG_AGO))
    shutil.copytree(out, tmp_path / "local_resumed")  # local infer resumes the same folder: what it says
    local = local_infer(folder, tiny_model, tmp_path / "local_resumed", "--skip-existing", code=0)

    rc, stdout, err = ray_infer(folder, tiny_model, out, "--skip-existing")
    assert rc == 0 and stdout.startswith(f"2/2 frames, 0 boxes, written to {out}"), (stdout, err)
    assert f"skipping 3 frames whose outputs are already in {out}\n" in err, err
    assert f"redoing the frames of 1 empty, incomplete or foreign output file in {out} ('000003.json')" in err
    assert re.search(r"[0-9.]+ frames/s with 1 worker \(", err), err
    assert report_lines(stdout, err, out) == report_lines(*local, tmp_path / "local_resumed")
    rewritten = sorted(name for name, (_, mtime) in state_of(out).items() if mtime != LONG_AGO)
    assert rewritten == ["000001.json", "000003.json"]
    assert len(assert_same_json_files(out, tmp_path / "local")) == 5
    from pointpillars_trt.apps.run_settings import SETTINGS_FILE

    record = json.loads((out / SETTINGS_FILE).read_text())  # the driver records the run as local infer does
    assert record["outputs"] == json.loads((tmp_path / "local" / SETTINGS_FILE).read_text())["outputs"]
    assert record["outputs"]["json"]["settings"]["--model"]["weights"] == {"random_seed": 3, "tiny": True}

    before = state_of(out)  # every frame done, of the recorded settings: no cluster, no Ray (it cannot import)
    script = ("import sys; sys.modules['ray'] = None; from pointpillars_trt.apps.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    done = subprocess.run([sys.executable, "-c", script, "infer", str(folder), "--model", str(tiny_model), "--out",
                           str(out), "--device", "cpu", "--no-progress", "--ray", "--workers", "2", "--skip-existing"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0/0 frames to run (5 skipped: their outputs were there), 0 boxes, nothing written\n"
    assert done.stderr == f"skipping 5 frames whose outputs are already in {out}\n"
    assert state_of(out) == before
    other = subprocess.run([sys.executable, "-c", script, "infer", str(folder), "--model", str(tiny_model), "--out",
                            str(out), "--device", "cpu", "--no-progress", "--ray", "--skip-existing",
                            "--score-threshold", "0.2"], capture_output=True, text=True, timeout=120, env=env)
    assert other.returncode == 2 and other.stderr.startswith(  # other settings: refused, still without Ray
        f"error: --skip-existing: the outputs in {str(out)!r} were made with other settings (--score-threshold "), other
    assert state_of(out) == before


def test_a_ray_jsonl_run_resumed_with_retry_failed_reruns_the_failed_and_new_frames_into_a_new_part(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """Rows: a first run's part holds a failed frame's row; once that frame is mended and two frames are added,
    ``--ray --skip-existing --retry-failed`` removes the failed row from that part (its other lines kept byte
    for byte), runs the three frames without a row into the next part (never over the first), and says and
    writes what local infer's resume of the same folder does, byte for byte."""
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 900, "000001": 3000})
    with_corrupt_frame(folder)
    local_infer(folder, tiny_model, tmp_path / "local", "--format", "jsonl")
    out = tmp_path / "ray"
    rc, _, err = ray_infer(folder, tiny_model, out, "--format", "jsonl")
    assert rc == 1, err
    first = (out / "detections-00000.jsonl").read_text().splitlines()
    assert [json.loads(line)["error"] is None for line in first] == [True, True, False]
    write_frames(folder, tiny_model, {"000002": 40, "000003": 1500, "corrupt": 500}, seed=1)

    resumed = ("--format", "jsonl", "--skip-existing", "--retry-failed")
    local = local_infer(folder, tiny_model, tmp_path / "local", *resumed, code=0)
    rc, stdout, err = ray_infer(folder, tiny_model, out, *resumed)
    assert rc == 0 and stdout.startswith(f"3/3 frames, 0 boxes, written to {out}"), (stdout, err)
    assert f"skipping 2 frames whose outputs are already in {out}\n" in err, err
    assert (f"rerunning 1 frame that failed in an earlier run: its row is removed from the part files in "
            f"{out}\n") in err, err
    assert report_lines(stdout, err, out) == report_lines(*local, tmp_path / "local")
    assert assert_same_json_files(out, tmp_path / "local") == ["detections-00000.jsonl", "detections-00001.jsonl"]
    assert (out / "detections-00000.jsonl").read_text().splitlines() == first[:2]
    rows = [json.loads(line) for line in (out / "detections-00001.jsonl").read_text().splitlines()]
    assert [(Path(row["source"]).name, row["error"]) for row in rows] == [("000002.bin", None), ("000003.bin", None),
                                                                          (CORRUPT, None)]


def test_infer_ray_kitti_with_the_sibling_calib_folder_equals_local_infer(ray_cluster, assets: Path,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    velodyne, calib = tmp_path / "training" / "velodyne", tmp_path / "training" / "calib"
    velodyne.mkdir(parents=True)
    calib.mkdir()
    for frame_id in ("000000", "000001", "000002", "000003"):
        shutil.copy(assets / "kitti/training/velodyne_fov" / f"{frame_id}.bin", velodyne)
        if frame_id != "000003":  # a frame without its calib file: that frame's error line
            shutil.copy(assets / "kitti/training/calib" / f"{frame_id}.txt", calib)
    with_corrupt_frame(velodyne)
    model = assets / CHECKPOINT
    with opens_of(model) as local_reads:
        local = local_infer(velodyne, model, tmp_path / "local", "--format", "kitti")
    with opens_of(model) as ray_reads:
        rc, out, err = ray_infer(velodyne, model, tmp_path / "ray", "--format", "kitti")
    assert len(ray_reads) == len(local_reads) == 1  # the checkpoint is read once; the workers open its model dir
    assert rc == 1 and out.startswith("3/5 frames"), (out, err)
    assert "has no file for frame id '000003'" in err and "2 of 5 frames failed" in err
    assert report_lines(out, err, tmp_path / "ray") == report_lines(*local, tmp_path / "local")
    names = assert_same_json_files(tmp_path / "ray", tmp_path / "local")
    assert names == ["000000.txt", "000001.txt", "000002.txt"]
    assert all((tmp_path / "ray" / name).read_text().strip() for name in names)


def test_kitti_frames_json_and_parquet_equal_local_infer(ray_cluster, assets: Path, kitti_folder: Path,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from pointpillars_trt.apps.distributed import detect_dataset

    model = assets / CHECKPOINT
    local_infer(kitti_folder, model, tmp_path / "local")
    with ray_cpu_fallback():
        summary = detect_dataset([str(kitti_folder)], model, tmp_path / "ray", workers=1, gpus_per_worker=0,
                                 progress=False)
    names = assert_same_json_files(tmp_path / "ray", tmp_path / "local")
    records = {Path(n).stem: json.loads((tmp_path / "local" / n).read_text()) for n in names}
    assert summary.boxes == sum(len(r["scores"]) for r in records.values()) > 0
    assert [Path(source).name for source, _ in summary.failures] == [CORRUPT]

    with ray_cpu_fallback():
        summary = detect_dataset(str(kitti_folder / "*.bin"), model, tmp_path / "parquet", workers=1,
                                 gpus_per_worker=0, output_format="parquet", progress=False)
    rows = {row["frame"]: row for row in pq.read_table(sorted((tmp_path / "parquet").glob("*.parquet"))).to_pylist()}
    assert sorted(rows) == sorted([*records, Path(CORRUPT).stem]) and summary.frames == len(rows)
    assert rows["corrupt"]["error"] and rows["corrupt"]["boxes_lidar"] == []
    for frame, record in records.items():
        row = rows[frame]
        assert row["error"] is None and row["source"] == str(kitti_folder / f"{frame}.bin")
        assert {key: row[key] for key in record} == record, frame

    # JSON Lines: the very bytes local `infer --format jsonl` writes
    local_infer(kitti_folder, model, tmp_path / "local_jsonl", "--format", "jsonl")
    with ray_cpu_fallback():
        detect_dataset([str(kitti_folder)], model, tmp_path / "ray_jsonl", workers=1, gpus_per_worker=0,
                       output_format="jsonl", progress=False)
    assert assert_same_json_files(tmp_path / "ray_jsonl", tmp_path / "local_jsonl") == ["detections-00000.jsonl"]


def test_a_cache_entry_built_with_other_launch_values_runs_with_those_of_the_config_it_was_opened_with(  # type: ignore[no-untyped-def]
        ray_cluster, assets: Path, kitti_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint's cache entry was built for a config that differs from its own only in its launch values,
    which the entry's model.json holds: the workers, which reopen the entry by path, run the values of the
    checkpoint's own config, as local infer does (which opens the entry with them)."""
    from pointpillars_trt.apps.distributed import detect_dataset
    from pointpillars_trt.config import load_config
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    model = assets / CHECKPOINT
    model_dir_for_checkpoint(model, config=load_config("openpcdet_kitti_3class").with_thresholds(max_boxes=1))
    local_infer(kitti_folder, model, tmp_path / "local")
    with ray_cpu_fallback():
        detect_dataset([str(kitti_folder)], model, tmp_path / "ray", workers=1, gpus_per_worker=0, progress=False)
    names = assert_same_json_files(tmp_path / "ray", tmp_path / "local")
    assert max(len(json.loads((tmp_path / "local" / name).read_text())["scores"]) for name in names) > 1


def test_config_and_precision_name_the_model_the_workers_run_as_they_do_locally(  # type: ignore[no-untyped-def]
        ray_cluster, assets: Path, kitti_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--config`` and ``--precision`` name the model local infer exports from a checkpoint, and ``--config`` the
    launch values a model dir of its digest runs with: the workers ran the checkpoint's default config in fp32,
    and a model dir's own thresholds, whatever the run named (19 boxes of a frame where local infer kept 5).
    fp16 graphs on the CPU workers are said as local infer says them of its CPU detector."""
    import pointpillars_trt
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    checkpoint = assets / CHECKPOINT
    strict = tmp_path / "strict.yaml"  # the checkpoint's own config but for its score threshold
    own = Path(pointpillars_trt.__file__).parent / "configs" / "openpcdet_kitti_3class.yaml"
    strict.write_text(re.sub(r"(?m)^(\s*score_threshold:).*$", r"\1 0.6", own.read_text()))
    with published_config_notice(checkpoint):  # the cache entry is built here
        model_dir = model_dir_for_checkpoint(checkpoint).path
    for name, model, options in (("config", checkpoint, ("--config", str(strict))),
                                 ("precision", checkpoint, ("--precision", "fp16")),
                                 ("dir_config", model_dir, ("--config", str(strict)))):
        _, local_err = local_infer(kitti_folder, model, tmp_path / f"local_{name}", *options)
        rc, _, err = ray_infer(kitti_folder, model, tmp_path / f"ray_{name}", *options)
        assert rc == 1, err
        assert assert_same_json_files(tmp_path / f"ray_{name}", tmp_path / f"local_{name}"), name
        fp16 = "note: fp16 graphs run no faster than fp32 on the CPU"  # said of the CPU workers, as locally (it was not)
        assert local_err.count(fp16) == err.count(fp16) == (name == "precision"), (local_err, err)
    plain = tmp_path / "local_plain"
    local_infer(kitti_folder, checkpoint, plain)
    for name in ("config", "precision"):  # each option changes what local infer writes: the comparison can fail
        assert any((plain / n).read_bytes() != (tmp_path / f"local_{name}" / n).read_bytes()
                   for n in output_names(plain)), name


def test_multi_sweep_frames_with_velocities_equal_local_infer(ray_cluster, nuscenes: Path,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path) -> None:
    """The nuScenes multi-head model: Ray's workers read the frames with 5 values a point and write the
    JSON files (class names, velocities) local infer writes; frames given as URIs (Ray Data reads their
    bytes) give the same records."""
    folder = tmp_path / "frames"
    folder.mkdir()
    for name in ("nusc_dev_k000000_s05.bin", "nusc_dev_k000002_s02.bin"):
        shutil.copy(nuscenes / name, folder)
    with_corrupt_frame(folder)
    model = nuscenes / "cbgs_pp_multihead_synthetic_dev.pth"
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    with warnings.catch_warnings(record=True):  # the entry built here, if not yet (its note said here): so that
        model_dir_for_checkpoint(model)        # neither run below builds it and says what the other does not
    local = local_infer(folder, model, tmp_path / "local", "--point-dim", "5")
    rc, out, err = ray_infer(folder, model, tmp_path / "ray", "--point-dim", "5")
    assert rc == 1 and out.startswith("2/3 frames"), (out, err)
    assert report_lines(out, err, tmp_path / "ray") == report_lines(*local, tmp_path / "local")
    names = assert_same_json_files(tmp_path / "ray", tmp_path / "local")
    assert json.loads((tmp_path / "ray" / names[0]).read_text())["velocity"]

    from pointpillars_trt.apps.distributed import detect_dataset

    uris = [f"file://{folder / name}" for name in ("nusc_dev_k000000_s05.bin", "nusc_dev_k000002_s02.bin")]
    with ray_cpu_fallback():
        summary = detect_dataset(uris, model, tmp_path / "uris", workers=1, gpus_per_worker=0, point_dim=5,
                                 output_format="jsonl", progress=False)
    assert summary.frames == 2 and not summary.failures, summary.failures
    rows = [json.loads(line) for line in next((tmp_path / "uris").glob("*.jsonl")).read_text().splitlines()]
    for row, name in zip(rows, names):
        record = json.loads((tmp_path / "local" / name).read_text())
        assert row["velocity"] == record["velocity"] and row["labels"] == record["labels"]


def test_a_ray_frame_whose_picture_cannot_replace_its_earlier_one_counts_the_record_it_replaced(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """A worker's write whose record was renamed into place before its picture's rename failed (the earlier picture
    held by a bind mount: busy): the frame's error line names the record, and the driver's summary counts it as
    local infer's does, from the count the frame's record carries."""
    import subprocess

    pytest.importorskip("matplotlib", reason="--viz needs matplotlib")
    folder, out = tmp_path / "frames", tmp_path / "out"
    write_frames(folder, tiny_model, {"000000": 300})
    rc, _, err = ray_infer(folder, tiny_model, out, "--viz")
    assert rc == 0, err
    picture, record = out / "000000.png", out / "000000.json"
    held = tmp_path / "held.png"
    held.write_bytes(picture.read_bytes())
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(held), str(picture)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to bind-mount a file")
    try:
        rc, stdout, err = ray_infer(folder, tiny_model, out, "--viz")
    finally:
        subprocess.run(["umount", str(picture)], check=False)
    assert rc == 1 and f"({str(record)!r}: 1 file of an earlier run replaced with this run's before that;" in err, err
    assert stdout.startswith("0/1 frames, 0 boxes, nothing written but 1 file of an earlier run replaced (named "
                             "above)\n"), (stdout, err)


def test_infer_ray_reads_a_file_uri_of_a_folder_as_local_infer_reads_the_folder(ray_cluster, assets: Path,  # type: ignore[no-untyped-def]
                                                                              kitti_folder: Path, tmp_path: Path) -> None:
    """A ``file://`` URI (Ray Data lists and reads it, as it reads ``s3://``) of a folder of KITTI frames, one of
    them corrupt: the rows local ``infer`` writes of the folder, byte for byte (sources, boxes, the corrupt
    frame's error), and the lines it says."""
    model = assets / CHECKPOINT
    local = local_infer(kitti_folder, model, tmp_path / "local", "--format", "jsonl")
    rc, out, err = ray_infer(f"file://{kitti_folder}", model, tmp_path / "ray", "--format", "jsonl")
    assert rc == 1 and out.startswith("4/5 frames, "), (out, err)
    assert report_lines(out, err, tmp_path / "ray") == report_lines(*local, tmp_path / "local")
    assert assert_same_json_files(tmp_path / "ray", tmp_path / "local") == ["detections-00000.jsonl"]


def test_a_file_uri_gets_the_camera_view_crop_and_kitti_lines_of_local_infer(ray_cluster, assets: Path,  # type: ignore[no-untyped-def]
                                                                            tmp_path: Path) -> None:
    """KITTI lines of a ``file://`` URI's frames, cropped to the camera view by default, as local infer writes
    them of the folder (each frame's sibling calib/ found by the path Ray Data lists it by; every frame failed
    "a frame read from a URI has no calib"); a URI of another file system without --calib is one error line
    before the cluster is asked for anything."""
    velodyne = tmp_path / "training" / "velodyne"
    velodyne.mkdir(parents=True)
    shutil.copytree(assets / "kitti" / "training" / "calib", tmp_path / "training" / "calib")
    for name in ("000000.bin", "000001.bin"):
        shutil.copy(assets / "kitti" / "training" / "velodyne" / name, velodyne / name)
    model = assets / CHECKPOINT
    local_infer(velodyne, model, tmp_path / "local", "--format", "kitti", code=0)
    rc, out, err = ray_infer(f"file://{velodyne}/", model, tmp_path / "ray", "--format", "kitti")
    assert rc == 0 and out.startswith("2/2 frames"), (out, err)
    assert assert_same_json_files(tmp_path / "ray", tmp_path / "local") == ["000000.txt", "000001.txt"]
    rc, out, err = cli_ray_infer("s3://bucket/velodyne/", model, tmp_path / "s3", "--format", "kitti")
    assert (rc, out) == (2, "") and err.splitlines()[-1].startswith(
        "error: 's3://bucket/velodyne/': the camera-FOV crop and KITTI lines need each frame's calib file"), err


def test_frames_of_a_uri_are_checked_before_the_run_as_local_frames_are(ray_cluster, tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                           tmp_path: Path) -> None:
    """What infer checks of local frames before the run, checked of a URI's frames once Ray Data has listed
    them: a frame whose output file another frame's would be, and a frame given twice (by a folder URI and a
    URI of a file in it), are each one error line and exit code 2 before any frame runs or is written."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_frames(first, tiny_model, {"000000": 900, "000001": 40})
    write_frames(second, tiny_model, {"000001": 3000}, seed=1)
    for paths, expected in (
            ([f"file://{first}", str(second)],
             f"error: frames '{first / '000001.bin'}' and '{second / '000001.bin'}' would write the same output file "
             "'000001.json' (1 such name); run them into separate --out folders\n"),
            ([f"file://{first}", f"file://{first / '000001.bin'}"],
             f"error: frame '{first / '000001.bin'}' is given twice (by two arguments, a folder and a file in it, or a "
             "symbolic link to it): give each frame once\n")):
        rc, out, err = cli_ray_infer(paths, tiny_model, tmp_path / "json")
        assert (rc, out, err) == (2, "", expected), (out, err)
        assert not (tmp_path / "json").exists() or not any((tmp_path / "json").iterdir())


def test_a_folder_uri_gives_its_point_files_as_a_local_folder_does(ray_cluster, tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    """A folder URI's frames are the point files directly in it, in name order, as local infer lists a folder:
    a subfolder's frames, a notes file and a picture are left out (Ray Data's listing holds them all); a
    ``.npy`` in it is a frame, whose read as ``.bin`` is its error line; a FIFO named as a point file, which
    Ray Data's listing leaves out without a word, is a failed frame as in local infer (its error line and row);
    a URI of a folder that holds no point file is one error line before the run."""
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000002": 50, "000000": 900, "000001": 40})
    write_frames(folder / "sub", tiny_model, {"000003": 60})
    (folder / "notes.txt").write_text("drive 42\n")
    (folder / "000000.png").write_bytes(b"\x89PNG")
    np.save(folder / "000009.npy", np.zeros((10, 4), np.float32))
    os.mkfifo(folder / "000005.bin")
    rc, out, err = ray_infer(f"file://{folder}", tiny_model, tmp_path / "rows", "--format", "jsonl")
    assert rc == 1 and out.startswith("3/5 frames"), (out, err)
    fifo_error = f"error: point file '{folder / '000005.bin'}' is a FIFO (named pipe), not a regular file"
    assert [line for line in err.splitlines() if line.startswith("error:")] == [fifo_error,
        f"error: point file '{folder / '000009.npy'}': a frame read from a URI is read as a .bin file (rows of float32 "
        "values), and this one is not: give other frames as local paths"], err
    _, local_err = local_infer(folder, tiny_model, tmp_path / "local")
    assert fifo_error in local_err.splitlines(), local_err
    part = tmp_path / "rows" / "detections-00000.jsonl"
    rows = [json.loads(line) for line in part.read_text().splitlines()]
    assert [row["source"] for row in rows] == [str(folder / name) for name in (
        "000005.bin", "000000.bin", "000001.bin", "000002.bin", "000009.npy")]
    assert rows[0]["error"] == fifo_error.removeprefix("error: ") and rows[0]["scores"] == []
    fifo_uri = f"file://{folder / '000005.bin'}"  # named alone: Ray Data's listing took it for missing, ending the run
    rc, out, err = ray_infer([fifo_uri, f"file://{folder / '000001.bin'}"], tiny_model, tmp_path / "two")
    assert rc == 1 and out.startswith("1/2 frames"), (out, err)
    assert f"error: point file {fifo_uri!r} is a FIFO (named pipe), not a regular file" in err.splitlines(), err

    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("nothing\n")
    write_frames(empty / "sub", tiny_model, {"000004": 60})
    rc, out, err = cli_ray_infer(f"file://{empty}/", tiny_model, tmp_path / "none")
    assert (rc, out) == (2, ""), (out, err)
    assert err == (f"error: 'file://{empty}/': Ray Data lists no point file in it (.bin, .npy, .pcd, subfolders left "
                   "out, as infer lists a folder)\n"), err


def test_a_uri_ray_data_cannot_read_is_one_error_line(ray_cluster, tiny_model: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A URI of nothing, or of a scheme no file system reads, is one ``error:`` line and exit code 2 once Ray Data
    has tried to list it, before a worker starts or anything is written (no traceback, no Ray warning)."""
    frames = tmp_path / "frames"
    write_frames(frames, tiny_model, {"000000": 40})
    for uri, reason in ((f"file://{tmp_path / 'gone'}/", f"no such file or folder ('{tmp_path / 'gone'}')"),
                        ("nosuch://bucket/drive42/", "Unrecognized filesystem type in URI: nosuch://bucket/drive42/")):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli_main(["infer", uri, "--model", str(tiny_model), "--out", str(tmp_path / "out"), "--ray",
                           "--device", "cpu", "--workers", "1", "--no-progress"])
        assert rc == 2 and err.getvalue() == f"error: '{uri}': Ray Data cannot read it: {reason}\n", err.getvalue()
        assert not (tmp_path / "out").exists()


def test_missing_files_and_bad_options_are_reported_not_raised_deep_in_ray(ray_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tiny import tiny_model_dir

    from pointpillars_trt.apps.distributed import detect_dataset

    model = tiny_model_dir(tmp_path / "model")
    write_frames(tmp_path / "frames", model.path, {"a": 50})
    gone, frame = str(tmp_path / "gone.bin"), str(tmp_path / "frames" / "a.bin")
    with ray_cpu_fallback():
        summary = detect_dataset([gone, frame], model, tmp_path / "out", workers=1, gpus_per_worker=0, progress=False)
    assert summary.frames == 2 and [failure[0] for failure in summary.failures] == [gone]
    with pytest.raises(InputError, match="no path gives a frame"):  # no path at all: before the cluster is asked
        detect_dataset([gone], model, tmp_path / "out", workers=1, gpus_per_worker=0, progress=False)
    with pytest.raises(InputError, match="output_format 'csv'"):
        detect_dataset(str(tmp_path), model.path, tmp_path / "out", output_format="csv")
    with pytest.raises(InputError, match="workers 0"):
        detect_dataset([frame], model.path, tmp_path / "out", workers=0, gpus_per_worker=0)
    with pytest.raises(InputError, match="--gpus-per-worker 1: the Ray cluster has 0 GPUs; give --gpus-per-worker 0"):  # instead of waiting forever
        detect_dataset([frame], model.path, tmp_path / "out", workers=2, gpus_per_worker=1)
    with pytest.raises(InputError, match="--device cuda: the Ray cluster has no GPUs"):  # not the CPU without a word
        detect_dataset([frame], model.path, tmp_path / "out", runtime=RuntimeOptions(device="cuda"))
    with ray_cpu_fallback():
        detect_dataset([frame], model, tmp_path / "out", workers=1, progress=False)


def test_pathlib_paths_run_as_the_strings_they_name(ray_cluster, tiny_model: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A folder given as a ``pathlib.Path`` (as ``model`` and ``out`` are taken), alone or in a list, raised
    "TypeError: 'PosixPath' object is not iterable". Oracle: the same run given the folder's string."""
    from pointpillars_trt.apps.distributed import FrameSources, detect_dataset

    frames = tmp_path / "frames"
    write_frames(frames, tiny_model, {"a": 300, "b": 20})
    runs: dict[str, FrameSources] = {"str": str(frames), "Path": frames,
                                     "[Path, str]": [frames / "a.bin", str(frames / "b.bin")]}
    for name, given in runs.items():
        with ray_cpu_fallback():
            summary = detect_dataset(given, tiny_model, tmp_path / name, workers=1, gpus_per_worker=0, progress=False)
        assert summary.frames == 2 and summary.failures == [], (name, summary)
    for name in ("Path", "[Path, str]"):
        assert assert_same_json_files(tmp_path / name, tmp_path / "str") == ["a.json", "b.json"]


def test_a_ray_address_where_nothing_listens_is_one_error_not_minutes_of_retries() -> None:
    import socket

    from pointpillars_trt.apps.distributed import _check_reachable
    from pointpillars_trt.errors import BackendError

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        _check_reachable(f"127.0.0.1:{listening.getsockname()[1]}")  # answers: left to Ray
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            address = f"127.0.0.1:{closed.getsockname()[1]}"
            with pytest.raises(BackendError, match=rf"--ray-address {address}: no Ray cluster answers there"):
                _check_reachable(address)
    for left_to_ray in (None, "auto", "ray://head:10001"):
        _check_reachable(left_to_ray)
    with pytest.raises(InputError, match="'head:port': expected auto or HOST:PORT; give one, or leave --ray-address out$"):
        _check_reachable("head:port")


#: A child running ``infer --ray`` whose SIGTERM comes while Ray starts its local cluster: just after ``ray.init``
#: has put its own handler in place (which exits the start with code 15).
_SIGTERM_DURING_INIT = """
import os, signal, sys
import ray._private.utils as utils
set_handler = utils.set_sigterm_handler

def set_and_terminate(handler):
    set_handler(handler)
    os.kill(os.getpid(), signal.SIGTERM)

utils.set_sigterm_handler = set_and_terminate
from pointpillars_trt.apps.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_the_cluster_starts_ends_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM to ``infer --ray`` while ``ray.init`` starts its local cluster: one ``terminated`` line and exit
    code 143, as at any other moment of the run (Ray's start-up handler exited with 15 and no word)."""
    import signal
    import subprocess

    from tiny import tiny_model_dir

    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    model = tiny_model_dir(tmp_path / "model", seed=3)
    write_frames(tmp_path / "frames", model.path, {"000000": 40})
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", _SIGTERM_DURING_INIT, "infer", str(tmp_path / "frames"), "--model",
                           str(model.path), "--out", str(tmp_path / "out"), "--device", "cpu", "--no-progress", "--ray",
                           "--workers", "1"], env=env, capture_output=True, text=True, timeout=240)
    assert (done.returncode, done.stderr.splitlines()[-1:]) == (128 + signal.SIGTERM, ["terminated"]), done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_sigterm_stops_a_ray_run_as_ctrl_c_does_keeping_what_was_received(ray_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                           fmt: str) -> None:
    """SIGTERM to ``infer --ray`` (its own local cluster, in a child process) once the driver has received frames
    (the first frame's warning, said as its record arrives): a row run's rows received are written as a last part
    and said, a JSON run says the files its workers wrote, counted on disk once they are stopped; then one
    ``terminated`` line and exit code 143, as local infer ends (Ray's driver handler, a stack dump and exit 15,
    is not left in place); ``--skip-existing`` then runs only the frames without outputs."""
    import signal
    import subprocess
    import threading

    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model", seed=3)
    folder = tmp_path / "frames"
    write_frames(folder, model.path, {f"{index:06d}": 3000 for index in range(1, 400)})
    (folder / "000000.bin").write_bytes(b"")  # its warning is said when its row reaches the driver
    out = tmp_path / "out"
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    child = subprocess.Popen([sys.executable, "-m", "pointpillars_trt", "infer", str(folder), "--model", str(model.path),
                              "--out", str(out), "--device", "cpu", "--no-progress", "--ray", "--workers", "1",
                              "--batch-size", "1", "--format", fmt],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    received = threading.Event()

    def read_stderr() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            lines.append(line)
            if "holds no points" in line:
                received.set()
        received.set()  # the run ended: the wait below ends too

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        received.wait(240)
        assert child.poll() is None, ("the run ended before it could be stopped", "".join(lines))
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    err = "".join(lines)
    assert child.returncode == 143 and err.endswith("terminated\n"), err
    assert "SIGTERM received" not in err, err
    frames = sorted(str(path) for path in folder.iterdir())
    if fmt == "json":
        said = re.search(rf"stopped: the outputs of (\d+) finished frames? are in {re.escape(repr(str(out)))}; "
                         r"rerun with --skip-existing to finish\n", err)
        kept_files = output_names(out)
        # counted on disk once the workers are stopped (the driver hears of a frame only with its call's block)
        assert said is not None and 0 < int(said.group(1)) == len(kept_files) < len(frames), (err, len(kept_files))
        rc, stdout, err = ray_infer(folder, model.path, out, "--skip-existing")
        assert rc == 0 and f"skipping {len(kept_files)} frame{'s' * (len(kept_files) > 1)} whose" in err, (stdout, err)
        assert output_names(out) == sorted(f"{Path(frame).stem}.json" for frame in frames)
        return
    (part,) = out.glob("detections-*.jsonl")
    kept = [json.loads(line)["source"] for line in part.read_text().splitlines()]
    assert 0 < len(kept) < len(frames) and kept == frames[:len(kept)], err  # in input order, from the first
    noun = "frame" + "s" * (len(kept) > 1)
    assert (f"stopped: the rows of {len(kept)} finished {noun} are in '{part}'; rerun with --skip-existing to "
            "finish\n") in err, err  # as local infer says it

    rc, stdout, err = ray_infer(folder, model.path, out, "--format", "jsonl", "--skip-existing")
    left = len(frames) - len(kept)
    assert rc == 0 and stdout.startswith(f"{left}/{left} frames"), (stdout, err)
    assert f"skipping {len(kept)} {noun} whose outputs are already in {out}\n" in err, err
    rows = [json.loads(line)["source"] for path in sorted(out.glob("detections-*.jsonl"))
            for line in path.read_text().splitlines()]
    assert rows == frames  # each frame's one row


def test_a_stop_surfacing_as_a_librarys_error_still_says_what_was_kept(ray_cluster, tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C or SIGTERM that lands inside a library surfaces as that library's error, raised while handling it
    (an import it cut short: ImportError "initialization failed"): the run still counts what it wrote and says so,
    and the error goes on to the caller (the command line reports it as the stop). It had said nothing."""
    from pointpillars_trt.apps.distributed import detect_dataset

    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 300})

    def cut_short(plan: object, frames: int) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("initialization failed")  # noqa: B904 - as the library raises it

    with pytest.raises(ImportError):
        detect_dataset([str(folder)], tiny_model, tmp_path / "out", workers=1, gpus_per_worker=0, progress=False,
                       report=cut_short)  # type: ignore[arg-type]
    assert f"stopped before any frame's outputs were written to {str(tmp_path / 'out')!r}" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_a_ray_run_stopped_before_any_frame_came_back_says_so(ray_cluster, tiny_model: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              fmt: str) -> None:
    """SIGTERM to ``infer --ray`` just as its frames start (its workers still loading the model): a row run says that
    no row had reached the driver and none was kept (it said only "terminated"), and a JSON run that no frame's
    outputs were written, although --out holds an earlier run's outputs of the same frames (they are not this
    run's); ``--skip-existing`` is offered, and the outputs there (none, or the earlier run's) are left as they
    were."""
    import signal
    import subprocess

    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": 300 for index in range(40)})
    out = tmp_path / "out"
    if fmt == "json":  # an earlier run's outputs (rows of one are refused: the run would repeat them)
        rc, _, err = ray_infer(folder, tiny_model, out, "--format", fmt)  # on the module's cluster
        assert rc == 0, err
    before = state_of(out) if out.exists() else {}
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    env.pop("RAY_ADDRESS", None)
    child = subprocess.Popen([sys.executable, "-m", "pointpillars_trt", "infer", str(folder), "--model",
                              str(tiny_model), "--out", str(out), "--device", "cpu", "--no-progress", "--ray", "--workers", "1",
                              "--format", fmt], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        lines = []
        for line in child.stderr:
            lines.append(line)
            if line.startswith("running on Ray"):
                child.send_signal(signal.SIGTERM)
                break
        lines.extend(child.stderr)
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    err = "".join(lines)
    assert child.returncode == 143 and err.endswith("terminated\n"), err
    said = ("stopped before any frame's row reached this driver (each worker sends its rows 8 frames at a time): no "
            "row was kept" if fmt == "jsonl" else f"stopped before any frame's outputs were written to {str(out)!r}")
    assert f"{said}; rerun with --skip-existing to finish\n" in err, err
    after = state_of(out) if out.exists() else {}
    assert {name: state for name, state in after.items() if not name.startswith(".")} == \
        {name: state for name, state in before.items() if not name.startswith(".")}


def test_a_fifo_in_a_folder_is_that_frames_error_as_in_local_infer(ray_cluster, tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    """A FIFO among a folder's point files: its own error line, the other frames written (it refused the whole run
    with --ray), as local infer reports it."""
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 40, "000001": 900})
    os.mkfifo(folder / "fifo.bin")
    local = local_infer(folder, tiny_model, tmp_path / "local")
    rc, out, err = ray_infer(folder, tiny_model, tmp_path / "ray")
    assert rc == 1 and out.startswith("2/3 frames"), (out, err)
    assert f"error: point file '{folder / 'fifo.bin'}' is a FIFO (named pipe), not a regular file\n" in err, err
    assert report_lines(out, err, tmp_path / "ray") == report_lines(*local, tmp_path / "local")
    assert len(assert_same_json_files(tmp_path / "ray", tmp_path / "local")) == 2


def test_a_name_that_is_no_utf8_under_a_file_uri_fails_only_its_frame(ray_cluster, tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                      tmp_path: Path) -> None:
    """A ``file://`` folder holding a point file and a subfolder named with a byte that is no UTF-8 (Ray Data's
    listing of the folder failed on them, ending the whole run in one error line): that frame's error line, the
    folder's FIFO its own as before, the other frames local infer's rows; named alone as a URI beside another frame,
    the same error line and the other frame written."""
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 900, "000001": 40})
    undecodable = folder / os.fsdecode(b"caf\xe9.bin")
    undecodable.write_bytes((folder / "000001.bin").read_bytes())
    (folder / os.fsdecode(b"sub\xff")).mkdir()
    os.mkfifo(folder / "000002.bin")
    rc, out, err = ray_infer(f"file://{folder}", tiny_model, tmp_path / "ray", "--format", "jsonl")
    assert rc == 1 and out.startswith("2/4 frames"), (out, err)
    name_error = (f"error: point file {str(undecodable)!r}: its name is not UTF-8, which Ray Data cannot list: "
                  "rename it, or give it or its folder as a local path (not a file:// URI)")
    fifo_error = f"error: point file '{folder / '000002.bin'}' is a FIFO (named pipe), not a regular file"
    assert sorted(line for line in err.splitlines() if line.startswith("error:")) == sorted([name_error, fifo_error])
    local_infer(folder, tiny_model, tmp_path / "local", "--format", "jsonl")
    rows, expected = jsonl_rows(tmp_path / "ray"), jsonl_rows(tmp_path / "local")
    good = [str(folder / "000000.bin"), str(folder / "000001.bin")]
    assert [row for row in rows if row["source"] in good] == [row for row in expected if row["source"] in good]
    assert len(rows) == 4
    uri = f"file://{undecodable}"
    rc, out, err = ray_infer([uri, f"file://{folder / '000000.bin'}"], tiny_model, tmp_path / "two")
    assert rc == 1 and out.startswith("1/2 frames"), (out, err)
    assert name_error.replace(repr(str(undecodable)), repr(uri)) in err.splitlines(), err
    assert (tmp_path / "two" / "000000.json").is_file()
    only_below = tmp_path / "only_below"  # a name of other bytes in a subfolder, no point file: the folder's error
    only_below.mkdir()
    write_frames(only_below / os.fsdecode(b"sub\xff"), tiny_model, {"000001": 40})
    rc, out, err = cli_ray_infer(f"file://{only_below}", tiny_model, tmp_path / "none")
    assert (rc, out) == (2, ""), (out, err)
    assert f"error: 'file://{only_below}': Ray Data lists no point file in it" in err, err


def jsonl_rows(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for part in sorted(out.glob("detections-*.jsonl")) for line in part.read_text().splitlines()]


def test_a_folder_of_bad_files_and_odd_names_gives_local_infers_lines_and_outputs(  # type: ignore[no-untyped-def]
        tiny_model: Path, tmp_path: Path) -> None:
    """``infer --ray`` (a process of its own, its own cluster) on good frames named with a space, a newline and a
    byte that is no UTF-8, among an empty, a truncated and a random file, a FIFO and a folder named as point files:
    the lines, exit code and files of local infer, and no other line but Ray's own at its start (README) (Ray Data
    said it could not put the paths in an Arrow column and pickled them)."""
    import subprocess

    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 900, "with space": 40, "new\nline": 300})
    os.rename(folder / "000000.bin", os.path.join(os.fsencode(folder), b"bad\xff.bin"))
    (folder / "empty.bin").write_bytes(b"")
    (folder / "truncated.bin").write_bytes(b"\0" * 1001)
    (folder / "random.bin").write_bytes(np.random.default_rng(0).bytes(16 * 1000))
    os.mkfifo(folder / "fifo.bin")
    (folder / "folder.bin").mkdir()
    local = local_infer(folder, tiny_model, tmp_path / "local")
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(folder), "--model", str(tiny_model),
                           "--out", str(tmp_path / "ray"), "--device", "cpu", "--no-progress", "--ray"],
                          env=env, capture_output=True, text=True, timeout=240, errors="surrogateescape")
    err = "".join(line for line in done.stderr.splitlines(keepends=True) if "core_worker.cc" not in line)
    readme = (tests.parent / "README.md").read_text(encoding="utf-8")
    for number in re.findall(r"ray-project/ray/issues/(\d+)", done.stderr):  # README named only another issue
        assert f"ray-project/ray issue {number}" in readme or f"the line links issue {number}" in readme, number
    assert done.returncode == 1 and done.stdout.startswith("4/7 frames"), (done.stdout, done.stderr)
    assert report_lines(done.stdout, err, tmp_path / "ray") == report_lines(*local, tmp_path / "local")
    assert len(assert_same_json_files(tmp_path / "ray", tmp_path / "local")) == 4


def test_a_uri_frame_gone_or_grown_after_the_listing_is_that_frames_error_and_the_run_goes_on(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame of a ``file://`` folder deleted once Ray Data has listed it is that frame's error line and row, as
    local infer says a file gone before its read, and so is one grown past the frame limit (no more of it read);
    the other frames' rows are local infer's of the folder, byte for byte, exit code 1 (Ray Data's read ended the
    run with its traceback, exit code 2, no row kept, and read a grown file whole); a frame named with a newline is
    read by the name it is listed by (Ray Data's read of its URI looked for another file, ending the run)."""
    from pointpillars_trt.apps import distributed
    from pointpillars_trt.points import MAX_FRAME_POINTS

    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 900, "000001": 40, "000002": 3000, "new\nline": 300})
    local_infer(folder, tiny_model, tmp_path / "local", "--format", "jsonl", code=0)
    gone, grown = folder / "000001.bin", folder / "000002.bin"
    listing = distributed.list_uri_frames

    def listed_then_changed(*args, **kwargs):  # type: ignore[no-untyped-def]
        frames = listing(*args, **kwargs)
        gone.unlink()
        with grown.open("r+b") as f:
            f.truncate(MAX_FRAME_POINTS * 16 + 16)
        return frames

    monkeypatch.setattr(distributed, "list_uri_frames", listed_then_changed)
    rc, out, err = ray_infer(f"file://{folder}", tiny_model, tmp_path / "ray", "--format", "jsonl")
    assert rc == 1 and out.startswith("2/4 frames"), (out, err)
    errors = {str(gone): f"point file '{gone}' does not exist",
              str(grown): f"point file '{grown}' grew past the limit of {MAX_FRAME_POINTS} points a frame once listed"}
    assert [line for line in err.splitlines() if line.startswith("error:")] == [f"error: {e}" for e in errors.values()]
    rows, expected = jsonl_rows(tmp_path / "ray"), jsonl_rows(tmp_path / "local")
    assert [row["source"] for row in rows] == [row["source"] for row in expected]
    assert [row for row in rows if row["source"] not in errors] == [row for row in expected if row["source"] not in errors]
    assert {row["source"]: row["error"] for row in rows if row["source"] in errors} == errors


def test_a_uri_frame_beyond_the_frame_limit_is_refused_by_its_size_unread(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """A point file of a ``file://`` folder larger than a frame may be (a sparse file of 256 MiB and a point) is
    that frame's error line, local infer's, and is never read (its access time stays where it was set: Ray Data
    read the whole file, whatever its size, into the object store before the worker refused it); the other frame
    is written."""
    from pointpillars_trt.points import MAX_FRAME_POINTS

    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {"000000": 900})
    huge = folder / "000001.bin"
    with huge.open("wb") as f:
        f.truncate(MAX_FRAME_POINTS * 16 + 16)
    os.utime(huge, (1, huge.stat().st_mtime))  # before its mtime: a read sets it again (relatime)
    rc, out, err = ray_infer(f"file://{folder}", tiny_model, tmp_path / "ray", "--format", "jsonl")
    assert huge.stat().st_atime == 1, "the oversized frame was read"
    _, local_err = local_infer(folder, tiny_model, tmp_path / "local", "--format", "jsonl")
    error = [line for line in local_err.splitlines() if line.startswith("error:")]
    assert error == [f"error: point file '{huge}' is {MAX_FRAME_POINTS * 16 + 16} bytes ({MAX_FRAME_POINTS + 1} points), "
                     f"more than the limit of {MAX_FRAME_POINTS} points a frame"], local_err
    assert rc == 1 and out.startswith("1/2 frames"), (out, err)
    assert [line for line in err.splitlines() if line.startswith("error:")] == error, err
    assert [row["error"] for row in jsonl_rows(tmp_path / "ray")] == [error[0].removeprefix("error: "), None]


def test_threads_beyond_a_workers_cores_run_on_its_cores_said_once(ray_cluster, tiny_model: Path,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    """``--threads`` with --ray is the workers' (refused before, against the driver's cores): more than a worker's
    cores runs as many as it has, said once for the run (two workers: 9 frames are two calls of the CPU's 8);
    detect_dataset's caller gets it as a SettingNotice."""
    from pointpillars_trt.apps.distributed import detect_dataset
    from pointpillars_trt.errors import SettingNotice

    cores = len(os.sched_getaffinity(0))
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": 300 for index in range(9)})
    rc, out, err = cli_ray_infer(folder, tiny_model, tmp_path / "ray", "--workers", "2", "--threads", str(cores + 1))
    assert rc == 0 and out.startswith("9/9 frames"), (out, err)
    assert "running on Ray: 2 workers on the CPU\n" in err and " cut to " not in err, err
    s = "s" * (cores > 1)
    assert err.count(f"note: --threads {cores + 1} is more than the {cores} core{s} where the detector runs: "
                     f"{cores} thread{s}\n") == 1, err
    # the runtime options' threads are the workers' too (they were refused against this machine's cores)
    with ray_cpu_fallback(), pytest.warns(SettingNotice, match=rf"^threads={cores + 1} is more than the {cores} "
                                                              rf"core{s} where the detector"):
        summary = detect_dataset([str(folder)], tiny_model, tmp_path / "api", workers=1, gpus_per_worker=0,
                                 runtime=RuntimeOptions(threads=cores + 1), progress=False)
    assert summary.frames == 9 and not summary.failures


def test_omp_num_threads_is_the_workers_thread_count_as_it_is_local_infers(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OMP_NUM_THREADS, local infer's thread count where --threads is not given, is the CPU workers' too, said as
    local infer says it (beyond the cores, or no count); --ray left it out without a word (its workers took the
    cluster's CPUs shared among them whatever it said)."""
    cores = len(os.sched_getaffinity(0))
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": 300 for index in range(2)})
    for value, note in ((str(cores + 1), f"note: OMP_NUM_THREADS={cores + 1} is more than the {cores} cores where the "
                                         f"detector runs: {cores} threads\n"),
                        ("many", "note: OMP_NUM_THREADS='many' is no thread count")):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        _, local_err = local_infer(folder, tiny_model, tmp_path / f"local_{value}", code=0)
        rc, out, err = cli_ray_infer(folder, tiny_model, tmp_path / f"ray_{value}")
        assert rc == 0 and out.startswith("2/2 frames"), (out, err)
        assert local_err.count(note) == err.count(note) == 1, (local_err, err)
        assert_same_json_files(tmp_path / f"ray_{value}", tmp_path / f"local_{value}")


def test_pipelines_whose_threads_contend_for_a_workers_cores_are_said_as_local_infer_says_them(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """``--pipelines 2 --threads CORES`` on the CPU: each pipeline takes the threads asked, and the note on their
    contention is local infer's, once (--ray said nothing); the boxes are local infer's."""
    cores = len(os.sched_getaffinity(0))
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": 300 for index in range(3)})
    options = ("--pipelines", "2", "--threads", str(cores))
    note = f"note: --pipelines 2 with --threads {cores}: {2 * cores} ONNX Runtime threads contend for {cores} cores"
    _, local_err = local_infer(folder, tiny_model, tmp_path / "local", *options, code=0)
    rc, out, err = cli_ray_infer(folder, tiny_model, tmp_path / "ray", "--workers", "2", *options)
    assert rc == 0 and out.startswith("3/3 frames"), (out, err)
    assert local_err.count(note) == err.count(note) == 1, (local_err, err)
    assert_same_json_files(tmp_path / "ray", tmp_path / "local")


def test_each_worker_opens_only_the_pipelines_the_runs_frames_keep_busy_as_local_infer_does(
        ray_cluster: Path, tiny_model: Path, tmp_path: Path) -> None:
    """``--pipelines 4`` for 3 frames with ``--workers 2``: the 3 frames are one call, so one worker starts, and it
    opens 3 pipelines at batch 1 (each opened 4), fitted to all 3 frames as local infer fits them; the cut is local
    infer's note with the workers' cut added, said once, and the outputs are local infer's. ``detect_dataset``'s
    caller gets the note as a SettingNotice naming its own arguments: ``batch_size=8`` for a URI's 3 frames, one batch
    of 3. Each run's detectors are counted as they open, in a copy of the model of its own."""
    from pointpillars_trt.apps.distributed import detect_dataset
    from pointpillars_trt.errors import SettingNotice

    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": 300 for index in range(3)})
    why = "(more would only cost start time and memory)"
    note = f"note: --pipelines 4 cut to 3: the 3 frames to run make 3 batches of 1 {why}"
    ray_note = (f"note: --pipelines 4 cut to 3 and --workers 2 cut to 1: the 3 frames to run make 3 batches of 1 and "
                f"1 worker call of 3 {why}")  # a call of the CPU's 8 frames, rounded up to 3 batches x 1: 9
    _, local_err = local_infer(folder, tiny_model, tmp_path / "local", "--pipelines", "4", code=0)
    for run in ("cli", "api"):
        shutil.copytree(tiny_model, tmp_path / run)
    rc, out, err = cli_ray_infer(folder, tmp_path / "cli", tmp_path / "ray", "--workers", "2", "--pipelines", "4")
    assert rc == 0 and out.startswith("3/3 frames"), (out, err)
    assert detectors_opened(ray_cluster, tmp_path / "cli") == [[1, 1, 1]]
    assert [line for line in local_err.splitlines() if " cut to " in line] == [note], local_err
    assert [line for line in err.splitlines() if " cut to " in line] == [ray_note], err
    assert_same_json_files(tmp_path / "ray", tmp_path / "local")

    with pytest.warns(SettingNotice) as notices:
        summary = detect_dataset(f"file://{folder}", tmp_path / "api", tmp_path / "api_out", workers=1,
                                 batch_size=8, pipelines=1, progress=False, runtime=RuntimeOptions(device="cpu"))
    assert summary.frames == 3 and not summary.failures
    assert detectors_opened(ray_cluster, tmp_path / "api") == [[3]]
    assert [str(notice.message) for notice in notices if " cut to " in str(notice.message)] == \
        [f"batch_size=8 cut to 3: the 3 frames to run make 1 batch of 3 {why}"]


def test_a_run_of_fewer_calls_than_workers_starts_a_worker_a_call_and_says_a_workers_given_that_is_cut(
        ray_cluster: Path, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--workers 2`` for 3 frames, one call of the CPU's 8: one worker starts (Ray's actor table holds one actor more,
    whether or not a second would have got as far as its detectors before the run ended; one process opened them),
    its pipeline taking the threads of the cluster's 2 CPUs as that one worker's share, not half of them; the cut is
    said once, and the outputs are local infer's. ``detect_dataset(workers=2)`` for one frame: one worker too, the cut
    said as a SettingNotice naming its argument. Oracle: the counts by hand; Ray's own record of the actors."""
    from pointpillars_trt.apps.distributed import detect_dataset
    from pointpillars_trt.errors import SettingNotice

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # else the workers' thread count
    threads = str(min(2, len(os.sched_getaffinity(0))))  # the cluster's 2 CPUs for one worker, at most its cores
    folder = tmp_path / "frames"
    write_frames(folder, tiny_model, {f"{index:06d}": 300 for index in range(3)})
    why = "(more would only cost start time and memory)"
    local_infer(folder, tiny_model, tmp_path / "local", code=0)
    for run in ("cli", "api"):
        shutil.copytree(tiny_model, tmp_path / run)
    before = detect_actors()
    rc, out, err = cli_ray_infer(folder, tmp_path / "cli", tmp_path / "ray", "--workers", "2")
    assert rc == 0 and out.startswith("3/3 frames"), (out, err)
    assert len(detect_actors() - before) == 1
    assert [(batch, count) for _, batch, count in detector_opens(ray_cluster, tmp_path / "cli")] == [(1, threads)]
    assert "running on Ray: 1 worker on the CPU\n" in err and "frames/s with 1 worker" in err, err
    assert [line for line in err.splitlines() if " cut to " in line] == \
        [f"note: --workers 2 cut to 1: the 3 frames to run make 1 worker call of 3 {why}"], err
    assert_same_json_files(tmp_path / "ray", tmp_path / "local")

    before = detect_actors()
    with pytest.warns(SettingNotice) as notices:
        summary = detect_dataset(folder / "000000.bin", tmp_path / "api", tmp_path / "api_out", workers=2,
                                 gpus_per_worker=0, progress=False, runtime=RuntimeOptions(device="cpu"))
    assert summary.frames == 1 and summary.workers == 1 and not summary.failures
    assert len(detect_actors() - before) == 1
    assert [(batch, count) for _, batch, count in detector_opens(ray_cluster, tmp_path / "api")] == [(1, threads)]
    assert [str(notice.message) for notice in notices if " cut to " in str(notice.message)] == \
        [f"workers=2 cut to 1: the 1 frame to run makes 1 worker call of 1 {why}"]


def test_a_gpu_only_backend_on_a_cluster_without_gpus_is_one_error_before_any_worker_starts(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """Device auto on a cluster of CPUs with ``backend="cudnn"``: refused as local infer refuses it on a machine
    without a GPU, once the cluster's resources say where the workers run (each worker refused it as it opened the
    model: Ray's traceback)."""
    from pointpillars_trt.apps.distributed import detect_dataset
    from pointpillars_trt.errors import BackendError

    write_frames(tmp_path / "frames", tiny_model, {"000001": 50})
    with pytest.raises(BackendError, match=r"^backend 'cudnn' runs only in the GPU pipeline; the CPU path uses ONNX"):
        detect_dataset([str(tmp_path / "frames")], tiny_model, tmp_path / "out", workers=1, progress=False,
                       runtime=RuntimeOptions(backend="cudnn"))
    assert not (tmp_path / "out").exists()


def test_a_model_a_worker_refuses_as_it_opens_it_is_the_error_local_detection_raises(  # type: ignore[no-untyped-def]
        ray_cluster, tiny_model: Path, tmp_path: Path) -> None:
    """Precision fp16 asked of an fp32 model dir, refused by the detector an actor opens (as a GPU worker refuses
    plans built with another TF32 setting, or a TensorRT it lacks): the records raise the detector's own error,
    not Ray's traceback of a dead actor. ``detect_dataset`` refuses this one before the cluster starts."""
    import ray

    from pointpillars_trt.apps.distributed import _DetectActor, _records, detect_dataset
    from pointpillars_trt.apps.outputs import OutputPlan
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.errors import BackendError

    options = RuntimeOptions(precision="fp16", device="cpu")
    with pytest.raises(BackendError) as local:
        PointPillars.from_model_dir(tiny_model, options=options)
    assert "holds fp32 graphs" in str(local.value)
    write_frames(tmp_path / "frames", tiny_model, {"000001": 50, "000002": 60})
    frames = sorted(str(path) for path in (tmp_path / "frames").iterdir())
    actor_options = {"model_dir": str(tiny_model), "runtime": options, "batch": 1, "pipelines": 1,
                     "plan": OutputPlan(json_dir=tmp_path / "out"), "point_dim": 4, "intensity_scale": None,
                     "rows": False, "cwd": os.getcwd()}
    dataset = ray.data.from_items([{"path": frame} for frame in frames]).map_batches(
        _DetectActor, batch_size=1, batch_format="numpy", fn_constructor_kwargs=actor_options,
        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=0.5)
    with pytest.raises(BackendError) as on_ray:
        list(_records(dataset))
    assert str(on_ray.value) == str(local.value)
    with pytest.raises(BackendError) as before:
        detect_dataset(frames, tiny_model, tmp_path / "api", workers=2, progress=False, runtime=options)
    assert str(before.value) == str(local.value) and not (tmp_path / "api").exists()


def test_the_clusters_messages_go_to_stderr_while_infer_runs_its_frames(ray_cluster) -> None:  # type: ignore[no-untyped-def]
    """Ray's driver prints what the cluster publishes to it ("(raylet) A worker died ...", its task retried) on
    stdout, where a script reads infer's summary line: a message published through the cluster while
    ``cluster_messages_on_stderr`` is open is printed on stderr; once it is closed, on stdout again."""
    import time

    import ray
    from ray._private.utils import publish_error_to_driver

    from pointpillars_trt.apps.distributed import cluster_messages_on_stderr

    worker = ray._private.worker.global_worker
    gcs_client = getattr(worker, "gcs_client")  # set on the driver's worker as it connects: its class declares none

    def published(text: str, stream: io.StringIO) -> bool:
        publish_error_to_driver("worker_died", text, gcs_client=gcs_client, job_id=worker.current_job_id)
        deadline = time.monotonic() + 30
        while text not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        return text in stream.getvalue()

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        with cluster_messages_on_stderr():
            during = published("a worker died while the frames ran", stderr)
        after = published("a worker died once they had run", stdout)
    assert during and "while the frames ran" not in stdout.getvalue(), (stdout.getvalue(), stderr.getvalue())
    assert after and "once they had run" not in stderr.getvalue(), (stdout.getvalue(), stderr.getvalue())


def test_the_listings_sizes_through_public_calls_equal_ray_datas_own(ray_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Where a Ray version keeps its listing elsewhere, ``listed_sizes`` (input_files, pyarrow's stat of each
    file) gives what Ray Data's own listing holds: the same names and sizes, and a file system that reads them."""
    import ray

    from pointpillars_trt.apps import uri_frames

    folder = tmp_path / "frames"
    folder.mkdir()
    for index, size in enumerate((0, 16, 4096)):
        (folder / f"{index:06d}.bin").write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    sources = [f"file://{folder}"]
    own, _ = uri_frames._list(ray, sources)
    public, filesystem = uri_frames.listed_sizes(ray.data.read_binary_files(sources, include_paths=True), sources)
    assert own == public == {str(folder / f"{index:06d}.bin"): size for index, size in enumerate((0, 16, 4096))}
    with filesystem.open_input_stream(str(folder / "000002.bin")) as stream:
        assert stream.read() == (folder / "000002.bin").read_bytes()
