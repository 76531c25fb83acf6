"""File I/O every part shares: the one atomic writer (temp file, fsync, rename) and strict JSON."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Union

import numpy as np

PathLike = Union[str, "os.PathLike[str]"]


def write_bytes_atomic(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part.

    A temp file in the same folder (so os.replace is a rename on one file system) is written,
    flushed and fsynced, then renamed over the target. It is created with mode 0o666 minus the
    umask, like a plain open() would, rather than mkstemp's 0o600.
    """
    target = Path(os.fspath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: PathLike, text: str) -> None:
    """Atomic UTF-8 text write (see write_bytes_atomic)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    """Let NumPy scalars and arrays through json.dumps (timings, counts, boxes)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def write_json_atomic(path: PathLike, obj: Any) -> None:
    """Atomic JSON write, indented, NumPy values converted to plain numbers."""
    write_text_atomic(path, json.dumps(obj, indent=2, default=_json_default) + "\n")
