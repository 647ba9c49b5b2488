"""A node's share of a committed step: the files its local tier holds read locally, the
rest remote.

On several nodes no node has a whole local copy (each holds its ranks' shards and its
peers' replicas; the marker only the coordinator's). :class:`NodeTier` is a read-only store
over one step that serves each data file from the local copy when it is there with the
size the remote manifest records, and everything else from the remote step; with the peer
tier, ``from_peers`` (the reader's ``before_read``) first has the node's missing files sent
by peers. The marker, manifest and ``.metadata`` are not read through it: the reader is
handed what rank 0 read of the remote step (``manager.restore``). The reader checks every
byte against that manifest's checksums, so a stale or damaged local file fails the load
(and the restore falls back to the remote step).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ckptstore.engine.committed import METADATA_NAME, Committed
from ckptstore.engine.local_tier import local_files
from ckptstore.engine.store import Buffer, Store
from ckptstore.errors import CkptStoreError, ConfigError
from ckptstore.manager.peer_tier import PeerTier

__all__ = ["NodeTier", "from_peers", "where_from"]

log = logging.getLogger("ckptstore.manager.restore")


class NodeTier(Store):
    """Reads ``local_files`` from ``local``, every other path from ``remote``."""

    def __init__(self, local: Store | None, remote: Store, local_files: Iterable[str]) -> None:
        super().__init__(remote.url)
        self.local, self.remote = local, remote
        self.local_files = frozenset(local_files) if local is not None else frozenset()
        self.bytes_local = 0
        self.bytes_remote = 0
        #: Bytes the peer tier moved between nodes for this load (``from_peers``).
        self.bytes_peers = 0

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


def from_peers(
    peers: PeerTier,
    step: int,
    committed: Committed,
    tier: NodeTier,
    remote: str,
    is_root: bool,
    paths: set[str],
) -> None:
    """The reader's ``before_read`` for ``tier`` (every rank, inside the load: a
    collective): each node gets from its peers the files of ``step`` its ranks' reads need
    (``paths``: this rank's) and lacks or holds damaged (``manager.peer_tier``), and
    ``tier`` then reads them locally. A file no node holds is read from ``remote``."""
    t = time.perf_counter()
    got = peers.fetch(step, committed.manifest, paths)
    tier.bytes_peers = got.bytes
    local_dir = peers.nodes.local_tier_dir
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
            step, got.refused, len(lost), remote, ", ".join(lost[:8]),
        )  # fmt: skip
    where_from(step, tier, committed, local_dir, remote)
