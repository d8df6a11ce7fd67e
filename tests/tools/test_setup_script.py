"""scripts/setup.sh on a machine without room for the virtualenv: a clear error naming the need and the
place, before pip starts (and fills the disk half-way through)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _debian_packages_in() -> bool:
    """The set-up installs these first; without them the script would run apt-get before the check."""
    return (Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file()
            and shutil.which("hey") is not None
            and (bool(list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))) or shutil.which("initdb") is not None))


@pytest.mark.skipif(not _debian_packages_in(), reason="runs after the set-up's Debian packages are in")
def test_too_little_room_for_the_virtualenv_stops_before_pip(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv_bin, fake = repo / ".venv" / "bin", tmp_path / "bin"
    venv_bin.mkdir(parents=True)
    fake.mkdir()
    pip_ran = tmp_path / "pip-ran"
    for path, body in ((venv_bin / "python", "exit 1"),  # a virtualenv without torch
                       (venv_bin / "pip", f"touch {pip_ran}"),
                       (fake / "df", "echo 'Filesystem 1024-blocks Used Available Capacity Mounted'; "
                                     "echo '/dev/x 100 99 2048 99% /'")):  # 2 MB free
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    env.pop("CI", None)
    result = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"setup: error: 2 MB free on the file system of {repo}/.venv" in result.stderr, result.stderr
    assert "needs about 8 GB" in result.stderr
    assert not pip_ran.exists(), "pip ran although there was no room"
