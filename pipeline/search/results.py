"""What a black-box search returns: one :class:`Evaluation` per call of the objective, and the
:class:`SearchResult` holding them; :func:`clean_value` turns an objective's return into a value."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.search.probmodel import ProbModel
from pipeline.search.space import Arch, SearchSpace


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


def clean_value(value: Any, arch: Arch) -> float | None:
    """``evaluate``'s return as a float, or None for an invalid point (None, NaN, -inf); anything
    that is not a number is a TypeError naming the arch."""
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"evaluate({arch.key()}) returned {value!r}; expected a number or None") from None
    return None if math.isnan(x) or x == -math.inf else x
