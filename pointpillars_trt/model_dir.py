"""A model dir: the ONNX graphs of one build, their TensorRT plans, and ``model.json`` saying what they are.

Layout (one precision per dir; a plan is specific to its precision and GPU anyway)::

    model.json   format version, full config + digest, weight source, precision, graph IO, versions
    pfn.onnx     pillars (P, M, C) -> pillar_features (P, 64)
    rpn.onnx     canvas (1, 64, ny, nx) -> cls, box, dir
    pfn.plan     TensorRT plans, written by the TensorRT builder when asked for
    rpn.plan

Every file is written atomically and ``model.json`` last, so a dir that has one is complete; an
export removes the plans of the graphs it replaces, so a plan always belongs to the graph beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from .config import ModelConfig, config_from_dict
from .errors import ConfigError, ModelDirError
from .kitti import write_bytes_atomic
from .onnx_export import OPSET, build_pfn_graph, build_rpn_graph, check_precision, pfn_io, rpn_io
from .weights import PointPillarsWeights

FORMAT_VERSION = 1
METADATA_FILE = "model.json"
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

    def engine_path(self, graph: str, backend: str) -> Path:
        """The file a backend loads for ``graph``: the plan for TensorRT, the ONNX graph otherwise."""
        return self.plan_path(graph) if backend == "tensorrt" else self.onnx_path(graph)

    def pfn_engine_path(self, backend: str) -> Path:
        return self.engine_path("pfn", backend)

    def rpn_engine_path(self, backend: str) -> Path:
        return self.engine_path("rpn", backend)


def export_model_dir(
    weights: PointPillarsWeights,
    cfg: ModelConfig,
    out_dir: str | os.PathLike[str],
    *,
    precision: str,
    source: dict[str, Any],
) -> ModelDir:
    """Write both graphs and ``model.json`` into ``out_dir`` (created if needed) and return the model dir.

    ``source`` says where the weights came from (checkpoint path, sha256 and layout, or a random seed);
    it is stored as given and must be JSON-serialisable.
    """
    precision = check_precision(precision)
    folder = Path(out_dir)
    graphs = {
        "pfn": (build_pfn_graph(weights, cfg, precision).SerializeToString(), pfn_io(cfg)),
        "rpn": (build_rpn_graph(weights, cfg, precision).SerializeToString(), rpn_io(cfg)),
    }
    meta = {
        "format_version": FORMAT_VERSION,
        "package_version": _package_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config_name": cfg.name,
        "config_digest": cfg.digest(),
        "config": cfg.to_dict(),
        "source": source,
        "precision": precision,
        "onnx_opset": OPSET,
        "graphs": {
            name: {
                "sha256": hashlib.sha256(data).hexdigest(),
                "inputs": [t.to_dict() for t in io.inputs],
                "outputs": [t.to_dict() for t in io.outputs],
            }
            for name, (data, io) in graphs.items()
        },
    }
    text = json.dumps(meta, indent=2) + "\n"  # a source that is not JSON fails here, before the dir is touched
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / METADATA_FILE
    meta_path.unlink(missing_ok=True)  # while its graphs change, the folder is not a model dir
    for name, (data, _) in graphs.items():
        for stale in folder.glob(f"{name}.plan*"):  # the plan (and its sidecars) of the old graph
            stale.unlink()
        write_bytes_atomic(folder / f"{name}.onnx", data)
    write_bytes_atomic(meta_path, text.encode("utf-8"))
    return ModelDir(folder, cfg, json.loads(text))


def load_model_dir(path: str | os.PathLike[str], expected_config: ModelConfig | None = None) -> ModelDir:
    """Open a model dir, checking that it is complete, readable and (if given) built for ``expected_config``."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelDirError(f"model dir {folder}: not found (build one with `pointpillars-trt build`)")
    meta_path = folder / METADATA_FILE
    if not meta_path.is_file():
        raise ModelDirError(f"{meta_path}: missing, so {folder} is not a model dir (build one with `pointpillars-trt build`)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{meta_path}: unreadable or not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ModelDirError(f"{meta_path}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelDirError(
            f"{meta_path}: format_version {version!r} is not known to pointpillars-trt {_package_version()} "
            f"(it reads {FORMAT_VERSION}); rebuild the model dir"
        )
    try:
        cfg = config_from_dict(meta["config"], str(meta_path))
        stored_digest, source = str(meta["config_digest"]), meta["source"]
        check_precision(meta["precision"])
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
    if expected_config is not None and expected_config.digest() != stored_digest:
        checkpoint = source.get("checkpoint", "CHECKPOINT") if isinstance(source, dict) else "CHECKPOINT"
        raise ModelDirError(
            f"{folder}: built for config {cfg.name} (digest {stored_digest}), but {expected_config.name} "
            f"(digest {expected_config.digest()}) was requested: rebuild with "
            f"`pointpillars-trt build --checkpoint {checkpoint} --config {expected_config.name} --out {folder}`"
        )
    return model


def _package_version() -> str:
    try:
        return importlib_metadata.version("pointpillars-trt")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"
