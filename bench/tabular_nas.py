"""Real tabular NAS benchmarks for black-box categorical search, offline, from an installed package.

The tables come from NAS-Bench-Graph (Qin et al., NeurIPS 2022 Datasets and Benchmarks), PyPI
package ``nas-bench-graph`` (import name ``nas_bench_graph``; ``pip install -e '.[bench]'``). Its
wheel ships a "light" table per dataset (``nas_bench_graph/light/<dataset>.bench``, about 2 MB
each): every non-isomorphic GNN architecture of the space, trained to completion, with its
validation and test accuracy. Nothing is downloaded; only the requested dataset's file is read.

The space, as categorical decisions (one choice per decision):

* ``link``: which earlier node feeds each of the 4 computing nodes (0 = the input), one of the
  9 canonical DAG shapes of the benchmark, written e.g. ``0-0-1-2``;
* ``op@n1`` .. ``op@n4``: the operation of each computing node (9 GNN ops: gat, gcn, gin, cheb,
  sage, arma, graph, fc, skip; 5 on ``proteins``: gcn, sage, arma, fc, skip).

That is 9 * 9**4 = 59,049 points (9 * 5**4 = 5,625 on proteins), of which the table holds the
canonical representative of each isomorphism class: 26,206 (2,021 on proteins). The rest are
"invalid" here, ``bench(arch)`` returns ``None`` for them, like NAS-Bench-101's invalid cells;
:meth:`TabularBenchmark.canonical` maps such an arch onto its representative in the table (via
the package's own ``Arch.valid_hash``) for a caller that prefers to fold isomorphs together.

The score is the validation accuracy (higher is better); ``test_scores`` holds the test accuracy.
"""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import math
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType

from pipeline.search.space import Arch, Decision, SearchSpace

PACKAGE = "nas-bench-graph"  # the name to pip install
MODULE = "nas_bench_graph"  # the name to import

# The package's nine canonical link shapes, in the order its hash numbers them (0..8).
LINKS: tuple[tuple[int, int, int, int], ...] = (
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 1, 1),
    (0, 0, 1, 2),
    (0, 0, 1, 3),
    (0, 1, 1, 1),
    (0, 1, 1, 2),
    (0, 1, 2, 2),
    (0, 1, 2, 3),
)
# The package's operation list, in the order its hash numbers them (0..8), and the proteins subset.
OPS: tuple[str, ...] = ("gat", "gcn", "gin", "cheb", "sage", "arma", "graph", "fc", "skip")
OPS_PROTEINS: tuple[str, ...] = ("gcn", "sage", "arma", "fc", "skip")
N_NODES = 4

DATASETS: tuple[str, ...] = (
    "cora",
    "citeseer",
    "pubmed",
    "cs",
    "physics",
    "photo",
    "computers",
    "arxiv",
    "proteins",
)
PREFIX = "nbg-"
BENCHMARKS: tuple[str, ...] = tuple(PREFIX + d for d in DATASETS)


def _link_label(link: tuple[int, ...]) -> str:
    return "-".join(str(i) for i in link)


@dataclass(frozen=True)
class TabularBenchmark:
    """A search space with an exhaustive table of scores over its valid architectures.

    ``scores`` and ``test_scores`` map choice-index tuples (``space.index(arch)``) of valid
    architectures to validation / test accuracy; both are read-only views shared per process.
    """

    name: str
    space: SearchSpace
    scores: Mapping[tuple[int, ...], float] = field(repr=False, compare=False)
    test_scores: Mapping[tuple[int, ...], float] = field(repr=False, compare=False)

    @property
    def n_valid(self) -> int:
        return len(self.scores)

    def __call__(self, arch: Arch) -> float | None:
        """The arch's score, or ``None`` when the table has no entry for it (an invalid arch)."""
        try:
            index = self.space.index(arch)
        except (KeyError, ValueError):
            return None
        return self.scores.get(index)

    def ranked(self) -> list[tuple[int, ...]]:
        """Valid index tuples, best first (ties broken by index tuple, so the order is stable)."""
        return sorted(self.scores, key=lambda ix: (-self.scores[ix], ix))

    def top_set(self, fraction: float = 0.001, *, include_ties: bool = False) -> frozenset[tuple[int, ...]]:
        """The best ``ceil(fraction * n_valid)`` valid index tuples.

        With ``include_ties``, also every arch whose score equals the last one's (accuracies are
        averages over a few seeds on small validation sets, so exact ties are common).
        """
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
        ranked = self.ranked()
        k = math.ceil(fraction * len(ranked))
        top = ranked[:k]
        if include_ties:
            cutoff = self.scores[top[-1]]
            top = [ix for ix in ranked if self.scores[ix] >= cutoff]
        return frozenset(top)

    def canonical(self, arch: Arch) -> Arch | None:
        """The table's representative of ``arch``'s isomorphism class (``None`` for all-skip)."""
        _import_package()
        from nas_bench_graph.architecture import Arch as NBGArch

        values = self.space.validate(arch)
        link = [int(i) for i in values["link"].split("-")]
        ops = [values[f"op@n{j + 1}"] for j in range(N_NODES)]
        if all(op == "skip" for op in ops):
            return None
        digits = f"{NBGArch(link, ops).valid_hash():05d}"
        found = self.space.make(_decode(digits))
        return found if self.space.index(found) in self.scores else None


def _space(ops: tuple[str, ...]) -> SearchSpace:
    decisions = [Decision("link", tuple(_link_label(lk) for lk in LINKS))]
    decisions += [Decision(f"op@n{j + 1}", ops) for j in range(N_NODES)]
    return SearchSpace(tuple(decisions))


def _decode(digits: str) -> dict[str, str]:
    """The package's key (5 decimal digits: link shape, then each node's op in ``OPS``) as choices."""
    choices = {"link": _link_label(LINKS[int(digits[0])])}
    for j in range(N_NODES):
        choices[f"op@n{j + 1}"] = OPS[int(digits[1 + j])]
    return choices


class _TableUnpickler(pickle.Unpickler):
    """Unpickles the benchmark's plain dicts of floats; refuses any other global than numpy scalars."""

    ALLOWED = {
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"unexpected global {module}.{name} in a benchmark table")
        return super().find_class(module, name)


def _import_package() -> ModuleType:
    try:
        return importlib.import_module(MODULE)
    except ImportError as err:
        raise ImportError(
            f"the tabular NAS benchmarks need the PyPI package {PACKAGE!r}: "
            f"pip install {PACKAGE}  (or pip install -e '.[bench]')"
        ) from err


@functools.cache
def load_benchmark(name: str) -> TabularBenchmark:
    """Load one benchmark of :data:`BENCHMARKS` (e.g. ``"nbg-cora"``); cached per process."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown tabular benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    dataset = name[len(PREFIX) :]
    package = _import_package()
    resource = importlib.resources.files(package) / "light" / f"{dataset}.bench"
    if not resource.is_file():
        raise FileNotFoundError(f"{PACKAGE} is installed but has no table {resource}")
    with resource.open("rb") as fh:
        table = _TableUnpickler(fh).load()

    ops = OPS_PROTEINS if dataset == "proteins" else OPS
    space = _space(ops)
    # The key's op digits number ``OPS`` on every dataset; map them onto this space's choices.
    position = {OPS.index(op): i for i, op in enumerate(ops)}
    scores: dict[tuple[int, ...], float] = {}
    test_scores: dict[tuple[int, ...], float] = {}
    for key, info in table.items():
        digits = f"{int(key):05d}"
        index = (int(digits[0]), *(position[int(d)] for d in digits[1:]))
        scores[index] = float(info["valid_perf"])
        test_scores[index] = float(info["perf"])
    return TabularBenchmark(name, space, MappingProxyType(scores), MappingProxyType(test_scores))
