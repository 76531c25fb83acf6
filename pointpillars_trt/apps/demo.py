"""``pointpillars-trt demo``: the whole path on a frame and a model the project makes itself.

Both are labelled for what they are: the frame is a SIMULATED 64-beam scan and the model has SEEDED
RANDOM, UNTRAINED weights, so the boxes it prints are meaningless. The demo shows the plumbing and
the timings, and needs no file from anywhere.
"""

from __future__ import annotations

from pathlib import Path

from ..config import load_config
from .demo_scene import simulate_scan
from ..detector import PointPillars
from ..errors import PointPillarsError
from ..fileio import write_json_atomic
from ..kitti import write_velodyne_bin
from ..build.export import export_model_dir
from ..build.weights import random_weights


def run_demo(out: Path, *, config: str = "openpcdet_kitti_3class", seed: int = 0, device: str = "auto") -> int:
    cfg = load_config(config)
    out.mkdir(parents=True, exist_ok=True)
    points, objects = simulate_scan(seed=seed)
    write_velodyne_bin(points, out / "simulated_frame.bin")
    model = export_model_dir(random_weights(cfg, seed=seed), cfg, out / "random_model", precision="fp32",
                             source={"random_seed": seed, "note": "untrained, for demonstration only"})
    print(f"frame : SIMULATED 64-beam scan, {points.shape[0]} points, {len(objects)} objects placed "
          f"-> {out / 'simulated_frame.bin'}")
    print(f"model : {cfg.name} with SEEDED RANDOM (UNTRAINED) weights, seed {seed} -> {model.path}")
    print("        the boxes below are meaningless; they only show the pipeline working\n")

    with PointPillars(model, device=device) as detector:  # type: ignore[arg-type]
        detector(points)  # warm-up: session creation, kernel load, CUDA graph capture
        detections = detector(points)
        timings = detector.last_timings
        where = detector.device
    print(f"device: {where}   pillars: {detections.stats.num_pillars}   boxes: {len(detections)}\n")
    print(_detection_table(detections, limit=15))
    print("\nstage times (ms, " + ("CUDA events" if where == "cuda" else "wall clock") + "):")
    print("  " + "  ".join(f"{k} {v:.2f}" for k, v in timings.items()))
    write_json_atomic(out / "detections.json", detections.to_json_dict("simulated_frame"))
    print(f"\nwrote {out / 'detections.json'}")
    try:
        from .viz import plot_bev

        plot_bev(points, detections.boxes, detections.names, detections.scores, out / "bev.png",
                 point_range=cfg.voxel.point_range, title="SIMULATED scan, UNTRAINED random model")
        print(f"wrote {out / 'bev.png'}")
    except PointPillarsError as exc:  # matplotlib missing: the PNG is optional
        print(f"no PNG: {exc}")
    return 0


def _detection_table(detections, limit: int) -> str:  # type: ignore[no-untyped-def]
    rows = ["  #  label        score      x       y      z     dx    dy    dz  heading"]
    for i, (name, score, box) in enumerate(zip(detections.names, detections.scores, detections.boxes)):
        if i == limit:
            rows.append(f"  ... {len(detections) - limit} more")
            break
        x, y, z, dx, dy, dz, h = box.tolist()
        rows.append(f"{i:3d}  {name:<11} {score:5.3f} {x:7.2f} {y:7.2f} {z:6.2f} {dx:5.2f} {dy:5.2f} {dz:5.2f} {h:7.3f}")
    return "\n".join(rows)
