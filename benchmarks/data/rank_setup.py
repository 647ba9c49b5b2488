"""A fresh rank's setup before its first sample, phase by phase, across checkouts (issue 18).

    python -m benchmarks.data.rank_setup --trees main=/work/main,branch=. [--repeat 3] [--profile]

One SeaweedFS on 127.0.0.1 behind ``benchmarks/shaped_link.py`` (100 Mbit/s per connection,
+10 ms each way, as in data.vs_peers) holding the head to head's token dataset (16 Parquet
shards x 144 rows of 1 024 int32 tokens). Each repeat starts one fresh process per
checkout, alternating (``PYTHONPATH`` picks the checkout's ``ckptstore``), which imports
torch first (as a rank has) and then times, as data.vs_peers's ckptstore contender
does them:

  import        ``from ckptstore.data import DataLoader, ShardedDataset``; ``open_store``
  store client  ``open_store(url, storage_options)`` (s3fs, aiobotocore, aiohttp imports)
  listing       ``ShardedDataset(...)``: the LIST, every footer, the index
  first batch   ``DataLoader(ds, 8, 2)``, ``iter()``, the first ``next()`` (2 forked workers)
  total         all of it

``--profile`` adds a cProfile of ``open_store`` + ``ShardedDataset(...)`` in each child
(cumulative, top 30) and the child's ``-X importtime`` top imports, printed once per tree.
No timing here is asserted anywhere: it is a measurement. Quote it with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# The checkout this file is in. The child runs this file as a script (not as a module of
# the package), so that it imports the ckptstore its PYTHONPATH names: nothing at the top
# here may import ``benchmarks``.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PHASES = ("import", "store client", "listing", "first batch", "total")


def child(url: str, opts: dict[str, Any], cache: str, profile: bool) -> dict[str, Any]:
    """One fresh rank (world size 1): its setup, timed phase by phase."""
    import torch  # noqa: F401 - a rank has imported torch before it builds a dataset

    row: dict[str, Any] = {}
    t0 = t = time.perf_counter()
    import ckptstore
    from ckptstore.data import DataLoader, ShardedDataset
    from ckptstore.stores import open_store

    row["tree"] = os.path.dirname(os.path.dirname(ckptstore.__file__))
    row["import"] = time.perf_counter() - t
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t = time.perf_counter()
    open_store(url, opts).close()
    row["store client"] = time.perf_counter() - t
    t = time.perf_counter()
    ds = ShardedDataset(url, storage_options=opts, cache_dir=cache, columns=["id", "tokens"])
    row["listing"] = time.perf_counter() - t
    if prof is not None:
        import io
        import pstats

        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
        row["profile"] = text.getvalue()
    t = time.perf_counter()
    it = iter(DataLoader(ds, 8, 2))
    next(it)
    row["first batch"] = time.perf_counter() - t
    row["total"] = time.perf_counter() - t0
    del it
    return row


def _importtime(stderr: str, n: int = 15) -> str:
    """The ``n`` slowest imports (cumulative) from ``-X importtime``, outside torch."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = (c.strip() for c in line[len("import time:") :].split("|"))
        if cum.isdigit() and not name.startswith(("torch", "numpy", "sympy")):
            rows.append((int(cum), name))
    top = sorted(rows, reverse=True)[:n]
    return "\n".join(f"  {us / 1e3:8.1f} ms  {name}" for us, name in top)


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", default=f"this={REPO}", help="name=checkout,... (alternated)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["url"], spec["opts"], spec["cache"], args.profile)))
        return

    # Here only: a child must import the ckptstore of its checkout (its PYTHONPATH).
    from benchmarks.peers.convert import make_tokens
    from benchmarks.shaped_link import ShapedLink
    from harness.seaweedfs import SeaweedFS

    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    work = tempfile.mkdtemp(prefix="ckptstore-setup-")
    before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with SeaweedFS() as server:
        server.create_bucket("bench")
        src = os.path.join(work, "tokens")
        make_tokens(src, 16, 144, 1024, 64)
        store = server.store("bench/tokens")
        for name in sorted(os.listdir(src)):
            with open(os.path.join(src, name), "rb") as f:
                store.put(name, f.read())
        link = ShapedLink(server.port, mbps=100, latency_ms=10).start()
        opts = dict(server.storage_options, endpoint_url=link.endpoint)
        try:
            for rep in range(args.repeat):
                for name, tree in trees.items():
                    cache = os.path.join(work, f"cache-{name}-{rep}")
                    spec = json.dumps({"url": "s3://bench/tokens", "opts": opts, "cache": cache})
                    cmd = [sys.executable, *(["-X", "importtime"] if args.profile else [])]
                    cmd += [__file__, "--child", spec]
                    cmd += ["--profile"] if args.profile else []
                    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
                    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    if args.profile and rep == 0:
                        row["importtime"] = _importtime(out.stderr)
                    runs[name].append(row)
        finally:
            link.stop()
            shutil.rmtree(work, ignore_errors=True)
    after = os.getloadavg()
    print(f"load average before {before}, after {after}")
    print(f"seconds, median (min–max) of {args.repeat} fresh processes per checkout")
    print("| phase | " + " | ".join(trees) + " |")
    print("| --- |" + " ---: |" * len(trees))
    for phase in PHASES:
        print(f"| {phase} | " + " | ".join(_fmt([r[phase] for r in runs[n]]) for n in trees) + " |")
    for name in trees:
        print(f"{name}: {runs[name][0]['tree']}")
        if args.profile:
            print(runs[name][0]["importtime"])
            print(runs[name][0]["profile"])


if __name__ == "__main__":
    main()
