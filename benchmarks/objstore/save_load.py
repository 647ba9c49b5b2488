"""Object-store save/load benchmark: stock FsspecWriter vs ckptstore, on a direct and a shaped link.

    python -m benchmarks.objstore.save_load              # 1 GiB state, 2 gloo ranks, 3 repeats
    python -m benchmarks.objstore.save_load --quick      # 256 MiB, 2 repeats
    python -m benchmarks.objstore.save_load --part-mib 16 --concurrency 16   # + a tuned row
    python -m benchmarks.objstore.save_load --links shaped --contenders raw,ckptstore
    python -m benchmarks.objstore.save_load --links shaped --link-mbps 50 --saves-only

The benchmark starts its own SeaweedFS (``weed mini``, fresh temp directory, deleted at the
end) and a shaped link in front of it (``benchmarks/shaped_link.py``: a TCP proxy that caps
every connection at ``--link-mbps`` and adds ``--link-latency-ms`` one way, as a cloud
store's per-connection limits do). Every contender runs on both links, in one run:

  direct   the clients talk to SeaweedFS on 127.0.0.1 (client and server share 2 cores)
  shaped   the same server behind the shaped link

Every rank holds ``size / world`` bytes as ``--tensors-per-rank`` float32 tensors with
rank-unique names. Contenders (ids for ``--contenders`` in brackets):

  raw PUT/GET ceiling [raw]   no DCP, no serialisation: each rank uploads its share's bytes
        (made into part-sized ``bytearray``s beforehand, untimed) as one multipart object, parts
        of ckptstore's default part size, that many in flight at once, straight on s3fs's
        aiobotocore client, each body sent as S3Store sends a part (``buffers_body``: no
        copy of it before the transport's own); the load is ckptstore's read plan
        (``engine.readplan``: 32 ranged GETs of <= 8 MiB in flight with the defaults), each
        body's chunks copied once into one preallocated buffer (made untimed, as the load
        targets are). The same object count, size and parallelism as ckptstore.
  FsspecWriter / FsspecReader [fsspec]   torch's stock fsspec DCP backend at ``s3://...``
        with default options: one file per rank, ``thread_count=1``, ``sync_files=True``
        (which calls a machine-wide ``os.sync()`` per file on S3, because an s3fs file has
        no ``fileno``; it syncs this machine's disks, not the object).
  FsspecWriter sync_files=False [fsspec-nosync]   the same without the os.sync() calls
        (save only: its checkpoint loads exactly like the one above).
  ckptstore [ckptstore]   ``ckptstore.writer`` / ``ckptstore.reader`` with the default
        ``TransferConfig``; the load verifies the CRC32C of every range.
  ckptstore tuned [tuned]   the same with ``--part-mib`` / ``--concurrency`` (only when
        either is given).
  s3torchconnector [s3torch]   AWS's DCP ``S3StorageWriter`` / ``S3StorageReader`` (CRT
        client; endpoint override, path-style addressing, default ``S3ClientConfig``).
        Its ``dcp`` extra needs ``tenacity``, which is not installed here; a pass-through
        stand-in is put in its place (it only decorates a retried delete in ``rename``).

The stock writer/reader and the raw ceiling get the s3fs client options for SeaweedFS
(``contenders.CLIENT_CONFIG``: checksums only when required); ckptstore builds its own
s3fs client; s3torchconnector its CRT client (credentials from AWS_* variables set for the
ranks). Each time is barrier -> operation -> barrier on every rank; the sample is the max over
ranks. Loads run right after their own save, into tensors zeroed beforehand, and are checked
bitwise (untimed). Contenders rotate (repeat i starts with contender i mod n) and so does the
link order; each writes a fresh prefix that rank 0 deletes afterwards (untimed), and SeaweedFS
is vacuumed after each link's round so its disk use stays small. A tiny untimed warm-up of every
contender on each link runs first. Besides times, rank 0 records the CPU seconds of SeaweedFS
and of the link's process and the bytes through the shaped link; each rank its own CPU. Results:
Markdown tables on stdout and JSON in benchmarks/results/bench_objstore-<timestamp>.json. On
this project's 2-core machines the default run takes 15-20 minutes (SeaweedFS needs 12-14 CPU s
per GiB written); ``--quick`` a few.
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from benchmarks.common import (
    MiB,
    add_state_args,
    command_line,
    exit_on_sigterm,
    load_average,
    machine_facts,
    machine_line,
    make_state,
    rotated,
    write_results,
)
from benchmarks.objstore.contenders import (
    BUCKET,
    CONTENDERS,
    LINKS,
    LOAD_FNS,
    SAVE_FNS,
    BenchConfig,
    RankCtx,
    cpu_seconds,
    delete_prefix,
    import_s3torch,
    raw_bodies,
)
from benchmarks.objstore.summary import format_cpu, format_table, summarise, targets

__all__ = ["BenchConfig", "main", "run"]


def _timed(ctx: RankCtx, fn: Callable[[], Any]) -> dict[str, float]:
    """barrier -> fn -> barrier: wall seconds, this process's CPU; on rank 0 also the CPU
    of the server and of the link's process, and the bytes through the shaped link."""
    import torch.distributed as dist

    dist.barrier()
    pids = ctx.pids if ctx.rank == 0 else {}
    others = {k: cpu_seconds(p) for k, p in pids.items()}
    link_bytes = sum(ctx.link_counters) if ctx.link_counters is not None else 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    dist.barrier()
    out = {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}
    for k, before in others.items():
        out[f"{k}_cpu_s"] = cpu_seconds(pids[k]) - before
    if ctx.rank == 0 and ctx.link_counters is not None:
        out["link_bytes"] = sum(ctx.link_counters) - link_bytes
    return out


def _vacuum(ctx: RankCtx) -> None:
    """Let SeaweedFS reclaim deleted objects' space (deletes reach the volumes in ~1 s)."""
    time.sleep(1.5)
    try:
        urllib.request.urlopen(ctx.vacuum_url, timeout=120).read()
    except OSError:
        pass


def _one_round(ctx: RankCtx, link: str, tag: str, order: tuple[str, ...]) -> dict[str, Any]:
    """Every contender once on ``link``, in ``order``; this rank's samples."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}
    for name in order:
        key = f"{tag}-{name}"
        out[name] = {"save": _timed(ctx, lambda n=name, k=key: SAVE_FNS[n](ctx, link, k))}
        if name in LOAD_FNS and "load" in ctx.cfg.ops:
            for t in ctx.dest.values():
                t.zero_()
            out[name]["load"] = _timed(ctx, lambda n=name, k=key: LOAD_FNS[n](ctx, link, k))
            if name != "raw" and not all(torch.equal(ctx.dest[k], ctx.state[k]) for k in ctx.state):
                raise AssertionError(f"rank {ctx.rank}: {name} on {link}: load is not equal")
        dist.barrier()
        if ctx.rank == 0:
            delete_prefix(ctx, link, key)
            done = ", ".join(f"{op} {v['s']:.2f} s" for op, v in out[name].items())
            print(f"  {tag} {link:6} {name:13} rank 0: {done}", flush=True)
        dist.barrier()
    if ctx.rank == 0:
        _vacuum(ctx)
    dist.barrier()
    return out


def _rank_main(
    rank: int,
    world: int,
    cfg: BenchConfig,
    endpoints: dict[str, str],
    pids: dict[str, int],
    vacuum_url: str,
    link_counters: Any,
) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)  # 2 ranks on 2 cores: one intra-op thread each
    ctx = RankCtx(rank, world, cfg, endpoints, pids, vacuum_url, link_counters)
    part = cfg.transfer_config(False).part_size
    names = cfg.contenders
    if cfg.warmup:
        ctx.state = make_state(rank, cfg, numel=64 * 1024)
        ctx.dest = {k: torch.empty_like(v) for k, v in ctx.state.items()}
        ctx.bodies = raw_bodies(ctx.state, part)
        for link in cfg.links:
            _one_round(ctx, link, "warmup", names)
    ctx.state = make_state(rank, cfg)
    ctx.dest = {k: torch.empty_like(v) for k, v in ctx.state.items()}
    ctx.bodies = raw_bodies(ctx.state, part) if "raw" in names else []
    rounds = []
    for r in range(cfg.repeats):
        order = rotated(names, r)
        links = cfg.links if r % 2 == 0 else tuple(reversed(cfg.links))
        got: dict[str, Any] = {"order": list(order), "links": list(links)}
        for link in links:
            got[link] = _one_round(ctx, link, f"r{r}", order)
        rounds.append(got)
    return rounds


# -- parent side -------------------------------------------------------------------------
def run(cfg: BenchConfig) -> dict[str, Any]:
    from benchmarks.shaped_link import ShapedLink
    from harness.dist import run_distributed
    from harness.seaweedfs import SeaweedFS

    server = SeaweedFS().start()
    link = None
    try:
        server.create_bucket(BUCKET)
        counters = multiprocessing.get_context("spawn").RawArray("q", 2)
        link = ShapedLink(
            server.port,
            mbps=cfg.link_mbps,
            latency_ms=cfg.link_latency_ms,
            counters=counters,
        )
        link.start()
        endpoints = {"direct": server.endpoint, "shaped": link.endpoint}
        assert server.proc is not None
        pids = {"server": server.proc.pid, "link": os.getpid()}
        vacuum = f"http://127.0.0.1:{server.ports['master']}/vol/vacuum?garbageThreshold=0.0001"
        env = {  # s3torchconnector's CRT client reads credentials from the environment
            "AWS_ACCESS_KEY_ID": server.key,
            "AWS_SECRET_ACCESS_KEY": server.secret,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        load_before = load_average()
        t0 = time.perf_counter()
        rounds_by_rank = run_distributed(
            _rank_main, cfg.world, cfg, endpoints, pids, vacuum, counters, timeout=3600, env=env
        )
        wall = time.perf_counter() - t0
        machine = machine_facts(modules=("s3fs", "botocore", "aiobotocore", "s3torchconnector"))
        machine["loadavg_before"] = load_before
        machine["loadavg_after"] = load_average()
        link_stats = link.stats()
    finally:
        if link is not None:
            link.stop()
        server.stop()
        _remove_weed_sockets(server.ports)
    return {
        "config": asdict(cfg),
        "transfer_config": {
            k: {
                f: getattr(cfg.transfer_config(k == "tuned"), f)
                for f in ("part_size", "concurrency", "memory_budget")
            }
            for k in ("ckptstore", "tuned")
        },
        "state_bytes": cfg.state_bytes,
        "link": {"description": link.describe(), **link_stats},
        "command": command_line(),
        "machine": machine,
        "wall_s": wall,
        "rows": summarise(rounds_by_rank, cfg),
        "orders": [{"order": r["order"], "links": r["links"]} for r in rounds_by_rank[0]],
        "samples_by_rank": rounds_by_rank,
    }


def _remove_weed_sockets(ports: dict[str, int]) -> None:
    """weed leaves /tmp/seaweedfs-<service>-grpc-<port>.sock behind when killed: remove ours."""
    for name, port in ports.items():
        for path in glob.glob(f"/tmp/seaweedfs-{name}-grpc-{port + 10_000}.sock"):
            try:
                os.remove(path)
            except OSError:
                pass


def _available(names: list[str], cfg_tuned: bool) -> tuple[str, ...]:
    out = []
    for n in names:
        if n == "tuned" and not cfg_tuned:
            continue
        if n == "s3torch":
            try:
                import_s3torch()
            except ImportError as exc:
                print(f"s3torchconnector skipped: {exc}", flush=True)
                continue
        out.append(n)
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_state_args(p, size_mib=1024, repeats=3)
    p.add_argument("--part-mib", type=int, default=0, help="tuned ckptstore row: part size")
    p.add_argument(
        "--concurrency", type=int, default=0, help="tuned ckptstore row: parts in flight"
    )
    p.add_argument("--link-mbps", type=float, default=200.0, help="shaped link, per connection")
    p.add_argument("--link-latency-ms", type=float, default=20.0, help="shaped link, one way")
    p.add_argument("--links", default=",".join(LINKS), help="comma list of direct,shaped")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma list of ids")
    p.add_argument(
        "--saves-only", action="store_true", help="no loads (e.g. for a slow shaped link)"
    )
    p.add_argument("--quick", action="store_true", help="256 MiB and 2 repeats")
    p.add_argument("--no-warmup", action="store_true")
    a = p.parse_args(argv)
    links = tuple(x for x in a.links.split(",") if x)
    names = [x for x in a.contenders.split(",") if x]
    for bad in set(links) - set(LINKS) | set(names) - set(CONTENDERS):
        p.error(f"unknown link or contender {bad!r}")
    tuned = bool(a.part_mib or a.concurrency)
    cfg = BenchConfig(
        size_mib=a.size_mib or (256 if a.quick else 1024),
        world=a.world,
        repeats=a.repeats or (2 if a.quick else 3),
        tensors_per_rank=a.tensors_per_rank,
        part_mib=a.part_mib,
        concurrency=a.concurrency,
        link_mbps=a.link_mbps,
        link_latency_ms=a.link_latency_ms,
        links=links,
        contenders=_available(names, tuned),
        warmup=not a.no_warmup,
        ops=("save",) if a.saves_only else ("save", "load"),
    )
    default = cfg.transfer_config(False)
    print(
        f"state {cfg.state_bytes / MiB:.0f} MiB = {cfg.world} ranks x {cfg.tensors_per_rank} "
        f"float32 tensors; {cfg.repeats} repeats; links {', '.join(cfg.links)}; "
        f"ckptstore default TransferConfig: part {default.part_size // MiB} MiB, "
        f"concurrency {default.concurrency}, memory budget {default.memory_budget // MiB} MiB",
        flush=True,
    )
    exit_on_sigterm()
    res = run(cfg)
    print(f"\nshaped link: {res['link']['description']}")
    print("\n" + format_table(res["rows"], "save"))
    if "load" in cfg.ops:
        print("\n" + format_table(res["rows"], "load"))
    print("\nCPU and traffic per operation (medians):\n" + format_cpu(res["rows"]))
    print("\n" + "\n".join(targets(res["rows"])))
    print(f"\nwall {res['wall_s']:.0f} s; {machine_line(res['machine'])}")
    print(f"JSON: {os.path.relpath(write_results('bench_objstore', res))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
