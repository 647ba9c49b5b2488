"""nvidia-resiliency-ext's local checkpoints with replication vs ckptstore's peer tier.

    benchmarks/peers/setup_nvrx.sh                 # once: benchmarks/peers/.nvrx-venv
    benchmarks/peers/.nvrx-venv/bin/python -m benchmarks.peers.nvrx_local            # 128 MiB
    benchmarks/peers/.nvrx-venv/bin/python -m benchmarks.peers.nvrx_local --quick    # 32 MiB

Two gloo ranks = two simulated nodes (each its own local directory, on this machine's
disk). Each rank holds ``--size-mib`` of float32 noise: half replicated (the same on both
ranks), half its own. Per repeat and contender, in fresh processes: a save (barrier -> save
-> barrier), node 1 "replaced" (its directory removed), every file left fsynced and dropped
from the page cache, then a restore on both ranks in fresh processes, checked bitwise.

  nvrx       ``LocalCheckpointManager`` + ``CliqueReplicationStrategy`` (factor 2), sync save,
             through the CPU adapter of ``nvrx_rank`` (0.4.1 is CUDA-only, see there).
             Local only: it has no bucket; a node keeps its own state and its peer's.
  ckptstore  ``CheckpointManager(root, local_tier_dir=node dir, replicas=1)``, root a local
             directory (the "bucket"); save = ``save()`` + ``wait()`` (bucket write, local
             tier, replication); the bytes the restore reads from the root are counted.

Also reported: each node's local disk after the save, and node 1's after the restore (ckptstore
re-seeds the replaced node's tier; nvrx keeps what it received in memory only).

Contenders alternate which goes first. Output: a Markdown table (median, min-max) and JSON
in benchmarks/results/bench_nvrx_local-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import (
    REPO_ROOT,
    MiB,
    cell,
    command_line,
    load_average,
    markdown_table,
    mem_gib,
    rank_env,
    rotated,
    write_results,
)

__all__ = ["main", "run"]

CONTENDERS = ("nvrx", "ckptstore")


def _port() -> int:
    """A free loopback port (``harness.dist.free_port``'s job: the harness is not
    installed in the venv this benchmark runs in)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(spec: dict[str, Any], world: int, timeout: float) -> list[dict[str, Any]]:
    """``world`` fresh rank processes under torchrun's environment; their results."""
    tag = f"{spec['contender']}-{spec['phase']}"
    spec_path = os.path.join(spec["logs"], f"{tag}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port, procs, outs = _port(), [], []
    for r in range(world):
        env = rank_env(r, world, port)
        outs.append(os.path.join(spec["logs"], f"{tag}.rank{r}.out.json"))
        log = open(os.path.join(spec["logs"], f"{tag}.rank{r}.log"), "w")  # noqa: SIM115
        cmd = [sys.executable, "-m", "benchmarks.peers.nvrx_rank", spec_path, outs[-1]]
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=log))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:  # a rank left waiting in a collective when its peer failed
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r, out in enumerate(outs):
        if not os.path.exists(out) or procs[r].returncode != 0:
            with open(os.path.join(spec["logs"], f"{tag}.rank{r}.log")) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"{tag} rank {r} failed (exit {procs[r].returncode}):\n{tail}")
        with open(out) as f:
            results.append(json.load(f))
    return results


def _files(root: str) -> list[str]:
    return [os.path.join(d, n) for d, _dirs, names in os.walk(root) for n in names]


def _sync_and_evict(root: str) -> None:
    """fsync every file (nvrx's ``torch.save`` does not), then drop it from the page cache."""
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _du(root: str) -> int:
    return sum(os.path.getsize(p) for p in _files(root)) if os.path.isdir(root) else 0


def one_round(contender: str, args: argparse.Namespace, base: str) -> dict[str, Any]:
    """Save, replace node 1, restore; one sample of every figure."""
    work = tempfile.mkdtemp(prefix=f"{contender}-", dir=base)
    logs = tempfile.mkdtemp(prefix=f"{contender}-logs-", dir=base)
    spec = {"contender": contender, "size_mib": args.size_mib, "work": work, "logs": logs}
    try:
        save = run_ranks({**spec, "phase": "save"}, args.world, args.timeout)
        node_bytes = [_du(os.path.join(work, f"node{r}")) for r in range(args.world)]
        root_bytes = _du(os.path.join(work, "root"))
        shutil.rmtree(os.path.join(work, "node1"))  # node 1 replaced: an empty local disk
        _sync_and_evict(work)
        restore = run_ranks({**spec, "phase": "restore"}, args.world, args.timeout)
        reseeded = _du(os.path.join(work, "node1"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    return {
        "save_s": max(r["span_s"] for r in save),
        "save_blocking_s": save[0].get("blocking_s"),
        "restore_s": max(r["span_s"] for r in restore),
        "restore_replaced_s": restore[1]["own_s"],
        "root_read_bytes": sum(r["root_bytes"] for r in restore),
        "root_data_read_bytes": sum(r.get("root_data_bytes", 0) for r in restore),
        "bitwise": all(r["bitwise"] for r in restore),
        "node_bytes": node_bytes,
        "bucket_bytes": root_bytes,
        "node1_after_restore_bytes": reseeded,
    }


def _med(samples: list[float]) -> str:
    return f"{cell(statistics.median(samples))} ({cell(min(samples))}–{cell(max(samples))})"


def report(rounds: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    rows = []
    for name, rs in rounds.items():
        rows.append(
            [
                name,
                _med([r["save_s"] for r in rs]),
                _med([r["restore_replaced_s"] for r in rs]),
                _med([r["restore_s"] for r in rs]),
                cell(max(r["root_data_read_bytes"] for r in rs) / MiB, ".1f"),
                cell(statistics.mean(r["node_bytes"][0] for r in rs) / MiB, ".0f"),
                cell(statistics.mean(r["bucket_bytes"] for r in rs) / MiB, ".0f"),
                cell(statistics.mean(r["node1_after_restore_bytes"] for r in rs) / MiB, ".0f"),
                "yes" if all(r["bitwise"] for r in rs) else "NO",
            ]
        )
    header = [
        "contender",
        "save s",
        "restore, replaced node s",
        "restore, both s",
        "bucket data read MiB",
        "node 0 disk MiB",
        "bucket MiB",
        "node 1 disk after restore MiB",
        "bitwise",
    ]
    title = (
        f"{args.world} gloo ranks (simulated nodes), {args.size_mib} MiB per rank "
        f"(half replicated), {args.repeats} repeats; median (min–max)"
    )
    return title + "\n\n" + markdown_table(header, "lrrrrrrrl", rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="bench-nvrx-", dir=args.dir)
    load_before = load_average()
    rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    try:
        for i in range(args.repeats):
            for contender in rotated(CONTENDERS, i):
                rounds[contender].append(one_round(contender, args, base))
                print(f"repeat {i} {contender}: {rounds[contender][-1]}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    from importlib.metadata import version

    return {
        "command": command_line(),
        "machine": {
            "nproc": os.cpu_count(),
            "mem_gib": mem_gib(),
            "loadavg_before": load_before,
            "loadavg_after": load_average(),
            "torch": version("torch"),
            "nvidia_resiliency_ext": version("nvidia-resiliency-ext"),
        },
        "size_mib": args.size_mib,
        "world": args.world,
        "rounds": rounds,
        "table": report(rounds, args),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=None, help="per rank (default 128)")
    p.add_argument("--repeats", type=int, default=None, help="(default 3)")
    p.add_argument("--world", type=int, default=2, help="gloo ranks, even (default 2)")
    p.add_argument("--dir", default=None, help="where the node and bucket dirs go (a temp dir)")
    p.add_argument("--timeout", type=float, default=600.0, help="per phase, s")
    p.add_argument("--quick", action="store_true", help="32 MiB, 2 repeats")
    args = p.parse_args(argv)
    args.size_mib = args.size_mib or (32 if args.quick else 128)
    args.repeats = args.repeats or (2 if args.quick else 3)
    t0 = time.monotonic()
    result = run(args)
    print(result["table"])
    print(f"\n{time.monotonic() - t0:.0f} s; results: {write_results('bench_nvrx_local', result)}")


if __name__ == "__main__":
    main()
