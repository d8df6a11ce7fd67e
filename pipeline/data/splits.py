"""Stratified, seeded splits: train / route / calib (carved from the training data) and test."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.data.sources import RawDataset
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
