"""A temporary copy of the repository on the tiny profile, with `dvc repro` run once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import deep_merge, load_params

ROOT = Path(__file__).resolve().parents[2]


def repo_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line and (root / line).is_file()]


def env_for(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{repo / 'mlflow.db'}"
    env["DVC_NO_ANALYTICS"] = "1"
    env["GX_ANALYTICS_ENABLED"] = "false"
    env["PYTHONPATH"] = str(repo)
    env.pop("CASCADE_EXECUTION_ID", None)
    return env


def run(cmd: list[str], repo: Path, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=repo, env=env_for(repo), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-3000:]}")
    return result


def make_tiny_repo(dest: Path) -> Path:
    for rel in repo_files(ROOT):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    params = deep_merge(load_params(dest / "params.yaml"), load_params(dest / "profiles" / "tiny.yaml"))
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@example.com"],
                ["git", "config", "user.name", "test"], ["git", "add", "-A"],
                ["git", "commit", "-qm", "tiny profile"]):
        run(cmd, dest)
    return dest


def add_fourth_module(repo: Path) -> None:
    """A 4-module cascade by a params change alone (issue: "a 4-module cascade runs end to end by
    changing params.yaml only"): one more module stacked on m3 and one more curriculum level."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["grade"]["levels"] = 4  # module k trains on curriculum level k
    params["modules"]["m4"] = {"after": "models/modules/m3",
                               "spec": {"kind": "fixed", "channels": 16, "stride": 1, "layers": 1}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


MODULES = ("m1", "m2", "m3", "m4")  # the shared tiny repo's cascade: the tiny profile's three + m4


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory) -> Path:
    """The tiny profile with a fourth module added in params only (one shared `dvc repro` serves the
    stage tests and the 4-module test), run once per session."""
    repo = make_tiny_repo(tmp_path_factory.mktemp("tiny") / "repo")
    add_fourth_module(repo)
    run(["python", "-m", "pipeline.check_params"], repo)
    run(["git", "commit", "-qam", "a fourth module, in params only"], repo)
    run(["dvc", "repro"], repo)
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
