"""Fit one exit threshold per module but the last on the `calib` split: least average MACs with
accuracy within `delta` of sending every image to the last exit (or, in budget mode, the best
accuracy with average MACs at most the budget). Writes the deployable cascade (model directory)
for the selected routing and, as baselines, for static calib-set selection (claim 8) and for the
fixed cascade (every supernet on its default path, no predictor), all calibrated by the same rule;
and the fixed cascade once more in budget mode, held to the selected cascade's mean MACs on calib
(the "at equal MACs" comparison of issue 9).
What ships (`--out`) is decided here, on the same held-out images, before test is read: the calibrated
cascade, unless one of the run's plain CNNs (`--baselines`) reads more than one standard error higher
at <= 1.1x its MACs; then that plain CNN ships alone in the cascade's model format, and the calibrated
cascade is what `metrics` records under `selected` (evaluate rebuilds it from there).
Each also gets its exit ensemble: for every decay in `calibrate.ensemble_decays` the thresholds are
fitted with exits answering by the decay-weighted mean of their and the earlier exits' log-probabilities
(free: an image at exit k has passed exits 1..k-1), and the decay whose cascade is best on calib is kept."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from pipeline.device import ComputeConfig, autocast, stages_to
from pipeline.evaluation.dominance import held_out_choice
from pipeline.evaluation.two_cnn import evaluate_baselines
from pipeline.io import atomic_path, load_held_out, read_json, write_json
from pipeline.models.profile import CostModel
from pipeline.params.config import TrackingConfig, section
from pipeline.registry.tracking import stage_run
from pipeline.routing.assemble import load_stages
from pipeline.routing.calibration import reach_line
from pipeline.routing.fit import exit_outputs, fit_best_ensemble, held_out_points
from pipeline.routing.package import CascadeMeta, packaged, plain_packaged, save_cascade
from pipeline.routing.recognize import preprocess
from pipeline.train.baselines import LARGE, SMALL, load_baselines
from stages.common import cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("calibrate", __doc__)
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON")
    p.add_argument("--models", type=Path, required=True, help="directory holding m1..mK module directories")
    p.add_argument("--out", type=Path, required=True, help="model directory of the calibrated cascade")
    p.add_argument("--out-testset", type=Path, required=True,
                   help="model directory of the calib-set-selection baseline")
    p.add_argument("--out-fixed", type=Path, required=True,
                   help="model directory of the fixed-path baseline (every supernet on its default path)")
    p.add_argument("--out-fixed-at-macs", type=Path, required=True,
                   help="model directory of the fixed-path baseline calibrated in budget mode at the "
                        "selected cascade's mean MACs on calib (the comparison at equal MACs)")
    p.add_argument("--baselines", type=Path, required=True,
                   help="the run's plain CNNs (written by the baselines stage): one ships instead of the "
                        "cascade when the held-out images say it is better at about its cost")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    p.add_argument("--plots", type=Path, required=True, help="plots directory (the threshold sweep)")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg = {"mode": "delta", "delta": 0.003, "budget_macs": None, "grid": 50, "reference": "best",
           "ensemble_decays": [0.0], "bound_z": 0.0, "held_out": "calib", **section(params, "calibrate")}
    # every value was checked with the params file (pipeline.params.schema: CALIBRATE and its rules)
    kind = (params.get("model") or {}).get("confidence", "maxprob")
    compute = ComputeConfig.from_params(params)
    device = compute.resolve()  # the weights saved are CPU copies (save_cascade)
    costs = CostModel(read_json(args.profile))
    meta = read_json(args.data / "meta.json")
    calib = load_held_out(args.data, cfg["held_out"])  # route + calib by default
    plain = load_baselines(args.baselines)
    results, packages = {}, {}
    with stage_run("calibrate", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"calibrate": cfg, "confidence": kind}) as run:
        fixed_outputs = None
        routings = (("selected", args.out), ("testset", args.out_testset), ("default", args.out_fixed))
        for routing, out in routings:
            stages, infos = load_stages(args.models, costs, routing=routing)
            stages = stages_to(stages, device)
            cmeta = CascadeMeta(classes=tuple(meta["classes"]), image_shape=tuple(meta["image_shape"]),
                                mean=infos[0].mean, std=infos[0].std, confidence_kind=kind)
            x, y = preprocess(calib.images, cmeta).to(device), torch.from_numpy(calib.labels)
            with autocast(device, compute.precision):
                logits, cum = exit_outputs(stages, x, kind)
            results[routing] = fit_best_ensemble(logits, cum, y, cfg, kind)
            points = held_out_points(logits, cum, y, results[routing], cfg, kind)  # docs/DESIGN.md 'Serving'
            packages[routing] = (out, *packaged(stages, cmeta, results[routing], routing, cfg, params, points))
            if routing == "default":
                fixed_outputs = (stages, cmeta, logits, cum, y)
        # The fixed cascade held to the selected cascade's cost on calib: its best exit rule within that
        # budget, so the two can be compared at equal MACs rather than at each one's own operating point.
        # Where routing costs less than the fixed cascade can reach (module 1's static path alone costs
        # more), its least-MACs setting instead, recorded with budget_met false.
        stages, cmeta, logits, cum, y = fixed_outputs
        budget_cfg = {**cfg, "mode": "budget", "budget_macs": results["selected"]["mean_macs"]}
        results["default_at_cascade_macs"] = fit_best_ensemble(logits, cum, y, budget_cfg, kind, least_if_none=True)
        packages["default_at_cascade_macs"] = (
            args.out_fixed_at_macs, *packaged(stages, cmeta, results["default_at_cascade_macs"], "default",
                                              budget_cfg, params))
        plains = {name: figures for name, figures in evaluate_baselines(plain, calib.images, calib.labels).items()
                  if name in (SMALL, LARGE)}
        shipped = held_out_choice(results["selected"], plains, len(calib))
        if shipped["model"] != "cascade":
            net, macs = plain.by_name(shipped["model"])
            cmeta = CascadeMeta(tuple(meta["classes"]), tuple(meta["image_shape"]), plain.meta.mean,
                                plain.meta.std, kind)
            info = {"routing": shipped["model"], "shipped": shipped,
                    "params": {"baselines": params.get("baselines") or {}}}
            packages["selected"] = (args.out, *plain_packaged(net, macs, cmeta, info))
        for out, stages, cmeta in packages.values():
            save_cascade(out, stages, cmeta)
        metrics = {routing: {k: v for k, v in res.items() if k != "sweep"}
                   for routing, res in results.items()}
        metrics["shipped"] = shipped
        write_json(args.metrics, metrics)
        with atomic_path(args.plots, is_dir=True) as tmp:
            rows = [{"routing": routing, "accuracy": r["accuracy"], "mean_macs": r["mean_macs"],
                     "feasible": r.get("feasible", True),
                     "thresholds": " ".join(f"{t:.4f}" for t in r["thresholds"])}
                    for routing, res in results.items() for r in res["sweep"]]
            pd.DataFrame(rows).to_csv(tmp / "sweep.csv", index=False)
        for routing, res in results.items():
            run.log_metrics({f"{routing}_calib_accuracy": res["accuracy"],
                             f"{routing}_calib_mean_macs": res["mean_macs"],
                             f"{routing}_last_exit_accuracy": res["last_exit_accuracy"]})
        run.log_artifact(args.metrics)
    for routing, res in results.items():
        res = metrics[routing]
        print(f"calibrate ({routing}): exit ensemble decay {res['ensemble_decay']:g}, "
              f"thresholds {[round(t, 4) for t in res['thresholds']]} -> calib accuracy "
              f"{res['accuracy']:.4f} (last exit {res['last_exit_accuracy']:.4f}) "
              f"at {res['mean_macs']:,.0f} MACs "
              f"(last exit {res['last_exit_mean_macs']:,.0f}); exits {res['exit_counts']}; "
              f"{reach_line(res['reach'], res['min_reach'], res['min_reach_met'])}")
    print(f"calibrate: {shipped['reason']}")



if __name__ == "__main__":
    raise SystemExit(main())
