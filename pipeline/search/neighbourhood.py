"""Picks of method B drawn from P around the restart's best archs (a probabilistic neighbourhood;
docs/RESULTS.md "Second round: picks drawn from P around the recent best archs").

P stays the product of marginals fitted by weighted MLE (:mod:`pipeline.search.probmodel`); what changes
is where the m points of an iteration come from. A neighbourhood pick takes one of the restart's ``k``
best archs as its centre (drawn by their rank weights) and redraws a random subset of its decisions
from P's marginals (each decision with probability ``rate``, at least one; by default exactly one), the
new choice drawn from P without the centre's own choice. The draw is a mixture over the centres e,
``sum_e w_e K(x | e)`` with K keeping e's choices but the redrawn ones: a probability model over
architectures whose components sit on the elites and hold their interactions (the link shape with its
operations), which the product of marginals cannot.

As in the Latin-hypercube pick (:meth:`ProbModel._stratified_index`), the redrawn choices of one decision
are a systematic sample over the picks (one stratified uniform per pick, shuffled, through each pick's
conditional CDF), so the m points spread over each decision's choices as evenly as P allows.
``rate=None`` redraws exactly one decision (the one-change neighbourhood, its new choice from P);
``rate="entropy"`` anneals the rate with P's relative entropy: every decision while P is uniform (a
plain draw of P), one on average once P has collapsed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipeline.search.picks import max_entropy
from pipeline.search.probmodel import ProbModel, rank_weights
from pipeline.search.space import Arch


def annealed_rate(model: ProbModel) -> float:
    """Per-decision redraw probability from P's relative entropy, between 1 / D and 1."""
    d = len(model.space.decisions)
    if d == 0:
        return 1.0
    h_max = max_entropy(model.space)
    ratio = 1.0 if h_max == 0 else min(max(model.entropy() / h_max, 0.0), 1.0)
    return max(1.0 / d, ratio)


def check_rate(rate: float | str | None) -> None:
    """``rate``: None (exactly one decision redrawn), ``"entropy"`` (annealed) or a float in (0, 1]."""
    if rate is None or rate == "entropy":
        return
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise ValueError(f"rate must be None, 'entropy' or a number in (0, 1], got {rate!r}")


def centre_weights(values: Sequence[float | None]) -> np.ndarray:
    """Rank weights of the centres (given best first); equal weights when every one is invalid."""
    perf = np.array([-math.inf if v is None else v for v in values], dtype=np.float64)
    w = rank_weights(perf)
    if w.sum() <= 0:
        w = np.ones(len(values))
    return w / w.sum()


def neighbourhood_picks(model: ProbModel, centres: Sequence[Arch], weights: np.ndarray, n: int,
                        rng: np.random.Generator, rate: float | str | None = None,
                        avoid: set[Arch] | frozenset[Arch] = frozenset(), tries: int = 4) -> list[Arch]:
    """Up to n distinct archs drawn around ``centres`` (see the module doc), skipping ``avoid``.

    Each round draws the missing picks; picks already in ``avoid`` or drawn twice are redrawn, for at
    most ``tries`` rounds (so fewer than n come back only around a fully explored neighbourhood).
    """
    check_rate(rate)
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    if n == 0 or not centres:
        return []
    space = model.space
    d = len(space.decisions)
    r = 0.0 if rate is None else annealed_rate(model) if rate == "entropy" else float(rate)
    probs = [p.detach().double().numpy().clip(min=0.0) for p in model.table]
    index = [space.index(a) for a in centres]
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    out: dict[Arch, None] = {}
    for _ in range(tries):
        k = n - len(out)
        if k <= 0:
            break
        which = rng.choice(len(centres), size=k, p=w)
        mask = rng.random((k, d)) < r
        none = ~mask.any(axis=1)
        if d:
            mask[np.flatnonzero(none), rng.integers(d, size=int(none.sum()))] = True
        rows = np.array([index[i] for i in which], dtype=np.int64).reshape(k, d)
        for j in range(d):
            u = rng.permutation((rng.random() + np.arange(k)) / k)  # stratified over the picks
            for i in np.flatnonzero(mask[:, j]):
                q = probs[j].copy()
                q[rows[i, j]] = 0.0
                if q.sum() <= 0:
                    q = np.ones_like(q)
                    q[rows[i, j]] = 0.0
                    if q.sum() <= 0:
                        continue
                cdf = np.cumsum(q / q.sum())
                rows[i, j] = min(int(np.searchsorted(cdf, u[i] * cdf[-1], side="right")), len(q) - 1)
        for row in rows.tolist():
            arch = space.from_index(tuple(row))
            if arch not in avoid and arch not in out and len(out) < n:
                out[arch] = None
    return list(out)
