"""The building blocks of the params schema: how one key is described (:class:`Key` and its
constructors ``Int``, ``Number``, ``Bool``, ``Str``, ``List``, ``Fraction``), what a section is
(:class:`Section`, :class:`Custom`), and how a value or a section is checked against them, each problem
one message naming the key and the value. The tables themselves (which keys each section of
params.yaml has) are :mod:`pipeline.params.schema`."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.params.choices import ConfigError

NO_DEFAULT = object()


class ParamsError(ConfigError):
    """Every problem found in a params file; ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str], source: str = "params") -> None:
        self.problems = tuple(problems)
        if len(problems) == 1:
            message = f"{source}: {problems[0]}"
        else:
            message = f"{source}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        super().__init__(message)


# ------------------------------------------------------------------------------------------ key specs


@dataclass(frozen=True)
class Key:
    """One scalar or list key. ``type``: int | number | bool | str | list."""

    type: str
    required: bool = False
    default: Any = NO_DEFAULT
    nullable: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    pattern: str | None = None
    pattern_doc: str = ""
    items: Key | None = None
    unique: bool = False
    min_items: int = 0
    auto: bool = False  # the string "auto" is valid too (the value is then read from the data)
    doc: str = ""

    def wanted(self, typed: bool = True) -> str:
        """What a valid value is, in words: ``an int >= 1``, ``a number strictly between 0 and 1``
        (``typed=False``, for a value of the right type: ``strictly between 0 and 1``)."""
        if self.type == "list":
            items = self.items
            what = ("a list of values from " + ", ".join(repr(c) for c in items.choices)
                    if items is not None and items.choices is not None
                    else "a list of ints" + _range_words(items) if items is not None and items.type == "int"
                    else "a list of numbers" + _range_words(items) if items is not None and items.type == "number"
                    else f"a list of {items.wanted() if items else 'values'}")
            if self.unique:
                what += ", without repeats"
            if self.min_items:
                what += f", at least {self.min_items}"
        elif self.choices is not None:
            what = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.pattern is not None:
            what = self.pattern_doc or f"a string matching {self.pattern!r}"
        else:
            words = _range_words(self)
            if self.type == "number" and words and not typed:  # "must be strictly between 0 and 1"
                what = words.strip()
            else:
                what = {"int": "an int", "number": "a number", "bool": "true or false",
                        "str": "a non-empty string"}[self.type] + words
        what = f"'auto' or {what}" if self.auto else what
        return f"null or {what}" if self.nullable else what


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _range_words(k: Key) -> str:
    if k.gt is not None and k.lt is not None:
        return f" strictly between {_fmt(k.gt)} and {_fmt(k.lt)}"
    if k.ge is not None and k.le is not None:
        return f" in {_fmt(k.ge)}..{_fmt(k.le)}" if k.type == "int" else f" in [{_fmt(k.ge)}, {_fmt(k.le)}]"
    if k.ge is not None and k.lt is not None:
        return f" in [{_fmt(k.ge)}, {_fmt(k.lt)})"
    if k.gt is not None and k.le is not None:
        return f" in ({_fmt(k.gt)}, {_fmt(k.le)}]"
    words = []
    for op, bound in ((">=", k.ge), (">", k.gt), ("<=", k.le), ("<", k.lt)):
        if bound is not None:
            words.append(f"{op} {_fmt(bound)}")
    return (" " + " and ".join(words)) if words else ""


def Int(**kw: Any) -> Key:  # noqa: N802 - reads as a type in the schema tables
    return Key("int", **kw)


def Number(**kw: Any) -> Key:  # noqa: N802
    return Key("number", **kw)


def Bool(**kw: Any) -> Key:  # noqa: N802
    return Key("bool", **kw)


def Str(**kw: Any) -> Key:  # noqa: N802
    return Key("str", **kw)


def List(items: Key, **kw: Any) -> Key:  # noqa: N802
    return Key("list", items=items, **kw)


def Fraction(**kw: Any) -> Key:  # noqa: N802
    """A number strictly between 0 and 1."""
    return Key("number", gt=0, lt=1, **kw)


Rule = Callable[[Mapping[str, Any]], Iterator[tuple[str, str]]]


@dataclass(frozen=True)
class Section:
    """A mapping of known keys; ``rules`` check across keys and see only keys that passed (plus defaults)."""

    keys: Mapping[str, Key]
    required: bool = True
    rules: tuple[Rule, ...] = ()
    doc: str = ""


@dataclass(frozen=True)
class Custom:
    """A section checked by a function ``(value, key, params) -> problems`` (the ``modules`` section)."""

    check: Callable[..., list[str]]  # (value, key, params, partial=...) -> problems
    required: bool = True
    doc: str = field(default="")


# ------------------------------------------------------------------------------------------- checking


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _type_ok(spec: Key, value: Any) -> bool:
    checks = {"int": _is_int, "number": _is_number, "bool": lambda v: isinstance(v, bool),
              "str": lambda v: isinstance(v, str) and v != "", "list": lambda v: isinstance(v, list)}
    return checks[spec.type](value)


def value_problem(spec: Key, value: Any) -> str | None:
    """Why ``value`` does not fit ``spec`` (``must be ..., got ...``), or None."""
    got = "null" if value is None else repr(value)
    if value is None:
        return None if spec.nullable else f"must be {spec.wanted()}, got null"
    if spec.auto and value == "auto":
        return None
    if not _type_ok(spec, value):
        bad = f"must be {spec.wanted()}, got {got}"
        if isinstance(value, str) and spec.type in ("int", "number") and _looks_numeric(value):
            return bad + " (a string: write the number without quotes)"
        if isinstance(value, bool):
            return bad + " (a bool)"
        if isinstance(value, str) and spec.type in ("int", "number", "bool"):
            return bad + " (a string)"
        return bad
    bad = f"must be {spec.wanted(typed=False)}, got {got}"
    if spec.type == "list":
        if spec.items is not None:
            for i, item in enumerate(value):
                if value_problem(spec.items, item) is not None:
                    return f"{bad} (item {i}: {item!r})"
        if spec.unique and len({repr(v) for v in value}) != len(value):
            return bad + " (repeated items)"
        if len(value) < spec.min_items:
            return bad
        return None
    if spec.choices is not None:
        return None if value in spec.choices and type(value) is type(spec.choices[0]) else bad
    if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
        return bad
    for ok in (spec.ge is None or value >= spec.ge, spec.gt is None or value > spec.gt,
               spec.le is None or value <= spec.le, spec.lt is None or value < spec.lt):
        if not ok:
            return bad
    return None


def _suggest(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, [str(k) for k in known], n=1, cutoff=0.6)
    return close[0] if close else ""


# Training keys a params file of an earlier version may still name: what replaced each, so the error
# says why instead of only "unknown" (docs/DESIGN.md "The recipe's special cases, measured on the whole
# own-data bench"). Refused in the common `train` section and in every module's `train` overrides.
RETIRED_TRAIN_KEYS = {
    "kd_hard": "retired: distillation into module 1 follows `kd` on every kind of data; remove the key",
    "tries_hard": "retired: a module trains once; remove the key",
}


def _retired(name: str, prefix: str) -> str:
    return RETIRED_TRAIN_KEYS.get(name, "") if prefix.split(".")[-1] == "train" else ""


def unknown_keys(sec: Mapping[Any, Any], known: Any, prefix: str) -> list[str]:
    problems = []
    for name in sec:
        if name not in known:
            full = f"{prefix}.{name}" if prefix else str(name)
            match = _suggest(str(name), known)
            hint = _retired(str(name), prefix) or (
                f"did you mean {prefix + '.' if prefix else ''}{match}?" if match
                else f"known: {', '.join(str(k) for k in known)}")
            what = "key" if prefix else "section"
            problems.append(f"{full} is not a known {what} ({hint})")
    return problems


def defaults_of(keys: Mapping[str, Key]) -> dict[str, Any]:
    return {name: spec.default for name, spec in keys.items() if spec.default is not NO_DEFAULT}


def valid_values(sec: Mapping[str, Any], keys: Mapping[str, Key]) -> dict[str, Any]:
    """The section's keys that pass their own check."""
    return {name: value for name, value in sec.items()
            if name in keys and value_problem(keys[name], value) is None}


def check_section(sec: Any, schema: Section, key: str) -> list[str]:
    if not isinstance(sec, Mapping):
        return [f"{key} must be a mapping, got {sec!r}"]
    problems = unknown_keys(sec, schema.keys, key)
    for name, spec in schema.keys.items():
        if name not in sec:
            if spec.required:
                problems.append(f"{key}.{name} is missing ({spec.wanted()})")
            continue
        problem = value_problem(spec, sec[name])
        if problem:
            problems.append(f"{key}.{name} {problem}")
    values = {**defaults_of(schema.keys), **valid_values(sec, schema.keys)}
    for rule in schema.rules:
        problems += [f"{key}.{name} {message}" for name, message in rule(values)]
    return problems
