"""What the multi-node scenarios share: the job (two torchrun agents as nodes), its run
lengths, and the checks on what the training script logged and wrote."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from harness.nodelog import restore_bytes, restores, tier
from harness.nodes import NodeError, NodeJob

__all__ = [
    "BACKENDS", "EVERY", "GLOBAL_BATCH", "HEARTBEAT_FLOOR_S", "JOIN_PER_STARTUP", "SAMPLES",
    "SCRIPT", "STEPS", "assert_restored_from_peers", "assert_same_final", "final",
    "join_deadline", "job", "restore_bytes", "restores", "tier",
]  # fmt: skip

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "resilience", "train.py")
STEPS, EVERY, SAMPLES, GLOBAL_BATCH = 40, 4, 120, 12  # the kills land mid-run

#: A joining node (a replacement, a new one) may take this many times the job's own
#: start-up (agents launched to every worker in its group): from its agent's launch to its
#: worker in the group is the same work (an agent's start, a rendezvous round, workers'
#: start). Measured: 0.98x on two heavily loaded cores.
JOIN_PER_STARTUP = 1.5
#: ...plus the time a dead node takes to leave the rendezvous: its heartbeats expire after
#: torchrun's keep-alive interval x attempts (5 s x 3), which no start-up figure includes.
HEARTBEAT_FLOOR_S = 15.0


def join_deadline(startup: float) -> float:
    """How long a node may take to join, given the job's start-up in seconds."""
    return JOIN_PER_STARTUP * startup + HEARTBEAT_FLOOR_S


#: The rendezvous backends the join scenarios run under: ckptstore's, and torch's stock
#: c10d as an upstream canary, a strict xfail that passes (and fails the suite) the day a
#: torch release publishes the workers' store in every round; its hang is caught at
#: ``join_deadline``, never at the job's timeout.
BACKENDS = [
    "ckptstore-c10d",
    pytest.param(
        "c10d",
        marks=pytest.mark.xfail(
            strict=True,
            raises=NodeError,
            reason="torch's stock c10d handler publishes the workers' store (MASTER_ADDR) in "
            "its first round only: a node joining a later round waits for that key, or its "
            "workers and the others' meet in two stores (docs/upstream/"
            "torch-rendezvous-join.md). Strict: it passes once torch is fixed.",
        ),
    ),
]


def job(
    d: str,
    data: str,
    max_restarts: int = 1,
    extra: tuple[str, ...] = (),
    root: str = "",
    steps: int = STEPS,
    **kw: Any,
) -> NodeJob:
    """The two-node job of every scenario (``extra``: more training-script arguments;
    ``root``: the checkpoint root, default ``d/ckpt``)."""
    args = [
        "--data", data, "--root", root or f"{d}/ckpt", "--out", f"{d}/out", "--steps", str(steps),
        "--save-every", str(EVERY), "--global-batch", str(GLOBAL_BATCH), "--d-model", "32",
        "--layers", "1", "--ff", "64", *extra,
    ]  # fmt: skip
    kw.setdefault("timeout_s", 240.0)
    return NodeJob(SCRIPT, args, run_dir=d, nnodes=2, max_restarts=max_restarts, **kw)


def final(d: str, rank: int) -> dict[str, Any]:
    return torch.load(f"{d}/out/final.rank{rank}.pt", weights_only=False)


def assert_same_final(d: str, ref: str, steps: int = STEPS) -> None:
    """Ranks 0 and 1 of the run in ``d`` ended at ``steps`` with the model, optimizer and
    RNG state of the run in ``ref``, bitwise."""
    for rank in (0, 1):
        got, want = final(d, rank), final(ref, rank)
        assert got["step"] == want["step"] == steps
        for part in ("model", "optim"):
            flat_got = torch.utils._pytree.tree_flatten(got[part])[0]
            flat_want = torch.utils._pytree.tree_flatten(want[part])[0]
            assert len(flat_got) == len(flat_want)
            for a, b in zip(flat_got, flat_want):
                if isinstance(a, torch.Tensor):
                    assert torch.equal(a, b), part
                else:
                    assert a == b, part
        assert torch.equal(got["rng"], want["rng"])


def assert_restored_from_peers(ready: dict[str, Any], *, nothing_remote: bool) -> None:
    """A node without the step's files (replaced, or joining): its restore received files
    from a peer node and read them locally; with ``nothing_remote`` (the peers held the
    whole step: its commit, logged after its replication, was seen before the node was
    lost, or one node wrote it all) it read nothing from the remote."""
    got = restore_bytes(ready)
    assert tier(ready) == "local" and got["peers"] > 0, ready["restore_log"]
    if nothing_remote:
        assert got["remote"] == 0, ready["restore_log"]
