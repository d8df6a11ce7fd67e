"""What a served cascade accepts: one typed set of limits, checked in one place, and the request
checks that need only the request line and headers (so a refused body is never read)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from pipeline.data.sources import DEFAULT_MAX_PIXELS
from pipeline.registry.payload import MAX_REQUEST_PIXELS
from pipeline.serving.mlflow_guard import json_depth_exceeds as _scan_depth

RAW_TYPES = ("image/png", "image/jpeg", "application/octet-stream")  # one image per request, its bytes
JSON_TYPE = "application/json"
CONTENT_TYPES = (JSON_TYPE, *RAW_TYPES)
PREDICT_PATH = "/invocations"


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on what one request may make the server do, and on how much work may wait.

    ``max_bytes``: request body; ``max_images``: images per request; ``max_pixels``: per image
    (height x width, read from a PNG/JPEG header before decoding); ``max_request_pixels``: all images
    of a request together; ``max_depth``: JSON nesting; ``max_queue``: requests in the server at once
    (more get 503 at once, never a growing queue); ``read_timeout``: seconds to receive a body;
    ``timeout``: seconds a request may wait for its answer (then 504).
    """

    max_bytes: int = 8 * 1024 * 1024
    max_images: int = 256
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_request_pixels: int = MAX_REQUEST_PIXELS
    max_depth: int = 32
    max_queue: int = 1024
    read_timeout: float = 10.0
    timeout: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"ServeLimits.{f.name} must be a number > 0, got {value!r}")


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def check_headers(method: str, path: str, content_length: str | None, content_type: str | None,
                  limits: ServeLimits) -> tuple[int, str] | None:
    """(status, message) refusing a prediction request from its line and headers alone, or None."""
    if method != "POST" or path != PREDICT_PATH:
        return None  # not a prediction: the server's own routes answer (or 404/405)
    if content_length is None or not content_length.strip().isdigit():
        return 411, "a Content-Length header is required"
    size = int(content_length)
    if size > limits.max_bytes:
        return 413, f"the request body has {size:,} bytes, over the limit of {limits.max_bytes:,}"
    if size == 0:
        return 400, "the request body is empty: send a PNG/JPEG image or a JSON payload"
    kind = media_type(content_type)
    if kind not in CONTENT_TYPES:
        return 415, f"Content-Type must be one of {', '.join(CONTENT_TYPES)}, got {kind or 'none'!r}"
    return None


def json_depth_exceeds(text: bytes | str, limit: int) -> bool:
    """Whether JSON ``text`` nests deeper than ``limit`` (:func:`pipeline.serving.mlflow_guard.json_depth_exceeds`'s
    linear scan; a body with too few brackets to nest that deep is not scanned at all)."""
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= limit:
            return False
        text = text.decode("utf-8", errors="replace")
    return _scan_depth(text, limit)
