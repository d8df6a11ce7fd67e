"""Tests of pipeline.routing.fit: ``exit_outputs`` (every exit's logits and costs of a cascade, float32 on
the CPU), ``fit`` (thresholds for one exit-ensemble decay, in delta or budget mode, and the figures it
reports) and ``fit_best_ensemble`` (the best decay, with every decay's figures)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.params.config import CalibrateConfig
from pipeline.routing.engine import run_all_exits
from pipeline.routing.fit import exit_outputs, fit, fit_best_ensemble
from tests.routing.conftest import TinyCascade, images

COST = np.array([10.0, 20.0, 30.0])  # the cost of leaving at exit 1, 2, 3


def logits_of(probs: list[list[list[float]]]) -> torch.Tensor:
    """(N, K, classes) logits whose softmax is ``probs``."""
    return torch.tensor(probs, dtype=torch.float32).log()


def three_exits() -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """4 images of class 0, 3 exits. Exit 1 is right and sure on images 0 and 1 (0.9), wrong on 2 (0.6) and
    3 (0.4); exit 2 is right on all (0.7 each); exit 3 is right on 0, 1 and 2 only.

    Exit accuracies (0.5, 1.0, 0.75). Cheapest at the last exit's 0.75: images 0-2 leave at exit 1 and
    image 3 at exit 2 (12.5 MACs); cheapest at the best exit's 1.0: images 0-1 at exit 1, 2-3 at exit 2
    (15 MACs)."""
    right, wrong = lambda q: [q, (1 - q) / 2, (1 - q) / 2], lambda q: [(1 - q) / 2, q, (1 - q) / 2]
    probs = [
        [right(0.9), right(0.7), right(0.8)],
        [right(0.9), right(0.7), right(0.8)],
        [wrong(0.6), right(0.7), right(0.8)],
        [wrong(0.4), right(0.7), wrong(0.8)],
    ]
    return logits_of(probs), np.tile(COST, (4, 1)), torch.zeros(4, dtype=torch.int64)


def ensemble_helps() -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """2 images of class 0, 2 exits, 2 classes: each exit alone is right on one image at the same
    confidence, so no threshold does better than 0.5; their equal-weight ensemble (decay 1) is right on
    both at exit 2."""
    probs = [[[0.6, 0.4], [0.45, 0.55]], [[0.4, 0.6], [0.9, 0.1]]]
    return logits_of(probs), np.tile(COST[:2], (2, 1)), torch.zeros(2, dtype=torch.int64)


def delta_cfg(**kw: object) -> CalibrateConfig:
    """Delta mode with no standard-error margin and no reach floor, so each figure below is exact."""
    cfg = CalibrateConfig(mode="delta", delta=0.0, budget_macs=None, grid=50, reference="last",
                          ensemble_decays=(0.0,), bound_z=0.0, held_out="calib", min_reach=0.0)
    return replace(cfg, **kw)


# --- exit_outputs ------------------------------------------------------------------------------------


def test_exit_outputs_are_run_all_exits_logits_and_costs(tiny: TinyCascade) -> None:
    x = images(20, seed=5)
    logits, cum = exit_outputs(tiny.stages, x, "maxprob")
    ref = run_all_exits(tiny.stages, x)
    assert logits.shape == (20, 3, 4) and logits.dtype == torch.float32 and logits.device.type == "cpu"
    assert isinstance(cum, np.ndarray) and cum.shape == (20, 3)
    assert torch.equal(logits, ref["logits"])
    np.testing.assert_array_equal(cum, ref["cum_macs"].numpy())
    assert (np.diff(cum, axis=1) > 0).all()  # leaving later costs more


def test_exit_outputs_are_float32_under_bf16_autocast(tiny: TinyCascade) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = exit_outputs(tiny.stages, images(4, seed=6), "maxprob")
    assert logits.dtype == torch.float32


def test_exit_outputs_check_the_confidence_kind(tiny: TinyCascade) -> None:
    with pytest.raises(ValueError, match="confidence kind must be one of"):
        exit_outputs(tiny.stages, images(4, seed=7), "entropy")


# --- fit -------------------------------------------------------------------------------------------------


def test_fit_in_delta_mode_against_the_last_exit() -> None:
    logits, cum, y = three_exits()
    out = fit(logits, cum, y, delta_cfg(), "maxprob", 0.0)
    assert out["thresholds"] == pytest.approx([0.5, 0.0], abs=1e-6)  # 0.5: between confidences 0.4 and 0.6
    assert (out["accuracy"], out["mean_macs"], out["exit_counts"]) == (0.75, 12.5, [3, 1, 0])
    assert out["exit_accuracy"] == [0.5, 1.0, 0.75]
    assert (out["last_exit_accuracy"], out["last_exit_mean_macs"], out["ensemble_decay"]) == (0.75, 30.0, 0.0)
    assert all(isinstance(t, float) for t in out["thresholds"])
    assert all(type(c) is int for c in out["exit_counts"])
    assert out["sweep"] and {"thresholds", "accuracy", "mean_macs", "exit_counts", "feasible"} <= set(
        out["sweep"][0])
    assert any(r["thresholds"] == out["thresholds"] and r["feasible"] for r in out["sweep"])


def test_fit_in_delta_mode_against_the_best_exit() -> None:
    logits, cum, y = three_exits()
    out = fit(logits, cum, y, delta_cfg(reference="best"), "maxprob", 0.0)
    assert (out["accuracy"], out["mean_macs"], out["exit_counts"]) == (1.0, 15.0, [2, 2, 0])


def test_fit_in_delta_mode_allows_delta_below_the_reference() -> None:
    logits, cum, y = three_exits()
    out = fit(logits, cum, y, delta_cfg(reference="best", delta=0.3), "maxprob", 0.0)
    assert (out["accuracy"], out["mean_macs"]) == (0.75, 12.5)  # 1.0 - 0.3: the 12.5-MAC setting will do


def test_fit_in_budget_mode_is_the_most_accurate_within_the_budget() -> None:
    logits, cum, y = three_exits()
    cfg = delta_cfg(mode="budget", budget_macs=14)
    out = fit(logits, cum, y, cfg, "maxprob", 0.0)
    assert (out["accuracy"], out["mean_macs"]) == (0.75, 12.5)
    out = fit(logits, cum, y, replace(cfg, budget_macs=15), "maxprob", 0.0)
    assert (out["accuracy"], out["mean_macs"]) == (1.0, 15.0)
    with pytest.raises(ValueError, match="no thresholds fit a budget of 9.0 MACs"):
        fit(logits, cum, y, replace(cfg, budget_macs=9), "maxprob", 0.0)


def test_fit_thresholds_follow_the_confidence_kind() -> None:
    logits, cum, y = three_exits()
    out = fit(logits, cum, y, delta_cfg(), "margin", 0.0)
    # margins of exit 1: 0.85, 0.85, 0.4, 0.1 -> the same route, at a threshold between 0.1 and 0.4
    assert (out["accuracy"], out["mean_macs"], out["exit_counts"]) == (0.75, 12.5, [3, 1, 0])
    assert out["thresholds"][0] == pytest.approx(0.25, abs=1e-6)
    with pytest.raises(ValueError, match="confidence kind"):
        fit(logits, cum, y, delta_cfg(), "entropy", 0.0)


def test_fit_scores_the_exit_ensemble_of_its_decay() -> None:
    logits, cum, y = ensemble_helps()
    alone = fit(logits, cum, y, delta_cfg(reference="best"), "maxprob", 0.0)
    assert alone["exit_accuracy"] == [0.5, 0.5] and alone["accuracy"] == 0.5
    together = fit(logits, cum, y, delta_cfg(reference="best"), "maxprob", 1.0)
    assert together["exit_accuracy"] == [0.5, 1.0]
    assert (together["accuracy"], together["mean_macs"], together["ensemble_decay"]) == (1.0, 20.0, 1.0)
    assert together["last_exit_accuracy"] == 1.0


def test_fit_refuses_a_decay_outside_0_1() -> None:
    logits, cum, y = three_exits()
    with pytest.raises(ValueError, match="ensemble_decay must be a number in"):
        fit(logits, cum, y, delta_cfg(), "maxprob", 1.5)


# --- fit_best_ensemble -----------------------------------------------------------------------------------


def test_fit_best_ensemble_picks_the_decay_with_the_best_cascade() -> None:
    logits, cum, y = ensemble_helps()
    cfg = delta_cfg(reference="best", ensemble_decays=(0.0, 0.25, 1.0))
    best = fit_best_ensemble(logits, cum, y, cfg, "maxprob")
    assert best["ensemble_decay"] == 1.0 and best["accuracy"] == 1.0
    tried = best.pop("ensemble_tried")
    assert best == fit(logits, cum, y, cfg, "maxprob", 1.0)
    assert set(tried) == {"0", "0.25", "1"}
    for key, decay in (("0", 0.0), ("0.25", 0.25), ("1", 1.0)):
        one = fit(logits, cum, y, cfg, "maxprob", decay)
        assert tried[key] == {"accuracy": one["accuracy"], "mean_macs": one["mean_macs"],
                              "exit_accuracy": one["exit_accuracy"], "eligible": True,
                              "ties_best": key == "1"}
    assert tried["0"]["accuracy"] == 0.5


def test_fit_best_ensemble_prefers_the_smaller_decay_on_a_tie() -> None:
    logits, cum, y = three_exits()
    one_exit = logits[:, -1:], cum[:, -1:]  # one exit: every decay gives the same answers
    best = fit_best_ensemble(*one_exit, y, delta_cfg(ensemble_decays=(0.5, 0.0, 1.0)), "maxprob")
    assert best["ensemble_decay"] == 0.0 and best["thresholds"] == []
    assert best["accuracy"] == 0.75 and set(best["ensemble_tried"]) == {"0.5", "0", "1"}



def test_held_out_points_start_at_the_fitted_cascade_under_its_decay() -> None:
    from pipeline.routing.fit import held_out_points

    logits, cum, y = ensemble_helps()
    fitted = fit_best_ensemble(logits, cum, y, delta_cfg(reference="best", ensemble_decays=[0.0, 1.0]), "maxprob")
    points = held_out_points(logits, cum, y, fitted, delta_cfg(), "maxprob")
    assert list(points[0].thresholds) == fitted["thresholds"]
    assert (points[0].accuracy, points[0].mean_macs) == (fitted["accuracy"], fitted["mean_macs"])
    assert points[-1].name == "exit1" and points[-1].mean_macs == COST[0]
