"""The select stage's workflow (``stages.select`` parses, calls :func:`select_module`, writes and prints):
module k's static choice on `calib` (the cheapest candidate within `select.delta` of the most accurate)
and, when it has several Pareto candidates, the per-image predictor trained on `route`
(docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from pipeline.device import ComputeConfig, autocast, prefix_to
from pipeline.io import load_split, read_json
from pipeline.models.profile import CostModel
from pipeline.models.store import load_module
from pipeline.params.choices import SELECT_MODES
from pipeline.params.config import SelectConfig
from pipeline.routing.assemble import load_prefix
from pipeline.routing.features import candidate_outputs, split_features
from pipeline.routing.selection import PredictorConfig, routed_selection, static_selection
from pipeline.search.space import Arch

MODES = SELECT_MODES  # select.mode: a predictor per image, or the static choice


@dataclass(frozen=True)
class SelectOutcome:
    k: int
    scoring: str
    candidates: int
    selection: dict[str, Any]  # selection.json
    metrics: dict[str, Any]  # the metrics file
    predictor: nn.Module | None  # the trained predictor, or None where none was trained

    def lines(self) -> list[str]:
        name, m, sel = f"m{self.k}", self.metrics, self.selection
        out = []
        if sel["predictor"] and not m["predictor_used"]:
            out.append(f"select@{name}: predictor routing {m['predictor_routed_acc_heldout']:.4f} at "
                       f"{m['predictor_mean_macs_heldout']:,.0f} MACs does not pay against the static choice "
                       f"{m['static_acc_heldout']:.4f} at {m['static_macs']:,} MACs on held-out route: static serves")
        routed = (f", {self.scoring} predictor routes {m['predictor_routed_acc_heldout']:.4f} right (held-out route), "
                  f"{m['predictor_macs']:,} MACs" if sel["predictor"] else "")
        return [*out, f"select@{name}: mode {sel['mode']}, {self.candidates} candidates, "
                      f"static {sel['static'] or '(fixed)'}{routed}"]


def select_module(data: Path, profile: Path, models: Path, k: int, cfg: SelectConfig,
                  compute: ComputeConfig) -> SelectOutcome:
    """Module k's selection among its search's Pareto candidates (``models/mK/search/search.json``)."""
    device = compute.resolve()
    costs = CostModel(read_json(profile))
    module, info = load_module(models / f"m{k}" / "train")
    module.to(device)
    archs = [Arch.from_key(r["arch"]) for r in read_json(models / f"m{k}" / "search" / "search.json")["pareto"]]
    macs = [costs.macs(k, a) for a in archs]
    prefix = prefix_to(load_prefix(models, k, costs, info.mean, info.std), device)
    calib_h, calib_y = split_features(prefix, load_split(data, "calib"), device=device, precision=compute.precision)
    with autocast(device, compute.precision):
        c_correct, _, _ = candidate_outputs(module, calib_h, calib_y, archs)
    selection, metrics, static = static_selection(k, cfg.mode, archs, macs, c_correct, float(cfg.delta))
    if cfg.mode == "testset" or len(archs) == 1:
        selection["mode"] = "testset" if len(archs) > 1 else "single"
        return SelectOutcome(k, cfg.scoring, len(archs), selection, metrics, None)
    route_h, route_y = split_features(prefix, load_split(data, "route"), device=device, precision=compute.precision)
    with autocast(device, compute.precision):
        r_correct, r_p_true, _ = candidate_outputs(module, route_h, route_y, archs)
    predictor_cfg = PredictorConfig(scoring=cfg.scoring, hidden=cfg.hidden, pool=cfg.pool, epochs=cfg.epochs,
                                    balanced=cfg.balanced, seed=cfg.seed + k, tolerance=float(cfg.fallback_tolerance))
    selection, metrics, predictor = routed_selection(selection, metrics, static, route_h, r_correct, r_p_true, macs,
                                                     predictor_cfg, float(cfg.max_macs_share), f"m{k}")
    return SelectOutcome(k, cfg.scoring, len(archs), selection, metrics, predictor)
