"""Every node's local tier follows one retention decision, rank 0's, after each save.

The staged writer trims the local copies only on the coordinator's node; on several
nodes every other node's local tier directory would keep its ranks' shards of every
step. ``LocalTierTrimmer`` broadcasts rank 0's decision and has one rank per node (and
local tier directory) apply it, in this job's directory of the tier alone
(``manager.tier_dir``). The rules themselves (what is kept, what a restore trusts) are
``engine.local_tier``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch.distributed as dist

from ckptstore.engine.local_tier import trim_local_tier
from ckptstore.manager.nodes import Nodes
from ckptstore.manager.tier_dir import TierDir

__all__ = ["LocalTierTrimmer"]

log = logging.getLogger(__name__)


class LocalTierTrimmer:
    """Applies rank 0's local-tier decision on every node.

    Call order (every rank, in the manager's save thread, after each save's write)::

        trimmer = LocalTierTrimmer(nodes, tier)  # the manager's constructor (``nodes.Nodes``,
                                                 # ``tier_dir.TierDir``)
        removed = trimmer.after_save(keeps)      # collective, success or not; rank 0's keeps
                                                 # (``engine.local_tier.local_tier_keeps``;
                                                 # None: its save failed) count; the first
                                                 # call may gather the node map

    On each node its leader (the lowest rank of those sharing the directory) deletes the
    step directories of this job's directory of the tier that the decision lets go
    (``engine.local_tier.trim_local_tier``), once its stamp proves it this job's (a
    directory that is not is ``TierStampError``: nothing is trimmed). Other jobs' copies
    are never looked into; the first call reports them once (``TierDir.report_others``).
    """

    def __init__(self, nodes: Nodes, tier: TierDir) -> None:
        self.nodes, self.tier = nodes, tier
        self.group = nodes.group
        self._reported = False

    def after_save(self, keeps: Collection[int] | None) -> list[str]:
        """Broadcast rank 0's ``keeps`` (None: its save failed, nothing is trimmed); if this
        rank is its node's leader, trim this job's directory of the node's local tier by
        ``keeps``; the names removed here. A collective over ``group``: every rank calls it
        after every save (after the first, nothing is exchanged when no rank has a local
        tier directory)."""
        node_map = self.nodes.get()
        if not node_map.nodes:
            return []
        if self.group is not None:
            box = [sorted(keeps) if keeps is not None else None]
            dist.broadcast_object_list(box, group_src=0, group=self.group)
            keeps = box[0]
        if not node_map.is_leader:
            return []
        if not self._reported:
            self._reported = True
            self.tier.report_others()
        job = self.tier.open()
        if keeps is None or job is None:
            return []
        removed = trim_local_tier(job, keeps)
        for name in removed:
            log.info(
                "removed the local copy %s from %s (the local tier keeps steps %s)",
                name, self.tier.path, sorted(keeps),
            )  # fmt: skip
        return removed
