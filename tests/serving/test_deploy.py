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
