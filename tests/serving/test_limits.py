"""The one request checker (``pipeline.serving.limits``): each check on its own, and the same request
refused with the same status and words by LitServe's decoder, Triton's backend and the MLflow guard."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from pipeline.serving.limits import (
    BadRequest,
    ServeLimits,
    check_count,
    check_declared,
    check_headers,
    check_text,
    declared_pixels,
)
from pipeline.serving.mlflow_guard import check_body, check_request
from pipeline.serving.requests import decode_body
from pipeline.serving.triton_backend import decode_request
from tests.serving.test_requests import png, png_claiming

SHAPE = (1, 4, 4)


def test_headers_are_checked_against_the_types_a_path_accepts() -> None:
    limits = ServeLimits(max_bytes=100)
    assert check_headers("POST", "/invocations", "10", "text/csv", limits, accepted=("text/csv",)) is None
    assert check_headers("POST", "/invocations", "10", "image/png", limits, accepted=("text/csv",))[0] == 415
    assert check_headers("POST", "/invocations", "0", "text/csv", limits, accepted=("text/csv",)) == (
        400, "the request body is empty (send one of: text/csv)")


def test_text_is_utf8_and_json_no_deeper_than_the_limit() -> None:
    limits = ServeLimits(max_depth=2)
    assert check_text(b'{"a": [1]}', limits) == '{"a": [1]}'
    with pytest.raises(BadRequest, match="nests deeper than 2"):
        check_text(b'{"a": [[1]]}', limits)
    assert check_text(b"[[[[", limits, is_json=False) == "[[[["  # CSV: no depth
    with pytest.raises(BadRequest, match="not UTF-8 \\(byte 1\\)"):
        check_text(b"a\xff", limits)


def test_request_budgets_count_each_image_at_most_at_its_own_limit() -> None:
    limits = ServeLimits(max_images=2, max_pixels=100, max_request_pixels=150)
    check_count(2, limits)
    with pytest.raises(BadRequest) as caught:
        check_count(3, limits)
    assert caught.value.status == 413 and "3 images, over the limit of 2 per request" in str(caught.value)
    check_declared([10_000, 50], limits)  # the huge one counts as 100: it is refused by name when decoded
    with pytest.raises(BadRequest, match="declare 200 pixels in all"):
        check_declared([10_000, 10_000], limits)
    assert declared_pixels(png_claiming(30, 20)) == 600 and declared_pixels(b"not an image") == 0


def test_every_served_path_refuses_alike() -> None:
    """LitServe's decoder and Triton's backend give one answer for one over-budget request."""
    good = png(np.full((8, 8), 90, dtype=np.uint8))
    limits = ServeLimits(max_images=2)
    body = json.dumps({"images": [base64.b64encode(good).decode()] * 3}).encode()
    with pytest.raises(BadRequest) as litserve:
        decode_body(body, "application/json", SHAPE, limits)
    with pytest.raises(BadRequest) as triton:
        decode_request([good] * 3, SHAPE, limits)
    assert (litserve.value.status, str(litserve.value)) == (triton.value.status, str(triton.value))
    deep = b"[" * 40 + b"]" * 40
    with pytest.raises(BadRequest) as parsed:
        decode_body(deep, "application/json", SHAPE, ServeLimits())
    assert check_body(deep, "application/json", ServeLimits()) == (parsed.value.status, str(parsed.value))
    headers = {"Content-Length": str(10**9), "Content-Type": "application/json"}
    assert check_request("POST", "/invocations", headers, ServeLimits()) == check_headers(
        "POST", "/invocations", str(10**9), "application/json", ServeLimits())
