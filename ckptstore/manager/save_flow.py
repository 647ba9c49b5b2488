"""``SaveFlow``: one save of a ``CheckpointManager``, from ``save()`` to its commit.

The training thread prepares the state, joins the save's one agreement (is any rank
busy, can every rank reach the root and take the save, must the step be replaced) and
has the backend stage it; the write then runs on the save thread (or inline), followed by
retention on rank 0, every node's local-tier trim and the peer tier's replication. With
two cadences a step goes to the root, to the local tier alone, or nowhere
(``tier.rules.save_tier``). What can refuse a save is found before that agreement
and carried by it, so every rank raises at once. With ``defer_staging`` the tensors of
the state's optimizers are copied on the save thread, first, and the optimizers' next
step waits for that copy (``step_guard.StepGuard``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful

from ckptstore import errors
from ckptstore.engine.catalog import committed_steps
from ckptstore.engine.committed import CheckpointStatus, open_committed
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.names import step_name
from ckptstore.engine.store import Store
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
    TransientStoreError,
    size_text,
)
from ckptstore.manager.agreement import Agreement, StepView
from ckptstore.manager.failures import FailureLog
from ckptstore.manager.options import ManagerOptions
from ckptstore.manager.ownership import RootOwner, describe_run, run_of
from ckptstore.manager.prune import apply_prune, plan_prune
from ckptstore.manager.records import SaveRecord, SaveStatus, report
from ckptstore.manager.saving.backend import SaveBackend
from ckptstore.manager.step_guard import StepGuard
from ckptstore.tier.local_tier import LocalTier

__all__ = ["SaveFlow"]

log = logging.getLogger(__name__)


class SaveFlow:
    """The saves of one manager, at most one in flight.

    Call order (every rank, in the same order; ``CheckpointManager`` drives it)::

        flow.save(step, state)         # training thread: prepare, agree, stage; the
                                       # write goes to the save thread (or runs inline)
        flow.wait_staged()             # training thread (an optimizer's step pre-hook
                                       # calls it too): the deferred copy is done
        flow.wait_inflight(timeout)    # the save in flight, committed or failed
        flow.close()                   # after the last save: the save thread stops,
                                       # the optimizers' hooks are removed

    ``records`` lists every save's ``SaveRecord``; ``protected`` the steps in use (a save
    in flight, a restore), ``damaged`` the committed steps a restore found corrupt:
    retention neither counts nor deletes them, and saving one again replaces it.
    """

    def __init__(
        self,
        root: Store,
        options: ManagerOptions,
        backend: SaveBackend,
        *,
        agree: Agreement,
        tier: LocalTier,
        failures: FailureLog,
        owner: RootOwner,
        run_id: str,
        rank: int,
    ) -> None:
        self.root, self.options, self._backend = root, options, backend
        self._agree, self.failures, self.owner, self.run_id = agree, failures, owner, run_id
        self.rank = rank
        self.records: list[SaveRecord] = []
        self.protected: set[int] = set()
        self.damaged: set[int] = set()
        #: Rank 0 reported where saves run and why (``background="auto"``: with the
        #: first commit).
        self._told_backend = False
        #: The local tier: every node's trimmed by one decision after each save, then the
        #: step replicated to peer nodes (on the checkpoint group, from the save thread:
        #: nothing else uses that group meanwhile).
        self.tier = tier
        self._peers = tier.peers
        #: Set (on every rank alike) when a node's local tier cannot hold a step within
        #: ``tier_limit``: every later save raises it.
        self._tier_error: errors.ConfigError | None = None
        #: Rank 0: the committed steps the root keeps, and the local-only steps newer than
        #: the newest of them: what a restore could pick, the local tier's candidates.
        self._root_kept: set[int] = set()
        self._local_only: set[int] = set()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-save")
        self.inflight: Future[None] | None = None
        self._guard = StepGuard()

    def close(self) -> None:
        """Stop the save thread (after the save in flight); remove the step hooks."""
        self._pool.shutdown(wait=True)
        self._guard.close()

    def wait_staged(self) -> float:
        """Return once the copy the last save deferred is done (at once without one):
        the seconds waited, added to that save's ``blocking_s``."""
        return self._guard.wait()

    def save(self, step: int, state: dict[str, Any], durable: bool = False) -> bool:
        """Start saving ``state`` as ``step`` (``durable``: to the root, whatever the
        cadences say); False if skipped (see ``CheckpointManager``)."""
        start = time.perf_counter()
        tier = "root" if durable else self.tier.where(step)
        record = SaveRecord(step, tier=tier or "root")
        if tier is None:  # the same on every rank: no collective
            record.status = SaveStatus.SKIPPED
            self.records.append(record)
            log.debug("step %d is neither a root nor a local save: not saved", step)
            return False
        busy = self.inflight is not None and not self.inflight.done()
        # Whatever can refuse the state (a Stateful's state_dict() raising; in process mode
        # a tensor larger than the staging budget, a value that cannot be pickled) is
        # found before any collective and rides on the save's agreement, so that every
        # rank raises at once instead of the others entering the save's collectives alone.
        prepared, refusal = self._prepare(state)
        # So is a staging arena this rank cannot allocate (``_agree_on`` reserves it once no
        # save of this rank reads the old one: at once, or after waiting for that save).
        # One agreement in the steady case: is any rank busy, could any rank not check the
        # root (its link is down: then no rank saves), must the step be replaced, is it
        # missing anywhere, must any rank's writer process be replaced, and which rank (if
        # any) cannot take part at all. A save that was in flight may commit this very
        # step, so after waiting for one the step is looked at again.
        agreed, unreachable = self._agree_on(step, busy, refusal, prepared)
        if agreed.busy:
            if self.options.on_busy == "skip":
                record.status = SaveStatus.SKIPPED
                self.records.append(record)
                log.info("skipping the save of step %d: the previous one is still uploading", step)
                return False
            self.wait_inflight()
            agreed, unreachable = self._agree_on(step, False, None, prepared)
        record.waited_s = time.perf_counter() - start
        if agreed.unchecked:
            self._fail_unchecked(record, start, unreachable)
            return False
        if not agreed.replace and not agreed.missing:
            record.status = SaveStatus.SKIPPED
            self.records.append(record)
            log.info("step %d is already committed under %s; not saving it again", step, self.root)
            return False
        self._backend.ensure_ready(agreed.restart)
        deferring = self.options.defer_staging and self.options.async_save
        defer = self._guard.deferrable(state) if deferring else None
        t = time.perf_counter()
        staged, record.bytes = self._backend.stage(prepared, defer)
        record.deferred_bytes = self._backend.deferred_bytes(staged)
        record.staging_s = time.perf_counter() - t
        record.blocking_s = time.perf_counter() - start
        record.status = SaveStatus.WRITING
        self.records.append(record)
        self.protected.add(step)
        if self.options.async_save:
            self.inflight = self._pool.submit(self._write, record, staged, start, agreed.replace)
            if record.deferred_bytes:  # the optimizers' next step waits for the copy
                self._guard.hold(lambda: self._wait_deferred(record, staged))
            else:
                # Over the staging budget: training waits until the part not copied is
                # written (the manifest's blocking_s adds the same seconds).
                record.blocking_s += self._backend.wait_staged(staged)
        else:
            self._write(record, staged, start, agreed.replace)
            self.failures.report()
        return True

    def _wait_deferred(self, record: SaveRecord, staged: Any) -> float:
        """Wait for ``staged``'s deferred copy; the seconds, added to ``record``."""
        t = time.perf_counter()
        self._backend.wait_staged(staged)
        waited = time.perf_counter() - t
        record.step_waited_s += waited
        record.blocking_s += waited
        return waited

    def _prepare(self, state: dict[str, Any]) -> tuple[Any, BaseException | None]:
        """``state`` flattened and checked by the backend (copying nothing), or the error
        that refuses it on this rank."""
        flat: dict[str, Any] | None = None
        error: Exception | None = None
        try:
            flat = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}
        except Exception as exc:  # noqa: BLE001 - raised on every rank by _agree_on
            error = exc
        self._backend.settle(flat)  # every rank, even one that failed (a collective at first)
        if flat is None:
            return None, error
        try:
            return self._backend.prepare(flat), None
        except Exception as exc:  # noqa: BLE001 - raised on every rank by _agree_on
            return None, exc

    def _agree_on(
        self, step: int, busy: bool, refusal: BaseException | None, prepared: Any
    ) -> tuple[StepView, CkptStoreError | None]:
        """The save's one collective: every rank's ``StepView`` (``busy`` this rank's own)
        merged by "any rank", and this rank's error checking the root. A rank that cannot
        take part (its ``refusal``, a previous save's failure that ``strict`` raises now, a
        writer that could not start, or, unless ``busy``, a local tier directory of this
        job that is not provably its own, or the staging memory for ``prepared`` that it
        cannot allocate) makes every rank raise here: that rank its own error, the others
        the same error naming it."""
        own = self.failures.take(stacklevel=5) or refusal or self._tier_error
        if own is None and self._agree.rank == 0:
            own = self.owner.claim()
        if own is None and not busy:
            own = self._backend.start_error() or self._tier_refusal() or self._reserve(prepared)
        view, unreachable = self._step_view(step, busy)
        *agreed, refused = self._agree.max_of([*view.flags(), self._agree.rank + 1 if own else 0])
        if refused:
            self.failures.refuse(self._agree, step, own, refused - 1)
        return StepView.of(agreed), unreachable

    def _tier_refusal(self) -> BaseException | None:
        """Why this rank cannot write into this job's directory of its node's local tier
        (made with its stamp if absent): it is not provably this job's
        (``TierStampError``), or cannot be made; None when it can (or there is no tier)."""
        try:
            self.tier.open(create=True)
        except (OSError, CkptStoreError) as exc:
            return exc
        return None

    def _reserve(self, prepared: Any) -> BaseException | None:
        """Allocate the staging memory ``prepared`` needs (no save of this rank reads the
        arena now); the error if it cannot be had."""
        try:
            self._backend.reserve(prepared)
        except errors.StagingMemoryError as exc:
            return exc
        return None

    def _step_view(self, step: int, busy: bool) -> tuple[StepView, CkptStoreError | None]:
        """``step`` as this rank sees it, and the error that kept it from checking the root.
        While this rank's save is in flight (``busy``) the backend is not asked (the view
        is taken again after waiting for it)."""
        restart = not busy and self._backend.needs_restart()
        try:
            exists = self.root.exists(f"{step_name(step)}/{MARKER_NAME}")
        except CkptStoreError as exc:
            return StepView(busy, unchecked=True, restart=restart), exc
        try:
            replace = exists and self._needs_replacing(step)
        except NewerFormatError as exc:  # a newer ckptstore's step: neither replaced nor kept
            return StepView(busy, unchecked=True, restart=restart), exc
        return StepView(busy, replace=replace, missing=not exists, restart=restart), None

    def _fail_unchecked(self, record: SaveRecord, start: float, exc: CkptStoreError | None) -> None:
        """A save that failed on every rank before writing anything: some rank could not
        check the root for the step (``exc``: this rank's error, None if it could)."""
        if exc is None:
            exc = TransientStoreError(
                f"the save of step {record.step} was not started: another rank could not "
                f"reach {self.root}; {self.failures.fallback()}"
            )
        record.status, record.error = SaveStatus.FAILED, f"{type(exc).__name__}: {exc}"
        record.total_s = time.perf_counter() - start
        self.records.append(record)
        log.error("saving step %d failed: %s", record.step, record.error)
        self.failures.failed(exc)
        self.failures.report(stacklevel=5)  # at once, on every rank alike (or raises it)

    def _needs_replacing(self, step: int) -> bool:
        """For a ``step`` with a marker: True if it is not a loadable checkpoint (restore
        found it damaged, or its marker does not commit a valid manifest) or (rank 0's
        view) another run committed it. Saving it then replaces it (a new attempt and
        marker) rather than skipping it. A step a newer ckptstore wrote raises
        ``NewerFormatError``: that save fails, and the step is left as it is."""
        if step in self.damaged:
            return True
        try:
            manifest = open_committed(self.root.child(step_name(step))).manifest
        except (IncompleteCheckpointError, CorruptCheckpointError):
            return True
        if self._agree.rank != 0 or run_of(manifest) == self.run_id:
            return False
        log.warning(
            "step %d under %s was committed by %s, not by this run (%r): saving it again "
            "replaces it",
            step,
            self.root,
            describe_run(manifest),
            self.run_id,
        )
        return True

    def _write(self, record: SaveRecord, staged: Any, start: float, overwrite: bool) -> None:
        t = time.perf_counter()
        try:
            local = record.tier == "local"
            notes = self._backend.write(
                record.step, staged, record.manifest_timings(), overwrite, local
            )
            record.warnings.extend(notes)
            record.status = SaveStatus.COMMITTED
            self.failures.committed(record.step)
            self.damaged.discard(record.step)
            if self.rank == 0:
                report(
                    "step %d committed to %s: %s from rank 0, %.2f s after save() "
                    "(training blocked %.3f s)",
                    record.step,
                    str(self.tier) if local else self.root.url,
                    size_text(record.bytes),
                    time.perf_counter() - start,
                    record.blocking_s,
                )
                if not self._told_backend and self.options.background == "auto":
                    self._told_backend = True
                    report(
                        "saves run on the %s backend (%s)",
                        self._backend.name,
                        self._backend.reason,
                    )
            local_keeps = self._local_candidates(record) if self.rank == 0 else set()
        except BaseException as exc:  # noqa: BLE001 - reported at the next save/wait/close
            record.status, record.error = SaveStatus.FAILED, f"{type(exc).__name__}: {exc}"
            log.error("saving step %d failed: %s", record.step, record.error)
            self.failures.failed(exc)
            local_keeps = None
        finally:  # collectives on every rank, whatever happened
            self._trim_local_tiers(record, local_keeps)
            self._replicate(record)
            self.protected.discard(record.step)
            record.background_s = time.perf_counter() - t
            record.total_s = time.perf_counter() - start

    def wait_inflight(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` s) for the save in flight; False if it still runs."""
        fut = self.inflight
        if fut is None:
            return True
        try:
            fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:  # not the builtin before Python 3.11
            return False
        self.inflight = None
        return True

    def _apply_retention(self) -> set[int]:
        """Prune the root as ``ckptstore-tool gc`` does (``ckptstore.manager.prune``): steps the
        policy lets go, torn leftovers, stale uploads; never the newest good commit, a step
        in use or a damaged one. Only ckptstore's own files are deleted. Returns the
        committed steps kept."""
        plan = plan_prune(
            self.root,
            self.options.keep,
            protected=set(self.protected),
            damaged=set(self.damaged),
        )
        for d in plan.deletions:
            log.info("removing %s (%s)", d.name, d.reason)
        apply_prune(self.root, plan)
        return {
            d.step
            for d in plan.steps
            if d.action == "keep" and d.status == CheckpointStatus.COMMITTED
        }

    def _local_candidates(self, record: SaveRecord) -> set[int]:
        """Rank 0, after ``record``'s step committed: the steps a restore could pick now
        (those the root keeps after retention, when the step went there, and the
        local-only steps newer than them), the local tier's candidates."""
        if record.tier == "local":
            self._local_only.add(record.step)
            if not self._root_kept:  # the first save of this manager: what the root holds
                try:
                    self._root_kept = set(committed_steps(self.root))
                except CkptStoreError as exc:
                    log.warning("could not list the committed steps of %s: %s", self.root, exc)
        else:
            self._root_kept = {record.step}
            try:
                self._root_kept |= self._apply_retention()
            except CkptStoreError as exc:  # the step is committed: a warning, not a failure
                note = f"retention after step {record.step} failed: {exc}"
                log.warning("%s", note)
                record.warnings.append(note)
            self._local_only = {s for s in self._local_only if s > record.step}
        return self._root_kept | self._local_only | {record.step}

    def _trim_local_tiers(self, record: SaveRecord, kept: set[int] | None) -> None:
        """After every save, on every rank (a collective on the checkpoint group): every
        node's local tier keeps the newest ``keep_local`` of the steps rank 0 says a
        restore could pick (``kept``; None: the save failed, nothing is trimmed). A
        failure here is a warning in the save's record."""
        keeps = self.tier.keeps(kept) if kept else None
        try:
            self.tier.after_save(keeps)
        except Exception as exc:  # noqa: BLE001 - the save itself is done either way
            note = f"trimming the local tier after step {record.step} failed: {exc}"
            log.warning("%s", note)
            record.warnings.append(note)

    def _replicate(self, record: SaveRecord) -> None:
        """After every save, on every rank (a collective on the checkpoint group, when
        the peer tier is active): rank 0 hands the committed step's manifest (None: the
        save failed; a local-only step's small objects too) and every node's files go to
        its peers (``PeerTier.after_save``). What went wrong is a warning in the save's
        record: the step is committed all the same; a tier over its limit also fails
        every later save."""
        if not self._peers.active:
            return
        committed = None
        if self.rank == 0 and record.status == SaveStatus.COMMITTED:
            committed = self._peers.committed(self.root, record.step)
        local = record.tier == "local"
        where = str(self.tier) if local else self.root.url
        notes, error = self._peers.after_save(
            record.step,
            committed.manifest if committed else None,
            where,
            committed if local else None,
        )
        record.warnings.extend(notes)
        self._tier_error = self._tier_error or error
