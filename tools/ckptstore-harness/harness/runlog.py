"""What a training job's per-rank event logs prove after kills and resizes.

The job writes them (``examples/resilience/eventlog.py``: one JSON-lines file per attempt
and rank, ``start``, ``ready``, ``step``, ``save``, ``commit``, ``end`` / ``preempted``);
a test or the demo reads them back::

    attempts = read_attempts(log_dir)                 # ordered: segment, then restart count
    traj = trajectory(attempts)                       # the effective run: last run of each step
    check_exactly_once(traj, num_samples, steps).ok   # every sample once per epoch
    check_restores(attempts).ok                       # every restore is a state that was saved

An *attempt* is one incarnation of the worker group: segment ``seg`` is one torchrun
invocation (a resize starts a new one), ``restart`` is ``TORCHELASTIC_RESTART_COUNT``.
A line torn by SIGKILL ends a file. Steps re-done after a restart appear in several
attempts: the *effective* run of a step is its last one (attempts in order), which is the
step the final model actually went through.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Attempt",
    "StepRun",
    "Trajectory",
    "DataCheck",
    "RestoreCheck",
    "read_attempts",
    "trajectory",
    "check_exactly_once",
    "check_restores",
    "same_batches",
]

AttemptId = tuple[int, int]  # (segment, restart)


@dataclass
class Attempt:
    """Events of one attempt, per rank, in the order they were written."""

    segment: int
    restart: int
    ranks: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def id(self) -> AttemptId:
        return (self.segment, self.restart)

    @property
    def world(self) -> int:
        starts = [e for evs in self.ranks.values() for e in evs if e["ev"] == "start"]
        return int(starts[0]["world"]) if starts else len(self.ranks)

    def events(self, ev: str, rank: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.ranks.get(rank, []) if e["ev"] == ev]

    def first(self, ev: str, rank: int = 0) -> dict[str, Any] | None:
        found = self.events(ev, rank)
        return found[0] if found else None

    def last_time(self) -> float:
        """The time of the last event any rank wrote (a step's end counts as its time)."""
        return max(
            (max(e.get("t1", e["t"]), e["t"]) for evs in self.ranks.values() for e in evs),
            default=0.0,
        )

    def pids(self) -> dict[int, int]:
        return {r: int(e["pid"]) for r in self.ranks for e in self.events("start", r)}


def read_attempts(log_dir: str) -> list[Attempt]:
    """Every attempt under ``log_dir``, ordered by (segment, restart)."""
    found: dict[AttemptId, Attempt] = {}
    for name in sorted(os.listdir(log_dir)):
        if not (name.endswith(".jsonl") and name.startswith("s")):
            continue
        seg, att, rank = (int(p[1:]) for p in name[: -len(".jsonl")].split("-"))
        events = []
        with open(os.path.join(log_dir, name)) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line torn by SIGKILL: nothing after it was written
        found.setdefault((seg, att), Attempt(seg, att)).ranks[rank] = events
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True)
class StepRun:
    """One execution of a global step by all ranks of one attempt."""

    step: int
    attempt: AttemptId
    world: int
    k0: int  # the data cursor before the step
    epoch: int
    ids: tuple[tuple[int, ...], ...]  # per rank
    loss: float  # the global (all-reduced) loss
    t0: float  # rank 0's step start and end
    t1: float

    @property
    def all_ids(self) -> list[int]:
        return [i for rank in self.ids for i in rank]


@dataclass
class Trajectory:
    """The effective run (the last execution of each step) and every superseded one."""

    effective: dict[int, StepRun]
    superseded: list[StepRun]
    partial: list[str]  # executions that not every rank logged (killed mid-step)

    @property
    def steps(self) -> list[int]:
        return sorted(self.effective)


def _step_runs(a: Attempt) -> tuple[list[StepRun], list[str]]:
    world = a.world
    per_rank = {r: {e["step"]: e for e in a.events("step", r)} for r in range(world)}
    all_steps = sorted(set().union(*(set(p) for p in per_rank.values())))
    runs, partial = [], []
    for s in all_steps:
        got = [per_rank[r].get(s) for r in range(world)]
        if any(g is None for g in got):
            partial.append(
                f"step {s} of attempt {a.id} was logged by ranks "
                f"{[r for r in range(world) if got[r] is not None]} of {world} only"
            )
            continue
        evs = [g for g in got if g is not None]
        e0 = evs[0]
        runs.append(
            StepRun(
                step=s,
                attempt=a.id,
                world=world,
                k0=int(e0["k0"]),
                epoch=int(e0["epoch"]),
                ids=tuple(tuple(int(i) for i in e["ids"]) for e in evs),
                loss=float(e0["loss"]),
                t0=float(e0["t0"]),
                t1=float(e0["t1"]),
            )
        )
    return runs, partial


def trajectory(attempts: list[Attempt]) -> Trajectory:
    """The last execution of every step wins; earlier ones are re-done work."""
    effective: dict[int, StepRun] = {}
    superseded: list[StepRun] = []
    partial: list[str] = []
    for a in attempts:
        runs, torn = _step_runs(a)
        partial += torn
        for run in runs:
            if run.step in effective:
                superseded.append(effective[run.step])
            effective[run.step] = run
    return Trajectory(effective, superseded, partial)


@dataclass
class DataCheck:
    """Exactly-once: per epoch, how many samples were consumed, repeated, and missed."""

    ok: bool
    samples: int  # consumed in the effective run
    epochs: list[tuple[int, int, int, int]]  # (epoch, consumed, repeated ids, missing ids)
    problems: list[str]

    def summary(self) -> str:
        parts = [f"epoch {e}: {n} samples, {d} repeated, {m} missing" for e, n, d, m in self.epochs]
        return "; ".join(parts)


def check_exactly_once(traj: Trajectory, num_samples: int, total_steps: int) -> DataCheck:
    """Every sample exactly once per epoch in the effective run of steps 1..total_steps.

    A complete epoch must hold each of the ``num_samples`` ids once; the last, partial epoch
    must hold no id twice and as many as the cursor says were consumed in it.
    """
    problems: list[str] = []
    steps = traj.steps
    if steps != list(range(1, total_steps + 1)):
        gaps = sorted(set(range(1, total_steps + 1)) - set(steps))
        problems.append(f"the effective run does not cover steps 1..{total_steps}: {gaps}")
    by_epoch: dict[int, Counter[int]] = {}
    cursor = 0
    for s in steps:
        run = traj.effective[s]
        if run.k0 != cursor:
            problems.append(
                f"step {s} started at cursor {run.k0}, the steps before end at {cursor}"
            )
        ids = run.all_ids
        cursor = run.k0 + len(ids)
        for pos, i in enumerate(ids):
            by_epoch.setdefault((run.k0 + pos) // num_samples, Counter())[i] += 1
    epochs = []
    for e in sorted(by_epoch):
        counts = by_epoch[e]
        consumed = sum(counts.values())
        repeated = sum(1 for c in counts.values() if c > 1)
        full = (e + 1) * num_samples <= cursor
        expected = num_samples if full else cursor - e * num_samples
        missing = expected - len(counts)
        stray = [i for i in counts if not 0 <= i < num_samples]
        if repeated or missing or stray or consumed != expected:
            problems.append(
                f"epoch {e}: {consumed} consumed, {repeated} ids repeated, {missing} missing, "
                f"{len(stray)} unknown (expected {expected} distinct)"
            )
        epochs.append((e, consumed, repeated, missing))
    return DataCheck(not problems, sum(n for _, n, _, _ in epochs), epochs, problems)


def same_batches(a: Trajectory, b: Trajectory, per_rank: bool) -> list[int]:
    """Steps whose batches differ: as one global set, or rank by rank (same world size)."""
    diff = []
    for s in sorted(set(a.effective) | set(b.effective)):
        ra, rb = a.effective.get(s), b.effective.get(s)
        if ra is None or rb is None:
            diff.append(s)
        elif per_rank and ra.ids != rb.ids:
            diff.append(s)
        elif sorted(ra.all_ids) != sorted(rb.all_ids):
            diff.append(s)
    return diff


@dataclass
class RestoreCheck:
    """Every resumed attempt loaded exactly the state some earlier attempt saved."""

    ok: bool
    restores: list[tuple[AttemptId, int | None]]  # (attempt, step restored or None)
    problems: list[str]


def check_restores(attempts: list[Attempt]) -> RestoreCheck:
    """Each restore's state checksum and data cursor equal those logged when that step was
    saved by an earlier attempt; a fresh start after a committed save is a problem too."""
    saves: dict[int, dict[str, Any]] = {}
    committed_any = False
    restores: list[tuple[AttemptId, int | None]] = []
    problems: list[str] = []
    for a in attempts:
        for rank in sorted(a.ranks):
            ready = a.first("ready", rank)
            if ready is None:
                continue
            step = ready["restored"]
            if rank == 0:
                restores.append((a.id, step))
            if step is None:
                if committed_any and rank == 0:
                    problems.append(f"attempt {a.id} started from scratch after a commit")
                continue
            saved = saves.get(step)
            if saved is None:
                problems.append(f"attempt {a.id} rank {rank} restored step {step}, never saved")
            elif (saved["state_crc"], saved["cursor"]) != (ready["state_crc"], ready["cursor"]):
                problems.append(
                    f"attempt {a.id} rank {rank} restored step {step} with state "
                    f"{ready['state_crc']} at cursor {ready['cursor']}; it was saved as "
                    f"{saved['state_crc']} at cursor {saved['cursor']}"
                )
        for e in a.events("save"):
            if e.get("saved"):
                saves[int(e["step"])] = e
        committed_any = committed_any or any(e["status"] == "committed" for e in a.events("commit"))
    return RestoreCheck(not problems, restores, problems)
