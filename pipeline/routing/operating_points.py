"""A model's operating points: named exit-threshold settings with their held-out accuracy and mean MACs,
from the accuracy-first point (the thresholds ``calibrate`` ships) down to exit 1 alone.

They are fitted on the held-out split ``calibrate`` reads (``fit.fit_operating_points``), written into the
model's manifest (``CascadeMeta.operating_points``) and so carried by the ONNX export and the registered
model. This module is their format and choice only (no fitting, nothing heavy imported: the model format
and the Triton backend read it). A
server answers a request at one of them (a per-request cost ceiling, or the latency controller's choice):
docs/DESIGN.md 'Serving'. Names: ``accurate`` (the shipped thresholds), ``p1``..``pN`` (cheaper in order),
``exit1`` (every image answered at the first exit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ACCURATE = "accurate"
EXIT1 = "exit1"


@dataclass(frozen=True)
class OperatingPoint:
    """One exit-threshold setting: ``thresholds`` (K-1), and on the held-out split its ``accuracy`` and
    ``mean_macs`` (the point's cost; None for a model calibrated before points were recorded)."""

    name: str
    thresholds: tuple[float, ...]
    accuracy: float | None = None
    mean_macs: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "thresholds": list(self.thresholds), "accuracy": self.accuracy,
                "mean_macs": self.mean_macs}


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def parse_points(items: Any, n_exits: int | None = None) -> tuple[OperatingPoint, ...]:
    """Points from their JSON form (a manifest's ``operating_points``); a ValueError naming the bad item.
    With ``n_exits``, each must hold ``n_exits - 1`` thresholds."""
    if not isinstance(items, list | tuple):
        raise ValueError(f"operating_points must be a list, got {type(items).__name__}")
    points = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError(f"operating point {i} needs a non-empty string 'name', got {item!r}")
        where = f"operating point {item['name']!r}"
        raw = item.get("thresholds")
        if not isinstance(raw, list | tuple) or (n_exits is not None and len(raw) != n_exits - 1):
            raise ValueError(f"{where}: thresholds must be a list of {n_exits and n_exits - 1} numbers, got {raw!r}")
        thresholds = tuple(_number(t, f"{where}: a threshold") for t in raw)
        points.append(OperatingPoint(item["name"], thresholds, _number(item.get("accuracy"), f"{where}: accuracy"),
                                     _number(item.get("mean_macs"), f"{where}: mean_macs")))
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        raise ValueError(f"operating point names repeat: {names}")
    return tuple(points)


def point_by_name(points: Sequence[OperatingPoint], name: str) -> OperatingPoint:
    for point in points:
        if point.name == name:
            return point
    raise ValueError(f"no operating point named {name!r}; this model has {', '.join(p.name for p in points)}")


def within(points: Sequence[OperatingPoint], ceiling_macs: float) -> OperatingPoint:
    """The most accurate point whose held-out mean MACs are at most ``ceiling_macs`` (the cheaper on a
    tie), or a ValueError saying what the cheapest point costs."""
    costed = [p for p in points if p.mean_macs is not None and p.accuracy is not None]
    if not costed:
        raise ValueError("this model carries no held-out costs for its operating points (calibrated before "
                         "they were recorded): ask for a point by name")
    fit = [p for p in costed if p.mean_macs <= ceiling_macs]
    if not fit:
        cheapest = min(costed, key=lambda p: p.mean_macs)
        raise ValueError(f"no operating point costs at most {ceiling_macs:,.0f} MACs per image; the cheapest, "
                         f"{cheapest.name!r}, costs {cheapest.mean_macs:,.0f}")
    return max(fit, key=lambda p: (p.accuracy, -p.mean_macs))


def choose_point(points: Sequence[OperatingPoint], budget: str | float) -> OperatingPoint:
    """The point a request's budget asks for: a point's name, or a ceiling in MACs per image."""
    if isinstance(budget, str):
        return point_by_name(points, budget)
    return within(points, float(budget))
