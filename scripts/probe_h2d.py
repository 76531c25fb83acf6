#!/usr/bin/env python3
"""Ways to bring a frame's points from a NumPy array to the device, timed host to host (the copy and a
stream synchronisation): through pinned staging (a host copy, then the H2D copy), straight from the
pageable array (the driver stages it while the DMA runs), through write-combined pinned staging, with
the array page-locked in place around the copy, through pinned staging filled by T threads in T chunks, each chunk's H2D copy issued as soon as
it is in (the host copies overlap each other and the DMA), and straight from the pageable array in two
halves, one copied by the caller and one by a helper thread on a second stream. Prints medians of 300;
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    print("| points | MB | pinned staging copy + H2D | pageable H2D | write-combined staging + H2D | page-locked in place + H2D | "
          + " | ".join(f"{t} threads, chunked" for t in threads) + " | pageable halves, caller and a helper thread |"
          + "\n| ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (len(threads) + 1))
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

        ways: list[Callable[[], None]] = [staged, lambda: h2d(array.ctypes.data), lambda: staged(write_combined), registered]
        ways += [lambda t=t: chunked(pools[t], t) for t in threads]
        ways.append(split_pageable)
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
