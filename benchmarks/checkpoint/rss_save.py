"""Peak RSS a save adds, ckptstore against stock DCP, and where in the save it is reached.

    python -m benchmarks.checkpoint.rss_save               # 256 and 1024 MiB, 1 and 2 ranks
    python -m benchmarks.checkpoint.rss_save --sizes 256 --worlds 1 --repeats 3

Every rank holds ``size / world`` bytes as 8 float32 tensors. For each contender (stock
``dcp.save`` + ``FileSystemWriter``; ``ckptstore.save``; the manager's ``save_step`` given
the state as if already staged: what its writer adds, not the staging copy), in a rotated
order, each into a fresh
directory: the rank's peak RSS is reset (``common.reset_peak``) right before the save, and the
number reported is ``VmHWM`` after it minus the RSS before it (MiB, max over ranks and
repeats): what the save itself added. A sampler thread reads ``VmRSS`` every millisecond
and reports, for ckptstore, the phase in which the most was resident (the DCP writer's
``write_data`` / ``finish``; "plan" before them). The engine's buffer pool counters
(``BufferPool.peak_buffers_out``, ``created``) are printed for the ckptstore saves.

The first save of each contender is a warm-up (imports, first-call caches, the engine's
first buffers) and is not counted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import current_rss_mib, peak_rss_mib, reset_peak, rotated

__all__ = ["main"]

CONTENDERS = ("stock DCP", "ckptstore", "manager save_step")


class Sampler:
    """RSS (MiB) every ``interval`` s on a thread, tagged with the phase set meanwhile."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.phase = "plan"
        self.top: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = current_rss_mib()
            self.top[self.phase] = max(self.top.get(self.phase, 0.0), rss)
            time.sleep(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _phased(sampler: Sampler) -> Callable[[], None]:
    """Tag the sampler's phase from the ckptstore writer's ``write_data`` / ``finish``."""
    from ckptstore.dcp.writer import CkptWriter

    orig_write, orig_finish = CkptWriter.write_data, CkptWriter.finish

    def write_data(self: Any, *a: Any, **k: Any) -> Any:
        sampler.phase = "write_data"
        try:
            return orig_write(self, *a, **k)
        finally:
            sampler.phase = "between"

    def finish(self: Any, *a: Any, **k: Any) -> Any:
        sampler.phase = "finish"
        try:
            return orig_finish(self, *a, **k)
        finally:
            sampler.phase = "after"

    CkptWriter.write_data, CkptWriter.finish = write_data, finish  # type: ignore[method-assign]

    def undo() -> None:
        CkptWriter.write_data, CkptWriter.finish = orig_write, orig_finish  # type: ignore[method-assign]

    return undo


def _save(name: str, state: dict[str, Any], path: str, step: int) -> None:
    import torch.distributed.checkpoint as dcp

    import ckptstore

    if name == "stock DCP":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    elif name == "ckptstore":
        ckptstore.save(state, ckptstore.writer(path))
    else:  # the manager's save path, given the state as if already staged
        from ckptstore.config import TransferConfig
        from ckptstore.engine.transfer import TransferEngine
        from ckptstore.manager.options import SaveOptions
        from ckptstore.manager.saving.save_step import save_step
        from ckptstore.stores import open_store

        save_step(
            state,
            open_store(path),
            step,
            SaveOptions(),
            engine=TransferEngine.shared(TransferConfig()),
            timings={},
        )


def _rank_main(rank: int, world: int, size_mib: int, repeats: int, base: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from ckptstore.config import TransferConfig
    from ckptstore.engine.transfer import TransferEngine

    torch.set_num_threads(1)
    n = 8
    numel = size_mib * 2**20 // world // n // 4 // 1024 * 1024
    g = torch.Generator().manual_seed(rank)
    state = {f"r{rank}.t{i}": torch.randn(numel // 1024, 1024, generator=g) for i in range(n)}
    pool = TransferEngine.shared(TransferConfig()).buffers
    out: dict[str, Any] = {c: [] for c in CONTENDERS}
    phases: list[dict[str, float]] = []
    pool_stats: list[tuple[int, int]] = []
    for r in range(repeats + 1):
        for name in rotated(CONTENDERS, r):
            path = os.path.join(base, f"{size_mib}-{world}-{r}-{name.replace(' ', '_')}")
            dist.barrier()
            before = current_rss_mib()
            created0 = getattr(pool, "created", 0)  # (counters absent before this change)
            getattr(pool, "reset_peaks", lambda: None)()
            reset_peak()
            sampler = Sampler()
            undo = _phased(sampler)
            try:
                with sampler:
                    _save(name, state, path, 1)
                    dist.barrier()
            finally:
                undo()
            added = peak_rss_mib() - before
            if r > 0:
                out[name].append(added)
                if name == "ckptstore":
                    phases.append({k: v - before for k, v in sampler.top.items()})
                    pool_stats.append(
                        (
                            getattr(pool, "peak_buffers_out", 0),
                            getattr(pool, "created", 0) - created0,
                        )
                    )
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    return {"added": out, "phases": phases, "pool": pool_stats}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="256,1024", help="total state MiB, comma-separated")
    p.add_argument("--worlds", default="1,2", help="rank counts, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default="", help="parent directory (default: a temp dir)")
    a = p.parse_args(argv)

    from harness.dist import run_distributed

    base = a.dir or tempfile.mkdtemp(prefix="ckptstore-rss-")
    os.makedirs(base, exist_ok=True)
    print(f"load average before: {os.getloadavg()}")
    print("| MiB | ranks | " + " | ".join(f"{c} MiB added" for c in CONTENDERS) + " |")
    print("|---:|---:|" + "---:|" * len(CONTENDERS))
    details = []
    try:
        for size in (int(s) for s in a.sizes.split(",")):
            for world in (int(w) for w in a.worlds.split(",")):
                res = run_distributed(_rank_main, world, size, a.repeats, base, timeout=1800)
                cells = []
                for c in CONTENDERS:
                    worst = [max(r["added"][c][i] for r in res) for i in range(a.repeats)]
                    cells.append(f"{statistics.median(worst):.1f} (max {max(worst):.1f})")
                print(f"| {size} | {world} | " + " | ".join(cells) + " |", flush=True)
                details.append((size, world, res[0]["phases"], res[0]["pool"]))
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")
    print("\nckptstore, rank 0: most RSS above the start, by phase (MiB); pool peak / created")
    for size, world, phases, pool in details:
        for ph, (peak, created) in zip(phases, pool):
            text = ", ".join(f"{k} {v:.1f}" for k, v in ph.items())
            pooled = f"pool peak {peak >> 20} MiB, new {created >> 20} MiB"
            print(f"  {size} MiB x{world}: {text}; {pooled}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
