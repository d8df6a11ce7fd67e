"""The guard inside the served path: an ASGI middleware on the serving engine's own app.

Before a prediction request reaches the engine's queue it is refused, with a short JSON answer
``{"error_code", "message"}``, when its headers say so (411 no length, 413 too large, 415 wrong
type; :func:`pipeline.serving.limits.check_headers`, the body is never read), when the server
already holds ``max_queue`` requests (503 with ``Retry-After``: the queue is bounded, not grown),
when its body does not arrive within ``read_timeout`` (408), when its JSON is not UTF-8, nests too
deep or does not parse (400), or when it is over the image count or pixel budget of a request (413).
A raw image body (``image/png``, ``image/jpeg``, ``application/octet-stream``) is handed on as
``{"image": "<base64>"}`` (:func:`pipeline.serving.requests.wrap_raw`), so the engine's decoder
reads one form; a prediction's JSON gets the guard's stamp (its arrival time on the shared monotonic
clock and the ``X-Cascade-Budget`` header: :func:`pipeline.serving.requests.stamped`), from which the
worker measures the queue wait and reads the budget. Given the model's ``image_shape``
(``cascade serve --decode-in-front``) the guard decodes the images itself, once admitted, with the same
decoder and limits (:func:`pipeline.serving.requests.decode_payload`), refuses a bad one in the worker's
words, and hands the worker the uint8 pixels in its stamp (:func:`pipeline.serving.requests.decoded_body`).
A request with a deadline (``X-Deadline-Ms`` or JSON
``deadline_ms``, else ``target_ms``, the server's ``--p99-ms``) is admitted only if the serving process's
outlook (:mod:`pipeline.serving.outlook`) predicts its answer in time behind the requests in flight here,
else refused at once: 429, ``Retry-After`` and the predicted and deadline ms
(:mod:`pipeline.serving.admission`). With ``record``, refusals by reason, every answer's server-side
latency and the deadlines met or missed go to the cascade's metrics (:mod:`pipeline.serving.metrics`).
Everything else passes untouched.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.serving.admission import PROBE_S, Correction, Verdict, judge, predict_seconds, refusal
from pipeline.serving.limits import JSON_TYPE, RAW_TYPES, BadRequest, ServeLimits, check_headers, media_type
from pipeline.serving.requests import (
    BUDGET_HEADER,
    DEADLINE_HEADER,
    decode_payload,
    decode_raw,
    decoded_body,
    image_count,
    parse_json,
    precheck,
    request_deadline,
    stamped,
    wrap_raw,
)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ERROR_CODES = {400: "BAD_REQUEST", 408: "REQUEST_TIMEOUT", 411: "LENGTH_REQUIRED", 413: "REQUEST_TOO_LARGE",
               415: "UNSUPPORTED_MEDIA_TYPE", 429: "DEADLINE", 503: "OVERLOADED"}


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error_code": ERROR_CODES.get(status, "ERROR"), "message": message}).encode()


async def _answer(send: Send, status: int, message: str, *, close: bool = False, body: bytes | None = None,
                  retry_after: int = 1) -> None:
    body = error_body(status, message) if body is None else body
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (429, 503):
        headers.append((b"retry-after", str(retry_after).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the request body is longer than its Content-Length ({limit:,} bytes)", 413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class GuardMiddleware:
    """ASGI middleware enforcing :class:`ServeLimits` in front of the engine's endpoints."""

    def __init__(self, app: Callable[..., Awaitable[None]], limits: ServeLimits | None = None,
                 record: bool = False, target_ms: float | None = None, outlook: str | None = None,
                 image_shape: tuple[int, int, int] | None = None) -> None:
        from pipeline.serving.outlook import OutlookFile

        self.app = app
        self.limits = limits or ServeLimits()
        # the model's input (C, H, W): the guard decodes the images and hands the worker uint8 pixels
        # (None: the body goes on as JSON and the worker decodes it)
        self.image_shape = None if image_shape is None else tuple(int(v) for v in image_shape)
        self.decoder: ThreadPoolExecutor | None = None
        self.target_ms = target_ms  # the deadline of a request without its own
        self.outlook = OutlookFile(outlook) if outlook else None  # the engine's process publishes it
        self.in_flight = 0  # requests in this guard: being read, judged, or admitted and not yet answered
        self.admitted = 0  # of those, the ones admitted and not yet answered: the work ahead of a new request
        self.last_admitted = time.monotonic()  # admission's last yes: a probe goes through PROBE_S after it,
        self.refused_since = 0  # if requests were refused since (while everything is refused, not before)
        self.images_in_flight = 0  # of the requests admitted and not yet answered
        self.correction = Correction()  # the batch times' prediction against the answers' measured latency
        self.metrics = None
        if record:  # built in the HTTP process, after serve() set the metrics folder
            from pipeline.serving.metrics import ServingMetrics

            self.metrics = ServingMetrics()

    async def _refuse(self, send: Send, status: int, message: str, *, close: bool = False) -> None:
        if self.metrics is not None:
            from pipeline.serving.metrics import reason_of

            self.metrics.refused(reason_of(status))
        await _answer(send, status, message, close=close)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refused = check_headers(scope["method"], scope["path"], headers.get("content-length"),
                                headers.get("content-type"), self.limits)
        if refused:
            await self._refuse(send, *refused, close=True)  # the body was not read: the connection cannot stay
            return
        if scope["method"] != "POST" or scope["path"] != "/invocations":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limits.max_queue:
            await self._refuse(send, 503, f"the server holds {self.in_flight} requests, its limit: retry shortly",
                          close=True)
            return
        self.in_flight += 1
        try:
            await self._guarded(scope, receive, send, headers)
        finally:
            self.in_flight -= 1

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        length, arrived, budget = int(headers["content-length"]), time.monotonic(), headers.get(BUDGET_HEADER)
        try:
            body = await asyncio.wait_for(_read_body(receive, length), self.limits.read_timeout)
            kind = media_type(headers.get("content-type"))
            payload = parse_check(body, self.limits) if kind == JSON_TYPE else None
            deadline = request_deadline(payload, headers.get(DEADLINE_HEADER))
            deadline = self.target_ms if deadline is None else deadline
            if self.image_shape is None:  # the worker decodes: the body goes on as JSON, stamped
                if kind in RAW_TYPES:
                    body = stamped(wrap_raw(body), arrived, budget, deadline)
                elif isinstance(payload, dict):
                    body = stamped(body, arrived, budget, deadline)
        except TimeoutError:
            await self._refuse(send, 408, f"the request body did not arrive within {self.limits.read_timeout:g} s",
                          close=True)
            return
        except ConnectionError:
            return
        except BadRequest as exc:
            await self._refuse(send, exc.status, str(exc))
            return
        images = image_count(payload)
        verdict = self._admit(deadline, images, time.monotonic() - arrived)
        if not verdict.admit:
            await self._shed(send, verdict)
            return
        timed = self._timed(send, arrived, verdict)
        self.admitted += 1
        self.images_in_flight += images
        try:
            if self.image_shape is not None:
                try:
                    body = decoded_body(await self._decode(body, kind, payload), payload, arrived, budget, deadline)
                except BadRequest as exc:  # answered as the worker answered it: counted, timed, its own words
                    if self.metrics is not None:
                        from pipeline.serving.metrics import reason_of

                        self.metrics.refused(reason_of(exc.status))
                    await _answer(timed, exc.status, str(exc))
                    return
            await self._forward(scope, receive, timed, body)
        finally:
            self.admitted -= 1
            self.images_in_flight -= images

    async def _decode(self, body: bytes, kind: str, payload: Any) -> Any:
        """The request's images as the model's uint8 input, decoded here in the HTTP front with the decoder
        and limits the worker used (a BadRequest naming what is wrong). In a thread, so this front keeps
        reading other requests meanwhile: decoded on the event loop, a burst of requests waited unread in the
        kernel's backlog, and a stop signal dropped them there (tests/serving/test_server_stop.py). One thread:
        the decoding holds the GIL for much of its time, and more threads took it from the event loop too."""
        def decode() -> Any:
            if kind in RAW_TYPES:
                return decode_raw(body, self.image_shape, self.limits)
            return decode_payload(payload, self.image_shape, self.limits)

        if self.decoder is None:  # made here, in the HTTP process that uses it (not before a fork)
            self.decoder = ThreadPoolExecutor(1, thread_name_prefix="cascade-decode")
        return await asyncio.get_running_loop().run_in_executor(self.decoder, decode)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        """Hand ``body`` to the engine's app as the request's JSON body."""
        scope = {**scope, "headers": _json_headers(scope["headers"], len(body))}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # after the body: only a disconnect can come
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _admit(self, deadline_ms: float | None, images: int, waited_s: float) -> Verdict:
        """Admit or refuse a request of ``images`` with ``deadline_ms`` (None: admitted unread) behind the
        requests admitted here and not yet answered. Not behind every request in this guard: those still
        being read or judged may be refused, and counted as work ahead they made a burst of closed-loop
        clients refuse itself (128 clients: 3-12% of capacity answered, docs/RESULTS.md 'Under a load
        step')."""
        now = time.monotonic()
        if deadline_ms is None:
            self.last_admitted, self.refused_since = now, 0
            return Verdict(True, None, None)
        outlook = self.outlook.read() if self.outlook is not None else None
        predicted = None if outlook is None else predict_seconds(outlook, self.admitted, self.images_in_flight,
                                                                 images)
        if predicted is not None:
            predicted = self.correction.apply(predicted)
        probe = self.refused_since > 0 and now - self.last_admitted >= PROBE_S
        verdict = judge(predicted, deadline_ms / 1e3, waited_s, probe=probe)
        if verdict.admit:
            self.last_admitted, self.refused_since = now, 0
        else:
            self.refused_since += 1
        return verdict

    async def _shed(self, send: Send, verdict: Verdict) -> None:
        """Refuse a request predicted to miss its deadline: 429, Retry-After and why, in numbers."""
        from pipeline.serving.metrics import DEADLINE

        if self.metrics is not None:
            self.metrics.refused(DEADLINE)
        outlook = self.outlook.read() if self.outlook is not None else None
        body = refusal(verdict, outlook.point if outlook else "?")
        await _answer(send, 429, body["message"], body=json.dumps(body).encode(), retry_after=verdict.retry_after_s)

    def _timed(self, send: Send, arrived: float, verdict: Verdict | None = None) -> Send:
        """``send``, learning the prediction's error from an answer admitted on one, and recording the
        answer's status and server-side latency (and LitServe's 504 as a refusal) and, for a request with a
        deadline, whether it was met and how far the prediction was off."""
        deadline_s, predicted_s = (verdict.deadline_s, verdict.predicted_s) if verdict else (None, None)
        if self.metrics is None and predicted_s is None:
            return send
        metrics, correction = self.metrics, self.correction

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                seconds = time.monotonic() - arrived
                if predicted_s is not None and message["status"] == 200:
                    correction.update(seconds, predicted_s)
                if metrics is not None:
                    metrics.responded(message["status"], seconds)
                    metrics.deadline(message["status"], seconds, deadline_s, predicted_s)
                    if message["status"] == 504:
                        metrics.refused("timeout")
            await send(message)

        return timed


def parse_check(body: bytes, limits: ServeLimits) -> Any:
    """Refuse a JSON body that is not UTF-8, nests too deep or does not parse (the engine's framework
    would answer 500), or that is over the request budgets (:func:`pipeline.serving.requests.precheck`);
    the parsed payload otherwise."""
    payload = parse_json(body, limits)
    precheck(payload, limits)
    return payload


def _json_headers(raw: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in raw if k.lower() not in (b"content-type", b"content-length")]
    return [*kept, (b"content-type", b"application/json"), (b"content-length", str(length).encode())]

