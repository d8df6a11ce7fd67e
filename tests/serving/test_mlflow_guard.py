"""The guard in front of `mlflow models serve`, against a stand-in upstream that behaves as MLflow's
server did when measured (it echoes a bad body in its 400 answer)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.serving.limits import ServeLimits, json_depth_exceeds
from pipeline.serving.mlflow_guard import GuardSettings, check_request, make_server, parse_args


class EchoUpstream(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, b"\n")

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if body.startswith(b'{"echo'):
            self._send(400, b'{"message": "bad: ' + body * 50 + b'"}')  # as MLflow echoed bad bodies
        else:
            self._send(200, json.dumps({"predictions": [{"class_index": 3}]}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def guard() -> Iterator[int]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), EchoUpstream)
    serve(upstream)
    limits = parse_args(["--upstream", f"http://127.0.0.1:{upstream.server_address[1]}", "--port", "0",
                         "--max-bytes", "100000", "--max-depth", "8", "--max-error-bytes", "300", "--quiet"])
    server = make_server(limits)
    serve(server)
    yield server.server_address[1]
    server.shutdown()
    upstream.shutdown()


def call(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


JSON = {"Content-Type": "application/json"}


def test_a_good_request_and_the_health_check_pass(guard: int) -> None:
    status, body = call(guard, "POST", "/invocations", b'{"dataframe_split": {"columns": ["image"]}}', JSON)
    assert status == 200 and json.loads(body) == {"predictions": [{"class_index": 3}]}
    assert call(guard, "GET", "/ping")[0] == 200


@pytest.mark.parametrize(("body", "headers", "status", "says"), [
    (b"\xff\xfe" * 40000, JSON, 400, "not UTF-8"),
    (b"[" * 10000 + b"]" * 10000, JSON, 400, "deeper than 8"),
    (b'{"a": 1}', {}, 415, "Content-Type"),
    (b'{"a": 1}', {"Content-Type": "text/plain"}, 415, "text/plain"),
    (b"x" * 100001, JSON, 413, "over the limit of 100,000"),
])
def test_bad_requests_get_short_clear_answers(guard: int, body: bytes, headers: dict, status: int,
                                              says: str) -> None:
    got, answer = call(guard, "POST", "/invocations", body, headers)
    assert got == status and len(answer) < 300
    assert says in json.loads(answer)["message"]


def test_brackets_inside_strings_do_not_count_and_paths_are_closed(guard: int) -> None:
    assert not json_depth_exceeds('{"a": "[[[[[[[[[[[[[[[[[[", "b": "\\"[["}', 2)
    assert json_depth_exceeds('{"a": [[1]]}', 2)
    assert call(guard, "POST", "/admin", b"{}", JSON)[0] == 404
    assert call(guard, "GET", "/invocations")[0] == 404


def test_an_upstream_error_that_echoes_the_body_is_cut(guard: int) -> None:
    status, answer = call(guard, "POST", "/invocations", b'{"echo": "' + b"A" * 5000 + b'"}', JSON)
    assert status == 400 and len(answer) <= 300 + len(" ... (cut by the guard)")
    assert answer.endswith(b"(cut by the guard)")


def test_the_guard_refuses_a_bad_upstream_url() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--upstream", "ftp://x"])


def test_an_unreachable_model_server_is_a_502() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # a port nobody listens on once the socket is closed
    server = make_server(parse_args(["--upstream", f"http://127.0.0.1:{closed}", "--port", "0", "--quiet"]))
    serve(server)
    try:
        status, answer = call(server.server_address[1], "POST", "/invocations", b"{}", JSON)
        assert status == 502 and "unreachable" in json.loads(answer)["message"]
    finally:
        server.shutdown()


def test_the_guard_checks_with_the_served_paths_limits() -> None:
    """One limits type: the flags become a ServeLimits, checked by the one request checker."""
    settings = parse_args(["--upstream", "http://127.0.0.1:1", "--max-bytes", "100", "--max-depth", "4",
                           "--timeout", "2.5"])
    assert isinstance(settings, GuardSettings)
    assert settings.limits == ServeLimits(max_bytes=100, max_depth=4, timeout=2.5)
    assert check_request("POST", "/invocations", {"Content-Length": "0", "Content-Type": "text/csv"},
                         settings.limits) == (400, "the request body is empty (send one of: application/json, "
                                                   "text/csv)")
    assert check_request("POST", "/invocations?x=1", {"Content-Length": "5", "Content-Type": "text/csv"},
                         settings.limits) is None
    with pytest.raises(SystemExit):
        parse_args(["--upstream", "http://127.0.0.1:1", "--max-depth", "0"])
