"""PointPillars in plain PyTorch eager mode: the peer the benchmark times our pipeline against.

It is written the way a PyTorch user writes it (zhulf0804/PointPillars is the model): nn.Modules with
BatchNorm left unfolded, voxelization and post-processing as torch ops on the same device, torchvision
NMS, one host-to-device copy of the points and device-to-host copies of the results. It reads the same
``PointPillarsWeights`` and ``ModelConfig`` as the pipeline and groups points with our exact semantics
(float32 grid index, first M points per pillar, first ``max_pillars`` pillars in first-point order), so
its stage outputs can be compared with ours.

Its NMS is torchvision's axis-aligned NMS on bird's-eye-view boxes (``batched_nms`` when the config says
per_class), not the families' rotated NMS: a few boxes can differ from the reference post-processing.
The benchmark compares time, not boxes.

torch and torchvision are optional dependencies: only this module imports them, and only the benchmark
imports this module (lazily).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torchvision
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..points import HostReader, as_host_points
from ..convert.weights import BatchNorm, Conv1x1, ConvBN, PointPillarsWeights

HeadMaps = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
#: The baseline reads host points alone: it is timed host to host, as the pipeline is.
TORCH_BASELINE = HostReader("the PyTorch baseline, which takes host points and copies them to its device itself "
                            "(timed host to host)")


class TorchPillars(NamedTuple):
    """Voxelizer output on the device, in the shared pillar contract."""

    features: torch.Tensor    # (P, M, C) float32 in cfg.features.order, padded slots zero
    coords: torch.Tensor      # (P, 4) int32 (batch=0, iz, iy, ix)
    num_points: torch.Tensor  # (P,) int32
    num_dropped: int          # non-empty pillars past cfg.voxel.max_pillars


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _batch_norm(bn: BatchNorm, eps: float, dims: int) -> nn.Module:
    module = (nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(bn.weight.shape[0], eps=eps)
    state = {name: _tensor(getattr(bn, name)) for name in ("weight", "bias", "running_mean", "running_var")}
    module.load_state_dict({**state, "num_batches_tracked": torch.tensor(0)})
    return module


def _conv_bn_relu(layer: ConvBN, eps: float, transposed: bool) -> list[nn.Module]:
    """Bias-free conv (3x3 padding 1, or transposed with kernel = stride) + BatchNorm2d + ReLU."""
    a, b, k, _ = layer.weight.shape
    conv: nn.Conv2d | nn.ConvTranspose2d
    if transposed:  # torch stores ConvTranspose2d weights as (Cin, Cout, k, k)
        conv = nn.ConvTranspose2d(a, b, k, stride=layer.stride, bias=False)
    else:
        conv = nn.Conv2d(b, a, k, stride=layer.stride, padding=k // 2, bias=False)
    conv.load_state_dict({"weight": _tensor(layer.weight)})
    return [conv, _batch_norm(layer.bn, eps, dims=2), nn.ReLU()]


def _conv1x1(head: Conv1x1) -> nn.Conv2d:
    cout, cin = head.weight.shape[:2]
    conv = nn.Conv2d(cin, cout, 1)
    conv.load_state_dict({"weight": _tensor(head.weight), "bias": _tensor(head.bias)})
    return conv


class PillarFeatureNet(nn.Module):
    """One PFN layer: Linear (no bias) -> BatchNorm1d -> ReLU -> max over the point slots."""

    def __init__(self, weights: PointPillarsWeights, eps: float) -> None:
        super().__init__()
        out_ch, in_ch = weights.pfn_linear.shape
        self.linear = nn.Linear(in_ch, out_ch, bias=False)
        self.linear.load_state_dict({"weight": _tensor(weights.pfn_linear)})
        self.norm = _batch_norm(weights.pfn_bn, eps, dims=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.linear(features)                           # (P, M, Cout)
        x = self.norm(x.permute(0, 2, 1)).permute(0, 2, 1)  # BatchNorm1d wants channels second
        return torch.relu(x).max(dim=1).values              # (P, Cout)


class RegionProposalNet(nn.Module):
    """Backbone blocks, neck (upsample + concat) and the three 1x1 heads; outputs stay NCHW."""

    def __init__(self, weights: PointPillarsWeights, eps: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(*[m for layer in block for m in _conv_bn_relu(layer, eps, transposed=False)])
            for block in weights.blocks
        )
        self.deblocks = nn.ModuleList(
            nn.Sequential(*_conv_bn_relu(layer, eps, transposed=True)) for layer in weights.deblocks
        )
        self.conv_cls = _conv1x1(weights.head_cls)
        self.conv_box = _conv1x1(weights.head_box)
        self.conv_dir = _conv1x1(weights.head_dir)

    def forward(self, canvas: torch.Tensor) -> HeadMaps:
        x, ups = canvas, []
        for block, deblock in zip(self.blocks, self.deblocks):
            x = block(x)
            ups.append(deblock(x))
        x = torch.cat(ups, dim=1)
        return self.conv_cls(x), self.conv_box(x), self.conv_dir(x)


def make_anchors(cfg: ModelConfig) -> torch.Tensor:
    """All anchors (H*W*A, 7) in the family's native box convention, row ((y*W + x)*K + k)*R + r.

    Anchor z is the box centre for the openpcdet coder and the box bottom for the zhulf0804 coder.
    """
    a, r = cfg.anchors, cfg.voxel.point_range
    w, h = cfg.head_map
    xs = _anchor_axis(r[0], r[3], w, a.alignment)
    ys = _anchor_axis(r[1], r[4], h, a.alignment)
    sizes = torch.tensor([c.size for c in a.classes], dtype=torch.float64)
    z = torch.tensor([c.bottom for c in a.classes], dtype=torch.float64)
    if cfg.box_coder == "openpcdet":
        z = z + sizes[:, 2] / 2
    rots = torch.tensor(a.rotations, dtype=torch.float64)
    shape = (h, w, len(a.classes), len(a.rotations))
    columns = [
        xs.view(1, w, 1, 1).expand(shape), ys.view(h, 1, 1, 1).expand(shape),
        z.view(1, 1, -1, 1).expand(shape),
        *(sizes[:, j].view(1, 1, -1, 1).expand(shape) for j in range(3)),
        rots.view(1, 1, 1, -1).expand(shape),
    ]
    return torch.stack(columns, dim=-1).reshape(-1, 7).to(torch.float32)


def _anchor_axis(lo: float, hi: float, n: int, alignment: str) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.float64)
    if alignment == "range_corners":
        return lo + i * ((hi - lo) / max(n - 1, 1))
    return lo + (i + 0.5) * ((hi - lo) / n)


def decode_boxes(deltas: torch.Tensor, anchors: torch.Tensor, style: str) -> torch.Tensor:
    """Residual box decoding in the family's native convention (openpcdet: z centre; zhulf0804: z bottom)."""
    xa, ya, za, s0a, s1a, s2a, ra = anchors.unbind(-1)
    tx, ty, tz, t0, t1, t2, tr = deltas.unbind(-1)
    diagonal = torch.sqrt(s0a * s0a + s1a * s1a)
    s2 = torch.exp(t2) * s2a
    z = tz * s2a + za if style == "openpcdet" else tz * s2a + za + s2a / 2 - s2 / 2
    return torch.stack(
        [tx * diagonal + xa, ty * diagonal + ya, z, torch.exp(t0) * s0a, torch.exp(t1) * s1a, s2, ra + tr],
        dim=-1,
    )


def _apply_direction(heading: torch.Tensor, dir_logits: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """heading <- limit_period(heading - offset, limit_offset, period) + offset (+ period on the flip bin)."""
    d = cfg.require_direction("the PyTorch baseline")
    period = 2 * math.pi / d.num_bins
    shifted = heading - d.offset
    limited = shifted - torch.floor(shifted / period + d.limit_offset) * period
    flip = (dir_logits.argmax(dim=-1) == d.flip_bin).to(heading.dtype)
    return limited + d.offset + period * flip


def _to_openpcdet(boxes: torch.Tensor, style: str) -> torch.Tensor:
    """zhulf0804 (x, y, z_bottom, w, l, h, yaw) -> (x, y, z_centre, l, w, h, -yaw - pi/2); openpcdet as is."""
    if style == "openpcdet":
        return boxes
    x, y, z, w, l, h, yaw = boxes.unbind(-1)
    return torch.stack([x, y, z + h / 2, l, w, h, -yaw - math.pi / 2], dim=-1)


def _aligned_bev(boxes: torch.Tensor) -> torch.Tensor:
    """(x1, y1, x2, y2) of each OpenPCDet box, its dx/dy swapped when the heading is nearer +-90 deg."""
    heading = boxes[:, 6]
    along_x = torch.abs(heading - torch.floor(heading / math.pi + 0.5) * math.pi) < math.pi / 4
    dims = torch.where(along_x[:, None], boxes[:, 3:5], boxes[:, [4, 3]])
    return torch.cat([boxes[:, :2] - dims / 2, boxes[:, :2] + dims / 2], dim=1)


class TorchPointPillars:
    """The whole detector in PyTorch eager mode; ``__call__`` is timed host to host like our pipeline.

    ``half=True`` runs the PFN and the RPN under fp16 autocast; voxelization and post-processing stay float32.
    Otherwise PyTorch's defaults hold, as for any user: cuDNN may run the float32 convolutions in TF32.
    """

    def __init__(self, weights: PointPillarsWeights, cfg: ModelConfig, device: str = "cuda",
                 half: bool = False) -> None:
        _check_weights(weights, cfg)
        self.cfg = cfg
        self.device = torch.device(device)
        self.half = half
        eps = cfg.network.bn_eps
        self.pfn = PillarFeatureNet(weights, eps).to(self.device).eval()
        self.rpn = RegionProposalNet(weights, eps).to(self.device).eval()
        self.anchors = make_anchors(cfg).to(self.device)
        v = cfg.voxel
        self._lo = torch.tensor(v.point_range[:3], dtype=torch.float32, device=self.device)
        self._hi = torch.tensor(v.point_range[3:], dtype=torch.float32, device=self.device)
        self._size = torch.tensor(v.pillar_size, dtype=torch.float32, device=self.device)
        self._grid = torch.tensor(v.grid, dtype=torch.float32, device=self.device)
        offsets = [s / 2 + lo for s, lo in zip(v.pillar_size, v.point_range[:3])]
        self._centre_offset = torch.tensor(offsets, dtype=torch.float32, device=self.device)
        limits = cfg.postprocess.output_range
        self._output_range = None if limits is None else torch.tensor(limits, device=self.device).view(2, 3)

    def __call__(self, points: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N, 4) float32 host points -> boxes (K, 7) OpenPCDet convention, scores (K,), labels (K,) int32."""
        host = as_host_points(points, reader=TORCH_BASELINE)
        with torch.inference_mode():
            boxes, scores, labels = self.postprocess(*self.head_maps(torch.from_numpy(host).to(self.device)))
            # the device-to-host copies are the frame's synchronisation point
            return boxes.cpu().numpy(), scores.cpu().numpy(), labels.to(torch.int32).cpu().numpy()

    def head_maps(self, points: torch.Tensor) -> HeadMaps:
        """Device points (N, 4) -> the three NCHW head maps: voxelize, PFN, scatter, RPN."""
        with torch.inference_mode():
            pillars = self.voxelize(points)
            with self._autocast():
                pillar_features = self.pfn(pillars.features)
            return self.rpn_only(self.scatter(pillar_features, pillars.coords))

    def rpn_only(self, canvas: torch.Tensor) -> HeadMaps:
        """The backbone, neck and heads alone on a device canvas (1, Cf, ny, nx), for stage timings."""
        with torch.inference_mode(), self._autocast():
            return self.rpn(canvas)

    def voxelize(self, points: torch.Tensor) -> TorchPillars:
        """Device points (N, 4) float32 -> decorated pillars, grouped by a stable sort on the cell index."""
        v = self.cfg.voxel
        nx = v.grid[0]
        m = v.max_points_per_pillar
        pts = points[torch.isfinite(points).all(dim=1)]
        xyz = pts[:, :3]
        if v.range_filter == "inclusive_xy":
            keep = ((xyz[:, :2] >= self._lo[:2]) & (xyz[:, :2] <= self._hi[:2])).all(dim=1)
        else:
            keep = ((xyz > self._lo) & (xyz < self._hi)).all(dim=1)
        cell = torch.floor((xyz - self._lo) / self._size)  # float32, as both families compute it
        keep &= ((cell >= 0) & (cell < self._grid)).all(dim=1)
        pts, cell = pts[keep], cell[keep].long()
        key = cell[:, 1] * nx + cell[:, 0]

        cells, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        order = torch.argsort(inverse, stable=True)  # grouped by cell, input order inside a cell
        starts = torch.cumsum(counts, dim=0) - counts
        segment = inverse[order]
        rank = torch.arange(order.shape[0], device=self.device) - starts[segment]
        by_first = torch.argsort(order[starts])      # cells in first-point order
        pillar_of_cell = torch.empty_like(by_first)
        pillar_of_cell[by_first] = torch.arange(by_first.shape[0], device=self.device)
        pillar = pillar_of_cell[segment]
        slot = (rank < m) & (pillar < v.max_pillars)

        kept = by_first[: v.max_pillars]
        num_points = torch.clamp(counts[kept], max=m).to(torch.int32)
        raw = torch.zeros((kept.shape[0], m, 4), dtype=torch.float32, device=self.device)
        raw[pillar[slot], rank[slot]] = pts[order[slot]]
        iy, ix = cells[kept] // nx, cells[kept] % nx
        coords = torch.stack([torch.zeros_like(iy), torch.zeros_like(iy), iy, ix], dim=1).to(torch.int32)
        return TorchPillars(
            self._decorate(raw, num_points, torch.stack([ix, iy], dim=1)),
            coords, num_points, int(cells.shape[0] - kept.shape[0]),
        )

    def _decorate(self, raw: torch.Tensor, num_points: torch.Tensor, ixy: torch.Tensor) -> torch.Tensor:
        """Append pillar-mean and pillar-centre offsets, pick cfg.features.order, zero the padded slots."""
        xyz = raw[..., :3]
        mean = xyz.sum(dim=1, keepdim=True) / num_points.view(-1, 1, 1).to(torch.float32)
        centre = torch.cat([ixy.to(torch.float32), torch.zeros_like(ixy[:, :1], dtype=torch.float32)], dim=1)
        centre = centre * self._size + self._centre_offset
        mean_d = xyz - mean
        center_d = xyz - centre[:, None, :]
        columns = {
            "x": raw[..., 0], "y": raw[..., 1], "z": raw[..., 2], "intensity": raw[..., 3],
            "mean_dx": mean_d[..., 0], "mean_dy": mean_d[..., 1], "mean_dz": mean_d[..., 2],
            "center_dx": center_d[..., 0], "center_dy": center_d[..., 1], "center_dz": center_d[..., 2],
        }
        features = torch.stack([columns[name] for name in self.cfg.features.order], dim=-1)
        padded = torch.arange(raw.shape[1], device=self.device) >= num_points[:, None]
        return features.masked_fill(padded[..., None], 0.0)

    def scatter(self, pillar_features: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """Pillar features (P, Cf) -> BEV canvas (1, Cf, ny, nx), zeros where no pillar is."""
        nx, ny, _ = self.cfg.voxel.grid
        channels = pillar_features.shape[1]
        canvas = torch.zeros((channels, ny * nx), dtype=pillar_features.dtype, device=self.device)
        canvas[:, coords[:, 2].long() * nx + coords[:, 3].long()] = pillar_features.t()
        return canvas.view(1, channels, ny, nx)

    def decode(self, box_map: torch.Tensor, dir_map: torch.Tensor, index: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Head maps -> native boxes (with direction) of the anchors in ``index`` (all when None)."""
        deltas = box_map.permute(0, 2, 3, 1).reshape(-1, 7).float()
        dir_logits = dir_map.permute(0, 2, 3, 1).reshape(-1, self.cfg.require_direction("the PyTorch baseline").num_bins)
        anchors = self.anchors
        if index is not None:
            deltas, dir_logits, anchors = deltas[index], dir_logits[index], anchors[index]
        boxes = decode_boxes(deltas, anchors, self.cfg.box_coder)
        return torch.cat([boxes[:, :6], _apply_direction(boxes[:, 6], dir_logits, self.cfg)[:, None]], dim=1)

    def postprocess(self, cls_map: torch.Tensor, box_map: torch.Tensor, dir_map: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sigmoid, top-k anchors, score threshold, decode, axis-aligned BEV NMS, max_boxes, output range."""
        p = self.cfg.postprocess
        scores = torch.sigmoid(cls_map.permute(0, 2, 3, 1).reshape(-1, self.cfg.num_classes).float())
        best, best_label = scores.max(dim=1)
        # top-k before or after the threshold keeps the same anchors: the threshold is monotone in score
        top = torch.topk(best, min(p.pre_nms_top_k, best.shape[0])).indices
        candidate = scores[top] if p.nms == "per_class" else best[top, None]
        passed = candidate >= p.score_threshold if p.score_inclusive else candidate > p.score_threshold
        row, column = passed.nonzero(as_tuple=True)
        anchor, score = top[row], candidate[row, column]
        label = column if p.nms == "per_class" else best_label[anchor]
        native = self.decode(box_map, dir_map, anchor)
        boxes = _to_openpcdet(native, self.cfg.box_coder)
        if p.nms == "per_class":
            keep = torchvision.ops.batched_nms(_aligned_bev(boxes), score, label, p.nms_iou)
        else:
            keep = torchvision.ops.nms(_aligned_bev(boxes), score, p.nms_iou)
        keep = keep[: p.max_boxes]
        if self._output_range is not None:  # strict, on the native (x, y, z) as the family's test script does
            xyz = native[keep, :3]
            keep = keep[((xyz > self._output_range[0]) & (xyz < self._output_range[1])).all(dim=1)]
        return boxes[keep], score[keep], label[keep]

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.float16, enabled=self.half)


def _check_weights(weights: PointPillarsWeights, cfg: ModelConfig) -> None:
    """Weights and config must agree where the config, not the weights, sets the meaning."""
    channels = weights.pfn_linear.shape[1]
    if channels != cfg.features.channels:
        raise ConfigError(
            f"pfn_linear: weights take {channels} point features; config {cfg.name} decorates "
            f"{cfg.features.channels} ({list(cfg.features.order)})"
        )
    for name, head in (("cls", weights.head_cls), ("box", weights.head_box), ("dir", weights.head_dir)):
        if head.weight.shape[0] != cfg.head_channels[name]:
            raise ConfigError(
                f"head_{name}: weights have {head.weight.shape[0]} output channels; config {cfg.name} "
                f"expects {cfg.head_channels[name]}"
            )
