import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.io import write_json
from pipeline.models.cost import fixed_macs, op_mac_table
from pipeline.models.modules import ModuleSpec, build_module
from pipeline.models.profile import CostModel
from pipeline.routing.candidates import (
    draw_candidates,
    evaluate_candidates,
    pareto_front,
    search_metrics,
    search_result,
    split_timings,
    spread_archs,
    write_search_plots,
)
from pipeline.search.probmodel import ProbModel
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


def supernet_and_costs():
    torch.manual_seed(0)
    module = build_module(ModuleSpec("supernet", 8, 1, 2, ("conv3", "dw3", "skip"), "conv3"), 4, 3)
    shape = (4, 8, 8)
    table = {"op_macs": op_mac_table(module, shape), "fixed_macs": fixed_macs(module, shape)}
    costs = CostModel({"modules": [table]})
    return module, costs


def seeded():
    return np.random.default_rng(np.random.SeedSequence([0, 1, 7]))


def test_draw_candidates_draws_p_n_then_the_spread_from_one_generator(tmp_path):
    module, costs = supernet_and_costs()
    model, archs, extra = draw_candidates(module, tmp_path / "absent.json", costs, 1, 4, 3, seeded())
    assert model.is_uniform() and model.space == module.space  # no P(N) written: the uniform ablation
    rng = seeded()  # the same draws by hand, in the same order
    reference = ProbModel.uniform(module.space).sample_distinct(4, rng)
    if model.most_likely() not in reference:
        reference.append(model.most_likely())
    assert archs == reference and len(set(archs)) == len(archs)
    op_macs = costs.table["modules"][0]["op_macs"]
    spread = spread_archs(module.space, op_macs, lambda a: costs.macs(1, a), 3, rng)
    assert extra == [a for a in spread if a not in archs] and not set(extra) & set(archs)
    assert draw_candidates(module, tmp_path / "absent.json", costs, 1, 4, 0, seeded())[2] == []  # no spread


def test_draw_candidates_reads_p_n_and_keeps_its_most_likely_subnet(tmp_path):
    module, costs = supernet_and_costs()
    probs = {d.label: {c: (0.96 if c == "skip" else 0.02) for c in d.choices} for d in module.space.decisions}
    write_json(tmp_path / "prob_model.json", probs)
    model, archs, extra = draw_candidates(module, tmp_path / "prob_model.json", costs, 1, 2, 0, seeded())
    assert {d: pytest.approx(p) for d, p in probs.items()} == model.as_dict()
    assert model.most_likely().key() == "op@l1=skip|op@l2=skip"
    assert model.most_likely() in archs and extra == []


def test_draw_candidates_of_a_fixed_module_is_its_one_path(tmp_path):
    module = build_module(ModuleSpec("fixed", 8), 4, 3)
    rng = seeded()
    state = rng.bit_generator.state
    assert draw_candidates(module, tmp_path / "prob_model.json", None, 1, 5, 3, rng) == (
        None, [module.default_arch()], [])
    assert rng.bit_generator.state == state  # nothing drawn


def test_split_timings_moves_latencies_out_of_the_rows():
    rows = [{"arch": "a", "acc": 0.5, "latency_ms_b1": 1.0, "latency_ms_b64": 9.0}, {"arch": "b", "acc": 0.6}]
    assert split_timings(rows) == {"a": {"latency_ms_b1": 1.0, "latency_ms_b64": 9.0}, "b": {}}
    assert rows == [{"arch": "a", "acc": 0.5}, {"arch": "b", "acc": 0.6}]


def test_search_result_and_metrics():
    rows = [{"arch": "a", "acc": 0.5, "perf": -1.0, "macs": 10},
            {"arch": "b", "acc": 0.75, "perf": -0.5, "macs": 30}]
    front, target = pareto_front(rows, 5), rows[1]
    fixed = search_result(1, "uniform", rows, target, front, None)
    assert list(fixed) == ["module", "sampler", "samples", "target", "pareto", "candidates", "most_likely",
                           "entropy_final"]
    assert (fixed["samples"], fixed["most_likely"], fixed["entropy_final"]) == (2, "", 0.0)
    assert search_result(1, "uniform", rows, target, front, None, []) == fixed  # no spread rows: no key
    space = SearchSpace((Decision("l1", ("x", "y")),))
    spread = [{"arch": "c", "acc": 0.1, "perf": -3.0, "macs": 1}]
    result = search_result(2, "probmodel", rows, target, front, ProbModel.uniform(space), spread)
    assert list(result)[-1] == "spread" and result["spread"] == spread
    assert result["entropy_final"] == pytest.approx(np.log(2)) and result["most_likely"] in ("l1=x", "l1=y")
    json.dumps(result)  # what search.json holds
    metrics = search_metrics(result, {"b": {"latency_ms_b1": 2.0}, "a": {}})
    assert metrics == {"target_acc": 0.75, "target_macs": 30, "target_perf": -0.5, "pareto_size": 2,
                       "acc_min": 0.5, "acc_max": 0.75, "acc_spread": 0.25,
                       "entropy_final": result["entropy_final"], "target_latency_ms_b1": 2.0}


def test_write_search_plots(tmp_path):
    rows = [{"arch": "a", "acc": 0.5, "macs": 10}, {"arch": "b", "acc": 0.4, "macs": 30}]
    spread = [{"arch": "c", "acc": 0.7, "macs": 50}]
    front = pareto_front(rows + spread, 5)
    write_search_plots(tmp_path, 1, rows, spread, front, rows[0], tmp_path / "no_iterations.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acc_vs_macs.png", "candidates.csv"]
    table = pd.read_csv(tmp_path / "candidates.csv")
    assert table["arch"].tolist() == ["a", "b", "c"] and table["pareto"].tolist() == [True, False, True]
    assert table["drawn_from"].tolist() == ["P(N)", "P(N)", "spread"]
    pd.DataFrame({"iteration": [0, 1], "entropy": [1.0, 0.9], "mi": [0.0, 0.1], "loss": [2.0, 1.0]}).to_csv(
        tmp_path / "iterations.csv", index=False)
    out = tmp_path / "plots"
    out.mkdir()
    write_search_plots(out, 1, rows, spread, front, rows[0], tmp_path / "iterations.csv")
    assert sorted(p.name for p in out.iterdir()) == ["acc_vs_macs.png", "candidates.csv", "entropy_mi.csv",
                                                     "entropy_mi.png"]
    assert list(pd.read_csv(out / "entropy_mi.csv").columns) == ["iteration", "entropy", "mi"]
