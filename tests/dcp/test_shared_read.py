"""``dcp.shared_read``'s pipeline on 2 real gloo ranks: the owners read batch i+1 while
batch i is exchanged and delivered, at most two batches (2 x ``budget`` bytes) are held, every
range arrives once, whole and in the load's order, and a failed read raises on every rank
without leaving a read running.

The ranges' bytes come from a function of the key (the read path over a real store is
tested in tests/manager/test_read_once.py); what is tested here is the order and the
bound of the exchange, which no store can show.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ckptstore.dcp.shared_read import read_shared
from ckptstore.errors import CorruptCheckpointError
from harness.dist import run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

SIZE = 1000
BUDGET = SIZE  # one range a batch
KEYS = [("f", i * SIZE, SIZE) for i in range(6)]


def content(key: tuple[str, int, int]) -> bytes:
    return bytes((key[1] // SIZE * 7 + j) % 251 for j in range(key[2]))


def _run(rank: int, world: int, fail_at: int | None) -> Any:
    import torch.distributed as dist

    started = {k: threading.Event() for k in KEYS}
    owned: list[int] = []
    held: list[int] = []  # batches read by this rank and not yet delivered, at each read
    overlapped: list[bool] = []
    delivered: list[tuple[tuple[str, int, int], bool]] = []
    unfinished: set[int] = set()

    def read_into(keys: list[tuple[str, int, int]], buf: memoryview) -> None:
        for key in keys:
            index = key[1] // SIZE
            owned.append(index)
            unfinished.add(index)
            held.append(len(unfinished))
            started[key].set()
            if index == fail_at:
                raise CorruptCheckpointError(f"range {index}: checksum mismatch")
        buf[:] = b"".join(content(k) for k in keys)

    def deliver(key: tuple[str, int, int], data: Any) -> None:
        index = key[1] // SIZE
        nxt = KEYS[index + 1] if index + 1 < len(KEYS) else None
        if nxt is not None and (index + 1) in _owners(rank):
            # the next batch this rank owns is being read while this one is delivered
            overlapped.append(started[nxt].wait(10))
        delivered.append((key, bytes(data) == content(key)))
        unfinished.discard(index)

    try:
        got = read_shared(dist.group.WORLD, KEYS, BUDGET, read_into, deliver)
    except CorruptCheckpointError as exc:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("ckptstore-share")]
        return "raised", str(exc), alive
    return sorted(got), owned, held, overlapped, delivered


def _owners(rank: int) -> set[int]:
    """The batches (one range each) ``rank`` owns: the plan spreads them evenly."""
    from ckptstore.engine.read_owners import plan_shares

    plan = plan_shares([KEYS, KEYS], SIZE)
    return {k[1] // SIZE for k, r in plan.owners.items() if r == rank}


def test_the_next_batch_is_read_while_one_is_delivered_and_two_at_most_are_held() -> None:
    results = run_distributed(_run, 2, None, timeout=120)
    assert _owners(0) | _owners(1) == set(range(6)) and len(_owners(0)) == 3
    for rank, (got, owned, held, overlapped, delivered) in enumerate(results):
        assert got == KEYS
        assert sorted(owned) == sorted(_owners(rank))  # each range read by its owner only
        assert delivered == [(k, True) for k in KEYS]  # once, whole, in the load's order
        assert overlapped and all(overlapped), overlapped
        assert max(held) <= 2  # the batch delivered and the one read: 2 x budget bytes


def test_a_failed_read_raises_on_every_rank_and_leaves_no_read_running() -> None:
    fail_at = min(_owners(1) - {0})
    results = run_distributed(_run, 2, fail_at, timeout=120)
    assert results[1] == ("raised", f"range {fail_at}: checksum mismatch", [])
    assert results[0][0] == "raised" and "rank 1 could not read" in results[0][1]
    assert results[0][2] == []
