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

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.search.picks import PICKS, pick_archs
from pipeline.search.probmodel import ProbModel, mle_update
from pipeline.search.space import Arch, SearchSpace

# Frozen defaults, chosen on the synthetic family and then fixed (README: "Method B on its own"); the
# pick, once plain draws, is the Latin-hypercube entropy pick since it measured no worse on any benchmark.
DEFAULTS = {"m": 8, "step": 0.5, "smoothing": 0.02, "pick": "entropy", "pool_factor": 4, "restart_after": 10}
# A search whose m picks were all seen before, this many iterations in a row, has converged.
STALL_ITERATIONS = 50


@dataclass(frozen=True)
class Evaluation:
    """One call of ``evaluate``: its position (1-based), the iteration, the arch, and the value
    (None when the point is invalid: ``evaluate`` returned None, NaN or -inf)."""

    index: int
    iteration: int
    arch: Arch
    value: float | None
    best_value: float | None  # best valid value so far, this one included


@dataclass
class SearchResult:
    """Everything a search did: ``history`` holds every evaluation in order; ``iterations`` one
    record per model update (entropy, most likely arch); ``stopped`` says why it ended."""

    space: SearchSpace
    history: list[Evaluation] = field(default_factory=list)
    iterations: list[dict[str, Any]] = field(default_factory=list)
    model: ProbModel | None = None
    stopped: str = "budget"  # budget | stop | exhausted | converged | interrupted | error
    error: BaseException | None = None

    @property
    def evaluations(self) -> int:
        return len(self.history)

    @property
    def best(self) -> Evaluation | None:
        valid = [e for e in self.history if e.value is not None]
        return max(valid, key=lambda e: e.value, default=None)  # first of equals wins

    @property
    def best_arch(self) -> Arch | None:
        return None if self.best is None else self.best.arch

    @property
    def best_value(self) -> float | None:
        return None if self.best is None else self.best.value

    def evaluations_until(self, accept: Callable[[Arch], bool]) -> int | None:
        """How many evaluations it took to first evaluate an accepted arch (None: never)."""
        return next((e.index for e in self.history if accept(e.arch)), None)


def _clean(value: Any, arch: Arch) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"evaluate({arch.key()}) returned {value!r}; expected a number or None") from None
    return None if math.isnan(x) or x == -math.inf else x


class _Recorder:
    """Runs ``evaluate`` once per distinct arch, records it, and says when to stop."""

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
        value = _clean(self.evaluate(arch), arch)
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


def _generator(seed: int | np.random.Generator) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


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


def search(space: SearchSpace, evaluate: Callable[[Arch], float | None], *, budget: int,
           seed: int | np.random.Generator = 0, m: int = DEFAULTS["m"], step: float = DEFAULTS["step"],
           smoothing: float = DEFAULTS["smoothing"], pick: str = DEFAULTS["pick"],
           pool_factor: int = DEFAULTS["pool_factor"], utility: str = "rank", temperature: float = 1.0,
           shrink_pool: bool = True, restart_after: int | None = DEFAULTS["restart_after"],
           prior: ProbModel | None = None, callback: Callable[[Evaluation], Any] | None = None,
           stop: Callable[[Evaluation], bool] | None = None) -> SearchResult:
    """Method B on a black-box objective: at most ``budget`` distinct evaluations.

    Each iteration picks m distinct archs from P (``pick``: ``"entropy"``, the entropy-maximising
    Latin-hypercube pick; ``"greedy"``, the first entropy pick, greedy over a pool of draws; or
    ``"plain"`` draws), evaluates the new ones, and sets ``P = step * MLE + (1 - step) * P`` with the MLE on
    rank utilities (``utility="softmax"`` with ``temperature`` is the scale-dependent original;
    ``"elite"`` the cross-entropy method's). ``shrink_pool=False`` keeps the greedy pick's pool at
    ``pool_factor * m`` (the original rule) instead of shrinking it with P's entropy. When
    ``restart_after`` iterations in a row improve on nothing this restart has seen (or bring no new
    architecture), P has converged: it restarts from the prior, keeping every value (``None``: no
    restarts; the search then ends as ``converged`` after 50 iterations without a new architecture).
    ``callback(evaluation)`` runs after every evaluation; ``stop(evaluation)`` ends the search when
    it returns True. ``result.error`` holds an exception raised by ``evaluate`` (the search ends,
    the history is kept); check ``result.stopped``.
    """
    _check(space, budget)
    if pick not in PICKS:
        raise ValueError(f"pick must be one of {PICKS}, got {pick!r}")
    if m < 1 or pool_factor < 1:
        raise ValueError(f"need m >= 1 and pool_factor >= 1, got m={m}, pool_factor={pool_factor}")
    model = ProbModel.uniform(space) if prior is None else prior
    if model.space != space:
        raise ValueError("prior is over a different search space")
    if restart_after is not None and (isinstance(restart_after, bool) or not isinstance(restart_after, int)
                                      or restart_after < 1):
        raise ValueError(f"restart_after must be None or an int >= 1, got {restart_after!r}")
    start = model
    rng = _generator(seed)
    result = SearchResult(space, model=model)
    rec = _Recorder(result, evaluate, budget, callback, stop)

    def loop() -> None:
        stalled, flat, iteration = 0, 0, 0
        run_best: float | None = None  # best value seen by this restart's picks
        while not rec.done:
            if len(rec.values) >= space.size():
                result.stopped = "exhausted"
                return
            iteration += 1
            picked = pick_archs(result.model, m, rng, pick, pool_factor, shrink=shrink_pool)
            new = sum(rec.score(a, iteration) for a in picked)
            scored = [a for a in picked if a in rec.values]
            stalled = 0 if new else stalled + 1
            top = max((v for a in scored if (v := rec.values[a]) is not None), default=None)
            if top is not None and (run_best is None or top > run_best):
                run_best, flat = top, 0
            else:
                flat += 1
            if restart_after is not None and (flat >= restart_after or stalled >= restart_after):
                # P has converged on what it has seen: start again from the prior, keep every value
                result.model, stalled, flat, run_best = start, 0, 0, None
                result.iterations.append({"iteration": iteration, "evaluations": len(rec.values),
                                          "entropy": start.entropy(), "restart": True})
                continue
            if stalled >= STALL_ITERATIONS:
                result.stopped = "converged"
                return
            values = [rec.values[a] for a in scored]
            perf = torch.tensor([-math.inf if v is None else v for v in values], dtype=torch.float64)
            result.model = mle_update(result.model, scored, perf, temperature, smoothing, step, utility)
            result.iterations.append({"iteration": iteration, "evaluations": len(rec.values),
                                      "entropy": result.model.entropy(),
                                      "most_likely": result.model.most_likely().key()})

    return _guarded(result, loop)


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
        for arch in random_order(space, _generator(seed)):
            if rec.done:
                return
            rec.score(arch, 0)
        if not rec.done:
            result.stopped = "exhausted"

    return _guarded(result, loop)
