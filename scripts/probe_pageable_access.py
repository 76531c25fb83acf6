#!/usr/bin/env python3
"""A frame's points pulled by a kernel straight from the caller's pageable NumPy array, where the device can
read pageable host memory (``cudaDevAttrPageableMemoryAccess``: HMM on x86, hardware coherence on Grace),
against the two ways ``detect`` brings them today: a host copy into pinned staging then the H2D copy, and
the H2D copy from the pageable array (the driver stages it). Each round first writes the frame into the
array as a reader would (``produce``), so pages the GPU moved to its memory come back in that step and are
counted; the table gives medians of ``produce`` + bring + a stream synchronisation, and of the bring alone.
Needs CuPy and a GPU. Not a test: numbers depend on the machine.

    python scripts/probe_pageable_access.py [--points 19000,121000] [--rounds 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

_PULL = r"""
extern "C" __global__ void pull(const float4* __restrict__ source, float4* __restrict__ target, long long count) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x)
        target[i] = source[i];
}
"""
_PAGEABLE_MEMORY_ACCESS = 88  # cudaDevAttrPageableMemoryAccess
_USES_HOST_PAGE_TABLES = 100  # cudaDevAttrPageableMemoryAccessUsesHostPageTables
_CONCURRENT_MANAGED_ACCESS = 89  # cudaDevAttrConcurrentManagedAccess


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="19000,121000")
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    import cupy as cp
    import cupyx

    rt = cp.cuda.runtime
    device_id = cp.cuda.Device().id
    attributes = {name: rt.deviceGetAttribute(code, device_id) for name, code in (
        ("pageable memory access", _PAGEABLE_MEMORY_ACCESS), ("through the host's page tables", _USES_HOST_PAGE_TABLES),
        ("concurrent managed access", _CONCURRENT_MANAGED_ACCESS))}
    print("device:", rt.getDeviceProperties(device_id)["name"].decode(), "driver", rt.driverGetVersion(),
          "|", ", ".join(f"{name} {value}" for name, value in attributes.items()))
    pageable_access = bool(attributes["pageable memory access"])
    stream = cp.cuda.Stream(non_blocking=True)
    pull = cp.RawKernel(_PULL, "pull")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    print("\n| points | MB | way | produce + bring, p50 us | bring, p50 us | bring, min us |\n| ---: | ---: | --- | ---: | ---: | ---: |")
    for n in (int(v) for v in args.points.split(",")):
        frame = np.random.default_rng(0).random((n, 4), dtype=np.float32)
        device = cp.empty((n, 4), np.float32)
        pinned = cupyx.empty_pinned((n, 4), np.float32)

        def staged(array: np.ndarray) -> None:
            np.copyto(pinned, array)
            rt.memcpyAsync(device.data.ptr, pinned.ctypes.data, array.nbytes, rt.memcpyHostToDevice, stream.ptr)

        def pageable(array: np.ndarray) -> None:
            rt.memcpyAsync(device.data.ptr, array.ctypes.data, array.nbytes, rt.memcpyHostToDevice, stream.ptr)

        def pulled(array: np.ndarray) -> None:
            with stream:
                pull((2 * sms,), (512,), (np.uint64(array.ctypes.data), device, np.int64(n)))

        ways: list[tuple[str, Callable[[np.ndarray], None], bool]] = [
            ("pinned staging + H2D, a fresh array each round", staged, True),
            ("pageable H2D, a fresh array each round", pageable, True),
        ]
        if pageable_access:
            ways += [("kernel reads the pageable array, a fresh array each round", pulled, True),
                     ("kernel reads the pageable array, one array rewritten each round", pulled, False)]
        for title, bring, fresh in ways:
            kept = np.empty_like(frame)
            totals, brings = [], []
            for round_ in range(args.rounds + 20):
                start = time.perf_counter()
                if fresh:
                    array = frame.copy()
                else:
                    np.copyto(kept, frame)
                    array = kept
                middle = time.perf_counter()
                bring(array)
                stream.synchronize()
                end = time.perf_counter()
                if round_ >= 20:
                    totals.append(end - start)
                    brings.append(end - middle)
                del array
            if not bool((device == cp.asarray(frame)).all()):
                raise SystemExit(f"error: {title}: the device rows differ from the frame")
            print(f"| {n:,} | {frame.nbytes / 1e6:.2f} | {title} | {statistics.median(totals) * 1e6:.0f} | "
                  f"{statistics.median(brings) * 1e6:.0f} | {min(brings) * 1e6:.0f} |")
    if not pageable_access:
        print("\nThis device cannot read pageable host memory (no HMM): the kernel's rows are left out.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
