"""A registered version's lineage as MLflow tags: the DVC md5 of the register stage's own inputs
(``run.*``), what dvc.lock says of the data, model and params (``dvc.*``), the test metrics
(``test.*``) and the git commit. Read back by the gate (:func:`metrics_from_tags`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pipeline.registry import tracking

METRIC_TAG_PREFIX = "test."
LINEAGE_OUTS = ("data/prepared", "data/graded", "models/cascade")
_TAG_UNSAFE = re.compile(r"[^\w./ :-]")

LINEAGE_SOURCE = ("run.*: hashed by register from its own inputs when it ran (DVC's md5: a file's bytes, "
                  "a directory's .dir listing); dvc.*: read from dvc.lock before register's own entry is "
                  "written (each stage's latest completed run; dvc.params.register is the previous "
                  "register run's); test.*: evaluate's metrics; git_commit: the working tree")


def _tag_key(text: str) -> str:
    return _TAG_UNSAFE.sub(".", text)  # MLflow tag keys allow letters, digits and _ - . / : space


def _params_hash(params: Any) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _md5_file(path: Path) -> str:
    digest = hashlib.md5()  # noqa: S324 - DVC's content hash, not a security measure
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dvc_md5(path: str | os.PathLike[str]) -> str:
    """The md5 ``dvc.lock`` records for ``path``: of a file's bytes; of a directory, the md5 of the
    JSON list of its files (``md5``, ``relpath``, sorted by path) with the suffix ``.dir``."""
    path = Path(path)
    if path.is_file():
        return _md5_file(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist: cannot hash it for lineage")
    entries = [{"md5": _md5_file(f), "relpath": f.relative_to(path).as_posix()}
               for f in sorted(path.rglob("*")) if f.is_file()]
    entries.sort(key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"  # noqa: S324


def input_hashes(inputs: Mapping[str, str | os.PathLike[str]]) -> dict[str, str]:
    """``{name: dvc_md5(path)}`` for a run's own inputs (name: the path as ``dvc.yaml`` spells it)."""
    return {name: dvc_md5(path) for name, path in inputs.items()}


def metric_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    return {f"{METRIC_TAG_PREFIX}{k}": repr(float(v)) for k, v in metrics.items()}


def metrics_from_tags(tags: Mapping[str, str]) -> dict[str, float]:
    """The test metrics a version was tagged with (see :func:`metric_tags`); unparsable ones are left out."""
    out = {}
    for key, value in tags.items():
        if key.startswith(METRIC_TAG_PREFIX):
            try:
                out[key[len(METRIC_TAG_PREFIX):]] = float(value)
            except ValueError:
                continue
    return out


def lineage_tags(root: str | os.PathLike[str], dvc_lock_path: str | os.PathLike[str],
                 metrics: Mapping[str, float], outs: Sequence[str] = LINEAGE_OUTS, *,
                 inputs: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None,
                 stage: str = "register") -> dict[str, str]:
    """Tags that trace a version back to its commit, data and params.

    - ``git_commit``; ``test.<metric>``: the test metrics;
    - ``run.in.<name>``: ``inputs`` (name -> DVC md5, see :func:`input_hashes`), hashed by this run;
      ``run.params.<stage>``: a hash of ``params`` (shaped as ``dvc.lock`` stores them, e.g.
      ``{"params.yaml": {"register": {...}}}``, so equal hashes mean equal params);
    - ``dvc.out.<path>`` / ``dvc.params.<stage>``: the ``dvc.lock`` md5 of each output in ``outs`` and
      a hash of each stage's params, as the lock held them when this run read it: a stage's own
      entry is written after it runs, so ``dvc.params.<stage>`` describes its previous run;
    - ``lineage.lock_agrees``: whether each input that the lock records as some stage's output has
      the md5 the lock gives it (``yes``, ``no: <names>``, or ``n/a``);
    - ``lineage.source``: where each group of values came from.
    """
    tags = {"git_commit": tracking.git_commit(root), "lineage.source": LINEAGE_SOURCE}
    hashed = dict(inputs or {})
    for name, md5 in hashed.items():
        tags[_tag_key(f"run.in.{name}")] = md5
    if params is not None:
        tags[_tag_key(f"run.params.{stage}")] = _params_hash(params)
    path = Path(dvc_lock_path)
    try:
        lock = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        lock = None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from None
    recorded: dict[str, str] = {}
    if not isinstance(lock, dict) or not isinstance(lock.get("stages"), dict):
        tags["dvc.lock"] = "missing"
    else:
        tags["dvc.lock"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        for name, entry in sorted(lock["stages"].items()):
            if not isinstance(entry, dict):
                continue
            for out in entry.get("outs") or []:
                if isinstance(out, dict) and "md5" in out:
                    recorded[str(out.get("path"))] = str(out["md5"])
                    if out.get("path") in outs:
                        tags[_tag_key(f"dvc.out.{out['path']}")] = str(out["md5"])
            if entry.get("params"):
                tags[_tag_key(f"dvc.params.{name}")] = _params_hash(entry["params"])
    comparable = [name for name in hashed if name in recorded]
    stale = [name for name in comparable if recorded[name] != hashed[name]]
    tags["lineage.lock_agrees"] = ("n/a" if not comparable else f"no: {', '.join(stale)}" if stale else "yes")
    tags.update(metric_tags(metrics))
    return tags
