"""Train the plain-CNN baselines on the whole `train` split: a small and a large single-exit CNN
(widths from `baselines`), and calibrate the two of them chained (small first) on the held-out images
by the cascade's own rule (`calibrate.delta`, `calibrate.grid`, `model.confidence`). Writes both nets
and their record to one model directory, and held-out metrics. Never reads the test split.
The workflow: pipeline.workflows.baselines."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from pipeline.device import ComputeConfig
from pipeline.io import atomic_path, write_json
from pipeline.params.config import CalibrateConfig, ConfidenceConfig, RunConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.train.baselines import LARGE, SMALL, BaselineConfig, save_baselines
from pipeline.workflows.baselines import train_baselines
from stages.common import cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("baselines", __doc__)
    p.add_argument("--data", type=Path, default=Path("data/prepared"), help="directory written by ingest")
    p.add_argument("--out", type=Path, default=Path("models/baselines"), help="model directory of the baselines")
    p.add_argument("--metrics", type=Path, default=Path("metrics/baselines.json"), help="metrics JSON")
    p.add_argument("--graded", type=Path, default=Path("data/graded"),
                   help="directory written by grade: its scores say whether the data is hard (min_steps_hard)")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg, cal = BaselineConfig.from_params(params), CalibrateConfig.from_params(params)
    seed, kind = RunConfig.from_params(params).seed, ConfidenceConfig.from_params(params).confidence
    run_params = {"baselines": asdict(cfg), "seed": seed, "confidence": kind,
                  "calibrate": {"delta": cal.delta, "grid": cal.grid, "bound_z": cal.bound_z, "held_out": cal.held_out}}
    with stage_run("baselines", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params=run_params) as run:
        def on_epoch(name: str, epoch: int, record: dict) -> None:
            run.log_metrics({f"{name}_{key}": v for key, v in record.items() if isinstance(v, int | float)}, step=epoch)
            print(f"baselines@{name} epoch {epoch}: loss {record['loss']:.4f} acc {record['train_acc']:.4f} "
                  f"{record['images_per_s']:.0f} img/s", flush=True)

        result = train_baselines(args.data, args.graded, cfg, cal, kind, seed, ComputeConfig.from_params(params),
                                 on_epoch=on_epoch)
        with atomic_path(args.out, is_dir=True) as tmp:
            save_baselines(tmp, result.nets[SMALL], result.nets[LARGE], result.record)
        write_json(args.metrics, result.metrics)
        run.log_metrics(result.run_metrics())
        run.log_artifact(args.metrics)
    print("\n".join(([result.note] if result.note else []) + result.lines()))


if __name__ == "__main__":
    raise SystemExit(main())
