"""CheckpointManager(background="process"): real writer processes, real faults."""

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from ckptstore.config import WriterOptions
from ckptstore.engine.catalog import step_name
from ckptstore.errors import ConfigError, StoreAccessError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.saving.shared_stager import SharedStager
from harness.dist import run_distributed
from tests.tier_dirs import job_dir, make_job_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def model_and_optim(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, 8)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def app_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    from tests.manager.train_loop import AppState

    return {"app": AppState(model, opt), "extra": {"note": "hi", "t": torch.arange(3)}}


def assert_bitwise(a: dict, b: dict) -> None:
    """The model and optimizer state under "app" are bitwise equal."""
    (ma, oa), (mb, ob) = (x["app"].state_dict().values() for x in (a, b))
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    assert oa["state"].keys() == ob["state"].keys() and oa["state"]
    for k, st in oa["state"].items():
        assert all(torch.equal(v, ob["state"][k][n]) for n, v in st.items()), k


def staging_maps() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if "ckptstore-staging" in line]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie nobody reaped
    except FileNotFoundError:
        return True


def test_background_option_is_validated(tmp_path) -> None:
    with pytest.raises(ConfigError, match="background must be 'thread', 'process' or 'auto'"):
        CheckpointManager(str(tmp_path), background="fork")


def test_sparse_state_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="plain dense tensors.*background='thread'"):
        SharedStager().stage({"s": torch.eye(3).to_sparse()})


@pytest.mark.processes
def test_single_process_round_trip_reuses_the_staging_arena(tmp_path) -> None:
    root = str(tmp_path / "root")
    model, opt = model_and_optim(0)
    state = app_state(model, opt)
    with CheckpointManager(
        root, background="process", writer=WriterOptions(key_layout="spread")
    ) as mgr:
        mgr.save(0, state)
        train(model, opt, 2)
        state["extra"]["t"] = torch.arange(300)  # the state grew: a new arena, once
        mgr.save(1, state)
        mgr.wait()
        arena = mgr._shared.arena
        ptrs = [v.data_ptr() for v in mgr._shared.views]
        for step in (2, 3):
            train(model, opt, 1)
            mgr.save(step, state)
            mgr.wait()
            assert mgr._shared.arena is arena  # same shared memory, same slots
            assert [v.data_ptr() for v in mgr._shared.views] == ptrs
            assert mgr._shared.allocations == 2
            assert mgr._bg.last.arenas_mapped == 2  # the writer mapped it once
        assert [r.status for r in mgr.records] == ["committed"] * 4
        assert all(r.bytes > 0 and r.background_s > 0 for r in mgr.records)
        pid = mgr._bg.writer.proc.pid
    assert gone(pid) and not staging_maps()
    # the writer used the manager's key layout: shards under a two-hex-digit sub-prefix
    assert any(len(n) == 2 for n in os.listdir(os.path.join(root, step_name(3))))
    fresh_model, fresh_opt = model_and_optim(1)
    fresh = app_state(fresh_model, fresh_opt)
    fresh["extra"]["t"] = torch.zeros(300, dtype=torch.int64)
    with CheckpointManager(root) as mgr:
        assert mgr.restore(fresh) == 3
    assert_bitwise(fresh, state)
    assert torch.equal(fresh["extra"]["t"], torch.arange(300)) and fresh["extra"]["note"] == "hi"


def _two_ranks_round_trip(rank: int, world: int, tmp: str) -> bool:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tests.manager.train_loop import AppState

    # A FileStore job without MASTER_ADDR: the writers still find rank 0's store (by host
    # name). The kill test below covers the default TCPStore of an env:// job.
    dist.destroy_process_group()
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=world)
    root = os.path.join(tmp, "root")
    model, opt = model_and_optim(0)
    ddp = DDP(model)
    state = {"app": AppState(ddp, opt), f"rank{rank}": torch.full((5,), float(rank))}
    with CheckpointManager(root, background="process", strict=True) as mgr:
        for step in range(3):
            train(ddp, opt, 1)
            mgr.save(step, state)
        mgr.wait()
        assert [r.status for r in mgr.records] == ["committed"] * 3
    fm, fo = model_and_optim(7)
    fddp = DDP(fm)
    train(fddp, fo, 1)
    fresh = {"app": AppState(fddp, fo), f"rank{rank}": torch.zeros(5)}
    with CheckpointManager(root) as mgr:
        assert mgr.restore(fresh) == 2
    assert torch.equal(fresh[f"rank{rank}"], state[f"rank{rank}"])
    assert_bitwise(fresh, state)
    return True


@pytest.mark.distributed
def test_two_ranks_save_in_writer_processes_and_restore_bitwise(tmp_path) -> None:
    assert run_distributed(_two_ranks_round_trip, 2, str(tmp_path)) == [True, True]


@pytest.mark.processes
def test_writer_error_is_reported_at_the_next_save_and_training_goes_on(tmp_path) -> None:
    """A real failure inside the writer: a file stands where the step's node-local tier
    directory goes (the training process never writes a step directory of the tier)."""
    root, nvme = str(tmp_path / "root"), tmp_path / "nvme"
    mgr = CheckpointManager(root, local_tier_dir=str(nvme), background="process")
    mgr.save(1, {"w": torch.ones(100)})
    mgr.wait()
    job = Path(job_dir(str(nvme)))
    (job / step_name(2)).write_text("a file where the step's directory goes")
    mgr.save(2, {"w": torch.full((100,), 2.0)})
    while mgr.records[-1].status == "writing":  # training goes on meanwhile
        time.sleep(0.05)
    with pytest.warns(RuntimeWarning, match="background checkpoint save failed.*not a directory"):
        mgr.save(3, {"w": torch.full((100,), 3.0)})
    assert mgr.records[1].status == "failed"
    assert mgr.records[1].error.startswith("StoreAccessError")
    mgr.wait()
    assert mgr.records[2].status == "committed"
    assert mgr.steps() == [1, 3]
    (job / step_name(4)).write_text("in the way again")
    mgr.save(4, {"w": torch.ones(100)})
    with pytest.raises(StoreAccessError, match="not a directory"):
        mgr.close()  # the last save failed


@pytest.mark.processes
def test_strict_mode_raises_the_writer_error(tmp_path) -> None:
    root, nvme = str(tmp_path / "root"), str(tmp_path / "nvme")
    job = make_job_dir(nvme, root, "strict")
    (Path(job) / step_name(1)).write_text("in the way")
    mgr = CheckpointManager(
        root, local_tier_dir=nvme, background="process", strict=True, run_id="strict"
    )
    mgr.save(1, {"w": torch.ones(10)})
    with pytest.raises(StoreAccessError, match="not a directory"):
        mgr.wait()
    mgr.close()  # raised once, by wait()


def _kill_the_writer(rank: int, world: int, tmp: str) -> dict:
    os.environ.update(CKPTSTORE_CRASH_AT="mid_upload:2", CKPTSTORE_CRASH_RANK="1")
    root = os.path.join(tmp, "root")
    shm_before = set(os.listdir("/dev/shm"))
    mgr = CheckpointManager(
        root, local_tier_dir=os.path.join(tmp, f"nvme{rank}"), background="process"
    )
    state = {f"r{rank}": torch.full((1000,), 1.0)}
    mgr.save(1, state)
    mgr.wait()
    pids = [mgr._bg.writer.proc.pid]
    state[f"r{rank}"].fill_(2.0)
    mgr.save(2, state)  # rank 1's writer is killed half-way through its upload
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mgr.wait()
    message = "\n".join(str(w.message) for w in caught)
    del os.environ["CKPTSTORE_CRASH_AT"]  # the next writer must not crash
    out = {f"r{rank}": torch.zeros(1000)}
    restored = mgr.restore(out)  # the previous checkpoint is intact
    assert torch.equal(out[f"r{rank}"], torch.full((1000,), 1.0))
    state[f"r{rank}"].fill_(3.0)
    mgr.save(3, state)  # every rank starts a new writer
    mgr.wait()
    pids.append(mgr._bg.writer.proc.pid)
    statuses = [r.status for r in mgr.records]
    steps = mgr.steps()
    mgr.close()
    time.sleep(0.2)
    return {
        "message": message,
        "restored": restored,
        "statuses": statuses,
        "steps": steps,
        "gone": [gone(p) for p in pids],
        "new_pid": pids[0] != pids[1],
        "maps": staging_maps(),
        "shm_new": sorted(n for n in set(os.listdir("/dev/shm")) - shm_before if "ckpt" in n),
    }


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.alone  # counts new /dev/shm segments: a load beside it makes some
def test_killed_writer_fails_its_step_keeps_the_last_checkpoint_and_is_replaced(
    tmp_path,
) -> None:
    results = run_distributed(_kill_the_writer, 2, str(tmp_path))
    for rank, r in enumerate(results):
        assert "writer process of rank 1" in r["message"], (rank, r["message"])
        assert "killed by SIGKILL" in r["message"] and "step 2 was not committed" in r["message"]
        assert "checkpoints committed before it are intact" in r["message"]
        assert r["restored"] == 1
        assert r["statuses"] == ["committed", "failed", "committed"]
        assert r["steps"] == [1, 3]
        assert r["gone"] == [True, True] and r["new_pid"]
        assert r["maps"] == [] and r["shm_new"] == []


@pytest.mark.processes
def test_writer_killed_between_saves_is_replaced_at_the_next_save(tmp_path, caplog) -> None:
    with CheckpointManager(str(tmp_path), background="process", strict=True) as mgr:
        mgr.save(1, {"w": torch.ones(10)})
        mgr.wait()
        old = mgr._bg.writer.proc
        os.kill(old.pid, signal.SIGKILL)
        old.wait()
        mgr.save(2, {"w": torch.full((10,), 2.0)})  # nothing was lost: no error
        mgr.wait()
        assert mgr._bg.writer.proc.pid != old.pid
        assert [r.status for r in mgr.records] == ["committed", "committed"]
    assert "was killed by SIGKILL (kill -9, or the out-of-memory killer) between saves" in (
        caplog.text
    )
    assert mgr.steps() == [1, 2]


@pytest.mark.processes
def test_writer_exits_when_the_training_process_is_killed(tmp_path) -> None:
    code = (
        "import os, signal, torch\n"
        "from ckptstore.manager import CheckpointManager\n"
        f"m = CheckpointManager({str(tmp_path)!r}, background='process')\n"
        "m.save(1, {'w': torch.ones(10)})\n"
        "m.wait()\n"
        "print(m._bg.writer.proc.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(pid)
