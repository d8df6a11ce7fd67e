"""The ingest stage on small sources: a class too small to reach every split is refused and nothing is
written (the check itself, ``check_class_coverage``, is tested in test_splits), bad sources leave no
output, and the outputs are byte-for-byte deterministic (so the stage can re-run on every `dvc repro`
without invalidating anything downstream when the data did not change)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from pipeline.data.splits import SPLITS
from pipeline.params.config import load_params
from stages import ingest
from tests.data.test_sources import make_idx_dir
from tests.data.test_splits import image_folder


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


# ------------------------------------------------------------------------------- stage errors


def test_stage_refuses_a_small_class_and_writes_nothing(tmp_path, store, monkeypatch, capsys):
    root = image_folder(tmp_path / "imgs", {"a": 30, "b": 30, "lonely": 1})
    status, out = run_ingest(tmp_path, store, monkeypatch, "small", source=f"imagefolder:{root}",
                             image_size=8)
    errors = error_lines(capsys)
    assert status == 4 and len(errors) == 1
    assert "class 'lonely' (label 2) has 1 image, none in train, route, calib" in errors[0]
    assert not out.exists() and not (tmp_path / "small.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".prepared")]


def test_stage_refuses_an_idx_label_outside_the_class_set(tmp_path, store, monkeypatch, capsys):
    (tmp_path / "idx").mkdir()
    make_idx_dir(tmp_path / "idx", n_train=60, n_test=30, label_override=200)
    status, out = run_ingest(tmp_path, store, monkeypatch, "idx", source=f"idx:{tmp_path / 'idx'}",
                             image_size=6)
    errors = error_lines(capsys)
    assert status == 4 and len(errors) == 1
    labels_file = tmp_path / "idx" / "train-labels-idx1-ubyte.gz"
    assert errors[0].startswith(f"error: IDX file {labels_file}: 1 labels outside the class set 0..9, "
                                "e.g. index 3 has label 200")
    assert not out.exists() and not (tmp_path / "idx.json").exists()


def test_stage_refuses_a_nested_class_folder(tmp_path, store, monkeypatch, capsys):
    root = image_folder(tmp_path / "imgs", {"cars": 20, "animals/cats": 20, "animals/dogs": 20})
    status, out = run_ingest(tmp_path, store, monkeypatch, "nested", source=f"imagefolder:{root}",
                             image_size=8)
    errors = error_lines(capsys)
    assert status == 4 and len(errors) == 1
    nested = root / "animals"
    assert errors[0].startswith(f"error: class folder {nested} holds a sub-folder {nested / 'cats'}")
    assert not out.exists()


def test_stage_names_every_skipped_file_in_its_line_and_metrics(tmp_path, store, monkeypatch, capsys):
    root = image_folder(tmp_path / "imgs", {"cat": 25, "dog": 25})
    Image.fromarray(np.full((8, 8), 90, np.uint8)).save(root / "dog" / "extra.webp", lossless=True)
    (root / "cat" / "notes.txt").write_text("x")
    (root / "dog" / ".DS_Store").write_bytes(b"\0")
    status, out = run_ingest(tmp_path, store, monkeypatch, "mixed", source=f"imagefolder:{root}", image_size=8)
    printed = capsys.readouterr().out.splitlines()[-1]
    assert status == 0
    assert printed.endswith("; skipped 2 (not images): cat/notes.txt, dog/.DS_Store")
    metrics = json.loads((tmp_path / "mixed.json").read_text())
    assert metrics["skipped_count"] == 2 and metrics["skipped"] == ["cat/notes.txt", "dog/.DS_Store"]
    read = sum(metrics[f"{name}_count"] for name in SPLITS)
    assert read == 51  # 50 PNGs and the WebP


def test_stage_refuses_an_undecodable_webp_by_name_and_writes_nothing(tmp_path, store, monkeypatch, capsys):
    root = image_folder(tmp_path / "imgs", {"cat": 25, "dog": 25})
    (root / "dog" / "broken.webp").write_bytes(b"RIFF\x10\x00\x00\x00WEBPVP8 ")
    status, out = run_ingest(tmp_path, store, monkeypatch, "broken", source=f"imagefolder:{root}", image_size=8)
    errors = error_lines(capsys)
    assert status != 0 and len(errors) == 1 and f"image file {root / 'dog' / 'broken.webp'}" in errors[0]
    assert not out.exists() and not (tmp_path / "broken.json").exists()


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
