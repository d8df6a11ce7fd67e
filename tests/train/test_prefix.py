"""``pipeline.train.prefix``: ``module_device`` (where a module's parameters live) and ``Prefix``, the
frozen modules 1..k-1 as module k sees them: its fields normalised on construction, its modules frozen
(eval mode, no gradients) even when a caller puts them back in training mode, membership by identity,
and batches normalised with the prefix's own mean and std."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.models.modules import NO_ARCH, ModuleSpec, build_module
from pipeline.search.space import Arch
from pipeline.train.prefix import Prefix, module_device

FIXED = ModuleSpec("fixed", 4, stride=2, layers=1, head="gap")
SUPERNET = ModuleSpec("supernet", 4, 1, 1, ("conv3", "skip"), "conv3", head="gap")


def two_modules() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return build_module(FIXED, 1, 3), build_module(SUPERNET, 4, 3)


def test_module_device_is_where_the_parameters_are() -> None:
    assert module_device(nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU
    assert module_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(nn.Linear(2, 2, device="meta")).type == "meta"


def test_fields_are_normalised_and_modules_frozen() -> None:
    first, second = two_modules()
    first.train()
    prefix = Prefix([[first, NO_ARCH]], np.float64(0.5), np.array([0.25]))  # type: ignore[arg-type]
    assert prefix.stages == ((first, NO_ARCH),) and isinstance(prefix.stages[0], tuple)
    assert prefix.mean == (0.5,) and prefix.std == (0.25,)
    assert all(type(v) is float for v in prefix.mean + prefix.std)
    assert not first.training and not any(p.requires_grad for p in first.parameters())
    assert second.training and all(p.requires_grad for p in second.parameters())  # not in the prefix
    assert Prefix(mean=[0.1, 0.2, 0.3], std=(1, 2, 3)).std == (1.0, 2.0, 3.0)  # type: ignore[arg-type]


def test_membership_is_by_identity() -> None:
    first, second = two_modules()
    prefix = Prefix(((first, NO_ARCH),))
    twin = build_module(FIXED, 1, 3)
    twin.load_state_dict(first.state_dict())
    assert first in prefix
    assert second not in prefix and twin not in prefix


def test_an_empty_prefix_is_the_identity() -> None:
    x = torch.randn(2, 1, 6, 6)
    assert torch.equal(Prefix()(x), x)


def test_call_runs_each_stage_on_its_arch_in_order() -> None:
    first, second = two_modules()
    arch = Arch((("op@l1", "skip"),))
    prefix = Prefix(((first, NO_ARCH), (second, arch)))
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        expected = second(first(x, NO_ARCH)[0], arch)[0]
        other = second(first(x, NO_ARCH)[0], Arch((("op@l1", "conv3"),)))[0]
    out = prefix(x)
    assert out.shape == (3, 4, 4, 4) and torch.equal(out, expected) and not torch.equal(out, other)
    assert not prefix(x.requires_grad_()).requires_grad  # no graph through the frozen modules


def test_a_parents_train_mode_never_moves_the_batchnorm_statistics() -> None:
    first, _ = two_modules()
    prefix = Prefix(((first, NO_ARCH),))
    x = torch.randn(4, 1, 8, 8) * 3 + 1
    before = {k: v.clone() for k, v in first.state_dict().items()}
    expected = prefix(x)
    nn.ModuleList([first]).train()  # e.g. the next module's trainer calls .train() on a parent
    assert first.training
    out = prefix(x)
    assert not first.training
    assert torch.equal(out, expected)  # running statistics used, not batch statistics
    for key, value in first.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_batches_are_normalised_with_the_prefix_statistics() -> None:
    images = np.array([0, 255, 102], dtype=np.uint8).repeat(4).reshape(3, 1, 2, 2)
    labels = np.array([2, 0, 1])
    prefix = Prefix((), (0.2,), (0.5,))
    batches = list(prefix.batches(images, labels, 2, torch.device("cpu")))
    assert [x.shape[0] for x, _ in batches] == [2, 1]
    x = torch.cat([b[0] for b in batches])
    assert x[:, 0, 0, 0].tolist() == pytest.approx([-0.4, 1.6, 0.4], abs=1e-6)
    assert torch.cat([b[1] for b in batches]).tolist() == [2, 0, 1]


def test_batches_pass_augmentation_through() -> None:
    images = np.arange(2 * 16, dtype=np.uint8).reshape(2, 1, 4, 4)
    plain = list(Prefix().batches(images, np.array([0, 1]), 2, torch.device("cpu")))[0][0]
    shuffled = Prefix().batches(images, np.array([0, 1]), 1, torch.device("cpu"), shuffle=True, seed=1)
    assert shuffled.shuffle and shuffled.seed == 1
    cropped = list(Prefix().batches(images, np.array([0, 1]), 2, torch.device("cpu"), crop_padding=1, seed=3))
    assert not torch.equal(cropped[0][0], plain)
