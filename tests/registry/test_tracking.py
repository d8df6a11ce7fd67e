"""pipeline.registry.tracking: stage runs on an embedded store."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.registry.tracking import artifact_root, stage_run


def test_artifacts_stay_beside_the_store_not_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, elsewhere = tmp_path / "repo", tmp_path / "cwd"
    store.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (store / "note.json").write_text("{}")
    with stage_run("probe", experiment="artifacts", root=store) as run:
        run.log_artifact(store / "note.json")
    assert not (elsewhere / "mlruns").exists()
    assert list((store / "mlruns").rglob("note.json"))
    assert artifact_root(f"sqlite:///{store / 'mlflow.db'}") == (store / "mlruns").as_uri()
    assert artifact_root("http://127.0.0.1:5000") is None
