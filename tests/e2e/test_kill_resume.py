"""A real `dvc repro` killed in the middle of train@m2 (SIGKILL to its whole process group, as a
crashed machine or `kill -9` would), then run again: it takes over the stale checkpoint lock, resumes
from the last epoch checkpoint and ends with the same bytes as the uninterrupted run of the shared tiny
repo, leaving nothing behind. A live lock holder is refused; the dvc process killed alone leaves no
process; `register` killed right after creating its version is healed by the rerun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import yaml

from pipeline.registry import mlflow_models
from pipeline.registry.heal import CHAMPION, COMPLETE, STATE_TAG
from pipeline.train.lock import process_start, this_process
from tests.e2e.conftest import env_for, run


def _lock_outs(repo, stage: str) -> dict[str, str]:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return {o["path"]: o["md5"] for o in lock["stages"][stage]["outs"] if not o["path"].startswith("metrics/")}


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, "the stage finished before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint appeared in time"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_killed_dvc_repro_of_train_m2_resumes_to_the_same_bytes(tiny_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    uninterrupted = _lock_outs(repo, "train@m2")
    assert set(uninterrupted) == {"models/modules/m2/train"}
    cache = repo / ".cache" / "train"

    def two_epochs_saved() -> bool:
        return cache.is_dir() and any(cache.glob("m2-*/epoch_0002.pt"))

    proc = subprocess.Popen(["dvc", "repro", "-f", "-s", "train@m2"], cwd=repo, env=env_for(repo),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _kill_when(proc, two_epochs_saved)
    assert proc.returncode == -signal.SIGKILL
    assert not (repo / "models" / "modules" / "m2" / "train" / "module.pt").exists()
    lock = cache / "m2.lock"
    killed = json.loads(lock.read_text())["pid"]  # left by the killed stage

    rerun = run(["dvc", "repro", "-s", "train@m2"], repo)
    stale = f"train@m2: stale checkpoint lock {lock.relative_to(repo)} taken over: pid {killed} is dead"
    assert stale in rerun.stdout, rerun.stdout[-2000:]
    assert "resuming from the checkpoint" in rerun.stdout, rerun.stdout[-2000:]
    assert not lock.exists(), "the lock outlived the stage"
    metrics = yaml.safe_load((repo / "metrics" / "train_m2.json").read_text())
    assert metrics["resumed_after_epoch"] >= 2
    assert _lock_outs(repo, "train@m2") == uninterrupted  # bitwise the uninterrupted run's output
    assert not list(cache.glob("m2-*")), "checkpoints left behind"
    assert not list((repo / "models" / "modules" / "m2").glob(".train.*")), "a temporary folder left behind"


def _processes_in(repo) -> list[int]:
    """Pids of the processes working in ``repo`` (their cwd), this test's own excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == str(repo):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_killing_only_dvc_leaves_no_training_process(tiny_repo, tmp_path):
    """`kill -9` of the dvc process alone (not its group): the stage it ran dies with it (stages.common
    die_with_runner), whether dvc ran it through a shell or not."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    cache = repo / ".cache" / "train"
    for shell in ("/bin/sh", "/bin/bash"):
        env = {**env_for(repo), "SHELL": shell}
        proc = subprocess.Popen(["dvc", "repro", "-f", "-s", "train@m2"], cwd=repo, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (cache.is_dir() and any(cache.glob("m2-*/epoch_0001.pt"))):
            assert proc.poll() is None and time.monotonic() < deadline, "train@m2 never saved an epoch"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # dvc alone; its stage and shell are not signalled
        proc.wait(timeout=60)
        deadline = time.monotonic() + 15
        while _processes_in(repo) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _processes_in(repo)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"{shell}: processes left running after dvc was killed: {left}"


def test_a_live_checkpoint_lock_is_refused(tiny_repo, tmp_path):
    """A lock naming a process that still runs: the stage refuses (exit 5) naming the lock and the
    pid, and touches neither the lock nor the checkpoints."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    lock = repo / ".cache" / "train" / "m2.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as holder:
        try:
            planted = json.dumps({**asdict(this_process()), "pid": holder.pid,
                                  "started": process_start(holder.pid) or ""})
            lock.write_text(planted)
            result = run(["python", "-m", "stages.train", "--module", "m2", "--data", "data/prepared",
                          "--graded", "data/graded", "--profile", "models/profile.json", "--models",
                          "models/modules", "--metrics", "metrics/train_m2.json", "--teacher", "models/baselines"],
                         repo, check=False)
        finally:
            holder.kill()
    assert result.returncode == 5, (result.returncode, result.stderr[-2000:])
    refused = f"error: train@m2: checkpoint lock {lock.relative_to(repo)} is held by pid {holder.pid}"
    assert refused in result.stderr, result.stderr[-2000:]
    assert lock.read_text() == planted
    assert not list(lock.parent.glob("m2-*")), "the refused run wrote checkpoints"


_KILLED_REGISTER = """
import os, signal, sys
from pipeline.registry import mlflow_models
mlflow_models.set_alias = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # right after the version
from stages.register import main
sys.exit(main(sys.argv[1:]))
"""


def test_register_killed_after_creating_its_version_is_healed(tiny_repo, tmp_path, monkeypatch):
    """`register` SIGKILLed between creating its version and setting its aliases (on the copy's own
    SQLite store), then `dvc repro`: the rerun finishes the killed version, registers its own, and
    leaves one champion and every version complete."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    stage = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["register"]["cmd"].split()
    assert stage[:3] == ["python", "-m", "stages.register"]
    out = repo / "metrics" / "register.json"
    name = json.loads(out.read_text())["model_name"]
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the copy's own mlflow.db (empty on a team server)
    before = len(mlflow_models.model_versions(name, root=repo))
    out.unlink()  # as dvc does before it runs the stage
    killed = run(["python", "-c", _KILLED_REGISTER, *stage[3:]], repo, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists()
    left = mlflow_models.model_versions(name, root=repo)[before:]
    assert [(v["tags"].get(STATE_TAG), v["aliases"]) for v in left] == [("incomplete", [])], left

    rerun = run(["dvc", "repro", "-s", "register"], repo)
    assert f"register: {name} v{before + 1} was left incomplete by a killed run: finished" in rerun.stdout, \
        rerun.stdout[-2000:]
    versions = mlflow_models.model_versions(name, root=repo)[before:]
    assert [v["tags"].get(STATE_TAG) for v in versions] == [COMPLETE, COMPLETE], versions
    assert [v["aliases"] for v in versions] == [[], ["challenger", "champion"]]  # finished, then superseded
    decision = json.loads(out.read_text())
    assert decision["version"] == before + 2 and decision["previous_champion"] == before + 1, decision
    champion = mlflow_models.get_version_by_alias(name, CHAMPION, root=repo)
    assert champion is not None and int(champion["version"]) == before + 2

