"""The latency controller of `cascade serve --p99-ms` (pipeline.serving.controller), on a simulated server:
requests arrive (Poisson, fixed seed) into one queue, the engine takes every waiting request (up to 64)
as a batch and spends a fixed overhead plus a time per image proportional to the point's MACs. Nothing
here is timed on this machine: the clock is the simulation's."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from pipeline.serving.controller import ControlConfig, LatencyController, Window, decide, p99

COSTS = [100.0, 85.0, 70.0, 55.0, 40.0]  # held-out MACs of the points, accuracy-first first
PER_IMAGE_S = 0.002  # engine time per image at the accuracy-first point: capacity about 450 images/s
OVERHEAD_S = 0.001  # per batch
TARGET_S = 0.05


def simulate(rate: Callable[[float], float], seconds: float, seed: int = 0,
             config: ControlConfig | None = None, front_s: float = 0.0,
             stalls: Sequence[tuple[float, float]] = ()) -> dict[str, list]:
    """Per request: arrival, latency and the point that served it; the controller's moves (time, index).
    ``front_s``: time every request spends in front of the engine's queue (an HTTP front at its limit) and
    that the server's latency counts. ``stalls``: (when, seconds) the whole process pauses (a garbage
    collection), inside the first batch that starts after ``when``."""
    pending = sorted(stalls)
    rng = np.random.default_rng(seed)
    arrivals, t = [], 0.0
    while t < seconds:
        t += rng.exponential(1.0 / rate(t))
        arrivals.append(t)
    control = LatencyController(COSTS, config or ControlConfig(target_s=TARGET_S))
    out: dict[str, list] = {"arrival": [], "latency": [], "point": [], "moves": []}
    clock, i = 0.0, 0
    while i < len(arrivals):
        clock = max(clock, arrivals[i])
        moved = control.before(clock)
        if moved is not None:
            out["moves"].append((clock, moved))
        batch = [a for a in arrivals[i:i + 64] if a <= clock]
        duration = OVERHEAD_S + len(batch) * PER_IMAGE_S * COSTS[control.index] / COSTS[0]
        while pending and pending[0][0] <= clock:
            duration += pending.pop(0)[1]
        clock += duration
        out["arrival"] += batch
        out["latency"] += [clock - a + front_s for a in batch]
        out["point"] += [control.index] * len(batch)
        moved = control.observe(clock, duration, [a - front_s for a in batch])
        if moved is not None:
            out["moves"].append((clock, moved))
        i += len(batch)
    return out


def per_second(run: dict[str, list], start: float, end: float) -> list[float]:
    """p99 latency of the requests arriving in each whole second of [start, end)."""
    arrival, latency = np.asarray(run["arrival"]), np.asarray(run["latency"])
    return [p99(latency[(arrival >= s) & (arrival < s + 1)].tolist()) for s in range(int(start), int(end))]


def step(low: float, high: float, up: float, down: float) -> Callable[[float], float]:
    return lambda t: high if up <= t < down else low


LOADS = [(200, 600, seed) for seed in range(3)] + [(250, 500, seed) for seed in range(3)]


@pytest.mark.parametrize(("low", "high", "seed"), LOADS)
def test_a_load_step_moves_to_cheaper_points_and_holds_the_target(low: float, high: float, seed: int) -> None:
    # 500-600 images/s: past what the accuracy-first point answers (about 480), within the cheapest's
    run = simulate(step(low, high, 5, 15), 25, seed)
    assert per_second(run, 0, 5) and max(per_second(run, 0, 5)) <= TARGET_S  # low load: accuracy-first holds
    arrival, point = np.asarray(run["arrival"]), np.asarray(run["point"])
    assert (point[arrival < 5] == 0).all()
    assert max(per_second(run, 7, 15)) <= TARGET_S  # every second after the first two of the step
    assert (point[(arrival >= 7) & (arrival < 15)] > 0).all()


@pytest.mark.parametrize(("low", "high", "seed"), LOADS)
def test_it_returns_to_the_accuracy_first_point_soon_after_the_load_falls(low: float, high: float,
                                                                         seed: int) -> None:
    run = simulate(step(low, high, 5, 15), 25, seed)
    back = [t for t, index in run["moves"] if index == 0 and t >= 15]
    assert back and back[0] - 15 <= 3.0  # window (1 s) + dwell (0.5 s) + the backlog's drain
    arrival, point = np.asarray(run["arrival"]), np.asarray(run["point"])
    assert (point[arrival >= back[0] + 0.1] == 0).all()


def test_an_idle_server_returns_to_the_accuracy_first_point() -> None:
    control = LatencyController(COSTS, ControlConfig(target_s=TARGET_S, min_samples=1, dwell_s=0))
    assert control.observe(1.0, 0.5, [0.0]) is not None and control.index > 0  # 1 s latency: step down
    assert control.before(1.5) is None  # still in the window
    assert control.before(3.0) == 0 and control.index == 0


@pytest.mark.parametrize("rate", [150, 250, 300, 350, 400, 450, 500, 550, 600])
def test_a_constant_load_does_not_flap(rate: float) -> None:
    """From light load to past the accuracy-first point's capacity, the boundary included: after 5 s at
    most one settling move (near full, about 350 images/s here, a point can be left late, when a burst
    shows it one pause from the target) or probes up that fail and come back, each wait twice the last
    (5 s, 10 s: two in 30 s), and p99 under the target every second."""
    run = simulate(lambda t: rate, 35, seed=int(rate))
    late = [m for m in run["moves"] if m[0] >= 5]
    assert len(late) <= 1 or (len(late) <= 4 and all(up[1] == down[1] - 1 and down[0] - up[0] < 5
                                                      for up, down in zip(late[::2], late[1::2], strict=True)))
    assert max(per_second(run, 10, 35)) <= TARGET_S


@pytest.mark.parametrize("rate", [50, 100, 200])
def test_latency_outside_the_engine_moves_nothing(rate: float) -> None:
    """Every request waits 80 ms in front of the engine (over the 50 ms target) while the engine has
    slack (busy 10-50% of the time): no point can buy that back, so the controller stays at the
    accuracy-first point."""
    run = simulate(lambda t: rate, 20, seed=int(rate), front_s=0.08)
    assert run["moves"] == [] and set(run["point"]) == {0}


@pytest.mark.parametrize("seed", range(3))
def test_a_stall_at_a_load_the_point_holds_moves_nothing(seed: int) -> None:
    """A 150 ms pause of the whole process (3x the target) every 10 s at a load the accuracy-first point
    holds (busy about 70%): the requests caught in it are late, the queue drains within the confirmation,
    and the point stays. Without the confirmation the same pauses move it."""
    stalls = [(t, 0.15) for t in (10.0, 20.0, 30.0)]
    run = simulate(lambda t: 250, 35, seed=seed, stalls=stalls)
    assert run["moves"] == [] and set(run["point"]) == {0}
    hasty = simulate(lambda t: 250, 35, seed=seed, stalls=stalls,
                     config=ControlConfig(target_s=TARGET_S, confirm_s=0.0))
    assert hasty["moves"] != []


def simulate_closed(clients: Callable[[float], int], seconds: float, front_s: float = 0.002
                    ) -> dict[str, list]:
    """A closed loop: ``clients(t)`` clients, each sending its next request as soon as its last is answered.
    Every request also costs ``front_s`` of the process outside the engine (decoding: the front bounds the
    load), reported to the controller as such. The point in use per batch and the moves."""
    control = LatencyController(COSTS, ControlConfig(target_s=TARGET_S))
    waiting, clock = [0.0] * clients(0.0), 0.0
    out: dict[str, list] = {"time": [], "point": [], "moves": []}
    while clock < seconds:
        moved = control.before(clock)
        if moved is not None:
            out["moves"].append((clock, moved))
        batch, waiting = waiting[:64], waiting[64:]
        engine = OVERHEAD_S + len(batch) * PER_IMAGE_S * COSTS[control.index] / COSTS[0]
        outside = len(batch) * front_s
        clock += outside + engine
        out["time"].append(clock)
        out["point"].append(control.index)
        moved = control.observe(clock, engine, batch, other_s=outside)
        if moved is not None:
            out["moves"].append((clock, moved))
        waiting += [clock] * min(len(batch), max(0, clients(clock) - len(waiting)))  # the ones that left do not
    return out


def test_after_a_closed_loop_shrinks_probes_bring_it_back_to_the_accuracy_first_point() -> None:
    """128 clients in a closed loop (p99 far over the target at every point: it goes to the cheapest), then
    4: the process stays saturated, so the rate does not fall and the rate-based up rule cannot fire; the
    probes (saturated but unqueued) climb back one point at a time, and none fails."""
    run = simulate_closed(lambda t: 128 if t < 5 else 4, 40)
    time, point = np.asarray(run["time"]), np.asarray(run["point"])
    assert point[(time > 3) & (time < 5)].min() == len(COSTS) - 1  # at the cheapest under the 128 clients
    back = [t for t, index in run["moves"] if index == 0 and t >= 5]
    assert back and back[0] - 5 <= 25  # 4 probes 5 s apart
    assert (point[time > back[0]] == 0).all()
    ups = [index for t, index in run["moves"] if t >= 5]
    assert ups == sorted(ups, reverse=True)  # only up: no probe was left for overload


def test_decide_follows_its_rules() -> None:
    cfg = ControlConfig(target_s=1.0)
    hot = lambda busy: Window(0.9, busy, 500.0, 500.0)  # noqa: E731 over high * target
    assert decide(0, hot(0.95), COSTS, cfg) == 2  # to where the busy share settles (0.95 * 0.7 <= 0.7)
    assert decide(0, hot(0.8), COSTS, cfg) == 1  # one step is enough (0.8 * 0.85 <= 0.7)
    assert decide(0, hot(1.0), [100.0, 90.0, 80.0], cfg) == 2  # nothing settles: the cheapest
    assert decide(4, hot(1.0), COSTS, cfg) == 4  # the cheapest already
    assert decide(0, Window(0.9, 0.3, 500.0, 500.0, other=0.2), COSTS, cfg) == 0  # slack: not the model's queue
    decoding = Window(0.9, 0.5, 500.0, 500.0, other=0.45)  # busy with requests outside the engine too
    assert decide(0, decoding, COSTS, cfg) == 4  # 0.5 * 40/100 + 0.45 > 0.7: nothing settles, the cheapest
    assert decide(0, Window(0.9, 0.5, 500.0, 500.0, other=0.3), COSTS, cfg) == 2  # 0.5 * 70/100 + 0.3 <= 0.7
    assert decide(4, Window(0.1, 0.2, 100.0, 500.0), COSTS, cfg) == 0  # light: all the way up
    assert decide(4, Window(0.25, 0.2, 100.0, 500.0), COSTS, cfg) == 3  # 0.25 * 85/40 > 0.35: one step
    assert decide(2, Window(0.5, 0.3, 100.0, 500.0), COSTS, cfg) == 2  # between low and high: stay
    assert decide(0, Window(0.5, 0.6, 500.0, 500.0, other=0.32), COSTS, cfg) == 3  # full (0.92): late past low
    assert decide(0, Window(0.3, 0.6, 500.0, 500.0, other=0.32), COSTS, cfg) == 0  # full, but under low
    assert decide(0, Window(0.5, 0.6, 500.0, 500.0, other=0.25), COSTS, cfg) == 0  # 0.85: late only past high
    overloaded = {1: 150.0}  # point 1 answered 150 images per busy second when it was left for overload
    assert decide(4, Window(0.1, 0.2, 110.0, 500.0), COSTS, cfg, overloaded) == 2  # 110 >= 0.7 * 150: not yet
    assert decide(4, Window(0.1, 0.2, 100.0, 500.0), COSTS, cfg, overloaded) == 0  # the load fell below
    busy = Window(0.1, 0.5, 300.0, 500.0)  # the accuracy-first point predicted too busy (0.5 * 100/70 > 0.65)
    assert decide(2, busy, COSTS, cfg) == 1 and decide(2, busy, COSTS, cfg, held={0: 310.0}) == 0  # seen holding
    assert decide(2, busy, COSTS, cfg, {0: 400.0}, {0: 310.0}) == 1  # but overloaded at this load: 300 >= 0.7 * 400
    assert decide(2, busy, COSTS, cfg, {1: 400.0}, {0: 310.0}) == 2  # nothing past an overloaded point


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        ControlConfig(target_s=1.0, low=0.9, high=0.8)
    with pytest.raises(ValueError, match="hysteresis"):
        ControlConfig(target_s=1.0, up_busy=0.8, settle=0.7)
    with pytest.raises(ValueError, match="hysteresis"):
        ControlConfig(target_s=1.0, settle=0.9, full=0.9)
    with pytest.raises(ValueError, match="confirm_s"):
        ControlConfig(target_s=1.0, confirm_s=-1.0)
    with pytest.raises(ValueError, match="seconds > 0"):
        ControlConfig(target_s=math.nan)
    with pytest.raises(ValueError, match="most costly first"):
        LatencyController([1.0, 2.0], ControlConfig(target_s=1.0))
