"""``pipeline.routing.features``: what a module's selection reads. ``candidate_outputs`` (per image and
candidate: right or wrong, p(true class), cross-entropy; the same whatever the batch size) and
``split_features`` (a split's images through the frozen prefix, in order, labels kept)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.modules import NO_ARCH, ModuleSpec, build_module
from pipeline.routing.features import candidate_outputs, split_features
from pipeline.search.space import Arch
from pipeline.train.prefix import Prefix

A = Arch((("op@l1", "a"),))
B = Arch((("op@l1", "b"),))


class TableModule(nn.Module):
    """Logits read from a per-arch table by image index (the features' first value), in float16, so
    the float32 conversion of ``candidate_outputs`` shows."""

    def __init__(self, tables: dict[Arch, torch.Tensor]) -> None:
        super().__init__()
        self.tables = tables
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append(x.shape[0])
        rows = x[:, 0].long()  # (b,)
        return x, self.tables[arch][rows].half()  # (b, K)


def test_candidate_outputs_per_image_and_candidate() -> None:
    # image 0: A right and sure, B wrong; image 1: A wrong, B right; image 2: a tie of both classes
    tables = {A: torch.tensor([[4.0, 0.0], [2.0, 0.0], [0.0, 0.0]]),
              B: torch.tensor([[0.0, 1.0], [0.0, 3.0], [0.0, 0.0]])}
    module = TableModule(tables)
    features = torch.arange(3, dtype=torch.float32)[:, None]  # (3, 1): the image index
    labels = torch.tensor([0, 1, 1])
    correct, p_true, ce = candidate_outputs(module, features, labels, [A, B])
    assert correct.dtype == torch.bool and correct.shape == p_true.shape == ce.shape == (3, 2)
    assert correct.tolist() == [[True, False], [False, True], [False, False]]  # a tie's argmax is class 0
    expected_p = torch.sigmoid(torch.tensor([[4.0, -1.0], [-2.0, 3.0], [0.0, 0.0]]))  # p of the right class
    assert torch.allclose(p_true, expected_p, atol=1e-6)
    assert torch.allclose(ce, -expected_p.log(), atol=1e-6)
    assert p_true.dtype == ce.dtype == torch.float32  # float16 logits are read in float32


def test_candidate_outputs_match_a_real_module_and_ignore_the_batch_size() -> None:
    torch.manual_seed(0)
    spec = ModuleSpec("supernet", 4, 1, 1, ("conv3", "skip"), "conv3", head="gap")
    module = build_module(spec, 2, 3).eval()
    archs = list(module.space.enumerate())
    features = torch.randn(7, 2, 5, 5)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    whole = candidate_outputs(module, features, labels, archs)
    pieces = candidate_outputs(module, features, labels, archs, batch_size=3)  # 3 + 3 + 1 rows
    for a, b in zip(whole, pieces, strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-6)
    for j, arch in enumerate(archs):
        logits = module(features, arch)[1]
        assert torch.equal(whole[0][:, j], logits.argmax(1) == labels)
        assert torch.allclose(whole[2][:, j], F.cross_entropy(logits, labels, reduction="none"), atol=1e-6)
        assert torch.allclose(whole[1][:, j], logits.softmax(1)[torch.arange(7), labels], atol=1e-6)


def test_candidate_outputs_batches_each_candidate() -> None:
    tables = {A: torch.zeros(5, 2), B: torch.zeros(5, 2)}
    module = TableModule(tables)
    candidate_outputs(module, torch.arange(5, dtype=torch.float32)[:, None], torch.zeros(5, dtype=torch.long),
                      [A, B], batch_size=2)
    assert module.calls == [2, 2, 1, 2, 2, 1]


def test_split_features_are_the_prefix_applied_in_order() -> None:
    torch.manual_seed(0)
    first = build_module(ModuleSpec("fixed", 3, stride=2, layers=1, head="gap"), 1, 4)
    prefix = Prefix(((first, NO_ARCH),), (0.5,), (0.25,))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 1, 6, 6), dtype=np.uint8)
    labels = np.array([3, 1, 0, 2, 1])
    h, y = split_features(prefix, SimpleNamespace(images=images, labels=labels), batch_size=2)
    assert h.shape == (5, 3, 3, 3) and h.dtype == torch.float32 and h.device.type == "cpu"
    assert y.tolist() == labels.tolist() and y.device.type == "cpu"
    x = (torch.from_numpy(images).float() / 255 - 0.5) / 0.25
    assert torch.allclose(h, first(x, NO_ARCH)[0], atol=1e-5)


def test_split_features_of_an_empty_prefix_are_the_normalised_images() -> None:
    images = np.array([0, 255, 51], dtype=np.uint8).repeat(4).reshape(3, 1, 2, 2)
    split = SimpleNamespace(images=images, labels=np.array([0, 1, 2]))
    h, y = split_features(Prefix((), (0.2,), (0.5,)), split)
    assert h[:, 0, 0, 0].tolist() == pytest.approx([-0.4, 1.6, 0.0], abs=1e-6)
    assert y.dtype == torch.long
