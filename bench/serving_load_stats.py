"""The pure parts of ``bench/serving_load.py``: the load steps, hey's per-request CSV bucketed per second,
the operating point in use per second from ``/metrics`` scrapes, the labelled probe's accuracy beside the
held-out accuracy of the points it was answered at, and the time back at the accuracy-first point after
the load falls (docs/DESIGN.md 'Serving'). No I/O here: the bench feeds these and writes what they return.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.serving import summary

ACCURATE = "accurate"  # the accuracy-first point (pipeline.routing.operating_points.ACCURATE)


@dataclass(frozen=True)
class Step:
    """One phase of the load: ``clients`` hey clients for ``seconds``, each sending at most ``qps`` requests
    per second (None: as fast as answers come, a closed loop)."""

    clients: int
    seconds: float
    qps: float | None = None

    @property
    def load(self) -> tuple[bool, float]:
        """For ordering steps by the load they offer: any closed-loop step above every rate-limited one,
        then by clients (closed loop) or clients x qps (requests per second)."""
        return (self.qps is None, self.clients * (self.qps or 1.0))


@dataclass(frozen=True)
class HeyRow:
    """One request hey sent: its start (seconds since the run's start), latency (seconds), status."""

    start: float
    latency: float
    status: int


@dataclass(frozen=True)
class Scrape:
    """One read of ``/metrics``: when (seconds since the run's start), the point in use (None: no gauge
    at 1), the requests answered so far at each point (``cascade_requests_total{point}``) and the engine's
    seconds so far (``cascade_batch_seconds_sum``: its busy share per second tells whether the model or
    the HTTP front bounds the load)."""

    t: float
    point: str | None
    requests: Mapping[str, float]
    engine_s: float = 0.0


@dataclass(frozen=True)
class ProbeAnswer:
    """One answer the probe got: when (seconds since the run's start, at the answer), its status, the
    point it names, each image's exit and how many of its images were right."""

    t: float
    status: int
    point: str | None
    exits: tuple[int, ...]
    correct: int
    images: int


def parse_steps(text: str, max_clients: int = 1024) -> list[Step]:
    """``"16:20,128:20:2.5,16:20"`` (clients:seconds[:qps per client], comma-separated) -> steps; a
    ValueError naming the bad item."""
    steps = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"load step {item.strip()!r}: expected clients:seconds[:qps], e.g. 16:20 or 16:20:5")
        try:
            clients, seconds = int(parts[0]), float(parts[1])
            qps = float(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ValueError(f"load step {item.strip()!r}: clients must be an integer, seconds and qps "
                             f"numbers") from None
        if not 1 <= clients <= max_clients or not (math.isfinite(seconds) and seconds >= 1):
            raise ValueError(f"load step {item.strip()!r}: need 1 <= clients <= {max_clients} and seconds >= 1")
        if qps is not None and not (math.isfinite(qps) and qps > 0):
            raise ValueError(f"load step {item.strip()!r}: qps (requests per second per client) must be > 0")
        steps.append(Step(clients, seconds, qps))
    return steps


def phase_starts(steps: Sequence[Step]) -> list[float]:
    """Each step's nominal start (seconds since the run's start), the steps back to back."""
    out, t = [], 0.0
    for step in steps:
        out.append(t)
        t += step.seconds
    return out


def hey_rows(text: str, phase_start: float) -> list[HeyRow]:
    """hey's CSV (``-o csv``: response-time, ..., status-code, offset) -> rows whose start is the request's
    offset from hey's start plus ``phase_start`` (when hey was started, on the run's clock)."""
    return [HeyRow(phase_start + float(r["offset"]), float(r["response-time"]), int(r["status-code"]))
            for r in csv.DictReader(io.StringIO(text))]


def per_second(rows: Sequence[HeyRow], per_request: int, seconds: int) -> list[dict]:
    """For each whole second ``[s, s + 1)`` of the run (by the requests' start): answered images/s, p50/p99
    latency (ms) and non-200 answers, as ``bench.serving.summary`` counts a whole load."""
    buckets: list[list[HeyRow]] = [[] for _ in range(seconds)]
    for row in rows:
        if 0 <= row.start < seconds:
            buckets[int(row.start)].append(row)
    return [{"t": s, **summary([r.latency for r in b], [r.status for r in b], 1.0, per_request)}
            for s, b in enumerate(buckets)]


def points_per_second(scrapes: Sequence[Scrape], seconds: int) -> list[dict]:
    """For each whole second: the point in use most often among that second's scrapes (the later on a tie;
    None without a scrape) and the requests answered at each point during it (counter deltas between the
    last scrape before it and the last one inside it)."""
    ordered = sorted(scrapes, key=lambda s: s.t)
    out = []
    for s in range(seconds):
        inside = [x for x in ordered if s <= x.t < s + 1]
        before = [x for x in ordered if x.t < s]
        seen = Counter(x.point for x in inside if x.point is not None)
        point = max(seen, key=lambda p: (seen[p], max(x.t for x in inside if x.point == p))) if seen else None
        start = before[-1].requests if before else {}
        end = inside[-1].requests if inside else start
        delta = {p: round(end.get(p, 0.0) - start.get(p, 0.0)) for p in sorted(end)}
        busy = None
        if before and inside and inside[-1].t > before[-1].t:
            busy = round((inside[-1].engine_s - before[-1].engine_s) / (inside[-1].t - before[-1].t), 3)
        out.append({"t": s, "point": point, "requests_per_point": {p: n for p, n in delta.items() if n},
                    "engine_busy": busy})
    return out


def probe_accuracy(answers: Sequence[ProbeAnswer], held_out: Mapping[str, float | None]) -> dict:
    """The probe's answered images: accuracy and its standard error, each point's share of them, the
    held-out accuracy of those points weighted by those shares, and probe minus that (None where a point
    has no held-out figure or no image was answered)."""
    ok = [a for a in answers if a.status == 200]
    images = sum(a.images for a in ok)
    if not images:
        return {"images": 0, "accuracy": None, "se": None, "shares": {}, "held_out_weighted": None,
                "difference": None, "non_200": len(answers) - len(ok)}
    acc = sum(a.correct for a in ok) / images
    per_point: Counter[str] = Counter()
    for a in ok:
        per_point[a.point or "none"] += a.images
    shares = {p: n / images for p, n in sorted(per_point.items())}
    weighted = weighted_held_out(shares, held_out)
    return {"images": images, "accuracy": acc, "se": math.sqrt(acc * (1 - acc) / images), "shares": shares,
            "held_out_weighted": weighted, "difference": None if weighted is None else acc - weighted,
            "non_200": len(answers) - len(ok)}


def weighted_held_out(shares: Mapping[str, float], held_out: Mapping[str, float | None]) -> float | None:
    """sum(share * held-out accuracy) over the points used; None if one of them has no held-out figure."""
    if any(held_out.get(p) is None for p in shares):
        return None
    total = sum(shares.values())
    return sum(share * float(held_out[p]) for p, share in shares.items()) / total if total else None


def falls(steps: Sequence[Step], starts: Sequence[float]) -> list[tuple[float, float]]:
    """(when the load falls, when the next rise or the run's end comes) for each step offering less load
    than the one before (``Step.load``); ``starts``: the steps' starts and then the run's end, on the run's
    clock."""
    out = []
    for i in range(1, len(steps)):
        if steps[i].load < steps[i - 1].load:
            rise = next((j for j in range(i + 1, len(steps)) if steps[j].load > steps[j - 1].load), len(steps))
            out.append((starts[i], starts[rise]))
    return out


def recovery(scrapes: Sequence[Scrape], fall: float, end: float, accurate: str = ACCURATE) -> float | None:
    """Seconds from ``fall`` to the first scrape at ``accurate`` after it (before ``end``, the next rise or
    the run's end): 0 if the last scrape before the fall was already there; None if it did not come back."""
    ordered = sorted(scrapes, key=lambda s: s.t)
    before = [x for x in ordered if x.t <= fall]
    if before and before[-1].point == accurate:
        return 0.0
    for x in ordered:
        if fall < x.t < end and x.point == accurate:
            return round(x.t - fall, 3)
    return None


def phase_latency(rows: Sequence[HeyRow], seconds_rows: Sequence[dict], start: float, stop: float,
                  per_request: int, target_ms: float | None, skip: int = 2) -> dict:
    """A phase's pooled load figures (``bench.serving.summary``) and, after its first ``skip`` seconds, the
    worst per-second p99 of the answers (200s: a refusal's few ms would hide a late answer) and the seconds
    over ``target_ms``."""
    inside = [r for r in rows if start <= r.start < stop]
    out = summary([r.latency for r in inside], [r.status for r in inside], max(stop - start, 1e-9), per_request)
    late = [r for r in seconds_rows
            if start + skip <= r["t"] and r["t"] + 1 <= stop and r["p99_ok_ms"] is not None]
    out[f"worst_p99_ms_after_{skip}s"] = max((r["p99_ok_ms"] for r in late), default=None)
    if target_ms is not None:
        out["seconds_over_target"] = sum(r["p99_ok_ms"] > target_ms for r in late)
    return out


def seconds_rows(steps: Sequence[Step], starts: Sequence[float], rows: Sequence[HeyRow],
                 scrapes: Sequence[Scrape], answers: Sequence[ProbeAnswer], per_request: int) -> list[dict]:
    """One row per whole second of the run (the last partial one left out): its step's clients, hey's
    figures, the point in use and the requests per point, and the probe's answered images and right ones."""
    n = int(starts[-1])  # whole seconds only: a last partial one would read as a fall in images/s
    points = points_per_second(scrapes, n)
    out = []
    for load, point in zip(per_second(rows, per_request, n), points, strict=True):
        s = load["t"]
        phase = max((i for i in range(len(steps)) if starts[i] <= s), default=0)
        probed = [a for a in answers if s <= a.t < s + 1 and a.status == 200]
        out.append({**load, "clients": steps[phase].clients, "point": point["point"],
                    "requests_per_point": point["requests_per_point"], "engine_busy": point["engine_busy"],
                    "probe_images": sum(a.images for a in probed), "probe_correct": sum(a.correct for a in probed)})
    return out


def mode_report(steps: Sequence[Step], starts: Sequence[float], rows: Sequence[HeyRow], scrapes: Sequence[Scrape],
                answers: Sequence[ProbeAnswer], per_request: int, held_out: Mapping[str, float | None],
                target_ms: float | None) -> dict:
    """One server run: per-second rows, per-phase summaries (load, probe accuracy beside the held-out
    figure of the points used, the requests per point), the high-load step's probe accuracy (every step
    offering the most load) and the time back at the accuracy-first point after each fall.
    ``starts``: each step's start on the run's clock, then the run's end."""
    per_s = seconds_rows(steps, starts, rows, scrapes, answers, per_request)
    phases = []
    for i, step in enumerate(steps):
        a, b = starts[i], starts[i + 1]
        inside = [x for x in sorted(scrapes, key=lambda x: x.t) if a <= x.t < b]
        before = [x for x in scrapes if x.t < a]
        first = max(before, key=lambda x: x.t).requests if before else {}
        last = inside[-1].requests if inside else first
        busy = [r["engine_busy"] for r in per_s if a + 2 <= r["t"] < b - 1 and r["engine_busy"] is not None]
        phases.append({"clients": step.clients, "qps_per_client": step.qps, "seconds": step.seconds,
                       "start": round(a, 3), "end": round(b, 3),
                       "engine_busy": round(sum(busy) / len(busy), 3) if busy else None,
                       **phase_latency(rows, per_s, a, b, per_request, target_ms),
                       "probe": probe_accuracy([x for x in answers if a <= x.t < b], held_out),
                       "requests_per_point": {p: round(v - first.get(p, 0.0)) for p, v in sorted(last.items())
                                              if round(v - first.get(p, 0.0))}})
    top = max(s.load for s in steps)
    high = [i for i, s in enumerate(steps) if s.load == top]
    probed = [x for x in answers if any(starts[i] <= x.t < starts[i + 1] for i in high)]
    return {"seconds": per_s, "phases": phases,
            "high_load": {"phases": high, "probe": probe_accuracy(probed, held_out)},
            "recovery_s": [{"fall": round(f, 3), "back_at_accurate_s": recovery(scrapes, f, end)}
                           for f, end in falls(steps, starts)]}
