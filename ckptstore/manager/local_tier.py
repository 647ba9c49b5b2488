"""Every node's local tier follows one retention decision.

The staged writer trims the local copies only on the coordinator's node; on several
nodes every other node's local tier directory would keep its ranks' shards of every step.
After each save, every rank of the manager's checkpoint group calls
:meth:`LocalTierTrimmer.after_save` (a collective, success or not, so the calls always
match): rank 0's decision (``retention.local_tier_keeps``: the newest ``keep_local`` steps
the root keeps; None when its save failed) is broadcast, and on each node the first rank
of those sharing that local tier directory (same host, same real path) deletes the step
directories the decision lets go (``retention.local_tier_deletions``).

Call order (every rank, in the manager's save thread, after each save's write)::

    trimmer = LocalTierTrimmer(local_tier_dir, group)     # the manager's constructor
    removed = trimmer.after_save(keeps)                # collective; rank 0's keeps count
    # the first call also gathers every rank's (host, local tier directory) once

Only what ckptstore made is deleted (``engine.deletion.delete_step``: canonical
``step_%09d`` directories, ckptstore's file names, marker first); symlinks and anything
else in the local tier directory are never followed or touched.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Collection
from typing import Any

import torch.distributed as dist

from ckptstore.engine.catalog import list_steps
from ckptstore.engine.deletion import delete_step
from ckptstore.manager.retention import local_tier_deletions
from ckptstore.stores.local import LocalStore

__all__ = ["KEEP_LOCAL", "LocalTierTrimmer", "trim_local_tier"]

log = logging.getLogger(__name__)

#: Committed local copies each node keeps: what ``StagedWriter`` (the manager's staged
#: saves) keeps on the coordinator's node.
KEEP_LOCAL = 1


def trim_local_tier(local_tier_dir: str, keeps: Collection[int]) -> list[str]:
    """Delete the step directories of ``local_tier_dir`` that ``keeps`` lets go; their names.

    Only canonical step directories (a symlink or a file of a step's name is skipped by
    the listing, with one warning per process) and only ckptstore's files in them; a
    missing local tier directory is empty."""
    if not os.path.isdir(local_tier_dir):
        return []
    store = LocalStore(local_tier_dir)
    steps = {e.step: e.name for e in list_steps(store, with_status=False, once=True)}
    removed = []
    for step in local_tier_deletions(steps, keeps):
        delete_step(store, steps[step])
        removed.append(steps[step])
    return removed


class LocalTierTrimmer:
    """Applies rank 0's local-tier decision on every node (see the module docstring)."""

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
        removed = trim_local_tier(self.local_tier_dir, keeps)
        for name in removed:
            log.info(
                "removed the local copy %s from %s (the local tier keeps steps %s)",
                name, self.local_tier_dir, sorted(keeps),
            )  # fmt: skip
        return removed
