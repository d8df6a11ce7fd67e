"""Data-parallel training (2 gloo processes on this CPU) against one process with the same global batch.

Tolerances, and why: without BatchNorm the two runs compute the same sums in a different order, so
weights agree to float32 rounding (1e-5) and P(N) (updated from the ranks' mean perf, rank
utilities) is equal to 1e-9. With BatchNorm each rank normalises its own 16 rows of a 32-image chunk
(DDP's default on CPUs; SyncBatchNorm is GPU-only), so the runs differ like two batch compositions
do: weights within 10% of their norm after 16 steps (measured: 5.0%), training accuracy within 5
points (measured: 2.3), and P(N) equal here (rank utilities only see the order of the m paths' perf,
which the BatchNorm difference did not change). Every rank always holds the same weights and the same
P(N) as rank 0 (checked exactly).
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pipeline.models.cascade import build_modules
from pipeline.models.modules import NO_ARCH
from pipeline.train import distributed
from pipeline.train.loop import train_module
from pipeline.train.prefix import Prefix
from tests.train.test_loop import MEAN, SPEC, STD, cfg, costs, pattern_data

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _strip_batchnorm(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(module, name, nn.Identity())
        else:
            _strip_batchnorm(child)


def _run(batchnorm: bool, epochs: int) -> dict:
    """Train supernet module 2 of the test cascade (module 1 frozen, untrained) in this process's
    group (or alone); its weights, P(N) table and history."""
    modules = build_modules(SPEC, seed=0)
    if not batchnorm:
        _strip_batchnorm(modules[1])
    images, labels = pattern_data(256)
    prefix = Prefix(((modules[0], NO_ARCH),), MEAN, STD)
    cost_of, cost_max = costs(modules, 1)
    result = train_module(modules[1], prefix, images, labels,
                          cfg(epochs=epochs, batch_size=32, m=2, sandwich=True, warmup_epochs=0.0),
                          cost_of=cost_of, cost_max=cost_max, exit_saving=0.5, progress=False)
    return {"state": {k: v.detach().clone() for k, v in modules[1].state_dict().items()},
            "prob": [p.clone() for p in result.prob_model.table],
            "history": result.history}


def _worker(rank: int, size: int, store: str, out: str, batchnorm: bool, epochs: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        torch.save(_run(batchnorm, epochs), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _two_processes(tmp_path: Path, batchnorm: bool, epochs: int) -> list[dict]:
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(tmp_path), batchnorm, epochs), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _rel_diff(a: dict, b: dict) -> float:
    num = sum(float((a[k].double() - b[k].double()).norm() ** 2) for k in a if a[k].is_floating_point())
    den = sum(float(b[k].double().norm() ** 2) for k in b if b[k].is_floating_point())
    return (num / den) ** 0.5


def test_rank_rows_give_each_rank_its_share_of_every_chunk() -> None:
    rows = [distributed.rank_rows(16, 2, distributed.World(r, 2)).tolist() for r in range(2)]
    assert rows == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert distributed.rank_rows(8, 1, distributed.World()).tolist() == list(range(8))
    with pytest.raises(ValueError, match="batch_size 30 must be a multiple of 4"):
        distributed.rank_rows(30, 2, distributed.World(0, 2))


def test_torchrun_command_reruns_the_module() -> None:
    cmd = distributed.torchrun_command(2, "stages.train", ["--module", "1"])
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "stages.train",
                       "--module", "1"]


def test_run_ranks_runs_torchrun_and_returns_its_status(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ran = []
    monkeypatch.setattr(distributed.subprocess, "run",
                        lambda command, check: ran.append(command) or types.SimpleNamespace(returncode=3))
    assert distributed.run_ranks(2, "stages.train", ["--module", "1"], "train@m1") == 3
    assert ran == [distributed.torchrun_command(2, "stages.train", ["--module", "1"])]
    assert capsys.readouterr().out == f"train@m1: 2 processes: {' '.join(ran[0])}\n"
    monkeypatch.setattr(distributed.sys, "argv", ["stages/train.py", "--module", "m2"])
    distributed.run_ranks(3, "stages.train", None, "train@m2")  # None: this process's own arguments
    assert ran[1][-3:] == ["stages.train", "--module", "m2"] and "--nproc-per-node=3" in ran[1]


def test_two_gloo_processes_match_one_process_without_batchnorm(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    one = _run(batchnorm=False, epochs=2)
    ranks = _two_processes(tmp_path, batchnorm=False, epochs=2)
    for key in one["state"]:  # every rank holds rank 0's weights and P(N), exactly
        assert torch.equal(ranks[0]["state"][key], ranks[1]["state"][key]), key
    for p0, p1 in zip(ranks[0]["prob"], ranks[1]["prob"], strict=True):
        assert torch.equal(p0, p1)
    for key, value in one["state"].items():
        torch.testing.assert_close(ranks[0]["state"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    for p, q in zip(ranks[0]["prob"], one["prob"], strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-9)
    assert ranks[0]["prob"][0].max() > ranks[0]["prob"][0].min()  # P(N) did move: the check has teeth
    for h, g in zip(ranks[0]["history"], one["history"], strict=True):  # the epoch records are global
        assert h["train_acc"] == pytest.approx(g["train_acc"], abs=1e-9)
        assert h["loss"] == pytest.approx(g["loss"], rel=1e-4)


def test_two_gloo_processes_with_batchnorm_stay_within_the_stated_tolerance(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    one = _run(batchnorm=True, epochs=2)
    ranks = _two_processes(tmp_path, batchnorm=True, epochs=2)
    for key in one["state"]:
        assert torch.equal(ranks[0]["state"][key], ranks[1]["state"][key]), key
    for p0, p1 in zip(ranks[0]["prob"], ranks[1]["prob"], strict=True):
        assert torch.equal(p0, p1)
    weights = [k for k in one["state"] if "running" not in k and "num_batches" not in k]
    assert _rel_diff({k: ranks[0]["state"][k] for k in weights}, {k: one["state"][k] for k in weights}) < 0.10
    for p, q in zip(ranks[0]["prob"], one["prob"], strict=True):  # rank utilities: P(N) moves only when the
        torch.testing.assert_close(p, q, rtol=0, atol=1e-9)  # order of the m paths' perf changes; it did not
    assert ranks[0]["history"][-1]["train_acc"] == pytest.approx(one["history"][-1]["train_acc"], abs=0.05)


def test_one_process_is_unchanged_by_the_distributed_code_path() -> None:
    """Outside a process group nothing is wrapped or reduced: two runs are bitwise equal."""
    assert not dist.is_initialized() and os.environ.get("WORLD_SIZE") in (None, "1")
    a, b = _run(batchnorm=True, epochs=1), _run(batchnorm=True, epochs=1)
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
