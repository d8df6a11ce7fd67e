"""`cascade serve` and `cascade export` end to end: a real LitServe server on the test cascade, with
good and bad requests at once (pipeline.serving.server, pipeline.serving.commands)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import recognize_arrays
from tests.routing.test_package import uint8_images
from tests.serving.test_requests import png


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: bytes, kind: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/invocations", body=body, headers={"Content-Type": kind})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[int]:
    yield from running_server(tiny_model, "--engine", "onnx", "--max-images", "64")


def wait_until_up(proc: subprocess.Popen, port: int) -> None:
    """Until ``proc`` answers /health on ``port`` (120 s at most); its output if it exits first."""
    until = time.monotonic() + 120
    while time.monotonic() < until:
        out = proc.stdout or proc.stderr
        assert proc.poll() is None, out.read().decode() if out else "server exited"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail("cascade serve did not come up within 120 s")


def running_server(model: Path, *args: str) -> Iterator[int]:
    """``cascade serve`` on ``model`` in its own process group, up and answering /health: yields its port."""
    port = free_port()
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--model", str(model), "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_up(proc, port)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_concurrent_good_and_bad_requests_each_get_their_own_answer(server: int, tiny_model: Path) -> None:
    images = uint8_images(24, seed=11)
    expected = recognize_arrays(load_cascade(tiny_model), images)
    jobs = [(png(im[0]), "image/png") for im in images] + [(b"not an image", "image/png")] * 8
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda job: post(server, *job), jobs))
    good, bad = answers[:24], answers[24:]
    assert all(status == 200 for status, _ in good)
    got = [(a["predictions"][0]["class_index"], a["predictions"][0]["exit"]) for _, a in good]
    assert got == [(r["class_index"], r["exit"]) for r in expected]  # batched or not, the same answers
    assert all(status == 400 and "not a PNG or JPEG" in a["message"] for status, a in bad)


def test_a_many_image_json_request_and_the_limits(server: int, tiny_model: Path) -> None:
    import base64

    images = uint8_images(64, seed=12)
    body = json.dumps({"images": [base64.b64encode(png(im[0])).decode() for im in images]}).encode()
    status, answer = post(server, body, "application/json")
    assert status == 200 and len(answer["predictions"]) == 64
    expected = recognize_arrays(load_cascade(tiny_model), images)
    assert [p["exit"] for p in answer["predictions"]] == [r["exit"] for r in expected]
    too_many = json.dumps({"images": [base64.b64encode(png(images[0, 0])).decode()] * 65}).encode()
    status, answer = post(server, too_many, "application/json")
    assert status == 413 and "65 images, over the limit of 64" in answer["message"]
    assert post(server, b"hello", "text/plain")[0] == 415


def test_export_and_serve_refuse_a_bad_model_with_exit_2(tiny_model: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--model", str(tiny_model), "--out", str(tmp_path / "onnx")]) == 0
    assert "module2_predictor.onnx" in capsys.readouterr().out
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path / "onnx"), "--engine", "torch"]) == 2
    assert "ONNX export" in capsys.readouterr().err
    assert main(["export", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_a_serving_process_freezes_what_it_loaded_out_of_the_collectors_view() -> None:
    """freeze_heap (called by every serving process once loaded, docs/DESIGN.md 'Serving'): the objects
    alive now leave the collector's view, so a full collection no longer walks them."""
    import gc

    from pipeline.serving.engines import freeze_heap

    loaded_before = {"a container the collector tracks": []}
    try:
        frozen = freeze_heap()
        assert frozen > 10_000  # pytest, torch and the project are loaded here
        # A frozen object that is freed leaves the frozen set, so the count can only fall after the call
        # (the pytest run this once read 2 fewer, objects freed in between): it never grows by itself.
        assert gc.get_freeze_count() <= frozen
        assert not any(o is loaded_before for o in gc.get_objects())  # out of the collector's view
        assert len(gc.get_objects()) < frozen  # what the collector still tracks: only what came after
    finally:
        gc.unfreeze()
