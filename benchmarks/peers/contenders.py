"""The data loaders of data.vs_peers, each built the way its docs say to.

Every contender reads the same rows from the same S3 server through the same shaped link,
and gives the training loop batches with an ``id`` tensor (the row's global id), so that the
benchmark can count what each rank trained on.

- ``ckptstore``: ``ShardedDataset`` (Parquet shards, or raw files) + ``DataLoader``.
- ``ckptstore-packed`` (raw only): the same over the raw files packed into Parquet shards
  by ``ckptstore.data.pack.pack_files`` (a ``path`` and a ``data`` column).
- ``mosaic``: Mosaic Streaming ``StreamingDataset`` over MDS shards converted from the same
  rows + ``StreamingDataLoader`` (resumable).
- ``litdata``: litdata ``StreamingDataset`` over ``optimize()``d chunks +
  ``StreamingDataLoader`` (resumable).
- ``fsspec``: a plain torch ``DataLoader`` over an ``IterableDataset`` that streams the
  Parquet shards (or raw files) through s3fs, split over ranks and workers, rows shuffled
  within a row group. It has no state: a resume starts the epoch again.
- ``memory`` (the floor, not a peer): a plain torch ``DataLoader`` over rows of the same
  shapes already in each rank's memory (a map-style ``Dataset``, ``DistributedSampler``): no
  storage, no decode, only torch's worker-to-loop hand-off on this machine. Its steady wait
  is what a loader using that hand-off cannot go below here; it has no resume.

Call order (in a rank process, torch.distributed initialised)::

    c = CONTENDERS[name](spec)          # spec: dataset urls, options, batch, workers, cache
    loader = c.loader(state)            # state: what c.state(loader) returned, or None
    for batch in loader: ... batch["id"] ...
    c.state(loader)                     # picklable; None where there is none
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["CONTENDERS", "import_streaming", "raw_id"]


def import_streaming() -> Any:
    """Mosaic Streaming's package, without its vision datasets.

    ``streaming/__init__.py`` imports ``streaming.vision`` (CIFAR, ImageNet, ...), which
    imports torchvision; setup.sh leaves torchvision out (PyPI's wheel needs CUDA torch
    libraries). Nothing here uses those datasets, so an empty ``streaming.vision`` module is
    registered first; ``StreamingDataset``, ``StreamingDataLoader`` and ``MDSWriter`` are
    Mosaic's own, unchanged.
    """
    import sys
    import types

    if "streaming" not in sys.modules:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def raw_id(path: str) -> int:
    """A raw file ``.../000123.bin`` holds row 123."""
    return int(os.path.basename(path).split(".")[0])


def _raw_sample(sample: dict[str, Any], seed: int) -> dict[str, Any]:
    data = sample["data"]
    return {
        "id": raw_id(sample["path"]),
        "blob": torch.frombuffer(bytearray(data), dtype=torch.uint8),
    }


class Contender:
    """``phases``: seconds of each step of ``loader()`` (the cold-start breakdown)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.phases: dict[str, float] = {}
        self.spec = spec
        self.batch = spec["batch"]
        self.workers = spec["workers"]
        self.kind = spec["kind"]  # "tokens" (Parquet rows) or "raw" (files)
        self.cache = spec["cache"]

    def state(self, loader: Any) -> Any:
        return loader.state_dict()


class Ckptstore(Contender):
    url_key, fmt = "ckptstore", ""  # "": Parquet for tokens, raw files for raw

    def columns(self) -> list[str] | None:
        return ["id", "tokens"] if self.kind == "tokens" else None

    def loader(self, state: Any) -> Any:
        t = time.perf_counter()
        from ckptstore.data import DataLoader, ShardedDataset
        from ckptstore.stores import open_store

        s = self.spec
        self.phases["import_s"] = time.perf_counter() - t
        t = time.perf_counter()
        open_store(s["urls"][self.url_key], s["s3"]).close()  # the client's own imports, timed
        self.phases["client_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ds = ShardedDataset(
            s["urls"][self.url_key],
            storage_options=s["s3"],
            format=self.fmt or ("parquet" if self.kind == "tokens" else "raw"),
            cache_dir=self.cache,
            seed=s["seed"],
            transform=_raw_sample if self.kind == "raw" else None,
            columns=self.columns(),
        )
        self.phases["listing_s"] = time.perf_counter() - t  # rank 0 lists, then a broadcast
        t = time.perf_counter()
        dl = DataLoader(
            ds, self.batch, self.workers, prefetch_concurrency=s.get("ckptstore_prefetch")
        )
        if state is not None:
            dl.load_state_dict(state)
        self.phases["loader_s"] = time.perf_counter() - t
        return dl


class CkptstorePacked(Ckptstore):
    """ckptstore over the raw files packed into Parquet shards (``ckptstore.data.pack``):
    the like-for-like row against litdata's ``optimize()``d chunks and Mosaic's MDS."""

    url_key, fmt = "ckptstore-packed", "parquet"

    def columns(self) -> list[str] | None:
        return ["path", "data"]


class Mosaic(Contender):
    def loader(self, state: Any) -> Any:
        streaming = import_streaming()
        StreamingDataLoader, StreamingDataset = (
            streaming.StreamingDataLoader,
            streaming.StreamingDataset,
        )
        s = self.spec
        ds = StreamingDataset(
            remote=s["urls"]["mosaic"],
            local=self.cache,  # one per node, shared by its ranks (as Mosaic requires)
            shuffle=True,
            shuffle_seed=s["seed"],
            batch_size=self.batch,
            num_canonical_nodes=1,  # one node; keeps the order across world sizes
        )
        # Local rank 0 downloaded index.json just now with a boto3 client that its stream
        # keeps (``Stream._downloader``), and the DataLoader workers forked next inherit
        # it, pooled keep-alive socket and all: two workers then send their GETs on one
        # TCP connection and read each other's responses. That was the "buffer size must
        # be a multiple of element size" of earlier runs: a cached shard held another
        # GET's "HTTP/1.1 206 Partial Content" header and lacked 8 KiB of its own bytes
        # (the MDS column encoding is as Mosaic documents it). Dropping the rank's client
        # before the fork (the downloader's own clean_up, which Mosaic calls between
        # retries) makes each worker build its own, as it does in every other rank.
        for stream in ds.streams:
            stream._downloader.clean_up()
        dl = StreamingDataLoader(
            ds, batch_size=self.batch, num_workers=self.workers, collate_fn=_collate
        )
        if state is not None:
            dl.load_state_dict(state)
        return dl


class Litdata(Contender):
    def loader(self, state: Any) -> Any:
        import litdata
        from litdata.streaming import downloader

        # The shaped link is plain http on 127.0.0.1; litdata's obstore (Rust) S3 client
        # refuses http unless told. On real S3 (https) nothing of this is needed.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]
        s = self.spec
        ds = litdata.StreamingDataset(
            s["urls"]["litdata"],
            cache_dir=self.cache,
            shuffle=True,
            seed=s["seed"],
            storage_options={"endpoint_url": s["s3"]["endpoint_url"]},
        )
        dl = litdata.StreamingDataLoader(
            ds, batch_size=self.batch, num_workers=self.workers, collate_fn=_collate
        )
        if state is not None:
            dl.load_state_dict(state)
        return dl


def _collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Peers' rows (``id`` int, ``tokens`` or ``blob`` array/bytes) into one batch."""
    out: dict[str, Any] = {"id": torch.tensor([int(r["id"]) for r in rows])}
    if "tokens" in rows[0]:
        out["tokens"] = torch.from_numpy(np.stack([np.asarray(r["tokens"]) for r in rows]))
    else:
        out["blob"] = [r["blob"] for r in rows]
    return out


class _FsspecShards(IterableDataset):
    """Each (rank, worker) streams its share of the files, in a seeded shuffled order."""

    def __init__(self, spec: dict[str, Any], rank: int, world: int) -> None:
        self.spec, self.rank, self.world = spec, rank, world

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import pyarrow.parquet as pq
        import s3fs

        s = self.spec
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        fs = s3fs.S3FileSystem(
            key=s["s3"]["key"],
            secret=s["s3"]["secret"],
            endpoint_url=s["s3"]["endpoint_url"],
            skip_instance_cache=True,
        )
        paths = sorted(fs.find(s["urls"]["fsspec"]))
        random.Random(s["seed"]).shuffle(paths)
        me, every = self.rank * n + w, self.world * n
        rng = random.Random(s["seed"] * 1000 + me)
        for path in paths[me::every]:
            if s["kind"] == "raw":
                with fs.open(path, "rb") as f:
                    yield {"id": raw_id(path), "blob": f.read()}
                continue
            with fs.open(path, "rb", block_size=5 << 20) as f:
                pf = pq.ParquetFile(f)
                for g in range(pf.num_row_groups):
                    rows = pf.read_row_group(g, columns=["id", "tokens"]).to_pylist()
                    rng.shuffle(rows)
                    for r in rows:
                        yield {"id": r["id"], "tokens": np.asarray(r["tokens"], np.int32)}


class Fsspec(Contender):
    def loader(self, state: Any) -> Any:
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        return torch.utils.data.DataLoader(
            _FsspecShards(self.spec, rank, world),
            batch_size=self.batch,
            num_workers=self.workers,
            collate_fn=_collate,
        )

    def state(self, loader: Any) -> Any:
        return None  # nothing to resume from: the epoch starts again


class _InMemory(torch.utils.data.Dataset):
    """``count`` rows of the dataset's shapes, made once in the rank (workers inherit them)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        rng = np.random.default_rng(0)
        shape = (spec["count"], spec["row_elems"])
        self.kind = spec["kind"]
        if self.kind == "tokens":
            self.rows = rng.integers(0, 50_000, size=shape, dtype=np.int32)
        else:
            self.rows = rng.integers(0, 256, size=shape, dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.kind == "tokens":
            return {"id": i, "tokens": self.rows[i]}
        return {"id": i, "blob": torch.from_numpy(self.rows[i])}


class Memory(Contender):
    def loader(self, state: Any) -> Any:
        from torch.utils.data.distributed import DistributedSampler

        ds = _InMemory(self.spec)
        sampler = DistributedSampler(ds, shuffle=True, seed=self.spec["seed"])
        return torch.utils.data.DataLoader(
            ds,
            batch_size=self.batch,
            sampler=sampler,
            num_workers=self.workers,
            collate_fn=_collate,
        )

    def state(self, loader: Any) -> Any:
        return None  # the floor is measured for its waits only


CONTENDERS: dict[str, type[Contender]] = {
    "ckptstore": Ckptstore,
    "ckptstore-packed": CkptstorePacked,
    "mosaic": Mosaic,
    "litdata": Litdata,
    "fsspec": Fsspec,
    "memory": Memory,
}
