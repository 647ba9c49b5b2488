"""The S3 client's cold start in a rank and in its forked DataLoader workers (issue 18).

    python -m benchmarks.data.client_start [--workers 2] [--repeat 3] [--latency-ms 10]
        [--profile]

One SeaweedFS on 127.0.0.1 (behind ``benchmarks/shaped_link.py``'s added latency, as in
data.vs_peers) holding one small object. Each repeat starts a fresh Python process
(the "rank": nothing imported yet) that times, as ``ShardedDataset`` and its DataLoader
do them:

  import        ``import ckptstore.data``
  open_store    ``open_store(url, storage_options)`` (s3fs, aiobotocore imports)
  1st request   the rank's first HEAD (the client is built here: session, service model,
                endpoint rules, credentials, connection)
  2nd request   the next HEAD (the steady cost of one round trip)

and then forks ``--workers`` children the way torch's DataLoader does (``fork``), each of
which opens the store again (a new process: nothing with a loop or socket crosses the fork)
and times its own first and second request. ``--profile`` prints a cProfile of the first
worker's first request (cumulative time, top 25).

No timing here is asserted anywhere: it is a measurement. Quote it with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

OBJECT = "client-bench/one.bin"


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _worker(url: str, opts: dict[str, Any], profile: bool, out: Any) -> None:
    from ckptstore.stores import open_store

    row: dict[str, Any] = {"pid": os.getpid()}
    t = time.perf_counter()
    store = open_store(url, opts)
    row["open_store"] = time.perf_counter() - t
    if profile:
        import cProfile
        import io
        import pstats

        # The request runs on fsspec's event-loop thread: profile that thread, which is
        # started by the store (cProfile sees only the thread that enables it).
        import threading

        loop = store.fs.loop
        prof = cProfile.Profile()
        ready = threading.Event()
        loop.call_soon_threadsafe(lambda: (prof.enable(), ready.set()))
        ready.wait()
        row["first"] = _timed(lambda: store.size(OBJECT))
        done = threading.Event()
        loop.call_soon_threadsafe(lambda: (prof.disable(), done.set()))
        done.wait()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
        row["profile"] = text.getvalue()
    else:
        row["first"] = _timed(lambda: store.size(OBJECT))
    row["second"] = _timed(lambda: store.size(OBJECT))
    out.put(row)


def child(url: str, opts: dict[str, Any], workers: int, profile: bool) -> dict[str, Any]:
    """One fresh rank process: its own cold start, then ``workers`` forked workers'."""
    row: dict[str, Any] = {}
    t = time.perf_counter()
    import ckptstore.data  # noqa: F401

    row["import"] = time.perf_counter() - t
    from ckptstore.stores import open_store

    t = time.perf_counter()
    store = open_store(url, opts)
    row["open_store"] = time.perf_counter() - t
    row["first"] = _timed(lambda: store.size(OBJECT))
    row["second"] = _timed(lambda: store.size(OBJECT))

    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, opts, profile and i == 0, queue))
        for i in range(workers)
    ]
    t = time.perf_counter()
    for p in procs:
        p.start()
    rows = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    row["workers_wall"] = time.perf_counter() - t
    row["workers"] = rows
    return row


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):7.1f} ({min(ms):.1f}-{max(ms):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=10.0, help="added each way (0: none)")
    ap.add_argument("--profile", action="store_true", help="cProfile the first worker's request")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["url"], spec["opts"], args.workers, args.profile)))
        return

    from benchmarks.common import REPO_ROOT
    from benchmarks.shaped_link import ShapedLink
    from harness.seaweedfs import SeaweedFS

    with SeaweedFS() as server:
        server.create_bucket("bench")
        server.store("bench").put(OBJECT, b"x" * 1024)
        link = None
        endpoint = server.endpoint
        if args.latency_ms > 0:
            link = ShapedLink(server.port, mbps=100, latency_ms=args.latency_ms).start()
            endpoint = link.endpoint
        opts = dict(server.storage_options, endpoint_url=endpoint)
        spec = json.dumps({"url": "s3://bench", "opts": opts})
        runs = []
        try:
            for _ in range(args.repeat):
                # A fresh process importing this checkout's ckptstore (the cwd comes first).
                cmd = [sys.executable, "-m", "benchmarks.data.client_start", "--child", spec]
                cmd += ["--workers", str(args.workers)] + (["--profile"] if args.profile else [])
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO_ROOT)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        finally:
            if link is not None:
                link.stop()

    print(f"load average {os.getloadavg()}; {args.repeat} runs, ms: median (min-max)")
    for key in ("import", "open_store", "first", "second"):
        print(f"  rank    {key:11s} {_fmt([r[key] for r in runs])}")
    workers = [w for r in runs for w in r["workers"]]
    for key in ("open_store", "first", "second"):
        print(f"  worker  {key:11s} {_fmt([w[key] for w in workers])}")
    for w in workers:
        if "profile" in w:
            print(w["profile"])
            break


if __name__ == "__main__":
    main()
