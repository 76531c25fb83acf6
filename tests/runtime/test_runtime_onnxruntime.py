"""ONNX Runtime engine: the CPU path against float64 NumPy twins, error messages, and (marked `cuda`)
the CUDA path with IO binding to CuPy buffers on the caller's stream, against the CPU provider."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pointpillars_trt.errors import BackendError, ModelDirError
from pointpillars_trt.runtime import BACKEND_NAMES, Engine, OrtOptions, TensorSpec, open_engine
from pointpillars_trt.runtime.onnxruntime import OnnxRuntimeEngine
from tiny_graphs import cuda_skip_reason, head_graph, head_reference, pfn_graph, pfn_reference

RNG = np.random.default_rng(7)


@pytest.fixture
def pfn(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "pfn.onnx"
    return path, pfn_graph(path)


@pytest.fixture
def head(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "head.onnx"
    return path, head_graph(path)


def pillars(p: int, m: int = 8, c: int = 6) -> np.ndarray:
    return RNG.standard_normal((p, m, c)).astype(np.float32)


# -- CPU ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1, 7, 300])
def test_cpu_pfn_matches_float64_reference(pfn, p):
    path, weights = pfn
    x = pillars(p)
    with open_engine(path, device="cpu") as engine:
        out = engine.run_host({"pillars": x})
    assert set(out) == {"pillar_features"}
    assert out["pillar_features"].dtype == np.float32
    np.testing.assert_allclose(out["pillar_features"], pfn_reference(x, weights), rtol=1e-5, atol=1e-5)


def test_cpu_pfn_handles_zero_pillars(pfn):
    path, _ = pfn
    with open_engine(path, device="cpu") as engine:
        out = engine.run_host({"pillars": pillars(0)})
    assert out["pillar_features"].shape == (0, 16)


def test_cpu_head_matches_brute_force_convolution(head):
    path, weights = head
    canvas = RNG.standard_normal((1, 4, 6, 10)).astype(np.float32)
    with open_engine(path, device="cpu") as engine:
        out = engine.run_host({"canvas": canvas})
    expected = head_reference(canvas, weights)
    assert set(out) == {"cls", "box"}
    for name in ("cls", "box"):
        np.testing.assert_allclose(out[name], expected[name], rtol=1e-4, atol=1e-4)


def test_fp16_is_a_property_of_the_graph(tmp_path):
    path = tmp_path / "pfn16.onnx"
    weights = pfn_graph(path, fp16=True)
    x = pillars(50)
    with open_engine(path, device="cpu") as engine:
        assert engine.inputs["pillars"].dtype == np.float32
        out = engine.run_host({"pillars": x})["pillar_features"]
    expected = pfn_reference(x.astype(np.float16), weights)  # the graph casts its input to fp16 first
    np.testing.assert_allclose(out, expected, rtol=2e-2, atol=2e-2)


def test_tensor_specs_describe_the_graph(pfn, head):
    with open_engine(pfn[0], device="cpu") as engine:
        assert engine.inputs == {"pillars": TensorSpec("pillars", (-1, 8, 6), np.dtype(np.float32), True)}
        assert engine.outputs == {"pillar_features": TensorSpec("pillar_features", (-1, 16), np.dtype(np.float32), False)}
    with open_engine(head[0], device="cpu") as engine:
        assert list(engine.outputs) == ["cls", "box"]
        assert engine.outputs["box"].shape == (1, 5, 6, 10)


def test_lifecycle(pfn):
    engine = OnnxRuntimeEngine(pfn[0])
    assert repr(engine).endswith(", inactive)")
    with pytest.raises(BackendError, match="not active"):
        engine.run_host({"pillars": pillars(2)})
    with engine as active:
        assert active is engine and repr(engine).endswith(", active)")
        assert engine.activate() is engine  # idempotent
        engine.run_host({"pillars": pillars(2)})
    assert repr(engine).endswith(", inactive)")
    with pytest.raises(BackendError, match="not active"):
        engine.inputs
    engine.close()  # twice is fine
    assert isinstance(engine, Engine)


def test_cpu_engine_refuses_device_binding(pfn):
    with open_engine(pfn[0], device="cpu") as engine:
        with pytest.raises(BackendError, match=r"bind\(\) needs an engine opened on 'cuda'"):
            engine.bind("pillars", 1234, (4, 8, 6))
        with pytest.raises(BackendError, match="run_host"):
            engine.run(1234)


# -- errors ---------------------------------------------------------------------------------------


def test_missing_graph(tmp_path):
    with pytest.raises(ModelDirError, match="ONNX graph not found: .*absent.onnx"):
        open_engine(tmp_path / "absent.onnx", device="cpu")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_graph(tmp_path, pfn, damage):
    valid = pfn[0].read_bytes()
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"not a protobuf at all" * 4 if damage == "garbage" else valid[: len(valid) // 2])
    with pytest.raises(ModelDirError, match="Cannot load ONNX graph .*corrupt.onnx"):
        open_engine(path, device="cpu")


def test_wrong_input_name(pfn):
    with open_engine(pfn[0], device="cpu") as engine:
        with pytest.raises(BackendError, match=r"Input tensor: points \| Not an input of pfn.onnx. Note: Expected inputs: \['pillars'\]"):
            engine.run_host({"points": pillars(3)})
        with pytest.raises(BackendError, match=r"Input tensor: pillars \| Missing from the feeds"):
            engine.run_host({})


def test_wrong_dtype_message(pfn):
    with open_engine(pfn[0], device="cpu") as engine:
        with pytest.raises(BackendError) as info:
            engine.run_host({"pillars": pillars(3).astype(np.float64)})
    assert str(info.value) == "Input tensor: pillars | Received unexpected dtype: float64. Note: Expected type: float32"


@pytest.mark.parametrize("shape", [(3, 8, 5), (3, 8), (3, 8, 6, 1)])
def test_wrong_shape_message(pfn, shape):
    with open_engine(pfn[0], device="cpu") as engine:
        with pytest.raises(BackendError) as info:
            engine.run_host({"pillars": np.zeros(shape, np.float32)})
    assert str(info.value) == (
        f"Input tensor: pillars | Received incompatible shape: {shape}. "
        "Note: Expected a shape compatible with: (-1, 8, 6)"
    )


def test_non_array_feed(pfn):
    with open_engine(pfn[0], device="cpu") as engine:
        with pytest.raises(BackendError, match="Received unexpected type: list"):
            engine.run_host({"pillars": pillars(1).tolist()})


def test_a_file_of_no_engine_or_an_unknown_device_is_refused(tmp_path):
    with pytest.raises(BackendError, match="Cannot tell the backend of rpn.bin"):
        open_engine(tmp_path / "rpn.bin")
    with pytest.raises(BackendError, match="Unknown device 'gpu'"):
        open_engine(tmp_path / "pfn.onnx", device="gpu")  # type: ignore[arg-type]


def test_cuda_mode_needs_a_stream(pfn):
    with pytest.raises(BackendError, match="needs the pipeline's stream"):
        open_engine(pfn[0], device="cuda", stream_ptr=0)


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has the CUDA provider"
)
def test_cuda_mode_without_cuda_provider(pfn):
    with pytest.raises(BackendError, match="CUDAExecutionProvider is not available"):
        open_engine(pfn[0], device="cuda", stream_ptr=0x1234)


def test_backends_are_imported_lazily():
    code = (
        "import sys, pointpillars_trt.runtime as r; "
        "assert 'onnxruntime' not in sys.modules and 'tensorrt' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


# -- CUDA: IO binding to CuPy buffers on the caller's stream ----------------------------------------

CUDA_SKIP = cuda_skip_reason() or (
    None if "CUDAExecutionProvider" in ort.get_available_providers()
    else "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
)

# TF32 convolutions / GEMMs on the GPU round inputs to 10-bit mantissas.
GPU_TOL = {"rtol": 2e-3, "atol": 2e-3}

SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < nanoseconds);
}
"""


@pytest.fixture
def stream(cp):
    return cp.cuda.Stream(non_blocking=True)


def device_buffers(cp, stream, engine: Engine, inputs: dict[str, np.ndarray]) -> dict:
    """Device copies of the inputs and empty outputs (shapes from the CPU run), all bound to ``engine``."""
    with stream:
        buffers = {name: cp.asarray(array) for name, array in inputs.items()}
    for name, array in buffers.items():
        engine.bind(name, array.data.ptr, array.shape)
    return buffers


def bind_outputs(cp, stream, engine: Engine, shapes: dict[str, tuple[int, ...]]) -> dict:
    """NaN-filled output buffers (filled on ``stream``, so the fill cannot race the engine), bound."""
    with stream:
        outputs = {name: cp.full(shape, np.nan, np.float32) for name, shape in shapes.items()}
    for name, array in outputs.items():
        engine.bind(name, array.data.ptr, array.shape)
    return outputs


@pytest.mark.cuda
@pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
@pytest.mark.parametrize("graph", ["pfn", "head"])
def test_cuda_io_binding_matches_cpu_provider(request, cp, stream, graph):
    path, _ = request.getfixturevalue(graph)
    feeds = {"pillars": pillars(300)} if graph == "pfn" else {"canvas": RNG.standard_normal((1, 4, 6, 10)).astype(np.float32)}
    with open_engine(path, device="cpu") as cpu:
        expected = cpu.run_host(feeds)
    with open_engine(path, device="cuda", stream_ptr=stream.ptr) as engine:
        inputs = device_buffers(cp, stream, engine, feeds)
        outputs = bind_outputs(cp, stream, engine, {n: a.shape for n, a in expected.items()})
        engine.run(stream.ptr)
        stream.synchronize()
    for name, array in expected.items():
        np.testing.assert_allclose(cp.asnumpy(outputs[name]), array, **GPU_TOL)
    for name, array in feeds.items():  # inputs are read, never written
        np.testing.assert_array_equal(cp.asnumpy(inputs[name]), array)


def run_behind_busy_stream(cp, stream, engine: Engine, staged, target) -> None:
    """Keep ``stream`` busy for 0.5 s, queue ``target[...] = staged`` behind that, then run the engine:
    run() must come back at once (no host sync), and the engine must see ``staged`` (stream order)."""
    spin = cp.RawKernel(SPIN_SOURCE, "spin")
    with stream:
        spin((1,), (1,), (np.uint64(500_000_000),))
        target[...] = staged
    start = time.perf_counter()
    engine.run(stream.ptr)
    returned_after = time.perf_counter() - start
    still_busy = not stream.done
    stream.synchronize()
    assert still_busy and returned_after < 0.25, f"run() blocked the host for {returned_after:.3f} s"


@pytest.mark.cuda
@pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
def test_cuda_run_does_not_wait_and_follows_stream_order(cp, stream, pfn):
    path, weights = pfn
    second = pillars(200)
    with open_engine(path, device="cuda", stream_ptr=stream.ptr) as engine:
        inputs = device_buffers(cp, stream, engine, {"pillars": pillars(200)})
        outputs = bind_outputs(cp, stream, engine, {"pillar_features": (200, 16)})
        with stream:
            staged = cp.asarray(second)
        for _ in range(2):  # warm-up: allocations and algorithm choices may synchronise once
            engine.run(stream.ptr)
        stream.synchronize()
        run_behind_busy_stream(cp, stream, engine, staged, inputs["pillars"])
    np.testing.assert_allclose(cp.asnumpy(outputs["pillar_features"]), pfn_reference(second, weights), **GPU_TOL)


@pytest.mark.cuda
@pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
def test_cuda_run_can_be_captured_in_the_pipeline_graph(cp, stream, pfn):
    """The pipeline captures the whole frame on its stream; ORT's kernels must be capturable too."""
    path, weights = pfn
    with open_engine(path, device="cuda", stream_ptr=stream.ptr) as engine:
        inputs = device_buffers(cp, stream, engine, {"pillars": pillars(256)})
        outputs = bind_outputs(cp, stream, engine, {"pillar_features": (256, 16)})
        engine.run(stream.ptr)  # warm-up outside the capture: ORT's arena and algorithm choices
        engine.run(stream.ptr)
        stream.synchronize()
        stream.begin_capture()
        engine.run(stream.ptr)
        graph = stream.end_capture()
        for _ in range(2):
            x = pillars(256)
            inputs["pillars"].set(x, stream=stream)
            graph.launch(stream)
            stream.synchronize()
            np.testing.assert_allclose(cp.asnumpy(outputs["pillar_features"]), pfn_reference(x, weights), **GPU_TOL)


@pytest.mark.cuda
@pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
def test_cuda_engine_checks_stream_bindings_and_shapes(cp, stream, pfn):
    path, _ = pfn
    other = cp.cuda.Stream(non_blocking=True)
    with open_engine(path, device="cuda", stream_ptr=stream.ptr) as engine:
        with pytest.raises(BackendError, match=r"tensors \['pillar_features', 'pillars'\] are not bound"):
            engine.run(stream.ptr)
        buffers = device_buffers(cp, stream, engine, {"pillars": pillars(10)})
        buffers.update(bind_outputs(cp, stream, engine, {"pillar_features": (10, 16)}))
        with pytest.raises(BackendError, match="ONNX Runtime cannot switch streams per run"):
            engine.run(other.ptr)
        with pytest.raises(BackendError, match=r"Output tensor: pillar_features \| Received incompatible shape: \(10, 15\)"):
            engine.bind("pillar_features", 1234, (10, 15))
        with pytest.raises(BackendError, match="null device pointer"):
            engine.bind("pillars", 0, (10, 8, 6))
        with pytest.raises(BackendError, match="run_host"):
            engine.run_host({"pillars": pillars(10)})


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("tf32", [False, True])
def test_tf32_and_device_reach_every_backends_options(backend: str, tf32: bool) -> None:
    from pointpillars_trt.runtime import CudnnOptions, EngineRequest, engine_options_for

    options = engine_options_for(backend, EngineRequest(device_id=1, tf32=tf32, precision="fp32",
                                                        config_digest="d" * 16))
    assert options.device_id == 1
    if isinstance(options, CudnnOptions):  # fp32 graphs: TF32 convs, or IEEE fp32 ones
        assert options.precision == ("tf32" if tf32 else "fp32") and options.config_digest == "d" * 16
        assert engine_options_for(backend, EngineRequest(device_id=0, tf32=tf32, precision="fp16",
                                                         config_digest="d" * 16)).precision == "fp16"
        return
    assert options.tf32 is tf32
    if backend == "tensorrt":  # what a prebuilt plan must match
        assert (options.precision, options.config_digest) == ("fp32", "d" * 16)


def test_options_are_validated() -> None:
    with pytest.raises(BackendError, match="threads"):
        OrtOptions(threads=0)
    with pytest.raises(BackendError, match="device_id"):
        OrtOptions(device_id=True)  # type: ignore[arg-type]


def test_a_graph_replaced_after_its_model_dir_was_opened_is_refused_not_run(tmp_path: Path) -> None:
    """A build into the same folder between the model dir's checks and the session's making (which reads the
    file again) would pair one model's record with another's weights: the session's bytes are checked."""
    from pointpillars_trt.cpu_detector import CpuDetector
    from pointpillars_trt.model_dir import load_model_dir
    from tiny import tiny_model_dir

    tiny_model_dir(tmp_path / "a", seed=0)
    other = tiny_model_dir(tmp_path / "b", seed=1)
    model = load_model_dir(tmp_path / "a")
    CpuDetector(model).close()  # the model dir as checked opens
    model.rpn_path.write_bytes(other.rpn_path.read_bytes())  # same inputs and outputs, other weights
    with pytest.raises(ModelDirError, match="rpn.onnx': replaced since its model dir was opened"):
        CpuDetector(model)
    with pytest.raises(ModelDirError, match="replaced since"):
        open_engine(model.rpn_path, OrtOptions(graph_sha256=model.graph_sha256("rpn")), device="cpu")


def test_a_run_that_runs_out_of_memory_is_one_line_that_says_so(tmp_path: Path) -> None:
    """A graph whose output ONNX Runtime cannot allocate (a 1 TiB buffer, from a shape given at run time): one
    short BackendError naming the graph and what it asked for, and nothing of ORT's own multi-line log on
    stderr (its session logs fatal errors only). In a process of its own, its stderr read whole."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))],
        "huge", [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("big", TensorProto.FLOAT, [-1])])
    path = tmp_path / "huge.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code = ("import sys, numpy as np\n"
            "from pointpillars_trt.runtime.onnxruntime import OnnxRuntimeEngine\n"
            "from pointpillars_trt.errors import BackendError\n"
            "with OnnxRuntimeEngine(sys.argv[1]) as engine:\n"
            "    try:\n"
            "        engine.run_host({'shape': np.array([2**38], np.int64)})\n"
            "    except BackendError as exc:\n"
            "        print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == (
        "ONNX Runtime ran out of memory running huge.onnx (1048576 MiB asked for one buffer): a model of a finer "
        "pillar grid or more pillars needs more; free memory, or run on the GPU\n"), (done.stdout, done.stderr)
    assert done.stderr == "", done.stderr
