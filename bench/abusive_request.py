"""Abusive requests for a served cascade (``cascade serve``): each one, its expected refusal, and a
sender that times the answer. ``bench.serving`` sends them all while 64 clients load the server and
checks that each gets a 4xx in under a second and that the good requests keep their p99.

    python -m bench.abusive_request --port 8000     # against a running `cascade serve`

The list starts with the first abusive request of docs/RESULTS.md "Serving" ("Abusive requests under
load"): 768 copies of a 16 KB PNG whose header declares 4096 x 4096 pixels (16.4 MB of JSON, 12.9 billion
pixels declared).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import socket
import struct
import sys
import time
import zlib


def png_claiming(width: int, height: int, payload: int = 16_000) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` followed by random bytes no decoder should reach."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = chunk(b"IDAT", os.urandom(payload))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + idat + chunk(b"IEND", b"")


def _images(blob: bytes, n: int, v2: bool = False) -> bytes:
    data = [base64.b64encode(blob).decode()] * n
    if v2:  # KServe v2 (cascade serve --server triton): a BYTES input of base64 PNGs
        return json.dumps({"inputs": [{"name": "image", "shape": [n, 1], "datatype": "BYTES", "data": data}]}).encode()
    return json.dumps({"images": data}).encode()


def abusive_requests(good_png: bytes, v2: bool = False) -> dict[str, tuple[bytes, dict[str, str]]]:
    """name -> (body, headers) of every abusive request (Content-Length is set by the sender); ``v2``:
    in the KServe v2 form of ``cascade serve --server triton``, where a raw PNG travels as a one-image
    JSON request."""
    js, png = {"Content-Type": "application/json"}, {"Content-Type": "image/png"}

    def raw(blob: bytes) -> tuple[bytes, dict[str, str]]:
        return (_images(blob, 1, v2), js) if v2 else (blob, png)

    huge = png_claiming(4096, 4096)
    return {
        "issue 29: 768 x 4096^2-pixel PNGs in 16.4 MB of JSON": (_images(huge, 768, v2), js),
        "256 x 4096^2-pixel PNGs in 5.5 MB (under the byte limit)": (_images(huge, 256, v2), js),
        "300 images in one request": (_images(good_png, 300, v2), js),
        "one raw PNG declaring 20000 x 20000": raw(png_claiming(20000, 20000)),
        "a truncated image": raw(good_png[: len(good_png) // 2]),
        "JSON nested 10,000 deep": (b"[" * 10_000 + b"]" * 10_000, js),
        "50 MB of non-UTF-8 bytes as JSON": (b"\xff" * (50 << 20), js),
        "malformed JSON": (b'{"images": ["abc"', js),
        "no Content-Type": (good_png, {}),
        "text/plain": (b"hello", {"Content-Type": "text/plain"}),
    }


def send(port: int, body: bytes, headers: dict[str, str], timeout: float = 30.0,
         path: str = "/invocations") -> tuple[int, float, str]:
    """(status, seconds, first 160 characters of the answer), timed from the first byte sent to the answer.

    Written on a raw socket: the body goes out in 64 KB pieces while the answer is watched for, so a
    server that refuses from the headers and closes (as it should for a 50 MB body) is seen to answer,
    not as a broken pipe. Status 0: no answer came."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}",
            "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        while sent < len(body):
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break  # the server answered before the body was all sent
            try:
                sent += sock.send(body[sent:sent + (64 << 10)])
            except OSError:
                break
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass
    seconds = time.perf_counter() - start
    status_line, _, rest = answer.partition(b"\r\n")
    parts = status_line.split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    text = rest.partition(b"\r\n\r\n")[2].decode(errors="replace")
    return status, seconds, text[:160]


def send_all(port: int, good_png: bytes, path: str = "/invocations") -> list[dict[str, object]]:
    rows = []
    for name, (body, headers) in abusive_requests(good_png, v2=path != "/invocations").items():
        status, seconds, text = send(port, body, headers, path=path)
        rows.append({"request": name, "bytes": len(body), "status": status, "seconds": round(seconds, 3),
                     "answer": text, "refused_4xx_under_1s": 400 <= status < 500 and seconds < 1.0})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000, help="port of a running `cascade serve` (default 8000)")
    args = p.parse_args(argv)
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)).save(out, "PNG")
    rows = send_all(args.port, out.getvalue())
    for row in rows:
        print(f"{row['status']:4d} {row['seconds']:7.3f} s  {row['request']}: {row['answer'][:90]}")
    return 0 if all(row["refused_4xx_under_1s"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
