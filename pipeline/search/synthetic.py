"""A synthetic black-box objective with a known optimum, to test and benchmark the search.

Score = sum of a per-(decision, choice) term plus small interactions between neighbouring
decisions, so that the landscape is mostly but not exactly separable (as supernet rankings are).
Small enough to enumerate, so the optimum and the top set are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.search.space import Arch, Decision, SearchSpace


@dataclass(frozen=True, eq=False)
class SyntheticObjective:
    """``unary`` (D, C) per-choice terms; ``pairwise`` (D-1, C, C) between decisions j and j+1."""

    space: SearchSpace
    unary: np.ndarray
    pairwise: np.ndarray

    def __call__(self, arch: Arch) -> float:
        idx = self.space.index(arch)
        score = sum(float(self.unary[j, c]) for j, c in enumerate(idx))
        return score + sum(float(self.pairwise[j, idx[j], idx[j + 1]]) for j in range(len(idx) - 1))

    def all_scores(self) -> np.ndarray:
        """Scores of every arch, flat in ``space.enumerate()`` order."""
        d, c = self.unary.shape
        grid = np.indices((c,) * d).reshape(d, -1)  # (D, C**D), C-order = enumerate() order
        total = self.unary[np.arange(d)[:, None], grid].sum(axis=0)
        for j in range(d - 1):
            total = total + self.pairwise[j, grid[j], grid[j + 1]]
        return total

    def ranked(self, top: int) -> list[Arch]:
        """The ``top`` best archs, best first."""
        order = np.argsort(-self.all_scores(), kind="stable")[:top]
        shape = self.unary.shape[1:] * self.unary.shape[0]
        return [self.space.from_index(tuple(int(i) for i in np.unravel_index(r, shape))) for r in order]

    def optimum(self) -> Arch:
        return self.ranked(1)[0]

    def top_set(self, fraction: float = 0.001) -> frozenset[Arch]:
        """The best ``ceil(fraction * size)`` archs (at least one)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        return frozenset(self.ranked(max(1, math.ceil(fraction * self.space.size()))))


def make_synthetic(rng: np.random.Generator, n_decisions: int = 6, n_choices: int = 5,
                   interaction: float = 0.3) -> SyntheticObjective:
    """Random instance with scores of roughly unit spread and a unique optimum."""
    if n_decisions < 2 or n_choices < 2:
        raise ValueError(f"need >= 2 decisions and choices, got {n_decisions}, {n_choices}")
    space = SearchSpace(tuple(Decision(f"d{j}", tuple(f"c{c}" for c in range(n_choices)))
                              for j in range(n_decisions)))
    unary = rng.normal(size=(n_decisions, n_choices)) / math.sqrt(n_decisions)
    pairwise = interaction * rng.normal(size=(n_decisions - 1, n_choices, n_choices)) / math.sqrt(n_decisions)
    unary.setflags(write=False)
    pairwise.setflags(write=False)
    objective = SyntheticObjective(space, unary, pairwise)
    best_two = np.sort(objective.all_scores())[-2:]
    if best_two[1] - best_two[0] < 1e-9:
        raise ValueError("optimum is not unique; draw another instance")
    return objective
