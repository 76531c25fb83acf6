"""The GPU pipeline against the CPU path (the oracle), on the shared KITTI frames and random clouds.

Runs with every GPU engine backend present here (the cuDNN engine, ONNX Runtime's CUDA execution
provider), each in IEEE fp32 against the oracle; elsewhere every test skips with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pointpillars_trt.config import ModelConfig
from pointpillars_trt.detections import STAGES, Detections
from pointpillars_trt.devices import cuda_available
from pointpillars_trt.errors import InputError
from pointpillars_trt.pointcloud_io import read_points
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.model_dir import ModelDir

pytestmark = pytest.mark.cuda


_REASON = cuda_available()
if _REASON:
    pytest.skip(f"GPU pipeline tests need CUDA: {_REASON}", allow_module_level=True)


def _backends_here() -> list[str]:
    from pointpillars_trt.runtime import cudnn_unavailable_reason, onnxruntime_cuda_unavailable_reason

    probes = (("cudnn", cudnn_unavailable_reason), ("onnxruntime", onnxruntime_cuda_unavailable_reason))
    return [name for name, unavailable_reason in probes if unavailable_reason() is None]


BACKENDS = _backends_here()

from pointpillars_trt.cpu_detector import CpuDetector  # noqa: E402
from pointpillars_trt.apps.bench.round_trip import HostRoundTripPipeline  # noqa: E402
from pointpillars_trt.gpu_pipeline import DIRECT_COPY_BYTES, GpuPipeline  # noqa: E402
from pointpillars_trt.reference import voxelize  # noqa: E402
from pointpillars_trt.staging import HEADER_ROWS  # noqa: E402

SHARED_FRAMES = (
    "kitti/training/velodyne_reduced/000134.bin",
    "kitti/testing/velodyne_reduced/000002.bin",
    "kitti/training/velodyne/000000.bin",
    "kitti/training/velodyne/000001.bin",
    "kitti/training/velodyne/000002.bin",
)
CHECKPOINTS = {
    "openpcdet": "checkpoints/pointpillar_openpcdet_synthetic.pth",
    "zhulf0804": "checkpoints/pointpillars_zhulf0804_synthetic.pth",
}


def _model_from_checkpoint(path, out) -> ModelDir:  # type: ignore[no-untyped-def]
    from pointpillars_trt.convert.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    return export_model_dir(ckpt.weights, ckpt.config, out, precision="fp32", source={"checkpoint": str(path)})


@pytest.fixture(scope="module", params=[(f, b) for f in sorted(CHECKPOINTS) for b in BACKENDS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def family_pair(request, assets, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(family, cpu detector, gpu pipeline in IEEE fp32) for one checkpoint family and engine backend."""
    family, backend = request.param
    model = _model_from_checkpoint(assets / CHECKPOINTS[family], tmp_path_factory.mktemp(family))
    cpu, gpu = CpuDetector(model), GpuPipeline(model, backend=backend, tf32=False)
    yield family, cpu, gpu
    gpu.close()
    cpu.close()


def by_position(det: Detections) -> Detections:
    """The detections ordered by label and box centre (not by score), for comparing sets of boxes."""
    order = np.lexsort((np.round(det.boxes[:, 1], 2), np.round(det.boxes[:, 0], 2), det.labels))
    return Detections(det.boxes[order], det.scores[order], det.labels[order], det.class_names, det.stats)


def assert_same_detections(gpu: Detections, cpu: Detections, what: str) -> None:
    assert len(gpu) == len(cpu), f"{what}: GPU {len(gpu)} boxes, CPU {len(cpu)}"
    np.testing.assert_array_equal(gpu.labels, cpu.labels, err_msg=what)
    np.testing.assert_allclose(gpu.scores, cpu.scores, rtol=0, atol=2e-5, err_msg=what)
    np.testing.assert_allclose(gpu.boxes, cpu.boxes, rtol=0, atol=2e-3, err_msg=what)
    assert gpu.stats == cpu.stats, what


@pytest.mark.parametrize("frame", SHARED_FRAMES)
def test_gpu_matches_cpu_on_shared_frames(family_pair, assets, frame):  # type: ignore[no-untyped-def]
    family, cpu, gpu = family_pair
    points = read_points(assets / frame)
    assert_same_detections(gpu.detect(points), cpu.detect(points), f"{family} {frame}")


def test_voxelizer_and_canvas_match_reference(family_pair, assets):  # type: ignore[no-untyped-def]
    """Same pillars (set, order, points kept) and decorations as the NumPy reference, same canvas."""
    family, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[3])
    gpu.detect(points)
    ref = voxelize(points, gpu.cfg)
    p = ref.num_pillars
    vox = gpu._voxelize
    np.testing.assert_array_equal(vox.coords[0, :p].get(), ref.coords)
    np.testing.assert_array_equal(vox.num_points[0, :p].get(), ref.num_points)
    np.testing.assert_allclose(vox.features[0, :p].get(), ref.features, rtol=1e-5, atol=1e-5)
    assert not vox.features[0, p:].any(), "rows past the pillar count must be zero"
    from pointpillars_trt.reference import scatter

    canvas = scatter(gpu._pfn.out[0, :p].get(), ref.coords, gpu.cfg)[0]  # (C, ny, nx)
    if not gpu._rpn.channels_first_input:  # the IEEE fp32 cuDNN engine reads it as it is; the others NHWC
        canvas = canvas.transpose(1, 2, 0)
    np.testing.assert_array_equal(gpu._canvas[0].get(), canvas.astype(gpu._canvas.dtype))


def test_same_frame_twice_is_bit_identical(family_pair, assets):  # type: ignore[no-untyped-def]
    _, _, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[2])
    first = gpu.detect(points)
    kept = first.boxes.copy(), first.scores.copy()
    gpu.detect(read_points(assets / SHARED_FRAMES[0]))  # something else in between
    # a returned result owns its arrays: the next frame must not rewrite it
    assert first.boxes.tobytes() == kept[0].tobytes() and first.scores.tobytes() == kept[1].tobytes()
    second = gpu.detect(points)
    assert first.boxes.tobytes() == second.boxes.tobytes()
    assert first.scores.tobytes() == second.scores.tobytes()


def _random_cloud(rng: np.random.Generator, n: int) -> np.ndarray:
    pts = np.column_stack([
        rng.uniform(-5, 75, n), rng.uniform(-45, 45, n), rng.uniform(-3.5, 1.5, n), rng.uniform(0, 1, n),
    ]).astype(np.float32)
    pts[rng.random(n) < 0.01, rng.integers(0, 4)] = np.nan
    return pts


@pytest.mark.parametrize("n", [0, 1, 7, 5000, 150_000])
def test_gpu_matches_cpu_on_random_clouds(family_pair, n):  # type: ignore[no-untyped-def]
    family, cpu, gpu = family_pair
    points = _random_cloud(np.random.default_rng(n), n)
    assert_same_detections(gpu.detect(points), cpu.detect(points), f"{family} random n={n}")


def test_a_corrupt_intensity_gives_overflowed_scores_counted_as_the_cpu_path_counts_them(family_pair, assets):  # type: ignore[no-untyped-def]
    """One point's intensity of 3e38 in a camera-view frame: the network overflows to NaN class logits on the CPU
    path, and on ONNX Runtime's CUDA engine, whose ReLUs pass NaN on as PyTorch's do; the GPU's post-process counts
    them (where the convolutions spread the overflow, and so how many, is the engine's own: the count is not
    compared). The cuDNN engine's ReLUs (cuDNN's and the neck-head kernels' ``fmaxf``) turn NaN into 0, so the
    overflow need not reach its class scores (on an H100 it did not: 0 counted); the pillar features beyond
    float16's range are counted where the value entered, as the CPU path counts them, whatever the engine. The next
    frame counts none again and equals the CPU path box for box."""
    family, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[0])
    corrupt = points.copy()
    corrupt[len(points) // 2, 3] = 3e38
    found, oracle = gpu.detect(corrupt).stats, cpu.detect(corrupt).stats
    assert oracle.num_overflowed_scores > 0
    if gpu.backend == "onnxruntime":
        assert found.num_overflowed_scores > 0
    # where the value entered, every engine counts as the CPU path does: the silent cuDNN case is said
    assert found.num_overflowed_features == oracle.num_overflowed_features > 0
    clean = gpu.detect(points)
    assert clean.stats.num_overflowed_scores == clean.stats.num_overflowed_features == 0
    assert_same_detections(clean, cpu.detect(points), f"{family} after a corrupt frame")


@pytest.fixture(scope="module")
def small_limit_pair(assets, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A model whose pillar maximum (3000) is far below a full scan's ~14.8k pillars."""
    from pointpillars_trt.convert.checkpoint import load_checkpoint

    ckpt = load_checkpoint(assets / CHECKPOINTS["openpcdet"])
    cfg: ModelConfig = dataclasses.replace(ckpt.config, voxel=dataclasses.replace(ckpt.config.voxel, max_pillars=3000))
    model = export_model_dir(ckpt.weights, cfg, tmp_path_factory.mktemp("limit"), precision="fp32", source={})
    cpu, gpu = CpuDetector(model), GpuPipeline(model, backend=BACKENDS[0], tf32=False)
    yield cpu, gpu
    gpu.close()
    cpu.close()


def test_pillar_overflow_keeps_first_pillars_and_reports_drops(small_limit_pair, assets):  # type: ignore[no-untyped-def]
    cpu, gpu = small_limit_pair
    points = read_points(assets / "kitti/training/velodyne/000001.bin")
    det = gpu.detect(points)
    assert det.stats.num_pillars == 3000
    assert det.stats.num_pillars_dropped == voxelize(points, gpu.cfg).num_pillars_total - 3000 > 10_000
    assert_same_detections(det, cpu.detect(points), "overflow")


def test_growing_past_the_point_capacity(assets, tmp_path):  # type: ignore[no-untyped-def]
    from pointpillars_trt.convert.checkpoint import load_checkpoint

    ckpt = load_checkpoint(assets / CHECKPOINTS["openpcdet"])
    model = export_model_dir(ckpt.weights, ckpt.config, tmp_path, precision="fp32", source={})
    points = read_points(assets / SHARED_FRAMES[2])
    roomy = GpuPipeline(model, backend=BACKENDS[0], tf32=False)
    small = GpuPipeline(model, backend=BACKENDS[0], tf32=False, max_points=1000)
    assert_same_detections(small.detect(points), roomy.detect(points), "after growing")
    assert small.max_points >= points.shape[0]
    small.close()
    roomy.close()


def test_device_array_inputs(family_pair, assets):  # type: ignore[no-untyped-def]
    """CuPy arrays and PyTorch CUDA tensors are used where they are: no host copy at all."""
    import cupy as cp

    _, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[0])
    expected = cpu.detect(points)
    assert_same_detections(gpu.detect(cp.asarray(points)), expected, "cupy input")
    assert gpu.copies.h2d_copies == 0
    torch = pytest.importorskip("torch")
    assert_same_detections(gpu.detect(torch.from_numpy(points).cuda()), expected, "torch input")
    assert gpu.copies.h2d_copies == 0
    wide = np.column_stack([points, np.zeros(len(points), np.float32)])  # (N, 5): extra column ignored
    assert_same_detections(gpu.detect(cp.asarray(wide)), expected, "cupy (N, 5) input")
    assert_same_detections(gpu.detect(cp.asfortranarray(cp.asarray(points))), expected, "column-major cupy input")
    other = read_points(assets / SHARED_FRAMES[1])  # a batch's second frame: its rows after the first's
    found = gpu.detect_batch([cp.asarray(wide)[:, :4], cp.asarray(other)])
    assert_same_detections(found[0], expected, "the first device frame of a batch")
    assert_same_detections(found[1], cpu.detect(other), "the second device frame of a batch")
    image = cp.asarray(np.random.default_rng(0).random((64, 2048), np.float32) * 50)  # a range image, as on the host
    with pytest.raises(InputError, match=r"^points: expected an \(N, 4\) float32 device array; got shape \(64, 2048\), "
                                         r"dtype float32: rows of 2048 values, where a point has 4 to 64"):
        gpu.detect(image)


def test_a_device_frame_is_copied_after_its_producer_and_before_the_caller_changes_it(family_pair, assets):  # type: ignore[no-untyped-def]
    """The pipeline's stream is its own (non-blocking): a frame still being made on the caller's current stream
    is copied once it is made, and one the caller overwrites there right after ``submit`` is copied as it was."""
    import cupy as cp

    from pointpillars_trt.kernels.hold import hold_stream

    _, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[0])
    expected = cpu.detect(points)
    source = cp.asarray(points)
    cp.cuda.Device().synchronize()
    caller = cp.cuda.Stream(non_blocking=True)
    with caller:
        late = cp.zeros_like(source)
        hold_stream(caller, 200)  # the frame's producer is still busy when detect is called
        late[...] = source
        assert_same_detections(gpu.detect(late), expected, "a frame made behind 200 ms of work on the caller's stream")
        frame = source.copy()
        hold_stream(gpu.stream, 200)  # the pipeline's copy of the frame comes 200 ms after submit returns
        gpu.submit([frame])
        frame.fill(0)  # the caller's next work on its frame
        found = gpu.collect()[0]
    assert_same_detections(found, expected, "a frame the caller zeroed on its stream right after submit")
    caller.synchronize()
    assert not frame.any()


def test_a_frame_on_another_gpu_is_an_input_error(family_pair, assets):  # type: ignore[no-untyped-def]
    """A frame on another GPU than the pipeline's is refused naming both, before any kernel reads it (a kernel
    given another GPU's memory faults), and the pipeline goes on."""
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    _, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[0])
    with cp.cuda.Device(1):
        elsewhere = cp.asarray(points)
    with pytest.raises(InputError, match=r"^points: on GPU 1, and the detector runs on GPU 0: copy it there first"):
        gpu.detect(elsewhere)
    assert_same_detections(gpu.detect(cp.asarray(points)), cpu.detect(points), "after a frame of another GPU")


def test_a_device_array_with_a_malformed_interface_is_an_input_error(family_pair, assets):  # type: ignore[no-untyped-def]
    """A foreign GPU array whose CUDA array interface lacks its type (CuPy raises KeyError on it): the frame's
    InputError naming what was expected, and the detector goes on."""
    import cupy as cp

    _, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[0])
    good = cp.asarray(points)

    class Malformed:
        __cuda_array_interface__ = {"shape": good.shape, "data": (good.data.ptr, False), "version": 3}

    with pytest.raises(InputError, match=r"^points: cannot be read as an \(N, 4\) .*\(KeyError: "):
        gpu.detect(Malformed())
    assert_same_detections(gpu.detect(good), cpu.detect(points), "after the malformed array")


@pytest.mark.parametrize("frame", [SHARED_FRAMES[0], SHARED_FRAMES[3]], ids=["camera view", "full scan"])
def test_one_h2d_and_one_d2h_copy_per_frame(family_pair, assets, frame):  # type: ignore[no-untyped-def]
    """Counted by CUPTI through the PyTorch profiler, independently of the pipeline's own counter. A
    full scan (over DIRECT_COPY_BYTES) goes straight from the caller's array, its header set on the device."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    _, _, gpu = family_pair
    points = read_points(assets / frame)
    direct = points.nbytes >= DIRECT_COPY_BYTES
    assert direct == (frame == SHARED_FRAMES[3])
    gpu.detect(points)  # warm-up: graphs captured
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        gpu.detect(points)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    h2d = [n for n in names if "HtoD" in n]
    d2h = [n for n in names if "DtoH" in n]
    assert len(h2d) == 1 and len(d2h) == 1, (h2d, d2h)
    assert gpu.copies.h2d_copies == 1 and gpu.copies.d2h_copies == 1
    # the points, and through staging the header rows of counts and first rows
    assert gpu.copies.h2d_bytes == points.nbytes + (0 if direct else 16 * HEADER_ROWS)


def test_a_large_frame_from_the_callers_array_equals_it_through_staging(family_pair, assets):  # type: ignore[no-untyped-def]
    """The direct copy (C-ordered float32 rows) and the staging copy (the same points in Fortran order)
    give the same bytes, in either order: the header the direct copy sets is the one the kernels read."""
    _, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[3])
    direct = gpu.detect(points)
    assert gpu.copies.h2d_bytes == points.nbytes
    staged = gpu.detect(np.asfortranarray(points))
    assert gpu.copies.h2d_bytes == points.nbytes + 16 * HEADER_ROWS
    again = gpu.detect(points)
    for a, b in ((direct, staged), (direct, again)):
        np.testing.assert_array_equal(a.boxes, b.boxes)
        np.testing.assert_array_equal(a.scores, b.scores)
    assert_same_detections(direct, cpu.detect(points), "full scan, direct copy")


def test_a_frame_may_change_once_submit_returns(family_pair, assets):  # type: ignore[no-untyped-def]
    """submit's promise (the frames are copied before it returns): a large pageable array (copied
    directly) and the same points in page-locked memory (which an async copy would read later, so
    staged) are overwritten at once after submit; collect still gives the frame's boxes."""
    import cupyx

    _, _, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[3])
    expected = gpu.detect(points)
    pinned = cupyx.empty_pinned(points.shape, np.float32)
    for frame, staged in ((points.copy(), False), (pinned, True)):
        frame[:] = points
        gpu.submit([frame])
        assert gpu.copies.h2d_bytes == points.nbytes + (16 * HEADER_ROWS if staged else 0)
        frame[:] = 0.0  # the caller reuses its buffer
        got = gpu.collect()[0]
        np.testing.assert_array_equal(got.boxes, expected.boxes)
        np.testing.assert_array_equal(got.scores, expected.scores)


@pytest.mark.parametrize("frame", [SHARED_FRAMES[0], SHARED_FRAMES[3]], ids=["camera view", "full scan"])
def test_detect_reads_a_page_locked_frame_in_place(family_pair, assets, frame):  # type: ignore[no-untyped-def]
    """A frame in page-locked memory, any size, goes to the device straight from it when the caller
    waits (``detect``): no header rows copied, the same detections as from a pageable array."""
    import cupyx

    _, _, gpu = family_pair
    points = read_points(assets / frame)
    expected = gpu.detect(points)
    pinned = cupyx.empty_pinned(points.shape, np.float32)
    pinned[:] = points
    got = gpu.detect(pinned)
    assert gpu.copies.h2d_copies == 1 and gpu.copies.h2d_bytes == points.nbytes
    np.testing.assert_array_equal(got.boxes, expected.boxes)
    np.testing.assert_array_equal(got.scores, expected.scores)
    np.testing.assert_array_equal(got.labels, expected.labels)


def test_stage_timings_and_graphs(family_pair, assets):  # type: ignore[no-untyped-def]
    """Off by default (no timings, the untimed graph); on, the timed graph of the same batch times
    every stage."""
    _, _, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[0])
    assert gpu.stage_timings is False
    gpu.detect(points)
    assert gpu.last_timings == {}
    gpu.stage_timings = True
    try:
        gpu.detect(points)
    finally:
        gpu.stage_timings = False
    t = gpu.last_timings
    assert set(t) == {"voxelize", "pfn", "scatter", "rpn", "postprocess", "total"}
    assert all(v > 0 for v in t.values())
    assert sum(t[s] for s in ("voxelize", "pfn", "scatter", "rpn", "postprocess")) <= t["total"] * 1.001
    assert gpu.graph_failures == {}, gpu.graph_failures
    assert gpu.execution_mode == "cuda_graph"  # one graph a batch, its event-record nodes timed the stages
    assert {("frame", 1), ("frame, timed", 1)} <= set(gpu._graphs)


def test_a_graph_a_stage_when_the_batch_cannot_be_one_gives_the_same_bytes(family_pair, assets, monkeypatch):  # type: ignore[no-untyped-def]
    """A batch whose capture fails (here: its event-record nodes) falls back, said once, to a graph a
    stage with events recorded between them; the boxes are the one-graph path's, byte for byte, and
    the stages are timed too."""
    import pointpillars_trt.gpu_pipeline as gpu_pipeline
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)[1:]
    one = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=len(frames))
    expected = one.detect_batch(frames)
    assert one.gpu_pipeline.execution_mode == "cuda_graph"

    def refuse(event: object, stream: object) -> None:
        raise RuntimeError("no event-record nodes here")

    monkeypatch.setattr(gpu_pipeline, "record_in_graph", refuse)
    per_stage = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=len(frames),
                             stage_timings=True)
    with pytest.warns(RuntimeWarning, match="cannot be captured as one CUDA graph .*no event-record nodes"):
        found = per_stage.detect_batch(frames)
    for _ in range(2):  # the first captured the stages' graphs, the second replays them
        assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in expected]
        assert [d.scores.tobytes() for d in found] == [d.scores.tobytes() for d in expected]
        found = per_stage.detect_batch(frames)
    pipeline = per_stage.gpu_pipeline
    assert pipeline.execution_mode == "cuda_graph per stage" and pipeline.graph_failures == {}
    assert sorted(pipeline._graphs) == sorted((stage, len(frames)) for stage in STAGES)
    assert set(pipeline.last_timings) == {*STAGES, "total"} and all(v > 0 for v in pipeline.last_timings.values())
    one.close()
    per_stage.close()


def test_thresholds_change_per_call_without_recompiling_or_recapturing(family_pair, assets):  # type: ignore[no-untyped-def]
    """New thresholds on a live pipeline: the CPU oracle's boxes with those thresholds, no new kernel
    module compiled, the same captured graphs replayed (the kernels read the values from device memory)."""
    from pointpillars_trt.config import Thresholds
    from pointpillars_trt.kernels import _launch

    family, cpu, gpu = family_pair
    points = read_points(assets / SHARED_FRAMES[2])
    gpu.detect(points)  # compiled and captured
    compiled, graphs = _launch.compiled_modules(), dict(gpu._graphs)
    settings = [Thresholds(score_threshold=0.05), Thresholds(nms_iou=0.5), Thresholds(max_boxes=5),
                Thresholds(score_threshold=0.3, nms_iou=0.1, max_boxes=20), Thresholds(score_threshold=0.05),
                Thresholds()]
    lengths = set()
    for thresholds in settings:
        post = thresholds.applied_to(gpu.post_cfg)
        found = gpu.detect(points, post)
        # many boxes survive a loose NMS: scores equal to 2e-5 may swap neighbours, so compare sets
        assert_same_detections(by_position(found), by_position(cpu.detect(points, post)), f"{family} {thresholds}")
        lengths.add(len(found))
    assert len(lengths) > 2, f"the thresholds must change the result to test anything: {lengths}"
    assert _launch.compiled_modules() == compiled, "a threshold change compiled a kernel module"
    assert gpu._graphs.keys() == graphs.keys() and all(gpu._graphs[k] is g for k, g in graphs.items())
    assert gpu.graph_failures == {}, gpu.graph_failures


def test_host_round_trip_mode_gives_the_same_boxes(family_pair, assets, tmp_path):  # type: ignore[no-untyped-def]
    _, cpu, gpu = family_pair
    slow = HostRoundTripPipeline(gpu.model, backend=gpu.backend, tf32=False)
    points = read_points(assets / SHARED_FRAMES[1])
    assert_same_detections(slow.detect(points), cpu.detect(points), "host round trip")
    assert slow.copies.h2d_copies > 5 and slow.copies.d2h_copies > 5
    slow.close()


def test_tf32_default_keeps_the_confident_boxes(family_pair, assets):  # type: ignore[no-untyped-def]
    """TF32 (the default, as in TensorRT and PyTorch) moves logits by ~1e-3: boxes clear of the score
    threshold must all be found, with the same label and score.

    OpenPCDet's class-agnostic NMS keeps the same boxes to the centimetre. zhulf0804 first cuts to the
    top 100 anchors and then suppresses at IoU 0.01, so a ~1e-3 change can move anchors across that
    cut and swap which of two neighbouring anchors (0.32 m apart, near-equal scores) survives: there
    only its ten best boxes, far above the cut, are matched, and by proximity.
    """
    family, cpu, gpu = family_pair
    fast = GpuPipeline(gpu.model, backend=gpu.backend)
    assert fast.tf32
    reach, score_tol = (0.05, 5e-3) if family == "openpcdet" else (1.0, 2e-2)
    for frame in SHARED_FRAMES[:3]:
        points = read_points(assets / frame)
        ref, got = cpu.detect(points), fast.detect(points)
        np.testing.assert_allclose(len(got), len(ref), rtol=0.15, atol=2, err_msg=f"{family} {frame}")
        confident = ref.scores >= 0.2 if family == "openpcdet" else np.argsort(-ref.scores, kind="stable")[:10]
        for box, score, label in zip(ref.boxes[confident], ref.scores[confident], ref.labels[confident]):
            same = (got.labels == label) & (np.abs(got.scores - score) < score_tol)
            dist = np.where(same, np.linalg.norm(got.boxes[:, :2] - box[:2], axis=1), np.inf)
            assert dist.min() < reach, (family, frame, box, score)
    fast.close()


@pytest.mark.parametrize("channels, features, points", [
    (64, 10, 32),   # KITTI: four channels a thread
    (64, 11, 20),   # nuScenes (a time column)
    (30, 9, 7),     # two channels a thread
    (37, 10, 100),  # one channel a thread, more points than shared memory held before
    (256, 10, 384),
])
def test_fused_pfn_kernel_against_float64(openpcdet_cfg, channels, features, points):  # type: ignore[no-untyped-def]
    """pfn.cu computes max over slots of ReLU(x W^T + b) for the live pillars only, for any channel
    count (four, two or one channels a thread) and pillar size, each frame of a batch from its own
    pillars and count, and adds the features beyond float16's 65504 (a feature of 1e30 in some of
    frame 0's pillars) to the frame's overflowed_features counter."""
    import dataclasses

    import cupy as cp

    from pointpillars_trt.config import FEATURE_NAMES
    from pointpillars_trt.kernels.pfn import PfnStage
    from pointpillars_trt.kernels.voxelize import VOXEL_STATS

    base = openpcdet_cfg
    cfg = dataclasses.replace(
        base, voxel=dataclasses.replace(base.voxel, max_points_per_pillar=points, max_pillars=3000),
        features=dataclasses.replace(base.features, order=FEATURE_NAMES[:features]),
        network=dataclasses.replace(base.network, pfn_channels=channels))
    rng = np.random.default_rng(3)
    m, c, out = points, features, channels
    weight, bias = rng.normal(0, 0.5, (out, c)).astype(np.float32), rng.normal(0, 0.5, out).astype(np.float32)
    stage = PfnStage(cfg, weight, bias, frames=3)
    threads, pillars_a_block = stage.params.block
    lives = (1237, 0, 2999)  # not a whole number of blocks' pillars; none; all but one
    assert lives[0] % pillars_a_block or pillars_a_block == 1
    pillars = np.zeros((len(lives), cfg.voxel.max_pillars, m, c), np.float32)
    for frame, live in enumerate(lives):
        pillars[frame, :live] = rng.normal(0, 2, (live, m, c))
        pillars[frame, :live, (m + 1) // 2 :] = 0  # padded slots, as the voxelizer leaves them
    pillars[0, 5:400:37, 0, c - 1] = 1e30  # a corrupt value: the channels of a positive weight overflow
    counts = np.zeros((len(lives), len(VOXEL_STATS)), np.int32)  # a row a frame, the count first
    counts[:, 0] = lives
    slot = VOXEL_STATS.index("overflowed_features")
    counts[:, slot] = 5  # added to, not set: the voxelizer zeroes it for each frame
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # inputs, poison and launch in one stream order
        d_pillars, d_counts = cp.asarray(pillars), cp.asarray(counts)
        stage.out.fill(np.nan)
        stage.launch(d_pillars, d_counts, stream, frames=len(lives))
    stream.synchronize()
    overflowed = d_counts[:, slot].get()
    for frame, live in enumerate(lives):
        x = pillars[frame, :live].astype(np.float64)
        expected = np.maximum(x @ weight.T.astype(np.float64) + bias, 0).max(axis=1)
        np.testing.assert_allclose(stage.out[frame, :live].get(), expected, rtol=1e-5, atol=1e-5)
        assert np.isnan(stage.out[frame, live:].get()).all(), "rows past the live count must not be written"
        assert overflowed[frame] == 5 + np.count_nonzero(expected > 65504), frame
    assert overflowed[0] > 5 + 5  # the corrupt values were counted


# --------------------------------------------------------------------------- batches and threads


@pytest.fixture(scope="module")
def batched(family_pair):  # type: ignore[no-untyped-def]
    _, _, gpu = family_pair
    pipe = GpuPipeline(gpu.model, backend=gpu.backend, tf32=False, max_batch=4)
    yield pipe
    pipe.close()


def _mixed_frames(assets) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(12)
    return [read_points(assets / SHARED_FRAMES[2]), _random_cloud(rng, 0), read_points(assets / SHARED_FRAMES[0]),
            _random_cloud(rng, 9000)]


def test_a_batch_gives_each_frame_its_batch_of_one_boxes(family_pair, batched, assets):  # type: ignore[no-untyped-def]
    """Frames of very different sizes (a full scan, an empty frame, a camera crop, random) in one batch:
    bit-identical to running each alone, and to the CPU oracle."""
    family, cpu, gpu = family_pair
    frames = _mixed_frames(assets)
    singles = [gpu.detect(f) for f in frames]
    for round_ in range(2):  # the second round replays the batch-4 graphs
        together = batched.detect_batch(frames)
        for i, (one, many) in enumerate(zip(singles, together)):
            assert one.boxes.tobytes() == many.boxes.tobytes() and one.scores.tobytes() == many.scores.tobytes(), i
            assert one.stats == many.stats
    for f, got in zip(frames, together):
        assert_same_detections(got, cpu.detect(f), f"{family} batch")
    partial = batched.detect_batch(frames[:3])  # a smaller batch than the pipeline's maximum
    assert all(a.boxes.tobytes() == b.boxes.tobytes() for a, b in zip(partial, singles[:3]))
    assert batched.graph_failures == {}
    grown = GpuPipeline(gpu.model, backend=gpu.backend, tf32=False)  # max_batch 1: grows on the first batch
    assert [d.boxes.tobytes() for d in grown.detect_batch(frames)] == [d.boxes.tobytes() for d in singles]
    assert grown.max_batch == 4
    grown.close()


@pytest.mark.parametrize("cuda_graph", [True, False])
def test_a_batch_of_seven_keeps_each_frames_boxes(family_pair, assets, cuda_graph):  # type: ignore[no-untyped-def]
    """Seven frames, each stage's launches running them all (a grid-stride kernel's blocks shared among
    them), in a captured graph and eagerly; each still gets its batch-of-one bytes."""
    _, _, gpu = family_pair
    frames = _mixed_frames(assets) + _mixed_frames(assets)[::-1][:3]
    singles = [gpu.detect(f) for f in frames]
    pipe = GpuPipeline(gpu.model, backend=gpu.backend, tf32=False, max_batch=len(frames), cuda_graph=cuda_graph)
    try:
        for _ in range(2):
            together = pipe.detect_batch(frames)
            for i, (one, many) in enumerate(zip(singles, together)):
                assert one.boxes.tobytes() == many.boxes.tobytes() and one.scores.tobytes() == many.scores.tobytes(), i
                assert one.stats == many.stats, i
        assert pipe.execution_mode == ("cuda_graph" if cuda_graph else "eager")
    finally:
        pipe.close()


def test_a_launch_failing_under_capture_is_the_error_reported(family_pair, assets, monkeypatch):  # type: ignore[no-untyped-def]
    """A stage's launch that raises under capture: the capture ends cleanly and the warning names that
    launch's error; each stage then replays a graph of its own, the voxelizer runs eagerly, and the
    bytes are unchanged."""
    _, _, gpu = family_pair
    frames = _mixed_frames(assets)
    singles = [gpu.detect(f) for f in frames]
    pipe = GpuPipeline(gpu.model, backend=gpu.backend, tf32=False, max_batch=len(frames), cuda_graph=True)
    try:
        launch = pipe._voxelize.launch

        def refusing(*args, **kwargs):  # type: ignore[no-untyped-def]
            if pipe.stream.is_capturing():
                raise RuntimeError("voxelize refused under capture")
            return launch(*args, **kwargs)

        monkeypatch.setattr(pipe._voxelize, "launch", refusing)
        with pytest.warns(RuntimeWarning, match="as one CUDA graph .*voxelize refused under capture"):
            together = pipe.detect_batch(frames)
        for i, (one, many) in enumerate(zip(singles, together)):
            assert one.boxes.tobytes() == many.boxes.tobytes() and one.scores.tobytes() == many.scores.tobytes(), i
        assert "voxelize" in pipe.graph_failures and "refused" in pipe.graph_failures["voxelize"]
    finally:
        pipe.close()


def test_one_h2d_and_one_d2h_copy_per_batch(batched, assets):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    frames = _mixed_frames(assets)
    batched.detect_batch(frames)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        batched.detect_batch(frames)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert len([n for n in names if "HtoD" in n]) == 1 and len([n for n in names if "DtoH" in n]) == 1, names
    assert batched.copies.h2d_copies == 1 and batched.copies.d2h_copies == 1
    assert batched.copies.h2d_bytes == sum(f.nbytes for f in frames) + 16 * HEADER_ROWS


def _files_and_each_alone(gpu, assets, folder, corrupt_at: int):  # type: ignore[no-untyped-def]
    """The mixed frames three times as .bin files in ``folder``, with a 20-byte corrupt file at place
    ``corrupt_at`` among their paths; and each frame's detections run alone on ``gpu``."""
    from pointpillars_trt.kitti import write_velodyne_bin

    frames = _mixed_frames(assets) * 3
    paths = []
    for index, points in enumerate(frames):
        paths.append(str(folder / f"{index:06d}.bin"))
        write_velodyne_bin(points, paths[-1])
    (folder / "corrupt.bin").write_bytes(b"\0" * 20)
    paths.insert(corrupt_at, str(folder / "corrupt.bin"))
    return paths, [gpu.detect(points) for points in frames]


@pytest.mark.parametrize("reader_processes", [0, 2])
def test_the_streaming_runner_equals_each_frame_alone(family_pair, assets, tmp_path, reader_processes):  # type: ignore[no-untyped-def]
    """Files read straight into pinned staging by the runner's reader threads, or by reader processes into
    shared staging page-locked in place, two pipelines of batch 3, full scans larger than a fresh staging
    buffer (restaged once, then read straight in), an empty frame and a corrupt file: each frame's boxes
    are the bytes of running it alone."""
    from pointpillars_trt.apps.frame_reads import read_batch
    from pointpillars_trt.apps.frames import FrameReader, FrameRunner, WorkerProcesses
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    paths, alone = _files_and_each_alone(gpu, assets, tmp_path, corrupt_at=5)
    detectors = [PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=3) for _ in range(2)]
    pool = WorkerProcesses(reader_processes, read_batch) if reader_processes else None
    notices: list[str] = []
    with FrameRunner(detectors, batch_size=3, read=FrameReader(detectors[0].cfg, point_dim=4, intensity_scale=None),
                     reader_processes=pool, notice=notices.append) as runner:
        assert notices == [] and (runner._shared is not None) == bool(reader_processes)
        for _ in range(2):
            jobs = list(runner.run(paths))
            assert [job.source for job in jobs] == paths
            assert "20 bytes, not a multiple of 16" in str(jobs[5].error)
            found = [job.detections for job in jobs if job.error is None]
            assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]
            assert [d.stats for d in found] == [d.stats for d in alone]
    assert all(d.gpu_pipeline.stage_timings is False and d.last_timings == {} for d in detectors)
    for detector in detectors:
        detector.close()


def test_the_streaming_runner_stages_in_ordinary_memory_once_page_locked_memory_runs_out(  # type: ignore[no-untyped-def]
        family_pair, assets, tmp_path, monkeypatch):
    """Page-locked memory that cannot be had for the runner's staging (CuPy's cudaErrorMemoryAllocation, forced at
    the runner's allocations: the pipelines' own are made before) ended the run in a traceback; now it is said once
    and the frames are staged in ordinary memory, each with its boxes of running it alone."""
    import cupy as cp

    from pointpillars_trt import staging
    from pointpillars_trt.apps.frames import FrameReader, FrameRunner
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    paths, alone = _files_and_each_alone(gpu, assets, tmp_path, corrupt_at=5)
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=3)

    def none_left(shape: tuple[int, ...], dtype: type) -> np.ndarray:
        raise cp.cuda.runtime.CUDARuntimeError(2)  # cudaErrorMemoryAllocation

    monkeypatch.setattr(staging, "empty_pinned", none_left)
    notices: list[str] = []
    with FrameRunner([detector], batch_size=3, read=FrameReader(detector.cfg, point_dim=4, intensity_scale=None),
                     notice=notices.append) as runner:
        jobs = list(runner.run(paths))
    detector.close()
    assert len(notices) == 1 and notices[0].startswith(
        "warning: page-locked memory for the frames' staging could not be had (cudaErrorMemoryAllocation"), notices
    assert "20 bytes, not a multiple of 16" in str(jobs[5].error)
    found = [job.detections for job in jobs if job.error is None]
    assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]


def _counting_staged_batches(pipeline):  # type: ignore[no-untyped-def]
    """The sizes of the batches ``pipeline.detect_staged`` runs from here on (the real call still runs)."""
    staged: list[int] = []
    detect_staged = pipeline.detect_staged

    def counted(staging, placed, *post_config):  # type: ignore[no-untyped-def]
        staged.append(len(placed))
        return detect_staged(staging, placed, *post_config)

    pipeline.detect_staged = counted
    return staged


def test_infer_many_reading_ahead_equals_each_frame_alone(family_pair, assets, tmp_path):  # type: ignore[no-untyped-def]
    """``infer_many`` on the GPU, groups read into their own pinned staging (from a list: two groups ahead, the
    staging sized from the files; from a generator: a fresh buffer too small for the first group's full scan
    and crop, that group run from copies and the buffers grown; batches of 16 on a pipeline of 3: grown to 8;
    batches of 2 on it: 2), a corrupt file among the frames: results in input order, the corrupt file's error
    alone, each frame's boxes the bytes of running it alone; every group but the one that did not fit runs
    straight from its staging."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    paths, alone = _files_and_each_alone(gpu, assets, tmp_path, corrupt_at=4)
    for frames, batch, staged_batches in ((paths, 3, [3, 2, 3, 3, 1]), ((path for path in paths), 3, [2, 3, 3, 1]),
                                          (paths, 16, [7, 5]), (paths, 2, [2, 2, 1, 2, 2, 2, 1])):
        with PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=3) as detector:
            staged = _counting_staged_batches(detector.gpu_pipeline)
            results = list(detector.infer_many(frames, batch_size=batch))
        assert [r.source for r in results] == paths
        assert "20 bytes, not a multiple of 16" in str(results[4].error)
        found = [r.detections for r in results if r.error is None]
        assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]
        assert [d.scores.tobytes() for d in found] == [d.scores.tobytes() for d in alone]
        assert staged == staged_batches


def test_infer_many_on_a_detector_closed_meanwhile_keeps_the_group_run_then_raises_once(family_pair, assets, tmp_path):  # type: ignore[no-untyped-def]
    """A caller that closes the detector after the first result: the group already run keeps its results, then the
    next result raises the closed detector's one error (each later frame had been read and given that error of its
    own), and nothing more is sent to the closed pipeline."""
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.errors import BackendError

    _, _, gpu = family_pair
    paths, alone = _files_and_each_alone(gpu, assets, tmp_path, corrupt_at=4)
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=3)
    staged = _counting_staged_batches(detector.gpu_pipeline)
    results = detector.infer_many(paths, batch_size=3)
    first = next(results)
    detector.close()
    run = [next(results), next(results)]  # the rest of the group already run
    with pytest.raises(BackendError, match="^this detector was closed before infer_many's results were all read"):
        next(results)
    assert [r.detections.boxes.tobytes() for r in [first, *run]] == [a.boxes.tobytes() for a in alone[:3]]
    assert staged == [3]


def test_stage_timings_off_skip_the_events_and_change_no_result(family_pair, assets):  # type: ignore[no-untyped-def]
    """With ``stage_timings`` off (the default) a batch records no CUDA event and leaves
    ``last_timings`` empty; its boxes are the timed graph's bytes; turned on again, the timings come back."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)[1:]
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=len(frames),
                            stage_timings=True)
    pipeline = detector.gpu_pipeline
    timed = detector.detect_batch(frames)
    assert set(pipeline.last_timings) == {*STAGES, "total"}
    pipeline.stage_timings = False
    for _ in range(2):  # the second replays the graphs
        untimed = detector.detect_batch(frames)
        assert pipeline.last_timings == {}
        assert [d.boxes.tobytes() for d in untimed] == [d.boxes.tobytes() for d in timed]
    pipeline.stage_timings = True
    detector.detect_batch(frames)
    assert set(pipeline.last_timings) == {*STAGES, "total"} and pipeline.last_timings["total"] > 0
    detector.close()


def test_submit_batch_copies_the_frames_before_it_returns(family_pair, assets):  # type: ignore[no-untyped-def]
    """``submit_batch`` (what a Triton instance runs, releasing the request's memory when it returns):
    overwriting the host frames before the GPU is done changes nothing; the boxes equal
    ``detect_batch``'s, bytes for bytes, and a second batch after the first's finish runs as well."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)[1:]
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=len(frames))
    expected = detector.detect_batch(frames)
    for _ in range(2):
        scratch = [frame.copy() for frame in frames]
        finish = detector.submit_batch(scratch)
        for frame in scratch:
            frame[:] = np.nan  # the request's memory, reused at once
        found = finish()
        assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in expected]
        assert [d.stats for d in found] == [d.stats for d in expected]
    detector.close()


def test_submit_batch_of_more_frames_than_max_batch_grows_the_pipeline(family_pair, assets):  # type: ignore[no-untyped-def]
    """``submit_batch`` of more frames than the detector's ``max_batch`` grows the pipeline once, as ``detect_batch``
    does (it was refused as "submit: expected 1..1 frames", where the CPU path ran them): each frame's boxes of
    running it alone."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)[1:]
    alone = [gpu.detect(points) for points in frames]
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False)
    found = detector.submit_batch(frames)()
    assert detector.gpu_pipeline.max_batch == len(frames)
    assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]
    detector.close()


def test_a_batch_whose_finish_is_dropped_uncalled_is_drained_by_the_next_call(family_pair, assets):  # type: ignore[no-untyped-def]
    """A ``finish`` dropped uncalled (a server request that failed between the halves) held the detector for good;
    the next call waits for that batch on the GPU, drops its detections and gives its own frame's boxes."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    first, second = _mixed_frames(assets)[2:]
    expected = gpu.detect(second)
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False)
    detector.submit_batch([first])  # its finish dropped at once
    found = detector(second)
    assert found.boxes.tobytes() == expected.boxes.tobytes() and found.scores.tobytes() == expected.scores.tobytes()
    detector.close()


def test_a_finish_called_again_gives_its_own_batch_not_the_next(family_pair, assets):  # type: ignore[no-untyped-def]
    """``finish`` called again after the next batch's ``submit_batch`` gives its own detections (it collected
    the next batch's, whose own finish then failed), and the next batch's finish gives that batch's."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    first, second = _mixed_frames(assets)[2:]
    expected = [gpu.detect(first), gpu.detect(second)]
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False)
    finish = detector.submit_batch([first])
    found = finish()
    finish_second = detector.submit_batch([second])
    assert finish() is found
    assert finish_second()[0].boxes.tobytes() == expected[1].boxes.tobytes()
    assert found[0].boxes.tobytes() == expected[0].boxes.tobytes()
    detector.close()


def test_a_larger_batch_that_cannot_be_allocated_leaves_the_pipeline_running_its_batches(family_pair, assets,  # type: ignore[no-untyped-def]
                                                                                         monkeypatch):
    """A larger batch that does not fit (CuPy's out-of-memory error, forced at the scatter stage's buffers) had
    already replaced the canvas, head maps, results and input buffers the captured graphs read and write: a batch
    of one then replayed a graph over freed memory. Nothing is replaced until everything is made: each frame gets
    its boxes, and the batch runs once there is room."""
    import cupy as cp

    from pointpillars_trt import gpu_pipeline

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)
    pipeline = GpuPipeline(gpu.model, backend=gpu.backend, tf32=False)
    alone = [pipeline.detect(points) for points in frames]  # the batch of one's graphs captured

    def no_room(*args: object, **kwargs: object) -> None:
        raise cp.cuda.memory.OutOfMemoryError(1 << 30, 0, 0)

    monkeypatch.setattr(gpu_pipeline, "ScatterStage", no_room)
    with pytest.raises(MemoryError):
        pipeline.detect_batch(frames)
    monkeypatch.undo()
    assert pipeline.max_batch == 1
    for points, expected in zip(frames, alone):
        got = pipeline.detect(points)
        assert got.boxes.tobytes() == expected.boxes.tobytes() and got.scores.tobytes() == expected.scores.tobytes()
    found = pipeline.detect_batch(frames)
    assert pipeline.max_batch == len(frames)
    assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]
    pipeline.close()


def test_a_larger_batch_refused_while_one_is_in_flight_leaves_its_buffers(family_pair, assets):  # type: ignore[no-untyped-def]
    """A ``detect_batch`` of more frames than ``max_batch`` while a submitted batch is in flight is refused before
    the pipeline grows (growing replaced the result buffers the batch in flight is read from): ``collect`` gives
    that batch's boxes."""
    from pointpillars_trt.errors import BackendError

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)
    expected = gpu.detect(frames[2])
    pipeline = GpuPipeline(gpu.model, backend=gpu.backend, tf32=False)
    pipeline.submit([frames[2]])
    with pytest.raises(BackendError, match="the previous batch is still in flight"):
        pipeline.detect_batch(frames)
    assert pipeline.max_batch == 1
    got = pipeline.collect()[0]
    np.testing.assert_array_equal(got.boxes, expected.boxes)
    np.testing.assert_array_equal(got.scores, expected.scores)
    pipeline.close()


def test_warm_up_captures_the_batchs_graphs_and_changes_no_result(family_pair, assets):  # type: ignore[no-untyped-def]
    """``warm_up([B])`` captures the graph of a batch of B; the first real batch then replays it (no
    new capture) and gives each frame's boxes of running it alone."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)[1:]  # within the first point capacity: no growth, which recaptures
    alone = [gpu.detect(points) for points in frames]
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=3)
    pipeline = detector.gpu_pipeline
    assert pipeline._graphs == {}
    detector.warm_up([3])
    captured = dict(pipeline._graphs)
    assert sorted(captured) == [("frame", 3)]
    found = detector.detect_batch(frames)
    assert pipeline._graphs == captured
    assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]
    detector.close()


def test_warm_up_at_the_runs_frame_size_leaves_nothing_to_grow(family_pair, assets):  # type: ignore[no-untyped-def]
    """``warm_up([B], points_per_frame=N)`` sizes the point buffers for B frames of N points (infer passes
    the largest of its first files): a batch holding a full scan then replays the warm-up's graphs (no
    growth, which recaptures) and gives each frame's boxes of running it alone."""
    from pointpillars_trt.detector import PointPillars

    _, _, gpu = family_pair
    frames = _mixed_frames(assets)
    alone = [gpu.detect(points) for points in frames]
    detector = PointPillars(gpu.model, device="cuda", backend=gpu.backend, tf32=False, max_batch=len(frames))
    pipeline = detector.gpu_pipeline
    detector.warm_up([len(frames)], points_per_frame=max(len(points) for points in frames))
    captured = dict(pipeline._graphs)
    assert pipeline.max_points >= sum(len(points) for points in frames)
    found = detector.detect_batch(frames)
    assert pipeline._graphs == captured
    assert [d.boxes.tobytes() for d in found] == [d.boxes.tobytes() for d in alone]
    detector.close()


def test_four_threads_share_one_detector(family_pair, assets):  # type: ignore[no-untyped-def]
    """4 threads x 50 frames on one pipeline give the sequential results, frame for frame."""
    from concurrent.futures import ThreadPoolExecutor

    _, _, gpu = family_pair
    frames = [read_points(assets / f) for f in SHARED_FRAMES]
    expected = [gpu.detect(f) for f in frames]

    def work(seed: int) -> list[bool]:
        order = np.random.default_rng(seed).integers(0, len(frames), 50)
        return [gpu.detect(frames[i]).boxes.tobytes() == expected[i].boxes.tobytes() for i in order]

    with ThreadPoolExecutor(4) as pool:
        assert all(all(ok) for ok in pool.map(work, range(4)))


@pytest.fixture(scope="module")
def fp16_models(assets, tmp_path_factory):  # type: ignore[no-untyped-def]
    from pointpillars_trt.convert.checkpoint import load_checkpoint

    ckpt = load_checkpoint(assets / CHECKPOINTS["openpcdet"])
    folder = tmp_path_factory.mktemp("fp16")
    return {p: export_model_dir(ckpt.weights, ckpt.config, folder / p, precision=p, source={}) for p in ("fp32", "fp16")}


def _fp16_agreement(model16: ModelDir, oracle: CpuDetector, backend: str, frames: list[np.ndarray]) -> float:
    """Largest score difference of the oracle's confident boxes (>= 0.2) to the nearest same-label box."""
    pipe = GpuPipeline(model16, backend=backend)
    worst = 0.0
    for points in frames:
        ref, got = oracle.detect(points), pipe.detect(points)
        for box, score, label in zip(ref.boxes[ref.scores >= 0.2], ref.scores[ref.scores >= 0.2],
                                     ref.labels[ref.scores >= 0.2]):
            dist = np.where(got.labels == label, np.linalg.norm(got.boxes[:, :2] - box[:2], axis=1), np.inf)
            assert dist.size and dist.min() < 0.1, (backend, box, score)
            worst = max(worst, float(abs(got.scores[int(np.argmin(dist))] - score)))
    pipe.close()
    return worst


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_engines_agree_with_the_fp32_oracle(fp16_models, assets, backend):  # type: ignore[no-untyped-def]
    """fp16 (float16 canvas and convs, float32 accumulation): every confident box of the IEEE fp32 CPU
    oracle is found within 10 cm with its label and a score within 1e-2; the cuDNN engine does at least as
    well as ONNX Runtime's fp16 where both are installed."""
    oracle = CpuDetector(fp16_models["fp32"])
    frames = [read_points(assets / f) for f in SHARED_FRAMES]
    worst = _fp16_agreement(fp16_models["fp16"], oracle, backend, frames)
    print(f"{backend} fp16: worst confident-box score difference {worst:.2e}")
    assert worst < 1e-2
    if backend == "cudnn" and "onnxruntime" in BACKENDS:
        assert worst <= 1.5 * _fp16_agreement(fp16_models["fp16"], oracle, "onnxruntime", frames) + 1e-4
    oracle.close()


@pytest.mark.parametrize("batch", [2, 3, 5, 7, 8])
def test_fp16_batches_give_each_frame_its_batch_of_one_boxes(fp16_models, assets, tmp_path, batch):  # type: ignore[no-untyped-def]
    """fp16 at batches where some cuDNN engines tuned at batch 1 computed a batch's last frame differently
    (a score 0.07 off at 3 and 8), or where the tuning took another engine (2, 3 on one machine): every
    frame, the last included, gets batch 1's boxes; bit for bit where each conv's engine gives batch 1's
    bytes (batch 1's own, or another checked to), else within rounding."""
    options = {"backend": "cudnn"} if "cudnn" in BACKENDS else {"backend": BACKENDS[0]}
    alone = GpuPipeline(fp16_models["fp16"], **options)
    pipe = GpuPipeline(fp16_models["fp16"], max_batch=batch, **options)
    frames = ([read_points(assets / f) for f in SHARED_FRAMES[:2]] * batch)[:batch]
    want = [alone.detect(points) for points in frames]
    got = pipe.detect_batch(frames)
    layers = getattr(pipe._rpn, "_plans", {}).get(batch, {})
    invariant = bool(layers) and all(plan.entry.get("same_as_batch") == 1 for plan in layers.values())
    print(f"batch {batch}: {'bit for bit' if invariant else 'within rounding'} "
          f"({sum(plan.entry.get('same_as_batch') == 1 for plan in layers.values())} of {len(layers)} conv shapes exact)")
    # a conv runs an engine that changes its bytes only where none of the tuned candidates keeps them
    assert all(plan.entry.get("same_as_batch") == 1 or plan.entry.get("no_exact_candidate") == 1
               for plan in layers.values()), {k: plan.entry.get("plan_name") for k, plan in layers.items()}
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), (i, len(g), len(w))
        assert float(np.abs(g.scores - w.scores).max(initial=0)) < 1e-2, i
        if invariant:
            assert g.boxes.tobytes() == w.boxes.tobytes(), i
    alone.close()
    pipe.close()
