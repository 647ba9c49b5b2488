"""Read-once restore against the number of ranks: what the store serves, and how long it takes.

    python -m benchmarks.checkpoint.read_once            # 256 MiB, 1/2/4 gloo ranks, 2 repeats
    python -m benchmarks.checkpoint.read_once --quick    # 32 MiB, 2 repeats
    python -m benchmarks.checkpoint.read_once --worlds 1,2 --contenders shared,ckptstore
    python -m benchmarks.checkpoint.read_once --worlds 2,4 --memory-budget-mib 64   # batches
    python -m benchmarks.checkpoint.read_once --worlds 4 --nodes 2 --contenders shared
    python -m benchmarks.checkpoint.read_once --plot-only benchmarks/results/<run>.json

SeaweedFS behind the shaped link of ``restore_tier`` (here also counting GET requests). A
DDP-like state (``--tensors`` replicated float32 tensors, the same on every rank) is saved
once with ckptstore on 2 ranks; then, in fresh gloo processes for every (repeat, N, contender),
contenders alternated, each of N ranks loads the whole state with ``dcp.load`` through:

  shared       ``CkptReader(share_group=WORLD)``: a range several ranks need is read by one
               owner and sent over the group (#37; what ``CheckpointManager.restore`` does on
               an object store).
  ckptstore    ``CkptReader`` alone: every rank reads every range it needs.
  FsspecReader torch's stock reader over s3fs (the checkpoint is stock DCP plus ckptstore's
               manifest and marker, which stock ignores).
  s3torch      s3torchconnector's ``S3StorageReader`` (CRT client, path-style addressing).

Each time is barrier -> build the reader, load -> barrier, the max over ranks; "first item" and
"last item" are when the load hands the planner its first and its last tensor (or bytes),
from the barrier before the load (max over ranks): how soon a loader that consumed items as
they land could start (#37, "stream the load"), and when the reads end. Bytes and GETs are what
crossed the link meanwhile (every rank, all files); "peak RSS" is how far the load raised a
rank's resident memory above what it held before (its targets included; max over ranks);
"CPU s" the CPU time of the ranks' processes during the load, summed over ranks (the link's
and SeaweedFS's apart): on a machine whose cores the ranks share, the figure load does not move.
"cores busy" is the whole machine's busy CPU seconds (``/proc/stat``: the ranks, SeaweedFS and
the link) per second of the restore: near ``nproc``, the restore is bound by the cores.
``--memory-budget-mib`` sets ckptstore's ``TransferConfig.memory_budget`` (a shared batch's
bytes). ``--nodes K`` splits the ranks into K simulated nodes (the node key replaced in the
ranks, as tests/dcp/test_shared_read.py does): a part then crosses gloo once to each other
node and moves through ``/dev/shm`` within one. Every load is checked bitwise (untimed).
Output: Markdown table, JSON (benchmarks/results/bench_read_once-*.json) and
benchmarks/figures/read_once.png (time and bytes against N).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.common import (
    FIGURES_DIR,
    MiB,
    cell,
    command_line,
    current_rss_mib,
    exit_on_sigterm,
    load_average,
    machine_busy_s,
    machine_line,
    machine_load,
    markdown_table,
    peak_rss_mib,
    reset_peak,
    rotated,
    write_results,
)

__all__ = ["main", "run"]

BUCKET = "read-once"
REGION = "us-east-1"
CONTENDERS = ("shared", "ckptstore", "FsspecReader", "s3torch")
SAVE_WORLD = 2
STYLES = ("-", "--", ":", "-.")  # lines that coincide (the bytes of the unshared) stay visible


def _state(size_mib: int, tensors: int) -> dict[str, Any]:
    """``tensors`` float32 tensors of ``size_mib`` in all, the same on every rank (seeded)."""
    import torch

    n = size_mib * MiB // 4 // tensors
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.rand(n, generator=g) for i in range(tensors)}


def _save(rank: int, world: int, url: str, options: dict, size_mib: int, tensors: int) -> None:
    import ckptstore

    ckptstore.save(_state(size_mib, tensors), url, storage_options=options)


def _planner() -> Any:
    """A ``DefaultLoadPlanner`` that notes when it is handed its first and its last tensor
    or bytes (``perf_counter``; None until then)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class FirstItem(DefaultLoadPlanner):
        first: float | None = None
        last: float | None = None

        def _note(self) -> None:
            self.last = time.perf_counter()
            if self.first is None:
                self.first = self.last

        def commit_tensor(self, read_item: Any, tensor: Any) -> None:
            self._note()
            super().commit_tensor(read_item, tensor)

        def load_bytes(self, read_item: Any, value: Any) -> None:
            self._note()
            super().load_bytes(read_item, value)

    return FirstItem()


def _reader(contender: str, url: str, options: dict, budget_mib: int) -> Any:
    import torch.distributed as dist

    if contender in ("shared", "ckptstore"):
        from ckptstore.config import TransferConfig
        from ckptstore.dcp.reader import CkptReader

        config = TransferConfig()
        if budget_mib:
            config = TransferConfig(
                part_size=min(config.part_size, budget_mib * MiB), memory_budget=budget_mib * MiB
            )
        group = dist.group.WORLD if contender == "shared" else None
        return CkptReader(url, storage_options=options, config=config, share_group=group)
    if contender == "FsspecReader":
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        from benchmarks.objstore.contenders import CLIENT_CONFIG

        return FsspecReader(url, **options, config_kwargs=dict(CLIENT_CONFIG))
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    from benchmarks.objstore.contenders import import_s3torch

    s3dcp, _ = import_s3torch()
    client = S3Client(
        REGION,
        endpoint=options["endpoint_url"],
        s3client_config=S3ClientConfig(force_path_style=True),
    )
    r = s3dcp.S3StorageReader(REGION, url)
    r.fs = s3dcp.S3FileSystem(REGION, s3_client=client, reader_constructor=r._reader_constructor)
    return r


def _restore(
    rank: int,
    world: int,
    contender: str,
    url: str,
    options: dict,
    size_mib: int,
    tensors: int,
    budget_mib: int,
    counters: Any,
    nodes: int = 1,
) -> dict[str, Any]:
    """Every rank: barrier -> reader, ``dcp.load`` -> barrier; rank 0 reads the link."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    if nodes > 1:  # simulated nodes: which ranks share /dev/shm (the seam the tests use)
        from ckptstore.dcp import node_segments

        node = rank * min(nodes, world) // world
        node_segments.node_key = lambda: ("simulated", node)
    want = _state(size_mib, tensors)
    dest = {k: torch.zeros_like(v) for k, v in want.items()}
    if contender == "s3torch":  # its import (and tenacity's stand-in) untimed
        from benchmarks.objstore.contenders import import_s3torch

        import_s3torch()
    else:  # so is s3fs's (0.3 s here): a restarted job imports it before its restore
        import s3fs  # noqa: F401
    planner = _planner()
    reset_peak()
    held = current_rss_mib()
    dist.barrier()
    down, gets = counters[1], counters[2]
    t0, cpu, busy = time.perf_counter(), time.process_time(), machine_busy_s()
    dcp.load(dest, storage_reader=_reader(contender, url, options, budget_mib), planner=planner)
    dist.barrier()
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu
    cores = (machine_busy_s() - busy) / secs  # the whole machine: ranks, server, link
    rss = peak_rss_mib() - held
    down, gets = counters[1] - down, counters[2] - gets
    first, last = ((t or time.perf_counter()) - t0 for t in (planner.first, planner.last))
    if not all(torch.equal(dest[k], v) for k, v in want.items()):
        raise RuntimeError(f"{contender} on {world} ranks: the load differs from the save")
    out = torch.tensor([secs, first, last, rss])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    cpus = torch.tensor([cpu])
    dist.all_reduce(cpus)
    return {
        "cpu_s": float(cpus),
        "cores_busy": cores,
        "s": float(out[0]),
        "first_s": float(out[1]),
        "last_s": float(out[2]),
        "rss_mib": float(out[3]),
        "bytes_down": down,
        "gets": gets,
    }


def run(
    size_mib: int,
    tensors: int,
    worlds: list[int],
    contenders: tuple[str, ...],
    repeats: int,
    mbps: float,
    ms: float,
    budget_mib: int = 0,
    nodes: int = 1,
) -> dict[str, Any]:
    from benchmarks.shaped_link import ShapedLink
    from harness.dist import run_distributed
    from harness.seaweedfs import SeaweedFS

    server = SeaweedFS().start()
    link = None
    samples: dict[str, dict[int, list[dict[str, Any]]]] = {
        c: {n: [] for n in worlds} for c in contenders
    }
    before = load_average()
    t0 = time.perf_counter()
    try:
        server.create_bucket(BUCKET)
        counters = multiprocessing.get_context("spawn").RawArray("q", 3)
        link = ShapedLink(server.port, mbps=mbps, latency_ms=ms, counters=counters, count_gets=True)
        link.start()
        options = dict(server.storage_options, endpoint_url=link.endpoint)
        url = f"s3://{BUCKET}/ckpt"
        run_distributed(_save, SAVE_WORLD, url, options, size_mib, tensors, timeout=3600)
        env = {  # s3torchconnector's CRT client takes its credentials from the environment
            "AWS_ACCESS_KEY_ID": options["key"],
            "AWS_SECRET_ACCESS_KEY": options["secret"],
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        for rep in range(repeats):
            for i, n in enumerate(worlds):
                for c in rotated(contenders, rep + i):
                    got = run_distributed(
                        _restore, n, c, url, options, size_mib, tensors, budget_mib, counters,
                        nodes,
                        timeout=3600, env=env,
                    )  # fmt: skip
                    samples[c][n].append(got[0])
                    print(f"  {c} on {n}: {got[0]['s']:.2f} s", file=sys.stderr, flush=True)
        description = link.describe()
    finally:
        if link is not None:
            link.stop()
        server.stop()
    wall = time.perf_counter() - t0
    rows = []
    for c in contenders:
        base = statistics.median(x["s"] for x in samples[c][worlds[0]])
        for n in worlds:
            xs = samples[c][n]
            med = statistics.median(x["s"] for x in xs)
            down = statistics.median(x["bytes_down"] for x in xs)
            rows.append(
                {
                    "contender": c,
                    "world": n,
                    "median_s": med,
                    "min_s": min(x["s"] for x in xs),
                    "max_s": max(x["s"] for x in xs),
                    "first_s": statistics.median(x["first_s"] for x in xs),
                    "last_s": statistics.median(x["last_s"] for x in xs),
                    "x_time_n1": med / base,
                    "mib_down": down / MiB,
                    "x_checkpoint": down / (size_mib * MiB),
                    "gets": statistics.median(x["gets"] for x in xs),
                    "rss_mib": max(x["rss_mib"] for x in xs),
                    "cpu_s": statistics.median(x["cpu_s"] for x in xs),
                    "cores_busy": statistics.median(x.get("cores_busy", 0.0) for x in xs),
                }
            )
    return {
        "size_mib": size_mib,
        "tensors": tensors,
        "worlds": worlds,
        "repeats": repeats,
        "memory_budget_mib": budget_mib or None,
        "nodes": nodes,
        "link": description,
        "rows": rows,
        "samples": {c: {str(n): v for n, v in s.items()} for c, s in samples.items()},
        "machine": machine_load(before),
        "wall_s": wall,
        "command": command_line(),
    }


def table(res: dict[str, Any]) -> str:
    header = [
        "reader",
        "ranks",
        "median s",
        "min–max s",
        "× 1 rank",
        "first item s",
        "last item s",
        "MiB from store",
        "× checkpoint",
        "GETs",
        "peak RSS +MiB",
        "CPU s",
        "cores busy",
    ]
    body = [
        [
            r["contender"],
            str(r["world"]),
            cell(r["median_s"]),
            f"{r['min_s']:.2f}–{r['max_s']:.2f}",
            cell(r["x_time_n1"], ".2f", "x"),
            cell(r["first_s"]),
            cell(r["last_s"]),
            cell(r["mib_down"], ".1f"),
            cell(r["x_checkpoint"], ".2f", "x"),
            f"{r['gets']:g}",
            cell(r["rss_mib"], ".0f"),
            cell(r["cpu_s"], ".1f"),
            cell(r.get("cores_busy"), ".1f"),
        ]
        for r in res["rows"]
    ]
    return markdown_table(header, "l" + "r" * 12, body)


def plot(res: dict[str, Any], figures: str) -> str | None:
    """Restore time and bytes from the store against N, a line per reader; the PNG's path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for n, c in enumerate(dict.fromkeys(r["contender"] for r in res["rows"])):
        rows = [r for r in res["rows"] if r["contender"] == c]
        ns = [r["world"] for r in rows]
        style = {"color": f"C{n}", "marker": "osD^v"[n % 5], "linestyle": STYLES[n % 4]}
        axes[0].plot(ns, [r["median_s"] for r in rows], label=c, **style)
        axes[1].plot(ns, [r["x_checkpoint"] for r in rows], label=c, **style)
    axes[0].set_ylabel("restore s (median, max over ranks; log)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("bytes from the store / checkpoint bytes")
    for ax in axes:
        ax.set_xlabel("ranks")
        ax.set_xticks(res["worlds"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{res['size_mib']} MiB replicated state, SeaweedFS behind {res['link']}", size=9)
    fig.tight_layout()
    os.makedirs(figures, exist_ok=True)
    path = os.path.join(figures, "read_once.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=None, help="replicated state (default 256)")
    p.add_argument("--tensors", type=int, default=16, help="replicated tensors")
    p.add_argument("--worlds", default="1,2,4", help="rank counts restored on")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--repeats", type=int, default=2, help="restores per (reader, ranks)")
    p.add_argument("--link-mbps", type=float, default=200.0, help="shaped link, per connection")
    p.add_argument("--link-latency-ms", type=float, default=20.0, help="shaped link, one way")
    p.add_argument(
        "--memory-budget-mib", type=int, default=0, help="ckptstore's (default: TransferConfig's)"
    )
    p.add_argument("--nodes", type=int, default=1, help="simulated nodes (ranks split evenly)")
    p.add_argument("--quick", action="store_true", help="32 MiB")
    p.add_argument("--plot-only", metavar="JSON", help="redraw the plot of a run's results")
    a = p.parse_args(argv)
    if a.plot_only:
        with open(a.plot_only) as f:
            print(f"plot: {plot(json.load(f), FIGURES_DIR)}")
        return 0
    size = a.size_mib or (32 if a.quick else 256)
    worlds = [int(x) for x in a.worlds.split(",")]
    contenders = tuple(a.contenders.split(","))
    if unknown := set(contenders) - set(CONTENDERS):
        p.error(f"unknown contenders {sorted(unknown)}; known: {', '.join(CONTENDERS)}")
    exit_on_sigterm()
    res = run(
        size,
        a.tensors,
        worlds,
        contenders,
        a.repeats,
        a.link_mbps,
        a.link_latency_ms,
        a.memory_budget_mib,
        a.nodes,
    )
    budget = f"{a.memory_budget_mib} MiB" if a.memory_budget_mib else "default"
    print(
        f"{size} MiB replicated ({a.tensors} tensors), saved on {SAVE_WORLD} ranks; "
        f"{a.repeats} repeats; ckptstore memory budget {budget}; {a.nodes} simulated node(s); "
        f"link: {res['link']}\n"
    )
    print(table(res))
    print(f"\nwall {res['wall_s']:.0f} s; {machine_line(res['machine'])}")
    print(f"JSON: {os.path.relpath(write_results('bench_read_once', res))}")
    if path := plot(res, FIGURES_DIR):
        print(f"plot: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
