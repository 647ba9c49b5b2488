"""Where the peer tier puts each node's shards, and which node sends each missing file.

Pure functions (no I/O, no process group): ``ckptstore.tier.peers`` gathers what
every node holds and runs the copies these return, the same list on every rank.

Placement is a ring: node ``i``'s shards go to the ``k`` nodes after it
(``ring_targets``), so a replica never lands on its own node and losing ``k`` adjacent
nodes loses no file; ``k + 1`` adjacent nodes lost lose exactly the shards of the first
of them. ``plan_copies`` turns "what each node wants" into copies, each from a node
that holds the file, spreading the bytes over the holders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from ckptstore.errors import ConfigError

__all__ = [
    "Copy",
    "check_replicas",
    "copy_rounds",
    "plan_copies",
    "replica_wants",
    "ring_targets",
    "tier_peaks",
]


@dataclass(frozen=True)
class Copy:
    """One file of a step sent from node ``src`` to node ``dst`` (node indexes)."""

    name: str
    size: int
    src: int
    dst: int


def check_replicas(value: object) -> int:
    """``value`` as a number of peer replicas (0: none); ConfigError if it is not one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"replicas must be a whole number >= 0 (peer nodes that hold a copy of each "
            f"node's local tier; 0 turns the peer tier off), not {value!r}"
        )
    return value


def ring_targets(node: int, nodes: int, k: int) -> list[int]:
    """The nodes that hold replicas of ``node``'s shards: the ``k`` after it on the ring of
    ``nodes`` (fewer when there are not ``k`` other nodes; never ``node`` itself)."""
    return [(node + j) % nodes for j in range(1, min(k, nodes - 1) + 1)]


def replica_wants(own: Sequence[Set[str]], k: int) -> list[set[str]]:
    """What each node should hold after a save: its ``own`` files and those of every node
    whose ring targets include it."""
    wants = [set(files) for files in own]
    for src, files in enumerate(own):
        for dst in ring_targets(src, len(own), k):
            wants[dst] |= files
    return wants


def plan_copies(
    sizes: Mapping[str, int], holds: Sequence[Set[str]], wants: Sequence[Set[str]]
) -> tuple[list[Copy], list[set[str]]]:
    """The copies that give each node what it ``wants`` and does not hold, each from a
    node that ``holds`` the file, and per node the wanted files no node holds (they come
    from the root). Among several holders the one with the fewest bytes to send so far
    is picked (ties: the nearest before the receiver on the ring), so a replaced node's
    shards are drawn from all its replicas at once. Deterministic: every rank computes the
    same plan from the same gathered facts; ordered by receiver, then name."""
    nodes = len(holds)
    load = [0] * nodes
    copies: list[Copy] = []
    missing: list[set[str]] = [set() for _ in range(nodes)]
    for dst in range(nodes):
        for name in sorted(wants[dst] - holds[dst]):
            sources = [s for s in range(nodes) if s != dst and name in holds[s]]
            if not sources:
                missing[dst].add(name)
                continue
            src = min(sources, key=lambda s: (load[s], (dst - s) % nodes))
            load[src] += sizes[name]
            copies.append(Copy(name, sizes[name], src, dst))
    return copies, missing


def copy_rounds(copies: Sequence[Copy]) -> list[list[Copy]]:
    """``copies`` in rounds where each node sends at most one file and receives at most
    one, so that a round's copies run at once (a ring's replication: one round per file a
    node sends; a replaced node's restore: one round per file it receives). Each copy goes
    to the first round with room for both of its ends, in order: deterministic."""
    rounds: list[list[Copy]] = []
    busy: list[tuple[set[int], set[int]]] = []  # per round: senders, receivers
    for copy in copies:
        free = (
            i for i, (out, into) in enumerate(busy) if copy.src not in out and copy.dst not in into
        )
        i = next(free, len(rounds))
        if i == len(rounds):
            rounds.append([])
            busy.append((set(), set()))
        rounds[i].append(copy)
        busy[i][0].add(copy.src)
        busy[i][1].add(copy.dst)
    return rounds


def tier_peaks(
    sizes: Mapping[str, int], own: Sequence[Set[str]], wants: Sequence[Set[str]]
) -> list[int]:
    """The most bytes each node's local tier holds with one step kept: the step with its
    replicas (``wants``), plus the next save's own shards (``own``), written before the
    previous step is trimmed. That is state per node x (1 + replicas) + state per node."""
    return [
        sum(sizes[n] for n in want) + sum(sizes[n] for n in mine) for want, mine in zip(wants, own)
    ]
