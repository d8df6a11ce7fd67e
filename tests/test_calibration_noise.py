"""bench/calibration_noise.py's rules on exit outputs built by hand (the bench itself is a script)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.calibration_noise import join, rule_cross_fit, rule_pipeline, run, score, take
from pipeline.params.config import CalibrateConfig

CFG = CalibrateConfig.from_params({"calibrate": {"mode": "delta", "delta": 0.003, "grid": 20, "reference": "best",
                                                 "ensemble_decays": [0.0, 0.5, 1.0], "bound_z": 0.0,
                                                 "min_reach": 0.0}})


def outputs(n: int, hard_share: float, seed: int, noisy: bool = False):
    """Two exits, 3 classes. Exit 1 is confident and right on easy images and unsure and wrong on
    hard ones; exit 2 is right on every image (``noisy``: wrong on a random 10%). MACs 1 M / 3 M."""
    rng = np.random.default_rng(seed)
    y = torch.as_tensor(rng.integers(0, 3, n))
    hard = torch.as_tensor(rng.random(n) < hard_share)
    first = torch.zeros(n, 3)
    first[torch.arange(n), y] = 6.0
    wrong = (y + 1) % 3
    first[hard] = 0.0
    first[hard.nonzero().squeeze(1), wrong[hard]] = 0.3
    second = torch.zeros(n, 3)
    target = torch.where(torch.as_tensor(rng.random(n) < 0.1), wrong, y) if noisy else y
    second[torch.arange(n), target] = 8.0
    cum = np.tile(np.array([1e6, 3e6]), (n, 1))
    return torch.stack([first, second], dim=1), cum, y


def test_a_separable_cascade_has_no_calibration_noise() -> None:
    route, calib, test = outputs(300, 0.3, 0), outputs(300, 0.3, 1), outputs(1000, 0.3, 2)
    result = run(route, calib, test, CFG, "maxprob", repeats=4, seed=0, fixed_decay=0.5)
    hard_share = float((test[0][:, 0].max(dim=-1).values < 1).float().mean())
    assert result["the run's calib"]["test_accuracy"] == 1.0
    for name in ("calib half", "pooled", "cross-fit", "decay fixed"):
        r = result[name]
        assert r["test_accuracy_mean"] == 1.0 and r["test_accuracy_sd"] == 0.0
        assert r["mean_macs"] == pytest.approx(1e6 + 2e6 * hard_share)
        assert sum(r["decays"].values()) == 4
    assert result["decay fixed"]["decays"] == {"0.5": 4}


def test_noisy_last_exit_spreads_and_rules_choose_listed_decays() -> None:
    route, calib, test = (outputs(200, 0.5, s, noisy=True) for s in (3, 4, 5))
    result = run(route, calib, test, CFG, "maxprob", repeats=6, seed=1, fixed_decay=0.0)
    assert set(result["cross-fit"]["decays"]) <= {"0", "0.5", "1"}
    assert all(0.0 <= result[k]["test_accuracy_sd"] < 0.1 for k in ("calib half", "pooled", "cross-fit"))
    thresholds, decay = rule_cross_fit(route, calib, CFG, "maxprob")
    assert decay in CFG.ensemble_decays and len(thresholds) == 1
    # the pipeline's rule on the run's calib is the figure `run` reports first
    t, d = rule_pipeline(calib, CFG, "maxprob")
    assert result["the run's calib"]["test_accuracy"] == score(test, t, d, "maxprob")[0]


def test_take_and_join_keep_rows_aligned() -> None:
    a, b = outputs(10, 0.5, 6), outputs(5, 0.5, 7)
    both = join(a, b)
    assert len(both[2]) == 15 and both[1].shape == (15, 2)
    sub = take(both, np.array([12, 0]))
    assert torch.equal(sub[0][0], b[0][2]) and torch.equal(sub[2], torch.stack([b[2][2], a[2][0]]))
