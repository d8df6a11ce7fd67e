"""Profile's workflow (``stages.profile`` parses, calls :func:`cascade_for` and :func:`profile_model`,
writes, logs and prints): the cascade the params describe at the data's input, each module's MACs over its
search space and its measured latency (docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.io import read_json
from pipeline.models.cascade import CascadeSpec
from pipeline.models.config import STRIDE_ABOVE, ModelConfig
from pipeline.models.profile import CostModel, profile_cascade
from pipeline.params.config import ProfileConfig


def cascade_for(model: ModelConfig, data: Path) -> tuple[CascadeSpec, str | None]:
    """The cascade's spec at the input of ingest's ``data`` and, where module 1 enters at a stride the
    params do not set (inputs over ``STRIDE_ABOVE`` px), the line that says so."""
    meta = read_json(data / "meta.json")
    channels, size = meta["image_shape"][0], meta["image_shape"][1]
    spec = model.cascade_spec(channels, len(meta["classes"]), size)
    first = spec.modules[0]
    if first.stride == model.specs[0].stride:
        return spec, None
    return spec, (f"profile: {channels}x{size}x{size} input is over {STRIDE_ABOVE} px: module 1 enters at stride "
                  f"{first.stride} (feature maps {first.channels}x{(size + 1) // 2}x{(size + 1) // 2}) with "
                  f"{first.layers} layers before its exit")


def profile_model(spec: CascadeSpec, cfg: ProfileConfig, device: torch.device, progress: Any = None
                  ) -> dict[str, Any]:
    """The profile table: every module's MACs per path and latency per batch size on ``device``."""
    return profile_cascade(spec, seed=cfg.seed, repeats=cfg.repeats, batch_sizes=cfg.batch_sizes,
                           progress=progress, device=device)


def module_lines(table: dict[str, Any]) -> list[tuple[dict[str, float], str]]:
    """Per module: the metrics the run logs and the line the stage prints (MACs range, default path)."""
    costs, out = CostModel(table), []
    for k in range(1, costs.n_modules + 1):
        arch = costs.default_arch(k)
        metrics = {f"m{k}_min_macs": costs.min_macs(k), f"m{k}_max_macs": costs.max_macs(k),
                   f"m{k}_default_macs": costs.macs(k, arch), f"m{k}_default_ms_b1": costs.latency_ms(k, arch, 1)}
        line = (f"profile m{k}: MACs {costs.min_macs(k):,}..{costs.max_macs(k):,} (default {costs.macs(k, arch):,}),"
                f" default path {costs.latency_ms(k, arch, 1):.3f} ms at batch 1")
        out.append((metrics, line))
    return out
