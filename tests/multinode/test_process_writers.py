"""Scenario 5: ``background="process"`` writers across nodes, and a node's shared directories.

Two nodes, node 0 with two processes and node 1 with one (world 3), each rank saving
through its own writer process (``CheckpointManager(background="process")``): the writers
of all three ranks form their gloo group through the rendezvous store rank 0 hosts, whose
address reaches every rank over the manager's control group (the default store's host, or
``MASTER_ADDR``). Node 0's two processes share its staging directory (the node-local tier)
and its data cache. Every save of the run commits on every rank and verifies, every
sample is consumed exactly once, and node 0's cache holds each shard once, whole, with no
download left behind. (A kill and restore is scenario 1's; with three ranks and three
writer processes on this machine's two cores it would not fit the test budget.)
"""

from __future__ import annotations

import glob
import os

import pytest

from harness.ckptcheck import audit_root
from harness.nodelog import goodput, job_attempts
from harness.runlog import check_exactly_once, trajectory
from tests.multinode.scenario import EVERY, SAMPLES, job

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STEPS = 24


def test_process_writers_across_nodes_and_a_node_directory_shared_by_two_processes(
    tmp_path, data
) -> None:
    d = str(tmp_path)
    extra = ("--background", "process")
    with job(d, data, extra=extra, steps=STEPS, nproc_per_node=(2, 1), max_restarts=0) as nj:
        nj.start()
        nj.wait()

    attempts = job_attempts([nj])
    assert [(a.id, a.world, sorted(a.ranks)) for a in attempts] == [((0, 0), 3, [0, 1, 2])]
    assert sorted(len(nj.attempts(n)[0].ranks) for n in (0, 1)) == [1, 2]
    data_check = check_exactly_once(trajectory(attempts), SAMPLES, STEPS)
    assert data_check.ok, data_check.problems
    every = list(range(EVERY, STEPS + 1, EVERY))
    for r, evs in attempts[0].ranks.items():  # every save committed, on every rank
        assert [
            e["step"] for e in evs if e["ev"] == "commit" and e["status"] == "committed"
        ] == every, r
    model_crc = {e["step"]: e["model_crc"] for e in nj.events("save")}
    audit = audit_root(f"{d}/ckpt", expected=model_crc)
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
    acct = goodput([nj], EVERY)
    print(data_check.summary())
    print(acct.format())
