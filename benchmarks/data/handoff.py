"""What a torch DataLoader's ``next()`` costs for a batch its workers already made.

    python -m benchmarks.data.handoff [--kib 8,256] [--procs 2]

The floor under issue 18's "steady-state wait <= 2 % of the step": no storage, no decode,
no ckptstore loader. ``--procs`` processes (the ranks of a node) each iterate a torch
DataLoader over 2 workers that yield a ready ``(index, {"id", "blob"})`` item of ``--kib``
KiB, while the loop sleeps ``--step-ms`` per batch (so every batch is made before it is
asked for). Hand-offs, alternated ``--repeat`` times:

  stock    the item as torch sends it: each tensor's storage as shared memory
  inline   the item wrapped by ``ckptstore.data.handoff.inline``: tensors in the pipe
  inline-pipe  the same, the result pipe widened to hold a batch (``widen_result_pipe``;
           what ``ckptstore.data.DataLoader`` does)

Prints the wait in ``next()`` over the batches after the first quarter (p50, p90 and
p99 / p50 of every rank's batches), in ms and as % of the step: what any loader built on
torch's DataLoader pays per batch on this machine before it reads a byte.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from benchmarks.common import (
    cell,
    load_average,
    machine_line,
    markdown_table,
    mem_gib,
    write_results,
)
from ckptstore.data.handoff import inline, widen_result_pipe


class _Ready(IterableDataset):
    """Worker w yields items w, w+W, ...: a batch of 8 ids and a ``kib`` KiB blob."""

    def __init__(self, count: int, kib: int, mode: str) -> None:
        self.count, self.kib, self.mode = count, kib, mode

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        w, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for s in range(w, self.count, workers):
            blob = torch.zeros(self.kib * 1024, dtype=torch.uint8).view(8, -1)
            item = (s, {"id": torch.arange(8), "blob": blob})
            yield inline(item) if self.mode != "stock" else item


def _rank(count: int, kib: int, mode: str, step_s: float, barrier: Any, out: Any) -> None:
    torch.set_num_threads(1)  # as torchrun gives each rank
    loader = DataLoader(_Ready(count, kib, mode), batch_size=None, num_workers=2, in_order=True)
    it = iter(loader)
    if mode == "inline-pipe":
        widen_result_pipe(it)
    waits = []
    barrier.wait()
    for _ in range(count):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
        time.sleep(step_s)
    del it
    out.put(waits[count // 4 :])


def _run(procs: int, count: int, kib: int, mode: str, step_s: float) -> list[float]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [
        ctx.Process(target=_rank, args=(count, kib, mode, step_s, barrier, out))
        for _ in range(procs)
    ]
    for p in ps:
        p.start()
    waits = [w for _ in ps for w in out.get(timeout=600)]
    for p in ps:
        p.join()
    return waits


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kib", default="8,256", help="batch sizes in KiB, comma-separated")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--step-ms", type=float, default=40.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    step_s = args.step_ms / 1e3
    sizes = [int(k) for k in args.kib.split(",")]

    machine: dict[str, Any] = {"nproc": os.cpu_count(), "mem_gib": mem_gib()}
    machine["loadavg_before"] = load_average()
    runs: dict[str, list[list[float]]] = {}
    for _ in range(args.repeat):
        for kib in sizes:
            for mode in ("stock", "inline", "inline-pipe"):
                runs.setdefault(f"{mode} {kib}", []).append(
                    _run(args.procs, args.batches, kib, mode, step_s)
                )
    machine["loadavg_after"] = load_average()

    rows = []
    for name, rs in runs.items():
        p50s = [_pct(r, 50) for r in rs]
        p50 = statistics.median(p50s)
        mode, kib = name.split()
        rows.append(
            [
                mode,
                kib,
                cell(p50 * 1e3),
                f"{min(p50s) * 1e3:.2f}–{max(p50s) * 1e3:.2f}",
                cell(statistics.median(_pct(r, 90) for r in rs) * 1e3),
                cell(statistics.median(_pct(r, 99) / _pct(r, 50) for r in rs), ".1f", "x"),
                cell(p50 / step_s * 100, ".1f", " %"),
            ]
        )
    print(
        f"{args.procs} processes x 2 workers, {args.batches} batches, {args.step_ms:g} ms step, "
        f"{args.repeat} runs each"
    )
    print(
        markdown_table(
            ["hand-off", "KiB", "wait p50 ms", "min–max", "p90 ms", "p99 / p50", "p50 % of step"],
            "lrrrrrr",
            rows,
        )
    )
    print(machine_line(machine))
    print(write_results("bench_handoff", {"args": vars(args), "machine": machine, "runs": runs}))


if __name__ == "__main__":
    main()
