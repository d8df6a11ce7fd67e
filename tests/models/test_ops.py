from __future__ import annotations

import pytest
import torch

from pipeline.models.ops import OPS, make_op

EXPECTED_OPS = {"conv3", "conv5", "dw3", "dw5", "ir3_e3", "ir3_e6", "ir5_e3", "ir5_e6", "skip"}


def test_registry_holds_the_documented_ops() -> None:
    assert set(OPS) == EXPECTED_OPS


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
@pytest.mark.parametrize("hw", [(7, 7), (6, 9)])
def test_every_op_keeps_the_shape(name: str, hw: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, *hw, generator=gen)  # (B, C, H, W)
    op = make_op(name, 8)
    for training in (True, False):
        op.train(training)
        assert op(x).shape == x.shape


def test_unknown_op_is_named() -> None:
    with pytest.raises(ValueError, match="conv7"):
        make_op("conv7", 8)


def test_bad_channels() -> None:
    with pytest.raises(ValueError, match="channels"):
        make_op("conv3", 0)


def test_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        OPS["mine"] = lambda c: torch.nn.Identity()  # type: ignore[index]


def test_skip_is_identity_and_has_no_weights() -> None:
    x = torch.randn(1, 4, 5, 5, generator=torch.Generator().manual_seed(1))
    op = make_op("skip", 4)
    assert torch.equal(op(x), x)
    assert sum(p.numel() for p in op.parameters()) == 0


def _params(name: str) -> int:
    return sum(p.numel() for p in make_op(name, 8).parameters())


def test_expansion_is_the_width_choice() -> None:
    assert _params("ir3_e3") < _params("ir3_e6")
    assert _params("ir5_e3") < _params("ir5_e6")
    assert _params("dw3") < _params("conv3") < _params("conv5")


def test_inverted_residual_adds_its_input() -> None:
    op = make_op("ir3_e3", 4).eval()
    for p in op.parameters():
        torch.nn.init.zeros_(p)  # body outputs exactly zero (BN weight and bias zero)
    x = torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(2))
    assert torch.equal(op(x), x)
