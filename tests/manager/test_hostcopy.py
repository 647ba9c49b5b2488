"""Staging copies of CPU tensors on several threads (ckptstore.manager.saving.hostcopy)."""

from __future__ import annotations

import threading

import pytest
import torch

from ckptstore.manager.saving import hostcopy
from ckptstore.manager.saving.host_arena import ArenaStager
from ckptstore.manager.saving.hostcopy import CUT_ALIGN, HostCopier, split_bytes
from ckptstore.manager.saving.shared_stager import SharedStager


def _covered(sizes: list[int], lanes: list[list[tuple[int, int, int]]]) -> dict[int, list]:
    seen: dict[int, list] = {}
    for lane in lanes:
        for i, start, stop in lane:
            seen.setdefault(i, []).append((start, stop))
    return seen


@pytest.mark.parametrize(
    "sizes,k",
    [
        ([1 << 20], 2),
        ([1 << 20], 3),
        ([100, 200, 300, 1 << 16, 7, 0, 5000], 4),
        ([64] * 10, 8),
        ([10, 20], 8),
        ([0, 0], 3),
        ([12345678, 1, 2, 3, 999999], 5),
    ],
)
def test_split_covers_every_byte_once_in_order_on_aligned_cuts(sizes, k):
    lanes = split_bytes(sizes, k)
    assert len(lanes) <= k
    assert all(lane for lane in lanes)
    seen = _covered(sizes, lanes)
    for i, size in enumerate(sizes):
        runs = sorted(seen.get(i, []))
        if size == 0:
            assert runs == []
            continue
        assert runs[0][0] == 0 and runs[-1][1] == size
        for (_, end), (start, _) in zip(runs, runs[1:], strict=False):
            assert end == start  # no gap, no overlap
        for start, stop in runs:
            assert start < stop
            assert start % CUT_ALIGN == 0  # a cut is a whole number of every dtype's elements
    order = [(i, start) for lane in lanes for i, start, _ in lane]
    assert order == sorted(order)  # the lanes walk the state in order


def test_split_balances_the_bytes():
    sizes = [3 << 20, 1 << 20, 5 << 20, 7 << 20]
    lanes = split_bytes(sizes, 4)
    per = [sum(stop - start for _, start, stop in lane) for lane in lanes]
    assert len(per) == 4
    assert max(per) - min(per) <= 2 * CUT_ALIGN
    assert split_bytes(sizes, 1) == [[(i, 0, s) for i, s in enumerate(sizes)]]


def test_no_threads_where_torch_already_copies_on_as_many(monkeypatch):
    monkeypatch.setattr(hostcopy, "rank_cores", lambda: 4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        assert HostCopier().threads == 1
        torch.set_num_threads(1)  # what torchrun's OMP_NUM_THREADS=1 gives every rank
        assert HostCopier().threads == 4
    finally:
        torch.set_num_threads(threads)


def test_a_copy_behind_training_leaves_it_its_core(monkeypatch):
    """A deferred copy (``behind``) runs while training's next step does: it uses the
    rank's cores less one, and splits the bytes over no more threads than that."""
    threads = torch.get_num_threads()
    lanes: list[int] = []
    split = hostcopy.split_bytes
    monkeypatch.setattr(
        hostcopy, "split_bytes", lambda sizes, n: lanes.append(n) or split(sizes, n)
    )
    try:
        torch.set_num_threads(1)
        for cores, behind in ((1, 1), (2, 1), (4, 3), (32, 8)):
            monkeypatch.setattr(hostcopy, "rank_cores", lambda cores=cores: cores)
            copier = HostCopier()
            assert (copier.threads, copier.behind_threads) == (min(cores, 8), behind)
        monkeypatch.setattr(hostcopy, "rank_cores", lambda: 4)
        copier = HostCopier()
        big = torch.randn(2 << 20)  # above MIN_PARALLEL_BYTES
        dst = torch.empty_like(big)
        copier.copy([(dst, big)], behind=True)
        copier.copy([(dst, big)])
        copier.close()
        assert lanes == [3, 4] and torch.equal(dst, big)
    finally:
        torch.set_num_threads(threads)


def _state() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(1 << 20, generator=g),  # 4 MiB, cut between threads
        torch.randint(0, 255, (3, 1001), dtype=torch.uint8, generator=g),
        torch.randn(517, 3, generator=g).to(torch.bfloat16),
        torch.randn(2 << 20, generator=g, dtype=torch.float64),
        torch.tensor(7, dtype=torch.int64),
        torch.empty(0),
        torch.randn(64, 33, generator=g).t(),  # strided: copied whole
        torch.randn(1000, generator=g) > 0,
        torch.randn(300, dtype=torch.complex64, generator=g),
    ]


def test_copy_on_threads_is_byte_exact_and_uses_them():
    src = _state()
    dst = [torch.empty(t.shape, dtype=t.dtype) for t in src]
    copier = HostCopier(threads=3)
    try:
        for _ in range(2):  # the second copy reuses the threads
            copier.copy(list(zip(dst, src, strict=True)))
            for d, s in zip(dst, src, strict=True):
                assert torch.equal(d, s)
            assert copier._pool is not None  # above the minimum: the threads ran
            names = copier._pool.submit(lambda: threading.current_thread().name).result()
            assert names.startswith("ckpt-copy")
            for d in dst:
                d.zero_()
    finally:
        copier.close()
    assert copier._pool is None


def test_a_small_state_is_copied_on_the_calling_thread():
    src = [torch.randn(1000), torch.randn(10, 10)]
    dst = [torch.empty_like(t) for t in src]
    copier = HostCopier(threads=4)
    copier.copy(list(zip(dst, src, strict=True)))
    assert copier._pool is None
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))


def test_a_copy_error_reaches_the_caller_after_every_thread_stopped():
    copier = HostCopier(threads=2)
    big = torch.randn(4 << 20)
    wrong = torch.empty(10)  # a destination of the wrong size
    try:
        with pytest.raises(RuntimeError):
            copier.copy([(torch.empty_like(big), big), (wrong, torch.randn(11))])
    finally:
        copier.close()


@pytest.mark.parametrize("stager", ["arena", "shared"])
def test_stagers_copy_on_threads_byte_exact(monkeypatch, stager):
    monkeypatch.setattr(hostcopy, "rank_cores", lambda: 3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        state = {f"t{i}": t for i, t in enumerate(_state()) if t.is_contiguous()}
        state["step"] = 5
        s: ArenaStager | SharedStager = ArenaStager() if stager == "arena" else SharedStager()
        try:
            assert s._copier.threads == 3
            if isinstance(s, ArenaStager):
                staged = s.stage(state)
                assert staged is not None
                out = staged.state
            else:
                s.stage(state)
                out = dict(zip([k for k in state if k != "step"], s.views, strict=True))
            for k, v in state.items():
                if k != "step":
                    assert torch.equal(out[k], v)
                    assert out[k].data_ptr() != v.data_ptr() or v.numel() == 0
            assert s._copier._pool is not None
        finally:
            s.close()
        assert s._copier._pool is None
    finally:
        torch.set_num_threads(threads)
