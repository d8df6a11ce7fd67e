"""A tree-structured probability model for method B (Chow-Liu over the decisions), a variant off by
default (docs/RESULTS.md "Method B against the NAS baselines").

Alongside P's marginals (:class:`pipeline.search.probmodel.ProbModel`, updated as before) the model keeps
every pair's joint table ``J[i, j][a, b]``, updated by the same weighted MLE: ``J = step * (weighted pair
frequencies, smoothed) + (1 - step) * J`` with the rank utilities of the iteration's picks. Unrolled, J is
the decayed weighted pair frequencies of everything this restart has scored, the pairwise analogue of
the marginals. Its mutual informations ``I(d_i; d_j)`` pick the structure: the maximum spanning tree
(Chow and Liu, 1968) rooted at decision 0, with ``P(d_j | d_parent)`` read from J. Where the scored archs
hold no interaction the tree's MI is 0 and the model is the product of marginals again.

Sampling is ancestral in the tree's order. The Latin-hypercube idea per decision: the root's m choices
are a systematic sample of its marginal, each child's m choices one stratified uniform per pick (shuffled)
through that pick's conditional CDF, so the m points cover each decision's choices as evenly as P allows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.search.probmodel import ProbModel, index_matrix
from pipeline.search.space import Arch, SearchSpace

Pairs = dict[tuple[int, int], np.ndarray]


def product_joints(model: ProbModel) -> Pairs:
    """Pair tables of the product model (each pair independent)."""
    p = [t.detach().double().numpy() for t in model.table]
    d = len(p)
    return {(i, j): np.outer(p[i], p[j]) for i in range(d) for j in range(i + 1, d)}


def update_joints(joints: Pairs, space: SearchSpace, archs: Sequence[Arch], weights: np.ndarray,
                  smoothing: float, step: float) -> Pairs:
    """``J = step * smoothed weighted pair frequencies + (1 - step) * J``; unchanged when no weight."""
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        return dict(joints)
    w = w / w.sum()
    idx = index_matrix(space, archs)
    out: Pairs = {}
    for (i, j), old in joints.items():
        ci, cj = old.shape
        freq = np.zeros((ci, cj))
        np.add.at(freq, (idx[:, i], idx[:, j]), w)
        cell = smoothing / max(ci, cj)  # the marginals' smoothing mass per row, spread over the row
        smoothed = (freq + cell) / (1.0 + cell * ci * cj)
        out[(i, j)] = step * smoothed + (1.0 - step) * old
    return out


def pair_mi(joint: np.ndarray) -> float:
    """Mutual information (nats) of a joint table."""
    j = joint / joint.sum()
    a = j.sum(axis=1, keepdims=True)
    b = j.sum(axis=0, keepdims=True)
    nz = j > 0
    return float((j[nz] * np.log(j[nz] / (a @ b)[nz])).sum())


def chow_liu(joints: Pairs, n: int) -> list[int]:
    """Parent of each decision (-1 for the root, decision 0): the maximum-MI spanning tree (Prim)."""
    parent = [-1] * n
    if n <= 1:
        return parent
    mi = np.zeros((n, n))
    for (i, j), t in joints.items():
        mi[i, j] = mi[j, i] = pair_mi(t)
    inside = [0]
    best = mi[0].copy()
    link = [0] * n
    out = set(range(1, n))
    while out:
        j = max(sorted(out), key=lambda k: best[k])  # ties: the lowest index
        parent[j] = link[j]
        out.remove(j)
        inside.append(j)
        for k in out:
            if mi[j, k] > best[k]:
                best[k], link[k] = mi[j, k], j
    return parent


def order(parent: Sequence[int]) -> list[int]:
    """Decisions with every parent before its children (breadth-first from the root)."""
    seen, out = set(), []
    frontier = [i for i, p in enumerate(parent) if p < 0]
    while frontier:
        out += frontier
        seen.update(frontier)
        frontier = [i for i, p in enumerate(parent) if p in seen and i not in seen]
    return out


def conditional(joints: Pairs, child: int, parent: int) -> np.ndarray:
    """(C_parent, C_child) table of P(child | parent), rows summing to 1."""
    t = joints[(parent, child)] if parent < child else joints[(child, parent)].T
    rows = t.sum(axis=1, keepdims=True)
    return np.where(rows > 0, t / np.where(rows > 0, rows, 1.0), 1.0 / t.shape[1])


def _invert(p: np.ndarray, u: float) -> int:
    cdf = np.cumsum(p)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(p) - 1)


def tree_index(model: ProbModel, joints: Pairs, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, D) choice indices: ancestral draws of the tree model, stratified per decision."""
    d = len(model.space.decisions)
    parent = chow_liu(joints, d)
    rows = np.zeros((n, d), dtype=np.int64)
    for j in order(parent):
        u = rng.permutation((rng.random() + np.arange(n)) / max(n, 1))
        if parent[j] < 0:
            p = model.table[j].detach().double().numpy().clip(min=0.0)
            rows[:, j] = [_invert(p, x) for x in u]
        else:
            cond = conditional(joints, j, parent[j])
            rows[:, j] = [_invert(cond[rows[i, parent[j]]], u[i]) for i in range(n)]
    return rows


def tree_pick(model: ProbModel, joints: Pairs, m: int, rng: np.random.Generator, tries: int = 20) -> list[Arch]:
    """Up to m distinct archs of the tree model: one stratified draw, topped up with further draws."""
    space = model.space
    limit = min(m, space.size())
    kept: dict[tuple[int, ...], None] = {}
    for _ in range(tries):
        for row in tree_index(model, joints, m, rng).tolist():
            if len(kept) < limit:
                kept.setdefault(tuple(row), None)
        if len(kept) >= limit:
            break
    return [space.from_index(r) for r in kept]


def joints_state(joints: Pairs) -> list[list]:
    return [[i, j, t.tolist()] for (i, j), t in sorted(joints.items())]


def joints_from_state(state: Sequence[Sequence]) -> Pairs:
    return {(int(i), int(j)): np.asarray(t, dtype=np.float64) for i, j, t in state}


def tree_mi(joints: Pairs, n: int) -> float:
    """Summed MI along the tree's edges (nats): what the tree holds beyond the product of marginals."""
    parent = chow_liu(joints, n)
    return float(sum(pair_mi(joints[(min(j, p), max(j, p))]) for j, p in enumerate(parent) if p >= 0))
