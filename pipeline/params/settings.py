"""Typed, frozen views of checked params sections: :func:`settings` (what stages and typed configs
read) and :func:`section_problems`, the schema's check of one section (:mod:`pipeline.params.schema`),
so every key is validated in one place."""

from __future__ import annotations

import dataclasses
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
    return check_section(values, _spec(name), label or name)


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
    default = _spec(name).keys[key].default
    if default is NO_DEFAULT:
        raise ValueError(f"params {name}.{key} has no default (the params file must set it)")
    return list(default) if isinstance(default, list) else default


def _spec(name: str) -> Section:
    spec = _SECTIONS.get(name) or SCHEMA[name]
    if not isinstance(spec, Section):
        raise ValueError(f"params {name!r} is not a plain section")
    return spec


def _normalised(key: Key, value: Any) -> Any:
    """A checked value as a typed config stores it: a float for a number (YAML writes 1 for 1.0), a tuple
    for a list (frozen configs hash)."""
    if key.type == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if key.type == "list" and isinstance(value, list):
        return tuple(value)
    return value


def schema_config(name: str, *, seeded: bool = False, checked: bool = False) -> Any:
    """Class decorator: the typed config of params section ``name``, its fields generated from the
    schema (one per key, in schema order, typed by :func:`annotation`, defaulting to the schema's
    default; a key without one is required), so that a section's field list is written once, in
    :mod:`pipeline.params.schema`. ``seeded``: one more field, the run's top-level ``seed`` (required).
    The class keeps its methods and docstring and becomes a frozen, keyword-only dataclass; numbers are
    stored as floats and lists as tuples. ``checked``: each instance is checked by the schema
    (:func:`section_problems`), for configs built from keyword arguments rather than from a checked
    section; a bad value raises ``ParamsError``. Added unless the class defines them: ``from_params``
    (the checked section of a params mapping, absent keys at their defaults, and the seed) and
    ``section()`` (the section's values back as params: lists, no seed)."""
    spec = _spec(name)

    def field_of(key: str, kind: Any, default: Any) -> tuple[str, Any, Any]:
        if default is NO_DEFAULT:
            return key, kind, dataclasses.field()
        if isinstance(default, list):
            return key, kind, dataclasses.field(default=tuple(default))
        return key, kind, dataclasses.field(default=default)

    rows = [field_of(key, annotation(k), k.default) for key, k in spec.keys.items()]
    if seeded:
        rows.append(field_of("seed", int, NO_DEFAULT))

    def post_init(self: Any) -> None:
        for key, k in spec.keys.items():
            object.__setattr__(self, key, _normalised(k, getattr(self, key)))
        if checked:
            problems = section_problems(self.section(), name, type(self).__name__)
            if problems:
                raise ParamsError(problems)

    def as_section(self: Any) -> dict[str, Any]:
        return {key: list(v) if isinstance(v := getattr(self, key), tuple) else v for key in spec.keys}

    def from_params(cls: Any, params: Mapping[str, Any]) -> Any:
        seed = {"seed": top_level(params, "seed")} if seeded else {}
        return cls(**vars(settings(params, name)), **seed)

    def decorate(cls: type) -> type:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                     "__post_init__": post_init, "section": as_section}
        if "from_params" not in cls.__dict__:
            namespace["from_params"] = classmethod(from_params)
        return dataclasses.make_dataclass(cls.__name__, rows, bases=(cls,), namespace=namespace, frozen=True,
                                          kw_only=True)

    return decorate
