"""DataLoader in one process: epochs, exact resume on other layouts, state, seeds, metrics.

Several ranks are emulated in one process with explicit ``rank`` / ``world_size`` loaders
stepped in lockstep (the multi-process version is in test_loader_distributed.py).
"""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
import torch
from torch.utils.data import get_worker_info

from ckptstore.data import DataLoader, DataOrderError, LoggingSink, ShardedDataset, sample_seed
from ckptstore.errors import ConfigError

from .datasets import make_parquet

SIZES = [13, 0, 21, 8, 17]  # N = 59: prime, so no layout divides it


@pytest.fixture
def root(tmp_path):
    make_parquet(str(tmp_path / "ds"), SIZES, row_group=4)
    return tmp_path


def _ds(root, **kw) -> ShardedDataset:
    kw.setdefault("cache_dir", str(root / "cache"))
    kw.setdefault("seed", 17)
    kw.setdefault("buckets", 3)
    return ShardedDataset(str(root / "ds"), **kw)


def _ids(batch) -> list[int]:
    return [] if isinstance(batch, list) else batch["id"].tolist()


def _loaders(ds, world, batch, workers=0, **kw) -> list[DataLoader]:
    return [
        DataLoader(ds, batch, workers, rank=r, world_size=world, prefetch=False, **kw)
        for r in range(world)
    ]


def _lockstep(loaders, steps=None) -> list[int]:
    """Ids handed to training, step by step over all ranks; stops after ``steps``."""
    its = [iter(dl) for dl in loaders]
    out: list[int] = []
    step = 0
    while steps is None or step < steps:
        try:
            batches = [next(it) for it in its]
        except StopIteration:
            break
        for b in batches:
            out += _ids(b)
        step += 1
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.processes
def test_one_epoch_exactly_once_then_the_next(root, workers) -> None:
    ds = _ds(root)
    dl = DataLoader(ds, batch_size=8, num_workers=workers, prefetch=workers == 2)
    assert len(dl) == 8
    first = [i for b in dl for i in _ids(b)]
    assert sorted(first) == list(range(59)) and first != sorted(first)
    assert dl.cursor == 59 and dl.epoch == 1
    second = [i for b in dl for i in _ids(b)]
    assert sorted(second) == list(range(59)) and second != first
    assert len(dl.metrics.fetch_seconds) == 16 and dl.metrics.batches == 16
    dl.close()


@pytest.mark.parametrize("k0, world, batch", [(0, 3, 4), (5, 2, 7), (57, 4, 1), (3, 5, 16)])
def test_worker_plan_matches_epoch_batches(root, k0, world, batch) -> None:
    from ckptstore.data.loader import _EpochPlan
    from ckptstore.data.order import epoch_batches, num_batches

    ds = _ds(root)
    for drop_last in (False, True):
        count = num_batches(k0, world, batch, 59, drop_last)
        for rank in range(world):
            plan = _EpochPlan(ds, k0, 59, rank, world, batch, count, list)
            expected = epoch_batches(k0, rank, world, batch, 59, drop_last)
            assert [plan.cursors(s) for s in range(count)] == expected


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_dcp_round_trip_in_one_process(root, tmp_path) -> None:
    import ckptstore

    dl = DataLoader(_ds(root), 4, prefetch=False)
    it = iter(dl)
    seen = [i for _ in range(3) for i in _ids(next(it))]
    ckptstore.save({"data": dl}, str(tmp_path / "ckpt" / "step_000000003"))
    del it
    dl2 = DataLoader(_ds(root), 9, prefetch=False)
    ckptstore.load({"data": dl2}, str(tmp_path / "ckpt" / "step_000000003"))
    assert dl2.cursor == 12
    assert sorted(seen + [i for b in dl2 for i in _ids(b)]) == list(range(59))


def test_order_is_the_global_stream(root) -> None:
    ds = _ds(root)
    dl = DataLoader(ds, batch_size=5, prefetch=False)
    got = [i for b in dl for i in _ids(b)]
    assert got == ds.order.stream(0, 59).tolist()


def test_short_tail_and_drop_last(root) -> None:
    ds = _ds(root)
    r0, r1, r2 = _loaders(ds, 3, 4)  # 59 = 4 steps of 12 + 11: rank 2 gets 3 in the tail
    tails = [list(r0)[-1], list(r1)[-1], list(r2)[-1]]
    assert [len(_ids(t)) for t in tails] == [4, 4, 3]
    r0, r1, r2 = _loaders(_ds(root), 3, 8)  # tail of 11: rank 2 gets an empty batch
    assert [len(list(dl)) for dl in (r0, r1, r2)] == [3, 3, 3]
    assert list(r2) and r2.cursor == 59 * 2
    assert [_ids(b) for b in _loaders(ds, 3, 8)[2]][-1] == []
    dl = DataLoader(ds, 8, drop_last=True, prefetch=False)
    ids = [i for b in dl for i in _ids(b)]
    assert len(ids) == 56 and dl.cursor == 59  # the 3 left over are skipped, epochs aligned


@pytest.mark.parametrize(
    "first, second",
    [((2, 4, 0), (3, 5, 2)), ((1, 7, 2), (4, 2, 0)), ((3, 3, 0), (1, 16, 0))],
)
@pytest.mark.processes
def test_resume_on_another_layout_is_exactly_once(root, first, second) -> None:
    (r, b, w), (r2, b2, w2) = first, second
    ds = _ds(root)
    loaders = _loaders(ds, r, b, w)
    before = _lockstep(loaders, steps=3)
    assert [dl.cursor for dl in loaders] == [3 * r * b] * r  # counted as handed over
    state = loaders[0].state_dict()
    assert len(json.dumps(state)) < 300
    resumed = _loaders(_ds(root), r2, b2, w2)
    for dl in resumed:
        dl.load_state_dict(state)
    after = _lockstep(resumed)
    assert sorted(before + after) == list(range(59))
    nxt = _lockstep(resumed)  # the next epoch, whole
    assert sorted(nxt) == list(range(59))


@pytest.mark.processes
def test_resume_mid_epoch_on_other_worker_count_matches_uninterrupted(root) -> None:
    ds = _ds(root)
    whole = [i for b in DataLoader(ds, 4, prefetch=False) for i in _ids(b)]
    dl = DataLoader(ds, 4, num_workers=2, prefetch=False)
    it = iter(dl)
    part = [i for _ in range(5) for i in _ids(next(it))]
    state = dl.state_dict()
    del it
    dl2 = DataLoader(_ds(root), 6, num_workers=0, prefetch=False)
    dl2.load_state_dict(state)
    assert part + [i for b in dl2 for i in _ids(b)] == whole


@pytest.mark.processes
def test_small_cache_budget_still_exactly_once(root) -> None:
    sizes = sorted(s.size for s in _ds(root).shards)
    ds = _ds(root, cache_limit=sizes[-1] + sizes[-2])  # any two shards, never three
    dl = DataLoader(ds, 4, num_workers=2)
    for _ in range(2):
        assert sorted(i for b in dl for i in _ids(b)) == list(range(59))
    assert dl.metrics.summary()["evictions"] > 0
    dl.close()


def test_resume_refuses_other_seed_or_dataset(root, tmp_path) -> None:
    dl = DataLoader(_ds(root), 4, prefetch=False)
    next(iter(dl))
    state = dl.state_dict()
    with pytest.raises(DataOrderError, match="set seed=17"):
        DataLoader(_ds(root, seed=18), 4).load_state_dict(state)
    ok = DataLoader(_ds(root, seed=18), 4, allow_seed_change=True)
    ok.load_state_dict(state)
    assert ok.cursor == 4
    make_parquet(str(root / "ds"), [13, 0, 21, 8, 18], row_group=4)  # the data changed
    with pytest.raises(DataOrderError, match="fingerprint differs.*allow_dataset_change"):
        DataLoader(_ds(root), 4).load_state_dict(state)
    relisted = DataLoader(_ds(root), 4, allow_dataset_change=True)
    relisted.load_state_dict(state)
    assert relisted.cursor == 4 and len([i for b in relisted for i in _ids(b)]) == 60 - 4


def test_adopts_saved_buckets_when_not_given(root) -> None:
    dl = DataLoader(_ds(root, buckets=5), 4, prefetch=False)
    next(iter(dl))
    state = dl.state_dict()
    ds = ShardedDataset(str(root / "ds"), cache_dir=str(root / "cache"), seed=17)
    assert ds.buckets != 5
    dl2 = DataLoader(ds, 4, prefetch=False)
    dl2.load_state_dict(state)
    assert ds.buckets == 5
    with pytest.raises(DataOrderError, match="set buckets=5"):
        DataLoader(_ds(root, buckets=2), 4).load_state_dict(state)


def test_world_size_larger_than_dataset(root) -> None:
    make_parquet(str(root / "tiny"), [3])
    ds = ShardedDataset(str(root / "tiny"), cache_dir=str(root / "cache"))
    with pytest.raises(ConfigError, match="world_size 4 is larger than the dataset's 3"):
        DataLoader(ds, 1, rank=0, world_size=4)
    ids = _lockstep(_loaders(ds, 3, 2))  # R*B > N is fine: short and empty batches
    assert sorted(ids) == [0, 1, 2]


def _seeded(sample, seed):
    return {"id": sample["id"], "seed": seed}


def test_augmentation_seed_is_pure_in_seed_epoch_and_sample(root) -> None:
    ds = _ds(root, transform=_seeded)
    dl = DataLoader(ds, 5, prefetch=False)
    for epoch in range(2):
        for b in dl:
            for i, s in zip(b["id"].tolist(), b["seed"].tolist()):
                assert s == sample_seed(17, epoch, i)
    seeds = Counter(s for b in DataLoader(ds, 5, prefetch=False) for s in b["seed"].tolist())
    assert len(seeds) == 59  # distinct per sample


def _worker_seeds(sample, seed):
    info = get_worker_info()
    assert info is not None, "runs in a worker"
    return {"id": sample["id"], "w": info.id, "seed": info.seed, "torch": torch.initial_seed()}


def _seed_log(batches) -> dict[int, tuple[int, int, int]]:
    """sample id -> (worker id, ``get_worker_info().seed``, ``torch.initial_seed()``)."""
    out = {}
    for b in batches:
        if isinstance(b, list):
            continue  # an empty tail batch
        for i, w, s, t in zip(*(b[k].tolist() for k in ("id", "w", "seed", "torch"))):
            out[i] = (w, s, t)
    return out


@pytest.mark.parametrize("stop", [4, 5])  # 4: a multiple of W, so every batch keeps its worker
@pytest.mark.processes
def test_worker_seeds_after_resume_match_uninterrupted(root, stop) -> None:
    def loader() -> DataLoader:
        return DataLoader(_ds(root, transform=_worker_seeds), 4, num_workers=2, prefetch=False)

    torch.manual_seed(0)
    whole = _seed_log(loader())
    assert all(s == t for _, s, t in whole.values())  # worker seed is what torch was seeded with
    assert len({s for _, s, _ in whole.values()}) == 2

    torch.manual_seed(1)  # another global torch RNG than the uninterrupted run had
    dl = loader()
    it = iter(dl)
    first = _seed_log(next(it) for _ in range(stop))
    state = dl.state_dict()
    del it
    torch.manual_seed(2)  # the restarted process: its global RNG is anywhere
    torch.rand(3)
    resumed = loader()
    resumed.load_state_dict(state)
    rest = _seed_log(resumed)

    assert sorted([*first, *rest]) == list(range(59))
    assert first == {i: whole[i] for i in first}
    by_worker = {w: s for w, s, _ in whole.values()}
    assert {w: s for w, s, _ in rest.values()} == by_worker  # each worker: its seed again
    if stop % 2 == 0:
        assert rest == {i: whole[i] for i in rest}

    nxt = _seed_log(resumed)  # the next epoch draws other seeds; so does another rank
    assert sorted(nxt) == list(range(59))
    assert not {s for _, s, _ in nxt.values()} & set(by_worker.values())
    other = DataLoader(
        _ds(root, transform=_worker_seeds), 4, 2, rank=1, world_size=2, prefetch=False
    )
    assert not {s for _, s, _ in _seed_log(other).values()} & set(by_worker.values())


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.processes
def test_iterating_leaves_the_global_torch_rng_alone(root, workers) -> None:
    torch.manual_seed(5)
    before = torch.get_rng_state()
    dl = DataLoader(_ds(root), 8, num_workers=workers, prefetch=False)
    assert sorted(i for b in dl for i in _ids(b)) == list(range(59))
    it = iter(dl)
    next(it)
    del it
    assert torch.equal(torch.get_rng_state(), before)


def test_load_state_while_iterating_is_refused(root) -> None:
    dl = DataLoader(_ds(root), 4, prefetch=False)
    it = iter(dl)
    next(it)
    with pytest.raises(DataOrderError, match="while iterating"):
        dl.load_state_dict(dl.state_dict())


def test_metrics_and_logging_sink(root, caplog) -> None:
    ds = _ds(root)
    dl = DataLoader(ds, 4, metrics_sink=LoggingSink(), log_every=5)
    with caplog.at_level(logging.INFO, logger="ckptstore.data"):
        n = len(list(dl))
    m = dl.metrics
    assert len(m.fetch_seconds) == n == 15
    assert 0 <= m.fetch_seconds.p50 <= m.fetch_seconds.p99 <= m.fetch_seconds.max
    assert m.fetch_seconds.total == pytest.approx(sum(m.fetch_seconds.values))
    s = m.summary()
    used = [x for x in ds.shards if x.num_samples]  # the empty shard is never fetched
    assert s["downloads"] == 4 and s["bytes_downloaded"] == sum(x.size for x in used)
    assert s["samples"] == 59
    lines = [r.getMessage() for r in caplog.records if "data metrics" in r.getMessage()]
    assert len(lines) == 3 and "fetch_seconds_p99=" in lines[0]  # batches 5, 10, 15
    dl.close()


@pytest.mark.processes
def test_mlflow_sink(root, tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from ckptstore.data import MLflowSink

    uri = (tmp_path / "mlruns").as_uri()
    sink = MLflowSink(tracking_uri=uri, experiment="data-test")
    dl = DataLoader(_ds(root), 4, metrics_sink=sink, log_every=10, prefetch=False)
    list(dl)
    history = sink.client.get_metric_history(sink.run_id, "data/fetch_seconds_p50")
    assert [h.step for h in history] == [40, 59]  # the step is the sample cursor
    assert sink.client.get_metric_history(sink.run_id, "data/downloads")[-1].value == 4
