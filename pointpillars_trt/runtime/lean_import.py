"""Importing a third-party module without the optional heavy packages its import pulls in.

The cuDNN frontend's ``import cudnn`` imports PyTorch wherever it is installed (for tensor types this
project never hands it: it passes device pointers), which cost every process that opened the engine
seconds before its first frame (a model's first open 5.5 s against 0.4 s without it on an H200 machine):
a CLI run, each Ray worker, a Triton server's start.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Collection, Sequence
from types import ModuleType


class _Hidden(importlib.abc.MetaPathFinder):
    """Refuses ``names`` (and their submodules) to one thread; other threads import them as usual."""

    def __init__(self, names: Collection[str], thread: int, importing: str) -> None:
        self.names, self.thread, self.importing = frozenset(names), thread, importing

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if threading.get_ident() == self.thread and fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"{fullname} is not imported while {self.importing} imports", name=fullname)
        return None


def import_without(module: str, hidden: Collection[str]) -> ModuleType:
    """``importlib.import_module(module)`` with the top-level packages ``hidden`` unimportable by this thread
    while it runs: the module's own ``try: import torch / except ImportError`` then takes its fallback. A
    package the process has imported already is left alone (the module sees it as usual), and so is a module
    imported before; ImportError and the module's own errors come through as they are."""
    if module in sys.modules:
        return sys.modules[module]
    finder = _Hidden([name for name in hidden if name not in sys.modules], threading.get_ident(), module)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(module)
    finally:
        sys.meta_path.remove(finder)
