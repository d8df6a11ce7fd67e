"""Method B's probability model over a search space and its update (the picks are pipeline.search.picks).

One categorical per decision. Each iteration picks m subnets from P(i-1) (entropy-maximising pick:
a Latin-hypercube draw),
scores them, and fits P(i) by maximum likelihood as performance-weighted choice frequencies. For a
supernet, the weights get an extra loss ``beta / (MI(P(i-1), P(i)) + eps)`` whose gradient reaches
the weights through perf -> MLE weights -> P(i); so probabilities stay torch tensors throughout.

The MI term is skipped (``None``) while P(i-1) is uniform: its log-probability vector carries no
information to correlate with (constant when every decision has the same number of choices), so
with the default uniform P(0) the first iteration trains on the task loss alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.params.choices import UTILITIES
from pipeline.search.space import Arch, SearchSpace

# Floor inside the log so that a choice with probability 0 gives a finite hyperparameter.
LOG_FLOOR = 1e-12


@dataclass(frozen=True, eq=False)
class ProbModel:
    """P over a search space: ``table[j]`` holds decision j's choice probabilities, shape (n_j,)."""

    space: SearchSpace
    table: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if len(self.table) != len(self.space.decisions):
            raise ValueError(f"{len(self.table)} probability vectors, {len(self.space.decisions)} decisions")
        for d, p in zip(self.space.decisions, self.table, strict=True):
            if not isinstance(p, torch.Tensor) or p.dim() != 1 or p.shape[0] != len(d.choices):
                raise ValueError(f"{d.label}: expected a 1-d tensor of {len(d.choices)} probabilities")
            q = p.detach()
            if not torch.isfinite(q).all() or bool((q < 0).any()) or abs(float(q.sum()) - 1.0) > 1e-4:
                raise ValueError(f"{d.label}: not a probability vector: {q.tolist()}")

    @classmethod
    def uniform(cls, space: SearchSpace, dtype: torch.dtype = torch.float64) -> ProbModel:
        """P(0) of single-path one-shot training: every choice equally likely."""
        return cls(space, tuple(torch.full((len(d.choices),), 1.0 / len(d.choices), dtype=dtype)
                                for d in space.decisions))

    @classmethod
    def from_probs(cls, space: SearchSpace, probs: Sequence[torch.Tensor | Sequence[float]]) -> ProbModel:
        return cls(space, tuple(torch.as_tensor(p, dtype=torch.float64) if not isinstance(p, torch.Tensor)
                                else p for p in probs))

    @classmethod
    def from_logits(cls, space: SearchSpace, logits: Sequence[torch.Tensor | Sequence[float]]) -> ProbModel:
        """Softmax per decision; differentiable when the logits are."""
        return cls(space, tuple(torch.softmax(torch.as_tensor(z, dtype=torch.float64)
                                              if not isinstance(z, torch.Tensor) else z, dim=0)
                                for z in logits))

    @classmethod
    def from_dict(cls, space: SearchSpace, probs: Mapping[str, Mapping[str, float]]) -> ProbModel:
        """Inverse of :meth:`as_dict` (for reading a saved model back)."""
        return cls.from_probs(space, [[float(probs[d.label][c]) for c in d.choices] for d in space.decisions])

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Plain JSON-able form: label -> choice -> probability."""
        return {d.label: dict(zip(d.choices, p.detach().double().tolist(), strict=True))
                for d, p in zip(self.space.decisions, self.table, strict=True)}

    def probs(self, label: str) -> torch.Tensor:
        return self.table[self.space.labels.index(label)]

    def detach(self) -> ProbModel:
        return ProbModel(self.space, tuple(p.detach() for p in self.table))

    def log_prob_vector(self) -> torch.Tensor:
        """The "hyperparameters": log P over every (decision, choice), decisions in order."""
        if not self.table:
            return torch.zeros(0, dtype=torch.float64)
        return torch.cat([torch.log(p.clamp_min(LOG_FLOOR)) for p in self.table])

    def entropy(self) -> float:
        """Summed over decisions (nats); log(size) when uniform, 0 once collapsed."""
        return float(sum(float(torch.special.entr(p.detach()).sum()) for p in self.table))

    def is_uniform(self, tol: float = 1e-9) -> bool:
        return all(float((p.detach() - 1.0 / p.shape[0]).abs().max()) <= tol for p in self.table)

    def most_likely(self) -> Arch:
        """Argmax per decision; ties go to the first choice."""
        return self.space.from_index(tuple(int(torch.argmax(p.detach())) for p in self.table))

    def sample(self, n: int, rng: np.random.Generator) -> list[Arch]:
        """n independent draws (repeats allowed)."""
        return [self.space.from_index(tuple(int(c) for c in row)) for row in self._sample_index(n, rng)]

    def sample_distinct(self, k: int, rng: np.random.Generator, max_tries: int | None = None) -> list[Arch]:
        """Up to k distinct draws in first-drawn order, from at most ``max_tries`` draws.

        Fewer than k come back when the space (or the model's support) is smaller, or when the model
        is so concentrated that ``max_tries`` (default ``20 k + 100``) draws do not find k.
        """
        return [self.space.from_index(row) for row in self._distinct_index(k, rng, max_tries)]

    def _sample_index(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, n_decisions) choice indices of n independent draws."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        columns = [rng.choice(p.shape[0], size=n, p=_numpy_probs(p)) for p in self.table]
        return np.stack(columns, axis=1) if columns else np.zeros((n, 0), dtype=np.int64)

    def sample_hypercube(self, k: int, rng: np.random.Generator,
                            max_tries: int | None = None) -> list[Arch]:
        """Up to k distinct archs from a Latin-hypercube draw of P (:meth:`_stratified_index`),
        topped up with plain distinct draws where the hypercube repeats an arch (a concentrated P)."""
        return [self.space.from_index(row) for row in self._stratified_distinct_index(k, rng, max_tries)]

    def _stratified_index(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, n_decisions) choice indices of a Latin-hypercube draw: per decision, a systematic sample
        of n points of its marginal (choice c appears floor(n P(c)) or ceil(n P(c)) times), each
        column shuffled on its own. Every row is still marginally a draw of P (no bias for the MLE);
        the n rows together cover each decision's choices as evenly as P allows."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        columns = []
        for p in self.table:
            cdf = np.cumsum(_numpy_probs(p))
            points = (rng.random() + np.arange(n)) / max(n, 1)
            picks = np.minimum(np.searchsorted(cdf, points * cdf[-1], side="right"), p.shape[0] - 1)
            columns.append(rng.permutation(picks))
        return np.stack(columns, axis=1) if columns else np.zeros((n, 0), dtype=np.int64)

    def _stratified_distinct_index(self, k: int, rng: np.random.Generator,
                                   max_tries: int | None) -> list[tuple[int, ...]]:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        kept: dict[tuple[int, ...], None] = dict.fromkeys(tuple(r) for r in self._stratified_index(k, rng).tolist())
        if len(kept) < min(k, self.space.size()):
            for row in self._distinct_index(k, rng, max_tries):
                if len(kept) >= k:
                    break
                kept.setdefault(row, None)
        return list(kept)[:k]

    def _distinct_index(self, k: int, rng: np.random.Generator,
                        max_tries: int | None) -> list[tuple[int, ...]]:
        """Choice indices behind :meth:`sample_distinct` (entropy_pick works on these directly)."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        limit = min(k, self.space.size())
        budget = 20 * k + 100 if max_tries is None else max_tries
        kept: dict[tuple[int, ...], None] = {}
        drawn = 0
        while len(kept) < limit and drawn < budget:
            batch = min(budget - drawn, max(2 * (limit - len(kept)), 16))
            for row in self._sample_index(batch, rng).tolist():
                if len(kept) < limit:
                    kept.setdefault(tuple(row), None)
            drawn += batch
        return list(kept)


def _numpy_probs(p: torch.Tensor) -> np.ndarray:
    q = p.detach().cpu().double().numpy().clip(min=0.0)
    return q / q.sum()


def index_matrix(space: SearchSpace, archs: Sequence[Arch]) -> np.ndarray:
    """(len(archs), n_decisions) choice indices."""
    return np.array([space.index(a) for a in archs], dtype=np.int64).reshape(len(archs), len(space.decisions))




def _tie_average(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``weights`` (given per position of ``values`` sorted best first) averaged within tied values."""
    out = weights.copy()
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or values[end] != values[start]:
            out[start:end] = weights[start:end].mean()
            start = end
    return out


def rank_weights(perf: np.ndarray | Sequence[float]) -> np.ndarray:
    """Utilities from ranks alone (invariant to any strictly increasing transform of ``perf``).

    Positions 1..n, best first, get CMA-ES's log weights ``max(0, log((n + 1) / 2) - log(i))``, so the
    better half carries all the weight, the best the most; tied values share their positions' mean;
    NaN and -inf (failed or invalid evaluations) get 0. The weights sum to 1, or are all 0 when no
    value is usable (then the caller must not update). With one usable value it gets weight 1.
    """
    perf = np.asarray(perf, dtype=np.float64)
    if perf.ndim != 1:
        raise ValueError(f"perf must be 1-d, got shape {perf.shape}")
    n = perf.shape[0]
    usable = np.isfinite(perf) | (perf == np.inf)
    weights = np.zeros(n)
    if not usable.any():
        return weights
    key = np.where(usable, perf, -np.inf)
    order = np.argsort(-key, kind="stable")
    pos = np.arange(1, n + 1, dtype=np.float64)
    base = np.maximum(0.0, math.log((n + 1) / 2) - np.log(pos)) if n > 1 else np.ones(1)
    weights[order] = _tie_average(key[order], base)
    weights[~usable] = 0.0
    total = weights.sum()
    if total <= 0:  # the usable values all tie in the lower half: share equally among them
        weights = usable.astype(np.float64)
        total = weights.sum()
    return weights / total


def elite_weights(perf: np.ndarray | Sequence[float], fraction: float = 0.25) -> np.ndarray:
    """The cross-entropy method's utilities: equal weights on the best ``ceil(fraction * n)`` values
    (ties share), 0 elsewhere and for NaN / -inf; rank-based like :func:`rank_weights`."""
    perf = np.asarray(perf, dtype=np.float64)
    n = perf.shape[0]
    usable = np.isfinite(perf) | (perf == np.inf)
    if not usable.any():
        return np.zeros(n)
    key = np.where(usable, perf, -np.inf)
    order = np.argsort(-key, kind="stable")
    base = (np.arange(n) < max(1, math.ceil(fraction * n))).astype(np.float64)
    weights = np.zeros(n)
    weights[order] = _tie_average(key[order], base)
    weights[~usable] = 0.0
    return weights / weights.sum()


def utility_weights(perf: torch.Tensor, utility: str = "rank", temperature: float = 1.0) -> torch.Tensor:
    """MLE weights (m,) summing to 1 (or all 0 when nothing is usable), in perf's dtype and device.

    ``rank``: :func:`rank_weights` as the values, scale- and offset-free; the gradient (for the MI
    term) flows through a straight-through surrogate ``softmax(z / T)`` of the standardised perf z,
    which is scale-free too. ``elite``: :func:`elite_weights` (the cross-entropy method's rule; the
    estimation-of-distribution baseline), same surrogate. ``softmax``: ``softmax(perf / T)`` on raw
    perf (the original rule, kept as the ablation; its effective greediness depends on the objective's scale).
    """
    if utility not in UTILITIES:
        raise ValueError(f"utility must be one of {UTILITIES}, got {utility!r}")
    if utility == "softmax":
        if torch.isnan(perf.detach()).any():
            raise ValueError("perf contains NaN")
        return torch.softmax(perf / temperature, dim=0)
    ranker = rank_weights if utility == "rank" else elite_weights
    hard = torch.as_tensor(ranker(perf.detach().cpu().double().numpy()), dtype=perf.dtype, device=perf.device)
    if not perf.requires_grad:
        return hard
    usable = torch.isfinite(perf.detach())
    if int(usable.sum()) < 2:
        return hard
    z = torch.where(usable, perf, torch.zeros_like(perf))
    mean = z[usable].mean()
    std = z[usable].std().clamp_min(1e-12)
    soft = torch.softmax(torch.where(usable, (z - mean) / std / temperature, torch.full_like(z, -math.inf)), dim=0)
    return hard + soft - soft.detach()


def mle_update(prev: ProbModel, archs: Sequence[Arch], perf: torch.Tensor, temperature: float,
               smoothing: float, step: float, utility: str = "rank") -> ProbModel:
    """P(i): utility-weighted choice frequencies, Laplace-smoothed, mixed with P(i-1).

    ``new[c] = step * (freq[c] + s) / (1 + s * n) + (1 - step) * prev[c]`` where ``freq`` sums the
    weights of :func:`utility_weights`; differentiable in perf, with prev held constant. The result
    takes perf's dtype and device. When no evaluation is usable (all NaN / -inf under ``rank``),
    P(i) = P(i-1).
    """
    if temperature <= 0 or smoothing < 0 or not 0 < step <= 1:
        raise ValueError(f"need temperature > 0, smoothing >= 0, 0 < step <= 1; got "
                         f"{temperature}, {smoothing}, {step}")
    if perf.dim() != 1 or perf.shape[0] != len(archs) or not archs:
        raise ValueError(f"perf must have shape ({len(archs)},) for {len(archs)} archs (>= 1), "
                         f"got {tuple(perf.shape)}")
    if not perf.is_floating_point():
        perf = perf.double()
    w = utility_weights(perf, utility, temperature)  # (m,)
    if float(w.detach().sum()) == 0.0:
        return ProbModel(prev.space, tuple(p.detach().to(perf) for p in prev.table))
    idx = torch.as_tensor(index_matrix(prev.space, archs), device=perf.device)  # (m, D)
    table = []
    for j, (d, old) in enumerate(zip(prev.space.decisions, prev.table, strict=True)):
        freq = torch.zeros(len(d.choices), dtype=w.dtype, device=w.device).index_add(0, idx[:, j], w)
        smoothed = (freq + smoothing) / (1.0 + smoothing * len(d.choices))
        table.append(step * smoothed + (1.0 - step) * old.detach().to(w))
    return ProbModel(prev.space, tuple(table))


def _is_constant(x: torch.Tensor) -> bool:
    x = x.detach()
    tol = 64 * torch.finfo(x.dtype).eps * (1.0 + float(x.abs().max()))
    return float((x - x.mean()).abs().max()) <= tol


def gaussian_mi(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-6) -> torch.Tensor | None:
    """MI of paired entries taken as bivariate-Gaussian samples: ``-0.5 log(1 - rho^2)``, 0-dim.

    rho^2 is clamped to ``1 - eps`` (so identical vectors give a finite MI, with zero gradient).
    Returns None, not an error, when either vector is constant: Pearson correlation is undefined,
    and callers skip the term.
    """
    if a.dim() != 1 or a.shape != b.shape or a.shape[0] < 2:
        raise ValueError(f"need two 1-d vectors of equal length >= 2, got {tuple(a.shape)}, {tuple(b.shape)}")
    if _is_constant(a) or _is_constant(b):
        return None
    dtype = torch.promote_types(a.dtype, b.dtype)
    ac = (a - a.mean()).to(dtype)
    bc = (b - b.mean()).to(dtype)
    rho = (ac * bc).sum() / torch.sqrt((ac * ac).sum() * (bc * bc).sum())
    return -0.5 * torch.log1p(-(rho * rho).clamp(max=1.0 - eps))


def model_mi(prev: ProbModel, new: ProbModel, eps: float = 1e-6) -> torch.Tensor | None:
    """MI between the hyperparameters of P(i-1) (constant) and P(i); None while P(i-1) is uniform."""
    if prev.space != new.space:
        raise ValueError("the two models are over different search spaces")
    if prev.is_uniform():
        return None
    return gaussian_mi(prev.log_prob_vector().detach(), new.log_prob_vector(), eps)


def mi_loss(prev_model: ProbModel, new_model: ProbModel, beta: float, eps: float = 1e-3,
            rho_eps: float = 1e-6) -> torch.Tensor | None:
    """``beta / (MI + eps)``, or None when skipped (beta == 0, P(i-1) uniform, or MI undefined)."""
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta == 0:
        return None
    mi = model_mi(prev_model, new_model, rho_eps)
    return None if mi is None else beta / (mi + eps)


def supernet_step_loss(task_losses: torch.Tensor, perf: torch.Tensor, prev_model: ProbModel,
                       archs: Sequence[Arch], *, temperature: float, smoothing: float, step: float,
                       beta: float, eps: float = 1e-3, utility: str = "rank",
                       ) -> tuple[torch.Tensor, ProbModel, dict[str, Any]]:
    """One method-B weight step, minus the model: loss, P(i) (detached, for the next step), info.

    ``task_losses`` (m,) and ``perf`` (m,) come from the m picked subnets run on the shared weights,
    with perf kept differentiable so the MI term reaches them.
    """
    if task_losses.dim() != 1 or task_losses.shape[0] != len(archs) or not archs:
        raise ValueError(f"task_losses must have shape ({len(archs)},), got {tuple(task_losses.shape)}")
    new = mle_update(prev_model, archs, perf, temperature, smoothing, step, utility)
    task = task_losses.mean()
    mi = model_mi(prev_model, new) if beta > 0 else None
    term = None if mi is None else beta / (mi + eps)
    loss = task if term is None else task + term
    info: dict[str, Any] = {
        "task_loss": float(task.detach()),
        "mi": None if mi is None else float(mi.detach()),
        "mi_loss": None if term is None else float(term.detach()),
        "entropy": new.entropy(),
    }
    return loss, new.detach(), info
