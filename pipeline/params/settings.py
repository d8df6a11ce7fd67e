"""Typed, frozen views of checked params sections: :func:`settings` (what stages and typed configs
read) and :func:`section_problems`, the schema's check of one section (:mod:`pipeline.params.schema`),
so every key is validated in one place."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import make_dataclass
from typing import Any

from pipeline.params.keys import NO_DEFAULT, Key, ParamsError, Section, check_section, value_problem
from pipeline.params.schema import SCHEMA, TRAIN, _train_rules

# With its cross-key rules: SCHEMA's train section leaves them to each module's merged config.
_SECTIONS = {"train": Section(TRAIN, rules=(_train_rules,))}


def section_problems(values: Any, name: str, label: str | None = None) -> list[str]:
    """Every problem of one section's values (types, ranges, enumerations, unknown keys, cross-key
    rules), named ``<label>.<key>``: the one check behind :func:`settings` and the typed configs
    (``TrainConfig``, ``BaselineConfig``), so each key is validated in one place, this schema."""
    spec = _SECTIONS.get(name) or SCHEMA[name]
    if not isinstance(spec, Section):
        raise ValueError(f"params {name!r} is not a plain section")
    return check_section(values, spec, label or name)


_PYTHON_TYPES: dict[str, Any] = {"int": int, "number": float, "bool": bool, "str": str}


def annotation(key: Key) -> Any:
    """The Python type of a schema key's values: ``int``, ``float | None``, ``list[str]``..."""
    if key.type == "list":
        base: Any = list[annotation(key.items)] if key.items is not None else list
    else:
        base = _PYTHON_TYPES[key.type]
    if key.auto:
        base = base | str
    return base | None if key.nullable or key.default is None else base


@functools.cache
def _settings_type(name: str) -> type:
    """A frozen dataclass with one typed field per key of section ``name``, in schema order."""
    spec = SCHEMA[name]
    if not isinstance(spec, Section):
        raise ValueError(f"settings: params {name!r} is not a plain section")
    return make_dataclass(f"{name.title()}Settings", [(key, annotation(k)) for key, k in spec.keys.items()],
                          frozen=True)


def settings(params: Mapping[str, Any], name: str) -> Any:
    """Section ``name`` of params as a frozen object, checked by the schema (:func:`section_problems`,
    every problem at once as a ParamsError) with every key present (absent keys take the schema's
    defaults): what stages and typed configs read instead of checking values again."""
    given = params.get(name)
    problems = section_problems({} if given is None else given, name)
    if problems:
        raise ParamsError(problems)
    values = {key: list(k.default) if isinstance(k.default, list) else k.default
              for key, k in SCHEMA[name].keys.items() if k.default is not NO_DEFAULT}  # type: ignore[union-attr]
    return _settings_type(name)(**{**values, **(given or {})})


def top_level(params: Mapping[str, Any], name: str) -> Any:
    """A top-level key (``seed``) checked by the schema, its default when absent."""
    key = SCHEMA[name]
    value = params.get(name, key.default)  # type: ignore[union-attr]
    problem = value_problem(key, value)  # type: ignore[arg-type]
    if problem:
        raise ParamsError([f"{name} {problem}"])
    return value


def schema_default(name: str, key: str) -> Any:
    """The schema's default of ``name.key`` (a list as a new list): what a typed config's field defaults to,
    so that each default is written once, in :mod:`pipeline.params.schema`."""
    spec = _SECTIONS.get(name) or SCHEMA[name]
    default = spec.keys[key].default  # type: ignore[union-attr]
    if default is NO_DEFAULT:
        raise ValueError(f"params {name}.{key} has no default (the params file must set it)")
    return list(default) if isinstance(default, list) else default
