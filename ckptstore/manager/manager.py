"""``CheckpointManager``: async saves, verified resume, retention, preemption.

The manager is the one public face of ``ckptstore.manager``: it builds what a run's saves
and restores need once, in its constructor (options, store, process groups, the save
backend: ``saving.backend``), and hands each call to the part that does it: a save to
``save_flow.SaveFlow`` (its agreement, staging and background write; failures reported
by ``failures.FailureLog``; the root claimed by ``ownership.RootOwner``), a restore to
``restore.StepLoader``. Preemption (SIGTERM, ``finalize``) and shutdown are here.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import warnings
from typing import Any

import torch.distributed as dist

from ckptstore.engine.catalog import committed_steps
from ckptstore.engine.cores import local_ranks
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.names import step_name
from ckptstore.engine.owner import run_identity
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import ConfigError, NewerFormatError, NoLoadableCheckpointError, size_text
from ckptstore.launch import fresh_new_group
from ckptstore.manager.agreement import Agreement
from ckptstore.manager.failures import FailureLog, interrupted
from ckptstore.manager.options import ManagerOptions, SaveOptions
from ckptstore.manager.ownership import RootOwner, describe_run, run_of
from ckptstore.manager.records import MANIFEST_TIMINGS, SaveRecord, SaveStatus, report
from ckptstore.manager.restore import StepLoader
from ckptstore.manager.save_flow import SaveFlow
from ckptstore.manager.saving.backend import make_backend
from ckptstore.manager.saving.process_backend import ProcessBackend
from ckptstore.manager.saving.shared_stager import SharedStager
from ckptstore.manager.saving.writer_process import BackgroundWriter
from ckptstore.stores import open_store
from ckptstore.tier.local_tier import LocalTier

__all__ = ["CheckpointManager", "MANIFEST_TIMINGS", "SaveRecord", "SaveStatus"]

log = logging.getLogger(__name__)


class CheckpointManager:
    """Async checkpoints under one root URL.

    Call order (every rank calls every method, in the same order)::

        mgr = CheckpointManager(root, local_tier_dir=..., keep=KeepLast(3))
                                      # after init_process_group
        step = mgr.restore(state)     # newest committed + verified step (falling back past
                                      # a corrupt one), or None on a fresh run; rank 0 reads
                                      # the root and broadcasts what it found (a newer
                                      # local-only step first, from the nodes)
        mgr.save(step, state)         # returns once the state is staged (the optimizers'
                                      # tensors: while the next step runs, its
                                      # optimizer.step waiting for them); serialisation,
                                      # upload and commit run in the background (with
                                      # local_every / root_every: to the root, to the
                                      # local tier alone, or not at all, by step)
        mgr.wait_staged()             # before changing the optimizers' tensors other
                                      # than by their step (defer_staging)
        mgr.preemption_requested()    # all ranks agree whether SIGTERM arrived anywhere
        mgr.finalize(step, state)     # on preemption: flush the save in flight within the
                                      # grace period, then one last checkpoint
        mgr.close()                   # waits; raises if the last save failed; frees all

    At most one save is in flight: a ``save`` while one uploads waits for it
    (``on_busy="wait"``, counted as blocking time) or is skipped on every rank ("skip").
    Saves run on their own gloo group, small agreements on a second one, never training's
    (``ckptstore.launch.fresh_new_group``: they connect again after a torchrun restart).
    The first ``save`` makes rank 0 the root's owner (``ownership``); each manifest
    records the run identity. A failed background save is raised or warned about at the
    next ``save``/``wait`` and by ``close`` (``failures``); a save some rank cannot take
    (a value that cannot be staged, staging memory it cannot allocate, a writer process
    that could not start) raises from ``save`` on every rank at once, nothing written.
    ``max_staging_bytes`` bounds the host memory a save stages into: beyond it training
    waits for the part not copied to be written (``saving.write_order``).
    """

    def __init__(
        self, root: str | Store, options: ManagerOptions | None = None, **keywords: Any
    ) -> None:
        """``options`` (``ManagerOptions``, checked) with any of its fields given as keywords
        on top: ``CheckpointManager(root, keep=KeepLast(5), local_tier_dir="/nvme/ckpt")``."""
        self.options = opts = ManagerOptions.from_keywords(options, **keywords)
        self.engine = TransferEngine(opts.writer.transfer)
        storage_options = dict(opts.storage_options) if opts.storage_options else None
        # Every control call on the root (HEAD of a marker, listings, marker and manifest
        # GETs, deletes) is retried per the engine's RetryConfig through this view.
        self.root = retrying(
            open_store(root, storage_options), self.engine.config.retry, self.engine.stats
        )
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
        self._owner = RootOwner(self.root, self.run_id)  # rank 0 claims it at each save
        # The local tier, built once (ConfigError if it overlaps the root): this job (root
        # and run) keeps its copies in a directory of its own in each node's tier, stamped
        # with both; its keep rules, node map and peers (``ckptstore.tier``).
        self._tier = LocalTier.of(
            opts, self.root.url, self.run_id, group=self._pg, engine=self.engine
        )
        # The part of the options a save needs, as every backend and writer gets it.
        self._save_options = SaveOptions.of(opts, self.run_id, self._tier.spec)
        self._backend = make_backend(
            root,
            self.root,
            self._save_options,
            engine=self.engine,
            rank=self.rank,
            world_size=dist.get_world_size() if distributed else 1,
            process_group=self._pg,
            agree=self._agree,
            # the ranks on this node; no launcher said: all of them, the cautious guess
            local_ranks=local_ranks(dist.get_world_size() if distributed else 1),
            asynchronous=opts.async_save,
        )
        self._loader = StepLoader(
            self.root,
            engine=self.engine,
            tier=self._tier,
            allow_pickle=opts.allow_pickle,
            process_group=self._pg,
            agree=self._agree,
        )
        self._failures = FailureLog(self.root.url, opts.strict)
        self._flow = SaveFlow(
            self.root,
            opts,
            self._backend,
            agree=self._agree,
            tier=self._tier,
            failures=self._failures,
            owner=self._owner,
            run_id=self.run_id,
            rank=self.rank,
        )
        self.records: list[SaveRecord] = self._flow.records
        #: Committed steps restore found corrupt (their marker matched): retention neither
        #: counts them toward what it keeps nor deletes them, and saving one again
        #: replaces it (a new attempt and marker) instead of skipping it.
        self._damaged: set[int] = self._flow.damaged
        self._preempted = threading.Event()
        self._old_handler: Any = None
        if opts.handle_sigterm:
            self._old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    @property
    def background(self) -> tuple[str, str]:
        """Where saves run, "thread" or "process", and why (the option given, or what
        ``background="auto"`` found); rank 0 reports it with the first commit."""
        return self._backend.name, self._backend.reason

    # -- the process backend's parts, for diagnostics ------------------------------------
    @property
    def _bg(self) -> BackgroundWriter | None:
        """This rank's writer process (``background="process"``), else None."""
        backend = getattr(self._backend, "inner", self._backend)  # AutoBackend's choice
        return backend.writer if isinstance(backend, ProcessBackend) else None

    @property
    def _shared(self) -> SharedStager | None:
        """The shared-memory staging arena (``background="process"``), else None."""
        backend = getattr(self._backend, "inner", self._backend)
        return backend.stager if isinstance(backend, ProcessBackend) else None

    # -- saving --------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> bool:
        """Start saving ``state`` as ``step``; False if skipped. See the class docstring.

        Ctrl-C (``KeyboardInterrupt``) while ``save`` runs: one line says the step was not
        committed, and the interrupt goes on as Python's own (exit status 130 / SIGINT),
        never as the error of whatever torch was serialising when it arrived."""
        return self._save(step, state)

    def _save(self, step: int, state: dict[str, Any], durable: bool = False) -> bool:
        """``save``; ``durable``: to the root whatever the cadences say."""
        try:
            return self._flow.save(step, state, durable)
        except BaseException as exc:
            if not interrupted(exc):
                raise
            log.warning("interrupted (Ctrl-C): step %d was not committed", step)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from None

    def wait_staged(self) -> float:
        """Return once the last save's staging copy is done: training may change the
        saved tensors then. The optimizers in the saved state call it themselves before
        each ``step`` (``defer_staging``); call it before changing their parameters or
        state any other way. The seconds waited."""
        return self._flow.wait_staged()

    def wait(self) -> None:
        """Block until the in-flight save (if any) is committed or failed; report failures."""
        self._flow.wait_inflight()
        self._failures.report()

    def delete(self, step: int) -> None:
        """Delete ``step`` (marker first). Refuses the newest committed step and a step
        being saved or restored, as retention does."""
        if step in self._flow.protected or step == self.latest_step():
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

    def restore(
        self, state: dict[str, Any], step: int | None = None, *, on_unloadable: str = "raise"
    ) -> int | None:
        """Load the newest committed, verified checkpoint (or ``step``) into ``state``.

        Falls back to the previous committed step when one fails verification (or was
        written by a newer torch or ckptstore, ``NewerFormatError``), with a warning naming
        what was wrong. Returns the step loaded, or None if the root holds no committed
        step. If it holds some and none loads, it raises ``NoLoadableCheckpointError``
        listing each step and why (a fresh start would silently lose the job's progress),
        unless ``on_unloadable="fresh"``: then it warns the same and returns None. An
        object item that needs more than ``weights_only`` unpickling raises
        ``UnsafePickleError`` (no fallback: every step would hold it) unless the manager
        was built with ``allow_pickle=True``.
        """
        if on_unloadable not in ("raise", "fresh"):
            raise ConfigError(f'on_unloadable must be "raise" or "fresh"; got {on_unloadable!r}')
        self.wait()
        # Rank 0 alone lists the root and reads a step's marker, manifest and .metadata,
        # newest first and only as far as a fallback needs (finishing a commit a crash cut
        # short after its marker); the others get them. A collective generator.
        t = time.perf_counter()
        candidates = self._loader.discover(step)
        refused: list[tuple[int, str]] = []
        try:
            for s in candidates:
                self._flow.protected.add(s)
                try:
                    error = self._loader.try_load(s, state)
                finally:
                    self._flow.protected.discard(s)
                if error is None:
                    self._note_origin(s)
                    self._failures.restored(s)
                    self._report_restore(s, time.perf_counter() - t)
                    return s
                if not isinstance(error, NewerFormatError):  # not damage: left as it is
                    self._damaged.add(s)
                if step is not None:
                    raise error
                refused.append((s, str(error)))
                warnings.warn(
                    f"checkpoint step {s} could not be restored ({error}); falling back to "
                    "the previous committed step",
                    RuntimeWarning,
                    stacklevel=2,
                )
            refused = sorted(refused + self._loader.refused, reverse=True)
            if refused:
                self._none_loadable(refused, on_unloadable)
                return None
            if self.rank == 0:
                report("no committed checkpoint under %s: starting from scratch", self.root.url)
            return None
        finally:
            self._loader.forget()

    def _none_loadable(self, refused: list[tuple[int, str]], on_unloadable: str) -> None:
        """The end of a restore that found committed steps and loaded none (``refused``:
        each with why, newest first): ``NoLoadableCheckpointError`` on every rank, or with
        ``on_unloadable="fresh"`` a warning and a fresh start."""
        error = NoLoadableCheckpointError.of(self.root.url, refused)
        if on_unloadable != "fresh":
            raise error
        warnings.warn(error.warning(), RuntimeWarning, stacklevel=3)

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
        if run_of(committed.manifest) != self.run_id:
            log.warning(
                "restored step %d of %s, written by %s; this is run %r (a new job resuming "
                "that run's root; pass the same run_id to continue it as one run)",
                step,
                self.root,
                describe_run(committed.manifest),
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
        synchronously, to the root whatever ``local_every`` says. True if everything asked
        for is committed."""
        deadline = time.monotonic() + self.options.grace_period_s
        if not self._flow.wait_inflight(timeout=self.options.grace_period_s):
            log.error("the in-flight save did not finish within the grace period")
            return False
        if step is None or state is None:
            return self._failures.last_failed is None
        saved = self._save(step, state, durable=True)  # a preempted job's nodes may go too
        if not self._flow.wait_inflight(timeout=max(0.0, deadline - time.monotonic())):
            return False
        return saved and self.records[-1].status == SaveStatus.COMMITTED

    def close(self) -> None:
        """Wait for the in-flight save; raise if the last save failed (unless ``save`` or
        ``wait`` raised that failure already). Stops the writer
        process (``background="process"``) and frees the staging buffers."""
        try:
            self._flow.wait_inflight()
            untold = self._failures.untold()
            if untold is not None:
                raise untold
        finally:
            self._flow.close()
            self._owner.release()  # the root is free for the next job
            self._backend.close()
            self.engine.close()
            if self._old_handler is not None:
                signal.signal(signal.SIGTERM, self._old_handler)
                self._old_handler = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
