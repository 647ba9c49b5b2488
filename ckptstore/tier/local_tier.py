"""``LocalTier``: one job's local tier on every node, the one object the manager passes.

Other jobs may share the node's ``local_tier_dir``. This job's copies live in a directory
of their own there (``tier.jobs``: named by a hash of the root and run, and stamped with
both), used only once its stamp has been read and found to be this job's. The manager
builds one ``LocalTier`` from its options; the save step (``spec``, rebuilt into a
``tier.tier_writer.TierWriter``), the trim (``after_save``), the replication (``peers``) and
the restore's loader (``newest_local_only``, ``whole_copy``, ``files_of``) reach the
tier through it alone; none of them ever looks at another job's directory or at the
older layout's step directories. The rules it applies (what a node keeps, what a restore
trusts) are ``tier.rules``'s.

Which ranks share a node's tier (``Nodes``, ``NodeMap``): a node is a distinct (host name,
real path of ``local_tier_dir``) pair, so simulated nodes on one machine (one directory
each) count as nodes too; ranks without a local tier belong to none. Nodes are numbered
in the order of their lowest rank, which is the node's *leader*: the one rank that trims,
sends and receives for its node.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import torch.distributed as dist

from ckptstore.engine.catalog import list_steps
from ckptstore.engine.committed import Committed, open_committed
from ckptstore.engine.names import step_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CkptStoreError, size_text
from ckptstore.tier.jobs import TierEntry, TierJob, TierSpec, check_local_tier_dir, survey
from ckptstore.tier.peers import PeerTier
from ckptstore.tier.rules import (
    LOCAL_ONLY,
    local_copy_matches,
    local_files,
    local_tier_keeps,
    save_tier,
    trim_local_tier,
)

__all__ = ["LocalTier", "NodeMap", "Nodes", "TierOptions"]

log = logging.getLogger(__name__)


class TierOptions(Protocol):
    """What ``LocalTier.of`` reads of the manager's options (``ManagerOptions``)."""

    @property
    def local_tier_dir(self) -> str | None:
        """The tier's directory on each node (None: no local tier)."""

    @property
    def keep_local(self) -> int:
        """Steps every node's tier keeps."""

    @property
    def local_every(self) -> int | None:
        """The cadence of local-only saves (None: none)."""

    @property
    def root_every(self) -> int:
        """The cadence of saves to the root."""

    @property
    def replicas(self) -> int:
        """Peer nodes each node's files are copied to."""

    @property
    def replica_rate(self) -> int | None:
        """Bytes/s a node sends at most (None: no limit)."""

    @property
    def tier_limit(self) -> int | None:
        """Bytes a node's tier may hold (None: no limit)."""


class LocalTier:
    """This job's local tier on every node (``spec``; None: no local tier, and every call
    below is a no-op that says so: None, nothing trimmed, an inactive ``peers``).

    It does not pickle (it holds the checkpoint process group and the engine): what crosses
    into the save thread or the background writer process is ``spec``, a small frozen
    ``TierSpec``, from which the save step builds its ``TierWriter`` there. Everything else
    runs in the training process.

    Call order (the manager builds it once; every call reads the stamp again)::

        tier = LocalTier.of(options, root_url, run_id, group=pg, engine=engine)
                                       # the manager's constructor: ConfigError if the
                                       # directory overlaps the root
        tier.spec                      # picklable (TierSpec): what the save step gets, in
                                       # the save thread or the writer process, and turns
                                       # into a TierWriter (``tier.tier_writer``) there
        tier.where(step)               # "root", "local" (this tier alone) or None: the
                                       # cadences ``root_every`` / ``local_every``
        job = tier.open(create=True)   # where a save writes: made with its stamp if absent;
                                       # TierStampError if it is not provably this job's
        job = tier.usable()            # where a restore or a peer reads: None if absent,
                                       # refused or unreadable (each warned about once)
        step = tier.step(n)            # ``usable()``'s directory of step n, or None
        tier.after_save(tier.keeps(kept))  # save thread, every rank, after each save: a
                                       # collective; each node's leader trims by rank 0's
                                       # decision (None: its save failed, nothing trimmed)
        tier.peers.after_save(...)     # save thread, then: the replication (``tier.peers``)
        tier.newest_local_only(step)   # the restore's loader: this rank's newest local-only
        tier.whole_copy(step, c)       # step; its tier copy of a committed step if whole;
        tier.files_of(step, c)         # else the files of it this node holds (``TierView``)
    """

    def __init__(
        self,
        spec: TierSpec | None,
        *,
        engine: TransferEngine,
        group: Any = None,
        keep_local: int = 1,
        local_every: int | None = None,
        root_every: int = 1,
        replicas: int = 0,
        replica_rate: int | None = None,
        tier_limit: int | None = None,
    ) -> None:
        self.spec = spec
        self.keep_local, self.cadences = keep_local, (local_every, root_every)
        self._warned: set[str] = set()
        self._reported = False
        #: Which ranks share a node's tier (gathered once, on ``group``): the trim and the
        #: replication both act through each node's leader.
        self.nodes = Nodes(self.path, group)
        #: The replication between nodes' tiers and a restore's copies from them.
        self.peers = PeerTier(self.nodes, self, engine, replicas, replica_rate, tier_limit)

    @classmethod
    def of(
        cls,
        options: TierOptions,
        root_url: str,
        run_id: str,
        *,
        engine: TransferEngine,
        group: Any = None,
    ) -> LocalTier:
        """The tier ``options`` describe, for the job (``root_url``, ``run_id``)."""
        check_local_tier_dir(root_url, options.local_tier_dir)
        path = options.local_tier_dir
        return cls(
            TierSpec(path, TierJob(root_url, run_id)) if path else None,
            group=group,
            engine=engine,
            keep_local=options.keep_local,
            local_every=options.local_every,
            root_every=options.root_every,
            replicas=options.replicas,
            replica_rate=options.replica_rate,
            tier_limit=options.tier_limit,
        )

    @property
    def path(self) -> str | None:
        """The tier's directory on this node (None: no local tier)."""
        return self.spec.path if self.spec else None

    @property
    def job(self) -> TierJob | None:
        """This job (root and run), whose directory of the tier is used."""
        return self.spec.job if self.spec else None

    def __str__(self) -> str:
        return f"the local tier {self.path}"

    # -- the save -------------------------------------------------------------------------
    def where(self, step: int) -> str | None:
        """Where the save of ``step`` goes (``tier.rules.save_tier``)."""
        return save_tier(step, *self.cadences)

    def keeps(self, kept: Iterable[int]) -> set[int]:
        """What every node keeps of the steps a restore could pick (``kept``)."""
        return local_tier_keeps(kept, self.keep_local)

    # -- this job's directory ---------------------------------------------------------------
    def open(self, *, create: bool = False) -> Store | None:
        """This job's directory, its stamp checked (``tier.jobs.open_job``); None
        without a local tier, or when it is absent and not ``create``d."""
        return self.spec.open(create=create) if self.spec else None

    def usable(self, *, create: bool = False) -> Store | None:
        """``open``, a refusal (``TierStampError``) or a directory that cannot be read or
        made warned about (once per message) and taken as no copies: never raises, so a
        restore's ranks stay in step and fall back to the root together."""
        try:
            return self.open(create=create)
        except (OSError, CkptStoreError) as exc:
            if str(exc) not in self._warned:
                self._warned.add(str(exc))
                log.warning("the local tier is not used: %s", exc)
            return None

    def step(self, step: int, *, create: bool = False) -> Store | None:
        """The directory of ``step`` in ``usable()``'s (not made here), or None."""
        job = self.usable(create=create)
        return None if job is None else job.child(step_name(step))

    # -- the trim ---------------------------------------------------------------------------
    def after_save(self, keeps: Collection[int] | None) -> list[str]:
        """Broadcast rank 0's ``keeps`` (None: its save failed, nothing is trimmed); if this
        rank is its node's leader, trim this job's directory of the node's tier by
        ``keeps`` (``tier.rules.trim_local_tier``; a directory that is not provably this
        job's is ``TierStampError``: nothing is trimmed); the names removed here. A
        collective over the group: every rank calls it after every save (after the first,
        nothing is exchanged when no rank has a local tier). The first call reports once
        what else the tier holds (``report_others``)."""
        node_map = self.nodes.get()
        if not node_map.nodes:
            return []
        if self.nodes.group is not None:
            box = [sorted(keeps) if keeps is not None else None]
            dist.broadcast_object_list(box, group_src=0, group=self.nodes.group)
            keeps = box[0]
        if not node_map.is_leader:
            return []
        if not self._reported:
            self._reported = True
            self.report_others()
        job = self.open()
        if keeps is None or job is None:
            return []
        removed = trim_local_tier(job, keeps)
        for name in removed:
            log.info(
                "removed the tier copy %s from %s (the local tier keeps steps %s)",
                name, self.path, sorted(keeps),
            )  # fmt: skip
        return removed

    def report_others(self) -> None:
        """Log (once per call) what else the tier holds: other jobs' directories, whose
        they are and their bytes, and step directories of the older layout. They are never
        used, trimmed or evicted by this job."""
        if self.spec is None:
            return
        try:
            entries = [e for e in survey(self.spec.store()) if e.name != self.spec.job.key]
        except (OSError, CkptStoreError) as exc:  # a report only: the save goes on
            log.debug("could not survey the local tier %s: %s", self.path, exc)
            return
        jobs = [e for e in entries if e.kind == "job"]
        legacy = [e for e in entries if e.kind == "legacy"]
        if jobs:
            log.info(
                "the local tier %s also holds %d other jobs' copies (%s): never used, "
                "trimmed or evicted by this job", self.path, len(jobs), _jobs_text(jobs),
            )  # fmt: skip
        if legacy:
            log.warning(
                "the local tier %s holds %d step directories of an older ckptstore's layout "
                "(%s, %s): nothing records their root, so no job uses or deletes them; "
                "remove them when no older job needs them (`ckptstore-tool ls --local-tier "
                "%s` shows them)",
                self.path, len(legacy), ", ".join(e.name for e in legacy[:3]),
                size_text(sum(e.bytes for e in legacy)), self.path,
            )  # fmt: skip

    # -- the restore's loader ---------------------------------------------------------------
    def newest_local_only(self, step: int | None) -> tuple[int, Committed] | None:
        """The newest local-only step of this job's directory on this rank's node
        (``step`` alone if given) that opens and whose manifest names this run; None if
        there is none, or a newer step there was saved to the root (which the root's
        listing covers)."""
        job = self.usable()
        if job is None or self.spec is None:
            return None
        try:
            entries = list_steps(job, with_status=False, once=True)
        except (OSError, CkptStoreError):
            return None
        for entry in reversed(entries):
            if step is not None and entry.step != step:
                continue
            try:
                committed = open_committed(job.child(entry.name))
            except (OSError, CkptStoreError):
                continue  # no marker here (another node's), or damaged
            if committed.manifest.extra.get("tier") != LOCAL_ONLY:
                return None
            run = committed.manifest.extra.get("run")
            if run != self.spec.job.run:  # a step directory moved in from elsewhere
                log.warning(
                    "local-only step %d in %s names run %r, not this job's (%r): not restored",
                    entry.step, job.url, run, self.spec.job.run,
                )  # fmt: skip
                continue
            return entry.step, committed
        return None

    def whole_copy(self, step: int, committed: Committed) -> Store | None:
        """This node's tier copy of ``step`` if it is identical to the committed step
        (``tier.rules.local_copy_matches``: only local files are read), else None."""
        local = self.step(step)
        if local is None:
            return None
        try:
            return local if local_copy_matches(local, committed) else None
        except (OSError, CkptStoreError):
            return None

    def files_of(
        self, step: int, committed: Committed, *, create: bool = False
    ) -> tuple[Store | None, list[str]]:
        """This node's directory of ``step`` (``create``: made, for peers' files to be
        received there) and the data files of it it holds (``tier.rules.local_files``)."""
        local = self.step(step, create=create)
        if local is None:
            return None, []
        try:
            return local, local_files(local, committed.manifest)
        except (OSError, CkptStoreError):
            return local, []


def _jobs_text(jobs: list[TierEntry]) -> str:
    """``run R of root U: 3 steps, 1.2 MB; ...`` (the first three jobs)."""
    parts = []
    for e in jobs[:3]:
        who = f"run {e.run} of root {e.root}" if e.root else f"{e.name} ({e.problem})"
        parts.append(f"{who}: {len(e.steps)} steps, {size_text(e.bytes)}")
    return "; ".join(parts) + (f"; {len(jobs) - 3} more" if len(jobs) > 3 else "")


@dataclass(frozen=True)
class NodeMap:
    """Every rank's node key (``None``: no local tier) and this rank's place among them;
    what is derived from the keys is computed once (the map never changes)."""

    keys: tuple[tuple[str, str] | None, ...]  # per rank of the group
    rank: int

    @cached_property
    def nodes(self) -> list[tuple[str, str]]:
        """The node keys, in the order of their lowest rank."""
        return list(dict.fromkeys(k for k in self.keys if k is not None))

    @cached_property
    def node_of(self) -> tuple[int | None, ...]:
        """Each rank's node index (None: that rank has no local tier)."""
        index = {key: i for i, key in enumerate(self.nodes)}
        return tuple(None if k is None else index[k] for k in self.keys)

    @cached_property
    def leaders(self) -> list[int]:
        """Each node's lowest rank (group ranks), in node order."""
        first: dict[int, int] = {}
        for rank, node in enumerate(self.node_of):
            if node is not None:
                first.setdefault(node, rank)
        return [first[node] for node in range(len(self.nodes))]

    @property
    def node(self) -> int | None:
        """This rank's node index (None: this rank has no local tier)."""
        return self.node_of[self.rank]

    @property
    def is_leader(self) -> bool:
        """True on the lowest rank of this rank's node."""
        return self.node is not None and self.leaders[self.node] == self.rank


class Nodes:
    """The ``NodeMap`` of ``group`` (``path``: this rank's tier directory; None: none),
    gathered at the first ``get()`` (a collective then, on every rank of ``group``; nothing
    afterwards). Shared by the save thread and the restore, which never use ``group`` at
    the same time."""

    def __init__(self, path: str | None, group: Any) -> None:
        self.path, self.group = path, group
        self._map: NodeMap | None = None

    def get(self) -> NodeMap:
        """The map, gathered the first time."""
        if self._map is None:
            where = os.path.realpath(self.path) if self.path else None
            key = (socket.gethostname(), where) if where is not None else None
            if self.group is None:
                self._map = NodeMap((key,), 0)
            else:
                keys: list[Any] = [None] * dist.get_world_size(self.group)
                dist.all_gather_object(keys, key, group=self.group)
                self._map = NodeMap(tuple(keys), dist.get_rank(self.group))
        return self._map
