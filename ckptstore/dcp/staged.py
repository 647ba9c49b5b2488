"""``StagedWriter``: each shard written to the node-local tier and uploaded at once.

A ``CkptWriter`` that serialises each shard file once and streams the same bytes to two
files at the same time (``engine.tee.TeeWriter``): the local copy in
``local_tier_dir/<step>/`` and the upload to the destination. After the commit at the
destination (the only commit that counts) the same manifest and marker are published
locally, which makes the local copy a restore tier, and the local tier is trimmed to
``keep_local`` steps (the rules: ``engine.local_tier``). If writing the local copy fails,
its partial files and this save's uploads are removed; if the upload fails, the complete
local files are kept, uncommitted, and the error says where.
"""

from __future__ import annotations

import logging
from typing import Any

from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptstore.dcp.writer import CkptWriter, step_from_url
from ckptstore.engine.commit import publish
from ckptstore.engine.filewriter import FileWriter
from ckptstore.engine.local_tier import keep_newest, local_tier_keeps
from ckptstore.engine.manifest import Manifest
from ckptstore.engine.paths import check_local_tier_dir
from ckptstore.engine.store import Store
from ckptstore.engine.tee import TeeWriter
from ckptstore.errors import CkptStoreError, StoreNotFoundError, TransferError
from ckptstore.stores.local import LocalStore

__all__ = ["StagedWriter"]

log = logging.getLogger(__name__)


class StagedWriter(CkptWriter):
    """A ``CkptWriter`` that writes every shard to local disk and uploads it at once.

    Call order is ``CkptWriter``'s; it overrides only its hooks. ``write_data``: every
    rank writes each shard file locally and uploads it in parallel parts of each,
    returning when both are durable and agree on size and CRC32C; with a
    ``memory_budget`` too small for a part of each, the local file is written first and
    then uploaded (``engine.copy``, checking its CRC32C). ``finish``: the coordinator
    commits at the destination, then publishes the same manifest and marker locally and
    keeps the newest ``keep_local`` local copies (``engine.local_tier.keep_newest``;
    None: none are trimmed here, the caller decides, as ``CheckpointManager`` does for
    every node).
    """

    def __init__(
        self, url: str | Store, *, local_tier_dir: str, keep_local: int | None = 1, **kwargs: Any
    ) -> None:
        super().__init__(url, **kwargs)
        url = self.store.url  # a step's staging must not overlap its run root either
        check_local_tier_dir(
            url.rpartition("/")[0] if step_from_url(url) is not None else url, local_tier_dir
        )
        if keep_local is not None:
            local_tier_keeps((), keep_local)  # checks it (ConfigError)
        self.tier_root = LocalStore(local_tier_dir)
        self.keep_local = keep_local
        self._tees: list[tuple[str, TeeWriter]] = []  # this write_data's, in file order

    @property
    def local(self) -> LocalStore:
        """The local copy of the current destination: ``local_tier_dir/<its last path segment>``."""
        return self.tier_root.child(self.store.url.rstrip("/").rsplit("/", 1)[-1])

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """``CkptWriter.write_data``, each file written locally and uploaded at once."""
        self._tees = []
        try:
            return super().write_data(plan, planner)
        finally:
            self._tees = []

    # -- CkptWriter's hooks ------------------------------------------------------------
    def _shard_store(self) -> Store:
        """Shards are serialised into the local copy, ``local_tier_dir/<step>/``."""
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
        """Writing the local copy failed (a full staging disk): remove its partial files
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
            exc.args = (f"{exc}; the complete local copy is kept in {local.url}",)
            raise

    def _committed(self, manifest: Manifest, metadata_bytes: bytes) -> None:
        """Publish the same manifest and marker locally (the restore tier), then trim the
        committed local copies to ``keep_local``."""
        publish(
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
        """Keep the newest ``keep_local`` step directories of the local tier (on this
        node: the coordinator's; the manager trims every node's)."""
        if self.keep_local is not None:
            keep_newest(self.tier_root, self.keep_local)
