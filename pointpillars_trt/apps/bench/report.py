"""Benchmark reports: a markdown table for people, JSON for machines, a PNG bar chart of stage times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...detections import STAGES as STAGE_ORDER
from ...errors import PointPillarsError
from ...fileio import write_json_atomic, write_text_atomic


def markdown_report(results: dict[str, Any]) -> str:
    lines = [f"# pointpillars-trt bench — {results['device_name']}", ""]
    lines += [f"model: {results['model']}  ", f"config: {results['config']}  ",
              f"iterations per set: {results['iterations']} (after {results['warmup']} warm-up)", ""]
    runs = results["runs"]
    lines += ["## Latency (ms)", "",
              "| engine | precision | frames | avg points | avg pillars | " + " | ".join(STAGE_ORDER)
              + " | stages total | e2e min | e2e p50 | e2e p90 | e2e p99 |",
              "|" + " --- |" * (15)]
    for run in runs:
        st, e2e = run["stages_ms"], run["e2e_ms"]
        lines.append(
            f"| {run['engine']} | {run['precision']} | {run['frames']} | {run['avg_points']:.0f} | "
            f"{run['avg_pillars']:.0f} | " + " | ".join(_ms(st.get(s)) for s in STAGE_ORDER)
            + f" | {_ms(st.get('total'))} | {_ms(e2e['min'])} | {_ms(e2e['p50'])} | {_ms(e2e['p90'])} | {_ms(e2e['p99'])} |"
        )
    ratios = results.get("ratios") or []
    if ratios:
        lines += ["", "## Against the baselines (p50 end to end, same weights and frames)", "",
                  "| frames | ours | ours p50 | baseline | baseline p50 | speed-up |", "|" + " --- |" * 6]
        for r in ratios:
            lines.append(f"| {r['frames']} | {r['ours']} | {_ms(r['ours_p50'])} | {r['baseline']} | "
                         f"{_ms(r['baseline_p50'])} | {r['speedup']:.1f}x |")
    tput = results.get("throughput") or []
    if tput:
        lines += ["", "## Throughput (independent pipelines, one stream each)", "",
                  "| engine | precision | frames | pipelines | frames/s |", "|" + " --- |" * 5]
        for t in tput:
            lines.append(f"| {t['engine']} | {t['precision']} | {t['frames']} | {t['pipelines']} | {t['fps']:.0f} |")
    copies = results.get("copies") or []
    if copies:
        lines += ["", "## Copies and memory per frame", "",
                  "| engine | frames | H2D copies | H2D bytes | D2H copies | D2H bytes | peak device MiB |",
                  "|" + " --- |" * 7]
        for c in copies:
            lines.append(f"| {c['engine']} | {c['frames']} | {c['h2d_copies']} | {c['h2d_bytes']} | "
                         f"{c['d2h_copies']} | {c['d2h_bytes']} | {c.get('peak_device_mib', float('nan')):.0f} |")
    soak = results.get("soak")
    if soak:
        lines += ["", "## Soak", "", "| frames | device MiB start | end | host RSS MiB start | end | p50 first 10% | p50 last 10% |",
                  "|" + " --- |" * 7,
                  f"| {soak['frames']} | {soak['device_mib_start']:.0f} | {soak['device_mib_end']:.0f} | "
                  f"{soak['host_rss_mib_start']:.0f} | {soak['host_rss_mib_end']:.0f} | {_ms(soak['p50_first'])} | "
                  f"{_ms(soak['p50_last'])} |"]
    notes = results.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def write_reports(results: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench.md", out / "bench.json"]
    write_text_atomic(written[0], markdown_report(results))
    write_json_atomic(written[1], results)
    try:
        written.append(stage_chart(results, out / "bench_stages.png"))
    except PointPillarsError as exc:
        results.setdefault("notes", []).append(f"no PNG: {exc}")
    return written


def stage_chart(results: dict[str, Any], path: Path) -> Path:
    """Stacked bars of per-stage GPU (or CPU) milliseconds, one bar per engine, precision and frame set."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PointPillarsError("install matplotlib to get the PNG chart") from None
    runs = results["runs"]
    fig = Figure(figsize=(max(6.0, 1.2 * len(runs) + 2), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bottoms = [0.0] * len(runs)
    labels = [f"{r['engine']}\n{r['precision']}\n{r['frames']}" for r in runs]
    for stage in STAGE_ORDER:
        heights = [r["stages_ms"].get(stage, 0.0) for r in runs]
        ax.bar(range(len(runs)), heights, bottom=bottoms, label=stage)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(runs)), labels, fontsize=7)
    ax.set_ylabel("ms per frame (median)")
    ax.set_title(f"per-stage time, {results['device_name']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(path)
    return path
