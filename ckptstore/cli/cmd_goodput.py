"""``ckptstore-tool goodput``: the planning calculator over ``ckptstore.planning.goodput``.

Give the failure rate as ``--failures-per-day`` or as ``--gpus`` and ``--afr`` (``1%`` or
``0.01``). ``--from ROOT`` takes the blocking time of one save from what the checkpoint
manager measured: the median ``extra["timings"]["blocking_s"]`` in the manifests of the
committed checkpoints under ROOT, and the median checkpoint size as ``--checkpoint-gb``. Flags
given explicitly override measured values.

``--plan`` switches to the scale projection of :mod:`ckptstore.cli.goodput_plan` (saves and
restores at 1k-100k GPUs, request rates per key prefix, cost, the limit that binds).

Without a checkpoint cost (no ``--blocking-s``, no ``--from``) the goodput rows assume saves
that block for 0 s and the optimal-interval rows are left out; without a checkpoint size
(``--checkpoint-gb`` or ``--from``) the storage, transfer and disk rows are. A note on
stderr says which flag gives each. Values print with one decimal (three significant digits
below 0.05); errors name the flags.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from ckptstore.cli.context import Context
from ckptstore.cli.goodput_plan import add_plan_arguments, run_plan
from ckptstore.cli.render import dump_json, table
from ckptstore.cli.sources import list_or_missing
from ckptstore.errors import ConfigError
from ckptstore.format import CheckpointStatus, list_steps, open_committed
from ckptstore.planning.goodput import GoodputInputs, InputError, Prices, plan, report_rows

__all__ = ["add_parser", "run", "parse_fraction", "measured_from_root", "fmt", "FLAGS"]

GB = 1e9


def parse_fraction(text: str) -> float:
    """``"1%"`` -> 0.01; ``"0.01"`` -> 0.01."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.01) or percent (1%), got {text!r}"
        ) from None


def add_parser(sub: Any, common: Any) -> None:
    """Register ``goodput`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "goodput",
        help="goodput, failure odds, optimal interval and cost account for a training run",
        description="Plan a checkpoint interval: expected goodput (productive time / wall "
        "time), the chance of a failure during the run, Young/Daly optimal intervals and what "
        "failures and checkpoints cost. With --plan: per-save blocking, time until committed, "
        "restore time, request rates per key prefix (flat and spread) and cost at 1k-100k "
        "GPUs from per-rank figures, and which limit binds.",
    )
    rate = p.add_argument_group("failure rate (one of)")
    rate.add_argument("--failures-per-day", type=float, metavar="F", help="job failures a day")
    rate.add_argument("--gpus", type=int, metavar="N", help="GPUs in the job")
    rate.add_argument(
        "--afr", type=parse_fraction, metavar="A", help="annual failure rate per GPU (1%% or 0.01)"
    )
    run_g = p.add_argument_group("run")
    run_g.add_argument("--days", type=float, default=30.0, help="run length (default 30)")
    run_g.add_argument(
        "--interval-min", type=float, default=60.0, help="training minutes between saves (60)"
    )
    run_g.add_argument(
        "--blocking-s",
        type=float,
        help="seconds one save stops training (the optimal intervals need it; or --from)",
    )
    run_g.add_argument("--restart-min", type=float, default=0.0, help="minutes to restart (0)")
    run_g.add_argument(
        "--checkpoint-gb",
        type=float,
        help="size of one checkpoint in GB (the storage, transfer and disk rows need it)",
    )
    run_g.add_argument("--keep-last", type=int, default=3, help="checkpoints retained (3)")
    run_g.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (8)")
    run_g.add_argument("--data-cache-gb", type=float, default=0.0, help="local data cache/node")
    run_g.add_argument(
        "--tier-copies",
        "--staging-copies",  # its old name, until ckptstore 0.2
        dest="tier_copies",
        type=float,
        default=2.0,
        help="tier copies of a checkpoint on each node's NVMe (2)",
    )
    peers = p.add_argument_group(
        "a peer tier (optional): local-tier saves with peer replicas, beside the bucket's"
    )
    peers.add_argument(
        "--peer-interval-min", type=float, metavar="M", help="training minutes between its saves"
    )
    peers.add_argument(
        "--peer-share",
        type=parse_fraction,
        default=0.9,
        metavar="P",
        help="failures it survives (worker crashes, node losses its replicas cover; 90%%)",
    )
    peers.add_argument(
        "--peer-restart-min",
        type=float,
        metavar="M",
        help="minutes to restart from it (as --restart-min)",
    )
    run_g.add_argument(
        "--from",
        dest="from_root",
        metavar="ROOT",
        help="take --blocking-s and --checkpoint-gb from the manager's timings under ROOT",
    )
    prices = p.add_argument_group("prices (optional)")
    prices.add_argument("--gpu-hour", type=float, help="price of one GPU-hour")
    prices.add_argument("--storage-gb-month", type=float, help="price of one GB-month stored")
    prices.add_argument("--transfer-gb", type=float, help="price of one GB transferred")
    prices.add_argument("--nvme-gb", type=float, help="price of one GB of local NVMe (flat)")
    prices.add_argument("--currency", default="$", help="currency label ($)")
    out = p.add_argument_group("output and --from's store")
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    out.add_argument(
        "-o",
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option for an object-store --from URL (repeatable; as for ls)",
    )
    add_plan_arguments(p)
    # `common` (parts, concurrency, progress) is not added: goodput transfers nothing.
    p.set_defaults(func=run)


def measured_from_root(ctx: Context, url: str) -> dict[str, Any]:
    """Median blocking time and size of the committed checkpoints under ``url`` with timings."""
    root = ctx.open(url)
    list_or_missing(root, url)
    blocking, sizes, steps = [], [], []
    committed = 0
    for e in list_steps(root):
        if e.status != CheckpointStatus.COMMITTED:
            continue
        committed += 1
        m = open_committed(root.child(e.name)).manifest
        timings = m.extra.get("timings")
        value = timings.get("blocking_s") if isinstance(timings, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            blocking.append(float(value))
            sizes.append(m.total_bytes)
            steps.append(e.step)
    if not blocking:
        raise ConfigError(
            f"none of the {committed} committed checkpoints under {url} has recorded timings "
            "(manifest extra['timings']['blocking_s'], written by CheckpointManager saves); "
            "pass --blocking-s instead of --from."
        )
    return {
        "root": root.url,
        "checkpoints": len(blocking),
        "steps": steps,
        "blocking_s": statistics.median(blocking),
        "checkpoint_gb": statistics.median(sizes) / GB,
    }


def fmt(value: float) -> str:
    """One format for every value: one decimal, thousands separated; three significant digits
    for a nonzero value below 0.05 (which one decimal would print as 0.0)."""
    if value != 0 and abs(value) < 0.05:
        return f"{value:.3g}"
    return f"{value:,.1f}"


#: GoodputInputs / Prices field -> the flag that sets it (for error messages).
FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in (
        *("interval_min", "days", "failures_per_day", "gpus", "afr", "blocking_s"),
        *("restart_min", "checkpoint_gb", "keep_last", "gpus_per_node", "data_cache_gb"),
        *("tier_copies", "gpu_hour", "storage_gb_month", "transfer_gb", "nvme_gb"),
        *("peer_interval_min", "peer_share", "peer_restart_min"),
    )
}


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``goodput``; a bad input raises ``ConfigError`` naming the flag."""
    if args.plan:
        return run_plan(args, ctx, fmt)
    try:
        return _run(args, ctx)
    except InputError as exc:
        raise ConfigError(exc.render(FLAGS)) from None


def _notes(blocking: float, ckpt_gb: float | None) -> list[str]:
    notes = []
    if blocking == 0:
        notes.append(
            "note: no checkpoint cost given, so the goodput rows assume saves that block "
            "training for 0 s and there is no optimal interval to show; pass --blocking-s "
            "SECONDS (what one save stops training) or --from ROOT (the manager's measurements)"
        )
    if ckpt_gb is None:
        notes.append(
            "note: checkpoint size unknown, so storage, transfer and disk rows are left out; "
            "pass --checkpoint-gb GB or --from ROOT"
        )
    return notes


def _run(args: argparse.Namespace, ctx: Context) -> int:
    measured = measured_from_root(ctx, args.from_root) if args.from_root else None
    blocking = args.blocking_s
    if blocking is None:
        blocking = measured["blocking_s"] if measured else 0.0
    ckpt_gb = args.checkpoint_gb
    if ckpt_gb is None and measured:
        ckpt_gb = measured["checkpoint_gb"]
    inputs = GoodputInputs(
        interval_min=args.interval_min,
        days=args.days,
        failures_per_day=args.failures_per_day,
        gpus=args.gpus,
        afr=args.afr,
        blocking_s=blocking,
        restart_min=args.restart_min,
        checkpoint_gb=ckpt_gb,
        keep_last=args.keep_last,
        gpus_per_node=args.gpus_per_node,
        data_cache_gb=args.data_cache_gb,
        tier_copies=args.tier_copies,
        peer_interval_min=args.peer_interval_min,
        peer_share=args.peer_share,
        peer_restart_min=args.peer_restart_min,
    )
    prices = Prices(
        gpu_hour=args.gpu_hour,
        storage_gb_month=args.storage_gb_month,
        transfer_gb=args.transfer_gb,
        nvme_gb=args.nvme_gb,
    )
    report = plan(inputs, prices)
    if ctx.json:
        dump_json({"measured": measured, "report": report})
        return 0
    if measured:
        print(
            f"Measured    median blocking {fmt(measured['blocking_s'])} s and size "
            f"{fmt(measured['checkpoint_gb'])} GB over {measured['checkpoints']} checkpoints "
            f"under {measured['root']}"
        )
    rows = [[label, fmt(v), unit] for label, v, unit in report_rows(report, args.currency)]
    print(table(["", "VALUE", "UNIT"], rows, right={1}))
    for note in _notes(blocking, ckpt_gb):
        print(note, file=sys.stderr)
    return 0
