"""``ThreadBackend``: saves staged in host memory and written on a thread of this process.

It copies into a reused host-memory arena (``host_arena.ArenaStager``, at most
``max_staging_bytes``; DCP's ``DefaultStager`` for a state of sharded tensors without a
budget) and calls ``save_step`` over the manager's checkpoint gloo group. A state larger
than the budget leaves part of its tensors live (not copied): ``save_step`` writes them
first (``write_order.LiveFirst``) and ``wait_staged`` waits for that. A ``DefaultStager``
copy that cannot be allocated fails the save inside DCP, on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import StagingMemoryError
from ckptstore.manager.options import SaveOptions
from ckptstore.manager.records import tensor_bytes
from ckptstore.manager.saving.host_arena import ArenaStager, StagedSave
from ckptstore.manager.saving.save_step import save_step
from ckptstore.manager.saving.slots import allocated

__all__ = ["ThreadBackend"]


class ThreadBackend:
    """Stages into an ``ArenaStager`` (pinned memory with CUDA) and saves in this process."""

    name = "thread"
    reason = "background='thread'"

    def __init__(
        self, root: Store, options: SaveOptions, *, engine: TransferEngine, process_group: Any
    ) -> None:
        self.root = root
        self.options = options
        self.engine = engine
        self.process_group = process_group
        cuda = torch.cuda.is_available()
        self.arena = ArenaStager(budget=options.max_staging_bytes, pin=cuda)
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=cuda,
            )
        )

    def settle(self, state: dict[str, Any] | None) -> None:
        """Nothing: this backend depends on no state (``SaveBackend``)."""

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

    def stage(
        self, prepared: tuple[dict[str, Any], Any], defer: Callable[[torch.Tensor], bool] | None
    ) -> tuple[Any, int]:
        """Copy the state into the arena (a ``StagedSave``; the tensors ``defer`` names
        left to ``write``), or, for sharded tensors without a budget, with DCP's
        ``DefaultStager`` (synchronous: a dict of copies, nothing deferred)."""
        state, walked = prepared
        arena = self.arena.stage(walked, defer)
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

    def deferred_bytes(self, staged: Any) -> int:
        """The bytes ``write`` copies before it writes (``stage``'s ``defer``)."""
        return staged.deferred_bytes if isinstance(staged, StagedSave) else 0

    def wait_staged(self, staged: Any) -> float:
        """Wait until the deferred copies are done and the save wrote the live tensors (at
        once when everything was copied)."""
        return staged.wait_released() if isinstance(staged, StagedSave) else 0.0

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool, local: bool
    ) -> list[str]:
        """Copy what ``stage`` deferred, then run ``save_step`` on this thread, over the
        manager's checkpoint group."""
        live = isinstance(staged, StagedSave) and staged.has_live
        refused = isinstance(staged, _Refused)
        try:
            if isinstance(staged, StagedSave) and not live:
                self.arena.copy_later(staged)
                staged.release()  # training's tensors are copied: its step may go on
            return save_step(
                {} if refused else staged.state if isinstance(staged, StagedSave) else staged,
                self.root,
                step,
                self.options,
                engine=self.engine,
                timings=timings,
                process_group=self.process_group,
                overwrite=overwrite,
                local=local,
                is_live=staged.is_live if live else None,
                release=staged.release if live else None,
                refusal=staged.error if refused else None,
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
