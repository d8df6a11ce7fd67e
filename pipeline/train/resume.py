"""Resuming a killed ``train`` stage: the key of its checkpoint folder and the clean-up of what a
killed run left behind. The training state itself is saved and restored by ``pipeline.train.loop``."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from pipeline.train.loop import TrainConfig


def _files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(q for q in path.rglob("*") if q.is_file() and "__pycache__" not in q.parts))
        elif path.is_file():
            out.append(path)
    return out


def checkpoint_key(k: int, cfg: TrainConfig, spec: dict, seed: int, inputs: Iterable[Path],
                   code: Iterable[Path] = ()) -> str:
    """sha256 of what the stage's result depends on: module index, resolved config, module spec, seed,
    each input file's path and content, each code file's content.

    Contents, not modification times: ``ingest`` is always re-run by ``dvc repro`` and rewrites identical
    data with new mtimes, so an mtime key would never let a killed ``train`` stage resume (hashing the
    ~50 MB of inputs takes a fraction of a second)."""
    h = hashlib.sha256()
    h.update(json.dumps({"module": k, "train": cfg.__dict__, "spec": spec, "seed": seed}, sort_keys=True,
                        default=str).encode())
    for path in _files(inputs):
        h.update(f"\0in {path.resolve()} ".encode() + _file_digest(path))
    for path in _files(code):
        h.update(f"\0code {path.as_posix()} ".encode() + _file_digest(path))
    return h.hexdigest()


def _file_digest(path: Path, chunk: int = 1 << 20) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.digest()


def clean_stale_temporaries(module_dir: Path) -> list[Path]:
    """Remove ``<module_dir>/.train.*`` folders that a killed run's atomic write left behind."""
    stale = sorted(module_dir.glob(".train.*")) if module_dir.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale
