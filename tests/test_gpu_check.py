"""bench/gpu_check.py on the CPU only, tiny sizes (the GPU half runs where a GPU is)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench import gpu_check
from pipeline.params.config import deep_merge, load_params

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tiny_params(tmp_path: Path) -> Path:
    params = deep_merge(load_params(ROOT / "params.yaml"), load_params(ROOT / "profiles" / "tiny.yaml"))
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def test_cpu_only_smoke(tiny_params: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu_check.json"
    status = gpu_check.main(["--params", str(tiny_params), "--data", str(tmp_path / "none"),
                             "--device-only", "cpu", "--max-images", "32", "--batch-size", "16",
                             "--out", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert result["gpu"] is None and result["data"] == "random" and result["images"] == 32
    assert [r["module"] for r in result["modules"]] == ["m1", "m2", "m3"]
    assert all(r["cpu_images_per_s"] > 0 and "cuda_images_per_s" not in r for r in result["modules"])
    assert '"modules"' in capsys.readouterr().out


def test_bad_flags(tiny_params: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = ["--params", str(tiny_params), "--data", str(tmp_path / "none")]
    assert gpu_check.main([*base, "--device-only", "cuda"]) == 2
    assert "error: --cuda-device is 'cuda' but CUDA is not available" in capsys.readouterr().err
    assert gpu_check.main([*base, "--device-only", "cpu", "--modules", "m9"]) == 2
    assert "error: --modules ['m9'] not in the cascade" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.main([*base, "--epochs", "0"])
