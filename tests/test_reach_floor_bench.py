"""bench/reach_floor.py's table on exit outputs built by hand (the bench itself is a script)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.reach_floor import floors_table, read
from pipeline.params.config import CalibrateConfig

CFG = CalibrateConfig.from_params({"calibrate": {"mode": "delta", "delta": 0.003, "grid": 30, "reference": "best",
                                                 "ensemble_decays": [0.0], "bound_z": 0.0, "min_reach": 0.0}})


def outputs(n: int, seed: int):
    """Three exits, 3 classes, MACs 1 / 3 / 4 M. Exit 1 is right on 70% of the images, exit 2 on 98%,
    exit 3 on all; each exit is more confident where it is right, with noise."""
    rng = np.random.default_rng(seed)
    y = torch.as_tensor(rng.integers(0, 3, n))
    difficulty = rng.random(n)
    logits = torch.zeros(n, 3, 3)
    for k, skill in enumerate((0.7, 0.98, 1.01)):
        right = torch.as_tensor(difficulty < skill)
        answer = torch.where(right, y, (y + 1) % 3)
        strength = torch.as_tensor(np.where(difficulty < skill, 3.0, 0.5) + rng.normal(0, 0.8, n)).float()
        logits[torch.arange(n), k, answer] = strength.clamp(min=0.05)
    cum = np.tile(np.array([1e6, 3e6, 4e6]), (n, 1))
    return logits, cum, y


def test_a_floor_sends_its_share_to_every_module_at_a_cost_in_macs() -> None:
    held_out, test = outputs(3000, 0), outputs(5000, 1)
    free, floored = floors_table(held_out, test, CFG, "maxprob", [0.0, 0.1])
    assert free["held_out"]["reach"][2] < 0.1  # without a floor module 3 sees few images
    assert min(floored["held_out"]["reach"]) >= 0.1
    assert floored["test"]["reach"][2] > 0.08  # the held-out share carries over to test, up to noise
    assert floored["held_out"]["mean_macs"] > free["held_out"]["mean_macs"]
    assert floored["test"]["accuracy"] >= free["test"]["accuracy"] - 0.005


def test_read_agrees_with_the_fit_on_the_same_images() -> None:
    data = outputs(2000, 2)
    (row,) = floors_table(data, data, CFG, "maxprob", [0.05])
    again = read(data, row["thresholds"], row["ensemble_decay"], "maxprob")
    assert again["accuracy"] == pytest.approx(row["held_out"]["accuracy"])
    assert again["mean_macs"] == pytest.approx(row["held_out"]["mean_macs"])
    assert again["reach"] == pytest.approx(row["held_out"]["reach"])
    assert sum(again["exit_counts"]) == 2000
