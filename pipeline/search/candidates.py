"""Method B's final step on a trained supernet module: evaluate k subnets drawn from P(N) on held-out
data, keep the best by perf as the target, and the accuracy-cost Pareto set as routing candidates
(optionally over extra subnets spread across the whole space's cost range, ``spread_archs``: P(N)'s
own draws cluster where its cost term pulls them, which leaves routing little to choose between)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.search.probmodel import ProbModel
from pipeline.search.space import Arch, SearchSpace


@torch.inference_mode()
def evaluate_candidates(module: nn.Module, features: torch.Tensor, labels: torch.Tensor, archs: Sequence[Arch], *,
                        macs_of: Callable[[Arch], float], latency_of: Callable[[Arch, int], float], cost_max: float,
                        lambda_c: float, batch_size: int = 512) -> list[dict[str, Any]]:
    """One row per arch: accuracy, CE, perf = -CE - lambda_c * c / c_max, MACs and latency (b1, b64)."""
    module.eval()
    rows = []
    for arch in archs:
        correct, ce = 0, 0.0
        for start in range(0, len(labels), batch_size):
            _, logits = module(features[start:start + batch_size], arch)  # (B, classes)
            y = labels[start:start + batch_size]
            ce += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
        macs = macs_of(arch)
        mean_ce = ce / len(labels)
        rows.append({"arch": arch.key(), "acc": correct / len(labels), "ce": mean_ce,
                     "perf": -mean_ce - lambda_c * macs / cost_max, "macs": int(macs),
                     "latency_ms_b1": latency_of(arch, 1), "latency_ms_b64": latency_of(arch, 64)})
    return rows


def pareto_front(rows: Sequence[dict[str, Any]], max_size: int) -> list[dict[str, Any]]:
    """Rows not dominated in (higher acc, lower MACs), cheapest first, thinned to ``max_size`` evenly
    along the front (the cheapest and the most accurate are always kept)."""
    ordered = sorted(rows, key=lambda r: (r["macs"], -r["acc"]))
    front: list[dict[str, Any]] = []
    for row in ordered:
        if not front or row["acc"] > front[-1]["acc"]:
            front.append(row)
    if len(front) <= max_size:
        return front
    keep = np.unique(np.round(np.linspace(0, len(front) - 1, max_size)).astype(int))
    return [front[i] for i in keep]


def spread_archs(space: SearchSpace, op_macs: dict[str, dict[str, float]], macs_of: Callable[[Arch], float],
                 n: int, rng: np.random.Generator, pool_per_pick: int = 40) -> list[Arch]:
    """``n`` distinct subnets spanning the space's cost range: its cheapest and its most expensive path
    (per decision the op of least / most MACs in ``op_macs``) and, between them, the subnet of a uniform
    pool (``pool_per_pick`` draws per pick) nearest each of ``n`` evenly spaced costs."""
    if n < 2:
        raise ValueError(f"a spread needs at least 2 subnets (the cheapest and the largest), got {n}")
    ends = [space.make({label: pick(ops, key=ops.get) for label, ops in op_macs.items()}) for pick in (min, max)]
    pool = list(dict.fromkeys([*ends, *ProbModel.uniform(space).sample_distinct(pool_per_pick * n, rng)]))
    costs = np.array([macs_of(a) for a in pool], dtype=np.float64)
    chosen: list[Arch] = []
    for target in np.linspace(costs[0], costs[1], n):
        order = np.argsort(np.abs(costs - target), kind="stable")
        pick = next((pool[i] for i in order if pool[i] not in chosen), None)
        if pick is not None:
            chosen.append(pick)
    return chosen
