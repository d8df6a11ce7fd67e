import numpy as np
import pytest
import torch

from pipeline.models.modules import ModuleSpec, build_module
from pipeline.search.candidates import evaluate_candidates, pareto_front, spread_archs
from pipeline.search.space import Decision, SearchSpace


def row(acc, macs):
    return {"arch": f"{acc}-{macs}", "acc": acc, "macs": macs}


def test_pareto_front_keeps_only_non_dominated_cheapest_first():
    rows = [row(0.80, 10), row(0.85, 20), row(0.84, 30), row(0.90, 40), row(0.70, 5), row(0.79, 12)]
    front = pareto_front(rows, max_size=10)
    assert [(r["acc"], r["macs"]) for r in front] == [(0.70, 5), (0.80, 10), (0.85, 20), (0.90, 40)]


def test_pareto_front_thinning_keeps_the_ends():
    rows = [row(0.5 + i / 100, 10 + i) for i in range(20)]
    front = pareto_front(rows, max_size=3)
    assert len(front) == 3
    assert front[0]["macs"] == 10 and front[-1]["macs"] == 29


def test_evaluate_candidates_perf_and_accuracy():
    torch.manual_seed(0)
    spec = ModuleSpec("supernet", 8, 2, 1, ("conv3", "skip"), "conv3")
    module = build_module(spec, 4, 3).eval()
    x, y = torch.randn(20, 4, 8, 8), torch.randint(0, 3, (20,))
    archs = [module.space.make({"op@l1": op}) for op in ("conv3", "skip")]
    rows = evaluate_candidates(module, x, y, archs, macs_of=lambda a: 100 if a["op@l1"] == "conv3" else 10,
                               latency_of=lambda a, b: 1.0, cost_max=100, lambda_c=0.5, batch_size=7)
    for r, arch in zip(rows, archs, strict=True):
        with torch.no_grad():
            logits = module(x, arch)[1]
        assert abs(r["acc"] - float((logits.argmax(1) == y).double().mean())) < 1e-9
        ce = float(torch.nn.functional.cross_entropy(logits, y))
        assert abs(r["perf"] - (-ce - 0.5 * r["macs"] / 100)) < 1e-5


def test_spread_archs_span_the_whole_cost_range():
    ops = {"skip": 0, "dw3": 10, "conv3": 100}
    space = SearchSpace(tuple(Decision(f"l{j}", tuple(ops)) for j in range(4)))
    table = {f"l{j}": dict(ops) for j in range(4)}

    def macs(arch):
        return 5 + sum(ops[c] for _, c in arch.items)

    picks = spread_archs(space, table, macs, 5, np.random.default_rng(0))
    costs = [macs(a) for a in picks]
    assert len(set(picks)) == 5 and costs[0] == 5 and costs[-1] == 405  # the cheapest and the largest path
    assert costs == sorted(costs) and all(50 < c < 350 for c in costs[1:-1])  # the rest spread between
    assert spread_archs(space, table, macs, 5, np.random.default_rng(0)) == picks  # deterministic
    with pytest.raises(ValueError, match="at least 2"):
        spread_archs(space, table, macs, 1, np.random.default_rng(0))
