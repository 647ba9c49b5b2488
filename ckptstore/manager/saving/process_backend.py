"""``ProcessBackend``: saves staged in shared memory and written by this rank's writer process.

It copies into a shared-memory arena (``shared_stager.SharedStager``) and has this rank's
writer process (``writer_process.BackgroundWriter``) call the same ``save_step`` as the
thread backend, on the writers' own gloo group. With a budget the arena holds one round
of the state at a time: the writer writes round by round, asking for each
(``write_order.InRounds``), and ``wait_staged`` waits until the last one is copied.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ckptstore.manager.agreement import Agreement
from ckptstore.manager.saving.shared_arena import StagedState
from ckptstore.manager.saving.shared_stager import SharedStager
from ckptstore.manager.saving.writer_process import BackgroundWriter
from ckptstore.manager.saving.writer_protocol import Fetch, Fetched, WriterSettings

__all__ = ["ProcessBackend"]


class _SharedSave:
    """One save staged by ``ProcessBackend``: the ``StagedState`` the writer gets, and
    when training may go on (at once, unless rounds remain to be staged)."""

    def __init__(self, state: StagedState, deferred_bytes: int) -> None:
        self.state = state
        self.rounds = state.rounds
        self.deferred_bytes = deferred_bytes  # copied by ``write`` first
        self._released = threading.Event()
        self._staged_at = time.perf_counter()
        self._waited = 0.0
        if self.rounds == 1 and not deferred_bytes:
            self._released.set()

    @property
    def released(self) -> bool:
        """True once training may change its state."""
        return self._released.is_set()

    def release(self) -> float:
        """Training may change its state now: the seconds it waited beyond the copy
        (0.0 for one round copied whole); the same on every call."""
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

    With ``max_staging_bytes`` the arena holds one round of at most that many bytes at a
    time (``SharedStager``): ``stage`` copies the first, ``write`` stages each other one
    when the writer asks for it (``write_order.InRounds``), and ``wait_staged``
    returns once the last round the writer needs is copied (or the save ended).
    """

    name = "process"
    reason = "background='process'"

    def __init__(self, settings: WriterSettings, agree: Agreement) -> None:
        self.agree = agree
        budget = settings.options.max_staging_bytes
        self.stager = SharedStager(pin=torch.cuda.is_available(), budget=budget)
        try:
            self.writer = BackgroundWriter(
                settings, broadcast=agree.broadcast if agree.group is not None else None
            )
        except BaseException:
            self.stager.close()
            raise

    def settle(self, state: dict[str, Any] | None) -> None:
        """Nothing: this backend depends on no state (``SaveBackend``)."""

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

    def stage(self, prepared: Any, defer: Callable[[torch.Tensor], bool] | None) -> tuple[Any, int]:
        """Copy the state (its first round, with a budget) into the shared-memory arena;
        with one round, the tensors ``defer`` names are left to ``write``."""
        staged = self.stager.stage(prepared, defer)
        later = sum(t.numel() * t.element_size() for _, t in self.stager.later)
        return _SharedSave(staged, later), staged.nbytes

    def deferred_bytes(self, staged: Any) -> int:
        """The bytes ``write`` copies before the writer gets the save."""
        save: _SharedSave = staged
        return save.deferred_bytes

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool, local: bool
    ) -> list[str]:
        """Have the writer process run ``save_step`` on the staged arena, staging each
        round it asks for; wait for it (and, on the first save, for its start)."""
        assert self.stager.arena is not None, "write() before stage()"
        save: _SharedSave = staged

        def on_fetch(request: Fetch) -> Fetched:  # raising: the writer fails the save
            if request.step != step or (save.released and request.round is not None):
                return Fetched(request.round, error=f"no round of step {request.step} is held")
            if request.round is not None:
                self.stager.stage_round(request.round)
            waited = 0.0
            if request.last:
                self.stager.release()
                waited = save.release()
            return Fetched(request.round, waited_s=waited)

        try:
            if save.deferred_bytes:
                self.stager.copy_later()
                save.release()  # training's tensors are copied: its step may go on
            self.writer.ensure_ready()
            outcome = self.writer.save(
                step,
                save.state,
                self.stager.arena,
                timings,
                overwrite,
                on_fetch=on_fetch,
                local=local,
            )
        finally:
            self.stager.release()
            save.release()  # a save that ended early never needs training's tensors again
        return list(outcome.warnings)

    def wait_staged(self, staged: Any) -> float:
        """Wait until the last round the writer needs is staged (at once for one round
        copied whole)."""
        save: _SharedSave = staged
        return save.wait_released()

    def close(self) -> None:
        """Stop the writer process and free the arena."""
        try:
            self.writer.close()
        finally:
            self.stager.close()
