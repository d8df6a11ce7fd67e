"""Cascade modules: a fixed transition, searchable (or fixed) layers and an exit head.

Both module kinds share one surface, so training, search and routing code never branch on kind:
``space``, ``forward(x, arch) -> (features, logits)``, ``default_arch()`` and ``export(arch)``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

import torch
from torch import nn

from pipeline.models.ops import OPS, ConvBNReLU, make_op
from pipeline.params.choices import CONFIDENCES
from pipeline.params.modules_schema import HEADS, KINDS  # noqa: F401 (re-exported)
from pipeline.search.space import Arch, Decision, SearchSpace

PLAIN = "plain"  # a baseline CNN shipped alone (calibrate), never a params module kind
CONFIDENCE_KINDS = CONFIDENCES  # the name the library reads
NO_ARCH = Arch()  # the only architecture of a module without decisions (immutable)


@dataclass(frozen=True)
class ModuleSpec:
    """What one cascade module is. ``ops`` is a supernet's candidate ops; ``default_op`` is a supernet's
    default path op, or the op every layer of a fixed module runs (empty: conv3, docs/DESIGN.md 'Modules
    on the frontier')."""

    kind: str
    channels: int
    stride: int = 1
    layers: int = 1
    ops: tuple[str, ...] = ()
    default_op: str = ""
    head: str = "pool_mlp"  # pool_mlp: pool to head_grid x head_grid + hidden layer | gap: global pool + linear
    head_grid: int = 4
    head_hidden: int = 128  # 0: no hidden layer (pooled grid straight into the classifier)
    # fixed modules: a 2x2 max pool before each of the first ``pools`` layers, so the exit reads features at
    # 1 / 2**pools of the transition's side (docs/DESIGN.md 'Modules on the frontier')
    pools: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.ops, (list, str)):
            # A YAML list arrives as a list; keep the spec hashable. A bare string is a mistake.
            if isinstance(self.ops, str):
                raise ValueError(f"ModuleSpec.ops must be a list of op names, got the string {self.ops!r}")
            object.__setattr__(self, "ops", tuple(self.ops))
        _check_module_spec(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModuleSpec:
        """Build from a plain dict (as read from YAML); unknown keys are an error, not ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModuleSpec: unknown keys {unknown}; known keys: {sorted(known)}")
        if "kind" not in d or "channels" not in d:
            raise ValueError(f"ModuleSpec: 'kind' and 'channels' are required, got keys {sorted(d)}")
        return cls(**{k: tuple(v) if k == "ops" and isinstance(v, list) else v for k, v in d.items()})

    def output_shape(self, input_shape: Sequence[int]) -> tuple[int, int, int]:
        """(C, H, W) after the module: the stride-s 3x3 transition, then each max pool halves (floor)."""
        _, h, w = input_shape
        h, w = (h - 1) // self.stride + 1, (w - 1) // self.stride + 1
        return (self.channels, h >> self.pools, w >> self.pools)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_module_spec(spec: ModuleSpec) -> None:
    if spec.kind not in (*KINDS, PLAIN):
        raise ValueError(f"ModuleSpec.kind must be one of {(*KINDS, PLAIN)}, got {spec.kind!r}")
    if not _is_int(spec.channels) or spec.channels < 1:
        raise ValueError(f"ModuleSpec.channels must be an int >= 1, got {spec.channels!r}")
    if not _is_int(spec.stride) or spec.stride not in (1, 2):
        raise ValueError(f"ModuleSpec.stride must be 1 or 2, got {spec.stride!r}")
    if not _is_int(spec.layers) or spec.layers < 0:
        raise ValueError(f"ModuleSpec.layers must be an int >= 0, got {spec.layers!r}")
    if spec.head not in HEADS:
        raise ValueError(f"ModuleSpec.head must be one of {HEADS}, got {spec.head!r}")
    if not _is_int(spec.head_grid) or spec.head_grid < 1:
        raise ValueError(f"ModuleSpec.head_grid must be an int >= 1, got {spec.head_grid!r}")
    if not _is_int(spec.head_hidden) or spec.head_hidden < 0:
        raise ValueError(f"ModuleSpec.head_hidden must be an int >= 0, got {spec.head_hidden!r}")
    if not _is_int(spec.pools) or spec.pools < 0:
        raise ValueError(f"ModuleSpec.pools must be an int >= 0, got {spec.pools!r}")
    if spec.pools and (spec.kind != "fixed" or spec.pools > spec.layers):
        # a supernet prices its layers' ops at one feature-map size (pipeline.models.cost), so only fixed
        # modules pool, and each pool precedes a layer
        raise ValueError(f"ModuleSpec.pools ({spec.pools}) needs a fixed module with at least that many layers, "
                         f"got kind {spec.kind!r} with {spec.layers} layer(s)")
    if spec.kind == "plain":  # channels is the width; the layers and head are PlainCNN's own
        if spec.ops or spec.default_op or spec.stride != 1:
            raise ValueError(f"ModuleSpec of kind 'plain' takes only its width (channels), "
                             f"got ops={spec.ops!r}, default_op={spec.default_op!r}, stride={spec.stride!r}")
        return
    if spec.kind == "fixed":
        if spec.ops:
            raise ValueError(f"ModuleSpec.ops is for supernet modules only; a fixed module got ops={spec.ops!r} "
                             f"(its layers' op is default_op)")
        if spec.default_op and (spec.default_op not in OPS or spec.default_op == "skip"):
            raise ValueError(f"ModuleSpec.default_op of a fixed module must be one of "
                             f"{sorted(op for op in OPS if op != 'skip')}, got {spec.default_op!r}")
        return
    if spec.layers < 1:
        raise ValueError(f"ModuleSpec.layers must be >= 1 for a supernet module, got {spec.layers}")
    unknown = [op for op in spec.ops if op not in OPS]
    if unknown:
        raise ValueError(f"ModuleSpec.ops has unknown op(s) {unknown}; known ops: {sorted(OPS)}")
    if len(set(spec.ops)) != len(spec.ops):
        raise ValueError(f"ModuleSpec.ops has repeated ops: {spec.ops}")
    if len(spec.ops) < 2:
        raise ValueError(f"ModuleSpec.ops needs at least 2 ops for a supernet module, got {spec.ops}")
    if spec.default_op not in spec.ops:
        raise ValueError(f"ModuleSpec.default_op {spec.default_op!r} is not one of ops {spec.ops}")
    if spec.default_op == "skip":
        # The default path is what a module runs before any search: it must compute something.
        raise ValueError("ModuleSpec.default_op 'skip' is not allowed: the default path must compute")


class ExitHead(nn.Module):
    """Exit classifier on a module's feature map (B, C, H, W) -> logits (B, num_classes).

    ``pool_mlp`` (default): adaptive average pool to ``grid x grid`` (keeps where things are), then a
    hidden layer of ``hidden`` units (ReLU) and a linear classifier; ``hidden=0`` goes
    straight from the pooled grid to the classifier. ``gap`` (ablation): global average pool +
    linear, which capped exit 1 near 80% on Fashion-MNIST (README).
    """

    def __init__(self, channels: int, num_classes: int, kind: str = "gap", grid: int = 4,
                 hidden: int = 0) -> None:
        super().__init__()
        if kind not in HEADS:
            raise ValueError(f"exit head kind must be one of {HEADS}, got {kind!r}")
        grid = 1 if kind == "gap" else grid
        hidden = 0 if kind == "gap" else hidden
        self.pool = nn.AdaptiveAvgPool2d(grid)
        features = channels * grid * grid
        if hidden > 0:
            # No BatchNorm here: a supernet's paths share the head, and one set of running statistics
            # over every path's features would fit none of them.
            self.hidden: nn.Module = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(inplace=True))
            features = hidden
        else:
            self.hidden = nn.Identity()
        self.fc = nn.Linear(features, num_classes)

    @classmethod
    def of(cls, spec: ModuleSpec, num_classes: int) -> ExitHead:
        return cls(spec.channels, num_classes, spec.head, spec.head_grid, spec.head_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(self.pool(x), 1)  # (B, C * grid^2)
        return self.fc(self.hidden(h))  # (B, num_classes)


class Subnet(nn.Module):
    """A standalone module: transition, a fixed sequence of ops, exit head. What ``export`` returns."""

    def __init__(self, transition: nn.Module, body: nn.Sequential, head: ExitHead, arch: Arch) -> None:
        super().__init__()
        self.transition = transition
        self.body = body
        self.head = head
        self.arch = arch  # a plain record of where it came from, never read by forward

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(self.transition(x))  # (B, C, H', W')
        return features, self.head(features)  # (B, num_classes)


def _export(transition: nn.Module, ops: Sequence[nn.Module], head: ExitHead, arch: Arch) -> Subnet:
    """Deep copies, so training the export (or the supernet) never changes the other."""
    body = nn.Sequential(*(copy.deepcopy(op) for op in ops))
    return Subnet(copy.deepcopy(transition), body, copy.deepcopy(head), arch)


class _SpecModule(nn.Module):
    """What both kinds of cascade module share: the spec (of the kind ``KIND``), the channel counts and
    the entry convolution (``transition``)."""

    KIND = ""

    def __init__(self, spec: ModuleSpec, in_channels: int, num_classes: int) -> None:
        super().__init__()
        if spec.kind != self.KIND:
            raise ValueError(f"{type(self).__name__} needs a spec of kind {self.KIND!r}, got {spec.kind!r}")
        self.spec = spec
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.transition = ConvBNReLU(in_channels, spec.channels, 3, spec.stride)


class FixedModule(_SpecModule):
    """A plain module: transition then ``layers`` blocks of ``spec.default_op`` (conv3 when empty); its
    search space is empty."""

    KIND = "fixed"

    def __init__(self, spec: ModuleSpec, in_channels: int, num_classes: int) -> None:
        super().__init__(spec, in_channels, num_classes)
        self.space = SearchSpace()
        op = spec.default_op or "conv3"
        self.layers = nn.ModuleList(make_op(op, spec.channels) for _ in range(spec.layers))
        self.pool = nn.MaxPool2d(2)  # no weights: the state dict is the same with or without pools
        self.head = ExitHead.of(spec, num_classes)

    def default_arch(self) -> Arch:
        return NO_ARCH

    def body(self) -> list[nn.Module]:
        """The layers in order, a max pool before each of the first ``spec.pools``."""
        out: list[nn.Module] = []
        for i, layer in enumerate(self.layers):
            out += [self.pool, layer] if i < self.spec.pools else [layer]
        return out

    def forward(self, x: torch.Tensor, arch: Arch = NO_ARCH) -> tuple[torch.Tensor, torch.Tensor]:
        self.space.validate(arch)
        h = self.transition(x)  # (B, C, H', W')
        for layer in self.body():
            h = layer(h)  # (B, C, H'', W''): a pool halves H and W
        return h, self.head(h)  # (B, C, H'', W''), (B, num_classes)

    def export(self, arch: Arch = NO_ARCH) -> Subnet:
        self.space.validate(arch)
        return _export(self.transition, self.body(), self.head, arch)


class SupernetModule(_SpecModule):
    """Weight-sharing supernet: layer i holds every candidate op; ``arch`` picks one per layer.

    Only the chosen op of each layer runs (single path), so a forward costs what that path costs.
    """

    KIND = "supernet"

    def __init__(self, spec: ModuleSpec, in_channels: int, num_classes: int) -> None:
        super().__init__(spec, in_channels, num_classes)
        self.space = SearchSpace(tuple(Decision(f"op@l{i + 1}", spec.ops) for i in range(spec.layers)))
        self.layers = nn.ModuleList(
            nn.ModuleDict({op: make_op(op, spec.channels) for op in spec.ops}) for _ in range(spec.layers)
        )
        self.head = ExitHead.of(spec, num_classes)

    def default_arch(self) -> Arch:
        return self.space.make({label: self.spec.default_op for label in self.space.labels})

    def chosen_ops(self, arch: Arch) -> list[nn.Module]:
        """The op each layer runs under ``arch`` (checked against the space)."""
        arch = self.space.validate(arch)
        return [layer[arch[label]] for label, layer in zip(self.space.labels, self.layers, strict=True)]

    def forward(self, x: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.transition(x)  # (B, C, H', W')
        for op in self.chosen_ops(arch):
            h = op(h)  # (B, C, H', W')
        return h, self.head(h)  # (B, C, H', W'), (B, num_classes)

    def export(self, arch: Arch) -> Subnet:
        return _export(self.transition, self.chosen_ops(arch), self.head, arch)


class PlainCNN(nn.Module):
    """A plain single-exit CNN (the run's baselines, :mod:`pipeline.train.baselines`): five 3x3
    conv-BN-ReLU blocks (w, w, pool, 2w, 2w, pool, 4w), global average pool, linear.

    It has a cascade module's surface (``space``, ``default_arch()``, ``forward(x, arch) -> (features,
    logits)``, ``spec``, ``export``), so a run can ship it alone as a one-module cascade (spec kind
    ``plain``) when its held-out data says it beats the cascade. Its features are pooled, so no module
    can follow it. Both max pools halve H and W (floor), so inputs need H, W >= 4.
    """

    def __init__(self, width: int, in_channels: int, num_classes: int) -> None:
        super().__init__()
        for name, value in (("width", width), ("in_channels", in_channels), ("num_classes", num_classes)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"PlainCNN.{name} must be an int >= 1, got {value!r}")
        self.width, self.in_channels, self.num_classes = width, in_channels, num_classes
        self.space = SearchSpace()  # no decisions: NO_ARCH is the only architecture
        w = width
        self.body = nn.Sequential(
            ConvBNReLU(in_channels, w, 3),
            ConvBNReLU(w, w, 3),
            nn.MaxPool2d(2),
            ConvBNReLU(w, 2 * w, 3),
            ConvBNReLU(2 * w, 2 * w, 3),
            nn.MaxPool2d(2),
            ConvBNReLU(2 * w, 4 * w, 3),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * w, num_classes)

    @property
    def spec(self) -> ModuleSpec:
        return ModuleSpec("plain", self.width)

    def default_arch(self) -> Arch:
        return NO_ARCH

    def forward(self, x: torch.Tensor, arch: Arch = NO_ARCH) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) normalised images -> pooled features (B, 4w), logits (B, num_classes)."""
        self.space.validate(arch)
        features = torch.flatten(self.pool(self.body(x)), 1)  # (B, 4w)
        return features, self.fc(features)  # (B, num_classes)

    def export(self, arch: Arch = NO_ARCH) -> PlainCNN:
        self.space.validate(arch)
        return copy.deepcopy(self)


CascadeModule: TypeAlias = FixedModule | SupernetModule | PlainCNN


def build_module(spec: ModuleSpec, in_channels: int, num_classes: int) -> CascadeModule:
    """One factory for every kind (uses the caller's RNG state; see cascade.build_modules)."""
    if in_channels < 1 or num_classes < 1:
        raise ValueError(f"in_channels and num_classes must be >= 1, got {in_channels}, {num_classes}")
    if spec.kind == "plain":
        return PlainCNN(spec.channels, in_channels, num_classes)
    cls = FixedModule if spec.kind == "fixed" else SupernetModule
    return cls(spec, in_channels, num_classes)


def confidence(logits: torch.Tensor, kind: str = "maxprob") -> torch.Tensor:
    """Per-sample exit confidence from logits (B, K) -> (B,): max softmax prob, or top1 - top2 prob."""
    if kind not in CONFIDENCE_KINDS:
        raise ValueError(f"confidence kind must be one of {CONFIDENCE_KINDS}, got {kind!r}")
    probs = torch.softmax(logits, dim=-1)  # (B, K)
    if kind == "maxprob" or probs.shape[-1] < 2:
        return probs.max(dim=-1).values  # (B,)
    top2 = probs.topk(2, dim=-1).values  # (B, 2)
    return top2[..., 0] - top2[..., 1]  # (B,)


@contextlib.contextmanager
def eval_mode(*nets: nn.Module) -> Iterator[None]:
    """Eval mode for ``nets`` (BatchNorm uses, never updates, its statistics), then every
    submodule's own train/eval flag back as it was."""
    flags = [(m, m.training) for net in nets for m in net.modules()]
    for net in nets:
        net.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training
