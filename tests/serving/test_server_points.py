"""`cascade serve` answering at operating points and reporting on /metrics, end to end: a real LitServe
server on the test cascade with its held-out points (pipeline.serving.server, guard, metrics)."""

from __future__ import annotations

import base64
import http.client
import json
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.routing.operating_points import within
from pipeline.serving.engines import load_engine
from tests.routing.test_package import uint8_images
from tests.serving.test_requests import png
from tests.serving.test_server import running_server


@pytest.fixture(scope="module")
def served(points_model: Path) -> Iterator[int]:
    yield from running_server(points_model, "--engine", "torch", "--max-images", "64")


def ask(port: int, body: bytes, kind: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/invocations", body=body, headers={"Content-Type": kind, **(headers or {})})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def as_json(images, **fields) -> bytes:
    return json.dumps({"images": [base64.b64encode(png(im[0])).decode() for im in images], **fields}).encode()


def metrics(port: int) -> dict[tuple[str, tuple], float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_budgets_pick_points_and_metrics_count_the_answers(served: int, points_model: Path) -> None:
    engine = load_engine(points_model, "torch")
    points = engine.points
    images = uint8_images(48, seed=21)
    ceiling = (points[2].mean_macs + points[3].mean_macs) / 2
    jobs = ([(as_json(images[i:i + 4]), "application/json", {}) for i in range(0, 16, 4)]  # no budget
            + [(as_json(images[16:32], budget="exit1"), "application/json", {})]  # a name in the JSON
            + [(png(im[0]), "image/png", {"X-Cascade-Budget": f"{ceiling:.0f}"}) for im in images[32:]]  # header
            + [(as_json(images[:1], budget=1.0), "application/json", {}),  # below every point
               (as_json(images[:1]), "application/json", {"X-Cascade-Budget": "turbo"}),  # no such point
               (b"not an image", "image/png", {})])
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: ask(served, *job), jobs))
    good, refused = answers[:-3], answers[-3:]
    assert all(status == 200 for status, _ in good)
    served_at = [a["operating_point"]["name"] for _, a in good]
    assert served_at == ["accurate"] * 4 + ["exit1"] + [within(points, ceiling).name] * 16
    assert within(points, ceiling).mean_macs <= ceiling
    assert [status for status, _ in refused] == [400, 400, 400]
    assert "the cheapest, 'exit1', costs" in refused[0][1]["message"]
    assert "no operating point named 'turbo'" in refused[1][1]["message"]
    want = engine.recognize(images[16:32], thresholds=points[-1].thresholds)  # the rows are the point's own
    assert [r["exit"] for r in good[4][1]["predictions"]] == [r["exit"] for r in want] == [1] * 16
    assert [r["macs"] for r in good[4][1]["predictions"]] == [round(points[-1].mean_macs)] * 16
    want = engine.recognize(images[32:], thresholds=within(points, ceiling).thresholds)
    assert [(a["predictions"][0]["exit"], a["predictions"][0]["macs"]) for _, a in good[5:]] == \
        [(r["exit"], r["macs"]) for r in want]

    got = metrics(served)
    exits = Counter(str(r["exit"]) for _, a in good for r in a["predictions"])
    assert {k: got[("cascade_images_total", (("exit", k),))] for k in exits} == dict(exits)
    assert sum(v for (name, _), v in got.items() if name == "cascade_images_total") == 48
    assert got[("cascade_refusals_total", (("reason", "budget"),))] == 2
    assert got[("cascade_refusals_total", (("reason", "bad_request"),))] == 1
    assert got[("cascade_requests_total", (("point", "accurate"),))] == 4
    assert got[("cascade_operating_point", (("point", "accurate"),))] == 1
    assert got[("cascade_operating_point", (("point", "exit1"),))] == 0
    assert got[("cascade_batch_images_sum", ())] == 48
    assert got[("cascade_queue_wait_seconds_count", ())] == 21
    assert got[("cascade_request_seconds_count", (("status", "200"),))] == 21
    assert got[("cascade_request_seconds_count", (("status", "400"),))] == 3


def test_a_p99_target_needs_the_exits_and_sheds_only_without_two_costed_points(
        tiny_model: Path, points_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main
    from pipeline.serving.engines import load_engine
    from pipeline.serving.server import latency_controller

    one = load_engine(tiny_model, "torch").points  # nowhere to move: admission alone keeps the target
    assert latency_controller(one, 50) is None
    assert latency_controller(load_engine(points_model, "torch").points, 50) is not None
    assert main(["serve", "--model", str(points_model), "--p99-ms", "50", "--static"]) == 2
    assert "--p99-ms needs the early exits" in capsys.readouterr().err
    # Triton takes the target as its queue timeout only (tests/serving/test_triton.py): no points needed


def test_the_server_follows_its_controller(points_model: Path) -> None:
    """Requests that waited far past the target while the serving process was busy move the point in use
    to a cheaper one; a request's own budget is still answered at its point."""
    import time

    from pipeline.serving.server import CascadeAPI, Job, ServeConfig

    api = CascadeAPI(ServeConfig(str(points_model), "torch", p99_ms=20))
    api.setup(None)
    images = uint8_images(1, seed=4)
    points = api.engine.points
    assert api.current == points[0]
    api.last_end = time.monotonic() - 1.0  # the last batch ended 1 s ago, when these requests arrived:
    late = [Job(images, None, time.monotonic() - 1.0) for _ in range(30)]  # the process was busy since
    answers = api.predict(late)
    assert {a.point.name for a in answers} == {"accurate"} and api.current != points[0]
    cheaper = api.current
    answers = api.predict([Job(images, None, time.monotonic()), Job(images, points[0], time.monotonic())])
    assert [a.point for a in answers] == [cheaper, points[0]]
