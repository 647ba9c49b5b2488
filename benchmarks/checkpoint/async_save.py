"""Blocking time of an async checkpoint: ckptstore's manager vs torch.save vs dcp.async_save.

    python -m benchmarks.checkpoint.async_save [--size-mib 1024] [--world 2] [--saves 4]
        [--quick] [--contenders "NAME;..."] [--no-interference]

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
  the same with ``local_tier_dir`` (local staging tier, then upload to the root), with
  ``background="process"`` (shared-memory staging arena; a writer process per rank), and in
  process mode with ``max_staging_bytes`` = half the rank's state (staged in rounds).
  The managers are built together and their saves interleaved round by round (the order
  rotated each round), so that the machine's load drifts over all of them alike; their
  peak RSS is the peak over all of them.

``--contenders`` runs only the contenders named (separated by ``;``, as in the table; the
ratios need ``copy_ floor``, ``rank-0 torch.save`` and ``dcp.async_save + DefaultStager``,
and are left out without them); ``--no-interference`` skips the training-loop part.

Then the reason to pick a writer process: how much a CPU-bound training loop (one torch
thread per rank, ``x = tanh(x @ w)`` on 128x128 float32, i.e. small ops where Python and
the GIL matter) slows down while a background save runs. Per save: the loop's rate for
1 s with no save in flight ("idle"), then its rate from ``save()``'s return until the
save is committed ("during"); thread and process mode alternate save by save, with the
state in 8 tensors per rank and in 1024. slowdown = idle / during.

For the stock async saves and the managers, each save also records the machine's busy CPU
seconds from the call to the commit (``/proc/stat``, all processes): "cores busy" is that
÷ the wall time, and "committed × CPU bound" the wall time ÷ (CPU seconds ÷ ``nproc``) —
near 1.0 the save is bound by the cores, not by I/O or waiting. "disk MB written" is what
the machine's disks wrote meanwhile (``/proc/diskstats``; the page cache's writeback of
other files included) and "disk MB/s" that ÷ the wall time: the same MB/s for contenders
that write different amounts means the disk bounds them.

The first save of each contender allocates its buffers; "steady" is the median of the
other saves. Page cache is not dropped (the machine is shared); numbers are noisy: compare
ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.checkpoint.async_common import (
    STAGER,
    fresh_dir,
    make_state,
    markdown,
    stock_async_save,
    stock_wait,
    timed_max,
)
from benchmarks.checkpoint.interference import (
    interference,
    interference_table,
    summarise_interference,
)
from benchmarks.common import (
    fsync_path,
    machine_busy_s,
    peak_rss_mib,
    reset_peak,
    rotated,
    write_results,
)
from harness.dist import run_distributed

FLOOR = "copy_ floor"
TORCH_SAVE = "rank-0 torch.save"
#: The managers: (name, local_tier_dir, background, budget as a fraction of the rank's state).
MANAGERS = (
    ("ckptstore manager", False, "thread", None),
    ("ckptstore manager + staging", True, "thread", None),
    ("ckptstore manager (process)", False, "process", None),
    ("ckptstore manager (process), budget = state / 2", False, "process", 0.5),
)
CONTENDERS = (FLOOR, TORCH_SAVE, "dcp.async_save", STAGER, *(m[0] for m in MANAGERS))


def disk_written_bytes() -> int:
    """Bytes the machine's disks have written since boot (``/proc/diskstats``, sectors of
    512 bytes, whole disks only: ``/sys/block`` entries with a device, so partitions,
    loop, zram and device-mapper volumes are not counted twice)."""
    disks = {n for n in os.listdir("/sys/block") if os.path.exists(f"/sys/block/{n}/device")}
    total = 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if fields[2] in disks:
                total += int(fields[9]) * 512
    return total


def machine_counters() -> tuple[float, int]:
    """``(machine_busy_s(), disk_written_bytes())`` now: read before and after a save."""
    return machine_busy_s(), disk_written_bytes()


def bench_rank(
    rank: int,
    world: int,
    mib_per_rank: int,
    saves: int,
    base: str,
    contenders: tuple[str, ...] = CONTENDERS,
    with_interference: bool = True,
) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from ckptstore.manager import CheckpointManager

    state = make_state(rank, mib_per_rank)
    out: dict[str, dict[str, list[float]]] = {}

    def record(
        name: str,
        blocking: float,
        committed: float,
        cpu: float | None = None,
        disk: int | None = None,
    ) -> None:
        out.setdefault(name, {"blocking": [], "committed": [], "cpu_s": [], "disk_bytes": []})
        out[name]["blocking"].append(blocking)
        out[name]["committed"].append(committed)
        if cpu is not None:  # the machine's busy CPU seconds from the call to the commit
            out[name]["cpu_s"].append(cpu)
        if disk is not None:  # ... and the bytes its disks wrote meanwhile
            out[name]["disk_bytes"].append(disk)

    def fresh(name: str) -> str:
        return fresh_dir(base, name, rank)

    def peak(name: str) -> None:  # this rank's peak RSS since the last reset_peak()
        out[name]["peak_rss_mib"] = peak_rss_mib()  # type: ignore[assignment]
        reset_peak()

    # The physical floor: copy_ into preallocated buffers.
    reset_peak()
    if FLOOR in contenders:
        buffers = {k: torch.empty_like(v) for k, v in state.items()}
        for _ in range(saves):
            t = timed_max(lambda: [buffers[k].copy_(v) for k, v in state.items()])
            record(FLOOR, t, t)
        peak(FLOOR)
        buffers.clear()
    reset_peak()

    # Rank-0 torch.save of the gathered state (+ fsync).
    path = fresh("torchsave")
    for i in range(saves if TORCH_SAVE in contenders else 0):

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
        record(TORCH_SAVE, t, t)
    if TORCH_SAVE in contenders:
        peak(TORCH_SAVE)

    # Stock dcp.async_save, default and with a caching DefaultStager.
    cpu_stager = DefaultStager(StagingOptions(False, False, False, False))
    pg = dist.new_group(backend="gloo")
    for name, stager in (("dcp.async_save", None), (STAGER, cpu_stager)):
        if name not in contenders:
            continue
        path = fresh(name.replace(" ", "_").replace("+", ""))
        for i in range(saves):
            t0, (c0, d0) = time.perf_counter(), machine_counters()
            box: dict[str, Any] = {}

            def start(i: int = i, stager: Any = stager, path: str = path, box: dict = box) -> None:
                box["f"] = stock_async_save(state, os.path.join(path, f"s{i}"), pg, stager)

            blocking = timed_max(start)
            stock_wait(box["f"])
            committed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(committed, op=dist.ReduceOp.MAX)  # every rank is done
            c1, d1 = machine_counters()
            record(name, blocking, float(committed.item()), c1 - c0, d1 - d0)
        peak(name)
    cpu_stager.close()

    # The managers, built together; their saves interleaved round by round (the peak RSS
    # recorded for each is the peak over all of them).
    reset_peak()
    rank_bytes = sum(v.nbytes for v in state.values())
    managers = {}
    for n, (name, staging, background, budget) in enumerate(MANAGERS):
        if name not in contenders:
            continue
        out[name] = {"blocking": [], "committed": [], "cpu_s": [], "disk_bytes": []}
        managers[name] = CheckpointManager(
            fresh(f"manager_{n}"),
            local_tier_dir=fresh(f"nvme_{n}_{rank}") if staging else None,
            strict=True,
            background=background,
            max_staging_bytes=None if budget is None else int(rank_bytes * budget),
        )
    names = list(managers)
    for i in range(saves):
        # Round 0 (the first saves, reported apart) runs the process managers first, right
        # after construction: their first save shows what is left of the writer start.
        order = names[::-1] if i == 0 else rotated(names, i)
        for name in order:
            mgr = managers[name]
            c0, d0 = machine_counters()
            blocking = timed_max(lambda i=i, mgr=mgr: mgr.save(i, state))
            mgr.wait()
            committed = torch.tensor([mgr.records[-1].total_s], dtype=torch.float64)
            dist.all_reduce(committed, op=dist.ReduceOp.MAX)  # every rank is done
            c1, d1 = machine_counters()
            record(name, blocking, float(committed.item()), c1 - c0, d1 - d0)
    for name, mgr in managers.items():
        mgr.close()
        out[name]["peak_rss_mib"] = peak_rss_mib()  # type: ignore[assignment]
    state.clear()
    if not with_interference:
        return out, {}
    return out, interference(rank, mib_per_rank, saves, fresh)


def summarise(results: list[dict], total_mib: int) -> list[dict]:
    """One row per contender from every rank's results (times are already max over ranks)."""
    result = results[0]
    rows = []
    for name, r in result.items():
        steady_b = r["blocking"][1:] or r["blocking"]
        steady_c = r["committed"][1:] or r["committed"]
        steady_cpu = r.get("cpu_s", [])[1:]
        steady_disk = r.get("disk_bytes", [])[1:]
        rows.append(
            {
                "contender": name,
                "first_blocking_s": r["blocking"][0],
                "blocking_s": statistics.median(steady_b),
                "blocking_min_s": min(steady_b),
                "blocking_max_s": max(steady_b),
                "committed_s": statistics.median(steady_c),
                "committed_min_s": min(steady_c),
                "committed_max_s": max(steady_c),
                "gib": total_mib / 1024,
                "peak_rss_mib": max(res[name].get("peak_rss_mib", 0.0) for res in results),
                "cpu_s": statistics.median(steady_cpu) if steady_cpu else None,
                "disk_mb": statistics.median(steady_disk) / 1e6 if steady_disk else None,
                "disk_mb_s": (
                    statistics.median(d / 1e6 / w for d, w in zip(steady_disk, steady_c))
                    if steady_disk
                    else None
                ),
                "cores_busy": (
                    statistics.median(c / w for c, w in zip(steady_cpu, steady_c))
                    if steady_cpu
                    else None
                ),
            }
        )
    by_name = {r["contender"]: r for r in rows}
    floor = by_name.get(FLOOR, {}).get("blocking_s")
    tsave = by_name.get(TORCH_SAVE, {}).get("blocking_s")
    stager = by_name.get(STAGER, {}).get("committed_s")
    for r in rows:
        r["committed_x_stager"] = r["committed_s"] / stager if stager else None
        r["x_floor"] = r["blocking_s"] / floor if floor else None
        r["torch_save_over"] = tsave / r["blocking_s"] if tsave else None
        # The least time the machine's cores allow for the CPU this save used.
        bound = r["cpu_s"] / (os.cpu_count() or 1) if r["cpu_s"] else None
        r["committed_x_cpu_bound"] = r["committed_s"] / bound if bound else None
    return rows


def _ratio(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict]) -> str:
    return markdown(
        "contender|blocking s (median, steady)|min–max|first save|until committed s"
        "|min–max|÷ DefaultStager's|× copy_ floor|torch.save ÷ this"
        "|machine CPU s until committed|cores busy|committed × CPU bound"
        "|disk MB written until committed|disk MB/s",
        [
            [
                r["contender"],
                f"{r['blocking_s']:.3f}",
                f"{r['blocking_min_s']:.3f}–{r['blocking_max_s']:.3f}",
                f"{r['first_blocking_s']:.3f}",
                f"{r['committed_s']:.2f}",
                f"{r['committed_min_s']:.2f}–{r['committed_max_s']:.2f}",
                _ratio(r["committed_x_stager"]),
                _ratio(r["x_floor"]),
                _ratio(r["torch_save_over"], 1),
                _ratio(r["cpu_s"]),
                _ratio(r["cores_busy"], 1),
                _ratio(r["committed_x_cpu_bound"]),
                _ratio(r["disk_mb"], 0),
                _ratio(r["disk_mb_s"], 0),
            ]
            for r in rows
        ],
    )


def run(
    size_mib: int,
    world: int,
    saves: int,
    parent: str | None = None,
    contenders: tuple[str, ...] = CONTENDERS,
    with_interference: bool = True,
) -> dict[str, Any]:
    """The ``contenders`` on ``world`` gloo ranks; {"rows": summarise(...), "raw": per rank}."""
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        raise SystemExit(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
    base = tempfile.mkdtemp(prefix="ckptstore-bench-async-", dir=parent)
    try:
        results = run_distributed(
            bench_rank,
            world,
            size_mib // world,
            saves,
            base,
            tuple(contenders),
            with_interference,
            timeout=1800,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    raw = [contenders for contenders, _ in results]
    inter = [i for _, i in results]
    return {
        "rows": summarise(raw, size_mib),
        "raw": raw,
        "interference": summarise_interference(inter),
        "interference_raw": inter,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024, help="total state size (all ranks)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--saves", type=int, default=4, help="saves per contender (first = warm-up)")
    p.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="256 MiB, 3 saves")
    p.add_argument("--contenders", default=";".join(CONTENDERS), help="names, separated by ;")
    p.add_argument("--no-interference", action="store_true", help="skip the training loop part")
    args = p.parse_args()
    if args.quick:
        args.size_mib, args.saves = 256, 3
    names = tuple(n.strip() for n in args.contenders.split(";") if n.strip())
    load = os.getloadavg()[0]
    res = run(args.size_mib, args.world, args.saves, args.dir, names, not args.no_interference)
    res["load_avg"] = [load, os.getloadavg()[0]]
    rows = res["rows"]
    print(f"\n{args.size_mib} MiB state on {args.world} gloo ranks, {args.saves} saves each")
    print(f"(load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)\n")
    print(table(rows))
    if res["interference"]:
        print("\nA CPU-bound training loop while a background save runs (1 torch thread/rank)\n")
        print(interference_table(res["interference"]))
    out = write_results("bench_async", {"args": vars(args), **res})
    print(f"\nraw results: {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
