"""``dcp.shared_read``'s pipeline on 2 real gloo ranks: the owners read batch i+1 while
batch i is exchanged and delivered, at most two batches (2 x ``budget`` bytes) are held, every
range arrives once, whole and in the load's order, and a failed read raises on every rank
without leaving a read running.

The ranges' bytes come from a function of the key (the read path over a real store is
tested in tests/manager/test_read_once.py); what is tested here is the order and the
bound of the exchange, which no store can show.

Within a node the parts move through ``/dev/shm`` segments (``dcp.node_segments``): on 3
ranks of this host no data crosses gloo, and every segment is gone after a load, a failed
one, and (swept by the next load) one whose owner was SIGKILLed. Two simulated nodes of 2
ranks each (the node key replaced inside the ranks) send each shared byte across once.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from ckptstore.dcp import node_segments
from ckptstore.dcp.shared_read import read_shared
from ckptstore.errors import CkptStoreError, CorruptCheckpointError
from harness.dist import run_distributed
from tests.adversarial.test_fifo import _within

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

    def read_into(keys: list[tuple[str, int, int]], buf: memoryview, first: bool) -> None:
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


# -- through shared memory within a node ------------------------------------------------------
def _node_run(rank: int, world: int, nodes: int, fail: str | None) -> Any:
    """A load of every range on every rank, counting the data bytes each gloo call moves
    (``nodes``: simulated nodes of ``world // nodes`` ranks; 0: the real node key).
    ``fail``: "read" (rank 1's reads fail) or "kill" (rank 1 SIGKILLs itself at a read)."""
    import torch.distributed as dist

    if nodes:  # the test seam: which ranks share /dev/shm
        node_segments.node_key = lambda: ("simulated", rank * nodes // world)
    moved = {"broadcast": 0, "isend": 0, "recv": 0}

    def counting(name: str) -> Any:
        real = getattr(dist, name)

        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            moved[name] += tensor.numel() * tensor.element_size()
            return real(tensor, *args, **kwargs)

        return call

    for name in moved:
        setattr(dist, name, counting(name))
    mapped: list[str] = []
    open_view = node_segments.open_view

    def opening(path: str, n: int) -> Any:
        mapped.append(path)
        return open_view(path, n)

    node_segments.open_view = opening

    def read_into(keys: list[tuple[str, int, int]], buf: memoryview, first: bool) -> None:
        if rank == 1 and fail == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 1 and fail == "read":
            raise CorruptCheckpointError("checksum mismatch")
        buf[:] = b"".join(content(k) for k in keys)

    delivered: list[bool] = []
    try:
        read_shared(
            dist.group.WORLD,
            KEYS,
            BUDGET,
            read_into,
            lambda key, data: delivered.append(bytes(data) == content(key)),
        )
    except Exception as exc:  # noqa: BLE001 - what the test asserts
        return "raised", type(exc).__name__, node_segments.creator()
    return moved, len(mapped), delivered, node_segments.creator()


def _segments() -> set[str]:
    return {
        e.path for e in os.scandir(node_segments.SHM_DIR) if e.name.startswith("ckptstore-share-")
    }


def _left_by(creators: list[str]) -> set[str]:
    return {p for p in _segments() if any(f"-{c}-" in p for c in creators)}


def test_one_node_moves_no_data_over_gloo_and_leaves_no_segment() -> None:
    results = run_distributed(_node_run, 3, 0, None, timeout=120)
    owners = list(_plan_owners(3).values())
    for rank, (moved, mapped, delivered, _) in enumerate(results):
        assert moved == {"broadcast": 0, "isend": 0, "recv": 0}
        assert delivered == [True] * len(KEYS)
        assert mapped == len(KEYS) - owners.count(rank)  # the owner's segment, mapped
    assert _left_by([r[3] for r in results]) == set()


def test_two_nodes_send_each_shared_byte_across_once() -> None:
    results = run_distributed(_node_run, 4, 2, None, timeout=120)
    total = sum(k[2] for k in KEYS)
    assert sum(r[0]["isend"] for r in results) == total  # one other node: once
    assert sum(r[0]["recv"] for r in results) == total
    assert all(r[0]["broadcast"] == 0 for r in results)
    assert all(r[2] == [True] * len(KEYS) for r in results)
    assert sum(r[1] for r in results) == 2 * len(KEYS)  # one mapper a node a range
    assert _left_by([r[3] for r in results]) == set()


def test_a_failed_read_leaves_no_segment() -> None:
    results = run_distributed(_node_run, 3, 0, "read", timeout=120)
    assert [r[:2] for r in results] == [("raised", "CorruptCheckpointError")] * 3
    assert _left_by([r[2] for r in results]) == set()


@pytest.mark.alone  # any load beside it (same pid namespace) may sweep the leftovers first
def test_the_segments_of_a_killed_owner_are_swept_by_the_next_load() -> None:
    before = _segments()
    results = run_distributed(_node_run, 3, 0, "kill", exits={1}, timeout=120)
    assert results[1] == -signal.SIGKILL
    assert results[0][0] == "raised" and results[2][0] == "raised", results
    leaked = _segments() - before
    assert leaked and _left_by([results[0][2], results[2][2]]) == set()
    run_distributed(_node_run, 2, 0, None, timeout=120)
    assert not leaked & _segments()


def _plan_owners(world: int) -> dict[tuple[str, int, int], int]:
    from ckptstore.engine.read_owners import plan_shares

    return plan_shares([KEYS] * world, SIZE).owners


def test_a_sweep_removes_only_dead_creators_regular_segments_and_a_view_checks_the_file(
    tmp_path,
) -> None:
    """/dev/shm is shared ground: the sweep leaves a live creator's segment, a symlink and
    a file of another pid namespace; a mapping refuses a file of the wrong size, a link and
    a FIFO (at once); a segment is never created over a name already there, nor through a
    link."""
    import subprocess

    ns = node_segments.creator().split("-")[0]
    p = subprocess.Popen(["true"])  # a pid that has exited
    p.wait()
    dead = p.pid
    tag = f"sweeptest{os.getpid()}"

    def name(maker: str) -> str:
        return os.path.join(node_segments.SHM_DIR, f"{node_segments.PREFIX}{tag}-{maker}-0-0")

    gone = name(f"{ns}-{dead}")
    live = name(f"{ns}-{os.getpid()}")
    other_ns = name(f"{int(ns) + 1}-{dead}")
    link = os.path.join(node_segments.SHM_DIR, f"{node_segments.PREFIX}{tag}x-{ns}-{dead}-0-0")
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    try:
        for path in (gone, live, other_ns):
            with open(path, "wb") as f:
                f.write(b"x" * 8)
        os.symlink(target, link)
        removed = node_segments.sweep()
        assert gone in removed and not os.path.exists(gone)
        assert all(os.path.lexists(p) for p in (live, other_ns, link))
        assert target.read_bytes() == b"keep"
        with pytest.raises(CkptStoreError, match="not the shared part"):
            node_segments.open_view(live, 16)
        with pytest.raises(CkptStoreError, match="could not open"):
            node_segments.open_view(link, 4)  # a link is never followed
        os.mkfifo(gone)  # a FIFO in a segment's place: refused at once, never waited on
        with pytest.raises(CkptStoreError, match="not the shared part"):
            _within([Path(gone)], lambda: node_segments.open_view(gone, 8))
        with pytest.raises(CkptStoreError, match="could not create"):
            node_segments.create(link, 4)  # a name already taken (here a link) is refused
        assert os.path.islink(link) and target.read_bytes() == b"keep"
    finally:
        for path in (gone, live, other_ns, link):
            if os.path.lexists(path):
                os.unlink(path)
