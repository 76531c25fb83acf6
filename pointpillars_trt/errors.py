"""One exception family, so callers (and the CLI) can tell user errors from bugs."""


class PointPillarsError(Exception):
    """Base of every error this package raises on purpose."""


class InputError(PointPillarsError):
    """A lidar frame (file or array) that cannot be used."""


class ConfigError(PointPillarsError):
    """A model config that is missing, malformed or inconsistent."""


class CheckpointError(PointPillarsError):
    """A .pth file that cannot be read or whose layout is not a supported one."""


class ModelDirError(PointPillarsError):
    """A model directory (ONNX graphs, plans, metadata) that is missing or stale."""


class BackendError(PointPillarsError):
    """An engine backend (CUDA, CuPy, ONNX Runtime, TensorRT) that is absent or failed."""
