"""Data layer: dataset, loader, shard cache and the data-order math they share.

    from ckptstore.data import ShardedDataset, DataLoader
    ds = ShardedDataset("s3://bucket/tokens/", format="parquet", cache_dir="/nvme/cache",
                        cache_limit="200GB", shuffle=True, seed=17)
    loader = DataLoader(ds, batch_size=32, num_workers=4)    # DCP-Stateful
    for batch in loader: ...

Many small files (``format="raw"``) read faster packed into Parquet shards ahead of
time: :func:`~ckptstore.data.pack.pack_files`.

``ckptstore.data.order`` holds the pure order functions (no I/O, no torch): which sample
the loader serves at each step, resumable exactly on any world size and worker count.
The public names below import lazily, so the order math works without torch or pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "DataLoader",
    "ShardedDataset",
    "Shard",
    "PadCollate",
    "LoaderMetrics",
    "FetchSeconds",
    "MetricsSink",
    "LoggingSink",
    "MLflowSink",
    "ScalarSink",
    "DataOrder",
    "OrderState",
    "DataOrderError",
    "sample_seed",
    "parse_size",
    "pack_files",
    "PackReport",
]

_WHERE = {
    "DataLoader": "loader",
    "ShardedDataset": "dataset",
    "Shard": "dataset",
    "PadCollate": "collate",
    "parse_size": "dataset",
    "LoaderMetrics": "metrics",
    "FetchSeconds": "metrics",
    "MetricsSink": "metrics",
    "LoggingSink": "metrics",
    "MLflowSink": "metrics",
    "ScalarSink": "metrics",
    "DataOrder": "stream",
    "OrderState": "order",
    "DataOrderError": "order",
    "sample_seed": "order",
    "pack_files": "pack",
    "PackReport": "pack",
}

if TYPE_CHECKING:
    from ckptstore.data.collate import PadCollate
    from ckptstore.data.dataset import Shard, ShardedDataset, parse_size
    from ckptstore.data.loader import DataLoader
    from ckptstore.data.metrics import (
        FetchSeconds,
        LoaderMetrics,
        LoggingSink,
        MetricsSink,
        MLflowSink,
        ScalarSink,
    )
    from ckptstore.data.order import DataOrderError, OrderState, sample_seed
    from ckptstore.data.pack import PackReport, pack_files
    from ckptstore.data.stream import DataOrder


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptstore.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ckptstore.data.{module}"), name)
    globals()[name] = value
    return value
