"""How many pipelines an ``infer`` run opens and how many frames each runs at once, fitted to the frames it runs.

Each pipeline is a detector opened for its batch (on the GPU its engines warmed and its CUDA graphs captured at that
batch, its buffers sized for it): a run of fewer frames than its pipelines' batches would pay for all of them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RunSize:
    """A run's pipelines and the frames each runs at once (its batch)."""

    batch: int
    pipelines: int

    def fitted(self, frames: int) -> RunSize:
        """This size for a run of ``frames`` frames: a batch no larger than them and no more pipelines than their
        batches keep busy. A run of none (the model opened for --eval of skipped frames' outputs, or for --out's
        settings record) opens one pipeline at batch 1."""
        batch = max(1, min(self.batch, frames))
        return RunSize(batch, max(1, min(self.pipelines, -(-frames // batch))))


#: How the command line names the batch and the pipelines, each followed by its value (``--batch-size 8``).
OPTION_NAMES = ("--batch-size ", "--pipelines ")


def cut_note(given_batch: int | None, given_pipelines: int | None, fitted: RunSize, frames: int,
             named: tuple[str, str] = OPTION_NAMES) -> str | None:
    """What a run of ``frames`` frames says of a ``--batch-size`` or ``--pipelines`` given (None: not given) that
    ``fitted`` cuts; None when it cuts neither (a default cut is not said: it was no promise). ``named``: how the
    caller gave the two (the Python API's ``batch_size=``, ``pipelines=``)."""
    cuts = [f"{option}{given} cut to {used}" for option, given, used in
            ((named[0], given_batch, fitted.batch), (named[1], given_pipelines, fitted.pipelines))
            if given is not None and used < given]
    if not cuts:
        return None
    if not frames:
        return f"{' and '.join(cuts)}: no frame is left to run"
    batches = -(-frames // fitted.batch)
    size = f"{fitted.batch}" if frames % fitted.batch == 0 else f"at most {fitted.batch}"
    many = frames > 1
    return (f"{' and '.join(cuts)}: the {frames} frame{'s' if many else ''} to run make{'' if many else 's'} "
            f"{batches} batch{'es' if batches > 1 else ''} of {size} (more would only cost start time and memory)")
