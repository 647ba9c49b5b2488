"""PartBuilder (parts sent from several buffers, ``ckptstore.engine.parts``) with a real BufferPool:
the bytes, the part sizes, the memory budget and the checksums computed on the way (each
part's CRC32C, each large write's), for any sequence of small and large writes."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.engine.buffers import UNLOCKED_COPY_MIN, BufferPool, copy_into
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.parts import PartBuilder, Release

PART, BUF = 64, 16


class Sent:
    """Collects the parts a builder sends and checks the budget as each one goes."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.parts: list[list[memoryview]] = []
        self.releases: list[Release] = []
        self.crcs: list[int] = []

    def __call__(self, buffers: list[memoryview], release: Release, crc: int) -> None:
        assert self.pool.in_use <= PART * (len(self.releases) + 1)  # this part holds <= PART
        self.parts.append(buffers)
        self.releases.append(release)
        self.crcs.append(crc)


def build(writes: Sequence[tuple[bool, bytes | bytearray]]) -> tuple[Sent, BufferPool, list[bytes]]:
    pool = BufferPool(1 << 20)
    sent = Sent(pool)
    builder = PartBuilder(PART, BUF, pool, lambda: False, sent)
    for large, data in writes:
        if large:
            assert builder.refer(memoryview(data)) == crc32c(data)  # the view's own CRC32C
        else:
            builder.copy(memoryview(data))
        assert builder.held <= PART
    builder.flush()
    bodies = [b"".join(bytes(p) for p in part) for part in sent.parts]
    assert sent.crcs == [crc32c(b) for b in bodies]  # each part sent with its bytes' CRC32C
    return sent, pool, bodies


writes_strategy = st.lists(
    st.tuples(st.booleans(), st.integers(1, 3 * PART).map(os.urandom)), max_size=20
)


@settings(max_examples=200, deadline=None)
@given(writes_strategy)
def test_parts_hold_the_bytes_in_order_and_release_everything(
    writes: list[tuple[bool, bytes]],
) -> None:
    sent, pool, bodies = build(writes)
    assert b"".join(bodies) == b"".join(data for _, data in writes)
    assert all(len(b) <= PART for b in bodies)
    assert all(len(b) > PART - BUF for b in bodies[:-1])  # S3's minimum part, with room
    for release in sent.releases:
        release()
    assert pool.in_use == 0


def test_large_writes_are_sent_from_their_own_memory() -> None:
    tensor = bytearray(os.urandom(3 * PART))
    sent, _, bodies = build([(False, b"head"), (True, tensor), (False, b"tail")])
    referenced = [p for part in sent.parts for p in part if p.obj is tensor]
    assert sum(len(p) for p in referenced) == len(tensor)  # every tensor byte by reference
    first = 4 + (PART - BUF)  # the header's buffer counts whole: the tensor fills the rest
    assert [len(b) for b in bodies] == [first, PART, PART, len(tensor) + 8 - first - 2 * PART]


def test_small_writes_between_large_ones_share_one_buffer_per_part() -> None:
    pool = BufferPool(1 << 20)
    sent = Sent(pool)
    builder = PartBuilder(PART, BUF, pool, lambda: False, sent)
    for _ in range(3):
        builder.copy(memoryview(b"h" * 3))
        builder.refer(memoryview(bytearray(10)))
    assert pool.in_use == BUF + 30  # one pooled buffer, three headers in it
    builder.discard()
    assert pool.in_use == 0 and sent.parts == []


def test_buffer_larger_than_a_part_is_refused() -> None:
    with pytest.raises(ValueError, match="buffer_size"):
        PartBuilder(8, 16, BufferPool(64), lambda: False, lambda p, r, c: None)


@pytest.mark.parametrize("size", [0, 1, UNLOCKED_COPY_MIN - 1, UNLOCKED_COPY_MIN, 300_000])
def test_copy_into_puts_the_bytes_at_the_offset_and_nothing_else(size: int) -> None:
    """Small copies by slice assignment, large ones through numpy (without the GIL): the
    same bytes, into a bytearray or a memoryview of one, from a read-only source too."""
    src = os.urandom(size)
    for make in (bytearray, lambda n: memoryview(bytearray(n))):
        dst = make(size + 10)
        copy_into(dst, 7, memoryview(src))
        assert bytes(dst) == b"\0" * 7 + src + b"\0" * 3
