"""``TierWriter``: each shard written to the local tier and uploaded to the root at once.

A ``CkptWriter`` that serialises each shard file once and streams the same bytes to two
files at the same time (``engine.tee.TeeWriter``): the tier copy in this job's directory
of the tier, ``local_tier_dir/<job>/<step>/`` (``tier.jobs``: a job is the root
and run; its directory is made with its stamp, and used only once the stamp proves it
this job's), and the upload to the root. After the commit in the root (the only commit
that counts) the same manifest and marker are committed in the tier copy, which makes it
a copy a restore can read, and this job's directory is trimmed to ``keep_local`` steps
(the rules: ``tier.rules``); other jobs' copies in the tier are never touched. If
writing the tier copy fails, its partial files and this save's uploads are removed; if
the upload fails, the complete tier copy is kept, uncommitted, and the error says where.
"""

from __future__ import annotations

import logging
from typing import Any

from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptstore.dcp.writer import CkptWriter, step_from_url
from ckptstore.engine.commit import commit
from ckptstore.engine.filewriter import FileWriter
from ckptstore.engine.manifest import Manifest
from ckptstore.engine.owner import run_identity
from ckptstore.engine.store import Store
from ckptstore.engine.tee import TeeWriter
from ckptstore.errors import CkptStoreError, StoreNotFoundError, TransferError
from ckptstore.tier.jobs import TierJob, TierSpec, check_local_tier_dir, open_job
from ckptstore.tier.rules import keep_newest, local_tier_keeps

__all__ = ["TierWriter"]

log = logging.getLogger(__name__)


class TierWriter(CkptWriter):
    """A ``CkptWriter`` that writes every shard to local disk and uploads it at once.

    Call order is ``CkptWriter``'s; it overrides only its hooks. ``write_data``: every
    rank opens this job's directory of the tier (``tier.jobs.open_job``, made with
    its stamp if absent; one that is not provably this job's fails the save on every rank,
    nothing written), writes each shard file locally and uploads it in parallel parts of
    each, returning when both are durable and agree on size and CRC32C; with a
    ``memory_budget`` too small for a part of each, the local file is written first and
    then uploaded (``engine.copy``, checking its CRC32C). ``finish``: the coordinator
    commits in the root, then commits the same manifest and marker in the tier copy and
    keeps the newest ``keep_local`` tier copies of this job
    (``tier.rules.keep_newest``; None: none are trimmed here, the caller decides,
    as ``CheckpointManager`` does for every node, ``LocalTier.after_save``).

    ``tier``: the job's place in a local tier (``TierSpec``: ``LocalTier.spec``, what the
    save step gets), or a tier directory alone: the job is then the root (the parent of
    the ``step_*`` directory written) and this process's run
    (``engine.owner.run_identity``: ``CKPTSTORE_RUN_ID``, torchrun's or Slurm's job id,
    else this process), so a writer in a later process of another run never trims this
    one's copies.
    """

    def __init__(
        self,
        url: str | Store,
        *,
        tier: TierSpec | str,
        keep_local: int | None = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, **kwargs)
        url = self.store.url.rstrip("/")  # a step's tier copy must not overlap its root
        root = url.rpartition("/")[0] if step_from_url(url) is not None else url
        if isinstance(tier, str):
            tier = TierSpec(tier, TierJob(url.rpartition("/")[0], run_identity()))
        check_local_tier_dir(root, tier.path)
        if keep_local is not None:
            local_tier_keeps((), keep_local)  # checks it (ConfigError)
        self.tier = tier
        self.keep_local = keep_local
        self._job_dir: Store | None = None  # opened by each write_data
        self._tees: list[tuple[str, TeeWriter]] = []  # this write_data's, in file order

    @property
    def local(self) -> Store:
        """The tier copy of the step written: ``<job directory>/<its last path
        segment>`` (the job's directory as this save's ``write_data`` opened it)."""
        assert self._job_dir is not None, "write_data opens the job's directory first"
        return self._job_dir.child(self.store.url.rstrip("/").rsplit("/", 1)[-1])

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """``CkptWriter.write_data``, each file written locally and uploaded at once."""
        self._tees = []
        try:
            return super().write_data(plan, planner)
        finally:
            self._tees = []

    # -- CkptWriter's hooks ------------------------------------------------------------
    def _shard_store(self) -> Store:
        """Shards are serialised into the tier copy, ``local_tier_dir/<job>/<step>/``:
        the job's directory is opened (its stamp checked, made if absent) now, inside
        DCP's collective write, so a refusal fails the save on every rank."""
        self._job_dir = open_job(self.tier.store(), self.tier.job, create=True)
        return self.local

    def _shard_writer(self, store: Store, name: str) -> FileWriter | TeeWriter:
        """The local file and its upload at once (a ``TeeWriter``); the local file alone
        when an upload of this save already failed, or when the memory budget cannot
        hold a part of each (``_shards_written`` uploads it then)."""
        local = self.engine.writer(store, name)
        if any(tee.secondary_error is not None for _, tee in self._tees):
            return local
        remote = self.engine.writer(self.store, name)
        if not TeeWriter.fits(local, remote):
            return local
        tee = TeeWriter(local, remote)
        self._tees.append((name, tee))
        return tee

    def _shards_failed(self, exc: BaseException) -> None:
        """Writing the tier copy failed (a full tier disk): remove its partial files
        and the uploads this save already made (the one in flight was aborted)."""
        self.local.delete_prefix("")
        for name, tee in self._tees:
            if tee.secondary.state == "closed":
                try:
                    self.store.delete(name)
                except Exception as err:  # noqa: BLE001 - uncommitted; the sweeper retries
                    log.warning("could not delete the upload %s: %s", name, err)

    def _shards_written(self, files: list[tuple[str, int]]) -> None:
        """Raise the first failed upload, else upload each file not yet uploaded,
        checking its CRC32C; on failure the complete local files are kept and the error
        says where."""
        local = self.local
        tees = dict(self._tees)
        try:
            for tee in tees.values():
                if (err := tee.secondary_error) is not None:
                    if not isinstance(err, CkptStoreError):
                        raise TransferError(f"upload of {self.url} failed: {err}") from err
                    raise err
            for name, crc in files:
                if name not in tees:
                    self.engine.copy(local, name, self.store, name, expect_crc=crc)
        except CkptStoreError as exc:
            if isinstance(exc, StoreNotFoundError):
                self._raise_if_committed_meanwhile(exc)
            exc.args = (f"{exc}; the complete tier copy is kept in {local.url}",)
            raise

    def _committed(self, manifest: Manifest, metadata_bytes: bytes) -> None:
        """Commit the same manifest and marker in the tier copy (a restore reads it), then
        trim the committed tier copies to ``keep_local``."""
        commit(
            self.local,
            self.engine,
            self.attempt,
            manifest,
            metadata_bytes,
            replace=True,
            check_files=False,  # this node's ranks' files only
        )
        self._trim_local()

    def _trim_local(self) -> None:
        """Keep the newest ``keep_local`` step directories of this job's directory of the
        local tier (on this node: the coordinator's; the manager trims every node's)."""
        if self.keep_local is not None and self._job_dir is not None:
            keep_newest(self._job_dir, self.keep_local)
