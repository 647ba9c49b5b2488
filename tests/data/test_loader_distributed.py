"""Exact resume across a resize: 2 gloo ranks save the loader with DCP, 3 ranks resume.

Real torch.distributed processes and real DataLoader worker processes; all ranks share one
node-local cache directory. The union of sample ids handed to training is exactly-once.
"""

from __future__ import annotations

from collections import Counter

import pytest

import ckptstore
from ckptstore.data import DataLoader, DataOrderError, ShardedDataset

from .datasets import make_parquet

pytestmark = pytest.mark.distributed

SIZES = [13, 0, 21, 8, 17, 11]  # N = 70


def _dataset(root: str) -> ShardedDataset:
    return ShardedDataset(f"{root}/ds", cache_dir=f"{root}/cache", seed=5, buckets=3)


def _ids(batch) -> list[int]:
    return [] if isinstance(batch, list) else batch["id"].tolist()


def _first_run(rank: int, world: int, root: str, ckpt: str) -> dict:
    dl = DataLoader(_dataset(root), batch_size=4, num_workers=2, multiprocessing_context="fork")
    it = iter(dl)
    ids = [i for _ in range(3) for i in _ids(next(it))]  # 3 steps: cursor 3 * 2 * 4 = 24
    ckptstore.save({"data": dl}, ckpt)
    if rank == 1:
        next(it)  # this rank consumed one batch more: a save now must be refused
    try:
        dl.state_dict()
        refused = ""
    except DataOrderError as exc:
        refused = str(exc)
    del it
    dl.close()
    return {"ids": ids, "cursor": 24, "refused": refused}


def _resume(rank: int, world: int, root: str, ckpt: str) -> dict:
    dl = DataLoader(_dataset(root), batch_size=5, num_workers=1, multiprocessing_context="fork")
    ckptstore.load({"data": dl}, ckpt)
    start = dl.cursor
    rest = [i for b in dl for i in _ids(b)]
    after_rest = dl.cursor
    nxt = [i for b in dl for i in _ids(b)]
    summary = dl.metrics.summary()
    dl.close()
    return {"start": start, "rest": rest, "after": after_rest, "next": nxt, "summary": summary}


def test_resume_from_2_ranks_on_3_ranks_is_exactly_once(tmp_path) -> None:
    from harness.dist import run_distributed

    root = str(tmp_path)
    make_parquet(f"{root}/ds", SIZES, row_group=4)
    n = sum(SIZES)
    ckpt = f"{root}/ckpt/step_000000003"
    first = run_distributed(_first_run, 2, root, ckpt, daemon=False)
    consumed = [i for r in first for i in r["ids"]]
    assert len(consumed) == 24 and len(set(consumed)) == 24
    assert all("ranks disagree on the data cursor" in r["refused"] for r in first)

    second = run_distributed(_resume, 3, root, ckpt, daemon=False)
    assert [r["start"] for r in second] == [24, 24, 24]
    assert [r["after"] for r in second] == [n] * 3 and len({len(r["rest"]) for r in second}) >= 1
    served = consumed + [i for r in second for i in r["rest"]]
    counts = Counter(served)
    assert sorted(counts) == list(range(n)) and set(counts.values()) == {1}
    epoch1 = [i for r in second for i in r["next"]]
    assert sorted(epoch1) == list(range(n))
    # One node-local cache for all ranks: the first run downloaded the used shards, the
    # resumed ranks found them cached.
    assert sum(r["summary"]["downloads"] for r in second) == 0
