"""``pointpillars-trt demo``: the whole path on a frame and a model the project makes itself.

Both are labelled for what they are: the frame is a SIMULATED 64-beam scan and the model has SEEDED
RANDOM, UNTRAINED weights, so the boxes it prints are meaningless. The demo shows the plumbing and
the timings, and needs no file from anywhere.

The first frame is timed on its own and labelled cold (it pays for engine sessions, kernel loads
and CUDA graph capture); the steady-state times are the median over ``repeats`` more frames.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from ..config import load_config
from ..detections import Detections
from ..errors import InputError, PointPillarsError, counted, example, printable_text, safe_repr
from ..file_reads import not_a_file
from ..file_writes import check_writable_folder
from ..kitti import normalize_heading
from ..points import SUPPORTED_EXTENSIONS
from ..strict_json import write_json_atomic
from .demo_scene import simulate_scan
from .device_notice import print_device_notice

DEFAULT_REPEATS = 10
#: The most --repeats: a CPU frame takes about a second, and the steady-state median is settled long before.
MAX_REPEATS = 1000
#: The files the demo writes in its --out, beside its model dir ``random_model``.
DEMO_FILES = ("simulated_frame.bin", "detections.json", "bev.png")


def check_device(device: str, backend: str) -> None:
    """Refuse an explicit ``cuda`` / ``cuda:N`` this machine cannot run, and a GPU-only backend where the
    frames would run on the CPU, before anything is written."""
    from ..devices import check_backend_runs_on, pick_device
    from ..runtime_options import devices_expected, parse_device

    try:
        parse_device(device)
    except PointPillarsError:
        raise PointPillarsError(f"--device {safe_repr(device)}: {devices_expected(device)}") from None
    kind, _, fallback_reason = pick_device(device)  # the detector's own refusal (and wording) of a GPU that cannot run
    check_backend_runs_on(kind, backend, fallback_reason)


def run_demo(out: Path, *, config: str = "openpcdet_kitti_3class", seed: int = 0, device: str = "auto",
             repeats: int = DEFAULT_REPEATS, backend: str = "auto") -> int:
    from ..convert.export import export_model_dir
    from ..convert.weights import random_weights
    from ..detector import PointPillars
    from ..kitti import write_velodyne_bin
    from .viz import no_png_line

    if not 1 <= repeats <= MAX_REPEATS:
        raise PointPillarsError(f"--repeats {repeats}: expected a number of frames in 1..{MAX_REPEATS}")
    cfg = load_config(config)
    weights = random_weights(cfg, seed=seed)
    check_device(device, backend)  # nothing written yet
    check_writable_folder(out, "--out")  # a file in its place is one error line, as infer and bench say it
    missing = no_png_line()  # the run's one check for matplotlib: the PNG is optional, its place checked if drawn
    refuse_foreign_demo_outputs(out, chart=missing is None)
    refuse_a_folder_of_frames(out)
    points, objects = simulate_scan(seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    # the model first: a folder of that name that is no model dir is refused before anything is written
    model = export_model_dir(weights, cfg, out / "random_model", precision="fp32",
                             source={"random_seed": seed, "note": "untrained, for demonstration only"})
    write_velodyne_bin(points, out / "simulated_frame.bin")
    print(f"frame : SIMULATED 64-beam scan, {points.shape[0]} points, {len(objects)} objects placed "
          f"-> {printable_text(str(out / 'simulated_frame.bin'))}")
    print(f"model : {cfg.name} with SEEDED RANDOM (UNTRAINED) weights, seed {seed} -> {printable_text(str(model.path))}")
    print("        the boxes below are meaningless; they only show the pipeline working\n")

    with PointPillars(model, device=device, backend=backend, stage_timings=True) as detector:
        print_device_notice(detector, file=sys.stdout)
        start = time.perf_counter()
        detections = detector(points)
        cold_wall = (time.perf_counter() - start) * 1e3
        cold = dict(detector.last_timings)
        where = detector.device
        # the boxes as soon as the first frame has them: the frames timed after it (a second each on the CPU) give
        # the same ones, and the run says what it is waiting for
        print(f"pillars: {detections.stats.num_pillars}   boxes: {len(detections)}\n")  # where it ran: the first line
        print(_detection_table(detections, limit=15))
        print(f"\ntiming {counted(repeats, 'more frame')} for the steady-state times"
              + (" (about a second each on the CPU)" if where == "cpu" else "") + " ...", flush=True)
        steady: list[dict[str, float]] = []
        walls: list[float] = []
        for _ in range(repeats):
            start = time.perf_counter()
            detector(points)
            walls.append((time.perf_counter() - start) * 1e3)
            steady.append(dict(detector.last_timings))
    clock = "CUDA events" if where == "cuda" else "wall clock"
    print(f"\nstage times (ms, {clock}):")
    print("  first frame (cold: includes engine set-up, kernel loading"
          + (", CUDA graph capture" if where == "cuda" else "") + "):")
    print("    " + _stage_line(cold) + f"   | call {cold_wall:.2f}")
    median = {k: statistics.median(t[k] for t in steady) for k in steady[0]} if steady else {}
    print(f"  steady state (median of {counted(repeats, 'more frame')}):")
    print("    " + _stage_line(median) + f"   | call {statistics.median(walls):.2f}"
          + (f" (min {min(walls):.2f}, max {max(walls):.2f})" if len(walls) > 1 else ""))
    write_json_atomic(out / "detections.json", detections.to_json_dict("simulated_frame"))
    print(f"\nwrote {printable_text(str(out / 'detections.json'))}")
    from .viz import plot_bev

    if missing is not None:
        print(missing)
        return 0
    plot_bev(points, detections.boxes, detections.names, detections.scores, out / "bev.png",
             point_range=cfg.voxel.point_range, title="SIMULATED scan, UNTRAINED random model")
    print(f"wrote {printable_text(str(out / 'bev.png'))}")
    return 0


def refuse_foreign_demo_outputs(out: Path, chart: bool) -> None:
    """Refuse, before anything is written, an --out holding in one of the demo's files' places a folder or
    another node that is no regular file (its write would fail after the whole run, with the frame and the
    model already written), or a ``detections.json`` or ``bev.png`` the demo did not write
    (``outputs.foreign_output``: a user's own results or pictures there were replaced); ``bev.png`` only with
    ``chart`` (matplotlib draws it). Its model dir, ``random_model``, is the export's to refuse, before anything is
    written."""
    from .outputs import foreign_output

    written = DEMO_FILES if chart else tuple(n for n in DEMO_FILES if n != "bev.png")
    for name in written:
        path = out / name
        kind = not_a_file(path)
        if kind is not None:
            raise InputError(f"--out {safe_repr(str(out))} holds {name!r}, which is {kind}, not a regular file, "
                             "and the demo writes that file: remove it or give another --out")
    for name in written[1:]:  # simulated_frame.bin is not judged: any frame's bytes could be the demo's
        reason = foreign_output(out / name) if (out / name).exists() else None
        if reason is not None:
            raise InputError(f"--out {safe_repr(str(out))} holds {name!r}, which the demo did not write ({reason}), "
                             "and the demo would overwrite it: give another --out")


def refuse_a_folder_of_frames(out: Path) -> None:
    """Refuse, before anything is written, an --out that holds point files besides the demo's own frame (a KITTI
    velodyne folder, say): the simulated frame written there would be one more frame to an ``infer`` of that
    folder, its boxes mixed with the real frames' outputs. Listed as infer lists a folder (hidden files left out)."""
    try:
        with os.scandir(out) as entries:
            frames = sorted(entry.name for entry in entries
                            if entry.name != DEMO_FILES[0] and not entry.name.startswith(".")
                            and os.path.splitext(entry.name)[1].lower() in SUPPORTED_EXTENSIONS
                            and not _leads_to_folder(entry))
    except OSError:  # not there yet (or unreadable: the write probe says so)
        return
    if frames:
        raise InputError(f"--out {safe_repr(str(out))} holds {counted(len(frames), 'point file')} "
                         f"({example(len(frames), safe_repr(frames[0]))}), and the demo's simulated frame written "
                         "there would be one more frame of that folder to infer: give the demo a folder of its own "
                         "(its default: demo_out)")


def _leads_to_folder(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a folder, or a link to one; a link that leads nowhere (a loop) is none, as infer lists it
    (its is_dir raised, which had ended the listing as if the folder were not there)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _stage_line(timings: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.2f}" for k, v in timings.items())


def _detection_table(detections: Detections, limit: int) -> str:
    rows = ["  #  label        score      x       y      z     dx    dy    dz  heading"]
    for i, (name, score, box) in enumerate(zip(detections.names, detections.scores, detections.boxes)):
        if i == limit:
            rows.append(f"  ... {len(detections) - limit} more")
            break
        x, y, z, dx, dy, dz, h = box.tolist()
        h = normalize_heading(h)  # as detections.json holds it: in [-pi, pi)
        rows.append(f"{i:3d}  {name:<11} {score:5.3f} {x:7.2f} {y:7.2f} {z:6.2f} {dx:5.2f} {dy:5.2f} {dz:5.2f} {h:7.3f}")
    return "\n".join(rows)
