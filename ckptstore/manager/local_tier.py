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
from collections.abc import Collection

import torch.distributed as dist

from ckptstore.engine.local_tier import stamp_run, trim_local_tier
from ckptstore.engine.names import step_name
from ckptstore.manager.nodes import Nodes
from ckptstore.stores.local import LocalStore

__all__ = ["LocalTierTrimmer"]

log = logging.getLogger(__name__)


class LocalTierTrimmer:
    """Applies rank 0's local-tier decision on every node.

    Call order (every rank, in the manager's save thread, after each save's write)::

        trimmer = LocalTierTrimmer(nodes)    # the manager's constructor (``nodes.Nodes``)
        removed = trimmer.after_save(step, keeps, run)
                                             # collective, success or not; rank 0's keeps
                                             # (``engine.local_tier.local_tier_keeps``;
                                             # None: its save failed) count; the first
                                             # call may gather the node map

    On each node its leader (the lowest rank of those sharing the directory) stamps the
    step directory the save wrote with ``run`` (``engine.local_tier.stamp_run``: here, where
    a failure is the leader's alone, not before the save, where one rank's would leave the
    others in DCP's collectives) and deletes the step directories of ``run`` the decision
    lets go (``engine.local_tier.trim_local_tier``; another run's are left alone).
    """

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self.local_tier_dir = nodes.local_tier_dir
        self.group = nodes.group

    def after_save(self, step: int, keeps: Collection[int] | None, run: str) -> list[str]:
        """Broadcast rank 0's ``keeps`` (None: its save failed, nothing is trimmed); if this
        rank is its node's leader, stamp ``step``'s directory (when the save left one) and
        trim this node's local tier directory by ``keeps``; the names removed here. A
        collective over ``group``: every rank calls it after every save (after the first,
        nothing is exchanged when no rank has a local tier directory)."""
        node_map = self.nodes.get()
        if not node_map.nodes:
            return []
        if self.group is not None:
            box = [sorted(keeps) if keeps is not None else None]
            dist.broadcast_object_list(box, group_src=0, group=self.group)
            keeps = box[0]
        if not node_map.is_leader or self.local_tier_dir is None:
            return []
        if os.path.isdir(os.path.join(self.local_tier_dir, step_name(step))):
            stamp_run(LocalStore(self.local_tier_dir), step_name(step), run)
        if keeps is None or not os.path.isdir(self.local_tier_dir):
            return []
        removed = trim_local_tier(LocalStore(self.local_tier_dir), keeps, run)
        for name in removed:
            log.info(
                "removed the local copy %s from %s (the local tier keeps steps %s)",
                name, self.local_tier_dir, sorted(keeps),
            )  # fmt: skip
        return removed
