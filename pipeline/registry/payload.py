"""Request payloads of the registered cascade: decoding a request DataFrame into model input, the
pyfunc model's answer, and the helpers clients use to build requests. It imports neither
:mod:`pipeline.registry.register` nor :mod:`pipeline.registry.mlflow_models`: both use it (the registry to register the
model's signature and examples, the pyfunc model class to answer requests).

A request is a DataFrame with one image per row, in one of two documented forms:

- ``image``: base64-encoded PNG/JPEG bytes (any size; grey or colour), decoded, converted to the
  model's channels and resized to its input exactly as ``cascade recognize`` reads files;
- ``pixels``: a uint8 array (or nested lists) shaped (H, W) or (C, H, W) with C in {1, 3}, converted
  and resized the same way when its shape differs from the model's.

A request is refused (a ValueError, which the pyfunc model answers with HTTP 400) when it holds no
rows, when it carries more than :data:`MAX_REQUEST_BYTES` of image data or declares more than
:data:`MAX_REQUEST_PIXELS` pixels in all (read from the headers before decoding), or when any row is bad: the
message names every bad row (up to :data:`MAX_ROW_ERRORS`) by index, with its problem. Each image
may have at most ``max_pixels`` pixels (height x width; default
:data:`pipeline.data.sources.DEFAULT_MAX_PIXELS`), in either form; an ``image`` row over it is
refused from its PNG/JPEG header before its pixels are decoded.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.routing.package import LoadedCascade

# Column name -> logical type; tracking turns these into the MLflow signature. A row fills one input.
INPUT_COLUMNS = (("image", "string"), ("pixels", "any"))
OUTPUT_COLUMNS = (("class_index", "long"), ("class_name", "string"), ("confidence", "double"),
                  ("exit", "long"), ("subnets", "list[string]"), ("macs", "long"))
# Image data one request may carry, all rows together: base64 text of the ``image`` rows plus one byte per
# pixel value of the ``pixels`` rows. MLflow's server reads and parses the whole body before the model
# sees it, so this bounds the decoding work, not the body: bound the raw body in a proxy in front.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# Pixels one request may make the server decode, all rows together (height x width, from each PNG/JPEG
# header before anything is decoded, and from each ``pixels`` array's size): a small PNG can declare
# 4096 x 4096, so the byte limit alone lets a request under 16 MiB ask for billions of pixels.
MAX_REQUEST_PIXELS = 4 * 4096 * 4096
MAX_ROW_ERRORS = 10  # bad rows a refusal lists one by one; the rest are counted


def encode_png(image: np.ndarray) -> bytes:
    """uint8 (C, H, W) with C in {1, 3} -> PNG bytes (for input examples and clients). Pillow, not
    torchvision: importing torchvision pulls in ``torch._dynamo``, 1.5 s of the register stage's
    process for its one input example (docs/RESULTS.md "Where the quick command's time goes")."""
    import io

    from PIL import Image

    pixels = np.ascontiguousarray(image, dtype=np.uint8)
    picture = Image.fromarray(pixels[0] if pixels.shape[0] == 1 else pixels.transpose(1, 2, 0))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def _fit(image: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """uint8 array (c, h, w) -> uint8 array of ``shape``: channels converted as a decoded file's are
    (RGB to grey by ITU-R 601 luma, Pillow's fixed-point rounding; grey repeated to RGB), then resized
    by :func:`pipeline.data.sources.resize_batch`."""
    from pipeline.data.sources import resize_batch

    c, h, w = shape
    if image.shape[0] != c and c == 1:  # exactly Pillow's convert("L"): a grey RGB image keeps its values
        r, g, b = (image[i].astype(np.int64) for i in range(3))
        image = ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)[None]
    elif image.shape[0] != c:
        image = np.repeat(image, c, axis=0)
    return np.ascontiguousarray(resize_batch(np.ascontiguousarray(image)[None], (h, w))[0])


def _b64_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", errors="replace")
    if not isinstance(value, str):
        raise ValueError(f"image must be a base64 string, got {type(value).__name__}")
    if value.startswith("data:") and "," in value:
        value = value.split(",", 1)[1]  # a data URI: data:image/png;base64,....
    try:
        data = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("image is not valid base64") from None
    if not data:
        raise ValueError("image is empty")
    return data


def _decode_image(value: Any, shape: Sequence[int], max_pixels: int) -> np.ndarray:
    """base64 PNG/JPEG -> uint8 ``shape``, by the decoder ingest and ``cascade recognize`` use (any bit
    depth or mode; an image over ``max_pixels`` is refused from its header before decoding)."""
    from pipeline.data.sources import decode_image_bytes

    c, h, w = shape
    return decode_image_bytes(_b64_bytes(value), c, (h, w), max_pixels=max_pixels,
                              name="image")  # a DataError is a ValueError


def _decode_pixels(value: Any, shape: Sequence[int], max_pixels: int) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError:
        array = np.asarray([], dtype=object)  # ragged nested lists
    if array.dtype == object or array.dtype.kind not in "iu" or array.ndim not in (2, 3):
        raise ValueError(f"pixels must be integers shaped (H, W) or (C, H, W), got "
                         f"{array.dtype} {array.shape}")
    if array.ndim == 2:
        array = array[None]
    if array.shape[0] not in (1, 3) or min(array.shape[1:]) < 1:
        raise ValueError(f"pixels must be shaped (H, W) or (C, H, W) with C 1 or 3, got {array.shape}")
    height, width = array.shape[1:]
    if height * width > max_pixels:
        raise ValueError(f"pixels are too large: {height} x {width} = {height * width:,} pixels (height x "
                         f"width), over the limit of {max_pixels:,} pixels")
    low, high = array.min(), array.max()
    if low < 0 or high > 255:
        hint = " (send 16-bit images as PNG in the 'image' column)" if high <= 65535 and low >= 0 else ""
        raise ValueError(f"pixels must lie in 0..255, got {low}..{high}{hint}")
    return _fit(array.astype(np.uint8), shape)


def _data_bytes(value: Any) -> int:
    """Bytes of image data in one cell, without decoding it: a base64 text's length, an array's number
    of values, or nested lists' values counted along their first elements (a ragged one is refused
    when its row is decoded)."""
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


def _declared_pixels(col: str, value: Any) -> int:
    """Pixels a cell will decode to, without decoding it: an image's header (0 when it has none: the
    row is refused when decoded), a ``pixels`` array's number of values."""
    if col != "image":
        return _data_bytes(value)
    from pipeline.data.sources import image_header

    try:
        _, width, height = image_header(_b64_bytes(value))
    except ValueError:
        return 0
    return max(0, width) * max(0, height)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def decode_payload(frame: pd.DataFrame, image_shape: Sequence[int], *, max_pixels: int | None = None,
                   max_bytes: int = MAX_REQUEST_BYTES, max_request_pixels: int = MAX_REQUEST_PIXELS
                   ) -> np.ndarray:
    """A request DataFrame -> uint8 (N, C, H, W) for the model. A ValueError (the server's HTTP 400) for
    a request with no rows, one with more than ``max_bytes`` of image data or more than
    ``max_request_pixels`` pixels declared in all (read from the headers, before any decoding), or bad
    rows, each named by its index with its problem. Each image may have at most ``max_pixels`` pixels
    (height x width, both forms; default :data:`pipeline.data.sources.DEFAULT_MAX_PIXELS`)."""
    from pipeline.data.sources import DEFAULT_MAX_PIXELS

    max_pixels = DEFAULT_MAX_PIXELS if max_pixels is None else int(max_pixels)
    if max_pixels < 1 or max_bytes < 1:
        raise ValueError(f"max_pixels and max_bytes must be at least 1, got {max_pixels} and {max_bytes}")
    c, h, w = (int(v) for v in image_shape)
    if len(frame) == 0:
        raise ValueError("the request holds no rows: send at least one image (one row per image)")
    columns = [name for name, _ in INPUT_COLUMNS if name in frame.columns]
    if not columns:
        raise ValueError(f"the payload needs a column 'image' (base64 PNG/JPEG) or 'pixels' (uint8 arrays); "
                         f"got columns {list(map(str, frame.columns))}")
    cells = [[(col, frame[col].iloc[row]) for col in columns if not _missing(frame[col].iloc[row])]
             for row in range(len(frame))]
    size = sum(_data_bytes(value) for given in cells for _, value in given)
    if size > max_bytes:
        raise ValueError(f"the request holds {size:,} bytes of image data, over the limit of {max_bytes:,} "
                         f"bytes: send fewer or smaller images per request")
    # a row over the per-image limit is refused by row below; here it counts at that limit
    pixels = sum(min(_declared_pixels(col, value), max_pixels) for given in cells for col, value in given)
    if pixels > max_request_pixels:
        raise ValueError(f"the request's images declare {pixels:,} pixels in all (height x width, from their "
                         f"headers), over the limit of {max_request_pixels:,} per request: send fewer or "
                         f"smaller images per request")
    images, errors = [], []
    for row, given in enumerate(cells):
        if len(given) != 1:
            errors.append(f"row {row}: give exactly one of {' or '.join(columns)}, got {len(given)}")
            continue
        col, value = given[0]
        try:
            decode = _decode_image if col == "image" else _decode_pixels
            images.append(decode(value, (c, h, w), max_pixels))
        except ValueError as exc:
            errors.append(f"row {row}: {exc}")
    if errors:
        listed = "; ".join(errors[:MAX_ROW_ERRORS])
        more = len(errors) - MAX_ROW_ERRORS
        if len(errors) > 1:
            listed = f"{len(errors)} of {len(frame)} rows are bad: {listed}"
        raise ValueError(listed + (f"; and {more} more bad rows" if more > 0 else ""))
    return np.stack(images)  # (N, C, H, W)


def image_frame(images: np.ndarray) -> pd.DataFrame:
    """uint8 (N, C, H, W) images -> a request DataFrame of base64 PNGs (the ``image`` form)."""
    import pandas as pd

    return pd.DataFrame({"image": [base64.b64encode(encode_png(im)).decode("ascii") for im in images]})


def predict_frame(loaded: LoadedCascade, frame: pd.DataFrame, batch_size: int = 256) -> pd.DataFrame:
    """The pyfunc model's answer: one row per request row, the same as :func:`recognize_arrays`; a
    ValueError for a refused request (see :func:`decode_payload`)."""
    import pandas as pd

    from pipeline.routing.recognize import recognize_arrays

    images = decode_payload(frame, loaded.meta.image_shape)  # (N, C, H, W), N >= 1
    rows = recognize_arrays(loaded, images, batch_size)
    return pd.DataFrame(rows, columns=[name for name, _ in OUTPUT_COLUMNS])


def png_b64(path: str | os.PathLike[str]) -> str:
    """A file's bytes as base64 text: what a client puts in the ``image`` column."""
    return base64.b64encode(Path(path).read_bytes()).decode("ascii")
