"""Tests of pipeline.search.picks not already in test_probmodel: ``choice_entropy`` and ``max_entropy``
by hand, ``pool_size``, the greedy rule (``_greedy_max_entropy`` against a brute-force greedy, and
``greedy_pick``'s pool), each pick's input checks, ``m = 0``, seeding, and picks staying in P's support."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.search.picks import (
    _greedy_max_entropy,
    choice_entropy,
    entropy_pick,
    final_pick,
    greedy_pick,
    max_entropy,
    pick_archs,
    plain_pick,
    pool_size,
)
from pipeline.search.probmodel import ProbModel
from pipeline.search.space import Arch, Decision, SearchSpace

SMALL = SearchSpace((Decision("a", ("a0", "a1")), Decision("b", ("b0", "b1", "b2"))))
GRID = SearchSpace(tuple(Decision(f"d{j}", tuple(f"c{c}" for c in range(4))) for j in range(4)))


def arch(a: str, b: str) -> Arch:
    return SMALL.make({"a": a, "b": b})


def h(*freq: float) -> float:
    """Entropy (nats) of a histogram given as frequencies."""
    return -sum(f * math.log(f) for f in freq if f > 0)


def brute_force_greedy(space: SearchSpace, pool: list[Arch], m: int) -> list[Arch]:
    """Greedy by definition: each step keeps the free pool entry that maximises the kept set's
    choice entropy (ties: the first in pool order)."""
    kept: list[Arch] = []
    free = list(pool)
    for _ in range(min(m, len(pool))):
        scores = [choice_entropy(space, [*kept, a]) for a in free]
        best = next(i for i, s in enumerate(scores) if s >= max(scores) - 1e-9)
        kept.append(free.pop(best))
    return kept


def mid_model() -> ProbModel:
    """A P between uniform and collapsed on GRID (relative entropy about 0.6)."""
    return ProbModel.from_logits(GRID, [torch.tensor([1.5, 0.0, -0.5, 0.3]) * (j + 1) / 2 for j in range(4)])


# --- entropies ---------------------------------------------------------------------------------------


def test_choice_entropy_by_hand() -> None:
    archs = [arch("a0", "b0"), arch("a0", "b1"), arch("a1", "b0"), arch("a0", "b0")]
    # a: 3 x a0, 1 x a1; b: 3 x b0, 1 x b1, 0 x b2 (an empty bin adds nothing)
    assert choice_entropy(SMALL, archs) == pytest.approx(2 * h(0.75, 0.25))
    assert choice_entropy(SMALL, archs[::-1]) == pytest.approx(2 * h(0.75, 0.25))  # order does not matter
    assert choice_entropy(SMALL, [arch("a1", "b2")] * 3) == 0.0
    assert choice_entropy(SMALL, [arch("a0", "b0"), arch("a1", "b1"), arch("a0", "b2")]) == pytest.approx(
        h(2 / 3, 1 / 3) + math.log(3))


def test_choice_entropy_of_no_archs_is_zero() -> None:
    assert choice_entropy(SMALL, []) == 0.0


def test_max_entropy_is_the_uniform_models_entropy() -> None:
    assert max_entropy(SMALL) == pytest.approx(math.log(6))
    assert max_entropy(GRID) == pytest.approx(ProbModel.uniform(GRID).entropy())
    assert max_entropy(SearchSpace()) == 0.0
    assert max_entropy(SearchSpace((Decision("only", ("x",)),))) == 0.0


# --- pool_size ---------------------------------------------------------------------------------------


def test_pool_size_is_the_full_factor_at_a_uniform_model_or_without_shrinking() -> None:
    assert pool_size(ProbModel.uniform(GRID), 5, 8) == 40
    assert pool_size(mid_model(), 5, 8, shrink=False) == 40


def test_pool_size_shrinks_with_the_models_relative_entropy() -> None:
    model = mid_model()
    ratio = model.entropy() / max_entropy(GRID)
    assert 0.2 < ratio < 0.8
    assert pool_size(model, 5, 8) == 5 + round(7 * 5 * ratio)
    collapsed = ProbModel.from_probs(GRID, [[0.0, 1.0, 0.0, 0.0]] * 4)
    assert pool_size(collapsed, 5, 8) == 5  # a plain draw once P has collapsed
    assert pool_size(ProbModel.uniform(GRID), 5, 1) == 5  # factor 1: never more than m


def test_pool_size_of_a_space_without_real_choices_is_the_full_factor() -> None:
    single = SearchSpace((Decision("only", ("x",)),))
    assert pool_size(ProbModel.uniform(single), 3, 4) == 12  # h_max = 0: no division by zero


# --- the greedy rule ---------------------------------------------------------------------------------


def test_greedy_max_entropy_matches_a_brute_force_greedy() -> None:
    rng = np.random.default_rng(0)
    for trial in range(20):
        idx = rng.integers(0, 4, size=(14, 4))  # (P, D), repeats allowed
        pool = [GRID.from_index(tuple(int(c) for c in row)) for row in idx]
        m = 1 + trial % 7
        kept = _greedy_max_entropy(GRID, idx, m)
        assert len(kept) == len(set(kept)) == m
        assert [pool[i] for i in kept] == brute_force_greedy(GRID, pool, m)


def test_greedy_max_entropy_pads_decisions_of_fewer_choices() -> None:
    idx = np.array([[0, 0], [0, 1], [1, 2], [0, 2], [1, 0]])  # SMALL: 2 and 3 choices
    pool = [SMALL.from_index(tuple(row)) for row in idx]
    for m in range(1, 6):
        assert [pool[i] for i in _greedy_max_entropy(SMALL, idx, m)] == brute_force_greedy(SMALL, pool, m)


@pytest.mark.parametrize("shrink", [True, False])
def test_greedy_pick_keeps_greedily_from_a_pool_of_pool_size_draws(shrink: bool) -> None:
    model = mid_model()
    for seed in range(5):
        pool = model.sample_distinct(pool_size(model, 6, 5, shrink), np.random.default_rng(seed))
        picked = greedy_pick(model, 6, np.random.default_rng(seed), 5, shrink=shrink)
        assert picked == brute_force_greedy(GRID, pool, 6)


def test_greedy_pick_with_a_pool_of_m_is_a_plain_pick() -> None:
    model = mid_model()
    for seed in range(3):
        assert greedy_pick(model, 6, np.random.default_rng(seed), 1) == plain_pick(
            model, 6, np.random.default_rng(seed))


def test_pick_archs_passes_shrink_to_the_greedy_rule() -> None:
    model = mid_model()
    for shrink in (True, False):
        for seed in range(3):
            picked = pick_archs(model, 6, np.random.default_rng(seed), "greedy", 5, shrink=shrink)
            assert picked == greedy_pick(model, 6, np.random.default_rng(seed), 5, shrink=shrink)
    fixed_pool = [pick_archs(model, 6, np.random.default_rng(s), "greedy", 5, shrink=False) for s in range(3)]
    assert fixed_pool != [greedy_pick(model, 6, np.random.default_rng(s), 5) for s in range(3)]


# --- input checks, m = 0, seeding, support ---------------------------------------------------------------


@pytest.mark.parametrize("pick", [entropy_pick, plain_pick, greedy_pick])
def test_a_negative_m_is_refused(pick) -> None:  # noqa: ANN001 - one of the pick functions
    with pytest.raises(ValueError, match="m >= 0|m must be >= 0"):
        pick(ProbModel.uniform(GRID), -1, np.random.default_rng(0))


def test_greedy_pick_refuses_a_pool_factor_below_one() -> None:
    with pytest.raises(ValueError, match="pool_factor >= 1, got m=3, pool_factor=0"):
        greedy_pick(ProbModel.uniform(GRID), 3, np.random.default_rng(0), pool_factor=0)


@pytest.mark.parametrize("rule", ["entropy", "greedy", "plain"])
def test_picking_none_gives_none(rule: str) -> None:
    assert pick_archs(ProbModel.uniform(GRID), 0, np.random.default_rng(0), rule) == []
    assert final_pick(ProbModel.uniform(GRID), 0, np.random.default_rng(0)) == []


@pytest.mark.parametrize("rule", ["entropy", "greedy", "plain"])
def test_picks_are_seeded_distinct_and_in_the_space(rule: str) -> None:
    model = mid_model()
    first = pick_archs(model, 7, np.random.default_rng(5), rule)
    assert first == pick_archs(model, 7, np.random.default_rng(5), rule)
    assert len(first) == len(set(first)) == 7
    assert all(GRID.validate(a) == a for a in first)
    assert any(pick_archs(model, 7, np.random.default_rng(s), rule) != first for s in range(6, 10))


@pytest.mark.parametrize("rule", ["entropy", "greedy", "plain", "final"])
def test_picks_stay_in_the_support_of_p_and_stop_at_its_size(rule: str) -> None:
    """Choices of probability 0 are never picked; a support of 1 x 2 subnets gives 2, not 5."""
    model = ProbModel.from_probs(SMALL, [[0.0, 1.0], [0.5, 0.0, 0.5]])
    for seed in range(10):
        rng = np.random.default_rng(seed)
        picked = final_pick(model, 5, rng) if rule == "final" else pick_archs(model, 5, rng, rule)
        assert {a["a"] for a in picked} == {"a1"}
        assert {a["b"] for a in picked} <= {"b0", "b2"}
        assert len(picked) == len(set(picked)) == 2
