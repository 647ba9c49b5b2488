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

An owner file that is not a valid lease (a symlink, a directory, a FIFO, more than
``MAX_LEASE_BYTES``, not JSON, not a lease) is never taken over: a live holder never writes
one, so it is either damage or something planted to let a second job in. A claim watches
it for ``PROBE_S`` (a live holder's heartbeat would replace it) and then raises
``OwnerFileError`` naming it and the command that clears it, ``ckptstore-tool gc ROOT
--repair`` (:func:`plan_repair` / :func:`apply_repair`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from ckptstore.engine.bounded import get_capped
from ckptstore.engine.lease import (
    HEARTBEAT_S,
    MAX_LEASE_BYTES,
    STALE_AFTER_S,
    Heartbeat,
    LeaseInfo,
    check_run_id,
    holder_is_dead,
    parse_lease,
    this_host,
)
from ckptstore.engine.names import OWNER_NAME
from ckptstore.engine.store import Store
from ckptstore.errors import (
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    InUseError,
    OwnerFileError,
    RootInUseError,
    StoreNotFoundError,
)

__all__ = [
    "OWNER_NAME",
    "PROBE_S",
    "OwnerState",
    "RepairPlan",
    "run_identity",
    "read_owner",
    "owner_state",
    "claim_root",
    "plan_repair",
    "apply_repair",
]

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


@dataclass(frozen=True)
class OwnerState:
    """What ``<root>/ckptstore.owner.json`` is: a valid ``lease``, nothing (both None), or
    something that is not a valid lease (``bad``: what it is, naming the file)."""

    lease: LeaseInfo | None = None
    bad: str | None = None
    directory: bool = False  # ``bad`` is a directory (never removed by ckptstore)


def owner_state(root: Store) -> OwnerState:
    """Read the owner file once, bounded (``MAX_LEASE_BYTES``; only a regular file is
    opened, never through a link or a FIFO), and say what it is."""
    where = root.describe(OWNER_NAME)
    try:
        data = get_capped(root, OWNER_NAME, MAX_LEASE_BYTES, advice="")
    except (StoreNotFoundError, CorruptCheckpointError) as exc:
        # A volume refuses a directory like a FIFO (UnsafePathError); an object store has
        # no object there: a listing tells a directory (never removed by ckptstore) apart.
        if _is_directory(root):
            return OwnerState(bad=f"{where} is a directory, not a lease file", directory=True)
        if isinstance(exc, StoreNotFoundError):
            return OwnerState()
        return OwnerState(bad=str(exc).rstrip("."))  # a link, FIFO, device, oversize
    try:
        return OwnerState(lease=parse_lease(data, where))
    except CorruptCheckpointError as exc:
        return OwnerState(bad=str(exc).rstrip("."))


def _is_directory(root: Store) -> bool:
    """Whether a directory (a volume's) holds the owner file's name. Only asked when a read
    found no file: a listing of the root, where that is rare (no owner yet, or damage)."""
    return any(e.name == OWNER_NAME and e.kind == "dir" for e in root.scan())


def read_owner(root: Store) -> LeaseInfo | None:
    """The root's owner lease, or None (none, or not a valid lease: :func:`owner_state`
    tells the two apart)."""
    return owner_state(root).lease


def _bad_owner(root: Store, state: OwnerState, watched: float) -> OwnerFileError:
    fix = (
        "remove that directory by hand (ckptstore never makes one there), then start the job again"
        if state.directory
        else f"see what it is, then run: ckptstore-tool gc {root.url} --repair (it shows "
        "what it would remove; add --apply to remove it)"
    )
    return OwnerFileError(
        f"{root.url}: the root's owner file is not a valid lease: {state.bad}. It stayed so "
        f"for {watched:.0f} s, so no live job is rewriting it; ckptstore never takes over an "
        "owner file it cannot read (it could hide a live job of another run). Nothing was "
        f"saved. To clear it: {fix}."
    )


def _watch_bad(root: Store, probe_s: float) -> OwnerState:
    """The owner file's state once it stops being an invalid one within ``probe_s`` (a
    live holder's heartbeat replaced it, or it was removed), else its last invalid state."""
    deadline = time.monotonic() + probe_s
    state = owner_state(root)
    while state.bad is not None and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        state = owner_state(root)
    return state


def _refusal(root: Store, run: str, holder: LeaseInfo) -> RootInUseError:
    return RootInUseError(
        f"{root.url} is in use by another live job: {holder.describe()}; this job is run "
        f"{run!r}. Two jobs saving to one root would mix their checkpoints. Give this job "
        "a root of its own; or, if it continues that run, pass the same "
        "CheckpointManager(run_id=...) (or CKPTSTORE_RUN_ID); or, if that job is dead, "
        f"wait until its lease is stale ({STALE_AFTER_S:.0f} s after its last heartbeat)."
    )


def _next_beat(root: Store, holder: LeaseInfo, probe_s: float) -> LeaseInfo | None:
    """The owner lease once it changes within ``probe_s`` (``holder`` is alive, or another
    claimant came), or None: nobody rewrote it (its holder is gone) or it was released."""
    deadline = time.monotonic() + probe_s
    while time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        now = read_owner(root)
        if now is None:
            return None
        if (now.token, now.time) != (holder.token, holder.time):
            return now
    return None


def claim_root(root: Store, run: str, *, probe_s: float | None = None) -> Heartbeat:
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

    An owner file that is not a valid lease is watched the same ``PROBE_S`` (``probe_s``)
    and, if it stays so, refused with ``OwnerFileError`` (a ``RootInUseError``): never
    taken over, never written through.
    """
    probe = PROBE_S if probe_s is None else probe_s
    lease = Heartbeat(root, OWNER_NAME, run, guard_run=True)
    for _ in range(3):
        state = owner_state(root)
        if state.bad is not None:
            state = _watch_bad(root, probe)
            if state.bad is not None:
                raise _bad_owner(root, state, probe)
        holder = state.lease
        if holder is not None and holder.run != run:
            if holder.fresh() and not holder_is_dead(holder):
                beat = _next_beat(root, holder, probe)
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
        if holder is None:
            try:
                root.put_if_absent(OWNER_NAME, lease.document())
            except CommitConflictError:
                continue  # another job claimed it just now (or a directory is there): look
        lease.start()  # (re)writes it, now ours
        time.sleep(0.05)  # a racing claimant's write lands before we look again
        holder = read_owner(root)
        if holder is not None and holder.token != lease.info.token and holder.run != run:
            lease.stop(delete=False)
            raise _refusal(root, run, holder)
        return lease
    state = owner_state(root)
    if state.bad is not None:
        raise _bad_owner(root, state, probe)
    if state.lease is not None:
        raise _refusal(root, run, state.lease)
    raise RootInUseError(
        f"{root.url}: could not claim {OWNER_NAME}: it kept changing under this claim. "
        "Another job is starting on this root: give each job a root of its own"
    )


@dataclass(frozen=True)
class RepairPlan:
    """What ``ckptstore-tool gc ROOT --repair`` does about the root's owner file.

    ``action``: ``none`` (no owner file, or a fresh valid lease of a live job: left as it
    is), ``remove`` (not a valid lease, or a valid one whose holder is stale or dead),
    ``by_hand`` (a directory: ckptstore never makes one there, so never removes one).
    ``live`` is the fresh valid lease left alone, if any."""

    root: str
    action: str
    reason: str
    live: LeaseInfo | None = None


def plan_repair(root: Store) -> RepairPlan:
    """The repair of ``root``'s owner file (nothing is changed; :func:`apply_repair` acts)."""
    state = owner_state(root)
    where = root.describe(OWNER_NAME)
    if state.directory:
        return RepairPlan(
            root.url,
            "by_hand",
            f"{state.bad}; ckptstore never makes a directory there, so it does not remove "
            "one: look at what it holds and remove it by hand",
        )
    if state.bad is not None:
        return RepairPlan(root.url, "remove", f"not a valid owner lease: {state.bad}")
    holder = state.lease
    if holder is None:
        return RepairPlan(root.url, "none", f"{where} is absent: nothing to repair")
    if not holder.fresh():
        return RepairPlan(root.url, "remove", f"{where}: a stale lease of {holder.describe()}")
    if holder_is_dead(holder):
        return RepairPlan(
            root.url, "remove", f"{where}: {holder.describe()}, whose process is gone"
        )
    return RepairPlan(
        root.url,
        "none",
        f"{where} is the fresh lease of a live job, {holder.describe()}: left alone (it is "
        f"stale {STALE_AFTER_S:.0f} s after its holder's last heartbeat)",
        live=holder,
    )


def apply_repair(root: Store) -> RepairPlan:
    """Plan the repair again (what is there now) and act on it: a ``remove`` deletes the
    owner file itself, a link as a link (never what it points to). Returns what was done.
    ``InUseError`` when a live job's fresh lease is there now."""
    plan = plan_repair(root)
    if plan.live is not None:
        raise InUseError(plan.reason)
    if plan.action == "remove":
        try:
            root.delete(OWNER_NAME)
        except StoreNotFoundError:
            pass  # gone meanwhile: what repair wanted
    return plan
