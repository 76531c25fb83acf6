"""Compile-once CUDA modules and checked launches, shared by every GPU stage.

Each stage's ``cuda/<stage>.cu`` is compiled once per distinct parameter set (``-D`` defines; no number
is hard-coded in the CUDA sources; what may change per call is a kernel argument, never a define) with
the shared header pasted in, its kernels fetched by their declared names up front, and every launch
checked: a CUDA or compiler error becomes a BackendError naming the stage or kernel. CuPy is imported lazily: the package imports, and the CPU path runs,
without it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackendError, InputError
from ..file_writes import user_cache_dir, write_bytes_atomic
from ..stop_signals import stop_signals_blocked

COMPILE_OPTIONS = ("-std=c++17", "--fmad=false")  # no contraction: float32 steps round as NumPy's do
_INCLUDE = re.compile(r'#include "([a-z_]+\.cuh)"')  # a header of kernels/cuda


def cupy_module() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise BackendError(
            "CuPy is not installed: the GPU stages need it (pip install 'pointpillars-trt[cuda13]' or [cuda12])"
        ) from exc
    return cupy


@contextmanager
def checked(what: str) -> Iterator[None]:
    """Turn CuPy's CUDA and compiler exceptions into BackendError naming the stage and the CUDA error."""
    cp = cupy_module()
    try:
        yield
    except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as exc:
        raise BackendError(f"{what}: CUDA error {exc}") from exc
    except cp.cuda.compiler.CompileException as exc:
        raise BackendError(f"{what}: kernel compilation failed:\n{exc}") from exc


def kernel_source(file: str) -> str:
    """The CUDA source of ``kernels/cuda/<file>`` with each ``#include "<header>.cuh"`` of that folder
    pasted in its place (headers include no others).

    Pasting (rather than an include path) puts the whole text in CuPy's kernel-cache key.
    """
    folder = resources.files("pointpillars_trt") / "kernels" / "cuda"
    lines = []
    for line in (folder / file).read_text().splitlines(keepends=True):
        found = _INCLUDE.fullmatch(line.strip())
        lines.append((folder / found.group(1)).read_text() if found else line)
    return "".join(lines)


@functools.lru_cache(maxsize=None)
def _module(file: str, defines: tuple[str, ...]) -> Any:
    return cupy_module().RawModule(code=kernel_source(file), options=COMPILE_OPTIONS + defines)


def compiled_modules() -> int:
    """How many modules have been compiled or loaded in this process (one per file and define set, and for an
    architecture-specific one per GPU too): values that change per call, such as the post-process
    thresholds, are kernel arguments and never add one."""
    return _module.cache_info().currsize + _arch_module.cache_info().currsize


def compile_kernels(file: str, defines: tuple[str, ...], names: tuple[str, ...]) -> dict[str, Any]:
    """Compile ``file`` once per define set and fetch every declared kernel up front (CuPy compiles with
    NVRTC on its first use on a machine: stop signals held meanwhile, see ``stop_signals``)."""
    with checked(file), stop_signals_blocked(keep_python_handlers=True):
        module = _module(file, defines)
        return {name: module.get_function(name) for name in names}


@functools.lru_cache(maxsize=None)
def _arch_module(file: str, defines: tuple[str, ...], arch: str, device_id: int) -> Any:
    """The module of ``file`` for ``arch`` loaded on GPU ``device_id`` (a module belongs to one device's
    context), its cubin from the user cache when a process before compiled it."""
    cp = cupy_module()
    try:
        cached: Path | None = _cubin_path(file, defines, arch)
    except (RuntimeError, OSError):  # no home folder to find the cache in (a container's anonymous user)
        cached = None
    module = cp.cuda.function.Module()
    cubin = read_cubin(cached) if cached is not None else None
    if cubin is not None:
        try:
            module.load(cubin)
            return module
        except cp.cuda.driver.CUDADriverError:  # a cubin this driver refuses: compiled again
            pass
    cubin = _compile_cubin(file, defines, arch)
    if cached is not None:
        write_cubin(cached, cubin)
    module.load(cubin)
    return module


#: A kept cubin's file: the SHA-256 of the cubin, then the cubin (the driver reads a cubin without its length,
#: so a damaged one is told by its digest before the driver sees it).
_DIGEST_BYTES = 32


def read_cubin(path: Path) -> bytes | None:
    """The cubin kept at ``path``; None when there is none, or it cannot be read, or it is damaged."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, cubin = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
    return cubin if cubin and hashlib.sha256(cubin).digest() == digest else None


def write_cubin(path: Path, cubin: bytes) -> None:
    """Keep ``cubin`` at ``path`` with its digest (atomically: a reader never sees half a file); a cache that
    cannot be written is left alone (the next process compiles again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, hashlib.sha256(cubin).digest() + cubin, durable=False)
    except OSError:
        pass


def _cubin_path(file: str, defines: tuple[str, ...], arch: str) -> Path:
    """Where ``file``'s cubin for ``arch`` is kept (``kernels/`` in the user cache), named by a hash of what
    makes it: the pasted source, the options and NVRTC's version.

    Kept so that NVRTC runs once a machine, not in every process: while it compiles, NVRTC's own SIGINT and
    SIGTERM handlers stand in for Python's, and a Ctrl-C or SIGTERM that came then was lost (an H200 run
    of ``infer`` signalled ~1.2 s after its start went on to its end); it also saves ~0.04 s a start."""
    from cupy_backends.cuda.libs import nvrtc

    made_of = json.dumps([kernel_source(file), arch, COMPILE_OPTIONS, defines, nvrtc.getVersion()])
    digest = hashlib.sha256(made_of.encode()).hexdigest()[:32]
    return user_cache_dir() / "kernels" / f"{Path(file).stem}-{arch}-{digest}.cubin"


def _compile_cubin(file: str, defines: tuple[str, ...], arch: str) -> bytes:
    from cupy_backends.cuda.libs import nvrtc

    try:
        program = nvrtc.createProgram(kernel_source(file), file, (), ())
        try:
            try:
                with stop_signals_blocked(keep_python_handlers=True):
                    nvrtc.compileProgram(program, [f"--gpu-architecture={arch}", *COMPILE_OPTIONS, *defines])
            except nvrtc.NVRTCError as exc:
                log = nvrtc.getProgramLog(program)
                raise BackendError(f"{file}: kernel compilation for {arch} failed:\n{log}") from exc
            return bytes(nvrtc.getCUBIN(program))
        finally:
            nvrtc.destroyProgram(program)
    except nvrtc.NVRTCError as exc:  # NVRTC itself failed (out of memory, a broken install)
        raise BackendError(f"{file}: NVRTC failed ({exc})") from exc


class ArchKernel:
    """A kernel of an architecture-specific module, used as CuPy's RawKernel is: called with (grid,
    block, args, stream=, shared_mem=), named, with a settable ``max_dynamic_shared_size_bytes``."""

    _MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

    def __init__(self, function: Any, name: str) -> None:
        self._function = function
        self.name = name

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], *, stream: Any,
                 shared_mem: int = 0) -> None:
        self._function(grid, block, args, shared_mem=shared_mem, stream=stream)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return int(cupy_module().cuda.driver.funcGetAttribute(self._MAX_DYNAMIC_SHARED, self._function.ptr))

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        cupy_module().cuda.driver.funcSetAttribute(self._function.ptr, self._MAX_DYNAMIC_SHARED, value)


def compile_arch_kernels(file: str, defines: tuple[str, ...], names: tuple[str, ...],
                         arch: str) -> dict[str, ArchKernel]:
    """``compile_kernels`` for an architecture-specific target (``sm_90a``: wgmma), which CuPy's own
    compile path does not name; NVRTC straight to a cubin, once per define set and target. Such files
    include no headers of the CUDA toolkit."""
    with checked(file):
        module = _arch_module(file, defines, arch, cupy_module().cuda.runtime.getDevice())
        return {name: ArchKernel(module.get_function(name), name) for name in names}


def launch_kernel(kernel: Any, grid: int | tuple[int, ...], block: int, args: tuple[Any, ...], stream: Any,
                  shared_mem: int = 0) -> None:
    """Enqueue one kernel on ``stream`` (``shared_mem``: bytes of dynamic shared memory); a launch the
    driver refuses raises BackendError."""
    grid = grid if isinstance(grid, tuple) else (grid,)
    with checked(kernel.name):
        kernel(grid, (block,), args, stream=stream, shared_mem=shared_mem)


def f32_define(value: float) -> str:
    """A float32 literal for a -D option, exact (hexadecimal) and parenthesised."""
    return f"({float(np.float32(value)).hex()}f)"


def define_flags(**values: int | str) -> tuple[str, ...]:
    return tuple(f"-D{name}={value}" for name, value in values.items())


def slot_defines(prefix: str, names: tuple[str, ...]) -> dict[str, int]:
    return {f"{prefix}_{name.upper()}": i for i, name in enumerate(names)}


def grid_blocks(n: int, block: int) -> int:
    return max(1, -(-n // block))


def batch_grid(blocks: int | tuple[int, int], frames: int) -> tuple[int, int, int]:
    """The grid of a launch over ``frames`` frames of a batch: ``blocks`` (x, or (x, y)) for each frame,
    the frame as blockIdx.z (``frame_part`` in ``cuda/common.cuh``)."""
    x, y = blocks if isinstance(blocks, tuple) else (blocks, 1)
    return x, y, frames


def shared_blocks(blocks: int, frames: int) -> int:
    """Blocks a frame of a grid-stride kernel whose grid of ``blocks``, sized for the GPU, the batch's
    ``frames`` share: a batch fills the GPU as one frame does, rather than ``frames`` times over."""
    return max(1, -(-blocks // frames))


def check_frames(arr: Any, name: str, frames: int) -> None:
    """A batch buffer (frames first) holds at least ``frames`` frames."""
    if not 1 <= frames <= arr.shape[0]:
        raise InputError(f"{name}: {frames} frames asked of a buffer of {arr.shape[0]}")


def multiprocessors() -> int:
    """SMs of the current device: the cap of grids whose blocks stride over their work (read when a
    stage is built, not per launch)."""
    return int(cupy_module().cuda.Device().attributes["MultiProcessorCount"])


def check_device_array(arr: Any, name: str, dtype: Any, shape: tuple[int | None, ...]) -> None:
    """Check a device buffer without touching its data: CuPy array, dtype, shape, C order."""
    cp = cupy_module()
    if not isinstance(arr, cp.ndarray):
        raise InputError(f"{name}: expected a CuPy device array, received {type(arr).__name__}")
    ok_shape = arr.ndim == len(shape) and all(want is None or got == want for got, want in zip(arr.shape, shape))
    if arr.dtype != dtype or not ok_shape or not arr.flags.c_contiguous:
        want = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"
        raise InputError(
            f"{name}: received {arr.dtype} array of shape {arr.shape}"
            f"{'' if arr.flags.c_contiguous else ' (not C-contiguous)'}; expected C-contiguous "
            f"{np.dtype(dtype).name} of shape {want}"
        )


def check_frame_counts(arr: Any, name: str, frames: int) -> None:
    """Per-frame device counters: an int32 (frames, k) array, a row a frame, k >= 1 (the voxelizer's
    ``stats``, its first column a frame's pillar count), with at least ``frames`` rows."""
    check_device_array(arr, name, np.int32, (None, None))
    if arr.shape[1] < 1:
        raise InputError(f"{name}: expected at least one count a frame, received shape {arr.shape}")
    check_frames(arr, name, frames)
