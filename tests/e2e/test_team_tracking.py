"""The shared tiny pipeline on the team tracking server (``scripts/team_server.sh``: mlflow server on
PostgreSQL): every stage's run, the registered versions and the gate's aliases live on the server, none
in the repo. Runs last among the e2e tests (it registers more versions)."""

from __future__ import annotations

import json

import pytest

from pipeline.registry import mlflow_models
from pipeline.registry.register import CHALLENGER, CHAMPION
from tests.e2e.conftest import repo_env, run
from tests.team import ABSENT, postgres_registry

pytestmark = pytest.mark.e2e


def test_tiny_pipeline_registers_and_gates_on_the_team_server(tiny_repo, tracking_server, tmp_path,
                                                               monkeypatch):
    if tracking_server is None:
        pytest.skip(ABSENT)
    assert not (tiny_repo / "mlflow.db").exists() and not (tiny_repo / "mlruns").exists()
    first = json.loads((tiny_repo / "metrics/register.json").read_text())
    model = first["model_name"]  # register.model_name auto: named after the data (digits-cascade)
    assert model == "digits-cascade"
    assert first["version"] == 1 and first["passed"] and first["champion"] == 1
    assert postgres_registry(tracking_server.dir, model) == ({CHAMPION: 1, CHALLENGER: 1}, [1])
    assert list((tracking_server.dir / "artifacts").rglob("MLmodel"))

    # DVC re-runs register: the same cascade (equal accuracy and cost) passes and becomes champion
    run(["dvc", "repro", "-f", "-s", "register"], tiny_repo)
    second = json.loads((tiny_repo / "metrics/register.json").read_text())
    assert second["version"] == 2 and second["passed"] and second["champion"] == 2
    assert second["previous_champion"] == 1

    # a challenger 5 points less accurate at the same cost: refused, the champion stays v2
    cascade = json.loads((tiny_repo / "metrics/evaluate.json").read_text())["cascade"]
    worse = tmp_path / "evaluate.json"
    worse.write_text(json.dumps({"cascade": {"accuracy": cascade["accuracy"] - 0.05,
                                             "mean_macs": cascade["mean_macs"]}}))
    run(["python", "-m", "stages.register", "--model", "models/cascade", "--metrics-in", str(worse),
         "--data", "data/prepared", "--out", str(tmp_path / "register.json")], tiny_repo)
    third = json.loads((tmp_path / "register.json").read_text())
    assert third["version"] == 3 and not third["passed"] and third["champion"] == 2
    assert postgres_registry(tracking_server.dir, model) == ({CHAMPION: 2, CHALLENGER: 3}, [1, 2, 3])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", repo_env(tiny_repo)["MLFLOW_TRACKING_URI"])
    champion = mlflow_models.get_version_by_alias(model, CHAMPION, root=tiny_repo)
    assert champion["version"] == "2" and champion["tags"]["gate"] == "passed"
    assert mlflow_models.get_version_by_alias(model, CHALLENGER, root=tiny_repo)["tags"]["gate"] == "failed"
    assert not (tiny_repo / "mlflow.db").exists()
