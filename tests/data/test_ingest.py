"""The ingest stage on small sources: every class must reach every split (refused, named, otherwise),
bad sources leave no output, and the outputs are byte-for-byte deterministic (so the stage can re-run
on every `dvc repro` without invalidating anything downstream when the data did not change)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pipeline.config import load_params
from pipeline.data.sources import DataError, load_idx_dir, load_imagefolder
from pipeline.data.splits import SPLITS, SplitPlan, make_splits
from stages import ingest
from tests.data.test_sources import make_idx_dir, write_idx

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


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for the module's stage runs (creating one per test is slow)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'm.db'}"


def run_ingest(tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch, tag: str,
               **data: object) -> tuple[int, Path]:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    params = load_params("params.yaml")
    params["data"].update(data)
    params_path = tmp_path / f"params-{tag}.yaml"
    params_path.write_text(yaml.safe_dump(params))
    out = tmp_path / f"prepared-{tag}"
    metrics = tmp_path / f"{tag}.json"
    status = ingest.main(["--params", str(params_path), "--out", str(out), "--metrics", str(metrics)])
    return status, out


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


# ------------------------------------------------------------------------------- class coverage


def test_minimum_class_size_follows_the_split_rule():
    """The minimum is what make_splits needs: one image fewer leaves a split without the class."""
    for own_test, expected in ((False, 19), (True, 15)):  # defaults: test 0.2 (if carved), val 0.1, route 0.5
        need = ingest.minimum_class_size(DEFAULT_PLAN, own_test=own_test)
        assert need == expected
        test = 1 if own_test else None
        assert all(ingest._one_class_split_sizes(need, test, DEFAULT_PLAN).values())
        assert not all(ingest._one_class_split_sizes(need - 1, test, DEFAULT_PLAN).values())


def test_single_image_class_is_refused_with_its_count(tmp_path):
    """A one-image class used to pass ingest, validate and grade with 0 training images."""
    data = load_imagefolder(image_folder(tmp_path / "imgs", {"a": 30, "b": 30, "lonely": 1}), 1, 8)
    with pytest.raises(DataError) as err:
        ingest.check_class_coverage(data, DEFAULT_PLAN)
    message = str(err.value)
    assert message.startswith(f"1 class of imagefolder:{tmp_path / 'imgs'} too small to appear in every "
                              "split (train, route, calib, test): class 'lonely' (label 2) has 1 image, none "
                              "in train, route, calib.")
    assert "a class needs at least 19 images" in message and "'a'" not in message


def test_class_at_the_minimum_passes_and_one_below_is_refused(tmp_path):
    for n, ok in ((19, True), (18, False)):
        data = load_imagefolder(image_folder(tmp_path / f"imgs{n}", {"a": 40, "b": n}), 1, 8)
        if ok:
            ingest.check_class_coverage(data, DEFAULT_PLAN)
            splits = make_splits(data, DEFAULT_PLAN)
            ingest.check_class_coverage(data, DEFAULT_PLAN, splits)
            assert all((splits[name].labels == 1).any() for name in SPLITS)
        else:
            with pytest.raises(DataError, match="class 'b' \\(label 1\\) has 18 images, none in calib"):
                ingest.check_class_coverage(data, DEFAULT_PLAN)


def test_idx_class_missing_from_the_test_file_is_refused(tmp_path):
    make_idx_dir(tmp_path, n_train=60, n_test=10, n_classes=3)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", (np.arange(10) % 2).astype(np.uint8))  # no class 2
    with pytest.raises(DataError, match="class '2' \\(label 2\\) has 20 training and 0 test images, "
                                        "none in test"):
        ingest.check_class_coverage(load_idx_dir(tmp_path), DEFAULT_PLAN)


def test_idx_gap_in_the_labels_is_an_empty_class(tmp_path):
    """Labels {0, 1, 5}: classes 2..4 of the set 0..5 have no image, each named."""
    make_idx_dir(tmp_path, n_train=60, n_test=12, n_classes=3)
    for prefix, n in (("train", 60), ("t10k", 12)):
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.array([0, 1, 5] * (n // 3), np.uint8))
    with pytest.raises(DataError, match="3 classes .*class '2' \\(label 2\\) has 0 training and 0 test "
                                        "images, none in train, route, calib, test; class '3'.*class '4'"):
        ingest.check_class_coverage(load_idx_dir(tmp_path), DEFAULT_PLAN)


def test_caps_that_thin_a_class_out_of_a_split_are_caught(tmp_path):
    data = load_imagefolder(image_folder(tmp_path / "imgs", {"a": 200, "b": 20}), 1, 8)
    ingest.check_class_coverage(data, DEFAULT_PLAN)  # the source itself is fine
    plan = SplitPlan(0.1, 0.5, 0.2, max_train=100, max_test=None, seed=0)  # b keeps 9 of 20
    splits = make_splits(data, plan)
    with pytest.raises(DataError, match="class 'b' .*has 20 images, none in calib.*under the cap "
                                        "data.max_train 100"):
        ingest.check_class_coverage(data, plan, splits)


def test_stage_refuses_a_small_class_and_writes_nothing(tmp_path, store, monkeypatch, capsys):
    root = image_folder(tmp_path / "imgs", {"a": 30, "b": 30, "lonely": 1})
    status, out = run_ingest(tmp_path, store, monkeypatch, "small", source=f"imagefolder:{root}",
                             image_size=8)
    errors = error_lines(capsys)
    assert status == 1 and len(errors) == 1
    assert "class 'lonely' (label 2) has 1 image, none in train, route, calib" in errors[0]
    assert not out.exists() and not (tmp_path / "small.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".prepared")]


def test_stage_refuses_an_idx_label_outside_the_class_set(tmp_path, store, monkeypatch, capsys):
    (tmp_path / "idx").mkdir()
    make_idx_dir(tmp_path / "idx", n_train=60, n_test=30, label_override=200)
    status, out = run_ingest(tmp_path, store, monkeypatch, "idx", source=f"idx:{tmp_path / 'idx'}",
                             image_size=6)
    errors = error_lines(capsys)
    assert status == 1 and len(errors) == 1
    labels_file = tmp_path / "idx" / "train-labels-idx1-ubyte.gz"
    assert errors[0].startswith(f"error: IDX file {labels_file}: 1 labels outside the class set 0..9, "
                                "e.g. index 3 has label 200")
    assert not out.exists() and not (tmp_path / "idx.json").exists()


def test_stage_refuses_a_nested_class_folder(tmp_path, store, monkeypatch, capsys):
    root = image_folder(tmp_path / "imgs", {"cars": 20, "animals/cats": 20, "animals/dogs": 20})
    status, out = run_ingest(tmp_path, store, monkeypatch, "nested", source=f"imagefolder:{root}",
                             image_size=8)
    errors = error_lines(capsys)
    assert status == 1 and len(errors) == 1
    nested = root / "animals"
    assert errors[0].startswith(f"error: class folder {nested} holds a sub-folder {nested / 'cats'}")
    assert not out.exists()


# -------------------------------------------------------------------------------- determinism


def test_outputs_are_byte_identical_on_rerun_and_follow_the_content(tmp_path, store, monkeypatch, capsys):
    """Two runs on the same folder give the same bytes (zip entries carry a fixed date, meta.json a
    fixed key order); changing one image changes the content hash of the split holding it, only."""
    root = image_folder(tmp_path / "imgs", {"cat": 25, "dog": 25, "fox": 25})
    source = f"imagefolder:{root}"
    names = [f"{name}.npz" for name in SPLITS] + ["meta.json"]
    runs = []
    for tag in ("first", "second"):
        status, out = run_ingest(tmp_path, store, monkeypatch, tag, source=source, image_size=8)
        assert status == 0, capsys.readouterr().err
        runs.append({name: (out / name).read_bytes() for name in names})
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for name in names:
        assert runs[0][name] == runs[1][name], f"{name} differs between two runs on the same data"
    for name in SPLITS:
        with zipfile.ZipFile(out / f"{name}.npz") as z:
            assert {info.date_time for info in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}

    meta = json.loads(runs[0]["meta.json"])
    changed_id = "dog/007.png"
    holder = next(name for name in SPLITS if changed_id in set(np.load(out / f"{name}.npz")["ids"]))
    Image.fromarray(np.full((8, 8), 17, np.uint8)).save(root / changed_id)
    status, out = run_ingest(tmp_path, store, monkeypatch, "changed", source=source, image_size=8)
    assert status == 0, capsys.readouterr().err
    after = json.loads((out / "meta.json").read_text())
    for name in SPLITS:
        same = meta["splits"][name]["images_sha256"] == after["splits"][name]["images_sha256"]
        assert same == (name != holder), name
        assert meta["splits"][name]["labels_sha256"] == after["splits"][name]["labels_sha256"]
        assert ((out / f"{name}.npz").read_bytes() == runs[0][f"{name}.npz"]) == (name != holder), name
