"""``CkptWriter``: the DCP ``StorageWriter`` over any store (parts, checksums, commit).

Every rank writes its shard files through the transfer engine, each durable before
``write_data`` returns; the coordinator then writes the manifest, ``.metadata`` and the
create-only ``COMMITTED`` marker (``engine.commit.commit``). Shard files keep DCP's
per-rank layout, named ``__<rank>_<i>.<attempt>.distcp`` with an id per rank and save,
so no two saves (overwrites of a step included, or a zombie of an earlier job) ever
touch each other's files, and nothing DCP caches across saves holds an id. A
``WriteSchedule`` (``dcp.schedule``) given at construction decides the grouping and
order of a rank's files; ``TierWriter`` (``tier.tier_writer``) changes where they go through
the protected hooks listed in the class docstring; how one file's items are serialised is
``dcp.shard_file``'s. Writers pickle (``dcp.async_save``
with the process executor sends them to a subprocess): the store and engine are
re-opened there from the URL, storage options and transfer settings.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ckptstore.config import TransferConfig, WriterOptions
from ckptstore.dcp.encoding import ItemInfo
from ckptstore.dcp.metadata import build_indexes
from ckptstore.dcp.schedule import PlainSchedule, WriteSchedule
from ckptstore.dcp.shard_file import write_items
from ckptstore.dcp.storebound import StoreBound
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.codec_registry import get_codec
from ckptstore.engine.codecs import Codec
from ckptstore.engine.commit import commit, warn_after_commit
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.filewriter import FileInfo, FileWriter
from ckptstore.engine.lease import Heartbeat, hold_step_lease
from ckptstore.engine.manifest import MARKER_NAME, Manifest
from ckptstore.engine.names import KEY_LAYOUTS, parse_step
from ckptstore.engine.owner import run_identity
from ckptstore.engine.store import Store
from ckptstore.engine.tee import TeeWriter
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CheckpointExistsError,
    CommitConflictError,
    ConfigError,
    StoreNotFoundError,
)

__all__ = ["CkptWriter", "step_from_url"]


def step_from_url(url: str) -> int | None:
    """The step of a ``.../step_000000100`` URL (``engine.names``'s exact form), else None."""
    return parse_step(url.rstrip("/").rpartition("/")[2])


@dataclass(frozen=True)
class _RankPlan:
    """A rank's part of the global plan: only what is the same on every save (DCP may
    cache it), never a per-save id."""

    prefix: str


def shard_prefix(rank: int, layout: str) -> str:
    """The name prefix of ``rank``'s shard files: ``__<rank>_``, or under ``<hh>/``.

    ``hh`` is the low byte of the CRC32C of the rank number: a stable, even spread of
    neighbouring ranks over 256 sub-prefixes.
    """
    if layout == "flat":
        return f"__{rank}_"
    if layout == "spread":
        return f"{crc32c(str(rank).encode()) & 0xFF:02x}/__{rank}_"
    raise ConfigError(f"key_layout must be one of {KEY_LAYOUTS}, not {layout!r}")


def _new_attempt() -> str:
    return uuid.uuid4().hex[:12]


class CkptWriter(StoreBound, StorageWriter):
    """Writes a DCP checkpoint to any ckptstore store. Build it with ``ckptstore.writer``.

    Call order (driven by ``torch.distributed.checkpoint.save``)::

        reset(checkpoint_id)          every rank, when DCP is given a checkpoint_id: the URL
        set_up_storage_writer(...)    every rank, every save: a new attempt id of its own;
                                      ``schedule.set_up()``; refuses use_collectives=False
                                      on several ranks
        prepare_local_plan(plan)      every rank: the coordinator refuses a committed
                                      step and starts the step lease
                                      (``engine.lease``) before any rank writes
        prepare_global_plan(plans)    coordinator: gives each rank its file prefix
        write_data(plan, planner)     every rank: its shard files as ``schedule`` groups and
                                      orders them, durable before it returns (none for an
                                      empty plan, which DCP's dedup often leaves)
        finish(metadata, results)     coordinator, only if every rank succeeded: manifest,
                                      .metadata, then COMMITTED; then the lease goes (also
                                      at the next save, or by ``release_lease()``)

    If any rank fails, DCP never calls ``finish``: nothing is committed and every rank
    raises. Subclasses change where shards go through five hooks, called in this order:
    ``_shard_store()`` (where ``write_data`` serialises the files), ``_shard_writer(store,
    name)`` per file, then ``_shards_failed(exc)`` if that raised, else
    ``_shards_written(files)``; ``_committed(manifest, metadata_bytes)`` at the end of
    ``finish``. ``options`` (``WriterOptions``; default: the defaults, with ``engine``'s
    transfer settings): ``key_layout="spread"`` puts each rank's files under one of 256
    two-hex-digit sub-prefixes (``shard_prefix``) for stores that limit the request rate
    per key prefix; ``codec`` names a codec of ``engine.codec_registry`` (with ``"zstd"``
    stock readers load it too, through DCP's ``stream.zstd/1`` transform); ``transfer``
    is the engine's settings (a given ``engine`` is used as it is).
    """

    def __init__(
        self,
        url: str | Store,
        options: WriterOptions | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        overwrite: bool = False,
        step: int | None = None,
        files_per_rank: int = 1,
        engine: TransferEngine | None = None,
        schedule: WriteSchedule | None = None,
        check_files: bool = True,
    ) -> None:
        super().__init__()
        #: False: the step holds only the coordinator's node's files (a save to
        #: local tiers), so the commit does not check that every file is there.
        self.check_files = check_files
        if options is None:  # the defaults, with the engine's transfer settings if given
            options = WriterOptions(transfer=engine.config if engine else TransferConfig())
        elif not isinstance(options, WriterOptions):
            raise ConfigError(f"a writer's options are a WriterOptions, not {options!r}")
        shard_prefix(0, options.key_layout)  # validates it
        self.key_layout = options.key_layout
        self._bind(url, storage_options, options.transfer, engine)
        self.overwrite = overwrite
        self.codec = options.codec  # validated (see the property)
        self._step = step
        self.files_per_rank = max(1, files_per_rank)
        #: How this rank's shard files are grouped and ordered (``dcp.schedule``).
        self.schedule: WriteSchedule = schedule if schedule is not None else PlainSchedule()
        self.attempt = _new_attempt()
        self.rank = 0
        self.is_coordinator = True
        #: Merged into the manifest's ``extra`` at commit (the manager records timings
        #: and its run identity, ``extra["run"]``).
        self.manifest_extra: dict[str, Any] = {}
        self._lease: Heartbeat | None = None
        self._lease_gone: Any = None  # the finalizer that stops it with this writer

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_lease"] = state["_lease_gone"] = None  # a thread: never sent
        return state

    def _hold_lease(self) -> None:
        """Coordinator: start this attempt's step lease (written now, refreshed in the
        background) before any rank writes a file (``engine.lease.hold_step_lease``)."""
        self.release_lease()
        run = str(self.manifest_extra.get("run") or run_identity())
        self._lease = hold_step_lease(self.store, self.attempt, run)
        if self._lease is not None:
            self._lease_gone = weakref.finalize(self, self._lease.stop)

    def release_lease(self) -> None:
        """Stop this writer's step lease and delete it (idempotent). ``finish`` does it
        after the commit; after a failed save, the next save (or this call) does."""
        gone, self._lease, self._lease_gone = self._lease_gone, None, None
        if gone is not None:
            gone()

    @property
    def codec(self) -> str:
        """The codec items are written with, as given (a name or descriptor of
        ``ckptstore.engine.codec_registry``); setting it checks it (``ConfigError``)."""
        return self._codec_spec

    @codec.setter
    def codec(self, spec: str) -> None:
        self._codec: Codec = get_codec(spec)
        self._codec_spec = spec

    @property
    def step(self) -> int | None:
        """The step the manifest records: the one given, else the URL's (None if neither)."""
        return self._step if self._step is not None else step_from_url(self.url)

    # -- StorageWriter -----------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Re-open the store if ``checkpoint_id`` names another URL; start a new attempt."""
        self.release_lease()
        self._rebind(checkpoint_id)
        self.attempt = _new_attempt()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record this rank's role and number and start a new attempt (every save).

        Raises ``ConfigError`` for ``use_collectives=False`` with more than one rank.
        """
        self.release_lease()  # a failed save's (finish never ran)
        self.schedule.set_up()
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank") or 0
        # DCP calls reset() only when given a checkpoint_id; this runs on every save.
        self.attempt = _new_attempt()
        if kwargs.get("use_collectives", True) is False and _world_size() > 1:
            raise ConfigError(
                f"dcp.save(use_collectives=False) makes every rank write a checkpoint of its "
                f"own (stock DCP's __<rank>.metadata); ckptstore commits one checkpoint for "
                f"all ranks at {self.url}. Save with use_collectives=True (the default); for "
                "one checkpoint per rank, give each rank its own URL and pass no_dist=True."
            )

    def probe(self) -> None:
        """Ask the store about the step once (whether it holds a marker), so that a
        wrong endpoint or credential raises now; a committed step is refused only
        by the save that would write it (``check_step``)."""
        self.store.exists(MARKER_NAME)

    def check_step(self) -> None:
        """Refuse a step that is committed already, unless ``overwrite``."""
        if self.store.exists(MARKER_NAME) and not self.overwrite:
            raise CheckpointExistsError(
                f"{self.url} already holds a committed checkpoint; pick another step/path or "
                "pass overwrite=True to replace it."
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Return ``plan`` unchanged; the coordinator first runs :meth:`check_step`."""
        if self.is_coordinator:
            self.check_step()
            self._hold_lease()
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Give each rank's plan its shard file prefix (``shard_prefix``) as storage data."""
        return [
            dataclasses.replace(plan, storage_data=_RankPlan(shard_prefix(i, self.key_layout)))
            for i, plan in enumerate(plans)
        ]

    def _shard_files(self, plan: SavePlan, groups: list[list]) -> list[tuple[str, list]]:
        """(file name, items) for ``groups`` of ``plan``'s items, one shard file each, in order."""
        rank_plan: _RankPlan = plan.storage_data
        return [(f"{rank_plan.prefix}{i}.{self.attempt}.distcp", g) for i, g in enumerate(groups)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's shard files into ``_shard_store()``, in the groups and order
        ``schedule`` gives, durable before returning.

        Returns an already completed future of one ``WriteResult`` per item (its
        ``storage_data`` an ``ItemInfo``); an error is raised here, after ``_shards_failed``.
        """
        schedule = self.schedule
        try:
            target = self._shard_store()
            results: list[WriteResult] = []
            files: list[tuple[str, int]] = []
            try:
                groups = schedule.group(plan.items, planner.resolve_data, self.files_per_rank)
                for i, (name, items) in enumerate(self._shard_files(plan, groups)):
                    schedule.before_file(i)
                    file_results = self._write_file(name, items, planner, store=target)
                    schedule.after_file(i)
                    files.append((name, file_results[0].storage_data.file_crc32c))
                    results.extend(file_results)
            except BaseException as exc:
                self._shards_failed(exc)
                raise
            self._shards_written(files)
        finally:
            schedule.end()
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    # -- hooks for subclasses (``TierWriter``), in the order write_data / finish call them
    def _shard_store(self) -> Store:
        """Where ``write_data`` serialises this rank's shard files: the step."""
        return self.store

    def _shard_writer(self, store: Store, name: str) -> FileWriter | TeeWriter:
        """What shard file ``name`` of ``store`` (``_shard_store()``) is serialised
        through. Here: one streamed write of it (``engine.writer``)."""
        return self.engine.writer(store, name)

    def _shards_failed(self, exc: BaseException) -> None:
        """Serialising a shard file raised ``exc`` (re-raised after this returns): clean up
        or raise a better error. Here: a vanished upload may mean a racing writer won."""
        if isinstance(exc, StoreNotFoundError):
            self._raise_if_committed_meanwhile(exc)

    def _shards_written(self, files: list[tuple[str, int]]) -> None:
        """Every shard file of this rank is serialised and durable in ``_shard_store()``:
        ``files`` holds (name, CRC32C of the whole file) of each. Here: nothing to do."""

    def _committed(self, manifest: Manifest, metadata_bytes: bytes) -> None:
        """``finish`` committed the checkpoint at the step (coordinator only): its
        manifest and pickled ``.metadata``. A failure here is a warning in the save's
        record, never a failed save: the checkpoint is committed. Here: nothing to do."""

    def _raise_if_committed_meanwhile(self, exc: Exception) -> None:
        """A racing writer that committed this step cleans up other attempts' files, so a
        vanished upload usually means we lost the race: say so."""
        if self.store.exists(MARKER_NAME):
            raise CommitConflictError(
                f"{self.url} was committed by another writer while this one was writing "
                f"({exc}); this attempt's files were removed and the other checkpoint is kept."
            ) from exc

    def _write_file(
        self, name: str, items: list, planner: SavePlanner, store: Store | None = None
    ) -> list[WriteResult]:
        """Serialise ``items`` into file ``name`` of ``store`` (default: the step)
        through ``_shard_writer``, in the order and form ``dcp.shard_file`` writes them."""
        with self._shard_writer(store or self.store, name) as w:
            written = write_items(w, items, planner.resolve_data, self._codec)
            info: FileInfo = w.close()
        crashpoint("after_shards")
        return [
            WriteResult(
                index=item.index,
                size_in_bytes=length,
                storage_data=ItemInfo(name, offset, length, crc, raw, info.size, info.crc32c, span),
            )
            for item, offset, length, crc, raw, span in written
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit (coordinator only): manifest, ``.metadata``
        (``dcp.metadata.build_indexes``), then the ``COMMITTED`` marker.

        See ``engine.commit.commit``. The marker is create-only unless ``overwrite``: one
        already there raises ``CommitConflictError`` (this attempt's files are removed).
        Then calls ``_committed`` (a failure there is a warning in the save's record: the
        checkpoint is committed).
        """
        try:
            manifest, metadata_bytes = build_indexes(
                metadata,
                results,
                step=self.step,
                codec=self._codec,
                extra=self.manifest_extra,
                storage_meta=self.storage_meta(),
            )
            commit(
                self.store,
                self.engine,
                self.attempt,
                manifest,
                metadata_bytes,
                replace=self.overwrite,
                check_files=self.check_files,
            )
        finally:
            self.release_lease()
        try:
            self._committed(manifest, metadata_bytes)
        except Exception as exc:  # noqa: BLE001 - the marker is written: the save stands
            warn_after_commit(f"{self.store.url} is committed, but {exc}")

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint's URL and this save's attempt id, as stored in ``.metadata``."""
        return StorageMeta(checkpoint_id=self.url, save_id=self.attempt)


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
