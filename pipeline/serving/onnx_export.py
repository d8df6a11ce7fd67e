"""``cascade export --format onnx``: a saved cascade as ONNX files and a small manifest, for
:class:`pipeline.serving.onnx_engine.OnnxCascade` (or any ONNX runtime) to run with its early exits.

One ONNX graph per module path a stage may run: ``x -> (features, logits)`` with a dynamic batch
dimension (a fixed module or a static choice has one path; a routed supernet has one per candidate).
A routed stage also gets its predictor as ``x -> choice`` (the candidate index per image,
argmax inside the graph, so the cost price of a ``p_right`` predictor travels with it). Thresholds,
normalisation, classes, the confidence kind and the exit ensemble's decay go into ``manifest.json``
with each file's sha256; the directory is written atomically.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.io import atomic_path, file_sha256, write_json
from pipeline.models.modules import Subnet
from pipeline.routing.engine import Stage
from pipeline.routing.package import LoadedCascade, input_shapes, load_cascade
from pipeline.search.space import Arch
from pipeline.serving.onnx_format import FORMAT, FORMAT_VERSION, MANIFEST  # noqa: F401 (re-exported)

OPSET = 17


class _Path(nn.Module):
    """One candidate path of a stage as a plain ``x -> (features, logits)`` module (traceable)."""

    def __init__(self, module: nn.Module, arch: Arch) -> None:
        super().__init__()
        self.module, self.arch = module, arch

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module(x) if isinstance(self.module, Subnet) else self.module(x, self.arch)


class _Choice(nn.Module):
    """A predictor as ``features -> choice`` (int64 candidate per image), as ``Predictor.choose``."""

    def __init__(self, predictor: nn.Module) -> None:
        super().__init__()
        self.predictor = predictor

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.predictor.choose(features)


def _pool_matrix(size: int, out: int) -> torch.Tensor:
    """(out, size) averaging matrix of adaptive average pooling: row i averages [floor(i*size/out),
    ceil((i+1)*size/out)), as torch's kernel does."""
    m = torch.zeros(out, size)
    for i in range(out):
        lo, hi = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


class _MatPool(nn.Module):
    """``AdaptiveAvgPool2d`` as two matrix products where the output size does not divide the input
    (which ONNX's exporter cannot express); spatial sizes are fixed per stage, only the batch varies."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.out = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (oh, ow), h, w = self.out, int(x.shape[-2]), int(x.shape[-1])
        if h % oh == 0 and w % ow == 0:
            return nn.functional.adaptive_avg_pool2d(x, (oh, ow))
        return torch.matmul(torch.matmul(_pool_matrix(h, oh), x), _pool_matrix(w, ow).t())


def _exportable(net: nn.Module) -> nn.Module:
    """A copy of ``net`` with every adaptive average pool made exportable."""
    net = copy.deepcopy(net)
    for name, child in list(net.named_modules()):
        if isinstance(child, nn.AdaptiveAvgPool2d):
            parent = net.get_submodule(name.rsplit(".", 1)[0]) if "." in name else net
            setattr(parent, name.rsplit(".", 1)[-1], _MatPool(child.output_size))
    return net


def _export(net: nn.Module, example: torch.Tensor, path: Path, outputs: list[str]) -> None:
    axes = {name: {0: "batch"} for name in ["input", *outputs]}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(_exportable(net).eval(), (example,), str(path), input_names=["input"], output_names=outputs,
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)


def _stage_entry(k: int, stage: Stage, shape: tuple[int, int, int], out: Path) -> dict[str, Any]:
    example = torch.zeros(2, *shape)  # batch 2: the traced graph must not fold the batch size in
    paths = []
    for r, (arch, macs) in enumerate(zip(stage.candidates, stage.candidate_macs, strict=True)):
        name = f"module{k}_path{r}.onnx"
        _export(_Path(stage.module, arch), example, out / name, ["features", "logits"])
        paths.append({"file": name, "key": arch.key() or "fixed", "macs": int(macs)})
    entry: dict[str, Any] = {"input_shape": list(shape), "threshold": float(stage.threshold),
                             "paths": paths, "predictor": None}
    if stage.predictor is not None:
        name = f"module{k}_predictor.onnx"  # it reads the stage's input, as the engine's predictor does
        _export(_Choice(stage.predictor), example, out / name, ["choice"])
        entry["predictor"] = {"file": name, "macs": int(stage.predictor_macs)}
    return entry


def export_onnx(loaded: LoadedCascade, directory: str | os.PathLike[str]) -> Path:
    """Write ``loaded`` as ONNX files + ``manifest.json`` into ``directory`` (atomically)."""
    specs = [s.module.spec for s in loaded.stages if hasattr(s.module, "spec")]
    if len(specs) != len(loaded.stages):
        raise ValueError("export_onnx needs every module to carry its spec (a cascade from load_cascade)")
    shapes = input_shapes(specs, loaded.meta.image_shape)
    final = Path(directory)
    with atomic_path(final, is_dir=True) as tmp:
        stages = [_stage_entry(k, stage, shape, tmp)
                  for k, (stage, shape) in enumerate(zip(loaded.stages, shapes, strict=True), start=1)]
        meta = {key: value for key, value in loaded.meta.to_dict().items() if key != "info"}
        write_json(tmp / MANIFEST, {
            "format": FORMAT, "version": FORMAT_VERSION, "opset": OPSET, "meta": meta, "stages": stages,
            "sha256": {p.name: file_sha256(p) for p in sorted(tmp.glob("*.onnx"))},
        })
    return final


def export_model_dir(model_dir: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """A cascade model directory (``save_cascade``'s) exported to ONNX at ``directory``."""
    return export_onnx(load_cascade(model_dir), directory)
