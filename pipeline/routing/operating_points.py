"""A model's operating points: named exit-threshold settings with their held-out accuracy and mean MACs,
from the accuracy-first point (the thresholds ``calibrate`` ships) down to exit 1 alone.

They are fitted on the held-out split ``calibrate`` reads (``calibration.calib_front``: the best held-out
accuracy at each budget, the same fit ``evaluate``'s budget curves read on test), written into the model's
manifest (``CascadeMeta.operating_points``) and so carried by the ONNX export and the registered model. A
server answers a request at one of them (a per-request cost ceiling, or the latency controller's choice):
docs/DESIGN.md 'Serving'. Names: ``accurate`` (the shipped thresholds), ``p1``..``pN`` (cheaper in order),
``exit1`` (every image answered at the first exit). Pure numpy / Python: no torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.routing.calibration import ALWAYS, NEVER, calib_front, simulate_thresholds

ACCURATE = "accurate"
EXIT1 = "exit1"
DEFAULT_COUNT = 6  # points between the two ends: enough steps for a controller, few enough to read
FRONT_BUDGETS = 41  # budgets calib_front spreads over the cost range (as evaluate's curves)


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


def _point(name: str, conf: np.ndarray, correct: np.ndarray, cum: np.ndarray,
           thresholds: Sequence[float]) -> OperatingPoint:
    accuracy, macs, _ = simulate_thresholds(conf, correct, cum, thresholds)
    return OperatingPoint(name, tuple(float(t) for t in thresholds), float(accuracy), float(macs))


def _spread(rows: list[dict[str, Any]], low: float, high: float, count: int) -> list[dict[str, Any]]:
    """At most ``count`` of ``rows`` (sorted by cost), the nearest in cost to evenly spaced targets
    strictly between ``low`` and ``high``, so the steps between points are about equal in MACs."""
    chosen: list[dict[str, Any]] = []
    for target in np.linspace(high, low, count + 2)[1:-1]:
        best = min(rows, key=lambda r: abs(r["calib_mean_macs"] - target), default=None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return sorted(chosen, key=lambda r: -r["calib_mean_macs"])


def fit_operating_points(conf: Any, correct: Any, cum_macs: Any, accurate: Sequence[float], *,
                         grid: int = 50, count: int = DEFAULT_COUNT) -> list[OperatingPoint]:
    """The operating points on these held-out arrays ((N, K) each, as ``calibration``'s functions take):
    ``accurate`` (the thresholds given), up to ``count`` cheaper points of the held-out front, and
    ``exit1``; costs strictly decreasing. A one-exit model has the single point ``accurate``."""
    conf, correct, cum = np.asarray(conf), np.asarray(correct).astype(bool), np.asarray(cum_macs, np.float64)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    top = _point(ACCURATE, conf, correct, cum, accurate)
    if conf.shape[1] == 1:
        return [top]
    bottom = _point(EXIT1, conf, correct, cum, [ALWAYS] + [NEVER] * (conf.shape[1] - 2))
    if bottom.mean_macs >= top.mean_macs:  # the shipped thresholds already answer everything at exit 1
        return [top]
    front = [r for r in calib_front(conf, correct, cum, grid=grid, points=FRONT_BUDGETS)
             if bottom.mean_macs < r["calib_mean_macs"] < top.mean_macs]
    middle = [_point(f"p{i}", conf, correct, cum, r["thresholds"])
              for i, r in enumerate(_spread(front, bottom.mean_macs, top.mean_macs, count), start=1)]
    return [top, *middle, bottom]


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
