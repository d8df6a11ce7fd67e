"""Admission by deadline (pipeline.serving.admission, pure) and the outlook file the server's processes share
(pipeline.serving.outlook), with a simulated batching server under overload."""

from __future__ import annotations

import json
import math
import random
from collections import deque
from pathlib import Path

import pytest

from pipeline.routing.operating_points import OperatingPoint
from pipeline.serving.admission import (
    Correction,
    Outlook,
    ServiceEstimates,
    can_only_shed,
    costs_spread,
    fallback_point,
    judge,
    predict_seconds,
    refusal,
    shed_note,
    size_bucket,
)
from pipeline.serving.outlook import OutlookFile


def test_batch_sizes_fall_in_power_of_two_buckets() -> None:
    assert [size_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [0, 1, 2, 2, 3, 3, 4, 6, 7]


def test_the_estimate_is_a_running_mean_read_between_and_beyond_the_sizes_measured() -> None:
    est = ServiceEstimates(alpha=0.5)
    est.observe("accurate", 1, 0.002)
    est.observe("accurate", 16, 0.010)
    est.observe("accurate", 16, 0.020)  # a running mean: half the new batch
    assert est.measured("accurate", 16) == pytest.approx(0.015)
    assert est.measured("accurate", 1) == 0.002
    assert est.measured("accurate", 8.5) == pytest.approx(0.002 + 0.013 * 7.5 / 15)  # on the line between
    assert est.measured("accurate", 64) == pytest.approx(0.015 * 4)  # past the largest: per image
    assert ServiceEstimates({"a": {3: (0.004, 4.0)}}).measured("a", 1) == 0.004  # below: at least the smallest
    assert est.measured("exit1", 16) is None
    est.observe("accurate", 0, 1.0)  # no images, or a time that is not one: ignored
    est.observe("accurate", 4, float("nan"))
    assert set(est.table["accurate"]) == {0, 4}


def test_a_point_never_measured_is_scaled_from_one_measured_by_its_macs() -> None:
    est = ServiceEstimates({"accurate": {4: (0.010, 16.0)}, "p1": {4: (0.009, 16.0)}})
    costs = {"accurate": 100.0, "p1": 80.0, "exit1": 50.0}
    assert est.batch_seconds("exit1", 16, costs) == pytest.approx(min(0.010 * 0.5, 0.009 * 50 / 80))
    assert est.batch_seconds("p1", 16, costs) == 0.009  # measured: its own
    assert est.batch_seconds("exit1", 16, None) is None  # no costs: nothing to scale by
    assert ServiceEstimates().batch_seconds("exit1", 16, costs) is None  # nothing measured at all


def test_the_estimates_travel_as_json_and_a_torn_table_reads_as_what_is_whole() -> None:
    est = ServiceEstimates({"accurate": {0: (0.002, 1.0), 4: (0.01, 16.0)}})
    outlook = Outlook(est, "exit1", {"accurate": 100.0, "exit1": None}, 32)
    assert Outlook.from_json(json.loads(json.dumps(outlook.to_json()))) == outlook
    bad = {"a": {"0": [0.1, 1], "x": [1, 1], "2": [1], "3": ["s", 1], "4": [0.1, 0]}, "b": [1, 2], "c": {}}
    assert ServiceEstimates.from_json(bad).table == {"a": {0: (0.1, 1.0)}}
    assert Outlook.from_json({"estimates": {}}) is None and Outlook.from_json([]) is None


def test_the_prediction_counts_the_batches_that_drain_the_work_ahead() -> None:
    est = ServiceEstimates({"exit1": {0: (0.002, 1.0), 6: (0.020, 64.0)}})
    outlook = Outlook(est, "exit1", {}, 64)
    assert predict_seconds(outlook, 0, 0, 1) == pytest.approx(0.002)  # idle: its own batch
    assert predict_seconds(outlook, 63, 63, 1) == pytest.approx(0.020)  # one full batch
    assert predict_seconds(outlook, 127, 127, 1) == pytest.approx(2 * 0.020)  # behind a full batch
    assert predict_seconds(Outlook(ServiceEstimates(), "exit1", {}, 64), 500, 500, 1) is None


def test_a_request_is_refused_only_on_a_prediction_past_its_deadline() -> None:
    assert judge(None, 0.1).admit and judge(5.0, None).admit  # nothing measured, or no deadline
    assert judge(0.08, 0.1).admit and not judge(0.08, 0.1, waited_s=0.03).admit  # the wait so far counts
    verdict = judge(2.3, 0.1)
    assert not verdict.admit and verdict.retry_after_s == 3  # whole seconds past the deadline, at least 1
    assert judge(0.11, 0.1).retry_after_s == 1
    body = refusal(verdict, "exit1")
    assert body["predicted_ms"] == 2300.0 and body["deadline_ms"] == 100.0 and body["retry_after_s"] == 3
    assert "predicted 2300 ms" in body["message"] and "deadline of 100 ms" in body["message"]
    assert "'exit1'" in body["message"]


def test_probes_bring_a_stale_prediction_back() -> None:
    """A correction inflated once (a pause of the host) must not shut the server for good: a probe is
    admitted, answered, and its measured latency brings the offset back."""
    assert judge(2.3, 0.1, probe=True).admit and not judge(2.3, 0.1).admit
    correction = Correction(offset=5.0)
    for _ in range(200):  # one probe a second while everything else is refused
        predicted = correction.apply(0.01)
        if judge(predicted, 0.1, probe=True).admit:
            correction.update(measured_s=0.01, predicted_s=predicted)
    assert correction.offset < 0.05 and judge(correction.apply(0.01), 0.1).admit


def test_the_correction_learns_the_time_the_batch_times_leave_out_and_adds_it() -> None:
    c = Correction(alpha=0.5)
    c.update(0.040, 0.010)  # measured 30 ms over the raw prediction
    assert c.offset == pytest.approx(0.015)
    c.update(0.040, c.apply(0.010))  # the next prediction was corrected: 15 ms short still
    assert c.offset == pytest.approx(0.0225)
    for _ in range(30):
        c.update(0.040, c.apply(0.010))
    assert c.offset == pytest.approx(0.030, rel=1e-3)
    # added, not multiplied: a queue of ten batches is predicted at ten batches plus the same 30 ms
    assert c.apply(0.100) == pytest.approx(0.130, rel=1e-3)
    c.update(100.0, c.apply(0.010))  # one pause of the host: one bounded step
    assert c.offset <= 0.030 + 0.5 * c.step + 1e-9
    before = c.offset
    c.update(float("nan"), 0.01)
    c.update(0.01, -1.0)
    assert c.offset == before
    assert Correction(offset=-0.5).apply(0.01) == 0.0  # never a negative time


def test_the_fallback_is_the_cheapest_point_only_where_the_controller_can_move() -> None:
    points = [OperatingPoint("accurate", (0.5,), 0.9, 100.0), OperatingPoint("exit1", (0.0,), 0.8, 60.0)]
    assert fallback_point(points, points[0], controlled=True).name == "exit1"
    assert fallback_point(points, points[0], controlled=False).name == "accurate"


def test_points_within_ten_percent_in_cost_leave_the_target_only_shedding() -> None:
    close = [OperatingPoint("accurate", (0.5,), 0.9, 105.0), OperatingPoint("exit1", (0.0,), 0.8, 100.0)]
    apart = [OperatingPoint("accurate", (0.5,), 0.9, 130.0), OperatingPoint("exit1", (0.0,), 0.8, 100.0)]
    assert costs_spread(close) == pytest.approx(0.05) and can_only_shed(close)
    assert "the target can only shed" in shed_note(close) and "5%" in shed_note(close)
    assert not can_only_shed(apart) and shed_note(apart) == ""
    assert not can_only_shed(close[:1]) and not can_only_shed([OperatingPoint("accurate", (0.5,))])
    assert "no cheaper point to move to" in shed_note(close[:1])  # one point: it can only shed too
    assert shed_note([]) == "" and "1 operating point" in shed_note([OperatingPoint("accurate", (0.5,))])


def test_cascade_info_says_so_under_its_points() -> None:
    from pipeline.cli import points_lines

    close = [{"name": "accurate", "thresholds": [0.5], "accuracy": 0.9, "mean_macs": 104.0},
             {"name": "exit1", "thresholds": [0.0], "accuracy": 0.8, "mean_macs": 100.0}]
    assert "the target can only shed" in points_lines(close)[-1]
    apart = [dict(close[0], mean_macs=150.0), close[1]]
    assert not any("shed" in line for line in points_lines(apart))


def test_the_outlook_file_is_written_at_most_so_often_and_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "admission.json"
    writer, reader = OutlookFile(path, every_s=0.05), OutlookFile(path)
    assert reader.read() is None  # nothing published yet
    first = Outlook(ServiceEstimates({"a": {0: (0.002, 1.0)}}), "a", {"a": 1.0}, 8)
    assert writer.write(first, now=10.0) and reader.read() == first
    later = Outlook(ServiceEstimates({"a": {0: (0.004, 1.0)}}), "a", {"a": 1.0}, 8)
    assert not writer.write(later, now=10.01)  # within every_s: skipped
    assert writer.write(later, now=10.06) and reader.read() == later
    path.write_text("{not json")
    assert reader.read() == later  # a file that does not parse: the last outlook stands


def simulate(rate: float, seconds: float, deadline_s: float, admit: bool, seed: int = 0) -> dict[str, float]:
    """A batching server (batches of up to 64 single-image requests taken when it is free, a batch of n
    costing 2 ms + 0.5 ms x n) under Poisson arrivals, admitting by the estimates it learns from its own
    batches when ``admit``: the share of requests refused, of answers late, and answers in time per second."""
    rng, est, cap = random.Random(seed), ServiceEstimates(), 64
    arrivals, t = [], 0.0
    while t < seconds:
        t += rng.expovariate(rate)
        arrivals.append(t)
    queue: deque[float] = deque()
    batch: list[float] = []
    busy_until, latencies, refused = 0.0, [], 0

    def start(now: float) -> tuple[list[float], float]:
        taken = [queue.popleft() for _ in range(min(cap, len(queue)))]
        return taken, now + 0.002 + 0.0005 * len(taken)

    i = 0
    while i < len(arrivals) or batch:
        if batch and (i == len(arrivals) or busy_until <= arrivals[i]):
            latencies += [busy_until - a for a in batch]
            est.observe("p", len(batch), 0.002 + 0.0005 * len(batch))
            batch, busy_until = start(busy_until) if queue else ([], busy_until)
            continue
        now, i = arrivals[i], i + 1
        ahead = len(queue) + len(batch)
        if admit and not judge(predict_seconds(Outlook(est, "p", {}, cap), ahead, ahead, 1), deadline_s).admit:
            refused += 1
            continue
        queue.append(now)
        if not batch:
            batch, busy_until = start(now)
    in_time = sum(1 for v in latencies if v <= deadline_s)
    return {"refused": refused / len(arrivals), "late": 1 - in_time / max(1, len(latencies)),
            "goodput": in_time / seconds}


def test_under_overload_admission_keeps_every_admitted_answer_in_time() -> None:
    capacity = 64 / (0.002 + 0.0005 * 64)  # images/s at full batches: 1,882
    without = simulate(1.6 * capacity, 3.0, 0.05, admit=False)
    with_admission = simulate(1.6 * capacity, 3.0, 0.05, admit=True)
    assert without["late"] > 0.5  # a queue that grows: most answers miss
    assert with_admission["late"] <= 0.01  # refused at once instead
    assert 0.25 < with_admission["refused"] < 0.5  # about the excess over capacity, no more
    assert with_admission["goodput"] > 2 * without["goodput"]
    assert with_admission["goodput"] > 0.9 * capacity


def test_below_capacity_nothing_is_refused() -> None:
    light = simulate(0.5 * 64 / 0.034, 2.0, 0.05, admit=True)
    assert light["refused"] == 0 and light["late"] == 0
    assert math.isclose(light["goodput"], 0.5 * 64 / 0.034, rel_tol=0.1)
