"""Rank agreement between a supernet's inherited accuracies and stand-alone accuracies.

Pure functions (numpy only) used by the ranking benchmark (``bench/ranking.py``): Kendall's tau-b and
Spearman's rho (both tie-aware, as ``scipy.stats.kendalltau`` / ``spearmanr`` compute them), and a
seeded choice of R distinct subnets spread over a search space's cost range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.search.space import Arch, SearchSpace


def _pair(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"need two 1-d sequences of equal length, got shapes {a.shape} and {b.shape}")
    if len(a) < 2:
        raise ValueError(f"need at least 2 pairs to compare rankings, got {len(a)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("values must be finite")
    return a, b


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b: (C - D) / sqrt((n0 - n1) (n0 - n2)); NaN when either side is constant.

    C and D count concordant and discordant pairs; n1 and n2 the pairs tied in x and in y. Without
    ties this is plain (C - D) / (n (n - 1) / 2). O(n^2), fine for the handful of subnets compared.
    """
    a, b = _pair(x, y)
    i, j = np.triu_indices(len(a), k=1)
    sa, sb = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    s = float(np.sum(sa * sb))  # C - D (pairs tied on either side add 0)
    untied_a, untied_b = float(np.count_nonzero(sa)), float(np.count_nonzero(sb))
    if untied_a == 0 or untied_b == 0:
        return math.nan
    return s / math.sqrt(untied_a * untied_b)


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span (``scipy.stats.rankdata``)."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=np.float64)
    sorted_a = a[order]
    start = 0
    for end in range(1, len(a) + 1):
        if end == len(a) or sorted_a[end] != sorted_a[start]:
            ranks[order[start:end]] = (start + 1 + end) / 2.0  # mean of ranks start+1 .. end
            start = end
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of the average ranks; NaN when either side is constant."""
    a, b = _pair(x, y)
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float(np.sum(ra * ra)) * float(np.sum(rb * rb)))
    return math.nan if denom == 0 else float(np.sum(ra * rb)) / denom


def choose_subnets(space: SearchSpace, r: int, rng: np.random.Generator, cost_of: Callable[[Arch], float],
                   pool_factor: int = 8) -> list[Arch]:
    """R distinct architectures spread over the cost range, cheapest first.

    Draws a pool of ``pool_factor * r`` distinct uniform-random architectures (the whole space if it
    is smaller), sorts it by cost and keeps R at evenly spaced ranks, the pool's cheapest and most
    expensive included. Same rng state, same choice.
    """
    size = space.size()
    if r < 2:
        raise ValueError(f"need r >= 2 subnets to rank, got {r}")
    if r > size:
        raise ValueError(f"the space has only {size} architectures, cannot choose {r} distinct ones")
    if pool_factor < 1:
        raise ValueError(f"pool_factor must be >= 1, got {pool_factor}")
    pool_size = min(size, pool_factor * r)
    if pool_size == size:
        pool = list(space.enumerate())
    else:
        seen: dict[tuple[int, ...], None] = {}
        while len(seen) < pool_size:
            index = tuple(int(rng.integers(len(d.choices))) for d in space.decisions)
            seen.setdefault(index, None)
        pool = [space.from_index(index) for index in seen]
    pool.sort(key=lambda a: (cost_of(a), a.key()))
    picks = np.round(np.linspace(0, len(pool) - 1, r)).astype(int)  # distinct since len(pool) >= r
    return [pool[i] for i in picks]
