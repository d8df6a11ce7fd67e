"""A real `dvc repro` killed in the middle of train@m2 (SIGKILL to its whole process group, as a
crashed machine or `kill -9` would), then run again: it resumes from the last epoch checkpoint and
ends with the same bytes as the uninterrupted run of the shared tiny repo, leaving nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import yaml

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

    rerun = run(["dvc", "repro", "-s", "train@m2"], repo)
    assert "resuming from the checkpoint" in rerun.stdout, rerun.stdout[-2000:]
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
