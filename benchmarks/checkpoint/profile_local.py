"""cProfile of one process saving/loading one rank's share with stock DCP and ckptstore.

    python -m benchmarks.checkpoint.profile_local     # 512 MiB (one rank of checkpoint.local)
    python -m benchmarks.checkpoint.profile_local --size-mib 256 --top 25 --sort tottime
    python -m benchmarks.checkpoint.profile_local --phases --repeats 5   # where a save's time goes

No process group: ``dcp.save`` / ``dcp.load`` run their single-process (no_dist) path, so
the profile shows the storage layer alone. Each contender saves into a fresh directory
under a temp dir (deleted afterwards); the load reads it back (warm page cache) into
preallocated tensors. Prints wall times and the top functions of each profile.

``--phases`` (no cProfile): saves alternately with stock DCP and ckptstore, each into a
fresh directory, timing every ``os.fsync`` (file or directory; the shard's apart) and,
for ckptstore, ``write_data`` and ``finish`` (the commit); prints the medians, so one sees
how much of a durable save is the fsync of the data itself (the disk) and how much the
rest.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main"]


def _state(size_mib: int, n: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    rows = size_mib * 1024 * 1024 // 4 // n // 1024
    return {f"t{i}": torch.randn(rows, 1024, generator=g) for i in range(n)}


def _profile(label: str, fn: Callable[[], Any], top: int, sort: str) -> float:
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    wall = time.perf_counter() - t0
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(top)
    print(f"\n===== {label}: {wall:.2f} s (under cProfile) =====")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])
    return wall


def _phases(state: dict[str, Any], base: str, repeats: int) -> None:
    """Median time of each phase of stock and ckptstore durable saves (see --phases)."""
    import stat
    import statistics

    import torch.distributed.checkpoint as dcp

    import ckptstore
    from ckptstore.dcp.writer import CkptWriter

    spent: dict[str, float] = {}
    real_fsync = os.fsync

    def timed_fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        big = os.fstat(fd).st_size >= 1 << 20
        key = "fsync dir" if stat.S_ISDIR(mode) else ("fsync data" if big else "fsync small")
        t0 = time.perf_counter()
        try:
            real_fsync(fd)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
            spent[key + " n"] = spent.get(key + " n", 0) + 1

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return run

    orig = CkptWriter.write_data, CkptWriter.finish
    CkptWriter.write_data = timed("write_data", orig[0])  # type: ignore[method-assign]
    CkptWriter.finish = timed("finish (commit)", orig[1])  # type: ignore[method-assign]
    os.fsync = timed_fsync
    rows: dict[str, list[dict[str, float]]] = {"stock DCP": [], "ckptstore": []}
    try:
        for r in range(repeats):
            for name in ("stock DCP", "ckptstore") if r % 2 == 0 else ("ckptstore", "stock DCP"):
                path = os.path.join(base, f"phase-{r}-{name.replace(' ', '_')}")
                spent.clear()
                t0 = time.perf_counter()
                if name == "stock DCP":
                    dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
                else:
                    ckptstore.save(state, path)
                spent["total"] = time.perf_counter() - t0
                rows[name].append(dict(spent))
                shutil.rmtree(path)
    finally:
        os.fsync = real_fsync
        CkptWriter.write_data, CkptWriter.finish = orig  # type: ignore[method-assign]
    print(f"\nmedians of {repeats} saves each (s; 'n' = calls), load average {os.getloadavg()}")
    for name, samples in rows.items():
        keys = sorted({k for s in samples for k in s})
        med = {k: statistics.median(s.get(k, 0.0) for s in samples) for k in keys}
        text = ", ".join(
            f"{k} {v:g}" if k.endswith(" n") else f"{k} {v:.3f}" for k, v in med.items()
        )
        print(f"  {name}: {text}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    p.add_argument("--only", choices=["save", "load"], default=None)
    p.add_argument("--phases", action="store_true", help="time the phases, no cProfile")
    p.add_argument("--repeats", type=int, default=5, help="saves per contender (--phases)")
    a = p.parse_args(argv)

    import torch
    import torch.distributed.checkpoint as dcp

    import ckptstore

    torch.set_num_threads(1)
    state = _state(a.size_mib, a.tensors)
    dest = {k: torch.empty_like(v) for k, v in state.items()}
    base = tempfile.mkdtemp(prefix="ckptstore-prof-")
    walls = {}
    try:
        stock, ours = os.path.join(base, "stock"), os.path.join(base, "ours")
        # Untimed warm-up (imports, first-call caches).
        small = {"w": torch.zeros(16)}
        dcp.save(small, storage_writer=dcp.FileSystemWriter(os.path.join(base, "w1")))
        ckptstore.save(small, os.path.join(base, "w2"))
        if a.phases:
            _phases(state, base, a.repeats)
            return 0
        if a.only in (None, "save"):
            walls["stock DCP save"] = _profile(
                "stock DCP save",
                lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(stock)),
                a.top,
                a.sort,
            )
            walls["ckptstore save"] = _profile(
                "ckptstore save", lambda: ckptstore.save(state, ours), a.top, a.sort
            )
        else:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(stock))
            ckptstore.save(state, ours)
        if a.only in (None, "load"):
            walls["stock DCP load"] = _profile(
                "stock DCP load",
                lambda: dcp.load(dest, storage_reader=dcp.FileSystemReader(stock)),
                a.top,
                a.sort,
            )
            walls["ckptstore load"] = _profile(
                "ckptstore load (verified)", lambda: ckptstore.load(dest, ours), a.top, a.sort
            )
            assert all(torch.equal(dest[k], state[k]) for k in state)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("\n" + "\n".join(f"{k}: {v:.2f} s" for k, v in walls.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
