"""``pointpillars-trt bench``: one run on one GPU (or the CPU) that measures everything and reports it."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...config import ModelConfig, load_config
from ...detections import Detections
from ...errors import InputError, PointPillarsError, agree, counted, escape_text, printable_text, safe_repr
from ...file_writes import check_writable_folder, lies_in
from ...graph_io import MAX_BATCH
from ...model_dir import ModelDir
from ...points import MAX_POINT_DIM
from ...runtime import BACKEND_NAMES, BACKENDS, onnxruntime_cuda_unavailable_reason
from ...runtime.backends import gpu_backend_rows
from .frames import folder_frame_sets, list_frame_folders, page_locked_frame_sets, simulated_frame_sets
from .measure import device_memory_used_mib, measure_batches, measure_latency, measure_throughput, soak
from .report import refuse_foreign_reports, write_reports
from ..device_notice import cpu_fp16_note, gpu_unused_note
from ..exit_codes import EXIT_FRAME_FAILURES
from ..viz import no_png_line
from ..frame_report import progress_bar
from ..infer import MAX_PIPELINES, existing_model_path, load_model_dir_of_config
from ..ranges import device_arg, float_in, int_in, int_list_in, names_in, path_name, threads_arg

if TYPE_CHECKING:  # the exporter imports ONNX (~1 s): loaded by the runs that export, not by every parser
    from ...convert.onnx_export import ModelWeights

#: What ``--precisions`` may name: tf32 is the fp32 graphs with TensorFloat-32 convolutions.
BENCH_PRECISIONS = ("fp32", "tf32", "fp16")
#: The options only a GPU run uses (their dests), said once when a CPU run is given any of them.
GPU_ONLY_OPTIONS = ("precisions", "pipelines", "batches", "sweep_precisions", "page_locked", "soak", "no_baselines",
                    "warmup_time")

#: The random model's config without --model (the demo's).
DEFAULT_CONFIG = "openpcdet_kitti_3class"
#: Default timed frames per frame set: a GPU frame takes a few milliseconds at most, a CPU frame a second or more.
GPU_ITERATIONS = 200
CPU_ITERATIONS = 10
THROUGHPUT_SECONDS = 1.0  # the least a throughput test runs, timed


def add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser(
        "bench", help="latency, throughput, copies and memory, against PyTorch and a host round trip",
        description="Measure per-stage GPU times, host-to-host latency, a batch sweep, the throughput of "
                    "concurrent pipelines, copies and device memory for every installed backend and "
                    "precision, against a PyTorch re-implementation and a host round trip; writes bench.md, "
                    "bench.json and bench_stages.png (the chart with matplotlib: without it, one line says so), and the model dirs "
                    "it exports to time (models/PRECISION/). "
                    "On the CPU it times the CPU path only.")
    bench.add_argument("--model", type=path_name,
                       help="model dir or .pth checkpoint (default: the demo's seeded random model)")
    bench.add_argument("--config", help=f"config of the random model used without --model (default: {DEFAULT_CONFIG}); "
                                        "with --model, the config the model must have")
    bench.add_argument("--frames", action="append", type=path_name,
                       help="folder of point files, listed as infer lists a folder (hidden files left out), of "
                            "which the first --iterations are read (repeatable: a set each, named after its folder; "
                            "default: simulated scans)")
    bench.add_argument("--point-dim", type=int_in(4, MAX_POINT_DIM), default=None,
                       help="values a point in --frames' .bin files: 4 (KITTI), 5 (nuScenes, with the time lag) or "
                            f"more, up to {MAX_POINT_DIM} (default: the model's)")
    bench.add_argument("--device", type=device_arg, default="auto",
                       help="where the pipeline runs: auto (the GPU when usable, else the CPU), cpu, cuda or cuda:N")
    bench.add_argument("--threads", type=threads_arg, default=None,
                       help="CPU run: ONNX Runtime threads, as infer's --threads (default: $OMP_NUM_THREADS, else one "
                            "per core); at most the cores, more said in a note")
    bench.add_argument("--iterations", type=int_in(1, 1_000_000), default=None,
                       help=f"timed frames per frame set, 1..1000000 (default: {GPU_ITERATIONS} on the GPU, "
                            f"{CPU_ITERATIONS} on the CPU, where a frame takes a second or more)")
    bench.add_argument("--warmup", type=int_in(0, 100_000), default=20,
                       help="untimed frames before each latency run, 0..100000 (default: %(default)s; at most 1 on "
                            "the CPU, 5 batches in the batch sweep and 10 frames for the PyTorch baselines)")
    bench.add_argument("--warmup-time", type=float_in(0.0, 600.0), default=1.0, metavar="SECONDS",
                       help="GPU runs also warm up for at least this long after their first frame (a first start's "
                            "plan tuning and graph capture do not count), 0..600 (default: %(default)s; from idle, "
                            "a GPU and its host take a fraction of a second to reach their steady clocks: with 20 "
                            "frames alone a run's first frame set measured up to 0.05 ms slower)")
    bench.add_argument("--precisions", type=names_in(BENCH_PRECISIONS), default="fp32,tf32,fp16",
                       help="fp32 (IEEE), tf32 (fp32 graph, TensorFloat-32 convolutions), fp16 (GPU only: the CPU "
                            "runs the model's fp32 graphs, or the fp16 ones of an fp16 model dir)")
    bench.add_argument("--pipelines", "--streams", dest="pipelines", type=int_list_in(1, MAX_PIPELINES),
                       default="1,2,4", help=f"pipeline counts for the throughput test, 1..{MAX_PIPELINES} (as "
                                             "infer's --pipelines; --streams is its older name; GPU only)")
    bench.add_argument("--batches", type=int_list_in(1, MAX_BATCH), default="1,2,4,8",
                       help=f"batch sizes of the batch sweep, 1..{MAX_BATCH} (largest: also in the throughput test; "
                            "GPU only)")
    bench.add_argument("--sweep-precisions", type=names_in(BENCH_PRECISIONS), default="fp16",
                       help="precisions that get the batch sweep and throughput test (GPU only)")
    bench.add_argument("--page-locked", action="store_true",
                       help="also time each frame set with its frames in page-locked host memory, which detect "
                            "copies to the device without a host copy (GPU only)")
    bench.add_argument("--soak", type=int_in(0, 10_000_000), default=0,
                       help="frames for the soak test (0: none; GPU only)")
    bench.add_argument("--no-baselines", action="store_true",
                       help="skip the baselines run in this process on the same weights: the PyTorch peers and a "
                            "pipeline that copies between the stages through the host")
    bench.add_argument("--out", default="bench_out", type=path_name,
                       help="folder for the report (JSON and Markdown tables)")
    bench.set_defaults(run=run_bench_command)


@dataclass
class _Model:
    cfg: ModelConfig
    weights: ModelWeights | None
    source: str
    model_dir: ModelDir | None   # given by the user; else one is exported per precision


def run_bench_command(args: argparse.Namespace) -> int:
    """``bench``: 0, or 1 when files of --frames were left out (each said in an ``error:`` line; the report
    counts them)."""
    from ...devices import pick_device

    if args.point_dim is not None and not args.frames:
        raise InputError("--point-dim applies to --frames (the values a point of their .bin files); the simulated "
                         "scans have the model's: drop it")
    out = Path(args.out)
    if args.model is not None and lies_in(out, args.model):
        raise InputError(f"--out {safe_repr(str(out))} lies in the model dir {safe_repr(str(args.model))}, whose one "
                         "writer is build (a rebuild would refuse the files bench leaves there): give a folder outside it")
    check_writable_folder(out, "--out")  # before the model loads and the frames are read, not once timed
    missing = no_png_line()  # the run's one check for matplotlib: the chart and the note both follow it
    refuse_foreign_reports(out, chart=missing is None)
    frame_files = list_frame_folders(args.frames) if args.frames else []  # before the model is read
    model = _load_model(args.model, args.config)
    columns = model.cfg.num_point_columns
    device, device_id, reason = pick_device(args.device)  # an explicit GPU that cannot run: as infer says it
    if args.iterations is None:
        args.iterations = CPU_ITERATIONS if device == "cpu" else GPU_ITERATIONS
    frame_sets, left_out, sources = (
        folder_frame_sets(args.frames, columns, args.point_dim or columns, limit=args.iterations,
                          say=lambda line: print(line, file=sys.stderr), listed=frame_files)
        if args.frames else (simulated_frame_sets(columns=columns), [], {}))
    cpu_model = _cpu_model_dir(model, out) if device == "cpu" else None
    if cpu_model is not None:
        _say_cpu_run(args, cpu_model.precision, reason)
    results: dict[str, Any] = {
        "model": model.source, "config": model.cfg.name, "iterations": args.iterations, "warmup": args.warmup,
        "warmup_time_s": args.warmup_time if device == "cuda" else 0.0,
        "device": device, "device_name": _device_name(device, device_id), "runs": [], "ratios": [],
        "throughput": [], "copies": [], "notes": list(left_out), "batches": [], "memory": [],
    }
    if cpu_model is not None:
        _bench_cpu(cpu_model, frame_sets, args, results)
    else:
        import cupy as cp

        if args.threads is not None:
            print("note: --threads applies to CPU runs; the GPU run's engines take no thread count", file=sys.stderr)
        with cp.cuda.Device(device_id):  # what runs on the current GPU (plan builds, memory readings) runs on it
            _bench_gpu(model, frame_sets, args, out, results, device_id)
    for line in _no_pillar_findings(results, sources):
        print(f"warning: {line}", file=sys.stderr)
        results["notes"].append(line)
    if missing is not None:
        results["notes"].append(missing)
    for path in write_reports(results, out, chart=missing is None):
        print(f"wrote {printable_text(str(path))}")
    if missing is not None:
        print(missing)
    print((out / "bench.md").read_text())
    return EXIT_FRAME_FAILURES if left_out else 0


def _no_pillar_findings(results: dict[str, Any], sources: dict[str, list[str]]) -> list[str]:
    """A line for each --frames set (``sources``: the file of each of its frames) of which frames timed made no
    pillar (files empty, all non-finite or outside the model's point range), naming the first: their times are of
    frames with nothing to detect on, which the report's rows would give as the set's latency without a word."""
    lines = []
    for name, files in sources.items():
        # its first run (every run times the same frames); none where no precision asked for was the model dir's
        run = next((r for r in results["runs"] if r["frames"] == name), None)
        if run is not None and run["no_pillar_frames"]:
            empty, timed = run["no_pillar_frames"], run["distinct_frames"]
            which = agree(timed, "its one frame timed", f"{empty} of the {timed} frames timed")
            its, frames = agree(empty, ("its", "a frame"), ("their", "frames"))
            first = safe_repr(files[run["first_no_pillar_frame"]])
            lines.append(f"--frames set {safe_repr(name)}: {which} made no pillar ({its} points are none, non-finite "
                         f"or outside the model's point range): {its} times are of {frames} with nothing to detect on; "
                         + agree(empty, f"the frame: {first}", f"the first: {first}"))
    return lines


def _load_model(spec: str | None, config: str | None) -> _Model:
    """The model timed: ``--model`` checked against ``--config`` as infer checks it, else a seeded random one."""
    if spec is None:
        from ...convert.weights import random_weights

        cfg = load_config(config or DEFAULT_CONFIG)
        return _Model(cfg, random_weights(cfg, seed=0), f"{cfg.name}, seeded random weights (untrained)", None)
    path = existing_model_path(spec)
    if path.is_file():
        from ...convert.checkpoint import load_checkpoint
        from ...convert.export import say_builtin_config

        ckpt = load_checkpoint(spec, config=config)
        if config is None:  # as build and infer say it of a checkpoint they build
            say_builtin_config(ckpt, stacklevel=2)
        return _Model(ckpt.config, ckpt.weights, f"{escape_text(spec)} ({ckpt.layout})", None)
    md = load_model_dir_of_config(path, config)
    return _Model(md.cfg, None, f"{escape_text(spec)} (model dir, {md.precision})", md)


def _model_dir(model: _Model, label: str, out: Path) -> ModelDir | None:
    """The model dir for a bench precision label (fp32, tf32, fp16): the user's own when it has that
    precision, else one exported under ``out`` (one per label, so TensorRT plans of TF32 and IEEE fp32
    never share a folder and a user's plans are never rebuilt)."""
    from ...convert.export import export_model_dir

    graphs = "fp32" if label == "tf32" else label
    if model.model_dir is not None:
        return model.model_dir if model.model_dir.precision == graphs else None
    assert model.weights is not None
    return export_model_dir(model.weights, model.cfg, out / "models" / label, precision=graphs,
                            source={"benchmark": model.source})


def _cpu_model_dir(model: _Model, out: Path) -> ModelDir:
    """What the CPU run times: fp32 graphs (exported once under ``out``), or a given model dir's own."""
    md = _model_dir(model, "fp32", out) or model.model_dir
    assert md is not None
    return md


def _say_cpu_run(args: argparse.Namespace, precision: str, reason: str | None) -> None:
    """The CPU run's line, why a visible GPU goes unused, that fp16 graphs gain nothing there (as infer says them),
    and the GPU-only options given that it ignores."""
    print(f"running on CPU, ONNX Runtime, {precision}: {counted(args.iterations, 'timed frame')} per frame set",
          file=sys.stderr)
    for note in (gpu_unused_note(reason) if args.device == "auto" else None, cpu_fp16_note("cpu", precision)):
        if note:
            print(note, file=sys.stderr)
    defaults = _bench_defaults()
    ignored = ["--" + dest.replace("_", "-") for dest in GPU_ONLY_OPTIONS if getattr(args, dest) != defaults[dest]]
    if ignored:  # the defaults left alone are not said: the line above and the table name the precision run
        print(f"note: {', '.join(ignored)} {agree(len(ignored), 'applies', 'apply')} to GPU runs; the CPU run times "
              f"the latency of the model's {precision} graphs only", file=sys.stderr)


def _bench_defaults() -> dict[str, Any]:
    """bench's options as a command line without any parses them."""
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return vars(parser.parse_args(["bench"]))


def _bench_cpu(md: ModelDir, frame_sets: dict[str, list[np.ndarray]], args: argparse.Namespace,
               results: dict[str, Any]) -> None:
    from ...cpu_detector import CpuDetector
    from ...detector import onnxruntime_threads
    from ..runtime_args import threads_of_args

    threads = onnxruntime_threads(threads_of_args(args))  # as infer's CPU detector takes them
    results["threads"] = threads
    detector = CpuDetector(md, threads=threads)
    warmup = min(args.warmup, 1)  # the CPU path has nothing to warm up beyond one frame
    with progress_bar(len(frame_sets) * (args.iterations + warmup), True, desc="bench (CPU)") as bar:
        # a CPU frame takes ~1 s: a terminal shows the progress and the time left
        for name, frames in frame_sets.items():
            run = measure_latency(detector.detect, lambda: detector.last_timings, frames, args.iterations,
                                  warmup=warmup, done=bar.update)
            results["runs"].append({"engine": "cpu (numpy + onnxruntime)", "precision": md.precision, "frames": name,
                                    **run})
    detector.close()
    results["notes"].append("CPU run: stage times are wall clock; the GPU targets do not apply")


TORCH_BASELINE = "PyTorch eager re-implementation fp32"


def _bench_gpu(model: _Model, frame_sets: dict[str, list[np.ndarray]], args: argparse.Namespace, out: Path,
               results: dict[str, Any], device_id: int) -> None:
    from ...gpu_pipeline import GpuPipeline

    best_p50: dict[str, tuple[str, float]] = {}
    first_name, first_frames = next(iter(frame_sets.items()))
    batches = args.batches
    latency_sets = {**frame_sets, **(page_locked_frame_sets(frame_sets) if args.page_locked else {})}
    for backend in _gpu_backends(results, device_id):
        engine = BACKENDS[backend].label
        for precision in args.precisions:
            md = _model_dir(model, precision, out)
            if md is None:
                continue
            tf32 = precision != "fp32"
            if BACKENDS[backend].artefact == "plan" and not md.has_plans():
                from ...convert.export import build_model_plans

                build_model_plans(md, precision=md.precision, tf32=tf32)
            before = device_memory_used_mib(release=True)
            pipe = GpuPipeline(md, backend=backend, tf32=tf32, device_id=device_id)
            for name, frames in latency_sets.items():
                run = _timed_latency(pipe, frames, args)
                results["runs"].append({"engine": engine, "precision": precision, "frames": name, **run,
                                        "mode": pipe.execution_mode})
                c = pipe.copies
                results["copies"].append({"engine": f"{engine} {precision}", "frames": name,
                                          "h2d_copies": c.h2d_copies, "h2d_bytes": c.h2d_bytes,
                                          "d2h_copies": c.d2h_copies, "d2h_bytes": c.d2h_bytes})
                label = f"{engine} {precision}"
                if name not in best_p50 or run["e2e_ms"]["p50"] < best_p50[name][1]:
                    best_p50[name] = (label, run["e2e_ms"]["p50"])
            results["memory"].append({"engine": engine, "precision": precision, "batch": 1,
                                      "device_mib": device_memory_used_mib(release=True) - before})
            if args.soak:
                results["soak"] = soak(pipe.detect, first_frames, args.soak)
                args.soak = 0  # one soak per bench run, on the first engine
            pipe.close()
            if precision not in args.sweep_precisions:
                continue
            for b in batches:
                before = device_memory_used_mib(release=True)
                batch_pipe = GpuPipeline(md, backend=backend, tf32=tf32, device_id=device_id, max_batch=b)
                sweep = measure_batches(batch_pipe.detect_batch, first_frames, b, max(20, args.iterations // b),
                                        min(args.warmup, 5), args.warmup_time)
                batch_pipe.stage_timings = True  # one more batch, timed, for its stage times
                batch_pipe.detect_batch([first_frames[k % len(first_frames)] for k in range(b)])
                results["batches"].append({"engine": engine, "precision": precision, "frames": first_name, **sweep,
                                           "stages_ms": dict(batch_pipe.last_timings)})
                results["memory"].append({"engine": engine, "precision": precision, "batch": b,
                                          "device_mib": device_memory_used_mib(release=True) - before})
                batch_pipe.close()
            for count in args.pipelines:
                for b in sorted({1, batches[-1]}):
                    fps = measure_throughput(
                        lambda: GpuPipeline(md, backend=backend, tf32=tf32, device_id=device_id,  # noqa: B023
                                            max_batch=b),
                        first_frames, count, frames_per_pipeline=max(64, args.iterations // 2), batch=b,
                        warmup_s=args.warmup_time, seconds=THROUGHPUT_SECONDS)
                    results["throughput"].append({"engine": engine, "precision": precision, "frames": first_name,
                                                  "pipelines": count, "batch": b, "fps": fps})
            device_memory_used_mib(release=True)
    if not args.no_baselines:
        _bench_baselines(model, frame_sets, args, out, results, best_p50, device_id)


def _timed_latency(pipe: Any, frames: list[np.ndarray], args: argparse.Namespace) -> dict[str, Any]:
    """``measure_latency`` of a GPU pipeline as users run it (stage timings off), with the stage times of
    a second pass with them on (their events cost GPU time, so they stay out of the e2e numbers)."""
    pipe.stage_timings = False
    run = measure_latency(pipe.detect, dict, frames, args.iterations, args.warmup, args.warmup_time)
    pipe.stage_timings = True
    timed = measure_latency(pipe.detect, lambda: pipe.last_timings, frames, args.iterations, args.warmup)
    pipe.stage_timings = False
    return {**run, "stages_ms": timed["stages_ms"]}


def _bench_baselines(model: _Model, frame_sets: dict[str, list[np.ndarray]], args: argparse.Namespace, out: Path,
                     results: dict[str, Any], best_p50: dict[str, tuple[str, float]], device_id: int) -> None:
    from .round_trip import HostRoundTripPipeline

    md = _model_dir(model, "tf32", out)
    if md is not None and onnxruntime_cuda_unavailable_reason() is not None:
        results["notes"].append("host-round-trip baseline skipped: it runs on onnxruntime-gpu")
    elif md is not None:
        pipe = HostRoundTripPipeline(md, backend="onnxruntime", stage_timings=True, device_id=device_id)
        _baseline_runs("host round trip (ours, onnxruntime tf32)", pipe.detect, lambda: pipe.last_timings,
                       frame_sets, args, results, best_p50)
        results["copies"].append({"engine": "host round trip", "frames": "last frame", **vars(pipe.copies)})
        pipe.close()
    if model.weights is None:
        results["notes"].append("PyTorch baseline skipped: a model dir holds no weights; pass a checkpoint")
        return
    from ...convert.weights import PointPillarsWeights

    if not isinstance(model.weights, PointPillarsWeights):
        results["notes"].append("PyTorch baseline skipped: it re-implements single-head models only")
        return
    try:
        from ...baselines.torch_eager import TorchPointPillars
    except ImportError as exc:
        results["notes"].append(f"PyTorch baseline skipped: {exc}")
        return
    torch_model = TorchPointPillars(model.weights, model.cfg, device=f"cuda:{device_id}")
    classes = model.cfg.classes
    _baseline_runs(TORCH_BASELINE, lambda pts: Detections(*torch_model(pts), classes), lambda: {}, frame_sets,
                   args, results, best_p50)
    results["notes"].append(f"{TORCH_BASELINE}: a lean in-process re-implementation (straightforward torch ops, "
                            "cuDNN convs, BN not folded, axis-aligned torchvision NMS), not the PyTorch peer "
                            "code base; the peer's own numbers are in docs/BENCHMARK_H200.md")


def _baseline_runs(label: str, detect: Any, timings: Any, frame_sets: dict[str, list[np.ndarray]],
                   args: argparse.Namespace, results: dict[str, Any], best_p50: dict[str, tuple[str, float]]) -> None:
    for name, frames in frame_sets.items():
        iterations = max(20, args.iterations // 4)
        run = measure_latency(detect, timings, frames, iterations, min(args.warmup, 10), args.warmup_time)
        results["runs"].append({"engine": label, "precision": "fp32", "frames": name, **run})
        if name in best_p50:
            ours, ours_p50 = best_p50[name]
            results["ratios"].append({"frames": name, "ours": ours, "ours_p50": ours_p50, "baseline": label,
                                      "baseline_p50": run["e2e_ms"]["p50"],
                                      "speedup": run["e2e_ms"]["p50"] / ours_p50})


def _gpu_backends(results: dict[str, Any], device_id: int) -> list[str]:
    """The registry's backends that run on GPU ``device_id``, by auto priority; a note for each that does not."""
    backends = []
    for row, reason in gpu_backend_rows(device_id):
        if reason is None:
            backends.append(row.name)
        else:
            results["notes"].append(f"{row.label} rows skipped: {reason}")
    if not backends:
        raise PointPillarsError("bench: no GPU engine backend (" + ", ".join(BACKEND_NAMES) + ") can run here")
    return backends


def _device_name(device: str, device_id: int) -> str:
    if device == "cpu":
        return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(device_id)
    return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
