"""Tests of the public black-box search API (pipeline.search.search / random_search)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.search import Decision, SearchSpace, random_search, search
from pipeline.search.probmodel import ProbModel, elite_weights, mle_update, rank_weights, utility_weights
from pipeline.search.synthetic import make_synthetic


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace(tuple(Decision(f"d{j}", tuple(f"c{c}" for c in range(4))) for j in range(4)))


def score(space: SearchSpace):
    return lambda a: float(sum(space.index(a)))  # best: every decision at its last choice


# --- rank utilities ------------------------------------------------------------------------------


def test_rank_weights_are_invariant_to_monotone_transforms() -> None:
    perf = np.array([0.3, -1.0, 2.5, 0.31, 7.0, -3.0])
    w = rank_weights(perf)
    assert w.sum() == pytest.approx(1.0) and (w >= 0).all()
    for transform in (lambda x: 0.01 * x, lambda x: 100 * x + 1e6, np.exp, lambda x: x**3):
        assert np.array_equal(rank_weights(transform(perf)), w)
    assert w.argmax() == 4 and w[[1, 5]].sum() == 0  # the worse half gets nothing


def test_rank_weights_share_ties_and_ignore_invalid() -> None:
    w = rank_weights([1.0, 1.0, 0.0, math.nan, -math.inf])
    assert w[0] == w[1] > w[2] >= 0 and w[3] == w[4] == 0 and w.sum() == pytest.approx(1.0)
    assert rank_weights([math.nan, -math.inf]).sum() == 0
    assert np.array_equal(rank_weights([5.0]), [1.0])
    assert rank_weights([2.0, 2.0, 2.0]).tolist() == pytest.approx([1 / 3] * 3)


def test_elite_weights_keep_the_best_quarter() -> None:
    w = elite_weights(np.arange(8.0))
    assert w.tolist() == [0, 0, 0, 0, 0, 0, 0.5, 0.5]


def test_rank_utility_passes_gradient_through_surrogate() -> None:
    perf = torch.tensor([0.1, 0.5, 0.2, 0.9], dtype=torch.float64, requires_grad=True)
    w = utility_weights(perf, "rank")
    assert torch.allclose(w.detach(), torch.as_tensor(rank_weights(perf.detach().numpy())))
    (w * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    assert perf.grad is not None and float(perf.grad.abs().sum()) > 0


def test_mle_update_with_nothing_usable_keeps_the_model(space: SearchSpace) -> None:
    prev = ProbModel.uniform(space)
    archs = [space.from_index((0, 1, 2, 3)), space.from_index((1, 1, 1, 1))]
    new = mle_update(prev, archs, torch.tensor([-math.inf, math.nan], dtype=torch.float64), 1.0, 0.1, 0.5)
    assert new.is_uniform()


# --- search --------------------------------------------------------------------------------------


def test_search_has_defaults_and_finds_the_optimum(space: SearchSpace) -> None:
    result = search(space, score(space), budget=120)
    assert result.best_value == 12.0 and result.stopped == "budget"
    assert result.evaluations == len(result.history) == 120
    assert len({e.arch for e in result.history}) == 120  # distinct
    assert [e.index for e in result.history] == list(range(1, 121))
    best = [e.best_value for e in result.history]
    assert best == sorted(best) and best[-1] == 12.0


def test_search_is_seeded(space: SearchSpace) -> None:
    runs = [[e.arch for e in search(space, score(space), budget=40, seed=s).history] for s in (3, 3, 4)]
    assert runs[0] == runs[1] != runs[2]


def test_search_is_the_same_under_scale_and_offset() -> None:
    obj = make_synthetic(np.random.default_rng(5))
    base = [e.arch for e in search(obj.space, obj, budget=300, seed=1).history]
    for a, b in ((0.01, 0.0), (100.0, 0.0), (1.0, 1000.0)):
        shifted = search(obj.space, lambda x, a=a, b=b: a * obj(x) + b, budget=300, seed=1)
        assert [e.arch for e in shifted.history] == base


def test_softmax_utility_depends_on_scale() -> None:
    obj = make_synthetic(np.random.default_rng(5))
    runs = [[e.arch for e in search(obj.space, lambda x, a=a: a * obj(x), budget=300, seed=1,
                                    utility="softmax", temperature=0.2).history] for a in (0.01, 100.0)]
    assert runs[0] != runs[1]


def test_invalid_points_are_the_worst_and_never_raise(space: SearchSpace) -> None:
    def evaluate(a):
        i = space.index(a)
        if i[0] == 0:
            return None
        if i[0] == 1:
            return math.nan
        return -math.inf if i[0] == 2 else float(sum(i))

    result = search(space, evaluate, budget=80)
    assert result.stopped == "budget" and result.best_value == 12.0
    assert all(e.value is None for e in result.history if space.index(e.arch)[0] < 3)
    assert result.model.probs("d0")[3] == result.model.probs("d0").max()


def test_all_invalid_keeps_a_usable_model(space: SearchSpace) -> None:
    result = search(space, lambda a: None, budget=50)
    assert result.evaluations == 50 and result.best_arch is None and result.best_value is None
    assert result.model.is_uniform()


def test_bad_return_type_is_reported_with_the_arch(space: SearchSpace) -> None:
    result = search(space, lambda a: "high", budget=10)
    assert result.stopped == "error" and isinstance(result.error, TypeError)
    assert "d0=" in str(result.error) and result.evaluations == 0


def test_callback_and_stop_predicate(space: SearchSpace) -> None:
    seen = []
    result = search(space, score(space), budget=256, callback=seen.append,
                    stop=lambda e: e.value is not None and e.value >= 11)
    assert result.stopped == "stop" and seen == result.history and result.history[-1].value >= 11
    assert all(e.value < 11 for e in result.history[:-1])


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_or_error_returns_the_result_so_far(space: SearchSpace, exc: type[BaseException]) -> None:
    calls = []

    def evaluate(a):
        calls.append(a)
        if len(calls) == 7:
            raise exc("boom")
        return float(sum(space.index(a)))

    result = search(space, evaluate, budget=100)
    assert result.evaluations == 6 and result.best_value is not None
    assert result.stopped == ("interrupted" if exc is KeyboardInterrupt else "error")
    assert (result.error is None) == (exc is KeyboardInterrupt)


def test_small_space_is_exhausted(space: SearchSpace) -> None:
    tiny = SearchSpace((Decision("a", ("x", "y")), Decision("b", ("u", "v", "w"))))
    result = search(tiny, lambda a: 1.0, budget=100)
    assert result.evaluations == 6 and result.stopped in ("exhausted", "converged")


@pytest.mark.parametrize("kwargs", [{"budget": -1}, {"budget": 2.5}, {"budget": True}, {"budget": 5, "m": 0},
                                    {"budget": 5, "pick": "best"}, {"budget": 5, "utility": "z"}])
def test_bad_arguments_raise(space: SearchSpace, kwargs) -> None:
    with pytest.raises((ValueError, TypeError)):
        result = search(space, score(space), **kwargs)
        if result.error is not None:
            raise result.error


# --- random search -------------------------------------------------------------------------------


def test_random_search_has_the_same_signature_and_prefix_stable_draws(space: SearchSpace) -> None:
    long = random_search(space, score(space), budget=200, seed=9)
    short = random_search(space, score(space), budget=30, seed=9)
    assert [e.arch for e in short.history] == [e.arch for e in long.history][:30]
    assert long.evaluations == 200 == len({e.arch for e in long.history})
    assert random_search(space, score(space), budget=1000).stopped == "exhausted"
    stopped = random_search(space, score(space), budget=256, stop=lambda e: e.value == 12.0)
    assert stopped.stopped == "stop" and stopped.best_value == 12.0


def test_search_beats_random_search_on_synthetic_objectives() -> None:
    """Evaluations until a top-0.1% arch (of 15625) is first evaluated; misses count as the budget."""
    budget, searched, randomised = 2000, [], []
    for rep in range(8):
        obj = make_synthetic(np.random.default_rng(100 + rep))
        top = obj.top_set(0.001)
        searched.append(search(obj.space, obj, budget=budget, seed=rep).evaluations_until(top.__contains__)
                        or budget)
        randomised.append(random_search(obj.space, obj, budget=budget, seed=rep)
                          .evaluations_until(top.__contains__) or budget)
    assert np.median(searched) < 0.4 * np.median(randomised)


def test_converged_model_restarts_and_keeps_searching(space: SearchSpace) -> None:
    # a deceptive objective: a broad basin away from the single best point
    best = space.from_index((0, 0, 0, 0))

    def evaluate(a):
        return 100.0 if a == best else float(sum(space.index(a)))

    # the default before the picks around the best archs (docs/RESULTS.md "Method B on its own"): no picks
    # around the best, which would walk out of the basin
    restarted = search(space, evaluate, budget=256, seed=2, stop=lambda e: e.value == 100.0, restart_after=10,
                       around=0.0)
    assert restarted.best_value == 100.0 and restarted.stopped == "stop"
    assert any(r.get("restart") for r in restarted.iterations)
    stuck = search(space, evaluate, budget=256, seed=2, restart_after=None, around=0.0)
    assert stuck.stopped == "converged" and stuck.evaluations < 256
    # the default (picks around the recent best archs) needs its late restarts to leave the basin
    found = search(space, evaluate, budget=256, seed=2, stop=lambda e: e.value == 100.0)
    assert found.stopped == "stop" and any(r.get("restart") for r in found.iterations)
    assert search(space, evaluate, budget=256, seed=2, restart_after=None).stopped == "converged"
    with pytest.raises(ValueError):
        search(space, evaluate, budget=5, restart_after=0)
