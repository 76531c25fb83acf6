"""One run of a frame runner kept going across groups of frames (a Ray actor's calls).

A caller that gets its frames a group at a time (a Ray actor, a block of a few hundred frames a call)
and starts a ``FrameRunner.run`` per group pays for every group twice: the pipelines drain at its end
and its readers refill them at the next one's start, while the actor waits for Ray to hand it the next
block. ``FrameStream`` keeps one run going for the caller's life instead, fed from a queue: groups,
handed in from one thread or several at once (an actor taking two calls at a time), go into the
run back to back, and each caller gets its own group's jobs, in order, while the next group is already
being read and detected.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import counted
from .frames import BATCH_BREAK, FrameJob, FrameRunner


class FrameStream:
    """``runner``'s one run, fed group by group by ``run``; ``close`` ends it."""

    def __init__(self, runner: FrameRunner) -> None:
        self._feed: queue.SimpleQueue[Any] = queue.SimpleQueue()  # (item, source), BATCH_BREAK or None (the end)
        self._names: deque[str] = deque()  # the sources of the items handed to the run, in step with them
        self._groups: deque[list[Any]] = deque()  # [frames still to come, the queue its jobs go to], in feed order
        self._lock = threading.Lock()  # a group's items and its place in _groups go in together
        self._failure: BaseException | None = None  # why the run ended, once it has
        self._thread = threading.Thread(target=self._deliver, args=(runner,), name="pp-stream", daemon=True)
        self._thread.start()

    def run(self, items: Sequence[object], sources: Sequence[str]) -> Iterator[FrameJob]:
        """The jobs of one group of frames (``sources`` names them, one each), in order (as
        ``FrameRunner.run`` yields them); safe to call from several threads at once."""
        if len(items) != len(sources):
            raise ValueError(f"{counted(len(items), 'frame')} and {counted(len(sources), 'name')}: expected a name "
                             "a frame")
        if any(item is BATCH_BREAK for item in items):
            raise ValueError("BATCH_BREAK among the frames: the stream puts it after each group itself")
        if not items:
            return
        jobs: queue.SimpleQueue[FrameJob | BaseException] = queue.SimpleQueue()
        with self._lock:
            if self._failure is not None:
                raise RuntimeError(f"the frame stream has ended ({self._failure})") from self._failure
            self._groups.append([len(items), jobs])
            for entry in zip(items, sources):
                self._feed.put(entry)
            self._feed.put(BATCH_BREAK)  # the group's last frames go at once, not with the next group's
        for _ in range(len(items)):
            job = jobs.get()
            if isinstance(job, BaseException):
                raise RuntimeError(f"the frame stream has ended ({job})") from job
            yield job

    def close(self) -> None:
        """End the run once the groups handed in are done."""
        with self._lock:  # after a group being handed in, never inside it
            self._feed.put(None)
        self._thread.join(timeout=60)

    def _items(self) -> Iterator[object]:
        while (entry := self._feed.get()) is not None:
            if entry is BATCH_BREAK:
                yield entry
                continue
            item, source = entry
            self._names.append(source)  # taken by the run right after it takes the item
            yield item

    def _sources(self) -> Iterator[str]:
        while True:
            yield self._names.popleft()

    def _deliver(self, runner: FrameRunner) -> None:
        """The run: each job to the group it belongs to. When the run ends, every group still waiting
        hears why (a closed stream, or the run's error)."""
        failure: BaseException = RuntimeError("the frame stream was closed")
        try:
            for job in runner.run(self._items(), self._sources()):
                with self._lock:
                    group = self._groups[0]
                    group[0] -= 1
                    if not group[0]:
                        self._groups.popleft()
                group[1].put(job)
        except BaseException as exc:  # noqa: BLE001 - handed to the callers waiting, never lost in this thread
            failure = exc
        with self._lock:
            self._failure = failure
            for _, jobs in self._groups:
                jobs.put(failure)
            self._groups.clear()
