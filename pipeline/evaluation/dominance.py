"""Is the shipped model dominated? Read on test by ``evaluate`` (``metrics/evaluate.json`` ``shipped``),
shown in the run's last lines and held against promotion by ``register``.

The shipped model is the calibrated cascade (its operating point chosen on held-out images; an exit
alone, a shorter cascade, is among the settings its rule can pick). Another model of the same run
*dominates* it when it costs no more mean MACs and reads more than one standard error of the shipped
model's test accuracy higher (``sqrt(p (1 - p) / n)``): a gap the test split's noise does not explain.
The run's other models are each exit alone and the plain baselines (``plain_small``, ``plain_large``,
the two chained). A model that is not cheaper but costs at most ``NEAR_MACS`` times as much and reads
more than one SE higher does not dominate by that rule; it is named (``nearly_dominated_by``) and the
verdict says so, since a user reads a 1% dearer model 18 points better as a loss (the scenes folder of
``bench.own_data``, seed 1).

What ships is decided before test is read, by the same rule on held-out images
(:func:`held_out_choice`, run by ``calibrate``): a plain CNN of the run that dominates or nearly
dominates the calibrated cascade there ships instead of it, alone, in the cascade's model format; so
does one that costs no more and reads at least as high there (a tie goes to the simpler, cheaper
model: the cascade's held-out figure is also the one its thresholds were fitted on, so it flatters it).
``dominance`` then reads the shipped model, whichever it is, on test. Pure: dicts in, dicts out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

WITHIN_BEST_EXIT = 0.003  # the shipped model may read this much (plus one SE) under its best exit
BASELINES = ("plain_small", "plain_large", "two_cnn_cascade")
SHIPPABLE = ("cascade", "plain_small", "plain_large")  # what a model directory can hold and a run ship
NEAR_MACS = 1.1  # a better model at up to this many times the shipped model's MACs is named in the verdict


def _what(shipped: str) -> str:
    return "cascade" if shipped == "cascade" else f"model ({shipped})"


def std_error(accuracy: float, n: int) -> float:
    """Binomial standard error of an accuracy read on ``n`` images."""
    if n < 1:
        raise ValueError(f"need at least one test image, got {n}")
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n)


def _beats(acc: float, macs: float, se: float, a: float, m: float) -> tuple[bool, bool]:
    """(dominates, nearly dominates) a model reading ``acc`` at ``macs`` with standard error ``se``."""
    better = a > acc + se
    return better and m <= macs * (1 + 1e-9), better and macs * (1 + 1e-9) < m <= macs * NEAR_MACS


def _ties_cheaper(acc: float, macs: float, a: float, m: float) -> bool:
    """At most the cascade's MACs and at least its held-out accuracy: the simpler model ships. The scenes
    folder's seed 0 (module 1 not distilled) shipped its cascade at 91.93% held out against plain_small's 92.71% at
    0.84x its MACs (0.78 points, under one SE) and read 2.71 points under it on test, dominated; over
    the 40 own-data runs on record the tie rule ships a plain CNN in exactly the two that test found
    dominated (docs/RESULTS.md "No distillation on hard data")."""
    return m <= macs * (1 + 1e-9) and a >= acc


def held_out_choice(cascade: Mapping[str, float], plains: Mapping[str, Mapping[str, float]],
                    n_held_out: int) -> dict[str, Any]:
    """What the run ships, chosen on held-out images: the calibrated cascade, unless a plain CNN reads
    more than one SE of the cascade's held-out accuracy higher at <= ``NEAR_MACS`` times its MACs
    (the rule ``dominance`` reads on test), or at least as high at no more MACs (:func:`_ties_cheaper`);
    then the most accurate such plain CNN. ``cascade`` and each of ``plains`` (by name):
    ``{"accuracy", "mean_macs"}`` on the same ``n_held_out`` images."""
    acc, macs = float(cascade["accuracy"]), float(cascade["mean_macs"])
    se = std_error(acc, n_held_out)
    rows = []
    for name, row in plains.items():
        if name not in SHIPPABLE:
            raise ValueError(f"held_out_choice: {name!r} cannot ship (shippable: {SHIPPABLE})")
        a, m = float(row["accuracy"]), float(row["mean_macs"])
        rows.append({"model": name, "accuracy": a, "mean_macs": m, "macs_ratio": round(m / macs, 4) if macs else None,
                     "beats_cascade": any(_beats(acc, macs, se, a, m)) or _ties_cheaper(acc, macs, a, m)})
    winners = [r for r in rows if r["beats_cascade"]]
    if winners:
        best = max(winners, key=lambda r: (r["accuracy"], -r["mean_macs"]))
        why = "more than one SE," if best["accuracy"] > acc + se else "no less accurate at no more MACs; one SE is"
        reason = (f"{best['model']} ships instead of the cascade: on {n_held_out} held-out images it reads "
                  f"{100 * best['accuracy']:.2f}% at {best['macs_ratio']:.2f}x the cascade's MACs against the "
                  f"cascade's {100 * acc:.2f}% ({why} {100 * se:.2f} points)")
        model = best["model"]
    else:
        reason = (f"the cascade ships: no plain CNN at <= {NEAR_MACS:g}x its MACs reads more than one SE "
                  f"({100 * se:.2f} points) above its {100 * acc:.2f}% on {n_held_out} held-out images, nor one "
                  "at no more MACs as high")
        model = "cascade"
    return {"model": model, "held_out_images": n_held_out, "cascade": {"accuracy": acc, "mean_macs": macs},
            "se": se, "plains": rows, "reason": reason}


def others(results: Mapping[str, Any], shipped: str = "cascade") -> dict[str, Mapping[str, Any]]:
    """Every other model an evaluate run reads on test, by name: each exit alone, the plain baselines
    and, when a plain CNN ships, the calibrated cascade."""
    rows: dict[str, Mapping[str, Any]] = {f"exit {r['exit']} alone": r for r in results["each_exit_alone"]}
    rows.update({name: results["baselines"][name] for name in BASELINES if name in results["baselines"]})
    if shipped != "cascade":
        rows["cascade"] = results["cascade"]
        rows.pop(shipped)
    return rows


def shipped_row(results: Mapping[str, Any], shipped: str = "cascade") -> Mapping[str, Any]:
    """The shipped model's test figures in evaluate's results."""
    if shipped not in SHIPPABLE:
        raise ValueError(f"unknown shipped model {shipped!r} (shippable: {SHIPPABLE})")
    return results["cascade"] if shipped == "cascade" else results["baselines"][shipped]


def _rows(results: Mapping[str, Any], shipped: str, acc: float, macs: float, se: float) -> list[dict[str, Any]]:
    """Every other model of the run against the shipped one: its gain in points, its MACs ratio, and
    whether it dominates or nearly dominates (``_beats``)."""
    rows = []
    for name, row in others(results, shipped).items():
        a, m = float(row["accuracy"]), float(row["mean_macs"])
        rows.append({"model": name, "accuracy": a, "mean_macs": m, "gain_pts": round(100 * (a - acc), 4),
                     "macs_ratio": round(m / macs, 4) if macs else None,
                     **dict(zip(("dominates", "nearly_dominates"), _beats(acc, macs, se, a, m), strict=True))})
    return rows


def _verdict(rows: list[dict[str, Any]], shipped: str, se: float, n_test: int, gap: float, within: bool) -> str:
    """The one sentence: dominated (by the most accurate that dominates), nearly, under its best exit, or not."""
    near = [r for r in rows if r["nearly_dominates"]]
    if any(r["dominates"] for r in rows):
        worst = max((r for r in rows if r["dominates"]), key=lambda r: r["accuracy"])
        return (f"DOMINATED: {worst['model']} reads {worst['gain_pts']:+.2f} points at "
                f"{worst['macs_ratio']:.2f}x the shipped {_what(shipped)}'s MACs (one SE is {100 * se:.2f} points "
                f"on {n_test} test images); the registry will not make it champion")
    if near:
        worst = max(near, key=lambda r: r["accuracy"])
        return (f"not dominated by the rule (no better model at <= its MACs), but {worst['model']} reads "
                f"{worst['gain_pts']:+.2f} points at {worst['macs_ratio']:.2f}x its MACs (one SE is "
                f"{100 * se:.2f} points on {n_test} test images): nearly the same cost, clearly better")
    if not within:
        return (f"not dominated, but {100 * gap:.2f} points under its best exit (more than "
                f"{100 * WITHIN_BEST_EXIT:.1f} + one SE of {100 * se:.2f})")
    return (f"not dominated: no other model of this run at <= its MACs reads more than one SE "
            f"({100 * se:.2f} points on {n_test} test images) higher")


def dominance(results: Mapping[str, Any], n_test: int, shipped: str = "cascade") -> dict[str, Any]:
    """The shipped model (the calibrated cascade or the plain CNN the held-out rule chose) against every
    other model of the run, on test: who dominates it, how far it reads under the cascade's best exit,
    and one sentence of verdict."""
    row = shipped_row(results, shipped)
    acc, macs = float(row["accuracy"]), float(row["mean_macs"])
    se = std_error(acc, n_test)
    rows = _rows(results, shipped, acc, macs, se)
    best_exit = max(float(r["accuracy"]) for r in results["each_exit_alone"])
    by = [r["model"] for r in rows if r["dominates"]]
    gap = best_exit - acc
    within = gap <= WITHIN_BEST_EXIT + se
    return {"model": shipped, "accuracy": acc, "mean_macs": macs, "test_images": n_test, "se": se,
            "dominated": bool(by), "dominated_by": by,
            "nearly_dominated_by": [r["model"] for r in rows if r["nearly_dominates"]],
            "best_exit_accuracy": best_exit, "gap_to_best_exit_pts": round(100 * gap, 4), "within_best_exit": within,
            "others": rows, "verdict": _verdict(rows, shipped, se, n_test, gap, within)}
