"""The peer tier: a replaced node restores from its peers vs from the bucket, on a shaped link;
and what replication (``replicas=1``) costs a training loop's step time.

    python -m benchmarks.checkpoint.peer_tier            # 256 MiB, 2 gloo ranks, 3 repeats
    python -m benchmarks.checkpoint.peer_tier --quick    # 64 MiB, 2 repeats, a short loop
    python -m benchmarks.checkpoint.peer_tier --size-mib 512 --link-mbps 100 --repeats 5
    python -m benchmarks.checkpoint.peer_tier --link-total-mbps 0   # per-connection cap only

Two gloo ranks are two simulated nodes (each its own local tier directory); the root is
``s3://`` on SeaweedFS behind the shaped link of ``restore_tier`` (200 Mbit/s per connection,
+20 ms), its sum over all connections capped at ``--link-total-mbps`` (default 1000 Mbit/s
per direction, a node's share of a shared bucket): a real node's bucket throughput is bounded
in total (NIC share, the store's per-prefix and per-client limits), while per-connection caps
alone let the reader's many connections add up without bound. One checkpoint of a
DDP-like state (half replicated tensors, half per-rank ones) is saved with ``replicas=1``
and each node's tier is checked to hold the whole step. Then, alternating the order per
repeat, fresh restores (barrier -> restore -> barrier, max over ranks, checked bitwise):

  peers        node 1 replaced (its tier emptied), ``replicas=1``: its shards come from node 0.
  bucket       node 1 replaced, ``replicas=0``: its shards come from the bucket (the old way).
  remote       no local tier at all: everything through the link (``restore_tier``'s baseline).

Node 1's tier is put back (copied, untimed) between restores. The bytes over the link are
counted for each (the peers restore must move only the marker, manifest and ``.metadata``).
Two cadences: the same state saved alternately to the local tiers alone (``local_every=1``,
``root_every`` never; replicated) and to the bucket, each a fresh manager, async: the
save's blocking time and its time to committed + replicated, and the bytes sent over the
link; then node 1 replaced restores the newest step, a local-only one, from node 0
(``local-only``: nothing but control files over the link).
Step time: a matmul + all_reduce loop on the two ranks with ``mgr.save`` every
``--save-every`` steps (async, local-disk root, same local tiers), ``replicas=1`` vs ``0``,
fresh processes per configuration, alternated. JSON: benchmarks/results/bench_peer_tier-*.json.
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

from benchmarks.checkpoint.restore_tier import timed_restore
from benchmarks.common import (
    MiB,
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

__all__ = ["main", "run"]

BUCKET = "peer-tier"
MODES = ("peers", "bucket", "remote")
LOCAL_ONLY = "local-only"
SAVES = (LOCAL_ONLY, "bucket")
RUN_ID = "bench-peer-tier"  # one run for every manager: the root's owner and the stamps
CONFIGS = ("replicas=1", "replicas=0")
TENSORS = 4


def _state(rank: int, size_mib: int, world: int) -> dict[str, Any]:
    """Half of ``size_mib`` replicated (``w<i>``, the same on every rank), half per rank."""
    import torch

    rep = max(1024, size_mib * MiB // 2 // 4 // TENSORS)
    own = max(1024, size_mib * MiB // 2 // world // 4 // TENSORS)
    g = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.rand(rep, generator=g) for i in range(TENSORS)}
    g = torch.Generator().manual_seed(1 + rank)
    state.update({f"r{rank}.t{i}": torch.rand(own, generator=g) for i in range(TENSORS)})
    return state


def _files(tier: str) -> set[str]:
    return {n for _d, _s, names in os.walk(tier) for n in names if n.endswith(".distcp")}


def _reset(tier: str, backup: str | None) -> None:
    """Empty ``tier`` (a replaced node); with ``backup``, put its saved contents back."""
    shutil.rmtree(tier, ignore_errors=True)
    if backup is None:
        os.makedirs(tier)
    else:
        shutil.copytree(backup, tier)


def _restores(
    rank: int,
    world: int,
    url: str,
    options: dict,
    tiers: list[str],
    size_mib: int,
    repeats: int,
    counters: Any,
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from ckptstore.manager import CheckpointManager

    torch.set_num_threads(1)
    state = _state(rank, size_mib, world)
    with CheckpointManager(
        url,
        storage_options=options,
        local_tier_dir=tiers[rank],
        replicas=1,
        async_save=False,
        run_id=RUN_ID,
    ) as saver:
        saver.save(1, {"model": state})
    dist.barrier()
    held = [sorted(_files(t)) for t in tiers]
    if rank == 0 and (len(set(map(tuple, held))) != 1 or not held[0]):
        raise RuntimeError(f"after the save the nodes' tiers differ: {held}")
    backup = tiers[1] + ".backup"
    if rank == 1:
        shutil.copytree(tiers[1], backup)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    link: dict[str, list[int]] = {m: [] for m in MODES}
    for rep in range(repeats):
        for mode in rotated(MODES, rep):
            if rank == 1 and mode != "remote":
                _reset(tiers[1], None)  # node 1 replaced
            dest = {"model": {k: torch.zeros_like(v) for k, v in state.items()}}
            mgr = CheckpointManager(
                url,
                storage_options=options,
                local_tier_dir=None if mode == "remote" else tiers[rank],
                replicas=1 if mode == "peers" else 0,
            )
            secs, moved = timed_restore(mgr, dest, state, counters, mode)
            samples[mode].append(secs)
            link[mode].append(moved)
            if rank == 1:
                _reset(tiers[1], backup)  # untimed: the node's tier as after the save
            dist.barrier()
    saves, step = _cadences(rank, url, options, tiers[rank], state, repeats, counters)
    if rank == 1:
        shutil.rmtree(backup)
        shutil.copytree(tiers[1], backup)
    samples[LOCAL_ONLY], link[LOCAL_ONLY] = [], []
    for _rep in range(repeats):
        if rank == 1:
            _reset(tiers[1], None)  # node 1 replaced; the newest step is local-only
        dest = {"model": {k: torch.zeros_like(v) for k, v in state.items()}}
        mgr = CheckpointManager(
            url, storage_options=options, local_tier_dir=tiers[rank], replicas=1, run_id=RUN_ID
        )
        secs, moved = timed_restore(mgr, dest, state, counters, LOCAL_ONLY, step)
        samples[LOCAL_ONLY].append(secs)
        link[LOCAL_ONLY].append(moved)
        if rank == 1:
            _reset(tiers[1], backup)
        dist.barrier()
    return {"samples": samples, "link_bytes_down": link, "files": len(held[0]), "saves": saves}


def _cadences(
    rank: int, url: str, options: dict, tier: str, state: dict, repeats: int, counters: Any
) -> tuple[dict[str, list[dict[str, float]]], int]:
    """``repeats`` local-only and bucket saves of ``state`` (steps 2, 3, ..., alternated),
    each by a fresh manager; the newest is local-only. Their figures and that step."""
    saves: dict[str, list[dict[str, float]]] = {k: [] for k in SAVES}
    order = [k for rep in range(repeats) for k in rotated(SAVES, rep)]
    if order[-1] != LOCAL_ONLY:
        order.append(LOCAL_ONLY)  # untimed: the restore after it needs a local-only newest
    for step, kind in enumerate(order, start=2):
        figures = _timed_save(url, options, tier, state, step, kind, counters)
        if step - 2 < 2 * repeats:
            saves[kind].append(figures)
    return saves, len(order) + 1


def _timed_save(
    url: str, options: dict, tier: str, state: dict, step: int, kind: str, counters: Any
) -> dict[str, float]:
    """One async save of ``state`` as ``step`` (``kind``: to the local tiers alone or to the
    bucket), ``save()`` + ``wait()``: the slowest rank's blocking and committed + replicated
    seconds (its record), the wall time, and the MiB sent over the link meanwhile."""
    import torch
    import torch.distributed as dist

    from ckptstore.manager import CheckpointManager

    cadence = {"local_every": 1, "root_every": 1 << 40} if kind == LOCAL_ONLY else {}
    with CheckpointManager(
        url, storage_options=options, local_tier_dir=tier, run_id=RUN_ID, **cadence
    ) as mgr:
        dist.barrier()
        before = counters[0]
        t0 = time.perf_counter()
        mgr.save(step, {"model": state})
        mgr.wait()
        dist.barrier()
        wall = time.perf_counter() - t0
        sent = counters[0] - before
        record = mgr.records[-1]
    if record.tier != ("local" if kind == LOCAL_ONLY else "remote"):
        raise RuntimeError(f"{kind}: step {step} went to the {record.tier} tier")
    out = torch.tensor([record.blocking_s, record.total_s, wall])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return {
        "blocking_s": float(out[0]),
        "done_s": float(out[1]),
        "wall_s": float(out[2]),
        "link_mib_up": sent / MiB,
    }


def _loop(
    rank: int,
    world: int,
    root: str,
    tier: str,
    replicas: int,
    size_mib: int,
    n: int,
    steps: int,
    every: int,
) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from ckptstore.manager import CheckpointManager

    torch.set_num_threads(1)
    state = _state(rank, size_mib, world)
    a = torch.rand(n, n)
    grad = torch.zeros(1024)
    mgr = CheckpointManager(
        root, local_tier_dir=os.path.join(tier, f"node{rank}"), replicas=replicas
    )
    try:
        dist.barrier()
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            a = torch.mm(a, a).clamp_(0, 1)
            dist.all_reduce(grad)
            if step % every == 0:
                mgr.save(step, {"model": state})
        dist.barrier()
        secs = time.perf_counter() - t0
        t1 = time.perf_counter()
        mgr.wait()
        drain = time.perf_counter() - t1
    finally:
        mgr.close()
    out = torch.tensor([secs, drain])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return {"loop_s": float(out[0]), "drain_s": float(out[1])}


def _matmul_n(target_s: float) -> int:
    """The square size whose ``mm`` takes about ``target_s`` on one thread here."""
    import torch

    torch.set_num_threads(1)
    n = 256
    while n < 4096:
        a = torch.rand(n, n)
        t0 = time.perf_counter()
        torch.mm(a, a)
        if time.perf_counter() - t0 >= target_s:
            break
        n += 128
    return n


def run(
    size_mib: int,
    repeats: int,
    mbps: float,
    ms: float,
    total_mbps: float,
    loop_mib: int,
    steps: int,
    every: int,
    loop_repeats: int,
) -> dict[str, Any]:
    from benchmarks.shaped_link import ShapedLink
    from harness.dist import run_distributed
    from harness.seaweedfs import SeaweedFS

    world = 2
    server = SeaweedFS().start()
    link = None
    tmp = tempfile.mkdtemp(prefix="ckptstore-peer-")
    tiers = [os.path.join(tmp, f"node{r}") for r in range(world)]
    before = load_average()
    t0 = time.perf_counter()
    try:
        server.create_bucket(BUCKET)
        counters = multiprocessing.get_context("spawn").RawArray("q", 2)
        link = ShapedLink(
            server.port, mbps=mbps, latency_ms=ms, total_mbps=total_mbps, counters=counters
        )
        link.start()
        options = dict(server.storage_options, endpoint_url=link.endpoint)
        per_rank = run_distributed(
            _restores,
            world,
            f"s3://{BUCKET}/ckpt",
            options,
            tiers,
            size_mib,
            repeats,
            counters,
            timeout=3600,
        )
        description = link.describe()
    finally:
        if link is not None:
            link.stop()
        server.stop()
    n = _matmul_n(0.06)
    loops: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    try:
        for rep in range(loop_repeats):
            for cfg in rotated(CONFIGS, rep):
                d = tempfile.mkdtemp(dir=tmp)
                loops[cfg].append(
                    run_distributed(
                        _loop,
                        world,
                        os.path.join(d, "root"),
                        d,
                        int(cfg[-1]),
                        loop_mib,
                        n,
                        steps,
                        every,
                        timeout=3600,
                    )[0]
                )
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    samples = per_rank[0]["samples"]
    peers = statistics.median(samples["peers"])
    rows = [
        {
            "mode": m,
            "median_s": statistics.median(samples[m]),
            "min_s": min(samples[m]),
            "max_s": max(samples[m]),
            "x_peers": statistics.median(samples[m]) / peers,
            "link_mib_down": statistics.median(per_rank[0]["link_bytes_down"][m]) / MiB,
        }
        for m in (*MODES, LOCAL_ONLY)
    ]
    saves = per_rank[0]["saves"]
    save_rows = [
        {
            "save": k,
            **{f: statistics.median(x[f] for x in saves[k]) for f in saves[k][0]},
        }
        for k in SAVES
    ]
    steps_s = {c: [steps / x["loop_s"] for x in loops[c]] for c in CONFIGS}
    loop_rows = [
        {
            "config": c,
            "steps_per_s": statistics.median(steps_s[c]),
            "min": min(steps_s[c]),
            "max": max(steps_s[c]),
            "step_time_x": statistics.median(steps_s["replicas=0"]) / statistics.median(steps_s[c]),
            "drain_s": statistics.median(x["drain_s"] for x in loops[c]),
        }
        for c in CONFIGS
    ]
    return {
        "size_mib": size_mib,
        "world": world,
        "repeats": repeats,
        "link": description,
        "link_mbps": mbps,
        "link_total_mbps": total_mbps,
        "link_latency_ms": ms,
        "files_per_step": per_rank[0]["files"],
        "rows": rows,
        "samples": samples,
        "bucket_over_peers": statistics.median(samples["bucket"]) / peers,
        "save_rows": save_rows,
        "saves": saves,
        "loop": {
            "matmul_n": n,
            "steps": steps,
            "save_every": every,
            "state_mib": loop_mib,
            "root": "local disk",
            "repeats": loop_repeats,
            "rows": loop_rows,
            "runs": loops,
        },
        "machine": machine_load(before),
        "wall_s": wall,
        "command": command_line(),
    }


def tables(res: dict[str, Any]) -> str:
    restores = markdown_table(
        ["node 1 replaced, restore from", "median s", "min–max s", "× peers", "MiB over link"],
        "lrrrr",
        [
            [
                r["mode"],
                cell(r["median_s"], ".3f"),
                f"{r['min_s']:.3f}–{r['max_s']:.3f}",
                cell(r["x_peers"], ".1f", "x"),
                cell(r["link_mib_down"], ".2f"),
            ]
            for r in res["rows"]
        ],
    )
    loop = markdown_table(
        [
            f"save every {res['loop']['save_every']} steps",
            "steps/s",
            "min–max",
            "× step time",
            "final wait s",
        ],
        "lrrrr",
        [
            [
                r["config"],
                cell(r["steps_per_s"]),
                f"{r['min']:.2f}–{r['max']:.2f}",
                cell(r["step_time_x"], ".3f", "x"),
                cell(r["drain_s"]),
            ]
            for r in res["loop"]["rows"]
        ],
    )
    saves = markdown_table(
        ["async save of the state to", "blocking s", "committed + replicated s", "MiB sent"],
        "lrrr",
        [
            [
                r["save"],
                cell(r["blocking_s"], ".3f"),
                cell(r["done_s"], ".3f"),
                cell(r["link_mib_up"], ".2f"),
            ]
            for r in res["save_rows"]
        ],
    )
    return f"{restores}\n\n{saves}\n\n{loop}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=None, help="state restored (default 256)")
    p.add_argument("--repeats", type=int, default=None, help="restores per mode (default 3)")
    p.add_argument("--link-mbps", type=float, default=200.0, help="shaped link, per connection")
    p.add_argument("--link-latency-ms", type=float, default=20.0, help="shaped link, one way")
    p.add_argument(
        "--link-total-mbps",
        type=float,
        default=1000.0,
        help="shaped link, over all connections per direction: a node's share (0: no cap)",
    )
    p.add_argument("--loop-mib", type=int, default=None, help="state the loop saves (default 64)")
    p.add_argument("--steps", type=int, default=None, help="loop steps (default 60)")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--loop-repeats", type=int, default=None, help="runs per config (default 3)")
    p.add_argument("--quick", action="store_true", help="64 MiB, 2 repeats, a short loop")
    a = p.parse_args(argv)
    q = a.quick
    size = a.size_mib or (64 if q else 256)
    repeats = a.repeats or (2 if q else 3)
    loop_mib = a.loop_mib or (16 if q else 64)
    steps = a.steps or (20 if q else 60)
    loop_repeats = a.loop_repeats or (1 if q else 3)
    exit_on_sigterm()
    res = run(
        size,
        repeats,
        a.link_mbps,
        a.link_latency_ms,
        a.link_total_mbps,
        loop_mib,
        steps,
        a.save_every,
        loop_repeats,
    )
    print(
        f"state {size} MiB on 2 nodes (1 rank each), {res['files_per_step']} data files; "
        f"{repeats} repeats; link: {res['link']}\n"
    )
    print(tables(res))
    lp = res["loop"]
    print(
        f"\nbucket / peers: {res['bucket_over_peers']:.1f}x; loop: mm {lp['matmul_n']}^2 + "
        f"all_reduce per step, {lp['steps']} steps, {lp['state_mib']} MiB saved every "
        f"{lp['save_every']} (async, local-disk root), {lp['repeats']} runs per config"
    )
    print(f"wall {res['wall_s']:.0f} s; {machine_line(res['machine'])}")
    print(f"JSON: {os.path.relpath(write_results('bench_peer_tier', res))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
