"""The staged-local writer: each shard is written to local NVMe and uploaded at once.

Call order is ``CkptWriter``'s; it overrides only ``CkptWriter``'s hooks
(``_shard_store``, ``_shard_writer``, ``_shards_failed``, ``_shards_written``,
``_committed``). What differs:

    write_data   every rank serialises each shard file once and streams the same bytes to
                 two files at the same time (``engine.tee.TeeWriter``): the local copy in
                 ``local_tier_dir/<step>/`` and the upload to the destination, as parallel
                 parts of each; it returns when both are durable and agree on size and
                 CRC32C (a rank with an empty plan, as DCP's dedup of replicated state
                 leaves, writes and uploads nothing). With a ``memory_budget`` too small
                 for a part of each, the local file is written first and then uploaded
                 (``engine.copy``, checking its CRC32C)
    finish       coordinator: commits at the destination (the only commit that counts),
                 then publishes the same manifest and marker locally, which makes the local
                 copy a restore tier: ``local_tier_matches`` tells when it is identical to
                 the committed remote checkpoint

If writing the local copy fails (a full staging disk), its partial files are removed, the
uploads in flight aborted and those already made deleted. If the upload fails (the
destination unreachable past the retry policy), the local files are still written to the
end and kept, complete and uncommitted, and the error says where. ``keep_local`` bounds how many
committed local copies stay on disk (oldest removed first).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptstore.dcp.writer import CkptWriter, step_from_url
from ckptstore.engine.bounded import MAX_MARKER_SIZE, get_capped
from ckptstore.engine.catalog import list_steps
from ckptstore.engine.commit import publish
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.filewriter import FileWriter
from ckptstore.engine.manifest import MARKER_NAME, Manifest
from ckptstore.engine.paths import check_local_tier_dir
from ckptstore.engine.store import Store
from ckptstore.engine.tee import TeeWriter
from ckptstore.errors import CkptStoreError, StoreNotFoundError, TransferError
from ckptstore.stores.local import LocalStore

__all__ = ["StagedWriter", "local_tier_matches"]

log = logging.getLogger(__name__)


def local_tier_matches(local: Store, remote: Store) -> bool:
    """True when ``local`` holds a committed copy whose marker equals ``remote``'s."""
    try:
        same = get_capped(local, MARKER_NAME, MAX_MARKER_SIZE) == get_capped(
            remote, MARKER_NAME, MAX_MARKER_SIZE
        )
    except StoreNotFoundError:
        return False
    if not same:
        return False
    from ckptstore.engine.commit import open_committed

    manifest = open_committed(local).manifest
    return all(
        os.path.exists(os.path.join(local.url, name)) and local.size(name) == entry.size
        for name, entry in manifest.files.items()
    )


class StagedWriter(CkptWriter):
    """A ``CkptWriter`` that writes every shard to local disk and uploads it at once."""

    def __init__(
        self, url: str | Store, *, local_tier_dir: str, keep_local: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(url, **kwargs)
        url = self.store.url  # a step's staging must not overlap its run root either
        check_local_tier_dir(
            url.rpartition("/")[0] if step_from_url(url) is not None else url, local_tier_dir
        )
        self.staging_root = LocalStore(local_tier_dir)
        self.keep_local = keep_local
        self._tees: list[tuple[str, TeeWriter]] = []  # this write_data's, in file order

    @property
    def local(self) -> LocalStore:
        """The local copy of the current destination: ``local_tier_dir/<its last path segment>``."""
        return self.staging_root.child(self.store.url.rstrip("/").rsplit("/", 1)[-1])

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
        """Delete the oldest committed local copies beyond ``keep_local``. Only canonical
        step directories count: an entry that is not one (a symlink, a file named like a
        step) is warned about once and left alone, never followed or deleted."""
        steps = [e.name for e in list_steps(self.staging_root, with_status=False, once=True)]
        for name in steps[: max(0, len(steps) - self.keep_local)]:
            delete_step(self.staging_root, name)
