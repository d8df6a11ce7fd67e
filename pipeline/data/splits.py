"""Stratified, seeded splits: train / route / calib (carved from the training data) and test, and
the class-coverage check that every class reaches every split (:func:`check_class_coverage`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pipeline.data.sources import DataError, RawDataset
from pipeline.io import Split, array_sha256

SPLITS = ("train", "route", "calib", "test")


@dataclass(frozen=True)
class SplitPlan:
    val_fraction: float
    route_fraction: float  # share of the validation split that goes to `route`; the rest is `calib`
    test_fraction: float  # used only when the source has no test split of its own
    max_train: int | None  # cap on the source's training images (stratified), for quick runs
    max_test: int | None
    seed: int


def stratified_take(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a stratified sample of ``fraction`` of the items (at least one per class)."""
    taken = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        n = max(1, int(round(fraction * len(members))))
        taken.append(rng.permutation(members)[:n])
    return np.sort(np.concatenate(taken))


def _cap(split: Split, cap: int | None, rng: np.random.Generator) -> Split:
    if cap is None or cap >= len(split):
        return split
    return split.subset(stratified_take(split.labels, cap / len(split), rng))


def _carve(split: Split, fraction: float, rng: np.random.Generator, name: str) -> tuple[Split, Split]:
    taken = stratified_take(split.labels, fraction, rng)
    rest = np.setdiff1d(np.arange(len(split)), taken)
    return split.subset(rest), split.subset(taken, name)


def make_splits(data: RawDataset, plan: SplitPlan) -> dict[str, Split]:
    rng = np.random.default_rng(plan.seed)
    train = _cap(data.train, plan.max_train, rng)
    if data.test is None:
        train, test = _carve(train, plan.test_fraction, rng, "test")
    else:
        test = _cap(data.test, plan.max_test, rng)
    train, val = _carve(train, plan.val_fraction, rng, "val")
    calib, route = _carve(val, plan.route_fraction, rng, "route")
    return {
        "train": Split("train", train.images, train.labels, train.ids),
        "route": route,
        "calib": Split("calib", calib.images, calib.labels, calib.ids),
        "test": Split("test", test.images, test.labels, test.ids),
    }


def split_meta(splits: dict[str, Split], classes: tuple[str, ...], source: str) -> dict:
    """The meta file: shapes, counts per class and content hashes, which validation checks against."""
    first = splits["train"]
    return {
        "source": source,
        "classes": list(classes),
        "image_shape": list(first.images.shape[1:]),
        "splits": {
            name: {
                "count": len(s),
                "class_counts": np.bincount(s.labels, minlength=len(classes)).tolist(),
                "images_sha256": array_sha256(s.images),
                "labels_sha256": array_sha256(s.labels.astype(np.int64)),
            }
            for name, s in splits.items()
        },
    }


def one_class_split_sizes(n_train: int, n_test: int | None, plan: SplitPlan) -> dict[str, int]:
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
        if all(one_class_split_sizes(n, 1 if own_test else None, plan).values()):
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
            sizes = one_class_split_sizes(in_train[c], None if in_test is None else in_test[c], plan)
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
