"""Read the configured image source, split it (train / route / calib / test, stratified and seeded)
and write uint8 arrays with stable ids, the class names and a meta file with counts and hashes.

Every class must reach every split: a class too small for that is refused, named with its counts,
before anything is written. The outputs are a function of the source and the params only (no
timestamps; zip entries dated 1980-01-01), so re-running on unchanged data gives identical bytes."""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.data.input_shape import resolve_input
from pipeline.data.sources import DataError, load_source, skipped_note
from pipeline.data.splits import SplitPlan, check_class_coverage, make_splits, split_meta
from pipeline.io import atomic_path, save_split, write_json
from pipeline.params.config import DataConfig, ParamsRecord, TrackingConfig
from pipeline.registry.tracking import stage_run
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
        max_pixels = cfg.max_pixels
        choice = resolve_input(cfg.source, cfg.image_size, cfg.channels, max_pixels)
        print(f"ingest: {choice.reason}", flush=True)
        data = load_source(cfg.source, channels=choice.channels, image_size=choice.image_size,
                           max_pixels=max_pixels)
        plan = SplitPlan(cfg.val_fraction, cfg.route_fraction, cfg.test_fraction, cfg.max_train, cfg.max_test,
                         cfg.seed)
        check_class_coverage(data, plan)  # before splitting: the fractions alone leave a class out
        try:
            splits = make_splits(data, plan)
        except ValueError as exc:  # only caps small enough to empty a whole carve get here
            raise DataError(f"data.max_train {plan.max_train} / data.max_test {plan.max_test} leave too few "
                            f"images of {data.source} to split: {exc}") from None
        check_class_coverage(data, plan, splits)  # after: the caps can thin a class out of a split
        meta = split_meta(splits, data.classes, data.source)
        with atomic_path(args.out, is_dir=True) as tmp:
            for split in splits.values():
                save_split(tmp / f"{split.name}.npz", split)
            write_json(tmp / "meta.json", meta)
        metrics = {f"{name}_count": len(s) for name, s in splits.items()}
        metrics["seconds"] = round(time.perf_counter() - started, 2)
        skipped = {} if data.skipped is None else {"skipped_count": len(data.skipped), "skipped": list(data.skipped)}
        write_json(args.metrics, {**metrics, **skipped, "input": choice.to_json()})
        run.log_metrics(metrics)
        run.set_tags({"input": choice.reason})
        run.log_artifact(args.out / "meta.json")
    print(f"ingest: {data.source} -> {args.out} " + ", ".join(f"{k}={v}" for k, v in metrics.items())
          + skipped_note(data.skipped, args.metrics))


if __name__ == "__main__":
    raise SystemExit(main())
