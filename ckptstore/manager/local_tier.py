"""Every node's local tier follows one retention decision, rank 0's, after each save.

The staged writer trims the local copies only on the coordinator's node; on several
nodes every other node's local tier directory would keep its ranks' shards of every
step. ``LocalTierTrimmer`` broadcasts rank 0's decision and has one rank per node (and
local tier directory) apply it. The rules themselves (what is kept, what a restore
trusts) are ``engine.local_tier``'s.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Collection
from typing import Any

import torch.distributed as dist

from ckptstore.engine.local_tier import trim_local_tier
from ckptstore.stores.local import LocalStore

__all__ = ["KEEP_LOCAL", "LocalTierTrimmer"]

log = logging.getLogger(__name__)

#: Committed local copies each node keeps: what ``StagedWriter`` (the manager's staged
#: saves) keeps on the coordinator's node.
KEEP_LOCAL = 1


class LocalTierTrimmer:
    """Applies rank 0's local-tier decision on every node.

    Call order (every rank, in the manager's save thread, after each save's write)::

        trimmer = LocalTierTrimmer(local_tier_dir, group)  # the manager's constructor
        removed = trimmer.after_save(keeps)  # collective, success or not; rank 0's keeps
                                             # (``engine.local_tier.local_tier_keeps``;
                                             # None: its save failed) count; the first
                                             # call gathers every rank's (host, real path)

    On each node the lowest rank of those sharing the directory deletes the step
    directories the decision lets go (``engine.local_tier.trim_local_tier``).
    """

    def __init__(self, local_tier_dir: str | None, group: Any) -> None:
        self.local_tier_dir = local_tier_dir
        self.group = group
        #: Known after the first call: is this rank its node's first, does any rank stage.
        self._first: bool | None = None
        self._any_staging = True

    def _gather(self) -> bool:
        """True on the lowest rank of those sharing this host and local tier directory; learns
        whether any rank has a local tier directory at all (a collective, the first time only)."""
        if self._first is None:
            where = os.path.realpath(self.local_tier_dir) if self.local_tier_dir else None
            key = (socket.gethostname(), where)
            keys: list[Any] = [key]
            if self.group is not None:
                keys = [None] * dist.get_world_size(self.group)
                dist.all_gather_object(keys, key, group=self.group)
            self._any_staging = any(k[1] is not None for k in keys)
            rank = dist.get_rank(self.group) if self.group is not None else 0
            self._first = where is not None and keys.index(key) == rank
        return self._first

    def after_save(self, keeps: Collection[int] | None) -> list[str]:
        """Broadcast rank 0's ``keeps`` (None: its save failed, nothing is trimmed) and
        trim this node's local tier directory by it if this rank is the node's first; the names
        removed here. A collective over ``group``: every rank calls it after every save
        (after the first, nothing is exchanged when no rank has a local tier directory)."""
        first = self._gather()
        if not self._any_staging:
            return []
        if self.group is not None:
            box = [sorted(keeps) if keeps is not None else None]
            dist.broadcast_object_list(box, group_src=0, group=self.group)
            keeps = box[0]
        if keeps is None or not first or self.local_tier_dir is None:
            return []
        if not os.path.isdir(self.local_tier_dir):
            return []
        removed = trim_local_tier(LocalStore(self.local_tier_dir), keeps)
        for name in removed:
            log.info(
                "removed the local copy %s from %s (the local tier keeps steps %s)",
                name, self.local_tier_dir, sorted(keeps),
            )  # fmt: skip
        return removed
