"""The staged-local writer: shards go to local NVMe first, then the engine uploads them.

Call order is ``CkptWriter``'s; it overrides only ``CkptWriter``'s hooks
(``_shard_store``, ``_shards_failed``, ``_shards_written``, ``_committed``). What differs:

    write_data   every rank serialises its shard files into ``staging_dir/<step>/`` (fast,
                 local), then uploads each to the destination as parallel parts, checking
                 the uploaded CRC32C against the local one (a rank with an empty plan,
                 as DCP's dedup of replicated state leaves, writes and uploads nothing)
    finish       coordinator: commits at the destination (the only commit that counts),
                 then publishes the same manifest and marker locally, which makes the local
                 copy a restore tier: ``local_tier_matches`` tells when it is identical to
                 the committed remote checkpoint

If writing the local copy fails (a full staging disk), its partial files are removed. If
the upload fails (the destination unreachable past the retry policy), the complete local
files are kept, uncommitted, and the error says where. ``keep_local`` bounds how many
committed local copies stay on disk (oldest removed first).
"""

from __future__ import annotations

import os
from typing import Any

from ckptstore.dcp.writer import CkptWriter, step_from_url
from ckptstore.engine.commit import publish
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.layout import parse_step
from ckptstore.engine.manifest import MARKER_NAME, Manifest
from ckptstore.engine.paths import check_staging_dir
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, StoreNotFoundError
from ckptstore.stores.local import LocalStore

__all__ = ["StagedWriter", "local_tier_matches"]


def local_tier_matches(local: Store, remote: Store) -> bool:
    """True when ``local`` holds a committed copy whose marker equals ``remote``'s."""
    try:
        same = local.get(MARKER_NAME) == remote.get(MARKER_NAME)
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
    """A ``CkptWriter`` that stages every shard on local disk before uploading it."""

    def __init__(
        self, url: str | Store, *, staging_dir: str, keep_local: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(url, **kwargs)
        url = self.store.url  # a step's staging must not overlap its run root either
        check_staging_dir(
            url.rpartition("/")[0] if step_from_url(url) is not None else url, staging_dir
        )
        self.staging_root = LocalStore(staging_dir)
        self.keep_local = keep_local

    @property
    def local(self) -> LocalStore:
        """The local copy of the current destination: ``staging_dir/<its last path segment>``."""
        return self.staging_root.child(self.store.url.rstrip("/").rsplit("/", 1)[-1])

    # -- CkptWriter's hooks ------------------------------------------------------------
    def _shard_store(self) -> Store:
        """Shards are serialised into the local copy, ``staging_dir/<step>/``."""
        return self.local

    def _shards_failed(self, exc: BaseException) -> None:
        """Writing the local copy failed (a full staging disk): remove its partial files."""
        self.local.delete_prefix("")

    def _shards_written(self, files: list[tuple[str, int]]) -> None:
        """Upload each local shard file to the destination, checking its CRC32C; on
        failure the complete local files are kept and the error says where."""
        local = self.local
        try:
            for name, crc in files:
                self.engine.copy(local, name, self.store, name, expect_crc=crc)
        except CkptStoreError as exc:
            if isinstance(exc, StoreNotFoundError):
                self._raise_if_committed_meanwhile(exc)
            exc.args = (f"{exc}; the complete local copy is kept in {local.url}",)
            raise

    def _committed(self, manifest: Manifest, metadata_bytes: bytes) -> None:
        """Publish the same manifest and marker locally (the restore tier), then trim the
        committed local copies to ``keep_local``."""
        publish(self.local, self.engine, self.attempt, manifest, metadata_bytes, replace=True)
        self._trim_local()

    def _trim_local(self) -> None:
        steps = sorted(
            (s, n) for n in self.staging_root.listdir() if (s := parse_step(n)) is not None
        )
        for _, name in steps[: max(0, len(steps) - self.keep_local)]:
            delete_step(self.staging_root, name)
