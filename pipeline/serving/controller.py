"""The latency controller of ``cascade serve --p99-ms``: which operating point requests without a budget
are answered at, from what the server measures (pure logic; the server feeds it, docs/DESIGN.md 'Serving').

Signals, over a sliding window of ``window_s`` seconds: the p99 of the requests' server-side latency up to
their answer (queue wait + batch time), the engine's busy share (batch time / wall time), the serving
process's share outside the engine while requests waited (from the later of the last batch's end and the
first waiting request's arrival to the next batch's start: decoding requests, encoding answers, the server's
own queues; a cheaper point does not shorten it) and the load (images answered per second). Points are
ordered from the accuracy-first one (index 0) to the cheapest, each with its held-out mean MACs, and the
engine's time per image is taken to scale with those MACs (so the process's busy share at another point is
predicted as ``busy * macs_j / macs_i + other``, and its latency as ``latency * macs_j / macs_i``).

- Down (cheaper) when the window's p99 passes ``high * target`` (``low * target`` once the process is
  ``full`` busy: near full, one pause of the process puts the target out of reach) and the process is
  busy (its share at least ``settle``; with slack, the latency is not the model's queue, and no point buys
  it back): to the most accurate cheaper point whose predicted busy share is at most ``settle``, one step
  at least (a queue grows fast; one step at a time could take seconds to catch it), the cheapest if none
  is. The point left is remembered with the images per busy second it answered (its capacity at the
  batch sizes the overload made). From a point seen holding the target (within ``memory_s``), a down move
  waits ``confirm_s`` and is made only if the latest answers (to requests that arrived after it was first
  called for) are still late: a pause of the whole process at a load the point holds drains within that
  time, and must not be read as the point's overload (measured, docs/DESIGN.md 'Serving').
- Up (more accurate) to the most accurate point that is either predicted to hold (p99 below
  ``low * target`` and busy share at most ``up_busy``) or was seen holding (p99 within ``high * target``)
  at this load or more, with no point overloaded at this load between it and the point in use: a point
  left for overload is re-entered only once the load is below ``1 - margin`` of its remembered
  capacity. Both memories are forgotten after ``memory_s``.
- Probe up: at a cheaper point, a process at least ``full`` busy with p99 under ``low * target`` is
  saturated but not queueing, a closed loop of clients whose rate follows the point's capacity (so the
  rate-based rule above never fires); after ``probe_s`` at the point it tries the next more accurate one,
  and a probe left for overload within ``probe_s`` doubles that wait (up to ``memory_s``).
- An idle server (no batch for ``window_s``) returns to the accuracy-first point.

Hysteresis, so a constant load does not flap: ``low`` well below ``high``, ``up_busy`` below ``settle``,
the remembered overload (at a constant load a point left for overload is not tried again within
``memory_s``), and every move waits ``dwell_s`` after the last and starts a fresh window (requests that
arrived before it are not counted), so a decision reads only the point it judges. The defaults were set
on the simulated server of tests/serving/test_controller.py and checked on a measured one (docs/RESULTS.md
'Under a load step').
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ControlConfig:
    """The latency target (seconds, for the p99) and the controller's thresholds (see the module)."""

    target_s: float
    high: float = 0.8
    low: float = 0.35
    settle: float = 0.7
    full: float = 0.9
    up_busy: float = 0.65
    margin: float = 0.3
    memory_s: float = 60.0
    window_s: float = 1.0
    dwell_s: float = 0.5
    confirm_s: float = 0.5
    probe_s: float = 5.0
    min_samples: int = 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_s) and self.target_s > 0):
            raise ValueError(f"the p99 target must be a number of seconds > 0, got {self.target_s!r}")
        if (not 0 < self.low < self.high <= 1 or not 0 < self.up_busy < self.settle < self.full <= 1
                or not 0 <= self.margin < 1):
            raise ValueError("need 0 < low < high <= 1 and 0 < up_busy < settle < full <= 1 (the hysteresis), "
                             "0 <= margin < 1")
        if (self.window_s <= 0 or self.dwell_s < 0 or self.memory_s < 0 or self.confirm_s < 0
                or self.probe_s <= 0 or self.min_samples < 1):
            raise ValueError("window_s and probe_s must be > 0, dwell_s, confirm_s and memory_s >= 0 and "
                             "min_samples >= 1")


@dataclass(frozen=True)
class Window:
    """What the controller read over its window at the point in use."""

    latency: float  # p99 of the requests' latency, seconds
    busy: float  # the engine's busy share, 0..1
    rate: float  # images answered per second
    capacity: float  # images answered per busy second of the serving process (engine and outside it)
    other: float = 0.0  # the serving process's share of wall time outside the engine while requests
    # waited (decoding, encoding, queues): it does not scale with the point's MACs

    def utilisation(self, ratio: float = 1.0) -> float:
        """The serving process's busy share were the engine's time scaled by ``ratio`` (a point's MACs over
        the point in use's)."""
        return self.busy * ratio + self.other


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank) of ``values`` (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def late_after(seen: Window, cfg: ControlConfig) -> float:
    """The p99 past which a point is called late: ``high * target``, or ``low * target`` once the process
    is at least ``full`` busy. Near full, a pause of the process leaves a backlog that drains only at the
    spare share (a 100 ms pause at 95% busy takes about 2 s), so the target is one pause away
    (measured, docs/DESIGN.md 'Serving')."""
    return (cfg.low if seen.utilisation() >= cfg.full else cfg.high) * cfg.target_s


def decide(index: int, seen: Window, costs: Sequence[float], cfg: ControlConfig,
           overloaded: Mapping[int, float] | None = None, held: Mapping[int, float] | None = None) -> int:
    """The point to use next after ``seen`` at point ``index``. ``overloaded``: the capacity (images per
    busy second) a point had when it was last left for overload; ``held``: the highest load (images/s) a
    point was seen holding the target at (points not listed: never, or forgotten)."""
    overloaded, held = overloaded or {}, held or {}
    if seen.latency > late_after(seen, cfg) and index < len(costs) - 1:
        if seen.utilisation() < cfg.settle:
            return index  # the process has slack: the latency is not the model's queue, no point buys it back
        for j in range(index + 1, len(costs)):
            if seen.utilisation(costs[j] / costs[index]) <= cfg.settle:
                return j
        return len(costs) - 1
    best = index
    for j in range(index - 1, -1, -1):
        ratio = costs[j] / costs[index]
        predicted = seen.latency * ratio < cfg.low * cfg.target_s and seen.utilisation(ratio) <= cfg.up_busy
        if seen.rate >= (1 - cfg.margin) * overloaded.get(j, math.inf):
            break  # overloaded at this load: neither it nor a costlier point
        if predicted or seen.rate <= held.get(j, 0.0):
            best = j
    return best


class LatencyController:
    """Feeds :func:`decide` from the server's measurements; ``index`` is the point in use."""

    def __init__(self, costs: Sequence[float], config: ControlConfig) -> None:
        if len(costs) < 2 or any(not (c > 0) for c in costs) or list(costs) != sorted(costs, reverse=True):
            raise ValueError(f"the controller needs 2 or more points with costs > 0, most costly first; got {costs}")
        self.costs, self.config = [float(c) for c in costs], config
        self.index, self.last_move = 0, -math.inf
        self.latencies: deque[tuple[float, float]] = deque()  # (time, request latency)
        self.batches: deque[tuple[float, float, int, float]] = deque()  # (time, batch s, images, other s)
        self.since = -math.inf  # the last move: requests that arrived earlier are not counted
        self.started: float | None = None  # the first batch's start: the window's span begins there
        self.last_seen = -math.inf  # the last batch's end
        self.overloaded: dict[int, tuple[float, float]] = {}  # point -> (its capacity when left, when)
        self.held: dict[int, tuple[float, float]] = {}  # point -> (highest load it held the target at, when)
        self.called: float | None = None  # when a down move was first called for and not yet confirmed
        self.probe_wait = config.probe_s  # how long a saturated, unqueued point waits before a probe up
        self.probed: float | None = None  # when the last probe up was made, until it is judged

    def _expire(self, now: float) -> None:
        start = now - self.config.window_s
        for queue in (self.latencies, self.batches):
            while queue and queue[0][0] < start:
                queue.popleft()
        for memory in (self.overloaded, self.held):
            for j in [j for j, (_, t) in memory.items() if now - t > self.config.memory_s]:
                del memory[j]

    def _move(self, now: float, index: int, seen: Window | None = None) -> int | None:
        if index == self.index:
            return None
        if seen is not None and index > self.index:
            self.overloaded[self.index] = (seen.capacity, now)
        if index > self.index and self.probed is not None:  # the probe failed: wait twice as long next time
            longest = max(self.config.memory_s, self.config.probe_s)
            self.probe_wait, self.probed = min(2 * self.probe_wait, longest), None
        self.index, self.last_move, self.since, self.called = index, now, now, None
        self.latencies.clear()
        self.batches.clear()
        return index

    def before(self, now: float) -> int | None:
        """Before a batch: back to the accuracy-first point if the server was idle for the window; the new
        index or None."""
        self._expire(now)
        if now - self.last_seen >= self.config.window_s and self.index and now - self.last_move >= self.config.dwell_s:
            return self._move(now, 0)
        return None

    def window(self, now: float) -> Window:
        """The window's p99 latency, busy shares (engine, outside it), load and capacity at ``now``."""
        span = max(min(self.config.window_s, now - max(self.started or now, self.since)), 1e-9)
        busy = sum(b for _, b, _, _ in self.batches)
        images = sum(n for _, _, n, _ in self.batches)
        other = sum(o for _, _, _, o in self.batches)
        wall = max(span, busy + other)
        return Window(p99([v for _, v in self.latencies]), busy / wall, images / max(span, busy),
                      images / max(busy + other, 1e-9), other / wall)

    def observe(self, now: float, batch_s: float, arrivals: Sequence[float], images: int | None = None,
                other_s: float = 0.0) -> int | None:
        """After a batch that took ``batch_s`` and answered ``images`` images (default: one per request) for
        requests that arrived at ``arrivals`` (the clock of ``now``), the serving process having spent
        ``other_s`` outside the engine since the last batch while requests waited: the new index where the
        controller moves, else None. Requests that arrived before the last move are not counted: their
        wait belongs to the point left."""
        if self.started is None:
            self.started = now - batch_s - other_s
        self.batches.append((now, batch_s, len(arrivals) if images is None else images, max(0.0, other_s)))
        self.last_seen = now
        self.latencies.extend((now, now - arrived) for arrived in arrivals if arrived >= self.since)
        self._expire(now)
        if (now - self.last_move < self.config.dwell_s or now - self.started < self.config.dwell_s
                or len(self.latencies) < self.config.min_samples):
            return None  # the first dwell too: a busy share read over a few batches means little
        seen = self.window(now)
        if seen.latency <= self.config.high * self.config.target_s and now - self.since >= self.config.window_s:
            self.held[self.index] = (max(seen.rate, self.held.get(self.index, (0.0, now))[0]), now)
        overloaded = {j: capacity for j, (capacity, _) in self.overloaded.items()}
        held = {j: rate for j, (rate, _) in self.held.items()}
        index = decide(self.index, seen, self.costs, self.config, overloaded, held)
        if self.probed is not None and now - self.probed >= self.config.probe_s:
            self.probe_wait, self.probed = self.config.probe_s, None  # the probe held
        if index == self.index and self._probe(now, seen):
            self.probed = now
            return self._move(now, index - 1)
        if index > self.index and self.index in held and not self._confirmed(now, late_after(seen, self.config)):
            return None  # the point has held the target: a stall, or an overload? (_confirmed)
        if index <= self.index:
            self.called = None
        return self._move(now, index, seen)

    def _probe(self, now: float, seen: Window) -> bool:
        """Whether to try the next more accurate point: the process is ``full`` busy but nothing queues
        (p99 under ``low * target``), the signature of a closed loop of clients, whose rate follows the
        point's capacity so that the rate-based up rule never fires; tried after ``probe_wait`` at the point,
        which doubles each time a probe is left for overload within ``probe_s`` and resets once one holds."""
        return (self.index > 0 and now - self.last_move >= self.probe_wait
                and seen.utilisation() >= self.config.full and seen.latency < self.config.low * self.config.target_s)

    def _confirmed(self, now: float, late: float) -> bool:
        """Whether a down move called for now is confirmed: it was first called for ``confirm_s`` ago and
        the requests answered in the last half of that time, all of which arrived after the call, are
        still late (p99 past ``late``). A stall's backlog drains; an overload's does not."""
        if self.called is None:
            self.called = now
        if now - self.called < self.config.confirm_s:
            return False
        recent = [v for t, v in self.latencies if t >= now - self.config.confirm_s / 2 and t - v >= self.called]
        if not recent:
            return False  # nothing answered since the call yet: keep waiting
        if p99(recent) > late:
            return True
        # A stall, drained: the requests it held are set aside, or the window would call for the move again
        self.latencies = deque((t, v) for t, v in self.latencies if t - v >= self.called)
        self.called = None
        return False
