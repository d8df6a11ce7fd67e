"""The cascade's own serving metrics, for Prometheus (``GET /metrics``; docs/DESIGN.md 'Serving').

What a team running the model needs to see and no engine reports: images answered at each exit, the
operating point in use and its changes, the points requests were answered at, batch sizes, the engine's
batch latency, the queue wait and the whole server-side latency of a request, refusals by reason, and for
requests with a deadline (admission, :mod:`pipeline.serving.admission`): the answers in time (goodput) and
late, and the measured latency over the predicted one.

LitServe answers HTTP in one process (or several) and runs the engine in another, so the metrics use
``prometheus_client``'s multiprocess mode: :func:`enable_multiprocess` points ``PROMETHEUS_MULTIPROC_DIR``
at a fresh folder before ``prometheus_client`` is first imported, every process writes its values there,
and :func:`exposition` reads them all. Without it (tests, one process) the metrics live in the registry
given. ``prometheus_client`` is imported only inside this module's functions, so the variable can still
be set first.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

ENV = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "cascade"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 8.0)  # measured / predicted
REASONS = {400: "bad_request", 408: "body_timeout", 411: "length_required", 413: "too_large",
           415: "unsupported_media_type", 429: "deadline", 503: "overloaded", 504: "timeout"}
BUDGET = "budget"  # a request's budget that no operating point meets (or names no point)
DEADLINE = "deadline"  # refused at admission: predicted to miss its deadline even at the fallback point
EXPIRED = "expired"  # admitted, but past its deadline before its batch: dropped before the engine


def reason_of(status: int) -> str:
    """The refusal reason a status stands for (``other`` for one not listed)."""
    return REASONS.get(status, "other")


def enable_multiprocess(directory: str | None = None) -> str:
    """Point prometheus_client at a folder shared by this process and the ones it starts (a fresh one
    unless given); must run before prometheus_client is imported, so a late call fails loudly."""
    if "prometheus_client" in sys.modules and os.environ.get(ENV) is None:
        raise RuntimeError("prometheus_client was imported before the metrics folder was set: the server's "
                           "processes would each count alone")
    folder = directory or os.environ.get(ENV) or tempfile.mkdtemp(prefix="cascade-metrics-")
    os.environ[ENV] = folder
    return folder


def exposition(registry: Any = None) -> tuple[bytes, str]:
    """The text exposition of every process's metrics (multiprocess mode) or of ``registry``, and its
    content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

    if registry is None:
        registry = CollectorRegistry()
        if os.environ.get(ENV):
            multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class ServingMetrics:
    """The metrics one process records. ``registry``: where they register (None in multiprocess mode,
    where the values go to the shared folder and :func:`exposition` collects them)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        kw = {"registry": registry}
        self.images = Counter(f"{PREFIX}_images", "Images answered, by the exit that answered", ["exit"], **kw)
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered, by the operating point that served",
                                ["point"], **kw)
        self.refusals = Counter(f"{PREFIX}_refusals", "Requests refused, by reason", ["reason"], **kw)
        self.point = Gauge(f"{PREFIX}_operating_point", "1 for the operating point in use for requests without "
                           "a budget, 0 for the others", ["point"], multiprocess_mode="mostrecent", **kw)
        self.point_macs = Gauge(f"{PREFIX}_operating_point_macs", "Held-out mean MACs per image of the point in "
                                "use", multiprocess_mode="mostrecent", **kw)
        self.changes = Counter(f"{PREFIX}_operating_point_changes", "Moves of the operating point in use", **kw)
        self.batch_images = Histogram(f"{PREFIX}_batch_images", "Images per engine batch", buckets=SIZE_BUCKETS,
                                      **kw)
        self.batch_requests = Histogram(f"{PREFIX}_batch_requests", "Requests per engine batch",
                                        buckets=SIZE_BUCKETS, **kw)
        self.batch_seconds = Histogram(f"{PREFIX}_batch_seconds", "Engine time per batch",
                                       buckets=LATENCY_BUCKETS, **kw)
        self.queue_seconds = Histogram(f"{PREFIX}_queue_wait_seconds", "From the request's arrival to its "
                                       "batch's start", buckets=LATENCY_BUCKETS, **kw)
        self.latency = Histogram(f"{PREFIX}_request_seconds", "From the request's arrival to its answer's start "
                                 "(server side), by status", ["status"], buckets=LATENCY_BUCKETS, **kw)
        self.goodput = Counter(f"{PREFIX}_goodput", "Answers (200) delivered within their deadline (requests "
                               "with one: their own or the p99 target)", **kw)
        self.late = Counter(f"{PREFIX}_late_answers", "Answers (200) delivered past their deadline", **kw)
        self.prediction = Histogram(f"{PREFIX}_admission_latency_ratio", "Measured server-side latency over "
                                    "the latency admission predicted, per answered request with a prediction",
                                    buckets=RATIO_BUCKETS, **kw)

    def answered(self, exits: Sequence[int], point: str) -> None:
        """One request's answer: its images' exits (1-based) and the point that served it."""
        for exit_k in exits:
            self.images.labels(exit=str(exit_k)).inc()
        self.requests.labels(point=point).inc()

    def batch(self, requests: int, images: int, seconds: float, waits: Sequence[float]) -> None:
        self.batch_requests.observe(requests)
        self.batch_images.observe(images)
        self.batch_seconds.observe(seconds)
        for wait in waits:
            self.queue_seconds.observe(max(0.0, wait))

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason=reason).inc()

    def in_use(self, point: str, mean_macs: float | None, names: Sequence[str], *, changed: bool) -> None:
        """The point now in use for requests without a budget (``changed``: a move, not the first set)."""
        for name in names:
            self.point.labels(point=name).set(1.0 if name == point else 0.0)
        if mean_macs is not None:
            self.point_macs.set(mean_macs)
        if changed:
            self.changes.inc()

    def responded(self, status: int, seconds: float) -> None:
        self.latency.labels(status=str(status)).observe(max(0.0, seconds))

    def deadline(self, status: int, seconds: float, deadline_s: float | None, predicted_s: float | None) -> None:
        """An answer to a request with a deadline: in time or late (200 only), and how far the prediction
        admission made was off (measured / predicted)."""
        if status != 200 or deadline_s is None:
            return
        (self.goodput if seconds <= deadline_s else self.late).inc()
        if predicted_s:
            self.prediction.observe(max(0.0, seconds) / predicted_s)
