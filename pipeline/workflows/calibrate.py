"""Calibrate's workflow (``stages.calibrate`` parses, calls :func:`calibrate_cascades`, writes and prints):
the exit thresholds of the three routings fitted on the held-out images, the fixed cascade's budget twin
at the selected cascade's cost, and the held-out ship decision between the calibrated cascade and the
run's plain CNNs (docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pipeline.device import ComputeConfig, autocast, stages_to
from pipeline.evaluation.dominance import held_out_choice
from pipeline.evaluation.two_cnn import evaluate_baselines
from pipeline.io import Split, load_held_out, read_json
from pipeline.models.profile import CostModel
from pipeline.params.config import CalibrateConfig, ParamsRecord
from pipeline.routing.assemble import load_stages
from pipeline.routing.calibration import reach_line
from pipeline.routing.engine import Stage
from pipeline.routing.fit import exit_outputs, fit_best_ensemble, held_out_points
from pipeline.routing.package import CascadeMeta
from pipeline.routing.packaging import packaged, plain_packaged
from pipeline.routing.recognize import preprocess
from pipeline.train.baselines import LARGE, SMALL, Baselines, load_baselines

ROUTINGS = ("selected", "testset", "default")  # each module's routing: predictor, static choice, default path
BUDGET_TWIN = "default_at_cascade_macs"  # the fixed cascade held to the selected cascade's mean MACs


@dataclass(frozen=True)
class CalibrateInputs:
    data: Path  # written by ingest
    profile: Path  # the cost model
    models: Path  # m1..mK module directories
    baselines: Path  # the run's plain CNNs


@dataclass(frozen=True)
class CalibrationResult:
    """Every routing's fit (with its sweep), the model each ships as, and what ships at ``selected``."""

    fits: dict[str, dict[str, Any]]  # routing (ROUTINGS, BUDGET_TWIN) -> fit_best_ensemble's result
    packages: dict[str, tuple[list[Stage], CascadeMeta]]  # routing -> the model to save
    shipped: dict[str, Any]  # held_out_choice: the cascade or a plain CNN, and why

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {routing: {k: v for k, v in res.items() if k != "sweep"}
                               for routing, res in self.fits.items()}
        return {**out, "shipped": self.shipped}

    def sweep_rows(self) -> list[dict[str, Any]]:
        return [{"routing": routing, "accuracy": r["accuracy"], "mean_macs": r["mean_macs"],
                 "feasible": r.get("feasible", True), "thresholds": " ".join(f"{t:.4f}" for t in r["thresholds"])}
                for routing, res in self.fits.items() for r in res["sweep"]]

    def run_metrics(self) -> dict[str, float]:
        return {f"{routing}_{key}": res[name] for routing, res in self.fits.items()
                for key, name in (("calib_accuracy", "accuracy"), ("calib_mean_macs", "mean_macs"),
                                  ("last_exit_accuracy", "last_exit_accuracy"))}

    def lines(self) -> list[str]:
        out = [f"calibrate ({routing}): exit ensemble decay {res['ensemble_decay']:g}, "
               f"thresholds {[round(t, 4) for t in res['thresholds']]} -> calib accuracy "
               f"{res['accuracy']:.4f} (last exit {res['last_exit_accuracy']:.4f}) at {res['mean_macs']:,.0f} MACs "
               f"(last exit {res['last_exit_mean_macs']:,.0f}); exits {res['exit_counts']}; "
               f"{reach_line(res['reach'], res['min_reach'], res['min_reach_met'])}"
               for routing, res in self.fits.items()]
        return [*out, f"calibrate: {self.shipped['reason']}"]


@dataclass(frozen=True)
class _Outputs:
    stages: list[Stage]
    meta: CascadeMeta
    logits: torch.Tensor  # (N, K, classes) every exit's
    cum: Any  # (N, K) the MACs of leaving at each exit
    labels: torch.Tensor


def _exit_outputs(inputs: CalibrateInputs, costs: CostModel, routing: str, held_out: Split, kind: str,
                  compute: ComputeConfig, device: torch.device) -> _Outputs:
    """One routing's cascade run over the held-out images, every exit read."""
    meta = read_json(inputs.data / "meta.json")
    stages, infos = load_stages(inputs.models, costs, routing=routing)
    stages = stages_to(stages, device)
    cmeta = CascadeMeta(classes=tuple(meta["classes"]), image_shape=tuple(meta["image_shape"]),
                        mean=infos[0].mean, std=infos[0].std, confidence_kind=kind)
    x = preprocess(held_out.images, cmeta).to(device)
    with autocast(device, compute.precision):
        logits, cum = exit_outputs(stages, x, kind)
    return _Outputs(stages, cmeta, logits, cum, torch.from_numpy(held_out.labels))


def _plain_package(plain: Baselines, shipped: dict[str, Any], data: Path, kind: str,
                   lineage: ParamsRecord) -> tuple[list[Stage], CascadeMeta]:
    """The plain CNN the held-out images chose, in the cascade's model format."""
    meta = read_json(data / "meta.json")
    net, macs = plain.by_name(shipped["model"])
    cmeta = CascadeMeta(tuple(meta["classes"]), tuple(meta["image_shape"]), plain.meta.mean, plain.meta.std, kind)
    info = {"routing": shipped["model"], "shipped": shipped,
            "params": {"baselines": lineage.of("baselines", optional=True)}}
    return plain_packaged(net, macs, cmeta, info)


def calibrate_cascades(inputs: CalibrateInputs, cfg: CalibrateConfig, kind: str, compute: ComputeConfig,
                       lineage: ParamsRecord) -> CalibrationResult:
    """Fit, package and choose, reading only the held-out images (``cfg.held_out``), never test.
    ``kind``: how an exit's confidence is read; ``lineage``: the sections each manifest records."""
    device = compute.resolve()  # the weights saved are CPU copies (save_cascade)
    costs = CostModel(read_json(inputs.profile))
    held_out = load_held_out(inputs.data, cfg.held_out)
    fits, packages, outputs = {}, {}, {}
    for routing in ROUTINGS:
        out = outputs[routing] = _exit_outputs(inputs, costs, routing, held_out, kind, compute, device)
        fits[routing] = fit_best_ensemble(out.logits, out.cum, out.labels, cfg, kind)
        # the held-out curve the server moves along (docs/DESIGN.md 'Serving')
        points = held_out_points(out.logits, out.cum, out.labels, fits[routing], cfg, kind)
        packages[routing] = packaged(out.stages, out.meta, fits[routing], routing, cfg, lineage, points)
    # The fixed cascade held to the selected cascade's cost on the held-out images, so the two compare at
    # equal MACs; where routing costs less than the fixed cascade can reach, its least-MACs setting instead
    # (budget_met false).
    budget_cfg = replace(cfg, mode="budget", budget_macs=fits["selected"]["mean_macs"])
    fixed = outputs["default"]
    fits[BUDGET_TWIN] = fit_best_ensemble(fixed.logits, fixed.cum, fixed.labels, budget_cfg, kind,
                                          least_if_none=True)
    packages[BUDGET_TWIN] = packaged(fixed.stages, fixed.meta, fits[BUDGET_TWIN], "default", budget_cfg, lineage)
    plain = load_baselines(inputs.baselines)
    plains = {name: figures for name, figures in evaluate_baselines(plain, held_out.images, held_out.labels).items()
              if name in (SMALL, LARGE)}
    shipped = held_out_choice(fits["selected"], plains, len(held_out))
    if shipped["model"] != "cascade":
        packages["selected"] = _plain_package(plain, shipped, inputs.data, kind, lineage)
    return CalibrationResult(fits, packages, shipped)
