"""The seed's own system (databricks-sdk-air) vs ckptstore vs stock DCP on one local volume.

    PYTHONPATH=. nice -n 10 .venv/bin/python -m benchmarks.peers.air_bench          # 512 MiB
    PYTHONPATH=. nice -n 10 .venv/bin/python -m benchmarks.peers.air_bench --quick  # 64 MiB

Checkpoint contenders (benchmarks/peers/air_child.py says how each becomes durable):
``ckptstore`` (``ckptstore.writer`` / ``reader``), ``stock`` (torch's ``FileSystemWriter`` /
``Reader``, default options) and ``air`` (its ``UCVolumeWriter`` / ``Reader`` through
benchmarks/peers/air.py). Data contenders: ckptstore's ``ShardedDataset`` (raw files) +
``DataLoader`` and air's ``UCVolumeDataset`` + ``DataLoader``, on the same files.

Every contender runs in a fresh process (``--world`` gloo ranks of it), the state the same
(``--size-mib`` over all ranks, 8 float32 tensors per rank) and every directory under
``--dir``. A round runs each contender once; round r starts with contender r mod n (the
order rotates), ``--rounds`` rounds (>= 5 in the full run: an outside trial saw 3x order
effects between writers sharing a process). Per contender: median and min-max over rounds;
"x stock" is the median (and min-max) of the per-round ratio to stock's time in that round.
fsyncs: calls per save, its own and those added to make it durable. Bytes copied: the
save's ``/proc/self/io`` ``write_bytes`` (bytes the process dirtied for the disk) and
``wchar`` (bytes passed to write-like calls, sendfile's included), summed over ranks, per
byte of state. The page cache is never dropped (the machine is shared).

Data: ``--files`` files of ``--file-kib`` KiB, ``--workers`` workers, batches of ``--batch``;
cold = loader built (empty cache) through epoch 0, warm = epoch 1 (same loader and cache).
Then, once: air's loader state from 2 ranks resumed on 1 (air says it raises), and the same
for ckptstore's loader.
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

from benchmarks.common import (
    REPO_ROOT,
    cell,
    command_line,
    load_average,
    machine_line,
    machine_load,
    markdown_table,
    rotated,
    write_results,
)

__all__ = ["main", "run"]

CKPT = ("ckptstore", "stock", "air")
DATA = ("ckptstore", "air")


def launch(
    spec: dict[str, Any], world: int, work: str, timeout: float, tmp: str
) -> list[dict[str, Any]]:
    """``world`` fresh processes of air_child for ``spec`` (``TMPDIR=tmp``); every rank's
    result."""
    from benchmarks.common import rank_env
    from harness.dist import free_port

    tag = f"{spec['part']}-{spec['contender']}-{time.monotonic_ns()}"
    spec_path = os.path.join(work, f"{tag}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port, procs, outs = free_port(), [], []
    for r in range(world):
        outs.append(os.path.join(work, f"{tag}.rank{r}.out"))
        log = open(outs[-1] + ".log", "w")  # noqa: SIM115 - closed with the process
        cmd = [sys.executable, "-m", "benchmarks.peers.air_child", spec_path, outs[-1]]
        env = rank_env(r, world, port, TMPDIR=tmp)  # air's layer: its temp dir lies there
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=log))
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
    results = []
    for p, out in zip(procs, outs):
        p.wait()
        if p.returncode != 0 or not os.path.exists(out):
            with open(out + ".log") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"{tag}: exit {p.returncode}\n{tail}")
        with open(out) as f:
            results.append(json.load(f))
    return results


def _ckpt_round(a: argparse.Namespace, work: str, r: int) -> dict[str, Any]:
    got: dict[str, Any] = {"loadavg_before": load_average()}
    for who in rotated(CKPT, r):
        d = tempfile.mkdtemp(prefix=f"r{r}-{who}-", dir=work)
        spec = {"part": "ckpt", "contender": who, "dir": d, "size_mib": a.size_mib}
        spec["tensors_per_rank"] = 8
        ranks = launch(spec, a.world, work, a.timeout, d)
        shutil.rmtree(d)
        got[who] = _merge(ranks)
    return got


def _merge(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Times: max over ranks; fsync calls and byte counters: summed over ranks."""
    out: dict[str, Any] = {"state_bytes": ranks[0]["state_bytes"]}
    for op in ("save", "load", "async"):
        out[op] = {
            k: (max if k in ("s", "returned_s") else sum)(x[op][k] for x in ranks)
            for k in ranks[0][op]
        }
    return out


def _data_spec(a: argparse.Namespace, who: str, files: str, cache: str) -> dict[str, Any]:
    return {
        "part": "data",
        "contender": who,
        "kind": "raw",  # ckptstore's ShardedDataset(format="raw"): a sample is a file
        "files": files,
        "cache": cache,
        "batch": a.batch,
        "workers": a.workers,
        # what benchmarks.peers.contenders.Ckptstore reads (a local directory: no S3)
        "urls": {"ckptstore": files},
        "s3": None,
        "seed": 17,
    }


def _data_round(a: argparse.Namespace, work: str, files: str, r: int) -> dict[str, Any]:
    got: dict[str, Any] = {"loadavg_before": load_average()}
    for who in rotated(DATA, r):
        cache = tempfile.mkdtemp(prefix=f"cache-{who}-", dir=work)
        res = launch(_data_spec(a, who, files, cache), 1, work, a.timeout, cache)[0]
        shutil.rmtree(cache)
        want = list(range(a.files))
        if any(e["ids"] != want for e in res["epochs"]):
            raise AssertionError(f"{who}: an epoch did not deliver every file exactly once")
        got[who] = {
            "cold_s": res["epochs"][0]["s"],
            "warm_s": res["epochs"][1]["s"],
            "cache_bytes": res["cache_bytes"],
            "import_s": res["import_s"],
        }
    return got


def _resume(a: argparse.Namespace, work: str, files: str) -> dict[str, Any]:
    """Each loader's state from 2 ranks, resumed on 1 rank: refused or not."""
    out = {}
    for who in DATA:
        spec = _data_spec(a, who, files, tempfile.mkdtemp(dir=work))
        spec.update(part="resume", save_to=os.path.join(work, f"state-{who}-{{rank}}.pkl"))
        launch(spec, 2, work, a.timeout, spec["cache"])
        spec.update(load_from=spec["save_to"].format(rank=0), cache=tempfile.mkdtemp(dir=work))
        out[who] = launch(spec, 1, work, a.timeout, spec["cache"])[0]
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarise(ckpt: list[dict], data: list[dict]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for who in CKPT if ckpt else ():
        per = [r[who] for r in ckpt]
        state = per[0]["state_bytes"]
        row: dict[str, Any] = {}
        for key, op, field in (
            ("save_returned", "save", "returned_s"),
            ("save_durable", "save", "s"),
            ("load", "load", "s"),
            ("async_returned", "async", "returned_s"),
            ("async_durable", "async", "s"),
        ):
            row[key] = _stats([p[op][field] for p in per])
            ratios = [p[op][field] / r["stock"][op][field] for p, r in zip(per, ckpt)]
            row[key]["x_stock"] = _stats(ratios)
        row["fsyncs_own"] = per[0]["save"]["fsyncs_own"]
        row["fsyncs_durable"] = per[0]["save"]["fsyncs"]
        for op in ("save", "load"):
            for counter in ("write_bytes", "wchar"):
                row[f"{op}_{counter}_per_byte"] = _stats([p[op][counter] / state for p in per])
        rows[who] = row
    for who in DATA if data else ():
        per = [r[who] for r in data]
        rows.setdefault(f"data {who}", {}).update(
            cold=_stats([p["cold_s"] for p in per]),
            warm=_stats([p["warm_s"] for p in per]),
            cache_bytes=per[0]["cache_bytes"],
            import_s=_stats([p["import_s"] for p in per]),
        )
    return rows


def _spread(s: dict[str, float], fmt: str = ".2f") -> str:
    return f"{cell(s['median'], fmt)} ({cell(s['min'], fmt)}–{cell(s['max'], fmt)})"


def tables(rows: dict[str, Any]) -> str:
    ops = ("save_returned", "save_durable", "load", "async_returned", "async_durable")
    head = ["contender", "save returned s", "save durable s", "load s"]
    head += ["async_save returned s", "async_save durable s"]
    t1 = [[w, *(_spread(rows[w][k]) for k in ops)] for w in CKPT if w in rows]
    t2 = [[w, *(_spread(rows[w][k]["x_stock"]) for k in ops)] for w in CKPT if w in rows]
    t3 = [
        [
            w,
            f"{rows[w]['fsyncs_own']} + {rows[w]['fsyncs_durable'] - rows[w]['fsyncs_own']}",
            *(
                _spread(rows[w][f"{op}_{c}_per_byte"])
                for op in ("save", "load")
                for c in ("write_bytes", "wchar")
            ),
        ]
        for w in CKPT
        if w in rows
    ]
    head3 = ["contender", "fsyncs per save (own + to durable)", "save write_bytes/B"]
    head3 += ["save wchar/B", "load write_bytes/B", "load wchar/B"]
    d = [
        [w, *(_spread(rows[f"data {w}"][k]) for k in ("cold", "warm", "import_s"))]
        + [cell(rows[f"data {w}"]["cache_bytes"] / 2**20, ".0f")]
        for w in DATA
        if f"data {w}" in rows
    ]
    out = []
    if t1:
        out += ["seconds, median (min–max) over rounds:", markdown_table(head, "lrrrrr", t1)]
        out += ["\nx stock, per-round ratio:", markdown_table(head, "lrrrrr", t2)]
        out += ["\nper save of the state:", markdown_table(head3, "lrrrrr", t3)]
    if d:
        head_d = ["data", "cold epoch s", "warm epoch s", "import s (apart)", "cache MiB"]
        out += ["\ndata epoch:", markdown_table(head_d, "lrrrr", d)]
    return "\n".join(out)


def run(a: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.peers.convert import make_raw

    before = load_average()
    os.makedirs(a.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="air-bench-", dir=a.dir)
    try:
        ckpt = [_ckpt_round(a, work, r) for r in range(a.rounds)] if "ckpt" in a.parts else []
        data, resume = [], {}
        if "data" in a.parts or "resume" in a.parts:
            files = os.path.join(work, "files")
            make_raw(files, a.files, a.file_kib * 1024)
            if "data" in a.parts:
                data = [_data_round(a, work, files, r) for r in range(a.rounds)]
            if "resume" in a.parts:
                resume = _resume(a, work, files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "command": command_line(),
        "config": vars(a),
        "machine": machine_load(before),
        "rounds": {"ckpt": ckpt, "data": data},
        "rows": summarise(ckpt, data),
        "resume_on_another_world": resume,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=None, help="state (default 512, quick 64)")
    p.add_argument("--world", type=int, default=1, help="gloo ranks per contender (default 1)")
    p.add_argument("--rounds", type=int, default=None, help="default 5, quick 1")
    p.add_argument("--files", type=int, default=None, help="data files (default 512, quick 64)")
    p.add_argument("--file-kib", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--parts", default="ckpt,data,resume", help="which parts to run")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="the volume (default /tmp)")
    p.add_argument("--timeout", type=float, default=600.0, help="per process")
    p.add_argument("--quick", action="store_true", help="64 MiB, 64 files, 1 round")
    a = p.parse_args(argv)
    a.size_mib = a.size_mib or (64 if a.quick else 512)
    a.rounds = a.rounds or (1 if a.quick else 5)
    a.files = a.files or (64 if a.quick else 512)
    a.parts = a.parts.split(",")
    res = run(a)
    print(tables(res["rows"]))
    for who, r in res["resume_on_another_world"].items():
        print(f"resume of a 2-rank loader state on 1 rank, {who}: {r}")
    print(machine_line(res["machine"]))
    print("JSON:", os.path.relpath(write_results("bench_air", res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
