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
from functools import cached_property
from typing import Any

import torch.distributed as dist

__all__ = ["NodeMap", "Nodes"]


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
