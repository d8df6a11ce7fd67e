"""The one decoder of a prediction request's images, whichever door it came in by: the served model's
JSON (``image``/``images``, base64), a raw image body, and the registered pyfunc model's DataFrame rows
(``image`` base64 or ``pixels`` arrays). Every image is decoded by the code ``ingest`` uses
(:func:`pipeline.data.decode.decode_image_bytes`): any size, grey or colour, converted to the model's
channels and resized to its input. One set of limits bounds the work before any pixel is decoded: the
image data a request carries (:data:`MAX_REQUEST_BYTES`), the pixels its images declare in their headers
(:data:`MAX_REQUEST_PIXELS`), and each image's pixels (``max_pixels``). A refusal is a
:class:`RequestError` (HTTP 400, or 413 for a request over a limit) naming every bad image (up to
:data:`MAX_LISTED`, the rest counted). docs/DESIGN.md "Serving"."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.data.decode import DEFAULT_MAX_PIXELS, DataError, decode_image_bytes, image_header, resize_batch

# Image data one request may carry, all images together: base64 text, raw image bytes, or one byte per
# pixel value of a ``pixels`` array. It bounds the decoding work (the server's body limit defaults to it).
MAX_REQUEST_BYTES = 8 * 1024 * 1024
# Pixels one request may make the server decode, all images together (height x width, from each PNG/JPEG
# header before anything is decoded, and from each ``pixels`` array's size): a small PNG can declare
# 4096 x 4096, so the byte limit alone lets a request ask for billions of pixels.
MAX_REQUEST_PIXELS = 4 * 4096 * 4096
MAX_LISTED = 10  # bad images a refusal names one by one; the rest are counted
KINDS = ("base64", "bytes", "pixels", "refused")


class RequestError(ValueError):
    """A request refused, with the HTTP ``status`` to answer (4xx) and a message naming what is wrong."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Item:
    """One image of a request: ``name`` is how a refusal names it (``image 2``, ``row 3: image``),
    ``kind`` how ``value`` holds it: ``base64`` (PNG/JPEG as base64 text, or a ``data:`` URI),
    ``bytes`` (the file's bytes), ``pixels`` (uint8 values shaped (H, W) or (C, H, W)) or ``refused``
    (the caller found it bad already: ``value`` is the problem, listed with the others)."""

    name: str
    kind: str
    value: Any


def read_base64(value: Any, name: str) -> bytes:
    """base64 text (whitespace and a ``data:...;base64,`` prefix allowed) -> bytes; a RequestError."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", errors="replace")
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a base64 string, got {type(value).__name__}")
    if value.startswith("data:") and "," in value:
        value = value.split(",", 1)[1]
    try:
        data = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{name} is not valid base64") from None
    if not data:
        raise RequestError(f"{name} is empty")
    return data


def fit_pixels(image: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """uint8 (c, h, w) -> uint8 ``shape``: channels converted as a decoded file's are (RGB to grey by
    ITU-R 601 luma, Pillow's fixed-point rounding; grey repeated to RGB), then resized by ``resize_batch``."""
    c, h, w = shape
    if image.shape[0] != c and c == 1:  # exactly Pillow's convert("L"): a grey RGB image keeps its values
        r, g, b = (image[i].astype(np.int64) for i in range(3))
        image = ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)[None]
    elif image.shape[0] != c:
        image = np.repeat(image, c, axis=0)
    return np.ascontiguousarray(resize_batch(np.ascontiguousarray(image)[None], (h, w))[0])


def pixel_array(value: Any, name: str, max_pixels: int) -> np.ndarray:
    """A ``pixels`` value -> uint8 (C, H, W) as given (not yet fitted); a RequestError naming ``name``."""
    try:
        array = np.asarray(value)
    except ValueError:
        array = np.asarray([], dtype=object)  # ragged nested lists
    if array.dtype == object or array.dtype.kind not in "iu" or array.ndim not in (2, 3):
        raise RequestError(f"{name} must be integers shaped (H, W) or (C, H, W), got {array.dtype} {array.shape}")
    if array.ndim == 2:
        array = array[None]
    if array.shape[0] not in (1, 3) or min(array.shape[1:]) < 1:
        raise RequestError(f"{name} must be shaped (H, W) or (C, H, W) with C 1 or 3, got {array.shape}")
    height, width = array.shape[1:]
    if height * width > max_pixels:
        raise RequestError(f"{name} are too large: {height} x {width} = {height * width:,} pixels (height x "
                           f"width), over the limit of {max_pixels:,} pixels")
    low, high = array.min(), array.max()
    if low < 0 or high > 255:
        hint = " (send 16-bit images as PNG in the 'image' column)" if high <= 65535 and low >= 0 else ""
        raise RequestError(f"{name} must lie in 0..255, got {low}..{high}{hint}")
    return array.astype(np.uint8)


def data_bytes(value: Any) -> int:
    """Bytes of image data one value carries, nothing decoded: a text's or a blob's length, an array's
    number of values, or nested lists' values counted along their first elements."""
    if isinstance(value, str | bytes | bytearray):
        return len(value)
    if isinstance(value, np.ndarray):
        return int(value.size)
    size = 1
    while isinstance(value, list | tuple):
        size *= len(value)
        if not value:
            break
        value = value[0]
    return size


def declared_pixels(data: bytes) -> int:
    """Width x height an image's header declares, nothing decoded; 0 without a readable header (the
    decoder then names the problem)."""
    try:
        _, width, height = image_header(data)
    except ValueError:
        return 0
    return max(0, width) * max(0, height)


def check_request_bytes(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise RequestError(f"the request holds {size:,} bytes of image data, over the limit of {max_bytes:,} "
                           f"bytes: send fewer or smaller images per request", status=413)


def check_request_pixels(pixels: Sequence[int], max_pixels: int, max_request_pixels: int) -> None:
    """A RequestError (413) when the pixels a request's images declare add up to more than
    ``max_request_pixels``; an image over ``max_pixels`` counts at that limit (it is refused by name)."""
    declared = sum(min(p, max_pixels) for p in pixels)
    if declared > max_request_pixels:
        raise RequestError(f"the request's images declare {declared:,} pixels in all (height x width, from "
                           f"their headers), over the limit of {max_request_pixels:,} per request: send fewer "
                           f"or smaller images per request", status=413)


def refusal(errors: Sequence[str], total: int, unit: str) -> RequestError:
    """One RequestError listing the bad images' problems (the first :data:`MAX_LISTED`, the rest counted)."""
    listed = "; ".join(errors[:MAX_LISTED])
    if len(errors) > 1:
        listed = f"{len(errors)} of {total} {unit} are bad: {listed}"
    more = len(errors) - MAX_LISTED
    return RequestError(listed + (f"; and {more} more bad {unit}" if more > 0 else ""))


def _blob(item: Item, max_pixels: int) -> bytes | np.ndarray:
    """An item's image file bytes, or its pixel array (C, H, W) as given; a RequestError naming it."""
    if item.kind == "pixels":
        return pixel_array(item.value, item.name, max_pixels)
    if item.kind == "refused":
        raise RequestError(f"{item.name}: {item.value}")
    if item.kind not in KINDS:
        raise ValueError(f"an item's kind must be one of {KINDS}, got {item.kind!r}")
    data = bytes(item.value) if item.kind == "bytes" else read_base64(item.value, item.name)
    if not data:
        raise RequestError(f"{item.name} is empty")
    return data


def decode_items(items: Sequence[Item], shape: Sequence[int], *, max_pixels: int = DEFAULT_MAX_PIXELS,
                 max_bytes: int = MAX_REQUEST_BYTES, max_request_pixels: int = MAX_REQUEST_PIXELS,
                 unit: str = "images") -> np.ndarray:
    """A request's images -> uint8 (N, C, H, W) in the model's ``shape`` (C, H, W). Refused, before any
    pixel is decoded, when it holds none, more than ``max_bytes`` of image data or more than
    ``max_request_pixels`` pixels declared in all; then every bad image is named (``unit`` counts them)."""
    if not items:
        raise RequestError("the request holds no images: send at least one")
    if min(max_pixels, max_bytes, max_request_pixels) < 1:
        raise ValueError(f"the limits must be at least 1, got {max_pixels}, {max_bytes}, {max_request_pixels}")
    check_request_bytes(sum(data_bytes(item.value) for item in items if item.kind != "refused"), max_bytes)
    blobs: list[bytes | np.ndarray | None] = []
    errors: dict[int, str] = {}
    for i, item in enumerate(items):
        try:
            blobs.append(_blob(item, max_pixels))
        except RequestError as exc:
            errors[i] = str(exc)
            blobs.append(None)
    check_request_pixels([b.shape[1] * b.shape[2] if isinstance(b, np.ndarray) else declared_pixels(b or b"")
                          for b in blobs], max_pixels, max_request_pixels)
    c, h, w = (int(v) for v in shape)
    images = []
    for i, (item, blob) in enumerate(zip(items, blobs, strict=True)):
        if blob is None:
            continue
        try:
            images.append(fit_pixels(blob, (c, h, w)) if isinstance(blob, np.ndarray) else
                          decode_image_bytes(blob, c, (h, w), max_pixels=max_pixels, name=item.name))
        except (DataError, OSError) as exc:
            errors[i] = str(exc) if str(exc).startswith(item.name) else f"{item.name}: {exc}"
    if errors:
        raise refusal([errors[i] for i in sorted(errors)], len(items), unit)
    return np.stack(images)
