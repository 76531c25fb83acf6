"""The settings that made the outputs in an ``infer --out`` folder, recorded there so that a resumed run
(``--skip-existing``) never mixes outputs of two models or two sets of thresholds without a word.

The record (``SETTINGS_FILE``, hidden JSON in ``--out``) holds what decides a frame's outputs: the model
(its ``model.json`` or checkpoint by sha256, or the server), the post-process thresholds, how points are
read and cropped, and how KITTI lines are placed. It leaves out how the frames run (device, backend,
batch, pipelines): outputs agree across those within rounding.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..errors import InputError, PointPillarsError, one_line, safe_repr
from ..fileio import loads_json, read_regular_file, write_json_atomic
from ..model_dir import METADATA_FILE, ModelDir, package_version

#: The record's name in --out: hidden, and no frame's output name (those are ``<frame>.<suffix>``).
SETTINGS_FILE = ".pointpillars-trt-run.json"
SETTINGS_VERSION = 1
_SETTINGS_MAX_BYTES = 1 << 16

#: What a setting left out means, for messages.
_DEFAULT_WORDS = {"--point-dim": "the model's point columns", "--fov-only": "not given"}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in chunks (a checkpoint of some hundred MB is never held whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def model_identity(args: argparse.Namespace, opened: ModelDir | None = None) -> dict[str, object]:
    """What names the model that makes a run's outputs: a model dir by its ``model.json`` (which records
    its graphs' sha256, its config and precision), a checkpoint by the sha256 of its bytes with the config
    and precision it is exported with (taken from ``opened``, the model dir exported from it, where the
    run has one: the checkpoint is not read twice), a served model by its server's address. ``path`` is
    for messages only."""
    server = getattr(args, "server", None)
    if server:
        return {"server": str(server)}
    path = Path(args.model).resolve()
    if path.is_dir():
        return {"path": str(path), "sha256": file_sha256(path / METADATA_FILE)}
    source = opened.metadata.get("source") if opened is not None else None
    exported = source.get("sha256") if isinstance(source, dict) else None  # the cache entry of these bytes
    return {"path": str(path), "sha256": exported if isinstance(exported, str) else file_sha256(path),
            "config": args.config, "precision": args.precision or "fp32"}


def output_settings_without_model(args: argparse.Namespace, fmt: str) -> dict[str, object]:
    """The settings of this run that decide its outputs besides the model, keyed by the option that sets each
    (None: not given, so the model's or infer's default)."""
    calib = os.path.abspath(args.calib) if args.calib is not None else None
    # the camera-view crop: as given, else the default for KITTI output and --eval (the model's own policy)
    fov = args.fov_only if args.fov_only is not None else ("KITTI output default" if fmt == "kitti" or args.eval
                                                           else None)
    return {
        "--score-threshold": args.score_threshold,
        "--nms-iou": args.nms_iou,
        "--max-boxes": args.max_boxes,
        "--point-dim": args.point_dim,
        "--intensity-scale": args.intensity_scale,
        "--fov-only": fov,
        "--calib": calib,
        "--image-shape": list(args.image_shape) if args.image_shape is not None else None,
        "--keep-out-of-view": bool(args.keep_out_of_view),
    }


def _shown(option: str, value: object) -> str:
    if option == "--model" and isinstance(value, Mapping):
        where = value.get("server") or value.get("path")
        return f"{'server ' if 'server' in value else ''}{safe_repr(where)}"
    if value is None:
        return _DEFAULT_WORDS.get(option, "the model's default")
    return safe_repr(value) if isinstance(value, str) else str(value)


def _same_model(earlier: object, now: Mapping[str, object]) -> bool:
    """One model: the same server, or the same bytes (a model dir or checkpoint moved is still itself)."""
    if not isinstance(earlier, Mapping):
        return False
    return ({k: v for k, v in earlier.items() if k != "path"} == {k: v for k, v in now.items() if k != "path"})


def differences(earlier: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """The settings of ``now`` that differ from ``earlier``'s, each as "OPTION X there, Y now"."""
    changed = []
    for option, value in now.items():
        was = earlier.get(option)
        same = _same_model(was, value) if option == "--model" and isinstance(value, Mapping) else was == value
        if not same:
            there = "another model" if option == "--model" and _shown(option, was) == _shown(option, value) else \
                _shown(option, was)
            changed.append(f"{option} {there} there, {_shown(option, value)} now")
    return changed


class SettingsRecord:
    """The record of ``--out``'s settings as this run found it, and what it makes of this run's settings:
    ``check`` before the model loads, ``write`` once the run's set-up can no longer fail (before the first
    output), so that a run that never starts leaves the earlier record as it was. The run's settings are
    taken when asked (the point columns infer fills in later are not its settings)."""

    def __init__(self, out: Path, args: argparse.Namespace, fmt: str) -> None:
        self.out = out
        self.path = out / SETTINGS_FILE
        self._args, self._fmt = args, fmt
        self._given = output_settings_without_model(args, fmt)
        self.earlier: dict[str, object] | None = None
        self.unreadable: str | None = None  # why the earlier record could not be read
        self._read()

    def _read(self) -> None:
        if not os.path.lexists(self.path):
            return
        try:
            record = loads_json(read_regular_file(self.path, max_bytes=_SETTINGS_MAX_BYTES, what="settings record"))
            settings = record.get("settings") if isinstance(record, dict) else None
            if not isinstance(settings, dict):
                raise ValueError("not a settings record")
        except (PointPillarsError, ValueError, RecursionError) as exc:
            self.unreadable = one_line(exc)
            return
        self.earlier = settings

    def settings(self, opened: ModelDir | None = None) -> dict[str, object]:
        """This run's settings (``opened``: see ``model_identity``)."""
        return {"--model": model_identity(self._args, opened), **self._given}

    def check(self, skip_existing: bool, skipped: int) -> None:
        """Refuse a ``--skip-existing`` run whose settings differ from those of the outputs it would keep;
        say once (stderr) when the outputs kept cannot be checked (no record, or one that cannot be read)."""
        if not skip_existing or not skipped:
            return
        if self.earlier is None:
            why = f"cannot be read ({self.unreadable})" if self.unreadable else "is missing (an older version wrote them)"
            print(f"note: the record of the settings that made the outputs in {safe_repr(str(self.out))} "
                  f"({SETTINGS_FILE}) {why}: the {skipped} frame(s) skipped are taken as made with this run's",
                  file=sys.stderr)
            return
        changed = differences(self.earlier, self.settings())
        if changed:
            raise InputError(f"--skip-existing: the outputs in {safe_repr(str(self.out))} were made with other "
                             f"settings ({'; '.join(changed)}): resuming would mix outputs of both in one "
                             "folder; run with the settings of those outputs, or give another --out")

    def write(self, opened: ModelDir | None = None) -> None:
        """Record this run's settings in --out before its first output; outputs of other settings kept there
        (a run without --skip-existing rewrites only its own frames) are said in one warning."""
        settings = self.settings(opened)
        changed = differences(self.earlier, settings) if self.earlier is not None else []
        if changed:
            print(f"warning: {safe_repr(str(self.out))} holds outputs made with other settings "
                  f"({'; '.join(changed)}); this run rewrites its own frames' outputs, and any other frames' "
                  "stay as they were: give another --out to keep the two apart", file=sys.stderr)
        if self.earlier == settings:
            return
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, {"format_version": SETTINGS_VERSION,
                                          "written_by": f"pointpillars-trt {package_version()}",
                                          "settings": settings})
        except OSError as exc:  # a full disk: the frames' own writes say so; an earlier record of other settings goes
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            print(f"warning: cannot record this run's settings in {safe_repr(str(self.path))} "
                  f"({exc.strerror or one_line(exc)}): a --skip-existing run into it cannot check them",
                  file=sys.stderr)


def settings_record(args: argparse.Namespace, fmt: str, out: Path | None) -> SettingsRecord | None:
    """The settings record of ``--out`` for this run (None without --out)."""
    return None if out is None else SettingsRecord(out, args, fmt)
