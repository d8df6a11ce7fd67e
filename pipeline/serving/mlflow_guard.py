"""A guard in front of `mlflow models serve`: the scoring server is MLflow's, and some requests it
answers badly before the model ever sees them (measured: docs/RESULTS.md "MLflow's server"): a 50 MB
non-UTF-8 body gets a 400 that echoes it back (a 500 MB response), a missing Content-Type or JSON nested
10,000 deep gets a 500. The project cannot change that server, so it ships this small reverse proxy (the
standard library's HTTP server, and the request checker every served path uses:
:mod:`pipeline.serving.limits`) that refuses such requests itself, with short JSON answers, and forwards
the rest:

    mlflow models serve -m "models:/$MODEL@champion" --env-manager local --host 127.0.0.1 --port 5001
    python -m pipeline.serving.mlflow_guard --upstream http://127.0.0.1:5001 --port 5000   # clients call :5000

Rules, in order: only ``POST /invocations`` and ``GET /ping | /health | /version`` pass (404); a POST
needs a Content-Length (411) of at most ``--max-bytes`` (413, the body is never read), not 0 (400), a
Content-Type of ``application/json`` or ``text/csv`` (415), a UTF-8 body (400) and, for JSON, nesting at
most ``--max-depth`` deep (400). The upstream's answer is passed on; an error answer's body is cut to
``--max-error-bytes``, so a server that echoes the request cannot multiply its size. An upstream that
does not answer within ``--timeout`` seconds gets 504.
"""

from __future__ import annotations

import argparse
import http.client
import json
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pipeline.serving.limits import (
    MAX_REQUEST_BYTES,
    BadRequest,
    ServeLimits,
    check_headers,
    check_text,
    media_type,
)

# The body may hold the model's MAX_REQUEST_BYTES of image data (base64 text) and the JSON around it.
MAX_BYTES = MAX_REQUEST_BYTES * 5 // 4
MAX_DEPTH = 32  # the scoring formats nest 4 deep at most
MAX_ERROR_BYTES = 4096
CONTENT_TYPES = ("application/json", "text/csv")  # MLflow's scoring server reads these
GET_PATHS = ("/ping", "/health", "/version")


@dataclass(frozen=True)
class GuardSettings:
    """The proxy's own settings beside the request limits every served path shares (``limits``:
    ``max_bytes``, ``max_depth``, ``timeout`` for the upstream's answer)."""

    upstream: str
    limits: ServeLimits
    host: str = "127.0.0.1"
    port: int = 5000
    max_error_bytes: int = MAX_ERROR_BYTES  # an upstream error answer is cut to this
    quiet: bool = False


def check_request(method: str, path: str, headers: Any, limits: ServeLimits) -> tuple[int, str] | None:
    """(status, message) refusing a request from its line and headers alone, or None to read on."""
    route = urllib.parse.urlsplit(path).path
    if method == "GET":
        return None if route in GET_PATHS else (404, f"no such endpoint: GET {route}")
    if route != "/invocations":
        return 404, f"no such endpoint: POST {route}"
    return check_headers("POST", route, headers.get("Content-Length"), headers.get("Content-Type"), limits,
                         accepted=CONTENT_TYPES)


def check_body(body: bytes, content_type: str, limits: ServeLimits) -> tuple[int, str] | None:
    """(status, message) refusing a read body (not UTF-8; JSON too deep), or None to forward it."""
    try:
        check_text(body, limits, is_json=media_type(content_type) == "application/json")
    except BadRequest as exc:
        return exc.status, str(exc)
    return None


class GuardHandler(BaseHTTPRequestHandler):
    server_version = "cascade-serve-guard"
    settings: GuardSettings  # set on the subclass by make_server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if not self.settings.quiet:
            super().log_message(format, *args)

    def _answer(self, status: int, body: bytes, content_type: str = "application/json",
                close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, message: str, close: bool = False) -> None:
        code = {400: "BAD_REQUEST", 404: "ENDPOINT_NOT_FOUND", 411: "LENGTH_REQUIRED",
                413: "REQUEST_TOO_LARGE", 415: "UNSUPPORTED_MEDIA_TYPE", 502: "BAD_GATEWAY",
                504: "GATEWAY_TIMEOUT"}.get(status, "ERROR")
        self._answer(status, json.dumps({"error_code": code, "message": message}).encode(), close=close)

    def _forward(self, method: str, body: bytes | None) -> None:
        up = urllib.parse.urlsplit(self.settings.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port or 80, timeout=self.settings.limits.timeout)
        headers = {"Content-Type": self.headers.get("Content-Type", "")} if body is not None else {}
        try:
            conn.request(method, self.path, body=body, headers=headers)
            reply = conn.getresponse()
            cap = self.settings.max_error_bytes if reply.status >= 400 else None
            data = reply.read(cap) if cap is not None else reply.read()
            if cap is not None and reply.read(1):
                data += b" ... (cut by the guard)"
            self._answer(reply.status, data, reply.getheader("Content-Type", "application/json"))
        except TimeoutError:
            self._refuse(504, f"the model server did not answer within {self.settings.limits.timeout:g} s")
        except OSError as exc:
            self._refuse(502, f"the model server is unreachable: {exc}")
        finally:
            conn.close()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        refused = check_request("GET", self.path, self.headers, self.settings.limits)
        if refused:
            self._refuse(*refused)
        else:
            self._forward("GET", None)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        refused = check_request("POST", self.path, self.headers, self.settings.limits)
        if refused:
            self._refuse(*refused, close=True)  # the body was not read: the connection cannot be reused
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        refused = check_body(body, self.headers.get("Content-Type", ""), self.settings.limits)
        if refused:
            self._refuse(*refused)
        else:
            self._forward("POST", body)


def make_server(settings: GuardSettings) -> ThreadingHTTPServer:
    handler = type("Handler", (GuardHandler,), {"settings": settings})
    server = ThreadingHTTPServer((settings.host, settings.port), handler)
    server.daemon_threads = True
    return server


def parse_args(argv: list[str] | None = None) -> GuardSettings:
    p = argparse.ArgumentParser(prog="python -m pipeline.serving.mlflow_guard", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="the model server, e.g. http://127.0.0.1:5001")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=5000, help="port to listen on (default: 5000)")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help=f"largest body (default: {MAX_BYTES:,})")
    p.add_argument("--max-depth", type=int, default=MAX_DEPTH, help=f"deepest JSON (default: {MAX_DEPTH})")
    p.add_argument("--max-error-bytes", type=int, default=MAX_ERROR_BYTES,
                   help=f"an upstream error answer is cut to this (default: {MAX_ERROR_BYTES})")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the upstream (default: 60)")
    p.add_argument("--quiet", action="store_true", help="no access log")
    args = p.parse_args(argv)
    up = urllib.parse.urlsplit(args.upstream)
    if up.scheme != "http" or not up.hostname:
        p.error(f"--upstream must be an http://host:port URL, got {args.upstream!r}")
    if args.max_error_bytes <= 0:
        p.error("--max-error-bytes must be > 0")
    try:
        limits = ServeLimits(max_bytes=args.max_bytes, max_depth=args.max_depth, timeout=args.timeout)
    except ValueError as exc:  # ServeLimits.max_bytes must be a number > 0 ...
        p.error(str(exc).replace("ServeLimits.", "--").replace("_", "-"))
    return GuardSettings(args.upstream, limits, args.host, args.port, args.max_error_bytes, args.quiet)


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    server = make_server(settings)
    print(f"serve_guard: http://{settings.host}:{server.server_address[1]} -> {settings.upstream} "
          f"(bodies <= {settings.limits.max_bytes:,} bytes, JSON <= {settings.limits.max_depth} deep)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
