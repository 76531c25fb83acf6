"""The one writer of model dirs: checkpoint -> ONNX graphs + metadata (+ the RPN's TensorRT plan on request).

The CLI's ``build`` and ``PointPillars.from_checkpoint`` (through its cache) both go through
:func:`export_checkpoint`, so a model dir is the same whichever way it was made. A model dir is
written into a temporary sibling folder and renamed into place, so an interrupted or failed build
(disk full, Ctrl-C) never damages the model dir that was there, and readers see the old dir or the
new one, never a mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..config import ConfigArgument, ModelConfig, builtin_config_names, load_config
from ..errors import CacheNotice, InputError, ModelDirError, PointPillarsError, SettingNotice, safe_repr
from ..file_reads import not_a_folder, path_argument, read_regular_file
from ..file_writes import (owned_prefix, remove_stale_folders, replace_folder, unwritable_reason, user_cache_dir,
                           write_bytes_atomic, xdg_cache_home)
from ..graph_io import MAX_BATCH, RPN_INPUT, Precision, check_precision, pfn_io, rpn_io
from ..model_dir import (FORMAT_VERSION, GRAPHS, MAX_METADATA_BYTES, METADATA_FILE, ModelDir, load_model_dir,
                         package_version)
from .checkpoint import PUBLISHED_YAMLS, LoadedCheckpoint, load_checkpoint
from .onnx_export import OPSET, ModelWeights, build_pfn_graph, build_rpn_graph



def build_model_dir(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
                    config: ConfigArgument = None, backend: str = "onnxruntime", precision: str = "fp32",
                    tf32: bool = True, progress: Callable[[str], None] | None = None,
                    compute_capabilities: Sequence[str] | None = None,
                    dataset: dict[str, Any] | None = None) -> ModelDir:
    """``pointpillars-trt build``: a checkpoint into the model dir ``out`` (TensorRT plans too when asked);
    ``progress`` receives a line before and after each plan build; ``compute_capabilities``: the GPUs
    TensorRT for RTX builds the plans for (None: its default set); ``dataset``: what the training data
    config says about the points (see ``export_model_dir``)."""
    from ..runtime.backends import BACKEND_NAMES, BACKENDS

    out = path_argument(out, "out", ModelDirError, "the model dir to write, a str or Path")
    if backend not in BACKENDS:
        raise PointPillarsError(f"backend {backend!r}: expected one of {BACKEND_NAMES}")
    checked = check_precision(precision)
    plans = BACKENDS[backend].artefact == "plan"
    if plans:  # fail before any work when the plans cannot be built here, or not for those GPUs
        from ..runtime.tensorrt_build import check_targets

        check_targets(compute_capabilities, checked)
    ckpt = load_checkpoint(checkpoint, config)
    model = export_checkpoint(ckpt, out, precision=checked, tensorrt_tf32=tf32 if plans else None, progress=progress,
                              compute_capabilities=compute_capabilities, dataset=dataset)
    if config is None:
        say_builtin_config(ckpt, stacklevel=2)
    else:
        say_builtin_name_reused(ckpt.config, stacklevel=2)
    return model


def say_builtin_name_reused(cfg: ModelConfig, *, stacklevel: int) -> None:
    """Say (a ``SettingNotice``) that ``cfg``, given to ``build``, carries a built-in config's name with other
    values (a built-in YAML copied and edited): the model dir records the name, and a later ``--config NAME``
    would mean the built-in one, which the model dir then refuses as another config of that name."""
    if cfg.name not in builtin_config_names():
        return
    differing = cfg.identity_differences(load_config(cfg.name))
    if differing:
        shown = "; ".join(f"{field} {here} here, {there} there" for field, here, there in differing[:3])
        warnings.warn(f"the config given is named {cfg.name!r}, as a built-in config is, with other values ({shown}"
                      f"{'; ...' if len(differing) > 3 else ''}): give it a name of its own (its `name:`; an "
                      "OpenPCDet YAML's: its file name) to tell the two apart", SettingNotice, stacklevel=stacklevel + 1)


def model_dir_for_checkpoint(path: str | os.PathLike[str], *, config: ConfigArgument = None,
                             precision: str = "fp32", cache_dir: str | os.PathLike[str] | None = None,
                             tensorrt_plans: bool = False, tf32: bool = True, device_id: int = 0) -> ModelDir:
    """The cached model dir of a checkpoint, exported on first use (with TensorRT plans when asked, built
    on and for GPU ``device_id``, the GPU the detector runs on).

    The cache key holds everything that changes what is built: checkpoint hash, config digest,
    precision, and for TensorRT plans the library, its version and their TF32 setting (not the GPU: a cache
    shared by GPUs of two kinds holds the plans of the one that built them, which the other refuses)."""
    checked = check_precision(precision)
    root = cache_root(cache_dir)  # a cache_dir that is no path is said before the checkpoint is read
    ckpt = load_checkpoint(path, config)
    tensorrt_tf32 = tf32 if tensorrt_plans else None
    folder = root / cache_key(ckpt.sha256, ckpt.config.digest(), checked, tensorrt_tf32)
    try:
        return _cache_entry(folder, ckpt.config, tensorrt_tf32)
    except PointPillarsError as exc:  # not built yet, or stale or damaged: rebuilt below, said when it was there
        if os.path.lexists(folder):
            warnings.warn(f"rebuilding model cache entry {safe_repr(folder)}, which cannot be used as it is ({exc})",
                          CacheNotice, stacklevel=2)
    _check_cache_writable(root, cache_dir)
    try:
        model = export_checkpoint(ckpt, folder, precision=checked, tensorrt_tf32=tensorrt_tf32, replace_foreign=True,
                                  device_id=device_id)
    except ModelDirError as exc:
        try:  # another run filling the same entry at once put its own in place first (it took the rename): use it
            return _cache_entry(folder, ckpt.config, tensorrt_tf32)
        except PointPillarsError:
            pass
        if isinstance(exc.__cause__, OSError):  # the cache's file system full (or failing) as the files are written
            raise _cache_unwritable(root, cache_dir, exc.__cause__.strerror or type(exc.__cause__).__name__) from None
        raise
    if config is None:  # once, as the entry is built: not at every open of it
        say_builtin_config(ckpt, stacklevel=3)  # the caller of from_checkpoint
    return model


def say_builtin_config(ckpt: LoadedCheckpoint, *, stacklevel: int) -> None:
    """Say (a ``SettingNotice``) that an OpenPCDet checkpoint given without a config is built with the built-in config
    of OpenPCDet's published YAML: a checkpoint holds no config, and one trained with another YAML (other thresholds,
    range or anchors of the same network) would run on the published values without a word. A zhulf0804 checkpoint
    says nothing: its code base has no config files, and the built-in one is its code's. ``stacklevel``: the caller's
    frame, as ``warnings.warn`` counts it, from the function that calls this one."""
    published = PUBLISHED_YAMLS.get(ckpt.config_name)  # None: a zhulf0804 checkpoint's
    if published is None:
        return
    warnings.warn(f"{safe_repr(ckpt.path)}: built with config {ckpt.config_name}, OpenPCDet's published {published} "
                  "(a checkpoint holds no config): for a model trained with a YAML of its own (another range, anchors, "
                  "classes or thresholds), build with --pcdet-config ITS_MODEL.yaml (Python: "
                  "config=convert.pcdet_config.config_from_pcdet_yaml(path))", SettingNotice, stacklevel=stacklevel + 1)


def _cache_entry(folder: Path, cfg: ModelConfig, tensorrt_tf32: bool | None) -> ModelDir:
    """The model cache's entry ``folder``, opened with ``cfg``'s launch values (``load_model_dir``), with its TensorRT
    plan, whole and of its graph, when ``tensorrt_tf32`` asks for one; a PointPillarsError saying why when there is
    none that serves."""
    model = load_model_dir(folder, cfg)
    if tensorrt_tf32 is not None:
        if not model.has_plans():
            raise ModelDirError(f"model dir {safe_repr(folder)}: holds no TensorRT plan")
        from ..runtime.tensorrt import check_plan_file

        plan = model.plan_path("rpn")
        checked = check_plan_file(plan, model.graph_sha256("rpn"))  # a damaged plan: rebuilt as a graph is
        if checked is not None:  # for the detector that opens it next
            model.checked_files[plan.name] = checked
    return model


def copy_model_dir(model: ModelDir, dest: Path) -> None:
    """A copy of ``model``'s folder at the new path ``dest``, its model.json written from ``model``'s metadata:
    launch values a model dir was opened with (``ModelDir.with_launch_values``) are in memory only, and the copy is
    reopened by path."""
    shutil.copytree(model.path, dest)
    write_bytes_atomic(dest / METADATA_FILE, _metadata_text(model.metadata).encode("utf-8"))


def _metadata_text(meta: dict[str, Any]) -> str:
    """A model.json's text, as every writer of one writes it."""
    return json.dumps(meta, indent=2, allow_nan=False) + "\n"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The model cache: ``cache_dir`` when given, else the user's (``user_cache_dir``). A ``cache_dir`` that is
    no path (a number, an empty string, which Path reads as the current folder) is refused, naming it."""
    if cache_dir is None:
        return user_cache_dir()
    return path_argument(cache_dir, "cache_dir", ModelDirError,
                         "a folder's path (a str or pathlib.Path), or None for the default cache")


def _check_cache_writable(root: Path, cache_dir: str | os.PathLike[str] | None) -> None:
    """Refuse a cache that cannot take a new model dir, naming the cache and how to move it: a failed build
    would only name a hashed folder in it, which says nothing of the cache or of POINTPILLARS_TRT_CACHE."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        reason = unwritable_reason(root)
    except FileExistsError:  # mkdir's word for something else in the folder's place
        reason = f"{not_a_folder(root)}, not a folder"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    if reason is not None:
        raise _cache_unwritable(root, cache_dir, reason)


def _cache_unwritable(root: Path, cache_dir: str | os.PathLike[str] | None, reason: str) -> ModelDirError:
    """The error of a model cache that cannot take a new model dir for ``reason``: it names the cache, where its
    path came from, and how to move it."""
    variable = os.environ.get("POINTPILLARS_TRT_CACHE")
    where = (f"cache_dir {safe_repr(root)}" if cache_dir else
             f"model cache POINTPILLARS_TRT_CACHE={safe_repr(variable)}" if variable
             else f"model cache {safe_repr(root)} ({'under XDG_CACHE_HOME' if xdg_cache_home() else 'the default'}; "
                  "POINTPILLARS_TRT_CACHE unset)")
    fix = "pass a writable cache_dir" if cache_dir else "set POINTPILLARS_TRT_CACHE to a writable folder"
    return ModelDirError(f"{where} cannot be written ({reason}): {fix}, or build a model dir with "
                         "`pointpillars-trt build` and use that instead of the checkpoint")


def cache_key(checkpoint_sha256: str, config_digest: str, precision: str, tensorrt_tf32: bool | None) -> str:
    """The cache folder name of a build; ``tensorrt_tf32`` is None when no TensorRT plans are built. Plans of
    TensorRT and of TensorRT for RTX, and of each version of either, get folders of their own (no library runs
    another's plans, nor a version another version's: after an upgrade the plans are built again)."""
    from ..runtime.tensorrt_library import installed_library, library_version

    library = installed_library()
    plans = ("onnx" if tensorrt_tf32 is None else
             f"{library or 'tensorrt'}-{library_version() if library else ''}:tf32={tensorrt_tf32}")
    return hashlib.sha256(f"{checkpoint_sha256}:{config_digest}:{precision}:{plans}".encode()).hexdigest()[:20]


def export_checkpoint(ckpt: LoadedCheckpoint, out: str | os.PathLike[str], *,
                      precision: Precision, tensorrt_tf32: bool | None = None,
                      replace_foreign: bool = False, progress: Callable[[str], None] | None = None,
                      compute_capabilities: Sequence[str] | None = None,
                      dataset: dict[str, Any] | None = None, device_id: int = 0) -> ModelDir:
    """The one checkpoint -> model dir path; ``tensorrt_tf32`` set builds TensorRT plans with that TF32 mode
    on GPU ``device_id``; ``replace_foreign`` lets a cache entry that is junk (not a model dir) be replaced."""
    source = {"checkpoint": str(ckpt.path.resolve()), "sha256": ckpt.sha256, "layout": ckpt.layout}

    def plans(model: ModelDir) -> None:
        if tensorrt_tf32 is not None:
            _carry_timing_cache(Path(out), model.path)
            build_model_plans(model, precision=precision, tf32=tensorrt_tf32, progress=progress,
                              compute_capabilities=compute_capabilities, device_id=device_id)

    return export_model_dir(ckpt.weights, ckpt.config, out, precision=precision, source=source, finish=plans,
                            replace_foreign=replace_foreign, dataset=dataset)


def build_model_plans(model: ModelDir, precision: str = "fp32", *, tf32: bool = True,
                      progress: Callable[[str], None] | None = None,
                      compute_capabilities: Sequence[str] | None = None, device_id: int = 0) -> None:
    """Build the TensorRT plan of ``model``'s RPN beside ``rpn.onnx`` on (and, with TensorRT, for) GPU
    ``device_id``, its timing cache in the dir (the GPU
    pipeline runs the PFN as a CUDA kernel, so ``pfn.onnx`` gets no plan).

    ``tf32`` keeps TensorRT's default of TensorFloat-32 convolutions in fp32 (``--no-tf32``: IEEE fp32).

    The plan is built for batches of 1 to ``MAX_BATCH`` frames (tuned for 1: the latency case) and records
    the config digest, precision and TF32 mode so a plan that does not fit the request is refused at load
    time. ``progress`` receives a line before the build (library, profile) and one after (plan size, build
    time). ``compute_capabilities``: see :func:`..runtime.tensorrt_build.build_plan`.
    """
    from ..runtime.tensorrt_build import build_plan, describe_build, describe_plan

    checked = check_precision(precision)
    dynamic = {RPN_INPUT: (1, 1, MAX_BATCH)}
    plan_path = model.plan_path("rpn")
    if progress is not None:
        progress(describe_build(plan_path, dynamic))
    metadata = build_plan(model.rpn_path, plan_path, precision=checked, dynamic_rows=dynamic,
                          config_digest=model.cfg.digest(), timing_cache_path=model.path / TIMING_CACHE,
                          tf32=tf32, compute_capabilities=compute_capabilities, device_id=device_id,
                          workspace_bytes=plan_workspace_bytes(model.cfg))
    if progress is not None:
        progress(describe_plan(plan_path, metadata))


#: TensorRT's timing cache, kept in the model dir so that a rebuild's tactics are timed once.
TIMING_CACHE = "timing.cache"


def _carry_timing_cache(previous: Path, staging: Path) -> None:
    """Start a rebuild's plans from the timing cache of the model dir it replaces: a build writes a new folder, which
    held none. TensorRT starts afresh from a cache of another version or GPU; TensorRT for RTX times nothing (its
    builds keep the cache as it is, for TensorRT's next one)."""
    cache = previous / TIMING_CACHE
    if cache.is_file() and not cache.is_symlink():
        shutil.copyfile(cache, staging / TIMING_CACHE)


#: The TensorRT workspace of the plans of a canvas of KITTI's size (432 x 496 cells of 64 channels), and that
#: canvas's cells x channels; a larger canvas gets a workspace in proportion (``plan_workspace_bytes``).
KITTI_PLAN_WORKSPACE = 1 << 30
KITTI_CANVAS = 432 * 496 * 64


def plan_workspace_bytes(cfg: ModelConfig) -> int:
    """The workspace TensorRT may give a plan's tactics: KITTI_PLAN_WORKSPACE for a canvas up to KITTI's, in
    proportion beyond (the convolutions' tactics grow with the activations they work on: the plan of a grid of
    0.08 m pillars, four KITTI canvases, was not built with 1 GiB, 2 or 3 GiB, and was with 4 GiB)."""
    nx, ny, _ = cfg.voxel.grid
    canvas = nx * ny * cfg.network.pfn_channels
    return max(KITTI_PLAN_WORKSPACE, -(-KITTI_PLAN_WORKSPACE * canvas // KITTI_CANVAS))


def export_model_dir(
    weights: ModelWeights,
    cfg: ModelConfig,
    out_dir: str | os.PathLike[str],
    *,
    precision: str,
    source: dict[str, Any],
    finish: Callable[[ModelDir], None] | None = None,
    replace_foreign: bool = False,
    dataset: dict[str, Any] | None = None,
) -> ModelDir:
    """Write both graphs and ``model.json`` into ``out_dir`` and return the model dir.

    ``source`` says where the weights came from (checkpoint path, sha256 and layout, or a random seed);
    it is stored as given and must be JSON-serialisable. ``dataset`` (stored when given) says what the
    training data config says about the points, e.g. ``{"fov_points_only": True}``. ``finish(model)`` runs on the new dir before it
    is moved into place (the TensorRT plan is built there). An existing ``out_dir`` must be empty or
    a model dir (or anything, with ``replace_foreign``: the package's own cache); it is replaced only once
    the new one is complete.
    """
    checked = check_precision(precision)
    folder = Path(out_dir)
    if not replace_foreign:
        _check_replaceable(folder)
    named = (safe_repr(source["checkpoint"]) if "checkpoint" in source else
             f"the weights of model dir {safe_repr(folder)}")
    graphs = {
        "pfn": (build_pfn_graph(weights, cfg, checked, source=named).SerializeToString(), pfn_io(cfg)),
        "rpn": (build_rpn_graph(weights, cfg, checked, source=named).SerializeToString(), rpn_io(cfg, checked)),
    }
    meta = {
        "format_version": FORMAT_VERSION,
        "package_version": package_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config_name": cfg.name,
        "config_digest": cfg.digest(),
        "config": cfg.to_dict(),
        "source": source,
        **({"dataset": dict(dataset)} if dataset else {}),
        "precision": checked,
        "onnx_opset": OPSET,
        "graphs": {
            name: {
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "inputs": [t.to_dict() for t in io.inputs],
                "outputs": [t.to_dict() for t in io.outputs],
            }
            for name, (data, io) in graphs.items()
        },
    }
    try:
        text = _metadata_text(meta)  # before the dir is touched
    except (TypeError, ValueError) as exc:
        raise ModelDirError(f"model dir {safe_repr(folder)}: metadata is not JSON-serialisable ({exc})") from None
    staging = _staging_dir(folder)
    try:
        for name, (data, _) in graphs.items():
            write_bytes_atomic(staging / f"{name}.onnx", data)
        write_bytes_atomic(staging / METADATA_FILE, text.encode("utf-8"))
        if finish is not None:
            finish(ModelDir(staging, cfg, json.loads(text)))
        replace_folder(staging, folder)
    except OSError as exc:
        raise ModelDirError(f"model dir {safe_repr(folder)}: cannot write {_os_error_subject(exc, staging, folder)} "
                            f"({exc.strerror or type(exc).__name__}); the previous contents are unchanged, unless a "
                            "concurrent build replaced them") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ModelDir(folder, cfg, json.loads(text))


#: What a model dir of ours may hold: model.json, the graphs, the TensorRT plan (+ its metadata; a pfn.plan is an
#: earlier version's), TensorRT's timing cache and the cuDNN plan cache.
_MODEL_DIR_ENTRIES = frozenset({METADATA_FILE, "cudnn", TIMING_CACHE,
                                *(f"{graph}.{ext}" for graph in GRAPHS for ext in ("onnx", "plan", "plan.json"))})


def _check_replaceable(folder: Path) -> None:
    """Refuse to replace anything but nothing, an empty folder or a model dir of ours (never a user's
    folder): its model.json must be one this package wrote and it may hold nothing else, since
    replacing the dir deletes every file in it; nor a folder this user cannot write in."""
    if folder.is_symlink():
        raise ModelDirError(f"model dir {safe_repr(folder)}: is a symbolic link (to {safe_repr(os.readlink(folder))}); "
                            "a build replaces its folder, so give the folder itself, or a new one")
    if folder.exists() and not folder.is_dir():
        raise ModelDirError(f"model dir {safe_repr(folder)}: exists and is not a folder")
    reason = unwritable_reason(folder) if folder.is_dir() else None
    if reason is not None:  # a folder its owner made read-only: the build's rename would replace it all the same
        raise ModelDirError(f"model dir {safe_repr(folder)}: cannot write there ({reason}); a build replaces the "
                            "folder with the one it writes: make it writable, or give another folder")
    try:
        entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    except FileNotFoundError:  # swapped out meanwhile by another build of the same folder: nothing to protect
        return
    if not entries:
        return
    if not (folder / METADATA_FILE).is_file() or not _ours(folder / METADATA_FILE):
        raise ModelDirError(f"model dir {safe_repr(folder)}: a non-empty folder that is not a model dir (no {METADATA_FILE} "
                            "written by pointpillars-trt); choose an empty or new folder")
    others = [name for name in entries if name not in _MODEL_DIR_ENTRIES]
    if others:
        shown = ", ".join(safe_repr(name, 60) for name in others[:5]) + (", ..." if len(others) > 5 else "")
        raise ModelDirError(f"model dir {safe_repr(folder)}: also holds {shown}, which a rebuild would delete; move them "
                            "out or choose an empty or new folder")


def _ours(meta_path: Path) -> bool:
    """Whether ``meta_path`` reads as a model.json this package wrote (any format version)."""
    try:
        meta = json.loads(read_regular_file(meta_path, max_bytes=MAX_METADATA_BYTES, what=METADATA_FILE))
    except (InputError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and {"format_version", "config_digest", "graphs"} <= set(meta)


def _staging_dir(folder: Path) -> Path:
    """A new folder beside ``folder`` for its build (``.NAME.build-PID-HOST-TOKEN``: ``owned_prefix``); the staging folders of earlier
    builds of it whose process is gone (killed: SIGKILL, out of memory) are removed first, or they would stay."""
    prefix = f".{folder.name}.build-"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_folders(folder.parent, prefix)
        staging = folder.parent / f"{owned_prefix(prefix)}{secrets.token_hex(4)}"
        staging.mkdir()
    except OSError as exc:
        blocking = next((parent for parent in folder.parents if parent.exists()), None)
        if blocking is not None and not blocking.is_dir():  # a file where a folder of the path should be
            raise ModelDirError(f"model dir {safe_repr(folder)}: {safe_repr(blocking)} is a file, not a folder") from None
        raise ModelDirError(f"model dir {safe_repr(folder)}: cannot create a build folder beside it "
                            f"({exc.strerror or type(exc).__name__})") from None
    return staging


def _os_error_subject(exc: OSError, staging: Path, folder: Path) -> str:
    name = exc.filename if isinstance(exc.filename, str) else None
    if not name:
        return "its files"
    return repr(str(Path(name)).replace(str(staging), str(folder)))
