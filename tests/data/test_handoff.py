"""A worker's batch crosses to the loop with its small tensors inline (ckptstore.data.handoff)."""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.data.handoff import INLINE_BYTES, PIPE_BYTES, inline, widen_result_pipe

from .datasets import make_parquet


def _round_trip(obj):
    return ForkingPickler.loads(bytes(ForkingPickler.dumps(inline(obj))))


def test_inline_round_trip_keeps_structure_dtypes_and_values() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    batch = {
        "f32": base,
        "strided": base[:, ::2],  # not contiguous: arrives contiguous, same values
        "bf16": base.to(torch.bfloat16),
        "bool": base > 5,
        "i64": torch.tensor([3, 1, 2]),
        "empty": torch.empty(0, 3, dtype=torch.int32),
        "scalar": torch.tensor(7.5),
        "list": [torch.ones(2), "text", 3, None],
        "nested": ({"x": torch.zeros(2, 2, dtype=torch.uint8)},),
    }
    got = _round_trip(batch)
    assert got.keys() == batch.keys()
    for k in ("f32", "strided", "bf16", "bool", "i64", "empty", "scalar"):
        assert got[k].dtype == batch[k].dtype and got[k].shape == batch[k].shape, k
        assert torch.equal(got[k], batch[k]), k
    assert got["strided"].is_contiguous()
    assert torch.equal(got["list"][0], torch.ones(2)) and got["list"][1:] == ["text", 3, None]
    assert isinstance(got["nested"], tuple)
    assert torch.equal(got["nested"][0]["x"], batch["nested"][0]["x"])
    got["f32"][0, 0] = -1  # writable, and not the sender's memory
    assert base[0, 0] == 0


def test_large_or_special_tensors_go_as_torch_sends_them() -> None:
    big = torch.zeros(INLINE_BYTES // 4 + 1, dtype=torch.float32)
    param = torch.nn.Parameter(torch.ones(3))
    got = _round_trip({"big": big, "param": param})
    assert got["big"].is_shared()  # torch's shared-memory path
    assert torch.equal(got["big"], big)
    assert isinstance(got["param"], torch.nn.Parameter) and torch.equal(got["param"], param)


@pytest.mark.processes
def test_batches_from_workers_arrive_whole(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), [10, 14, 8], row_group=4)
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "c"), seed=2)
    dl = DataLoader(ds, 4, num_workers=2, pin_memory=False)
    batches = list(dl)
    ids = [i for b in batches for i in b["id"].tolist()]
    assert sorted(ids) == list(range(32))
    for b in batches:
        assert not b["id"].is_shared()  # came through the pipe, not shared memory
        assert b["x"].tolist() == pytest.approx([i / 10 for i in b["id"].tolist()])
    dl.close()


@pytest.mark.processes
def test_worker_result_pipe_is_widened_and_batches_arrive(tmp_path) -> None:
    """A 256 KiB batch fits the widened pipe in one write; without workers nothing breaks."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("no F_GETPIPE_SZ on this platform")

    class Blobs(torch.utils.data.IterableDataset):
        def __iter__(self):
            for s in range(4):
                yield inline((s, torch.full((256 << 10,), s, dtype=torch.uint8)))

    loader = torch.utils.data.DataLoader(Blobs(), batch_size=None, num_workers=1)
    it = iter(loader)
    fd = it._worker_result_queue._reader.fileno()
    before = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    widen_result_pipe(it)
    assert fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) >= max(before, PIPE_BYTES)
    got = list(it)
    assert [s for s, _ in got] == [0, 1, 2, 3]
    assert all(bool((t == s).all()) and t.numel() == 256 << 10 for s, t in got)
    widen_result_pipe(iter(torch.utils.data.DataLoader(Blobs(), batch_size=None)))  # no-op
