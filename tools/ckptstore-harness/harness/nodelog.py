"""What a multi-node run did, from its nodes' event logs: one attempt list, goodput.

    attempts = job_attempts([job])                      # or [first_job, second_job]
    check_exactly_once(trajectory(attempts), samples, steps)   # harness.runlog's checks
    acct = goodput([job], kills=[KillRecord(...)], interval_steps=4)
    (ready,) = restores(job, 1)                          # node 1's restore: its "ready" event
    tier(ready), restore_bytes(ready)                    # which tier, bytes local/remote/peers

Each node of a :class:`~harness.nodes.NodeJob` logs its own ranks' events in a directory
of its own (``run_dir/log/[<job>-]node<i>.<n>``); one attempt of the worker group spans every
node. :func:`job_attempts` merges them into attempts, and job ``j`` of the list is segment ``j``
(a new job on another node count, as ``harness.chaos`` numbers its resizes). An attempt is
made of the worker groups the nodes started for one rendezvous round (a new ``start``
event is a new group), not numbered by ``TORCHELASTIC_RESTART_COUNT``: an agent whose
workers failed counts the restart, one that restarts its healthy workers for the new round
does not, so the counts of two nodes can differ, and a replacement or a node that joins a
running job starts counting again. So the groups of all nodes are taken in the order they
started, and each joins the newest attempt of its world size that lacks its ranks (or
starts the next attempt). :func:`goodput` hands the result
to the demo's accounting (:func:`harness.goodput_report.account`): the wall clock runs from
the first agent's launch to the last agent's exit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from harness.chaos import ChaosResult, KillRecord, SegmentRecord
from harness.goodput_report import GoodputAccount, account
from harness.nodes import NodeJob
from harness.runlog import Attempt, read_attempts

__all__ = ["goodput", "job_attempts", "job_result", "restore_bytes", "restores", "tier"]


def job_attempts(jobs: Sequence[NodeJob]) -> list[Attempt]:
    """Every attempt of ``jobs`` (job ``j`` is segment ``j``), each with all nodes' ranks."""
    out: list[Attempt] = []
    for seg, job in enumerate(jobs):
        groups = [
            group
            for node in job.nodes
            for n in range(node.incarnation + 1)
            if os.path.isdir(node.events(n))
            for group in _worker_groups(read_attempts(node.events(n)))
        ]
        attempts: list[Attempt] = []
        for group in sorted(groups, key=_started):
            world = Attempt(seg, 0, group).world
            into = next((a for a in reversed(attempts) if a.world == world), None)
            if into is None or len(into.ranks) >= world or set(into.ranks) & set(group):
                attempts.append(Attempt(seg, len(attempts), dict(group)))
            else:
                into.ranks.update(group)
        out += attempts
    return out


def _started(group: dict[int, list[dict[str, Any]]]) -> float:
    """When a worker group started: its earliest event (a ``start``: the process start)."""
    return min(float(evs[0]["t"]) for evs in group.values() if evs)


def _worker_groups(attempts: list[Attempt]) -> list[dict[int, list[dict[str, Any]]]]:
    """One node's worker groups in order: each rank's run of events from one ``start`` to
    the next is one worker's life; lives are grouped in start order, a new group beginning
    where the world size changes or a rank repeats (an agent that restarts healthy workers
    for a new round does not count that restart, so two groups can share one restart count,
    and a worker can come back under another rank: a node that joins may sort first)."""
    lives: list[tuple[int, list[dict[str, Any]]]] = []
    for a in attempts:
        for rank, evs in a.ranks.items():
            for e in evs:
                if e["ev"] == "start" or not lives or lives[-1][0] != rank:
                    lives.append((rank, []))
                lives[-1][1].append(e)
    groups: list[dict[int, list[dict[str, Any]]]] = []
    world_of: list[object] = []
    for rank, evs in sorted(lives, key=lambda life: float(life[1][0]["t"])):
        world = next((e["world"] for e in evs if e["ev"] == "start"), None)
        if not groups or rank in groups[-1] or world != world_of[-1]:
            groups.append({})
            world_of.append(world)
        groups[-1][rank] = evs
    return groups


def job_result(jobs: Sequence[NodeJob], kills: Sequence[KillRecord] = ()) -> ChaosResult:
    """``jobs`` as the chaos harness records a run: one segment per job, from its first
    agent's launch to its last agent's exit (call after :meth:`NodeJob.wait`)."""
    segments = []
    for job in jobs:
        started = [t for node in job.nodes for t in node.started]
        exited = [node.exited for node in job.nodes if node.exited]
        world = sum(n for node, n in zip(job.nodes, job.nproc_per_node) if node.started)
        segments.append(SegmentRecord(world, min(started), max(exited, default=0.0)))
    return ChaosResult(jobs[0].run_dir, "", segments, list(kills))


def goodput(
    jobs: Sequence[NodeJob], interval_steps: int, kills: Sequence[KillRecord] = ()
) -> GoodputAccount:
    """The demo's goodput account of ``jobs`` (see the module docstring)."""
    return account(job_result(jobs, kills), job_attempts(jobs), interval_steps)


def restores(nj: NodeJob, node: int, incarnation: int | None = None) -> list[dict[str, Any]]:
    """The ``ready`` events of node ``node``'s workers after a restore, in attempt order."""
    return [
        e
        for a in nj.attempts(node, incarnation)
        for r in a.ranks.values()
        for e in r
        if e["ev"] == "ready" and e["restored"]
    ]


def tier(ready: dict[str, Any]) -> str:
    (msg,) = [m for m in ready["restore_log"] if m.startswith("restoring step")]
    return "local" if "tier copy" in msg else "remote"


def restore_bytes(ready: dict[str, Any]) -> dict[str, int]:
    """The bytes a rank's restore read from the tier copy, from the root, and received from peer
    nodes (the manager's restore log)."""
    out = {"local": 0, "remote": 0, "peers": 0}
    for m in ready["restore_log"]:
        if found := re.match(r"step \d+: (\d+) bytes read from the tier copy, (\d+) from the", m):
            out["local"], out["remote"] = int(found[1]), int(found[2])
        elif found := re.match(r"step \d+: (\d+) bytes copied from peer nodes", m):
            out["peers"] = int(found[1])
    return out
