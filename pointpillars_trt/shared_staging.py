"""Staging buffers in named shared memory, so that reader processes read point files straight into a
batch's staging while the runner's process, which launches the GPU work, never holds its interpreter
lock for a read.

Reading in threads of the runner's process shares one interpreter lock with the pipelines' launches:
each read takes it back some ten times (open, read, each NumPy check), and while any other thread runs
Python a reader waits up to the switch interval for it. On a 16-core H200 host, full scans read and
checked in 4 / 8 / 16 threads ran 8,010 / 7,460 / 4,438 frames/s alone and 114 / 342 / 777 beside one
thread busy in Python; in 4 / 8 / 16 processes 16,181 / 33,444 / 58,338.

Each array is a file in ``/dev/shm`` (Linux), its blocks reserved up front (``posix_fallocate``: a full
``/dev/shm``, as in a container's default 64 MB, is an error here, never a SIGBUS on a later write),
registered with multiprocessing's resource tracker (removed even when the process is killed), and,
with ``pin``, page-locked in place (``cudaHostRegister``): the H2D copy reads it as it reads CuPy's
pinned memory.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker

import numpy as np

from .staging import StagingBuffer

SHM_DIR = "/dev/shm"
#: cudaHostRegisterPortable: the pages count as page-locked for every GPU's context, not only the current one
#: (a run whose pipelines are on another GPU than the first).
HOST_REGISTER_PORTABLE = 1
_names = itertools.count()


def shared_memory_available() -> bool:
    """Whether named shared memory files can be made here (Linux's ``/dev/shm``)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class SharedArrays:
    """An ``alloc(shape, dtype)`` for :class:`StagingBuffer` whose arrays lie in shared memory files (see the
    module's docstring); ``handle(buffer)`` names a buffer's files for :func:`attach` in another process.
    ``free`` / ``close`` remove the files (their memory goes once no process maps them: here, when the
    arrays that use them are dropped; in a reader process, when ``attach`` next finds them gone)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._files: dict[int, str] = {}  # array address -> file name

    def __call__(self, shape: tuple[int, ...], dtype: type | np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        nbytes = max(count * dtype.itemsize, 1)
        name = f"pp-staging-{os.getpid()}-{next(_names)}-{secrets.token_hex(4)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        registered = pinned = False
        try:  # whatever stops it once the file is there (a full /dev/shm, a failed page-lock, Ctrl-C), it goes
            try:
                resource_tracker.register("/" + name, "shared_memory")
                registered = True
                os.posix_fallocate(fd, 0, nbytes)
                mapping = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
            array = np.frombuffer(mapping, dtype, count).reshape(shape)
            if self.pin:
                import cupy

                cupy.cuda.runtime.hostRegister(array.ctypes.data, nbytes, HOST_REGISTER_PORTABLE)
                pinned = True
            self._files[array.ctypes.data] = name
        except BaseException:
            try:
                if pinned:
                    import cupy

                    cupy.cuda.runtime.hostUnregister(array.ctypes.data)
            finally:
                _remove(name, registered)
            raise
        return array

    def handle(self, buffer: StagingBuffer) -> SharedStagingHandle:
        """What another process needs to :func:`attach` to ``buffer`` (made by this allocator)."""
        times = None if buffer.times is None else self._files[buffer.times.ctypes.data]
        return SharedStagingHandle(self._files[buffer.rows.ctypes.data], times)

    def owns(self, buffer: StagingBuffer) -> bool:
        return buffer.rows.ctypes.data in self._files

    def free(self, buffer: StagingBuffer) -> None:
        """Remove ``buffer``'s files (unpinned first); its arrays stay readable until they are dropped."""
        arrays = [buffer.rows] + ([] if buffer.times is None else [buffer.times])
        for array in arrays:
            self._release(array.ctypes.data)

    def close(self) -> None:
        for address in list(self._files):
            self._release(address)

    def _release(self, address: int) -> None:
        name = self._files.pop(address, None)
        if name is None:
            return
        try:
            if self.pin:
                import cupy

                cupy.cuda.runtime.hostUnregister(address)
        finally:  # the file goes whatever CUDA says (e.g. torn down at exit)
            _remove(name)


def _remove(name: str, registered: bool = True) -> None:
    """Remove the file ``name``, and its entry with the resource tracker when it was ``registered`` (the
    tracker reports a name it never had)."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass
    if registered:
        resource_tracker.unregister("/" + name, "shared_memory")


@dataclass(frozen=True)
class SharedStagingHandle:
    """A shared staging buffer as another process finds it: its files' names (its shape is their sizes')."""

    rows: str
    times: str | None = None


_attached: dict[SharedStagingHandle, StagingBuffer] = {}


def attach(handle: SharedStagingHandle) -> StagingBuffer:
    """The staging buffer ``handle`` names, mapped into this process (once; later calls return it). Buffers the
    runner has removed since (replaced by larger ones) are unmapped here when a new one comes."""
    buffer = _attached.get(handle)
    if buffer is None:
        for gone in [known for known in _attached if not os.path.exists(os.path.join(SHM_DIR, known.rows))]:
            del _attached[gone]
        rows = _mapped(handle.rows, np.float32).reshape(-1, 4)
        times = None if handle.times is None else _mapped(handle.times, np.float32)
        buffer = _attached[handle] = StagingBuffer.over(rows, times)
    return buffer


def _mapped(name: str, dtype: type) -> np.ndarray:
    """A shared memory file's array, its pages mapped at once (``MAP_POPULATE``) rather than a fault at a time
    as a batch's reads first reach them."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    return np.frombuffer(mapping, dtype)
