"""Async-save scaling: blocking and committed time against state size and ranks (issue 17).

    python -m benchmarks.checkpoint.async_scaling [--sizes-mib 256,1024,4096] [--worlds 1,2,4]
        [--saves 3] [--shm /dev/shm] [--contenders "NAME;..."] [--torch-threads N]

For every (total size, ranks) cell, on gloo ranks started for that cell, each contender
saves ``--saves`` times, interleaved round by round (the first round apart as warm-up);
timings are the max over ranks, "steady" the median of the other rounds:

- ``copy_`` floor: a bare ``copy_`` of the state into preallocated buffers;
- ``dcp.async_save`` + ``DefaultStager`` (CPU options, cached buffers) to ``FileSystemWriter``;
- ckptstore manager (thread backend, staging arena);
- ckptstore manager with ``local_tier_dir`` on ``--shm`` (tmpfs standing in for NVMe: the local
  tier and the destination are different devices, so the tee writes both at once);
- ckptstore manager with ``max_staging_bytes`` = half the rank's state (half stays live:
  blocking grows by about the time to write that half);
- ckptstore manager with ``background="process"`` (a writer process per rank, built with
  the others: its start falls in the warm-up round).

``--contenders`` picks some of them (names as above, separated by ``;``; the ratios need
the floor and ``DefaultStager``, and read 0 without them). Above 1 GiB per rank the floor
copies every tensor into one preallocated buffer the size of the largest (the same bytes
moved; every tensor is then >= 128 MiB, far beyond any cache), so that a 4 GiB cell holds
the state, the floor and each contender's staging copy within this machine's memory.

"CPU s" is the CPU time one steady save cost, summed over the ranks and their writer
processes (``os.times`` user + system of each rank, every thread of it, plus ``/proc``'s
utime + stime of its writer process), median over the steady rounds, with the part spent
in the kernel in parentheses (page-cache writes, page faults); "÷ CPU bound" is
committed time over that CPU time divided by the machine's cores (``os.cpu_count()``):
1.0 means the save kept every core busy from ``save()`` to the commit, i.e. it is bound
by CPU, not by the disk or by waiting.

"paired" is a blocking (or committed) time over ``DefaultStager``'s of the same round,
median over the steady rounds (the ratio of medians beside it can be moved by a drift of
the machine between rounds).

The destination is a directory on the machine's disk. "RSS added" is the most a steady
save raised a rank's RSS above what was resident before it (``benchmarks.common.peak_rss_mib``): the
writer's buffers, as every contender's staging copy stays resident between its saves.
Writes a markdown table and a JSON file to ``benchmarks/results/`` and, when matplotlib is
installed, PNG plots to ``benchmarks/figures/`` (``async_scaling_size.png``,
``async_scaling_ranks.png``).
"""

from __future__ import annotations

import argparse
import json
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
    stock_async_save,
    stock_wait,
    timed_max,
)
from benchmarks.common import FIGURES_DIR, peak_rss_mib, reset_peak, rotated, write_results
from harness.dist import run_distributed

FLOOR = "copy_ floor"
MANAGER = "ckptstore manager"
STAGED = "ckptstore manager + local_tier_dir on tmpfs"
BUDGET = "ckptstore manager, budget = state / 2"
PROCESS = "ckptstore manager (process)"
CONTENDERS = (FLOOR, STAGER, MANAGER, STAGED, BUDGET, PROCESS)
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int | None) -> tuple[float, float]:
    """CPU seconds of process ``pid`` from /proc: (utime + stime, stime); 0s without one."""
    if pid is None:
        return 0.0, 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK


def scaling_rank(
    rank: int,
    world: int,
    mib_per_rank: int,
    saves: int,
    base: str,
    shm: str,
    names: tuple[str, ...] = CONTENDERS,
    torch_threads: int | None = None,
):
    """Every contender's saves (of ``names``), interleaved round by round (the order
    rotated each round), so that the machine's load drifts over all of them alike; with
    ``torch_threads``, torch's intra-op threads set to that first (torchrun's
    ``OMP_NUM_THREADS=1``)."""
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from ckptstore.manager import CheckpointManager

    state = make_state(rank, mib_per_rank)
    out: dict[str, dict[str, Any]] = {
        c: {"blocking": [], "committed": [], "rss_added_mib": [], "cpu_s": [], "sys_s": []}
        for c in names
    }

    def max_over_ranks(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def sum_over_ranks(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item())

    if FLOOR not in names:
        buffers: dict[str, torch.Tensor] = {}
    elif mib_per_rank > 1024:  # one buffer for all: see the module docstring
        largest = max(state.values(), key=lambda v: v.numel())
        one = torch.empty_like(largest)
        buffers = {k: one[: v.numel()] for k, v in state.items()}
    else:
        buffers = {k: torch.empty_like(v) for k, v in state.items()}

    def floor(i: int) -> tuple[float, float]:
        t = timed_max(lambda: [buffers[k].copy_(v) for k, v in state.items()])
        return t, t

    stager = DefaultStager(StagingOptions(False, False, False, False))
    pg = dist.new_group(backend="gloo")
    dcp_path = fresh_dir(base, "dcp", rank)

    def stock(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        box: dict[str, Any] = {}

        def start() -> None:
            box["f"] = stock_async_save(state, os.path.join(dcp_path, f"s{i}"), pg, stager)

        blocking = timed_max(start)
        stock_wait(box["f"])
        if rank == 0 and i >= 2:  # keep the disk from filling: two stock steps at most
            shutil.rmtree(os.path.join(dcp_path, f"s{i - 2}"), ignore_errors=True)
        return blocking, max_over_ranks(time.perf_counter() - t0)

    half = max(1, mib_per_rank * 1024 * 1024 // 2)
    managers: dict[str, Any] = {}
    for name, staging, budget, background in (
        (MANAGER, False, None, "thread"),
        (STAGED, True, None, "thread"),
        (BUDGET, False, half, "thread"),
        (PROCESS, False, None, "process"),
    ):
        if name not in names:
            continue
        root = fresh_dir(base, name.replace(" ", "_").replace(",", "").replace("/", ""), rank)
        root = root.replace("(", "").replace(")", "")
        local_tier_dir = fresh_dir(shm, f"nvme_{len(managers)}_{rank}", rank) if staging else None
        managers[name] = CheckpointManager(
            root,
            local_tier_dir=local_tier_dir,
            strict=True,
            max_staging_bytes=budget,
            background=background,
        )

    def manager(name: str) -> Any:
        def save(i: int) -> tuple[float, float]:
            mgr = managers[name]
            blocking = timed_max(lambda: mgr.save(i, state))
            mgr.wait()
            return blocking, max_over_ranks(mgr.records[-1].total_s)

        return save

    runs = {FLOOR: floor, STAGER: stock, **{n: manager(n) for n in managers}}

    def cpu_now(name: str) -> tuple[float, float]:
        """(CPU s, of which in the kernel) of this rank and its writer process so far."""
        bg = managers[name]._bg if name in managers else None
        total, kernel = _cpu_s(bg.writer.proc.pid if bg is not None else None)
        t = os.times()
        return t.user + t.system + total, t.system + kernel

    for i in range(saves):
        for name in rotated(names, i):
            reset_peak()
            before = peak_rss_mib()
            cpu = cpu_now(name)
            blocking, committed = runs[name](i)
            now = cpu_now(name)
            out[name]["cpu_s"].append(sum_over_ranks(now[0] - cpu[0]))
            out[name]["sys_s"].append(sum_over_ranks(now[1] - cpu[1]))
            out[name]["blocking"].append(blocking)
            out[name]["committed"].append(committed)
            out[name]["rss_added_mib"].append(peak_rss_mib() - before)
    for mgr in managers.values():
        mgr.close()
    stager.close()
    return out


def summarise(results: list[dict], size_mib: int, world: int) -> list[dict]:
    """One row per contender (times are already max over ranks; peak RSS: the max rank)."""
    raw, rows = results[0], []
    cores = os.cpu_count() or 1
    for name, r in raw.items():
        b, c = r["blocking"][1:] or r["blocking"], r["committed"][1:] or r["committed"]
        cpu = statistics.median(r["cpu_s"][1:] or r["cpu_s"])
        kernel = r.get("sys_s", [])
        rows.append(
            {
                "contender": name,
                "size_mib": size_mib,
                "world": world,
                "blocking_s": statistics.median(b),
                "blocking_range": (min(b), max(b)),
                "committed_s": statistics.median(c),
                "committed_range": (min(c), max(c)),
                "cpu_s": cpu,
                "sys_s": statistics.median(kernel[1:] or kernel) if kernel else None,
                "committed_x_cpu_bound": statistics.median(c) / (cpu / cores) if cpu else 0.0,
                # steady saves: the RSS a save adds over what is resident (its buffers)
                "rss_added_mib": max(
                    max(res[name]["rss_added_mib"][1:] or [0.0]) for res in results
                ),
            }
        )
    floor = next((r["blocking_s"] for r in rows if r["contender"] == FLOOR), None)
    ref = next((r for r in rows if r["contender"] == STAGER), None)
    for r in rows:
        r["blocking_x_floor"] = r["blocking_s"] / floor if floor else 0.0
        r["blocking_x_stager"] = r["blocking_s"] / ref["blocking_s"] if ref else 0.0
        r["committed_x_stager"] = r["committed_s"] / ref["committed_s"] if ref else 0.0
        for key in ("blocking", "committed"):
            r[f"{key}_x_stager_paired"] = _paired(raw, r["contender"], key) if ref else None
    return rows


def _paired(raw: dict, name: str, key: str) -> float | None:
    """``name``'s ``key`` time over ``DefaultStager``'s in the same round, median over the
    steady rounds (every contender saves once a round, in turn): a drift of the machine
    between rounds moves both sides of each ratio alike."""
    mine, theirs = raw[name][key][1:], raw[STAGER][key][1:]
    if not theirs or len(mine) != len(theirs):
        return None
    return statistics.median(a / b for a, b in zip(mine, theirs, strict=True))


def _opt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def table(rows: list[dict]) -> str:
    head = (
        "| MiB | ranks | contender | blocking s | min–max | × copy_ | × DefaultStager | paired "
        "| committed s | min–max | × DefaultStager | paired | RSS added MiB/rank "
        "| CPU s (kernel) | ÷ CPU bound |\n"
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r['size_mib']} | {r['world']} | {r['contender']} | {r['blocking_s']:.3f} "
        f"| {r['blocking_range'][0]:.3f}–{r['blocking_range'][1]:.3f} "
        f"| {r['blocking_x_floor']:.2f} | {r['blocking_x_stager']:.2f} "
        f"| {_opt(r.get('blocking_x_stager_paired'))} "
        f"| {r['committed_s']:.2f} | {r['committed_range'][0]:.2f}–{r['committed_range'][1]:.2f} "
        f"| {r['committed_x_stager']:.2f} | {_opt(r.get('committed_x_stager_paired'))} "
        f"| {r['rss_added_mib']:.0f} "
        f"| {r.get('cpu_s', 0.0):.2f} ({_opt(r.get('sys_s'))}) "
        f"| {r.get('committed_x_cpu_bound', 0.0):.2f} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def plot(rows: list[dict], figures: str) -> list[str]:
    """PNG plots of blocking and committed time against size and ranks; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots written")
        return []
    os.makedirs(figures, exist_ok=True)
    written = []
    for axis, other, fname in (
        ("size_mib", "world", "async_scaling_size.png"),
        ("world", "size_mib", "async_scaling_ranks.png"),
    ):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        fixed_values = sorted({r[other] for r in rows})
        styles = ["-", "--", ":", "-."]
        for ax, metric in zip(axes, ("blocking_s", "committed_s"), strict=True):
            for n, name in enumerate(CONTENDERS):  # one colour per contender
                if metric == "committed_s" and name == FLOOR:
                    continue
                for m, fixed in enumerate(fixed_values):  # one line style per ranks / size
                    pts = sorted(
                        (r[axis], r[metric])
                        for r in rows
                        if r[other] == fixed and r["contender"] == name
                    )
                    if len(pts) < 2:
                        continue
                    ax.plot(
                        *zip(*pts),
                        marker="o",
                        color=f"C{n}",
                        linestyle=styles[m % len(styles)],
                        label=f"{name} ({'ranks' if other == 'world' else 'MiB'}={fixed})",
                    )
            ax.set_xlabel("total state MiB" if axis == "size_mib" else "ranks")
            ax.set_ylabel(metric.replace("_s", " s") + " (median of steady saves)")
            if axis == "size_mib":
                ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=5)
        fig.tight_layout()
        path = os.path.join(figures, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes-mib", default="256,1024,4096")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--saves", type=int, default=3, help="saves per contender (first = warm-up)")
    p.add_argument("--shm", default="/dev/shm", help="the local tier (tmpfs standing in for NVMe)")
    p.add_argument("--dir", default=None, help="the destination's parent (default: a temp dir)")
    p.add_argument("--contenders", default=";".join(CONTENDERS), help="names, separated by ;")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads per rank (1: what torchrun's OMP_NUM_THREADS=1 gives "
        "every rank of a node with more cores than ranks; default: torch's own)",
    )
    p.add_argument(
        "--plot-only", metavar="JSON", nargs="+", help="redraw the plots from earlier runs' rows"
    )
    args = p.parse_args()
    if args.plot_only:
        rows_of: list[dict] = []
        for name in args.plot_only:
            with open(name) as f:
                rows_of.extend(json.load(f)["rows"])
        for path in plot(rows_of, FIGURES_DIR):
            print(f"plot: {os.path.relpath(path)}")
        return
    names = tuple(n.strip() for n in args.contenders.split(";") if n.strip())
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        p.error(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
    rows: list[dict] = []
    for size in (int(s) for s in args.sizes_mib.split(",")):
        for world in (int(w) for w in args.worlds.split(",")):
            base = tempfile.mkdtemp(prefix="ckptstore-scaling-", dir=args.dir)
            shm = tempfile.mkdtemp(prefix="ckptstore-scaling-", dir=args.shm)
            t = time.time()
            try:
                raw = run_distributed(
                    scaling_rank,
                    world,
                    size // world,
                    args.saves,
                    base,
                    shm,
                    names,
                    args.torch_threads,
                    timeout=3600,
                )
            finally:
                shutil.rmtree(base, ignore_errors=True)
                shutil.rmtree(shm, ignore_errors=True)
            cell = summarise(raw, size, world)
            rows.extend(cell)
            load = os.getloadavg()[0]
            for r in cell:
                r["load_end"] = load
            print(f"\n{size} MiB on {world} ranks ({time.time() - t:.0f} s, load {load:.1f})")
            print(table(cell), flush=True)
    print("\n" + table(rows))
    out = write_results("bench_async_scaling", {"args": vars(args), "rows": rows})
    print(f"\nraw results: {os.path.relpath(out)}")
    for path in plot(rows, FIGURES_DIR):
        print(f"plot: {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
