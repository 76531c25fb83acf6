"""A count of the ONNX graph files opened for reading and of the bytes hashed, for the tests of how often a model
dir's graphs are read."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest


def count_graph_reads_and_hashes(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    """The names of the .onnx files opened for reading, and the sizes of the data hashed, from here on."""
    opened: list[str] = []
    hashed: list[int] = []
    real_open, real_sha256 = os.open, hashlib.sha256

    def counting_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith(".onnx"):
            opened.append(Path(path).name)
        return real_open(path, flags, *args, **kwargs)

    def counting_sha256(data=b"", **kwargs):  # type: ignore[no-untyped-def]
        hashed.append(len(data))
        return real_sha256(data, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(hashlib, "sha256", counting_sha256)
    return opened, hashed
