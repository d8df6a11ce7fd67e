"""A temporary copy of the repository on the tiny profile, with `dvc repro` run once per session."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.team import TeamServer, postgres_bin, running_team_server
from tests.tools.tiny_repo import ROOT, add_fourth_module, env_for, make_tiny_repo

__all__ = ["ROOT", "MODULES", "REPRO", "add_fourth_module", "changed_stages", "env_for", "make_tiny_repo",
           "repo_env", "run"]

TRACKING: dict[Path, str] = {}  # repo -> the tracking URI its stages use instead of its own SQLite file
REPRO: dict[Path, str] = {}  # repo -> what its session-wide `dvc repro` printed (the stages' own lines included)


def repo_env(repo: Path) -> dict[str, str]:
    """What a command in ``repo`` sees: :func:`env_for`, on the team server if the repo was set up on it."""
    env = env_for(repo)
    if repo in TRACKING:
        env["MLFLOW_TRACKING_URI"] = TRACKING[repo]
    return env


def run(cmd: list[str], repo: Path, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=repo, env=repo_env(repo), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result


MODULES = ("m1", "m2", "m3", "m4")  # the shared tiny repo's cascade: the tiny profile's three + m4


@pytest.fixture(scope="session")
def tracking_server() -> Iterator[TeamServer | None]:
    """The team tracking server (``scripts/team_server.sh``: mlflow server on PostgreSQL) that the
    shared tiny pipeline tracks and registers on; None where the PostgreSQL binaries are absent (the
    repo's own SQLite file then, as in a user's checkout)."""
    if postgres_bin() is None:
        if os.environ.get("CI"):  # CI installs PostgreSQL (scripts/setup.sh): its absence is a failure there
            pytest.fail("PostgreSQL is not installed but CI is set: scripts/setup.sh should have installed it")
        yield None
        return
    with running_team_server() as server:
        yield server


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory, tracking_server: TeamServer | None) -> Path:
    """The tiny profile with a fourth module added in params only (one shared `dvc repro` serves the
    stage tests and the 4-module test), run once per session, tracked on the team server when
    PostgreSQL is installed (scripts/setup.sh installs it)."""
    repo = make_tiny_repo(tmp_path_factory.mktemp("tiny") / "repo")
    if tracking_server is not None:
        TRACKING[repo] = tracking_server.uri
    add_fourth_module(repo)
    run(["python", "-m", "pipeline.check_params"], repo)
    run(["git", "commit", "-qam", "a fourth module, in params only"], repo)
    REPRO[repo] = run(["dvc", "repro"], repo).stdout
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "repro"], repo)
    return repo


def changed_stages(status: str) -> set[str]:
    """Stage names that ``dvc status`` reports as changed, leaving out those whose only reason is
    ``always changed`` (ingest re-runs on every repro; identical data gives identical outputs)."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in status.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.strip().rstrip(":")
            blocks[current] = []
        elif current is not None and line.strip():
            blocks[current].append(line.strip())
    return {name for name, reasons in blocks.items() if reasons != ["always changed"]}
