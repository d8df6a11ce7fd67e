"""A stage process's lifetime (docs/DESIGN.md 'Stages and workflows'): a stage that ``dvc repro`` runs
ends when ``dvc`` does, so a killed run leaves no training process behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHELLS = ("sh", "dash", "bash", "zsh")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def die_with_runner() -> None:
    """End this stage process when the process that ran it (``dvc repro``) dies, so a killed ``dvc``
    leaves no training process behind. The kernel signals us when our parent dies
    (``PR_SET_PDEATHSIG``); when the parent is the shell DVC runs the command in, a daemon thread also
    watches the shell's parent. Linux only; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    import threading
    import time

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    watched = parent
    if _comm(parent) in SHELLS:
        try:  # the shell's own parent: field 4 of /proc/<pid>/stat, after the parenthesised name
            watched = int(Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return
    if watched <= 1:
        return

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(watched, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            except PermissionError:
                pass

    threading.Thread(target=watch, name="die-with-runner", daemon=True).start()
