"""Shared fixtures: where the shared KITTI and nuScenes assets are, and the two KITTI built-in configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pointpillars_trt.config import ModelConfig, load_config

REPO_ROOT = Path(__file__).resolve().parent.parent


def assets_dir() -> Path | None:
    """The test assets folder that $PP_ASSETS names (real KITTI frames, checkpoints), or None."""
    if not os.environ.get("PP_ASSETS"):
        return None
    candidate = Path(os.environ["PP_ASSETS"])
    if not candidate.is_absolute():
        candidate = REPO_ROOT / candidate
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def assets() -> Path:
    found = assets_dir()
    if found is None:
        pytest.skip("test assets not found: set PP_ASSETS to the folder holding kitti/ and checkpoints/")
    return found


@pytest.fixture(scope="session")
def cp():  # type: ignore[no-untyped-def]
    """CuPy, for the GPU tests (marked ``cuda``): the one place they skip, with the reason, where CuPy or
    a usable CUDA device is missing."""
    from tiny_graphs import cuda_skip_reason

    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    import cupy

    return cupy


@pytest.fixture(scope="session")
def gpu_engine(cp):  # type: ignore[no-untyped-def]
    """For the GPU tests that open a detector on ``cuda`` whatever its engine: skipped, with the reason, where
    no GPU engine backend can run (a GPU without the cuDNN frontend, ONNX Runtime's CUDA provider or TensorRT)."""
    from pointpillars_trt.devices import cuda_available

    reason = cuda_available(0)
    if reason is not None:
        pytest.skip(reason)
    return cp


@pytest.fixture(scope="session")
def nuscenes(assets: Path) -> Path:
    """The nuScenes multi-head checkpoint and multi-sweep frames of the shared assets."""
    folder = assets / "nuscenes"
    if not folder.is_dir():
        pytest.skip("nuScenes assets not found (assets/nuscenes)")
    return folder


@pytest.fixture(scope="session")
def openpcdet_cfg() -> ModelConfig:
    return load_config("openpcdet_kitti_3class")


@pytest.fixture(scope="session")
def zhulf_cfg() -> ModelConfig:
    return load_config("zhulf0804_kitti_3class")
