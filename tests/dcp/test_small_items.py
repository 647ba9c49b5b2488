"""Small items (under PAYLOAD_MIN) are gathered and written together: each keeps its own
range, bytes and CRC32C, stock DCP loads them, and a file holds its bytes items, then its
larger tensors, then its smaller ones."""

import io

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.dcp.encoding import PAYLOAD_MIN
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.committed import open_committed
from ckptstore.engine.itemsink import GATHER_MAX
from ckptstore.stores.local import LocalStore


def state() -> dict:
    g = torch.Generator().manual_seed(1)
    out: dict = {"config": {"lr": 0.1, "name": "run"}, "steps": [1, 2, 3]}
    for i in range(120):  # 1-3 KiB each: more than one gathered write (GATHER_MAX)
        out[f"small{i}"] = torch.randn(256 * (1 + i % 3), generator=g)
        if i % 40 == 0:
            out[f"large{i}"] = torch.randn(128, 256, generator=g)  # 128 KiB, interleaved
    out["count"] = torch.tensor(7)  # a 0-d tensor: 4 bytes
    out["half"] = torch.randn(3, 5, generator=g).to(torch.bfloat16)
    return out


def zeros_like(s: dict) -> dict:
    out = {k: torch.zeros_like(v) for k, v in s.items() if isinstance(v, torch.Tensor)}
    return {**out, "config": {"lr": 0.0, "name": ""}, "steps": [0, 0, 0]}


def stock_bytes(tensor: torch.Tensor) -> bytes:
    torch.serialization.set_crc32_options(False)
    try:
        buf = io.BytesIO()
        torch.save(tensor, buf)
        return buf.getvalue()
    finally:
        torch.serialization.set_crc32_options(True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # stock dcp.load, 1 process
def test_small_items_keep_their_own_ranges_and_load_everywhere(tmp_path) -> None:
    ref = state()
    small = sum(
        v.nbytes for v in ref.values() if isinstance(v, torch.Tensor) and v.nbytes < PAYLOAD_MIN
    )
    assert small > 2 * GATHER_MAX  # the gathered writes are flushed mid-file
    path = str(tmp_path / "ckpt")
    ckptstore.save(ref, path)

    for load in (
        lambda out: ckptstore.load(out, path),
        lambda out: dcp.load(out, storage_reader=dcp.FileSystemReader(path), no_dist=True),
    ):
        out = zeros_like(ref)
        load(out)
        for k, v in ref.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(out[k], v) and out[k].dtype == v.dtype, k
            else:
                assert out[k] == v, k

    manifest = open_committed(LocalStore(path)).manifest
    ranges = sorted(manifest.ranges, key=lambda r: r.offset)
    names = [r.key.partition("@")[0] for r in ranges]  # the item's name, not its offset
    assert len({r.file for r in ranges}) == 1
    data = (tmp_path / "ckpt" / ranges[0].file).read_bytes()
    end = 0
    for name, r in zip(names, ranges):  # contiguous, each its own checksum; tensors are
        assert r.offset == end  # torch.save's bytes
        end += r.length
        raw = data[r.offset : r.offset + r.length]
        assert crc32c(raw) == r.crc32c, name
        if isinstance(ref.get(name), torch.Tensor):
            assert raw == stock_bytes(ref[name]), name
    assert end == len(data)

    def kind(name: str) -> int:  # 0: bytes item, 1: tensor >= PAYLOAD_MIN, 2: smaller one
        value = ref.get(name)
        if not isinstance(value, torch.Tensor):
            return 0
        return 1 if value.nbytes >= PAYLOAD_MIN else 2

    kinds = [kind(n) for n in names]
    assert kinds == sorted(kinds) and set(kinds) == {0, 1, 2}
    tensors = [n for n in names if kind(n)]  # plan order within each kind
    assert tensors == [k for k in ref if kind(k) == 1] + [k for k in ref if kind(k) == 2]
    assert all(r.span is not None for n, r in zip(names, ranges) if kind(n) == 1)
