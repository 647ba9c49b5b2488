"""Multi-node scenarios on one machine: two torchrun agents as nodes, one c10d rendezvous.

Each node (``harness.nodes``) has its own local tier directory (the node-local tier) and data
cache; the checkpoint root is one directory both reach (the remote). Every scenario checks
the final model, optimizer and RNG state of every rank bitwise against an uninterrupted
two-node run, and which tier each rank restored from (the manager's restore log, which the
training script copies into its ``ready`` event).
"""

from __future__ import annotations

import time

import pytest

from harness.chaos import KillRecord
from harness.nodelog import goodput
from harness.nodes import NodeJob
from tests.multinode.scenario import (
    BACKENDS,
    EVERY,
    assert_restored_from_peers,
    assert_same_final,
    job,
    join_deadline,
    restores,
    tier,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def test_worker_killed_on_one_node_both_nodes_restore_from_their_local_tier(
    tmp_path, data, reference
) -> None:
    d = str(tmp_path)
    with job(d, data) as nj:
        nj.start()
        nj.wait_commit(EVERY * 2)
        t_kill, last = time.time(), nj.last_step()
        pid = nj.kill_worker(1)
        nj.wait()
    assert_same_final(d, reference)
    for node in (0, 1):
        (ready,) = restores(nj, node)
        assert ready["restored"] >= EVERY * 2
        assert tier(ready) == "local", ready["restore_log"]
        print(f"node {node}: {ready['restore_log']}, restore {ready['restore_s']:.2f} s, "
              f"ready {ready['t'] - t_kill:.2f} s after the kill")  # fmt: skip
    (rank,) = [r for r, p in nj.attempts(1)[0].pids().items() if p == pid]
    print(
        goodput([nj], EVERY, kills=[KillRecord(0, 0, "random", rank, pid, t_kill, last)]).format()
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_node_replaced_restores_from_its_peer_while_the_other_reads_locally(
    tmp_path, data, reference, backend
) -> None:
    d = str(tmp_path)
    with job(d, data, max_restarts=2, rdzv_backend=backend) as nj:
        t_kill = _replace_after_a_commit(nj, 1)
        nj.wait()
    assert_same_final(d, reference)
    (survivor,) = restores(nj, 0)
    (replaced,) = restores(nj, 1)
    assert not restores(nj, 1, incarnation=0)  # the first incarnation never restored
    assert survivor["restored"] == replaced["restored"] >= EVERY * 2
    assert tier(survivor) == "local", survivor["restore_log"]
    assert_restored_from_peers(replaced, nothing_remote=replaced["restored"] == EVERY * 2)
    for node, ready in ((0, survivor), (1, replaced)):
        print(f"node {node}: {ready['restore_log']}, restore {ready['restore_s']:.2f} s, "
              f"ready {ready['t'] - t_kill:.2f} s after the kill")  # fmt: skip


def test_node_0_replaced_when_the_launcher_hosts_the_rendezvous_store(
    tmp_path, data, reference
) -> None:
    """Node 0's agent hosts the rendezvous store by default, so losing it ends the job; with
    the store hosted by the launcher (``--rdzv-conf is_host=false``, every agent a client)
    node 0 is replaced like any other, and the job ends as the uninterrupted run does."""
    d = str(tmp_path)
    with job(d, data, max_restarts=2, external_store=True) as nj:
        t_kill = _replace_after_a_commit(nj, 0)  # the agent hosting the store, by default
        nj.wait()
    assert_same_final(d, reference)
    (survivor,) = restores(nj, 1)
    (replaced,) = restores(nj, 0)
    assert survivor["restored"] == replaced["restored"] >= EVERY * 2
    assert_restored_from_peers(replaced, nothing_remote=replaced["restored"] == EVERY * 2)
    for node, ready in ((0, replaced), (1, survivor)):
        print(f"node {node}: {ready['restore_log']}, ready {ready['t'] - t_kill:.2f} s after "
              "the kill")  # fmt: skip


def _replace_after_a_commit(nj: NodeJob, node: int) -> float:
    """Start both nodes, and once step 8 is committed replace ``node`` whole (agent and
    worker SIGKILLed, its directory wiped, a new agent started); returns the kill's time
    once the replacement's worker is in the group. Where stock c10d hangs, NodeError
    (every agent killed) at the join deadline; the rest of the run has the job's."""
    t0 = time.monotonic()
    nj.start()
    nj.wait_until("both workers in their group", lambda: nj.joined(0) and nj.joined(1))
    startup = time.monotonic() - t0
    nj.wait_commit(EVERY * 2)
    t_kill = time.time()
    nj.replace_node(node)
    t1 = time.monotonic()
    nj.wait_until("the replacement's worker in the group", lambda: nj.joined(node),
                  within=join_deadline(startup))  # fmt: skip
    join = time.monotonic() - t1
    print(f"start-up {startup:.2f} s; node {node}'s replacement joined in {join:.2f} s "
          f"({join / startup:.2f}x the start-up)")  # fmt: skip
    return t_kill
