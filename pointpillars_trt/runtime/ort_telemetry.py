"""ONNX Runtime's telemetry where its device ID cannot be kept: off, so that no warning of it reaches the output.

ONNX Runtime's official builds (1DS telemetry) keep a device ID in the user's cache folder, made as the module
is imported. Where that folder cannot be made or written (a read-only home, as containers and service accounts
have), the import prints a coloured ``Failed to persist telemetry device ID; using an in-memory identifier``
line of its own, stamped with its source file, into every command's output. ``quiet_telemetry`` sets
``ORT_DISABLE_TELEMETRY=1`` (the variable ONNX Runtime documents for turning its telemetry off) before the
import in that case alone, and never where the user set that variable either way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from ..file_writes import xdg_cache_home

#: ONNX Runtime's own switch: read once, as the module is imported.
DISABLE_VARIABLE = "ORT_DISABLE_TELEMETRY"
#: Where ONNX Runtime keeps its device ID, below the user's cache folder.
DEVICE_ID_FOLDER = Path("Microsoft", "DeveloperTools", ".onnxruntime")


def device_id_folder(environ: MutableMapping[str, str]) -> Path:
    """The folder ONNX Runtime keeps its device ID in: below ``$XDG_CACHE_HOME`` when that is an absolute
    path, else below ``~/.cache`` (``$HOME``, else the account's home)."""
    cache = xdg_cache_home(environ) or Path(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return cache / DEVICE_ID_FOLDER


def can_be_made(folder: Path) -> bool:
    """True when ``folder`` is a folder this process can write, or the nearest of its parents that exists is."""
    for place in (folder, *folder.parents):
        if os.path.lexists(place):
            return place.is_dir() and os.access(place, os.W_OK | os.X_OK)
    return False


def warns_here(environ: MutableMapping[str, str]) -> bool:
    """True where ONNX Runtime's import would warn: its device ID folder cannot be made, and the user has not
    set ``ORT_DISABLE_TELEMETRY`` (either way)."""
    return DISABLE_VARIABLE not in environ and not can_be_made(device_id_folder(environ))


def quiet_telemetry(environ: MutableMapping[str, str] = os.environ) -> None:
    """Turn ONNX Runtime's telemetry off for this process (and the processes it starts) where its import would
    warn; call it before ``import onnxruntime`` (once imported, ONNX Runtime has read the variable and warned)."""
    if "onnxruntime" not in sys.modules and warns_here(environ):
        environ[DISABLE_VARIABLE] = "1"
