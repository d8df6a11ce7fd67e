"""What register reads off evaluate's metrics (docs/DESIGN.md 'Stages and workflows'): which model
shipped, its gate figures and curve, whether evaluate found it dominated, and the version's lineage
tags."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.registry.lineage import input_hashes, lineage_tags
from pipeline.registry.register import GATE_METRICS, curve_points


def repo_name(path: Path, root: Path) -> str:
    """``path`` as dvc.yaml names it: relative to the repository root when inside it."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def dominated_veto(evaluated: Mapping[str, Any]) -> str | None:
    """Why the version may not be champion: evaluate read it dominated on test (``shipped``), or None."""
    shipped = evaluated.get("shipped") or {}
    if not shipped.get("dominated"):
        return None
    return f"dominated on test by {', '.join(shipped['dominated_by'])}: {shipped['verdict']}"


def shipped_figures(evaluated: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[str]]:
    """The shipped model's name (the cascade or a plain CNN), its figures and the gate metrics they lack."""
    shipped = (evaluated.get("shipped") or {}).get("model", "cascade")
    figures = evaluated.get("cascade") if shipped == "cascade" else evaluated.get("shipped")
    figures = figures if isinstance(figures, dict) else {}
    return shipped, figures, [key for key in GATE_METRICS if not isinstance(figures.get(key), int | float)]


def gate_candidate(evaluated: Mapping[str, Any], shipped: str,
                   figures: Mapping[str, Any]) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """The gate's figures of the shipped model and its curve: a plain CNN has one operating point; the
    cascade's thresholds trace a curve."""
    candidate = {key: float(figures[key]) for key in GATE_METRICS}
    curve = curve_points(evaluated) if shipped == "cascade" else [(candidate["mean_macs"], candidate["accuracy"])]
    return candidate, curve


def version_tags(root: Path, lock: Path, candidate: Mapping[str, float], inputs: tuple[Path, ...],
                 params: Mapping[str, Any]) -> dict[str, str]:
    """The registered version's lineage tags: git commit, the DVC md5s of ``inputs`` and dvc.lock's hashes."""
    own = input_hashes({repo_name(path, root): path for path in inputs})
    return lineage_tags(root, lock, candidate, inputs=own, params=params)
