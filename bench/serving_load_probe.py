"""The two threads of ``bench/serving_load.py`` beside hey's load: a labelled probe that sends requests of
the load's shape through the test split and records what each answer says (its point, exits, and whether
it was right), and a reader of ``GET /metrics`` that records the operating point in use and the requests
answered per point (docs/DESIGN.md 'Serving'). Both keep one keep-alive connection and time on the run's
clock (``time.monotonic() - t0``).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable

import numpy as np

from bench.serving import json_body
from bench.serving_load_stats import ProbeAnswer, Scrape

TIMEOUT = 30.0


class Connection:
    """A keep-alive HTTP connection to the server that reconnects after an error."""

    def __init__(self, port: int) -> None:
        self.port, self.conn = port, None

    def request(self, method: str, path: str, body: bytes | None = None, kind: str | None = None
                ) -> tuple[int, bytes]:
        """(status, body); status 0 where the connection failed."""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
            self.conn.request(method, path, body=body, headers={"Content-Type": kind} if kind else {})
            reply = self.conn.getresponse()
            return reply.status, reply.read()
        except (OSError, http.client.HTTPException):
            self.close()
            return 0, b""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def request_body(pngs: list[bytes]) -> tuple[bytes, str]:
    """A request of the load's shape: one PNG raw (as ``bench.serving`` sends), several as JSON base64."""
    if len(pngs) == 1:
        return pngs[0], "image/png"
    return json_body(pngs).encode(), "application/json"


def judge(t: float, status: int, body: bytes, labels: np.ndarray) -> ProbeAnswer:
    """One reply -> what it says: its point, its images' exits, how many match ``labels``."""
    if status != 200:
        return ProbeAnswer(t, status, None, (), 0, len(labels))
    answer = json.loads(body)
    rows = answer["predictions"]
    point = (answer.get("operating_point") or {}).get("name")
    correct = sum(int(r["class_index"]) == int(y) for r, y in zip(rows, labels, strict=True))
    return ProbeAnswer(t, status, point, tuple(int(r["exit"]) for r in rows), correct, len(labels))


class Probe(threading.Thread):
    """Sends ``per_request`` test images at a time, one request after another (at most ``qps`` a second),
    from ``first`` on through the split (cycling), until stopped; ``answers`` holds what each reply said."""

    def __init__(self, port: int, images: np.ndarray, labels: np.ndarray, per_request: int, t0: float,
                 first: int = 0, encode: Callable[[np.ndarray], bytes] | None = None, qps: float | None = None
                 ) -> None:
        super().__init__(daemon=True)
        from pipeline.registry.payload import encode_png

        self.port, self.images, self.labels, self.k, self.t0 = port, images, labels, per_request, t0
        self.next, self.encode = first % len(images), encode or encode_png
        self.cache: dict[int, bytes] = {}
        self.stop = threading.Event()
        self.answers: list[ProbeAnswer] = []
        self.gap = 0.0 if qps is None else 1.0 / qps  # at most qps requests per second (None: a closed loop)

    def _png(self, i: int) -> bytes:
        if i not in self.cache:
            self.cache[i] = self.encode(self.images[i])
        return self.cache[i]

    def run(self) -> None:
        conn = Connection(self.port)
        due = time.monotonic()
        while not self.stop.is_set():
            if self.gap and self.stop.wait(max(0.0, due - time.monotonic())):
                break
            due = max(due + self.gap, time.monotonic() - self.gap)  # no burst to catch up after a slow answer
            index = [(self.next + j) % len(self.images) for j in range(self.k)]
            self.next = (self.next + self.k) % len(self.images)
            body, kind = request_body([self._png(i) for i in index])
            status, reply = conn.request("POST", "/invocations", body, kind)
            self.answers.append(judge(time.monotonic() - self.t0, status, reply, self.labels[index]))
            if status == 0:
                time.sleep(0.05)  # the server is gone or restarting: do not spin
        conn.close()


def read_metrics(text: str, t: float) -> Scrape:
    """The point in use (``cascade_operating_point{point} == 1``), ``cascade_requests_total{point}`` and the
    engine seconds so far (``cascade_batch_seconds_sum``)."""
    from prometheus_client.parser import text_string_to_metric_families

    point, requests, engine_s = None, {}, 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "cascade_operating_point" and s.value == 1:
                point = s.labels.get("point")
            elif s.name == "cascade_requests_total":
                requests[s.labels.get("point", "")] = s.value
            elif s.name == "cascade_batch_seconds_sum":
                engine_s += s.value  # one sample per engine process
    return Scrape(t, point, requests, engine_s)


class Scraper(threading.Thread):
    """Reads ``/metrics`` every ``every`` seconds until stopped; ``scrapes`` holds the reads."""

    def __init__(self, port: int, t0: float, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.port, self.t0, self.every = port, t0, every
        self.stop = threading.Event()
        self.scrapes: list[Scrape] = []

    def run(self) -> None:
        conn = Connection(self.port)
        while not self.stop.wait(self.every):
            status, body = conn.request("GET", "/metrics")
            if status == 200:
                self.scrapes.append(read_metrics(body.decode(), time.monotonic() - self.t0))
        conn.close()
