from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import nn

from pipeline.models.cost import count_macs
from pipeline.routing.calibration import NEVER, threshold_grid
from pipeline.routing.engine import Stage, build_stage, combine_exits, run_all_exits, run_cascade
from pipeline.routing.predictor import Predictor
from tests.routing.conftest import CANDIDATES, TinyCascade, images


def mid_thresholds(tiny: TinyCascade, x: torch.Tensor, level: int = 5) -> list[float]:
    """Thresholds near the median confidence of each early exit (midpoints: no ties)."""
    grids = threshold_grid(run_all_exits(tiny.stages, x)["conf"].numpy(), size=11)
    return [float(g[level]) for g in grids]


def test_batch_size_does_not_change_results(tiny: TinyCascade) -> None:
    x = images(256, seed=1)
    stages = tiny.with_thresholds(mid_thresholds(tiny, x))
    full = run_cascade(stages, x)
    # The test means something only if images leave at every exit and routes differ.
    assert torch.bincount(full.exit_index, minlength=3).min() > 10
    assert all(len(full.choices[:, k].unique()) >= 3 for k in (1, 2))  # >= 2 routes, and -1
    for batch_size in (1, 7):
        part = run_cascade(stages, x, batch_size=batch_size)
        assert torch.equal(part.pred, full.pred)
        assert torch.equal(part.exit_index, full.exit_index)
        assert torch.equal(part.choices, full.choices)
        assert torch.equal(part.macs, full.macs)
        assert torch.allclose(part.conf, full.conf, atol=1e-5)
        assert part.calls == full.calls


def test_exits_really_shrink_the_batch(tiny: TinyCascade) -> None:
    x = images(200, seed=2)
    stages = tiny.with_thresholds(mid_thresholds(tiny, x, level=4))
    rows = {name: 0 for name in ("head0", "head1", "head2")}
    op_rows: dict[str, int] = {}
    op_calls: dict[str, int] = {}

    def count(name: str, table: dict[str, int], calls: dict[str, int] | None = None) -> Callable[..., None]:
        def hook(_m: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
            table[name] = table.get(name, 0) + inputs[0].shape[0]
            if calls is not None:
                calls[name] = calls.get(name, 0) + 1

        return hook

    handles = [tiny.modules[k].head.register_forward_hook(count(f"head{k}", rows)) for k in range(3)]
    for op, layer in tiny.modules[1].layers[0].items():
        handles.append(layer.register_forward_hook(count(op, op_rows, op_calls)))
    try:
        out = run_cascade(stages, x)
    finally:
        for handle in handles:
            handle.remove()

    reached = [int((out.exit_index >= k).sum()) for k in range(3)]
    assert out.calls == reached == [rows[f"head{k}"] for k in range(3)]
    assert out.calls[0] == 200 and out.calls[0] > out.calls[1] > out.calls[2] > 0
    # Module 2 ran each chosen candidate once, on exactly the rows routed to it.
    for r, arch in enumerate(CANDIDATES[1]):
        chosen = int((out.choices[:, 1] == r).sum())
        assert op_rows.get(arch["op@l1"], 0) == chosen
        assert op_calls.get(arch["op@l1"], 0) == (1 if chosen else 0)
    assert "skip" not in op_rows  # not a candidate's first op: never ran
    assert ((out.choices >= 0) == (torch.arange(3)[None, :] <= out.exit_index[:, None])).all()


def test_threshold_extremes(tiny: TinyCascade) -> None:
    x = images(20, seed=3)
    first = run_cascade(tiny.with_thresholds([0.0, 0.0]), x)
    assert first.calls == [20, 0, 0] and (first.exit_index == 0).all()
    assert (first.choices[:, 1:] == -1).all()
    last = run_cascade(tiny.with_thresholds([NEVER, NEVER]), x)
    assert last.calls == [20, 20, 20] and (last.exit_index == 2).all()


def test_macs_per_image_are_what_it_used(tiny: TinyCascade) -> None:
    x = images(64, seed=4)
    out = run_cascade(tiny.with_thresholds(mid_thresholds(tiny, x, level=3)), x)
    for i in range(0, 64, 9):
        expected = 0
        for k in range(int(out.exit_index[i]) + 1):
            arch = CANDIDATES[k][int(out.choices[i, k])]
            expected += count_macs(tiny.modules[k], tiny.shapes[k], arch)
            predictor = tiny.stages[k].predictor
            expected += count_macs(predictor, tiny.shapes[k]) if predictor is not None else 0
        assert int(out.macs[i]) == expected


def test_run_all_exits_agrees_with_the_cascade(tiny: TinyCascade) -> None:
    x = images(100, seed=5)
    stages = tiny.with_thresholds(mid_thresholds(tiny, x))
    every = run_all_exits(stages, x, batch_size=33)
    out = run_cascade(stages, x)
    rows = torch.arange(100)
    assert every["logits"].shape == (100, 3, 4) and every["cum_macs"].shape == (100, 3)
    assert (every["cum_macs"].diff(dim=1) > 0).all()
    assert torch.equal(every["pred"][rows, out.exit_index], out.pred)
    assert torch.equal(every["cum_macs"][rows, out.exit_index], out.macs)
    reached = out.choices >= 0
    assert torch.equal(every["choices"][reached], out.choices[reached])


def test_an_exported_subnet_runs_like_its_supernet_path(tiny: TinyCascade) -> None:
    x = images(30, seed=6)
    arch = CANDIDATES[1][2]
    supernet_path = [tiny.stages[0], build_stage(tiny.modules[1], tiny.shapes[1], [arch], NEVER)]
    exported = [tiny.stages[0], build_stage(tiny.modules[1].export(arch), tiny.shapes[1], [arch], NEVER)]
    a = run_cascade([dataclasses.replace(supernet_path[0], threshold=NEVER), supernet_path[1]], x)
    b = run_cascade([dataclasses.replace(exported[0], threshold=NEVER), exported[1]], x)
    assert torch.equal(a.pred, b.pred) and torch.equal(a.macs, b.macs)
    assert torch.allclose(a.conf, b.conf, atol=1e-6)


def test_modes_and_weights_are_left_alone(tiny: TinyCascade) -> None:
    module = tiny.modules[0]
    module.train()
    before = module.transition[1].running_mean.clone()
    try:
        run_cascade(tiny.stages, images(8, seed=7))
        assert module.training and module.transition[1].training
        assert torch.equal(module.transition[1].running_mean, before)
    finally:
        module.eval()


def test_stage_rejects_inconsistent_setups(tiny: TinyCascade) -> None:
    module, candidates = tiny.modules[1], CANDIDATES[1]
    with pytest.raises(ValueError, match="no predictor"):
        Stage(module, candidates, (1, 2, 3), 0.5)
    with pytest.raises(ValueError, match="candidate_macs"):
        Stage(module, candidates, (1, 2), 0.5, Predictor(8, 3))
    with pytest.raises(ValueError, match="scores 2"):
        Stage(module, candidates, (1, 2, 3), 0.5, Predictor(8, 2))
    with pytest.raises(ValueError, match="single candidate"):
        Stage(module, candidates[:1], (1,), 0.5, Predictor(8, 2))
    with pytest.raises(ValueError, match="non-empty"):
        Stage(module, (), (), 0.5)
    with pytest.raises(ValueError, match="one fixed path"):
        Stage(module.export(candidates[0]), candidates[:2], (1, 2), 0.5, Predictor(8, 2))
    with pytest.raises(ValueError, match="float tensor"):
        run_cascade(tiny.stages, torch.zeros(2, 1, 16, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one stage"):
        run_cascade([], images(2, seed=0))


def test_empty_batch(tiny: TinyCascade) -> None:
    out = run_cascade(tiny.stages, images(0, seed=0))
    assert out.calls == [0, 0, 0] and out.pred.shape == (0,) and out.choices.shape == (0, 3)


def test_combine_exits_is_the_decay_weighted_mean_of_log_probabilities() -> None:
    logits = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(0))
    assert combine_exits(logits, 0.0) is logits  # each exit alone, untouched
    log_p = torch.log_softmax(logits, dim=-1)
    mean = combine_exits(logits, 1.0)
    assert torch.allclose(mean[:, 2], log_p.mean(dim=1), atol=1e-6)
    half = combine_exits(logits, 0.5)
    assert torch.allclose(half[:, 0], log_p[:, 0], atol=1e-6)
    assert torch.allclose(half[:, 2], (0.25 * log_p[:, 0] + 0.5 * log_p[:, 1] + log_p[:, 2]) / 1.75, atol=1e-6)
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="ensemble_decay"):
            combine_exits(logits, bad)


def test_the_exit_ensemble_changes_answers_not_costs(tiny: TinyCascade) -> None:
    x = images(64, seed=5)
    stages = tiny.with_thresholds([0.5, 0.5])
    alone, ensemble = run_cascade(stages, x), run_cascade(stages, x, ensemble_decay=0.5)
    assert torch.equal(ensemble.pred[ensemble.exit_index == 0], alone.pred[alone.exit_index == 0])  # exit 1: itself
    both = run_all_exits(stages, x, ensemble_decay=0.5)
    leaving = ensemble.exit_index
    assert torch.equal(ensemble.pred, both["pred"][torch.arange(64), leaving])
    assert torch.equal(ensemble.macs, both["cum_macs"][torch.arange(64), leaving])


def test_the_cascade_runs_under_cpu_bf16_autocast_with_float32_confidences(tiny: TinyCascade) -> None:
    """compute.precision bf16 on the CPU: the heads' logits come out in bf16; confidences are compared with
    the (float32) thresholds in float32, and both runs agree with each other's exits."""
    x = images(64, seed=2)
    stages = tiny.with_thresholds(mid_thresholds(tiny, x))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = run_cascade(stages, x)
        every = run_all_exits(stages, x)
    assert out.conf.dtype == torch.float32 and every["logits"].dtype == torch.float32
    assert torch.equal(every["pred"][torch.arange(64), out.exit_index], out.pred)
