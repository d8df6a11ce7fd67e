"""``pipeline.params.keys``, on hand-made keys (``pipeline.params.schema`` tests the real tables):
``ParamsError``'s message for one and for several problems, ``Key.wanted`` (a valid value in words,
every kind of range), ``value_problem`` (types that look alike: bools are not ints, quoted numbers,
NaN; bounds at their edges; choices, patterns, list items, repeats and lengths), ``unknown_keys`` (a
suggestion or the known names), ``defaults_of``, ``valid_values`` and ``check_section`` (missing keys,
a non-mapping, rules that see defaults and only the values that passed)."""

from __future__ import annotations

import math

import pytest

from pipeline.params.choices import ConfigError
from pipeline.params.keys import (
    NO_DEFAULT,
    Bool,
    Custom,
    Fraction,
    Int,
    Key,
    List,
    Number,
    ParamsError,
    Section,
    Str,
    check_section,
    defaults_of,
    unknown_keys,
    valid_values,
    value_problem,
)


def test_params_error_with_one_problem_is_one_line() -> None:
    err = ParamsError(["train.lr must be a number, got 'x'"], source="params.yaml")
    assert isinstance(err, ConfigError) and err.problems == ("train.lr must be a number, got 'x'",)
    assert str(err) == "params.yaml: train.lr must be a number, got 'x'"


def test_params_error_lists_several_problems() -> None:
    err = ParamsError(["a is missing", "b must be an int, got 1.5"])
    assert str(err) == "params: 2 problems:\n  - a is missing\n  - b must be an int, got 1.5"
    assert err.problems == ("a is missing", "b must be an int, got 1.5")


def test_constructors_set_the_type_and_keep_options() -> None:
    assert Int(ge=1).type == "int" and Number().type == "number" and Bool().type == "bool"
    assert Str(required=True).required and List(Int()).items == Int()
    assert Fraction() == Key("number", gt=0, lt=1)
    assert Key("int").default is NO_DEFAULT


@pytest.mark.parametrize(("key", "words"), [
    (Int(), "an int"),
    (Int(ge=1), "an int >= 1"),
    (Int(ge=0, le=10), "an int in 0..10"),
    (Number(ge=0, le=1), "a number in [0, 1]"),
    (Number(ge=0, lt=1), "a number in [0, 1)"),
    (Number(gt=0, le=2.5), "a number in (0, 2.5]"),
    (Fraction(), "a number strictly between 0 and 1"),
    (Number(gt=0), "a number > 0"),
    (Number(lt=5, le=4), "a number <= 4 and < 5"),
    (Bool(), "true or false"),
    (Str(), "a non-empty string"),
    (Str(nullable=True), "null or a non-empty string"),
    (Str(choices=("sgd", "adam")), "one of 'sgd', 'adam'"),
    (Str(pattern=r"m\d+"), "a string matching 'm\\\\d+'"),
    (Str(pattern=r"m\d+", pattern_doc="a module name such as m1"), "a module name such as m1"),
    (List(Int(ge=1)), "a list of ints >= 1"),
    (List(Int()), "a list of ints"),
    (List(Str(choices=("a", "b")), unique=True, min_items=2),
     "a list of values from 'a', 'b', without repeats, at least 2"),
    (List(Number(gt=0)), "a list of numbers > 0"),
    (Key("list"), "a list of values"),
])
def test_wanted_says_what_a_valid_value_is(key: Key, words: str) -> None:
    assert key.wanted() == words


def test_wanted_untyped_drops_the_type_of_a_ranged_number_only() -> None:
    assert Fraction().wanted(typed=False) == "strictly between 0 and 1"
    assert Number().wanted(typed=False) == "a number"  # no range: nothing to drop
    assert Int(ge=1).wanted(typed=False) == "an int >= 1"


@pytest.mark.parametrize(("key", "value", "problem"), [
    (Int(), True, "must be an int, got True (a bool)"),
    (Int(), 1.0, "must be an int, got 1.0"),
    (Int(), "3", "must be an int, got '3' (a string: write the number without quotes)"),
    (Number(), "1e-3", "must be a number, got '1e-3' (a string: write the number without quotes)"),
    (Number(), "fast", "must be a number, got 'fast' (a string)"),
    (Bool(), "yes", "must be true or false, got 'yes' (a string)"),
    (Bool(), 1, "must be true or false, got 1"),
    (Number(), math.nan, "must be a number, got nan"),
    (Number(), math.inf, "must be a number, got inf"),
    (Str(), "", "must be a non-empty string, got ''"),
    (Int(), None, "must be an int, got null"),
    (Fraction(), 1, "must be strictly between 0 and 1, got 1"),
    (Fraction(), 0.0, "must be strictly between 0 and 1, got 0.0"),
    (Int(ge=1), 0, "must be an int >= 1, got 0"),
    (Int(le=3), 4, "must be an int <= 3, got 4"),
    (Number(lt=2), 2, "must be < 2, got 2"),  # a number of the right type: its range alone
    (Str(choices=("sgd", "adam")), "Adam", "must be one of 'sgd', 'adam', got 'Adam'"),
    (Int(choices=(1, 2)), True, "must be one of 1, 2, got True (a bool)"),
    (Number(choices=(1.0, 2.0)), 1, "must be one of 1.0, 2.0, got 1"),  # an int is not the float choice
    (Str(pattern=r"m\d+"), "m1x", "must be a string matching 'm\\\\d+', got 'm1x'"),
    (List(Int(ge=1)), [1, 0, 2], "must be a list of ints >= 1, got [1, 0, 2] (item 1: 0)"),
    (List(Int(), unique=True), [1, 2, 1],
     "must be a list of ints, without repeats, got [1, 2, 1] (repeated items)"),
    (List(Int(), min_items=2), [1], "must be a list of ints, at least 2, got [1]"),
    (List(Int()), (1, 2), "must be a list of ints, got (1, 2)"),
])
def test_value_problem_names_what_was_wanted_and_what_came(key: Key, value: object, problem: str) -> None:
    assert value_problem(key, value) == problem


@pytest.mark.parametrize(("key", "value"), [
    (Int(ge=1), 1), (Int(le=3), 3), (Number(ge=0, le=1), 0), (Number(ge=0, le=1), 1.0),
    (Number(), 3), (Fraction(), 0.5), (Int(nullable=True), None), (Str(choices=("sgd", "adam")), "adam"),
    (Str(pattern=r"m\d+"), "m12"), (List(Int(ge=1), unique=True, min_items=2), [1, 2]), (Bool(), False),
    (List(Str()), []),
])
def test_value_problem_accepts_values_at_and_inside_the_bounds(key: Key, value: object) -> None:
    assert value_problem(key, value) is None


def test_unknown_keys_suggest_a_close_name_or_list_the_known_ones() -> None:
    known = {"lr": Number(), "epochs": Int(), "batch_size": Int()}
    assert unknown_keys({"epochs": 1, "epocs": 2}, known, "train") == [
        "train.epocs is not a known key (did you mean train.epochs?)"]
    assert unknown_keys({"zzz": 1}, known, "train") == [
        "train.zzz is not a known key (known: lr, epochs, batch_size)"]
    assert unknown_keys({"trian": {}}, ["train", "data"], "") == [
        "trian is not a known section (did you mean train?)"]
    assert unknown_keys({"lr": 0.1}, known, "train") == []


def test_defaults_and_valid_values() -> None:
    keys = {"a": Int(default=3), "b": Number(default=None, nullable=True), "c": Str()}
    assert defaults_of(keys) == {"a": 3, "b": None}  # None is a default; NO_DEFAULT is not
    assert valid_values({"a": "3", "b": 0.5, "c": "x", "d": 1}, keys) == {"b": 0.5, "c": "x"}


def test_check_section_names_each_problem_with_the_section() -> None:
    schema = Section({"lr": Number(gt=0, required=True), "epochs": Int(ge=1, required=True), "seed": Int()})
    assert check_section({"lr": 0.1, "epochs": 2}, schema, "train") == []
    assert check_section({"lr": 0, "seed": "1", "momentum": 0.9}, schema, "train") == [
        "train.momentum is not a known key (known: lr, epochs, seed)",
        "train.lr must be > 0, got 0",
        "train.epochs is missing (an int >= 1)",
        "train.seed must be an int, got '1' (a string: write the number without quotes)",
    ]
    assert check_section([1, 2], schema, "train") == ["train must be a mapping, got [1, 2]"]
    assert check_section(None, schema, "train") == ["train must be a mapping, got None"]


def test_rules_see_defaults_and_only_the_values_that_passed() -> None:
    seen: list[dict] = []

    def rule(values):  # noqa: ANN001, ANN202
        seen.append(dict(values))
        if values["low"] >= values["high"]:
            yield "low", f"must be below high ({values['high']}), got {values['low']}"

    schema = Section({"low": Int(default=0), "high": Int(default=10)}, rules=(rule,))
    assert check_section({"low": 20}, schema, "range") == ["range.low must be below high (10), got 20"]
    assert seen[-1] == {"low": 20, "high": 10}
    assert check_section({"low": 5, "high": "x"}, schema, "range") == [
        "range.high must be an int, got 'x' (a string)"]  # the rule saw the default, not 'x'
    assert seen[-1] == {"low": 5, "high": 10}


def test_custom_and_section_defaults() -> None:
    assert Section({}).required and Section({}).rules == ()
    custom = Custom(lambda value, key, params, partial=False: [f"{key} is odd"])
    assert custom.required and custom.check(1, "modules", {}) == ["modules is odd"]
