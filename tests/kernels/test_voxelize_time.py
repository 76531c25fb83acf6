"""The GPU voxelizer with a time column (multi-sweep models) against the NumPy reference, bit for bit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pointpillars_trt.config import load_config
from pointpillars_trt.errors import InputError
from pointpillars_trt.kernels import _launch
from pointpillars_trt.kernels import voxelize as gpu_vox
from pointpillars_trt.reference import voxelize
from test_kernels import assert_matches_reference, fetch, stream  # noqa: F401  (fixtures; cp: conftest)

CFG = load_config("openpcdet_nuscenes_multihead")
FRAMES = ("nusc_dev_k000000_s05.bin", "nusc_dev_k000002_s02.bin")


def run_with_times(cp: Any, stage: Any, pts: np.ndarray, stream: Any) -> dict[str, np.ndarray]:  # noqa: F811
    """The frame's x y z intensity as float4 rows and its time lags beside them, after decoy rows."""
    first = 3
    rows = np.zeros((first + pts.shape[0] + 5, 4), np.float32)
    rows[:] = [0.0, 0.0, -1.0, 0.5]  # decoys in range: reading outside the frame would show
    rows[first: first + pts.shape[0]] = pts[:, :4]
    times = np.full(rows.shape[0], 0.7, np.float32)
    times[first: first + pts.shape[0]] = pts[:, 4]
    reported = voxelize(pts, CFG).num_pillars
    stage.features[0, :reported] = np.nan  # poison: every row the frame reports must be rewritten
    stage.launch(cp.asarray(rows), cp.asarray(np.array([pts.shape[0], first], np.int32)), stream,
                 times=cp.asarray(times))
    return fetch(stage, stream)


@pytest.mark.cuda
@pytest.mark.parametrize("frame", FRAMES)
def test_voxelize_nuscenes_frames_with_time(cp: Any, stream: Any, nuscenes: Path, frame: str) -> None:  # noqa: F811
    pts = np.fromfile(nuscenes / frame, "<f4").reshape(-1, 5)
    pts[7, 4] = np.nan  # a non-finite time drops its point, as in the reference
    stage = gpu_vox.VoxelizeStage(CFG, 32768)
    assert_matches_reference(run_with_times(cp, stage, pts, stream), pts, CFG, frame)
    with pytest.raises(InputError, match="the model reads a time column"):
        stage.launch(cp.zeros((8, 4), np.float32), cp.zeros(2, np.int32), stream)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_voxelize_with_time_compiles_with_nvcc(tmp_path: Path) -> None:
    src = tmp_path / "voxelize.cu"
    src.write_text(_launch.kernel_source("voxelize.cu"))
    cmd = ["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "out.cubin"), "-Xptxas", "-warn-spills",
           *_launch.COMPILE_OPTIONS, *gpu_vox.VoxelParams.from_config(CFG).defines(), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "warning" not in done.stderr.lower(), done.stderr
