"""DCP on real gloo groups: sharded DTensor resharding, replicated (deduplicated) state,
the async process executor, ``use_collectives=False``, FSDP2 resharding (after PyTorch's
own e2e, DTensor and FSDP2 checkpoint tests). Two ranks; four only to reshard FSDP2."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ckptstore.errors import ConfigError
from harness.dist import run_distributed
from tests.dcp_conformance.conftest import Backend

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore::UserWarning")]

FULL = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8) / 7


def _sharded_then_replicated(rank: int, world: int, backend: Backend) -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    sd = {"w": distribute_tensor(FULL, mesh, [Shard(0)]), "step": 3}
    dcp.save(sd, storage_writer=backend.writer("sharded"))
    target = {"w": distribute_tensor(torch.zeros_like(FULL), mesh, [Shard(1)]), "step": 0}
    dcp.load(target, storage_reader=backend.reader("sharded"))
    assert torch.equal(target["w"].full_tensor(), FULL) and target["step"] == 3
    # replicated state (plain DDP): the same key and tensor on every rank, deduplicated
    dcp.save({"bias": torch.ones(5) * 2}, storage_writer=backend.writer("replicated"))
    back = {"bias": torch.zeros(5)}
    dcp.load(back, storage_reader=backend.reader("replicated"))
    assert torch.equal(back["bias"], torch.ones(5) * 2)
    # a replicated DTensor loads into any placement
    rep = {"w": distribute_tensor(torch.zeros_like(FULL), mesh, [Replicate()])}
    dcp.load(rep, storage_reader=backend.reader("sharded"))
    assert torch.equal(rep["w"].to_local(), FULL)
    return True


def test_dtensor_reshards_and_replicated_state_commits(backend):
    assert run_distributed(_sharded_then_replicated, 2, backend) == [True, True]
    # saved on two ranks, loaded whole on one process
    full = {"w": torch.zeros_like(FULL), "step": 0}
    dcp.load(full, storage_reader=backend.reader("sharded"), no_dist=True)
    assert torch.equal(full["w"], FULL) and full["step"] == 3


def _replicated_staged(rank: int, world: int, backend: Backend, staging: str) -> bool:
    local = os.path.join(staging, f"rank{rank}")
    writer = backend.writer("c", local_tier_dir=local) if backend.is_ckptstore else None
    # every rank holds the same key and tensor: deduplication leaves one rank no writes
    dcp.save({"w": FULL.clone()}, storage_writer=writer or backend.writer("c"))
    back = {"w": torch.zeros_like(FULL)}
    dcp.load(back, storage_reader=backend.reader("c"))
    assert torch.equal(back["w"], FULL)
    return True


@pytest.mark.slow
def test_replicated_state_with_local_staging(backend, tmp_path):
    assert run_distributed(_replicated_staged, 2, backend, str(tmp_path / "nvme")) == [True] * 2


def _async_process(rank: int, world: int, backend: Backend) -> bool:
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    sd = {"w": FULL * (rank + 1), "own": torch.full((3,), float(rank))}
    sd = {f"r{rank}.{k}": v for k, v in sd.items()}
    pg = dist.new_group(backend="gloo")
    fut = dcp.async_save(
        sd,
        storage_writer=backend.writer("c"),
        async_checkpointer_type=AsyncCheckpointerType.PROCESS,
        process_group=pg,
    )
    (fut.upload_completion if hasattr(fut, "upload_completion") else fut).result(timeout=180)
    back = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(back, storage_reader=backend.reader("c"), process_group=pg)
    assert all(torch.equal(back[k], v) for k, v in sd.items())
    return True


@pytest.mark.slow
def test_async_save_with_the_process_executor(backend):
    ranks = run_distributed(_async_process, 2, backend, timeout=300, daemon=False)
    assert ranks == [True, True]


def _no_collectives(rank: int, world: int, backend: Backend) -> bool:
    sd = {f"rank{rank}": torch.full((4,), float(rank))}
    if backend.is_ckptstore:  # refused at once on every rank, with what to do instead
        with pytest.raises(ConfigError, match="use_collectives=True"):
            dcp.save(sd, storage_writer=backend.writer("c"), use_collectives=False)
        return True
    dcp.save(sd, storage_writer=backend.writer("c"), use_collectives=False)
    dist.barrier()
    back = {f"rank{rank}": torch.zeros(4)}
    dcp.load(back, storage_reader=backend.reader("c"))
    assert torch.equal(back[f"rank{rank}"], sd[f"rank{rank}"])
    return True


@pytest.mark.slow
def test_save_without_collectives_into_one_directory(backend):
    """Stock DCP writes a checkpoint per rank; ckptstore refuses (one commit per step)."""
    assert run_distributed(_no_collectives, 2, backend) == [True, True]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _fsdp2(rank: int, world: int, backend: Backend, mode: str) -> dict[str, bytes]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if mode == "save":
        g = torch.Generator().manual_seed(rank)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 16, generator=g)).square().mean().backward()
            opt.step()
    msd, osd = get_model_state_dict(model), get_optimizer_state_dict(model, opt)
    if mode == "save":
        dcp.save({"model": msd, "optim": osd}, storage_writer=backend.writer("fsdp"))
    else:
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, storage_reader=backend.reader("fsdp"))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    # raw bytes, not tensors: a tensor in the result queue outlives its process's memory
    return {k: v.full_tensor().numpy().tobytes() for k, v in get_model_state_dict(model).items()}


@pytest.mark.slow
def test_fsdp2_saved_on_four_ranks_loads_on_two(backend):
    saved = run_distributed(_fsdp2, 4, backend, "save", timeout=300)[0]
    loaded = run_distributed(_fsdp2, 2, backend, "load", timeout=300)
    for got in loaded:
        assert saved.keys() == got.keys()
        assert all(saved[k] == got[k] for k in saved)  # bitwise
