"""Benchmark: the cascade served by ``cascade serve`` on loopback, driven by ``hey`` (a compiled load
generator; ``scripts/setup.sh`` installs the Debian package).

For each engine (torch, onnx) and each mode (early exits, and the cascade's own static path served the
same way: ``--static``, every module on every image), it measures with hey:

- single-image requests (raw PNG bytes of test images) at 1, 16 and 64 clients; each client sends its
  own test image (one hey process per client), so the load mixes easy and hard images as the test
  split does; at 1 client, 16 images one after another;
- 64-image requests (JSON, base64 PNGs) at 64 clients (8 hey processes of 8 clients, 8 bodies);

and reports images/s, p50 and p99 latency (from hey's per-request CSV), the non-200 answers, the
early-exit gain (images/s of the exits over the static path, same engine and load), and the same
engine's in-process throughput at batch 256. Then, under the 64-client single-image load, every request
of ``bench.abusive_request`` must get a 4xx in < 1 s while the good requests keep their p99.

    python -m bench.serving --model models/cascade --data data/prepared [--seconds 8] [--engines torch onnx]
                            [--out docs/results/serving.json] [--server triton]

With ``--server triton`` (``cascade serve --server triton``: Triton Inference Server, ONNX engine only)
the same loads go to ``/v2/models/cascade/infer`` in KServe v2: a single image as its raw PNG in the
binary tensor extension (a padded JSON header, then the bytes), 64 images as JSON with base64 PNGs in a
BYTES tensor; the abusive requests go in the v2 JSON form (``bench.abusive_request``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import http.client
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SINGLE_LOADS = (1, 16, 64)
BATCH_CLIENTS, BATCH_IMAGES, BATCH_PROCS = 64, 64, 8
PATHS = {"litserve": ("/health", "/invocations"), "triton": ("/v2/health/ready", "/v2/models/cascade/infer")}
V2_HEADER = 160  # bytes: Triton's single images go raw, after a JSON header padded to this length
SINGLE_HEADERS = {"litserve": (), "triton": (f"Inference-Header-Content-Length: {V2_HEADER}",)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(model: str, engine: str, static: bool, log: Path, timeout: float = 180.0,
           extra: tuple[str, ...] = (), server: str = "litserve") -> Iterator[int]:
    """``cascade serve`` (with ``extra`` arguments) in its own process group until its readiness path
    answers; stopped after."""
    port = free_port()
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--server", server, "--model", model, "--engine", engine,
           "--port", str(port), *(["--static"] if static else []), *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"cascade serve exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", PATHS[server][0])
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.3)
        else:
            raise RuntimeError(f"cascade serve did not answer within {timeout:g} s")
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def hey(port: int, body: Path, kind: str, clients: int, *, seconds: float | None = None,
        requests: int | None = None, path: str = "/invocations", headers: tuple[str, ...] = (),
        qps: float | None = None) -> subprocess.Popen:
    """hey against the server; ``qps``: each client's rate limit in requests per second (None: none)."""
    amount = ["-z", f"{seconds}s"] if seconds is not None else ["-n", str(requests)]
    rate = ["-q", f"{qps:g}"] if qps is not None else []
    cmd = ["hey", *amount, *rate, "-c", str(clients), "-m", "POST", "-T", kind, "-D", str(body), "-o", "csv",
           *(arg for h in headers for arg in ("-H", h)), f"http://127.0.0.1:{port}{path}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def read_csv(text: str) -> tuple[list[float], list[int]]:
    """hey's CSV -> (latencies in seconds, status codes)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return [float(r["response-time"]) for r in rows], [int(r["status-code"]) for r in rows]


def summary(latencies: list[float], statuses: list[int], seconds: float, per_request: int) -> dict:
    lat = np.asarray(latencies) * 1e3
    ok = sum(s == 200 for s in statuses)
    # refused: 429s, admission's answer to a request predicted to miss its deadline (docs/DESIGN.md 'Serving')
    status = np.asarray(statuses)
    return {"requests": len(statuses), "non_200": len(statuses) - ok, "refused": sum(s == 429 for s in statuses),
            "images_per_s": round(ok * per_request / seconds, 1),
            "p50_ms": _p(lat, 50), "p99_ms": _p(lat, 99),
            # the answers alone (the latency target is theirs) and the refusals alone (a refusal must be fast)
            "p99_ok_ms": _p(lat[status == 200], 99), "p99_refused_ms": _p(lat[status == 429], 99)}


def _p(lat: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(lat, q)), 2) if len(lat) else None


def run_load(port: int, bodies: list[Path], kind: str, clients_each: int, seconds: float,
             per_request: int, path: str = "/invocations", headers: tuple[str, ...] = ()) -> dict:
    """One hey process per body, all at once, for ``seconds``; pooled latencies."""
    start = time.perf_counter()
    procs = [hey(port, body, kind, clients_each, seconds=seconds, path=path, headers=headers) for body in bodies]
    outs = [p.communicate()[0] for p in procs]
    wall = max(seconds, time.perf_counter() - start - 0.05)
    latencies, statuses = [], []
    for text in outs:
        lat, st = read_csv(text)
        latencies += lat
        statuses += st
    return summary(latencies, statuses, min(wall, seconds * 1.02), per_request)


def run_sequential(port: int, bodies: list[Path], kind: str, per_body: int, path: str = "/invocations",
                   headers: tuple[str, ...] = ()) -> dict:
    """1 client: ``per_body`` requests of each body in turn; pooled latencies."""
    latencies, statuses, spent = [], [], 0.0
    for body in bodies:
        start = time.perf_counter()
        lat, st = read_csv(hey(port, body, kind, 1, requests=per_body, path=path, headers=headers).communicate()[0])
        spent += time.perf_counter() - start
        latencies += lat
        statuses += st
    out = summary(latencies, statuses, sum(latencies) or spent, 1)
    return out


def v2_binary_body(png: bytes) -> bytes:
    """One raw PNG in Triton's binary tensor extension: a JSON header padded to ``V2_HEADER`` bytes (sent
    as ``Inference-Header-Content-Length``), then the BYTES element (4-byte length, the PNG)."""
    import struct

    blob = struct.pack("<I", len(png)) + png
    head = json.dumps({"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(blob)}}]})
    return head.ljust(V2_HEADER).encode() + blob


def v2_body(pngs: list[bytes]) -> str:
    """A KServe v2 JSON request of ``cascade serve --server triton``: base64 PNGs in the BYTES input."""
    import base64

    return json.dumps({"inputs": [{"name": "image", "shape": [len(pngs), 1], "datatype": "BYTES",
                                   "data": [base64.b64encode(b).decode() for b in pngs]}]})


def json_body(pngs: list[bytes]) -> str:
    """A JSON request of ``cascade serve`` (LitServe): ``{"images": [base64 PNG, ...]}``."""
    import base64

    return json.dumps({"images": [base64.b64encode(b).decode() for b in pngs]})


def write_bodies(images: np.ndarray, tmp: Path, server: str = "litserve") -> tuple[list[Path], list[Path], str]:
    """(single-image bodies, 64-image bodies, the singles' content type) for ``server``."""
    from pipeline.registry.payload import encode_png

    singles = []
    for i, image in enumerate(images[:64]):
        path = tmp / f"single{i}.{'png' if server == 'litserve' else 'bin'}"
        path.write_bytes(encode_png(image) if server == "litserve" else v2_binary_body(encode_png(image)))
        singles.append(path)
    batches = []
    for j in range(BATCH_PROCS):
        chunk = images[64 + j * BATCH_IMAGES: 64 + (j + 1) * BATCH_IMAGES]
        path = tmp / f"batch{j}.json"
        pngs = [encode_png(im) for im in chunk]
        path.write_text(json_body(pngs) if server == "litserve" else v2_body(pngs))
        batches.append(path)
    return singles, batches, "image/png" if server == "litserve" else "application/octet-stream"


def in_process(model: str, engine: str, images: np.ndarray, static: bool) -> float:
    from pipeline.serving.engines import load_engine

    eng = load_engine(model, engine, threads=1)
    batch = images[:256]
    eng.recognize(batch, exits=not static)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        eng.recognize(batch, exits=not static)
        runs.append(time.perf_counter() - start)
    return round(len(batch) / min(runs), 1)


def measure(model: str, engine: str, static: bool, singles: list[Path], batches: list[Path],
            seconds: float, log: Path, extra: tuple[str, ...] = (), server: str = "litserve",
            kind: str = "image/png") -> dict:
    out: dict[str, dict] = {}
    path, headers = PATHS[server][1], SINGLE_HEADERS[server]
    with served(model, engine, static, log, extra=extra, server=server) as port:
        run_load(port, singles[:16], kind, 1, 1.0, 1, path, headers)  # warm-up
        out["c1_single"] = run_sequential(port, singles[:16], kind, per_body=60, path=path, headers=headers)
        for clients in SINGLE_LOADS[1:]:
            out[f"c{clients}_single"] = run_load(port, singles[:clients], kind, 1, seconds, 1, path, headers)
        out[f"c{BATCH_CLIENTS}_batch{BATCH_IMAGES}"] = run_load(
            port, batches, "application/json", BATCH_CLIENTS // BATCH_PROCS, seconds, BATCH_IMAGES, path)
    return out


def abuse_under_load(model: str, engine: str, singles: list[Path], seconds: float, log: Path,
                     extra: tuple[str, ...] = (), server: str = "litserve", kind: str = "image/png",
                     good_png: bytes = b"") -> dict:
    from bench.abusive_request import send_all

    path, headers = PATHS[server][1], SINGLE_HEADERS[server]
    with served(model, engine, False, log, extra=extra, server=server) as port:
        quiet = run_load(port, singles, kind, 1, seconds, 1, path, headers)
        procs = [hey(port, body, kind, 1, seconds=seconds, path=path, headers=headers) for body in singles]
        time.sleep(min(1.0, seconds / 4))
        rows = send_all(port, good_png or singles[0].read_bytes(), path)
        latencies, statuses = [], []
        for p in procs:
            lat, st = read_csv(p.communicate()[0])
            latencies += lat
            statuses += st
        loaded = summary(latencies, statuses, seconds, 1)
    return {"good_alone": quiet, "good_during_abuse": loaded, "abusive": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/cascade", help="model directory or models:/ URI")
    p.add_argument("--data", type=Path, default=Path("data/prepared"), help="its test split gives the images")
    p.add_argument("--seconds", type=float, default=8.0, help="load duration per measurement")
    p.add_argument("--engines", nargs="+", choices=("torch", "onnx"), default=["onnx", "torch"])
    p.add_argument("--out", type=Path, default=None, help="default bench/out/serving_<server>.json")
    p.add_argument("--serve-args", default="", help="more `cascade serve` arguments, e.g. '--api-servers 2'")
    p.add_argument("--server", choices=tuple(PATHS), default="litserve",
                   help="cascade serve --server (triton: the onnx engine only)")
    args = p.parse_args(argv)
    if args.server == "triton" and args.engines != ["onnx"]:
        args.engines = ["onnx"]  # Triton's backend runs the ONNX engine only
    args.out = args.out or Path(f"bench/out/serving_{args.server}.json")
    extra = tuple(shlex.split(args.serve_args))
    if shutil.which("hey") is None:
        p.error("hey is not installed (Debian package hey; scripts/setup.sh installs it)")
    from pipeline.registry.model_uri import resolve_model_uri

    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp_name:
        tmp = Path(tmp_name)
        model = str(resolve_model_uri(args.model, tmp / "model"))
        with np.load(args.data / "test.npz", allow_pickle=False) as z:
            images = z["images"][: 64 + BATCH_PROCS * BATCH_IMAGES + 256]
        singles, batches, kind = write_bodies(images, tmp, args.server)
        report: dict = {"model": args.model, "cpus": os.cpu_count(), "seconds": args.seconds,
                        "server": args.server, "serve_args": list(extra), "engines": {}}
        for engine in args.engines:
            row: dict = {"in_process_b256": {}, "served": {}}
            for mode, static in (("exits", False), ("static", True)):
                row["in_process_b256"][mode] = in_process(model, engine, images[-256:], static)
                row["served"][mode] = measure(model, engine, static, singles, batches, args.seconds,
                                              tmp / f"{engine}-{mode}.log", extra, args.server, kind)
                print(json.dumps({engine: {mode: row["served"][mode]}}), flush=True)
            row["gain"] = {load: round(row["served"]["exits"][load]["images_per_s"]
                                       / max(row["served"]["static"][load]["images_per_s"], 1e-9), 2)
                           for load in row["served"]["exits"]}
            report["engines"][engine] = row
        from pipeline.registry.payload import encode_png

        report["abuse"] = abuse_under_load(model, args.engines[0], singles, args.seconds, tmp / "abuse.log",
                                           extra, args.server, kind, encode_png(images[0]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    return 0


def print_report(report: dict) -> None:
    print(f"{'engine':6s} {'mode':7s} {'load':16s} {'images/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'non-200':>8s}")
    for engine, row in report["engines"].items():
        for mode, loads in row["served"].items():
            for load, r in loads.items():
                print(f"{engine:6s} {mode:7s} {load:16s} {r['images_per_s']:9.1f} {r['p50_ms']:8.2f} "
                      f"{r['p99_ms']:8.2f} {r['non_200']:8d}")
        print(f"{engine}: in-process batch 256 {row['in_process_b256']}; early-exit gain at the endpoint "
              f"{row['gain']}")
    abuse = report.get("abuse")
    if abuse is None:
        return
    print(f"good requests alone: p99 {abuse['good_alone']['p99_ms']} ms; during the abuse: p99 "
          f"{abuse['good_during_abuse']['p99_ms']} ms, non-200 {abuse['good_during_abuse']['non_200']}")
    for row in abuse["abusive"]:
        print(f"  {row['status']:4d} in {row['seconds']:6.3f} s  {row['request']}")


if __name__ == "__main__":
    sys.exit(main())
