"""Exit thresholds from the per-exit arrays of ``engine.run_all_exits`` (pure numpy).

``simulate_thresholds`` is the calibration math's copy of the engine's exit rule: first exit
k < K-1 with conf >= threshold_k, else the last. It must agree with ``engine.run_cascade``
image by image (a test checks it), so it compares in ``conf``'s dtype exactly as torch does.
Inputs for N images and K exits: ``conf`` (N, K) float, ``correct`` (N, K) bool, ``cum_macs``
(N, K) the cost of leaving at exit k. Thresholds are K-1 values (the last exit always answers).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline.params.choices import REFERENCES
from pipeline.params.settings import schema_default

# The shipped rule's settings (the schema's calibrate defaults) are the library's defaults too, so a caller
# that leaves them out gets what a run gets.
GRID: int = schema_default("calibrate", "grid")  # quantiles per exit
REFERENCE: str = schema_default("calibrate", "reference")
BOUND_Z: float = schema_default("calibrate", "bound_z")
MIN_REACH: float = schema_default("calibrate", "min_reach")

NEVER = 1.01  # no confidence reaches it: the exit is never taken
ALWAYS = 0.0  # every confidence (max prob or margin) reaches it: every image leaves there
TOLERANCE = 1e-12  # accuracies are means of booleans; do not let rounding decide feasibility

Key = Callable[[float, float, bool], tuple[Any, ...]]  # (accuracy, mean_macs, feasible) -> larger is better


def _arrays(conf: Any, correct: Any, cum_macs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    conf, correct, cum_macs = np.asarray(conf), np.asarray(correct), np.asarray(cum_macs)
    if conf.ndim != 2 or conf.shape != correct.shape or conf.shape != cum_macs.shape:
        raise ValueError(
            f"conf, correct and cum_macs must share one shape (N, K), "
            f"got {conf.shape}, {correct.shape}, {cum_macs.shape}"
        )
    if conf.shape[0] == 0 or conf.shape[1] == 0:
        raise ValueError(f"need at least one image and one exit, got shape {conf.shape}")
    if not np.issubdtype(conf.dtype, np.floating):
        conf = conf.astype(np.float64)
    return conf, correct.astype(bool), cum_macs.astype(np.float64)


def exit_indices(conf: Any, thresholds: Sequence[float]) -> np.ndarray:
    """The exit each image takes (N,): first k < K-1 with conf >= threshold_k, else K-1."""
    conf = np.asarray(conf)
    n, k_total = conf.shape
    if len(thresholds) != k_total - 1:
        raise ValueError(
            f"{k_total} exits need {k_total - 1} thresholds (the last always answers), got {len(thresholds)}"
        )
    dtype = conf.dtype if np.issubdtype(conf.dtype, np.floating) else np.float64
    thr = np.asarray(thresholds, dtype=np.float64).astype(dtype)  # (K-1,) rounded as torch rounds
    leave = np.concatenate([conf[:, :-1] >= thr, np.ones((n, 1), dtype=bool)], axis=1)  # (N, K)
    return np.argmax(leave, axis=1)  # (N,) first True


def simulate_thresholds(
    conf: Any, correct: Any, cum_macs: Any, thresholds: Sequence[float]
) -> tuple[float, float, np.ndarray]:
    """(accuracy, mean MACs, exit counts (K,)) of the cascade under ``thresholds``, without running it."""
    conf, correct, cum_macs = _arrays(conf, correct, cum_macs)
    exits = exit_indices(conf, thresholds)  # (N,)
    rows = np.arange(conf.shape[0])
    accuracy = float(correct[rows, exits].mean())
    mean_macs = float(cum_macs[rows, exits].mean())
    return accuracy, mean_macs, np.bincount(exits, minlength=conf.shape[1])


def threshold_grid(conf: Any, size: int = GRID) -> list[np.ndarray]:
    """Candidate thresholds per exit k < K-1: ``size`` quantiles of conf[:, k], plus ``NEVER``.

    Each quantile value v becomes the midpoint between v and the next smaller observed confidence
    (``ALWAYS`` below the smallest), so no calibration image sits exactly on a threshold and float
    noise between runs cannot flip its exit.
    """
    conf = np.asarray(conf)
    if conf.ndim != 2 or size < 1:
        raise ValueError(f"threshold_grid needs conf (N, K) and size >= 1, got {conf.shape}, {size}")
    grids = []
    for k in range(conf.shape[1] - 1):
        ordered = np.sort(conf[:, k]).astype(np.float64)  # (N,)
        unique = np.unique(ordered)  # (U,)
        cuts = ordered[np.round(np.linspace(0, len(ordered) - 1, size)).astype(int)]  # (size,)
        pos = np.searchsorted(unique, cuts)  # index of each cut among the unique values
        mids = np.where(pos == 0, ALWAYS, (unique[np.maximum(pos - 1, 0)] + cuts) / 2)  # (size,)
        grids.append(np.unique(np.concatenate([mids, [NEVER]])))
    return grids


def _grids(conf: np.ndarray, grid: int | Sequence[Sequence[float]]) -> list[np.ndarray]:
    if isinstance(grid, (int, np.integer)):
        return threshold_grid(conf, int(grid))
    grids = [np.asarray(g, dtype=np.float64) for g in grid]
    if len(grids) != conf.shape[1] - 1 or any(g.ndim != 1 or g.size == 0 for g in grids):
        raise ValueError(f"grid needs {conf.shape[1] - 1} non-empty lists of thresholds, got {len(grids)}")
    return grids


def _search(
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
    grids: list[np.ndarray],
    key: Key,
    feasible: Callable[[np.ndarray, float], bool],
    exhaustive_limit: int,
    max_sweeps: int,
    min_reach: float,
) -> tuple[list[float], list[dict[str, Any]]]:
    """Best thresholds under ``key``: every combination if there are at most ``exhaustive_limit``,
    else coordinate descent from "never exit early" (one exit's grid at a time, until no change).
    ``feasible(right, mean_macs)`` sees each image's answer (right (N,) bool) under the setting; a
    setting that sends fewer than ``min_reach`` of the images to some module is not feasible either,
    unless no setting meets the rule and the floor together (every setting that feeds a module enough
    images breaks the accuracy bound, e.g. a last module weaker than an earlier exit): then the search
    runs without the floor, which never overrides the accuracy rule.
    """
    seen: dict[tuple[float, ...], dict[str, Any]] = {}
    conf, correct, cum_macs = arrays
    rows = np.arange(conf.shape[0])

    def evaluate(thresholds: tuple[float, ...]) -> dict[str, Any]:
        if thresholds not in seen:
            exits = exit_indices(conf, thresholds)  # (N,)
            right = correct[rows, exits]  # (N,)
            accuracy, mean_macs = float(right.mean()), float(cum_macs[rows, exits].mean())
            counts = np.bincount(exits, minlength=conf.shape[1])  # (K,)
            seen[thresholds] = {
                "thresholds": list(thresholds),
                "accuracy": accuracy,
                "mean_macs": mean_macs,
                "exit_counts": counts.tolist(),
                "feasible": feasible(right, mean_macs) and reaches(counts, min_reach),
            }
        return seen[thresholds]

    def score(row: dict[str, Any]) -> tuple[Any, ...]:
        return key(row["accuracy"], row["mean_macs"], row["feasible"])

    if math.prod(len(g) for g in grids) <= exhaustive_limit:
        combos = [tuple(float(v) for v in c) for c in itertools.product(*grids)]
        best = max((evaluate(c) for c in combos), key=score)  # max keeps the first of equals
    else:
        best = evaluate(tuple(NEVER for _ in grids))
        for _ in range(max_sweeps):
            start = best
            for k, grid in enumerate(grids):
                current = tuple(best["thresholds"])
                for value in grid:
                    row = evaluate(current[:k] + (float(value),) + current[k + 1 :])
                    if score(row) > score(best):
                        best = row
            if best is start:
                break
    if min_reach and not any(row["feasible"] for row in seen.values()):
        return _search(arrays, grids, key, feasible, exhaustive_limit, max_sweeps, 0.0)
    return list(best["thresholds"]), list(seen.values())


def reach_shares(exit_counts: Sequence[int]) -> list[float]:
    """Share of the images that reach each module (module 1: all of them), from the counts per exit."""
    counts = np.asarray(exit_counts, dtype=np.float64)  # (K,)
    if counts.ndim != 1 or counts.size == 0 or counts.sum() <= 0:
        raise ValueError(f"reach_shares needs non-empty counts per exit, got {list(exit_counts)}")
    return (counts[::-1].cumsum()[::-1] / counts.sum()).tolist()


def reaches(exit_counts: Sequence[int], min_reach: float) -> bool:
    """Whether every module is reached by at least ``min_reach`` of the images (0: always)."""
    return not min_reach or min(reach_shares(exit_counts)) >= min_reach - TOLERANCE


def reach_line(reach: Sequence[float], min_reach: float, met: bool = True) -> str:
    """``modules reached by 100.0% / 18.2% / 6.1% (floor 6%)``, for a stage's last lines."""
    floor = (f" (floor {min_reach:.0%}" + ("" if met else ", dropped: no setting that reaches it keeps the"
                                            " accuracy bound") + ")") if min_reach else ""
    return f"modules reached by {' / '.join(f'{r:.1%}' for r in reach)}{floor}"


def _check_reach(min_reach: float) -> None:
    if not 0 <= min_reach < 1:
        raise ValueError(f"min_reach is a share in [0, 1), got {min_reach}")


def calibrate_delta(
    conf: Any,
    correct: Any,
    cum_macs: Any,
    delta: float,
    grid: int | Sequence[Sequence[float]] = GRID,
    *,
    exhaustive_limit: int = 4096,
    max_sweeps: int = 10,
    reference: str = REFERENCE,
    z: float = BOUND_Z,
    min_reach: float = MIN_REACH,
) -> tuple[list[float], list[dict[str, Any]]]:
    """Thresholds with the least mean MACs whose accuracy loss against the reference is at most
    ``delta`` (a fraction: 0.003 is 0.3 pp), on the data given. ``reference``: ``last`` = always
    running to the last exit (the brief's rule); ``best`` = the most accurate single exit, always
    reachable (every earlier threshold at ``NEVER``, that exit's at ``ALWAYS``), so a last module
    weaker than an earlier one cannot lower the bar.

    ``z`` > 0 puts the held-out set's size in view: the loss is bounded above by its paired estimate
    plus ``z`` standard errors (``loss_bound``), so on a small set, where a lucky threshold looks free,
    the rule keeps images going to the reference exit unless the data show the early exits are safe;
    on a large set the bound is close to the estimate. ``z`` = 0 is the point estimate.

    ``min_reach`` > 0 keeps only settings that send at least that share of the images to every module
    (never exiting early always does), so no module the run trained is left without images, unless no
    such setting meets the accuracy bound: then the floor is dropped (the fit's ``reach`` shows it).

    ``grid`` is a number of quantiles per exit (see ``threshold_grid``) or explicit candidate lists.
    Returns the thresholds and the sweep: one row per evaluated setting (``thresholds``,
    ``accuracy``, ``mean_macs``, ``exit_counts``, ``feasible``), for writing and plotting.
    """
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    if not z >= 0:
        raise ValueError(f"z must be >= 0, got {z}")
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
    _check_reach(min_reach)
    arrays = _arrays(conf, correct, cum_macs)
    exit_acc = arrays[1].mean(axis=0)  # (K,)
    ref = arrays[1][:, -1 if reference == "last" else int(np.argmax(exit_acc))]  # (N,) the reference's answers

    def feasible(right: np.ndarray, _macs: float) -> bool:
        return loss_bound(ref, right, z) <= delta + TOLERANCE

    def key(accuracy: float, macs: float, ok: bool) -> tuple[Any, ...]:
        return (ok, -macs if ok else accuracy, accuracy)

    return _search(arrays, _grids(arrays[0], grid), key, feasible, exhaustive_limit, max_sweeps, min_reach)


def loss_bound(reference: np.ndarray, right: np.ndarray, z: float) -> float:
    """Upper bound on the accuracy lost against ``reference`` (per-image right/wrong, (N,) bool each):
    the mean paired difference plus ``z`` standard errors of it (0 when the two never disagree)."""
    d = reference.astype(np.float64) - right.astype(np.float64)  # (N,) in {-1, 0, 1}
    return float(d.mean() + z * d.std() / math.sqrt(len(d))) if z else float(d.mean())


def calibrate_budget(
    conf: Any,
    correct: Any,
    cum_macs: Any,
    budget_macs: float,
    grid: int | Sequence[Sequence[float]] = GRID,
    *,
    exhaustive_limit: int = 4096,
    max_sweeps: int = 10,
    least_if_none: bool = False,
    min_reach: float = MIN_REACH,
) -> tuple[list[float], list[dict[str, Any]]]:
    """Thresholds with the highest accuracy whose mean MACs per image are at most ``budget_macs``
    (and, with ``min_reach`` > 0, that send at least that share of the images to every module).

    Fails if no setting in the grid fits the budget (it is below the cost of exiting early enough),
    unless ``least_if_none``: then the setting of least MACs (what a comparison at another cascade's
    cost falls back to when that cost is below anything this cascade can reach). Returns the thresholds
    and the sweep, as ``calibrate_delta`` does.
    """
    _check_reach(min_reach)
    arrays = _arrays(conf, correct, cum_macs)

    def feasible(_right: np.ndarray, macs: float) -> bool:
        return macs <= budget_macs

    def key(accuracy: float, macs: float, ok: bool) -> tuple[Any, ...]:
        return (ok, accuracy if ok else -macs, -macs)

    thresholds, sweep = _search(arrays, _grids(arrays[0], grid), key, feasible, exhaustive_limit,
                                        max_sweeps, min_reach)
    if not least_if_none and not any(row["feasible"] for row in sweep):
        least = min(row["mean_macs"] for row in sweep)
        raise ValueError(f"no thresholds fit a budget of {budget_macs} MACs; the least found is {least:.0f}")
    return thresholds, sweep


def oracle(correct: Any, cum_macs: Any) -> tuple[float, float]:
    """(accuracy, mean MACs) if each image left at the first exit that is right (else the last):
    the bound any exit rule over these exits can reach."""
    correct, cum_macs = np.asarray(correct).astype(bool), np.asarray(cum_macs, dtype=np.float64)
    if correct.ndim != 2 or correct.shape != cum_macs.shape or correct.size == 0:
        raise ValueError(
            f"correct and cum_macs must share one non-empty shape (N, K), "
            f"got {correct.shape}, {cum_macs.shape}"
        )
    right = correct.any(axis=1)  # (N,)
    exits = np.where(right, np.argmax(correct, axis=1), correct.shape[1] - 1)  # (N,)
    return float(right.mean()), float(cum_macs[np.arange(len(exits)), exits].mean())


def ensemble_ties(fits: dict[float, dict[str, Any]], z: float = 0.0) -> set[float]:
    """The exit-ensemble decays whose calibrated cascade is within ``z`` standard errors of the most
    accurate one's on the calibration data (the most accurate included), the error of the paired
    per-image difference (``right``: (N,) bool, each image answered right); ``z`` = 0: exact ties only.
    Each value of ``fits`` is one decay's calibration result (thresholds fitted with that ensemble)."""
    if not fits:
        raise ValueError("no exit-ensemble decays to choose from")
    if not z >= 0:
        raise ValueError(f"z must be >= 0, got {z}")
    best = min(fits, key=lambda d: (-round(fits[d]["accuracy"], 12), round(fits[d]["mean_macs"], 6), d))

    def ties(d: float) -> bool:
        gap = fits[best]["accuracy"] - fits[d]["accuracy"]
        if d == best or not z:
            return gap <= TOLERANCE
        lost = np.asarray(fits[best]["right"], dtype=np.float64) - np.asarray(fits[d]["right"], dtype=np.float64)
        return gap <= z * float(lost.std()) / math.sqrt(len(lost)) + TOLERANCE

    return {d for d in fits if ties(d)}


def choose_ensemble_decay(fits: dict[float, dict[str, Any]], z: float = 0.0) -> float:
    """The exit-ensemble decay to keep: the cheapest (fewest ``mean_macs``, then the higher accuracy, then
    the smaller decay) of ``ensemble_ties``. The one-standard-error rule at ``z`` = 1: a difference of one
    or two held-out images does not buy more MACs (on the Fashion-MNIST default 1 image of 6,000 picked a
    decay costing 1.4% more); ``z`` = 0 keeps the most accurate."""
    return min(ensemble_ties(fits, z),
               key=lambda d: (round(fits[d]["mean_macs"], 6), -round(fits[d]["accuracy"], 12), d))


def calib_front(conf: Any, correct: Any, cum_macs: Any, grid: int | Sequence[Sequence[float]] = GRID,
                points: int = 41) -> list[dict[str, Any]]:
    """Thresholds fitted on these (calibration) arrays at ``points`` budgets spread over their cost
    range: for budget B, the setting of the threshold sweep with the best accuracy at mean MACs <= B
    (the cheaper one on a tie), as budget mode fits it. Consecutive budgets that fit the same setting
    give one row: ``{"budget_macs", "thresholds", "calib_accuracy", "calib_mean_macs"}``. Reading these
    rows on another split traces its budget curve with nothing fitted on that split."""
    if points < 2:
        raise ValueError(f"calib_front needs at least 2 budgets, got {points}")
    _, sweep = calibrate_budget(conf, correct, cum_macs, math.inf, grid, min_reach=0.0)  # every setting
    rows = sorted(sweep, key=lambda r: (r["mean_macs"], -r["accuracy"]))
    front: list[dict[str, Any]] = []
    best, i = None, 0
    for budget in np.linspace(rows[0]["mean_macs"], rows[-1]["mean_macs"], points):
        while i < len(rows) and rows[i]["mean_macs"] <= budget * (1 + TOLERANCE):
            if best is None or rows[i]["accuracy"] > best["accuracy"] + TOLERANCE:
                best = rows[i]
            i += 1
        if front and front[-1]["thresholds"] == [float(t) for t in best["thresholds"]]:
            continue
        front.append({"budget_macs": float(budget), "thresholds": [float(t) for t in best["thresholds"]],
                      "calib_accuracy": float(best["accuracy"]), "calib_mean_macs": float(best["mean_macs"])})
    return front
