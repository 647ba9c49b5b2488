"""The peer tier: each node's local-tier shards copied to ``replicas`` peer nodes, and a
restore that takes what its node lacks from the peers instead of the root.

After a committed save, every node's leader sends the step's files it wrote to the next
``replicas`` nodes on the ring (``tier.replicas``), over the manager's checkpoint gloo
group, in the save thread. At a restore, as the reads start (the reader's ``before_read``),
each node's leader lists the step's files it holds (checked against the committed
manifest: size and CRC32C), every rank says which files its part of the load reads, and
each file a node's ranks read and the node lacks is sent by a node that holds it (so a
sharded state moves only the shards each node loads); what no node holds is read from the
root as before (``tier.view``). A received file is kept
only when its size and CRC32C are the manifest's (``tier.peer_copy``). Every node sends
from and receives into this job's directory of its local tier alone (``tier.local_tier``:
its stamp names this root and run), so another job's copies are never sent, replaced or
evicted. A step saved to
the local tier alone has no copy in the root: its marker, manifest and ``.metadata`` go to
every node too (``seed``), so that any node can serve it at a restore.

Copies run in rounds that every rank computes alike (``tier.replicas.copy_rounds``), in
each of which a node sends at most one file and receives at most one, both at once,
chunk by chunk: chunk ``i``'s sends and receives are posted together and waited for
before chunk ``i + 1``, so every node finishes chunk ``i`` of a round and the exchange
cannot deadlock. Each end holds one ``CHUNK``; a node sends at most ``rate`` bytes/s.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ckptstore.engine.committed import (
    METADATA_NAME,
    Committed,
    committed_from_bytes,
    open_committed,
)
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Manifest
from ckptstore.engine.names import step_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.engine.verify import verify_files
from ckptstore.errors import CkptStoreError, ConfigError, StoreNotFoundError, size_text
from ckptstore.tier.peer_copy import CHUNK, Incoming, Outgoing, chunks
from ckptstore.tier.replicas import (
    Copy,
    copy_rounds,
    plan_copies,
    replica_wants,
    tier_peaks,
)
from ckptstore.tier.rules import evict_for, local_files

if TYPE_CHECKING:
    from ckptstore.tier.local_tier import LocalTier, Nodes

__all__ = ["CHUNK", "PeerTier", "PeerReport"]

log = logging.getLogger(__name__)

#: The step's own small objects: never copied (rank 0 reads them from the root).
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
    #: ``replicate``: the nodes whose tier would outgrow ``tier_limit``, with the bytes
    #: they would need (``tier.replicas.tier_peaks``); they took no replicas.
    over_limit: tuple[tuple[int, int], ...] = ()

    @property
    def complete(self) -> bool:
        """True when every copy landed and no wanted file was missing everywhere."""
        return self.refused == 0 and not any(self.missing) and not self.over_limit


class PeerTier:
    """The peer tier of one ``LocalTier`` (``tier.peers``).

    Call order (every rank, each a collective over ``nodes.group``)::

        peers = PeerTier(nodes, tier, engine, replicas, rate, limit)
                                         # LocalTier's constructor (built once, by the
                                         # manager's ``LocalTier.of``)
        small = peers.committed(root, step)  # rank 0, save thread, after a save: the
                                         # step as opened, for after_save
        peers.after_save(step, manifest, url, small)
                                         # save thread, after every save: ``replicate``
                                         # (rank 0 passes the committed step's manifest,
                                         # and for a local-only step its small objects;
                                         # the others None), reported as notes + an error
        peers.fetch(step, manifest, need)  # restore, as its reads start: each node gets
                                         # the files its ranks need and lacks, from peers

    ``replicate`` (what ``after_save`` runs) and ``fetch`` return a ``PeerReport``; with
    one node, no local tier or ``replicas == 0`` they exchange nothing (beyond the node
    map's first gathering) and return an empty one.
    """

    def __init__(
        self,
        nodes: Nodes,
        tier: LocalTier,
        engine: TransferEngine,
        replicas: int,
        rate: int | None = None,
        limit: int | None = None,
    ) -> None:
        self.nodes, self.tier, self.engine = nodes, tier, engine
        self.replicas, self.rate, self.limit = replicas, rate, limit
        self.group = nodes.group

    @property
    def active(self) -> bool:
        """True when a save is replicated: two nodes or more, and ``replicas >= 1``
        (a collective the first time: the node map)."""
        return self.replicas > 0 and self.group is not None and len(self.nodes.get().nodes) > 1

    # -- the two exchanges ----------------------------------------------------------------
    def replicate(
        self, step: int, manifest: Manifest | None, small: Committed | None = None
    ) -> PeerReport:
        """Copy every node's files of the committed ``step`` to its ring targets; rank 0
        gives the step's ``manifest`` and, for a step the root does not hold, the step
        as opened (``small``: written on every node first, ``seed``). Files a target
        already holds (size checked) are not sent again."""
        if not self.active:
            return PeerReport()
        box: list[Any] = [manifest, small]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        manifest, small = box
        if manifest is None:  # the save failed: nothing to replicate
            return PeerReport()
        if small is not None and self.nodes.get().is_leader:
            self.seed(step, small)
        holds = self._gather_holds(step, manifest)
        wants = replica_wants(holds, self.replicas)
        over: list[tuple[int, int]] = []
        if self.limit is not None:
            peaks = tier_peaks(_sizes(manifest), holds, wants)
            self._evict(step, peaks)
            over = [(node, peak) for node, peak in enumerate(peaks) if peak > self.limit]
            for node, _ in over:  # such a node takes no replicas (the error says why)
                wants[node] = set(holds[node])
        report = self._exchange(step, manifest, holds, wants)
        return dataclasses.replace(report, over_limit=tuple(over))

    def fetch(self, step: int, manifest: Manifest, need: Collection[str]) -> PeerReport:
        """Give every node the data files of ``step`` its ranks ``need`` (each rank its
        own: the files its part of the load reads) and lacks, from nodes that hold them.
        A node checks the CRC32C of the files it holds and reads itself (a damaged one is
        fetched again); the others count by size, and a damaged one a node sends is
        refused by the receiver and sent again by another holder."""
        if not self.active:
            return PeerReport()
        node_map = self.nodes.get()
        data = set(_data_files(manifest))
        needs: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(needs, sorted(set(need) & data), group=self.group)
        wants: list[set[str]] = [set() for _ in node_map.nodes]
        for node, names in zip(node_map.node_of, needs):
            if node is not None:  # a rank without a local tier reads from the root
                wants[node].update(names)
        mine = wants[node_map.node] if node_map.node is not None else set()
        return self._exchange(step, manifest, self._gather_holds(step, manifest, mine), wants)

    def after_save(
        self, step: int, manifest: Manifest | None, root_url: str, small: Committed | None = None
    ) -> tuple[list[str], ConfigError | None]:
        """``replicate``, reported: the notes for the save's record (a failure, such as a
        peer that died, is one: the step stays committed at ``root_url``, the root or the
        local tier), and the error every later save raises when a node's tier is over
        ``limit``."""
        t = time.perf_counter()
        try:
            done = self.replicate(step, manifest, small)
        except Exception as exc:  # noqa: BLE001 - the save itself is done either way
            note = (
                f"replicating step {step} to peer nodes failed ({exc}); it is committed in "
                f"{root_url}, not replicated"
            )
            log.warning("%s", note)
            return [note], None
        if done.copied and dist.get_rank(self.group) == 0:
            log.info(
                "step %d replicated to peer nodes: %d files, %s, in %.2f s",
                step, done.copied, size_text(done.bytes), time.perf_counter() - t,
            )  # fmt: skip
        if done.over_limit:
            error = self._over_limit(done.over_limit, root_url)
            log.error("%s", error)
            return [str(error)], error
        if not done.complete:
            note = f"step {step} is not fully replicated ({done.refused} copies refused)"
            log.warning("%s", note)
            return [note], None
        return [], None

    def committed(self, root: Store, step: int) -> Committed | None:
        """The committed ``step`` as opened, what rank 0 hands ``after_save``: from this
        node's tier copy when it has one (the coordinator's does; a local-only step has no
        other), else from ``root``; None if neither opens. Never raises: rank 0 hands what
        it gets to every rank's collective."""
        for where in ("tier", "root"):
            try:
                if where == "root":
                    return open_committed(root.child(step_name(step)))
                local = self.tier.step(step)
                if local is not None:
                    return open_committed(local)
            except Exception as exc:  # noqa: BLE001 - None is the answer: nothing replicated
                log.debug("step %d's manifest not read from the %s copy: %s", step, where, exc)
        return None

    def _over_limit(self, over: tuple[tuple[int, int], ...], root_url: str) -> ConfigError:
        """The error for the nodes whose local tier cannot hold a step within ``limit``."""
        keys = self.nodes.get().nodes
        worst = max(peak for _, peak in over)
        where = ", ".join(f"{keys[n][1]} on {keys[n][0]} needs {size_text(p)}" for n, p in over)
        return ConfigError(
            f"the local tier cannot hold one step within tier_limit={self.limit} bytes: "
            f"{where} (the node's state x (1 + replicas) for the step kept, plus its own "
            f"shards of the next save). Raise tier_limit to at least {worst} bytes or lower "
            f"replicas (now {self.replicas}); the step is committed in {root_url}, not "
            "replicated to those nodes"
        )

    def _evict(self, step: int, peaks: list[int]) -> None:
        """This node's leader: the oldest steps of this job's directory of its tier besides
        ``step`` deleted until the node's peak (``peaks``) fits within ``limit`` beside
        them and everything else the tier holds (other jobs' copies are counted, never
        deleted: ``tier.rules.evict_for``)."""
        node_map = self.nodes.get()
        if not node_map.is_leader or node_map.node is None or self.limit is None:
            return
        assert self.tier.spec is not None
        spec = self.tier.spec
        for name in evict_for(spec.store(), spec.job, step, peaks[node_map.node], self.limit):
            log.info(
                "evicted %s from %s: the local tier keeps step %d within tier_limit=%d",
                name, self.tier.path, step, self.limit,
            )  # fmt: skip

    def seed(self, step: int, small: Committed) -> None:
        """Write ``step``'s manifest, ``.metadata`` and then its marker (``small``, as rank
        0 opened them) into this node's directory of it, unless a marker is there: the
        bytes are checked against one another first (``committed_from_bytes``)."""
        local = self._new_dir(step)
        if local.exists(MARKER_NAME):
            return
        committed_from_bytes(
            small.marker, small.manifest_bytes, small.metadata_bytes, local.describe("")
        )
        local.put_many(
            [(MANIFEST_NAME, small.manifest_bytes), (METADATA_NAME, small.metadata_bytes)]
        )
        local.put(MARKER_NAME, small.marker.to_bytes())

    # -- the steps of an exchange ---------------------------------------------------------
    def _step_dir(self, step: int) -> Store:
        """This node's directory of ``step``, in this job's directory of the tier (its
        stamp checked): a child store, whose every read refuses (``UnsafePathError``) a
        symlink at the step directory or below it. ``StoreNotFoundError`` when this job
        has no usable directory on the node."""
        local = self.tier.step(step)
        if local is None:
            raise StoreNotFoundError(f"no directory of this job in the local tier {self.tier.path}")
        return local

    def _new_dir(self, step: int) -> Store:
        """``_step_dir``, this job's directory of the tier made (with its stamp) if absent;
        ``TierStampError`` if it is there but not provably this job's."""
        job = self.tier.open(create=True)
        assert job is not None, "the peer tier runs only with a local tier"
        return job.child(step_name(step))

    def _gather_holds(
        self, step: int, manifest: Manifest, verify: Collection[str] = ()
    ) -> list[set[str]]:
        """What each node holds of ``step`` (its leader's answer: sizes checked, and the
        CRC32C of the files in its ``verify``), on every rank."""
        node_map = self.nodes.get()
        own = self._held(step, manifest, verify) if node_map.is_leader else None
        every: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, own, group=self.group)
        return [set(every[leader] or ()) for leader in node_map.leaders]

    def _held(self, step: int, manifest: Manifest, verify: Collection[str] = ()) -> list[str]:
        """The data files of ``step`` this node holds with the size the manifest records;
        those in ``verify`` only if their CRC32C is the manifest's too."""
        try:
            local = self._step_dir(step)
            names = [n for n in local_files(local, manifest) if n not in _SMALL]
        except (OSError, CkptStoreError):
            return []
        wanted = {n: manifest.files[n] for n in names if n in verify}
        try:  # in parallel, through the engine (``engine.verify``: size and CRC32C)
            checks, _ = verify_files(local, self.engine, wanted)
            bad = {c.name for c in checks if not c.ok}
        except (OSError, CkptStoreError):
            bad = set(wanted)  # unreadable: fetched again like a damaged file
        good = []
        for name in names:
            if name not in bad:
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
        """Run the copies that give each node what it ``wants``, round by round; a copy
        the receiver refused (a damaged source) is planned again without that source,
        until no holder is left. Every rank takes part in the agreement on what landed."""
        sizes = _sizes(manifest)
        holds, wants = [set(h) for h in holds], [set(w) for w in wants]
        copied = moved = received = 0
        missing: list[set[str]] = [set() for _ in holds]
        refused: list[tuple[str, int, int]] = []
        for _ in range(len(holds)):  # each pass drops the sources that sent a bad copy
            copies, lost = plan_copies(sizes, holds, wants)
            for node, names in enumerate(lost):
                missing[node] |= names
            landed, refused_here = self._run(step, manifest, copies)
            received += landed
            gathered: list[Any] = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(gathered, refused_here, group=self.group)
            refused = [r for rs in gathered for r in rs]
            copied += len(copies) - len(refused)
            moved += sum(c.size for c in copies)
            if not refused:
                break
            for name, src, _ in refused:
                holds[src].discard(name)
            wants = [{n for n, _, d in refused if d == node} for node in range(len(holds))]
        return PeerReport(
            copied=copied,
            bytes=moved,
            refused=len(refused),
            missing=tuple(frozenset(m) for m in missing),
            received=received,
        )

    def _run(self, step: int, manifest: Manifest, copies: list[Copy]) -> tuple[int, list[Any]]:
        """This leader's part of ``copies``, round by round: the bytes it received and
        kept, and the copies it refused, as (name, source node, this node)."""
        node_map = self.nodes.get()
        me = node_map.node if node_map.is_leader else None
        received, refused = 0, []
        for round_ in copy_rounds(copies):
            send = next((c for c in round_ if c.src == me), None)
            take = next((c for c in round_ if c.dst == me), None)
            if send is not None or take is not None:
                if self._round(step, manifest, send, take, node_map.leaders):
                    assert take is not None
                    received += take.size
                elif take is not None:
                    refused.append((take.name, take.src, take.dst))
        return received, refused

    def _round(
        self,
        step: int,
        manifest: Manifest,
        send: Copy | None,
        take: Copy | None,
        leaders: list[int],
    ) -> bool:
        """This leader's part of one round: send ``send``'s file and receive ``take``'s at
        once, chunk by chunk (each chunk's send and receive posted together, then waited
        for); True if ``take``'s file was received and kept."""
        out = Outgoing(self._step_dir, step, send) if send is not None else None
        into = Incoming(self._new_dir, step, take, manifest) if take is not None else None
        count = max(chunks(send), chunks(take))
        start = time.monotonic()
        try:
            for i in range(count):
                work: list[Any] = []
                if out is not None and i < chunks(send):
                    dst = leaders[out.copy.dst]
                    work.append(dist.isend(out.chunk(i), group_dst=dst, group=self.group))
                if into is not None and i < chunks(take):
                    src = leaders[into.copy.src]
                    work.append(dist.irecv(into.buffer(i), group_src=src, group=self.group))
                for w in work:
                    if w is not None:
                        w.wait()
                if into is not None and i < chunks(take):
                    into.landed(i)
                if out is not None:
                    self._pace(start, min((i + 1) * CHUNK, out.copy.size))
        except BaseException:  # a peer died (the group fails): no temp file is left
            if into is not None:
                into.abort()
            raise
        return into.finish() if into is not None else False

    def _pace(self, start: float, sent: int) -> None:
        """Sleep so that ``sent`` bytes since ``start`` stay within ``rate``."""
        if self.rate:
            ahead = sent / self.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)


def _sizes(manifest: Manifest) -> dict[str, int]:
    """Each data file's size, as the manifest records it."""
    return {name: manifest.files[name].size for name in _data_files(manifest)}


def _data_files(manifest: Manifest) -> list[str]:
    """The step's files a peer may copy: all the manifest lists but its small objects."""
    return sorted(n for n in manifest.files if n not in _SMALL)
