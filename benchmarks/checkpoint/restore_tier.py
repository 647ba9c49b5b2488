"""Restore from the local tier vs from the remote store, on a shaped link.

    python -m benchmarks.checkpoint.restore_tier            # 512 MiB, 2 gloo ranks, 5 repeats
    python -m benchmarks.checkpoint.restore_tier --quick    # 128 MiB, 3 repeats
    python -m benchmarks.checkpoint.restore_tier --link-mbps 50 --size-mib 256

It starts its own SeaweedFS and a shaped link in front of it (``benchmarks/shaped_link.py``: every
connection capped at ``--link-mbps``, ``--link-latency-ms`` added one way), then on every
rank saves one checkpoint with ``CheckpointManager(root, local_tier_dir=...)`` (the local tier
here is a temp directory on this machine's disk, standing in for a node's NVMe; the root is
``s3://`` through the shaped link). Then, alternating which goes first in each repeat:

  local tier   ``CheckpointManager(root, local_tier_dir=...).restore(state)``: the data comes
               from the local copy; the marker, manifest and ``.metadata`` still come from
               the remote (the remote decides what is committed).
  local, cold  the same after ``posix_fadvise(DONTNEED)`` on every local file: the page
               cache no longer holds them, as after a node's reboot (clean pages only; the
               save was fsynced).
  remote       ``CheckpointManager(root).restore(state)``: everything through the link.
  plain read   after the same eviction, the ranks read the local tier's files (every
               ``world``-th file each, one after another, plain ``readinto``, no checks): what
               reading those bytes cold costs without ckptstore (its restore reads in
               parallel, so it can be faster).

Each time is barrier -> restore -> barrier on every rank, the sample the max over ranks; every
restore is checked bitwise against the saved state (untimed) and the bytes that crossed the
shaped link during it are counted (the local restores must move only the small control
files). Output: a Markdown table (median, min–max, ratio to the remote) and JSON in
benchmarks/results/bench_restore_tier-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import (
    MiB,
    add_state_args,
    cell,
    command_line,
    exit_on_sigterm,
    load_average,
    machine_line,
    machine_load,
    markdown_table,
    rotated,
    write_results,
)

__all__ = ["main", "run", "timed_restore"]

BUCKET = "restore-tier"
MODES = ("local tier", "local, cold", "remote", "plain read")


def timed_restore(
    mgr: Any, dest: dict[str, Any], state: dict[str, Any], counters: Any, mode: str, step: int = 1
) -> tuple[float, int]:
    """Every rank: barrier -> ``mgr.restore(dest)`` -> barrier, then close ``mgr``; the
    slowest rank's seconds and the bytes that crossed the link meanwhile (``counters[1]``).
    Raises unless ``step`` came back equal to ``state`` (under ``dest["model"]``)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    before = counters[1]
    t0 = time.perf_counter()
    got = mgr.restore(dest)
    dist.barrier()
    secs = time.perf_counter() - t0
    moved = counters[1] - before
    mgr.close()
    if got != step or not all(torch.equal(dest["model"][k], v) for k, v in state.items()):
        raise RuntimeError(f"{mode}: restore returned step {got}, not {step}, or other bytes")
    out = torch.tensor([secs])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out), int(moved)


def _evict(root: str) -> None:
    """Drop ``root``'s files from the page cache (they are clean: the save fsynced them)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _read_share(root: str, rank: int, world: int) -> None:
    """Read every ``world``-th file under ``root`` (from ``rank``), whole, into one buffer."""
    paths = sorted(os.path.join(d, n) for d, _dirs, files in os.walk(root) for n in files)
    buf = bytearray(64 * MiB)
    for path in paths[rank::world]:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _rank_main(
    rank: int,
    world: int,
    url: str,
    options: dict[str, Any],
    tier_dir: str,
    mib_per_rank: int,
    tensors: int,
    repeats: int,
    counters: Any,
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from ckptstore.manager import CheckpointManager

    n = mib_per_rank * MiB // 4 // tensors
    gen = torch.Generator().manual_seed(rank)
    state = {f"r{rank}.t{i}": torch.rand(n, generator=gen) for i in range(tensors)}
    saver = CheckpointManager(
        url, storage_options=options, local_tier_dir=tier_dir, async_save=False
    )
    saver.save(1, {"model": state})
    saver.close()
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    link_bytes: dict[str, list[int]] = {m: [] for m in MODES}
    for rep in range(repeats):
        for mode in rotated(MODES, rep):
            if mode == "plain read":
                if rank == 0:
                    _evict(tier_dir)
                dist.barrier()
                t0 = time.perf_counter()
                _read_share(tier_dir, rank, world)
                dist.barrier()
                out = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(out, op=dist.ReduceOp.MAX)
                samples[mode].append(float(out))
                link_bytes[mode].append(0)
                continue
            dest = {"model": {k: torch.zeros_like(v) for k, v in state.items()}}
            mgr = CheckpointManager(
                url,
                storage_options=options,
                local_tier_dir=None if mode == "remote" else tier_dir,
            )
            if mode == "local, cold" and rank == 0:
                _evict(tier_dir)
            secs, moved = timed_restore(mgr, dest, state, counters, mode)
            samples[mode].append(secs)
            link_bytes[mode].append(moved)
    return {"samples": samples, "link_bytes_down": link_bytes}


def run(size_mib: int, world: int, repeats: int, tensors: int, mbps: float, ms: float) -> dict:
    from benchmarks.shaped_link import ShapedLink
    from harness.dist import run_distributed
    from harness.seaweedfs import SeaweedFS

    server = SeaweedFS().start()
    link = None
    tier_dir = tempfile.mkdtemp(prefix="ckptstore-tier-")
    try:
        server.create_bucket(BUCKET)
        counters = multiprocessing.get_context("spawn").RawArray("q", 2)
        link = ShapedLink(server.port, mbps=mbps, latency_ms=ms, counters=counters)
        link.start()
        options = dict(server.storage_options, endpoint_url=link.endpoint)
        before = load_average()
        t0 = time.perf_counter()
        per_rank = run_distributed(
            _rank_main,
            world,
            f"s3://{BUCKET}/ckpt",
            options,
            tier_dir,
            size_mib // world,
            tensors,
            repeats,
            counters,
            timeout=3600,
        )
        wall = time.perf_counter() - t0
        description = link.describe()
    finally:
        if link is not None:
            link.stop()
        server.stop()
        shutil.rmtree(tier_dir, ignore_errors=True)
    samples = per_rank[0]["samples"]
    remote = statistics.median(samples["remote"])
    rows = []
    for mode in MODES:
        xs = samples[mode]
        med = statistics.median(xs)
        rows.append(
            {
                "mode": mode,
                "median_s": med,
                "min_s": min(xs),
                "max_s": max(xs),
                "x_remote": med / remote,
                "speedup": remote / med,
                "link_mib_down": statistics.median(per_rank[0]["link_bytes_down"][mode]) / MiB,
            }
        )
    return {
        "size_mib": size_mib,
        "world": world,
        "repeats": repeats,
        "link": description,
        "rows": rows,
        "samples": samples,
        "machine": machine_load(before),
        "wall_s": wall,
        "command": command_line(),
    }


def table(res: dict[str, Any]) -> str:
    header = ["restore from", "median s", "min–max s", "× remote", "speed-up", "MiB over link"]
    body = [
        [
            r["mode"],
            cell(r["median_s"], ".3f"),
            f"{r['min_s']:.3f}–{r['max_s']:.3f}",
            cell(r["x_remote"]),
            cell(r["speedup"], ".1f", "x"),
            cell(r["link_mib_down"], ".1f"),
        ]
        for r in res["rows"]
    ]
    return markdown_table(header, "lrrrrr", body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_state_args(p, size_mib=512, repeats=5)
    p.add_argument("--link-mbps", type=float, default=200.0, help="shaped link, per connection")
    p.add_argument("--link-latency-ms", type=float, default=20.0, help="shaped link, one way")
    p.add_argument("--quick", action="store_true", help="128 MiB and 3 repeats")
    a = p.parse_args(argv)
    size = a.size_mib or (128 if a.quick else 512)
    repeats = a.repeats or (3 if a.quick else 5)
    exit_on_sigterm()
    res = run(size, a.world, repeats, a.tensors_per_rank, a.link_mbps, a.link_latency_ms)
    print(f"state {size} MiB on {a.world} ranks; {repeats} repeats; link: {res['link']}\n")
    print(table(res))
    print(f"\nwall {res['wall_s']:.0f} s; {machine_line(res['machine'])}")
    print(f"JSON: {os.path.relpath(write_results('bench_restore_tier', res))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
