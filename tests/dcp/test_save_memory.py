"""What a save holds in memory beyond the state: counted in the engine's buffer pool and
by the lifetime of the copies it makes, never by timing or RSS thresholds."""

from __future__ import annotations

import gc
import io
import time
import weakref

import pytest
import torch

import ckptstore
from ckptstore.config import TransferConfig
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine.buffers import BufferPool
from ckptstore.engine.transfer import TransferEngine
from ckptstore.engine.writeplan import SMALL_PART, ZERO_COPY_MIN
from ckptstore.stores.local import LocalStore

MiB = 1 << 20


def plain_state(n: int, mib: int) -> dict:
    g = torch.Generator().manual_seed(n)
    out = {f"t{i}": torch.randn(mib * MiB // 4, generator=g) for i in range(n)}
    out["bias"] = torch.arange(100.0)  # a small item: copied into the part buffer
    out["step"] = 7  # a bytes item
    return out


@pytest.mark.parametrize(("budget_mib", "tensors"), [(16, 4), (512, 4), (512, 12)])
def test_a_volume_save_holds_one_small_buffer_whatever_the_budget_or_size(
    tmp_path, budget_mib: int, tensors: int
) -> None:
    """Tensor records go out from the tensors' own memory; each item's header is sent as a
    copy of its few bytes, so the one shard file never has more than its one SMALL_PART
    buffer out, however many items are queued and however large memory_budget is."""
    state = plain_state(tensors, 2)
    cfg = TransferConfig(part_size=4 * MiB, memory_budget=budget_mib * MiB)
    with TransferEngine(cfg) as engine:
        path = tmp_path / "step_000000001"
        ckptstore.save(state, CkptWriter(str(path), engine=engine))
        pool = engine.buffers
        assert pool.peak_buffers_out == SMALL_PART  # one buffer, not one per item in flight
        assert pool.created == SMALL_PART  # and only one was ever made
        assert pool.in_use == 0 and pool.buffers_out == 0
        assert pool.peak_in_use <= budget_mib * MiB  # references of tensor memory included
    out = {k: torch.zeros_like(v) if torch.is_tensor(v) else 0 for k, v in state.items()}
    ckptstore.load(out, str(path))
    assert all(torch.equal(out[k], v) for k, v in state.items() if torch.is_tensor(v))
    assert out["step"] == 7


def test_a_copy_made_for_the_save_is_freed_once_its_parts_are_written(tmp_path) -> None:
    """The tensor torch.save streams (here a temporary, as ``cpu_item`` makes for a view or
    a GPU tensor) is held by the parts that point into it, not until the file closes: once
    they are written only the latest item's owner is still alive."""
    refs = []
    expected = []
    with TransferEngine(TransferConfig(part_size=ZERO_COPY_MIN)) as e:
        w = e.writer(LocalStore(str(tmp_path)), "f.bin")
        for i in range(3):
            t = torch.full((ZERO_COPY_MIN // 2,), float(i))  # 2 MiB: two parts by reference
            buf = io.BytesIO()
            torch.save(t, buf)
            expected.append(buf.getvalue())
            refs.append(weakref.ref(t))
            with w.item(owner=t) as sink:
                torch.save(t, sink)
            del t
        for _ in range(1000):  # until the I/O threads have dropped the parts they ran
            gc.collect()
            if refs[0]() is None and refs[1]() is None:
                break
            time.sleep(0.01)
        assert [r() is None for r in refs] == [True, True, False]
        w.close()
        assert refs[2]() is None
        assert e.buffers.in_use == 0
    assert (tmp_path / "f.bin").read_bytes() == b"".join(expected)


def test_pool_counts_buffers_reservations_and_reuse() -> None:
    pool = BufferPool(10 * MiB)
    never = lambda: False  # noqa: E731
    a = pool.acquire(4 * MiB, never)
    pool.reserve(3 * MiB, never)
    assert (pool.in_use, pool.buffers_out, pool.created) == (7 * MiB, 4 * MiB, 4 * MiB)
    pool.release(a)
    b = pool.acquire(4 * MiB, never)  # the pooled one again: nothing new made
    assert b is a and pool.created == 4 * MiB
    pool.release(b)
    pool.unreserve(3 * MiB)
    assert (pool.in_use, pool.buffers_out) == (0, 0)
    assert (pool.peak_in_use, pool.peak_buffers_out) == (7 * MiB, 4 * MiB)
    pool.reset_peaks()
    assert (pool.peak_in_use, pool.peak_buffers_out) == (0, 0)
