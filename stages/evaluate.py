"""Evaluate the calibrated cascade on the test split (the only stage that reads it) against its
baselines, in one run: each exit alone, the cascade's own paths without exits (the largest and the
smallest of each module's routing candidates), its static twin (every supernet on its static choice
instead of a predictor, calibrated the same way), the fixed cascade, and the oracle. Every operating
point and every budget curve has its thresholds fitted on the held-out images (`calibrate.held_out`) and
read on test. Reports accuracy, average MACs, latency at batch 1 and throughput at batch 256, exits per
difficulty level, per-class accuracy and the confusion matrix; plots the budget and anytime curves; ends
with routing's verdict per supernet. When calibrate shipped a plain CNN instead of the cascade, the
cascade is rebuilt from the modules and calibrate's fit, and the dominance verdict is the shipped
model's. The workflow: pipeline.workflows.evaluate."""

from __future__ import annotations

from pathlib import Path

from pipeline.device import ComputeConfig
from pipeline.evaluation.suite import headline, write_evaluation_plots
from pipeline.io import write_json
from pipeline.models.config import ModelConfig
from pipeline.params.config import CalibrateConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.train.baselines import BaselineConfig
from pipeline.workflows.evaluate import EvaluateInputs, evaluate_models
from stages.common import cli, params_of, parser

INPUTS = {"data": "directory written by ingest", "graded": "directory written by grade (grading model)",
          "profile": "cost model JSON",
          "model": "the shipped model: the calibrated cascade, or the plain CNN calibrate chose instead",
          "calibration": "calibrate's metrics JSON: what shipped and the cascade's fit",
          "model-testset": "static-selection cascade: every supernet on its static choice",
          "model-fixed": "fixed-path cascade (supernets on their default path, no predictors)",
          "model-fixed-at-macs": "the fixed-path cascade calibrated at the selected cascade's mean MACs",
          "models": "trained modules directory (models/modules): each module's routing candidates",
          "baselines": "plain CNN baselines (written by the baselines stage)"}


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("evaluate", __doc__)
    for name, text in INPUTS.items():
        p.add_argument(f"--{name}", type=Path, required=True, help=text)
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    p.add_argument("--headline", type=Path, default=None,
                   help="small JSON of the headline figures (dvc.yaml's one DVC metrics file)")
    p.add_argument("--plots", type=Path, required=True, help="plots directory")
    p.add_argument("--batch1-images", type=int, default=300, help="images timed one by one (default 300)")
    args = p.parse_args(argv)
    params = params_of(args)
    inputs = EvaluateInputs(*(getattr(args, name.replace("-", "_")) for name in INPUTS))
    with stage_run("evaluate", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"model": str(args.model)}) as run:
        out = evaluate_models(inputs, CalibrateConfig.from_params(params), BaselineConfig.from_params(params),
                              ComputeConfig.from_params(params), ModelConfig.from_params(params).names,
                              args.batch1_images)
        write_json(args.metrics, out.results)
        if args.headline is not None:
            write_json(args.headline, headline(out.results))
        write_evaluation_plots(args.plots, out.results, out.curves, out.classes)
        run.log_metrics(out.run_metrics())
        run.log_artifact(args.metrics)
        run.log_artifact(args.plots, "plots")
    print("\n".join(out.lines()))


if __name__ == "__main__":
    raise SystemExit(main())
