"""Request payloads of the registered cascade: decoding a request DataFrame into model input, the
pyfunc model's answer, and the helpers clients use to build requests. It imports neither
:mod:`pipeline.registry.register` nor :mod:`pipeline.registry.mlflow_models`: both use it (the registry to register the
model's signature and examples, the pyfunc model class to answer requests).

A request is a DataFrame with one image per row, in one of two documented forms:

- ``image``: base64-encoded PNG/JPEG bytes (any size; grey or colour), decoded, converted to the
  model's channels and resized to its input exactly as ``cascade recognize`` reads files;
- ``pixels``: a uint8 array (or nested lists) shaped (H, W) or (C, H, W) with C in {1, 3}, converted
  and resized the same way when its shape differs from the model's.

Rows are decoded by the one request decoder every served path uses
(:mod:`pipeline.data.request_images`), with its limits and its words. A request is refused (a ValueError,
which the pyfunc model answers with HTTP 400) when it holds no rows, when it carries more than
:data:`MAX_REQUEST_BYTES` of image data or declares more than :data:`MAX_REQUEST_PIXELS` pixels in all
(read from the headers before decoding), or when any row is bad: the message names every bad row (up to
ten) by index, with its problem. Each image may have at most ``max_pixels`` pixels (height x width;
default :data:`pipeline.data.decode.DEFAULT_MAX_PIXELS`), in either form; an ``image`` row over it is
refused from its PNG/JPEG header before its pixels are decoded.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.data.decode import DEFAULT_MAX_PIXELS
from pipeline.data.request_images import (  # noqa: F401 (the limits re-exported: clients read them here)
    MAX_REQUEST_BYTES,
    MAX_REQUEST_PIXELS,
    Item,
    RequestError,
    decode_items,
)

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.routing.package import LoadedCascade

# Column name -> logical type; tracking turns these into the MLflow signature. A row fills one input.
INPUT_COLUMNS = (("image", "string"), ("pixels", "any"))
OUTPUT_COLUMNS = (("class_index", "long"), ("class_name", "string"), ("confidence", "double"),
                  ("exit", "long"), ("subnets", "list[string]"), ("macs", "long"))


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


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def decode_payload(frame: pd.DataFrame, image_shape: Sequence[int], *, max_pixels: int | None = None,
                   max_bytes: int = MAX_REQUEST_BYTES, max_request_pixels: int = MAX_REQUEST_PIXELS
                   ) -> np.ndarray:
    """A request DataFrame -> uint8 (N, C, H, W) for the model, by the one request decoder
    (:func:`pipeline.data.request_images.decode_items`: its limits, its words). A ValueError (the server's
    HTTP 400) for a request with no rows, one over ``max_bytes`` of image data or ``max_request_pixels``
    pixels declared in all (read from the headers, before any decoding), or bad rows, each named by its
    index with its problem. Each image may have at most ``max_pixels`` pixels (height x width, both forms;
    default :data:`pipeline.data.decode.DEFAULT_MAX_PIXELS`)."""
    if len(frame) == 0:
        raise RequestError("the request holds no rows: send at least one image (one row per image)")
    columns = [name for name, _ in INPUT_COLUMNS if name in frame.columns]
    if not columns:
        raise RequestError(f"the payload needs a column 'image' (base64 PNG/JPEG) or 'pixels' (uint8 arrays); "
                           f"got columns {list(map(str, frame.columns))}")
    items = []
    for row in range(len(frame)):
        given = [(col, frame[col].iloc[row]) for col in columns if not _missing(frame[col].iloc[row])]
        if len(given) != 1:
            items.append(Item(f"row {row}", "refused", f"give exactly one of {' or '.join(columns)}, got {len(given)}"))
            continue
        col, value = given[0]
        items.append(Item(f"row {row}: {col}", "base64" if col == "image" else "pixels", value))
    return decode_items(items, image_shape, max_pixels=DEFAULT_MAX_PIXELS if max_pixels is None else int(max_pixels),
                        max_bytes=max_bytes, max_request_pixels=max_request_pixels, unit="rows")


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
