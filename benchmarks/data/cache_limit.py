"""What a ``cache_limit`` costs per download when the shards are many small files.

    python -m benchmarks.data.cache_limit [--files 20000] [--procs 2]

Raw files read as they are make every file a shard: a download is one small GET, and with
a ``cache_limit`` each one is also a space decision under the node's budget lock. This
measures that bookkeeping alone, with no network: ``--files`` files of ``--size`` bytes on a
local directory, ``--procs`` processes (the ranks of a node) sharing one cache directory,
each fetching its share of one shuffled epoch in batches of ``--batch``. Contenders, each
on a fresh cache, alternated ``--repeat`` times:

  unlimited   no cache_limit: no space decision is made (the baseline)
  limited     cache_limit = ``--limit-frac`` of the dataset: once full, every download
              evicts (the farthest-needed shard first)

Prints, per contender, the median and min-max of the slowest process's epoch time, the
microseconds per file, and the ratio limited / unlimited.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common import (
    cell,
    load_average,
    machine_line,
    markdown_table,
    mem_gib,
    write_results,
)


def _make_files(root: str, count: int, size: int) -> None:
    for i in range(count):
        d = os.path.join(root, f"d{i % 64:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
            f.write(os.urandom(size))


def _epoch(
    root: str,
    cache: str,
    limit: int | None,
    rank: int,
    procs: int,
    batch: int,
    ready: Any,
    out: Any,
) -> None:
    from ckptstore.data import ShardedDataset

    ds = ShardedDataset(root, format="raw", cache_dir=cache, cache_limit=limit, seed=3)
    order = ds.order
    ready.wait()  # every process has listed the shards and built its order
    t0 = time.perf_counter()
    for b, cursor in enumerate(range(0, ds.num_samples, batch)):
        if b % procs == rank:
            ids = order.stream(cursor, min(batch, ds.num_samples - cursor))
            ds.fetch(ids, cursor)
    seconds = time.perf_counter() - t0
    stats = ds.cache_stats()
    ds.close()
    out.put((seconds, stats.get("downloads", 0), stats.get("evictions", 0)))


def _run(root: str, limit: int | None, procs: int, batch: int) -> tuple[float, int, int]:
    ctx = mp.get_context("spawn")
    cache = tempfile.mkdtemp(prefix="bench-cache-")
    ready, out = ctx.Barrier(procs), ctx.Queue()
    ps = [
        ctx.Process(target=_epoch, args=(root, cache, limit, r, procs, batch, ready, out))
        for r in range(procs)
    ]
    try:
        for p in ps:
            p.start()
        got = [out.get(timeout=1800) for _ in ps]
        for p in ps:
            p.join()
            if p.exitcode != 0:
                raise SystemExit(f"a fetching process failed (exit code {p.exitcode})")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return (max(g[0] for g in got), sum(g[1] for g in got), sum(g[2] for g in got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--size", type=int, default=4096, help="bytes a file")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit-frac", type=float, default=0.25)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    machine: dict[str, Any] = {"nproc": os.cpu_count(), "mem_gib": mem_gib()}
    work = tempfile.mkdtemp(prefix="bench-cache-data-")
    try:
        root = os.path.join(work, "ds")
        _make_files(root, args.files, args.size)
        limit = int(args.files * args.size * args.limit_frac)
        contenders = {"unlimited": None, "limited": limit}
        runs: dict[str, list[tuple[float, int, int]]] = {k: [] for k in contenders}
        machine["loadavg_before"] = load_average()
        for _ in range(args.repeat):
            for name, lim in contenders.items():
                runs[name].append(_run(root, lim, args.procs, args.batch))
        machine["loadavg_after"] = load_average()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = statistics.median(r[0] for r in runs["unlimited"])
    rows = []
    for name, rs in runs.items():
        secs = [r[0] for r in rs]
        med = statistics.median(secs)
        rows.append(
            [
                name,
                cell(med),
                f"{min(secs):.2f}–{max(secs):.2f}",
                cell(med / args.files * 1e6, ".0f"),
                str(rs[-1][1]),
                str(rs[-1][2]),
                cell(med / base, ".2f", "x"),
            ]
        )
    print(
        f"{args.files} files x {args.size} B, {args.procs} processes, batch {args.batch}, "
        f"limit {limit} B ({args.limit_frac:.0%}), {args.repeat} runs each"
    )
    print(
        markdown_table(
            [
                "contender",
                "epoch s (median)",
                "min–max",
                "µs a file",
                "downloads",
                "evictions",
                "vs unlimited",
            ],
            "lrrrrrr",
            rows,
        )
    )
    print(machine_line(machine))
    print(write_results("bench_data_cache", {"args": vars(args), "machine": machine, "runs": runs}))


if __name__ == "__main__":
    main()
