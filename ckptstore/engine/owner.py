"""A checkpoint root's owner: one live job (run) per root, never two mixed in.

    run = run_identity(run_id)        # the explicit id, else one from the launcher
    lease = claim_root(root, run)     # RootInUseError naming the other live run
    ...                               # lease.ensure_fresh() before each save
    lease.stop()                      # at close: the root is free again

The owner is a lease (``engine.lease``) at ``<root>/ckptstore.owner.json``, refreshed every
``HEARTBEAT_S`` by the holder (rank 0 of a ``CheckpointManager``); when a claim succeeds is
:func:`claim_root`'s docstring, where a run's identity comes from :func:`run_identity`'s.
Each checkpoint's manifest records the run that wrote it (``extra["run"]``). Pure store
calls; no torch.
"""

from __future__ import annotations

import logging
import os
import time

from ckptstore.engine.lease import (
    HEARTBEAT_S,
    STALE_AFTER_S,
    Heartbeat,
    LeaseInfo,
    check_run_id,
    holder_is_dead,
    read_lease,
    this_host,
)
from ckptstore.engine.names import OWNER_NAME
from ckptstore.engine.store import Store
from ckptstore.errors import CommitConflictError, ConfigError, RootInUseError

__all__ = ["OWNER_NAME", "PROBE_S", "run_identity", "read_owner", "claim_root"]

log = logging.getLogger(__name__)

#: How long a claim watches another run's fresh lease for a heartbeat (a live holder
#: rewrites it every ``HEARTBEAT_S``) before it takes that holder for dead.
PROBE_S = 3 * HEARTBEAT_S


def run_identity(run_id: str | None = None) -> str:
    """This job's run identity; ``ConfigError`` for a bad explicit one.

    The first that applies: an explicit ``run_id``; the ``CKPTSTORE_RUN_ID`` environment
    variable; torchelastic's ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``, or the random id of
    ``--standalone``) unless it is ``none`` (torchrun's default without an id); Slurm's
    ``SLURM_JOB_ID`` (kept across requeues); under torchrun without an id,
    ``torchrun:<host>:<agent pid>`` (the agent outlives the workers it restarts); else
    ``proc:<host>:<pid>`` (this process).
    """
    if run_id is not None:
        try:
            return check_run_id(run_id)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    env = os.environ
    for var, prefix in (("CKPTSTORE_RUN_ID", ""), ("TORCHELASTIC_RUN_ID", "torchelastic:")):
        value = env.get(var, "")
        if value and value != "none":
            try:
                return check_run_id(prefix + value, var)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
    if env.get("SLURM_JOB_ID", "").isdigit():
        return f"slurm:{env['SLURM_JOB_ID']}"
    if "TORCHELASTIC_RESTART_COUNT" in env:  # a torchrun worker: its parent is the agent
        return f"torchrun:{this_host()}:{os.getppid()}"
    return f"proc:{this_host()}:{os.getpid()}"


def read_owner(root: Store) -> LeaseInfo | None:
    """The root's owner lease, or None (none, or not a valid lease)."""
    return read_lease(root, OWNER_NAME)


def _refusal(root: Store, run: str, holder: LeaseInfo) -> RootInUseError:
    return RootInUseError(
        f"{root.url} is in use by another live job: {holder.describe()}; this job is run "
        f"{run!r}. Two jobs saving to one root would mix their checkpoints. Give this job "
        "a root of its own; or, if it continues that run, pass the same "
        "CheckpointManager(run_id=...) (or CKPTSTORE_RUN_ID); or, if that job is dead, "
        f"wait until its lease is stale ({STALE_AFTER_S:.0f} s after its last heartbeat)."
    )


def _next_beat(root: Store, holder: LeaseInfo) -> LeaseInfo | None:
    """The owner lease once it changes within ``PROBE_S`` (``holder`` is alive, or another
    claimant came), or None: nobody rewrote it (its holder is gone) or it was released."""
    deadline = time.monotonic() + PROBE_S
    while time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        now = read_owner(root)
        if now is None:
            return None
        if (now.token, now.time) != (holder.token, holder.time):
            return now
    return None


def claim_root(root: Store, run: str) -> Heartbeat:
    """Own ``root`` for run ``run``: its started heartbeat, or ``RootInUseError`` naming
    the live owner of another run.

    A claim succeeds when there is none, when it names this same run (a worker torchrun
    restarted, a second manager of the same process), when its holder is stale
    (``STALE_AFTER_S`` without a heartbeat: a job that died) or when its holder's process is
    gone (same machine and pid namespace, pid not alive: a job that crashed and was started
    again at once). A fresh lease of another run on another machine is watched for up to
    ``PROBE_S`` (three heartbeats): a live holder rewrites it meanwhile, and the claim
    raises ``RootInUseError`` naming the holder (run, host, pid, heartbeat age) and what to
    do; one that does not is a job that died moments ago (preempted, rescheduled elsewhere),
    and it is taken over with a warning, instead of failing the restarted job's first save
    until ``STALE_AFTER_S`` has passed.

    Two jobs that take over one stale lease at the same moment both write it; each re-reads
    it right away, and at the next heartbeat at the latest the one that lost sees the
    other's run and stops (``ensure_fresh`` raises at its next save).
    """
    lease = Heartbeat(root, OWNER_NAME, run, guard_run=True)
    for _ in range(3):
        holder = read_owner(root)
        if holder is not None and holder.run != run:
            if holder.fresh() and not holder_is_dead(holder):
                beat = _next_beat(root, holder)
                if beat is not None:
                    raise _refusal(root, run, beat)
                log.warning(
                    "taking over %s from %s: no heartbeat for %.0f s, so that job is gone "
                    "(a live one rewrites its lease every %.0f s)",
                    root.url,
                    holder.describe(),
                    holder.age(),
                    HEARTBEAT_S,
                )
        if holder is None and not root.exists(OWNER_NAME):
            try:
                root.put_if_absent(OWNER_NAME, lease.document())
            except CommitConflictError:
                continue  # another job claimed it just now: look at who
        lease.start()  # (re)writes it, now ours
        time.sleep(0.05)  # a racing claimant's write lands before we look again
        holder = read_owner(root)
        if holder is not None and holder.token != lease.info.token and holder.run != run:
            lease.stop(delete=False)
            raise _refusal(root, run, holder)
        return lease
    holder = read_owner(root)
    raise (
        _refusal(root, run, holder)
        if holder
        else RootInUseError(
            f"{root.url}: could not claim {OWNER_NAME}: it kept changing, or something that "
            "is not a lease (a FIFO, a directory; see the warning) holds its name. Remove "
            "what is not ckptstore's there and try again"
        )
    )
