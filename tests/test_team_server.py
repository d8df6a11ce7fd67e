"""The team tracking server (``scripts/team_server.sh``): ``mlflow server`` on a PostgreSQL backend
store with proxied artifacts. The register stage runs against it over HTTP as it does on the embedded
store in tests/registry/test_register.py: the first version becomes champion, a worse challenger is refused by
the gate, and the aliases are right in PostgreSQL's own tables and after a restart.

Skipped only when the PostgreSQL binaries are absent (scripts/setup.sh installs Debian's
``postgresql`` package)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.io import write_json
from pipeline.registry import mlflow_models
from pipeline.registry.register import CHALLENGER, CHAMPION, download_cascade, metrics_from_tags
from tests.registry.test_register import failing, run_stage, stage_repo
from tests.routing.test_package import save_tiny
from tests.team import ABSENT, TeamServer, postgres_bin, postgres_registry, running_team_server, script

MODEL = "stage-cascade"  # the name stage_repo's params give the registered model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return save_tiny(tmp_path_factory.mktemp("team") / "model")[1]


@pytest.fixture(scope="module")
def team_server() -> Iterator[TeamServer]:
    if postgres_bin() is None:
        if os.environ.get("CI"):  # CI installs PostgreSQL (scripts/setup.sh): its absence is a failure there
            pytest.fail(f"CI is set and {ABSENT}")
        pytest.skip(ABSENT)
    with running_team_server() as server:
        yield server


def test_start_prints_the_uri_status_and_is_idempotent(team_server: TeamServer) -> None:
    uri, args, env = team_server.uri, team_server.args, team_server.env
    assert f"export MLFLOW_TRACKING_URI={uri}" in team_server.started.splitlines()
    status = script("status", *args, env=env)
    assert status.returncode == 0 and "running" in status.stdout and uri in status.stdout
    again = script("start", *args, env=env)
    pid = (team_server.dir / "mlflow.pid").read_text().strip()
    assert again.returncode == 0 and f"already running (pid {pid}" in again.stdout
    assert f"export MLFLOW_TRACKING_URI={uri}" in again.stdout


def test_register_stage_gate_on_postgres(team_server: TeamServer, model_dir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(team_server.uri))
    root = stage_repo(tmp_path, model_dir, 0.9, 1000.0)
    assert run_stage(root, model_dir) == 0
    first = json.loads((root / "metrics/register.json").read_text())
    assert first["version"] == 1 and first["passed"] and first["champion"] == 1
    champion = mlflow_models.get_version_by_alias(MODEL, CHAMPION, root=root)
    assert champion is not None and champion["version"] == "1"
    assert champion["tags"]["gate"] == "passed" and champion["tags"]["dvc.out.data/prepared"] == "aaa.dir"
    assert metrics_from_tags(champion["tags"]) == {"accuracy": 0.9, "mean_macs": 1000.0}

    # a challenger over the MACs cap with no cheaper setting: refused, champion stays v1
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.95, "mean_macs": 1100.0}})
    assert run_stage(root, model_dir) == 0
    second = json.loads((root / "metrics/register.json").read_text())
    assert second["version"] == 2 and not second["passed"] and second["champion"] == 1
    assert failing(second["reasons"]) == ["equal cost"]
    assert mlflow_models.get_version_by_alias(MODEL, CHAMPION, root=root)["version"] == "1"
    challenger = mlflow_models.get_version_by_alias(MODEL, CHALLENGER, root=root)
    assert challenger["version"] == "2" and challenger["tags"]["gate"] == "failed"

    # the registry lives in PostgreSQL and the artifacts in the server's folder, nothing in the root
    assert postgres_registry(team_server.dir, MODEL) == ({CHAMPION: 1, CHALLENGER: 2}, [1, 2])
    assert not (root / "mlflow.db").exists() and not (root / "mlruns").exists()
    assert list((team_server.dir / "artifacts").rglob("MLmodel"))


def test_restart_keeps_the_registry(team_server: TeamServer, model_dir: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop and start again on the same directory: the champion and its artifacts are still there."""
    args, env = team_server.args, team_server.env
    assert script("stop", *args, env=env, timeout=60).returncode == 0
    stopped = script("status", *args, env=env)
    assert stopped.returncode == 3 and "stopped" in stopped.stdout
    restarted = script("start", *args, env=env)
    assert restarted.returncode == 0, restarted.stderr
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(team_server.uri))
    assert mlflow_models.get_version_by_alias(MODEL, CHAMPION, root=tmp_path)["version"] == "1"
    downloaded = download_cascade(f"models:/{MODEL}@{CHAMPION}", tmp_path / "champion")
    assert (downloaded / "cascade.json").read_bytes() == (model_dir / "cascade.json").read_bytes()
