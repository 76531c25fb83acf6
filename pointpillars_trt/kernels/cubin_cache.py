"""Architecture-specific kernels kept compiled on disk, so that a process's start does not run NVRTC.

CuPy caches the modules it compiles itself (``~/.cupy/kernel_cache``); the ``sm_90a`` modules go
straight through NVRTC (CuPy's compile path does not name such targets) and would otherwise be
compiled again by every process that opens an engine: about a second each on an H200's host. The
cubins live in the user cache (``$POINTPILLARS_TRT_CACHE/kernels``), named by a hash of everything
that shapes them (source, options, target, compiler version); a file that does not load is compiled
again and replaced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import BackendError, InputError
from ..fileio import read_regular_file, user_cache_dir, write_bytes_atomic

#: Largest cubin read back: the package's modules are tens to hundreds of kilobytes.
MAX_CUBIN_BYTES = 64 * 2**20

Module = TypeVar("Module")


def cubin_path(name: str, identity: str) -> Path:
    """Where the cubin of ``name`` (a source file's stem and its target) compiled as ``identity`` lives."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return user_cache_dir() / "kernels" / f"{name}-{digest}.cubin"


def cached_module(name: str, identity: str, compile_cubin: Callable[[], bytes],
                  load: Callable[[bytes], Module]) -> Module:
    """``load`` of the cached cubin, or of a fresh ``compile_cubin()`` (then saved) when there is none or
    it does not load (``load`` raises BackendError). A cache that cannot be written only costs the next
    start its compile, as with the cuDNN plan cache."""
    path = cubin_path(name, identity)
    try:
        cached: bytes | None = read_regular_file(path, max_bytes=MAX_CUBIN_BYTES, what="kernel cache")
    except InputError:
        cached = None
    if cached:
        try:
            return load(cached)
        except BackendError:
            pass  # damaged or from another driver: compiled again and replaced below
    cubin = compile_cubin()
    module = load(cubin)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, cubin, durable=False)
    except OSError:
        pass
    return module
