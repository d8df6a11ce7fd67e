"""Fitting a supernet module's per-image predictor on the `route` split (docs/BRIEF.md section 2.A), in one of two ways
(``select.scoring``), and judging it on the fifth of `route` it never saw:

- ``label``: one label per image, the cheapest candidate whose exit is right (cross-entropy);
- ``p_right``: each candidate's chance of being right (binary cross-entropy on every candidate),
  chosen by ``sigmoid + cost price``; the price is the cheapest of ``PRICES`` whose held-out accuracy
  is the static choice's (less ``select.fallback_tolerance``) at no more MACs (``choose_price``).

Either way the result says what routing gives on the held-out images against the static choice;
``rules.predictor_pays`` decides whether it serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.params.choices import ConfigError
from pipeline.routing.predictor import (
    Predictor,
    predictor_macs,
    priced_offsets,
    train_p_right,
    train_predictor,
)
from pipeline.routing.rules import pays_reason, predictor_labels, static_choice
from pipeline.search.space import Arch

PRICES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # p_right: candidate cost prices tried on held-out route


@dataclass(frozen=True)
class PredictorConfig:
    scoring: str = "label"
    hidden: int = 16
    pool: int = 1
    epochs: int = 30
    balanced: bool = False
    seed: int = 0
    tolerance: float = 0.0  # p_right: the price may lose this much held-out accuracy against the static choice


@dataclass
class FittedPredictor:
    predictor: Predictor
    held_choice: torch.Tensor  # (n_held,) long, on the CPU
    n_fit: int
    history: dict[str, list[float]]
    metrics: dict[str, Any] = field(default_factory=dict)


def choose_price(correct: torch.Tensor, choices: dict[float, torch.Tensor], macs: Sequence[float],
                 budget: float, floor: float) -> tuple[float, float, float]:
    """(price, accuracy, mean candidate MACs) for routing with these choices (N,) per price, judged on
    ``correct`` (N, R): the cheapest price at least ``floor`` accurate within ``budget`` MACs (routing's
    aim: the static choice's accuracy for less), ties to the more accurate; if no price reaches the
    floor, the most accurate within the budget; if none fits the budget, the cheapest."""
    if not choices:
        raise ValueError("choose_price needs at least one price")
    table = torch.as_tensor(list(macs), dtype=torch.float64)  # (R,)
    rows = torch.arange(correct.shape[0])
    scored = [(price, float(correct[rows, c].double().mean()), float(table[c].mean()))
              for price, c in sorted(choices.items())]
    fits = [t for t in scored if t[2] <= budget * (1 + 1e-12)]
    if not fits:
        return min(scored, key=lambda t: (t[2], -t[1]))
    good = [t for t in fits if t[1] >= floor - 1e-12]
    if good:
        return min(good, key=lambda t: (t[2], -t[1], t[0]))
    return max(fits, key=lambda t: (t[1], -t[2], t[0]))


def fit_predictor(features: torch.Tensor, correct: torch.Tensor, p_true: torch.Tensor, macs: Sequence[int],
                  static: int, cfg: PredictorConfig) -> FittedPredictor:
    """Train a predictor on the first 80% of ``features`` (N, C, H, W) (route images, on their device)
    with each candidate's exit answers ``correct`` / ``p_true`` (N, R); choose for the held-out rest."""
    r = correct.shape[1]
    n_fit = int(0.8 * correct.shape[0])  # hold out a fifth of route to report the predictor honestly
    held = features[n_fit:]
    predictor = Predictor(features.shape[1], r, hidden=cfg.hidden, pool=cfg.pool, seed=cfg.seed,
                          scoring=cfg.scoring).to(features.device)  # initialised on the CPU, then moved
    if cfg.scoring == "label":
        labels = predictor_labels(correct, p_true, macs)
        history = train_predictor(predictor, features[:n_fit], labels[:n_fit], epochs=cfg.epochs, lr=0.01,
                                  batch_size=128, seed=cfg.seed, balanced=cfg.balanced)
        with torch.inference_mode():
            choice = predictor.choose(held).cpu()
        label_acc = float((choice == labels[n_fit:]).float().mean())
        share = (torch.bincount(labels, minlength=r).double() / len(labels)).numpy()
        return FittedPredictor(predictor, choice, n_fit, history, {
            "predictor_label_acc_heldout": label_acc, "label_share": share.round(4).tolist()})
    history = train_p_right(predictor, features[:n_fit], correct[:n_fit], epochs=cfg.epochs, lr=0.01,
                            batch_size=128, seed=cfg.seed)
    choices = {}
    for price in PRICES:
        predictor.with_offsets(priced_offsets(price, macs))
        with torch.inference_mode():
            choices[price] = predictor.choose(held).cpu()
    static_acc = float(correct[n_fit:, static].double().mean())
    price, _, _ = choose_price(correct[n_fit:], choices, macs, float(macs[static]), static_acc - cfg.tolerance)
    predictor.with_offsets(priced_offsets(price, macs))
    return FittedPredictor(predictor, choices[price], n_fit, history, {
        "predictor_price": price, "p_right_share": [round(v, 4) for v in history["label_share"]]})


def static_selection(k: int, mode: str, archs: Sequence[Arch], macs: Sequence[int], c_correct: torch.Tensor,
                     delta: float) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The one-off test-set choice for module ``k``: ``selection.json``'s content with the static choice on `calib` (the
    cheapest candidate within ``delta`` of the most accurate, from each candidate's exit answers
    ``c_correct`` (N, R)), the stage's metrics of it, and the static candidate's index."""
    static = static_choice(c_correct.double().mean(0).tolist(), list(macs), delta)
    selection = {"module": k, "mode": mode, "candidates": [a.key() for a in archs], "candidate_macs": list(macs),
                 "static": archs[static].key(), "static_calib_acc": float(c_correct[:, static].float().mean()),
                 "calib_acc": c_correct.float().mean(0).tolist(), "predictor": None}
    metrics = {"candidates": len(archs), "static_calib_acc": selection["static_calib_acc"],
               "static_macs": macs[static]}
    return selection, metrics, static


def routed_selection(selection: dict[str, Any], metrics: dict[str, Any], static: int, route_h: torch.Tensor,
                     r_correct: torch.Tensor, r_p_true: torch.Tensor, macs: Sequence[int], cfg: PredictorConfig,
                     max_share: float, name: str) -> tuple[dict[str, Any], dict[str, Any], Predictor]:
    """Per-image routing on top of :func:`static_selection`'s result: the predictor fitted on `route`
    (``route_h`` (N, C, H, W), the candidates' answers ``r_correct`` / ``r_p_true`` (N, R)), judged on
    the held-out fifth; it serves only where ``rules.predictor_pays`` (else ``mode`` falls back to
    ``testset``), and ``selection["decision"]`` records the figures and the clause that decided.
    Returns new selection and metrics and the predictor (saved either way, for ablations). A predictor over
    ``max_share`` of the cheapest candidate's MACs is a :class:`ConfigError`."""
    selection, metrics = dict(selection), dict(metrics)
    fitted = fit_predictor(route_h, r_correct, r_p_true, macs, static, cfg)
    predictor, held_choice, n_fit = fitted.predictor, fitted.held_choice, fitted.n_fit
    rows = torch.arange(len(held_choice))
    routed_right = float(r_correct[n_fit:][rows, held_choice].float().mean())
    p_macs = predictor_macs(predictor, tuple(route_h.shape[1:]))
    if p_macs > max_share * min(macs):
        raise ConfigError(f"select@{name}: predictor costs {p_macs:,} MACs, over {max_share:.0%} of the "
                          f"cheapest candidate ({min(macs):,}); lower select.hidden or select.pool")
    selection["predictor"] = {"in_channels": int(route_h.shape[1]), "num_candidates": len(macs),
                              "hidden": cfg.hidden, "pool": cfg.pool, "macs": p_macs}
    if cfg.scoring != "label":
        selection["predictor"].update(scoring=cfg.scoring, offsets=predictor.offsets.tolist())
    held_static = r_correct[n_fit:, static].float().mean().item()
    held_macs = float(torch.tensor(macs, dtype=torch.float64)[held_choice].mean()) + p_macs
    keep, reason = pays_reason(routed_right, held_macs, held_static, macs[static], cfg.tolerance)
    selection["decision"] = {  # the held-out decision, read back by the evaluate stage's verdict
        "served": keep, "rule": "rules.predictor_pays on the held-out fifth of route", "reason": reason,
        "held_out_images": len(held_choice), "routed_acc_heldout": routed_right, "routed_mean_macs_heldout": held_macs,
        "static_acc_heldout": held_static, "static_macs": int(macs[static]), "tolerance": cfg.tolerance}
    if not keep:  # degrade gracefully: the static choice serves, the predictor stays for ablations
        selection["mode"] = "testset"
    metrics.update({"predictor_used": keep, "static_acc_heldout": held_static,
                    "predictor_mean_macs_heldout": held_macs})
    found = dict(fitted.metrics)  # label: label accuracy and share; p_right: price and right shares
    metrics.update({key: found.pop(key) for key in ("predictor_label_acc_heldout",) if key in found})
    metrics.update({"predictor_routed_acc_heldout": routed_right, "predictor_macs": p_macs,
                    "predictor_macs_share": p_macs / min(macs), **found,
                    "predictor_fit_acc": fitted.history["accuracy"][-1] if fitted.history["accuracy"] else None})
    return selection, metrics, predictor
