"""The node tier of a restore: a node's own staged shards read locally, the rest remotely.

On several nodes a node's staging directory holds its ranks' shards but not the commit
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
    node's staging dir). Returns (remote step dir, local step dir)."""
    root, staging = str(tmp_path / "root"), str(tmp_path / "nvme")
    with CheckpointManager(root, staging_dir=staging) as mgr:
        mgr.save(5, state(5.0))
    local = os.path.join(staging, step_name(5))
    os.remove(os.path.join(local, "COMMITTED"))
    return os.path.join(root, step_name(5)), local


def restore(remote: str, local: str) -> dict:
    out = state(0.0)
    root, staging = os.path.dirname(remote), os.path.dirname(local)
    with CheckpointManager(root, staging_dir=staging) as mgr:
        assert mgr.restore(out) == 5
    return out


def test_own_shards_are_read_locally(saved, caplog) -> None:
    remote, local = saved
    flip(shard(remote))  # the restore can only be right if it reads the local shard
    caplog.set_level("INFO", logger="ckptstore.manager")
    out = restore(remote, local)
    assert torch.equal(out["w"], state(5.0)["w"]) and out["extra"] == {"v": 5.0}
    assert "from the local copy" in caplog.text
    read = re.search(r"step 5: (\d+) bytes read locally, (\d+) from the remote", caplog.text)
    assert read and int(read[1]) >= 4000  # the tensor's bytes came from the local shard


def test_a_damaged_local_shard_falls_back_to_the_remote(saved, caplog) -> None:
    remote, local = saved
    flip(shard(local))
    caplog.set_level("INFO", logger="ckptstore.manager")
    with pytest.warns(RuntimeWarning, match="local files of step 5 .* could not be restored"):
        out = restore(remote, local)
    assert torch.equal(out["w"], state(5.0)["w"])
    assert "from the remote copy" in caplog.text


def test_a_local_shard_of_another_size_is_not_used(saved, caplog) -> None:
    remote, local = saved
    with open(shard(local), "ab") as f:
        f.write(b"stale")
    caplog.set_level("INFO", logger="ckptstore.manager")
    out = restore(remote, local)
    assert torch.equal(out["w"], state(5.0)["w"])
    read = re.search(r"step 5: (\d+) bytes read locally, (\d+) from the remote", caplog.text)
    assert read and int(read[1]) < 4000 <= int(read[2])  # the shard came from the remote
