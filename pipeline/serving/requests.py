"""A prediction request's body -> uint8 images for the engine, or a refusal naming what is wrong.

Accepted, one request:

- ``image/png``, ``image/jpeg`` or ``application/octet-stream``: the bytes of one image file;
- ``application/json`` with ``{"image": "<base64 PNG/JPEG>"}`` or ``{"images": ["<base64>", ...]}``;
- ``application/json`` in MLflow's scoring form: ``{"dataframe_split": ...}`` or
  ``{"dataframe_records": ...}`` with an ``image`` (base64) or ``pixels`` (uint8 (H, W) / (C, H, W))
  column, decoded by :func:`pipeline.registry.payload.decode_payload` exactly as the registered pyfunc model does.

Every image is decoded by the code ``ingest`` uses (:func:`pipeline.data.sources.decode_image_bytes`):
any size, grey or colour, converted to the model's channels and resized to its input, so a client
never needs to know the model's input shape. An image is refused from its header before its pixels
are decoded when it declares more than ``max_pixels``, and a request when all its images together
declare more than ``max_request_pixels`` or it holds more than ``max_images`` images.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.data.request_images import Item, decode_items
from pipeline.serving.limits import (
    JSON_TYPE,
    BadRequest,
    ServeLimits,
    check_count,
    check_declared,
    check_text,
    declared_pixels,
    media_type,
)

RAW_KEY = "image"  # what the guard wraps a raw image body into: {"image": "<base64>"}
BUDGET_KEY = "budget"  # a request's cost ceiling: MACs per image, or an operating point's name
BUDGET_HEADER = "x-cascade-budget"  # the same as a header (the JSON field wins where both are given)
DEADLINE_KEY = "deadline_ms"  # a request's deadline: ms from its arrival to its answer (admission, 429)
DEADLINE_HEADER = "x-deadline-ms"  # the same as a header (the JSON field wins where both are given)
STAMP_KEY = "_cascade"  # what the guard adds to a request: {"arrived": monotonic seconds, "budget": header,
# "deadline_ms": the deadline the guard admitted it under, and where it decoded the images: "shape", "pixels"}
PIXELS_KEY = "pixels"  # in the stamp: the request's images decoded, uint8 (N, C, H, W) bytes in base64
SHAPE_KEY = "shape"  # in the stamp: (N, C, H, W) of those bytes
MAX_NAME = 64


def wrap_raw(body: bytes) -> bytes:
    """A raw image body as the JSON body the server's decoder reads (``{"image": base64}``)."""
    return b'{"image":"' + base64.b64encode(body) + b'"}'


def parse_json(body: bytes, limits: ServeLimits) -> Any:
    """JSON body -> object; a BadRequest for non-UTF-8, too deep or malformed JSON."""
    text = check_text(body, limits)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None


def _decode(items: list[Item], shape: Sequence[int], limits: ServeLimits) -> np.ndarray:
    return decode_items(items, shape, max_pixels=limits.max_pixels, max_bytes=limits.max_bytes,
                        max_request_pixels=limits.max_request_pixels)


def decode_images(items: Sequence[Any], shape: Sequence[int], limits: ServeLimits,
                  names: Sequence[str] | None = None) -> np.ndarray:
    """base64 PNG/JPEG strings -> uint8 (N, C, H, W), by the one request decoder
    (:func:`pipeline.data.request_images.decode_items`); a BadRequest naming every bad item."""
    if not items:
        raise BadRequest("the request holds no images: send at least one")
    check_count(len(items), limits)
    if names is None:
        names = [f"image {i}" for i in range(len(items))] if len(items) > 1 else ["image"]
    return _decode([Item(name, "base64", item) for name, item in zip(names, items, strict=True)], shape, limits)


def decode_raw(body: bytes, shape: Sequence[int], limits: ServeLimits) -> np.ndarray:
    """A raw image body -> uint8 (1, C, H, W), refused with the words :func:`decode_images` gives the same
    image sent as ``{"image": base64}``."""
    return _decode([Item("image", "bytes", body)], shape, limits)


def _prefix_pixels(item: Any) -> int:
    """Pixels a base64 image declares, from its first kilobyte only (0 when unreadable: the decoder
    names the problem later)."""
    if not isinstance(item, str):
        return 0
    head = item.split(",", 1)[1] if item.startswith("data:") and "," in item else item
    head = head[:1368]
    try:
        return declared_pixels(base64.b64decode(head[: len(head) // 4 * 4]))
    except (binascii.Error, ValueError):
        return 0


def precheck(payload: Any, limits: ServeLimits) -> None:
    """The request budgets of a parsed ``image``/``images`` payload (image count, pixels declared by the
    headers, read from each image's first kilobyte): what the guard refuses before the request is
    queued, so a hostile request costs the engine nothing."""
    if not isinstance(payload, dict) or not isinstance(payload.get("images"), list):
        return
    items = payload["images"]
    check_count(len(items), limits)
    check_declared([_prefix_pixels(item) for item in items], limits)


def _frame(payload: dict[str, Any]) -> Any:
    import pandas as pd

    if "dataframe_split" in payload:
        split = payload["dataframe_split"]
        if not isinstance(split, dict) or "data" not in split:
            raise BadRequest("dataframe_split must be an object with 'columns' and 'data'")
        return pd.DataFrame(split["data"], columns=split.get("columns"))
    records = payload["dataframe_records"]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise BadRequest("dataframe_records must be a list of objects")
    return pd.DataFrame.from_records(records)


def decode_payload(payload: Any, shape: Sequence[int], limits: ServeLimits) -> np.ndarray:
    """A parsed JSON request -> uint8 (N, C, H, W) in the model's shape, or a BadRequest."""
    if not isinstance(payload, dict):
        raise BadRequest(f"the JSON body must be an object, got {type(payload).__name__}")
    if RAW_KEY in payload:
        return decode_images([payload[RAW_KEY]], shape, limits)
    if "images" in payload:
        if not isinstance(payload["images"], list):
            raise BadRequest("'images' must be a list of base64 PNG/JPEG strings")
        return decode_images(payload["images"], shape, limits)
    if "dataframe_split" in payload or "dataframe_records" in payload:
        from pipeline.registry.payload import decode_payload as decode_frame

        try:
            frame = _frame(payload)
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"the dataframe cannot be read: {exc}") from None
        check_count(len(frame), limits)
        return decode_frame(frame, shape, max_pixels=limits.max_pixels, max_bytes=limits.max_bytes,
                            max_request_pixels=limits.max_request_pixels)
    keys = ", ".join(sorted(map(str, payload))[:5]) or "none"
    raise BadRequest(f"the JSON body needs 'image', 'images', 'dataframe_split' or 'dataframe_records'; "
                     f"got keys {keys}")


def decode_body(body: bytes, content_type: str | None, shape: Sequence[int], limits: ServeLimits
                ) -> np.ndarray:
    """A whole request body and its Content-Type -> uint8 (N, C, H, W) (what the server does in two
    steps: the guard wraps a raw image, the worker decodes the JSON)."""
    if len(body) > limits.max_bytes:
        raise BadRequest(f"the request body has {len(body):,} bytes, over the limit of {limits.max_bytes:,}",
                         status=413)
    if media_type(content_type) == JSON_TYPE:
        return decode_payload(parse_json(body, limits), shape, limits)
    if not body:
        raise BadRequest("the request body is empty")
    return _decode([Item("the image", "bytes", body)], shape, limits)


def parse_budget(value: Any) -> str | float | None:
    """A request's budget: None (none asked), a ceiling in MACs per image (a number > 0, or a string that
    reads as one) or an operating point's name; a BadRequest naming what is wrong with it."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            if not text or len(text) > MAX_NAME or not text.isprintable():
                raise BadRequest(f"budget {value[:MAX_NAME]!r}: give MACs per image (a number) or an operating "
                                 f"point's name") from None
            return text
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise BadRequest(f"budget {value!r}: MACs per image must be a finite number > 0")
    return float(value)


def request_budget(payload: Any) -> str | float | None:
    """The budget a parsed request asks for: its JSON field, else the header the guard stamped into it."""
    if not isinstance(payload, dict):
        return None
    stamp = payload.get(STAMP_KEY) if isinstance(payload.get(STAMP_KEY), dict) else {}
    return parse_budget(payload[BUDGET_KEY] if BUDGET_KEY in payload else stamp.get("budget"))


def parse_deadline(value: Any) -> float | None:
    """A request's deadline in ms: None (none asked) or a finite number > 0 (a string that reads as one);
    a BadRequest naming what is wrong with it."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise BadRequest(f"deadline {value[:MAX_NAME]!r}: give milliseconds, a number > 0") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise BadRequest(f"deadline {value!r}: milliseconds must be a finite number > 0")
    return float(value)


def request_deadline(payload: Any, header: str | None = None) -> float | None:
    """The deadline (ms) a request asks for: its JSON field, else ``header`` (``X-Deadline-Ms``), else the
    one the guard stamped into it."""
    if isinstance(payload, dict) and DEADLINE_KEY in payload:
        return parse_deadline(payload[DEADLINE_KEY])
    if header is not None:
        return parse_deadline(header)
    stamp = payload.get(STAMP_KEY) if isinstance(payload, dict) else None
    return parse_deadline(stamp.get(DEADLINE_KEY)) if isinstance(stamp, dict) else None


def image_count(payload: Any) -> int:
    """How many images a parsed request holds, as far as its shape says before decoding (1 when unsure:
    the decoder names what is wrong)."""
    if not isinstance(payload, dict):
        return 1
    if isinstance(payload.get("images"), list):
        return max(1, len(payload["images"]))
    split = payload.get("dataframe_split")
    if isinstance(split, dict) and isinstance(split.get("data"), list):
        return max(1, len(split["data"]))
    if isinstance(payload.get("dataframe_records"), list):
        return max(1, len(payload["dataframe_records"]))
    return 1


def arrival(payload: Any) -> float | None:
    """When the guard received the request (``time.monotonic()``, one clock for every process), or None."""
    stamp = payload.get(STAMP_KEY) if isinstance(payload, dict) else None
    value = stamp.get("arrived") if isinstance(stamp, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def stamped(body: bytes, arrived: float, budget: str | None, deadline_ms: float | None = None) -> bytes:
    """A JSON object body with the guard's stamp added as its last key (so it wins over a client's key of
    the same name); any other body unchanged. The body was parsed already: no second parse here."""
    text = body.rstrip()
    if not text.endswith(b"}"):
        return body
    inner = text[:-1].rstrip()
    stamp = json.dumps({"arrived": arrived, **({"budget": budget} if budget is not None else {}),
                        **({DEADLINE_KEY: deadline_ms} if deadline_ms is not None else {})})
    sep = b"" if inner.lstrip().endswith(b"{") else b","
    return inner + sep + f'"{STAMP_KEY}":{stamp}}}'.encode()


def decoded_body(images: np.ndarray, payload: Any, arrived: float, budget: str | None,
                 deadline_ms: float | None) -> bytes:
    """The body the guard hands the worker for a request whose images it decoded: the client's ``budget``
    and ``deadline_ms`` fields (read by the worker as before) and the guard's stamp, which carries the
    images as raw uint8 bytes (base64) and their shape. Nothing else of the client's body is kept, so a
    client's own stamp never reaches the worker."""
    kept = {k: payload[k] for k in (BUDGET_KEY, DEADLINE_KEY) if k in payload} if isinstance(payload, dict) else {}
    images = np.ascontiguousarray(images, dtype=np.uint8)
    stamp = {"arrived": arrived, **({"budget": budget} if budget is not None else {}),
             **({DEADLINE_KEY: deadline_ms} if deadline_ms is not None else {}),
             SHAPE_KEY: list(images.shape), PIXELS_KEY: base64.b64encode(images.tobytes()).decode("ascii")}
    return json.dumps({**kept, STAMP_KEY: stamp}).encode()


def decoded_images(payload: Any, shape: Sequence[int], limits: ServeLimits) -> np.ndarray | None:
    """The images the guard decoded into a request's stamp (None where it holds none: the worker decodes
    the request itself), checked again against the model's input: uint8 (N, C, H, W) in ``shape``, 1 to
    ``max_images`` of them, exactly that many bytes. Whoever wrote the stamp, it cannot hand the engine more
    or other than a request within the limits would; a BadRequest where it is malformed."""
    stamp = payload.get(STAMP_KEY) if isinstance(payload, dict) else None
    if not isinstance(stamp, dict) or PIXELS_KEY not in stamp:
        return None
    dims, data = stamp.get(SHAPE_KEY), stamp[PIXELS_KEY]
    want = tuple(int(v) for v in shape)
    if (not isinstance(dims, list) or len(dims) != 4 or not all(type(v) is int for v in dims)
            or tuple(dims[1:]) != want or not 1 <= dims[0] <= limits.max_images or not isinstance(data, str)
            or len(data) != 4 * math.ceil(dims[0] * math.prod(want) / 3)):
        raise BadRequest(f"the decoded images must be uint8 (N, {', '.join(map(str, want))}) with N from 1 to "
                         f"{limits.max_images}")
    try:
        pixels = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("the decoded images are not valid base64") from None
    if len(pixels) != dims[0] * math.prod(want):
        raise BadRequest("the decoded images do not hold as many bytes as their shape says")
    return np.frombuffer(pixels, dtype=np.uint8).reshape(dims)
