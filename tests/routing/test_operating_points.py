"""Operating points (pipeline.routing.operating_points): fitted on held-out arrays (pipeline.routing.fit),
parsed back, chosen by a request's budget; carried by the model directory's manifest
(pipeline.routing.package)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.routing.calibration import simulate_thresholds
from pipeline.routing.fit import fit_operating_points
from pipeline.routing.operating_points import ACCURATE, EXIT1, OperatingPoint, choose_point, parse_points, within
from pipeline.routing.package import CascadeMeta, load_cascade
from pipeline.routing.packaging import save_cascade
from tests.routing.test_package import META, tiny_stages


def arrays(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three exits: later exits more often right; confident images more often right at exit 1."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.2, 1.0, size=(n, 3))
    correct = np.stack([rng.uniform(size=n) < conf[:, 0], rng.uniform(size=n) < 0.85, np.ones(n, bool)], axis=1)
    cum = np.tile([100.0, 250.0, 400.0], (n, 1))
    return conf, correct, cum


def test_points_run_from_the_shipped_thresholds_down_to_exit_1() -> None:
    conf, correct, cum = arrays()
    shipped = [0.9, 0.95]
    points = fit_operating_points(conf, correct, cum, shipped, grid=20, count=4)
    names = [p.name for p in points]
    assert names[0] == ACCURATE and names[-1] == EXIT1 and names[1:-1] == [f"p{i}" for i in range(1, len(names) - 1)]
    assert 3 <= len(points) <= 6
    assert points[0].thresholds == (0.9, 0.95)
    acc, macs, _ = simulate_thresholds(conf, correct, cum, shipped)
    assert (points[0].accuracy, points[0].mean_macs) == (acc, macs)
    assert points[-1].mean_macs == 100.0 and points[-1].accuracy == pytest.approx(correct[:, 0].mean())
    costs = [p.mean_macs for p in points]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    for p in points:  # each point's figures are its thresholds' on these arrays
        assert (p.accuracy, p.mean_macs) == simulate_thresholds(conf, correct, cum, p.thresholds)[:2]
    middle = [p.accuracy for p in points[1:]]  # the front: cheaper never more accurate
    assert middle == sorted(middle, reverse=True)


def test_a_one_exit_model_or_an_exit_1_model_has_one_point() -> None:
    conf, correct, cum = arrays()
    assert [p.name for p in fit_operating_points(conf[:, :1], correct[:, :1], cum[:, :1], [])] == [ACCURATE]
    assert [p.name for p in fit_operating_points(conf, correct, cum, [0.0, 0.0])] == [ACCURATE]


def test_parse_points_round_trips_and_names_bad_items() -> None:
    points = fit_operating_points(*arrays(), [0.9, 0.95], grid=10)
    assert parse_points([p.to_dict() for p in points], 3) == tuple(points)
    good = {"name": "a", "thresholds": [0.5, 0.5], "accuracy": 0.9, "mean_macs": 10}
    for bad, words in (
        ([{**good, "name": ""}], "non-empty string 'name'"),
        ([good, good], "names repeat"),
        ([{**good, "thresholds": [0.5]}], "thresholds must be a list of 2"),
        ([{**good, "mean_macs": -1}], "'a': mean_macs"),
        ([{**good, "accuracy": float("nan")}], "'a': accuracy"),
        ({"a": 1}, "must be a list"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_points(bad, 3)


def test_a_budget_picks_the_most_accurate_point_within_it() -> None:
    points = fit_operating_points(*arrays(), [0.9, 0.95], grid=20, count=4)
    for ceiling in [p.mean_macs for p in points] + [p.mean_macs + 1 for p in points] + [1e9]:
        chosen = within(points, ceiling)
        assert chosen.mean_macs <= ceiling
        assert chosen.accuracy == max(p.accuracy for p in points if p.mean_macs <= ceiling)
    assert choose_point(points, "exit1") is points[-1] and choose_point(points, 1e9) is points[0]
    with pytest.raises(ValueError, match="the cheapest, 'exit1', costs 100"):
        within(points, 99)
    with pytest.raises(ValueError, match="no operating point named 'fast'; this model has accurate"):
        choose_point(points, "fast")
    with pytest.raises(ValueError, match="ask for a point by name"):
        within([OperatingPoint(ACCURATE, (0.5, 0.5))], 1e9)


def test_the_manifest_carries_the_points_and_checks_their_length(tmp_path) -> None:
    points = (OperatingPoint(ACCURATE, (0.6, 0.5), 0.9, 300.0), OperatingPoint(EXIT1, (0.0, 1.01), 0.7, 100.0))
    meta = dataclasses.replace(META, operating_points=points)
    assert CascadeMeta.from_dict(meta.to_dict()) == meta and "operating_points" not in META.to_dict()
    assert load_cascade(save_cascade(tmp_path / "m", tiny_stages(0), meta)).meta.operating_points == points
    short = dataclasses.replace(META, operating_points=(OperatingPoint("x", (0.6,)),))
    with pytest.raises(ValueError, match="operating point 'x' has 1 thresholds; the 3 modules need 2"):
        save_cascade(tmp_path / "bad", tiny_stages(0), short)
    assert not (tmp_path / "bad").exists()
