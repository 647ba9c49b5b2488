"""Where a ``CheckpointManager``'s saves run: the ``SaveBackend`` protocol and its two kinds.

``ThreadBackend`` (``thread_backend``) stages into host memory and calls ``save_step`` on
a thread of the training process; ``ProcessBackend`` (``process_backend``) stages into
shared memory and has this rank's writer process call the same ``save_step``.
``make_backend`` picks one from the save's options, once, in the manager's constructor;
for ``background="auto"`` an ``AutoBackend`` (``auto_backend``) picks one of the two by
the node's resources and the first save's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.manager.agreement import Agreement
from ckptstore.manager.options import SaveOptions
from ckptstore.manager.saving.auto_backend import AutoBackend, node_share
from ckptstore.manager.saving.process_backend import ProcessBackend
from ckptstore.manager.saving.thread_backend import ThreadBackend
from ckptstore.manager.saving.writer_protocol import WriterSettings

__all__ = ["SaveBackend", "make_backend"]


class SaveBackend(Protocol):
    """How saves run once the manager has decided to save.

    Call order (every rank calls each method in the same order; the manager drives it)::

        backend = make_backend(...)             # CheckpointManager.__init__, once: picks
                                                # ThreadBackend or ProcessBackend
        backend.settle(state)                   # save(), training thread, every rank, every
                                                # save (``state`` None on a rank that could
                                                # not flatten it): AutoBackend's first one
                                                # settles its choice (a collective); else
                                                # nothing
        prepared = backend.prepare(state)       # save(), training thread, before the save's
                                                # agreement (a save may be in flight): every
                                                # check that can refuse ``state`` (its
                                                # Statefuls already flattened); raises
                                                # ConfigError, copies nothing
        error = backend.start_error()           # save(), between saves (none in flight on
        restart = backend.needs_restart()       # this rank): this rank's part of the save's
                                                # agreement (an error: it cannot take the save;
                                                # True: its writer must be replaced)
        backend.reserve(prepared)               # save(), between saves, before the agreement
                                                # it joins: the staging memory ``prepared``
                                                # needs, allocated (StagingMemoryError)
        backend.ensure_ready(restart)           # save(), training thread, every rank together,
                                                # ``restart`` as agreed (any rank's): ready to
                                                # take a save (never waits for a writer start)
        staged, nbytes = backend.stage(prepared, defer)
                                                # save(), training thread: the state copied
                                                # out, but for the tensors ``defer`` names
                                                # (None: none), which ``write`` copies first
        backend.deferred_bytes(staged)          # save(): the bytes left to ``write`` (0:
                                                # none; then no tensor is live either)
        warnings = backend.write(step, staged, timings, overwrite, local)
                                                # the manager's save thread (or inline with
                                                # async_save=False), at most one at a time:
                                                # serialise, upload and commit through
                                                # ``save_step`` (``local``: to the local tier
                                                # alone); raises the save's error, else
                                                # returns the post-commit warnings
        waited = backend.wait_staged(staged)    # training thread, after starting
                                                # ``write`` (save(), or with deferred bytes
                                                # the optimizer's next step): training may
                                                # change ``state`` once it returns
        backend.close()                         # once, after the last ``write`` returned
    """

    #: "thread" or "process": where the saves run; ``reason``: why (what the manager
    #: reports: the option given, or ``background="auto"``'s rule).
    name: str
    reason: str

    def settle(self, state: dict[str, Any] | None) -> None:
        """Settle what depends on the first save's ``state`` (see the call order)."""

    def prepare(self, state: dict[str, Any]) -> Any:
        """Check ``state`` for ``stage`` without copying it (ConfigError if it cannot be
        staged); safe while a save is in flight."""

    def start_error(self) -> BaseException | None:
        """Why this rank cannot take a save now, else None (only between saves)."""

    def needs_restart(self) -> bool:
        """True when what runs the saves must be replaced first (this rank's view)."""

    def reserve(self, prepared: Any) -> None:
        """Allocate the staging memory ``prepare``'s result needs (StagingMemoryError if it
        cannot be had); only between saves (none in flight on this rank)."""

    def ensure_ready(self, restart: bool) -> None:
        """Make the backend able to take a save; ``restart``: some rank's
        ``needs_restart`` said so (every rank calls it with the same value)."""

    def stage(self, prepared: Any, defer: Callable[[Any], bool] | None) -> tuple[Any, int]:
        """Copy the state ``prepare`` checked out of training's hands, but for the tensors
        ``defer`` is true for (left to ``write``, when the backend can): (the staged
        state, its tensor bytes)."""

    def deferred_bytes(self, staged: Any) -> int:
        """The bytes of ``staged`` that ``write`` copies before it writes (0: none)."""

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool, local: bool
    ) -> list[str]:
        """Save ``staged`` as ``step`` (``local``: to the local tier alone); the
        post-commit warnings, or raise its error."""

    def wait_staged(self, staged: Any) -> float:
        """Return once training may change the state ``staged`` came from: the seconds
        waited beyond the copy (the manifest's ``blocking_s`` includes them too)."""

    def close(self) -> None:
        """Free the staging memory and stop whatever runs the saves."""


def make_backend(
    root: str | Store,
    retrying_root: Store,
    options: SaveOptions,
    *,
    engine: TransferEngine,
    rank: int,
    world_size: int,
    process_group: Any,
    agree: Agreement,
    local_ranks: int = 1,
    asynchronous: bool = True,
) -> SaveBackend:
    """The backend ``options.background`` names (checked by ``ManagerOptions``); for
    "auto" an ``AutoBackend`` over both, with this rank's share of the node (``local_ranks``
    ranks on it) and whether saves are ``asynchronous``. A collective (every rank calls
    it, in the manager's constructor).

    ``root`` is the manager's argument as given (a writer process reopens it from that);
    ``retrying_root`` the manager's store, retried per the engine's policy."""

    def process() -> ProcessBackend:
        settings = WriterSettings(root, options, rank, world_size=world_size)
        return ProcessBackend(settings, agree)

    def thread() -> ThreadBackend:
        return ThreadBackend(retrying_root, options, engine=engine, process_group=process_group)

    if options.background == "auto":
        share = node_share(local_ranks)
        return AutoBackend(thread, process, agree, share, asynchronous, isinstance(root, str))
    return process() if options.background == "process" else thread()
