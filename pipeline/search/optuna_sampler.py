"""Method B as an Optuna sampler over categorical parameters: ``optuna.create_study(sampler=MethodBSampler())``.

Needs the ``optuna`` package; nothing else in ``pipeline`` imports this module, so the pipeline's
stages never load Optuna. Each trial takes the next point of a :class:`pipeline.search.asktell.Searcher`
(its m points per iteration go to m trials in turn) and the trial's value is told back when it ends
(negated for ``direction="minimize"``; a failed or pruned trial is an invalid point, ranked last).

The searched space is ``search_space`` (name -> ``CategoricalDistribution``) when given, else the
categorical parameters every finished trial shares (Optuna's intersection search space), so the
first trial is random. Parameters outside it, trials sampled while all of an iteration's points are
still running (``n_jobs`` > m) and trials after the searcher has nothing more to ask come from
``RandomSampler``. With the same seed, a sequential study runs the trials that
``search(space, objective, budget=n_trials, seed=seed)`` would evaluate, in the same order.

Example::

    import optuna
    from pipeline.search.optuna_sampler import MethodBSampler

    def objective(trial):
        depth = trial.suggest_categorical("depth", [2, 4, 8, 16])
        act = trial.suggest_categorical("act", ["relu", "gelu"])
        return -abs(depth - 8) + (act == "gelu")

    study = optuna.create_study(direction="maximize", sampler=MethodBSampler(seed=0))
    study.optimize(objective, n_trials=20)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from pipeline.search.asktell import Searcher
from pipeline.search.space import Arch, Decision, SearchSpace


def decision(name: str, dist: CategoricalDistribution) -> Decision:
    """A parameter as a decision; its choices are named by ``repr`` (by position where two reprs collide)."""
    names = tuple(repr(c) for c in dist.choices)
    return Decision(name, names if len(set(names)) == len(names) else tuple(str(i) for i in range(len(names))))


class MethodBSampler(BaseSampler):
    """Method B (:class:`pipeline.search.asktell.Searcher`, every keyword of ``settings`` passed on)."""

    def __init__(self, search_space: Mapping[str, BaseDistribution] | None = None, *, seed: int | None = None,
                 **settings: Any) -> None:
        if search_space is not None:
            bad = [k for k, d in search_space.items() if not isinstance(d, CategoricalDistribution)]
            if bad:
                raise ValueError(f"MethodBSampler searches categorical parameters only; not categorical: {bad}")
        self._fixed = None if search_space is None else dict(search_space)
        self._seed, self._settings = seed, settings
        if "prior" in settings or "seed" in settings:
            raise ValueError("MethodBSampler takes seed= itself and no prior (its space is known only later)")
        Searcher(SearchSpace(), **settings)  # bad settings fail here, not inside a trial
        self._random = RandomSampler(seed=seed)
        self._lock = threading.Lock()
        self._searcher: Searcher | None = None
        self._dists: dict[str, CategoricalDistribution] = {}
        self._queue: list[Arch] = []  # asked from the searcher, not yet given to a trial
        self._trials: dict[int, Arch] = {}  # trial number -> the point it was given

    @property
    def searcher(self) -> Searcher | None:
        """The underlying ask/tell searcher (None until the search space is known)."""
        return self._searcher

    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._fixed is not None:
            return dict(self._fixed)
        if self._searcher is not None:
            return dict(self._dists)
        found = optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False))
        return {k: d for k, d in sorted(found.items()) if isinstance(d, CategoricalDistribution)}

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if len(study.directions) > 1:
            raise ValueError("MethodBSampler is single-objective; the study has several directions")
        if not search_space:
            return {}
        with self._lock:
            if self._searcher is None:
                self._dists = dict(search_space)  # type: ignore[arg-type]
                space = SearchSpace(tuple(decision(k, d) for k, d in self._dists.items()))
                self._searcher = Searcher(space, seed=0 if self._seed is None else self._seed, **self._settings)
            if not self._queue:
                self._queue = self._searcher.ask()
            if not self._queue:
                return {}  # waiting for running trials, or nothing more to ask: random sampling
            point = self._queue.pop(0)
            self._trials[trial.number] = point
            index = self._searcher.space.index(point)
            return {k: d.choices[i] for (k, d), i in zip(self._dists.items(), index, strict=True)}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        with self._lock:
            point = self._trials.pop(trial.number, None)
            if point is None or self._searcher is None:
                return
            index = self._searcher.space.index(point)
            given = {k: d.choices[i] for (k, d), i in zip(self._dists.items(), index, strict=True)}
            if any(k in trial.params and trial.params[k] != v for k, v in given.items()):
                self._searcher.cancel(point)  # the trial ran other values (e.g. fixed ones): not this point
                return
            value = None
            if state == TrialState.COMPLETE and values:
                value = values[0] if study.direction == StudyDirection.MAXIMIZE else -values[0]
            self._searcher.tell(point, value)
