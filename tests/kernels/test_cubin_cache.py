"""The on-disk cache of architecture-specific cubins: on the CPU, the cache's rules with real files; on
an H200 (marked `cuda`), the wgmma neck-head module compiled once, then loaded from disk by a later start
without NVRTC, and a damaged file compiled again and replaced."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from pointpillars_trt.errors import BackendError
from pointpillars_trt.kernels.cubin_cache import cached_module, cubin_path

GOOD = b"\x7fELF a cubin"


class Compiler:
    """Counts its compiles; what it returns loads, anything else is refused as a driver would."""

    def __init__(self) -> None:
        self.calls = 0

    def compile(self) -> bytes:
        self.calls += 1
        return GOOD

    @staticmethod
    def load(data: bytes) -> str:
        if not data.startswith(b"\x7fELF"):
            raise BackendError("not a cubin")
        return data.decode("latin-1")


@pytest.fixture
def cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_module_is_compiled_once_then_read_from_disk(cache):
    compiler = Compiler()
    assert cached_module("k-sm_90a", "source 1", compiler.compile, compiler.load) == GOOD.decode("latin-1")
    path = cubin_path("k-sm_90a", "source 1")
    assert path.parent == cache / "kernels" and path.read_bytes() == GOOD
    assert cached_module("k-sm_90a", "source 1", compiler.compile, compiler.load) == GOOD.decode("latin-1")
    assert compiler.calls == 1
    cached_module("k-sm_90a", "source 2", compiler.compile, compiler.load)  # another identity, another file
    assert compiler.calls == 2 and len(os.listdir(cache / "kernels")) == 2


@pytest.mark.parametrize("damage", ["garbage", "empty", "folder"])
def test_a_cubin_that_does_not_load_is_compiled_again_and_replaced(cache, damage):
    path = cubin_path("k-sm_90a", "source")
    path.parent.mkdir(parents=True)
    if damage == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"" if damage == "empty" else b"\x00garbage")
    compiler = Compiler()
    assert cached_module("k-sm_90a", "source", compiler.compile, compiler.load) == GOOD.decode("latin-1")
    assert compiler.calls == 1
    if damage != "folder":  # a folder in its place stays (the atomic writer cannot replace it)
        assert path.read_bytes() == GOOD


def test_an_unwritable_cache_still_gives_the_module(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(blocker))
    compiler = Compiler()
    for _ in range(2):
        assert cached_module("k-sm_90a", "source", compiler.compile, compiler.load) == GOOD.decode("latin-1")
    assert compiler.calls == 2  # nothing kept: compiled at each start


def test_a_compile_error_is_not_cached(cache):
    def fail() -> bytes:
        raise BackendError("k.cu: kernel compilation for sm_90a failed")

    with pytest.raises(BackendError, match="compilation"):
        cached_module("k-sm_90a", "source", fail, Compiler.load)
    assert not cubin_path("k-sm_90a", "source").exists()


@pytest.mark.cuda
def test_the_wgmma_module_is_loaded_from_disk_by_a_later_start(cp, cache, monkeypatch):
    from cupy_backends.cuda.libs import nvrtc

    from pointpillars_trt.kernels import _launch
    from pointpillars_trt.kernels.neck_head import NeckHeadStage
    from test_neck_head import KITTI_LIKE, make_case

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma kernel runs on compute capability 9.0 (H100, H200)")
    params, weights, feats = make_case(KITTI_LIKE, 16, 16, nh=24, batch=2, half=True, seed=3)
    params = replace(params, wgmma=True)
    compiles = []
    real_compile = nvrtc.compileProgram
    monkeypatch.setattr(nvrtc, "compileProgram", lambda *a: compiles.append(1) or real_compile(*a))

    def start() -> np.ndarray:
        """A process's start as far as the module goes: its in-memory modules gone, the stage built."""
        _launch._arch_module.cache_clear()
        stage = NeckHeadStage(params, weights)
        out = cp.full(params.output_shape(2), np.nan, np.float32)
        stage.launch([cp.asarray(f.astype(np.float16)) for f in feats], out, cp.cuda.Stream.null)
        return cp.asnumpy(out)

    try:
        first = start()
        files = list((cache / "kernels").iterdir())
        assert len(compiles) == 1 and len(files) == 1 and files[0].name.startswith("neck_head_wgmma-sm_90a-")
        assert start().tobytes() == first.tobytes() and len(compiles) == 1, "the second start compiles nothing"
        files[0].write_bytes(b"\x00" * 64)
        assert start().tobytes() == first.tobytes() and len(compiles) == 2, "a damaged cubin is compiled again"
        assert files[0].read_bytes()[:4] == b"\x7fELF", "and replaced"
    finally:
        _launch._arch_module.cache_clear()  # later tests get modules of the real cache again
    assert np.isfinite(first).all()
