"""Assembling trained modules, their selections and predictors (the ``models/modules/mK`` directories) into
engine stages: for the frozen prefix of the next module, for calibration and for evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.io import read_json
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo, load_module
from pipeline.routing.engine import RoutedModule, Stage
from pipeline.routing.package import CascadeMeta, LoadedCascade
from pipeline.routing.predictor import Predictor
from pipeline.search.space import Arch
from pipeline.train.prefix import Prefix

ROUTINGS = ("selected", "predictor", "testset", "default")


def load_stage(models: Path, k: int, costs: CostModel, routing: str = "selected",
               threshold: float = float("inf")) -> tuple[Stage, ModuleInfo]:
    """Module k as an engine stage. ``routing``: what its select stage chose (``selected``), per-image
    predictor routing where available (``predictor``), the static calib-set choice (``testset``), or
    the spec's default path whatever was selected (``default``: the fixed-path baseline).
    Before selection exists, the module runs its default path."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    module, info = load_module(models / f"m{k}" / "train")
    select_path = models / f"m{k}" / "select" / "selection.json"
    if routing == "default" or not select_path.exists():
        arch = module.default_arch()
        return Stage(module, (arch,), (costs.macs(k, arch),), threshold), info
    selection = read_json(select_path)
    use_predictor = selection["predictor"] is not None and (
        routing == "predictor" or (routing == "selected" and selection["mode"] == "predictor"))
    if not use_predictor:
        arch = Arch.from_key(selection["static"])
        return Stage(module, (arch,), (costs.macs(k, arch),), threshold), info
    p = selection["predictor"]
    predictor = Predictor(p["in_channels"], p["num_candidates"], hidden=p["hidden"], pool=p["pool"],
                          scoring=p.get("scoring", "label"), offsets=p.get("offsets"))
    predictor.load_state_dict(torch.load(models / f"m{k}" / "select" / "predictor.pt", weights_only=True))
    archs = tuple(Arch.from_key(key) for key in selection["candidates"])
    return Stage(module, archs, tuple(costs.macs(k, a) for a in archs), threshold, predictor.eval(),
                 int(p["macs"])), info


def load_prefix(models: Path, k: int, costs: CostModel, mean: tuple[float, ...], std: tuple[float, ...]) -> Prefix:
    """The frozen modules 1..k-1 as module k sees them: each through its selection (per-image routing
    included), after normalising with ``mean``/``std``."""
    stages = []
    for j in range(1, k):
        stage, _ = load_stage(models, j, costs)
        if stage.predictor is None:
            stages.append((stage.module, stage.candidates[0]))
        else:
            stages.append((RoutedModule(stage), stage.candidates[0]))
    return Prefix(tuple(stages), mean, std)


def load_stages(models: Path, costs: CostModel, thresholds: list[float] | None = None,
                routing: str = "selected") -> tuple[list[Stage], list[ModuleInfo]]:
    """Every module of the cascade as stages (thresholds default to +inf: no exit but the last)."""
    stages, infos = [], []
    for k in range(1, costs.n_modules + 1):
        threshold = float("inf") if thresholds is None or k > len(thresholds) else thresholds[k - 1]
        stage, info = load_stage(models, k, costs, routing, threshold)
        stages.append(stage)
        infos.append(info)
    return stages, infos


def calibrated_cascade(models: Path, costs: CostModel, fit: Mapping[str, Any], shipped: LoadedCascade,
                       device: torch.device | str = "cpu") -> LoadedCascade:
    """The calibrated cascade rebuilt from the trained modules and calibrate's fit of it (``metrics/
    calibrate.json`` ``selected``: thresholds and exit ensemble), for a run whose model directory holds
    the plain CNN that shipped instead; ``shipped`` gives the classes, input shape and confidence kind."""
    stages, infos = load_stages(models, costs, thresholds=[float(t) for t in fit["thresholds"]])
    meta = CascadeMeta(shipped.meta.classes, shipped.meta.image_shape, infos[0].mean, infos[0].std,
                       shipped.meta.confidence_kind, ensemble_decay=float(fit["ensemble_decay"]))
    for stage in stages:
        stage.module.to(device).eval()
        if stage.predictor is not None:
            stage.predictor.to(device).eval()
    return LoadedCascade(stages, meta)
