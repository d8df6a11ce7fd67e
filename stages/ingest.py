"""Read the configured image source, split it (train / route / calib / test, stratified and seeded)
and write uint8 arrays with stable ids, the class names and a meta file with counts and hashes.

Every class must reach every split: a class too small for that is refused, named with its counts,
before anything is written. The outputs are a function of the source and the params only (no
timestamps; zip entries dated 1980-01-01), so re-running on unchanged data gives identical bytes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.config import DataConfig, TrackingConfig
from pipeline.data.sources import DEFAULT_MAX_PIXELS, DataError, RawDataset, load_source
from pipeline.data.splits import SPLITS, SplitPlan, make_splits, split_meta
from pipeline.io import Split, atomic_path, save_split, write_json
from pipeline.tracking import stage_run
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
                   params={"data": params["data"], "seed": cfg.seed}) as run:
        data = load_source(cfg.source, channels=cfg.channels, image_size=cfg.image_size,
                           max_pixels=params["data"].get("max_pixels", DEFAULT_MAX_PIXELS))  # schema-checked
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
        write_json(args.metrics, metrics)
        run.log_metrics(metrics)
        run.log_artifact(args.out / "meta.json")
    print(f"ingest: {data.source} -> {args.out} " + ", ".join(f"{k}={v}" for k, v in metrics.items()))


def _one_class_split_sizes(n_train: int, n_test: int | None, plan: SplitPlan) -> dict[str, int]:
    """How many images each split gets of a class with ``n_train`` images in the source's training part
    (and ``n_test`` in its test part; None: the source has none), caps aside. Stratified splitting
    treats every class alike, so this splits such a class with :func:`make_splits` itself (beside a
    large filler class, so that no carve is left empty) and counts it."""
    filler = 1000

    def part(name: str, n: int) -> Split:
        labels = np.r_[np.zeros(n, np.int64), np.ones(filler, np.int64)]
        ids = np.arange(len(labels)).astype(str)
        return Split(name, np.zeros((len(labels), 1, 1, 1), np.uint8), labels, ids)

    test = None if n_test is None else part("test", n_test)
    splits = make_splits(RawDataset(part("train", n_train), test, ("probe", "filler"), "size probe"),
                         replace(plan, max_train=None, max_test=None))
    return {name: int(np.count_nonzero(splits[name].labels == 0)) for name in SPLITS}


def minimum_class_size(plan: SplitPlan, *, own_test: bool, limit: int = 20_000) -> int | None:
    """The fewest images a class needs in the source's training part to reach train, route and calib
    (and test, when the source has no test part of its own) under ``plan``'s fractions, caps aside;
    None if no size up to ``limit`` does."""
    for n in range(1, limit + 1):
        if all(_one_class_split_sizes(n, 1 if own_test else None, plan).values()):
            return n
    return None


def check_class_coverage(data: RawDataset, plan: SplitPlan, splits: dict[str, Split] | None = None) -> None:
    """Every class of ``data.classes`` must have at least one image in every split: the stratified split
    gives a class with too few images to only some splits, and training or calibration would silently
    never see it. Without ``splits``, each class's counts in the source are split as the fractions say
    (before the real split); with them, the splits as made (the caps ``max_train``/``max_test`` can thin
    a class further). A DataError names each short class, its counts and the splits it misses."""
    n_classes = len(data.classes)
    own_test = data.test is not None
    in_train = np.bincount(data.train.labels, minlength=n_classes).tolist()
    in_test = np.bincount(data.test.labels, minlength=n_classes).tolist() if own_test else None
    missed: dict[int, list[str]] = {}
    for c in range(n_classes):
        if splits is not None:
            sizes = {name: int(np.count_nonzero(splits[name].labels == c)) for name in SPLITS}
        else:
            sizes = _one_class_split_sizes(in_train[c], None if in_test is None else in_test[c], plan)
        if not all(sizes.values()):
            missed[c] = [name for name in SPLITS if sizes[name] == 0]
    if not missed:
        return
    shown = []
    for c in list(missed)[:10]:
        counts = (f"{in_train[c]} image{'s' * (in_train[c] != 1)}" if in_test is None else
                  f"{in_train[c]} training and {in_test[c]} test image{'s' * (in_test[c] != 1)}")
        shown.append(f"class {data.classes[c]!r} (label {c}) has {counts}, none in {', '.join(missed[c])}")
    more = f"; and {len(missed) - 10} more" if len(missed) > 10 else ""
    fractions = (f"data.val_fraction {plan.val_fraction} and data.route_fraction {plan.route_fraction}"
                 if own_test else f"data.test_fraction {plan.test_fraction}, data.val_fraction "
                                  f"{plan.val_fraction} and data.route_fraction {plan.route_fraction}")
    need = minimum_class_size(plan, own_test=own_test)
    what = "training images and 1 test image" if own_test else "images"
    rule = f"a class needs {'more than 20000' if need is None else f'at least {need}'} {what}"
    limits = (("max_train", plan.max_train), ("max_test", plan.max_test))
    caps = [f"data.{key} {value}" for key, value in limits if value is not None]
    cap_note = f", more under the cap{'s' * (len(caps) > 1)} {' and '.join(caps)}" if caps else ""
    raise DataError(f"{len(missed)} class{'es' * (len(missed) > 1)} of {data.source} too small to appear in "
                    f"every split ({', '.join(SPLITS)}): " + "; ".join(shown) + more +
                    f". With {fractions}, {rule}{cap_note}")


if __name__ == "__main__":
    raise SystemExit(main())
