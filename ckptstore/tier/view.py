"""A node's share of a committed step: the files its local tier holds read from the tier
copy, the rest from the root.

On several nodes no node has a whole tier copy (each holds its ranks' shards and its
peers' replicas; the marker only the coordinator's). :class:`TierView` is a read-only
store over one step that serves each data file from the tier copy when it is there with
the size the root's manifest records, and everything else from the root's step; with the
peer tier, ``from_peers`` (the reader's ``before_read``) first has the node's missing files
sent by peers. The marker, manifest and ``.metadata`` are not read through it: the reader
is handed what rank 0 read of the root's step (``manager.restore``). The reader checks
every byte against that manifest's checksums, so a stale or damaged tier file fails the
load (and the restore falls back to the root's step).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ckptstore.engine.committed import METADATA_NAME, Committed
from ckptstore.engine.store import Buffer, Store
from ckptstore.errors import CkptStoreError, ConfigError
from ckptstore.tier.peers import PeerTier
from ckptstore.tier.rules import local_files

__all__ = ["TierView", "from_peers", "where_from"]

log = logging.getLogger("ckptstore.manager.restore")


class TierView(Store):
    """Reads ``local_files`` from ``local`` (the tier copy), every other path from ``root``
    (the root's step, or for a local-only step the tier copy itself)."""

    def __init__(self, local: Store | None, root: Store, local_files: Iterable[str]) -> None:
        super().__init__(root.url)
        self.local, self.root = local, root
        self.local_files = frozenset(local_files) if local is not None else frozenset()
        self.bytes_local = 0
        self.bytes_root = 0
        #: Bytes the peer tier moved between nodes for this load (``from_peers``).
        self.bytes_peers = 0

    def hold(self, local_files: Iterable[str]) -> None:
        """Serve ``local_files`` locally from now on (files a peer just sent)."""
        if self.local is not None:
            self.local_files = frozenset(local_files)

    def _pick(self, path: str) -> Store:
        if self.local is not None and path in self.local_files:
            return self.local
        return self.root

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """``Store.get`` from the tier that serves ``path``, counting the bytes."""
        data = self._pick(path).get(path, start, end)
        if path in self.local_files:
            self.bytes_local += len(data)
        else:
            self.bytes_root += len(data)
        return data

    def size(self, path: str) -> int:
        """``Store.size`` from the tier that serves ``path``."""
        return self._pick(path).size(path)

    def find(self, prefix: str = "") -> list[str]:
        """The root step's listing (the tier copy holds a subset of it)."""
        return self.root.find(prefix)

    def put(self, path: str, data: Buffer) -> None:
        """Refused: a restore only reads."""
        raise ConfigError(f"{self.describe(path)}: a restore's tier view is read-only")

    def delete(self, path: str) -> None:
        """Refused: a restore only reads."""
        raise ConfigError(f"{self.describe(path)}: a restore's tier view is read-only")


def where_from(
    step: int, tier: TierView, committed: Committed, local_dir: str | None, root: str
) -> None:
    """Log (INFO, the restore's logger) where ``tier`` reads ``step`` from: all of its data
    files from the tier copy, some, or none."""
    data = set(committed.manifest.files) - {METADATA_NAME}  # .metadata: rank 0's bytes
    if tier.local_files >= data:
        log.info(
            "restoring step %d from the tier copy in %s (all %d of its data files)",
            step, local_dir, len(data),
        )  # fmt: skip
    elif tier.local_files:
        log.info(
            "restoring step %d from the tier copy in %s (%d of its %d data files; the rest "
            "from the root %s)", step, local_dir, len(tier.local_files & data), len(data), root,
        )  # fmt: skip
    else:  # another node has files of it; this one reads all from the root
        log.info(
            "restoring step %d from the root %s (none of its files in %s)",
            step, root, local_dir,
        )  # fmt: skip


def from_peers(
    peers: PeerTier,
    step: int,
    committed: Committed,
    tier: TierView,
    root: str,
    is_root: bool,
    paths: set[str],
) -> None:
    """The reader's ``before_read`` for ``tier`` (every rank, inside the load: a
    collective): each node gets from its peers the files of ``step`` its ranks' reads need
    (``paths``: this rank's) and lacks or holds damaged (``tier.peers``), and
    ``tier`` then reads them from the tier copy. A file no node holds is read from
    ``root``."""
    t = time.perf_counter()
    got = peers.fetch(step, committed.manifest, paths)
    tier.bytes_peers = got.bytes
    local_dir = peers.tier.path
    if tier.local is not None:
        try:
            tier.hold(local_files(tier.local, committed.manifest))
        except (OSError, CkptStoreError):
            pass  # what it held before stays (the reads check every byte)
    if got.received:
        log.info(
            "step %d: %d bytes copied from peer nodes into %s in %.2f s",
            step, got.received, local_dir, time.perf_counter() - t,
        )  # fmt: skip
    if is_root and (got.refused or any(got.missing)):
        lost = sorted(set().union(*got.missing))
        log.info(
            "step %d: %d copies from peer nodes not kept (see the warnings); %d files held "
            "by no node are read from %s: %s",
            step, got.refused, len(lost), root, ", ".join(lost[:8]),
        )  # fmt: skip
    where_from(step, tier, committed, local_dir, root)
