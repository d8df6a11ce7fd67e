"""Fit one exit threshold per module but the last on the held-out images (`calibrate.held_out`): least
average MACs with accuracy within `delta` of the reference exit (or, in budget mode, the best accuracy
with average MACs at most the budget), for the selected routing and, as baselines, the static calib-set
selection and the fixed cascade (every supernet on its default path), all by the same rule; and the fixed
cascade once more in budget mode, held to the selected cascade's mean MACs (the comparison at equal MACs).
What ships (`--out`) is decided here, on the same held-out images, before test is read: the calibrated
cascade, unless one of the run's plain CNNs (`--baselines`) reads more than one standard error higher
at <= 1.1x its MACs. Each cascade keeps the exit-ensemble decay (`calibrate.ensemble_decays`) the rule
chooses. The workflow: pipeline.workflows.calibrate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.device import ComputeConfig
from pipeline.io import atomic_path, write_json
from pipeline.params.config import CalibrateConfig, ConfidenceConfig, ParamsRecord, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.routing.packaging import save_cascade
from pipeline.workflows.calibrate import BUDGET_TWIN, CalibrateInputs, calibrate_cascades
from stages.common import cli, params_of, parser

OUTS = {"selected": "out", "testset": "out_testset", "default": "out_fixed", BUDGET_TWIN: "out_fixed_at_macs"}


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("calibrate", __doc__)
    for flag, text in (("--data", "directory written by ingest"), ("--profile", "cost model JSON"),
                       ("--models", "directory holding m1..mK module directories"),
                       ("--out", "model directory of the shipped model (the calibrated cascade or a plain CNN)"),
                       ("--out-testset", "model directory of the calib-set-selection baseline"),
                       ("--out-fixed", "model directory of the fixed-path baseline (supernets on their default path)"),
                       ("--out-fixed-at-macs", "model directory of the fixed-path baseline calibrated in budget "
                                               "mode at the selected cascade's mean MACs"),
                       ("--baselines", "the run's plain CNNs (written by the baselines stage)"),
                       ("--metrics", "metrics JSON"), ("--plots", "plots directory (the threshold sweep)")):
        p.add_argument(flag, type=Path, required=True, help=text)
    args = p.parse_args(argv)
    params = params_of(args)
    cfg, kind = CalibrateConfig.from_params(params), ConfidenceConfig.from_params(params).confidence
    inputs = CalibrateInputs(args.data, args.profile, args.models, args.baselines)
    with stage_run("calibrate", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"calibrate": cfg.section(), "confidence": kind}) as run:
        result = calibrate_cascades(inputs, cfg, kind, ComputeConfig.from_params(params),
                                    ParamsRecord.from_params(params))
        for routing, (stages, meta) in result.packages.items():
            save_cascade(getattr(args, OUTS[routing]), stages, meta)
        write_json(args.metrics, result.metrics())
        with atomic_path(args.plots, is_dir=True) as tmp:
            pd.DataFrame(result.sweep_rows()).to_csv(tmp / "sweep.csv", index=False)
        run.log_metrics(result.run_metrics())
        run.log_artifact(args.metrics)
    print("\n".join(result.lines()))


if __name__ == "__main__":
    raise SystemExit(main())
