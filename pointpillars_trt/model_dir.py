"""A model dir: the ONNX graphs of one build, their TensorRT plans, and ``model.json`` saying what they are.

Layout (one precision per dir; a plan is specific to its precision and GPU anyway)::

    model.json   format version, full config + digest, weight source, precision, graph IO, versions
    pfn.onnx     pillars (P, M, C) -> pillar_features (P, 64)
    rpn.onnx     canvas (B, ny, nx, 64) -> heads (B, hy, hx, cls|box|dir), NHWC
    pfn.plan     TensorRT plans, written by the TensorRT builder when asked for
    rpn.plan

This module only reads model dirs; ``build.export`` is the one writer.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import os
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig, builtin_config_names, config_from_dict
from .errors import ConfigError, InputError, ModelDirError
from .fileio import read_regular_file
from .graph_io import check_precision

FORMAT_VERSION = 2  # 2: NHWC RPN with a dynamic batch and one merged head output
METADATA_FILE = "model.json"
MAX_METADATA_BYTES = 1 << 20  # model.json holds a config and a few digests: kilobytes
GRAPHS = ("pfn", "rpn")


@dataclass(frozen=True)
class ModelDir:
    path: Path
    cfg: ModelConfig
    metadata: dict[str, Any]

    @property
    def precision(self) -> str:
        return str(self.metadata["precision"])

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

    def plan_path(self, graph: str) -> Path:
        """Where the TensorRT plan of ``graph`` ("pfn" or "rpn") lives; it may not exist yet."""
        return self.path / f"{graph}.plan"

    def has_plans(self) -> bool:
        return all(self.plan_path(g).is_file() for g in GRAPHS)



_DATASET_FACTS = {"fov_points_only": bool}


def _check_dataset(dataset: Any) -> None:
    """``model.json``'s optional ``dataset`` facts: a mapping of known keys to values of their type."""
    if not isinstance(dataset, dict):
        raise TypeError(f"dataset is {type(dataset).__name__}, expected an object")
    for key, value in dataset.items():
        kind = _DATASET_FACTS.get(key)
        if kind is None or not isinstance(value, kind):
            raise TypeError(f"dataset.{key} = {value!r:.40} is not a known fact of its type")


def load_model_dir(path: str | os.PathLike[str], expected_config: ModelConfig | None = None) -> ModelDir:
    """Open a model dir, checking that it is complete, readable and (if given) built for ``expected_config``."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelDirError(f"model dir {folder}: not found (build one with `pointpillars-trt build`)")
    meta_path = folder / METADATA_FILE
    if not meta_path.is_file():
        raise ModelDirError(f"{meta_path}: missing, so {folder} is not a model dir (build one with `pointpillars-trt build`)")
    try:
        meta = json.loads(read_regular_file(meta_path, max_bytes=MAX_METADATA_BYTES, what="model.json").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{meta_path}: unreadable or not valid JSON ({exc})") from None
    except (RecursionError, ValueError) as exc:  # nested too deep, or numbers too long to be real
        raise ModelDirError(f"{meta_path}: not a model.json this package wrote ({type(exc).__name__})") from None
    except InputError as exc:
        raise ModelDirError(str(exc)) from None
    if not isinstance(meta, dict):
        raise ModelDirError(f"{meta_path}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelDirError(
            f"{meta_path}: format_version {version!r} is not known to pointpillars-trt {package_version()} "
            f"(it reads {FORMAT_VERSION}); rebuild the model dir"
        )
    try:
        cfg = config_from_dict(meta["config"], str(meta_path))
        stored_digest, source = str(meta["config_digest"]), meta["source"]
        check_precision(meta["precision"])
        _check_dataset(meta.get("dataset", {}))
    except KeyError as exc:
        raise ModelDirError(f"{meta_path}: missing key {exc}") from None
    except (ConfigError, TypeError) as exc:
        raise ModelDirError(f"{meta_path}: malformed ({exc})") from None
    if cfg.digest() != stored_digest:
        raise ModelDirError(
            f"{meta_path}: config digest {stored_digest} does not match the stored config ({cfg.digest()}): "
            "the file was edited or damaged; rebuild the model dir"
        )
    model = ModelDir(folder, cfg, meta)
    missing = [model.onnx_path(g).name for g in GRAPHS if not model.onnx_path(g).is_file()]
    if missing:
        raise ModelDirError(f"{folder}: {', '.join(missing)} missing (listed in {METADATA_FILE}); rebuild the model dir")
    for graph in GRAPHS:
        _verify_graph(model.onnx_path(graph), meta, graph)
    if expected_config is not None and expected_config.digest() != stored_digest:
        checkpoint = source.get("checkpoint") if isinstance(source, dict) else None
        config = expected_config.name if expected_config.name in builtin_config_names() else "YOUR_CONFIG.yaml"
        raise ModelDirError(
            f"{folder}: built for config {cfg.name} (digest {stored_digest}), but {expected_config.name} "
            f"(digest {expected_config.digest()}) was requested: rebuild with `pointpillars-trt build "
            f"--checkpoint {shlex.quote(str(checkpoint or 'CHECKPOINT.pth'))} --config {shlex.quote(config)} "
            f"--out {shlex.quote(str(folder))}`"
        )
    return model


_VERIFIED: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, once per process


def _verify_graph(path: Path, meta: dict[str, Any], graph: str) -> None:
    """The graph file must be the one ``model.json`` records (a flipped byte gives wrong boxes silently)."""
    entry = meta.get("graphs", {}).get(graph) if isinstance(meta.get("graphs"), dict) else None
    expected = entry.get("sha256") if isinstance(entry, dict) else None
    if not isinstance(expected, str):
        raise ModelDirError(f"{path.parent / METADATA_FILE}: no sha256 recorded for {path.name}; rebuild the model dir")
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        digest = _VERIFIED.get(key)
        if digest is None:
            sha = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    sha.update(chunk)
            digest = sha.hexdigest()
            _VERIFIED[key] = digest
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if digest != expected:
        raise ModelDirError(f"{path}: damaged or replaced (sha256 {digest[:12]}..., {METADATA_FILE} records "
                            f"{expected[:12]}...); rebuild the model dir")


def package_version() -> str:
    try:
        return importlib_metadata.version("pointpillars-trt")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def graph_initializers(path: Path) -> dict[str, np.ndarray]:
    """The named weights of an ONNX graph of a model dir (the engines and kernels that compute the
    graph's function themselves read them here)."""
    import onnx
    from onnx import numpy_helper

    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and friends for damaged files
        raise ModelDirError(f"{path}: not a readable ONNX graph ({type(exc).__name__})") from None
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def pfn_weights(model: ModelDir) -> tuple[np.ndarray, np.ndarray]:
    """The folded PFN weight (64, C) and bias (64,) of the model's ``pfn.onnx``, as float32.

    The GPU pipeline's fused PFN kernel computes the graph's function from them.
    """
    found = graph_initializers(model.pfn_path)
    if "pfn.weight" not in found or "pfn.bias" not in found:
        raise ModelDirError(f"{model.pfn_path}: lacks pfn.weight / pfn.bias: not made by this package")
    return np.ascontiguousarray(found["pfn.weight"].T, np.float32), found["pfn.bias"].astype(np.float32)
