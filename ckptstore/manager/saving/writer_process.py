"""Background saves in a separate process: ``CheckpointManager(background="process")``.

One long-lived writer process per rank, started with the manager: a fresh interpreter
running ``writer_main`` (never a fork), started and watched by ``writer_child``;
``writer_protocol`` has what the two say. The writers form their own gloo group through a
rendezvous store that rank 0 hosts (a new server per manager, its address sent over the
manager's control group, keys under a prefix per manager and writer generation), so their
collectives never meet training's and no writer reads a key a dead attempt wrote. A
writer that dies is seen at once (its socket closes): its save fails with
``WriterProcessDiedError``, the rank marks the group broken so the other ranks' writers
stop waiting, and every rank starts a new writer at the next save.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from ckptstore.errors import CkptStoreError, ConfigError, WriterProcessDiedError, torch_name
from ckptstore.manager.saving.shared_arena import Arena, StagedState
from ckptstore.manager.saving.writer_child import (
    POLL_S,
    GroupBroken,
    WriterChild,
    WriterDied,
    exit_description,
)
from ckptstore.manager.saving.writer_protocol import (
    PG_TIMEOUT,
    Fetch,
    Fetched,
    Outcome,
    Rendezvous,
    SaveJob,
    WriterSettings,
    connect,
    rebuild_error,
)

__all__ = ["BackgroundWriter"]

log = logging.getLogger(__name__)


def _advertised_host() -> str:
    """An address of rank 0 that every rank reaches: the default store's host if it is a
    TCPStore, else MASTER_ADDR, else this host's name."""
    with torch_name("torch.distributed.distributed_c10d._get_default_store"):
        from torch.distributed.distributed_c10d import _get_default_store

    try:
        store: Any = _get_default_store()
    except (RuntimeError, ValueError):
        store = None
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return str(store.host)
    return os.environ.get("MASTER_ADDR") or socket.gethostname()


class BackgroundWriter:
    """This rank's writer process and its place in the writers' group.

    Call order (training side, every rank; the manager drives it)::

        bg = BackgroundWriter(settings, broadcast)  # rank 0 hosts the rendezvous store,
                                                    # its address reaches every rank; each
                                                    # rank starts its writer (at once)
        bg.needs_restart()                          # save: a writer died or its group
        bg.restart()                                # broke; agreed across ranks, every
                                                    # rank starts a new one
        bg.check_started()                          # save: raises if the writer said it
                                                    # could not start; never waits
        bg.ensure_ready()                           # save thread: the writer joined its
                                                    # group (waits on the first save only)
        bg.save(step, staged, arena, timings,       # save thread: the job (and the arena's
                on_fetch=...)                       # fd, once per writer), its Fetch
                                                    # requests answered; raises the
                                                    # writer's error or WriterProcessDiedError
        bg.close()                                  # asks the writer to exit, kills it
                                                    # after a grace period, reaps it
    """

    def __init__(
        self, settings: WriterSettings, broadcast: Callable[[Any], Any] | None = None
    ) -> None:
        if not isinstance(settings.root, str):
            try:
                pickle.dumps(settings.root)
            except Exception as exc:  # noqa: BLE001 - whatever pickling raised
                raise ConfigError(
                    f"background='process' sends the root to the writer process, and "
                    f"{settings.root!r} cannot be pickled ({exc}); pass the root as a URL"
                ) from exc
        self.rank = settings.rank
        self._store: Any = None
        rendezvous = None
        if broadcast is not None:
            if self.rank == 0:
                host = _advertised_host()
                self._store = dist.TCPStore(
                    host, 0, is_master=True, wait_for_workers=False, timeout=PG_TIMEOUT
                )
                prefix = f"ckptstore-writer/{uuid.uuid4().hex}"
                rendezvous = Rendezvous(host, int(self._store.port), prefix)
            rendezvous = broadcast(rendezvous)
            if self.rank != 0:
                self._store = connect(rendezvous, self.rank)
        self.settings = replace(
            settings,
            rendezvous=rendezvous,
            parent_pid=os.getpid(),
            sys_path=tuple(p for p in sys.path if p),
        )
        self.broken = False
        #: The last save's outcome (its timings, how many arenas the writer has mapped).
        self.last: Outcome | None = None
        self.writer = WriterChild(self.settings)

    # -- the group's health, through the rendezvous store --------------------------------
    def _broken_key(self) -> str:
        assert self.settings.rendezvous is not None
        return f"{self.settings.rendezvous.prefix}/gen{self.settings.generation}/broken"

    def _mark_broken(self, why: str) -> None:
        self.broken = True
        if self._store is not None:
            try:
                self._store.set(self._broken_key(), why)
            except RuntimeError as exc:  # the store's host (rank 0) is gone
                log.warning("could not tell the other ranks that %s: %s", why, exc)

    def _group_broken(self) -> str | None:
        if self._store is None:
            return None
        try:
            if self._store.check([self._broken_key()]):
                return bytes(self._store.get(self._broken_key())).decode()
        except RuntimeError:
            return None
        return None

    # -- life cycle ----------------------------------------------------------------------
    def needs_restart(self) -> bool:
        """True when this rank's writer must be replaced before the next save.

        That is when a save or the start found it or its group broken, or when the process
        exited since the last save (logged as a warning).
        """
        if not self.broken and not self.writer.alive():
            log.warning(
                "the background writer process %s between saves; starting a new one",
                exit_description(self.writer.proc.returncode),
            )
            self.broken = True
        return self.broken

    def restart(self) -> None:
        """Replace this rank's writer with a new one (every rank calls it together)."""
        self.writer.kill()
        self.writer.close()
        self.settings = replace(self.settings, generation=self.settings.generation + 1)
        self.broken = False
        self.writer = WriterChild(self.settings)

    def check_started(self) -> None:
        """Raise why the writer could not start if it has said so already; never wait
        (a writer still starting is waited for by ``ensure_ready``)."""
        if not self.writer.ready and self.writer.answered():
            self.ensure_ready()

    def ensure_ready(self) -> None:
        """Wait until the writer has joined its group; raise why it could not."""
        if self.writer.ready:
            return
        outcome = self._wait(None)
        if outcome.error is not None:
            exc = rebuild_error(outcome)
            self._mark_broken(f"the writer process of rank {self.rank} failed to start ({exc})")
            self.writer.kill()
            raise exc
        self.writer.ready = True

    def save(
        self,
        step: int,
        staged: StagedState,
        arena: Arena,
        timings: dict,
        overwrite: bool = False,
        on_fetch: Callable[[Fetch], Fetched] | None = None,
        local: bool = False,
    ) -> Outcome:
        """Have the writer save ``staged`` as ``step`` (``local``: to the local tier alone);
        its outcome, or raise its error. ``on_fetch`` answers the writer's requests for
        the next round of ``staged``."""
        job = SaveJob(step, staged, timings, overwrite, local)
        try:
            self.writer.request(job, arena)
        except WriterDied as died:
            raise self._died(died, step) from None
        outcome = self._wait(step, on_fetch)
        self.last = outcome
        if outcome.error is None:
            return outcome
        exc = rebuild_error(outcome)
        if self._store is not None and not isinstance(exc, CkptStoreError):
            # A collective failed: perhaps another rank's writer died. Its rank says so
            # in the store within moments; name that rather than a socket error.
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                why = self._group_broken()
                if why:
                    self.broken = True
                    raise self._peer_error(why) from exc
                time.sleep(POLL_S)
        raise exc

    def _wait(
        self, step: int | None, on_fetch: Callable[[Fetch], Fetched] | None = None
    ) -> Outcome:
        try:
            return self.writer.wait(self._group_broken, on_fetch)
        except WriterDied as died:
            raise self._died(died, step) from None
        except GroupBroken as gb:
            self.broken = True
            raise self._peer_error(str(gb)) from None

    def _died(self, died: WriterDied, step: int | None) -> WriterProcessDiedError:
        what = (
            f"while saving step {step}; step {step} was not committed (the checkpoints "
            "committed before it are intact)"
            if step is not None
            else "while starting"
        )
        why = (
            f"the background writer process of rank {self.rank} (pid {self.writer.proc.pid}) "
            f"{exit_description(died.code)} {what}"
        )
        self._mark_broken(why)
        return WriterProcessDiedError(f"{why}; a new writer process starts at the next save")

    def _peer_error(self, why: str) -> WriterProcessDiedError:
        return WriterProcessDiedError(
            f"{why}; the writer of rank {self.rank} was stopped too, and new writer processes "
            "start at the next save"
        )

    def close(self) -> None:
        """Stop the writer (asked to exit, killed after a grace period, reaped) and drop
        the rendezvous store (rank 0's is the server the other ranks' writers use)."""
        self.writer.close()
        self._store = None
