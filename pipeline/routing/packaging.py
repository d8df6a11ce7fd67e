"""Writing a model directory (:mod:`pipeline.routing.package` holds the format and the reading side):
the manifest entries, the state dicts, and the packaging of a calibrated cascade or of a plain CNN that
a run ships instead."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipeline.io import atomic_path, file_sha256, write_json
from pipeline.models.modules import FixedModule, PlainCNN, SupernetModule
from pipeline.routing.engine import Stage
from pipeline.routing.operating_points import OperatingPoint
from pipeline.routing.package import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    CascadeMeta,
    check_chain,
    input_shapes,
    manifest_checksum,
)
from pipeline.routing.predictor import Predictor

if TYPE_CHECKING:  # the serving side loads models without the params code
    from pipeline.params.config import CalibrateConfig, ParamsRecord


def _predictor_config(predictor: Predictor | None) -> dict[str, Any] | None:
    if predictor is None:
        return None
    config: dict[str, Any] = {
        "in_channels": predictor.in_channels,
        "num_candidates": predictor.num_candidates,
        "hidden": predictor.hidden,
        "pool": predictor.pool_size,
    }
    if predictor.scoring != "label":  # a label predictor's manifest stays as it always was
        config.update(scoring=predictor.scoring, offsets=[float(o) for o in predictor.offsets.tolist()])
    return config


def _module_entry(k: int, stage: Stage, shape: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "index": k,
        "spec": dataclasses.asdict(stage.module.spec),
        "in_channels": stage.module.in_channels,
        "input_shape": list(shape),
        "candidates": [arch.key() for arch in stage.candidates],
        "candidate_macs": [int(m) for m in stage.candidate_macs],
        "threshold": float(stage.threshold),
        "predictor": _predictor_config(stage.predictor),
        "predictor_macs": int(stage.predictor_macs),
        "weights": f"module_{k}.pt",
        "predictor_weights": None if stage.predictor is None else f"predictor_{k}.pt",
    }


def _state_dict(net: nn.Module) -> dict[str, torch.Tensor]:
    """Plain CPU tensors, so the files load on any machine with ``weights_only=True``."""
    return {name: t.detach().cpu().clone() for name, t in net.state_dict().items()}


def save_cascade(directory: str | os.PathLike[str], stages: Sequence[Stage], meta: CascadeMeta) -> Path:
    """Write a model directory atomically: a reader sees the old directory or the whole new one.

    Modules must be ``FixedModule``, ``SupernetModule`` or, last, a ``PlainCNN`` (rebuilt from their
    spec on load); an exported ``Subnet`` has no spec to rebuild from.
    """
    if not stages:
        raise ValueError("save_cascade needs at least one stage")
    for k, stage in enumerate(stages, start=1):
        if not isinstance(stage.module, FixedModule | SupernetModule | PlainCNN):
            kind = type(stage.module).__name__
            raise ValueError(f"save_cascade: module {k} is a {kind}; only Fixed/SupernetModule/PlainCNN "
                             f"can be saved")
    specs = [s.module.spec for s in stages]
    check_chain(specs, [s.module.in_channels for s in stages], [s.module.num_classes for s in stages], meta)
    shapes = input_shapes(specs, meta.image_shape)
    entries = [_module_entry(k, s, shape) for k, (s, shape) in enumerate(zip(stages, shapes, strict=True), 1)]
    final = Path(directory)
    with atomic_path(final, is_dir=True) as tmp:
        for entry, stage in zip(entries, stages, strict=True):
            torch.save(_state_dict(stage.module), tmp / entry["weights"])
            if stage.predictor is not None:
                torch.save(_state_dict(stage.predictor), tmp / entry["predictor_weights"])
        files = {p.name: file_sha256(p) for p in sorted(tmp.glob("*.pt"))}
        manifest = {"format": FORMAT, "version": FORMAT_VERSION, "meta": meta.to_dict(),
                    "modules": entries, "sha256": files}
        write_json(tmp / MANIFEST, {**manifest, "checksum": manifest_checksum(manifest)})
    return final


def with_thresholds(stages: list[Stage], thresholds: list[float]) -> list[Stage]:
    """Copies of ``stages`` with ``thresholds`` set in order; a stage past the list's end gets inf."""
    out = []
    for k, stage in enumerate(stages):
        t = thresholds[k] if k < len(thresholds) else float("inf")
        out.append(Stage(stage.module, stage.candidates, stage.candidate_macs, t, stage.predictor,
                         stage.predictor_macs))
    return out


def packaged(stages: list[Stage], cmeta: CascadeMeta, res: dict, routing: str, fit_cfg: CalibrateConfig,
             lineage: ParamsRecord, points: Sequence[OperatingPoint] = ()) -> tuple[list[Stage], CascadeMeta]:
    """The stages with their fitted thresholds and the manifest (exit ensemble, lineage: the fit's
    settings, and the modules and train sections as the params file wrote them; the operating points
    fitted on the same held-out images) of one routing."""
    info = {"routing": routing, "calibrate": {k: v for k, v in res.items() if k != "sweep"},
            "params": {"calibrate": fit_cfg.section(), "modules": lineage.of("modules"),
                       "train": lineage.of("train")}}
    meta = CascadeMeta(cmeta.classes, cmeta.image_shape, cmeta.mean, cmeta.std, cmeta.confidence_kind,
                       info=info, ensemble_decay=res["ensemble_decay"], operating_points=tuple(points))
    return with_thresholds(stages, res["thresholds"]), meta


def plain_packaged(module: PlainCNN, macs: int, cmeta: CascadeMeta, info: dict[str, Any]
                   ) -> tuple[list[Stage], CascadeMeta]:
    """A plain CNN as a one-module cascade (what a run ships when its held-out data prefers it):
    one stage, one path, no threshold; ``cmeta`` must carry the plain CNN's own normalisation."""
    stage = Stage(module, (module.default_arch(),), (int(macs),), float("inf"))
    meta = CascadeMeta(cmeta.classes, cmeta.image_shape, cmeta.mean, cmeta.std, cmeta.confidence_kind, info=info)
    return [stage], meta
