"""bench.own_data: the folders it builds and the checks it reads off a run (the runs themselves are the
bench's, minutes each; the end-to-end path is tests/e2e/test_quickstart.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.own_data import judge, summary, table
from bench.own_data_folders import FOLDERS, OCCLUDED_CLASSES, SHAPES, colourise, occlude, scene


def evaluation(cascade: float, exits: list[float], small: float, n: int = 300) -> dict:
    row = lambda acc, macs: {"accuracy": acc, "mean_macs": macs}  # noqa: E731
    right = round(cascade * n)
    return {
        "cascade": {**row(cascade, 2e6), "confusion": [[right, 0], [n - right, 0]]},
        "each_exit_alone": [{"exit": k + 1, **row(a, (k + 1) * 1e6)} for k, a in enumerate(exits)],
        "baselines": {
            "plain_small": row(small, 1e6),
            "plain_large": row(0.9, 8e6),
            "two_cnn_cascade": row(0.88, 4e6),
        },
    }


def test_judge_finds_who_dominates_and_the_gap_to_the_best_exit():
    out = judge(evaluation(0.80, [0.75, 0.82, 0.82], small=0.86))
    assert out["test_images"] == 300 and out["dominated_by"] == ["plain_small"]
    assert out["within_best_exit"]  # 2 points under, and 0.3 + one SE on 300 images is 2.6
    clean = judge(evaluation(0.80, [0.75, 0.81, 0.95], small=0.80))
    assert clean["dominated_by"] == [] and not clean["within_best_exit"]
    runs = [{"folder": "f", "seed": 0, "pipeline_s": 60.0, "input": {"shape": [3, 48, 48]}, **out}]
    assert "| f | 0 | 3x48x48 | cascade | 80.00%" in table(runs)
    assert summary(runs)["never_dominated"] is False
    assert summary(runs)["mean_macs_share_of_plain_large"] == pytest.approx(0.25)
    dearer = evaluation(0.80, [0.75, 0.80, 0.80], small=0.86)
    dearer["baselines"]["plain_small"]["mean_macs"] = 2.1e6  # 6 points better at 1.05x the MACs
    near = judge(dearer)
    assert near["dominated_by"] == [] and near["nearly_dominated_by"] == ["plain_small"]
    near_runs = [{"folder": "g", "seed": 1, "pipeline_s": 60.0, "input": {"shape": [3, 64, 64]}, **near}]
    assert "| near: plain_small | 1.0 |" in table(near_runs)
    assert summary(near_runs)["never_dominated"] is True  # the rule; the table names the near miss


def test_judge_reads_the_plain_cnn_that_shipped_instead_of_the_cascade():
    run = evaluation(0.64, [0.50, 0.60, 0.62], small=0.80)  # plain_small at half the cascade's MACs
    assert judge(run)["dominated_by"] == ["plain_small"]
    run["shipped"] = {"model": "plain_small"}  # what evaluate records when calibrate shipped it
    out = judge(run)
    assert out["shipped"] == "plain_small" and out["accuracy"] == 0.80 and out["dominated_by"] == []
    assert out["mean_macs"] == 1e6 and out["within_best_exit"]
    row = [{"folder": "s", "seed": 0, "pipeline_s": 60.0, "input": {"shape": [3, 64, 64]}, **out}]
    assert "| s | 0 | 3x64x64 | plain_small | 80.00%" in table(row)


def test_a_rejudged_run_is_tabled_with_its_own_minutes():
    out = judge(evaluation(0.80, [0.75, 0.82, 0.82], small=0.70))
    rejudged = [{"folder": "s", "seed": 2, "image_shape": [3, 64, 64], "rejudge_s": 120.0, **out}]
    assert table(rejudged).endswith("| - | 2.0 |")  # no pipeline_s: the re-decision's minutes
    assert "| s | 2 | 3x64x64 | cascade |" in table(rejudged)


def test_the_scenes_and_the_colourised_garments_are_what_they_say():
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        img = scene(shape, 64, rng)
        assert img.shape == (64, 64, 3) and img.dtype == np.uint8
    with pytest.raises(ValueError, match="unknown shape"):
        scene("hexagon", 64, rng)
    garment = colourise(np.full((28, 28), 255, dtype=np.uint8), 48, rng)
    assert garment.shape == (48, 48, 3) and garment.std(axis=2).mean() > 5  # colour, not grey


def test_occluded_garments_hide_about_half_of_the_middle():
    rng = np.random.default_rng(0)
    garment = colourise(np.full((28, 28), 255, dtype=np.uint8), 48, rng)
    hidden = []
    for _ in range(20):
        img = occlude(garment, rng)
        assert img.shape == garment.shape and img.dtype == np.uint8
        middle = (slice(12, 36), slice(12, 36))
        changed = np.abs(img[middle].astype(int) - garment[middle].astype(int)).max(axis=2) > 30
        hidden.append(changed.mean())
    assert 0.25 < float(np.mean(hidden)) < 0.8  # patches cover a good part of the garment, not all of it
    assert "occluded-colour-48" in FOLDERS and len(OCCLUDED_CLASSES) == 8
    assert sum(count for _, count in OCCLUDED_CLASSES.values()) == 2400
