"""What a run says of its frames as they go: the progress bar, one ``error:`` line a failed frame, the
summary (``FrameReport``), and the warnings of frames whose file is probably wrong, each kind said once.

Local infer, ``infer --server`` and ``infer --ray`` report through it alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from ..detections import misread_finding, overflow_finding, overflowed_counts_texts, pillars_dropped_finding
from ..errors import agree, counted, printable_text, safe_repr
from ..intensities import mismatch_finding, mismatch_text
from ..point_layout import CAPTURE_TIMES_FINDING
from .frame_prep import assumed_image_note, emptied_warning, image_assumed
from .frames import CAPTURE_TIMES, FrameJob, FrameReader
from .outputs import ROW_FORMATS, FrameOutput, OutputPlan

if TYPE_CHECKING:
    from tqdm import tqdm

    from ..detections import Detections


def progress_bar(total: int | None, wanted: bool, desc: str | None = None) -> tqdm[Any]:
    """A bar of frames on stderr, drawn when ``wanted`` (no ``--no-progress``) and stderr is a terminal: in a
    log file, CI's log or a pipe each redraw would be one more line."""
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", desc=desc, disable=not wanted or not sys.stderr.isatty(), file=sys.stderr)


class FrameReport:
    """infer's account of a run, whichever path ran the frames: a progress bar, one ``error:`` line a
    failed frame and one a path that gave no frame (``input_errors``, said first), one line a frame when
    nothing is written, and the summary at ``close``. ``where``: the run writes outputs; ``folder``: the
    folder of a row format's part files (else the plan's folder). ``stdout``: where the summary goes (None:
    ``sys.stdout`` when it is printed). ``sources``: the run's frames, when known: a frame's line names it by
    its file name, or, where two frames share one (``*/000000.bin``), by its path as given."""

    def __init__(self, total: int, plan: OutputPlan, *, progress: bool, where: bool,
                 folder: Path | None = None, input_errors: Sequence[str] = (), stdout: TextIO | None = None,
                 skipped: int = 0, sources: Sequence[str] = ()) -> None:
        self.total, self.plan, self.where, self.rows = total, plan, where, folder is not None
        self.skipped = skipped  # frames --skip-existing found done, said in the summary of a run of none
        self.stdout = stdout
        self.by_path = len({Path(source).name for source in sources}) < len(sources)  # names alone would repeat
        self.done: list[str] = []
        self.failed = self.boxes = self.nonfinite = self.out_of_view = 0
        self.replaced = 0  # files of an earlier run that failed frames' writes replaced, each said in its error line
        self.writes = folder or plan.folder
        self.bar = progress_bar(total, progress and total > 1)
        self.start = time.perf_counter()
        self.input_errors = len(input_errors)
        for message in input_errors:  # the other paths run
            self.note(f"error: {message}")

    def note(self, text: str) -> None:
        """A line on stderr that leaves the progress bar whole."""
        self.bar.write(text, file=sys.stderr)

    def fail(self, source: str, message: str, replaced: int = 0) -> None:
        """A failed frame's error line; ``replaced``: the files of an earlier run its write had replaced (its
        message names them)."""
        self.failed += 1
        self.replaced += replaced
        self.bar.update(1)
        named = safe_repr(source)
        self.note(f"error: {message}" if named in message else f"error: {named}: {message}")  # the file once

    def take_back(self, frames: Sequence[tuple[str, FrameOutput]]) -> None:
        """Frames counted as written whose outputs turned out not to be (their row part failed): the last
        ``len(frames)`` frames that went through, now counted as failed, their boxes no longer claimed."""
        if frames:
            del self.done[-len(frames):]
            self.failed += len(frames)
            for _, written in frames:
                self._tally(written, -1)

    def _tally(self, written: FrameOutput, sign: int) -> None:
        """Add (``sign`` 1) or take back (-1) a frame's counts of boxes written and left out."""
        self.boxes += sign * written.boxes
        self.nonfinite += sign * written.nonfinite
        self.out_of_view += sign * written.out_of_view

    def fail_quietly(self) -> None:
        """A failed frame that a summary line accounts for (no line of its own)."""
        self.failed += 1
        self.bar.update(1)

    def written(self, source: str, written: FrameOutput, det: Detections | None = None) -> None:
        """Count a frame whose outputs are written (here, or by a worker elsewhere)."""
        self.bar.update(1)
        self.done.append(source)
        self._tally(written, 1)
        if not self.writes and det is not None:
            best = np.argsort(-det.scores, kind="stable")[:3]  # a multi-head model's boxes come head by head
            top = ", ".join(f"{det.names[i]} {det.scores[i]:.2f}" for i in best)
            line = (f"{safe_repr(source if self.by_path else Path(source).name)}: "
                    f"{counted(written.boxes, 'box', 'boxes')}, {counted(det.stats.num_pillars, 'pillar')}"
                    + (f" [{top}]" if top else ""))
            if self.bar.disable:  # no bar to keep whole: a plain print costs a thirtieth of tqdm.write
                print(line)
            else:
                self.bar.write(line)
            # these lines are the run's only output: once the CLI's guard found stdout's reader gone
            # (e.g. `| head -1`), the run can stop
            if getattr(sys.stdout, "reader_gone", False):
                raise BrokenPipeError("stdout was closed")

    def close(self) -> tuple[list[str], int]:
        """Print the summary (and the count of failures); (frames that went through, number that failed)."""
        self.bar.close()
        seconds = time.perf_counter() - self.start
        total = max(self.total, len(self.done) + self.failed)
        labels = self._writes_labels()
        boxes = self.boxes - self.out_of_view if labels else self.boxes
        their = agree(self.skipped, "its", "their")
        skipped = f" to run ({self.skipped} skipped: {their} outputs were there)" if self.skipped and not total else ""
        print(f"{len(self.done)}/{total} frames{skipped}, {counted(boxes, 'box', 'boxes')}" + self._left_out(labels)
              + self._where()
              + (f" ({total / max(seconds, 1e-9):.1f} frames/s)" if self.done else ""), file=self.stdout)
        failures = [f"{self.failed} of {counted(total, 'frame')} failed"] if self.failed else []
        if self.input_errors:
            failures.append(f"{counted(self.input_errors, 'path')} gave no frame")
        if failures:
            print(f"{' and '.join(failures)} (listed above)", file=sys.stderr)
        return self.done, self.failed

    def _writes_labels(self) -> bool:
        """Whether the run's outputs are KITTI label files (they leave out the boxes outside the camera
        image), not the label files --eval makes for itself beside JSON, rows or nothing."""
        return self.where and self.plan.kitti_dir is not None and self.plan.kitti_dir == self.writes

    def _left_out(self, labels: bool) -> str:
        """What the summary's box count leaves out: the boxes the network overflowed on (from every output);
        boxes outside the camera image from the label files, or, when those serve --eval only, from its evaluation."""
        dropped = [f"{self.nonfinite} overflowed"] if self.nonfinite else []
        if self.out_of_view and labels:
            dropped.append(f"{self.out_of_view} outside the camera image")
        text = f" ({', '.join(dropped)} dropped)" if dropped else ""
        if self.out_of_view and not labels:
            text += f" ({self.out_of_view} outside the camera image left out of the evaluation)"
        return text

    def _where(self) -> str:
        """Where the outputs went; nothing is claimed for a run none of whose frames went through (a row
        format's part files then hold the failed frames' rows only), but the files of an earlier run that a failed
        frame's write replaced with this run's are counted: they are on disk, named in its error line."""
        if not self.where:
            return ""
        if self.done:
            return f", written to {printable_text(str(self.writes))}"
        text = ", no detections written" if self.rows and self.total else ", nothing written"
        if self.replaced:
            text += f" but {counted(self.replaced, 'file')} of an earlier run replaced (named above)"
        return text


def read_warning(source: str, kind: str, intensity_scale: float | None = None) -> str:
    """The warning for a frame the reader found probably wrong (``FrameReader.finding_of``), read with
    ``intensity_scale`` (--intensity-scale, None: not given)."""
    if kind == CAPTURE_TIMES:
        return (f"warning: {safe_repr(source)}: {CAPTURE_TIMES_FINDING} build multi-sweep frames from their sweeps "
                "with PointPillars.accumulate in Python, which gives each sweep's points its lag (warned once)")
    return empty_frame_warning(source) if kind == "empty" else intensity_warning(source, kind, intensity_scale)


def empty_frame_warning(source: str) -> str:
    """The warning for a frame of no point at all: a 0-byte ``.bin`` (a ``.bin`` of no point is 0 bytes), mostly
    a copy that failed; a ``.npy`` or ``.pcd`` of 0 points, which something wrote that way."""
    why = ("an empty file: a copy that failed? copy it again" if source.lower().endswith(".bin")
           else "a file of 0 points: check what wrote it")
    return f"warning: {safe_repr(source)} holds no points ({why}); its output says 0 boxes (warned once)"


def intensity_warning(source: str, kind: str, scale: float | None = None) -> str:
    """The warning for a frame whose intensities disagree with the model's scale (``intensity_mismatch``),
    as read with --intensity-scale ``scale`` (None: not given)."""
    if scale is not None and kind not in ("negative", "zero"):  # no scale makes an intensity negative, or all 0
        if kind in ("8bit", "beyond"):  # a model of 0-1 reflectance
            right = "1/255 = 0.00392156862745098 for files of 0-255 values, none for 0-1 files"
        else:
            right = "255 for files of 0-1 reflectance, none for 0-255 files" + (
                ", 1/257 for 16-bit 0-65535 ones" if kind == "over255" else "")
        return (f"warning: {safe_repr(source)}: read with --intensity-scale {scale:g}, its {mismatch_finding(kind)}; "
                f"the scale multiplies the file's values: check it ({right}) (warned once)")
    text = mismatch_text(kind, _scale_with_option, _LAYOUT_OF.get(os.path.splitext(source)[1].lower(),
                                                                  "--point-dim, float32 values"))
    return f"warning: {safe_repr(source)}: {text} (warned once)"


#: What sets the point layout of a file that is no ``.bin`` (--point-dim is a ``.bin``'s alone).
_LAYOUT_OF = {".npy": "the array's columns", ".pcd": "the file's FIELDS"}


def _scale_with_option(factor: str | None) -> str:
    """How a CLI user scales a file's intensities by ``factor`` (``intensities.mismatch_text``)."""
    if factor is None:
        return "pass --intensity-scale for another scale"
    return f"pass --intensity-scale {_OPTION_VALUES.get(factor, factor)}"


#: A factor as --intensity-scale takes it (a float), with the fraction it is.
_OPTION_VALUES = {"1/255": "0.00392156862745098 (1/255)"}


def frame_warnings(job: FrameJob, read: FrameReader, point_range: Sequence[float] | None) -> list[tuple[str, str]]:
    """(kind, warning) of each thing a finished job's read and detections say is probably wrong with its file:
    no point at all or its intensities' scale (the reader's ``finding_of``), a ``.pcd`` VIEWPOINT the read left
    unapplied (``viewpoint_of``), its calib leaving nothing to the
    camera-FOV crop (``frame_prep.emptied_warning``), ``frame_warning``'s, pillars left out beyond max_pillars,
    points left out for NaN or infinite values (a note), boxes left out for NaN, infinite or absurd values and class
    scores or pillar features overflowed (the network overflowed), and the note that its crop or 2D boxes assumed
    KITTI's image size; a failed frame's read only. Ask for every job in input order (the reader and the crop forget
    what they found once asked). Local infer and Ray's workers alike."""
    source = job.source
    finding = read.finding_of(job.item)
    emptied = emptied_warning(read.prepare, source)
    det: Detections | None = None if job.error is not None else job.detections
    written: FrameOutput = FrameOutput() if job.error is not None else job.written[0]
    found = [(finding, read_warning(source, finding, read.intensity_scale))] if finding is not None else []
    viewpoint = read.viewpoint_of(job.item)
    if viewpoint is not None:  # a run's frames share their sensor's pose, as a rule: said once, not counted
        found.append(("viewpoint", f"warning: {viewpoint} (warned once)"))
    if emptied is not None:
        found.append(emptied)
    assumed = [uses for uses, was in (("its camera-view crop", image_assumed(read.prepare, source)),
                                      ("its KITTI 2D boxes", written.image_assumed)) if was]
    if assumed:
        found.append(("image", assumed_image_note(source, " and ".join(assumed))))
    warning = None if det is None else frame_warning(source, det, point_range)
    if warning is not None:
        found.append(warning)
    dropped = None if det is None else pillars_dropped_finding(det.stats)
    if dropped is not None:
        found.append((dropped[0], f"warning: {safe_repr(source)}: {dropped[1]} (warned once)"))
    if det is not None and 0 < det.stats.num_nonfinite < det.stats.num_points:
        found.append(("somenan", f"note: {safe_repr(source)}: {det.stats.num_nonfinite} of its "
                                 f"{det.stats.num_points} points hold NaN or infinite values and were left out, as "
                                 "OpenPCDet's point-range mask leaves them (an organized cloud marks missing returns "
                                 "so) (said once)"))
    parts = [f"{written.nonfinite} of its boxes held NaN, infinite or absurd values (beyond 10 km, or of no size) and "
             "were left out"] if written.nonfinite else []
    if det is not None:
        parts += overflowed_counts_texts(det.stats, "its")
    if parts:
        found.append(("overflow", f"warning: {safe_repr(source)}: {overflow_finding(parts, 'file')} (warned once)"))
    return found


class FrameWarnings:
    """Each kind of frame warning said for its first frame, on ``note``; every frame of a kind in
    ``WARNING_KINDS`` counted, for the line after the run, which names the next ``NAMED_AFTER_FIRST`` of
    them (a note, such as the assumed image size, is said once and not counted)."""

    NAMED_AFTER_FIRST = 3

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note
        self.counts: dict[str, int] = {}
        self.named: dict[str, list[str]] = {}  # the frames after the first of each kind, a few

    def add(self, found: Sequence[tuple[str, str]], source: str) -> None:
        for kind, text in found:
            if not self.counts.get(kind):
                self.note(text)
            elif len(named := self.named.setdefault(kind, [])) < self.NAMED_AFTER_FIRST:
                named.append(source)
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def close(self) -> None:
        for kind, count in self.counts.items():
            if count > 1 and kind in WARNING_KINDS:
                named = self.named.get(kind, [])
                more = count - 1 - len(named)
                others = ", ".join(safe_repr(source) for source in named) + (f" and {more} more" if more else "")
                self.note(f"warning: {count} frames {WARNING_KINDS[kind]} in all (the first named above; then "
                          f"{others})")


#: What the frames of each warning said once have, for the count after the run.
WARNING_KINDS = {"empty": "held no points", "8bit": "looked like 0-255 intensities",
                 "beyond": "had intensities beyond 255", "unit": "had intensities within 0-1 only",
                 "over255": "had intensities beyond 255", "negative": "had negative intensities",
                 "zero": "had every intensity 0",
                 "nonfinite": "had only non-finite points", "range": "had no point in the model's point range",
                 "onepillar": "had all their points in one pillar",
                 "overflow": "had boxes, class scores or pillar features the network overflowed on",
                 "pillars": "had pillars beyond the model's max_pillars",
                 "fov": "had none of their points left by the camera-FOV crop",
                 CAPTURE_TIMES: "had per-point capture times where the model reads sweeps' time lags"}


def frame_warning(source: str, det: Detections, point_range: Sequence[float] | None) -> tuple[str, str] | None:
    """(kind, warning) for a frame whose detections are probably not what its file meant
    (``detections.misread_finding``: none of its many points made a pillar, or all made one); None for any
    other frame. Each kind is said once a run (a frame of no point at all is the reader's to say:
    ``FrameReader.finding_of``)."""
    found = misread_finding(det.stats, point_range)
    if found is None:
        return None
    kind, finding = found
    return kind, f"warning: {safe_repr(source)}: {finding} (warned once)"


def frame_report(total: int, plan: OutputPlan, args: argparse.Namespace, fmt: str, out: Path | None,
                 input_errors: Sequence[str], stdout: TextIO | None = None, skipped: int = 0,
                 sources: Sequence[str] = ()) -> FrameReport:
    """The FrameReport of infer's run of ``total`` frames (none: all ``skipped`` frames were done before), its
    summary printed to ``stdout``."""
    return FrameReport(total, plan, progress=not args.no_progress, where=bool(args.out),
                       folder=out if fmt in ROW_FORMATS else None, input_errors=input_errors, stdout=stdout,
                       skipped=skipped, sources=sources)
