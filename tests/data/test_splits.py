"""Stratified, seeded splits and the class-coverage check: every class must reach every split
(refused, named with its counts, otherwise)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.data.sources import DataError, load_digits, load_idx_dir, load_imagefolder
from pipeline.data.splits import (
    SPLITS,
    SplitPlan,
    check_class_coverage,
    make_splits,
    minimum_class_size,
    one_class_split_sizes,
    split_meta,
)
from tests.data.test_sources import make_idx_dir, write_idx

PLAN = SplitPlan(val_fraction=0.2, route_fraction=0.5, test_fraction=0.2, max_train=None, max_test=None,
                 seed=3)
DEFAULT_PLAN = SplitPlan(val_fraction=0.1, route_fraction=0.5, test_fraction=0.2, max_train=None,
                         max_test=None, seed=0)  # params.yaml's fractions


def image_folder(root: Path, sizes: dict[str, int]) -> Path:
    """One class folder per entry, ``n`` distinct 8 x 8 grey PNGs in each."""
    for k, (name, n) in enumerate(sizes.items()):
        (root / name).mkdir(parents=True)
        for i in range(n):
            pixels = np.random.default_rng(1000 * k + i).integers(0, 256, (8, 8), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:03d}.png")
    return root


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


# ------------------------------------------------------------------------------- class coverage


def test_minimum_class_size_follows_the_split_rule():
    """The minimum is what make_splits needs: one image fewer leaves a split without the class."""
    for own_test, expected in ((False, 19), (True, 15)):  # defaults: test 0.2 (if carved), val 0.1, route 0.5
        need = minimum_class_size(DEFAULT_PLAN, own_test=own_test)
        assert need == expected
        test = 1 if own_test else None
        assert all(one_class_split_sizes(need, test, DEFAULT_PLAN).values())
        assert not all(one_class_split_sizes(need - 1, test, DEFAULT_PLAN).values())


def test_single_image_class_is_refused_with_its_count(tmp_path):
    """A one-image class used to pass ingest, validate and grade with 0 training images."""
    data = load_imagefolder(image_folder(tmp_path / "imgs", {"a": 30, "b": 30, "lonely": 1}), 1, 8)
    with pytest.raises(DataError) as err:
        check_class_coverage(data, DEFAULT_PLAN)
    message = str(err.value)
    assert message.startswith(f"1 class of imagefolder:{tmp_path / 'imgs'} too small to appear in every "
                              "split (train, route, calib, test): class 'lonely' (label 2) has 1 image, none "
                              "in train, route, calib.")
    assert "a class needs at least 19 images" in message and "'a'" not in message


def test_class_at_the_minimum_passes_and_one_below_is_refused(tmp_path):
    for n, ok in ((19, True), (18, False)):
        data = load_imagefolder(image_folder(tmp_path / f"imgs{n}", {"a": 40, "b": n}), 1, 8)
        if ok:
            check_class_coverage(data, DEFAULT_PLAN)
            splits = make_splits(data, DEFAULT_PLAN)
            check_class_coverage(data, DEFAULT_PLAN, splits)
            assert all((splits[name].labels == 1).any() for name in SPLITS)
        else:
            with pytest.raises(DataError, match="class 'b' \\(label 1\\) has 18 images, none in calib"):
                check_class_coverage(data, DEFAULT_PLAN)


def test_idx_class_missing_from_the_test_file_is_refused(tmp_path):
    make_idx_dir(tmp_path, n_train=60, n_test=10, n_classes=3)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", (np.arange(10) % 2).astype(np.uint8))  # no class 2
    with pytest.raises(DataError, match="class '2' \\(label 2\\) has 20 training and 0 test images, "
                                        "none in test"):
        check_class_coverage(load_idx_dir(tmp_path), DEFAULT_PLAN)


def test_idx_gap_in_the_labels_is_an_empty_class(tmp_path):
    """Labels {0, 1, 5}: classes 2..4 of the set 0..5 have no image, each named."""
    make_idx_dir(tmp_path, n_train=60, n_test=12, n_classes=3)
    for prefix, n in (("train", 60), ("t10k", 12)):
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.array([0, 1, 5] * (n // 3), np.uint8))
    with pytest.raises(DataError, match="3 classes .*class '2' \\(label 2\\) has 0 training and 0 test "
                                        "images, none in train, route, calib, test; class '3'.*class '4'"):
        check_class_coverage(load_idx_dir(tmp_path), DEFAULT_PLAN)


def test_caps_that_thin_a_class_out_of_a_split_are_caught(tmp_path):
    data = load_imagefolder(image_folder(tmp_path / "imgs", {"a": 200, "b": 20}), 1, 8)
    check_class_coverage(data, DEFAULT_PLAN)  # the source itself is fine
    plan = SplitPlan(0.1, 0.5, 0.2, max_train=100, max_test=None, seed=0)  # b keeps 9 of 20
    splits = make_splits(data, plan)
    with pytest.raises(DataError, match="class 'b' .*has 20 images, none in calib.*under the cap "
                                        "data.max_train 100"):
        check_class_coverage(data, plan, splits)
