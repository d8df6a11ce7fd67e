"""Resuming a killed ``train`` stage: the training state saved after every epoch (the one checkpoint
format), the key of its checkpoint folder, and the clean-up of what a killed run left behind."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.search.probmodel import (
    ProbModel,
)
from pipeline.train.config import TrainConfig


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


def key_inputs(data: Path, graded: Path, profile: Path, models: Path, k: int,
               teacher: Path | None) -> list[Path]:
    """The input files and folders module k's result depends on (hashed into its checkpoint key): the
    training images and metadata, its curriculum, the cost model, the frozen modules 1..k-1 (trained
    and selected), and the distillation teacher's baselines directory when it is read."""
    return [data / "train.npz", data / "meta.json", graded / f"m{k}.txt", profile,
            *(models / f"m{j}" / part for j in range(1, k) for part in ("train", "select")),
            *([teacher] if teacher is not None else [])]


def checkpoint_cache(root: Path, name: str, key: str) -> Path:
    """``<root>/.cache/train/<name>-<key>``: outside the stage's DVC output (which ``dvc repro`` deletes
    before running the stage), one folder per key."""
    return Path(root) / ".cache" / "train" / f"{name}-{key}"


def clean_stale_temporaries(module_dir: Path) -> list[Path]:
    """Remove ``<module_dir>/.train.*`` folders that a killed run's atomic write left behind."""
    stale = sorted(module_dir.glob(".train.*")) if module_dir.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def clean_stale_checkpoints(cache: Path, name: str) -> list[Path]:
    """Remove the ``<name>-*`` folders beside ``cache`` but ``cache`` itself: checkpoints of inputs or code
    that changed since a killed run, which can never be resumed."""
    stale = [p for p in sorted(cache.parent.glob(f"{name}-*")) if p != Path(cache)] if cache.parent.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def _log(message: str) -> None:
    print(message, flush=True)


def prepare_checkpoints(root: Path, module_dir: Path, name: str, key: str, *, clean: bool = True,
                        log: Callable[[str], None] = _log) -> Path:
    """Module ``name``'s checkpoint folder for ``key`` (:func:`checkpoint_cache`). With ``clean`` (rank 0
    only: the others just need the path), first removes what killed runs left, saying so: stale
    temporaries in ``module_dir`` (the folder of its outputs), checkpoints of other keys than ``key``; and
    says so when a checkpoint there is resumed."""
    cache = checkpoint_cache(root, name, key)
    if clean:
        for path in clean_stale_temporaries(module_dir):
            log(f"train@{name}: removed {path} (left by a killed run)")
        for stale in clean_stale_checkpoints(cache, name):
            log(f"train@{name}: removed stale checkpoints {stale}")
        if any(cache.glob("epoch_*.pt")):
            log(f"train@{name}: resuming from the checkpoint in {cache}")
    return cache


def discard_checkpoints(cache: Path) -> None:
    """Delete a checkpoint folder once the stage succeeded (its output is committed)."""
    shutil.rmtree(cache, ignore_errors=True)


_STATE_NAME = "epoch_{:04d}.pt"


def _config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


def save_training_state(directory: str | os.PathLike[str], epoch: int, module: nn.Module,
                        optimizer: torch.optim.Optimizer, cfg: TrainConfig, rng: np.random.Generator,
                        prob_model: ProbModel | None, history: list[dict[str, Any]],
                        iterations: list[dict[str, Any]]) -> Path:
    """Everything that decides the rest of training after ``epoch``: weights (with BatchNorm
    statistics), optimizer (momentum buffers, param-group LRs), P(i) as its exact float64 table,
    the arch-pick numpy generator, torch's (CPU and CUDA), numpy's legacy and python's global RNGs,
    the history so far and the config it belongs to. The LR schedule and the data order are pure
    functions of (config, epoch, step), so the epoch fixes them. Written to a temporary file, then
    ``os.replace``: a kill leaves either the previous checkpoint or the new one, never half of one.
    Older checkpoints are then removed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": 1,
        "epoch": int(epoch),
        "config": _config_dict(cfg),
        "state_dict": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "prob_model": None if prob_model is None else [p.detach().cpu().clone() for p in prob_model.table],
        "rng": {
            "arch_picks": repr(rng.bit_generator.state),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy_global": _numpy_global_state(),
            "python": repr(random.getstate()),
        },
        "history": history,
        "iterations": iterations,
    }
    final = directory / _STATE_NAME.format(epoch)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    torch.save(payload, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    for old in directory.glob("epoch_*.pt"):
        if old != final:
            old.unlink(missing_ok=True)
    return final


def _numpy_global_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _numpy_global_from(d: Mapping[str, Any]) -> tuple[Any, ...]:
    return (d["name"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["gauss"])


def _literal(text: str) -> Any:
    import ast

    return ast.literal_eval(text)


def restore_training_state(directory: str | os.PathLike[str], module: nn.Module,
                           optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                           rng: np.random.Generator) -> dict[str, Any] | None:
    """Load the newest readable checkpoint of ``cfg`` in ``directory`` into ``module``, ``optimizer``,
    ``rng`` and the global RNGs; returns its ``epoch``, ``history``, ``iterations`` and ``prob_model``
    (the list of P's tensors, or None), or None when there is none (fresh start). Unreadable or
    foreign checkpoints (another config, a half-written temp file) are skipped with a warning."""
    directory = Path(directory)
    for stale in directory.glob(".epoch_*.tmp"):
        stale.unlink(missing_ok=True)
    candidates = sorted(glob.glob(str(directory / "epoch_*.pt")), reverse=True)
    for path in candidates:
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
            if payload.get("config") != _config_dict(cfg) or not 1 <= payload["epoch"] <= cfg.epochs:
                raise ValueError("written for another config")
            module.load_state_dict(payload["state_dict"])
            optimizer.load_state_dict(payload["optimizer"])
            states = payload["rng"]
            arch_state = _literal(states["arch_picks"])
            numpy_state = _numpy_global_from(states["numpy_global"])
            python_state = _literal(states["python"])
        except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint: fall back to an older one
            warnings.warn(f"ignoring checkpoint {path}: {exc}", stacklevel=2)
            continue
        rng.bit_generator.state = arch_state
        torch.set_rng_state(states["torch"])
        if states["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
        np.random.set_state(numpy_state)
        random.setstate(python_state)
        return {"epoch": int(payload["epoch"]), "history": list(payload["history"]),
                "iterations": list(payload["iterations"]), "prob_model": payload["prob_model"]}
    return None
