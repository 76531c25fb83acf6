"""Detection over a whole data set on a Ray cluster (Ray Data), with the outputs of local ``infer``.

Frames are read by Ray Data (local files, folders and globs, or any URI it reads, e.g. ``s3://``) and
handed in batches to a pool of actors, each holding ONE detector built in its ``__init__`` (a detector
cannot be pickled, and building it once per worker is what makes the GPU worth it). Each actor writes
the same per-frame JSON / KITTI files as ``pointpillars-trt infer`` (the paths must be on a file system
every node sees), or returns one Parquet row per frame. A bad frame becomes an error record and the job
goes on; a worker that dies is restarted and its batch retried by Ray (Ray Data's actor pools default to
max_restarts=-1 and max_task_retries=-1; passing them is deprecated in Ray 2.60).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BackendError, InputError, PointPillarsError

OUTPUT_FORMATS = ("json", "kitti", "parquet")
#: CPUs an actor reserves on a CPU-only node: a whole CPU each starves Ray Data's read tasks of cores.
ACTOR_CPUS_WITHOUT_GPU = 0.5
#: Frames per actor call: one engine run at batch 8 on a GPU; on the CPU frames run one by one anyway.
DEFAULT_BATCH = {True: 8, False: 1}


@dataclass(frozen=True)
class DatasetSummary:
    """What ``detect_dataset`` did: frame and box counts, failures (source, message), wall time."""

    frames: int
    boxes: int
    seconds: float
    workers: int
    out: str
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def frames_per_second(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def detect_dataset(paths_or_uri: str | Sequence[str], model: str | os.PathLike[str], out: str | os.PathLike[str], *,
                   workers: int | None = None, gpus_per_worker: float | None = None, batch_size: int | None = None,
                   output_format: str = "json", calib: str | None = None, ray_address: str | None = None,
                   progress: bool = True) -> DatasetSummary:
    """Detect on every frame of ``paths_or_uri`` with ``workers`` actors of ``gpus_per_worker`` GPUs each
    (default: 1 where the cluster has GPUs, else 0 = the CPU path; 0.5 puts two actors on a GPU).

    ``ray_address``: None starts a local cluster (unless Ray is already initialised), "auto" or
    HOST:PORT joins one. Outputs go to ``out`` as ``infer --out`` writes them, or (parquet) as Parquet
    files of one row per frame with an ``error`` column.
    """
    if ray_address is None:
        # a cluster started here serves this process alone: keep Ray on loopback instead of the host's
        # network address (Ray reads this when first imported)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if output_format not in OUTPUT_FORMATS:
        raise InputError(f"output_format {output_format!r}: expected one of {', '.join(OUTPUT_FORMATS)}")
    if output_format == "kitti" and not (calib and os.path.isdir(calib)):
        raise InputError(f"kitti output needs calib, a folder of KITTI calib files named like the frames "
                         f"(got {calib!r})")
    sources, missing = _sources(paths_or_uri)
    from .apps.serve.repository import resolve_model

    model_dir = str(resolve_model(model).path.resolve())
    started = not ray.is_initialized()
    if started:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    try:
        return _run(ray, sources, missing, model_dir, str(out), workers=workers, gpus_per_worker=gpus_per_worker,
                    batch_size=batch_size, output_format=output_format, calib=calib, progress=progress)
    finally:
        if started:
            ray.shutdown()


def _sources(paths_or_uri: str | Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(what Ray Data reads, (source, error) of local files that do not exist): local folders and
    globs expand as in ``infer``; URIs go to Ray Data as they are."""
    from .apps.cli import expand_frame_paths

    items = [paths_or_uri] if isinstance(paths_or_uri, str) else list(paths_or_uri)
    sources: list[str] = []
    missing: list[tuple[str, str]] = []
    for item in items:
        if "://" in item:
            sources.append(item)
            continue
        for path in expand_frame_paths([item]):
            if os.path.isfile(path):
                sources.append(os.path.abspath(path))
            else:
                missing.append((path, f"velodyne file {path!r}: no such file"))
    return sources, missing


def _run(ray: Any, sources: list[str], missing: list[tuple[str, str]], model_dir: str, out: str, *,
         workers: int | None, gpus_per_worker: float | None, batch_size: int | None, output_format: str,
         calib: str | None, progress: bool) -> DatasetSummary:
    from ray.data import ActorPoolStrategy, DataContext

    resources = ray.cluster_resources()
    if gpus_per_worker is None:
        gpus_per_worker = 1.0 if resources.get("GPU", 0) > 0 else 0.0
    if gpus_per_worker < 0:
        raise InputError(f"gpus_per_worker {gpus_per_worker}: expected 0 (CPU), a fraction or a whole number")
    if workers is None:
        cpus = int(resources.get("CPU", 1))
        workers = int(resources.get("GPU", 0) / gpus_per_worker) if gpus_per_worker else max(1, cpus // 2)
    if workers < 1:
        raise InputError(f"workers {workers}: expected >= 1 (the cluster has {resources.get('GPU', 0):g} GPUs)")
    on_gpu = gpus_per_worker > 0
    threads = None if on_gpu else max(1, int(resources.get("CPU", 1)) // workers)
    if output_format != "parquet":
        Path(out).mkdir(parents=True, exist_ok=True)
    context = DataContext.get_current()
    context.execution_options.preserve_order = True  # rows (and Parquet files) in input order
    context.enable_progress_bars = False              # one bar below, in frames/s
    start = time.perf_counter()
    failures = list(missing)
    frames, boxes = len(missing), 0
    if sources:
        dataset = ray.data.read_binary_files(
            sources, include_paths=True, file_extensions=["bin"] if any("://" in s for s in sources) else None)
        dataset = dataset.map_batches(
            _DetectActor, batch_size=batch_size or DEFAULT_BATCH[on_gpu], batch_format="numpy",
            compute=ActorPoolStrategy(size=workers),
            fn_constructor_kwargs={"model_dir": model_dir, "device": "cuda" if on_gpu else "cpu", "threads": threads,
                                   "out": out, "output_format": output_format, "calib": calib},
            num_gpus=gpus_per_worker if on_gpu else None, num_cpus=1 if on_gpu else ACTOR_CPUS_WITHOUT_GPU)
        if output_format == "parquet":
            dataset = dataset.materialize()
            dataset.write_parquet(out)
        from tqdm import tqdm

        with tqdm(total=len(sources), unit="frame", disable=not progress, desc="ray") as bar:
            for batch in dataset.select_columns(["source", "error", "num_boxes"]).iter_batches(batch_format="numpy"):
                for source, error, count in zip(batch["source"], batch["error"], batch["num_boxes"]):
                    frames += 1
                    if error:
                        failures.append((str(source), str(error)))
                    else:
                        boxes += int(count)
                bar.update(len(batch["source"]))
    return DatasetSummary(frames, boxes, time.perf_counter() - start, workers, out, sorted(failures))


class _DetectActor:
    """One detector per actor; a batch of rows {bytes, path} in, one record per frame out."""

    def __init__(self, model_dir: str, device: str, threads: int | None, out: str, output_format: str,
                 calib: str | None) -> None:
        from .detector import PointPillars

        self.detector = PointPillars.from_model_dir(model_dir, device=device, threads=threads)
        self.out, self.output_format, self.calib = Path(out), output_format, calib
        self.schema = _schema(output_format, self.detector.cfg.classes)

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        import pyarrow as pa

        sources = [str(path) for path in batch["path"]]
        records: list[dict[str, Any]] = [{"source": s, "frame": Path(s).stem, "error": None, "num_boxes": 0}
                                         for s in sources]
        frames: list[np.ndarray] = []
        owners: list[int] = []
        for index, data in enumerate(batch["bytes"]):
            try:
                frames.append(_points_from_bin(bytes(data), sources[index]))
                owners.append(index)
            except PointPillarsError as exc:
                records[index]["error"] = str(exc)
        for index, result in zip(owners, self.detector.infer_many(frames, batch_size=max(1, len(frames)))):
            records[index].update(self._finish(result, sources[index]))
        return pa.Table.from_pylist(records, schema=self.schema)

    def _finish(self, result: Any, source: str) -> dict[str, Any]:
        """The frame's record: its outputs written (json/kitti) or carried (parquet), or its error."""
        from .apps.serve.outputs import write_frame_outputs

        det = result.detections
        if result.error is not None or det is None:
            return {"error": str(result.error)}
        if self.output_format == "parquet":
            return {**det.to_json_dict(Path(source).stem), "num_boxes": len(det)}
        try:
            write_frame_outputs(det, source, self.out, self.output_format, self.calib)
        except PointPillarsError as exc:
            return {"error": str(exc)}
        except OSError as exc:
            return {"error": f"cannot write to {self.out}: {exc.strerror or exc}"}
        return {"num_boxes": len(det)}


def _points_from_bin(data: bytes, source: str) -> np.ndarray:
    """A KITTI .bin frame's bytes -> (N, 4) float32, refused (naming the file) unless whole points."""
    if len(data) % 16:
        raise InputError(f"velodyne file {source!r} is {len(data)} bytes, not a multiple of 16 "
                         "(4 float32 values a point)")
    return np.frombuffer(data, dtype="<f4").reshape(-1, 4).copy()


#: Arrow types of the list fields of the per-frame JSON record; its scalar fields are typed by value.
_LIST_COLUMNS = {"boxes_lidar": "list<list<double>>", "scores": "list<double>", "labels": "list<string>"}


def _schema(output_format: str, class_names: tuple[str, ...]) -> Any:
    """Every batch's table has this schema, so blocks of only failed frames still line up; for Parquet,
    one column per field of ``Detections.to_json_dict`` (probed on an empty result, so a new field
    becomes a new column)."""
    import pyarrow as pa

    from .detections import Detections, FrameStats

    lists = {"list<list<double>>": pa.list_(pa.list_(pa.float64())), "list<double>": pa.list_(pa.float64()),
             "list<string>": pa.list_(pa.string())}
    fields = [("source", pa.string()), ("frame", pa.string()), ("error", pa.string()), ("num_boxes", pa.int64())]
    if output_format == "parquet":
        for key, value in Detections.empty(class_names, FrameStats(0)).to_json_dict("").items():
            if key in _LIST_COLUMNS:
                fields.append((key, lists[_LIST_COLUMNS[key]]))
            elif key != "frame":
                kinds = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
                if type(value) not in kinds:
                    raise BackendError(f"parquet output: no column type for record field {key!r}")
                fields.append((key, kinds[type(value)]))
    return pa.schema(fields)
