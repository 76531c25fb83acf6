"""What ``--skip-existing`` / ``--retry-failed`` make of a run's frames, and what a resumed ``--eval`` evaluates.

Read from the outputs already in --out alone (no model needed): which frames run, which are skipped,
which rows are earlier failures, and which skipped frames' outputs join the evaluation. Local infer and
``infer --ray`` resume alike.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import PointPillarsError, agree, counted, example, one_line, printable_text, safe_repr
from ..file_reads import folder_resolver, name_text
from .outputs import ROW_FORMATS, OutputPlan, drop_failure_rows, folder_in_place, frame_key, output_complete, \
    read_record, records_in_parts, sources_in_parts, whole_record, write_label_of_record


@dataclasses.dataclass
class Resume:
    """What ``--skip-existing`` makes of a run's frames (``frames_to_run``): the frames to run and those
    skipped, the frames whose row is an earlier run's failure, the missing or cut ``--viz`` pictures of
    skipped frames, and the empty, cut or foreign output files whose frames are redone."""

    todo: list[str]
    skipped: list[str] = dataclasses.field(default_factory=list)
    failed_before: list[str] = dataclasses.field(default_factory=list)
    unpictured: list[Path] = dataclasses.field(default_factory=list)
    redone: list[Path] = dataclasses.field(default_factory=list)


def frames_to_run(frames: Sequence[str], plan: OutputPlan, fmt: str, out: Path | None, skip_existing: bool,
                  retry_failed: bool = False) -> Resume:
    """The frames to run under ``--skip-existing`` (all of them without it), read from ``out`` alone (no
    model needed): a frame is skipped when all its outputs are there and complete (this package writes
    them atomically; an empty or cut file, or a JSON record not whole or not of the frame, came from
    elsewhere, or from a crash before the run's flush, and is redone; a file infer could not have left, such as
    JSON that is no record or bytes that do not begin as one, is refused before this: ``refuse_foreign_outputs``);
    a JSON record, as a KITTI label file, is
    matched by its frame's name, since a run into records of other point files of the frames' names is refused
    before this (``infer.check_outputs``: ``refuse_foreign_outputs``); for row formats, when its row is in a part
    file (``rows_to_run``). ``say_resume`` says what was found."""
    if not skip_existing or out is None:
        return Resume(list(frames))
    if fmt in ROW_FORMATS:
        return rows_to_run(frames, plan, fmt, out, retry_failed)
    resume = Resume([])
    for frame in frames:
        files = plan.files_of(frame)
        json_file = plan.json_dir / f"{Path(frame).stem}.json" if plan.json_dir is not None else None
        record = whole_record(json_file) if json_file is not None and json_file.exists() else None  # read once
        cut = [path for path in files  # a folder (or a link to one) is no output: the frame's write names it
               if path.exists() and folder_in_place(path) is None
               and not (record is not None if path == json_file else output_complete(path))]
        resume.redone.extend(cut)
        done = all(path.is_file() for path in files) and not cut
        (resume.skipped if done else resume.todo).append(frame)
    return resume


def rows_to_run(frames: Sequence[str], plan: OutputPlan, fmt: str, out: Path, retry_failed: bool) -> Resume:
    """``frames_to_run`` for row formats: a frame whose row is in a part file (sources compared by
    ``outputs.frame_key``, so ``dir/``, ``/abs/dir/`` and a symbolic link to that folder are one frame, from any
    directory) is skipped whatever else of it is missing, since a source never gets a second row; a missing or
    cut ``--viz`` picture of a frame that went through is kept for ``say_resume`` to say once instead. A failed
    frame's row holds its error and it has no picture; ``retry_failed`` runs it (its row is removed first:
    ``earlier_failures``)."""
    present = sources_in_parts(out, fmt)
    resume = Resume([])
    resolve = folder_resolver()
    for frame in frames:
        failed = present.get(frame_key(frame, resolve))
        if failed:
            resume.failed_before.append(frame)
        if failed is None or (failed and retry_failed):
            resume.todo.append(frame)
            continue
        resume.skipped.append(frame)
        if not failed:
            resume.unpictured.extend(path for path in plan.files_of(frame) if not output_complete(path))
    return resume


def say_resume(resume: Resume, fmt: str, out: Path | None, *, retry: bool) -> None:
    """Say what ``frames_to_run`` found, in this order: the outputs redone, the frames skipped, then their
    earlier failures (with ``retry``: their rows are removed here) and missing pictures."""
    shown = printable_text(str(out))  # --out as these lines name it: one line whatever its name
    if resume.redone:
        redone = len(resume.redone)
        files = counted(redone, "empty, incomplete or foreign output file")
        print(f"redoing the frames of {files} in {shown} ({example(redone, safe_repr(resume.redone[0].name))})",
              file=sys.stderr)
    if resume.skipped:
        print(f"skipping {counted(len(resume.skipped), 'frame')} whose outputs are already in {shown}", file=sys.stderr)
    if resume.failed_before and out is not None:
        earlier_failures(resume.failed_before, fmt, out, retry=retry, skipped=len(resume.skipped))
    if resume.unpictured:  # of the frames just said skipped
        unpictured = len(resume.unpictured)
        have, them, those = agree(unpictured, ("has", "it", "that frame"), ("have", "them", "those frames"))
        print(f"warning: {counted(unpictured, 'frame')} with a row in {shown} {have} no whole --viz picture "
              f"({example(unpictured, safe_repr(resume.unpictured[0].name))}), and a frame with a row is not run "
              f"again: to draw {them}, rerun {those} with --viz into another --out", file=sys.stderr)


def earlier_failures(failed_before: Sequence[str], fmt: str, out: Path, *, retry: bool, skipped: int) -> None:
    """Say the frames whose row in ``out``'s part files is an earlier run's failure, after the line of the
    ``skipped`` frames they are among; with ``retry`` (``--retry-failed``) remove those rows first, so their new rows
    are each frame's only row."""
    failed = len(failed_before)
    if retry:
        drop_failure_rows(out, fmt, {frame_key(frame) for frame in failed_before})
        print(f"rerunning {counted(failed, 'frame')} that failed in an earlier run: "
              f"{agree(failed, 'its row is', 'their rows are')} removed from the part files in "
              f"{printable_text(str(out))}", file=sys.stderr)
        return
    rows, them = agree(failed, ("its row", "it"), ("their rows", "them"))
    print(f"warning: {agree(skipped, 'it', f'{failed} of them')} failed in an earlier run "
          f"({example(failed, safe_repr(name_text(failed_before[0])))}): {rows} in {printable_text(str(out))} "
          f"{agree(failed, 'holds', 'hold')} the error, and a frame with a row is not run again; pass --retry-failed "
          f"to rerun {them}", file=sys.stderr)


@dataclasses.dataclass
class SkippedForEval:
    """What ``skipped_for_eval`` made of a resumed run's skipped frames: those to evaluate (their KITTI lines
    in the plan's folder), and how many are left out as earlier failures and as unreadable outputs."""

    frames: list[str] = dataclasses.field(default_factory=list)
    failed_before: int = 0
    unreadable: int = 0


def skipped_for_eval(resume: Resume, plan: OutputPlan, fmt: str, out: Path | None) -> SkippedForEval:
    """The skipped frames --eval evaluates with the frames run, so that a resumed run evaluates as one
    uninterrupted run: --format kitti's label files are in --out already; for the record formats each frame's
    KITTI lines are made again from its JSON record or row (``write_label_of_record``) in the plan's scratch
    folder. A frame whose row is an earlier failure is left out, as a failed frame is; one whose record cannot
    be read or placed gets an ``error:`` line naming its file and is left out too, never silently."""
    found = SkippedForEval()
    failed = set(resume.failed_before)
    wanted = [frame for frame in resume.skipped if frame not in failed]
    found.failed_before = len(resume.skipped) - len(wanted)
    if fmt == "kitti" or out is None or not wanted:
        found.frames = wanted
        return found

    def left_out(frame: str, where: Path, problem: str) -> None:
        found.unreadable += 1
        row = "" if fmt == "json" else f" (the row of {safe_repr(name_text(frame))})"
        print(f"error: {safe_repr(os.fspath(where))}{row}: {problem}; the frame is left out of the evaluation (fix "
              f"what this names, or remove its {'file' if fmt == 'json' else 'row'} to run it again with "
              "--skip-existing)", file=sys.stderr)

    def rebuild(frame: str, where: Path, read: Callable[[], object]) -> None:
        try:
            write_label_of_record(read(), frame, plan)
        except (ValueError, PointPillarsError) as exc:
            left_out(frame, where, f"cannot be evaluated: {one_line(exc)}")
        else:
            found.frames.append(frame)

    if fmt == "json":
        for frame in wanted:
            path = out / f"{Path(frame).stem}.json"
            rebuild(frame, path, lambda: read_record(path))
        return found
    resolve = folder_resolver()
    by_source = {frame_key(frame, resolve): frame for frame in wanted}
    rebuilt: set[str] = set()
    for source, row, part in records_in_parts(out, fmt, by_source):
        if source in rebuilt:  # a second row of a frame (a part copied in since sources_in_parts looked): the first stands
            continue
        rebuilt.add(source)
        rebuild(by_source[source], part, lambda: row)
    for source, frame in by_source.items():
        if source not in rebuilt:  # its row went since the run began
            left_out(frame, out, "its row is no longer in the part files")
    return found
