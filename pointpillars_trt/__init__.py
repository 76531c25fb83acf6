"""pointpillars-trt: PointPillars lidar 3D detection as a multi-stage GPU pipeline over buffers allocated once.

The public API: ``PointPillars`` (``from_checkpoint`` / ``from_model_dir`` / ``__call__`` /
``detect_batch`` / ``infer_many``), the ``Detections`` it returns (and the ``FrameResult`` that ``infer_many``
yields for each frame), per-call ``Thresholds``, the ``RuntimeOptions`` a detector runs with, ``load_config`` and the
``PointPillarsError`` family.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ModelConfig, Thresholds, load_config
    from .detections import Detections, FrameStats
    from .detector import FrameResult, PointPillars
    from .errors import PointPillarsError
    from .runtime_options import RuntimeOptions

__version__ = "0.1.0"
__all__ = ["Detections", "FrameResult", "FrameStats", "ModelConfig", "PointPillars", "PointPillarsError", "RuntimeOptions",
           "Thresholds", "load_config"]
#: The module each public name lives in.
_HOMES = {"Detections": "detections", "FrameResult": "detector", "FrameStats": "detections", "ModelConfig": "config",
          "PointPillars": "detector", "PointPillarsError": "errors", "RuntimeOptions": "runtime_options",
          "Thresholds": "config", "load_config": "config"}


def __getattr__(name: str) -> object:
    """A public name, imported when first asked for: importing the package (as the command line's entry
    does first) loads neither NumPy nor ONNX Runtime."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names and the module's own dunders (not its helpers' imports)."""
    return sorted({*__all__, "__version__", *(name for name in globals() if name.startswith("__"))})
