"""Read the configured image source, split it (train / route / calib / test, stratified and seeded)
and write uint8 arrays with stable ids, the class names and a meta file with counts and hashes.

Every class must reach every split: a class too small for that is refused, named with its counts,
before anything is written. The outputs are a function of the source and the params only (no
timestamps; zip entries dated 1980-01-01), so re-running on unchanged data gives identical bytes."""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.data.sources import skipped_note
from pipeline.io import atomic_path, save_split, write_json
from pipeline.params.config import DataConfig, ParamsRecord, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.workflows.ingest import ingest_source
from stages.common import cli, params_of, parser


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("ingest", __doc__)
    p.add_argument("--out", type=Path, required=True, help="output directory of the split arrays")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg = DataConfig.from_params(params)
    started = time.perf_counter()
    with stage_run("ingest", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"data": ParamsRecord.from_params(params).of("data"), "seed": cfg.seed}) as run:
        result = ingest_source(cfg, on_choice=lambda choice: print(f"ingest: {choice.reason}", flush=True))
        with atomic_path(args.out, is_dir=True) as tmp:
            for split in result.splits.values():
                save_split(tmp / f"{split.name}.npz", split)
            write_json(tmp / "meta.json", result.meta)
        metrics = {**result.counts(), "seconds": round(time.perf_counter() - started, 2)}
        skipped = {} if result.skipped is None else {"skipped_count": len(result.skipped),
                                                     "skipped": list(result.skipped)}
        write_json(args.metrics, {**metrics, **skipped, "input": result.choice.to_json()})
        run.log_metrics(metrics)
        run.set_tags({"input": result.choice.reason})
        run.log_artifact(args.out / "meta.json")
    print(f"ingest: {result.source} -> {args.out} " + ", ".join(f"{k}={v}" for k, v in metrics.items())
          + skipped_note(result.skipped, args.metrics))


if __name__ == "__main__":
    raise SystemExit(main())
