"""A node's share of a committed step: its own staged shards read locally, the rest remote.

On several nodes each node's local tier directory holds only the shards its ranks wrote, and
the commit marker only on the coordinator's node, so no node has a whole local copy.
:class:`NodeTier` is a read-only store over one step that serves each data file from the
local copy when it is there with the size the remote manifest records, and everything else
(other ranks' shards) from the remote step. The marker, manifest and ``.metadata`` are not
read through it at all: the reader is handed what rank 0 read of the remote step
(``ckptstore.manager.restore``). The reader checks every byte against that manifest's
checksums, so a stale or damaged local file fails the load (and the restore falls back to
the remote step); nothing is written.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ckptstore.engine.committed import METADATA_NAME, Committed
from ckptstore.engine.store import Buffer, Store
from ckptstore.errors import ConfigError
from ckptstore.stores.local import LocalStore

__all__ = ["NodeTier", "where_from"]

log = logging.getLogger("ckptstore.manager.restore")


class NodeTier(Store):
    """Reads ``local_files`` from ``local``, every other path from ``remote``."""

    def __init__(self, local: LocalStore | None, remote: Store, local_files: Iterable[str]) -> None:
        super().__init__(remote.url)
        self.local, self.remote = local, remote
        self.local_files = frozenset(local_files) if local is not None else frozenset()
        self.bytes_local = 0
        self.bytes_remote = 0

    def hold(self, local_files: Iterable[str]) -> None:
        """Serve ``local_files`` locally from now on (files a peer just sent)."""
        if self.local is not None:
            self.local_files = frozenset(local_files)

    def _pick(self, path: str) -> Store:
        if self.local is not None and path in self.local_files:
            return self.local
        return self.remote

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """``Store.get`` from the tier that serves ``path``, counting the bytes."""
        data = self._pick(path).get(path, start, end)
        if path in self.local_files:
            self.bytes_local += len(data)
        else:
            self.bytes_remote += len(data)
        return data

    def size(self, path: str) -> int:
        """``Store.size`` from the tier that serves ``path``."""
        return self._pick(path).size(path)

    def find(self, prefix: str = "") -> list[str]:
        """The remote step's listing (the local copy holds a subset of it)."""
        return self.remote.find(prefix)

    def put(self, path: str, data: Buffer) -> None:
        """Refused: a restore only reads."""
        raise ConfigError(f"{self.describe(path)}: a restore's node tier is read-only")

    def delete(self, path: str) -> None:
        """Refused: a restore only reads."""
        raise ConfigError(f"{self.describe(path)}: a restore's node tier is read-only")


def where_from(
    step: int, tier: NodeTier, committed: Committed, local_dir: str | None, remote: str
) -> None:
    """Log (INFO, the restore's logger) where ``tier`` reads ``step`` from: all of its data
    files locally, some, or none."""
    data = set(committed.manifest.files) - {METADATA_NAME}  # .metadata: rank 0's bytes
    if tier.local_files >= data:
        log.info(
            "restoring step %d from the local copy in %s (all %d of its data files)",
            step, local_dir, len(data),
        )  # fmt: skip
    elif tier.local_files:
        log.info(
            "restoring step %d from the local copy in %s (%d of its %d data files; the rest "
            "from %s)", step, local_dir, len(tier.local_files & data), len(data), remote,
        )  # fmt: skip
    else:  # another node has files of it; this one reads all remotely
        log.info(
            "restoring step %d from the remote copy in %s (none of its files in %s)",
            step, remote, local_dir,
        )  # fmt: skip
