"""The only module that imports mlflow. Each stage is one MLflow run, tagged with the stage, the git
commit and the pipeline execution it belongs to."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

EXECUTION_ENV = "CASCADE_EXECUTION_ID"


def default_tracking_uri(root: str | os.PathLike[str]) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else an embedded SQLite store ``mlflow.db`` in ``root``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def git_commit(root: str | os.PathLike[str]) -> str:
    """The checked-out commit, with ``-dirty`` when tracked files have uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def execution_id() -> str:
    """Groups the stage runs of one ``dvc repro``: the env var if set, else the id of the nearest
    ``dvc`` ancestor process (stable across the stages it spawns), else a fresh id."""
    if os.environ.get(EXECUTION_ENV):
        return os.environ[EXECUTION_ENV]
    pid = os.getppid()
    for _ in range(8):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        if any(part.endswith(b"dvc") or part == b"dvc.cli" for part in cmdline[:3]):
            return f"dvc-{pid}-{stat[19]}"  # stat[19] is the process start time: unique per boot
        pid = int(stat[1])
        if pid <= 1:
            break
    return f"adhoc-{uuid.uuid4().hex[:12]}"


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


class StageRun:
    """A thin handle on the active run, so stages never touch mlflow directly."""

    def __init__(self, mlflow: Any, run_id: str) -> None:
        self._mlflow = mlflow
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = {k: ("null" if v is None else v) for k, v in _flatten(params).items()}
        self._mlflow.log_params({k: str(v)[:6000] for k, v in flat.items()})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        clean = {k: float(v) for k, v in _flatten(metrics).items() if isinstance(v, (int, float))}
        self._mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._mlflow.log_artifacts(str(path), artifact_path=artifact_path or path.name)
        elif path.exists():
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._mlflow.set_tags(dict(tags))


@contextlib.contextmanager
def stage_run(stage: str, *, experiment: str, root: str | os.PathLike[str] = ".",
              params: Mapping[str, Any] | None = None) -> Iterator[StageRun]:
    """Open an MLflow run for one stage; a failing stage ends its run with status FAILED."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    mlflow.set_tracking_uri(default_tracking_uri(root))
    mlflow.set_experiment(experiment)
    tags = {"stage": stage, "git_commit": git_commit(root), "pipeline_execution": execution_id()}
    with mlflow.start_run(run_name=stage, tags=tags) as run:
        handle = StageRun(mlflow, run.info.run_id)
        if params:
            handle.log_params(params)
        yield handle
