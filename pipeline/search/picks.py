"""Method B's picks: which m subnets of P(i-1) an iteration evaluates (``entropy``: a Latin-hypercube
draw, the default; ``greedy``: a pool of draws kept greedily for their summed choice entropy;
``plain``: draws of P), the final k candidates drawn from P(N), and the choice entropy they are
judged by. The probability model itself and its update are :mod:`pipeline.search.probmodel`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipeline.params.choices import PICKS  # noqa: F401 (re-exported)
from pipeline.search.probmodel import ProbModel, index_matrix
from pipeline.search.space import Arch, SearchSpace


def choice_entropy(space: SearchSpace, archs: Sequence[Arch]) -> float:
    """Sum over decisions of the entropy (nats) of the choice histogram over ``archs``."""
    if not archs:
        return 0.0
    idx = index_matrix(space, archs)
    total = 0.0
    for j, d in enumerate(space.decisions):
        freq = np.bincount(idx[:, j], minlength=len(d.choices)) / len(archs)
        freq = freq[freq > 0]
        total += float(-(freq * np.log(freq)).sum())
    return total


def _greedy_max_entropy(space: SearchSpace, idx: np.ndarray, m: int) -> list[int]:
    """Rows of ``idx`` (P, D) kept greedily, each maximising the kept set's choice entropy."""
    n_dec = len(space.decisions)
    width = max((len(d.choices) for d in space.decisions), default=1)
    counts = np.zeros((n_dec, width))  # padded choice histograms of the kept set
    rows = np.arange(n_dec)
    free = np.ones(idx.shape[0], dtype=bool)
    kept: list[int] = []
    for t in range(m):
        n = t + 1
        # entropy of each histogram after adding choice x: log n - (sum f(c) - f(c_x) + f(c_x + 1)) / n
        f = counts * np.log(np.maximum(counts, 1.0))
        after = (counts + 1) * np.log(counts + 1)
        h = math.log(n) - (f.sum(axis=1, keepdims=True) - f + after) / n  # (D, width)
        score = h[rows, idx].sum(axis=1)  # (P,)
        score[~free] = -np.inf
        best = int(np.flatnonzero(score >= score.max() - 1e-9)[0])  # ties: first in pool order
        kept.append(best)
        free[best] = False
        counts[rows, idx[best]] += 1
    return kept


def max_entropy(space: SearchSpace) -> float:
    """Entropy (nats) of the uniform model: sum over decisions of log(choices)."""
    return float(sum(math.log(len(d.choices)) for d in space.decisions))


def pool_size(model: ProbModel, m: int, pool_factor: int, shrink: bool = True) -> int:
    """Draws the entropy pick chooses m from: ``pool_factor * m`` while P is uniform, shrinking
    linearly with P's relative entropy to m (a plain draw) as P concentrates (``shrink``)."""
    if not shrink:
        return pool_factor * m
    h_max = max_entropy(model.space)
    ratio = 1.0 if h_max == 0 else min(max(model.entropy() / h_max, 0.0), 1.0)
    return m + int(round((pool_factor - 1) * m * ratio))




def entropy_pick(model: ProbModel, m: int, rng: np.random.Generator, max_tries: int | None = None) -> list[Arch]:
    """The entropy-maximising pick: m distinct subnets from a Latin-hypercube draw of P.

    Per decision the m choices are a systematic sample of P's marginal, so each choice appears
    floor(m P(c)) or ceil(m P(c)) times: the kept set's choice histograms are as even as P allows
    (at a uniform P every histogram is as flat as m allows, the maximum of the summed choice
    entropy), while every pick is still marginally a draw of P, so the MLE that follows is not
    pulled back towards uniform (the greedy pool rule, :func:`greedy_pick`, is; README "Method B on
    its own"). Returns fewer than m only where P's support has fewer distinct subnets.
    """
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    return model.sample_hypercube(m, rng, max_tries)


def greedy_pick(model: ProbModel, m: int, rng: np.random.Generator, pool_factor: int = 8,
                max_tries: int | None = None, shrink: bool = True) -> list[Arch]:
    """The first entropy pick (DESIGN.md's rule), kept as an ablation: m distinct subnets from a pool
    of :func:`pool_size` draws of P, kept greedily for the summed choice entropy of the kept set.

    Spreads the evaluations over the choices, but the kept set over-represents P's rare choices, so
    the MLE is biased towards uniform; the pool shrinks with P's entropy to limit that (a fixed
    pool, ``shrink=False``, is the original rule: about 5x the evaluations of a plain draw on the
    synthetic benchmark). Returns fewer than m only when the pool itself is smaller (small space or
    concentrated P).
    """
    if m < 0 or pool_factor < 1:
        raise ValueError(f"need m >= 0 and pool_factor >= 1, got m={m}, pool_factor={pool_factor}")
    pool = model._distinct_index(pool_size(model, m, pool_factor, shrink), rng, max_tries)
    if len(pool) > m:
        idx = np.array(pool, dtype=np.int64).reshape(len(pool), len(model.space.decisions))
        pool = [pool[i] for i in _greedy_max_entropy(model.space, idx, m)]
    return [model.space.from_index(row) for row in pool]


def plain_pick(model: ProbModel, m: int, rng: np.random.Generator,
               max_tries: int | None = None) -> list[Arch]:
    """Ablation of :func:`entropy_pick`: m distinct draws of P (fewer only where not possible)."""
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    return model.sample_distinct(m, rng, max_tries)


def pick_archs(model: ProbModel, m: int, rng: np.random.Generator, pick: str = "entropy",
               pool_factor: int = 8, shrink: bool = True) -> list[Arch]:
    """One iteration's m subnets by rule ``pick`` (one of :data:`PICKS`); ``pool_factor`` and
    ``shrink`` only matter to ``greedy``."""
    if pick == "entropy":
        return entropy_pick(model, m, rng)
    if pick == "greedy":
        return greedy_pick(model, m, rng, pool_factor, shrink=shrink)
    if pick == "plain":
        return plain_pick(model, m, rng)
    raise ValueError(f"pick must be one of {PICKS}, got {pick!r}")


def final_pick(model: ProbModel, k: int, rng: np.random.Generator,
               max_tries: int | None = None) -> list[Arch]:
    """k distinct candidates from P(N), to be evaluated on held-out data."""
    return model.sample_distinct(k, rng, max_tries)
