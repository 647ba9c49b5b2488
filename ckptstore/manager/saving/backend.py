"""Where a ``CheckpointManager``'s saves run: the ``SaveBackend`` protocol and its two kinds.

Call order (every rank calls each method in the same order; the manager drives it)::

    backend = make_backend(...)             # CheckpointManager.__init__, once: picks
                                            # ThreadBackend or ProcessBackend
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
    staged, nbytes = backend.stage(prepared)
                                            # save(), training thread: the state copied out
    warnings = backend.write(step, staged, timings, overwrite)
                                            # the manager's save thread (or inline with
                                            # async_save=False), at most one at a time:
                                            # serialise, upload and commit through
                                            # ``save_step``; raises the save's error, else
                                            # returns the post-commit warnings
    waited = backend.wait_staged(staged)    # save(), training thread, after starting
                                            # ``write``: training may change ``state``
                                            # once it returns
    backend.close()                         # once, after the last ``write`` returned

``ThreadBackend`` copies into a reused host-memory arena (``ArenaStager``, at most
``max_staging_bytes``; DCP's ``DefaultStager`` for a state of sharded tensors without a
budget) and calls ``save_step`` on a thread of the training process, over the manager's
checkpoint gloo group. A state larger than the budget leaves part of its tensors live
(not copied): ``save_step`` writes them first and ``wait_staged`` waits for that. A
``DefaultStager`` copy that cannot be allocated fails the save inside DCP, on every rank.
``ProcessBackend`` copies into a shared-memory arena (``SharedStager``) and has this
rank's writer process (``BackgroundWriter``) call the same ``save_step`` on the writers'
own gloo group. With a budget that arena holds one piece of the state at a time: the
writer writes piece by piece, asking for each, and ``wait_staged`` waits until the last
one is copied.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import StagingMemoryError
from ckptstore.manager.agreement import Agreement
from ckptstore.manager.records import tensor_bytes
from ckptstore.manager.saving.host_arena import ArenaStager, StagedSave
from ckptstore.manager.saving.save_step import save_step
from ckptstore.manager.saving.shared_arena import StagedState
from ckptstore.manager.saving.shared_stager import SharedStager
from ckptstore.manager.saving.slots import allocated
from ckptstore.manager.saving.writer_process import BackgroundWriter
from ckptstore.manager.saving.writer_protocol import Fetch, Fetched, WriterSettings

__all__ = ["ProcessBackend", "SaveBackend", "ThreadBackend", "make_backend"]


class SaveBackend(Protocol):
    """How saves run once the manager has decided to save; see the module docstring."""

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

    def stage(self, prepared: Any) -> tuple[Any, int]:
        """Copy the state ``prepare`` checked out of training's hands: (the staged state,
        its tensor bytes)."""

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool
    ) -> list[str]:
        """Save ``staged`` as ``step``; the post-commit warnings, or raise its error."""

    def wait_staged(self, staged: Any) -> float:
        """Return once training may change the state ``staged`` came from: the seconds
        waited beyond the copy (the manifest's ``blocking_s`` includes them too)."""

    def close(self) -> None:
        """Free the staging memory and stop whatever runs the saves."""


class ThreadBackend:
    """Stages into an ``ArenaStager`` (pinned memory with CUDA) and saves in this process."""

    def __init__(
        self,
        root: Store,
        *,
        engine: TransferEngine,
        local_tier_dir: str | None,
        codec: str,
        key_layout: str,
        process_group: Any,
        max_staging_bytes: int | None = None,
        run_id: str | None = None,
    ) -> None:
        self.root = root
        self.run_id = run_id
        self.engine = engine
        self.local_tier_dir = local_tier_dir
        self.codec = codec
        self.key_layout = key_layout
        self.process_group = process_group
        cuda = torch.cuda.is_available()
        self.arena = ArenaStager(budget=max_staging_bytes, pin=cuda)
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=cuda,
            )
        )

    def prepare(self, state: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """``state`` and the arena's walk of it (``ArenaStager.prepare``)."""
        return state, self.arena.prepare(state)

    def start_error(self) -> BaseException | None:
        """None: the saves run on a thread of this process."""
        return None

    def needs_restart(self) -> bool:
        """Never: the saves run on a thread of this process."""
        return False

    def reserve(self, prepared: tuple[dict[str, Any], Any]) -> None:
        """``ArenaStager.reserve`` (nothing for a state ``DefaultStager`` stages)."""
        self.arena.reserve(prepared[1])

    def ensure_ready(self, restart: bool) -> None:
        """Nothing to wait for: the manager's gloo group exists."""

    def stage(self, prepared: tuple[dict[str, Any], Any]) -> tuple[Any, int]:
        """Copy the state into the arena (a ``StagedSave``), or, for sharded tensors
        without a budget, with DCP's ``DefaultStager`` (synchronous: a dict of copies)."""
        state, walked = prepared
        arena = self.arena.stage(walked)
        if arena is not None:
            return arena, arena.nbytes
        # DefaultStager allocates its copies at every save, after the save's agreement, so
        # a failure cannot join that: the save carries it into DCP's planning step instead,
        # which every rank enters (``save_step``'s refusal), failing there on every rank.
        try:
            staged = allocated(tensor_bytes(state), lambda: self.stager.stage(state))
        except StagingMemoryError as exc:
            return _Refused(exc), 0
        assert isinstance(staged, dict)  # synchronous: a dict, never a Future
        return staged, tensor_bytes(staged)

    def wait_staged(self, staged: Any) -> float:
        """Wait until the save wrote the live tensors (at once when everything was copied)."""
        return staged.wait_released() if isinstance(staged, StagedSave) else 0.0

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool
    ) -> list[str]:
        """Run ``save_step`` on this thread, over the manager's checkpoint group."""
        live = isinstance(staged, StagedSave) and staged.has_live
        refused = isinstance(staged, _Refused)
        try:
            return save_step(
                {} if refused else staged.state if isinstance(staged, StagedSave) else staged,
                self.root,
                step,
                local_tier_dir=self.local_tier_dir,
                codec=self.codec,
                key_layout=self.key_layout,
                engine=self.engine,
                timings=timings,
                process_group=self.process_group,
                overwrite=overwrite,
                is_live=staged.is_live if live else None,
                release=staged.release if live else None,
                refusal=staged.error if refused else None,
                run_id=self.run_id,
            )
        finally:
            if isinstance(staged, StagedSave):
                staged.release()  # a save that failed early never needs the live part again

    def close(self) -> None:
        """Free the stagers' buffers."""
        self.arena.close()
        self.stager.close()


class _Refused:
    """A save ``ThreadBackend.stage`` could not copy: ``write`` fails it on every rank."""

    def __init__(self, error: StagingMemoryError) -> None:
        self.error = error


class _SharedSave:
    """One save staged by ``ProcessBackend``: the ``StagedState`` the writer gets, and
    when training may go on (at once, unless pieces remain to be staged)."""

    def __init__(self, state: StagedState) -> None:
        self.state = state
        self.pieces = state.pieces
        self._released = threading.Event()
        self._staged_at = time.perf_counter()
        self._waited = 0.0
        if self.pieces == 1:
            self._released.set()

    @property
    def released(self) -> bool:
        """True once training may change its state."""
        return self._released.is_set()

    def release(self) -> float:
        """Training may change its state now: the seconds it waited beyond the copy
        (0.0 for one piece); the same on every call."""
        if not self._released.is_set():
            self._waited = time.perf_counter() - self._staged_at
            self._released.set()
        return self._waited

    def wait_released(self) -> float:
        """Return once ``release`` was called: its value."""
        self._released.wait()
        return self._waited


class ProcessBackend:
    """Stages into a shared-memory arena and saves in this rank's writer process.

    The constructor starts the writer (rank 0 also hosts the writers' rendezvous, whose
    address ``agree`` broadcasts). ``ensure_ready`` replaces a writer that died or whose
    group broke (on every rank, if any rank's ``needs_restart`` said so in the save's
    agreement); ``start_error`` is what the writer said if it cannot start, which the
    save's agreement makes every rank raise. Neither waits for
    a writer still starting: ``write`` does (so the first save's blocking time is the
    copy's), and a start that fails then fails that save like any failed save.

    With ``max_staging_bytes`` the arena holds one piece of at most that many bytes at a
    time (``SharedStager``): ``stage`` copies the first, ``write`` stages each other one
    when the writer asks for it (``ckptstore.manager.saving.piecewise``), and ``wait_staged``
    returns once the last piece the writer needs is copied (or the save ended).
    """

    def __init__(
        self, settings: WriterSettings, agree: Agreement, max_staging_bytes: int | None = None
    ) -> None:
        self.agree = agree
        self.stager = SharedStager(pin=torch.cuda.is_available(), budget=max_staging_bytes)
        try:
            self.writer = BackgroundWriter(
                settings, broadcast=agree.broadcast if agree.group is not None else None
            )
        except BaseException:
            self.stager.close()
            raise

    def prepare(self, state: dict[str, Any]) -> Any:
        """``SharedStager.prepare``: plain dense tensors, picklable non-tensor values and,
        with a budget, no tensor larger than it; else ConfigError."""
        return self.stager.prepare(state)

    def start_error(self) -> BaseException | None:
        """What this rank's writer said when it could not start, if it has (it is then
        replaced at the next save); None while it starts, once it is ready, or when it
        must be replaced anyway (``needs_restart``)."""
        if self.writer.needs_restart():
            return None
        try:
            self.writer.check_started()
        except Exception as exc:  # noqa: BLE001 - the writer's own error, raised by the manager
            return exc
        return None

    def needs_restart(self) -> bool:
        """True when this rank's writer died or its group broke."""
        return self.writer.needs_restart()

    def reserve(self, prepared: Any) -> None:
        """``SharedStager.reserve``: the shared-memory arena laid out and allocated."""
        self.stager.reserve(prepared)

    def ensure_ready(self, restart: bool) -> None:
        """Restart this rank's writer process if any rank's must be (``restart``, agreed
        across ranks)."""
        if restart:
            self.writer.restart()

    def stage(self, prepared: Any) -> tuple[Any, int]:
        """Copy the state (its first piece, with a budget) into the shared-memory arena."""
        staged = self.stager.stage(prepared)
        return _SharedSave(staged), staged.nbytes

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool
    ) -> list[str]:
        """Have the writer process run ``save_step`` on the staged arena, staging each
        piece it asks for; wait for it (and, on the first save, for its start)."""
        assert self.stager.arena is not None, "write() before stage()"
        save: _SharedSave = staged

        def on_fetch(request: Fetch) -> Fetched:  # raising: the writer fails the save
            if request.step != step or (save.released and request.piece is not None):
                return Fetched(request.piece, error=f"no piece of step {request.step} is held")
            if request.piece is not None:
                self.stager.stage_piece(request.piece)
            waited = 0.0
            if request.last:
                self.stager.release()
                waited = save.release()
            return Fetched(request.piece, waited_s=waited)

        try:
            self.writer.ensure_ready()
            outcome = self.writer.save(
                step, save.state, self.stager.arena, timings, overwrite, on_fetch=on_fetch
            )
        finally:
            self.stager.release()
            save.release()  # a save that ended early never needs training's tensors again
        return list(outcome.warnings)

    def wait_staged(self, staged: Any) -> float:
        """Wait until the last piece the writer needs is staged (at once for one piece)."""
        save: _SharedSave = staged
        return save.wait_released()

    def close(self) -> None:
        """Stop the writer process and free the arena."""
        try:
            self.writer.close()
        finally:
            self.stager.close()


def make_backend(
    background: str,
    root: str | Store,
    retrying_root: Store,
    *,
    storage_options: dict[str, Any] | None,
    engine: TransferEngine,
    local_tier_dir: str | None,
    codec: str,
    key_layout: str,
    rank: int,
    world_size: int,
    process_group: Any,
    agree: Agreement,
    max_staging_bytes: int | None = None,
    run_id: str | None = None,
) -> SaveBackend:
    """The backend ``background`` names (checked by ``ManagerOptions``).

    ``root`` is the manager's argument as given (a writer process reopens it from that);
    ``retrying_root`` the manager's store, retried per the engine's policy;
    ``max_staging_bytes`` bounds either backend's staging memory."""
    if background == "process":
        settings = WriterSettings(
            root,
            storage_options,
            local_tier_dir,
            codec,
            engine.config,
            rank,
            key_layout=key_layout,
            world_size=world_size,
            run_id=run_id,
        )
        return ProcessBackend(settings, agree, max_staging_bytes)
    return ThreadBackend(
        retrying_root,
        engine=engine,
        local_tier_dir=local_tier_dir,
        codec=codec,
        key_layout=key_layout,
        process_group=process_group,
        max_staging_bytes=max_staging_bytes,
        run_id=run_id,
    )
