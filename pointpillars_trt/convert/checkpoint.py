"""A checkpoint's state dict -> family-independent NumPy weights: the two key layouts (OpenPCDet,
zhulf0804), checked against the model config.

The file is read by the safe ``.pth`` reader (``pth.py``); here its keys are matched to the layout,
only the tensors the layout uses are built (once their shapes match the config), and NaN / inf
weights, weights beyond float32's range, and BatchNorms that would fold into NaN / inf (a negative
variance) are refused. Every failure is one ``CheckpointError`` line naming the file.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..config import ConfigArgument, ModelConfig, config_argument, load_config
from ..errors import CheckpointError, CheckpointNotice, counted, escape_text
from .pth import StorageRef, TensorRef, array_dtype, checkpoint_path, key_text, open_pth, pickled_repr
from . import multihead
from .weights import BN_FIELDS, BatchNorm, BatchNormFold, Conv1x1, ConvKeys, PointPillarsWeights

Layout = Literal["openpcdet", "zhulf0804"]
LAYOUT_CONFIGS: dict[str, str] = {"openpcdet": "openpcdet_kitti_3class", "zhulf0804": "zhulf0804_kitti_3class"}
MULTIHEAD_CONFIG = "openpcdet_nuscenes_multihead"  # an OpenPCDet layout with multihead.HEAD_KEY keys
#: The OpenPCDet model YAML each built-in OpenPCDet config is read from (``configs/*.yaml`` say so in their header).
PUBLISHED_YAMLS = {"openpcdet_kitti_3class": "tools/cfgs/kitti_models/pointpillar.yaml",
                   MULTIHEAD_CONFIG: "tools/cfgs/nuscenes_models/cbgs_pp_multihead.yaml"}

# ---------------------------------------------------------------------------------------------
# The two key layouts
# ---------------------------------------------------------------------------------------------

_BACKBONE_KERNEL = 3  # both families use 3x3 convs in every backbone block
_IGNORED_SUFFIXES = (".num_batches_tracked",)
_IGNORED_KEYS = ("global_step",)
_WRAPPER_KEYS = ("model_state", "state_dict", "model")
_FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest weight an exported float32 graph can hold


@dataclass(frozen=True)
class _Names:
    markers: tuple[str, ...]        # key prefixes that identify the layout
    pfn: str                        # key of the PFN weight
    pfn_bn: str
    pfn_kernel: tuple[int, ...]     # trailing weight dims: Linear () or Conv1d (1,)
    block: str                      # module list of block i, formatted with i
    first_conv: int                 # module index of conv 0 in a block (OpenPCDet has a ZeroPad2d first)
    deblock: str
    heads: tuple[str, str, str]     # class, box, direction convs


_LAYOUTS: dict[str, _Names] = {
    "openpcdet": _Names(
        markers=("vfe.", "backbone_2d.", "dense_head."),
        pfn="vfe.pfn_layers.0.linear.weight", pfn_bn="vfe.pfn_layers.0.norm", pfn_kernel=(),
        block="backbone_2d.blocks.{i}", first_conv=1, deblock="backbone_2d.deblocks.{i}",
        heads=("dense_head.conv_cls", "dense_head.conv_box", "dense_head.conv_dir_cls"),
    ),
    "zhulf0804": _Names(
        markers=("pillar_encoder.", "backbone.", "neck.", "head."),
        pfn="pillar_encoder.conv.weight", pfn_bn="pillar_encoder.bn", pfn_kernel=(1,),
        block="backbone.multi_blocks.{i}", first_conv=0, deblock="neck.decoder_blocks.{i}",
        heads=("head.conv_cls", "head.conv_reg", "head.conv_dir_cls"),
    ),
}


@dataclass(frozen=True)
class _Plan:
    """Where every weight of a config lives in one layout, and its shape."""

    pfn: ConvKeys
    blocks: tuple[tuple[ConvKeys, ...], ...]
    deblocks: tuple[ConvKeys, ...]
    heads: tuple[tuple[str, tuple[int, ...]], ...]   # (key prefix, weight shape): class, box, direction

    def convs(self) -> tuple[ConvKeys, ...]:
        """Every conv followed by a BatchNorm: PFN, blocks, deblocks."""
        return (self.pfn, *(c for block in self.blocks for c in block), *self.deblocks)

    def keys(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for conv in self.convs():
            out.update(conv.keys())
        for prefix, shape in self.heads:
            out[f"{prefix}.weight"] = shape
            out[f"{prefix}.bias"] = shape[:1]
        return out


def _plan(layout: str, cfg: ModelConfig) -> _Plan:
    if layout not in _LAYOUTS:
        raise CheckpointError(f"unknown layout {layout!r}: expected one of {sorted(_LAYOUTS)}")
    names, net = _LAYOUTS[layout], cfg.network
    pfn = ConvKeys(names.pfn, (net.pfn_channels, cfg.features.channels, *names.pfn_kernel),
                    names.pfn_bn, net.pfn_channels, 1)
    blocks, c_in, k = [], net.pfn_channels, _BACKBONE_KERNEL
    for i, (extra, stride, c_out) in enumerate(zip(net.layer_nums, net.layer_strides, net.block_channels)):
        prefix = names.block.format(i=i)
        index = [names.first_conv + 3 * j for j in range(extra + 1)]  # (conv, BN, ReLU) triplets
        blocks.append(tuple(
            ConvKeys(f"{prefix}.{m}.weight", (c_out, c_in if j == 0 else c_out, k, k), f"{prefix}.{m + 1}",
                      c_out, stride if j == 0 else 1)
            for j, m in enumerate(index)
        ))
        c_in = c_out
    deblocks = tuple(
        ConvKeys(f"{names.deblock.format(i=i)}.0.weight", (c_in, c_out, s, s), f"{names.deblock.format(i=i)}.1",
                  c_out, s, out_axis=1)
        for i, (c_in, s, c_out) in enumerate(zip(net.block_channels, net.upsample_kernels, net.upsample_channels))
    )
    heads = tuple((prefix, (cfg.head_channels[role], net.head_in_channels, 1, 1))
                  for role, prefix in zip(("cls", "box", "dir"), names.heads))
    return _Plan(pfn, tuple(blocks), deblocks, heads)


def expected_keys(layout: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight key the layout stores for this config, with its shape (BN step counters excluded)."""
    if cfg.heads is not None and layout == "openpcdet":
        return multihead.expected_keys(cfg)
    return _plan(layout, cfg).keys()


def _ignored(key: Any) -> bool:
    return isinstance(key, str) and (key in _IGNORED_KEYS or key.endswith(_IGNORED_SUFFIXES))


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {tuple(value.shape)}"
    if isinstance(value, TensorRef):  # a tensor not built because its shape or dtype is wrong
        return f"{value.storage.dtype} {pickled_repr(value.size)}"
    if isinstance(value, StorageRef):
        return "bare storage"
    return escape_text(type(value).__name__, 40)


def _listing(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def _config_fix(layout: str, differs: str) -> str:
    """The build option that reads a checkpoint whose ``differs`` (its network, its classes) are not the config's:
    the model's own YAML for OpenPCDet, a config of this package for zhulf0804 (whose code base has none)."""
    return "--pcdet-config <your model yaml>" if layout == "openpcdet" else f"--config <a config YAML of its {differs}>"


def _check_state_dict(state: Mapping[Any, Any], expected: dict[str, tuple[int, ...]],
                      what: str, source: str, layout: str) -> None:
    missing = [k for k in expected if k not in state]
    unexpected = [key_text(k) for k in state if k not in expected and not _ignored(k)]
    wrong = [
        f"{k}: got {_describe(state[k])}, expected float {expected[k]}"
        for k in expected
        if k in state and not (isinstance(state[k], np.ndarray) and state[k].dtype.kind == "f"
                               and state[k].shape == expected[k])
    ]
    if missing or unexpected or wrong:
        lines = [f"{source}: state dict does not match {what} ({len(missing)} missing, "
                 f"{len(unexpected)} unexpected, {len(wrong)} with a wrong shape or dtype)"]
        lines += [f"  {title}: {_listing(items)}" for title, items in
                  (("missing", missing), ("unexpected", unexpected), ("wrong shape or dtype", wrong)) if items]
        lines.append(f"  a checkpoint of another network than the config's: build it with {_config_fix(layout, 'network')}")
        raise CheckpointError("\n".join(lines))


def _shape_of(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, np.ndarray):
        return tuple(value.shape)
    if isinstance(value, TensorRef) and isinstance(value.size, tuple):  # not built: its shape did not match
        return tuple(value.size)
    return None


def _check_head_channels(state: Mapping[Any, Any], plan: _Plan, layout: str, cfg: ModelConfig, source: str) -> None:
    """A head whose output channels differ from the config's, all else being the network the config
    describes, is a model trained with other classes or anchors: say that and how to read it, in
    place of a list of mis-shaped keys."""
    other: list[str] = []
    for prefix, shape in plan.heads:
        got = _shape_of(state.get(f"{prefix}.weight"))
        if got is not None and len(got) == len(shape) and got[1:] == shape[1:] and got[0] != shape[0]:
            other.append(f"{prefix} has {got[0]} output channels, {cfg.name} {shape[0]}")
    if other:
        fix = _config_fix(layout, "classes and anchors")
        raise CheckpointError(f"{source}: looks like a model trained with other classes/anchors "
                              f"({'; '.join(other)}): build it with {fix}")


def _check_finite(state: Mapping[str, Any], keys: Mapping[str, Any], source: str) -> None:
    """NaN or inf in any weight makes every score NaN: the detector would return no boxes, silently. So does a
    finite float64 weight beyond float32's range: it turns into inf when the weights are cast to float32."""
    non_finite, too_large = [], []
    for key in keys:
        values = state[key]
        count = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
        if count:
            non_finite.append(f"{key} ({count} of {np.size(values)} values)")
        elif values.dtype.itemsize > 4 and values.size and (largest := float(np.abs(values).max())) > _FLOAT32_MAX:
            too_large.append(f"{key} (values up to {largest:.3g})")
    problems = [f"{what} in {counted(len(bad), 'tensor')}: {_listing(bad, 5)}" for what, bad in
                (("non-finite weights (NaN or inf)", non_finite),
                 (f"weights beyond float32's range (+-{_FLOAT32_MAX:.3g})", too_large)) if bad]
    if problems:
        raise CheckpointError(f"{source}: {'; '.join(problems)}")


def _check_trained(state: Mapping[str, Any], keys: Mapping[str, Any], source: str) -> None:
    """Refuse a checkpoint whose conv and linear weights are all zero: it builds and runs, every score 0.5 and
    the boxes the anchors themselves, which no trained model gives; such a file was preallocated or never
    written (an interrupted save or copy). ``keys``: the tensors the layout uses (1-D ones are BatchNorms and
    biases, left out)."""
    weights = [key for key in keys if key.endswith(".weight") and np.ndim(state[key]) >= 2]
    if weights and not any(np.any(state[key]) for key in weights):
        raise CheckpointError(f"{source}: all {len(weights)} conv and linear weight tensors are zeros, which no "
                              "trained model has: was the file preallocated or never written (an interrupted save "
                              "or copy)? Save or copy the checkpoint again")


def _check_batchnorms(state: Mapping[str, Any], folds: Mapping[str, BatchNormFold], source: str) -> None:
    """A BatchNorm folds into the conv before it as weight / sqrt(running_var + eps): a negative variance (NaN
    from the square root) or a fold beyond float32 (inf) makes every score NaN, and the detector would return
    no boxes, silently. ``folds``: BatchNorm prefix -> where it folds; the values are finite."""
    negative = []
    for bn in folds:
        var = state[f"{bn}.running_var"]
        count = int(np.count_nonzero(var < 0))
        if count:
            negative.append(f"{bn}.running_var has {counted(count, 'negative value')} (of {var.size})")
    if negative:
        raise CheckpointError(f"{source}: {_listing(negative, 5)}: a BatchNorm variance cannot be negative; "
                              "is the checkpoint damaged?")
    for bn, (weight, eps, out_axis) in folds.items():
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is what is looked for here
            scale, shift = BatchNorm(*(state[f"{bn}.{f}"] for f in BN_FIELDS)).scale_shift(eps)
            largest = max(_largest_folded(scale, state[weight], out_axis), float(np.abs(shift).max()))
        if not largest <= _FLOAT32_MAX:
            raise CheckpointError(f"{source}: {bn} folded into {weight} (weight / sqrt(running_var + {eps:g})) "
                                  f"gives values up to {largest:.3g}, beyond float32; is the checkpoint damaged?")


def _largest_folded(scale: np.ndarray, weight: np.ndarray, out_axis: int) -> float:
    """The largest magnitude of ``weight`` once scaled by ``scale`` along ``out_axis``, without making it: each
    output channel's |scale| times that channel's largest |weight| (the largest scale times the largest weight
    would refuse a model whose two maxima lie in different channels)."""
    per_channel = np.abs(weight).max(axis=tuple(a for a in range(weight.ndim) if a != out_axis))
    return float((np.abs(scale) * per_channel).max())


def weights_from_state_dict(state_dict: Mapping[str, Any], layout: str, cfg: ModelConfig, *,
                            source: str = "state dict") -> PointPillarsWeights | multihead.MultiHeadWeights:
    """Map a state dict of either layout onto ``PointPillarsWeights`` (``MultiHeadWeights`` for a
    multi-head config) after checking every key and shape."""
    def get(key: str) -> np.ndarray:
        return np.array(state_dict[key], dtype=np.float32, order="C")

    if cfg.heads is not None and layout == "openpcdet":
        keys = multihead.expected_keys(cfg)
        labels = multihead.label_keys(cfg)
        _check_state_dict({k: v for k, v in state_dict.items() if k not in labels}, keys,
                          f"the {layout} multi-head layout of config {cfg.name}", source, layout)
        multihead.check_label_indices(state_dict, cfg, source)
        _check_finite(state_dict, keys, source)
        _check_trained(state_dict, keys, source)
        _check_batchnorms(state_dict, multihead.batchnorm_folds(cfg), source)
        return multihead.weights_from_state_dict(get, cfg)
    plan = _plan(layout, cfg)
    _check_head_channels(state_dict, plan, layout, cfg, source)
    _check_state_dict(state_dict, plan.keys(), f"the {layout} layout of config {cfg.name}", source, layout)
    _check_finite(state_dict, plan.keys(), source)
    _check_trained(state_dict, plan.keys(), source)
    _check_batchnorms(state_dict, {conv.bn: BatchNormFold(conv.weight, cfg.network.bn_eps, conv.out_axis)
                                   for conv in plan.convs() if conv.bn is not None}, source)
    cls, box, direction = (Conv1x1(get(f"{prefix}.weight"), get(f"{prefix}.bias")) for prefix, _ in plan.heads)
    pfn = plan.pfn.conv_bn(get)
    return PointPillarsWeights(
        pfn_linear=pfn.weight.reshape(plan.pfn.shape[:2]),  # zhulf0804's Conv1d (64, C, 1) is a linear map
        pfn_bn=pfn.bn,
        blocks=tuple(tuple(c.conv_bn(get) for c in block) for block in plan.blocks),
        deblocks=tuple(c.conv_bn(get) for c in plan.deblocks),
        head_cls=cls,
        head_box=box,
        head_dir=direction,
    )


def _layout_of(state: Mapping[Any, Any]) -> str | None:
    hits = {name: sum(isinstance(k, str) and k.startswith(n.markers) for k in state) for name, n in _LAYOUTS.items()}
    best = max(hits, key=lambda name: hits[name])
    return best if hits[best] > 0 else None


#: The key prefix torch's DataParallel / DistributedDataParallel wrappers give every weight of a model
#: saved through them (``model.state_dict()`` instead of ``model.module.state_dict()``).
WRAPPER_PREFIX = "module."


def _without_wrapper_prefix(state: Mapping[Any, Any]) -> dict[str, Any]:
    """``state`` with ``module.`` stripped when every key has it, else {}."""
    if not state or not all(isinstance(k, str) and k.startswith(WRAPPER_PREFIX) for k in state):
        return {}
    return {k[len(WRAPPER_PREFIX):]: v for k, v in state.items()}


def detect_layout(obj: Any, source: str = "checkpoint",
                  tensor: Callable[[TensorRef], np.ndarray] | None = None) -> tuple[Layout, dict[str, Any]]:
    """(layout, state dict) of a loaded checkpoint: a bare state dict or one wrapped in
    ``model_state`` (OpenPCDet), ``state_dict`` or ``model``; keys all prefixed ``module.`` (a model
    saved through DataParallel) are read without it. Two wrappers holding state dicts of a layout are refused
    when their contents differ (which one is the model is the writer's to say), and said (a ``CheckpointNotice``)
    naming the one read when they are equal; ``tensor`` builds a tensor record to compare (None: records are
    equal only when they are the same view of the same storage)."""
    if not isinstance(obj, dict):
        held = "tensor" if isinstance(obj, TensorRef) else escape_text(type(obj).__name__, 40)
        raise CheckpointError(f"{source}: the file holds a {held}, expected a state dict "
                              "or a dict holding one")
    found = [(key, *usable) for key in _WRAPPER_KEYS if (usable := _usable_state(obj.get(key))) is not None]
    if found:
        (key, layout, state), others = found[0], found[1:]
        for other, _, other_state in others:
            if not _same_state(state, other_state, tensor):
                raise CheckpointError(f"{source}: holds two different state dicts, under {key!r} and {other!r}: "
                                      "which one is the model is not known here; save the model's alone "
                                      f"(torch.save(ckpt[{key!r}], 'model.pth'), or ckpt[{other!r}])")
        if others:
            names = " and ".join(repr(other) for other, _, _ in others)
            warnings.warn(f"{source}: holds the same state dict under {key!r} and {names}: read the one under "
                          f"{key!r}", CheckpointNotice, stacklevel=3)
        return layout, state
    usable = _usable_state(obj)
    if usable is not None:
        return usable
    _refuse_prefixed_state(obj, source)
    markers = "; ".join(f"{name}: {', '.join(n.markers)}" for name, n in _LAYOUTS.items())
    # the state dict OpenPCDet and others wrap (another network's): its keys, not the wrapper's name, lack the prefixes
    wrapper = next((key for key in _WRAPPER_KEYS if isinstance(obj.get(key), dict) and obj[key]), None)
    where, state = ("top-level keys", obj) if wrapper is None else (f"the keys in ckpt[{wrapper!r}]", obj[wrapper])
    raise CheckpointError(f"{source}: unknown checkpoint layout: {where} "
                          f"[{_listing([key_text(k) for k in state])}] have no known prefix ({markers})")


def _refuse_prefixed_state(obj: dict[Any, Any], source: str) -> None:
    """Refuse, with the save that reads it, a state dict of a known layout whose keys all start with one more name:
    the attribute a wrapper module (a Lightning module's ``self.model``) holds the model in. Its keys would otherwise
    be reported as having no known prefix, naming the top-level keys (``state_dict``, ``epoch``) instead."""
    places = [(f"ckpt[{key!r}]", obj[key]) for key in _WRAPPER_KEYS if isinstance(obj.get(key), dict)]
    for place, state in [*places, ("ckpt", obj)]:
        first = {k.split(".", 1)[0] for k in state if isinstance(k, str) and "." in k}
        if len(first) != 1 or len(state) < 2 or not all(isinstance(k, str) and "." in k for k in state):
            continue
        prefix = f"{first.pop()}."
        if _usable_state({k[len(prefix):]: v for k, v in state.items()}) is not None:
            shown = pickled_repr(prefix)
            raise CheckpointError(f"{source}: the state dict in {place} has every key prefixed {shown} (the attribute a "
                                  "wrapper module, such as a Lightning module, holds the model in): save it without, "
                                  f"torch.save({{k[{len(prefix)}:]: v for k, v in {place}.items()}}, 'model.pth')")


def _usable_state(value: Any) -> tuple[Layout, dict[str, Any]] | None:
    """(layout, state dict) where ``value`` is a state dict of a known layout (its keys all ``module.``-prefixed
    or none), else None."""
    if not isinstance(value, dict):
        return None
    for keys in (value, _without_wrapper_prefix(value)):
        layout = _layout_of(keys) if keys else None
        if layout is not None:
            return layout, keys  # type: ignore[return-value]
    return None


def _same_state(a: Mapping[Any, Any], b: Mapping[Any, Any], tensor: Callable[[TensorRef], np.ndarray] | None) -> bool:
    """Whether two state dicts hold the same keys with the same values: tensors of the same dtype, shape and
    bytes (``tensor`` builds a record where the two are not the same view of one storage)."""
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, TensorRef) and isinstance(y, TensorRef) and x != y:
            if tensor is None or x.storage.dtype != y.storage.dtype or x.size != y.size:
                return False
            x, y = tensor(x), tensor(y)
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        elif x is not y and (type(x) is not type(y) or not _plain_equal(x, y)):
            return False
    return True


def _plain_equal(x: Any, y: Any) -> bool:
    """``x == y`` for values that are not tensors (a step counter, a name); False where it is not a bool."""
    try:
        return (x == y) is True
    except Exception:  # noqa: BLE001 - a value from the file whose comparison fails is not the same
        return False


#: Key prefixes of modules that no model of either layout has, and what they are: a checkpoint holding any is of
#: another detector or code base, which a list of a hundred missing and unexpected keys would not say.
_OTHER_MODELS: dict[str, str] = {
    "backbone_3d.": "OpenPCDet's 3D backbone (SECOND, PV-RCNN, Voxel R-CNN, CenterPoint, PointRCNN)",
    "pfe.": "OpenPCDet's point feature encoder (PV-RCNN)",
    "point_head.": "OpenPCDet's point head (PointRCNN, PV-RCNN, Part-A2)",
    "roi_head.": "OpenPCDet's second-stage RoI head (PV-RCNN, Voxel R-CNN, Part-A2, PointRCNN)",
    "dense_head.heads_list.": "OpenPCDet's CenterHead (CenterPoint)",
    "voxel_encoder.": "MMDetection3D's voxel encoder (its PointPillars and SECOND)",
}


def _check_pointpillars(state: Mapping[Any, Any], source: str) -> None:
    """Refuse a state dict with keys of a module neither layout has (``_OTHER_MODELS``), naming it."""
    for prefix, what in _OTHER_MODELS.items():
        if any(isinstance(k, str) and k.startswith(prefix) for k in state):
            raise CheckpointError(f"{source}: not a model this package builds: its {prefix}* keys are {what}; it "
                                  "builds the PointPillars of OpenPCDet (PointPillar) and of zhulf0804/PointPillars")


def _builtin_config(layout: str, state: Mapping[Any, Any]) -> str:
    """The built-in config of a layout, told apart by keys: multi-head OpenPCDet models have per-head keys."""
    if layout == "openpcdet" and any(isinstance(k, str) and k.startswith(multihead.HEAD_KEY) for k in state):
        return MULTIHEAD_CONFIG
    return LAYOUT_CONFIGS[layout]


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: Path
    layout: Layout
    config_name: str
    weights: PointPillarsWeights | multihead.MultiHeadWeights
    sha256: str
    config: ModelConfig


def load_checkpoint(path: str | os.PathLike[str], config: ConfigArgument = None) -> LoadedCheckpoint:
    """Read a ``.pth`` of either family and check it against ``config`` (default: the layout's built-in one)."""
    given = config_argument(config)  # before the file is read: a wrong type is the caller's slip, not the file's
    pth = open_pth(path)
    source = pth.source
    layout, state = detect_layout(pth.obj, source, pth.parsed.tensor)
    _check_pointpillars(state, source)
    own = _builtin_config(layout, state)
    cfg = load_config(own) if given is None else given
    if cfg.family != layout:
        raise CheckpointError(f"{source}: checkpoint has the {layout} layout, but config {cfg.name} "
                              f"is for the {cfg.family} family; {_own_config_fix(own, config)}")
    # Build only the tensors the layout uses, and only once their shape and dtype match the config:
    # the rest (optimizer state, step counters, wrong or expanded views) is never materialised.
    expected = expected_keys(layout, cfg)
    used = {k: pth.tensor(v)
            if isinstance(v, TensorRef) and v.size == expected.get(k) and array_dtype(v.storage.dtype).kind == "f"
            else v for k, v in state.items() if isinstance(k, str) and k in expected}
    if cfg.heads is not None:  # the heads' small int64 class-id buffers, checked against the config
        used.update({k: pth.tensor(v) for k, v in state.items()
                     if k in multihead.label_keys(cfg) and isinstance(v, TensorRef) and len(v.size) == 1
                     and v.size[0] <= cfg.num_classes})
    state = {**state, **used}
    try:
        weights = weights_from_state_dict(state, layout, cfg, source=source)
    except CheckpointError:
        if config is None or cfg.name == own or not _fits(state, expected_keys(layout, load_config(own))):
            raise
        raise CheckpointError(f"{source}: a checkpoint of config {own} (its keys and shapes are that config's), not "
                              f"of config {cfg.name}; {_own_config_fix(own, config)}") from None
    return LoadedCheckpoint(checkpoint_path(path), layout, cfg.name, weights, pth.sha256, cfg)


def _own_config_fix(own: str, given: ConfigArgument) -> str:
    """How to read a checkpoint with the config its layout and keys name (``own``), ``given`` the config argument as
    the caller gave it: a name or path (the command line's --config, or Python's config=), a ModelConfig (the command
    line's: build --pcdet-config's, or Python's) or a dict (Python's only)."""
    if isinstance(given, Mapping):
        return f"pass config=None to read it with {own}"
    option = "--pcdet-config" if isinstance(given, ModelConfig) else "--config"
    return f"drop {option} to read it with {own} (Python: config=None)"


def _fits(state: Mapping[Any, Any], expected: dict[str, tuple[int, ...]]) -> bool:
    """Whether every tensor ``expected`` names is in ``state`` with that shape (built or not)."""
    return all(_shape_of(state.get(key)) == shape for key, shape in expected.items())
