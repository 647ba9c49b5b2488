"""A random per-sample transform across resumes; metrics to MLflow and a scalar hook."""

from __future__ import annotations

import numpy as np
import pytest

from ckptstore.data import DataLoader, ScalarSink, ShardedDataset

from .datasets import make_parquet

SIZES = [11, 9, 14, 7]  # N = 41


def augment(sample, seed):
    """A random crop offset and noise: all randomness drawn from ``seed`` alone."""
    rng = np.random.default_rng(seed)
    return {
        "id": sample["id"],
        "crop": int(rng.integers(0, 1000)),
        "noise": rng.standard_normal(4).astype(np.float32),
    }


def _ds(root, **kw) -> ShardedDataset:
    return ShardedDataset(str(root / "ds"), cache_dir=str(root / "cache"), seed=23, buckets=2, **kw)


def _run(loaders, steps=None) -> dict[tuple[int, int], tuple[int, list[float]]]:
    """(epoch, sample id) -> (crop, noise) of everything handed to training, in lockstep."""
    its = [iter(dl) for dl in loaders]
    out: dict[tuple[int, int], tuple[int, list[float]]] = {}
    n = 0
    while steps is None or n < steps:
        try:
            batches = [next(it) for it in its]
        except StopIteration:
            break
        for dl, b in zip(loaders, batches):
            if isinstance(b, list):
                continue
            epoch = (dl.cursor - 1) // dl.dataset.num_samples
            for i, c, z in zip(b["id"].tolist(), b["crop"].tolist(), b["noise"].tolist()):
                assert (epoch, i) not in out
                out[(epoch, i)] = (c, z)
        n += 1
    return out


@pytest.mark.processes
def test_random_transform_is_the_same_after_resume_on_another_layout(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), SIZES, row_group=4)
    ds = _ds(tmp_path, transform=augment)

    def loaders(world, batch, workers):
        return [
            DataLoader(ds, batch, workers, rank=r, world_size=world, prefetch=False)
            for r in range(world)
        ]

    whole = _run(loaders(1, 5, 0), None)  # epoch 0, uninterrupted, one rank
    first = loaders(2, 3, 2)  # the interrupted run: 2 ranks x 2 workers, 4 steps
    got = _run(first, 4)
    state = first[0].state_dict()
    assert state["cursor"] == 4 * 2 * 3
    resumed = loaders(3, 2, 1)  # resume on 3 ranks, batch 2, one worker each
    for dl in resumed:
        dl.load_state_dict(state)
    got.update(_run(resumed))
    assert sorted(i for _, i in got) == list(range(41))  # exactly once
    for key, (crop, noise) in got.items():
        assert crop == whole[key][0] and noise == pytest.approx(whole[key][1])
    nxt = _run(resumed)  # epoch 1: other draws for the same samples
    assert sum(nxt[(1, i)][0] != got[(0, i)][0] for i in range(41)) > 30
    ds.close()


@pytest.mark.processes
def test_metrics_reach_mlflow_file_store_and_a_scalar_hook(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from ckptstore.data import MLflowSink

    make_parquet(str(tmp_path / "ds"), SIZES, row_group=4, payload=200)
    ds = _ds(tmp_path)
    uri = (tmp_path / "mlruns").as_uri()
    mlflow_sink = MLflowSink(tracking_uri=uri, experiment="data-metrics")
    scalars: list[tuple[str, float, int]] = []

    class Both:  # one loader, two sinks: MLflow and a TensorBoard-style add_scalar
        def __init__(self) -> None:
            self.hook = ScalarSink(lambda tag, v, step: scalars.append((tag, v, step)))

        def log(self, metrics, step) -> None:
            mlflow_sink.log(metrics, step)
            self.hook.log(metrics, step)

    limit = 2 * max(s.size for s in ds.shards) + 64  # two shards fit: evictions and misses
    ds = _ds(tmp_path, cache_limit=limit)
    dl = DataLoader(ds, 4, num_workers=2, metrics_sink=Both(), log_every=4, prefetch=False)
    for _ in range(2):
        for _ in dl:
            pass
    summary = dl.metrics.summary()
    assert summary["cache_misses"] >= 4 and summary["cache_hits"] >= 1
    assert summary["evictions"] >= 1
    client, run = mlflow_sink.client, mlflow_sink.run_id
    for name in ("cache_hits", "cache_misses", "downloads", "evictions", "bytes_downloaded"):
        history = client.get_metric_history(run, f"data/{name}")
        assert history[-1].value == summary[name] and history[-1].step == 82
    p50 = client.get_metric_history(run, "data/fetch_seconds_p50")
    assert [h.step for h in p50] == [s for t, _, s in scalars if t == "data/fetch_seconds_p50"]
    assert p50[-1].step == 82 and all(h.value >= 0 for h in p50)
    tags = {t for t, _, _ in scalars}
    assert {"data/fetch_seconds_p99", "data/cache_hits", "data/wait_fraction"} <= tags
    reopened = MLflowSink(run_id=run, tracking_uri=uri)  # a resumed job logs to the same run
    reopened.log({"cache_hits": 1.0}, 90)
    assert client.get_metric_history(run, "data/cache_hits")[-1].step == 90
    dl.close()
