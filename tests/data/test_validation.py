import numpy as np

from pipeline.data.sources import load_digits
from pipeline.data.splits import SplitPlan, make_splits, split_meta
from pipeline.data.validation import validate_splits
from pipeline.io import Split
from pipeline.params.config import ValidateConfig

CFG = ValidateConfig(class_share_tolerance=0.05, pixel_mean_min=1.0, pixel_mean_max=254.0, min_pixel_std=1.0,
                     max_duplicate_share=0.0)


def digits_splits():
    data = load_digits(8)
    splits = make_splits(data, SplitPlan(0.2, 0.5, 0.2, None, None, 0))
    return splits, split_meta(splits, data.classes, data.source)


def test_clean_data_passes_and_docs_are_built(tmp_path):
    splits, meta = digits_splits()
    results = validate_splits(splits, meta, CFG, docs_dir=tmp_path / "docs")
    assert all(r.success for r in results.values()), [r.failures for r in results.values()]
    assert (tmp_path / "docs" / "index.html").exists()


def test_failures_name_expectation_count_and_ids():
    splits, meta = digits_splits()
    test = splits["test"]
    labels = test.labels.copy()
    labels[:2] = 42  # outside the class set
    images = test.images.copy()
    images[5] = 0  # a blank image
    splits["test"] = Split("test", images, labels, test.ids)
    results = validate_splits(splits, meta, CFG)
    failures = " ".join(results["test"].failures)
    assert "expect_column_values_to_be_in_set(label)" in failures and "for 2 of" in failures
    assert str(test.ids[0]) in failures
    assert "expect_column_values_to_be_between(pixel_std)" in failures and str(test.ids[5]) in failures


def test_leak_between_splits_and_count_mismatch_are_caught():
    splits, meta = digits_splits()
    calib = splits["calib"]
    images = calib.images.copy()
    images[0] = splits["train"].images[0]  # the same picture in two splits
    splits["calib"] = Split("calib", images, calib.labels, calib.ids)
    meta["splits"]["route"]["count"] += 1
    results = validate_splits(splits, meta, CFG)
    assert not results["calib"].success and not results["train"].success
    assert any("in_other_split" in f for f in results["calib"].failures)
    assert any("expect_table_row_count_to_equal" in f for f in results["route"].failures)
    assert np.all([results[n].success for n in ("test",)])
