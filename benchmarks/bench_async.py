"""Blocking time of an async checkpoint: ckptstore's manager vs torch.save vs dcp.async_save.

    python benchmarks/bench_async.py [--size-mib 1024] [--world 2] [--saves 4] [--quick]

Every rank holds ``size / world`` MiB of float32 tensors (8 per rank). For each contender,
``--saves`` saves run one after another while the "training loop" keeps going; we time, on
every rank, with a barrier first and the max over ranks:

- blocking: from the save call until the loop may modify the state again. For
  ``dcp.async_save`` with an async stager, the wait for its staging future counts.
- committed: from the save call until the checkpoint is durable / committed.

Contenders (one after another in the same run, same directory type):
- ``copy_`` floor: a bare ``copy_`` of the same tensors into preallocated buffers.
- rank-0 ``torch.save``: every rank's tensors gathered to rank 0 (gloo), one torch.save
  of the whole state, fsync of file and directory. Blocking == committed.
- stock ``dcp.async_save`` (FileSystemWriter, default stager: a fresh deep copy per save).
- stock ``dcp.async_save`` with ``DefaultStager`` (cached staging buffers; CPU options).
- ckptstore ``CheckpointManager.save`` (cached staging buffers; background write + commit),
  and the same with ``staging_dir`` (local staging tier, then upload to the root).

The first save of each contender allocates its buffers; "steady" is the median of the
other saves. Page cache is not dropped (the machine is shared); numbers are noisy: compare
ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sibling rss.py in the ranks

from rss import peak_rss_mib, reset_peak  # noqa: E402 - a sibling module, found via sys.path

from ckptstore.testing.dist import run_distributed  # noqa: E402

TENSORS_PER_RANK = 8


def make_state(rank: int, mib_per_rank: int) -> dict[str, torch.Tensor]:
    numel = mib_per_rank * 1024 * 1024 // 4 // TENSORS_PER_RANK
    g = torch.Generator().manual_seed(rank)
    return {f"r{rank}.t{i}": torch.randn(numel, generator=g) for i in range(TENSORS_PER_RANK)}


def timed_max(fn: Any) -> float:
    dist.barrier()
    t = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt.item())


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_rank(rank: int, world: int, mib_per_rank: int, saves: int, base: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from ckptstore.manager import CheckpointManager

    state = make_state(rank, mib_per_rank)
    out: dict[str, dict[str, list[float]]] = {}

    def record(name: str, blocking: float, committed: float) -> None:
        out.setdefault(name, {"blocking": [], "committed": []})
        out[name]["blocking"].append(blocking)
        out[name]["committed"].append(committed)

    def fresh(name: str) -> str:
        path = os.path.join(base, name)
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
        dist.barrier()
        return path

    def peak(name: str) -> None:  # this rank's peak RSS since the last reset_peak()
        out[name]["peak_rss_mib"] = peak_rss_mib()  # type: ignore[assignment]
        reset_peak()

    # The physical floor: copy_ into preallocated buffers.
    reset_peak()
    buffers = {k: torch.empty_like(v) for k, v in state.items()}
    for _ in range(saves):
        t = timed_max(lambda: [buffers[k].copy_(v) for k, v in state.items()])
        record("copy_ floor", t, t)
    peak("copy_ floor")
    buffers.clear()
    reset_peak()

    # Rank-0 torch.save of the gathered state (+ fsync).
    path = fresh("torchsave")
    for i in range(saves):

        def torch_save(i: int = i) -> None:
            gathered: list[Any] = [None] * world
            dist.gather_object(state, gathered if rank == 0 else None, dst=0)
            if rank == 0:
                full = {k: v for part in gathered for k, v in part.items()}
                f = os.path.join(path, f"ckpt_{i}.pt")
                torch.save(full, f)
                fsync_path(f)
                fsync_path(path)

        t = timed_max(torch_save)
        record("rank-0 torch.save", t, t)
    peak("rank-0 torch.save")

    # Stock dcp.async_save, default and with a caching DefaultStager.
    cpu_stager = DefaultStager(StagingOptions(False, False, False, False))
    pg = dist.new_group(backend="gloo")
    for name, stager in (("dcp.async_save", None), ("dcp.async_save + DefaultStager", cpu_stager)):
        path = fresh(name.replace(" ", "_").replace("+", ""))
        for i in range(saves):
            t0 = time.perf_counter()
            box: dict[str, Any] = {}

            def start(i: int = i, stager: Any = stager, path: str = path, box: dict = box) -> None:
                box["f"] = dcp.async_save(
                    state,
                    storage_writer=dcp.FileSystemWriter(os.path.join(path, f"s{i}")),
                    process_group=pg,
                    async_stager=stager,
                )
                staging = getattr(box["f"], "staging_completion", None)
                if staging is not None:
                    staging.result()

            blocking = timed_max(start)
            fut = box["f"]
            (getattr(fut, "upload_completion", None) or fut).result()
            committed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(committed, op=dist.ReduceOp.MAX)
            record(name, blocking, float(committed.item()))
        peak(name)
    cpu_stager.close()

    for name, staging in (("ckptstore manager", None), ("ckptstore manager + staging", "nvme")):
        root = fresh(name.replace(" ", "_").replace("+", ""))
        staging_dir = fresh(f"{staging}_{rank}") if staging else None
        mgr = CheckpointManager(root, staging_dir=staging_dir, strict=True)
        for i in range(saves):
            blocking = timed_max(lambda i=i, mgr=mgr: mgr.save(i, state))
            mgr.wait()
            rec = mgr.records[-1]
            committed = torch.tensor([rec.total_s], dtype=torch.float64)
            dist.all_reduce(committed, op=dist.ReduceOp.MAX)
            record(name, blocking, float(committed.item()))
        mgr.close()
        peak(name)
    return out


def summarise(results: list[dict], total_mib: int) -> list[dict]:
    """One row per contender from every rank's results (times are already max over ranks)."""
    result = results[0]
    rows = []
    for name, r in result.items():
        steady_b = r["blocking"][1:] or r["blocking"]
        steady_c = r["committed"][1:] or r["committed"]
        rows.append(
            {
                "contender": name,
                "first_blocking_s": r["blocking"][0],
                "blocking_s": statistics.median(steady_b),
                "blocking_min_s": min(steady_b),
                "blocking_max_s": max(steady_b),
                "committed_s": statistics.median(steady_c),
                "gib": total_mib / 1024,
                "peak_rss_mib": max(res[name].get("peak_rss_mib", 0.0) for res in results),
            }
        )
    floor = next(r["blocking_s"] for r in rows if r["contender"] == "copy_ floor")
    tsave = next(r["blocking_s"] for r in rows if r["contender"] == "rank-0 torch.save")
    for r in rows:
        r["x_floor"] = r["blocking_s"] / floor
        r["torch_save_over"] = tsave / r["blocking_s"]
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| contender | blocking s (median, steady) | min–max | first save | until committed s "
        "| × copy_ floor | torch.save ÷ this |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['contender']} | {r['blocking_s']:.3f} | {r['blocking_min_s']:.3f}–"
            f"{r['blocking_max_s']:.3f} | {r['first_blocking_s']:.3f} | {r['committed_s']:.2f} "
            f"| {r['x_floor']:.2f} | {r['torch_save_over']:.1f} |"
        )
    return "\n".join(lines)


def run(size_mib: int, world: int, saves: int, parent: str | None = None) -> dict[str, Any]:
    """Every contender on ``world`` gloo ranks; {"rows": summarise(...), "raw": per rank}."""
    base = tempfile.mkdtemp(prefix="ckptstore-bench-async-", dir=parent)
    try:
        results = run_distributed(bench_rank, world, size_mib // world, saves, base, timeout=1800)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"rows": summarise(results, size_mib), "raw": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024, help="total state size (all ranks)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--saves", type=int, default=4, help="saves per contender (first = warm-up)")
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="256 MiB, 3 saves")
    args = p.parse_args()
    if args.quick:
        args.size_mib, args.saves = 256, 3
    res = run(args.size_mib, args.world, args.saves, args.dir)
    rows, results = res["rows"], res["raw"]
    print(f"\n{args.size_mib} MiB state on {args.world} gloo ranks, {args.saves} saves each\n")
    print(table(rows))
    os.makedirs("benchmarks/results", exist_ok=True)
    out = f"benchmarks/results/bench_async-{time.strftime('%Y%m%d-%H%M%S')}.json"
    with open(out, "w") as f:
        json.dump({"args": vars(args), "rows": rows, "raw": results}, f, indent=1)
    print(f"\nraw results: {out}")


if __name__ == "__main__":
    main()
