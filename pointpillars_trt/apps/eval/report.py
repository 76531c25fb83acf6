"""Text tables of KITTI AP: the layout OpenPCDet's test.py prints, and a two-run comparison.

The single-run table keeps OpenPCDet's exact line format so logs can be diffed against
published OpenPCDet runs; the comparison puts two runs (say TensorRT vs PyTorch) side by side.
"""

from __future__ import annotations

from .kitti_eval import DIFFICULTIES, METRICS, EvalResult

_LINE_LABELS = {"bbox": "bbox AP", "bev": "bev  AP", "3d": "3d   AP", "aos": "aos  AP"}
_RECALLS = ("R11", "R40")


def _metrics(result: EvalResult, name: str) -> list[str]:
    return [m for m in METRICS + ("aos",) if m in result.classes[name].ap]


def format_table(result: EvalResult) -> str:
    """Every class, strict then loose overlaps, R11 block then R40 block, as OpenPCDet prints."""
    lines: list[str] = []
    for name, cls in result.classes.items():
        for s, overlaps in enumerate(cls.overlaps):
            header = ", ".join(f"{v:.2f}" for v in overlaps)
            for k, tag in enumerate(("AP", "AP_R40")):
                lines.append(f"{name} {tag}@{header}:")
                for metric in _metrics(result, name):
                    fmt = ".2f" if metric == "aos" else ".4f"
                    values = ", ".join(f"{v:{fmt}}" for v in cls.ap[metric][s, k])
                    lines.append(f"{_LINE_LABELS[metric]}:{values}")
    return "\n".join(lines) + "\n"


def format_comparison(a: EvalResult, b: EvalResult, label_a: str, label_b: str) -> str:
    """One row per class, overlap set, recall and metric: A, B and B - A for each difficulty.

    Classes and metrics missing from either run are left out, since there is nothing to compare.
    """
    cell = 24
    rows: list[tuple[str, str]] = []
    for name in (n for n in a.classes if n in b.classes):
        ca, cb = a.classes[name], b.classes[name]
        metrics = [m for m in _metrics(a, name) if m in cb.ap]
        for s, overlaps in enumerate(ca.overlaps):
            header = ", ".join(f"{v:.2f}" for v in overlaps)
            for k, recall in enumerate(_RECALLS):
                for metric in metrics:
                    cells = "".join(
                        f"{f'{va:.2f} -> {vb:.2f} ({vb - va:+.2f})':>{cell}}"
                        for va, vb in zip(ca.ap[metric][s, k], cb.ap[metric][s, k])
                    )
                    rows.append((f"{name} {recall}@{header} {metric}", cells))
    width = max([34, *(len(label) + 1 for label, _ in rows)])  # the longest label sets the column
    head = f"{'':<{width}}" + "".join(f"{d:>{cell}}" for d in DIFFICULTIES)
    lines = [f"A = {label_a}", f"B = {label_b}", head + "   (A -> B, B - A)"]
    lines += [f"{label:<{width}}{cells}" for label, cells in rows]
    return "\n".join(lines) + "\n"
