"""The peer tier: each node's local-tier shards copied to ``replicas`` peer nodes, and a
restore that takes what its node lacks from the peers instead of the bucket.

After a committed save, every node's leader sends the step's files it wrote to the next
``replicas`` nodes on the ring (``engine.replicas``), over the manager's checkpoint gloo
group, in the save thread. At a restore, each node's leader lists the step's files it
holds (checked against the committed manifest: size and CRC32C), every rank learns what
every node holds, and each file a node lacks is sent by a node that holds it; what no node
holds is read from the bucket as before (``manager.node_tier``). A received file is kept
only when its size and CRC32C are those the step's manifest records: it is written to a
temp file of the step directory and renamed into place, so a copy cut short by a dead
peer, or a corrupt source, never looks like a replica (the temp file is the local store's
own, which ``ckptstore-tool gc`` sweeps).

Copies run one at a time in one order that every rank computes alike, with blocking
sends and receives: the earliest unfinished copy always has both of its ends waiting for
it, so the exchange cannot deadlock. A copy is sent in chunks of ``CHUNK`` bytes (the
memory a copy holds, per end), at most ``rate`` bytes/s if one is set.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ckptstore.engine.checksum import crc32c
from ckptstore.engine.committed import METADATA_NAME
from ckptstore.engine.local_tier import local_files
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Manifest
from ckptstore.engine.names import step_name
from ckptstore.engine.replicas import Copy, plan_copies, replica_wants
from ckptstore.errors import CkptStoreError, UnsafePathError
from ckptstore.manager.nodes import Nodes
from ckptstore.stores.local import LocalStore

__all__ = ["CHUNK", "PeerTier", "PeerReport"]

log = logging.getLogger(__name__)

#: Bytes per message of a copy.
CHUNK = 16 << 20
#: The step's own small objects: never copied (rank 0 reads them from the bucket).
_SMALL = frozenset({MARKER_NAME, MANIFEST_NAME, METADATA_NAME})


@dataclass(frozen=True)
class PeerReport:
    """What one exchange did: files and bytes copied between nodes, copies refused by
    the receiver's check, and per node the files no node held (the same on every rank);
    the bytes this rank received and kept (``received``)."""

    copied: int = 0
    bytes: int = 0
    refused: int = 0
    missing: tuple[frozenset[str], ...] = ()
    received: int = 0

    @property
    def complete(self) -> bool:
        """True when every copy landed and no wanted file was missing everywhere."""
        return self.refused == 0 and not any(self.missing)


class PeerTier:
    """The peer tier of one manager.

    Call order (every rank, each a collective over ``nodes.group``)::

        peers = PeerTier(nodes, replicas, rate)  # the manager's constructor
        peers.replicate(step, manifest)  # save thread, after the step's commit (rank 0
                                         # passes its manifest, the others None)
        peers.fetch(step, manifest)      # restore, before reading the step: each node gets
                                         # the files it lacks from the peers that hold them

    Both return a ``PeerReport``; with one node, no local tier or ``replicas == 0`` they
    exchange nothing (beyond the node map's first gathering) and return an empty one.
    """

    def __init__(self, nodes: Nodes, replicas: int, rate: int | None = None) -> None:
        self.nodes, self.replicas, self.rate = nodes, replicas, rate
        self.group = nodes.group

    @property
    def active(self) -> bool:
        """True when a save is replicated: two nodes or more, and ``replicas >= 1``
        (a collective the first time: the node map)."""
        return self.replicas > 0 and self.group is not None and len(self.nodes.get().nodes) > 1

    # -- the two exchanges ----------------------------------------------------------------
    def replicate(self, step: int, manifest: Manifest | None) -> PeerReport:
        """Copy every node's files of the committed ``step`` to its ring targets; rank 0
        gives the step's ``manifest``. Files a target already holds (size checked) are
        not sent again."""
        if not self.active:
            return PeerReport()
        box = [manifest]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        manifest = box[0]
        assert manifest is not None
        holds = self._gather_holds(step, manifest, verify=False)
        return self._exchange(step, manifest, holds, replica_wants(holds, self.replicas))

    def fetch(self, step: int, manifest: Manifest) -> PeerReport:
        """Give every node every data file of ``step`` that some node holds (checked
        against ``manifest``: a damaged or truncated copy does not count)."""
        if not self.active:
            return PeerReport()
        holds = self._gather_holds(step, manifest, verify=True)
        wanted = set(_data_files(manifest))
        return self._exchange(step, manifest, holds, [wanted] * len(holds))

    # -- the steps of an exchange ---------------------------------------------------------
    def _step_dir(self, step: int) -> LocalStore:
        """This node's directory of ``step``; ``UnsafePathError`` if it is a symlink (the
        peer tier never reads or writes through one)."""
        assert self.nodes.local_tier_dir is not None
        local = LocalStore(self.nodes.local_tier_dir).child(step_name(step))
        if os.path.islink(local.url.rstrip("/")):
            raise UnsafePathError(f"{local.url} is a symlink; the peer tier does not follow it")
        return local

    def _gather_holds(self, step: int, manifest: Manifest, *, verify: bool) -> list[set[str]]:
        """What each node holds of ``step`` (its leader's answer; sizes checked, and the
        CRC32C too with ``verify``), on every rank."""
        node_map = self.nodes.get()
        own: list[str] | None = None
        if node_map.is_leader:
            own = self._held(step, manifest, verify)
        every: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, own, group=self.group)
        return [set(every[leader] or ()) for leader in node_map.leaders]

    def _held(self, step: int, manifest: Manifest, verify: bool) -> list[str]:
        """The data files of ``step`` this node holds as the manifest records them."""
        try:
            local = self._step_dir(step)
            names = [n for n in local_files(local, manifest) if n not in _SMALL]
        except (OSError, CkptStoreError):
            return []
        if not verify:
            return names
        good = []
        for name in names:
            entry = manifest.files[name]
            try:
                ok = _file_crc(local, name, entry.size) == entry.crc32c
            except (OSError, CkptStoreError):
                ok = False
            if ok:
                good.append(name)
            else:
                log.warning(
                    "%s does not match step %d's manifest; it is not used, and is "
                    "replaced by a peer's copy if one has it", local.describe(name), step,
                )  # fmt: skip
        return good

    def _exchange(
        self, step: int, manifest: Manifest, holds: list[set[str]], wants: list[set[str]]
    ) -> PeerReport:
        """Run the copies that give each node what it ``wants``; every rank takes part in
        the agreement on what landed."""
        sizes = {name: manifest.files[name].size for name in _data_files(manifest)}
        copies, missing = plan_copies(sizes, holds, wants)
        node_map = self.nodes.get()
        leaders = node_map.leaders
        me = node_map.node if node_map.is_leader else None
        refused = received = 0
        for copy in copies:
            if me == copy.src:
                self._send(step, copy, leaders[copy.dst])
            elif me == copy.dst:
                if self._receive(step, copy, leaders[copy.src], manifest):
                    received += copy.size
                else:
                    refused += 1
        total = torch.tensor([refused], dtype=torch.int64)
        dist.all_reduce(total, group=self.group)
        return PeerReport(
            copied=len(copies) - int(total.item()),
            bytes=sum(c.size for c in copies),
            refused=int(total.item()),
            missing=tuple(frozenset(m) for m in missing),
            received=received,
        )

    def _send(self, step: int, copy: Copy, dst: int) -> None:
        """Send ``copy``'s file to group rank ``dst``: exactly ``copy.size`` bytes, zeros
        past what can be read (the receiver's checksum then refuses it)."""
        buf = bytearray(min(CHUNK, copy.size) or 1)
        start = time.monotonic()
        for offset in range(0, copy.size, CHUNK):
            view = memoryview(buf)[: min(CHUNK, copy.size - offset)]
            try:
                got = self._step_dir(step).get_into(copy.name, offset, view)
            except (OSError, CkptStoreError) as exc:
                log.warning("could not read %s to send it to a peer: %s", copy.name, exc)
                got = 0
            view[got:] = bytes(len(view) - got)
            dist.send(torch.frombuffer(view, dtype=torch.uint8), group_dst=dst, group=self.group)
            self._pace(start, offset + len(view))

    def _receive(self, step: int, copy: Copy, src: int, manifest: Manifest) -> bool:
        """Receive ``copy``'s file from group rank ``src`` into a temp file of the step
        directory; keep it (renamed into place) only if its size and CRC32C are the
        manifest's. Every chunk is received whatever happens, so the exchange stays in
        step with the sender."""
        assert self.nodes.local_tier_dir is not None
        local = LocalStore(self.nodes.local_tier_dir).child(step_name(step))
        upload = None
        try:
            local = self._step_dir(step)
            os.makedirs(local.url, exist_ok=True)
            upload = local.begin_multipart(copy.name)
        except (OSError, CkptStoreError) as exc:
            log.warning("cannot write a peer's copy of %s: %s", local.describe(copy.name), exc)
        crc, parts = 0, []
        buf = torch.empty(min(CHUNK, copy.size) or 1, dtype=torch.uint8)
        try:
            for number, offset in enumerate(range(0, copy.size, CHUNK), start=1):
                chunk = buf[: min(CHUNK, copy.size - offset)]
                dist.recv(chunk, group_src=src, group=self.group)
                data = memoryview(chunk.numpy())  # type: ignore[arg-type]
                crc = crc32c(data, crc)
                if upload is not None:
                    try:
                        parts.append(local.put_part(upload, number, offset, data))
                    except (OSError, CkptStoreError) as exc:
                        log.warning("cannot write %s: %s", local.describe(copy.name), exc)
                        local.abort_multipart(upload)
                        upload = None
        except BaseException:  # the sender died (the group fails): no temp file is left
            if upload is not None:
                local.abort_multipart(upload)
            raise
        if upload is None:
            return False
        if crc != manifest.files[copy.name].crc32c:
            log.warning(
                "the copy of %s a peer sent does not match step %d's manifest; not kept",
                local.describe(copy.name), step,
            )  # fmt: skip
            local.abort_multipart(upload)
            return False
        try:
            local.complete_multipart(upload, parts)
        except (OSError, CkptStoreError) as exc:
            log.warning("cannot keep a peer's copy of %s: %s", local.describe(copy.name), exc)
            local.abort_multipart(upload)
            return False
        return True

    def _pace(self, start: float, sent: int) -> None:
        """Sleep so that ``sent`` bytes since ``start`` stay within ``rate``."""
        if self.rate:
            ahead = sent / self.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)


def _data_files(manifest: Manifest) -> list[str]:
    """The step's files a peer may copy: all the manifest lists but its small objects."""
    return sorted(n for n in manifest.files if n not in _SMALL)


def _file_crc(local: LocalStore, name: str, size: int) -> int:
    """The CRC32C of ``name``'s first ``size`` bytes, read in chunks."""
    crc, buf = 0, bytearray(min(CHUNK, size) or 1)
    for offset in range(0, size, CHUNK):
        view = memoryview(buf)[: min(CHUNK, size - offset)]
        if local.get_into(name, offset, view) != len(view):
            raise OSError(f"{local.describe(name)} is shorter than {size} bytes")
        crc = crc32c(view, crc)
    return crc
