"""The settings that made the outputs in an ``infer --out`` folder, recorded there so that a resumed run
(``--skip-existing``) never mixes outputs of two models or two sets of thresholds without a word.

The record (``SETTINGS_FILE``, hidden JSON in ``--out``) holds what decides a frame's outputs, as the run
applied it (defaults resolved, so that giving a default explicitly changes nothing): the model (its weights'
sha256, config digest and precision, or the server), the post-process thresholds, how points are read and
cropped, and how KITTI lines are placed. It leaves out how the frames run (device, backend, batch, pipelines):
outputs agree across those within rounding. It is settled once the model is open, before the first output; a
run with nothing left to run opens the model for it only where the options given or the model's files may
differ from the record (or there is none to tell by).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import ModelConfig, load_config
from ..errors import InputError, PointPillarsError, agree, counted, one_line, safe_repr, shell_word
from ..file_reads import open_regular_file, read_regular_file
from ..kitti import calib_folder
from ..model_dir import (CHECKPOINT_SUFFIXES, MAX_METADATA_BYTES, METADATA_FILE, ModelDir, identity_from_record,
                         package_version)
from ..strict_json import loads_json, write_json_atomic
from .eval.io import REPORT_FILE
from .frame_prep import fov_only_default
from .outputs import FILE_SUFFIXES, existing_parts

#: The record's name in --out: hidden, and no frame's output name (those are ``<frame>.<suffix>``).
SETTINGS_FILE = ".pointpillars-trt-run.json"
SETTINGS_VERSION = 1
_SETTINGS_MAX_BYTES = 1 << 16

#: How each setting reads in a message when the run left it to its default.
_NOT_GIVEN = {"--calib": "each frame's sibling calib/", "--image-shape": "each frame's image_2 PNG, else 375,1242"}


def model_identity(args: argparse.Namespace, opened: ModelDir | None,
                   served: Mapping[str, object] | None = None) -> dict[str, object]:
    """What names the model that made a run's outputs: the weights it was exported from (a checkpoint's sha256,
    or a seed), its config digest and precision, read from ``opened``, the model dir the run opened (a
    checkpoint's export: the checkpoint and the model dir built from it are one model; a model dir rebuilt
    alike is still itself); a served model by its server's address and the same identity as its server states it
    (``served``; a server of an older version states none). ``path`` is for messages only."""
    server = getattr(args, "server", None)
    if server:
        return {"server": str(server), **(served or {})}
    if opened is None:  # no model dir to read it from: named by its path alone
        return {"path": os.path.abspath(str(args.model))}
    return {"path": os.path.abspath(str(args.model)), **model_dir_identity(opened)}


def model_dir_identity(model: ModelDir) -> dict[str, object]:
    """An opened model dir's identity (``identity_from_record``; a server states it of the model it serves)."""
    return identity_from_record(model.metadata.get("source"), model.cfg.digest(), model.cfg.name, model.precision)


def output_settings(args: argparse.Namespace, fmt: str, frames: Sequence[str], opened: ModelDir | None,
                    cfg: ModelConfig | None, point_dim: int, trained_fov_only: bool | None = None,
                    served: Mapping[str, object] | None = None) -> dict[str, object]:
    """This run's settings as applied, keyed by the option that sets each: ``cfg`` the detector's config (its
    thresholds applied; None for a served model, whose own apply to what the run leaves out), ``point_dim``
    the values read a point; the default crop follows ``opened``'s record of its training points, else
    ``trained_fov_only`` (a served model's, as its server says); ``served``: a served model's identity, as its
    server states it (``model_identity``)."""
    post = cfg.postprocess if cfg is not None else None
    crop = args.fov_only if args.fov_only is not None else \
        fov_only_default(fmt, bool(args.eval), opened.fov_points_only if opened is not None else trained_fov_only)
    return {
        "--model": model_identity(args, opened, served),
        "--score-threshold": post.score_threshold if post is not None else args.score_threshold,
        "--nms-iou": post.nms_iou if post is not None else args.nms_iou,
        "--max-boxes": post.max_boxes if post is not None else args.max_boxes,
        "--point-dim": point_dim,
        "--intensity-scale": args.intensity_scale if args.intensity_scale is not None else 1.0,
        "--fov-only": bool(crop),
        "--calib": _calib_given(args.calib, frames),
        "--image-shape": list(args.image_shape) if args.image_shape is not None else None,
        "--keep-out-of-view": bool(args.keep_out_of_view),
    }


def _calib_given(calib: str | None, frames: Sequence[str]) -> str | None:
    """--calib as an absolute path, or None where it is the folder each frame would take anyway (its sibling
    calib/), so that naming the default changes nothing."""
    if calib is None:
        return None
    given = os.path.realpath(calib)
    siblings = set()
    for folder in {os.path.dirname(os.path.abspath(frame)) for frame in frames}:
        with contextlib.suppress(PointPillarsError):
            siblings.add(os.path.realpath(calib_folder(os.path.join(folder, "x.bin"))))
    return None if siblings == {given} else os.path.abspath(calib)


#: The settings of a flag: how each value is typed (``--no-fov-only``), or left out ("no --keep-out-of-view").
_FLAGS = {"--fov-only": {True: "--fov-only", False: "--no-fov-only"},
          "--keep-out-of-view": {True: "--keep-out-of-view", False: "no --keep-out-of-view"}}


def _shown(option: str, value: object, defaulted: bool = False) -> str:
    """A recorded setting as a user types it (``--no-fov-only``; ``--image-shape``'s 375,1242); ``defaulted``: the
    run left it to its default (the model's, for a threshold), said after it."""
    if option == "--model" and isinstance(value, Mapping):
        where = value.get("server") or value.get("path")
        return f"{'server ' if 'server' in value else ''}{safe_repr(where)}"
    if value is None:
        return "not given (" + _NOT_GIVEN.get(option, "the model's default") + ")"
    if option in _FLAGS and isinstance(value, bool):
        text = _FLAGS[option][value]
    elif option == "--image-shape" and isinstance(value, list):
        text = ",".join(str(v) for v in value)
    else:
        text = safe_repr(value) if isinstance(value, str) else str(value)
    return text + ((" (the model's)" if option in _MODEL_DEFAULTS else " (the default)") if defaulted else "")


def _matching(option: str, value: object, now: object) -> list[str]:
    """The option words that give a setting the ``value`` recorded where this run has ``now`` (a flag left out or an
    option to drop: "drop --calib"); none where no option would (the model at the recorded path changed since)."""
    if option == "--model":
        return _model_matching(value, now)
    if option in _FLAGS and isinstance(value, bool):
        return [_FLAGS[option][value] if not _FLAGS[option][value].startswith("no ") else f"drop {option}"]
    if value is None:
        return [f"drop {option}"]
    return [f"{option} {_shown(option, value) if not isinstance(value, str) else shell_word(value)}"]


def _model_matching(earlier: object, now: object) -> list[str]:
    """The option words that run the recorded model again: its server, or its path (with a checkpoint's
    --precision where that differs); none where no option would: a model not recorded, or one at this run's
    path that has changed since (rebuilt, rewritten, another --config)."""
    if not isinstance(earlier, Mapping) or not isinstance(now, Mapping):
        return []
    if "server" in earlier:  # none where the server at that address now serves another model
        return [] if earlier["server"] == now.get("server") else \
            [f"--server {shell_word(str(earlier['server']))}"] + ([] if "server" in now else ["drop --model"])
    path = earlier.get("path")
    if not isinstance(path, str):
        return []
    words = [f"--model {shell_word(path)}"] if path != now.get("path") else []
    if earlier.get("precision") != now.get("precision") and path.lower().endswith(CHECKPOINT_SUFFIXES):
        words.append(f"--precision {earlier.get('precision')}")
    elif not words:
        return []
    return words + (["drop --server"] if "server" in now else [])


def _model_difference(earlier: object, now: Mapping[str, object]) -> str | None:
    """How the recorded model differs from this run's, for messages; None when it is the same model (the same
    server, or the same weights, config and precision, wherever its files now lie)."""
    if not isinstance(earlier, Mapping):
        return "a model not recorded there"
    if "server" in now or "server" in earlier:
        if earlier.get("server") != now.get("server"):
            return f"{_shown('--model', earlier)} there, {_shown('--model', now)} now"
        if "weights" not in earlier or "weights" not in now:  # a server that states no model: its address alone
            return None
    what = [f"precision {earlier.get('precision')} there, {now.get('precision')} now"] \
        if earlier.get("precision") != now.get("precision") else []
    if earlier.get("config") != now.get("config"):
        what.append(f"config {safe_repr(earlier.get('config_name'))} there, {safe_repr(now.get('config_name'))} now")
    if earlier.get("weights") != now.get("weights"):  # a model named by its path alone has none to compare
        what.append("other weights")
    if not what:
        return None
    return f"{_shown('--model', earlier)} there, {_shown('--model', now)} now: {', '.join(what)}"


def _listed(changed: Sequence[str], most: int = 3) -> str:
    """The first ``most`` differences, and how many more: a refusal stays one readable line."""
    return "; ".join(changed[:most]) + (f"; and {len(changed) - most} more" if len(changed) > most else "")


def differences(earlier: Mapping[str, object], now: Mapping[str, object],
                defaulted: Collection[str] = ()) -> list[str]:
    """The settings of ``now`` that differ from ``earlier``'s, each as "OPTION X there, Y now" (a flag as typed:
    "--no-fov-only there, --fov-only (the default) now"); ``defaulted``: the options the run left to their default."""
    changed = []
    for option, value in now.items():
        if option == "--model" and isinstance(value, Mapping):
            model = _model_difference(earlier.get(option), value)
            if model is not None:
                changed.append(f"--model {model}")
            continue
        shown = _shown(option, value, option in defaulted)
        named = "" if option in _FLAGS else f"{option} "
        if option not in earlier:
            changed.append(f"{option} not recorded there, {shown} now")
        elif earlier[option] != value:
            changed.append(f"{named}{_shown(option, earlier[option])} there, {shown} now")
    return changed


def matching_options(earlier: Mapping[str, object], now: Mapping[str, object]) -> str:
    """How to run with ``earlier``'s settings where ``now``'s differ, as options ("pass --model zh --max-boxes 25,
    drop --calib"), or "" where none would (the model at the recorded path changed since)."""
    words: list[str] = []
    for option, value in now.items():
        if option not in earlier or earlier[option] == value:
            continue
        if option == "--model" and isinstance(value, Mapping) and _model_difference(earlier[option], value) is None:
            continue  # the same model elsewhere
        matching = _matching(option, earlier[option], value)
        if not matching:
            return ""
        words += matching
    given = [word for word in words if not word.startswith("drop ")]
    dropped = [word for word in words if word.startswith("drop ")]
    return ", ".join((["pass " + " ".join(given)] if given else []) + dropped)


class SettingsRecord:
    """The record of ``--out``'s settings as this run found it; ``settle`` compares this run's with it once
    the model is open and, before the run's first output, refuses a ``--skip-existing`` run of other settings
    or writes this run's (a run that never gets that far leaves the record as it was)."""

    def __init__(self, out: Path, args: argparse.Namespace, fmt: str, frames: Sequence[str]) -> None:
        self.out = out
        self.path = out / SETTINGS_FILE
        self._args, self._fmt, self._frames = args, fmt, frames
        self.earlier: dict[str, object] | None = None  # the settings of this format's outputs
        self.mixed = False  # this format's outputs were made with more than one set of settings
        # the model's options (thresholds, --point-dim) the run that made them left to the model; empty where the
        # record does not say (an older one)
        self.earlier_defaulted: frozenset[str] = frozenset()
        self._others: dict[str, object] = {}  # the entries of the other formats' outputs, kept as they are
        self.unreadable: str | None = None  # why the earlier record could not be read
        self.defaulted = self._defaulted()  # read before the run fills in the model's values (--point-dim)

    def _read(self) -> None:
        """The record holds an entry for each output format (JSON and KITTI files of one frame may share a folder,
        made with other settings each: the crop is KITTI output's by default)."""
        self.earlier, self.mixed, self._others, self.unreadable = None, False, {}, None
        self.earlier_defaulted = frozenset()
        if not os.path.lexists(self.path):
            return
        try:
            outputs = _recorded_outputs(self.path)
            entry = outputs.get(self._fmt)
            if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("settings"), dict)):
                raise ValueError(f"its {self._fmt} entry is not a settings record")
        except (PointPillarsError, ValueError, RecursionError) as exc:
            self.unreadable = one_line(exc)
            return
        self._others = {fmt: value for fmt, value in outputs.items() if fmt != self._fmt}
        if entry is not None:
            self.earlier = entry["settings"]
            self.mixed = entry.get("mixed") is True
            defaulted = entry.get("model_defaults")
            if isinstance(defaulted, list):
                self.earlier_defaulted = frozenset(option for option in defaulted if option in _MODEL_DEFAULTS)

    def settle(self, opened: ModelDir | None, cfg: ModelConfig | None, point_dim: int, *, skip_existing: bool,
               skipped: int, trained_fov_only: bool | None = None, served: Mapping[str, object] | None = None) -> None:
        """Once the model is open and before the first output: with ``--skip-existing`` and ``skipped`` frames
        kept, refuse settings other than those the kept outputs were made with (or a folder of several); say
        once when they cannot be checked; then record this run's settings, marked mixed when the folder keeps
        outputs of other settings (a plain run rewrites only its own frames). ``trained_fov_only``: a served
        model's record of its training points (``opened``, a model dir, has its own); ``served``: a served model's
        identity, as its server states it."""
        self._read()  # again: another run into this folder may have settled since this one started
        settings = output_settings(self._args, self._fmt, self._frames, opened, cfg, point_dim, trained_fov_only,
                                   served)
        changed = differences(self.earlier, settings, self.defaulted) if self.earlier is not None else []
        if skip_existing and skipped:
            matching = matching_options(self.earlier, settings) if self.earlier is not None and changed else ""
            self._check_resume(changed, skipped, matching)
        mixed = (self.mixed or bool(changed)) and self._keeps_other_frames()
        if changed and mixed:
            print(f"warning: {safe_repr(str(self.out))} holds outputs of other frames made with other settings "
                  f"({_listed(changed)}); this run rewrites only its own frames' outputs: give another --out to "
                  "keep the two apart (a --skip-existing run into this folder will be refused)", file=sys.stderr)
        if self.earlier == settings and self.mixed == mixed:
            return  # its model_defaults hold still: the values recorded are the model's own where they say so
        model_defaults = sorted(self.defaulted & _MODEL_DEFAULTS.keys())
        entry: dict[str, object] = {"settings": settings, "model_defaults": model_defaults,
                                    **({"mixed": True} if mixed else {})}
        record = {"format_version": SETTINGS_VERSION, "written_by": f"pointpillars-trt {package_version()}",
                  "outputs": {**self._others, self._fmt: entry}}
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, record)
        except OSError as exc:  # a full disk: the frames' own writes say so; an earlier record of other settings goes
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            print(f"warning: cannot record this run's settings in {safe_repr(str(self.path))} "
                  f"({exc.strerror or one_line(exc)}): a --skip-existing run into it cannot check them",
                  file=sys.stderr)

    def may_differ_from_kept(self) -> bool:
        """For a ``--skip-existing`` run that leaves no frame to run (no model opened): whether its settings may
        differ from those the kept outputs were made with, as far as the options given and the model's files
        tell; True also where no record tells. The caller then opens the model and ``settle`` decides (a
        refusal, or the note that they cannot be checked), as for a run with frames left."""
        self._read()
        if self.earlier is None or self.mixed:
            return True
        earlier, args = self.earlier, self._args
        now = output_settings(args, self._fmt, self._frames, None, None, args.point_dim or 0)
        for option, value in now.items():
            if option in _MODEL_DEFAULTS and option in self.defaulted:
                if option not in self.earlier_defaulted:
                    return True  # given to the run that made them: the model's own value may be another
                continue  # the model's own value then and now (the model is compared below)
            if option == "--model":
                continue
            if option == "--fov-only" and args.fov_only is None:  # the default: the same where the model is
                if not _same_crop_default(self._fmt, bool(args.eval), earlier.get(option)):
                    return True
            elif value != earlier.get(option):
                return True
        return _model_may_differ(args, earlier.get("--model"))

    def _defaulted(self) -> set[str]:
        """The options of the record this run left to their default (not given)."""
        attributes = {**_MODEL_DEFAULTS, "--fov-only": "fov_only", "--intensity-scale": "intensity_scale"}
        return {option for option, name in attributes.items() if getattr(self._args, name, None) is None} | \
            ({"--keep-out-of-view"} if not getattr(self._args, "keep_out_of_view", False) else set())

    def _check_resume(self, changed: list[str], skipped: int, matching: str = "") -> None:
        where = safe_repr(str(self.out))
        if changed:
            how = f" ({matching})" if matching else ""
            raise InputError(f"--skip-existing: the outputs in {where} were made with other settings "
                             f"({_listed(changed)}): resuming would mix outputs of both in one folder; run with "
                             f"the settings of those outputs{how}, or give another --out")
        if self.mixed:
            raise InputError(f"--skip-existing: the outputs in {where} were made with more than one set of settings "
                             "(a run without --skip-existing rewrote some frames with other settings): which frames "
                             "to keep cannot be told; run them again without --skip-existing, or give another --out")
        if self.earlier is None:
            why = (f"cannot be read ({self.unreadable})" if self.unreadable else
                   "is missing (an older version wrote the outputs, or it was removed)" if not os.path.lexists(self.path) else
                   f"has no entry for its {self._fmt} outputs (runs of other formats wrote it)")
            print(f"note: the record of the settings that made the outputs in {where} ({SETTINGS_FILE}) {why}: the "
                  f"{counted(skipped, 'frame')} skipped {agree(skipped, 'is', 'are')} taken as made with this run's",
                  file=sys.stderr)

    def _keeps_other_frames(self) -> bool:
        """Whether --out holds an output of this format of a frame this run does not rewrite: a file of another
        frame, or for row formats any earlier part (a run only adds a part: every earlier row stays)."""
        suffix = FILE_SUFFIXES.get(self._fmt)
        if suffix is None:
            return bool(existing_parts(self.out, self._fmt))
        ours = {os.path.splitext(os.path.basename(frame))[0] for frame in self._frames}
        try:
            names = os.listdir(self.out)
        except OSError:
            return False
        return any(name not in (SETTINGS_FILE, REPORT_FILE) and os.path.splitext(name)[1] == suffix and
                   os.path.splitext(name)[0] not in ours for name in names)


#: The settings a run leaves to the model when their option is not given (option: its args attribute).
_MODEL_DEFAULTS = {"--score-threshold": "score_threshold", "--nms-iou": "nms_iou", "--max-boxes": "max_boxes",
                   "--point-dim": "point_dim"}


def _same_crop_default(fmt: str, evaluating: bool, recorded: object) -> bool:
    """Whether the camera-view crop by default (``fov_only_default``) is surely the ``recorded`` one for the same
    model: KITTI output and --eval are cropped unless the model says it was trained on full scans, so a recorded
    crop is this run's, and a recorded full scan may have been an option's (--no-fov-only) or the model's; other
    output is not cropped."""
    return recorded is True if fmt == "kitti" or evaluating else recorded is False


def _model_may_differ(args: argparse.Namespace, earlier: object) -> bool:
    """Whether ``--model`` (or ``--server``) may not be the model the record names, told from its files alone:
    another path or server; a checkpoint of other bytes (its sha256), or exported with another --config or
    --precision; a model dir whose model.json names other weights, config or precision."""
    if not isinstance(earlier, Mapping):
        return True
    server = getattr(args, "server", None)
    if server or "server" in earlier:  # the same address may serve another model since: its server says
        return earlier.get("server") != (str(server) if server else None) or "weights" in earlier
    path = Path(str(args.model))
    if earlier.get("path") != os.path.abspath(path):
        return True
    try:
        if path.is_dir():
            return _model_difference(earlier, _model_dir_identity(path)) is not None
        weights = earlier.get("weights")
        same_bytes = isinstance(weights, Mapping) and weights.get("sha256") == _sha256_of(path)
    except (OSError, PointPillarsError, ValueError, KeyError, TypeError):
        return True  # opening the model says what is wrong with it
    config = getattr(args, "config", None)
    return not same_bytes or earlier.get("precision") != (getattr(args, "precision", None) or "fp32") or \
        (config is not None and load_config(config).digest() != earlier.get("config"))


def _model_dir_identity(path: Path) -> dict[str, object]:
    """``model_identity`` of a model dir as its ``model.json`` states it, read alone (its graphs are not read:
    a run with nothing left to run opens no model); a model.json that is not one raises."""
    meta = loads_json(read_regular_file(path / METADATA_FILE, max_bytes=MAX_METADATA_BYTES, what="model.json"))
    return identity_from_record(meta["source"], meta["config_digest"], meta["config"]["name"], meta["precision"])


def _sha256_of(path: Path) -> str:
    """The sha256 of a checkpoint's bytes (what its export records as its weights), read in chunks."""
    f, _ = open_regular_file(path, max_bytes=1 << 40, what="checkpoint")
    digest = hashlib.sha256()
    with f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _recorded_outputs(path: Path) -> dict[str, Any]:
    """The entries (an output format's: its settings, whether mixed) of the settings record at ``path``; a file
    that is no record of this version raises (ValueError, PointPillarsError, RecursionError)."""
    record = loads_json(read_regular_file(path, max_bytes=_SETTINGS_MAX_BYTES, what="settings record"))
    if not isinstance(record, dict) or type(record.get("format_version")) is not int or \
            record["format_version"] != SETTINGS_VERSION:
        found = record.get("format_version") if isinstance(record, dict) else None
        raise ValueError(f"format_version {safe_repr(found)}, not {SETTINGS_VERSION}: not a record of this "
                         "version of pointpillars-trt")
    outputs = record.get("outputs")
    if not isinstance(outputs, dict):
        raise ValueError("not a settings record")
    return outputs


def recorded_fov_only(out: Path, fmt: str) -> bool | None:
    """Whether the ``fmt`` outputs in ``out`` were made with the camera-view crop, as its settings record says
    (None: no readable record of them, or a folder of more than one set of settings)."""
    try:
        entry = _recorded_outputs(out / SETTINGS_FILE)[fmt]
        crop = entry["settings"]["--fov-only"]
    except (OSError, PointPillarsError, ValueError, RecursionError, KeyError, TypeError):
        return None
    return crop if isinstance(crop, bool) and entry.get("mixed") is not True else None


def settings_record(args: argparse.Namespace, fmt: str, out: Path | None, frames: Sequence[str]) -> SettingsRecord | None:
    """The settings record of ``--out`` for this run of ``frames`` (None without --out)."""
    return None if out is None else SettingsRecord(out, args, fmt, frames)
