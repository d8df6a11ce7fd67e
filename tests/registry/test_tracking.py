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


def test_a_series_lands_as_each_step_logged_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """log_series writes what one log_metrics call per step would (keys, values, steps), over more
    metrics than one MLflow request may carry, leaving non-numbers out."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = [(step, {"iter_a": step / 7, "iter_b": {"c": -step}, "note": "text"}) for step in range(0, 1300, 2)]
    with stage_run("probe", experiment="series", root=tmp_path) as run:
        run.log_series(rows)
        client = mlflow.MlflowClient()
        run_id = run.run_id
    a = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "iter_a"))
    c = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "iter_b.c"))
    assert a == [(step, step / 7) for step in range(0, 1300, 2)]  # 1,300 metrics: two requests
    assert c == [(step, float(-step)) for step in range(0, 1300, 2)]
    assert "note" not in client.get_run(run_id).data.metrics


def test_a_stage_run_opens_no_registry_store_yet_creates_its_tables(tmp_path: Path) -> None:
    """A stage run pays for the tracking store only; the tables it creates on a new store include the
    registry's, so the register stage's registry store, opened later, finds them all."""
    import subprocess
    import sys

    probe = ("import sqlite3, sys\n"
             "from pipeline.registry.tracking import registry_lock, stage_run\n"
             f"root = {str(tmp_path)!r}\n"
             "with stage_run('probe', experiment='e', root=root):\n"
             "    pass\n"
             "print('registry store loaded:', 'mlflow.store.model_registry.sqlalchemy_store' in sys.modules)\n"
             "names = lambda: {r[0] for r in sqlite3.connect(root + '/mlflow.db').execute(\n"
             "    \"select name from sqlite_master where type='table'\")}\n"
             "before = names()\n"
             "print('registry tables:', {'registered_models', 'model_versions'} <= before)\n"
             "with registry_lock(root):\n"
             "    pass\n"
             "print('registry store loaded:', 'mlflow.store.model_registry.sqlalchemy_store' in sys.modules)\n"
             "print('tables added:', sorted(names() - before))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "MLFLOW_TRACKING_URI"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["registry store loaded: False", "registry tables: True", "registry store loaded: True",
                   "tables added: []"]
