"""Which TensorRT library the ``tensorrt`` backend uses, and which GPUs each library runs plans on.

Two libraries speak the same Python API under different module names:

- TensorRT (``tensorrt``, 10.x or 11.x): every architecture it supports, Hopper and other data-centre
  GPUs included; 11.x is strongly typed only (no ``BuilderFlag.FP16``).
- TensorRT for RTX (``tensorrt_rtx_bindings``, or ``tensorrt_rtx`` as NVIDIA's SDK wheel and the ``tensorrt-rtx``
  package name it; the TensorRT 11 API): RTX workstations and laptops, RTX PRO servers. Its builder is
  ahead-of-time (it builds plans without a GPU, for a list of compute capabilities), and its runtime refuses
  every other GPU, the H200's 9.0 among them.

The backend uses TensorRT when it imports, else TensorRT for RTX (said once), and every plan records
which one built it. The functions here import neither library beyond the probe, so the choice and the
GPU rules are testable on a machine without TensorRT or a GPU.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from typing import Literal

Library = Literal["tensorrt", "tensorrt_rtx"]

#: The Python modules of each library, in the order the backend prefers them. TensorRT for RTX is
#: ``tensorrt_rtx_bindings`` in the ``tensorrt-rtx-cu13-bindings`` wheel (the ``[tensorrt-rtx]`` extra) and
#: ``tensorrt_rtx`` in the wheel of NVIDIA's SDK tarball (the ``tensorrt-rtx`` package has both: the one imports
#: the other).
LIBRARY_MODULES: dict[Library, tuple[str, ...]] = {"tensorrt": ("tensorrt",),
                                                   "tensorrt_rtx": ("tensorrt_rtx_bindings", "tensorrt_rtx")}
LIBRARY_TITLES: dict[Library, str] = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT for RTX"}

#: Compute capabilities TensorRT for RTX runs plans on (NVIDIA's TensorRT-RTX support matrix).
RTX_COMPUTE_CAPABILITIES: tuple[str, ...] = ("7.5", "8.6", "8.9", "12.0", "12.1")
#: What an RTX build targets without a GPU it runs on: the library's own portable set. Turing (7.5) needs a
#: plan built for it alone, as NVIDIA recommends.
RTX_DEFAULT_TARGETS: tuple[str, ...] = ("8.6", "8.9", "12.0")

INSTALL_HINT = ("pip install 'pointpillars-trt[tensorrt]' (TensorRT 10/11, any supported GPU) or "
                "'pointpillars-trt[tensorrt-rtx]' (TensorRT for RTX: compute capability "
                f"{'/'.join(RTX_COMPUTE_CAPABILITIES)})")
REBUILD_HINT = "rebuild with `pointpillars-trt build --backend tensorrt`"


def installed_library() -> Library | None:
    """The library the ``tensorrt`` backend uses here: TensorRT when it imports, else TensorRT for RTX.

    ``tensorrt-stubs`` alone also imports as ``tensorrt``, without a ``Builder``: that is not TensorRT. A
    library that is installed but fails to import is left for :func:`import_failures` to say."""
    return _probe()[0]


def installed_module() -> str | None:
    """The module of ``installed_library()`` that imported (one of its ``LIBRARY_MODULES``)."""
    return _probe()[1]


def import_failures() -> dict[Library, str]:
    """Each installed library (its module is found) tried before the one the backend uses (all, when none
    imports) that failed to import, with its error in one line: "not installed" and its pip hint would send
    the user to reinstall what is there (a missing CUDA runtime, say, stays missing)."""
    return _probe()[2]


@functools.lru_cache(maxsize=None)
def _probe() -> tuple[Library | None, str | None, dict[Library, str]]:
    """(``installed_library``, ``installed_module``, ``import_failures``): the libraries' modules imported in the
    backend's order, none after the first that imports with a ``Builder`` (the other's bindings would load a second
    set of TensorRT and CUDA libraries into the process for nothing). A library fails when none of its modules
    imports: its failure is that of the last one found."""
    failures: dict[Library, str] = {}
    for library, module_names in LIBRARY_MODULES.items():
        for module_name in module_names:
            if importlib.util.find_spec(module_name) is None:
                continue
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001 - whatever the import raised is the one line the user needs
                first_line = (str(exc).strip().splitlines() or [""])[0]
                failures[library] = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
                continue
            if hasattr(module, "Builder"):
                failures.pop(library, None)
                return library, module_name, failures
    return None, None, failures


def import_failure_fix(library: Library, error: str) -> str:
    """What fixes ``library``'s import ``error``: a shared library the loader did not find is put on its path
    (the CUDA runtime named as such), anything else is a broken install to reinstall."""
    missing = re.search(r"(lib[\w.+-]*?\.so(?:\.\d+)*): cannot open shared object file", error)
    if missing is None:
        return f"reinstall it: pip install --force-reinstall 'pointpillars-trt[{library.replace('_', '-')}]'"
    name = missing.group(1)
    cuda = re.fullmatch(r"libcudart\.so\.(\d+)", name)
    needs = f"the CUDA {cuda.group(1)} runtime ({name})" if cuda else name
    return f"it needs {needs}: install it, or add the folder that holds {name} to LD_LIBRARY_PATH"


def unavailable_reason() -> str:
    """Why the ``tensorrt`` backend has no library here, in one line with the fix: the import error of each
    installed library that fails to import, else that none is installed."""
    failures = import_failures()
    if not failures:
        return f"TensorRT is not installed. Note: {INSTALL_HINT}"
    return "; ".join(f"{library_state(library)}. Note: {import_failure_fix(library, error)}"
                     for library, error in failures.items())


def library_state(library: Library) -> str:
    """"X is not installed" or "X is installed but does not import (its error)": what a fallback says of the
    library it could not use."""
    error = import_failures().get(library)
    title = LIBRARY_TITLES[library]
    return f"{title} is not installed" if error is None else f"{title} is installed but does not import ({error})"


def library_version() -> str:
    """The version of the library the backend uses (``installed_library``: its module that imported), as its plans
    record it."""
    return str(importlib.import_module(str(installed_module())).__version__)


def api_major(library: Library, version: str) -> int:
    """The TensorRT API generation a library version speaks: TensorRT for RTX speaks the 11 API."""
    return 11 if library == "tensorrt_rtx" else int(version.split(".")[0])


def library_unsupported_reason(library: Library, compute_capability: str) -> str | None:
    """Why ``library`` cannot run plans on a GPU of ``compute_capability`` ("major.minor"); None if it can.

    Only TensorRT for RTX limits the GPUs; TensorRT itself says at deserialization when a GPU is too old."""
    if library == "tensorrt_rtx" and compute_capability not in RTX_COMPUTE_CAPABILITIES:
        return (f"TensorRT for RTX does not run on compute capability {compute_capability} "
                f"(it runs on {', '.join(RTX_COMPUTE_CAPABILITIES)})")
    return None


def unsupported_gpu_refusal(library: Library, compute_capability: str) -> str | None:
    """The one line that refuses ``library``'s plans on a GPU of ``compute_capability``, with the fix; None where it
    runs them. The engine says it as it loads a plan, and ``from_checkpoint`` before it builds plans that could not
    run here."""
    reason = library_unsupported_reason(library, compute_capability)
    if reason is None:
        return None
    return (f"{reason}. Note: use --backend cudnn or onnxruntime here (Python: backend='cudnn' or 'onnxruntime'), "
            "or install TensorRT "
            f"(pip install 'pointpillars-trt[tensorrt]') and {REBUILD_HINT}")


def rtx_default_targets(visible_capability: str | None) -> tuple[str, ...]:
    """The GPUs an RTX build is for unless told: the GPU that builds it when TensorRT for RTX runs there
    (a plan for this machine, as TensorRT builds them: a Turing laptop needs this), else the portable set."""
    if visible_capability is not None and library_unsupported_reason("tensorrt_rtx", visible_capability) is None:
        return (visible_capability,)
    return RTX_DEFAULT_TARGETS
