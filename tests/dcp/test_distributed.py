"""Multi-process DCP save -> load through ckptstore on real gloo process groups."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import ckptstore
from harness.dist import DistributedRunError, run_distributed

pytestmark = pytest.mark.distributed


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: int, rank: int) -> None:
    for i in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + i)
        loss = model(torch.randn(8, 32, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def flat_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    out = {f"model.{k}": v.detach().clone() for k, v in msd.items()}
    for pid, st in osd["state"].items():
        for k, v in st.items():
            out[f"optim.{pid}.{k}"] = v.detach().clone() if torch.is_tensor(v) else v
    return out


def _per_rank_tensors(rank: int, world: int, path: str) -> bool:
    """Each rank saves its own tensors plus a replicated one; all ranks load all of them."""
    sd = {f"r{r}": torch.full((1000, 10), float(r)) for r in range(world)}
    sd["shared"] = torch.arange(50.0)
    ckptstore.save(sd, path)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    ckptstore.load(out, path)
    return all(torch.equal(out[k], sd[k]) for k in sd)


@pytest.mark.parametrize("world", [2, 4])
def test_round_trip_bitwise(tmp_path, world) -> None:
    path = str(tmp_path / "step_000000010")
    assert run_distributed(_per_rank_tensors, world, path) == [True] * world
    files = [n for n in os.listdir(path) if n.endswith(".distcp")]
    assert len(files) == world  # DCP dedups the replicated tensor onto one rank


def _model_and_adamw(rank: int, world: int, path: str) -> bool:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, opt, 3, rank=0)  # identical on every rank (replicated)
    msd, osd = get_state_dict(model, opt)
    ckptstore.save({"model": msd, "optim": osd}, path)
    expected = flat_state(model, opt)

    model2 = make_model(seed=99)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    train_steps(model2, opt2, 1, rank=0)  # create optimizer state to be overwritten
    msd2, osd2 = get_state_dict(model2, opt2)
    state = {"model": msd2, "optim": osd2}
    ckptstore.load(state, path)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = flat_state(model2, opt2)
    return sorted(got) == sorted(expected) and all(
        torch.equal(got[k], expected[k]) if torch.is_tensor(got[k]) else got[k] == expected[k]
        for k in expected
    )


def test_model_and_adamw_state(tmp_path) -> None:
    assert run_distributed(_model_and_adamw, 2, str(tmp_path / "step_000000003")) == [True] * 2


def _ddp_save(rank: int, world: int, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, opt, 2, rank)  # different data per rank; DDP all-reduces gradients
    msd, osd = get_state_dict(model, opt)
    ckptstore.save({"model": msd, "optim": osd}, path)
    torch.save(flat_state(model, opt), f"{path}.expected.{rank}")


def _ddp_load(rank: int, world: int, path: str) -> bool:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(seed=5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, opt, 1, rank)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    ckptstore.load(state, path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    expected = torch.load(f"{path}.expected.0", weights_only=True)
    got = flat_state(model, opt)
    return all(
        torch.equal(got[k], v) if torch.is_tensor(v) else got[k] == v for k, v in expected.items()
    )


def test_ddp_replicated_model_reloads_on_other_world_size(tmp_path) -> None:
    path = str(tmp_path / "step_000000002")
    run_distributed(_ddp_save, 2, path)
    assert run_distributed(_ddp_load, 1, path) == [True]
    assert run_distributed(_ddp_load, 2, path) == [True, True]


def _fsdp_model(world: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = make_model(seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _fsdp_save(rank: int, world: int, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = _fsdp_model(world, seed=0)
    train_steps(model, opt, 2, rank)
    msd, osd = get_state_dict(model, opt)
    ckptstore.save({"model": msd, "optim": osd}, path)
    full = flat_state(model, opt)  # gathers the full tensors (a collective)
    if rank == 0:
        torch.save(full, f"{path}.expected")


def _fsdp_load(rank: int, world: int, path: str) -> bool:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, opt = _fsdp_model(world, seed=7)
    train_steps(model, opt, 1, rank)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    ckptstore.load(state, path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = flat_state(model, opt)
    expected = torch.load(f"{path}.expected", weights_only=True)
    return sorted(got) == sorted(expected) and all(
        torch.equal(got[k], v) if torch.is_tensor(v) else got[k] == v for k, v in expected.items()
    )


def test_fsdp2_sharded_state_reshards_4_to_2_and_1(tmp_path) -> None:
    path = str(tmp_path / "step_000000002")
    run_distributed(_fsdp_save, 4, path)
    assert len([n for n in os.listdir(path) if n.endswith(".distcp")]) == 4
    assert run_distributed(_fsdp_load, 2, path) == [True, True]
    assert run_distributed(_fsdp_load, 1, path) == [True]


def _one_rank_fails(rank: int, world: int, path: str) -> str:
    from ckptstore.errors import StorageFullError
    from ckptstore.stores.local import LocalStore
    from ckptstore.testing.faults import Fault, FaultyStore

    store = LocalStore(path)
    if rank == 1:
        store = FaultyStore(store, [Fault("put", error=StorageFullError("injected ENOSPC"))])
    try:
        ckptstore.save({f"t{rank}": torch.ones(100) * rank}, ckptstore.dcp.writer.CkptWriter(store))
    except ckptstore.CkptStoreError as exc:
        dist.barrier()  # still in step with the other rank: nobody hangs
        return f"{type(exc).__name__}: {exc}"
    return "saved"


def test_one_rank_failing_fails_every_rank_and_commits_nothing(tmp_path) -> None:
    path = str(tmp_path / "step_000000004")
    results = run_distributed(_one_rank_fails, 2, path, timeout=120)
    assert all(r.startswith("StorageFullError: injected ENOSPC (rank 1)") for r in results)
    assert not os.path.exists(os.path.join(path, "COMMITTED"))
    with pytest.raises(ckptstore.IncompleteCheckpointError):
        ckptstore.reader(path)


def _raises(rank: int, world: int) -> None:
    raise ValueError(f"rank {rank} fails")


def test_harness_reports_rank_failures() -> None:
    with pytest.raises(DistributedRunError, match="rank 0 fails"):
        run_distributed(_raises, 2)
