"""A model dir: the ONNX graphs of one build, the RPN's TensorRT plan, and ``model.json`` saying what they are.

Layout (one precision per dir; a plan is specific to its precision and GPU anyway)::

    model.json   format version, full config + digest, weight source, precision, graph IO, versions
    pfn.onnx     pillars (P, M, C) -> pillar_features (P, 64)
    rpn.onnx     canvas (B, ny, nx, 64) -> heads (B, hy, hx, cls|box|dir), NHWC
    rpn.plan     the RPN's TensorRT plan (+ rpn.plan.json), written by the TensorRT builder when asked for; the
                 GPU pipeline runs the PFN as a CUDA kernel, so a pfn.plan of an older build is ignored

This module only reads model dirs; ``convert/export.py`` is the one writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import dataclasses
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .config import ModelConfig, build_command, builtin_config_names, config_from_dict
from .errors import ConfigError, InputError, ModelDirError, counted, escape_text, safe_repr
from .file_reads import path_argument, read_regular_file, special_kind
from .graph_io import PRECISIONS, GraphIO, check_precision, pfn_io, rpn_io
from .graph_wire import (ELEMENT_DTYPES, DecodeError, DeclaredTensor, TensorError, graph_declaration,
                         graph_weights)
from .strict_json import DuplicateKeyError, loads_json

FORMAT_VERSION = 2  # 2: NHWC RPN with a dynamic batch and one merged head output
METADATA_FILE = "model.json"
#: The suffixes of PyTorch checkpoints (OpenPCDet's checkpoint_epoch_80.pth, Lightning's .ckpt).
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".ckpt")
MAX_METADATA_BYTES = 1 << 20  # model.json holds a config and a few digests: kilobytes
GRAPHS = ("pfn", "rpn")


class CheckedFile(NamedTuple):
    """A model dir file's bytes found to be the ones recorded (a graph's by ``load_model_dir``, against ``model.json``;
    a TensorRT plan's by ``runtime.tensorrt.check_plan_file``, against its metadata), their sha256, and the file's
    identity (``file_identity``) before their read."""

    identity: tuple[int, ...]
    data: bytes
    sha256: str


@dataclass(frozen=True)
class ModelDir:
    path: Path
    cfg: ModelConfig
    metadata: dict[str, Any]
    #: The bytes of its files read and checked as it opened (the graphs; the TensorRT plan of a model cache entry), by
    #: file name, waiting for the detector that opens them (``take_checked_files``), which then neither reads nor
    #: hashes them again (~25 ms for a 24 MB graph or plan); a ModelDir that no detector opens holds them as long as it
    #: lives.
    checked_files: dict[str, CheckedFile] = field(default_factory=dict, compare=False, repr=False)

    @property
    def precision(self) -> str:
        return str(self.metadata["precision"])

    def with_launch_values(self, cfg: ModelConfig) -> ModelDir:
        """This model dir run with ``cfg``'s launch values (score threshold, NMS IoU, max boxes): ``cfg`` is a config
        of its digest, which leaves them out, so a config that differs only in them opens it and runs with its own
        values, not the build's. Held in memory only (the folder may be read-only, or shared by runs of other
        values); what reopens the folder by path gets them from this value (``convert.export.copy_model_dir``, Ray's
        thresholds)."""
        if self.cfg.to_dict() == cfg.to_dict():
            return self
        return dataclasses.replace(self, cfg=cfg, metadata={**self.metadata, "config": cfg.to_dict()})

    @property
    def fov_points_only(self) -> bool | None:
        """Whether the model was trained on the camera-view points only (OpenPCDet's ``FOV_POINTS_ONLY``,
        recorded by ``build --pcdet-config``); None when the build recorded nothing."""
        value = self.metadata.get("dataset", {}).get("fov_points_only")
        return value if isinstance(value, bool) else None

    @property
    def pfn_path(self) -> Path:
        return self.onnx_path("pfn")

    @property
    def rpn_path(self) -> Path:
        return self.onnx_path("rpn")

    def onnx_path(self, graph: str) -> Path:
        return self.path / f"{graph}.onnx"

    def graph_record(self, graph: str) -> dict[str, Any] | None:
        """What ``model.json`` records of ``graph``'s ONNX file (its sha256 and size), if anything."""
        graphs = self.metadata.get("graphs")
        entry = graphs.get(graph) if isinstance(graphs, dict) else None
        return entry if isinstance(entry, dict) else None

    def graph_sha256(self, graph: str) -> str | None:
        """The SHA-256 ``model.json`` records of ``graph``'s ONNX file (``load_model_dir`` checked the file)."""
        found = (self.graph_record(graph) or {}).get("sha256")
        return found if isinstance(found, str) else None

    def plan_path(self, graph: str) -> Path:
        """Where the TensorRT plan of ``graph`` lives (builds write the RPN's only); it may not exist yet."""
        return self.path / f"{graph}.plan"

    def has_plans(self) -> bool:
        """Whether the TensorRT plan is built (``rpn.plan``; a ``pfn.plan`` of an older build is not needed)."""
        return self.plan_path("rpn").is_file()

    def take_checked_files(self) -> dict[str, CheckedFile]:
        """The checked bytes of its files (``checked_files``), by file name, handed over once so that the model dir holds
        them no longer (an engine that runs a plan has no use for its graph's). A file changed since its check is left
        out: its opener reads and checks it (``graph_to_open``; a plan against its metadata), refusing a graph that is
        not the recorded one, as it refuses a graph no check read (a model dir opened before in this process, or just
        built)."""
        taken = {name: self.checked_files.pop(name) for name in list(self.checked_files)}
        return {name: found for name, found in taken.items() if found.identity == file_identity(self.path / name)}



_DATASET_FACTS = {"fov_points_only": bool}


def _check_dataset(dataset: Any) -> None:
    """``model.json``'s optional ``dataset`` facts: a mapping of known keys to values of their type."""
    if not isinstance(dataset, dict):
        raise TypeError(f"dataset is {type(dataset).__name__}, expected an object")
    for key, value in dataset.items():
        kind = _DATASET_FACTS.get(key)
        if kind is None or not isinstance(value, kind):
            raise TypeError(f"dataset.{escape_text(str(key), 40)} = {value!r:.40} is not a known fact of its type")


def _recorded(folder: Path) -> dict[str, Any]:
    """``folder``'s model.json as it lies, none of ``load_model_dir``'s checks made ({} where it cannot be read or holds
    no JSON object; a model.json that is no regular file, such as a FIFO, is not read: it would block)."""
    try:
        meta = loads_json(read_regular_file(folder / METADATA_FILE, max_bytes=MAX_METADATA_BYTES, what="model.json"))
    except (OSError, InputError, ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def recorded_checkpoint(folder: Path) -> str | None:
    """The checkpoint ``folder`` was built from, as its model.json records it, where that file is still there (read
    as it lies: a model dir refused as damaged still names it)."""
    source = _recorded(folder).get("source")
    recorded = source.get("checkpoint") if isinstance(source, dict) else None
    return recorded if isinstance(recorded, str) and os.path.isfile(recorded) else None


def recorded_precision(folder: Path) -> str | None:
    """The precision ``folder``'s model.json records, read from that file alone (``load_model_dir`` reads and hashes
    the graphs too), where it is one this package builds; None where it records none or cannot be read."""
    precision = _recorded(folder).get("precision")
    return precision if isinstance(precision, str) and precision in PRECISIONS else None


def rebuild_command(folder: Path, config: str | None = None) -> str:
    """The ``build`` command that rebuilds ``folder`` from the checkpoint it records (a placeholder, said, where
    that is no longer there), for ``--config config`` where given."""
    checkpoint = recorded_checkpoint(folder)
    command = build_command(checkpoint, folder, config=config)
    return command if checkpoint is not None else (f"{command} (the model dir records no checkpoint that is still "
                                                   "there: name yours)")


def config_change_fix(folder: Path, built: ModelConfig, wanted: ModelConfig, config_arg: str) -> str:
    """The ``build`` command that gives a model dir for ``wanted`` (``--config config_arg``): a rebuild from
    its own checkpoint where the checkpoint layouts and head kinds match, else a new model dir from a checkpoint
    of ``wanted``'s layout or head kind (this one's cannot be read as it: a KITTI single-head checkpoint holds no
    nuScenes heads)."""
    new_dir = build_command(None, "NEW_MODEL_DIR", config=config_arg)
    if wanted.family != built.family:
        return (f"build a model dir from a checkpoint of the {wanted.family} layout: {new_dir} (the model dir's "
                f"checkpoint has the {built.family} layout)")
    if (wanted.heads is None) != (built.heads is None):
        return (f"build a model dir from a checkpoint of a {_head_kind(wanted)} network: {new_dir} (the model "
                f"dir's checkpoint holds a {_head_kind(built)} one)")
    return "rebuild with " + rebuild_command(folder, config_arg)


def _head_kind(cfg: ModelConfig) -> str:
    """How a config's detection head is built, as the checkpoints that fit it differ."""
    return "single-head" if cfg.heads is None else "multi-head"


def load_model_dir(path: str | os.PathLike[str], expected_config: ModelConfig | None = None) -> ModelDir:
    """Open a model dir, checking that it is complete, readable and (if given) built for ``expected_config``, whose
    launch values it then runs with (``ModelDir.with_launch_values``)."""
    folder = path_argument(path, "model dir", ModelDirError, "the path of a folder `pointpillars-trt build` wrote "
                           "(a str or pathlib.Path)")
    meta_path = folder / METADATA_FILE
    shown, meta_shown = safe_repr(folder), safe_repr(meta_path)
    if not folder.is_dir():
        if folder.is_file():
            raise ModelDirError(f"model dir {shown}: is a file, not a model dir (a .pth checkpoint opens with "
                                "PointPillars.from_checkpoint, or build a model dir with `pointpillars-trt build`)")
        kind = special_kind(folder)
        if kind is not None:
            raise ModelDirError(f"model dir {shown}: is {kind}, not a model dir or a .pth checkpoint")
        raise ModelDirError(f"model dir {shown}: not found (build one with `pointpillars-trt build`)")
    if not meta_path.is_file():
        kind = special_kind(meta_path)
        if kind is not None:
            raise ModelDirError(f"{meta_shown}: is {kind}, not a regular file; rebuild the model dir")
        model_dirs, checkpoints = _models_in(folder)
        if model_dirs:
            fix = f"the model dirs in it: {_some(model_dirs)}"
        elif checkpoints:  # OpenPCDet's output/.../ckpt/ folder given for its checkpoint
            fix = (f"the checkpoints in it: {_some(checkpoints)}; give one as --model "
                   "(Python: PointPillars.from_checkpoint)")
        else:
            fix = "build one with `pointpillars-trt build`"
        raise ModelDirError(f"{meta_shown}: missing, so {shown} is not a model dir ({fix})")
    try:
        meta = loads_json(read_regular_file(meta_path, max_bytes=MAX_METADATA_BYTES, what="model.json").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, DuplicateKeyError) as exc:
        raise ModelDirError(f"{meta_shown}: unreadable or not valid JSON ({exc})") from None
    except (RecursionError, ValueError) as exc:  # nested too deep, or numbers too long to be real
        raise ModelDirError(f"{meta_shown}: not a model.json this package wrote ({type(exc).__name__})") from None
    except InputError as exc:
        raise ModelDirError(str(exc)) from None
    if not isinstance(meta, dict):
        raise ModelDirError(f"{meta_shown}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("format_version")
    if type(version) is not int:  # "2" read as 2 would be misread: the writer of this file was not this package
        raise ModelDirError(f"{meta_shown}: format_version {safe_repr(version, 40)} is a {type(version).__name__}, "
                            f"not the integer this package writes ({FORMAT_VERSION}); rebuild the model dir")
    if version != FORMAT_VERSION:
        raise ModelDirError(
            f"{meta_shown}: format_version {version!r} is not known to pointpillars-trt {package_version()} "
            f"(it reads {FORMAT_VERSION}); rebuild the model dir"
        )
    try:
        cfg = config_from_dict(meta["config"], meta_shown)
        stored_digest = str(meta["config_digest"])
        if not isinstance(meta["source"], dict):  # where the weights came from (a rebuild's checkpoint)
            raise TypeError(f"source is {type(meta['source']).__name__}, expected an object")
        check_precision(meta["precision"])
        _check_dataset(meta.get("dataset", {}))
    except KeyError as exc:
        raise ModelDirError(f"{meta_shown}: missing key {exc}") from None
    except (ConfigError, TypeError) as exc:
        raise ModelDirError(f"{meta_shown}: malformed ({exc})") from None
    if cfg.digest() != stored_digest:
        raise ModelDirError(
            f"{meta_shown}: config digest {stored_digest} does not match the stored config ({cfg.digest()}): "
            "the file was edited or damaged; rebuild the model dir"
        )
    model = ModelDir(folder, cfg, meta)
    missing = [model.onnx_path(g).name for g in GRAPHS if not model.onnx_path(g).is_file()]
    odd = [(name, "a folder" if (folder / name).is_dir() else kind) for name in missing
           if (folder / name).is_dir() or (kind := special_kind(folder / name)) is not None]
    if odd:
        raise ModelDirError(f"{shown}: {odd[0][0]} is {odd[0][1]}, not a regular file; rebuild the model dir")
    if missing:
        raise ModelDirError(f"{shown}: {', '.join(missing)} missing (listed in {METADATA_FILE}); rebuild the model dir")
    for graph in GRAPHS:
        checked = _verify_graph(model, graph)
        if checked is not None:
            model.checked_files[model.onnx_path(graph).name] = checked
    if expected_config is not None and expected_config.digest() != stored_digest:
        config = expected_config.name if expected_config.name in builtin_config_names() else "YOUR_CONFIG.yaml"
        raise ModelDirError(
            f"{shown}: built for config {cfg.name} (digest {stored_digest}), but {expected_config.name} "
            f"(digest {expected_config.digest()}) was requested: "
            + config_change_fix(folder, cfg, expected_config, config)
        )
    return model if expected_config is None else model.with_launch_values(expected_config)


#: Largest graph file read: protobuf's own limit for one ONNX file (larger ones keep external data).
MAX_GRAPH_BYTES = 2**31 - 1
#: (path, file identity, graph, sha256) checked once a process. The identity holds the inode and change time besides
#: the size and mtime: a file rewritten in place with its size kept and its mtime set back (os.utime, cp -p, rsync -t)
#: has a new ctime, which no user can set back, so it is checked again.
_VERIFIED: set[tuple[str, tuple[int, ...], str, str]] = set()


def _verify_graph(model: ModelDir, graph: str) -> CheckedFile | None:
    """The graph file must be the one ``model.json`` records (a flipped byte gives wrong boxes silently),
    and its inputs and outputs the ones the record (and the config) say, so a mismatch is one error
    at load instead of a failure on every frame. The size is compared before anything is hashed. Returns the bytes
    checked, for the graph's opener; None where this process checked the file before and read nothing now."""
    path, meta_path = model.onnx_path(graph), model.path / METADATA_FILE
    entry = model.graph_record(graph)
    expected = model.graph_sha256(graph)
    if entry is None or expected is None:
        raise ModelDirError(f"{safe_repr(meta_path)}: no sha256 recorded for {path.name}; rebuild the model dir")
    recorded_size = entry.get("size")
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelDirError(f"{safe_repr(path)}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if isinstance(recorded_size, int) and stat.st_size != recorded_size:
        raise ModelDirError(f"{safe_repr(path)}: damaged or replaced ({counted(stat.st_size, 'byte')}, {METADATA_FILE} "
                            f"records {recorded_size}); rebuild the model dir")
    key = (str(path.resolve()), _identity(stat), graph, expected)
    if key in _VERIFIED:
        return None
    data = _read_graph(path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise ModelDirError(f"{safe_repr(path)}: damaged or replaced (sha256 {digest[:12]}..., {METADATA_FILE} records "
                            f"{expected[:12]}...); rebuild the model dir")
    _check_graph_io(path, data, entry, pfn_io(model.cfg) if graph == "pfn" else rpn_io(model.cfg, model.precision))
    _VERIFIED.add(key)
    return CheckedFile(_identity(stat), data, digest)


def graph_to_open(path: Path, checked: CheckedFile | None, recorded_sha256: str | None) -> bytes | None:
    """What an engine or kernel opens a model dir's graph from: the bytes its model dir's check handed over
    (``checked``: ``ModelDir.take_checked_files``), else the file's, read now and refused unless they are the ones its
    model dir records (``recorded_sha256``): the file may have been replaced since the model dir was checked (or a
    check of this process before skipped reading it), and an engine runs what it reads. None where there is no record
    (a graph opened outside a model dir): its opener reads the file itself."""
    if checked is not None:
        return checked.data
    if recorded_sha256 is None:
        return None
    data = _read_graph(path)
    if hashlib.sha256(data).hexdigest() != recorded_sha256:
        raise ModelDirError(f"{safe_repr(path)}: replaced since its model dir was opened (a build into the same "
                            "folder?): not the graph its model.json records; open the model dir again")
    return data


def _read_graph(path: Path) -> bytes:
    """A graph file's bytes (a regular file of at most ``MAX_GRAPH_BYTES``), refused as a ModelDirError."""
    try:
        return read_regular_file(path, max_bytes=MAX_GRAPH_BYTES, what="graph")
    except InputError as exc:
        raise ModelDirError(str(exc)) from None


def file_identity(path: Path) -> tuple[int, ...] | None:
    """What tells a file's contents apart without reading them (device, inode, size, modification and change
    times), or None where it cannot be looked at."""
    try:
        return _identity(os.stat(path))
    except OSError:
        return None


def _identity(found: os.stat_result) -> tuple[int, ...]:
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def _check_graph_io(path: Path, data: bytes, entry: dict[str, Any], expected: GraphIO) -> None:
    """Names, ranks, dtypes and fixed sizes: the record must be what the config implies, and the
    graph what the record says."""
    meta_path = path.parent / METADATA_FILE
    want = {"inputs": [t.to_dict() for t in expected.inputs], "outputs": [t.to_dict() for t in expected.outputs]}
    for side in ("inputs", "outputs"):
        if entry.get(side) != want[side]:
            raise ModelDirError(f"{safe_repr(meta_path)}: the {side} recorded for {path.name} "
                                f"({_io_text(entry.get(side))}) are not what its config gives ({_io_text(want[side])}); "
                                "rebuild the model dir")
    found = _onnx_io(path, data)
    for side in ("inputs", "outputs"):
        if [_io_key(t) for t in found[side]] != [_io_key(t) for t in want[side]]:
            raise ModelDirError(f"{safe_repr(path)}: {side} {_io_text(found[side])}, but {METADATA_FILE} records "
                                f"{_io_text(want[side])}: not the graph this model dir was built with; rebuild it")


def _onnx_io(path: Path, data: bytes) -> dict[str, list[dict[str, Any]]]:
    """The graph's inputs (initializers left out) and outputs as TensorSpec-like dicts; a symbolic
    or unknown size is its name (or "?"). Read from the records that declare them (``graph_wire``): a whole parse
    imported onnx and decoded every weight, for these few records."""
    try:
        found = graph_declaration(data)
    except DecodeError as exc:
        raise ModelDirError(f"{safe_repr(path)}: not a readable ONNX graph ({type(exc).__name__})") from None

    def spec(tensor: DeclaredTensor) -> dict[str, Any]:
        shape = [d if isinstance(d, int) else (d or "?") for d in tensor.dims]
        return {"name": tensor.name, "shape": shape,
                "dtype": ELEMENT_DTYPES.get(tensor.elem_type, f"onnx type {tensor.elem_type}")}

    return {"inputs": [spec(t) for t in found.inputs if t.name not in found.initializers],
            "outputs": [spec(t) for t in found.outputs]}


def _io_key(spec: Any) -> tuple[Any, ...]:
    """What must agree: name, dtype, rank and every fixed size (symbolic sizes are named freely)."""
    shape = spec.get("shape") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(shape, list):
        return (repr(spec),)
    return (spec.get("name"), spec.get("dtype"), len(shape), tuple(d if isinstance(d, int) else None for d in shape))


def _io_text(specs: Any) -> str:
    if not isinstance(specs, list):
        return safe_repr(specs, 80)
    def one(spec: Any) -> str:
        if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list):
            return str(spec)
        return f"{spec.get('name')} {spec.get('dtype')} [{', '.join(map(str, spec['shape']))}]"

    return safe_repr("; ".join(map(one, specs)), 200)[1:-1]  # escaped (the record is untrusted), unquoted


def _models_in(folder: Path, limit: int = 1000) -> tuple[list[str], list[str]]:
    """The subfolders of ``folder`` that hold a model.json, and its checkpoint files (a folder of model dirs or of
    checkpoints given for one), each sorted; at most ``limit`` entries are looked at."""
    try:
        with os.scandir(folder) as scan:
            entries = [(entry.name, entry.is_dir(), entry.is_file()) for _, entry in zip(range(limit), scan)]
    except OSError:
        return [], []
    return (sorted(name for name, is_dir, _ in entries if is_dir and (folder / name / METADATA_FILE).is_file()),
            sorted(name for name, _, is_file in entries if is_file and name.lower().endswith(CHECKPOINT_SUFFIXES)))


def _some(names: list[str]) -> str:
    """The first three of ``names``, and how many more."""
    return ", ".join(map(safe_repr, names[:3])) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


#: What tells one model from another wherever its files lie (``identity_from_record``), keys in the order said: a
#: server states them of the model it serves, and a run records them with its outputs.
MODEL_IDENTITY_KEYS = ("weights", "config", "config_name", "precision")


def identity_from_record(source: object, config_digest: str, config_name: str, precision: str) -> dict[str, object]:
    """A model's identity from what its model.json records: the weights it was exported from, of ``source``
    (the checkpoint's sha256 and layout, or a seed; not where the checkpoint lay), its config's digest and name,
    and its precision."""
    weights = {k: v for k, v in source.items() if k != "checkpoint"} if isinstance(source, dict) else source
    return dict(zip(MODEL_IDENTITY_KEYS, (weights, config_digest, config_name, precision)))


def package_version() -> str:
    try:
        return importlib_metadata.version("pointpillars-trt")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def graph_initializers(path: Path, data: bytes | None = None) -> dict[str, np.ndarray]:
    """The named weights of an ONNX graph of a model dir (the engines and kernels that compute the
    graph's function themselves read them here); ``data``: the file's bytes where its opener has them
    (``graph_to_open``), else the file is read. Read from the initializer records alone (``graph_wire``), each a
    read-only view of the bytes where it lies in them whole: a whole parse imported onnx and decoded every node, for
    these records."""
    try:
        found = graph_weights(_read_graph(path) if data is None else data)
    except DecodeError as exc:
        raise ModelDirError(f"{safe_repr(path)}: not a readable ONNX graph ({type(exc).__name__})") from None
    except TensorError as exc:
        raise ModelDirError(f"{safe_repr(path)}: initializer {safe_repr(exc.name)} {exc.reason}: not a graph this "
                            "package writes; rebuild the model dir") from None
    return {name: array for name, array in found.items() if isinstance(name, str)}  # no UTF-8: no name looked up


def pfn_weights(model: ModelDir, checked: CheckedFile | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The folded PFN weight (64, C) and bias (64,) of the model's ``pfn.onnx`` (``checked``: its bytes as the model
    dir's check handed them over, else the file's, checked against ``model.json``: ``graph_to_open``), as float32.

    The GPU pipeline's fused PFN kernel computes the graph's function from them.
    """
    path = model.pfn_path
    found = graph_initializers(path, graph_to_open(path, checked, model.graph_sha256("pfn")))
    if "pfn.weight" not in found or "pfn.bias" not in found:
        raise ModelDirError(f"{safe_repr(path)}: lacks pfn.weight / pfn.bias: not made by this package")
    return np.ascontiguousarray(found["pfn.weight"].T, np.float32), found["pfn.bias"].astype(np.float32)
