"""The node tier of a restore: a node's own staged shards read locally, the rest remotely.

On several nodes a node's local tier directory holds its ranks' shards but not the commit
marker (only the coordinator's node publishes it), so it is no whole local copy. One
process reproduces that by removing the local marker; every byte read is still checked
against the remote manifest.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from ckptstore.engine.catalog import step_name
from ckptstore.manager import CheckpointManager
from tests.tier_dirs import job_dir, make_job_dir, step_dir

#: The run of the two-node saves (its job directory is known before they start).
RUN = "two-nodes"
#: The restore's log line of where its bytes came from.
READ = r"step 5: (\d+) bytes read from the tier copy, (\d+) from the root"


def state(v: float) -> dict:
    return {"w": torch.full((1000,), v), "extra": {"v": v}}


def shard(d: str) -> str:
    return os.path.join(d, next(n for n in os.listdir(d) if n.endswith(".distcp")))


def flip(path: str) -> None:
    """Overwrite the last bytes of ``path`` (its size stays)."""
    with open(path, "r+b") as f:
        f.seek(-10, 2)
        f.write(b"xxxxxxxxxx")


@pytest.fixture
def saved(tmp_path) -> tuple[str, str]:
    """Step 5 committed remotely; its staged copy without a marker (a non-coordinator
    node's local tier directory). Returns (remote step dir, local step dir)."""
    root, staging = str(tmp_path / "root"), str(tmp_path / "nvme")
    with CheckpointManager(root, local_tier_dir=staging, background="thread") as mgr:
        mgr.save(5, state(5.0))
    local = step_dir(staging, 5)
    os.remove(os.path.join(local, "COMMITTED"))
    return os.path.join(root, step_name(5)), local


def restore(remote: str, local: str) -> dict:
    out = state(0.0)
    root, staging = os.path.dirname(remote), os.path.dirname(os.path.dirname(local))
    with CheckpointManager(root, local_tier_dir=staging, background="thread") as mgr:
        assert mgr.restore(out) == 5
    return out


def test_own_shards_are_read_locally(saved, caplog) -> None:
    remote, local = saved
    flip(shard(remote))  # the restore can only be right if it reads the local shard
    caplog.set_level("INFO", logger="ckptstore.manager")
    out = restore(remote, local)
    assert torch.equal(out["w"], state(5.0)["w"]) and out["extra"] == {"v": 5.0}
    assert "from the tier copy" in caplog.text
    read = re.search(READ, caplog.text)
    assert read and int(read[1]) >= 4000  # the tensor's bytes came from the local shard


def test_a_damaged_tier_shard_falls_back_to_the_root(saved, caplog) -> None:
    remote, local = saved
    flip(shard(local))
    caplog.set_level("INFO", logger="ckptstore.manager")
    with pytest.warns(RuntimeWarning, match="tier files of step 5 .* could not be restored"):
        out = restore(remote, local)
    assert torch.equal(out["w"], state(5.0)["w"])
    assert "from the root " in caplog.text


def test_a_local_shard_of_another_size_is_not_used(saved, caplog) -> None:
    remote, local = saved
    with open(shard(local), "ab") as f:
        f.write(b"stale")
    caplog.set_level("INFO", logger="ckptstore.manager")
    out = restore(remote, local)
    assert torch.equal(out["w"], state(5.0)["w"])
    read = re.search(READ, caplog.text)
    assert read and int(read[1]) < 4000 <= int(read[2])  # the shard came from the root


# -- every node's local tier follows one retention decision (2 simulated nodes) -----------
def _two_nodes_save(rank: int, world: int, root: str, staging: str) -> dict:
    """Rank r is node r (its own local tier directory). Saves steps 1 and 2; what each node's
    local tier directory holds after each save, then what a restore read."""
    import torch.distributed as dist

    mine = os.path.join(staging, f"node{rank}")
    job = job_dir(mine, root, RUN)
    seen = {}
    with CheckpointManager(root, local_tier_dir=mine, async_save=False, run_id=RUN) as mgr:
        for step in (1, 2):
            mgr.save(step, {f"w{rank}": torch.full((1000,), float(step + rank))})
            dist.barrier()
            seen[step] = sorted(n for n in os.listdir(job) if n.startswith("step_"))
        out = {f"w{rank}": torch.zeros(1000)}
        got = mgr.restore(out)
    return {
        "seen": seen,
        "restored": got,
        "ok": torch.equal(out[f"w{rank}"], torch.full((1000,), 2.0 + rank)),
    }


@pytest.mark.processes
def test_every_nodes_local_tier_keeps_what_rank_0_decided(tmp_path) -> None:
    from harness.dist import run_distributed

    root, staging = str(tmp_path / "root"), str(tmp_path / "nvme")
    # What is not ckptstore's in node 1's directory of the job stays: a user's file, a
    # symlink named like an old step (pointing outside), a foreign file inside an old step
    # dir; and so does everything beside it in the tier (the older layout's step 0).
    node1 = os.path.join(staging, "node1")
    job = make_job_dir(node1, root, RUN)  # as the job left it earlier
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not ckptstore's")
    os.makedirs(os.path.join(job, step_name(0), "x"))
    (tmp_path / "nvme" / "node1" / job / step_name(0) / "notes.txt").write_text("mine")
    (tmp_path / "nvme" / "node1" / job / "notes.txt").write_text("mine")
    os.makedirs(os.path.join(node1, step_name(0)))
    (tmp_path / "nvme" / "node1" / step_name(0) / "__0_0.distcp").write_text("old layout")
    os.symlink(outside, os.path.join(job, "step_000000000x"))
    os.symlink(outside, os.path.join(job, step_name(9)))
    results = run_distributed(_two_nodes_save, 2, root, staging, timeout=240)
    for rank, r in enumerate(results):
        extra = [step_name(0), "step_000000000x", step_name(9)] if rank == 1 else []
        for step in (1, 2):
            assert r["seen"][step] == sorted([step_name(step), *extra]), (rank, step, r["seen"])
        assert r["restored"] == 2 and r["ok"]
    assert (outside / "keep.txt").read_text() == "not ckptstore's"  # no link followed
    assert (tmp_path / "nvme" / "node1" / job / step_name(0) / "notes.txt").exists()
    assert (tmp_path / "nvme" / "node1" / job / "notes.txt").exists()
    assert (tmp_path / "nvme" / "node1" / step_name(0) / "__0_0.distcp").exists()
    shards = [n for n in os.listdir(os.path.join(job, step_name(2))) if n.endswith(".distcp")]
    assert shards  # node 1's own shards of the kept step stay (its restore tier)


def test_the_local_tier_decision_is_pure_and_keeps_what_it_must() -> None:
    from ckptstore.errors import ConfigError
    from ckptstore.tier.rules import local_tier_deletions, local_tier_keeps

    assert local_tier_keeps([3, 9, 5], 1) == {9} and local_tier_keeps([3, 9, 5], 2) == {5, 9}
    assert local_tier_keeps([4], 3) == {4}
    with pytest.raises(ConfigError, match="keep_local"):
        local_tier_keeps([1], 0)
    # Older unkept steps go; a step newer than the newest kept one is left (not decided).
    assert local_tier_deletions([1, 2, 5, 7, 8], {5, 7}) == [1, 2]
    assert local_tier_deletions([1, 2], set()) == []  # no decision: nothing deleted
