"""Request bodies -> model input, and every refusal names what is wrong (pipeline.serving.requests,
pipeline.serving.limits)."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from pipeline.serving.limits import ServeLimits, check_headers, json_depth_exceeds
from pipeline.serving.requests import BadRequest, decode_body, wrap_raw

SHAPE = (1, 16, 16)
LIMITS = ServeLimits()


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def jpeg(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG")
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"\0" * 64) + chunk(b"IEND", b"")


RGB = np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8)
GREY = np.random.default_rng(1).integers(0, 256, (16, 16), dtype=np.uint8)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_raw_png_and_jpeg_of_any_size_and_mode_become_the_model_shape() -> None:
    cases = ((png(RGB), "image/png"), (jpeg(RGB), "image/jpeg"), (png(GREY), "application/octet-stream"))
    for body, kind in cases:
        x = decode_body(body, kind, SHAPE, LIMITS)
        assert x.shape == (1, *SHAPE) and x.dtype == np.uint8
    same_size = decode_body(png(GREY), "image/png", SHAPE, LIMITS)[0, 0]
    assert np.array_equal(same_size, GREY)  # already the model's size: untouched


def test_the_json_forms_agree_with_the_raw_form() -> None:
    raw = decode_body(png(RGB), "image/png", SHAPE, LIMITS)
    wrapped = decode_body(wrap_raw(png(RGB)), "application/json", SHAPE, LIMITS)
    many = decode_body(json.dumps({"images": [b64(png(RGB)), b64(png(GREY))]}).encode(), "application/json",
                       SHAPE, LIMITS)
    split = {"dataframe_split": {"columns": ["image"], "data": [[b64(png(RGB))]]}}
    frame = decode_body(json.dumps(split).encode(), "application/json; charset=utf-8", SHAPE, LIMITS)
    pixels = {"dataframe_records": [{"pixels": GREY.tolist()}]}
    numeric = decode_body(json.dumps(pixels).encode(), "application/json", SHAPE, LIMITS)
    assert np.array_equal(raw, wrapped) and np.array_equal(raw[0], many[0]) and np.array_equal(raw, frame)
    assert np.array_equal(numeric[0, 0], GREY) and many.shape == (2, *SHAPE)


@pytest.mark.parametrize(("body", "kind", "status", "message"), [
    (b"garbage", "image/png", 400, "not a PNG or JPEG"),
    (png_claiming(20000, 20000), "image/png", 400, "too large"),
    (b'{"images": ["%%%", 3]}', "application/json", 400,
     "2 of 2 images are bad: image 0 is not valid base64; image 1 must be a base64"),
    (b'{"image": "abc', "application/json", 400, "not valid JSON"),
    (b"\xff\xfe{}", "application/json", 400, "not UTF-8"),
    (b"[" * 40 + b"]" * 40, "application/json", 400, "nests deeper than 32"),
    (b'{"photo": "x"}', "application/json", 400, "needs 'image', 'images'"),
    (b'{"images": []}', "application/json", 400, "no images"),
    (b"[1, 2]", "application/json", 400, "must be an object"),
])
def test_bad_bodies_are_refused_with_a_message(body: bytes, kind: str, status: int, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as caught:
        decode_body(body, kind, SHAPE, LIMITS)
    assert caught.value.status == status


def test_request_budgets_are_checked_before_decoding() -> None:
    small = ServeLimits(max_images=3, max_request_pixels=3 * 40 * 30, max_bytes=40_000)
    four = json.dumps({"images": [b64(png(RGB))] * 4}).encode()
    with pytest.raises(BadRequest, match="4 images, over the limit of 3") as caught:
        decode_body(four, "application/json", SHAPE, small)
    assert caught.value.status == 413
    claims = json.dumps({"images": [b64(png_claiming(100, 100))] * 2}).encode()
    with pytest.raises(BadRequest, match="declare 20,000 pixels in all"):
        decode_body(claims, "application/json", SHAPE, small)
    with pytest.raises(BadRequest, match="over the limit of 40,000"):
        decode_body(b"x" * 40_001, "image/png", SHAPE, small)


def test_headers_alone_refuse_length_size_and_type() -> None:
    small = ServeLimits(max_bytes=100)
    assert check_headers("POST", "/invocations", None, "image/png", small)[0] == 411
    assert check_headers("POST", "/invocations", "101", "image/png", small)[0] == 413
    assert check_headers("POST", "/invocations", "0", "image/png", small)[0] == 400
    refused = check_headers("POST", "/invocations", "10", "text/csv", small)
    assert refused[0] == 415 and "got 'text/csv'" in refused[1]
    assert check_headers("POST", "/invocations", "10", "image/jpeg", small) is None
    assert check_headers("GET", "/health", None, None, small) is None  # not a prediction: not ours


def test_limits_are_checked_once() -> None:
    with pytest.raises(ValueError, match="ServeLimits.max_queue must be a number > 0"):
        ServeLimits(max_queue=0)
    with pytest.raises(ValueError, match="ServeLimits.timeout"):
        ServeLimits(timeout=True)


def test_json_depth_scan_ignores_brackets_in_strings() -> None:
    assert not json_depth_exceeds('{"a": "[[[[[[[[[["}', 3)
    assert json_depth_exceeds("[[[[]]]]", 3)
    assert not json_depth_exceeds(b"[[[]]]", 3)
    escaped = '{"a": "\\"[[[[\\\\", "b": [[["x\\"]]"]]]}'  # escapes, then brackets outside strings again
    assert json_depth_exceeds(escaped, 3) and not json_depth_exceeds(escaped, 4)
    assert not json_depth_exceeds('{"a": "' + "[" * 100_000, 3)  # an unterminated string: all inside it
    hostile = "[" * 1000 + "]" * 1000
    assert json_depth_exceeds(hostile, 64) and json_depth_exceeds(hostile.encode(), 64)


def test_a_budget_is_macs_or_a_name_and_a_bad_one_is_named() -> None:
    from pipeline.serving.requests import parse_budget, request_budget, stamped

    assert parse_budget(None) is None and parse_budget(2e5) == 2e5 and parse_budget(" 150000 ") == 150000.0
    assert parse_budget("p2") == "p2" and parse_budget(7) == 7.0
    for bad in (0, -5, float("inf"), True, "", "x" * 65, [1], "a\nb"):
        with pytest.raises(BadRequest, match="budget"):
            parse_budget(bad)
    payload = json.loads(stamped(b'{"image": "aGk="}', 12.5, "3e5"))
    assert payload["_cascade"] == {"arrived": 12.5, "budget": "3e5"} and request_budget(payload) == 3e5
    assert request_budget({**payload, "budget": "exit1"}) == "exit1"  # the JSON field wins over the header
    assert request_budget({"image": "aGk="}) is None and json.loads(stamped(b"{ }", 1.0, None)) == {
        "_cascade": {"arrived": 1.0}}
