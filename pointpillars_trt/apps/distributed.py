"""Detection over a whole data set on a Ray cluster (Ray Data), with the outputs of local ``infer``.

Frames (local files, folders and globs, or any URI Ray Data reads, e.g. ``s3://``) are handed in batches
to a pool of actors (local files are read there as ``infer`` reads them; URIs by Ray Data), each holding
ONE detector built in its ``__init__`` (a detector cannot be pickled, and building it once per worker is
what makes the GPU worth it). Each actor writes the per-frame files with ``pointpillars-trt infer``'s
own ``write_frame_outputs`` (the paths must be on a file system every node sees), or returns one Parquet
row per frame. A bad frame becomes an error record and the job goes on; a worker that dies is restarted
and its batch retried by Ray (Ray Data's actor pools default to max_restarts=-1 and max_task_retries=-1;
passing them is deprecated in Ray 2.60).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .infer import (FRAME_ERRORS, FrameOutput, FrameReport, OutputPlan, _detect, _Read, expand_frame_paths,
                         intensity_warning, one_line, write_frame_outputs)
from ..errors import BackendError, InputError
from ..fileio import safe_repr
from ..pointcloud_io import read_points
from ..runtime_options import RuntimeOptions

if TYPE_CHECKING:
    from ..detections import Detections

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
                   output_format: str = "json", calib: str | None = None, image_shape: tuple[int, int] | None = None,
                   keep_out_of_view: bool = False, viz: bool = False, point_dim: int = 4,
                   intensity_scale: float | None = None, ray_address: str | None = None, progress: bool = True,
                   report: Callable[[OutputPlan], FrameReport] | None = None,
                   runtime: RuntimeOptions | None = None) -> DatasetSummary:
    """Detect on every frame of ``paths_or_uri`` with ``workers`` actors of ``gpus_per_worker`` GPUs each
    (default: 1 where the cluster has GPUs, else 0 = the CPU path; 0.5 puts two actors on a GPU).

    ``ray_address``: None starts a local cluster (unless Ray is already initialised), "auto" or
    HOST:PORT joins one. Outputs go to ``out`` as ``infer --out`` writes them (``apps.infer.
    write_frame_outputs``: KITTI lines with ``calib`` or each frame's sibling calib/ folder,
    ``image_shape``, ``keep_out_of_view``; ``viz`` adds the BEV pictures), or (parquet) as Parquet
    files of one row per frame with an ``error`` column. ``report`` (given the output plan) makes the
    ``infer`` account that each frame is reported to, in input order, and closed at the end.
    ``runtime``: how each actor's detector runs (as local ``infer`` runs it); its device and CPU threads
    are set per actor from the resources it gets.
    """
    if ray_address is None:
        # a cluster started here serves this process alone: keep Ray on loopback instead of the host's
        # network address (Ray reads this when first imported)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if output_format not in OUTPUT_FORMATS:
        raise InputError(f"output_format {output_format!r}: expected one of {', '.join(OUTPUT_FORMATS)}")
    if viz and output_format == "parquet":
        raise InputError("viz pictures are written beside JSON or KITTI outputs, not with parquet")
    read = partial(read_points, point_dim=point_dim, intensity_scale=intensity_scale)
    entries = _sources(paths_or_uri, read)
    from .serve.repository import resolve_model

    found = resolve_model(model)
    target = Path(out)
    plan = OutputPlan(json_dir=target if output_format == "json" else None,
                      kitti_dir=target if output_format == "kitti" else None, png_dir=target if viz else None,
                      calib_dir=calib, image_shape=image_shape, keep_out_of_view=keep_out_of_view,
                      point_range=tuple(found.cfg.voxel.point_range))
    options = {"plan": plan, "point_dim": point_dim, "intensity_scale": intensity_scale,
               "parquet": output_format == "parquet", "cwd": os.getcwd(), "runtime": runtime or RuntimeOptions()}
    started = not ray.is_initialized()
    if started:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
    try:
        return _run(ray, entries, str(found.path.resolve()), str(out), options, workers=workers,
                    gpus_per_worker=gpus_per_worker, batch_size=batch_size, progress=progress,
                    report=report(plan) if report is not None else None)
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class _Entry:
    """One input: a local file (``path`` absolute, ``name`` as given), a URI, or a local file that
    cannot be read (``error``: the line local infer gives it)."""

    name: str
    path: str
    error: str | None = None


def _sources(paths_or_uri: str | Sequence[str], read: Callable[[str], np.ndarray]) -> list[_Entry]:
    """Inputs in order: local folders and globs expand as in ``infer``; URIs go to Ray Data as they are."""
    items = [paths_or_uri] if isinstance(paths_or_uri, str) else list(paths_or_uri)
    entries: list[_Entry] = []
    for item in items:
        if "://" in item:
            entries.append(_Entry(item, item))
            continue
        for path in expand_frame_paths([item]):
            if os.path.isfile(path):
                entries.append(_Entry(path, os.path.abspath(path)))
                continue
            try:
                read(path)
                error = f"point file {safe_repr(path)}: no such file"
            except FRAME_ERRORS as exc:
                error = one_line(exc)
            entries.append(_Entry(path, os.path.abspath(path), error))
    return entries


def _run(ray: Any, entries: list[_Entry], model_dir: str, out: str, options: dict[str, Any], *,
         workers: int | None, gpus_per_worker: float | None, batch_size: int | None, progress: bool,
         report: FrameReport | None) -> DatasetSummary:
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
    if not options["parquet"]:
        Path(out).mkdir(parents=True, exist_ok=True)
    context = DataContext.get_current()
    context.execution_options.preserve_order = True  # rows (and Parquet files) in input order
    context.enable_progress_bars = False              # one bar below, in frames/s
    start = time.perf_counter()
    sent = [e for e in entries if e.error is None]
    local = {e.path: e.name for e in sent if "://" not in e.path}
    rows: Iterator[tuple[str, str | None, dict[str, Any]]] = iter(())
    if sent:
        uris = any("://" in e.path for e in sent)
        if uris:
            dataset = ray.data.read_binary_files([e.path for e in sent], include_paths=True, file_extensions=["bin"])
        else:  # local files: each actor reads them as local infer does (any point format, its error lines)
            dataset = ray.data.from_items([{"path": e.path} for e in sent])
        dataset = dataset.map_batches(
            _DetectActor, batch_size=batch_size or DEFAULT_BATCH[on_gpu], batch_format="numpy",
            compute=ActorPoolStrategy(size=workers),
            fn_constructor_kwargs={"model_dir": model_dir, "names": {p: n for p, n in local.items() if p != n},
                                   **options, "runtime": replace(options["runtime"], device="cuda" if on_gpu else "cpu",
                                                                 threads=options["runtime"].threads or threads)},
            num_gpus=gpus_per_worker if on_gpu else None, num_cpus=1 if on_gpu else ACTOR_CPUS_WITHOUT_GPU)
        if options["parquet"]:
            dataset = dataset.materialize()
            dataset.write_parquet(out)
        rows = _rows(dataset.select_columns(list(_COUNTS)))
    from tqdm import tqdm

    failures: list[tuple[str, str]] = []
    frames = boxes = 0
    warned = False
    with tqdm(total=len(entries), unit="frame", disable=not progress or report is not None, desc="ray") as bar:
        for path, error, record in _in_input_order(entries, local, rows):
            frames += 1
            source = record["source"]
            if report is not None and record["intensity_8bit"] and not warned:
                warned = True
                report.note(intensity_warning(source))
            if error:
                failures.append((source, error))
                if report is not None:
                    report.fail(source, error)
            else:
                boxes += record["num_boxes"]
                if report is not None:
                    report.written(source, FrameOutput(record["num_boxes"], record["num_nonfinite_dropped"],
                                                       record["num_out_of_view"]))
            bar.update(1)
    if report is not None:
        report.close()
    return DatasetSummary(frames, boxes, time.perf_counter() - start, workers, out, failures)


#: The per-frame columns the driver reads back (the actor's record; Parquet adds the detections).
_COUNTS = ("path", "source", "error", "num_boxes", "num_nonfinite_dropped", "num_out_of_view", "intensity_8bit")


def _rows(dataset: Any) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    for batch in dataset.iter_batches(batch_format="numpy"):
        for values in zip(*(batch[key] for key in _COUNTS)):
            record = dict(zip(_COUNTS, values))
            record = {**record, "source": str(record["source"]), "num_boxes": int(record["num_boxes"]),
                      "num_nonfinite_dropped": int(record["num_nonfinite_dropped"]),
                      "num_out_of_view": int(record["num_out_of_view"]),
                      "intensity_8bit": bool(record["intensity_8bit"])}
            yield str(record["path"]), (str(record["error"]) if record["error"] else None), record


def _in_input_order(entries: list[_Entry], local: dict[str, str],
                    rows: Iterator[tuple[str, str | None, dict[str, Any]]]) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """The actors' rows (in order of the files sent) with the unreadable local files put back in
    their places among the local files; URI rows where Ray Data gives them."""
    unread: list[tuple[int, _Entry]] = []
    seen = 0
    for entry in entries:
        if entry.error is not None:
            unread.append((seen, entry))
        elif entry.path in local:
            seen += 1

    def missing(entry: _Entry) -> tuple[str, str | None, dict[str, Any]]:
        return entry.path, entry.error, {"source": entry.name, "num_boxes": 0, "intensity_8bit": False}

    done = 0
    for path, error, record in rows:
        if path in local:
            while unread and unread[0][0] <= done:
                yield missing(unread.pop(0)[1])
            done += 1
        yield path, error, record
    for _, entry in unread:
        yield missing(entry)


class _DetectActor:
    """One detector per actor; a batch of rows {path[, bytes]} in, one record per frame out, its
    outputs written by ``apps.infer.write_frame_outputs`` as local infer writes them."""

    def __init__(self, model_dir: str, runtime: RuntimeOptions, plan: OutputPlan, point_dim: int,
                 intensity_scale: float | None, parquet: bool, cwd: str, names: dict[str, str]) -> None:
        from ..detector import PointPillars

        self.detector = PointPillars.from_model_dir(model_dir, options=runtime)
        if os.path.isdir(cwd):  # the driver's relative paths (frames, --out, --calib) mean the same here
            os.chdir(cwd)
        else:
            names, plan = {}, _absolute(plan)
        self.plan, self.parquet, self.names = plan, parquet, names
        self.read = partial(read_points, point_dim=point_dim, intensity_scale=intensity_scale)
        self.check_intensity = intensity_scale is None and "intensity" in self.detector.cfg.features.order
        self.schema = _schema("parquet" if parquet else "json", self.detector.cfg.classes)

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        import pyarrow as pa

        from ..pointcloud_io import intensity_looks_8bit

        paths = [str(path) for path in batch["path"]]
        sources = [self.names.get(path, path) for path in paths]
        if "bytes" in batch:
            reads = [self._parse(bytes(data), source) for data, source in zip(batch["bytes"], sources)]
        else:
            with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
                reads = list(pool.map(self._read, sources))
        records: list[dict[str, Any]] = [
            {"path": path, "source": item.source, "frame": Path(item.source).stem, "error": item.error,
             "num_boxes": 0, "num_nonfinite_dropped": 0, "num_out_of_view": 0,
             "intensity_8bit": bool(self.check_intensity and item.points is not None
                                    and intensity_looks_8bit(item.points))}
            for path, item in zip(paths, reads)]
        ready = [index for index, item in enumerate(reads) if item.points is not None]
        for index, (det, error) in zip(ready, _detect(self.detector, [reads[i] for i in ready])):
            records[index].update(self._finish(det, error, reads[index]))
        return pa.Table.from_pylist(records, schema=self.schema)

    def _read(self, source: str) -> _Read:
        try:
            return _Read(source, self.read(source), None)
        except FRAME_ERRORS as exc:
            return _Read(source, None, one_line(exc))

    @staticmethod
    def _parse(data: bytes, source: str) -> _Read:
        try:
            return _Read(source, _points_from_bin(data, source), None)
        except FRAME_ERRORS as exc:
            return _Read(source, None, one_line(exc))

    def _finish(self, det: Detections | None, error: str | None, item: _Read) -> dict[str, Any]:
        """The frame's record: its outputs written (json/kitti) or carried (parquet), or its error."""
        if det is None:
            return {"error": error}
        if self.parquet:
            return {**det.to_json_dict(Path(item.source).stem), "num_boxes": len(det)}
        try:
            written = write_frame_outputs(det, item.source, self.plan, item.points)
        except FRAME_ERRORS as exc:
            return {"error": one_line(exc)}
        return {"num_boxes": written.boxes, "num_nonfinite_dropped": written.nonfinite,
                "num_out_of_view": written.out_of_view}


def _absolute(plan: OutputPlan) -> OutputPlan:
    """The plan with its folders absolute (for a worker whose file system lacks the driver's cwd)."""
    from dataclasses import replace

    def absolute(path: Path | None) -> Path | None:
        return Path(os.path.abspath(path)) if path is not None else None

    return replace(plan, json_dir=absolute(plan.json_dir), kitti_dir=absolute(plan.kitti_dir),
                   png_dir=absolute(plan.png_dir))


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

    from ..detections import Detections, FrameStats

    lists = {"list<list<double>>": pa.list_(pa.list_(pa.float64())), "list<double>": pa.list_(pa.float64()),
             "list<string>": pa.list_(pa.string())}
    fields = [("path", pa.string()), ("source", pa.string()), ("frame", pa.string()), ("error", pa.string()),
              ("num_boxes", pa.int64()), ("num_nonfinite_dropped", pa.int64()), ("num_out_of_view", pa.int64()),
              ("intensity_8bit", pa.bool_())]
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
