"""Data loader benchmark: how long does the training loop wait for data?

Three ways to feed one epoch of a Parquet dataset to a training loop that "computes" for
``--step-ms`` per batch (a sleep, so the GIL is free as in a real GPU step):

  (a) fsspec  a plain torch DataLoader over an IterableDataset that streams the shards
              straight from the store through an fsspec file (5 MiB readahead blocks),
              shards split across workers, rows shuffled within each row group
  (b) cold    ckptstore ShardedDataset + DataLoader, empty node-local cache
  (c) warm    the same, second run, cache already holding the dataset
  (0) floor   reference: workers hand over ready-made batches of the same shape from
              memory; what torch's worker-to-loop transfer alone costs on this machine

The store is the local disk behind a shaper: every request pays ``--latency-ms`` and then
streams at ``--stream-mibps`` (per request; parallel requests each get that rate, as on
S3/GCS). (a) reads through an fsspec filesystem with the same shaping; (b)/(c) through a
ckptstore ``Store`` wrapper with the same shaping.

What each number includes:
  fetch_s    sum over batches of the time the loop spent in next(loader): every stall,
             from the first batch (worker start-up included) to the last
  steady     fetch time of the batches after the first quarter of the epoch, divided by
             their wall time (fetch + step): the share of the step the loop waited once
             running. The first quarter is the first bucket of the order (C = shards / 4):
             a cold cache must fetch all of its shards before the first batch.
  samples/s  samples of the epoch / wall time of the epoch loop (not listing the dataset)
  list_s     (b)/(c): building the ShardedDataset (listing + footers), outside the loop

Run:  python -m benchmarks.data.loader            (about 1.5 min; --quick: about 20 s)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, get_worker_info

from ckptstore.config import MiB, TransferConfig
from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.engine.store import Buffer, Multipart, Part, Store
from ckptstore.stores.local import LocalStore


def shaped_sleep(nbytes: int, latency_s: float, stream_bps: float) -> None:
    time.sleep(latency_s + nbytes / stream_bps)


class ShapedStore(Store):
    """A read-only view of a local store whose every GET pays latency + bytes / bandwidth."""

    def __init__(self, inner: Store, latency_s: float, stream_bps: float) -> None:
        super().__init__(inner.url)
        self.inner, self.latency_s, self.stream_bps = inner, latency_s, stream_bps

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        data = self.inner.get(path, start, end)
        shaped_sleep(len(data), self.latency_s, self.stream_bps)
        return data

    def size(self, path: str) -> int:
        time.sleep(self.latency_s)
        return self.inner.size(path)

    def find(self, prefix: str = "") -> list[str]:
        time.sleep(self.latency_s)
        return self.inner.find(prefix)

    def listdir(self, prefix: str = "") -> list[str]:
        return self.inner.listdir(prefix)

    def child(self, prefix: str) -> Store:
        return ShapedStore(self.inner.child(prefix), self.latency_s, self.stream_bps)

    def _read_only(self, *args: Any) -> Any:
        raise PermissionError("the benchmark store is read-only")

    def put(self, path: str, data: Buffer) -> None:
        self._read_only()

    def put_if_absent(self, path: str, data: Buffer) -> None:
        self._read_only()

    def delete(self, path: str) -> None:
        self._read_only()

    def begin_multipart(self, path: str) -> Multipart:
        return self._read_only()

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        return self._read_only()

    def complete_multipart(self, upload: Multipart, parts: Any) -> None:
        self._read_only()

    def abort_multipart(self, upload: Multipart) -> None:
        self._read_only()

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        return []


class ShapedFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: ShapedFS = self.fs
        with open(os.path.join(fs.root, self.path), "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        shaped_sleep(len(data), fs.latency_s, fs.stream_bps)
        return data


class ShapedFS(AbstractFileSystem):
    """fsspec filesystem over a local directory with the same shaping as ShapedStore."""

    protocol = "shaped"

    def __init__(self, root: str, latency_s: float, stream_bps: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.root, self.latency_s, self.stream_bps = root, latency_s, stream_bps

    def info(self, path: str, **kw: Any) -> dict[str, Any]:
        time.sleep(self.latency_s)
        size = os.path.getsize(os.path.join(self.root, path))
        return {"name": path, "size": size, "type": "file"}

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kw: Any) -> Any:
        return ShapedFile(self, path, mode, block_size=block_size or "default", **kw)


class FsspecShards(IterableDataset):
    """Baseline (a): each worker streams its share of the shards, row group by row group."""

    def __init__(self, fs: ShapedFS, paths: list[str], seed: int) -> None:
        self.fs, self.paths, self.seed = fs, paths, seed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        paths = list(self.paths)
        random.Random(self.seed).shuffle(paths)
        rng = random.Random(self.seed * 1000 + w)
        for path in paths[w::n]:
            with self.fs.open(path, "rb") as f:
                pf = pq.ParquetFile(f)
                for g in range(pf.num_row_groups):
                    rows = pf.read_row_group(g).to_pylist()
                    rng.shuffle(rows)
                    yield from rows


class InMemoryBatches(IterableDataset):
    """Floor (0): workers hand over ready-made batches of the same shape; no I/O at all."""

    def __init__(self, batches: int, batch: int, payload: int) -> None:
        self.batches, self.batch, self.payload = batches, batch, payload

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        blob = [bytes(self.payload)] * self.batch
        for _ in range(w, self.batches, n):
            yield {"id": torch.arange(self.batch), "blob": blob}


def make_dataset(root: str, shards: int, rows: int, payload: int, row_group: int) -> None:
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    for s in range(shards):
        ids = np.arange(s * rows, (s + 1) * rows)
        blob = [rng.bytes(payload) for _ in range(rows)]
        table = pa.table({"id": ids, "blob": blob})
        pq.write_table(table, os.path.join(root, f"part-{s:05d}.parquet"), row_group_size=row_group)


def train_epoch(loader: Any, step_s: float) -> dict[str, float]:
    """The training loop: time spent in next() per batch, then a simulated step."""
    waits: list[float] = []
    samples = 0
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t)
        samples += len(batch["id"])
        time.sleep(step_s)
    wall = time.perf_counter() - t0
    skip = len(waits) // 4
    steady = waits[skip:]
    steady_wall = sum(steady) + step_s * len(steady)
    return {
        "fetch_s": sum(waits),
        "steady": sum(steady) / steady_wall if steady_wall else 0.0,
        "samples_s": samples / wall,
        "samples": samples,
        "wall_s": wall,
    }


def run_fsspec(args: argparse.Namespace, root: str, seed: int) -> dict[str, float]:
    fs = ShapedFS(root, args.latency_ms / 1e3, args.stream_mibps * MiB, skip_instance_cache=True)
    paths = sorted(p for p in os.listdir(root) if p.endswith(".parquet"))
    loader = TorchDataLoader(
        FsspecShards(fs, paths, seed), batch_size=args.batch, num_workers=args.workers
    )
    return train_epoch(loader, args.step_ms / 1e3)


def run_floor(args: argparse.Namespace) -> dict[str, float]:
    batches = args.shards * args.rows // args.batch
    loader = TorchDataLoader(
        InMemoryBatches(batches, args.batch, args.payload),
        batch_size=None,
        num_workers=args.workers,
    )
    return train_epoch(loader, args.step_ms / 1e3)


def run_ckptstore(args: argparse.Namespace, root: str, cache: str, seed: int) -> dict[str, float]:
    store = ShapedStore(LocalStore(root), args.latency_ms / 1e3, args.stream_mibps * MiB)
    t = time.perf_counter()
    ds = ShardedDataset(
        store,
        format="parquet",
        cache_dir=cache,
        seed=seed,
        transfer_config=TransferConfig(part_size=args.part_kib * 1024, concurrency=16),
    )
    list_s = time.perf_counter() - t
    loader = DataLoader(
        ds, args.batch, num_workers=args.workers, prefetch_concurrency=args.prefetch
    )
    out = train_epoch(loader, args.step_ms / 1e3)
    out["list_s"] = list_s
    out["downloads"] = loader.metrics.summary()["downloads"]
    loader.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--rows", type=int, default=256, help="rows per shard")
    p.add_argument("--payload", type=int, default=8192, help="bytes per row")
    p.add_argument("--row-group", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=100.0, help="simulated compute per batch")
    p.add_argument("--latency-ms", type=float, default=30.0, help="per request")
    p.add_argument("--stream-mibps", type=float, default=1.0, help="per request stream")
    p.add_argument("--part-kib", type=int, default=1024, help="ckptstore ranged GET size")
    p.add_argument("--prefetch", type=int, default=4, help="shards prefetched at once")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="8 shards, 1 repeat")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.repeat = 8, 1

    shard_mib = args.rows * args.payload / MiB
    need = args.batch * args.payload / (args.step_ms / 1e3) / MiB
    print(
        f"dataset: {args.shards} shards x {args.rows} rows x {args.payload} B "
        f"({shard_mib:.1f} MiB/shard, {args.shards * shard_mib:.0f} MiB); batch {args.batch}, "
        f"{args.workers} workers, step {args.step_ms:g} ms -> the loop consumes {need:.1f} MiB/s"
    )
    print(
        f"store: {args.latency_ms:g} ms per request, {args.stream_mibps:g} MiB/s per stream "
        f"(fsspec: one stream per worker = {args.workers * args.stream_mibps:g} MiB/s)"
    )
    work = tempfile.mkdtemp(prefix="ckptstore-bench-data-")
    results: dict[str, list[dict[str, float]]] = {"floor": [], "fsspec": [], "cold": [], "warm": []}
    try:
        root = os.path.join(work, "ds")
        make_dataset(root, args.shards, args.rows, args.payload, args.row_group)
        for r in range(args.repeat):
            cache = os.path.join(work, f"cache{r}")
            results["floor"].append(run_floor(args))
            results["fsspec"].append(run_fsspec(args, root, r))
            results["cold"].append(run_ckptstore(args, root, cache, r))
            results["warm"].append(run_ckptstore(args, root, cache, r))
            print(f"  repeat {r + 1}/{args.repeat} done", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in results.items()}
    base = med["fsspec"]
    print(f"\nmedians of {args.repeat} run(s), one epoch each ({int(base['samples'])} samples)")
    print(f"{'':8} {'fetch_s':>8} {'vs (a)':>7} {'steady':>7} {'samples/s':>10} {'vs (a)':>7}")
    for name, label in (("floor", "(0)"), ("fsspec", "(a)"), ("cold", "(b)"), ("warm", "(c)")):
        m = med[name]
        print(
            f"{label} {name:<4} {m['fetch_s']:8.2f} {m['fetch_s'] / base['fetch_s']:7.2f} "
            f"{m['steady'] * 100:6.1f}% {m['samples_s']:10.0f} "
            f"{m['samples_s'] / base['samples_s']:6.2f}x"
        )
    ideal = args.batch / (args.step_ms / 1e3)
    print(
        f"compute-bound ceiling: {ideal:.0f} samples/s; listing (b): {med['cold']['list_s']:.2f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": results, "medians": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
