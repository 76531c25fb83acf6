"""Pipelines sharing a GPU with CUDA graph node priorities: the RPN's stream above the per-frame branches.

    python3 scripts/probe_graph_priority.py --model CKPT --frames DIR [--pipelines 4] [--batch 8] [--rounds 3]

A batch's graph is captured from the pipeline's stream (the RPN, the joins) and its side streams (each
frame's voxelize, PFN, scatter and post-process). Captured nodes keep their stream's priority, and a
graph instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY runs each node at it, so the block
scheduler can prefer the convolutions' blocks over the small kernels' (or the reverse). Three sets of
pipelines, "default", "rpn high" and "branches high", run in turns for ``--rounds`` rounds; prints
whether each set's boxes equal the default's, then the frames/s of every round. The cuDNN engine only
(it takes the stream at each run; ONNX Runtime's is bound to the one it opened on); the graphs live as
long as the process.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import cupy as cp
import numpy as np

import pointpillars_trt.gpu_pipeline as gpu_pipeline
from profile_throughput import fp16_model_and_batches, run_all, throughput_options  # this folder's

USE_NODE_PRIORITY = 8  # CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY


def driver() -> Any:
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuGraphInstantiateWithFlags.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong)
    cu.cuGraphLaunch.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    return cu


class NodePriorityGraph:
    """An executable graph run at its nodes' own priorities (the pipeline calls ``launch(stream)``)."""

    def __init__(self, cu: Any, handle: int) -> None:
        self.cu, self.handle = cu, handle

    def launch(self, stream: Any) -> None:
        status = self.cu.cuGraphLaunch(self.handle, stream.ptr)
        if status:
            raise RuntimeError(f"cuGraphLaunch: CUDA driver error {status}")


def node_priority_capture(cu: Any) -> Callable[..., tuple[object | None, str | None]]:
    """A replacement of the pipeline's ``_captured`` that instantiates with node priorities."""
    def captured(self: gpu_pipeline.GpuPipeline, run: Callable[[bool], None]) -> tuple[object | None, str | None]:
        rt = cp.cuda.runtime
        with gpu_pipeline._CAPTURE_LOCK:
            run(False)
            self.stream.synchronize()
            rt.streamBeginCapture(self.stream.ptr, rt.streamCaptureModeRelaxed)
            try:
                run(True)
            finally:
                graph = rt.streamEndCapture(self.stream.ptr)
            handle = ctypes.c_void_p()
            status = cu.cuGraphInstantiateWithFlags(ctypes.byref(handle), ctypes.c_void_p(graph), USE_NODE_PRIORITY)
            if status or handle.value is None:
                raise RuntimeError(f"cuGraphInstantiateWithFlags: CUDA driver error {status}")
        return NodePriorityGraph(cu, handle.value), None

    return captured


def main() -> None:
    parser = throughput_options(calls=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cu = driver()
    cp.cuda.Device(0).use()
    least, greatest = ctypes.c_int(), ctypes.c_int()
    cp.zeros(1)  # a context, for the priority range
    if cu.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)):
        raise RuntimeError("cuCtxGetStreamPriorityRange failed")
    model, groups = fp16_model_and_batches(args)
    b = args.batch
    captured = node_priority_capture(cu)

    def make(variant: str) -> gpu_pipeline.GpuPipeline:
        pipe = gpu_pipeline.GpuPipeline(model, max_batch=b)
        if variant != "default":  # before the first batch: the graphs are captured then
            pipe.stream.synchronize()  # the set-up's work on the stream replaced below
            main_priority, branch_priority = (
                (greatest.value, least.value) if variant == "rpn high" else (least.value, greatest.value))
            pipe.stream = cp.cuda.Stream(non_blocking=True, priority=main_priority)
            for branch in pipe._branches:
                branch.stream = cp.cuda.Stream(non_blocking=True, priority=branch_priority)
            pipe._captured = captured.__get__(pipe)  # type: ignore[method-assign]
        return pipe

    def rate(pipes: list[gpu_pipeline.GpuPipeline], calls: int) -> float:
        return len(pipes) * b * calls / run_all(pipes, groups, calls)

    variants = ("default", "rpn high", "branches high")
    sets = {v: [make(v) for _ in range(args.pipelines)] for v in variants}
    reference = sets["default"][0].detect_batch(groups[0])
    for variant, pipes in sets.items():
        got = pipes[0].detect_batch(groups[0])
        same = all(np.array_equal(a.boxes, g.boxes) and np.array_equal(a.scores, g.scores)
                   for a, g in zip(reference, got))
        rate(pipes, 10)  # every pipeline's graphs captured
        print(f"{variant}: boxes equal the default's: {same}")
    rounds: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):  # in turns, so that a drift of the machine touches every set alike
        for variant, pipes in sets.items():
            rounds[variant].append(rate(pipes, args.calls))
    print(f"\n| priorities ({args.pipelines} x {b}) | frames/s, round by round |\n| --- | --- |")
    for variant, values in rounds.items():
        print(f"| {variant} | {' / '.join(f'{v:,.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
