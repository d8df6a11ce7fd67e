"""The team tracking server of ``scripts/team_server.sh`` for tests: start it on a free port in a fresh
directory, stop and remove it after, and read the registry straight from its PostgreSQL tables.

Used by tests/test_team_server.py (the register stage and a restart against it) and by the shared
tiny-profile pipeline of tests/e2e (every stage of ``dvc repro`` tracked on it)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "team_server.sh"
ABSENT = ("PostgreSQL binaries absent (no initdb in $PG_BIN, /usr/lib/postgresql/*/bin or PATH): "
          "install Debian's postgresql package (scripts/setup.sh does)")


def postgres_bin() -> str | None:
    """Where the script finds initdb: $PG_BIN, /usr/lib/postgresql/*/bin, or PATH."""
    candidates = [os.environ.get("PG_BIN", "")] + sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for directory in filter(None, candidates):
        if os.access(os.path.join(directory, "initdb"), os.X_OK):
            return directory
    found = shutil.which("initdb")
    return os.path.dirname(found) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(tracking_uri: str) -> dict[str, str]:
    """The environment the script and the stages run in: this interpreter's tools first on PATH."""
    env = dict(os.environ)
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_ENABLE_TELEMETRY="false", DO_NOT_TRACK="1",
               OMP_NUM_THREADS="1")
    return env


def script(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@dataclass(frozen=True)
class TeamServer:
    uri: str
    dir: Path
    args: tuple[str, ...]  # what `start`, `stop` and `status` take to address this server
    env: dict[str, str]
    started: str  # stdout of `start`


@contextlib.contextmanager
def running_team_server() -> Iterator[TeamServer]:
    """The script's server on a free port, its directory fresh; stopped and removed on exit whatever
    happened (a failed start included). Callers check :func:`postgres_bin` first."""
    # Not pytest's tmp_path: its folders are closed to other users (0700), and as root the cluster
    # belongs to the postgres user, who must be able to enter the directory.
    directory = Path(tempfile.mkdtemp(prefix="cascade-team-"))
    if os.geteuid() == 0:
        directory.chmod(0o711)
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    env = subprocess_env(uri)
    args = ("--port", str(port), "--dir", str(directory), "--workers", "1")
    try:
        started = script("start", *args, env=env)
        assert started.returncode == 0, f"start failed:\n{started.stdout}\n{started.stderr}"
        yield TeamServer(uri, directory, args, env, started.stdout)
    finally:
        stopped = script("stop", *args, env=env, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)
        assert stopped.returncode == 0, f"stop failed:\n{stopped.stdout}\n{stopped.stderr}"


def postgres_registry(directory: Path, model: str) -> tuple[dict[str, int], list[int]]:
    """The aliases and versions of registered model ``model`` as PostgreSQL's own tables hold them."""
    import psycopg2

    conn = psycopg2.connect(host=str(directory / "pg" / "run"), port=5432, user="mlflow", dbname="mlflow")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT alias, version FROM registered_model_aliases WHERE name = %s", (model,))
            aliases = {alias: int(version) for alias, version in cur.fetchall()}
            cur.execute("SELECT version FROM model_versions WHERE name = %s ORDER BY version", (model,))
            versions = [int(v) for (v,) in cur.fetchall()]
    finally:
        conn.close()
    return aliases, versions
