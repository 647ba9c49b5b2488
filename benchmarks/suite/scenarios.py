"""The suite's scenario kinds: each runs one existing benchmark and returns common records.

Every record is one (metric, contender) of one scenario::

    {"scenario", "kind", "metric", "contender", "dest", "world", "bytes",
     "samples_s", "median_s", "min_s", "max_s", "gb_per_s", "peak_rss_mib", "extra"}

``metric`` is ``save`` (a blocking save: blocking == durable), ``blocking`` and
``committed`` (async saves), ``load`` (same world size), ``load@wN`` (load on N ranks),
``write`` / ``read`` / ``put`` / ``get`` (floors and ceilings) or ``data_fetch``.
``peak_rss_mib`` is the max over ranks and repeats of each rank's peak RSS during the
operation (``None`` where not measured). The contenders are the existing scripts' own:
nothing here re-implements them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any

from benchmarks.common import MiB, make_state, peak_rss_mib, record, reset_peak, rotated
from benchmarks.objstore.torchsave_s3 import run_objstore_torchsave

__all__ = ["RUNNERS"]


# -- floor: sequential write + fsync, read back ------------------------------------------
def _floor_rank(rank: int, world: int, nbytes: int, repeats: int, base: str) -> dict:
    import torch

    buf = torch.randint(0, 255, (nbytes,), dtype=torch.uint8).numpy()
    back = bytearray(nbytes)
    chunk = 64 * MiB
    w, r = [], []
    for i in range(repeats):
        path = os.path.join(base, f"floor{i}.bin")
        t0 = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            for off in range(0, nbytes, chunk):
                f.write(memoryview(buf)[off : off + chunk])
            os.fsync(f.fileno())
        w.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        view = memoryview(back)
        with open(path, "rb", buffering=0) as f:
            for off in range(0, nbytes, chunk):
                f.readinto(view[off : off + chunk])
        r.append(time.perf_counter() - t0)
        os.remove(path)
    return {"write": w, "read": r}


def run_floor(scn: str, size_mib: int, repeats: int = 3, **_: Any) -> list[dict]:
    from harness.dist import run_distributed

    base = tempfile.mkdtemp(prefix="ckptstore-suite-floor-")
    nbytes = size_mib * MiB
    try:  # a fresh process, like the ranks of the other scenarios
        got = run_distributed(_floor_rank, 1, nbytes, repeats, base, timeout=900)[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [
        record(scn, "floor", "write", "raw write + fsync", got["write"], bytes=nbytes),
        record(scn, "floor", "read", "raw read (page cache)", got["read"], bytes=nbytes),
    ]


# -- local: checkpoint.local --------------------------------------------------------------
def run_local(scn: str, size_mib: int, world: int, repeats: int, **_: Any) -> list[dict]:
    from benchmarks.checkpoint import local

    cfg = local.BenchConfig(size_mib=size_mib, world=world, repeats=repeats)
    res = local.run(cfg)
    out = []
    for name, row in res["rows"].items():
        metric = "load" if "load" in name else "save"
        out.append(
            record(
                scn,
                "local",
                metric,
                name.replace(" (verified)", "").replace(" load", ""),
                row["samples_s"],
                bytes=res["state_bytes"],
                world=world,
                peak_rss_mib=row.get("peak_rss_mib"),
                detail=row["rank0_detail"],
            )
        )
    return out


# -- reshard: save on `world` ranks, load on others ---------------------------------------
def _reshard_load_rank(
    rank: int, world: int, paths: dict[str, str], cfg: Any, repeats: int
) -> dict[str, Any]:
    import torch

    from benchmarks.checkpoint import local

    torch.set_num_threads(1)
    full: dict[str, Any] = {}
    for src in range(cfg.world):
        full.update(make_state(src, cfg))
    names = sorted(full)
    mine = {k: full[k] for i, k in enumerate(names) if i % world == rank}
    dest = {k: torch.empty_like(v) for k, v in mine.items()}
    out: dict[str, Any] = {}
    for r in range(repeats):
        for name in rotated(list(paths), r):
            for t in dest.values():
                t.zero_()
            reset_peak()
            secs, _ = local._timed(lambda n=name: local.LOAD_FNS[n](dest, paths[n]))
            if not all(torch.equal(dest[k], mine[k]) for k in mine):
                raise AssertionError(f"{name}: load on {world} ranks is not bitwise equal")
            out.setdefault(name, {"s": [], "rss": []})
            out[name]["s"].append(secs)
            out[name]["rss"].append(peak_rss_mib())
    return out


def _reshard_save_rank(rank: int, world: int, cfg: Any, paths: dict[str, str]) -> None:
    from benchmarks.checkpoint.local import SAVE_FNS

    state = make_state(rank, cfg)
    for name, path in paths.items():
        SAVE_FNS[name](state, path, rank, world)


def run_reshard(
    scn: str, size_mib: int, world: int, load_worlds: list[int], repeats: int, **_: Any
) -> list[dict]:
    from benchmarks.checkpoint.local import BenchConfig
    from harness.dist import run_distributed

    cfg = BenchConfig(size_mib=size_mib, world=world, repeats=repeats)
    base = tempfile.mkdtemp(prefix="ckptstore-suite-reshard-")
    paths = {n: os.path.join(base, n.replace(" ", "_")) for n in ("stock DCP", "ckptstore")}
    out = []
    try:
        run_distributed(_reshard_save_rank, world, cfg, paths, timeout=1800)
        for lw in load_worlds:
            per_rank = run_distributed(_reshard_load_rank, lw, paths, cfg, repeats, timeout=1800)
            for name in paths:
                xs = [max(pr[name]["s"][i] for pr in per_rank) for i in range(repeats)]
                rss = max(max(pr[name]["rss"]) for pr in per_rank)
                out.append(
                    record(
                        scn,
                        "reshard",
                        f"load@w{lw}",
                        name,
                        xs,
                        bytes=cfg.state_bytes,
                        world=lw,
                        peak_rss_mib=rss,
                        saved_on=world,
                    )
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


# -- async: checkpoint.async_save --------------------------------------------------------
def run_async(scn: str, size_mib: int, world: int, saves: int, **_: Any) -> list[dict]:
    from benchmarks.checkpoint import async_save

    res = async_save.run(size_mib, world, saves)
    out = []
    nbytes = size_mib * MiB
    for row in res["rows"]:
        name = row["contender"]
        raw = res["raw"][0][name]
        for metric in ("blocking", "committed"):
            xs = raw[metric][1:] or raw[metric]  # the first save allocates: reported apart
            out.append(
                record(
                    scn,
                    "async",
                    metric,
                    name,
                    xs,
                    bytes=nbytes,
                    world=world,
                    peak_rss_mib=row.get("peak_rss_mib"),
                    first_s=raw[metric][0],
                )
            )
    return out


# -- objstore: objstore.save_load --------------------------------------------------------
def run_objstore(
    scn: str,
    size_mib: int,
    world: int,
    repeats: int,
    links: list[str],
    contenders: list[str],
    **_: Any,
) -> list[dict]:
    from benchmarks.objstore import save_load
    from benchmarks.objstore.contenders import BenchConfig

    names = save_load._available(list(contenders), False)
    cfg = BenchConfig(
        size_mib=size_mib, world=world, repeats=repeats, links=tuple(links), contenders=names
    )
    res = save_load.run(cfg)
    out = []
    for row in res["rows"]:
        metric = {"raw": {"save": "put", "load": "get"}}.get(row["contender"], {}).get(
            row["op"], row["op"]
        )
        out.append(
            record(
                scn,
                "objstore",
                metric,
                row["label"],
                row["samples_s"],
                bytes=res["state_bytes"],
                world=world,
                dest=f"SeaweedFS {row['link']}",
                client_cpu_s=row["client_cpu_s"],
                server_cpu_s=row["server_cpu_s"],
            )
        )
    return out


# -- data: data.loader ---------------------------------------------------------------------
def run_data(scn: str, args: list[str], **_: Any) -> list[dict]:
    from benchmarks.data import loader

    fd, path = tempfile.mkstemp(suffix=".json", prefix="ckptstore-suite-data-")
    os.close(fd)
    try:
        loader.main([*args, "--json", path])
        with open(path) as f:
            got = json.load(f)
    finally:
        os.remove(path)
    labels = {
        "floor": "(0) in-memory floor",
        "fsspec": "(a) fsspec DataLoader",
        "cold": "(b) ckptstore cold",
        "warm": "(c) ckptstore warm",
    }
    out = []
    for key, lab in labels.items():
        runs = got["runs"][key]
        out.append(
            record(
                scn,
                "data",
                "data_fetch",
                lab,
                [r["fetch_s"] for r in runs],
                dest="shaped store",
                samples_per_s=[r["samples_s"] for r in runs],
                steady=[r["steady"] for r in runs],
                args=got["args"],
            )
        )
    return out


RUNNERS = {
    "floor": run_floor,
    "local": run_local,
    "reshard": run_reshard,
    "async": run_async,
    "objstore": run_objstore,
    "objstore_torchsave": run_objstore_torchsave,
    "data": run_data,
}
