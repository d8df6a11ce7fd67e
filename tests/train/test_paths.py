"""Tests of pipeline.train.paths beyond test_loop's: ``module_outputs`` (a path's logits and feature maps
behind its prefix, in eval mode, whatever the batch size), ``evaluate_path`` (accuracy, CE and mean
confidence of those logits) and ``recalibrate_batchnorm`` (plain averages over the batches, a fresh
start, and the module's flags, momenta and prefix left as they were)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.cascade import build_modules
from pipeline.models.modules import NO_ARCH
from pipeline.search.space import Arch
from pipeline.train.paths import evaluate_path, module_outputs, recalibrate_batchnorm
from pipeline.train.prefix import Prefix
from tests.train.test_loop import MEAN, SPEC, STD, pattern_data


def cascade() -> tuple[nn.Module, Prefix]:
    """The untrained supernet (module 2) of test_loop's cascade, behind module 1."""
    modules = build_modules(SPEC, seed=0)
    return modules[1], Prefix(((modules[0], NO_ARCH),), MEAN, STD)


def normalised(images: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(images).float() / 255 - MEAN[0]) / STD[0]  # (N, 1, 12, 12)


def batchnorms(module: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    return {n: m for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# --- module_outputs ----------------------------------------------------------------------------------


def test_module_outputs_are_the_path_behind_its_prefix_in_eval_mode() -> None:
    module, prefix = cascade()
    arch = module.space.make({"op@l1": "dw3", "op@l2": "ir3_e3"})
    images, _ = pattern_data(10, seed=1)
    module.train()
    before = state(module)
    logits, maps = module_outputs(module, prefix, images, arch, 4, features=True)
    with torch.no_grad():
        module.eval()
        h, z = module(prefix(normalised(images)), arch)
        module.train()
    assert logits.shape == (10, 4) and maps is not None and maps.shape == h.shape == (10, 12, 6, 6)
    assert torch.allclose(logits, z, atol=1e-5) and torch.allclose(maps, h, atol=1e-5)
    assert module.training and all(m.training for m in module.modules())  # flags back as they were
    assert all(torch.equal(v, state(module)[k]) for k, v in before.items())  # no BatchNorm update


def test_module_outputs_do_not_depend_on_the_batch_size() -> None:
    module, prefix = cascade()
    images, _ = pattern_data(9, seed=2)
    module.train()  # eval mode inside: BatchNorm does not see the batch
    one, _ = module_outputs(module, prefix, images, module.default_arch(), 9)
    for batch_size in (1, 2, 4):
        logits, _ = module_outputs(module, prefix, images, module.default_arch(), batch_size)
        assert torch.allclose(logits, one, atol=1e-5)


def test_module_outputs_give_different_logits_for_different_paths() -> None:
    module, prefix = cascade()
    images, _ = pattern_data(6, seed=3)
    a, _ = module_outputs(module, prefix, images, module.space.make({"op@l1": "conv3", "op@l2": "conv3"}), 6)
    b, _ = module_outputs(module, prefix, images, module.space.make({"op@l1": "skip", "op@l2": "dw3"}), 6)
    assert not torch.allclose(a, b)


# --- evaluate_path -----------------------------------------------------------------------------------


def test_evaluate_path_is_accuracy_ce_and_confidence_of_the_logits() -> None:
    module, prefix = cascade()
    images, labels = pattern_data(12, seed=4)
    arch = module.default_arch()
    logits, _ = module_outputs(module, prefix, images, arch, 5)
    y = torch.from_numpy(labels)
    got = evaluate_path(module, prefix, images, labels.tolist(), arch, 5)  # a list of labels will do
    assert set(got) == {"acc", "ce", "conf_mean"} and all(isinstance(v, float) for v in got.values())
    assert got["acc"] == pytest.approx(float((logits.argmax(-1) == y).float().mean()))
    assert got["ce"] == pytest.approx(float(F.cross_entropy(logits.double(), y)), rel=1e-6)
    conf = logits.double().softmax(-1).max(-1).values  # (N,)
    assert got["conf_mean"] == pytest.approx(float(conf.mean()), rel=1e-6)


def test_evaluate_path_accuracy_counts_right_answers() -> None:
    module, prefix = cascade()
    images, _ = pattern_data(8, seed=5)
    pred = module_outputs(module, prefix, images, module.default_arch(), 8)[0].argmax(-1).numpy()
    assert evaluate_path(module, prefix, images, pred, module.default_arch(), 3)["acc"] == 1.0
    assert evaluate_path(module, prefix, images, (pred + 1) % 4, module.default_arch(), 3)["acc"] == 0.0
    half = np.where(np.arange(8) < 2, pred, (pred + 1) % 4)
    assert evaluate_path(module, prefix, images, half, module.default_arch(), 3)["acc"] == 0.25


# --- recalibrate_batchnorm -----------------------------------------------------------------------------


def transition_inputs(module: nn.Module, prefix: Prefix, images: np.ndarray) -> torch.Tensor:
    """What the transition's BatchNorm sees: (N, C, H, W)."""
    with torch.no_grad():
        return module.transition[0](prefix(normalised(images)))


def test_recalibrated_statistics_are_plain_averages_over_the_batches() -> None:
    module, prefix = cascade()
    arch = module.default_arch()
    images, _ = pattern_data(48, seed=6)
    recalibrate_batchnorm(module, prefix, images, arch, batch_size=16)
    bn = module.transition[1]
    h = transition_inputs(module, prefix, images)  # (48, C, H, W)
    per_batch = [h[i:i + 16] for i in range(0, 48, 16)]
    mean_of_vars = torch.stack([b.var(dim=(0, 2, 3), unbiased=True) for b in per_batch]).mean(dim=0)
    assert torch.allclose(bn.running_mean, h.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(bn.running_var, mean_of_vars, atol=1e-4)  # every batch counts the same
    assert int(bn.num_batches_tracked) == 3  # the probe that finds the path is not counted


def test_one_batch_gives_that_batchs_statistics_whatever_came_before() -> None:
    module, prefix = cascade()
    arch = module.default_arch()
    images, _ = pattern_data(20, seed=7)
    for bn in batchnorms(module).values():  # stale statistics: reset, not averaged with
        bn.running_mean.fill_(50.0)
        bn.running_var.fill_(9.0)
        bn.num_batches_tracked.fill_(1000)
    recalibrate_batchnorm(module, prefix, images, arch, batch_size=256)
    h = transition_inputs(module, prefix, images)
    bn = module.transition[1]
    assert torch.allclose(bn.running_mean, h.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(bn.running_var, h.var(dim=(0, 2, 3), unbiased=True), atol=1e-4)
    assert int(bn.num_batches_tracked) == 1
    unused = batchnorms(module)["layers.0.ir3_e3.body.0.1"]
    assert float(unused.running_mean[0]) == 50.0 and int(unused.num_batches_tracked) == 1000


@pytest.mark.parametrize("training", [True, False])
def test_recalibration_leaves_flags_momenta_and_the_prefix_as_they_were(training: bool) -> None:
    module, prefix = cascade()
    module.train(training)
    module.transition[1].momentum = 0.3
    flags = {n: m.training for n, m in module.named_modules()}
    momenta = {n: m.momentum for n, m in batchnorms(module).items()}
    first = prefix.stages[0][0]
    before = state(first)
    recalibrate_batchnorm(module, prefix, pattern_data(16, seed=8)[0], module.default_arch(), batch_size=8)
    assert {n: m.training for n, m in module.named_modules()} == flags
    assert {n: m.momentum for n, m in batchnorms(module).items()} == momenta
    assert all(torch.equal(v, state(first)[k]) for k, v in before.items())  # the frozen prefix is not touched
    assert not first.training


class Dropping(nn.Module):
    """A path module with a training-only layer (dropout) in front of its BatchNorms."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.drop = nn.Dropout(0.5)
        self.norms = nn.ModuleDict({"a": nn.BatchNorm2d(3), "b": nn.BatchNorm2d(3)})
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.norms[arch["op"]](self.drop(self.conv(x)))  # (B, 3, H, W)
        return h, self.fc(h.mean(dim=(2, 3)))  # (B, 3, H, W), (B, 4)


def test_recalibration_sees_the_path_as_evaluated_with_only_its_batchnorms_training() -> None:
    torch.manual_seed(0)
    module = Dropping().train()
    images, _ = pattern_data(32, seed=10)
    recalibrate_batchnorm(module, Prefix((), MEAN, STD), images, Arch((("op", "a"),)), batch_size=32)
    with torch.no_grad():
        h = module.conv(normalised(images))  # no dropout: what the BatchNorm sees at evaluation
    assert torch.allclose(module.norms["a"].running_mean, h.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(module.norms["a"].running_var, h.var(dim=(0, 2, 3)), atol=1e-4)
    assert int(module.norms["b"].num_batches_tracked) == 0  # not on the path
    assert module.training and module.drop.training


def test_recalibration_is_repeatable() -> None:
    module, prefix = cascade()
    images, _ = pattern_data(24, seed=9)
    arch = module.space.make({"op@l1": "ir3_e3", "op@l2": "dw3"})
    recalibrate_batchnorm(module, prefix, images, arch, batch_size=8)
    once = state(module)
    recalibrate_batchnorm(module, prefix, images, arch, batch_size=8)
    assert all(torch.allclose(v.float(), state(module)[k].float(), atol=1e-6) for k, v in once.items())
