"""Benchmark: REST serving of the registered pyfunc model with ``mlflow models serve`` on loopback (the
project's own server, ``cascade serve``, is measured by ``bench.serving``). A bounded load of
``--clients`` concurrent clients (threads, keep-alive connections) posts base64 PNGs for
``--seconds`` per phase: one image per request (requests/s) and ``--batch`` images per request
(images/s); reports p50/p99 latency and the failed requests (there must be none).

A third phase, ``mixed``, sends a fixed list of ``--mixed-requests`` requests (default 500) from
``--mixed-clients`` clients (default 8), ``--bad-share`` of them (default 10%) bad: 3 rows with row 1
malformed base64, a corrupt PNG, a PNG whose header claims 20000 x 20000 pixels, a row with no image,
or an empty frame. Every good request must answer 200 with one row per image, every bad one 4xx with
a message naming row 1 (the empty frame: "no rows"), no 5xx; the server's resident memory (every
process of its group, sampled every 50 ms) is reported and must stay under ``--max-rss-gb`` (2).

    python -m bench.mlflow_serving [--model models:/fashion-cascade@champion | MODEL_DIR] [--seconds 20]
                            [--clients 4] [--batch 64] [--workers 1] [--out bench/out/mlflow_serving.json]
                            [--mixed-requests 500] [--mixed-clients 8] [--bad-share 0.1]

A ``models:/`` URI is fetched from ``MLFLOW_TRACKING_URI`` (default: ``mlflow.db`` here). A directory
is either an MLflow model or a cascade model directory (wrapped into a pyfunc model first). Request
images come from ``--data``'s test split when present, else random images of the model's shape.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

JSON = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(model: str, port: int, workers: int, env: dict[str, str], log: Path, timeout: float = 180.0
           ) -> Iterator[str]:
    """``mlflow models serve`` in its own process group until ``/ping`` answers; stopped after."""
    cmd = [str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", model,
           "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"mlflow models serve exited with {proc.returncode}:\n"
                                 f"{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/ping")
                if conn.getresponse().status == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"the server did not answer within {timeout:.0f} s:\n"
                                 f"{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def body(b64_images: list[str]) -> bytes:
    return json.dumps({"dataframe_split": {"columns": ["image"], "data": [[b] for b in b64_images]}}).encode()


def run_clients(client, clients: int) -> None:
    """Run ``client(k)`` for k = 0..clients-1 in threads and wait for all of them."""
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def load(port: int, bodies: list[bytes], clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads post ``bodies`` round-robin until the deadline; latency of each request."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures = [0] * clients
    start = time.perf_counter()
    deadline = start + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        i = k
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/invocations", bodies[i % len(bodies)], JSON)
                answer = conn.getresponse()
                answer.read()
                ok = answer.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            if ok:
                latencies[k].append(time.perf_counter() - t0)
            else:
                failures[k] += 1
            i += clients
        conn.close()

    run_clients(client, clients)
    elapsed = time.perf_counter() - start
    lat = sorted(x for per in latencies for x in per)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else (lat or [math.nan]) * 99
    return {"requests": len(lat), "failed": sum(failures), "seconds": round(elapsed, 2),
            "requests_per_s": round(len(lat) / elapsed, 2),
            "p50_ms": round(1000 * q[49], 2), "p99_ms": round(1000 * q[98], 2)}


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every live process in process group ``pgid`` (Linux /proc)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # after ")": state, ppid, pgrp, ...
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # rss in pages
    return total


def fake_huge_png(width: int = 20000, height: int = 20000) -> bytes:
    """A PNG header claiming ``width`` x ``height`` (no pixel data): the server must refuse it from the
    header, before decoding (a real one would decode to 400 M pixels)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def bad_bodies(good_b64: str) -> dict[str, tuple[bytes, str]]:
    """Bad requests: name -> (body, what the 4xx message must contain). Rows 0 and 2 are good."""
    import base64

    def three(bad: object) -> bytes:
        rows = [[good_b64], [bad], [good_b64]]
        return json.dumps({"dataframe_split": {"columns": ["image"], "data": rows}}).encode()

    return {
        "bad_base64": (three("!!! not base64 !!!"), "row 1"),
        "corrupt_png": (three(base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()), "row 1"),
        "huge_png": (three(base64.b64encode(fake_huge_png()).decode()), "row 1"),
        "no_image": (three(None), "row 1"),
        "empty_frame": (json.dumps({"dataframe_split": {"columns": ["image"], "data": []}}).encode(), "no rows"),
    }


def mixed(port: int, pgid: int, good: list[bytes], good_rows: int, bad: dict[str, tuple[bytes, str]],
          requests: int, share: float, clients: int, seed: int = 0) -> dict[str, object]:
    """A fixed, seeded list of ``requests`` (``share`` bad, the bad kinds in turn) split over ``clients``."""
    rng = np.random.default_rng(seed)
    n_bad = round(requests * share)
    kinds = list(bad)
    plan: list[tuple[str, bytes, str | None]] = [("good", good[i % len(good)], None) for i in range(requests - n_bad)]
    plan += [(kinds[i % len(kinds)], *bad[kinds[i % len(kinds)]]) for i in range(n_bad)]
    plan = [plan[i] for i in rng.permutation(len(plan))]
    outcome: list[tuple[str, int, bool] | None] = [None] * len(plan)
    peak = [group_rss_bytes(pgid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], group_rss_bytes(pgid))

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for i in range(k, len(plan), clients):
            kind, payload, must = plan[i]
            try:
                conn.request("POST", "/invocations", payload, JSON)
                answer = conn.getresponse()
                text = answer.read().decode(errors="replace")
                if kind == "good":
                    ok = answer.status == 200 and len(json.loads(text)["predictions"]) == good_rows
                else:
                    ok = 400 <= answer.status < 500 and must in text
                outcome[i] = (kind, answer.status, ok)
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                outcome[i] = (kind, 0, False)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    run_clients(client, clients)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    rows = [o for o in outcome if o is not None]
    per_kind = {kind: {"sent": sum(o[0] == kind for o in rows), "ok": sum(o[0] == kind and o[2] for o in rows)}
                for kind in ["good", *kinds]}
    return {"requests": len(plan), "bad": n_bad, "clients": clients, "seconds": round(seconds, 2),
            "good_failed": per_kind["good"]["sent"] - per_kind["good"]["ok"],
            "bad_not_4xx_naming_the_row": n_bad - sum(v["ok"] for k, v in per_kind.items() if k != "good"),
            "server_errors_5xx": sum(o[1] >= 500 for o in rows), "per_kind": per_kind,
            "server_rss_peak_mb": round(peak[0] / 2**20, 1)}


def request_images(data: Path, shape: tuple[int, int, int], n: int) -> np.ndarray:
    test = data / "test.npz"
    if test.is_file():
        with np.load(test, allow_pickle=False) as z:
            return z["images"][:n]
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models:/fashion-cascade@champion")
    p.add_argument("--data", type=Path, default=Path("data/prepared"), help="test split for request images")
    p.add_argument("--seconds", type=float, default=20.0, help="load duration per phase")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured load before each phase")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of the server")
    p.add_argument("--mixed-requests", type=int, default=500, help="requests of the mixed phase (0: skip it)")
    p.add_argument("--mixed-clients", type=int, default=8)
    p.add_argument("--bad-share", type=float, default=0.1, help="share of bad requests in the mixed phase")
    p.add_argument("--max-rss-gb", type=float, default=2.0, help="the server's resident memory limit (mixed)")
    p.add_argument("--out", type=Path, default=Path("bench/out/mlflow_serving.json"))
    args = p.parse_args(argv)
    if not 0 <= args.bad_share <= 1 or args.mixed_requests < 0 or args.mixed_clients < 1:
        p.error("need 0 <= --bad-share <= 1, --mixed-requests >= 0 and --mixed-clients >= 1")

    import torch

    from pipeline.registry.register import download_cascade, image_frame, predict_frame, save_cascade_pyfunc
    from pipeline.routing.package import load_cascade

    env = dict(os.environ)
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{Path('mlflow.db').resolve()}")
    os.environ["MLFLOW_TRACKING_URI"] = env["MLFLOW_TRACKING_URI"]
    env.update(MLFLOW_ENABLE_TELEMETRY="false", DO_NOT_TRACK="1",
               MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's uvicorn
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        model, local = args.model, Path(args.model)
        if model.startswith("models:/"):
            cascade = download_cascade(model, Path(tmp) / "download")
        elif (local / "MLmodel").is_file():
            from pipeline.registry.register import cascade_dir

            cascade = cascade_dir(local)
        else:  # a bare cascade directory: wrap it as the registry would
            cascade = local
            example = image_frame(request_images(args.data, load_cascade(local).meta.image_shape, 1))
            model = str(save_cascade_pyfunc(local, Path(tmp) / "pyfunc", example))
        loaded = load_cascade(cascade)
        images = request_images(args.data, loaded.meta.image_shape, 4 * args.batch)  # (n, C, H, W)
        b64 = list(image_frame(images)["image"])
        singles = [body([b]) for b in b64]
        batches = [body(b64[i:i + args.batch]) for i in range(0, len(b64) - args.batch + 1, args.batch)]
        port = free_port()
        with served(model, port, args.workers, env, Path(tmp) / "serve.log") as pgid:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("POST", "/invocations", batches[0], JSON)
            answer = json.loads(conn.getresponse().read())["predictions"]
            torch.set_grad_enabled(False)
            local_rows = predict_frame(loaded, image_frame(images[:args.batch])).to_dict("records")
            agree = sum(a["class_index"] == b["class_index"] and a["exit"] == b["exit"]
                        for a, b in zip(answer, local_rows, strict=True)) / len(local_rows)
            results = {}
            phases = (("single", singles, 1), (f"batch{args.batch}", batches, args.batch))
            for name, bodies, per_request in phases:
                load(port, bodies, args.clients, args.warmup)
                r = load(port, bodies, args.clients, args.seconds)
                r["images_per_request"] = per_request
                r["images_per_s"] = round(r["requests_per_s"] * per_request, 1)
                results[name] = r
            if args.mixed_requests:
                mixed_good = [body(b64[i:i + 3]) for i in range(0, len(b64) - 2, 3)]
                results["mixed"] = mixed(port, pgid, mixed_good, 3, bad_bodies(b64[0]), args.mixed_requests,
                                         args.bad_share, args.mixed_clients)
    report = {"model": args.model, "clients": args.clients, "workers": args.workers, "seconds": args.seconds,
              "cpus": os.cpu_count(), "image_shape": list(loaded.meta.image_shape),
              "agreement_with_local_engine": agree, "phases": results}
    print(f"{'phase':10s} {'req/s':>8s} {'images/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'requests':>9s} "
          f"{'failed':>7s}")
    for name, r in ((n, r) for n, r in results.items() if n != "mixed"):
        print(f"{name:10s} {r['requests_per_s']:8.1f} {r['images_per_s']:9.1f} {r['p50_ms']:8.1f} "
              f"{r['p99_ms']:8.1f} {r['requests']:9d} {r['failed']:7d}")
    print(f"agreement with the local engine (class and exit, {args.batch} images): {agree:.3f}")
    mix = results.get("mixed")
    bad_mix = False
    if mix is not None:
        print(f"mixed: {mix['requests']} requests from {mix['clients']} clients ({mix['bad']} bad) in "
              f"{mix['seconds']} s: good failed {mix['good_failed']}, bad not 4xx naming the row "
              f"{mix['bad_not_4xx_naming_the_row']}, 5xx {mix['server_errors_5xx']}, "
              f"server RSS peak {mix['server_rss_peak_mb']} MB")
        bad_mix = bool(mix["good_failed"] or mix["bad_not_4xx_naming_the_row"] or mix["server_errors_5xx"]
                       or mix["server_rss_peak_mb"] > args.max_rss_gb * 1024)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    failed = sum(r["failed"] for n, r in results.items() if n != "mixed")
    return 1 if failed or agree < 1.0 or bad_mix else 0


if __name__ == "__main__":
    sys.exit(main())
