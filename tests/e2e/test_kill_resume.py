"""A real `dvc repro` killed in the middle of train@m2 (SIGKILL to its whole process group, as a
crashed machine or `kill -9` would), then run again: it takes over the stale checkpoint lock, resumes
from the last epoch checkpoint and ends with the same bytes as the uninterrupted run of the shared tiny
repo, leaving nothing behind. A live lock holder is refused; the dvc process killed alone leaves no
process. The train stage and `register` SIGKILLed at each point where they write state (a wrapper
replaces one library function by one that kills its own process), then rerun by `dvc repro`: the same
bytes, one champion, every version complete, nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
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
        # each checkpoint replaces the one before: epoch 2's file may be gone by the next look
        return cache.is_dir() and any(int(p.stem.split("_")[1]) >= 2 for p in cache.glob("m2-*/epoch_*.pt"))

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
        # A fresh start each time: the run killed before may have saved epoch 2 (which replaces epoch 1's
        # file), and a resumed run could then finish without writing a checkpoint this loop would see.
        shutil.rmtree(cache, ignore_errors=True)
        proc = subprocess.Popen(["dvc", "repro", "-f", "-s", "train@m2"], cwd=repo, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (cache.is_dir() and any(cache.glob("m2-*/epoch_*.pt"))):
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
import stages.register as stage
target, attr, call = {target}, {attr!r}, {call}
real, calls = getattr(target, attr), []
def dying(*args, **kwargs):  # the call-th call dies before it does anything
    calls.append(1)
    if len(calls) == call:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
setattr(target, attr, dying)
sys.exit(stage.main(sys.argv[1:]))
"""
# point -> (the function killed at its n-th call, what the killed run left: its version's state and aliases)
REGISTER_KILLS = {
    "created": (("mlflow_models", "set_alias", 1), ("incomplete", [])),
    "challenger_set": (("mlflow_models", "set_alias", 2), ("incomplete", ["challenger"])),
    "aliases_set": (("mlflow_models", "set_version_tag", 1), ("incomplete", ["challenger", "champion"])),
    "complete": (("stage", "write_json", 1), (COMPLETE, ["challenger", "champion"])),  # before register.json
}


@pytest.mark.parametrize("point", list(REGISTER_KILLS))
def test_register_killed_at_each_point_is_healed(point, tiny_repo, tmp_path, monkeypatch):
    """`register` SIGKILLed at each point after creating its version (before its challenger alias,
    between challenger and champion, before its complete tag, before register.json is written; on the
    copy's own SQLite store), then `dvc repro`: the rerun finishes the killed version, registers its own,
    and leaves one champion, every version complete and no process."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    stage = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["register"]["cmd"].split()
    assert stage[:3] == ["python", "-m", "stages.register"]
    out = repo / "metrics" / "register.json"
    name = json.loads(out.read_text())["model_name"]
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the copy's own mlflow.db (empty on a team server)
    before = len(mlflow_models.model_versions(name, root=repo))
    out.unlink()  # as dvc does before it runs the stage
    (target, attr, call), left_as = REGISTER_KILLS[point]
    wrapper = _KILLED_REGISTER.format(target=target, attr=attr, call=call)
    killed = run(["python", "-c", wrapper, *stage[3:]], repo, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists()
    left = mlflow_models.model_versions(name, root=repo)[before:]
    assert [(v["tags"].get(STATE_TAG), v["aliases"]) for v in left] == [left_as], left

    rerun = run(["dvc", "repro", "-s", "register"], repo)
    healed = f"register: {name} v{before + 1} was left incomplete by a killed run: finished"
    assert (healed in rerun.stdout) == (left_as[0] != COMPLETE), rerun.stdout[-2000:]
    every = mlflow_models.model_versions(name, root=repo)
    assert [v["tags"].get(STATE_TAG) for v in every[before:]] == [COMPLETE, COMPLETE], every
    assert [v["aliases"] for v in every[before:]] == [[], ["challenger", "champion"]]  # finished, superseded
    assert [int(v["version"]) for v in every if CHAMPION in v["aliases"]] == [before + 2]  # one champion
    decision = json.loads(out.read_text())
    assert decision["version"] == before + 2 and decision["previous_champion"] == before + 1, decision
    champion = mlflow_models.get_version_by_alias(name, CHAMPION, root=repo)
    assert champion is not None and int(champion["version"]) == before + 2
    assert not _processes_in(repo), "a process left working in the repo"


_KILLED_TRAIN = """
import os, signal, sys
import stages.train as stage
from pipeline.workflows import train as flow  # the stage's workflow
from pipeline.train import lock, loop


def killed(real, *, after):  # does real's work first when after, then SIGKILLs this process
    def call(*args, **kwargs):
        if after:
            real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    return call


{patch}
sys.exit(stage.main(sys.argv[1:]))
"""
_KILL_AT_RENAME = """
real_replace = os.replace
def replace(src, dst, *args, **kwargs):  # {name}'s temporary is complete, not yet renamed into place: die
    if os.path.basename(dst) == "{name}":
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst, *args, **kwargs)
os.replace = replace
"""
# point -> (the patch, whether the rerun resumes from a checkpoint)
TRAIN_KILLS = {
    "lock_created_empty": ("lock._open_locked = killed(lock._open_locked, after=True)", False),
    "before_first_checkpoint": ("loop.save_training_state = killed(loop.save_training_state, after=False)",
                                False),
    "checkpoint_tmp_not_renamed": (_KILL_AT_RENAME.replace("{name}", "epoch_0002.pt"), True),
    "outputs_in_temporary_folder": ("flow.write_train_outputs = killed(flow.write_train_outputs, after=True)",
                                    True),
    "metrics_tmp_not_renamed": (_KILL_AT_RENAME.replace("{name}", "train_m2.json"), True),
    "outputs_in_place": ("flow.discard_checkpoints = killed(flow.discard_checkpoints, after=False)", True),
    "checkpoints_discarded": ("flow.discard_checkpoints = killed(flow.discard_checkpoints, after=True)",
                              False),
}


def _killed_state(point: str, repo) -> None:
    """What the kill at ``point`` must have left (the injection hit where it says it does)."""
    cache, m2 = repo / ".cache" / "train", repo / "models" / "modules" / "m2"
    lock, temporaries = cache / "m2.lock", list(m2.glob(".train.*"))
    placed = (m2 / "train" / "module.pt").exists()
    metrics = bool(list((repo / "metrics").glob(".train_m2.json.*")))  # write_json's temporary folder
    saved = sorted("tmp" if p.name.endswith(".tmp") else "pt" for p in cache.glob("m2-*/*"))  # dotfiles too
    assert lock.exists(), f"{point}: the killed run left no lock"
    assert bool(lock.read_text()) == (point != "lock_created_empty"), lock.read_text()
    expected = {  # (a temporary output folder, checkpoint files, outputs in place, a temporary metrics folder)
        "lock_created_empty": (False, [], False, False),
        "before_first_checkpoint": (True, [], False, False),
        "checkpoint_tmp_not_renamed": (True, ["pt", "tmp"], False, False),  # epoch 1's, epoch 2's temporary
        "outputs_in_temporary_folder": (True, ["pt"], False, False),  # the last epoch's
        "metrics_tmp_not_renamed": (True, ["pt"], False, True),
        "outputs_in_place": (False, ["pt"], True, False),
        "checkpoints_discarded": (False, [], True, False),
    }[point]
    got = (bool(temporaries), saved, placed, metrics)
    assert got == expected, f"{point}: the kill left {got}, not {expected}"


@pytest.mark.parametrize("point", list(TRAIN_KILLS))
def test_train_killed_at_each_write_point_reruns_to_the_same_bytes(point, tiny_repo, tmp_path):
    """`python -m stages.train` for m2 SIGKILLed at each point where it writes state (its lock half
    written; the lock held before any checkpoint; a checkpoint's temporary file not yet renamed; the
    outputs in their temporary folder; the metrics' temporary file not yet renamed; the outputs in place
    (metrics too), checkpoints not yet removed; the checkpoints removed, the lock not yet), then
    `dvc repro -s train@m2`: the rerun succeeds with the uninterrupted run's bytes and leaves no
    checkpoint, lock, temporary folder or process."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True)
    uninterrupted = _lock_outs(repo, "train@m2")
    cmd = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]["train"]["do"]["cmd"]
    stage = cmd.replace("${key}", "m2").split()
    assert stage[:3] == ["python", "-m", "stages.train"] and "${" not in cmd.replace("${key}", "")
    for out in yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["train@m2"]["outs"]:
        path = repo / out["path"]  # removed as dvc does before it runs the stage
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    patch, resumes = TRAIN_KILLS[point]
    killed = run(["python", "-c", _KILLED_TRAIN.replace("{patch}", patch), *stage[3:]], repo, check=False)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    _killed_state(point, repo)

    rerun = run(["dvc", "repro", "-s", "train@m2"], repo)
    assert "Running stage 'train@m2'" in rerun.stdout, rerun.stdout[-2000:]
    assert ("resuming from the checkpoint" in rerun.stdout) == resumes, rerun.stdout[-2000:]
    assert _lock_outs(repo, "train@m2") == uninterrupted  # bitwise the uninterrupted run's output
    cache = repo / ".cache" / "train"
    assert not list(cache.glob("m2-*")), "checkpoints left behind"
    assert not (cache / "m2.lock").exists(), "the lock outlived the stage"
    assert not list((repo / "models" / "modules" / "m2").glob(".train.*")), "a temporary folder left behind"
    assert not list((repo / "metrics").glob(".train_m2.json.*")), "a temporary metrics folder left behind"
    assert not _processes_in(repo), "a process left working in the repo"
