"""The evaluate stage's whole comparison, as one call over already-loaded objects: the calibrated
cascade on the test split against its baselines (each exit alone, the cascade's own paths without
exits, its static twin, the fixed cascades, the plain CNNs, the oracle), every budget curve fitted on
calib and read on test, wall-clock timing, the routing tables and the target checks; plus the small
headline the DVC metrics file shows and the plots/CSVs of the curves (``stages/evaluate.py`` wires
them to files and MLflow)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.evaluation.dominance import dominance
from pipeline.evaluation.figures import (
    all_exit_figures,
    candidate_correct,
    candidate_exits,
    cascade_summary,
    fitted_curve,
    routing_candidates,
    routing_oracle,
    routing_table,
    target_checks,
    time_cascade,
    timing_noisy,
    to_numpy,
)
from pipeline.evaluation.routing_verdict import held_out_predictability, routing_verdicts, served_choices
from pipeline.evaluation.two_cnn import baseline_arrays, evaluate_baselines
from pipeline.io import Split, atomic_path
from pipeline.models.modules import SupernetModule
from pipeline.models.profile import CostModel
from pipeline.report.plots import anytime_plot, budget_plot, confusion_plot
from pipeline.routing.engine import Stage, run_cascade
from pipeline.routing.package import LoadedCascade
from pipeline.train.baselines import Baselines

STATIC_ROWS = ("largest_candidate_static", "smallest_candidate_static", "space_largest_static",
               "space_smallest_static", "default_static")
Labelled = tuple[torch.Tensor, np.ndarray]  # preprocessed images on the cascade's device, labels


def static_stages(stages: list[Stage], costs: CostModel, which: str) -> list[Stage]:
    """Every module on one fixed path, no predictor, no early exit. ``largest_candidate`` /
    ``smallest_candidate``: the most / least expensive of the paths the cascade's stage runs (with
    no predictor: its one selected path, so both are the cascade without its early exits);
    ``space_largest``/``space_smallest``: the most / least expensive path in the whole search space;
    ``default``: every supernet on its spec's default path."""
    out = []
    for k, stage in enumerate(stages, start=1):
        if which == "default":
            arch = stage.module.default_arch()
        elif which.startswith("space_") and isinstance(stage.module, SupernetModule):
            table = costs.table["modules"][k - 1]["op_macs"]
            pick = max if which == "space_largest" else min
            arch = stage.module.space.make({label: pick(ops, key=ops.get) for label, ops in table.items()})
        else:
            pairs = list(zip(stage.candidate_macs, stage.candidates, strict=True))
            pick = max if "largest" in which else min  # largest_candidate, space_largest (fixed)
            arch = pick(pairs, key=lambda p: p[0])[1]
        out.append(Stage(stage.module, (arch,), (costs.macs(k, arch),), float("inf")))
    return out


def headline(results: dict) -> dict:
    """The handful of figures `dvc exp show` lists (short keys, narrow columns): the cascade's test
    accuracy and mean MACs (millions), against its own paths without early exits (the largest routing
    candidate per module: MACs share, accuracy gap in points, throughput speed-up at batch 256), its
    static twin's accuracy and the plain CNN baselines' accuracies."""
    cascade, vs, b = results["cascade"], results["vs_largest_candidate"], results["baselines"]
    return {"acc": round(cascade["accuracy"], 4), "mmacs": round(cascade["mean_macs"] / 1e6, 3),
            "macs_share": round(vs["macs_share"], 3), "gap_pts": round(vs["accuracy_gap_points"], 2),
            # a speed-up read on a machine too busy to time (repeats spread > 25%) is not reported
            "speedup": None if vs.get("timing_noisy") else round(vs["throughput_speedup_b256"], 2),
            "static_acc": round(results["static_selection"]["accuracy"], 4),
            "cnn_acc": round(b["plain_large"]["accuracy"], 4),
            "cnn2_acc": round(b["two_cnn_cascade"]["accuracy"], 4),
            **({"dominated": bool(results["shipped"]["dominated"])} if "shipped" in results else {})}


def evaluation_suite(main: LoadedCascade, testset: LoadedCascade, fixed_model: LoadedCascade,
                     fixed_at_macs: LoadedCascade, plain: Baselines, *, test: Split, calib: Split,
                     x: torch.Tensor, xc: torch.Tensor, levels: np.ndarray | None, costs: CostModel,
                     models: Path, grid: int, batch1_images: int,
                     epoch_budget: dict[str, Any],
                     predictability_splits: tuple[Labelled, Labelled] | None = None,
                     shipped: str = "cascade") -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """Every figure of ``metrics/evaluate.json`` (in its order) and the four budget curves by plot label.
    ``main``: the calibrated cascade; ``testset``: its static-selection twin; ``fixed_model`` /
    ``fixed_at_macs``: the fixed-path cascade calibrated on its own / at the cascade's calib MACs.
    ``x``/``xc``: the test/calib images preprocessed for the cascades (on their device); ``test``/
    ``calib``: the raw splits (labels; uint8 images for the plain CNNs). ``predictability_splits``:
    (`route`, `calib`) as (preprocessed images, labels), on which the routing verdict measures how
    predictable the right candidate is (None: not measured). ``shipped``: what calibrate shipped (the
    cascade, or the plain CNN it chose on held-out images), whose dominance is read. Run it with grad
    disabled."""
    meta = main.meta
    kind, n_classes = meta.confidence_kind, len(meta.classes)
    y, yc = test.labels, calib.labels
    results: dict = {}
    decay, t_decay, f_decay = (m.meta.ensemble_decay for m in (main, testset, fixed_model))

    def arrays(stages: list[Stage], images: torch.Tensor, labels: np.ndarray, d: float) -> dict:
        return all_exit_figures(stages, images, labels, kind, d)

    def curve_of(stages: list[Stage], d: float, on_test: dict) -> list[dict]:
        on_calib = arrays(stages, xc, yc, d)
        return fitted_curve(tuple(on_calib[k] for k in ("_conf", "_correct", "_cum")),
                            tuple(on_test[k] for k in ("_conf", "_correct", "_cum")), grid=grid)

    routed = run_cascade(main.stages, x, confidence_kind=kind, batch_size=256, ensemble_decay=decay)
    cascade = cascade_summary(routed, y, n_classes, levels)
    cascade["ensemble_decay"] = decay
    cascade["thresholds"] = [s.threshold for s in main.stages[:-1]]
    results["cascade"] = cascade
    results["static_selection"] = {
        **cascade_summary(run_cascade(testset.stages, x, confidence_kind=kind, batch_size=256,
                                      ensemble_decay=t_decay), y, n_classes, levels),
        "ensemble_decay": t_decay, "thresholds": [s.threshold for s in testset.stages[:-1]]}
    exits = arrays(main.stages, x, y, decay)
    results["each_exit"], results["oracle"] = exits["exits"], exits["oracle"]
    results["each_exit_alone"] = all_exit_figures(main.stages, x, y, kind)["exits"]  # no ensemble
    curve = curve_of(main.stages, decay, exits)
    curve_static = curve_of(testset.stages, t_decay, arrays(testset.stages, x, y, t_decay))
    statics = {}
    f_exits = arrays(fixed_model.stages, x, y, f_decay)
    curve_fixed = curve_of(fixed_model.stages, f_decay, f_exits)
    fixed = cascade_summary(run_cascade(fixed_model.stages, x, confidence_kind=kind, batch_size=256,
                                        ensemble_decay=f_decay), y, n_classes, None)
    a_decay = fixed_at_macs.meta.ensemble_decay
    fixed_at = cascade_summary(run_cascade(fixed_at_macs.stages, x, confidence_kind=kind, batch_size=256,
                                           ensemble_decay=a_decay), y, n_classes, None)
    results["baselines"] = {
        **evaluate_baselines(plain, test.images, y),
        "fixed_cascade": {"accuracy": fixed["accuracy"], "mean_macs": fixed["mean_macs"],
                          "exit_share": fixed["exit_share"],
                          "thresholds": [s.threshold for s in fixed_model.stages[:-1]],
                          "ensemble_decay": f_decay,
                          "each_exit": f_exits["exits"]},
        "fixed_cascade_at_cascade_macs": {
            "accuracy": fixed_at["accuracy"], "mean_macs": fixed_at["mean_macs"],
            "exit_share": fixed_at["exit_share"],
            "thresholds": [s.threshold for s in fixed_at_macs.stages[:-1]], "ensemble_decay": a_decay}}
    curve_two_cnn = fitted_curve(baseline_arrays(plain, calib.images, yc),
                                 baseline_arrays(plain, test.images, y), grid=grid)
    recorded = routing_candidates(models, costs, main.stages)
    scored = candidate_correct(main.stages, x, y, kind, recorded, decay=decay)
    results["candidate_exits"] = candidate_exits(scored)
    table = routing_table(main.stages, to_numpy(routed.choices), recorded, results["candidate_exits"],
                          routing_oracle(scored))
    pred = ({} if predictability_splits is None else  # fitted on route, read on calib: never on test
            held_out_predictability(testset.stages, recorded, *predictability_splits, kind, t_decay))
    results["routing"] = routing_verdicts(
        table, models, scored, served_choices(main.stages, recorded, x, kind), to_numpy(routed.choices) >= 0,
        [s.predictor_macs for s in main.stages], pred, cascade, results["static_selection"])
    for name in STATIC_ROWS:
        stages = static_stages(main.stages, costs, name.removesuffix("_static"))
        out = run_cascade(stages, x, confidence_kind=kind, batch_size=256)
        statics[name] = (stages, {"accuracy": float((to_numpy(out.pred) == y).mean()),
                                  "mean_macs": float(out.macs.float().mean()),
                                  "paths": [s.candidates[0].key() for s in stages]})
        results[name] = statics[name][1]
    timing = {"cascade": time_cascade(main.stages, x, kind, batch1_images=batch1_images, big_batch=256,
                                      decay=decay),
              "largest_candidate_static": time_cascade(statics["largest_candidate_static"][0], x, kind,
                                                       batch1_images=batch1_images, big_batch=256)}
    big = results["largest_candidate_static"]
    macs_ratio = big["mean_macs"] / cascade["mean_macs"]
    speedup = timing["cascade"]["throughput_b256"] / timing["largest_candidate_static"]["throughput_b256"]
    results["timing"] = timing
    results["vs_largest_candidate"] = {
        "accuracy_gap_points": 100 * (big["accuracy"] - cascade["accuracy"]),
        "macs_share": cascade["mean_macs"] / big["mean_macs"], "macs_ratio": macs_ratio,
        "throughput_speedup_b256": speedup, "speedup_over_macs_ratio": speedup / macs_ratio,
        "timing_noisy": timing_noisy(timing["cascade"], timing["largest_candidate_static"]),
        "latency_speedup_b1": timing["largest_candidate_static"]["latency_ms_b1_median"]
        / timing["cascade"]["latency_ms_b1_median"]}
    results["budget_curves"] = {"cascade": curve, "static_selection": curve_static,
                                "fixed_cascade": curve_fixed, "two_cnn_cascade": curve_two_cnn}
    results["epoch_budget"] = epoch_budget
    results["shipped"] = dominance(results, len(y), shipped)  # is it dominated by another model of the run?
    results["targets"] = target_checks(results)
    curves = {"cascade (selected routing)": curve, "static selection (claim 8)": curve_static,
              "fixed cascade (default paths)": curve_fixed, "two plain CNNs": curve_two_cnn}
    return results, curves


def write_evaluation_plots(directory: str | os.PathLike[str], results: dict[str, Any],
                           curves: dict[str, list[dict]], classes: Sequence[str]) -> None:
    """``directory`` (written whole or not at all): the budget curves (CSV and plot, with the cascade,
    its baselines and the oracle as points), the anytime curve of the exits and the cascade's confusion
    matrix."""
    with atomic_path(directory, is_dir=True) as tmp:
        pd.concat([pd.DataFrame([{**r, "thresholds": " ".join(f"{t:.4f}" for t in r["thresholds"])}
                                 for r in rows]).assign(model=name) for name, rows in curves.items()]).to_csv(
            tmp / "budget_curve.csv", index=False)
        pd.DataFrame(results["each_exit"]).to_csv(tmp / "anytime.csv", index=False)
        b, cascade = results["baselines"], results["cascade"]
        points = {"cascade (calibrated)": cascade, "fixed cascade (calibrated)": b["fixed_cascade"],
                  "fixed cascade at the cascade's MACs": b["fixed_cascade_at_cascade_macs"],
                  "two plain CNNs (calibrated)": b["two_cnn_cascade"], "plain small CNN": b["plain_small"],
                  "plain large CNN": b["plain_large"],
                  "cascade's paths, no exits": results["largest_candidate_static"],
                  "oracle": results["oracle"]}
        budget_plot(tmp / "budget_curve.png", curves, points)
        anytime_plot(tmp / "anytime.png", results["each_exit"])
        confusion_plot(tmp / "confusion.png", np.array(cascade["confusion"]), classes)


def summary_line(results: dict[str, Any]) -> str:
    """The stage's one closing line: the cascade against its paths without exits, its static twin and
    the oracle, and the speed-up against the MACs ratio (noted when the timing was too noisy to read)."""
    cascade, big, v = results["cascade"], results["largest_candidate_static"], results["vs_largest_candidate"]
    static, oracle = results["static_selection"], results["oracle"]
    return (f"evaluate: cascade {cascade['accuracy']:.4f} at {cascade['mean_macs']:,.0f} MACs (exits "
            f"{cascade['exit_share']}); its paths without exits {big['accuracy']:.4f} at "
            f"{big['mean_macs']:,.0f}; static selection {static['accuracy']:.4f} at "
            f"{static['mean_macs']:,.0f}; oracle {oracle['mean_macs']:,.0f} MACs; "
            f"MACs share {v['macs_share']:.3f}, speed-up {v['throughput_speedup_b256']:.2f}x vs MACs ratio "
            f"{v['macs_ratio']:.2f}x" + (" (timing too noisy to read: the machine was busy; headline speedup "
                                         "left out)" if v["timing_noisy"] else ""))
