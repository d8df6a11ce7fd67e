"""Black-box search over any categorical space: method B with a fixed scorer, and random search.

``search(space, evaluate, budget=...)`` picks m architectures from P, scores each new one with
``evaluate`` (higher is better; ``None``, NaN or -inf mark an invalid point, which ranks last), fits
P by maximum likelihood on rank-based utilities, and repeats until ``budget`` distinct evaluations,
a ``stop`` predicate, Ctrl-C or an exception in ``evaluate``; it always returns the result so far,
with every evaluation in order. Only distinct architectures are evaluated; repeats reuse the value.

Example on a space of your own::

    from pipeline.search import Decision, SearchSpace, search
    space = SearchSpace((Decision("depth", ("2", "4", "8")), Decision("act", ("relu", "gelu"))))
    result = search(space, lambda a: -abs(int(a["depth"]) - 4) + (a["act"] == "gelu"), budget=6)
    print(result.best_arch, result.best_value, result.stopped)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from pipeline.search.asktell import DEFAULTS, STALL_ITERATIONS, Searcher, generator
from pipeline.search.probmodel import ProbModel
from pipeline.search.results import Evaluation, SearchResult, clean_value
from pipeline.search.space import Arch, SearchSpace

__all__ = ["DEFAULTS", "STALL_ITERATIONS", "Evaluation", "SearchResult", "random_search", "search"]


class _Recorder:
    """Runs ``evaluate`` once per distinct arch, records it, and says when to stop (random search)."""

    def __init__(self, result: SearchResult, evaluate: Callable[[Arch], Any], budget: int,
                 callback: Callable[[Evaluation], Any] | None, stop: Callable[[Evaluation], bool] | None):
        self.result, self.evaluate, self.budget = result, evaluate, budget
        self.callback, self.stop = callback, stop
        self.values: dict[Arch, float | None] = {}
        self.best: float | None = None
        self.done = budget <= 0

    def score(self, arch: Arch, iteration: int) -> bool:
        """Evaluate ``arch`` if new; True if it was new. Sets ``done`` and ``result.stopped``."""
        if arch in self.values or self.done:
            return False
        value = clean_value(self.evaluate(arch), arch)
        self.values[arch] = value
        if value is not None and (self.best is None or value > self.best):
            self.best = value
        record = Evaluation(len(self.result.history) + 1, iteration, arch, value, self.best)
        self.result.history.append(record)
        if self.callback is not None:
            self.callback(record)
        if self.stop is not None and self.stop(record):
            self.done, self.result.stopped = True, "stop"
        elif len(self.values) >= self.budget:
            self.done, self.result.stopped = True, "budget"
        return True


def _check(space: SearchSpace, budget: int) -> None:
    if not isinstance(space, SearchSpace):
        raise TypeError(f"space must be a SearchSpace, got {type(space).__name__}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be an int >= 0, got {budget!r}")


def _guarded(result: SearchResult, body: Callable[[], None]) -> SearchResult:
    """Run the search loop; Ctrl-C or an exception in ``evaluate`` ends it with the result so far."""
    try:
        body()
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    except Exception as exc:  # noqa: BLE001 - any failure of the user's evaluate keeps the history
        result.stopped, result.error = "error", exc
    return result


def _values(points: Sequence[Arch], evaluate: Callable[[Arch], Any], executor: Executor | None):
    """``evaluate`` of each point, yielded in the points' order: one at a time, or all submitted to
    ``executor`` at once. Closing the generator early cancels whatever has not started."""
    if executor is None:
        for a in points:
            yield evaluate(a)
        return
    futures: list[Future] = [executor.submit(evaluate, a) for a in points]
    try:
        for f in futures:
            yield f.result()
    finally:
        for f in futures:
            f.cancel()


def _loop(searcher: Searcher, result: SearchResult, evaluate: Callable[[Arch], float | None], budget: int,
          executor: Executor | None, callback: Callable[[Evaluation], Any] | None,
          stop: Callable[[Evaluation], bool] | None) -> None:
    """Ask, evaluate, tell until the budget is spent, the searcher stops or ``stop`` says so;
    ``result.stopped`` says which."""
    while searcher.evaluations < budget:
        points = searcher.ask()
        if not points:
            result.stopped = searcher.stopped or "budget"
            return
        take = points[:budget - searcher.evaluations]
        for a in points[len(take):]:
            searcher.cancel(a)
        values = _values(take, evaluate, executor)
        try:
            for a, value in zip(take, values, strict=True):
                record = searcher.tell(a, value)
                if callback is not None:
                    callback(record)
                if stop is not None and stop(record):
                    for rest in searcher.pending:
                        searcher.cancel(rest)
                    result.stopped = "stop"
                    return
        finally:
            values.close()
    result.stopped = "budget"


def search(space: SearchSpace, evaluate: Callable[[Arch], float | None], *, budget: int,
           seed: int | np.random.Generator = 0, m: int = DEFAULTS["m"], step: float = DEFAULTS["step"],
           smoothing: float = DEFAULTS["smoothing"], pick: str = DEFAULTS["pick"],
           pool_factor: int = DEFAULTS["pool_factor"], utility: str = "rank", temperature: float = 1.0,
           shrink_pool: bool = True, restart_after: int | None = DEFAULTS["restart_after"],
           prior: ProbModel | None = None, callback: Callable[[Evaluation], Any] | None = None,
           stop: Callable[[Evaluation], bool] | None = None, executor: Executor | None = None,
           elite: int = DEFAULTS["elite"], local: float = DEFAULTS["local"], around: float = DEFAULTS["around"],
           centres: int = DEFAULTS["centres"], rate: float | str | None = DEFAULTS["rate"],
           structure: str = DEFAULTS["structure"], age: int | None = DEFAULTS["age"],
           initial: int | None = DEFAULTS["initial"]) -> SearchResult:
    """Method B on a black-box objective: at most ``budget`` distinct evaluations.

    Each iteration picks m distinct archs from P (``pick``: ``"entropy"``, the entropy-maximising
    Latin-hypercube pick; ``"greedy"``, the first entropy pick, greedy over a pool of draws; or
    ``"plain"`` draws), evaluates the new ones, and sets ``P = step * MLE + (1 - step) * P`` with the MLE on
    rank utilities (``utility="softmax"`` with ``temperature`` is the scale-dependent original;
    ``"elite"`` the cross-entropy method's). ``shrink_pool=False`` keeps the greedy pick's pool at
    ``pool_factor * m`` (the original rule) instead of shrinking it with P's entropy. When
    ``restart_after`` iterations in a row improve on nothing this restart has seen (or bring no new
    architecture), P has converged: it restarts from the prior, keeping every value (``None``: no
    restarts; the search then ends as ``converged`` after 50 iterations without a new
    architecture).
    ``callback(evaluation)`` runs after every evaluation; ``stop(evaluation)`` ends the search when
    it returns True. ``result.error`` holds an exception raised by ``evaluate`` (the search ends,
    the history is kept); check ``result.stopped``. Once an iteration has been scored (docs/RESULTS.md
    "Method B against the NAS baselines"),
    ``around`` (default 0.875: 7 of 8) of the m picks are drawn from P around the ``centres`` (8) best of
    the last ``age`` (20; None: all) archs this restart scored, by rank weight, with one decision redrawn
    from P (``rate=None``; a number: each decision with that probability; ``"entropy"``: annealed with
    P's entropy), :mod:`pipeline.search.neighbourhood`; with these the default restarts only after 30
    iterations.
    Variants, off by default: ``structure="tree"`` (a Chow-Liu tree over pair tables fitted by the same
    MLE, :mod:`pipeline.search.treemodel`), ``initial`` (points of each restart's first iteration), ``elite`` (the
    restart's best archs join each fit) and ``local`` (that fraction of the m picks are one-change
    neighbours of the restart's best arch); ``around=0.0, restart_after=10`` is the default before the
    picks around the best (``pipeline.search.asktell.BEFORE_40``, docs/RESULTS.md "Method B on its own").

    ``executor`` (any :class:`concurrent.futures.Executor`: a thread or process pool, Dask's
    ``client.get_executor()``) evaluates an iteration's new points together; the results are taken
    in the points' order, so history, model and ``stopped`` are those of the serial run with the
    same seed. Points evaluated past a stop, a failure or Ctrl-C are dropped, and points not yet
    started are cancelled. The loop is :class:`pipeline.search.asktell.Searcher` (ask/tell).
    """
    _check(space, budget)
    searcher = Searcher(space, seed=seed, m=m, step=step, smoothing=smoothing, pick=pick, pool_factor=pool_factor,
                        utility=utility, temperature=temperature, shrink_pool=shrink_pool,
                        restart_after=restart_after, prior=prior, elite=elite, local=local,
                        around=around, centres=centres, rate=rate, structure=structure, age=age, initial=initial)
    result = SearchResult(space, model=searcher.model)

    _guarded(result, lambda: _loop(searcher, result, evaluate, budget, executor, callback, stop))
    result.history, result.iterations, result.model = searcher.history, searcher.iterations, searcher.model
    return result


def _unrank(space: SearchSpace, rank: int) -> Arch:
    """The arch at position ``rank`` of ``space.enumerate()`` (last decision varies fastest)."""
    index = []
    for d in reversed(space.decisions):
        rank, r = divmod(rank, len(d.choices))
        index.append(r)
    return space.from_index(tuple(reversed(index)))


# Spaces up to this size draw from a full permutation; larger ones by rejection.
PERMUTATION_LIMIT = 2**22


def random_order(space: SearchSpace, rng: np.random.Generator):
    """Every arch of ``space`` once, in random order; the sequence depends on the seed only, so
    any budget sees a prefix of the same draws."""
    size = space.size()
    if size <= PERMUTATION_LIMIT:
        for r in rng.permutation(size):
            yield _unrank(space, int(r))
        return
    seen: set[tuple[int, ...]] = set()
    while len(seen) < size:
        index = tuple(int(rng.integers(len(d.choices))) for d in space.decisions)
        if index not in seen:
            seen.add(index)
            yield space.from_index(index)


def random_search(space: SearchSpace, evaluate: Callable[[Arch], float | None], *, budget: int,
                  seed: int | np.random.Generator = 0, callback: Callable[[Evaluation], Any] | None = None,
                  stop: Callable[[Evaluation], bool] | None = None) -> SearchResult:
    """Baseline with :func:`search`'s signature: distinct archs uniformly at random, prefix-stable."""
    _check(space, budget)
    result = SearchResult(space, model=ProbModel.uniform(space))
    rec = _Recorder(result, evaluate, budget, callback, stop)

    def loop() -> None:
        for arch in random_order(space, generator(seed)):
            if rec.done:
                return
            rec.score(arch, 0)
        if not rec.done:
            result.stopped = "exhausted"

    return _guarded(result, loop)
