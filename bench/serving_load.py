"""Benchmark: the early exit under a load step, with and without a latency target (``cascade serve
--p99-ms``), on loopback, driven by ``hey`` (docs/DESIGN.md 'Serving').

For each mode (``none``: ``cascade serve`` as it is; ``p99``: with ``--p99-ms T``), one LitServe server on
the early exits; a short warm-up, then the load steps back to back (``--steps``, clients:seconds[:qps],
default 16 clients for 20 s, then 128, then 16; with ``:qps`` each client sends at most that many requests
per second (hey -q), so a step offers a set load instead of a closed loop's). Each hey client is its own
hey process with its own body of distinct test images (``--images-per-request K``: 1 = one raw PNG, as
``bench/serving.py`` sends; K > 1 = a JSON body of K base64 PNGs), so the load mixes easy and hard images. Beside it:

- a labelled probe (``--probes`` threads, keep-alive connections) sends requests of the same shape through
  the test split and records each answer's time, the operating point it names, its exits and whether it
  was right: the accuracy of real answers under the load;
- a thread reads ``GET /metrics`` every 0.25 s: the point in use (``cascade_operating_point``) and the
  requests answered per point (``cascade_requests_total``).

Reported per second of the run (hey's per-request CSV bucketed by each request's start): answered
images/s, p50/p99 latency, non-200 answers, the point in use and the requests per point, the probe's
images; per step and over the high-load step (every step offering the most load): the load figures, the
worst per-second p99 after the step's first 2 s (and the seconds over T), the probe's accuracy and its
standard error, each point's share of the probe's images, the held-out accuracy of those points weighted
by those shares (the model's operating points, as ``cascade info --json`` prints them) and the difference;
and the time from each fall of the load to the first scrape back at ``accurate``.

    python -m bench.serving_load --model models/cascade --data data/prepared --p99-ms 50
        [--steps 16:20,128:20,16:20] [--images-per-request 16] [--modes none p99]
        [--out bench/out/serving_load.json] [--plot bench/out/serving_load.png]

The probe adds ``--probes`` clients to hey's (closed loops, or at most ``--probe-qps`` requests a second
each); its images are the test split's, so the difference in mode ``none`` is the test-vs-held-out gap of
``accurate`` alone, the baseline for ``p99``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.serving import hey, json_body, run_load, served
from bench.serving_load_probe import Probe, Scraper
from bench.serving_load_stats import HeyRow, Step, hey_rows, mode_report, parse_steps

MODES = ("none", "p99")
SETTLE_S = 1.5  # after the warm-up: longer than the controller's 1 s window, so it starts afresh


def client_bodies(images: np.ndarray, clients: int, per_request: int, tmp: Path) -> tuple[list[Path], str]:
    """One body per hey client: client i gets images i*K..(i+1)*K-1 (cycling through the split), raw PNG
    for K = 1, else JSON; and the bodies' content type."""
    from pipeline.registry.payload import encode_png

    bodies = []
    for i in range(clients):
        pngs = [encode_png(images[(i * per_request + j) % len(images)]) for j in range(per_request)]
        path = tmp / f"client{i}.{'png' if per_request == 1 else 'json'}"
        if per_request == 1:
            path.write_bytes(pngs[0])
        else:
            path.write_text(json_body(pngs))
        bodies.append(path)
    return bodies, "image/png" if per_request == 1 else "application/json"


def hey_groups(clients: int, per_process: int) -> list[int]:
    """How many clients each hey process of a step runs: ``per_process`` each, the last one the rest."""
    return [min(per_process, clients - start) for start in range(0, clients, per_process)]


def run_steps(port: int, bodies: list[Path], kind: str, steps: list[Step], t0: float, per_process: int = 1
              ) -> tuple[list[HeyRow], list[float]]:
    """The steps back to back: each step's hey processes (``per_process`` clients each, each process its own
    body) for its seconds. Each process's rows are placed on the run's clock by its own start. Returns the
    rows and the steps' starts followed by the run's end."""
    rows, starts = [], []
    for step in steps:
        starts.append(time.monotonic() - t0)
        procs = []
        for body, clients in zip(bodies, hey_groups(step.clients, per_process), strict=False):
            procs.append((time.monotonic() - t0,
                          hey(port, body, kind, clients, seconds=step.seconds, qps=step.qps)))
        for began, proc in procs:
            rows += hey_rows(proc.communicate()[0], began)
    starts.append(time.monotonic() - t0)
    return rows, starts


def run_mode(args: argparse.Namespace, mode: str, test, bodies: list[Path], kind: str, held_out: dict,
             log: Path) -> dict:
    """One server (``mode``) through the warm-up and the steps, with the probe and the metrics reader."""
    extra = tuple(shlex.split(args.serve_args)) + (("--p99-ms", f"{args.p99_ms:g}") if mode == "p99" else ())
    with served(args.model, args.engine, False, log, extra=extra) as port:
        if args.warmup > 0:
            first = hey_groups(args.steps[0].clients, args.clients_per_hey)
            run_load(port, bodies[:len(first)], kind, first[0], args.warmup, args.images_per_request)
            time.sleep(SETTLE_S)
        t0 = time.monotonic()
        spread = len(test.labels) // max(args.probes, 1)
        threads = [Scraper(port, t0)] + [Probe(port, test.images, test.labels, args.images_per_request, t0,
                                               first=i * spread, qps=args.probe_qps) for i in range(args.probes)]
        for thread in threads:
            thread.start()
        try:
            rows, starts = run_steps(port, bodies, kind, args.steps, t0, args.clients_per_hey)
        finally:
            for thread in threads:
                thread.stop.set()
            for thread in threads:
                thread.join(35)
    answers = sorted((a for t in threads[1:] for a in t.answers), key=lambda a: a.t)
    return mode_report(args.steps, starts, rows, threads[0].scrapes, answers, args.images_per_request,
                       {p: v["accuracy"] for p, v in held_out.items()}, args.p99_ms if mode == "p99" else None)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving_load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/cascade", help="model directory or models:/ URI (with its "
                   "operating points: calibrate records them)")
    p.add_argument("--data", type=Path, default=Path("data/prepared"), help="its test.npz gives the images and labels")
    p.add_argument("--p99-ms", type=float, default=50.0, help="the latency target of mode p99 (cascade serve --p99-ms)")
    p.add_argument("--steps", default="16:20,128:20,16:20",
                   help="the load steps, clients:seconds[:qps per client], comma-separated")
    p.add_argument("--images-per-request", type=int, default=1, help="1: a raw PNG; K > 1: JSON of K base64 PNGs")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="none: no target; p99: --p99-ms")
    p.add_argument("--engine", choices=("torch", "onnx"), default="torch", help="cascade serve --engine")
    p.add_argument("--serve-args", default="", help="more `cascade serve` arguments, e.g. '--max-images 512'")
    p.add_argument("--probes", type=int, default=2, help="labelled probe threads (0: no accuracy figures)")
    p.add_argument("--probe-qps", type=float, default=None,
                   help="each probe's rate limit in requests per second (default: a closed loop)")
    p.add_argument("--clients-per-hey", type=int, default=1,
                   help="clients per hey process (each process its own body); 1: a process per client. On a "
                        "2-core host 128 hey processes take CPU from the server (docs/DESIGN.md 'Serving')")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of the first step's load before the run")
    p.add_argument("--out", type=Path, default=Path("bench/out/serving_load.json"))
    p.add_argument("--plot", type=Path, default=None, help="write the per-second plot (PNG) here")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad input named before any server starts (argparse's exit 2)."""
    if shutil.which("hey") is None:
        p.error("hey is not installed (Debian package hey; scripts/setup.sh installs it)")
    try:
        args.steps = parse_steps(args.steps)
    except ValueError as exc:
        p.error(f"--steps: {exc}")
    if not 1 <= args.images_per_request <= 1024:
        p.error(f"--images-per-request must be in 1..1024, got {args.images_per_request}")
    if not (args.p99_ms > 0 and np.isfinite(args.p99_ms)):
        p.error(f"--p99-ms must be a number of milliseconds > 0, got {args.p99_ms}")
    if not 1 <= args.clients_per_hey <= 1024:
        p.error(f"--clients-per-hey must be in 1..1024, got {args.clients_per_hey}")
    if not 0 <= args.probes <= 8 or args.warmup < 0:
        p.error("--probes must be in 0..8 and --warmup >= 0")
    if args.probe_qps is not None and not (math.isfinite(args.probe_qps) and args.probe_qps > 0):
        p.error(f"--probe-qps must be a number > 0, got {args.probe_qps}")
    if not args.model.startswith("models:/") and not Path(args.model).is_dir():
        p.error(f"--model {args.model}: no model directory there")
    if not (args.data / "test.npz").is_file():
        p.error(f"--data {args.data}: no test split there (test.npz); run the ingest stage first")


def model_points(p: argparse.ArgumentParser, model: str) -> dict:
    """The model's operating points (name -> held-out accuracy and mean MACs), as `cascade info` reads them
    (with fewer than two costed points, mode p99's target can only shed: the server says so)."""
    from pipeline.routing.package import load_cascade

    try:
        points = load_cascade(model).meta.operating_points
    except (OSError, ValueError) as exc:
        p.error(f"--model {model}: {exc}")
    return {pt.name: {"accuracy": pt.accuracy, "mean_macs": pt.mean_macs} for pt in points}


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    from pipeline.io import load_split, write_json
    from pipeline.registry.model_uri import resolve_model_uri

    with tempfile.TemporaryDirectory(prefix="bench-serving-load-") as tmp_name:
        tmp = Path(tmp_name)
        source = args.model
        try:
            args.model = str(resolve_model_uri(args.model, tmp / "model"))
        except (ValueError, RuntimeError, OSError) as exc:
            p.error(f"--model {source}: {exc}")
        held_out = model_points(p, args.model)
        try:
            test = load_split(args.data, "test")
        except (OSError, ValueError) as exc:
            p.error(f"--data {args.data}: {exc}")
        bodies, kind = client_bodies(test.images, max(s.clients for s in args.steps), args.images_per_request, tmp)
        report = {"model": source, "data": str(args.data), "cpus": os.cpu_count(), "engine": args.engine,
                  "steps": [[s.clients, s.seconds, s.qps] for s in args.steps],
                  "images_per_request": args.images_per_request,
                  "p99_ms": args.p99_ms, "serve_args": shlex.split(args.serve_args), "probes": args.probes,
                  "held_out": held_out, "modes": {}}
        for mode in args.modes:
            report["modes"][mode] = run_mode(args, mode, test, bodies, kind, held_out, tmp / f"{mode}.log")
            print(f"mode {mode}: done", flush=True)
    write_json(args.out, report)
    if args.plot:
        from bench.serving_load_plot import plot

        plot(report, args.plot)
    from bench.serving_load_plot import print_table

    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
