"""Read once, share: a restore of replicated state from an object store reads each byte
once per job, whatever the number of ranks.

Real gloo groups (2 and 3 ranks) and SeaweedFS S3. Every rank wraps the root in a view
that counts the data bytes it reads; the parent sums them over the ranks: a DDP-like state
(replicated tensors, plus one tensor per rank) restores bitwise with the store serving
exactly the checkpoint's data bytes (a plain DCP load serves the replicated part once per
rank). A damaged range fails the restore on every rank alike (the owner reads it twice,
then every rank falls back: no rank hangs), and an owner killed mid-restore fails the
restore on the others.
"""

from __future__ import annotations

import os
import signal
import warnings
from typing import Any

import pytest
import torch

from ckptstore.engine.committed import METADATA_NAME, open_committed
from ckptstore.engine.names import step_name
from ckptstore.engine.read_owners import first_batch, plan_shares
from ckptstore.engine.store import Store
from ckptstore.manager import CheckpointManager
from ckptstore.stores import open_store
from ckptstore.testing.faults import FaultyStore
from harness.dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

STEP = 3


# -- the plan (pure) ----------------------------------------------------------------------
def test_every_shared_range_has_one_owner_and_the_bytes_are_spread() -> None:
    shared = [("a", i * 100, 100) for i in range(8)]
    needs = [shared + [(f"own{r}", 0, 50)] for r in range(4)]
    plan = plan_shares(needs, budget=250)
    assert set(plan.owners) == set(shared)
    assert all(plan.needers[k] == (0, 1, 2, 3) for k in shared)
    assert plan.read_bytes(needs) == [250] * 4  # 800 shared + 4 x 50 own, spread evenly
    assert [sum(k[2] for k in b) for b in plan.batches] == [200, 200, 200, 200]
    assert [k for b in plan.batches for k in b] == shared  # the load's order


def test_a_range_one_rank_needs_is_not_shared_and_a_large_one_is_a_batch_alone() -> None:
    needs = [[("x", 0, 10), ("big", 0, 1000)], [("big", 0, 1000), ("y", 0, 10)]]
    plan = plan_shares(needs, budget=100)
    assert plan.owners == {("big", 0, 1000): 0}
    assert plan.batches == ((("big", 0, 1000),),)
    assert plan.read_bytes(needs) == [1010, 10]


def test_the_first_batch_is_small() -> None:
    """A batch is delivered when it is wholly read: the first holds 1/16 of the shared
    bytes, so the first items are not held back until a budget's worth is read."""
    mib = 1 << 20
    shared = [("a", i * 4 * mib, 4 * mib) for i in range(64)]  # 256 MiB of DDP state
    plan = plan_shares([shared, shared], budget=512 * mib)
    assert [sum(k[2] for k in b) // mib for b in plan.batches] == [16, 240]
    assert [k for b in plan.batches for k in b] == shared
    assert first_batch(256 * mib, 512 * mib) == 16 * mib
    assert first_batch(8 * mib, 512 * mib) == 4 * mib  # a few GETs' worth at least
    assert first_batch(256 * mib, 8 * mib) == 8 * mib  # never more than the budget
    tight = plan_shares([shared, shared], budget=32 * mib)
    assert [sum(k[2] for k in b) // mib for b in tight.batches] == [16] + [32] * 7 + [16]


# -- real ranks on SeaweedFS --------------------------------------------------------------
class DataBytes(FaultyStore):
    """Passes every call through; counts the data-file bytes read (shared with children).
    ``kill_on_read``: SIGKILL this process at its first data read (an owner dying)."""

    def __init__(self, inner: Store, count: list[int] | None = None, kill: bool = False) -> None:
        super().__init__(inner)
        self.count = [0] if count is None else count
        self.kill = kill

    def child(self, prefix: str) -> DataBytes:
        return DataBytes(self.inner.child(prefix), self.count, self.kill)

    def _data(self, path: str, n: int) -> None:
        if path.endswith(".distcp"):
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            self.count[0] += n

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        data = super().get(path, start, end)
        self._data(path, len(data))
        return data

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        n = super().get_into(path, start, buf)
        self._data(path, n)
        return n


def ddp_state(rank: int, v: float) -> dict[str, Any]:
    """Four replicated tensors (the same on every rank) and one of the rank's own."""
    state: dict[str, Any] = {f"w{i}": torch.arange(60_000.0) * v + i for i in range(4)}
    state[f"own{rank}"] = torch.full((30_000,), rank + v)
    return state


def _restore(rank: int, world: int, url: str, options: dict, phase: str) -> Any:
    import torch.distributed as dist

    kill = phase == "owner-dies" and rank == 1
    store = DataBytes(open_store(url, options), kill=kill)
    with CheckpointManager(store, async_save=False) as mgr:
        if phase == "save":
            mgr.save(STEP, ddp_state(rank, 2.0))
            return None
        dist.barrier()
        out = ddp_state(rank, 0.0)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step = mgr.restore(out)
        except Exception as exc:  # noqa: BLE001 - the owner died: what the others raise
            return "raised", type(exc).__name__, str(exc)
        want = ddp_state(rank, 2.0)
        ok = step is not None and all(torch.equal(out[k], want[k]) for k in want)
        return step, ok, store.count[0], [str(w.message) for w in caught]


def data_bytes(url: str, options: dict) -> int:
    """The bytes of the checkpoint's stored items (its data files, bar their headers)."""
    manifest = open_committed(open_store(url, options).child(step_name(STEP))).manifest
    return sum(r.length for r in manifest.ranges)


@pytest.mark.server
@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_the_store_serves_each_byte_once_whatever_the_ranks(seaweedfs: Any, world: int) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url, options = f"s3://{BUCKET}/{unique('read-once')}", seaweedfs.storage_options
    run_distributed(_restore, world, url, options, "save")
    results = run_distributed(_restore, world, url, options, "restore")
    assert [(step, ok) for step, ok, _, _ in results] == [(STEP, True)] * world
    # every stored item once (a tensor read straight into its target skips its header);
    # a plain DCP load reads the replicated ~95 % of it once per rank
    stored = data_bytes(url, options)
    assert 0.99 * stored <= sum(n for _, _, n, _ in results) <= stored


@pytest.mark.server
@pytest.mark.distributed
def test_a_damaged_shared_range_fails_the_restore_on_every_rank(seaweedfs: Any) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url, options = f"s3://{BUCKET}/{unique('read-once-bad')}", seaweedfs.storage_options
    run_distributed(_restore, 3, url, options, "save")
    step = open_store(url, options).child(step_name(STEP))
    for name in open_committed(step).manifest.files:  # every data file, sizes unchanged
        if name != METADATA_NAME:
            step.put(name, bytes(b ^ 0xFF for b in step.get(name)))
    results = run_distributed(_restore, 3, url, options, "restore")
    for raised, name, message in results:  # no older step: every rank raises alike
        assert (raised, name) == ("raised", "NoLoadableCheckpointError"), results
        assert f"step {STEP}: " in message and "none could be restored" in message


@pytest.mark.server
@pytest.mark.distributed
def test_an_owner_killed_mid_restore_fails_it_on_the_others(seaweedfs: Any) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url, options = f"s3://{BUCKET}/{unique('read-once-dies')}", seaweedfs.storage_options
    run_distributed(_restore, 3, url, options, "save")
    results = run_distributed(_restore, 3, url, options, "owner-dies", exits={1}, timeout=150)
    assert results[1] == -signal.SIGKILL
    assert results[0][0] == "raised" and results[2][0] == "raised", results


def _stock_load(rank: int, world: int, url: str, options: dict) -> Any:
    """``dcp.load`` through ``ckptstore.reader(share_group=...)`` (no manager)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckptstore

    store = DataBytes(open_store(url, options).child(step_name(STEP)))
    out = ddp_state(rank, 0.0)
    dcp.load(out, storage_reader=ckptstore.reader(store, share_group=dist.group.WORLD))
    want = ddp_state(rank, 2.0)
    return all(torch.equal(out[k], want[k]) for k in want), store.count[0]


@pytest.mark.server
@pytest.mark.distributed
def test_ckptstore_reader_shares_under_a_plain_dcp_load(seaweedfs: Any) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url, options = f"s3://{BUCKET}/{unique('read-once-dcp')}", seaweedfs.storage_options
    run_distributed(_restore, 2, url, options, "save")
    results = run_distributed(_stock_load, 2, url, options)
    assert [ok for ok, _ in results] == [True, True]
    stored = data_bytes(url, options)
    assert 0.99 * stored <= sum(n for _, n in results) <= stored
