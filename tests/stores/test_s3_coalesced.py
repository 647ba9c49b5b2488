"""Loads from SeaweedFS read small adjacent items as one coalesced GET and split large ones
across connections, and still check every item's CRC32C (``ckptstore.engine.readplan``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.config import MiB, TransferConfig
from ckptstore.engine.committed import open_committed
from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores.s3 import S3Store
from ckptstore.testing.faults import FaultyStore

from .conftest import BUCKET, unique

pytestmark = [
    pytest.mark.server,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

SMALL = 48  # tensors of 16 KiB each: no span, checked and decoded whole
MEDIUM = 4  # tensors of 128 KiB: a span, copied from their window into the target
CONFIG = TransferConfig(part_size=1 * MiB, concurrency=4, memory_budget=8 * MiB)


def state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(17)
    out: dict[str, Any] = {f"s{i:02d}": torch.randn(4096, generator=g) for i in range(SMALL)}
    out.update({f"m{i}": torch.randn(32 * 1024, generator=g) for i in range(MEDIUM)})
    out["big"] = torch.randn(3 * 256 * 1024 + 123, generator=g)  # ~3 MiB: 4 ranges of 1 MiB
    out["meta"] = {"epoch": 3}
    return out


def targets() -> dict[str, Any]:
    out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in state().items()}
    out["meta"] = {"epoch": 0}
    return out


class CountingStore(FaultyStore):
    """Records every ranged read the reader makes: (path, start, length)."""

    def __init__(self, inner: S3Store) -> None:
        super().__init__(inner)
        self.gets: list[tuple[str, int, int]] = []

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        self.gets.append((path, start, len(buf)))
        return super().get_into(path, start, buf)


@pytest.fixture
def saved(seaweedfs: Any) -> S3Store:
    url = f"s3://{BUCKET}/{unique('coalesce')}/step_000000007"
    ckptstore.save(state(), ckptstore.writer(url, storage_options=seaweedfs.storage_options))
    return S3Store(url, seaweedfs.storage_options)


def test_small_items_share_gets_and_large_ones_are_split(saved: S3Store) -> None:
    store = CountingStore(saved)
    out = targets()
    ckptstore.load(out, ckptstore.reader(store, transfer=CONFIG))
    ref = state()
    for name in ref:
        if isinstance(ref[name], torch.Tensor):
            assert torch.equal(out[name], ref[name]), name
    assert out["meta"] == ref["meta"]
    shard_gets = [g for g in store.gets if g[0].endswith(".distcp")]
    # 53 small items in a few windows of <= 1 MiB (one GET each), the big tensor in
    # 4 ranges of <= 1 MiB: far fewer GETs than items
    assert len(shard_gets) <= 8
    assert max(length for _, _, length in shard_gets) <= MiB
    entry = next(r for r in open_committed(saved).manifest.ranges if r.key.startswith("big@"))
    assert entry.span is not None
    big_start = entry.offset + entry.span.offset
    big = sorted(g for g in shard_gets if big_start <= g[1] < big_start + entry.span.length)
    assert len(big) == 4 and sum(g[2] for g in big) == entry.span.length


@pytest.mark.parametrize("name", ["s20", "m2"])
def test_a_flipped_byte_inside_a_coalesced_window_is_caught(saved: S3Store, name: str) -> None:
    ranges = open_committed(saved).manifest.ranges
    entry = next(r for r in ranges if r.key.startswith(f"{name}@"))
    # a small item is checked whole; a medium one by its span (the tensor's raw bytes)
    start, end = entry.offset, entry.offset + entry.length
    if entry.span is not None:
        start, end = start + entry.span.offset, start + entry.span.offset + entry.span.length
    assert (entry.span is None) == name.startswith("s")
    data = bytearray(saved.get(entry.file))
    data[(start + end) // 2] ^= 0x04
    saved.put(entry.file, data)
    store = CountingStore(saved)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as err:
        ckptstore.load(targets(), ckptstore.reader(store, transfer=CONFIG))
    assert f"{saved.describe(entry.file)} bytes [{start}, {end})" in str(err.value)
    # the damaged item was read inside a window shared with a neighbour
    assert any(
        s < entry.offset + entry.length and entry.offset < s + n and n > entry.length
        for p, s, n in store.gets
        if p == entry.file
    )


def test_the_first_item_is_read_as_smaller_gets_than_the_rest(seaweedfs: Any) -> None:
    """All GETs of a load are in flight at once; on a link that caps each connection's rate
    they would end together, the first item's with the last's. The first window is read as
    GETs of ``FIRST_RANGE`` over the idle connections, so it lands first."""
    g = torch.Generator().manual_seed(3)
    saved = {"a": torch.randn(MiB, generator=g), "b": torch.randn(4 * MiB, generator=g)}
    url = f"s3://{BUCKET}/{unique('first')}/step_000000001"
    ckptstore.save(saved, ckptstore.writer(url, storage_options=seaweedfs.storage_options))
    store = CountingStore(S3Store(url, seaweedfs.storage_options))
    out = {k: torch.zeros_like(v) for k, v in saved.items()}
    config = TransferConfig(part_size=8 * MiB, concurrency=4, memory_budget=64 * MiB)
    ckptstore.load(out, ckptstore.reader(store, transfer=config))
    assert all(torch.equal(out[k], saved[k]) for k in saved)
    ranges = {r.key.split("@")[0]: r for r in open_committed(store).manifest.ranges}
    gets = [g for g in store.gets if g[0].endswith(".distcp")]

    def of(name: str) -> list[int]:
        r = ranges[name]
        return [n for _, at, n in gets if r.offset <= at < r.offset + r.length]

    # 4 streams, 20 MiB: GETs of 5 MiB; the first item's 4 MiB in 4 GETs of ~1 MiB
    assert len(of("a")) == 4 and max(of("a")) <= MiB + 4096, of("a")
    assert min(of("b")[:-1]) >= 5 * MiB, of("b")
