"""The checkpoint lock of a module (pipeline.train.lock): a lock file left by a killed run (its pid dead
or reused, another host, another boot, no holder named) is taken over with one line; a live holder,
whether it holds the flock or is only named in the file, is refused naming the lock and its pid."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from pipeline.train.lock import (
    CheckpointLocked,
    Holder,
    checkpoint_lock,
    lock_path,
    parse_holder,
    process_start,
    stale_reason,
    this_process,
)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def plant(path: Path, holder: Holder) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(holder)) + "\n")


def take(path: Path) -> tuple[list[str], dict]:
    """Take the lock: the lines it logged and what the file said while it was held."""
    lines: list[str] = []
    with checkpoint_lock(path, log=lines.append) as me:
        held = json.loads(path.read_text())
        assert held["pid"] == me.pid
    assert not path.exists(), "the lock file outlived its holder"
    return lines, held


def test_a_free_lock_is_taken_silently_and_removed(tmp_path: Path) -> None:
    path = lock_path(tmp_path / ".cache" / "train" / "m2-abc", "m2")
    assert path == tmp_path / ".cache" / "train" / "m2.lock"
    lines, held = take(path)
    assert lines == [] and held == asdict(this_process())


@pytest.mark.parametrize("change", ["dead pid", "reused pid", "another host", "another boot", "no holder"])
def test_a_stale_lock_is_taken_over_with_one_line(tmp_path: Path, change: str) -> None:
    path = tmp_path / "m2.lock"
    here = this_process()
    if change == "no holder":
        path.write_text('{"pid": 12')  # a write cut short by the kill
    else:
        stale = {"dead pid": replace(here, pid=dead_pid()),
                 "reused pid": replace(here, pid=1, started=f"{process_start(1)}0"),  # pid 1, not its start
                 "another host": replace(here, host=here.host + "-other"),
                 "another boot": replace(here, boot="not-" + here.boot)}[change]
        if change == "another boot" and not here.boot:
            pytest.skip("no boot id on this system")
        plant(path, stale)
    lines, held = take(path)
    assert held["pid"] == here.pid
    assert len(lines) == 1 and f"stale checkpoint lock {path} taken over" in lines[0], lines
    expected = {"dead pid": "is dead", "reused pid": "pid 1 is another process now", "another host": "host",
                "another boot": "rebooted", "no holder": "names no holder"}[change]
    assert expected in lines[0], lines


def test_a_lock_naming_a_live_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m2.lock"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        try:
            plant(path, replace(this_process(), pid=other.pid, started=process_start(other.pid) or ""))
            with pytest.raises(CheckpointLocked) as err, checkpoint_lock(path, log=print):
                pytest.fail("a live holder's lock was taken")
            assert str(path) in str(err.value) and f"pid {other.pid}" in str(err.value)
            assert json.loads(path.read_text())["pid"] == other.pid  # the holder's file is left alone
        finally:
            other.kill()
    lines, _ = take(path)  # once that process is gone, its lock is stale
    assert len(lines) == 1 and f"pid {other.pid} is dead" in lines[0]


def _hold(path: str, ready: object, release: object) -> None:
    with checkpoint_lock(path):
        ready.set()  # type: ignore[attr-defined]
        release.wait(60)  # type: ignore[attr-defined]


def test_a_lock_held_by_a_running_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m2.lock"
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(path), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(CheckpointLocked, match=rf"{path.name} is held by pid {holder.pid} "):
            with checkpoint_lock(path):
                pytest.fail("a held lock was taken")
    finally:
        release.set()
        holder.join(60)
    assert holder.exitcode == 0 and not path.exists()
    assert take(path)[0] == []  # released cleanly: nothing stale


def test_stale_reason() -> None:
    here = Holder(10, "500", "box", "b1")
    assert stale_reason(here, here, "500") is None
    assert stale_reason(replace(here, pid=11), here, "500") is None  # another live process of this boot
    assert stale_reason(replace(here, pid=11), here, None) == "pid 11 is dead"
    assert stale_reason(replace(here, pid=11), here, "900") == "pid 11 is another process now"
    assert stale_reason(replace(here, pid=11, started=""), here, "900") is None  # start time unknown: alive
    assert "host box2" in stale_reason(replace(here, host="box2"), here, "500")
    assert stale_reason(replace(here, boot="b0"), here, "500") == "written before the machine rebooted"
    assert stale_reason(replace(here, boot=""), here, "500") is None  # boot id unknown: not evidence


def test_parse_holder() -> None:
    me = this_process()
    assert parse_holder(json.dumps(asdict(me))) == me
    for text in ("", "{", "[]", '{"pid": 1}', '{"pid": "x", "started": "", "host": "", "boot": ""}'):
        assert parse_holder(text) is None, text
    assert process_start(me.pid) == me.started and process_start(dead_pid()) is None
    assert process_start(0) is None and process_start(-1) is None
