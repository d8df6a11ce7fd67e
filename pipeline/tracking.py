"""The only module that imports mlflow. Each stage is one MLflow run, tagged with the stage, the git
commit and the pipeline execution it belongs to.

Concurrent processes on one embedded SQLite store are serialized by an inter-process file lock next
to it (``<db>.lock``, :func:`store_lock`): the first use of the store in a process (creating its
tables on a new store) and the registry's read-gate-promote section (:func:`registry_lock`) run under
it. Other stores (a tracking server) get one lock file per URI in the temporary directory, which
covers the processes of this machine only; a server creates its own tables.

This module never imports :mod:`pipeline.registry`; its pyfunc model class answers requests with
:mod:`pipeline.payload`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd  # the pyfunc model's predict is typed with it (MLflow reads the hint)

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


_READY: set[str] = set()


def ensure_store(uri: str) -> None:
    """Open an embedded SQLite store once per process under its lock, so that of several processes
    starting on a new store exactly one creates the tables (MLflow's migrations are not safe to run
    twice at once: the loser fails with ``duplicate column name``) and the others wait for it."""
    if uri in _READY:
        return
    if sqlite_path(uri) is not None:
        import logging

        logging.getLogger("alembic").setLevel(logging.WARNING)
        from mlflow import MlflowClient

        with store_lock(uri):
            client = MlflowClient(tracking_uri=uri, registry_uri=uri)
            client.search_experiments(max_results=1)  # the tracking tables
            client.search_registered_models(max_results=1)  # the registry tables
    _READY.add(uri)


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
    ensure_store(uri)
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)  # the registry follows, whatever store this process used before
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


# ------------------------------------------------------------------------------------ model registry


def _quiet() -> None:
    """No artifact progress bars: they flood logs and the CLI's stderr (an explicit setting wins)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _client(root: str | os.PathLike[str] = ".") -> Any:
    from mlflow import MlflowClient

    uri = default_tracking_uri(root)
    ensure_store(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _pinned(packages: tuple[str, ...]) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in packages:
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")  # torch 2.x+cpu -> the public release
        except PackageNotFoundError:
            out.append(name)
    return out


def _schema(columns: tuple[tuple[str, str], ...], *, optional: bool) -> Any:
    from mlflow.types.schema import AnyType, Array, ColSpec, DataType, Schema

    kinds = {"any": AnyType(), "list[string]": Array(DataType.string)}
    return Schema([ColSpec(kinds.get(kind, kind), name, required=not optional) for name, kind in columns])


def _pyfunc_kwargs(model_dir: str | os.PathLike[str], code_dir: Path, input_example: Any,
                   input_columns: tuple[tuple[str, str], ...], output_columns: tuple[tuple[str, str], ...]
                   ) -> dict[str, Any]:
    """What a cascade pyfunc model is made of; the ``pipeline`` package (without caches) is copied
    to ``code_dir`` and travels with the model, so a server runs the code the model was logged with."""
    import shutil

    from mlflow.models import ModelSignature

    shutil.copytree(Path(__file__).resolve().parent, code_dir, ignore=shutil.ignore_patterns("__pycache__"))
    signature = ModelSignature(inputs=_schema(input_columns, optional=True),
                               outputs=_schema(output_columns, optional=False))
    return {"python_model": _cascade_model_class()(), "artifacts": {"cascade": str(model_dir)},
            "code_paths": [str(code_dir)], "signature": signature, "input_example": input_example,
            "pip_requirements": _pinned(("mlflow", "torch", "torchvision", "numpy", "pandas", "pyyaml"))}


def log_cascade_model(model_dir: str | os.PathLike[str], input_example: Any,
                      input_columns: tuple[tuple[str, str], ...], output_columns: tuple[tuple[str, str], ...]
                      ) -> str:
    """Log a cascade model directory as a pyfunc model in the active run; returns its model URI. Nothing
    is registered here (:func:`register_version` does it, with every tag at once). Input columns are all
    optional: a request fills one of them per row."""
    import tempfile

    import mlflow

    _quiet()
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "pipeline"
        kwargs = _pyfunc_kwargs(model_dir, code, input_example, input_columns, output_columns)
        info = mlflow.pyfunc.log_model(name="cascade", **kwargs)
    return str(info.model_uri)


def register_version(name: str, model_uri: str, tags: Mapping[str, str]) -> str:
    """A new version of registered model ``name`` (created if missing) for ``model_uri``, holding
    ``tags`` from the moment it exists (the store writes the version and its tags in one transaction),
    so no reader ever sees a version without its tags; returns the version number."""
    import mlflow

    _quiet()
    version = mlflow.register_model(model_uri, name, tags={k: str(v)[:5000] for k, v in tags.items()})
    return str(version.version)


def save_cascade_model(model_dir: str | os.PathLike[str], path: str | os.PathLike[str], input_example: Any,
                       input_columns: tuple[tuple[str, str], ...], output_columns: tuple[tuple[str, str], ...]
                       ) -> Path:
    """The same pyfunc model as :func:`log_cascade_model`, saved to a local directory (no store)."""
    import tempfile

    import mlflow

    _quiet()
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "pipeline"
        kwargs = _pyfunc_kwargs(model_dir, code, input_example, input_columns, output_columns)
        mlflow.pyfunc.save_model(str(path), **kwargs)
    return Path(path)


def set_alias(name: str, alias: str, version: str | int, *, root: str | os.PathLike[str] = ".") -> None:
    _client(root).set_registered_model_alias(name, alias, str(version))


def get_version_by_alias(name: str, alias: str, *,
                         root: str | os.PathLike[str] = ".") -> dict[str, Any] | None:
    """The version an alias points at (``version``, ``run_id``, ``source``, ``tags``, ``aliases``),
    or None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = _client(root).get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise
    return {"name": mv.name, "version": str(mv.version), "run_id": mv.run_id, "source": mv.source,
            "tags": dict(mv.tags or {}), "aliases": list(mv.aliases or [])}


def download_model_artifacts(uri: str, dst: str | os.PathLike[str] | None = None, *,
                             root: str | os.PathLike[str] = ".") -> Path:
    """Download a registered model (``models:/...``) into ``dst`` (default: a fresh temporary
    directory); an embedded store that does not exist is an error, never created empty."""
    import tempfile

    tracking_uri = default_tracking_uri(root)
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_file():
        raise FileNotFoundError(f"no MLflow store at {tracking_uri}: run from the repository root or set "
                                "MLFLOW_TRACKING_URI")
    ensure_store(tracking_uri)
    import mlflow.artifacts

    _quiet()
    dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="cascade-model-"))
    dst.mkdir(parents=True, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst),
                                                    tracking_uri=tracking_uri, registry_uri=tracking_uri))


@functools.cache
def _cascade_model_class() -> type:
    """The pyfunc model class, built on first use so importing this module never imports mlflow.

    It is published as ``pipeline.tracking.CascadeModel`` (module ``__getattr__``), so cloudpickle
    stores the logged instance by reference and a server rebuilds the class from the code."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    class CascadeModel(mlflow.pyfunc.PythonModel):
        """Answers a DataFrame of images (see :mod:`pipeline.payload`) with the cascade's rows.

        The cascade loads on the device named by the environment variable ``CASCADE_DEVICE`` of the
        serving process: ``cpu`` (the default), ``auto`` (cuda if available, else cpu), ``cuda`` or
        ``cuda:N``; e.g. ``CASCADE_DEVICE=cuda mlflow models serve -m models:/fashion-cascade@champion``.
        A device the machine lacks fails at load time with a message naming ``CASCADE_DEVICE``."""

        def load_context(self, context: Any) -> None:
            from pipeline.device import resolve_device
            from pipeline.routing.package import load_cascade

            device = resolve_device(os.environ.get(DEVICE_ENV, "cpu").strip() or "cpu", key=DEVICE_ENV)
            self._loaded = load_cascade(context.artifacts["cascade"], device)

        def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
                    ) -> pd.DataFrame:
            from pipeline.payload import predict_frame

            if not isinstance(model_input, pd.DataFrame):
                model_input = pd.DataFrame(model_input)
            try:
                return predict_frame(self._loaded, model_input)
            except ValueError as exc:  # a bad request: the REST server answers 400 with this message
                raise MlflowException.invalid_parameter_value(str(exc)) from None

    CascadeModel.__module__ = __name__
    CascadeModel.__qualname__ = "CascadeModel"
    return CascadeModel


def __getattr__(name: str) -> Any:
    if name == "CascadeModel":
        return _cascade_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
