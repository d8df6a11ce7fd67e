"""MLflow runs and the store (this module and :mod:`pipeline.registry.mlflow_models` are the only ones that
import mlflow). Each stage is one MLflow run, tagged with the stage, the git commit and the pipeline
execution it belongs to.

Concurrent processes on one embedded SQLite store are serialized by an inter-process file lock next
to it (``<db>.lock``, :func:`store_lock`): the first use of the store in a process (creating its
tables on a new store) and the registry's read-gate-promote section (:func:`registry_lock`) run under
it. Other stores (a tracking server) get one lock file per URI in the temporary directory, which
covers the processes of this machine only; a server creates its own tables.

The model registry's calls and the pyfunc model live in :mod:`pipeline.registry.mlflow_models`; this module
imports neither it nor :mod:`pipeline.registry.register`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.io import process_alive

EXECUTION_ENV = "CASCADE_EXECUTION_ID"
DEVICE_ENV = "CASCADE_DEVICE"  # where the served pyfunc model runs: cpu (default), auto, cuda or cuda:N


def default_tracking_uri(root: str | os.PathLike[str]) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else an embedded SQLite store ``mlflow.db`` in ``root``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(root).resolve() / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of an embedded SQLite store URI (``sqlite:///path``), else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def store_lock_path(uri: str) -> Path:
    """The lock file of a store: ``<db>.lock`` next to an SQLite database, else one per URI in the
    temporary directory."""
    db = sqlite_path(uri)
    if db is not None:
        return db.with_name(db.name + ".lock")
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"cascade-mlflow-{digest}.lock"


_LOCKS: dict[str, list[Any]] = {}  # resolved path -> [thread lock, depth, fd]
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive inter-process lock (``fcntl.flock``) on ``path``, created if missing; reentrant
    within a thread (a nested call holds the same lock), exclusive between threads and processes.
    The kernel drops it when its holder exits, so a crashed run never leaves it held."""
    key = str(Path(path).resolve())
    with _LOCKS_GUARD:
        entry = _LOCKS.setdefault(key, [threading.RLock(), 0, -1])
    with entry[0]:
        if entry[1] == 0:
            Path(key).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            entry[2] = fd
        entry[1] += 1
        try:
            yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                fd, entry[2] = entry[2], -1
                os.close(fd)  # releases the flock


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """The store's inter-process lock (see :func:`store_lock_path`)."""
    with file_lock(store_lock_path(uri)):
        yield


_READY: set[tuple[str, bool]] = set()  # (uri, registry) opened by this process


def ensure_store(uri: str, *, registry: bool = True) -> None:
    """Open an embedded SQLite store once per process under its lock, so that of several processes
    starting on a new store exactly one creates the tables (MLflow's migrations are not safe to run
    twice at once: the loser fails with ``duplicate column name``) and the others wait for it.

    Opening the tracking store creates every table, the registry's included (MLflow's one migration
    chain), so a stage run opens only that one (``registry=False``): the registry store's SQLAlchemy
    models cost 0.2 s more per process, paid only where the registry is used (docs/RESULTS.md "Where
    the quick command's time goes")."""
    if (uri, registry) in _READY or (uri, True) in _READY:
        return
    if sqlite_path(uri) is not None:
        import logging

        logging.getLogger("alembic").setLevel(logging.WARNING)
        from mlflow import MlflowClient

        with store_lock(uri):
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            client.search_experiments(max_results=1)  # the tracking tables (and the registry's)
            if registry:
                client.search_registered_models(max_results=1)  # the registry's SQLAlchemy store
    _READY.add((uri, registry))


@contextlib.contextmanager
def registry_lock(root: str | os.PathLike[str] = ".") -> Iterator[None]:
    """Hold the store's lock (see :func:`store_lock_path`) for a read-decide-write section of the
    registry, e.g. reading the champion, gating and moving the aliases."""
    uri = default_tracking_uri(root)
    ensure_store(uri)
    with store_lock(uri):
        yield


def git_commit(root: str | os.PathLike[str]) -> str:
    """The checked-out commit, with ``-dirty`` when tracked files (other than what ``dvc repro``
    itself rewrites) have uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        # dvc.lock and the metrics are rewritten by `dvc repro` itself: they do not make the code dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)dvc.lock", ":(exclude)metrics"], cwd=root,
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


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of (nested) ``metrics``, flattened to dotted keys, as floats."""
    return {k: float(v) for k, v in _flatten(metrics).items() if isinstance(v, (int, float))}


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
        self._mlflow.log_metrics(_numbers(metrics), step=step)

    def log_series(self, rows: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Many steps' metrics at once, ``rows`` of (step, metrics): a ``log_metrics`` call per step is a
        store transaction (or an HTTP request to a tracking server) each, about 7 ms on the SQLite store
        here, so 400 of them cost seconds; ``log_batch`` sends up to MLflow's per-request limit in one."""
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        stamp = int(time.time() * 1000)
        metrics = [Metric(key, value, stamp, int(step)) for step, values in rows
                   for key, value in _numbers(values).items()]
        client = self._mlflow.MlflowClient()
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(self.run_id, metrics=metrics[start:start + MAX_METRICS_PER_BATCH])

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._mlflow.log_artifacts(str(path), artifact_path=artifact_path or path.name)
        elif path.exists():
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._mlflow.set_tags(dict(tags))


class StageKilled(KeyboardInterrupt):
    """Raised in the main thread when the stage process gets SIGTERM inside :func:`stage_run`."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM (``kill``, a stopped ``dvc repro``) into :class:`StageKilled` while the block runs,
    so that ``finally`` clauses and the run's status update happen; the previous handler comes back
    after. Only the main thread may install handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise StageKilled(f"killed by signal {signal.Signals(signum).name}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


HOST_TAG, PID_TAG = "host", "pid"  # where a stage run's process lives, so a later run can tell it is gone


def artifact_root(uri: str) -> str | None:
    """Where a new experiment of an embedded SQLite store keeps its artifacts: ``mlruns/`` beside the
    database, not MLflow's default ``./mlruns`` of whatever directory the process runs in (a test
    running stages on a temporary store left one in the repository). None for a server: its own."""
    db = sqlite_path(uri)
    return None if db is None else (db.parent / "mlruns").as_uri()


def ensure_experiment(mlflow: Any, uri: str, name: str) -> None:
    """Create experiment ``name`` with :func:`artifact_root` if it does not exist yet (an existing one
    keeps its artifact location)."""
    location = artifact_root(uri)
    if location is None or mlflow.get_experiment_by_name(name) is not None:
        return
    from mlflow.exceptions import MlflowException

    try:
        mlflow.create_experiment(name, artifact_location=location)
    except MlflowException as exc:  # another process created it first
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def end_orphaned_runs(client: Any, experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of this experiment whose process, on this host, is gone (a SIGKILL
    skips every ``finally``, so such a run would stay RUNNING forever); returns their ids. Runs of
    other hosts, and of live processes, are left alone."""
    host, ended = socket.gethostname(), []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'"):
        tags = run.data.tags
        if tags.get(HOST_TAG) != host or not tags.get(PID_TAG, "").isdigit():
            continue
        if not process_alive(int(tags[PID_TAG])):
            client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    return ended


@contextlib.contextmanager
def stage_run(stage: str, *, experiment: str, root: str | os.PathLike[str] = ".",
              params: Mapping[str, Any] | None = None) -> Iterator[StageRun]:
    """Open an MLflow run for one stage; a failing stage ends its run with status FAILED, an
    interrupted one (KeyboardInterrupt, SIGINT, SIGTERM: see :class:`StageKilled`) with KILLED, so no
    run stays RUNNING after its process is gone; a SIGKILLed one is ended KILLED by the next stage run
    on this host (:func:`end_orphaned_runs`).

    MLflow exports the URIs it is given as ``MLFLOW_TRACKING_URI``/``MLFLOW_REGISTRY_URI``; they are
    restored on exit, so a later run in the same process with another ``root`` uses that root's store
    (else :func:`default_tracking_uri` would keep answering the first one)."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    uri = default_tracking_uri(root)
    ensure_store(uri, registry=False)
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)  # the registry follows, whatever store this process used before
        ensure_experiment(mlflow, uri, experiment)
        exp = mlflow.set_experiment(experiment)
        end_orphaned_runs(mlflow.MlflowClient(tracking_uri=uri), exp.experiment_id)
        tags = {"stage": stage, "git_commit": git_commit(root), "pipeline_execution": execution_id(),
                HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
        with _sigterm_raises():
            run = mlflow.start_run(run_name=stage, tags=tags)
            status = "FAILED"
            try:
                handle = StageRun(mlflow, run.info.run_id)
                if params:
                    handle.log_params(params)
                yield handle
                status = "FINISHED"
            except KeyboardInterrupt:
                status = "KILLED"
                raise
            finally:
                mlflow.end_run(status)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
