"""The one request checker of every served path: one typed set of limits (:class:`ServeLimits`) and
the checks against them, used by LitServe's guard (:mod:`pipeline.serving.guard`) and decoder
(:mod:`pipeline.serving.requests`), Triton's Python backend (:mod:`pipeline.serving.triton_backend`:
image count and pixels; Triton itself bounds bodies and queues) and the proxy in front of
``mlflow models serve`` (:mod:`pipeline.serving.mlflow_guard`). A check that fails raises or returns
the HTTP status and a message naming what is wrong; the header checks need only the request line and
headers, so a refused body is never read. docs/DESIGN.md "Serving"."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from pipeline.data.decode import DEFAULT_MAX_PIXELS
from pipeline.data.request_images import (  # noqa: F401 (declared_pixels re-exported for the decoders)
    MAX_REQUEST_BYTES,
    MAX_REQUEST_PIXELS,
    RequestError,
    check_request_pixels,
    declared_pixels,
)

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

    max_bytes: int = MAX_REQUEST_BYTES
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


BadRequest = RequestError  # a request the server answers with ``status`` (4xx) and this message: the one
# refusal every served path and the request decoder (pipeline.data.request_images) raise


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def check_headers(method: str, path: str, content_length: str | None, content_type: str | None,
                  limits: ServeLimits, accepted: tuple[str, ...] = CONTENT_TYPES) -> tuple[int, str] | None:
    """(status, message) refusing a prediction request from its line and headers alone, or None:
    no length 411, over ``max_bytes`` 413, empty 400, a Content-Type not in ``accepted`` 415."""
    if method != "POST" or path != PREDICT_PATH:
        return None  # not a prediction: the server's own routes answer (or 404/405)
    if content_length is None or not content_length.strip().isdigit():
        return 411, "a Content-Length header is required"
    size = int(content_length)
    if size > limits.max_bytes:
        return 413, f"the request body has {size:,} bytes, over the limit of {limits.max_bytes:,}"
    if size == 0:
        return 400, f"the request body is empty (send one of: {', '.join(accepted)})"
    kind = media_type(content_type)
    if kind not in accepted:
        return 415, f"Content-Type must be one of {', '.join(accepted)}, got {kind or 'none'!r}"
    return None


# a JSON string (skipped whole: brackets inside one do not nest) or one bracket, found by the regex engine
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')


def json_depth_exceeds(text: bytes | str, limit: int) -> bool:
    """Whether JSON ``text`` nests arrays/objects more than ``limit`` deep (brackets inside strings do
    not count); no parsing, so a hostile depth costs nothing. A body with too few brackets to nest that
    deep (an ``images`` list of base64 strings has two) is not scanned at all, and the scan steps over each
    string in one regex match: a character-by-character scan in Python cost 2 ms for 16 colour 48 px
    images, most of the front's time to refuse a request (docs/RESULTS.md 'Under a load step')."""
    opening = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    if text.count(opening[0]) + text.count(opening[1]) <= limit:
        return False
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return True
        elif token in "]}":
            depth -= 1
    return False


def check_text(body: bytes, limits: ServeLimits, *, is_json: bool = True) -> str:
    """A body as text: a BadRequest (400) when it is not UTF-8 or, for JSON, nests deeper than
    ``max_depth`` (a framework's parser would answer 500 or recurse)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the request body is not UTF-8 (byte {exc.start})") from None
    if is_json and json_depth_exceeds(text, limits.max_depth):
        raise BadRequest(f"the JSON body nests deeper than {limits.max_depth} levels")
    return text


def check_count(count: int, limits: ServeLimits) -> None:
    """A BadRequest (413) for a request of more than ``max_images`` images."""
    if count > limits.max_images:
        raise BadRequest(f"the request holds {count} images, over the limit of {limits.max_images} per request",
                         status=413)


def check_declared(pixels: list[int], limits: ServeLimits) -> None:
    """A BadRequest (413) when the pixels the images of a request declare (from their headers, before
    any decoding; an image over ``max_pixels`` counts at that limit: it is refused by name when
    decoded) add up to more than ``max_request_pixels``."""
    check_request_pixels(pixels, limits.max_pixels, limits.max_request_pixels)
