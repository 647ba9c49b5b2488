"""Scenario 5: ``background="process"`` writers across nodes, and a node's shared directories.

Two nodes, node 0 with two processes and node 1 with one (world 3), each rank saving
through its own writer process (``CheckpointManager(background="process")``): the writers
of all three ranks form their gloo group through the rendezvous store rank 0 hosts, whose
address reaches every rank over the manager's control group (the default store's host, or
``MASTER_ADDR``). Node 0's two processes share its local tier directory (the node-local tier)
and its data cache. Once step 8 is committed everywhere, one of node 0's workers is
SIGKILLed: its writer dies with it, every rank starts a new worker and writer, and all
three restore the same step from their node's local tier (node 0's two ranks from the one
directory). Every sample is consumed exactly once, every restore loads the state it was
saved with, every save after the restart commits on every rank, every committed step
verifies, and node 0's cache holds each shard once, whole, with no download left behind.
"""

from __future__ import annotations

import glob
import os
import time

import pytest

from examples.resilience.eventlog import tensor_crc
from harness.chaos import KillRecord
from harness.ckptcheck import audit_root
from harness.nodelog import goodput, job_attempts
from harness.runlog import check_exactly_once, check_restores, trajectory
from tests.multinode.scenario import EVERY, SAMPLES, STEPS, job, tier

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def test_process_writers_across_nodes_and_a_node_directory_shared_by_two_processes(
    tmp_path, data
) -> None:
    d = str(tmp_path)
    extra = ("--background", "process")
    with job(d, data, extra=extra, nproc_per_node=(2, 1)) as nj:
        nj.start()
        nj.wait_commit(EVERY * 2)
        pid, t_kill, last = nj.worker_pid(0), time.time(), nj.last_step()
        (killed,) = [r for r, p in nj.attempts(0)[-1].pids().items() if p == pid]
        nj.kill_worker(0)
        nj.wait()

    attempts = job_attempts([nj])
    assert [(a.id, a.world, sorted(a.ranks)) for a in attempts] == [
        ((0, 0), 3, [0, 1, 2]),
        ((0, 1), 3, [0, 1, 2]),
    ]
    data_check = check_exactly_once(trajectory(attempts), SAMPLES, STEPS)
    assert data_check.ok, data_check.problems
    restored = check_restores(attempts)  # the state and cursor each step was saved with
    assert restored.ok, restored.problems
    ready = [e for r in attempts[1].ranks.values() for e in r if e["ev"] == "ready"]
    assert len(ready) == 3 and len({e["restored"] for e in ready}) == 1
    assert ready[0]["restored"] >= EVERY * 2
    for e in ready:  # node 0's two ranks from the one local tier directory
        assert tier(e) == "local", e["restore_log"]
    every = list(range(EVERY, STEPS + 1, EVERY))
    for r, evs in attempts[1].ranks.items():  # every save after the restart, on every rank
        done = [e["step"] for e in evs if e["ev"] == "commit" and e["status"] == "committed"]
        assert done == [s for s in every if s > ready[0]["restored"]], r
    model_crc = {e["step"]: e["model_crc"] for e in nj.events("save")}
    audit = audit_root(f"{d}/ckpt", expected=model_crc, crc=tensor_crc)
    assert audit.ok, audit.problems
    assert audit.committed == audit.matched == every
    cache = os.path.join(nj.nodes[0].cache, "shards")
    cached = sorted(glob.glob(os.path.join(cache, "*.data")))
    sources = sorted(glob.glob(os.path.join(data, "*.parquet")))
    assert len(cached) == len(sources)  # each shard once, for both processes
    for src in sources:
        (hit,) = [c for c in cached if c.endswith(os.path.basename(src) + ".data")]
        with open(src, "rb") as a, open(hit, "rb") as b:
            assert a.read() == b.read()
    assert not glob.glob(os.path.join(cache, "*.tmp-*"))
    kill = KillRecord(0, 0, "random", rank=killed, pid=pid, t=t_kill, step=last)
    acct = goodput([nj], EVERY, kills=[kill])
    print(data_check.summary())
    for e in ready:
        print(f"{e['restore_log']}, restore {e['restore_s']:.2f} s, "
              f"ready {e['t'] - t_kill:.2f} s after the kill")  # fmt: skip
    print(acct.format())
