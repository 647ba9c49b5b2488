"""Durable local save, paired: ckptstore vs stock ``FileSystemWriter``, a fresh process each.

    python -m benchmarks.checkpoint.durable_local                 # 512 MiB, 5 pairs
    python -m benchmarks.checkpoint.durable_local --pairs 9 --size-mib 1024 --dir /mnt/x

Each run is a child process (``--child NAME``): it builds the state (float32, one process,
no process group), saves a tiny untimed warm-up, then times ``dcp.save`` with the
contender's writer into a fresh directory, until it returns with the bytes durable (stock:
``sync_files=True`` fsyncs each file, not the directory; ckptstore: temp + fsync + rename +
directory fsync, then the commit). Pair i runs the contenders in ``rotated(names, i)``
order; each run's directory is deleted and ``os.sync()`` called before the next. The child
counts ``os.fsync`` / ``os.fdatasync`` calls and reads ``/proc/self/io`` around the save:
``wchar`` (bytes handed to write calls) and ``write_bytes`` (bytes sent towards the disk),
each over the state's bytes, as are the page-cache bytes dirtied meanwhile (machine-wide
``nr_dirtied``: other processes' writes count too), and its CPU time (user + system, all
threads: less sensitive to a busy machine than the wall time). ``CONTENDERS`` lists them;
one whose module is missing is skipped with a note. Results: a table and
``results/durable_local-<time>.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import (
    REPO_ROOT,
    StateShape,
    cell,
    command_line,
    load_average,
    machine_facts,
    machine_line,
    machine_load,
    make_state,
    markdown_table,
    rotated,
    write_results,
)

__all__ = ["CONTENDERS", "main"]

#: name -> (module, attribute): ``attribute(path)`` is a DCP ``StorageWriter`` saving to the
#: local directory ``path``. Imported in the child only, so a missing module skips its row.
CONTENDERS: dict[str, tuple[str, str]] = {
    "stock": ("benchmarks.checkpoint.durable_local", "stock_writer"),
    "ckptstore": ("ckptstore", "writer"),
    "ckptstore-buffered": ("benchmarks.checkpoint.durable_local", "buffered_writer"),
    "air": ("benchmarks.peers.air", "air_writer"),  # the seed's UCVolumeWriter, if present
}
BASELINE = "stock"


def stock_writer(path: str) -> Any:
    """Torch's ``FileSystemWriter`` with its defaults (``sync_files=True``)."""
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(path, sync_files=True)


def buffered_writer(path: str) -> Any:
    """``ckptstore.writer`` with the volume's direct writes off (``stores._direct.ENV``):
    every byte through the page cache, as before them (this child process only)."""
    import ckptstore
    from ckptstore.stores import _direct

    os.environ[_direct.ENV] = "0"
    return ckptstore.writer(path)


def _factory(name: str) -> Any:
    module, attr = CONTENDERS[name]
    return getattr(importlib.import_module(module), attr)


def _io() -> dict[str, int]:
    """This process's ``/proc/self/io`` counters, plus ``dirtied``: bytes of page-cache
    pages dirtied on the whole machine (``/proc/vmstat`` ``nr_dirtied``)."""
    with open("/proc/self/io") as f:
        out = {k: int(v) for k, v in (line.split(":") for line in f)}
    with open("/proc/vmstat") as f:
        pages = next(int(line.split()[1]) for line in f if line.startswith("nr_dirtied "))
    return {**out, "dirtied": pages * mmap.PAGESIZE}


def _child(name: str, path: str, cfg: StateShape) -> dict[str, Any]:
    """One timed save of ``name`` into ``path`` (see the module docstring)."""
    import torch
    import torch.distributed.checkpoint as dcp

    factory = _factory(name)
    state = make_state(0, cfg)
    nbytes = sum(t.nbytes for t in state.values())
    dcp.save({"w": torch.zeros(16)}, storage_writer=factory(path + "-warmup"))
    counts = {"fsync": 0, "fdatasync": 0}
    lock = threading.Lock()

    def counted(key: str, real: Any) -> Any:
        def call(fd: int) -> None:
            with lock:
                counts[key] += 1
            real(fd)

        return call

    os.fsync = counted("fsync", os.fsync)
    if hasattr(os, "fdatasync"):
        os.fdatasync = counted("fdatasync", os.fdatasync)
    before, cpu0 = _io(), resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    dcp.save(state, storage_writer=factory(path))
    seconds = time.perf_counter() - t0
    after, cpu1 = _io(), resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
        "state_bytes": nbytes,
        **counts,
        "wchar": after["wchar"] - before["wchar"],
        "write_bytes": after["write_bytes"] - before["write_bytes"],
        "dirtied": after["dirtied"] - before["dirtied"],
    }


def _run_child(name: str, base: str, i: int, a: argparse.Namespace) -> dict[str, Any] | str:
    """Run ``name``'s child process; its result, or why there is none (a note)."""
    path = os.path.join(base, f"{name}-{i}")
    cmd = [sys.executable, "-m", "benchmarks.checkpoint.durable_local", "--child", name]
    cmd += ["--out", path, "--size-mib", str(a.size_mib), "--tensors", str(a.tensors)]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for p in (path, path + "-warmup"):
            shutil.rmtree(p, ignore_errors=True)
        os.sync()
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return json.loads(lines[-1])


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    secs = [r["seconds"] for r in runs]
    nbytes = runs[0]["state_bytes"]
    return {
        "samples_s": secs,
        "median_s": statistics.median(secs),
        "min_s": min(secs),
        "max_s": max(secs),
        "cpu_median_s": statistics.median(r["cpu_s"] for r in runs),
        "fsync": statistics.median(r["fsync"] for r in runs),
        "fdatasync": statistics.median(r["fdatasync"] for r in runs),
        "wchar_per_byte": statistics.median(r["wchar"] / nbytes for r in runs),
        "write_bytes_per_byte": statistics.median(r["write_bytes"] / nbytes for r in runs),
        "dirtied_per_byte": statistics.median(r["dirtied"] / nbytes for r in runs),
        "state_bytes": nbytes,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--pairs", type=int, default=5, help="rounds of every contender (>= 5)")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--dir", default="", help="parent of the run directories (default /tmp)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    cfg = StateShape(size_mib=a.size_mib, world=1, repeats=1, tensors_per_rank=a.tensors)
    if a.child:
        print(json.dumps(_child(a.child, a.out, cfg)))
        return 0

    before = load_average()
    names = [n for n in a.contenders.split(",") if n]
    base = tempfile.mkdtemp(prefix="ckptstore-durable-", dir=a.dir or None)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    notes: dict[str, str] = {}
    try:
        for i in range(a.pairs):
            for name in rotated(names, i):
                if name in notes:
                    continue
                got = _run_child(name, base, i, a)
                if isinstance(got, str):
                    notes[name] = got
                else:
                    runs[name].append({"pair": i, **got})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    done = {n: r for n, r in runs.items() if r and n not in notes}
    summary = {n: _summary(r) for n, r in done.items()}
    for n, s in summary.items():
        if BASELINE in done and n != BASELINE:
            base_s = {r["pair"]: r["seconds"] for r in done[BASELINE]}
            ratios = [r["seconds"] / base_s[r["pair"]] for r in done[n] if r["pair"] in base_s]
            s["paired_vs_stock"] = {
                "ratios": ratios,
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            }
    rows = []
    for n, s in summary.items():
        pr = s.get("paired_vs_stock")
        rows.append(
            [
                n,
                cell(s["median_s"], ".3f"),
                f"{s['min_s']:.3f}–{s['max_s']:.3f}",
                f"{cell(pr['median'])}x ({pr['min']:.2f}–{pr['max']:.2f})" if pr else "—",
                cell(s["cpu_median_s"], ".3f"),
                f"{s['fsync']:g} + {s['fdatasync']:g}",
                cell(s["wchar_per_byte"]),
                cell(s["write_bytes_per_byte"]),
                cell(s["dirtied_per_byte"]),
            ]
        )
    header = ["contender", "median s", "spread s", "paired vs stock", "CPU s"]
    header += ["fsync + fdatasync"]
    header += ["wchar / byte", "write_bytes / byte", "page cache dirtied / byte"]
    machine = {**machine_facts(a.dir or tempfile.gettempdir()), **machine_load(before)}
    print(f"\ndurable save of {a.size_mib} MiB, {a.pairs} pairs, a fresh process per run")
    print(markdown_table(header, "lrrrrrrrr", rows))
    for n, why in notes.items():
        print(f"{n}: skipped ({why})")
    print(machine_line(machine))
    out = write_results(
        "durable_local",
        {
            "command": command_line(),
            "machine": machine,
            "size_mib": a.size_mib,
            "tensors": a.tensors,
            "pairs": a.pairs,
            "runs": runs,
            "summary": summary,
            "skipped": notes,
        },
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
