"""Which ranks share a node's local tier: gathered once, used by the trim and the peer tier.

A node is a distinct (host name, real path of ``local_tier_dir``) pair, so simulated
nodes on one machine (one directory each) count as nodes too; ranks without a local
tier belong to none. Nodes are numbered in the order of their lowest rank, which is the
node's *leader*: the one rank that trims, sends and receives for its node.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

__all__ = ["NodeMap", "Nodes"]


@dataclass(frozen=True)
class NodeMap:
    """Every rank's node key (``None``: no local tier) and this rank's place among them."""

    keys: tuple[tuple[str, str] | None, ...]  # per rank of the group
    rank: int

    @property
    def nodes(self) -> list[tuple[str, str]]:
        """The node keys, in the order of their lowest rank."""
        return list(dict.fromkeys(k for k in self.keys if k is not None))

    @property
    def leaders(self) -> list[int]:
        """Each node's lowest rank (group ranks), in node order."""
        return [self.keys.index(k) for k in self.nodes]

    @property
    def node(self) -> int | None:
        """This rank's node index (None: this rank has no local tier)."""
        own = self.keys[self.rank]
        return None if own is None else self.nodes.index(own)

    @property
    def is_leader(self) -> bool:
        """True on the lowest rank of this rank's node."""
        own = self.keys[self.rank]
        return own is not None and self.keys.index(own) == self.rank


class Nodes:
    """The ``NodeMap`` of ``group``, gathered at the first ``get()`` (a collective then,
    on every rank of ``group``; nothing afterwards). Shared by the save thread and the
    restore, which never use ``group`` at the same time."""

    def __init__(self, local_tier_dir: str | None, group: Any) -> None:
        self.local_tier_dir, self.group = local_tier_dir, group
        self._map: NodeMap | None = None

    def get(self) -> NodeMap:
        """The map, gathered the first time."""
        if self._map is None:
            where = os.path.realpath(self.local_tier_dir) if self.local_tier_dir else None
            key = (socket.gethostname(), where) if where is not None else None
            if self.group is None:
                self._map = NodeMap((key,), 0)
            else:
                keys: list[Any] = [None] * dist.get_world_size(self.group)
                dist.all_gather_object(keys, key, group=self.group)
                self._map = NodeMap(tuple(keys), dist.get_rank(self.group))
        return self._map
