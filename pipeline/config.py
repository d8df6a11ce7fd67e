"""Typed configuration per stage. Stages read ``params.yaml`` and build these; the library never
reads the params file itself. Every check raises :class:`ConfigError` naming the key."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.choices import CURRICULA, DEVICE_PATTERN, PRECISIONS, SCORERS, ConfigError
from pipeline.params_schema import check_params as _check_schema


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (plain YAML keeps the last one
    silently; DVC refuses the file)."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_params(path: str | os.PathLike[str] = "params.yaml") -> dict[str, Any]:
    """The params file as a mapping; a missing file, invalid YAML or a repeated key is a ConfigError."""
    path = Path(path)
    try:
        params = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except FileNotFoundError:
        raise ConfigError(f"params file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"params file {path} is not valid YAML: {exc}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"params file {path} must hold a mapping at the top level")
    return params


def check_params(params: Any, *, partial: bool = False, source: str = "params") -> None:
    """The up-front check of the whole params file against the schema in :mod:`pipeline.params_schema`:
    raises :class:`ConfigError` listing every problem (dotted key and bad value), not only the first."""
    _check_schema(params, partial=partial, source=source)


def load_checked_params(path: str | os.PathLike[str] = "params.yaml", *,
                        partial: bool = False) -> dict[str, Any]:
    """:func:`load_params`, then :func:`check_params` on the whole file (what every stage does first)."""
    params = load_params(path)
    check_params(params, partial=partial, source=str(path))
    return params


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """A new mapping: ``override`` laid over ``base`` key by key (used for the tiny profile)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            merged[key] = deep_merge(base[key], value)
        else:
            merged[key] = value
    return merged


def section(params: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = params.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(f"params: section {key!r} is missing or not a mapping")
    return value


def _get(sec: Mapping[str, Any], name: str, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in sec:
        if default is ...:
            raise ConfigError(f"params: {key}.{name} is missing")
        return default
    value = sec[name]
    if value is None and default is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"params: {key}.{name} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"params: {key} {message}")


@dataclass(frozen=True)
class DataConfig:
    source: str
    image_size: int
    channels: int
    val_fraction: float
    route_fraction: float
    test_fraction: float
    max_train: int | None
    max_test: int | None
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DataConfig:
        s = section(params, "data")
        cfg = cls(
            source=_get(s, "source", "data", str),
            image_size=_get(s, "image_size", "data", int),
            channels=_get(s, "channels", "data", int, 1),
            val_fraction=_get(s, "val_fraction", "data", float),
            route_fraction=_get(s, "route_fraction", "data", float, 0.5),
            test_fraction=_get(s, "test_fraction", "data", float, 0.2),
            max_train=_get(s, "max_train", "data", int, None),
            max_test=_get(s, "max_test", "data", int, None),
            seed=_get(params, "seed", "(top level)", int, 0),
        )
        _check(4 <= cfg.image_size <= 512, "data.image_size", f"must be in 4..512, got {cfg.image_size}")
        _check(cfg.channels in (1, 3), "data.channels", f"must be 1 or 3, got {cfg.channels}")
        for name in ("val_fraction", "route_fraction", "test_fraction"):
            value = getattr(cfg, name)
            _check(0.0 < value < 1.0, f"data.{name}", f"must be strictly between 0 and 1, got {value}")
        for name in ("max_train", "max_test"):
            value = getattr(cfg, name)
            _check(value is None or value >= 20, f"data.{name}", f"must be null or at least 20, got {value}")
        return cfg


@dataclass(frozen=True)
class ValidateConfig:
    class_share_tolerance: float  # max absolute deviation of a class's share from its share in the source
    pixel_mean_min: float
    pixel_mean_max: float
    min_pixel_std: float  # an image flatter than this is blank or broken
    max_duplicate_share: float  # share of a split's images whose content also appears in another split

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ValidateConfig:
        s = section(params, "validate")
        cfg = cls(
            class_share_tolerance=_get(s, "class_share_tolerance", "validate", float),
            pixel_mean_min=_get(s, "pixel_mean_min", "validate", float, 0.0),
            pixel_mean_max=_get(s, "pixel_mean_max", "validate", float, 255.0),
            min_pixel_std=_get(s, "min_pixel_std", "validate", float, 0.0),
            max_duplicate_share=_get(s, "max_duplicate_share", "validate", float, 0.0),
        )
        _check(0.0 <= cfg.class_share_tolerance <= 1.0, "validate.class_share_tolerance", "must be in [0, 1]")
        _check(0.0 <= cfg.pixel_mean_min <= cfg.pixel_mean_max <= 255.0, "validate.pixel_mean_min/max",
               "must satisfy 0 <= min <= max <= 255")
        _check(0.0 <= cfg.max_duplicate_share <= 1.0, "validate.max_duplicate_share", "must be in [0, 1]")
        return cfg


@dataclass(frozen=True)
class GradeConfig:
    scorer: str
    pca_components: int
    folds: int
    levels: int
    curriculum: str
    max_iter: int
    knn_neighbors: int
    seed: int
    level_weight: int = 2  # weighted curriculum: how often module k sees level k per epoch (others once)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GradeConfig:
        s = section(params, "grade")
        cfg = cls(
            scorer=_get(s, "scorer", "grade", str, "pca-logreg"),
            pca_components=_get(s, "pca_components", "grade", int, 50),
            folds=_get(s, "folds", "grade", int, 5),
            levels=_get(s, "levels", "grade", int),
            curriculum=_get(s, "curriculum", "grade", str, "cumulative"),
            max_iter=_get(s, "max_iter", "grade", int, 200),
            knn_neighbors=_get(s, "knn_neighbors", "grade", int, 10),
            seed=_get(params, "seed", "(top level)", int, 0),
            level_weight=_get(s, "level_weight", "grade", int, 2),
        )
        _check(1 <= cfg.level_weight <= 10, "grade.level_weight", f"must be in 1..10, got {cfg.level_weight}")
        _check(cfg.scorer in SCORERS, "grade.scorer", f"must be one of {SCORERS}, got {cfg.scorer!r}")
        _check(cfg.curriculum in CURRICULA, "grade.curriculum", f"must be one of {CURRICULA}, got {cfg.curriculum!r}")
        _check(2 <= cfg.folds <= 20, "grade.folds", f"must be in 2..20, got {cfg.folds}")
        _check(1 <= cfg.levels <= 20, "grade.levels", f"must be in 1..20, got {cfg.levels}")
        _check(cfg.pca_components >= 1, "grade.pca_components", f"must be at least 1, got {cfg.pca_components}")
        _check(cfg.max_iter >= 1, "grade.max_iter", "must be at least 1")
        _check(cfg.knn_neighbors >= 1, "grade.knn_neighbors", "must be at least 1")
        return cfg


@dataclass(frozen=True)
class TrackingConfig:
    experiment: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TrackingConfig:
        s = params.get("tracking") or {}
        return cls(experiment=_get(s, "experiment", "tracking", str, "cascade"))


@dataclass(frozen=True)
class ModelConfig:
    """The cascade's modules ``m1..mK`` (their ``spec``) and how confidence is read off an exit."""

    names: tuple[str, ...]
    specs: tuple[Any, ...]  # ModuleSpec, one per module, in order
    confidence: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ModelConfig:
        from pipeline.models.modules import ModuleSpec

        mods = section(params, "modules")
        names = tuple(mods)
        expected = tuple(f"m{k}" for k in range(1, len(names) + 1))
        _check(names == expected, "modules", f"must be named m1..mK in order, got {list(names)}")
        specs = []
        for name in names:
            raw = mods[name]
            _check(isinstance(raw, Mapping) and isinstance(raw.get("spec"), Mapping), f"modules.{name}.spec",
                   "is missing or not a mapping")
            try:
                specs.append(ModuleSpec.from_dict(raw["spec"]))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"params: modules.{name}.spec: {exc}") from None
        confidence = _get(params.get("model") or {}, "confidence", "model", str, "maxprob")
        _check(confidence in ("maxprob", "margin"), "model.confidence", f"must be maxprob or margin, got {confidence!r}")
        return cls(names, tuple(specs), confidence)

    def cascade_spec(self, in_channels: int, num_classes: int, image_size: int) -> Any:
        from pipeline.models.cascade import CascadeSpec

        return CascadeSpec(in_channels, num_classes, image_size, self.specs)


@dataclass(frozen=True)
class ProfileConfig:
    repeats: int
    batch_sizes: tuple[int, ...]
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ProfileConfig:
        s = params.get("profile") or {}
        cfg = cls(repeats=_get(s, "repeats", "profile", int, 20),
                  batch_sizes=tuple(_get(s, "batch_sizes", "profile", list, [1, 64])),
                  seed=_get(params, "seed", "(top level)", int, 0))
        _check(cfg.repeats >= 1, "profile.repeats", "must be at least 1")
        _check(all(isinstance(b, int) and b >= 1 for b in cfg.batch_sizes) and 1 in cfg.batch_sizes,
               "profile.batch_sizes", f"must be positive ints including 1, got {list(cfg.batch_sizes)}")
        return cfg


@dataclass(frozen=True)
class ComputeConfig:
    """Where torch runs (``compute``; optional: defaults ``auto`` and ``fp32``, so older params files
    still work). ``device``: auto (cuda if available, else cpu) | cpu | cuda | cuda:N, resolved to a
    ``torch.device`` by :func:`pipeline.device.resolve_device` at run time (here only the spelling is
    checked: no torch import). ``precision``: fp32 | bf16 (bf16 autocast, CUDA only)."""

    device: str = "auto"
    precision: str = "fp32"

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ComputeConfig:
        s = params.get("compute") or {}
        _check(isinstance(s, Mapping), "compute", f"must be a mapping, got {s!r}")
        return cls.of(_get(s, "device", "compute", str, "auto"), _get(s, "precision", "compute", str, "fp32"))

    @classmethod
    def of(cls, device: str, precision: str = "fp32") -> ComputeConfig:
        """A checked config from the two strings (also what ``--device`` flags build)."""
        _check(isinstance(device, str) and re.fullmatch(DEVICE_PATTERN, device) is not None, "compute.device",
               f"must be auto, cpu, cuda or cuda:N (N an int >= 0), got {device!r}")
        _check(precision in PRECISIONS, "compute.precision",
               f"must be one of {PRECISIONS}, got {precision!r}")
        _check(not (precision == "bf16" and device == "cpu"), "compute.precision",
               "bf16 needs a CUDA device (compute.device is cpu); use fp32 on the CPU")
        return cls(device, precision)

    def resolve(self) -> Any:
        """The ``torch.device`` to run on (:func:`pipeline.device.resolve_device`); bf16 on a device
        that resolves to the CPU (``auto`` without CUDA) is a :class:`ConfigError` naming
        ``compute.precision``."""
        from pipeline.device import resolve_device  # here, not at the top: it imports torch

        device = resolve_device(self.device)
        _check(not (self.precision == "bf16" and device.type != "cuda"), "compute.precision",
               f"bf16 needs a CUDA device, but compute.device {self.device!r} resolved to {device}; use fp32")
        return device
