"""``cascade serve --server triton``: the ONNX cascade on Triton Inference Server.

Triton's C++ HTTP front parses requests and its dynamic batcher gathers them into one batch before any
Python runs, so a single-image request costs no Python process hop of its own (LitServe moves each
request through a queue to its worker; docs/DESIGN.md "Serving" has the measurements). The model is
:mod:`pipeline.serving.triton_backend` in Triton's Python backend.

The server is the ``tritonserver`` binary of the ``nvidia-pytriton`` wheel, unpacked by
``scripts/setup_triton.sh`` into ``.venv/triton/server`` (not installed as a package: the wheel pins
NumPy < 2, which the project's environment is not), and the backend runs in ``.venv/triton/env``
(NumPy < 2, ONNX Runtime, Pillow), the environment the wheel's Python stub is built for.
``CASCADE_TRITON_HOME`` points elsewhere.

The model repository is self-contained (:func:`write_repository`: the ONNX export and the backend's
torch-free code beside ``config.pbtxt``), so the same folder serves here and in Triton's own container
(``cascade serve --server triton --repository DIR`` writes it; ``deploy/triton/Dockerfile``).

Protocol: KServe v2 (``POST /v2/models/cascade/infer``; readiness ``GET /v2/health/ready``): input
``image``, BYTES, shape ``[n, 1]``, PNG/JPEG bytes (binary tensor extension) or their base64 text in
JSON; outputs ``class_index``, ``class_name``, ``confidence``, ``exit``, ``macs``, ``[n, 1]`` each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.io import atomic_path
from pipeline.serving.limits import ServeLimits

MODEL_NAME = "cascade"
INFER_PATH = f"/v2/models/{MODEL_NAME}/infer"
READY_PATH = "/v2/health/ready"
SETUP = "bash scripts/setup_triton.sh"
ONNX_DIR = "onnx"  # the export, in the model's folder of the repository
CODE_DIR = "code"  # the project's package for the backend, beside it (Triton ignores non-numeric folders)


class TritonMissing(RuntimeError):
    """Triton's server or its backend environment is not installed."""


def triton_home() -> Path:
    """Where ``scripts/setup_triton.sh`` put the server and the backend environment."""
    return Path(os.environ.get("CASCADE_TRITON_HOME") or Path(sys.prefix) / "triton")


def installed(home: Path) -> tuple[Path, Path]:
    """(tritonserver binary, backend environment's bin directory), or :class:`TritonMissing` saying how
    to install them."""
    binary, env_bin = home / "server" / "bin" / "tritonserver", home / "env" / "bin"
    for path in (binary, env_bin / "python", home / "server" / "backends" / "python" / "triton_python_backend_stub"):
        if not os.access(path, os.X_OK):
            raise TritonMissing(f"Triton Inference Server is not installed ({path} is missing): run {SETUP}")
    return binary, env_bin


def queue_policy(p99_ms: float | None) -> str:
    """The batcher's ``default_queue_policy`` for a p99 target: a request still queued after ``p99_ms`` is
    rejected (Triton answers it with an error at once rather than late), and a request may set its own
    timeout (KServe v2 parameter ``timeout``, microseconds). '' without a target."""
    if p99_ms is None:
        return ""
    return (" default_queue_policy { timeout_action: REJECT default_timeout_microseconds: "
            f"{max(1, round(p99_ms * 1e3))} allow_timeout_override: true }}")


def model_config(max_batch_size: int, queue_delay_us: int, limits: ServeLimits, exits: bool,
                 threads: int = 1, p99_ms: float | None = None) -> str:
    """The model's ``config.pbtxt``: the batcher (size cap, wait) and the backend's settings (the export
    is ``ONNX_DIR`` of the model's folder: :func:`write_repository` puts it there).

    No ``default_queue_policy`` unless a p99 target is given (:func:`queue_policy`): in Triton 2.51 any
    queue policy (a size bound, a timeout, or both) took the batcher to about 300 requests/s with a p99
    of 530 ms at 64 clients, against about 3,000 and 40 ms without (docs/RESULTS.md "Serving"), so
    ``limits.max_queue`` and ``limits.timeout`` are not applied here: a flood waits in Triton's queue
    instead of getting a 503. A target asks for the timeout at that measured cost."""
    settings = {"onnx_dir": ONNX_DIR, "exits": "1" if exits else "0", "threads": str(threads),
                "max_images": str(limits.max_images), "max_pixels": str(limits.max_pixels),
                "max_request_pixels": str(limits.max_request_pixels)}
    params = "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in settings.items())
    outputs = [("class_index", "TYPE_INT64"), ("class_name", "TYPE_STRING"), ("confidence", "TYPE_FP32"),
               ("exit", "TYPE_INT64"), ("macs", "TYPE_INT64")]
    return f"""name: "{MODEL_NAME}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "image", data_type: TYPE_STRING, dims: [ 1 ] }} ]
output [ {", ".join(f'{{ name: "{n}", data_type: {t}, dims: [ 1 ] }}' for n, t in outputs)} ]
dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us}{queue_policy(p99_ms)} }}
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
{params}
"""


MODEL_PY = """import sys
from pathlib import Path

# Triton's stub does not pass PYTHONPATH on: the backend's code is in the model's folder
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / {code!r}))
from pipeline.serving.triton_backend import TritonPythonModel  # noqa: E402,F401
"""


def write_repository(out: Path, config_text: str, onnx_dir: Path) -> Path:
    """A self-contained Triton model repository in ``out`` (replaced atomically): ``cascade/config.pbtxt``,
    ``cascade/onnx`` (a copy of the export ``onnx_dir``), ``cascade/code/pipeline`` (this package; the
    backend imports only its torch-free modules) and ``cascade/1/model.py``, which puts ``cascade/code``
    on ``sys.path`` and takes :class:`pipeline.serving.triton_backend.TritonPythonModel` from it."""
    package = Path(__file__).resolve().parents[1]
    with atomic_path(out, is_dir=True) as tmp:
        model = tmp / MODEL_NAME
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(config_text)
        shutil.copytree(onnx_dir, model / ONNX_DIR)
        shutil.copytree(package, model / CODE_DIR / package.name, ignore=shutil.ignore_patterns("__pycache__"))
        (model / "1" / "model.py").write_text(MODEL_PY.format(code=CODE_DIR))
    return out


def server_flags(repository: Path | str, host: str, port: int) -> list[str]:
    """``tritonserver``'s flags for the repository's one model: HTTP only on ``host:port``, no gRPC or
    metrics, ready only when the model is (the container's ENTRYPOINT uses the same)."""
    return ["--model-repository", str(repository), "--http-address", host, "--http-port", str(port),
            "--allow-grpc", "false", "--allow-metrics", "false", "--log-verbose", "0", "--log-info", "false",
            "--exit-on-error", "true", "--strict-readiness", "true", "--exit-timeout-secs", "5"]


def command(binary: Path, home: Path, repository: Path, host: str, port: int) -> list[str]:
    """The ``tritonserver`` command line of this install (its backends folder) for :func:`server_flags`."""
    return [str(binary), "--backend-directory", str(home / "server" / "backends"),
            *server_flags(repository, host, port)]


def environment(home: Path, env_bin: Path) -> dict[str, str]:
    """The server's environment: its bundled libraries and the backend environment's Python first on
    ``PATH`` (Triton's stub takes its interpreter from there)."""
    env = dict(os.environ)
    libs = str(home / "server" / "libs")
    env["LD_LIBRARY_PATH"] = f"{libs}{os.pathsep}{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else libs
    env["PATH"] = f"{env_bin}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def batch_cap(max_batch_size: int, limits: ServeLimits) -> int:
    """Triton's batch cap counts images and refuses a request above it: at least ``limits.max_images``."""
    return max(max_batch_size, limits.max_images)


def repository_for(onnx_dir: Path, out: Path, max_batch_size: int, queue_delay_us: int, limits: ServeLimits,
                   exits: bool, p99_ms: float | None = None) -> Path:
    """:func:`write_repository` with the model config of these serve settings (what ``cascade serve
    --server triton`` serves, and what ``--repository`` writes for a container)."""
    config = model_config(batch_cap(max_batch_size, limits), queue_delay_us, limits, exits, p99_ms=p99_ms)
    return write_repository(out, config, onnx_dir)


def run_triton(onnx_dir: Path, scratch: Path, host: str, port: int, max_batch_size: int, queue_delay_us: int,
               limits: ServeLimits, exits: bool, p99_ms: float | None = None) -> int:
    """Serve until interrupted; returns the server's exit status."""
    home = triton_home()
    binary, env_bin = installed(home)
    cap = batch_cap(max_batch_size, limits)
    repository = repository_for(onnx_dir, scratch / "triton-repository", max_batch_size, queue_delay_us, limits,
                                exits, p99_ms)
    print(f"cascade serve: http://{host}:{port}{INFER_PATH} (Triton Inference Server, ONNX Runtime engine, "
          f"batches of up to {cap} images, wait {queue_delay_us / 1e3:g} ms; "
          f"{'early exits' if exits else 'static path: no early exit'}"
          f"{f'; queue timeout {p99_ms:g} ms (the p99 target: rejected past it)' if p99_ms else ''}; "
          f"ready at {READY_PATH})", flush=True)
    process = subprocess.Popen(command(binary, home, repository, host, port), env=environment(home, env_bin))
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
