"""The staged-local writer: shards go to local NVMe first, then the engine uploads them.

Call order is ``CkptWriter``'s; what differs:

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

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptstore.dcp.writer import CkptWriter, step_from_url
from ckptstore.engine.catalog import parse_step
from ckptstore.engine.commit import publish
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.manifest import MARKER_NAME
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
        return self.staging_root.child(self.store.url.rstrip("/").rsplit("/", 1)[-1])

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        local = self.local
        results: list[WriteResult] = []
        files = []
        try:
            for name, items in self.shard_names(plan):
                file_results = self._write_file(name, items, planner, store=local)
                files.append((name, file_results[0].storage_data.file_crc32c))
                results.extend(file_results)
        except BaseException:
            local.delete_prefix("")
            raise
        try:
            for name, crc in files:
                self.engine.copy(local, name, self.store, name, expect_crc=crc)
        except CkptStoreError as exc:
            if isinstance(exc, StoreNotFoundError):
                self._raise_if_committed_meanwhile(exc)
            exc.args = (f"{exc}; the complete local copy is kept in {local.url}",)
            raise
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        manifest, metadata_bytes = self._build_manifest(metadata, results)
        publish(
            self.store, self.engine, self.attempt, manifest, metadata_bytes, replace=self.overwrite
        )
        publish(self.local, self.engine, self.attempt, manifest, metadata_bytes, replace=True)
        self._trim_local()

    def _trim_local(self) -> None:
        steps = sorted(
            (s, n) for n in self.staging_root.listdir() if (s := parse_step(n)) is not None
        )
        for _, name in steps[: max(0, len(steps) - self.keep_local)]:
            delete_step(self.staging_root, name)
