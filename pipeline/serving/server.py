"""``cascade serve``: the cascade on LitServe, with adaptive batching and the guard in the served path.

Concurrent requests are gathered into one batch (up to ``max_batch_size`` images' requests, waiting at
most ``batch_timeout`` seconds for more) and the batch runs through the engine's early exits: the batch
shrinks at each exit, so easy images cost less at the endpoint too. A bad request is answered on its own
(4xx with a message) and never fails the requests batched with it. LitServe was chosen over MLServer
and BentoML by measurement (docs/DESIGN.md, "Serving").

Endpoints: ``POST /invocations`` (see :mod:`pipeline.serving.requests` for the request forms; the answer
is ``{"predictions": [{class_index, class_name, confidence, exit, subnets, macs}, ...], "operating_point":
{name, accuracy, mean_macs}}``, one row per image, as the registered MLflow model answers, and the point
that served it), ``GET /metrics`` (Prometheus: :mod:`pipeline.serving.metrics`), ``GET /health`` and
``GET /info`` (LitServe's).

Operating points (docs/DESIGN.md 'Serving'): a request may carry a budget (JSON ``"budget"`` or header
``X-Cascade-Budget``: MACs per image, or a point's name) and is answered at the most accurate of the model's
points within it (refused, 400, where none is); a request without one is answered at the point in use:
the accuracy-first one, or with ``p99_ms`` the one the latency controller chose from the measured queue
wait and batch time (:mod:`pipeline.serving.controller`). A batch with several points runs once per point.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import litserve as ls
import numpy as np

from pipeline.routing.operating_points import OperatingPoint, choose_point
from pipeline.serving.admission import Outlook, ServiceEstimates, fallback_point, shed_note
from pipeline.serving.controller import ControlConfig, LatencyController
from pipeline.serving.engines import freeze_heap
from pipeline.serving.limits import PREDICT_PATH, ServeLimits
from pipeline.serving.requests import (
    BadRequest,
    arrival,
    decode_payload,
    decoded_images,
    request_budget,
    request_deadline,
)

DEFAULT_PORT = 8000
DEFAULT_MAX_BATCH = 64
DEFAULT_BATCH_TIMEOUT = 0.0005


@dataclass(frozen=True)
class ServeConfig:
    """How to serve: the model, the engine, batching, the limits and where to listen."""

    model_dir: str
    engine: str = "torch"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_batch_size: int = DEFAULT_MAX_BATCH
    batch_timeout: float = DEFAULT_BATCH_TIMEOUT
    threads: int = 1
    api_servers: int = 1  # LitServe's HTTP front processes (the guard runs there)
    decode_in_front: bool = False  # the fronts decode the images, the worker unpacks uint8 pixels
    exits: bool = True  # False: the static path (every module on every image), for comparison
    limits: ServeLimits = ServeLimits()
    p99_ms: float | None = None  # a latency target: the controller moves along the operating points

    def __post_init__(self) -> None:
        from pipeline.serving.engines import ENGINES

        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_batch_size < 1 or self.threads < 1 or self.api_servers < 1:
            raise ValueError("max_batch_size, threads and api_servers must be >= 1")
        if not 0 < self.batch_timeout <= 1:
            raise ValueError(f"batch_timeout must be in (0, 1] seconds, got {self.batch_timeout}")
        if self.p99_ms is not None and not (self.p99_ms > 0 and self.exits):
            raise ValueError(f"p99_ms must be > 0 and needs the early exits (not --static), got {self.p99_ms}")


STATIC = "static"  # the name batch times are kept under on the static path (no operating point)


class Refused:
    """A request's refusal, carried through the batch to its own answer (picklable); ``retry_after``:
    seconds for a ``Retry-After`` header (None: none)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        self.status, self.message, self.retry_after = status, message, retry_after


@dataclass(frozen=True)
class Job:
    """A decoded request: its images, the point its budget asked for (None: the point in use) and when
    the guard received it (None: not stamped)."""

    images: np.ndarray
    point: OperatingPoint | None = None
    arrived: float | None = None


@dataclass(frozen=True)
class Answer:
    """A request's rows and the point that served them (None: the static path, no early exit)."""

    rows: list[dict[str, Any]]
    point: OperatingPoint | None


def answer_batch(engine: Any, inputs: list[Job | Refused], current: OperatingPoint, exits: bool = True
                 ) -> list[Answer | Refused]:
    """Each request's answer: the jobs grouped by the point that serves them (their own, else ``current``),
    one engine call per group; refusals passed through in place."""
    groups: dict[OperatingPoint, list[tuple[int, Job]]] = {}
    for i, job in enumerate(inputs):
        if isinstance(job, Job):
            groups.setdefault(job.point or current, []).append((i, job))
    out: list[Any] = list(inputs)  # each Job is replaced by its Answer below
    for point, members in groups.items():
        images = np.concatenate([job.images for _, job in members])
        rows = engine.recognize(images, exits=exits, thresholds=point.thresholds if exits else None)
        start = 0
        for i, job in members:
            out[i] = Answer(rows[start:start + len(job.images)], point if exits else None)
            start += len(job.images)
    return out


class CascadeAPI(ls.LitAPI):
    """One engine per worker; requests decoded one by one (or, with ``decode_in_front``, unpacked: the guard
    decoded their images in the HTTP front), batched, answered one by one."""

    def __init__(self, config: ServeConfig, outlook: str | None = None) -> None:
        super().__init__(max_batch_size=config.max_batch_size, batch_timeout=config.batch_timeout,
                         api_path=PREDICT_PATH)
        self.config = config
        self.outlook_path = outlook  # where the batch times are published for admission (None: kept here)

    def setup(self, device: Any) -> None:
        from pipeline.serving.engines import load_engine
        from pipeline.serving.metrics import ServingMetrics

        self.engine = load_engine(self.config.model_dir, self.config.engine, threads=self.config.threads)
        self.metrics = ServingMetrics()  # the metrics folder serve() set (multiprocess mode)
        self.current = self.engine.points[0]  # the accuracy-first point
        self.metrics.in_use(self.current.name, self.current.mean_macs, [p.name for p in self.engine.points],
                            changed=False)
        self.control = None
        self.last_end = -math.inf  # when the engine last finished a batch
        if self.config.p99_ms is not None:
            self.control = latency_controller(self.engine.points, self.config.p99_ms)
        self.estimates = ServiceEstimates()  # batch times per point and size, for admission
        self.costs = {p.name: p.mean_macs for p in self.engine.points}
        self.outlook_file = None
        if self.outlook_path:
            from pipeline.serving.outlook import OutlookFile

            self.outlook_file = OutlookFile(self.outlook_path)
        from pipeline.serving.stopping import quiet_worker

        quiet_worker()  # Ctrl-C reaches this process too: the server stops it once the answers are out
        freeze_heap()  # this worker is spawned: its own heap, loaded now

    def _follow(self, index: int | None) -> None:
        """Use the point the controller moved to (None: it stayed)."""
        if index is not None:
            self.current = self.engine.points[index]
            self.metrics.in_use(self.current.name, self.current.mean_macs, [p.name for p in self.engine.points],
                                changed=True)

    def _point(self, payload: Any) -> OperatingPoint | None:
        """The point a request's budget asks for, or None; a BadRequest where no point meets it."""
        budget = request_budget(payload)
        if budget is None:
            return None
        if not self.config.exits:
            raise BadRequest("this server runs the static path (--static): it has no operating points")
        try:
            return choose_point(self.engine.points, budget)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def _expired(self, payload: Any) -> Refused | None:
        """A refusal for a request already past its deadline (its own, else the target) before its batch:
        answering it late would only take engine time from the requests that can still be in time."""
        deadline = request_deadline(payload)
        deadline = self.config.p99_ms if deadline is None else deadline
        arrived = arrival(payload)
        if deadline is None or arrived is None:
            return None
        waited = 1e3 * (time.monotonic() - arrived)
        if waited <= deadline:
            return None
        return Refused(429, f"waited {waited:.1f} ms for its batch, past its deadline of {deadline:g} ms: "
                            f"dropped before the engine", retry_after=1)

    def decode_request(self, request) -> Job | Refused:  # unannotated: LitServe passes the JSON
        from pipeline.serving.metrics import BUDGET, EXPIRED, reason_of

        try:
            point = self._point(request)
            late = self._expired(request)
        except BadRequest as exc:
            self.metrics.refused(BUDGET)
            return Refused(exc.status, str(exc))
        if late is not None:
            self.metrics.refused(EXPIRED)
            return late
        shape, limits = self.engine.image_shape, self.config.limits
        try:
            images = decoded_images(request, shape, limits)  # the guard decoded them in the HTTP front
            if images is None:  # not through the guard (called in process): decoded here
                images = decode_payload(request, shape, limits)
            return Job(images, point, arrival(request))
        except BadRequest as exc:
            self.metrics.refused(reason_of(exc.status))
            return Refused(exc.status, str(exc))

    def batch(self, inputs: list[Job | Refused]) -> list[Job | Refused]:
        return list(inputs)  # run in predict, grouped by operating point

    def predict(self, inputs: list[Job | Refused]) -> list[Answer | Refused]:
        start = time.monotonic()
        if self.control is not None:
            self._follow(self.control.before(start))
        out = answer_batch(self.engine, inputs, self.current, self.config.exits)
        end = time.monotonic()
        jobs = [x for x in inputs if isinstance(x, Job)]
        arrivals = [j.arrived for j in jobs if j.arrived is not None]
        images = sum(len(j.images) for j in jobs)
        self.metrics.batch(len(jobs), images, end - start, [start - a for a in arrivals])
        outside = max(0.0, start - max(self.last_end, min(arrivals, default=start)))
        if jobs:
            self.estimates.observe(self._served_at(jobs), images, end - start + outside)
        if self.control is not None:
            self._follow(self.control.observe(end, end - start, arrivals, images, outside))
        self.last_end = end
        self._publish(end)
        return out

    def _served_at(self, jobs: list[Job]) -> str:
        """The point that answered most of a batch's images (whose batch time it is kept under)."""
        if not self.config.exits:
            return STATIC
        counts: dict[str, int] = {}
        for job in jobs:
            name = (job.point or self.current).name
            counts[name] = counts.get(name, 0) + len(job.images)
        return max(counts, key=counts.__getitem__)

    def _publish(self, now: float) -> None:
        """Share the batch times with the HTTP fronts, which admit requests by deadline."""
        if self.outlook_file is None:
            return
        point = fallback_point(self.engine.points, self.current, self.control is not None).name
        outlook = Outlook(self.estimates, point if self.config.exits else STATIC, self.costs,
                          self.config.max_batch_size)
        try:
            self.outlook_file.write(outlook, now)
        except OSError:
            pass  # the folder went (the server is stopping): admission reads the last outlook

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs

    def encode_response(self, output: Answer | Refused) -> Any:
        if isinstance(output, Answer):
            point = output.point
            self.metrics.answered([r["exit"] for r in output.rows], point.name if point else "static")
            return {"predictions": output.rows, "operating_point": point and point.to_dict()}
        if isinstance(output, Refused):
            from starlette.responses import Response

            from pipeline.serving.guard import error_body

            headers = {"Retry-After": str(output.retry_after)} if output.retry_after is not None else None
            return Response(error_body(output.status, output.message), status_code=output.status,
                            media_type="application/json", headers=headers)
        raise TypeError(f"no answer for {type(output).__name__}")


def latency_controller(points: Sequence[OperatingPoint], p99_ms: float) -> LatencyController | None:
    """The controller of ``--p99-ms`` over ``points``; None where fewer than two carry a held-out cost:
    there is nowhere to move, and the target is kept by admission alone (it can only shed)."""
    costed = [p for p in points if p.mean_macs is not None]
    if len(costed) < 2 or len(costed) < len(points):
        return None
    return LatencyController([float(p.mean_macs) for p in points], ControlConfig(target_s=p99_ms / 1e3))


def build_server(config: ServeConfig) -> Any:
    """A LitServer for ``config`` (not started): the API, the guard middleware (limits and admission),
    LitServe's timeout; it stops cleanly on SIGTERM and Ctrl-C (:mod:`pipeline.serving.stopping`)."""
    from pipeline.serving.engines import model_image_shape
    from pipeline.serving.guard import GuardMiddleware
    from pipeline.serving.outlook import outlook_path
    from pipeline.serving.stopping import StoppableServer

    outlook = outlook_path()  # the metrics folder serve() set: shared by the fronts and the engine's process
    api = CascadeAPI(config, outlook)
    guard = {"limits": config.limits, "record": True, "target_ms": config.p99_ms, "outlook": outlook,
             # with it the fronts decode the images; without, the worker (measured faster on 2 shared cores)
             "image_shape": model_image_shape(config.model_dir) if config.decode_in_front else None}
    server = StoppableServer(api, accelerator="cpu", workers_per_device=1, timeout=config.limits.timeout,
                             middlewares=[(GuardMiddleware, guard)],
                             model_metadata={"engine": config.engine, "model": os.fspath(config.model_dir),
                                             "exits": config.exits})
    server.app.add_api_route("/metrics", _metrics_endpoint, methods=["GET"], include_in_schema=False)
    return server


def _metrics_endpoint() -> Any:
    from starlette.responses import Response

    from pipeline.serving.metrics import exposition

    body, content_type = exposition()
    return Response(body, media_type=content_type)


def start_line(config: ServeConfig, points: Sequence[OperatingPoint] = ()) -> str:
    """What ``cascade serve`` prints as it starts (``points``: the model's, for the shed-only note)."""
    target = ""
    if config.p99_ms:
        note = shed_note(points)
        target = f"; p99 target {config.p99_ms:g} ms{f' ({note})' if note else ''}"
    return (f"cascade serve: http://{config.host}:{config.port}{PREDICT_PATH} ({config.engine} engine, "
            f"batches of up to {config.max_batch_size} requests, wait {config.batch_timeout * 1e3:g} ms; "
            f"{'early exits' if config.exits else 'static path: no early exit'}{target}; metrics on /metrics)")


def serve(config: ServeConfig, points: Sequence[OperatingPoint] = ()) -> None:
    """Start serving ``config`` and block until SIGTERM or Ctrl-C, then stop cleanly: no new connection,
    the requests in flight answered, the processes ended (:mod:`pipeline.serving.stopping`)."""
    from pipeline.serving.metrics import ENV, enable_multiprocess
    from pipeline.serving.stopping import stopping_on_signals

    owned = os.environ.get(ENV) is None
    folder = enable_multiprocess()  # before any process imports prometheus_client: one folder for all of them
    server = build_server(config)
    freeze_heap()  # before LitServe forks its HTTP processes: they inherit the frozen heap
    print(start_line(config, points), flush=True)
    try:
        with stopping_on_signals(server):
            server.run(host=config.host, port=config.port, num_api_servers=config.api_servers,
                       generate_client_file=False, log_level="warning")
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
