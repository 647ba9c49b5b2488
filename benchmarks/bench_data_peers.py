"""Data loading head to head: ckptstore vs Mosaic Streaming vs litdata vs a plain fsspec loader.

Run it with the peers' interpreter (benchmarks/peers/setup.sh makes it; the project's own
.venv does not have the peers, on purpose):

    benchmarks/peers/setup.sh
    benchmarks/peers/.venv/bin/python benchmarks/bench_data_peers.py [--quick]

Same rows, same server, same link for everyone: a SeaweedFS on 127.0.0.1 behind a shaped
link (benchmarks/shaped_link.py: a per-connection bandwidth cap and added latency), two
datasets (Parquet token rows; raw files, image-like blobs) converted for each peer from
the same rows (benchmarks/peers/convert.py). Every contender runs as 2 ranks x 2 workers
(gloo, torchrun's environment; benchmarks/peers/rank.py), a training loop whose "GPU step"
sleeps ``--step-ms``, for two epochs with a fresh node-local cache:

  cold epoch   loader creation (listing, indexes) to the end of epoch 0 (slowest rank)
  warm epoch   epoch 1, cache as epoch 0 left it (slowest rank)
  first batch  loader creation to the first batch in hand (slowest rank)
  wait p50/p99 per-batch wait in next(), as % of the step, over the batches after the first
               quarter of the cold epoch (steady state), all ranks together (the raw
               dataset's default 2304 files give 216 such waits: a p99 worth quoting)
  disk         bytes under the contender's cache directory after the two epochs
  once         epoch 0 across both ranks: repeated / skipped samples

``ckptstore-packed`` (raw only) reads the raw files packed into Parquet shards of the peers'
chunk size by ``ckptstore.data.pack.pack_files``: the like-for-like row against litdata's
``optimize()``d chunks. Conversion times (MDS, optimize(), pack) are printed, not counted.
``memory`` is no peer but a floor: a stock torch DataLoader over the same shapes already in
memory (no storage, no decode), whose steady wait is the least a loader that hands batches
over as torch does can have here (ckptstore's own hand-off waits less).

Resume (once per dataset): 2 ranks x 2 workers train K steps, write their loader state
(the checkpoint), train 2 more steps and are SIGKILLed mid-epoch; then 3 ranks x 1 worker
resume from that state and finish the epoch. Counted over the checkpointed steps plus the
resumed run: samples repeated and skipped. The fsspec loader has no state: it starts over;
the memory floor is not resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(HERE, "peers"), HERE]

from convert import make_raw, make_tokens, to_litdata, to_mds  # noqa: E402

BUCKET = "peers"
PACKED = "ckptstore-packed"  # raw files packed into Parquet shards (ckptstore.data.pack)
FLOOR = "memory"  # rows already in memory: the floor of a stock torch DataLoader's wait
NAMES = ("ckptstore", PACKED, "mosaic", "litdata", "fsspec", FLOOR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _upload(s3: dict[str, Any], local: str, prefix: str) -> None:
    from ckptstore.config import RetryConfig
    from ckptstore.stores.s3 import make_s3fs

    # s3fs with the checksum settings SeaweedFS needs (plain botocore defaults would send
    # aws-chunked bodies with trailing checksums, which it stores as they came).
    fs = make_s3fs(s3, RetryConfig())
    fs.put(local.rstrip("/") + "/", f"{BUCKET}/{prefix}/", recursive=True)


def prepare(
    args: argparse.Namespace, work: str, s3: dict[str, Any], names: list[str]
) -> dict[str, Any]:
    """Write both datasets, convert them for the peers in ``names``, upload; the urls."""
    out: dict[str, Any] = {}
    src = os.path.join(work, "src")
    make_tokens(os.path.join(src, "tokens"), args.shards, args.rows, args.tokens, args.row_group)
    make_raw(os.path.join(src, "raw"), args.files, args.file_kib * 1024)
    shard_bytes = args.rows * args.tokens * 4
    counts = {"tokens": args.shards * args.rows, "raw": args.files}
    for kind in args.datasets:
        local = os.path.join(src, kind)
        mds, lit = os.path.join(work, f"mds-{kind}"), os.path.join(work, f"lit-{kind}")
        packed = os.path.join(work, f"packed-{kind}")
        uploads = [("src", local)]
        convert_s: dict[str, float] = {}  # local files -> the peer's format, before upload
        if "mosaic" in names:
            t = time.perf_counter()
            to_mds(kind, local, mds, shard_bytes)
            convert_s["mosaic"] = time.perf_counter() - t
            uploads.append(("mds", mds))
        if "litdata" in names:
            t = time.perf_counter()
            to_litdata(kind, local, lit, shard_bytes, counts[kind])
            convert_s["litdata"] = time.perf_counter() - t
            uploads.append(("lit", lit))
        if PACKED in names and kind == "raw":
            from ckptstore.data.pack import pack_files

            # The same shard size as the peers' chunks; the whole file set in path order.
            convert_s[PACKED] = pack_files(local, packed, shard_bytes=shard_bytes).seconds
            uploads.append(("packed", packed))
        for what, path in uploads:
            _upload(s3, path, f"{what}-{kind}")
        out[kind] = {
            "count": counts[kind],
            "bytes": sum(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local)),
            "convert_s": convert_s,
            "urls": {
                "ckptstore": f"s3://{BUCKET}/src-{kind}/",
                PACKED: f"s3://{BUCKET}/packed-{kind}/",
                "fsspec": f"{BUCKET}/src-{kind}",
                "mosaic": f"s3://{BUCKET}/mds-{kind}",
                "litdata": f"s3://{BUCKET}/lit-{kind}",
            },
        }
    return out


def run_ranks(spec: dict[str, Any], world: int, work: str, link: str, timeout: float) -> list[Any]:
    """``world`` rank processes under torchrun's environment; their results (None: killed)."""
    tag = f"{spec['contender']}-{spec['kind']}-{spec['phase']}-{time.monotonic_ns()}"
    spec_path = os.path.join(work, f"{tag}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port = _free_port()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    procs, outs = [], []
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
            PYTHONPATH=REPO,
            AWS_ACCESS_KEY_ID=spec["s3"]["key"],
            AWS_SECRET_ACCESS_KEY=spec["s3"]["secret"],
            AWS_ENDPOINT_URL=link,
            S3_ENDPOINT_URL=link,  # Mosaic Streaming's variable
            AWS_ALLOW_HTTP="true",  # litdata's object_store client: the link is plain http
            AWS_REQUEST_CHECKSUM_CALCULATION="when_required",
            AWS_RESPONSE_CHECKSUM_VALIDATION="when_required",
            OMP_NUM_THREADS="1",
        )
        out = os.path.join(work, f"{tag}.rank{r}.json")
        outs.append(out)
        log = open(os.path.join(work, f"{tag}.rank{r}.log"), "w")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "peers", "rank.py"), spec_path, out],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
        done = [p for p in procs if p.poll() is not None]
        if failed_at is None and any(p.returncode not in (0, -9) for p in done):
            failed_at = time.monotonic()
        if failed_at is None and any(_has_error(o) for o in outs):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > 10:
            break  # one rank failed; the others wait in a collective for ever
    for p in procs:  # the ranks' DataLoader workers and helpers, if any were left
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()
    _remove_new_shm(shm_before)
    results = []
    for r, out in enumerate(outs):
        if os.path.exists(out):
            with open(out) as f:
                results.append(json.load(f))
        else:
            with open(os.path.join(work, f"{tag}.rank{r}.log")) as f:
                tail = f.read()[-1200:]
            code = procs[r].returncode
            results.append({"rank": r, "killed": True, "log_tail": f"exit {code}; {tail}"})
    return results


def _remove_new_shm(before: set[str]) -> None:
    """Mosaic's shared memory (``/dev/shm/NNNNNN_*``) that this run's ranks left behind.

    A killed rank cannot unlink it, and a stale prefix makes the next job's local ranks
    disagree on where to coordinate (they then download the same shard file at once).
    """
    if not os.path.isdir("/dev/shm"):
        return
    for name in set(os.listdir("/dev/shm")) - before:
        if re.fullmatch(r"\d{6}_\w+", name):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _has_error(path: str) -> bool:
    try:
        with open(path) as f:
            return "error" in json.load(f)
    except (OSError, ValueError):
        return False


def _clean_peers_shm() -> None:
    try:
        from contenders import import_streaming

        import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    except Exception:  # noqa: BLE001 - best effort between runs
        pass


def once(ids: list[int], count: int) -> tuple[int, int]:
    """(repeated, skipped) of one epoch's trained ids."""
    c = Counter(ids)
    return sum(n - 1 for n in c.values() if n > 1), count - len(set(ids) & set(range(count)))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def measure(results: list[dict[str, Any]], step_s: float, count: int) -> dict[str, Any]:
    errors = [
        r.get("error") or r.get("log_tail") for r in results if "epochs" not in r or r.get("error")
    ]
    if errors:
        return {"error": errors[0]}
    if any(len(r["epochs"]) < 2 for r in results):
        return {"error": "fewer than 2 epochs"}
    steady, warm = [], []
    for r in results:
        w = r["epochs"][0]["waits"]
        steady += [x / step_s * 100 for x in w[len(w) // 4 :]]
        w = r["epochs"][1]["waits"]
        warm += [x / step_s * 100 for x in w[len(w) // 4 :]]
    ids = [i for r in results for b in r["epochs"][0]["ids"] for i in b]
    rep, skip = once(ids, count)
    return {
        "cold_s": max(r["build_s"] + r["epochs"][0]["wall_s"] for r in results),
        "warm_s": max(r["epochs"][1]["wall_s"] for r in results),
        "first_batch_s": max(r["epochs"][0]["first_batch_s"] or 0.0 for r in results),
        "wait_p50_pct": pct(steady, 50),
        "wait_p99_pct": pct(steady, 99),
        # the same over the warm epoch: no downloads in the training process
        "warm_wait_p50_pct": pct(warm, 50),
        "warm_wait_p99_pct": pct(warm, 99),
        "wait_total_pct": 100
        * sum(x * step_s / 100 for x in steady)
        / max(1e-9, len(steady) * step_s + sum(x * step_s / 100 for x in steady)),
        "disk_bytes": max(r["disk_bytes"] for r in results),
        # cold start, phase by phase: the slowest rank's seconds in each
        "phases": {
            k: max(r.get("phases", {}).get(k, 0.0) for r in results)
            for k in {k for r in results for k in r.get("phases", {})}
        },
        "repeated": rep,
        "skipped": skip,
        # the per-batch trace of the cold epoch, rank by rank (what the p99 batches were)
        "trace": [
            {"waits_s": r["epochs"][0]["waits"], "ids": r["epochs"][0]["ids"]} for r in results
        ],
    }


def resume_check(
    base: dict[str, Any], args: argparse.Namespace, work: str, link: str
) -> dict[str, Any]:
    name, kind, count = base["contender"], base["kind"], base["count"]
    cache = os.path.join(work, f"cache-resume-{name}-{kind}")
    spec = dict(base, phase="kill", epochs=1, cache=cache, kill_after=args.kill_after)
    spec["state_out"] = os.path.join(work, f"state-{name}-{kind}-{{rank}}.pkl")
    first = run_ranks(spec, 2, work, link, args.timeout)
    import pickle

    trained: list[int] = []
    for r in range(2):
        path = spec["state_out"].format(rank=r)
        if not os.path.exists(path):
            why = first[r].get("error") or first[r].get("log_tail", "")
            return {"error": f"no checkpoint from rank {r}: {why[-300:]}"}
        with open(path, "rb") as f:
            trained += [i for b in pickle.load(f)["trained"] for i in b]
    _clean_peers_shm()
    spec2 = dict(base, phase="resume", epochs=1, cache=cache, workers=1)
    spec2.update(state_in=spec["state_out"], state_world=2)
    second = run_ranks(spec2, 3, work, link, args.timeout)
    errors = [
        r.get("error") or r.get("log_tail") for r in second if r.get("error") or "epochs" not in r
    ]
    if errors:
        return {"error": str(errors[0])[:300], "checkpointed": len(trained)}
    resumed = [i for r in second for b in r["epochs"][0]["ids"] for i in b]
    rep, skip = once(trained + resumed, count)
    return {"checkpointed": len(trained), "resumed": len(resumed), "repeated": rep, "skipped": skip}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--contenders", default=",".join(NAMES))
    p.add_argument("--datasets", default="tokens,raw")
    p.add_argument("--shards", type=int, default=16, help="Parquet token shards")
    p.add_argument("--rows", type=int, default=144, help="rows per shard")
    p.add_argument("--tokens", type=int, default=1024, help="int32 tokens per row")
    p.add_argument("--row-group", type=int, default=64)
    # As many samples as the token rows (16 x 144): 144 batches a rank, 216 steady ones
    # over both ranks. With 768 files the p99 was over 72 waits, i.e. the second largest.
    p.add_argument("--files", type=int, default=2304, help="raw files")
    p.add_argument("--file-kib", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=40.0)
    p.add_argument("--link-mbps", type=float, default=100.0, help="per connection")
    p.add_argument("--link-latency-ms", type=float, default=10.0, help="one way")
    p.add_argument("--kill-after", type=int, default=20, help="steps before the kill")
    p.add_argument(
        "--ckptstore-prefetch",
        type=int,
        default=None,
        help="its prefetch_concurrency (default: the library's, sized by shard bytes)",
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0, help="per run of the ranks")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat")
    p.add_argument("--json", help="write every result here")
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.rows, args.tokens, args.files, args.repeat = 4, 96, 256, 96, 1
        args.kill_after = 4
    args.datasets = args.datasets.split(",")
    names = args.contenders.split(",")

    from shaped_link import ShapedLink

    from harness.seaweedfs import SeaweedFS

    work = tempfile.mkdtemp(prefix="ckptstore-peers-")
    server = SeaweedFS().start()
    link = ShapedLink(server.port, mbps=args.link_mbps, latency_ms=args.link_latency_ms).start()
    report: dict[str, Any] = {"args": vars(args), "command": " ".join(sys.argv), "runs": {}}
    report["loadavg_before"] = os.getloadavg()
    try:
        s3 = dict(server.storage_options)
        server.create_bucket(BUCKET)
        t = time.perf_counter()
        data = prepare(args, work, s3, names)
        report["prepare_s"] = time.perf_counter() - t
        shaped = dict(s3, endpoint_url=link.endpoint)
        for kind in args.datasets:
            for name in names:
                if name == PACKED and kind != "raw":
                    continue  # token rows are Parquet shards already
                base = {
                    "contender": name,
                    "kind": kind,
                    "count": data[kind]["count"],
                    "row_elems": args.tokens if kind == "tokens" else args.file_kib * 1024,
                    "urls": data[kind]["urls"],
                    "s3": shaped,
                    "seed": 7,
                    "batch": args.batch,
                    "workers": args.workers,
                    "step_s": args.step_ms / 1e3,
                    "ckptstore_prefetch": args.ckptstore_prefetch,
                }
                runs = []
                for rep in range(args.repeat):
                    _clean_peers_shm()
                    cache = os.path.join(work, f"cache-{name}-{kind}-{rep}")
                    spec = dict(base, phase="epochs", epochs=2, cache=cache)
                    res = run_ranks(spec, 2, work, link.endpoint, args.timeout)
                    runs.append(measure(res, base["step_s"], base["count"]))
                    if not os.environ.get("KEEP_WORK"):
                        shutil.rmtree(cache, ignore_errors=True)
                    shown = {k: v for k, v in runs[-1].items() if k != "trace"}
                    print(f"{kind} {name} {rep + 1}/{args.repeat}: {shown}", flush=True)
                entry: dict[str, Any] = {"runs": runs}
                if not args.no_resume and name != FLOOR:
                    _clean_peers_shm()
                    entry["resume"] = resume_check(base, args, work, link.endpoint)
                    print(f"{kind} {name} resume: {entry['resume']}", flush=True)
                report["runs"][f"{kind}/{name}"] = entry
    finally:
        link.stop()
        server.stop()
        report["loadavg_after"] = os.getloadavg()
        if not os.environ.get("KEEP_WORK"):
            shutil.rmtree(work, ignore_errors=True)
    report["data"] = {
        k: {"count": v["count"], "bytes": v["bytes"], "convert_s": v["convert_s"]}
        for k, v in data.items()
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(table(report))
    print()
    print(phases_table(report))
    print()
    print(convert_lines(report))
    return 0


def convert_lines(report: dict[str, Any]) -> str:
    """Seconds each format conversion took (local files in, local shards out; not counted in
    the cold epoch, as a real job converts once ahead of time)."""
    lines = []
    for kind, d in report.get("data", {}).items():
        cells = ", ".join(f"{name} {sec:.2f} s" for name, sec in d.get("convert_s", {}).items())
        lines.append(f"- conversion of {kind}: {cells or 'none (read as they are)'}")
    return "\n".join(lines)


def _med(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    vals = [r[key] for r in runs]
    return statistics.median(vals), min(vals), max(vals)


def _cell(runs: list[dict[str, Any]], key: str, scale: float = 1.0) -> str:
    m, lo, hi = (v / scale for v in _med(runs, key))
    return f"{m:.2f} ({lo:.2f}–{hi:.2f})" if len(runs) > 1 else f"{m:.2f}"


def _clean(text: str, n: int = 90) -> str:
    return " ".join(str(text).split()).replace("|", "/")[-n:]


HEADER = (
    "| dataset | contender | cold epoch s | warm epoch s | first batch s | steady wait % of step "
    "p50 / p99 | disk MiB | epoch 0 repeated / skipped | resume 2x2 → 3x1 repeated / skipped |"
)


def table(report: dict[str, Any]) -> str:
    """The README table: medians (min–max) over the runs that finished."""
    lines = [HEADER, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key, entry in report["runs"].items():
        kind, name = key.split("/")
        runs = [r for r in entry["runs"] if "error" not in r]
        failed = [r["error"] for r in entry["runs"] if "error" in r]
        note = (
            f" ({len(failed)} of {len(entry['runs'])} runs failed: {_clean(failed[0])})"
            if failed
            else ""
        )
        res = entry.get("resume", {})
        if "repeated" in res:
            resume = f"{res['repeated']} / {res['skipped']}"
            resume += f" (of {res['checkpointed']} + {res['resumed']})"
        else:
            resume = f"failed: {_clean(res.get('error', ''))}" if res else "not run"
        if not runs:
            lines.append(f"| {kind} | {name} | failed{note} | | | | | | {resume} |")
            continue
        p50, p99 = _med(runs, "wait_p50_pct")[0], _med(runs, "wait_p99_pct")[0]
        lines.append(
            f"| {kind} | {name}{note} | {_cell(runs, 'cold_s')} | "
            f"{_cell(runs, 'warm_s')} | {_cell(runs, 'first_batch_s')} | {p50:.1f} / {p99:.1f} | "
            f"{_med(runs, 'disk_bytes')[0] / 2**20:.1f} | "
            f"{runs[0]['repeated']} / {runs[0]['skipped']} | {resume} |"
        )
    return "\n".join(lines)


PHASES = (
    ("import_s", "import"),
    ("client_s", "store client"),
    ("listing_s", "listing (footers)"),
    ("loader_s", "loader"),
    ("iter_s", "iter() (workers, prefetch)"),
    ("first_next_s", "first next()"),
)


def phases_table(report: dict[str, Any]) -> str:
    """Time to the first batch, phase by phase (slowest rank, median over the runs).

    Every contender has ``iter()`` and the first ``next()``; the rest of its build time is
    "build" (ckptstore splits it into its phases).
    """
    head = ["dataset", "contender", "build", *(label for _, label in PHASES), "first batch"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for key, entry in report["runs"].items():
        kind, name = key.split("/")
        runs = [r for r in entry["runs"] if "error" not in r and "phases" in r]
        if not runs:
            continue
        cells = []
        builds = [
            r["first_batch_s"] - r["phases"].get("iter_s", 0) - r["phases"]["first_next_s"]
            for r in runs
            if "first_next_s" in r["phases"]
        ]
        build = max(0.0, statistics.median(builds)) if builds else 0.0
        cells.append(f"{build:.2f}")
        for k, _ in PHASES:
            vals = [r["phases"][k] for r in runs if k in r["phases"]]
            cells.append(f"{statistics.median(vals):.2f}" if vals else "")
        cells.append(f"{statistics.median(r['first_batch_s'] for r in runs):.2f}")
        lines.append(f"| {kind} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
