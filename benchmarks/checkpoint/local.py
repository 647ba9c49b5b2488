"""Local-volume save/load benchmark: rank-0 torch.save vs stock DCP vs ckptstore.

    python -m benchmarks.checkpoint.local            # 1 GiB state, 2 gloo ranks, 3 repeats
    python -m benchmarks.checkpoint.local --quick    # 256 MiB, 2 repeats
    python -m benchmarks.checkpoint.local --size-mib 512 --world 2 --repeats 5 --dir /mnt/x

Every rank holds ``size / world`` bytes as ``--tensors-per-rank`` float32 tensors with
rank-unique names, so each rank writes its own share. Contenders, run in a rotated order
each repeat (repeat i starts with contender i mod 3), each into a fresh directory that is
deleted afterwards:

  torch.save   rank 0 receives every other rank's tensors (gloo send/recv into freshly
               allocated tensors), then torch.save of the full state to one file, fsync of
               the file and fsync of its directory. The time is all of that.
  stock DCP    dcp.save with torch's FileSystemWriter, default options (one file per rank,
               sync_files=True: each file is fsynced; the directory is not).
  ckptstore    ckptstore.save with ckptstore.writer(path): CRC32C of every byte, every file
               written to a temp name, fsynced, renamed and its directory fsynced, then the
               manifest, .metadata and the create-only COMMITTED marker.
  write floor  (unless --no-floor) each rank writes its tensors' bytes (straight from
               their memory, 64 MiB writes) into one file of its own and fsyncs it: the
               raw write + fsync of the same bytes at the same time, with no format,
               checksum or commit.

Loads (each right after its own save, into preallocated tensors, then checked bitwise):
stock dcp.load with FileSystemReader of the stock DCP checkpoint, and ckptstore.load (the
reader checks the marker and manifest and verifies the CRC32C of every range it reads) of
the ckptstore checkpoint. Nothing is dropped from the page cache, so loads read bytes that
were just written (warm cache): they measure CPU cost, not the disk.

Every time is barrier -> operation -> barrier on each rank; the reported sample is the max
over ranks. "RSS added" is each rank's peak RSS during the operation minus its RSS right
before it (max over ranks and repeats). A tiny untimed warm-up of every contender runs
first. Results: a Markdown table on stdout and JSON in
benchmarks/results/bench_local-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.common import (
    StateShape,
    add_state_args,
    cell,
    command_line,
    current_rss_mib,
    fsync_path,
    load_average,
    machine_facts,
    machine_line,
    make_state,
    markdown_table,
    peak_rss_mib,
    reset_peak,
    rotated,
    write_results,
)

__all__ = ["BenchConfig", "main", "run"]

SAVES = ("torch.save", "stock DCP", "ckptstore")
FLOOR = "write floor"
LOADS = {"stock DCP": "stock DCP load", "ckptstore": "ckptstore load (verified)"}


@dataclass(frozen=True)
class BenchConfig(StateShape):
    dir: str = ""  # parent of the per-run directories; "" = a temp dir under /tmp
    warmup: bool = True
    floor: bool = False  # also time the raw write + fsync floor (a fourth contender)

    @property
    def saves(self) -> tuple[str, ...]:
        return (*SAVES, FLOOR) if self.floor else SAVES


# -- per-rank side -----------------------------------------------------------------------
def save_torch(state: dict[str, Any], path: str, rank: int, world: int) -> dict[str, float]:
    """Gather every rank's tensors on rank 0, torch.save them, fsync file + directory."""
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    if rank != 0:
        for name in sorted(state):
            dist.send(state[name], dst=0)
        return {}
    full = dict(state)
    for src in range(1, world):
        for name in sorted(state):
            other = name.replace("rank0.", f"rank{src}.", 1)
            buf = torch.empty_like(state[name])
            dist.recv(buf, src=src)
            full[other] = buf
    t1 = time.perf_counter()
    os.makedirs(path, exist_ok=True)
    file = os.path.join(path, "state.pt")
    with open(file, "wb") as f:
        torch.save(full, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(path)
    return {"gather_s": t1 - t0, "serialize_write_fsync_s": time.perf_counter() - t1}


def save_dcp(state: dict[str, Any], path: str, rank: int, world: int) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    return {}


def save_ckptstore(state: dict[str, Any], path: str, rank: int, world: int) -> dict[str, float]:
    import ckptstore

    ckptstore.save(state, ckptstore.writer(path))
    return {}


def save_floor(state: dict[str, Any], path: str, rank: int, world: int) -> dict[str, float]:
    """Each rank's tensors' bytes into one file of its own, 64 MiB writes, then fsync."""
    os.makedirs(path, exist_ok=True)
    chunk = 64 * 2**20
    fd = os.open(os.path.join(path, f"floor_{rank}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for name in sorted(state):
            view = memoryview(state[name].numpy()).cast("B")
            for start in range(0, len(view), chunk):
                piece = view[start : start + chunk]
                while len(piece):
                    piece = piece[os.write(fd, piece) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return {}


def load_dcp(dest: dict[str, Any], path: str) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(dest, storage_reader=dcp.FileSystemReader(path))


def load_ckptstore(dest: dict[str, Any], path: str) -> None:
    import ckptstore

    ckptstore.load(dest, ckptstore.reader(path))


SAVE_FNS: dict[str, Callable[..., dict[str, float]]] = {
    "torch.save": save_torch,
    "stock DCP": save_dcp,
    "ckptstore": save_ckptstore,
    "write floor": save_floor,
}
LOAD_FNS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "stock DCP": load_dcp,
    "ckptstore": load_ckptstore,
}


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    dist.barrier()
    return time.perf_counter() - t0, out


def _timed_rss(fn: Callable[[], Any]) -> tuple[float, Any, float, float]:
    """``_timed`` plus this rank's peak RSS (MiB) during the operation, and that peak minus
    its RSS right before it (what the operation added)."""
    before = current_rss_mib()
    reset_peak()
    secs, out = _timed(fn)
    peak = peak_rss_mib()
    return secs, out, peak, peak - before


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _one_round(
    rank: int, world: int, state: dict, dest: dict, base: str, tag: str, order: tuple[str, ...]
) -> dict[str, Any]:
    """Every contender once, in ``order``; this rank's times and what it saw."""
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {}
    for name in order:
        path = os.path.join(base, f"{tag}-{name.replace(' ', '_').replace('.', '_')}")
        secs, parts, rss, added = _timed_rss(
            lambda n=name, p=path: SAVE_FNS[n](state, p, rank, world)
        )
        out[name] = {"s": secs, "peak_rss_mib": rss, "rss_added_mib": added, **parts}
        if rank == 0:
            out[name]["bytes_on_disk"] = _dir_bytes(path)
        if name in LOAD_FNS:
            for t in dest.values():
                t.zero_()
            secs, _, rss, added = _timed_rss(lambda n=name, p=path: LOAD_FNS[n](dest, p))
            ok = all(torch.equal(dest[k], state[k]) for k in state)
            out[LOADS[name]] = {
                "s": secs,
                "peak_rss_mib": rss,
                "rss_added_mib": added,
                "bitwise_equal": ok,
            }
            if not ok:
                raise AssertionError(f"rank {rank}: {LOADS[name]} is not bitwise equal")
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path)
        dist.barrier()
    return out


def _rank_main(rank: int, world: int, cfg: BenchConfig, base: str) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)  # 2 ranks on 2 cores: one intra-op thread each
    if cfg.warmup:
        small = make_state(rank, cfg, numel=64 * 1024)
        small_dest = {k: torch.empty_like(v) for k, v in small.items()}
        _one_round(rank, world, small, small_dest, base, "warmup", cfg.saves)
    state = make_state(rank, cfg)
    dest = {k: torch.empty_like(v) for k, v in state.items()}
    rounds = []
    for r in range(cfg.repeats):
        order = rotated(cfg.saves, r)
        got = _one_round(rank, world, state, dest, base, f"r{r}", order)
        got["order"] = list(order)
        rounds.append(got)
    return rounds


# -- parent side -------------------------------------------------------------------------
def _summarise(rounds_by_rank: list[list[dict[str, Any]]], cfg: BenchConfig) -> dict[str, Any]:
    saves = cfg.saves
    names = list(saves) + [LOADS[n] for n in saves if n in LOADS]
    samples: dict[str, list[float]] = {n: [] for n in names}
    rss: dict[str, list[float]] = {n: [] for n in names}
    added: dict[str, list[float]] = {n: [] for n in names}
    extra: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(cfg.repeats):
        for n in names:
            per_rank = [rounds[r][n] for rounds in rounds_by_rank]
            samples[n].append(max(p["s"] for p in per_rank))
            rss[n].append(max(p.get("peak_rss_mib", 0.0) for p in per_rank))
            added[n].append(max(p.get("rss_added_mib", 0.0) for p in per_rank))
            extra[n].append({k: v for k, v in per_rank[0].items() if k != "s"})
    rows = {}
    for n in names:
        xs = samples[n]
        rows[n] = {
            "median_s": statistics.median(xs),
            "min_s": min(xs),
            "max_s": max(xs),
            "gb_per_s": cfg.state_bytes / 1e9 / statistics.median(xs),
            "samples_s": xs,
            "peak_rss_mib": max(rss[n]),  # max over ranks and repeats
            "rss_added_mib": max(added[n]),
            "rank0_detail": extra[n],
        }
    for n in names:
        base_save = rows["torch.save"]["median_s"]
        base_dcp = rows["stock DCP" if n in saves else LOADS["stock DCP"]]["median_s"]
        rows[n]["vs_torch_save"] = rows[n]["median_s"] / base_save if n in saves else None
        rows[n]["vs_stock_dcp"] = rows[n]["median_s"] / base_dcp
        floor = rows[FLOOR]["median_s"] if FLOOR in rows else None
        rows[n]["vs_floor"] = rows[n]["median_s"] / floor if floor and n in saves else None
    return rows


def format_table(rows: dict[str, Any]) -> str:
    header = [
        "contender",
        "median s",
        "min–max s",
        "GB/s",
        "× torch.save",
        "× stock DCP",
        "× write floor",
        "peak RSS MiB/rank",
        "RSS added MiB",
    ]
    cells = [
        [
            n,
            cell(r["median_s"]),
            f"{cell(r['min_s'])}–{cell(r['max_s'])}",
            cell(r["gb_per_s"]),
            cell(r["vs_torch_save"]),
            cell(r["vs_stock_dcp"]),
            cell(r["vs_floor"]),
            cell(r["peak_rss_mib"], ".0f"),
            cell(r["rss_added_mib"], ".0f"),
        ]
        for n, r in rows.items()
    ]
    return markdown_table(header, "lrrrrrrrr", cells)


def run(cfg: BenchConfig) -> dict[str, Any]:
    from harness.dist import run_distributed

    made_base = not cfg.dir
    base = tempfile.mkdtemp(prefix="ckptstore-bench-") if made_base else cfg.dir
    os.makedirs(base, exist_ok=True)
    try:
        load_before = load_average()
        t0 = time.perf_counter()
        rounds_by_rank = run_distributed(_rank_main, cfg.world, cfg, base, timeout=1800)
        wall = time.perf_counter() - t0
        machine = machine_facts(df_path=base)
        machine["loadavg_before"] = load_before
        machine["loadavg_after"] = load_average()
    finally:
        if made_base:
            shutil.rmtree(base, ignore_errors=True)
    return {
        "config": asdict(cfg),
        "state_bytes": cfg.state_bytes,
        "dir": base,
        "command": command_line(),
        "machine": machine,
        "wall_s": wall,
        "rows": _summarise(rounds_by_rank, cfg),
        "orders": [r["order"] for r in rounds_by_rank[0]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_state_args(p, size_mib=1024, repeats=3)
    p.add_argument("--dir", default="", help="parent directory for the runs (default: /tmp)")
    p.add_argument("--quick", action="store_true", help="256 MiB and 2 repeats")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--no-floor", action="store_true", help="skip the raw write + fsync floor")
    a = p.parse_args(argv)
    cfg = BenchConfig(
        size_mib=a.size_mib or (256 if a.quick else 1024),
        world=a.world,
        repeats=a.repeats or (2 if a.quick else 3),
        tensors_per_rank=a.tensors_per_rank,
        dir=a.dir,
        warmup=not a.no_warmup,
        floor=not a.no_floor,
    )
    print(
        f"state {cfg.state_bytes / 2**20:.0f} MiB = {cfg.world} ranks x {cfg.tensors_per_rank} "
        f"float32 tensors; {cfg.repeats} repeats; page cache not dropped",
        flush=True,
    )
    res = run(cfg)
    print(format_table(res["rows"]))
    ts = res["rows"]["torch.save"]["rank0_detail"]
    gather = statistics.median(d["gather_s"] for d in ts)
    write = statistics.median(d["serialize_write_fsync_s"] for d in ts)
    print(
        f"\ntorch.save split (rank 0, medians): gather {gather:.2f} s, "
        f"serialize+write+fsync {write:.2f} s. Wall {res['wall_s']:.0f} s."
    )
    on_disk = ", ".join(
        f"{n} {res['rows'][n]['rank0_detail'][0]['bytes_on_disk'] / 2**20:.1f} MiB"
        for n in cfg.saves
    )
    print(f"bytes on disk per checkpoint: {on_disk}")
    print(machine_line(res["machine"]))
    print(f"JSON: {os.path.relpath(write_results('bench_local', res))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
