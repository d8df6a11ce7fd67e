"""Data-parallel training of one module under ``torchrun`` (DistributedDataParallel).

How a step is split, so that N processes compute what one process computes with the same global
batch (the reference every test compares against):

- Every rank draws the same global batch (same seed, same augmentation draws) and keeps its own
  rows of it: :func:`rank_rows` gives rank r the r-th slice of each of the step's m chunks, so the
  m paths of a supernet step see the same images, split across ranks, as in one process.
- Every rank picks the same m architectures (the arch-pick generator is seeded identically).
- Gradients are averaged by DDP; each rank's loss is a mean over equally many rows, so the average
  is the one-process loss's gradient.
- Method B's perf (one value per path) is averaged over ranks before the MLE update
  (:func:`straight_through_mean`: the value is global, the gradient stays local and is averaged by
  DDP), so P(i) is identical on every rank and equal to the one-process P(i).
- What differs: BatchNorm normalises each rank's rows with their own batch statistics (DDP's
  default; torch's ``SyncBatchNorm`` runs on GPUs only), and the running statistics kept are rank
  0's. An N-process run therefore matches one process within a tolerance, not bitwise
  (tests/train/test_distributed.py states it); without BatchNorm it matches to float rounding.

Only rank 0 writes outputs, checkpoints and MLflow runs; the stage relaunches itself under
``torchrun`` when ``train.processes`` > 1 (:func:`torchrun_command`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """The current process group's rank and size, or (0, 1) when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def launched_by_torchrun() -> bool:
    """True inside a process that ``torchrun`` started (it sets LOCAL_RANK and WORLD_SIZE)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def backend_for(device: torch.device) -> str:
    """NCCL on GPUs, gloo on CPUs."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_from_env(device: torch.device) -> World:
    """Join the process group torchrun describes in the environment (no-op outside torchrun or
    when already initialised); returns this process's :class:`World`."""
    if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend_for(device))
    return world()


def local_device(device: torch.device) -> torch.device:
    """A CUDA device per local rank under torchrun (``cuda`` -> ``cuda:LOCAL_RANK``); CPU unchanged."""
    if device.type == "cuda" and launched_by_torchrun() and device.index is None:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def torchrun_command(processes: int, module: str, argv: Sequence[str]) -> list[str]:
    """The command that reruns ``python -m module argv`` as ``processes`` ranks on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            "-m", module, *argv]


def run_ranks(processes: int, module: str, argv: Sequence[str] | None, label: str) -> int:
    """Rerun ``python -m module argv`` (``argv`` None: this process's own arguments) as ``processes``
    ranks under ``torchrun``, saying so as ``label``; returns its exit status."""
    command = torchrun_command(processes, module, sys.argv[1:] if argv is None else argv)
    print(f"{label}: {processes} processes: {' '.join(command)}", flush=True)
    return subprocess.run(command, check=False).returncode


def check_split(batch_size: int, chunks: int, w: World) -> None:
    """A global batch must split into ``chunks`` x ``w.size`` equal parts (else the ranks' losses
    would not average to the one-process loss)."""
    if w.distributed and batch_size % (chunks * w.size):
        raise ValueError(f"train.batch_size {batch_size} must be a multiple of {chunks * w.size} "
                         f"({chunks} chunk(s) per step x {w.size} processes) for data-parallel training")


def rank_rows(batch_size: int, chunks: int, w: World) -> torch.Tensor:
    """Rows (B / size,) of a global batch of ``batch_size`` that rank ``w.rank`` trains on: the
    rank's slice of each of the ``chunks`` consecutive chunks, in chunk order, so that splitting the
    rows into ``chunks`` parts gives the rank's share of every chunk."""
    check_split(batch_size, chunks, w)
    per_chunk, per_rank = batch_size // chunks, batch_size // chunks // w.size
    starts = torch.arange(chunks) * per_chunk + w.rank * per_rank  # (chunks,)
    return (starts[:, None] + torch.arange(per_rank)).reshape(-1)  # (B / size,)


def all_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of a detached tensor over the ranks (itself without a process group)."""
    w = world()
    out = t.detach().clone()
    if w.distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out /= w.size
    return out


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of a detached tensor over the ranks (itself without a process group)."""
    out = t.detach().clone()
    if world().distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def straight_through_mean(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the ranks' mean as its value and its own gradient (identity in one process)."""
    if not world().distributed:
        return t
    return t + (all_mean(t) - t.detach())


def sync_buffers(module: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm running statistics) on every rank. DDP broadcasts them before each
    forward; after the last step each rank holds its own, so training ends with this."""
    if world().distributed:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def finish() -> None:
    """Leave the process group (no-op without one)."""
    if world().distributed:
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if world().distributed:
        dist.barrier()


def wrap(net: nn.Module, device: torch.device, *, find_unused: bool) -> nn.Module:
    """``net`` under DistributedDataParallel when a process group exists (else ``net`` itself).
    ``find_unused``: a supernet step leaves the unpicked ops without gradients."""
    if not world().distributed:
        return net
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(net, device_ids=ids, find_unused_parameters=find_unused)
