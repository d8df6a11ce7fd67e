"""The guard middleware in front of the engine's app (pipeline.serving.guard), driven as ASGI."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pipeline.serving.guard import GuardMiddleware
from pipeline.serving.limits import ServeLimits
from pipeline.serving.requests import BUDGET_HEADER, STAMP_KEY


class Recorder:
    """An inner app that records what reached it and answers 200 after ``delay`` seconds."""

    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[tuple[dict[str, str], bytes]] = []
        self.delay = delay

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        message = await receive()
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((headers, message.get("body", b"")))
        await asyncio.sleep(self.delay)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(app: Any, body: bytes, content_type: str | None, *, length: int | None = None,
         path: str = "/invocations", chunks: list[bytes | None] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict]:
    return asyncio.run(_call(app, body, content_type, length=length, path=path, chunks=chunks, extra=headers))


async def _call(app: Any, body: bytes, content_type: str | None, *, length: int | None, path: str,
                chunks: list[bytes | None] | None, extra: dict[str, str] | None = None) -> tuple[int, dict]:
    headers = [] if content_type is None else [(b"content-type", content_type.encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    size = len(body) if length is None else length
    if size >= 0:
        headers.append((b"content-length", str(size).encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    parts = list(chunks or [body])
    out: dict[str, Any] = {}

    async def receive() -> dict:
        if parts and parts[0] is not None:  # None: the client stalls there
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = dict(message["headers"])
        else:
            out["body"] = message["body"]

    await app(scope, receive, send)
    answer = json.loads(out["body"]) if out.get("body", b"").startswith(b"{") else {}
    return out["status"], answer


def test_refusals_from_headers_never_reach_the_app() -> None:
    inner = Recorder()
    app = GuardMiddleware(inner, ServeLimits(max_bytes=1000))
    assert call(app, b"x" * 10, None)[0] == 415
    assert call(app, b"x" * 10, "image/png", length=-1)[0] == 411
    status, answer = call(app, b"x", "image/png", length=5000)
    assert status == 413 and answer["error_code"] == "REQUEST_TOO_LARGE"
    assert "5,000 bytes" in answer["message"]
    status, answer = call(app, b"[" * 50 + b"]" * 50, "application/json")
    assert status == 400 and "nests deeper" in answer["message"]
    assert call(app, b"{oops", "application/json")[0] == 400
    assert inner.seen == []


def test_a_raw_image_reaches_the_app_as_json_and_json_passes_with_the_stamp() -> None:
    inner = Recorder()
    app = GuardMiddleware(inner)
    assert call(app, b"\x89PNGdata", "image/png")[0] == 200
    assert call(app, b'{"image": "aGk="}', "application/json", chunks=[b'{"image": ', b'"aGk="}'])[0] == 200
    (headers, body), (_, body2) = inner.seen
    raw, sent = json.loads(body), json.loads(body2)
    assert headers["content-type"] == "application/json" and raw["image"] == "iVBOR2RhdGE="
    assert headers["content-length"] == str(len(body))
    assert sent["image"] == "aGk=" and set(raw) == set(sent) == {"image", STAMP_KEY}
    assert raw[STAMP_KEY]["arrived"] <= sent[STAMP_KEY]["arrived"] <= time.monotonic()


def test_the_stamp_carries_the_budget_header_and_wins_over_a_clients_key() -> None:
    inner = Recorder()
    app = GuardMiddleware(inner)
    body = b'{"images": [], "_cascade": {"arrived": 0, "budget": "x"}}'
    assert call(app, body, "application/json", headers={BUDGET_HEADER: "p2"})[0] == 200
    assert call(app, b"{}", "application/json")[0] == 200
    assert call(app, b"[1]", "application/json")[0] == 200
    (_, first), (_, empty), (_, listed) = inner.seen
    assert json.loads(first)[STAMP_KEY]["budget"] == "p2" and json.loads(first)[STAMP_KEY]["arrived"] > 0
    assert set(json.loads(empty)) == {STAMP_KEY} and listed == b"[1]"


def test_the_queue_is_bounded_and_a_slow_body_times_out() -> None:
    async def flood() -> list[int]:
        app = GuardMiddleware(Recorder(delay=0.2), ServeLimits(max_queue=2))
        calls = [_call(app, b"{}", "application/json", length=None, path="/invocations", chunks=None)
                 for _ in range(4)]
        return sorted(status for status, _ in await asyncio.gather(*calls))

    assert asyncio.run(flood()) == [200, 200, 503, 503]
    slow = GuardMiddleware(Recorder(), ServeLimits(read_timeout=0.2))
    status, answer = call(slow, b"{}", "application/json", length=10, chunks=[b"{", None])  # then stalls
    assert status == 408 and "within 0.2 s" in answer["message"]


def test_other_routes_pass_untouched() -> None:
    inner = Recorder()
    status, _ = call(GuardMiddleware(inner), b"", None, path="/health", length=-1)
    assert status == 200 and len(inner.seen) == 1


def test_budgets_are_refused_before_the_queue() -> None:
    import base64

    from tests.serving.test_requests import png_claiming

    inner = Recorder()
    app = GuardMiddleware(inner, ServeLimits(max_images=8))
    nine = json.dumps({"images": ["aGk="] * 9}).encode()
    status, answer = call(app, nine, "application/json")
    assert status == 413 and "9 images, over the limit of 8" in answer["message"]
    huge = base64.b64encode(png_claiming(4096, 4096)).decode()
    status, answer = call(app, json.dumps({"images": [huge] * 5}).encode(), "application/json")
    assert status == 413 and "declare" in answer["message"]
    assert inner.seen == []
