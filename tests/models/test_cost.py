from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from pipeline.models.cost import (
    count_macs,
    fixed_macs,
    measure_latency_table,
    op_mac_table,
    path_latency,
    path_macs,
)
from pipeline.models.modules import FixedModule, ModuleSpec, PlainCNN, SupernetModule, build_module
from pipeline.models.ops import OPS
from pipeline.search.space import Arch, SearchSpace

SHAPE = (3, 9, 9)


def random_arch(space: SearchSpace, rng: random.Random) -> Arch:
    return space.make({d.label: rng.choice(d.choices) for d in space.decisions})


def supernet(stride: int = 2, layers: int = 3) -> SupernetModule:
    spec = ModuleSpec("supernet", 8, stride, layers, tuple(sorted(OPS)), "conv3")
    return SupernetModule(spec, SHAPE[0], num_classes=5)


def reference_flops(module: torch.nn.Module, arch: Arch | None = None) -> int:
    x = torch.zeros(1, *SHAPE)  # (1, C, H, W)
    module.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(x) if arch is None else module(x, arch)
    return counter.get_total_flops()


def test_macs_of_one_conv_by_hand() -> None:
    conv = torch.nn.Conv2d(3, 4, 3, padding=1, groups=1)
    assert count_macs(conv, (3, 5, 5)) == 4 * 5 * 5 * 3 * 9
    depthwise = torch.nn.Conv2d(6, 6, 5, padding=2, groups=6)
    assert count_macs(depthwise, (6, 5, 5)) == 6 * 5 * 5 * 1 * 25


@pytest.mark.parametrize("stride", [1, 2])
def test_macs_match_flop_counter_on_random_paths(stride: int) -> None:
    module = supernet(stride)
    rng = random.Random(stride)
    for _ in range(6):
        arch = random_arch(module.space, rng)
        assert 2 * count_macs(module, SHAPE, arch) == reference_flops(module, arch)
        assert count_macs(module, SHAPE, arch) == count_macs(module.export(arch), SHAPE)


@pytest.mark.parametrize(("stride", "layers"), [(1, 0), (2, 2)])
def test_macs_match_flop_counter_on_fixed_modules(stride: int, layers: int) -> None:
    module = FixedModule(ModuleSpec("fixed", 6, stride, layers), SHAPE[0], 4)
    assert 2 * count_macs(module, SHAPE) == reference_flops(module)


def test_path_macs_equals_count_macs() -> None:
    module = supernet()
    table, fixed = op_mac_table(module, SHAPE), fixed_macs(module, SHAPE)
    assert set(table) == set(module.space.labels)
    assert table["op@l1"]["skip"] == 0
    for arch in [module.default_arch(), *(random_arch(module.space, random.Random(i)) for i in range(8))]:
        assert path_macs(table, fixed, arch) == count_macs(module, SHAPE, arch)


def test_fixed_module_table_is_all_fixed() -> None:
    module = FixedModule(ModuleSpec("fixed", 6, 2, 2), SHAPE[0], 4)
    assert op_mac_table(module, SHAPE) == {}
    assert path_macs({}, fixed_macs(module, SHAPE), module.default_arch()) == count_macs(module, SHAPE)


def test_path_cost_rejects_a_foreign_arch() -> None:
    module = supernet(layers=2)
    table = op_mac_table(module, SHAPE)
    with pytest.raises(ValueError, match="cost table"):
        path_macs(table, 0, Arch((("op@l1", "conv3"),)))


def test_counting_leaves_the_module_as_it_was() -> None:
    module = supernet().train()
    module.head.eval()  # a mixed state must survive too
    stats = {k: v.clone() for k, v in module.state_dict().items()}
    count_macs(module, SHAPE, module.default_arch())
    assert module.training and module.transition.training and not module.head.training
    assert all(torch.equal(stats[k], v) for k, v in module.state_dict().items())


def test_latency_table_structure() -> None:
    module = supernet(layers=2)
    table = measure_latency_table(module, SHAPE, batch_sizes=(1, 4), repeats=2, warmup=1)
    assert set(table) == {1, 4}
    for entry in table.values():
        assert entry["fixed"] > 0
        assert set(entry["layers"]) == {"op@l1", "op@l2"}
        assert all(set(ops) == set(OPS) and min(ops.values()) >= 0 for ops in entry["layers"].values())
        assert path_latency(entry["layers"], entry["fixed"], module.default_arch()) > entry["fixed"]
    assert module.training  # restored


def test_latency_table_of_a_fixed_module() -> None:
    module = FixedModule(ModuleSpec("fixed", 6, 2, 1), SHAPE[0], 4)
    table = measure_latency_table(module, SHAPE, batch_sizes=(2,), repeats=2, warmup=0)
    assert table[2]["layers"] == {} and table[2]["fixed"] > 0


@pytest.mark.parametrize("width", [8, 24])
def test_macs_match_flop_counter_on_plain_cnns(width: int) -> None:
    module = PlainCNN(width, SHAPE[0], 6)
    assert 2 * count_macs(module, SHAPE) == reference_flops(module)


def test_macs_match_flop_counter_on_the_shipped_module_specs() -> None:
    """Every module params.yaml ships (m1.., in series, on a Fashion-MNIST-sized input): the counter the
    pipeline prices exits and budgets with equals PyTorch's FlopCounterMode on each path."""
    modules = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())["modules"]
    shape: tuple[int, ...] = (1, 28, 28)
    rng = random.Random(0)
    for name, section in modules.items():
        spec = ModuleSpec.from_dict(section["spec"])
        module = build_module(spec, shape[0], 10).eval()
        archs = [module.default_arch(), *(random_arch(module.space, rng) for _ in range(3 if module.space.labels
                                                                                         else 0))]
        for arch in archs:
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                module(torch.zeros(1, *shape), arch)
            assert 2 * count_macs(module, shape, arch) == counter.get_total_flops(), name
        shape = spec.output_shape(shape)
