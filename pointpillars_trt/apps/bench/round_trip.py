"""The benchmark's "before" baseline: the same GPU stages, but every stage's outputs go to host memory
and back with a synchronisation, as a naive multi-library pipeline would. Not a production mode, so it
lives here and not in the pipeline."""

from __future__ import annotations

from collections.abc import Callable

from ...gpu_pipeline import GpuPipeline
from ...model_dir import ModelDir


class HostRoundTripPipeline(GpuPipeline):
    """``GpuPipeline`` with eager launches and a blocking host round trip after every stage."""

    def __init__(self, model: ModelDir, **kwargs: object) -> None:
        super().__init__(model, cuda_graph=False, **kwargs)  # type: ignore[arg-type]

    def _run_stage(self, index: int, batch: int, launch: Callable[[int], None]) -> None:
        launch(batch)
        for arr in self.stage_outputs(index, batch):
            host = arr.get(stream=self.stream)  # blocking: the naive pipeline waits for every copy
            self.copies.d2h(arr.nbytes)
            arr.set(host, stream=self.stream)
            self.copies.h2d(arr.nbytes)
        self._events[index + 1].record(self.stream)
