"""One ``train`` run at a time per module's checkpoint folders (``.cache/train/<name>.lock``): two runs of
one module (a second ``dvc repro``, a hand-run stage) would otherwise write the same checkpoint folder,
and each removes the other's folders as stale.

The lock file names its holder (pid, process start time, host, boot id) and is held with ``flock``
while the run lasts. A file left by a killed run is stale when its holder is gone: the pid is dead or
now another process (another start time), or it was written on another host or before a reboot; the
next run says so in one line and takes it over. A live holder is refused with :class:`CheckpointLocked`,
naming the lock and the pid."""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path


class CheckpointLocked(RuntimeError):
    """Another live run holds the lock."""


@dataclass(frozen=True)
class Holder:
    pid: int
    started: str  # the process's start time in clock ticks since boot ("" where /proc is missing)
    host: str
    boot: str  # the kernel's boot id ("" where unknown)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` ("" where /proc does not tell), or None when it does not exist."""
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # someone else's process: it exists
    stat = _read(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if stat else ""  # field 22, counted after the command


def this_process() -> Holder:
    pid = os.getpid()
    return Holder(pid, process_start(pid) or "", socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"))


def stale_reason(holder: Holder, here: Holder, started: str | None) -> str | None:
    """Why ``holder`` (read from a lock file) no longer holds it, seen from ``here`` (this process) when
    ``holder.pid`` has start time ``started`` now (None: no such process); None when it is alive."""
    if holder.host != here.host:
        return f"written on host {holder.host}, this is {here.host}"
    if holder.boot and here.boot and holder.boot != here.boot:
        return "written before the machine rebooted"
    if started is None:
        return f"pid {holder.pid} is dead"
    if holder.started and started and holder.started != started:
        return f"pid {holder.pid} is another process now"
    return None


def parse_holder(text: str) -> Holder | None:
    """The holder a lock file names, or None when it names none (empty, or unreadable: a write cut short)."""
    try:
        d = json.loads(text)
        return Holder(int(d["pid"]), str(d["started"]), str(d["host"]), str(d["boot"]))
    except (ValueError, KeyError, TypeError):
        return None


def lock_path(cache: str | os.PathLike[str], name: str) -> Path:
    """Module ``name``'s lock: beside its checkpoint folders (``cache`` is one of them), outside their
    ``<name>-*`` pattern."""
    return Path(cache).parent / f"{name}.lock"


def _refuse(path: Path, holder: Holder | None) -> CheckpointLocked:
    who = holder.describe() if holder is not None else "another process"
    return CheckpointLocked(f"checkpoint lock {path} is held by {who}, which is still running: wait for it "
                            f"to finish or stop it (a lock whose process is gone is taken over)")


def _open_locked(path: Path) -> int:
    """An fd of ``path`` holding its flock (the file a concurrent release may unlink is never kept)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # unlinked by its holder's release between our open and our flock: open it anew


@contextmanager
def checkpoint_lock(path: str | os.PathLike[str], log: Callable[[str], None] = print) -> Iterator[Holder]:
    """Hold the lock file ``path`` while the block runs (created with its folder if missing, removed on
    exit); a stale lock is taken over with one ``log`` line, a live one raises :class:`CheckpointLocked`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    here = this_process()
    try:
        fd = _open_locked(path)
    except BlockingIOError:
        raise _refuse(path, parse_holder(_read(str(path)))) from None
    try:
        text = os.pread(fd, 1 << 16, 0).decode(errors="replace").strip()
        holder = parse_holder(text)
        if holder is not None and holder != here:
            reason = stale_reason(holder, here, process_start(holder.pid) if holder.host == here.host else None)
            if reason is None:  # alive without the flock (a lock on a file system that does not share it)
                raise _refuse(path, holder)
            log(f"stale checkpoint lock {path} taken over: {reason} (left by a killed run)")
        elif text and holder is None:
            log(f"stale checkpoint lock {path} taken over: it names no holder (left by a killed run)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(asdict(here)) + "\n").encode(), 0)
        os.fsync(fd)
        try:
            yield here
        finally:
            path.unlink(missing_ok=True)  # before the flock goes: a waiting run opens a new file
    finally:
        os.close(fd)
