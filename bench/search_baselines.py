"""The NAS literature's baselines for bench/search_methods.py, with search()'s signature and result.

* regularized evolution (Real et al., AAAI 2019, "aging evolution"): a population of the last
  ``population`` evaluated archs (started at random), each step the best of ``sample`` members drawn
  at random is mutated (one decision changed to another choice) and the child replaces the oldest;
* local search in the form of White et al. (UAI 2021, "Local search is state of the art for NAS
  benchmarks"): from a random arch, evaluate its whole one-change neighbourhood (in random order),
  move to the best neighbour while it improves (best improvement), restart at random at a local optimum;
* Optuna's ``TPESampler`` (default settings) with one categorical parameter per decision (needs optuna).

All count distinct evaluations (a repeat reuses its value) and stop at ``budget``, at ``stop`` or when
they keep proposing only known points. Invalid points (None) rank last. Not library code: the library's
searcher is :func:`pipeline.search.search`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.search.results import Evaluation, SearchResult, clean_value
from pipeline.search.space import Arch, SearchSpace

# Tuned once on the synthetic family (50 objectives of --seed 99; population 10-100, sample 3-25; the
# paper's 100 / 25 needed 2.8x the evaluations of 20 / 10), then frozen.
EVOLUTION = {"population": 20, "sample": 10}
# A method that proposes this many known points in a row has stopped exploring.
IDLE_LIMIT = 10_000
# TPE's cost per trial grows with the trials (about 60 s for 800 on this 2-core machine): a cap on its trials.
TPE_TRIALS = 400


class _Done(Exception):
    pass


class Counter:
    """``evaluate`` behind a cache: distinct evaluations recorded as search()'s history; _Done at the end."""

    def __init__(self, space: SearchSpace, evaluate: Callable[[Arch], Any], budget: int,
                 stop: Callable[[Evaluation], bool] | None, idle_limit: int = IDLE_LIMIT) -> None:
        self.space, self.evaluate, self.budget, self.stop = space, evaluate, budget, stop
        self.idle_limit = idle_limit
        self.values: dict[Arch, float | None] = {}
        self.result = SearchResult(space)
        self.best: float | None = None
        self.idle = 0

    def __call__(self, arch: Arch) -> float:
        """The arch's value, -inf for an invalid one."""
        if arch not in self.values:
            if len(self.values) >= self.budget:
                raise _Done("budget")
            value = clean_value(self.evaluate(arch), arch)
            self.values[arch] = value
            if value is not None and (self.best is None or value > self.best):
                self.best = value
            record = Evaluation(len(self.values), 0, arch, value, self.best)
            self.result.history.append(record)
            self.idle = 0
            if self.stop is not None and self.stop(record):
                raise _Done("stop")
        else:
            self.idle += 1
            if self.idle > self.idle_limit or len(self.values) >= self.space.size():
                raise _Done("converged")
        value = self.values[arch]
        return -np.inf if value is None else value

    def run(self, body: Callable[[], None]) -> SearchResult:
        try:
            body()
        except _Done as done:
            self.result.stopped = str(done)
        return self.result


def _random_arch(space: SearchSpace, rng: np.random.Generator) -> Arch:
    return space.from_index(tuple(int(rng.integers(len(d.choices))) for d in space.decisions))


def _mutate(space: SearchSpace, arch: Arch, rng: np.random.Generator) -> Arch:
    index = list(space.index(arch))
    j = int(rng.integers(len(index)))
    n = len(space.decisions[j].choices)
    index[j] = (index[j] + 1 + int(rng.integers(n - 1))) % n if n > 1 else index[j]
    return space.from_index(tuple(index))


def _neighbours(space: SearchSpace, arch: Arch) -> list[Arch]:
    index = space.index(arch)
    return [space.from_index(index[:j] + (c,) + index[j + 1:]) for j, d in enumerate(space.decisions)
            for c in range(len(d.choices)) if c != index[j]]


def regularized_evolution(space: SearchSpace, evaluate: Callable[[Arch], Any], *, budget: int, seed: int = 0,
                          population: int = EVOLUTION["population"], sample: int = EVOLUTION["sample"],
                          stop: Callable[[Evaluation], bool] | None = None) -> SearchResult:
    rng = np.random.default_rng(seed)
    f = Counter(space, evaluate, budget, stop)

    def body() -> None:
        alive: collections.deque[tuple[Arch, float]] = collections.deque()
        while len(alive) < population:
            arch = _random_arch(space, rng)
            alive.append((arch, f(arch)))
        while True:
            picks = rng.choice(len(alive), size=min(sample, len(alive)), replace=False)
            parent = max((alive[int(i)] for i in picks), key=lambda p: p[1])[0]
            child = _mutate(space, parent, rng)
            alive.append((child, f(child)))
            alive.popleft()

    return f.run(body)


def local_search(space: SearchSpace, evaluate: Callable[[Arch], Any], *, budget: int, seed: int = 0,
                 stop: Callable[[Evaluation], bool] | None = None) -> SearchResult:
    rng = np.random.default_rng(seed)
    f = Counter(space, evaluate, budget, stop)

    def body() -> None:
        while True:
            current = _random_arch(space, rng)
            value = f(current)
            while True:
                around = _neighbours(space, current)
                scored = [(f(around[int(i)]), around[int(i)]) for i in rng.permutation(len(around))]
                best_value, best = max(scored, key=lambda p: p[0])
                if best_value <= value:
                    break  # a local optimum: restart
                current, value = best, best_value

    return f.run(body)


def tpe(space: SearchSpace, evaluate: Callable[[Arch], Any], *, budget: int, seed: int = 0,
        stop: Callable[[Evaluation], bool] | None = None, trials: int = TPE_TRIALS) -> SearchResult:
    """TPE for at most ``trials`` trials (repeats included; ``stopped`` is then ``"trials"``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    dists = {d.label: optuna.distributions.CategoricalDistribution(d.choices) for d in space.decisions}
    f = Counter(space, evaluate, budget, stop)

    def body() -> None:
        for _ in range(trials):
            trial = study.ask(dists)
            value = f(space.make(trial.params))
            if value == -np.inf:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)
        raise _Done("trials")

    return f.run(body)
