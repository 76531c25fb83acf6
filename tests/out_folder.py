"""What a test reads of an ``infer --out`` folder: its outputs, without the run's settings record."""

from __future__ import annotations

import os
from pathlib import Path

from pointpillars_trt.apps.run_settings import SETTINGS_FILE


def output_names(folder: Path) -> list[str]:
    """The sorted names in ``folder`` less infer's settings record (temp files and strays stay listed)."""
    return sorted(name for name in os.listdir(folder) if name != SETTINGS_FILE)


def output_paths(folder: Path) -> list[Path]:
    """``output_names`` as paths."""
    return [folder / name for name in output_names(folder)]
