"""A tiny three-module cascade with per-image routing at modules 2 and 3, shared by the tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.modules import ModuleSpec
from pipeline.routing.calibration import NEVER
from pipeline.routing.engine import Stage, build_stage
from pipeline.routing.predictor import Predictor
from pipeline.search.space import Arch

SPEC = CascadeSpec(
    in_channels=1,
    num_classes=4,
    image_size=16,
    modules=(
        ModuleSpec("fixed", 8, 1, 1),
        ModuleSpec("supernet", 16, 2, 2, ("conv3", "dw3", "ir3_e3", "skip"), "conv3"),
        ModuleSpec("supernet", 16, 2, 1, ("conv3", "dw3", "skip"), "conv3"),
    ),
)
# Distinct first-layer ops, so a hook on layer 1's op counts exactly one candidate's rows.
CANDIDATES = (
    (Arch(),),
    (
        Arch((("op@l1", "conv3"), ("op@l2", "conv3"))),
        Arch((("op@l1", "dw3"), ("op@l2", "skip"))),
        Arch((("op@l1", "ir3_e3"), ("op@l2", "dw3"))),
    ),
    (Arch((("op@l1", "conv3"),)), Arch((("op@l1", "skip"),))),
)


def images(n: int, seed: int) -> torch.Tensor:
    """Random images with a per-image contrast, so confidences and routes vary across images."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(n, 1, 1, 1, generator=g) * 3 + 0.2  # (N, 1, 1, 1)
    return torch.randn(n, 1, 16, 16, generator=g) * scale  # (N, 1, 16, 16)


def _centred_predictor(in_channels: int, r: int, features: torch.Tensor, seed: int) -> Predictor:
    """A random predictor whose logits are centred on sample features, so every candidate gets used.

    The seeds in ``tiny`` are picked so that routes also vary among the images that reach the
    later modules (those are the low-confidence ones, whose features look alike).
    """
    predictor = Predictor(in_channels, r, hidden=8, seed=seed)
    with torch.no_grad():
        predictor.fc2.weight *= 20
        predictor.fc2.bias -= predictor(features).mean(dim=0)
    return predictor


@dataclasses.dataclass
class TinyCascade:
    modules: nn.ModuleList
    shapes: list[tuple[int, int, int]]
    stages: list[Stage]  # thresholds NEVER: every image reaches the last module

    def with_thresholds(self, thresholds: Sequence[float]) -> list[Stage]:
        """The stages with ``thresholds`` for exits 1..K-1 (the last stage keeps its own)."""
        full = list(thresholds) + [NEVER]
        return [dataclasses.replace(s, threshold=float(t)) for s, t in zip(self.stages, full, strict=True)]


@pytest.fixture(scope="session")
def tiny() -> TinyCascade:
    modules = build_modules(SPEC, seed=0)
    modules.eval()
    with torch.no_grad():
        for module in modules:
            module.head.fc.weight *= 30  # sharper exits: confidences spread well beyond float noise
    shapes = feature_shapes(SPEC)
    h = images(64, seed=99)  # (64, 1, 16, 16): only used to centre the predictors
    stages = []
    with torch.no_grad():
        for k, (module, candidates) in enumerate(zip(modules, CANDIDATES, strict=True)):
            predictor = None
            if len(candidates) > 1:
                predictor = _centred_predictor(shapes[k][0], len(candidates), h, seed=10 + k)
            stages.append(build_stage(module, shapes[k], candidates, NEVER, predictor))
            h, _ = module(h, candidates[0])
    return TinyCascade(modules, shapes, stages)
