"""Evaluate the calibrated cascade on the test split (the only stage that reads it) against its
baselines, in one run: each exit alone, the cascade's own paths without exits (the largest and the
smallest of each module's routing candidates), its static twin (every supernet on its claim-8 static
choice instead of a predictor, calibrated the same way), the fixed cascade, and the oracle. Every
operating point and every budget curve has its thresholds fitted on `calib` and read on test. Reports
accuracy, average MACs, wall-clock latency at batch 1 and throughput at batch 256, exits per
difficulty level, per-class accuracy and the confusion matrix; plots the budget and anytime curves.
Each cascade runs with the exit ensemble its calibration chose (`ensemble_decay` in its manifest);
`each_exit_alone` gives every exit without it. Static paths have no exits, so no ensemble."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.baselines import BaselineConfig, baseline_arrays, evaluate_baselines, load_baselines
from pipeline.config import ComputeConfig, TrackingConfig
from pipeline.data.grader_store import GRADER_FILE, levels_of, load_grader
from pipeline.device import autocast, to_device
from pipeline.evaluation import (
    all_exit_figures,
    candidate_correct,
    candidate_exits,
    cascade_summary,
    comparison_table,
    fitted_curve,
    routing_candidates,
    routing_oracle,
    routing_table,
    target_checks,
    time_cascade,
    timing_noisy,
    to_numpy,
)
from pipeline.io import atomic_path, load_split, read_json, write_json
from pipeline.models.modules import SupernetModule
from pipeline.models.profile import CostModel
from pipeline.plots import anytime_plot, budget_plot, confusion_plot
from pipeline.routing.engine import Stage, run_cascade
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import preprocess
from pipeline.tracking import stage_run
from pipeline.train.config import module_train_config
from stages.common import cli, params_of, parser


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
            arch = (max(pairs, key=lambda p: p[0]) if which.endswith("largest") else min(pairs, key=lambda p: p[0]))[1]
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
            "cnn2_acc": round(b["two_cnn_cascade"]["accuracy"], 4)}


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("evaluate", __doc__)
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--graded", type=Path, required=True, help="directory written by grade (grading model)")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON")
    p.add_argument("--model", type=Path, required=True, help="calibrated cascade (model directory)")
    p.add_argument("--model-testset", type=Path, required=True,
                   help="static-selection cascade: every supernet on its claim-8 static choice")
    p.add_argument("--model-fixed", type=Path, required=True,
                   help="fixed-path cascade (supernets on their default path, no predictors)")
    p.add_argument("--model-fixed-at-macs", type=Path, required=True,
                   help="the fixed-path cascade calibrated at the selected cascade's mean MACs on calib")
    p.add_argument("--models", type=Path, required=True,
                   help="trained modules directory (models/modules): each module's routing candidates")
    p.add_argument("--baselines", type=Path, required=True, help="plain CNN baselines (written by the baselines stage)")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    p.add_argument("--headline", type=Path, default=None,
                   help="small JSON of the headline figures (dvc.yaml's one DVC metrics file)")
    p.add_argument("--plots", type=Path, required=True, help="plots directory")
    p.add_argument("--batch1-images", type=int, default=300, help="images timed one by one (default 300)")
    args = p.parse_args(argv)
    params = params_of(args)
    compute = ComputeConfig.from_params(params)
    device = compute.resolve()
    costs = CostModel(read_json(args.profile))
    test, calib = load_split(args.data, "test"), load_split(args.data, "calib")
    grid = int((params.get("calibrate") or {}).get("grid", 50))
    main_model, testset_model = load_cascade(args.model, device), load_cascade(args.model_testset, device)
    fixed_model, plain = load_cascade(args.model_fixed, device), load_baselines(args.baselines)
    fixed_at_macs = load_cascade(args.model_fixed_at_macs, device)
    to_device((plain.small, plain.large), device)
    meta = main_model.meta
    kind, n_classes = meta.confidence_kind, len(meta.classes)
    x, y = preprocess(test.images, meta).to(device), test.labels
    xc, yc = preprocess(calib.images, meta).to(device), calib.labels
    levels = levels_of(load_grader(args.graded / GRADER_FILE), test.images, y, args.graded / "scores.csv")
    torch.set_grad_enabled(False)
    with stage_run("evaluate", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"model": str(args.model)}) as run, autocast(device, compute.precision):
        results: dict = {}
        decay, t_decay, f_decay = (m.meta.ensemble_decay for m in (main_model, testset_model, fixed_model))

        def arrays(stages: list[Stage], images: torch.Tensor, labels: np.ndarray, d: float) -> dict:
            return all_exit_figures(stages, images, labels, kind, d)

        def curve_of(stages: list[Stage], d: float, on_test: dict) -> list[dict]:
            on_calib = arrays(stages, xc, yc, d)
            return fitted_curve(tuple(on_calib[k] for k in ("_conf", "_correct", "_cum")),
                                tuple(on_test[k] for k in ("_conf", "_correct", "_cum")), grid=grid)

        routed = run_cascade(main_model.stages, x, confidence_kind=kind, batch_size=256, ensemble_decay=decay)
        cascade = cascade_summary(routed, y, n_classes, levels)
        cascade["ensemble_decay"] = decay
        cascade["thresholds"] = [s.threshold for s in main_model.stages[:-1]]
        results["cascade"] = cascade
        results["static_selection"] = {
            **cascade_summary(run_cascade(testset_model.stages, x, confidence_kind=kind, batch_size=256,
                                          ensemble_decay=t_decay), y, n_classes, levels),
            "ensemble_decay": t_decay, "thresholds": [s.threshold for s in testset_model.stages[:-1]]}
        exits = arrays(main_model.stages, x, y, decay)
        results["each_exit"], results["oracle"] = exits["exits"], exits["oracle"]
        results["each_exit_alone"] = all_exit_figures(main_model.stages, x, y, kind)["exits"]  # no ensemble
        curve = curve_of(main_model.stages, decay, exits)
        curve_static = curve_of(testset_model.stages, t_decay, arrays(testset_model.stages, x, y, t_decay))
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
        curve_two_cnn = fitted_curve(baseline_arrays(plain, calib.images, yc), baseline_arrays(plain, test.images, y),
                                     grid=grid)
        recorded = routing_candidates(args.models, costs, main_model.stages)
        scored = candidate_correct(main_model.stages, x, y, kind, recorded, decay=decay)
        results["candidate_exits"] = candidate_exits(scored)
        results["routing"] = routing_table(main_model.stages, to_numpy(routed.choices), recorded,
                                           results["candidate_exits"], routing_oracle(scored))
        for name in ("largest_candidate_static", "smallest_candidate_static", "space_largest_static",
                     "space_smallest_static", "default_static"):
            stages = static_stages(main_model.stages, costs, name.removesuffix("_static"))
            out = run_cascade(stages, x, confidence_kind=kind, batch_size=256)
            statics[name] = (stages, {"accuracy": float((to_numpy(out.pred) == y).mean()),
                                      "mean_macs": float(out.macs.float().mean()),
                                      "paths": [s.candidates[0].key() for s in stages]})
            results[name] = statics[name][1]
        timing = {"cascade": time_cascade(main_model.stages, x, kind, batch1_images=args.batch1_images, big_batch=256,
                                          decay=decay),
                  "largest_candidate_static": time_cascade(statics["largest_candidate_static"][0], x, kind,
                                                           batch1_images=args.batch1_images, big_batch=256)}
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
        results["budget_curves"] = {"cascade": curve, "static_selection": curve_static, "fixed_cascade": curve_fixed,
                                    "two_cnn_cascade": curve_two_cnn}
        results["epoch_budget"] = {"baselines": BaselineConfig.from_dict(params.get("baselines")).epochs,
                                   "modules": [module_train_config(params, key, 0).epochs for key in params["modules"]]}
        results["targets"] = target_checks(results)
        write_json(args.metrics, results)
        if args.headline is not None:
            write_json(args.headline, headline(results))
        with atomic_path(args.plots, is_dir=True) as tmp:
            curves = {"cascade (selected routing)": curve, "static selection (claim 8)": curve_static,
                      "fixed cascade (default paths)": curve_fixed, "two plain CNNs": curve_two_cnn}
            pd.concat([pd.DataFrame([{**r, "thresholds": " ".join(f"{t:.4f}" for t in r["thresholds"])}
                                     for r in rows]).assign(model=name) for name, rows in curves.items()]).to_csv(
                tmp / "budget_curve.csv", index=False)
            pd.DataFrame(results["each_exit"]).to_csv(tmp / "anytime.csv", index=False)
            b = results["baselines"]
            points = {"cascade (calibrated)": cascade, "fixed cascade (calibrated)": b["fixed_cascade"],
                      "fixed cascade at the cascade's MACs": b["fixed_cascade_at_cascade_macs"],
                      "two plain CNNs (calibrated)": b["two_cnn_cascade"], "plain small CNN": b["plain_small"],
                      "plain large CNN": b["plain_large"], "cascade's paths, no exits": big,
                      "oracle": exits["oracle"]}
            budget_plot(tmp / "budget_curve.png", curves, points)
            anytime_plot(tmp / "anytime.png", results["each_exit"])
            confusion_plot(tmp / "confusion.png", np.array(cascade["confusion"]), meta.classes)
        run.log_metrics({"test_accuracy": cascade["accuracy"], "test_mean_macs": cascade["mean_macs"],
                         "static_selection_accuracy": results["static_selection"]["accuracy"],
                         "largest_candidate_accuracy": big["accuracy"], "oracle_mean_macs": exits["oracle"]["mean_macs"],
                         **{f"vs_largest_candidate_{k}": v for k, v in results["vs_largest_candidate"].items()}})
        run.log_artifact(args.metrics)
        run.log_artifact(args.plots, "plots")
    print(comparison_table(results))
    v = results["vs_largest_candidate"]
    print(f"evaluate: cascade {cascade['accuracy']:.4f} at {cascade['mean_macs']:,.0f} MACs (exits "
          f"{cascade['exit_share']}); its paths without exits {big['accuracy']:.4f} at {big['mean_macs']:,.0f}; "
          f"static selection {results['static_selection']['accuracy']:.4f} at "
          f"{results['static_selection']['mean_macs']:,.0f}; oracle {exits['oracle']['mean_macs']:,.0f} MACs; "
          f"MACs share {v['macs_share']:.3f}, speed-up {v['throughput_speedup_b256']:.2f}x vs MACs ratio "
          f"{v['macs_ratio']:.2f}x" + (" (timing too noisy to read: the machine was busy; headline speedup "
                                       "left out)" if v["timing_noisy"] else ""))


if __name__ == "__main__":
    raise SystemExit(main())
