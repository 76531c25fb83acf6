"""The RPN on the NVIDIA cuDNN frontend: fused conv + bias + ReLU graphs for the convs, kernels of ours for the rest.

Tensors (batch dynamic up to ``CudnnOptions.max_batch``):

* input ``canvas`` (B, ny, nx, pfn_channels): float16 for precision fp16, float32 otherwise; for IEEE
  fp32 (precision fp32, single-head models) channel-major, (B, pfn_channels, ny, nx), as every backbone
  activation then is (:func:`channels_first`);
* output ``heads`` (B, hy, hx, cls + box + dir) float32, each part in the ONNX heads' channel order.

Every conv is one cuDNN graph (conv_fprop -> bias -> ReLU), one per distinct shape and batch, built
when a batch is first bound; the neck (transposed convs, kernel == stride) and the 1x1 heads are
:class:`~pointpillars_trt.kernels.neck_head.NeckHeadStage`. ``run`` only enqueues, on the caller's stream,
no host sync, no allocation, so the pipeline can capture it in a CUDA graph: for a single-head (KITTI)
model the 16 backbone convs and one kernel for the neck and heads; for a multi-head (nuScenes) model the
backbone convs, one kernel a neck branch, the shared and middle convs, and one kernel for the heads.

The plan of each conv shape is picked once (cuDNN heuristics, then timing of the first candidates
when ``autotune``), serialized and cached under ``plan_cache_dir`` (default ``cudnn/`` in the user
cache, ``file_writes.user_cache_dir``: never the model dir, whose one
writer is ``build``) in one JSON file per batch, keyed by cuDNN and frontend versions, GPU name and
compute capability, config digest, precision and batch. A missing, corrupt or mismatching entry is
rebuilt. Above batch 1, each conv runs the fastest candidate (batch 1's engine among them) that,
checked on random inputs, gives every frame of the batch batch 1's bytes (a frame's boxes then do not
depend on its batch); else the fastest that agrees within rounding.

``import cudnn`` (without PyTorch: :func:`frontend`) and ``import cupy`` happen only when an engine is
activated or its availability is probed (:func:`cudnn_unavailable_reason`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

import numpy as np

from ..config import ModelConfig
from ..errors import BackendError, InputError, safe_repr
from ..file_reads import read_regular_file
from ..file_writes import user_cache_dir, write_bytes_atomic
from ..graph_io import RPN_INPUT, RPN_OUTPUT
from ..kernels.hold import gpu_ms
from ..kernels.tuning_checks import TuningChecks
from ..model_dir import CheckedFile, graph_initializers, graph_to_open
from ..strict_json import loads_json
from .base import Engine, Shape, TensorSpec
from .cudnn_multihead import Getter, head_branch_names, initializer_getter, read_multihead_weights
from .lean_import import import_without
from .options import CudnnOptions

MIN_CUDNN_VERSION = 90500
INSTALL_HINT = "pip install 'pointpillars-trt[cuda13]'"
#: 2: batches above 1 reuse batch 1's engine per conv (batch-invariant output); 3: a batch's plans are
#: checked against batch 1's on random inputs before they are used or cached; 4: no plan needs more
#: than MAX_WORKSPACE; 5: IEEE fp32 plans are channel-major (NCHW); 6: a batch tuned on its own takes an
#: engine whose frames equal batch 1's bit for bit where one of the candidates does; 7: every frame of a
#: batch is checked (not its first and last), and candidates are timed behind a held stream; 8: above batch
#: 1, batch 1's engine is one of the timed candidates, not taken untimed
PLAN_CACHE_FORMAT = 8
TUNE_CANDIDATES = 6   # heuristic plans built and timed per conv shape when autotuning
#: Largest workspace a plan may ask for: some IEEE fp32 engines of wide convs ask for tens of GB.
MAX_WORKSPACE = 256 * 2**20
TUNE_ITERS = 20       # executions a timing round; a candidate's time is its best of TUNE_ROUNDS rounds
TUNE_ROUNDS = 3       # (one round of these ~15 µs convs gave fp16 RPNs of 0.26-0.31 ms from one tuning to the next)
TUNE_HOLD_MS = 1.0    # a round waits behind this much GPU time: more than the host takes to queue its executions


def cudnn_unavailable_reason() -> str | None:
    """None when this engine can run here; otherwise one line naming what is missing."""
    try:
        import cupy
    except ImportError:
        return f"CuPy is not installed ({INSTALL_HINT})"
    try:
        cudnn = frontend()
    except ImportError as exc:
        if importlib.util.find_spec("cudnn") is None:
            return f"nvidia-cudnn-frontend is not installed ({INSTALL_HINT})"
        return f"nvidia-cudnn-frontend does not import ({exc})"
    except Exception as exc:  # the frontend imports but cannot load libcudnn
        return f"nvidia-cudnn-frontend does not load: {type(exc).__name__}: {exc}"
    try:
        version = int(cudnn.backend_version())
    except Exception as exc:
        return f"the cuDNN library is not loadable ({type(exc).__name__}: {exc}); cuDNN >= 9.5 is needed"
    if version < MIN_CUDNN_VERSION:
        return f"cuDNN {_version_text(version)} is too old: cuDNN >= 9.5 is needed"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device ({exc})"
    return None if count > 0 else "no CUDA device"


def frontend() -> ModuleType:
    """The cuDNN frontend module (``cudnn``), imported without PyTorch unless the process has it already
    (:func:`~pointpillars_trt.runtime.lean_import.import_without`): this engine hands it device pointers,
    never torch tensors."""
    return import_without("cudnn", ["torch"])


def _version_text(version: int) -> str:
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


# -- plan cache key -----------------------------------------------------------------------------


def plan_cache_key(
    *, cudnn_version: int, frontend_version: str, gpu_name: str, compute_capability: str,
    config_digest: str, precision: str, batch: int,
) -> dict[str, Any]:
    """Everything a cached plan depends on; a file whose stored key differs is rebuilt."""
    return {
        "format": PLAN_CACHE_FORMAT, "cudnn": int(cudnn_version), "frontend": str(frontend_version),
        "gpu": str(gpu_name), "compute_capability": str(compute_capability), "config_digest": str(config_digest),
        "precision": str(precision), "batch": int(batch),
    }


def plan_cache_name(key: Mapping[str, Any]) -> str:
    """File name of a key: readable prefix + a hash of every component."""
    digest = hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:16]
    return f"rpn_{key['precision']}_b{key['batch']}_{digest}.json"


# -- weights ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvLayer:
    """One backbone conv (3 x 3, padding 1): its channels, stride and input height x width."""

    block: int
    index: int
    in_channels: int
    out_channels: int
    stride: int
    in_hw: tuple[int, int]
    label: str = ""  # a conv after the backbone (a multi-head model's "shared" and "heads.middle")

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((d + 2 - 3) // self.stride + 1 for d in self.in_hw)  # type: ignore[return-value]

    @property
    def shape_key(self) -> str:
        """Convs sharing this string share one cuDNN graph and plan."""
        h, w = self.in_hw
        return f"{h}x{w}x{self.in_channels}-{self.out_channels}s{self.stride}"

    @property
    def name(self) -> str:
        return self.label or f"block{self.block}.conv{self.index}"


def rpn_conv_layers(cfg: ModelConfig) -> list[ConvLayer]:
    """The backbone convs in order; checks that every upsampled branch lands on the head map."""
    net = cfg.network
    nx, ny, _ = cfg.voxel.grid
    hx, hy = cfg.head_map
    hw, cin = (ny, nx), net.pfn_channels
    layers: list[ConvLayer] = []
    for i, (n, stride, cout, up) in enumerate(
        zip(net.layer_nums, net.layer_strides, net.block_channels, net.upsample_strides)
    ):
        for j in range(n + 1):
            layer = ConvLayer(i, j, cin if j == 0 else cout, cout, stride if j == 0 else 1, hw)
            layers.append(layer)
            hw = layer.out_hw
        if (hw[0] * up, hw[1] * up) != (hy, hx):
            raise BackendError(
                f"block{i}: output {hw[0]} x {hw[1]} upsampled by {up} is not the head map {hy} x {hx}. "
                "Note: Expected the config's strides to meet at the head map"
            )
        cin = cout
    return layers


def engine_conv_layers(cfg: ModelConfig) -> list[ConvLayer]:
    """Every conv the engine runs on cuDNN: the backbone's, then for a multi-head model its shared conv
    and all its heads' middle convs as one (``cudnn_multihead``)."""
    layers = rpn_conv_layers(cfg)
    if cfg.heads is None:
        return layers
    hx, hy = cfg.head_map
    shared, middle = cfg.heads.shared_channels, cfg.heads.middle_channels
    branches = len(head_branch_names(cfg))
    return layers + [
        ConvLayer(-1, 0, cfg.network.head_in_channels, shared, 1, (hy, hx), "shared"),
        ConvLayer(-1, 1, shared, middle * branches, 1, (hy, hx), "heads.middle"),
    ]


@dataclass(frozen=True)
class RpnWeights:
    """BN-folded RPN weights in the ONNX layouts (float32 copies of the stored initializers)."""

    convs: tuple[tuple[np.ndarray, np.ndarray], ...]  # per ConvLayer: (Cout, Cin, 3, 3), (Cout,)
    deconvs: tuple[tuple[np.ndarray, np.ndarray], ...]  # (Cin, CU, k, k), (CU,)
    head_weight: np.ndarray  # (NH, sum CU)
    head_bias: np.ndarray    # (NH,)


def read_rpn_weights(initializers: Mapping[str, np.ndarray], cfg: ModelConfig) -> RpnWeights:
    """Pick and check the RPN initializers; the head is the merged ``head.*`` or cls | box | dir concatenated."""
    get = initializer_getter(initializers)
    net = cfg.network
    convs = backbone_conv_weights(get, cfg)
    deconvs = tuple(
        (get(f"deblock{i}.weight", (cin, cu, k, k)), get(f"deblock{i}.bias", (cu,)))
        for i, (cin, cu, k) in enumerate(zip(net.block_channels, net.upsample_channels, net.upsample_kernels))
    )
    cin = net.head_in_channels
    parts = cfg.head_channels  # cls, box, dir in head order
    nh = sum(parts.values())
    if "head.weight" in initializers:
        head_w = get("head.weight", (nh, cin, 1, 1)).reshape(nh, cin)
        head_b = get("head.bias", (nh,))
    else:
        head_w = np.concatenate([get(f"head.{n}.weight", (c, cin, 1, 1)).reshape(c, cin) for n, c in parts.items()])
        head_b = np.concatenate([get(f"head.{n}.bias", (c,)) for n, c in parts.items()])
    return RpnWeights(convs, deconvs, head_w, head_b)


def backbone_conv_weights(get: Getter, cfg: ModelConfig) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(weight (Cout, Cin, 3, 3), bias) of every backbone conv, by its ONNX initializer names."""
    return tuple(
        (get(f"{l.name}.weight", (l.out_channels, l.in_channels, 3, 3)), get(f"{l.name}.bias", (l.out_channels,)))
        for l in rpn_conv_layers(cfg)
    )


def channels_first(cfg: ModelConfig, precision: str) -> bool:
    """Whether the engine's canvas and backbone activations are NCHW: for IEEE fp32 (single-head models),
    whose cuDNN convs are channel-major kernels; NHWC tensors would get a transpose before and after
    each (0.30 of a 2.94 ms RPN on an H200). fp16 and tf32 convs run NHWC kernels."""
    return precision == "fp32" and cfg.heads is None


def conv_filter(weight: np.ndarray, channels_first: bool) -> np.ndarray:
    """ONNX conv weight (K, C, R, S) -> cuDNN's filter: KCRS as it is for NCHW convs, else KRSC."""
    return np.ascontiguousarray(weight if channels_first else weight.transpose(0, 2, 3, 1))


def layout_strides(c: int, h: int, w: int, channels_first: bool) -> list[int]:
    """cuDNN dims are (N, C, H, W); these strides put W innermost (NCHW), else channels (NHWC). N's stride is
    a whole (C, H, W) item's either way, so N itself is not needed."""
    return [c * h * w, h * w, w, 1] if channels_first else [h * w * c, 1, w * c, c]


# -- the engine ---------------------------------------------------------------------------------

#: The buffer each conv after the backbone (a multi-head model's) reads.
_AFTER_BACKBONE = {"shared": "neck", "heads.middle": "shared"}


@dataclass
class _ConvPlan:
    graph: Any
    uids: dict[str, int]
    workspace: int
    entry: dict[str, Any]  # what the cache file stores for this shape


class CudnnEngine(Engine):
    """The RPN as cuDNN frontend graphs + the neck-head kernel; see the module docstring for the tensors.

    ``path`` is the model dir's ``rpn.onnx`` (its BN-folded initializers are the weights); ``cfg`` the
    model config it was exported from (the engine opens no model dir itself); ``checked``: that file's bytes
    where the caller has them (``ModelDir.take_checked_files``), read in their place; else the file is read, and
    checked against ``CudnnOptions.graph_sha256`` where given (``graph_to_open``).
    """

    backend = "cudnn"

    def __init__(self, path: str | Path, cfg: ModelConfig, options: CudnnOptions | None = None,
                 checked: CheckedFile | None = None) -> None:
        super().__init__(path, "cuda")
        self._checked = checked  # taken by the first load
        self.options = options if options is not None else CudnnOptions()
        if not isinstance(self.options, CudnnOptions):
            raise BackendError(f"CudnnEngine: options must be CudnnOptions, received {type(self.options).__name__}")
        self._cfg = cfg
        self.build_log: list[dict[str, Any]] = []  # per prepared batch: plan source and seconds
        self._reset()

    def _reset(self) -> None:
        self._cp: Any = None
        self._cudnn: Any = None
        self._handle: Any = None
        self._ptrs: dict[str, tuple[int, Shape]] = {}
        self._plans: dict[int, dict[str, _ConvPlan]] = {}
        self._buffers: dict[str, Any] = {}
        self._capacity = 0
        self._workspace: Any = None
        self._steps: list[Any] | None = None  # per run: (cuDNN graph, its pointers) or a kernel launch(stream)
        self._streams: dict[int, Any] = {}
        self._neck: Any = None  # once active: NeckHeadStage, or MultiHeadRpnKernels for a multi-head model

    @property
    def cfg(self) -> ModelConfig:
        return self._cfg

    @property
    def plan_cache_dir(self) -> Path:
        return self.options.plan_cache_dir or user_cache_dir() / "cudnn"

    # -- lifecycle -------------------------------------------------------------------------------

    def _load(self) -> list[TensorSpec]:
        reason = cudnn_unavailable_reason()
        if reason is not None:
            raise BackendError(f"cuDNN engine unavailable: {reason}")
        import cupy as cp

        cudnn = frontend()

        from ..kernels.multihead_rpn import MultiHeadRpnKernels
        from ..kernels.neck_head import NeckHeadParams, NeckHeadStage, NeckHeadWeights

        cfg, opt = self.cfg, self.options
        if opt.config_digest is not None and opt.config_digest != cfg.digest():
            raise BackendError(
                f"{safe_repr(self.path)}: config digest {cfg.digest()} ({cfg.name}). Note: Expected {opt.config_digest}"
            )
        self._layers = engine_conv_layers(cfg)
        checked, self._checked = self._checked, None
        initializers = graph_initializers(self.path, graph_to_open(self.path, checked, opt.graph_sha256))
        if cfg.heads is None:
            weights = read_rpn_weights(initializers, cfg)
            convs = list(weights.convs)
        else:
            get = initializer_getter(initializers)
            multi = read_multihead_weights(get, cfg)
            convs = [*backbone_conv_weights(get, cfg), multi.shared, multi.middle]
        self._cp, self._cudnn = cp, cudnn
        self._device = cp.cuda.Device(opt.device_id)
        dtype = opt.dtype
        self.channels_first_input = nchw = channels_first(cfg, opt.precision)
        try:
            with self._device:
                self._handle = cudnn.create_handle()
                self._conv_weights = [
                    (cp.asarray(conv_filter(w, nchw).astype(dtype)), cp.asarray(b.astype(dtype))) for w, b in convs
                ]
                half = opt.precision == "fp16"
                if cfg.heads is None:
                    nh_weights = NeckHeadWeights(
                        tuple(w for w, _ in weights.deconvs), tuple(b for _, b in weights.deconvs),
                        weights.head_weight, weights.head_bias,
                    )
                    params = NeckHeadParams.from_config(cfg, half, tf32=opt.precision == "tf32", channels_first=nchw)
                    self._neck = NeckHeadStage(params.for_gpu(self._device.compute_capability), nh_weights)
                else:
                    self._neck = MultiHeadRpnKernels(multi.neck, multi.heads, cfg.heads.middle_channels,
                                                     sum(cfg.head_channels.values()), opt.precision)
                props = cp.cuda.runtime.getDeviceProperties(opt.device_id)
                self._gpu = (props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
                             f"{props['major']}.{props['minor']}")
        except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.memory.OutOfMemoryError) as exc:
            self._release()
            raise BackendError(f"cuDNN engine: CUDA error while loading {self.file_name}: {exc}") from exc
        nx, ny, _ = cfg.voxel.grid
        hx, hy = cfg.head_map
        return [
            TensorSpec(RPN_INPUT, (-1, *self._activation_shape(cfg.network.pfn_channels, ny, nx)), dtype, True),
            TensorSpec(RPN_OUTPUT, (-1, hy, hx, sum(cfg.head_channels.values())), np.dtype(np.float32), False),
        ]

    def _unload(self) -> None:
        if self._cp is not None:
            with self._device:
                self._cp.cuda.runtime.deviceSynchronize()  # nothing in flight reads what is freed below
        self._release()

    def _release(self) -> None:
        if self._handle is not None:
            try:
                self._cudnn.destroy_handle(self._handle)
            except Exception:
                pass
        self._conv_weights = []
        self._neck = None
        self._reset()

    # -- binding: graphs, buffers and the call list are made here, outside the hot path -----------

    def _bind(self, spec: TensorSpec, ptr: int, shape: Shape) -> None:
        if shape[0] > self.options.max_batch:
            raise BackendError(
                f"{spec.role} tensor: {spec.name} | Received batch {shape[0]}. "
                f"Note: Expected at most CudnnOptions.max_batch = {self.options.max_batch}"
            )
        self._ptrs[spec.name] = (ptr, shape)
        self._steps = None
        if len(self._ptrs) == 2 and self._ptrs[RPN_INPUT][1][0] == self._ptrs[RPN_OUTPUT][1][0]:
            with self._device:
                self._prepare(self._ptrs[RPN_INPUT][1][0])

    def _prepare(self, batch: int) -> None:
        cp = self._cp
        t0 = time.perf_counter()
        source = "loaded"
        try:
            # A batch size prepared before (its plans kept, the buffers and the workspace large enough)
            # is only re-packed: the device is synchronised only when memory changes hands, so an
            # eager pipeline switching batch sizes never stalls the other pipelines on its GPU.
            changed = batch > self._capacity or batch not in self._plans
            if batch > self._capacity:
                self._allocate(batch)
            if batch not in self._plans:
                self._plans[batch], source = self._plans_for(batch)
                if source != "cache":  # tuning's inputs, outputs and workspaces (1.3 GiB at batch 8) go back
                    cp.cuda.runtime.deviceSynchronize()  # to the device, not to CuPy's pool for the
                    cp.get_default_memory_pool().free_all_blocks()  # process's lifetime
            need = max([p.workspace for p in self._plans[batch].values()] + [1])
            if self._workspace is None or self._workspace.nbytes < need:
                self._workspace, changed = cp.empty(need, np.uint8), True
            if changed:
                cp.cuda.runtime.deviceSynchronize()
        except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.memory.OutOfMemoryError) as exc:
            raise BackendError(f"cuDNN engine: CUDA error while preparing batch {batch}: {exc}") from exc
        plans = self._plans[batch]
        convs = []
        for k, layer in enumerate(self._layers):
            plan = plans[layer.shape_key]
            pack = self._pack(plan.uids, k, self._activation_ptr(k, batch, input_side=True),
                              self._activation_ptr(k, batch, input_side=False))
            convs.append((plan.graph, pack))
        heads_ptr, _ = self._ptrs[RPN_OUTPUT]
        hx, hy = self.cfg.head_map
        out_shape = (batch, hy, hx, sum(self.cfg.head_channels.values()))
        mem = cp.cuda.UnownedMemory(heads_ptr, int(np.prod(out_shape)) * 4, self)
        out = cp.ndarray(out_shape, np.float32, cp.cuda.MemoryPointer(mem, 0))
        branches = len(self.cfg.network.layer_nums)
        feats = [self._buffers[f"feature{i}"][:batch] for i in range(branches)]
        neck = self._neck
        if self.cfg.heads is None:  # backbone, then the neck and 1x1 heads in one kernel
            neck.check(feats, out)
            self._steps = [*convs, lambda stream: neck.launch(feats, out, stream, checked_batch=batch)]
        else:  # backbone, neck branches, shared + middle convs, output convs
            concat = self._buffers["neck"][:batch]
            offsets = np.cumsum([0, *self.cfg.network.upsample_channels]).tolist()
            middle = self._buffers["heads.middle"][:batch]
            upsample = [lambda stream, i=i: neck.launch_neck(i, feats[i], concat, offsets[i], stream)
                        for i in range(branches)]
            self._steps = [*convs[:-2], *upsample, *convs[-2:], lambda stream: neck.launch_heads(middle, out, stream)]
        self.build_log.append({"batch": batch, "plans": source, "seconds": round(time.perf_counter() - t0, 3)})

    def _activation_shape(self, c: int, h: int, w: int) -> tuple[int, int, int]:
        """One frame's activation of ``c`` channels at ``h`` x ``w`` in the engine's layout."""
        return (c, h, w) if self.channels_first_input else (h, w, c)

    def _allocate(self, batch: int) -> None:
        """Activation buffers for ``batch``: one per branch (each block's last conv) + two to ping-pong; all made
        before the old ones are let go, so that a batch that does not fit leaves the engine running the ones before."""
        cp, dtype = self._cp, self.options.dtype
        buffers = {}
        scratch = 0
        for i in range(len(self.cfg.network.layer_nums)):
            last = [l for l in self._layers if l.block == i][-1]
            h, w = last.out_hw
            buffers[f"feature{i}"] = cp.zeros((batch, *self._activation_shape(last.out_channels, h, w)), dtype)
            scratch = max(scratch, max(l.out_hw[0] * l.out_hw[1] * l.out_channels for l in self._layers if l.block == i))
        buffers["scratch0"] = cp.zeros(batch * scratch, dtype)
        buffers["scratch1"] = cp.zeros(batch * scratch, dtype)
        if self.cfg.heads is not None:  # the neck's concat, then the shared and middle convs' outputs
            hx, hy = self.cfg.head_map
            buffers["neck"] = cp.zeros((batch, hy, hx, self.cfg.network.head_in_channels), dtype)
            for layer in self._layers[-2:]:
                buffers[layer.label] = cp.zeros((batch, hy, hx, layer.out_channels), dtype)
        self._buffers, self._capacity = buffers, batch

    def _activation_ptr(self, k: int, batch: int, *, input_side: bool) -> int:
        """Device pointer of conv ``k``'s input (``input_side``) or output: canvas, a branch feature or scratch."""
        layers = self._layers
        layer = layers[k]
        if layer.label:  # after the backbone: neck concat -> shared -> heads.middle
            return int(self._buffers[_AFTER_BACKBONE[layer.label] if input_side else layer.label].data.ptr)
        if input_side:
            if k == 0:
                return self._ptrs[RPN_INPUT][0]
            return self._activation_ptr(k - 1, batch, input_side=False)
        if k + 1 == len(layers) or layers[k + 1].block != layer.block:
            return int(self._buffers[f"feature{layer.block}"].data.ptr)
        first = next(i for i, l in enumerate(layers) if l.block == layer.block)
        return int(self._buffers[f"scratch{(k - first) % 2}"].data.ptr)

    # -- the hot path ------------------------------------------------------------------------------

    def _run(self, stream_ptr: int) -> None:
        if self._steps is None:
            (_, cs), (_, hs) = self._ptrs[RPN_INPUT], self._ptrs[RPN_OUTPUT]
            raise BackendError(
                f"Input tensor: {RPN_INPUT} | Received batch {cs[0]}, but {RPN_OUTPUT} has batch {hs[0]}. "
                "Note: Expected the same batch for both"
            )
        stream = self._streams.get(stream_ptr)
        if stream is None:  # a Python wrapper of the caller's stream, made once per stream
            with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for protocol objects; a raw pointer has none
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = self._streams[stream_ptr] = self._cp.cuda.ExternalStream(stream_ptr, self.options.device_id)
        ws = int(self._workspace.data.ptr)
        self._cudnn.set_stream(handle=self._handle, stream=stream_ptr)
        for step in self._steps:
            if not isinstance(step, tuple):
                step(stream)  # one of our kernels (a failed launch raises BackendError itself)
                continue
            graph, pack = step
            try:
                graph._execute(pack, ws, self._handle)
            except Exception as exc:  # cuDNN errors surface as RuntimeError from the frontend
                raise BackendError(f"cuDNN engine: execution failed: {exc}") from exc

    # -- plans -------------------------------------------------------------------------------------

    def plan_cache_key(self, batch: int) -> dict[str, Any]:
        self._require_active()
        return plan_cache_key(
            cudnn_version=int(self._cudnn.backend_version()), frontend_version=str(self._cudnn.__version__),
            gpu_name=self._gpu[0], compute_capability=self._gpu[1], config_digest=self.cfg.digest(),
            precision=self.options.precision, batch=batch,
        )

    def _plans_for(self, batch: int) -> tuple[dict[str, _ConvPlan], str]:
        """One plan per conv shape: from the cache file where it holds a usable entry, else built (and saved)."""
        key = self.plan_cache_key(batch)
        path = self.plan_cache_dir / plan_cache_name(key)
        cached = _read_cache(path, key)
        plans: dict[str, _ConvPlan] = {}
        built = 0
        single = None
        for layer in self._layers:
            if layer.shape_key in plans:
                continue
            plan = self._plan_from_entry(layer, batch, cached.get(layer.shape_key))
            alone = None
            if plan is None and batch > 1:
                if single is None:
                    if 1 not in self._plans:  # kept: loading what was just built would mean two live copies
                        self._plans[1] = self._plans_for(1)[0]
                    single = self._plans[1]
                alone = single[layer.shape_key]
            if plan is None:
                plan = self._tune(layer, batch, alone)
            if plan.entry is not cached.get(layer.shape_key):
                built += 1
            plans[layer.shape_key] = plan
        if built:
            doc = {"key": key, "layers": {k: p.entry for k, p in plans.items()}}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
            except OSError:
                pass  # a plan cache that cannot be written only costs the next start its tuning
        return plans, ("cache" if not built else f"built {built} of {len(plans)} shapes")

    def _graph(self, layer: ConvLayer, batch: int) -> tuple[Any, dict[str, Any]]:
        """conv_fprop -> bias -> ReLU for ``layer`` at ``batch`` in the engine's layout, lowered to a cuDNN
        operation graph."""
        c = self._cudnn
        io = c.data_type.HALF if self.options.precision == "fp16" else c.data_type.FLOAT
        g = c.pygraph(io_data_type=io, intermediate_data_type=c.data_type.FLOAT,
                      compute_data_type=c.data_type.FLOAT, handle=self._handle)
        (h, w), (p, q) = layer.in_hw, layer.out_hw
        cin, cout = layer.in_channels, layer.out_channels
        nchw = self.channels_first_input
        x = g.tensor(name="X", dim=[batch, cin, h, w], stride=layout_strides(cin, h, w, nchw), data_type=io)
        wt = g.tensor(name="W", dim=[cout, cin, 3, 3], stride=layout_strides(cin, 3, 3, nchw), data_type=io)
        bt = g.tensor(name="B", dim=[1, cout, 1, 1], stride=layout_strides(cout, 1, 1, nchw), data_type=io)
        y = g.conv_fprop(image=x, weight=wt, padding=[1, 1], stride=[layer.stride] * 2, dilation=[1, 1],
                         compute_data_type=c.data_type.FLOAT)
        y = g.relu(input=g.bias(input=y, bias=bt))
        y.set_output(True).set_data_type(io).set_dim([batch, cout, p, q]).set_stride(layout_strides(cout, p, q, nchw))
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
        notes = [c.numerical_note.REDUCED_PRECISION_REDUCTION]
        if self.options.precision == "fp32":  # IEEE: no TF32 tensor-core engines, no down-converting ones
            notes += [c.numerical_note.TENSOR_CORE, c.numerical_note.DOWN_CONVERT_INPUTS]
        g.deselect_numeric_notes(notes)
        return g, {"X": x, "W": wt, "B": bt, "Y": y}

    def _graph_plan(self, layer: ConvLayer, batch: int, index: int) -> _ConvPlan:
        """A fresh graph with only candidate ``index`` built (execute() and serialize() both mean it)."""
        g, tensors = self._graph(layer, batch)
        g.build_plan_at_index(index)
        return _ConvPlan(g, {k: int(t.get_uid()) for k, t in tensors.items()}, int(g.get_workspace_size()), {})

    def _tune(self, layer: ConvLayer, batch: int, alone: _ConvPlan | None = None) -> _ConvPlan:
        """Build the first heuristic candidates, time them on the engine's buffers, keep the fastest
        (above batch 1: the fastest whose frames equal what ``alone``, batch 1's plan, gives them bit for
        bit, else the fastest that agrees within rounding). Above batch 1, batch 1's engine is the first
        candidate: it usually keeps the bytes, but at batch 8 it was ~11 % slower than the fastest that does."""
        g, tensors = self._graph(layer, batch)
        order = list(range(g.get_execution_plan_count()))
        if alone is not None:
            same = next((i for i in order if _plan_name(g, i) == alone.entry.get("plan_name")), None)
            if same is not None:
                order.remove(same)
                order.insert(0, same)
        built: list[int] = []
        errors: list[str] = []
        for i in order:
            if len(built) >= (TUNE_CANDIDATES if self.options.autotune else 1):
                break
            try:
                g.build_plan_at_index(i)
            except Exception as exc:
                errors.append(f"{i}: {exc}")
                continue
            workspace = int(g.get_workspace_size_plan_at_index(i))
            if workspace > MAX_WORKSPACE:
                errors.append(f"{i}: needs {workspace >> 20} MiB of workspace")
                continue
            built.append(i)
        if not built:
            what = " IEEE fp32 (non-tensor-core)" if self.options.precision == "fp32" else ""
            raise BackendError(
                f"cuDNN offers no{what} engine for {layer.name} ({layer.shape_key}, batch {batch}). "
                f"Note: {'use precision tf32 or fp16' if what else 'errors: ' + '; '.join(errors[:3])}"
            )
        times: dict[int, float] = {}
        if len(built) > 1:
            times = self._time_plans(g, {k: int(t.get_uid()) for k, t in tensors.items()}, layer, batch, built)
        names = {i: _plan_name(g, i) for i in built}
        # above batch 1, the fastest engine whose frames equal batch 1's bit for bit (a frame's boxes then
        # do not depend on the batch it ran in), else the fastest that agrees within rounding
        chosen: tuple[int, _ConvPlan] | None = None
        close: tuple[int, _ConvPlan] | None = None
        for i in sorted(built, key=lambda i: times.get(i, float("inf"))):
            plan = self._graph_plan(layer, batch, i)
            verdict = "exact" if alone is None else self._agreement(layer, batch, plan, alone)
            if verdict == "exact":
                chosen = (i, plan)
                break
            if verdict == "close" and close is None:
                close = (i, plan)
        exact = chosen is not None
        if chosen is None:
            if close is None:
                raise BackendError(f"cuDNN engine: no engine cuDNN offers for {layer.name} ({layer.shape_key}) at "
                                   f"batch {batch} gives each frame what batch 1 gives it; run with a batch size of 1")
            chosen = close
        best, plan = chosen
        try:
            blob: str | None = base64.b64encode(bytes(plan.graph.serialize())).decode()
        except Exception:
            blob = None
        plan.entry = {"plan_index": best, "plan_name": names[best], "uids": plan.uids, "serialized": blob,
                      "tuned_ms": {f"{i}:{names[i]}": round(t, 5) for i, t in times.items()}}
        if alone is not None:  # batch 1's bytes (from its engine or another), or none of the candidates gave them
            plan.entry["same_as_batch" if exact else "no_exact_candidate"] = 1
        return plan

    # -- checks and timing --------------------------------------------------------------------------

    @functools.cached_property
    def _checks(self) -> TuningChecks:
        """Compiled when a batch's plans are first tuned (never on a start that finds them cached)."""
        return TuningChecks(self.options.dtype)

    def _agreement(self, layer: ConvLayer, batch: int, plan: _ConvPlan, alone: _ConvPlan) -> str | None:
        """How ``plan`` (at ``batch``) agrees with ``alone`` (batch 1's plan) on random inputs: "exact" when
        it gives every frame what ``alone`` gives that frame by itself, bit for bit; "close" when within
        rounding; None otherwise. Some engines tuned at batch 1 compute a batch's last frame differently."""
        cp = self._cp
        k = self._layers.index(layer)
        (h, width), (oh, ow) = layer.in_hw, layer.out_hw
        dtype = self.options.dtype
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:  # the inputs are made on the stream the convs then run on
            x_shape = (batch, *self._activation_shape(layer.in_channels, h, width))
            x = cp.empty(x_shape, dtype)
            self._checks.fill_uniform(x, seed=batch, stream=stream)
            y = cp.empty((batch, *self._activation_shape(layer.out_channels, oh, ow)), dtype)
            y_alone = cp.empty(y.shape, dtype)
            ws = cp.empty(max(plan.workspace, alone.workspace, 1), np.uint8)
        self._cudnn.set_stream(handle=self._handle, stream=stream.ptr)

        def run(p: _ConvPlan, x_ptr: int, y_ptr: int) -> None:
            p.graph._execute(self._pack(p.uids, k, x_ptr, y_ptr), int(ws.data.ptr), self._handle)

        run(plan, int(x.data.ptr), int(y.data.ptr))
        for i in range(batch):
            run(alone, int(x[i].data.ptr), int(y_alone[i].data.ptr))
        comparison = self._checks.compare_frames(y, y_alone, stream)
        if comparison.exact:
            return "exact"
        return "close" if comparison.within(1e-2) else None  # each frame against its own magnitude

    def _pack(self, uids: Mapping[str, int], k: int, x_ptr: int, y_ptr: int) -> dict[int, int]:
        """Conv ``k``'s tensor uids -> device pointers: its input, weights, bias and output."""
        w, b = self._conv_weights[k]
        return {uids["X"]: x_ptr, uids["W"]: int(w.data.ptr), uids["B"]: int(b.data.ptr), uids["Y"]: y_ptr}

    def _time_plans(self, g: Any, uids: dict[str, int], layer: ConvLayer, batch: int, built: list[int]) -> dict[int, float]:
        cp = self._cp
        k = self._layers.index(layer)
        pack = self._pack(uids, k, self._activation_ptr(k, batch, input_side=True),  # reads the bound canvas,
                          self._activation_ptr(k, batch, input_side=False))      # writes our buffers
        ws = cp.empty(max([g.get_workspace_size_plan_at_index(i) for i in built] + [1]), np.uint8)
        stream = cp.cuda.Stream(non_blocking=True)
        self._cudnn.set_stream(handle=self._handle, stream=stream.ptr)
        times: dict[int, float] = {}
        for i in built:
            def execute(index: int = i) -> None:
                g._execute_plan_at_index(pack, int(ws.data.ptr), index, self._handle)

            try:
                for _ in range(2):  # warm-up; a candidate cuDNN cannot execute is left out
                    execute()
            except Exception:
                continue
            # the rounds' launches queue up behind a held stream: the GPU is timed, not the host
            times[i] = gpu_ms(execute, stream, iterations=TUNE_ITERS, rounds=TUNE_ROUNDS, hold_ms=TUNE_HOLD_MS)
        stream.synchronize()
        return times

    def _plan_from_entry(self, layer: ConvLayer, batch: int, entry: Any) -> _ConvPlan | None:
        """The cached plan: deserialized, else rebuilt from its heuristic index and name; None if unusable."""
        if not isinstance(entry, dict):
            return None
        try:
            uids = {k: int(entry["uids"][k]) for k in ("X", "W", "B", "Y")}
            index, name = int(entry["plan_index"]), str(entry["plan_name"])
        except (KeyError, TypeError, ValueError):
            return None
        if isinstance(entry.get("serialized"), str):
            try:
                data = list(base64.b64decode(entry["serialized"], validate=True))
                g = self._cudnn.pygraph(handle=self._handle)
                try:
                    g.deserialize(self._handle, data)
                except TypeError:
                    g.deserialize(data)
                return _ConvPlan(g, uids, int(g.get_workspace_size()), entry)
            except Exception:
                pass
        try:
            g, tensors = self._graph(layer, batch)
            if index >= g.get_execution_plan_count() or _plan_name(g, index) != name:
                return None
            g.build_plan_at_index(index)
            fresh = {k: int(t.get_uid()) for k, t in tensors.items()}
            if fresh != uids:
                return None
            return _ConvPlan(g, uids, int(g.get_workspace_size()), entry)
        except Exception:
            return None


def _plan_name(g: Any, index: int) -> str:
    try:
        return str(g.get_plan_name_at_index(index))
    except Exception:
        return str(index)


#: Largest plan cache file read: a few serialized plans per conv shape are kilobytes to a few MB.
MAX_CACHE_BYTES = 64 * 2**20


def _read_cache(path: Path, key: Mapping[str, Any]) -> dict[str, Any]:
    """The per-shape entries of a cache file, or {} (so the plans are rebuilt) when it is missing,
    not a regular file (a FIFO never blocks), oversized, unreadable, nested too deep or for another
    key. The file holds serialized plans: it is read with the same bounds as a model dir's graphs."""
    try:
        doc = loads_json(read_regular_file(path, max_bytes=MAX_CACHE_BYTES, what="cuDNN plan cache").decode("utf-8"))
    except (InputError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return {}
    if not isinstance(doc, dict) or doc.get("key") != dict(key) or not isinstance(doc.get("layers"), dict):
        return {}
    return doc["layers"]
