"""Tests of pipeline.search.space: ``Decision`` and ``SearchSpace`` checks, ``Arch`` lookup and its string
key, and a space's ``make`` / ``validate`` / ``index`` / ``from_index`` / ``enumerate`` / ``size``."""

from __future__ import annotations

import pytest

from pipeline.search.space import Arch, Decision, SearchSpace


def space() -> SearchSpace:
    return SearchSpace((Decision("op@l1", ("conv3", "dw5", "skip")), Decision("op@l2", ("conv3", "skip"))))


# --- Decision and SearchSpace checks --------------------------------------------------------------------


def test_a_decision_needs_choices() -> None:
    with pytest.raises(ValueError, match="decision 'op' has no choices"):
        Decision("op", ())


def test_a_decision_refuses_repeated_choices() -> None:
    with pytest.raises(ValueError, match="decision 'op' has repeated choices"):
        Decision("op", ("conv3", "skip", "conv3"))


def test_a_space_refuses_repeated_labels() -> None:
    with pytest.raises(ValueError, match="repeated decision labels"):
        SearchSpace((Decision("a", ("x",)), Decision("a", ("y",))))


def test_labels_and_size() -> None:
    assert space().labels == ("op@l1", "op@l2")
    assert space().size() == 6
    assert SearchSpace().size() == 1  # no decisions: one (empty) architecture


# --- Arch ------------------------------------------------------------------------------------------------


def test_arch_lookup_and_dict() -> None:
    arch = Arch((("op@l1", "dw5"), ("op@l2", "skip")))
    assert arch["op@l2"] == "skip"
    assert arch.as_dict() == {"op@l1": "dw5", "op@l2": "skip"}
    with pytest.raises(KeyError, match="op@l3"):
        arch["op@l3"]


def test_arch_key_and_back() -> None:
    arch = Arch((("op@l1", "dw5"), ("op@l2", "skip")))
    assert arch.key() == "op@l1=dw5|op@l2=skip"
    assert Arch.from_key(arch.key()) == arch
    later_first = Arch((("op@l2", "skip"), ("op@l1", "dw5")))
    assert later_first.key() == "op@l2=skip|op@l1=dw5"  # pairs as held, not sorted
    assert Arch.from_key(later_first.key()) == later_first
    assert Arch().key() == ""
    assert Arch.from_key("") == Arch()
    assert Arch.from_key("a=b=c") == Arch((("a", "b=c"),))  # only the first '=' splits


def test_archs_are_hashable_values() -> None:
    a = Arch((("op@l1", "dw5"),))
    assert a == Arch((("op@l1", "dw5"),)) and len({a, Arch((("op@l1", "dw5"),))}) == 1
    assert a != Arch((("op@l1", "skip"),))


# --- make, validate, index ---------------------------------------------------------------------------------


def test_make_orders_the_choices_as_the_decisions() -> None:
    arch = space().make({"op@l2": "skip", "op@l1": "dw5"})
    assert arch.items == (("op@l1", "dw5"), ("op@l2", "skip"))


@pytest.mark.parametrize("choices,message", [
    ({"op@l1": "dw5"}, r"missing \['op@l2'\], unknown \[\]"),
    ({"op@l1": "dw5", "op@l2": "skip", "op@l9": "skip"}, r"missing \[\], unknown \['op@l9'\]"),
    ({"op@l1": "dw5", "op@l2": "dw5"}, r"op@l2='dw5' is not one of \('conv3', 'skip'\)"),
])
def test_make_refuses_an_architecture_that_does_not_fit(choices: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        space().make(choices)


def test_validate_reorders_a_good_arch_and_refuses_a_bad_one() -> None:
    assert space().validate(Arch((("op@l2", "conv3"), ("op@l1", "skip")))) == space().make(
        {"op@l1": "skip", "op@l2": "conv3"})
    with pytest.raises(ValueError, match="is not one of"):
        space().validate(Arch((("op@l1", "conv5"), ("op@l2", "conv3"))))


def test_index_and_from_index_are_inverse() -> None:
    s = space()
    arch = s.make({"op@l1": "skip", "op@l2": "conv3"})
    assert s.index(arch) == (2, 0)
    assert s.from_index((2, 0)) == arch
    for a in s.enumerate():
        assert s.from_index(s.index(a)) == a


def test_from_index_needs_one_index_per_decision() -> None:
    with pytest.raises(ValueError):
        space().from_index((0,))
    with pytest.raises(IndexError):
        space().from_index((0, 2))


# --- enumerate ---------------------------------------------------------------------------------------------


def test_enumerate_gives_every_architecture_once_in_index_order() -> None:
    s = space()
    archs = list(s.enumerate())
    assert len(archs) == len(set(archs)) == s.size()
    assert [s.index(a) for a in archs] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(s.validate(a) == a for a in archs)


def test_an_empty_space_has_one_empty_architecture() -> None:
    assert list(SearchSpace().enumerate()) == [Arch()]
    assert SearchSpace().make({}) == Arch()
