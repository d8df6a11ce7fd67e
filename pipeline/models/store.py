"""Trained modules on disk: ``module.pt`` (state dict) and ``module.json`` (spec, shapes,
normalisation), one directory per module, and the frozen prefix rebuilt from them."""

from __future__ import annotations

import dataclasses
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.io import read_json, write_json
from pipeline.models.modules import ModuleSpec, build_module


@dataclass(frozen=True)
class ModuleInfo:
    k: int
    spec: ModuleSpec
    in_channels: int
    num_classes: int
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["spec"]["ops"] = list(self.spec.ops)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModuleInfo:
        spec = dict(d["spec"])
        spec["ops"] = tuple(spec.get("ops", ()))
        return cls(int(d["k"]), ModuleSpec(**spec), int(d["in_channels"]), int(d["num_classes"]),
                   tuple(d["input_shape"]), tuple(d["mean"]), tuple(d["std"]))


def save_module(directory: Path, module: nn.Module, info: ModuleInfo) -> None:
    """Into an existing (temporary) directory; the caller renames the directory into place."""
    torch.save(module.state_dict(), directory / "module.pt")
    write_json(directory / "module.json", info.to_json())


def load_module(directory: str | os.PathLike[str]) -> tuple[nn.Module, ModuleInfo]:
    directory = Path(directory)
    try:
        info = ModuleInfo.from_json(read_json(directory / "module.json"))
        module = build_module(info.spec, info.in_channels, info.num_classes)
        module.load_state_dict(torch.load(directory / "module.pt", weights_only=True))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"trained module missing in {directory}: {exc.filename}") from None
    except (RuntimeError, KeyError, ValueError, EOFError, OSError, pickle.UnpicklingError) as exc:
        # an empty, truncated or foreign module.pt (FileNotFoundError is handled above)
        raise ValueError(f"trained module in {directory} is unreadable: {exc}") from None
    return module.eval(), info
