"""The peer tier on real gloo ranks: three ranks, each its own node (a local tier
directory of its own), saving through ``CheckpointManager`` with ``replicas``.

After a save each node holds its own shards and its ring predecessors'; a restore takes
what a node lacks from the peers (0 data bytes from the root when the peers hold every
file), the bucket serves exactly the files no node holds, and a damaged or truncated copy
is never used: the next holder sends it, and the node is re-seeded.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.engine.names import TMP_MARK, step_name
from ckptstore.engine.store import Store
from ckptstore.errors import ConfigError
from ckptstore.manager import CheckpointManager
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import FaultyStore
from ckptstore.tier import peer_copy, peers
from ckptstore.tier.jobs import TierJob
from harness.dist import run_distributed
from tests.tier_dirs import job_dir, steps_in

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

NODES = 3
STEP = 5
#: Every launch of these tests is one run: a restore finds the copies its save left.
RUN = "peer-tier"


def node_dir(tmp: str, node: int, step: int = STEP) -> str:
    """Node ``node``'s directory of ``step``, in the job's directory of its local tier."""
    tier = os.path.join(tmp, f"node{node}")
    return os.path.join(job_dir(tier, os.path.join(tmp, "root"), RUN), step_name(step))


class DataReads(FaultyStore):
    """Passes every call through; remembers the data files read (shared with children)."""

    def __init__(self, inner: Store, read: set[str] | None = None) -> None:
        super().__init__(inner)
        self.read: set[str] = set() if read is None else read

    def child(self, prefix: str) -> DataReads:
        return DataReads(self.inner.child(prefix), self.read)

    def _note(self, path: str) -> None:
        if path.endswith(".distcp"):
            self.read.add(os.path.basename(path))

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        self._note(path)
        return super().get(path, start, end)

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        self._note(path)
        return super().get_into(path, start, buf)


def state(rank: int, v: float) -> dict[str, Any]:
    """A replicated tensor (DCP spreads its write over the ranks) and one of the rank's own."""
    return {"w": torch.arange(50_000.0) * v, f"own{rank}": torch.full((20_000,), rank + v)}


def _body(rank: int, world: int, tmp: str, replicas: int, restore: bool, chunk: int = 0) -> Any:
    if chunk:  # files of many messages each (the default chunk is larger than these files)
        peer_copy.CHUNK = peers.CHUNK = chunk
    tier = os.path.join(tmp, f"node{rank}")
    root = DataReads(LocalStore(os.path.join(tmp, "root")))
    with CheckpointManager(root, local_tier_dir=tier, replicas=replicas, run_id=RUN) as mgr:
        if not restore:
            mgr.save(STEP, state(rank, 5.0))
            return None
        out = state(rank, 0.0)
        step = mgr.restore(out)
    want = state(rank, 5.0)
    assert step == STEP and all(torch.equal(out[k], want[k]) for k in want)
    return sorted(root.read)


def saved(tmp: str, replicas: int, chunk: int = 0) -> dict[int, set[str]]:
    """Step 5 saved on three nodes; what each node's local tier holds of it."""
    run_distributed(_body, NODES, tmp, replicas, False, chunk)
    return held(tmp)


def held(tmp: str) -> dict[int, set[str]]:
    out = {}
    for node in range(NODES):
        d = node_dir(tmp, node)
        out[node] = (
            {n for n in os.listdir(d) if n.endswith(".distcp")} if os.path.isdir(d) else set()
        )
    return out


def own(files: set[str], node: int) -> set[str]:
    """The files rank ``node`` wrote (DCP names them ``__<rank>_<n>...``)."""
    return {f for f in files if f.startswith(f"__{node}_")}


def restored(tmp: str, replicas: int, chunk: int = 0) -> set[str]:
    """Restore on every node; the data files read from the root (all ranks)."""
    return set().union(*run_distributed(_body, NODES, tmp, replicas, True, chunk))


def open_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def wipe(tmp: str, node: int) -> None:
    shutil.rmtree(os.path.join(tmp, f"node{node}"))


def test_each_node_holds_its_own_shards_and_its_predecessors(tmp_path) -> None:
    tmp = str(tmp_path)
    holds = saved(tmp, replicas=1)
    every = set().union(*holds.values())
    assert all(own(every, n) for n in range(NODES)), every  # every rank wrote a file
    for node in range(NODES):
        before = (node - 1) % NODES
        assert holds[node] == own(every, node) | own(every, before)


def test_without_replicas_each_node_holds_its_own_shards_only(tmp_path) -> None:
    holds = saved(str(tmp_path), replicas=0)
    every = set().union(*holds.values())
    assert all(holds[n] == own(every, n) for n in range(NODES))


def shared(tmp: str) -> set[str]:
    """The files holding the replicated tensor ``w`` (every rank reads them)."""
    metadata = ckptstore.reader(os.path.join(tmp, "root", step_name(STEP))).read_metadata()
    return {i.relative_path for k, i in metadata.storage_data.items() if k.fqn == "w"}


@pytest.mark.parametrize("chunk", [0, 4093], ids=["one-message", "many-messages"])
def test_a_replaced_node_restores_from_its_peers_with_nothing_from_the_root(
    tmp_path, chunk: int
) -> None:
    tmp = str(tmp_path)
    before = saved(tmp, replicas=1, chunk=chunk)
    every = set().union(*before.values())
    wipe(tmp, 1)  # node 1 replaced: its tier is empty
    assert restored(tmp, replicas=1, chunk=chunk) == set()
    # each node got what its rank reads and lacked (node 1: its own shard and the shared
    # tensor's; node 2: the shared tensor's), nothing more
    before[1] = set()
    assert held(tmp) == {n: before[n] | own(every, n) | shared(tmp) for n in range(NODES)}


def test_two_adjacent_nodes_lost_the_root_serves_exactly_their_lost_shards(tmp_path) -> None:
    tmp = str(tmp_path)
    every = set().union(*saved(tmp, replicas=1).values())
    wipe(tmp, 1)
    wipe(tmp, 2)  # node 1's shards were on nodes 1 and 2 only
    assert restored(tmp, replicas=1) == own(every, 1)
    holds = held(tmp)
    assert holds[1] == shared(tmp) and holds[2] == own(every, 2) | shared(tmp)


def test_a_damaged_or_truncated_copy_is_never_used_the_next_holder_sends_it(tmp_path) -> None:
    tmp = str(tmp_path)
    holds = saved(tmp, replicas=2)
    every = set().union(*holds.values())
    assert all(h == every for h in holds.values())
    wipe(tmp, 2)
    (two,) = own(every, 2)
    damaged = os.path.join(node_dir(tmp, 0), two)  # node 0's copy of node 2's
    with open(damaged, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    (one,) = own(every, 1)
    truncated = os.path.join(node_dir(tmp, 1), one)  # node 1's own file
    with open(truncated, "r+b") as f:
        f.truncate(os.path.getsize(truncated) - 1)
    (zero,) = own(every, 0)
    mine = os.path.join(node_dir(tmp, 0), zero)  # a file node 0 reads itself
    with open(mine, "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\xee" * 8)
    assert restored(tmp, replicas=2) == set()
    remote = os.path.join(tmp, "root", step_name(STEP))
    received = os.path.join(node_dir(tmp, 2), two)  # good, whoever sent it
    for path, name in ((received, two), (truncated, one), (mine, zero)):  # good copies
        assert open_bytes(path) == open_bytes(os.path.join(remote, name))


def _dies_while_replicating(rank: int, world: int, tmp: str) -> Any:
    """Node 2 is SIGKILLed while the step's replicas travel (slowed by ``replica_rate``);
    the others' save thread meets the dead peer."""
    tier = os.path.join(tmp, f"node{rank}")
    mgr = CheckpointManager(
        os.path.join(tmp, "root"), local_tier_dir=tier, replica_rate=100_000, run_id=RUN
    )
    big = {"w": torch.arange(200_000.0), f"own{rank}": torch.full((100_000,), float(rank))}
    mgr.save(STEP, big)
    if rank == 2:
        while mgr.records[-1].status != "committed":
            time.sleep(0.01)
        time.sleep(0.5)  # the save thread is replicating: about 1 MB at 100 kB/s
        os.kill(os.getpid(), signal.SIGKILL)
    mgr.wait()  # training goes on: the failure is the record's warning, not an exception
    (record,) = mgr.records
    return record.status, record.warnings


def test_a_peer_dying_during_replication_leaves_the_save_committed_and_no_partial_copy(
    tmp_path,
) -> None:
    tmp = str(tmp_path)
    results = run_distributed(_dies_while_replicating, NODES, tmp, exits={2}, timeout=120)
    assert results[2] == -signal.SIGKILL
    for status, notes in results[:2]:
        assert status == "committed"
        assert any("not replicated" in n for n in notes), notes
    remote = os.path.join(tmp, "root", step_name(STEP))
    assert os.path.exists(os.path.join(remote, "COMMITTED"))
    for node in (0, 1):  # whatever a node kept is whole; no temp file is left
        d = node_dir(tmp, node)
        for name in os.listdir(d):
            assert TMP_MARK not in name, name
            if name.endswith(".distcp"):
                with open(os.path.join(d, name), "rb") as a:
                    assert a.read() == open_bytes(os.path.join(remote, name)), name


def _three_steps(rank: int, world: int, tmp: str, limit: int) -> Any:
    tier = os.path.join(tmp, f"node{rank}")
    with CheckpointManager(
        os.path.join(tmp, "root"), local_tier_dir=tier, keep_local=3, tier_limit=limit, run_id=RUN
    ) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state(rank, float(s)))
            mgr.wait()
        return [(str(r.status), r.warnings) for r in mgr.records]


def test_a_full_tier_evicts_its_oldest_steps_never_the_newest(tmp_path) -> None:
    """keep_local=3 within a tier_limit that holds node 0's newest step (with its replica
    and the next save's shards) but nothing beside it: node 0 evicts its older steps, node
    2 (the smallest shards) keeps all three; no save fails or warns."""
    tmp = str(tmp_path)
    every = set().union(*saved(tmp, replicas=0).values())
    size = {n: os.path.getsize(os.path.join(tmp, "root", step_name(STEP), n)) for n in every}
    mine = [sum(size[n] for n in own(every, node)) for node in range(NODES)]
    peaks = [2 * mine[n] + mine[n - 1] for n in range(NODES)]  # own twice + a replica
    limit = max(peaks) + max(peaks) // 4
    step_bytes = [mine[n] + mine[n - 1] for n in range(NODES)]
    stamp = len(TierJob(os.path.join(tmp, "root"), RUN).stamp())  # the job directory's
    assert limit - peaks[0] - stamp < step_bytes[0]
    assert limit - peaks[2] - stamp >= 2 * step_bytes[2]
    shutil.rmtree(tmp_path)
    for records in run_distributed(_three_steps, NODES, tmp, limit):
        assert records == [("committed", [])] * 3
    steps = {n: steps_in(os.path.join(tmp, f"node{n}")) for n in range(NODES)}
    assert steps[0] == [step_name(3)]
    assert steps[2] == [step_name(s) for s in (1, 2, 3)]


def test_a_symlinked_step_directory_is_never_written_through(tmp_path) -> None:
    tmp = str(tmp_path)
    every = set().union(*saved(tmp, replicas=1).values())
    elsewhere = os.path.join(tmp, "elsewhere")
    os.makedirs(elsewhere)
    step_dir = node_dir(tmp, 1)
    shutil.rmtree(step_dir)
    os.symlink(elsewhere, step_dir)  # node 1 "lost" its files; its step dir points away
    read = restored(tmp, replicas=1)  # every rank restores the saved values
    assert os.listdir(elsewhere) == []  # nothing was received into it
    assert own(every, 1) <= read  # node 1's shard came from the bucket instead


def _over_the_limit(rank: int, world: int, tmp: str, limit: int) -> Any:
    tier = os.path.join(tmp, f"node{rank}")
    with CheckpointManager(
        os.path.join(tmp, "root"), local_tier_dir=tier, tier_limit=limit, run_id=RUN
    ) as mgr:
        mgr.save(STEP, state(rank, 5.0))
        mgr.wait()
        (record,) = mgr.records
        with pytest.raises(ConfigError) as refused:
            mgr.save(STEP + 1, state(rank, 6.0))
        return record.status, record.warnings, str(refused.value), mgr.steps()


def test_a_tier_that_cannot_hold_a_step_with_its_replicas_fails_the_next_save(tmp_path) -> None:
    """Node 0 (which writes the replicated tensor: the largest shard) has room for its own
    shards twice but not for a peer's as well: the first save is committed, node 0 takes no
    replicas (the others do), and every later save raises, naming node 0 and its need."""
    tmp = str(tmp_path)
    every = set().union(*saved(tmp, replicas=0).values())
    size = {n: os.path.getsize(os.path.join(tmp, "root", step_name(STEP), n)) for n in every}
    mine = [sum(size[n] for n in own(every, node)) for node in range(NODES)]
    assert mine[0] == max(mine)
    limit = 2 * mine[0] + min(mine) // 2  # node 0's peak: 2 x its own + node 2's shards
    shutil.rmtree(tmp_path)
    results = run_distributed(_over_the_limit, NODES, tmp, limit)
    for status, notes, error, steps in results:
        assert status == "committed" and steps == [STEP]
        assert any("tier_limit" in n for n in notes), notes
        assert f"tier_limit={limit}" in error and "Raise tier_limit to at least" in error
        assert "node0 on" in error and "node1 on" not in error and "node2 on" not in error
    holds = held(tmp)
    every = set().union(*holds.values())  # the second run's files (a new attempt id)
    assert holds[0] == own(every, 0)  # no replicas: they would not fit
    assert holds[1] == own(every, 1) | own(every, 0) and holds[2] == own(every, 2) | own(every, 1)
