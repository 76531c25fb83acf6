"""The per-frame outputs of ``infer`` (JSON or KITTI label files, written atomically) and its summary,
shared by the local, ``--server`` and ``--ray`` paths so that all three write the same files."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from ...detections import Detections
from ...detector import FrameResult
from ...errors import PointPillarsError
from ...fileio import write_json_atomic, write_text_atomic

EXIT_FRAME_FAILURES = 1


def write_frame_outputs(det: Detections, source: str, out: Path, output_format: str, calib: str | None) -> Path:
    """Write ``OUT/<stem>.json`` (the ``to_json_dict`` record) or ``OUT/<stem>.txt`` (KITTI label lines,
    camera frame from ``CALIB/<stem>.txt``) for the frame read from ``source``; returns the file."""
    from ...kitti import lidar_boxes_to_kitti_lines, read_calibration

    stem = Path(source).stem
    if output_format == "json":
        target = out / f"{stem}.json"
        write_json_atomic(target, det.to_json_dict(stem))
        return target
    calibration = read_calibration(Path(calib or ".") / f"{stem}.txt")
    lines = lidar_boxes_to_kitti_lines(det.boxes, det.scores, det.names, calibration)
    target = out / f"{stem}.txt"
    write_text_atomic(target, "".join(line + "\n" for line in lines))
    return target


def write_and_report(results: Iterable[FrameResult], total: int, *, out: Path | None, output_format: str,
                     calib: str | None, progress: bool) -> int:
    """Write each frame's outputs, print ``infer``'s summary and FAILED lines; the exit code."""
    from tqdm import tqdm

    failures: list[tuple[str, str]] = []
    total_boxes = 0
    bar = tqdm(results, total=total, unit="frame", disable=not progress or total < 2, file=sys.stderr)
    for result in bar:
        if result.error is not None or result.detections is None:
            failures.append((result.source, str(result.error)))
            continue
        det = result.detections
        try:
            if out:
                write_frame_outputs(det, result.source, out, output_format, calib)
        except PointPillarsError as exc:
            failures.append((result.source, str(exc)))
            continue
        except OSError as exc:  # the frame is fine; its output could not be written
            failures.append((result.source, f"cannot write to {out}: {exc.strerror or exc}"))
            continue
        total_boxes += len(det)
        if not out:
            top = ", ".join(f"{n} {s:.2f}" for n, s in zip(det.names[:3], det.scores[:3].tolist()))
            bar.write(f"{Path(result.source).name}: {len(det)} boxes, {det.stats.num_pillars} pillars"
                      + (f" [{top}]" if top else ""))
    print_summary(total - len(failures), total, total_boxes, out, failures)
    return EXIT_FRAME_FAILURES if failures else 0


def print_summary(done: int, total: int, boxes: int, out: object, failures: list[tuple[str, str]]) -> None:
    print(f"{done}/{total} frames, {boxes} boxes" + (f", written to {out}" if out else ""))
    for source, message in failures:
        print(f"FAILED {source}: {message}", file=sys.stderr)
