"""Benchmark reports: a markdown table for people, JSON for machines, a PNG bar chart of stage times."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...detections import STAGES as STAGE_ORDER
from ...errors import InputError, safe_repr
from ...file_reads import read_file_head, not_a_file
from ...file_writes import write_bytes_atomic, write_text_atomic
from ...strict_json import loads_json, write_json_atomic
from ..outputs import checked_write, foreign_output

#: What bench writes in --out: the reports, then the chart (with matplotlib).
REPORT_FILES = ("bench.md", "bench.json")
CHART_FILE = "bench_stages.png"
#: How bench's Markdown report starts, and the keys its JSON report has: what tells them from a user's own files.
MARKDOWN_TITLE = "# pointpillars-trt bench"
JSON_KEYS = ("model", "config", "device_name", "runs")
#: The PNG "Software" text of bench's chart (``outputs.foreign_output`` takes a pointpillars-trt picture as its own).
CHART_SOFTWARE = "pointpillars-trt bench"
#: Bytes beyond any bench.json (a few hundred kilobytes for a long GPU run): a larger file is no report of bench's.
_REPORT_MAX_BYTES = 1 << 26

#: How the latency table's times were taken, by where the run ran (the CPU path always times its stages).
TIMINGS = {"cuda": "e2e: host to host, stage timings off as by default; stages: GPU time from CUDA events, a "
                   "second pass with them on",
           "cpu": "e2e: host to host; stages: wall clock per stage, in the same pass"}


def markdown_report(results: dict[str, Any]) -> str:
    lines = [f"{MARKDOWN_TITLE} — {results['device_name']}", ""]
    lines += [f"model: {results['model']}  ", f"config: {results['config']}  ",
              *([f"ONNX Runtime threads: {results.get('threads') or 'its default, one per core'}  "]
                if results["device"] == "cpu" else []),
              f"timed frames per frame set: {results['iterations']} (the warm-up frames of each run: the table's "
              "warm-up column" + (f"; at least {results['warmup_time_s']:g} s of them" if results.get("warmup_time_s")
                                  else "") + ")"]
    lines += _table(
        (f"Latency, one frame at a time (ms; {TIMINGS[results['device']]}; avg points and avg "
         "pillars: of the distinct frames timed, each once: the whole set once the iterations reach its size)"),
        ["engine", "precision", "frames", "avg points", "avg pillars", *STAGE_ORDER, "stages total", "e2e min",
         "e2e p50", "e2e p90", "e2e p99", "warm-up", "mode"],
        [[r["engine"], r["precision"], r["frames"], f"{r['avg_points']:.0f}", f"{r['avg_pillars']:.0f}",
          *(_ms(r["stages_ms"].get(s)) for s in STAGE_ORDER), _ms(r["stages_ms"].get("total")),
          *(_ms(r["e2e_ms"][k]) for k in ("min", "p50", "p90", "p99")), r.get("warmup", "—"), r.get("mode", "—")]
         for r in results["runs"]])
    lines += _table(
        "Batch sweep (one pipeline, B frames per call, host to host)",
        ["engine", "precision", "frames", "batch", "batch p50 ms", "batch p99 ms", "ms per frame", "frames/s",
         "rpn ms (last batch)"],
        [[s["engine"], s["precision"], s["frames"], s["batch"], _ms(s["batch_ms"]["p50"]), _ms(s["batch_ms"]["p99"]),
          _ms(s["frame_ms_p50"]), f"{s['fps']:.0f}", _ms(s["stages_ms"].get("rpn"))]
         for s in results.get("batches") or []])
    lines += _table(
        "Against the baselines (p50 end to end, same weights and frames)",
        ["frames", "ours", "ours p50", "baseline", "baseline p50", "speed-up"],
        [[r["frames"], r["ours"], _ms(r["ours_p50"]), r["baseline"], _ms(r["baseline_p50"]), f"{r['speedup']:.1f}x"]
         for r in results.get("ratios") or []])
    lines += _table(
        "Throughput (independent pipelines, each its own streams and host thread)",
        ["engine", "precision", "frames", "pipelines", "batch", "frames/s"],
        [[t["engine"], t["precision"], t["frames"], t["pipelines"], t.get("batch", 1), f"{t['fps']:.0f}"]
         for t in results.get("throughput") or []])
    lines += _table(
        "Copies per frame",
        ["engine", "frames", "H2D copies", "H2D bytes", "D2H copies", "D2H bytes"],
        [[c["engine"], c["frames"], c["h2d_copies"], c["h2d_bytes"], c["d2h_copies"], c["d2h_bytes"]]
         for c in results.get("copies") or []])
    lines += _table(
        "Device memory of one pipeline (MiB, measured around it alone, caches released between)",
        ["engine", "precision", "batch", "device MiB"],
        [[m["engine"], m["precision"], m["batch"], f"{m['device_mib']:.0f}"] for m in results.get("memory") or []])
    soak = results.get("soak")
    if soak:
        lines += _table(
            "Soak", ["frames", "device MiB start", "end", "host RSS MiB start", "end", "p50 first 10%", "p50 last 10%"],
            [[soak["frames"], f"{soak['device_mib_start']:.0f}", f"{soak['device_mib_end']:.0f}",
              f"{soak['host_rss_mib_start']:.0f}", f"{soak['host_rss_mib_end']:.0f}", _ms(soak["p50_first"]),
              _ms(soak["p50_last"])]])
    notes = results.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _table(title: str, header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown section with one table; nothing when there are no rows."""
    if not rows:
        return []
    return ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *("| " + " | ".join(str(v) for v in row) + " |" for row in rows)]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def refuse_foreign_reports(out: Path, *, chart: bool) -> None:
    """Refuse, before anything runs, an --out where a file that bench did not write is in a report's place: a
    user's own bench.md or bench.json was replaced without a word, and a folder or a FIFO there failed the
    write after the whole run. bench's own earlier reports (and, with ``chart``, its chart) are replaced."""
    for name in (*REPORT_FILES, *([CHART_FILE] if chart else [])):
        reason = foreign_report(out / name) if os.path.lexists(out / name) else None
        if reason is not None:
            raise InputError(f"--out {safe_repr(str(out))} holds {name!r}, which bench did not write ({reason}): give "
                             "another --out, or move it away")


def foreign_report(path: Path) -> str | None:
    """Why the file at ``path``, in the place of one of bench's outputs, is none that bench writes (None: it is
    one, or a link to nothing, which the write replaces); the chart as ``outputs.foreign_output`` judges a picture."""
    kind = not_a_file(path)
    if kind is not None:
        return f"it is {kind}, not a regular file"
    if path.name == CHART_FILE:
        return foreign_output(path)
    try:
        data = read_file_head(path, _REPORT_MAX_BYTES + 1, what="report")
    except (OSError, InputError):
        return None  # a link to nothing (replaced), or unreadable (the write says why it fails, naming it)
    if len(data) > _REPORT_MAX_BYTES:
        return "larger than any report of bench's"
    if path.suffix == ".md":
        return None if data.startswith(MARKDOWN_TITLE.encode()) else f"it does not start with {MARKDOWN_TITLE!r}"
    try:
        report = loads_json(data)
    except (ValueError, RecursionError):
        return "not JSON"
    if isinstance(report, dict) and all(key in report for key in JSON_KEYS):
        return None
    return "JSON without the keys of bench's report"


def write_reports(results: dict[str, Any], out: Path, *, chart: bool) -> Iterator[Path]:
    """bench.md, bench.json and, with ``chart`` (the caller's one check found matplotlib: ``no_png_line``),
    bench_stages.png; each path once it is written (one that fails is an InputError naming it, after the
    paths written before it)."""
    out.mkdir(parents=True, exist_ok=True)
    markdown, data = out / REPORT_FILES[0], out / REPORT_FILES[1]
    checked_write(markdown, lambda p: write_text_atomic(p, markdown_report(results)))
    yield markdown
    checked_write(data, lambda p: write_json_atomic(p, results))
    yield data
    if chart:
        picture = stage_chart(results)
        checked_write(out / CHART_FILE, lambda p: write_bytes_atomic(p, picture))
        yield out / CHART_FILE


def stage_chart(results: dict[str, Any]) -> bytes:
    """The chart's PNG. Left: stacked per-stage milliseconds of our engines (GPU or CPU time); right, on its own scale:
    end-to-end p50 of every run, baselines included, so sub-millisecond stages stay readable. Needs
    matplotlib: ``write_reports``' caller has checked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = results["runs"]
    ours = [r for r in runs if r.get("stages_ms")]
    fig = Figure(figsize=(max(8.0, 1.0 * len(runs) + 6), 5.0))
    FigureCanvasAgg(fig)
    ax, ax_e2e = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    bottoms = [0.0] * len(ours)
    for stage in STAGE_ORDER:
        heights = [r["stages_ms"].get(stage, 0.0) for r in ours]
        ax.bar(range(len(ours)), heights, bottom=bottoms, label=stage)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(ours)), [_label(r) for r in ours], fontsize=6, rotation=60, ha="right")
    ax.set_ylabel("ms per frame (median)")
    ax.set_title("pointpillars-trt stages", fontsize=9)
    ax.legend(fontsize=7)
    p50 = [r["e2e_ms"]["p50"] for r in runs]
    ax_e2e.barh(range(len(runs)), p50, color=["tab:blue" if r.get("stages_ms") else "tab:gray" for r in runs])
    ax_e2e.set_yticks(range(len(runs)), [_label(r).replace("\n", " ") for r in runs], fontsize=6)
    ax_e2e.set_xscale("log")
    ax_e2e.set_xlabel("end-to-end p50, ms (log scale; grey: baselines)")
    ax_e2e.set_title("host to host", fontsize=9)
    fig.suptitle(f"{results['device_name']}", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": CHART_SOFTWARE})  # whose it is: foreign_report
    return buffer.getvalue()


def _label(run: dict[str, Any]) -> str:
    return f"{run['engine'].split(' (')[0]}\n{run['precision']}\n{run['frames']}"
