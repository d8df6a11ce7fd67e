"""Tests of bench.tabular_nas: NAS-Bench-Graph's shipped tables as categorical search benchmarks.

Skipped (except the missing-package message) when ``nas-bench-graph`` is not installed
(``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import math
import random
import sys

import pytest

from bench.tabular_nas import BENCHMARKS, _import_package, load_benchmark
from pipeline.search.space import Arch


@pytest.fixture(scope="module")
def nbg():
    return pytest.importorskip("nas_bench_graph")


@pytest.fixture(scope="module")
def cora(nbg):
    return load_benchmark("nbg-cora")


@pytest.fixture(scope="module")
def proteins(nbg):
    return load_benchmark("nbg-proteins")


def test_missing_package_names_the_pip_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nas_bench_graph", None)  # makes the import fail
    with pytest.raises(ImportError, match="pip install nas-bench-graph"):
        _import_package()


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="nbg-cora"):
        load_benchmark("nbg-imagenet")


def test_offers_every_dataset_and_caches(cora) -> None:
    assert len(BENCHMARKS) == 9 and "nbg-cora" in BENCHMARKS and "nbg-proteins" in BENCHMARKS
    assert load_benchmark("nbg-cora") is cora


def test_sizes(cora, proteins) -> None:
    assert cora.space.labels == ("link", "op@n1", "op@n2", "op@n3", "op@n4")
    assert [len(d.choices) for d in cora.space.decisions] == [9, 9, 9, 9, 9]
    assert cora.space.size() == 59_049 and cora.n_valid == 26_206
    assert [len(d.choices) for d in proteins.space.decisions] == [9, 5, 5, 5, 5]
    assert proteins.space.size() == 5_625 and proteins.n_valid == 2_021


@pytest.mark.parametrize("name", ["nbg-cora", "nbg-proteins"])
def test_encoding_round_trips_and_scores_are_finite(nbg, name: str) -> None:
    bench = load_benchmark(name)
    for index, score in bench.scores.items():
        arch = bench.space.from_index(index)
        assert bench.space.index(arch) == index
        assert bench.space.index(Arch.from_key(arch.key())) == index
        assert bench(arch) == score
        assert math.isfinite(score) and 0.0 <= score <= 1.0
        assert math.isfinite(bench.test_scores[index])


@pytest.mark.parametrize("name", ["nbg-cora", "nbg-proteins"])
def test_agrees_with_the_package_own_hash_and_table(nbg, name: str) -> None:
    """Every entry decodes to an arch whose package hash is the key it was read under."""
    table = nbg.light_read(name.removeprefix("nbg-"))
    bench = load_benchmark(name)
    assert len(table) == bench.n_valid
    for index, score in bench.scores.items():
        values = bench.space.from_index(index).as_dict()
        link = [int(i) for i in values["link"].split("-")]
        ops = [values[f"op@n{j}"] for j in range(1, 5)]
        key = nbg.Arch(link, ops).hash_arch()
        assert score == pytest.approx(float(table[key]["valid_perf"]))
        assert bench.test_scores[index] == pytest.approx(float(table[key]["perf"]))


def test_invalid_archs_and_canonical(cora) -> None:
    space = cora.space
    # Four parallel nodes: the table keeps the ops sorted, so gcn before gat is an isomorph.
    swapped = space.make({"link": "0-0-0-0", "op@n1": "gcn", "op@n2": "gat", "op@n3": "fc", "op@n4": "fc"})
    assert cora(swapped) is None
    canon = cora.canonical(swapped)
    assert canon is not None and canon["op@n1"] == "gat" and canon["op@n2"] == "gcn"
    assert cora(canon) is not None and cora.canonical(canon) == canon
    all_skip = space.make({"link": "0-1-2-3", **{f"op@n{j}": "skip" for j in range(1, 5)}})
    assert cora(all_skip) is None and cora.canonical(all_skip) is None
    assert cora(Arch((("link", "0-0-0-0"),))) is None  # not an arch of this space


def test_every_arch_has_a_canonical_form_in_the_table(cora, proteins) -> None:
    # Exhaustive on proteins (5,625 archs); a fixed sample of cora's 59,049 (the whole is ~9 s).
    n_none = 0
    for arch in proteins.space.enumerate():
        canon = proteins.canonical(arch)
        if canon is None:
            n_none += 1
        else:
            assert proteins.space.index(canon) in proteins.scores
    assert n_none == 9  # all-skip, once per link shape
    rng = random.Random(0)
    for _ in range(2000):
        arch = cora.space.from_index(tuple(rng.randrange(len(d.choices)) for d in cora.space.decisions))
        canon = cora.canonical(arch)
        assert canon is None or cora.space.index(canon) in cora.scores
        if cora(arch) is not None:
            assert canon == arch


def test_top_set(cora, proteins) -> None:
    top = cora.top_set()
    assert len(top) == math.ceil(0.001 * 26_206) == 27
    worst_in = min(cora.scores[ix] for ix in top)
    assert all(cora.scores[ix] <= worst_in for ix in cora.scores.keys() - top)
    assert max(cora.scores.values()) == max(cora.scores[ix] for ix in top)
    ties = cora.top_set(include_ties=True)
    assert top <= ties and all(cora.scores[ix] >= worst_in for ix in ties)
    assert len(proteins.top_set()) == 3 and len(cora.top_set(0.01)) == 263
    with pytest.raises(ValueError):
        cora.top_set(0.0)
