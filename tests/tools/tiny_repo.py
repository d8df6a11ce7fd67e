"""A throw-away copy of this repository on the tiny profile (scikit-learn's digits), for the end-to-end
tests and the two-run determinism check (``tests.tools.rerun_determinism``), which run the real DVC
pipeline: the working tree's files (tracked and untracked, not ignored), params merged with
profiles/tiny.yaml, committed to a fresh git repo."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.params.config import deep_merge, load_params

ROOT = Path(__file__).resolve().parents[2]  # tests/tools/tiny_repo.py -> the repository root


def repo_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line and (root / line).is_file()]


def env_for(repo: Path) -> dict[str, str]:
    """The environment a stage sees in ``repo``: its own SQLite MLflow store, no analytics."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{repo / 'mlflow.db'}"
    env["DVC_NO_ANALYTICS"] = "1"
    env["GX_ANALYTICS_ENABLED"] = "false"
    env["PYTHONPATH"] = str(repo)
    # one intra-op thread per stage process, as tests/conftest.py gives the in-process tests: the tiny
    # profile's tensors are small, and with pytest-xdist's workers each stage's second thread only spin-waits
    # for a core another process holds (an elastic net trained 10x slower on two threads on a busy host;
    # docs/RESULTS.md "Method B as the architect")
    env["OMP_NUM_THREADS"] = "1"
    env.pop("CASCADE_EXECUTION_ID", None)
    return env


def run_in(repo: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``repo``; a non-zero exit raises RuntimeError with the output's tail."""
    result = subprocess.run(cmd, cwd=repo, env=env_for(repo), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}) in {repo}:\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def make_tiny_repo(dest: Path) -> Path:
    """Copy the working tree to ``dest``, lay profiles/tiny.yaml over params.yaml, commit."""
    for rel in repo_files(ROOT):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    params = deep_merge(load_params(dest / "params.yaml"), load_params(dest / "profiles" / "tiny.yaml"))
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@example.com"],
                ["git", "config", "user.name", "test"], ["git", "add", "-A"],
                ["git", "commit", "-qm", "tiny profile"]):
        run_in(dest, cmd)
    return dest


def add_fourth_module(repo: Path) -> None:
    """A 4-module cascade by a params change alone (issue: "a 4-module cascade runs end to end by
    changing params.yaml only"): one more module stacked on m3 and one more curriculum level."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["grade"]["levels"] = 4  # module k trains on curriculum level k
    params["modules"]["m4"] = {"after": "models/modules/m3",
                               "spec": {"kind": "fixed", "channels": 16, "stride": 1, "layers": 1}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
