"""compute.device / compute.precision: ComputeConfig, resolve_device, autocast, fits_on_device. Runs
on a CPU-only machine: the CUDA branches' resolution logic is tested with torch.cuda monkeypatched."""

from __future__ import annotations

import contextlib

import pytest
import torch

from pipeline import device as dev
from pipeline.device import ComputeConfig
from pipeline.params.config import ConfigError
from pipeline.params.schema import params_problems


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_cpu_and_auto_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, 0)
    assert dev.resolve_device("cpu") == torch.device("cpu")
    assert dev.resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_unavailable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    fake_cuda(monkeypatch, 0)
    with pytest.raises(dev.DeviceError, match=r"compute\.device .*CUDA is not available") as info:
        dev.resolve_device(name)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ConfigError)


@pytest.mark.parametrize("name", ["gpu", "cuda:-1", "cuda:x", "CUDA", "", "cuda:", "mps"])
def test_bad_strings(name: str) -> None:
    with pytest.raises(ConfigError, match=r"--device must be auto, cpu, cuda or cuda:N"):
        dev.resolve_device(name, key="--device")


def test_cuda_branches_with_fake_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, 2)
    assert dev.resolve_device("auto") == torch.device("cuda")
    assert dev.resolve_device("cuda") == torch.device("cuda")
    assert dev.resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(dev.DeviceError, match=r"'cuda:2' but this machine has 2 CUDA device\(s\)"):
        dev.resolve_device("cuda:2")


def no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "native_bf16", lambda device: device.type == "cuda")  # a CPU without AVX512-BF16/AMX


def test_autocast_is_a_no_op_for_fp32_and_refuses_bf16_on_a_cpu_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    no_native_bf16(monkeypatch)
    cpu = torch.device("cpu")
    assert isinstance(dev.autocast(cpu, "fp32"), contextlib.nullcontext)
    x = torch.randn(4, 3)
    w = torch.randn(3, 2)
    with dev.autocast(cpu, "fp32"):
        y = x @ w
    assert torch.equal(y, x @ w) and y.dtype == torch.float32
    with pytest.raises(ConfigError, match="bf16 needs a CUDA device or a CPU with native bf16"):
        dev.autocast(cpu, "bf16")
    with pytest.raises(ConfigError, match="compute.precision must be one of"):
        dev.autocast(cpu, "fp16")


def test_autocast_bf16_on_a_cpu_with_it_runs_convolutions_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "native_bf16", lambda device: True)
    ctx = dev.autocast(torch.device("cpu"), "bf16")
    assert isinstance(ctx, torch.autocast) and ctx.device == "cpu" and ctx.fast_dtype == torch.bfloat16
    with ctx:
        y = torch.nn.functional.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    assert y.dtype == torch.bfloat16


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_autocast_bf16_on_cuda_builds_a_cuda_autocast() -> None:
    ctx = dev.autocast(torch.device("cuda"), "bf16")  # building it needs no GPU
    assert isinstance(ctx, torch.autocast)
    assert ctx.device == "cuda" and ctx.fast_dtype == torch.bfloat16


def test_fits_on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert dev.fits_on_device(10**15, torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _d=None: (1000, 4000))
    assert dev.fits_on_device(500, torch.device("cuda"))
    assert not dev.fits_on_device(501, torch.device("cuda"))
    assert dev.fits_on_device(900, torch.device("cuda"), share=0.9)
    with pytest.raises(ValueError, match="share"):
        dev.fits_on_device(1, torch.device("cpu"), share=0)


def test_compute_config_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ComputeConfig.from_params({}) == ComputeConfig(device="auto", precision="fp32")  # the section is optional
    assert ComputeConfig.from_params({"compute": None}) == ComputeConfig(device="auto", precision="fp32")
    assert ComputeConfig.from_params({"compute": {"device": "cuda:1"}}) == ComputeConfig(device="cuda:1",
                                                                                        precision="fp32")
    with pytest.raises(ConfigError, match=r"compute\.device must be auto, cpu, cuda or cuda:N.*'gpu'"):
        ComputeConfig.from_params({"compute": {"device": "gpu"}})
    with pytest.raises(ConfigError, match=r"compute\.device must be auto, cpu, cuda or cuda:N.*got 0"):
        ComputeConfig.from_params({"compute": {"device": 0}})
    with pytest.raises(ConfigError, match=r"compute\.precision must be one of"):
        ComputeConfig.from_params({"compute": {"precision": "fp16"}})
    no_native_bf16(monkeypatch)
    with pytest.raises(ConfigError, match=r"compute\.precision bf16 needs a CUDA device or a CPU with native"):
        ComputeConfig.from_params({"compute": {"device": "cpu", "precision": "bf16"}}).resolve()
    fake_cuda(monkeypatch, 0)
    assert ComputeConfig().resolve() == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"compute\.precision bf16 needs a CUDA device.*got cpu without it"):
        ComputeConfig(device="auto", precision="bf16").resolve()
    fake_cuda(monkeypatch, 1)
    assert ComputeConfig(device="auto", precision="bf16").resolve() == torch.device("cuda")


def test_schema_checks_compute() -> None:
    assert params_problems({"compute": {"device": "cuda:0", "precision": "bf16"}}, partial=True) == []
    problems = params_problems({"compute": {"device": "gpu", "precision": "fp16", "dtype": 1}}, partial=True)
    assert any(p.startswith("compute.device must be auto, cpu, cuda or cuda:N") for p in problems)
    assert any(p.startswith("compute.precision must be one of") for p in problems)
    assert any(p.startswith("compute.dtype is not a known key") for p in problems)
    # bf16 on the CPU is a question of the machine, answered at run time (ComputeConfig.resolve)
    assert params_problems({"compute": {"device": "cpu", "precision": "bf16"}}, partial=True) == []


def test_moving_modules_keeps_cpu_tensors() -> None:
    net = torch.nn.Linear(3, 2)
    weight = net.weight
    dev.to_device([net, None], torch.device("cpu"))
    assert net.weight is weight
    state = dev.cpu_state_dict(net)
    assert all(t.device.type == "cpu" for t in state.values()) and torch.equal(state["weight"], weight)
    assert type(state) is type(net.state_dict()) and hasattr(state, "_metadata")  # saved bytes as before


def test_schema_keys_match_compute_config() -> None:
    import dataclasses

    from pipeline.params.schema import COMPUTE

    assert set(COMPUTE) == {f.name for f in dataclasses.fields(ComputeConfig)}
    assert {k: v.default for k, v in COMPUTE.items()} == dataclasses.asdict(ComputeConfig())


def test_recognize_device_flag(tmp_path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from pipeline.cli import main
    from tests.routing.test_package import save_tiny, write_image_files

    model_dir = save_tiny(tmp_path / "model")[1]
    image = str(write_image_files(tmp_path / "images")["grey_png"])
    assert main(["recognize", image, "--model", str(model_dir), "--json"]) == 0  # default: auto
    auto = json.loads(capsys.readouterr().out)
    assert main(["recognize", image, "--model", str(model_dir), "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out) == auto
    fake_cuda(monkeypatch, 0)
    assert main(["recognize", image, "--model", str(model_dir), "--device", "cuda:0"]) == 2
    assert "error: --device is 'cuda:0' but CUDA is not available" in capsys.readouterr().err
    assert main(["recognize", image, "--model", str(model_dir), "--device", "gpu"]) == 2
    assert "error: --device must be auto, cpu, cuda or cuda:N" in capsys.readouterr().err


def test_pyfunc_model_device_from_env(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pipeline.registry.mlflow_models import CascadeModel
    from pipeline.registry.tracking import DEVICE_ENV
    from tests.routing.test_package import save_tiny

    context = SimpleNamespace(artifacts={"cascade": str(save_tiny(tmp_path / "model")[1])})
    model = CascadeModel()
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    model.load_context(context)  # default: cpu
    assert next(model._loaded.stages[0].module.parameters()).device.type == "cpu"
    fake_cuda(monkeypatch, 0)
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(dev.DeviceError, match="CASCADE_DEVICE is 'cuda' but CUDA is not available"):
        model.load_context(context)


def test_memory_format_converts_the_weights_and_restores_them_even_on_error() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    before = net[0].weight.detach().clone()
    with dev.memory_format([net], "channels_last"):
        assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert not net[0].weight.is_contiguous()
    assert net[0].weight.is_contiguous() and torch.equal(net[0].weight, before)  # layout only, never values
    with pytest.raises(RuntimeError, match="boom"), dev.memory_format([net], "channels_last"):
        raise RuntimeError("boom")
    assert net[0].weight.is_contiguous()
    with dev.memory_format([net], "contiguous"):
        assert net[0].weight.is_contiguous()
    with pytest.raises(ValueError, match="memory format"), dev.memory_format([net], "nhwc"):
        pass


def _conv_norm(channels: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3), torch.nn.BatchNorm2d(channels), torch.nn.ReLU())


def _hooked(norm: torch.nn.Module) -> bool:
    return bool(norm._forward_pre_hooks) or bool(norm._forward_hooks)


@pytest.mark.parametrize("channels, odd", [(4, True), (6, True), (12, True), (8, False), (16, False), (20, False),
                                           (24, False)])
def test_memory_format_runs_odd_width_norms_in_the_standard_layout_and_hands_channels_last_on(channels, odd):
    net, ref = _conv_norm(channels), _conv_norm(channels)
    x = torch.randn(4, 3, 9, 9)
    x_ref = x.clone().requires_grad_()
    ref(x_ref).square().sum().backward()
    with dev.memory_format([net], "channels_last"):
        assert _hooked(net[1]) == odd
        assert (net[1] in dev.odd_width_norms([net])) == odd
        x_cl = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        normed = net[1](net[0](x_cl))
        assert normed.is_contiguous(memory_format=torch.channels_last)  # what the next conv expects
        net[2](normed).square().sum().backward()
    assert not _hooked(net[1])  # the hooks leave with the context
    assert torch.allclose(normed.relu(), ref(x), atol=1e-5)  # the layout, never the values (to rounding)
    assert torch.allclose(x_cl.grad, x_ref.grad, atol=1e-4)
    assert torch.allclose(net[0].weight.grad, ref[0].weight.grad, atol=1e-4)


def test_memory_format_leaves_norms_alone_when_told_or_in_the_standard_layout() -> None:
    net = _conv_norm(4)
    with dev.memory_format([net], "channels_last", standard_norms=False):
        assert not _hooked(net[1])
    with dev.memory_format([net], "contiguous"):
        assert not _hooked(net[1])
    with pytest.raises(RuntimeError, match="boom"), dev.memory_format([net], "channels_last"):
        assert _hooked(net[1])
        raise RuntimeError("boom")
    assert not _hooked(net[1])


def test_as_memory_format_only_touches_4d_batches() -> None:
    x = torch.randn(2, 3, 4, 4)
    assert dev.as_memory_format(x, "channels_last").is_contiguous(memory_format=torch.channels_last)
    assert dev.as_memory_format(x, "contiguous") is x
    flat = torch.randn(2, 5)
    assert dev.as_memory_format(flat, "channels_last") is flat
