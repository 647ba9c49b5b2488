"""Small on-disk datasets for the data-layer tests: every sample carries its own id.

Shards are named so that sorting by path gives shard order; sample ``id`` is the sample's
index in the concatenation of the shards (the id the data order uses).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq


def _table(start: int, n: int, payload: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    cols = {"id": ids, "x": ids.astype(np.float32) / 10}
    if payload:
        cols["blob"] = [bytes([i % 251]) * payload for i in range(start, start + n)]
    return pa.table(cols)


def make_parquet(
    root: str, sizes: Sequence[int], row_group: int = 16, payload: int = 0, prefix: str = "part"
) -> list[str]:
    """One Parquet file per entry of ``sizes`` (rows), row groups of ``row_group`` rows."""
    os.makedirs(root, exist_ok=True)
    paths, start = [], 0
    for i, n in enumerate(sizes):
        path = os.path.join(root, f"{prefix}-{i:04d}.parquet")
        pq.write_table(_table(start, n, payload), path, row_group_size=max(1, row_group))
        paths.append(path)
        start += n
    return paths


def make_arrow(root: str, sizes: Sequence[int], batch: int = 16) -> list[str]:
    """One Arrow IPC file per entry of ``sizes``, record batches of ``batch`` rows."""
    os.makedirs(root, exist_ok=True)
    paths, start = [], 0
    for i, n in enumerate(sizes):
        path = os.path.join(root, f"part-{i:04d}.arrow")
        table = _table(start, n, 0)
        with pa.OSFile(path, "wb") as f, ipc.new_file(f, table.schema) as w:
            for b in table.to_batches(max_chunksize=batch):
                w.write_batch(b)
        paths.append(path)
        start += n
    return paths


def make_raw(root: str, count: int, size: int = 100) -> list[str]:
    """``count`` raw files; file i holds ``size`` bytes of value ``i % 256``."""
    os.makedirs(root, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(root, "sub" if i % 2 else "", f"f{i:04d}.bin")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(bytes([i % 256]) * size)
        paths.append(path)
    return sorted(paths, key=lambda p: os.path.relpath(p, root))
