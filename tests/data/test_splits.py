import numpy as np

from pipeline.data.sources import load_digits
from pipeline.data.splits import SplitPlan, make_splits, split_meta

PLAN = SplitPlan(val_fraction=0.2, route_fraction=0.5, test_fraction=0.2, max_train=None, max_test=None, seed=3)


def test_splits_are_disjoint_stratified_and_seeded():
    data = load_digits(8)
    splits = make_splits(data, PLAN)
    ids = [set(s.ids) for s in splits.values()]
    assert sum(len(i) for i in ids) == len(data.train) == len(set().union(*ids))
    for split in splits.values():
        shares = np.bincount(split.labels, minlength=10) / len(split)
        assert np.abs(shares - 0.1).max() < 0.05
    again = make_splits(data, PLAN)
    for name in splits:
        assert np.array_equal(splits[name].ids, again[name].ids)


def test_cap_limits_training_images():
    data = load_digits(8)
    plan = SplitPlan(0.2, 0.5, 0.2, max_train=500, max_test=None, seed=0)
    splits = make_splits(data, plan)
    assert sum(len(splits[n]) for n in ("train", "route", "calib", "test")) == 500


def test_meta_counts_and_hashes():
    data = load_digits(8)
    splits = make_splits(data, PLAN)
    meta = split_meta(splits, data.classes, data.source)
    assert meta["splits"]["train"]["count"] == len(splits["train"])
    assert sum(meta["splits"]["calib"]["class_counts"]) == len(splits["calib"])
    assert len(meta["splits"]["test"]["images_sha256"]) == 64
