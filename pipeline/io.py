"""Reading and writing artifacts. Every write goes to a temporary path first and is renamed into
place, so a failed stage never leaves a half-written output behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OWNER_FILE = ".owner-pid"  # inside each temporary folder: the pid of the process writing it
UNOWNED_GRACE_S = 60.0  # a folder without an owner file (an older writer's) is stale after this


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a reused pid reads alive: conservative)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def stale_temporaries(final: str | os.PathLike[str]) -> list[Path]:
    """The temporary siblings of ``final`` (``.<name>.*``) whose writer is gone: left by a killed
    process (SIGKILL skips every ``finally``). A live writer's folder is not stale; one without an
    owner file (written before owners were recorded) is stale once it is ``UNOWNED_GRACE_S`` old."""
    final = Path(final)
    out = []
    for tmp in sorted(final.parent.glob(f".{final.name}.*")) if final.parent.is_dir() else []:
        owner = tmp / OWNER_FILE
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            pid = None
        unowned_and_old = pid is None and time.time() - tmp.stat().st_mtime > UNOWNED_GRACE_S
        if tmp.is_dir() and (unowned_and_old or (pid is not None and not process_alive(pid))):
            out.append(tmp)
    return out


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str], *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; rename it onto ``final`` only if the block succeeds.
    Temporaries of ``final`` that a killed writer left behind are removed first, so they never reach
    a DVC hash of the folder around them."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_temporaries(final):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    (tmp / OWNER_FILE).write_text(str(os.getpid()))
    target = tmp / final.name
    if is_dir:
        target.mkdir()
    try:
        yield target
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        elif final.exists() or final.is_symlink():
            final.unlink()
        os.replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text())


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@dataclass(frozen=True)
class Split:
    """One data split: images ``(N, C, H, W)`` uint8, integer labels and stable string ids."""

    name: str
    images: np.ndarray
    labels: np.ndarray
    ids: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.images)
        if self.images.ndim != 4 or self.images.dtype != np.uint8:
            raise ValueError(f"split {self.name!r}: images must be uint8 (N, C, H, W), got "
                             f"{self.images.dtype} {self.images.shape}")
        if len(self.labels) != n or len(self.ids) != n:
            raise ValueError(f"split {self.name!r}: {n} images, {len(self.labels)} labels, {len(self.ids)} ids")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray, name: str | None = None) -> Split:
        return Split(name or self.name, self.images[index], self.labels[index], self.ids[index])


def save_split(path: Path, split: Split) -> None:
    """Write one split as an uncompressed ``.npz`` (fast to load, and DVC hashes it once)."""
    np.savez(path, images=split.images, labels=split.labels.astype(np.int64), ids=split.ids.astype(str))


def load_split(directory: str | os.PathLike[str], name: str) -> Split:
    path = Path(directory) / f"{name}.npz"
    if not path.exists():
        raise FileNotFoundError(f"split file {path} is missing; run the ingest stage first")
    try:
        with np.load(path, allow_pickle=False) as z:
            return Split(name, z["images"], z["labels"].astype(np.int64), z["ids"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"split file {path} is unreadable or truncated: {exc}") from exc


HELD_OUT = ("pooled", "calib")  # calibrate.held_out: route + calib, or calib alone


def load_held_out(directory: str | os.PathLike[str], which: str = "pooled") -> Split:
    """The images operating points are fitted on: ``calib``, or (``pooled``) ``route`` and ``calib``
    together, both held out from module training, so a small data set's thresholds rest on twice the
    images. Named ``held_out`` when pooled."""
    if which not in HELD_OUT:
        raise ValueError(f"held-out set must be one of {HELD_OUT}, got {which!r}")
    if which == "calib":
        return load_split(directory, "calib")
    route, calib = load_split(directory, "route"), load_split(directory, "calib")
    return Split("held_out", np.concatenate([route.images, calib.images]),
                 np.concatenate([route.labels, calib.labels]), np.concatenate([route.ids, calib.ids]))


def array_sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def curriculum_index(ids: np.ndarray, wanted: list[str]) -> np.ndarray:
    """Row index into ``ids`` of every line of a curriculum id list, repeats kept (a repeated id is
    weighted), blank lines skipped. An id that is not in ``ids`` is an error naming it."""
    position = {str(v): i for i, v in enumerate(ids)}
    lines = [line for line in wanted if line.strip()]
    missing = [line for line in lines if line not in position]
    if missing:
        raise ValueError(f"curriculum list names {len(missing)} id(s) not in the training split, e.g. {missing[:3]}")
    return np.asarray([position[line] for line in lines], dtype=np.int64)
