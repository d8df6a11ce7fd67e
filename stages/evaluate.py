"""Evaluate the calibrated cascade on the test split (the only stage that reads it) against its
baselines, in one run: each exit alone, the cascade's own paths without exits (the largest and the
smallest of each module's routing candidates), its static twin (every supernet on its claim-8 static
choice instead of a predictor, calibrated the same way), the fixed cascade, and the oracle. Every
operating point and every budget curve has its thresholds fitted on `calib` and read on test. Reports
accuracy, average MACs, wall-clock latency at batch 1 and throughput at batch 256, exits per
difficulty level, per-class accuracy and the confusion matrix; plots the budget and anytime curves.
Each cascade runs with the exit ensemble its calibration chose (`ensemble_decay` in its manifest);
`each_exit_alone` gives every exit without it. Static paths have no exits, so no ensemble. Its last
lines are routing's verdict per supernet (served or not and why, how predictable the right candidate
is on route/calib, the oracle's headroom, the routed cascade against its static twin).
When calibrate shipped a plain CNN instead of the cascade (`--calibration`: its held-out choice),
`--model` holds that plain CNN: the cascade is rebuilt from the modules and calibrate's fit, every
figure above is still the cascade's, and the dominance verdict is the shipped model's."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.data.difficulty import hard_setting_applies
from pipeline.data.grader_store import GRADER_FILE, levels_of, load_grader
from pipeline.device import ComputeConfig, autocast, to_device
from pipeline.evaluation.figures import comparison_table
from pipeline.evaluation.routing_verdict import verdict_lines
from pipeline.evaluation.suite import evaluation_suite, headline, summary_line, write_evaluation_plots
from pipeline.io import load_held_out, load_split, read_json, write_json
from pipeline.models.profile import CostModel
from pipeline.params.config import TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.routing.assemble import calibrated_cascade
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import preprocess
from pipeline.train.baselines import BaselineConfig, load_baselines
from pipeline.train.outputs import epochs_trained
from stages.common import cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("evaluate", __doc__)
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--graded", type=Path, required=True, help="directory written by grade (grading model)")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON")
    p.add_argument("--model", type=Path, required=True,
                   help="the shipped model (model directory): the calibrated cascade, or the plain CNN "
                        "calibrate chose instead on held-out images")
    p.add_argument("--calibration", type=Path, required=True,
                   help="calibrate's metrics JSON: what shipped and the cascade's fit")
    p.add_argument("--model-testset", type=Path, required=True,
                   help="static-selection cascade: every supernet on its claim-8 static choice")
    p.add_argument("--model-fixed", type=Path, required=True,
                   help="fixed-path cascade (supernets on their default path, no predictors)")
    p.add_argument("--model-fixed-at-macs", type=Path, required=True,
                   help="the fixed-path cascade calibrated at the selected cascade's mean MACs on calib")
    p.add_argument("--models", type=Path, required=True,
                   help="trained modules directory (models/modules): each module's routing candidates")
    p.add_argument("--baselines", type=Path, required=True,
                   help="plain CNN baselines (written by the baselines stage)")
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
    held_out = str((params.get("calibrate") or {}).get("held_out", "calib"))  # schema-checked
    test, calib = load_split(args.data, "test"), load_held_out(args.data, held_out)  # curves fitted as calibrate fits
    grid = int((params.get("calibrate") or {}).get("grid", 50))
    main_model, testset_model = load_cascade(args.model, device), load_cascade(args.model_testset, device)
    calibration = read_json(args.calibration)
    shipped = (calibration.get("shipped") or {}).get("model", "cascade")  # no record: written before issue 37
    if shipped != "cascade":
        main_model = calibrated_cascade(args.models, costs, calibration["selected"], main_model, device)
    fixed_model, plain = load_cascade(args.model_fixed, device), load_baselines(args.baselines)
    fixed_at_macs = load_cascade(args.model_fixed_at_macs, device)
    to_device((plain.small, plain.large), device)
    meta = main_model.meta
    x, xc = preprocess(test.images, meta).to(device), preprocess(calib.images, meta).to(device)
    route_calib = tuple((preprocess(s.images, meta).to(device), s.labels)  # the routing verdict's AUC
                        for s in (load_split(args.data, "route"), load_split(args.data, "calib")))
    grader = load_grader(args.graded / GRADER_FILE)
    levels = levels_of(grader, test.images, test.labels, args.graded / "scores.csv")
    base_cfg, meta_json = BaselineConfig.from_dict(params.get("baselines")), read_json(args.data / "meta.json")
    hard = hard_setting_applies(base_cfg.min_steps_hard, args.graded, len(meta_json["classes"]))
    epoch_budget = {  # as trained: the step floor may have raised the configured epochs on small data
        "baselines": base_cfg.sized_to(meta_json["splits"]["train"]["count"], hard).epochs,
        "modules": [epochs_trained(args.models / key / "train") for key in params["modules"]]}
    torch.set_grad_enabled(False)
    with stage_run("evaluate", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"model": str(args.model)}) as run, autocast(device, compute.precision):
        results, curves = evaluation_suite(
            main_model, testset_model, fixed_model, fixed_at_macs, plain, test=test, calib=calib, x=x, xc=xc,
            levels=levels, costs=costs, models=args.models, grid=grid, batch1_images=args.batch1_images,
            epoch_budget=epoch_budget, predictability_splits=route_calib, shipped=shipped)
        write_json(args.metrics, results)
        if args.headline is not None:
            write_json(args.headline, headline(results))
        write_evaluation_plots(args.plots, results, curves, meta.classes)
        cascade, big = results["cascade"], results["largest_candidate_static"]
        vs = results["vs_largest_candidate"]
        run.log_metrics({"test_accuracy": cascade["accuracy"], "test_mean_macs": cascade["mean_macs"],
                         "static_selection_accuracy": results["static_selection"]["accuracy"],
                         "largest_candidate_accuracy": big["accuracy"],
                         "oracle_mean_macs": results["oracle"]["mean_macs"],
                         **{f"vs_largest_candidate_{k}": v for k, v in vs.items()}})
        run.log_artifact(args.metrics)
        run.log_artifact(args.plots, "plots")
    print(comparison_table(results))
    print(summary_line(results))
    what = "cascade" if shipped == "cascade" else f"model ({shipped}, chosen over the cascade on held-out images)"
    print(f"evaluate: the shipped {what} is {results['shipped']['verdict']}")
    print("\n".join(verdict_lines(results)))


if __name__ == "__main__":
    raise SystemExit(main())
