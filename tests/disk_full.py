"""A file system that fills up as an export writes its RPN graph, for the tests of what a full disk leaves."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest


def fill_up_at_rpn_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the exporter's atomic writes fail with ENOSPC at ``rpn.onnx`` (the files before it are written)."""
    from pointpillars_trt.convert import export

    real_write = export.write_bytes_atomic

    def write_until_full(path, data):  # type: ignore[no-untyped-def]
        if Path(path).name == "rpn.onnx":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, data)

    monkeypatch.setattr(export, "write_bytes_atomic", write_until_full)
