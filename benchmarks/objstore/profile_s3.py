"""cProfile of one process saving/loading one rank's share to SeaweedFS, every thread included.

    python -m benchmarks.objstore.profile_s3          # 512 MiB (one rank of objstore.save_load)
    python -m benchmarks.objstore.profile_s3 --link shaped --only save --top 30
    python -m benchmarks.objstore.profile_s3 --contenders raw,ckptstore --profile ckptstore

Starts its own SeaweedFS (and, for ``--link shaped``, the shaped link), then runs each
contender of ``objstore.save_load`` (same code) in this one process, without a process
group (DCP's single-process path), ``--repeats`` times unprofiled, printing wall, this
process's CPU and SeaweedFS's CPU; then once more under cProfile for the contenders named
by ``--profile``. cProfile sees only its own thread, so a profiler is started in every
thread (``threading.setprofile``): the caller, the transfer engine's I/O pool and fsspec's
event-loop thread, where s3fs/aiobotocore do all their network I/O and request signing.
Per-thread stats are merged; ``tottime`` includes time a thread spends blocked inside a
C call (``lock.acquire``, ``epoll.poll``), so read those lines as waiting, not work.
cProfile slows Python-heavy code; the unprofiled times are the ones to compare.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import threading
import time
from typing import Any

__all__ = ["main"]

_PROFILERS: list[tuple[str, cProfile.Profile]] = []
_LOCK = threading.Lock()


def _thread_hook(*_: Any) -> None:
    """Runs as a new thread's first profile event: give the thread its own cProfile."""
    prof = cProfile.Profile()
    with _LOCK:
        _PROFILERS.append((threading.current_thread().name, prof))
    prof.enable()


class _Snapshot:
    """What ``pstats.Stats`` needs from a profiler that may still be running in its thread."""

    def __init__(self, prof: cProfile.Profile) -> None:
        self.prof = prof
        self.stats: dict = {}

    def create_stats(self) -> None:
        if not self.stats:
            self.prof.snapshot_stats()
            self.stats = dict(self.prof.stats)  # type: ignore[attr-defined]


def _group(name: str) -> str:
    if name.startswith("ckptstore-io"):
        return "ckptstore I/O pool"
    if name.startswith("fsspecIO"):
        return "fsspec event loop"
    return name


def _report(label: str, wall: float, top: int, sort: str) -> None:
    with _LOCK:
        profs = list(_PROFILERS)
    groups: dict[str, list[cProfile.Profile]] = {}
    for name, prof in profs:
        groups.setdefault(_group(name), []).append(prof)
    print(f"\n===== {label}: {wall:.2f} s under cProfile; threads: ", end="")
    print(", ".join(f"{g} x{len(p)}" for g, p in groups.items()) + " =====")
    for group, members in groups.items():
        snaps = [_Snapshot(p) for p in members]
        for snap in snaps:
            snap.create_stats()
        snaps = [snap for snap in snaps if snap.stats]  # threads idle since clear()
        if not snaps:
            continue
        st = pstats.Stats()
        for snap in snaps:
            st.add(pstats.Stats(snap))
        out = io.StringIO()
        st.stream = out  # type: ignore[attr-defined]
        st.sort_stats(sort).print_stats(top)
        lines = [x for x in out.getvalue().splitlines() if x.strip()]
        body = [x for x in lines if "function calls" in x or x.lstrip()[:1].isdigit()]
        print(f"\n--- {group} ---")
        print("\n".join(body[: top + 2]))


def _clear() -> None:
    with _LOCK:
        for _, prof in _PROFILERS:
            prof.clear()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--link", choices=["direct", "shaped"], default="direct")
    p.add_argument("--link-mbps", type=float, default=200.0)
    p.add_argument("--link-latency-ms", type=float, default=20.0)
    p.add_argument("--contenders", default="raw,ckptstore,fsspec-nosync")
    p.add_argument("--profile", default="ckptstore", help="contenders to profile (comma list)")
    p.add_argument("--repeats", type=int, default=2, help="unprofiled runs of each contender")
    p.add_argument("--only", choices=["save", "load"], default=None)
    p.add_argument("--part-mib", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=0)
    p.add_argument("--top", type=int, default=22)
    p.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    a = p.parse_args(argv)

    threading.setprofile(_thread_hook)  # before any thread (fsspec's loop) starts
    main_prof = cProfile.Profile()
    with _LOCK:
        _PROFILERS.append(("main", main_prof))

    import torch

    from benchmarks.common import make_state, rotated
    from benchmarks.objstore.contenders import (
        BUCKET,
        LOAD_FNS,
        SAVE_FNS,
        BenchConfig,
        RankCtx,
        cpu_seconds,
        delete_prefix,
        raw_bodies,
    )
    from benchmarks.shaped_link import ShapedLink
    from harness.seaweedfs import SeaweedFS

    torch.set_num_threads(1)
    names = tuple(x for x in a.contenders.split(",") if x)
    profiled = {x for x in a.profile.split(",") if x}
    cfg = BenchConfig(
        size_mib=a.size_mib,
        world=1,
        tensors_per_rank=a.tensors,
        part_mib=a.part_mib,
        concurrency=a.concurrency,
        contenders=names,
    )
    server = SeaweedFS().start()
    link = None
    try:
        server.create_bucket(BUCKET)
        endpoints = {"direct": server.endpoint}
        if a.link == "shaped":
            link = ShapedLink(server.port, mbps=a.link_mbps, latency_ms=a.link_latency_ms)
            endpoints["shaped"] = link.start().endpoint
        assert server.proc is not None
        ctx = RankCtx(0, 1, cfg, endpoints, {}, "")
        part = cfg.transfer_config(False).part_size
        ops = [op for op in ("save", "load") if a.only in (None, op)]

        def one(name: str, key: str) -> dict[str, float]:
            out = {}
            for op in ("save", "load"):
                fns = SAVE_FNS if op == "save" else LOAD_FNS
                if name not in fns:
                    continue
                fn = fns[name]
                srv, cpu, t0 = (
                    cpu_seconds(server.proc.pid),
                    time.process_time(),
                    time.perf_counter(),
                )
                fn(ctx, a.link, key)
                out[op] = time.perf_counter() - t0
                out[f"{op}_cpu"] = time.process_time() - cpu
                out[f"{op}_server_cpu"] = cpu_seconds(server.proc.pid) - srv
            return out

        # Warm-up (imports, clients, the conditional-create probe), untimed.
        ctx.state = make_state(0, cfg, numel=64 * 1024)
        ctx.dest = {k: torch.empty_like(v) for k, v in ctx.state.items()}
        ctx.bodies = raw_bodies(ctx.state, part)
        for name in names:
            one(name, f"warm-{name}")
            delete_prefix(ctx, a.link, f"warm-{name}")
        ctx.state = make_state(0, cfg)
        ctx.dest = {k: torch.empty_like(v) for k, v in ctx.state.items()}
        ctx.bodies = raw_bodies(ctx.state, part)
        times: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for r in range(a.repeats):
            for name in rotated(names, r):
                times[name].append(one(name, f"r{r}-{name}"))
                delete_prefix(ctx, a.link, f"r{r}-{name}")
        print(f"\n{a.size_mib} MiB in one process, link {a.link}; medians of {a.repeats}:")
        print("| contender | op | wall s | client CPU s | SeaweedFS CPU s |")
        print("| --- | --- | ---: | ---: | ---: |")
        for name in names:
            for op in ops:
                if op not in times[name][0]:
                    continue

                def med(k: str, n: str = name) -> float:
                    return statistics.median(t[k] for t in times[n])

                print(
                    f"| {name} | {op} | {med(op):.2f} | {med(op + '_cpu'):.2f} | "
                    f"{med(op + '_server_cpu'):.2f} |"
                )
        for name in names:
            if name not in profiled:
                continue
            for op in ops:
                fns = SAVE_FNS if op == "save" else LOAD_FNS
                if name not in fns:
                    continue
                if op == "load":  # something to load, written unprofiled
                    SAVE_FNS[name](ctx, a.link, f"prof-{name}")
                _clear()
                main_prof.enable()
                t0 = time.perf_counter()
                fns[name](ctx, a.link, f"prof-{name}")
                wall = time.perf_counter() - t0
                main_prof.disable()
                _report(f"{name} {op}, link {a.link}", wall, a.top, a.sort)
                delete_prefix(ctx, a.link, f"prof-{name}")
    finally:
        threading.setprofile(None)
        if link is not None:
            link.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
