"""Large-tensor loads from SeaweedFS as many smaller ranged GETs in flight
(``ckptstore.engine.readplan.read_streams``): each GET at most ``READ_RANGE``, more in
flight than a save's parts but never more than planned, every byte read once, and a range
that does not verify fails the load as corrupt, with no read still filling a target."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore import WriterOptions
from ckptstore.config import MiB, TransferConfig
from ckptstore.engine.committed import open_committed
from ckptstore.engine.readplan import READ_RANGE, range_size, read_streams
from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores.s3 import S3Store
from ckptstore.testing.faults import FaultyStore

from .conftest import BUCKET, unique

pytestmark = [
    pytest.mark.server,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

# 16 MiB parts, 2 in flight: a save keeps 32 MiB in flight, a load 4 GETs (32 / 8 MiB).
CONFIG = TransferConfig(part_size=16 * MiB, concurrency=2, memory_budget=64 * MiB)
TENSOR = 3 * MiB  # float32 elements: 12 MiB a tensor
NAMES = ("a", "b")


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {n: torch.randn(TENSOR, generator=g) for n in NAMES}


class Watched(FaultyStore):
    """Records every ranged GET and how many ran at once (each held a little, so that the
    planned ones overlap even on a busy machine)."""

    def __init__(self, inner: S3Store) -> None:
        super().__init__(inner)
        self.gets: list[tuple[str, int, int]] = []
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        with self.lock:
            self.gets.append((path, start, len(buf)))
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(0.2)
            return super().get_into(path, start, buf)
        finally:
            with self.lock:
                self.active -= 1


@pytest.fixture
def saved(seaweedfs: Any) -> S3Store:
    url = f"s3://{BUCKET}/{unique('streams')}/step_000000003"
    ckptstore.save(
        state(),
        ckptstore.writer(
            url, WriterOptions(transfer=CONFIG), storage_options=seaweedfs.storage_options
        ),
    )
    return S3Store(url, seaweedfs.storage_options)


def test_the_plan_keeps_the_save_budget_in_flight_as_smaller_gets() -> None:
    assert read_streams(32 * MiB, 8) == 32  # the defaults: 32 GETs of 8 MiB
    assert read_streams(16 * MiB, 2) == 4
    assert read_streams(4 * MiB, 8) == 8  # parts no larger than a GET: as many as parts
    assert read_streams(64 * MiB, 32) == 64  # the connection pool caps it
    assert read_streams(1 * MiB, 100) == 100  # never fewer than the parts a save sends
    with pytest.raises(ValueError):
        read_streams(0, 8)


def test_large_tensors_are_read_as_ranges_over_more_connections(saved: S3Store) -> None:
    store = Watched(saved)
    out = {n: torch.zeros(TENSOR) for n in NAMES}
    ckptstore.load(out, ckptstore.reader(store, transfer=CONFIG))
    ref = state()
    assert all(torch.equal(out[n], ref[n]) for n in NAMES)

    ranges = open_committed(saved).manifest.ranges
    streams = read_streams(CONFIG.part_size, CONFIG.concurrency)
    size = range_size(sum(r.length for r in ranges), min(CONFIG.part_size, READ_RANGE), streams)
    assert streams == 4 and 6 * MiB < size < 7 * MiB  # the load's ~24 MiB over 4 GETs
    shard = [g for g in store.gets if g[0].endswith(".distcp")]
    assert all(n <= size for _, _, n in shard)
    spans = [r for r in ranges if r.span is not None]
    for entry in spans:  # each tensor's raw bytes: read once, in ranges, nothing twice
        lo = entry.offset + entry.span.offset  # type: ignore[union-attr]
        hi = lo + entry.span.length  # type: ignore[union-attr]
        mine = sorted((s, n) for p, s, n in shard if p == entry.file and lo <= s < hi)
        # the load's first item as GETs over every connection (it lands first), the rest
        # as GETs of the range size
        assert len(mine) == (streams if entry.key.startswith(f"{NAMES[0]}@") else 2)
        assert mine[0][0] == lo
        assert all(a + n == b for (a, n), (b, _) in zip(mine, mine[1:]))
        assert mine[-1][0] + mine[-1][1] == hi
    # more GETs at once than a save's parts in flight, never more than planned
    assert CONFIG.concurrency < store.peak <= streams


def test_a_range_that_does_not_verify_fails_the_load_and_nothing_keeps_writing(
    saved: S3Store,
) -> None:
    entry = next(r for r in open_committed(saved).manifest.ranges if r.key.startswith("b@"))
    assert entry.span is not None
    start = entry.offset + entry.span.offset
    end = start + entry.span.length
    data = bytearray(saved.get(entry.file))
    data[end - 100] ^= 0x10  # inside the tensor's last range
    saved.put(entry.file, data)

    store = Watched(saved)
    out = {n: torch.zeros(TENSOR) for n in NAMES}
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as err:
        ckptstore.load(out, ckptstore.reader(store, transfer=CONFIG))
    assert f"{saved.describe(entry.file)} bytes [{start}, {end})" in str(err.value)
    assert store.active == 0  # every GET of the load had finished when the error came
    snapshot = {n: t.clone() for n, t in out.items()}
    time.sleep(0.3)
    assert all(torch.equal(out[n], snapshot[n]) for n in NAMES)  # no read still landing
