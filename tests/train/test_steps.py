"""``pipeline.train.steps``: one training step, on tiny modules and batches (tests/train/test_loop.py
trains with it and checks the distillation terms and the extreme paths of a real space).
``LossParams.cost`` prices each path once; a fixed module's step is the cost-aware loss of the whole
batch, plus label smoothing (torch's smoothed CE, scaled by the cost weight) and soft-target
distillation; a supernet step sends chunk j through path j, its loss the mean of the chunks' losses
plus the sandwich paths', its perf ``-CE - lambda_c * cost``, and with P(i-1) given the MLE step's
P(i) and record; ``extreme_archs`` breaks ties towards the earlier choice; ``StepNet`` is
deterministic given its generator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.models.modules import NO_ARCH, ModuleSpec, SupernetModule, build_module
from pipeline.search.probmodel import ProbModel
from pipeline.search.space import Arch, Decision, SearchSpace
from pipeline.train import steps
from pipeline.train.config import TrainConfig
from pipeline.train.losses import cost_aware_loss
from pipeline.train.steps import LossParams, StepNet, distillation_loss, extreme_archs, soft_target_loss

FIXED = ModuleSpec("fixed", 4, 1, 1, head="gap")
SUPERNET = ModuleSpec("supernet", 4, 1, 2, ("conv3", "dw3", "skip"), "conv3", head="gap")
COSTS = {"conv3": 10.0, "dw3": 4.0, "skip": 0.0}


def path_cost(arch: Arch) -> float:
    return 2.0 + sum(COSTS[op] for _, op in arch.items)


def params(**kw: object) -> LossParams:
    base = dict(cost_of=path_cost, cost_max=22.0, exit_saving=0.5, lam=0.0, mu=0.0, label_smoothing=0.0,
                lambda_c=0.1)
    base.update(kw)
    return LossParams(**base)  # type: ignore[arg-type]


def cfg(**kw: object) -> TrainConfig:
    # the plain recipe these steps are checked on: no augmentation, no cost-aware loss, no sandwich
    base = dict(epochs=1, batch_size=8, lr=0.1, m=3, pick="plain", beta=0.0, warmup_epochs=0.0, crop_padding=0,
                flip=False, lam=0.0, mu=0.0, smoothing=0.05, sandwich=False, kd_temperature=1.0)
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def module(spec: ModuleSpec = SUPERNET, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_module(spec, 2, 3).eval()  # eval: the same BatchNorm statistics for every forward


def batch(n: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_loss_params_price_each_path_once() -> None:
    calls: list[Arch] = []

    def counting(arch: Arch) -> float:
        calls.append(arch)
        return 5
    p = params(cost_of=counting)
    a, b = Arch((("op@l1", "conv3"),)), Arch((("op@l1", "skip"),))
    assert [p.cost(a), p.cost(b), p.cost(a), p.cost(b)] == [5.0, 5.0, 5.0, 5.0]
    assert calls == [a, b] and type(p.cost(a)) is float and p.costs == {a: 5.0, b: 5.0}
    assert params().costs is not p.costs  # each LossParams its own price list


def test_a_fixed_module_step_is_the_cost_aware_loss_of_the_whole_batch() -> None:
    net, (x, y) = module(FIXED), batch()
    p = params(cost_of=lambda arch: 11.0, lam=0.5, mu=0.7)
    out = StepNet(net, cfg(), p, np.random.default_rng(0))(x, y, None)
    logits = net(x, NO_ARCH)[1]
    expected, parts = cost_aware_loss(logits, y, 11.0, 22.0, 0.5, 0.5, 0.7)
    assert out.info == {} and out.model is None and len(out.chunks) == 1
    chunk = out.chunks[0]
    assert out.loss is chunk.loss and torch.allclose(out.loss, expected) and out.loss.requires_grad
    assert torch.allclose(chunk.ce, F.cross_entropy(logits, y)) and chunk.bce == pytest.approx(parts["bce"])
    assert int(chunk.correct) == int((logits.argmax(1) == y).sum()) and not chunk.correct.requires_grad
    assert torch.equal(chunk.logits, logits.detach()) and not chunk.logits.requires_grad


@pytest.mark.parametrize(("lam", "cost"), [(0.0, 11.0), (0.5, 11.0), (0.5, 30.0), (0.5, -3.0)])
def test_label_smoothing_is_torchs_smoothed_ce_with_the_same_cost_weight(lam: float, cost: float) -> None:
    net, (x, y) = module(FIXED), batch()
    p = params(cost_of=lambda arch: cost, lam=lam, label_smoothing=0.2)
    out = StepNet(net, cfg(), p, np.random.default_rng(0))(x, y, None)
    logits = net(x, NO_ARCH)[1]
    weight = 1 + lam * (1 - min(max(cost / 22.0, 0.0), 1.0))  # the cost share clamped to [0, 1]
    assert out.loss.item() == pytest.approx(weight * F.cross_entropy(logits, y, label_smoothing=0.2).item(),
                                            rel=1e-5)


def test_soft_targets_add_their_weighted_distillation_term() -> None:
    net, (x, y) = module(FIXED), batch()
    soft = torch.softmax(torch.randn(7, 3, generator=torch.Generator().manual_seed(2)), dim=-1)
    base = StepNet(net, cfg(), params(), np.random.default_rng(0))(x, y, None).loss
    out = StepNet(net, cfg(), params(kd=0.3, kd_temperature=2.0), np.random.default_rng(0))(x, y, None, soft)
    logits = net(x, NO_ARCH)[1]
    term = soft_target_loss(logits, soft, 2.0).item()
    assert (out.loss - base).item() == pytest.approx(0.3 * term, rel=1e-5)
    ignored = StepNet(net, cfg(), params(kd=0.0), np.random.default_rng(0))(x, y, None, soft).loss
    assert torch.equal(ignored, base)  # kd 0: the soft targets are not read


def test_a_supernet_step_sends_chunk_j_through_path_j() -> None:
    net, (x, y) = module(), batch()
    archs = [net.space.make({"op@l1": a, "op@l2": b}) for a, b in (("conv3", "skip"), ("dw3", "dw3"),
                                                                      ("skip", "skip"))]
    out = steps._supernet_step(net, x, y, archs, None, cfg(), params())
    assert [c.logits.shape[0] for c in out.chunks] == [3, 2, 2]  # 7 rows in 3 chunks
    ces = []
    for chunk, xj, yj, arch in zip(out.chunks, x.tensor_split(3), y.tensor_split(3), archs, strict=True):
        logits = net(xj, arch)[1]
        assert torch.allclose(chunk.logits, logits)
        ces.append(F.cross_entropy(logits, yj).item())
    assert torch.allclose(out.loss, torch.stack([c.loss for c in out.chunks]).mean())
    perf = [-ce - 0.1 * path_cost(a) / 22.0 for ce, a in zip(ces, archs, strict=True)]
    assert out.info == pytest.approx({"best_perf": max(perf), "mean_perf": sum(perf) / 3})
    assert out.model is None


def test_more_paths_than_images_run_one_image_each() -> None:
    net, (x, y) = module(), batch(2)
    archs = list(net.space.enumerate())[:5]
    out = steps._supernet_step(net, x, y, archs, None, cfg(), params())
    assert [c.logits.shape[0] for c in out.chunks] == [1, 1]
    assert torch.allclose(out.chunks[1].logits, net(x[1:], archs[1])[1])


def test_the_sandwich_adds_the_largest_and_smallest_paths_and_distils_every_path() -> None:
    net, (x, y) = module(), batch()
    largest, smallest = extreme_archs(net.space, path_cost)
    p = params(extremes=(largest, smallest))
    archs = [net.space.make({"op@l1": "dw3", "op@l2": "skip"}),
             net.space.make({"op@l1": "skip", "op@l2": "dw3"})]
    plain = steps._supernet_step(net, x, y, archs, None, cfg(paired_perf=False), p)
    out = steps._supernet_step(net, x, y, archs, None, cfg(sandwich=True, distill=0.5, paired_perf=False), p)
    top = net(x, largest)[1]
    bottom = net(x, smallest)[1]
    p_top, _ = cost_aware_loss(top, y, 22.0, 22.0, 0.5, 0.0, 0.0)
    p_bottom, _ = cost_aware_loss(bottom, y, 2.0, 22.0, 0.5, 0.0, 0.0)
    sandwich = p_top + p_bottom + 0.5 * distillation_loss(bottom, top)
    # every chunk's path is also distilled from the largest path's logits on its own images
    distilled = torch.stack([distillation_loss(net(xj, a)[1], tj) for xj, a, tj in
                             zip(x.tensor_split(2), archs, top.tensor_split(2), strict=True)]).mean()
    assert len(out.chunks) == 2  # the sandwich paths are not chunks
    assert out.loss.item() == pytest.approx((plain.loss + sandwich + 0.5 * distilled).item(), rel=1e-5)
    assert out.info == pytest.approx(plain.info)  # nor do they change the chunks' perf (unpaired)
    paired = steps._supernet_step(net, x, y, archs, None, cfg(sandwich=True, distill=0.5), p)
    # paired perf: each chunk's CE minus the largest path's CE on the same images
    ce_gap = [(F.cross_entropy(net(xj, a)[1], yj) - F.cross_entropy(net(xj, largest)[1], yj)).item()
              for xj, yj, a in zip(x.tensor_split(2), y.tensor_split(2), archs, strict=True)]
    perf = [-g - 0.1 * path_cost(a) / 22.0 for g, a in zip(ce_gap, archs, strict=True)]
    assert paired.info["best_perf"] == pytest.approx(max(perf), rel=1e-5)


def test_with_the_previous_model_the_step_returns_p_i_and_its_record() -> None:
    net, (x, y) = module(), batch(8)
    prev = ProbModel.from_probs(net.space, [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    archs = list(net.space.enumerate())[:4]
    out = steps._supernet_step(net, x, y, archs, prev, cfg(beta=0.0), params())
    assert out.model is not None and out.model.most_likely().key() == out.info["most_likely"]
    assert out.info["entropy"] == pytest.approx(out.model.entropy())
    assert math.isnan(out.info["mi_loss"]) and math.isfinite(out.info["mi"])  # beta 0: MI logged, no term
    assert out.loss.item() == pytest.approx(torch.stack([c.loss for c in out.chunks]).mean().item(), rel=1e-6)
    assert out.info["task_loss"] == pytest.approx(out.loss.item(), rel=1e-6)
    uniform = steps._supernet_step(net, x, y, archs, ProbModel.uniform(net.space), cfg(beta=0.0), params())
    assert math.isnan(uniform.info["mi"])  # nothing to compare P(1) with


def test_stepnet_picks_m_paths_deterministically() -> None:
    net, (x, y) = module(), batch(8)
    assert isinstance(net, SupernetModule)
    runs = [StepNet(net, cfg(m=4), params(), np.random.default_rng(5))(x, y, None) for _ in range(2)]
    assert len(runs[0].chunks) == 4 and torch.equal(runs[0].loss, runs[1].loss)
    assert set(runs[0].info) == {"best_perf", "mean_perf"} and runs[0].model is None
    uniform = ProbModel.uniform(net.space)
    with_model = StepNet(net, cfg(m=4), params(), np.random.default_rng(5))(x, y, uniform)
    assert with_model.model is not None and "most_likely" in with_model.info
    assert StepNet(net, cfg(), params(), np.random.default_rng(0)).module is net  # registered for DDP


def test_extreme_archs_break_ties_towards_the_earlier_choice() -> None:
    space = SearchSpace((Decision("a", ("x", "y", "z")), Decision("b", ("p", "q"))))
    flat = extreme_archs(space, lambda arch: 1.0)
    assert flat == (space.make({"a": "x", "b": "p"}), space.make({"a": "x", "b": "p"}))
    prices = {"x": 1, "y": 5, "z": 5, "p": 0, "q": 0}
    largest, smallest = extreme_archs(space, lambda arch: sum(prices[v] for _, v in arch.items))
    assert largest == space.make({"a": "y", "b": "p"}) and smallest == space.make({"a": "x", "b": "p"})
    assert extreme_archs(SearchSpace(), lambda arch: 0.0) == (Arch(), Arch())


class _Confident(torch.nn.Module):
    """A module whose exit is all but certain: its logits put 40 nats on the right class."""

    def forward(self, x: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor]:
        onehot = torch.eye(3)[torch.arange(x.shape[0]) % 3]  # (B, 3)
        return x, torch.nn.functional.linear(onehot, 40.0 * torch.eye(3))  # a linear head: bf16 under autocast


def test_the_loss_is_finite_under_cpu_bf16_autocast_on_a_confident_exit() -> None:
    """CPU autocast leaves log_softmax in bf16, where a confidence of 1 - 1e-6 rounds to 1 and the exit's
    BCE becomes inf * 0 = nan: the chunk's loss is computed on float32 logits (docs/RESULTS.md "bf16 on
    the CPU")."""
    x, _ = batch(6)
    y = torch.arange(6) % 3
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        chunk = steps._chunk_loss(_Confident(), x, y, NO_ARCH, params(lam=0.5, mu=0.2))
    assert torch.isfinite(chunk.loss) and chunk.logits.dtype == torch.float32
