"""Routing's verdict in every run (docs/RESULTS.md 'Positive control'): per supernet with several
routing candidates, whether its
predictor serves and the rule that decided (the select stage's held-out decision), how predictable the
right candidate is on held-out data (``routing.predictability``: fitted on `route`, read on `calib`),
the oracle's headroom over the choice that serves, the routed cascade against its static twin, and
one sentence. The evaluate stage adds these to each row of ``metrics/evaluate.json``'s ``routing``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.evaluation.figures import candidate_correct, to_numpy, vs_static_selection
from pipeline.io import read_json
from pipeline.routing.engine import Stage, run_cascade
from pipeline.routing.predictability import image_features, module_inputs, predictability
from pipeline.search.space import Arch

PREDICTABLE, WEAK = 0.7, 0.6  # AUC at or above: "predictable", "weakly predictable"; below WEAK: not

Candidates = Sequence[tuple[Sequence[Arch], Sequence[int]]]


def reaching_rows(twin: Sequence[Stage], k: int, recorded: Candidates, x: torch.Tensor, y: np.ndarray, kind: str,
                  decay: float) -> tuple[np.ndarray, np.ndarray]:
    """Module k's routing problem on one split, on the images that the static twin ``twin`` (its
    calibrated thresholds, its exit ensemble ``decay``) sends to module k: their features
    (``predictability.image_features``) and whether each recorded candidate's exit k is right (M, R)."""
    reach = to_numpy(run_cascade(twin, x, confidence_kind=kind, batch_size=512,
                                 ensemble_decay=decay).choices[:, k - 1]) >= 0
    single = [(s.candidates, s.candidate_macs) for s in twin]
    single[k - 1] = recorded[k - 1]
    right = candidate_correct(twin, x, y, kind, single, decay=decay)[k]["correct"]
    inputs, probs = module_inputs(twin, x, k)
    return image_features(inputs, probs)[reach], right[reach]


def held_out_predictability(twin: Sequence[Stage], recorded: Candidates, fit: tuple[torch.Tensor, np.ndarray],
                            held: tuple[torch.Tensor, np.ndarray], kind: str, decay: float) -> dict[int, dict]:
    """Per module with several recorded candidates (1-based key): ``predictability`` of the right
    candidate, the learner fitted on ``fit`` (images, labels: `route`) and read on ``held`` (`calib`),
    each restricted to the images the static twin sends to that module."""
    out = {}
    for k, (stage, (archs, _)) in enumerate(zip(twin, recorded, strict=True), start=1):
        if len(archs) < 2:
            continue
        keys = [a.key() for a in archs]
        if stage.candidates[0].key() not in keys:
            out[k] = {"auc": None, "note": f"the static twin's path at module {k} is not a recorded candidate"}
            continue
        x_fit, r_fit = reaching_rows(twin, k, recorded, *fit, kind, decay)
        x_held, r_held = reaching_rows(twin, k, recorded, *held, kind, decay)
        out[k] = predictability(x_fit, r_fit, x_held, r_held, keys.index(stage.candidates[0].key()))
    return out


def served_from(stages: Sequence[Stage], recorded: Candidates, choices: np.ndarray) -> dict[int, np.ndarray]:
    """Per module with several recorded candidates: the recorded candidate (index) the shipped cascade
    runs on each image, -1 where its path is not among them, from the (N, K) candidate each module ran on
    each image with no early exit."""
    out = {}
    for k, (stage, (archs, _)) in enumerate(zip(stages, recorded, strict=True), start=1):
        if len(archs) >= 2:
            keys = [a.key() for a in archs]
            index = np.array([keys.index(a.key()) if a.key() in keys else -1 for a in stage.candidates])
            out[k] = index[choices[:, k - 1]]
    return out


def headroom(correct: np.ndarray, module_macs: Sequence[int], choice: np.ndarray, reached: np.ndarray,
             extra_macs: int = 0) -> dict[str, Any] | None:
    """The oracle (per image the cheapest right candidate) against the choice that serves (``choice``
    (N,) per image, -1: not a recorded candidate -> None), both at module k's exit with ``correct``
    (N, R): accuracy and module MACs over every test image, then the accuracy over the ``reached``
    (N,) images that the shipped cascade sends to the module, and what that is worth to the whole
    cascade at most (points over all test images). ``extra_macs``: the predictor's cost, if it serves."""
    if (choice < 0).any():
        return None
    macs = np.asarray(module_macs, dtype=np.float64)
    rows = np.arange(len(choice))
    served = correct[rows, choice]
    right = correct[:, np.argsort(macs, kind="stable")]
    cheapest = np.argsort(macs, kind="stable")[np.where(right.any(1), np.argmax(right, 1), 0)]
    n, m = len(choice), int(reached.sum())
    gain_reached = float(correct[reached].any(1).mean() - served[reached].mean()) if m else 0.0
    return {"oracle_exit_accuracy": float(correct.any(1).mean()), "served_exit_accuracy": float(served.mean()),
            "accuracy_points": 100 * float(correct.any(1).mean() - served.mean()),
            "oracle_module_macs": float(macs[cheapest].mean()),
            "served_module_macs": float(macs[choice].mean()) + extra_macs,
            "images_reaching": m, "accuracy_points_on_reaching": 100 * gain_reached,
            "cascade_points_at_most": 100 * gain_reached * m / max(n, 1)}


def served_reason(selection: dict[str, Any] | None, used: bool) -> str:
    """Why the predictor serves or not, from the select stage's ``selection.json``: its held-out
    decision (``routed_selection``) where it trained one."""
    if selection is None:
        return "the select stage recorded no selection for it"
    if selection.get("predictor") is None:
        return f"no predictor was trained (select.mode: {selection.get('mode')}); the static choice serves"
    d = selection.get("decision")
    if d is None:
        return ("a predictor was trained but its select stage recorded no held-out decision (an older run: "
                "re-run select)" + ("" if used else "; the static choice serves"))
    figures = (f"on {d['held_out_images']} held-out route images it was {100 * d['routed_acc_heldout']:.2f}% right at "
               f"{d['routed_mean_macs_heldout']:,.0f} MACs against the static choice's "
               f"{100 * d['static_acc_heldout']:.2f}% at {d['static_macs']:,}")
    return f"{figures}: it {'serves' if d['served'] else 'does not serve'}, as {d['reason']}"


def auc_words(auc: float | None) -> str:
    if auc is None:
        return "not measurable here"
    if auc >= PREDICTABLE:
        return "predictable"
    return "weakly predictable" if auc >= WEAK else "not predictable in advance"


def verdict_sentence(module: int, used: bool, reason: str, pred: dict[str, Any], room: dict[str, Any] | None,
                     vs_twin: dict[str, Any]) -> str:
    """One plain sentence (or two) a user of their own data can act on."""
    auc = pred.get("auc")
    n = sum(row.get("held_out_disagreements", 0) for row in pred.get("per_candidate", []))
    auc_text = auc_words(auc) + ("" if auc is None else f" (AUC {auc:.2f} on {n} disagreements in held-out calib)")
    room_text = ("" if room is None else f"; an oracle router, which reads the labels, would add at most "
                 f"{room['cascade_points_at_most']:.2f} points to the cascade")
    twin = (f"the routed cascade is {vs_twin['accuracy_points']:+.2f} points at {vs_twin['macs_ratio']:.2f}x "
            f"its static twin's MACs on test")
    if used:
        return (f"Module {module} routes per image: {reason}. Which candidate is right is {auc_text}{room_text}; "
                f"{twin}, {'a gain by the routing target' if vs_twin['met'] else 'not a gain by the routing target'}.")
    return (f"Module {module} does not route: {reason}. Which candidate is right is {auc_text}{room_text}; "
            f"{twin}.")


def routing_verdicts(table: list[dict[str, Any]], models: Path, scored: dict[int, dict[str, Any]],
                     served: dict[int, np.ndarray], reached: np.ndarray, predictor_macs: Sequence[int],
                     pred: dict[int, dict[str, Any]], cascade: dict, static: dict) -> list[dict[str, Any]]:
    """``routing_table``'s rows with the verdict added: ``served``, ``why``, ``predictability``,
    ``headroom``, ``vs_static_twin`` and ``verdict``. ``scored``: ``candidate_correct`` on test;
    ``served``: ``served_from``; ``reached``: (N, K) whether each test image reaches each module in
    the shipped cascade; ``predictor_macs``: per module; ``pred``: ``held_out_predictability``;
    ``cascade`` / ``static``: the routed cascade's and its static twin's figures on test."""
    check = vs_static_selection(cascade, static)
    vs_twin = {"accuracy_points": 100 * check["measured"][0], "macs_ratio": check["measured"][1],
               "met": check["met"]}
    rows = []
    for row in table:
        k = row["module"]
        path = models / f"m{k}" / "select" / "selection.json"
        selection = read_json(path) if path.exists() else None
        used = bool(row["predictor_used"])
        reason = served_reason(selection, used)
        p = pred.get(k, {"auc": None, "note": "not measured"})
        room = (headroom(scored[k]["correct"], scored[k]["module_macs"], served[k], reached[:, k - 1],
                         predictor_macs[k - 1] if used else 0) if k in scored and k in served else None)
        rows.append({**row, "served": used, "why": reason, "predictability": p, "headroom": room,
                     "vs_static_twin": vs_twin, "verdict": verdict_sentence(k, used, reason, p, room, vs_twin)})
    return rows


def verdict_lines(results: dict[str, Any]) -> list[str]:
    """The run's last lines: per supernet its verdict figures, then its sentence."""
    lines = []
    for row in results.get("routing", []):
        if "verdict" not in row:
            continue
        auc, room = row["predictability"].get("auc"), row["headroom"]
        lines.append(f"routing verdict, module {row['module']}: {'served' if row['served'] else 'not served'}; "
                     f"predictability AUC {'n/a' if auc is None else f'{auc:.3f}'} (held-out calib); "
                     + ("oracle headroom n/a; " if room is None else
                        f"oracle headroom {room['accuracy_points']:+.2f} points at exit {row['module']} at "
                        f"{room['oracle_module_macs'] / max(room['served_module_macs'], 1):.2f}x the module MACs "
                        f"(at most {room['cascade_points_at_most']:+.2f} points for the cascade); ")
                     + f"vs static twin {row['vs_static_twin']['accuracy_points']:+.2f} points at "
                       f"{row['vs_static_twin']['macs_ratio']:.2f}x MACs")
        lines.append(f"  {row['verdict']}")
    return lines
