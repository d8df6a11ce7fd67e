"""The cluster path's config (deploy/): the KServe InferenceService and the container image start
`cascade serve` with arguments it accepts, on the port and health path it serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from pipeline.cli import build_parser
from pipeline.serving.limits import PREDICT_PATH

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _serve_args(args: list[str]):
    return build_parser().parse_args(["serve", *args])


def test_the_inference_service_runs_cascade_serve_with_valid_arguments() -> None:
    spec = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    assert spec["apiVersion"] == "serving.kserve.io/v1beta1" and spec["kind"] == "InferenceService"
    predictor = spec["spec"]["predictor"]
    assert 1 < predictor["minReplicas"] <= predictor["maxReplicas"]
    (container,) = predictor["containers"]
    args = _serve_args(container["args"])
    assert args.engine == "onnx" and args.host == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [args.port]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": args.port}
    assert predictor["containerConcurrency"] >= args.max_queue  # the server, not the mesh, sheds load


def test_the_image_serves_the_exported_model_it_builds() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))
    assert entry == ["cascade", "serve"]
    args = _serve_args(cmd)
    assert f"--out {args.model}" in text  # the model it serves is the export it makes at build time
    assert f"EXPOSE {args.port}" in text and "/health" in text
    assert PREDICT_PATH == "/invocations" and PREDICT_PATH in text


TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51, the release nvidia-pytriton 0.7.0 bundles


def test_the_triton_image_writes_its_repository_with_cascade_serve_and_starts_tritonserver_on_it() -> None:
    from pipeline.serving.triton import server_flags

    text = (DEPLOY / "triton" / "Dockerfile").read_text()
    build = re.search(r"^RUN (cascade serve .+?)$", text.replace("\\\n", " "), re.M).group(1).split()
    args = _serve_args(build[2:])
    assert args.server == "triton" and args.engine == "onnx" and args.repository
    assert f"COPY --from=repository {args.repository} /models" in text
    assert f"FROM {TRITON_IMAGE}" in text
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    port = int(re.search(r"^EXPOSE (\d+)$", text, re.M).group(1))
    assert entry == ["tritonserver", *server_flags("/models", "0.0.0.0", port)]


def test_the_triton_inference_service_probes_the_images_server() -> None:
    from pipeline.serving.triton import READY_PATH

    spec = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice-triton.yaml").read_text())
    assert spec["apiVersion"] == "serving.kserve.io/v1beta1" and spec["kind"] == "InferenceService"
    predictor = spec["spec"]["predictor"]
    assert 1 < predictor["minReplicas"] <= predictor["maxReplicas"]
    (container,) = predictor["containers"]
    port = int(re.search(r"^EXPOSE (\d+)$", (DEPLOY / "triton" / "Dockerfile").read_text(), re.M).group(1))
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": port}
