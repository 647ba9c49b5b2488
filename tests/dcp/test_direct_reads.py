"""Large dense tensors are read straight into their targets, checked by their own CRC32C."""

import json
import time

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore.config import WriterOptions
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import Manifest, RangeEntry, Span
from ckptstore.errors import CorruptCheckpointError, StoreAccessError
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import FaultyStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {
        "big": torch.randn(512, 256, generator=g),  # 512 KiB: read in place
        "half": torch.randn(256, 256, generator=g).to(torch.bfloat16),
        "small": torch.arange(10.0),  # under PAYLOAD_MIN: read whole
        "transposed": torch.randn(256, 512, generator=g).t(),  # not its storage's order
        "meta": {"epoch": 2},
    }


def targets() -> dict:
    return {
        "big": torch.zeros(512, 256),
        "half": torch.zeros(256, 256, dtype=torch.bfloat16),
        "small": torch.zeros(10),
        "transposed": torch.zeros(512, 256),
        "meta": {"epoch": 0},
    }


class Recording(FaultyStore):
    """Remembers the address of every buffer the reader asked to fill."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.addresses: set[int] = set()

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        self.addresses.add(np.frombuffer(buf, np.uint8).ctypes.data)
        return super().get_into(path, start, buf)


@pytest.fixture
def ckpt(tmp_path) -> str:
    path = str(tmp_path / "step_000000002")
    ckptstore.save(state(), path)
    return path


def test_spans_are_recorded_for_large_dense_tensors_only(ckpt) -> None:
    store = LocalStore(ckpt)
    spans = {r.key.split("@")[0]: r for r in open_committed(store).manifest.ranges}
    assert spans["small"].span is None and spans["transposed"].span is None
    assert spans["meta.epoch"].span is None
    for name in ("big", "half"):
        entry = spans[name]
        span = entry.span
        assert span is not None
        raw = store.get(
            entry.file, entry.offset + span.offset, entry.offset + span.offset + span.length
        )
        expected = state()[name].reshape(-1).view(torch.uint8).numpy().tobytes()
        assert raw == expected and crc32c(raw) == span.crc32c


def test_load_fills_large_targets_in_place(ckpt) -> None:
    out = targets()
    store = Recording(LocalStore(ckpt))
    addresses = {k: out[k].data_ptr() for k in ("big", "half", "small")}
    ckptstore.load(out, ckptstore.reader(store))
    ref = state()
    for name in ("big", "half", "small", "transposed"):
        assert torch.equal(out[name], ref[name])
    assert out["meta"] == {"epoch": 2}
    assert {addresses["big"], addresses["half"]} <= store.addresses
    assert addresses["small"] not in store.addresses  # read whole, decoded, copied


def test_other_dtype_target_is_converted_not_filled(ckpt) -> None:
    out = {"big": torch.zeros(512, 256, dtype=torch.float64)}
    ckptstore.load(out, ckpt)
    assert torch.equal(out["big"], state()["big"].double())


def test_corrupted_tensor_bytes_name_the_file_and_range(ckpt) -> None:
    store = LocalStore(ckpt)
    entry = next(r for r in open_committed(store).manifest.ranges if r.key.startswith("big@"))
    assert entry.span is not None
    data = bytearray(store.get(entry.file))
    at = entry.offset + entry.span.offset + 1000
    data[at] ^= 0x01
    store.put(entry.file, data)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch") as err:
        ckptstore.load(targets(), ckpt)
    start = entry.offset + entry.span.offset
    assert f"{entry.file} bytes [{start}, {start + entry.span.length})" in str(err.value)


def test_zstd_checkpoints_record_no_spans(tmp_path) -> None:
    pytest.importorskip("zstandard")
    path = str(tmp_path / "step_000000003")
    ckptstore.save(state(), ckptstore.writer(path, WriterOptions(codec="zstd")))
    assert all(r.span is None for r in open_committed(LocalStore(path)).manifest.ranges)
    out = targets()
    ckptstore.load(out, path)
    assert torch.equal(out["big"], state()["big"])


def test_manifest_keeps_spans_and_omits_them_when_absent() -> None:
    m = Manifest(step=1, world_size=1)
    m.ranges = [
        RangeEntry("f", 0, 100, 7, key="a", span=Span(10, 80, 0xDEADBEEF)),
        RangeEntry("f", 100, 50, 8, key="b"),
    ]
    doc = json.loads(m.to_bytes())
    assert doc["ranges"][0]["span"] == {"offset": 10, "length": 80, "crc32c": "deadbeef"}
    assert "span" not in doc["ranges"][1]
    assert Manifest.from_bytes(m.to_bytes(), "test").ranges == m.ranges


class FailFirstSlowSecond(FaultyStore):
    """Fails reads into ``fail_at`` at once; reads into ``slow_at`` land 0.5 s later."""

    def __init__(self, inner: LocalStore, fail_at: int, slow_at: int) -> None:
        super().__init__(inner)
        self.fail_at, self.slow_at = fail_at, slow_at

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        address = np.frombuffer(buf, np.uint8).ctypes.data
        if address == self.fail_at:
            raise StoreAccessError("injected: permission denied")
        if address == self.slow_at:
            time.sleep(0.5)
        return super().get_into(path, start, buf)


def test_a_failed_load_leaves_no_read_writing_into_the_targets(ckpt) -> None:
    out = targets()
    store = FailFirstSlowSecond(LocalStore(ckpt), out["big"].data_ptr(), out["half"].data_ptr())
    with pytest.raises(StoreAccessError):
        ckptstore.load(out, ckptstore.reader(store))
    after = out["half"].clone()
    time.sleep(1.0)  # nothing may still be filling it (a restore would reuse it now)
    assert torch.equal(out["half"], after)
