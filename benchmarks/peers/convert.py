"""The benchmark's datasets, written once and converted for each peer from the same rows.

- ``tokens``: Parquet shards of rows ``{id: int64, tokens: list<int32>[L]}`` (ckptstore and
  the fsspec loader read these files as they are).
- ``raw``: one file per row, ``<id>.bin``, random bytes (image-like blobs).
- MDS (Mosaic Streaming's format): ``MDSWriter`` over the same rows, shards of about the
  Parquet shard's size, no compression.
- litdata: ``optimize()`` over the same rows, chunks of about the Parquet shard's size.

Every function here is pure file work on local directories; data.vs_peers uploads
the results to the S3 server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["make_tokens", "make_raw", "to_mds", "to_litdata"]


def make_tokens(root: str, shards: int, rows: int, length: int, row_group: int) -> list[str]:
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for s in range(shards):
        ids = np.arange(s * rows, (s + 1) * rows, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=(rows, length), dtype=np.int32)
        table = pa.table({"id": ids, "tokens": pa.array(list(tokens), pa.list_(pa.int32()))})
        path = os.path.join(root, f"part-{s:05d}.parquet")
        pq.write_table(table, path, row_group_size=row_group, compression="none")
        paths.append(path)
    return paths


def make_raw(root: str, count: int, size: int) -> list[str]:
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(1)
    paths = []
    for i in range(count):
        path = os.path.join(root, f"{i:06d}.bin")
        with open(path, "wb") as f:
            f.write(rng.bytes(size))
        paths.append(path)
    return paths


def _rows(kind: str, src: str) -> Iterator[dict[str, Any]]:
    if kind == "tokens":
        for name in sorted(os.listdir(src)):
            table = pq.read_table(os.path.join(src, name))
            ids = table["id"].to_numpy()
            flat = table["tokens"].combine_chunks().flatten().to_numpy()
            tokens = flat.reshape(len(ids), -1)
            for i, t in zip(ids.tolist(), tokens):
                yield {"id": i, "tokens": np.ascontiguousarray(t)}
    else:
        for name in sorted(os.listdir(src)):
            with open(os.path.join(src, name), "rb") as f:
                yield {"id": int(name.split(".")[0]), "blob": f.read()}


def to_mds(kind: str, src: str, out: str, shard_bytes: int) -> None:
    from benchmarks.peers.contenders import import_streaming

    MDSWriter = import_streaming().MDSWriter

    columns = (
        {"id": "int64", "tokens": "ndarray:int32"}
        if kind == "tokens"
        else {
            "id": "int64",
            "blob": "bytes",
        }
    )
    with MDSWriter(out=out, columns=columns, size_limit=shard_bytes) as w:
        for row in _rows(kind, src):
            w.write({**row, "id": np.int64(row["id"])})


def _litdata_rows(arg: tuple[str, str, int, int]) -> Iterator[dict[str, Any]]:
    kind, src, lo, hi = arg
    for i, row in enumerate(_rows(kind, src)):
        if lo <= i < hi:
            yield row


def to_litdata(kind: str, src: str, out: str, shard_bytes: int, count: int) -> None:
    from litdata import optimize

    step = max(1, count // 4)
    inputs = [(kind, src, lo, min(count, lo + step)) for lo in range(0, count, step)]
    optimize(
        fn=_litdata_rows,
        inputs=inputs,
        output_dir=out,
        chunk_bytes=shard_bytes,
        num_workers=1,
    )
