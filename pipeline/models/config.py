"""The ``modules`` and ``model`` params sections as a typed config: each module's spec and how
confidence is read off an exit, and the one rule by which module 1 strides (and deepens) on large images."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.models.cascade import CascadeSpec
from pipeline.models.modules import ModuleSpec
from pipeline.params.choices import ConfigError
from pipeline.params.config import section
from pipeline.params.keys import ParamsError
from pipeline.params.schema import SCHEMA
from pipeline.params.settings import settings

STRIDE_ABOVE = 32  # images larger than this (px) enter module 1 at stride 2 (ModelConfig.for_input)
# ... and module 1 then runs this many more layers before its exit: at half the side a layer costs a quarter,
# and exit 1 sees a receptive field in proportion to the larger image. On 2,400 drawn scenes at 64 px (small
# shapes among clutter) one layer left module 1's features too local for anything built on them (exit 2
# 29.7% on calib); three layers: 72.9% (docs/RESULTS.md "Depth before the first exit").
STRIDE_EXTRA_LAYERS = 2


@dataclass(frozen=True)
class ModelConfig:
    """The cascade's modules ``m1..mK`` (their ``spec``) and how confidence is read off an exit."""

    names: tuple[str, ...]
    specs: tuple[ModuleSpec, ...]  # one per module, in order
    confidence: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ModelConfig:
        mods = section(params, "modules")
        problems = SCHEMA["modules"].check(mods, "modules", params, partial=True)  # type: ignore[union-attr]
        if problems:
            raise ParamsError(problems)
        names = tuple(mods)
        try:
            specs = [ModuleSpec.from_dict(mods[name]["spec"]) for name in names]
        except (TypeError, ValueError) as exc:  # what the schema cannot see (e.g. a spec the builder refuses)
            raise ConfigError(f"params: modules: {exc}") from None
        confidence = settings(params, "model").confidence
        return cls(names, tuple(specs), confidence)

    def check_module(self, k: int) -> int:
        """``k`` if the cascade has a module k (1-based), else a ConfigError naming the range."""
        if not 1 <= k <= len(self.specs):
            raise ConfigError(f"--module {k}: the cascade has modules 1..{len(self.specs)}")
        return k

    def for_input(self, image_size: int) -> ModelConfig:
        """The modules for images of ``image_size`` px: above ``STRIDE_ABOVE``, module 1 enters at stride 2
        (its transition halves the side, so 48 px costs what 24 px does) and, a fixed module, runs
        ``STRIDE_EXTRA_LAYERS`` more layers (a supernet keeps the search space params give it), unless its
        spec already strides or pools; at or below it, the specs as params give them.
        Profile and train build from this one rule."""
        first = self.specs[0]
        if image_size <= STRIDE_ABOVE or first.stride != 1 or first.pools:
            return self  # a module 1 that pools brings any input down itself
        extra = STRIDE_EXTRA_LAYERS if first.kind == "fixed" else 0
        deeper = dataclasses.replace(first, stride=2, layers=first.layers + extra)
        return dataclasses.replace(self, specs=(deeper, *self.specs[1:]))

    def cascade_spec(self, in_channels: int, num_classes: int, image_size: int) -> CascadeSpec:
        return CascadeSpec(in_channels, num_classes, image_size, self.for_input(image_size).specs)
