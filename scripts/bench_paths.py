#!/usr/bin/env python3
"""Frames/s of every path a user runs, end to end with its real setup, on one machine.

Creates N camera-view frames and M full scans (hard links to a few real frames: the page cache holds
them, as it would a drive's recent files), then runs, each as the user would:

  * ``infer DIR --out O`` (JSON per frame) with the defaults, with ``--pipelines K`` for each K given,
    and with ``--batch-size 1 --pipelines 1`` (the per-frame loop; its files are the reference the
    other runs must equal byte for byte); ``--format jsonl`` / ``parquet``; no ``--out``; full scans;
  * ``detector.infer_many`` (read + detect, nothing written) and ``detect_batch`` on frames in memory;
  * ``infer --ray`` with one and two workers a GPU, its files compared with local ``infer``'s;
  * Triton (``scripts/bench_serve.py``: closed-loop gRPC clients spread over several processes);
  * the resident memory of one long ``infer --out`` run, sampled from start to end.

Prints a markdown table, a row as it is measured. Not a test: numbers depend on the machine.

    python scripts/bench_paths.py --model M.pth --camera DIR --full DIR [--frames 2000] [--full-frames 300]
        [--pipelines 1 2 4] [--rss-frames 20000] [--skip in-process ray triton rss]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

PY = [sys.executable, "-m", "pointpillars_trt"]
RATE = re.compile(r"\(([0-9.]+) frames/s\)")
RAY_RATES = re.compile(r"([0-9.]+) frames/s with .*\(([0-9.]+) frames/s from the workers' first call")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a .pth checkpoint (built here in fp16) or a model dir")
    parser.add_argument("--camera", required=True, help="folder of camera-view .bin frames")
    parser.add_argument("--full", required=True, help="folder of full-scan .bin frames")
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--full-frames", type=int, default=300)
    parser.add_argument("--pipelines", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--rss-frames", type=int, default=20000)
    parser.add_argument("--skip", nargs="*", default=[], choices=("in-process", "ray", "triton", "rss"))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    rows = Table()
    with tempfile.TemporaryDirectory(prefix="pp-bench-paths-") as scratch_name:
        scratch = Path(scratch_name)
        model = build(Path(args.model), scratch)
        camera = linked_frames(Path(args.camera), scratch / "camera", args.frames)
        full = linked_frames(Path(args.full), scratch / "full", args.full_frames)
        common = ["--model", str(model), "--device", args.device, "--no-progress"]

        def infer(name: str, frames: Path, *extra: str, out: str | None = "out") -> tuple[Path | None, float]:
            """(its output folder, its frames/s), after adding its row."""
            target = scratch / f"{out}_{len(rows)}" if out else None
            command = [*PY, "infer", str(frames), *common, *(["--out", str(target)] if target else []), *extra]
            rate, seconds = run_rate(command)
            rows.append((name, f"{rate:,.0f}", f"{seconds:.1f} s wall, {count(frames)} frames"))
            return target, rate

        reference, _ = infer("infer --out (JSON), --batch-size 1 --pipelines 1", camera, "--batch-size", "1",
                             "--pipelines", "1")
        default, default_rate = infer("infer --out (JSON), defaults", camera)
        rows.append(("  same bytes as --batch-size 1 --pipelines 1", same_files(default, reference), ""))
        for k in args.pipelines:
            infer(f"infer --out (JSON), --pipelines {k}", camera, "--pipelines", str(k))
        infer("infer --format jsonl", camera, "--format", "jsonl")
        infer("infer --format parquet", camera, "--format", "parquet")
        infer("infer, no --out (summary only)", camera, out=None)
        infer("infer --out (JSON), full scans", full)
        if "in-process" not in args.skip:
            rows.extend(in_process(model, camera, args.device))
        many = linked_frames(Path(args.camera), scratch / "many", args.rss_frames)
        local_rates = {count(camera): default_rate}
        local_many = None
        if "rss" not in args.skip:
            local_many = scratch / "rss_out"
            row, local_rates[count(many)] = rss_row(model, many, local_many, args.device)
            rows.append(row)
        if "ray" not in args.skip:
            for frames, local in ((camera, reference), (many, local_many)):
                for workers, share in ((1, "1"), (2, "0.5")):
                    target = scratch / f"ray_{count(frames)}_{workers}"
                    rates, seconds = run_rates([*PY, "infer", str(frames), *common, "--out", str(target), "--ray",
                                                "--workers", str(workers), "--gpus-per-worker", share], RAY_RATES)
                    local_rate = local_rates.get(count(frames), 0.0)
                    share_text = f" ({rates[1] / local_rate:.0%} of local infer's)" if local_rate else ""
                    rows.append((f"infer --ray, {workers} worker(s) of {share} GPU, {count(frames):,} frames",
                                 f"{rates[1]:,.0f}", f"from the actors' first call on{share_text}: their model load "
                                 f"left out, as infer's rate leaves it out; {rates[0]:,.0f} with the actors' start, "
                                 f"{seconds:.1f} s wall"))
                    if local is not None:
                        rows.append(("  same bytes as local infer", same_files(target, local), ""))
        if "triton" not in args.skip:
            rows.extend(triton(model, Path(args.camera)))
    return 0


class Table(list[tuple[str, str, str]]):
    """The markdown table, printed a row as it is measured (a run cut short keeps what it measured)."""

    def __init__(self) -> None:
        super().__init__()
        print("| path | frames/s | notes |\n| --- | ---: | --- |", flush=True)

    def append(self, row: tuple[str, str, str]) -> None:
        super().append(row)
        print(f"| {row[0]} | {row[1]} | {row[2]} |", flush=True)

    def extend(self, rows: Iterable[tuple[str, str, str]]) -> None:
        for row in rows:
            self.append(row)


def build(model: Path, scratch: Path) -> Path:
    if model.is_dir():
        return model
    out = scratch / "model"
    subprocess.run([*PY, "build", "--checkpoint", str(model), "--out", str(out), "--precision", "fp16"], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def linked_frames(source: Path, folder: Path, count: int) -> Path:
    """A new ``folder`` of ``count`` hard links to ``source``'s .bin files, in turn (000000.bin, ...)."""
    frames = sorted(source.glob("*.bin"))
    if not frames:
        raise SystemExit(f"{source}: no .bin files")
    folder.mkdir()
    for index in range(count):
        os.link(frames[index % len(frames)], folder / f"{index:06d}.bin")
    return folder


def count(folder: Path) -> int:
    return len(os.listdir(folder))


def run_rate(command: list[str]) -> tuple[float, float]:
    """The frames/s a command prints (its own measure: reading to flushed outputs, model load excluded)."""
    rates, seconds = run_rates(command, RATE)
    return rates[0], seconds


def run_rates(command: list[str], pattern: re.Pattern[str]) -> tuple[list[float], float]:
    """The numbers of ``pattern``'s groups in the command's last line that has them, and its wall time."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    found = pattern.findall(done.stdout + done.stderr)
    if done.returncode != 0 or not found:
        sys.stderr.write(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}\n")
        return [0.0] * pattern.groups, seconds
    last = found[-1]
    return [float(value) for value in (last if isinstance(last, tuple) else (last,))], seconds


def same_files(ours: Path | None, reference: Path | None) -> str:
    if ours is None or reference is None:
        return "n/a"
    names = sorted(os.listdir(reference))
    if sorted(os.listdir(ours)) != names:
        return "NO (other files)"
    differ = [n for n in names if (ours / n).read_bytes() != (reference / n).read_bytes()]
    return f"NO ({len(differ)} of {len(names)} files differ: {', '.join(differ[:3])})" if differ else "yes"


def in_process(model: Path, frames: Path, device: str) -> list[tuple[str, str, str]]:
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.pointcloud_io import read_points

    paths = sorted(str(p) for p in frames.iterdir())
    rows = []
    with PointPillars.from_model_dir(model, device=device, max_batch=8) as detector:
        for result in detector.infer_many(paths[:64], batch_size=8):
            pass
        start = time.perf_counter()
        for result in detector.infer_many(paths, batch_size=8):
            assert result.error is None
        rows.append(("detector.infer_many, batch 8 (read + detect)", f"{len(paths) / (time.perf_counter() - start):,.0f}", ""))
        arrays = [read_points(p) for p in paths[:80]]
        detector.detect_batch(arrays[:8])
        start = time.perf_counter()
        for _ in range(10):
            for i in range(0, len(arrays), 8):
                detector.detect_batch(arrays[i : i + 8])
        rows.append(("detector.detect_batch, batch 8, frames in memory", f"{800 / (time.perf_counter() - start):,.0f}", "one pipeline"))
    return rows


def triton(model: Path, frames: Path) -> list[tuple[str, str, str]]:
    script = Path(__file__).with_name("bench_serve.py")
    done = subprocess.run([sys.executable, str(script), "--model", str(model), "--frames", str(frames), "--device",
                           "cuda", "--clients", "32", "--client-processes", "8", "--seconds", "8", "--max-batch", "8",
                           "--instances", "1", "2", "4", "--pipelines", "1"], capture_output=True, text=True)
    sys.stderr.write(done.stdout + done.stderr[-3000:])
    rows = []
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 14 and cells[0].isdigit():
            rows.append((f"Triton, {cells[0]} instance(s) x {cells[1]} pipeline(s), max batch {cells[2]}, 32 gRPC "
                         "clients in 8 processes", cells[3],
                         f"p50 {cells[4]} ms, p99 {cells[5]} ms, mean batch {cells[6]}, errors {cells[7]}; a request: "
                         f"queued {cells[8]} ms, input {cells[9]} ms, execute (staging and waiting for a pipeline) "
                         f"{cells[10]} ms, output {cells[11]} ms; "
                         f"CPU cores busy: server {cells[12]}, clients {cells[13]}"))
    return rows


def rss_row(model: Path, frames: Path, out: Path, device: str) -> tuple[tuple[str, str, str], float]:
    """The resident-memory row of local ``infer`` over ``frames``, and its frames/s (0 when it printed none)."""
    command = [*PY, "infer", str(frames), "--model", str(model), "--device", device, "--no-progress", "--out", str(out)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, int, dict[str, int]]] = []

    def sample() -> None:
        while child.poll() is None:
            written = len(os.listdir(out)) if out.is_dir() else 0
            try:
                with open(f"/proc/{child.pid}/status") as f:
                    kinds = {line.split(":")[0]: int(line.split()[1]) for line in f
                             if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:"))}
                samples.append((written, kinds["VmRSS"], kinds))
            except (OSError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.2)

    watcher = threading.Thread(target=sample)
    watcher.start()
    stdout, _ = child.communicate()
    watcher.join()
    found = RATE.findall(stdout)
    rate = float(found[-1]) if found else 0.0
    total = count(frames)
    steady = [(rss, kinds) for written, rss, kinds in samples if written >= total * 0.1]
    if not steady:
        return (f"RSS over {total} frames", "n/a", "too few samples"), rate
    (first, first_kinds), (last, last_kinds) = steady[0], steady[-1]
    drift = (last - first) / first * 100
    parts = ", ".join(f"{name[3:].lower()} {first_kinds[name] / 1024:.0f} -> {last_kinds[name] / 1024:.0f}"
                      for name in ("RssAnon", "RssFile", "RssShmem") if name in first_kinds and name in last_kinds)
    return (f"infer --out, {total:,} frames: resident memory", f"{rate:,.0f}",
            f"RSS {first / 1024:.0f} MiB at 10 % of the frames -> {last / 1024:.0f} MiB at the end "
            f"({drift:+.1f} %; {parts} MiB), peak {max(r for _, r, _ in samples) / 1024:.0f} MiB"), rate


if __name__ == "__main__":
    sys.exit(main())
