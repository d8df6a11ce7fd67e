"""``cascade serve`` and ``cascade export``: argument parsing and wiring only (the work is in
:mod:`pipeline.serving.server` and :mod:`pipeline.serving.onnx_export`). Exit status: 0 done,
2 the model or the command line is unusable."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline.serving.limits import ServeLimits

DEFAULT_SERVE_MODEL = "models:/fashion-cascade@champion"


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _add_limits(serve: Any, defaults: ServeLimits) -> None:
    """The request limits of ``serve`` (:class:`pipeline.serving.limits.ServeLimits`'s defaults)."""
    serve.add_argument("--max-bytes", type=_positive(int), default=defaults.max_bytes,
                       help=f"largest request body (default {defaults.max_bytes:,})")
    serve.add_argument("--max-images", type=_positive(int), default=defaults.max_images,
                       help=f"images per request at most (default {defaults.max_images})")
    serve.add_argument("--max-queue", type=_positive(int), default=defaults.max_queue,
                       help=f"requests held at once; more get 503 (default {defaults.max_queue})")
    serve.add_argument("--timeout", type=_positive(float), default=defaults.timeout,
                       help=f"seconds a request may wait for its answer, then 504 "
                            f"(default {defaults.timeout:g})")


def add_commands(sub: Any, default_model: str) -> None:
    """Register ``serve`` and ``export`` on the ``cascade`` command's sub-parsers."""
    serve = sub.add_parser(
        "serve", help="serve the cascade over HTTP (LitServe: adaptive batching, early exits, limits)",
        description="Serve a cascade on POST /invocations (LitServe; --server triton: see there): PNG/JPEG "
                    "bytes (Content-Type image/png or image/jpeg), or JSON {\"image\": base64}, "
                    "{\"images\": [...]} or MLflow's dataframe_split. "
                    "Concurrent requests are batched; each batch runs with the cascade's early exits.")
    serve.add_argument("--model", default=DEFAULT_SERVE_MODEL,
                       help=f"registry URI models:/<name>@<alias> or models:/<name>/<version>, a model "
                            f"directory, or an ONNX export (default {DEFAULT_SERVE_MODEL})")
    serve.add_argument("--engine", choices=("torch", "onnx"), default="onnx",
                       help="run the cascade on PyTorch or ONNX Runtime (default onnx: the same answers, "
                            "a smaller fixed cost per call; docs/RESULTS.md 'Serving')")
    serve.add_argument("--server", choices=("litserve", "triton"), default="litserve",
                       help="serving engine: LitServe (POST /invocations; raw PNG/JPEG or JSON) or Triton "
                            "Inference Server (KServe v2 on /v2/models/cascade/infer; C++ front and batcher, "
                            "2-3x LitServe's images/s at 64 clients here; ONNX engine only; --max-bytes, "
                            "--max-queue and --timeout are not applied there, and malformed JSON gets a 500; "
                            "needs bash scripts/setup_triton.sh; docs/RESULTS.md 'Serving')")
    serve.add_argument("--repository", metavar="DIR",
                       help="with --server triton: write Triton's model repository for this model and these "
                            "settings into DIR (self-contained: config, ONNX export, backend code) and exit "
                            "without serving, for Triton's own container (deploy/triton/Dockerfile)")
    serve.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "0.0.0.0", "::"),
                       help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--max-batch-size", type=_positive(int), default=64,
                       help="requests gathered into one batch at most (default 64)")
    serve.add_argument("--batch-timeout-ms", type=_positive(float), default=0.5,
                       help="how long a batch waits for more requests, in ms (default 0.5)")
    serve.add_argument("--api-servers", type=_positive(int), default=1,
                       help="HTTP front processes that guard requests before the batch (default 1)")
    serve.add_argument("--decode-in-front", action="store_true",
                       help="decode the images in the HTTP front processes, the inference process only unpacking "
                            "uint8 pixels (default: the inference process decodes: faster on 2 shared cores, "
                            "docs/DESIGN.md 'Serving')")
    serve.add_argument("--p99-ms", type=_positive(float), metavar="MS",
                       help="a p99 latency target in ms: requests without a budget are answered at the "
                            "operating point a controller moves along from the measured queue wait and batch "
                            "time (cheaper points as latency nears the target, back to the accuracy-first one "
                            "as load falls), and a request predicted to miss it even at the cheapest point is "
                            "refused at once (429; a request's own X-Deadline-Ms or JSON deadline_ms wins); "
                            "with --server triton: the batcher's queue timeout only; docs/DESIGN.md 'Serving'")
    serve.add_argument("--static", action="store_true",
                       help="no early exit: every module on every image (to measure what the exits save)")
    _add_limits(serve, ServeLimits())
    serve.set_defaults(func=_cmd_serve)

    export = sub.add_parser("export", help="export a cascade (ONNX: modules, heads, thresholds, manifest)")
    export.add_argument("--model", default=default_model,
                        help=f"model directory or models:/ URI (default {default_model})")
    export.add_argument("--format", choices=("onnx",), default="onnx", help="export format (onnx)")
    export.add_argument("--out", required=True, help="directory to write (replaced atomically)")
    export.set_defaults(func=_cmd_export)


def _resolve(model: str, scratch: str) -> Path | None:
    from pipeline.registry.model_uri import RegistryUnavailable, resolve_model_uri

    try:
        return resolve_model_uri(model, scratch)
    except RegistryUnavailable:
        print("error: registry support not available", file=sys.stderr)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except Exception as exc:  # whatever the registry backend raises (unknown model, no server, ...)
        print(f"error: cannot fetch model {model}: {exc}", file=sys.stderr)
    return None


def _ready_model(directory: Path, engine: str, scratch: str) -> tuple[Path, tuple[Any, ...]] | str:
    """The directory ``engine`` serves (for onnx, exported into ``scratch`` unless it is an export) and the
    model's operating points, or why it cannot: the model is loaded once here, so a bad one fails with a
    message before any server process starts."""
    from pipeline.serving.engines import is_onnx_dir, load_engine
    from pipeline.serving.onnx_export import export_model_dir

    if not directory.is_dir():
        return f"model directory {directory} does not exist"
    try:
        if engine == "onnx" and not is_onnx_dir(directory):
            directory = export_model_dir(directory, Path(scratch) / "onnx")
        loaded = load_engine(directory, engine)
    except (ValueError, OSError) as exc:
        return f"cannot load model {directory}: {exc}"
    return directory, tuple(loaded.points)


def _cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.serving.server import ServeConfig, serve

    if args.repository and args.server != "triton":
        print("error: --repository writes Triton's model repository: add --server triton", file=sys.stderr)
        return 2
    if args.p99_ms is not None and args.static:
        print("error: --p99-ms needs the early exits (not --static)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cascade-serve-") as scratch:
        directory = _resolve(args.model, scratch)
        if directory is None:
            return 2
        ready = _ready_model(directory, args.engine, scratch)
        if isinstance(ready, str):
            print(f"error: {ready}", file=sys.stderr)
            return 2
        ready, points = ready
        limits = ServeLimits(max_bytes=args.max_bytes, max_images=args.max_images, max_queue=args.max_queue,
                             timeout=args.timeout)
        try:
            config = ServeConfig(str(ready), args.engine, args.host, args.port, args.max_batch_size,
                                 args.batch_timeout_ms / 1e3, api_servers=args.api_servers, exits=not args.static,
                                 decode_in_front=args.decode_in_front,
                                 limits=limits, p99_ms=args.p99_ms)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.server == "triton":  # the same checked config, served by Triton
            return _serve_triton(config, Path(scratch), args.repository)
        previous = signal.signal(signal.SIGTERM, _stop)  # a TERM unwinds, so the download is removed
        try:
            serve(config, points)  # serving, SIGTERM and Ctrl-C stop it cleanly (pipeline.serving.stopping)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _serve_triton(config: Any, scratch: Path, repository: str | None = None) -> int:
    from pipeline.serving.triton import TritonMissing, repository_for, run_triton

    if config.engine != "onnx":
        print("error: --server triton runs the ONNX engine only (drop --engine torch)", file=sys.stderr)
        return 2
    wait_us = round(config.batch_timeout * 1e6)
    if repository:
        out = repository_for(Path(config.model_dir), Path(repository), config.max_batch_size, wait_us,
                             config.limits, config.exits, config.p99_ms)
        print(f"cascade serve: wrote Triton's model repository {out} (serve it with tritonserver "
              f"--model-repository {out}; deploy/triton/Dockerfile)")
        return 0
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        status = run_triton(Path(config.model_dir), scratch, config.host, config.port, config.max_batch_size,
                            wait_us, config.limits, exits=config.exits, p99_ms=config.p99_ms)
    except TritonMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if status in (0, -signal.SIGTERM, -signal.SIGINT) else 1


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _cmd_export(args: argparse.Namespace) -> int:
    from pipeline.serving.onnx_export import export_model_dir

    with tempfile.TemporaryDirectory(prefix="cascade-export-") as scratch:
        directory = _resolve(args.model, scratch)
        if directory is None:
            return 2
        try:
            out = export_model_dir(directory, args.out)
        except (ValueError, OSError) as exc:
            print(f"error: cannot export {args.model}: {exc}", file=sys.stderr)
            return 2
    files = sorted(p.name for p in out.iterdir())
    print(f"exported {args.model} to {out} ({len(files)} files: {', '.join(files)})")
    return 0
