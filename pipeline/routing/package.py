"""The on-disk format of a deployable cascade (a "model directory"), in one place.

A model directory holds ``cascade.json`` (format version, input format and classes, and per module
its spec, candidates, costs, threshold and predictor config) plus ``module_{k}.pt`` and, where a
module routes per image, ``predictor_{k}.pt`` state dicts (k is 1-based). Modules are rebuilt from
their spec with ``build_module`` and weights are read with ``torch.load(weights_only=True)``, so
loading never runs pickled code. The CLI, the MLflow pyfunc wrapper and the REST server all read
models through :func:`load_cascade` and answer through :mod:`pipeline.routing.recognize`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipeline.io import file_sha256
from pipeline.models.modules import (
    CONFIDENCE_KINDS,
    ModuleSpec,
    build_module,
)
from pipeline.routing.engine import Stage, check_decay
from pipeline.routing.operating_points import OperatingPoint, parse_points
from pipeline.routing.predictor import Predictor
from pipeline.search.space import Arch

if TYPE_CHECKING:  # the serving side loads models without the params code
    pass

FORMAT = "early-exit-cascade"
FORMAT_VERSION = 2  # 2: a checksum over the manifest itself, every file named must carry its sha256
# What a manifest may ask the loader to allocate: checked before any module is built.
MAX_IMAGE_SIDE = 4096
MAX_LAYERS = 64
MAX_CHANNELS = 4096
MAX_HEAD = 4096  # head_grid and head_hidden
# What a whole manifest may make the loader allocate (parameters and buffers of every module and
# predictor together): each key within its own bound can still multiply to tens of GB (docs/DESIGN.md 'Serving').
MAX_MODEL_BYTES = 1 << 30
MANIFEST = "cascade.json"


@dataclass(frozen=True)
class CascadeMeta:
    """What a caller needs besides the weights: input format, normalisation, classes, provenance.

    Normalisation is ``x / 255`` then ``(x - mean) / std`` per channel. ``info`` is free-form and
    JSON-serialisable (metrics, params, lineage); it is shown by ``cascade info`` but never read.
    """

    classes: tuple[str, ...]
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    confidence_kind: str = "maxprob"
    num_classes: int = 0  # 0: take len(classes)
    info: dict[str, Any] = field(default_factory=dict, hash=False)
    ensemble_decay: float = 0.0  # exit ensemble (engine.combine_exits); 0 = each exit answers alone
    # the held-out curve a server answers along (pipeline.routing.operating_points); () = the thresholds only
    operating_points: tuple[OperatingPoint, ...] = field(default=(), hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        object.__setattr__(self, "image_shape", tuple(self.image_shape))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if self.num_classes == 0:
            object.__setattr__(self, "num_classes", len(self.classes))
        points = self.operating_points
        if not all(isinstance(p, OperatingPoint) for p in points):
            points = parse_points([p.to_dict() if isinstance(p, OperatingPoint) else p for p in points])
        object.__setattr__(self, "operating_points", tuple(points))
        _check_meta(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "image_shape": list(self.image_shape),
            "mean": list(self.mean),
            "std": list(self.std),
            "confidence_kind": self.confidence_kind,
            "num_classes": self.num_classes,
            "ensemble_decay": float(self.ensemble_decay),
            "info": self.info,
            # written only when there are points, so a manifest without them reads as it always did
            **({"operating_points": [p.to_dict() for p in self.operating_points]} if self.operating_points else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CascadeMeta:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"CascadeMeta: unknown keys {unknown}")
        return cls(**d)


def _check_meta(meta: CascadeMeta) -> None:
    shape = meta.image_shape
    if len(shape) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape):
        raise ValueError(f"CascadeMeta.image_shape must be (C, H, W) ints >= 1, got {shape!r}")
    if shape[0] not in (1, 3) or max(shape[1:]) > MAX_IMAGE_SIDE:
        raise ValueError(f"CascadeMeta.image_shape must have 1 or 3 channels and sides <= {MAX_IMAGE_SIDE}, "
                         f"got {shape!r}")
    if meta.num_classes != len(meta.classes) or meta.num_classes < 2:
        raise ValueError(
            f"CascadeMeta: num_classes {meta.num_classes} must equal the number of classes "
            f"({len(meta.classes)}) and be >= 2"
        )
    channels = shape[0]
    if len(meta.mean) != channels or len(meta.std) != channels:
        raise ValueError(
            f"CascadeMeta: mean and std need one value per channel ({channels}), "
            f"got {len(meta.mean)} and {len(meta.std)}"
        )
    if not all(math.isfinite(s) and s > 0 for s in meta.std) or not all(math.isfinite(m) for m in meta.mean):
        raise ValueError(f"CascadeMeta: mean must be finite, std finite and > 0; got {meta.mean}, {meta.std}")
    check_decay(meta.ensemble_decay)
    if meta.confidence_kind not in CONFIDENCE_KINDS:
        kind = meta.confidence_kind
        raise ValueError(f"CascadeMeta.confidence_kind must be one of {CONFIDENCE_KINDS}, got {kind!r}")
    if not isinstance(meta.info, dict):
        raise ValueError(f"CascadeMeta.info must be a dict, got {type(meta.info).__name__}")


@dataclass(frozen=True, eq=False)
class LoadedCascade:
    """A cascade read from a model directory, ready for ``run_cascade`` (modules in eval mode)."""

    stages: list[Stage]
    meta: CascadeMeta


def input_shapes(specs: Sequence[ModuleSpec], image_shape: Sequence[int]) -> list[tuple[int, int, int]]:
    """(C, H, W) entering each module, from the image shape and the specs."""
    shapes = [tuple(image_shape)]
    for spec in specs[:-1]:
        shapes.append(spec.output_shape(shapes[-1]))
    return [(int(c), int(h), int(w)) for c, h, w in shapes]


def check_chain(specs: Sequence[ModuleSpec], in_channels: Sequence[int], num_classes: Sequence[int],
                 meta: CascadeMeta) -> None:
    """Each module must take the previous one's channels and answer over the meta's classes; a plain
    CNN (pooled features) can only be the last."""
    expected = meta.image_shape[0]
    for k, (spec, c_in, n) in enumerate(zip(specs, in_channels, num_classes, strict=True), start=1):
        if spec.kind == "plain" and k < len(specs):
            raise ValueError(f"module {k} is a plain CNN: it answers from pooled features, so no module "
                             f"can follow it (it must be the last)")
        if c_in != expected:
            raise ValueError(f"module {k} takes {c_in} input channels, but receives {expected}")
        if n != meta.num_classes:
            raise ValueError(f"module {k} answers over {n} classes, but the meta lists {meta.num_classes}")
        expected = spec.channels
    for point in meta.operating_points:  # each point sets every exit's threshold but the last's
        if len(point.thresholds) != len(specs) - 1:
            raise ValueError(f"operating point {point.name!r} has {len(point.thresholds)} thresholds; "
                             f"the {len(specs)} modules need {len(specs) - 1}")


# ---------------------------------------------------------------------------------------------- load


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own ``checksum`` key (so a hand edit of any
    field, the per-file sha256 table included, is caught before anything is built)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_file_name(name: object, directory: Path) -> str:
    """A weights file named by the manifest: a plain file name inside the model directory."""
    if not isinstance(name, str) or not name or name != Path(name).name or name in (".", ".."):
        raise ValueError(f"weights file name {name!r} must be a plain file name inside {directory}")
    return name


def _check_spec_bounds(spec: ModuleSpec) -> None:
    """Sizes a spec may ask for, before the module is allocated."""
    for key, limit in (("layers", MAX_LAYERS), ("channels", MAX_CHANNELS), ("head_grid", MAX_HEAD),
                       ("head_hidden", MAX_HEAD), ("stride", 8)):
        value = getattr(spec, key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
            raise ValueError(f"spec.{key} must be an int in 0..{limit}, got {value!r}")


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ValueError(f"model directory {directory} does not exist (or is not a directory)")
    if not path.is_file():
        raise ValueError(f"{path} is missing: {directory} is not a cascade model directory")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is unreadable or not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a cascade manifest (format {FORMAT!r} expected)")
    if manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {manifest.get('version')!r}; this code reads version {FORMAT_VERSION}"
        )
    if manifest.get("checksum") != manifest_checksum(manifest):
        raise ValueError(f"{path} does not match its checksum (edited or corrupt): refusing to build from it")
    if not isinstance(manifest.get("modules"), list) or not manifest["modules"]:
        raise ValueError(f"{path} lists no modules")
    return manifest


def _load_state(path: Path, net: nn.Module, sha256: str | None, device: torch.device) -> None:
    """Weights into ``net``; every way a file can be wrong becomes a ValueError naming it."""
    if not path.is_file():
        raise ValueError(f"weights file {path} is missing")
    if sha256 is None:
        raise ValueError(f"weights file {path} has no checksum in {MANIFEST}: refusing to load it")
    if file_sha256(path) != sha256:
        raise ValueError(f"weights file {path} does not match its checksum in {MANIFEST} (corrupt?)")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, pickle.UnpicklingError, EOFError, ...
        raise ValueError(f"weights file {path} cannot be read: {str(exc).splitlines()[0]}") from None
    if not isinstance(state, Mapping):
        raise ValueError(f"weights file {path} does not hold a state dict")
    bad = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
           and not bool(torch.isfinite(v).all())]
    if bad:
        raise ValueError(f"weights file {path} holds non-finite values (NaN or inf) in {', '.join(bad[:5])}")
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())  # torch's message spans lines: missing/unexpected keys
        raise ValueError(f"weights file {path} does not fit its module: {detail[:400]}") from None


def _invalid(path: Path, k: object, exc: Exception) -> ValueError:
    return ValueError(f"{path} is invalid at module {k}: {type(exc).__name__}: {exc}")


def _construct(entry: Mapping[str, Any], meta: CascadeMeta, device: torch.device
               ) -> tuple[nn.Module, tuple[Arch, ...], Predictor | None]:
    """Module, candidates and predictor from one manifest entry, with fresh (unloaded) weights."""
    spec_dict = dict(entry["spec"])
    spec_dict["ops"] = tuple(spec_dict.get("ops", ()))
    module = build_module(ModuleSpec(**spec_dict), int(entry["in_channels"]), meta.num_classes).to(device)
    candidates = tuple(module.space.validate(Arch.from_key(key)) for key in entry["candidates"])
    config = entry.get("predictor")
    predictor = None if config is None else Predictor(**config).to(device)
    return module, candidates, predictor


def _check_total_size(directory: Path, entries: Sequence[Mapping[str, Any]], meta: CascadeMeta) -> None:
    """Refuse a manifest whose modules and predictors together hold more than :data:`MAX_MODEL_BYTES`,
    before anything is allocated: each is built on the ``meta`` device (shapes only, no memory)."""
    total = 0
    for k, entry in enumerate(entries, start=1):
        try:
            with torch.device("meta"):
                nets = [n for n in _construct(entry, meta, torch.device("meta"))[::2] if n is not None]
        except (KeyError, TypeError, ValueError) as exc:
            raise _invalid(directory / MANIFEST, k, exc) from None
        total += sum(t.numel() * t.element_size() for net in nets
                     for t in (*net.parameters(), *net.buffers()))
        if total > MAX_MODEL_BYTES:
            raise ValueError(f"{directory / MANIFEST} asks for {total / 2**30:.1f} GiB of weights by module {k} "
                             f"(each size within its own limit), over the limit of "
                             f"{MAX_MODEL_BYTES / 2**30:g} GiB: refusing to build it")


def _build_stage(directory: Path, k: int, entry: Mapping[str, Any], meta: CascadeMeta,
                 sha: Mapping[str, str], device: torch.device) -> Stage:
    manifest = directory / MANIFEST
    try:
        module, candidates, predictor = _construct(entry, meta, device)
        weights = _check_file_name(entry.get("weights") or f"module_{k}.pt", directory)
        predictor_weights = _check_file_name(entry.get("predictor_weights") or f"predictor_{k}.pt", directory)
    except (KeyError, TypeError, ValueError) as exc:
        raise _invalid(manifest, k, exc) from None
    _load_state(directory / weights, module, sha.get(weights), device)
    module.eval()
    if predictor is not None:
        _load_state(directory / predictor_weights, predictor, sha.get(predictor_weights), device)
        predictor.eval()
    try:
        return Stage(module, candidates, tuple(int(m) for m in entry["candidate_macs"]),
                     float(entry["threshold"]), predictor, int(entry.get("predictor_macs", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise _invalid(manifest, k, exc) from None


def load_cascade(directory: str | os.PathLike[str], device: str | torch.device = "cpu") -> LoadedCascade:
    """Read a model directory written by :func:`save_cascade`; a bad one raises a ValueError naming
    the offending file (never a KeyError or a half-built cascade)."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    device = torch.device(device)
    try:
        meta = CascadeMeta.from_dict(manifest["meta"])
        entries = manifest["modules"]
        specs = [ModuleSpec.from_dict(e["spec"]) for e in entries]
        for spec in specs:
            _check_spec_bounds(spec)
        check_chain(specs, [int(e["in_channels"]) for e in entries], [meta.num_classes] * len(specs), meta)
        sha = dict(manifest.get("sha256") or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{directory / MANIFEST} is invalid: {type(exc).__name__}: {exc}") from None
    _check_total_size(directory, entries, meta)
    stages = [_build_stage(directory, k, e, meta, sha, device) for k, e in enumerate(entries, start=1)]
    return LoadedCascade(stages, meta)
