"""The exit rule and the routing rule as small pure functions, so they can be tested without a model.

The engine (``engine.py``), the calibration math (``calibration.py``) and the predictor's training
labels all go through these, so the three can never disagree on what "exit" or "route" means.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def exit_mask(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which rows leave here: ``conf >= threshold`` (B,) -> (B,) bool.

    ``>=`` (not ``>``) so that a threshold of 0 means "everyone leaves" and one above 1 means
    "nobody leaves"; the engine makes the last module answer all rows without asking this rule.
    The comparison runs in ``conf``'s dtype (torch casts the Python float), which is what
    ``calibration.simulate_thresholds`` copies so the two agree to the bit.
    """
    if conf.dim() != 1:
        raise ValueError(f"exit_mask needs conf of shape (B,), got {tuple(conf.shape)}")
    return conf >= threshold  # (B,)


def route_groups(choices: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """Rows grouped by chosen candidate, in increasing candidate order: ``[(r, rows (n_r,)), ...]``.

    Only candidates that some row chose appear; the row index tensors partition ``0..B-1`` and
    are sorted, so each candidate runs once on one contiguous group in a fixed order.
    """
    if choices.dim() != 1:
        raise ValueError(f"route_groups needs choices of shape (B,), got {tuple(choices.shape)}")
    if choices.numel() and int(choices.min()) < 0:
        raise ValueError(f"route_groups: candidate indices must be >= 0, got min {int(choices.min())}")
    groups = []
    for candidate in torch.unique(choices, sorted=True).tolist():
        rows = torch.nonzero(choices == candidate, as_tuple=False).flatten()  # (n_r,)
        groups.append((int(candidate), rows))
    return groups


def predictor_labels(correct: torch.Tensor, p_true: torch.Tensor, costs: Sequence[float]) -> torch.Tensor:
    """Training label per sample: the cheapest candidate whose exit answer is right, else the one
    with the highest p(true class) -> (B,) long.

    Cost ties go to the lower candidate index (deterministic). ``correct`` and ``p_true`` are
    (B, R): candidate r's exit answer on sample b, and its softmax probability of the true class.
    """
    if correct.dim() != 2 or correct.shape != p_true.shape:
        raise ValueError(
            f"predictor_labels needs correct and p_true of one shape (B, R), "
            f"got {tuple(correct.shape)} and {tuple(p_true.shape)}"
        )
    if len(costs) != correct.shape[1]:
        raise ValueError(f"predictor_labels: {correct.shape[1]} candidates but {len(costs)} costs")
    correct = correct.bool()
    cost = torch.as_tensor(list(costs), dtype=torch.float64, device=correct.device)  # (R,)
    masked = torch.where(correct, cost.expand(correct.shape), torch.inf)  # (B, R)
    cheapest_right = torch.argmin(masked, dim=1)  # (B,) first minimum: lower index wins ties
    most_likely = torch.argmax(p_true, dim=1)  # (B,)
    return torch.where(correct.any(dim=1), cheapest_right, most_likely)  # (B,)


def predictor_pays(routed_acc: float, routed_macs: float, static_acc: float, static_macs: float,
                   tolerance: float = 0.0) -> bool:
    """Whether per-image routing is worth deploying over the static choice, on held-out data.

    It pays when it loses at most ``tolerance`` (a fraction) of accuracy and is either no more
    expensive or strictly more accurate. Any larger loss is refused whatever it saves, so a router
    that learned little degrades to the static choice instead of taking the cascade down with it.
    """
    return pays_reason(routed_acc, routed_macs, static_acc, static_macs, tolerance)[0]


def pays_reason(routed_acc: float, routed_macs: float, static_acc: float, static_macs: float,
                tolerance: float = 0.0) -> tuple[bool, str]:
    """:func:`predictor_pays`'s decision and the clause of the rule that made it, in words."""
    if routed_acc < static_acc - tolerance:
        return False, (f"it loses {100 * (static_acc - routed_acc):.2f} points of accuracy against the static "
                       f"choice, more than the {100 * tolerance:.2f} allowed (select.fallback_tolerance)")
    if routed_macs <= static_macs:
        return True, "it is as accurate as the static choice (within select.fallback_tolerance) at no more MACs"
    if routed_acc > static_acc:
        return True, "it is more accurate than the static choice"
    return False, ("it is no more accurate than the static choice and costs more MACs "
                   f"({routed_macs:,.0f} against {static_macs:,.0f}, the predictor included)")


def static_choice(accuracy: Sequence[float], macs: Sequence[float], delta: float) -> int:
    """The one-off test-set choice (docs/BRIEF.md section 2.A) among candidates: the cheapest whose
    accuracy is within ``delta`` (a
    fraction) of the most accurate one, by the same rule that calibrates the thresholds. Ties in
    MACs go to the more accurate, then to the lower index."""
    if len(accuracy) != len(macs) or not accuracy:
        raise ValueError(f"static_choice needs one accuracy per candidate, got {len(accuracy)} and {len(macs)}")
    if not delta >= 0:
        raise ValueError(f"static_choice: delta must be >= 0, got {delta}")
    best = max(accuracy)
    ok = [r for r, a in enumerate(accuracy) if a >= best - delta - 1e-12]
    return min(ok, key=lambda r: (macs[r], -accuracy[r], r))
