"""`cascade serve --server triton` end to end: Triton Inference Server (scripts/setup_triton.sh) on the
test cascade, concurrent good and bad requests in the KServe v2 protocol, and the pieces of
pipeline.serving.triton / triton_backend that need no server."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import recognize_arrays
from pipeline.serving.limits import BadRequest, ServeLimits
from pipeline.serving.triton import (
    CODE_DIR,
    INFER_PATH,
    MODEL_NAME,
    ONNX_DIR,
    TritonMissing,
    installed,
    model_config,
    triton_home,
    write_repository,
)
from pipeline.serving.triton_backend import decode_request, onnx_path, parameters, request_limits
from tests.routing.test_package import uint8_images
from tests.serving.test_requests import png


def infer_body(images: list[bytes]) -> bytes:
    return json.dumps({"inputs": [{"name": "image", "shape": [len(images), 1], "datatype": "BYTES",
                                   "data": [base64.b64encode(b).decode() for b in images]}]}).encode()


def post(port: int, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", INFER_PATH, body=body, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def outputs(answer: dict) -> dict[str, list]:
    return {o["name"]: o["data"] for o in answer["outputs"]}


def test_an_element_is_raw_image_bytes_or_their_base64() -> None:
    raw = png(np.zeros((8, 8), dtype=np.uint8))
    limits = ServeLimits()
    assert np.array_equal(decode_request([raw], (1, 8, 8), limits), decode_request([base64.b64encode(raw)],
                                                                                   (1, 8, 8), limits))
    with pytest.raises(BadRequest, match="^image is not valid base64"):
        decode_request([b"not base64 at all!"], (1, 8, 8), limits)


def test_a_request_is_decoded_with_its_limits_naming_the_bad_image() -> None:
    good = png(np.full((8, 8), 200, dtype=np.uint8))
    limits = ServeLimits(max_images=2, max_pixels=100)
    assert decode_request([good, good], (1, 4, 4), limits).shape == (2, 1, 4, 4)
    with pytest.raises(BadRequest, match="3 images, over the limit of 2") as caught:
        decode_request([good] * 3, (1, 4, 4), limits)
    assert caught.value.status == 413
    with pytest.raises(BadRequest, match="^image 1 "):
        decode_request([good, b"\x89PNG broken"], (1, 4, 4), limits)
    with pytest.raises(BadRequest, match="image"):
        decode_request([good], (1, 4, 4), ServeLimits(max_images=2, max_pixels=10))  # 64 pixels over 10
    with pytest.raises(BadRequest, match="no image"):
        decode_request([], (1, 4, 4), limits)
    with pytest.raises(BadRequest, match="declare 128 pixels in all"):  # two 8 x 8 headers, 100 allowed
        decode_request([good, good], (1, 4, 4), ServeLimits(max_images=2, max_request_pixels=100))


def test_the_backend_reads_its_limits_from_the_config() -> None:
    limits = ServeLimits(max_images=5, max_pixels=999, max_request_pixels=4000)
    text = model_config(32, 250, limits, exits=False)
    settings = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', text))
    assert request_limits(settings) == ServeLimits(max_images=5, max_pixels=999, max_request_pixels=4000)
    del settings["max_request_pixels"]  # a repository written before the key: the default
    assert request_limits(settings).max_request_pixels == ServeLimits().max_request_pixels


def test_the_model_config_carries_the_batcher_and_the_settings() -> None:
    text = model_config(32, 250, ServeLimits(max_queue=7, timeout=2.0, max_images=5), exits=False)
    assert "max_batch_size: 32" in text and "max_queue_delay_microseconds: 250" in text
    assert "queue_policy" not in text  # measured to cost Triton 2.51's batcher 8x (pipeline/serving/triton.py)
    assert 'key: "exits" value: { string_value: "0" }' in text
    assert 'key: "max_images" value: { string_value: "5" }' in text
    assert f'key: "onnx_dir" value: {{ string_value: "{ONNX_DIR}" }}' in text  # inside the model's folder


def test_a_p99_target_sets_the_batchers_queue_timeout_and_lets_a_request_override_it() -> None:
    text = model_config(32, 250, ServeLimits(), exits=True, p99_ms=80.5)
    batcher = re.search(r"dynamic_batching \{(.*)\}\n", text)
    assert batcher is not None
    assert re.fullmatch(r" max_queue_delay_microseconds: 250 default_queue_policy \{ timeout_action: REJECT "
                        r"default_timeout_microseconds: 80500 allow_timeout_override: true \} ", batcher.group(1))
    assert text.count("{") == text.count("}")  # the protobuf text stays balanced
    assert "queue_policy" not in model_config(32, 250, ServeLimits(), exits=True)  # no target: none, as measured


def test_the_export_is_found_inside_the_model_folder_unless_absolute(tmp_path: Path) -> None:
    assert onnx_path("onnx", "/models/cascade") == "/models/cascade/onnx"
    assert onnx_path(str(tmp_path), "/models/cascade") == str(tmp_path)


def test_the_repository_is_self_contained_and_replaced_whole(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text("{}")
    out = tmp_path / "repository"
    (out / "stale").mkdir(parents=True)  # what was there before goes
    write_repository(out, "config text", export)
    model = out / MODEL_NAME
    assert sorted(p.name for p in out.iterdir()) == [MODEL_NAME]
    assert (model / "config.pbtxt").read_text() == "config text"
    assert (model / ONNX_DIR / "manifest.json").read_text() == "{}"
    assert (model / CODE_DIR / "pipeline" / "serving" / "triton_backend.py").is_file()
    assert not list((model / CODE_DIR).rglob("__pycache__"))
    # model.py imports the backend from the bundled code, wherever the repository is and whatever the cwd
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    probe = ("import runpy, sys; ns = runpy.run_path(sys.argv[1]); "
             "import pipeline; print(pipeline.__file__); print(ns['TritonPythonModel'].__module__)")
    result = subprocess.run([sys.executable, "-c", probe, str(moved / MODEL_NAME / "1" / "model.py")],
                            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    where, module = result.stdout.split()
    assert Path(where).is_relative_to(moved / MODEL_NAME / CODE_DIR) and module == "pipeline.serving.triton_backend"


def test_parameters_of_a_model_config() -> None:
    assert parameters({"parameters": {"a": {"string_value": "1"}}}) == {"a": "1"}
    assert parameters({}) == {}


def test_a_missing_install_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(TritonMissing, match="scripts/setup_triton.sh"):
        installed(tmp_path)


@pytest.fixture(scope="module")
def triton(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from bench.serving import served

    try:
        installed(triton_home())
    except TritonMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (set-up installs it in CI)")
        pytest.skip(str(exc))
    log = tmp_path_factory.mktemp("triton") / "serve.log"
    with served(str(tiny_model), "onnx", False, log, timeout=120, extra=("--max-images", "64"),
                server="triton") as port:
        yield port


def test_triton_answers_as_the_engine_and_refuses_bad_images_alone(triton: int, tiny_model: Path) -> None:
    images = uint8_images(24, seed=11)
    expected = recognize_arrays(load_cascade(tiny_model), images)
    jobs = [infer_body([png(im[0])]) for im in images] + [infer_body([b"\x89PNG not an image"])] * 8
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda body: post(triton, body), jobs))
    good, bad = answers[:24], answers[24:]
    assert all(status == 200 for status, _ in good), good[:2]
    got = [(outputs(a)["class_index"][0], outputs(a)["exit"][0]) for _, a in good]
    assert got == [(r["class_index"], r["exit"]) for r in expected]  # batched or not, the same answers
    assert all(status == 400 and "image" in a["error"] for status, a in bad), bad[:2]


def test_triton_many_images_in_one_request_and_the_image_limit(triton: int, tiny_model: Path) -> None:
    images = uint8_images(64, seed=12)
    status, answer = post(triton, infer_body([png(im[0]) for im in images]))
    assert status == 200
    expected = recognize_arrays(load_cascade(tiny_model), images)
    assert outputs(answer)["exit"] == [r["exit"] for r in expected]
    assert outputs(answer)["class_name"] == [r["class_name"] for r in expected]
    status, answer = post(triton, infer_body([png(images[0, 0])] * 65))
    assert status == 400 and "64" in answer["error"]  # Triton's own batch cap, set to --max-images


def test_triton_takes_a_raw_png_in_the_binary_extension(triton: int, tiny_model: Path) -> None:
    from bench.serving import V2_HEADER, v2_binary_body

    images = uint8_images(4, seed=13)
    expected = recognize_arrays(load_cascade(tiny_model), images)
    for image, row in zip(images, expected, strict=True):
        conn = http.client.HTTPConnection("127.0.0.1", triton, timeout=30)
        try:
            conn.request("POST", INFER_PATH, body=v2_binary_body(png(image[0])),
                         headers={"Content-Type": "application/octet-stream",
                                  "Inference-Header-Content-Length": str(V2_HEADER)})
            reply = conn.getresponse()
            status, answer = reply.status, json.loads(reply.read())
        finally:
            conn.close()
        assert status == 200 and outputs(answer)["class_index"] == [row["class_index"]]


def test_cascade_serve_writes_the_repository_for_a_triton_container_and_exits(
        tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    out = tmp_path / "repository"
    args = ["serve", "--model", str(tiny_model), "--repository", str(out), "--max-batch-size", "16"]
    assert main(args) == 2  # the repository is Triton's: without --server triton it is refused
    assert "--server triton" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--server", "triton"]) == 0  # no tritonserver needed: nothing is served
    assert "wrote Triton's model repository" in capsys.readouterr().out
    config = (out / MODEL_NAME / "config.pbtxt").read_text()
    assert f"max_batch_size: {ServeLimits().max_images}" in config  # the cap is at least --max-images
    assert "queue_policy" not in config
    assert main([*args, "--server", "triton", "--p99-ms", "120"]) == 0  # a target: Triton's queue timeout
    assert "default_timeout_microseconds: 120000" in (out / MODEL_NAME / "config.pbtxt").read_text()
    capsys.readouterr()
    assert (out / MODEL_NAME / ONNX_DIR / "manifest.json").is_file()  # exported from the torch model


def test_triton_with_a_target_rejects_what_outwaits_its_queue_timeout(tiny_model: Path, tmp_path: Path) -> None:
    """Triton reads the queue policy --p99-ms writes, and a request's own timeout (KServe v2 parameter
    ``timeout``, microseconds; allow_timeout_override) that its queueing outlasts is rejected, not served late."""
    from bench.serving import served

    try:
        installed(triton_home())
    except TritonMissing as exc:
        pytest.skip(str(exc))
    image = base64.b64encode(png(uint8_images(1, seed=5)[0, 0])).decode()
    with served(str(tiny_model), "onnx", False, tmp_path / "serve.log", timeout=120, extra=("--p99-ms", "2000"),
                server="triton") as port:
        assert post(port, infer_body([png(uint8_images(1, seed=5)[0, 0])]))[0] == 200  # within 2 s: served
        body = json.loads(infer_body([b""]))
        body["inputs"][0]["data"] = [image]
        body["parameters"] = {"timeout": 1}  # 1 us: the batcher's own wait (0.5 ms) outlasts it
        status, answer = post(port, json.dumps(body).encode())
    assert status == 503 and "timeout" in answer["error"].lower()
