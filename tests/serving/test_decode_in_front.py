"""The images are decoded in the HTTP front (the guard), and the inference worker only unpacks them
(issue 69, 'Decode off the engine'; pipeline.serving.guard, requests, server): the worker receives the
decoded form and decodes no image, a client cannot hand it that form to pass the limits, every refusal
keeps its status and words, and the answers are those of the worker's own decoding."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.serving.guard import GuardMiddleware
from pipeline.serving.limits import ServeLimits
from pipeline.serving.requests import (
    PIXELS_KEY,
    SHAPE_KEY,
    STAMP_KEY,
    BadRequest,
    decode_body,
    decoded_images,
    stamped,
    wrap_raw,
)
from tests.routing.test_package import uint8_images
from tests.serving.test_guard import Recorder, call
from tests.serving.test_requests import GREY, RGB, b64, jpeg, png, png_claiming

SHAPE = (1, 16, 16)
LIMITS = ServeLimits()


def front(**limits: int) -> tuple[GuardMiddleware, Recorder]:
    inner = Recorder()
    return GuardMiddleware(inner, ServeLimits(**limits), image_shape=SHAPE), inner


def test_the_worker_gets_the_decoded_pixels_with_the_stamp_and_the_clients_budget() -> None:
    app, inner = front()
    body = json.dumps({"images": [b64(png(RGB)), b64(jpeg(RGB)), b64(png(GREY))], "budget": "exit1",
                       "deadline_ms": 900, "extra": "dropped"}).encode()
    assert call(app, body, "application/json", headers={"x-cascade-budget": "p2"})[0] == 200
    assert call(app, png(RGB), "image/png")[0] == 200
    (headers, sent), (_, raw) = inner.seen
    payload = json.loads(sent)
    assert set(payload) == {"budget", "deadline_ms", STAMP_KEY} and payload["budget"] == "exit1"
    stamp = payload[STAMP_KEY]
    assert stamp["budget"] == "p2" and stamp["deadline_ms"] == 900 and stamp[SHAPE_KEY] == [3, *SHAPE]
    assert headers["content-type"] == "application/json" and headers["content-length"] == str(len(sent))
    images = decoded_images(payload, SHAPE, LIMITS)
    assert np.array_equal(images, decode_body(body, "application/json", SHAPE, LIMITS))  # the worker's decoding
    assert len(sent) < len(body)  # 16 x 16 grey: smaller than the PNGs it came from
    one = decoded_images(json.loads(raw), SHAPE, LIMITS)
    assert np.array_equal(one, decode_body(png(RGB), "image/png", SHAPE, LIMITS))


BAD = [
    (b"garbage", "image/png"),
    (png_claiming(20000, 20000), "image/png"),
    (png_claiming(20000, 20000), "image/jpeg"),
    (b'{"images": ["%%%", 3]}', "application/json"),
    (b'{"image": "abc', "application/json"),
    (b"\xff\xfe{}", "application/json"),
    (b"[" * 40 + b"]" * 40, "application/json"),
    (b'{"photo": "x"}', "application/json"),
    (b'{"images": []}', "application/json"),
    (b'{"images": "x"}', "application/json"),
    (b"[1, 2]", "application/json"),
    (json.dumps({"images": [b64(png(GREY)), b64(b"\x89PNG\r\n\x1a\nbroken")]}).encode(), "application/json"),
    (json.dumps({"dataframe_records": [{"pixels": [[1, 2], [3]]}]}).encode(), "application/json"),
    (json.dumps({"images": [b64(png_claiming(3000, 3000))] * 30}).encode(), "application/json"),
]


@pytest.mark.parametrize(("body", "kind"), BAD)
def test_a_bad_request_gets_the_status_and_words_the_worker_gave_it(body: bytes, kind: str) -> None:
    """The decoder and the limits are the worker's: what it refused, the front refuses in the same words."""
    served = (body, kind) if kind == "application/json" else (wrap_raw(body), "application/json")  # as wrapped
    with pytest.raises(BadRequest) as caught:
        decode_body(*served, SHAPE, LIMITS)  # what the worker answered (the guard's checks and its own)
    app, inner = front()
    status, answer = call(app, body, kind)
    assert (status, answer["message"]) == (caught.value.status, str(caught.value))
    assert inner.seen == []  # refused in the front: the worker never sees it


def test_a_client_cannot_hand_the_worker_pixels_of_its_own() -> None:
    """A client's stamp never reaches the worker (the guard writes the body afresh), and the worker takes
    the decoded form only in the model's shape, within the image count, byte for byte."""
    app, inner = front(max_images=4)
    forged = {SHAPE_KEY: [1000, 1, 16, 16], PIXELS_KEY: base64.b64encode(bytes(1000 * 256)).decode()}
    status, answer = call(app, json.dumps({STAMP_KEY: forged}).encode(), "application/json")
    assert status == 400 and "needs 'image', 'images'" in answer["message"] and inner.seen == []
    good = b64(png(GREY))
    assert call(app, json.dumps({"image": good, STAMP_KEY: forged}).encode(), "application/json")[0] == 200
    stamp = json.loads(inner.seen[0][1])[STAMP_KEY]
    assert stamp[SHAPE_KEY] == [1, *SHAPE] and base64.b64decode(stamp[PIXELS_KEY]) == GREY.tobytes()

    def forge(shape: list, data: bytes) -> dict:
        return {STAMP_KEY: {SHAPE_KEY: shape, PIXELS_KEY: base64.b64encode(data).decode()}}

    small = ServeLimits(max_images=4)
    assert decoded_images(forge([2, 1, 16, 16], bytes(512)), SHAPE, small).shape == (2, 1, 16, 16)
    assert decoded_images({"image": good}, SHAPE, small) is None  # not decoded: the worker decodes it
    for shape, data in (([5, 1, 16, 16], bytes(5 * 256)),  # over max_images
                        ([0, 1, 16, 16], b""),
                        ([1, 1, 64, 64], bytes(64 * 64)),  # not the model's input
                        ([1, 3, 16, 16], bytes(3 * 256)),
                        ([1, 256], bytes(256)),
                        ([1, 1, 16, 16], bytes(255)),  # fewer bytes than the shape says
                        ([1, 1, 16, 16], bytes(258)),
                        ([1.0, 1, 16, 16], bytes(256))):
        with pytest.raises(BadRequest, match="decoded images"):
            decoded_images(forge(shape, data), SHAPE, small)
    with pytest.raises(BadRequest, match="not valid base64"):
        decoded_images({STAMP_KEY: {SHAPE_KEY: [1, 1, 16, 16], PIXELS_KEY: "%" * 344}}, SHAPE, small)


def test_a_front_without_the_models_shape_hands_the_body_on_for_the_worker_to_decode() -> None:
    inner = Recorder()
    assert call(GuardMiddleware(inner), png(GREY), "image/png")[0] == 200
    payload = json.loads(inner.seen[0][1])
    assert payload["image"] == b64(png(GREY)) and PIXELS_KEY not in payload[STAMP_KEY]


@pytest.fixture(scope="module")
def worker(tiny_model: Path) -> Iterator[object]:
    from pipeline.serving.server import CascadeAPI, ServeConfig

    api = CascadeAPI(ServeConfig(str(tiny_model), "onnx"))
    api.setup(None)
    yield api


def test_the_worker_unpacks_the_decoded_form_and_decodes_no_image(worker: object, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    from pipeline.serving import requests, server
    from pipeline.serving.server import Job, Refused

    images = uint8_images(5, seed=21)
    body = json.dumps({"images": [b64(png(im[0])) for im in images], "budget": "accurate"}).encode()
    app, inner = front()
    assert call(app, body, "application/json")[0] == 200
    forwarded = json.loads(inner.seen[0][1])

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("the worker decoded an image")

    for module, name in ((server, "decode_payload"), (requests, "decode_images"), (requests, "decode_items")):
        monkeypatch.setattr(module, name, no_decoding)
    job = worker.decode_request(forwarded)
    assert isinstance(job, Job) and np.array_equal(job.images, images) and job.point.name == "accurate"
    assert job.arrived == forwarded[STAMP_KEY]["arrived"]
    forwarded[STAMP_KEY][SHAPE_KEY] = [5, 1, 8, 32]  # the same bytes in another shape: refused, 400
    refused = worker.decode_request(forwarded)
    assert isinstance(refused, Refused) and refused.status == 400 and "decoded images" in refused.message


def test_the_answers_are_those_of_the_workers_own_decoding(worker: object) -> None:
    """The same request, decoded in the front or (as before) in the worker: the same images reach the
    engine, so the same answers, field for field (a larger colour image too: resized in the front)."""
    from pipeline.serving.server import answer_batch

    images = uint8_images(12, seed=22)
    bodies = [(json.dumps({"images": [b64(png(im[0])) for im in images]}).encode(), "application/json"),
              (png(images[0, 0]), "image/png"), (jpeg(RGB), "image/jpeg"), (png(RGB), "application/octet-stream")]
    app, inner = front()
    for body, kind in bodies:
        assert call(app, body, kind)[0] == 200
    before = [worker.decode_request(json.loads(stamped(wrap_raw(body) if kind != "application/json" else body,
                                                       1.0, None))) for body, kind in bodies]
    after = [worker.decode_request(json.loads(sent)) for _, sent in inner.seen]
    for old, new in zip(before, after, strict=True):
        assert np.array_equal(old.images, new.images)
    old_rows = [a.rows for a in answer_batch(worker.engine, before, worker.current)]
    new_rows = [a.rows for a in answer_batch(worker.engine, after, worker.current)]
    assert old_rows == new_rows and sum(map(len, new_rows)) == 15


def test_the_server_answers_as_before(tiny_model: Path, worker: object) -> None:
    """Through a real `cascade serve`: each request alone (its own batch) answered exactly as the engine
    answers the worker's own decoding of it; bad ones with their words."""
    from tests.serving.test_server import post, running_server

    images = uint8_images(8, seed=23)
    cases = [(json.dumps({"images": [b64(png(im[0])) for im in images]}).encode(), "application/json"),
             (png(RGB), "image/png"), (jpeg(RGB), "image/jpeg")]
    server = running_server(tiny_model, "--engine", "onnx", "--max-images", "64", "--decode-in-front")
    port = next(server)
    try:
        answers = [post(port, body, kind) for body, kind in cases]
        bad = post(port, b"garbage", "image/png")
    finally:
        server.close()
    engine = worker.engine  # the server's engine (ONNX Runtime), in this process
    for (body, kind), (status, answer) in zip(cases, answers, strict=True):
        want = engine.recognize(decode_body(body, kind, engine.image_shape, LIMITS))
        assert status == 200 and answer["predictions"] == json.loads(json.dumps(want))
    assert bad[0] == 400 and bad[1]["message"].startswith("image cannot be decoded: ")
