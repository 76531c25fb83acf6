"""How many pipelines an ``infer`` run opens and how many frames each runs at once, and how many workers an ``infer
--ray`` run starts, fitted to the frames it runs.

Each pipeline is a detector opened for its batch (on the GPU its engines warmed and its CUDA graphs captured at that
batch, its buffers sized for it): a run of fewer frames than its pipelines' batches would pay for all of them, and a
Ray run of fewer calls than its workers for every worker's pipelines.
"""

from __future__ import annotations

import dataclasses

from ..errors import agree, counted


#: Frames a GPU pipeline runs at once, and GPU pipelines (each its own stream and thread), unless given; a run of
#: fewer frames opens fewer (``RunSize.fitted``). On the CPU a run opens one pipeline of one frame unless given.
DEFAULT_GPU_BATCH = 8
DEFAULT_GPU_PIPELINES = 4


@dataclasses.dataclass(frozen=True)
class RunSize:
    """A run's pipelines and the frames each runs at once (its batch)."""

    batch: int
    pipelines: int

    @classmethod
    def given(cls, batch: int | None, pipelines: int | None, on_gpu: bool) -> RunSize:
        """The size a run asks for: what was given (None: not given), else the defaults of its device."""
        return cls(batch or (DEFAULT_GPU_BATCH if on_gpu else 1), pipelines or (DEFAULT_GPU_PIPELINES if on_gpu else 1))

    def fitted(self, frames: int) -> RunSize:
        """This size for a run of ``frames`` frames: a batch no larger than them and no more pipelines than their
        batches keep busy. A run of none (the model opened for --eval of skipped frames' outputs, or for --out's
        settings record) opens one pipeline at batch 1."""
        batch = max(1, min(self.batch, frames))
        return RunSize(batch, max(1, min(self.pipelines, -(-frames // batch))))


@dataclasses.dataclass(frozen=True)
class WorkerCalls:
    """A Ray run's workers (each a process that opens and warms its own pipelines) and the frames a call of one
    takes: a worker is handed whole calls, so one beyond a run's calls would start for nothing."""

    workers: int
    per_call: int

    def fitted(self, frames: int) -> WorkerCalls:
        """These workers for a run of ``frames`` frames: no more than their calls. A run of none starts one."""
        return WorkerCalls(max(1, min(self.workers, -(-frames // self.per_call))), self.per_call)


#: How the command line names the batch, the pipelines and a Ray run's workers, each followed by its value
#: (``--batch-size 8``).
OPTION_NAMES = ("--batch-size ", "--pipelines ", "--workers ")


def cut_note(given_batch: int | None, given_pipelines: int | None, fitted: RunSize, frames: int,
             named: tuple[str, ...] = OPTION_NAMES, given_workers: int | None = None,
             calls: WorkerCalls | None = None) -> str | None:
    """What a run of ``frames`` frames says of a ``--batch-size``, ``--pipelines`` or (a Ray run's, with its fitted
    ``calls``) ``--workers`` given (None: not given) that ``fitted`` or ``calls`` cuts; None when it cuts none (a
    default cut is not said: it was no promise). ``named``: how the caller gave the three (the Python API's
    ``batch_size=``, ``pipelines=``, ``workers=``)."""
    sizes = [(given_batch, fitted.batch), (given_pipelines, fitted.pipelines)]
    if calls is not None:
        sizes.append((given_workers, calls.workers))
    cut = [index for index, (given, used) in enumerate(sizes) if given is not None and used < given]
    if not cut:
        return None
    cuts = " and ".join(f"{named[index]}{sizes[index][0]} cut to {sizes[index][1]}" for index in cut)
    if not frames:
        return f"{cuts}: no frame is left to run"
    made = []
    if cut[0] < 2:  # the batch or the pipelines
        made.append(_parts(frames, fitted.batch, "batch", "batches"))
    if calls is not None and cut[-1] == 2:  # the workers
        made.append(_parts(frames, calls.per_call, "worker call"))
    return (f"{cuts}: the {counted(frames, 'frame')} to run {agree(frames, 'makes', 'make')} "
            f"{' and '.join(made)} (more would only cost start time and memory)")


def _parts(frames: int, each: int, noun: str, plural: str = "") -> str:
    """``frames`` frames cut into parts of ``each`` (batches, calls), said: "2 batches of at most 3"."""
    count, size = -(-frames // each), min(each, frames)
    return f"{counted(count, noun, plural)} of {size if frames % size == 0 else f'at most {size}'}"
