"""Scenario 3: an elastic job (``--nnodes 1:2``) shrinks from two nodes to one and grows back.

Shrinking works under torchrun as it ships: a node that leaves for good is dropped from the
next rendezvous round, and the remaining node restarts alone (world 1) from the newest
commit, resharding the two-rank checkpoint. Growing a running job works under
``--rdzv-backend ckptstore-c10d`` (stock c10d: a strict-xfail canary, ``scenario.BACKENDS``),
and so does a new launch of the same run on two nodes resuming from the one-node job's
checkpoint.
Every sample is consumed exactly once across the whole run (the effective steps, re-done
ones excluded), and each restore loads exactly the model + optimizer state the step was
saved with, on the other world size.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from harness.chaos import KillRecord
from harness.nodelog import goodput, job_attempts
from harness.nodes import NodeJob
from harness.runlog import check_exactly_once, check_restores, trajectory
from tests.multinode.scenario import (
    BACKENDS,
    EVERY,
    GLOBAL_BATCH,
    SAMPLES,
    SCRIPT,
    assert_restored_from_peers,
    assert_same_final,
    join_deadline,
    restores,
    tier,
)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STEPS = 40
SHRUNK_UNTIL = 24  # the one-node job's last step; the new two-node job trains the rest
# Once a round has its minimum of nodes it waits this long for more (torchrun's default is
# 30 s), so the shrink's restart pays it once; long enough for node 1's agent to join the
# first round (with less, node 0 starts alone and node 1 joins a later round).
RDZV_CONF = "last_call_timeout=10"


def elastic(
    d: str,
    data: str,
    steps: int,
    job: str = "",
    extra: tuple[str, ...] = (),
    nodes: int = 2,
    nnodes: str = "",
    **kw: Any,
) -> NodeJob:
    """``nodes`` nodes of an elastic job, ``--nnodes 1:<nodes>`` unless ``nnodes`` says
    otherwise (``job``: its name, for logs apart; ``d/ckpt`` its root, ``d/out`` where it
    writes its final state)."""
    args = [
        "--data", data, "--root", f"{d}/ckpt", "--out", f"{d}/out", "--steps", str(steps),
        "--save-every", str(EVERY), "--global-batch", str(GLOBAL_BATCH), "--d-model", "32",
        "--layers", "1", "--ff", "64", *extra,
    ]  # fmt: skip
    kw.setdefault("timeout_s", 240.0)
    return NodeJob(
        SCRIPT,
        args,
        run_dir=d,
        nnodes=nnodes or f"1:{nodes}",
        nodes=nodes,
        rdzv_conf=RDZV_CONF,
        job=job,
        **kw,
    )


def test_shrink_to_one_node_then_a_new_two_node_job_resumes(tmp_path, data) -> None:
    d = str(tmp_path)
    # Both launches are one run (a node-local copy serves only the run that made it): the
    # new job's node 0 then restores from its local tier, node 1 from node 0.
    run = {"CKPTSTORE_RUN_ID": "shrink-then-grow"}
    with elastic(d, data, SHRUNK_UNTIL, job="a", max_restarts=1, env=run) as shrink:
        shrink.start()
        shrink.wait_commit(EVERY * 2)
        pid, t_kill, last = shrink.worker_pid(1), time.time(), shrink.last_step()
        shrink.remove_node(1)  # agent and worker SIGKILLed: node 1 leaves the job
        shrink.wait()
    with elastic(d, data, STEPS, job="b", max_restarts=0, env=run) as grow:
        grow.start()
        grow.wait()

    attempts = job_attempts([shrink, grow])
    assert [(a.id, a.world) for a in attempts] == [((0, 0), 2), ((0, 1), 1), ((1, 0), 2)]
    data_check = check_exactly_once(trajectory(attempts), SAMPLES, STEPS)
    assert data_check.ok, data_check.problems
    restored = check_restores(attempts)  # each restore's state checksum = the saved one's
    assert restored.ok, restored.problems
    assert [step for _, step in restored.restores][1:] == [restored.restores[1][1], SHRUNK_UNTIL]
    (alone,) = restores(shrink, 0)
    assert alone["restored"] >= EVERY * 2 and tier(alone) == "local", alone["restore_log"]
    assert not restores(shrink, 1)
    (again0,), (again1,) = restores(grow, 0), restores(grow, 1)
    assert again0["restored"] == again1["restored"] == SHRUNK_UNTIL
    assert tier(again0) == "local", again0["restore_log"]  # the one-node job's coordinator
    # node 1 left before step 24, which the one-node job wrote whole: node 0 sends it all
    assert_restored_from_peers(again1, nothing_remote=True)
    for f in ("final.rank0.pt", "final.rank1.pt"):
        assert os.path.exists(f"{d}/out/{f}")
    kill = KillRecord(0, 0, "random", rank=1, pid=pid, t=t_kill, step=last)
    acct = goodput([shrink, grow], EVERY, kills=[kill])
    print(data_check.summary())
    print(f"shrink: {alone['restore_log']}, restore {alone['restore_s']:.2f} s, "
          f"ready {alone['t'] - t_kill:.2f} s after node 1 left")  # fmt: skip
    for node, ready in ((0, again0), (1, again1)):
        print(f"new job, node {node}: {ready['restore_log']}, restore {ready['restore_s']:.2f} s")
    print(acct.format())


@pytest.mark.parametrize("backend", BACKENDS)
def test_grow_a_running_job_from_one_node_to_two(tmp_path, data, backend) -> None:
    d = str(tmp_path)
    # node 0 trains slowly enough that node 1 joins mid-run
    with elastic(
        d, data, STEPS, max_restarts=1, extra=("--step-delay", "0.5"), rdzv_backend=backend
    ) as nj:
        t0 = time.monotonic()
        nj.start(1)
        nj.wait_until("node 0's worker in its group", lambda: nj.joined(0))
        startup = time.monotonic() - t0
        nj.wait_until(
            "node 0's commit of step 4",
            lambda: any(e["step"] == EVERY for e in nj.events("commit")),
        )
        t1 = time.monotonic()
        nj.start_node(1)
        # Where stock c10d hangs: NodeError (every agent killed) at the join deadline;
        # the rest of the run has the job's deadline.
        nj.wait_until("node 1's worker in a group of two", lambda: nj.joined(1, world=2),
                      within=join_deadline(startup))  # fmt: skip
        join = time.monotonic() - t1
        print(f"start-up {startup:.2f} s; node 1 joined in {join:.2f} s "
              f"({join / startup:.2f}x the start-up)")  # fmt: skip
        nj.wait()
    attempts = job_attempts([nj])
    assert [a.world for a in attempts] == [1, 2]
    data_check = check_exactly_once(trajectory(attempts), SAMPLES, STEPS)
    assert data_check.ok, data_check.problems
    restored = check_restores(attempts)
    assert restored.ok, restored.problems
    (joined,) = restores(nj, 1)
    assert joined["restored"] >= EVERY, joined["restore_log"]
    assert_restored_from_peers(joined, nothing_remote=True)  # node 0 wrote the step alone


def _committed_by(nj: NodeJob, node: int) -> bool:
    """True once node ``node``'s current incarnation logged a committed save."""
    return any(
        e["ev"] == "commit" and e["status"] == "committed"
        for a in nj.attempts(node)
        for evs in a.ranks.values()
        for e in evs
    )


def test_grow_one_to_two_to_three_nodes_then_one_leaves(tmp_path, data) -> None:
    """``--nnodes 1:3`` under ckptstore-c10d: node 0 alone, node 1 joins, node 2 joins, node
    2 leaves for good. The run ends bitwise equal to the same schedule run as separate
    jobs of fixed size (each resuming the step the elastic run resumed), every sample is
    seen exactly once, and each restore loads the state its step was saved with."""
    d, steps = str(tmp_path / "run"), 60
    with elastic(
        d, data, steps, nodes=3, max_restarts=3, extra=("--step-delay", "0.4"), timeout_s=420
    ) as nj:
        t0 = time.monotonic()
        nj.start(1)
        nj.wait_until("node 0's worker in its group", lambda: nj.joined(0))
        startup = time.monotonic() - t0
        nj.wait_until("node 0's first commit", lambda: _committed_by(nj, 0))
        joins = []
        for i in (1, 2):
            t = time.monotonic()
            nj.start_node(i)
            nj.wait_until(f"node {i}'s worker in a group of {i + 1}",
                          lambda i=i: nj.joined(i, world=i + 1),
                          within=join_deadline(startup))  # fmt: skip
            joins.append(time.monotonic() - t)
            nj.wait_until(f"a commit of the {i + 1}-node group", lambda i=i: _committed_by(nj, i))
        t_leave = time.time()
        nj.remove_node(2)  # agent and worker SIGKILLed: the job goes on with two nodes
        nj.wait()
    attempts = job_attempts([nj])
    assert [a.world for a in attempts] == [1, 2, 3, 2]
    data_check = check_exactly_once(trajectory(attempts), SAMPLES, steps)
    assert data_check.ok, data_check.problems
    restored = check_restores(attempts)
    assert restored.ok, restored.problems
    resumed = [step for _, step in restored.restores]  # None, then each attempt's step
    assert resumed[0] is None and all(s is not None for s in resumed[1:])
    for node in (1, 2):  # a node joining has no local copy: the nodes before it send it
        ready = restores(nj, node)[0]  # (node 1's step: node 0 wrote it whole)
        assert_restored_from_peers(ready, nothing_remote=node == 1)
    print(f"start-up {startup:.2f} s; joins {', '.join(f'{j:.2f} s' for j in joins)} "
          f"({', '.join(f'{j / startup:.2f}x' for j in joins)} the start-up)")  # fmt: skip
    for node in (0, 1):
        ready = restores(nj, node)[-1]
        print(f"node {node} after node 2 left: {ready['restore_log']}, ready "
              f"{ready['t'] - t_leave:.2f} s after")  # fmt: skip

    # The same schedule as jobs of fixed size: world w_k trains up to the step the next
    # attempt resumed from, and the last to the end; each resumes where the last stopped.
    ref = str(tmp_path / "ref")
    ends = [*(int(s) for s in resumed[1:]), steps]
    for k, (a, end) in enumerate(zip(attempts, ends)):
        with elastic(ref, data, end, job=f"ref{k}", nodes=a.world, nnodes=str(a.world),
                     max_restarts=0) as fixed:  # fmt: skip
            fixed.start()
            fixed.wait()
    assert_same_final(d, ref, steps)
