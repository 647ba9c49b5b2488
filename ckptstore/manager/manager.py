"""CheckpointManager: async saves, verified resume, retention, preemption.

Call order::

    mgr = CheckpointManager(root, local_tier_dir=..., keep=KeepLast(3))  # every rank, after
                                                                       # init_process_group
    step = mgr.restore(state)        # newest committed + verified step (falls back past a
                                     # corrupt one), or None on a fresh run; the loop goes on
                                     # at step + 1
                                     # (rank 0 alone lists the root and reads a step's
                                     # marker, manifest and .metadata, newest first and only
                                     # as far as a fallback needs, finishing a commit a
                                     # crash cut short after its marker, and broadcasts
                                     # them: ``ckptstore.manager.restore``)
    mgr.save(step, state)            # returns once the state is copied to the staging buffer;
                                     # serialisation, upload and commit run in the background
    mgr.preemption_requested()       # all ranks agree whether SIGTERM arrived anywhere
    mgr.finalize(step, state)        # on preemption: flush the in-flight save within the
                                     # grace period and take one last checkpoint
    mgr.close()                      # waits; raises if the last save failed; frees the root

One job per root: the first ``save`` makes rank 0 the root's owner (a lease at
``<root>/ckptstore.owner.json``, refreshed every 5 s in the background until ``close``;
``ckptstore.engine.owner``). A save while another live job of a different run owns the
root raises ``RootInUseError`` from ``save`` on every rank, naming that run; a stale
owner (no heartbeat for 60 s), one whose process is gone, or one that does not beat while
the first save watches it (up to 15 s) is taken over. The run
identity (``run_id``, else one from the launcher: ``engine.owner.run_identity``, the
same across torchrun's restarts of one job) is recorded in each manifest: a step
another run committed is replaced, not skipped, when saved again, and ``restore`` of
one logs a warning naming that run.

Every rank calls every method in the same order. Background saves run on their own gloo
process group (never training's), and small agreements (is any rank still busy? did
anyone get SIGTERM?) on a second one. Both are made so that they connect after a restart
under torchrun's default shared store (``ckptstore.launch.fresh_new_group``); for the
training script's own default group, use ``ckptstore.launch.init_process_group``.
At most one save is in flight: a new ``save`` while one is uploading waits for it
(``on_busy="wait"``, counted as blocking time) or is skipped on every rank
(``on_busy="skip"``). A failed background save is reported at the next
``save``/``wait`` and by ``close``: until the manager has committed its first save (a root
that is a file, a typo, an unwritable root or bucket, wrong credentials: nothing of the
run is protected yet) and with ``strict=True``, the error is raised; after that, a warning
naming the step that stays the newest, and training goes on.
A save that some rank cannot even check the root for (its link to the store is down)
fails on every rank, reported at once the same way; training goes on. A save that some
rank cannot take at all (in process mode a tensor larger than ``max_staging_bytes`` or a
value that cannot be pickled; a non-tensor value that cannot be copied; a ``Stateful``
whose ``state_dict()`` raises; a writer process that could not start; host memory for
its staging arena that it cannot allocate, ``StagingMemoryError``; with
``strict=True``, the previous save's failure) raises from ``save`` on every rank at once,
found before the save's one agreement and carried by it: that rank's own error there (a
note naming the rank), the same error naming the rank on the others. Nothing is staged or
written, and the next save is not affected. (A sharded state with the thread backend and
no budget is copied by DCP's ``DefaultStager`` at every save, after that agreement: a copy
one rank cannot allocate fails that save on every rank instead, ``StagingMemoryError``
naming the rank, reported like any failed save; nothing is committed.)

``max_staging_bytes`` bounds the host memory saves stage into (default: no bound, a copy
of the whole state). With the thread backend a state larger than it is saved in two
parts: the tensors that fit are copied and written in the background; the rest are
written first, straight from training's memory, and ``save`` returns once they are
durable. With ``background="process"`` the state is staged into shared memory in pieces
of at most the budget, one at a time: the writer process writes each piece before the
next is copied over it, and ``save`` returns once the last piece is copied. Either way
blocking time grows by about the write time of the part beyond the budget, and staging
never takes more memory. In process mode every tensor must fit the budget (a larger one
is a ``ConfigError`` from ``save``, on every rank).

Saves run on the backend ``background`` picks once, in the constructor
(``ckptstore.manager.saving.backend``): both end in the same ``save_step``.
``background="thread"`` (default) writes on a thread of the training process.
``background="process"`` writes in one long-lived writer process per rank (see
``ckptstore.manager.saving.writer_process``), started by the constructor: the staging copy goes into a
shared-memory arena reused across saves, and serialisation, upload and commit run in the
writer, on a gloo group of the writers' own, without the training process's GIL. A writer
that dies fails its save with ``WriterProcessDiedError`` (reported like any failed save;
the previous checkpoint is intact) and every rank starts a new writer at the next save.
``save`` does not wait for a writer still starting (the background part of the first
save does): a writer that cannot start (its rendezvous unreachable) raises from ``save``
once it has said so, and fails the save it held up like any failed save before that.
"""

from __future__ import annotations

import concurrent.futures
import logging
import signal
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from ckptstore import errors
from ckptstore.engine.catalog import committed_steps
from ckptstore.engine.commit import CheckpointStatus, open_committed
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.layout import step_name
from ckptstore.engine.lease import Heartbeat
from ckptstore.engine.local_tier import local_tier_keeps
from ckptstore.engine.manifest import MARKER_NAME, Manifest
from ckptstore.engine.owner import claim_root, run_identity
from ckptstore.engine.paths import check_local_tier_dir
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CkptStoreError,
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    RootInUseError,
    TransientStoreError,
)
from ckptstore.launch import fresh_new_group
from ckptstore.manager.agreement import Agreement
from ckptstore.manager.local_tier import KEEP_LOCAL, LocalTierTrimmer
from ckptstore.manager.options import ManagerOptions, SaveOptions
from ckptstore.manager.prune import apply_prune, plan_prune
from ckptstore.manager.records import MANIFEST_TIMINGS, SaveRecord, SaveStatus
from ckptstore.manager.report import report, size_text
from ckptstore.manager.restore import StepLoader
from ckptstore.manager.saving.backend import make_backend
from ckptstore.manager.saving.process_backend import ProcessBackend
from ckptstore.manager.saving.shared_stager import SharedStager
from ckptstore.manager.saving.writer_process import BackgroundWriter
from ckptstore.stores import open_store

__all__ = ["CheckpointManager", "MANIFEST_TIMINGS", "SaveRecord", "SaveStatus"]

log = logging.getLogger(__name__)


class CheckpointManager:
    """Async checkpoints under one root URL; see the module docstring for the call order."""

    def __init__(
        self, root: str | Store, options: ManagerOptions | None = None, **keywords: Any
    ) -> None:
        """``options`` (``ManagerOptions``, checked) with any of its fields given as keywords
        on top: ``CheckpointManager(root, keep=KeepLast(5), local_tier_dir="/nvme/ckpt")``."""
        self.options = opts = ManagerOptions.from_keywords(options, **keywords)
        self.engine = TransferEngine(opts.config)
        storage_options = dict(opts.storage_options) if opts.storage_options else None
        # Every control call on the root (HEAD of a marker, listings, marker and manifest
        # GETs, deletes) is retried per the engine's RetryConfig through this view.
        self.root = retrying(
            open_store(root, storage_options), self.engine.config.retry, self.engine.stats
        )
        check_local_tier_dir(self.root.url, opts.local_tier_dir)
        self.records: list[SaveRecord] = []
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        # Checkpoint traffic and small agreements each get their own gloo group, so they
        # never queue behind (or interleave with) training's collectives; named so that a
        # restart under torchrun's shared store never meets a dead attempt's keys.
        self._pg = fresh_new_group("gloo") if distributed else None
        self._agree = Agreement(fresh_new_group("gloo") if distributed else None)
        #: This job's run identity (rank 0's, on every rank): recorded in each manifest,
        #: and the root owner's lease names it (``engine.owner``).
        self.run_id: str = self._agree.broadcast(run_identity(opts.run_id))
        self._owner: Heartbeat | None = None  # rank 0, from the first save until close
        #: The part of the options a save needs, as every backend and writer gets it.
        self.save_options = SaveOptions.of(opts, self.run_id)
        self._backend = make_backend(
            root,
            self.root,
            self.save_options,
            engine=self.engine,
            rank=self.rank,
            world_size=dist.get_world_size() if distributed else 1,
            process_group=self._pg,
            agree=self._agree,
        )
        self._loader = StepLoader(
            self.root,
            engine=self.engine,
            local_tier_dir=opts.local_tier_dir,
            allow_pickle=opts.allow_pickle,
            process_group=self._pg,
            agree=self._agree,
        )
        #: Every node's local tier directory trimmed by one decision after each save (on ``_pg``,
        #: from the save thread: nothing else uses that group meanwhile).
        self._local_tiers = LocalTierTrimmer(opts.local_tier_dir, self._pg)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-save")
        self._inflight: Future[None] | None = None
        self._unreported: list[BaseException] = []
        self._last_failed: BaseException | None = None
        #: The last failure raised to the caller: ``close`` does not raise it again.
        self._told: BaseException | None = None
        #: The newest step this manager committed or restored (what a failed save leaves
        #: the newest), and whether any save of it committed yet (until then every
        #: failure raises: see the module docstring).
        self._newest: int | None = None
        self._committed_any = False
        self._protected: set[int] = set()
        #: Committed steps restore found corrupt (their marker matched): retention neither
        #: counts them toward what it keeps nor deletes them, and saving one again
        #: replaces it (a new attempt and marker) instead of skipping it.
        self._damaged: set[int] = set()
        self._preempted = threading.Event()
        self._old_handler: Any = None
        if opts.handle_sigterm:
            self._old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- the process backend's parts, for diagnostics ------------------------------------
    @property
    def _bg(self) -> BackgroundWriter | None:
        """This rank's writer process (``background="process"``), else None."""
        return self._backend.writer if isinstance(self._backend, ProcessBackend) else None

    @property
    def _shared(self) -> SharedStager | None:
        """The shared-memory staging arena (``background="process"``), else None."""
        return self._backend.stager if isinstance(self._backend, ProcessBackend) else None

    # -- saving --------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> bool:
        """Start saving ``state`` as ``step``; False if skipped. See the module docstring.

        Ctrl-C (``KeyboardInterrupt``) while ``save`` runs: one line says the step was not
        committed, and the interrupt goes on as Python's own (exit status 130 / SIGINT),
        never as the error of whatever torch was serialising when it arrived."""
        try:
            return self._save(step, state)
        except BaseException as exc:
            if not _interrupted(exc):
                raise
            log.warning("interrupted (Ctrl-C): step %d was not committed", step)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from None

    def _save(self, step: int, state: dict[str, Any]) -> bool:
        start = time.perf_counter()
        record = SaveRecord(step)
        busy = self._inflight is not None and not self._inflight.done()
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
        any_busy, unchecked, overwrite, missing, restart = agreed
        if any_busy:
            if self.options.on_busy == "skip":
                record.status = SaveStatus.SKIPPED
                self.records.append(record)
                log.info("skipping the save of step %d: the previous one is still uploading", step)
                return False
            self._wait_inflight()
            agreed, unreachable = self._agree_on(step, False, None, prepared)
            _, unchecked, overwrite, missing, restart = agreed
        record.waited_s = time.perf_counter() - start
        if unchecked:
            self._fail_unchecked(record, start, unreachable)
            return False
        if not overwrite and not missing:
            record.status = SaveStatus.SKIPPED
            self.records.append(record)
            log.info("step %d is already committed under %s; not saving it again", step, self.root)
            return False
        self._backend.ensure_ready(restart)
        t = time.perf_counter()
        staged, record.bytes = self._backend.stage(prepared)
        record.staging_s = time.perf_counter() - t
        record.blocking_s = time.perf_counter() - start
        record.status = SaveStatus.WRITING
        self.records.append(record)
        self._protected.add(step)
        if self.options.async_save:
            self._inflight = self._pool.submit(self._write, record, staged, start, overwrite)
            # Over the staging budget: training waits until the part not copied is written
            # (the manifest's blocking_s adds the same seconds).
            record.blocking_s += self._backend.wait_staged(staged)
        else:
            self._write(record, staged, start, overwrite)
            self._report_failures()
        return True

    def _prepare(self, state: dict[str, Any]) -> tuple[Any, BaseException | None]:
        """``state`` flattened and checked by the backend (copying nothing), or the error
        that refuses it on this rank."""
        try:
            flat = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}
            return self._backend.prepare(flat), None
        except Exception as exc:  # noqa: BLE001 - raised on every rank by _agree_on
            return None, exc

    def _agree_on(
        self, step: int, busy: bool, refusal: BaseException | None, prepared: Any
    ) -> tuple[list[bool], CkptStoreError | None]:
        """The save's one collective: [any rank busy, the root unchecked somewhere,
        ``step`` to be replaced, ``step`` missing somewhere, a writer to be restarted],
        and this rank's error checking the root. A rank that cannot take part (its
        ``refusal``, a previous save's failure that ``strict`` raises now, a writer that
        could not start, or, unless ``busy``, the staging memory for ``prepared`` that it
        cannot allocate) makes every rank raise here: that rank its own error, the others
        the same error naming it."""
        own = self._take_failure() or refusal
        if own is None and self._agree.rank == 0:
            own = self._claim_root()
        if own is None and not busy:
            own = self._backend.start_error() or self._reserve(prepared)
        flags, unreachable = self._step_flags(step, busy)
        values = [int(busy), *(int(f) for f in flags), self._agree.rank + 1 if own else 0]
        *agreed, refused = self._agree.max_of(values)
        if refused:
            self._refuse(step, own, refused - 1)
        return [bool(v) for v in agreed], unreachable

    def _claim_root(self) -> BaseException | None:
        """Rank 0: own the root (at the first save) or check it is still ours; the
        ``RootInUseError`` naming another live run, else None. A store error while
        claiming is no refusal: the save goes on (and fails like any save if the root
        cannot be written) and the claim is tried again at the next save."""
        if self._owner is not None:
            try:
                self._owner.ensure_fresh()
                return None
            except errors.InUseError as exc:  # taken over, or not refreshed for long
                owner, self._owner = self._owner, None
                owner.stop(delete=False)
                if owner.lost is not None:
                    return RootInUseError(str(exc))
        try:
            self._owner = claim_root(self.root, self.run_id)
        except RootInUseError as exc:
            return exc
        except CkptStoreError as exc:
            log.warning("could not claim %s for run %r: %s", self.root, self.run_id, exc)
        return None

    def _reserve(self, prepared: Any) -> BaseException | None:
        """Allocate the staging memory ``prepared`` needs (no save of this rank reads the
        arena now); the error if it cannot be had."""
        try:
            self._backend.reserve(prepared)
        except errors.StagingMemoryError as exc:
            return exc
        return None

    def _raises(self) -> bool:
        """Whether a failed save is raised (else warned about): with ``strict``, and until
        the first save of this manager commits. The same on every rank (saves commit or
        fail on every rank alike)."""
        return self.options.strict or not self._committed_any

    def _fallback(self) -> str:
        """What a failed save leaves the newest checkpoint, for its message."""
        if self._newest is None:
            return f"no checkpoint of this job is committed under {self.root.url} yet"
        return f"step {self._newest} stays the newest checkpoint"

    def _take_failure(self) -> BaseException | None:
        """A previous save's failure: warned about now (None), or returned to be raised
        (on every rank, by ``_agree_on``) while ``_raises``."""
        if not self._raises():
            self._report_failures(stacklevel=5)  # save -> _agree_on -> here
            return None
        failures, self._unreported = self._unreported, []
        return failures[0] if failures else None

    def _refuse(self, step: int, own: BaseException | None, src: int) -> None:
        """Raise on every rank (a collective: rank ``src`` says why it cannot take the
        save of ``step``); nothing was staged or written."""
        why = self._agree.broadcast(_describe(own) if self._agree.rank == src else None, src)
        note = f"the save of step {step} was not started on any rank"
        if own is not None:
            if hasattr(own, "add_note"):  # Python >= 3.11
                alone = self._agree.group is None
                own.add_note(note if alone else f"{note} (this is rank {self._agree.rank})")
            self._told = own
            raise own
        name, message = why
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, CkptStoreError)):
            cls, message = CkptStoreError, f"{name}: {message}"
        raise cls(f"{message} (rank {src}); {note}")

    def _step_flags(
        self, step: int, busy: bool = False
    ) -> tuple[list[bool], CkptStoreError | None]:
        """[the root could not be checked, ``step`` must be replaced, ``step`` is not
        committed, the backend must be restarted] as this rank sees it, and the error
        that kept it from checking. While this rank's save is in flight (``busy``) the
        backend is not asked (the flags are taken again after waiting for it)."""
        restart = not busy and self._backend.needs_restart()
        try:
            exists = self.root.exists(f"{step_name(step)}/{MARKER_NAME}")
            return [False, exists and self._needs_replacing(step), not exists, restart], None
        except CkptStoreError as exc:
            return [True, False, False, restart], exc

    def _fail_unchecked(self, record: SaveRecord, start: float, exc: CkptStoreError | None) -> None:
        """A save that failed on every rank before writing anything: some rank could not
        check the root for the step (``exc``: this rank's error, None if it could)."""
        if exc is None:
            exc = TransientStoreError(
                f"the save of step {record.step} was not started: another rank could not "
                f"reach {self.root}; {self._fallback()}"
            )
        record.status, record.error = SaveStatus.FAILED, f"{type(exc).__name__}: {exc}"
        record.total_s = time.perf_counter() - start
        self.records.append(record)
        log.error("saving step %d failed: %s", record.step, record.error)
        self._unreported.append(exc)
        self._last_failed = exc
        self._report_failures()  # at once, on every rank alike (or raises it: _raises)

    def _needs_replacing(self, step: int) -> bool:
        """For a ``step`` with a marker: True if it is not a loadable checkpoint (restore
        found it damaged, or its marker does not commit a valid manifest) or (rank 0's
        view) another run committed it. Saving it then replaces it (a new attempt and
        marker) rather than skipping it."""
        if step in self._damaged:
            return True
        try:
            manifest = open_committed(self.root.child(step_name(step))).manifest
        except (IncompleteCheckpointError, CorruptCheckpointError):
            return True
        if self._agree.rank != 0 or _run_of(manifest) == self.run_id:
            return False
        log.warning(
            "step %d under %s was committed by %s, not by this run (%r): saving it again "
            "replaces it",
            step,
            self.root,
            _describe_run(manifest),
            self.run_id,
        )
        return True

    def _write(self, record: SaveRecord, staged: Any, start: float, overwrite: bool) -> None:
        t = time.perf_counter()
        try:
            notes = self._backend.write(record.step, staged, record.manifest_timings(), overwrite)
            record.warnings.extend(notes)
            record.status = SaveStatus.COMMITTED
            self._committed_any = True
            self._newest = max(record.step, self._newest or record.step)
            self._damaged.discard(record.step)
            if self.rank == 0:
                report(
                    "step %d committed to %s: %s from rank 0, %.2f s after save() "
                    "(training blocked %.3f s)",
                    record.step,
                    self.root.url,
                    size_text(record.bytes),
                    time.perf_counter() - start,
                    record.blocking_s,
                )
            local_keeps = {record.step}
            if self.rank == 0:
                try:
                    local_keeps |= self._apply_retention()
                except CkptStoreError as exc:  # the step is committed: a warning, not a failure
                    note = f"retention after step {record.step} failed: {exc}"
                    log.warning("%s", note)
                    record.warnings.append(note)
        except BaseException as exc:  # noqa: BLE001 - reported at the next save/wait/close
            record.status, record.error = SaveStatus.FAILED, f"{type(exc).__name__}: {exc}"
            log.error("saving step %d failed: %s", record.step, record.error)
            self._unreported.append(exc)
            self._last_failed = exc
            local_keeps = None
        else:
            self._last_failed = None
        finally:
            self._trim_local_tiers(record, local_keeps)
            self._protected.discard(record.step)
            record.background_s = time.perf_counter() - t
            record.total_s = time.perf_counter() - start

    def _wait_inflight(self, timeout: float | None = None) -> bool:
        fut = self._inflight
        if fut is None:
            return True
        try:
            fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:  # not the builtin before Python 3.11
            return False
        self._inflight = None
        return True

    def _report_failures(self, stacklevel: int = 3) -> None:
        """Warn about (while ``_raises``: raise the first of) the failures not reported
        yet; ``stacklevel`` 3 names the caller of the public method that called this."""
        failures, self._unreported = self._unreported, []
        for exc in failures:
            if self._raises():
                self._told = exc
                raise exc
            warnings.warn(
                f"a background checkpoint save failed: {exc}; training goes on and "
                f"{self._fallback()}",
                RuntimeWarning,
                stacklevel=stacklevel,
            )

    def wait(self) -> None:
        """Block until the in-flight save (if any) is committed or failed; report failures."""
        self._wait_inflight()
        self._report_failures()

    # -- retention -----------------------------------------------------------------------
    def _apply_retention(self) -> set[int]:
        """Prune the root as ``ckptstore-tool gc`` does (``ckptstore.manager.prune``): steps the
        policy lets go, torn leftovers, stale uploads; never the newest good commit, a step
        in use or a damaged one. Only ckptstore's own files are deleted. Returns the
        committed steps kept."""
        plan = plan_prune(
            self.root,
            self.options.keep,
            protected=set(self._protected),
            damaged=set(self._damaged),
        )
        for d in plan.deletions:
            log.info("removing %s (%s)", d.name, d.reason)
        apply_prune(self.root, plan)
        return {
            d.step
            for d in plan.steps
            if d.action == "keep" and d.status == CheckpointStatus.COMMITTED
        }

    def _trim_local_tiers(self, record: SaveRecord, kept: set[int] | None) -> None:
        """After every save, on every rank (a collective on the checkpoint group): every
        node's local tier keeps the newest ``KEEP_LOCAL`` of the steps rank 0's retention
        kept (``kept``; None: the save failed, nothing is trimmed). A failure here is a
        warning in the save's record."""
        keeps = local_tier_keeps(kept, KEEP_LOCAL) if kept else None
        try:
            self._local_tiers.after_save(keeps)
        except Exception as exc:  # noqa: BLE001 - the save itself is done either way
            note = f"trimming the local tier after step {record.step} failed: {exc}"
            log.warning("%s", note)
            record.warnings.append(note)

    def delete(self, step: int) -> None:
        """Delete ``step`` (marker first). Refuses the newest committed step and a step
        being saved or restored, as retention does."""
        if step in self._protected or step == self.latest_step():
            raise ConfigError(
                f"step {step} is the newest committed checkpoint or in use; it is not deleted"
            )
        delete_step(self.root, step_name(step))

    # -- restoring -----------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps, ascending."""
        return list(committed_steps(self.root))

    def latest_step(self) -> int | None:
        """The newest committed step, or None when the root holds none."""
        steps = self.steps()
        return steps[-1] if steps else None

    def restore(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest committed, verified checkpoint (or ``step``) into ``state``.

        Falls back to the previous committed step when one fails verification, with a
        warning naming what was wrong. Returns the step loaded, or None if there is none.
        An object item that needs more than ``weights_only`` unpickling raises
        ``UnsafePickleError`` (no fallback: every step would hold it) unless the manager
        was built with ``allow_pickle=True``.
        """
        self.wait()
        # Rank 0 alone lists the root and reads a step's marker, manifest and .metadata,
        # newest first and only as far as a fallback needs (finishing a commit a crash cut
        # short after its marker); the others get them. A collective generator.
        t = time.perf_counter()
        candidates = self._loader.discover(step)
        try:
            for s in candidates:
                self._protected.add(s)
                try:
                    error = self._loader.try_load(s, state)
                finally:
                    self._protected.discard(s)
                if error is None:
                    self._note_origin(s)
                    self._newest = max(s, self._newest or s)
                    self._report_restore(s, time.perf_counter() - t)
                    return s
                self._damaged.add(s)
                if step is not None:
                    raise error
                warnings.warn(
                    f"checkpoint step {s} could not be restored ({error}); falling back to "
                    "the previous committed step",
                    RuntimeWarning,
                    stacklevel=2,
                )
            if self.rank == 0:
                report("no committed checkpoint under %s: starting from scratch", self.root.url)
            return None
        finally:
            self._loader.forget()

    def _report_restore(self, step: int, seconds: float) -> None:
        """Rank 0: the restore's one line (step, where from, size, seconds)."""
        if self.rank != 0:
            return
        size = self._loader.size
        report(
            "restored step %d from %s%s in %.2f s",
            step,
            self._loader.source,
            f" ({size_text(size)})" if size is not None else "",
            seconds,
        )

    def _note_origin(self, step: int) -> None:
        """Rank 0: say so when the step just restored was written by another run."""
        committed = self._loader.loaded
        if self._agree.rank != 0 or committed is None:
            return
        if _run_of(committed.manifest) != self.run_id:
            log.warning(
                "restored step %d of %s, written by %s; this is run %r (a new job resuming "
                "that run's root; pass the same run_id to continue it as one run)",
                step,
                self.root,
                _describe_run(committed.manifest),
                self.run_id,
            )

    # -- preemption and shutdown ---------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        log.warning(
            "SIGTERM received: finishing checkpoint work within %.0f s", self.options.grace_period_s
        )
        self._preempted.set()

    def request_preemption(self) -> None:
        """Act as if SIGTERM arrived (e.g. from a scheduler's notice)."""
        self._preempted.set()

    def preemption_requested(self) -> bool:
        """True on every rank if any rank was asked to stop (a collective: call it everywhere)."""
        return self._agree.any(self._preempted.is_set())

    def finalize(self, step: int | None = None, state: dict[str, Any] | None = None) -> bool:
        """Flush the in-flight save within the grace period, then (if given) save ``step``
        synchronously. True if everything asked for is committed."""
        deadline = time.monotonic() + self.options.grace_period_s
        if not self._wait_inflight(timeout=self.options.grace_period_s):
            log.error("the in-flight save did not finish within the grace period")
            return False
        if step is None or state is None:
            return self._last_failed is None
        saved = self.save(step, state)
        if not self._wait_inflight(timeout=max(0.0, deadline - time.monotonic())):
            return False
        return saved and self.records[-1].status == SaveStatus.COMMITTED

    def close(self) -> None:
        """Wait for the in-flight save; raise if the last save failed (unless ``save`` or
        ``wait`` raised that failure already). Stops the writer
        process (``background="process"``) and frees the staging buffers."""
        try:
            self._wait_inflight()
            self._unreported.clear()
            if self._last_failed is not None:
                if self._last_failed is not self._told:  # not raised to the caller yet
                    raise self._last_failed
        finally:
            self._pool.shutdown(wait=True)
            if self._owner is not None:
                self._owner.stop()  # the root is free for the next job
                self._owner = None
            self._backend.close()
            self.engine.close()
            if self._old_handler is not None:
                signal.signal(signal.SIGTERM, self._old_handler)
                self._old_handler = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _run_of(manifest: Manifest) -> str | None:
    """The run that wrote ``manifest`` (``extra["run"]``), None when it does not say."""
    run = manifest.extra.get("run")
    return run if isinstance(run, str) else None


def _describe_run(manifest: Manifest) -> str:
    """``run 'x'``, or a note that the manifest names none (an older writer's)."""
    run = _run_of(manifest)
    return f"run {run!r}" if run is not None else "a run that recorded no run id"


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C, or an error a Ctrl-C caused on its way through torch's
    code (its serializer reports an interrupted write as ``RuntimeError: [enforce fail
    ...] unexpected pos``, with the ``KeyboardInterrupt`` as its context)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _describe(exc: BaseException | None) -> tuple[str, str]:
    """(class name, message) of ``exc``, for the ranks that raise it after its own."""
    return (type(exc).__name__, str(exc)) if exc is not None else ("CkptStoreError", "")
