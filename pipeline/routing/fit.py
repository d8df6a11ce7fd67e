"""Fitting a cascade's exit rule on labelled images: one forward pass over every exit, then thresholds
for each exit-ensemble decay (``engine.combine_exits``), the decay whose cascade is best, and its
operating points (``operating_points``: from the fitted thresholds down to exit 1 alone)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipeline.models.modules import confidence
from pipeline.params.config import CalibrateConfig
from pipeline.routing.calibration import (
    ALWAYS,
    GRID,
    NEVER,
    calib_front,
    calibrate_budget,
    calibrate_delta,
    choose_ensemble_decay,
    ensemble_ties,
    exit_indices,
    reach_shares,
    reaches,
    simulate_thresholds,
)
from pipeline.routing.engine import Stage, combine_exits, run_all_exits
from pipeline.routing.operating_points import ACCURATE, EXIT1, OperatingPoint

POINTS_BETWEEN = 6  # operating points between the two ends: steps enough for a controller, few enough to read
FRONT_BUDGETS = 41  # budgets calib_front spreads over the cost range (as evaluate's curves)


def exit_outputs(stages: list[Stage], x: torch.Tensor, kind: str) -> tuple[torch.Tensor, np.ndarray]:
    """Every exit's logits (N, K, classes) as float32 on the CPU and the cost of leaving at each (N, K)."""
    outs = run_all_exits(stages, x, confidence_kind=kind, batch_size=512)
    return outs["logits"].cpu().float(), outs["cum_macs"].cpu().numpy()


def exit_arrays(logits: torch.Tensor, y: torch.Tensor, kind: str, decay: float) -> tuple[np.ndarray, np.ndarray]:
    """Each exit's confidence and whether it is right (N, K each), exits answering with the exit ensemble
    of ``decay`` (0: each exit alone), as the calibration functions read them."""
    scores = combine_exits(logits, decay)  # (N, K, classes)
    return confidence(scores, kind).numpy(), (scores.argmax(dim=-1) == y[:, None]).numpy()


def _point(name: str, conf: np.ndarray, correct: np.ndarray, cum: np.ndarray,
           thresholds: Sequence[float]) -> OperatingPoint:
    accuracy, macs, _ = simulate_thresholds(conf, correct, cum, thresholds)
    return OperatingPoint(name, tuple(float(t) for t in thresholds), float(accuracy), float(macs))


def _spread(rows: list[dict[str, Any]], low: float, high: float, count: int) -> list[dict[str, Any]]:
    """At most ``count`` of ``rows`` (sorted by cost), the nearest in cost to evenly spaced targets
    strictly between ``low`` and ``high``, so the steps between points are about equal in MACs."""
    chosen: list[dict[str, Any]] = []
    for target in np.linspace(high, low, count + 2)[1:-1]:
        best = min(rows, key=lambda r: abs(r["calib_mean_macs"] - target), default=None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return sorted(chosen, key=lambda r: -r["calib_mean_macs"])


def fit_operating_points(conf: Any, correct: Any, cum_macs: Any, accurate: Sequence[float], *,
                         grid: int = GRID, count: int = POINTS_BETWEEN) -> list[OperatingPoint]:
    """The operating points on these held-out arrays ((N, K) each, as ``calibration``'s functions take):
    ``accurate`` (the thresholds given), up to ``count`` cheaper points of the held-out front, and
    ``exit1``; costs strictly decreasing. A one-exit model has the single point ``accurate``."""
    conf, correct, cum = np.asarray(conf), np.asarray(correct).astype(bool), np.asarray(cum_macs, np.float64)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    top = _point(ACCURATE, conf, correct, cum, accurate)
    if conf.shape[1] == 1:
        return [top]
    bottom = _point(EXIT1, conf, correct, cum, [ALWAYS] + [NEVER] * (conf.shape[1] - 2))
    if bottom.mean_macs >= top.mean_macs:  # the shipped thresholds already answer everything at exit 1
        return [top]
    front = [r for r in calib_front(conf, correct, cum, grid=grid, points=FRONT_BUDGETS)
             if bottom.mean_macs < r["calib_mean_macs"] < top.mean_macs]
    middle = [_point(f"p{i}", conf, correct, cum, r["thresholds"])
              for i, r in enumerate(_spread(front, bottom.mean_macs, top.mean_macs, count), start=1)]
    return [top, *middle, bottom]


def held_out_points(logits: torch.Tensor, cum: np.ndarray, y: torch.Tensor, fitted: dict, cfg: CalibrateConfig,
                    kind: str) -> list[OperatingPoint]:
    """The operating points of a fitted cascade (``fit``'s result: its thresholds and exit-ensemble decay)
    on the same held-out images, from its own thresholds down to exit 1 alone."""
    conf, correct = exit_arrays(logits, y, kind, float(fitted["ensemble_decay"]))
    return fit_operating_points(conf, correct, cum, fitted["thresholds"], grid=cfg.grid)


def fit(logits: torch.Tensor, cum: np.ndarray, y: torch.Tensor, cfg: CalibrateConfig, kind: str, decay: float,
        *, least_if_none: bool = False) -> dict:
    """Thresholds for exits answering with the exit ensemble of ``decay`` (0: each exit alone). In budget
    mode ``least_if_none`` takes the least-MACs setting where none fits the budget (else an error)."""
    result, _ = fit_with_answers(logits, cum, y, cfg, kind, decay, least_if_none=least_if_none)
    return result


def fit_with_answers(logits: torch.Tensor, cum: np.ndarray, y: torch.Tensor, cfg: CalibrateConfig,
                     kind: str, decay: float, *, least_if_none: bool = False) -> tuple[dict, np.ndarray]:
    """``fit``, and the calibrated cascade's per-image answers on these images ((N,) bool, right or not)."""
    min_reach = float(cfg.min_reach)
    conf, correct = exit_arrays(logits, y, kind, decay)
    if cfg.mode == "budget":
        thresholds, sweep = calibrate_budget(conf, correct, cum, float(cfg.budget_macs), cfg.grid,
                                             least_if_none=least_if_none, min_reach=min_reach)
    else:
        thresholds, sweep = calibrate_delta(conf, correct, cum, float(cfg.delta), cfg.grid,
                                            reference=cfg.reference, z=float(cfg.bound_z),
                                            min_reach=min_reach)
    acc, macs, counts = simulate_thresholds(conf, correct, cum, thresholds)
    right = correct[np.arange(len(correct)), exit_indices(conf, thresholds)]  # (N,) the cascade's answers
    return {"thresholds": [float(t) for t in thresholds], "accuracy": float(acc), "mean_macs": float(macs),
            "exit_counts": np.asarray(counts).tolist(), "reach": reach_shares(counts), "min_reach": min_reach,
            "min_reach_met": reaches(counts, min_reach),
            "last_exit_accuracy": float(correct[:, -1].mean()),
            "exit_accuracy": correct.mean(axis=0).tolist(), "ensemble_decay": float(decay),
            "last_exit_mean_macs": float(cum[:, -1].mean()), "sweep": sweep,
            **({"budget_macs": float(cfg.budget_macs), "budget_met": bool(macs <= float(cfg.budget_macs))}
               if cfg.mode == "budget" else {})}, right


def fit_best_ensemble(logits: torch.Tensor, cum: np.ndarray, y: torch.Tensor, cfg: CalibrateConfig, kind: str,
                      *, least_if_none: bool = False) -> dict:
    """``fit`` for every decay of ``cfg.ensemble_decays``; the one ``choose_ensemble_decay`` keeps (within
    ``bound_z`` paired standard errors of the most accurate, the cheapest; among the decays whose fit meets
    ``cfg.min_reach`` where any does), with the others' figures."""
    answered = {float(d): fit_with_answers(logits, cum, y, cfg, kind, float(d), least_if_none=least_if_none)
                for d in cfg.ensemble_decays}
    fits = {d: fitted for d, (fitted, _) in answered.items()}
    # Where some decays meet the reach floor and others had to drop it, the choice is among the former.
    floored = {d: a for d, a in answered.items() if a[0]["min_reach_met"]} or answered
    eligible = {d: {**fitted, "right": right} for d, (fitted, right) in floored.items()}
    z = float(cfg.bound_z)
    tied = ensemble_ties(eligible, z)
    best = fits[choose_ensemble_decay(eligible, z)]
    # ``ties_best``: the decay is one the rule chose among (so a reader can check the choice).
    best["ensemble_tried"] = {f"{d:g}": {"accuracy": r["accuracy"], "mean_macs": r["mean_macs"],
                                         "exit_accuracy": r["exit_accuracy"], "eligible": d in eligible,
                                         "ties_best": d in tied} for d, r in fits.items()}
    return best
