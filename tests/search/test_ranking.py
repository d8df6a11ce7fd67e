"""Tests of the ranking benchmark's pure helpers: Kendall tau-b, Spearman rho, subnet choice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.search.ranking import average_ranks, choose_subnets, kendall_tau, spearman_rho
from pipeline.search.space import Decision, SearchSpace


def test_identical_and_reversed_rankings() -> None:
    x = [0.1, 0.5, 0.7, 0.9]
    assert kendall_tau(x, x) == pytest.approx(1.0)
    assert spearman_rho(x, x) == pytest.approx(1.0)
    assert kendall_tau(x, x[::-1]) == pytest.approx(-1.0)
    assert spearman_rho(x, x[::-1]) == pytest.approx(-1.0)
    # Only the order matters, not the values.
    assert kendall_tau(x, [10, 20, 300, 4000]) == pytest.approx(1.0)


def test_hand_computed_without_ties() -> None:
    # y = 3 1 2 5 4 against x in order: discordant pairs (1,2), (1,3), (4,5); 7 concordant of 10.
    x, y = [1, 2, 3, 4, 5], [3, 1, 2, 5, 4]
    assert kendall_tau(x, y) == pytest.approx((7 - 3) / 10)
    # sum d^2 = 4 + 1 + 1 + 1 + 1 = 8; rho = 1 - 6 * 8 / (5 * (25 - 1)) = 0.6
    assert spearman_rho(x, y) == pytest.approx(0.6)
    assert kendall_tau(y, x) == pytest.approx(0.4)  # symmetric


def test_hand_computed_with_ties() -> None:
    # One pair tied in x, none in y: C = 5, D = 0, tau_b = 5 / sqrt((6 - 1) * 6).
    x, y = [1, 2, 2, 3], [1, 2, 3, 4]
    assert kendall_tau(x, y) == pytest.approx(5 / math.sqrt(30))
    # Ranks of x: 1, 2.5, 2.5, 4; centred: -1.5, 0, 0, 1.5 vs -1.5, -0.5, 0.5, 1.5 -> 4.5 / sqrt(4.5 * 5).
    assert np.allclose(average_ranks(x), [1, 2.5, 2.5, 4])
    assert spearman_rho(x, y) == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_constant_side_gives_nan_and_bad_input_is_rejected() -> None:
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman_rho([1, 2, 3], [5, 5, 5]))
    with pytest.raises(ValueError):
        kendall_tau([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        spearman_rho([1], [1])
    with pytest.raises(ValueError):
        kendall_tau([1, float("nan")], [1, 2])


def test_matches_scipy_on_random_data_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 6, size=12).astype(float)  # plenty of ties
        y = x + rng.integers(-3, 4, size=12)
        assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)
        assert spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)


@pytest.fixture
def space() -> SearchSpace:
    ops = ("a", "b", "c", "d", "skip")
    return SearchSpace(tuple(Decision(f"op@l{i}", ops) for i in range(1, 4)))


def _cost(arch) -> float:
    price = {"a": 5.0, "b": 4.0, "c": 3.0, "d": 2.0, "skip": 0.0}
    return sum(price[v] for _, v in arch.items)


def test_choose_subnets_distinct_spread_and_seeded(space: SearchSpace) -> None:
    picks = choose_subnets(space, 8, np.random.default_rng(3), _cost)
    assert len(picks) == 8 and len(set(picks)) == 8
    costs = [_cost(a) for a in picks]
    assert costs == sorted(costs)
    assert costs[-1] - costs[0] >= 8  # spread over most of the 0..15 cost range
    assert choose_subnets(space, 8, np.random.default_rng(3), _cost) == picks


def test_choose_subnets_small_space_and_errors(space: SearchSpace) -> None:
    small = SearchSpace((Decision("x", ("p", "q", "r")),))
    price = {"p": 2.0, "q": 1.0, "r": 3.0}
    picks = choose_subnets(small, 3, np.random.default_rng(0), lambda a: price[a["x"]])
    assert [a["x"] for a in picks] == ["q", "p", "r"]  # the whole space, cheapest first
    with pytest.raises(ValueError):
        choose_subnets(small, 4, np.random.default_rng(0), lambda a: 0.0)
    with pytest.raises(ValueError):
        choose_subnets(space, 1, np.random.default_rng(0), _cost)
