"""An elastic cascade: every module's width, depth and resolution step in one set of shared weights.

The architect (:mod:`pipeline.architect.search`) trains it once and then scores whole-cascade shapes on
held-out images without training each shape (docs/DESIGN.md "Method B as the architect"). A module's
weights are held at its largest width and depth; a shape runs the first ``width`` output channels of
every convolution (reading the first channels the module before it produced), the first ``depth``
layers, a stride-``stride`` transition and a 2x2 max pool before each of its first ``pools`` layers, as
once-for-all's elastic width and depth do. Normalisation always uses the batch's own statistics: one
set of running statistics cannot fit every width (once-for-all re-estimates them per shape; here every
batch is large enough to carry its own), so the proxy is evaluated in batches, never one image at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.search.space import Arch, Decision, SearchSpace


@dataclass(frozen=True)
class ModuleChoices:
    """What module k may be: the values each decision ranges over (a single value is no decision)."""

    widths: tuple[int, ...]
    depths: tuple[int, ...]
    strides: tuple[int, ...] = (1, 2)
    pools: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        for name in ("widths", "depths", "strides", "pools"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
                raise ValueError(f"ModuleChoices.{name} must be non-empty ints >= 0, got {values!r}")
        if min(self.widths) < 1 or min(self.depths) < 1:
            raise ValueError(f"widths and depths must be >= 1, got {self.widths}, {self.depths}")
        if not set(self.strides) <= {1, 2}:
            raise ValueError(f"strides must be 1 or 2, got {self.strides}")


@dataclass(frozen=True)
class ModuleShape:
    """One module's shape: output channels, conv layers after the transition, transition stride, pools."""

    width: int
    depth: int
    stride: int
    pools: int

    def output_side(self, side: int) -> int:
        side = (side - 1) // self.stride + 1
        return side >> min(self.pools, self.depth)


FIELDS = ("width", "depth", "stride", "pools")
PLURAL = {"width": "widths", "depth": "depths", "stride": "strides", "pools": "pools"}


def cascade_space(choices: Sequence[ModuleChoices]) -> SearchSpace:
    """The decisions ``m<k>.<field>`` of every field that has more than one value."""
    decisions = []
    for k, c in enumerate(choices, start=1):
        for field in FIELDS:
            values = getattr(c, PLURAL[field])
            if len(values) > 1:
                decisions.append(Decision(f"m{k}.{field}", tuple(str(v) for v in values)))
    return SearchSpace(tuple(decisions))


def shapes_of(arch: Arch, choices: Sequence[ModuleChoices]) -> list[ModuleShape]:
    """Each module's shape under ``arch`` (a field without a decision takes its one value). Pools beyond
    the depth have no layer to precede and are dropped, so two archs may name one shape."""
    picked = arch.as_dict()
    shapes = []
    for k, c in enumerate(choices, start=1):
        values = {f: int(picked.get(f"m{k}.{f}", getattr(c, PLURAL[f])[0])) for f in FIELDS}
        values["pools"] = min(values["pools"], values["depth"])
        shapes.append(ModuleShape(**values))
    return shapes


def extreme_arch(space: SearchSpace, largest: bool) -> Arch:
    """The most (``largest``) or least expensive corner: widest, deepest, finest resolution, or the reverse."""
    picked = {}
    for d in space.decisions:
        values = sorted(d.choices, key=int)
        field = d.label.split(".", 1)[1]
        grows = field in ("width", "depth")  # more channels or layers cost more; a larger stride or pool less
        picked[d.label] = values[-1] if grows == largest else values[0]
    return space.make(picked)


class ElasticConvBN(nn.Module):
    """3x3 conv + batch-statistics normalisation + ReLU on the first ``out`` channels of its weights."""

    def __init__(self, in_max: int, out_max: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_max, in_max, 3, 3))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Conv2d's own initialisation
        self.gamma = nn.Parameter(torch.ones(out_max))
        self.beta = nn.Parameter(torch.zeros(out_max))

    def forward(self, x: torch.Tensor, out: int, stride: int = 1) -> torch.Tensor:
        w = self.weight[:out, : x.shape[1]]  # (out, C_in, 3, 3)
        y = F.conv2d(x, w, None, stride, 1)  # (B, out, H', W')
        y = F.batch_norm(y, None, None, self.gamma[:out], self.beta[:out], training=True)
        return F.relu(y)


class ElasticHead(nn.Module):
    """The modules' pool_mlp exit head on the first ``C`` channels: pool to grid x grid, hidden, linear."""

    def __init__(self, c_max: int, num_classes: int, grid: int, hidden: int) -> None:
        super().__init__()
        self.grid, self.c_max = grid, c_max
        self.hidden = nn.Linear(c_max * grid * grid, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        h = torch.flatten(F.adaptive_avg_pool2d(x, self.grid), 1)  # (B, c * grid^2), channel-major
        w = self.hidden.weight.view(-1, self.c_max, self.grid * self.grid)[:, :c].reshape(-1, c * self.grid ** 2)
        return self.fc(F.relu(F.linear(h, w, self.hidden.bias)))  # (B, num_classes)


class ElasticModule(nn.Module):
    def __init__(self, in_max: int, choices: ModuleChoices, num_classes: int, grid: int, hidden: int) -> None:
        super().__init__()
        w_max = max(choices.widths)
        self.transition = ElasticConvBN(in_max, w_max)
        self.layers = nn.ModuleList(ElasticConvBN(w_max, w_max) for _ in range(max(choices.depths)))
        self.head = ElasticHead(w_max, num_classes, grid, hidden)

    def forward(self, x: torch.Tensor, shape: ModuleShape) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.transition(x, shape.width, shape.stride)  # (B, width, H', W')
        for i in range(shape.depth):
            if i < shape.pools:
                h = F.max_pool2d(h, 2)
            h = self.layers[i](h, shape.width)
        return h, self.head(h)


class ElasticCascade(nn.Module):
    """Modules in series, each elastic; ``forward_all(x, shapes)`` returns every exit's logits."""

    def __init__(self, in_channels: int, num_classes: int, choices: Sequence[ModuleChoices],
                 grid: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.choices = tuple(choices)
        self.space = cascade_space(self.choices)
        ins = [in_channels] + [max(c.widths) for c in self.choices[:-1]]
        self.modules_ = nn.ModuleList(ElasticModule(i, c, num_classes, grid, hidden)
                                      for i, c in zip(ins, self.choices, strict=True))

    def forward_all(self, x: torch.Tensor, shapes: Sequence[ModuleShape]) -> list[torch.Tensor]:
        logits, h = [], x  # (B, C, H, W)
        for module, shape in zip(self.modules_, shapes, strict=True):
            h, z = module(h, shape)
            logits.append(z)  # (B, num_classes)
        return logits


def shape_macs(shapes: Sequence[ModuleShape], in_channels: int, side: int, num_classes: int, grid: int = 4,
               hidden: int = 128) -> list[int]:
    """MACs of each module under ``shapes`` (convolutions and the head's two linear layers), the count
    :func:`pipeline.models.cost.count_macs` gives the fixed modules built from them."""
    out, c_in = [], in_channels
    for s in shapes:
        side = (side - 1) // s.stride + 1
        macs = side * side * s.width * c_in * 9
        for i in range(s.depth):
            if i < s.pools:
                side >>= 1
            macs += side * side * s.width * s.width * 9
        macs += s.width * grid * grid * hidden + hidden * num_classes
        out.append(macs)
        c_in = s.width
    return out
