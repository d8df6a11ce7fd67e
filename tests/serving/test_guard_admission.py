"""Admission by deadline in the guard (pipeline.serving.guard), driven as ASGI with a published outlook: a
deadline from the header, the JSON or the target, refusal at once with 429 and Retry-After, goodput and the
prediction's error in the metrics; and the deadline's parsing (pipeline.serving.requests)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from pipeline.serving.admission import PROBE_S, Outlook, ServiceEstimates
from pipeline.serving.guard import GuardMiddleware
from pipeline.serving.limits import BadRequest
from pipeline.serving.metrics import ServingMetrics
from pipeline.serving.outlook import OutlookFile
from pipeline.serving.requests import (
    DEADLINE_HEADER,
    STAMP_KEY,
    image_count,
    parse_deadline,
    request_deadline,
    stamped,
)
from tests.serving.test_guard import Recorder
from tests.serving.test_metrics import samples


def test_a_deadline_is_milliseconds_from_the_json_else_the_header() -> None:
    assert parse_deadline(None) is None and parse_deadline("250") == 250.0 and parse_deadline(1) == 1.0
    for bad in ("soon", 0, -5, float("inf"), True, [1]):
        with pytest.raises(BadRequest, match="deadline"):
            parse_deadline(bad)
    assert request_deadline({"deadline_ms": 80}, "500") == 80.0  # the JSON field wins over the header
    assert request_deadline({"image": "x"}, "500") == 500.0 and request_deadline(None, None) is None
    stamp = json.loads(stamped(b'{"image": "aGk="}', 1.0, None, 120.0))
    assert stamp[STAMP_KEY] == {"arrived": 1.0, "deadline_ms": 120.0} and request_deadline(stamp) == 120.0
    assert json.loads(stamped(b"{}", 1.0, None))[STAMP_KEY] == {"arrived": 1.0}  # none: as before


def test_the_images_a_request_holds_are_counted_from_its_shape() -> None:
    assert image_count({"images": ["a", "b", "c"]}) == 3 and image_count({"image": "a"}) == 1
    assert image_count({"dataframe_split": {"columns": ["image"], "data": [["a"], ["b"]]}}) == 2
    assert image_count({"dataframe_records": [{}, {}, {}, {}]}) == 4 and image_count(None) == 1


def call(app: Any, body: bytes, kind: str, headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    """One POST /invocations through ``app``: status, JSON answer (or {}) and response headers."""
    raw = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": "POST", "path": "/invocations", "headers": raw}
    out: dict[str, Any] = {}
    sent = []

    async def receive() -> dict:
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            out["status"], out["headers"] = message["status"], {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            out["body"] = message["body"]

    asyncio.run(app(scope, receive, send))
    answer = json.loads(out["body"]) if out.get("body", b"").startswith(b"{") else {}
    return out["status"], answer, out["headers"]


@pytest.fixture
def published(tmp_path: Path) -> str:
    """An outlook where a batch of up to 4 images costs 40 ms at the cheapest point, 'exit1'."""
    path = tmp_path / "admission.json"
    estimates = ServiceEstimates({"exit1": {0: (0.040, 1.0), 2: (0.040, 4.0)}})
    OutlookFile(path).write(Outlook(estimates, "exit1", {"exit1": 50.0}, 4), now=0.0)
    return str(path)


def guard(inner: Any, outlook: str | None, target_ms: float | None = None) -> tuple[GuardMiddleware, CollectorRegistry]:
    app = GuardMiddleware(inner, target_ms=target_ms, outlook=outlook)
    registry = CollectorRegistry()
    app.metrics = ServingMetrics(registry)
    return app, registry


def test_a_request_predicted_late_is_refused_at_once_with_429_and_why(published: str) -> None:
    inner = Recorder()
    app, registry = guard(inner, published)
    status, answer, headers = call(app, b"\x89PNGdata", "image/png", {DEADLINE_HEADER: "10"})
    assert status == 429 and headers["retry-after"] == "1" and inner.seen == []  # never queued
    assert answer["error_code"] == "DEADLINE" and answer["deadline_ms"] == 10.0
    assert answer["predicted_ms"] >= 40.0 and "even at operating point 'exit1'" in answer["message"]
    status, answer, _ = call(app, json.dumps({"image": "aGk=", "deadline_ms": 15}).encode(), "application/json",
                             {DEADLINE_HEADER: "5000"})  # the JSON field wins: 15 ms
    assert status == 429 and answer["deadline_ms"] == 15.0
    assert call(app, b"{}", "application/json", {DEADLINE_HEADER: "5000"})[0] == 200  # in time: admitted
    assert json.loads(inner.seen[0][1])[STAMP_KEY]["deadline_ms"] == 5000.0  # the worker reads the same
    got = samples(registry)
    assert got[("cascade_refusals_total", (("reason", "deadline"),))] == 2
    assert got[("cascade_goodput_total", ())] == 1 and got[("cascade_late_answers_total", ())] == 0
    ratio = got[("cascade_admission_latency_ratio_sum", ())]
    assert got[("cascade_admission_latency_ratio_count", ())] == 1 and 0 <= ratio < 0.5  # answered at once


def test_the_work_in_flight_ahead_counts_and_the_target_is_the_default_deadline(published: str) -> None:
    async def burst() -> list[int]:
        app, _ = guard(Recorder(delay=0.3), published, target_ms=100)
        bodies = [json.dumps({"images": ["aGk="] * 4}).encode()] * 4
        calls = []
        for body in bodies:  # one after another: each sees the ones before in flight
            calls.append(asyncio.create_task(_one(app, body)))
            await asyncio.sleep(0.02)
        return [await c for c in calls]

    # 40 ms per batch of 4 images: the first two fit 100 ms (40, 80 ms), the next ones (120, 160) do not
    assert asyncio.run(burst()) == [200, 200, 429, 429]


def test_requests_still_being_read_or_refused_are_not_work_ahead(published: str) -> None:
    async def crowd() -> tuple[int, int, int]:
        app, _ = guard(Recorder(), published, target_ms=100)
        stuck = [asyncio.create_task(_unread(app)) for _ in range(40)]  # in the guard, never admitted
        await asyncio.sleep(0.05)
        in_guard = app.in_flight
        status = await _one(app, json.dumps({"images": ["aGk="] * 4}).encode())
        for task in stuck:
            task.cancel()
        return in_guard, app.admitted, status

    # 40 requests in the guard, none admitted: one batch of 4 images ahead of nothing, 40 ms, fits 100 ms
    assert asyncio.run(crowd()) == (40, 0, 200)


async def _unread(app: Any) -> None:
    """A request whose body never arrives: it stays in the guard, being read."""
    scope = {"type": "http", "method": "POST", "path": "/invocations",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"10")]}

    async def receive() -> dict:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        pass

    await app(scope, receive, send)


def test_a_probe_goes_through_only_while_everything_is_refused(published: str) -> None:
    app, _ = guard(Recorder(), published)
    late = {DEADLINE_HEADER: "10"}  # a batch costs 40 ms: always predicted late
    app.last_admitted -= 10 * PROBE_S  # long since the last admission, but nothing refused since
    assert call(app, b"{}", "application/json", late)[0] == 429  # the first refusal is not a probe
    assert call(app, b"{}", "application/json", late)[0] == 200  # refused, PROBE_S after a yes: a probe
    assert call(app, b"{}", "application/json", late)[0] == 429  # within PROBE_S of the probe: refused
    app.last_admitted -= PROBE_S
    assert call(app, b"{}", "application/json", late)[0] == 200  # the next probe


def test_answers_slower_than_predicted_raise_the_next_predictions(published: str) -> None:
    app, registry = guard(Recorder(delay=0.2), published)  # answers take 200 ms; the batch times say 40
    for _ in range(20):
        assert call(app, b"{}", "application/json", {DEADLINE_HEADER: "5000"})[0] == 200
    assert app.correction.offset > 0.08  # 160 ms a request left out of the prediction, learnt in part
    status, answer, _ = call(app, b"{}", "application/json", {DEADLINE_HEADER: "100"})  # 40 ms raw: would fit
    assert status == 429 and answer["predicted_ms"] > 100
    assert samples(registry)[("cascade_admission_latency_ratio_bucket", (("le", "1.0"),))] == 0  # all slower


async def _one(app: Any, body: bytes) -> int:
    out: dict[str, Any] = {}
    scope = {"type": "http", "method": "POST", "path": "/invocations",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        out.setdefault("status", message.get("status"))

    await app(scope, receive, send)
    return out["status"]


def test_without_a_deadline_or_a_measurement_nothing_is_refused(published: str, tmp_path: Path) -> None:
    inner = Recorder()
    app, registry = guard(inner, published)
    assert call(app, b'{"image": "aGk="}', "application/json")[0] == 200  # no deadline, no target
    assert set(json.loads(inner.seen[0][1])[STAMP_KEY]) == {"arrived"}  # the body as before
    unmeasured, _ = guard(inner, str(tmp_path / "none-yet.json"), target_ms=1)
    assert call(unmeasured, b'{"image": "aGk="}', "application/json")[0] == 200  # nothing to predict with
    assert call(GuardMiddleware(inner, target_ms=1), b"{}", "application/json")[0] == 200  # no outlook
    status, answer, _ = call(app, b"{}", "application/json", {DEADLINE_HEADER: "later"})
    assert status == 400 and "deadline 'later'" in answer["message"]
    assert samples(registry)[("cascade_goodput_total", ())] == 0  # no deadline: not counted either way
