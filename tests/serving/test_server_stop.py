"""`cascade serve` end to end on the test cascade: admission by deadline through the real server (429 at once,
the metrics), a clean stop (SIGTERM to the server, Ctrl-C to its process group: every request in flight
answered, exit 0, no traceback), and the worker's side of admission in process (pipeline.serving.server,
guard, stopping)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.serving.outlook import OutlookFile
from pipeline.serving.requests import STAMP_KEY
from tests.routing.test_package import uint8_images
from tests.serving.test_requests import png
from tests.serving.test_server import free_port, running_server, wait_until_up
from tests.serving.test_server_points import metrics


def ask(port: int, body: bytes, headers: dict[str, str] | None = None, sent: list[int] | None = None
        ) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json", **(headers or {})})
        if sent is not None:
            sent.append(1)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read()), {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()


def images_body(n: int, seed: int = 3) -> bytes:
    return json.dumps({"images": [base64.b64encode(png(im[0])).decode() for im in uint8_images(n, seed=seed)]}).encode()


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[int]:
    yield from running_server(tiny_model, "--engine", "onnx", "--max-images", "64")


def test_the_server_refuses_a_request_it_cannot_answer_in_time_and_counts_goodput(server: int) -> None:
    body = images_body(8)
    for _ in range(3):  # measured batches: the worker publishes their times
        assert ask(server, body)[0] == 200
    time.sleep(0.2)  # past the outlook's write interval
    assert ask(server, body)[0] == 200
    status, answer, headers = ask(server, body, {"X-Deadline-Ms": "0.5"})  # no batch is that quick
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert answer["deadline_ms"] == 0.5 and answer["predicted_ms"] > 0.5
    assert "over the deadline of 0.5 ms" in answer["message"]
    status, answer, _ = ask(server, json.dumps({**json.loads(body), "deadline_ms": 30000}).encode())
    assert status == 200 and len(answer["predictions"]) == 8
    got = metrics(server)
    assert got[("cascade_refusals_total", (("reason", "deadline"),))] == 1
    assert got[("cascade_goodput_total", ())] == 1 and got[("cascade_late_answers_total", ())] == 0
    assert got[("cascade_admission_latency_ratio_count", ())] == 1


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_signal_stops_taking_requests_answers_those_in_flight_and_exits_0_quietly(tiny_model: Path,
                                                                                   how: str) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--model", str(tiny_model), "--port", str(port),
           "--engine", "onnx", "--max-images", "64", "--max-batch-size", "2"]  # small batches: a long queue
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until_up(proc, port)
        body = images_body(64)
        answers: list[tuple[float, int, int]] = []  # (when, status, rows)
        failures: list[str] = []
        sent: list[int] = []

        def client() -> None:
            try:
                status, answer, _ = ask(port, body, sent=sent)
                answers.append((time.monotonic(), status, len(answer.get("predictions", []))))
            except OSError as exc:
                failures.append(repr(exc))

        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        until = time.monotonic() + 60
        # every request sent (a request still in its client when the signal comes is not in flight; on two
        # busy cores a client thread can lag past the first answer) and the first answered: the others are
        # queued behind it
        while (len(sent) < 16 or not answers) and time.monotonic() < until:
            time.sleep(0.005)
        time.sleep(0.02)  # and read by the server: its HTTP front parses what the clients sent
        signalled = time.monotonic()
        if how == "sigterm":
            os.kill(proc.pid, signal.SIGTERM)  # to the server alone, as Kubernetes and docker stop send it
        else:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every process of the group gets it
        for t in threads:
            t.join(90)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert failures == [] and len(answers) == 16
    assert all(status == 200 and rows == 64 for _, status, rows in answers)  # every one answered in full
    assert any(when > signalled for when, _, _ in answers)  # some were still in flight at the signal
    assert proc.returncode == 0
    assert "Traceback" not in err.decode() and "KeyboardInterrupt" not in err.decode(), err.decode()[-3000:]
    with pytest.raises(OSError):  # nothing listens any more
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/health")


def test_the_worker_drops_a_request_already_past_its_deadline_and_publishes_its_batch_times(
        points_model: Path, tmp_path: Path) -> None:
    from pipeline.serving.server import CascadeAPI, Job, Refused, ServeConfig

    path = tmp_path / "admission.json"
    api = CascadeAPI(ServeConfig(str(points_model), "torch", p99_ms=50), str(path))
    api.setup(None)
    image = base64.b64encode(png(uint8_images(1, seed=2)[0, 0])).decode()
    stale = {"image": image, STAMP_KEY: {"arrived": time.monotonic() - 1.0}}  # waited 1 s: past the target
    late = api.decode_request(stale)
    assert isinstance(late, Refused) and late.status == 429 and late.retry_after == 1
    assert "past its deadline of 50 ms" in late.message
    response = api.encode_response(late)
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    own = api.decode_request({**stale, "deadline_ms": 5000})  # its own deadline wins over the target
    fresh = api.decode_request({"image": image, STAMP_KEY: {"arrived": time.monotonic()}})
    assert isinstance(own, Job) and isinstance(fresh, Job)
    api.predict([own, fresh])
    outlook = OutlookFile(path).read()
    assert outlook is not None and outlook.point == api.engine.points[-1].name  # a controller: the cheapest
    assert outlook.estimates.measured(api.current.name, 2) > 0 and outlook.max_batch == api.config.max_batch_size
    plain = CascadeAPI(ServeConfig(str(points_model), "torch"), str(tmp_path / "plain.json"))
    plain.setup(None)
    assert isinstance(plain.decode_request(stale), Job)  # no deadline, no target: as before
    plain.predict([fresh])
    assert OutlookFile(tmp_path / "plain.json").read().point == "accurate"  # no controller: the point in use


def test_the_start_line_says_when_the_target_can_only_shed(tiny_model: Path) -> None:
    from pipeline.routing.operating_points import OperatingPoint
    from pipeline.serving.server import ServeConfig, start_line

    close = [OperatingPoint("accurate", (0.5,), 0.9, 104.0), OperatingPoint("exit1", (0.0,), 0.8, 100.0)]
    assert "p99 target 80 ms (the target can only shed" in start_line(ServeConfig(str(tiny_model), p99_ms=80), close)
    assert "shed" not in start_line(ServeConfig(str(tiny_model)), close)  # no target: nothing to say
    apart = [close[0], OperatingPoint("exit1", (0.0,), 0.8, 50.0)]
    assert "shed" not in start_line(ServeConfig(str(tiny_model), p99_ms=80), apart)
