#!/usr/bin/env python3
"""Ways to bring a frame's points from a NumPy array to the device, timed host to host (the copy and a
stream synchronisation): through pinned staging (a host copy, then the H2D copy), straight from the
pageable array (the driver stages it while the DMA runs), through write-combined pinned staging, with
the array page-locked in place around the copy, through pinned staging filled by T threads in T chunks, each chunk's H2D copy issued as soon as
it is in (the host copies overlap each other and the DMA), and straight from the pageable array in two
halves, one copied by the caller and one by a helper thread on a second stream, and through the driver's
batched copy (``cuMemcpyBatchAsync``, CUDA 12.8+) from the pageable array in 1 or 4 parts, its source
read "during the call" or "in any order" (which lets the driver "optimize the copy on certain
platforms"). Prints medians of 300;
needs CuPy and a GPU. Not a test: numbers depend on the machine.

    python scripts/probe_h2d.py [--points 19000,121000] [--threads 2,4,8]

glibc's memcpy (NumPy's copies) switches to streaming stores above a size threshold; to see what they
would give, run it with GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x10000.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _CopyAttributes(ctypes.Structure):
    _fields_ = [("src_access_order", ctypes.c_int), ("src_hint", _Location), ("dst_hint", _Location),
                ("flags", ctypes.c_uint)]


_DURING_API_CALL, _ANY = 2, 3  # CU_MEMCPY_SRC_ACCESS_ORDER_*
_PREFER_OVERLAP = 0x1  # CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE


def _batch_copy() -> Callable[..., int] | None:
    """``cuMemcpyBatchAsync`` as (dsts, srcs, sizes, count, attrs, attr_starts, n_attrs, stream), or None."""
    driver = ctypes.CDLL("libcuda.so.1")
    sizes = ctypes.POINTER(ctypes.c_size_t)
    pointers = ctypes.POINTER(ctypes.c_uint64)
    if hasattr(driver, "cuMemcpyBatchAsync_v2"):  # CUDA 13: no failIdx
        call = driver.cuMemcpyBatchAsync_v2
        call.argtypes = (pointers, pointers, sizes, ctypes.c_size_t, ctypes.POINTER(_CopyAttributes), sizes,
                         ctypes.c_size_t, ctypes.c_void_p)
        call.restype = ctypes.c_int
        return call
    if hasattr(driver, "cuMemcpyBatchAsync"):  # CUDA 12.8-12.9: a failIdx before the stream
        legacy = driver.cuMemcpyBatchAsync
        legacy.argtypes = (pointers, pointers, sizes, ctypes.c_size_t, ctypes.POINTER(_CopyAttributes), sizes,
                           ctypes.c_size_t, sizes, ctypes.c_void_p)
        legacy.restype = ctypes.c_int
        failed = ctypes.c_size_t(0)
        return lambda *a: legacy(*a[:7], ctypes.byref(failed), a[7])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="19000,121000")
    ap.add_argument("--threads", default="2,4,8")
    args = ap.parse_args()
    import cupy as cp
    import cupyx

    rt = cp.cuda.runtime
    stream = cp.cuda.Stream(non_blocking=True)
    threads = [int(v) for v in args.threads.split(",")]
    pools = {t: ThreadPoolExecutor(t) for t in threads}
    helper, side = ThreadPoolExecutor(1), cp.cuda.Stream(non_blocking=True)
    batch_copy = _batch_copy()
    batch_ways = [(1, _DURING_API_CALL, 0), (1, _ANY, 0), (4, _ANY, 0), (1, _ANY, _PREFER_OVERLAP)]
    batch_titles = ["batched, 1 part, during the call", "batched, 1 part, any order", "batched, 4 parts, any order",
                    "batched, 1 part, any order, prefer overlap"] if batch_copy is not None else []
    print("| points | MB | pinned staging copy + H2D | pageable H2D | write-combined staging + H2D | page-locked in place + H2D | "
          + " | ".join(f"{t} threads, chunked" for t in threads) + " | pageable halves, caller and a helper thread |"
          + "".join(f" {title} |" for title in batch_titles)
          + "\n| ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (len(threads) + 1 + len(batch_titles)))
    for n in (int(v) for v in args.points.split(",")):
        array = np.random.default_rng(0).random((n, 4), dtype=np.float32)
        device = cp.empty((n, 4), np.float32)
        pinned = cupyx.empty_pinned((n, 4), np.float32)
        write_combined_ptr = rt.hostAlloc(array.nbytes, 4)  # cudaHostAllocWriteCombined, kept to the process's end
        write_combined = np.ctypeslib.as_array((ctypes.c_float * (n * 4)).from_address(write_combined_ptr)).reshape(n, 4)

        def h2d(source: int) -> None:
            rt.memcpyAsync(device.data.ptr, source, array.nbytes, rt.memcpyHostToDevice, stream.ptr)
            stream.synchronize()

        def staged(buffer: np.ndarray = pinned) -> None:
            np.copyto(buffer, array)
            h2d(buffer.ctypes.data)

        def registered() -> None:
            rt.hostRegister(array.ctypes.data, array.nbytes, 0)
            h2d(array.ctypes.data)
            rt.hostUnregister(array.ctypes.data)

        def chunked(pool: ThreadPoolExecutor, parts: int) -> None:
            bounds = np.linspace(0, n, parts + 1).astype(int).tolist()
            copies = [pool.submit(np.copyto, pinned[a:b], array[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
            row = array.strides[0]
            for copy, a, b in zip(copies, bounds[:-1], bounds[1:]):
                copy.result()
                rt.memcpyAsync(device.data.ptr + a * row, pinned.ctypes.data + a * row, (b - a) * row,
                               rt.memcpyHostToDevice, stream.ptr)
            stream.synchronize()

        def split_pageable() -> None:
            half = n // 2 * array.strides[0]
            helped = helper.submit(rt.memcpyAsync, device.data.ptr + half, array.ctypes.data + half, array.nbytes - half,
                                   rt.memcpyHostToDevice, side.ptr)
            rt.memcpyAsync(device.data.ptr, array.ctypes.data, half, rt.memcpyHostToDevice, stream.ptr)
            helped.result()
            joined = cp.cuda.Event(disable_timing=True)
            joined.record(side)
            stream.wait_event(joined)
            stream.synchronize()

        def batched(parts: int, order: int, flags: int) -> None:
            assert batch_copy is not None
            bounds = np.linspace(0, n, parts + 1).astype(int).tolist()
            row = array.strides[0]
            dsts = (ctypes.c_uint64 * parts)(*[device.data.ptr + a * row for a in bounds[:-1]])
            srcs = (ctypes.c_uint64 * parts)(*[array.ctypes.data + a * row for a in bounds[:-1]])
            lengths = (ctypes.c_size_t * parts)(*[(b - a) * row for a, b in zip(bounds[:-1], bounds[1:])])
            attributes = _CopyAttributes(order, _Location(), _Location(), flags)
            starts = (ctypes.c_size_t * 1)(0)
            status = batch_copy(dsts, srcs, lengths, parts, ctypes.byref(attributes), starts, 1, stream.ptr)
            if status != 0:
                raise SystemExit(f"error: cuMemcpyBatchAsync failed with CUDA driver error {status}")
            stream.synchronize()

        ways: list[Callable[[], None]] = [staged, lambda: h2d(array.ctypes.data), lambda: staged(write_combined), registered]
        ways += [lambda t=t: chunked(pools[t], t) for t in threads]
        ways.append(split_pageable)
        if batch_copy is not None:
            ways += [lambda p=p, o=o, f=f: batched(p, o, f) for p, o, f in batch_ways]
        cells = []
        for way in ways:
            device.fill(0)
            for _ in range(20):
                way()
            if not bool((device == cp.asarray(array)).all()):
                raise SystemExit("error: a way of copying left the device rows different from the array")
            times = []
            for _ in range(300):
                start = time.perf_counter()
                way()
                times.append(time.perf_counter() - start)
            cells.append(f"{statistics.median(times) * 1e6:.0f} us")
        print(f"| {n:,} | {array.nbytes / 1e6:.2f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
