"""The notices the package says once (a process, or a build), as the tests that cause them check them rather than
leave them to pytest's warnings summary, where a notice no test expected would hide among them."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from pointpillars_trt.errors import LibraryNotice, SettingNotice


def published_config_notice(checkpoint: Path) -> pytest.WarningsChecker:
    """Around what builds ``checkpoint`` (an OpenPCDet one, given without a config) into a model dir or a new cache
    entry: the ``SettingNotice`` naming it and the published config it is built with (``export.say_builtin_config``),
    said at least once."""
    return pytest.warns(SettingNotice, match=rf"^{re.escape(repr(str(checkpoint)))}: built with config openpcdet_\w+, "
                                             r"OpenPCDet's published tools/cfgs/\w+/\w+\.yaml \(a checkpoint holds no "
                                             r"config\): .* build with --pcdet-config ITS_MODEL\.yaml ")


def first_build() -> contextlib.AbstractContextManager[object]:
    """Around a test's first build of a plan: where TensorRT for RTX stands in for TensorRT, the notice that says so
    (once a process: its once is reset here, so that this block says it whatever ran before), checked rather than
    left to pytest's warnings summary; TensorRT itself says none."""
    from pointpillars_trt.runtime import tensorrt as trt_runtime
    from pointpillars_trt.runtime.tensorrt_library import installed_library

    trt_runtime._say_rtx_once.cache_clear()
    if installed_library() != "tensorrt_rtx":
        return contextlib.nullcontext()
    return pytest.warns(LibraryNotice, match=r"^TensorRT is not installed; the tensorrt backend uses TensorRT for RTX "
                                             r"[0-9.]+, whose plans run on compute capability [0-9./]+ only$")
