"""Programmatic dependent launch: a kernel's launch overlaps the end of the kernel before it (Hopper+).

Between two small dependent kernels a GPU otherwise idles for the first one's completion and the second
one's launch (~1-2 us in a CUDA graph); a pipeline frame is ~18 such kernels of ours. A launch with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may start before its predecessor has finished;
every kernel of this package calls ``pp_wait_for_prior_grids()`` (``cuda/grid_dependency.cuh``,
``griddepcontrol.wait``) before it touches memory, so results are those of ordinary stream order. CuPy has
no ``cuLaunchKernelEx``; this module calls the driver's through ctypes, at graph capture (a replay
launches the graph, not its kernels).

Used for launches captured into graphs on devices of compute capability 9.0 or above, unless
``POINTPILLARS_TRT_PDL=0``.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import numpy as np

PDL_ENV = "POINTPILLARS_TRT_PDL"
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, field for field."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def programmatic_launch_enabled(device_id: int) -> bool:
    """Whether launches on ``device_id`` are programmatic: compute capability 9.0+, and not turned off."""
    if os.environ.get(PDL_ENV, "1").strip() == "0":
        return False
    import cupy

    return int(cupy.cuda.Device(device_id).compute_capability) >= 90


@functools.lru_cache(maxsize=1)
def _driver_launch() -> Any:
    function = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                         ctypes.c_void_p]
    return function


def kernel_parameter(arg: Any) -> ctypes.Array[ctypes.c_char] | ctypes.c_uint64:
    """One kernel argument as the bytes the kernel reads: a device array's pointer or a NumPy scalar's
    value. Anything else is refused: a Python int or float has no width the kernel could rely on."""
    if isinstance(arg, np.generic):
        return (ctypes.c_char * arg.nbytes).from_buffer_copy(arg.tobytes())
    data = getattr(arg, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return ctypes.c_uint64(int(data.ptr))
    raise TypeError(f"kernel argument of type {type(arg).__name__}: expected a CuPy array or a NumPy scalar")


def launch_programmatic(kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                        stream: Any, shared_mem: int) -> None:
    """``kernel(grid, block, args)`` on ``stream`` through ``cuLaunchKernelEx`` with programmatic stream
    serialization; a refused launch raises CuPy's driver error (``checked`` turns it into BackendError)."""
    import cupy

    grid3 = (*grid, 1, 1)[:3]
    block3 = (*block, 1, 1)[:3]
    attribute = LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value = (1).to_bytes(4, "little")  # programmaticStreamSerializationAllowed = 1
    config = LaunchConfig(*grid3, *block3, shared_mem, ctypes.c_void_p(int(stream.ptr)),
                          ctypes.pointer(attribute), 1)
    values = [kernel_parameter(arg) for arg in args]
    pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    status = _driver_launch()(ctypes.byref(config), ctypes.c_void_p(int(kernel.ptr)), pointers, None)
    if status != 0:
        raise cupy.cuda.driver.CUDADriverError(status)
