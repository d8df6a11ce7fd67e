from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.params.config import CalibrateConfig
from pipeline.routing.calibration import (
    ALWAYS,
    NEVER,
    calibrate_budget,
    calibrate_delta,
    choose_ensemble_decay,
    exit_indices,
    loss_bound,
    oracle,
    simulate_thresholds,
    threshold_grid,
)
from pipeline.routing.engine import run_all_exits, run_cascade
from pipeline.routing.fit import fit
from tests.routing.conftest import TinyCascade, images


def fit_cfg(**kw: object) -> CalibrateConfig:
    """Calibrate's settings with no standard-error margin, no reach floor and one decay unless given."""
    return CalibrateConfig.from_params({"calibrate": {"bound_z": 0.0, "min_reach": 0.0, "ensemble_decays": [0.0],
                                                      **kw}})


def synthetic(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Later exits are right more often; confidence is informative but noisy; costs grow."""
    rng = np.random.default_rng(seed)
    difficulty = rng.random(n)  # (N,)
    skill = np.linspace(0.5, 0.9, k)  # (K,) accuracy of each exit
    correct = difficulty[:, None] < skill[None, :]  # (N, K)
    conf = np.clip(0.55 + 0.3 * (correct - 0.5) + rng.normal(0, 0.15, (n, k)), 0, 1).astype(np.float32)
    cum_macs = np.cumsum(rng.integers(80, 120, (n, k)), axis=1)  # (N, K)
    return conf, correct, cum_macs


def test_simulate_thresholds_hand_case() -> None:
    conf = np.array([[0.9, 0.1, 0.2], [0.3, 0.8, 0.1], [0.3, 0.4, 0.5], [0.6, 0.6, 0.6]])
    correct = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 0], [0, 1, 1]], dtype=bool)
    cum_macs = np.array([[1, 3, 6]] * 4)
    assert exit_indices(conf, [0.6, 0.7]).tolist() == [0, 1, 2, 0]
    accuracy, mean_macs, counts = simulate_thresholds(conf, correct, cum_macs, [0.6, 0.7])
    assert accuracy == pytest.approx(2 / 4)
    assert mean_macs == pytest.approx((1 + 3 + 6 + 1) / 4)
    assert counts.tolist() == [2, 1, 1]
    assert simulate_thresholds(conf, correct, cum_macs, [NEVER, NEVER])[2].tolist() == [0, 0, 4]
    assert simulate_thresholds(conf, correct, cum_macs, [ALWAYS, NEVER])[2].tolist() == [4, 0, 0]


def test_simulate_thresholds_rejects_bad_input() -> None:
    conf, correct, cum_macs = synthetic(10, 3, seed=0)
    with pytest.raises(ValueError, match="2 thresholds"):
        simulate_thresholds(conf, correct, cum_macs, [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="one shape"):
        simulate_thresholds(conf, correct[:, :2], cum_macs, [0.5, 0.5])


def test_threshold_grid_avoids_observed_confidences() -> None:
    conf, _, _ = synthetic(500, 3, seed=1)
    grids = threshold_grid(conf, size=20)
    assert len(grids) == 2
    for k, grid in enumerate(grids):
        assert grid[0] == ALWAYS and grid[-1] == NEVER and len(grid) <= 21
        assert np.all(np.diff(grid) > 0)
        assert not np.isin(grid[1:].astype(np.float32), conf[:, k]).any()  # ALWAYS sits at 0 on purpose


@pytest.mark.parametrize(("k", "exhaustive_limit"), [(3, 4096), (3, 0), (4, 0)])
def test_calibrate_delta_meets_the_target_and_saves(k: int, exhaustive_limit: int) -> None:
    conf, correct, cum_macs = synthetic(2000, k, seed=2)
    delta = 0.01
    thresholds, sweep = calibrate_delta(conf, correct, cum_macs, delta, 30, exhaustive_limit=exhaustive_limit)
    accuracy, mean_macs, _ = simulate_thresholds(conf, correct, cum_macs, thresholds)
    last_accuracy, last_macs = correct[:, -1].mean(), cum_macs[:, -1].mean()
    assert len(thresholds) == k - 1
    assert accuracy >= last_accuracy - delta
    assert mean_macs < 0.9 * last_macs  # it does exit early
    chosen = next(row for row in sweep if row["thresholds"] == thresholds)
    assert chosen["accuracy"] == accuracy and chosen["feasible"]
    # Nothing in the sweep is feasible and cheaper.
    assert all(row["mean_macs"] >= mean_macs for row in sweep if row["feasible"])


def test_exhaustive_search_is_at_least_as_good_as_coordinate_descent() -> None:
    conf, correct, cum_macs = synthetic(1000, 3, seed=3)
    exact, _ = calibrate_delta(conf, correct, cum_macs, 0.02, 20)
    greedy, _ = calibrate_delta(conf, correct, cum_macs, 0.02, 20, exhaustive_limit=0)
    assert (
        simulate_thresholds(conf, correct, cum_macs, exact)[1]
        <= simulate_thresholds(conf, correct, cum_macs, greedy)[1]
    )


def test_calibrate_delta_zero_keeps_full_accuracy() -> None:
    conf, correct, cum_macs = synthetic(500, 3, seed=4)
    thresholds, _ = calibrate_delta(conf, correct, cum_macs, 0.0, 10)
    assert simulate_thresholds(conf, correct, cum_macs, thresholds)[0] >= correct[:, -1].mean()
    with pytest.raises(ValueError, match="delta"):
        calibrate_delta(conf, correct, cum_macs, -0.1, 10)


def test_calibrate_budget_is_the_most_accurate_within_budget() -> None:
    conf, correct, cum_macs = synthetic(1000, 3, seed=5)
    budget = 0.7 * cum_macs[:, -1].mean()
    thresholds, sweep = calibrate_budget(conf, correct, cum_macs, budget, 15)
    accuracy, mean_macs, _ = simulate_thresholds(conf, correct, cum_macs, thresholds)
    assert mean_macs <= budget
    assert accuracy == max(row["accuracy"] for row in sweep if row["mean_macs"] <= budget)
    with pytest.raises(ValueError, match="budget"):
        calibrate_budget(conf, correct, cum_macs, 0.5 * cum_macs[:, 0].min(), 15)


def test_a_budget_below_reach_can_fall_back_to_the_least_macs() -> None:
    """calibrate's equal-MACs comparison: a routed cascade may cost less than the fixed one can reach (the
    positive control's run stopped on it); then the fixed cascade's cheapest setting, said as budget_met."""
    conf, correct, cum_macs = synthetic(1000, 3, seed=5)
    budget = 0.5 * cum_macs[:, 0].min()
    thresholds, sweep = calibrate_budget(conf, correct, cum_macs, budget, 15, least_if_none=True)
    _, mean_macs, _ = simulate_thresholds(conf, correct, cum_macs, thresholds)
    assert mean_macs == min(row["mean_macs"] for row in sweep) == cum_macs[:, 0].mean()
    logits = torch.randn(200, 3, 4)
    cum = np.tile([[1.0, 2.0, 4.0]], (200, 1))
    y = torch.randint(0, 4, (200,))
    cfg = fit_cfg(mode="budget", budget_macs=0.5, grid=10)
    out = fit(logits, cum, y, cfg, "maxprob", 0.0, least_if_none=True)
    assert (out["budget_met"], out["budget_macs"], out["mean_macs"]) == (False, 0.5, 1.0)
    assert fit(logits, cum, y, replace(cfg, budget_macs=4.0), "maxprob", 0.0, least_if_none=True)["budget_met"] is True
    with pytest.raises(ValueError, match="budget"):
        fit(logits, cum, y, cfg, "maxprob", 0.0)


def test_oracle_leaves_at_the_first_right_exit() -> None:
    correct = np.array([[0, 1, 1], [0, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=bool)
    cum_macs = np.array([[1, 3, 6]] * 4)
    accuracy, mean_macs = oracle(correct, cum_macs)
    assert accuracy == pytest.approx(3 / 4)
    assert mean_macs == pytest.approx((3 + 6 + 1 + 6) / 4)


@pytest.mark.parametrize("decay", [0.0, 0.5])
def test_simulation_agrees_with_the_engine(tiny: TinyCascade, decay: float) -> None:
    x = images(200, seed=11)
    labels = torch.randint(0, 4, (200,), generator=torch.Generator().manual_seed(0))
    every = run_all_exits(tiny.stages, x, ensemble_decay=decay)
    conf = every["conf"].numpy()
    correct = (every["pred"] == labels[:, None]).numpy()
    cum_macs = every["cum_macs"].numpy()
    grids = threshold_grid(conf, size=8)
    settings = [[float(a), float(b)] for a in grids[0][1::3] for b in grids[1][1::3]]
    settings.append(calibrate_delta(conf, correct, cum_macs, 0.02, 8)[0])
    for thresholds in settings:
        out = run_cascade(tiny.with_thresholds(thresholds), x, ensemble_decay=decay)
        accuracy, mean_macs, counts = simulate_thresholds(conf, correct, cum_macs, thresholds)
        assert np.array_equal(exit_indices(conf, thresholds), out.exit_index.numpy())
        assert accuracy == pytest.approx(float((out.pred == labels).double().mean()))
        assert mean_macs == pytest.approx(float(out.macs.double().mean()))
        assert counts.tolist() == torch.bincount(out.exit_index, minlength=3).tolist()


def test_calibrate_delta_best_reference_holds_the_bar_of_a_stronger_earlier_exit() -> None:
    # Exit 2 is right on every image, exit 3 on half: "last" lets everyone leave at exit 1 (60% >= 50%),
    # "best" must keep the accuracy within delta of exit 2's 100%.
    n = 100
    conf = np.tile([0.9, 0.9, 0.9], (n, 1))
    conf[:40, 0] = 0.2  # exit 1 is unsure exactly where it is wrong
    correct = np.ones((n, 3), dtype=bool)
    correct[:40, 0] = False
    correct[::2, 2] = False
    cum = np.tile([1.0, 2.0, 3.0], (n, 1))
    last, _ = calibrate_delta(conf, correct, cum, 0.0, 10, reference="last")
    best, _ = calibrate_delta(conf, correct, cum, 0.0, 10, reference="best")
    acc_last, macs_last, _ = simulate_thresholds(conf, correct, cum, last)
    acc_best, macs_best, _ = simulate_thresholds(conf, correct, cum, best)
    assert acc_last >= 0.5 and acc_best == 1.0
    assert macs_best <= 2.0  # exit 1 where it is sure, exit 2 for the rest; never the weak exit 3
    with pytest.raises(ValueError, match="reference"):
        calibrate_delta(conf, correct, cum, 0.0, 10, reference="median")


def test_choose_ensemble_decay_prefers_accuracy_then_macs_then_the_smaller_decay() -> None:
    fits = {0.0: {"accuracy": 0.90, "mean_macs": 10.0}, 0.25: {"accuracy": 0.92, "mean_macs": 12.0},
            0.5: {"accuracy": 0.92, "mean_macs": 11.0}, 1.0: {"accuracy": 0.92, "mean_macs": 11.0}}
    assert choose_ensemble_decay(fits) == 0.5
    assert choose_ensemble_decay({0.0: fits[0.0]}) == 0.0
    with pytest.raises(ValueError, match="no exit-ensemble decays"):
        choose_ensemble_decay({})



def _fit_row(right: list[int], macs: float) -> dict:
    return {"accuracy": sum(right) / len(right), "mean_macs": macs, "right": np.array(right, dtype=bool)}


def test_choose_ensemble_decay_within_z_standard_errors_takes_the_cheapest() -> None:
    n = 400
    base = [1] * 360 + [0] * 40  # 90%
    one_fewer = [0, 0, 0] + base[3:360] + [1, 1] + base[362:]  # 3 lost, 2 gained: net one image, within an SE
    many_fewer = [0] * 30 + base[30:]  # 30 fewer: the paired SE is ~1.3 points, the gap 7.5
    fits = {0.0: _fit_row(one_fewer, 10.0), 0.5: _fit_row(base, 11.0), 1.0: _fit_row(many_fewer, 5.0)}
    assert len(base) == n
    assert choose_ensemble_decay(fits) == 0.5  # z = 0: the most accurate, as before
    assert choose_ensemble_decay(fits, z=1.0) == 0.0  # one image does not buy 10% more MACs
    assert choose_ensemble_decay({0.5: fits[0.5], 1.0: fits[1.0]}, z=1.0) == 0.5  # a real loss is no tie
    same = {0.0: _fit_row(base, 12.0), 0.25: _fit_row(base, 12.0)}
    assert choose_ensemble_decay(same, z=1.0) == 0.0  # a full tie: the smaller decay
    with pytest.raises(ValueError, match="z must be"):
        choose_ensemble_decay(fits, z=-1.0)

# ----------------------------------------------------------------- the bound (calibrate.bound_z)


def test_loss_bound_is_the_paired_mean_plus_z_standard_errors():
    ref = np.array([1, 1, 1, 0, 1, 1, 1, 1], dtype=bool)
    right = np.array([1, 0, 1, 1, 1, 1, 0, 1], dtype=bool)
    d = ref.astype(float) - right.astype(float)
    assert loss_bound(ref, right, 0.0) == pytest.approx(d.mean())
    assert loss_bound(ref, right, 2.0) == pytest.approx(d.mean() + 2 * d.std() / np.sqrt(8))
    assert loss_bound(ref, ref, 3.0) == 0.0  # never disagreeing: no noise to pay for


def test_the_defaults_are_the_shipped_rule():
    """A caller that leaves the rule's settings out gets what a run gets: the schema's calibrate defaults."""
    from pipeline.params.config import CalibrateConfig

    cfg = CalibrateConfig.from_params({})
    conf, correct, cum = synthetic(500, 3, seed=4)
    assert calibrate_delta(conf, correct, cum, 0.01)[0] == calibrate_delta(
        conf, correct, cum, 0.01, cfg.grid, reference=cfg.reference, z=cfg.bound_z, min_reach=cfg.min_reach)[0]


def test_the_bound_keeps_images_going_on_a_small_set_and_costs_little_on_a_large_one():
    """On 60 images a threshold that looks free is a lucky draw: the bound spends more MACs; on 6,000
    the two rules land close together."""
    small, large = synthetic(60, 3, seed=1), synthetic(6000, 3, seed=1)

    def macs(data, z):
        conf, correct, cum = data
        return simulate_thresholds(conf, correct, cum, calibrate_delta(*data, 0.02, 30, reference="best", z=z)[0])[1]

    assert macs(small, 1.0) > 1.08 * macs(small, 0.0)
    assert macs(large, 1.0) <= 1.01 * macs(large, 0.0)


def test_a_negative_z_is_refused():
    with pytest.raises(ValueError, match="z must be >= 0"):
        calibrate_delta(*synthetic(10, 2, seed=0), 0.003, z=-1.0)


def test_reach_shares_counts_the_images_that_get_to_each_module() -> None:
    from pipeline.routing.calibration import reach_line, reach_shares, reaches

    assert reach_shares([80, 15, 5]) == pytest.approx([1.0, 0.2, 0.05])
    assert reaches([80, 15, 5], 0.05) and not reaches([80, 16, 4], 0.05) and reaches([100, 0, 0], 0.0)
    assert reach_line([1.0, 0.2, 0.05], 0.05) == "modules reached by 100.0% / 20.0% / 5.0% (floor 5%)"
    with pytest.raises(ValueError, match="counts"):
        reach_shares([0, 0])


@pytest.mark.parametrize("mode", ["delta", "budget"])
def test_a_reach_floor_sends_that_share_to_every_module(mode: str) -> None:
    conf, correct, cum_macs = synthetic(2000, 3, seed=8)
    # A last module that adds little: the cheapest setting within the bar leaves it (almost) idle.
    correct[:, 2] = correct[:, 1]
    if mode == "delta":
        free, _ = calibrate_delta(conf, correct, cum_macs, 0.01, 30)
        floored, sweep = calibrate_delta(conf, correct, cum_macs, 0.01, 30, min_reach=0.1)
    else:
        budget = cum_macs[:, -1].mean()
        free, _ = calibrate_budget(conf, correct, cum_macs, budget, 30)
        floored, sweep = calibrate_budget(conf, correct, cum_macs, budget, 30, min_reach=0.1)
    free_counts = simulate_thresholds(conf, correct, cum_macs, free)[2]
    counts = simulate_thresholds(conf, correct, cum_macs, floored)[2]
    assert free_counts[2] < 0.1 * len(conf)  # without the floor module 3 is (nearly) idle
    assert counts[2] >= 0.1 * len(conf)  # with it, at least 10% of the images get to module 3
    assert counts[1] + counts[2] >= 0.1 * len(conf)
    assert not all(row["feasible"] for row in sweep)  # the floor did exclude settings
    with pytest.raises(ValueError, match="min_reach"):
        calibrate_delta(conf, correct, cum_macs, 0.01, 30, min_reach=1.0)


def test_fit_reports_the_reach_and_holds_the_floor() -> None:
    conf, correct, cum_macs = synthetic(1000, 3, seed=9)
    strength = torch.from_numpy(2 + 5.0 * conf)  # (N, K): class 0 is the answer where correct, else class 1
    right = torch.from_numpy(correct)
    logits = torch.stack([torch.where(right, strength, 0.0), torch.where(right, 0.0, strength)], dim=-1)
    y = torch.zeros(1000, dtype=torch.long)
    cfg = fit_cfg(mode="delta", delta=0.01, grid=20, reference="best", min_reach=0.2)
    result = fit(logits, cum_macs, y, cfg, "maxprob", 0.0)
    assert result["min_reach"] == 0.2 and len(result["reach"]) == 3
    assert min(result["reach"]) >= 0.2 and result["reach"][0] == 1.0


def test_a_floor_no_setting_can_meet_within_the_bound_is_dropped() -> None:
    from pipeline.routing.calibration import reach_line

    conf, correct, cum_macs = synthetic(2000, 3, seed=10)
    correct[:, 1] = True  # exit 2 is right on every image, exit 3 on few: feeding module 3 breaks the bound
    correct[:, 2] = np.arange(2000) % 10 == 0
    free = calibrate_delta(conf, correct, cum_macs, 0.003, 20, reference="best")
    floored = calibrate_delta(conf, correct, cum_macs, 0.003, 20, reference="best", min_reach=0.06)
    assert floored == free  # the floor gave way to the accuracy rule
    assert simulate_thresholds(conf, correct, cum_macs, floored[0])[2][2] < 0.06 * 2000
    assert "dropped" in reach_line([1.0, 0.5, 0.0], 0.06, met=False)
    strength = torch.from_numpy(2 + 5.0 * conf)  # (N, K): a right or wrong answer, as confident as conf says
    right = torch.from_numpy(correct)
    logits = torch.stack([torch.where(right, strength, 0.0), torch.where(right, 0.0, strength)], dim=-1)
    cfg = fit_cfg(mode="delta", delta=0.003, grid=20, reference="best", min_reach=0.06, ensemble_decays=[0.0])
    from pipeline.routing.fit import fit_best_ensemble

    result = fit_best_ensemble(logits, cum_macs, torch.zeros(2000, dtype=torch.long), cfg, "maxprob")
    assert result["min_reach_met"] is False and result["reach"][2] < 0.06
