"""``cascade serve``: the cascade on LitServe, with adaptive batching and the guard in the served path.

Concurrent requests are gathered into one batch (up to ``max_batch_size`` images' requests, waiting at
most ``batch_timeout`` seconds for more) and the batch runs through the engine's early exits: the batch
shrinks at each exit, so easy images cost less at the endpoint too. A bad request is answered on its own
(4xx with a message) and never fails the requests batched with it. LitServe was chosen over MLServer
and BentoML by measurement (docs/DESIGN.md, "Serving").

Endpoints: ``POST /invocations`` (see :mod:`pipeline.serving.requests` for the request forms; the answer
is ``{"predictions": [{class_index, class_name, confidence, exit, subnets, macs}, ...]}``, one row per
image, as the registered MLflow model answers), ``GET /health`` and ``GET /info`` (LitServe's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import litserve as ls
import numpy as np

from pipeline.serving.limits import PREDICT_PATH, ServeLimits
from pipeline.serving.requests import BadRequest, decode_payload

DEFAULT_PORT = 8000
DEFAULT_MAX_BATCH = 64
DEFAULT_BATCH_TIMEOUT = 0.0005


@dataclass(frozen=True)
class ServeConfig:
    """How to serve: the model, the engine, batching, the limits and where to listen."""

    model_dir: str
    engine: str = "torch"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_batch_size: int = DEFAULT_MAX_BATCH
    batch_timeout: float = DEFAULT_BATCH_TIMEOUT
    threads: int = 1
    api_servers: int = 1  # LitServe's HTTP front processes (decoding and the guard run there)
    exits: bool = True  # False: the static path (every module on every image), for comparison
    limits: ServeLimits = ServeLimits()

    def __post_init__(self) -> None:
        from pipeline.serving.engines import ENGINES

        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_batch_size < 1 or self.threads < 1 or self.api_servers < 1:
            raise ValueError("max_batch_size, threads and api_servers must be >= 1")
        if not 0 < self.batch_timeout <= 1:
            raise ValueError(f"batch_timeout must be in (0, 1] seconds, got {self.batch_timeout}")


class Refused:
    """A request's refusal, carried through the batch to its own answer (picklable)."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message


class CascadeAPI(ls.LitAPI):
    """One engine per worker; requests decoded one by one, batched, answered one by one."""

    def __init__(self, config: ServeConfig) -> None:
        super().__init__(max_batch_size=config.max_batch_size, batch_timeout=config.batch_timeout,
                         api_path=PREDICT_PATH)
        self.config = config

    def setup(self, device: Any) -> None:
        from pipeline.serving.engines import load_engine

        self.engine = load_engine(self.config.model_dir, self.config.engine, threads=self.config.threads)

    def decode_request(self, request) -> np.ndarray | Refused:  # unannotated: LitServe passes the JSON
        try:
            return decode_payload(request, self.engine.image_shape, self.config.limits)
        except BadRequest as exc:
            return Refused(exc.status, str(exc))

    def batch(self, inputs: list[np.ndarray | Refused]) -> list[np.ndarray | Refused]:
        return list(inputs)  # concatenated in predict, where the good ones are known

    def predict(self, inputs: list[np.ndarray | Refused]) -> list[list[dict[str, Any]] | Refused]:
        good = [x for x in inputs if not isinstance(x, Refused)]
        rows = self.engine.recognize(np.concatenate(good), exits=self.config.exits) if good else []
        out, start = [], 0
        for x in inputs:
            if isinstance(x, Refused):
                out.append(x)
            else:
                out.append(rows[start:start + len(x)])
                start += len(x)
        return out

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs

    def encode_response(self, output: list[dict[str, Any]] | Refused) -> Any:
        if isinstance(output, Refused):
            from starlette.responses import Response

            from pipeline.serving.guard import error_body

            return Response(error_body(output.status, output.message), status_code=output.status,
                            media_type="application/json")
        return {"predictions": output}


def build_server(config: ServeConfig) -> Any:
    """A LitServer for ``config`` (not started): the API, the guard middleware, LitServe's timeout."""
    from pipeline.serving.guard import GuardMiddleware

    api = CascadeAPI(config)
    return ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=config.limits.timeout,
                        middlewares=[(GuardMiddleware, {"limits": config.limits})],
                        model_metadata={"engine": config.engine, "model": os.fspath(config.model_dir),
                                        "exits": config.exits})


def serve(config: ServeConfig) -> None:
    """Start serving ``config`` and block until interrupted."""
    server = build_server(config)
    print(f"cascade serve: http://{config.host}:{config.port}{PREDICT_PATH} ({config.engine} engine, "
          f"batches of up to {config.max_batch_size} requests, wait {config.batch_timeout * 1e3:g} ms; "
          f"{'early exits' if config.exits else 'static path: no early exit'})", flush=True)
    server.run(host=config.host, port=config.port, num_api_servers=config.api_servers, generate_client_file=False,
               log_level="warning")
