"""Programmatic dependent launch (CPU): the driver structs' layout, the kernel-argument bytes, and the rule
that makes early launches safe, that every kernel waits for the grids before it first."""

from __future__ import annotations

import ctypes
import re
from importlib import resources

import numpy as np
import pytest

from pointpillars_trt.kernels import programmatic_launch as pl


def test_structs_have_the_driver_layout() -> None:
    """cuda.h: CUlaunchConfig is seven unsigned ints, the stream at 32, the attribute pointer at 40, their
    count at 48 (56 bytes); CUlaunchAttribute is a 4-byte id padded to 8, then a 64-byte value (72)."""
    assert ctypes.sizeof(pl.LaunchConfig) == 56
    assert (pl.LaunchConfig.shared_mem.offset, pl.LaunchConfig.stream.offset, pl.LaunchConfig.attrs.offset,
            pl.LaunchConfig.num_attrs.offset) == (24, 32, 40, 48)
    assert ctypes.sizeof(pl.LaunchAttribute) == 72 and pl.LaunchAttribute.value.offset == 8


@pytest.mark.parametrize("value", [np.int32(-7), np.uint32(7), np.float32(1.5), np.int64(2**40), np.float64(0.1)])
def test_a_numpy_scalar_is_passed_as_its_own_bytes(value: np.generic) -> None:
    param = pl.kernel_parameter(value)
    assert ctypes.sizeof(param) == value.nbytes
    assert bytes(param) == value.tobytes()


@pytest.mark.parametrize("value", [7, 1.5, True, "7", np.zeros(3, np.float32)])
def test_an_argument_without_a_width_or_a_device_pointer_is_refused(value: object) -> None:
    with pytest.raises(TypeError, match="expected a CuPy array or a NumPy scalar"):
        pl.kernel_parameter(value)


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pl.PDL_ENV, "0")
    pl.programmatic_launch_enabled.cache_clear()
    try:
        assert pl.programmatic_launch_enabled(0) is False
    finally:
        pl.programmatic_launch_enabled.cache_clear()


def test_every_kernel_waits_for_the_grids_before_it_first() -> None:
    """A programmatic launch may start a kernel before the one it depends on has finished: the kernel's
    first statement must be the wait, in every kernel of every source."""
    folder = resources.files("pointpillars_trt") / "kernels" / "cuda"
    kernels = 0
    for source in sorted(p for p in folder.iterdir() if p.name.endswith(".cu")):
        text = source.read_text()
        assert '#include "grid_dependency.cuh"' in text, source.name
        for match in re.finditer(r'extern "C" __global__[^{]*?(\w+)\s*\([^{]*\{\s*([^;]*;)', text):
            kernels += 1
            assert match.group(2) == "pp_wait_for_prior_grids();", f"{source.name}: {match.group(1)}"
    assert kernels >= 26
