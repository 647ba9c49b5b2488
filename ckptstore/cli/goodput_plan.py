"""``ckptstore-tool goodput --plan``: project saves and restores to 1k-100k GPUs.

Renders :func:`ckptstore.planning.scale.sweep` (its docstring holds the model and its
assumptions): one table per GPU count with the flat and spread key layouts side by side, then
the GPU count from which a store-side limit binds, and which limit it is. ``--from ROOT``
measures the per-rank figures from the committed checkpoints under ROOT: the largest rank's
shard bytes and shard file count (from each manifest's per-rank ``__<rank>_<n>`` files, under
``<hh>/`` when spread) and the manager's ``blocking_s``, each the median over checkpoints. Per-rank
throughputs are not in a manifest: ``--rank-write-gb-s`` and ``--rank-read-gb-s`` give them.
Flags given explicitly win over measured values.
"""

from __future__ import annotations

import argparse
import re
import statistics
from typing import Any

from ckptstore.cli.context import Context
from ckptstore.cli.render import dump_json, table
from ckptstore.cli.sources import list_or_missing
from ckptstore.config import TransferConfig
from ckptstore.errors import ConfigError
from ckptstore.format import CheckpointStatus, list_steps, open_committed
from ckptstore.planning.checks import InputError
from ckptstore.planning.scale import (
    GB,
    LAYOUTS,
    Cluster,
    RankFigures,
    ScalePoint,
    ScalePrices,
    first_store_limit,
    sweep,
)

__all__ = ["add_plan_arguments", "measured_ranks", "parse_gpu_counts", "run_plan", "PLAN_FLAGS"]

#: A shard file of one rank: ``__<rank>_<n>[.<attempt>].distcp``, under ``<hh>/`` when spread.
_SHARD = re.compile(r"^(?:[0-9a-f]{2}/)?__(\d+)_\d+(?:\.[A-Za-z0-9_-]+)?\.distcp$")

#: Flags of the goodput calculator that --plan does not use (argparse dest -> flag).
_NOT_IN_PLAN = {
    "failures_per_day": "--failures-per-day",
    "gpus": "--gpus",
    "afr": "--afr",
    "checkpoint_gb": "--checkpoint-gb",
    "transfer_gb": "--transfer-gb",
    "nvme_gb": "--nvme-gb",
    "peer_interval_min": "--peer-interval-min",
    "peer_restart_min": "--peer-restart-min",
}

#: RankFigures / Cluster / ScalePrices field -> the flag that sets it (for error messages).
PLAN_FLAGS = {
    "bytes_per_rank": "--rank-gb",
    "write_gb_s": "--rank-write-gb-s",
    "read_gb_s": "--rank-read-gb-s",
    "blocking_s": "--blocking-s",
    "files_per_rank": "--files-per-rank",
    "part_bytes": "--part-mb",
    "gpus_per_node": "--gpus-per-node",
    "nic_gb_s": "--nic-gb-s",
    "store_gb_s": "--store-gb-s",
    "put_per_prefix_s": "--put-per-prefix",
    "get_per_prefix_s": "--get-per-prefix",
    "local_gb_s": "--local-gb-s",
    "storage_gb_month": "--storage-gb-month",
    "put_per_1k": "--put-per-1k",
    "get_per_1k": "--get-per-1k",
    "gpu_hour": "--gpu-hour",
    "interval_min": "--interval-min",
    "keep_last": "--keep-last",
    "gpus": "--sweep",
}


def parse_gpu_counts(text: str) -> tuple[int, ...]:
    """``"1000,10k,100k"`` -> ``(1000, 10000, 100000)``."""
    counts = []
    for item in text.split(","):
        t = item.strip().lower()
        scale = 1000 if t.endswith("k") else 1
        try:
            n = int(t[:-1] if scale > 1 else t) * scale
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(
                f"expected GPU counts >= 1 separated by commas (1000,10k,100k), got {text!r}"
            )
        counts.append(n)
    return tuple(counts)


def add_plan_arguments(p: Any) -> None:
    """Add the ``--plan`` flag group to the goodput parser ``p``."""
    g = p.add_argument_group(
        "--plan: project saves and restores to many GPUs (uses --blocking-s, --from, "
        "--interval-min, --keep-last, --gpus-per-node, --storage-gb-month, --gpu-hour)"
    )
    g.add_argument("--plan", action="store_true", help="print the scale projection instead")
    g.add_argument(
        "--sweep",
        type=parse_gpu_counts,
        default=(1_000, 10_000, 100_000),
        metavar="N,N,...",
        help="GPU counts to project (1k,10k,100k)",
    )
    g.add_argument("--rank-gb", type=float, help="shard GB per rank (or --from)")
    g.add_argument("--rank-write-gb-s", type=float, help="one rank's save throughput, GB/s")
    g.add_argument("--rank-read-gb-s", type=float, help="one rank's restore throughput, GB/s")
    g.add_argument("--files-per-rank", type=int, help="shard files per rank (1, or --from)")
    g.add_argument(
        "--part-mb", type=float, help="multipart part / ranged-read size in MiB (TransferConfig's)"
    )
    g.add_argument("--nic-gb-s", type=float, default=25.0, help="node NIC to the store (25)")
    g.add_argument("--store-gb-s", type=float, help="store's aggregate bandwidth cap (none)")
    g.add_argument("--put-per-prefix", type=float, default=3500.0, help="PUT/s per prefix")
    g.add_argument("--get-per-prefix", type=float, default=5500.0, help="GET/s per prefix")
    g.add_argument("--local-gb-s", type=float, help="local tier read GB/s (no local row)")
    g.add_argument("--put-per-1k", type=float, help="price of 1,000 PUT requests")
    g.add_argument("--get-per-1k", type=float, help="price of 1,000 GET requests")


def measured_ranks(ctx: Context, url: str) -> dict[str, Any]:
    """Per-rank figures of the committed checkpoints under ``url`` (medians over them)."""
    root = ctx.open(url)
    list_or_missing(root, url)
    rank_bytes, rank_files, blocking, steps = [], [], [], []
    world = 0
    for e in list_steps(root):
        if e.status != CheckpointStatus.COMMITTED:
            continue
        m = open_committed(root.child(e.name)).manifest
        sizes: dict[int, int] = {}
        files: dict[int, int] = {}
        for name, entry in m.files.items():
            match = _SHARD.match(name)
            if match:
                rank = int(match.group(1))
                sizes[rank] = sizes.get(rank, 0) + entry.size
                files[rank] = files.get(rank, 0) + 1
        if not sizes:
            continue
        rank_bytes.append(max(sizes.values()))
        rank_files.append(max(files.values()))
        steps.append(e.step)
        world = m.world_size
        timings = m.extra.get("timings")
        value = timings.get("blocking_s") if isinstance(timings, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            blocking.append(float(value))
    if not rank_bytes:
        raise ConfigError(
            f"no committed checkpoint with per-rank shard files (__<rank>_<n>.distcp) under "
            f"{url}; pass --rank-gb (and --files-per-rank) instead of --from."
        )
    return {
        "root": root.url,
        "checkpoints": len(rank_bytes),
        "steps": steps,
        "world_size": world,
        "rank_gb": statistics.median(rank_bytes) / GB,
        "files_per_rank": int(statistics.median_high(rank_files)),
        "blocking_s": statistics.median(blocking) if blocking else None,
        "timed_checkpoints": len(blocking),
    }


def _inputs(
    args: argparse.Namespace, measured: dict[str, Any] | None
) -> tuple[RankFigures, Cluster, ScalePrices]:
    def pick(flag_value: Any, key: str, default: Any = None) -> Any:
        if flag_value is not None:
            return flag_value
        if measured is not None and measured.get(key) is not None:
            return measured[key]
        return default

    rank_gb = pick(args.rank_gb, "rank_gb")
    missing = [
        flag
        for flag, value in (
            ("--rank-gb (or --from ROOT)", rank_gb),
            ("--rank-write-gb-s", args.rank_write_gb_s),
            ("--rank-read-gb-s", args.rank_read_gb_s),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(
            "--plan needs " + ", ".join(missing) + ": per-rank shard size and one rank's save "
            "and restore throughput in GB/s (bytes over the background upload / load time)."
        )
    part_mb = args.part_mb if args.part_mb is not None else TransferConfig().part_size / 2**20
    if not part_mb > 0:
        raise ConfigError(f"--part-mb must be > 0; got {part_mb!r}")
    fig = RankFigures(
        bytes_per_rank=rank_gb * GB,
        write_gb_s=args.rank_write_gb_s,
        read_gb_s=args.rank_read_gb_s,
        blocking_s=pick(args.blocking_s, "blocking_s", 0.0),
        files_per_rank=pick(args.files_per_rank, "files_per_rank", 1),
        part_bytes=max(1, round(part_mb * 2**20)),
    )
    cluster = Cluster(
        gpus_per_node=args.gpus_per_node,
        nic_gb_s=args.nic_gb_s,
        store_gb_s=args.store_gb_s,
        put_per_prefix_s=args.put_per_prefix,
        get_per_prefix_s=args.get_per_prefix,
        local_gb_s=args.local_gb_s,
    )
    prices = ScalePrices(
        storage_gb_month=args.storage_gb_month,
        put_per_1k=args.put_per_1k,
        get_per_1k=args.get_per_1k,
        gpu_hour=args.gpu_hour,
    )
    return fig, cluster, prices


def run_plan(args: argparse.Namespace, ctx: Context, fmt: Any) -> int:
    """Run ``goodput --plan``; a bad input raises ``ConfigError`` naming the flag."""
    given = [flag for dest, flag in _NOT_IN_PLAN.items() if getattr(args, dest) is not None]
    if given:
        raise ConfigError(
            f"--plan does not use {', '.join(given)}: it projects the GPU counts of --sweep "
            "from per-rank figures; drop --plan for the goodput calculator."
        )
    try:
        measured = measured_ranks(ctx, args.from_root) if args.from_root else None
        fig, cluster, prices = _inputs(args, measured)
        points = sweep(
            fig,
            cluster,
            args.sweep,
            interval_min=args.interval_min,
            keep_last=args.keep_last,
            prices=prices,
        )
        first = {
            f"{phase}_{lay}": first_store_limit(fig, cluster, lay, phase)
            for phase in ("save", "restore")
            for lay in LAYOUTS
        }
        bound = {k: None if v is None else v[0] for k, v in first.items()}
        bound_by = {k: None if v is None else str(v[1]) for k, v in first.items()}
    except InputError as exc:
        raise ConfigError(exc.render(PLAN_FLAGS)) from None
    if ctx.json:
        doc = {"measured": measured, "figures": fig, "cluster": cluster, "prices": prices}
        dump_json(
            {**doc, "points": points, "store_bound_from_gpus": bound, "store_bound_by": bound_by}
        )
        return 0
    if measured:
        blocking = measured["blocking_s"]
        told = "no recorded blocking" if blocking is None else f"median blocking {fmt(blocking)} s"
        print(
            f"Measured    largest rank {fmt(measured['rank_gb'])} GB in "
            f"{measured['files_per_rank']} file(s), {told}, over {measured['checkpoints']} "
            f"checkpoints of {measured['world_size']} ranks under {measured['root']}"
        )
    for i in range(0, len(points), len(LAYOUTS)):
        flat, spread = points[i : i + len(LAYOUTS)]
        print(
            f"\n{flat.gpus:,} GPUs ({flat.nodes:,} nodes), checkpoint {fmt(flat.checkpoint_gb)} "
            f"GB, a save every {fmt(args.interval_min)} min"
        )
        rows = _rows(flat, spread, fmt, args.currency)
        print(table(["", "FLAT", "SPREAD", "UNIT"], rows, right={1, 2}))
    print()
    for phase in ("save", "restore"):
        parts = []
        for lay in LAYOUTS:
            n, by = bound[f"{phase}_{lay}"], bound_by[f"{phase}_{lay}"]
            parts.append(f"{lay}: " + ("never" if n is None else f"{by} from {n:,} GPUs"))
        print(f"Store-side limits bind the {phase} ({'; '.join(parts)})")
    return 0


def _rows(a: ScalePoint, b: ScalePoint, fmt: Any, cur: str) -> list[list[str]]:
    def num(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x:,}" if isinstance(x, int) else fmt(x)

    rows: list[tuple[str, Any, Any, str]] = [
        ("Blocking per save", a.blocking_s, b.blocking_s, "s"),
        ("Time until committed", a.save.seconds, b.save.seconds, "s"),
        ("Save bound by", str(a.save.binding), str(b.save.binding), ""),
        ("PUT requests per save", a.save.requests, b.save.requests, "requests"),
        (
            "PUTs on the hottest prefix",
            a.save.hottest_prefix_requests,
            b.save.hottest_prefix_requests,
            "requests",
        ),
        ("Hottest prefix (save)", a.save.hottest_prefix, b.save.hottest_prefix, ""),
        (
            "PUT rate on the hottest prefix",
            a.save.prefix_rate,
            b.save.prefix_rate,
            f"1/s (limit {fmt(a.save.prefix_limit)})",
        ),
        ("Restore from the root", a.restore_root.seconds, b.restore_root.seconds, "s"),
        ("Restore bound by", str(a.restore_root.binding), str(b.restore_root.binding), ""),
        (
            "Hottest prefix (restore)",
            a.restore_root.hottest_prefix,
            b.restore_root.hottest_prefix,
            "",
        ),
        (
            "GET rate on the hottest prefix",
            a.restore_root.prefix_rate,
            b.restore_root.prefix_rate,
            f"1/s (limit {fmt(a.restore_root.prefix_limit)})",
        ),
        ("Restore from the local tier", a.restore_local_s, b.restore_local_s, "s"),
        ("Request cost per save", a.cost.per_save, b.cost.per_save, cur),
        ("Request cost per restore", a.cost.per_restore, b.cost.per_restore, cur),
        ("Storage per month", a.cost.storage_month, b.cost.storage_month, cur),
        ("Save request cost per month", a.cost.requests_month, b.cost.requests_month, cur),
        ("GPU time blocked per month", a.cost.blocking_month, b.cost.blocking_month, cur),
        ("Total per month (priced items)", a.cost.per_month, b.cost.per_month, cur),
    ]
    out = []
    for label, x, y, unit in rows:
        if x is None and y is None:
            continue  # not priced / no local tier
        cells = [x, y] if isinstance(x, str) else [num(x), num(y)]
        out.append([label, *cells, unit])
    return out
