"""Typed configuration per stage. Stages read ``params.yaml`` and build these; the library never
reads the params file itself. Every check raises :class:`ConfigError` naming the key."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.params.choices import ConfigError
from pipeline.params.schema import check_params as _check_schema
from pipeline.params.settings import schema_config, top_level


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


# Each config's fields are its schema section's keys (pipeline.params.schema) and its ``from_params`` reads
# that section, checked: both generated (pipeline.params.settings.schema_config), nothing written here twice.


@schema_config("data", seeded=True)
class DataConfig:
    """The ``data`` section: the source, the input size (``auto``: read from the data,
    pipeline.data.input_shape), the splits' fractions and caps, and the run's seed."""


@schema_config("validate")
class ValidateConfig:
    """The ``validate`` section: the data expectations' bounds (class shares, pixel statistics, duplicates)."""


@schema_config("grade", seeded=True)
class GradeConfig:
    """The ``grade`` section: how difficulty is scored and split into levels and the curriculum."""


@schema_config("tracking")
class TrackingConfig:
    """The ``tracking`` section: the MLflow experiment."""


@schema_config("profile", seeded=True)
class ProfileConfig:
    """The ``profile`` section: how each module's latency is timed."""


@dataclass(frozen=True)
class RunConfig:
    """The top-level keys: the run's seed (each stage offsets it for its own draws)."""

    seed: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RunConfig:
        return cls(seed=top_level(params, "seed"))


@schema_config("model")
class ConfidenceConfig:
    """The ``model`` section: how an exit's confidence is read off its logits (maxprob or margin)."""


@schema_config("search", seeded=True)
class SearchConfig:
    """The ``search`` section (method B's final pick per supernet) and the run's seed; ``section()`` is
    what the run logs (the seed is a top-level key)."""


@schema_config("select", seeded=True)
class SelectConfig:
    """The ``select`` section (static choice and routing predictor per supernet) and the run's seed."""


@schema_config("calibrate")
class CalibrateConfig:
    """The ``calibrate`` section: how exit thresholds are fitted on the held-out images; ``section()``,
    in the schema's order, is what each cascade's manifest records."""


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
