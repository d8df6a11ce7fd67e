"""Method B as an Optuna sampler, in real Optuna studies (skipped where optuna is not installed)."""

from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import CategoricalDistribution, FloatDistribution  # noqa: E402

from pipeline.search import search  # noqa: E402
from pipeline.search.optuna_sampler import MethodBSampler, decision  # noqa: E402
from pipeline.search.space import SearchSpace  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
CHOICES = {"depth": [2, 4, 8, 16], "act": ["relu", "gelu", "silu"], "norm": [None, "bn", "ln"], "w": [1, 2, 3, 4]}
SPACE = {k: CategoricalDistribution(v) for k, v in CHOICES.items()}


def score(p) -> float:
    return -abs(p["depth"] - 8) + (p["act"] == "gelu") + (p["norm"] == "bn") * p["w"] - 0.5 * (p["w"] == 4)


def objective(trial) -> float:
    return score({k: trial.suggest_categorical(k, v) for k, v in CHOICES.items()})


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_a_sequential_study_runs_search_s_points(direction: str) -> None:
    sign = 1.0 if direction == "maximize" else -1.0
    study = optuna.create_study(direction=direction, sampler=MethodBSampler(SPACE, seed=3))
    study.optimize(lambda t: sign * objective(t), n_trials=40)
    space = SearchSpace(tuple(decision(k, d) for k, d in SPACE.items()))

    def evaluate(arch):  # the same objective on search()'s archs
        return score({k: SPACE[k].choices[i] for k, i in zip(SPACE, space.index(arch), strict=True)})

    expected = [space.index(e.arch) for e in search(space, evaluate, budget=40, seed=3).history]
    ran = [tuple(CHOICES[k].index(t.params[k]) for k in SPACE) for t in study.trials]
    assert ran == expected and len(set(ran)) == 40  # distinct points, in search()'s order
    assert study.best_value == sign * max(evaluate(a) for a in space.enumerate())  # found the optimum


def test_inferred_space_failed_trials_and_other_parameters() -> None:
    sampler = MethodBSampler(seed=0)

    def objective_with_float(trial):
        x = trial.suggest_float("x", 0.0, 1.0)
        value = objective(trial)
        if trial.params["act"] == "silu":
            raise ValueError("silu fails")
        return value + x

    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective_with_float, n_trials=30, catch=(ValueError,))
    searcher = sampler.searcher
    assert searcher is not None and searcher.space.labels == tuple(sorted(CHOICES))  # categorical ones only
    first = min(t.number for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert searcher.evaluations == 30 - first - 1  # random until a trial completed: the space was unknown
    failed = [e for e in searcher.history if e.arch["act"] == "'silu'"]
    assert failed and all(e.value is None for e in failed)
    assert all(t.state == optuna.trial.TrialState.FAIL for t in study.trials if t.params["act"] == "silu")


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="not categorical: \\['x'\\]"):
        MethodBSampler({"x": FloatDistribution(0, 1)})
    with pytest.raises(ValueError, match="pick"):
        MethodBSampler(SPACE, pick="best")
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=MethodBSampler(SPACE))
    with pytest.raises(ValueError, match="single-objective"):
        study.optimize(lambda t: (objective(t), 0.0), n_trials=1)
