"""``pipeline.models.store``: a trained module on disk. ``ModuleInfo``'s JSON form (and back, tuples
restored), ``save_module`` then ``load_module`` giving the same weights, buffers and outputs in eval
mode, and each way a module directory can be broken (a file missing, unreadable JSON, a spec that does
not fit the weights) named with the directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.models.modules import ModuleSpec, SupernetModule, build_module
from pipeline.models.store import ModuleInfo, load_module, save_module

SPEC = ModuleSpec("supernet", 4, 2, 2, ("conv3", "dw3", "skip"), "dw3", head="pool_mlp", head_grid=2,
                  head_hidden=5)
INFO = ModuleInfo(k=2, spec=SPEC, in_channels=3, num_classes=5, input_shape=(3, 8, 8), mean=(0.1, 0.2, 0.3),
                  std=(0.5, 0.6, 0.7))


def trained_module(seed: int = 0) -> nn.Module:
    """A module with non-default weights and BatchNorm statistics, left in training mode."""
    torch.manual_seed(seed)
    module = build_module(SPEC, 3, 5)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(7)
    return module.train()


def saved(directory: Path, module: nn.Module | None = None, info: ModuleInfo = INFO) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_module(directory, trained_module() if module is None else module, info)
    return directory


def test_info_json_is_plain_and_reads_back_equal() -> None:
    d = json.loads(json.dumps(INFO.to_json()))  # JSON-serialisable as it is
    assert d["spec"]["ops"] == ["conv3", "dw3", "skip"] and d["k"] == 2 and d["spec"]["default_op"] == "dw3"
    assert d["input_shape"] == [3, 8, 8] and d["mean"] == [0.1, 0.2, 0.3]
    back = ModuleInfo.from_json(d)  # lists where tuples were
    assert back == INFO
    assert isinstance(back.input_shape, tuple) and isinstance(back.mean, tuple)
    assert isinstance(back.spec.ops, tuple)


def test_info_of_a_fixed_module_without_ops_reads_back() -> None:
    info = ModuleInfo(1, ModuleSpec("fixed", 8), 1, 10, (1, 28, 28), (0.5,), (0.25,))
    d = json.loads(json.dumps(info.to_json()))
    del d["spec"]["ops"]  # an older file may leave the default out
    assert ModuleInfo.from_json(d) == info


def test_save_then_load_gives_the_same_module_in_eval_mode(tmp_path: Path) -> None:
    module = trained_module()
    saved(tmp_path / "m2", module)
    assert sorted(p.name for p in (tmp_path / "m2").iterdir()) == ["module.json", "module.pt"]
    loaded, info = load_module(str(tmp_path / "m2"))  # a string path is fine
    assert info == INFO
    assert isinstance(loaded, SupernetModule) and not loaded.training
    expected = module.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, expected[key]), key
    x = torch.randn(2, 3, 8, 8)
    arch = loaded.space.make({"op@l1": "conv3", "op@l2": "skip"})
    with torch.no_grad():
        assert torch.equal(loaded(x, arch)[1], module.eval()(x, arch)[1])


@pytest.mark.parametrize("missing", ["module.json", "module.pt"])
def test_a_missing_file_is_named_with_the_directory(tmp_path: Path, missing: str) -> None:
    directory = saved(tmp_path / "m2")
    (directory / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"trained module missing in {directory}: .*{missing}"):
        load_module(directory)


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"trained module missing in {tmp_path / 'nowhere'}"):
        load_module(tmp_path / "nowhere")


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.pop("num_classes"), "num_classes"),  # KeyError
    (lambda d: d["spec"].update(kind="tower"), "kind"),  # ValueError from the spec
    (lambda d: d["spec"].update(channels=6), "size mismatch"),  # RuntimeError from load_state_dict
    (lambda d: d["spec"].update(ops=["conv3", "skip"], default_op="conv3"), "Unexpected key"),
])
def test_an_unreadable_module_is_named_with_the_directory(tmp_path: Path, edit, match: str) -> None:  # noqa: ANN001
    directory = saved(tmp_path / "m2")
    d = json.loads((directory / "module.json").read_text())
    edit(d)
    (directory / "module.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"trained module in {directory} is unreadable: (?s:.*){match}"):
        load_module(directory)


def test_corrupt_json_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    directory = saved(tmp_path / "m2")
    (directory / "module.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"trained module in {directory} is unreadable"):
        load_module(directory)


@pytest.mark.parametrize("corrupt", ["empty", "truncated", "garbage"])
def test_corrupt_weights_are_unreadable_not_a_crash(tmp_path: Path, corrupt: str) -> None:
    directory = saved(tmp_path / "m2")
    weights = (directory / "module.pt").read_bytes()
    content = {"empty": b"", "truncated": weights[: len(weights) // 2], "garbage": b"not a checkpoint"}
    (directory / "module.pt").write_bytes(content[corrupt])
    with pytest.raises(ValueError, match=f"trained module in {directory} is unreadable"):
        load_module(directory)
