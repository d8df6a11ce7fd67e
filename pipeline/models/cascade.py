"""The cascade as data (``CascadeSpec``) and as weights (``build_modules``), plus a minimal container."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from pipeline.models.modules import ModuleSpec, build_module
from pipeline.search.space import Arch


@dataclass(frozen=True)
class CascadeSpec:
    """Input format, classes and the modules M1..MK in series."""

    in_channels: int
    num_classes: int
    image_size: int
    modules: tuple[ModuleSpec, ...]

    def __post_init__(self) -> None:
        if isinstance(self.modules, list):
            object.__setattr__(self, "modules", tuple(self.modules))
        for name in ("in_channels", "num_classes", "image_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"CascadeSpec.{name} must be an int >= 1, got {value!r}")
        if self.num_classes < 2:
            raise ValueError(f"CascadeSpec.num_classes must be >= 2, got {self.num_classes}")
        if not self.modules:
            raise ValueError("CascadeSpec.modules must list at least one module")
        for k, module in enumerate(self.modules, start=1):
            if not isinstance(module, ModuleSpec):
                kind = type(module).__name__
                raise ValueError(f"CascadeSpec.modules[{k}] must be a ModuleSpec, got {kind}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CascadeSpec:
        """Build from a plain dict as read from YAML; module errors name the module (1-based)."""
        known = {f.name for f in fields(cls)}
        unknown, missing = sorted(set(d) - known), sorted(known - set(d))
        if unknown or missing:
            raise ValueError(f"CascadeSpec: unknown keys {unknown}, missing keys {missing}")
        raw_modules = d["modules"]
        if not isinstance(raw_modules, Sequence) or isinstance(raw_modules, str):
            raise ValueError(f"CascadeSpec.modules must be a list of dicts, got {type(raw_modules).__name__}")
        modules = []
        for k, raw in enumerate(raw_modules, start=1):
            if not isinstance(raw, Mapping):
                raise ValueError(f"CascadeSpec.modules[{k}] must be a dict, got {type(raw).__name__}")
            try:
                modules.append(ModuleSpec.from_dict(raw))
            except ValueError as err:
                raise ValueError(f"CascadeSpec.modules[{k}]: {err}") from err
        return cls(d["in_channels"], d["num_classes"], d["image_size"], tuple(modules))


def feature_shapes(spec: CascadeSpec) -> list[tuple[int, int, int]]:
    """(C, H, W) entering each module, then the last module's output: K + 1 shapes."""
    shapes = [(spec.in_channels, spec.image_size, spec.image_size)]
    for module in spec.modules:
        shapes.append(module.output_shape(shapes[-1]))
    return shapes


def build_modules(spec: CascadeSpec, seed: int) -> nn.ModuleList:
    """Same spec and seed -> identical weights; the caller's global RNG state is left untouched."""
    shapes = feature_shapes(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.ModuleList(
            build_module(module, shape[0], spec.num_classes)
            for module, shape in zip(spec.modules, shapes, strict=False)
        )


class Cascade(nn.Module):
    """Modules in series, run along the full path (for training and evaluation of every exit).

    The early-exit engine (batch shrinking, per-image routing) lives in ``pipeline.routing``.
    """

    def __init__(self, spec: CascadeSpec, modules_: nn.ModuleList) -> None:
        super().__init__()
        if len(modules_) != len(spec.modules):
            raise ValueError(f"Cascade: spec has {len(spec.modules)} modules, got {len(modules_)}")
        self.spec = spec
        self.modules_ = modules_  # trailing underscore: nn.Module.modules() is a method

    @classmethod
    def build(cls, spec: CascadeSpec, seed: int) -> Cascade:
        return cls(spec, build_modules(spec, seed))

    def default_archs(self) -> list[Arch]:
        return [module.default_arch() for module in self.modules_]

    def forward_all(self, x: torch.Tensor, archs: Sequence[Arch]) -> list[torch.Tensor]:
        """Every exit's logits, each (B, num_classes), with module k running ``archs[k]``."""
        if len(archs) != len(self.modules_):
            n = len(self.modules_)
            raise ValueError(f"forward_all needs one arch per module ({n}), got {len(archs)}")
        logits = []
        h = x  # (B, C_in, H, W)
        for module, arch in zip(self.modules_, archs, strict=True):
            h, z = module(h, arch)  # (B, C_k, H_k, W_k), (B, num_classes)
            logits.append(z)
        return logits
