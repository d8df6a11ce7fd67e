"""Admission by deadline (pure logic; the guard and the worker feed it, docs/DESIGN.md 'Serving').

A request with a deadline (its own ``deadline_ms`` / ``X-Deadline-Ms``, else the server's ``--p99-ms``)
is refused at once (429) when its answer is predicted to come too late even at the operating point the
server can fall back to (the cheapest where the latency controller can move, else the point in use):
the work in flight ahead of it and its own batch, at the batch time measured for that point and size.
Operating points move first (the controller), shedding second: refusing on the cheapest point's time
refuses only what no move of the points could answer in time.

The estimates: per operating point and batch size (powers of two of images), a running mean of the time a
batch costs the serving process (engine time plus the time outside the engine while requests waited:
decoding and encoding, which a cheaper point does not shorten). A size between measured sizes is read on
the straight line between them, one past the largest measured scales with its images, one below the
smallest costs what the smallest did (a batch costs at least its fixed part). A point never measured is
read from a measured one scaled by the points' held-out MACs: time per image falls less than MACs do
(docs/DESIGN.md 'Serving'), so this errs towards admitting. With no measurement at all nothing is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.routing.operating_points import OperatingPoint

ALPHA = 0.2  # weight of a new batch in a running mean: follows a change within ~10 batches
SHED_ONLY_SPREAD = 0.10  # points whose costs differ by no more than this leave the target only shedding
SHED_ONLY_NOTE = "the target can only shed"


def size_bucket(images: int) -> int:
    """The batch-size bucket of ``images`` (>= 1): 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ..."""
    return max(0, math.ceil(math.log2(max(1, images))))


@dataclass
class ServiceEstimates:
    """Running means of a batch's cost per point and size bucket: ``table[point][bucket] = (seconds,
    images)`` (the mean images of the bucket's batches, where the seconds are read)."""

    table: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    alpha: float = ALPHA

    def observe(self, point: str, images: int, seconds: float) -> None:
        """One batch of ``images`` at ``point`` that cost ``seconds``."""
        if images < 1 or not (math.isfinite(seconds) and seconds >= 0):
            return
        buckets = self.table.setdefault(point, {})
        old = buckets.get(size_bucket(images))
        if old is None:
            buckets[size_bucket(images)] = (seconds, float(images))
        else:
            a = self.alpha
            buckets[size_bucket(images)] = ((1 - a) * old[0] + a * seconds, (1 - a) * old[1] + a * images)

    def measured(self, point: str, images: float) -> float | None:
        """A batch of ``images`` at ``point`` from that point's own measurements, or None."""
        rows = sorted(self.table.get(point, {}).values(), key=lambda r: r[1])
        if not rows:
            return None
        if images <= rows[0][1]:
            return rows[0][0]
        for (s0, n0), (s1, n1) in zip(rows, rows[1:], strict=False):
            if images <= n1:
                return s0 + (s1 - s0) * (images - n0) / max(n1 - n0, 1e-9)
        seconds, n = rows[-1]
        return seconds * images / n

    def batch_seconds(self, point: str, images: float, costs: Mapping[str, float | None] | None = None
                      ) -> float | None:
        """A batch of ``images`` at ``point``: measured, else scaled from a measured point by the points'
        MACs (``costs``; the lowest such reading), else None."""
        own = self.measured(point, images)
        if own is not None or not costs or not costs.get(point):
            return own
        scaled = [seconds * float(costs[point]) / float(costs[other])
                  for other in self.table if costs.get(other)
                  for seconds in [self.measured(other, images)] if seconds is not None]
        return min(scaled, default=None)

    def to_json(self) -> dict[str, Any]:
        return {p: {str(b): list(v) for b, v in buckets.items()} for p, buckets in self.table.items()}

    @classmethod
    def from_json(cls, data: Any) -> ServiceEstimates:
        """The estimates :meth:`to_json` wrote; what does not read as one is left out."""
        table: dict[str, dict[int, tuple[float, float]]] = {}
        for point, buckets in (data.items() if isinstance(data, dict) else ()):
            pairs = buckets.items() if isinstance(buckets, dict) else ()
            rows = {int(b): (float(v[0]), float(v[1])) for b, v in pairs if str(b).isdigit() and _pair(v)}
            if rows:
                table[str(point)] = rows
        return cls(table)


def _pair(value: Any) -> bool:
    """A (seconds >= 0, images > 0) pair as JSON writes it."""
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
            and value[0] >= 0 and value[1] > 0)


@dataclass(frozen=True)
class Outlook:
    """What the serving process publishes for admission: its estimates, the point to predict at, the
    points' costs (held-out mean MACs) and its batch cap (requests per batch)."""

    estimates: ServiceEstimates
    point: str
    costs: Mapping[str, float | None]
    max_batch: int

    def to_json(self) -> dict[str, Any]:
        return {"estimates": self.estimates.to_json(), "point": self.point, "costs": dict(self.costs),
                "max_batch": self.max_batch}

    @classmethod
    def from_json(cls, data: Any) -> Outlook | None:
        if not isinstance(data, dict) or not isinstance(data.get("point"), str):
            return None
        costs = data.get("costs") if isinstance(data.get("costs"), dict) else {}
        batch = data.get("max_batch")
        return cls(ServiceEstimates.from_json(data.get("estimates")), data["point"],
                   {str(k): (float(v) if isinstance(v, int | float) else None) for k, v in costs.items()},
                   batch if isinstance(batch, int) and batch >= 1 else 1)


def predict_seconds(outlook: Outlook, ahead_requests: int, ahead_images: int, own_images: int) -> float | None:
    """Seconds until a request of ``own_images`` is answered behind ``ahead_requests`` requests holding
    ``ahead_images`` images (in flight, the batch running included), at the outlook's point: the batches
    that drain them and its own, each of the mean images, at the measured batch time; None unmeasured."""
    batches = math.ceil((max(0, ahead_requests) + 1) / outlook.max_batch)
    per_batch = (max(0, ahead_images) + max(1, own_images)) / batches
    seconds = outlook.estimates.batch_seconds(outlook.point, per_batch, outlook.costs)
    return None if seconds is None else batches * seconds


@dataclass
class Correction:
    """A running offset, in seconds, added to the batch-time prediction and learnt from the answers'
    measured latency: the HTTP process's own work, LitServe's queues and a busy host are not in the batches'
    times (measured with `hey`, 64 clients, three quarters of an answer's latency, docs/DESIGN.md 'Serving').
    Added, not multiplied: that time does not grow with the engine's queue, and a factor learnt while the
    front was busy and the engine's queue empty (a few ms predicted, 40 measured: x8) priced every queued
    request past the deadline, refused everything, and kept the front busy refusing (docs/RESULTS.md
    'Under a load step')."""

    offset: float = 0.0
    alpha: float = 0.05  # a new answer's weight: the offset follows a change within ~50 answers
    step: float = 0.5  # at most this much lateness (seconds) an answer brings: a pause of the host moves it little
    bounds: tuple[float, float] = (-1.0, 5.0)

    def update(self, measured_s: float, predicted_s: float) -> None:
        """One answer measured ``measured_s`` against ``predicted_s`` (the corrected prediction it was
        admitted on): the error moves the offset."""
        if not (math.isfinite(measured_s) and math.isfinite(predicted_s)) or measured_s < 0 or predicted_s < 0:
            return
        error = min(self.step, measured_s - predicted_s)  # an early answer is never a pause: taken whole
        low, high = self.bounds
        self.offset = min(high, max(low, self.offset + self.alpha * error))

    def apply(self, predicted_s: float) -> float:
        """A raw prediction, corrected (never below zero)."""
        return max(0.0, predicted_s + self.offset)


@dataclass(frozen=True)
class Verdict:
    """Admit or refuse a request: its predicted seconds to an answer (None: not predicted), its deadline
    (seconds; None: none) and, refused, the whole seconds after which a retry may fit (``Retry-After``)."""

    admit: bool
    predicted_s: float | None
    deadline_s: float | None
    retry_after_s: int = 0


# while everything is refused, one request this often is admitted as a probe (see judge): at one a second an
# offset inflated by a step's first crowded second refused everything for 5 s (docs/RESULTS.md 'Under a
# load step'); ten a second cost at most ten requests' engine time
PROBE_S = 0.1


def judge(predicted_s: float | None, deadline_s: float | None, waited_s: float = 0.0, *,
          probe: bool = False) -> Verdict:
    """Refuse where ``waited_s`` already spent plus ``predicted_s`` to come passes ``deadline_s``; admit
    where there is no deadline or no prediction (nothing measured yet: no evidence to refuse on), and a
    ``probe``: only answers re-measure the correction, so without one request let through now and then (a
    circuit breaker's half-open probe) a prediction inflated once would refuse every later request."""
    if deadline_s is None or predicted_s is None:
        return Verdict(True, predicted_s, deadline_s)
    total = waited_s + predicted_s
    if total <= deadline_s or probe:
        return Verdict(True, total, deadline_s)
    return Verdict(False, total, deadline_s, max(1, math.ceil(total - deadline_s)))


def refusal(verdict: Verdict, point: str) -> dict[str, Any]:
    """The JSON body of a refusal: why, in words and in numbers (ms)."""
    predicted, deadline = (round(1e3 * float(s or 0.0), 1) for s in (verdict.predicted_s, verdict.deadline_s))
    return {"error_code": "DEADLINE",
            "message": f"predicted {predicted:g} ms to an answer even at operating point {point!r}, over the "
                       f"deadline of {deadline:g} ms: refused rather than queued to miss; retry after "
                       f"{verdict.retry_after_s} s",
            "predicted_ms": predicted, "deadline_ms": deadline, "retry_after_s": verdict.retry_after_s}


def fallback_point(points: Sequence[OperatingPoint], current: OperatingPoint, controlled: bool) -> OperatingPoint:
    """The point admission predicts at: with a controller, the cheapest it can move to (the points run from
    the accuracy-first one to the cheapest); without, the point in use."""
    return points[-1] if controlled and points else current


def costs_spread(points: Sequence[OperatingPoint]) -> float | None:
    """How much more the costliest point costs than the cheapest (0.25: 25% more), from held-out mean MACs;
    None where fewer than two points carry a cost."""
    costs = [p.mean_macs for p in points if p.mean_macs]
    if len(costs) < 2:
        return None
    return max(costs) / min(costs) - 1


def can_only_shed(points: Sequence[OperatingPoint], spread: float = SHED_ONLY_SPREAD) -> bool:
    """Whether a latency target can only shed: the points' costs differ by no more than ``spread``, so a move
    along them frees almost nothing."""
    got = costs_spread(points)
    return got is not None and got <= spread


def shed_note(points: Sequence[OperatingPoint]) -> str:
    """A sentence for ``cascade info`` and the server's start line where the target can only shed (one
    point with a cost, or points that cost alike: :func:`can_only_shed`); else ''."""
    if points and sum(p.mean_macs is not None for p in points) < 2:
        return (f"{SHED_ONLY_NOTE}: the model carries {len(points)} operating point(s), fewer than two with a "
                f"held-out cost, so there is no cheaper point to move to")
    if not can_only_shed(points):
        return ""
    return (f"{SHED_ONLY_NOTE}: the operating points' costs differ by {100 * (costs_spread(points) or 0):.0f}% "
            f"(mean MACs), so moving between them frees almost nothing")
