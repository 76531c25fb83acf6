"""pointpillars-trt: PointPillars lidar 3D detection as a zero-copy GPU pipeline.

The public API: ``PointPillars`` (``from_checkpoint`` / ``from_model_dir`` / ``__call__`` /
``infer_many``), the ``Detections`` it returns, per-call ``Thresholds``, ``load_config`` and the
``PointPillarsError`` family.
"""

from .config import ModelConfig, Thresholds, load_config
from .detections import Detections, FrameStats
from .errors import PointPillarsError

__version__ = "0.1.0"
__all__ = ["Detections", "FrameStats", "ModelConfig", "PointPillars", "PointPillarsError", "Thresholds", "load_config"]


def __getattr__(name: str) -> object:
    # The detector pulls in ONNX Runtime; import it only when asked for.
    if name == "PointPillars":
        from .detector import PointPillars

        return PointPillars
    raise AttributeError(name)
