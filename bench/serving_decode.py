"""Capacity of ``cascade serve`` on a model (``--model``: a model directory, e.g. ``models/cascade``), side by
side for several checkouts.

16 closed-loop clients (hey) each send 16-image JSON requests (base64 PNGs of the model's size) for
``--seconds``; the runs alternate between the ``--roots`` (each a checkout with its own ``pipeline``, the
same interpreter), ``--runs`` times each, and print images/s, p50/p99 and non-200s per run. Used to
measure the decoding's move from the inference worker into the HTTP front (issue 69, docs/DESIGN.md
"Serving"): ``python -m bench.serving_decode --model models/cascade --roots /tmp/before . --runs 3`` (the
figures in DESIGN were read on the serving tests' tiny model, ``tests/serving/conftest.py``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.serving import free_port, read_csv, summary


def body(n: int, shape: tuple[int, int, int], seed: int) -> str:
    """``n`` random images of the model's ``shape`` as one JSON request of base64 PNGs."""
    import numpy as np

    from pipeline.registry.payload import encode_png

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)  # (n, C, H, W)
    return json.dumps({"images": [base64.b64encode(encode_png(im)).decode() for im in images]})


def serve(root: Path, model: Path, log: Path, args: tuple[str, ...]) -> tuple[subprocess.Popen, int]:
    import http.client

    port = free_port()
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--model", str(model), "--port", str(port), *args]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cascade serve exited: {log.read_text()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("cascade serve did not come up")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def load(port: int, bodies: list[Path], seconds: float, images: int) -> dict:
    cmd = ["hey", "-z", f"{seconds}s", "-c", "1", "-m", "POST", "-T", "application/json", "-o", "csv"]
    start = time.perf_counter()
    procs = [subprocess.Popen([*cmd, "-D", str(b), f"http://127.0.0.1:{port}/invocations"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for b in bodies]
    latencies, statuses = [], []
    for p in procs:
        lat, st = read_csv(p.communicate()[0])
        latencies += lat
        statuses += st
    wall = time.perf_counter() - start
    return summary(latencies, statuses, min(max(seconds, wall - 0.05), seconds * 1.02), images)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="the model directory every checkout serves")
    p.add_argument("--roots", nargs="+", type=Path, default=[Path(".")], help="checkouts to serve from, in turn")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--images", type=int, default=16, help="images per request")
    p.add_argument("--serve-args", default="--engine onnx", help="more `cascade serve` arguments")
    p.add_argument("--out", type=Path, default=None, help="write the runs as JSON here")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp_name:
        tmp = Path(tmp_name)
        from pipeline.serving.engines import model_image_shape

        model = args.model.resolve()
        shape = model_image_shape(model)
        bodies = []
        for i in range(args.clients):
            path = tmp / f"body{i}.json"
            path.write_text(body(args.images, shape, seed=100 + i))
            bodies.append(path)
        for run in range(args.runs):
            for root in args.roots:
                proc, port = serve(root.resolve(), model, tmp / "serve.log", tuple(args.serve_args.split()))
                try:
                    load(port, bodies, 2.0, args.images)  # warm-up
                    row = {"root": str(root), "run": run + 1, **load(port, bodies, args.seconds, args.images),
                           "load_avg": os.getloadavg()[0]}
                finally:
                    stop(proc)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"clients": args.clients, "images": args.images, "seconds": args.seconds,
                                        "cpus": os.cpu_count(), "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
