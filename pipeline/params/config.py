"""Typed configuration per stage. Stages read ``params.yaml`` and build these; the library never
reads the params file itself. Every check raises :class:`ConfigError` naming the key."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from pipeline.params.choices import ConfigError
from pipeline.params.schema import check_params as _check_schema
from pipeline.params.settings import schema_default, settings, top_level


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
    """The up-front check of the whole params file against the schema in :mod:`pipeline.params.schema`:
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


def _build(cls: type, checked: Any, **extra: Any) -> Any:
    """A typed config from a checked settings object (:func:`pipeline.params.settings.settings`): its fields
    that the config declares, plus ``extra``; nothing is checked again."""
    values = {}
    for f in fields(cls):
        if f.name in extra or not hasattr(checked, f.name):
            continue
        value = getattr(checked, f.name)
        if f.type == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # YAML writes 1 for 1.0
        elif str(f.type).startswith("tuple") and isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values, **extra)


@dataclass(frozen=True)
class DataConfig:
    source: str
    image_size: int | str  # "auto": read from the data (pipeline.data.input_shape)
    channels: int | str
    val_fraction: float
    route_fraction: float
    test_fraction: float
    max_train: int | None
    max_test: int | None
    max_pixels: int  # the largest image the decoder opens
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DataConfig:
        return _build(cls, settings(params, "data"), seed=top_level(params, "seed"))


@dataclass(frozen=True)
class ValidateConfig:
    class_share_tolerance: float  # max absolute deviation of a class's share from its share in the source
    pixel_mean_min: float
    pixel_mean_max: float
    min_pixel_std: float  # an image flatter than this is blank or broken
    max_duplicate_share: float  # share of a split's images whose content also appears in another split

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ValidateConfig:
        return _build(cls, settings(params, "validate"))


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
    level_weight: int = schema_default("grade", "level_weight")  # weighted: module k sees level k this often

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> GradeConfig:
        return _build(cls, settings(params, "grade"), seed=top_level(params, "seed"))


@dataclass(frozen=True)
class TrackingConfig:
    experiment: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TrackingConfig:
        return _build(cls, settings(params, "tracking"))


@dataclass(frozen=True)
class ProfileConfig:
    repeats: int
    batch_sizes: tuple[int, ...]
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ProfileConfig:
        return _build(cls, settings(params, "profile"), seed=top_level(params, "seed"))


@dataclass(frozen=True)
class RunConfig:
    """The top-level keys: the run's seed (each stage offsets it for its own draws)."""

    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RunConfig:
        return cls(seed=top_level(params, "seed"))


@dataclass(frozen=True)
class ConfidenceConfig:
    """The ``model`` section: how an exit's confidence is read off its logits (maxprob or margin)."""

    confidence: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ConfidenceConfig:
        return _build(cls, settings(params, "model"))


@dataclass(frozen=True)
class SearchConfig:
    """The ``search`` section (method B's final pick per supernet) and the run's seed."""

    samples: int
    pareto_max: int
    spread: int  # 0, or >= 2 extra subnets spread over the whole cost range
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SearchConfig:
        return _build(cls, settings(params, "search"), seed=top_level(params, "seed"))

    def section(self) -> dict[str, Any]:
        """The section's values (the seed is a top-level key), as logged with the run."""
        return {k: v for k, v in asdict(self).items() if k != "seed"}


@dataclass(frozen=True)
class SelectConfig:
    """The ``select`` section (static choice and routing predictor per supernet) and the run's seed."""

    mode: str
    delta: float
    hidden: int
    epochs: int
    balanced: bool
    fallback_tolerance: float
    max_macs_share: float
    scoring: str
    pool: int
    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SelectConfig:
        return _build(cls, settings(params, "select"), seed=top_level(params, "seed"))

    def section(self) -> dict[str, Any]:
        """The section's values (the seed is a top-level key), as logged with the run."""
        return {k: v for k, v in asdict(self).items() if k != "seed"}


@dataclass(frozen=True)
class CalibrateConfig:
    """The ``calibrate`` section: how exit thresholds are fitted on the held-out images. Fields in the
    schema's order, the order :meth:`section` records them in each cascade's manifest."""

    mode: str  # delta | budget
    delta: float
    budget_macs: float | None
    grid: int
    reference: str
    ensemble_decays: tuple[float, ...]
    bound_z: float
    held_out: str  # pooled (route + calib) | calib
    min_reach: float

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CalibrateConfig:
        return _build(cls, settings(params, "calibrate"))

    def section(self) -> dict[str, Any]:
        """The values as a params section (what a manifest records and MLflow logs)."""
        return {**asdict(self), "ensemble_decays": list(self.ensemble_decays)}


@dataclass(frozen=True)
class ParamsRecord:
    """Sections as the params file wrote them (``dvc.lock``'s shape), for lineage records only: what a
    model's manifest or a registered version says it was made from. Never read for values: the typed
    configs above are (each default lives once, in :mod:`pipeline.params.schema`)."""

    sections: Mapping[str, Any]

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ParamsRecord:
        return cls(copy.deepcopy(dict(params)))

    def of(self, name: str, *, optional: bool = False) -> Any:
        """Section ``name`` as written (a copy). Absent: a KeyError naming it, or ``{}`` if ``optional``."""
        if name not in self.sections and not optional:
            raise KeyError(f"params section {name!r} is missing: the lineage record needs it")
        return copy.deepcopy(self.sections.get(name) or {})
