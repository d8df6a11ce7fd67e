from __future__ import annotations

import random

import pytest
import torch

from pipeline.models.cascade import Cascade, CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import count_macs
from pipeline.models.modules import (
    ExitHead,
    FixedModule,
    ModuleSpec,
    SupernetModule,
    build_module,
    confidence,
)
from pipeline.models.ops import OPS, DepthwiseSeparable, make_op
from pipeline.search.space import Arch, SearchSpace

ALL_OPS = tuple(sorted(OPS))


def random_arch(space: SearchSpace, rng: random.Random) -> Arch:
    return space.make({d.label: rng.choice(d.choices) for d in space.decisions})


def supernet(stride: int = 2, layers: int = 3) -> SupernetModule:
    spec = ModuleSpec("supernet", 8, stride, layers, ALL_OPS, "ir3_e3")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return SupernetModule(spec, in_channels=3, num_classes=5)


def images(b: int = 2, c: int = 3, hw: int = 11, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, c, hw, hw, generator=torch.Generator().manual_seed(seed))  # (B, C, H, W)


# ---- ModuleSpec ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "item"),
    [
        ({"kind": "mystery"}, "kind"),
        ({"channels": 0}, "channels"),
        ({"channels": 2.5}, "channels"),
        ({"stride": 3}, "stride"),
        ({"layers": -1}, "layers"),
        ({"layers": 0}, "layers"),
        ({"ops": ("conv3", "conv7")}, "conv7"),
        ({"ops": ("conv3", "conv3")}, "repeated"),
        ({"ops": ("conv3",), "default_op": "conv3"}, "at least 2"),
        ({"default_op": "dw5"}, "default_op"),
        ({"ops": ("conv3", "skip"), "default_op": "skip"}, "skip"),
        ({"ops": "conv3"}, "ops"),
    ],
)
def test_bad_module_spec_names_the_item(kwargs: dict, item: str) -> None:
    base = {
        "kind": "supernet",
        "channels": 8,
        "stride": 1,
        "layers": 2,
        "ops": ("conv3", "dw3"),
        "default_op": "conv3",
    }
    with pytest.raises(ValueError, match=item):
        ModuleSpec(**{**base, **kwargs})


def test_fixed_spec_rejects_supernet_fields() -> None:
    with pytest.raises(ValueError, match="supernet modules only"):
        ModuleSpec("fixed", 8, ops=("conv3", "dw3"))
    with pytest.raises(ValueError, match="default_op of a fixed module must be one of"):
        ModuleSpec("fixed", 8, default_op="skip")


def test_fixed_module_layers_run_its_default_op() -> None:
    """default_op names the op of a fixed module's layers; empty keeps conv3 (modules saved before load)."""
    plain = FixedModule(ModuleSpec("fixed", 8, 2, 2), 1, 4)
    separable = FixedModule(ModuleSpec("fixed", 8, 2, 3, default_op="dw3"), 1, 4)
    assert all(type(layer) is type(make_op("conv3", 8)) for layer in plain.layers)
    assert len(separable.layers) == 3 and all(type(layer) is DepthwiseSeparable for layer in separable.layers)
    features, logits = separable(torch.randn(2, 1, 12, 12))
    assert features.shape == (2, 8, 6, 6) and logits.shape == (2, 4)
    assert count_macs(separable, (1, 12, 12)) < count_macs(FixedModule(ModuleSpec("fixed", 8, 2, 3), 1, 4),
                                                           (1, 12, 12))


def test_spec_from_dict_is_hashable_and_strict() -> None:
    raw = {"kind": "supernet", "channels": 8, "ops": ["conv3", "dw3"], "default_op": "dw3"}
    spec = ModuleSpec.from_dict(raw)
    assert spec.ops == ("conv3", "dw3")
    assert hash(spec) == hash(ModuleSpec("supernet", 8, ops=("conv3", "dw3"), default_op="dw3"))
    with pytest.raises(ValueError, match="chanels"):
        ModuleSpec.from_dict({"kind": "fixed", "chanels": 8})


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("hw", [7, 8, 11])
def test_output_shape_matches_forward(stride: int, hw: int) -> None:
    spec = ModuleSpec("fixed", 6, stride, 1)
    module = FixedModule(spec, 3, 4)
    features, _ = module(images(hw=hw))
    assert tuple(features.shape[1:]) == spec.output_shape((3, hw, hw))


@pytest.mark.parametrize(("stride", "pools", "hw"), [(1, 1, 28), (1, 2, 28), (1, 2, 48), (2, 1, 11), (1, 3, 64)])
def test_a_pooling_module_reads_its_exit_at_a_fraction_of_the_side(stride: int, pools: int, hw: int) -> None:
    spec = ModuleSpec("fixed", 6, stride, 3, pools=pools)
    module = FixedModule(spec, 3, 4)
    features, logits = module(images(hw=hw))
    assert tuple(features.shape[1:]) == spec.output_shape((3, hw, hw)) and logits.shape == (2, 4)
    assert features.shape[-1] == ((hw - 1) // stride + 1) // 2**pools
    unpooled = FixedModule(ModuleSpec("fixed", 6, stride, 3), 3, 4)
    assert module.state_dict().keys() == unpooled.state_dict().keys()  # pools have no weights: old files load
    assert count_macs(module, (3, hw, hw)) < count_macs(unpooled, (3, hw, hw))  # later layers at a smaller side


def test_a_pooling_modules_export_runs_the_same_path() -> None:
    module = FixedModule(ModuleSpec("fixed", 6, 1, 3, pools=2), 3, 4).eval()
    exported = module.export().eval()
    x = images(hw=16)
    assert torch.equal(module(x)[0], exported(x)[0]) and torch.equal(module(x)[1], exported(x)[1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "fixed", "layers": 1, "pools": 2}, "at least that many layers"),
    ({"kind": "fixed", "layers": 2, "pools": -1}, "pools must be an int >= 0"),
    ({"kind": "supernet", "layers": 2, "pools": 1, "ops": ("conv3", "dw3"), "default_op": "conv3"}, "fixed module"),
])
def test_bad_pools_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModuleSpec(channels=8, **kwargs)


# ---- modules -------------------------------------------------------------------------------


def test_exit_head_gives_logits() -> None:
    assert ExitHead(8, 5)(torch.zeros(3, 8, 4, 4)).shape == (3, 5)
    assert ExitHead(8, 5, "pool_mlp", grid=2, hidden=6)(torch.zeros(3, 8, 7, 7)).shape == (3, 5)


def test_pool_mlp_head_keeps_position_and_costs_what_it_should() -> None:
    from pipeline.models.cost import count_macs

    head = ExitHead(8, 5, "pool_mlp", grid=4, hidden=16)
    assert count_macs(head, (8, 28, 28)) == 8 * 16 * 16 + 16 * 5
    assert count_macs(ExitHead(8, 5, "gap"), (8, 28, 28)) == 8 * 5
    # A global pool cannot tell a blob on the left from one on the right; a 4x4 grid can.
    left, right = torch.zeros(1, 8, 8, 8), torch.zeros(1, 8, 8, 8)
    left[..., :, :2], right[..., :, -2:] = 1.0, 1.0
    gap = ExitHead(8, 5, "gap")
    assert torch.equal(gap.pool(left), gap.pool(right))
    assert not torch.equal(head.pool(left), head.pool(right))


@pytest.mark.parametrize("field,value", [("head", "attention"), ("head_grid", 0), ("head_hidden", -1)])
def test_spec_rejects_bad_head_fields(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"ModuleSpec.{field}"):
        ModuleSpec("fixed", 8, **{field: value})


def test_spec_head_reaches_the_module() -> None:
    module = build_module(ModuleSpec("fixed", 8, head="pool_mlp", head_grid=2, head_hidden=12), 1, 3)
    assert module.head.pool.output_size == 2 and module.head.fc.in_features == 12
    gap = build_module(ModuleSpec("fixed", 8, head="gap"), 1, 3)
    assert gap.head.fc.in_features == 8


def test_supernet_space_and_default_arch() -> None:
    module = supernet()
    assert module.space.labels == ("op@l1", "op@l2", "op@l3")
    assert all(d.choices == ALL_OPS for d in module.space.decisions)
    assert module.default_arch().as_dict() == {"op@l1": "ir3_e3", "op@l2": "ir3_e3", "op@l3": "ir3_e3"}


def test_every_sampled_path_gives_the_module_shape() -> None:
    module = supernet(stride=2)
    rng = random.Random(0)
    x = images(hw=11)
    for _ in range(12):
        features, logits = module(x, random_arch(module.space, rng))
        assert features.shape == (2, 8, 6, 6)
        assert logits.shape == (2, 5)


def test_only_the_chosen_ops_run() -> None:
    module = supernet(layers=2)
    arch = module.space.make({"op@l1": "dw5", "op@l2": "ir5_e6"})
    _, logits = module(images(), arch)
    logits.sum().backward()
    for label, layer in zip(module.space.labels, module.layers, strict=True):
        for name, op in layer.items():
            grads = [p.grad for p in op.parameters()]
            if name == arch[label]:
                assert all(g is not None for g in grads)
            else:
                assert all(g is None for g in grads)


def test_arch_outside_the_space_is_rejected() -> None:
    module = supernet(layers=2)
    with pytest.raises(ValueError):
        module(images(), Arch((("op@l1", "conv3"),)))
    with pytest.raises(ValueError):
        module(images(), Arch((("op@l1", "conv3"), ("op@l2", "conv9"))))
    with pytest.raises(ValueError):
        FixedModule(ModuleSpec("fixed", 4), 3, 2)(images(), Arch((("op@l1", "conv3"),)))


def test_export_equals_the_supernet_path() -> None:
    module = supernet().eval()
    rng = random.Random(1)
    x = images(b=4)
    with torch.no_grad():
        for _ in range(6):
            arch = random_arch(module.space, rng)
            subnet = module.export(arch).eval()
            f_super, z_super = module(x, arch)
            f_sub, z_sub = subnet(x)
            assert torch.allclose(f_super, f_sub) and torch.allclose(z_super, z_sub)
            assert subnet.arch == arch


def test_export_is_independent_of_the_supernet() -> None:
    module = supernet().eval()
    arch = module.default_arch()
    subnet = module.export(arch)
    before = [p.clone() for p in module.parameters()]
    with torch.no_grad():
        for p in subnet.parameters():
            p.add_(1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_fixed_module_surface() -> None:
    module = FixedModule(ModuleSpec("fixed", 6, 2, 2), 3, 4).eval()
    assert module.space.size() == 1 and module.default_arch() == Arch()
    assert len(module.layers) == 2
    x = images()
    with torch.no_grad():
        features, logits = module(x, module.default_arch())
        f_sub, z_sub = module.export().eval()(x)
    assert features.shape == (2, 6, 6, 6) and logits.shape == (2, 4)
    assert torch.allclose(features, f_sub) and torch.allclose(logits, z_sub)


def test_build_module_picks_the_kind() -> None:
    assert isinstance(build_module(ModuleSpec("fixed", 4), 1, 3), FixedModule)
    spec = ModuleSpec("supernet", 4, ops=("conv3", "skip"), default_op="conv3")
    assert isinstance(build_module(spec, 1, 3), SupernetModule)
    with pytest.raises(ValueError, match="kind"):
        FixedModule(spec, 1, 3)


def test_confidence() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.4, 0.2]]))  # (B, K)
    assert torch.allclose(confidence(logits), torch.tensor([0.7, 0.4]))
    assert torch.allclose(confidence(logits, "margin"), torch.tensor([0.5, 0.0]), atol=1e-6)
    with pytest.raises(ValueError, match="entropy"):
        confidence(logits, "entropy")


# ---- cascade -------------------------------------------------------------------------------

CASCADE = {
    "in_channels": 1,
    "num_classes": 10,
    "image_size": 28,
    "modules": [
        {"kind": "fixed", "channels": 8, "stride": 2, "layers": 1},
        {
            "kind": "supernet",
            "channels": 12,
            "stride": 2,
            "layers": 2,
            "ops": ["dw3", "ir3_e3", "skip"],
            "default_op": "dw3",
        },
        {
            "kind": "supernet",
            "channels": 16,
            "stride": 1,
            "layers": 1,
            "ops": ["conv3", "ir5_e6"],
            "default_op": "conv3",
        },
    ],
}


def test_cascade_spec_from_dict_and_shapes() -> None:
    spec = CascadeSpec.from_dict(CASCADE)
    assert [m.kind for m in spec.modules] == ["fixed", "supernet", "supernet"]
    assert feature_shapes(spec) == [(1, 28, 28), (8, 14, 14), (12, 7, 7), (16, 7, 7)]


@pytest.mark.parametrize(
    ("change", "item"),
    [
        ({"num_classes": 1}, "num_classes"),
        ({"image_size": 0}, "image_size"),
        ({"modules": []}, "modules"),
        ({"colour": True}, "colour"),
        ({"modules": [{"kind": "fixed", "channels": 8, "stride": 4}]}, r"modules\[1\].*stride"),
    ],
)
def test_bad_cascade_spec_names_the_item(change: dict, item: str) -> None:
    with pytest.raises(ValueError, match=item):
        CascadeSpec.from_dict({**CASCADE, **change})


def test_build_is_deterministic_and_leaves_global_rng_alone() -> None:
    spec = CascadeSpec.from_dict(CASCADE)
    state = torch.random.get_rng_state()
    a, b, c = build_modules(spec, seed=3), build_modules(spec, seed=3), build_modules(spec, seed=4)
    assert torch.equal(state, torch.random.get_rng_state())
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_forward_all_returns_every_exit() -> None:
    spec = CascadeSpec.from_dict(CASCADE)
    cascade = Cascade.build(spec, seed=0)
    logits = cascade.forward_all(images(b=3, c=1, hw=28), cascade.default_archs())
    assert [z.shape for z in logits] == [(3, 10)] * 3
    with pytest.raises(ValueError, match="one arch per module"):
        cascade.forward_all(images(c=1, hw=28), cascade.default_archs()[:2])
