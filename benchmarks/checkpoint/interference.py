"""How much a CPU-bound training loop slows down while a background save runs.

Part of ``checkpoint.async_save`` (skipped with ``--no-interference``): per save, the loop's
rate for 1 s with no save in flight, then from ``save()``'s return until the commit; thread
and process mode alternate save by save, with the state in 8 tensors per rank and in 1024.
slowdown = idle rate / rate during the save.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.checkpoint.async_common import TENSORS_PER_RANK, make_state, markdown

__all__ = ["interference", "interference_table", "loop_rate", "summarise_interference"]


def loop_rate(min_s: float, done: Any = lambda: True) -> float:
    """Iterations/s of a small CPU-bound "training step" over at least ``min_s`` seconds,
    until ``done()`` (checked every 16 iterations)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(128, 128, generator=g), torch.randn(128, 128, generator=g) / 12
    n, t0 = 0, time.perf_counter()
    while True:
        x = torch.tanh(x @ w)
        n += 1
        if n % 16 == 0:
            dt = time.perf_counter() - t0
            if dt >= min_s and done():
                return n / dt


def interference(rank: int, mib_per_rank: int, saves: int, fresh: Any) -> dict[str, dict]:
    """Training-loop rate with no save in flight vs during a background save, thread vs
    process mode (alternating, so both see the same load), for the state in 8 tensors
    per rank and in 1024 (a model's many parameters and optimizer moments)."""
    from ckptstore.manager import CheckpointManager

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict[str, dict] = {}
    modes = ("thread", "process")
    try:
        for tensors in (TENSORS_PER_RANK, 1024):
            state = make_state(rank, mib_per_rank, tensors)
            mgrs = {
                m: CheckpointManager(
                    fresh(f"interference_{tensors}_{m}"), strict=True, background=m
                )
                for m in modes
            }
            for mgr in mgrs.values():
                mgr.save(0, state)  # warm-up: buffers allocated, writer process started
                mgr.wait()
            res = {m: {"idle": [], "during": [], "background_s": []} for m in modes}
            for i in range(1, saves + 1):
                for m in modes if i % 2 else modes[::-1]:
                    mgr, r = mgrs[m], res[m]
                    dist.barrier()
                    r["idle"].append(loop_rate(1.0))
                    dist.barrier()
                    mgr.save(i, state)
                    r["during"].append(
                        loop_rate(0.0, lambda mgr=mgr: mgr.records[-1].status != "writing")
                    )
                    mgr.wait()
                    r["background_s"].append(mgr.records[-1].background_s)
            for m, mgr in mgrs.items():
                mgr.close()
                out[f"{m}, {tensors} tensors/rank"] = res[m]
    finally:
        torch.set_num_threads(threads)
    return out


def summarise_interference(results: list[dict]) -> list[dict]:
    """One row per mode: medians over every rank's saves."""
    rows: list[dict] = []
    for mode in results[0] if results else ():
        per = [res[mode] for res in results]
        idle = [x for r in per for x in r["idle"]]
        during = [x for r in per for x in r["during"]]
        ratios = [i / d for r in per for i, d in zip(r["idle"], r["during"])]
        rows.append(
            {
                "mode": mode,
                "idle_its": statistics.median(idle),
                "during_its": statistics.median(during),
                "slowdown": statistics.median(ratios),
                "slowdown_max": max(ratios),
                "background_s": statistics.median(x for r in per for x in r["background_s"]),
            }
        )
    return rows


def interference_table(rows: list[dict]) -> str:
    return markdown(
        "background, state|loop it/s, no save|loop it/s during a save|slowdown (median)"
        "|slowdown (max)|save's background s",
        [
            [
                r["mode"],
                f"{r['idle_its']:.0f}",
                f"{r['during_its']:.0f}",
                f"{r['slowdown']:.2f}x",
                f"{r['slowdown_max']:.2f}x",
                f"{r['background_s']:.2f}",
            ]
            for r in rows
        ],
    )
