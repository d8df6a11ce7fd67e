"""Stage CLIs on bad input: a clear one-line error naming the item, exit status 1, no output."""

from __future__ import annotations

import yaml

from pipeline.params.config import load_params
from stages import ingest


def write_params(tmp_path, **data_overrides):
    params = load_params("params.yaml")
    params["data"].update(data_overrides)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_out_of_range_param(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    params = write_params(tmp_path, val_fraction=1.5)
    out = tmp_path / "prepared"
    assert ingest.main(["--params", str(params), "--out", str(out), "--metrics", str(tmp_path / "m.json")]) == 3
    assert "data.val_fraction must be strictly between 0 and 1, got 1.5" in capsys.readouterr().err
    assert not out.exists()


def test_corrupt_source_leaves_no_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 5)
    (idx / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x00")
    params = write_params(tmp_path, source=f"idx:{idx}")
    out = tmp_path / "prepared"
    assert ingest.main(["--params", str(params), "--out", str(out), "--metrics", str(tmp_path / "m.json")]) == 4
    err = capsys.readouterr().err
    assert "train-images-idx3-ubyte" in err and "truncated header" in err
    assert not out.exists() and not (tmp_path / "m.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".prepared")] == []


def test_missing_params_key(tmp_path, capsys):
    params = load_params("params.yaml")
    del params["data"]["image_size"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(params))
    assert ingest.main(["--params", str(path), "--out", str(tmp_path / "o"), "--metrics", str(tmp_path / "m")]) == 3
    assert "data.image_size is missing" in capsys.readouterr().err
