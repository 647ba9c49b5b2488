"""Process groups that survive a restart under torchrun's default settings.

Under torchrun's stock rendezvous (static or c10d; torch 2.13) every attempt of the worker group
gets the rank-0 agent's one TCPStore, with no per-attempt prefix, and a process group's
keys are named by a counter that restarts at 0: a restarted group finds the dead attempt's
gloo addresses under its own keys, and a rank that reads one before its peer rewrote it
fails ("Gloo connectFullMesh failed"). ``TORCHELASTIC_RESTART_COUNT`` cannot name the
attempt (each agent counts its own restarts; pytorch#135712, #108158). So
:func:`init_process_group` meets in that store under a prefix fresh for the attempt (the
details: its docstring), and :func:`fresh_new_group` gives a library that did not create
the default group (the CheckpointManager) a ``dist.new_group`` no earlier attempt used.
Under ``--rdzv-backend ckptstore-c10d`` every round's workers get a store of their own
(:mod:`ckptstore.rendezvous`), and plain ``dist.init_process_group`` is enough.

    ckptstore.launch.init_process_group("gloo")      # every rank, once, before anything
    ...                                              # else distributed
    dist.destroy_process_group()                     # or left to the exit hook

Both call :func:`check_rendezvous` once, which warns when the agent runs stock c10d on
several nodes (``ckptstore.rendezvous`` is the backend to use).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ckptstore.errors import ConfigError, torch_name

__all__ = [
    "check_rendezvous",
    "fresh_new_group",
    "init_process_group",
    "made_here",
    "rendezvous_backend",
    "shares_agent_store",
]

log = logging.getLogger(__name__)

BASE = "ckptstore/attempt"
POLL_S = 0.01
_OURS: set[int] = set()  # id() of default groups this module created
_CHECKED: list[bool] = []  # check_rendezvous ran in this process


def shares_agent_store() -> bool:
    """True in a torchrun worker whose store is the agent's, shared by every attempt."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def rendezvous_backend(agent_args: Sequence[str], env: dict[str, str]) -> str | None:
    """The ``--rdzv-backend`` a torchrun agent run as ``agent_args`` uses (its argument,
    else ``PET_RDZV_BACKEND`` from ``env``, as torchrun reads it), or None if not named."""
    for i, arg in enumerate(agent_args):
        if arg in ("--rdzv-backend", "--rdzv_backend") and i + 1 < len(agent_args):
            return agent_args[i + 1]
        if arg.startswith(("--rdzv-backend=", "--rdzv_backend=")):
            return arg.partition("=")[2]
        if arg.endswith(".py"):  # the training script: what follows are its own arguments
            break
    return env.get("PET_RDZV_BACKEND")


def check_rendezvous() -> None:
    """Warn once (rank 0) when this worker's torchrun agent uses stock c10d with its store
    shared on a job of several nodes: a replaced or added node would never join (torch's
    handler publishes the store in its first round only); ``ckptstore-c10d`` fixes that."""
    if _CHECKED or not shares_agent_store():
        return
    _CHECKED.append(True)
    if os.environ.get("RANK", "0") != "0" or int(os.environ.get("GROUP_WORLD_SIZE", "1")) < 2:
        return
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            agent = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:  # not Linux, or the agent is gone: torchrun's environment alone
        agent = []
    if rendezvous_backend(agent, dict(os.environ)) == "c10d":
        log.warning(
            "torchrun's stock c10d rendezvous shares one store with the workers but publishes "
            "it in its first round only: a replaced or added node would wait for it until the "
            "rendezvous times out. Launch with --rdzv-backend ckptstore-c10d (the same "
            "options otherwise; docs/multinode.md)."
        )


def made_here() -> bool:
    """True if the current default group was made by :func:`init_process_group`."""
    return dist.is_initialized() and id(dist.group.WORLD) in _OURS


def _agree(store: Any, rank: int, world_size: int, timeout: timedelta) -> str:
    """A token every rank of this attempt gets from rank 0, and no earlier attempt had.

    Rank r > 0 publishes a fresh nonce under ``join/r`` and waits for ``welcome/<nonce>``:
    a key only this attempt's rank 0 can write, since only it has seen the nonce. Rank 0
    answers every nonce it finds under ``join/r`` (a dead attempt's too; harmless) until
    each rank has confirmed under ``<token>/joined/r``, a key named by its own fresh token.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    if rank == 0:
        token = uuid.uuid4().hex
        answered: dict[int, bytes] = {}
        pending = list(range(1, world_size))
        while pending:
            for r in pending:
                join = f"{BASE}/join/{r}"
                if store.check([join]):
                    nonce = bytes(store.get(join))
                    if answered.get(r) != nonce:
                        store.set(f"{BASE}/welcome/{nonce.decode()}", token)
                        answered[r] = nonce
            pending = [r for r in pending if not store.check([f"{BASE}/{token}/joined/{r}"])]
            if pending and time.monotonic() > deadline:
                raise ConfigError(
                    f"ranks {pending} did not join the process group within {timeout}; "
                    "check that every worker of the job started"
                )
            if pending:
                time.sleep(POLL_S)
        return token
    mine = uuid.uuid4().hex
    welcome = f"{BASE}/welcome/{mine}"
    store.set(f"{BASE}/join/{rank}", mine)
    while not store.check([welcome]):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"rank {rank} heard nothing from rank 0 within {timeout}; check that every "
                "worker of the job started and that MASTER_ADDR is reachable"
            )
        time.sleep(POLL_S)
    token = bytes(store.get(welcome)).decode()
    store.set(f"{BASE}/{token}/joined/{rank}", b"1")
    store.delete_key(welcome)
    return token


def init_process_group(backend: str = "gloo", timeout: timedelta | None = None) -> None:
    """``dist.init_process_group(backend)`` from torchrun's environment, in a store
    namespace of this attempt's own.

    It meets in torchrun's agent store under a prefix fresh for the attempt (the module
    docstring says why), agreed through keys no earlier attempt can have written (each
    rank's own random nonce), then creates the default group there; every later
    ``new_group`` (the CheckpointManager's too) nests under it. Without the agent store (no
    torchrun, or ``TORCHELASTIC_USE_AGENT_STORE`` not ``True``) it is plain
    ``dist.init_process_group``.

    A group this made and the program did not destroy is destroyed by an exit hook
    (:func:`_destroy_at_exit`), before the interpreter is torn down.
    """
    timeout = timeout or timedelta(minutes=10)
    check_rendezvous()
    if not shares_agent_store():
        dist.init_process_group(backend, timeout=timeout)
        _made()
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    client = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    token = _agree(client, rank, world_size, timeout)
    store = dist.PrefixStore(f"{BASE}/{token}/", client)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    _made()


def _made() -> None:
    """Note the new default group as this module's; the first one registers the exit hook."""
    if not _OURS:
        atexit.register(_destroy_at_exit)
    _OURS.add(id(dist.group.WORLD))


def _destroy_at_exit() -> None:
    """Destroy the default group (and every group under it, the CheckpointManager's too) if
    :func:`init_process_group` made it, it is still alive and the program did not die of an
    exception. A process that ends its work with a gloo group alive can abort at interpreter
    teardown ("terminate called without an active exception", SIGABRT, after its work
    succeeded): gloo's worker threads still hold work objects whose tensors need the GIL
    then (pytorch/pytorch#179291 proposed this hook for every group and was abandoned; a
    group this module made is ours to end). A program that died of an exception (a peer
    gone, say) is left to exit at once: destroying waits for the group's pending work, and
    its launcher restarts it only once it has exited. Runs after ``threading``'s exit join
    (the manager's threads are done) and before modules are torn down; an exit hook the
    program registered before ``init_process_group`` runs after this one."""
    died = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if died is not None or not made_here():
        return
    try:
        dist.destroy_process_group()
    except (RuntimeError, ValueError) as e:  # exiting anyway: say it, never a traceback
        log.debug("ckptstore: destroying the process group at exit failed: %s", e)


def fresh_new_group(backend: str = "gloo", timeout: timedelta | None = None) -> Any:
    """``dist.new_group(backend=backend)`` (all ranks) whose store keys no earlier attempt
    wrote. Under a default group from :func:`init_process_group`, or outside torchrun's
    shared store, that is plain ``new_group``; else the group is named from a number
    rank 0 draws and broadcasts on the default group (whose own connection is fresh),
    and the name counter is put back for the caller's own groups."""
    check_rendezvous()
    if made_here() or not shares_agent_store():
        return dist.new_group(backend=backend, timeout=timeout)
    box = [secrets.randbits(62) | (1 << 62)]  # far above any counter a program reaches
    dist.broadcast_object_list(box, src=0)
    with torch_name("torch.distributed.distributed_c10d._world.group_count"):
        world = dist.distributed_c10d._world
        saved = world.group_count
    world.group_count = box[0]
    try:
        return dist.new_group(backend=backend, timeout=timeout)
    finally:
        world.group_count = saved
