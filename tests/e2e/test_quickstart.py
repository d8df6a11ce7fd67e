"""The README's own-folder quickstart, executed: a folder of PNGs (one sub-folder per class) through
`python -m pipeline.profiles --data imagefolder:<folder>` (what `make repro PROFILE=... DATA=...`
runs) on a fresh clone, to a model registered under the folder's name that answers `cascade
recognize --model models:/<name>@champion` and a REST call through `mlflow models serve` and the guard
(bench/quickstart.py; the tiny profile here, the quick one in the benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.quickstart import main

pytestmark = pytest.mark.e2e


def test_a_folder_of_images_becomes_a_served_model(tmp_path: Path) -> None:
    out = tmp_path / "quickstart.json"
    assert main(["--per-class", "60", "--profile", "tiny", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["images"] == 600 and result["model_uri"] == "models:/my-images-cascade@champion"
    classes = {"T-shirt-top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot", "T-shirt/top"}
    assert result["recognized"] in classes and result["rest_answer"] == result["recognized"]
    assert 0.3 < result["test_accuracy"] <= 1.0
